"""``python -m vkml.tune``: tune operator paths ahead of time (see :mod:`vkml.tuning`).

The module is also callable, so ``vkml.tune(workloads, ...)`` is :func:`vkml.tuning.tune`
even after ``import vkml.tune`` has bound this module to the name.
"""
import sys
import types

from .tuning import main, tune


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kw):
        return tune(*args, **kw)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())

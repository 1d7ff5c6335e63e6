"""Operator implementations: one module per DML operator page, registered by
``@implements`` when imported.  Every module here is imported, so a new operator needs
no registration line; the functional forms each module lists in ``__all__`` (``pad``,
``fold``, ...) become ``vkml.pad``, ``vkml.fold``, ...."""
from __future__ import annotations

import importlib
import pkgutil

__all__: list[str] = []

for _info in pkgutil.iter_modules(__path__):
    _mod = importlib.import_module(f"{__name__}.{_info.name}")
    for _name in getattr(_mod, "__all__", ()):
        globals()[_name] = getattr(_mod, _name)
        __all__.append(_name)
del _info, _mod

"""The DirectML-style layer: Python mirrors of ``DML_*_OPERATOR_DESC`` and
``DML_TENSOR_DESC``, validated by the rules of their pages.

Every module in this package is imported here and its public names (``__all__``, or
every name not starting with "_" that it defines) are re-exported, so a new operator's
descriptor module needs no registration.
"""
from __future__ import annotations

import importlib
import pkgutil

from .data_type import DataType
from .operator import FeatureLevel, IMPLEMENTED_FEATURE_LEVEL, OperatorDesc
from .tensor_desc import TensorDesc, TensorFlags, calc_buffer_tensor_size

__all__ = ["DataType", "FeatureLevel", "IMPLEMENTED_FEATURE_LEVEL", "OperatorDesc",
           "TensorDesc", "TensorFlags", "calc_buffer_tensor_size"]

for _info in pkgutil.iter_modules(__path__):
    _mod = importlib.import_module(f"{__name__}.{_info.name}")
    _names = getattr(_mod, "__all__", None) or [
        n for n, v in vars(_mod).items()
        if not n.startswith("_") and getattr(v, "__module__", None) == _mod.__name__]
    for _n in _names:
        globals()[_n] = getattr(_mod, _n)
        if _n not in __all__:
            __all__.append(_n)
del _info, _mod, _names, _n

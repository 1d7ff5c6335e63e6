"""DML_TENSOR_DATA_TYPE: the eleven element types, their sizes and numpy names."""
from __future__ import annotations

import enum

import numpy as np

from ..errors import ArgumentTypeError, ValidationError


class DataType(enum.IntEnum):
    """``DML_TENSOR_DATA_TYPE`` with DirectML's values (``DataType.FLOAT32 == 1``)."""

    UNKNOWN = 0
    FLOAT32 = 1
    FLOAT16 = 2
    UINT32 = 3
    UINT16 = 4
    UINT8 = 5
    INT32 = 6
    INT16 = 7
    INT8 = 8
    FLOAT64 = 9
    UINT64 = 10
    INT64 = 11

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(_NUMPY[self])

    @property
    def size(self) -> int:
        """Element size in bytes (``DMLCalcBufferTensorSize``'s switch)."""
        return _SIZES[self]

    @property
    def is_float(self) -> bool:
        return self in (DataType.FLOAT16, DataType.FLOAT32, DataType.FLOAT64)

    @classmethod
    def of(cls, value, field: str = "data_type") -> "DataType":
        """A DataType from a DataType, a DML name ("FLOAT32", any case, with or without
        ``DML_TENSOR_DATA_TYPE_``), its integer value, or a NumPy dtype, type or name.

        None, bools, floats and other objects raise ArgumentTypeError (``numpy.dtype(None)``
        is float64, which is never what a missing type means); an unknown name or value,
        or a NumPy type DML lacks (bool, complex), raises ValidationError."""
        allowed = ", ".join(_NUMPY.values())
        if isinstance(value, DataType):
            result = value
        elif isinstance(value, str):
            key = value.upper().removeprefix("DML_TENSOR_DATA_TYPE_")
            if key in cls.__members__:
                result = cls[key]
            else:
                try:
                    result = _FROM_NUMPY[np.dtype(value)]
                except (TypeError, KeyError, ValueError, SyntaxError):
                    # (numpy parses some strings as type expressions: "01" is a SyntaxError)
                    raise ValidationError(field, f"{value!r} is not a DML_TENSOR_DATA_TYPE "
                                                 f"vkml supports ({allowed})") from None
        elif isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            if int(value) not in cls._value2member_map_:
                raise ValidationError(field, f"{int(value)} is not a DML_TENSOR_DATA_TYPE "
                                             "value (0 to 11)")
            result = cls(int(value))
        elif isinstance(value, (np.dtype, type)):
            try:
                result = _FROM_NUMPY[np.dtype(value)]
            except (TypeError, KeyError):
                raise ValidationError(field, f"{value!r} is not a DML_TENSOR_DATA_TYPE vkml "
                                             f"supports ({allowed})") from None
        else:
            raise ArgumentTypeError(field, f"must be a DML_TENSOR_DATA_TYPE, its name or a NumPy "
                                           f"dtype, got {value!r} ({type(value).__name__})")
        if result is DataType.UNKNOWN:
            raise ValidationError(field, "DML_TENSOR_DATA_TYPE_UNKNOWN is never valid")
        return result


_NUMPY = {
    DataType.FLOAT32: "float32", DataType.FLOAT16: "float16", DataType.FLOAT64: "float64",
    DataType.UINT8: "uint8", DataType.UINT16: "uint16", DataType.UINT32: "uint32",
    DataType.UINT64: "uint64", DataType.INT8: "int8", DataType.INT16: "int16",
    DataType.INT32: "int32", DataType.INT64: "int64",
}
_SIZES = {t: np.dtype(n).itemsize for t, n in _NUMPY.items()}
_FROM_NUMPY = {np.dtype(n): t for t, n in _NUMPY.items()}

ALL_TYPES = tuple(_NUMPY)
FLOAT_TYPES = (DataType.FLOAT32, DataType.FLOAT16)

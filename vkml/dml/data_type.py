"""DML_TENSOR_DATA_TYPE: the eleven element types, their sizes and numpy names."""
from __future__ import annotations

import enum

import numpy as np

from ..errors import ValidationError


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

    @property
    def is_signed(self) -> bool:
        return self in (DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64)

    @classmethod
    def of(cls, value, field: str = "data_type") -> "DataType":
        """A DataType from a DataType, a DML name ("FLOAT32"), a numpy dtype or its name."""
        if isinstance(value, DataType):
            result = value
        elif isinstance(value, str) and value.upper().removeprefix("DML_TENSOR_DATA_TYPE_") in cls.__members__:
            result = cls[value.upper().removeprefix("DML_TENSOR_DATA_TYPE_")]
        elif isinstance(value, int) and not isinstance(value, bool) and value in cls._value2member_map_:
            result = cls(value)
        else:
            try:
                result = _FROM_NUMPY[np.dtype(value)]
            except (TypeError, KeyError):
                raise ValidationError(field, f"{value!r} is not a DML_TENSOR_DATA_TYPE vkml "
                                             f"supports ({', '.join(_NUMPY.values())})") from None
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

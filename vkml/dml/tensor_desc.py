"""DML_BUFFER_TENSOR_DESC: sizes, element strides and the buffer size rule.

Rules (``DML_BUFFER_TENSOR_DESC.md``, ``dml-helper-functions.md``):
* 1 to 8 dimensions; a size of zero in any dimension is invalid;
* strides, when given, have one entry per dimension, in elements; 0 broadcasts, a
  stride larger than the packed one pads;
* ``TotalTensorSizeInBytes`` is at least ``DMLCalcBufferTensorSize``: the index of the
  last element plus one, times the element size, rounded up to 4 bytes;
* the tensor may not exceed 2^32 - 1 elements;
* ``GuaranteedBaseOffsetAlignment`` is 0 or a power of two at least the element size.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from ..errors import ValidationError
from .data_type import DataType

MAX_DIMENSIONS = 8


class TensorFlags(enum.IntFlag):
    """``DML_TENSOR_FLAGS``."""

    NONE = 0
    OWNED_BY_DML = 1


def packed_strides(sizes) -> tuple[int, ...]:
    """Row-major (packed) element strides of ``sizes``."""
    strides, acc = [], 1
    for s in reversed(tuple(sizes)):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def calc_buffer_tensor_size(data_type, sizes, strides=None) -> int:
    """``DMLCalcBufferTensorSize``: the minimum bytes a buffer holding the tensor needs."""
    dt = DataType.of(data_type)
    if strides is None:
        count = math.prod(sizes)
    else:
        count = sum((s - 1) * st for s, st in zip(sizes, strides)) + 1
    return (count * dt.size + 3) & ~3


def _uint_list(value, field_name: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value)
    except TypeError:
        raise ValidationError(field_name, f"must be a sequence of integers, got {value!r}") from None
    return out


@dataclass(frozen=True)
class TensorDesc:
    """``DML_BUFFER_TENSOR_DESC`` (wrapped, as DirectML does, in ``DML_TENSOR_DESC``).

    ``strides`` are in elements; ``None`` means packed.  Validated on construction.
    """

    data_type: DataType
    sizes: tuple
    strides: tuple | None = None
    total_tensor_size_in_bytes: int | None = None
    guaranteed_base_offset_alignment: int = 0
    flags: TensorFlags = TensorFlags.NONE
    _min_bytes: int = field(init=False, repr=False, compare=False, hash=False, default=0)

    def __post_init__(self):
        f = "TensorDesc."
        set_ = object.__setattr__
        set_(self, "data_type", DataType.of(self.data_type, f + "data_type"))
        sizes = _uint_list(self.sizes, f + "sizes")
        set_(self, "sizes", sizes)
        if not 1 <= len(sizes) <= MAX_DIMENSIONS:
            raise ValidationError(f + "sizes", f"DimensionCount must be 1 to {MAX_DIMENSIONS}, "
                                               f"got {len(sizes)}")
        for i, s in enumerate(sizes):
            if s <= 0:
                raise ValidationError(f"{f}sizes[{i}]", "a size of zero (or less) in any "
                                      f"dimension is invalid, got {s}")
        if math.prod(sizes) > 0xFFFFFFFF:
            raise ValidationError(f + "sizes", "the total size of a buffer tensor may not exceed "
                                  f"2^32 - 1 elements, got {math.prod(sizes)}")
        if self.strides is not None:
            strides = _uint_list(self.strides, f + "strides")
            if len(strides) != len(sizes):
                raise ValidationError(f + "strides", f"must have DimensionCount ({len(sizes)}) "
                                      f"entries, got {len(strides)}")
            for i, st in enumerate(strides):
                if not 0 <= st <= 0xFFFFFFFF:
                    raise ValidationError(f"{f}strides[{i}]", f"must be a UINT, got {st}")
            set_(self, "strides", strides)
        minimum = calc_buffer_tensor_size(self.data_type, sizes, self.strides)
        set_(self, "_min_bytes", minimum)
        if self.total_tensor_size_in_bytes is None:
            set_(self, "total_tensor_size_in_bytes", minimum)
        else:
            total = int(self.total_tensor_size_in_bytes)
            set_(self, "total_tensor_size_in_bytes", total)
            if total < minimum:
                raise ValidationError(f + "total_tensor_size_in_bytes",
                                      f"must be at least DMLCalcBufferTensorSize = {minimum}, "
                                      f"got {total}")
        a = int(self.guaranteed_base_offset_alignment)
        set_(self, "guaranteed_base_offset_alignment", a)
        if a and (a & (a - 1) or a < self.data_type.size):
            raise ValidationError(f + "guaranteed_base_offset_alignment",
                                  f"must be 0 or a power of two at least the element size "
                                  f"({self.data_type.size}), got {a}")
        try:
            set_(self, "flags", TensorFlags(int(self.flags)))
        except ValueError:
            raise ValidationError(f + "flags", f"unknown DML_TENSOR_FLAGS {self.flags!r}") from None

    @property
    def dimension_count(self) -> int:
        return len(self.sizes)

    @property
    def element_strides(self) -> tuple[int, ...]:
        """The strides in elements (packed ones when none were given)."""
        return self.strides if self.strides is not None else packed_strides(self.sizes)

    @property
    def is_packed(self) -> bool:
        return self.strides is None or self.strides == packed_strides(self.sizes)

    @property
    def element_count(self) -> int:
        return math.prod(self.sizes)

    @property
    def dtype(self):
        return self.data_type.numpy

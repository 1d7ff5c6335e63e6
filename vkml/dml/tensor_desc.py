"""DML_BUFFER_TENSOR_DESC: sizes, element strides and the buffer size rule.

Rules (``DML_BUFFER_TENSOR_DESC.md``, ``dml-helper-functions.md``):
* 1 to 8 dimensions; a size of zero in any dimension is invalid;
* strides, when given, have one entry per dimension, in elements; 0 broadcasts, a
  stride larger than the packed one pads;
* ``TotalTensorSizeInBytes`` is at least ``DMLCalcBufferTensorSize``: the index of the
  last element plus one, times the element size, rounded up to 4 bytes;
* the tensor may not exceed 2^32 - 1 elements;
* ``GuaranteedBaseOffsetAlignment`` is 0 or a power of two at least the element size.

Field types (every descriptor, through :func:`as_int` / :func:`as_ints`): integers are
what ``operator.index`` accepts -- Python ints and NumPy integer scalars, as ``numpy.pad``
takes them; bools are refused although Python makes them ints (no DML field is a BOOL,
and ``True`` as a size is a mistake), as are floats (``2.5``; ``2.0`` too, as NumPy's
``pad_width`` refuses it), strings and None: :class:`~vkml.errors.ArgumentTypeError`, a
TypeError that is also a ValidationError naming the field.  ``data_type`` None is refused
(``numpy.dtype(None)`` would quietly be float64).
"""
from __future__ import annotations

import enum
import math
import operator
from dataclasses import dataclass, field

import numpy as np

from ..errors import ArgumentTypeError, DeviceError, ValidationError
from .data_type import DataType

MAX_DIMENSIONS = 8
UINT32_MAX = 0xFFFFFFFF
UINT64_MAX = (1 << 64) - 1


def fail_with(field: str, rule: str, fail=None, error: type = ValidationError):
    """Raise ``error(field, rule)``; through ``fail`` (a descriptor's ``fail``, which
    prefixes its class name) when given, keeping ``error``'s class."""
    if fail is not None:
        try:
            fail(field, rule)
        except ValidationError as exc:
            if error is ValidationError or isinstance(exc, error):
                raise
            raise error(exc.field, exc.rule) from None
    raise error(field, rule)


def as_int(value, field: str, fail=None, what: str = "an integer") -> int:
    """``operator.index(value)``, bools refused (see the module docstring)."""
    if not isinstance(value, (bool, np.bool_)):
        try:
            return operator.index(value)
        except TypeError:
            pass
    fail_with(field, f"must be {what}, got {value!r} ({type(value).__name__})", fail,
              ArgumentTypeError)


def as_ints(value, field: str, fail=None) -> tuple[int, ...]:
    """A sequence of integers (list, tuple, range, 1-d NumPy array); a string, a mapping,
    a set or a scalar is not one; each entry as :func:`as_int`, named ``field[i]``."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist() if value.dtype.kind in "iu" else list(value)
    if isinstance(value, (str, bytes, dict, set, frozenset)) or not (
            hasattr(value, "__len__") and hasattr(value, "__getitem__")):
        fail_with(field, f"must be a sequence of integers, got {value!r} "
                  f"({type(value).__name__})", fail, ArgumentTypeError)
    return tuple(as_int(v, f"{field}[{i}]", fail) for i, v in enumerate(value))


def allocation_size(shape, dtype, nbytes=None, heap=None, what: str = "a tensor"):
    """``(shape, dtype, bytes)`` of a tensor allocation (``vkml.empty``, results), checked
    before anything is allocated: ``shape`` integers >= 0 (or one integer), ``dtype`` a
    NumPy dtype, ``nbytes`` an integer >= 0; bytes (DWORD-aligned, at least 4) within the
    ``heap``'s ``maxMemoryAllocationSize`` and heap size, else DeviceError naming both."""
    if isinstance(shape, (bool, np.bool_)) or not hasattr(shape, "__len__"):
        shape = (as_int(shape, "shape"),)
    else:
        shape = as_ints(shape, "shape")
    for i, s in enumerate(shape):
        if s < 0:
            raise ValidationError(f"shape[{i}]", f"must be >= 0, got {s}")
    if dtype is None:
        raise ArgumentTypeError("dtype", "must be a NumPy dtype or a DML data type name, "
                                "got None")
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise ArgumentTypeError("dtype", f"{dtype!r} is not a NumPy dtype") from None
    need = math.prod(shape) * dtype.itemsize
    if nbytes is not None:
        nbytes = as_int(nbytes, "nbytes")
        if nbytes < 0:
            raise ValidationError("nbytes", f"must be >= 0, got {nbytes}")
        need = max(need, nbytes)
    size = max((need + 3) & ~3, 4)        # DirectML binds DWORD-aligned sizes
    if heap is not None:
        check_allocation(heap, size, f"{what} of shape {shape} and dtype {dtype}")
    return shape, dtype, size


def check_allocation(heap, nbytes: int, what: str) -> None:
    """DeviceError, before anything is allocated, when ``nbytes`` exceed what one
    allocation from ``heap`` can hold (maxMemoryAllocationSize, or the heap's size);
    the message names the size asked and the limit."""
    limit, name = heap.max_alloc, "maxMemoryAllocationSize"
    if heap.heap_size < limit:
        limit, name = heap.heap_size, "the size of its memory heap"
    if nbytes > limit:
        raise DeviceError(f"out of device memory: {what} needs {nbytes} bytes; the device "
                          f"allows at most {limit} ({name})")


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


def broadcast_tensor_desc(data_type, shape, sizes) -> "TensorDesc":
    """A packed tensor of ``shape`` read as a tensor of ``sizes`` by NumPy's (and ONNX's
    multidirectional) broadcast: right-aligned, stride 0 along every dimension the
    tensor lacks or has as 1 where ``sizes`` has more, so nothing is copied.  ``shape``
    must broadcast to ``sizes`` (the caller names the field when it does not)."""
    shape, sizes = tuple(shape), tuple(sizes)
    lead = len(sizes) - len(shape)
    packed = packed_strides(shape)
    strides = [0] * lead + [0 if s == 1 and w != 1 else p
                            for s, p, w in zip(shape, packed, sizes[lead:])]
    return TensorDesc(data_type, sizes, None if shape == sizes else tuple(strides))


def calc_buffer_tensor_size(data_type, sizes, strides=None) -> int:
    """``DMLCalcBufferTensorSize``: the minimum bytes a buffer holding the tensor needs."""
    dt = DataType.of(data_type)
    if strides is None:
        count = math.prod(sizes)
    else:
        count = sum((s - 1) * st for s, st in zip(sizes, strides)) + 1
    return (count * dt.size + 3) & ~3


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
        sizes = as_ints(self.sizes, f + "sizes")
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
            strides = as_ints(self.strides, f + "strides")
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
            total = as_int(self.total_tensor_size_in_bytes, f + "total_tensor_size_in_bytes")
            set_(self, "total_tensor_size_in_bytes", total)
            if total > UINT64_MAX:
                raise ValidationError(f + "total_tensor_size_in_bytes",
                                      f"must be a UINT64, got {total}")
            if total < minimum:
                raise ValidationError(f + "total_tensor_size_in_bytes",
                                      f"must be at least DMLCalcBufferTensorSize = {minimum}, "
                                      f"got {total}")
        a = as_int(self.guaranteed_base_offset_alignment, f + "guaranteed_base_offset_alignment")
        set_(self, "guaranteed_base_offset_alignment", a)
        if a < 0 or a > UINT32_MAX or a and (a & (a - 1) or a < self.data_type.size):
            raise ValidationError(f + "guaranteed_base_offset_alignment",
                                  f"must be 0 or a power of two at least the element size "
                                  f"({self.data_type.size}), got {a}")
        try:
            set_(self, "flags", TensorFlags(as_int(self.flags, f + "flags")))
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

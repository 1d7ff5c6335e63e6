"""``DML_JOIN_OPERATOR_DESC``, ``DML_SPLIT_OPERATOR_DESC``, ``DML_SLICE_OPERATOR_DESC`` and
``DML_SLICE1_OPERATOR_DESC`` (pages in dml-docs).

Rules (each page's fields, pseudocode, "Tensor constraints" and "Tensor support"):
* the tensors "must have the same DataType and DimensionCount"; 1 to 8 dimensions and all
  11 data types (the 4_1 rows; :meth:`feature_level` reports the lowest level whose row
  admits the descriptor);
* JOIN / SPLIT: InputCount / OutputCount "must be greater than 0"; ``axis`` "must be in
  the range [0, DimensionCount - 1]"; every tensor of the array has the single tensor's
  sizes except along ``axis``, where the array's sizes sum to the single tensor's;
* SLICE: ``offsets``, ``sizes``, ``strides`` have DimensionCount entries; ``sizes`` "must
  match the sizes specified in the output tensor"; the elements copied "must be within
  the bounds of the input tensor": ``offsets[i] + strides[i] * (sizes[i] - 1) <
  input.sizes[i]``; strides are UINTs (vkml also refuses 0, which the page's "element
  increment" does not give: a zero stride would copy one element over and over; see
  :class:`SliceOperatorDesc`);
* SLICE1: window offsets/sizes/strides have DimensionCount entries; "The input window
  mustn't be empty" (sizes >= 1); ``offsets[i] + sizes[i] <= input.sizes[i]``; "Strides
  may not be 0"; ``1 <= output.sizes[i] <= 1 + (sizes[i] - 1) / |strides[i]|``;
* an output's elements may not overlap (writes would race).
"""
from __future__ import annotations

from dataclasses import dataclass

from .data_type import ALL_TYPES, DataType
from .operator import (FeatureLevel, OperatorDesc, check_no_overlap, field_tuple)
from .tensor_desc import TensorDesc, as_ints
from ..errors import ArgumentTypeError

__all__ = ["JoinOperatorDesc", "SplitOperatorDesc", "SliceOperatorDesc", "Slice1OperatorDesc"]

_FL = FeatureLevel
_F = (DataType.FLOAT32, DataType.FLOAT16)
_I32 = (DataType.INT32, DataType.UINT32)
_I16 = (DataType.INT16, DataType.UINT16)
_I8 = (DataType.INT8, DataType.UINT8)
_R18, _R45, _R4 = range(1, 9), (4, 5), (4,)

#: "Tensor support" rows, newest first: (level, dimension counts, types).
SUPPORT = {
    "JOIN": [(_FL.FL_4_1, _R18, ALL_TYPES), (_FL.FL_3_0, _R45, _F + _I32 + _I16 + _I8),
             (_FL.FL_2_1, _R4, _F + _I32 + _I16 + _I8), (_FL.FL_1_0, _R4, _F + _I32 + _I16)],
    "SPLIT": [(_FL.FL_4_1, _R18, ALL_TYPES), (_FL.FL_3_0, _R18, _F + _I32 + _I16 + _I8),
              (_FL.FL_2_1, _R4, _F + _I32 + _I16 + _I8), (_FL.FL_1_0, _R4, _F + _I32 + _I16)],
    "SLICE": [(_FL.FL_4_1, _R18, ALL_TYPES), (_FL.FL_3_0, _R18, _F + _I32 + _I16 + _I8),
              (_FL.FL_2_1, _R45, _F + _I32 + _I16 + _I8), (_FL.FL_1_0, _R45, _F + _I32 + _I16)],
}
SUPPORT["SLICE1"] = [r for r in SUPPORT["SLICE"] if r[0] >= _FL.FL_2_1]


class _CopyDesc(OperatorDesc):
    """What the four descriptors share (module doc)."""

    NAME = ""

    def _names(self) -> list[tuple[str, TensorDesc]]:
        raise NotImplementedError

    def feature_level(self) -> FeatureLevel:
        """The lowest level whose "Tensor support" row admits every tensor."""
        ts = [t for _, t in self._names()]
        rows = [lv for lv, ranks, types in SUPPORT[self.NAME]
                if all(t.dimension_count in ranks and t.data_type in types for t in ts)]
        return max(self.FEATURE_LEVEL, min(rows) if rows else SUPPORT[self.NAME][0][0])

    def _check_tensors(self) -> None:
        _, ranks, types = SUPPORT[self.NAME][0]
        named = self._names()
        for n, t in named:
            self.check_tensor(n, t, ranks, types)
        first_name, first = named[0]
        for n, t in named[1:]:
            if t.data_type != first.data_type:
                self.fail(f"{n}.data_type", f"must equal {first_name}.data_type "
                          f"({first.data_type.name}): the tensors must have the same "
                          f"DataType, got {t.data_type.name}")
            if t.dimension_count != first.dimension_count:
                self.fail(f"{n}.sizes", f"DimensionCount must equal {first_name}'s "
                          f"({first.dimension_count}), got {t.dimension_count}")


def _tensor_array(desc, name: str, what: str) -> tuple:
    value = getattr(desc, name)
    if isinstance(value, TensorDesc) or not isinstance(value, (tuple, list)):
        raise ArgumentTypeError(desc.field(name), f"must be a sequence of TensorDesc, got "
                                f"{type(value).__name__}")
    if not value:
        desc.fail(name, f"{what} must be greater than 0 (an empty array)")
    return tuple(value)


class _JoinSplit(_CopyDesc):
    """JOIN and SPLIT: one tensor and an array of them, along ``axis``."""

    ARRAY = ""              # the array field
    SINGLE = ""             # the single tensor's field
    COUNT = ""              # the page's name for the array's count

    def _names(self):
        arr = getattr(self, self.ARRAY)
        return [(self.SINGLE, getattr(self, self.SINGLE))] + \
            [(f"{self.ARRAY}[{i}]", t) for i, t in enumerate(arr)]

    def validate(self) -> None:
        """The page's pseudocode: equal sizes except along ``axis``, whose sizes sum."""
        arr = _tensor_array(self, self.ARRAY, self.COUNT)
        self.check_tensor(self.SINGLE, getattr(self, self.SINGLE))
        for i, t in enumerate(arr):
            self.check_tensor(f"{self.ARRAY}[{i}]", t)
        self._check_tensors()
        single = getattr(self, self.SINGLE)
        rank = single.dimension_count
        axis = self.check_uint("axis")
        if axis >= rank:
            self.fail("axis", f"must be in the range [0, DimensionCount - 1] = [0, {rank - 1}], "
                      f"got {axis}")
        total = 0
        for i, t in enumerate(arr):
            for d in range(rank):
                if d != axis and t.sizes[d] != single.sizes[d]:
                    self.fail(f"{self.ARRAY}[{i}].sizes[{d}]", f"must equal "
                              f"{self.SINGLE}.sizes[{d}] ({single.sizes[d]}): sizes may differ "
                              f"only along axis {axis}, got {t.sizes[d]}")
            total += t.sizes[axis]
        if total != single.sizes[axis]:
            self.fail(f"{self.SINGLE}.sizes[{axis}]", f"must equal the sum of the "
                      f"{self.ARRAY}' sizes along axis {axis} ({total}), got "
                      f"{single.sizes[axis]}")
        for n, t in self._out_names():
            check_no_overlap(self, n, t)


@dataclass(frozen=True)
class JoinOperatorDesc(_JoinSplit):
    """``DML_JOIN_OPERATOR_DESC``: the inputs concatenated along ``axis``."""

    input_tensors: tuple
    output_tensor: TensorDesc
    axis: int

    OPERATOR_TYPE = "DML_OPERATOR_JOIN"
    NAME, ARRAY, SINGLE, COUNT = "JOIN", "input_tensors", "output_tensor", "InputCount"

    def __post_init__(self):
        object.__setattr__(self, "input_tensors", field_tuple(self.input_tensors))

    def inputs(self):
        return list(self.input_tensors)

    def outputs(self):
        return [self.output_tensor]

    def _out_names(self):
        return [("output_tensor", self.output_tensor)]


@dataclass(frozen=True)
class SplitOperatorDesc(_JoinSplit):
    """``DML_SPLIT_OPERATOR_DESC``: the input cut along ``axis`` into the outputs."""

    input_tensor: TensorDesc
    output_tensors: tuple
    axis: int

    OPERATOR_TYPE = "DML_OPERATOR_SPLIT"
    NAME, ARRAY, SINGLE, COUNT = "SPLIT", "output_tensors", "input_tensor", "OutputCount"

    def __post_init__(self):
        object.__setattr__(self, "output_tensors", field_tuple(self.output_tensors))

    def inputs(self):
        return [self.input_tensor]

    def outputs(self):
        return list(self.output_tensors)

    def _out_names(self):
        return [(f"output_tensors[{i}]", t) for i, t in enumerate(self.output_tensors)]


class _SliceRules(_CopyDesc):
    def _names(self):
        return [("input_tensor", self.input_tensor), ("output_tensor", self.output_tensor)]

    def inputs(self):
        return [self.input_tensor]

    def outputs(self):
        return [self.output_tensor]

    def _signed(self, name: str, values, rank: int) -> tuple[int, ...]:
        """SLICE1's strides: INT32s, not 0 ("Strides may not be 0")."""
        if values is None:
            self.fail(name, "is required")
        values = as_ints(values, name, fail=self.fail)
        if len(values) != rank:
            self.fail(name, f"must have {rank} entries (DimensionCount), got {len(values)}")
        for i, v in enumerate(values):
            if not -2**31 <= v < 2**31:
                self.fail(f"{name}[{i}]", f"must be an INT, got {v}")
            if v == 0:
                self.fail(f"{name}[{i}]", "Strides may not be 0")
        return values

    def copy_start(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(first input coordinate copied, signed step) per dimension."""
        raise NotImplementedError


@dataclass(frozen=True)
class SliceOperatorDesc(_SliceRules):
    """``DML_SLICE_OPERATOR_DESC``: ``Output[c] = Input[offsets + strides * c]``.

    A stride of 0 is refused: the page calls it "the element increment", and a slice
    whose ``sizes`` exceed what a window holds cannot be stated by DirectML otherwise."""

    input_tensor: TensorDesc
    output_tensor: TensorDesc
    offsets: tuple
    sizes: tuple
    strides: tuple

    OPERATOR_TYPE = "DML_OPERATOR_SLICE"
    NAME = "SLICE"

    def __post_init__(self):
        for f in ("offsets", "sizes", "strides"):
            object.__setattr__(self, f, field_tuple(getattr(self, f)))

    def validate(self) -> None:
        """Module doc, SLICE."""
        self._check_tensors()
        x, y = self.input_tensor, self.output_tensor
        rank = x.dimension_count
        offsets = self.check_uints("offsets", self.offsets, rank)
        sizes = self.check_uints("sizes", self.sizes, rank, 1)
        strides = self.check_uints("strides", self.strides, rank, 1)
        for i in range(rank):
            if sizes[i] != y.sizes[i]:
                self.fail(f"sizes[{i}]", f"must match output_tensor.sizes[{i}] "
                          f"({y.sizes[i]}), got {sizes[i]}")
            last = offsets[i] + strides[i] * (sizes[i] - 1)
            if last >= x.sizes[i]:
                self.fail(f"offsets[{i}]", f"the slice must copy elements within the bounds "
                          f"of the input tensor: offsets + strides * (sizes - 1) = {last} "
                          f"reaches past input_tensor.sizes[{i}] = {x.sizes[i]}")
        check_no_overlap(self, "output_tensor", y)

    def copy_start(self):
        return tuple(self.offsets), tuple(self.strides)


@dataclass(frozen=True)
class Slice1OperatorDesc(_SliceRules):
    """``DML_SLICE1_OPERATOR_DESC``: an input window traversed by signed strides (a
    negative one starts at the window's end)."""

    input_tensor: TensorDesc
    output_tensor: TensorDesc
    input_window_offsets: tuple
    input_window_sizes: tuple
    input_window_strides: tuple

    OPERATOR_TYPE = "DML_OPERATOR_SLICE1"
    FEATURE_LEVEL = _FL.FL_2_1
    NAME = "SLICE1"

    def __post_init__(self):
        for f in ("input_window_offsets", "input_window_sizes", "input_window_strides"):
            object.__setattr__(self, f, field_tuple(getattr(self, f)))

    def validate(self) -> None:
        """Module doc, SLICE1."""
        self._check_tensors()
        x, y = self.input_tensor, self.output_tensor
        rank = x.dimension_count
        offs = self.check_uints("input_window_offsets", self.input_window_offsets, rank)
        sizes = self.check_uints("input_window_sizes", self.input_window_sizes, rank, 1)
        strides = self._signed("input_window_strides", self.input_window_strides, rank)
        for i in range(rank):
            if offs[i] + sizes[i] > x.sizes[i]:
                self.fail(f"input_window_offsets[{i}]", f"InputWindowOffsets + "
                          f"InputWindowSizes ({offs[i]} + {sizes[i]}) must be <= "
                          f"input_tensor.sizes[{i}] ({x.sizes[i]})")
            most = 1 + (sizes[i] - 1) // abs(strides[i])
            if y.sizes[i] > most:
                self.fail(f"output_tensor.sizes[{i}]", f"must be within 1 and "
                          f"1 + (InputWindowSizes - 1) / |InputWindowStrides| = {most}, "
                          f"got {y.sizes[i]}")
        check_no_overlap(self, "output_tensor", y)

    def copy_start(self):
        start = tuple(o + (n - 1 if s < 0 else 0) for o, n, s in zip(
            self.input_window_offsets, self.input_window_sizes, self.input_window_strides))
        return start, tuple(self.input_window_strides)

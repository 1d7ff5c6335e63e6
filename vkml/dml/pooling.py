"""DML_MAX_POOLING_OPERATOR_DESC, DML_MAX_POOLING1_OPERATOR_DESC,
DML_MAX_POOLING2_OPERATOR_DESC, DML_AVERAGE_POOLING_OPERATOR_DESC and
DML_AVERAGE_POOLING1_OPERATOR_DESC (``dml-docs/DML_*_POOLING*_OPERATOR_DESC.md``)."""
from __future__ import annotations

from dataclasses import dataclass

from .data_type import DataType, FLOAT_TYPES
from .operator import FeatureLevel, OperatorDesc, check_no_overlap, field_tuple
from .tensor_desc import TensorDesc

__all__ = ["MaxPoolingOperatorDesc", "MaxPooling1OperatorDesc", "MaxPooling2OperatorDesc",
           "AveragePoolingOperatorDesc", "AveragePooling1OperatorDesc",
           "pooling_output_sizes"]

#: Max pooling's data types (DML_FEATURE_LEVEL_5_0: every type but FLOAT64).
MAX_TYPES = (DataType.FLOAT32, DataType.FLOAT16, DataType.INT64, DataType.INT32,
             DataType.INT16, DataType.INT8, DataType.UINT64, DataType.UINT32,
             DataType.UINT16, DataType.UINT8)
#: OutputIndicesTensor's data types (UINT64 from feature level 5_0).
INDEX_TYPES = (DataType.UINT32, DataType.UINT64)
#: The types each feature level added to max pooling.
_LEVEL_OF_TYPE = {DataType.INT8: FeatureLevel.FL_3_0, DataType.UINT8: FeatureLevel.FL_3_0}

def pooling_output_sizes(input_sizes, strides, window_size, start_padding, end_padding,
                         dilations) -> tuple[int, ...]:
    """``OutputTensor.Sizes``: N and C of the input, then per spatial dimension
    ``(Input + StartPadding + EndPadding - Dilations * (WindowSize - 1) - 1) / Strides + 1``
    (0 where the dilated window does not fit the padded input)."""
    out = list(input_sizes[:2])
    for s, st, w, a, b, dl in zip(input_sizes[2:], strides, window_size, start_padding,
                                  end_padding, dilations):
        num = s + a + b - dl * (w - 1) - 1
        out.append(num // st + 1 if num >= 0 else 0)
    return tuple(out)


@dataclass(frozen=True)
class WindowFields:
    """The fields (in the pages' order) of a pooling descriptor without dilations."""

    input_tensor: TensorDesc
    output_tensor: TensorDesc
    strides: tuple | None = None
    window_size: tuple = ()
    start_padding: tuple | None = None
    end_padding: tuple | None = None


@dataclass(frozen=True)
class DilatedWindowFields(WindowFields):
    """:class:`WindowFields`, then ``dilations`` (the pages of the later versions)."""

    dilations: tuple | None = None


@dataclass(frozen=True)
class _MaxWindowFields:
    """Max pooling's fields: OutputIndicesTensor stands between the output and Strides."""

    input_tensor: TensorDesc
    output_tensor: TensorDesc
    output_indices_tensor: TensorDesc | None = None
    strides: tuple | None = None
    window_size: tuple = ()
    start_padding: tuple | None = None
    end_padding: tuple | None = None


class PoolingWindowRules(OperatorDesc):
    """The window rules every pooling descriptor shares (max, average and LP pooling):
    4D or 5D input and output of one DataType of ``_TYPES``, per-dimension arrays of
    DimensionCount - 2 entries, and the dilated window fitting the padded input."""

    _PER_DIM = ("strides", "window_size", "start_padding", "end_padding", "dilations")
    _TYPES = FLOAT_TYPES

    def __post_init__(self):
        rank = None
        if isinstance(self.input_tensor, TensorDesc):
            rank = self.input_tensor.dimension_count - 2
        for name in self._PER_DIM:
            if not hasattr(self, name):
                continue
            v = getattr(self, name)
            if v is None and name != "window_size" and rank is not None and rank > 0:
                v = (1 if name in ("strides", "dilations") else 0,) * rank
            object.__setattr__(self, name, field_tuple(v))

    def inputs(self):
        return [self.input_tensor]

    def outputs(self):
        return [self.output_tensor]

    @property
    def dilation_values(self) -> tuple[int, ...]:
        d = getattr(self, "dilations", None)
        return d if d is not None else (1,) * (self.input_tensor.dimension_count - 2)

    def validate_tensors(self) -> None:
        """Input and output: 4D or 5D, ``_TYPES``, the same DataType and DimensionCount;
        the output's elements do not overlap."""
        self.check_tensor("input_tensor", self.input_tensor, (4, 5), self._TYPES)
        self.check_tensor("output_tensor", self.output_tensor, (4, 5), self._TYPES)
        self.check_same_type(["input_tensor", "output_tensor"])
        self.check_same_rank(["input_tensor", "output_tensor"])
        check_no_overlap(self, "output_tensor", self.output_tensor)

    def validate_window(self) -> tuple[tuple[int, ...], ...]:
        """The per-dimension arrays (DimensionCount - 2 UINTs; window sizes, strides and
        dilations at least 1), as (window, strides, start, end, dilations); dilations
        are all 1 for a descriptor without them."""
        d = self.input_tensor.dimension_count - 2
        what = f"DimensionCount = {d}: 2 for 4D tensors, 3 for 5D"
        for name in self._PER_DIM:
            if hasattr(self, name) and not isinstance(getattr(self, name), tuple):
                self.fail(name, f"must be a sequence of {d} UINTs, got {getattr(self, name)!r}")
        window = self.check_uints("window_size", self.window_size, d, 1, what)
        strides = self.check_uints("strides", self.strides, d, 1, what)
        start = self.check_uints("start_padding", self.start_padding, d, 0, what)
        end = self.check_uints("end_padding", self.end_padding, d, 0, what)
        dil = (self.check_uints("dilations", self.dilations, d, 1, what)
               if hasattr(self, "dilations") else (1,) * d)
        return window, strides, start, end, dil

    def validate_sizes(self, window, strides, start, end, dil) -> None:
        """The dilated window fits the padded input, and the output sizes follow it."""
        sizes_in = self.input_tensor.sizes
        for i in range(len(window)):
            padded = sizes_in[2 + i] + start[i] + end[i]
            if dil[i] * (window[i] - 1) + 1 > padded:
                self.fail(f"window_size[{i}]", f"the dilated window Dilations[i] * "
                          f"(WindowSize[i] - 1) + 1 = {dil[i] * (window[i] - 1) + 1} must fit "
                          f"the padded size Input + StartPadding + EndPadding = {padded}")
        expect = pooling_output_sizes(sizes_in, strides, window, start, end, dil)
        for i, (got, want) in enumerate(zip(self.output_tensor.sizes, expect)):
            if got != want:
                rule = ("OutputTensor.Sizes[i] = InputTensor.Sizes[i] for N and C" if i < 2 else
                        "OutputTensor.Sizes[i + 2] = (InputTensor.Sizes[i + 2] + "
                        "StartPadding[i] + EndPadding[i] - Dilations[i] * (WindowSize[i] - 1) "
                        "- 1) / Strides[i] + 1")
                self.fail(f"output_tensor.sizes[{i}]", f"{rule} must hold: expected {want}, "
                          f"got {got}")


class _PoolingRules(PoolingWindowRules):
    """Rules every max and average pooling descriptor shares (see
    MaxPooling2OperatorDesc)."""

    @property
    def indices_tensor(self) -> TensorDesc | None:
        return getattr(self, "output_indices_tensor", None)

    def feature_level(self) -> FeatureLevel:
        level = self.FEATURE_LEVEL
        t = getattr(self.input_tensor, "data_type", None)
        if t is not None and t not in FLOAT_TYPES:
            level = max(level, _LEVEL_OF_TYPE.get(t, FeatureLevel.FL_5_0))
        idx = self.indices_tensor
        if idx is not None and getattr(idx, "data_type", None) == DataType.UINT64:
            level = max(level, FeatureLevel.FL_5_0)
        return level

    def validate(self) -> None:
        self.validate_tensors()
        if hasattr(self, "output_indices_tensor"):
            self._validate_indices()
        window = self.validate_window()
        if hasattr(self, "include_padding") and not isinstance(self.include_padding, bool):
            self.fail("include_padding", f"is a BOOL (True or False), got "
                      f"{self.include_padding!r}")
        self.validate_sizes(*window)

    def _validate_indices(self) -> None:
        """OutputIndicesTensor (optional): UINT32 or UINT64, the output's
        DimensionCount and (the page: "both have the same tensor sizes") Sizes."""
        idx = self.output_indices_tensor
        self.check_tensor("output_indices_tensor", idx, (4, 5), INDEX_TYPES, optional=True)
        if idx is None:
            return
        self.check_same_rank(["input_tensor", "output_tensor", "output_indices_tensor"])
        if tuple(idx.sizes) != tuple(self.output_tensor.sizes):
            self.fail("output_indices_tensor.sizes", f"OutputIndicesTensor and OutputTensor "
                      f"have the same sizes: expected {tuple(self.output_tensor.sizes)}, "
                      f"got {tuple(idx.sizes)}")
        check_no_overlap(self, "output_indices_tensor", idx)


class _MaxPoolingRules(_PoolingRules):
    """Max pooling's types, and OutputIndicesTensor bound after the output where the
    descriptor has one (an absent optional output is not bound at all)."""

    _TYPES = MAX_TYPES

    def outputs(self):
        idx = self.indices_tensor
        return [self.output_tensor] + ([idx] if idx is not None else [])


@dataclass(frozen=True)
class MaxPooling2OperatorDesc(_MaxPoolingRules, _MaxWindowFields):
    """``DML_MAX_POOLING2_OPERATOR_DESC``: the maximum over each (dilated) window, and
    optionally its index.

    Rules (the three max pooling pages): 4D or 5D input and output of the same DataType
    and DimensionCount (FLOAT32, FLOAT16; INT8, UINT8 from feature level 3_0; every other
    integer type from 5_0); ``strides``, ``window_size``, ``start_padding``,
    ``end_padding``, ``dilations`` have DimensionCount - 2 entries; strides, window sizes
    and dilations are at least 1; the optional ``output_indices_tensor`` is UINT32 (UINT64
    from 5_0) with the output's DimensionCount and Sizes.  Each spatial output size is
    ``(Input + StartPadding + EndPadding - Dilations * (WindowSize - 1) - 1) / Strides + 1``
    (the page's formula omits the dilation; vkml uses the dilated window's extent as
    ONNX MaxPool does), and the dilated window must fit the padded input.

    Indices (the page): zero-based positions in the input read as a contiguous 1-D array
    (``((n * C + c) * H + h) * W + w``, as ONNX MaxPool's Indices with its default
    storage order; PyTorch's ``return_indices`` numbers within each (n, c) plane
    instead), the first maximum winning a tie.  Padding never wins; a NaN beats every
    number (the first NaN wins); a window lying wholly in padding gives the type's lowest
    value (-inf for floats) and index 0.
    """

    dilations: tuple | None = None

    OPERATOR_TYPE = "DML_OPERATOR_MAX_POOLING2"
    FEATURE_LEVEL = FeatureLevel.FL_2_1


@dataclass(frozen=True)
class MaxPooling1OperatorDesc(_MaxPoolingRules, _MaxWindowFields):
    """``DML_MAX_POOLING1_OPERATOR_DESC``: :class:`MaxPooling2OperatorDesc` without
    dilations (all 1)."""

    OPERATOR_TYPE = "DML_OPERATOR_MAX_POOLING1"
    FEATURE_LEVEL = FeatureLevel.FL_2_0


@dataclass(frozen=True)
class MaxPoolingOperatorDesc(_MaxPoolingRules, WindowFields):
    """``DML_MAX_POOLING_OPERATOR_DESC``: :class:`MaxPooling2OperatorDesc` without
    dilations and without indices."""

    OPERATOR_TYPE = "DML_OPERATOR_MAX_POOLING"
    FEATURE_LEVEL = FeatureLevel.FL_1_0


@dataclass(frozen=True)
class AveragePooling1OperatorDesc(_PoolingRules, DilatedWindowFields):
    """``DML_AVERAGE_POOLING1_OPERATOR_DESC``: the mean over each (dilated) window.

    Rules as :class:`MaxPooling2OperatorDesc` but FLOAT32/FLOAT16 only, and
    ``include_padding`` is a BOOL.  IncludePadding: the divisor is the whole window
    (WindowSize's product: a window always lies within the padded input), else the count
    of its cells inside the input; a window with none gives 0.  Sums are float32.
    """

    include_padding: bool = False

    OPERATOR_TYPE = "DML_OPERATOR_AVERAGE_POOLING1"
    FEATURE_LEVEL = FeatureLevel.FL_6_2


@dataclass(frozen=True)
class AveragePoolingOperatorDesc(_PoolingRules, WindowFields):
    """``DML_AVERAGE_POOLING_OPERATOR_DESC``: :class:`AveragePooling1OperatorDesc`
    without dilations (all 1)."""

    include_padding: bool = False

    OPERATOR_TYPE = "DML_OPERATOR_AVERAGE_POOLING"
    FEATURE_LEVEL = FeatureLevel.FL_1_0

"""DML_REDUCE_OPERATOR_DESC and DML_REDUCE_FUNCTION (``dml-docs/DML_REDUCE_OPERATOR_DESC.md``,
``dml-docs/DML_REDUCE_FUNCTION.md``)."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from .data_type import DataType, FLOAT_TYPES
from .operator import FeatureLevel, InputOutputDesc, check_no_overlap, enum_of
from .tensor_desc import TensorDesc, as_ints

__all__ = ["ReduceFunction", "ReduceOperatorDesc", "reduce_output_sizes"]


class ReduceFunction(enum.IntEnum):
    """``DML_REDUCE_FUNCTION`` with DirectML's values."""

    ARGMAX = 0
    ARGMIN = 1
    AVERAGE = 2
    L1 = 3
    L2 = 4
    LOG_SUM = 5
    LOG_SUM_EXP = 6
    MAX = 7
    MIN = 8
    MULTIPLY = 9
    SUM = 10
    SUM_SQUARE = 11


_T = DataType
_ALL = (_T.FLOAT32, _T.FLOAT16, _T.INT64, _T.INT32, _T.INT16, _T.INT8, _T.UINT64,
        _T.UINT32, _T.UINT16, _T.UINT8)
_WIDE = (_T.FLOAT32, _T.FLOAT16, _T.INT64, _T.INT32, _T.UINT64, _T.UINT32)
#: The page's input data types per function (highest feature level), and the output
#: types of ARGMIN/ARGMAX (every other function outputs the input's type).
INPUT_TYPES = {
    ReduceFunction.ARGMAX: _ALL, ReduceFunction.ARGMIN: _ALL,
    ReduceFunction.AVERAGE: FLOAT_TYPES, ReduceFunction.L2: FLOAT_TYPES,
    ReduceFunction.LOG_SUM: FLOAT_TYPES, ReduceFunction.LOG_SUM_EXP: FLOAT_TYPES,
    ReduceFunction.L1: _WIDE, ReduceFunction.SUM_SQUARE: _WIDE,
    ReduceFunction.MIN: _ALL, ReduceFunction.MAX: _ALL,
    ReduceFunction.MULTIPLY: _WIDE, ReduceFunction.SUM: _WIDE}
INDEX_TYPES = (_T.INT64, _T.INT32, _T.UINT64, _T.UINT32)
ARG_FUNCTIONS = (ReduceFunction.ARGMAX, ReduceFunction.ARGMIN)


def reduce_output_sizes(sizes, axes) -> tuple[int, ...]:
    """The input's sizes with every reduced axis 1 (the rank is kept)."""
    return tuple(1 if i in axes else s for i, s in enumerate(sizes))


def _type_level(function: ReduceFunction, t: DataType) -> FeatureLevel:
    """The feature level whose table first lists input type ``t`` for ``function``."""
    if t in FLOAT_TYPES:
        return FeatureLevel.FL_1_0
    if t in (_T.INT64, _T.UINT64) or function in (ReduceFunction.L1, ReduceFunction.SUM_SQUARE):
        return FeatureLevel.FL_4_1 if function in ARG_FUNCTIONS else FeatureLevel.FL_5_0
    if t in (_T.INT32, _T.UINT32) or function in ARG_FUNCTIONS:
        return FeatureLevel.FL_2_1
    return FeatureLevel.FL_3_0


@dataclass(frozen=True)
class ReduceOperatorDesc(InputOutputDesc):
    """``DML_REDUCE_OPERATOR_DESC``: each output element is ``function`` over the input
    elements sharing its coordinates on the axes not reduced.

    Rules (the page): input and output of 1 to 8 dimensions (4 before feature level
    3_0), the same DimensionCount, the output's Sizes the input's with every reduced axis
    1; ``axes`` each in ``[0, DimensionCount - 1]``; the data types of the page's table
    for ``function`` (AVERAGE, L2, LOG_SUM, LOG_SUM_EXP: FLOAT32/FLOAT16; L1, SUM_SQUARE,
    SUM, MULTIPLY: those and INT32/UINT32/INT64/UINT64; MIN, MAX, ARGMIN, ARGMAX: every
    type but FLOAT64); the output's type is the input's, except ARGMIN/ARGMAX, whose
    output is INT32, UINT32, INT64 or UINT64.

    Choices where the page is silent: ``axes`` is not empty and names each axis once.
    ARGMIN/ARGMAX store the position of the extreme among the reduced elements numbered
    row-major over the reduced axes in increasing axis order (the index along the axis for one axis, as ONNX
    ArgMax); the first (smallest index) wins a tie, as DML_AXIS_DIRECTION_INCREASING
    scans, and NumPy's argmax; a NaN is the extreme of both (the first NaN wins).
    Integer SUM/MULTIPLY/L1/SUM_SQUARE wrap modulo 2^bits.
    """

    function: ReduceFunction | int | str
    input_tensor: TensorDesc
    output_tensor: TensorDesc
    axes: tuple = ()

    OPERATOR_TYPE = "DML_OPERATOR_REDUCE"
    FEATURE_LEVEL = FeatureLevel.FL_1_0
    _TUPLE_FIELDS = ("axes",)

    @property
    def reduce_function(self) -> ReduceFunction:
        return enum_of(ReduceFunction, self.function, self.field("function"),
                       "DML_REDUCE_FUNCTION_")

    def feature_level(self) -> FeatureLevel:
        level = self.FEATURE_LEVEL
        t = self.input_tensor
        if isinstance(t, TensorDesc):
            level = max(level, _type_level(self.reduce_function, t.data_type))
            if t.dimension_count != 4:
                level = max(level, FeatureLevel.FL_3_0)
        out = self.output_tensor
        if (isinstance(out, TensorDesc) and self.reduce_function in ARG_FUNCTIONS
                and out.data_type != _T.UINT32):
            level = max(level, FeatureLevel.FL_3_0)
        return level

    def validate(self) -> None:
        fn = self.reduce_function
        # the page's data types depend on the function: a message names both
        context = f" with function {fn.name}"
        self.check_tensor("input_tensor", self.input_tensor, range(1, 9), INPUT_TYPES[fn],
                          context=context)
        out_types = INDEX_TYPES if fn in ARG_FUNCTIONS else INPUT_TYPES[fn]
        self.check_tensor("output_tensor", self.output_tensor, range(1, 9), out_types,
                          context=context)
        if fn not in ARG_FUNCTIONS:
            self.check_same_type(["input_tensor", "output_tensor"])
        self.check_same_rank(["input_tensor", "output_tensor"])
        check_no_overlap(self, "output_tensor", self.output_tensor)
        rank = self.input_tensor.dimension_count
        if not isinstance(self.axes, tuple):
            self.fail("axes", f"must be a sequence of UINTs, got {self.axes!r}")
        axes = as_ints(self.axes, "axes", fail=self.fail)
        if not axes:
            self.fail("axes", "AxisCount must be at least 1 (the axes along which to reduce)")
        for i, a in enumerate(axes):
            if not 0 <= a < rank:
                self.fail(f"axes[{i}]", f"values must be in the range [0, "
                          f"InputTensor.DimensionCount - 1] = [0, {rank - 1}], got {a}")
            if a in axes[:i]:
                self.fail(f"axes[{i}]", f"each axis may be reduced once, got {a} twice")
        want = reduce_output_sizes(self.input_tensor.sizes, axes)
        for i, (got, w) in enumerate(zip(self.output_tensor.sizes, want)):
            if got != w:
                rule = ("must be 1 (a reduced axis)" if i in axes else
                        "must match InputTensor.Sizes (an axis not reduced)")
                self.fail(f"output_tensor.sizes[{i}]", f"{rule}: expected {w}, got {got}")

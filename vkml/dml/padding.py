"""DML_PADDING_OPERATOR_DESC and DML_PADDING1_OPERATOR_DESC (seed page and dml-docs)."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from .data_type import ALL_TYPES, DataType
from .operator import (FeatureLevel, OperatorDesc, as_real, check_no_overlap, enum_of,
                       field_tuple)
from .tensor_desc import TensorDesc


class PaddingMode(enum.IntEnum):
    """``DML_PADDING_MODE``; SYMMETRIC needs feature level 3_0 and WRAP 6_4."""

    CONSTANT = 0
    EDGE = 1
    REFLECTION = 2
    SYMMETRIC = 3
    WRAP = 4


_MODE_LEVEL = {PaddingMode.SYMMETRIC: FeatureLevel.FL_3_0, PaddingMode.WRAP: FeatureLevel.FL_6_4}


def padding_value_bits(value, data_type: DataType, exact: bool, field: str, fail) -> int:
    """The padding constant as the raw bits of one output element.

    ``exact=False`` (DML_PADDING_OPERATOR_DESC's FLOAT value): for integer types the value
    is truncated toward zero as the page says (10.6 -> 10), then saturated to the type's
    range (NaN -> 0); float types round to nearest, a value beyond their range becoming
    +-inf as IEEE conversion does (numpy.pad's and torch's choice).  ``exact=True`` (PADDING1's typed
    DML_SCALAR_UNION): the value must be representable in the type (NaN and infinities
    are not, in an integer type; a finite value beyond a float type's range is not).
    """
    value = as_real(value, field, fail)       # a real number; None, strings, bools refused
    dt = data_type.numpy
    if data_type.is_float:
        try:
            f = float(value)
        except OverflowError:                     # an int beyond float64, and every float
            f = math.inf if value > 0 else -math.inf
        with np.errstate(over="ignore"):          # beyond the type's range: +-inf
            bits = np.array([f], dtype=dt)
        if exact and math.isinf(bits[0]) and not (isinstance(value, float)
                                                   and math.isinf(value)):
            fail(field, f"{value!r} does not fit {data_type.name} (it would be infinite)")
    elif exact:
        if isinstance(value, float) and not math.isfinite(value):
            fail(field, f"{value!r} is not an integer of type {data_type.name}")
        ivalue = int(value)
        if ivalue != value:
            fail(field, f"{value!r} is not an integer of type {data_type.name}")
        info = np.iinfo(dt)
        if not info.min <= ivalue <= info.max:
            fail(field, f"{value!r} does not fit {data_type.name} ({info.min}..{info.max})")
        bits = np.array([ivalue], dtype=dt)
    else:
        try:
            f = float(value)
        except OverflowError:                     # an int beyond float64: saturated below
            f = math.inf if value > 0 else -math.inf
        info = np.iinfo(dt)
        ivalue = 0 if f != f else int(max(min(np.trunc(f), info.max), info.min))
        bits = np.array([ivalue], dtype=dt)
    raw = bits.view(np.dtype(f"u{data_type.size}"))[0]
    return int(raw)


class _PaddingRules(OperatorDesc):
    """The rules both padding descriptors share (see PaddingOperatorDesc)."""

    def __post_init__(self):
        object.__setattr__(self, "start_padding", field_tuple(self.start_padding))
        object.__setattr__(self, "end_padding", field_tuple(self.end_padding))

    @property
    def mode(self) -> PaddingMode:
        return enum_of(PaddingMode, self.padding_mode, self.field("padding_mode"),
                       "DML_PADDING_MODE_")

    def inputs(self):
        return [self.input_tensor]

    def outputs(self):
        return [self.output_tensor]

    def feature_level(self) -> FeatureLevel:
        return max(self.FEATURE_LEVEL, _MODE_LEVEL.get(self.mode, FeatureLevel.FL_1_0))

    def validate(self) -> None:
        self.check_tensor("input_tensor", self.input_tensor, range(1, 9), ALL_TYPES)
        self.check_tensor("output_tensor", self.output_tensor, range(1, 9), ALL_TYPES)
        self.check_same_type(["input_tensor", "output_tensor"])
        self.check_same_rank(["input_tensor", "output_tensor"])
        check_no_overlap(self, "output_tensor", self.output_tensor)
        self.mode  # noqa: B018  (raises for an unknown mode)
        n = self.input_tensor.dimension_count
        start = self.check_uints("start_padding", self.start_padding, n)
        end = self.check_uints("end_padding", self.end_padding, n)
        for i, (si, so, s, e) in enumerate(zip(self.input_tensor.sizes,
                                               self.output_tensor.sizes, start, end)):
            if so != si + s + e:
                self.fail(f"output_tensor.sizes[{i}]",
                          "OutputTensor.Sizes[i] = InputTensor.Sizes[i] + StartPadding[i] + "
                          f"EndPadding[i] must hold: {so} != {si} + {s} + {e}")
        self.value_bits()



@dataclass(frozen=True)
class PaddingOperatorDesc(_PaddingRules):
    """``DML_PADDING_OPERATOR_DESC``.

    Rules: Input and Output have the same DataType and DimensionCount (1 to 8);
    ``start_padding``/``end_padding`` have DimensionCount entries; for each dimension
    ``OutputTensor.Sizes[i] = InputTensor.Sizes[i] + StartPadding[i] + EndPadding[i]``.
    Reflection folds periodically when a padding reaches the size, symmetric when it
    exceeds it.  On a dimension of size 1 reflection repeats the single element (as
    ``numpy.pad``; there is nothing else to reflect).
    """

    input_tensor: TensorDesc
    output_tensor: TensorDesc
    padding_mode: PaddingMode = PaddingMode.CONSTANT
    padding_value: float = 0.0
    start_padding: tuple = ()
    end_padding: tuple = ()

    OPERATOR_TYPE = "DML_OPERATOR_PADDING"
    FEATURE_LEVEL = FeatureLevel.FL_1_0

    def value_bits(self) -> int:
        """The constant as raw output-element bits (see :func:`padding_value_bits`)."""
        return padding_value_bits(self.padding_value, self.output_tensor.data_type, False,
                                  "padding_value", self.fail)


@dataclass(frozen=True)
class Padding1OperatorDesc(_PaddingRules):
    """``DML_PADDING1_OPERATOR_DESC``: PADDING with a typed ``padding_value``.

    ``padding_value_data_type`` must match ``OutputTensor.DataType``; the value must be
    representable in it (int64/uint64 constants are exact).
    """

    input_tensor: TensorDesc
    output_tensor: TensorDesc
    padding_mode: PaddingMode = PaddingMode.CONSTANT
    padding_value_data_type: DataType = DataType.FLOAT32
    padding_value: float | int = 0
    start_padding: tuple = ()
    end_padding: tuple = ()

    OPERATOR_TYPE = "DML_OPERATOR_PADDING1"
    FEATURE_LEVEL = FeatureLevel.FL_5_0

    def validate(self) -> None:
        vt = DataType.of(self.padding_value_data_type, self.field("padding_value_data_type"))
        out = self.output_tensor
        if isinstance(out, TensorDesc) and vt != out.data_type:
            self.fail("padding_value_data_type", "must match OutputTensor.DataType "
                      f"({out.data_type.name}), got {vt.name}")
        super().validate()

    def value_bits(self) -> int:
        return padding_value_bits(self.padding_value, self.output_tensor.data_type, True,
                                  "padding_value", self.fail)

"""DML_LP_POOLING_OPERATOR_DESC and DML_LP_POOLING1_OPERATOR_DESC
(``dml-docs/DML_LP_POOLING_OPERATOR_DESC.md``, ``seeds/DML_LP_POOLING1_OPERATOR_DESC.md``)."""
from __future__ import annotations

from dataclasses import dataclass

from .data_type import FLOAT_TYPES
from .operator import FeatureLevel, OperatorDesc, check_no_overlap, field_tuple
from .tensor_desc import TensorDesc

__all__ = ["LpPoolingOperatorDesc", "LpPooling1OperatorDesc", "lp_pooling_output_sizes"]


def lp_pooling_output_sizes(input_sizes, strides, window_size, start_padding, end_padding,
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


class _LpPoolingRules(OperatorDesc):
    """Rules both LP pooling descriptors share (see LpPooling1OperatorDesc)."""

    _PER_DIM = ("strides", "window_size", "start_padding", "end_padding", "dilations")

    def __post_init__(self):
        rank = None
        if isinstance(self.input_tensor, TensorDesc):
            rank = self.input_tensor.dimension_count - 2
        set_ = object.__setattr__
        for name in self._PER_DIM:
            if not hasattr(self, name):
                continue
            v = getattr(self, name)
            if v is None and name != "window_size" and rank is not None and rank > 0:
                v = (1 if name in ("strides", "dilations") else 0,) * rank
            v = field_tuple(v)
            set_(self, name, v)

    def inputs(self):
        return [self.input_tensor]

    def outputs(self):
        return [self.output_tensor]

    @property
    def dilation_values(self) -> tuple[int, ...]:
        d = getattr(self, "dilations", None)
        return d if d is not None else (1,) * (self.input_tensor.dimension_count - 2)

    def validate(self) -> None:
        self.check_tensor("input_tensor", self.input_tensor, (4, 5), FLOAT_TYPES)
        self.check_tensor("output_tensor", self.output_tensor, (4, 5), FLOAT_TYPES)
        self.check_same_type(["input_tensor", "output_tensor"])
        self.check_same_rank(["input_tensor", "output_tensor"])
        check_no_overlap(self, "output_tensor", self.output_tensor)
        d = self.input_tensor.dimension_count - 2
        what = f"DimensionCount = {d}: 2 for 4D tensors, 3 for 5D"
        for name in self._PER_DIM:
            if hasattr(self, name) and not isinstance(getattr(self, name), tuple):
                self.fail(name, f"must be a sequence of {d} UINTs, got {getattr(self, name)!r}")
        window = self.check_uints("window_size", self.window_size, d, 1, what)
        strides = self.check_uints("strides", self.strides, d, 1, what)
        start = self.check_uints("start_padding", self.start_padding, d, 0, what)
        end = self.check_uints("end_padding", self.end_padding, d, 0, what)
        if hasattr(self, "dilations"):
            dil = self.check_uints("dilations", self.dilations, d, 1, what)
        else:
            dil = (1,) * d
        self.check_uint("p", 1)     # P >= 1: Y = (X1^P + ... + Xn^P)^(1/P)
        sizes_in = self.input_tensor.sizes
        for i in range(d):
            padded = sizes_in[2 + i] + start[i] + end[i]
            if dil[i] * (window[i] - 1) + 1 > padded:
                self.fail(f"window_size[{i}]", f"the dilated window Dilations[i] * "
                          f"(WindowSize[i] - 1) + 1 = {dil[i] * (window[i] - 1) + 1} must fit "
                          f"the padded size Input + StartPadding + EndPadding = {padded}")
        expect = lp_pooling_output_sizes(sizes_in, strides, window, start, end, dil)
        for i, (got, want) in enumerate(zip(self.output_tensor.sizes, expect)):
            if got != want:
                rule = ("OutputTensor.Sizes[i] = InputTensor.Sizes[i] for N and C" if i < 2 else
                        "OutputTensor.Sizes[i + 2] = (InputTensor.Sizes[i + 2] + "
                        "StartPadding[i] + EndPadding[i] - Dilations[i] * (WindowSize[i] - 1) "
                        "- 1) / Strides[i] + 1")
                self.fail(f"output_tensor.sizes[{i}]", f"{rule} must hold: expected {want}, "
                          f"got {got}")


@dataclass(frozen=True)
class LpPooling1OperatorDesc(_LpPoolingRules):
    """``DML_LP_POOLING1_OPERATOR_DESC``: ``Y = (|X1|^P + ... + |Xn|^P)^(1/P)`` over each
    (dilated) window.

    Rules (both pages): 4D or 5D input and output of the same DataType (FLOAT32 or
    FLOAT16) and DimensionCount; ``strides``, ``window_size``, ``start_padding``,
    ``end_padding``, ``dilations`` have DimensionCount - 2 entries (2 for 4D, 3 for 5D);
    strides, window sizes and dilations are at least 1; ``p`` is a UINT, at least 1
    (``1/P`` must exist).  N and C are kept and each spatial output size is

        (Input + StartPadding + EndPadding - Dilations * (WindowSize - 1) - 1) / Strides + 1

    The page's formula ``(PaddedSize - WindowSizes[i]) / Strides[i] + 1`` omits the
    dilation; it is the same formula when Dilations are 1, and with dilations vkml uses
    the dilated window's extent as ONNX LpPool and PyTorch pooling do.  The dilated
    window must fit the padded input (at least one output element per dimension).

    Choices where the page is silent: the absolute value of each element is taken (the
    norm's definition, as ONNX LpPool and PyTorch ``lp_pool``'s ``|x|`` do for even P,
    and for odd P where they would produce NaN or a negative base); padding elements are
    zeros and contribute nothing; a window lying wholly in padding gives 0.
    """

    input_tensor: TensorDesc
    output_tensor: TensorDesc
    strides: tuple | None = None
    window_size: tuple = ()
    start_padding: tuple | None = None
    end_padding: tuple | None = None
    dilations: tuple | None = None
    p: int = 2

    OPERATOR_TYPE = "DML_OPERATOR_LP_POOLING1"
    FEATURE_LEVEL = FeatureLevel.FL_6_2


@dataclass(frozen=True)
class LpPoolingOperatorDesc(_LpPoolingRules):
    """``DML_LP_POOLING_OPERATOR_DESC``: LP pooling without dilations (all 1); every other
    rule as :class:`LpPooling1OperatorDesc`, whose output-size formula (the page's) it
    follows exactly."""

    input_tensor: TensorDesc
    output_tensor: TensorDesc
    strides: tuple | None = None
    window_size: tuple = ()
    start_padding: tuple | None = None
    end_padding: tuple | None = None
    p: int = 2

    OPERATOR_TYPE = "DML_OPERATOR_LP_POOLING"
    FEATURE_LEVEL = FeatureLevel.FL_1_0

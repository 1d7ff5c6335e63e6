"""DML_CONVOLUTION_OPERATOR_DESC (seed page), with DML_CONVOLUTION_MODE and _DIRECTION."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from .activations import (ActivationDesc, check_fused_activation, coerce_fused_activation,
                          fused_activation_level)
from .data_type import DataType
from .operator import FeatureLevel, OperatorDesc, check_no_overlap, enum_of
from .tensor_desc import TensorDesc

_FLOATS = (DataType.FLOAT32, DataType.FLOAT16)


class ConvolutionMode(enum.IntEnum):
    """``DML_CONVOLUTION_MODE`` (DirectML's values)."""

    CONVOLUTION = 0
    CROSS_CORRELATION = 1


class ConvolutionDirection(enum.IntEnum):
    """``DML_CONVOLUTION_DIRECTION`` (DirectML's values)."""

    FORWARD = 0
    BACKWARD = 1


def filter_is_flipped(mode: ConvolutionMode) -> bool:
    """The page's mode-interaction table, read against the direction's own formula.

    ============================ ============ ===================================
    mode                         direction    filter orientation
    ============================ ============ ===================================
    CROSS_CORRELATION            FORWARD      identity
    CROSS_CORRELATION            BACKWARD     transposed along the spatial axes
    CONVOLUTION                  FORWARD      transposed along the spatial axes
    CONVOLUTION                  BACKWARD     identity
    ============================ ============ ===================================

    Backward is the transpose (the gradient) of forward cross-correlation: expressed as a
    correlation over the zero-stuffed input its filter is flipped, which is the table's
    "transposed" entry; it is exactly ONNX ConvTranspose / ``torch.conv_transpose*d``
    (``y[i*stride + k*dilation - start] += x[i] * w[k]``).  CONVOLUTION flips the kernel
    relative to CROSS_CORRELATION in both directions.  So in vkml's formulas
    (forward: ``y[o] = sum x[o*stride + k*dilation - start] * w[k]``; backward as above)
    the kernel index is reversed exactly when the mode is CONVOLUTION.
    """
    return mode == ConvolutionMode.CONVOLUTION


@dataclass(frozen=True)
class ConvolutionOperatorDesc(OperatorDesc):
    """``DML_CONVOLUTION_OPERATOR_DESC``.

    Fields in the page's order; ``DimensionCount`` (spatial dimensions) is the length of
    the per-dimension arrays.  ``None`` for an array means the neutral value (1 for
    ``strides``/``dilations``, 0 for the paddings) for every spatial dimension.
    ``fused_activation`` is None, an activation descriptor, or an activation name.

    Rules (page, "Tensor constraints" and "Tensor support", and the field descriptions):
    * Input, Filter, Bias and Output have the same DataType (FLOAT32 or FLOAT16) and the
      same DimensionCount, 3 to 5 (3 from DML_FEATURE_LEVEL_4_0, 4 to 5 before).
    * The arrays have DimensionCount - 2 entries (the spatial dimensions); strides and
      dilations are at least 1.
    * GroupCount >= 1 divides the input and output channel counts.
    * Forward: Filter is {OutputChannelCount, InputChannelCount / GroupCount, *kernel};
      Output is {BatchCount, OutputChannelCount, *out} with
      ``out = (in + start + end - dilation*(kernel-1) - 1) // stride + 1 + output_padding``.
    * Backward (transposed): Filter is {InputChannelCount, OutputChannelCount / GroupCount,
      *kernel} (ONNX ConvTranspose's layout, shared/spec/API.md); per spatial dimension
      ``out = (in-1)*stride + dilation*(kernel-1) + 1 - start - end + output_padding``.
    * Bias, when present, is {1, OutputChannelCount, 1, ...}.
    * The fused activation is one the fused-activation page lists, with its tensors NULL.

    OutputPadding "applies a zero padding to the result of the convolution ... at the end
    of each spatial dimension of the output tensor".  Backward: the added positions hold
    what the transposed convolution puts there (ONNX ConvTranspose, torch's
    output_padding): contributions where there are any, else zero.  Forward (neither ONNX
    Conv nor DirectMLX use it): the added positions are the literal zero padding of the
    convolution's result; like every output element they then get the bias and the
    activation, so they hold ``activation(bias)``.
    """

    input_tensor: TensorDesc
    filter_tensor: TensorDesc
    bias_tensor: TensorDesc | None
    output_tensor: TensorDesc
    mode: ConvolutionMode = ConvolutionMode.CROSS_CORRELATION
    direction: ConvolutionDirection = ConvolutionDirection.FORWARD
    strides: tuple | None = None
    dilations: tuple | None = None
    start_padding: tuple | None = None
    end_padding: tuple | None = None
    output_padding: tuple | None = None
    group_count: int = 1
    fused_activation: ActivationDesc | None = None

    OPERATOR_TYPE = "DML_OPERATOR_CONVOLUTION"
    FEATURE_LEVEL = FeatureLevel.FL_1_0

    def __post_init__(self):
        rank = getattr(self.input_tensor, "dimension_count", 2)
        n = max(rank - 2, 0)
        for name, neutral in (("strides", 1), ("dilations", 1), ("start_padding", 0),
                              ("end_padding", 0), ("output_padding", 0)):
            v = getattr(self, name)
            if v is None:
                v = (neutral,) * n
            elif isinstance(v, list):
                v = tuple(v)
            object.__setattr__(self, name, v)
        coerce_fused_activation(self)

    # -- enums ---------------------------------------------------------------------------
    @property
    def conv_mode(self) -> ConvolutionMode:
        return enum_of(ConvolutionMode, self.mode, self.field("mode"), "DML_CONVOLUTION_MODE_")

    @property
    def conv_direction(self) -> ConvolutionDirection:
        return enum_of(ConvolutionDirection, self.direction, self.field("direction"),
                       "DML_CONVOLUTION_DIRECTION_")

    @property
    def is_backward(self) -> bool:
        return self.conv_direction == ConvolutionDirection.BACKWARD

    # -- shapes --------------------------------------------------------------------------
    @property
    def spatial_count(self) -> int:
        return self.input_tensor.dimension_count - 2

    @property
    def input_channels(self) -> int:
        return self.input_tensor.sizes[1]

    @property
    def output_channels(self) -> int:
        f = self.filter_tensor.sizes
        return f[1] * self.group_count if self.is_backward else f[0]

    @property
    def kernel_sizes(self) -> tuple:
        return tuple(self.filter_tensor.sizes[2:])

    def convolution_sizes(self) -> tuple:
        """Spatial output sizes before ``output_padding`` (forward: the positions the
        window covers; backward: the transposed convolution after cropping)."""
        out = []
        for i, k, s, d, a, b in zip(self.input_tensor.sizes[2:], self.kernel_sizes,
                                    self.strides, self.dilations, self.start_padding,
                                    self.end_padding):
            if self.is_backward:
                out.append((i - 1) * s + d * (k - 1) + 1 - a - b)
            else:
                out.append((i + a + b - d * (k - 1) - 1) // s + 1)
        return tuple(out)

    def expected_output_sizes(self) -> tuple:
        sp = tuple(c + p for c, p in zip(self.convolution_sizes(), self.output_padding))
        return (self.input_tensor.sizes[0], self.output_channels) + sp

    # -- OperatorDesc --------------------------------------------------------------------
    def inputs(self):
        return [self.input_tensor, self.filter_tensor, self.bias_tensor]

    def outputs(self):
        return [self.output_tensor]

    def feature_level(self) -> FeatureLevel:
        level = self.FEATURE_LEVEL
        if self.input_tensor.dimension_count == 3:
            level = max(level, FeatureLevel.FL_4_0)     # 3D tensors: "4_0 and above"
        return fused_activation_level(self, level)

    def validate(self) -> None:
        names = ["input_tensor", "filter_tensor", "bias_tensor", "output_tensor"]
        for name in names:
            self.check_tensor(name, getattr(self, name), range(3, 6), _FLOATS,
                              optional=name == "bias_tensor")
        self.check_same_type(names)
        self.check_same_rank(names)
        check_no_overlap(self, "output_tensor", self.output_tensor)
        self.conv_mode  # noqa: B018  (raise for an unknown value)
        self.conv_direction  # noqa: B018
        n = self.spatial_count
        what = "DimensionCount: the spatial dimensions, InputTensor.DimensionCount - 2"
        for name in ("strides", "dilations", "start_padding", "end_padding", "output_padding"):
            if not isinstance(getattr(self, name), tuple):
                self.fail(name, f"must be a sequence of {n} UINTs, got {getattr(self, name)!r}")
        self.check_uints("strides", self.strides, n, 1, what)
        self.check_uints("dilations", self.dilations, n, 1, what)
        self.check_uints("start_padding", self.start_padding, n, 0, what)
        self.check_uints("end_padding", self.end_padding, n, 0, what)
        self.check_uints("output_padding", self.output_padding, n, 0, what)
        g = self.check_uint("group_count", 1)
        c_in = self.input_channels
        if c_in % g:
            self.fail("group_count", f"must divide InputChannelCount ({c_in}), got {g}")
        f = self.filter_tensor.sizes
        if self.is_backward:
            if f[0] != c_in:
                self.fail("filter_tensor.sizes[0]", "backward: FilterTensor is {InputChannel"
                          f"Count, OutputChannelCount / GroupCount, ...}}: must be {c_in}, "
                          f"got {f[0]}")
        else:
            if f[0] % g:
                self.fail("filter_tensor.sizes[0]", f"the output channel count ({f[0]}) must "
                          f"be divisible by group_count ({g})")
            if f[1] * g != c_in:
                self.fail("filter_tensor.sizes[1]", "forward: FilterTensor is {OutputChannel"
                          f"Count, InputChannelCount / GroupCount, ...}}: must be "
                          f"{c_in} / {g} = {c_in // g}, got {f[1]}")
        conv = self.convolution_sizes()
        for i, (c, op) in enumerate(zip(conv, self.output_padding)):
            if self.is_backward and c + op < 1:
                self.fail(f"end_padding[{i}]", "(in-1)*stride + dilation*(kernel-1) + 1 - start "
                          f"- end + output_padding must be at least 1, got {c + op}")
            if not self.is_backward and c < 1:
                self.fail(f"filter_tensor.sizes[{i + 2}]", "the padded input must hold the "
                          "dilated kernel: in + start + end >= dilation*(kernel-1) + 1; gives "
                          f"an output size of {c}")
        expect = self.expected_output_sizes()
        got = self.output_tensor.sizes
        formula = ("(in-1)*stride + dilation*(kernel-1) + 1 - start - end + output_padding"
                   if self.is_backward else
                   "(in + start + end - dilation*(kernel-1) - 1) // stride + 1 + output_padding")
        for i, (e, o) in enumerate(zip(expect, got)):
            if e != o:
                what = ("BatchCount (InputTensor.Sizes[0])" if i == 0 else
                        "OutputChannelCount" if i == 1 else formula)
                self.fail(f"output_tensor.sizes[{i}]", f"must be {what} = {e}, got {o}")
        if self.bias_tensor is not None:
            want = (1, self.output_channels) + (1,) * n
            if self.bias_tensor.sizes != want:
                self.fail("bias_tensor.sizes", f"must be {{1, OutputChannelCount, 1, ...}} = "
                          f"{want}, got {self.bias_tensor.sizes}")
        check_fused_activation(self, clip=True)

"""Convolution: ``DML_CONVOLUTION_OPERATOR_DESC`` and ``vkml.convolution``.

Every configuration goes through :class:`Geometry`, the descriptor reduced to three
spatial dimensions (1-D and 2-D convolutions get leading spatial dimensions of size 1)
with the element strides of each tensor.  A *path* turns a geometry into dispatches;
:func:`choose_path` takes the first path in :data:`PATHS` that accepts the geometry on
this device.  :class:`DirectPath` (``glsl/convolution_direct.comp``) accepts everything:
any layout, both directions and modes, groups, float32/float16 (packed float16 where the
device lacks 16-bit storage), bias and fused activation in the kernel; the faster paths
take the shapes they are made for and fall back to it otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import runtime
from ..dml.activations import activation as activation_desc
from ..dml.convolution import (ConvolutionDirection, ConvolutionMode, ConvolutionOperatorDesc,
                               filter_is_flipped)
from ..dml.data_type import DataType
from ..dml.operator import as_tuple, enum_of
from ..dml.tensor_desc import TensorDesc
from ..errors import UnsupportedError, ValidationError
from ..runtime import STORAGE, UNIFORM, Bind
from ..tensor import Tensor
from .base import CompiledOperator, implements
from .functional import as_array, pick_device, run

__all__ = ["convolution"]


# -- geometry -----------------------------------------------------------------------------
def _strides5(t: TensorDesc) -> tuple[int, ...]:
    """Element strides as (n, c, d, h, w); absent spatial dimensions get stride 0."""
    s = t.element_strides
    return tuple(s[:2]) + (0,) * (5 - len(s)) + tuple(s[2:])


def _pad3(values, fill) -> tuple[int, ...]:
    return (fill,) * (3 - len(values)) + tuple(values)


@dataclass(frozen=True)
class Geometry:
    """A convolution descriptor as three spatial dimensions (d, h, w)."""

    n: int
    c_in: int
    c_out: int
    groups: int
    in_size: tuple          # D, H, W
    out_size: tuple         # D, H, W (with output_padding)
    valid: tuple            # forward: output positions the convolution covers
    kernel: tuple           # KD, KH, KW
    stride: tuple
    dilation: tuple
    start: tuple
    backward: bool
    flip: bool
    dtype: DataType
    x_strides: tuple        # (n, c, d, h, w) element strides
    w_strides: tuple
    y_strides: tuple
    b_stride: int | None    # bias channel stride, None without bias
    packed: bool            # input, filter and output packed (NCDHW) tensors

    @classmethod
    def of(cls, d: ConvolutionOperatorDesc) -> "Geometry":
        spatial = d.spatial_count
        tensors = [d.input_tensor, d.filter_tensor, d.output_tensor]
        return cls(
            n=d.input_tensor.sizes[0], c_in=d.input_channels, c_out=d.output_channels,
            groups=d.group_count,
            in_size=_pad3(d.input_tensor.sizes[2:], 1),
            out_size=_pad3(d.output_tensor.sizes[2:], 1),
            valid=_pad3(d.convolution_sizes(), 1),
            kernel=_pad3(d.kernel_sizes, 1), stride=_pad3(d.strides, 1),
            dilation=_pad3(d.dilations, 1), start=_pad3(d.start_padding, 0),
            backward=d.is_backward, flip=filter_is_flipped(d.conv_mode) and spatial > 0,
            dtype=d.input_tensor.data_type,
            x_strides=_strides5(d.input_tensor), w_strides=_strides5(d.filter_tensor),
            y_strides=_strides5(d.output_tensor),
            b_stride=(d.bias_tensor.element_strides[1] if d.bias_tensor is not None else None),
            packed=all(t.is_packed for t in tensors))

    @property
    def cin_per_group(self) -> int:
        return self.c_in // self.groups

    @property
    def cout_per_group(self) -> int:
        return self.c_out // self.groups

    @property
    def flops(self) -> int:
        """2 x the multiply-adds of the direct convolution (what GFLOP/s are quoted in):
        forward, every covered output element sums C_in/groups x prod(kernel) products;
        backward, every input element contributes to C_out/groups x prod(kernel)."""
        k = math.prod(self.kernel)
        if self.backward:
            return 2 * self.n * self.c_in * math.prod(self.in_size) * self.cout_per_group * k
        return 2 * self.n * self.c_out * math.prod(self.valid) * self.cin_per_group * k


# -- paths ----------------------------------------------------------------------------------
def storage_suffix(op: CompiledOperator, dtype: DataType) -> str:
    """Kernel variant suffix for the tensors' storage (see vkml_float.glsl)."""
    if dtype == DataType.FLOAT32:
        return "f32"
    return "f16" if op.features.get("storage16") else "f16_packed"


def _span(sizes, strides) -> int:
    """Elements from the first to one past the last element of a strided tensor."""
    return sum((s - 1) * st for s, st in zip(sizes, strides)) + 1


class Path:
    """A way to run a geometry: ``accepts`` (class method), ``build``, ``encode``."""

    name = ""

    def __init__(self, op: CompiledOperator, geo: Geometry):
        self.op, self.geo, self.ctx = op, geo, op.ctx
        self.act = op.desc.fused_activation
        self.act_id = self.act.SPEC.kernel_id if self.act is not None else 0
        self.act_params = (self.act.kernel_parameters() if self.act is not None
                           else np.zeros(4, np.float32))

    @classmethod
    def accepts(cls, op: CompiledOperator, geo: Geometry) -> bool:
        raise NotImplementedError

    def encode(self, seq, x, w, b, y) -> None:
        raise NotImplementedError


class DirectPath(Path):
    """``glsl/convolution_direct.comp``: one invocation per output element, any geometry.

    Tensors larger than ``maxStorageBufferRange`` are bound a window of batch items at a
    time (the kernel subtracts the window's first element index)."""

    name = "direct"
    PUSH = 24

    @classmethod
    def accepts(cls, op, geo) -> bool:
        return True

    def __init__(self, op, geo):
        super().__init__(op, geo)
        g = geo
        ow = g.out_size[2]
        self.local = min(64, max(8, 1 << (max(ow, 1) - 1).bit_length()), op.workgroup_size)
        name = "convolution_direct_" + storage_suffix(op, g.dtype)
        self.pipe = op.pipeline(name, (STORAGE,) * 4 + (UNIFORM,), self.PUSH,
                                {0: self.local, 1: self.act_id, 2: int(g.backward)})
        p = np.zeros(44, np.int64)          # 11 std140 ivec4s, then the activation vec4
        p[0:4] = [*g.in_size, g.cin_per_group]
        p[4:8] = [*g.out_size, g.c_out]
        p[8:12] = [*g.kernel, g.cout_per_group]
        p[12:16] = [*g.stride, int(g.flip)]
        p[16:20] = [*g.dilation, int(g.b_stride is not None)]
        p[20:23] = g.start
        p[24:27] = g.valid if not g.backward else g.out_size
        p[28:32] = g.x_strides[:4]
        p[32:36] = g.y_strides[:4]
        p[36:40] = g.w_strides[:4]
        p[40:44] = [g.x_strides[4], g.y_strides[4], g.w_strides[4], g.b_stride or 0]
        words = p.astype(np.uint32)
        params = np.concatenate([words.view(np.uint8), self.act_params.view(np.uint8)])
        self.params = op.upload(params)
        self.esize = g.dtype.size
        self.windows = self._batch_windows()

    def _batch_windows(self):
        """[(n0, n1, x_lo, x_hi, y_lo, y_hi)] byte windows per batch range that fit the
        device's maxStorageBufferRange."""
        g, e = self.geo, self.esize
        limit = self.ctx.limits["maxStorageBufferRange"] - 2 * self.ctx.binding_alignment()
        x_item = _span((g.c_in, *g.in_size), g.x_strides[1:])
        y_item = _span((g.c_out, *g.out_size), g.y_strides[1:])
        if max(x_item, y_item) * e > limit:
            raise UnsupportedError("maxStorageBufferRange", "one batch item of this "
                                   "convolution is larger than the device can bind")
        out, n0 = [], 0
        while n0 < g.n:
            n1 = n0 + 1
            while n1 < g.n and ((n1 - n0) * g.x_strides[0] + x_item) * e <= limit and \
                    ((n1 - n0) * g.y_strides[0] + y_item) * e <= limit:
                n1 += 1
            out.append((n0, n1, n0 * g.x_strides[0] * e,
                        ((n1 - 1) * g.x_strides[0] + x_item) * e,
                        n0 * g.y_strides[0] * e, ((n1 - 1) * g.y_strides[0] + y_item) * e))
            n0 = n1
        return out

    def encode(self, seq, x, w, b, y) -> None:
        g = self.geo
        align = self.ctx.binding_alignment()
        mx, my, mz = self.ctx.limits["maxComputeWorkGroupCount"]
        w_bind = Bind(w, 0, self.op.whole(w, "filter"))
        b_bind = Bind(b, 0, self.op.whole(b, "bias")) if b is not None else w_bind
        od_co = g.out_size[0] * g.c_out
        gx_all = -(-g.out_size[2] // self.local)
        for n0, n1, xlo, xhi, ylo, yhi in self.windows:
            xo = xlo - xlo % align
            yo = ylo - ylo % align
            xb = Bind(x, xo, min(-(-(xhi - xo) // 4) * 4, x.size - xo))
            yb = Bind(y, yo, min(-(-(yhi - yo) // 4) * 4, y.size - yo), "w")
            binds = [xb, w_bind, b_bind, yb, Bind(self.params)]
            z_lo, z_hi = n0 * od_co, n1 * od_co
            for x0 in range(0, gx_all, mx):
                for y0 in range(0, g.out_size[1], my):
                    for z0 in range(z_lo, z_hi, mz):
                        push = np.array([x0 * self.local, y0, z0, 0, xo // self.esize,
                                         yo // self.esize], np.uint32)
                        seq.dispatch(self.pipe, binds, (min(mx, gx_all - x0),
                                                        min(my, g.out_size[1] - y0),
                                                        min(mz, z_hi - z0)), push.tobytes())


#: Paths in order of preference; the first that accepts a geometry runs it.
PATHS: list[type[Path]] = [DirectPath]


def choose_path(op: CompiledOperator, geo: Geometry) -> Path:
    for cls in PATHS:
        if cls.accepts(op, geo):
            return cls(op, geo)
    raise AssertionError("DirectPath accepts every geometry")


@implements(ConvolutionOperatorDesc)
class CompiledConvolution(CompiledOperator):
    """Chooses a path for the descriptor on this device (see the module doc)."""

    def build(self) -> None:
        self.geometry = Geometry.of(self.desc)
        self.path = choose_path(self, self.geometry)

    def whole(self, alloc, what: str) -> int:
        """Bytes to bind of a tensor bound whole (refused beyond maxStorageBufferRange)."""
        limit = self.ctx.limits["maxStorageBufferRange"]
        if alloc.size > limit:
            need = {"filter": self.desc.filter_tensor, "bias": self.desc.bias_tensor}[what]
            if need.total_tensor_size_in_bytes > limit:
                raise UnsupportedError("maxStorageBufferRange", f"the {what} tensor is larger "
                                       "than the device can bind")
            return need.total_tensor_size_in_bytes
        return alloc.size

    def encode(self, seq, inputs, outputs) -> None:
        x, w, b = inputs
        self.path.encode(seq, x._alloc, w._alloc, b._alloc if b is not None else None,
                         outputs[0]._alloc)


# -- functional form ----------------------------------------------------------------------
def _desc_of(x, name: str) -> TensorDesc:
    try:
        return TensorDesc(np.dtype(x.dtype), tuple(x.shape))
    except ValidationError as exc:
        raise ValidationError(name, exc.rule) from None


def convolution(x, filter, bias=None, *, strides=None, dilations=None, start_padding=None,  # noqa: A002
                end_padding=None, output_padding=None, group_count=1,
                mode="cross_correlation", direction="forward", fused_activation=None,
                device=None):
    """``DML_CONVOLUTION_OPERATOR_DESC``: convolve ``x`` (N, C_in, *spatial; 1 to 3
    spatial dimensions) with ``filter``.

    ``direction="forward"``: filter (C_out, C_in/group_count, *kernel).
    ``direction="backward"`` (transposed convolution, ONNX ConvTranspose): filter
    (C_in, C_out/group_count, *kernel); output size per dimension
    ``(in-1)*stride + dilation*(k-1) + 1 - start - end + output_padding``.
    ``mode="convolution"`` flips the kernel along every spatial axis.  ``bias``: (C_out,)
    or (1, C_out, 1, ...).  ``fused_activation``: None, a name ("relu", "leaky_relu", ...)
    or a ``vkml.dml`` activation descriptor with its parameters; it is applied inside the
    convolution kernel.  Per-dimension arguments: a sequence, an int for every dimension,
    or None for the neutral value.
    """
    dev = pick_device(device, x, filter, bias)
    x = as_array(x, "x")
    filter = as_array(filter, "filter")  # noqa: A001
    bias = as_array(bias, "bias")
    xd = _desc_of(x, "x")
    fd = _desc_of(filter, "filter")
    n = max(xd.dimension_count - 2, 0)
    args = {name: as_tuple(v, neutral, n) for name, v, neutral in (
        ("strides", strides, 1), ("dilations", dilations, 1), ("start_padding", start_padding, 0),
        ("end_padding", end_padding, 0), ("output_padding", output_padding, 0))}
    mode_e = enum_of(ConvolutionMode, mode, "mode", "DML_CONVOLUTION_MODE_")
    dir_e = enum_of(ConvolutionDirection, direction, "direction", "DML_CONVOLUTION_DIRECTION_")
    bd = None
    if bias is not None:
        shape = tuple(bias.shape)
        if len(shape) == 1:
            shape = (1, shape[0]) + (1,) * n
        try:
            bd = TensorDesc(np.dtype(bias.dtype), shape)
        except ValidationError as exc:
            raise ValidationError("bias", exc.rule) from None
    act = activation_desc(fused_activation)
    # Output sizes by the page's formula; where the arguments are inconsistent a
    # placeholder is used and create_operator's validation names the broken rule.
    out_shape = tuple(x.shape)
    if fd.dimension_count == xd.dimension_count >= 3 and all(len(v) == n for v in args.values()):
        probe = ConvolutionOperatorDesc(xd, fd, None, xd, mode_e, dir_e, group_count=max(
            int(group_count), 1), fused_activation=None, **args)
        try:
            out_shape = tuple(max(1, s) for s in probe.expected_output_sizes())
        except (ZeroDivisionError, TypeError):
            pass
    yd = TensorDesc(xd.data_type, out_shape)
    desc = ConvolutionOperatorDesc(xd, fd, bd, yd, mode_e, dir_e, group_count=group_count,
                                   fused_activation=act, **args)
    return run(dev, desc, [x, filter, bias])

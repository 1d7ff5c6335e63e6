"""Convolution: ``DML_CONVOLUTION_OPERATOR_DESC`` and ``vkml.convolution``.

Every configuration goes through :class:`Geometry`, the descriptor reduced to three
spatial dimensions (1-D and 2-D convolutions get leading spatial dimensions of size 1)
with the element strides of each tensor.  A *path* turns a geometry into dispatches.
Which paths can run a geometry is decided by the device's features and limits
(texel-buffer sizes, subgroup shuffles and full subgroups, 16-bit storage); which of them
runs is decided by the tuner (:mod:`vkml.tuning`, tunable path ``convolution``: candidates
are paths with their knobs, timed on the device per shape class).  With ``VKML_TUNE=off``
it is the first path in :data:`PATHS` that accepts and prefers the geometry, with the
knobs measured on lavapipe (``DEFAULT_KNOBS``); never a device type, vendor or name:

=============  ==========================================================================
winograd       3x3, stride 1, one group, >= 16 channels, >= 32 output tiles: F(4x4, 3x3)
               transforms around 36 GEMMs (``convolution_winograd.comp``); where gemm_sg
               can run the shape only from 64 channels and 49 tiles up (``prefers``).
depthwise      group count = input channels (any multiplier, stride, dilation): R rows x
               NB pixels per invocation, input read in place (``convolution_depthwise``).
gemm_sg        devices with subgroup shuffles and full subgroups of a required size
               (``computeFullSubgroups``): the implicit GEMM below, but the filter
               is read in place through its DML strides and shared across a subgroup by
               shuffles -- no re-laid filter per execution (SGW variants).
gemm           dense forward convolutions (>= 4 output channels per group) and transposed
               ones, one dispatch per stride phase (no inserted zeros): an implicit GEMM
               on zero-padded float32 planes (``convolution_gemm.comp`` after
               ``convolution_relayout.comp``); 1x1 convolutions read the input in place.
direct         everything else: any layout, both directions and modes, groups
               (``convolution_direct.comp``, one output per invocation).
=============  ==========================================================================

Every path takes float32 and float16 (packed float16 where the device lacks 16-bit
storage), accumulates in float32, adds the bias and applies the fused activation in the
kernel that stores the output.  gemm and winograd re-lay (transform) the filter per
execution, since DML binds it at execution; gemm_sg, depthwise and direct read it where
it is.

Owned filters: a filter tensor flagged ``DML_TENSOR_FLAG_OWNED_BY_DML`` is bound once, by
:meth:`CompiledConvolution.initialize` (``IDMLOperatorInitializer``; a graph's
``initialize`` hands its constants to each node), and binding it at execution is a
ValidationError, as the flag's page says ("DirectML makes a copy of the tensor data during
initialization ... This allows DirectML to perform reformatting of the tensor data into
other, more efficient forms").  gemm and winograd run the filter re-layout / transform
then, into the buffer the operator owns, and their executions skip those dispatches; the
other paths (and any other owned input) get a copy.

Why the kernels look as they do (operands through texel buffers, unrolled register
blocks indexed by constants, few loop-carried sums, vec4 storage stores, index math per
workgroup): lavapipe's costs, in docs/DEVELOPING.md ("Facts about lavapipe"); the
measurements behind the paths' choices are in bench/RESULTS.md ("Kernel design").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import runtime, tuning
from ..dml.activations import activation as activation_desc
from ..dml.convolution import (ConvolutionDirection, ConvolutionMode, ConvolutionOperatorDesc,
                               filter_is_flipped)
from ..dml.data_type import DataType
from ..dml.operator import as_tuple, as_uint, enum_of
from ..dml.tensor_desc import TensorDesc, TensorFlags, packed_strides
from ..errors import UnsupportedError, ValidationError
from ..runtime import Bind
from ..tensor import Tensor
from .base import CompiledOperator, implements
from .grid import binding_window, box_grid, pieces, plan_windows, split_groups, strided_span
from .functional import as_array, pick_device, run
from .owned import device_copy, initializer_inputs, owned_slots, refuse_owned_at_execution

__all__ = ["convolution"]

#: Kernel variants this module requests (see :func:`variant`) and the specialization
#: constants it sets.
_STORAGES = ("f32", "f16", "f16_packed")
_GEMM = ("LOCAL_SIZE_X", "MB", "NB", "SW", "ACT", "XVEC4", "KW", "DW", "CU", "YV4")
_DEPTHWISE = ("LOCAL_SIZE_X", "NB", "SW", "KW", "DW", "ACT", "KH", "KD", "X4", "SHIFT", "R",
              "SH", "DH")
_TILED = ("LOCAL_SIZE_X", "TM", "TN", "TK", "RM", "RN", "ACT")
VARIANTS = {
    **{f"convolution_direct_{s}": ("LOCAL_SIZE_X", "ACT", "BACKWARD") for s in _STORAGES},
    **{f"convolution_relayout_{s}": ("LOCAL_SIZE_X", "V4") for s in _STORAGES + ("texel",)},
    "convolution_filter_texel": ("LOCAL_SIZE_X", "KD", "KH", "KW", "FLIP"),
    **{f"convolution_gemm_{s}{r}": _GEMM for s in _STORAGES for r in ("", "_ssbo")},
    **{f"convolution_gemm_sg_{s}": _GEMM + ("SG", "CBW") for s in _STORAGES},
    **{f"convolution_winograd_{k}_{s}": ("LOCAL_SIZE_X", "ACT")
       for k in ("weights", "input") for s in _STORAGES + ("texel",)},
    **{f"convolution_winograd_output_{s}{r}": ("LOCAL_SIZE_X", "ACT")
       for s in _STORAGES for r in ("", "_ssbo")},
    "convolution_winograd_output_f32_v4": ("LOCAL_SIZE_X", "ACT"),
    **{f"convolution_blocked_{s}": ("LOCAL_SIZE_X", "RM", "RN", "ACT")
       for s in _STORAGES + ("gemm",)},
    **{f"convolution_tiled_{s}": _TILED for s in _STORAGES + ("f16_arith",)},
    **{f"convolution_depthwise_{s}{r}": _DEPTHWISE for s in _STORAGES for r in ("", "_ssbo")},
    "convolution_depthwise_f32_v4": _DEPTHWISE,
}


def variant(kernel: str, storage: str, texel: bool = True, v4: bool = False) -> str:
    """``convolution_<kernel>_<storage>``, + ``_ssbo`` where the inputs are not read
    through texel views, or ``_v4`` where float32 outputs are stored four at a time."""
    return f"convolution_{kernel}_{storage}" + ("_ssbo" if not texel else "_v4" if v4 else "")


# -- geometry -----------------------------------------------------------------------------
def _strides5(t: TensorDesc) -> tuple[int, ...]:
    """Element strides as (n, c, d, h, w); absent spatial dimensions get stride 0."""
    s = t.element_strides
    return tuple(s[:2]) + (0,) * (5 - len(s)) + tuple(s[2:])


def _pad3(values, fill) -> tuple[int, ...]:
    return (fill,) * (3 - len(values)) + tuple(values)


#: Index arithmetic in the kernels is 32-bit (SwiftShader has no int64).  A geometry
#: whose positions all stay below SMALL is run as given; any other is reduced per axis
#: (see :func:`_axis_forward`, :func:`_axis_backward`) to the outputs, taps and input
#: positions that meet, which only the direct path runs.
SMALL = 1 << 30
INT_MAX = (1 << 31) - 1


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def _tap_ranges(k_n: int, s: int, d: int, a: int, count: int, span: int):
    """``(k, lo, hi)`` for each tap ``k`` whose indices ``j`` in ``[lo, hi]`` (within
    ``[0, count)``) put ``j*s + k*d - a`` inside ``[0, span)``: outputs meeting the input
    (forward) or inputs landing in the output (backward)."""
    for k in range(k_n):
        lo = max(0, _ceil_div(a - k * d, s))
        hi = min(count - 1, (a - k * d + span - 1) // s)
        if lo <= hi:
            yield k, lo, hi


def _axis_forward(i_n: int, k_n: int, s: int, d: int, a: int, v: int):
    """One forward axis ``y[o] = sum_k x[o*s + k*d - a] w[k]`` for ``o < v`` (Python ints,
    exact) reduced to the outputs and taps that reach the input.

    Tap ``k`` reads the input at ``o`` in ``[ceil((a - k d)/s), floor((a - k d + I - 1)/s)]``
    (clipped to ``[0, v)``).  Outputs outside the union ``[vlo, vhi)`` of those ranges
    and taps whose range is empty contribute nothing, so with ``o' = o - vlo`` and
    ``k' = k - k0`` the same sum is ``x[o' s + k' d - a']`` with
    ``a' = a - vlo s - k0 d`` over the ``K' = k1 - k0 + 1`` taps that meet (exactly the
    same input positions and taps for every output).  One output left: ``o' = 0``, so any
    stride gives the same sum (s' = 1); one tap: likewise d' = 1.  Returns
    ``(I, K', s', d', a', vlo, vhi, k0)`` or None where no output meets the input."""
    lo_o = hi_o = k0 = k1 = None
    for k, lo, hi in _tap_ranges(k_n, s, d, a, v, i_n):
        lo_o = lo if lo_o is None else min(lo_o, lo)
        hi_o = hi if hi_o is None else max(hi_o, hi)
        k0 = k if k0 is None else k0
        k1 = k
    if lo_o is None:
        return None
    kk = k1 - k0 + 1
    s2 = 1 if hi_o == lo_o else s
    d2 = 1 if kk == 1 else d
    a2 = a - lo_o * s - k0 * d
    return (i_n, kk, s2, d2, a2, lo_o, hi_o + 1, k0)


def _axis_backward(i_n: int, k_n: int, s: int, d: int, a: int, o_n: int):
    """One backward axis ``y[i*s + k*d - a] += x[i] w[k]`` for outputs ``[0, o_n)``
    reduced to the inputs, taps and outputs that meet.

    Tap ``k`` lands inside the output from inputs ``i`` in
    ``[ceil((a - k d)/s), floor((a - k d + O - 1)/s)]`` (clipped to ``[0, I)``), on outputs
    ``i s + k d - a``.  With ``i' = i - i0``, ``k' = k - k0``, ``o' = o - vlo`` the same
    scatter is ``o' = i' s + k' d - a'``, ``a' = a + vlo - i0 s - k0 d``: the same pairs
    land on the same outputs, the trimmed inputs and taps land nowhere.  One input left:
    ``i' = 0``, any stride divides 0 (s' = 1); one tap: d' = 1.  Returns
    ``(I', K', s', d', a', vlo, vhi, k0, i0)`` or None where nothing lands inside."""
    i0 = i1 = k0 = k1 = vlo = vhi = None
    for k, lo, hi in _tap_ranges(k_n, s, d, a, i_n, o_n):
        i0 = lo if i0 is None else min(i0, lo)
        i1 = hi if i1 is None else max(i1, hi)
        k0 = k if k0 is None else k0
        k1 = k
        p_lo, p_hi = lo * s + k * d - a, hi * s + k * d - a
        vlo = p_lo if vlo is None else min(vlo, p_lo)
        vhi = p_hi + 1 if vhi is None else max(vhi, p_hi + 1)
    if i0 is None:
        return None
    ii, kk = i1 - i0 + 1, k1 - k0 + 1
    s2 = 1 if ii == 1 else s
    d2 = 1 if kk == 1 else d
    a2 = a + vlo - i0 * s - k0 * d
    return (ii, kk, s2, d2, a2, vlo, vhi, k0, i0)


def _reduce(d: ConvolutionOperatorDesc, geo: "Geometry") -> "Geometry":
    """The geometry with every axis reduced (see _axis_forward/_backward) and checked to
    fit the kernels' 32-bit arithmetic; ValidationError naming the field where it does
    not (the positions an output and a tap meet would be 2^31 or more apart)."""
    n_sp = d.spatial_count
    first = 3 - n_sp
    fields = dict(in_size=list(geo.in_size), kernel=list(geo.kernel), stride=list(geo.stride),
                  dilation=list(geo.dilation), start=list(geo.start))
    vlo, vhi = [0, 0, 0], list(geo.out_size if geo.backward else geo.valid)
    x_off = w_off = 0
    for ax in range(3):
        if ax < first:
            continue
        field = ax - first
        i_n, k_n, s, dl, a = (geo.in_size[ax], geo.kernel[ax], geo.stride[ax],
                              geo.dilation[ax], geo.start[ax])
        if geo.backward:
            r = _axis_backward(i_n, k_n, s, dl, a, geo.out_size[ax])
        else:
            r = _axis_forward(i_n, k_n, s, dl, a, geo.valid[ax])
        if r is None:                   # no output meets the input: bias only everywhere
            return _replace(geo, in_size=(1, 1, 1), kernel=(1, 1, 1), stride=(1, 1, 1),
                            dilation=(1, 1, 1), start=(0, 0, 0), vrange=((0,) * 3, (0,) * 3),
                            x_off=0, w_off=0, plain=False)
        i2, k2, s2, d2, a2, lo, hi, k0 = r[:8]
        i0 = r[8] if geo.backward else 0
        # the kernel's values for the outputs [lo, hi) and taps [0, K'):
        # forward o' s + k' d - a', backward o' + a' - k' d (= i' s where they meet)
        if geo.backward:
            low, high = a2 - (k2 - 1) * d2, (hi - lo - 1) + a2
        else:
            low, high = -a2, (hi - lo - 1) * s2 + (k2 - 1) * d2 - a2
        if low < -INT_MAX or high > INT_MAX or max(s2, d2, abs(a2), hi) > INT_MAX:
            name = "dilations" if k2 > 1 and (k2 - 1) * d2 > (hi - lo) * s2 else "strides"
            d.fail(f"{name}[{field}]", "vkml indexes with 32-bit arithmetic: the input "
                   "positions that the outputs and filter taps which meet reach must lie "
                   f"within 2^31 - 1 of each other; this one spans [{low}, {high}]")
        fields["in_size"][ax], fields["kernel"][ax] = i2, k2
        fields["stride"][ax], fields["dilation"][ax], fields["start"][ax] = s2, d2, a2
        vlo[ax], vhi[ax] = lo, hi
        x_off += i0 * geo.x_strides[2 + ax]
        w_off += ((k_n - k2 - k0) if geo.flip else k0) * geo.w_strides[2 + ax]
    return _replace(geo, **{k: tuple(v) for k, v in fields.items()},
                    vrange=(tuple(vlo), tuple(vhi)), x_off=x_off, w_off=w_off, plain=False)


def _replace(geo, **kw):
    import dataclasses
    return dataclasses.replace(geo, **kw)


def _is_small(geo: "Geometry") -> bool:
    """Whether every position the kernels compute stays below SMALL as given (forward:
    o*s + k*d - a lies in [-start, in + start + end); backward: o + start - k*d in
    [-(K-1) d, (in-1) s + (K-1) d]), so no reduction is needed."""
    for ax in range(3):
        i_n, k_n, s, dl, a, o_n = (geo.in_size[ax], geo.kernel[ax], geo.stride[ax],
                                   geo.dilation[ax], geo.start[ax], geo.out_size[ax])
        reach = (k_n - 1) * dl
        span = (i_n + a + geo.valid[ax] * s + reach) if not geo.backward else \
            ((i_n - 1) * s + reach + a + o_n)
        if max(span, s, dl, o_n) >= SMALL:
            return False
    return True


@dataclass(frozen=True)
class Geometry:
    """A convolution descriptor as three spatial dimensions (d, h, w).

    ``plain``: the descriptor's own values (every path may take it); else the reduced
    geometry of :func:`_reduce` (the direct path only): outputs outside
    ``vrange = (vlo, vhi)`` have no contribution, the input is read from element
    ``x_off`` and the filter from ``w_off`` (taps trimmed to the ones that meet)."""

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
    vrange: tuple | None = None
    x_off: int = 0
    w_off: int = 0
    plain: bool = True

    @classmethod
    def of(cls, d: ConvolutionOperatorDesc) -> "Geometry":
        spatial = d.spatial_count
        tensors = [d.input_tensor, d.filter_tensor, d.output_tensor]
        geo = cls(
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
        for i, o in enumerate(d.output_tensor.sizes[2:]):
            if o > INT_MAX:
                d.fail(f"output_tensor.sizes[{i + 2}]", "vkml indexes with 32-bit "
                       f"arithmetic: an output dimension must be below 2^31, got {o}")
        if _is_small(geo):
            return _replace(geo, vrange=((0, 0, 0), geo.out_size if geo.backward
                                         else geo.valid))
        return _reduce(d, geo)

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


def _words(values) -> np.ndarray:
    """32-bit parameter words, refusing (instead of wrapping) any value that fits
    neither int32 nor uint32 (the geometry keeps them in range; a bug otherwise)."""
    v = np.asarray(values, dtype=object)
    if any(not -(1 << 31) <= int(e) < (1 << 32) for e in v.ravel()):
        raise AssertionError(f"convolution parameter out of 32-bit range: {list(v)}")
    return np.array([int(e) & 0xFFFFFFFF for e in v.ravel()], np.uint32)


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
        """Whether this path can run the geometry on this device (tests force any
        path that accepts)."""
        raise NotImplementedError

    @classmethod
    def prefers(cls, op: CompiledOperator, geo: Geometry) -> bool:
        """Whether :func:`choose_path` takes it for the geometry when it accepts it."""
        return True

    #: Set once an OWNED_BY_DML filter was transformed at initialization: ``encode``
    #: then skips :meth:`encode_filter` (``w`` is not read).
    filter_ready = False

    def filter_buffer(self):
        """The buffer :meth:`encode_filter` writes (the re-laid or transformed filter), or
        None where the path reads the filter in place."""
        return None

    def encode_filter(self, seq, w) -> None:
        """The dispatches that re-lay (transform) the filter ``w`` into
        :meth:`filter_buffer`: per execution, or once at initialization."""

    def encode(self, seq, x, w, b, y) -> None:
        raise NotImplementedError


class DirectPath(Path):
    """``glsl/convolution_direct.comp``: one invocation per output element, any geometry.

    Tensors larger than ``maxStorageBufferRange`` are bound a window of batch items at a
    time (the kernel subtracts the window's first element index)."""

    name = "direct"

    @classmethod
    def accepts(cls, op, geo) -> bool:
        return True

    def __init__(self, op, geo):
        super().__init__(op, geo)
        g = geo
        ow = g.out_size[2]
        self.local = min(64, max(8, 1 << (max(ow, 1) - 1).bit_length()), op.workgroup_size)
        self.pipe = op.pipeline(variant("direct", storage_suffix(op, g.dtype)), {
            "LOCAL_SIZE_X": self.local, "ACT": self.act_id, "BACKWARD": int(g.backward)})
        p = np.zeros(44, np.int64)          # 11 std140 ivec4s, then the activation vec4
        p[0:4] = [*g.in_size, g.cin_per_group]
        p[4:8] = [*g.out_size, g.c_out]
        p[8:12] = [*g.kernel, g.cout_per_group]
        p[12:16] = [*g.stride, int(g.flip)]
        p[16:20] = [*g.dilation, int(g.b_stride is not None)]
        p[20:23] = g.start
        p[24:27] = g.vrange[1]
        p[28:32] = g.x_strides[:4]
        p[32:36] = g.y_strides[:4]
        p[36:40] = g.w_strides[:4]
        p[40:44] = [g.x_strides[4], g.y_strides[4], g.w_strides[4], g.b_stride or 0]
        tail = np.zeros(8, np.int64)
        tail[0:3] = g.vrange[0]
        tail[4:6] = [g.w_off, g.x_off]
        params = np.concatenate([_words(p).view(np.uint8), self.act_params.view(np.uint8),
                                 _words(tail).view(np.uint8)])
        self.params = op.upload(params)
        self.esize = g.dtype.size
        self.windows = self._batch_windows()

    def _batch_windows(self):
        """[(n0, n1, x_lo, x_hi, y_lo, y_hi)] byte windows per batch range that fit the
        device's maxStorageBufferRange."""
        g, e = self.geo, self.esize
        limit = self.ctx.limits["maxStorageBufferRange"] - 2 * self.ctx.binding_alignment()
        # (the descriptor's input: a reduced geometry reads a part of it from x_off)
        x_item = (g.c_in, *_pad3(self.op.desc.input_tensor.sizes[2:], 1))
        y_item = (g.c_out, *g.out_size)

        def x_span(origin, extent):
            return strided_span((origin[0], 0, 0, 0, 0), (extent[0], *x_item), g.x_strides)

        def y_span(origin, extent):
            return strided_span((origin[0], 0, 0, 0, 0), (extent[0], *y_item), g.y_strides)

        if max(x_span((0,), (1,))[1], y_span((0,), (1,))[1]) * e > limit:
            raise UnsupportedError("maxStorageBufferRange", "one batch item of this "
                                   "convolution is larger than the device can bind")
        return [(o[0], o[0] + n[0], xlo * e, xhi * e, ylo * e, yhi * e)
                for o, n, xlo, xhi, ylo, yhi in plan_windows([g.n], x_span, y_span, e, e, limit)]

    def encode(self, seq, x, w, b, y) -> None:
        g = self.geo
        align = self.ctx.binding_alignment()
        max_groups = self.ctx.limits["maxComputeWorkGroupCount"]
        w_bind = Bind(w, 0, self.op.whole(w, "filter"))
        b_bind = Bind(b, 0, self.op.whole(b, "bias")) if b is not None else w_bind
        od_co = g.out_size[0] * g.c_out
        for n0, n1, xlo, xhi, ylo, yhi in self.windows:
            xo, xsize = binding_window(xlo, xhi, x.size, align)
            yo, ysize = binding_window(ylo, yhi, y.size, align)
            binds = [Bind(x, xo, xsize), w_bind, b_bind, Bind(y, yo, ysize, "w"),
                     Bind(self.params)]
            # the grid: x along output columns, y rows, z (image, depth, channel)
            box = ([n0 * od_co, 0, 0], [(n1 - n0) * od_co, *g.out_size[1:]])
            for o, e in split_groups(*box, self.local, max_groups, magic=False):
                push = np.array([o[2], o[1], o[0], 0, xo // self.esize, yo // self.esize],
                                np.uint32)
                seq.dispatch(self.pipe, binds, box_grid(e, self.local), push.tobytes())


# -- the re-layout pass and the implicit GEMM ----------------------------------------------
RELAYOUT_PARAM_WORDS = 44      # std140: 11 ivec4 (glsl/convolution_relayout.comp)
#: Workgroups a relayout aims at: the default (lavapipe pays microseconds per workgroup:
#: a few dozen) and the tuner's alternative (a few hundred, for wide devices).
RELAYOUT_GROUPS = (32, 256)


class Relayout:
    """One ``convolution_relayout`` pass: an 8-D float32 box ``dst[c . dstride]`` filled
    from a strided source (``src[base + c . stride]`` where ``lo_k <= c_k < hi_k``, else 0).
    ``dst_image``: the destination stride of the outermost given dimension (default dense).
    """

    DIMS = 8

    def __init__(self, op: CompiledOperator, dtype: DataType, size, stride, lo, hi, base: int,
                 src_bytes: int, dst_image: int | None = None):
        first = self.DIMS - len(size)
        pad = [0] * first
        size, stride, hi = ([1] * first + list(v) for v in (size, stride, hi))
        lo = pad + list(lo)
        dstride = list(packed_strides(size))
        if dst_image is not None:
            dstride[first] = dst_image
        # Lanes run over dimensions 6 and 7, a workgroup walks rows of dimension 5, the
        # others are one per workgroup z.  Planes larger than a workgroup with rows that
        # fill half of one have their rows (6) walked instead (lanes along 7 only, a
        # size-1 dimension takes 6's place), and
        # the largest outer dimension becomes the walked one: fewer, longer workgroups
        # (lavapipe pays microseconds for each).
        v4 = size[-1] % 4 == 0 and all(d % 4 == 0 for d in dstride[:-1]) and dstride[-1] == 1
        lists = (size, stride, lo, hi, dstride)
        self.local = min(64, op.workgroup_size)
        ones = [i for i in range(6) if size[i] == 1]
        lanes_row = self.local * (4 if v4 else 1)
        if size[6] * size[7] > lanes_row and 2 * size[7] >= lanes_row and ones:
            for v in lists:
                v[ones[0]], v[6] = v[6], v[ones[0]]
        k = max(range(6), key=lambda i: (size[i], i))
        for v in lists:
            v[k], v[5] = v[5], v[k]
        self.op, self.size = op, size
        self.src_bytes = src_bytes
        self.texel = _texel_ok(op, src_bytes // dtype.size)
        self.fmt = (runtime.FORMAT_R32_SFLOAT if dtype == DataType.FLOAT32 else
                    runtime.FORMAT_R16_SFLOAT) if self.texel else 0
        name = "convolution_relayout_" + ("texel" if self.texel else storage_suffix(op, dtype))
        self.pipe = op.pipeline(name, {"LOCAL_SIZE_X": self.local, "V4": int(v4)})
        self.v4 = v4
        gx = -(-(size[-1] * size[-2]) // (self.local * (4 if v4 else 1)))
        outer = math.prod(size[:-3])
        # rows of dimension 5 per workgroup: a few hundred workgroups in all (CPU
        # devices: a few dozen, each costs microseconds)
        target = knobs(op)["relayout_groups"]
        self.rpg = max(1, min(size[-3], -(-outer * gx * size[-3] // target)))
        groups = -(-size[-3] // self.rpg)
        self.gx, self.gz = gx, outer * groups
        p = np.zeros(RELAYOUT_PARAM_WORDS, np.int64)
        p[0:8], p[8:16], p[16:24], p[24:32], p[32:40] = size, stride, lo, hi, dstride
        p[40:43] = base, self.rpg, groups
        self.params = op.upload(_words(p))

    def encode(self, seq, src, dst, dst_offset_elems: int = 0) -> None:
        binds = [Bind(src, 0, self.src_bytes, "r", self.fmt), Bind(dst, 0, None, "w"),
                 Bind(self.params)]
        mz = self.op.ctx.limits["maxComputeWorkGroupCount"][2]
        for z0, nz in pieces(self.gz, mz):
            seq.dispatch(self.pipe, binds, (self.gx, 1, nz),
                         np.array([0, dst_offset_elems, z0], np.uint32).tobytes())


class FilterTranspose:
    """``convolution_filter.comp``: a packed forward filter into the implicit GEMM's
    [group][kd][kh][channel][kw][padded output channel] as 4x4 blocked transposes, lanes
    along output channels (stores contiguous, reads re-use cached lines).  Needs a packed
    filter with C_in/groups * KD*KH*KW a multiple of 4."""

    def __init__(self, op: CompiledOperator, geo: Geometry, co_pad: int):
        g = geo
        self.op = op
        self.K = g.cin_per_group * math.prod(g.kernel)
        self.local = min(64, op.workgroup_size)
        self.fmt = (runtime.FORMAT_RGBA32_SFLOAT if g.dtype == DataType.FLOAT32
                    else runtime.FORMAT_RGBA16_SFLOAT)
        self.pipe = op.pipeline("convolution_filter_texel", {
            "LOCAL_SIZE_X": self.local, "KD": g.kernel[0], "KH": g.kernel[1],
            "KW": g.kernel[2], "FLIP": int(g.flip)})
        self.params = op.upload(np.array([g.cin_per_group, g.cout_per_group, co_pad, self.K,
                                          g.groups, 0, 0, 0], np.int32))
        self.grid = (-(-(g.groups * co_pad // 4) // self.local), self.K // 4, 1)
        self.src_bytes = g.c_out * self.K * g.dtype.size      # whole RGBA texels (K % 4 == 0)

    @staticmethod
    def applies(op: CompiledOperator, geo: Geometry) -> bool:
        K = geo.cin_per_group * math.prod(geo.kernel)
        return (not geo.backward and op.desc.filter_tensor.is_packed and K % 4 == 0
                and K // 4 <= op.ctx.limits["maxComputeWorkGroupCount"][1]
                and _texel_ok(op, K * geo.c_out // 4))

    def encode(self, seq, w, dst, dst_offset_elems: int = 0) -> None:
        seq.dispatch(self.pipe, [Bind(w, 0, self.src_bytes, "r", self.fmt),
                                 Bind(dst, 0, None, "w"), Bind(self.params)], self.grid)


GEMM_PARAM_WORDS = 28 + 256 * 4   # std140 (glsl/convolution_gemm.comp)
GEMM_SG_PARAM_WORDS = GEMM_PARAM_WORDS + 8 + 256 * 4      # SGW variants


GEMM_UNROLL = 1024     # products in the GEMM's unrolled channel-loop body (CPU devices)
GEMM_MAX_KW = 32       # most column taps the GEMM unrolls
GEMM_MAX_REACH = 4096  # most input elements between the first and last column tap


def gemm_cu(op: CompiledOperator, channels: int, block: int) -> int:
    """Input channels per iteration of the GEMM's channel loop (a divisor of them).
    lavapipe runs a loop under an execution mask and blends every loop-carried sum with
    it once per iteration (116 blends next to 336 products in a 16 x 7 x 3 block), so
    a few channels per iteration pay -- until the body outgrows the instruction cache
    (a 16 x 16 x 3 block took 2x longer with 4 channels per iteration).  ``block``:
    the products of one channel; the "narrow" blocks keep one channel per iteration."""
    if knobs(op)["blocks"] != "wide":
        return 1
    return next(c for c in (8, 4, 2, 1) if channels % c == 0 and c * block <= GEMM_UNROLL
                or c == 1)


class Decline(Exception):
    """A path's constructor found the geometry does not suit it after all; the next
    path is tried."""


def _texel_ok(op: CompiledOperator, elements: int) -> bool:
    return elements <= op.ctx.limits["maxTexelBufferElements"]


#: SG: most pixels per lane (NB) and a weight's shuffle in FMAs of the block
SG_BLOCKS = (16, 16)
SG_SHUFFLE_COST = 6
SG_CBW = True


def subgroup_shuffle_size(op: CompiledOperator) -> int:
    """The subgroup size gemm_sg runs in, else 0: the device must have subgroup shuffles
    in compute shaders and guarantee full subgroups of a size a pipeline names
    (``full_subgroups``: VK_EXT_subgroup_size_control / Vulkan 1.3
    ``computeFullSubgroups``; its pipelines require the reported ``subgroupSize``), as
    the kernel assumes every subgroup has SG lanes."""
    f, lim = op.features, op.ctx.limits
    size = lim["subgroupSize"]
    if not (f.get("subgroup_shuffle") and f.get("full_subgroups")
            and lim["minSubgroupSize"] <= size <= lim["maxSubgroupSize"]):
        return 0
    return size


def gemm_blocks(op: CompiledOperator, cog: int, row: int, vec4: bool,
                taps: int) -> tuple[int, int]:
    """Register block (output channels MB, pixels NB) of the implicit GEMM.

    CPU drivers run an invocation's registers as SIMD lanes, spilling to cache; measured
    on lavapipe, a 1x1 GEMM (one tap per loaded row) does best with 16 x 16 blocks and a
    kernel with several taps per row (3x3: the row is loaded once for three taps) with
    8 x 8 (the "wide" blocks, the default).  The "narrow" blocks (8 x 4, a tuner
    candidate) suit devices that keep the block in registers.  MB is the largest of 16/12/8/4 up
    to that which wastes at most ~12% of the padded channels; NB the pixel count that
    splits the row most evenly (a multiple of 4 where rows are read as float4).
    """
    wide = knobs(op)["blocks"] == "wide"
    mb_max, nb_max = ((16, 16) if taps <= 1 else (8, 8)) if wide else (8, 4)
    mb = next((m for m in (16, 12, 8, 4) if m <= mb_max
               and cog / (-(-cog // m) * m) >= 0.88), 4)
    if row <= nb_max and not vec4:
        return mb, max(1, row)
    step = 4 if vec4 else 1
    cands = range(max(step, (nb_max // 2) // step * step), nb_max + 1, step)
    return mb, min(cands, key=lambda nb: ((-(-row // nb)) * nb - row, -nb))


def sg_blocks(cog: int, phases, row_len, flat: bool, sg: int) -> tuple[int, int]:
    """Register block (MB, NB) of the SG GEMM.  Its lanes pad each channel block's pixel
    blocks to whole subgroups, and each weight a lane gets costs a shuffle (measured on
    lavapipe: ~6 FMAs of the block's, i.e. NB + 6 per weight).  NB is the pixel count
    (4..16) that minimizes padded lanes x (NB + 6), rows read as float4 where they can."""
    mb = next((m for m in (16, 12, 8, 4) if m <= SG_BLOCKS[0]
               and cog / (-(-cog // m) * m) >= 0.88), 4)
    best = None
    for nb in range(4, SG_BLOCKS[1] + 1):
        cost = 0
        for ph, rl in zip(phases, row_len):
            per_row = -(-rl // nb)
            blocks = (ph[0].count * (1 if flat else ph[1].count)) * per_row
            v4 = (nb * ph[2].istep) % 4 == 0 or per_row == 1
            cost += -(-blocks // sg) * sg * (nb + SG_SHUFFLE_COST + (0 if v4 else 4))
        if best is None or cost <= best[0]:
            best = (cost, nb)
    return mb, best[1]


@dataclass
class Axis:
    """One spatial axis of one GEMM dispatch: output positions ``o = o0 + q * ostep`` for
    ``q < count`` read input ``q * istep + c`` for each tap (kernel index ``k``, input
    offset ``c``), taps in increasing ``c``."""

    o0: int
    ostep: int
    count: int
    istep: int
    taps: list          # [(k, c)]


def forward_axes(geo: Geometry) -> list[list[Axis]]:
    """The single dispatch of a forward convolution: q = o, input o*stride + k*dilation - start."""
    return [[Axis(0, 1, geo.valid[a], geo.stride[a],
                  [(k, k * geo.dilation[a] - geo.start[a]) for k in range(geo.kernel[a])])
             for a in range(3)]]


def transposed_axes(geo: Geometry) -> list[list[Axis]]:
    """Transposed convolution without inserted zeros: per axis and output phase p
    (outputs o = p + q*stride), the taps with ``o + start - k*dilation`` divisible by the
    stride, reading input ``q + (p + start - k*dilation) / stride``."""
    per_axis = []
    for a in range(3):
        s, d, st, K, out = geo.stride[a], geo.dilation[a], geo.start[a], geo.kernel[a], \
            geo.out_size[a]
        phases = []
        for p in range(min(s, out)):
            taps = [(k, (p + st - k * d) // s) for k in range(K) if (p + st - k * d) % s == 0]
            phases.append(Axis(p, s, -(-(out - p) // s), 1, sorted(taps, key=lambda t: t[1])))
        per_axis.append(phases)
    return [[ad, ah, aw] for ad in per_axis[0] for ah in per_axis[1] for aw in per_axis[2]]


def padded_extents(geo: Geometry, phases) -> tuple[list, list]:
    """The implicit GEMM's zero-padded input planes: the padding before the input along
    each axis (every tap offset becomes >= 0) and the planes' extents (rows long enough
    for every output position's taps)."""
    lo = [max([0] + [-c for ph in phases for _, c in ph[a].taps]) for a in range(3)]
    ext = []
    for a in range(3):
        need = geo.in_size[a] + lo[a]
        for ph in phases:
            ax = ph[a]
            if ax.taps:
                need = max(need, (ax.count - 1) * ax.istep + ax.taps[-1][1] + lo[a] + 1)
        ext.append(need)
    return lo, ext


class GemmPath(Path):
    """Dense convolution as an implicit GEMM (``glsl/convolution_gemm.comp``), forward or
    transposed (one dispatch per stride phase: no inserted zeros, no wasted products).

    Per execution, ``convolution_relayout`` copies the input into zero-padded float32
    planes (the hot loop needs no bounds checks; float16 and strided inputs become the
    same dense float32) -- except an unpadded 1x1 forward convolution of a packed float32
    input, read in place -- and the filter into [group][row tap][channel][column tap]
    [output channel padded to the block] (flipped in the CONVOLUTION mode).  Output pixels
    go along rows in blocks of NB; a stride-1 convolution with short rows has its planes
    flattened (the padded row pitch as the row length) so lanes stay busy.
    """

    name = "gemm"
    SG = False

    @classmethod
    def accepts(cls, op, geo) -> bool:
        lim = op.ctx.limits
        rows = geo.kernel[0] * geo.kernel[1]
        if geo.backward:
            rows = -(-geo.kernel[0] // geo.stride[0]) * -(-geo.kernel[1] // geo.stride[1]) \
                * math.prod(geo.stride[:2])
        big = max(op.desc.input_tensor.total_tensor_size_in_bytes,
                  op.desc.output_tensor.total_tensor_size_in_bytes) * 2
        if not (geo.plain and geo.cout_per_group >= 4 and rows <= 1024
                and big < lim["maxStorageBufferRange"]
                and (geo.backward or geo.valid == geo.out_size)
                and math.prod(geo.stride) <= 64):
            return False
        # column taps are unrolled (KW, DW specialization constants: the row span a
        # block loads is (NB-1)*SW + (KW-1)*DW + 1), the padded planes are allocated:
        # both bounded by the work, never by a parameter
        if geo.kernel[2] > GEMM_MAX_KW or (geo.kernel[2] - 1) * geo.dilation[2] > GEMM_MAX_REACH:
            return False
        phases = transposed_axes(geo) if geo.backward else forward_axes(geo)
        _, ext = padded_extents(geo, phases)
        planes = geo.n * geo.c_in * math.prod(ext[:2]) * (-(-ext[2] // 4) * 4)
        work = (geo.n * geo.c_in * math.prod(geo.in_size)
                + geo.n * geo.c_out * math.prod(geo.out_size))
        return planes <= 4 * work + (1 << 16)

    def __init__(self, op, geo):
        super().__init__(op, geo)
        g = geo
        cig, cog = g.cin_per_group, g.cout_per_group
        phases = transposed_axes(g) if g.backward else forward_axes(g)
        lo, ext = padded_extents(g, phases)
        self.local = min(64, op.workgroup_size)
        one_by_one = (not g.backward and g.kernel == (1, 1, 1) and g.stride == (1, 1, 1)
                      and g.start == (0, 0, 0) and g.valid == g.in_size)
        self.in_place = in_place = (one_by_one and g.dtype == DataType.FLOAT32
                                    and op.desc.input_tensor.is_packed)
        unit = all(ph[2].istep == 1 for ph in phases)
        wide = knobs(op)["blocks"] == "wide"
        sg = self.SG and subgroup_shuffle_size(op)
        fd = op.desc.filter_tensor
        w_elems = fd.total_tensor_size_in_bytes // fd.data_type.size
        if self.SG and not (sg and self.local % sg == 0 and _texel_ok(op, w_elems)
                            and self.local <= sg * max(
                                op.ctx.limits["maxComputeWorkgroupSubgroups"], 1)):
            raise Decline("no subgroup shuffles, or the filter is too large for a texel view")
        self.sg = sg
        # flattened planes keep lanes busy on short rows, but compute the padding columns
        # too; SG fills its subgroups with short rows instead (see sg_blocks)
        flat = (not g.backward and g.stride[1:] == (1, 1)
                and (one_by_one or (g.valid[2] < 12 and g.valid[1] > 1 and not sg)))
        if in_place:
            ext = list(g.in_size)
        Dp, Hp, Wp = ext
        if not in_place:
            Wp = -(-Wp // 4) * 4          # float4-aligned rows
        plane = Dp * Hp * Wp
        self.texel = texel = True
        # rows: the output pixels each dispatch walks (flat: whole planes, pitch Wp)
        row_len = [g.valid[1] * Wp if flat else ph[2].count for ph in phases]
        vec4_rows = unit and wide
        if sg:
            self.mb, self.nb = mb, nb = sg_blocks(cog, phases, row_len, flat, sg)
        else:
            self.mb, self.nb = mb, nb = gemm_blocks(op, cog, max(row_len), vec4_rows,
                                                    max(len(ph[2].taps) for ph in phases))
        co_pad = -(-cog // mb) * mb
        x_img = g.x_strides[0] if in_place else -(-(g.c_in * plane) // 4) * 4
        x_chan = g.x_strides[1] if in_place else plane
        # dispatches
        self.dispatches = []
        row_offsets, w_texels, max_read = [], 0, 0
        w_rows, w_kw = [], set()          # SG: the filter read in place (see _filter_taps)
        for ph, rl in zip(phases, row_len):
            ad, ah, aw = ph
            rows = [(cd + lo[0]) * Hp * Wp + (ch + lo[1]) * Wp + (aw.taps[0][1] + lo[2]
                                                                   if aw.taps else 0)
                    for _, cd in ad.taps for _, ch in ah.taps] if aw.taps else []
            kw = max(1, len(aw.taps))
            dw = aw.taps[1][1] - aw.taps[0][1] if len(aw.taps) > 1 else 1
            per_row = -(-rl // nb)
            if flat:
                qsize = (ad.count, 1, rl, per_row)
                pitch = Wp
            else:
                qsize = (ad.count, ah.count, aw.count, per_row)
                pitch = 0
            span = (nb - 1) * aw.istep + (kw - 1) * dw + 1
            rowload = span <= kw * nb          # as ROWLOAD in the kernel
            xvec4 = (texel and rowload and ((nb * aw.istep) % 4 == 0 or per_row == 1)
                     and x_img % 4 == 0
                     and x_chan % 4 == 0 and all(r % 4 == 0 for r in rows)
                     and (ad.istep * Hp * Wp) % 4 == 0 and (ah.istep * Wp) % 4 == 0)
            if rows:
                max_read = max(max_read, max(rows) + (qsize[0] - 1) * ad.istep * Hp * Wp
                               + (qsize[1] - 1) * ah.istep * Wp
                               + (per_row * nb - 1) * aw.istep + (kw - 1) * dw
                               + (-(-span // 4) * 4 - span))
            self.dispatches.append(dict(
                qsize=qsize, yorg=(ad.o0, ah.o0, aw.o0, len(row_offsets)), nrows=len(rows),
                w_base=w_texels, pitch=pitch, sw=aw.istep, kw=kw, dw=dw, xvec4=xvec4,
                axes=ph))
            row_offsets += rows
            w_texels += g.groups * len(rows) * cig * kw * co_pad // 4
            if sg and rows:
                wr, step = self._filter_taps(ph)
                w_rows += wr
                if len(aw.taps) > 1:
                    w_kw.add(step)
        if len(w_kw) > 1:
            raise Decline("column taps of the phases step differently through the filter")
        if len(row_offsets) > 1024:
            raise UnsupportedError("convolution", "more than 1024 kernel rows")
        last = (g.n - 1) * x_img + (g.c_in - 1) * x_chan + max_read
        self.xp_floats = max(last + 1, g.n * x_img)
        # the padded input copy
        if not in_place:
            xs = g.x_strides
            self.x_relayout = Relayout(
                op, g.dtype, (g.n, g.c_in, Dp, Hp, Wp), xs, (0, 0, *lo),
                (g.n, g.c_in, lo[0] + g.in_size[0], lo[1] + g.in_size[1], lo[2] + g.in_size[2]),
                -(lo[0] * xs[2] + lo[1] * xs[3] + lo[2] * xs[4]),
                op.desc.input_tensor.total_tensor_size_in_bytes, dst_image=x_img)
            self.xp = op.scratch(4 * self.xp_floats)
        # the filter, one re-layout per dispatch
        self.w_relayouts = []
        ws = g.w_strides
        if not sg and FilterTranspose.applies(op, g):   # (gemm_sg reads it in place)
            self.w_relayouts.append((FilterTranspose(op, g, co_pad), 0))
        for d in self.dispatches if not (self.w_relayouts or sg) else []:
            if not d["nrows"]:
                continue
            axes = d["axes"]
            sizes, strides, base = [g.groups], [], 0
            if g.backward:       # filter (C_in, C_out/groups, *k)
                strides = [cig * ws[0]]
                chan, outc = ws[0], ws[1]
            else:                # filter (C_out, C_in/groups, *k)
                strides = [cog * ws[0]]
                chan, outc = ws[1], ws[0]
            kst = []
            for a in range(3):
                ks = [k for k, _ in axes[a].taps]
                K = g.kernel[a]
                if g.flip:
                    ks = [K - 1 - k for k in ks]
                step = ks[1] - ks[0] if len(ks) > 1 else 0
                base += ks[0] * ws[2 + a]
                kst.append((len(ks), step * ws[2 + a]))
            sizes = [g.groups, kst[0][0], kst[1][0], cig, kst[2][0], co_pad]
            strides = [strides[0], kst[0][1], kst[1][1], chan, kst[2][1], outc]
            hi = sizes[:5] + [cog]
            self.w_relayouts.append((Relayout(op, g.dtype, sizes, strides, (0,) * 6, hi, base,
                                              op.desc.filter_tensor.total_tensor_size_in_bytes),
                                     d["w_base"] * 4))
        if sg:
            if not _texel_ok(op, self.xp_floats):
                raise Decline("the padded input is too large for a texel view")
            self.texel = texel = True
            self.wt = None
            self.w_bytes = fd.total_tensor_size_in_bytes
            self.w_fmt = (runtime.FORMAT_R32_SFLOAT if g.dtype == DataType.FLOAT32
                          else runtime.FORMAT_R16_SFLOAT)
            name = variant("gemm_sg", storage_suffix(op, g.dtype))
        else:
            self.wt = op.scratch(16 * max(w_texels, 1))
            self.texel = texel = _texel_ok(op, self.xp_floats) and _texel_ok(op, w_texels)
            name = variant("gemm", storage_suffix(op, g.dtype), texel)
        if not texel:
            for d in self.dispatches:
                d["xvec4"] = False
        for d in self.dispatches:
            consts = {"LOCAL_SIZE_X": self.local, "MB": mb, "NB": nb, "SW": d["sw"],
                      "ACT": self.act_id, "XVEC4": int(d["xvec4"]), "KW": d["kw"],
                      "DW": d["dw"], "CU": gemm_cu(op, cig, mb * nb * d["kw"])}
            d["yv4"] = self._yv4(d)
            if d["yv4"]:
                consts["YV4"] = 1
            if sg:
                consts["SG"] = sg
                blocks = d["qsize"][0] * d["qsize"][1] * d["qsize"][3]
                # channel blocks of the same pixels as subgroups of a workgroup: the
                # input rows stay in cache between them (1x1 256->64: 4.45 -> 4.00 ms CPU)
                cbw = min(self.local // sg, g.groups * co_pad // mb)
                cbw = cbw if SG_CBW and cbw >= 2 else 0
                if cbw and -(-blocks // sg) <= op.ctx.limits["maxComputeWorkGroupCount"][0]:
                    consts["CBW"] = cbw
                    consts["LOCAL_SIZE_X"] = cbw * sg
                d["cbw"] = consts.get("CBW", 0)
            d["pipe"] = (op.ctx.pipelines.variant(name, consts, subgroup_size=sg) if sg
                         else op.pipeline(name, consts))
        ph0 = phases[0]
        p = np.zeros(28, np.int64)
        p[0:4] = [cig, co_pad, cog, 0]
        p[4:8] = [x_img, x_chan, ph0[0].istep * Hp * Wp, ph0[1].istep * Wp]
        p[8:12] = [*g.out_size, int(g.b_stride is not None)]
        p[12:16] = [ph0[0].ostep, ph0[1].ostep, ph0[2].ostep, g.b_stride or 0]
        p[16:20] = g.y_strides[:4]
        p[20:24] = [g.y_strides[4], 0, 0, 0]
        words = np.zeros(GEMM_SG_PARAM_WORDS if sg else GEMM_PARAM_WORDS, np.int32)
        words[:24] = _words(p[:24]).view(np.int32)
        words[24:28] = self.act_params.view(np.int32)
        words[28:28 + len(row_offsets)] = row_offsets
        if sg:
            ws = g.w_strides
            if g.backward:       # filter (C_in, C_out/groups, *k)
                col_s, ci_s, grp_s = ws[1], ws[0], cig * ws[0]
            else:                # filter (C_out, C_in/groups, *k)
                col_s, ci_s, grp_s = ws[0], ws[1], cog * ws[0]
            o = GEMM_PARAM_WORDS
            words[o:o + 8] = [col_s, ci_s, w_kw.pop() if w_kw else 0, 0, grp_s, 0, 0, 0]
            words[o + 8:o + 8 + len(w_rows)] = w_rows
        self.params = op.upload(words)
        self.x_bytes = 4 * self.xp_floats
        self.groups_y = g.groups * co_pad // mb

    def _yv4(self, d) -> bool:
        """Whether a dispatch stores its pixels 4 at a time: float32 output rows packed
        and aligned, pixels of a block consecutive along them, in whole groups of 4."""
        g = self.geo
        ys = g.y_strides
        aw = d["axes"][2]
        rows = d["pitch"] if d["pitch"] else d["qsize"][2]
        return (g.dtype == DataType.FLOAT32 and aw.ostep == 1 and aw.o0 == 0 and ys[4] == 1
                and all(v % 4 == 0 for v in ys[:4]) and self.nb % 4 == 0
                and rows % 4 == 0 and g.out_size[2] % 4 == 0
                and (d["pitch"] == 0 or d["pitch"] == g.out_size[2]))

    def _filter_taps(self, axes) -> tuple[list, int]:
        """SG: filter element offsets of one dispatch's row taps (first column tap
        included) and the step between its column taps (kernel flipped in the
        CONVOLUTION mode)."""
        g = self.geo
        ws = g.w_strides

        def f(a, k):
            return g.kernel[a] - 1 - k if g.flip else k
        ad, ah, aw = axes
        k0 = f(2, aw.taps[0][0])
        step = (f(2, aw.taps[1][0]) - k0) * ws[4] if len(aw.taps) > 1 else 0
        return [f(0, kd) * ws[2] + f(1, kh) * ws[3] + k0 * ws[4]
                for kd, _ in ad.taps for kh, _ in ah.taps], step

    def filter_buffer(self):
        return self.wt if self.w_relayouts else None

    def encode_filter(self, seq, w) -> None:
        for rl, dst_off in self.w_relayouts:
            rl.encode(seq, w, self.wt, dst_off)

    def encode(self, seq, x, w, b, y) -> None:
        g, op = self.geo, self.op
        if not self.filter_ready:
            self.encode_filter(seq, w)
        sg = self.sg
        if self.in_place:
            src, nbytes = x, min(x.size, self.x_bytes)
        else:
            self.x_relayout.encode(seq, x, self.xp)
            src, nbytes = self.xp, self.x_bytes
        if sg:
            wb = Bind(w, 0, self.w_bytes, "r", self.w_fmt)
        else:
            wb = Bind(self.wt, 0, self.wt.size, "r",
                      runtime.FORMAT_RGBA32_SFLOAT if self.texel else 0)
        # without a bias any storage buffer fills the binding (the kernel reads none)
        bb = Bind(b, 0, op.whole(b, "bias")) if b is not None else Bind(self.params)
        yb = Bind(y, 0, min(y.size, op.desc.output_tensor.total_tensor_size_in_bytes), "w")
        mz = self.ctx.limits["maxComputeWorkGroupCount"][2]
        for d in self.dispatches:
            if self.texel:
                fmt = runtime.FORMAT_RGBA32_SFLOAT if d["xvec4"] else runtime.FORMAT_R32_SFLOAT
                xb = Bind(src, 0, nbytes - nbytes % (16 if d["xvec4"] else 4), "r", fmt)
            else:
                xb = Bind(src, 0, nbytes)
            binds = [xb, wb, bb, yb, Bind(self.params)]
            qs = d["qsize"]
            blocks = qs[0] * qs[1] * qs[3]
            if sg and d["cbw"]:          # subgroups: channel blocks of the same pixels
                cbl = 1
                gx, gy = -(-blocks // sg), -(-self.groups_y // d["cbw"])
            else:
                if sg:                   # whole subgroups per channel block
                    blocks = -(-blocks // sg) * sg
                # few pixel blocks: spread channel blocks over the lanes too
                cbl = max(1, min(self.groups_y, (4 * self.local) // blocks))
                gx = -(-(blocks * cbl) // self.local)
                gy = -(-self.groups_y // cbl)
            for n0, nn in pieces(g.n, mz):
                push = np.array([*qs, *d["yorg"], d["nrows"], d["w_base"], 0, 0, n0,
                                 d["pitch"], cbl, self.groups_y], np.int32)
                seq.dispatch(d["pipe"], binds, (gx, gy, nn), push.tobytes())


WINO_PARAM_WORDS = 36     # std140 (glsl/convolution_winograd.comp)


def gemm_params(geo4, xs4, ysz4, ystep4, ys4, ys_w: int, act_params, rows) -> np.ndarray:
    """The parameter block of ``convolution_gemm.comp`` (see its ``Params``)."""
    words = np.zeros(GEMM_PARAM_WORDS, np.int32)
    for i, v in enumerate((geo4, xs4, ysz4, ystep4, ys4)):
        words[4 * i:4 * i + 4] = _words(v).view(np.int32)
    words[20] = ys_w
    words[24:28] = np.asarray(act_params, np.float32).view(np.int32)
    words[28:28 + len(rows)] = rows
    return words


class GemmSgPath(GemmPath):
    """The implicit GEMM reading the filter in place through its DML strides, shared
    across a subgroup by shuffles (``convolution_gemm.comp``, SGW variants): no
    re-laid filter per execution.  The kernel needs full subgroups of the reported size
    (lavapipe: 8 lanes, SwiftShader: 4), so its pipelines require them
    (:func:`subgroup_shuffle_size`); a device that cannot guarantee them is not offered
    this path."""

    name = "gemm_sg"
    SG = True

    @classmethod
    def accepts(cls, op, geo) -> bool:
        if not (super().accepts(op, geo) and subgroup_shuffle_size(op) >= 4):
            return False
        fd = op.desc.filter_tensor
        # texel views of the filter and of the padded input (a bound on its size: the
        # last block's row may run past the planes)
        phases = transposed_axes(geo) if geo.backward else forward_axes(geo)
        _, ext = padded_extents(geo, phases)
        tail = (SG_BLOCKS[1] + 4) * geo.stride[2] + geo.kernel[2] * geo.dilation[2] + 4
        x_bound = geo.n * geo.c_in * math.prod(ext[:2]) * (-(-ext[2] // 4) * 4) + tail
        return (_texel_ok(op, fd.total_tensor_size_in_bytes // fd.data_type.size)
                and _texel_ok(op, x_bound))


class WinogradPath(Path):
    """Winograd F(4x4, 3x3) (``glsl/convolution_winograd.comp``): 3x3, stride 1, dilation 1,
    one group, forward, enough channels for the transforms to pay off.  Per execution:
    the filter transform U = G g G^T, the input transform V = B^T d B (zero padding by
    bounds), 36 GEMMs M = U^T V on ``convolution_gemm.comp`` (a quarter of the direct
    products), and the output transform y = A^T M A with bias and activation.  Results
    differ from the direct sum by rounding (measured: within 1e-5 x sqrt(9 C_in) of the
    float64 result for unit-variance data).  Taken from 32 tiles up: the filter transform
    runs every execution and costs as much as the GEMMs of a few tiles."""

    name = "winograd"

    @classmethod
    def accepts(cls, op, geo) -> bool:
        lim = op.ctx.limits
        tiles = geo.n * -(-geo.out_size[1] // 4) * -(-geo.out_size[2] // 4)
        big = 36 * max(geo.c_in, geo.c_out) * (tiles + 16) * 4
        return (geo.plain and not geo.backward and geo.kernel == (1, 3, 3)
                and geo.stride == (1, 1, 1)
                and geo.dilation == (1, 1, 1) and geo.groups == 1
                and geo.valid == geo.out_size and geo.in_size[0] == 1
                and geo.c_in >= 16 and geo.c_out >= 16 and tiles >= 32
                and big < lim["maxStorageBufferRange"]
                and geo.c_in <= lim["maxComputeWorkGroupCount"][1]
                and geo.c_out <= lim["maxComputeWorkGroupCount"][1])

    @classmethod
    def prefers(cls, op, geo) -> bool:
        """Where gemm_sg can run the geometry, Winograd only where it wins: the
        transforms cost per tile and channel, the filter transform per channel pair.
        The bounds are lavapipe's crossover (bench/RESULTS.md, "Kernel design": C=64
        T=196 6.7 against 7.2 ms, C=64 T=100 4.5 against 3.9)."""
        if not GemmSgPath.accepts(op, geo):
            return True
        c = min(geo.c_in, geo.c_out)
        tiles = geo.n * -(-geo.out_size[1] // 4) * -(-geo.out_size[2] // 4)
        return c >= 64 and tiles >= 49 and tiles * c >= 9000

    def __init__(self, op, geo):
        super().__init__(op, geo)
        g = geo
        d = op.desc
        cin, cout = g.c_in, g.c_out
        OH, OW = g.out_size[1:]
        TH, TW = -(-OH // 4), -(-OW // 4)
        T = g.n * TH * TW
        T4 = -(-T // 4) * 4
        self.T = T
        mb, nb = gemm_blocks(op, cout, T, True, 1)
        co_pad = -(-cout // mb) * mb
        self.mb, self.nb, self.co_pad = mb, nb, co_pad
        self.local = min(64, op.workgroup_size)
        per_row = -(-T // nb)
        u_floats = 36 * cin * co_pad
        v_floats = 36 * cin * T4 + per_row * nb
        m_floats = 36 * co_pad * T4
        self.u = op.scratch(4 * u_floats)
        self.v = op.scratch(4 * v_floats)
        self.m = op.scratch(4 * m_floats)
        esize = g.dtype.size
        half = runtime.FORMAT_R16_SFLOAT
        src_fmt = runtime.FORMAT_R32_SFLOAT if g.dtype == DataType.FLOAT32 else half
        self.w_texel = _texel_ok(op, d.filter_tensor.total_tensor_size_in_bytes // esize)
        self.x_texel = _texel_ok(op, d.input_tensor.total_tensor_size_in_bytes // esize)
        self.m_texel = _texel_ok(op, m_floats // 4)
        self.gemm_texel = _texel_ok(op, v_floats) and _texel_ok(op, u_floats)
        self.w_fmt = src_fmt if self.w_texel else 0
        self.x_fmt = src_fmt if self.x_texel else 0
        suffix = storage_suffix(op, g.dtype)
        consts = {"LOCAL_SIZE_X": self.local, "ACT": self.act_id}
        self.p_weights = op.pipeline("convolution_winograd_weights_" +
                                     ("texel" if self.w_texel else suffix), consts)
        self.p_input = op.pipeline("convolution_winograd_input_" +
                                   ("texel" if self.x_texel else suffix), consts)
        ys = g.y_strides
        self.y4 = (self.m_texel and g.dtype == DataType.FLOAT32 and OW % 4 == 0
                   and ys[4] == 1 and all(v % 4 == 0 for v in (ys[0], ys[1], ys[3])))
        self.p_output = op.pipeline(variant("winograd_output", suffix, self.m_texel, self.y4),
                                    consts)
        p = np.zeros(WINO_PARAM_WORDS, np.int64)
        p[0:4] = [cin, co_pad, cout, T]
        p[4:8] = [TW, TH * TW, T4, 0]
        p[8:12] = [*g.in_size[1:], *g.start[1:]]
        p[12:16] = [g.x_strides[0], g.x_strides[1], g.x_strides[3], g.x_strides[4]]
        p[16:20] = [g.w_strides[0], g.w_strides[1], g.w_strides[3], g.w_strides[4]]
        p[20:24] = [OH, OW, int(g.flip), int(g.b_stride is not None)]
        p[24:28] = [g.y_strides[0], g.y_strides[1], g.y_strides[3], g.y_strides[4]]
        p[28:32] = [g.b_stride or 0, 0, 0, 0]
        words = _words(p).view(np.int32)
        words[32:36] = self.act_params.view(np.int32)
        self.params = op.upload(words)
        # the 36 GEMMs: image = transform point, one row of T "pixels" (tiles), one tap
        xvec4 = self.gemm_texel and nb % 4 == 0
        self.p_gemm = None if knobs(op).get("gemm") == "blocked" else op.pipeline(
            variant("gemm", "f32", self.gemm_texel), {
                "LOCAL_SIZE_X": self.local, "MB": mb, "NB": nb, "SW": 1, "ACT": 0,
                "XVEC4": int(xvec4), "KW": 1, "DW": 1, "CU": gemm_cu(op, cin, mb * nb)})
        self.xvec4 = xvec4
        self.gemm_params = op.upload(gemm_params(
            (cin, co_pad, co_pad, cin * co_pad // 4), (cin * T4, T4, 0, 0), (1, 1, T, 0),
            (1, 1, 1, 0), (co_pad * T4, T4, 0, 0), 1, np.zeros(4, np.float32), [0]))
        self.qsize = (1, 1, T, per_row)
        self.groups_y = co_pad // mb
        self.blocked = None
        if knobs(op).get("gemm") == "blocked":     # the 36 GEMMs on convolution_blocked
            rm, rn, local = BLOCKS["8x4"]
            self.blocked = (op.pipeline("convolution_blocked_gemm", {
                "LOCAL_SIZE_X": local, "RM": rm, "RN": rn}),
                (-(-T // (local * rn)), -(-co_pad // rm), 36),
                np.array([co_pad, T, cin, 0, cin * co_pad, co_pad, 1, 0, cin * T4, T4, 1, 0,
                          co_pad * T4, T4, 1, 0], np.int32).tobytes())
        self.v_bytes, self.u_bytes, self.m_bytes = 4 * v_floats, 4 * u_floats, 4 * m_floats

    def filter_buffer(self):
        return self.u

    def encode_filter(self, seq, w) -> None:
        """U = G g G^T for every channel pair."""
        pb = Bind(self.params)
        seq.dispatch(self.p_weights, [
            Bind(w, 0, self.op.desc.filter_tensor.total_tensor_size_in_bytes, "r", self.w_fmt),
            pb, Bind(self.u, 0, self.u_bytes, "w"), pb],
            (-(-self.co_pad // self.local), self.geo.c_in, 1))

    def encode(self, seq, x, w, b, y) -> None:
        g, d, L = self.geo, self.op.desc, self.local
        pb = Bind(self.params)
        if not self.filter_ready:
            self.encode_filter(seq, w)
        seq.dispatch(self.p_input, [
            Bind(x, 0, d.input_tensor.total_tensor_size_in_bytes, "r", self.x_fmt),
            Bind(self.params), Bind(self.v, 0, self.v_bytes, "w"), pb],
            (-(-self.T // (4 * L)), g.c_in, 1))
        if self.blocked is not None:
            pipe, groups, push = self.blocked
            seq.dispatch(pipe, [Bind(self.u, 0, self.u_bytes), Bind(self.v, 0, self.v_bytes),
                                Bind(self.m, 0, self.m_bytes, "w")], groups, push)
        else:
            self._encode_gemm(seq)
        self._encode_output(seq, b, y)

    def _encode_gemm(self, seq) -> None:
        """M = U^T V: the 36 GEMMs on convolution_gemm."""
        L = self.local
        if self.gemm_texel:
            vb = Bind(self.v, 0, self.v_bytes - self.v_bytes % 16, "r",
                      runtime.FORMAT_RGBA32_SFLOAT if self.xvec4 else runtime.FORMAT_R32_SFLOAT)
            ub = Bind(self.u, 0, self.u_bytes, "r", runtime.FORMAT_RGBA32_SFLOAT)
        else:
            vb, ub = Bind(self.v, 0, self.v_bytes), Bind(self.u, 0, self.u_bytes)
        qs = self.qsize
        blocks = qs[3]
        cbl = max(1, min(self.groups_y, (4 * L) // blocks))
        push = np.array([*qs, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, cbl, self.groups_y], np.int32)
        seq.dispatch(self.p_gemm, [vb, ub, Bind(self.params), Bind(self.m, 0, self.m_bytes, "w"),
                                   Bind(self.gemm_params)],
                     (-(-(blocks * cbl) // L), -(-self.groups_y // cbl), 36), push.tobytes())

    def _encode_output(self, seq, b, y) -> None:
        g, d, L = self.geo, self.op.desc, self.local
        pb = Bind(self.params)
        mb_ = Bind(self.m, 0, self.m_bytes, "r",
                   runtime.FORMAT_RGBA32_SFLOAT if self.m_texel else 0)
        bb = Bind(b, 0, self.op.whole(b, "bias")) if b is not None else Bind(self.params)
        seq.dispatch(self.p_output, [mb_, bb, Bind(y, 0, d.output_tensor.total_tensor_size_in_bytes,
                                                    "w"), pb],
                     (-(-self.T // (4 * L)), g.c_out, 1))


DW_PARAM_WORDS = 44       # std140 (glsl/convolution_depthwise.comp)
DW_BLOCK = (16, 8)        # the default pixels per strip, rows per band (NB, R)
DW_UNROLL = 4096          # most products (or twice the loads) the depthwise kernel unrolls
DW_SPAN = 128             # most input elements of one unrolled row load


class DepthwisePath(Path):
    """Depthwise forward convolution (``glsl/convolution_depthwise.comp``): group count =
    input channels, any channel multiplier, stride, dilation and padding.  The input is
    read in place through its strides (padding is a mask, not a copy: the operation is
    memory-bound); each invocation computes R output rows x NB pixels of one channel,
    loading each input row of its band once."""

    name = "depthwise"

    @classmethod
    def accepts(cls, op, geo) -> bool:
        lim = op.ctx.limits
        return (geo.plain and not geo.backward and geo.cin_per_group == 1
                and geo.valid == geo.out_size
                and math.prod(geo.kernel) <= 64
                and max(op.desc.input_tensor.total_tensor_size_in_bytes,
                        op.desc.output_tensor.total_tensor_size_in_bytes)
                < lim["maxStorageBufferRange"]
                and cls.blocks(op, geo) is not None)

    @staticmethod
    def blocks(op, geo):
        """(NB, R) for the geometry, or None where even a 1 x 1 block would unroll more
        than DW_UNROLL loads or products.  The kernel unrolls KD x NI input rows of E
        elements (NI = (R-1)*SH + (KH-1)*DH + 1, E = (NB-1)*SW + (KW-1)*DW + 1, plus 3
        for float4 rows) and KD*KH*KW*R*NB products: strides and dilations enter the
        unrolled size, so they are bounded here, not by the kernel."""
        ow, oh = geo.out_size[2], geo.out_size[1]
        # default 16 x 8 blocks, measured on lavapipe (a 128-channel 56x56 3x3 took 1.08
        # ms of CPU with 16 x 8, 1.20 with 8 x 8, 1.51 with 4 x 14); the tuner also
        # offers 4 x 1 (candidate depthwise-4x1)
        nb, r = knobs(op)["dw_block"]
        nb = max(1, min(nb, -(-ow // 4) * 4))
        r = max(1, min(r, oh))
        kd, kh, kw = geo.kernel
        sh, sw, dh, dw = geo.stride[1], geo.stride[2], geo.dilation[1], geo.dilation[2]

        def unrolled(nb_, r_):      # loads and products in the unrolled body
            rows = (r_ - 1) * sh + (kh - 1) * dh + 1
            span = (nb_ - 1) * sw + (kw - 1) * dw + 1 + 3
            if span > DW_SPAN:      # (LLVM's time grows faster than the loads: a
                return DW_UNROLL + 1    # 3004-element row took 45 s to compile)
            return max(2 * kd * rows * span, kd * kh * kw * r_ * nb_)

        while unrolled(nb, r) > DW_UNROLL and (r > 1 or nb > 1):
            if r > 1:
                r = (r + 1) // 2
            else:
                nb = nb // 2 if nb > 4 else 1
        return (nb, r) if unrolled(nb, r) <= DW_UNROLL else None

    def __init__(self, op, geo):
        super().__init__(op, geo)
        g = geo
        d = op.desc
        ow = g.out_size[2]
        kd, kh, kw = g.kernel
        nb, r = self.blocks(op, geo)
        self.nb, self.R = nb, r
        self.strips = -(-ow // nb)
        esize = g.dtype.size
        x_el = d.input_tensor.total_tensor_size_in_bytes // esize
        w_el = d.filter_tensor.total_tensor_size_in_bytes // esize
        f32 = g.dtype == DataType.FLOAT32
        self.texel = _texel_ok(op, x_el) and _texel_ok(op, w_el)
        self.fmt = (runtime.FORMAT_R32_SFLOAT if f32 else
                    runtime.FORMAT_R16_SFLOAT) if self.texel else 0
        # float4 input rows / float4 output stores (see the kernel)
        self.x4 = (self.texel and f32 and g.x_strides[4] == 1 and x_el % 4 == 0
                   and all(s_ % 4 == 0 for s_ in g.x_strides[:4])
                   and (nb * g.stride[2]) % 4 == 0)
        y_el = d.output_tensor.total_tensor_size_in_bytes // esize
        self.v4 = (f32 and g.y_strides[4] == 1 and ow % 4 == 0 and nb % 4 == 0
                   and all(s_ % 4 == 0 for s_ in g.y_strides[:4]) and y_el % 4 == 0)
        name = variant("depthwise", storage_suffix(op, g.dtype), self.texel, self.v4)
        if self.v4 and not self.texel:
            self.v4 = False
        self.local = min(64, op.workgroup_size)
        self.pipe = op.pipeline(name, {
            "LOCAL_SIZE_X": self.local, "NB": nb, "SW": g.stride[2], "KW": kw,
            "DW": g.dilation[2], "ACT": self.act_id, "KH": kh, "KD": kd, "X4": int(self.x4),
            "SHIFT": (-g.start[2]) % 4, "R": r, "SH": g.stride[1], "DH": g.dilation[1]})
        p = np.zeros(DW_PARAM_WORDS, np.int64)
        p[0:4] = [*g.in_size, g.cout_per_group]
        p[4:8] = [*g.out_size, self.strips]
        p[8:12] = [kd, kh, 0, int(g.b_stride is not None)]
        p[12:16] = [g.stride[0], g.stride[1], 0, g.b_stride or 0]
        p[16:20] = [g.dilation[0], g.dilation[1], 0, 0]
        p[20:23] = g.start
        p[24:28] = g.x_strides[:4]
        p[28:32] = [g.w_strides[0], g.w_strides[2], g.w_strides[3], g.w_strides[4]]
        p[32:36] = g.y_strides[:4]
        p[36:40] = [g.x_strides[4], g.y_strides[4], int(g.flip), g.c_out]
        words = _words(p).view(np.int32)
        words[40:44] = self.act_params.view(np.int32)
        self.params = op.upload(words)

    def encode(self, seq, x, w, b, y) -> None:
        g, op, d = self.geo, self.op, self.op.desc
        xb = Bind(x, 0, d.input_tensor.total_tensor_size_in_bytes, "r",
                  runtime.FORMAT_RGBA32_SFLOAT if self.x4 else self.fmt)
        wb = Bind(w, 0, d.filter_tensor.total_tensor_size_in_bytes, "r", self.fmt)
        bb = Bind(b, 0, op.whole(b, "bias")) if b is not None else Bind(self.params)
        yb = Bind(y, 0, d.output_tensor.total_tensor_size_in_bytes, "w")
        binds = [xb, wb, bb, yb, Bind(self.params)]
        mx, my, mz = self.ctx.limits["maxComputeWorkGroupCount"]
        # x: (channel, strip) lanes, y: bands, z: image x output depth
        per_x = max(1, mx * self.local // self.strips)         # channels per dispatch
        od = g.out_size[0]
        per_z = max(1, mz // od)                                # images per dispatch
        gy = -(-g.out_size[1] // self.R)
        if gy > my:
            raise UnsupportedError("maxComputeWorkGroupCount", "too many output rows")
        for c0, cn in pieces(g.c_out, per_x):
            for n0, nn in pieces(g.n, per_z):
                seq.dispatch(self.pipe, binds, (-(-(cn * self.strips) // self.local), gy,
                                                nn * od),
                             np.array([n0, c0], np.int32).tobytes())



def implicit_gemm_params(g: Geometry, mblocks: int, act_params) -> np.ndarray:
    """The parameter block (std140) of the in-place implicit GEMMs, tiled and blocked:
    sizes, kernel, strides, dilations, padding and the tensors' element strides."""
    p = np.zeros(40, np.int64)
    p[0:4] = [*g.in_size, g.cin_per_group]
    p[4:8] = [*g.out_size, g.cout_per_group]
    p[8:12] = [*g.kernel, int(g.flip)]
    p[12:16] = [*g.stride, int(g.b_stride is not None)]
    p[16:20] = [*g.dilation, mblocks]
    p[20:24] = [*g.start, math.prod(g.out_size)]
    p[24:28] = g.x_strides[:4]
    p[28:32] = g.w_strides[:4]
    p[32:36] = g.y_strides[:4]
    p[36:40] = [g.x_strides[4], g.w_strides[4], g.y_strides[4], g.b_stride or 0]
    return np.concatenate([_words(p).view(np.uint8), act_params.view(np.uint8)])


def in_place_binds(op, geo, x, w, b, y) -> list:
    """Input, filter, bias (the filter where there is none), output and parameters bound
    whole (the in-place paths accept only tensors within maxStorageBufferRange)."""
    d = op.desc
    w_bind = Bind(w, 0, op.whole(w, "filter"))
    return [Bind(x, 0, d.input_tensor.total_tensor_size_in_bytes), w_bind,
            Bind(b, 0, op.whole(b, "bias")) if b is not None else w_bind,
            Bind(y, 0, d.output_tensor.total_tensor_size_in_bytes, "w")]


def in_place_accepts(op, geo, groups: tuple) -> bool:
    """Whether an in-place implicit GEMM with ``groups`` workgroups (x, y, z) runs the
    geometry: forward, as given (not reduced), every output covered, each tensor bound
    whole."""
    binds = [t.total_tensor_size_in_bytes for t in op.desc.inputs() + op.desc.outputs()
             if t is not None]
    lim = op.ctx.limits
    return (geo.plain and not geo.backward and geo.valid == geo.out_size
            and all(0 < c <= m for c, m in zip(groups, lim["maxComputeWorkGroupCount"]))
            and max(binds) <= lim["maxStorageBufferRange"]
            and math.prod(geo.out_size) < (1 << 30) and math.prod(geo.kernel) < (1 << 30))


#: Register blocks of the blocked path: (RM output channels, RN pixels, invocations per
#: workgroup).  Frozen into the module (FROZEN_CONSTANTS), so they stay small.
BLOCKS = {"8x4": (8, 4, 16), "4x4": (4, 4, 16), "8x8": (8, 8, 16), "8x2": (8, 2, 16),
          "1x8": (1, 8, 64)}


class BlockedPath(Path):
    """``glsl/convolution_blocked.comp`` (CONV): a forward convolution as an implicit GEMM
    read in place through the DML strides, RM output channels x RN pixels per invocation
    with RM and RN frozen into the module, so that drivers which do not fold
    specialization constants keep the block in registers (measured on SwiftShader, where
    the other paths' large blocks live in memory).  Knob: the block (:data:`BLOCKS`)."""

    name = "blocked"

    @classmethod
    def prefers(cls, op, geo) -> bool:
        """Not the ``VKML_TUNE=off`` default (after direct): the tuner times it."""
        return False

    @classmethod
    def _shape(cls, op, geo):
        rm, rn, local = BLOCKS[knobs(op).get("block", "8x4")]
        local = min(local, op.ctx.limits["maxComputeWorkGroupSize"][0])
        mblocks = -(-geo.cout_per_group // rm)
        groups = (-(-math.prod(geo.out_size) // (local * rn)), geo.groups * mblocks, geo.n)
        return rm, rn, local, mblocks, groups

    @classmethod
    def accepts(cls, op, geo) -> bool:
        return in_place_accepts(op, geo, cls._shape(op, geo)[4])

    def __init__(self, op, geo):
        super().__init__(op, geo)
        rm, rn, self.local, mblocks, self.groups = self._shape(op, geo)
        self.pipe = op.pipeline(variant("blocked", storage_suffix(op, geo.dtype)), {
            "LOCAL_SIZE_X": self.local, "RM": rm, "RN": rn, "ACT": self.act_id})
        self.params = op.upload(implicit_gemm_params(geo, mblocks, self.act_params))

    def encode(self, seq, x, w, b, y) -> None:
        seq.dispatch(self.pipe, in_place_binds(self.op, self.geo, x, w, b, y)
                     + [Bind(self.params)], self.groups)


# -- the shared-memory tiled implicit GEMM ----------------------------------------------------
#: Tile shapes of the tiled path: (TM output channels, TN output pixels, TK input channels
#: per shared-memory stage, RM channels x RN pixels per invocation).  "64": 256
#: invocations, 8 KiB of shared memory (the usual GPU tile); "32": 64 invocations.
TILES = {"64": (64, 64, 16, 4, 4), "32": (32, 32, 16, 4, 4), "64x32": (64, 32, 8, 8, 4)}
TILED_PARAM_WORDS = 44      # std140: 10 ivec4/uvec4 + the activation vec4


class TiledPath(Path):
    """``glsl/convolution_tiled.comp``: a shared-memory tiled implicit GEMM, the kernel
    GPU libraries use for dense convolutions: TM output channels x TN pixels per
    workgroup, the reduction (filter tap, then TK input channels) staged through shared
    memory, an RM x RN register block per invocation read as float4s.  Forward
    convolutions of any kernel, stride, dilation, padding and group count, tensors read
    and written in place through their DML strides (no re-layout, no filter transform).
    Knobs: the tile (:data:`TILES`) and, for float16 tensors on devices with
    ``shaderFloat16`` and 16-bit storage, float16 arithmetic (``f16_arith``: each
    stage's TK products summed in float16 before the float32 accumulators; the bound
    tested is ``(TK + 1) 2^-11 sum |w x|`` per output)."""

    name = "tiled"

    @classmethod
    def prefers(cls, op, geo) -> bool:
        """Never the ``VKML_TUNE=off`` default (it comes after direct): on the CPU drivers
        the paths above measured faster; the tuner times it where it accepts."""
        return False

    @classmethod
    def accepts(cls, op, geo) -> bool:
        lim = op.ctx.limits
        k = knobs(op)
        tm, tn, tk, rm, rn = TILES[k.get("tile", "64")]
        local = (tm // rm) * (tn // rn)
        pix = math.prod(geo.out_size)
        count = lim["maxComputeWorkGroupCount"]
        if k.get("f16_arith") and not (geo.dtype == DataType.FLOAT16 and op.features.get("fp16")
                                       and op.features.get("storage16")):
            return False
        binds = [t.total_tensor_size_in_bytes for t in op.desc.inputs() + op.desc.outputs()
                 if t is not None]
        return (geo.plain and not geo.backward and geo.valid == geo.out_size
                and local <= lim["maxComputeWorkGroupInvocations"]
                and local <= lim["maxComputeWorkGroupSize"][0]
                and (tm + tn) * tk * 4 <= lim["maxComputeSharedMemorySize"]
                and -(-pix // tn) <= count[0] and geo.n <= count[2]
                and geo.groups * -(-geo.cout_per_group // tm) <= count[1]
                and max(binds) <= lim["maxStorageBufferRange"]
                and pix < (1 << 30) and math.prod(geo.kernel) < (1 << 30))

    def __init__(self, op, geo):
        super().__init__(op, geo)
        g, k = geo, knobs(op)
        self.tile = tm, tn, tk, rm, rn = TILES[k.get("tile", "64")]
        self.local = (tm // rm) * (tn // rn)
        kernel = ("tiled", "f16_arith") if k.get("f16_arith") else None
        name = ("convolution_tiled_f16_arith" if kernel
                else variant("tiled", storage_suffix(op, g.dtype)))
        self.pipe = op.pipeline(name, {"LOCAL_SIZE_X": self.local, "TM": tm, "TN": tn, "TK": tk,
                                       "RM": rm, "RN": rn, "ACT": self.act_id})
        self.mtiles = -(-g.cout_per_group // tm)
        self.params = op.upload(implicit_gemm_params(g, self.mtiles, self.act_params))

    def encode(self, seq, x, w, b, y) -> None:
        g = self.geo
        seq.dispatch(self.pipe, in_place_binds(self.op, g, x, w, b, y) + [Bind(self.params)],
                     (-(-math.prod(g.out_size) // self.tile[1]), g.groups * self.mtiles, g.n))

#: Paths in order of preference: without tuning (``VKML_TUNE=off``) the first that
#: accepts and prefers a geometry runs it (:func:`heuristic`).
PATHS: list[type[Path]] = [WinogradPath, DepthwisePath, GemmSgPath, GemmPath, DirectPath,
                           TiledPath, BlockedPath]

#: The knobs a path reads (:func:`knobs`): RELAYOUT_GROUPS, the GEMM blocks ("wide":
#: gemm_blocks' 16 x 16 / 8 x 8 with several channels per loop iteration and float4
#: rows; "narrow": 8 x 4, one channel), the depthwise block (NB, R).  These defaults
#: were measured on lavapipe; ``VKML_TUNE=off`` uses them on every device.
DEFAULT_KNOBS = {"relayout_groups": RELAYOUT_GROUPS[0], "blocks": "wide", "dw_block": DW_BLOCK}

#: The candidates of the tunable path ``convolution``: name -> (path, knobs other than
#: the defaults).  A path's own name is that path with the default knobs.
CANDIDATES = {
    "winograd": ("winograd", {}),
    "winograd-narrow": ("winograd", {"blocks": "narrow"}),
    "winograd-blocked": ("winograd", {"gemm": "blocked"}),
    "depthwise": ("depthwise", {}),
    "depthwise-4x1": ("depthwise", {"dw_block": (4, 1)}),
    "gemm_sg": ("gemm_sg", {}),
    "gemm_sg-g256": ("gemm_sg", {"relayout_groups": RELAYOUT_GROUPS[1]}),
    "gemm": ("gemm", {}),
    "gemm-g256": ("gemm", {"relayout_groups": RELAYOUT_GROUPS[1]}),
    "gemm-narrow": ("gemm", {"blocks": "narrow", "relayout_groups": RELAYOUT_GROUPS[1]}),
    "tiled": ("tiled", {}),
    "tiled-32": ("tiled", {"tile": "32"}),
    "tiled-64x32": ("tiled", {"tile": "64x32"}),
    "tiled-f16": ("tiled", {"f16_arith": True}),
    **{"blocked" + ("" if k == "8x4" else "-" + k): ("blocked", {"block": k})
       for k in BLOCKS},
    "direct": ("direct", {}),
}
#: Candidates that differ from their path's default only in knobs that are parameters,
#: not pipelines: timing them costs runs, no compilation (the fast list adds them).
_CHEAP = {"gemm_sg": ("gemm_sg-g256",), "gemm": ("gemm-g256",)}


def knobs(op) -> dict:
    """The knobs of the candidate ``op`` is being built as (the defaults otherwise)."""
    return getattr(op, "knobs", None) or DEFAULT_KNOBS


def _path_class(name: str) -> type[Path]:
    return next(p for p in (WinogradPath, DepthwisePath, GemmSgPath, GemmPath, TiledPath,
                                     BlockedPath, DirectPath)
                if p.name == name)


def heuristic(op: CompiledOperator, geo: Geometry) -> list[str]:
    """The paths of :data:`PATHS` that accept the geometry, in the order ``VKML_TUNE=off``
    tries them: those that also prefer it first (from features and limits only)."""
    accepting = [cls for cls in PATHS if cls.accepts(op, geo)]
    return ([c.name for c in accepting if c.prefers(op, geo)]
            + [c.name for c in accepting if not c.prefers(op, geo)])


def _build(op, geo, name: str) -> Path:
    """Candidate ``name`` built for the geometry (raises Decline where it does not take it)."""
    path, extra = CANDIDATES[name]
    op.knobs = {**DEFAULT_KNOBS, **extra}
    try:
        cls = _path_class(path)
        if not cls.accepts(op, geo):
            raise Decline(f"{path} does not accept the geometry")
        built = cls(op, geo)
    except BaseException:
        op.knobs = None
        raise
    built.candidate = name
    return built


def choose_path(op: CompiledOperator, geo: Geometry, force: str | None = None) -> Path:
    """The path that runs the geometry: ``force`` (a candidate name, see
    :data:`CANDIDATES`), else the tuner's choice (``VKML_TUNE``; tunable path
    ``convolution``), else the first of :func:`heuristic` that builds."""
    if force is not None:
        if force not in CANDIDATES:
            raise ValidationError("path", f"must be None or one of {', '.join(CANDIDATES)}, "
                                  f"got {force!r}")
        try:
            return _build(op, geo, force)
        except Decline as exc:
            raise UnsupportedError("convolution", f"path {force!r} does not take this "
                                   f"geometry ({exc})") from None
    order = heuristic(op, geo)
    tuner = tuning.default_tuner()
    if geo.plain and len(order) > 1 and tuner.effective_mode() != "off":
        c = tuner.choose(op.device, TUNABLE, tuning_shape(op.desc))
        if c.source != "default" and c.name not in order[:1]:
            try:
                return _build(op, geo, c.name)
            except Decline:
                pass
    for name in order:
        try:
            return _build(op, geo, name)
        except Decline:
            continue
    raise AssertionError("DirectPath accepts every geometry")


# -- tuning ---------------------------------------------------------------------------------
def _round(v: int) -> int:
    """``v`` rounded up to a power of two (the shape class's sizes)."""
    return 1 << max(0, int(v) - 1).bit_length()


def _tensor_json(t: TensorDesc | None):
    if t is None:
        return None
    return {"dtype": t.data_type.name.lower(), "sizes": list(t.sizes),
            "strides": None if t.strides is None else list(t.strides), "flags": int(t.flags)}


def _tensor_of(j) -> TensorDesc | None:
    if j is None:
        return None
    return TensorDesc(DataType[j["dtype"].upper()], tuple(j["sizes"]),
                      None if j.get("strides") is None else tuple(j["strides"]),
                      flags=TensorFlags(j.get("flags", 0)))


def tuning_shape(desc: ConvolutionOperatorDesc) -> dict:
    """The tuner's shape of a convolution: its descriptor as JSON (stored with the
    choice, so ``python -m vkml.tune --refresh`` can re-measure it), without the fused
    activation (it does not change which path is fastest)."""
    g = lambda v: None if v is None else list(v)   # noqa: E731
    return {"input": _tensor_json(desc.input_tensor), "filter": _tensor_json(desc.filter_tensor),
            "bias": _tensor_json(desc.bias_tensor), "output": _tensor_json(desc.output_tensor),
            "mode": desc.conv_mode.name, "direction": desc.conv_direction.name,
            "strides": g(desc.strides), "dilations": g(desc.dilations),
            "start_padding": g(desc.start_padding), "end_padding": g(desc.end_padding),
            "output_padding": g(desc.output_padding), "group_count": int(desc.group_count)}


def desc_of_shape(shape) -> ConvolutionOperatorDesc:
    """:func:`tuning_shape`'s inverse (a descriptor passes through)."""
    if isinstance(shape, ConvolutionOperatorDesc):
        return shape
    t = lambda v: None if v is None else tuple(v)   # noqa: E731
    return ConvolutionOperatorDesc(
        _tensor_of(shape["input"]), _tensor_of(shape["filter"]), _tensor_of(shape["bias"]),
        _tensor_of(shape["output"]), ConvolutionMode[shape["mode"]],
        ConvolutionDirection[shape["direction"]], t(shape["strides"]), t(shape["dilations"]),
        t(shape["start_padding"]), t(shape["end_padding"]), t(shape["output_padding"]),
        shape["group_count"])


def shape_from_workload(w) -> dict | None:
    """A bench workload (bench/workloads/convolution.json: ``input``, ``filter``,
    ``strides``, ``dilations``, ``start_padding``, ``end_padding``, ``groups``,
    ``direction``, ``dtype``; a bias is bound) as the tuner's shape; None for another op."""
    if not isinstance(w, dict) or w.get("op") != "convolution":
        return None
    dt = DataType[str(w.get("dtype", "float32")).upper()]
    x, f = tuple(w["input"]), tuple(w["filter"])
    back = str(w.get("direction", "forward")).upper() == "BACKWARD"
    cout = f[1] * int(w.get("groups", 1)) if back else f[0]
    kw = {k: tuple(w[k]) for k in ("strides", "dilations", "start_padding", "end_padding")
          if w.get(k) is not None}
    direction = ConvolutionDirection.BACKWARD if back else ConvolutionDirection.FORWARD
    probe = ConvolutionOperatorDesc(TensorDesc(dt, x), TensorDesc(dt, f), None,
                                    TensorDesc(dt, x), direction=direction,
                                    group_count=int(w.get("groups", 1)), **kw)
    out = (x[0], cout) + tuple(probe.expected_output_sizes()[2:])
    bias = TensorDesc(dt, (1, cout) + (1,) * (len(x) - 2))
    return tuning_shape(ConvolutionOperatorDesc(
        TensorDesc(dt, x), TensorDesc(dt, f), bias, TensorDesc(dt, out), direction=direction,
        group_count=int(w.get("groups", 1)), **kw))


def shape_class(desc: ConvolutionOperatorDesc) -> str:
    """Convolutions that share one tuned choice: same direction, data type, kernel,
    stride, dilation, group kind (one, depthwise, other), layout (packed or not), the
    OWNED_BY_DML inputs (bound once: a path that transforms the filter then pays no
    transform per run, so the choice differs), and batch, channels in and out and output
    sizes within the same power of two.  ``desc``: a descriptor or :func:`tuning_shape`."""
    desc = desc_of_shape(desc)
    g = Geometry.of(desc)
    grp = "1" if g.groups == 1 else "dw" if g.cin_per_group == 1 else f"g{_round(g.groups)}"

    def dims(v):
        return "x".join(str(x) for x in v)
    owned = "".join(str(i) for i in owned_slots(desc.inputs()))
    return (f"{'bwd' if g.backward else 'fwd'}-{g.dtype.name.lower()}-n{_round(g.n)}"
            f"-c{_round(g.c_in)}-{_round(g.c_out)}-g{grp}-o{dims(_round(v) for v in g.out_size)}"
            f"-k{dims(g.kernel)}-s{dims(g.stride)}-d{dims(g.dilation)}"
            f"{'' if g.packed else '-strided'}{f'-owned{owned}' if owned else ''}")


def _fast(desc: ConvolutionOperatorDesc, device) -> tuple[str, ...]:
    """The fast list of a shape: the heuristic's choice and its runner-ups that compile
    nothing new (its knob variants, :data:`_CHEAP`).  Another path would compile its
    own pipelines, as long as the first call's (measured on lavapipe: a cold first call
    went from 0.40 to 0.41 s with these, to 0.8 s with the next path too), so other
    paths and knobs are timed in ``full`` mode only (``python -m vkml.tune``), except for
    an OWNED_BY_DML filter (below)."""
    desc = desc_of_shape(desc)
    probe = _Probe(device, desc)
    order = heuristic(probe, probe.geo)
    fast = tuple(order[:1]) + _CHEAP.get(order[0], ())
    if 1 in owned_slots(desc.inputs()):
        # an OWNED_BY_DML filter: the operator is compiled for many runs of one filter (a
        # graph, a model), and paths that transform the filter pay it once, so every other
        # accepting path is timed too (but direct: slow wherever another path accepts)
        fast += tuple(n for n in order[1:] if n != "direct")
    return fast


class _Probe:
    """What ``accepts`` reads of an operator, without building one."""

    def __init__(self, device, desc):
        self.device, self.desc, self.ctx = device, desc, device.context
        self.features = self.ctx.features
        self.knobs = None
        self.geo = Geometry.of(desc)


def _run(device, seq, cand, desc):
    """Record candidate ``cand`` of a convolution on zeroed tensors into ``seq``, as it
    will run: OWNED_BY_DML inputs bound once by :meth:`CompiledConvolution.initialize`
    (their transforms are not timed), the others bound at execution."""
    desc = desc_of_shape(desc)
    op = CompiledConvolution(device, desc, path=cand.name)   # UnsupportedError: declined
    made = [op]
    try:
        ins, owned = [], {}
        for i, t in enumerate(desc.inputs()):
            if t is None:
                ins.append(None)
                continue
            a = device.empty(t.total_tensor_size_in_bytes // t.data_type.size, t.dtype)
            made.append(a)
            if i in op.owned_inputs:
                owned[i] = a
                ins.append(None)
            else:
                ins.append(a)
        if owned:
            op.initialize(owned)
        y = desc.outputs()[0]
        out = device.empty(y.total_tensor_size_in_bytes // y.data_type.size, y.dtype)
        made.append(out)
        op.record(seq, ins, [out])
    except BaseException:
        _free(made)
        raise
    return lambda: _free(made)


def _free(made) -> None:
    for m in made:
        m.release() if hasattr(m, "release") else m.free()


#: The tunable path ``convolution`` (:mod:`vkml.tuning`): its candidates are
#: :data:`CANDIDATES` that accept a shape, its shape class :func:`shape_class`, its fast
#: list :func:`_fast` (so ``VKML_TUNE=fast`` compiles little beyond what the heuristic's
#: choice compiles anyway); the per-shape default is :func:`heuristic`'s first.
TUNABLE = tuning.register_path(
    "convolution", list(CANDIDATES), "direct", shape_class, _run, fast_fn=_fast,
    from_workload=shape_from_workload,
    examples=[shape_from_workload({"op": "convolution", "input": [1, 64, 56, 56],
                                   "filter": [64, 64, 3, 3], "start_padding": [1, 1],
                                   "end_padding": [1, 1]})])


@implements(ConvolutionOperatorDesc)
class CompiledConvolution(CompiledOperator):
    """Chooses a path for the descriptor on this device (see the module doc).

    ``owned_inputs``: the input slots (0 input, 1 filter, 2 bias) whose tensors carry
    ``DML_TENSOR_FLAG_OWNED_BY_DML``; they are bound by :meth:`initialize`, not at
    execution (see "Owned filters" in the module doc).  ``path``: see
    :func:`choose_path` (a candidate name forces it; UnsupportedError where it does not
    take the geometry)."""

    INPUT_NAMES = ("input", "filter", "bias")

    def __init__(self, device, desc, path: str | None = None):
        #: None: the tuner's or the heuristic's choice; a name of :data:`CANDIDATES`
        #: (a path name: that path, default knobs) forces it (tests, the tuner).
        self.force = path
        self.knobs = None
        super().__init__(device, desc)

    def build(self) -> None:
        self.geometry = Geometry.of(self.desc)
        self.path = choose_path(self, self.geometry, self.force)
        self.owned_inputs = owned_slots(self.desc.inputs())
        self._persistent: dict = {}        # slot -> Tensor (not owning) bound in its place

    # -- DML_TENSOR_FLAG_OWNED_BY_DML ----------------------------------------------------
    def initialize(self, inputs=None, **named) -> None:
        """``IDMLOperatorInitializer`` for this operator: bind the OWNED_BY_DML inputs once,
        by slot (``initialize({1: w})``, ``initialize([None, w, None])``) or by name
        (``initialize(filter=w)``), each a Tensor or an array.  A path that re-lays or
        transforms the filter (gemm, winograd) does so now, into a buffer this operator
        owns, and its executions skip those dispatches; every other owned input (and the
        filter of a path that reads it in place) is copied into such a buffer.  Later
        changes to the given tensors do not reach the operator.  May be called again."""
        self._check_live()
        given = dict(inputs) if isinstance(inputs, dict) else (
            {i: v for i, v in enumerate(inputs) if v is not None} if inputs is not None else {})
        for name, value in named.items():
            if name not in self.INPUT_NAMES:
                raise ValidationError(name, f"is not an input of {self.desc.OPERATOR_TYPE} "
                                      f"(those are {', '.join(self.INPUT_NAMES)})")
            given[self.INPUT_NAMES.index(name)] = value
        given = initializer_inputs(self.owned_inputs, given, "inputs")
        descs = self.desc.inputs()
        temps, persistent = [], {}
        with self._lock:
            try:
                with self.ctx.sequence(hold=True) as seq:
                    for i, value in sorted(given.items()):
                        t, temp = device_copy(self.device, value, descs[i], f"inputs[{i}]")
                        if temp:
                            temps.append(t)
                        persistent[i] = self._initialize_input(seq, i, t)
                    seq.run()
            finally:
                for t in temps:
                    t.free()
            if 1 in persistent and self.path.filter_buffer() is not None:
                self.path.filter_ready = True
            self._persistent = persistent
            # a recorded execution reads the same buffers: the cache stays valid

    def _initialize_input(self, seq, i: int, t):
        """Record the initialization of input slot ``i`` from ``t``; the Tensor (not
        owning) that executions bind in its place."""
        d = self.desc.inputs()[i]
        dst = self.path.filter_buffer() if i == 1 else None
        if dst is not None:
            self.path.encode_filter(seq, t.allocation)
        else:
            old = self._persistent.get(i)
            dst = old.allocation if old is not None else self.scratch(
                -(-d.total_tensor_size_in_bytes // 4) * 4)
            seq.copy(t.allocation, dst, [(0, 0, min(dst.size, t.allocation.size))])
        return Tensor(self.device, (dst.size,), np.uint8, dst, max(dst.size,
                      d.total_tensor_size_in_bytes), owner=False)

    def _check_bindings(self, inputs, outputs):
        inputs = list(inputs) if inputs is not None else []
        refuse_owned_at_execution(self.owned_inputs, inputs,
                                  len(self._persistent) == len(self.owned_inputs))
        for i, t in self._persistent.items():
            inputs += [None] * (i + 1 - len(inputs))
            inputs[i] = t
        return super()._check_bindings(inputs, outputs)

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
        self.path.encode(seq, x.allocation, w.allocation,
                         b.allocation if b is not None else None, outputs[0].allocation)


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
    bias = as_array(bias, "bias", optional=True)
    group_count = as_uint(group_count, "group_count", 1)
    xd = _desc_of(x, "x")
    fd = _desc_of(filter, "filter")
    n = max(xd.dimension_count - 2, 0)
    args = {name: as_tuple(v, neutral, n, name) for name, v, neutral in (
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

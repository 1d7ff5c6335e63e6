"""What every convolution path shares: :class:`Geometry` (the descriptor as three spatial
dimensions, reduced where 32-bit indexing needs it), the :class:`Path` base class,
kernel-variant names (:func:`variant`, :func:`storage_suffix`), the texel-view limit
(:func:`texel_ok`) and the knobs a candidate passes its path (``DEFAULT_KNOBS``; the
candidates themselves are in ``choice.py``).  A path that does not take a geometry after
all raises :class:`vkml.tuning.Declined`."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...dml.convolution import ConvolutionOperatorDesc, filter_is_flipped
from ...dml.data_type import DataType
from ...dml.tensor_desc import TensorDesc
from ...runtime import Bind
from ..base import CompiledOperator
from ...intmath import ceil_div
from .epilogue import kernel_activation, residual_of

#: The storages every kernel family is compiled for (see vkml_float.glsl).
STORAGES = ("f32", "f16", "f16_packed")


def variant(kernel: str, storage: str, texel: bool = True, v4: bool = False) -> str:
    """``convolution_<kernel>_<storage>``, + ``_ssbo`` where the inputs are not read
    through texel views, or ``_v4`` where outputs are stored four at a time."""
    return f"convolution_{kernel}_{storage}" + ("_ssbo" if not texel else "_v4" if v4 else "")


# -- geometry -----------------------------------------------------------------------------
def _strides5(t: TensorDesc) -> tuple[int, ...]:
    """Element strides as (n, c, d, h, w); absent spatial dimensions get stride 0."""
    s = t.element_strides
    return tuple(s[:2]) + (0,) * (5 - len(s)) + tuple(s[2:])


def pad3(values, fill) -> tuple[int, ...]:
    return (fill,) * (3 - len(values)) + tuple(values)


#: Index arithmetic in the kernels is 32-bit (SwiftShader has no int64).  A geometry
#: whose positions all stay below SMALL is run as given; any other is reduced per axis
#: (see :func:`_axis_forward`, :func:`_axis_backward`) to the outputs, taps and input
#: positions that meet, which only the direct path runs.
SMALL = 1 << 30
INT_MAX = (1 << 31) - 1


def _tap_ranges(k_n: int, s: int, d: int, a: int, count: int, span: int):
    """``(k, lo, hi)`` for each tap ``k`` whose indices ``j`` in ``[lo, hi]`` (within
    ``[0, count)``) put ``j*s + k*d - a`` inside ``[0, span)``: outputs meeting the input
    (forward) or inputs landing in the output (backward)."""
    for k in range(k_n):
        lo = max(0, ceil_div(a - k * d, s))
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
            in_size=pad3(d.input_tensor.sizes[2:], 1),
            out_size=pad3(d.output_tensor.sizes[2:], 1),
            valid=pad3(d.convolution_sizes(), 1),
            kernel=pad3(d.kernel_sizes, 1), stride=pad3(d.strides, 1),
            dilation=pad3(d.dilations, 1), start=pad3(d.start_padding, 0),
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


# -- what the paths share -------------------------------------------------------------
def storage_suffix(op: CompiledOperator, dtype: DataType) -> str:
    """Kernel variant suffix for the tensors' storage (see vkml_float.glsl)."""
    if dtype == DataType.FLOAT32:
        return "f32"
    return "f16" if op.features.get("storage16") else "f16_packed"


class Path:
    """A way to run a geometry: ``accepts`` (class method), the constructor (which plans
    the dispatches, or raises :class:`vkml.tuning.Declined`), ``encode``.  ``knobs``: the
    candidate's knobs (:data:`DEFAULT_KNOBS` and its own, see ``choice.CANDIDATES``)."""

    name = ""
    #: Whether the constructor takes ``pool=`` (a pooling it may absorb: Winograd an LP
    #: pooling, gemm_sg a global average).
    POOLS = False
    #: Whether its output pass adds a graph's residual (``EpilogueConvolutionDesc.
    #: residual``, read by ``encode``'s ``r``); ``CompiledConvolution`` runs a residual
    #: descriptor only on such a path.
    RESIDUAL = False
    #: Whether it multiplies the input by a graph's per-channel scale as it loads it
    #: (``EpilogueConvolutionDesc.input_scale``, read by ``encode``'s ``s``): set by the
    #: constructor where its kernels do (else ``CompiledConvolution`` runs the multiply
    #: apart, :class:`~.ScaleApart`).
    takes_scale = False

    def __init__(self, op: CompiledOperator, geo: Geometry, knobs: dict | None = None):
        self.op, self.geo, self.ctx = op, geo, op.ctx
        self.knobs = knobs_of(knobs)
        self.act = kernel_activation(op.desc)      # a graph's SWISH / HARD_SWISH too
        self.act_id = self.act.SPEC.kernel_id if self.act is not None else 0
        self.act_params = (self.act.kernel_parameters() if self.act is not None
                           else np.zeros(4, np.float32))
        #: the residual variants' suffix ("_res") where the output pass adds one
        self.res = "_res" if self.RESIDUAL and residual_of(op.desc) is not None else ""

    @classmethod
    def accepts(cls, op: CompiledOperator, geo: Geometry, knobs: dict | None = None) -> bool:
        """Whether this path, with ``knobs`` (None: the defaults), can run the geometry on
        this device (tests force any path that accepts)."""
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

    def encode(self, seq, x, w, b, y, r=None, s=None) -> None:
        """Record the dispatches; ``r``: the residual's allocation (RESIDUAL paths);
        ``s``: the input scale's (where :attr:`takes_scale`)."""
        raise NotImplementedError


def texel_ok(op: CompiledOperator, elements: int) -> bool:
    """Whether a texel view of ``elements`` texels fits maxTexelBufferElements."""
    return elements <= op.ctx.limits["maxTexelBufferElements"]


# -- the in-place implicit GEMMs (tiled, blocked): bindings and limits -------------------------------------
def in_place_binds(op, geo, x, w, b, y) -> list:
    """Input, filter, bias (the filter where there is none), output and parameters bound
    whole (the in-place paths accept only tensors within maxStorageBufferRange)."""
    d = op.desc
    w_bind = Bind(w, 0, op.whole(w, "filter"))
    return [Bind(x, 0, d.input_tensor.total_tensor_size_in_bytes), w_bind,
            Bind(b, 0, op.whole(b, "bias")) if b is not None else w_bind,
            Bind(y, 0, d.output_tensor.total_tensor_size_in_bytes, "w")]


def in_place_accepts(op, geo, groups: tuple, transposed: bool = False) -> bool:
    """Whether an in-place implicit GEMM with ``groups`` workgroups (x, y, z) runs the
    geometry: as given (not reduced), each tensor bound whole; forward with every output
    covered, or (``transposed``: the path runs those too) a transposed convolution."""
    binds = [t.total_tensor_size_in_bytes for t in op.desc.inputs() + op.desc.outputs()
             if t is not None]
    lim = op.ctx.limits
    direction_ok = (transposed and geo.backward) or (not geo.backward
                                                     and geo.valid == geo.out_size)
    return (geo.plain and direction_ok
            and all(0 < c <= m for c, m in zip(groups, lim["maxComputeWorkGroupCount"]))
            and max(binds) <= lim["maxStorageBufferRange"]
            and math.prod(geo.out_size) < (1 << 30) and math.prod(geo.kernel) < (1 << 30))


# -- knobs -------------------------------------------------------------------------------
#: Workgroups a relayout aims at: the default (lavapipe pays microseconds per workgroup:
#: a few dozen) and the tuner's alternative (a few hundred, for wide devices).
RELAYOUT_GROUPS = (32, 256)
DW_BLOCK = (16, 8)        # the default pixels per strip, rows per band (NB, R)

#: The knobs a path reads (``Path.knobs``): RELAYOUT_GROUPS, the GEMM blocks ("wide":
#: gemm_blocks' 16 x 16 / 8 x 8 with several channels per loop iteration and float4
#: rows; "narrow": 8 x 4, one channel), the depthwise block (NB, R).  These defaults
#: were measured on lavapipe; ``VKML_TUNE=off`` uses them on every device.
#: ``store64``: eight float32 outputs as one u64vec4 where a kernel can (True/False; None:
#: the device's measured store width, ``vkml/ops/store_width.py``).  ``subsample``: the
#: GEMM paths run a strided 1x1 convolution on a re-laid copy of the pixels it reads
#: (``gemm.subsampled``; False: the whole input copied, every stride-th element read).
#: ``sg_span``: gemm_sg's pixels a lane kept to a row span of at most that many input
#: elements (None: no bound; ``gemm.sg_blocks``).  ``sg_acc_run``: gemm_sg adds each
#: accumulator's products of a loop iteration in a row (False: one channel and column
#: tap at a time over the whole block, convolution_gemm.comp ACC_RUN).  ``sg_mb``: the
#: most output channels a gemm_sg block holds (None: ``gemm.SG_BLOCKS``).  ``dw_plane``: the
#: depthwise block stores its packed rows as float4s of the flattened band where its rows
#: cannot be stored four at a time, or whole planes of several channels a lane where one
#: plane is not whole float4s (False: one float at a time; ``DepthwisePath.plane``).
#: ``dw_whole``: the depthwise block takes whole planes of a few channels a lane, read as
#: float4 texels (``DepthwisePath.whole``).
#: ``split_k``: the GEMM paths split the reduction (input channels) into up to that many
#: slices, each its own workgroups storing a partial sum, added by a second pass that
#: applies the output pass (``gemm.SplitK``; None: no split): a small plane's few
#: workgroups then fill a wide device.
DEFAULT_KNOBS = {"relayout_groups": RELAYOUT_GROUPS[0], "blocks": "wide", "dw_block": DW_BLOCK,
                 "store64": None, "subsample": True, "sg_span": None, "sg_acc_run": True,
                 "sg_mb": None, "dw_plane": True, "dw_whole": False, "gemv_split": None,
                 "split_k": None}


def knobs_of(knobs: dict | None) -> dict:
    """A candidate's knobs: ``knobs`` over :data:`DEFAULT_KNOBS` (None: the defaults)."""
    return {**DEFAULT_KNOBS, **(knobs or {})}

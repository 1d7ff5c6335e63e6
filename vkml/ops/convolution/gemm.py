"""The implicit GEMM (``glsl/convolution_gemm.comp``) and its re-layouts: the
``convolution_relayout`` pass that copies the input into zero-padded planes and the
filter into the GEMM's order, the filter transpose (``convolution_filter.comp``), the
register blocks, the axes of a forward or transposed dispatch, and :class:`GemmPath`,
whose plan the subgroup variant (``gemm_sg.py``: the filter read in place and shared by
shuffles) adapts and whose kernel Winograd's 36 GEMMs run on; :class:`SplitK`, the
second pass of a reduction split over the input channels (knob ``split_k``)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ... import runtime
from ...dml.data_type import DataType
from ...dml.tensor_desc import packed_strides
from ...errors import UnsupportedError
from ...runtime.blocks import pack
from ...tuning import Declined
from ..base import CompiledOperator
from ..grid import pieces
from ..store_width import wide_stores
from .epilogue import input_scale_of
from .geometry import STORAGES, Geometry, Path, knobs_of, storage_suffix, texel_ok, variant
from .plan import Buf, Step, compiled, record
from ...intmath import ceil_div

#: Kernel variants this module requests (see :func:`variant`) and the specialization
#: constants it sets.
GEMM_CONSTANTS = ("LOCAL_SIZE_X", "MB", "NB", "SW", "ACT", "XVEC4", "KW", "DW", "CU", "YV4",
                  "KS")
VARIANTS = {
    **{f"convolution_relayout_{s}": ("LOCAL_SIZE_X", "V4") for s in STORAGES + ("texel",)},
    "convolution_filter_texel": ("LOCAL_SIZE_X", "KD", "KH", "KW", "FLIP"),
    **{f"convolution_gemm_{s}{r}": GEMM_CONSTANTS for s in STORAGES for r in ("", "_ssbo")},
    "convolution_gemm_f32_v8": GEMM_CONSTANTS,
}
#: The residual variants (``_res``: a graph's residual add in the output pass).
VARIANTS.update({k + "_res": v for k, v in VARIANTS.items() if k.startswith("convolution_gemm")})
#: The input-scale variants (``_sc``: a graph's per-channel scale of the input, read in
#: place): float32 through texel views only.
SCALE_KERNELS = ("convolution_gemm_f32", "convolution_gemm_sg_f32")
VARIANTS.update({f"convolution_gemm_f32{v}{r}_sc": GEMM_CONSTANTS
                 for v in ("", "_v8") for r in ("", "_res")})
#: The split reduction's second pass (``convolution_partials.comp``, :class:`SplitK`).
VARIANTS.update({f"convolution_partials_{s}{r}": ("LOCAL_SIZE_X", "ACT", "KS")
                 for s in STORAGES for r in ("", "_res")})


# -- the re-layout pass and the filter transpose -------------------------------------------
class Relayout:
    """One ``convolution_relayout`` pass: an 8-D float32 box ``dst[c . dstride]`` filled
    from a strided source (``src[base + c . stride]`` where ``lo_k <= c_k < hi_k``, else 0).
    ``dst_image``: the destination stride of the outermost given dimension (default dense).
    ``target``: the workgroups it aims at (knob ``relayout_groups``).
    """

    DIMS = 8

    def __init__(self, op: CompiledOperator, dtype: DataType, size, stride, lo, hi, base: int,
                 src_bytes: int, target: int, dst_image: int | None = None):
        first = self.DIMS - len(size)
        size, stride, hi = ([1] * first + list(v) for v in (size, stride, hi))
        lo = [0] * first + list(lo)
        dstride = list(packed_strides(size))
        if dst_image is not None:
            dstride[first] = dst_image
        v4 = size[-1] % 4 == 0 and all(d % 4 == 0 for d in dstride[:-1]) and dstride[-1] == 1
        self.local = min(64, op.workgroup_size)
        #: the box as given (8-D), before the dispatch order permutes it (host_view)
        self.box = (dtype, *(tuple(v) for v in (size, stride, lo, hi, dstride)), base)
        self._order((size, stride, lo, hi, dstride), self.local * (4 if v4 else 1))
        self.op, self.size, self.v4 = op, size, v4
        self.src_bytes = src_bytes
        self.texel = texel_ok(op, src_bytes // dtype.size)
        self.fmt = (runtime.FORMAT_R32_SFLOAT if dtype == DataType.FLOAT32 else
                    runtime.FORMAT_R16_SFLOAT) if self.texel else 0
        self.kernel = "convolution_relayout_" + ("texel" if self.texel
                                                 else storage_suffix(op, dtype))
        self.constants = {"LOCAL_SIZE_X": self.local, "V4": int(v4)}
        gx = ceil_div(size[-1] * size[-2], (self.local * (4 if v4 else 1)))
        outer = math.prod(size[:-3])
        # rows of dimension 5 per workgroup: about ``target`` workgroups in all
        self.rpg = max(1, min(size[-3], ceil_div(outer * gx * size[-3], target)))
        groups = ceil_div(size[-3], self.rpg)
        self.gx, self.gz = gx, outer * groups
        self.params = op.upload(np.frombuffer(pack(
            self.kernel, "Params", size=size, stride=stride, lo=lo, hi=hi, dstride=dstride,
            base=(base, self.rpg, groups, 0)), np.uint8))

    @staticmethod
    def _order(lists, lanes_row: int) -> None:
        """Lanes run over dimensions 6 and 7, a workgroup walks rows of dimension 5, the
        others are one per workgroup z.  Planes larger than a workgroup with rows that
        fill half of one have their rows (6) walked instead (lanes along 7 only, a size-1
        dimension takes 6's place), and the largest outer dimension becomes the walked
        one: fewer, longer workgroups (lavapipe pays for each workgroup)."""
        size = lists[0]
        ones = [i for i in range(6) if size[i] == 1]
        if size[6] * size[7] > lanes_row and 2 * size[7] >= lanes_row and ones:
            for v in lists:
                v[ones[0]], v[6] = v[6], v[ones[0]]
        k = max(range(6), key=lambda i: (size[i], i))
        for v in lists:
            v[k], v[5] = v[5], v[k]

    def host_view(self, dst: runtime.Allocation, shape) -> np.ndarray | None:
        """What the pass copies into ``dst`` (at element 0) from a dense float32 source of
        sizes ``shape``, as a writable NumPy view of ``dst``'s mapped memory shaped like
        the source: the host can then write the source there itself, and the pass need not
        run while every other element of the box keeps the zero it was given once.  None
        where the pass is more than the source moved into the box (another type, strides,
        a flip, rows it leaves out) or ``dst`` is not host-visible."""
        dtype, size, stride, lo, hi, dstride, base = self.box
        extent = [h - l for l, h in zip(lo, hi)]
        dense = packed_strides(extent)
        if (dst.host is None or dtype != DataType.FLOAT32
                or [e for e in extent if e > 1] != [d for d in shape if d > 1]
                or any(h > s for h, s in zip(hi, size))
                or any(e > 1 and st != d for e, st, d in zip(extent, stride, dense))
                or base != -sum(l * st for l, st in zip(lo, stride))):
            return None
        box = np.ndarray(size, np.float32, dst.host, 0, [4 * d for d in dstride])
        view = box[tuple(slice(l, h) for l, h in zip(lo, hi))]
        view.shape = tuple(shape)         # (only unit axes differ: a view, never a copy)
        return view

    def steps(self, src, dst, dst_offset_elems: int = 0) -> list[Step]:
        """The pass from ``src`` (a role or buffer) into buffer ``dst`` at element
        ``dst_offset_elems``: x and z split into dispatches within
        maxComputeWorkGroupCount."""
        binds = (Buf(src, self.src_bytes, "r", self.fmt), Buf(dst, None, "w"), Buf(self.params))
        mx, _, mz = self.op.ctx.limits["maxComputeWorkGroupCount"]
        return [Step(self.kernel, self.constants, (nx, 1, nz), binds,
                     dict(src_base=0, dst_base=dst_offset_elems, z0=z0, x0=x0 * self.local))
                for x0, nx in pieces(self.gx, mx) for z0, nz in pieces(self.gz, mz)]


class FilterTranspose:
    """``convolution_filter.comp``: a packed forward filter into the implicit GEMM's
    [group][kd][kh][channel][kw][padded output channel] as 4x4 blocked transposes, lanes
    along output channels (stores contiguous, reads re-use cached lines).  Needs a packed
    filter with C_in/groups * KD*KH*KW a multiple of 4."""

    KERNEL = "convolution_filter_texel"

    def __init__(self, op: CompiledOperator, geo: Geometry, co_pad: int):
        g = geo
        self.op = op
        self.K = g.cin_per_group * math.prod(g.kernel)
        self.local = min(64, op.workgroup_size)
        self.fmt = (runtime.FORMAT_RGBA32_SFLOAT if g.dtype == DataType.FLOAT32
                    else runtime.FORMAT_RGBA16_SFLOAT)
        self.constants = {"LOCAL_SIZE_X": self.local, "KD": g.kernel[0], "KH": g.kernel[1],
                          "KW": g.kernel[2], "FLIP": int(g.flip)}
        self.params = op.upload(np.frombuffer(pack(
            self.KERNEL, "Params", dims=(g.cin_per_group, g.cout_per_group, co_pad, self.K),
            groups=(g.groups, 0, 0, 0)), np.uint8))
        self.grid = (ceil_div(g.groups * co_pad // 4, self.local), self.K // 4, 1)
        self.src_bytes = g.c_out * self.K * g.dtype.size      # whole RGBA texels (K % 4 == 0)

    @staticmethod
    def applies(op: CompiledOperator, geo: Geometry) -> bool:
        K = geo.cin_per_group * math.prod(geo.kernel)
        return (not geo.backward and op.desc.filter_tensor.is_packed and K % 4 == 0
                and K // 4 <= op.ctx.limits["maxComputeWorkGroupCount"][1]
                and texel_ok(op, K * geo.c_out // 4))

    def steps(self, src, dst, dst_offset_elems: int = 0) -> list[Step]:
        return [Step(self.KERNEL, self.constants, self.grid,
                     (Buf(src, self.src_bytes, "r", self.fmt), Buf(dst, None, "w"),
                      Buf(self.params)))]


GEMM_UNROLL = 1024     # products in the GEMM's unrolled channel-loop body (CPU devices)
GEMM_MAX_KW = 32       # most column taps the GEMM unrolls
GEMM_MAX_REACH = 4096  # most input elements between the first and last column tap


def gemm_cu(knobs: dict, channels: int, block: int) -> int:
    """Input channels per iteration of the GEMM's channel loop (a divisor of them).
    lavapipe runs a loop under an execution mask and blends every loop-carried sum with
    it once per iteration, so a few channels per iteration pay -- until the body
    outgrows the instruction cache (GEMM_UNROLL products).  ``block``: the products of
    one channel; the "narrow" blocks (knob ``blocks``) keep one channel per iteration."""
    if knobs["blocks"] != "wide":
        return 1
    return next(c for c in (8, 4, 2, 1) if channels % c == 0 and c * block <= GEMM_UNROLL
                or c == 1)


#: SG: most pixels per lane (NB) and a weight's shuffle in FMAs of the block
SG_BLOCKS = (16, 16)
#: SG: most accumulators (MB x NB) a lane holds: fewer than a full 16 x 16 block, which
#: spills on lavapipe, and 224 rather than 192 so that rows of 28 split into two 16 x 14
#: blocks instead of four 16 x 8 (both measured faster on lavapipe).
SG_ACC = 224
#: ...but a full 16 x 16 block on a flattened plane of whole float4s (a 1x1 convolution's
#: 112x112 to 14x14 planes): there the block's cost is its stores, and 16 pixels are two
#: whole u64vec4 stores a channel where 12 are a u64vec4 and a u64vec2 (bench/RESULTS.md,
#: "1x1 blocks of 16 pixels").  A plane of no whole float4s stores element by element,
#: and there 16 pixels were slower (SqueezeNet's 27x27 and 13x13 planes).  A strided 1x1
#: keeps SG_ACC, so that its blocks stay SG_SHARED_NB's shared ones.
SG_ACC_FLAT = 256
SG_SHUFFLE_COST = 6
#: SG: what a block of pixels not in whole float4s costs a lane more per weight, in FMAs
#: of the block: its row loads as R32F fetches; on a flattened plane of whole float4s
#: (1x1) its stores go element by element too (else float4s), which makes 14x14 planes'
#: 12-pixel blocks (24 lanes) faster than 13-pixel ones (16 lanes)
SG_SCALAR_COST = (4, 10)
SG_CBW = True
#: SG, a strided 1x1 convolution (run on its subsampled view): blocks taken where their
#: modelled cost is within SG_SHARE_SLACK of the best, so that a residual network's
#: shortcuts, one a stage, share pipelines (each distinct NB is another pipeline to
#: compile, 40-100 ms of lavapipe's CPU).  ResNet-18's 14x14 one: NB 12 modelled 4%
#: cheaper than 8, timed the same, and with 8 it shares the 7x7 one's pipeline.  Not
#: for every layer: MobileNetV2's and EfficientNet-B0's 14x14 1x1s would leave NB 12
#: shared with their 28x28 ones for 8 of their own, a pipeline more each.
SG_SHARED_NB = (8, 16)
SG_SHARE_SLACK = 1.04


def subgroup_shuffle_size(op) -> int:
    """The subgroup size gemm_sg (and every kernel that shuffles across full subgroups)
    runs in on ``op``'s device (``op``: an operator's, a probe's, or the device itself), else
    0: the device must have subgroup shuffles in compute shaders and guarantee full
    subgroups of a size a pipeline names (``full_subgroups``:
    VK_EXT_subgroup_size_control / Vulkan 1.3 ``computeFullSubgroups``; its pipelines
    require the reported ``subgroupSize``), as the kernel assumes every subgroup has SG
    lanes."""
    ctx = op.ctx if hasattr(op, "ctx") else op.context
    f, lim = ctx.features, ctx.limits
    size = lim["subgroupSize"]
    if not (f.get("subgroup_shuffle") and f.get("full_subgroups")
            and lim["minSubgroupSize"] <= size <= lim["maxSubgroupSize"]):
        return 0
    return size


def gemm_blocks(knobs: dict, cog: int, row: int, vec4: bool, taps: int) -> tuple[int, int]:
    """Register block (output channels MB, pixels NB) of the implicit GEMM.

    CPU drivers run an invocation's registers as SIMD lanes, spilling to cache; on
    lavapipe a 1x1 GEMM (one tap per loaded row) does best with 16 x 16 blocks and a
    kernel with several taps per row (3x3: the row is loaded once for three taps) with
    8 x 8 (the "wide" blocks, the default).  The "narrow" blocks (8 x 4, a tuner
    candidate, knob ``blocks``) suit devices that keep the block in registers.  MB is the
    largest of 16/12/8/4 up to that which wastes at most ~12% of the padded channels; NB
    the pixel count that splits the row most evenly (a multiple of 4 where rows are read
    as float4).
    """
    wide = knobs["blocks"] == "wide"
    mb_max, nb_max = ((16, 16) if taps <= 1 else (8, 8)) if wide else (8, 4)
    mb = next((m for m in (16, 12, 8, 4) if m <= mb_max
               and cog / (ceil_div(cog, m) * m) >= 0.88), 4)
    if row <= nb_max and not vec4:
        return mb, max(1, row)
    step = 4 if vec4 else 1
    cands = range(max(step, (nb_max // 2) // step * step), nb_max + 1, step)
    return mb, min(cands, key=lambda nb: ((ceil_div(row, nb)) * nb - row, -nb))


def sg_span(phases, nb: int) -> int:
    """The input elements a lane of the SG GEMM loads into registers per row tap (its
    pixels' and column taps' reach), the longest over the phases."""
    return max((nb - 1) * ph[2].istep + (ph[2].taps[-1][1] - ph[2].taps[0][1] if ph[2].taps
                                          else 0) + 1 for ph in phases)


def sg_blocks(cog: int, phases, row_len, flat: bool, sg: int,
              span_max: int | None = None, share: bool = False,
              mb_max: int | None = None, skew: bool = False) -> tuple[int, int]:
    """Register block (MB, NB) of the SG GEMM.  Its lanes pad each channel block's pixel
    blocks to whole subgroups, and each weight a lane gets costs a shuffle (on lavapipe
    about SG_SHUFFLE_COST FMAs of the block's, i.e. NB + 6 per weight).  NB is the pixel
    count (4..16) that minimizes padded lanes x (NB + 6) (:func:`sg_cost`), rows read
    (and a flattened plane's pixels stored) as float4 where they can (SG_SCALAR_COST; a
    flattened plane not of whole float4s can nowhere), with at most SG_ACC accumulators
    (SG_ACC_FLAT on a flattened plane of whole float4s, ``share`` apart);
    with ``share`` (a strided 1x1), one of SG_SHARED_NB where it costs within
    SG_SHARE_SLACK (fewer pipelines).  The unrolled body (MB x NB x column taps
    products a channel) stays within GEMM_UNROLL, MB giving
    way first (each weight's shuffle pays off over NB pixels; a body past the
    instruction cache runs at half the speed).  ``span_max`` (knob ``sg_span``): NB kept to pixels whose row span
    (:func:`sg_span`) fits it (a long strided reach, the 7x7 stride-2 stem's, holds fewer
    registers), at least 4.  ``mb_max`` (knob ``sg_mb``): MB kept to at most that many
    output channels.  ``skew``: a flattened plane of no whole float4s is read as float4s
    all the same (the kernel's XSKEW), where NB is a multiple of 4 (its stores still go
    element by element)."""
    kw = max([len(ph[2].taps) for ph in phases] + [1])
    fits = [m for m in (16, 12, 8, 4) if m <= min(SG_BLOCKS[0], mb_max or SG_BLOCKS[0])
            and cog / (ceil_div(cog, m) * m) >= 0.88] or [4]
    mb = next((m for m in fits if m * SG_BLOCKS[1] * kw <= GEMM_UNROLL), fits[-1])
    acc = (SG_ACC_FLAT if flat and not share and all(r % 4 == 0 for r in row_len)
           else SG_ACC)
    nb_max = max(4, min(SG_BLOCKS[1], GEMM_UNROLL // (mb * kw), acc // mb))
    if span_max is not None:
        nb_max = max([4] + [n for n in range(4, nb_max + 1) if sg_span(phases, n) <= span_max])
    costs = {nb: sg_cost(phases, row_len, flat, sg, nb, skew) for nb in range(4, nb_max + 1)}
    best = min(costs.values())
    shared = [nb for nb in SG_SHARED_NB if share and nb in costs
              and costs[nb] <= best * SG_SHARE_SLACK]
    if shared:
        return mb, min(shared, key=lambda nb: (costs[nb], -nb))
    return mb, max(nb for nb, c in costs.items() if c == best)


def sg_cost(phases, row_len, flat: bool, sg: int, nb: int, skew: bool = False) -> int:
    """The modelled cost of :func:`sg_blocks`' NB-pixel blocks: padded lanes x (NB +
    SG_SHUFFLE_COST, + SG_SCALAR_COST where the block's pixels are not whole float4s;
    ``skew``: a flattened plane's rows are, for NB a multiple of 4)."""
    cost = 0
    for ph, rl in zip(phases, row_len):
        per_row = ceil_div(rl, nb)
        blocks = (ph[0].count * (1 if flat else ph[1].count)) * per_row
        # (a flattened plane of no whole float4s, 7x7's 49 pixels, stores none as
        # float4s and loads them only with ``skew``: without it the fewest padded pixels
        # win, 7-pixel blocks, not 8)
        v4 = ((nb * ph[2].istep) % 4 == 0 or per_row == 1) and not (flat and rl % 4
                                                                     and not skew)
        scalar = SG_SCALAR_COST[flat and rl % 4 == 0]
        cost += ceil_div(blocks, sg) * sg * (nb + SG_SHUFFLE_COST + (0 if v4 else scalar))
    return cost


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
            phases.append(Axis(p, s, ceil_div(out - p, s), 1, sorted(taps, key=lambda t: t[1])))
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


def subsampled(geo: Geometry) -> Geometry | None:
    """A forward 1x1 convolution with strides and no start padding (ResNet's downsample
    shortcuts) as the 1x1 stride-1 convolution of the input's strided view: the pixels
    its outputs read, every stride-th one.  The GEMM then re-lays only those (1/stride^2
    of the input) into dense planes and reads them as contiguous float4 rows of one
    flattened plane, instead of the whole input re-laid and every stride-th element of
    it read one at a time in rows as short as the output's.  None where it does not
    apply (a stride of 1, another kernel, start padding, outputs past the input)."""
    if (geo.backward or not geo.plain or geo.kernel != (1, 1, 1) or geo.stride == (1, 1, 1)
            or geo.start != (0, 0, 0) or geo.valid != geo.out_size
            or any((v - 1) * s >= i for v, s, i in zip(geo.valid, geo.stride, geo.in_size))):
        return None
    xs = geo.x_strides
    return dataclasses.replace(geo, in_size=geo.valid, stride=(1, 1, 1), dilation=(1, 1, 1),
                               x_strides=(*xs[:2], *(v * s for v, s in zip(xs[2:], geo.stride))))


def whole_vec4(values) -> list:
    """``values`` padded with zeros to whole 4-vectors (an ``ivec4[]`` member filled
    flat, 4 values an element)."""
    return list(values) + [0] * (-len(values) % 4)


#: Split-K (knob ``split_k``): the fewest products a slice of the reduction keeps (input
#: channels x taps) for the fast list to offer a split (choice.py): below it the
#: partials' store and second pass cost more than the shorter loop saves.
SPLIT_MIN_SLICE_K = 64


def split_cu(cu: int, channels: int, slices: int) -> int:
    """The CU (input channels a loop iteration, :func:`gemm_cu`) of a split reduction:
    halved while the channels hold fewer than ``slices`` groups of it (slices are whole
    CU groups), so a layer of few channels still splits."""
    while slices > 1 and cu > 1 and channels // cu < slices:
        cu //= 2
    return cu


def split_slices(units: int, slices: int) -> int:
    """Slices of ``units`` CU groups for a requested ``slices``: at most that many and
    no empty one (units 10, slices 4: 3 + 3 + 3 + 1; units 5: 2 + 2 + 1)."""
    slices = max(1, min(slices, units))
    return ceil_div(units, ceil_div(units, slices))


class SplitK:
    """The second pass of a split reduction (``convolution_partials.comp``): the GEMM's
    ``ks`` slices stored float32 partial sums as [image][slice][channel][pixel]; this
    adds them, the bias and a graph's residual, applies the activation and stores through
    the output's strides.  ``geo``: the convolution's own geometry (output strides)."""

    LOCAL = 64

    def __init__(self, path: "GemmPath", geo: Geometry, ks: int):
        op = path.op
        self.ks = ks
        self.plane = math.prod(geo.out_size)
        self.part_bytes = 4 * geo.n * ks * geo.c_out * self.plane
        if self.part_bytes > op.ctx.limits["maxStorageBufferRange"]:
            raise Declined("the split partials exceed maxStorageBufferRange")
        self.part = op.scratch(self.part_bytes)
        kernel = "convolution_partials_" + storage_suffix(op, geo.dtype) + path.out_res
        self.params = op.upload(np.frombuffer(pack(
            kernel, "Params", size=(*geo.out_size, self.plane),
            chans=(geo.c_out, int(geo.b_stride is not None), geo.b_stride or 0, 0),
            ys=geo.y_strides[:4], ys_w=(geo.y_strides[4], 0, 0, 0), act=path.act_params),
            np.uint8))
        y_bytes = op.desc.output_tensor.total_tensor_size_in_bytes
        binds = (Buf(self.part, self.part_bytes), Buf("b", absent=self.part),
                 Buf("y", y_bytes, "w"), Buf(self.params)) + (
                     (Buf("r", y_bytes),) if path.out_res else ())
        consts = {"LOCAL_SIZE_X": self.LOCAL, "ACT": path.out_act, "KS": ks}
        _, my, mz = op.ctx.limits["maxComputeWorkGroupCount"]
        self.steps = [Step(kernel, consts, (ceil_div(self.plane, self.LOCAL), nc, nn), binds,
                           dict(c0=c0, n0=n0))
                      for c0, nc in pieces(geo.c_out, my) for n0, nn in pieces(geo.n, mz)]

    @staticmethod
    def strides(geo: Geometry, ks: int) -> tuple:
        """The partials' element strides (n, c, d, h, w) as the GEMM stores them: an
        image's stride spans its ``ks`` slices (the kernel adds slice x stride / KS)."""
        d, h, w = geo.out_size
        return (ks * geo.c_out * d * h * w, d * h * w, h * w, w, 1)


def gemm_workgroups(op, geo: Geometry) -> int:
    """The workgroups of the implicit GEMM's dispatches as ``gemm`` plans them by
    default, without building it (nothing allocated; ``op`` need only have what
    ``accepts`` reads): whether a split reduction could fill a wide device."""
    plan = GemmPath.__new__(GemmPath)
    Path.__init__(plan, op, geo)
    plan.subsampled = subsampled(geo)
    plan.geo = plan.subsampled or geo
    plan._plan_grid()
    return plan.geo.n * sum(gx * gy for gx, gy, _ in map(plan._grid, plan.dispatches))


@dataclass
class Planes:
    """The implicit GEMM's shape for a geometry: the dispatches' axes (``phases``), the
    zero-padded input planes (padding ``lo`` before the input, extents ``Dp, Hp, Wp``;
    an in-place input's own), whether output planes are flattened into rows (``flat``,
    rows ``row_len`` pixels long), the register block ``mb x nb`` and the padded output
    channels ``co_pad``, the input's image and channel strides in the GEMM's input."""

    phases: list
    lo: list
    dp: int
    hp: int
    wp: int
    in_place: bool
    flat: bool
    row_len: list
    mb: int
    nb: int
    co_pad: int
    x_img: int
    x_chan: int
    #: rows read as float4 texels though the channel stride is not whole ones (XSKEW)
    skew: bool = False


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

    With knob ``split_k`` (S) the input channels are split into up to S slices of whole
    CU groups (workgroup z: image x slices + slice), each storing float32 partials
    without bias or activation, and :class:`SplitK` adds them and applies the output
    pass: S times the workgroups, each walking 1/S of the reduction.

    The constructor plans (:meth:`_planes`, :meth:`_dispatches`, the re-layouts, the
    kernels, the parameter block, :meth:`_steps`); ``encode`` records the plan.
    :class:`~.gemm_sg.GemmSgPath` overrides the hooks marked "(gemm_sg overrides)".
    """

    name = "gemm"
    RESIDUAL = True
    #: The kernel family (gemm_sg: ``gemm_sg``).
    FAMILY = "gemm"

    @classmethod
    def accepts(cls, op, geo, knobs=None) -> bool:
        k = knobs_of(knobs)
        if not k["subsample"] and subsampled(geo) is None:
            return False             # (the candidate without it: only where it differs)
        lim = op.ctx.limits
        if k["split_k"] and not (geo.cin_per_group >= 2 and
                                 k["split_k"] <= lim["maxComputeWorkGroupCount"][2]):
            return False             # (the split runs along the input channels)
        rows = geo.kernel[0] * geo.kernel[1]
        if geo.backward:
            rows = ceil_div(geo.kernel[0], geo.stride[0]) * ceil_div(geo.kernel[1], geo.stride[1]) \
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
        planes = geo.n * geo.c_in * math.prod(ext[:2]) * (ceil_div(ext[2], 4) * 4)
        work = (geo.n * geo.c_in * math.prod(geo.in_size)
                + geo.n * geo.c_out * math.prod(geo.out_size))
        return planes <= 4 * work + (1 << 16)

    def __init__(self, op, geo, knobs=None):
        super().__init__(op, geo, knobs)
        #: the strided view's geometry where it runs on one (:func:`subsampled`)
        self.subsampled = subsampled(geo) if self.knobs["subsample"] else None
        geo = self.geo = self.subsampled or geo
        #: split-K (knob ``split_k``): the slices asked for; the GEMM then stores raw
        #: float32 partials (no bias, activation or residual: :class:`SplitK` applies
        #: them), planned on their packed strides
        self.split = self.knobs["split_k"] or 1
        self.out_geo, self.out_res, self.out_act = geo, self.res, self.act_id
        if self.split > 1:
            geo = self.geo = dataclasses.replace(geo, b_stride=None,
                                                 y_strides=SplitK.strides(geo, 1))
            self.res, self.act_id = "", 0
        pl, (row_offsets, w_texels, max_read) = self._plan_grid()
        self._check_dispatches()
        if len(row_offsets) > 1024:
            raise UnsupportedError("convolution", "more than 1024 kernel rows")
        g = geo
        last = (g.n - 1) * pl.x_img + (g.c_in - 1) * pl.x_chan + max_read
        self.xp_floats = max(last + 1, g.n * pl.x_img)
        self.x_bytes = 4 * self.xp_floats
        self.x_relayout, self.xp = None, None
        if not pl.in_place:
            self.x_relayout = self._input_relayout(pl)
            self.xp = op.scratch(self.x_bytes)
        self.w_relayouts = self._filter_relayouts(pl)
        self.texel = self._storage(w_texels)
        kernel = self._kernel_name()
        self._stores(kernel)
        self.sc = self._scale_suffix(kernel)
        self.takes_scale = bool(self.sc)
        self.ks, self.partials = 1, None
        if self.split > 1:
            units = min(g.cin_per_group // self._cu(d["kw"]) for d in self.dispatches)
            self.ks = split_slices(units, self.split)
            if self.ks < 2:
                raise Declined("too few input channels to split")
            self.partials = SplitK(self, self.out_geo, self.ks)
            self.geo = g = dataclasses.replace(g, y_strides=SplitK.strides(g, self.ks))
        self.params = op.upload(np.frombuffer(pack(kernel, "Params", **self._params(
            pl, row_offsets)), np.uint8))
        for d in self.dispatches:
            d["kernel"] = (kernel + "_v8" if d["yv8"] else kernel) + self.res + self.sc
            d["constants"] = self._constants(d)
        self.filter_steps = compiled(op, [s for rl, off in self.w_relayouts
                                          for s in rl.steps("w", self.wt, off)])
        x_steps = [] if pl.in_place else self.x_relayout.steps("x", self.xp)
        self.x_steps = len(x_steps)
        self.steps = compiled(op, x_steps + self._steps()
                              + (self.partials.steps if self.partials else []))

    # -- the plan ---------------------------------------------------------------------
    def _plan_grid(self) -> tuple:
        """The plan up to the dispatch grids (``local``, ``sg``, ``planes``, the block,
        ``dispatches``, ``groups_y``): ``(planes, what _dispatches returns)``.  It
        allocates nothing, so :func:`gemm_workgroups` runs it alone."""
        self.local = min(64, CompiledOperator.workgroup_size.fget(self.op))
        self.sg = self._subgroup()
        pl = self.planes = self._planes()
        self.in_place, self.mb, self.nb = pl.in_place, pl.mb, pl.nb
        found = self._dispatches(pl)
        self.groups_y = self.geo.groups * pl.co_pad // pl.mb
        return pl, found

    def _subgroup(self) -> int:
        """The subgroup size the GEMM's pipelines require (0: none; gemm_sg overrides)."""
        return 0

    def _skews(self, in_place: bool, flat: bool) -> bool:
        """Whether rows may be read as float4 texels on a channel stride of no whole
        ones (the kernel's XSKEW; gemm_sg overrides)."""
        return False

    def _blocks(self, phases, row_len, flat, skew=False) -> tuple[int, int]:
        """The register block (MB, NB) (gemm_sg overrides)."""
        unit = all(ph[2].istep == 1 for ph in phases)
        return gemm_blocks(self.knobs, self.geo.cout_per_group, max(row_len),
                           unit and self.knobs["blocks"] == "wide",
                           max(len(ph[2].taps) for ph in phases))

    def _flat_short_rows(self) -> bool:
        """Whether short output rows are flattened into planes (gemm_sg instead fills its
        subgroups with short rows, see sg_blocks; it overrides)."""
        return True

    def _planes(self) -> Planes:
        """The axes, padded planes, flattening and register block (:class:`Planes`)."""
        g = self.geo
        phases = transposed_axes(g) if g.backward else forward_axes(g)
        lo, ext = padded_extents(g, phases)
        one_by_one = (not g.backward and g.kernel == (1, 1, 1) and g.stride == (1, 1, 1)
                      and g.start == (0, 0, 0) and g.valid == g.in_size)
        in_place = (one_by_one and g.dtype == DataType.FLOAT32 and self.subsampled is None
                    and self.op.desc.input_tensor.is_packed)
        # flattened planes keep lanes busy on short rows, but compute the padding columns too
        flat = (not g.backward and g.stride[1:] == (1, 1)
                and (one_by_one or (g.valid[2] < 12 and g.valid[1] > 1
                                    and self._flat_short_rows())))
        if in_place:
            ext = list(g.in_size)
        dp, hp, wp = ext
        if not in_place:
            wp = ceil_div(wp, 4) * 4          # float4-aligned rows
        plane = dp * hp * wp
        row_len = [g.valid[1] * wp if flat else ph[2].count for ph in phases]
        skew = self._skews(in_place, flat)
        mb, nb = self._blocks(phases, row_len, flat, skew)
        return Planes(phases, lo, dp, hp, wp, in_place, flat, row_len, mb, nb,
                      ceil_div(g.cout_per_group, mb) * mb,
                      g.x_strides[0] if in_place else ceil_div(g.c_in * plane, 4) * 4,
                      g.x_strides[1] if in_place else plane, skew)

    def _dispatches(self, pl: Planes) -> tuple[list, int, int]:
        """``self.dispatches``: one per phase (a dict: its q extents, output origin, row
        taps, first weight texel, pitch, column taps, float4 rows, axes); returns the
        row-tap offsets of them all, the re-laid filter's texels and the furthest input
        element a block reads past an image's channel."""
        g, nb = self.geo, pl.nb
        hp, wp = pl.hp, pl.wp
        self.dispatches = []
        row_offsets, w_texels, max_read = [], 0, 0
        for ph, rl in zip(pl.phases, pl.row_len):
            ad, ah, aw = ph
            rows = [(cd + pl.lo[0]) * hp * wp + (ch + pl.lo[1]) * wp + aw.taps[0][1] + pl.lo[2]
                    for _, cd in ad.taps for _, ch in ah.taps] if aw.taps else []
            kw = max(1, len(aw.taps))
            dw = aw.taps[1][1] - aw.taps[0][1] if len(aw.taps) > 1 else 1
            per_row = ceil_div(rl, nb)
            qsize = (ad.count, 1, rl, per_row) if pl.flat else (ad.count, ah.count, aw.count,
                                                                 per_row)
            span = (nb - 1) * aw.istep + (kw - 1) * dw + 1
            rowload = span <= kw * nb          # as ROWLOAD in the kernel
            # (channels off whole texels only where each loop iteration's first one is
            # on one: XSKEW)
            skew = pl.x_chan % 4 if pl.skew and self._cu(kw) % 4 == 0 else 0
            xvec4 = (rowload and ((nb * aw.istep) % 4 == 0 or per_row == 1)
                     and pl.x_img % 4 == 0 and (pl.x_chan % 4 == 0 or skew)
                     and all(r % 4 == 0 for r in rows)
                     and (ad.count == 1 or (ad.istep * hp * wp) % 4 == 0)
                     and (pl.flat or (ah.istep * wp) % 4 == 0))   # (flat: one q row)
            if rows:
                max_read = max(max_read, max(rows) + (qsize[0] - 1) * ad.istep * hp * wp
                               + (qsize[1] - 1) * ah.istep * wp
                               + (per_row * nb - 1) * aw.istep + (kw - 1) * dw
                               + (ceil_div(span, 4) * 4 - span))
            self.dispatches.append(dict(
                qsize=qsize, yorg=(ad.o0, ah.o0, aw.o0, len(row_offsets)), nrows=len(rows),
                w_base=w_texels, pitch=wp if pl.flat else 0, sw=aw.istep, kw=kw, dw=dw,
                xvec4=xvec4, xskew=skew if xvec4 else 0, axes=ph))
            row_offsets += rows
            w_texels += g.groups * len(rows) * g.cin_per_group * kw * pl.co_pad // 4
        self.w_texels = w_texels
        return row_offsets, w_texels, max_read

    def _check_dispatches(self) -> None:
        """Declined where the kernel cannot run the dispatches (gemm_sg overrides)."""

    def _input_relayout(self, pl: Planes) -> Relayout:
        """The copy of the input into the zero-padded planes."""
        g, lo = self.geo, pl.lo
        xs = g.x_strides
        return Relayout(
            self.op, g.dtype, (g.n, g.c_in, pl.dp, pl.hp, pl.wp), xs, (0, 0, *lo),
            (g.n, g.c_in, lo[0] + g.in_size[0], lo[1] + g.in_size[1], lo[2] + g.in_size[2]),
            -(lo[0] * xs[2] + lo[1] * xs[3] + lo[2] * xs[4]),
            self.op.desc.input_tensor.total_tensor_size_in_bytes,
            self.knobs["relayout_groups"], dst_image=pl.x_img)

    def _filter_relayouts(self, pl: Planes) -> list:
        """[(pass, first element)]: the filter into the GEMM's order, the transpose where
        it applies, else one re-layout per dispatch (gemm_sg overrides: none)."""
        g, op = self.geo, self.op
        self.wt = op.scratch(16 * max(self.w_texels, 1))
        if FilterTranspose.applies(op, g):
            return [(FilterTranspose(op, g, pl.co_pad), 0)]
        return [(self._filter_relayout(d["axes"], pl.co_pad), d["w_base"] * 4)
                for d in self.dispatches if d["nrows"]]

    def _filter_relayout(self, axes, co_pad: int) -> Relayout:
        """One dispatch's filter taps as [group][kd][kh][channel][kw][padded channel]."""
        g = self.geo
        ws = g.w_strides
        cig, cog = g.cin_per_group, g.cout_per_group
        if g.backward:       # filter (C_in, C_out/groups, *k)
            group_stride, chan, outc = cig * ws[0], ws[0], ws[1]
        else:                # filter (C_out, C_in/groups, *k)
            group_stride, chan, outc = cog * ws[0], ws[1], ws[0]
        base, kst = 0, []
        for a in range(3):
            ks = [k for k, _ in axes[a].taps]
            if g.flip:
                ks = [g.kernel[a] - 1 - k for k in ks]
            step = ks[1] - ks[0] if len(ks) > 1 else 0
            base += ks[0] * ws[2 + a]
            kst.append((len(ks), step * ws[2 + a]))
        sizes = [g.groups, kst[0][0], kst[1][0], cig, kst[2][0], co_pad]
        strides = [group_stride, kst[0][1], kst[1][1], chan, kst[2][1], outc]
        return Relayout(self.op, g.dtype, sizes, strides, (0,) * 6, sizes[:5] + [cog], base,
                        self.op.desc.filter_tensor.total_tensor_size_in_bytes,
                        self.knobs["relayout_groups"])

    def _scale_suffix(self, kernel: str) -> str:
        """``"_sc"`` where the descriptor has an input scale (a graph's fusion,
        ``epilogue.py``) and this plan's kernel multiplies by it: float32 through texel
        views, the input read in place (no padded copy: a zero of the padding times an
        infinite scale would be NaN where the unfused pair has 0); else ""."""
        sc = input_scale_of(self.op.desc)
        if (sc is None or not self.planes.in_place or kernel not in SCALE_KERNELS
                or not texel_ok(self.op, sc.total_tensor_size_in_bytes // 4)):
            return ""
        return "_sc"

    def _storage(self, w_texels: int) -> bool:
        """Whether the operands are read through texel views (float4 rows only then;
        gemm_sg overrides)."""
        texel = texel_ok(self.op, self.xp_floats) and texel_ok(self.op, w_texels)
        if not texel:
            for d in self.dispatches:
                d["xvec4"], d["xskew"] = False, 0
        return texel

    def _kernel_name(self) -> str:
        """The GEMM's variant (a split reduction's stores float32 partials whatever the
        tensors' type: its operands are float32 planes or read as texels either way)."""
        storage = "f32" if self.split > 1 else storage_suffix(self.op, self.geo.dtype)
        return variant(self.FAMILY, storage, self.texel)

    def _stores(self, kernel: str) -> None:
        """Each dispatch's output stores: 4 pixels a store (``yv4``), 8 (``yv8``, knob
        ``store64``; None: the device's measured store width, store_width.py)."""
        wide = self.knobs.get("store64")
        for d in self.dispatches:
            d["yv4"] = self._yv4(d)
        v8_ok = [self._yv8(d, kernel) for d in self.dispatches]
        if wide and not any(v8_ok):
            raise Declined("u64vec4 output stores need int64 shaders, float32 through "
                           "texel views and output rows (a flattened plane of packed "
                           "rows: the plane) in whole groups of 8")
        if wide is None and any(v8_ok):
            wide = wide_stores(self.op.device)
        for d, v8 in zip(self.dispatches, v8_ok):
            d["yv8"] = bool(wide and v8)

    def _constants(self, d) -> dict:
        """A dispatch's specialization constants (gemm_sg adds its own)."""
        consts = {"LOCAL_SIZE_X": self.local, "MB": self.mb, "NB": self.nb, "SW": d["sw"],
                  "ACT": self.act_id, "XVEC4": int(d["xvec4"]), "KW": d["kw"], "DW": d["dw"],
                  "CU": self._cu(d["kw"])}
        if d["yv4"]:
            consts["YV4"] = 1
        if self.ks > 1:
            consts["KS"] = self.ks
        return consts

    def _cu(self, kw: int) -> int:
        """Input channels a loop iteration (:func:`gemm_cu`; a split's, :func:`split_cu`)."""
        cig = self.geo.cin_per_group
        return split_cu(gemm_cu(self.knobs, cig, self.mb * self.nb * kw), cig, self.split)

    def _params(self, pl: Planes, row_offsets) -> dict:
        """The kernel's ``Params`` by member (gemm_sg adds the filter's strides)."""
        g = self.geo
        ph0 = pl.phases[0]
        return dict(
            chans=(g.cin_per_group, pl.co_pad, g.cout_per_group, 0),
            xs=(pl.x_img, pl.x_chan, ph0[0].istep * pl.hp * pl.wp, ph0[1].istep * pl.wp),
            ysz=(*g.out_size, int(g.b_stride is not None)),
            ystep=(ph0[0].ostep, ph0[1].ostep, ph0[2].ostep, g.b_stride or 0),
            ys=g.y_strides[:4], ys_w=(g.y_strides[4], 0, 0, 0), act=self.act_params,
            rows=whole_vec4(row_offsets))

    def _grid(self, d) -> tuple[int, int, int]:
        """(x, y) workgroups of a dispatch and the channel blocks spread over its lanes
        (few pixel blocks: lanes stay busy; gemm_sg overrides)."""
        qs = d["qsize"]
        blocks = qs[0] * qs[1] * qs[3]
        cbl = max(1, min(self.groups_y, (4 * self.local) // blocks))
        return ceil_div(blocks * cbl, self.local), ceil_div(self.groups_y, cbl), cbl

    def _filter_bind(self) -> Buf:
        """The GEMM's filter binding: the re-laid filter (gemm_sg overrides: in place)."""
        return Buf(self.wt, None, "r", runtime.FORMAT_RGBA32_SFLOAT if self.texel else 0)

    def _steps(self) -> list[Step]:
        """The GEMM dispatches (images split within maxComputeWorkGroupCount)."""
        g = self.geo
        src = "x" if self.in_place else self.xp
        y_bytes = self.op.desc.output_tensor.total_tensor_size_in_bytes
        y = Buf("y", y_bytes, "w")
        if self.partials:
            y = Buf(self.partials.part, self.partials.part_bytes, "w")
        tail = (Buf("b", absent=self.params), y, Buf(self.params)) + (
            (Buf("r", y_bytes),) if self.res else ())
        scale = {}
        if self.sc:
            sd = input_scale_of(self.op.desc)
            tail += (Buf("s", sd.total_tensor_size_in_bytes, "r", runtime.FORMAT_R32_SFLOAT,
                         4),)
            scale = dict(sc_n=sd.element_strides[0], sc_c=sd.element_strides[1])
        mz = self.ctx.limits["maxComputeWorkGroupCount"][2]
        steps = []
        for d in self.dispatches:
            align = 16 if d["xvec4"] else 4
            if not self.texel:
                xb = Buf(src, self.x_bytes)
            else:
                fmt = runtime.FORMAT_RGBA32_SFLOAT if d["xvec4"] else runtime.FORMAT_R32_SFLOAT
                xb = (Buf(src, self.x_bytes, "r", fmt, align) if self.in_place
                      else Buf(src, self.x_bytes - self.x_bytes % align, "r", fmt))
            gx, gy, cbl = self._grid(d)
            for n0, nn in pieces(g.n, mz // self.ks):
                steps.append(Step(d["kernel"], d["constants"], (gx, gy, nn * self.ks),
                                  (xb, self._filter_bind()) + tail, dict(
                                      qsize=d["qsize"], yorg=d["yorg"], nrows=d["nrows"],
                                      w_base=d["w_base"], x_base=0, y_base=0, n0=n0,
                                      pitch=d["pitch"], cbl=cbl, cb_count=self.groups_y,
                                      **scale),
                                  self.sg))
        return steps

    # -- output stores ---------------------------------------------------------------
    def _linear_rows(self, d) -> bool:
        """Whether a flattened dispatch's output rows lie packed one after the other
        (pitch = output width = the row stride, unit pixel stride): its pixels' offsets
        then run on across rows, so a group of 4 (8) pixels is one store wherever the
        plane holds whole groups, whatever the row width (a 1x1 convolution's 14x14 and
        28x28 planes, whose rows alone are not whole groups of 4 / 8)."""
        g = self.geo
        ys = g.y_strides
        return bool(d["pitch"]) and d["pitch"] == g.out_size[2] == ys[3] and ys[4] == 1

    def _groups_of(self, d, k: int) -> bool:
        """Whether a dispatch's pixels lie in aligned groups of ``k`` that exist whole or
        not at all: its rows (or, :meth:`_linear_rows`, its flattened plane) and the
        strides between them multiples of ``k``."""
        g = self.geo
        ys = g.y_strides
        if self._linear_rows(d):
            return d["qsize"][2] % k == 0 and all(v % k == 0 for v in ys[:3])
        rows = d["pitch"] if d["pitch"] else d["qsize"][2]
        return rows % k == 0 and g.out_size[2] % k == 0 and all(v % k == 0 for v in ys[:4])

    def _yv4(self, d) -> bool:
        """Whether a dispatch stores its pixels 4 at a time (a float4, or four float16
        halves as one uvec2): output rows packed and aligned, pixels of a block
        consecutive along them, in whole groups of 4 (:meth:`_groups_of`)."""
        g = self.geo
        aw = d["axes"][2]
        return (aw.ostep == 1 and aw.o0 == 0 and g.y_strides[4] == 1 and self.nb % 4 == 0
                and self._groups_of(d, 4)
                and (d["pitch"] == 0 or d["pitch"] == g.out_size[2]))

    def _yv8(self, d, name: str) -> bool:
        """Whether a dispatch can store its pixels 8 at a time (one u64vec4; a block of
        NB = 8a + 4 pixels starting 4 past a group adds a u64vec2): it stores 4 at a time
        (``d["yv4"]``, :meth:`_yv4`), float32 through the texel-view variants on an int64
        device, and its pixels lie in whole groups of 8 (:meth:`_groups_of`)."""
        return (d["yv4"] and self.split == 1 and bool(self.op.features.get("int64"))
                and name in ("convolution_gemm_f32", "convolution_gemm_sg_f32")
                and self._groups_of(d, 8)
                and self.op.desc.output_tensor.total_tensor_size_in_bytes % 32 == 0)

    # -- recording -------------------------------------------------------------------
    def filter_buffer(self):
        return self.wt if self.w_relayouts else None

    def encode_filter(self, seq, w) -> None:
        record(seq, self.op, self.filter_steps, w=w)

    def host_input(self, shape) -> np.ndarray | None:
        """The padded planes' elements the input relayout copies, as a host view shaped
        like the input (:meth:`Relayout.host_view`; ``shape``: the input's sizes), the
        planes' other elements zeroed now; None where the input is read in place or the
        relayout is more than a copy.  Planes a caller writes through it are recorded
        with ``encode(..., laid=True)``."""
        view = None if self.x_relayout is None else self.x_relayout.host_view(self.xp, shape)
        if view is not None:
            self.xp.host[:] = 0
        return view

    def encode(self, seq, x, w, b, y, r=None, s=None, laid: bool = False) -> None:
        """Record the execution; ``laid``: the input's padded planes were written through
        :meth:`host_input`, so its relayout is left out."""
        if not self.filter_ready:
            self.encode_filter(seq, w)
        record(seq, self.op, self.steps[self.x_steps:] if laid else self.steps,
               x=x, w=w, b=b, y=y, r=r, s=s)

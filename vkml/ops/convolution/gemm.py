"""The implicit GEMM (``glsl/convolution_gemm.comp``) and its re-layouts: the
``convolution_relayout`` pass that copies the input into zero-padded planes and the
filter into the GEMM's order, the filter transpose (``convolution_filter.comp``), the
register blocks, the axes of a forward or transposed dispatch, and :class:`GemmPath`,
whose constructor also builds the subgroup variant (``gemm_sg.py``: the filter read in
place and shared by shuffles) and whose kernel Winograd's 36 GEMMs run on."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ... import runtime
from ...dml.data_type import DataType
from ...dml.tensor_desc import packed_strides
from ...errors import UnsupportedError
from ...runtime import Bind
from ..base import CompiledOperator
from ..grid import pieces
from ..store_width import wide_stores
from .geometry import (_STORAGES, Decline, Geometry, Path, _texel_ok, _words, knobs,
                       storage_suffix, variant)
from ...intmath import ceil_div

#: Kernel variants this module requests (see :func:`variant`) and the specialization
#: constants it sets.
_GEMM = ("LOCAL_SIZE_X", "MB", "NB", "SW", "ACT", "XVEC4", "KW", "DW", "CU", "YV4")
VARIANTS = {
    **{f"convolution_relayout_{s}": ("LOCAL_SIZE_X", "V4") for s in _STORAGES + ("texel",)},
    "convolution_filter_texel": ("LOCAL_SIZE_X", "KD", "KH", "KW", "FLIP"),
    **{f"convolution_gemm_{s}{r}": _GEMM for s in _STORAGES for r in ("", "_ssbo")},
    "convolution_gemm_f32_v8": _GEMM,
}


# -- the re-layout pass and the implicit GEMM ----------------------------------------------
RELAYOUT_PARAM_WORDS = 44      # std140: 11 ivec4 (glsl/convolution_relayout.comp)


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
        gx = ceil_div(size[-1] * size[-2], (self.local * (4 if v4 else 1)))
        outer = math.prod(size[:-3])
        # rows of dimension 5 per workgroup: a few hundred workgroups in all (CPU
        # devices: a few dozen, each costs microseconds)
        target = knobs(op)["relayout_groups"]
        self.rpg = max(1, min(size[-3], ceil_div(outer * gx * size[-3], target)))
        groups = ceil_div(size[-3], self.rpg)
        self.gx, self.gz = gx, outer * groups
        p = np.zeros(RELAYOUT_PARAM_WORDS, np.int64)
        p[0:8], p[8:16], p[16:24], p[24:32], p[32:40] = size, stride, lo, hi, dstride
        p[40:43] = base, self.rpg, groups
        self.params = op.upload(_words(p))

    def encode(self, seq, src, dst, dst_offset_elems: int = 0) -> None:
        binds = [Bind(src, 0, self.src_bytes, "r", self.fmt), Bind(dst, 0, None, "w"),
                 Bind(self.params)]
        mx, _, mz = self.op.ctx.limits["maxComputeWorkGroupCount"]
        for x0, nx in pieces(self.gx, mx):
            for z0, nz in pieces(self.gz, mz):
                seq.dispatch(self.pipe, binds, (nx, 1, nz), np.array(
                    [0, dst_offset_elems, z0, x0 * self.local], np.uint32).tobytes())


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
        self.grid = (ceil_div(g.groups * co_pad // 4, self.local), self.K // 4, 1)
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


#: SG: most pixels per lane (NB) and a weight's shuffle in FMAs of the block
SG_BLOCKS = (16, 16)
#: SG: most accumulators (MB x NB) a lane holds.  Measured on lavapipe (CPU time, the
#: same process): 16 x 12 against 16 x 16 took the 1x1 256->64 convolution from 50% to
#: 57% of the FMA peak, the 3x3 64->64 from 31-84% (bimodal) to 79%, the float16 one
#: from 72% to 75%, batch 8 from 79% to 80%.  224 (not 192) lets rows of 28 split into
#: two 16 x 14 blocks instead of four 16 x 8 (device time, min of 25): the transposed
#: 4x4 s2 64->32 28x28 1.08-1.18 -> 0.99 ms, the 3x3 64->64 28x28 1.60 -> 1.34 (busy
#: machine; 0.95 both quiet), 128->128 28x28 5.9 -> 5.1; no bench workload's other
#: block changes.
SG_ACC = 224
SG_SHUFFLE_COST = 6
SG_CBW = True


def subgroup_shuffle_size(op: CompiledOperator) -> int:
    """The subgroup size gemm_sg runs in on ``op``'s device, else 0: the device must
    have subgroup shuffles in compute shaders and guarantee full subgroups of a size a
    pipeline names (``full_subgroups``: VK_EXT_subgroup_size_control / Vulkan 1.3
    ``computeFullSubgroups``; its pipelines require the reported ``subgroupSize``), as
    the kernel assumes every subgroup has SG lanes."""
    f, lim = op.ctx.features, op.ctx.limits
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
               and cog / (ceil_div(cog, m) * m) >= 0.88), 4)
    if row <= nb_max and not vec4:
        return mb, max(1, row)
    step = 4 if vec4 else 1
    cands = range(max(step, (nb_max // 2) // step * step), nb_max + 1, step)
    return mb, min(cands, key=lambda nb: ((ceil_div(row, nb)) * nb - row, -nb))


def sg_blocks(cog: int, phases, row_len, flat: bool, sg: int) -> tuple[int, int]:
    """Register block (MB, NB) of the SG GEMM.  Its lanes pad each channel block's pixel
    blocks to whole subgroups, and each weight a lane gets costs a shuffle (measured on
    lavapipe: ~6 FMAs of the block's, i.e. NB + 6 per weight).  NB is the pixel count
    (4..16) that minimizes padded lanes x (NB + 6), rows read as float4 where they can,
    with at most SG_ACC accumulators.  The unrolled body (MB x NB x column taps products
    a channel) stays within GEMM_UNROLL, MB giving way first (each weight's shuffle pays off over NB pixels):
    measured on lavapipe, the 7x7 stride-2 3->64 convolution ran at 28% of the FMA peak
    with 16 x 16 blocks (1792 products a body), 50% with 16 x 8 and 54% with 8 x 16."""
    kw = max([len(ph[2].taps) for ph in phases] + [1])
    fits = [m for m in (16, 12, 8, 4) if m <= SG_BLOCKS[0]
            and cog / (ceil_div(cog, m) * m) >= 0.88] or [4]
    mb = next((m for m in fits if m * SG_BLOCKS[1] * kw <= GEMM_UNROLL), fits[-1])
    nb_max = max(4, min(SG_BLOCKS[1], GEMM_UNROLL // (mb * kw), SG_ACC // mb))
    best = None
    for nb in range(4, nb_max + 1):
        cost = 0
        for ph, rl in zip(phases, row_len):
            per_row = ceil_div(rl, nb)
            blocks = (ph[0].count * (1 if flat else ph[1].count)) * per_row
            v4 = (nb * ph[2].istep) % 4 == 0 or per_row == 1
            cost += ceil_div(blocks, sg) * sg * (nb + SG_SHUFFLE_COST + (0 if v4 else 4))
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
            Wp = ceil_div(Wp, 4) * 4          # float4-aligned rows
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
        co_pad = ceil_div(cog, mb) * mb
        x_img = g.x_strides[0] if in_place else ceil_div(g.c_in * plane, 4) * 4
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
            per_row = ceil_div(rl, nb)
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
                               + (ceil_div(span, 4) * 4 - span))
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
        # eight float32 outputs a store (u64vec4) where the output allows it: knob
        # store64 (None: the device's measured store width, store_width.py)
        wide = knobs(op).get("store64")
        for d in self.dispatches:
            d["yv4"] = self._yv4(d)
        v8_ok = [self._yv8(d, name) for d in self.dispatches]
        if wide and not any(v8_ok):
            raise Decline("u64vec4 output stores need int64 shaders, float32 through "
                          "texel views and output rows in whole groups of 8")
        if wide is None and any(v8_ok):
            wide = wide_stores(op.device)
        for d, v8 in zip(self.dispatches, v8_ok):
            consts = {"LOCAL_SIZE_X": self.local, "MB": mb, "NB": nb, "SW": d["sw"],
                      "ACT": self.act_id, "XVEC4": int(d["xvec4"]), "KW": d["kw"],
                      "DW": d["dw"], "CU": gemm_cu(op, cig, mb * nb * d["kw"])}
            if d["yv4"]:
                consts["YV4"] = 1
            d["yv8"] = bool(wide and v8)
            dname = name + "_v8" if d["yv8"] else name
            if sg:
                consts["SG"] = sg
                blocks = d["qsize"][0] * d["qsize"][1] * d["qsize"][3]
                # channel blocks of the same pixels as subgroups of a workgroup: the
                # input rows stay in cache between them (1x1 256->64: 4.45 -> 4.00 ms CPU)
                cbw = min(self.local // sg, g.groups * co_pad // mb)
                cbw = cbw if SG_CBW and cbw >= 2 else 0
                if cbw and ceil_div(blocks, sg) <= op.ctx.limits["maxComputeWorkGroupCount"][0]:
                    consts["CBW"] = cbw
                    consts["LOCAL_SIZE_X"] = cbw * sg
                d["cbw"] = consts.get("CBW", 0)
            d["pipe"] = (op.ctx.pipelines.variant(dname, consts, subgroup_size=sg) if sg
                         else op.pipeline(dname, consts))
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
        """Whether a dispatch stores its pixels 4 at a time (a float4, or four float16
        halves as one uvec2): output rows packed and aligned, pixels of a block
        consecutive along them, in whole groups of 4."""
        g = self.geo
        ys = g.y_strides
        aw = d["axes"][2]
        rows = d["pitch"] if d["pitch"] else d["qsize"][2]
        return (aw.ostep == 1 and aw.o0 == 0 and ys[4] == 1
                and all(v % 4 == 0 for v in ys[:4]) and self.nb % 4 == 0
                and rows % 4 == 0 and g.out_size[2] % 4 == 0
                and (d["pitch"] == 0 or d["pitch"] == g.out_size[2]))

    def _yv8(self, d, name: str) -> bool:
        """Whether a dispatch can store its pixels 8 at a time (one u64vec4; a block of
        NB = 8a + 4 pixels starting 4 past a group adds a u64vec2): it stores 4 at a time
        (``d["yv4"]``, :meth:`_yv4`), float32 through the texel-view variants on an int64
        device, and rows and strides hold whole groups of 8."""
        g = self.geo
        rows = d["pitch"] if d["pitch"] else d["qsize"][2]
        return (d["yv4"] and bool(self.op.features.get("int64"))
                and name in ("convolution_gemm_f32", "convolution_gemm_sg_f32")
                and rows % 8 == 0 and g.out_size[2] % 8 == 0
                and all(v % 8 == 0 for v in g.y_strides[:4])
                and self.op.desc.output_tensor.total_tensor_size_in_bytes % 32 == 0)

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
                gx, gy = ceil_div(blocks, sg), ceil_div(self.groups_y, d["cbw"])
            else:
                if sg:                   # whole subgroups per channel block
                    blocks = ceil_div(blocks, sg) * sg
                # few pixel blocks: spread channel blocks over the lanes too
                cbl = max(1, min(self.groups_y, (4 * self.local) // blocks))
                gx = ceil_div(blocks * cbl, self.local)
                gy = ceil_div(self.groups_y, cbl)
            for n0, nn in pieces(g.n, mz):
                push = np.array([*qs, *d["yorg"], d["nrows"], d["w_base"], 0, 0, n0,
                                 d["pitch"], cbl, self.groups_y], np.int32)
                seq.dispatch(d["pipe"], binds, (gx, gy, nn), push.tobytes())


def gemm_params(geo4, xs4, ysz4, ystep4, ys4, ys_w: int, act_params, rows) -> np.ndarray:
    """The parameter block of ``convolution_gemm.comp`` (see its ``Params``)."""
    words = np.zeros(GEMM_PARAM_WORDS, np.int32)
    for i, v in enumerate((geo4, xs4, ysz4, ystep4, ys4)):
        words[4 * i:4 * i + 4] = _words(v).view(np.int32)
    words[20] = ys_w
    words[24:28] = np.asarray(act_params, np.float32).view(np.int32)
    words[28:28 + len(rows)] = rows
    return words

"""The Winograd path: F(4x4, 3x3) transforms around 36 GEMMs
(``glsl/convolution_winograd.comp``, the GEMMs on ``convolution_gemm.comp``)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import runtime
from ...dml.convolution import ConvolutionOperatorDesc
from ...dml.data_type import DataType
from ...dml.lp_pooling import LpPooling1OperatorDesc, LpPoolingOperatorDesc
from ...errors import ValidationError
from ...runtime import Bind
from .gemm import (GEMM_PARAM_WORDS, GEMM_SG_PARAM_WORDS, SG_ACC, SG_CBW, Axis, gemm_blocks,
                   gemm_cu, gemm_params, sg_blocks, subgroup_shuffle_size)
from .gemm_sg import GemmSgPath
from ..store_width import wide_stores
from .geometry import (_STORAGES, Decline, Path, _texel_ok, _words, knobs, storage_suffix,
                       variant)
from ...intmath import ceil_div

#: Kernel variants this module requests (see :func:`variant`) and the specialization
#: constants it sets.
VARIANTS = {
    **{f"convolution_winograd_{k}_{s}": ("LOCAL_SIZE_X", "ACT")
       for k in ("weights", "input") for s in _STORAGES + ("texel",)},
    "convolution_winograd_input_texel4": ("LOCAL_SIZE_X", "ACT", "WINO_XO"),
    "convolution_winograd_input_texel4_v8": ("LOCAL_SIZE_X", "ACT", "WINO_XO"),
    **{f"convolution_winograd_output_{s}{r}": ("LOCAL_SIZE_X", "ACT")
       for s in _STORAGES for r in ("", "_ssbo")},
    **{f"convolution_winograd_output_{s}_v4": ("LOCAL_SIZE_X", "ACT") for s in _STORAGES},
    **{f"convolution_winograd_output_{s}_v8": ("LOCAL_SIZE_X", "ACT") for s in _STORAGES},
    **{f"convolution_winograd_gemm_cl{v}": ("LOCAL_SIZE_X", "MB", "NB", "SG") for v in ("", "_v8")},
    **{f"convolution_winograd_output_{s}{r}_pool": ("LOCAL_SIZE_X", "ACT", "P", "SCALE")
       for s in _STORAGES for r in ("", "_ssbo")},
}

WINO_PARAM_WORDS = 36     # std140 (glsl/convolution_winograd.comp)


def pool_rule(conv: ConvolutionOperatorDesc, pool) -> str | None:
    """Why the Winograd output pass cannot absorb LP pooling ``pool`` reading the output
    of ``conv`` (None: it can).  Absorbed exactly: 2x2 windows, stride 2, no padding,
    dilation 1 on 4-D tensors, the pooling reading the convolution's output as written
    (same type, sizes and strides).  F(4x4, 3x3) output tiles are 4x4 and start at
    multiples of 4, so every such window lies inside one tile, and a window inside the
    pooled output reads only convolution outputs inside the convolution's output (an
    odd last row or column is read by no window).  Anything else (other windows or
    strides, padding, dilation) is declined."""
    if not isinstance(pool, (LpPooling1OperatorDesc, LpPoolingOperatorDesc)):
        return "not an LP pooling"
    src, y = pool.input_tensor, conv.output_tensor
    if (src.data_type != y.data_type or src.sizes != y.sizes
            or src.element_strides != y.element_strides):
        return "the pooling does not read the convolution's output as it is written"
    if y.dimension_count != 4 or pool.output_tensor.dimension_count != 4:
        return "not 2-D"
    if (tuple(pool.window_size) != (2, 2) or tuple(pool.strides) != (2, 2)
            or tuple(pool.dilation_values) != (1, 1) or any(pool.start_padding)
            or any(pool.end_padding)):
        return "not a 2x2 window at stride 2 without padding or dilation"
    oh, ow = y.sizes[2:]
    if tuple(pool.output_tensor.sizes) != (*y.sizes[:2], oh // 2, ow // 2):
        return "unexpected pooled sizes"
    py = pool.output_tensor
    if sum((n - 1) * st for n, st in zip(py.sizes, py.element_strides)) >= 1 << 31:
        return "pooled offsets beyond 32-bit indexing"
    return None


def cl_blocks(cout: int, tiles: int, sg: int) -> tuple[int, int]:
    """(MB, NB) of the 36 GEMMs with lanes along output channels (``gemm`` knob "cl"):
    MB (8 or 4) padding the fewest channels once channel blocks fill whole subgroups, the
    larger on a tie; NB a multiple of 4 up to 32 tiles (and SG_ACC accumulators) wasting
    the fewest tiles, the larger on a tie (a 56x56 image's 196 tiles: 8 x 28, none)."""
    mb = min((8, 4), key=lambda m: (ceil_div(ceil_div(cout, m), sg) * sg * m, -m))
    nb = min(range(4, min(32, SG_ACC // mb) + 1, 4),
             key=lambda n: (ceil_div(tiles, n) * n - tiles, -n))
    return mb, nb


@dataclass(frozen=True, eq=False)
class PooledConvolutionDesc:
    """A convolution and the LP pooling that alone reads its output, run as one operator
    (the graph compiler's fusion, ``vkml/ops/graph.py``): the convolution's fields (read
    through), its inputs, the pooling's output."""

    convolution: ConvolutionOperatorDesc
    pooling: object

    OPERATOR_TYPE = "DML_OPERATOR_CONVOLUTION + DML_OPERATOR_LP_POOLING (fused)"

    def __getattr__(self, name):
        if name in ("convolution", "pooling") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.convolution, name)

    def inputs(self):
        return self.convolution.inputs()

    def outputs(self):
        return self.pooling.outputs()

    def validate(self) -> None:
        self.convolution.validate()
        self.pooling.validate()
        why = pool_rule(self.convolution, self.pooling)
        if why is not None:
            raise ValidationError("pooling", why)


class WinogradPath(Path):
    """Winograd F(4x4, 3x3) (``glsl/convolution_winograd.comp``): 3x3, stride 1, dilation 1,
    one group, forward, enough channels for the transforms to pay off.  Per execution:
    the filter transform U = G g G^T, the input transform V = B^T d B (zero padding by
    bounds), 36 GEMMs M = U^T V on ``convolution_gemm.comp`` (a quarter of the direct
    products), and the output transform y = A^T M A with bias and activation.  Results
    differ from the direct sum by rounding (measured: within 1e-5 x sqrt(9 C_in) of the
    float64 result for unit-variance data).  Taken from 32 tiles up: the filter transform
    runs every execution and costs as much as the GEMMs of a few tiles.

    The input transform reads tile rows four elements a fetch where the input rows are
    packed and a multiple of 4 (``x4``: RGBA32F or RGBA16F views, 18 fetches a tile
    instead of 36; lavapipe, 64 channels at 56x56: float32 0.72-0.76 -> 0.49-0.53 ms),
    and the output transform stores a tile row at once where the output rows are
    (``y4``: a float4, or float16's four halves as one uvec2).  The knob ``gemm``: None (the GEMMs
    on ``convolution_gemm.comp``), "sg" (gemm_sg's variant: U read in place as one filter
    per transform point and shared by shuffles; devices with full subgroups) or
    "blocked" (``convolution_blocked.comp``).

    ``pool``: the LP pooling its output pass applies before storing (the operator's
    ``pool_request``, where :func:`pool_rule` accepts it; else None): the output bound is
    then the pooled tensor, a quarter of the stores and no pooling pass."""

    name = "winograd"

    @classmethod
    def accepts(cls, op, geo) -> bool:
        lim = op.ctx.limits
        tiles = geo.n * ceil_div(geo.out_size[1], 4) * ceil_div(geo.out_size[2], 4)
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
        tiles = geo.n * ceil_div(geo.out_size[1], 4) * ceil_div(geo.out_size[2], 4)
        return c >= 64 and tiles >= 49 and tiles * c >= 9000

    def __init__(self, op, geo):
        super().__init__(op, geo)
        g = geo
        d = op.desc
        cin, cout = g.c_in, g.c_out
        OH, OW = g.out_size[1:]
        TH, TW = ceil_div(OH, 4), ceil_div(OW, 4)
        T = g.n * TH * TW
        T4 = ceil_div(T, 4) * 4
        self.T, self.T4 = T, T4
        how = knobs(op).get("gemm")
        sg = subgroup_shuffle_size(op)
        if how is None:
            # the default GEMM: lanes along output channels ("cl") where the device runs
            # full subgroups with shuffles and U and V fit texel views (lavapipe, 64x56x56:
            # 1.0-1.1 ms against the gemm kernel's 1.5-1.8; SwiftShader, 32x24x24: 3.7
            # against 3.5), else the gemm kernel ("winograd-gemm" forces it)
            fits = False
            if sg:
                mb_ = cl_blocks(cout, T, sg)[0]
                fits = (_texel_ok(op, 36 * cin * (ceil_div(T, 8) * 8) + T + 32)
                        and _texel_ok(op, 36 * cin * ceil_div(cout, mb_) * mb_))
            how = "cl" if fits else "gemm"
        self.how = how
        self.sg = sg if how in ("sg", "cl") else 0
        if how in ("sg", "cl") and not self.sg:
            raise Decline(f"no full subgroups with shuffles for the 36 GEMMs ({how})")
        self.cl = None
        if how == "cl":  # lanes along output channels (the gemm pass of this kernel)
            mb, nb = cl_blocks(cout, T, self.sg)
            self.cl = (mb, nb)
        elif self.sg:    # gemm_sg's register block: one tap, one row of T tiles per GEMM
            mb, nb = sg_blocks(cout, [[Axis(0, 1, 1, 1, [(0, 0)]), Axis(0, 1, 1, 1, [(0, 0)]),
                                       Axis(0, 1, T, 1, [(0, 0)])]], [T], False, self.sg)
        else:
            mb, nb = gemm_blocks(op, cout, T, True, 1)
        co_pad = ceil_div(cout, mb) * mb
        self.mb, self.nb, self.co_pad = mb, nb, co_pad
        self.local = min(64, op.workgroup_size)
        per_row = ceil_div(T, nb)
        esize = g.dtype.size
        xs = g.x_strides
        self.x_texel = _texel_ok(op, d.input_tensor.total_tensor_size_in_bytes // esize)
        # rows read four elements a texel (RGBA32F / RGBA16F views): packed rows, every
        # row and W a multiple of 4
        self.x4 = (self.x_texel and xs[4] == 1 and g.in_size[2] % 4 == 0
                   and all(v % 4 == 0 for v in (xs[0], xs[1], xs[3]))
                   and d.input_tensor.total_tensor_size_in_bytes % (4 * esize) == 0)
        # V8: the input pass stores eight tiles as one u64vec4 (V's rows padded to 8):
        # knob store64 (None: the device's measured store width, store_width.py)
        wide = knobs(op).get("store64")
        v8_ok = self.x4 and bool(op.features.get("int64"))
        if wide and not v8_ok:
            raise Decline("u64vec4 stores of V need int64 shaders and float4 input rows")
        self.v8 = v8_ok and (wide if wide is not None else wide_stores(op.device))
        self.qt = 8 if self.v8 else 4
        vrow = ceil_div(T, self.qt) * self.qt
        self.vrow = vrow
        # the transforms' lanes run along (channel, tiles) in x alone
        lanes = max(cin * vrow // self.qt, cout * vrow // 4, cin * co_pad // 4)
        if ceil_div(lanes, self.local) > op.ctx.limits["maxComputeWorkGroupCount"][0]:
            raise Decline("the transforms' lanes exceed maxComputeWorkGroupCount")
        u_floats = 36 * cin * co_pad
        v_floats = 36 * cin * vrow + per_row * nb
        # M's rows: T4, or with V8 T8 (the GEMM stores eight tiles a u64vec4; a last
        # group past T lands in the row's padding, which the output pass never reads)
        mrow = vrow
        self.mrow = mrow
        m_floats = 36 * co_pad * mrow
        self.u = op.scratch(4 * u_floats)
        self.v = op.scratch(4 * v_floats)
        self.m = op.scratch(4 * m_floats)
        half = runtime.FORMAT_R16_SFLOAT
        src_fmt = runtime.FORMAT_R32_SFLOAT if g.dtype == DataType.FLOAT32 else half
        self.w_texel = _texel_ok(op, d.filter_tensor.total_tensor_size_in_bytes // esize)
        self.m_texel = _texel_ok(op, m_floats // 4)
        self.gemm_texel = _texel_ok(op, v_floats) and _texel_ok(op, u_floats)
        self.w_fmt = src_fmt if self.w_texel else 0
        self.x_fmt = src_fmt if self.x_texel else 0
        suffix = storage_suffix(op, g.dtype)
        consts = {"LOCAL_SIZE_X": self.local, "ACT": self.act_id}
        self.p_weights = op.pipeline("convolution_winograd_weights_" +
                                     ("texel" if self.w_texel else suffix), consts)
        if self.x4:
            self.x_fmt = (runtime.FORMAT_RGBA32_SFLOAT if g.dtype == DataType.FLOAT32
                          else runtime.FORMAT_RGBA16_SFLOAT)
            self.p_input = op.pipeline("convolution_winograd_input_texel4" +
                                       ("_v8" if self.v8 else ""),
                                       {**consts, "WINO_XO": -g.start[2] % 4})
        else:
            self.p_input = op.pipeline("convolution_winograd_input_" +
                                       ("texel" if self.x_texel else suffix), consts)
        ys = g.y_strides
        pool = getattr(op, "pool_request", None)
        self.pool = pool if pool is not None and pool_rule(d, pool) is None else None
        self.y4 = (self.pool is None and self.m_texel and OW % 4 == 0 and ys[4] == 1
                   and all(v % 4 == 0 for v in (ys[0], ys[1], ys[3])))
        bound = (OH, OW)
        out_name = variant("winograd_output", suffix, self.m_texel, self.y4)
        self.y_bytes = d.output_tensor.total_tensor_size_in_bytes
        # V8 also stores two tiles' rows as one u64vec4 where rows hold whole groups of 8
        # (float16: a u64vec2 of eight halves)
        self.y8 = (self.v8 and self.y4 and self.m_texel and OW % 8 == 0
                   and all(v % 8 == 0 for v in (ys[0], ys[1], ys[3]))
                   and self.y_bytes % (4 * 8 * esize) == 0)
        if self.y8:
            out_name = out_name[:-3] + "_v8"
        if self.pool is not None:      # P and SCALE: CompiledLpPooling's rule (lp_pooling.py)
            pp = int(self.pool.p)
            consts_out = {**consts, "P": pp,
                          "SCALE": int(pp > 2 or (pp == 2 and g.dtype == DataType.FLOAT32))}
            self.p_output = op.pipeline(out_name + "_pool", consts_out)
            py = self.pool.output_tensor
            bound = py.sizes[2:]           # the output bound: the pooled tensor's
            ys = (py.element_strides[0], py.element_strides[1], 0, *py.element_strides[2:])
            self.y_bytes = py.total_tensor_size_in_bytes
        else:
            self.p_output = op.pipeline(out_name, consts)
        p = np.zeros(WINO_PARAM_WORDS, np.int64)
        p[0:4] = [cin, co_pad, cout, T]
        p[4:8] = [TW, TH * TW, mrow, vrow]
        p[8:12] = [*g.in_size[1:], *g.start[1:]]
        p[12:16] = [g.x_strides[0], g.x_strides[1], g.x_strides[3], g.x_strides[4]]
        p[16:20] = [g.w_strides[0], g.w_strides[1], g.w_strides[3], g.w_strides[4]]
        p[20:24] = [*bound, int(g.flip), int(g.b_stride is not None)]
        p[24:28] = [ys[0], ys[1], ys[3], ys[4]]
        p[28:32] = [g.b_stride or 0, 0, 0, 0]
        words = _words(p).view(np.int32)
        words[32:36] = self.act_params.view(np.int32)
        self.params = op.upload(words)
        # the 36 GEMMs: image = transform point, one row of T "pixels" (tiles), one tap
        xvec4 = self.gemm_texel and nb % 4 == 0
        self.groups_y = co_pad // mb
        consts = {"LOCAL_SIZE_X": self.local, "MB": mb, "NB": nb, "SW": 1, "ACT": 0,
                  "XVEC4": int(xvec4), "KW": 1, "DW": 1, "CU": gemm_cu(op, cin, mb * nb)}
        words = gemm_params(
            (cin, co_pad, co_pad, cin * co_pad // 4), (cin * vrow, vrow, 0, 0), (1, 1, T, 0),
            (1, 1, 1, 0), (co_pad * mrow, mrow, 0, 0), 1, np.zeros(4, np.float32), [0])
        self.cbw = 0
        # 4 pixels (tiles) a store of M where the block holds whole groups of 4 (T4: M's
        # rows hold whole groups; lavapipe, 64x56x56: the 36 GEMMs 1.68-1.72 -> 1.34-1.46 ms)
        self.gemm_yv4 = nb % 4 == 0
        # ...and eight a u64vec4 with V8 (T8 rows)
        self.gemm_v8 = self.v8 and self.gemm_yv4 and self.gemm_texel and how != "blocked"
        v8g = "_v8" if self.gemm_v8 else ""
        if self.cl is not None:
            if not self.gemm_texel:
                raise Decline("the transformed input or filter is too large for a texel view")
            blocks = ceil_div(T, nb)
            per_wg = max(1, min(self.local // self.sg, blocks))    # pixel blocks a workgroup
            # y: channel blocks, a subgroup's lanes each
            self.cl_groups = (ceil_div(blocks, per_wg), ceil_div(co_pad // mb, self.sg), 36)
            self.p_gemm = op.ctx.pipelines.variant(
                "convolution_winograd_gemm_cl" + ("_v8" if self.v8 else ""),
                {"LOCAL_SIZE_X": per_wg * self.sg, "MB": mb, "NB": nb, "SG": self.sg},
                subgroup_size=self.sg)
            self.gemm_v8 = self.v8
        elif self.sg:
            if not self.gemm_texel:
                raise Decline("the transformed input or filter is too large for a texel view")
            # U read in place as gemm_sg reads a filter: output channel stride 1, input
            # channel stride co_pad, one filter per transform point (image) cin * co_pad
            # apart
            o = GEMM_PARAM_WORDS
            words = np.concatenate([words, np.zeros(GEMM_SG_PARAM_WORDS - o, np.int32)])
            words[o:o + 8] = [1, co_pad, 0, 0, 0, cin * co_pad, 0, 0]
            consts.update(SG=self.sg, YV4=int(self.gemm_yv4))
            cbw = min(self.local // self.sg, self.groups_y)
            if SG_CBW and cbw >= 2:
                consts.update(CBW=cbw, LOCAL_SIZE_X=cbw * self.sg)
                self.cbw = cbw
            self.p_gemm = op.ctx.pipelines.variant("convolution_gemm_sg_f32" + v8g, consts,
                                                   subgroup_size=self.sg)
        else:
            self.p_gemm = None if how == "blocked" else op.pipeline(
                variant("gemm", "f32", self.gemm_texel) + v8g,
                {**consts, "YV4": int(self.gemm_yv4)})
        self.xvec4 = xvec4
        # (the cl pass reads the Winograd parameters, not the gemm kernel's)
        self.gemm_params = op.upload(words) if self.cl is None else None
        self.qsize = (1, 1, T, per_row)
        self.blocked = None
        if how == "blocked":     # the 36 GEMMs on convolution_blocked
            # 8 channels x 4 or 2 tiles, 16 or 8 lanes: the fewest idle lanes over T tiles
            rm, rn, local = min(((8, rn_, l_) for rn_ in (4, 2) for l_ in (16, 8)),
                                key=lambda b: (ceil_div(T, (b[1] * b[2])) * b[1] * b[2] - T,
                                               -b[1] * b[2]))
            self.blocked = (op.pipeline("convolution_blocked_gemm", {
                "LOCAL_SIZE_X": local, "RM": rm, "RN": rn}),
                (ceil_div(T, (local * rn)), ceil_div(co_pad, rm), 36),
                np.array([co_pad, T, cin, 0, cin * co_pad, co_pad, 1, 0, cin * vrow, vrow, 1, 0,
                          co_pad * mrow, mrow, 1, 0], np.int32).tobytes())
        self.v_bytes, self.u_bytes, self.m_bytes = 4 * v_floats, 4 * u_floats, 4 * m_floats

    def filter_buffer(self):
        return self.u

    def encode_filter(self, seq, w) -> None:
        """U = G g G^T for every channel pair."""
        pb = Bind(self.params)
        seq.dispatch(self.p_weights, [
            Bind(w, 0, self.op.desc.filter_tensor.total_tensor_size_in_bytes, "r", self.w_fmt),
            pb, Bind(self.u, 0, self.u_bytes, "w"), pb],
            (ceil_div(self.geo.c_in * self.co_pad // 4, self.local), 1, 1))

    def encode(self, seq, x, w, b, y) -> None:
        g, d, L = self.geo, self.op.desc, self.local
        pb = Bind(self.params)
        if not self.filter_ready:
            self.encode_filter(seq, w)
        seq.dispatch(self.p_input, [
            Bind(x, 0, d.input_tensor.total_tensor_size_in_bytes, "r", self.x_fmt),
            Bind(self.params), Bind(self.v, 0, self.v_bytes, "w"), pb],
            (ceil_div(g.c_in * self.vrow // self.qt, L), 1, 1))
        if self.blocked is not None:
            pipe, groups, push = self.blocked
            seq.dispatch(pipe, [Bind(self.u, 0, self.u_bytes), Bind(self.v, 0, self.v_bytes),
                                Bind(self.m, 0, self.m_bytes, "w")], groups, push)
        else:
            self._encode_gemm(seq)
        self._encode_output(seq, b, y)

    def _encode_gemm(self, seq) -> None:
        """M = U^T V: the 36 GEMMs on convolution_gemm (or this kernel's gemm pass)."""
        L = self.local
        if self.cl is not None:
            seq.dispatch(self.p_gemm, [
                Bind(self.v, 0, self.v_bytes - self.v_bytes % 16, "r",
                     runtime.FORMAT_RGBA32_SFLOAT),
                Bind(self.u, 0, self.u_bytes, "r", runtime.FORMAT_RGBA32_SFLOAT),
                Bind(self.m, 0, self.m_bytes, "w"), Bind(self.params)], self.cl_groups)
            return
        if self.gemm_texel:
            vb = Bind(self.v, 0, self.v_bytes - self.v_bytes % 16, "r",
                      runtime.FORMAT_RGBA32_SFLOAT if self.xvec4 else runtime.FORMAT_R32_SFLOAT)
            ub = Bind(self.u, 0, self.u_bytes, "r", runtime.FORMAT_R32_SFLOAT if self.sg
                      else runtime.FORMAT_RGBA32_SFLOAT)
        else:
            vb, ub = Bind(self.v, 0, self.v_bytes), Bind(self.u, 0, self.u_bytes)
        qs = self.qsize
        blocks = qs[3]
        if self.cbw:         # gemm_sg: subgroups of a workgroup, channel blocks of the same tiles
            cbl, groups = 1, (ceil_div(blocks, self.sg), ceil_div(self.groups_y, self.cbw), 36)
        else:
            if self.sg:      # whole subgroups per channel block
                blocks = ceil_div(blocks, self.sg) * self.sg
            cbl = max(1, min(self.groups_y, (4 * L) // blocks))
            groups = (ceil_div(blocks * cbl, L), ceil_div(self.groups_y, cbl), 36)
        push = np.array([*qs, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, cbl, self.groups_y], np.int32)
        seq.dispatch(self.p_gemm, [vb, ub, Bind(self.params), Bind(self.m, 0, self.m_bytes, "w"),
                                   Bind(self.gemm_params)], groups, push.tobytes())

    def _encode_output(self, seq, b, y) -> None:
        g, L = self.geo, self.local
        pb = Bind(self.params)
        mb_ = Bind(self.m, 0, self.m_bytes, "r",
                   runtime.FORMAT_RGBA32_SFLOAT if self.m_texel else 0)
        bb = Bind(b, 0, self.op.whole(b, "bias")) if b is not None else Bind(self.params)
        seq.dispatch(self.p_output, [mb_, bb, Bind(y, 0, self.y_bytes, "w"), pb],
                     (ceil_div(g.c_out * self.mrow // 4, L), 1, 1))

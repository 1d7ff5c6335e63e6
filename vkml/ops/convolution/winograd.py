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
from ...runtime.blocks import pack
from ...tuning import Declined
from .gemm import SG_ACC, SG_CBW, Axis, gemm_blocks, gemm_cu, sg_blocks, subgroup_shuffle_size
from .epilogue import global_pool_rule
from .gemm_sg import GemmSgPath
from ..store_width import wide_stores
from .geometry import STORAGES, Path, storage_suffix, texel_ok, variant
from .plan import Buf, Step, compiled, record
from ...intmath import ceil_div

#: Kernel variants this module requests (see :func:`variant`) and the specialization
#: constants it sets.
VARIANTS = {
    **{f"convolution_winograd_{k}_{s}": ("LOCAL_SIZE_X", "ACT")
       for k in ("weights", "input") for s in STORAGES + ("texel",)},
    "convolution_winograd_input_texel4": ("LOCAL_SIZE_X", "ACT", "WINO_XO"),
    "convolution_winograd_input_texel4_v8": ("LOCAL_SIZE_X", "ACT", "WINO_XO"),
    **{f"convolution_winograd_output_{s}{r}": ("LOCAL_SIZE_X", "ACT")
       for s in STORAGES for r in ("", "_ssbo")},
    **{f"convolution_winograd_output_{s}_v4": ("LOCAL_SIZE_X", "ACT") for s in STORAGES},
    **{f"convolution_winograd_output_{s}_v8": ("LOCAL_SIZE_X", "ACT") for s in STORAGES},
    **{f"convolution_winograd_gemm_cl{v}": ("LOCAL_SIZE_X", "MB", "NB", "SG") for v in ("", "_v8")},
    **{f"convolution_winograd_output_{s}{r}_pool": ("LOCAL_SIZE_X", "ACT", "P", "SCALE")
       for s in STORAGES for r in ("", "_ssbo")},
}


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


#: At most this many tiles, the 36 GEMMs' lanes take 16 output channels each where that
#: pads no more channels than 8 would: with one block of 4 tiles a lane, each channel
#: step's V fetch and shuffles serve twice the products (layer4 of ResNet-18, 512
#: channels on 7x7: the GEMM pass about twice as fast as with 8, bench/RESULTS.md).
FEW_TILES = 4


def cl_blocks(cout: int, tiles: int, sg: int) -> tuple[int, int]:
    """(MB, NB) of the 36 GEMMs with lanes along output channels (``gemm`` knob "cl"):
    MB (8 or 4; 16 too up to :data:`FEW_TILES` tiles) padding the fewest channels once
    channel blocks fill whole subgroups, the larger on a tie; NB a multiple of 4 up to 32
    tiles (and SG_ACC accumulators) wasting the fewest tiles, the larger on a tie (a
    56x56 image's 196 tiles: 8 x 28, none)."""
    mbs = (16, 8, 4) if tiles <= FEW_TILES else (8, 4)
    mb = min(mbs, key=lambda m: (ceil_div(ceil_div(cout, m), sg) * sg * m, -m))
    nb = min(range(4, min(32, SG_ACC // mb) + 1, 4),
             key=lambda n: (ceil_div(tiles, n) * n - tiles, -n))
    return mb, nb


@dataclass(frozen=True, eq=False)
class PooledConvolutionDesc:
    """A convolution and the pooling that alone reads its output, run as one operator
    (the graph compiler's fusions, ``vkml/ops/graph.py``): an LP pooling in Winograd's
    output pass (:func:`pool_rule`) or a global average pool in gemm_sg's
    (``epilogue.global_pool_rule``); the convolution's fields (read through), its inputs,
    the pooling's output."""

    convolution: ConvolutionOperatorDesc
    pooling: object

    @property
    def OPERATOR_TYPE(self) -> str:      # noqa: N802 (as every descriptor's)
        return f"DML_OPERATOR_CONVOLUTION + {self.pooling.OPERATOR_TYPE} (fused)"

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
        lp = isinstance(self.pooling, (LpPooling1OperatorDesc, LpPoolingOperatorDesc))
        why = (pool_rule if lp else global_pool_rule)(self.convolution, self.pooling)
        if why is not None:
            raise ValidationError("pooling", why)


#: Below this many output tiles Winograd accepts a geometry (forced, or timed by the
#: tuner) but is never the ``VKML_TUNE=off`` choice: with few tiles its 36 GEMMs are
#: short and its transforms cost as much as they save, or not, by the device.
MIN_PREFERRED_TILES = 32


class WinogradPath(Path):
    """Winograd F(4x4, 3x3) (``glsl/convolution_winograd.comp``): 3x3, stride 1, dilation 1,
    one group, forward, enough channels for the transforms to pay off.  Per execution:
    the filter transform U = G g G^T, the input transform V = B^T d B (zero padding by
    bounds), 36 GEMMs M = U^T V (a quarter of the direct products), and the output
    transform y = A^T M A with bias and activation.  Results differ from the direct sum
    by rounding (within 1e-5 x sqrt(9 C_in) of the float64 result for unit-variance
    data).  Taken from 32 tiles up: the filter transform runs every execution and costs
    as much as the GEMMs of a few tiles.

    Non-finite filters: the transforms add and subtract filter values, so one infinite
    weight makes inf - inf = NaN in outputs where the page's sum gives +-inf (as do the
    direct paths, ONNX Runtime's and PyTorch's CPU convolutions; cuDNN's Winograd
    algorithms behave like this path).  An OWNED filter is read at initialization and,
    holding an infinity or NaN, runs on another path
    (``CompiledConvolution.initialize``); a filter bound at execution is not read on the
    host, and this path then returns NaN where such a weight meets the input.

    The input transform reads tile rows four elements a fetch where the input rows are
    packed and a multiple of 4 (``x4``: RGBA32F or RGBA16F views, 18 fetches a tile
    instead of 36), and the output transform stores a tile row at once where the output
    rows are (``y4``: a float4, or float16's four halves as one uvec2).  The knob
    ``gemm``: None (the default: ``cl`` where it fits, else ``gemm``), "cl" (the GEMMs
    with a subgroup's lanes along output channels, this kernel's ``gemm_cl`` pass),
    "gemm" (``convolution_gemm.comp``), "sg" (gemm_sg's variant: U read in place as one
    filter per transform point and shared by shuffles; devices with full subgroups) or
    "blocked" (``convolution_blocked.comp``).

    ``pool``: the LP pooling offered to the output pass (``CompiledConvolution(pool=)``);
    where :func:`pool_rule` accepts it, ``self.pool`` holds it and the output pass applies
    it before storing: the output bound is then the pooled tensor, a quarter of the
    stores and no pooling pass (else ``self.pool`` is None)."""

    name = "winograd"
    POOLS = True
    RESIDUAL = True

    @classmethod
    def accepts(cls, op, geo, knobs=None) -> bool:
        lim = op.ctx.limits
        tiles = geo.n * ceil_div(geo.out_size[1], 4) * ceil_div(geo.out_size[2], 4)
        big = 36 * max(geo.c_in, geo.c_out) * (tiles + 16) * 4
        # any number of tiles: a few large-channel tiles (ResNet's 14x14 and 7x7 stages)
        # are the tuner's to judge (prefers keeps the VKML_TUNE=off choice for them)
        return (geo.plain and not geo.backward and geo.kernel == (1, 3, 3)
                and geo.stride == (1, 1, 1)
                and geo.dilation == (1, 1, 1) and geo.groups == 1
                and geo.valid == geo.out_size and geo.in_size[0] == 1
                and geo.c_in >= 16 and geo.c_out >= 16 and tiles >= 1
                and big < lim["maxStorageBufferRange"]
                and geo.c_in <= lim["maxComputeWorkGroupCount"][1]
                and geo.c_out <= lim["maxComputeWorkGroupCount"][1])

    @classmethod
    def prefers(cls, op, geo) -> bool:
        """Where gemm_sg can run the geometry, Winograd only where it wins: the
        transforms cost per tile and channel, the filter transform per channel pair.
        The bounds are lavapipe's crossover (bench/RESULTS.md, "Kernel design")."""
        c = min(geo.c_in, geo.c_out)
        tiles = geo.n * ceil_div(geo.out_size[1], 4) * ceil_div(geo.out_size[2], 4)
        if tiles < MIN_PREFERRED_TILES:
            return False
        if not GemmSgPath.accepts(op, geo):
            return True
        return c >= 64 and tiles >= 49 and tiles * c >= 9000

    def __init__(self, op, geo, knobs=None, pool=None):
        super().__init__(op, geo, knobs)
        oh, ow = geo.out_size[1:]
        self.TH, self.TW = ceil_div(oh, 4), ceil_div(ow, 4)
        self.T = T = geo.n * self.TH * self.TW
        self.T4 = ceil_div(T, 4) * 4
        self.local = min(64, op.workgroup_size)
        self._gemm_kind()
        self._tile_rows()
        self._buffers()
        self._output(pool)
        self.params = op.upload(np.frombuffer(pack(
            "convolution_winograd_weights_f32", "Params", **self._params()), np.uint8))
        gemm = self._gemm_steps()
        self.filter_steps = compiled(op, [self._weights_step()])
        self.steps = compiled(op, [self._input_step()] + gemm + [self._output_step()])

    # -- the plan ---------------------------------------------------------------------
    def _gemm_kind(self) -> None:
        """How the 36 GEMMs run (``how``: knob ``gemm``, see the class doc), the subgroup
        size they require (``sg``) and their register block ``mb x nb``."""
        op, cin, cout, T = self.op, self.geo.c_in, self.geo.c_out, self.T
        how = self.knobs.get("gemm")
        sg = subgroup_shuffle_size(op)
        if how is None:
            # lanes along output channels where the device runs full subgroups with
            # shuffles and U and V fit texel views, else the gemm kernel
            fits = False
            if sg:
                mb_ = cl_blocks(cout, T, sg)[0]
                fits = (texel_ok(op, 36 * cin * (ceil_div(T, 8) * 8) + T + 32)
                        and texel_ok(op, 36 * cin * ceil_div(cout, mb_) * mb_))
            how = "cl" if fits else "gemm"
        self.how = how
        self.sg = sg if how in ("sg", "cl") else 0
        if how in ("sg", "cl") and not self.sg:
            raise Declined(f"no full subgroups with shuffles for the 36 GEMMs ({how})")
        self.cl = None
        if how == "cl":
            mb, nb = self.cl = cl_blocks(cout, T, self.sg)
        elif self.sg:    # gemm_sg's register block: one tap, one row of T tiles per GEMM
            one = Axis(0, 1, 1, 1, [(0, 0)])
            mb, nb = sg_blocks(cout, [[one, one, Axis(0, 1, T, 1, [(0, 0)])]], [T], False,
                               self.sg)
        else:
            mb, nb = gemm_blocks(self.knobs, cout, T, True, 1)
        self.mb, self.nb, self.co_pad = mb, nb, ceil_div(cout, mb) * mb

    def _tile_rows(self) -> None:
        """The input pass's reads (``x4``: float4 rows) and stores (``v8``: eight tiles
        as one u64vec4, knob store64; None: the device's measured store width), tiles per
        store ``qt`` and the rows of V and M (``vrow``, ``mrow``: T rounded up to qt)."""
        g, op, d = self.geo, self.op, self.op.desc
        esize = g.dtype.size
        xs = g.x_strides
        self.x_texel = texel_ok(op, d.input_tensor.total_tensor_size_in_bytes // esize)
        self.x4 = (self.x_texel and xs[4] == 1 and g.in_size[2] % 4 == 0
                   and all(v % 4 == 0 for v in (xs[0], xs[1], xs[3]))
                   and d.input_tensor.total_tensor_size_in_bytes % (4 * esize) == 0)
        wide = self.knobs.get("store64")
        v8_ok = self.x4 and bool(op.features.get("int64"))
        if wide and not v8_ok:
            raise Declined("u64vec4 stores of V need int64 shaders and float4 input rows")
        self.v8 = v8_ok and (wide if wide is not None else wide_stores(op.device))
        self.qt = 8 if self.v8 else 4
        # M's rows as V's: a last group of eight past T lands in the row's padding, which
        # the output pass never reads
        self.vrow = self.mrow = ceil_div(self.T, self.qt) * self.qt
        # the transforms' lanes run along (channel, tiles) in x alone
        lanes = max(g.c_in * self.vrow // self.qt, g.c_out * self.vrow // 4,
                    g.c_in * self.co_pad // 4)
        if ceil_div(lanes, self.local) > op.ctx.limits["maxComputeWorkGroupCount"][0]:
            raise Declined("the transforms' lanes exceed maxComputeWorkGroupCount")

    def _buffers(self) -> None:
        """U, V, M and which of them texel views can read."""
        g, op, d = self.geo, self.op, self.op.desc
        u_floats = 36 * g.c_in * self.co_pad
        v_floats = 36 * g.c_in * self.vrow + ceil_div(self.T, self.nb) * self.nb
        m_floats = 36 * self.co_pad * self.mrow
        self.u, self.v, self.m = (op.scratch(4 * n) for n in (u_floats, v_floats, m_floats))
        self.u_bytes, self.v_bytes, self.m_bytes = 4 * u_floats, 4 * v_floats, 4 * m_floats
        self.w_texel = texel_ok(op, d.filter_tensor.total_tensor_size_in_bytes // g.dtype.size)
        self.m_texel = texel_ok(op, m_floats // 4)
        self.gemm_texel = texel_ok(op, v_floats) and texel_ok(op, u_floats)

    def _output(self, pool) -> None:
        """The output pass: its kernel, the output bound (the pooled tensor where it
        absorbs ``pool``), its strides and stores (``y4``: a tile row a store; ``y8``:
        two tiles' rows a u64vec4, with V8)."""
        g, d = self.geo, self.op.desc
        suffix = storage_suffix(self.op, g.dtype)
        # (a residual descriptor's output is the add's: no pooling reads the convolution's)
        self.pool = (pool if pool is not None and not self.res and pool_rule(d, pool) is None
                     else None)
        ys = g.y_strides
        ow = g.out_size[2]
        self.y4 = (self.pool is None and self.m_texel and ow % 4 == 0 and ys[4] == 1
                   and all(v % 4 == 0 for v in (ys[0], ys[1], ys[3])))
        self.y_bytes = d.output_tensor.total_tensor_size_in_bytes
        # two tiles' rows a u64vec4 only where asked (knob store64 True), not where the
        # device's store width alone would: on rows of a multiple of 4 the float4 stores'
        # pipeline then serves every width of 8 too, one pipeline fewer a model
        # (bench/RESULTS.md, "What a pipeline costs lavapipe")
        self.y8 = (self.knobs.get("store64") is True and self.v8 and self.y4 and self.m_texel
                   and ow % 8 == 0
                   and all(v % 8 == 0 for v in (ys[0], ys[1], ys[3]))
                   and self.y_bytes % (4 * 8 * g.dtype.size) == 0)
        name = variant("winograd_output", suffix, self.m_texel, self.y4)
        # (a residual is a run-time switch of the same kernel, ``bias_step.y``: one
        # pipeline for a model's convolutions with and without one)
        self.out_kernel = name[:-3] + "_v8" if self.y8 else name
        self.out_constants = {"LOCAL_SIZE_X": self.local, "ACT": self.act_id}
        self.bound, self.ys = g.out_size[1:], (ys[0], ys[1], ys[3], ys[4])
        if self.pool is not None:      # P and SCALE: CompiledLpPooling's rule (lp_pooling.py)
            pp = int(self.pool.p)
            self.out_kernel += "_pool"
            self.out_constants.update(
                P=pp, SCALE=int(pp > 2 or (pp == 2 and g.dtype == DataType.FLOAT32)))
            py = self.pool.output_tensor
            ps = py.element_strides
            self.bound, self.ys = py.sizes[2:], (ps[0], ps[1], ps[2], ps[3])
            self.y_bytes = py.total_tensor_size_in_bytes

    def _params(self) -> dict:
        """The transforms' ``Params`` by member (every pass of the kernel reads them)."""
        g = self.geo
        return dict(
            dims=(g.c_in, self.co_pad, g.c_out, self.T),
            tiles=(self.TW, self.TH * self.TW, self.mrow, self.vrow),
            in_size=(*g.in_size[1:], *g.start[1:]),
            xs=(g.x_strides[0], g.x_strides[1], g.x_strides[3], g.x_strides[4]),
            fs=(g.w_strides[0], g.w_strides[1], g.w_strides[3], g.w_strides[4]),
            out_size=(*self.bound, int(g.flip), int(g.b_stride is not None)),
            ys=self.ys, bias_step=(g.b_stride or 0, int(bool(self.res)), 0, 0),
            act=self.act_params)

    def _weights_step(self) -> Step:
        """U = G g G^T for every channel pair."""
        g = self.geo
        suffix = storage_suffix(self.op, g.dtype)
        src_fmt = (runtime.FORMAT_R32_SFLOAT if g.dtype == DataType.FLOAT32
                   else runtime.FORMAT_R16_SFLOAT)
        pb = Buf(self.params)
        return Step("convolution_winograd_weights_" + ("texel" if self.w_texel else suffix),
                    {"LOCAL_SIZE_X": self.local, "ACT": self.act_id},
                    (ceil_div(g.c_in * self.co_pad // 4, self.local), 1, 1),
                    (Buf("w", self.op.desc.filter_tensor.total_tensor_size_in_bytes, "r",
                         src_fmt if self.w_texel else 0),
                     pb, Buf(self.u, self.u_bytes, "w"), pb))

    def _input_step(self) -> Step:
        """V = B^T d B (zero padding by bounds)."""
        g = self.geo
        consts = {"LOCAL_SIZE_X": self.local, "ACT": self.act_id}
        f32 = g.dtype == DataType.FLOAT32
        if self.x4:
            kernel = "convolution_winograd_input_texel4" + ("_v8" if self.v8 else "")
            consts["WINO_XO"] = -g.start[2] % 4
            fmt = runtime.FORMAT_RGBA32_SFLOAT if f32 else runtime.FORMAT_RGBA16_SFLOAT
        else:
            kernel = "convolution_winograd_input_" + (
                "texel" if self.x_texel else storage_suffix(self.op, g.dtype))
            fmt = (runtime.FORMAT_R32_SFLOAT if f32 else runtime.FORMAT_R16_SFLOAT
                   ) if self.x_texel else 0
        pb = Buf(self.params)
        return Step(kernel, consts, (ceil_div(g.c_in * self.vrow // self.qt, self.local), 1, 1),
                    (Buf("x", self.op.desc.input_tensor.total_tensor_size_in_bytes, "r", fmt),
                     pb, Buf(self.v, self.v_bytes, "w"), pb))

    def _output_step(self) -> Step:
        """y = A^T M A with bias and activation (and the pooling it absorbs)."""
        m = Buf(self.m, self.m_bytes, "r", runtime.FORMAT_RGBA32_SFLOAT if self.m_texel else 0)
        # (without a residual, binding 4 holds the parameters: the kernel reads none)
        res = (Buf("r", self.y_bytes) if self.res else Buf(self.params),) \
            if self.pool is None else ()
        return Step(self.out_kernel, self.out_constants,
                    (ceil_div(self.geo.c_out * self.mrow // 4, self.local), 1, 1),
                    (m, Buf("b", absent=self.params), Buf("y", self.y_bytes, "w"),
                     Buf(self.params)) + res)

    # -- the 36 GEMMs --------------------------------------------------------------------
    def _gemm_steps(self) -> list[Step]:
        """M = U^T V: the 36 GEMMs (image = transform point, one row of T "pixels" (tiles),
        one tap) as ``how`` runs them."""
        self.xvec4 = self.gemm_texel and self.nb % 4 == 0
        self.groups_y = self.co_pad // self.mb
        self.cbw = 0
        # 4 pixels (tiles) a store of M where the block holds whole groups of 4, and
        # eight a u64vec4 with V8 (M's rows hold whole groups)
        self.gemm_yv4 = self.nb % 4 == 0
        self.gemm_v8 = (self.v8 and self.gemm_yv4 and self.gemm_texel
                        and self.how != "blocked")
        self.blocked = None
        if self.how == "blocked":
            return [self._blocked_step()]
        if self.how in ("cl", "sg") and not self.gemm_texel:
            raise Declined("the transformed input or filter is too large for a texel view")
        if self.cl is not None:
            return [self._cl_step()]
        return [self._gemm_kernel_step()]

    def _cl_step(self) -> Step:
        """The GEMMs with a subgroup's lanes along output channels (this kernel's gemm_cl
        pass, which reads the transforms' parameters)."""
        mb, nb, sg = self.mb, self.nb, self.sg
        blocks = ceil_div(self.T, nb)
        per_wg = max(1, min(self.local // sg, blocks))    # pixel blocks a workgroup
        # y: channel blocks, a subgroup's lanes each
        self.cl_groups = (ceil_div(blocks, per_wg), ceil_div(self.co_pad // mb, sg), 36)
        self.gemm_v8 = self.v8
        rgba = runtime.FORMAT_RGBA32_SFLOAT
        return Step("convolution_winograd_gemm_cl" + ("_v8" if self.v8 else ""),
                    {"LOCAL_SIZE_X": per_wg * sg, "MB": mb, "NB": nb, "SG": sg},
                    self.cl_groups,
                    (Buf(self.v, self.v_bytes - self.v_bytes % 16, "r", rgba),
                     Buf(self.u, self.u_bytes, "r", rgba), Buf(self.m, self.m_bytes, "w"),
                     Buf(self.params)), subgroup_size=sg)

    def _gemm_kernel_step(self) -> Step:
        """The GEMMs on ``convolution_gemm.comp`` (``how`` "gemm") or gemm_sg's variant
        of it (``how`` "sg": U read in place as gemm_sg reads a filter, output channel
        stride 1, input channel stride co_pad, one filter per transform point cin *
        co_pad apart)."""
        cin, co_pad, mb, nb, sg = self.geo.c_in, self.co_pad, self.mb, self.nb, self.sg
        consts = {"LOCAL_SIZE_X": self.local, "MB": mb, "NB": nb, "SW": 1, "ACT": 0,
                  "XVEC4": int(self.xvec4), "KW": 1, "DW": 1,
                  "CU": gemm_cu(self.knobs, cin, mb * nb), "YV4": int(self.gemm_yv4)}
        params = dict(chans=(cin, co_pad, co_pad, cin * co_pad // 4), xs=(cin * self.vrow,
                      self.vrow, 0, 0), ysz=(1, 1, self.T, 0), ystep=(1, 1, 1, 0),
                      ys=(co_pad * self.mrow, self.mrow, 0, 0), ys_w=(1, 0, 0, 0),
                      act=(0.0, 0.0, 0.0, 0.0), rows=(0, 0, 0, 0))
        kernel = (variant("gemm", "f32", self.gemm_texel) if not sg
                  else "convolution_gemm_sg_f32")
        if sg:
            params.update(w_sg=(1, co_pad, 0, 0), w_sg_apart=(0, cin * co_pad, 0, 0),
                          wrows=(0, 0, 0, 0))
            consts["SG"] = sg
            cbw = min(self.local // sg, self.groups_y)
            if SG_CBW and cbw >= 2:
                consts.update(CBW=cbw, LOCAL_SIZE_X=cbw * sg)
                self.cbw = cbw
        self.gemm_params = self.op.upload(np.frombuffer(pack(kernel, "Params", **params),
                                                        np.uint8))
        if self.gemm_texel:
            vb = Buf(self.v, self.v_bytes - self.v_bytes % 16, "r",
                     runtime.FORMAT_RGBA32_SFLOAT if self.xvec4 else runtime.FORMAT_R32_SFLOAT)
            ub = Buf(self.u, self.u_bytes, "r", runtime.FORMAT_R32_SFLOAT if sg
                     else runtime.FORMAT_RGBA32_SFLOAT)
        else:
            vb, ub = Buf(self.v, self.v_bytes), Buf(self.u, self.u_bytes)
        self.qsize = (1, 1, self.T, ceil_div(self.T, nb))
        grid, cbl = self._gemm_grid()
        return Step(kernel + ("_v8" if self.gemm_v8 else ""), consts, grid,
                    (vb, ub, Buf(self.params), Buf(self.m, self.m_bytes, "w"),
                     Buf(self.gemm_params)),
                    dict(qsize=self.qsize, yorg=(0, 0, 0, 0), nrows=1, w_base=0, x_base=0,
                         y_base=0, n0=0, pitch=0, cbl=cbl, cb_count=self.groups_y), sg)

    def _gemm_grid(self) -> tuple[tuple, int]:
        """The GEMM kernel's grid and channel blocks spread over its lanes (gemm_sg with
        CBW: subgroups of a workgroup take channel blocks of the same tiles)."""
        blocks, L = self.qsize[3], self.local
        if self.cbw:
            return (ceil_div(blocks, self.sg), ceil_div(self.groups_y, self.cbw), 36), 1
        if self.sg:      # whole subgroups per channel block
            blocks = ceil_div(blocks, self.sg) * self.sg
        cbl = max(1, min(self.groups_y, (4 * L) // blocks))
        return (ceil_div(blocks * cbl, L), ceil_div(self.groups_y, cbl), 36), cbl

    def _blocked_step(self) -> Step:
        """The GEMMs on ``convolution_blocked.comp``: 8 channels x 4 or 2 tiles, 16 or 8
        lanes, the fewest idle lanes over T tiles."""
        T, cin, co_pad, vrow, mrow = self.T, self.geo.c_in, self.co_pad, self.vrow, self.mrow
        rm, rn, local = min(((8, rn_, l_) for rn_ in (4, 2) for l_ in (16, 8)),
                            key=lambda b: (ceil_div(T, (b[1] * b[2])) * b[1] * b[2] - T,
                                           -b[1] * b[2]))
        grid = (ceil_div(T, (local * rn)), ceil_div(co_pad, rm), 36)
        self.blocked = (rm, rn, local)
        return Step("convolution_blocked_gemm", {"LOCAL_SIZE_X": local, "RM": rm, "RN": rn},
                    grid, (Buf(self.u, self.u_bytes), Buf(self.v, self.v_bytes),
                           Buf(self.m, self.m_bytes, "w")),
                    dict(mnk=(co_pad, T, cin, 0), sa=(cin * co_pad, co_pad, 1, 0),
                         sb=(cin * vrow, vrow, 1, 0), sc=(co_pad * mrow, mrow, 1, 0)))

    # -- recording -------------------------------------------------------------------
    def filter_buffer(self):
        return self.u

    def encode_filter(self, seq, w) -> None:
        record(seq, self.op, self.filter_steps, w=w)

    def encode(self, seq, x, w, b, y, r=None) -> None:
        if not self.filter_ready:
            self.encode_filter(seq, w)
        record(seq, self.op, self.steps, x=x, b=b, y=y, r=r)

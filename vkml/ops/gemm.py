"""GEMM: ``DML_GEMM_OPERATOR_DESC`` and ``vkml.gemm``.

Kernels: ``glsl/gemm.comp``, three families (:data:`PATH` chooses by the device's
timings): "direct", register blocks read straight from the operands (4 x 4 an
invocation; 8 x 8 where A and B are read as RGBA32F texels); "tiled", shared-memory tiles
of 32 x 32 with 4 x 4 register blocks, one z layer per (batch, channel) pair; and "sg"
(float32), the convolution's gemm_sg design: a subgroup's lanes share a block of MB rows
of op(A), fetched a few elements a lane and passed on by subgroup shuffles, each lane
NB columns of op(B) as texels, each accumulator taking 4 k in a row (on lavapipe the
block lives in memory: one load and store of it per 4 FMAs, not per FMA); and
``glsl/gemm_dot.comp`` (the direct family's "dot4" read) where op(A) and op(B) are both
contiguous along K (B transposed: fully connected weights), each output a dot product of
RGBA32F texels.  Direct workgroups put no more invocation rows along M than the product
has (:func:`block_shape`: a one-row GEMV spreads its 64 invocations along N).  Every
tensor is read through its own element strides: a transform swaps the last two strides
of its operand, a broadcast dimension has stride 0, so no operand is copied.  Alpha
scales the product and Beta * C is added in the epilogue before the fused activation.
float32 A and B are read as texels (RGBA32F where
:meth:`CompiledGemm._choose_read` allows, else R32F) where the device can bind them whole
(lavapipe gathers texel fetches across lanes, storage-buffer loads go one lane at a
time), past the texel limit as vec4 storage buffers ("ssbo4", gemm_dot_f32_ssbo);
``read="ssbo"`` forces storage buffers.  Tensors larger than
``maxStorageBufferRange`` run in windows of the output box (:func:`.grid.plan_windows`),
each tensor bound over what its window reads; grids over ``maxComputeWorkGroupCount``
are split into boxes that fit.
"""
from __future__ import annotations

import numpy as np

from ..dml.activations import activation as activation_desc
from ..dml.data_type import DataType
from ..dml.gemm import GemmOperatorDesc, MatrixTransform
from ..dml.operator import as_real, enum_of
from ..dml.tensor_desc import TensorDesc, broadcast_tensor_desc
from ..errors import ValidationError
from ..intmath import ceil_div
from .. import tuning
from ..runtime import FORMAT_R32_SFLOAT, FORMAT_RGBA32_SFLOAT, Bind
from ..runtime.blocks import pack
from .base import CompiledOperator, check_choice, implements
from .convolution.gemm import subgroup_shuffle_size
from .functional import as_array, pick_device, run
from .grid import binding_window, check_allocatable, pieces, plan_windows, strided_span

__all__ = ["gemm"]

#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = dict.fromkeys(
    [f"gemm_tiled_{t}" for t in ("f32", "f32_texel", "f16", "f16_packed")]
    + [f"gemm_direct_{t}" for t in ("f32", "f32_texel", "f32_texel4", "f32_ssbo4", "f16",
                                    "f16_packed")],
    ("LOCAL_SIZE_X", "LOCAL_SIZE_Y", "HAS_C", "ACT"))
VARIANTS.update(dict.fromkeys(["gemm_dot_f32", "gemm_dot_f32_ssbo"],
                              ("LOCAL_SIZE_X", "LOCAL_SIZE_Y", "HAS_C", "ACT", "RM", "CN")))
VARIANTS["gemm_sg_f32"] = ("LOCAL_SIZE_X", "LOCAL_SIZE_Y", "HAS_C", "ACT", "MB", "NB", "SG",
                           "A_MODE", "B_MODE", "YV4", "KB")

#: The kernel families (glsl/gemm.comp) and the reads each can take.
PATHS = {"direct": ("dot4", "texel4", "ssbo4", "texel", "ssbo"), "tiled": ("texel", "ssbo"),
         "sg": ("sg",)}
READS = ("dot4", "texel4", "ssbo4", "texel", "ssbo", "sg")
#: The sg family's register blocks (rows a subgroup, columns a lane) the tuner tries.
SG_BLOCKS = ((16, 8), (16, 12), (8, 16))
#: B_MODE of gemm.comp's SGA variant: how a lane reads its columns of op(B).
B_ELEMENTS, B_ALONG_N, B_ALONG_K = 0, 1, 2
#: The sg family's K blocking (gemm.comp's KB: the subgroups of a workgroup meet at a
#: barrier every K_BLOCK k, so that each piece of the workgroup's panel of op(B) is read
#: by all of them while it is in cache) takes products with at least this many blocks of
#: K: a shorter panel (256 rows of 64 columns: 64 KB) stays in a core's cache anyway.
K_BLOCK, K_BLOCKS_MIN = 128, 4

#: Invocations a workgroup; each invocation computes BLOCK[read] = (rows, columns)
#: outputs (gemm.comp's RM and 4 * CV; dot4: gemm_dot.comp's RM and CN for M >= 8).
INVOCATIONS = 64
BLOCK = {"dot4": (8, 8), "texel4": (8, 8), "ssbo4": (8, 8), "texel": (4, 4), "ssbo": (4, 4)}


def _pow2_at_least(v: int) -> int:
    return 1 << max(0, int(v) - 1).bit_length()


def block_shape(path: str, read: str, m: int) -> tuple[int, int, int, int]:
    """(local x, local y, rows, columns an invocation).  The tiled family takes 8 x 8
    invocations (its shared tiles assume them).  The direct family puts no more
    invocation rows along M than the product has (clamped rows repeat the last row's
    work): a one-row product (a classifier's GEMV) spreads all 64 along N, and dot4 takes
    one row an invocation there (4 columns: enough workgroups for every core)."""
    rows, cols = BLOCK[read]
    if path == "tiled":
        return 8, 8, rows, cols
    if read == "dot4" and m < rows:
        rows, cols = _pow2_at_least(m), 4
    ly = min(8, _pow2_at_least(ceil_div(m, rows)))
    return INVOCATIONS // ly, ly, rows, cols


def _four(t: TensorDesc | None, swap: bool = False) -> list[int]:
    """A tensor's element strides as the kernel's (batch, channel, row, column): missing
    batch dimensions get stride 0, a dimension of size 1 stride 0 (its only coordinate
    is 0), the last two swapped for a transform."""
    if t is None:
        return [0] * 4
    st = [s if n > 1 else 0 for n, s in zip(t.sizes, t.element_strides)]
    st = [0] * (4 - len(st)) + st
    if swap:
        st[2], st[3] = st[3], st[2]
    return st


@implements(GemmOperatorDesc)
class CompiledGemm(CompiledOperator):
    """GEMM on this device: see the module doc."""

    def __init__(self, device, desc, path: str | None = None, read: str | None = None,
                 sg_block: tuple[int, int] | None = None, k_block: int | None = None):
        """``path``: "direct", "tiled" or "sg" forces a kernel family (None: :data:`PATH`'s
        choice; "sg" runs "direct" where it does not take the product, see
        :meth:`_sg_constants`); ``read``: "texel4", "ssbo4", "texel" or "ssbo" forces a
        read where the geometry allows it (None: the widest that does); ``sg_block``: the sg
        family's (rows a subgroup, columns a lane), one of :data:`SG_BLOCKS` (None: the
        first); ``k_block``: the sg family's K blocking, a positive multiple of 4 (None or 0:
        none), taken where the product has K_BLOCKS_MIN blocks of K and a workgroup more
        than one subgroup (:meth:`_build_sg`)."""
        if path not in (None, *PATHS):
            raise ValidationError("path", f"must be one of {tuple(PATHS)}, got {path!r}")
        check_choice("read", read, READS)
        if sg_block is not None and tuple(sg_block) not in SG_BLOCKS:
            raise ValidationError("sg_block", f"must be one of {SG_BLOCKS}, got {sg_block!r}")
        if k_block is not None and (isinstance(k_block, bool) or not isinstance(k_block, int)
                                    or k_block < 0 or k_block % 4):
            raise ValidationError("k_block",
                                  f"must be a multiple of 4, at least 0, got {k_block!r}")
        self.force_path, self.force_read = path, read
        self.sg_block = tuple(sg_block or SG_BLOCKS[0])
        self.k_block = k_block or 0
        super().__init__(device, desc)

    def build(self) -> None:
        d = self.desc
        y = d.output_tensor
        m, k, n = d.mkn()
        sizes = [1] * (4 - y.dimension_count) + list(y.sizes)
        self.box = sizes[:2] + [m, n]
        self.k = k
        self.strides = [_four(d.a_tensor, d.transpose_a), _four(d.b_tensor, d.transpose_b),
                        _four(d.c_tensor), _four(y)]
        self.has_c = d.c_tensor is not None
        self.esize = y.data_type.size
        tensors = [d.a_tensor, d.b_tensor, d.c_tensor, y]
        self.bytes = [t.total_tensor_size_in_bytes if t is not None else 0 for t in tensors]
        for what, nb in zip(("A", "B", "C", "output"), self.bytes):
            check_allocatable(self.ctx, nb, f"the {what} tensor")
        base = "f32" if y.data_type == DataType.FLOAT32 else (
            "f16" if self.features.get("storage16") else "f16_packed")
        self.windows = self._plan_windows()
        self.path = self._choose_path()
        self.sg = sg = self._sg_constants(base) if self.path == "sg" else None
        act = d.fused_activation
        constants = {"HAS_C": self.has_c, "ACT": act.SPEC.kernel_id if act is not None else 0}
        if sg is not None:
            self._build_sg(sg, constants)
        else:
            if self.path == "sg":        # (the tuner's choice for the class, not this product:
                self.path = "direct"     # its times say nothing of what runs)
                self.observed = None
            self._build_direct_tiled(base, constants)
        block = pack(self.kernel, "Params", a_stride=self.strides[0], b_stride=self.strides[1],
                     c_stride=self.strides[2], y_stride=self.strides[3],
                     act_params=act.kernel_parameters() if act is not None else np.zeros(4),
                     alpha=float(d.alpha), beta=float(d.beta), k_size=k)
        self.params = self.upload(np.frombuffer(block, np.uint8))

    def _build_direct_tiled(self, base: str, constants: dict) -> None:
        """Kernel, read, blocks, texel formats and pipeline of the direct and tiled
        families (and gemm_dot.comp)."""
        self.read = self._choose_read(base)
        if self.read == "dot4":
            self.kernel = "gemm_dot_f32" + ("" if self.texel4_ok else "_ssbo")
        else:
            read = "" if self.read == "ssbo" else f"_{self.read}"
            self.kernel = f"gemm_{self.path}_{base}{read}"
        lx, ly, rows, cols = block_shape(self.path, self.read, self.box[2])
        self.block_m, self.block_n = rows * ly, cols * lx
        constants.update(LOCAL_SIZE_X=lx, LOCAL_SIZE_Y=ly)
        if self.read == "dot4":
            constants.update(RM=rows, CN=cols)
        fmt = {"texel": FORMAT_R32_SFLOAT, "texel4": FORMAT_RGBA32_SFLOAT,
               "dot4": FORMAT_RGBA32_SFLOAT if self.texel4_ok else 0}.get(self.read, 0)
        self.formats = [fmt, fmt]
        self.pipe = self.pipeline(self.kernel, constants)

    def _build_sg(self, sg: dict, constants: dict) -> None:
        """The sg family (gemm.comp's SGA variant): ``sg`` from :meth:`_sg_constants`.
        A workgroup holds up to INVOCATIONS // SG subgroups, each MB rows of the same
        SG * NB columns, no more of them than the product has row blocks.  KB: the K
        blocking asked for (``k_block``) where the subgroups have a panel of op(B) to
        share (more than one a workgroup) and K has K_BLOCKS_MIN blocks, else 0."""
        self.read, self.kernel = "sg", "gemm_sg_f32"
        size, mb, nb = sg["SG"], sg["MB"], sg["NB"]
        most = max(1, min(INVOCATIONS // size, self.ctx.limits["maxComputeWorkgroupSubgroups"]))
        subgroups = min(_pow2_at_least(ceil_div(self.box[2], mb)), 1 << (most.bit_length() - 1))
        kb = self.k_block
        sg["KB"] = kb if kb and subgroups > 1 and self.k >= K_BLOCKS_MIN * kb else 0
        self.block_m, self.block_n = subgroups * mb, size * nb
        constants.update(sg, LOCAL_SIZE_X=subgroups * size, LOCAL_SIZE_Y=1)
        self.formats = [FORMAT_RGBA32_SFLOAT if sg["A_MODE"] else FORMAT_R32_SFLOAT,
                        FORMAT_RGBA32_SFLOAT if sg["B_MODE"] != B_ELEMENTS else FORMAT_R32_SFLOAT]
        self.pipe = self.ctx.pipelines.variant(self.kernel, constants, subgroup_size=size)

    def _sg_constants(self, base: str) -> dict | None:
        """gemm.comp's SGA constants for this product, None where the sg family does not
        take it: float32 only, at least MB rows, A and B bound whole as texel views, a
        device with subgroup shuffles in full subgroups (the convolution's gemm_sg rule,
        :func:`.convolution.gemm.subgroup_shuffle_size`).  A as RGBA32F texels of 4 k
        (A_MODE 1) where it is contiguous along K, K and every other stride multiples of
        4; B along N (N a multiple of 4) or along K likewise; else R32F elements.  YV4
        where the output is contiguous along N in whole, aligned vec4s."""
        size = subgroup_shuffle_size(self)
        mb, nb = self.sg_block
        if base != "f32" or self.windows is not None or size < 4 or self.box[2] < mb \
                or self.force_read not in (None, "sg"):
            return None          # (fewer rows than a block: the lanes' work is mostly waste)
        (sa, sb, _, sy), k, n = self.strides, self.k, self.box[3]

        def rgba(i: int, along: int, count: int) -> bool:    # 4 elements a texel
            st = (sa, sb)[i]
            return (st[along] == 1 and count % 4 == 0 and self.bytes[i] % 16 == 0
                    and all(s % 4 == 0 for j, s in enumerate(st) if j != along))
        a_mode = int(rgba(0, 3, k))
        b_mode = B_ALONG_N if rgba(1, 3, n) else B_ALONG_K if rgba(1, 2, k) else B_ELEMENTS
        limit = self.ctx.limits["maxTexelBufferElements"]
        if self.bytes[0] // (16 if a_mode else 4) > limit \
                or self.bytes[1] // (4 if b_mode == B_ELEMENTS else 16) > limit:
            return None
        yv4 = sy[3] == 1 and n % 4 == 0 and all(s % 4 == 0 for s in sy[:3])
        return {"MB": mb, "NB": nb, "SG": size, "A_MODE": a_mode, "B_MODE": b_mode,
                "YV4": bool(yv4)}

    def _choose_read(self, base: str) -> str:
        """Direct float32 only: dot4 where op(A) and op(B) are both contiguous along K
        (gemm_dot.comp), texel4 where A is along K and B along N, N a multiple of 4; both
        need K a multiple of 4 and every other stride 4-aligned, so each 4-element run is
        one RGBA32F texel.  texel (float32): A and B as R32F texels; else storage
        buffers.  Texel reads need the tensors bound whole (no windows) within
        maxTexelBufferElements (texels of the view's format); past that limit dot4 and
        texel4 read vec4 storage buffers (gemm_dot_f32_ssbo, ssbo4), which keep their
        blocks, where the scalar reads of "ssbo" run several times slower (SwiftShader)."""
        limit = self.ctx.limits["maxTexelBufferElements"]
        self.texel_ok = max(self.bytes[:2]) // 4 <= limit          # R32F views
        self.texel4_ok = max(self.bytes[:2]) // 16 <= limit        # RGBA32F views
        if base != "f32" or self.windows is not None or self.force_read == "ssbo":
            return "ssbo"
        sa, sb = self.strides[0], self.strides[1]
        rgba = (self.path == "direct" and sa[3] == 1 and self.k % 4 == 0
                and all(s % 4 == 0 for s in sa[:3])
                and all(nb % 16 == 0 for nb in self.bytes[:2]))
        if rgba and sb[2] == 1 and all(sb[i] % 4 == 0 for i in (0, 1, 3)) \
                and self.force_read in (None, "dot4"):
            return "dot4"          # as vec4 storage buffers where texels do not fit
        if rgba and sb[3] == 1 and self.box[3] % 4 == 0 and all(s % 4 == 0 for s in sb[:3]) \
                and self.force_read in (None, "texel4", "ssbo4"):
            return "texel4" if self.texel4_ok and self.force_read != "ssbo4" else "ssbo4"
        return "texel" if self.texel_ok and self.force_read != "ssbo4" else "ssbo"

    def _choose_path(self) -> str:
        """The forced path, else the tuner's choice for the shape's class; with
        ``VKML_TUNE=off`` "direct" (no shared memory or barriers: it runs on every
        device, and is the one lavapipe's coroutine barriers do not slow)."""
        if self.force_path is not None:
            return self.force_path
        choice = tuning.choose(self.device, PATH, self.shape())
        self.observe_choice(choice, self.shape())
        if choice.candidate.params["path"] == "sg":
            self.sg_block = tuple(choice.candidate.params["sg_block"])
            self.k_block = choice.candidate.params.get("k_block") or 0
        return choice.candidate.params["path"]

    def shape(self) -> dict:
        """The tuner's shape: M, K, N, the batch layer count, data type, and ``b_along_k``
        where op(B) is contiguous along K (a fully connected layer's transposed weights:
        the direct family then reads dot products, gemm_dot.comp, so its candidate is
        timed on that layout, not on a plain product's kernel)."""
        shape = {"m": self.box[2], "k": self.k, "n": self.box[3],
                 "batch": self.box[0] * self.box[1],
                 "dtype": self.desc.output_tensor.data_type.name.lower()}
        sb = self.strides[1]
        if sb[2] == 1 and sb[3] != 1:
            shape["b_along_k"] = True
        return shape

    def spans(self, origin, extent) -> list[tuple[int, int]]:
        """[lo, hi) elements of A, B, C and the output a box of the output reads/writes."""
        k = self.k
        sa, sb, sc, sy = self.strides
        oa, ea = origin[:3] + [0], extent[:3] + [k]
        ob, eb = origin[:2] + [0, origin[3]], extent[:2] + [k, extent[3]]
        return [strided_span(oa, ea, sa), strided_span(ob, eb, sb),
                strided_span(origin, extent, sc), strided_span(origin, extent, sy)]

    def _plan_windows(self):
        """Boxes of the output whose every tensor's span fits one binding (None: all
        fit whole)."""
        limit = self.ctx.limits["maxStorageBufferRange"]
        if max(self.bytes) <= limit:
            return None
        room = limit - 2 * self.ctx.binding_alignment()

        def in_span(origin, extent):     # the widest input span: each is bound on its own
            return 0, max(hi - lo for lo, hi in self.spans(origin, extent)[:3])

        return [(o, e) for o, e, *_ in plan_windows(
            self.box, in_span, lambda o, e: self.spans(o, e)[3], self.esize, self.esize,
            room, f"one output element of {self.desc.OPERATOR_TYPE}")]

    def _bindings(self, allocs, origin, extent):
        """The kernel's bindings A, B, C, output and the base element of each (a window's
        first bound element; 0 for whole tensors).  An absent C is bound to the output
        (HAS_C false: never read)."""
        if not self.has_c:
            allocs = allocs[:2] + [allocs[3], allocs[3]]
        if origin is None:
            nbytes = self.bytes[:2] + [self.bytes[2] or self.bytes[3], self.bytes[3]]
            binds = [Bind(a, 0, nb, "r", self.formats[i] if i < 2 else 0)
                     for i, (a, nb) in enumerate(zip(allocs[:3], nbytes))]
            return binds + [Bind(allocs[3], 0, nbytes[3], "w")], [0] * 4
        es, align = self.esize, self.ctx.binding_alignment()
        spans = self.spans(origin, extent)
        if not self.has_c:
            spans[2] = spans[3]
        binds, bases = [], []
        for i, (a, (lo, hi)) in enumerate(zip(allocs, spans)):
            off, size = binding_window(lo * es, hi * es, a.size, align)
            binds.append(Bind(a, off, size, "w" if i == 3 else "r"))
            bases.append(off // es)
        return binds, bases

    def encode(self, seq, inputs, outputs) -> None:
        allocs = [t.allocation if t is not None else None for t in inputs[:3]]
        allocs += [None] * (3 - len(allocs)) + [outputs[0].allocation]
        for origin, extent in self.windows or [(None, None)]:
            binds, bases = self._bindings(allocs, origin, extent)
            if origin is None:
                origin, extent = [0] * 4, list(self.box)
            binds.append(Bind(self.params))
            for o, e in self.split(origin, extent):
                push = pack(self.kernel, "push", origin=o, extent=e, a_base=bases[0],
                            b_base=bases[1], c_base=bases[2], y_base=bases[3])
                groups = (ceil_div(e[3], self.block_n), ceil_div(e[2], self.block_m), e[0] * e[1])
                seq.dispatch(self.pipe, binds, groups, push)

    def split(self, origin, extent) -> list[tuple[list, list]]:
        """The box as boxes whose grids fit ``maxComputeWorkGroupCount``: N and M in
        pieces of whole blocks, the (batch, channel) layers so that their product does."""
        gx, gy, gz = (int(v) for v in self.ctx.limits["maxComputeWorkGroupCount"])
        eb, ec = extent[0], extent[1]
        if eb * ec <= gz:
            layers = [(origin[0], eb, origin[1], ec)]
        elif ec <= gz:
            layers = [(b0, nb, origin[1], ec) for b0, nb in pieces(eb, gz // ec, origin[0])]
        else:
            layers = [(b0, 1, c0, nc) for b0 in range(origin[0], origin[0] + eb)
                      for c0, nc in pieces(ec, gz, origin[1])]
        return [([b0, c0, m0, n0], [nb, nc, nm, nn]) for b0, nb, c0, nc in layers
                for m0, nm in pieces(extent[2], gy * self.block_m, origin[2])
                for n0, nn in pieces(extent[3], gx * self.block_n, origin[3])]


def _path_class(shape) -> str:
    """GEMMs sharing a path choice: M, K, N and the layer count each within a factor of 4."""
    return shape["dtype"] + "".join(f" {k} 4^{int(shape[k]).bit_length() // 2}"
                                    for k in ("m", "k", "n", "batch")) + (
        " b along k" if shape.get("b_along_k") else "")


def _path_run(device, seq, cand, shape):
    """Record a packed GEMM of ``shape`` on candidate ``cand`` (B stored N x K where
    ``b_along_k``, as :meth:`CompiledGemm.shape` says the product is)."""
    dt, b, m, k, n = (shape.get("dtype", "float32"), int(shape.get("batch", 1)),
                      int(shape["m"]), int(shape["k"]), int(shape["n"]))
    along_k = bool(shape.get("b_along_k"))
    ts = [TensorDesc(dt, (b, r, c)) for r, c in ((m, k), (n, k) if along_k else (k, n), (m, n))]
    desc = GemmOperatorDesc(ts[0], ts[1], None, ts[2], trans_b=MatrixTransform(int(along_k)))
    op = CompiledGemm(device, desc, path=cand.params["path"],
                      sg_block=cand.params.get("sg_block"), k_block=cand.params.get("k_block"))
    if op.path != cand.params["path"]:
        op.release()
        raise tuning.Declined("the sg family does not take this product on this device")
    if cand.params.get("k_block") and not op.sg["KB"]:
        op.release()          # (the same kernel as the candidate without K blocking)
        raise tuning.Declined("no K blocking for this product")
    bufs = [device.empty((t.total_tensor_size_in_bytes,), np.uint8) for t in ts]
    op.encode(seq, bufs[:2] + [None], bufs[2:])

    def free():
        op.release()
        for t in bufs:
            t.free()
    return free


#: The families the device times once (tunable path ``gemm_family``), each with the
#: fast list's candidate of it, on :data:`FAMILY_SHAPE`.
FAMILIES = ("direct", "tiled", "sg-16x8")
#: The reference product of that timing: 64 x 64 by 64 float32, one workgroup of each
#: family but "tiled"'s four, milliseconds on the slowest device, where a hopeless family
#: already shows (lavapipe's "tiled" and SwiftShader's "sg" trail by an order of magnitude
#: and more at every size: bench/RESULTS.md, "Model operators").
FAMILY_SHAPE = {"m": 64, "k": 64, "n": 64, "batch": 1, "dtype": "float32"}
#: A family slower than this factor of the fastest on the reference leaves the fast lists
#: (the fast mode's own cut for a timed run, :data:`vkml.tuning.WARM_CUTOFF`): on SwiftShader
#: a family that far behind there was never ahead on a larger product either.
WEAK_FACTOR = float(tuning.WARM_CUTOFF)
#: The fewest rows (M) of a product whose fast list times "tiled" (:func:`_may_take`):
#: its classes M 4^0 and 4^1 (1-7 rows) leave it out whole.
TILED_MIN_ROWS = 8


def family_times(device) -> dict:
    """This device's own timing of each of :data:`FAMILIES` on :data:`FAMILY_SHAPE`
    (measured once per device and stored like any choice): ``{candidate: seconds}``;
    empty with tuning off.  Timed in the full mode, every family its rounds: the fast
    mode's cuts judge a family by one run, and one run disturbed by another process
    would leave a family out of every fast list of the device for good."""
    c = tuning.reference(device, FAMILY, FAMILY_SHAPE, mode="full")
    return dict(c.times or {}) if c is not None else {}


def _fast(shape, device) -> list[str]:
    """The fast list of ``gemm_path``: its candidates marked fast, less those whose family
    :func:`family_times` puts beyond :data:`WEAK_FACTOR` of the fastest (never the
    default).  Timing a hopeless family's first run is most of a cold call's cost: "tiled"
    took 15-18 s on lavapipe for one 1024-cubed product, where "sg" takes 0.05."""
    listed = [c.name for c in PATH.candidates if c.fast and _may_take(c, shape)]
    if len(listed) < 2:     # (nothing to rank: the ranking would only cost a cold start)
        return listed
    times = family_times(device)
    if not times:
        return listed
    best = min(times.values())
    return [n for n in listed
            if n == PATH.default or times.get(_family(n), 0.0) <= WEAK_FACTOR * best]


def _may_take(cand, shape) -> bool:
    """Whether fast-mode candidate ``cand`` is timed on ``shape``: an sg block takes no
    product of fewer rows than it has (:meth:`CompiledGemm._sg_constants`: its run would
    decline), and "tiled" none of fewer than :data:`TILED_MIN_ROWS` (its workgroups
    compute 8 invocation rows of 4-8 rows each whatever M: a classifier's one-row product
    wastes 31 of every 32, where "direct" puts all its lanes along N, :func:`block_shape`).
    A fully connected layer then times "direct" alone, without the device's family
    ranking first (three pipelines and their runs in a model's cold start); the full mode
    still times every candidate."""
    block = cand.params.get("sg_block")
    m = int(shape["m"])
    if block is not None:
        return m >= block[0]
    return cand.params["path"] != "tiled" or m >= TILED_MIN_ROWS


def _family(name: str) -> str:
    """The candidate of :data:`FAMILIES` that stands for candidate ``name`` in the
    device's ranking: a K-blocked sg candidate ("sg-16x8-k128") is its block's."""
    return name.split("-k")[0]


#: The GEMM kernel family: "direct" (the ``VKML_TUNE=off`` default, see
#: :meth:`CompiledGemm._choose_path`), "tiled" or "sg" with one of its register blocks
#: ("sg-16x8": 16 rows a subgroup, 8 columns a lane; the other blocks of SG_BLOCKS timed
#: in the full mode only: on lavapipe they ran slower than 16 x 8 at every square size
#: by process CPU time, so in the fast mode they only gave a noisy round a wrong pick;
#: "sg-16x8-k128", the same with K blocks of K_BLOCK, declined where the product has
#: fewer than K_BLOCKS_MIN of them, full mode only: it has shown no steady gain at 1024
#: cubed yet, bench/RESULTS.md, "Model operators"),
#: chosen by the device's timing for the shape's class (M, K, N and the layer count
#: within a factor of 4); the fast mode times only the families the device's ranking
#: keeps (:func:`_fast`).  "sg" is no default: lavapipe runs it faster than "direct",
#: SwiftShader several times slower.  ``recheck_cuts``: a candidate whose one timed
#: warm-up ran past 3x the fastest is run once more before the fast mode cuts it: one
#: scheduler stall in a sub-millisecond run had cut sg against a 4x slower direct, which
#: the class then kept until re-checked (bench/RESULTS.md, "Model operators").
PATH = tuning.register_path(
    "gemm_path", [("direct", {"path": "direct"}), ("tiled", {"path": "tiled"})]
    + [(f"sg-{mb}x{nb}", {"path": "sg", "sg_block": (mb, nb)}, i == 0)
       for i, (mb, nb) in enumerate(SG_BLOCKS)]
    + [(f"sg-16x8-k{K_BLOCK}", {"path": "sg", "sg_block": (16, 8), "k_block": K_BLOCK}, False)],
    "direct",
    _path_class, _path_run, fast_fn=_fast,
    work_fn=lambda s: 2.0 * float(s["m"]) * float(s["k"]) * float(s["n"]) * float(s["batch"]),
    examples=[{"m": 256, "k": 256, "n": 256, "batch": 1, "dtype": "float32"},
              {"m": 64, "k": 64, "n": 64, "batch": 16, "dtype": "float32"}],
    recheck_cuts=True)

FAMILY = tuning.register_path(
    "gemm_family", [c for c in PATH.candidates if c.name in FAMILIES], "direct",
    lambda _shape: "reference", _path_run, examples=[FAMILY_SHAPE])


def _transform(value, name: str) -> MatrixTransform:
    """A bool (True: transpose) or a DML_MATRIX_TRANSFORM member, value or name."""
    if isinstance(value, (bool, np.bool_)):
        return MatrixTransform(int(value))
    return enum_of(MatrixTransform, value, name, "DML_MATRIX_TRANSFORM_")


def _broadcast_desc(x, name: str, sizes) -> TensorDesc:
    """``x`` (its own contiguous elements) as a tensor of ``sizes``: NumPy's
    right-aligned broadcast, each broadcast dimension with stride 0."""
    shape = tuple(x.shape)
    if len(shape) > len(sizes) or any(s not in (1, w) for s, w in
                                      zip(shape[::-1], tuple(sizes)[::-1])):
        raise ValidationError(name, f"shape {shape} does not broadcast to {tuple(sizes)}")
    return broadcast_tensor_desc(np.dtype(x.dtype), shape, sizes)


def gemm(a, b, c=None, *, trans_a=False, trans_b=False, alpha=1.0, beta=1.0,
         fused_activation=None, device=None):
    """``fused_activation(alpha * op(a) @ op(b) + beta * c)``, ``DML_GEMM_OPERATOR_DESC``.

    ``a``, ``b``: float32 or float16 (the same), 2 to 4 dimensions ``(..., M, K)`` and
    ``(..., K, N)`` (``trans_a``/``trans_b``: True or a DML_MATRIX_TRANSFORM to read them
    as ``(..., K, M)``/``(..., N, K)``); leading (batch) dimensions broadcast as NumPy's
    ``matmul`` does (by zero strides, no copy).  ``c``: None or an array broadcasting to
    the result ``(..., M, N)``.  ``fused_activation``: None, an activation name or
    descriptor (ELEMENT_WISE_CLIP included)."""
    dev = pick_device(device, a, b, c)
    a, b = as_array(a, "a"), as_array(b, "b")
    c = as_array(c, "c", optional=True)
    ta, tb = _transform(trans_a, "trans_a"), _transform(trans_b, "trans_b")
    for x, name in ((a, "a"), (b, "b")):
        if not 2 <= len(x.shape) <= 4:
            raise ValidationError(name, f"must have 2 to 4 dimensions, got shape {tuple(x.shape)}")
    try:
        batch = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    except ValueError:
        raise ValidationError("b", f"batch dimensions {tuple(b.shape[:-2])} do not broadcast "
                              f"with a's {tuple(a.shape[:-2])}") from None
    m = a.shape[-1] if ta else a.shape[-2]
    n = b.shape[-2] if tb else b.shape[-1]
    ad = _broadcast_desc(a, "a", batch + tuple(a.shape[-2:]))
    bd = _broadcast_desc(b, "b", batch + tuple(b.shape[-2:]))
    yd = TensorDesc(ad.data_type, batch + (m, n))
    cd = None if c is None else _broadcast_desc(c, "c", yd.sizes)
    try:
        act = activation_desc(fused_activation)
    except ValidationError as exc:
        raise ValidationError("fused_activation", exc.rule) from None
    desc = GemmOperatorDesc(ad, bd, cd, yd, ta, tb, alpha=as_real(alpha, "alpha"),
                            beta=as_real(beta, "beta"), fused_activation=act)
    return run(dev, desc, [a, b, c])

"""Strided copies of 32-bit elements faster than one element a lane: a transpose (an
IDENTITY whose input and output are contiguous along different dimensions) and a row
read at a step (a SLICE1 with strides), ``glsl/permute.comp``.  No operator of its own:
:func:`plan` is called at the choice point of IDENTITY (``vkml/ops/element_wise.py``) and
of the slice family's kernel copies (``vkml/ops/join_split_slice.py``), which keep their
strided element path for every geometry, type or size this module declines.  Elements of
8, 16 or 64 bits come here only as rows of whole words contiguous both sides (a crop, a
join's or split's copy), copied as 32-bit words (:func:`as_words`).

* "tile": the output contiguous along p, the input along q: an invocation moves V tiles
  of 4 x 4 words (four uvec4 reads along q, a register transpose, four uvec4 stores
  along p); p's and q's extents, the other strides and the offsets on whole uvec4s.
* "rows": the output contiguous along its last dimension, the input at any step along
  it (negative too; 1: a crop the caller did not give the copy engine): V words of a
  row an invocation, scalar reads, uvec4 stores where output rows start on whole uvec4s.
  Where the step is 1 or 2 and every row's input starts at one offset within a uvec4
  (outer input strides multiples of 4), the "span" kernel can read the rows as uvec4s
  instead (two fetches give four words of a stride-2 slice) with the step and that
  offset compiled in (:func:`span_v` words an invocation).
* "rows" with REP (a nearest resample by an integer factor along rows,
  :mod:`vkml.ops.resample`, which builds its own geometry): output word c of a row reads
  input element c / REP; its ``texel4`` / ``ssbo4`` reads take a contiguous row's input
  as uvec4s.

* "r4" forms of the tile and span kernels: a box of at most four dimensions (padded to
  four), V compile-time, no coordinate array, the span's step and shift selecting one of
  eight register codes: SwiftShader keeps the plain kernels' arrays in memory and runs
  their loops rolled.
* "tsm": the tile kind's copy through a 32 x 32-word shared-memory tile
  (:func:`tsm_words`), a barrier between the reads along q and the writes along p.

Both read through an RGBA32UI / R32UI texel buffer ("texel": lavapipe vectorizes texel
fetches) or a storage buffer ("ssbo"), the rows kind as span rows where it can ("span_texel",
"span_ssbo"), in their r4 forms ("r4_texel", "r4_ssbo"), a transpose through shared
memory ("tsm_texel", "tsm_ssbo"), or are left to the strided path ("strided"): the tuner
chooses among them by measurement (:data:`PATH`; ``VKML_TUNE=off``: r4_texel).
Stores are u64vec4s (eight words) where the device's ``store_width`` timing says so
(:func:`vkml.ops.store_width.wide_stores`).  Whole tensors are bound (bindings past
``maxStorageBufferRange`` or the texel limit are declined: the strided path windows
them); grids past ``maxComputeWorkGroupCount`` split.
"""
from __future__ import annotations

import math

import numpy as np

from .. import tuning
from ..intmath import ceil_div, round_up
from ..runtime import FORMAT_R32_UINT, FORMAT_RGBA32_UINT, Bind
from ..runtime.blocks import pack
from .store_width import wide_stores
from .grid import box_grid, div_magic, record_on_scratch, split_groups, words8

__all__: list[str] = []     # helpers only: no functional form

#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = dict.fromkeys(["permute_tile_texel4", "permute_tile_ssbo4", "permute_rows_texel",
                          "permute_rows_ssbo", "permute_rows_texel4", "permute_rows_ssbo4"],
                         ("LOCAL_SIZE_X", "LOCAL_SIZE_Y", "RANK", "V", "VEC4", "REP"))
VARIANTS.update(dict.fromkeys(["permute_span_texel4", "permute_span_ssbo4"],
                              ("LOCAL_SIZE_X", "LOCAL_SIZE_Y", "RANK", "V", "VEC4", "REP",
                               "SPAN_STEP", "SPAN_SHIFT")))
VARIANTS.update(dict.fromkeys(["permute_tile_r4_texel4", "permute_tile_r4_ssbo4"],
                              ("LOCAL_SIZE_X", "LOCAL_SIZE_Y", "VEC4", "REP")))
VARIANTS.update(dict.fromkeys([f"permute_span_r4_{r}4_v{v}" for r in ("texel", "ssbo")
                               for v in (8, 16, 32)],
                              ("LOCAL_SIZE_X", "LOCAL_SIZE_Y", "VEC4", "REP", "SPAN_STEP",
                               "SPAN_SHIFT")))
VARIANTS.update({k + "_u64": v for k, v in VARIANTS.items()})
VARIANTS.update(dict.fromkeys(["permute_tsm_texel", "permute_tsm_ssbo"],
                              ("LOCAL_SIZE_X", "LOCAL_SIZE_Y")))
#: The choices: the kernel reading through a texel buffer or a storage buffer, with the
#: span rows where the geometry has them ("span_*": on lavapipe faster than the scalar
#: rows; on SwiftShader, which unrolls no loop bounded by V, so that their register
#: arrays live in memory, a stride-2 slice's copy 1.3-3x slower), or not this module at
#: all (the caller's strided element path).  "r4_*": the tile and span kernels' forms for a
#: box of at most four dimensions, V compile-time and no coordinate array (the forms
#: SwiftShader runs in registers); "tsm_*": a transpose's copy through a shared-memory
#: tile (the layout a GPU's memory favours; on the CPU drivers far slower, so only
#: ``VKML_TUNE=full`` times it); other copies take the plain kernel of the same read.
CHOICES = ("texel", "ssbo", "span_texel", "span_ssbo", "r4_texel", "r4_ssbo", "tsm_texel",
           "tsm_ssbo", "strided")
#: Dimensions of the r4 kernels' box (the host pads a smaller one).
R4_RANK = 4

_U32 = 0xFFFFFFFF
#: Row steps the span rows read as uvec4s (module doc): a step of 4 or more would fetch a
#: uvec4 per output word, no fewer fetches than the scalar reads.
SPAN_STEPS = (1, 2)


def coalesce(box, src, dst):
    """Drop size-1 dimensions and merge neighbours both stride sets keep contiguous."""
    dims = [(n, s, d) for n, s, d in zip(box, src, dst) if n > 1] or [(1, 1, 1)]
    out = [list(dims[-1])]
    for n, s, d in reversed(dims[:-1]):
        inner = out[0]
        if s == inner[1] * inner[0] and d == inner[2] * inner[0]:
            inner[0] *= n
        else:
            out.insert(0, [n, s, d])
    return [o[0] for o in out], [o[1] for o in out], [o[2] for o in out]


def geometry(box, src_st, dst_st, src_off: int = 0, dst_off: int = 0) -> dict | None:
    """The kernel's box, strides (its units) and bases for a copy of 32-bit elements
    ``dst[dst_off + c . dst_st] = src[src_off + c . src_st]`` (strides in elements, of
    either sign), or None where neither kind applies (module doc)."""
    box, src, dst = coalesce(box, src_st, dst_st)
    if 1 not in dst or math.prod(box) < 16:
        return None
    p = dst.index(1)
    q = src.index(1) if 1 in src else None
    if q == p:                      # rows contiguous both sides (a crop): rows, step 1
        q = None
    outer = [d for d in range(len(box)) if d not in (p, q)]
    if (q is not None and box[p] % 4 == 0 and box[q] % 4 == 0 and src_off % 4 == 0
            and dst_off % 4 == 0 and all(src[d] % 4 == 0 for d in outer + [p])
            and all(dst[d] % 4 == 0 for d in outer + [q])):
        order = outer + [q, p]
        ext = [box[d] // 4 if d in (p, q) else box[d] for d in order]
        ins = [1 if d == q else src[d] if d == p else src[d] // 4 for d in order]
        outs = [1 if d == p else dst[d] if d == q else dst[d] // 4 for d in order]
        return {"kind": "tile", "box": ext, "in": ins, "out": outs,
                "bases": (-src_off // 4, -dst_off // 4), "vec4": True}
    order = [d for d in range(len(box)) if d != p] + [p]
    geo = {"kind": "rows", "box": [box[d] for d in order], "in": [src[d] for d in order],
           "out": [dst[d] for d in order], "bases": (-src_off, -dst_off),
           "vec4": dst_off % 4 == 0 and all(dst[d] % 4 == 0 for d in order[:-1])}
    if src[p] in SPAN_STEPS and all(src[d] % 4 == 0 for d in order[:-1]):
        # every row starts src_off mod 4 words into a uvec4 (2^32 is a multiple of 4,
        # so negative outer strides keep it)
        geo["span"] = (src[p], src_off % 4)
    return geo


def as_words(box, src_st, dst_st, esize: int, src_off: int = 0, dst_off: int = 0):
    """A copy of ``esize``-byte elements as one of 32-bit words (box, strides, offsets),
    or None: only rows contiguous both sides, each starting on a whole word and of whole
    words (a crop, a join or split's copy of 8, 16 or 64-bit elements): what the rows
    and span kernels move is bits, while a step or a transpose of such elements would
    need sub-word or pair moves they do not make."""
    box, src, dst = coalesce(box, src_st, dst_st)
    if src[-1] != 1 or dst[-1] != 1 or any(
            v * esize % 4 for v in (box[-1], src_off, dst_off, *src[:-1], *dst[:-1])):
        return None
    w = lambda v: v * esize // 4      # noqa: E731  (exact: a multiple of 4 bytes)
    return ([*box[:-1], w(box[-1])], [*map(w, src[:-1]), 1], [*map(w, dst[:-1]), 1],
            w(src_off), w(dst_off))


def span_v(n: int, step: int = 1) -> int:
    """Words an invocation of the span rows copies along a row of ``n`` at ``step``: of 32
    (step 1: at step 2 its 16 uvec4s of registers), 16 and 8 (multiples of 8: whole
    u64vec4 stores, and every invocation's first input word SPAN_SHIFT into a uvec4), the
    one leaving the least of a row's last invocation idle (the grid runs over rows and
    chunks alike: no other lane idles), the larger on a tie (fewer invocations)."""
    return max((32, 16, 8) if step == 1 else (16, 8),
               key=lambda v: (round(n / (ceil_div(n, v) * v), 3), v))


def tsm_words(geo: dict) -> dict:
    """A tile geometry (quads of p and q, strides in uvec4s) in words, for the shared-
    memory tile kernel: p's and q's extents four times theirs; a quad of p is four input
    rows of p, so its uvec4 stride is p's word stride (q's likewise on the output)."""
    n = len(geo["box"])
    return {**geo, "kind": "tsm", "box": [*geo["box"][:-2], 4 * geo["box"][-2], 4 * geo["box"][-1]],
            "in": [*(4 * s for s in geo["in"][:-2]), 1, geo["in"][-1]],
            "out": [*(4 * s for s in geo["out"][:n - 2]), geo["out"][-2], 1],
            "bases": tuple(4 * b for b in geo["bases"])}


def _rows_on_eights(geo: dict) -> bool:
    """Every output row of a rows geometry starts on a multiple of 8 words: the span
    kernel's u64vec4 stores (whole chunks of V, a multiple of 8, from there) need it of
    every row, checked here once, not per lane."""
    return geo["bases"][1] % 8 == 0 and all(s % 8 == 0 for s in geo["out"][:-1])


class StridedCopy:
    """One planned copy on ``glsl/permute.comp`` for host operator ``op`` (its pipelines
    and uploads are the host's): :func:`plan` builds it, :meth:`encode` records it."""

    def __init__(self, op, geo: dict, read: str, in_bytes: int, out_bytes: int,
                 span: bool = False, fixed: bool = False, tsm: bool = False):
        self.op, self.geo, self.read = op, geo, read
        self.in_bytes, self.out_bytes = in_bytes, out_bytes
        if tsm:                          # (plan: a tile geometry of at most R4_RANK)
            geo = self.geo = tsm_words(geo)
            fixed = True
        tile = geo["kind"] == "tile"
        span = geo.get("span") if span and not tile and not read.endswith("4") else None
        self.span = span or (1, 0)
        self.fixed = fixed and (tile or tsm or span is not None) and len(geo["box"]) <= R4_RANK
        # two tiles (32 words) or 8 words an invocation: more held lavapipe back
        self.v = (2 if geo["box"][-1] >= 2 or self.fixed else 1) if tile else (
            8 if geo["box"][-1] >= 8 else 4)
        if span:
            self.v = span_v(geo["box"][-1], span[0])
        # the span grid takes rows and a row; the r4 kernels a box of four dimensions
        pad = R4_RANK if self.fixed else 2 if span else 0
        if len(geo["box"]) < pad:
            k = pad - len(geo["box"])
            geo = self.geo = {**geo, "box": [1] * k + geo["box"], "in": [0] * k + geo["in"],
                              "out": [0] * k + geo["out"]}
        self.kernel = self._kernel_name(tile, span is not None)
        if read.endswith("4") and not tile:
            # the rows' quad reads (a resample's REP): whole uvec4s of input an invocation,
            # two where REP is 1 or 2 (eight or sixteen output words)
            rep = geo.get("rep", 1)
            self.v = 4 * rep * (2 if rep <= 2 else 1)
        self.params = op.upload(np.frombuffer(pack(
            self.kernel, "Params", in_stride=words8(s & _U32 for s in geo["in"]),
            out_stride=words8(s & _U32 for s in geo["out"])), np.uint8))

    def _kernel_name(self, tile: bool, span: bool) -> str:
        """The variant: kind, fixed rank (r4, V in the name where it is the span's),
        read, and u64vec4 stores where the device's timing says so (the span's only
        where every output row starts on 8 words)."""
        r4 = "_r4" if self.fixed else ""
        read = self.read
        if self.geo["kind"] == "tsm":
            return f"permute_tsm_{read}"
        name = (f"permute_tile{r4}_{read}4" if tile
                else f"permute_span{r4}_{read}4" + (f"_v{self.v}" if r4 else "") if span
                else f"permute_rows_{read}")
        if wide_stores(self.op.device) and (not span or _rows_on_eights(self.geo)):
            name += "_u64"
        return name

    def _span_constants(self) -> dict:
        if "span" not in self.kernel:
            return {}
        return {"SPAN_STEP": self.span[0], "SPAN_SHIFT": self.span[1]}

    def _pipeline(self, lx: int, ly: int):
        if self.geo["kind"] == "tsm":
            return self.op.pipeline(self.kernel, {"LOCAL_SIZE_X": lx, "LOCAL_SIZE_Y": ly})
        # the r4 kernels' RANK and V are compile-time (the variant)
        shape = {} if self.fixed else {"RANK": len(self.geo["box"]), "V": self.v}
        return self.op.pipeline(self.kernel, {"LOCAL_SIZE_X": lx, "LOCAL_SIZE_Y": ly,
                                              **shape, "VEC4": bool(self.geo["vec4"]),
                                              "REP": self.geo.get("rep", 1),
                                              **self._span_constants()})

    def _encode_span(self, seq, binds) -> None:
        """The span rows' dispatches: x over the last two dimensions in V-word chunks of
        a row (the kernel's SPAN grid), y the one before, z the rest; pieces cut in
        chunks by :func:`split_groups`, the kernel's magic[LAST] dividing by a piece's
        chunks a row."""
        box, v = self.geo["box"], self.v
        ctx = self.op.ctx
        chunks = [*box[:-1], ceil_div(box[-1], v)]
        # 256 invocations timed 5-15% faster than 64 on lavapipe (its cost per workgroup)
        lx = min(256, self.op.workgroup_size, max(8, round_up(math.prod(chunks[-2:]), 8)))
        pipe = self._pipeline(lx, 1)
        bases = [b & _U32 for b in self.geo["bases"]]
        for oc, ec in split_groups([0] * len(box), chunks, lx,
                                   ctx.limits["maxComputeWorkGroupCount"], 2, 1, 1):
            o = [*oc[:-1], oc[-1] * v]
            e = [*ec[:-1], min(ec[-1] * v, box[-1] - o[-1])]
            magic = [*map(div_magic, e[:-1]), div_magic(ec[-1])]
            push = pack(self.kernel, "push", origin=words8(o), extent=words8(e),
                        in_base=bases[0], out_base=bases[1], x_count=ec[-2] * ec[-1],
                        magic=words8(magic))
            seq.dispatch(pipe, binds, box_grid(ec, lx, 2, 1, 1), push)

    def _encode_tsm(self, seq, binds) -> None:
        """The shared-memory tile's dispatches: a 32 x 8 workgroup a 32 x 32-word tile of
        (q, p), x along p, y along q, z the two outer dimensions (the kernel's TS, TY)."""
        box, ctx = self.geo["box"], self.op.ctx
        pipe = self._pipeline(32, 8)
        bases = [b & _U32 for b in self.geo["bases"]]
        for o, e in split_groups([0] * len(box), list(box), 32,
                                 ctx.limits["maxComputeWorkGroupCount"], 1, 1, 32):
            push = pack(self.kernel, "push", origin=words8(o), extent=words8(e),
                        in_base=bases[0], out_base=bases[1], x_count=e[-1],
                        magic=words8(map(div_magic, e)))
            seq.dispatch(pipe, binds, box_grid(e, 32, 1, 1, 32), push)

    def encode(self, seq, src, dst) -> None:
        """The copy from allocation ``src`` to ``dst`` (whole tensors bound)."""
        geo, box = self.geo, self.geo["box"]
        quads = geo["kind"] == "tile" or self.read.endswith("4") or "span" in self.kernel
        fmt = FORMAT_RGBA32_UINT if quads else FORMAT_R32_UINT
        size = min(round_up(self.in_bytes, 16), src.size)
        rd = Bind(src, 0, size, "r", fmt) if self.read.startswith("texel") else Bind(
            src, 0, size, "r")
        binds = [rd, Bind(dst, 0, self.out_bytes, "rw"), Bind(self.params)]
        if "span" in self.kernel:
            self._encode_span(seq, binds)
            return
        if geo["kind"] == "tsm":
            self._encode_tsm(seq, binds)
            return
        ctx = self.op.ctx
        local = min(64, self.op.workgroup_size)
        lx = min(local, max(8, round_up(ceil_div(box[-1], self.v), 8)))
        ly = 1
        if len(box) > 1:
            ly = max(1, min(local // lx, box[-2], int(ctx.limits["maxComputeWorkGroupSize"][1])))
        pipe = self._pipeline(lx, ly)
        bases = [b & _U32 for b in geo["bases"]]
        for o, e in split_groups([0] * len(box), list(box), lx,
                                 ctx.limits["maxComputeWorkGroupCount"], 1, self.v, ly):
            push = pack(self.kernel, "push", origin=words8(o), extent=words8(e),
                        in_base=bases[0], out_base=bases[1], x_count=ceil_div(e[-1], self.v),
                        magic=words8(map(div_magic, e)))
            seq.dispatch(pipe, binds, box_grid(e, lx, 1, self.v, ly), push)


def plan(op, box, src_st, dst_st, esize: int, in_bytes: int, out_bytes: int,
         src_off: int = 0, dst_off: int = 0, force: str | None = None) -> StridedCopy | None:
    """A :class:`StridedCopy` of the copy (:func:`geometry`'s arguments) for host
    operator ``op``, or None: elements not of 32 bits whose rows :func:`as_words` does
    not take, a geometry neither kind takes,
    tensors past one binding, or the strided path chosen (``force``: one of
    :data:`CHOICES`; None: the tuner's choice)."""
    if force == "strided":
        return None
    if esize != 4:
        words = as_words(box, src_st, dst_st, esize, src_off, dst_off)
        if words is None:
            return None
        box, src_st, dst_st, src_off, dst_off = words
    geo = geometry(box, src_st, dst_st, src_off, dst_off)
    lim = op.ctx.limits
    if geo is None or max(in_bytes, out_bytes) > lim["maxStorageBufferRange"]:
        return None
    read = force
    if read is None:
        tile = geo["kind"] == "tile"
        shape = {"kind": "span" if "span" in geo else geo["kind"],
                 "words": math.prod(geo["box"]) * (16 if tile else 1)}
        if "span" in geo:       # the proxy copies rows of this step and length
            shape |= {"step": geo["span"][0], "row": geo["box"][-1]}
        choice = tuning.choose(op.device, PATH, shape)
        op.observe_choice(choice, shape, PATH)
        read = choice.name
        if read == "strided":
            return None
    fixed, tsm = read.startswith("r4_"), read.startswith("tsm_")
    span = (read.startswith("span_") or fixed) and "span" in geo
    read = read.split("_")[-1]
    tsm = tsm and geo["kind"] == "tile" and len(geo["box"]) <= R4_RANK
    unit = 16 if (geo["kind"] == "tile" and not tsm) or span else 4   # RGBA32UI or R32UI
    if read == "texel" and ceil_div(in_bytes, unit) > lim["maxTexelBufferElements"]:
        read = "ssbo"
    return StridedCopy(op, geo, read, in_bytes, out_bytes, span=span, fixed=fixed, tsm=tsm)


def _class(shape) -> str:
    """Copies sharing a choice: kind, words to the power of 4; span rows also by step and
    row length to the power of 2 (a crop's rows of step 1 and a stride-2 slice's do not
    rank the candidates alike, nor do short rows and long)."""
    out = f"{shape['kind']} 4^{int(shape['words']).bit_length() // 2}"
    if "step" in shape:
        out += f" step {shape['step']} row 2^{(int(shape['row']) - 1).bit_length()}"
    return out


def _run(device, seq, cand, shape):
    """Record a float32 copy of the shape's kind and size on candidate ``cand``: a
    transpose of 64 rows (tile), a slice of rows of the shape's step and length (span;
    without them 64 rows at step 2) or 64 rows at step 3 (rows)."""
    from ..dml.element_wise import ElementWiseIdentityOperatorDesc
    from ..dml.join_split_slice import Slice1OperatorDesc
    from ..dml.tensor_desc import TensorDesc
    from .element_wise import CompiledElementWise
    from .join_split_slice import CompiledSlice
    n = max(64, int(shape["words"]))
    w = max(4, round_up(n // 64, 4))
    force = cand.params["permute"]
    if force.startswith("span_") and shape["kind"] != "span":
        raise tuning.Declined(f"{cand.name}: no span rows in a {shape['kind']} copy")
    if force.startswith("tsm_") and shape["kind"] != "tile":
        raise tuning.Declined(f"{cand.name}: no transpose in a {shape['kind']} copy")
    if force.startswith("r4_") and shape["kind"] == "rows":
        raise tuning.Declined(f"{cand.name}: the plain rows kernel's copy")
    if shape["kind"] == "tile":
        x = TensorDesc("float32", (64, w), (1, 64))
        y = TensorDesc("float32", (64, w))
        op = CompiledElementWise(device, ElementWiseIdentityOperatorDesc(x, y), permute=force)
    else:
        step = int(shape.get("step", 2)) if shape["kind"] == "span" else 3
        rows = 64
        if "row" in shape:
            w = max(1, int(shape["row"]))
            rows = max(1, n // w)
        x = TensorDesc("float32", (rows, round_up(step * w + 4, 4)))
        y = TensorDesc("float32", (rows, w))
        # the kernel path: a step-1 copy's rows would otherwise ask the copy engine's tuner
        op = CompiledSlice(device, Slice1OperatorDesc(x, y, (0, 0), (rows, step * w),
                                                      (1, step)), path="kernel", permute=force)
    if force != "strided" and op.permuted is None:
        op.release()
        raise tuning.Declined(cand.name)
    return record_on_scratch(device, seq, op, x, y)


#: A strided copy of 32-bit elements this module takes: its kernel reading through a
#: texel buffer ("texel") or a storage buffer ("ssbo"), with the span rows where they
#: apply ("span_texel", "span_ssbo"), the r4 or shared-memory forms (:data:`CHOICES`),
#: or the caller's strided element path ("strided"), by measurement.  ``VKML_TUNE=off``:
#: "r4_texel", the fastest of them on both CPU drivers for a transpose and a step-2
#: slice (bench/RESULTS.md) where the plain span rows ran slower than scalar rows on
#: SwiftShader.
PATH = tuning.register_path(
    "permute", [(c, {"permute": c}, not c.startswith("tsm")) for c in CHOICES], "r4_texel",
    _class, _run,
    examples=[{"kind": "tile", "words": 64 * 112 * 112},
              {"kind": "span", "words": 64 * 56 * 56}],
    work_fn=lambda shape: float(shape["words"]))

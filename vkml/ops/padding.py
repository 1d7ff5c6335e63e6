"""Padding: ``DML_PADDING_OPERATOR_DESC`` / ``DML_PADDING1_OPERATOR_DESC`` and ``vkml.pad``.

Kernel: ``glsl/padding.comp``, one variant per element width (1, 2, 4, 8 bytes), so all
eleven data types run on every device: padding moves bits and needs no 64-bit or 16-bit
arithmetic.  Devices without 8/16-bit storage use the ``_packed`` variants (elements
inside 32-bit words).

Three ways to fill the output, chosen per device from a calibrated cost model
(:mod:`.calibrate`, a measured model of :mod:`vkml.tuning`), never by name;
``CompiledPadding(device, desc, path="rows")`` forces one:

* "rows" (``glsl/padding_rows.comp``): when the innermost dimension has unit stride in
  both tensors, each output row is a border, a copy of an input row, a border.  One
  dispatch writes the whole 16-byte words inside each row's copy (RGBA32UI texel reads
  shifted into place, uvec4 stores), a second the few elements around them: on lavapipe
  far faster than the element kernel (bench/RESULTS.md, "Kernel design").  Where rows
  are 16-byte aligned and each border fits a row's first or last word, one dispatch
  writes whole rows instead (``rows_full``; docs/DEVELOPING.md, "Why the 16 MiB
  padding moved bytes slower").  On devices with int64 shaders the words may go out as
  u64vec4 pairs instead of uvec4s (``rows_u64``, variant ``padding_rows_u64``; lavapipe
  stores per component, not per byte), where a large padding's timing chooses it.
* "kernel": the element kernel writes every output element (any layout, any size).
* "copy": the copy engine copies the interior (``vkCmdCopyBuffer`` regions, one per
  contiguous run) while the kernel writes only the border boxes: best for a few long runs
  (each region has a fixed cost, docs/DEVELOPING.md).

Tensors larger than ``maxStorageBufferRange`` are split into dispatches that each bind a
window of the input and output (element kernel; :func:`.grid.plan_windows`).
"""
from __future__ import annotations

import math

import numpy as np

from .. import tuning
from ..dml.operator import as_real, as_tuple
from ..dml.padding import Padding1OperatorDesc, PaddingMode, PaddingOperatorDesc
from ..dml.tensor_desc import TensorDesc
from ..errors import ValidationError
from ..runtime import FORMAT_RGBA32_UINT, Bind
from ..runtime.blocks import pack
from ..tensor import Tensor
from .base import CompiledOperator, implements
from . import calibrate
from .calibrate import PATHS, large_path, padding_model
from .grid import (binding_window, box_grid, check_allocatable, div_magic, pick_xdims,
                   plan_windows, split_groups, strided_span)
from .functional import as_array, pick_device, prepared, run, run_prepared
from ..intmath import ceil_div

__all__ = ["pad"]

#: Kernel variants this module requests ("padding" or "padding_rows", + "_e<element
#: bytes>", + "_packed" without 8/16-bit storage) and the specialization constants it sets.
_SUFFIXES = ("_e1", "_e1_packed", "_e2", "_e2_packed", "_e4", "_e8")
VARIANTS = {**dict.fromkeys((f"padding{s}" for s in _SUFFIXES),
                            ("LOCAL_SIZE_X", "RANK", "MODE", "XDIMS")),
            **dict.fromkeys((f"padding_rows{s}" for s in _SUFFIXES + ("_u64",)),
                            ("LOCAL_SIZE_X", "LOCAL_SIZE_Y", "RANK", "MODE", "EDGE", "PER",
                             "SIMPLE", "SHIFT", "ROWS_FULL", "ROWS_BL", "ROWS_BR"))}
VARIANTS["padding_rows_u64"] += ("ROWS_BL1", "ROWS_BR1")
#: 16-byte words per invocation of the rows kernel, for tensors (input + output) up to
#: ROWS_PER_BYTES and beyond: more words a lane amortize the row's arithmetic and the
#: extra texel, fewer keep the lanes' write streams few (lavapipe's measured optimum).
ROWS_PER = (8, 4)
ROWS_PER_BYTES = 64 << 20
#: Words per invocation of the whole-rows dispatch (``rows_full``), or one more where that
#: leaves fewer idle at a row's end: lavapipe's fastest of those measured (more words
#: spill the texels an invocation holds).
FULL_PER = 4
#: Most words per invocation a ``rows_block`` may ask for (the kernel unrolls them).
ROWS_PER_MAX = 16
#: Outputs below this many bytes take the element kernel without measuring anything.
SMALL_BYTES = 64 << 10
#: Edge elements per invocation of the rows path: one row's (up to 16, unrolled), so its
#: arithmetic is shared (lavapipe: a row per vector lane beats a slot per lane).
EDGE_PER = 16


def _merge_dims(in_sizes, out_sizes, in_strides, out_strides, start):
    """Fold unpadded neighbours into one dimension, and drop unpadded size-1 dimensions."""
    dims = [list(d) for d in zip(in_sizes, out_sizes, in_strides, out_strides, start)
            if not (d[0] == 1 and d[1] == 1)]
    if not dims:
        return [[1, 1, 1, 1, 0]]
    merged = [dims[0]]
    for d in dims[1:]:
        p = merged[-1]
        unpadded = p[0] == p[1] and d[0] == d[1]
        if unpadded and p[2] == d[0] * d[2] and p[3] == d[1] * d[3]:
            merged[-1] = [p[0] * d[0], p[1] * d[1], d[2], d[3], 0]
        else:
            merged.append(d)
    return merged


@implements(PaddingOperatorDesc, Padding1OperatorDesc)
class CompiledPadding(CompiledOperator):
    """``path``: None chooses by the device's calibrated costs; "rows", "kernel" or
    "copy" force that path (calibration, tests; "rows" and "copy" fall back to the
    element kernel where they do not apply).  ``rows_block``: (workgroup size, words per
    invocation) of the rows path's words pass (None: ``self.local``, :data:`ROWS_PER`;
    a large padding's timing may choose another, :data:`.calibrate.ROWS_BLOCKS`).
    ``rows_full``: whether the rows path writes whole rows in one dispatch where every
    output row is 16-byte aligned (True, the default there) or the words and the edge
    elements in two (False); a large padding's timing tries both.  ``rows_u64``: the
    words as u64vec4 pairs and u64vec2s (True; devices with int64 shaders, words per
    invocation even, rows longer than an invocation's words, else uvec4s) or uvec4s
    (None, False; a large padding's timing may choose True, :data:`.calibrate.U64_BLOCKS`)."""

    def __init__(self, device, desc, path: str | None = None,
                 rows_block: tuple | None = None, rows_full: bool | None = None,
                 rows_u64: bool | None = None):
        if path is not None and path not in PATHS:
            raise ValidationError("path", f"must be None or one of {PATHS}, got {path!r}")
        ints = isinstance(rows_block, (tuple, list)) and len(rows_block) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in rows_block)
        if rows_block is not None and not (
                ints and rows_block[0] >= 1 and 1 <= rows_block[1] <= ROWS_PER_MAX):
            raise ValidationError("rows_block", f"must be None or (workgroup size >= 1, words "
                                  f"per invocation 1..{ROWS_PER_MAX}), got {rows_block!r}")
        if rows_full is not None and not isinstance(rows_full, bool):
            raise ValidationError("rows_full", f"must be None, True or False, got {rows_full!r}")
        if rows_u64 is not None and not isinstance(rows_u64, bool):
            raise ValidationError("rows_u64", f"must be None, True or False, got {rows_u64!r}")
        self.path = path
        self.rows_block = None if rows_block is None else tuple(rows_block)
        self.rows_full = rows_full
        self.rows_u64 = rows_u64
        #: (tuning key, path, predicted seconds, stale factor) where the model or the
        #: timing of a large padding chose the path: the sampled executions re-check it
        #: (ops/base.py).
        self.observed = None
        super().__init__(device, desc)

    def build(self) -> None:
        d = self.desc
        src, dst = d.input_tensor, d.output_tensor
        self.esize = esize = src.data_type.size
        dims = _merge_dims(src.sizes, dst.sizes, src.element_strides, dst.element_strides,
                           d.start_padding)
        self.in_size = [x[0] for x in dims]
        self.out_size = [x[1] for x in dims]
        self.in_stride = [x[2] for x in dims]
        self.out_stride = [x[3] for x in dims]
        self.start = [x[4] for x in dims]
        self.mode = d.mode
        native = {1: "storage8", 2: "storage16"}.get(esize)
        self.packed = native is not None and not self.features[native]
        suffix = f"_e{esize}" + ("_packed" if self.packed else "")
        self.local = min(64, self.workgroup_size)
        self.kernel = "padding" + suffix
        bits = d.value_bits()
        self.bits = bits
        self.in_bytes = src.total_tensor_size_in_bytes
        self.out_bytes = dst.total_tensor_size_in_bytes
        self.total = math.prod(self.out_size)
        check_allocatable(self.ctx, self.in_bytes, "the input tensor")
        check_allocatable(self.ctx, self.out_bytes, "the output tensor")
        max_range = self.ctx.limits["maxStorageBufferRange"]
        self.split = max(self.in_bytes, self.out_bytes) > max_range
        self.copy_regions = None
        self.rows = None
        rows = self._rows_plan() if self.path in (None, "rows") else None
        copy_ok = not self.split and src.is_packed and dst.is_packed and self.path != "kernel"
        path = self.path or self._cheapest(rows, copy_ok)
        self.full = None
        self.u64 = False
        if path == "rows" and rows is not None:
            self.rows = rows
            if self.rows_full is not False:
                self.full = self.full_plan()
            self.u64 = self.full["u64"] if self.full is not None else self._u64_ok(rows)
            self.rows_kernel = "padding_rows" + suffix
            self.params = self._rows_params(rows)
            return
        self.value = self.upload(np.array([bits], dtype=np.dtype(f"u{esize}")))
        if path == "copy" and copy_ok:
            self.copy_regions = self._interior_regions()
        self.boxes = self._border_boxes() if self.copy_regions is not None else \
            [([0] * len(self.out_size), list(self.out_size))]
        self.params = self.upload_block(
            self.kernel, "Params", value_bits=[bits & 0xFFFFFFFF, 0, 0, 0],
            in_size=self.in_size, start=self.start, in_stride=self.in_stride,
            out_stride=self.out_stride)

    def _cheapest(self, rows: dict | None, copy_ok: bool) -> str:
        """The path of least estimated device time, from this device's calibrated costs
        (:data:`MODEL`: fixed + per row + per byte).  Small outputs take the element
        kernel: one dispatch is as good as anything there, nothing to measure."""
        if self.out_bytes < SMALL_BYTES or (rows is None and not copy_ok):
            return "kernel"
        model = tuning.default_tuner().model(self.device, MODEL)
        cost = model.params
        out_rows = math.prod(self.out_size[:-1])
        nbytes = self.total * self.esize
        est = {}
        for path, (fixed, per_row, per_byte) in cost.items():
            if path == "kernel":
                est[path] = fixed + per_row * out_rows + per_byte * nbytes
            elif path == "rows" and rows is not None:
                # calibrated with 8 edge elements a row; wider borders cost proportionally
                slots = (rows["left"] + rows["right"]) / 8
                est[path] = fixed + per_row * out_rows * max(1.0, slots) + per_byte * nbytes
            elif path == "copy" and copy_ok:
                nregions = self._interior_region_count()
                border = (self.total - math.prod(self.in_size)) * self.esize
                if nregions <= 1 << 22 and "kernel" in cost:
                    est[path] = (fixed + per_row * nregions + per_byte * nbytes
                                 + cost["kernel"][2] * border)
        if not est:
            return "kernel"
        path = min(est, key=est.get)
        if model.source == "default":
            return path
        self.observed = (model.key, path, est[path], MODEL.stale_factor)
        if self.in_bytes + self.out_bytes >= calibrate.LARGE_BYTES:
            near = sorted(p for p in est if est[p] <= calibrate.LARGE_SPREAD * est[path])
            # the rows path alone still has its blocks to time (calibrate.large_path)
            if len(near) > 1 or near == ["rows"]:
                return self._time_large(near, path)
        return path

    def _time_large(self, near: list, path: str) -> str:
        """Past the model's points: the fastest of ``near`` timed at this padding's size
        class (:func:`.calibrate.large_path`), or ``path`` where none could be timed."""
        d = self.desc
        src, dst = d.input_tensor, d.output_tensor
        if not (src.is_packed and dst.is_packed):
            return path
        shape = {"in": list(src.sizes), "out": list(dst.sizes), "start": list(d.start_padding),
                 "mode": self.mode.name.lower(), "dtype": np.dtype(src.dtype).name,
                 "esize": self.esize, "bytes": self.in_bytes + self.out_bytes,
                 "run": self.in_size[-1] * self.esize, "paths": near}
        choice = tuning.choose(self.device, LARGE, shape)
        chosen = choice.params.get("path")
        if choice.source not in ("measured", "stored") or chosen not in near:
            return path
        self.observe_choice(choice, shape, LARGE)
        if "block" in choice.params:
            self.rows_block = tuple(choice.params["block"])
        if "full" in choice.params:
            self.rows_full = bool(choice.params["full"])
        if "u64" in choice.params:
            self.rows_u64 = bool(choice.params["u64"])
        return chosen

    @property
    def taken(self) -> str:
        """The path this operator runs: "rows", "copy" or "kernel"."""
        return "rows" if self.rows is not None else \
            "copy" if self.copy_regions is not None else "kernel"

    # -- host-side planning ------------------------------------------------------------
    def _rows_plan(self) -> dict | None:
        """The rows path's geometry, or None where it does not apply: the innermost
        dimension must have unit stride in both tensors and a copied run holding whole
        16-byte words, and the input must fit one RGBA32UI texel binding."""
        e = self.esize
        rank = len(self.out_size)
        if self.split or self.in_stride[-1] != 1 or self.out_stride[-1] != 1:
            return None
        wi, wo, s0 = self.in_size[-1], self.out_size[-1], self.start[-1]
        run_bytes = wi * e
        in_bind = ceil_div(self.in_bytes, 16) * 16
        if (run_bytes < 32 or in_bind // 16 > self.ctx.limits["maxTexelBufferElements"]
                or max(in_bind, self.out_bytes) >= 1 << 31):
            return None
        outer_out = [st * e for st in self.out_stride[:-1]]
        outer_in = [st * e for st in self.in_stride[:-1]]
        # residues of a row's first byte modulo 16 (bindings start 16-aligned)
        g = math.gcd(16, *outer_out) if outer_out else 16
        left = right = words = 0
        for r in range(0, 16, g):
            run = r + s0 * e
            first, endw = ceil_div(run, 16), (run + run_bytes) // 16
            left = max(left, (first * 16 - r) // e)
            right = max(right, (r + wo * e - endw * 16) // e)
            words = max(words, endw - first)
        same = all(b % 16 == 0 for b in outer_out + outer_in)
        simple = all(self._one_period(d) for d in range(rank))
        # every output row starts and ends on a 16-byte boundary: whole rows in words
        full = g == 16 and wo * e % 16 == 0 and wo * e // 16 < 1 << 16
        return {"words": words, "left": left, "right": right, "in_bind": in_bind,
                "shift": (-s0 * e) % 16 if same else 16, "simple": simple,
                "full": full, "row_words": wo * e // 16}

    @property
    def full_rows(self) -> bool:
        """Whether the rows path runs as one whole-rows dispatch (``rows_full``)."""
        return self.rows is not None and self.full is not None

    def _u64_wanted(self) -> bool:
        return bool(self.rows_u64 and self.features.get("int64"))

    def _u64_ok(self, rows: dict) -> bool:
        """Whether the two-dispatch words pass stores u64vec4 pairs (``rows_u64``, variant
        ``padding_rows_u64``): asked for, int64 shaders, an even number of words per
        invocation (pairs start 32-byte aligned) and every row's words more than an
        invocation's (so no invocation holds both a row's first and last word alone in
        a pair: one u64vec2 an invocation).  Whole rows: :meth:`full_plan`."""
        _, v = self._rows_words()
        return self._u64_wanted() and v % 2 == 0 and rows["words"] - 1 >= v

    def _one_period(self, d: int) -> bool:
        """Whether one reflection (or wrap) folds every coordinate of dimension d."""
        n, s = self.in_size[d], self.start[d]
        e = self.out_size[d] - n - s
        if self.mode == PaddingMode.REFLECTION:
            return max(s, e) <= n - 1
        return max(s, e) <= n

    def _rows_params(self, rows: dict):
        """The rows kernel's parameters (glsl/padding_rows.comp, uniform block Params)."""
        e = self.esize
        value = np.array([self.bits], dtype=np.dtype(f"u{e}")).tobytes() * (16 // e)
        return self.upload_block(
            self.rows_kernel, "Params", in_size=self.in_size[:-1], start=self.start[:-1],
            in_stride=[st * e for st in self.in_stride[:-1]],
            out_stride=[st * e for st in self.out_stride[:-1]],
            value4=np.frombuffer(value, np.uint32),
            row=[self.start[-1] * e, self.in_size[-1] * e, self.out_size[-1] * e,
                 rows["in_bind"] // 16 - 1],
            inner=[self.start[-1], self.in_size[-1], self.out_size[-1], 0],
            slots=[rows["left"], rows["right"], 0, 0])

    def _border_boxes(self):
        """Output boxes outside the interior: for each padded dimension d, the start and
        end slabs with dimensions before d restricted to the interior."""
        rank = len(self.out_size)
        boxes = []
        for d in range(rank):
            s, n, o = self.start[d], self.in_size[d], self.out_size[d]
            for lo, hi in ((0, s), (s + n, o)):
                if hi <= lo:
                    continue
                origin = [self.start[j] if j < d else 0 for j in range(rank)]
                extent = [self.in_size[j] if j < d else self.out_size[j] for j in range(rank)]
                origin[d], extent[d] = lo, hi - lo
                boxes.append((origin, extent))
        return boxes

    def _interior_last(self) -> int:
        """The last padded dimension (-1: none): the interior is contiguous after it."""
        padded = [d for d in range(len(self.out_size)) if self.in_size[d] != self.out_size[d]]
        return padded[-1] if padded else -1

    def _interior_region_count(self) -> int:
        """Copy regions the interior takes: one per contiguous run."""
        return math.prod(self.in_size[:max(self._interior_last(), 0)])

    def _interior_regions(self):
        """Copy regions (src, dst, bytes) of the interior: one per contiguous run."""
        rank = len(self.out_size)
        k = self._interior_last()
        run_elems = math.prod(self.in_size[k:]) if k >= 0 else math.prod(self.in_size)
        outer = self.in_size[:k] if k >= 0 else []
        e = self.esize
        if not outer:
            base_out = sum(self.start[j] * self.out_stride[j] for j in range(rank))
            return np.array([[0, base_out * e, run_elems * e]], dtype=np.uint64)
        grids = np.indices(outer, dtype=np.int64).reshape(len(outer), -1)
        src = sum(grids[j] * self.in_stride[j] for j in range(len(outer)))
        dst = sum((grids[j] + self.start[j]) * self.out_stride[j] for j in range(len(outer)))
        dst = dst + sum(self.start[j] * self.out_stride[j] for j in range(len(outer), rank))
        regions = np.stack([src * e, dst * e, np.full_like(src, run_elems * e)], axis=1)
        return regions.astype(np.uint64)

    def _mapped_range(self, d: int, lo: int, hi: int) -> tuple[int, int]:
        """Min and max input coordinate that output coordinates [lo, hi) of dim d read
        ((0, -1): none), in O(1): the mode's map is piecewise monotone, so the extremes
        are at the ends unless the range holds a turning (or wrapping) point."""
        n, s = self.in_size[d], self.start[d]
        a, b = lo - s, hi - 1 - s                 # input coordinates before folding
        if self.mode == PaddingMode.CONSTANT:
            a, b = max(a, 0), min(b, n - 1)
            return (a, b) if a <= b else (0, -1)
        if self.mode == PaddingMode.EDGE:
            return min(max(a, 0), n - 1), min(max(b, 0), n - 1)
        if n == 1:
            return 0, 0

        def holds(r, p):                          # some c in [a, b] with c = r (mod p)
            return a + (r - a) % p <= b

        if self.mode == PaddingMode.WRAP:
            if a + n - a % n <= b:               # wraps from n - 1 to 0 inside
                return 0, n - 1
            return a % n, b % n
        if self.mode == PaddingMode.REFLECTION:
            p, bottoms, tops = 2 * (n - 1), (0,), (n - 1,)
        else:                                     # SYMMETRIC
            p, bottoms, tops = 2 * n, (0, 2 * n - 1), (n - 1, n)
        fa, fb = (m if m < n else (p - m if self.mode == PaddingMode.REFLECTION
                                   else p - 1 - m) for m in (a % p, b % p))
        low = 0 if any(holds(r, p) for r in bottoms) else min(fa, fb)
        high = n - 1 if any(holds(r, p) for r in tops) else max(fa, fb)
        return low, high

    def in_span(self, origin, extent) -> tuple[int, int]:
        """[lo, hi) input elements an output box reads (lo >= hi: none)."""
        lo = hi = 0
        for d, (o, e) in enumerate(zip(origin, extent)):
            a, b = self._mapped_range(d, o, o + e)
            if a > b:
                return 0, 0
            lo += a * self.in_stride[d]
            hi += b * self.in_stride[d]
        return lo, hi + 1

    def _windows(self):
        """For tensors beyond maxStorageBufferRange: boxes of output coordinates, each with
        the elements of input and output it touches (each fits one binding):
        (origin, extent, in_lo, in_hi, out_lo, out_hi)."""
        room = self.ctx.limits["maxStorageBufferRange"] - 2 * self.ctx.binding_alignment()
        return plan_windows(self.out_size, self.in_span,
                            lambda o, e: strided_span(o, e, self.out_stride),
                            self.esize, self.esize, room, "one output element of the padding")

    def _dispatch_box(self, seq, binds, origin, extent, in_base=0, out_base=0) -> None:
        """Dispatch the kernel over a box, split where it exceeds the workgroup-count limit."""
        rank = len(extent)
        xdims = pick_xdims(extent, self.local, whole_row=False)
        pipe = self.pipeline(self.kernel, {"LOCAL_SIZE_X": self.local, "RANK": rank,
                                           "MODE": int(self.mode), "XDIMS": xdims})
        # the element kernel divides with `/` and `%`: no div_magic cap on the grid
        for o, ext in split_groups(origin, extent, self.local,
                                   self.ctx.limits["maxComputeWorkGroupCount"], xdims,
                                   magic=False):
            push = pack(pipe.name, "push", origin=o, extent=ext, in_base=in_base,
                        out_base=out_base, x_count=math.prod(ext[rank - xdims:]))
            seq.dispatch(pipe, binds, box_grid(ext, self.local, xdims), push)

    def _encode_rows(self, seq, x, y) -> None:
        """The rows path: the words pass, then the edge pass (see glsl/padding_rows.comp)."""
        rows = self.rows
        rank = len(self.out_size)
        binds = [Bind(x, 0, rows["in_bind"], "r", FORMAT_RGBA32_UINT),
                 Bind(y, 0, self.out_bytes, "w"), Bind(self.params)]
        lim = self.ctx.limits
        max_groups = lim["maxComputeWorkGroupCount"]
        consts = {"RANK": rank, "MODE": int(self.mode), "SIMPLE": int(rows["simple"]),
                  "SHIFT": rows["shift"]}
        slots = rows["left"] + rows["right"]
        local_y = int(lim["maxComputeWorkGroupSize"][1])
        if self.full_rows:
            self._encode_full(seq, binds, consts)
            return
        if rows["words"]:                 # x along the words, y along dimension rank - 2
            local, v = self._rows_words()
            # u64: an odd row's words start at its first invocation's second word
            words = rows["words"] + self.u64
            extent = list(self.out_size[:-1]) + [words]
            xinv = ceil_div(words, v)
            lx = min(local, max(8, ceil_div(xinv, 8) * 8))
            ly = max(1, min(local // lx, extent[-2], local_y)) if rank > 1 else 1
            pipe = self.pipeline("padding_rows_u64" if self.u64 else self.rows_kernel,
                                 {"LOCAL_SIZE_X": lx, "LOCAL_SIZE_Y": ly, "EDGE": 0,
                                  "PER": v, **consts})
            for o, ext in split_groups([0] * rank, extent, lx, max_groups, 1, v, ly):
                self._dispatch_rows(seq, pipe, binds, o, ext, ceil_div(ext[-1], v),
                                    box_grid(ext, lx, 1, v, ly))
        if slots:                         # x along dimension rank - 2, y along slot groups
            v = min(slots, EDGE_PER)
            groups = ceil_div(slots, v)
            if rank == 1:
                lx = min(self.local, max(8, ceil_div(groups, 8) * 8)) if groups > 1 else 1
                pipe = self.pipeline(self.rows_kernel, {"LOCAL_SIZE_X": lx, "LOCAL_SIZE_Y": 1,
                                                        "EDGE": 1, "PER": v, **consts})
                for o, ext in split_groups([0], [slots], lx, max_groups, 1, v, 1):
                    self._dispatch_rows(seq, pipe, binds, o, ext, ceil_div(ext[-1], v),
                                        box_grid(ext, lx, 1, v, 1))
                return
            lx = min(self.local, max(8, ceil_div(self.out_size[-2], 8) * 8))
            pipe = self.pipeline(self.rows_kernel, {"LOCAL_SIZE_X": lx, "LOCAL_SIZE_Y": 1,
                                                    "EDGE": 1, "PER": v, **consts})
            swapped = list(self.out_size[:-2]) + [groups, self.out_size[-2]]
            for o, ext in split_groups([0] * rank, swapped, lx, max_groups, 1, 1, 1):
                first = o[-2] * v
                origin = o[:-2] + [o[-1], first]
                extent = ext[:-2] + [ext[-1], min(ext[-2] * v, slots - first)]
                self._dispatch_rows(seq, pipe, binds, origin, extent, ext[-2],
                                    box_grid(ext, lx, 1, 1, 1))

    def _rows_words(self) -> tuple[int, int]:
        """(workgroup size, words per invocation) of the words pass."""
        local, per = self.rows_block or (self.local, ROWS_PER[self.in_bytes + self.out_bytes
                                                              > ROWS_PER_BYTES])
        return min(local, self.workgroup_size), per

    def full_plan(self) -> dict | None:
        """The whole-rows dispatch (``ROWS_FULL`` in glsl/padding_rows.comp), or None
        where it does not apply: output rows 16-byte aligned and whole words, input rows
        16-byte aligned (``shift`` known), 4- or 8-byte elements, and each border within
        the row's first or last word, its components among the texels the invocation
        holds.  Words per invocation: the block's (else :data:`FULL_PER`) or one more,
        whichever leaves fewer idle at a row's end; with ``rows_u64`` the even one of
        them, else the next (the odd rows' border texels reach one further), where rows
        have more words (then rows take one word more of invocations: an odd row's
        words start at its first invocation's second word)."""
        rows = self.rows if self.rows is not None else self._rows_plan()
        e = self.esize
        d = len(self.out_size) - 1
        n, s0, wo = self.in_size[d], self.start[d], self.out_size[d]
        end = wo - n - s0
        if rows is None or not (rows["full"] and rows["shift"] < 16 and e in (4, 8) and s0 * e <= 16
                and end * e <= 16):
            return None
        words = rows["row_words"]
        per = self.rows_block[1] if self.rows_block else FULL_PER
        options = [(p, False) for p in sorted((p for p in (per, per + 1) if p <= ROWS_PER_MAX),
                                              key=lambda p: ceil_div(words, p) * p - words)]
        if self._u64_wanted():
            options = [(p, True) for p in (per, per + 1, per + 2)
                       if p % 2 == 0 and p <= ROWS_PER_MAX and words > p] + options

        def codes(word: int, k: int, v: int) -> int | None:
            # t[k] is the texel of input row byte 16 * word - s0 * e (row starts aligned)
            base = (16 * word - s0 * e) // 16 - k
            out = 0
            for c in range(4):
                r = 16 * word + 4 * c
                i, last = self._mapped_range(d, r // e, r // e + 1)   # the input element
                if i > last:                                         # (none: the constant)
                    code = 128 | c
                else:
                    src = i * e + r % e
                    kk = src // 16 - base
                    if not 0 <= kk <= v:
                        return None
                    code = kk << 2 | (src >> 2) & 3
                out |= code << (8 * c)
            return out

        lx, _ = self._rows_words()
        for v, u64 in options:
            ipr = ceil_div(words + u64, v)
            if ipr > self.ctx.limits["maxComputeWorkGroupCount"][0] * lx:
                continue
            # the row's last word is word kr (even rows; u64: kr1 odd ones) of its invocation
            kr, kr1 = (words - 1) % v, words % v
            bl = codes(0, 0, v) if s0 else 0
            br = codes(words - 1, kr, v) if end else 0
            bl1 = codes(0, 1, v) if s0 and u64 else 0
            br1 = codes(words - 1, kr1, v) if end and u64 else 0
            if None in (bl, br, bl1, br1):
                continue
            return {"per": v, "ipr": ipr, "u64": u64, "ROWS_FULL": 1 | (2 if s0 else 0)
                    | (4 if end else 0) | kr << 8 | (kr1 << 16 if u64 else 0),
                    "ROWS_BL": bl, "ROWS_BR": br,
                    **({"ROWS_BL1": bl1, "ROWS_BR1": br1} if u64 else {})}
        return None

    def _encode_full(self, seq, binds, consts) -> None:
        """Whole rows in one dispatch (``ROWS_FULL``): x over (row of dimension rank - 2,
        its invocations), flattened; z the dimensions before."""
        full = self.full
        rank = len(self.out_size)
        mx, _, mz = self.ctx.limits["maxComputeWorkGroupCount"]
        lx, _ = self._rows_words()
        n, v, ipr = self.rows["row_words"], full["per"], full["ipr"]
        names = ("ROWS_FULL", "ROWS_BL", "ROWS_BR") + (("ROWS_BL1", "ROWS_BR1") if self.u64
                                                       else ())
        pipe = self.pipeline("padding_rows_u64" if self.u64 else self.rows_kernel, {
            "LOCAL_SIZE_X": lx, "LOCAL_SIZE_Y": 1, "EDGE": 0, "PER": v, **consts,
            **{k: full[k] for k in names}})
        extent = list(self.out_size[:-1]) + [n]
        # rows per dispatch: x within the device's groups and exact multiply-highs
        # (flat index * ipr < 2^32; ipr < 2^16 where rows are full, see _rows_plan)
        cap = max(1, min(mx * lx // ipr, ((1 << 32) - 1) // (ipr * ipr)))
        if rank == 1:
            self._dispatch_rows(seq, pipe, binds, [0], [n], ipr, (ceil_div(ipr, lx), 1, 1),
                                magic=True)
            return
        big = 1 << 31
        for o, ext in split_groups([0] * rank, extent, 1, (big, big, mz), 1, n, 1):
            for a in range(0, ext[-2], cap):
                oo, ee = list(o), list(ext)
                oo[-2] += a
                ee[-2] = min(cap, ext[-2] - a)
                groups = (ceil_div(ee[-2] * ipr, lx), 1, math.prod(ee[:-2]))
                self._dispatch_rows(seq, pipe, binds, oo, ee, ipr, groups, magic=True)

    def _dispatch_rows(self, seq, pipe, binds, origin, extent, x_count, groups,
                       magic: bool = False) -> None:
        push = pack(pipe.name, "push", origin=origin, extent=extent, in_base=0, out_base=0,
                    x_count=x_count, x_magic=div_magic(x_count) if magic else 0,
                    magic=[div_magic(n) for n in extent])
        seq.dispatch(pipe, binds, groups, push)

    def encode(self, seq, inputs, outputs) -> None:
        x, y = inputs[0].allocation, outputs[0].allocation
        if self.rows is not None:
            self._encode_rows(seq, x, y)
            return
        fixed = [Bind(self.params), Bind(self.value, 0, self.value.size)]
        if not self.split:
            if self.copy_regions is not None:
                seq.copy_array(x, y, self.copy_regions)
            binds = [Bind(x, 0, self.in_bytes), Bind(y, 0, self.out_bytes, "w")] + fixed
            for origin, extent in self.boxes:
                self._dispatch_box(seq, binds, origin, extent)
            return
        align = self.ctx.binding_alignment()
        e = self.esize
        for origin, extent, in_lo, in_hi, out_lo, out_hi in self._windows():
            in_off, in_size = binding_window(in_lo * e, in_hi * e, x.size, align)
            out_off, out_size = binding_window(out_lo * e, out_hi * e, y.size, align)
            binds = [Bind(x, in_off, in_size), Bind(y, out_off, out_size, "w")] + fixed
            self._dispatch_box(seq, binds, origin, extent, in_off // e, out_off // e)


#: Padding's calibration (:mod:`.calibrate`), registered with the tuner as "padding".
MODEL = padding_model(CompiledPadding)
#: Large paddings' choice, timed per size class (:func:`.calibrate.large_path`).
LARGE = large_path(CompiledPadding)


def pad(x, start_padding, end_padding, mode="constant", value=0.0, *, device=None):
    """Pad ``x`` (1 to 8 dimensions, any of the 11 data types): ``DML_PADDING_OPERATOR_DESC``.

    ``mode``: "constant" | "edge" | "reflection" | "symmetric" | "wrap".  Reflection and
    symmetric paddings larger than the dimension fold periodically (as ``numpy.pad``'s
    "reflect"/"symmetric"); "wrap" repeats the tensor (ONNX "wrap", DML feature level 6_4).
    ``value`` is converted to the data type as the page says (10.6 -> 10 for integers,
    saturated to the type's range); int64/uint64 integers are exact.
    """
    dev = pick_device(device, x)
    x = as_array(x, "x")
    key = _pad_key(x, start_padding, end_padding, mode, value)
    if key is not None:
        entry = prepared(dev, key)
        if entry is not None:             # these exact arguments passed every check before
            return run_prepared(dev, entry, [x])
    rank = len(x.shape)
    start = as_tuple(start_padding, 0, rank, "start_padding")
    end = as_tuple(end_padding, 0, rank, "end_padding")
    value = as_real(value, "value")
    in_desc = TensorDesc(x.dtype, x.shape)
    out_sizes = tuple(s + a + b for s, a, b in zip(x.shape, start, end)) \
        if len(start) == rank and len(end) == rank else x.shape
    out_desc = TensorDesc(x.dtype, out_sizes)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        desc = Padding1OperatorDesc(in_desc, out_desc, mode, in_desc.data_type,
                                    _exact_or_float(value, in_desc), start, end)
    else:
        desc = PaddingOperatorDesc(in_desc, out_desc, mode, float(value), start, end)
    return run(dev, desc, [x], key=key)


def _per_dim_key(v):
    """A per-dimension argument as a key part: an int, or a tuple of ints for a list or
    tuple of them (exact types: a bool, a NumPy integer or a float is no key)."""
    t = type(v)
    if t is int:
        return v
    if t is tuple or t is list:
        for e in v:
            if type(e) is not int:
                return _NO_KEY
        return (t is list, *v)
    return None if v is None else _NO_KEY


_NO_KEY = object()


def _pad_key(x, start_padding, end_padding, mode, value):
    """The prepared-call key of ``pad`` (see ``functional.prepared``): everything the
    descriptor is built from, each part of an exact built-in type, else None."""
    start, end = _per_dim_key(start_padding), _per_dim_key(end_padding)
    if start is _NO_KEY or end is _NO_KEY or type(mode) is not str:
        return None
    t = type(value)
    if t is float:
        if value != value:                # NaN: payloads differ, leave it to the full path
            return None
        v = value.hex()                   # -0.0 and 0.0 differ
    elif t is int:
        v = value
    else:
        return None
    return ("pad", type(x) is Tensor, x.shape, x.dtype, start, end, mode, t, v)


def _exact_or_float(value, desc: TensorDesc):
    """An integer constant stays exact when the type can hold it; else the float rule."""
    if desc.data_type.is_float:
        return float(value)
    info = np.iinfo(desc.dtype)
    return int(value) if info.min <= int(value) <= info.max else int(max(min(value, info.max), info.min))

"""Fold: ``DML_FOLD_OPERATOR_DESC`` (col2im) and ``vkml.fold``.

Kernel: ``glsl/fold.comp``, a gather: one invocation per output element sums the input
elements whose window position lands on it, in a fixed order (no atomics: bit-identical
results run to run).  One variant per arithmetic: float32 (float16 stored as halves, or
packed in 32-bit words on devices without 16-bit storage), float64 (needs shaderFloat64),
8/16/32-bit integers added in 32 bits and stored wrapping, 64-bit integers added as
32-bit pairs with carry (exact on every device, no shaderInt64 needed).

This module also holds :class:`BoxKernel`, the dispatch machinery Fold, Unfold and LP
pooling share: a kernel runs over a box of coordinates (x along the trailing dimension(s),
y the one before, z the rest, so all but x is uniform per workgroup), split where it
exceeds ``maxComputeWorkGroupCount``, and -- for tensors larger than
``maxStorageBufferRange`` -- into boxes whose input and output spans each fit one binding.
"""
from __future__ import annotations

import math

import numpy as np

from ..dml.fold import FoldOperatorDesc
from ..dml.operator import as_tuple
from ..dml.tensor_desc import TensorDesc
from ..errors import UnsupportedError, ValidationError
from ..runtime import (FORMAT_R32_SFLOAT, FORMAT_R32_UINT, FORMAT_RGBA32_SFLOAT,
                       FORMAT_RGBA32_UINT, STORAGE, UNIFORM, UNIFORM_TEXEL, Bind)
from ..dml.data_type import DataType
from .base import CompiledOperator, implements
from .functional import as_array, pick_device, run

__all__ = ["fold"]

MAX_RANK = 8
MAX_SPATIAL = 6
# origin[8], extent[8], in_base, out_base, x_count, (pad), magic[8]
PUSH_BYTES = 112
#: Grid coordinates the kernels divide (z, and x over several dimensions) stay below
#: this, so the division by an extent is a multiply-high by ``magic`` (see div_magic).
GRID_LIMIT = 1 << 16


def div_magic(e: int) -> int:
    """``ceil(2^32 / e)``: for z, e < 2^16, ``floor(z / e)`` is the high word of
    ``z * magic`` (the error z * (magic - 2^32/e) / 2^32 < 2^-16 < 1/e cannot carry
    past the next multiple).  lavapipe runs an integer division as 8 scalar divisions
    per 8 lanes; a multiply-high is a vector instruction.  e = 1 is handled apart."""
    return 0 if e <= 1 else -(-(1 << 32) // e)


# -- grids over boxes ------------------------------------------------------------------
def pick_xdims(extent, local: int) -> int:
    """How many trailing dimensions the grid's x covers: the last alone when it fills
    half a workgroup (no per-lane division), else enough of them to fill one."""
    if extent[-1] * 2 >= local:
        return 1
    n, count = 1, 0
    for e in reversed(extent):
        if count and n >= local:
            break
        n *= e
        count += 1
    return count


def box_grid(extent, local: int, xdims: int, v: int = 1, ly: int = 1) -> tuple[int, int, int]:
    """Workgroups for a box: x along the last ``xdims`` dimensions (``v`` elements of the
    last per invocation when ``xdims`` is 1), y the one before (``ly`` rows a workgroup),
    z the rest."""
    rank = len(extent)
    gx = -(-x_invocations(extent, xdims, v) // local)
    gy = -(-extent[rank - xdims - 1] // ly) if rank > xdims else 1
    gz = math.prod(extent[:rank - xdims - 1]) if rank > xdims + 1 else 1
    return gx, gy, gz


def x_invocations(extent, xdims: int, v: int = 1) -> int:
    if xdims == 1:
        return -(-extent[-1] // v)
    return math.prod(extent[len(extent) - xdims:])


def split_groups(origin, extent, local: int, max_groups, xdims: int, v: int = 1,
                 ly: int = 1) -> list:
    """Split a box until each piece's :func:`box_grid` fits ``max_groups`` per axis
    (pieces along the last dimension keep multiples of ``v``)."""
    mx, my, mz = max_groups
    rank = len(extent)

    def pieces(d, step):
        out = []
        for a in range(0, extent[d], step):
            o, e = list(origin), list(extent)
            o[d] += a
            e[d] = min(step, extent[d] - a)
            out += split_groups(o, e, local, max_groups, xdims, v, ly)
        return out

    if xdims == 1 and x_invocations(extent, xdims, v) > mx * local:
        return pieces(rank - 1, mx * local * v)
    if xdims > 1 and x_invocations(extent, xdims, v) > min(mx * local, GRID_LIMIT - 1):
        cap = min(mx * local, GRID_LIMIT - 1)
        for d in range(rank - xdims, rank):
            if math.prod(extent[d:]) > cap:
                return pieces(d, max(1, cap // math.prod(extent[d + 1:])))
    ydim = rank - xdims - 1
    if ydim >= 0 and -(-extent[ydim] // ly) > my:
        return pieces(ydim, my * ly)
    if ydim >= 1 and math.prod(extent[:ydim]) > mz:
        d = next(j for j in range(ydim) if extent[j] > 1)
        return pieces(d, max(1, mz // math.prod(extent[d + 1:ydim])))
    return [(list(origin), list(extent))]


class BoxKernel(CompiledOperator):
    """A kernel over a box of coordinates ``self.box`` (at most 8 dimensions) whose
    output element offsets are ``sum(coord[d] * self.box_out_strides[d])``.

    Subclasses set ``box``, ``box_out_strides``, ``in_esize``/``out_esize`` (bytes of
    one element; the packed variants address sub-word elements in 32-bit words),
    ``in_bytes``/``out_bytes`` and implement :meth:`in_span` (the input elements a box
    reads).  :meth:`plan_windows` then splits the box where a binding would exceed
    ``maxStorageBufferRange`` (or ``limit``), and :meth:`dispatch_windows` records it.
    """

    box: list
    box_out_strides: list

    def in_span(self, origin, extent) -> tuple[int, int]:
        """[lo, hi) input element indices the box reads (lo >= hi: none)."""
        raise NotImplementedError

    def out_span(self, origin, extent) -> tuple[int, int]:
        st = self.box_out_strides
        lo = sum(o * s for o, s in zip(origin, st))
        hi = sum((o + e - 1) * s for o, e, s in zip(origin, extent, st)) + 1
        return lo, hi

    def plan_windows(self, limit: int | None = None, in_align: int | None = None):
        """Boxes (origin, extent, in_lo, in_hi, out_lo, out_hi), spans in elements, each
        of whose bindings fit ``limit`` bytes; ``None`` when the whole tensors fit."""
        lim = self.ctx.limits["maxStorageBufferRange"]
        limit = lim if limit is None else min(limit, lim)
        if self.in_bytes <= limit and self.out_bytes <= limit:
            return None
        align = max(self.ctx.binding_alignment(), in_align or 0)
        room = limit - 2 * align
        ei, eo = self.in_esize, self.out_esize
        out = []
        todo = [([0] * len(self.box), list(self.box))]
        while todo:
            origin, extent = todo.pop()
            ilo, ihi = self.in_span(origin, extent)
            if ihi <= ilo:
                ilo, ihi = 0, 1
            olo, ohi = self.out_span(origin, extent)
            if (ihi - ilo) * ei <= room and (ohi - olo) * eo <= room:
                out.append((origin, extent, ilo, ihi, olo, ohi))
                continue
            d = next((j for j in range(len(extent)) if extent[j] > 1), None)
            if d is None:
                raise UnsupportedError("maxStorageBufferRange", f"one output element of "
                                       f"{self.desc.OPERATOR_TYPE} reads {(ihi - ilo) * ei} "
                                       f"bytes, more than the device can bind ({lim})")
            half = extent[d] // 2
            a, b = list(extent), list(extent)
            a[d] = half
            b[d] = extent[d] - half
            ob = list(origin)
            ob[d] += half
            todo.append((ob, b))
            todo.append((origin, a))
        out.reverse()
        return out

    def dispatch_windows(self, seq, x, y, windows, pipeline_for, fixed, in_kind=STORAGE,
                         in_fmt=0) -> None:
        """Record the kernel over the whole box (``windows`` None) or each window.

        ``pipeline_for(local_x, local_y, xdims, v, vector_store)`` gives the pipeline;
        ``fixed`` are the bindings after the input and output ones (parameters)."""
        local = self.local
        max_groups = self.ctx.limits["maxComputeWorkGroupCount"]
        rank = len(self.box)
        if windows is None:
            binds = [Bind(x, 0, self.in_bind, "r", in_fmt), Bind(y, 0, self.out_bytes, "w")]
            items = [([0] * rank, list(self.box), binds, 0, 0)]
        else:
            items = []
            ialign = self.ctx.binding_alignment(in_kind)
            oalign = self.ctx.binding_alignment()
            ei, eo = self.in_esize, self.out_esize
            for origin, extent, ilo, ihi, olo, ohi in windows:
                ioff = ilo * ei - (ilo * ei) % ialign
                ooff = olo * eo - (olo * eo) % oalign
                isize = min(-(-(ihi * ei - ioff) // 4) * 4, x.size - ioff)
                osize = min(-(-(ohi * eo - ooff) // 4) * 4, y.size - ooff)
                binds = [Bind(x, ioff, isize, "r", in_fmt), Bind(y, ooff, osize, "w")]
                items.append((origin, extent, binds, ioff // ei, ooff // eo))
        for origin, extent, binds, in_base, out_base in items:
            xdims = pick_xdims(extent, local)
            v = self.vector_width(origin, extent, out_base) if xdims == 1 else 1
            lx, ly = local, 1
            ydim = rank - xdims - 1
            if xdims == 1:
                # a short row: a narrower workgroup spanning several rows (lavapipe's cost
                # per workgroup is high), not idle invocations
                lx = min(local, max(8, -(-x_invocations(extent, 1, v) // 8) * 8))
                if ydim >= 0:
                    ly = max(1, min(local // lx, extent[ydim], self.max_local_y))
            pipe = pipeline_for(lx, ly, xdims, v, self.vector_store(origin, out_base, v))
            for o, e in split_groups(origin, extent, lx, max_groups, xdims, v, ly):
                push = np.zeros(PUSH_BYTES // 4, dtype=np.uint32)
                push[0:rank] = o
                push[8:8 + rank] = e
                push[16:19] = [in_base, out_base, x_invocations(e, xdims, v)]
                push[20:20 + rank] = [div_magic(n) for n in e]
                seq.dispatch(pipe, binds + fixed, box_grid(e, lx, xdims, v, ly), push.tobytes())

    @property
    def max_local_y(self) -> int:
        return int(self.ctx.limits["maxComputeWorkGroupSize"][1])

    def vector_width(self, origin, extent, out_base) -> int:
        """Elements of the last dimension one invocation computes (kernels with V)."""
        return 1

    def vector_store(self, origin, out_base, v) -> bool:
        """Whether the V = 4 or 8 elements of an invocation are stored as vec4s: the last
        dimension is packed and every invocation's first element is 4-aligned."""
        st = self.box_out_strides
        return (v in (4, 8) and st[-1] == 1 and all(s % 4 == 0 for s in st[:-1])
                and origin[-1] % 4 == 0 and out_base % 4 == 0)


def spec_geometry(window, strides, dilations) -> dict[int, int]:
    """Specialization constants 3..20: window sizes, strides, dilations (6 each)."""
    consts = {}
    for base, values in ((3, window), (9, strides), (15, dilations)):
        for i in range(MAX_SPATIAL):
            consts[base + i] = int(values[i]) if i < len(values) else 1
    return consts


def fold_variant(desc_type: DataType, features: dict, require) -> tuple[str, int]:
    """The fold kernel variant for a data type and the bytes one element occupies."""
    t = desc_type
    if t == DataType.FLOAT32:
        return "fold_f32", 4
    if t == DataType.FLOAT16:
        return ("fold_f16" if features.get("storage16") else "fold_f16_packed"), 2
    if t == DataType.FLOAT64:
        require("fp64", "Fold adds float64 values: shaderFloat64 is needed")
        return "fold_f64", 8
    if t in (DataType.INT8, DataType.UINT8):
        return ("fold_i8" if features.get("storage8") else "fold_i8_packed"), 1
    if t in (DataType.INT16, DataType.UINT16):
        return ("fold_i16" if features.get("storage16") else "fold_i16_packed"), 2
    if t in (DataType.INT32, DataType.UINT32):
        return "fold_i32", 4
    return "fold_i64", 8


@implements(FoldOperatorDesc)
class CompiledFold(BoxKernel):
    """Fold on this device: see the module doc and ``glsl/fold.comp``."""

    #: How the kernel reads the input: "ssbo" (storage buffer), "texel" (R32 uniform
    #: texel buffer) or "texel4" (RGBA32 texels, 4 neighbours at once); None chooses the
    #: fastest the tensor and device allow (tests and measurements force one).
    force_read: str | None = None
    #: Output elements along the last dimension per invocation (1, 4 or 8).
    vec: int = 8

    def _choose_read(self, src) -> str:
        """Texel buffers: lavapipe vectorizes their reads (a storage-buffer read is a
        scalar load per lane); they need float32/int32 data bound whole within
        maxTexelBufferElements.  RGBA texels also need a unit last stride and packed
        columns (the V outputs of an invocation read neighbours)."""
        texels = self.ctx.limits["maxTexelBufferElements"]
        whole = self.windows is None and self.kernel in ("fold_f32", "fold_i32")
        ok = {"ssbo": True,
              "texel": whole and self.in_bytes // 4 <= texels,
              "texel4": (whole and -(-self.in_bytes // 16) <= texels
                         and self.strides[-1] == 1 and self.col_strides[2] == 1)}
        if self.force_read is not None:
            return self.force_read if ok[self.force_read] else "ssbo"
        return "texel4" if ok["texel4"] else "texel" if ok["texel"] else "ssbo"

    def build(self) -> None:
        d = self.desc
        src, dst = d.input_tensor, d.output_tensor
        self.kernel, esize = fold_variant(src.data_type, self.features, self.require)
        self.in_esize = self.out_esize = esize
        self.in_bytes = src.total_tensor_size_in_bytes
        self.out_bytes = dst.total_tensor_size_in_bytes
        self.rank = dst.dimension_count
        self.box = list(dst.sizes)
        self.box_out_strides = list(dst.element_strides)
        self.win = d.window_sizes
        self.k = d.window_count
        self.blocks = d.blocks
        self.start = d.start_padding
        self.strides = d.strides
        self.dil = d.dilations
        self.col_strides = d.columns_strides()
        spatial = len(self.win)
        self.block_strides = [math.prod(self.blocks[i + 1:]) for i in range(spatial)]
        self.local = min(64, self.workgroup_size)

        self.windows = self.plan_windows()
        self.read = self._choose_read(src)
        self.in_kind, self.in_fmt, self.in_bind = STORAGE, 0, self.in_bytes
        if self.read == "texel":
            self.kernel += "_texel"
            self.in_kind = UNIFORM_TEXEL
            self.in_fmt = FORMAT_R32_SFLOAT if src.data_type == DataType.FLOAT32 \
                else FORMAT_R32_UINT
        elif self.read == "texel4":
            self.kernel += "_texel4"
            self.in_kind = UNIFORM_TEXEL
            self.in_fmt = FORMAT_RGBA32_SFLOAT if src.data_type == DataType.FLOAT32 \
                else FORMAT_RGBA32_UINT
            self.in_bind = -(-self.in_bytes // 16) * 16
        self.vec_store_ok = self.kernel.startswith(("fold_f32", "fold_i32"))
        self.params = self.upload(self._params())
        self.consts = {1: self.rank, **spec_geometry(self.win, self.strides, self.dil)}

    def _params(self) -> np.ndarray:
        p = np.zeros(4 * (2 + 1 + 2 + 2 + 2 + 1), dtype=np.uint32)
        p[0:self.rank] = self.box_out_strides
        p[8:11] = self.col_strides
        n = len(self.win)
        p[12:12 + n] = self.start
        p[20:20 + n] = self.blocks
        p[28:28 + n] = self.block_strides
        p[36] = self.in_bind // 16
        return p

    def vector_width(self, origin, extent, out_base) -> int:
        return next((v for v in (8, 4) if v <= self.vec and extent[-1] >= v), 1)

    def in_span(self, origin, extent):
        sn, sr, sc = self.col_strides
        n_lo, n_hi = origin[0], origin[0] + extent[0] - 1
        row_lo = origin[1] * self.k
        row_hi = (origin[1] + extent[1]) * self.k - 1
        col_lo = col_hi = 0
        for i in range(len(self.win)):
            a, h = origin[2 + i], origin[2 + i] + extent[2 + i] - 1
            st, dl, w = self.strides[i], self.dil[i], self.win[i]
            b_lo = max(0, -(-(a + self.start[i] - dl * (w - 1)) // st))
            b_hi = min(self.blocks[i] - 1, (h + self.start[i]) // st)
            if b_lo > b_hi:
                return 0, 0
            col_lo += b_lo * self.block_strides[i]
            col_hi += b_hi * self.block_strides[i]
        lo = n_lo * sn + row_lo * sr + col_lo * sc
        hi = n_hi * sn + row_hi * sr + col_hi * sc + 1
        return lo, hi

    def encode(self, seq, inputs, outputs) -> None:
        x, y = inputs[0]._alloc, outputs[0]._alloc
        kinds = (self.in_kind, STORAGE, UNIFORM)

        def pipeline_for(local, ly, xdims, v, vec_store):
            vec_store = vec_store and self.vec_store_ok
            return self.pipeline(self.kernel, kinds, PUSH_BYTES,
                                 {0: local, 23: ly, 2: xdims, 21: v, 22: int(vec_store),
                                  **self.consts})


        self.dispatch_windows(seq, x, y, self.windows, pipeline_for, [Bind(self.params)],
                              self.in_kind, self.in_fmt)


def fold(x, output_size, window_sizes, *, strides=None, dilations=None, start_padding=None,
         end_padding=None, device=None):
    """Fold (col2im), ``DML_FOLD_OPERATOR_DESC``: sum sliding-window columns into an image.

    ``x``: (N, C x prod(window_sizes), BlockCount); ``output_size``: the spatial sizes
    (1 to 6 of them); result (N, C, *output_size), overlapping values summed (as
    ``torch.nn.functional.fold``).  Per-dimension arguments take one int per spatial
    dimension, or one int for all; ``None`` is 1 for strides and dilations, 0 for padding.
    Every data type; integer sums wrap around, float16 is summed in float32.
    """
    dev = pick_device(device, x)
    x = as_array(x, "x")
    output_size = as_tuple(output_size, None, 1, "output_size", 1)
    d = len(output_size)
    if not 1 <= d <= MAX_SPATIAL:
        raise ValidationError("output_size", f"must have 1 to {MAX_SPATIAL} spatial sizes, "
                              f"got {d}")
    if len(x.shape) != 3:
        raise ValidationError("x", "must have 3 dimensions (N, C x prod(window_sizes), "
                              f"BlockCount), got shape {tuple(x.shape)}")
    window = as_tuple(window_sizes, 1, d, "window_sizes")
    strides = as_tuple(strides, 1, d, "strides")
    dilations = as_tuple(dilations, 1, d, "dilations")
    start = as_tuple(start_padding, 0, d, "start_padding")
    end = as_tuple(end_padding, 0, d, "end_padding")
    n, rows, _ = x.shape
    k = math.prod(window) if len(window) == d and all(w > 0 for w in window) else 1
    channels = max(1, rows // k)
    in_desc = TensorDesc(x.dtype, tuple(x.shape))
    out_desc = TensorDesc(x.dtype, (n, channels) + output_size)
    desc = FoldOperatorDesc(in_desc, out_desc, window, strides, dilations, start, end)
    return run(dev, desc, [x])


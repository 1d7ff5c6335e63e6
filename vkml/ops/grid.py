"""Grids and windows: fitting work into ``maxComputeWorkGroupCount`` and bindings into
``maxStorageBufferRange``, shared by Padding, Fold, Unfold and LP pooling.

A kernel runs over a *box* of coordinates (origin, extent; at most 8 dimensions): the
grid's x along the trailing dimension(s), y the one before, z the rest, so all but x is
uniform per workgroup (see docs/DEVELOPING.md).  :func:`split_groups` cuts a box until
every dispatch's grid fits the device; :func:`plan_windows` cuts it until the input and
output elements it touches each fit one binding, and :func:`binding_window` turns such
an element span into an aligned (offset, size) binding.  :func:`per_workgroup` sizes
workgroups so that the device's concurrent width finishes the grid in the fewest turns.
:class:`BoxKernel` is the operator base class putting these together.
"""
from __future__ import annotations

import math

import numpy as np

from .. import tuning
from ..errors import UnsupportedError
from ..runtime import (FORMAT_R32_SFLOAT, FORMAT_R32_UINT, FORMAT_RGBA32_SFLOAT,
                       FORMAT_RGBA32_UINT, STORAGE, UNIFORM_TEXEL, Bind)
from ..runtime.blocks import pack
from ..dml.data_type import DataType
from ..dml.tensor_desc import check_allocation
from .base import CompiledOperator
from ..intmath import ceil_div, round_up

__all__: list[str] = []     # helpers only: no functional form

#: Grid coordinates the kernels divide (z, and x over several dimensions) stay below
#: this, so the division by an extent is a multiply-high by ``magic`` (see div_magic).
GRID_LIMIT = 1 << 16
#: Specialization constants every box kernel takes (glsl/fold.comp and its kin).
BOX_CONSTANTS = ("LOCAL_SIZE_X", "LOCAL_SIZE_Y", "RANK", "XDIMS")


def div_magic(e: int) -> int:
    """``ceil(2^32 / e)``: for z, e < 2^16, ``floor(z / e)`` is the high word of
    ``z * magic`` (the error z * (magic - 2^32/e) / 2^32 < 2^-16 < 1/e cannot carry
    past the next multiple).  lavapipe runs an integer division as 8 scalar divisions
    per 8 lanes; a multiply-high is a vector instruction.  e = 1 is handled apart."""
    return 0 if e <= 1 else ceil_div(1 << 32, e)


def grid_cap(*counts: int) -> int:
    """The least of ``counts`` (a device's ``maxComputeWorkGroupCount`` along an axis, a
    grid's own count) and ``GRID_LIMIT - 1`` = 65535: what every device takes (the
    Vulkan minimum of the limit) and the kernels' multiply-high divisions stay exact
    below (:func:`div_magic`)."""
    return min(*counts, GRID_LIMIT - 1)


def pick_xdims(extent, local: int, whole_row: bool = True) -> int:
    """How many trailing dimensions the grid's x covers: enough of them to fill a
    workgroup; with ``whole_row`` the last alone when it fills half a workgroup (no
    per-lane division)."""
    if whole_row and extent[-1] * 2 >= local:
        return 1
    n, count = 1, 0
    for e in reversed(extent):
        if count and n >= local:
            break
        n *= e
        count += 1
    return count


def row_workgroup(extent, local: int, max_y: int,
                  widths=(4,)) -> tuple[int, int, int, int]:
    """(xdims, v, lx, ly) of a strided element-wise box kernel: :func:`pick_xdims`, the
    first of ``widths`` elements an invocation that the last dimension holds where the
    grid's x runs along it alone, and for such a short row a workgroup narrower than
    ``local`` spanning up to ``max_y`` rows (lavapipe's cost per workgroup is high), not
    idle invocations."""
    xdims = pick_xdims(extent, local)
    v = next((w for w in widths if extent[-1] >= w), 1) if xdims == 1 else 1
    lx, ly = local, 1
    if xdims == 1:
        lx = min(local, max(8, round_up(ceil_div(extent[-1], v), 8)))
        if len(extent) > 1:
            ly = max(1, min(local // lx, extent[-2], max_y))
    return xdims, v, lx, ly


def x_invocations(extent, xdims: int, v: int = 1) -> int:
    """Invocations along x: the last ``xdims`` extents (``v`` elements of the last per
    invocation when ``xdims`` is 1)."""
    if xdims == 1:
        return ceil_div(extent[-1], v)
    return math.prod(extent[len(extent) - xdims:])


def box_grid(extent, local: int, xdims: int = 1, v: int = 1,
             ly: int = 1) -> tuple[int, int, int]:
    """Workgroups for a box: x along the last ``xdims`` dimensions, y the one before
    (``ly`` rows a workgroup), z the rest."""
    rank = len(extent)
    gx = ceil_div(x_invocations(extent, xdims, v), local)
    gy = ceil_div(extent[rank - xdims - 1], ly) if rank > xdims else 1
    gz = math.prod(extent[:rank - xdims - 1]) if rank > xdims + 1 else 1
    return gx, gy, gz


def split_groups(origin, extent, local: int, max_groups, xdims: int = 1, v: int = 1,
                 ly: int = 1, magic: bool = True) -> list[tuple[list, list]]:
    """Split a box until each piece's :func:`box_grid` fits ``max_groups`` per axis
    (pieces along the last dimension keep multiples of ``v``).

    ``magic``: the kernel divides grid coordinates by :func:`div_magic` multiply-highs,
    exact below :data:`GRID_LIMIT` only, so z and a multi-dimension x stay below it
    whatever larger counts the device reports."""
    mx, my, mz = max_groups
    if magic:
        mz = grid_cap(mz)
    rank = len(extent)

    def pieces(d, step):
        out = []
        for a in range(0, extent[d], step):
            o, e = list(origin), list(extent)
            o[d] += a
            e[d] = min(step, extent[d] - a)
            out += split_groups(o, e, local, (mx, my, mz), xdims, v, ly, magic)
        return out

    if xdims == 1 and x_invocations(extent, xdims, v) > mx * local:
        return pieces(rank - 1, mx * local * v)
    cap = grid_cap(mx * local) if magic else mx * local
    if xdims > 1 and x_invocations(extent, xdims, v) > cap:
        # the innermost dimension whose trailing product exceeds the cap: the dimensions
        # inside it fit, so whole slices of it do (an outer one could loop forever)
        d = max(j for j in range(rank - xdims, rank) if math.prod(extent[j:]) > cap)
        return pieces(d, max(1, cap // math.prod(extent[d + 1:])))
    ydim = rank - xdims - 1
    if ydim >= 0 and ceil_div(extent[ydim], ly) > my:
        return pieces(ydim, my * ly)
    if ydim >= 1 and math.prod(extent[:ydim]) > mz:
        d = next(j for j in range(ydim) if extent[j] > 1)
        return pieces(d, max(1, mz // math.prod(extent[d + 1:ydim])))
    return [(list(origin), list(extent))]


def pieces(count: int, step: int, start: int = 0) -> list[tuple[int, int]]:
    """``(first, n)`` runs of at most ``step`` covering ``[start, start + count)``: one
    grid axis in dispatches the device takes (``maxComputeWorkGroupCount``)."""
    return [(a, min(step, start + count - a)) for a in range(start, start + count, step)]


#: :func:`per_workgroup` takes the most pieces a workgroup among counts within this share
#: of the fewest turns: a grid many turns long differs by a last turn's rounding only.
TURNS_SLACK = 1 / 32


def per_workgroup(units: int, most: int, others: int = 1, width: int = 0) -> int:
    """How many of ``units`` equal pieces of work (a kernel's channel blocks, lanes of
    one subgroup) one workgroup takes, at most ``most``.  The grid holds ``others``
    workgroups for each workgroup of pieces, and the device runs ``width`` workgroups at
    once (its measured concurrent width, :mod:`vkml.ops.concurrent_width`; 0, unknown,
    counts as 1): a count's cost is its turns, the piece-times of the busiest
    workgroup in each of ``ceil(workgroups / width)`` waves.  A last workgroup short of
    pieces costs as a full one: the CPU drivers hand each thread a contiguous run of
    workgroups in grid order (lavapipe ``count / threads`` a thread), so a run of short
    ones leaves a thread idle.  Of the counts within :data:`TURNS_SLACK` of the fewest
    turns, the most (fewer, fuller workgroups)."""
    turns = {c: ceil_div(others * ceil_div(units, c), max(width, 1)) * c
             for c in range(1, max(1, min(most, units)) + 1)}
    least = min(turns.values())
    return max(c for c, t in turns.items() if t <= least * (1 + TURNS_SLACK))


def vector_width(extent, vec: int) -> int:
    """Elements of the last dimension one invocation computes: 8 or 4 (at most ``vec``)
    where the box's last extent has that many, else 1."""
    return next((v for v in (8, 4) if v <= vec and extent[-1] >= v), 1)


def binding_window(lo: int, hi: int, alloc_size: int, align: int) -> tuple[int, int]:
    """The (offset, size) in bytes of a binding holding bytes [lo, hi) of a buffer of
    ``alloc_size`` bytes: the offset rounded down to ``align`` (the device's
    min*BufferOffsetAlignment), the size rounded up to whole 32-bit words but not past
    the buffer's end."""
    off = lo - lo % align
    return off, min(ceil_div(hi - off, 4) * 4, alloc_size - off)


def plan_windows(box, in_span, out_span, in_esize: int, out_esize: int, room: int,
                 what: str = "one output element"):
    """Boxes (origin, extent, in_lo, in_hi, out_lo, out_hi), spans in elements, whose
    input and output spans each take at most ``room`` bytes, covering ``box`` exactly
    once (row-major order).  ``in_span(origin, extent)`` / ``out_span`` give [lo, hi)
    elements (lo >= hi: none).  A box is halved along its outermost dimension larger
    than 1 until it fits: O(pieces x rank) span evaluations."""
    out = []
    todo = [([0] * len(box), list(box))]
    while todo:
        origin, extent = todo.pop()
        ilo, ihi = in_span(origin, extent)
        if ihi <= ilo:
            ilo, ihi = 0, 1
        olo, ohi = out_span(origin, extent)
        if (ihi - ilo) * in_esize <= room and (ohi - olo) * out_esize <= room:
            out.append((origin, extent, ilo, ihi, olo, ohi))
            continue
        d = next((j for j in range(len(extent)) if extent[j] > 1), None)
        if d is None:
            raise UnsupportedError("maxStorageBufferRange", f"{what} reads "
                                   f"{(ihi - ilo) * in_esize} bytes, more than the device "
                                   f"can bind ({room} with alignment)")
        half = extent[d] // 2
        a, b = list(extent), list(extent)
        a[d] = half
        b[d] = extent[d] - half
        ob = list(origin)
        ob[d] += half
        todo.append((ob, b))
        todo.append((origin, a))
    return out


def check_allocatable(ctx, nbytes: int, what: str) -> None:
    """DeviceError, before anything is allocated, for a tensor no allocation of this
    device can hold (see :func:`vkml.dml.tensor_desc.check_allocation`)."""
    check_allocation(ctx.tensor_heap, nbytes, what)


def strided_span(origin, extent, strides) -> tuple[int, int]:
    """[lo, hi) element offsets ``sum(coord[d] * strides[d])`` takes over a box."""
    lo = sum(o * s for o, s in zip(origin, strides))
    hi = sum((o + e - 1) * s for o, e, s in zip(origin, extent, strides)) + 1
    return lo, hi


def words8(values) -> list[int]:
    """Up to 8 per-dimension values as a kernel's flat ``uvec4[2]`` member takes them
    (zeros after them)."""
    return (list(values) + [0] * 8)[:8]


class BoxKernel(CompiledOperator):
    """A kernel over a box of coordinates ``self.box`` (at most 8 dimensions) whose
    output element offsets are ``sum(coord[d] * self.box_out_strides[d])``.

    Subclasses set ``box``, ``box_out_strides``, ``in_esize``/``out_esize`` (bytes of
    one element; the packed variants address sub-word elements in 32-bit words),
    ``in_bytes``/``out_bytes`` and implement :meth:`in_span` (the input elements a box
    reads).  :meth:`plan_windows` then splits the box where a binding would exceed
    ``maxStorageBufferRange`` (or ``limit``), and :meth:`dispatch_windows` records it.

    Read paths (how the kernel reads its input: "ssbo", "texel", "texel4", "ssbo4" and
    the operators' own): the constructor's ``read=`` (or the class's ``force_read``)
    forces one, "auto" the operator's rule without measuring, None lets the tuner choose
    on the operator's tunable path :attr:`read_path` (:func:`register_read_path`);
    :meth:`choose_read` applies that order.
    """

    box: list
    box_out_strides: list
    #: Output elements along the last dimension per invocation (1, 4 or 8).
    vec: int = 1
    #: Coordinates of grid y's dimension per invocation (a kernel sliding down rows).
    y_per_invocation: int = 1
    #: The grid's x runs along the last dimension only (kernels without the XDIMS loop).
    x_last_only: bool = False
    #: The forced read path: None (the tuner chooses where it may), "auto" (the rule) or
    #: a path name (one the tensors or the device do not allow falls back to "ssbo").
    force_read: str | None = None
    #: The operator's tunable read path (set by :func:`register_read_path`).
    read_path: tuning.TunablePath | None = None

    def __init__(self, device, desc, read: str | None = None):
        if read is not None:
            self.force_read = read
        super().__init__(device, desc)

    def choose_read(self, ok: dict, rule: str, tune: bool, shape) -> str:
        """The read path: the forced one where ``ok`` allows it (else "ssbo"); else, with
        ``tune`` and nothing forced, the tuner's choice for ``shape()`` among those ``ok``
        allows; else ``rule`` (the operator's own, the ``VKML_TUNE=off`` default)."""
        if self.force_read not in (None, "auto"):
            return self.force_read if ok[self.force_read] else "ssbo"
        if self.force_read is None and tune:
            return self.tuned_read(self.read_path, shape(), ok) or rule
        return rule

    def in_span(self, origin, extent) -> tuple[int, int]:
        """[lo, hi) input element indices the box reads (lo >= hi: none)."""
        raise NotImplementedError

    def float_box(self, family: str) -> None:
        """The common set-up of a float32/float16 kernel over the output tensor's box:
        the ``<family>_f32`` / ``_f16`` / ``_f16_packed`` variant (packed float16 where the
        device lacks 16-bit storage), element sizes, binding sizes and the output box."""
        src, dst = self.desc.input_tensor, self.desc.output_tensor
        if src.data_type == DataType.FLOAT32:
            self.kernel = family + "_f32"
        else:
            self.kernel = family + ("_f16" if self.features.get("storage16") else "_f16_packed")
        self.in_esize = self.out_esize = src.data_type.size
        self.in_bytes = self.in_bind = src.total_tensor_size_in_bytes
        self.out_bytes = dst.total_tensor_size_in_bytes
        self.rank = dst.dimension_count
        self.box = list(dst.sizes)
        self.box_out_strides = list(dst.element_strides)

    def out_span(self, origin, extent) -> tuple[int, int]:
        return strided_span(origin, extent, self.box_out_strides)

    def tuned_read(self, read_path, shape, ok: dict) -> str | None:
        """The tuner's read (tunable path ``read_path``) for ``shape`` where this operator
        takes it (``ok[name]``), None for "auto" (the operator's own rule) or one it
        does not take; a choice it runs is re-checked by its sampled executions."""
        choice = tuning.choose(self.device, read_path, shape)
        if choice.name != "auto" and not ok[choice.name]:
            return None
        self.observe_choice(choice, shape)
        return None if choice.name == "auto" else choice.name

    def apply_read(self, read: str, floats: bool = True) -> None:
        """Set up input read path ``read`` (the kernels' shared names): "ssbo" (storage
        buffer), "texel" (an R32 uniform texel buffer), "texel4" (RGBA32 texels, four
        elements each) or "ssbo4" (vec4 storage-buffer loads): the kernel variant's
        suffix, the input's descriptor kind and texel format (float or uint texels,
        ``floats``), a binding of whole 16-byte units and windows ending on one."""
        self.read = read
        self.in_kind, self.in_fmt = STORAGE, 0
        if read == "texel":
            self.kernel += "_texel"
            self.in_kind = UNIFORM_TEXEL
            self.in_fmt = FORMAT_R32_SFLOAT if floats else FORMAT_R32_UINT
        elif read in ("texel4", "ssbo4"):
            self.kernel += "_" + read
            self.in_bind = ceil_div(self.in_bytes, 16) * 16
            if read == "texel4":
                self.in_kind = UNIFORM_TEXEL
                self.in_fmt = FORMAT_RGBA32_SFLOAT if floats else FORMAT_RGBA32_UINT
            else:
                self.windows = whole_vec4s(self.windows)

    def plan_windows(self, limit: int | None = None, in_align: int | None = None):
        """Boxes (origin, extent, in_lo, in_hi, out_lo, out_hi), spans in elements, each
        of whose bindings fit ``limit`` bytes; ``None`` when the whole tensors fit."""
        check_allocatable(self.ctx, self.in_bytes, "the input tensor")
        check_allocatable(self.ctx, self.out_bytes, "the output tensor")
        lim = self.ctx.limits["maxStorageBufferRange"]
        limit = lim if limit is None else min(limit, lim)
        if self.in_bytes <= limit and self.out_bytes <= limit:
            return None
        align = max(self.ctx.binding_alignment(), in_align or 0)
        return plan_windows(self.box, self.in_span, self.out_span, self.in_esize,
                            self.out_esize, limit - 2 * align,
                            f"one output element of {self.desc.OPERATOR_TYPE}")

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
                ioff, isize = binding_window(ilo * ei, ihi * ei, x.size, ialign)
                ooff, osize = binding_window(olo * eo, ohi * eo, y.size, oalign)
                binds = [Bind(x, ioff, isize, "r", in_fmt), Bind(y, ooff, osize, "w")]
                items.append((origin, extent, binds, ioff // ei, ooff // eo))
        for origin, extent, binds, in_base, out_base in items:
            xdims = 1 if self.x_last_only else pick_xdims(extent, local)
            v = self.vector_width(origin, extent, out_base) if xdims == 1 else 1
            lx, ly = local, 1
            ydim = rank - xdims - 1
            if xdims == 1:
                # a short row: a narrower workgroup spanning several rows (lavapipe's cost
                # per workgroup is high), not idle invocations
                lx = min(local, max(8, ceil_div(x_invocations(extent, 1, v), 8) * 8))
                if ydim >= 0:
                    ly = max(1, min(local // lx,
                                    ceil_div(extent[ydim], self.y_per_invocation),
                                    self.max_local_y))
            lx, ly = self.fit_local(lx, ly, v)
            pipe = pipeline_for(lx, ly, xdims, v, self.vector_store(origin, out_base, v))
            ry = ly * self.y_per_invocation     # y coordinates a workgroup covers
            for o, e in split_groups(origin, extent, lx, max_groups, xdims, v, ry):
                seq.dispatch(pipe, binds + fixed, self.grid(e, lx, xdims, v, ry),
                             box_push(pipe.name, o, e, in_base, out_base,
                                      x_invocations(e, xdims, v)))

    def grid(self, extent, lx: int, xdims: int, v: int, ry: int) -> tuple[int, int, int]:
        """The workgroups of one dispatch (:func:`box_grid`; a kernel that lays the grid
        out otherwise overrides it)."""
        return box_grid(extent, lx, xdims, v, ry)

    def fit_local(self, lx: int, ly: int, v: int) -> tuple[int, int]:
        """The workgroup size (x, y) a dispatch uses, given the one chosen for the box: the
        "tile" read halves the rows, then the columns, until its shared-memory tile
        (:meth:`tile_floats`) fits maxComputeSharedMemorySize."""
        if getattr(self, "read", None) != "tile":
            return lx, ly
        while self.tile_floats(lx, ly, v) > self.shared_floats and (ly > 1 or lx > 1):
            if ly > 1:
                ly = (ly + 1) // 2
            else:
                lx = (lx + 1) // 2
        return lx, ly

    def tile_floats(self, lx: int, ly: int, v: int) -> int:
        """Floats of the "tile" read's shared tile for an lx x ly workgroup (operators
        with a tile read define it)."""
        raise NotImplementedError

    @property
    def shared_floats(self) -> int:
        return int(self.ctx.limits["maxComputeSharedMemorySize"]) // 4

    @property
    def max_local_y(self) -> int:
        return int(self.ctx.limits["maxComputeWorkGroupSize"][1])

    def vector_width(self, origin, extent, out_base) -> int:
        """Elements of the last dimension one invocation computes (kernels with V)."""
        return vector_width(extent, self.vec)

    def vector_store(self, origin, out_base, v) -> bool:
        """Whether the V = 4 or 8 elements of an invocation are stored as vec4s: the last
        dimension is packed and every invocation's first element is 4-aligned."""
        st = self.box_out_strides
        return (v in (4, 8) and st[-1] == 1 and all(s % 4 == 0 for s in st[:-1])
                and origin[-1] % 4 == 0 and out_base % 4 == 0)


class PathBoxKernel(BoxKernel):
    """A BoxKernel with kernel paths besides its read paths: the constructor's ``path=``
    (or the class's ``force_path``) forces one; what the paths are is the operator's."""

    force_path: str | None = None

    def __init__(self, device, desc, path: str | None = None, read: str | None = None):
        if path is not None:
            self.force_path = path
        super().__init__(device, desc, read)


def box_push(kernel: str, origin, extent, in_base: int, out_base: int, x_count: int) -> bytes:
    """The push constants of a box kernel's dispatch (glsl/include/vkml_box.glsl)."""
    return pack(kernel, "push", origin=origin, extent=extent, in_base=in_base,
                out_base=out_base, x_count=x_count, magic=[div_magic(n) for n in extent])


def whole_vec4s(windows):
    """Windows whose input spans end on a 4-element boundary (the binding then holds
    whole vec4s: its offset is 16-byte aligned); None stays None."""
    if windows is None:
        return None
    return [(o, e, ilo, ceil_div(ihi, 4) * 4, olo, ohi) for o, e, ilo, ihi, olo, ohi in windows]


def texel_block_plan(op):
    """A window kernel's "block" read (pooling, LP pooling): (windows of whole RGBA32F
    texels within maxTexelBufferElements and the storage range, the row shift 0..3, or
    None where rows, bindings or windows do not start on a texel boundary: a per-lane shift
    no variant has).  ``op``: a box kernel with ``in_strides``, ``strides`` and ``start``."""
    align = op.ctx.binding_alignment(UNIFORM_TEXEL)
    windows = whole_vec4s(op.plan_windows(
        16 * int(op.ctx.limits["maxTexelBufferElements"]), max(16, align)))
    # dispatches split along x keep multiples of 8 outputs (8 strides: 4-aligned)
    aligned = (all(s % 4 == 0 for s in op.in_strides[:-1]) and align % 16 == 0
               and all(w[0][-1] * op.strides[-1] % 4 == 0 for w in windows or ()))
    return windows, ((-op.start[-1]) % 4 if aligned else None)


def register_read_path(name: str, reads, op_class, desc_for, shape_class, **kw):
    """Register the tunable path ``name`` choosing ``op_class``'s read path among
    ``reads`` ("auto", the operator's rule, is the default) and set it as the class's
    :attr:`BoxKernel.read_path`.  A candidate runs ``op_class`` on ``desc_for(shape)``
    with ``read=`` the candidate's name; ``shape_class`` and ``kw`` as
    :func:`vkml.tuning.register_path` takes them."""
    def run(device, seq, cand, shape):
        op = op_class(device, desc_for(shape), read=cand.params["read"])
        return timed_read_candidate(device, seq, op, cand)

    path = tuning.register_path(name, [(r, {"read": r}) for r in reads], "auto",
                                shape_class, run, **kw)
    op_class.read_path = path
    return path


def timed_read_candidate(device, seq, op, cand):
    """A tuner run function's body for a BoxKernel whose ``read`` path a candidate forces
    (``op`` built with ``read=cand.params["read"]``): decline a candidate the operator
    could not take, record ``op`` over scratch tensors, return their release."""
    decline_unless(op, "read", cand)
    return record_on_scratch(device, seq, op, op.desc.input_tensor, op.desc.output_tensor)


def decline_unless(op, key: str, cand) -> None:
    """Release ``op`` and decline tuner candidate ``cand`` where ``op`` did not take the
    path the candidate forces (``getattr(op, key)`` against ``cand.params[key]``): it
    would time another candidate's work.  "auto" (the op's own rule) always runs."""
    if getattr(op, key) != cand.params[key] and cand.name != "auto":
        op.release()
        raise tuning.Declined(cand.name)


def record_on_scratch(device, seq, op, in_desc, out_desc, inputs: int = 1):
    """A tuner run function's recording: ``op`` over scratch tensors, ``inputs`` bindings
    of one of ``in_desc``'s size and one of ``out_desc``'s; returns the release of all."""
    x = device.empty((in_desc.total_tensor_size_in_bytes,), np.uint8)
    y = device.empty((out_desc.total_tensor_size_in_bytes,), np.uint8)
    op.encode(seq, [x] * inputs, [y])

    def free():
        op.release()
        x.free()
        y.free()
    return free

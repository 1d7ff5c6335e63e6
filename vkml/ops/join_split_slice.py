"""Join, split and slice (``vkml/dml/join_split_slice.py``): ``vkml.join``, ``vkml.split``
and ``vkml.slice``.

Each operator is a plan of strided copies, no kernel of its own: a join is one copy per
input into a view of the output (the output's strides, based at the input's offset along
the axis), a split one copy per output, a slice one copy from a view of the input (based
at the first element copied, strides the slice's steps times the input's, negative ones
reversing an axis).  Dimensions both sides keep contiguous are merged first, so a join
along the outermost axis is one run of bytes per input.

A copy runs on one of two paths:

* "copy": ``vkCmdCopyBuffer``, one region per contiguous row (any data type: it moves
  bytes), where rows are contiguous on both sides.  The copy engine costs a fixed time
  per region, the kernel a time per element, so short rows go to the kernel: the tuner
  chooses per row length (:data:`ROWS_PATH`); ``VKML_TUNE=off`` takes the copy engine
  from :data:`COPY_ROW_BYTES` on.
* "kernel": for 32-bit elements :mod:`vkml.ops.permute`'s copy where it takes the
  geometry (a step along rows, a transpose, a crop; tuned against the next; other sizes
  only as rows of whole words, copied as words), else
  the element-wise family's strided IDENTITY (``glsl/element_wise.comp``,
  every tensor bound as 32-bit words, so all 11 types on every device).  Its index
  arithmetic is modulo 2^32, so a negative stride is passed as its two's complement and a
  copy's element offset folded into the binding's base.  Bindings past
  ``maxStorageBufferRange`` are windowed and grids past ``maxComputeWorkGroupCount``
  split with :mod:`vkml.ops.grid`'s functions.
"""
from __future__ import annotations

import numpy as np

from .. import tuning
from ..dml.join_split_slice import (JoinOperatorDesc, Slice1OperatorDesc, SliceOperatorDesc,
                                    SplitOperatorDesc)
from ..dml.operator import as_tuple, as_uint
from ..dml.tensor_desc import TensorDesc, as_int
from ..errors import ArgumentTypeError, ValidationError
from ..runtime import Bind
from ..runtime.blocks import pack
from . import permute
from .base import CompiledOperator, implements
from .element_wise import type_class
from .functional import as_array, pick_device, run
from .grid import (BOX_CONSTANTS, binding_window, box_grid, check_allocatable, div_magic,
                   plan_windows, record_on_scratch, row_workgroup, split_groups, words8,
                   x_invocations)
from .permute import CHOICES as PERMUTE_CHOICES, coalesce

__all__ = ["join", "split", "slice"]

#: Kernel variants this module requests (the element-wise family's strided IDENTITY).
VARIANTS = dict.fromkeys([f"element_wise_{c}" for c in ("float", "int", "int64")],
                         BOX_CONSTANTS + ("V", "ACT", "OP", "DTYPE"))

#: ``VKML_TUNE=off``: rows at least this long go to the copy engine: where lavapipe's copy
#: engine overtakes the strided kernel (which moves one element per lane and store, while
#: the copy engine pays a fixed cost per region).
COPY_ROW_BYTES = 256

_U32 = 0xFFFFFFFF


def signed_span(off: int, origin, extent, strides) -> tuple[int, int]:
    """[lo, hi) element offsets ``off + sum(c[d] * strides[d])`` takes over a box, strides
    of either sign."""
    lo = hi = off
    for o, e, s in zip(origin, extent, strides):
        lo += o * s + min(0, (e - 1) * s)
        hi += o * s + max(0, (e - 1) * s)
    return lo, hi + 1


class Copy:
    """One strided copy: ``dst[dst_off + c . dst_st] = src[src_off + c . src_st]`` for c
    over ``box`` (elements; strides may be negative), from input ``src_i`` to output
    ``dst_i``."""

    def __init__(self, src_i, dst_i, box, src_off, src_st, dst_off, dst_st):
        self.src_i, self.dst_i = src_i, dst_i
        self.box, self.src_st, self.dst_st = coalesce(box, src_st, dst_st)
        self.src_off, self.dst_off = src_off, dst_off

    def rows(self, esize: int):
        """(n, 3) byte regions (src, dst, size), one per contiguous row, or None where the
        innermost dimension is not contiguous on both sides."""
        if self.src_st[-1] != 1 or self.dst_st[-1] != 1:
            return None
        outer = self.box[:-1]
        idx = np.indices(outer).reshape(len(outer), -1) if outer else np.zeros((0, 1), int)
        s = self.src_off + np.dot(np.array(self.src_st[:-1], np.int64), idx)
        d = self.dst_off + np.dot(np.array(self.dst_st[:-1], np.int64), idx)
        n = np.full_like(s, self.box[-1] * esize)
        return np.stack([s * esize, d * esize, n], axis=1)


class CompiledCopies(CompiledOperator):
    """A plan of :class:`Copy` (module doc); subclasses give :meth:`plan`.

    ``path`` forces a path for every copy: "copy" (the copy engine where rows are
    contiguous, whatever their length; the kernel otherwise) or "kernel"; None takes
    the copy engine for rows of :data:`COPY_ROW_BYTES` or more.  ``permute`` forces
    :mod:`vkml.ops.permute`'s choice for kernel copies (one of its ``CHOICES``)."""

    force_path: str | None = None
    #: the copy on :mod:`vkml.ops.permute` of a one-copy plan on the kernel path, or None
    permuted = None

    def __init__(self, device, desc, path: str | None = None, permute: str | None = None):
        if path not in (None, "copy", "kernel"):
            raise ValueError(f"path must be None, 'copy' or 'kernel', got {path!r}")
        if permute not in (None, *PERMUTE_CHOICES):
            raise ValidationError("permute", f"must be one of {PERMUTE_CHOICES}, got {permute!r}")
        self.force_path = path
        self.force_permute = permute        # one of permute.CHOICES; None: the tuner's
        super().__init__(device, desc)

    def plan(self) -> list[Copy]:
        raise NotImplementedError

    def build(self) -> None:
        d = self.desc
        ins, outs = d.inputs(), d.outputs()
        for i, t in enumerate(ins):
            check_allocatable(self.ctx, t.total_tensor_size_in_bytes, f"input tensor {i}")
        for i, t in enumerate(outs):
            check_allocatable(self.ctx, t.total_tensor_size_in_bytes, f"output tensor {i}")
        dt = outs[0].data_type
        self.esize = dt.size
        self.in_bytes = [t.total_tensor_size_in_bytes for t in ins]
        self.out_bytes = [t.total_tensor_size_in_bytes for t in outs]
        self.kernel = f"element_wise_{type_class(dt)}"
        self.consts = {"OP": 0, "DTYPE": int(dt), "ACT": 0}
        self.local = min(64, self.workgroup_size)
        self.align = max(self.ctx.binding_alignment(), 16)
        self.steps = []
        for c in self.plan():
            rows = None if self.force_path == "kernel" else c.rows(self.esize)
            if rows is not None and (self.force_path == "copy"
                                     or self._rows_path(c, len(rows)) == "copy"):
                self.steps.append(("copy", c, rows))
            elif (fast := self._permute(c)) is not None:
                self.steps.append(("permute", c, fast))
            else:
                self.steps.append(("kernel", c, self._kernel_plan(c)))
        self.paths = sorted({s[0] for s in self.steps})

    def _permute(self, c: Copy):
        """A kernel copy of 32-bit elements on :mod:`vkml.ops.permute`, or None."""
        fast = permute.plan(self, c.box, c.src_st, c.dst_st, self.esize,
                            self.in_bytes[c.src_i], self.out_bytes[c.dst_i], c.src_off,
                            c.dst_off, force=self.force_permute)
        self.permuted = self.permuted or fast
        return fast

    def _rows_path(self, c: Copy, rows: int) -> str:
        """The copy engine or the kernel for a copy of contiguous rows (module doc)."""
        row = c.box[-1] * self.esize
        if tuning.default_tuner().effective_mode() == "off":
            return "copy" if row >= COPY_ROW_BYTES else "kernel"
        shape = {"row_bytes": row, "bytes": row * rows}
        return tuning.choose(self.device, ROWS_PATH, shape).name

    def _kernel_plan(self, c: Copy):
        """(params allocation, windows or None) of a copy on the kernel path."""
        lim = self.ctx.limits["maxStorageBufferRange"]
        e = self.esize
        windows = None
        if max(self.in_bytes[c.src_i], self.out_bytes[c.dst_i]) > lim:
            windows = plan_windows(
                c.box, lambda o, x: signed_span(c.src_off, o, x, c.src_st),
                lambda o, x: signed_span(c.dst_off, o, x, c.dst_st), e, e,
                lim - 2 * self.align, f"one output element of {self.desc.OPERATOR_TYPE}")
        st_in = [s & _U32 for s in c.src_st]
        params = self.upload(np.frombuffer(pack(
            self.kernel, "Params", out_stride=words8(s & _U32 for s in c.dst_st),
            a_stride=words8(st_in), b_stride=words8(st_in), p=[0.0] * 4), np.uint8))
        return params, windows

    def encode(self, seq, inputs, outputs) -> None:
        for path, c, extra in self.steps:
            src = inputs[c.src_i].allocation
            dst = outputs[c.dst_i].allocation
            if path == "copy":
                seq.copy_array(src, dst, extra)
            elif path == "permute":
                extra.encode(seq, src, dst)
            else:
                self._encode_kernel(seq, c, src, dst, *extra)

    def _encode_kernel(self, seq, c: Copy, src, dst, params, windows) -> None:
        e = self.esize
        rank = len(c.box)
        if windows is None:
            b_in = Bind(src, 0, self.in_bytes[c.src_i], "r")
            binds = [b_in, b_in, Bind(dst, 0, self.out_bytes[c.dst_i], "rw")]
            items = [([0] * rank, list(c.box), binds, (-c.src_off & _U32, -c.dst_off & _U32))]
        else:
            items = []
            for origin, extent, *_ in windows:
                binds, bases = [], []
                for m, off0, st, acc in ((src, c.src_off, c.src_st, "r"),
                                         (dst, c.dst_off, c.dst_st, "rw")):
                    lo, hi = signed_span(off0, origin, extent, st)
                    off, size = binding_window(lo * e, hi * e, m.size, self.align)
                    binds.append(Bind(m, off, size, acc))
                    bases.append((off // e - off0) & _U32)
                items.append((origin, extent, [binds[0], binds[0], binds[1]], tuple(bases)))
        max_y = int(self.ctx.limits["maxComputeWorkGroupSize"][1])
        for origin, extent, binds, bases in items:
            xdims, v, lx, ly = row_workgroup(extent, self.local, max_y)
            pipe = self.pipeline(self.kernel, {"LOCAL_SIZE_X": lx, "LOCAL_SIZE_Y": ly,
                                               "RANK": rank, "XDIMS": xdims, "V": v,
                                               **self.consts})
            max_groups = self.ctx.limits["maxComputeWorkGroupCount"]
            for o, x in split_groups(origin, extent, lx, max_groups, xdims, v, ly):
                push = pack(self.kernel, "push", origin=words8(o), extent=words8(x),
                            a_base=bases[0], b_base=bases[0], out_base=bases[1],
                            x_count=x_invocations(x, xdims, v),
                            magic=words8(map(div_magic, x)))
                seq.dispatch(pipe, binds + [Bind(params)], box_grid(x, lx, xdims, v, ly), push)


def _rows_class(shape) -> str:
    """Copies sharing a path choice: row length to the power of two (64 KiB and longer
    one class), total bytes to the power of 4."""
    row = min(int(shape["row_bytes"]), 1 << 16)
    return f"row 2^{(row - 1).bit_length()} total 4^{int(shape['bytes']).bit_length() // 2}"


def _rows_run(device, seq, cand, shape):
    """Record a float32 join of two inputs of ``row_bytes`` rows (``bytes`` in all, at
    most 16 MiB) on candidate ``cand``."""
    w = max(1, int(shape["row_bytes"]) // 4)
    rows = max(1, min(int(shape["bytes"]), 16 << 20) // (8 * w))
    t = TensorDesc("float32", (rows, w))
    y = TensorDesc("float32", (rows, 2 * w))
    op = CompiledJoin(device, JoinOperatorDesc((t, t), y, 1), path=cand.params["path"])
    return record_on_scratch(device, seq, op, t, y, inputs=2)


#: A copy of contiguous rows: the copy engine ("copy", the ``VKML_TUNE=off`` choice from
#: COPY_ROW_BYTES on) or the strided kernel ("kernel"), by measurement per row length.
ROWS_PATH = tuning.register_path(
    "copy_rows", [("copy", {"path": "copy"}), ("kernel", {"path": "kernel"})], "copy",
    _rows_class, _rows_run, examples=[{"row_bytes": 256, "bytes": 1 << 20}],
    work_fn=lambda shape: float(shape["bytes"]))


def _along(t: TensorDesc, axis: int, start: int) -> int:
    """Element offset of index ``start`` along ``axis`` in ``t``."""
    return start * t.element_strides[axis]


@implements(JoinOperatorDesc)
class CompiledJoin(CompiledCopies):
    """DML_JOIN: one copy per input into the output's view at its offset along the axis."""

    def plan(self):
        d = self.desc
        y, a = d.output_tensor, d.axis
        copies, at = [], 0
        for i, t in enumerate(d.input_tensors):
            copies.append(Copy(i, 0, t.sizes, 0, t.element_strides, _along(y, a, at),
                               y.element_strides))
            at += t.sizes[a]
        return copies


@implements(SplitOperatorDesc)
class CompiledSplit(CompiledCopies):
    """DML_SPLIT: one copy per output from the input's view at its offset along the axis."""

    def plan(self):
        d = self.desc
        x, a = d.input_tensor, d.axis
        copies, at = [], 0
        for i, t in enumerate(d.output_tensors):
            copies.append(Copy(0, i, t.sizes, _along(x, a, at), x.element_strides, 0,
                               t.element_strides))
            at += t.sizes[a]
        return copies


@implements(SliceOperatorDesc, Slice1OperatorDesc)
class CompiledSlice(CompiledCopies):
    """DML_SLICE / DML_SLICE1: one copy from the input based at the first element copied,
    strides the slice's (signed) steps times the input's."""

    def plan(self):
        d = self.desc
        x, y = d.input_tensor, d.output_tensor
        start, steps = d.copy_start()
        xs = x.element_strides
        off = sum(c * s for c, s in zip(start, xs))
        return [Copy(0, 0, y.sizes, off, [k * s for k, s in zip(steps, xs)], 0,
                     y.element_strides)]


# -- functional forms --------------------------------------------------------------------
def _axis(axis, rank: int) -> int:
    """A NumPy-style axis (negative counts from the end) as DML's UINT."""
    a = as_int(axis, "axis")
    if not -rank <= a < rank:
        raise ValidationError("axis", f"must be in [-{rank}, {rank - 1}] for {rank} "
                              f"dimensions, got {a}")
    return a % rank


def join(tensors, axis: int = 0, *, device=None):
    """The arrays or Tensors ``tensors`` (one data type and rank, equal sizes except along
    ``axis``) concatenated along ``axis`` (DML_JOIN; ``numpy.concatenate``).  All 11
    data types; ``axis`` may be negative."""
    if not isinstance(tensors, (list, tuple)):
        raise ArgumentTypeError("tensors", f"must be a list of arrays or Tensors, got "
                                f"{type(tensors).__name__}")
    if not tensors:
        raise ValidationError("tensors", "InputCount must be greater than 0 (an empty list)")
    dev = pick_device(device, *tensors)
    xs = [as_array(t, f"tensors[{i}]") for i, t in enumerate(tensors)]
    a = _axis(axis, len(xs[0].shape))
    descs = [TensorDesc(np.dtype(x.dtype), tuple(x.shape)) for x in xs]
    out = list(xs[0].shape)
    out[a] = sum(int(x.shape[a]) if len(x.shape) > a else 0 for x in xs)
    desc = JoinOperatorDesc(tuple(descs), TensorDesc(np.dtype(xs[0].dtype), tuple(out)), a)
    return run(dev, desc, xs)


def split(x, axis: int, sizes, *, device=None):
    """``x`` cut along ``axis`` into pieces of ``sizes`` (a list summing to the axis's
    size) or into ``sizes`` equal pieces (an integer dividing it) (DML_SPLIT); a list
    of arrays or Tensors, as ``x`` came."""
    dev = pick_device(device, x)
    x = as_array(x, "x")
    shape = tuple(x.shape)
    a = _axis(axis, len(shape))
    if isinstance(sizes, (list, tuple)):
        parts = as_tuple(sizes, None, 0, "sizes", minimum=1)
    else:
        n = as_uint(sizes, "sizes", 1)
        if shape[a] % n:
            raise ValidationError("sizes", f"{n} equal parts do not divide axis {a}'s "
                                  f"size {shape[a]}")
        parts = (shape[a] // n,) * n
    dt = np.dtype(x.dtype)
    outs = tuple(TensorDesc(dt, shape[:a] + (p,) + shape[a + 1:]) for p in parts)
    out = run(dev, SplitOperatorDesc(TensorDesc(dt, shape), outs, a), [x])
    return out if isinstance(out, list) else [out]


def slice(x, offsets, sizes, strides=None, *, device=None):  # noqa: A001 (vkml.slice)
    """``x[offsets[d] + strides[d] * i for i < sizes[d]]`` per dimension (DML_SLICE; with a
    negative stride DML_SLICE1, copying backwards from ``offsets[d]``): a NumPy basic
    slice stated as (first element, count, step).  ``strides`` default to 1."""
    dev = pick_device(device, x)
    x = as_array(x, "x")
    shape = tuple(x.shape)
    rank = len(shape)
    offsets = as_tuple(offsets, None, rank, "offsets")
    sizes = as_tuple(sizes, None, rank, "sizes", minimum=1)
    steps = _steps(strides, rank)
    dt = np.dtype(x.dtype)
    xin, y = TensorDesc(dt, shape), TensorDesc(dt, sizes)
    if all(s > 0 for s in steps):
        desc = SliceOperatorDesc(xin, y, offsets, sizes, steps)
    else:
        # the window SLICE1 reads: from the lowest element copied to the highest
        lo = [o + min(0, s * (n - 1)) for o, s, n in zip(offsets, steps, sizes)]
        win = [abs(s) * (n - 1) + 1 for s, n in zip(steps, sizes)]
        for d, v in enumerate(lo):
            if v < 0:
                raise ValidationError(f"offsets[{d}]", f"a negative stride copies backwards "
                                      f"from the offset: offsets + strides * (sizes - 1) = "
                                      f"{v} is before the input's start")
        desc = Slice1OperatorDesc(xin, y, lo, win, steps)
    return run(dev, desc, [x])


def _steps(strides, rank: int) -> tuple[int, ...]:
    if strides is None:
        return (1,) * rank
    if not isinstance(strides, (list, tuple, np.ndarray)):
        strides = [strides] * rank
    return tuple(as_int(s, f"strides[{i}]") for i, s in enumerate(strides))

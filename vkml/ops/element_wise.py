"""Element-wise arithmetic and identity (``vkml/dml/element_wise.py``): ``vkml.add``,
``vkml.subtract``, ``vkml.multiply``, ``vkml.divide``, ``vkml.maximum``, ``vkml.minimum``
and ``vkml.identity``.

One kernel family, ``glsl/element_wise.comp`` (a variant per class of type: float,
8-32-bit integer, 64-bit), the operation, data type and activation as specialization
constants; every tensor is bound as 32-bit words, so all 11 types run
on every device (8/16-bit elements inside words, 64-bit integers as word pairs: no
device feature is needed).

* Packed tensors of one layout (the common case) run *flat*: one dimension of words,
  :data:`FLAT_V` words an invocation, read four at a time (RGBA32UI texels where the inputs fit
  ``maxTexelBufferElements`` unwindowed, else uvec4 storage-buffer loads: the tuner
  chooses between the two by measurement, :data:`READ_PATH`) and stored as uvec4s.
* Operands that, with the dimensions they all walk alike merged (a per-channel
  ``(1, C, 1, 1)`` operand over ``(N, C, H, W)`` becomes rows of ``H * W``), are each
  contiguous or constant along the inner extent, with the output contiguous along it and
  every row on whole words, run *by rows* (:meth:`CompiledElementWise._row_plan`): V words
  an invocation along a row as the flat path reads them, a constant operand's value loaded
  once an invocation (as batch normalization's row variants), read path by
  :data:`ROW_READ_PATH`.  The kernel takes three dimensions (outer, rows, row) with
  plain arithmetic, the dimensions before them as dispatches of their own, and which
  operand is constant is frozen into its code: SwiftShader keeps a coordinate array in
  memory and runs both sides of a branch on a specialization constant.
* Float32 without an activation and plain copies, flat or by rows on whole pairs of
  uvec4s, store each pair as one u64vec4 (the ``_u64`` variants) on a device with int64
  shaders whose measured store width is 64-bit (:mod:`vkml.ops.store_width`: lavapipe
  stores a vector one scalar per component).
* A plain packed IDENTITY (no ScaleBias) is one run of bytes: the copy engine
  (``vkCmdCopyBuffer``) or the flat ``copy`` kernel, by measurement (:data:`COPY_PATH`;
  ``VKML_TUNE=off``: the copy engine, which lavapipe runs as one ``memcpy`` and
  SwiftShader likewise, both several times faster than any kernel of theirs).  In place
  (the output is the input's memory) it moves nothing.
* A plain IDENTITY (no ScaleBias) on a kernel runs the ``copy`` variants: the same
  mains without element code; float32 without an activation the ``f32`` ones, without
  the float16 conversions and the activations.  SwiftShader runs such smaller element
  code several times faster, though it would never execute the rest.
* Anything else (transposes, sub-word rows) runs strided: each tensor through its own
  element strides, the grid over the output's box; a plain IDENTITY of 32-bit elements
  there runs :mod:`vkml.ops.permute`'s tiled or row copy where that takes it.

Tensors beyond ``maxStorageBufferRange`` are bound in windows and grids beyond
``maxComputeWorkGroupCount`` split, with :mod:`vkml.ops.grid`'s functions (this operator
has two inputs, which :class:`~vkml.ops.grid.BoxKernel` does not take).

The functional forms take NumPy arrays or Tensors with NumPy/ONNX broadcasting: an input
of fewer dimensions or with sizes of 1 becomes a DML tensor of the result's sizes whose
strides are 0 along the broadcast dimensions; nothing is copied to broadcast it.
"""
from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from .. import tuning
from ..dml.activations import ScaleBias, activation as activation_desc
from ..dml.data_type import DataType
from ..dml.element_wise import (ELEMENT_WISE, KERNEL_OP, ElementWiseAdd1OperatorDesc,
                                ElementWiseAddOperatorDesc, ElementWiseDivideOperatorDesc,
                                ElementWiseIdentityOperatorDesc, ElementWiseMaxOperatorDesc,
                                ElementWiseMinOperatorDesc, ElementWiseMultiplyOperatorDesc,
                                ElementWiseSubtractOperatorDesc)
from ..dml.tensor_desc import TensorDesc, broadcast_tensor_desc, packed_strides
from ..errors import ArgumentTypeError, UnsupportedError, ValidationError
from ..intmath import ceil_div, round_up
from ..runtime import FORMAT_RGBA32_UINT, Bind
from ..runtime.blocks import pack
from ..tensor import Tensor
from . import permute
from .permute import CHOICES as PERMUTE_CHOICES
from .base import CompiledOperator, implements
from .batch_normalization import merge_dims
from .functional import as_array, pick_device, run
from .store_width import wide_stores
from .grid import (BOX_CONSTANTS, binding_window, box_grid, check_allocatable,
                   decline_unless, div_magic, plan_windows, record_on_scratch, row_workgroup,
                   split_groups, strided_span, words8, x_invocations)

__all__ = ["add", "subtract", "multiply", "divide", "maximum", "minimum", "identity"]

_CLASSES = ("float", "int", "int64")        # the element code by class of type (type_class)
#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = {**dict.fromkeys([f"element_wise_{c}{r}" for c in _CLASSES
                             for r in ("", "_texel4", "_ssbo4")]
                            + [f"element_wise_{c}{r}" for c in ("copy", "f32")
                               for r in ("_texel4", "_ssbo4")],
                            BOX_CONSTANTS + ("V", "ACT", "OP", "DTYPE")),
            **dict.fromkeys([f"element_wise_{c}_row{r}" for c in _CLASSES + ("copy", "f32")
                             for r in ("_texel4", "_ssbo4")],
                            BOX_CONSTANTS + ("V", "ACT", "OP", "DTYPE", "A_BCAST", "B_BCAST",
                                             "VEC4")),
            **dict.fromkeys([f"element_wise_{c}_{r}_u64" for c in ("copy", "f32")
                             for r in ("texel4", "ssbo4")],
                            BOX_CONSTANTS + ("V", "ACT", "OP", "DTYPE")),
            **dict.fromkeys([f"element_wise_{c}_row_{r}_u64" for c in ("copy", "f32")
                             for r in ("texel4", "ssbo4")],
                            BOX_CONSTANTS + ("V", "ACT", "OP", "DTYPE", "A_BCAST", "B_BCAST",
                                             "VEC4"))}


def type_class(dt: DataType) -> str:
    """The kernel variant's class of ``dt`` (glsl/element_wise.comp): "float" (float32,
    float16), "int64" (64-bit types: integers, float64 moved), "int" (the rest)."""
    if dt in (DataType.FLOAT32, DataType.FLOAT16):
        return "float"
    return "int64" if dt.size == 8 else "int"

#: Words a flat invocation takes, by element size: 32 elements of up to 32 bits (as the flat
#: activation: lavapipe's and SwiftShader's cost per invocation is high, so each takes
#: many), 16 of 64 bits; a multiple of 4 for the uvec4 loop.  Fewer words for the small
#: types also keep the unrolled element code (and the pipeline's compile time) bounded.
FLAT_V = {1: 8, 2: 16, 4: 32, 8: 32}
#: Combinations of the dimensions before the row path's three it runs as dispatches of
#: their own (past it, the strided path): merged boxes of more than three dimensions are
#: rare (an operand broadcast along alternate dimensions) and small.
ROW_OUTER = 64


@implements(*ELEMENT_WISE)
class CompiledElementWise(CompiledOperator):
    """An element-wise operator on this device (module doc).

    ``read`` (flat and row paths) forces the read path: "texel4" (falls back to "ssbo4"
    where the inputs do not fit one texel view) or "ssbo4"; None lets the tuner choose
    (``VKML_TUNE=off``: texel4 where it fits).  ``rows=False`` keeps a geometry the row
    path takes on the strided one (tests compare the two); ``permute`` forces
    :mod:`vkml.ops.permute`'s choice for a plain IDENTITY on the strided path.
    ``store64`` forces the ``_u64`` stores (True, where the device has int64 shaders and
    the geometry allows them) or uvec4 stores (False); None: the device's measured store
    width (:func:`~vkml.ops.store_width.wide_stores`).  ``copy_path`` forces a plain
    packed IDENTITY onto the copy engine ("engine") or the flat kernel ("kernel"); None
    lets the tuner choose, but a forced ``read`` means the kernel."""

    force_read: str | None = None
    allow_rows: bool = True
    force_store64: bool | None = None
    #: a plain IDENTITY on the strided path: :mod:`vkml.ops.permute`'s copy, or None
    permuted = None
    #: a plain packed IDENTITY: "engine" (vkCmdCopyBuffer) or "kernel"; None otherwise
    copy_path: str | None = None

    def __init__(self, device, desc, read: str | None = None, rows: bool = True,
                 permute: str | None = None, store64: bool | None = None,
                 copy_path: str | None = None):
        if copy_path not in (None, *COPY_CHOICES):
            raise ValidationError("copy_path", f"must be one of {COPY_CHOICES}, got {copy_path!r}")
        self.force_copy_path = copy_path
        if read is not None:
            self.force_read = read
        self.allow_rows = rows
        if permute not in (None, *PERMUTE_CHOICES):
            raise ValidationError("permute", f"must be one of {PERMUTE_CHOICES}, got {permute!r}")
        self.force_permute = permute        # one of permute.CHOICES; None: the tuner's
        self.force_store64 = store64
        super().__init__(device, desc)

    def build(self) -> None:
        d = self.desc
        out = d.output_tensor
        dt = out.data_type
        if getattr(d, "scale_bias", None) is not None and dt == DataType.FLOAT64:
            raise UnsupportedError("float64 ScaleBias", "vkml applies IDENTITY's ScaleBias "
                                   "in float32 arithmetic only (FLOAT32, FLOAT16 tensors)")
        ins = d.inputs()
        a, b = ins[0], ins[-1]          # identity: B is A (its kernel never reads B)
        for name, t in (("A", a), ("B", b), ("the output", out)):
            check_allocatable(self.ctx, t.total_tensor_size_in_bytes, f"{name} tensor")
        self.esize = dt.size
        self.bytes = [a.total_tensor_size_in_bytes, b.total_tensor_size_in_bytes,
                      out.total_tensor_size_in_bytes]
        self.consts = {"OP": KERNEL_OP[d.NAME], "DTYPE": int(dt), "ACT": d.kernel_act()[0]}
        self.box = list(out.sizes)
        self.strides = [list(a.element_strides), list(b.element_strides),
                        list(out.element_strides)]
        packed = list(packed_strides(self.box))
        # the flat path moves whole words: where the elements end inside a word, the
        # element code would write the word's other bytes (A's own padding, in place),
        # so only a plain copy, which writes them back unchanged in place, takes it then
        whole = math.prod(self.box) * dt.size % 4 == 0 or (
            KERNEL_OP[d.NAME] == 0 and d.kernel_act()[0] == 0)
        self.flat = whole and all(s == packed for s in self.strides)
        self.local = min(64, self.workgroup_size)
        lim = self.ctx.limits["maxStorageBufferRange"]
        self.align = max(self.ctx.binding_alignment(), 16)
        self.room = lim - 2 * self.align
        fits = max(self.bytes) <= lim
        self.row = None if self.flat or not (fits and self.allow_rows) else self._row_plan()
        # a plain IDENTITY moves bits: the copy variants, with no element code; float32
        # with no activation the f32 ones, without float16's and the activations' (module doc)
        plain = self.consts["ACT"] == 0
        cls = ("copy" if plain and self.consts["OP"] == 0 else
               "f32" if plain and dt == DataType.FLOAT32 else type_class(dt))
        if self.flat:
            self.words = ceil_div(math.prod(self.box) * self.esize, 4)
            self.windows = None if fits else self._flat_windows()
            if cls == "copy":
                self.copy_path = self._choose_copy_path()
            # the copy engine's kernel runs only where the output partly overlaps the
            # input (encode): the static read, no tuning for it
            self.read = self._choose_read(None if self.copy_path == "engine" else READ_PATH)
            self.kernel = f"element_wise_{cls}_{self.read}" + self._u64(cls, self.windows is None)
        elif self.row is not None:
            self.windows = None
            self.words = math.prod(self.row["box"]) * math.prod(self.row["outer"])
            self.read = self._choose_read(ROW_READ_PATH)
            # u64vec4 stores: V of at least 8 words (rows that long), every row's output
            # on a whole pair of uvec4s
            out_rows = self.row["strides"][2][:-1] + self.row["outer_strides"][2]
            self.kernel = f"element_wise_{cls}_row_{self.read}" + self._u64(
                cls, self.row["vec4"] and self.row["box"][-1] >= 8
                and all(s % 8 == 0 for s in out_rows))
            self.box, self.strides = self.row["box"], self.row["strides"]
        elif cls == "copy" and self._permute():
            self.windows = None
            return                          # its kernel has its own parameters
        else:
            self.windows = None if fits else plan_windows(
                self.box, self._in_span, lambda o, e: strided_span(o, e, self.strides[2]),
                self.esize, self.esize, self.room, f"one output element of {d.OPERATOR_TYPE}")
            self.read, self.kernel = "ssbo", f"element_wise_{type_class(dt)}"
        st = self.strides
        self.params = self.upload(np.frombuffer(pack(
            self.kernel, "Params", out_stride=words8(st[2]), a_stride=words8(st[0]),
            b_stride=words8(st[1]),
            p=list(d.kernel_act()[1])), np.uint8))

    def _permute(self) -> bool:
        """A plain IDENTITY's strided copy on :mod:`vkml.ops.permute` where it takes it."""
        self.permuted = permute.plan(self, self.box, self.strides[0], self.strides[2],
                                     self.esize, self.bytes[0], self.bytes[2],
                                     force=getattr(self, "force_permute", None))
        if self.permuted is not None:
            self.read, self.kernel = self.permuted.read, self.permuted.kernel
        return self.permuted is not None

    def _u64(self, cls: str, aligned: bool) -> str:
        """The kernel name's suffix for u64vec4 stores ("_u64") or "": float32 without an
        activation and plain copies, whole tensors (flat) or output rows on whole pairs
        of uvec4s (rows), on a device with int64 shaders whose measured store width is
        64-bit (``store64`` forces the choice)."""
        ok = cls in ("copy", "f32") and aligned and bool(self.features.get("int64"))
        wide = self.force_store64 if self.force_store64 is not None else (
            ok and wide_stores(self.device))
        return "_u64" if ok and wide else ""

    def _choose_copy_path(self) -> str:
        """A plain packed IDENTITY's path: the copy engine or the flat kernel (module
        doc), forced, by the read forced (the kernel), or by the tuner."""
        if self.force_copy_path is not None:
            return self.force_copy_path
        if self.force_read is not None:
            return "kernel"
        shape = {"bytes": self.bytes[2]}
        choice = tuning.choose(self.device, COPY_PATH, shape)
        self.observe_choice(choice, shape)
        return choice.name

    def _in_span(self, origin, extent):
        """A span as long as the longer of A's and B's over the box (plan_windows sizes
        the windows by it; each input's own span is taken at dispatch)."""
        lo_a, hi_a = strided_span(origin, extent, self.strides[0])
        lo_b, hi_b = strided_span(origin, extent, self.strides[1])
        return 0, max(hi_a - lo_a, hi_b - lo_b)

    def _flat_windows(self):
        """Runs of words of at most ``room`` bytes, each starting on a binding-aligned
        offset (then also on a whole uvec4)."""
        step = self.room // self.align * self.align // 4
        return [([a], [min(step, self.words - a)]) for a in range(0, self.words, step)]

    def _row_plan(self) -> dict | None:
        """The row path's geometry, or None where it does not apply: the box merged over
        the dimensions every tensor walks alike (batch normalization's ``merge_dims``),
        the output contiguous along the inner extent and each input contiguous (stride 1)
        or constant (stride 0) along it, every contiguous tensor's rows starting on whole
        words.  The inner extent and the contiguous tensors' strides become words (a
        constant operand's stay elements: the kernel loads its one element a row);
        ``vec4``: every row starts on a whole uvec4.  The kernel takes three dimensions:
        fewer are padded with 1s, the ones before the last three (``outer``, at most
        :data:`ROW_OUTER` combinations, else None) run as dispatches of their own."""
        es = self.esize
        # a size-1 dimension is never walked: its stride is read as 0 (merge_dims drops it)
        box, strides = merge_dims(self.box, self.strides)
        last = [st[-1] for st in strides]
        if last[2] != 1 or any(s not in (0, 1) for s in last[:2]) or box[-1] * es % 4:
            return None
        contiguous = [st for st in strides if st[-1] == 1]
        if any(s * es % 4 for st in contiguous for s in st[:-1]):
            return None
        if math.prod(box[:-3]) > ROW_OUTER:
            return None
        vec4 = box[-1] * es % 16 == 0 and all(s * es % 16 == 0 for st in contiguous
                                              for s in st[:-1])
        words = [[s * es // 4 for s in st[:-1]] + [1] if st[-1] == 1 else st
                 for st in strides]
        pad = max(0, 3 - len(box))
        box = [1] * pad + box[:-1] + [box[-1] * es // 4]
        words = [[0] * pad + st for st in words]
        n = len(box) - 3
        return {"box": box[n:], "strides": [st[n:] for st in words], "outer": box[:n],
                "outer_strides": [st[:n] for st in words], "vec4": vec4,
                "bcast": [last[0] == 0, last[1] == 0]}

    def _choose_read(self, path) -> str:
        ok = (self.windows is None and ceil_div(max(self.bytes[:2]), 16)
              <= self.ctx.limits["maxTexelBufferElements"])
        if self.force_read is not None:
            return "texel4" if self.force_read == "texel4" and ok else "ssbo4"
        if not ok or path is None:
            return "texel4" if ok else "ssbo4"
        choice = tuning.choose(self.device, path, {"words": self.words})
        self.observe_choice(choice, {"words": self.words})
        return "ssbo4" if choice.name == "ssbo4" else "texel4"

    def encode(self, seq, inputs, outputs) -> None:
        a = inputs[0].allocation
        b = inputs[-1].allocation
        y = outputs[0].allocation
        if self.copy_path == "engine" and self._encode_engine(seq, a, y):
            return
        if self.permuted is not None:
            self.permuted.encode(seq, a, y)
        elif self.flat:
            self._encode_flat(seq, a, b, y)
        elif self.row is not None:
            self._encode_rows(seq, a, b, y)
        else:
            self._encode_strided(seq, a, b, y)

    def _encode_engine(self, seq, a, y) -> bool:
        """A plain packed IDENTITY on the copy engine: its elements' bytes (not the
        padding after them, which the output keeps); nothing in place.  False where the
        output partly overlaps the input, which vkCmdCopyBuffer does not take (the kernel
        copies then, as it would have)."""
        n = math.prod(self.box) * self.esize
        same = a.buffer == y.buffer
        if same and a.offset == y.offset:
            return True                     # in place: every byte is already there
        if same and abs(a.offset - y.offset) < n:
            return False
        seq.copy(a, y, [(0, 0, n)])
        return True

    def _pipeline(self, lx, ly, rank, xdims, v, **extra):
        return self.pipeline(self.kernel, {"LOCAL_SIZE_X": lx, "LOCAL_SIZE_Y": ly, "RANK": rank,
                                           "XDIMS": xdims, "V": v, **self.consts, **extra})

    def _encode_rows(self, seq, a, b, y) -> None:
        """The row path: whole tensors (it takes no windows), V words of a row an
        invocation (FLAT_V where the row holds them: lavapipe's and SwiftShader's cost is
        per invocation), a workgroup spanning several rows where they are short; a
        dispatch per combination of the outer dimensions, its offsets as the bases."""
        box = self.box
        kinds = [("r", FORMAT_RGBA32_UINT) if self.read == "texel4" else ("r",)] * 2
        binds = [Bind(m, 0, min(round_up(n, 16), m.size), *k)
                 for m, n, k in zip((a, b), self.bytes, kinds)]
        binds.append(Bind(y, 0, self.bytes[2], "w"))
        v = FLAT_V[self.esize]
        while v > 4 and v > box[-1]:
            v //= 2
        v = v if self.row["vec4"] else max(2, min(v, round_up(box[-1], 2)))
        lx = min(self.local, max(8, round_up(ceil_div(box[-1], v), 8)))
        max_y = int(self.ctx.limits["maxComputeWorkGroupSize"][1])
        ly = max(1, min(self.local // lx, box[-2], max_y))
        bc = self.row["bcast"]
        pipe = self._pipeline(lx, ly, 3, 1, v, A_BCAST=int(bc[0]), B_BCAST=int(bc[1]),
                              VEC4=int(self.row["vec4"]))
        for outer in itertools.product(*map(range, self.row["outer"])):
            # the kernel subtracts the bases: minus each tensor's offset, modulo 2^32
            bases = tuple(-sum(c * s for c, s in zip(outer, st)) % (1 << 32)
                          for st in self.row["outer_strides"])
            self._dispatch(seq, pipe, binds, [0] * 3, list(box), bases, 1, v, lx, ly)

    def _encode_flat(self, seq, a, b, y) -> None:
        texel = self.read == "texel4"
        if self.windows is None:
            if texel:
                binds = [Bind(m, 0, min(round_up(n, 16), m.size), "r", FORMAT_RGBA32_UINT)
                         for m, n in ((a, self.bytes[0]), (b, self.bytes[1]))]
            else:
                binds = [Bind(m, 0, min(round_up(n, 16), m.size), "r")
                         for m, n in ((a, self.bytes[0]), (b, self.bytes[1]))]
            items = [([0], [self.words], binds + [Bind(y, 0, self.bytes[2], "w")], (0, 0, 0))]
        else:
            items = []
            for o, e in self.windows:
                lo, hi = 4 * o[0], 4 * (o[0] + e[0])
                binds = [Bind(m, lo, min(round_up(hi, 16), m.size) - lo, acc)
                         for m, acc in ((a, "r"), (b, "r"), (y, "w"))]
                items.append((o, e, binds, (o[0], o[0], o[0])))
        # one pipeline per operation and type whatever the size (a small tensor's cost is
        # the dispatch's, not its idle lanes)
        v = FLAT_V[self.esize]
        pipe = self._pipeline(self.local, 1, 1, 1, v)
        for origin, extent, binds, bases in items:
            self._dispatch(seq, pipe, binds, origin, extent, bases, 1, v, self.local, 1)

    def _encode_strided(self, seq, a, b, y) -> None:
        rank = len(self.box)
        e = self.esize
        if self.windows is None:
            binds = [Bind(m, 0, n, acc) for m, n, acc in
                     ((a, self.bytes[0], "r"), (b, self.bytes[1], "r"), (y, self.bytes[2], "rw"))]
            items = [([0] * rank, list(self.box), binds, (0, 0, 0))]
        else:
            items = []
            for origin, extent, *_ in self.windows:
                binds, bases = [], []
                for m, st, acc in ((a, self.strides[0], "r"), (b, self.strides[1], "r"),
                                   (y, self.strides[2], "rw")):
                    lo, hi = strided_span(origin, extent, st)
                    off, size = binding_window(lo * e, hi * e, m.size, self.align)
                    binds.append(Bind(m, off, size, acc))
                    bases.append(off // e)
                items.append((origin, extent, binds, tuple(bases)))
        max_y = int(self.ctx.limits["maxComputeWorkGroupSize"][1])
        for origin, extent, binds, bases in items:
            xdims, v, lx, ly = row_workgroup(extent, self.local, max_y)
            pipe = self._pipeline(lx, ly, rank, xdims, v)
            self._dispatch(seq, pipe, binds, origin, extent, bases, xdims, v, lx, ly)

    def _dispatch(self, seq, pipe, binds, origin, extent, bases, xdims, v, lx, ly) -> None:
        """The box's dispatches, split to fit maxComputeWorkGroupCount."""
        max_groups = self.ctx.limits["maxComputeWorkGroupCount"]
        for o, e in split_groups(origin, extent, lx, max_groups, xdims, v, ly):
            push = pack(self.kernel, "push", origin=words8(o), extent=words8(e),
                        a_base=bases[0], b_base=bases[1], out_base=bases[2],
                        x_count=x_invocations(e, xdims, v), magic=words8(map(div_magic, e)))
            seq.dispatch(pipe, binds + [Bind(self.params)], box_grid(e, lx, xdims, v, ly), push)


def _read_class(shape) -> str:
    """Flat element-wise operators sharing a read choice: size within a factor of 4."""
    return f"flat 4^{(4 * shape['words']).bit_length() // 2}"


def _timed_add(device, seq, cand, shape, per_channel: bool):
    """Record a float32 ADD of ``shape["words"]`` elements read by candidate ``cand``:
    flat, or (``per_channel``) 64 rows with an operand constant along each (the row path)."""
    n = int(shape["words"])
    t = TensorDesc(DataType.FLOAT32, (64, max(1, n // 64)) if per_channel else (n,))
    b = TensorDesc(DataType.FLOAT32, t.sizes, (1, 0)) if per_channel else t
    op = CompiledElementWise(device, ElementWiseAddOperatorDesc(t, b, t),
                             read=cand.params["read"])
    decline_unless(op, "read", cand)
    return record_on_scratch(device, seq, op, t, t, inputs=2)


def _register_read(name: str, per_channel: bool):
    return tuning.register_path(
        name, [("texel4", {"read": "texel4"}), ("ssbo4", {"read": "ssbo4"})], "texel4",
        _read_class, functools.partial(_timed_add, per_channel=per_channel),
        examples=[{"words": 64 * 56 * 56}], work_fn=lambda shape: float(shape["words"]))


def _copy_class(shape) -> str:
    """Plain packed copies sharing a path choice: size within a factor of 4."""
    return f"copy 4^{int(shape['bytes']).bit_length() // 2}"


def _timed_copy(device, seq, cand, shape):
    """Record a plain packed IDENTITY of ``shape["bytes"]`` (float32) on candidate
    ``cand``'s path."""
    t = TensorDesc(DataType.FLOAT32, (max(1, int(shape["bytes"]) // 4),))
    op = CompiledElementWise(device, ElementWiseIdentityOperatorDesc(t, t),
                             copy_path=cand.params["copy_path"])
    decline_unless(op, "copy_path", cand)
    return record_on_scratch(device, seq, op, t, t)


#: A plain packed IDENTITY's path: the copy engine or the flat copy kernel.
COPY_CHOICES = ("engine", "kernel")
#: The choice between them by measurement ("engine" with ``VKML_TUNE=off``).
COPY_PATH = tuning.register_path(
    "identity_copy", [(c, {"copy_path": c}) for c in COPY_CHOICES], "engine", _copy_class,
    _timed_copy, examples=[{"bytes": 4 * 64 * 112 * 112}],
    work_fn=lambda shape: float(shape["bytes"]))

#: A flat element-wise operator's read path where texel views can hold its inputs:
#: "texel4" (the ``VKML_TUNE=off`` default) or "ssbo4", by measurement.
READ_PATH = _register_read("element_wise_read", per_channel=False)
#: The row path's read (an operand constant along rows): the same choice, measured apart.
ROW_READ_PATH = _register_read("element_wise_row_read", per_channel=True)


# -- functional forms --------------------------------------------------------------------
def _operand(x, name: str, other):
    """An operand: a Tensor, an array, or a Python number taking the other's dtype."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) and other is not None:
        dtype = other.dtype if isinstance(other, Tensor) else np.asarray(other).dtype
        return np.array([x], dtype=dtype)
    return as_array(x, name)


def _binary(cls, a, b, device, **fields):
    dev = pick_device(device, a, b)
    a_in = _operand(a, "a", b if not isinstance(b, (int, float)) else None)
    b_in = _operand(b, "b", a_in)
    if np.dtype(a_in.dtype) != np.dtype(b_in.dtype):
        raise ValidationError("b", f"must have a's data type ({np.dtype(a_in.dtype)}), got "
                              f"{np.dtype(b_in.dtype)} (the page: the tensors must have the "
                              f"same DataType)")
    try:
        out_shape = np.broadcast_shapes(tuple(a_in.shape), tuple(b_in.shape))
    except ValueError:
        raise ValidationError("b", f"shape {tuple(b_in.shape)} does not broadcast with a's "
                              f"{tuple(a_in.shape)}") from None
    dtype = np.dtype(a_in.dtype)
    desc = cls(broadcast_tensor_desc(dtype, a_in.shape, out_shape),
               broadcast_tensor_desc(dtype, b_in.shape, out_shape),
               TensorDesc(dtype, out_shape), **fields)
    return run(dev, desc, [a_in, b_in])


def add(a, b, *, fused_activation=None, device=None):
    """``a + b`` with NumPy broadcasting (DML_ELEMENT_WISE_ADD; with ``fused_activation``,
    a name or fused-form activation descriptor, DML_ELEMENT_WISE_ADD1: float types).
    ``a`` and ``b``: arrays or Tensors of one data type (a Python number takes the other's);
    integers wrap around."""
    if fused_activation is None:
        return _binary(ElementWiseAddOperatorDesc, a, b, device)
    act = activation_desc(fused_activation)
    return _binary(ElementWiseAdd1OperatorDesc, a, b, device, fused_activation=act)


def subtract(a, b, *, device=None):
    """``a - b`` with NumPy broadcasting (DML_ELEMENT_WISE_SUBTRACT); integers wrap."""
    return _binary(ElementWiseSubtractOperatorDesc, a, b, device)


def multiply(a, b, *, device=None):
    """``a * b`` with NumPy broadcasting (DML_ELEMENT_WISE_MULTIPLY); integers wrap."""
    return _binary(ElementWiseMultiplyOperatorDesc, a, b, device)


def divide(a, b, *, device=None):
    """``a / b`` with NumPy broadcasting (DML_ELEMENT_WISE_DIVIDE).  Integers: truncated
    toward zero (C's ``/``, not NumPy's floor division), ``x / 0 = 0``, INT_MIN / -1 wraps
    to INT_MIN.  Floats: IEEE (x / 0 is +-inf, 0 / 0 NaN)."""
    return _binary(ElementWiseDivideOperatorDesc, a, b, device)


def maximum(a, b, *, device=None):
    """The greater of ``a`` and ``b`` element by element, NumPy broadcasting
    (DML_ELEMENT_WISE_MAX; named like NumPy's so as not to shadow the built-in ``max``)."""
    return _binary(ElementWiseMaxOperatorDesc, a, b, device)


def minimum(a, b, *, device=None):
    """The lesser of ``a`` and ``b`` element by element (DML_ELEMENT_WISE_MIN)."""
    return _binary(ElementWiseMinOperatorDesc, a, b, device)


def as_scale_bias(value):
    """A functional form's ``scale_bias``: None, a ``vkml.dml.ScaleBias`` or a ``(scale,
    bias)`` pair (ArgumentTypeError naming ``scale_bias`` otherwise)."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ArgumentTypeError("scale_bias", f"must be a ScaleBias or a (scale, bias) "
                                    f"pair, got {value!r}")
        return ScaleBias(*value)
    return value


def identity(x, scale_bias=None, *, device=None):
    """A copy of ``x`` (DML_ELEMENT_WISE_IDENTITY), any of the 11 data types; with
    ``scale_bias`` (a ``vkml.dml.ScaleBias`` or a ``(scale, bias)`` pair; float32 and
    float16 only) ``x * scale + bias``."""
    dev = pick_device(device, x)
    x = as_array(x, "x")
    scale_bias = as_scale_bias(scale_bias)
    t = TensorDesc(np.dtype(x.dtype), tuple(x.shape))
    return run(dev, ElementWiseIdentityOperatorDesc(t, t, scale_bias), [x])


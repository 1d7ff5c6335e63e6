"""Softmax: ``DML_ACTIVATION_SOFTMAX_OPERATOR_DESC``,
``DML_ACTIVATION_SOFTMAX1_OPERATOR_DESC`` and ``vkml.softmax``.

Kernel: ``glsl/softmax.comp``.  The host merges the tensors' dimensions into *kept*
ones (each combination of their coordinates is one softmax, a *row*) and *reduced* ones
(a row's elements): dimensions of size 1 are dropped and neighbours of the same kind
that both tensors walk contiguously become one, so a softmax over the last axis of any
rank is rows of one reduced dimension.  Three paths (:data:`PATH`):

* "lane": one invocation per row, for many short rows;
* "sg": one subgroup per row (devices with subgroup shuffles in full subgroups), its
  lanes striding over the row and combining their partial maxima and sums by
  shuffles; a float32 row of up to :data:`HOLD_MAX` texels a lane is read once and held
  in registers, and stored as u64vec4 texel pairs where the device's store width says so;
* "group": one workgroup per row, its invocations striding over the row and combining
  their partial maxima and sums in shared memory, for a few long rows.

All are numerically stable (the running maximum is subtracted before ``exp``) and
accumulate in float32 for float16.  float32 is read through a texel buffer where the
whole input fits ``maxTexelBufferElements`` (lavapipe vectorizes texel reads, not
storage-buffer ones): RGBA32F texels with vec4 stores where rows are one packed
dimension a multiple of 4 long ("texel4", 4 elements a step), else R32F ("texel");
otherwise from the storage buffer, 4 elements a step where rows allow ("ssbo4"), else
one ("ssbo").  Inputs or outputs larger than
``maxStorageBufferRange`` run in windows of whole rows (:func:`.grid.plan_windows`
over the kept box); grids larger than ``maxComputeWorkGroupCount`` in several
dispatches.
"""
from __future__ import annotations

import math

import numpy as np

from .. import tuning
from ..dml.data_type import DataType
from ..dml.softmax import ActivationSoftmax1OperatorDesc, ActivationSoftmaxOperatorDesc
from ..dml.tensor_desc import TensorDesc
from ..errors import UnsupportedError, ValidationError
from ..runtime import FORMAT_R32_SFLOAT, FORMAT_RGBA32_SFLOAT, Bind
from ..runtime.blocks import pack
from .base import CompiledOperator, check_choice, implements
from .convolution.gemm import subgroup_shuffle_size
from .store_width import wide_stores
from .functional import as_array, pick_device, run
from .grid import (binding_window, check_allocatable, pieces, plan_windows, record_on_scratch,
                   strided_span, words8)
from ..intmath import ceil_div

__all__ = ["softmax"]

#: Kernel variants this module requests and the specialization constants it sets.
_TYPES = ("f32", "f32_texel", "f32_texel4", "f32_ssbo4", "f16", "f16_packed")
_HELD = ("f32_texel4", "f32_ssbo4", "f32_texel4_u64", "f32_ssbo4_u64")
VARIANTS = {**dict.fromkeys([f"softmax_{p}_{t}" for p in ("lane", "group") for t in _TYPES],
                            ("LOCAL_SIZE_X", "KR", "RR")),
            **{f"softmax_sg_{t}": ("LOCAL_SIZE_X", "KR", "RR", "SG") + (
                ("HOLD", "NREG") if t in _HELD else ()) for t in _TYPES + _HELD[2:]}}

#: Rows of at least this many elements, fewer than :data:`GROUP_MAX_ROWS` of them or
#: longer than :data:`LANE_MAX_COUNT`, take the "group" path where the tuner is off
#: (``VKML_TUNE=off``) or has not measured: a workgroup of 64 then has 8 or more
#: elements an invocation, and a few long rows leave lanes idle on the "lane" path.
GROUP_MIN_COUNT = 512
#: From this many rows "lane" keeps a CPU driver's SIMD lanes busy (lavapipe: 8) and
#: "group" pays a shared-memory tree of barriers per row, which loses on both CPU drivers.
GROUP_MAX_ROWS = 8
#: Rows longer than this take "group": lavapipe ends a loop after 65535 iterations.
LANE_MAX_COUNT = 65535
#: Rows of at least this many texels (4 elements) a lane of a subgroup take "sg" rather
#: than "lane" where the tuner is off or has not measured: the subgroup's lanes read
#: neighbouring texels of one row (and hold it, :data:`HOLD_MAX`) instead of one row
#: each: X is read once, not twice, and a u64vec4 store takes a lane's texel pair.
SG_MIN_TEXELS = 8
#: The "sg" path's texel4 / ssbo4 variants hold a row of up to this many texels a lane
#: in registers (read once, not twice); longer rows stream it twice.
HOLD_MAX = 64


def split_axes(sizes, strides_in, strides_out, reduced):
    """``(kept, reduced)``: lists of ``(size, in_stride, out_stride)`` after dropping
    dimensions of size 1 and merging neighbours of the same kind that both tensors walk
    as one; each has at least one entry (size 1 where none is left)."""
    groups = {True: [], False: []}
    last = None
    for d, s in enumerate(sizes):
        if s == 1:
            continue
        red = d in reduced
        g = groups[red]
        if last is red and g and g[-1][1] == strides_in[d] * s and g[-1][2] == strides_out[d] * s:
            g[-1] = (g[-1][0] * s, strides_in[d], strides_out[d])
        else:
            g.append((s, strides_in[d], strides_out[d]))
        last = red
    return groups[False] or [(1, 0, 0)], groups[True] or [(1, 0, 0)]


@implements(ActivationSoftmaxOperatorDesc, ActivationSoftmax1OperatorDesc)
class CompiledSoftmax(CompiledOperator):
    """Softmax on this device (module doc).  ``path``: "lane", "sg" or "group" forces
    one; None lets the tuner choose (:data:`PATH`).  ``read``: "texel", "ssbo4" or
    "ssbo" forces the float32 read (texel falls back to ssbo where the input does not fit
    a texel view, ssbo4 to the rule where rows do not allow it); None: "texel4" where the
    rows allow it (:meth:`_choose_read`).  ``store64``: True / False forces or refuses
    the "sg" path's u64vec4 stores (None: the device's store width, :meth:`_hold`)."""

    def __init__(self, device, desc, path: str | None = None, read: str | None = None,
                 store64: bool | None = None):
        if path not in (None, "auto", "lane", "sg", "group"):
            raise ValidationError("path", f"must be 'lane', 'sg' or 'group', got {path!r}")
        check_choice("read", read, ("texel4", "ssbo4", "texel", "ssbo"))
        check_choice("store64", store64, (True, False))
        self.force_path, self.force_read, self.force_store64 = path, read, store64
        super().__init__(device, desc)

    def build(self) -> None:
        d = self.desc
        x, y = d.input_tensor, d.output_tensor
        kept, red = split_axes(x.sizes, x.element_strides, y.element_strides,
                               set(d.reduced_axes()))
        self.box = [k[0] for k in kept]
        self.kin, self.kout = [k[1] for k in kept], [k[2] for k in kept]
        self.rsize = [r[0] for r in red]
        self.rin, self.rout = [r[1] for r in red], [r[2] for r in red]
        self.count = math.prod(self.rsize)
        self.rows = math.prod(self.box)
        self.esize = x.data_type.size
        self.in_bytes, self.out_bytes = x.total_tensor_size_in_bytes, y.total_tensor_size_in_bytes
        check_allocatable(self.ctx, self.in_bytes, "the input tensor")
        check_allocatable(self.ctx, self.out_bytes, "the output tensor")
        self.windows = self._plan_windows()
        self.path = self._choose_path()
        f32 = x.data_type == DataType.FLOAT32
        base = "f32" if f32 else ("f16" if self.features.get("storage16") else "f16_packed")
        self.read = self._choose_read(f32)
        self.kernel = f"softmax_{self.path}_{base}" + ("" if self.read == "ssbo" else
                                                      "_" + self.read)
        self.local, self.hold = self._local(), False
        consts = {"LOCAL_SIZE_X": self.local, "KR": len(self.box), "RR": len(self.rsize)}
        if self.path == "sg":
            consts["SG"] = self.sg
            if self.read in ("texel4", "ssbo4"):
                consts.update(self._hold())
            self.pipe = self.ctx.pipelines.variant(self.kernel, consts, subgroup_size=self.sg)
        else:
            self.pipe = self.pipeline(self.kernel, consts)
        block = pack(self.kernel, "Params", in_kstride=words8(self.kin),
                     out_kstride=words8(self.kout), in_rstride=words8(self.rin),
                     out_rstride=words8(self.rout), rsize=words8(self.rsize), count=self.count)
        self.params = self.upload(np.frombuffer(block, np.uint8))

    def _choose_read(self, f32: bool) -> str:
        """float32 with the whole input bound: where rows are one packed dimension, a
        multiple of 4 long and 4-aligned, 4 elements a step with vec4 stores, read as
        RGBA32F texels ("texel4") where the input fits maxTexelBufferElements of them,
        else as vec4 storage-buffer loads ("ssbo4"); other rows through an R32F view
        ("texel") where it fits.  "ssbo" otherwise or where forced."""
        lim = self.ctx.limits["maxTexelBufferElements"]
        if not f32 or self.windows is not None or self.force_read == "ssbo":
            return "ssbo"
        if self.force_read != "texel" and (
                len(self.rsize) == 1 and self.rin == [1] and self.rout == [1]
                and self.count % 4 == 0
                and all(s % 4 == 0 for s in self.kin + self.kout)):
            fits = ceil_div(self.in_bytes, 16) <= lim and self.force_read != "ssbo4"
            return "texel4" if fits else "ssbo4"
        return "texel" if ceil_div(self.in_bytes, 4) <= lim else "ssbo"

    def _hold(self) -> dict:
        """The "sg" path's texel4 / ssbo4 constants: a row of at most :data:`HOLD_MAX`
        texels a lane held in registers (HOLD), as pairs of texels stored as u64vec4s
        (the ``_u64`` variant) where rows are a multiple of 8 long and 8-aligned and the
        device's store width (or ``store64``) says so."""
        wide = self.force_store64 if self.force_store64 is not None else wide_stores(
            self.device)
        u64 = (wide and self.features.get("int64") and self.count % 8 == 0
               and all(s % 8 == 0 for s in self.kin + self.kout))
        nreg = 2 * ceil_div(self.count // 8, self.sg) if u64 else ceil_div(self.count // 4,
                                                                              self.sg)
        self.hold = nreg <= HOLD_MAX
        if not self.hold:
            return {"HOLD": 0, "NREG": 1}
        if u64:
            self.kernel += "_u64"
        return {"HOLD": 1, "NREG": nreg}

    def _local(self) -> int:
        """Workgroup size: 64 lanes for "lane" and "sg" (64 / SG rows); for "group" a
        power of two up to 256 (and the device's limit), no more than a row's elements
        need."""
        if self.path == "lane":
            return min(64, self.workgroup_size)
        if self.path == "sg":
            return self.sg * max(1, min(64 // self.sg, self.workgroup_size // self.sg,
                                        self.ctx.limits["maxComputeWorkgroupSubgroups"]))
        cap = 1 << (self.workgroup_size.bit_length() - 1)
        want = 1 << max(5, (ceil_div(self.count, 8) - 1).bit_length())
        return min(256, cap, want)

    def shape(self) -> dict:
        """The tuner's shape: rows, elements a row, data type."""
        return {"rows": self.rows, "count": self.count,
                "dtype": self.desc.input_tensor.data_type.name.lower()}

    def _choose_path(self) -> str:
        """The forced path, else the tuner's choice for the shape's class, else the rule
        (:data:`GROUP_MIN_COUNT`); never "lane" for rows longer than
        :data:`LANE_MAX_COUNT` nor "sg" for rows longer than that many subgroups (a class
        spans a factor of 4 in row length: its choice may come from shorter rows), nor
        "sg" without full subgroups and shuffles; a forced one refuses those rows."""
        self.sg = subgroup_shuffle_size(self)
        if self.force_path == "sg" and not self.sg:
            raise UnsupportedError("softmax path 'sg' needs subgroup shuffles in full "
                                   "subgroups, which this device lacks")
        for name, most in (("lane", LANE_MAX_COUNT), ("sg", LANE_MAX_COUNT * self.sg)):
            if self.force_path == name and self.count > most:
                raise ValidationError("path", f"{name!r} takes rows of at most {most} "
                                      f"elements (lavapipe ends a loop after 65535 "
                                      f"iterations), not {self.count}")
        if self.force_path in ("lane", "sg", "group"):
            return self.force_path
        rule = ("group" if self.count >= GROUP_MIN_COUNT and (
            self.rows < GROUP_MAX_ROWS or self.count > LANE_MAX_COUNT) else "lane")
        if rule == "lane" and self.sg and self.count >= SG_MIN_TEXELS * 4 * self.sg:
            rule = "sg"
        if self.force_path == "auto":
            return rule
        choice = tuning.choose(self.device, PATH, self.shape())
        if (choice.name == "auto" or (choice.name == "lane" and self.count > LANE_MAX_COUNT)
                or (choice.name == "sg" and not 0 < self.count <= LANE_MAX_COUNT * self.sg)):
            return rule
        self.observe_choice(choice, self.shape())
        return choice.name

    def _plan_windows(self):
        """Windows of the kept box (whole rows) whose input and output spans each fit a
        binding; None where both tensors do."""
        limit = self.ctx.limits["maxStorageBufferRange"]
        if self.in_bytes <= limit and self.out_bytes <= limit:
            return None
        rin = sum((s - 1) * st for s, st in zip(self.rsize, self.rin))
        rout = sum((s - 1) * st for s, st in zip(self.rsize, self.rout))

        def span(strides, extra):
            def f(origin, extent):
                lo, hi = strided_span(origin, extent, strides)
                return lo, hi + extra
            return f

        room = limit - 2 * self.ctx.binding_alignment()
        return [(o, e, ilo, ihi, olo, ohi) for o, e, ilo, ihi, olo, ohi in plan_windows(
            self.box, span(self.kin, rin), span(self.kout, rout), self.esize, self.esize,
            room, f"one softmax row of {self.desc.OPERATOR_TYPE}")]

    def encode(self, seq, inputs, outputs) -> None:
        x, y = inputs[0].allocation, outputs[0].allocation
        fmt = {"texel": FORMAT_R32_SFLOAT, "texel4": FORMAT_RGBA32_SFLOAT}.get(self.read, 0)
        in_bind = (ceil_div(self.in_bytes, 16) * 16 if self.read in ("texel4", "ssbo4")
                   else self.in_bytes)
        rank = len(self.box)
        if self.windows is None:
            items = [([0] * rank, list(self.box), Bind(x, 0, in_bind, "r", fmt),
                      Bind(y, 0, self.out_bytes, "w"), 0, 0)]
        else:
            items = []
            align = self.ctx.binding_alignment()
            for o, e, ilo, ihi, olo, ohi in self.windows:
                ioff, isize = binding_window(ilo * self.esize, ihi * self.esize, x.size, align)
                ooff, osize = binding_window(olo * self.esize, ohi * self.esize, y.size, align)
                items.append((o, e, Bind(x, ioff, isize, "r", fmt), Bind(y, ooff, osize, "w"),
                              ioff // self.esize, ooff // self.esize))
        per_group = {"lane": self.local, "sg": self.local // max(self.sg, 1)}.get(self.path, 1)
        max_x = int(self.ctx.limits["maxComputeWorkGroupCount"][0])
        for o, e, bx, by, ib, ob in items:
            rows = math.prod(e)
            for first, n in pieces(rows, max_x * per_group):
                push = pack(self.kernel, "push", origin=words8(o), extent=words8(e),
                            in_base=ib, out_base=ob, row_first=first, rows=rows)
                seq.dispatch(self.pipe, [bx, by, Bind(self.params)],
                             (ceil_div(n, per_group), 1, 1), push)


def _path_class(shape) -> str:
    """Softmaxes sharing a path choice: rows and row length each within a factor of 4."""
    return (f"{shape['dtype']} rows 4^{(int(shape['rows'])).bit_length() // 2} "
            f"count 4^{(int(shape['count'])).bit_length() // 2}")


def _path_run(device, seq, cand, shape):
    """Record a packed softmax of ``shape`` (rows x count) on candidate ``cand``."""
    t = TensorDesc(shape.get("dtype", "float32"), (int(shape["rows"]), int(shape["count"])))
    if cand.params["path"] == "lane" and int(shape["count"]) > LANE_MAX_COUNT:
        raise tuning.Declined(f"rows longer than {LANE_MAX_COUNT} elements")
    op = CompiledSoftmax(device, ActivationSoftmax1OperatorDesc(t, t, (1,)),
                         path=cand.params["path"])
    return record_on_scratch(device, seq, op, t, t)


#: The softmax kernel: "auto" (the ``VKML_TUNE=off`` default: "group" for a few rows of
#: at least :data:`GROUP_MIN_COUNT` elements or longer rows than "lane" takes, else "sg"
#: for rows of :data:`SG_MIN_TEXELS` texels a lane where the device has subgroup
#: shuffles, else "lane"; not in the fast list, being one of the others), "lane", "sg" or
#: "group", chosen by the device's timing for the shape's class (rows and row length
#: within a factor of 4).
PATH = tuning.register_path(
    "softmax_path", [("auto", {"path": "auto"}, False), ("lane", {"path": "lane"}),
                     ("sg", {"path": "sg"}), ("group", {"path": "group"})], "auto",
    _path_class, _path_run, work_fn=lambda s: float(s["rows"]) * float(s["count"]),
    examples=[{"rows": 4096, "count": 1000, "dtype": "float32"},
              {"rows": 64, "count": 16384, "dtype": "float32"}])


def softmax(x, axes=-1, *, device=None):
    """Softmax over ``axes`` (``DML_ACTIVATION_SOFTMAX1_OPERATOR_DESC``): ``exp(x) /
    sum(exp(x))`` along them, each combination of the other coordinates on its own, the
    maximum subtracted first (numerically stable) and float16 accumulated in float32.

    ``axes``: one axis or a sequence of them, negative ones counted from the end (the
    default -1: the last axis, as ONNX Softmax-13 and ``torch.softmax(x, -1)``).
    ``x``: float32 or float16, 1 to 8 dimensions; the result has its shape and dtype.
    """
    from ..dml.operator import as_tuple

    dev = pick_device(device, x)
    x = as_array(x, "x")
    rank = len(x.shape)
    if isinstance(axes, (int, np.integer)) and not isinstance(axes, (bool, np.bool_)):
        axes = (axes,)
    if isinstance(axes, (list, tuple)):
        axes = tuple(a + rank if isinstance(a, (int, np.integer)) and not isinstance(
            a, (bool, np.bool_)) and -rank <= a < 0 else a for a in axes)
    axes = as_tuple(axes, None, 1, "axes")
    t = TensorDesc(x.dtype, tuple(x.shape))
    return run(dev, ActivationSoftmax1OperatorDesc(t, t, axes), [x])

"""Reduce: ``DML_REDUCE_OPERATOR_DESC`` and ``vkml.reduce``.

Kernel: ``glsl/reduce.comp``, one variant per element type (floats in float32; 8/16/32-bit
integers in 32-bit words, 64-bit ones as word pairs: no 8/16-bit storage or shaderInt64
needed), the function a specialization constant; float32 is read through an R32F texel
buffer where the whole input fits one (:func:`texel_read`).  The reduced axes are merged
where neighbouring ones address as one.  Three paths, chosen by the tuner
(:data:`REDUCE_PATH`): "lane" (one invocation per output element, over the output box
with :class:`.grid.BoxKernel`'s windows and split dispatches), "group" (one workgroup per
output element, its lanes' states combined in a shared-memory tree) and, for float32,
"vec4" (4-element texel or vec4 reads: 4 outputs an invocation along a packed kept last
axis, or 8 or 16 as "vec4x2" / "vec4x4" (:data:`KEPT_CHOICES`), a packed innermost
reduced axis read 4 at a time, or a packed run of reduced elements through the texels
covering it; see :func:`vec4_mode`, the texels between its ends unrolled where every
output has as many, :func:`span_texels`); the last two bind the whole tensors (within
``maxStorageBufferRange``).
``VKML_TUNE=off`` ("auto"): "group" where the elements reduced per output are at least
:data:`GROUP_MIN` and at least the output count (a long reduction into few outputs
leaves most lanes idle in "lane"), or more than "lane" takes (:data:`LANE_MAX`), else
"lane"; then "vec4" where it runs instead of "lane", or of "group" from
:data:`VEC4_UNITS` invocations.
"""
from __future__ import annotations

import math

import numpy as np

from .. import tuning
from ..dml.data_type import DataType
from ..dml.operator import as_ints
from ..dml.reduce import ARG_FUNCTIONS, ReduceFunction, ReduceOperatorDesc, reduce_output_sizes
from ..dml.tensor_desc import TensorDesc
from ..errors import UnsupportedError, ValidationError
from ..intmath import ceil_div
from ..runtime import Bind
from ..runtime.blocks import pack
from .base import implements
from .functional import as_array, pick_device, run
from .grid import (BOX_CONSTANTS, PathBoxKernel, record_on_scratch, strided_span,
                   words8)

__all__ = ["reduce"]

_SUFFIX = {DataType.FLOAT32: "f32", DataType.INT8: "i8", DataType.UINT8: "u8",
           DataType.INT16: "i16", DataType.UINT16: "u16", DataType.INT32: "i32",
           DataType.UINT32: "u32", DataType.INT64: "i64", DataType.UINT64: "u64"}
#: Kernel variants this module requests (glsl/reduce.comp) and the constants it sets.
VARIANTS = dict.fromkeys(
    ["reduce_" + s for s in ("f32", "f32_texel", "f32_texel4", "f32_ssbo4", "f16", "f16_packed",
                             "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64")],
    BOX_CONSTANTS + ("FUNC", "RDIMS", "OUT_INDEX", "GROUP", "VEC4", "KEPT", "SPAN", "KDIMS"))
#: "auto" takes "group" from this many elements reduced per output (and at least as many
#: as there are outputs).
GROUP_MIN = 1024
#: "group" takes outputs of at least this many elements: with fewer most of a workgroup's
#: lanes idle while its tree still runs, and the tuner would time (and wait for) a path
#: that cannot win.
GROUP_FLOOR = 64
#: "group"'s lanes walk at least this many elements each (the workgroup is the power of 2
#: of at most count / GROUP_WALK lanes, up to 256).
GROUP_WALK = 16
#: "auto" takes "vec4" over "group" from this many invocations (one workgroup of lanes
#: each walking a row beats a workgroup per output and its shared-memory tree on the CPU
#: drivers, whose barriers are costly).
VEC4_UNITS = 64
#: "vec4" along a kept last axis (mode 1): the vec4s of neighbouring outputs a lane may
#: hold (glsl/reduce.comp's KEPT), each path named "vec4x<n>" past 1.  More a lane
#: means longer contiguous reads of each reduced row per visit and fewer lanes.
KEPT_CHOICES = (1, 2, 4)
#: Elements one output may reduce on each path: a lane walks them 4 an iteration (lane:
#: all of them; group: one in 256) and lavapipe ends any loop after 65535 iterations.
LANE_MAX = 1 << 17
GROUP_MAX = 1 << 26
#: The most that glsl/reduce.comp's SPAN unrolls on the "vec4" path (the code grows with
#: it; all within one partial sum of BLOCK terms, so the order of terms is the loop's):
#: texels between a packed run's first and last one (global pooling of 7x7 has 11, of 8x8
#: 15), texels of a row, and elements of a kept reduction times the vec4s a lane holds.
SPAN_MAX = 16
SPAN_ROW_MAX = 32
SPAN_KEPT_MAX = 64


def element_variant(family: str, t: DataType, features: dict) -> str:
    """The ``<family>_<type>`` variant of an element type (glsl/include/vkml_elem.glsl):
    float16 as halves where the device has 16-bit storage, else packed in words."""
    if t == DataType.FLOAT16:
        return family + ("_f16" if features.get("storage16") else "_f16_packed")
    return f"{family}_{_SUFFIX[t]}"


def merged_axes(sizes, strides, axes) -> tuple[list[int], list[int]]:
    """(sizes, strides) of the reduced axes in increasing order, size-1 axes dropped and
    neighbours merged where the outer one's stride is the inner one's span (the row-major
    numbering over the reduced axes is kept); at least one entry."""
    rs, rt = [], []
    for a in sorted(axes):
        if sizes[a] == 1:
            continue
        if rs and rt[-1] == strides[a] * sizes[a]:
            rs[-1] *= sizes[a]
            rt[-1] = strides[a]
        else:
            rs.append(sizes[a])
            rt.append(strides[a])
    return (rs or [1]), (rt or [0])


def texel_read(op, force: str | None) -> str:
    """"texel" (float32 read through an R32F uniform texel buffer: lavapipe vectorizes
    texel reads, a storage-buffer read is one lane at a time) where the whole input is
    bound (no windows) within maxTexelBufferElements and ``force`` is not "ssbo"; else
    "ssbo".  Chosen from the limit (SwiftShader's texel buffers hold 65536 elements)."""
    ok = (op.desc.input_tensor.data_type == DataType.FLOAT32 and op.windows is None
          and op.in_bytes // 4 <= op.ctx.limits["maxTexelBufferElements"])
    return "texel" if ok and force != "ssbo" else "ssbo"


def vec4_mode(op) -> int:
    """The "vec4" path's way over the float32 input (glsl/reduce.comp's VEC4): 1 where the
    packed last axis is kept with a multiple of 4 elements (4 outputs an invocation), 2
    where the merged innermost reduced axis is packed with a multiple of 4 (a row read 4
    elements at once; both need every stride a multiple of 4: a texel holds 4 elements
    16-byte aligned), else 3 where the reduced elements are one packed run (one merged
    axis of unit stride: the texels covering it); 0 otherwise or where the tensors are
    windowed."""
    src = op.desc.input_tensor
    if src.data_type != DataType.FLOAT32 or op.windows is not None:
        return 0
    span = 3 if op.rstride == [1] else 0
    if any(s % 4 for s in op.rstride[:-1] + op.in_strides[:-1]):
        return span
    last = len(src.sizes) - 1
    if op.in_strides[-1] == 1 and src.sizes[last] % 4 == 0 and op.rstride[-1] % 4 == 0:
        return 1
    if op.rstride[-1] == 1 and op.rsize[-1] % 4 == 0 and op.in_strides[-1] % 4 == 0:
        return 2
    return span


def span_texels(op) -> int:
    """glsl/reduce.comp's SPAN, the "vec4" path's reduced elements unrolled (no loop, no
    test per element), where there is one reduced axis (after merging): along a kept last
    axis (mode 1), its elements, at most :data:`SPAN_KEPT_MAX` times the vec4s a lane
    holds; a row (mode 2), its texels, at most :data:`SPAN_ROW_MAX`; a packed run (mode
    3), the texels strictly between its first and last one, 1 to :data:`SPAN_MAX`, where
    that is one number for every output (every run starts at the same offset within a
    texel, or the run's length is 1 more than a multiple of 4, which any start leaves the
    same).  0 (the loop) otherwise and for LOG_SUM_EXP (up to 64 of its merges, an exp
    and branches each: SwiftShader did not compile as many in "vec4x4" in minutes)."""
    if op.fn == ReduceFunction.LOG_SUM_EXP:
        return 0
    if op.vec4 in (1, 2) and len(op.rsize) > 1:
        return 0
    if op.vec4 == 1:
        return op.count if op.count * op.kept <= SPAN_KEPT_MAX else 0
    if op.vec4 == 2:
        return op.count // 4 if op.count // 4 <= SPAN_ROW_MAX else 0
    if op.vec4 != 3:
        return 0
    step = math.gcd(4, *(s for s, n in zip(op.in_strides, op.box) if n > 1))
    inner = {((a + op.count - 1) >> 2) - 1 for a in range(0, 4, step)}
    return inner.pop() if len(inner) == 1 and 1 <= min(inner) <= SPAN_MAX else 0


def kept_axes(op) -> tuple[list[int], list[int], list[int]]:
    """The "vec4" path's kept axes (glsl/reduce.comp's KDIMS): (sizes, input strides,
    output strides) of the output's axes of more than one element, neighbours merged where
    the outer one's strides are the inner one's spans in both tensors, packed last into 8
    (leading size 1, strides 0)."""
    ks, ki, ko = [], [], []
    for n, si, so in zip(op.box, op.in_strides, op.box_out_strides):
        if n == 1:
            continue
        if ks and ki[-1] == si * n and ko[-1] == so * n:
            ks[-1] *= n
            ki[-1], ko[-1] = si, so
        else:
            ks.append(n)
            ki.append(si)
            ko.append(so)
    lead = 8 - len(ks)
    return [1] * lead + ks, [0] * lead + ki, [0] * lead + ko


def vec4_read(op) -> str:
    """The "vec4" path's read: RGBA32F texels where the input fits maxTexelBufferElements
    of them and storage reads are not forced (``read="ssbo"``), else vec4 storage-buffer
    loads."""
    texels = ceil_div(op.in_bytes, 16)
    fits = texels <= op.ctx.limits["maxTexelBufferElements"] and op.force_read != "ssbo"
    return "texel4" if fits else "ssbo4"


def digits(n: int, radix) -> list[int]:
    """``n`` as mixed-radix digits of ``radix`` (innermost last), n below their product
    taken modulo it."""
    out = []
    for r in reversed(radix):
        out.append(n % r)
        n //= r
    return out[::-1]


@implements(ReduceOperatorDesc)
class CompiledReduce(PathBoxKernel):
    """Reduce on this device: see the module doc and ``glsl/reduce.comp``.

    ``force_path`` (``path=``): "lane", "group", None (the tuner chooses) or "auto" (the
    rule, no measuring); a path the tensors do not allow falls back to "lane".
    ``force_read`` (``read=``): "ssbo" forces storage-buffer reads where "texel" is
    possible (:func:`texel_read`)."""

    #: "vec4" along a kept last axis: vec4s of outputs a lane holds (:data:`KEPT_CHOICES`)
    kept: int = 1

    def build(self) -> None:
        d = self.desc
        src, dst = d.input_tensor, d.output_tensor
        self.fn = d.reduce_function
        self.kernel = element_variant("reduce", src.data_type, self.features)
        self.in_esize, self.out_esize = src.data_type.size, dst.data_type.size
        self.in_bytes = self.in_bind = src.total_tensor_size_in_bytes
        self.out_bytes = dst.total_tensor_size_in_bytes
        # the box has 8 dimensions whatever the rank (leading ones of size 1): one pipeline
        # serves every rank (lavapipe compiles one in ~0.1-0.6 s)
        lead = [0] * (8 - dst.dimension_count)
        self.rank = 8
        self.box = [1] * len(lead) + list(dst.sizes)
        self.box_out_strides = lead + list(dst.element_strides)
        axes = set(as_ints(d.axes, "axes"))
        strides = src.element_strides
        self.in_strides = lead + [0 if i in axes else s for i, s in enumerate(strides)]
        self.rsize, self.rstride = merged_axes(src.sizes, strides, axes)
        self.count = math.prod(self.rsize)
        if self.count > GROUP_MAX:
            raise UnsupportedError("reduce", f"{self.count} elements reduced per output: at "
                                   f"most {GROUP_MAX} (a lane's loop stays within 65535 "
                                   "iterations, lavapipe's limit)")
        self.outputs_n = math.prod(dst.sizes)
        self.local = min(64, self.workgroup_size)
        self.windows = self.plan_windows()
        self.vec4 = vec4_mode(self)
        self.path = self._choose_path()
        self.apply_read(vec4_read(self) if self.path == "vec4"
                        else texel_read(self, self.force_read))
        # "group": lanes that walk GROUP_WALK elements each at least (up to 256): a
        # workgroup wider than its reduction idles its lanes through every barrier of the
        # tree, which the CPU drivers pay per lane (112 elements on 256 lanes ran 100x
        # slower than on 4)
        lanes = min(256, self.workgroup_size, max(1, self.count // GROUP_WALK))
        self.group_local = 1 << (lanes.bit_length() - 1)
        step = digits(self.group_local, self.rsize)
        sizes, in_strides, out_strides = (kept_axes(self) if self.path == "vec4" else
                                          (self.box, self.in_strides, self.box_out_strides))
        self.params = self.upload(np.frombuffer(pack(
            self.kernel, "Params", out_stride=words8(out_strides),
            in_stride=words8(in_strides), out_size=words8(sizes),
            rsize=words8(self.rsize), rstride=words8(self.rstride), rstep=words8(step),
            count=self.count, pad0=0, pad1=0, pad2=0), np.uint8))
        index = {DataType.INT32: 1, DataType.UINT32: 1, DataType.INT64: 2, DataType.UINT64: 2}
        self.consts = {"RANK": self.rank, "FUNC": int(self.fn), "RDIMS": len(self.rsize),
                       "KEPT": self.kept,
                       "SPAN": span_texels(self) if self.path == "vec4" else 0,
                       "KDIMS": sum(n > 1 for n in sizes) if self.path == "vec4" else 0,
                       "OUT_INDEX": index[dst.data_type] if self.fn in ARG_FUNCTIONS else 0}

    def _choose_path(self) -> str:
        """The forced path where it may run (else "lane", else "group"), else the tuner's
        choice, else the rule of the module doc; "vec4x<n>" is "vec4" with
        :attr:`kept` n."""
        ok = {"lane": self.count <= LANE_MAX,
              "group": self.windows is None and self.count >= GROUP_FLOOR,
              "vec4": self.vec4 != 0 and self.count <= LANE_MAX}
        last = self.desc.input_tensor.sizes[-1]
        for n in KEPT_CHOICES[1:]:
            # LOG_SUM_EXP's 16 states a lane: SwiftShader's compiler did not finish their
            # 64 unrolled merges (branches and exp each) in minutes
            ok[f"vec4x{n}"] = (ok["vec4"] and self.vec4 == 1 and last % (4 * n) == 0
                               and not (n > 2 and self.fn == ReduceFunction.LOG_SUM_EXP))
        path = self._path_by_rule_or_tuner(ok)
        if path.startswith("vec4x"):
            self.kept = int(path[5:])
            return "vec4"
        return path

    def _path_by_rule_or_tuner(self, ok: dict) -> str:
        if not (ok["lane"] or ok["group"]):
            raise UnsupportedError("maxStorageBufferRange", f"{self.count} elements reduced "
                                   f"per output need the group path (over {LANE_MAX}), which "
                                   "binds the whole tensors, and they exceed the range")
        if self.force_path not in (None, "auto"):
            if ok.get(self.force_path):
                return self.force_path
            return "vec4" if self.force_path.startswith("vec4") and ok["vec4"] else (
                "lane" if ok["lane"] else "group")
        rule = ("group" if ok["group"] and (not ok["lane"] or (
            self.count >= GROUP_MIN and self.count >= self.outputs_n)) else "lane")
        if ok["vec4"] and (rule == "lane" or self.units("vec4") >= VEC4_UNITS):
            rule = "vec4"
        if self.force_path is None and self.desc.input_tensor.data_type == DataType.FLOAT32:
            return self.tuned_read(REDUCE_PATH, reduce_shape(self.desc), ok) or rule
        return rule

    @property
    def taken(self) -> str:
        """The path as the tuner's candidates name it ("vec4x<n>" for :attr:`kept` n)."""
        return f"vec4x{self.kept}" if self.path == "vec4" and self.kept > 1 else self.path

    def units(self, path: str) -> int:
        """Invocations ("vec4") or workgroups ("group") a flat path runs."""
        return self.outputs_n // (4 * self.kept if path == "vec4" and self.vec4 == 1 else 1)

    def in_span(self, origin, extent):
        lo, hi = strided_span(origin, extent, self.in_strides)
        return lo, hi + sum((s - 1) * t for s, t in zip(self.rsize, self.rstride))

    def encode(self, seq, inputs, outputs) -> None:
        x, y = inputs[0].allocation, outputs[0].allocation
        if self.path in ("group", "vec4"):
            self._encode_flat(seq, x, y)
            return

        def pipeline_for(lx, ly, xdims, v, vec_store):
            return self.pipeline(self.kernel, {"LOCAL_SIZE_X": lx, "LOCAL_SIZE_Y": ly,
                                               "XDIMS": xdims, "GROUP": 0, "VEC4": 0,
                                               **self.consts})
        self.dispatch_windows(seq, x, y, self.windows, pipeline_for, [Bind(self.params)],
                              self.in_kind, self.in_fmt)

    def _encode_flat(self, seq, x, y) -> None:
        """The whole tensors bound, a flat range of units: "group", one workgroup per
        output element; "vec4", one invocation per unit (4 outputs or one, see
        :func:`vec4_mode`).  Dispatches of at most maxComputeWorkGroupCount[0] workgroups
        (push ``origin[0].x``: the first unit, ``x_count``: the units)."""
        group = self.path == "group"
        local = self.group_local if group else self.local
        units = self.units(self.path)
        pipe = self.pipeline(self.kernel, {"LOCAL_SIZE_X": local, "LOCAL_SIZE_Y": 1,
                                           "XDIMS": 1, "GROUP": int(group),
                                           "VEC4": 0 if group else self.vec4, **self.consts})
        binds = [Bind(x, 0, self.in_bind, "r", self.in_fmt), Bind(y, 0, self.out_bytes, "w"),
                 Bind(self.params)]
        per = 1 if group else local
        step = int(self.ctx.limits["maxComputeWorkGroupCount"][0]) * per
        for first in range(0, units, step):
            n = min(step, units - first)
            push = pack(self.kernel, "push", origin=[first, 0, 0, 0], extent=[n, 0, 0, 0],
                        in_base=0, out_base=0, x_count=n, magic=[0] * 8)
            seq.dispatch(pipe, binds, (ceil_div(n, per), 1, 1), push)



def reduce_shape(desc) -> dict:
    """A reduce descriptor as the tuner's JSON shape."""
    src, dst = desc.input_tensor, desc.output_tensor
    return {"in": [list(src.sizes), list(src.element_strides)],
            "out": [list(dst.sizes), list(dst.element_strides)],
            "axes": sorted(as_ints(desc.axes, "axes")), "function": int(desc.reduce_function)}


def _path_class(shape) -> str:
    """Shapes sharing a path choice: elements reduced per output and outputs (powers of 4),
    and whether the innermost reduced axis is the packed last one."""
    (sizes, strides), axes = shape["in"], shape["axes"]
    count = math.prod(sizes[a] for a in axes)
    outs = math.prod(sizes) // max(1, count)
    inner = axes[-1] == len(sizes) - 1 and strides[-1] == 1
    return (f"count 4^{count.bit_length() // 2} out 4^{outs.bit_length() // 2} "
            f"inner {int(inner)}")


def _path_run(device, seq, cand, shape):
    """Record a float32 reduction of ``shape`` on candidate ``cand``'s path."""
    (isz, ist), (osz, ost) = shape["in"], shape["out"]
    fn = ReduceFunction(shape["function"])
    out_type = DataType.UINT32 if fn in ARG_FUNCTIONS else DataType.FLOAT32
    desc = ReduceOperatorDesc(fn, TensorDesc(DataType.FLOAT32, tuple(isz), tuple(ist)),
                              TensorDesc(out_type, tuple(osz), tuple(ost)), tuple(shape["axes"]))
    op = CompiledReduce(device, desc, path=cand.params["path"])
    if op.taken != cand.params["path"] and cand.name != "auto":   # another's work
        op.release()
        raise tuning.Declined(cand.name)
    return record_on_scratch(device, seq, op, desc.input_tensor, desc.output_tensor)


#: Reduce's path: "auto" (the rule above, the ``VKML_TUNE=off`` default), "lane",
#: "group", "vec4" or its wider kept forms "vec4x2" / "vec4x4", chosen by measurement.
REDUCE_PATH = tuning.register_path(
    "reduce_path", [("auto", {"path": "auto"}), ("lane", {"path": "lane"}),
                    ("group", {"path": "group"}), ("vec4", {"path": "vec4"}),
                    *((f"vec4x{n}", {"path": f"vec4x{n}"}) for n in KEPT_CHOICES[1:])],
    "auto",
    _path_class, _path_run, work_fn=tuning.io_elements,
    examples=[{"in": [[32, 64, 56, 56], [200704, 3136, 56, 1]],
               "out": [[32, 64, 1, 1], [64, 1, 1, 1]], "axes": [2, 3], "function": 2},
              {"in": [[1024, 4096], [4096, 1]], "out": [[1024, 1], [1, 1]], "axes": [1],
               "function": 10}])


def reduce(x, function, axes=None, *, output_type=None, device=None):
    """``DML_REDUCE_OPERATOR_DESC``: ``function`` (a DML_REDUCE_FUNCTION name such as
    "sum", "average", "argmax", any case, or its value) over ``axes`` of ``x`` (1 to 8
    dimensions; an int or a sequence, negative counting from the end; None: every axis).
    The rank is kept: reduced axes have size 1.

    ARGMIN/ARGMAX return the position among the reduced elements numbered row-major over
    the reduced axes in increasing order, the first extreme on a tie, as ``output_type``
    ("uint32" by default, the page's type at every feature level; "int32", "int64",
    "uint64").  Other functions return ``x``'s type; float16 is reduced in float32."""
    dev = pick_device(device, x)
    x = as_array(x, "x")
    rank = len(x.shape)
    if not 1 <= rank <= 8:
        raise ValidationError("x", f"must have 1 to 8 dimensions, got shape {tuple(x.shape)}")
    probe = ReduceOperatorDesc(function, None, None)
    fn = probe.reduce_function
    if axes is None:
        axes = tuple(range(rank))
    elif isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
        axes = (int(axes),)
    axes = tuple(a + rank if -rank <= a < 0 else a for a in as_ints(axes, "axes"))
    in_desc = TensorDesc(x.dtype, tuple(x.shape))
    out_type = (DataType.of(output_type or "uint32", "output_type") if fn in ARG_FUNCTIONS
                else in_desc.data_type)
    sizes = (reduce_output_sizes(x.shape, axes) if all(0 <= a < rank for a in axes)
             else tuple(x.shape))       # the descriptor names the bad axis
    desc = ReduceOperatorDesc(fn, in_desc, TensorDesc(out_type, sizes), axes)
    return run(dev, desc, [x])

"""Max and average pooling: ``DML_MAX_POOLING(1,2)_OPERATOR_DESC``,
``DML_AVERAGE_POOLING(1)_OPERATOR_DESC``, ``vkml.max_pooling`` and ``vkml.average_pooling``.

Kernels: ``glsl/pooling_rows.comp`` ("rows", the rule where no indices are asked for and
a window row's inputs fit registers): an invocation computes V (8, 4 or 1) neighbouring
outputs of the last dimension, reading each window row's T = S*(V-1) + L*(W-1) + 1
inputs once and reusing them across the V outputs, the window geometry specialization
constants (its loops unroll).  ``glsl/pooling_block.comp`` ("block", float32, the rule in
place of "rows" where it has a variant for the last dimension's geometry and the rows
start on a texel boundary): the same 8 outputs from row segments read as RGBA32F texels,
folded into columns over the window rows (a quarter of the texel fetches; its geometry,
row shift and max / average compile-time, as LP pooling's "block" kernel).
``glsl/pooling_slide.comp`` ("slide", the rule in place of both for 2-D square windows of
unit dilation it has a variant for): "block"'s reads, an invocation sliding down
:attr:`rows` output rows, each input row fetched once and folded along the row, the
window rows an output row shares with the next kept in registers, x over (plane, row
segment) flattened where it fits (a workgroup's lanes span planes: none idles at the end
of a row whose segments do not fill a SIMD vector); its ``_u64`` variants store the 8
outputs as one u64vec4 where the device's store width says so.
``glsl/pooling.comp`` ("general": the indices output and
longer window rows): one invocation per output element over its (dilated) window, the
geometry parameters (one pipeline per type, rank and mode).  Both have one variant per
element type (glsl/include/vkml_elem.glsl: floats in float32, integers through 32-bit
words, so every type runs on every device), the mode, padding rule and indices
specialization constants; float32 is read through an R32F texel buffer where the whole
input fits one (:func:`.reduce.texel_read`).  The grid and windows past
``maxStorageBufferRange`` come from :class:`.grid.BoxKernel`.
A window covering the whole unpadded input (global pooling) without indices runs as
the reduction (:class:`.reduce.CompiledReduce`, AVERAGE or MAX over the spatial axes).
"""
from __future__ import annotations

import math

import numpy as np

from ..dml.data_type import DataType
from ..dml.operator import as_tuple
from ..dml.pooling import (AveragePooling1OperatorDesc, AveragePoolingOperatorDesc,
                           MaxPooling1OperatorDesc, MaxPooling2OperatorDesc,
                           MaxPoolingOperatorDesc, pooling_output_sizes)
from ..dml.reduce import ReduceFunction, ReduceOperatorDesc
from ..dml.tensor_desc import TensorDesc
from ..errors import UnsupportedError, ValidationError
from ..runtime import FORMAT_RGBA32_SFLOAT, UNIFORM_TEXEL, Bind
from ..runtime.blocks import pack
from .base import check_choice, implements
from .fold import geometry_names, safe_geometry, spec_geometry, window_in_span
from .functional import as_array, pick_device, run
from .grid import (BOX_CONSTANTS, GRID_LIMIT, PathBoxKernel, box_grid, decline_unless,
                   record_on_scratch, texel_block_plan, words8, x_invocations)
from .. import tuning
from ..intmath import ceil_div
from .reduce import CompiledReduce, element_variant, texel_read
from .store_width import wide_stores

__all__ = ["max_pooling", "average_pooling"]

#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = dict.fromkeys(
    ["pooling_" + s for s in ("f32", "f32_texel", "f16", "f16_packed", "i8", "u8", "i16",
                              "u16", "i32", "u32", "i64", "u64")],
    BOX_CONSTANTS + ("MODE", "INCLUDE_PADDING", "INDICES"))
#: The constructor's ``path=`` values (:class:`CompiledPooling`; None: the operator's own).
PATHS = ("auto", "window", "slide", "block", "rows", "general")
#: Spatial dimensions glsl/pooling_rows.comp declares window constants for.
KERNEL_SPATIAL = 3
VARIANTS.update(dict.fromkeys(
    ["pooling_rows_" + s for s in ("f32", "f32_texel", "f16", "f16_packed", "i8", "u8", "i16",
                                   "u16", "i32", "u32", "i64", "u64")],
    BOX_CONSTANTS + ("V", "VEC_STORE", "MODE", "INCLUDE_PADDING", "UNROLL_ROWS")
    + geometry_names(KERNEL_SPATIAL)))
#: glsl/pooling_block.comp ("block": float32, 8 outputs an invocation from row segments
#: read once as RGBA32F texels): the last-dimension geometries (window, stride, dilation)
#: it has variants for, each with the 4 row shifts and max / average compile-time
#: (SwiftShader unrolls only compile-time loops): ResNet's 3x3 s2, 3x3 s1, U-Net's 2x2 s2
#: and YOLOv8's SPPF 5x5 s1.
BLOCK_GEOMETRIES = ((2, 2, 1), (3, 1, 1), (3, 2, 1), (5, 1, 1))
for (_w, _s, _d), _h, _m in ((g, h, m) for g in BLOCK_GEOMETRIES for h in range(4)
                             for m in ("max", "avg")):
    VARIANTS[f"pooling_block_{_m}_w{_w}s{_s}d{_d}h{_h}"] = (
        BOX_CONSTANTS + geometry_names(KERNEL_SPATIAL) + ("POOL_VSTORE",))
#: glsl/pooling_slide.comp ("slide": "block"'s reads, an invocation sliding down several
#: output rows, each input row fetched once): the square 2-D windows (size, stride; unit
#: dilation) it has variants for, each with the 4 row shifts and max / average.
SLIDE_GEOMETRIES = ((2, 2), (3, 1), (3, 2), (5, 1))
for (_w, _s), _h, _m in ((g, h, m) for g in SLIDE_GEOMETRIES for h in range(4)
                         for m in ("max", "avg")):
    for _u in ("", "_u64"):
        VARIANTS[f"pooling_slide_{_m}_w{_w}s{_s}h{_h}{_u}"] = BOX_CONSTANTS + (
            "POOL_VSTORE", "POOL_FLAT")
#: "slide": the invocations a dispatch keeps at least where the output has them; each
#: slides down as many output rows as that leaves (the whole column where the planes and
#: row segments alone make them: the fewer invocations, the fewer input rows fetched
#: twice and the less per-invocation work, which both CPU drivers pay dearly for).
SLIDE_INVOCATIONS = 256
#: "slide": the most output rows one invocation slides down: its row loop and the scalar
#: stores of a short row (8 a row) stay far below lavapipe's 65535 loop iterations.
SLIDE_MAX_ROWS = 2048
#: "slide": the workgroup width where x runs over (plane, row segment) flattened
#: (glsl/pooling_slide.comp's POOL_FLAT): two of the CPU drivers' 8-lane SIMD vectors, half
#: the workgroups of one (lavapipe pays for each workgroup), at most the device's width.
SLIDE_FLAT_LOCAL = 16
#: "rows": the most inputs of a window row an invocation holds (glsl/pooling_rows.comp's
#: row array) and the most window rows whose loop it unrolls.
ROW_INPUTS = 32
UNROLL_ROWS = 8
#: Loop iterations one invocation may run: lavapipe ends its loops after 65535 iterations
#: in all (counted over every loop of the invocation), without an error.
MAX_WINDOW = 65535
_MAX = (MaxPoolingOperatorDesc, MaxPooling1OperatorDesc, MaxPooling2OperatorDesc)


def require_small_window(win, iterations: int) -> None:
    """Refuse, on every device alike, a window whose loops would run more than
    :data:`MAX_WINDOW` iterations in one invocation (``iterations``: the kernel's count
    for ``win``, the window positions that reach the input)."""
    if iterations > MAX_WINDOW:
        raise UnsupportedError(f"window loops of more than {MAX_WINDOW} iterations",
                               f"window_size {tuple(win)} (the positions that reach the "
                               f"input) needs {iterations}; lavapipe ends a longer loop "
                               "early, silently")


def four(values, fill: int = 1) -> list[int]:
    """Per spatial dimension values as a ``uvec4`` (``fill`` beyond them)."""
    return (list(values) + [fill] * 4)[:4]


def packed_strides(sizes) -> list[int]:
    """Row-major element strides of ``sizes`` (the numbering of the indices output)."""
    out, n = [], 1
    for s in reversed(sizes):
        out.append(n)
        n *= s
    return out[::-1]


@implements(*_MAX, AveragePoolingOperatorDesc, AveragePooling1OperatorDesc)
class CompiledPooling(PathBoxKernel):
    """Max or average pooling on this device: see the module doc.

    ``force_path`` (``path=``): None, global pooling runs as the reduction, other windows
    the tuner's choice on :data:`PATH` where "slide" or "block" may run, else the rule:
    "slide" where it may (:meth:`slide_ok`), else "block" where it may (:meth:`block_ok`),
    else "rows" where it may (no indices, a window row of at most :data:`ROW_INPUTS`
    inputs), else "general"; "auto": the rule; "window": the rule without the reduction
    (tests compare the two); "slide", "block": that kernel where it may,
    else "rows" or "general"; "rows": neither of them; "general": always
    glsl/pooling.comp.  ``force_read`` (``read=``): "ssbo" reads the input from a storage
    buffer even where "texel" (float32 through an R32F uniform texel buffer, the rule
    where the whole tensor fits maxTexelBufferElements) is possible.  ``store64``: True /
    False forces or refuses "slide"'s u64vec4 stores (None: the device's measured store
    width, :func:`~vkml.ops.store_width.wide_stores`; True without int64 shaders is an
    UnsupportedError).  Other values of ``path``,
    ``read`` or ``store64`` are a ValidationError naming the argument."""

    inner: CompiledReduce | None = None
    #: "slide": the 8 outputs stored as one u64vec4 (the ``_u64`` variants).
    store64: bool = False
    #: "slide": x over (plane, row segment) flattened (:meth:`flat_ok`).
    flat: bool = False

    def __init__(self, device, desc, path: str | None = None, read: str | None = None,
                 store64: bool | None = None):
        check_choice("path", path, PATHS)
        check_choice("read", read, ("auto", "texel", "ssbo"))
        check_choice("store64", store64, (True, False))
        self.force_store64 = store64
        super().__init__(device, desc, path, read)

    def build(self) -> None:
        d = self.desc
        src, dst = d.input_tensor, d.output_tensor
        self.mode = 0 if isinstance(d, _MAX) else 1
        idx = d.indices_tensor
        if self._is_global() and idx is None and self.force_path not in ("window", "general"):
            fn = ReduceFunction.MAX if self.mode == 0 else ReduceFunction.AVERAGE
            axes = tuple(range(2, src.dimension_count))
            self.path = "reduce"
            self.inner = CompiledReduce(self.device, ReduceOperatorDesc(fn, src, dst, axes))
            return
        self.in_esize = self.out_esize = src.data_type.size
        self.in_bytes = self.in_bind = src.total_tensor_size_in_bytes
        self.out_bytes = dst.total_tensor_size_in_bytes
        self.rank = dst.dimension_count
        self.box, self.box_out_strides = list(dst.sizes), list(dst.element_strides)
        self.in_sizes, self.in_strides = src.sizes, src.element_strides
        # equivalent windows whose positions fit 32-bit arithmetic; taps that only ever
        # meet padding are dropped (they never win a max and average as nothing)
        self.win, self.strides, self.dil, self.start = safe_geometry(
            d, src.sizes[2:], dst.sizes[2:], d.window_size, d.strides, d.dilation_values,
            d.start_padding, shrink_window=True)
        self.local = min(64, self.workgroup_size)
        self.path = self._choose_path(idx)
        self.kernel = element_variant(
            "pooling_rows" if self.path != "general" else "pooling", src.data_type,
            self.features)
        outer = math.prod(self.win[:-1])
        # "rows", "block": the window-row loop (its header runs once more, at the exit),
        # the row unrolled; "general": every window position
        require_small_window(self.win, outer + 1 if self.path != "general"
                             else math.prod(self.win))
        self._check_indices(idx, src)
        self.windows = self.plan_windows()
        if self.path in ("block", "slide"):
            self.apply_block_read()
        else:
            self.apply_read(texel_read(self, self.force_read))
        self.params = self.upload(self._params(idx))
        # what binding 3 holds without indices: a buffer of its own (the kernel declares
        # it writable; bound beside the parameters it would be a read-write hazard)
        self.no_indices = self.scratch(16) if idx is None and self.path == "general" else None
        self.consts = {"RANK": self.rank, "MODE": self.mode,
                       "INCLUDE_PADDING": int(bool(getattr(d, "include_padding", False)))}
        if self.path == "block":
            self.consts = {"RANK": self.rank,
                           **spec_geometry(self.win, self.strides, self.dil, KERNEL_SPATIAL)}
        elif self.path == "slide":
            self.consts = {"RANK": self.rank}
        elif self.path == "rows":
            self.vec = 8
            self.consts |= {"UNROLL_ROWS": int(outer <= UNROLL_ROWS),
                            **spec_geometry(self.win, self.strides, self.dil, KERNEL_SPATIAL)}
        else:
            self.consts["INDICES"] = 0 if idx is None else idx.data_type.size // 4

    def _choose_path(self, idx) -> str:
        """The kernel: "general" for indices, long window rows or where forced; else the
        forced one where it may run, else the tuner's choice on :data:`PATH` where
        "slide" or "block" may run, else the rule ("slide", "block", "rows": the first
        that may run, the ``VKML_TUNE=off`` default)."""
        if idx is not None or self.row_inputs(1) > ROW_INPUTS or self.force_path == "general":
            return "general"
        ok = {"slide": self.slide_ok(), "block": self.block_ok(), "rows": True}
        rule = "slide" if ok["slide"] else "block" if ok["block"] else "rows"
        if self.force_path is None and (ok["slide"] or ok["block"]):
            shape = path_shape(self.desc)
            choice = tuning.choose(self.device, PATH, shape)
            if choice.name != "auto" and ok[choice.name]:
                self.observe_choice(choice, shape)
                return choice.name
        return rule

    def block_ok(self) -> bool:
        """"block" (glsl/pooling_block.comp) where the rule or ``path="block"`` may take it:
        a last-dimension geometry in :data:`BLOCK_GEOMETRIES` and :meth:`texel_rows_ok`."""
        return (self.force_path in (None, "auto", "window", "block")
                and (self.win[-1], self.strides[-1], self.dil[-1]) in BLOCK_GEOMETRIES
                and self.texel_rows_ok())

    def slide_ok(self) -> bool:
        """"slide" (glsl/pooling_slide.comp) where the rule or ``path="slide"`` may take it:
        2-D, a square window of unit dilation whose (size, stride) is in
        :data:`SLIDE_GEOMETRIES` and :meth:`texel_rows_ok`."""
        return (self.force_path in (None, "auto", "window", "slide") and self.rank == 4
                and self.win[0] == self.win[1] and self.strides[0] == self.strides[1]
                and list(self.dil) == [1, 1]
                and (self.win[-1], self.strides[-1]) in SLIDE_GEOMETRIES
                and self.texel_rows_ok())

    def texel_rows_ok(self) -> bool:
        """What "block" and "slide" need: float32, no indices, unit last input stride and
        rows that start on a texel boundary (:func:`~vkml.ops.grid.texel_block_plan`);
        no read forced."""
        d = self.desc
        if not (self.force_read in (None, "auto")
                and d.input_tensor.data_type == DataType.FLOAT32 and d.indices_tensor is None
                and self.in_strides[-1] == 1):
            return False
        try:
            return texel_block_plan(self)[1] is not None
        except UnsupportedError:     # one output's rows exceed a texel binding: "rows" reads
            return False             # them from a storage buffer

    def apply_block_read(self) -> None:
        """"block": the input as RGBA32F texels (:func:`~vkml.ops.grid.texel_block_plan`), 8 outputs an
        invocation, the variant of max / average, the last dimension's geometry and the
        row shift."""
        self.read = "block"
        self.windows, shift = texel_block_plan(self)
        mode = "max" if self.mode == 0 else "avg"
        if self.path == "slide":
            self.kernel = f"pooling_slide_{mode}_w{self.win[-1]}s{self.strides[-1]}h{shift}"
            self.y_per_invocation = self.slide_rows(SLIDE_INVOCATIONS)
            # with int64 shaders whose measured store width (or ``store64``) says so
            if self.force_store64 and not self.features.get("int64"):
                raise UnsupportedError("int64 shaders", "pooling's store64=True (u64vec4 "
                                       "stores) needs them")
            wide = self.force_store64 if self.force_store64 is not None else wide_stores(
                self.device)
            self.store64 = bool(wide and self.features.get("int64"))
            self.kernel += "_u64" if self.store64 else ""
            self.flat = self.flat_ok()
        else:
            self.kernel = "pooling_block_{}_w{}s{}d{}h{}".format(
                mode, self.win[-1], self.strides[-1], self.dil[-1], shift)
        self.vec, self.x_last_only = 8, True
        self.in_kind, self.in_fmt = UNIFORM_TEXEL, FORMAT_RGBA32_SFLOAT
        self.in_bind = ceil_div(self.in_bytes, 16) * 16

    def slide_rows(self, invocations: int) -> int:
        """"slide": output rows an invocation slides down, in even blocks, for at least
        ``invocations`` invocations where the output has them."""
        h = self.box[2]
        across = self.box[0] * self.box[1] * x_invocations(self.box, 1, 8)
        blocks = min(h, max(ceil_div(invocations, across), ceil_div(h, SLIDE_MAX_ROWS)))
        return ceil_div(h, blocks)

    def flat_ok(self) -> bool:
        """"slide": x over (plane, row segment) flattened where the box's flattened x fits
        one dispatch's workgroups (a window or piece of the box is never larger) and its
        planes the kernel's plane division (:data:`~vkml.ops.grid.GRID_LIMIT`)."""
        planes = self.box[0] * self.box[1]
        lanes = planes * x_invocations(self.box, 1, 8)
        groups = self.ctx.limits["maxComputeWorkGroupCount"][0]
        return planes < GRID_LIMIT and ceil_div(lanes, self.flat_local()) <= groups

    def flat_local(self) -> int:
        """"slide" flattened: the workgroup width (:data:`SLIDE_FLAT_LOCAL`)."""
        return min(SLIDE_FLAT_LOCAL, self.local)

    def grid(self, extent, lx: int, xdims: int, v: int, ry: int) -> tuple[int, int, int]:
        """"slide" flattened: x over (plane, row segment), z 1."""
        gx, gy, gz = box_grid(extent, lx, xdims, v, ry)
        if not self.flat:
            return gx, gy, gz
        return ceil_div(x_invocations(extent, 1, v) * gz, lx), gy, 1

    def vector_store(self, origin, out_base, v) -> bool:
        """"slide"'s ``_u64`` variants: a u64vec4 store needs each invocation's 8 outputs
        32-byte aligned (else they store one at a time); the others: vec4s, 16-byte."""
        if not self.store64:
            return super().vector_store(origin, out_base, v)
        st = self.box_out_strides
        return (v == 8 and st[-1] == 1 and all(s % 8 == 0 for s in st[:-1])
                and origin[-1] % 8 == 0 and out_base % 8 == 0)

    def fit_local(self, lx: int, ly: int, v: int) -> tuple[int, int]:
        """"block": no wider along x than a row's invocations (a 56-wide row takes 7: a
        7 x 8 workgroup, where 8 x 8 left every eighth lane idle)."""
        if self.flat:
            return self.flat_local(), ly
        if self.path in ("block", "slide"):
            return min(lx, x_invocations(self.box, 1, v)), ly
        return super().fit_local(lx, ly, v)

    def _check_indices(self, idx, src) -> None:
        """Refuse indices the kernel cannot number or bind."""
        if idx is not None and math.prod(src.sizes) >= 1 << 32:
            raise UnsupportedError("indices", "vkml numbers the input's elements in 32 bits")
        if idx is not None and idx.total_tensor_size_in_bytes > self.ctx.limits[
                "maxStorageBufferRange"]:
            raise UnsupportedError("maxStorageBufferRange", "the indices tensor is bound "
                                   "whole and exceeds the device's binding range")

    def row_inputs(self, v: int) -> int:
        """T: inputs of one window row along the last dimension for v outputs."""
        return self.strides[-1] * (v - 1) + self.dil[-1] * (self.win[-1] - 1) + 1

    def vector_width(self, origin, extent, out_base) -> int:
        """"rows": 8 or 4 outputs an invocation where the box's last extent has them and
        their window row fits :data:`ROW_INPUTS`, else 1; "general": 1."""
        if self.path in ("block", "slide"):
            return 8         # a row's short last invocation is masked
        if self.path != "rows":
            return 1
        return next((v for v in (8, 4) if extent[-1] >= v
                     and self.row_inputs(v) <= ROW_INPUTS), 1)

    def _is_global(self) -> bool:
        """The window covers the whole unpadded input (one output per plane)."""
        d = self.desc
        n = d.input_tensor.dimension_count - 2
        return (tuple(d.window_size) == tuple(d.input_tensor.sizes[2:])
                and not any(d.start_padding) and not any(d.end_padding)
                and all(s == 1 for s in d.output_tensor.sizes[2:]) and len(d.window_size) == n)

    def _params(self, idx) -> np.ndarray:
        n = self.rank - 2
        divisor = float(math.prod(self.desc.window_size))
        common = dict(out_stride=words8(self.box_out_strides), in_stride=words8(self.in_strides),
                      in_size=four(self.in_sizes[2:], 0), start=four(self.start[:n], 0),
                      divisor=divisor)
        if self.path in ("block", "slide"):   # divisor 0: the count of the cells inside
            common["divisor"] = divisor if getattr(self.desc, "include_padding", False) else 0.0
        if self.path == "slide":
            common["rows"] = self.y_per_invocation
        if self.path in ("rows", "block", "slide"):
            return np.frombuffer(pack(self.kernel, "Params", **common), np.uint8)
        return np.frombuffer(pack(
            self.kernel, "Params", **common,
            in_packed=words8(packed_strides(self.in_sizes)),
            idx_stride=words8(idx.element_strides if idx is not None else ()),
            win=four(self.win), stride=four(self.strides), dil=four(self.dil),
            pad0=0, pad1=0, pad2=0), np.uint8)

    def in_span(self, origin, extent):
        return window_in_span(self, origin, extent)

    def encode(self, seq, inputs, outputs) -> None:
        if self.inner is not None:
            self.inner.encode(seq, inputs, outputs)
            return
        x, y = inputs[0].allocation, outputs[0].allocation
        f32 = self.desc.input_tensor.data_type == DataType.FLOAT32

        def pipeline_for(lx, ly, xdims, v, vec_store):
            extra = ({"V": v, "VEC_STORE": int(vec_store and f32)}
                     if self.path == "rows" else
                     {"POOL_VSTORE": int(vec_store)} if self.path == "block" else
                     {"POOL_VSTORE": int(vec_store), "POOL_FLAT": int(self.flat)}
                     if self.path == "slide"
                     else {})
            return self.pipeline(self.kernel, {"LOCAL_SIZE_X": lx, "LOCAL_SIZE_Y": ly,
                                               "XDIMS": xdims, **extra, **self.consts})
        fixed = [Bind(self.params)]
        if self.path == "general":
            has_idx = len(outputs) > 1 and outputs[1] is not None
            fixed.append(Bind(outputs[1].allocation if has_idx else self.no_indices,
                              access="w"))
        self.dispatch_windows(seq, x, y, self.windows, pipeline_for, fixed,
                              self.in_kind, self.in_fmt)

    def release(self) -> None:
        if self.inner is not None:
            self.inner.release()
        super().release()


def path_shape(desc) -> dict:
    """A float32 max or average pooling descriptor as the tuner's JSON shape."""
    src, dst = desc.input_tensor, desc.output_tensor
    n = len(src.sizes) - 2
    get = lambda k, dflt: list(getattr(desc, k, None) or (dflt,) * n)   # noqa: E731
    return {"mode": "max" if isinstance(desc, _MAX) else "avg",
            "in": [list(src.sizes), list(src.element_strides)],
            "out": [list(dst.sizes), list(dst.element_strides)],
            "strides": get("strides", 1), "window_size": list(desc.window_size),
            "start_padding": get("start_padding", 0), "end_padding": get("end_padding", 0),
            "dilations": get("dilation_values", 1),
            "include_padding": bool(getattr(desc, "include_padding", False))}


def _path_class(shape) -> str:
    """Shapes sharing a kernel choice: mode, window, strides, rank and input size (a
    factor of 4)."""
    sizes, strides = shape["in"]
    nbytes = 4 * (sum((n - 1) * s for n, s in zip(sizes, strides)) + 1)
    return (f"{shape['mode']} rank {len(sizes)} window {shape['window_size']} strides "
            f"{shape['strides']} in 4^{nbytes.bit_length() // 2}")


def _path_desc(shape):
    """The float32 pooling descriptor of a tuner's ``shape``."""
    (isz, ist), (osz, ost) = shape["in"], shape["out"]
    src = TensorDesc(DataType.FLOAT32, tuple(isz), tuple(ist))
    dst = TensorDesc(DataType.FLOAT32, tuple(osz), tuple(ost))
    geo = [tuple(shape[k]) for k in ("strides", "window_size", "start_padding",
                                     "end_padding")]
    if shape["mode"] == "max":
        return MaxPooling2OperatorDesc(src, dst, None, *geo, tuple(shape["dilations"]))
    return AveragePooling1OperatorDesc(src, dst, *geo, tuple(shape["dilations"]),
                                       shape["include_padding"])


def _path_run(device, seq, cand, shape):
    """Record float32 pooling of ``shape`` on candidate ``cand`` (its kernel forced)."""
    op = CompiledPooling(device, _path_desc(shape), path=cand.params["path"])
    decline_unless(op, "path", cand)
    return record_on_scratch(device, seq, op, op.desc.input_tensor, op.desc.output_tensor)


#: Pooling's kernel where "slide" or "block" may run (float32, no indices): "auto" (the
#: rule, the ``VKML_TUNE=off`` default: "slide" where it may, else "block"), or "slide",
#: "block", "rows" (glsl/pooling_rows.comp), chosen by the device's timing for the
#: shape's class.
PATH = tuning.register_path(
    "pooling_path", [(p, {"path": p}) for p in ("auto", "slide", "block", "rows")], "auto",
    _path_class, _path_run, work_fn=tuning.io_elements,
    examples=[{"mode": "max", "in": [[1, 64, 112, 112], [802816, 12544, 112, 1]],
               "out": [[1, 64, 56, 56], [200704, 3136, 56, 1]], "strides": [2, 2],
               "window_size": [3, 3], "start_padding": [1, 1], "end_padding": [1, 1],
               "dilations": [1, 1], "include_padding": False}])


def spatial_count(x) -> int:
    """The pooling functions' input: N, C and 2 or 3 spatial dimensions (their count)."""
    if len(x.shape) not in (4, 5):
        raise ValidationError("x", f"must have 4 or 5 dimensions (N, C, 2 or 3 spatial), got "
                              f"shape {tuple(x.shape)}")
    return len(x.shape) - 2


def window_args(n: int, window_size, strides, start_padding, end_padding, dilations):
    """The pooling functions' per-dimension arguments as tuples (one int for all; None: 1
    for strides and dilations, 0 for padding): (window, strides, start, end, dilations)
    and whether they are ``n`` long with positive strides (an output size exists)."""
    args = (as_tuple(window_size, 1, n, "window_size"), as_tuple(strides, 1, n, "strides"),
            as_tuple(start_padding, 0, n, "start_padding"),
            as_tuple(end_padding, 0, n, "end_padding"), as_tuple(dilations, 1, n, "dilations"))
    return args, all(len(a) == n for a in args) and all(s > 0 for s in args[1])


def window_output(sizes_fn, shape, args, ok: bool) -> tuple[int, ...]:
    """The output sizes ``sizes_fn`` (the page's formula) gives ``args`` (as
    :func:`window_args`): at least 1 each, for the descriptor to report a window too
    large; the input's sizes where the arguments are bad, for it to report the bad one."""
    if not ok:
        return tuple(shape)
    window, strides, start, end, dil = args
    return tuple(max(1, s) for s in sizes_fn(shape, strides, window, start, end, dil))


def _geometry(x, window_size, strides, start_padding, end_padding, dilations, ceil_mode):
    """Per-dimension arguments as tuples, with ``ceil_mode`` (ONNX, PyTorch) as extra end
    padding: the output size rounded up, the last window starting inside the input or
    the start padding."""
    n = spatial_count(x)
    (window, strides, start, end, dil), ok = window_args(
        n, window_size, strides, start_padding, end_padding, dilations)
    if ceil_mode and ok:
        end = list(end)
        for i in range(n):
            size = x.shape[2 + i]
            span = size + start[i] + end[i] - dil[i] * (window[i] - 1) - 1
            if span < 0:
                continue
            out = ceil_div(span, strides[i]) + 1
            if (out - 1) * strides[i] >= size + start[i]:
                out -= 1
            end[i] += max(0, (out - 1) * strides[i] - span)
        end = tuple(end)
    out = window_output(pooling_output_sizes, x.shape, (window, strides, start, end, dil), ok)
    return window, strides, start, end, dil, out


def max_pooling(x, window_size, *, strides=None, start_padding=None, end_padding=None,
                dilations=None, ceil_mode=False, return_indices=False, indices_type="uint32",
                device=None):
    """Max pooling, ``DML_MAX_POOLING2_OPERATOR_DESC``: the maximum over each (dilated)
    window of ``x`` (N, C, *spatial), 2 or 3 spatial dimensions, float32, float16 or any
    integer type; padding never wins.  Per-dimension arguments take one int per spatial
    dimension or one int for all (``None``: 1 for strides and dilations, 0 for padding).
    ``ceil_mode`` rounds the output size up (ONNX/PyTorch) by adding end padding.

    ``return_indices``: also the index of each maximum (``indices_type`` "uint32" or
    "uint64"), numbering the input as one packed 1-D array (``((n * C + c) * H + h) * W +
    w``: ONNX MaxPool's Indices; PyTorch's ``return_indices`` is that minus the plane's
    start ``(n * C + c) * H * W``); the first maximum wins a tie."""
    dev = pick_device(device, x)
    x = as_array(x, "x")
    window, strides, start, end, dil, out = _geometry(
        x, window_size, strides, start_padding, end_padding, dilations, ceil_mode)
    out_desc = TensorDesc(x.dtype, out)
    idx_desc = TensorDesc(DataType.of(indices_type, "indices_type"), out) \
        if return_indices else None
    desc = MaxPooling2OperatorDesc(TensorDesc(x.dtype, tuple(x.shape)), out_desc, idx_desc,
                                   strides, window, start, end, dil)
    return run(dev, desc, [x])


def average_pooling(x, window_size, *, strides=None, start_padding=None, end_padding=None,
                    dilations=None, include_padding=False, ceil_mode=False, device=None):
    """Average pooling, ``DML_AVERAGE_POOLING1_OPERATOR_DESC``: the mean over each
    (dilated) window of ``x`` (N, C, *spatial), float32 or float16 (summed in float32).
    ``include_padding``: the divisor is the whole window, else the cells inside the input
    (ONNX ``count_include_pad``).  Arguments as :func:`max_pooling`; with ``ceil_mode``
    the extra end padding counts in an ``include_padding`` divisor (DML expresses ceil
    mode as padding; PyTorch's divisor stops at the input plus its padding)."""
    dev = pick_device(device, x)
    x = as_array(x, "x")
    window, strides, start, end, dil, out = _geometry(
        x, window_size, strides, start_padding, end_padding, dilations, ceil_mode)
    desc = AveragePooling1OperatorDesc(
        TensorDesc(x.dtype, tuple(x.shape)), TensorDesc(x.dtype, out), strides, window,
        start, end, dil, include_padding)
    return run(dev, desc, [x])

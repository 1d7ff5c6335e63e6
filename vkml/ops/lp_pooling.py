"""LP pooling: ``DML_LP_POOLING_OPERATOR_DESC`` / ``DML_LP_POOLING1_OPERATOR_DESC`` and
``vkml.lp_pooling``.

Kernel: ``glsl/lp_pooling.comp``: one invocation computes V neighbouring outputs of the
last dimension, each a gather over its (dilated) window, in float32 for float32 and
float16 tensors (float16 stored as halves, or packed in 32-bit words on devices without
16-bit storage).  P = 1 and P = 2 are exact fast paths without ``pow``; P = 2 sums
again scaled by the window's largest magnitude where its sum of squares overflows or
underflows, and every other P is always scaled, so no result is inf or 0 where the true
one is finite and non-zero.  P is a specialization constant (the power unrolls).  Read paths (float32): texel rule or
"ssbo4" (vec4 storage reads), chosen by the tuner.
"""
from __future__ import annotations

import math

from ..dml.data_type import DataType
from ..dml.lp_pooling import LpPooling1OperatorDesc, LpPoolingOperatorDesc, lp_pooling_output_sizes
from ..dml.operator import as_uint
from ..dml.tensor_desc import TensorDesc
from ..runtime import Bind
from .. import tuning
from .base import implements
from .fold import geometry_names, safe_geometry, spec_geometry, window_in_span
from ..runtime import FORMAT_RGBA32_SFLOAT, UNIFORM_TEXEL
from .pooling import require_small_window, spatial_count, window_args, window_output
from .grid import (BOX_CONSTANTS, BoxKernel, register_read_path, texel_block_plan,
                   x_invocations)
from .functional import as_array, pick_device, run
from ..intmath import ceil_div

__all__ = ["lp_pooling"]

#: Spatial dimensions glsl/lp_pooling.comp declares window constants for.
KERNEL_SPATIAL = 3
#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = dict.fromkeys(
    ["lp_pooling_f32", "lp_pooling_f32_texel", "lp_pooling_f32_texel4", "lp_pooling_f16",
     "lp_pooling_f16_packed", "lp_pooling_f32_ssbo4"],
    BOX_CONSTANTS + ("V", "VEC_STORE", "P", "SCALE", "HOLD") + geometry_names(KERNEL_SPATIAL))
#: glsl/lp_pooling_roll.comp ("roll": rolled window loops, 4 outputs a vec4; "tile": the
#: same reading a shared-memory tile).
VARIANTS["lp_pooling_f32_roll"] = BOX_CONSTANTS + ("V", "VEC_STORE", "P") + geometry_names(
    KERNEL_SPATIAL)
VARIANTS["lp_pooling_f32_tile"] = VARIANTS["lp_pooling_f32_roll"] + ("TILE_SIZE",)
#: glsl/lp_pooling_block.comp ("block": 8 outputs an invocation from row segments read once
#: as RGBA32F texels): its last-dimension geometries (window, stride, dilation), a
#: variant each (compiled with them constant: SwiftShader unrolls nothing itself), and the
#: constants the host freezes (its ``vkml:frozen``); P = 1 and 2 have variants of their own
#: with P compile-time (suffix p1, p2: SwiftShader runs a frozen P's code slower), other P
#: the frozen one.
BLOCK_GEOMETRIES = ((2, 2, 1), (3, 1, 1), (3, 2, 1))
BLOCK_P = (1, 2)
BLOCK_CONSTANTS = ("LP_P", "LP_VSTORE")
for (_w, _s, _d), _h in ((g, h) for g in BLOCK_GEOMETRIES for h in range(4)):
    VARIANTS[f"lp_pooling_f32_block_w{_w}s{_s}d{_d}h{_h}"] = (
        BOX_CONSTANTS + geometry_names(KERNEL_SPATIAL) + BLOCK_CONSTANTS)
    for _p in BLOCK_P:
        VARIANTS[f"lp_pooling_f32_block_w{_w}s{_s}d{_d}h{_h}p{_p}"] = (
            BOX_CONSTANTS + geometry_names(KERNEL_SPATIAL) + BLOCK_CONSTANTS[1:])


@implements(LpPooling1OperatorDesc, LpPoolingOperatorDesc)
class CompiledLpPooling(BoxKernel):
    """LP pooling on this device: see the module doc.

    Read paths: "ssbo", "texel" (float32 through an R32 uniform texel buffer: lavapipe
    vectorizes texel reads), "texel4" (RGBA32 texels, 4 neighbours at once) or "ssbo4"
    (the same from a vec4 storage buffer), "roll" (float32: rolled window loops, 4 outputs
    a vec4, glsl/lp_pooling_roll.comp, for drivers that do not fold specialization
    constants), "tile" (float32: the same, each workgroup first copying its input tile
    with the halo into shared memory), "block" (glsl/lp_pooling_block.comp); the texel
    rule or the tuner's choice (:data:`READ_PATH`), or ``read=``
    (:class:`~.grid.BoxKernel`)."""

    #: Output elements along the last dimension per invocation (1, 4 or 8).
    vec: int = 8

    def _choose_read(self, src) -> str:
        texels = self.ctx.limits["maxTexelBufferElements"]
        f32 = self.kernel == "lp_pooling_f32"
        whole = f32 and self.windows is None
        ok = {"ssbo": True,
              "texel": whole and self.in_bytes // 4 <= texels,
              "texel4": (whole and ceil_div(self.in_bytes, 16) <= texels
                         and self.in_strides[-1] == 1),
              # texel4's reads from a vec4 storage buffer (any size, windows too)
              "ssbo4": (f32 and self.in_strides[-1] == 1
                        and self.ctx.binding_alignment() % 16 == 0),
              "roll": f32,
              # RGBA32F texels of unit last stride, bound per window of at most
              # maxTexelBufferElements texels; a bounded unrolled row segment
              "block": (f32 and self.in_strides[-1] == 1 and (
                  self.win[-1], self.strides[-1], self.dil[-1]) in BLOCK_GEOMETRIES
                  and texel_block_plan(self)[1] is not None),
              "tile": f32 and self.tile_floats(1, 1, 1) <= self.shared_floats}
        rule = "texel4" if ok["texel4"] else "texel" if ok["texel"] else "ssbo"
        return self.choose_read(ok, rule, f32, lambda: read_shape(self.desc))

    def _row_inputs(self, v: int) -> int:
        """T: inputs of one window row along the last dimension for v outputs."""
        return self.strides[-1] * (v - 1) + self.dil[-1] * (self.win[-1] - 1) + 1

    def build(self) -> None:
        d = self.desc
        src, dst = d.input_tensor, d.output_tensor
        self.float_box("lp_pooling")
        self.in_sizes = src.sizes
        self.in_strides = src.element_strides
        # equivalent windows whose positions fit 32-bit arithmetic (or a ValidationError);
        # taps that only ever meet padding are dropped (they add nothing)
        self.win, self.strides, self.dil, self.start = safe_geometry(
            d, src.sizes[2:], dst.sizes[2:], d.window_size, d.strides, d.dilation_values,
            d.start_padding, shrink_window=True)
        self.p = int(d.p)
        # scaled sums: every P > 2, and P = 2 on float32 (float16 squares cannot
        # overflow or underflow float32)
        self.scale = self.p > 2 or (self.p == 2 and src.data_type == DataType.FLOAT32)
        self.window_count = math.prod(self.win)
        # window rows one loop, their positions the inner one (whose header also runs at
        # its exit); scaled sums read the window twice
        require_small_window(self.win, 2 * math.prod(self.win[:-1]) * (self.win[-1] + 2))
        self.local = min(64, self.workgroup_size)
        self.windows = self.plan_windows()
        read = self._choose_read(src)
        if read == "block":
            self.apply_block_read()
        else:
            self.apply_read(read)
        if read in ("roll", "tile"):   # their own kernel: 4 outputs a vec4, x along the last dim
            self.kernel += "_" + read
            self.vec, self.x_last_only = 4, True
        self.vec_store_ok = src.data_type == DataType.FLOAT32
        pad = [0] * (4 - len(self.win))          # in_size and start: uvec4s of 2 or 3
        self.params = self.upload_block(
            self.kernel, "Params", out_stride=self.box_out_strides, in_stride=self.in_strides,
            in_size=[*self.in_sizes[2:], *pad], start=[*self.start, *pad],
            in_texels=self.in_bind // 16)
        self.consts = {"RANK": self.rank, "P": self.p,
                       **spec_geometry(self.win, self.strides, self.dil, KERNEL_SPATIAL)}

    def apply_block_read(self) -> None:
        """"block": the input as RGBA32F texels (:func:`~vkml.ops.grid.texel_block_plan`), 8 outputs an
        invocation, the variant of the last dimension's geometry and row shift."""
        self.read = "block"
        self.windows, shift = texel_block_plan(self)
        self.kernel += "_block_w{}s{}d{}h{}".format(self.win[-1], self.strides[-1],
                                                      self.dil[-1], shift)
        if self.p in BLOCK_P:
            self.kernel += f"p{self.p}"      # P compile-time
        self.vec, self.x_last_only = 8, True
        self.in_kind, self.in_fmt = UNIFORM_TEXEL, FORMAT_RGBA32_SFLOAT
        self.in_bind = ceil_div(self.in_bytes, 16) * 16

    def block_constants(self, vec_store: bool) -> dict:
        """The "block" kernel's frozen constants (its p1/p2 variants have P built in)."""
        return ({} if self.p in BLOCK_P else {"LP_P": self.p}) | {"LP_VSTORE": int(vec_store)}

    def fit_local(self, lx: int, ly: int, v: int) -> tuple[int, int]:
        """"block": no wider along x than a row's invocations (a 56-wide row takes 7: a
        7 x 8 workgroup, where 8 x 8 left every eighth lane idle)."""
        if self.read == "block":
            return min(lx, x_invocations(self.box, 1, v)), ly
        return super().fit_local(lx, ly, v)

    def vector_width(self, origin, extent, out_base) -> int:
        """"block": always 8 outputs an invocation (a short row's tail is masked)."""
        return 8 if self.read == "block" else super().vector_width(origin, extent, out_base)

    def tile_floats(self, lx: int, ly: int, v: int) -> int:
        """Floats of the "tile" kernel's shared tile for an lx x ly workgroup: the input
        window rows and columns its outputs (4 per invocation, v apart) read."""
        n = len(self.win)
        wa = self.win[0] if n == 3 else 1
        hb = (ly - 1) * self.strides[-2] + (self.win[-2] - 1) * self.dil[-2] + 1
        il = ((lx - 1) * v + 3) * self.strides[-1] + (self.win[-1] - 1) * self.dil[-1] + 1
        return wa * hb * il

    def hold(self, v: int) -> bool:
        """Keep the window's inputs in registers between the two sums of a scaled P: when
        a window row's inputs are read as one row (T <= 32) and all rows make <= 64."""
        t = self._row_inputs(v)
        return self.scale and t <= 32 and self.window_count // self.win[-1] * t <= 64

    def in_span(self, origin, extent):
        return window_in_span(self, origin, extent)

    def encode(self, seq, inputs, outputs) -> None:
        x, y = inputs[0].allocation, outputs[0].allocation

        def pipeline_for(local, ly, xdims, v, vec_store):
            if self.read == "block":
                consts = {k: c for k, c in self.consts.items() if k != "P"}
                return self.pipeline(self.kernel, {
                    "LOCAL_SIZE_X": local, "LOCAL_SIZE_Y": ly, "XDIMS": xdims,
                    **self.block_constants(vec_store and self.vec_store_ok), **consts})
            extra = ({} if self.read == "roll" else
                     {"TILE_SIZE": self.tile_floats(local, ly, v)} if self.read == "tile" else
                     {"SCALE": int(self.scale), "HOLD": int(self.hold(v))})
            return self.pipeline(self.kernel, {
                "LOCAL_SIZE_X": local, "LOCAL_SIZE_Y": ly, "XDIMS": xdims, "V": v,
                "VEC_STORE": int(vec_store and self.vec_store_ok), **extra, **self.consts})

        self.dispatch_windows(seq, x, y, self.windows, pipeline_for, [Bind(self.params)],
                              self.in_kind, self.in_fmt)


def read_shape(desc) -> dict:
    """An LP pooling descriptor (float32) as the tuner's JSON shape."""
    src, dst = desc.input_tensor, desc.output_tensor
    n = len(src.sizes) - 2
    get = lambda k, dflt: list(getattr(desc, k, None) or (dflt,) * n)   # noqa: E731
    return {"in": [list(src.sizes), list(src.element_strides)],
            "out": [list(dst.sizes), list(dst.element_strides)],
            "strides": get("strides", 1), "window_size": list(desc.window_size),
            "start_padding": get("start_padding", 0), "end_padding": get("end_padding", 0),
            "dilations": get("dilations", 1), "p": int(desc.p)}


def _read_class(shape) -> str:
    """Shapes sharing a read path choice: rank, P's kind and input size (a factor of 4)."""
    sizes, strides = shape["in"]
    nbytes = 4 * (sum((n - 1) * s for n, s in zip(sizes, strides)) + 1)
    p = shape["p"] if shape["p"] <= 2 else "n"
    return f"rank {len(sizes)} p {p} in 4^{nbytes.bit_length() // 2}"


def _read_desc(shape):
    """The float32 LP pooling descriptor of a tuner's ``shape``."""
    (isz, ist), (osz, ost) = shape["in"], shape["out"]
    return LpPooling1OperatorDesc(
        TensorDesc(DataType.FLOAT32, tuple(isz), tuple(ist)),
        TensorDesc(DataType.FLOAT32, tuple(osz), tuple(ost)),
        *(tuple(shape[k]) for k in ("strides", "window_size", "start_padding",
                                    "end_padding", "dilations")), shape["p"])


#: LP pooling's read path (float32): "auto" (the texel rule, the ``VKML_TUNE=off``
#: default) or one of the others, chosen by measurement.
READ_PATH = register_read_path(
    "lp_pooling_read", ("auto", "ssbo4", "roll", "tile", "block"), CompiledLpPooling,
    _read_desc, _read_class, work_fn=tuning.io_elements,
    examples=[{"in": [[1, 64, 112, 112], [802816, 12544, 112, 1]],
               "out": [[1, 64, 56, 56], [200704, 3136, 56, 1]], "strides": [2, 2],
               "window_size": [3, 3], "start_padding": [1, 1], "end_padding": [1, 1],
               "dilations": [1, 1], "p": 2}])


def lp_pooling(x, window_size, *, strides=None, start_padding=None, end_padding=None,
               dilations=None, p=2, device=None):
    """LP pooling, ``DML_LP_POOLING1_OPERATOR_DESC``: ``(sum |x|^p)^(1/p)`` over each
    (dilated) window of ``x`` (N, C, *spatial), 2 or 3 spatial dimensions, float32 or
    float16; zero padding contributes nothing.

    Output size per spatial dimension: ``(in + start + end - dilation * (window - 1) - 1)
    // stride + 1`` (the page's formula omits the dilation; with dilations vkml uses the
    dilated window's extent, as ONNX LpPool does).  Per-dimension arguments take one int
    per spatial dimension or one int for all; ``None`` is 1 for strides and dilations, 0
    for padding.  ``p`` is an integer >= 1.
    """
    dev = pick_device(device, x)
    x = as_array(x, "x")
    n = spatial_count(x)
    p = as_uint(p, "p", 1)
    args, ok = window_args(n, window_size, strides, start_padding, end_padding, dilations)
    window, strides, start, end, dil = args
    in_desc = TensorDesc(x.dtype, tuple(x.shape))
    out_desc = TensorDesc(x.dtype, window_output(lp_pooling_output_sizes, x.shape, args, ok))
    desc = LpPooling1OperatorDesc(in_desc, out_desc, strides, window, start, end, dil, p)
    return run(dev, desc, [x])

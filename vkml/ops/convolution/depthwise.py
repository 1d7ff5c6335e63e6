"""The depthwise path: group count = input channels, R rows x NB pixels per invocation,
the input read in place (``glsl/convolution_depthwise.comp``)."""
from __future__ import annotations

import math

import numpy as np

from ... import runtime
from ...dml.data_type import DataType
from ...errors import UnsupportedError
from ...runtime import Bind
from ..concurrent_width import concurrent_width
from ..grid import per_workgroup, pieces
from ..store_width import wide_stores
from ...runtime.blocks import pack
from .geometry import STORAGES, Path, knobs_of, storage_suffix, texel_ok, variant
from ...intmath import ceil_div

#: Kernel variants this module requests (see :func:`variant`) and the specialization
#: constants it sets.
_DEPTHWISE = ("LOCAL_SIZE_X", "NB", "SW", "KW", "DW", "ACT", "KH", "KD", "X4", "SHIFT", "R",
              "SH", "DH", "PW", "PC", "PLANE", "IH", "IW", "PADH", "PADW")
VARIANTS = {
    **{f"convolution_depthwise_{s}{r}": _DEPTHWISE for s in STORAGES for r in ("", "_ssbo")},
    "convolution_depthwise_f32_v4": _DEPTHWISE,
    "convolution_depthwise_f32_v8": _DEPTHWISE,
    **{f"convolution_depthwise_rows_{s}{r}": _DEPTHWISE for s in STORAGES
       for r in ("", "_ssbo")},
    "convolution_depthwise_rows_f32_v4": _DEPTHWISE,
    "convolution_depthwise_rows_f32_v8": _DEPTHWISE,
}

DW_UNROLL = 4096          # most products (or twice the loads) the depthwise kernel unrolls
DW_SPAN = 128             # most input elements of one unrolled row load
#: Channels a lane may take where only several packed planes are whole float4s (PC).
DW_CHANNELS = (2, 4)
#: Most input elements a lane of the whole-plane block (knob ``dw_whole``) holds.
DW_WHOLE = 1024


class DepthwisePath(Path):
    """Depthwise forward convolution (``glsl/convolution_depthwise.comp``): group count =
    input channels, any channel multiplier, stride, dilation and padding.  The input is
    read in place through its strides (padding is a mask, not a copy: the operation is
    memory-bound); each invocation computes R output rows x NB pixels of one channel,
    loading each input row of its band once."""

    name = "depthwise"

    @classmethod
    def accepts(cls, op, geo, knobs=None) -> bool:
        lim = op.ctx.limits
        knobs = knobs_of(knobs)
        return (geo.plain and not geo.backward and geo.cin_per_group == 1
                and geo.valid == geo.out_size
                and math.prod(geo.kernel) <= 64
                and max(op.desc.input_tensor.total_tensor_size_in_bytes,
                        op.desc.output_tensor.total_tensor_size_in_bytes)
                < lim["maxStorageBufferRange"]
                and (cls.rows_block(geo, knobs) if knobs.get("dw_rows")
                     else cls.blocks(geo, knobs)) is not None
                and (not knobs.get("dw_v8")
                     or (bool(knobs.get("dw_rows")) and cls.rows_v8_ok(op, geo, knobs)))
                and (not knobs["dw_whole"] or cls.whole(op, geo, knobs) > 0)
                and (not knobs.get("store64") or cls.stores_v8_ok(op, geo, knobs))
                # (without plane stores: only where they would apply, else the default's twin)
                and (knobs["dw_plane"] or cls.plane(op, geo, {**knobs, "dw_plane": True})))

    @classmethod
    def plane(cls, op, geo, knobs) -> int:
        """The channels a lane takes where the (not ``dw_rows``) block stores its band as
        float4s of the flattened rows (``PW``, knob ``dw_plane``), 0 where it does not:
        float32 through texel views, rows not a multiple of 4 (else they store four at a
        time themselves) within one strip, packed one after the other.  1 where the band
        (R rows) and the plane are whole float4s; else PC (:data:`DW_CHANNELS`) where
        the band is the whole plane and PC packed planes are whole float4s (7x7 maps:
        four channels a lane), one output depth, the channel count a multiple of PC and
        PC blocks within twice DW_UNROLL (a lane's planes are one unrolled body)."""
        if not knobs["dw_plane"] or knobs.get("dw_rows") or geo.dtype != DataType.FLOAT32:
            return 0
        blk = cls.blocks(geo, knobs)
        od, oh, ow = geo.out_size
        if blk is None or blk[0] < ow or ow % 4 == 0:
            return 0
        d = op.desc
        esize = geo.dtype.size
        x_el = d.input_tensor.total_tensor_size_in_bytes // esize
        w_el = d.filter_tensor.total_tensor_size_in_bytes // esize
        y_el = d.output_tensor.total_tensor_size_in_bytes // esize
        ys = geo.y_strides
        if not (texel_ok(op, x_el) and texel_ok(op, w_el) and ys[4] == 1 and ys[3] == ow
                and y_el % 4 == 0 and ys[0] % 4 == 0):
            return 0
        if (oh * ow) % 4 == 0 and (blk[1] * ow) % 4 == 0 and ys[1] % 4 == 0 and ys[2] % 4 == 0:
            return 1
        if blk[1] != oh or od != 1 or ys[1] != oh * ow:
            return 0
        return next((pc for pc in DW_CHANNELS if (pc * oh * ow) % 4 == 0
                     and geo.c_out % pc == 0
                     and pc * cls.unrolled(geo, *blk) <= 2 * DW_UNROLL), 0)

    @classmethod
    def whole(cls, op, geo, knobs) -> int:
        """The channels a lane takes whole (knob ``dw_whole``, the kernel's PLANE), 0
        where it does not apply: float32 through texel views, 2-D, channel multiplier 1,
        the input's planes packed one after the other (image offsets multiples of 4) and
        the output's likewise; PC the fewest channels (1, then :data:`DW_CHANNELS`) whose
        input and output planes are whole float4s, dividing the channel count, within
        :data:`DW_UNROLL` products and :data:`DW_WHOLE` input elements."""
        if not knobs["dw_whole"] or knobs.get("dw_rows") or geo.dtype != DataType.FLOAT32:
            return 0
        (idp, ih, iw), (od, oh, ow) = geo.in_size, geo.out_size
        d = op.desc
        xs, ys = geo.x_strides, geo.y_strides
        x_el = d.input_tensor.total_tensor_size_in_bytes // 4
        if not (geo.kernel[0] == 1 and idp == 1 and od == 1 and geo.cout_per_group == 1
                and xs[4] == 1 and xs[3] == iw and xs[1] == ih * iw and xs[0] % 4 == 0
                and x_el % 4 == 0 and texel_ok(op, x_el // 4)
                and texel_ok(op, d.filter_tensor.total_tensor_size_in_bytes // 4)
                and ys[4] == 1 and ys[3] == ow and ys[1] == oh * ow and ys[0] % 4 == 0
                and (d.output_tensor.total_tensor_size_in_bytes // 4) % 4 == 0):
            return 0
        taps = geo.kernel[1] * geo.kernel[2]
        return next((pc for pc in (1,) + DW_CHANNELS
                     if (pc * ih * iw) % 4 == 0 and (pc * oh * ow) % 4 == 0
                     and geo.c_out % pc == 0 and pc * oh * ow * taps <= DW_UNROLL
                     and pc * ih * iw <= DW_WHOLE), 0)

    @staticmethod
    def v8_ok(op, geo, unit: int = 8) -> bool:
        """The ``dw_v8`` stores (eight float32 outputs as one u64vec4 store, int64
        shaders): float32 through texel views, output rows and strides multiples of
        ``unit`` (8; 4 for :meth:`rows_v8_ok`'s strips of 8k + 4)."""
        d = op.desc
        y_el = d.output_tensor.total_tensor_size_in_bytes // geo.dtype.size
        x_el = d.input_tensor.total_tensor_size_in_bytes // geo.dtype.size
        w_el = d.filter_tensor.total_tensor_size_in_bytes // geo.dtype.size
        return (bool(op.features.get("int64")) and geo.dtype == DataType.FLOAT32
                and texel_ok(op, x_el) and texel_ok(op, w_el)
                and geo.y_strides[4] == 1 and geo.out_size[2] % unit == 0
                and y_el % unit == 0 and all(s_ % unit == 0 for s_ in geo.y_strides[:4]))

    @classmethod
    def rows_v8_ok(cls, op, geo, knobs) -> bool:
        """The ``dw_rows`` kernel's u64vec4 stores (knob ``dw_v8``): :meth:`v8_ok`, or, for
        strips of NB = 8k + 4, the same with output rows and strides multiples of 4 only
        (a strip starting 4 past 8, a 28-wide map's odd rows, stores its u64vec2 first:
        the kernel reads the parity off the offset)."""
        blk = cls.rows_block(geo, knobs)
        return blk is not None and (cls.v8_ok(op, geo)
                                    or (blk[0] % 8 == 4 and cls.v8_ok(op, geo, 4)))

    @staticmethod
    def rows_block(geo, knobs):
        """(NB, R) of the ``dw_rows`` kernel (knob (most NB, band rows)), or None where
        the geometry does not suit it: NB a multiple of 4 wasting the fewest columns
        (the widest of those), R output rows walked in a rolled loop."""
        kd, kh, kw = geo.kernel
        if kd != 1 or geo.stride[1] != 1 or geo.dilation[1] != 1:
            return None
        most, band = knobs["dw_rows"]
        ow, oh = geo.out_size[2], geo.out_size[1]
        sw, dw = geo.stride[2], geo.dilation[2]
        best = None
        for nb in range(4, max(4, min(most, ceil_div(ow, 4) * 4)) + 1, 4):
            span = (nb - 1) * sw + (kw - 1) * dw + 1 + 3
            if span > DW_SPAN or kh * kw * nb > DW_UNROLL or 2 * kh * span > DW_UNROLL:
                break
            key = (ceil_div(ow, nb) * nb, -nb)
            if best is None or key < best[0]:
                best = (key, nb)
        return None if best is None else (best[1], max(1, min(band, oh)))

    @classmethod
    def blocks(cls, geo, knobs):
        """(NB, R) for the geometry, or None where even a 1 x 1 block would unroll more
        than DW_UNROLL loads or products.  The kernel unrolls KD x NI input rows of E
        elements (NI = (R-1)*SH + (KH-1)*DH + 1, E = (NB-1)*SW + (KW-1)*DW + 1, plus 3
        for float4 rows) and KD*KH*KW*R*NB products: strides and dilations enter the
        unrolled size, so they are bounded here, not by the kernel."""
        ow, oh = geo.out_size[2], geo.out_size[1]
        # the default block measured best on lavapipe; the tuner also offers
        # 4 x 1 (candidate depthwise-4x1)
        nb, r = knobs["dw_block"]
        nb = max(1, min(nb, ceil_div(ow, 4) * 4))
        r = max(1, min(r, oh))
        while cls.unrolled(geo, nb, r) > DW_UNROLL and (r > 1 or nb > 1):
            if r > 1:
                r = (r + 1) // 2
            else:
                nb = nb // 2 if nb > 4 else 1
        return (nb, r) if cls.unrolled(geo, nb, r) <= DW_UNROLL else None

    @staticmethod
    def unrolled(geo, nb, r) -> int:
        """Loads (twice) or products in the unrolled body of one channel's NB x R block
        (more than DW_UNROLL where a row span exceeds DW_SPAN: LLVM's compile time grows
        faster than the loads)."""
        kd, kh, kw = geo.kernel
        sh, sw, dh, dw = geo.stride[1], geo.stride[2], geo.dilation[1], geo.dilation[2]
        rows = (r - 1) * sh + (kh - 1) * dh + 1
        span = (nb - 1) * sw + (kw - 1) * dw + 1 + 3
        if span > DW_SPAN:
            return DW_UNROLL + 1
        return max(2 * kd * rows * span, kd * kh * kw * r * nb)

    def __init__(self, op, geo, knobs=None):
        super().__init__(op, geo, knobs)
        g = geo
        d = op.desc
        ow = g.out_size[2]
        kd, kh, kw = g.kernel
        rows = bool(self.knobs.get("dw_rows"))
        whole = self.whole(op, geo, self.knobs)
        nb, r = (self.rows_block(geo, self.knobs) if rows else
                 (ow, g.out_size[1]) if whole else self.blocks(geo, self.knobs))
        self.nb, self.R = nb, r
        self.strips = ceil_div(ow, nb)
        esize = g.dtype.size
        x_el = d.input_tensor.total_tensor_size_in_bytes // esize
        w_el = d.filter_tensor.total_tensor_size_in_bytes // esize
        f32 = g.dtype == DataType.FLOAT32
        # (whole planes bind the input as RGBA32F texels: a quarter of the elements)
        self.texel = (texel_ok(op, x_el) or bool(whole)) and texel_ok(op, w_el)
        self.fmt = (runtime.FORMAT_R32_SFLOAT if f32 else
                    runtime.FORMAT_R16_SFLOAT) if self.texel else 0
        # float4 input rows / float4 output stores (see the kernel)
        self.x4 = (self.texel and f32 and not whole and g.x_strides[4] == 1
                   and x_el % 4 == 0 and all(s_ % 4 == 0 for s_ in g.x_strides[:4])
                   and (nb * g.stride[2]) % 4 == 0)
        y_el = d.output_tensor.total_tensor_size_in_bytes // esize
        self.v4 = (f32 and g.y_strides[4] == 1 and ow % 4 == 0 and nb % 4 == 0
                   and all(s_ % 4 == 0 for s_ in g.y_strides[:4]) and y_el % 4 == 0)
        self.pc = whole or self.plane(op, g, self.knobs)
        self.pw = ow if self.pc else 0
        self.whole_planes = bool(whole)
        self.pc = max(self.pc, 1)
        self.v4 = self.v4 or bool(self.pw)
        self.v8 = bool(self.knobs.get("dw_v8"))      # (accepts checked v8_ok)
        self.stores_v8 = self._stores_v8(op, g)
        name = ("convolution_depthwise_rows_f32_v8" if self.v8 else
                "convolution_depthwise_f32_v8" if self.stores_v8 else
                variant("depthwise_rows" if rows else "depthwise", storage_suffix(op, g.dtype),
                        self.texel, self.v4))
        if self.v4 and not self.texel:
            self.v4 = False
        self.local = self._local(op, g)
        self.kernel = name
        self.pipe = op.pipeline(name, {
            "LOCAL_SIZE_X": self.local, "NB": nb, "SW": g.stride[2], "KW": kw,
            "DW": g.dilation[2], "ACT": self.act_id, "KH": kh, "KD": kd, "X4": int(self.x4),
            "SHIFT": (-g.start[2]) % 4, "R": r, "SH": g.stride[1], "DH": g.dilation[1],
            "PW": self.pw, "PC": self.pc, "PLANE": int(self.whole_planes),
            **({"IH": g.in_size[1], "IW": g.in_size[2], "PADH": g.start[1],
                "PADW": g.start[2]} if self.whole_planes else {})})
        self.params = op.upload(np.frombuffer(pack(
            name, "Params", in_size=(*g.in_size, g.cout_per_group),
            out_size=(*g.out_size, self.strips), flags=(kd, kh, 0, int(g.b_stride is not None)),
            stride=(g.stride[0], g.stride[1], 0, g.b_stride or 0),
            dil=(g.dilation[0], g.dilation[1], 0, 0), pad=(*g.start, 0), xs=g.x_strides[:4],
            ws=(g.w_strides[0], g.w_strides[2], g.w_strides[3], g.w_strides[4]),
            ys=g.y_strides[:4], last=(g.x_strides[4], g.y_strides[4], int(g.flip), g.c_out),
            act=self.act_params), np.uint8))

    @classmethod
    def stores_v8_ok(cls, op, geo, knobs) -> bool:
        """Whether the (not ``dw_rows``) block's stores can go eight floats a u64vec4 (the
        kernel's V8 without ROWS), int64 shaders given: the plane stores (:meth:`plane`,
        :meth:`whole`: float32 through texel views) where the lane's bands end where the
        output's rows do (whole planes, or bands dividing the height: a u64vec4 may not
        reach past them, as a float4 store's row check allows); else the rows, where
        :meth:`v8_ok` (float32 texel views, output rows and strides multiples of 8) and
        the block's NB a multiple of 8."""
        knobs = knobs_of(knobs)
        if knobs.get("dw_rows") or not op.features.get("int64"):
            return False
        if cls.whole(op, geo, knobs):
            return True
        blk = cls.blocks(geo, knobs)
        if cls.plane(op, geo, knobs):
            return geo.out_size[1] % blk[1] == 0
        return blk is not None and blk[0] % 8 == 0 and cls.v8_ok(op, geo)

    def _stores_v8(self, op, g) -> bool:
        """Whether the stores go as u64vec4s (:meth:`stores_v8_ok`; knob ``store64``,
        None: the device's measured store width, store_width.py)."""
        if not self.stores_v8_ok(op, g, self.knobs):
            return False
        wide = self.knobs.get("store64")
        return bool(wide_stores(op.device) if wide is None else wide)

    def _local(self, op, g) -> int:
        """Lanes a workgroup: whole subgroups (lavapipe's SIMD width where the device
        reports none), as many as :func:`~vkml.ops.grid.per_workgroup` gives for the
        grid's (channel, strip) lanes over the device's concurrent width (a 28x28 map of
        192 channels: 3 workgroups of 64 lanes on two threads take two turns of 64
        lanes, 6 of 32 three of 32)."""
        most = min(64, op.workgroup_size)
        unit = min(most, max(op.ctx.limits.get("subgroupSize") or 8, 1))
        lanes = ceil_div(g.c_out, self.pc) * self.strips
        others = ceil_div(g.out_size[1], self.R) * g.n * g.out_size[0]
        return unit * per_workgroup(ceil_div(lanes, unit), most // unit, others,
                                    concurrent_width(op.device))

    def encode(self, seq, x, w, b, y) -> None:
        g, op, d = self.geo, self.op, self.op.desc
        xb = Bind(x, 0, d.input_tensor.total_tensor_size_in_bytes, "r",
                  runtime.FORMAT_RGBA32_SFLOAT if self.x4 or self.whole_planes else self.fmt)
        wb = Bind(w, 0, d.filter_tensor.total_tensor_size_in_bytes, "r", self.fmt)
        bb = Bind(b, 0, op.whole(b, "bias")) if b is not None else Bind(self.params)
        yb = Bind(y, 0, d.output_tensor.total_tensor_size_in_bytes, "w")
        binds = [xb, wb, bb, yb, Bind(self.params)]
        mx, my, mz = self.ctx.limits["maxComputeWorkGroupCount"]
        # x: (channel, strip) lanes, y: bands, z: image x output depth
        # channels per dispatch (a multiple of PC: a lane's channels are one dispatch's)
        per_x = max(self.pc, mx * self.local // self.strips // self.pc * self.pc)
        od = g.out_size[0]
        per_z = max(1, mz // od)                                # images per dispatch
        gy = ceil_div(g.out_size[1], self.R)
        if gy > my:
            raise UnsupportedError("maxComputeWorkGroupCount", "too many output rows")
        for c0, cn in pieces(g.c_out, per_x):
            for n0, nn in pieces(g.n, per_z):
                lanes = ceil_div(cn, self.pc) * self.strips
                seq.dispatch(self.pipe, binds, (ceil_div(lanes, self.local), gy,
                                                nn * od), pack(self.kernel, "push", n0=n0, c0=c0))

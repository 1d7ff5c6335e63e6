"""The shared-memory tiled path (``glsl/convolution_tiled.comp``): the implicit GEMM GPU
libraries use, with float16 arithmetic for float16 tensors where the device has it."""
from __future__ import annotations

import math

import numpy as np

from ...dml.data_type import DataType
from ...runtime import Bind
from ...runtime.blocks import pack
from .geometry import (STORAGES, Geometry, Path, in_place_accepts, in_place_binds, knobs_of,
                       storage_suffix, variant)
from ...intmath import ceil_div

#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = {f"convolution_tiled_{s}": ("LOCAL_SIZE_X", "TM", "TN", "TK", "RM", "RN", "ACT")
            for s in STORAGES + ("f16_arith",)}


def tiled_params(kernel: str, g: Geometry, mblocks: int, act_params) -> bytes:
    """The tiled kernel's parameter block: sizes, kernel, strides, dilations, padding and
    the tensors' element strides."""
    return pack(kernel, "Params", isz=(*g.in_size, g.cin_per_group),
                osz=(*g.out_size, g.cout_per_group), ksz=(*g.kernel, int(g.flip)),
                str=(*g.stride, int(g.b_stride is not None)), dil=(*g.dilation, mblocks),
                pad=(*g.start, math.prod(g.out_size)), xs=g.x_strides[:4],
                ws=g.w_strides[:4], ys=g.y_strides[:4],
                s2=(g.x_strides[4], g.w_strides[4], g.y_strides[4], g.b_stride or 0),
                act=act_params)


#: Tile shapes of the tiled path: (TM output channels, TN output pixels, TK input channels
#: per shared-memory stage, RM channels x RN pixels per invocation).  "64": 256
#: invocations, 8 KiB of shared memory (the usual GPU tile); "32": 64 invocations.
TILES = {"64": (64, 64, 16, 4, 4), "32": (32, 32, 16, 4, 4), "64x32": (64, 32, 8, 8, 4)}


class TiledPath(Path):
    """``glsl/convolution_tiled.comp``: a shared-memory tiled implicit GEMM, the kernel
    GPU libraries use for dense convolutions: TM output channels x TN pixels per
    workgroup, the reduction (filter tap, then TK input channels) staged through shared
    memory, an RM x RN register block per invocation read as float4s.  Forward
    convolutions of any kernel, stride, dilation, padding and group count, tensors read
    and written in place through their DML strides (no re-layout, no filter transform).
    Knobs: the tile (:data:`TILES`) and, for float16 tensors on devices with
    ``shaderFloat16`` and 16-bit storage, float16 arithmetic (``f16_arith``: each
    stage's TK products summed in float16 before the float32 accumulators; the bound
    tested is ``(TK + 1) 2^-11 sum |w x|`` per output)."""

    name = "tiled"

    @classmethod
    def prefers(cls, op, geo) -> bool:
        """Never the ``VKML_TUNE=off`` default (it comes after direct): on the CPU drivers
        the paths above measured faster; the tuner times it where it accepts."""
        return False

    @classmethod
    def accepts(cls, op, geo, knobs=None) -> bool:
        lim = op.ctx.limits
        k = knobs_of(knobs)
        tm, tn, tk, rm, rn = TILES[k.get("tile", "64")]
        local = (tm // rm) * (tn // rn)
        if k.get("f16_arith") and not (geo.dtype == DataType.FLOAT16 and op.features.get("fp16")
                                       and op.features.get("storage16")):
            return False
        groups = (ceil_div(math.prod(geo.out_size), tn),
                  geo.groups * ceil_div(geo.cout_per_group, tm), geo.n)
        return (local <= lim["maxComputeWorkGroupInvocations"]
                and local <= lim["maxComputeWorkGroupSize"][0]
                and (tm + tn) * tk * 4 <= lim["maxComputeSharedMemorySize"]
                and in_place_accepts(op, geo, groups))

    def __init__(self, op, geo, knobs=None):
        super().__init__(op, geo, knobs)
        g, k = geo, self.knobs
        self.tile = tm, tn, tk, rm, rn = TILES[k.get("tile", "64")]
        self.local = (tm // rm) * (tn // rn)
        name = ("convolution_tiled_f16_arith" if k.get("f16_arith")
                else variant("tiled", storage_suffix(op, g.dtype)))
        self.pipe = op.pipeline(name, {"LOCAL_SIZE_X": self.local, "TM": tm, "TN": tn, "TK": tk,
                                       "RM": rm, "RN": rn, "ACT": self.act_id})
        self.mtiles = ceil_div(g.cout_per_group, tm)
        self.params = op.upload(np.frombuffer(
            tiled_params(name, g, self.mtiles, self.act_params), np.uint8))

    def encode(self, seq, x, w, b, y) -> None:
        g = self.geo
        seq.dispatch(self.pipe, in_place_binds(self.op, g, x, w, b, y) + [Bind(self.params)],
                     (ceil_div(math.prod(g.out_size), self.tile[1]), g.groups * self.mtiles, g.n))

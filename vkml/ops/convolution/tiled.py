"""The shared-memory tiled path (``glsl/convolution_tiled.comp``): the implicit GEMM GPU
libraries use, with float16 arithmetic for float16 tensors where the device has it."""
from __future__ import annotations

import math

import numpy as np

from ...dml.data_type import DataType
from ...runtime import Bind
from .geometry import (_STORAGES, Geometry, Path, _words, in_place_accepts, in_place_binds,
                       knobs, storage_suffix, variant)
from ...intmath import ceil_div

#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = {f"convolution_tiled_{s}": ("LOCAL_SIZE_X", "TM", "TN", "TK", "RM", "RN", "ACT")
            for s in _STORAGES + ("f16_arith",)}

def implicit_gemm_params(g: Geometry, mblocks: int, act_params) -> np.ndarray:
    """The tiled kernel's parameter block (std140): sizes, kernel, strides, dilations,
    padding and the tensors' element strides."""
    p = np.zeros(40, np.int64)
    p[0:4] = [*g.in_size, g.cin_per_group]
    p[4:8] = [*g.out_size, g.cout_per_group]
    p[8:12] = [*g.kernel, int(g.flip)]
    p[12:16] = [*g.stride, int(g.b_stride is not None)]
    p[16:20] = [*g.dilation, mblocks]
    p[20:24] = [*g.start, math.prod(g.out_size)]
    p[24:28] = g.x_strides[:4]
    p[28:32] = g.w_strides[:4]
    p[32:36] = g.y_strides[:4]
    p[36:40] = [g.x_strides[4], g.w_strides[4], g.y_strides[4], g.b_stride or 0]
    return np.concatenate([_words(p).view(np.uint8), act_params.view(np.uint8)])


#: Tile shapes of the tiled path: (TM output channels, TN output pixels, TK input channels
#: per shared-memory stage, RM channels x RN pixels per invocation).  "64": 256
#: invocations, 8 KiB of shared memory (the usual GPU tile); "32": 64 invocations.
TILES = {"64": (64, 64, 16, 4, 4), "32": (32, 32, 16, 4, 4), "64x32": (64, 32, 8, 8, 4)}
TILED_PARAM_WORDS = 44      # std140: 10 ivec4/uvec4 + the activation vec4


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
    def accepts(cls, op, geo) -> bool:
        lim = op.ctx.limits
        k = knobs(op)
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

    def __init__(self, op, geo):
        super().__init__(op, geo)
        g, k = geo, knobs(op)
        self.tile = tm, tn, tk, rm, rn = TILES[k.get("tile", "64")]
        self.local = (tm // rm) * (tn // rn)
        name = ("convolution_tiled_f16_arith" if k.get("f16_arith")
                else variant("tiled", storage_suffix(op, g.dtype)))
        self.pipe = op.pipeline(name, {"LOCAL_SIZE_X": self.local, "TM": tm, "TN": tn, "TK": tk,
                                       "RM": rm, "RN": rn, "ACT": self.act_id})
        self.mtiles = ceil_div(g.cout_per_group, tm)
        self.params = op.upload(implicit_gemm_params(g, self.mtiles, self.act_params))

    def encode(self, seq, x, w, b, y) -> None:
        g = self.geo
        seq.dispatch(self.pipe, in_place_binds(self.op, g, x, w, b, y) + [Bind(self.params)],
                     (ceil_div(math.prod(g.out_size), self.tile[1]), g.groups * self.mtiles, g.n))

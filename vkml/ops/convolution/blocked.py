"""The register-blocked path: an in-place implicit GEMM whose small register blocks are
frozen into the module (``glsl/convolution_blocked.comp``, CONV variants); its GEMM
variant also runs Winograd's 36 GEMMs (``winograd-blocked``, see winograd.py)."""
from __future__ import annotations

import math

from ...runtime import Bind
from .geometry import (_STORAGES, Path, implicit_gemm_params, in_place_accepts, in_place_binds,
                       knobs, storage_suffix, variant)

#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = {f"convolution_blocked_{s}": ("LOCAL_SIZE_X", "RM", "RN", "ACT")
            for s in _STORAGES + ("gemm",)}

#: Register blocks of the blocked path: (RM output channels, RN pixels, invocations per
#: workgroup).  Frozen into the module (FROZEN_CONSTANTS), so they stay small.
BLOCKS = {"8x4": (8, 4, 16), "4x4": (4, 4, 16), "8x8": (8, 8, 16), "8x2": (8, 2, 16),
          "1x8": (1, 8, 64)}


class BlockedPath(Path):
    """``glsl/convolution_blocked.comp`` (CONV): a forward convolution as an implicit GEMM
    read in place through the DML strides, RM output channels x RN pixels per invocation
    with RM and RN frozen into the module, so that drivers which do not fold
    specialization constants keep the block in registers (measured on SwiftShader, where
    the other paths' large blocks live in memory).  Knob: the block (:data:`BLOCKS`)."""

    name = "blocked"

    @classmethod
    def prefers(cls, op, geo) -> bool:
        """Not the ``VKML_TUNE=off`` default (after direct): the tuner times it."""
        return False

    @classmethod
    def _shape(cls, op, geo):
        rm, rn, local = BLOCKS[knobs(op).get("block", "8x4")]
        local = min(local, op.ctx.limits["maxComputeWorkGroupSize"][0])
        mblocks = -(-geo.cout_per_group // rm)
        groups = (-(-math.prod(geo.out_size) // (local * rn)), geo.groups * mblocks, geo.n)
        return rm, rn, local, mblocks, groups

    @classmethod
    def accepts(cls, op, geo) -> bool:
        return in_place_accepts(op, geo, cls._shape(op, geo)[4])

    def __init__(self, op, geo):
        super().__init__(op, geo)
        rm, rn, self.local, mblocks, self.groups = self._shape(op, geo)
        self.pipe = op.pipeline(variant("blocked", storage_suffix(op, geo.dtype)), {
            "LOCAL_SIZE_X": self.local, "RM": rm, "RN": rn, "ACT": self.act_id})
        self.params = op.upload(implicit_gemm_params(geo, mblocks, self.act_params))

    def encode(self, seq, x, w, b, y) -> None:
        seq.dispatch(self.pipe, in_place_binds(self.op, self.geo, x, w, b, y)
                     + [Bind(self.params)], self.groups)

"""The gemm_sg path: the implicit GEMM of ``gemm.py`` with the filter read in place and
shared across a subgroup by shuffles (``convolution_gemm.comp``, SGW variants).
:class:`~.gemm.GemmPath` builds both (``SG``); this class offers the variant only to
devices with full subgroups of a shuffle-capable size."""
from __future__ import annotations

import math

from .gemm import (_GEMM, SG_BLOCKS, GemmPath, forward_axes, padded_extents,
                   subgroup_shuffle_size, transposed_axes)
from .geometry import _STORAGES, _texel_ok
from ...intmath import ceil_div

#: Kernel variants this path runs (requested by :class:`~.gemm.GemmPath` with ``SG``)
#: and the specialization constants it sets.
VARIANTS = {f"convolution_gemm_sg_{s}": _GEMM + ("SG", "CBW")
            for s in _STORAGES + ("f32_v8",)}


class GemmSgPath(GemmPath):
    """The implicit GEMM reading the filter in place through its DML strides, shared
    across a subgroup by shuffles (``convolution_gemm.comp``, SGW variants): no
    re-laid filter per execution.  The kernel needs full subgroups of the reported size
    (lavapipe: 8 lanes, SwiftShader: 4), so its pipelines require them
    (:func:`subgroup_shuffle_size`); a device that cannot guarantee them is not offered
    this path."""

    name = "gemm_sg"
    SG = True

    @classmethod
    def accepts(cls, op, geo) -> bool:
        if not (super().accepts(op, geo) and subgroup_shuffle_size(op) >= 4):
            return False
        fd = op.desc.filter_tensor
        # texel views of the filter and of the padded input (a bound on its size: the
        # last block's row may run past the planes)
        phases = transposed_axes(geo) if geo.backward else forward_axes(geo)
        _, ext = padded_extents(geo, phases)
        tail = (SG_BLOCKS[1] + 4) * geo.stride[2] + geo.kernel[2] * geo.dilation[2] + 4
        x_bound = geo.n * geo.c_in * math.prod(ext[:2]) * (ceil_div(ext[2], 4) * 4) + tail
        return (_texel_ok(op, fd.total_tensor_size_in_bytes // fd.data_type.size)
                and _texel_ok(op, x_bound))

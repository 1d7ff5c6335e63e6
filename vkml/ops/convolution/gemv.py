"""The gemv path: a 1x1 convolution of 1x1 planes -- a squeeze-excitation block's fully
connected layers -- as a matrix-vector product per image, the input channels split over
a subgroup's lanes and summed by shuffles (``glsl/convolution_gemv.comp``).

The implicit GEMMs give such a shape one pixel block per channel block, so one lane does
a whole reduction of up to a thousand channels while the rest of its subgroup idles;
here every lane of a subgroup shares the reduction of MB output channels."""
from __future__ import annotations

import numpy as np

from ... import runtime
from ...dml.data_type import DataType
from ...intmath import ceil_div
from ...runtime.blocks import pack
from ..concurrent_width import concurrent_width
from ..grid import per_workgroup, pieces
from .gemm import subgroup_shuffle_size
from .geometry import Path, texel_ok
from .plan import Buf, Step, compiled, record

#: Kernel variants this path runs and the specialization constants it sets.
VARIANTS = {"convolution_gemv_f32": ("LOCAL_SIZE_X", "MB", "SG", "ACT", "KS", "X4")}
#: Output channels a subgroup computes: each lane fetches MB filter elements per input
#: element it fetches; more would leave the few subgroups of a narrow layer (8 output
#: channels) fewer still.
MB = 4


class GemvPath(Path):
    """``glsl/convolution_gemv.comp`` (module doc): forward, one group, 1x1 kernel over
    1x1 planes, float32, on a device with subgroup shuffles and full subgroups (the
    pipeline requires the reported size, :func:`~.gemm.subgroup_shuffle_size`), the
    input and filter within a texel view."""

    name = "gemv"

    @classmethod
    def accepts(cls, op, geo, knobs=None) -> bool:
        d = op.desc
        return (geo.plain and not geo.backward and geo.groups == 1
                and geo.kernel == (1, 1, 1) and geo.in_size == (1, 1, 1)
                and geo.out_size == (1, 1, 1) and geo.start == (0, 0, 0)
                and geo.dtype == DataType.FLOAT32 and subgroup_shuffle_size(op) >= MB
                and texel_ok(op, d.input_tensor.total_tensor_size_in_bytes // 4)
                and texel_ok(op, d.filter_tensor.total_tensor_size_in_bytes // 4))

    def __init__(self, op, geo, knobs=None):
        super().__init__(op, geo, knobs)
        g = geo
        self.sg = subgroup_shuffle_size(op)
        kernel = "convolution_gemv_f32"
        params = op.upload(np.frombuffer(pack(
            kernel, "Params", size=(g.c_in, g.c_out, int(g.b_stride is not None),
                                    g.b_stride or 0),
            xs=(g.x_strides[0], g.x_strides[1], 0, 0), ws=(g.w_strides[0], g.w_strides[1], 0, 0),
            ys=(g.y_strides[0], g.y_strides[1], 0, 0), act=self.act_params), np.uint8))
        self.params = params
        d = op.desc
        self.x4 = x4 = self._quads()
        fmt, unit = ((runtime.FORMAT_RGBA32_SFLOAT, 16) if x4 else (runtime.FORMAT_R32_SFLOAT, 4))
        x_bytes = d.input_tensor.total_tensor_size_in_bytes
        binds = (Buf("x", x_bytes - x_bytes % unit, "r", fmt, unit),
                 Buf("w", d.filter_tensor.total_tensor_size_in_bytes, "r", fmt, unit),
                 Buf("b", absent=params),
                 Buf("y", d.output_tensor.total_tensor_size_in_bytes, "w"), Buf(params))
        self.split = ks = self._split()
        # whole subgroups a workgroup, as few turns as the device's width allows (a
        # squeeze to 10 channels: two workgroups of one subgroup on two threads, not one
        # of eight subgroups)
        subgroups = ceil_div(ceil_div(g.c_out, MB), self.sg // ks)
        local = self.sg * per_workgroup(subgroups, max(1, min(64, op.workgroup_size) // self.sg),
                                        g.n, concurrent_width(op.device))
        consts = {"LOCAL_SIZE_X": local, "MB": MB, "SG": self.sg, "ACT": self.act_id, "KS": ks,
                  "X4": int(x4)}
        gx = ceil_div(ceil_div(g.c_out, MB), local // ks)
        mz = self.ctx.limits["maxComputeWorkGroupCount"][2]
        self.steps = compiled(op, [Step(kernel, consts, (gx, 1, nn), binds, {"n0": n0},
                                        self.sg)
                                   for n0, nn in pieces(g.n, mz)])

    def _quads(self) -> bool:
        """Whether the kernel fetches four input channels at a time (X4): packed input
        channels in the input and the filter, their image and output-channel strides
        and the channel count multiples of 4."""
        g = self.geo
        return (g.x_strides[1] == 1 and g.w_strides[1] == 1 and g.c_in % 4 == 0
                and g.x_strides[0] % 4 == 0 and g.w_strides[0] % 4 == 0)

    def _split(self) -> int:
        """Lanes sharing one block's reduction (knob ``gemv_split``; None: the whole
        subgroup where each lane then still sums a few fetches (channels, or quads of
        them with X4), else one)."""
        ks = self.knobs["gemv_split"]
        if ks is None:
            ks = self.sg if self.geo.c_in // (4 if self.x4 else 1) >= 2 * self.sg else 1
        return min(ks, self.sg)

    def encode(self, seq, x, w, b, y) -> None:
        record(seq, self.op, self.steps, x=x, w=w, b=b, y=y)

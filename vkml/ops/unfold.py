"""Unfold: ``DML_UNFOLD_OPERATOR_DESC`` (im2col) and ``vkml.unfold``.

Kernel: ``glsl/unfold.comp``, one invocation per output element, over the box
(N, C x prod(WindowSizes), *BlocksPerDimension): the output's last dimension seen as the
blocks' own dimensions, so the grid's x runs along the last block dimension and only it
is decomposed per invocation.  Data movement only: one variant per element width (1, 2,
4, 8 bytes; 8/16-bit elements packed in 32-bit words on devices without 8/16-bit
storage), every data type on every device, every bit pattern kept.
"""
from __future__ import annotations

import math

import numpy as np

from ..dml.fold import blocks_per_dimension
from ..dml.operator import as_tuple
from ..dml.tensor_desc import TensorDesc
from ..dml.unfold import UnfoldOperatorDesc
from ..errors import ValidationError
from ..runtime import STORAGE, UNIFORM, Bind
from .base import implements
from .fold import MAX_SPATIAL, PUSH_BYTES, BoxKernel, spec_geometry
from .functional import as_array, pick_device, run

__all__ = ["unfold"]


@implements(UnfoldOperatorDesc)
class CompiledUnfold(BoxKernel):
    """Unfold on this device: see the module doc."""

    def build(self) -> None:
        d = self.desc
        src, dst = d.input_tensor, d.output_tensor
        esize = src.data_type.size
        native = {1: "storage8", 2: "storage16"}.get(esize)
        packed = native is not None and not self.features[native]
        self.kernel = f"unfold_e{esize}" + ("_packed" if packed else "")
        self.in_esize = self.out_esize = esize
        self.in_bytes = self.in_bind = src.total_tensor_size_in_bytes
        self.out_bytes = dst.total_tensor_size_in_bytes
        self.win = d.window_sizes
        self.k = d.window_count
        self.strides = d.strides
        self.dil = d.dilations
        self.start = d.start_padding
        self.blocks = d.blocks
        self.in_sizes = src.sizes
        self.in_strides = src.element_strides
        n, rows, _ = d.columns_sizes()
        sn, sr, sc = d.columns_strides()
        spatial = len(self.win)
        self.box = [n, rows] + list(self.blocks)
        self.box_out_strides = [sn, sr] + [sc * math.prod(self.blocks[i + 1:])
                                           for i in range(spatial)]
        self.rank = len(self.box)
        self.local = min(64, self.workgroup_size)
        self.windows = self.plan_windows()
        self.params = self.upload(self._params())
        self.consts = {1: self.rank, **spec_geometry(self.win, self.strides, self.dil)}

    def _params(self) -> np.ndarray:
        p = np.zeros(4 * 8, dtype=np.uint32)
        p[0:self.rank] = self.box_out_strides
        p[8:8 + self.rank] = self.in_strides
        n = len(self.win)
        p[16:16 + n] = self.in_sizes[2:]
        p[24:24 + n] = self.start
        return p

    def in_span(self, origin, extent):
        k = self.k
        c_lo = origin[1] // k
        c_hi = (origin[1] + extent[1] - 1) // k
        lo = origin[0] * self.in_strides[0] + c_lo * self.in_strides[1]
        hi = (origin[0] + extent[0] - 1) * self.in_strides[0] + c_hi * self.in_strides[1]
        for i in range(len(self.win)):
            a, h = origin[2 + i], origin[2 + i] + extent[2 + i] - 1
            reach = self.dil[i] * (self.win[i] - 1)
            a = max(0, a * self.strides[i] - self.start[i])
            h = min(self.in_sizes[2 + i] - 1, h * self.strides[i] - self.start[i] + reach)
            if a > h:
                return 0, 0
            lo += a * self.in_strides[2 + i]
            hi += h * self.in_strides[2 + i]
        return lo, hi + 1

    def encode(self, seq, inputs, outputs) -> None:
        x, y = inputs[0]._alloc, outputs[0]._alloc
        kinds = (STORAGE, STORAGE, UNIFORM)

        def pipeline_for(local, ly, xdims, v, vec_store):
            return self.pipeline(self.kernel, kinds, PUSH_BYTES,
                                 {0: local, 23: ly, 2: xdims, **self.consts})

        self.dispatch_windows(seq, x, y, self.windows, pipeline_for, [Bind(self.params)])


def unfold(x, window_sizes, *, strides=None, dilations=None, start_padding=None,
           end_padding=None, device=None):
    """Unfold (im2col), ``DML_UNFOLD_OPERATOR_DESC``: extract sliding local blocks.

    ``x``: (N, C, *spatial), 1 to 6 spatial dimensions; result (N, C x prod(window_sizes),
    BlockCount) with BlockCount = prod(BlocksPerDimension), zeros where a window covers
    the padding (as ``torch.nn.functional.unfold``).  Per-dimension arguments take one int
    per spatial dimension or one int for all; ``None`` is 1 for strides and dilations, 0
    for padding.  Every data type (bits moved unchanged).
    """
    dev = pick_device(device, x)
    x = as_array(x, "x")
    rank = len(x.shape)
    if not 3 <= rank <= 2 + MAX_SPATIAL:
        raise ValidationError("x", f"must have 3 to {2 + MAX_SPATIAL} dimensions (N, C, "
                              f"1 to {MAX_SPATIAL} spatial), got shape {tuple(x.shape)}")
    d = rank - 2
    window = as_tuple(window_sizes, 1, d)
    strides = as_tuple(strides, 1, d)
    dilations = as_tuple(dilations, 1, d)
    start = as_tuple(start_padding, 0, d)
    end = as_tuple(end_padding, 0, d)
    n, c = x.shape[:2]
    args = (window, strides, dilations, start, end)
    if all(len(a) == d for a in args) and all(v > 0 for v in strides):
        k = math.prod(max(1, w) for w in window)
        count = max(1, math.prod(blocks_per_dimension(x.shape[2:], *args)))
    else:
        k = count = 1                       # the descriptor reports the bad argument
    in_desc = TensorDesc(x.dtype, tuple(x.shape))
    out_desc = TensorDesc(x.dtype, (n, c * k, count))
    desc = UnfoldOperatorDesc(in_desc, out_desc, window, strides, dilations, start, end)
    return run(dev, desc, [x])

"""The direct path: one invocation per output element, any geometry
(``glsl/convolution_direct.comp``)."""
from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ...runtime import Bind
from ..grid import binding_window, box_grid, plan_windows, split_groups, strided_span
from ...runtime.blocks import pack
from .geometry import STORAGES, Path, pad3, storage_suffix, variant

#: Kernel variants this module requests (see :func:`variant`) and the specialization
#: constants it sets.
VARIANTS = {f"convolution_direct_{s}{r}": ("LOCAL_SIZE_X", "ACT", "BACKWARD")
            for s in STORAGES for r in ("", "_res")}


class DirectPath(Path):
    """``glsl/convolution_direct.comp``: one invocation per output element, any geometry.

    Tensors larger than ``maxStorageBufferRange`` are bound a window of batch items at a
    time (the kernel subtracts the window's first element index)."""

    name = "direct"
    RESIDUAL = True

    @classmethod
    def accepts(cls, op, geo, knobs=None) -> bool:
        return True

    def __init__(self, op, geo, knobs=None):
        super().__init__(op, geo, knobs)
        g = geo
        ow = g.out_size[2]
        self.local = min(64, max(8, 1 << (max(ow, 1) - 1).bit_length()), op.workgroup_size)
        self.kernel = variant("direct", storage_suffix(op, g.dtype)) + self.res
        self.pipe = op.pipeline(self.kernel, {
            "LOCAL_SIZE_X": self.local, "ACT": self.act_id, "BACKWARD": int(g.backward)})
        self.params = op.upload(np.frombuffer(pack(
            self.kernel, "Params",
            in_size=(*g.in_size, g.cin_per_group), out_size=(*g.out_size, g.c_out),
            ksize=(*g.kernel, g.cout_per_group), stride=(*g.stride, int(g.flip)),
            dil=(*g.dilation, int(g.b_stride is not None)), pad=(*g.start, 0),
            valid=(*g.vrange[1], 0), xs=g.x_strides[:4], ys=g.y_strides[:4],
            ws=g.w_strides[:4],
            ws_last=(g.x_strides[4], g.y_strides[4], g.w_strides[4], g.b_stride or 0),
            act=self.act_params, vlo=(*g.vrange[0], 0), offs=(g.w_off, g.x_off, 0, 0)),
            np.uint8))
        self.esize = g.dtype.size
        self.windows = self._batch_windows()

    def _batch_windows(self):
        """[(n0, n1, x_lo, x_hi, y_lo, y_hi)] byte windows per batch range that fit the
        device's maxStorageBufferRange."""
        g, e = self.geo, self.esize
        limit = self.ctx.limits["maxStorageBufferRange"] - 2 * self.ctx.binding_alignment()
        # (the descriptor's input: a reduced geometry reads a part of it from x_off)
        x_item = (g.c_in, *pad3(self.op.desc.input_tensor.sizes[2:], 1))
        y_item = (g.c_out, *g.out_size)

        def x_span(origin, extent):
            return strided_span((origin[0], 0, 0, 0, 0), (extent[0], *x_item), g.x_strides)

        def y_span(origin, extent):
            return strided_span((origin[0], 0, 0, 0, 0), (extent[0], *y_item), g.y_strides)

        if max(x_span((0,), (1,))[1], y_span((0,), (1,))[1]) * e > limit:
            raise UnsupportedError("maxStorageBufferRange", "one batch item of this "
                                   "convolution is larger than the device can bind")
        return [(o[0], o[0] + n[0], xlo * e, xhi * e, ylo * e, yhi * e)
                for o, n, xlo, xhi, ylo, yhi in plan_windows([g.n], x_span, y_span, e, e, limit)]

    def encode(self, seq, x, w, b, y, r=None) -> None:
        g = self.geo
        align = self.ctx.binding_alignment()
        max_groups = self.ctx.limits["maxComputeWorkGroupCount"]
        w_bind = Bind(w, 0, self.op.whole(w, "filter"))
        b_bind = Bind(b, 0, self.op.whole(b, "bias")) if b is not None else w_bind
        od_co = g.out_size[0] * g.c_out
        for n0, n1, xlo, xhi, ylo, yhi in self.windows:
            xo, xsize = binding_window(xlo, xhi, x.size, align)
            yo, ysize = binding_window(ylo, yhi, y.size, align)
            binds = [Bind(x, xo, xsize), w_bind, b_bind, Bind(y, yo, ysize, "w"),
                     Bind(self.params)]
            if self.res:          # laid out as the output: the output's window
                binds.append(Bind(r, yo, min(ysize, r.size - yo)))
            # the grid: x along output columns, y rows, z (image, depth, channel)
            box = ([n0 * od_co, 0, 0], [(n1 - n0) * od_co, *g.out_size[1:]])
            for o, e in split_groups(*box, self.local, max_groups, magic=False):
                push = pack(self.kernel, "push", origin=(o[2], o[1], o[0], 0),
                            x_base=xo // self.esize, y_base=yo // self.esize)
                seq.dispatch(self.pipe, binds, box_grid(e, self.local), push)

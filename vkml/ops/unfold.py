"""Unfold: ``DML_UNFOLD_OPERATOR_DESC`` (im2col) and ``vkml.unfold``.

Kernel: ``glsl/unfold.comp``, over the box (N, C, *BlocksPerDimension): the output's
last dimension seen as the blocks' own dimensions, so the grid's x runs along the last
block dimension.  An invocation writes the K = prod(WindowSizes) rows of its channel for
V neighbouring blocks (uvec4 stores where aligned), reading each window row's inputs
once -- for 4-byte elements as RGBA32UI texels shifted into place.  Data movement
only: one variant per element width (1, 2, 4, 8 bytes; 8/16-bit elements packed in
32-bit words on devices without 8/16-bit storage), every data type on every device,
every bit pattern kept.
"""
from __future__ import annotations

import math

from ..dml.fold import blocks_per_dimension
from ..dml.operator import as_tuple
from ..dml.tensor_desc import TensorDesc
from ..dml.unfold import UnfoldOperatorDesc
from ..errors import ValidationError
from ..runtime import FORMAT_RGBA32_UINT, STORAGE, UNIFORM_TEXEL, Bind
from ..dml.data_type import DataType
from .. import tuning
from .base import implements
from .fold import (MAX_SPATIAL, geometry_names, safe_geometry, spec_geometry, window_args,
                   window_shape)
from .grid import BOX_CONSTANTS, BoxKernel, register_read_path
from .functional import as_array, pick_device, run
from ..intmath import ceil_div

__all__ = ["unfold"]

#: Kernel variants this module requests (unfold_e<element bytes>[_packed|_texel4]) and the
#: specialization constants it sets.
VARIANTS = dict.fromkeys(
    ["unfold_e1", "unfold_e1_packed", "unfold_e2", "unfold_e2_packed", "unfold_e4",
     "unfold_e4_texel4", "unfold_e8"],
    BOX_CONSTANTS + ("V", "VEC_STORE", "PER_ROW") + geometry_names())
#: glsl/unfold_tile.comp ("tile": 4-byte elements, 2 spatial dimensions, through a
#: shared-memory tile).
VARIANTS["unfold_e4_tile"] = BOX_CONSTANTS + ("V", "VEC_STORE", "TILE_SIZE") + tuple(
    f"{p}{i}" for p in "WSL" for i in range(2))


@implements(UnfoldOperatorDesc)
class CompiledUnfold(BoxKernel):
    """Unfold on this device: see the module doc.

    Read paths: "ssbo", "texel4" (4-byte elements as RGBA32UI texels, 4 neighbours at
    once) or "tile" (4-byte elements, 2 spatial dimensions: each workgroup copies its
    input tile with the halo into shared memory first, glsl/unfold_tile.comp); the rule
    (texel4 where allowed, else ssbo) or the tuner's choice (:data:`READ_PATH`), or
    ``read=`` (:class:`~.grid.BoxKernel`)."""

    #: Output elements along the last dimension per invocation (1, 4 or 8): 4 measured
    #: fastest on lavapipe (each invocation writes K x V outputs).
    vec: int = 4

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
        self.k = d.window_count
        self.blocks = d.blocks
        # equivalent windows whose positions fit 32-bit arithmetic (or a ValidationError)
        self.win, self.strides, self.dil, self.start = safe_geometry(
            d, src.sizes[2:], self.blocks, d.window_sizes, d.strides, d.dilations,
            d.start_padding)
        self.in_sizes = src.sizes
        self.in_strides = src.element_strides
        n, rows, _ = d.columns_sizes()
        sn, sr, sc = d.columns_strides()
        spatial = len(self.win)
        # The grid runs over (N, C, blocks...), each invocation writing the K rows of its
        # channel, row_stride apart; or -- when the tensors must be bound in windows, as
        # a channel's K rows may not fit one -- over (N, C x K, blocks...), one row each.
        lim = self.ctx.limits["maxStorageBufferRange"]
        self.per_row = self.in_bytes > lim or self.out_bytes > lim
        self.row_stride = sr
        self.box = [n, rows if self.per_row else rows // self.k] + list(self.blocks)
        self.box_out_strides = ([sn, sr if self.per_row else sr * self.k]
                                + [sc * math.prod(self.blocks[i + 1:]) for i in range(spatial)])
        self.rank = len(self.box)
        self.local = min(64, self.workgroup_size)
        self.windows = self.plan_windows()
        texels = self.ctx.limits["maxTexelBufferElements"]
        texel4 = (self.kernel == "unfold_e4" and self.windows is None
                  and ceil_div(self.in_bytes, 16) <= texels and self.in_strides[-1] == 1)
        tile = (self.kernel == "unfold_e4" and not self.per_row and spatial == 2
                and self.tile_floats(1, 1, 1) <= self.shared_floats)
        ok = {"ssbo": True, "texel4": texel4, "tile": tile}
        self.read = self.choose_read(ok, "texel4" if texel4 else "ssbo", tile,
                                     lambda: window_shape(d))
        self.in_kind, self.in_fmt = STORAGE, 0
        if self.read == "tile":
            self.kernel += "_tile"
            self.vec, self.x_last_only = 4, True
        if self.read == "texel4":
            self.kernel += "_texel4"
            self.in_kind, self.in_fmt = UNIFORM_TEXEL, FORMAT_RGBA32_UINT
            self.in_bind = ceil_div(self.in_bytes, 16) * 16
        self.vec_store_ok = esize == 4 and not packed
        out_stride = list(self.box_out_strides)
        out_stride[1] = self.row_stride          # the kernel steps rows of a channel by it
        self.params = self.upload_block(
            self.kernel, "Params", out_stride=out_stride, in_stride=self.in_strides,
            in_size=self.in_sizes[2:], start=self.start, in_texels=self.in_bind // 16)
        self.consts = {"RANK": self.rank, **spec_geometry(self.win, self.strides, self.dil)}

    def tile_floats(self, lx: int, ly: int, v: int) -> int:
        """Elements of the "tile" kernel's shared tile for an lx x ly workgroup: the input
        rows and columns its blocks' windows (4 blocks per invocation, v apart) read."""
        (w0, w1), (s0, s1), (l0, l1) = self.win, self.strides, self.dil
        return ((ly - 1) * s0 + (w0 - 1) * l0 + 1) * (((lx - 1) * v + 3) * s1
                                                       + (w1 - 1) * l1 + 1)

    def out_span(self, origin, extent):
        lo, hi = super().out_span(origin, extent)
        if self.per_row:
            return lo, hi
        return lo, hi + (self.k - 1) * self.row_stride     # the channel's K rows

    def vector_store(self, origin, out_base, v) -> bool:
        return super().vector_store(origin, out_base, v) and self.row_stride % 4 == 0

    def in_span(self, origin, extent):
        c_lo = origin[1]
        c_hi = origin[1] + extent[1] - 1
        if self.per_row:
            c_lo, c_hi = c_lo // self.k, c_hi // self.k
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
        x, y = inputs[0].allocation, outputs[0].allocation

        def pipeline_for(local, ly, xdims, v, vec_store):
            if self.read == "tile":
                consts = {k: c for k, c in self.consts.items()
                          if k[1:] in ("0", "1") or k == "RANK"}
                return self.pipeline(self.kernel, {
                    "LOCAL_SIZE_X": local, "LOCAL_SIZE_Y": ly, "XDIMS": xdims, "V": v,
                    "VEC_STORE": int(vec_store and self.vec_store_ok),
                    "TILE_SIZE": self.tile_floats(local, ly, v), **consts})
            return self.pipeline(self.kernel, {
                "LOCAL_SIZE_X": local, "LOCAL_SIZE_Y": ly, "XDIMS": xdims, "V": v,
                "PER_ROW": int(self.per_row), "VEC_STORE": int(vec_store and self.vec_store_ok),
                **self.consts})

        self.dispatch_windows(seq, x, y, self.windows, pipeline_for, [Bind(self.params)],
                              self.in_kind, self.in_fmt)


def _read_class(shape) -> str:
    """Shapes sharing a read path choice: rank and input size (a factor of 4)."""
    sizes, strides = shape["in"]
    nbytes = 4 * (sum((n - 1) * s for n, s in zip(sizes, strides)) + 1)
    return f"rank {len(sizes)} in 4^{nbytes.bit_length() // 2}"


def _read_desc(shape):
    """The float32 Unfold descriptor of a tuner's ``shape``."""
    (isz, ist), (osz, ost) = shape["in"], shape["out"]
    return UnfoldOperatorDesc(TensorDesc(DataType.FLOAT32, tuple(isz), tuple(ist)),
                              TensorDesc(DataType.FLOAT32, tuple(osz), tuple(ost)),
                              *window_args(shape))


#: Unfold's read path where "tile" is possible (4-byte elements, 2 spatial dimensions):
#: "auto" (RGBA32UI texel reads where maxTexelBufferElements allows, else storage
#: buffer; the ``VKML_TUNE=off`` default) or "tile", chosen by measurement.
READ_PATH = register_read_path(
    "unfold_read", ("auto", "tile"), CompiledUnfold, _read_desc, _read_class,
    work_fn=tuning.io_elements,
    examples=[{"in": [[1, 64, 56, 56], [200704, 3136, 56, 1]],
               "out": [[1, 576, 3136], [1806336, 3136, 1]], "window_sizes": [3, 3],
               "strides": [1, 1], "dilations": [1, 1], "start_padding": [1, 1],
               "end_padding": [1, 1]}])


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
    window = as_tuple(window_sizes, 1, d, "window_sizes")
    strides = as_tuple(strides, 1, d, "strides")
    dilations = as_tuple(dilations, 1, d, "dilations")
    start = as_tuple(start_padding, 0, d, "start_padding")
    end = as_tuple(end_padding, 0, d, "end_padding")
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

"""Fold: ``DML_FOLD_OPERATOR_DESC`` (col2im) and ``vkml.fold``.

Kernel: ``glsl/fold.comp``, a gather: one invocation per output element sums the input
elements whose window position lands on it, in a fixed order (no atomics: bit-identical
results run to run).  One variant per arithmetic: float32 (float16 stored as halves, or
packed in 32-bit words on devices without 16-bit storage), float64 (needs shaderFloat64),
8/16/32-bit integers added in 32 bits and stored wrapping, 64-bit integers added as
32-bit pairs with carry (exact on every device, no shaderInt64 needed).

The dispatch machinery (:class:`.grid.BoxKernel`) is shared with Unfold and LP pooling.
Read paths (float32/int32): texel rule or "ssbo4" (vec4 storage reads), chosen by the tuner.
"""
from __future__ import annotations

import math

from ..dml.fold import FoldOperatorDesc
from ..dml.operator import as_tuple
from ..dml.tensor_desc import TensorDesc
from ..errors import ValidationError
from ..runtime import Bind
from ..dml.data_type import DataType
from .. import tuning
from .base import implements
from .grid import BOX_CONSTANTS, BoxKernel, register_read_path
from .functional import as_array, pick_device, run
from ..intmath import ceil_div

__all__ = ["fold"]

MAX_SPATIAL = 6
#: The kernels compute window positions in 32-bit signed integers (SwiftShader has no
#: int64): every position, start padding and image size stays below this.
POSITION_LIMIT = 1 << 31
#: LP pooling: window positions per dimension, after dropping those that only meet
#: padding, that one output loops over (a longer loop would outlast the device's timeout).
MAX_TAPS = 1 << 20


def safe_window_dim(size: int, blocks: int, window: int, stride: int, dilation: int,
                    start: int, shrink_window: bool = False):
    """An equivalent (window, stride, dilation, start) for one spatial dimension whose
    positions fit 32-bit arithmetic, or None where none is found.

    Block ``b`` (of ``blocks``) and window tap ``k`` (of ``window``) address image
    position ``p = b * stride + k * dilation - start``, inside the image when
    ``0 <= p < size``; positions outside are padding (zero).  Two descriptors are
    equivalent when every (b, k) is inside in both or in neither, at the same ``p``.
    The rewrites, each exact (Python ints):

    * ``blocks == 1``: the stride multiplies 0 -> 1; ``window == 1``: the dilation -> 1.
    * Blocks whose window ``[b*stride - start, b*stride - start + (window-1)*dilation]``
      misses the image, or taps whose ``k*dilation - start + [0, (blocks-1)*stride]``
      misses it, address only padding.  If no block (or no tap) can reach the image,
      everything is padding: stride 1, dilation 1, start ``blocks + window - 1`` puts
      every position below 0.
    * One block ``b0`` can reach the image and ``stride > (window-1)*dilation + size``:
      stride' = ``(window-1)*dilation + size`` and start' = ``start - b0*(stride -
      stride')`` keep b0's positions; any other block's positions then lie at least
      ``stride'`` past b0's first (>= size) or end before b0's first minus
      ``stride' - (window-1)*dilation`` (< 0): padding, as before.
    * One tap ``k0`` can reach it and ``dilation > (blocks-1)*stride + size``: the same
      with the roles of blocks and taps exchanged.
    * ``shrink_window`` (LP pooling, whose window is no tensor dimension and whose padding
      adds nothing): taps outside the reachable range ``[k_lo, k_hi]`` are dropped:
      window' = ``k_hi - k_lo + 1``, start' = ``start - k_lo*dilation`` (k_lo at most
      ``start // dilation``, so start' >= 0).

    The result is safe when ``start + size < 2^31`` and the largest padded position
    ``(blocks-1)*stride + (window-1)*dilation < 2^31``: then every position (and the
    Fold kernel's ``o + start - k*dilation``) lies in (-2^31, 2^31).
    """
    s, w, st, dl, a = size, window, stride, dilation, start
    for _ in range(8):
        if blocks == 1:
            st = 1
        if w == 1:
            dl = 1
        b_lo = max(0, ceil_div(a - (w - 1) * dl, st))
        b_hi = min(blocks - 1, (a + s - 1) // st)
        k_lo = max(0, ceil_div(a - (blocks - 1) * st, dl))
        k_hi = min(w - 1, (a + s - 1) // dl)
        if b_lo > b_hi or k_lo > k_hi:        # only padding
            w = 1 if shrink_window else w
            st, dl, a = 1, 1, blocks + w - 1
            break
        first = min(k_lo, a // dl)               # keeps start >= 0 (one tap more at most)
        if shrink_window and (first > 0 or k_hi < w - 1):
            a -= first * dl
            w = k_hi - first + 1
            continue
        if b_lo == b_hi and st > (w - 1) * dl + s:
            new = (w - 1) * dl + s
            a -= b_lo * (st - new)
            st = new
            continue
        if k_lo == k_hi and dl > (blocks - 1) * st + s:
            new = (blocks - 1) * st + s
            a -= k_lo * (dl - new)
            dl = new
            continue
        break
    if a + s >= POSITION_LIMIT or (blocks - 1) * st + (w - 1) * dl >= POSITION_LIMIT:
        return None
    return w, st, dl, a


def safe_geometry(desc, spatial, blocks, window, strides, dilations, start,
                  shrink_window: bool = False):
    """:func:`safe_window_dim` for every spatial dimension: (window, strides, dilations,
    start) lists, or a ValidationError naming the field where 32-bit positions cannot
    hold the descriptor's windows."""
    out = ([], [], [], [])
    for i, args in enumerate(zip(spatial, blocks, window, strides, dilations, start)):
        got = safe_window_dim(*args, shrink_window=shrink_window)
        if got is None:
            s, b, w, st, dl, a = args
            field = (f"start_padding[{i}]" if a + s >= POSITION_LIMIT else
                     f"strides[{i}]" if (b - 1) * st >= (w - 1) * dl else f"dilations[{i}]")
            desc.fail(field, f"vkml computes window positions in 32-bit integers: the start "
                      f"padding plus the spatial size and the last padded position "
                      f"(BlocksPerDimension - 1) * Strides + (WindowSizes - 1) * Dilations "
                      f"must stay below 2^31 = {POSITION_LIMIT} (after reducing the windows to "
                      f"equivalent ones), got {a} + {s} and {(b - 1) * st + (w - 1) * dl}")
        if shrink_window and got[0] > MAX_TAPS:
            desc.fail(f"window_size[{i}]", f"at most {MAX_TAPS} window positions per "
                      f"dimension that can reach the input are supported (vkml loops over "
                      f"them for every output), got {got[0]}")
        for lst, v in zip(out, got):
            lst.append(v)
    return out


def window_in_span(op, origin, extent) -> tuple[int, int]:
    """[lo, hi) input elements an output box of a pooling-like ``op`` reads: dimensions 0
    and 1 as they are, each spatial one through the window (``op.win``, ``strides``,
    ``dil``, ``start`` as :func:`safe_geometry` gives them) clipped to the input; (0, 0)
    where the box's windows meet only padding."""
    lo = hi = 0
    for dim in range(op.rank):
        a, h = origin[dim], origin[dim] + extent[dim] - 1
        if dim >= 2:
            i = dim - 2
            reach = op.dil[i] * (op.win[i] - 1)
            a = max(0, a * op.strides[i] - op.start[i])
            h = min(op.in_sizes[dim] - 1, h * op.strides[i] - op.start[i] + reach)
            if a > h:
                return 0, 0
        lo += a * op.in_strides[dim]
        hi += h * op.in_strides[dim]
    return lo, hi + 1


def geometry_names(slots: int = MAX_SPATIAL) -> tuple[str, ...]:
    """Names of the window-size (W), stride (S) and dilation (L) constants of a kernel
    declaring ``slots`` spatial dimensions."""
    return tuple(f"{p}{i}" for p in "WSL" for i in range(slots))


def spec_geometry(window, strides, dilations, slots: int = MAX_SPATIAL) -> dict[str, int]:
    """Specialization constants W0.., S0.., L0..: window sizes, strides, dilations (1
    beyond the operator's spatial dimensions, up to the kernel's ``slots``)."""
    consts = {}
    for p, values in (("W", window), ("S", strides), ("L", dilations)):
        for i in range(slots):
            consts[f"{p}{i}"] = int(values[i]) if i < len(values) else 1
    return consts


#: Kernel variants this module requests (fold_variant, + "_texel"/"_texel4" reads) and
#: the specialization constants it sets.
VARIANTS = dict.fromkeys(
    ["fold_f32", "fold_f32_texel", "fold_f32_texel4", "fold_f16", "fold_f16_packed", "fold_f64",
     "fold_i8", "fold_i8_packed", "fold_i16", "fold_i16_packed", "fold_i32", "fold_i32_texel",
     "fold_i32_texel4", "fold_i64", "fold_f32_ssbo4", "fold_i32_ssbo4"],
    BOX_CONSTANTS + ("V", "VEC_STORE") + geometry_names())
#: glsl/fold_roll.comp (float32, 2 spatial dimensions): "roll" (rolled window loops, 4
#: outputs a vec4) and "tile" (the same adding from a shared-memory tile).
VARIANTS["fold_f32_roll"] = BOX_CONSTANTS + ("V", "VEC_STORE") + tuple(
    f"{p}{i}" for p in "WSL" for i in range(2))
VARIANTS["fold_f32_tile"] = VARIANTS["fold_f32_roll"] + ("TILE_SIZE",)


def fold_variant(desc_type: DataType, features: dict, require) -> tuple[str, int]:
    """The fold kernel variant for a data type and the bytes one element occupies."""
    t = desc_type
    if t == DataType.FLOAT32:
        return "fold_f32", 4
    if t == DataType.FLOAT16:
        return ("fold_f16" if features.get("storage16") else "fold_f16_packed"), 2
    if t == DataType.FLOAT64:
        require("fp64", "Fold adds float64 values: shaderFloat64 is needed")
        return "fold_f64", 8
    if t in (DataType.INT8, DataType.UINT8):
        return ("fold_i8" if features.get("storage8") else "fold_i8_packed"), 1
    if t in (DataType.INT16, DataType.UINT16):
        return ("fold_i16" if features.get("storage16") else "fold_i16_packed"), 2
    if t in (DataType.INT32, DataType.UINT32):
        return "fold_i32", 4
    return "fold_i64", 8


@implements(FoldOperatorDesc)
class CompiledFold(BoxKernel):
    """Fold on this device: see the module doc and ``glsl/fold.comp``.

    Read paths: "ssbo" (storage buffer), "texel" (R32 uniform texel buffer), "texel4"
    (RGBA32 texels, 4 neighbours at once), "ssbo4" (the same from a vec4 storage buffer),
    "roll" and "tile" (glsl/fold_roll.comp); the rule of :meth:`_choose_read` or the
    tuner's choice (:data:`READ_PATH`), or ``read=`` (:class:`~.grid.BoxKernel`)."""

    #: Output elements along the last dimension per invocation (1, 4 or 8).
    vec: int = 8

    def _choose_read(self, src) -> str:
        """Texel buffers: lavapipe vectorizes their reads (a storage-buffer read is a
        scalar load per lane); they need float32/int32 data bound whole within
        maxTexelBufferElements.  RGBA texels also need a unit last stride and packed
        columns (the V outputs of an invocation read neighbours).  "ssbo4" reads the
        same 4-element groups from a vec4 storage buffer (any size, windows too):
        SwiftShader, whose texel buffers hold 65536 elements, loads 16 bytes a lane."""
        texels = self.ctx.limits["maxTexelBufferElements"]
        f32 = self.kernel in ("fold_f32", "fold_i32")
        whole = self.windows is None and f32
        four = self.strides[-1] == 1 and self.col_strides[2] == 1
        ok = {"ssbo": True,
              "texel": whole and self.in_bytes // 4 <= texels,
              "texel4": whole and ceil_div(self.in_bytes, 16) <= texels and four,
              "ssbo4": f32 and four and self.ctx.binding_alignment() % 16 == 0,
              "roll": self.kernel == "fold_f32" and self.rank == 4,
              "tile": (self.kernel == "fold_f32" and self.rank == 4
                       and self.tile_floats(1, 1, 1) <= self.shared_floats)}
        rule = "texel4" if ok["texel4"] else "texel" if ok["texel"] else "ssbo"
        return self.choose_read(ok, rule, ok["ssbo4"] or ok["roll"],
                                lambda: read_shape(self.desc))

    def build(self) -> None:
        d = self.desc
        src, dst = d.input_tensor, d.output_tensor
        self.kernel, esize = fold_variant(src.data_type, self.features, self.require)
        self.in_esize = self.out_esize = esize
        self.in_bytes = src.total_tensor_size_in_bytes
        self.out_bytes = dst.total_tensor_size_in_bytes
        self.rank = dst.dimension_count
        self.box = list(dst.sizes)
        self.box_out_strides = list(dst.element_strides)
        self.k = d.window_count
        self.blocks = d.blocks
        # equivalent windows whose positions fit 32-bit arithmetic (or a ValidationError)
        self.win, self.strides, self.dil, self.start = safe_geometry(
            d, dst.sizes[2:], self.blocks, d.window_sizes, d.strides, d.dilations,
            d.start_padding)
        self.col_strides = d.columns_strides()
        spatial = len(self.win)
        self.block_strides = [math.prod(self.blocks[i + 1:]) for i in range(spatial)]
        self.local = min(64, self.workgroup_size)

        self.windows = self.plan_windows()
        self.in_bind = self.in_bytes
        read = self._choose_read(src)
        self.apply_read(read, src.data_type == DataType.FLOAT32)
        if read in ("roll", "tile"):   # their own kernel: 4 outputs a vec4, x along the last dim
            self.kernel += "_" + read
            self.vec, self.x_last_only = 4, True
        self.vec_store_ok = self.kernel.startswith(("fold_f32", "fold_i32"))
        self.params = self.upload_block(
            self.kernel, "Params", out_stride=self.box_out_strides,
            in_stride=[*self.col_strides, 0], start=self.start, blocks=self.blocks,
            block_stride=self.block_strides, in_texels=self.in_bind // 16)
        self.consts = {"RANK": self.rank, **spec_geometry(self.win, self.strides, self.dil)}

    def tile_floats(self, lx: int, ly: int, v: int) -> int:
        """Floats of the "tile" kernel's shared tile for an lx x ly workgroup (2 spatial
        dimensions): per window position, the blocks its outputs (4 per invocation, v
        apart) read."""
        (w0, w1), (s0, s1), (l0, l1) = self.win, self.strides, self.dil
        hb = ((ly - 1) + (w0 - 1) * l0) // s0 + 2
        il = ((lx - 1) * v + 3 + (w1 - 1) * l1) // s1 + 2
        return self.k * hb * il

    def in_span(self, origin, extent):
        sn, sr, sc = self.col_strides
        n_lo, n_hi = origin[0], origin[0] + extent[0] - 1
        row_lo = origin[1] * self.k
        row_hi = (origin[1] + extent[1]) * self.k - 1
        col_lo = col_hi = 0
        for i in range(len(self.win)):
            a, h = origin[2 + i], origin[2 + i] + extent[2 + i] - 1
            st, dl, w = self.strides[i], self.dil[i], self.win[i]
            b_lo = max(0, ceil_div(a + self.start[i] - dl * (w - 1), st))
            b_hi = min(self.blocks[i] - 1, (h + self.start[i]) // st)
            if b_lo > b_hi:
                return 0, 0
            col_lo += b_lo * self.block_strides[i]
            col_hi += b_hi * self.block_strides[i]
        lo = n_lo * sn + row_lo * sr + col_lo * sc
        hi = n_hi * sn + row_hi * sr + col_hi * sc + 1
        return lo, hi

    def encode(self, seq, inputs, outputs) -> None:
        x, y = inputs[0].allocation, outputs[0].allocation

        def pipeline_for(local, ly, xdims, v, vec_store):
            vec_store = vec_store and self.vec_store_ok
            consts = self.consts
            if self.read in ("roll", "tile"):     # 2 spatial dimensions only
                consts = {k: c for k, c in consts.items() if k[1:] in ("0", "1") or k == "RANK"}
            if self.read == "tile":
                consts = {**consts, "TILE_SIZE": self.tile_floats(local, ly, v)}
            return self.pipeline(self.kernel, {
                "LOCAL_SIZE_X": local, "LOCAL_SIZE_Y": ly, "XDIMS": xdims, "V": v,
                "VEC_STORE": int(vec_store), **consts})


        self.dispatch_windows(seq, x, y, self.windows, pipeline_for, [Bind(self.params)],
                              self.in_kind, self.in_fmt)


_WINDOW_FIELDS = ("window_sizes", "strides", "dilations", "start_padding", "end_padding")


def window_shape(desc) -> dict:
    """A Fold or Unfold descriptor's tensors and window fields as a tuner's JSON shape."""
    src, dst = desc.input_tensor, desc.output_tensor
    return {"in": [list(src.sizes), list(src.element_strides)],
            "out": [list(dst.sizes), list(dst.element_strides)],
            **{k: list(getattr(desc, k) or ()) for k in _WINDOW_FIELDS}}


def window_args(shape) -> list:
    """The window fields of a :func:`window_shape`, in the descriptors' order."""
    return [tuple(shape[k]) or None for k in _WINDOW_FIELDS]


def read_shape(desc) -> dict:
    """A Fold descriptor as the tuner's JSON shape (float32 and int32 read alike)."""
    ints = desc.input_tensor.data_type in (DataType.INT32, DataType.UINT32)
    return {"dtype": "int32" if ints else "float32", **window_shape(desc)}


def _read_class(shape) -> str:
    """Shapes sharing a read path choice: data type, rank and input size (a factor of 4)."""
    sizes, strides = shape["in"]
    nbytes = 4 * (sum((n - 1) * s for n, s in zip(sizes, strides)) + 1)
    return f"{shape['dtype']} rank {len(shape['out'][0])} in 4^{nbytes.bit_length() // 2}"


def _read_desc(shape):
    """The Fold descriptor of a tuner's ``shape``."""
    dt = DataType.INT32 if shape["dtype"] == "int32" else DataType.FLOAT32
    (isz, ist), (osz, ost) = shape["in"], shape["out"]
    return FoldOperatorDesc(TensorDesc(dt, tuple(isz), tuple(ist)),
                            TensorDesc(dt, tuple(osz), tuple(ost)), *window_args(shape))


#: Fold's read path where "ssbo4", "roll" or "tile" is possible: "auto" (the texel rule
#: of :meth:`CompiledFold._choose_read`, the ``VKML_TUNE=off`` default: lavapipe
#: vectorizes texel reads) or one of those (SwiftShader), chosen by measurement.
READ_PATH = register_read_path(
    "fold_read", ("auto", "ssbo4", "roll", "tile"), CompiledFold, _read_desc, _read_class,
    work_fn=tuning.io_elements,
    examples=[{"dtype": "float32", "in": [[1, 576, 3136], [1806336, 3136, 1]],
               "out": [[1, 64, 56, 56], [200704, 3136, 56, 1]], "window_sizes": [3, 3],
               "strides": [1, 1], "dilations": [1, 1], "start_padding": [1, 1],
               "end_padding": [1, 1]}])


def fold(x, output_size, window_sizes, *, strides=None, dilations=None, start_padding=None,
         end_padding=None, device=None):
    """Fold (col2im), ``DML_FOLD_OPERATOR_DESC``: sum sliding-window columns into an image.

    ``x``: (N, C x prod(window_sizes), BlockCount); ``output_size``: the spatial sizes
    (1 to 6 of them); result (N, C, *output_size), overlapping values summed (as
    ``torch.nn.functional.fold``).  Per-dimension arguments take one int per spatial
    dimension, or one int for all; ``None`` is 1 for strides and dilations, 0 for padding.
    Every data type; integer sums wrap around, float16 is summed in float32.
    """
    dev = pick_device(device, x)
    x = as_array(x, "x")
    output_size = as_tuple(output_size, None, 1, "output_size", 1)
    d = len(output_size)
    if not 1 <= d <= MAX_SPATIAL:
        raise ValidationError("output_size", f"must have 1 to {MAX_SPATIAL} spatial sizes, "
                              f"got {d}")
    if len(x.shape) != 3:
        raise ValidationError("x", "must have 3 dimensions (N, C x prod(window_sizes), "
                              f"BlockCount), got shape {tuple(x.shape)}")
    window = as_tuple(window_sizes, 1, d, "window_sizes")
    strides = as_tuple(strides, 1, d, "strides")
    dilations = as_tuple(dilations, 1, d, "dilations")
    start = as_tuple(start_padding, 0, d, "start_padding")
    end = as_tuple(end_padding, 0, d, "end_padding")
    n, rows, _ = x.shape
    k = math.prod(window) if len(window) == d and all(w > 0 for w in window) else 1
    channels = max(1, rows // k)
    in_desc = TensorDesc(x.dtype, tuple(x.shape))
    out_desc = TensorDesc(x.dtype, (n, channels) + output_size)
    desc = FoldOperatorDesc(in_desc, out_desc, window, strides, dilations, start, end)
    return run(dev, desc, [x])


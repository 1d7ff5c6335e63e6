"""Batch normalization: ``DML_BATCH_NORMALIZATION_OPERATOR_DESC`` and
``vkml.batch_normalization``.

Kernel: ``glsl/batch_normalization.comp``, a box kernel over the output (grid x along
the last dimension, V elements an invocation), reading the input and the four
statistics each through its own element strides; a statistic's dimension of size 1 is
read with stride 0 (the page's broadcast).  Dimensions every tensor walks contiguously
are merged first, so per-channel statistics of an NCHW input become a box (N, C, H*W)
whose last dimension the statistics are constant along: the ``_row`` variants load the
four once an invocation.  float32 read as RGBA32F texels stores each pair of vec4s as
one u64vec4 where every invocation's elements start 8-aligned, on a device with int64
shaders whose measured store width is 64-bit (:mod:`vkml.ops.store_width`: lavapipe
stores a vector one scalar per component; the ``_u64`` variants, ``store64`` forces
the choice).  Tensors larger than ``maxStorageBufferRange`` run in windows
(:func:`.grid.plan_windows`), each tensor bound over what its window reads; grids over
``maxComputeWorkGroupCount`` are split (:func:`.grid.split_groups`).
"""
from __future__ import annotations

import numpy as np

from ..dml.activations import activation as activation_desc
from ..dml.batch_normalization import STATISTICS, BatchNormalizationOperatorDesc
from ..dml.data_type import DataType
from ..dml.operator import as_real
from ..dml.tensor_desc import TensorDesc
from ..errors import ValidationError
from ..runtime import FORMAT_R32_SFLOAT, FORMAT_RGBA32_SFLOAT, STORAGE, UNIFORM_TEXEL, Bind
from ..runtime.blocks import pack
from .base import CompiledOperator, check_choice, implements
from .functional import as_array, pick_device, run
from .grid import (BOX_CONSTANTS, binding_window, box_grid, check_allocatable, div_magic,
                   plan_windows, row_workgroup, split_groups, strided_span, words8,
                   x_invocations)
from ..intmath import ceil_div
from .store_width import wide_stores

__all__ = ["batch_normalization"]

#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = dict.fromkeys(
    [f"batch_normalization_{t}{r}" for t in ("f32", "f16", "f16_packed") for r in ("", "_row")]
    + [f"batch_normalization_f32{r}_texel4{u}" for r in ("", "_row") for u in ("", "_u64")],
    BOX_CONSTANTS + ("V", "VEC_STORE", "ACT"))


def merge_dims(sizes, stride_sets):
    """Drop dimensions of size 1 and merge each dimension into the next where every
    stride set walks them as one (``stride[d] == stride[d + 1] * sizes[d + 1]``):
    ``(sizes, [strides, ...])`` of at least one dimension, the same elements in the
    same order."""
    dims = [(s, [st[d] for st in stride_sets]) for d, s in enumerate(sizes) if s > 1]
    out = []
    for s, sts in dims:
        if out and all(a == b * s for a, b in zip(out[-1][1], sts)):
            out[-1] = (out[-1][0] * s, sts)
        else:
            out.append((s, sts))
    if not out:
        out = [(1, [0] * len(stride_sets))]
    return [s for s, _ in out], [[sts[i] for _, sts in out] for i in range(len(stride_sets))]


@implements(BatchNormalizationOperatorDesc)
class CompiledBatchNormalization(CompiledOperator):
    """Batch normalization on this device: see the module doc.  ``read``: "texel4" or
    "ssbo" forces the float32 read; ``store64``: True / False forces or refuses the
    u64vec4 stores (None: the device's store width)."""

    #: Elements of the last dimension an invocation takes where it has that many.
    vec = 32

    def __init__(self, device, desc, read: str | None = None, store64: bool | None = None):
        check_choice("read", read, ("texel4", "ssbo"))
        check_choice("store64", store64, (True, False))
        self.force_read, self.force_store64 = read, store64
        super().__init__(device, desc)

    def build(self) -> None:
        d = self.desc
        x = d.input_tensor
        tensors = [d.output_tensor, x] + [getattr(d, n) for n in STATISTICS]
        # a statistic's size-1 dimension is read at coordinate 0 whatever the box's
        strides = [[st if s > 1 else 0 for s, st in zip(t.sizes, t.element_strides)]
                   for t in tensors]
        self.box, self.strides = merge_dims(x.sizes, strides)
        self.rank = len(self.box)
        self.esize = x.data_type.size
        self.bytes = [t.total_tensor_size_in_bytes for t in tensors]
        for what, n in zip(["output", "input"] + list(STATISTICS), self.bytes):
            check_allocatable(self.ctx, n, f"the {what} tensor")
        base = "f32" if x.data_type == DataType.FLOAT32 else (
            "f16" if self.features.get("storage16") else "f16_packed")
        self.row = all(st[-1] == 0 for st in self.strides[2:])
        self.kernel = f"batch_normalization_{base}" + ("_row" if self.row else "")
        self.local = min(64, self.workgroup_size)
        self.windows = self._plan_windows()
        # float32 input read as RGBA32F texels (the statistics as R32F) where each fits
        # a texel view (lavapipe vectorizes texel reads, not storage-buffer ones);
        # ``read="ssbo"`` forces storage-buffer reads
        self.in_bind, self.in_kind, self.in_fmt = self.bytes[1], STORAGE, 0
        texels = self.ctx.limits["maxTexelBufferElements"]
        if (base == "f32" and self.windows is None and self.force_read != "ssbo"
                and ceil_div(self.bytes[1], 16) <= texels
                and all(n // 4 <= texels for n in self.bytes[2:])):
            self.kernel += "_texel4"
            self.in_bind = ceil_div(self.bytes[1], 16) * 16
            self.in_kind, self.in_fmt = UNIFORM_TEXEL, FORMAT_RGBA32_SFLOAT
        self.read = "texel4" if self.in_kind == UNIFORM_TEXEL else "ssbo"
        # u64vec4 stores (texel4 windows where rows allow, see _dispatch) on a device
        # with int64 shaders whose measured store width (or ``store64``) says so
        wide = self.force_store64 if self.force_store64 is not None else wide_stores(
            self.device)
        self.store64 = bool(wide and self.read == "texel4" and self.features.get("int64"))
        act = d.fused_activation
        self.act = act.SPEC.kernel_id if act is not None else 0
        names = ("out_stride", "in_stride", "mean_stride", "var_stride", "scale_stride",
                 "bias_stride")
        rows = {n: words8(s) for n, s in zip(names, self.strides)}
        block = pack(self.kernel, "Params", **rows, epsilon=float(d.epsilon),
                     act_params=act.kernel_parameters() if act is not None else np.zeros(4))
        self.params = self.upload(np.frombuffer(block, np.uint8))

    def _plan_windows(self):
        """Boxes whose every tensor's span fits one binding (None: all fit whole)."""
        limit = self.ctx.limits["maxStorageBufferRange"]
        if max(self.bytes) <= limit:
            return None
        room = limit - 2 * self.ctx.binding_alignment()
        out_strides, in_sets = self.strides[0], self.strides[1:]

        def in_span(origin, extent):     # the widest input span: each is bound on its own
            return 0, max(strided_span(origin, extent, st)[1] - strided_span(origin, extent, st)[0]
                          for st in in_sets)

        return [(o, e) for o, e, *_ in plan_windows(
            self.box, in_span, lambda o, e: strided_span(o, e, out_strides), self.esize,
            self.esize, room, f"one output element of {self.desc.OPERATOR_TYPE}")]

    def _bindings(self, allocs, origin, extent):
        """Bindings (output first, as the kernel's 0/1 after the input) and base elements
        of each tensor for a window (None: whole tensors)."""
        es = self.esize
        if origin is None:
            binds = [Bind(a, 0, n, "w" if i == 0 else "r")
                     for i, (a, n) in enumerate(zip(allocs, self.bytes))]
            if self.read == "texel4":      # the input as RGBA32F, the statistics as R32F
                binds[1] = Bind(allocs[1], 0, self.in_bind, "r", self.in_fmt)
                binds[2:] = [Bind(a, 0, n, "r", FORMAT_R32_SFLOAT)
                             for a, n in zip(allocs[2:], self.bytes[2:])]
            return binds, [0] * 6
        align = self.ctx.binding_alignment()
        binds, bases = [], []
        for i, (a, st) in enumerate(zip(allocs, self.strides)):
            lo, hi = strided_span(origin, extent, st)
            off, size = binding_window(lo * es, hi * es, a.size, align)
            binds.append(Bind(a, off, size, "w" if i == 0 else "r"))
            bases.append(off // es)
        return binds, bases

    def vector_store(self, origin, bases, v, n: int = 4) -> bool:
        """vec4 loads and stores (float32) or half pairs (float16): the input and output
        packed along the last dimension with every invocation's first element n-aligned
        (n = 8: u64vec4 stores, two vec4s each)."""
        sx, sy = self.strides[1], self.strides[0]
        return (v % n == 0 and sx[-1] == 1 and sy[-1] == 1 and origin[-1] % n == 0
                and all(s % n == 0 for s in sx[:-1] + sy[:-1])
                and bases[0] % n == 0 and bases[1] % n == 0)

    def encode(self, seq, inputs, outputs) -> None:
        allocs = [outputs[0].allocation] + [t.allocation for t in inputs]
        windows = self.windows or [(None, None)]
        for origin, extent in windows:
            binds, bases = self._bindings(allocs, origin, extent)
            if origin is None:
                origin, extent = [0] * self.rank, list(self.box)
            # the kernel's bindings: input 0, output 1, parameters 2, statistics 3-6
            binds = [binds[1], binds[0], Bind(self.params)] + binds[2:]
            self._dispatch(seq, binds, bases, origin, extent)

    def _dispatch(self, seq, binds, bases, origin, extent) -> None:
        """Record one window: the grid as BoxKernel's, split to the device's limits."""
        max_y = int(self.ctx.limits["maxComputeWorkGroupSize"][1])
        xdims, v, lx, ly = row_workgroup(extent, self.local, max_y,
                                         widths=(self.vec, 16, 8, 4))
        io = [bases[1], bases[0]]
        u64 = self.store64 and self.vector_store(origin, io, v, 8)
        pipe = self.pipeline(self.kernel + ("_u64" if u64 else ""), {
            "LOCAL_SIZE_X": lx, "LOCAL_SIZE_Y": ly, "RANK": self.rank, "XDIMS": xdims, "V": v,
            "VEC_STORE": int(self.vector_store(origin, io, v)), "ACT": self.act})
        max_groups = self.ctx.limits["maxComputeWorkGroupCount"]
        for o, e in split_groups(origin, extent, lx, max_groups, xdims, v, ly):
            push = pack(pipe.name, "push", origin=words8(o), extent=words8(e),
                        magic=words8([div_magic(n) for n in e]), in_base=bases[1],
                        out_base=bases[0], mean_base=bases[2], var_base=bases[3],
                        scale_base=bases[4], bias_base=bases[5],
                        x_count=x_invocations(e, xdims, v), pad_=0)
            seq.dispatch(pipe, binds, box_grid(e, lx, xdims, v, ly), push)


def _statistic_desc(a, name: str, x_shape, dtype) -> TensorDesc:
    """A statistic's descriptor: an array of the input's rank as it is (sizes of 1
    broadcast), or ONNX's per-channel 1-D form (C values for an input of 2 or more
    dimensions) as the input's sizes with stride 1 along dimension 1 and 0 elsewhere."""
    shape = tuple(a.shape)
    if len(shape) == len(x_shape):
        return TensorDesc(dtype, shape)
    if len(shape) == 1 and len(x_shape) >= 2 and shape[0] == x_shape[1]:
        return TensorDesc(dtype, x_shape, tuple(1 if i == 1 else 0 for i in range(len(x_shape))))
    raise ValidationError(name, f"must have the input's {len(x_shape)} dimensions (sizes 1 "
                          f"or the input's {tuple(x_shape)}), or be 1-D with one value per "
                          f"channel (x.shape[1]), got shape {shape}")


def batch_normalization(x, mean, variance, scale, bias, *, epsilon=1e-5,
                        fused_activation=None, spatial=True, device=None):
    """Inference batch normalization, ``DML_BATCH_NORMALIZATION_OPERATOR_DESC``:
    ``fused_activation(scale * (x - mean) / sqrt(variance + epsilon) + bias)``.

    ``x``: float32 or float16, 1 to 8 dimensions.  Each statistic has the input's
    dimension count with sizes 1 (broadcast) or the input's, or is ONNX
    BatchNormalization's 1-D per-channel form (``x.shape[1]`` values); all of ``x``'s
    dtype.  ``fused_activation``: None, an activation name ("relu", "leaky_relu", ...)
    or descriptor (its tensors None).  The result has ``x``'s shape and dtype.
    """
    dev = pick_device(device, x, mean, variance, scale, bias)
    x = as_array(x, "x")
    stats = [as_array(a, n) for a, n in ((mean, "mean"), (variance, "variance"),
                                         (scale, "scale"), (bias, "bias"))]
    dtype = np.dtype(x.dtype)
    descs = [_statistic_desc(a, n, x.shape, np.dtype(a.dtype))
             for a, n in zip(stats, ("mean", "variance", "scale", "bias"))]
    t = TensorDesc(dtype, tuple(x.shape))
    try:
        act = activation_desc(fused_activation)
    except ValidationError as exc:
        raise ValidationError("fused_activation", exc.rule) from None
    desc = BatchNormalizationOperatorDesc(t, *descs, t, spatial=spatial,
                                          epsilon=as_real(epsilon, "epsilon"),
                                          fused_activation=act)
    return run(dev, desc, [x] + stats)

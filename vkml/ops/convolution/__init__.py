"""Convolution: ``DML_CONVOLUTION_OPERATOR_DESC`` and ``vkml.convolution``.

Every configuration goes through :class:`Geometry`, the descriptor reduced to three
spatial dimensions (1-D and 2-D convolutions get leading spatial dimensions of size 1)
with the element strides of each tensor.  A *path* turns a geometry into dispatches.
Which paths can run a geometry is decided by the device's features and limits
(texel-buffer sizes, subgroup shuffles and full subgroups, 16-bit storage); which of them
runs is decided by the tuner (:mod:`vkml.tuning`, tunable path ``convolution``: candidates
are paths with their knobs, timed on the device per shape class).  With ``VKML_TUNE=off``
it is the first path in :data:`PATHS` that accepts and prefers the geometry, with the
knobs measured on lavapipe (``DEFAULT_KNOBS``); never a device type, vendor or name:

=============  ==========================================================================
winograd       3x3, stride 1, one group, >= 16 channels, >= 32 output tiles: F(4x4, 3x3)
               transforms around 36 GEMMs (``convolution_winograd.comp``); where gemm_sg
               can run the shape only from 64 channels and 49 tiles up (``prefers``).
               Its GEMMs run with a subgroup's lanes along output channels (the
               ``gemm_cl`` pass of ``convolution_winograd.comp``: ``winograd`` where the
               device has full subgroups with shuffles, ``winograd-cl``), else on
               ``convolution_gemm.comp`` (``winograd``, ``-gemm``, ``-narrow``), on
               gemm_sg's variant of it (``winograd-sg``) or on ``blocked``'s.
depthwise      group count = input channels (any multiplier, stride, dilation): R rows x
               NB pixels per invocation, input read in place (``convolution_depthwise``).
gemv           1x1 kernels over 1x1 planes (squeeze-excitation's fully connected layers),
               float32, devices with subgroup shuffles and full subgroups: the input
               channels split over a subgroup's lanes, summed by shuffles
               (``convolution_gemv.comp``).
gemm_sg        devices with subgroup shuffles and full subgroups of a required size
               (``computeFullSubgroups``): the implicit GEMM below, but the filter
               is read in place through its DML strides and shared across a subgroup by
               shuffles -- no re-laid filter per execution (SGW variants).
gemm           dense forward convolutions (>= 4 output channels per group) and transposed
               ones, one dispatch per stride phase (no inserted zeros): an implicit GEMM
               on zero-padded float32 planes (``convolution_gemm.comp`` after
               ``convolution_relayout.comp``); 1x1 convolutions read the input in place.
direct         everything else: any layout, both directions and modes, groups
               (``convolution_direct.comp``, one output per invocation).
tiled          (tuner only) forward convolutions as a shared-memory tiled implicit GEMM,
               the GPU libraries' design (``convolution_tiled.comp``): TM x TN tiles, TK
               input channels a stage, float4 register blocks; float16 arithmetic for
               float16 tensors where the device has ``shaderFloat16`` (``tiled-f16``).
blocked        (tuner only) forward convolutions as an in-place implicit GEMM with small
               register blocks frozen into the module (``convolution_blocked.comp``), for
               drivers that do not fold specialization constants (SwiftShader); its GEMM
               variant runs Winograd's 36 GEMMs in ``winograd-blocked``.
=============  ==========================================================================

Files: ``geometry.py`` (:class:`Geometry`, the :class:`Path` base class, the knobs, the
in-place GEMMs' bindings), ``plan.py`` (dispatches as data), one file per path
(``winograd.py``, ``depthwise.py``, ``gemm_sg.py``, ``gemm.py`` with the re-layouts and
register blocks the GEMMs share, ``direct.py``, ``tiled.py``, ``blocked.py``),
``choice.py`` (the candidates, the heuristic, :func:`choose_path`, the tunable path),
``windows.py`` (tensors beyond maxStorageBufferRange: windows of the batch on the path a
window gets, where the whole tensors would leave only direct); this file:
:class:`CompiledConvolution` (owned filters, below) and the functional form.

Every path takes float32 and float16 (packed float16 where the device lacks 16-bit
storage), accumulates in float32, adds the bias and applies the fused activation in the
kernel that stores the output.  gemm and winograd re-lay (transform) the filter per
execution, since DML binds it at execution; gemm_sg, depthwise and direct read it where
it is.

Owned filters: a filter tensor flagged ``DML_TENSOR_FLAG_OWNED_BY_DML`` is bound once, by
:meth:`CompiledConvolution.initialize` (``IDMLOperatorInitializer``; a graph's
``initialize`` hands its constants to each node), and binding it at execution is a
ValidationError, as the flag's page says ("DirectML makes a copy of the tensor data during
initialization ... This allows DirectML to perform reformatting of the tensor data into
other, more efficient forms").  gemm and winograd run the filter re-layout / transform
then, into the buffer the operator owns, and their executions skip those dispatches; the
other paths (and any other owned input) get a copy.

Non-finite filters: Winograd's transforms add and subtract filter values, so an
infinite weight gives NaN (inf - inf) where the page's sum gives +-inf.  An OWNED filter
is read once at initialization and, holding an infinity or NaN, runs on the path the
operator would take without Winograd (a pooling Winograd absorbed then runs apart,
:class:`PoolingApart`).  A filter bound at execution is not read on the host (that would
cost a device round trip per execution): Winograd then returns NaN where such a weight
meets the input, as cuDNN's Winograd algorithms do; ONNX Runtime's and PyTorch's CPU
convolutions give +-inf there, as every other path does.  Where a tap with an infinite
weight meets the padding, the paths that multiply zero-padded input (gemm, gemm_sg, tiled,
blocked: 0 x inf = NaN, as an im2col GEMM does) give NaN there, direct (which skips
padded taps) the float64 reference's value.

Paths plan: a path's constructor decides its dispatches (``plan.py``: kernel variant and
constants, grid, bindings by role, push constants and parameter blocks by member name,
:func:`vkml.runtime.blocks.pack`) and ``encode`` records them; gemm_sg is gemm's plan with
its own hooks (``gemm_sg.py``).

Why the kernels look as they do (operands through texel buffers, unrolled register
blocks indexed by constants, few loop-carried sums, vec4 storage stores, index math per
workgroup): lavapipe's costs, in docs/DEVELOPING.md ("Facts about lavapipe"); the
measurements behind the paths' choices are in bench/RESULTS.md ("Kernel design").
"""
from __future__ import annotations

import numpy as np

from ...dml.activations import activation as activation_desc
from ...dml.convolution import ConvolutionDirection, ConvolutionMode, ConvolutionOperatorDesc
from ...dml.operator import as_tuple, as_uint, enum_of
from ...dml.tensor_desc import TensorDesc
from ...errors import UnsupportedError, ValidationError
from ...tensor import Tensor
from ..base import CompiledOperator, implements
from ..functional import as_array, pick_device, run
from ..owned import device_copy, initializer_inputs, owned_slots, refuse_owned_at_execution
from . import blocked, depthwise, direct, gemm, gemm_sg, gemv, tiled, winograd
# Each name below lives in the file of its path; the package re-exports what tests and
# tools name as ``vkml.ops.convolution.<name>``.
from .choice import (CANDIDATES, PATHS, TUNABLE, choose_path, desc_of_shape, heuristic,
                     shape_class, shape_from_workload, tuning_shape)
from .depthwise import DepthwisePath
from .direct import DirectPath
from .gemm import FilterTranspose, GemmPath, subgroup_shuffle_size
from .gemm_sg import GemmSgPath
from .geometry import DEFAULT_KNOBS, Geometry, Path
from .blocked import BLOCKS, BlockedPath
from .tiled import TILES, TiledPath
from .winograd import PooledConvolutionDesc, WinogradPath, pool_rule
from .epilogue import input_scale_of, residual_of, without_input_scale
from .windows import WindowedPath, windowed_path
from ...intmath import ceil_div

__all__ = ["convolution"]

#: Kernel variants the package requests (each path's module lists its own) and the
#: specialization constants it sets.
VARIANTS = {**direct.VARIANTS, **gemm.VARIANTS, **gemm_sg.VARIANTS, **winograd.VARIANTS,
            **depthwise.VARIANTS, **tiled.VARIANTS, **blocked.VARIANTS, **gemv.VARIANTS}


@implements(ConvolutionOperatorDesc)
class CompiledConvolution(CompiledOperator):
    """Chooses a path for the descriptor on this device (see the module doc).

    ``owned_inputs``: the input slots (0 input, 1 filter, 2 bias) whose tensors carry
    ``DML_TENSOR_FLAG_OWNED_BY_DML``; they are bound by :meth:`initialize`, not at
    execution (see "Owned filters" in the module doc).  ``path``: see
    :func:`choose_path` (a candidate name forces it; UnsupportedError where it does not
    take the geometry).  ``pool``: a pooling descriptor that alone reads the output
    (a graph's fusion): where the chosen path absorbs it (winograd an LP pooling,
    :func:`pool_rule`; gemm_sg a global average, ``epilogue.global_pool_rule``),
    the operator stores the pooled output and ``desc`` becomes a
    :class:`PooledConvolutionDesc` (its ``outputs()``: the pooling's); else it runs the
    convolution alone (``desc`` unchanged).  ``residual``: an
    :class:`~.epilogue.EpilogueConvolutionDesc` of this convolution with a ``residual``
    (a graph's fusion, ``epilogue.py``): where the path the operator takes adds one
    (``Path.RESIDUAL``), ``desc`` becomes it (a fourth input, the residual, and its
    output); else the convolution runs alone (``desc`` unchanged).  ``input_from_host``:
    the caller will write the input through :meth:`host_input` (a graph's "host input"),
    so the tuner times the candidates without the input's relayout, as they will run."""

    INPUT_NAMES = ("input", "filter", "bias")

    def __init__(self, device, desc, path: str | None = None, pool=None, residual=None,
                 input_from_host: bool = False):
        #: None: the tuner's or the heuristic's choice; a name of :data:`CANDIDATES`
        #: (a path name: that path, default knobs) forces it (tests, the tuner).
        self.force = path
        self.input_from_host = input_from_host
        self._offered_pool = pool           # (read by build, which the base class calls)
        self._offered_residual = residual
        super().__init__(device, desc)

    def build(self) -> None:
        plain = self.desc
        if self._offered_residual is not None:
            # built for the residual first (the tuner's shape is the same: the choice
            # too); a path without residual variants is built again for the convolution
            self.desc = self._offered_residual
        self.geometry = Geometry.of(self.desc)
        self.path = self._choose()
        if self.desc is not plain and not self.path.RESIDUAL:
            self.desc = plain
            self.geometry = Geometry.of(plain)
            self.path = self._choose()
        if input_scale_of(self.desc) is not None and not self.path.takes_scale:
            self._scale_apart()
        if getattr(self.path, "pool", None) is not None:
            self.desc = PooledConvolutionDesc(self.desc, self.path.pool)
        self.owned_inputs = owned_slots(self.desc.inputs())
        self._persistent: dict = {}        # slot -> Tensor (not owning) bound in its place

    def _scale_apart(self, avoid: tuple = ()) -> None:
        """The chosen path does not multiply by the input scale: the path for the
        descriptor without it (``avoid``: as :func:`choose_path`'s), after the multiply
        (:class:`ScaleApart`); the operator's descriptor (its inputs) keeps the scale."""
        scaled = self.desc
        self.desc = without_input_scale(scaled)
        try:
            self.geometry = Geometry.of(self.desc)
            path = (choose_path(self, self.geometry, self.force, avoid=avoid) if avoid
                    else self._choose())
        finally:
            self.desc = scaled
        self.path = ScaleApart(self, path)

    def _choose(self):
        """The path: windows of the batch on the path a window gets where the tensors
        exceed maxStorageBufferRange (``windows.py``; the convolution then runs apart
        from an offered pooling), else :func:`choose_path`."""
        windowed = windowed_path(self, self.geometry, self.force)
        if windowed is not None:
            return windowed
        return choose_path(self, self.geometry, self.force, pool=self._offered_pool)

    # -- DML_TENSOR_FLAG_OWNED_BY_DML ----------------------------------------------------
    def initialize(self, inputs=None, **named) -> None:
        """``IDMLOperatorInitializer`` for this operator: bind the OWNED_BY_DML inputs once,
        by slot (``initialize({1: w})``, ``initialize([None, w, None])``) or by name
        (``initialize(filter=w)``), each a Tensor or an array.  A path that re-lays or
        transforms the filter (gemm, winograd) does so now, into a buffer this operator
        owns, and its executions skip those dispatches; every other owned input (and the
        filter of a path that reads it in place) is copied into such a buffer.  Later
        changes to the given tensors do not reach the operator.  May be called again."""
        self._check_live()
        given = dict(inputs) if isinstance(inputs, dict) else (
            {i: v for i, v in enumerate(inputs) if v is not None} if inputs is not None else {})
        for name, value in named.items():
            if name not in self.INPUT_NAMES:
                raise ValidationError(name, f"is not an input of {self.desc.OPERATOR_TYPE} "
                                      f"(those are {', '.join(self.INPUT_NAMES)})")
            given[self.INPUT_NAMES.index(name)] = value
        given = initializer_inputs(self.owned_inputs, given, "inputs")
        descs = self.desc.inputs()
        temps, persistent = [], {}
        with self._lock:
            try:
                with self.ctx.sequence(hold=True) as seq:
                    for i, value in sorted(given.items()):
                        t, temp = device_copy(self.device, value, descs[i], f"inputs[{i}]")
                        if temp:
                            temps.append(t)
                        if i == 1:
                            self._avoid_winograd_if_not_finite(t)
                        persistent[i] = self._initialize_input(seq, i, t)
                    seq.run()
            finally:
                for t in temps:
                    t.free()
            if 1 in persistent and self.path.filter_buffer() is not None:
                self.path.filter_ready = True
            self._persistent = persistent
            # a recorded execution reads the same buffers: the cache stays valid

    def _avoid_winograd_if_not_finite(self, t) -> None:
        """An OWNED filter with an infinity or NaN does not run on a Winograd path: its
        transforms subtract filter values (G g G^T), so an infinite weight becomes
        inf - inf = NaN in outputs where the page's sum (and the direct paths, ONNX
        Runtime's and PyTorch's CPU convolutions) give +-inf.  The operator takes the
        path it would take without Winograd instead (a forced Winograd candidate
        included); its recorded executions are dropped.  A filter bound at execution is
        not read on the host (see "Non-finite filters" in the module doc)."""
        if not self.path.name.startswith("winograd") or _finite_filter(
                t, self.desc.filter_tensor):
            return
        pool = getattr(self.path, "pool", None)
        if isinstance(self.path, ScaleApart):
            self.path.multiply.release()        # (chosen again below)
        if pool is None:
            self.path = choose_path(self, self.geometry, self.force, avoid=("winograd",))
            if residual_of(self.desc) is not None and not self.path.RESIDUAL:
                raise UnsupportedError("residual", f"path {self.path.name} adds no residual")
            if input_scale_of(self.desc) is not None and not self.path.takes_scale:
                self._scale_apart(avoid=("winograd",))
        else:      # the pooling it absorbed runs apart (the operator's output stays pooled)
            pooled, self.desc = self.desc, self.desc.convolution
            try:
                path = choose_path(self, self.geometry, self.force, avoid=("winograd",))
            finally:
                self.desc = pooled
            self.path = PoolingApart(self, path, pool)
        self.drop_recording()

    def _initialize_input(self, seq, i: int, t):
        """Record the initialization of input slot ``i`` from ``t``; the Tensor (not
        owning) that executions bind in its place."""
        d = self.desc.inputs()[i]
        dst = self.path.filter_buffer() if i == 1 else None
        if dst is not None:
            self.path.encode_filter(seq, t.allocation)
        else:
            old = self._persistent.get(i)
            dst = old.allocation if old is not None else self.scratch(
                ceil_div(d.total_tensor_size_in_bytes, 4) * 4)
            seq.copy(t.allocation, dst, [(0, 0, min(dst.size, t.allocation.size))])
        return Tensor(self.device, (dst.size,), np.uint8, dst, max(dst.size,
                      d.total_tensor_size_in_bytes), owner=False)

    def _check_bindings(self, inputs, outputs):
        inputs = list(inputs) if inputs is not None else []
        refuse_owned_at_execution(self.owned_inputs, inputs,
                                  len(self._persistent) == len(self.owned_inputs))
        for i, t in self._persistent.items():
            inputs += [None] * (i + 1 - len(inputs))
            inputs[i] = t
        return super()._check_bindings(inputs, outputs)

    def whole(self, alloc, what: str) -> int:
        """Bytes to bind of a tensor bound whole (refused beyond maxStorageBufferRange)."""
        limit = self.ctx.limits["maxStorageBufferRange"]
        if alloc.size > limit:
            need = {"filter": self.desc.filter_tensor, "bias": self.desc.bias_tensor}[what]
            if need.total_tensor_size_in_bytes > limit:
                raise UnsupportedError("maxStorageBufferRange", f"the {what} tensor is larger "
                                       "than the device can bind")
            return need.total_tensor_size_in_bytes
        return alloc.size

    def host_input(self) -> np.ndarray | None:
        """Where the host may write the input itself: the padded planes the implicit GEMM
        copies it into (``GemmPath.host_input``), as a NumPy view of their mapped memory
        shaped like the input, everything else in them zeroed now; an execution recorded
        with ``record(..., laid=True)`` then reads what was written there last instead of
        its bound input.  None where the path reads the input otherwise (in place, another
        path, a scale multiplied first), the relayout is more than a copy (float16,
        strides) or the planes are not host-visible memory."""
        if not isinstance(self.path, GemmPath):
            return None
        return self.path.host_input(self.desc.input_tensor.sizes)

    def encode(self, seq, inputs, outputs, laid: bool = False) -> None:
        x, w, b = inputs[:3]
        args = (seq, x.allocation, w.allocation, b.allocation if b is not None else None,
                outputs[0].allocation)
        extra = list(inputs[3:])          # a graph's scale, residual (EpilogueConvolutionDesc)
        kw = {}
        if input_scale_of(self.desc) is not None:
            kw["s"] = extra.pop(0).allocation
        if extra:
            kw["r"] = extra.pop(0).allocation
        if laid:
            kw["laid"] = True
        self.path.encode(*args, **kw)

    def release(self) -> None:
        if isinstance(getattr(self, "path", None), PoolingApart):
            self.path.pooling.release()
        if isinstance(getattr(self, "path", None), ScaleApart):
            self.path.multiply.release()
        super().release()


class _Apart:
    """A convolution path (``self.path``) with an operator of its own run beside it: the
    filter is the path's."""

    @property
    def filter_ready(self) -> bool:
        return self.path.filter_ready

    @filter_ready.setter
    def filter_ready(self, value: bool) -> None:
        self.path.filter_ready = value

    def filter_buffer(self):
        return self.path.filter_buffer()

    def encode_filter(self, seq, w) -> None:
        self.path.encode_filter(seq, w)


class PoolingApart(_Apart):
    """A convolution path and the LP pooling it could not absorb, run one after the other
    in one operator: the convolution into a buffer of the operator's, then the pooling
    (``CompiledLpPooling``) into the output.  The path an operator whose Winograd path
    absorbed a pooling takes when an OWNED filter holds infinities or NaNs
    (:meth:`CompiledConvolution._avoid_winograd_if_not_finite`)."""

    def __init__(self, op: CompiledConvolution, path: Path, pool):
        from ..base import compile_operator
        self.path, self.pool, self.device = path, pool, op.device
        self.name, self.candidate = path.name, getattr(path, "candidate", path.name)
        self.pooling = compile_operator(op.device.create_operator(pool))
        n = ceil_div(pool.input_tensor.total_tensor_size_in_bytes, 4) * 4
        self.y = Tensor(op.device, (n,), np.uint8, op.scratch(n), n, owner=False)

    def encode(self, seq, x, w, b, y) -> None:
        self.path.encode(seq, x, w, b, self.y.allocation)
        out = Tensor(self.device, (y.size,), np.uint8, y, y.size, owner=False)
        self.pooling.encode(seq, [self.y], [out])


class ScaleApart(_Apart):
    """A convolution path that does not multiply its input by a graph's input scale
    (``epilogue.py``), after the multiply run apart: ``x * s`` (ELEMENT_WISE_MULTIPLY,
    the unfused graph's node) into a buffer of the operator's, then the path on it."""

    def __init__(self, op: CompiledConvolution, path):
        from ..base import compile_operator
        from ...dml.element_wise import ElementWiseMultiplyOperatorDesc
        x = op.desc.input_tensor
        self.path, self.device = path, op.device
        self.name, self.candidate = path.name, getattr(path, "candidate", path.name)
        self.pool = getattr(path, "pool", None)
        self.multiply = compile_operator(op.device.create_operator(
            ElementWiseMultiplyOperatorDesc(x, input_scale_of(op.desc), x)))
        n = ceil_div(x.total_tensor_size_in_bytes, 4) * 4
        self.x = Tensor(op.device, (n,), np.uint8, op.scratch(n), n, owner=False)

    def encode(self, seq, x, w, b, y, s=None, **kw) -> None:
        def t(a):
            return Tensor(self.device, (a.size,), np.uint8, a, a.size, owner=False)
        self.multiply.encode(seq, [t(x), t(s)], [self.x])
        self.path.encode(seq, self.x.allocation, w, b, y, **kw)

    def __getattr__(self, name):
        if name == "path":          # (not set yet: no recursion)
            raise AttributeError(name)
        return getattr(self.path, name)


def _finite_filter(t, d: TensorDesc) -> bool:
    """Whether every element of filter tensor ``t`` (described by ``d``) is finite."""
    dtype = np.float32 if d.data_type.size == 4 else np.float16
    raw = t.read_bytes(d.total_tensor_size_in_bytes)
    raw = raw[:raw.size - raw.size % d.data_type.size].view(dtype)
    elems = np.lib.stride_tricks.as_strided(
        raw, d.sizes, [s * d.data_type.size for s in d.element_strides], writeable=False)
    return bool(np.isfinite(elems).all())


# -- functional form ----------------------------------------------------------------------
def _desc_of(x, name: str) -> TensorDesc:
    try:
        return TensorDesc(np.dtype(x.dtype), tuple(x.shape))
    except ValidationError as exc:
        raise ValidationError(name, exc.rule) from None


def convolution(x, filter, bias=None, *, strides=None, dilations=None, start_padding=None,  # noqa: A002
                end_padding=None, output_padding=None, group_count=1,
                mode="cross_correlation", direction="forward", fused_activation=None,
                device=None):
    """``DML_CONVOLUTION_OPERATOR_DESC``: convolve ``x`` (N, C_in, *spatial; 1 to 3
    spatial dimensions) with ``filter``.

    ``direction="forward"``: filter (C_out, C_in/group_count, *kernel).
    ``direction="backward"`` (transposed convolution, ONNX ConvTranspose): filter
    (C_in, C_out/group_count, *kernel); output size per dimension
    ``(in-1)*stride + dilation*(k-1) + 1 - start - end + output_padding``.
    ``mode="convolution"`` flips the kernel along every spatial axis.  ``bias``: (C_out,)
    or (1, C_out, 1, ...).  ``fused_activation``: None, a name ("relu", "leaky_relu", ...)
    or a ``vkml.dml`` activation descriptor with its parameters; it is applied inside the
    convolution kernel.  Per-dimension arguments: a sequence, an int for every dimension,
    or None for the neutral value.
    """
    dev = pick_device(device, x, filter, bias)
    x = as_array(x, "x")
    filter = as_array(filter, "filter")  # noqa: A001
    bias = as_array(bias, "bias", optional=True)
    group_count = as_uint(group_count, "group_count", 1)
    xd = _desc_of(x, "x")
    fd = _desc_of(filter, "filter")
    n = max(xd.dimension_count - 2, 0)
    args = {name: as_tuple(v, neutral, n, name) for name, v, neutral in (
        ("strides", strides, 1), ("dilations", dilations, 1), ("start_padding", start_padding, 0),
        ("end_padding", end_padding, 0), ("output_padding", output_padding, 0))}
    mode_e = enum_of(ConvolutionMode, mode, "mode", "DML_CONVOLUTION_MODE_")
    dir_e = enum_of(ConvolutionDirection, direction, "direction", "DML_CONVOLUTION_DIRECTION_")
    bd = None
    if bias is not None:
        shape = tuple(bias.shape)
        if len(shape) == 1:
            shape = (1, shape[0]) + (1,) * n
        try:
            bd = TensorDesc(np.dtype(bias.dtype), shape)
        except ValidationError as exc:
            raise ValidationError("bias", exc.rule) from None
    act = activation_desc(fused_activation)
    # Output sizes by the page's formula; where the arguments are inconsistent a
    # placeholder is used and create_operator's validation names the broken rule.
    out_shape = tuple(x.shape)
    if fd.dimension_count == xd.dimension_count >= 3 and all(len(v) == n for v in args.values()):
        probe = ConvolutionOperatorDesc(xd, fd, None, xd, mode_e, dir_e, group_count=max(
            int(group_count), 1), fused_activation=None, **args)
        try:
            out_shape = tuple(max(1, s) for s in probe.expected_output_sizes())
        except (ZeroDivisionError, TypeError):
            pass
    yd = TensorDesc(xd.data_type, out_shape)
    desc = ConvolutionOperatorDesc(xd, fd, bd, yd, mode_e, dir_e, group_count=group_count,
                                   fused_activation=act, **args)
    return run(dev, desc, [x, filter, bias])

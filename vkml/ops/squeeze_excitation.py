"""A squeeze-excitation block's head as one graph node (``glsl/squeeze_excitation.comp``):
the graph compiler's "squeeze excitation" fusion (``vkml/ops/graph.py``, step 1).

The head is three DML nodes: a global average pool (an AVERAGE_POOLING whose window is
the plane, as ONNX GlobalAveragePool lowers, or a REDUCE with the AVERAGE function over
every spatial axis), then two 1x1 convolutions of 1x1 planes, the squeezing one and
the exciting one, each with its fused activation (EfficientNet: SiLU, then sigmoid).  Each
does almost no work; apart they cost three dispatches, and on a CPU driver a dispatch's
own cost is several times that work.  :func:`head_desc` says where the three may run as
one node, :class:`CompiledSqueezeExcitation` runs them in one dispatch: G workgroups an
image (:func:`pool_groups`: one a thread of the device's concurrent width) pool the
planes of their share of the channels, and the last of them to finish, told by an atomic
count, computes both layers while the others end.  One workgroup is
one thread of a CPU driver, so the pools are spread and the layers, a few thousand
products, are not; where the node still costs more than the two dispatches it saves,
the nodes stay apart.  Which is measured:
the tunable path ``squeeze_excitation`` (:data:`TUNED`: "apart" or "fused", timed on
the block's shape and stored per shape like any choice); ``VKML_TUNE=off`` fuses.

The fused node rounds as the three nodes do (float32 sums of products, the average as a
sum over a count) but adds in its own order (planes in order, each layer's products in
input-channel order; four elements of a plane a fetch added pairwise): its results
differ from the unfused graph's by float32 rounding only, not bit for bit.  It is not a
DML operator: it exists inside compiled graphs only, and ``fuse={"squeeze excitation":
False}`` keeps the three nodes."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import runtime, tuning
from ..dml.convolution import ConvolutionOperatorDesc
from ..dml.data_type import DataType
from ..dml.pooling import AveragePooling1OperatorDesc
from ..dml.tensor_desc import TensorDesc
from ..runtime import Bind
from ..runtime.blocks import pack
from .base import CompiledOperator, compile_operator, empty_for, release_all
from .convolution.gemm import subgroup_shuffle_size
from .convolution.epilogue import (EpilogueConvolutionDesc, global_average, input_scale_of,
                                   kernel_activation, residual_of)
from .concurrent_width import concurrent_width
from .grid import pieces
from ..intmath import ceil_div

__all__: list[str] = []     # graph-internal: no functional form

#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = {"squeeze_excitation_f32": ("LOCAL_SIZE_X", "ACT1", "ACT2", "X4", "C", "C1", "W4A",
                                       "W4B", "SG")}
#: Lanes of a workgroup: each pools CG / LANES planes (CG channels a workgroup) and the
#: last workgroup's compute C1 / LANES and C / LANES channels of the layers; one workgroup
#: runs on one thread of a CPU driver whatever its size.
LANES = 64
#: Fewest channels a pooling workgroup takes (a subgroup's worth of lavapipe lanes).
FEWEST_CHANNELS = 8
#: Most squeezed channels: every lane holds them all in registers (an unrolled loop).
MOST_SQUEEZED = 128


def lanes(sg: int, squeezed: int, most: int) -> int:
    """The workgroup's lanes: whole subgroups, as many as the squeezed channels (the
    squeezing layer's lanes, its one turn through the input channels) up to
    :data:`LANES`; a CPU driver runs the pools' and the exciting layer's channels in as
    many turns of a subgroup whatever the lanes."""
    return max(sg, min(ceil_div(squeezed, sg) * sg, min(LANES, most) // sg * sg))


def pool_groups(channels: int, width: int) -> int:
    """Pooling workgroups an image (the kernel's G): one for each workgroup the device
    runs at once (``width``, its measured concurrent width; 0, unknown, counts as 1),
    each of at least :data:`FEWEST_CHANNELS` channels."""
    return max(1, min(max(width, 1), ceil_div(channels, FEWEST_CHANNELS)))


@dataclass(frozen=True)
class SqueezeExcitationDesc:
    """The fused node's descriptor: the three declared nodes' descriptors.  Inputs: the
    pooled tensor, then the squeezing layer's filter and bias, then the exciting layer's
    (a bias may be None); output: the exciting layer's."""

    pool: object               # ReduceOperatorDesc or AveragePooling(1)OperatorDesc
    squeeze: ConvolutionOperatorDesc
    excite: ConvolutionOperatorDesc

    OPERATOR_TYPE = "squeeze excitation"

    def inputs(self):
        return [self.pool.input_tensor, self.squeeze.filter_tensor, self.squeeze.bias_tensor,
                self.excite.filter_tensor, self.excite.bias_tensor]

    def outputs(self):
        return [self.excite.output_tensor]


def _packed_planes(t) -> bool:
    """Whether each (image, channel) plane of ``t`` is one packed run of elements."""
    run = 1
    for size, stride in zip(reversed(t.sizes[2:]), reversed(t.element_strides[2:])):
        if size > 1 and stride != run:
            return False
        run *= size
    return True


def _dense_layer(conv, c_in: int) -> bool:
    """Whether ``conv`` is a fully connected layer of ``c_in`` channels: a forward, one-group
    float32 convolution with a 1x1 filter over 1x1 planes (no padding, stride, dilation
    or output padding to matter), its filter of 2-D or more (out, in) and its bias one
    value a channel, no residual or input scale of a graph fusion."""
    if type(conv) not in (ConvolutionOperatorDesc, EpilogueConvolutionDesc):
        return False
    x, w = conv.input_tensor, conv.filter_tensor
    return (not conv.is_backward and conv.group_count == 1
            and x.data_type == DataType.FLOAT32 and x.sizes[1] == c_in
            and all(s == 1 for s in x.sizes[2:]) and all(s == 1 for s in w.sizes[2:])
            and all(s == 1 for s in conv.output_tensor.sizes[2:])
            and not any(conv.start_padding) and not any(conv.end_padding)
            and not any(conv.output_padding)
            and residual_of(conv) is None and input_scale_of(conv) is None)


def head_desc(device, pool, squeeze, excite) -> SqueezeExcitationDesc | None:
    """The fused node of global average ``pool`` (``epilogue.global_average``) feeding
    convolution ``squeeze`` feeding convolution ``excite`` (the graph has checked that
    each output feeds only the next node, read as written), or None where the kernel does not take them: AVERAGE over
    every spatial axis of a float32 tensor whose planes are packed; both layers dense
    (:func:`_dense_layer`); full subgroups with shuffles on the device
    (:func:`~.convolution.gemm.subgroup_shuffle_size`); at most :data:`MOST_SQUEEZED`
    squeezed channels, within the device's shared memory; the pooled tensor and both
    filters within its texel views.  (An
    AVERAGE_POOLING with no padding has one divisor, the window, whatever
    IncludePadding says.)"""
    if not global_average(pool):
        return None
    x = pool.input_tensor
    if x.dimension_count < 3 or x.data_type != DataType.FLOAT32 or not _packed_planes(x):
        return None
    c = x.sizes[1]
    c1 = squeeze.filter_tensor.sizes[0]
    if not (_dense_layer(squeeze, c) and _dense_layer(excite, c1)
            and excite.output_tensor.sizes[1] == c):
        return None
    lim = device.context.limits
    tensors = (x, squeeze.filter_tensor, excite.filter_tensor)
    sg = subgroup_shuffle_size(device)
    if (not sg or c1 > MOST_SQUEEZED or (c1 + sg) * 4 > lim["maxComputeSharedMemorySize"]
            or any(t.total_tensor_size_in_bytes // (16 if wide else 4)
                   > lim["maxTexelBufferElements"]
                   for t, wide in zip(tensors, whole_texels(x, squeeze, excite)))):
        return None
    return SqueezeExcitationDesc(pool, squeeze, excite)


def whole_texels(x, squeeze, excite) -> tuple[bool, bool, bool]:
    """Which of the input, W1 and W2 the kernel reads as RGBA32F texels (X4, W4A, W4B):
    the input where its elements are whole texels, a filter where its rows (input
    channels) are packed, whole texels and start on one."""
    def rows(w) -> bool:
        return (w.element_strides[1] == 1 and w.sizes[1] % 4 == 0
                and w.element_strides[0] % 4 == 0
                and (w.total_tensor_size_in_bytes // 4) % 4 == 0)
    return ((x.total_tensor_size_in_bytes // 4) % 4 == 0, rows(squeeze.filter_tensor),
            rows(excite.filter_tensor))


class CompiledSqueezeExcitation(CompiledOperator):
    """:class:`SqueezeExcitationDesc` on ``glsl/squeeze_excitation.comp`` (module doc).
    ``groups``: the pooling workgroups an image (None: :func:`pool_groups`)."""

    kernel = "squeeze_excitation_f32"

    def __init__(self, device, desc, groups: int | None = None):
        self.groups = groups
        super().__init__(device, desc)

    def build(self) -> None:
        d = self.desc
        x, sq, ex = d.pool.input_tensor, d.squeeze, d.excite
        plane = math.prod(x.sizes[2:])
        n, c = x.sizes[0], x.sizes[1]
        xs = x.element_strides
        self.x4, *self.w4 = whole_texels(x, sq, ex)
        if self.groups is None:
            self.groups = pool_groups(c, concurrent_width(self.device))
        self.groups = max(1, min(self.groups, c))
        per_group = ceil_div(c, self.groups)
        self.groups = ceil_div(c, per_group)        # (no group without channels)
        acts = [kernel_activation(conv) for conv in (sq, ex)]
        sg = subgroup_shuffle_size(self.device)
        self.pipe = self.ctx.pipelines.variant(self.kernel, {
            "LOCAL_SIZE_X": lanes(sg, sq.filter_tensor.sizes[0], self.workgroup_size),
            "ACT1": acts[0].SPEC.kernel_id if acts[0] is not None else 0,
            "ACT2": acts[1].SPEC.kernel_id if acts[1] is not None else 0,
            "X4": int(self.x4), "C": c, "C1": sq.filter_tensor.sizes[0],
            "W4A": int(self.w4[0]), "W4B": int(self.w4[1]), "SG": sg}, subgroup_size=sg)
        zero = np.zeros(4, np.float32)
        ws1, ws2 = sq.filter_tensor.element_strides, ex.filter_tensor.element_strides
        ys = ex.output_tensor.element_strides
        self.params = self.upload_block(
            self.kernel, "Params",
            size=(plane, ex.output_tensor.sizes[1], int(sq.bias_tensor is not None),
                  int(ex.bias_tensor is not None)),
            pool=(self.groups, per_group, 0, 0),
            xs=(xs[0], xs[1], *(b.element_strides[1] if b is not None else 0
                                for b in (sq.bias_tensor, ex.bias_tensor))),
            ws=(ws1[0], ws1[1], ws2[0], ws2[1]), ys=(ys[0], ys[1], 0, 0),
            act1=acts[0].kernel_parameters() if acts[0] is not None else zero,
            act2=acts[1].kernel_parameters() if acts[1] is not None else zero)
        # the means between the pools and the layers, and each image's count of finished
        # pools (zero between executions: the last group resets it)
        self.means = self.scratch(n * ceil_div(c, 4) * 16)
        self.count = self.upload(np.zeros(n, np.uint32))

    def encode(self, seq, inputs, outputs) -> None:
        x, w1, b1, w2, b2 = (t.allocation if t is not None else None for t in inputs)
        d = self.desc
        r32, rgba = runtime.FORMAT_R32_SFLOAT, runtime.FORMAT_RGBA32_SFLOAT
        binds = [Bind(x, 0, d.pool.input_tensor.total_tensor_size_in_bytes, "r",
                      rgba if self.x4 else r32),
                 Bind(w1, 0, d.squeeze.filter_tensor.total_tensor_size_in_bytes, "r",
                      rgba if self.w4[0] else r32),
                 Bind(b1, 0, d.squeeze.bias_tensor.total_tensor_size_in_bytes) if b1 is not None
                 else Bind(self.params),
                 Bind(w2, 0, d.excite.filter_tensor.total_tensor_size_in_bytes, "r",
                      rgba if self.w4[1] else r32),
                 Bind(b2, 0, d.excite.bias_tensor.total_tensor_size_in_bytes) if b2 is not None
                 else Bind(self.params),
                 Bind(outputs[0].allocation, 0,
                      d.excite.output_tensor.total_tensor_size_in_bytes, "w"),
                 Bind(self.params), Bind(self.means, 0, None, "rw"),
                 Bind(self.count, 0, None, "rw")]
        mz = self.ctx.limits["maxComputeWorkGroupCount"][2]
        for n0, nn in pieces(d.pool.input_tensor.sizes[0], mz):
            seq.dispatch(self.pipe, binds, (self.groups, 1, nn),
                         pack(self.kernel, "push", n0=n0))


# -- the tunable path ``squeeze_excitation`` (module doc) -------------------------------
def tuning_shape(desc: SqueezeExcitationDesc) -> dict:
    """The tuner's shape of a fused head: images, channels, squeezed channels, plane."""
    x = desc.pool.input_tensor
    return {"n": int(x.sizes[0]), "c": int(x.sizes[1]),
            "c1": int(desc.squeeze.filter_tensor.sizes[0]),
            "plane": [int(v) for v in x.sizes[2:]]}


def _shape_class(shape) -> str:
    return (f"n{shape['n']}-c{shape['c']}-c{shape['c1']}-"
            + "x".join(map(str, shape["plane"])))


def _descs(shape) -> tuple:
    """:func:`tuning_shape`'s inverse: packed float32 (pool, squeeze, excite) descriptors
    (a RELU and a SIGMOID fused: the activations cost alike)."""
    n, c, c1, plane = shape["n"], shape["c"], shape["c1"], tuple(shape["plane"])
    ones = (1,) * len(plane)
    f32 = DataType.FLOAT32
    x, p = TensorDesc(f32, (n, c) + plane), TensorDesc(f32, (n, c) + ones)
    h = TensorDesc(f32, (n, c1) + ones)
    pool = AveragePooling1OperatorDesc(x, p, strides=ones, window_size=plane,
                                       start_padding=(0,) * len(plane),
                                       end_padding=(0,) * len(plane), dilations=ones)
    w1, b1 = TensorDesc(f32, (c1, c) + ones), TensorDesc(f32, (1, c1) + ones)
    w2, b2 = TensorDesc(f32, (c, c1) + ones), TensorDesc(f32, (1, c) + ones)
    squeeze = ConvolutionOperatorDesc(p, w1, b1, h, fused_activation="relu")
    excite = ConvolutionOperatorDesc(h, w2, b2, p, fused_activation="sigmoid")
    return pool, squeeze, excite


def _run(device, seq, cand, shape):
    """Record candidate ``cand`` for ``shape`` into ``seq`` on fresh tensors: "apart",
    the three operators one after the other; "fused", the one node."""
    descs = _descs(shape)
    made: list = []
    try:
        if cand.name == "apart":
            ops = [compile_operator(device.create_operator(d)) for d in descs]
            made += ops
            x = empty_for(device, descs[0].input_tensor)
            made.append(x)
            for op, d in zip(ops, descs):
                weights = [empty_for(device, t) for t in d.inputs()[1:] if t is not None]
                made += weights
                y = empty_for(device, d.outputs()[0])
                made.append(y)
                op.record(seq, [x] + weights, [y])
                x = y
        else:
            desc = head_desc(device, *descs)
            if desc is None:
                raise tuning.Declined("the kernel does not take the shape")
            op = CompiledSqueezeExcitation(device, desc)
            made.append(op)
            ins = [empty_for(device, t) for t in desc.inputs()]
            made += ins
            made.append(empty_for(device, desc.outputs()[0]))
            op.record(seq, ins, [made[-1]])
    except BaseException:
        release_all(made)
        raise
    return lambda: release_all(made)


#: The tunable path ``squeeze_excitation`` (module doc): "fused" is the ``VKML_TUNE=off``
#: answer (one dispatch for three).
TUNED = tuning.register_path("squeeze_excitation", ["fused", "apart"], "fused", _shape_class,
                             _run)

"""``vkml.onnx``: an ONNX backend (``onnx.backend.base.Backend``) running models on a vkml device.

    import vkml.onnx
    rep = vkml.onnx.prepare("model.onnx", device="VKML:0")   # or a vkml.Device
    (y,) = rep.run([x])
    rep.partitions     # [("host", [("pads_concat", "Concat"), ...]), ("device", [...]), ...]

How a model runs (``prepare``):

1. The model is parsed (a path, bytes or a ``ModelProto``) and checked with
   ``onnx.checker``; a malformed or truncated model raises :class:`vkml.ValidationError`
   whose field is ``"model"`` and whose rule says what is wrong.
2. Nodes whose inputs are all constant (initializers, ``Constant``, and what is computed
   from them: the ``Constant/ConstantOfShape/Concat/Reshape/Slice/Cast`` chains
   ``torch.onnx.export`` writes for ``Pad``'s pads) are evaluated once by ONNX's own
   reference evaluator (``onnx.reference.ReferenceEvaluator``) and become constants.
3. Every other node is placed: on the device when :data:`DEVICE_OPS` has a lowering for its
   op type and its data types (the activations, :data:`ACTIVATION_OPS`, as DML's
   activation operators, float32/float16; :data:`HOST_ACTIVATIONS` lists what DML cannot
   express); else on the host (the reference evaluator), between device partitions, as
   ONNX Runtime does with nodes its GPU providers lack.  ``prepare(model, strict=True)``
   instead raises :class:`vkml.UnsupportedError` naming the node and its op type.
   Consecutive nodes with the same placement form a partition (``rep.partitions``).
4. Device partitions whose input shapes the model declares (and whose parameter inputs
   are constants) are compiled at once, so ``rep.partitions`` shows what the graph
   compiler fused ("Relu (fused into Conv)", "Pad (folded into Conv)").

A device partition is lowered, for its input shapes (and the values of its parameter
inputs, e.g. ``Pad``'s pads), into :class:`Step` s (a ``vkml.dml`` descriptor, input and
output value names) and from them into one ``vkml.dml.GraphDesc``: values passed between
steps are intermediate edges, the partition's inputs graph inputs -- constants
(initializers, folded values) marked ``DML_TENSOR_FLAG_OWNED_BY_DML`` and bound once --
and its outputs graph outputs.  :class:`GraphExecutor` compiles it with
``Device.compile_graph`` (which fuses an activation into the convolution before it and a
zero padding into the convolution or LP pooling after it: the one place that fuses, see
``vkml/ops/graph.py``) and replays its command buffer on later runs with the same shapes.
When the device cannot run a partition (``UnsupportedError`` at compile, e.g. float64
arithmetic on SwiftShader, or an ONNX case vkml has no descriptor for, such as a negative
(cropping) Pad) it runs on the host instead and is listed in ``rep.fallbacks``; with
``strict=True`` that raises :class:`vkml.UnsupportedError`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

import onnx  # the ONNX package (absolute import: this module is vkml.onnx)
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep

from . import dml
from .device import Device
from .errors import UnsupportedError, ValidationError
from .tensor import Tensor
from .intmath import ceil_div

__all__ = ["VkmlBackend", "VkmlRep", "Step", "GraphExecutor", "DEVICE_OPS", "ACTIVATION_OPS",
           "HOST_ACTIVATIONS", "prepare", "run_model", "run_node", "supports_device"]

#: Ops whose nodes run on the host even when all their inputs are constant (not folded).
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                     "Multinomial", "Bernoulli"}


class _HostFallback(Exception):
    """Raised by a lowering: this node, with these values, has no vkml descriptor."""


@dataclass
class Step:
    """One device operation: ``desc`` (a vkml.dml descriptor, or None for an alias: the
    output is the input tensor, e.g. Identity) reading ``inputs`` and writing ``outputs``
    (value names; None for an absent optional tensor).  A tensor is bound as raw memory,
    so a descriptor may view it with other sizes of the same element count (LpPool 1-D
    runs as 2-D with a trailing 1)."""

    desc: object
    inputs: list
    outputs: list
    origin: int = -1            # the ONNX node's index in its partition


# -- lowering helpers -------------------------------------------------------------------------

def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def _tdesc(shape, dtype) -> dml.TensorDesc:
    return dml.TensorDesc(dml.DataType.of(np.dtype(dtype)), tuple(int(s) for s in shape))


def _auto_pads(auto_pad, sizes, kernel, strides, dilations, pads):
    """Start and end paddings of Conv/LpPool (ONNX's auto_pad rules)."""
    n = len(sizes)
    auto_pad = _s(auto_pad or "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        start, end = [], []
        for i in range(n):
            out = ceil_div(sizes[i], strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - sizes[i])
            small = total // 2
            if auto_pad == "SAME_UPPER":
                start.append(small), end.append(total - small)
            else:
                start.append(total - small), end.append(small)
        return start, end
    if auto_pad == "VALID":
        return [0] * n, [0] * n
    pads = list(pads or [0] * (2 * n))
    return pads[:n], pads[n:]


class _Lowering:
    """Lowers the nodes of one device partition for concrete shapes: ``infos`` maps value
    names to (shape, dtype); ``values`` gives host values of parameter inputs."""

    def __init__(self, values: dict, infos: dict):
        self.values = values
        self.infos = infos
        self.steps: list[Step] = []
        self.origin = -1            # the index (in the partition) of the node being lowered

    def param(self, node, i, default=None):
        if i >= len(node.input) or not node.input[i]:
            return default
        return np.asarray(self.values[node.input[i]])

    def info(self, name):
        return self.infos[name]

    def emit(self, desc, inputs, outputs, out_infos):
        self.steps.append(Step(desc, list(inputs), list(outputs), self.origin))
        for name, inf in zip(outputs, out_infos):
            self.infos[name] = inf


def _lower_pad(lw: _Lowering, node):
    shape, dtype = lw.info(node.input[0])
    rank = len(shape)
    a = _attrs(node)
    mode = _s(a.get("mode", "constant"))
    if "pads" in a:                                 # opset 2: attributes
        pads, value, axes = list(a["pads"]), a.get("value", 0.0), None
    else:
        pads = [int(p) for p in lw.param(node, 1).reshape(-1)]
        v = lw.param(node, 2)
        value = v.reshape(-1)[0].item() if v is not None and v.size else 0
        ax = lw.param(node, 3)
        axes = None if ax is None else [int(x) for x in ax.reshape(-1)]
    axes = list(range(rank)) if axes is None else [x + rank if x < 0 else x for x in axes]
    k = len(axes)
    if len(pads) != 2 * k:
        raise ValidationError(f"{node.op_type} {node.name!r}: pads", f"must have 2 x {k} "
                              f"entries (one begin and one end per axis), got {len(pads)}")
    start, end = [0] * rank, [0] * rank
    for j, ax in enumerate(axes):
        start[ax], end[ax] = pads[j], pads[j + k]
    if min(start + end) < 0:
        raise _HostFallback("negative pads (cropping): DML_PADDING takes UINT paddings")
    modes = {"constant": dml.PaddingMode.CONSTANT, "reflect": dml.PaddingMode.REFLECTION,
             "edge": dml.PaddingMode.EDGE, "wrap": dml.PaddingMode.WRAP}
    if mode not in modes:
        raise ValidationError(f"Pad {node.name!r}: mode", f"must be one of {sorted(modes)}, "
                              f"got {mode!r}")
    dt = np.dtype(dtype)
    value = np.array(value).astype(dt).item()       # ONNX: constant_value has x's type
    out_shape = tuple(s + b + e for s, b, e in zip(shape, start, end))
    desc = dml.Padding1OperatorDesc(
        _tdesc(shape, dt), _tdesc(out_shape, dt), modes[mode], dml.DataType.of(dt), value,
        tuple(start), tuple(end))
    lw.emit(desc, [node.input[0]], [node.output[0]], [(out_shape, dt)])


def _lower_conv(lw: _Lowering, node):
    (xs, dt), (ws, _) = lw.info(node.input[0]), lw.info(node.input[1])
    has_bias = len(node.input) > 2 and bool(node.input[2])
    a = _attrs(node)
    n = len(xs) - 2
    kernel = list(ws[2:])
    strides = list(a.get("strides", [1] * n))
    dil = list(a.get("dilations", [1] * n))
    group = int(a.get("group", 1))
    transposed = node.op_type == "ConvTranspose"
    if not transposed:
        start, end = _auto_pads(a.get("auto_pad"), xs[2:], kernel, strides, dil, a.get("pads"))
        out_pad = [0] * n
        c_out = ws[0]
    else:
        out_pad_attr = list(a.get("output_padding", [0] * n))
        auto_pad = _s(a.get("auto_pad", "NOTSET"))
        out_shape = list(a.get("output_shape", []))[-n:] if "output_shape" in a else None
        full = [(xs[2 + i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 for i in range(n)]
        if out_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out_shape = [xs[2 + i] * strides[i] for i in range(n)]
        if out_shape is not None:
            # ONNX: total_padding = stride*(in-1) + output_padding + ((k-1)*d+1) - output_shape
            start = []
            for i in range(n):
                total = full[i] + out_pad_attr[i] - out_shape[i]
                start.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        else:
            pads = list(a.get("pads", [0] * (2 * n)))
            start = pads[:n]
            out_shape = [full[i] + out_pad_attr[i] - pads[i] - pads[n + i] for i in range(n)]
        if min(start) < 0:
            raise _HostFallback("a negative start padding (output_shape larger than the "
                                "transposed convolution at its start)")
        # DML: out = full - start - end + output_padding, the added positions holding what
        # the transposed convolution puts there: only start and the total size matter.
        end, out_pad = [], []
        for i in range(n):
            rem = full[i] - start[i] - out_shape[i]
            end.append(max(rem, 0)), out_pad.append(max(-rem, 0))
        c_out = ws[1] * group
    bias = None
    if has_bias:
        bias = _tdesc((1, c_out) + (1,) * n, dt)
    desc = dml.ConvolutionOperatorDesc(
        _tdesc(xs, dt), _tdesc(ws, dt), bias, _tdesc((1, 1) + (1,) * n, dt),  # output: below
        mode=dml.ConvolutionMode.CROSS_CORRELATION,
        direction=(dml.ConvolutionDirection.BACKWARD if transposed
                   else dml.ConvolutionDirection.FORWARD),
        strides=tuple(strides), dilations=tuple(dil), start_padding=tuple(start),
        end_padding=tuple(end), output_padding=tuple(out_pad), group_count=group)
    if min(desc.expected_output_sizes()) < 1:
        raise ValidationError(f"{node.op_type} {node.name!r}", "the output would be empty: "
                              f"{desc.expected_output_sizes()}")
    out_shape = desc.expected_output_sizes()
    desc = replace(desc, output_tensor=_tdesc(out_shape, dt))
    lw.emit(desc, [node.input[0], node.input[1], node.input[2] if has_bias else None],
            [node.output[0]], [(out_shape, dt)])


def _lower_lp_pool(lw: _Lowering, node):
    xs, dt = lw.info(node.input[0])
    a = _attrs(node)
    n = len(xs) - 2
    kernel = list(a["kernel_shape"])
    strides = list(a.get("strides", [1] * n))
    dil = list(a.get("dilations", [1] * n))
    p = a.get("p", 2)
    if float(p) != int(p) or int(p) < 1:
        raise _HostFallback(f"p={p}: DML_LP_POOLING1 takes an integer P >= 1")
    p = int(p)
    start, end = _auto_pads(a.get("auto_pad"), xs[2:], kernel, strides, dil, a.get("pads"))
    if a.get("ceil_mode", 0):
        # ceil_mode: a last window may hang over the end.  ONNX's reference (and torch's
        # lp_pool, both an average pool times the kernel size) scale such a window by
        # kernel size / elements inside; DML_LP_POOLING1 sums the elements it covers.
        # Only where no window hangs over does ceil_mode equal floor on the device.
        for i in range(n):
            span = xs[2 + i] + start[i] + end[i] - ((kernel[i] - 1) * dil[i] + 1)
            if span >= 0 and span % strides[i]:
                out = span // strides[i] + 2
                if (out - 1) * strides[i] < xs[2 + i] + start[i]:
                    raise _HostFallback("ceil_mode with a window hanging over the end (ONNX "
                                        "scales it by kernel size / elements inside; "
                                        "DML_LP_POOLING1 does not)")
    view = list(xs)
    if n == 1:                                      # 1-D: run as 2-D with a trailing 1
        view, kernel, strides, dil = view + [1], kernel + [1], strides + [1], dil + [1]
        start, end = start + [0], end + [0]
    if len(view) not in (4, 5):
        raise _HostFallback(f"{n} spatial dimensions (DML_LP_POOLING1: 2 or 3)")
    out = list(dml.lp_pooling_output_sizes(view, strides, kernel, start, end, dil))
    desc = dml.LpPooling1OperatorDesc(_tdesc(view, dt), _tdesc(out, dt), tuple(strides),
                                      tuple(kernel), tuple(start), tuple(end), tuple(dil), p)
    out_shape = tuple(out[:-1]) if n == 1 else tuple(out)
    lw.emit(desc, [node.input[0]], [node.output[0]], [(out_shape, dt)])


def _lower_col2im(lw: _Lowering, node):
    xs, dt = lw.info(node.input[0])
    image = [int(v) for v in lw.param(node, 1).reshape(-1)]
    block = [int(v) for v in lw.param(node, 2).reshape(-1)]
    a = _attrs(node)
    n = len(image)
    strides = list(a.get("strides", [1] * n))
    dil = list(a.get("dilations", [1] * n))
    pads = list(a.get("pads", [0] * (2 * n)))
    c = xs[1] // max(1, math.prod(block))
    out_shape = (xs[0], c, *image)
    desc = dml.FoldOperatorDesc(_tdesc(xs, dt), _tdesc(out_shape, dt), tuple(block),
                                tuple(strides), tuple(dil), tuple(pads[:n]), tuple(pads[n:]))
    lw.emit(desc, [node.input[0]], [node.output[0]], [(out_shape, dt)])


def _lower_identity(lw: _Lowering, node):
    shape, dt = lw.info(node.input[0])
    if np.dtype(dt) in _FLOATS:                     # DML_ACTIVATION_IDENTITY: a node (a copy)
        return _lower_activation(lw, node)
    lw.emit(None, [node.input[0]], [node.output[0]], [(shape, dt)])   # other types: alias


# -- activations ------------------------------------------------------------------------------

#: THE list of ONNX activation cases that DML cannot express: they run on the host (placed
#: there at ``prepare`` when their parameters are constants, else listed in
#: ``rep.fallbacks`` at ``run``).  Reason key -> why.
HOST_ACTIVATIONS: dict[str, str] = {
    "gelu_tanh": 'Gelu approximate="tanh": DML_ACTIVATION_GELU is the erf form only',
    "refused": "parameters the DML descriptor refuses (its rule, e.g. Celu alpha=0: "
               "DML_ACTIVATION_CELU divides by Alpha; NaN bounds of Clip)",
    "dtype": "a data type other than float32/float16 (the activation operators' only types; "
             "Identity of other types is an alias, on the device)",
    "rank": "more than 8 dimensions (DML tensors have 1 to 8)",
    "empty": "an empty tensor (DML sizes are at least 1)",
}


def _host_activation(key: str, detail: str = "") -> _HostFallback:
    return _HostFallback(HOST_ACTIVATIONS[key] + (f" ({detail})" if detail else ""))


def _clip_bounds(node, a, param):
    if "min" in a or "max" in a:                   # opset 6: attributes
        return a.get("min", -dml.FLT_MAX), a.get("max", dml.FLT_MAX)

    def get(i, default):
        v = param(i)
        return default if v is None else float(np.asarray(v).reshape(-1)[0])
    return get(1, -dml.FLT_MAX), get(2, dml.FLT_MAX)


#: ONNX activation op -> f(attributes) giving (DML activation name, its parameters).
#: Each runs through ``vkml.dml.ACTIVATIONS[name]``: standalone (its tensors set), or fused
#: into the convolution before it by the graph compiler (``Device.compile_graph``).
ACTIVATION_OPS = {
    "Relu": lambda a: ("relu", {}),
    "LeakyRelu": lambda a: ("leaky_relu", {"alpha": a.get("alpha", 0.01)}),
    "Sigmoid": lambda a: ("sigmoid", {}),
    "Tanh": lambda a: ("tanh", {}),
    "HardSigmoid": lambda a: ("hard_sigmoid", {"alpha": a.get("alpha", 0.2),
                                               "beta": a.get("beta", 0.5)}),
    "Elu": lambda a: ("elu", {"alpha": a.get("alpha", 1.0)}),
    "Selu": lambda a: ("scaled_elu", {"alpha": a.get("alpha", 1.67326319217681884765625),
                                      "gamma": a.get("gamma", 1.05070102214813232421875)}),
    "Celu": lambda a: ("celu", {"alpha": a.get("alpha", 1.0)}),
    "Softplus": lambda a: ("softplus", {"steepness": 1.0}),
    "Softsign": lambda a: ("softsign", {}),
    "ThresholdedRelu": lambda a: ("thresholded_relu", {"alpha": a.get("alpha", 1.0)}),
    "Shrink": lambda a: ("shrink", {"bias": a.get("bias", 0.0),
                                    "threshold": a.get("lambd", 0.5)}),
    "Gelu": lambda a: ("gelu", {}),
    "Clip": None,                                  # bounds: attributes or inputs 1, 2
    "Identity": lambda a: ("identity", {}),
}


def _activation_desc(node, param):
    """The vkml.dml activation descriptor (tensors None) for an ONNX activation node;
    ``param(i)`` gives the host value of input i (None: absent).  Raises _HostFallback
    with a :data:`HOST_ACTIVATIONS` reason where DML cannot express it."""
    a = _attrs(node)
    if node.op_type == "Gelu" and _s(a.get("approximate", "none")) != "none":
        raise _host_activation("gelu_tanh")
    if node.op_type == "Clip":
        lo, hi = _clip_bounds(node, a, param)
        name, params = "clip", {"min": lo, "max": hi}
    else:
        name, params = ACTIVATION_OPS[node.op_type](a)
    desc = dml.ACTIVATIONS[name](**params)
    try:
        desc.validate_parameters(desc.fail)
    except ValidationError as exc:
        raise _host_activation("refused", f"{exc.field}: {exc.rule}") from None
    return desc


def _lower_activation(lw: _Lowering, node):
    shape, dt = lw.info(node.input[0])
    if np.dtype(dt) not in _FLOATS:
        raise _host_activation("dtype", str(np.dtype(dt)))
    if len(shape) > 8:
        raise _host_activation("rank", str(len(shape)))
    if 0 in shape:
        raise _host_activation("empty", str(tuple(shape)))
    desc = _activation_desc(node, lambda i: lw.param(node, i))
    t = _tdesc(tuple(shape) or (1,), dt)            # a scalar runs as one element
    lw.emit(desc.standalone(t, t), [node.input[0]], [node.output[0]], [(tuple(shape), dt)])


_FLOATS = {np.dtype(np.float32), np.dtype(np.float16)}
_ALL = {np.dtype(t) for t in ("float32", "float16", "float64", "int8", "int16", "int32",
                              "int64", "uint8", "uint16", "uint32", "uint64")}


@dataclass(frozen=True)
class DeviceOp:
    """How an ONNX op runs on the device: its lowering, the data types of its tensor input
    0 it takes, and which inputs are parameters (read on the host when lowering)."""

    lower: object
    dtypes: frozenset
    params: tuple = ()          # indices of inputs read as host values
    tensors: tuple = (0,)       # indices of inputs bound as device tensors


#: THE list of ONNX ops that run on the vkml device (op type -> DeviceOp).  Activations
#: run as operators of their own (fused into a Conv/ConvTranspose before them by the graph
#: compiler where it is their only consumer); :data:`HOST_ACTIVATIONS` lists what stays on
#: the host.
DEVICE_OPS: dict[str, DeviceOp] = {
    "Pad": DeviceOp(_lower_pad, frozenset(_ALL), params=(1, 2, 3)),
    "Conv": DeviceOp(_lower_conv, frozenset(_FLOATS), tensors=(0, 1, 2)),
    "ConvTranspose": DeviceOp(_lower_conv, frozenset(_FLOATS), tensors=(0, 1, 2)),
    "LpPool": DeviceOp(_lower_lp_pool, frozenset(_FLOATS)),
    "Col2Im": DeviceOp(_lower_col2im, frozenset(_ALL), params=(1, 2)),
    "Identity": DeviceOp(_lower_identity, frozenset(_ALL)),
}
DEVICE_OPS.update({op: DeviceOp(_lower_activation, frozenset(_FLOATS),
                                params=(1, 2) if op == "Clip" else ())
                   for op in ACTIVATION_OPS if op != "Identity"})


# -- executing a device partition: one DML graph ---------------------------------------------

#: Descriptor fields of each input slot (to mark constant inputs OWNED_BY_DML).
_INPUT_FIELDS = {dml.ConvolutionOperatorDesc: ("input_tensor", "filter_tensor", "bias_tensor")}


@dataclass
class _Lowered:
    """A device partition lowered to a DML graph: the GraphDesc; the value names of its
    graph inputs (in order) and which of them are constants (OWNED_BY_DML, with values);
    per graph output its value names; (shape, dtype) of every value; aliases (an output
    that is an input value, e.g. Identity of an int tensor); per graph node the index of
    the ONNX node (in the partition) it comes from."""

    graph: object
    inputs: list
    constants: dict
    outputs: list
    infos: dict
    aliases: dict
    origins: list


def _lower_graph(steps: list, outputs: list, consts: dict, infos: dict) -> _Lowered:
    """Steps -> a ``vkml.dml.GraphDesc``: a step's input read from another step is an
    intermediate edge, else a graph input (OWNED_BY_DML when a constant); the partition's
    outputs (and outputs nothing reads) are graph outputs."""
    alias: dict = {}

    def res(name):
        while name in alias:
            name = alias[name]
        return name

    producer: dict = {}
    nodes, origins, in_names = [], [], []
    in_edges, inter = [], []
    read = set()
    for st in steps:
        if st.desc is None:
            alias[st.outputs[0]] = res(st.inputs[0])
            continue
        i = len(nodes)
        desc = st.desc
        fields = _INPUT_FIELDS.get(type(desc), ("input_tensor",))
        for slot, name in enumerate(st.inputs):
            if not name:
                continue
            name = res(name)
            if name in producer:
                inter.append(dml.IntermediateGraphEdgeDesc(*producer[name], i, slot))
                read.add(producer[name])
                continue
            if name not in in_names:
                in_names.append(name)
            in_edges.append(dml.InputGraphEdgeDesc(in_names.index(name), i, slot))
            if name in consts:
                t = getattr(desc, fields[slot])
                desc = replace(desc, **{fields[slot]: replace(
                    t, flags=dml.TensorFlags.OWNED_BY_DML)})
        for k, name in enumerate(st.outputs):
            producer[name] = (i, k)
        nodes.append(dml.OperatorGraphNodeDesc(desc, name=st.outputs[0]))
        origins.append(st.origin)
    out_of: dict = {}                  # (node, output) -> graph output index
    out_names: list = []
    aliases = {}
    for name in outputs:
        r = res(name)
        if r not in producer:
            aliases[name] = r
            continue
        g = out_of.setdefault(producer[r], len(out_of))
        if g == len(out_names):
            out_names.append([])
        out_names[g].append(name)
    for name, src in producer.items():           # outputs nothing reads: bound anyway
        if src not in read and src not in out_of:
            out_of[src] = len(out_of)
            out_names.append([name])
    graph = None
    if nodes:
        graph = dml.GraphDesc(
            input_count=len(in_names), output_count=len(out_of), nodes=nodes,
            input_edges=in_edges, intermediate_edges=inter,
            output_edges=[dml.OutputGraphEdgeDesc(i, k, g) for (i, k), g in out_of.items()])
    return _Lowered(graph, in_names, {n: consts[n] for n in in_names if n in consts},
                    out_names, infos, aliases, origins)


class GraphExecutor:
    """Runs one lowered device partition: ``device.compile_graph`` (fusion, one arena for
    intermediates, constants bound once), tensors for its inputs and outputs, and
    :meth:`run` (``execute``: one command buffer, replayed while the same tensors are
    bound).  ``fusions``: what the graph compiler fused, as ``(absorbed, into)`` pairs of
    ONNX node indices in the partition."""

    def __init__(self, device: Device, lowered: _Lowered):
        self.device = device
        self.lowered = lw = lowered
        self.compiled = None
        self.staging: dict = {}
        self.out_tensors: list = []
        self.fusions: list = []
        if lw.graph is None:
            return
        try:
            consts = {g: np.asarray(lw.constants[n]) for g, n in enumerate(lw.inputs)
                      if n in lw.constants}
            self.compiled = device.compile_graph(lw.graph, constants=consts or None)
            self.fusions = self._fusions()
            bound = self.compiled.desc.inputs()
            for g, name in enumerate(lw.inputs):
                if name not in lw.constants:
                    shape, dt = lw.infos[name]
                    self.staging[name] = device.empty(
                        shape, dt, nbytes=bound[g].total_tensor_size_in_bytes)
            for d, names in zip(self.compiled.desc.outputs(), lw.outputs):
                shape, dt = lw.infos[names[0]]
                self.out_tensors.append(device.empty(shape, dt,
                                                     nbytes=d.total_tensor_size_in_bytes))
        except BaseException:
            self.release()
            raise

    def _fusions(self) -> list:
        """``CompiledGraph.fusions`` ("nodes[2] (relu) fused into the convolution
        nodes[0, 1]", "the zero padding nodes[0] folded into nodes[1]") as ONNX nodes."""
        import re

        pairs = []
        for text in self.compiled.fusions:
            groups = re.findall(r"nodes\[([\d, ]+)\]", text)
            if len(groups) != 2:
                continue
            absorbed, into = ([self.lowered.origins[int(x)] for x in g.split(",")]
                              for g in groups)
            pairs.append((absorbed, into))
        return pairs

    def run(self, env: dict) -> None:
        lw = self.lowered
        if self.compiled is not None:
            ins = []
            for name in lw.inputs:
                if name in lw.constants:
                    ins.append(None)
                    continue
                v, t = env[name], self.staging[name]
                if (isinstance(v, Tensor) and v.device is self.device and v.dtype == t.dtype
                        and v.nbytes >= t.nbytes):
                    ins.append(v)                  # a previous partition's output
                else:
                    t.write(np.ascontiguousarray(_host(v), dtype=t.dtype))
                    ins.append(t)
            self.compiled.execute(ins, self.out_tensors)
            for t, names in zip(self.out_tensors, lw.outputs):
                for name in names:
                    env[name] = t
        for name, src in lw.aliases.items():
            env[name] = env[src]

    def release(self) -> None:
        if self.compiled is not None:
            self.compiled.release()
            self.compiled = None
        for t in list(self.staging.values()) + self.out_tensors:
            t.free()
        self.staging, self.out_tensors = {}, []


# -- partitions -------------------------------------------------------------------------------

def _node_label(node, index) -> str:
    return node.name or f"{node.op_type}_{index}"


def _subgraph_inputs(node) -> set:
    """Names a node's subgraphs (If/Loop/Scan bodies) read from the enclosing scope."""
    names = set()
    for a in node.attribute:
        graphs = list(a.g and [a.g] or []) + list(a.graphs)
        for g in graphs:
            for n in g.node:
                names.update(i for i in n.input if i)
                names |= _subgraph_inputs(n)
    return names


class _HostPartition:
    where = "host"

    def __init__(self, rep, nodes, inputs, outputs):
        self.rep, self.nodes, self.inputs, self.outputs = rep, nodes, inputs, outputs
        self._evaluator = None

    def evaluator(self):
        if self._evaluator is None:
            from onnx.reference import ReferenceEvaluator
            m = self.rep.model
            g = helper.make_graph(
                [n for n, _ in self.nodes], "vkml_host",
                [helper.make_value_info(i, onnx.TypeProto()) for i in self.inputs],
                [helper.make_value_info(o, onnx.TypeProto()) for o in self.outputs])
            sub = helper.make_model(g, opset_imports=m.opset_import, ir_version=m.ir_version,
                                    functions=m.functions)
            self._evaluator = ReferenceEvaluator(sub, new_ops=_host_ops(m))
        return self._evaluator

    def run(self, env: dict) -> None:
        feeds = {i: _host(env[i]) for i in self.inputs}
        for name, value in zip(self.outputs, self.evaluator().run(None, feeds)):
            env[name] = value


def _host_ops(model) -> list:
    """Replacements for the reference evaluator's kernels where it lacks a case: Pad with
    negative pads (cropping, allowed by the ONNX spec; the reference's ``np.pad`` refuses
    them) crops, then pads with the rest.  Opset 11 and up (pads as an input)."""
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                default=0)
    if opset < 11:
        return []
    from onnx.reference.ops.op_pad import Pad_18

    class Pad(Pad_18):
        op_domain = ""

        def _run(self, data, pads, constant_value=None, axes=None, mode=None):
            pads = np.asarray(pads, dtype=np.int64).reshape(-1)
            if (pads < 0).any():
                rank = data.ndim
                ax = (list(range(rank)) if axes is None else
                      [int(a) + rank if a < 0 else int(a) for a in np.asarray(axes).reshape(-1)])
                k = len(ax)
                index = [slice(None)] * rank
                for j, a in enumerate(ax):
                    index[a] = slice(max(-pads[j], 0), data.shape[a] - max(-pads[j + k], 0))
                data = data[tuple(index)]
                pads = np.maximum(pads, 0)
            return super()._run(data, pads, constant_value, axes, mode)

    return [Pad]


def _host(value):
    return value.numpy() if isinstance(value, Tensor) else value


class _DevicePartition:
    where = "device"

    def __init__(self, rep, nodes, inputs, outputs):
        self.rep, self.nodes, self.inputs, self.outputs = rep, nodes, inputs, outputs
        self._cache: dict = {}
        self.last: GraphExecutor | None = None      # the latest built (its fusions)
        self.host: _HostPartition | None = None     # set when the device could not run it
        params, tensors = [], []
        for node in nodes:
            spec = DEVICE_OPS[node.op_type]
            for i, name in enumerate(node.input):
                if name and name in inputs:
                    (params if i in spec.params else tensors).append(name)
        self.params = list(dict.fromkeys(params))
        self.tensor_inputs = [n for n in dict.fromkeys(tensors) if n not in self.params]

    def labels(self, indices) -> list:
        """(node label, op type) per node; what the latest compiled graph fused says so:
        "Relu (fused into Conv)", "Pad (folded into Conv)"."""
        ops = [n.op_type for n in self.nodes]
        for absorbed, into in (self.last.fusions if self.last is not None else []):
            main = [j for j in into if self.nodes[j].op_type in
                    ("Conv", "ConvTranspose", "LpPool")] or into
            for j in absorbed:
                how = "folded" if self.nodes[j].op_type == "Pad" else "fused"
                ops[j] = f"{self.nodes[j].op_type} ({how} into {self.nodes[main[0]].op_type})"
        return [(_node_label(n, i), op) for n, i, op in zip(self.nodes, indices, ops)]

    def _key(self, env):
        key = []
        for name in self.tensor_inputs:
            v = env[name]
            key.append((name, tuple(v.shape), str(v.dtype)))
        for name in sorted(self.params):
            v = np.asarray(_host(env[name]))
            key.append((name, v.dtype.str, v.shape, v.tobytes()))
        return tuple(key)

    def _build(self, env):
        infos = {n: (tuple(env[n].shape), np.dtype(env[n].dtype)) for n in self.tensor_inputs}
        values = {n: _host(env[n]) for n in self.params}
        lw = _Lowering(values, infos)
        for j, node in enumerate(self.nodes):
            spec = DEVICE_OPS[node.op_type]
            dt = infos[node.input[0]][1]
            if dt not in spec.dtypes:
                raise _HostFallback(f"data type {dt} ({node.op_type} on the device takes "
                                    f"{sorted(map(str, spec.dtypes))})")
            lw.origin = j
            spec.lower(lw, node)
        consts = {n: self.rep.consts[n] for n in self.tensor_inputs if n in self.rep.consts}
        return GraphExecutor(self.rep.device, _lower_graph(lw.steps, self.outputs, consts,
                                                            lw.infos))

    def warm(self, env) -> None:
        """Compile for the shapes the model declares (``prepare``), so that
        ``rep.partitions`` shows what the graph compiler fused; errors wait for ``run``."""
        try:
            key = self._key(env)
            if key not in self._cache:
                self._cache[key] = self.last = self._build(env)
        except Exception:
            pass

    def run(self, env: dict) -> None:
        if self.host is not None:
            return self.host.run(env)
        key = self._key(env)
        ex = self._cache.get(key)
        if ex is None:
            try:
                ex = self._build(env)
            except (_HostFallback, UnsupportedError) as exc:
                names = ", ".join(f"{_node_label(n, i)} ({n.op_type})"
                                  for i, n in enumerate(self.nodes))
                if self.rep.strict:
                    raise UnsupportedError("an operator for " + names, str(exc)) from None
                self.rep.fallbacks.append((names, str(exc)))
                self.last = None                    # the partitions report no fusion
                self.host = _HostPartition(self.rep, [(n, None) for n in self.nodes],
                                           self.inputs, self.outputs)
                return self.host.run(env)
            self._cache[key] = ex
        self.last = ex
        ex.run(env)

    def release(self):
        for ex in self._cache.values():
            ex.release()
        self._cache.clear()
        self.last = None


# -- the backend --------------------------------------------------------------------------

def _load(model) -> onnx.ModelProto:
    """Parse and check ``model`` (ModelProto, bytes, or a path); ValidationError if bad."""
    try:
        if isinstance(model, onnx.ModelProto):
            proto = model
        elif isinstance(model, (bytes, bytearray, memoryview)):
            proto = onnx.ModelProto()
            proto.ParseFromString(bytes(model))
        else:
            with open(model, "rb") as f:
                data = f.read()
            proto = onnx.ModelProto()
            proto.ParseFromString(data)
    except OSError:
        raise
    except Exception as exc:           # protobuf DecodeError and friends
        raise ValidationError("model", f"not a valid ONNX model (protobuf parse failed: "
                              f"{exc})") from None
    try:
        onnx.checker.check_model(proto)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValidationError("model", f"onnx.checker rejects it: {first}") from None
    if not proto.graph.node and not proto.graph.output:
        raise ValidationError("model", "the graph is empty (a truncated or non-ONNX file?)")
    return proto


def _resolve_device(device) -> Device:
    if isinstance(device, Device):
        return device
    if device is None:
        from .device import default_device
        return default_device()
    if isinstance(device, int):
        return Device(device)
    text = str(device).strip()
    up = text.upper()
    if up == "VKML":
        from .device import default_device
        return default_device()
    if up.startswith("VKML:"):
        return _device_by_index(int(text[5:]))
    return Device(text)


_BY_INDEX: dict = {}


def _device_by_index(i: int) -> Device:
    d = _BY_INDEX.get(i)
    if d is None or d._closed:
        d = _BY_INDEX[i] = Device(i)
    return d


class VkmlRep(BackendRep):
    """A prepared model: ``run(inputs)`` -> list of NumPy outputs; ``partitions``,
    ``folded`` (constant-folded nodes), ``fallbacks`` (partitions the device could not
    run, with the reason)."""

    def __init__(self, model: onnx.ModelProto, device: Device, strict: bool):
        self.model = model
        self.device = device
        self.strict = strict
        self.fallbacks: list = []
        g = model.graph
        inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        for sp in g.sparse_initializer:
            inits[sp.values.name] = _sparse_to_dense(sp)
        self.input_names = [i.name for i in g.input if i.name not in inits]
        self.output_names = [o.name for o in g.output]
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:
            inferred = model
        self.types, self.shapes = {}, {}
        for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + \
                list(inferred.graph.output):
            t = vi.type
            if t.HasField("tensor_type") and t.tensor_type.HasField("shape"):
                dims = t.tensor_type.shape.dim
                if all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
                    self.shapes[vi.name] = tuple(int(d.dim_value) for d in dims)
            if t.HasField("tensor_type") and t.tensor_type.elem_type:
                try:
                    self.types[vi.name] = np.dtype(
                        helper.tensor_dtype_to_np_dtype(t.tensor_type.elem_type))
                except Exception:
                    self.types[vi.name] = None
            else:
                self.types[vi.name] = None
        for name, v in inits.items():
            self.types[name] = v.dtype
        self.consts = self._fold(inits)
        self._place()
        self._warm()

    @property
    def partitions(self) -> list:
        """[(where, [(node label, op type), ...]), ...] in execution order; a device
        partition's nodes that its compiled graph fused say so ("Relu (fused into Conv)")."""
        out = []
        for part, (w, items) in zip(self._parts, self._groups):
            idx = [i for i, _ in items]
            if isinstance(part, _DevicePartition):
                out.append((w, part.labels(idx)))
            else:
                out.append((w, [(_node_label(n, i), n.op_type) for i, n in items]))
        return out

    def _warm(self) -> None:
        """Compile the device partitions for the shapes the model declares, when all of
        them are static and known and every parameter input is a constant."""
        env = dict(self.consts)
        for part in self._parts:
            if not isinstance(part, _DevicePartition):
                continue
            if any(n not in self.consts for n in part.params):
                continue
            ok = True
            for n in part.tensor_inputs:
                if n in env:
                    continue
                shape, dt = self.shapes.get(n), self.types.get(n)
                if shape is None or dt is None:
                    ok = False
                    break
                # a zero-stride stand-in: the lowering reads only its shape and dtype
                env[n] = np.lib.stride_tricks.as_strided(np.zeros(1, dt), shape,
                                                         (0,) * len(shape))
            if ok:
                part.warm(env)

    # -- prepare ------------------------------------------------------------------------
    def _fold(self, inits: dict) -> dict:
        """Evaluate the nodes whose inputs are all constant (ONNX's reference evaluator)."""
        g = self.model.graph
        const = set(inits)
        self.folded, rest = [], []
        for i, node in enumerate(g.node):
            if (node.op_type not in _NONDETERMINISTIC and node.domain in ("", "ai.onnx")
                    and all(x in const for x in node.input if x)
                    and not any(a.g.node or a.graphs for a in node.attribute)):
                self.folded.append((i, node))
                const.update(o for o in node.output if o)
            else:
                rest.append((i, node))
        self._rest = rest
        values = dict(inits)
        if self.folded:
            from onnx.reference import ReferenceEvaluator
            needed = {x for _, n in rest for x in list(n.input) + sorted(_subgraph_inputs(n))}
            needed |= set(self.output_names)
            outs = [o for _, n in self.folded for o in n.output if o and o in needed]
            used = {x for _, n in self.folded for x in n.input if x}
            gg = helper.make_graph(
                [n for _, n in self.folded], "vkml_fold", [],
                [helper.make_value_info(o, onnx.TypeProto()) for o in outs],
                [numpy_helper.from_array(np.asarray(inits[k]), k) for k in inits if k in used])
            sub = helper.make_model(gg, opset_imports=self.model.opset_import,
                                    ir_version=self.model.ir_version,
                                    functions=self.model.functions)
            if outs:
                for name, v in zip(outs, ReferenceEvaluator(sub).run(None, {})):
                    values[name] = v
                    if isinstance(v, np.ndarray):
                        self.types[name] = v.dtype
        return values

    def _device_ok(self, node, producer_where: dict) -> str | None:
        """None if ``node`` can go on the device, else why not."""
        spec = DEVICE_OPS.get(node.op_type)
        if spec is None or node.domain not in ("", "ai.onnx"):
            return "vkml has no operator for it"
        x = node.input[0] if node.input else ""
        dt = self.types.get(x)
        if dt is None:
            return f"input {x!r} is not a tensor of known element type"
        if dt not in spec.dtypes:
            return f"data type {dt} (the device operator takes {sorted(map(str, spec.dtypes))})"
        for i, name in enumerate(node.input):
            if name and i in spec.params and producer_where.get(name) == "device":
                return f"parameter input {name!r} is computed on the device"
        if node.op_type == "Pad" and len(node.input) > 1 and node.input[1] in self.consts:
            if (np.asarray(self.consts[node.input[1]]) < 0).any():
                return "negative pads (cropping): DML_PADDING takes UINT paddings"
        if spec.lower is _lower_activation:
            # what HOST_ACTIVATIONS lists, decided here when the parameters are constants
            def param(i):
                if i >= len(node.input) or not node.input[i]:
                    return None
                return self.consts.get(node.input[i])
            if all(x in self.consts for x in node.input[1:] if x):
                try:
                    _activation_desc(node, param)
                except _HostFallback as exc:
                    return str(exc)
        return None

    def _place(self) -> None:
        rest = self._rest
        where = {}          # value name -> "device"/"host"
        placed = []         # (index, node, where)
        for i, node in rest:
            why = self._device_ok(node, where)
            if why is not None and self.strict:
                raise UnsupportedError(
                    f"an operator for node {_node_label(node, i)!r} (op type "
                    f"{node.op_type})", f"{why}; prepare(strict=False) runs it on the host")
            w = "device" if why is None else "host"
            for o in node.output:
                where[o] = w
            placed.append((i, node, w))
        # partitions: maximal runs of one placement
        groups = []
        for i, node, w in placed:
            if not groups or groups[-1][0] != w:
                groups.append((w, []))
            groups[-1][1].append((i, node))
        self._groups = groups
        self._parts = []
        known = set(self.input_names) | set(self.consts) | {o for _, n in rest for o in n.output}
        for gi, (w, items) in enumerate(groups):
            produced = set()
            reads = []
            for _, node in items:
                for x in list(node.input) + sorted(_subgraph_inputs(node)):
                    if x and x not in produced:
                        reads.append(x)
                produced.update(o for o in node.output if o)
            later = set(self.output_names)
            for _, its in groups[gi + 1:]:
                for _, node in its:
                    later |= set(node.input) | _subgraph_inputs(node)
            # a name read from an outer value that does not exist (subgraph-local) is dropped
            inputs = [x for x in dict.fromkeys(reads) if x not in produced and x in known]
            outputs = [o for o in dict.fromkeys(produced) if o in later]
            nodes = [n for _, n in items]
            if w == "device":
                part = _DevicePartition(self, nodes, inputs, outputs)
            else:
                part = _HostPartition(self, [(n, None) for n in nodes], inputs, outputs)
            self._parts.append(part)

    # -- run ----------------------------------------------------------------------------
    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            if len(inputs) > len(self.input_names):
                raise ValidationError("inputs", f"the model takes {len(self.input_names)} "
                                      f"inputs ({self.input_names}), got {len(inputs)}")
            feeds = dict(zip(self.input_names, inputs))
        env = dict(self.consts)
        env.update(feeds)
        for part in self._parts:
            missing = [x for x in part.inputs if x not in env]
            if missing:
                raise ValidationError("inputs", f"missing model input(s) {missing}")
            part.run(env)
        return [_host(env[o]) for o in self.output_names]

    def release(self) -> None:
        for p in self._parts:
            if isinstance(p, _DevicePartition):
                p.release()


def _sparse_to_dense(sp) -> np.ndarray:
    values = numpy_helper.to_array(sp.values)
    idx = numpy_helper.to_array(sp.indices)
    dense = np.zeros(int(np.prod(sp.dims)), dtype=values.dtype)
    if idx.ndim == 2:
        idx = np.ravel_multi_index(idx.T, tuple(sp.dims))
    dense[idx.reshape(-1)] = values.reshape(-1)
    return dense.reshape(tuple(sp.dims))


class VkmlBackend(Backend):
    """``onnx.backend.base.Backend`` for vkml.  Devices: "VKML" (the default vkml device),
    "VKML:<index>" (``vkml.devices()`` order), or a ``vkml.Device``."""

    @classmethod
    def prepare(cls, model, device=None, strict: bool = False, **kwargs) -> VkmlRep:
        proto = _load(model)
        return VkmlRep(proto, _resolve_device(device), strict)

    @classmethod
    def run_model(cls, model, inputs, device=None, strict: bool = False, **kwargs):
        return cls.prepare(model, device, strict=strict).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device=None, outputs_info=None, strict: bool = False,
                 opset_version: int | None = None, **kwargs):
        """Run one NodeProto on ``inputs`` (a list in the node's input order)."""
        ins = [helper.make_value_info(n, onnx.TypeProto()) for n in node.input if n]
        outs = [helper.make_value_info(n, onnx.TypeProto()) for n in node.output if n]
        for vi, x in zip(ins, inputs):
            a = np.asarray(x)
            vi.CopyFrom(helper.make_tensor_value_info(
                vi.name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
        opset = opset_version or onnx.defs.onnx_opset_version()
        g = helper.make_graph([node], "vkml_node", ins, outs)
        model = helper.make_model(g, opset_imports=[helper.make_opsetid(node.domain, opset)])
        rep = VkmlRep(model, _resolve_device(device), strict)
        return rep.run(list(inputs))

    @classmethod
    def supports_device(cls, device) -> bool:
        if isinstance(device, Device):
            return True
        text = str(device).strip().upper()
        if text == "VKML":
            return True
        if text.startswith("VKML:") and text[5:].isdigit():
            from .device import devices
            return int(text[5:]) < len(devices())
        return False


prepare = VkmlBackend.prepare
run_model = VkmlBackend.run_model
run_node = VkmlBackend.run_node
supports_device = VkmlBackend.supports_device

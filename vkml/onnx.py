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
   op type and its data types (activations: when :data:`FUSABLE_ACTIVATIONS` maps it and it
   is the only consumer of a device Conv/ConvTranspose, it is fused into it); else on the
   host (the reference evaluator), between device partitions, as ONNX Runtime does with
   nodes its GPU providers lack.  ``prepare(model, strict=True)`` instead raises
   :class:`vkml.UnsupportedError` naming the node and its op type.
   Consecutive nodes with the same placement form a partition (``rep.partitions``).
4. Initializers that device nodes read as tensors are uploaded once.

At ``run``, a device partition is lowered for the input shapes (and the values of its
parameter inputs, e.g. ``Pad``'s pads) into a list of :class:`Step` (a ``vkml.dml``
descriptor, input value names, output value names), compiled and recorded into one
command sequence by :class:`SequenceExecutor`, and replayed on later runs with the same
shapes.  When the device cannot run a partition (``UnsupportedError`` at compile, e.g.
float64 arithmetic on SwiftShader, or an ONNX case vkml has no descriptor for, such as a
negative (cropping) Pad) it runs on the host instead and is listed in ``rep.fallbacks``;
with ``strict=True`` that raises :class:`vkml.UnsupportedError`.
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

__all__ = ["VkmlBackend", "VkmlRep", "Step", "SequenceExecutor", "DEVICE_OPS",
           "FUSABLE_ACTIVATIONS", "prepare", "run_model", "run_node", "supports_device"]

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
            out = -(-sizes[i] // strides[i])
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

    def param(self, node, i, default=None):
        if i >= len(node.input) or not node.input[i]:
            return default
        return np.asarray(self.values[node.input[i]])

    def info(self, name):
        return self.infos[name]

    def emit(self, desc, inputs, outputs, out_infos):
        self.steps.append(Step(desc, list(inputs), list(outputs)))
        for name, inf in zip(outputs, out_infos):
            self.infos[name] = inf


def _lower_pad(lw: _Lowering, node, act):
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


def _lower_conv(lw: _Lowering, node, act):
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
        end_padding=tuple(end), output_padding=tuple(out_pad), group_count=group,
        fused_activation=act)
    if min(desc.expected_output_sizes()) < 1:
        raise ValidationError(f"{node.op_type} {node.name!r}", "the output would be empty: "
                              f"{desc.expected_output_sizes()}")
    out_shape = desc.expected_output_sizes()
    desc = replace(desc, output_tensor=_tdesc(out_shape, dt))
    lw.emit(desc, [node.input[0], node.input[1], node.input[2] if has_bias else None],
            [node.output[0]], [(out_shape, dt)])


def _lower_lp_pool(lw: _Lowering, node, act):
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


def _lower_col2im(lw: _Lowering, node, act):
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


def _lower_identity(lw: _Lowering, node, act):
    lw.emit(None, [node.input[0]], [node.output[0]], [lw.info(node.input[0])])


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


#: THE list of ONNX ops that run on the vkml device (op type -> DeviceOp).  Activations are
#: not here: they run on the device only fused into a Conv/ConvTranspose (see
#: FUSABLE_ACTIVATIONS); standalone activation operators, once vkml has them, go here.
DEVICE_OPS: dict[str, DeviceOp] = {
    "Pad": DeviceOp(_lower_pad, frozenset(_ALL), params=(1, 2, 3)),
    "Conv": DeviceOp(_lower_conv, frozenset(_FLOATS), tensors=(0, 1, 2)),
    "ConvTranspose": DeviceOp(_lower_conv, frozenset(_FLOATS), tensors=(0, 1, 2)),
    "LpPool": DeviceOp(_lower_lp_pool, frozenset(_FLOATS)),
    "Col2Im": DeviceOp(_lower_col2im, frozenset(_ALL), params=(1, 2)),
    "Identity": DeviceOp(_lower_identity, frozenset(_ALL)),
}


def _act(name, **params):
    return dml.ACTIVATIONS[name](**params)


def _clip(node, a, consts):
    if "min" in a or "max" in a:                   # opset 6: attributes
        lo, hi = a.get("min", -dml.FLT_MAX), a.get("max", dml.FLT_MAX)
    else:
        def get(i, default):
            if i >= len(node.input) or not node.input[i]:
                return default
            if node.input[i] not in consts:
                return None
            return float(np.asarray(consts[node.input[i]]).reshape(-1)[0])
        lo, hi = get(1, -dml.FLT_MAX), get(2, dml.FLT_MAX)
        if lo is None or hi is None:
            return None                            # bounds computed at run time: host
    return _act("clip", min=float(lo), max=float(hi))


#: ONNX activation op -> f(node, attributes, constants) giving the vkml.dml activation
#: descriptor to fuse (None: not fusable with these attributes).
FUSABLE_ACTIVATIONS = {
    "Relu": lambda n, a, c: _act("relu"),
    "LeakyRelu": lambda n, a, c: _act("leaky_relu", alpha=a.get("alpha", 0.01)),
    "Sigmoid": lambda n, a, c: _act("sigmoid"),
    "Tanh": lambda n, a, c: _act("tanh"),
    "HardSigmoid": lambda n, a, c: _act("hard_sigmoid", alpha=a.get("alpha", 0.2),
                                        beta=a.get("beta", 0.5)),
    "Elu": lambda n, a, c: _act("elu", alpha=a.get("alpha", 1.0)),
    "Selu": lambda n, a, c: _act("scaled_elu", alpha=a.get("alpha", 1.67326319217681884765625),
                                 gamma=a.get("gamma", 1.05070102214813232421875)),
    "Celu": lambda n, a, c: _act("celu", alpha=a.get("alpha", 1.0)),
    "Softplus": lambda n, a, c: _act("softplus", steepness=1.0),
    "Softsign": lambda n, a, c: _act("softsign"),
    "ThresholdedRelu": lambda n, a, c: _act("thresholded_relu", alpha=a.get("alpha", 1.0)),
    "Shrink": lambda n, a, c: _act("shrink", bias=a.get("bias", 0.0),
                                   threshold=a.get("lambd", 0.5)),
    "Gelu": lambda n, a, c: (_act("gelu") if _s(a.get("approximate", "none")) == "none"
                             else None),
    "Clip": _clip,
}


# -- executing a device partition ------------------------------------------------------------

class SequenceExecutor:
    """Runs lowered steps on a device: each descriptor is created and compiled, and all of
    them are recorded into one command sequence, replayed by :meth:`run`.  (The one place
    to swap for ``device.compile_graph`` once vkml has DML graphs.)

    ``tensors`` maps value names to the tensors bound for the partition's inputs and
    constants; ``infos`` gives (shape, dtype) of every value the steps write."""

    def __init__(self, device: Device, steps: list, tensors: dict, infos: dict):
        self.device = device
        self.tensors = dict(tensors)
        self.compiled = []
        self.seq = None
        try:
            for st in steps:
                if st.desc is None:                # alias (Identity)
                    self.tensors[st.outputs[0]] = self.tensors[st.inputs[0]]
                    continue
                for name in st.outputs:
                    shape, dtype = infos[name]
                    self.tensors[name] = device.empty(shape, dtype)
                op = device.compile_operator(device.create_operator(st.desc))
                self.compiled.append((op, st))
            self.seq = device.sequence()
            for op, st in self.compiled:
                op.record(self.seq, [self.tensors[n] if n else None for n in st.inputs],
                          [self.tensors[n] for n in st.outputs])
        except BaseException:
            self.release()
            raise

    def run(self) -> None:
        if self.seq is not None and self.compiled:
            self.seq.run()

    def release(self) -> None:
        if self.seq is not None:
            self.seq.close()
            self.seq = None
        for op, _ in self.compiled:
            op.release()
        self.compiled = []


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

    def __init__(self, rep, nodes, inputs, outputs, host_nodes):
        self.rep, self.nodes, self.inputs, self.outputs = rep, nodes, inputs, outputs
        self.host_nodes = host_nodes                # the ONNX nodes, activations unfused
        self._cache: dict = {}
        self.host: _HostPartition | None = None     # set when the device could not run it
        params, tensors = [], []
        for node, _ in nodes:
            spec = DEVICE_OPS[node.op_type]
            for i, name in enumerate(node.input):
                if name and name in inputs:
                    (params if i in spec.params else tensors).append(name)
        self.params = list(dict.fromkeys(params))
        self.tensor_inputs = [n for n in dict.fromkeys(tensors) if n not in self.params]

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
        for node, act in self.nodes:
            spec = DEVICE_OPS[node.op_type]
            dt = infos[node.input[0]][1]
            if dt not in spec.dtypes:
                raise _HostFallback(f"data type {dt} ({node.op_type} on the device takes "
                                    f"{sorted(map(str, spec.dtypes))})")
            spec.lower(lw, node, act)
        dev = self.rep.device
        tensors = {}
        for name in self.tensor_inputs:
            v = env[name]
            if name in self.rep.device_consts:
                tensors[name] = self.rep.device_consts[name]
            elif isinstance(v, Tensor) and v.device is dev:
                tensors[name] = v
            else:
                tensors[name] = dev.empty(infos[name][0], infos[name][1])
        return SequenceExecutor(dev, lw.steps, tensors, lw.infos)

    def run(self, env: dict) -> None:
        if self.host is not None:
            return self.host.run(env)
        key = self._key(env)
        ex = self._cache.get(key)
        if ex is None:
            try:
                ex = self._build(env)
            except (_HostFallback, UnsupportedError) as exc:
                names = ", ".join(f"{_node_label(n, i)} ({n.op_type})" for (n, _), i
                                  in zip(self.nodes, range(len(self.nodes))))
                if self.rep.strict:
                    raise UnsupportedError("an operator for " + names, str(exc)) from None
                self.rep.fallbacks.append((names, str(exc)))
                self.host = _HostPartition(self.rep, [(n, None) for n in self.host_nodes],
                                           self.inputs, self.outputs)
                return self.host.run(env)
            self._cache[key] = ex
        for name in self.tensor_inputs:
            t = ex.tensors[name]
            v = env[name]
            if v is t or name in self.rep.device_consts:
                continue
            t.write(np.ascontiguousarray(_host(v), dtype=t.dtype))
        ex.run()
        for name in self.outputs:
            env[name] = ex.tensors[name]

    def release(self):
        for ex in self._cache.values():
            ex.release()
        self._cache.clear()


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
        self.fused_into: dict = {}
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
        self.types = {}
        for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + \
                list(inferred.graph.output):
            t = vi.type
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
        self.device_consts = {}
        for part in self._parts:
            if isinstance(part, _DevicePartition):
                for name in part.tensor_inputs:
                    if name in self.consts and name not in self.device_consts:
                        self.device_consts[name] = device.tensor(self.consts[name])

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
        return None

    def _place(self) -> None:
        rest = self._rest
        consumers: dict = {}
        for _, n in rest:
            for x in list(n.input) + sorted(_subgraph_inputs(n)):
                consumers.setdefault(x, []).append(n)
        where = {}          # value name -> "device"/"host"
        placed = []         # (index, node, where, fused activation or None)
        fused_nodes = set()
        for i, node in rest:
            if id(node) in fused_nodes:
                continue
            why = self._device_ok(node, where)
            act = None
            if why is None and node.op_type in ("Conv", "ConvTranspose"):
                out = node.output[0]
                users = consumers.get(out, [])
                if (len(users) == 1 and out not in self.output_names
                        and users[0].op_type in FUSABLE_ACTIVATIONS
                        and users[0].domain in ("", "ai.onnx")
                        and users[0].input[0] == out
                        and all(x in self.consts for x in users[0].input[1:] if x)):
                    try:
                        act = FUSABLE_ACTIVATIONS[users[0].op_type](
                            users[0], _attrs(users[0]), self.consts)
                        if act is not None:
                            act.validate_parameters(act.fail)
                    except ValidationError:
                        act = None     # parameters DML refuses (e.g. Celu alpha=0): host
                    if act is not None:
                        fused_nodes.add(id(users[0]))
                        self.fused_into[id(node)] = users[0]
            if why is not None and self.strict:
                raise UnsupportedError(
                    f"an operator for node {_node_label(node, i)!r} (op type "
                    f"{node.op_type})", f"{why}; prepare(strict=False) runs it on the host")
            w = "device" if why is None else "host"
            for o in node.output:
                where[o] = w
            if act is not None:
                for o in self.fused_into[id(node)].output:
                    where[o] = w
            placed.append((i, node, w, act))
        # partitions: maximal runs of one placement
        groups = []
        for i, node, w, act in placed:
            if not groups or groups[-1][0] != w:
                groups.append((w, []))
            groups[-1][1].append((i, node, act))
        self.partitions = []
        self._parts = []
        for gi, (w, items) in enumerate(groups):
            produced = set()
            reads = []
            for _, node, act in items:
                for x in list(node.input) + sorted(_subgraph_inputs(node)):
                    if x and x not in produced:
                        reads.append(x)
                produced.update(o for o in node.output if o)
                if act is not None:
                    produced.update(self.fused_into[id(node)].output)
            later = set(self.output_names)
            for _, its in groups[gi + 1:]:
                for _, node, act in its:
                    later |= set(node.input) | _subgraph_inputs(node)
            inputs = list(dict.fromkeys(x for x in reads if x not in produced))
            # a name read from an outer value that does not exist (subgraph-local) is dropped
            known = set(self.input_names) | set(self.consts) | {
                o for _, n in rest for o in n.output}
            inputs = [x for x in inputs if x in known]
            outputs = [o for o in dict.fromkeys(produced) if o in later]
            if w == "device":
                # the fused activation's output replaces the conv's
                for _, node, act in items:
                    if act is not None:
                        a_node = self.fused_into[id(node)]
                        outputs = [o for o in outputs if o != node.output[0]]
                        if a_node.output[0] in later and a_node.output[0] not in outputs:
                            outputs.append(a_node.output[0])
                nodes, host_nodes = [], []
                for _, node, act in items:
                    host_nodes.append(node)
                    if act is not None:
                        host_nodes.append(self.fused_into[id(node)])
                        node = _rename_output(node, self.fused_into[id(node)].output[0])
                    nodes.append((node, act))
                part = _DevicePartition(self, nodes, inputs, outputs, host_nodes)
                labels = []
                for i, node, act in items:
                    labels.append((_node_label(node, i), node.op_type))
                    if act is not None:
                        a_node = self.fused_into[id(node)]
                        labels.append((_node_label(a_node, _index_of(self.model, a_node)),
                                       f"{a_node.op_type} (fused into {node.op_type})"))
            else:
                part = _HostPartition(self, [(n, None) for _, n, _ in items], inputs, outputs)
                labels = [(_node_label(n, i), n.op_type) for i, n, _ in items]
            self._parts.append(part)
            self.partitions.append((w, labels))

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
        for t in self.device_consts.values():
            t.free()
        self.device_consts.clear()


def _index_of(model, node) -> int:
    for i, n in enumerate(model.graph.node):
        if n is node:
            return i
    return -1


def _rename_output(node, name):
    n = onnx.NodeProto()
    n.CopyFrom(node)
    n.output[0] = name
    return n


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

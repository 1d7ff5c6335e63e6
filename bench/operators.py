"""What the bench knows about each vkml operator: its parameters as a workload file
writes them, inputs, its float64 reference (``bench/references.py``, which the tests use
too), the work it does (FLOPs or bytes moved), the call of vkml's functional form, and
its DML descriptor (for GPU-timed replay).

The operators CNN models are made of (element-wise, identity, join/split/slice, resample,
pooling, reduce, GEMM, batch normalization, softmax) live in ``bench/model_ops.py``; the
functions here hand them over.

An operator vkml does not have yet (``hasattr(vkml, spec.function)`` is false) makes its
workloads report vkml as absent; they run as soon as the operator lands.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import model_ops, references

PAD_MODES = tuple(references.PAD_MODES)


def _per_dim(value, neutral: int, n: int) -> tuple[int, ...]:
    if value is None:
        return (neutral,) * n
    if isinstance(value, int):
        return (value,) * n
    return tuple(int(v) for v in value)


@dataclass(frozen=True)
class OpSpec:
    """One operator: ``function`` is its name in ``vkml`` (``vkml.pad``), ``desc`` the
    ``vkml.dml`` descriptor class name, ``metric`` "flops" or "bytes"."""

    name: str
    function: str
    desc: str
    metric: str


OPS = {
    "pad": OpSpec("pad", "pad", "PaddingOperatorDesc", "bytes"),
    "fold": OpSpec("fold", "fold", "FoldOperatorDesc", "bytes"),
    "unfold": OpSpec("unfold", "unfold", "UnfoldOperatorDesc", "bytes"),
    "convolution": OpSpec("convolution", "convolution", "ConvolutionOperatorDesc", "flops"),
    "lp_pooling": OpSpec("lp_pooling", "lp_pooling", "LpPooling1OperatorDesc", "bytes"),
    # Pad -> Conv -> Relu -> LpPool -> Conv as one DML graph (bench/graph.py)
    "graph": OpSpec("graph", "Device.compile_graph", "GraphDesc", "flops"),
    **{name: OpSpec(name, *spec) for name, spec in model_ops.OPS.items()},
}


# -- parameters -----------------------------------------------------------------------
def normalize(op: str, p: dict) -> dict:
    """Fill the defaults of a workload's parameters and derive the shapes."""
    if op in model_ops.OPS:
        return model_ops.normalize(op, p)
    p = dict(p)
    if op == "pad":
        n = len(p["shape"])
        p["start"] = _per_dim(p.get("start"), 0, n)
        p["end"] = _per_dim(p.get("end"), 0, n)
        p.setdefault("mode", "constant")
        p.setdefault("value", 0.0)
        if p["mode"] not in PAD_MODES:
            raise ValueError(f"pad mode {p['mode']!r} is not one of {', '.join(PAD_MODES)}")
        p["out_shape"] = [s + a + b for s, a, b in zip(p["shape"], p["start"], p["end"])]
    elif op in ("fold", "unfold"):
        image = list(p["output_size"] if op == "fold" else p["shape"][2:])
        n = len(image)
        k = _per_dim(p["window"], 1, n)
        p["window"] = k
        for key, neutral in (("strides", 1), ("dilations", 1), ("start_padding", 0),
                             ("end_padding", 0)):
            p[key] = _per_dim(p.get(key), neutral, n)
        blocks = [(s + a + b - d * (w - 1) - 1) // st + 1 for s, w, st, d, a, b in zip(
            image, k, p["strides"], p["dilations"], p["start_padding"], p["end_padding"])]
        p["blocks"] = blocks
        if op == "fold":
            nb, c = p.get("batch", 1), p["channels"]
            p["image_shape"] = [nb, c, *image]
        else:
            nb, c = p["shape"][0], p["shape"][1]
            p["image_shape"] = list(p["shape"])
        p["columns_shape"] = [nb, c * math.prod(k), math.prod(blocks)]
        p["shape"], p["out_shape"] = ((p["columns_shape"], p["image_shape"]) if op == "fold"
                                      else (p["image_shape"], p["columns_shape"]))
    elif op == "convolution":
        x, f = list(p["input"]), list(p["filter"])
        n = len(x) - 2
        for key, neutral in (("strides", 1), ("dilations", 1), ("start_padding", 0),
                             ("end_padding", 0), ("output_padding", 0)):
            p[key] = _per_dim(p.get(key), neutral, n)
        p.setdefault("groups", 1)
        p.setdefault("bias", True)
        p.setdefault("direction", "forward")
        p.setdefault("mode", "cross_correlation")
        p.setdefault("activation", None)
        g = p["groups"]
        back = p["direction"] == "backward"
        cout = f[1] * g if back else f[0]
        out = []
        for i, k, s, d, a, b, op_ in zip(x[2:], f[2:], p["strides"], p["dilations"],
                                         p["start_padding"], p["end_padding"],
                                         p["output_padding"]):
            size = ((i - 1) * s + d * (k - 1) + 1 - a - b) if back else \
                ((i + a + b - d * (k - 1) - 1) // s + 1)
            out.append(size + op_)
        p["out_shape"] = [x[0], cout, *out]
        p["shape"] = x
    elif op == "lp_pooling":
        n = len(p["shape"]) - 2
        p["window"] = _per_dim(p["window"], 1, n)
        for key, neutral in (("strides", 1), ("dilations", 1), ("start_padding", 0),
                             ("end_padding", 0)):
            p[key] = _per_dim(p.get(key), neutral, n)
        p.setdefault("p", 2)
        out = [(i + a + b - d * (w - 1) - 1) // s + 1 for i, w, s, d, a, b in zip(
            p["shape"][2:], p["window"], p["strides"], p["dilations"], p["start_padding"],
            p["end_padding"])]
        p["out_shape"] = list(p["shape"][:2]) + out
    elif op == "graph":
        from . import graph
        p = graph.normalize(p)
    else:
        raise ValueError(f"unknown operator {op!r} (known: {', '.join(OPS)})")
    return p


# -- inputs ---------------------------------------------------------------------------
def make_inputs(op: str, p: dict, dtype: np.dtype, seed: int = 0) -> list:
    """The operator's inputs in binding order (None for an absent optional one)."""
    rng = np.random.default_rng(seed)

    def normal(shape, scale=1.0):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype)

    if op == "graph":
        from . import graph
        return graph.make_inputs(p, dtype, rng)
    if op in model_ops.OPS:
        return model_ops.make_inputs(op, p, dtype, rng)
    if op == "convolution":
        f = p["filter"]
        fan_in = math.prod(f[1:]) if p["direction"] == "forward" else f[0] * math.prod(f[2:])
        bias = normal((p["out_shape"][1],), 0.1) if p["bias"] else None
        return [normal(p["input"]), normal(f, 1.0 / math.sqrt(fan_in)), bias]
    return [normal(p["shape"])]


# -- work -----------------------------------------------------------------------------
def flops(op: str, p: dict) -> float:
    """Direct-algorithm FLOPs (one multiply-add = 2), 0 for data movement."""
    if op in model_ops.OPS:
        return model_ops.flops(op, p)
    if op == "graph":                   # its two convolutions
        from . import graph
        return float(graph.flops(p))
    if op == "convolution":
        g = p["groups"]
        f = p["filter"]
        if p["direction"] == "backward":    # every input element meets C_out/g x kernel
            return 2.0 * math.prod(p["input"]) * f[1] * math.prod(f[2:])
        return 2.0 * math.prod(p["out_shape"]) * (p["input"][1] // g) * math.prod(f[2:])
    return 0.0


def bytes_moved(op: str, p: dict, inputs: list, itemsize: int) -> int:
    """Bytes read plus bytes written, each tensor once (a slice: the output and the input
    rows it reads, :func:`model_ops.slice_bytes`)."""
    if op == "slice":
        return model_ops.slice_bytes(p, itemsize)
    return sum(a.nbytes for a in inputs if a is not None) + math.prod(p["out_shape"]) * itemsize


# -- the reference ----------------------------------------------------------------------
def compute(op: str, p: dict, inputs: list, dtype=np.float64) -> np.ndarray:
    """The operator by its independent reference (``bench/references.py``, the tests'
    too), the inputs converted to ``dtype`` first; floats are computed in float64."""
    xs = [None if a is None else a.astype(dtype, copy=False) for a in inputs]
    if op in model_ops.OPS:
        return model_ops.compute(op, p, xs)
    if op == "graph":
        from . import graph
        return graph.reference(p, xs)
    if op == "pad":
        return references.pad_reference(xs[0], p["start"], p["end"], p["mode"], p["value"])
    if op == "convolution":
        x, w, b = xs
        y = references.convolution_reference(
            x, w, b, p["strides"], p["dilations"], p["start_padding"], p["end_padding"],
            p["output_padding"], p["groups"], p["mode"], p["direction"])
        return references.activation_reference(y, p["activation"])
    window = (p["window"], p["strides"], p["dilations"], p["start_padding"], p["end_padding"])
    if op == "fold":
        return references.fold_reference(xs[0], p["image_shape"][2:], *window)
    if op == "unfold":
        return references.unfold_reference(xs[0], *window)
    return references.lp_pooling_reference(xs[0], *window, p["p"])


# -- vkml -----------------------------------------------------------------------------
def vkml_call(vkml, op: str, p: dict, inputs: list, device):
    """vkml's functional form (NumPy in, NumPy out)."""
    if op in model_ops.OPS:
        return model_ops.vkml_call(vkml, op, p, inputs, device)
    if op == "pad":
        return vkml.pad(inputs[0], list(p["start"]), list(p["end"]), p["mode"], p["value"],
                        device=device)
    if op == "fold":
        return vkml.fold(inputs[0], list(p["image_shape"][2:]), list(p["window"]),
                         strides=p["strides"], dilations=p["dilations"],
                         start_padding=p["start_padding"], end_padding=p["end_padding"],
                         device=device)
    if op == "unfold":
        return vkml.unfold(inputs[0], list(p["window"]), strides=p["strides"],
                           dilations=p["dilations"], start_padding=p["start_padding"],
                           end_padding=p["end_padding"], device=device)
    if op == "lp_pooling":
        return vkml.lp_pooling(inputs[0], list(p["window"]), strides=p["strides"],
                               start_padding=p["start_padding"], end_padding=p["end_padding"],
                               dilations=p["dilations"], p=p["p"], device=device)
    x, w, b = inputs
    return vkml.convolution(x, w, b, strides=p["strides"], dilations=p["dilations"],
                            start_padding=p["start_padding"], end_padding=p["end_padding"],
                            output_padding=p["output_padding"], group_count=p["groups"],
                            mode=p["mode"], direction=p["direction"],
                            fused_activation=p["activation"], device=device)


def dml_desc(dml, op: str, p: dict, dtype: np.dtype):
    """The DML descriptor of the workload (inputs in binding order, as vkml's functional
    form builds them)."""
    if op in model_ops.OPS:
        return model_ops.dml_desc(dml, op, p, dtype)
    T = dml.TensorDesc
    x = T(dtype, tuple(p["shape"]))
    y = T(dtype, tuple(p["out_shape"]))
    if op == "pad":
        return dml.PaddingOperatorDesc(x, y, p["mode"], float(p["value"]), tuple(p["start"]),
                                       tuple(p["end"]))
    if op in ("fold", "unfold"):
        cls = dml.FoldOperatorDesc if op == "fold" else dml.UnfoldOperatorDesc
        return cls(x, y, tuple(p["window"]), tuple(p["strides"]), tuple(p["dilations"]),
                   tuple(p["start_padding"]), tuple(p["end_padding"]))
    if op == "lp_pooling":
        return dml.LpPooling1OperatorDesc(x, y, tuple(p["strides"]), tuple(p["window"]),
                                          tuple(p["start_padding"]), tuple(p["end_padding"]),
                                          tuple(p["dilations"]), p["p"])
    n = len(p["input"]) - 2
    bias_shape = (1, p["out_shape"][1]) + (1,) * n if p["bias"] else None
    return dml.ConvolutionOperatorDesc(
        x, T(dtype, tuple(p["filter"])), T(dtype, bias_shape) if bias_shape else None, y,
        p["mode"], p["direction"], tuple(p["strides"]), tuple(p["dilations"]),
        tuple(p["start_padding"]), tuple(p["end_padding"]), tuple(p["output_padding"]),
        p["groups"], p["activation"])

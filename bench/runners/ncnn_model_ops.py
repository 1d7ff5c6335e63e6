"""The model operators as single ncnn layers, where ncnn has the layer and it maps simply:
BinaryOp (element-wise), Permute (NCHW -> NHWC), Concat (join), Slice (split), Crop
(a slice of step 1), Interp (2-D resample of pixel centres), Pooling (max and average,
global), InnerProduct (GEMM: B is the layer's weights, (N, K)), BatchNorm, Softmax.

Left absent, with the reason: a plain copy (ncnn has no copy layer: Noop hands its
input through), a strided slice (Crop has no steps), Reduction (its axis numbering
differs between ncnn versions: not simple to state right), average pooling that counts
padding only partly, and anything with a batch dimension > 1.  ncnn blobs have no batch
dimension: axes are the DML axis minus one.
"""
from __future__ import annotations

import struct

import numpy as np

from . import Absent

_BINARY = {"add": 0, "subtract": 1, "multiply": 2, "divide": 3, "maximum": 4, "minimum": 5}


def _arr(key: int, values) -> str:
    """An ncnn array parameter: ``-23300-key=count,v0,v1,...``."""
    values = [int(v) for v in values]
    return f"{-23300 - key}={len(values)}," + ",".join(map(str, values))


def _unbatched(a: np.ndarray) -> np.ndarray:
    if a.shape[0] != 1:
        raise Absent("ncnn blobs have no batch dimension (batch > 1)")
    return np.ascontiguousarray(a[0].astype(np.float32))


def layer(workload, inputs) -> tuple[str, str, bytes, list]:
    """(layer type, its parameters, its weight blob, the blobs fed to it)."""
    op, p = workload.op, workload.p
    if op == "gemm":
        return _gemm(p, inputs)
    x = _unbatched(inputs[0])
    if op == "element_wise":
        b = _unbatched(inputs[1])
        if b.ndim == x.ndim == 3 and b.shape == (x.shape[0], 1, 1):
            # per channel as ncnn's converters write it, a 1-D blob of C: its Vulkan
            # BinaryOp gets a (C, 1, 1) blob wrong on lavapipe and SwiftShader (CPU right)
            b = b.reshape(-1)
        return "BinaryOp", f"0={_BINARY[p['function']]}", b"", [x, b]
    if op == "identity":
        if p["perm"] != [0, 2, 3, 1]:
            raise Absent("ncnn has no copy layer; the runner maps NCHW -> NHWC only")
        return "Permute", "0=3", b"", [x]           # order_type 3: (c, h, w) -> (h, w, c)
    if op == "join":
        return "Concat", f"0={p['axis'] - 1}", b"", [_unbatched(a) for a in inputs]
    if op == "split":
        return "Slice", f"{_arr(0, p['sizes'])} 1={p['axis'] - 1}", b"", [x]
    if op == "slice":
        if any(s != 1 for s in p["strides"]):
            raise Absent("ncnn Crop has no steps")
        ends = [o + n for o, n in zip(p["offsets"], p["sizes"])]
        axes = range(len(ends) - 1)
        return ("Crop", f"{_arr(9, p['offsets'][1:])} {_arr(10, ends[1:])} {_arr(11, axes)}",
                b"", [x])
    if op == "resample":
        return _interp(p, x)
    if op in ("max_pooling", "average_pooling"):
        return _pooling(op, p, x)
    if op == "batch_normalization":
        mean, variance, scale, bias = (a.astype(np.float32).reshape(-1) for a in inputs[1:])
        blob = b"".join(a.tobytes() for a in (scale, mean, variance, bias))
        return "BatchNorm", f"0={p['shape'][1]} 1={p['epsilon']}", blob, [x]
    if op == "softmax":
        if len(p["axes"]) != 1:
            raise Absent("ncnn Softmax takes one axis")
        return "Softmax", f"0={p['axes'][0] - 1} 1=1", b"", [x]
    raise Absent(f"the ncnn runner has no {op.replace('_', ' ')} layer")


def _gemm(p, inputs):
    a, b, c = inputs
    w = b if p["trans_b"] else b.T                   # InnerProduct's weights: (N, K)
    n, k = w.shape
    blob = struct.pack("<I", 0) + np.ascontiguousarray(w, np.float32).tobytes()
    if c is not None:
        blob += c.astype(np.float32).reshape(-1).tobytes()
    params = f"0={n} 1={int(c is not None)} 2={n * k}"
    x = a[0] if a.shape[0] == 1 else a               # one row: a 1-D blob
    return "InnerProduct", params, blob, [np.ascontiguousarray(x, np.float32)]


def _interp(p, x):
    if len(p["shape"]) != 4 or p["scales"][:2] != [1.0, 1.0]:
        raise Absent("ncnn Interp scales H and W of a 4-D tensor")
    if any(a != 0.5 for a in p["input_pixel_offsets"][2:]) or any(
            b != -0.5 for b in p["output_pixel_offsets"][2:]):
        raise Absent("ncnn Interp samples pixel centres only")
    kind = 1 if p["mode"] == "nearest" else 2
    oh, ow = p["out_shape"][2:]
    return "Interp", f"0={kind} 3={oh} 4={ow} 6=0", b"", [x]


def _pooling(op, p, x):
    if len(p["window"]) != 2 or any(d != 1 for d in p["dilations"]):
        raise Absent("ncnn Pooling is 2-D, without dilations")
    (kh, kw), (sh, sw) = p["window"], p["strides"]
    (pt, pl), (pb, pr) = p["start_padding"], p["end_padding"]
    kind = 0 if op == "max_pooling" else 1
    # global pooling too is a window of the whole image (one parameter set for all)
    # pad_mode 1: the explicit paddings, output sizes rounded down as DML's
    params = (f"0={kind} 1={kw} 11={kh} 2={sw} 12={sh} 3={pl} 13={pt} 14={pr} 15={pb} 5=1 "
              f"6={int(bool(p['include_padding']))}")
    return "Pooling", params, b"", [x]

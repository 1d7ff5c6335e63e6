"""NumPy as a peer: ``numpy.pad`` for padding; for the other operators the
straightforward NumPy formulation (strided slices and ``matmul`` per window tap; for the
model operators ``np.add``, ``np.concatenate``, ``@``, ...; none for pooling or
resampling), in float32.  float16 workloads are computed in float32 and rounded (NumPy
has no float16 BLAS).  A peer, timed like the others and checked against the independent references of
``bench/references.py``; it is not a reference itself."""
from __future__ import annotations

import itertools
import math

import numpy as np

from .. import model_ops, references
from ..references import PAD_MODES
from . import Absent, Runner


class NumpyPeer(Runner):
    name = "numpy"

    @classmethod
    def probe(cls) -> str:
        return np.__version__

    def prepare(self, workload, inputs):
        op, p, dtype = workload.op, workload.p, workload.np_dtype
        work = np.float32 if dtype == np.float16 and op != "pad" else dtype
        if p.get("activation") not in (None, "relu"):
            raise Absent(f"the NumPy peer has no activation {p['activation']!r} (it knows relu)")

        if op in ("resample", "max_pooling", "average_pooling"):
            raise Absent(f"NumPy has no {op.replace('_', ' ')}")

        def run():
            y = compute(op, p, inputs, work)
            if isinstance(y, list):
                return [a if a.dtype == dtype else a.astype(dtype) for a in y]
            return y if y.dtype == dtype else y.astype(dtype)

        return run


RUNNERS = [NumpyPeer]


# -- the peer's algorithms (NumPy, in the type of their inputs) ---------------------------
def _conv_forward(x, w, p):
    n, g = len(x.shape) - 2, p["groups"]
    pads = [(0, 0), (0, 0)] + list(zip(p["start_padding"], p["end_padding"]))
    xp = np.pad(x, pads)
    if p["mode"] == "convolution":
        w = np.flip(w, axis=tuple(range(2, 2 + n)))
    nb, cin = x.shape[:2]
    cout = w.shape[0]
    out_sp = [o - op_ for o, op_ in zip(p["out_shape"][2:], p["output_padding"])]
    y = np.zeros((nb, g, cout // g, math.prod(out_sp)), dtype=x.dtype)
    wg = w.reshape(g, cout // g, cin // g, *w.shape[2:])
    for off in itertools.product(*[range(k) for k in w.shape[2:]]):
        sl = tuple(slice(o * d, o * d + (size - 1) * s + 1, s) for o, d, s, size in
                   zip(off, p["dilations"], p["strides"], out_sp))
        xs = xp[(slice(None), slice(None)) + sl].reshape(nb, g, cin // g, -1)
        y += np.matmul(wg[(...,) + off], xs)
    y = y.reshape(nb, cout, *out_sp)
    if any(p["output_padding"]):
        y = np.pad(y, [(0, 0), (0, 0)] + [(0, a) for a in p["output_padding"]])
    return y


def _conv_backward(x, w, p):
    n, g = len(x.shape) - 2, p["groups"]
    if p["mode"] == "convolution":
        w = np.flip(w, axis=tuple(range(2, 2 + n)))
    nb, cin = x.shape[:2]
    cog = w.shape[1]
    full = [(i - 1) * s + d * (k - 1) + 1 + op_ for i, s, d, k, op_ in zip(
        x.shape[2:], p["strides"], p["dilations"], w.shape[2:], p["output_padding"])]
    y = np.zeros((nb, g, cog, *full), dtype=x.dtype)
    xg = x.reshape(nb, g, cin // g, -1)
    wg = w.reshape(g, cin // g, cog, *w.shape[2:])
    for off in itertools.product(*[range(k) for k in w.shape[2:]]):
        contrib = np.matmul(np.swapaxes(wg[(...,) + off], 1, 2), xg)   # (nb, g, cog, in)
        sl = tuple(slice(o * d, o * d + (i - 1) * s + 1, s) for o, d, s, i in
                   zip(off, p["dilations"], p["strides"], x.shape[2:]))
        y[(slice(None),) * 3 + sl] += contrib.reshape(nb, g, cog, *x.shape[2:])
    crop = tuple(slice(a, a + o) for a, o in zip(p["start_padding"], p["out_shape"][2:]))
    return y.reshape(nb, g * cog, *full)[(slice(None), slice(None)) + crop]


def _fold(cols, p):
    nb, c = p["image_shape"][:2]
    k, blocks = p["window"], p["blocks"]
    padded = [s + a + b for s, a, b in zip(p["image_shape"][2:], p["start_padding"],
                                           p["end_padding"])]
    y = np.zeros((nb, c, *padded), dtype=cols.dtype)
    cols = cols.reshape(nb, c, *k, *blocks)
    for off in itertools.product(*[range(w) for w in k]):
        sl = tuple(slice(o * d, o * d + (b - 1) * s + 1, s) for o, d, s, b in
                   zip(off, p["dilations"], p["strides"], blocks))
        y[(slice(None), slice(None)) + sl] += cols[(slice(None), slice(None)) + off]
    crop = tuple(slice(a, a + s) for a, s in zip(p["start_padding"], p["image_shape"][2:]))
    return y[(slice(None), slice(None)) + crop]


def _unfold(x, p):
    nb, c = x.shape[:2]
    k, blocks = p["window"], p["blocks"]
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(p["start_padding"], p["end_padding"])))
    out = np.empty((nb, c, *k, *blocks), dtype=x.dtype)
    for off in itertools.product(*[range(w) for w in k]):
        sl = tuple(slice(o * d, o * d + (b - 1) * s + 1, s) for o, d, s, b in
                   zip(off, p["dilations"], p["strides"], blocks))
        out[(slice(None), slice(None)) + off] = xp[(slice(None), slice(None)) + sl]
    return out.reshape(p["columns_shape"])


def _lp_pool(x, p):
    pw = p["p"]
    xp = np.abs(np.pad(x, [(0, 0), (0, 0)] + list(zip(p["start_padding"], p["end_padding"]))))
    out_sp = p["out_shape"][2:]
    acc = np.zeros(p["out_shape"], dtype=x.dtype)
    for off in itertools.product(*[range(w) for w in p["window"]]):
        sl = tuple(slice(o * d, o * d + (n - 1) * s + 1, s) for o, d, s, n in
                   zip(off, p["dilations"], p["strides"], out_sp))
        v = xp[(slice(None), slice(None)) + sl]
        acc += v * v if pw == 2 else (v if pw == 1 else v ** pw)
    return np.sqrt(acc) if pw == 2 else (acc if pw == 1 else acc ** (1.0 / pw))


def _activation(y, name):
    if name is None:
        return y
    if name == "relu":
        return np.maximum(y, 0)
    raise ValueError(f"the NumPy peer has no activation {name!r} (it knows relu)")


def _model_op(op: str, p: dict, xs: list):
    """The operators CNN models are made of, as NumPy writes them (no pooling or
    resampling: NumPy has neither)."""
    x = xs[0]
    if op == "element_wise":
        return references.ELEMENT_WISE_BINARY[p["function"]](x, xs[1])
    if op == "identity":
        return x.copy() if p["perm"] is None else np.ascontiguousarray(x.transpose(p["perm"]))
    if op == "join":
        return np.concatenate(xs, axis=p["axis"])
    if op == "split":
        return [np.ascontiguousarray(a) for a in
                np.split(x, np.cumsum(p["sizes"])[:-1], axis=p["axis"])]
    if op == "slice":
        return np.ascontiguousarray(x[tuple(slice(o, o + (n - 1) * s + 1, s) for o, n, s in
                                            zip(p["offsets"], p["sizes"], p["strides"]))])
    if op == "reduce":
        fn = {"sum": np.sum, "average": np.mean, "max": np.max, "min": np.min}.get(p["function"])
        if fn is None:
            raise Absent(f"the NumPy peer has no reduce {p['function']}")
        return fn(x, tuple(p["axes"]), keepdims=True)
    if op == "gemm":
        y = x @ (xs[1].T if p["trans_b"] else xs[1])
        return y if xs[2] is None else y + xs[2]
    if op == "batch_normalization":
        mean, variance, scale, bias = xs[1:]
        return (x - mean) * (scale / np.sqrt(variance + np.float32(p["epsilon"]))) + bias
    if op == "softmax":
        axes = tuple(p["axes"])
        e = np.exp(x - x.max(axes, keepdims=True))
        return e / e.sum(axes, keepdims=True)
    raise Absent(f"NumPy has no {op.replace('_', ' ')}")


def compute(op: str, p: dict, inputs: list, dtype) -> np.ndarray:
    """The operator by the peer's algorithm, computed in ``dtype``."""
    xs = [None if a is None else a.astype(dtype, copy=False) for a in inputs]
    if op in model_ops.OPS:
        return _model_op(op, p, xs)
    if op == "pad":
        pads = list(zip(p["start"], p["end"]))
        mode = PAD_MODES[p["mode"]]
        kw = {"constant_values": p["value"]} if mode == "constant" else {}
        return np.pad(xs[0], pads, mode, **kw)
    if op == "fold":
        return _fold(xs[0], p)
    if op == "unfold":
        return _unfold(xs[0], p)
    if op == "lp_pooling":
        return _lp_pool(xs[0], p)
    x, w, b = xs
    y = _conv_backward(x, w, p) if p["direction"] == "backward" else _conv_forward(x, w, p)
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * (y.ndim - 2))
    return _activation(y, p["activation"])

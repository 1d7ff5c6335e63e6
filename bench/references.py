"""One independent NumPy reference per operator, written from the DirectML pages and
nothing of vkml: the tests compare vkml with these (through ``tests/references.py``), and
the bench checks every runner's result against them.  They live in the bench because
the bench is installed (``vkml-bench``) and must not import the tests; the tests import
the bench.

Floats are computed in float64; integer Fold sums in the type itself, wrapping modulo
2^bits as the device does.  Index arithmetic is in Python ints (every parameter goes
through ``int()``), so strides, dilations and paddings up to 2^32-1 and beyond never
wrap, and the zero padding is never materialized: a start padding of 2^32-1 costs nothing.

The window operators (Unfold, Fold, LP pooling, Convolution in both directions) share one
relation between a window position ``o`` (a "block") and an image element ``i``:
``i = o * stride + tap * dilation - start_padding``.  :func:`window_taps` gives, per tap,
the blocks whose element lies inside the image and those elements, as strided slices.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
from vkml.intmath import ceil_div

# DML_PADDING_MODE -> numpy.pad mode (the page's examples match these)
PAD_MODES = {"constant": "constant", "edge": "edge", "reflection": "reflect",
             "symmetric": "symmetric", "wrap": "wrap"}


def _ints(values, n: int, neutral: int) -> tuple[int, ...]:
    """A per-dimension parameter as Python ints (None -> ``neutral``; an int -> repeated)."""
    if values is None:
        return (neutral,) * n
    if isinstance(values, (int, np.integer)):
        return (int(values),) * n
    return tuple(int(v) for v in values)


def pad_reference(x: np.ndarray, start, end, mode: str = "constant", value=0) -> np.ndarray:
    """DML_PADDING_OPERATOR_DESC: ``numpy.pad`` with the page's modes; the constant is
    converted to the tensor's type first (DML_PADDING1's PaddingValue)."""
    pads = list(zip(_ints(start, x.ndim, 0), _ints(end, x.ndim, 0)))
    kw = {"constant_values": np.asarray(value).astype(x.dtype)} if mode == "constant" else {}
    return np.pad(x, pads, PAD_MODES[mode], **kw)


def window_counts(spatial, window, strides, dilations, start, end) -> list[int]:
    """Window positions per dimension, ``(size + start + end - dilation * (window - 1)
    - 1) // stride + 1``, or 0 where the dilated window does not fit the padded size."""
    out = []
    for s, w, st, d, a, b in zip(spatial, window, strides, dilations, start, end):
        num = int(s) + int(a) + int(b) - int(d) * (int(w) - 1) - 1
        out.append(num // int(st) + 1 if num >= 0 else 0)
    return out


def window_taps(image, blocks, window, strides, dilations, start):
    """Yield ``(tap, block slices, image slices)`` for every window tap that reaches the
    image: the blocks ``o`` whose element ``o * stride + tap * dilation - start`` lies in
    ``[0, image)``, and those elements (same count per dimension)."""
    per_dim = []
    for size, count, w, st, d, a in zip(image, blocks, window, strides, dilations, start):
        size, count, w, st, d, a = int(size), int(count), int(w), int(st), int(d), int(a)
        options = []
        for k in _reaching_taps(size, count, w, st, d, a):
            first = k * d - a                       # image element of block 0
            lo = max(0, -(first // st))             # ceil(-first / st)
            hi = min(count - 1, (size - 1 - first) // st)
            if hi >= lo:
                options.append((k, slice(lo, hi + 1),
                                slice(lo * st + first, hi * st + first + 1, st)))
        per_dim.append(options)
    for combo in itertools.product(*per_dim):
        yield (tuple(k for k, _, _ in combo), tuple(b for _, b, _ in combo),
               tuple(i for _, _, i in combo))


def _reaching_taps(size: int, count: int, w: int, st: int, d: int, a: int):
    """The taps ``k < w`` that may put a block inside ``[0, size)``: all of them for a
    window no longer than the blocks, else those found block by block (``k * d`` within
    ``[a - o * st, a - o * st + size)``), so that a window of 2^32 - 1 taps costs only
    the taps that reach the image."""
    if w <= count:
        return range(w)
    taps: set = set()
    for o in range(count):
        first = a - o * st
        taps.update(range(max(0, ceil_div(first, d)), min(w - 1, (first + size - 1) // d) + 1))
    return sorted(taps)


def _window_params(n, window, strides, dilations, start, end):
    return (_ints(window, n, 1), _ints(strides, n, 1), _ints(dilations, n, 1),
            _ints(start, n, 0), _ints(end, n, 0))


def unfold_reference(x: np.ndarray, window, strides=None, dilations=None, start=None,
                     end=None) -> np.ndarray:
    """DML_UNFOLD_OPERATOR_DESC (im2col): ``(N, C * prod(window), prod(blocks))``, each
    column one window position of the zero-padded input, taps in row-major order."""
    n, c = x.shape[:2]
    window, strides, dilations, start, end = _window_params(x.ndim - 2, window, strides,
                                                            dilations, start, end)
    blocks = window_counts(x.shape[2:], window, strides, dilations, start, end)
    out = np.zeros((n, c, *window, *blocks), x.dtype)
    for tap, b_sl, i_sl in window_taps(x.shape[2:], blocks, window, strides, dilations, start):
        out[(slice(None), slice(None)) + tap + b_sl] = x[(slice(None), slice(None)) + i_sl]
    return out.reshape(n, c * math.prod(window), math.prod(blocks))


def fold_reference(cols: np.ndarray, out_spatial, window, strides=None, dilations=None,
                   start=None, end=None) -> np.ndarray:
    """DML_FOLD_OPERATOR_DESC (col2im): every column scattered back and summed (float64
    for floats; integers in their own type, wrapping)."""
    n, rows = cols.shape[:2]
    out_spatial = [int(s) for s in out_spatial]
    window, strides, dilations, start, end = _window_params(len(out_spatial), window,
                                                            strides, dilations, start, end)
    c = rows // math.prod(window)
    blocks = window_counts(out_spatial, window, strides, dilations, start, end)
    acc = np.float64 if cols.dtype.kind == "f" else cols.dtype
    y = np.zeros((n, c, *out_spatial), acc)
    cols = cols.astype(acc).reshape(n, c, *window, *blocks)
    with np.errstate(over="ignore"):
        for tap, b_sl, i_sl in window_taps(out_spatial, blocks, window, strides, dilations,
                                           start):
            y[(slice(None), slice(None)) + i_sl] += cols[(slice(None), slice(None)) + tap + b_sl]
    return y


def lp_pooling_reference(x: np.ndarray, window, strides=None, dilations=None, start=None,
                         end=None, p: int = 2) -> np.ndarray:
    """DML_LP_POOLING1_OPERATOR_DESC: ``(sum |x|^p)^(1/p)`` over each dilated window of
    the zero-padded input, in float64, scaled by the window's largest magnitude so that
    no power overflows or underflows.  A NaN in a window gives NaN, else an infinity
    gives infinity."""
    window, strides, dilations, start, end = _window_params(x.ndim - 2, window, strides,
                                                            dilations, start, end)
    ax = np.abs(x.astype(np.float64))
    outs = window_counts(x.shape[2:], window, strides, dilations, start, end)
    taps = list(window_taps(x.shape[2:], outs, window, strides, dilations, start))
    peak = np.zeros(x.shape[:2] + tuple(outs))
    for _, o_sl, i_sl in taps:
        at = (slice(None), slice(None)) + o_sl
        peak[at] = np.fmax(peak[at], ax[(slice(None), slice(None)) + i_sl])
    nan = np.zeros(peak.shape, bool)
    total = np.zeros(peak.shape)
    scale = np.where(peak > 0, peak, 1.0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for _, o_sl, i_sl in taps:
            at = (slice(None), slice(None)) + o_sl
            v = ax[(slice(None), slice(None)) + i_sl]
            nan[at] |= np.isnan(v)
            total[at] += np.where(np.isinf(scale[at]), np.isinf(v), v / scale[at]) ** p
        y = np.where(peak > 0, peak * total ** (1.0 / p), 0.0)
    return np.where(nan, np.nan, y)


def convolution_reference(x: np.ndarray, w: np.ndarray, b=None, strides=None, dilations=None,
                          start=None, end=None, outpad=None, groups: int = 1,
                          mode: str = "cross_correlation",
                          direction: str = "forward") -> np.ndarray:
    """DML_CONVOLUTION_OPERATOR_DESC in float64.  Forward: each output sums the filter
    times its window of the zero-padded input; backward (transposed): each input element
    scatters the filter times itself into the output, cropped by the paddings.  Output
    padding appends zeros (the bias is added to them too); CONVOLUTION mode flips the
    filter on every spatial axis; ``b`` is any shape with ``C_out`` elements."""
    d = x.ndim - 2
    strides, dilations, start, end, outpad = (_ints(strides, d, 1), _ints(dilations, d, 1),
                                              _ints(start, d, 0), _ints(end, d, 0),
                                              _ints(outpad, d, 0))
    groups = int(groups)
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    if mode == "convolution":
        w = w[(slice(None), slice(None)) + (slice(None, None, -1),) * d]
    n, cin = x.shape[:2]
    cin_g, window = cin // groups, w.shape[2:]
    if direction == "forward":
        cout = w.shape[0]
        conv = window_counts(x.shape[2:], window, strides, dilations, start, end)
        y = np.zeros((n, cout) + tuple(c + p for c, p in zip(conv, outpad)))
        wg = w.reshape(groups, cout // groups, cin_g, *window)
        for tap, o_sl, i_sl in window_taps(x.shape[2:], conv, window, strides, dilations,
                                           start):
            xs = x[(slice(None), slice(None)) + i_sl]
            part = wg[(slice(None),) * 3 + tap] @ xs.reshape(n, groups, cin_g, -1)
            y[(slice(None), slice(None)) + o_sl] += part.reshape(n, cout, *xs.shape[2:])
    else:
        cout_g = w.shape[1]
        cout = cout_g * groups
        size = [(i - 1) * s + dl * (k - 1) + 1 - a - e + p for i, s, dl, k, a, e, p in
                zip(x.shape[2:], strides, dilations, window, start, end, outpad)]
        y = np.zeros((n, cout, *size))
        wg = np.swapaxes(w.reshape(groups, cin_g, cout_g, *window), 1, 2)
        for tap, i_sl, o_sl in window_taps(size, x.shape[2:], window, strides, dilations,
                                           start):
            xs = x[(slice(None), slice(None)) + i_sl]
            part = wg[(slice(None),) * 3 + tap] @ xs.reshape(n, groups, cin_g, -1)
            y[(slice(None), slice(None)) + o_sl] += part.reshape(n, cout, *xs.shape[2:])
    if b is not None:
        y += np.asarray(b, np.float64).reshape((1, -1) + (1,) * d)
    return y


# -- fused activations (dml-fused-activations.md): each page's formula -----------------------
def _softplus(z):
    return np.logaddexp(0.0, z)          # ln(1 + exp(z)) without overflow


def _erf(z):
    return np.vectorize(math.erf, otypes=[np.float64])(z)


def _clip(x, min, max, scale_bias=None):  # noqa: A002 (the page's names)
    scale = scale_bias.scale if scale_bias is not None else 1.0
    bias = scale_bias.bias if scale_bias is not None else 0.0
    return np.minimum(max, np.maximum(min, x * scale + bias))


# name -> formula(x, **parameters), in the page's order
ACTIVATION_FORMULAS = {
    "linear": lambda x, alpha, beta: alpha * x + beta,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "hard_sigmoid": lambda x, alpha, beta: np.maximum(0, np.minimum(alpha * x + beta, 1)),
    "tanh": lambda x: np.tanh(x),
    "scaled_tanh": lambda x, alpha, beta: alpha * np.tanh(beta * x),
    "relu": lambda x: np.maximum(0, x),
    "leaky_relu": lambda x, alpha: np.where(x >= 0, x, alpha * x),
    "thresholded_relu": lambda x, alpha: np.where(x > alpha, x, 0),
    "elu": lambda x, alpha: np.where(x >= 0, x, alpha * np.expm1(x)),
    "celu": lambda x, alpha: np.maximum(0, x) + np.minimum(0, alpha * np.expm1(x / alpha)),
    "scaled_elu": lambda x, alpha, gamma: np.where(x > 0, gamma * x,
                                                   gamma * (alpha * np.exp(x) - alpha)),
    "softplus": lambda x, steepness: _softplus(steepness * x) / steepness,
    "parametric_softplus": lambda x, alpha, beta: alpha * _softplus(beta * x),
    "softsign": lambda x: x / (1 + np.abs(x)),
    "identity": lambda x: x,
    "shrink": lambda x, bias, threshold: np.where(
        x > threshold, x - bias, np.where(x < -threshold, x + bias, 0)),
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))),
    "clip": _clip,
}

_FLT_MAX = float(np.finfo(np.float32).max)
# The page's "typical default" of every parameter (ONNX's where the page gives none).
ACTIVATION_DEFAULTS = {
    "linear": dict(alpha=1.0, beta=0.0), "hard_sigmoid": dict(alpha=0.2, beta=0.5),
    "scaled_tanh": dict(alpha=1.0, beta=0.5), "leaky_relu": dict(alpha=0.01),
    "thresholded_relu": dict(alpha=1.0), "elu": dict(alpha=1.0), "celu": dict(alpha=1.0),
    "scaled_elu": dict(alpha=1.6732, gamma=1.0507), "softplus": dict(steepness=1.0),
    "parametric_softplus": dict(alpha=1.0, beta=1.0), "shrink": dict(bias=0.0, threshold=0.5),
    "clip": dict(scale_bias=None, min=-_FLT_MAX, max=_FLT_MAX),
}


def activation_reference(y: np.ndarray, name: str | None, **params) -> np.ndarray:
    """The fused activation ``name`` (None: none) of ``y``; parameters not given take the
    page's defaults."""
    if name is None:
        return y
    return ACTIVATION_FORMULAS[name](y, **{**ACTIVATION_DEFAULTS.get(name, {}), **params})


# -- the operators CNN models are made of ---------------------------------------------------
#: DML_ELEMENT_WISE_* binary functions and their NumPy formula (float64)
ELEMENT_WISE_BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
                       "divide": np.divide, "maximum": np.maximum, "minimum": np.minimum}


def element_wise_reference(function: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """DML_ELEMENT_WISE_{ADD, SUBTRACT, MULTIPLY, DIVIDE, MAX, MIN}: the formula element
    by element, ``b`` broadcast to ``a`` (NumPy broadcasting, as DML's zero strides)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return ELEMENT_WISE_BINARY[function](a, b)


def transpose_reference(x: np.ndarray, perm=None) -> np.ndarray:
    """DML_ELEMENT_WISE_IDENTITY of ``x`` read through permuted strides: output dimension
    ``d`` walks input dimension ``perm[d]`` (``perm`` None: a plain copy)."""
    return np.ascontiguousarray(x if perm is None else np.transpose(x, perm))


def slice_reference(x: np.ndarray, offsets, sizes, strides=None) -> np.ndarray:
    """DML_SLICE1: per dimension the elements ``offset + stride * i`` for ``i < size``."""
    strides = _ints(strides, x.ndim, 1)
    index = tuple(np.arange(sizes[d]) * strides[d] + int(offsets[d]) for d in range(x.ndim))
    return x[np.ix_(*index)]


def split_reference(x: np.ndarray, axis: int, sizes) -> list:
    """DML_SPLIT: consecutive pieces of ``sizes`` along ``axis``."""
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def resample_reference(x: np.ndarray, out_sizes, scales, mode: str, input_offsets,
                       output_offsets) -> np.ndarray:
    """DML_RESAMPLE1, one dimension after the other (both modes are separable): output
    ``o`` reads ``c = (o - OutputPixelOffset) / Scale - InputPixelOffset``; NEAREST the
    element ``floor(c + 0.5)``, LINEAR ``floor(c)`` and ``floor(c) + 1`` weighted
    ``1 - frac(c)`` and ``frac(c)``; indices clamped to the input."""
    y = np.asarray(x, np.float64)
    for d, (n_out, s, a, b) in enumerate(zip(out_sizes, scales, input_offsets,
                                             output_offsets)):
        n_in = y.shape[d]
        c = (np.arange(n_out, dtype=np.float64) - b) / s - a
        if mode == "nearest":
            y = np.take(y, np.clip(np.floor(c + 0.5), 0, n_in - 1).astype(np.int64), axis=d)
            continue
        lo = np.floor(c)
        frac = (c - lo).reshape((-1,) + (1,) * (y.ndim - d - 1))
        i0 = np.clip(lo, 0, n_in - 1).astype(np.int64)
        i1 = np.clip(lo + 1, 0, n_in - 1).astype(np.int64)
        y = np.take(y, i0, axis=d) * (1 - frac) + np.take(y, i1, axis=d) * frac
    return y


def _pool_windows(x, window, strides, dilations, start, end):
    n = x.ndim - 2
    window, strides, dilations, start, end = _window_params(n, window, strides, dilations,
                                                            start, end)
    outs = window_counts(x.shape[2:], window, strides, dilations, start, end)
    return outs, list(window_taps(x.shape[2:], outs, window, strides, dilations, start)), window


def max_pooling_reference(x: np.ndarray, window, strides=None, dilations=None, start=None,
                          end=None) -> np.ndarray:
    """DML_MAX_POOLING2: the maximum over each dilated window's cells inside the input
    (padding never wins)."""
    outs, taps, _ = _pool_windows(x, window, strides, dilations, start, end)
    y = np.full(x.shape[:2] + tuple(outs), -np.inf)
    for _, o_sl, i_sl in taps:
        at = (slice(None), slice(None)) + o_sl
        y[at] = np.maximum(y[at], x[(slice(None), slice(None)) + i_sl])
    return y


def average_pooling_reference(x: np.ndarray, window, strides=None, dilations=None,
                              start=None, end=None, include_padding=False) -> np.ndarray:
    """DML_AVERAGE_POOLING1: the sum over each dilated window divided by the window's
    size (``include_padding``) or by the count of its cells inside the input."""
    outs, taps, window = _pool_windows(x, window, strides, dilations, start, end)
    total = np.zeros(x.shape[:2] + tuple(outs))
    count = np.zeros(tuple(outs))
    for _, o_sl, i_sl in taps:
        total[(slice(None), slice(None)) + o_sl] += x[(slice(None), slice(None)) + i_sl]
        count[o_sl] += 1
    divisor = math.prod(window) if include_padding else np.maximum(count, 1)
    return total / divisor


#: DML_REDUCE_FUNCTION -> its formula over axes (float64, keepdims)
REDUCE_FUNCTIONS = {
    "sum": lambda x, axes: np.sum(x, axes, keepdims=True),
    "average": lambda x, axes: np.mean(x, axes, keepdims=True),
    "max": lambda x, axes: np.max(x, axes, keepdims=True),
    "min": lambda x, axes: np.min(x, axes, keepdims=True),
    "sum_square": lambda x, axes: np.sum(x * x, axes, keepdims=True),
    "l1": lambda x, axes: np.sum(np.abs(x), axes, keepdims=True),
    "l2": lambda x, axes: np.sqrt(np.sum(x * x, axes, keepdims=True)),
}


def reduce_reference(x: np.ndarray, function: str, axes) -> np.ndarray:
    """DML_REDUCE: ``function`` over ``axes``, the rank kept (reduced axes of size 1)."""
    return REDUCE_FUNCTIONS[function](x, tuple(int(a) for a in axes))


def gemm_reference(a, b, c=None, trans_a=False, trans_b=False, alpha=1.0, beta=1.0):
    """DML_GEMM: ``alpha * op(A) @ op(B) + beta * C`` in float64 (C broadcast)."""
    a = np.swapaxes(a, -1, -2) if trans_a else a
    b = np.swapaxes(b, -1, -2) if trans_b else b
    y = alpha * (np.asarray(a, np.float64) @ np.asarray(b, np.float64))
    return y if c is None else y + beta * c


def batch_normalization_reference(x, mean, variance, scale, bias, epsilon=1e-5):
    """DML_BATCH_NORMALIZATION: ``Scale * (x - Mean) / sqrt(Variance + Epsilon) + Bias``,
    the statistics broadcast to ``x``."""
    return scale * (x - mean) / np.sqrt(variance + epsilon) + bias


def softmax_reference(x: np.ndarray, axes) -> np.ndarray:
    """DML_ACTIVATION_SOFTMAX1: ``exp(x - max) / sum(exp(x - max))`` over ``axes``."""
    axes = tuple(int(a) for a in axes)
    e = np.exp(x - np.max(x, axes, keepdims=True))
    return e / np.sum(e, axes, keepdims=True)

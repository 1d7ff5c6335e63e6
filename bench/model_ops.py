"""The operators CNN models are made of, as bench workloads: element-wise binary
operators and identity (a copy or a transpose), join, split, slice, resample, max and
average pooling, reduce, GEMM, batch normalization and softmax.

Per operator: its parameters as a workload file writes them (:func:`normalize`), its
inputs in DML binding order, its float64 reference (``bench/references.py``), its work
(GEMM: FLOPs; every other one: bytes read and written), the call of vkml's functional
form and its DML descriptor.  ``bench/operators.py`` hands these operators here.

Parameters (``p`` after :func:`normalize`; ``shape`` is always the first input's,
``out_shapes`` every output's, ``out_shape`` the first, or for ``split`` the whole):

* ``element_wise``: ``function`` (add, subtract, multiply, divide, maximum, minimum),
  ``a`` and ``b`` (shapes; ``b`` broadcasts to ``a`` as NumPy's);
* ``identity``: ``shape``, ``perm`` (optional: the output is ``x.transpose(perm)``,
  read through the input's strides permuted);
* ``join``: ``shapes``, ``axis``; ``split``: ``shape``, ``axis``, ``sizes``;
* ``slice``: ``shape``, ``offsets``, ``sizes``, ``strides`` (1);
* ``resample``: ``shape``, ``scales`` (one per dimension), ``mode`` (nearest, linear),
  ``input_pixel_offsets``/``output_pixel_offsets`` (0.5/-0.5: pixel centres, as PyTorch
  and ONNX's half_pixel);
* ``max_pooling``/``average_pooling``: ``shape``, ``window`` (``"global"``: the spatial
  size), ``strides``, ``start_padding``, ``end_padding``, ``dilations``;
  ``include_padding`` (average, false);
* ``reduce``: ``shape``, ``function`` (sum, average, max, min, ...), ``axes``;
* ``gemm``: ``a`` (M, K), ``b`` (K, N; (N, K) with ``trans_b``), ``bias`` (a C of one row
  broadcast over M, false);
* ``batch_normalization``: ``shape`` (per-channel statistics), ``epsilon`` (1e-5);
* ``softmax``: ``shape``, ``axes`` ([-1]).
"""
from __future__ import annotations

import math

import numpy as np

from . import references

#: operator -> (vkml function, DML descriptor class, metric): GEMM counts FLOPs, the others
#: the bytes they move; the functions share their operator's name unless listed here.
_FUNCTION = {"element_wise": "add"}
_CLASS = {"element_wise": "ElementWiseAdd", "identity": "ElementWiseIdentity", "join": "Join",
          "split": "Split", "slice": "Slice", "resample": "Resample1",
          "max_pooling": "MaxPooling2", "average_pooling": "AveragePooling1",
          "reduce": "Reduce", "gemm": "Gemm", "batch_normalization": "BatchNormalization",
          "softmax": "ActivationSoftmax1"}
OPS = {op: (_FUNCTION.get(op, op), f"{cls}OperatorDesc", "flops" if op == "gemm" else "bytes")
       for op, cls in _CLASS.items()}

_DESC = {"add": "ElementWiseAddOperatorDesc", "subtract": "ElementWiseSubtractOperatorDesc",
         "multiply": "ElementWiseMultiplyOperatorDesc",
         "divide": "ElementWiseDivideOperatorDesc", "maximum": "ElementWiseMaxOperatorDesc",
         "minimum": "ElementWiseMinOperatorDesc"}


def _ints(value, neutral: int, n: int) -> list[int]:
    if value is None:
        return [neutral] * n
    if isinstance(value, int):
        return [value] * n
    return [int(v) for v in value]


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


# -- parameters -------------------------------------------------------------------------
def _pooling(p: dict) -> list[int]:
    spatial = p["shape"][2:]
    n = len(spatial)
    p["window"] = list(spatial) if p["window"] == "global" else _ints(p["window"], 1, n)
    for key, neutral in (("strides", 1), ("dilations", 1), ("start_padding", 0),
                         ("end_padding", 0)):
        p[key] = _ints(p.get(key), neutral, n)
    p.setdefault("include_padding", False)
    return list(p["shape"][:2]) + references.window_counts(
        spatial, p["window"], p["strides"], p["dilations"], p["start_padding"],
        p["end_padding"])


def _shapes(op: str, p: dict) -> list[list[int]]:
    """Fill ``p``'s defaults; the output shapes."""
    if op == "element_wise":
        p.setdefault("function", "add")
        if p["function"] not in references.ELEMENT_WISE_BINARY:
            raise ValueError(f"function {p['function']!r} is not one of "
                             f"{', '.join(references.ELEMENT_WISE_BINARY)}")
        p["shape"] = list(p["a"])
        return [list(np.broadcast_shapes(tuple(p["a"]), tuple(p["b"])))]
    if op == "identity":
        perm = p.setdefault("perm", None)
        return [list(p["shape"]) if perm is None else [p["shape"][d] for d in perm]]
    if op == "join":
        p["shape"] = list(p["shapes"][0])
        p["axis"] = _axis(p["axis"], len(p["shape"]))
        out = list(p["shape"])
        out[p["axis"]] = sum(s[p["axis"]] for s in p["shapes"])
        return [out]
    if op == "split":
        p["axis"] = _axis(p["axis"], len(p["shape"]))
        if sum(p["sizes"]) != p["shape"][p["axis"]]:
            raise ValueError(f"split sizes {p['sizes']} do not sum to the axis's size")
        return [[s if d != p["axis"] else k for d, s in enumerate(p["shape"])]
                for k in p["sizes"]]
    if op == "slice":
        p["strides"] = _ints(p.get("strides"), 1, len(p["shape"]))
        if any(o < 0 or o + (k - 1) * s >= n for o, k, s, n in
               zip(p["offsets"], p["sizes"], p["strides"], p["shape"])):
            raise ValueError("the slice reaches past the input")
        return [list(p["sizes"])]
    if op == "resample":
        n = len(p["shape"])
        p["scales"] = [float(s) for s in p["scales"]]
        p.setdefault("mode", "nearest")
        p.setdefault("input_pixel_offsets", [0.5] * n)
        p.setdefault("output_pixel_offsets", [-0.5] * n)
        return [[int(math.floor(s * k)) for s, k in zip(p["shape"], p["scales"])]]
    if op in ("max_pooling", "average_pooling"):
        return [_pooling(p)]
    if op == "reduce":
        p["axes"] = sorted(_axis(a, len(p["shape"])) for a in p["axes"])
        return [[1 if d in p["axes"] else s for d, s in enumerate(p["shape"])]]
    if op == "gemm":
        p.setdefault("trans_b", False)
        p.setdefault("bias", False)
        p["shape"] = list(p["a"])
        n = p["b"][0] if p["trans_b"] else p["b"][1]
        return [[p["a"][0], n]]
    if op == "batch_normalization":
        p.setdefault("epsilon", 1e-5)
        return [list(p["shape"])]
    p["axes"] = [_axis(a, len(p["shape"])) for a in p.setdefault("axes", [-1])]
    return [list(p["shape"])]


def normalize(op: str, p: dict) -> dict:
    """Fill the defaults of a workload's parameters and derive the shapes."""
    p = dict(p)
    outs = _shapes(op, p)
    p["out_shapes"] = outs
    p["out_shape"] = list(p["shape"]) if op == "split" else outs[0]
    return p


# -- inputs -----------------------------------------------------------------------------
def make_inputs(op: str, p: dict, dtype, rng) -> list:
    """The operator's inputs in DML binding order (None for an absent optional one)."""
    def normal(shape, scale=1.0):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype)

    if op == "element_wise":
        b = normal(p["b"])
        if p["function"] == "divide":       # away from zero: a quotient of moderate size
            b = (np.sign(b) * (np.abs(b) + 0.5)).astype(dtype)
        return [normal(p["a"]), b]
    if op == "join":
        return [normal(s) for s in p["shapes"]]
    if op == "gemm":
        k = p["a"][1]
        c = normal((1, p["out_shape"][1]), 0.1) if p["bias"] else None
        return [normal(p["a"]), normal(p["b"], 1.0 / math.sqrt(k)), c]
    if op == "batch_normalization":
        stat = [1, p["shape"][1]] + [1] * (len(p["shape"]) - 2)
        variance = (np.abs(normal(stat)) + 0.5).astype(dtype)
        return [normal(p["shape"]), normal(stat, 0.5), variance, normal(stat), normal(stat)]
    return [normal(p["shape"])]


# -- work -------------------------------------------------------------------------------
def flops(op: str, p: dict) -> float:
    """GEMM's multiply-adds (2 FLOPs each); 0 for the operators that move data."""
    if op != "gemm":
        return 0.0
    return 2.0 * math.prod(p["out_shape"]) * p["a"][1]


#: Bytes the memory system fetches at once (a CPU's cache line; a GPU's sector is 32).
LINE_BYTES = 64


def slice_bytes(p: dict, itemsize: int) -> int:
    """A slice's bytes moved: its output written, plus the input rows it reads.  A row
    whose step is shorter than a cache line (:data:`LINE_BYTES`) has an element in every
    line of its span, so the whole span is fetched, whatever the kernel: a stride-2 row
    of n elements reads 2n - 1 of them.  Longer steps count the elements copied."""
    n = p["out_shape"][-1]
    out = math.prod(p["out_shape"])
    step = abs(p["strides"][-1])
    row = (n - 1) * step + 1 if step * itemsize < LINE_BYTES else n
    return (out + out // n * row) * itemsize


# -- the reference ----------------------------------------------------------------------
def compute(op: str, p: dict, xs: list):
    """The operator by its reference (a list of arrays for ``split``)."""
    R = references
    if op == "element_wise":
        return R.element_wise_reference(p["function"], *xs)
    if op == "identity":
        return R.transpose_reference(xs[0], p["perm"])
    if op == "join":
        return np.concatenate(xs, axis=p["axis"])
    if op == "split":
        return R.split_reference(xs[0], p["axis"], p["sizes"])
    if op == "slice":
        return R.slice_reference(xs[0], p["offsets"], p["sizes"], p["strides"])
    if op == "resample":
        return R.resample_reference(xs[0], p["out_shape"], p["scales"], p["mode"],
                                    p["input_pixel_offsets"], p["output_pixel_offsets"])
    window = (p.get("window"), p.get("strides"), p.get("dilations"), p.get("start_padding"),
              p.get("end_padding"))
    if op == "max_pooling":
        return R.max_pooling_reference(xs[0], *window)
    if op == "average_pooling":
        return R.average_pooling_reference(xs[0], *window, p["include_padding"])
    if op == "reduce":
        return R.reduce_reference(xs[0], p["function"], p["axes"])
    if op == "gemm":
        return R.gemm_reference(xs[0], xs[1], xs[2], trans_b=p["trans_b"])
    if op == "batch_normalization":
        return R.batch_normalization_reference(*xs, epsilon=p["epsilon"])
    return R.softmax_reference(xs[0], p["axes"])


# -- vkml -------------------------------------------------------------------------------
def vkml_call(vkml, op: str, p: dict, inputs: list, device):
    """vkml's functional form (NumPy in, NumPy out); a transpose, which the functional
    ``identity`` does not express, runs its descriptor on device tensors."""
    if op == "element_wise":
        return getattr(vkml, p["function"])(inputs[0], inputs[1], device=device)
    if op == "identity":
        if p["perm"] is None:
            return vkml.identity(inputs[0], device=device)
        return _transpose(vkml, p, inputs[0], device)
    if op == "join":
        return vkml.join(inputs, p["axis"], device=device)
    if op == "split":
        return vkml.split(inputs[0], p["axis"], list(p["sizes"]), device=device)
    if op == "slice":
        return vkml.slice(inputs[0], list(p["offsets"]), list(p["sizes"]), list(p["strides"]),
                          device=device)
    if op == "resample":
        return vkml.resample(inputs[0], p["scales"], sizes=p["out_shape"],
                             mode=p["mode"], input_pixel_offsets=p["input_pixel_offsets"],
                             output_pixel_offsets=p["output_pixel_offsets"], device=device)
    window = dict(strides=p.get("strides"), start_padding=p.get("start_padding"),
                  end_padding=p.get("end_padding"), dilations=p.get("dilations"))
    if op == "max_pooling":
        return vkml.max_pooling(inputs[0], list(p["window"]), **window, device=device)
    if op == "average_pooling":
        return vkml.average_pooling(inputs[0], list(p["window"]), **window,
                                    include_padding=p["include_padding"], device=device)
    if op == "reduce":
        return vkml.reduce(inputs[0], p["function"], list(p["axes"]), device=device)
    if op == "gemm":
        return vkml.gemm(inputs[0], inputs[1], inputs[2], trans_b=p["trans_b"], device=device)
    if op == "batch_normalization":
        return vkml.batch_normalization(*inputs, epsilon=p["epsilon"], device=device)
    return vkml.softmax(inputs[0], list(p["axes"]), device=device)


def _transpose(vkml, p, x, device):
    dev = device or vkml.default_device()
    compiled = dev.compiled(dml_desc(vkml.dml, "identity", p, x.dtype))
    t = dev.tensor(x)
    y = dev.empty(tuple(p["out_shape"]), x.dtype)
    try:
        compiled.execute([t], [y])
        return y.numpy()
    finally:
        t.free()
        y.free()


def dml_desc(dml, op: str, p: dict, dtype):
    """The DML descriptor of the workload, inputs in the order of :func:`make_inputs`."""
    T = dml.TensorDesc
    x = T(dtype, tuple(p["shape"]))
    y = T(dtype, tuple(p["out_shape"]))
    if op == "element_wise":
        out = tuple(p["out_shape"])
        # operands read with NumPy broadcasting (zero strides)
        a, b = (dml.broadcast_tensor_desc(dtype, p[k], out) for k in "ab")
        return getattr(dml, _DESC[p["function"]])(a, b, y)
    if op == "identity":
        if p["perm"] is None:
            return dml.ElementWiseIdentityOperatorDesc(x, y)
        packed = dml.packed_strides(p["shape"])
        src = T(dtype, tuple(p["out_shape"]), tuple(packed[d] for d in p["perm"]))
        return dml.ElementWiseIdentityOperatorDesc(src, y)
    if op == "join":
        return dml.JoinOperatorDesc(tuple(T(dtype, tuple(s)) for s in p["shapes"]), y,
                                    p["axis"])
    if op == "split":
        return dml.SplitOperatorDesc(x, tuple(T(dtype, tuple(s)) for s in p["out_shapes"]),
                                     p["axis"])
    if op == "slice":
        return dml.SliceOperatorDesc(x, y, tuple(p["offsets"]), tuple(p["sizes"]),
                                     tuple(p["strides"]))
    if op == "resample":
        mode = dml.InterpolationMode.LINEAR if p["mode"] == "linear" else \
            dml.InterpolationMode.NEAREST_NEIGHBOR
        return dml.Resample1OperatorDesc(x, y, mode, tuple(p["scales"]),
                                         tuple(p["input_pixel_offsets"]),
                                         tuple(p["output_pixel_offsets"]))
    return _dml_rest(dml, op, p, dtype, x, y)


def _dml_rest(dml, op, p, dtype, x, y):
    T = dml.TensorDesc
    window = (tuple(p.get("window", ())), tuple(p.get("start_padding", ())),
              tuple(p.get("end_padding", ())), tuple(p.get("dilations", ())))
    if op == "max_pooling":
        w, a, b, d = window
        return dml.MaxPooling2OperatorDesc(x, y, None, tuple(p["strides"]), w, a, b, d)
    if op == "average_pooling":
        w, a, b, d = window
        return dml.AveragePooling1OperatorDesc(x, y, tuple(p["strides"]), w, a, b, d,
                                               p["include_padding"])
    if op == "reduce":
        return dml.ReduceOperatorDesc(dml.ReduceFunction[p["function"].upper()], x, y,
                                      tuple(p["axes"]))
    if op == "gemm":
        b = T(dtype, tuple(p["b"]))
        c = dml.broadcast_tensor_desc(dtype, (1, p["out_shape"][1]), tuple(p["out_shape"])) \
            if p["bias"] else None
        trans = dml.MatrixTransform.TRANSPOSE if p["trans_b"] else dml.MatrixTransform.NONE
        return dml.GemmOperatorDesc(x, b, c, y, dml.MatrixTransform.NONE, trans)
    if op == "batch_normalization":
        stat = T(dtype, tuple([1, p["shape"][1]] + [1] * (len(p["shape"]) - 2)))
        return dml.BatchNormalizationOperatorDesc(x, stat, stat, stat, stat, y, True,
                                                  p["epsilon"])
    return dml.ActivationSoftmax1OperatorDesc(x, y, tuple(p["axes"]))

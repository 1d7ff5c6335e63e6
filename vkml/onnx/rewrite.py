"""Graph rewrites at ``prepare`` (package doc, step 3), beyond the fusions DirectML
documents (which the graph compiler, ``vkml/ops/graph.py``, does):

* ``"batch_normalization"``: a Conv (or ConvTranspose) whose output only an inference
  BatchNormalization reads, with the weights, the bias (if any) and the four statistics
  all constants, becomes one Conv with ``W' = W * s`` per output channel and
  ``B' = (B - mean) * s + bias``, ``s = scale / sqrt(var + epsilon)`` (ONNX
  BatchNormalization's formula), computed in float64 and cast to the weights' type.
  The Conv keeps its name and writes the BatchNormalization's output.
* ``"swish"``: ``Mul(x, Sigmoid(x))`` (either operand order; SiLU) where the Mul is the
  Sigmoid's only reader becomes one ``Swish(x, alpha=1)``: DML_ACTIVATION_SWISH with
  ``SigmoidInputScale`` 1 on the device.
* ``"hard_swish"``: ``Mul(x, HardSigmoid(x, alpha=1/6, beta=0.5))`` (what exporters write
  for HardSwish before opset 14) likewise becomes one ``HardSwish(x)``:
  DML_ACTIVATION_HARD_SWISH.

Swish and HardSwish are rewritten only for float32/float16 data, the activation
operators' types: elsewhere the host runs the model as written.  The Swish or HardSwish
node keeps the Mul's name.

Why here, after ``fold`` and before ``place``: the BatchNormalization statistics and
weights must be known values, and ``fold`` is what turns ``Constant`` nodes and constant
subgraphs into values; and ``place`` then sees the rewritten nodes as any others (their
placement, partitions, host fallback), so nothing after it needs to know about rewrites.
The rewritten nodes are ordinary ONNX nodes, so a partition the device refuses runs them
on the host (:func:`host_ops` gives the reference evaluator Swish and HardSwish at the
model's opset, which may predate them).

``prepare(model, rewrites=False)`` switches them off (to measure them), and a collection
of kinds (:data:`KINDS`) keeps only those; ``rep.rewrites`` lists what was done
(:class:`Rewrite`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnx import helper

from ..errors import ValidationError
from .execute import node_label, subgraph_inputs

#: The rewrites, by kind (the module doc says what each does).
KINDS = ("batch_normalization", "swish", "hard_swish")

_DEFAULT = ("", "ai.onnx")
_ACTIVATION_TYPES = {np.dtype(np.float32), np.dtype(np.float16)}
_GRAPH_OUTPUT = -1          # a consumer standing for "the graph outputs it"


@dataclass(frozen=True)
class Rewrite:
    """One rewrite done at ``prepare``: its ``kind`` (:data:`KINDS`), the labels of the ONNX
    nodes it replaced (``absorbed``, in graph order), and the label and op type of the
    node that replaces them (``node``, ``op_type``)."""

    kind: str
    absorbed: tuple
    node: str
    op_type: str


def rewrite_kinds(value) -> frozenset:
    """The kinds ``prepare(rewrites=value)`` asks for: True every kind, False or None none,
    else a collection of names of :data:`KINDS` (ValidationError naming ``rewrites``)."""
    if value is True:
        return frozenset(KINDS)
    if value is False or value is None:
        return frozenset()
    names = [value] if isinstance(value, str) else value
    try:
        kinds = frozenset(names)
    except TypeError:
        raise ValidationError("rewrites", f"must be True, False or a collection of "
                              f"{list(KINDS)}, got {value!r}") from None
    unknown = sorted(map(repr, kinds - set(KINDS)))
    if unknown:
        raise ValidationError("rewrites", f"unknown kind(s) {', '.join(unknown)} "
                              f"(the kinds: {list(KINDS)})")
    return kinds


def rewrite(rest: list, consts: dict, types: dict, output_names, kinds=KINDS) -> tuple:
    """``(rest, consts, rewrites)``: ``rest`` (``(index, node)`` in graph order, as ``fold``
    gives it) with the rewrites of ``kinds`` done, ``consts`` with the folded weights
    added (the inputs stay as given), and the :class:`Rewrite` s done."""
    consts = dict(consts)
    done: list = []
    nodes = list(rest)
    if "batch_normalization" in kinds:
        nodes = _fold_batch_normalizations(nodes, consts, output_names, done)
    if kinds & {"swish", "hard_swish"}:
        nodes = _swishes(nodes, types, output_names, kinds, done)
    return nodes, consts, done


def _graph_maps(nodes, output_names) -> tuple[dict, dict]:
    """``(producer, readers)``: value name -> position in ``nodes`` of the node writing
    it; value name -> positions of the nodes reading it (subgraphs included), with
    ``_GRAPH_OUTPUT`` for a graph output."""
    producer, readers = {}, {}
    for p, (_, node) in enumerate(nodes):
        for o in node.output:
            if o:
                producer[o] = p
        for x in set(node.input) | subgraph_inputs(node):
            if x:
                readers.setdefault(x, []).append(p)
    for o in output_names:
        readers.setdefault(o, []).append(_GRAPH_OUTPUT)
    return producer, readers


def _fresh(name: str, taken: set) -> str:
    """``name`` made unique among ``taken`` (and added to it)."""
    new, k = name, 1
    while new in taken:
        new, k = f"{name}_{k}", k + 1
    taken.add(new)
    return new


def _fold_batch_normalizations(nodes, consts, output_names, done) -> list:
    """``nodes`` with each Conv/ConvTranspose + BatchNormalization pair that folds
    (:func:`folded_weights`) as one Conv; its weights added to ``consts``."""
    producer, readers = _graph_maps(nodes, output_names)
    taken = set(consts) | set(producer) | set(readers)
    out = list(nodes)
    for p, (i, bn) in enumerate(nodes):
        if bn.op_type != "BatchNormalization" or bn.domain not in _DEFAULT or not bn.input:
            continue
        q = producer.get(bn.input[0])
        if q is None or readers.get(bn.input[0]) != [p]:
            continue
        j, conv = nodes[q]
        if conv.op_type not in ("Conv", "ConvTranspose") or conv.domain not in _DEFAULT:
            continue
        folded = folded_weights(conv, bn, consts)
        if folded is None:
            continue
        w, b = folded
        names = [_fresh(f"{conv.input[1]}/batch_normalization_folded", taken),
                 _fresh(f"{bn.input[2]}/batch_normalization_folded", taken)]
        consts[names[0]], consts[names[1]] = w, b
        new = helper.make_node(conv.op_type, [conv.input[0]] + names, [bn.output[0]],
                               name=conv.name, domain=conv.domain)
        new.attribute.extend(conv.attribute)
        out[q], out[p] = (j, new), None
        done.append(Rewrite("batch_normalization", (node_label(conv, j), node_label(bn, i)),
                            node_label(new, j), new.op_type))
    return [x for x in out if x is not None]


def folded_weights(conv, bn, consts) -> tuple | None:
    """``(W', B')`` for ``conv`` followed by the BatchNormalization ``bn``, or None when
    they do not fold: a parameter that is not a constant, BatchNormalization in training
    mode (ONNX ``training_mode``, extra outputs) or not per channel (``spatial=0`` before
    opset 9), statistics not 1-D of the output channels' count."""
    a = {at.name: helper.get_attribute_value(at) for at in bn.attribute}
    if int(a.get("training_mode", 0)) or not int(a.get("spatial", 1)) or any(bn.output[1:]) \
            or len(bn.input) != 5 or len(conv.output) != 1:
        return None
    w = consts.get(conv.input[1]) if len(conv.input) > 1 else None
    has_bias = len(conv.input) > 2 and bool(conv.input[2])
    b = consts.get(conv.input[2]) if has_bias else None
    stats = [consts.get(n) for n in bn.input[1:]]
    arrays = [w] + stats + ([b] if has_bias else [])
    if not all(isinstance(v, np.ndarray) and v.dtype.kind == "f" for v in arrays) \
            or w.ndim < 3:
        return None
    group = int(next((helper.get_attribute_value(at) for at in conv.attribute
                      if at.name == "group"), 1))
    transposed = conv.op_type == "ConvTranspose"
    if group < 1 or (transposed and w.shape[0] % group):
        return None
    m = w.shape[1] * group if transposed else w.shape[0]
    if any(v.shape != (m,) for v in arrays[1:]):
        return None
    scale, bias, mean, var = (v.astype(np.float64) for v in stats)
    with np.errstate(all="ignore"):     # var + eps <= 0 gives NaN, as BatchNormalization does
        s = scale / np.sqrt(var + float(a.get("epsilon", 1e-5)))
        w64 = w.astype(np.float64)
        if transposed:
            # W: (C, M / group, k...): output channel g * M / group + o is W[g's C, o]
            grouped = w64.reshape((group, w.shape[0] // group) + w.shape[1:])
            w64 = (grouped * s.reshape((group, 1, w.shape[1]) + (1,) * (w.ndim - 2)))
            w64 = w64.reshape(w.shape)
        else:
            w64 = w64 * s.reshape((m,) + (1,) * (w.ndim - 1))
        b64 = (b.astype(np.float64) if has_bias else np.zeros(m)) - mean
        b64 = b64 * s + bias
    return w64.astype(w.dtype), b64.astype(w.dtype)


def _swish_kind(act, attrs) -> str | None:
    """"swish" for a Sigmoid, "hard_swish" for HardSigmoid(alpha=1/6, beta=0.5) (as
    float32, the attributes' type), else None."""
    if act.op_type == "Sigmoid":
        return "swish"
    if act.op_type == "HardSigmoid" and \
            np.float32(attrs.get("alpha", 0.2)) == np.float32(1 / 6) and \
            np.float32(attrs.get("beta", 0.5)) == np.float32(0.5):
        return "hard_swish"
    return None


def _swishes(nodes, types, output_names, kinds, done) -> list:
    """``nodes`` with each Mul of x by Sigmoid(x) or HardSigmoid(x, 1/6, 0.5), the Mul
    being the activation's only reader, as one Swish or HardSwish (``kinds``)."""
    producer, readers = _graph_maps(nodes, output_names)
    out = list(nodes)
    for p, (i, mul) in enumerate(nodes):
        if mul.op_type != "Mul" or mul.domain not in _DEFAULT or len(mul.input) != 2 \
                or mul.input[0] == mul.input[1]:
            continue
        for k in (0, 1):
            s, x = mul.input[k], mul.input[1 - k]
            q = producer.get(s)
            if q is None or out[q] is None or readers.get(s) != [p]:
                continue
            j, act = nodes[q]
            if act.domain not in _DEFAULT or list(act.input) != [x]:
                continue
            kind = _swish_kind(act, {at.name: helper.get_attribute_value(at)
                                     for at in act.attribute})
            if kind not in kinds or types.get(x) not in _ACTIVATION_TYPES:
                continue
            new = (helper.make_node("Swish", [x], [mul.output[0]], name=mul.name, alpha=1.0)
                   if kind == "swish" else
                   helper.make_node("HardSwish", [x], [mul.output[0]], name=mul.name))
            out[p], out[q] = (i, new), None
            absorbed = sorted([(j, node_label(act, j)), (i, node_label(mul, i))])
            done.append(Rewrite(kind, tuple(label for _, label in absorbed),
                                node_label(new, i), new.op_type))
            break
    return [x for x in out if x is not None]


def host_ops(opset: int) -> list:
    """Swish and HardSwish for ONNX's reference evaluator (the host) where the model's
    ``opset`` predates them (HardSwish is opset 14, Swish opset 24): a rewritten node
    may run on the host (in a partition the device refuses).  ONNX's formulas."""
    from onnx.reference.op_run import OpRun

    def wide(x):
        return x.astype(np.float64 if x.dtype == np.float64 else np.float32)

    class Swish(OpRun):
        op_domain = ""

        def _run(self, x, alpha=None):
            a = 1.0 if alpha is None else float(alpha)
            v = wide(x)
            # x * sigmoid(a x), as tanh: no overflow for large |x|
            return ((v * (0.5 + 0.5 * np.tanh(0.5 * a * v))).astype(x.dtype),)

    class HardSwish(OpRun):
        op_domain = ""

        def _run(self, x):
            v = wide(x)
            return ((v * np.clip(v / 6 + 0.5, 0, 1)).astype(x.dtype),)

    return [op for op, since in ((Swish, 24), (HardSwish, 14)) if opset < since]

"""Constant folding (package doc, step 2): the nodes whose inputs are all constant are
evaluated once, node by node, by ONNX's reference evaluator, each only after ONNX shape
inference (reading its constant inputs) shows its outputs fit :func:`fold_limit`.  An
op whose output size nothing here can tell beforehand is evaluated, then checked.
``Shape`` and ``Size`` of values whose dimensions are static (declared model inputs, and
what ONNX shape inference derives from them) are constants too, so that a model exported
without simplification loses its shape subgraphs (``Shape -> Gather -> Unsqueeze ->
Concat -> Reshape``) here, before placement."""
from __future__ import annotations

import math

import numpy as np

import onnx
from onnx import helper, numpy_helper

from ..errors import ValidationError
from .execute import host_ops, node_label, subgraph_inputs

#: Ops whose nodes run on the host even when all their inputs are constant (not folded).
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                     "Multinomial", "Bernoulli"}

#: Bytes any model may have folding produce, whatever its own size: a small model may
#: still build a mask or a table from a shape.
FOLD_BYTES_MIN = 256 << 20

#: Inputs up to this many elements are given to shape inference as values (shapes, pads,
#: repeats); larger ones only as shapes, so that a model's weights are not serialized.
_INFER_VALUES_MAX = 4096


def fold_limit(inits: dict) -> int:
    """The most bytes folding may produce, per value and in all: what a model's own
    tensors take, times 8 (an int8 weight dequantized to float32 and cast once more),
    and at least :data:`FOLD_BYTES_MIN`.  A model cannot make vkml allocate more at
    ``prepare`` (a Pad by 2**31, a ConstantOfShape of 2**20 x 2**20)."""
    own = sum(v.nbytes for v in inits.values() if isinstance(v, np.ndarray))
    return max(FOLD_BYTES_MIN, 8 * own)


def foldable(node, const: set) -> bool:
    return (node.op_type not in _NONDETERMINISTIC and node.domain in ("", "ai.onnx")
            and all(x in const for x in node.input if x)
            and not any(a.g.node or a.graphs for a in node.attribute))


def fold(model, inits: dict, output_names) -> tuple[dict, list, list]:
    """``(values, folded, rest)``: initializer and folded values by name; the folded
    ``(index, node)`` s, in graph order; the others.  Shape-only subgraphs fold too:
    ``Shape`` and ``Size`` of a value whose (selected) dimensions ONNX shape inference
    gives statically (:func:`static_dims`) are constants, and so is what is computed from
    them alone.  ValidationError naming the node when a folded value would exceed
    :func:`fold_limit` or its evaluation fails."""
    values = dict(inits)
    folded, pending = [], list(enumerate(model.graph.node))
    budget = [fold_limit(inits), 0]              # the limit, and bytes folded so far
    for _ in range(_SHAPE_PASSES):
        # dimensions are inferred again after a pass that folded something, as far as
        # Shape/Size nodes remain: a folded Reshape's shape gives its output's dimensions
        dims = static_dims(model, values, pending) if _shape_ops(pending, values) else {}
        before = len(folded)
        pending = _fold_pass(model, pending, values, dims, folded, budget)
        if len(folded) == before or not _shape_ops(pending, values):
            break
    folded.sort(key=lambda item: item[0])
    needed = {x for _, n in pending for x in list(n.input) + sorted(subgraph_inputs(n))}
    needed |= set(output_names) | set(inits)
    return {k: v for k, v in values.items() if k in needed}, folded, pending


#: Rounds of shape inference and folding at most (each round folds what the previous
#: one made static: a shape chain through a computed Reshape takes two, a detection
#: neck's chained ones several); the loop ends as soon as a round folds nothing.
_SHAPE_PASSES = 16

#: Ops folded from their input's static dimensions alone (its values are not read).
SHAPE_OPS = ("Shape", "Size")


def _shape_ops(pending, values) -> bool:
    return any(n.op_type in SHAPE_OPS and n.domain in ("", "ai.onnx") and n.input
               and n.input[0] not in values for _, n in pending)


def _fold_pass(model, pending, values, dims, folded, budget) -> list:
    """Folds, in graph order, each pending node whose inputs are all constant (or a
    Shape/Size whose dimensions ``dims`` gives), into ``values`` and ``folded``; returns
    the nodes left."""
    rest = []
    for i, node in pending:
        shaped = shape_value(node, dims)
        if shaped is None and not foldable(node, values):
            rest.append((i, node))
            continue
        label = f"node {node_label(node, i)!r} ({node.op_type})"
        if shaped is not None:
            outs = [shaped]
        else:
            sizes = _inferred_bytes(model, node, values) or _legacy_bytes(node, values)
            for name, nbytes in sizes.items():
                _check_size(label, name, nbytes, budget[0], budget[1])
            outs = _evaluate(model, node, values, label)
        for name, v in zip(node.output, outs):
            if not name:
                continue
            nbytes = v.nbytes if isinstance(v, np.ndarray) else 0
            _check_size(label, name, nbytes, budget[0], budget[1])
            budget[1] += nbytes
            values[name] = v
        folded.append((i, node))
    return rest


def shape_value(node, dims: dict):
    """The value of a ``Shape`` (its ``start``/``end``, opset 15: negatives count from
    the end, clamped to [0, rank]) or ``Size`` node whose input's dimensions ``dims``
    gives (those it selects), as int64; else None."""
    if node.op_type not in SHAPE_OPS or node.domain not in ("", "ai.onnx") or \
            not node.input or node.input[0] not in dims:
        return None
    d = dims[node.input[0]]
    if node.op_type == "Size":
        return None if None in d else np.array(math.prod(d), np.int64)
    a = {at.name: helper.get_attribute_value(at) for at in node.attribute}
    sel = d[slice(int(a.get("start", 0)), None if "end" not in a else int(a["end"]))]
    return None if None in sel else np.array(sel, np.int64)


def static_dims(model, values: dict, pending) -> dict:
    """Value name -> its dimensions (an int each, None where not static) as ONNX shape
    inference gives them (``data_prop``: through shape arithmetic too) for the graph of
    the ``pending`` nodes, the constants ``values`` given as initializers (small ones) or
    by their shapes alone.  The model's declared inputs are checked at ``run``, so
    dimensions inferred from them hold for every run."""
    g = model.graph
    infos, inits = _const_infos(values)
    known = {vi.name for vi in infos}
    inputs = [vi for vi in g.input if vi.name not in known] + infos
    outs = [helper.make_value_info(o.name, onnx.TypeProto()) for o in g.output]
    m = helper.make_model(helper.make_graph([n for _, n in pending], "vkml_shapes", inputs,
                                            outs, inits),
                          opset_imports=model.opset_import, ir_version=model.ir_version,
                          functions=model.functions)
    try:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:
        return {}
    out = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + \
            list(inferred.graph.output):
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.HasField("shape"):
            out[vi.name] = [int(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0
                            else None for d in t.shape.dim]
    return out


def _const_infos(values: dict) -> tuple[list, list]:
    """Value infos of the constant arrays, and initializers of the small ones (up to
    :data:`_INFER_VALUES_MAX` elements: shapes, pads, indices; a model's weights are not
    serialized for shape inference)."""
    infos, inits = [], []
    for name, v in values.items():
        if not isinstance(v, np.ndarray) or v.dtype == object:
            continue
        try:
            elem = helper.np_dtype_to_tensor_dtype(v.dtype)
        except Exception:
            continue
        infos.append(helper.make_tensor_value_info(name, elem, v.shape))
        if v.size <= _INFER_VALUES_MAX:
            inits.append(numpy_helper.from_array(v, name))
    return infos, inits


def _check_size(label, name, nbytes, limit, total) -> None:
    if nbytes > limit or total + nbytes > limit:
        raise ValidationError(label, f"folding it at prepare would allocate {nbytes} bytes "
                              f"for {name!r} ({total} folded before it), more than the "
                              f"{limit} bytes this model's constants allow")


def _inferred_bytes(model, node, values) -> dict:
    """Bytes of each output whose shape ONNX shape inference gives, from the node's input
    values (small ones) and shapes; outputs it cannot size are left out."""
    infos, inits = _const_infos({x: values[x] for x in node.input if x in values})
    g = helper.make_graph([node], "vkml_fold_size", infos,
                          [helper.make_value_info(o, onnx.TypeProto()) for o in node.output
                           if o], inits)
    m = helper.make_model(g, opset_imports=model.opset_import, ir_version=model.ir_version)
    try:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:
        return {}
    out = {}
    for vi in inferred.graph.output:
        t = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not t.HasField("shape") or not t.elem_type:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if any(d is None or d < 0 for d in dims):
            continue
        try:
            item = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).itemsize
        except Exception:
            continue
        out[vi.name] = math.prod(dims) * item
    return out


def _legacy_bytes(node, values) -> dict:
    """Output bytes of the ops of old opsets ONNX shape inference does not size: Pad-1
    (``paddings``) and Tile-1 (``tiles`` and ``axis`` inputs)."""
    x = values.get(node.input[0]) if node.input else None
    if not isinstance(x, np.ndarray) or not node.output[0]:
        return {}
    dims = list(x.shape)
    a = {at.name: helper.get_attribute_value(at) for at in node.attribute}
    if node.op_type == "Pad" and len(a.get("paddings", a.get("pads", []))) == 2 * len(dims):
        pads = [int(p) for p in a.get("paddings", a.get("pads"))]
        dims = [d + b + e for d, b, e in zip(dims, pads, pads[len(dims):])]
    elif node.op_type == "Tile" and len(node.input) == 3:
        tiles, axis = (values.get(n) for n in node.input[1:])
        if tiles is None or axis is None or not -len(dims) <= int(axis) < len(dims):
            return {}
        dims[int(axis)] *= int(tiles)
    else:
        return {}
    return {node.output[0]: math.prod(max(d, 0) for d in dims) * x.itemsize}


def _evaluate(model, node, values, label) -> list:
    if node.op_type == "Identity" and node.domain in ("", "ai.onnx") \
            and isinstance(values.get(node.input[0]), np.ndarray):
        # (exporters pass initializers through Identity nodes, 16 in ResNet-18: the
        # evaluator, built per node, costs far more than the copy it would return)
        return [values[node.input[0]].copy()]
    from onnx.reference import ReferenceEvaluator

    ins = list(dict.fromkeys(x for x in node.input if x))
    g = helper.make_graph([node], "vkml_fold",
                          [helper.make_value_info(x, onnx.TypeProto()) for x in ins],
                          [helper.make_value_info(o, onnx.TypeProto()) for o in node.output
                           if o])
    m = helper.make_model(g, opset_imports=model.opset_import, ir_version=model.ir_version,
                          functions=model.functions)
    try:
        outs = ReferenceEvaluator(m, new_ops=host_ops(model)).run(
            None, {x: values[x] for x in ins})
    except (MemoryError, ValueError, TypeError, IndexError, RuntimeError,
            NotImplementedError) as exc:
        raise ValidationError(label, f"its inputs are constant, and evaluating it at prepare "
                              f"failed: {type(exc).__name__}: {exc}") from None
    it = iter(outs)
    return [next(it) if o else None for o in node.output]

"""Constant folding (package doc, step 2): the nodes whose inputs are all constant are
evaluated once, node by node, by ONNX's reference evaluator, each only after ONNX shape
inference (reading its constant inputs) shows its outputs fit :func:`fold_limit`.  An
op whose output size nothing here can tell beforehand is evaluated, then checked."""
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
    ``(index, node)`` s; the others.  ValidationError naming the node when a folded
    value would exceed :func:`fold_limit` or its evaluation fails."""
    const = set(inits)
    folded, rest = [], []
    for i, node in enumerate(model.graph.node):
        if foldable(node, const):
            folded.append((i, node))
            const.update(o for o in node.output if o)
        else:
            rest.append((i, node))
    values = dict(inits)
    limit = fold_limit(inits)
    total = 0
    for i, node in folded:
        label = f"node {node_label(node, i)!r} ({node.op_type})"
        sizes = _inferred_bytes(model, node, values) or _legacy_bytes(node, values)
        for name, nbytes in sizes.items():
            _check_size(label, name, nbytes, limit, total)
        for name, v in zip(node.output, _evaluate(model, node, values, label)):
            if not name:
                continue
            nbytes = v.nbytes if isinstance(v, np.ndarray) else 0
            _check_size(label, name, nbytes, limit, total)
            total += nbytes
            values[name] = v
    needed = {x for _, n in rest for x in list(n.input) + sorted(subgraph_inputs(n))}
    needed |= set(output_names) | set(inits)
    return {k: v for k, v in values.items() if k in needed}, folded, rest


def _check_size(label, name, nbytes, limit, total) -> None:
    if nbytes > limit or total + nbytes > limit:
        raise ValidationError(label, f"folding it at prepare would allocate {nbytes} bytes "
                              f"for {name!r} ({total} folded before it), more than the "
                              f"{limit} bytes this model's constants allow")


def _inferred_bytes(model, node, values) -> dict:
    """Bytes of each output whose shape ONNX shape inference gives, from the node's input
    values (small ones) and shapes; outputs it cannot size are left out."""
    inits, infos = [], []
    for x in dict.fromkeys(x for x in node.input if x):
        v = values.get(x)
        if not isinstance(v, np.ndarray) or v.dtype == object:
            continue
        try:
            elem = helper.np_dtype_to_tensor_dtype(v.dtype)
        except Exception:
            continue
        infos.append(helper.make_tensor_value_info(x, elem, v.shape))
        if v.size <= _INFER_VALUES_MAX:
            inits.append(numpy_helper.from_array(v, x))
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

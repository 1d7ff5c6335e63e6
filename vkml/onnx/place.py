"""Placement (package doc, step 3): each node not folded goes on the device when
:data:`~vkml.onnx.lower.DEVICE_OPS` lowers its op and data types, else on the host
(ONNX's reference evaluator), which must know it: a node neither ONNX's evaluator nor
the model's functions implement (an unknown domain) is refused here, at ``prepare``."""
from __future__ import annotations

import numpy as np

import onnx
from onnx import helper

from ..errors import UnsupportedError
from .execute import DevicePartition, HostPartition, host_ops, node_label, subgraph_inputs
from .lower import (DEVICE_OPS, GATHER_SLICES_MAX, HOST_ALIASES, HOST_BATCH_NORMALIZATION,
                    HOST_GATHER, HOST_POOLING, _activation_desc, _attrs,
                    _HostFallback, _lower_activation, gather_runs, resize_refusal)


def device_refusal(rep, node, producer_where: dict) -> str | None:
    """None if ``node`` can go on the device, else why not."""
    spec = DEVICE_OPS.get(node.op_type)
    if spec is None or node.domain not in ("", "ai.onnx"):
        return "vkml has no operator for it"
    x = node.input[0] if node.input else ""
    dt = rep.types.get(x)
    if dt is None:
        return f"input {x!r} is not a tensor of known element type"
    if dt not in spec.dtypes:
        return f"data type {dt} (the device operator takes {sorted(map(str, spec.dtypes))})"
    for i, name in enumerate(node.input):
        if name and i in spec.params and producer_where.get(name) == "device":
            return f"parameter input {name!r} is computed on the device"
    check = REFUSALS.get(node.op_type)
    return None if check is None else check(rep, node, dt)


def _pad_refusal(rep, node, dt) -> str | None:
    if len(node.input) > 1 and node.input[1] in rep.consts:
        if (np.asarray(rep.consts[node.input[1]]) < 0).any():
            return "negative pads (cropping): DML_PADDING takes UINT paddings"
    return None


def _dropout_refusal(rep, node, dt) -> str | None:
    if len(node.output) > 1 and node.output[1]:
        return HOST_ALIASES["dropout_mask"]
    if len(node.input) > 2 and node.input[2] in rep.consts and \
            bool(np.asarray(rep.consts[node.input[2]]).reshape(-1)[0]):
        return HOST_ALIASES["dropout_training"]
    return None


def _max_pool_refusal(rep, node, dt) -> str | None:
    if len(node.output) > 1 and node.output[1] and int(_attrs(node).get("storage_order", 0)):
        return HOST_POOLING["storage_order"]
    return None


def _batch_normalization_refusal(rep, node, dt) -> str | None:
    if int(_attrs(node).get("training_mode", 0)) or any(node.output[1:]):
        return HOST_BATCH_NORMALIZATION["training"]
    return None


def _activation_refusal(rep, node, dt) -> str | None:
    """What HOST_ACTIVATIONS lists, decided here when the parameters are constants."""
    def param(i):
        if i >= len(node.input) or not node.input[i]:
            return None
        return rep.consts.get(node.input[i])
    if all(x in rep.consts for x in node.input[1:] if x):
        try:
            _activation_desc(node, param)
        except _HostFallback as exc:
            return str(exc)
    return None


def _gather_refusal(rep, node) -> str | None:
    """What :data:`~vkml.onnx.lower.HOST_GATHER` lists, decided here: indices that are
    not constants, or too many runs of them where the axis' size is known (else, and
    for out-of-range indices, the lowering decides at ``run``)."""
    if len(node.input) < 2 or node.input[1] not in rep.consts:
        return HOST_GATHER["indices"]
    indices = np.asarray(rep.consts[node.input[1]])
    shape = rep.shapes.get(node.input[0])
    axis = int(_attrs(node).get("axis", 0))
    if shape is None or not -len(shape) <= axis < len(shape):
        return None
    n = shape[axis]
    if ((indices < -n) | (indices >= n)).any():
        return None
    if len(gather_runs(indices, n)) > GATHER_SLICES_MAX:
        return HOST_GATHER["slices"]
    return None


#: THE placement checks: op type -> f(rep, node, input 0's data type) giving the reason an
#: attribute or a constant parameter keeps the node on the host (the HOST_* tables'
#: entries that can be decided at ``prepare``), or None.  The lowering decides the rest.
REFUSALS = {"Pad": _pad_refusal, "Dropout": _dropout_refusal, "MaxPool": _max_pool_refusal,
            "BatchNormalization": _batch_normalization_refusal,
            "Gather": lambda rep, node, dt: _gather_refusal(rep, node),
            **dict.fromkeys(("Resize", "Upsample"),
                            lambda rep, node, dt: resize_refusal(node, dt)),
            **{op: _activation_refusal for op, spec in DEVICE_OPS.items()
               if spec.lower is _lower_activation}}


def check_host_partition(model, part, items) -> None:
    """Build the host partition's evaluator now; where ONNX's reference evaluator cannot
    run one of its nodes (an op of an unknown domain, ``com.example.MyOp``), raise
    UnsupportedError naming that node: at ``prepare``, not at ``run``."""
    try:
        part.evaluator()
    except Exception as exc:
        for i, node in items:
            check_host_node(model, node, i)
        raise UnsupportedError(f"the host partition of nodes "
                               f"{[node_label(n, i) for i, n in items]}",
                               f"ONNX's reference evaluator refuses it ({type(exc).__name__}: "
                               f"{exc})") from None


def check_host_node(model, node, index) -> None:
    """UnsupportedError naming ``node`` when ONNX's reference evaluator cannot run it."""
    from onnx.reference import ReferenceEvaluator

    g = helper.make_graph([node], "vkml_check",
                          [helper.make_value_info(x, onnx.TypeProto()) for x in node.input if x],
                          [helper.make_value_info(o, onnx.TypeProto()) for o in node.output if o])
    m = helper.make_model(g, opset_imports=model.opset_import, ir_version=model.ir_version,
                          functions=model.functions)
    try:
        ReferenceEvaluator(m, new_ops=host_ops(model))
    except Exception as exc:
        raise UnsupportedError(
            f"an operator for node {node_label(node, index)!r} (op type {node.op_type}, "
            f"domain {node.domain!r})", f"neither the device nor ONNX's reference evaluator "
            f"(the host) implements it ({type(exc).__name__}: {exc})") from None


def place(rep, rest) -> tuple[list, list]:
    """``(groups, partitions)``: maximal runs of ``rest``'s nodes with one placement,
    as ``(where, [(index, node), ...])``, and a partition object for each."""
    where = {}          # value name -> "device"/"host"
    placed = []         # (index, node, where)
    for i, node in rest:
        why = device_refusal(rep, node, where)
        if why is not None and rep.strict:
            raise UnsupportedError(
                f"an operator for node {node_label(node, i)!r} (op type "
                f"{node.op_type})", f"{why}; prepare(strict=False) runs it on the host")
        w = "device" if why is None else "host"
        for o in node.output:
            where[o] = w
        placed.append((i, node, w))
    groups = []
    for i, node, w in placed:
        if not groups or groups[-1][0] != w:
            groups.append((w, []))
        groups[-1][1].append((i, node))
    known = set(rep.all_input_names) | set(rep.consts) | {o for _, n in rest for o in n.output}
    parts = []
    for gi, (w, items) in enumerate(groups):
        produced = set()
        reads = []
        for _, node in items:
            for x in list(node.input) + sorted(subgraph_inputs(node)):
                if x and x not in produced:
                    reads.append(x)
            produced.update(o for o in node.output if o)
        later = set(rep.output_names)
        for _, its in groups[gi + 1:]:
            for _, node in its:
                later |= set(node.input) | subgraph_inputs(node)
        # a name read from an outer value that does not exist (subgraph-local) is dropped
        inputs = [x for x in dict.fromkeys(reads) if x not in produced and x in known]
        outputs = [o for o in dict.fromkeys(produced) if o in later]
        nodes = [n for _, n in items]
        if w == "device":
            parts.append(DevicePartition(rep, nodes, inputs, outputs))
        else:
            parts.append(HostPartition(rep, [(n, None) for n in nodes], inputs, outputs))
            check_host_partition(rep.model, parts[-1], items)
    return groups, parts

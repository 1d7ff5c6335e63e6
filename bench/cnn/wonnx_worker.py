"""``python -m bench.cnn.wonnx_worker MODEL.onnx X.npy Y.npy FIG.json DEVICE SECONDS REPEATS``:
wonnx's figures for one model (``peers.Wonnx``), run by the peers' virtualenv: the model
made ready for wonnx (``ready``), the session created (prepare), first run, hot runs.
wonnx runs on wgpu's Vulkan backend; which adapter wgpu took is read from wgpu's own log
(``RUST_LOG``, set by the parent) and must be ``DEVICE``, else the row is absent."""
from __future__ import annotations

import os
import re
import sys
import tempfile

import numpy as np

from .worker_io import Absent, answer, measure, same_device

_ADAPTER = re.compile(r'Adapter (\w+) AdapterInfo \{ name: "([^"]*)"')
_NODE = re.compile(r'node(?:_name)?: "([^"]*)"')


def ready(model) -> tuple:
    """(model, rewrites): the nodes computable without the input folded to constants
    (:func:`fold`); Slices, Concats on a later axis and the opset as wonnx takes them
    (:func:`slices_as_gathers`, :func:`concats_on_leading_axis`, :func:`lower_opset`);
    ONNX shape inference (wonnx sizes every buffer from the value
    infos and refuses a model without them, or with a symbolic dimension); each Gemm
    with ``transB=1`` on a constant B given B transposed instead (wonnx's Gemm takes B as
    K x N only); each Conv without ``kernel_shape`` (optional in ONNX: W's shape) given it
    (wonnx requires it).  The rewrites are named in the row's note."""
    import onnx
    from onnx import helper, numpy_helper

    done = fold(model)
    done += slices_as_gathers(model)
    done += concats_on_leading_axis(model)
    done += lower_opset(model)
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute}
        const_w = len(node.input) > 1 and node.input[1] in inits
        if node.op_type == "Gemm" and const_w and "transB" in attrs and attrs["transB"].i:
            old = inits[node.input[1]]
            old.CopyFrom(numpy_helper.from_array(
                np.ascontiguousarray(numpy_helper.to_array(old).T), old.name))
            attrs["transB"].i = 0
            done.append(f"Gemm {node.name}: transB=1 -> B transposed")
        elif node.op_type == "Conv" and const_w and "kernel_shape" not in attrs:
            node.attribute.append(helper.make_attribute(
                "kernel_shape", list(inits[node.input[1]].dims[2:])))
            done.append(f"Conv {node.name}: kernel_shape from W")
    _drop_unused(model)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True), done


def _drop_unused(model) -> None:
    """Remove the initializers no node reads (the folded shape arithmetic's, the
    rewritten Slices' arguments)."""
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    for t in [t for t in model.graph.initializer if t.name not in used]:
        model.graph.initializer.remove(t)


def fold(model) -> list:
    """Replace (in place) each node whose value does not depend on the input with
    initializers: Constant nodes, each Shape of a tensor whose shape inference knows, and
    every node whose inputs are all constants, evaluated by ONNX's reference runtime;
    repeated until nothing more folds.  torch.onnx writes YOLOv8n's channel split as
    Shape -> Gather -> Div -> Slice, which shape inference leaves with symbolic sizes
    (``unk__0``) that wonnx refuses.  Returns the rewrite's note ([] when none)."""
    from collections import Counter

    from onnx import numpy_helper

    folded = Counter()
    while True:
        consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        shapes = _static_shapes(model)
        keep = []
        for node in model.graph.node:
            values = _value(model, node, consts, shapes)
            if values is None:
                keep.append(node)
                continue
            folded[node.op_type] += 1
            for name, v in zip(node.output, values):
                consts[name] = v
                model.graph.initializer.append(numpy_helper.from_array(np.asarray(v), name))
        if len(keep) == len(model.graph.node):
            break
        del model.graph.node[:]
        model.graph.node.extend(keep)
    if not folded:
        return []
    return ["constants folded: " + ", ".join(f"{n} {op}" for op, n in sorted(folded.items()))]


def slices_as_gathers(model) -> list:
    """Each Slice with constant arguments, step 1, along one axis with only dimensions of
    1 before it (YOLOv8n's channel splits, its box halves) rewritten as Reshape to
    (that axis, the rest) -> Gather on axis 0 with int32 indices -> Reshape to the
    slice's shape: wonnx has no Slice, its Split gives zeros past the first output, its
    Gather takes axis 0 only and reads int64 indices wrong (zeros).  Returns the note."""
    from onnx import helper, numpy_helper

    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    shapes = _static_shapes(model)
    out, n = [], 0
    for node in model.graph.node:
        cut = _plain_slice(node, consts, shapes)
        if cut is None:
            out.append(node)
            continue
        axis, start, end = cut
        dims = shapes[node.input[0]]
        shape = dims[:axis] + [end - start] + dims[axis + 1:]
        rest = int(np.prod(dims[axis + 1:], dtype=np.int64))
        names = [f"{node.output[0]}/wonnx_{k}" for k in ("rows", "rows_shape", "index",
                                                          "picked", "shape")]
        model.graph.initializer.extend([
            numpy_helper.from_array(np.array([dims[axis], rest], np.int64), names[1]),
            numpy_helper.from_array(np.arange(start, end, dtype=np.int32), names[2]),
            numpy_helper.from_array(np.array(shape, np.int64), names[4])])
        out += [helper.make_node("Reshape", [node.input[0], names[1]], [names[0]],
                                 name=f"{node.name}/rows"),
                helper.make_node("Gather", [names[0], names[2]], [names[3]], axis=0,
                                 name=f"{node.name}/gather"),
                helper.make_node("Reshape", [names[3], names[4]], [node.output[0]],
                                 name=f"{node.name}/shape")]
        n += 1
    del model.graph.node[:]
    model.graph.node.extend(out)
    return [f"{n} Slice as Reshape + Gather (int32) + Reshape"] if n else []


def concats_on_leading_axis(model) -> list:
    """Each Concat on an axis with a dimension above 1 before it (YOLOv8n's head joins
    its three scales along the last axis) rewritten as a Transpose of each input bringing
    that axis first -> Concat on axis 0 -> the inverse Transpose: wonnx's Concat joins
    its inputs' buffers end to end, which is the concatenation only when every dimension
    before the axis is 1 (else a wrong result, no error).  Returns the note."""
    from onnx import helper

    shapes = _static_shapes(model)
    out, n = [], 0
    for node in model.graph.node:
        dims = shapes.get(node.output[0]) if node.op_type == "Concat" else None
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0) if dims else 0
        if not dims or all(d == 1 for d in dims[:axis % len(dims)]):
            out.append(node)
            continue
        axis %= len(dims)
        perm = [axis] + [i for i in range(len(dims)) if i != axis]
        back = [perm.index(i) for i in range(len(dims))]
        firsts = [f"{i}/wonnx_axis_first" for i in node.input]
        out += [helper.make_node("Transpose", [i], [f], perm=perm, name=f"{f}/{node.name}")
                for i, f in zip(node.input, firsts)]
        joined = f"{node.output[0]}/wonnx_joined"
        out += [helper.make_node("Concat", firsts, [joined], axis=0, name=node.name),
                helper.make_node("Transpose", [joined], [node.output[0]], perm=back,
                                 name=f"{node.name}/back")]
        n += 1
    del model.graph.node[:]
    model.graph.node.extend(out)
    return [f"{n} Concat on axis 0 between Transposes"] if n else []


#: The newest default-domain opset wonnx's Softmax compiles at.
WONNX_OPSET = 15


def lower_opset(model) -> list:
    """A model with a Softmax (which wonnx refuses above opset 15; the other ops of these
    models it takes at 17): its default-domain opset lowered to :data:`WONNX_OPSET` where
    every op it uses has the same definition in both (the schema's ``since_version``),
    so its meaning is unchanged; else left.  Returns the note."""
    from onnx import defs

    have = next((d for d in model.opset_import if d.domain in ("", "ai.onnx")), None)
    ops = {n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")}
    if have is None or have.version <= WONNX_OPSET or "Softmax" not in ops:
        return []
    for op in ops:
        if (defs.get_schema(op, have.version).since_version
                != defs.get_schema(op, WONNX_OPSET).since_version):
            return []
    old, have.version = have.version, WONNX_OPSET
    return [f"opset {old} -> {WONNX_OPSET} (the same definitions of its ops)"]


def _plain_slice(node, consts: dict, shapes: dict):
    """(axis, start, end) of a Slice that :func:`slices_as_gathers` rewrites, else None."""
    if node.op_type != "Slice" or node.input[0] not in shapes or any(
            i not in consts for i in node.input[1:] if i):
        return None
    dims = shapes[node.input[0]]
    args = [consts[i].ravel() if i else None for i in list(node.input[1:]) + [""] * 4][:4]
    starts, ends, axes, steps = args
    axes = np.arange(len(starts)) if axes is None else axes
    if len(starts) != 1 or (steps is not None and steps[0] != 1):
        return None
    axis = int(axes[0]) % len(dims)
    start, end, _ = slice(int(starts[0]), int(ends[0])).indices(dims[axis])
    if any(d != 1 for d in dims[:axis]) or end <= start:
        return None
    return axis, start, end


def _static_shapes(model) -> dict:
    """{tensor name: shape} of the tensors whose every dimension shape inference knows."""
    import onnx

    graph = onnx.shape_inference.infer_shapes(model).graph
    out = {}
    for v in [*graph.input, *graph.value_info, *graph.output]:
        dims = v.type.tensor_type.shape.dim
        if v.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            out[v.name] = [d.dim_value for d in dims]
    return out


def _value(model, node, consts: dict, shapes: dict):
    """The outputs of ``node`` as arrays when they are known without the input, else
    None (a node without inputs other than Constant, such as a random generator, is not
    folded)."""
    from onnx.reference import ReferenceEvaluator

    if node.op_type == "Shape":
        if node.input[0] not in shapes:
            return None
        attrs = {a.name: a.i for a in node.attribute}
        dims = shapes[node.input[0]]
        return [np.array(dims[attrs.get("start", 0):attrs.get("end", len(dims))], np.int64)]
    if node.op_type != "Constant" and not (
            node.input and all(not i or i in consts for i in node.input)):
        return None
    opsets = {d.domain: d.version for d in model.opset_import}
    ref = ReferenceEvaluator(node, opsets=opsets)
    return ref.run(None, {i: consts[i] for i in node.input if i})


def refusal(model, text: str) -> str:
    """wonnx's error with the refused node's op type in front (a node wonnx fused
    with the next is named "a+b": its first node's)."""
    m = _NODE.search(text)
    if not m:
        return f"wonnx refused the model: {text[-300:]}"
    first = m.group(1).split("+")[0]
    op = next((n.op_type for n in model.graph.node if n.name == first), "?")
    return f"wonnx refuses {op} (node {m.group(1)}): {text[-300:]}"


def session(wonnx, data: bytes, model):
    """wonnx's session and the adapters wgpu listed (its log, caught from fd 2; it logs
    each adapter again at every enumeration)."""
    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    try:
        sess = wonnx.Session.from_bytes(data)
        err = None
    except BaseException as exc:         # noqa: BLE001 (a Rust panic is a BaseException)
        if isinstance(exc, KeyboardInterrupt):
            raise
        sess, err = None, str(exc)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    log.seek(0)
    text = log.read().decode(errors="replace")
    if err is not None:
        raise Absent(refusal(model, err))
    return sess, [(b, n) for b, n in _ADAPTER.findall(text)]


def main(argv) -> int:
    model_p, xp, yp, figp, device, seconds, repeats = argv

    def work():
        # read by wgpu when wonnx makes its instance: Vulkan only, and its adapter log
        os.environ.setdefault("WGPU_BACKEND", "vulkan")
        os.environ.setdefault("RUST_LOG", "wgpu_core::instance=info")
        import onnx
        import wonnx

        model, rewrites = ready(onnx.load(model_p))
        data = model.SerializeToString()
        name, out = model.graph.input[0].name, model.graph.output[0]
        shape = [d.dim_value for d in out.type.tensor_type.shape.dim]
        held = {}

        def prepare():
            sess, adapters = session(wonnx, data, model)
            vulkan = sorted({n for b, n in adapters if b == "Vulkan"})
            if len(vulkan) != 1 or not same_device(vulkan[0], device):
                raise Absent(f"wgpu's Vulkan adapters {vulkan}: not only {device!r} (run "
                             f"with VK_ICD_FILENAMES naming its one driver)")
            held["adapter"] = vulkan[0]
            return lambda x: np.asarray(sess.run({name: x.ravel().tolist()})[out.name],
                                        np.float32).reshape(shape)
        fig, y = measure(prepare, np.load(xp), seconds, repeats, files=(figp, yp))
        fig["adapter"] = held["adapter"]
        if rewrites:
            fig["note"] = "; ".join(rewrites)
        return fig, y
    return answer(figp, yp, work)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

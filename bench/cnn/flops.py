"""What a model asks of a device, counted on its ONNX graph (every value's shape from
one ONNX Runtime CPU run): the convolution/GEMM FLOPs (one multiply-add = 2 FLOPs, the
direct algorithm), and a per-layer roofline: each layer's time bound is the larger of
its FLOPs over the device's FMA peak and its bytes (every input it reads, weights
included, plus its output, once) over the device's shader-copy bandwidth; the model's
bound is their sum.

A "layer" is what a fused implementation runs as one kernel: an activation (Relu, Clip,
LeakyRelu, Sigmoid, HardSigmoid, HardSwish, and SiLU written as ``Mul(x, Sigmoid(x))``)
that is the only reader of a convolution's or GEMM's output is counted with it, at no
bytes of its own; nodes that move no data (Identity, Reshape, Flatten, Squeeze,
Unsqueeze, Dropout, Shape, Constant) and nodes computed from constants alone (folded at
prepare) count nothing.
"""
from __future__ import annotations

import numpy as np

import onnx
from onnx import helper

COMPUTE = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
ACTIVATIONS = {"Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish"}
FREE = {"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Dropout", "Shape",
        "Constant", "Size"}


def _shapes(model: onnx.ModelProto) -> tuple[dict, dict, set]:
    """(name -> shape, name -> element bytes, constant names) of every value, from one
    ONNX Runtime CPU run on zeros with every node output exposed (ONNX's own shape
    inference loses the shapes after the Shape->Gather->Resize chains exporters write)."""
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    # the lowest IR version its opsets need: an older onnxruntime refuses a newer onnx's stamp
    m.ir_version = min(m.ir_version, helper.find_min_ir_version_for(list(m.opset_import)))
    g = m.graph
    inits = {t.name for t in g.initializer}
    have = {o.name for o in g.output}
    for n in g.node:
        for o in n.output:
            if o and o not in have:
                g.output.append(helper.make_empty_tensor_value_info(o))
                have.add(o)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {}
    for i in sess.get_inputs():
        if i.name not in inits:
            dt = helper.tensor_dtype_to_np_dtype(
                next(v.type.tensor_type.elem_type for v in g.input if v.name == i.name))
            feeds[i.name] = np.zeros(i.shape, dt)
    outs = sess.run(None, feeds)
    shapes = {k: v.shape for k, v in feeds.items()}
    sizes = {k: v.dtype.itemsize for k, v in feeds.items()}
    for o, v in zip(sess.get_outputs(), outs):
        shapes[o.name], sizes[o.name] = np.shape(v), np.asarray(v).dtype.itemsize
    for t in g.initializer:
        shapes[t.name] = tuple(t.dims)
        sizes[t.name] = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    consts = set(inits)
    for n in g.node:                  # what folding at prepare makes constant
        if n.op_type == "Constant" or (n.input and all(x in consts for x in n.input if x)):
            consts.update(o for o in n.output if o)
    return shapes, sizes, consts


def node_flops(node, shapes: dict) -> float:
    """Multiply-add FLOPs of a Conv, ConvTranspose, Gemm or MatMul (0 for other ops or
    unknown shapes)."""
    op = node.op_type
    try:
        if op == "Conv":
            return 2.0 * np.prod(shapes[node.output[0]]) * np.prod(shapes[node.input[1]][1:])
        if op == "ConvTranspose":
            return 2.0 * np.prod(shapes[node.input[0]]) * np.prod(shapes[node.input[1]][1:])
        if op == "Gemm":
            a = shapes[node.input[0]]
            trans_a = any(at.name == "transA" and at.i for at in node.attribute)
            return 2.0 * np.prod(shapes[node.output[0]]) * (a[0] if trans_a else a[1])
        if op == "MatMul":
            return 2.0 * np.prod(shapes[node.output[0]]) * shapes[node.input[0]][-1]
    except KeyError:
        return 0.0
    return 0.0


def _fused_activations(nodes, readers: dict) -> set:
    """Indices of activation nodes counted with the convolution/GEMM before them."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output}
    fused = set()
    for i, n in enumerate(nodes):
        if n.op_type not in COMPUTE:
            continue
        y = n.output[0]
        rd = readers.get(y, [])
        ops = sorted(nodes[j].op_type for j in rd)
        if len(rd) == 1 and ops[0] in ACTIVATIONS:
            fused.add(rd[0])
        elif ops == ["Mul", "Sigmoid"]:             # SiLU: Mul(y, Sigmoid(y))
            mul = next(j for j in rd if nodes[j].op_type == "Mul")
            sig = next(j for j in rd if nodes[j].op_type == "Sigmoid")
            if producer.get(nodes[sig].output[0]) == sig and \
                    nodes[sig].output[0] in nodes[mul].input:
                fused.update((mul, sig))
    return fused


def count(model: onnx.ModelProto) -> dict:
    """``conv_gemm_flops``, and ``layers``: [(op type, flops, bytes)] for the roofline;
    ``layer_nodes``: per layer, the names of the ONNX nodes it counts (its own first,
    then the activations fused into it), to join with a profile."""
    shapes, sizes, consts = _shapes(model)
    nodes = list(model.graph.node)
    readers: dict = {}
    for i, n in enumerate(nodes):
        for x in n.input:
            readers.setdefault(x, []).append(i)
    fused = _fused_activations(nodes, readers)
    nbytes = lambda v: int(np.prod(shapes[v])) * sizes.get(v, 4) if v in shapes else 0  # noqa
    layers, names, total = [], [], 0.0
    for i, n in enumerate(nodes):
        if i in fused or n.op_type in FREE or all(x in consts for x in n.input if x):
            continue
        f = node_flops(n, shapes)
        total += f
        out = n.output[0]
        own = [n.name]
        if n.op_type in COMPUTE:        # a fused activation writes the output instead
            for j in fused & set(readers.get(out, [])):
                own.append(nodes[j].name)
                if nodes[j].op_type != "Sigmoid":
                    out = nodes[j].output[0]
        b = sum(nbytes(x) for x in dict.fromkeys(n.input) if x) + nbytes(out)
        layers.append((n.op_type, f, b))
        names.append(tuple(own))
    return {"conv_gemm_flops": total, "layers": layers, "layer_nodes": names,
            "bytes": sum(b for _, _, b in layers)}


def layer_bound(flops: float, nbytes: float, fma_gflops: float, copy_gbs: float) -> float:
    """One layer's roofline seconds: max(FLOPs / FMA peak, bytes / shader-copy bandwidth)."""
    return max(flops / (fma_gflops * 1e9), nbytes / (copy_gbs * 1e9))


def roofline_seconds(layers, fma_gflops: float, copy_gbs: float) -> float:
    """Sum over layers of :func:`layer_bound`."""
    return sum(layer_bound(f, b, fma_gflops, copy_gbs) for _, f, b in layers)


def count_apart(data: bytes) -> dict:
    """:func:`count` of the model ``data`` in a child process (``python -m bench.cnn.flops
    MODEL.onnx``): counting runs ONNX Runtime CPU, whose thread pools are kept out of the
    process that measures vkml."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.TemporaryDirectory(prefix="vkml-flops-") as tmp:
        path = os.path.join(tmp, "m.onnx")
        with open(path, "wb") as f:
            f.write(data)
        res = subprocess.run([sys.executable, "-m", "bench.cnn.flops", path], cwd=root,
                             capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"counting the model's FLOPs failed: {res.stderr.strip()[-500:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["layers"] = [tuple(x) for x in out["layers"]]
    out["layer_nodes"] = [tuple(x) for x in out["layer_nodes"]]
    return out


if __name__ == "__main__":          # python -m bench.cnn.flops MODEL.onnx: count_apart's
    import json
    import sys

    print(json.dumps(count(onnx.load(sys.argv[1])), default=float))

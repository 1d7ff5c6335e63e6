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
    """(model, rewrites): ONNX shape inference (wonnx sizes every buffer from the value
    infos and refuses a model without them); each Gemm with ``transB=1`` on a constant
    B given B transposed instead (wonnx's Gemm takes B as K x N only); each Conv
    without ``kernel_shape`` (optional in ONNX: W's shape) given it (wonnx requires
    it).  The rewrites are named in the row's note."""
    import onnx
    from onnx import helper, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    done = []
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
    return onnx.shape_inference.infer_shapes(model, strict_mode=True), done


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

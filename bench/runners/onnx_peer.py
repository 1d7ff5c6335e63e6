"""ONNX Runtime on the CPU: a single-node ONNX model built in memory with ``onnx.helper``.

Pad (constant, edge, reflect, wrap; ONNX has no symmetric mode), Col2Im (fold), Conv and
ConvTranspose, LpPool.  ONNX has no im2col operator, so unfold is absent.  Weights are
initializers, as in a real model.  A data type ONNX Runtime's CPU provider has no kernel
for (float16 convolution on most CPUs) is reported absent with its error.
"""
from __future__ import annotations

import os

from . import Absent, Runner, require

OPSET = 19          # Pad "wrap" needs 19; Col2Im 18; LpPool dilations 18
_PAD_MODE = {"constant": "constant", "edge": "edge", "reflection": "reflect", "wrap": "wrap"}


class OnnxRuntimePeer(Runner):
    name = "onnxruntime-cpu"

    @classmethod
    def probe(cls) -> str:
        ort = require("onnxruntime")
        onnx = require("onnx")
        return f"{ort.__version__} (onnx {onnx.__version__})"

    def prepare(self, workload, inputs):
        ort = require("onnxruntime")
        onnx = require("onnx")
        h = onnx.helper
        op, p = workload.op, workload.p
        elem = h.np_dtype_to_tensor_dtype(workload.np_dtype)
        x = inputs[0]
        feeds = {"x": x}
        inits = []
        attrs = {}
        ins = ["x"]

        def begin_end(start, end):
            return list(start) + list(end)

        if op == "pad":
            mode = _PAD_MODE.get(p["mode"])
            if mode is None:
                raise Absent(f"ONNX Pad has no {p['mode']} mode")
            inits.append(h.make_tensor("pads", onnx.TensorProto.INT64, [2 * len(p["start"])],
                                       begin_end(p["start"], p["end"])))
            ins.append("pads")
            if mode == "constant":
                inits.append(h.make_tensor("value", elem, [], [p["value"]]))
                ins.append("value")
            node_type, attrs = "Pad", {"mode": mode}
        elif op == "fold":
            spatial = p["image_shape"][2:]
            for name, vals in (("image_shape", spatial), ("block_shape", p["window"])):
                inits.append(h.make_tensor(name, onnx.TensorProto.INT64, [len(vals)], vals))
                ins.append(name)
            node_type = "Col2Im"
            attrs = {"dilations": p["dilations"], "strides": p["strides"],
                     "pads": begin_end(p["start_padding"], p["end_padding"])}
        elif op == "unfold":
            raise Absent("ONNX has no im2col (Unfold) operator")
        elif op == "lp_pooling":
            node_type = "LpPool"
            attrs = {"kernel_shape": p["window"], "strides": p["strides"], "p": p["p"],
                     "pads": begin_end(p["start_padding"], p["end_padding"])}
            if any(d != 1 for d in p["dilations"]):
                attrs["dilations"] = p["dilations"]
        else:
            if p["activation"] is not None:
                raise Absent("the ONNX runner builds a single Conv node (no fused activation)")
            if p["mode"] == "convolution":
                raise Absent("ONNX Conv is cross-correlation only")
            w, b = inputs[1], inputs[2]
            inits.append(h.make_tensor("w", elem, w.shape, w.tobytes(), raw=True))
            ins.append("w")
            if b is not None:
                inits.append(h.make_tensor("b", elem, b.shape, b.tobytes(), raw=True))
                ins.append("b")
            attrs = {"strides": p["strides"], "dilations": p["dilations"],
                     "group": p["groups"], "kernel_shape": p["filter"][2:],
                     "pads": begin_end(p["start_padding"], p["end_padding"])}
            if p["direction"] == "backward":
                node_type = "ConvTranspose"
                if any(p["output_padding"]):
                    attrs["output_padding"] = p["output_padding"]
            else:
                if any(p["output_padding"]):
                    raise Absent("ONNX Conv has no output_padding")
                node_type = "Conv"
        node = h.make_node(node_type, ins, ["y"], **attrs)
        graph = h.make_graph([node], f"vkml_bench_{op}",
                             [h.make_tensor_value_info("x", elem, list(x.shape))],
                             [h.make_tensor_value_info("y", elem, list(p["out_shape"]))],
                             initializer=inits)
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", OPSET)],
                             producer_name="vkml-bench")
        model.ir_version = min(model.ir_version, 10)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = os.cpu_count() or 1
        opts.log_severity_level = 3
        try:
            sess = ort.InferenceSession(model.SerializeToString(), opts,
                                        providers=["CPUExecutionProvider"])
        except Exception as exc:      # noqa: BLE001  (no kernel for this type/attribute)
            raise Absent(f"ONNX Runtime cannot run this {node_type}: "
                         f"{str(exc).splitlines()[0][:160]}") from None
        return lambda: sess.run(None, feeds)[0]


RUNNERS = [OnnxRuntimePeer]

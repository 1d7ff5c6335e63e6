"""ONNX Runtime on the CPU: a single-node ONNX model built in memory with ``onnx.helper``.

Pad (constant, edge, reflect, wrap; ONNX has no symmetric mode), Col2Im (fold), Conv and
ConvTranspose, LpPool; for the model operators Add/Sub/Mul/Div/Max/Min, Identity/Transpose,
Concat, Split, Slice, Resize, MaxPool/AveragePool, Reduce*, Gemm, BatchNormalization,
Softmax.  ONNX has no im2col operator, so unfold is absent.  Weights are
initializers, as in a real model.  A data type ONNX Runtime's CPU provider has no kernel
for (float16 convolution on most CPUs) is reported absent with its error.
"""
from __future__ import annotations

import os

from .. import model_ops
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

        if op in model_ops.OPS:
            node_type, ins, feeds, inits, attrs = _model_node(h, onnx, elem, op, p, inputs)
            outs = [(f"y{i}" if op == "split" else "y", s)
                    for i, s in enumerate(p["out_shapes"])]
            return _session(ort, h, op, node_type, ins, feeds, inits, attrs, outs, elem)
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
        return _session(ort, h, op, node_type, ins, feeds, inits, attrs,
                        [("y", p["out_shape"])], elem)


def _session(ort, h, op, node_type, ins, feeds, inits, attrs, outs, elem):
    """A callable running the one-node model on ``feeds`` (its outputs ``outs``, (name,
    shape) pairs: one array out, or a list for several)."""
    node = h.make_node(node_type, ins, [name for name, _ in outs], **attrs)
    graph = h.make_graph([node], f"vkml_bench_{op}",
                         [h.make_tensor_value_info(k, elem, list(v.shape))
                          for k, v in feeds.items()],
                         [h.make_tensor_value_info(name, elem, list(shape))
                          for name, shape in outs],
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
    if len(outs) > 1:
        return lambda: sess.run(None, feeds)
    return lambda: sess.run(None, feeds)[0]


_BINARY = {"add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div",
           "maximum": "Max", "minimum": "Min"}
_REDUCE = {"sum": "ReduceSum", "average": "ReduceMean", "max": "ReduceMax",
           "min": "ReduceMin", "sum_square": "ReduceSumSquare", "l1": "ReduceL1",
           "l2": "ReduceL2"}


def _model_node(h, onnx, elem, op, p, inputs):
    """(node type, its inputs, feeds, initializers, attributes) of a model operator:
    activations are fed, weights (GEMM's B and C, batch normalization's statistics) are
    initializers, as in a real model."""
    def ints(name, values):
        return h.make_tensor(name, onnx.TensorProto.INT64, [len(values)], list(values))

    def weight(name, a):
        return h.make_tensor(name, elem, a.shape, a.tobytes(), raw=True)

    x = inputs[0]
    if op == "element_wise":
        return _BINARY[p["function"]], ["x", "b"], {"x": x, "b": inputs[1]}, [], {}
    if op == "identity":
        if p["perm"] is None:
            return "Identity", ["x"], {"x": x}, [], {}
        return "Transpose", ["x"], {"x": x}, [], {"perm": list(p["perm"])}
    if op == "join":
        feeds = {f"x{i}": a for i, a in enumerate(inputs)}
        return "Concat", list(feeds), feeds, [], {"axis": p["axis"]}
    if op == "split":
        return ("Split", ["x", "sizes"], {"x": x}, [ints("sizes", p["sizes"])],
                {"axis": p["axis"]})
    if op == "slice":
        ends = [o + (n - 1) * s + 1 for o, n, s in zip(p["offsets"], p["sizes"], p["strides"])]
        inits = [ints("starts", p["offsets"]), ints("ends", ends),
                 ints("axes", range(len(ends))), ints("steps", p["strides"])]
        return "Slice", ["x", "starts", "ends", "axes", "steps"], {"x": x}, inits, {}
    if op == "resample":
        if any(a != 0.5 for a in p["input_pixel_offsets"]) or any(
                b != -0.5 for b in p["output_pixel_offsets"]):
            raise Absent("the ONNX runner's Resize samples pixel centres (half_pixel) only")
        scales = h.make_tensor("scales", onnx.TensorProto.FLOAT, [len(p["scales"])],
                               p["scales"])
        return ("Resize", ["x", "", "scales"], {"x": x}, [scales],
                {"mode": p["mode"], "coordinate_transformation_mode": "half_pixel",
                 "nearest_mode": "round_prefer_ceil"})
    if op in ("max_pooling", "average_pooling"):
        attrs = {"kernel_shape": p["window"], "strides": p["strides"],
                 "pads": list(p["start_padding"]) + list(p["end_padding"])}
        if any(d != 1 for d in p["dilations"]):
            attrs["dilations"] = p["dilations"]
        if op == "max_pooling":
            return "MaxPool", ["x"], {"x": x}, [], attrs
        attrs["count_include_pad"] = int(p["include_padding"])
        return "AveragePool", ["x"], {"x": x}, [], attrs
    if op == "reduce":
        if p["function"] not in _REDUCE:
            raise Absent(f"the ONNX runner has no reduce {p['function']}")
        return (_REDUCE[p["function"]], ["x", "axes"], {"x": x}, [ints("axes", p["axes"])],
                {"keepdims": 1})
    if op == "gemm":
        inits = [weight("w", inputs[1])] + ([] if inputs[2] is None else
                                            [weight("c", inputs[2])])
        return ("Gemm", ["x", "w"] + (["c"] if inputs[2] is not None else []), {"x": x},
                inits, {"transB": int(p["trans_b"])})
    if op == "batch_normalization":
        names = ["scale", "bias", "mean", "var"]
        stats = dict(zip(["mean", "var", "scale", "bias"], inputs[1:]))
        inits = [weight(n, stats[n].reshape(-1)) for n in names]
        return ("BatchNormalization", ["x"] + names, {"x": x}, inits,
                {"epsilon": p["epsilon"]})
    if len(p["axes"]) != 1:
        raise Absent("ONNX Softmax takes one axis")
    return "Softmax", ["x"], {"x": x}, [], {"axis": p["axes"][0]}


RUNNERS = [OnnxRuntimePeer]

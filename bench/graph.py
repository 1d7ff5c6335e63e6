"""The ``graph`` workload: Pad -> Conv -> Relu -> LpPool -> Conv as one DML graph, timed
three ways in the same run (rows of the result document):

* ``vkml``: the compiled graph (``Device.compile_graph``, fusion on -- the zero padding
  folds into the first convolution, the Relu into it, and the 2x2 stride-2 LP pooling
  into its Winograd output pass where winograd runs it --, both filters
  ``OWNED_BY_DML`` constants, transformed once at initialization), its ``execute``
  replayed on device tensors;
* ``vkml-ops``: the same five operators compiled apart and executed one after another
  on device tensors (each its own submit and wait; filters bound at execution);
* ``vkml-onnx``: the equivalent ONNX model (built with ``onnx.helper``) through vkml's
  ONNX backend (``vkml.onnx.prepare`` on the same device: one partition, lowered to the
  same DML graph), the input a device tensor, the output read back;
* ``onnxruntime-cpu``: the same ONNX model on ONNX Runtime's CPU provider, where it is
  installed (absent otherwise).

The vkml row carries ``graph``: the arena's size next to the sum of the intermediates
(what they would take unshared) -- those left after fusion (``intermediate_bytes``) and
the four the DML graph declares (``declared_intermediate_bytes``: Pad, Conv, Relu and
LpPool outputs, one buffer each), with the arena lifetime sharing alone plans for the
declared graph (``unfused_arena_bytes``) --, the fusions, and the speedup over
``vkml-ops``.
"""
from __future__ import annotations

import time

import numpy as np

from . import references
from .runners import Absent
from .stats import sample, sample_interleaved


def normalize(p: dict) -> dict:
    """Parameters: ``input`` (N, C, H, W), ``channels`` (of both convolutions, default C),
    ``kernel`` (3), ``pad`` (the Pad node's zero padding, 1), ``conv2_pad`` (1), ``window``
    and ``strides`` of the LP pooling (2, 2), ``p`` (2)."""
    p = dict(p)
    x = [int(v) for v in p["input"]]
    p.setdefault("channels", x[1])
    p.setdefault("kernel", 3)
    p.setdefault("pad", 1)
    p.setdefault("conv2_pad", 1)
    p.setdefault("window", 2)
    p.setdefault("strides", 2)
    p.setdefault("p", 2)
    c, k, a = p["channels"], p["kernel"], p["pad"]
    padded = [x[0], x[1], x[2] + 2 * a, x[3] + 2 * a]
    conv1 = [x[0], c, padded[2] - k + 1, padded[3] - k + 1]
    pooled = [x[0], c] + [(s - p["window"]) // p["strides"] + 1 for s in conv1[2:]]
    b = p["conv2_pad"]
    out = [x[0], c] + [s + 2 * b - k + 1 for s in pooled[2:]]
    p.update(shape=x, padded=padded, conv1=conv1, pooled=pooled, out_shape=out,
             filter1=[c, x[1], k, k], filter2=[c, c, k, k])
    return p


def make_inputs(p: dict, dtype, rng) -> list:
    def normal(shape, scale=1.0):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype)
    f1, f2 = p["filter1"], p["filter2"]
    return [normal(p["shape"]), normal(f1, 1 / np.sqrt(np.prod(f1[1:]))), normal((f1[0],), 0.1),
            normal(f2, 1 / np.sqrt(np.prod(f2[1:]))), normal((f2[0],), 0.1)]


def flops(p: dict) -> float:
    k2 = p["kernel"] ** 2
    return 2.0 * k2 * (np.prod(p["conv1"]) * p["shape"][1] + np.prod(p["out_shape"]) * p["channels"])


def reference(p: dict, inputs: list) -> np.ndarray:
    x, w1, b1, w2, b2 = [a.astype(np.float64) for a in inputs]
    a, b = p["pad"], p["conv2_pad"]
    y = references.pad_reference(x, [0, 0, a, a], [0, 0, a, a], "constant", 0.0)
    y = references.convolution_reference(y, w1, b1, [1, 1], [1, 1], [0, 0], [0, 0], [0, 0],
                                         1, "cross_correlation", "forward")
    y = np.maximum(y, 0)
    win = [p["window"]] * 2
    y = references.lp_pooling_reference(y, win, [p["strides"]] * 2, [1, 1], [0, 0], [0, 0],
                                        p["p"])
    return references.convolution_reference(y, w2, b2, [1, 1], [1, 1], [b, b], [b, b], [0, 0],
                                            1, "cross_correlation", "forward")


def graph_desc(dml, p: dict, dtype, owned: bool = True):
    """(GraphDesc, the five node descriptors); graph inputs x, w1, b1, w2, b2."""
    T = dml.TensorDesc
    flags = dml.TensorFlags.OWNED_BY_DML if owned else dml.TensorFlags.NONE
    t = {k: T(dtype, tuple(p[k])) for k in ("shape", "padded", "conv1", "pooled", "out_shape")}
    c = p["channels"]
    a, b = p["pad"], p["conv2_pad"]
    nodes = [
        dml.PaddingOperatorDesc(t["shape"], t["padded"], start_padding=(0, 0, a, a),
                                end_padding=(0, 0, a, a)),
        dml.ConvolutionOperatorDesc(t["padded"], T(dtype, tuple(p["filter1"]), flags=flags),
                                    T(dtype, (1, c, 1, 1)), t["conv1"]),
        dml.ActivationReluOperatorDesc(t["conv1"], t["conv1"]),
        dml.LpPooling1OperatorDesc(t["conv1"], t["pooled"], (p["strides"],) * 2,
                                   (p["window"],) * 2, (0, 0), (0, 0), (1, 1), p["p"]),
        dml.ConvolutionOperatorDesc(t["pooled"], T(dtype, tuple(p["filter2"]), flags=flags),
                                    T(dtype, (1, c, 1, 1)), t["out_shape"],
                                    start_padding=(b, b), end_padding=(b, b)),
    ]
    N, IN = dml.OperatorGraphNodeDesc, dml.InputGraphEdgeDesc
    MID, OUT = dml.IntermediateGraphEdgeDesc, dml.OutputGraphEdgeDesc
    g = dml.GraphDesc(5, 1, [N(d) for d in nodes],
                      [IN(0, 0, 0), IN(1, 1, 1), IN(2, 1, 2), IN(3, 4, 1), IN(4, 4, 2)],
                      [OUT(4, 0, 0)],
                      [MID(0, 0, 1, 0), MID(1, 0, 2, 0), MID(2, 0, 3, 0), MID(3, 0, 4, 0)])
    return g, nodes


def onnx_model(p: dict, inputs: list):
    """The graph as an ONNX model (opset 13): Pad, Conv, Relu, LpPool, Conv; filters and
    biases as initializers."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    a, b, k = p["pad"], p["conv2_pad"], p["kernel"]
    _, w1, b1, w2, b2 = inputs
    inits = [numpy_helper.from_array(v.astype(np.float32), n) for v, n in
             ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))]
    inits.append(numpy_helper.from_array(np.array([0, 0, a, a, 0, 0, a, a], np.int64), "pads"))
    nodes = [helper.make_node("Pad", ["x", "pads"], ["xp"], mode="constant"),
             helper.make_node("Conv", ["xp", "w1", "b1"], ["c1"], kernel_shape=[k, k]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("LpPool", ["r1"], ["l1"], kernel_shape=[p["window"]] * 2,
                              strides=[p["strides"]] * 2, p=p["p"]),
             helper.make_node("Conv", ["l1", "w2", "b2"], ["y"], kernel_shape=[k, k],
                              pads=[b, b, b, b])]
    graph = helper.make_graph(
        nodes, "vkml_bench_graph",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, p["shape"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, p["out_shape"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = min(model.ir_version, 8)
    onnx.checker.check_model(model)
    return model


class GraphRunner:
    """Prepares the three ways of running a graph workload on one device."""

    def __init__(self, device):
        self.device = device

    def compiled(self, p: dict, inputs: list, dtype):
        """(function running the compiled graph, its output tensor, the graph)."""
        import vkml.dml as dml
        dev = self.device
        g, _ = graph_desc(dml, p, dtype, owned=True)
        cg = dev.compile_graph(g, fuse=True, constants={1: inputs[1], 3: inputs[3]})
        ins = [dev.tensor(inputs[0]), None, dev.tensor(inputs[2]), None, dev.tensor(inputs[4])]
        out = dev.empty(p["out_shape"], dtype)
        return (lambda: cg.execute(ins, [out])), out, cg

    def one_by_one(self, p: dict, inputs: list, dtype):
        """(function executing the five operators one after another, output tensor, ops)."""
        import vkml.dml as dml
        dev = self.device
        _, descs = graph_desc(dml, p, dtype, owned=False)
        ops = [dev.compile_operator(dev.create_operator(d)) for d in descs]
        x, w1, b1, w2, b2 = [dev.tensor(a) for a in inputs]
        mids = [dev.empty(p[k], dtype) for k in ("padded", "conv1", "conv1", "pooled")]
        out = dev.empty(p["out_shape"], dtype)
        calls = [(ops[0], [x], [mids[0]]), (ops[1], [mids[0], w1, b1], [mids[1]]),
                 (ops[2], [mids[1]], [mids[2]]), (ops[3], [mids[2]], [mids[3]]),
                 (ops[4], [mids[3], w2, b2], [out])]

        def run():
            for op, i, o in calls:
                op.execute(i, o)
        return run, out, ops


def vkml_onnx_session(p: dict, inputs: list, dev):
    """(function running the ONNX model through ``vkml.onnx`` on ``dev``, the prepared
    model); Absent where the onnx package is not installed."""
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise Absent("onnx is not installed (pip install 'vkml[onnx]')") from None
    import vkml.onnx as backend
    rep = backend.prepare(onnx_model(p, inputs), device=dev, strict=True)
    x = dev.tensor(inputs[0].astype(np.float32))
    return (lambda: rep.run([x])[0]), rep


def onnxruntime_session(p: dict, inputs: list):
    """A function running the ONNX model on ONNX Runtime's CPU provider (Absent where
    onnxruntime is not installed)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise Absent("onnxruntime is not installed (pip install onnxruntime)") from None
    model = onnx_model(p, inputs)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"x": inputs[0].astype(np.float32)}
    return lambda: sess.run(None, feed)[0]


def measure(bench, w, device_row: dict, dev, cpu_peers: bool) -> list[dict]:
    """The rows of a graph workload (see the module doc).  Each vkml way is prepared and
    run once (cold time, errors), then all are timed in turns (:func:`sample_interleaved`),
    so that the ratios between them hold while the machine's speed drifts; ONNX Runtime
    is timed after them, alone."""
    from .run import errors, rates, stat   # here: bench.run imports this module
    inputs, ref, work = bench.data(w)
    p, dtype, budget = w.p, w.np_dtype, bench.opts.budget
    runner = GraphRunner(dev)
    graph_row = bench.row(w, "vkml", device_row, work)
    ops_row = bench.row(w, "vkml-ops", device_row, work)
    onnx_row = bench.row(w, "vkml-onnx", device_row, work)
    rows = [graph_row, ops_row, onnx_row]
    timed, release = [], []            # (row, fn) to time; what to release after

    def prepare(row, make, result=lambda made: made[1].numpy()):
        try:
            t = time.perf_counter()
            made = make()
            fn = made[0]
            y = fn()
            row["cold_ms"] = (time.perf_counter() - t) * 1e3
            row.update(errors(result(made) if y is None else y, ref, w.tolerance))
            timed.append((row, fn))
            return made
        except Absent as exc:
            row.update(status="absent", reason=str(exc))
        except Exception as exc:          # noqa: BLE001  (reported, never fatal)
            bench.fail(row, exc)
        return None

    made = prepare(graph_row, lambda: runner.compiled(p, inputs, dtype))
    if made is not None:
        cg = made[2]
        release.append(cg)
        graph_row["graph"] = {"arena_bytes": cg.arena_bytes,
                              "intermediate_bytes": cg.intermediate_bytes,
                              "intermediate_tensor_bytes": cg.intermediate_tensor_bytes,
                              "declared_intermediate_bytes": cg.declared_intermediate_bytes,
                              "unfused_arena_bytes": cg.unfused_arena_bytes,
                              "arena_vs_declared": (cg.arena_bytes
                                                    / cg.declared_intermediate_bytes),
                              "nodes": len(cg.nodes), "fusions": [str(f) for f in cg.fusions]}
    made = prepare(ops_row, lambda: runner.one_by_one(p, inputs, dtype))
    if made is not None:
        release += made[2]
    made = prepare(onnx_row, lambda: vkml_onnx_session(p, inputs, dev))
    if made is not None:
        release.append(made[1])
    for (row, _), samples in zip(timed, sample_interleaved([fn for _, fn in timed], budget)):
        row["wall_ms"] = stat(samples)
    for c in release:
        c.release()
    if cpu_peers:              # after, alone: its thread pool spins on after each run and
        ort_row = bench.row(w, "onnxruntime-cpu", None, work)   # would slow the next turn
        rows.append(ort_row)
        if prepare(ort_row, lambda: (onnxruntime_session(p, inputs),)) is not None:
            ort_row["wall_ms"] = stat(sample(timed[-1][1], budget))
    if graph_row["status"] == "ok":
        graph_row["compute_ms"] = graph_row["wall_ms"]["median"]
        graph_row["compute_timer"] = "wall"
        graph_row.update(rates(work, graph_row["compute_ms"] / 1e3, None))
        for row, key in ((ops_row, "speedup_vs_one_by_one"), (onnx_row, "onnx_vs_graph")):
            if row["status"] == "ok":     # that way's median over the graph's
                graph_row["graph"][key] = (row["wall_ms"]["median"]
                                           / graph_row["wall_ms"]["median"])
    return rows

"""Profiles: ``Sequence.mark`` timestamps, ``CompiledGraph.profile`` (an entry per compiled
node covering every declared node, fused ones in the node they run inside, the forced
kernel path named, the entries summing to the marked run and close to the unmarked one,
the outputs still right) and ``VkmlRep.profile`` (ONNX node names, host partitions), and
the bench's join of a profile with the per-layer roofline."""
from __future__ import annotations

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.errors import DeviceError

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402

from onnx_helpers import make_model, ort_expected, value_info  # noqa: E402

F = dml.TensorDesc
N = dml.OperatorGraphNodeDesc
IN, OUT, MID = dml.InputGraphEdgeDesc, dml.OutputGraphEdgeDesc, dml.IntermediateGraphEdgeDesc


def _timestamps(device):
    if not device.context.features.get("timestamps"):
        pytest.skip("the device has no timestamps")


def test_sequence_marks(device):
    """Marks are read back in order, after the start stamp and within the run; one more
    mark than the sequence takes is refused (its barrier not recorded half-way)."""
    _timestamps(device)
    x = device.tensor(np.ones(1 << 16, np.float32))
    with device.context.sequence(timed=True, marks=3) as seq:
        for _ in range(3):
            seq.fill(x.allocation, 0, x.nbytes, 0)
            seq.mark()
        with pytest.raises(DeviceError, match="takes 3 marks"):
            seq.mark()
        seq.run()
        assert len(seq.mark_ns) == 3
        assert all(a <= b for a, b in zip(seq.mark_ns, seq.mark_ns[1:]))
        assert 0 <= seq.mark_ns[0] and seq.mark_ns[-1] <= seq.gpu_time_ns
    x.free()


#: Sizes at which the nodes take longer than the marks between them on a CPU driver.
X, W, Y = (1, 16, 40, 40), (32, 16, 3, 3), (1, 32, 40, 40)


def _graph():
    """x -> pad -> conv(w, b) -> relu -> sigmoid, and x -> tanh: a padding and an
    activation fused into the convolution, two nodes apart, two graph outputs."""
    f = lambda *s: F("float32", s)  # noqa: E731
    x, xp, y = f(*X), f(1, 16, 42, 42), f(*Y)
    nodes = [N(dml.PaddingOperatorDesc(x, xp, start_padding=(0, 0, 1, 1),
                                       end_padding=(0, 0, 1, 1)), "pad"),
             N(dml.ConvolutionOperatorDesc(xp, f(*W), f(1, 32, 1, 1), y), "conv"),
             N(dml.ActivationReluOperatorDesc(y, y), "relu"),
             N(dml.ActivationSigmoidOperatorDesc(y, y), "sigmoid"),
             N(dml.ActivationTanhOperatorDesc(x, x), "tanh")]
    return dml.GraphDesc(3, 2, nodes, [IN(0, 0, 0), IN(1, 1, 1), IN(2, 1, 2), IN(0, 4, 0)],
                         [OUT(3, 0, 0), OUT(4, 0, 1)],
                         [MID(0, 0, 1, 0), MID(1, 0, 2, 0), MID(2, 0, 3, 0)])


def _reference(x, w, b):
    from references import convolution_reference
    y = np.maximum(convolution_reference(x, w, b, start=(1, 1), end=(1, 1)), 0)
    return 1 / (1 + np.exp(-y)), np.tanh(x)


@pytest.mark.parametrize("path", [None, "direct", "gemm"])
def test_graph_profile(device, path):
    _timestamps(device)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(X).astype(np.float32)
    w = (rng.standard_normal(W) * 0.2).astype(np.float32)
    b = rng.standard_normal((1, 32, 1, 1)).astype(np.float32)
    g = device.compile_graph(_graph(), paths=None if path is None else {1: path})
    ts = [device.tensor(a) for a in (x, w, b)]
    outs = [device.empty(Y, np.float32), device.empty(X, np.float32)]
    try:
        prof = g.profile(ts, outs, repeat=5)
        want = _reference(x, w, b)
        for t, r in zip(outs, want):
            np.testing.assert_allclose(t.numpy(), r, rtol=1e-4, atol=1e-5)
        covered = sorted(j for e in prof.entries for j in e.nodes)
        assert covered == list(range(5))                  # every declared node, once
        assert [e.index for e in prof.entries] == g.order
        conv = next(e for e in prof.entries if 1 in e.nodes)
        assert set(conv.nodes) == {0, 1, 2}               # pad and relu run inside it
        assert set(conv.names) == {"pad", "conv", "relu"}
        assert conv.operator == "DML_OPERATOR_CONVOLUTION"
        assert conv.kernel is not None and (path is None or conv.kernel == path)
        assert {e.operator for e in prof.entries if e is not conv} == {
            "DML_OPERATOR_ACTIVATION_SIGMOID", "DML_OPERATOR_ACTIVATION_TANH"}
        assert all(e.ms > 0 for e in prof.entries)
        # the per-node medians sum to the median marked run and to the unmarked run give
        # or take the load of the moment: each run's marks sum exactly to its total, but a
        # loaded CPU driver's slow node is another one in each run (wide bounds: a bound
        # the load cannot break, that a node missing or timed twice still does)
        total = sum(e.ms for e in prof.entries)
        assert prof.total_ms / 4 < total < 4 * prof.total_ms
        assert prof.run_ms / 4 < total < 4 * prof.run_ms
        assert "conv" in prof.table()
    finally:
        g.release()
        for t in ts + outs:
            t.free()


def _model():
    """Conv + Relu -> Add (with x's 1x1 conv) -> Erf (the host) -> Sigmoid."""
    rng = np.random.default_rng(2)
    w1 = numpy_helper.from_array((rng.standard_normal((6, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((6, 3, 1, 1)) * 0.3).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv3", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["x", "w2"], ["c2"], name="conv1"),
             helper.make_node("Add", ["r1", "c2"], ["s"], name="add"),
             helper.make_node("Erf", ["s"], ["e"], name="erf"),
             helper.make_node("Sigmoid", ["e"], ["y"], name="sigmoid")]
    return make_model(nodes, [value_info("x", (1, 3, 16, 16))],
                      [value_info("y", (1, 6, 16, 16))], [w1, w2])


def test_model_profile(device):
    _timestamps(device)
    import vkml.onnx
    model = _model()
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    rep = vkml.onnx.prepare(model, device=device)
    try:
        prof = rep.profile([x], repeat=2)
        (y,) = rep.run([x])
    finally:
        rep.release()
    np.testing.assert_allclose(y, ort_expected(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    names = sorted(n for e in prof.entries for n in e.names)
    assert names == sorted(["conv3", "relu", "conv1", "add", "erf", "sigmoid"])
    by = {e.names: e for e in prof.entries}
    assert by[("conv3", "relu")].op_types == ("Conv", "Relu")
    assert by[("conv3", "relu")].kernel is not None
    assert by[("erf",)].where == "host" and by[("erf",)].operator == "host"
    assert [e.partition for e in prof.entries] == sorted(e.partition for e in prof.entries)
    assert prof.device_ms == pytest.approx(sum(e.ms for e in prof.entries
                                               if e.where == "device"))
    assert all(e.ms > 0 for e in prof.entries)


def test_bench_profile_rows(device):
    """The bench joins each entry with its layers' roofline bounds by ONNX node name."""
    _timestamps(device)
    pytest.importorskip("onnxruntime")
    import vkml.onnx
    from bench.cnn import flops, profile

    model = _model()
    counted = flops.count(model)
    x = np.zeros((1, 3, 16, 16), np.float32)
    rep = vkml.onnx.prepare(model, device=device)
    try:
        prof = rep.profile([x], repeat=1)
    finally:
        rep.release()
    limits = {"fma_gflops": 10.0, "shader_copy_gbs": 1.0}
    rows = profile.profile_rows(prof, counted, limits)
    conv = next(r for r in rows if r["names"] == ["conv3", "relu"])
    f = 2 * 6 * 16 * 16 * 27
    nbytes = 4 * (3 * 16 * 16 + 6 * 27 + 6 * 16 * 16)
    assert conv["flops"] == f and conv["bytes"] == nbytes
    assert conv["bound_ms"] == pytest.approx(max(f / 1e10, nbytes / 1e9) * 1e3)
    assert conv["share"] == pytest.approx(conv["bound_ms"] / conv["ms"])
    assert all(r["bound_ms"] is not None for r in rows)    # every layer is counted
    assert "by kernel" in profile.text("m", rows, prof)

"""vkml.onnx: a prepared model's replayed run.

Each device partition's run is one submission (the host values' upload, the graph, the
download of what the host reads), replayed while the bindings hold; these tests check
the results against ONNX's reference evaluator on devices whose tensors are host-visible
and on staged ones (``force_staging``: every transfer a copy), across runs with new
values, with outputs the host partitions also read and aliases of them, from several
threads at once, and after the device was closed.
"""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402
from vkml.runtime import scheduler  # noqa: E402

from helpers import run_in_threads  # noqa: E402


def _model():
    """Pad (device) -> Sin (host) -> MatMul, Conv (device) -> Reshape; the outputs: the
    pad's (also the host partition's input), the conv's and its reshape (an alias)."""
    w = np.random.default_rng(7).standard_normal((3, 1, 2, 2)).astype(np.float32)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["xp"], name="pad", mode="edge"),
             helper.make_node("Sin", ["xp"], ["s"], name="sin"),
             helper.make_node("MatMul", ["s", "m"], ["mm"], name="matmul"),
             helper.make_node("Conv", ["mm", "W"], ["y"], name="conv"),
             helper.make_node("Reshape", ["y", "shape"], ["yr"], name="flat")]
    inits = [numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
             numpy_helper.from_array(np.eye(6, dtype=np.float32)[::-1].copy(), "m"),
             numpy_helper.from_array(w, "W"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "shape")]
    g = helper.make_graph(
        nodes, "run", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [f"{n}_{i}" for i in range(r)])
         for n, r in (("xp", 4), ("y", 4), ("yr", 2))],
        inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _expected(model, x):
    return ReferenceEvaluator(model).run(None, {"x": x})


def _check(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.fixture(params=[False, True], ids=["mapped", "staged"])
def dev(request, device):
    with vkml.Device(device.index, force_staging=request.param) as d:
        yield d


def test_replayed_runs_match_the_reference(dev):
    model = _model()
    rep = vonnx.prepare(model, device=dev)
    assert [w for w, _ in rep.partitions] == ["device", "host", "device"]
    rng = np.random.default_rng(1)
    kept = []
    for _ in range(4):
        x = rng.standard_normal((1, 1, 4, 4)).astype(np.float32)
        got = rep.run([x])
        _check(got, _expected(model, x))
        kept.append((x, [g.copy() for g in got], got))
    for x, copies, got in kept:      # every run's results are its own arrays
        for c, g in zip(copies, got):
            np.testing.assert_array_equal(c, g)
    rep.release()


def test_a_replayed_run_submits_once_per_device_partition(dev, monkeypatch):
    model = _model()
    rep = vonnx.prepare(model, device=dev)
    x = np.random.default_rng(2).standard_normal((1, 1, 4, 4)).astype(np.float32)
    rep.run([x])
    calls = []
    submit = scheduler._submit

    def counted(*args):
        calls.append(args)
        return submit(*args)

    monkeypatch.setattr(scheduler, "_submit", counted)
    x = x[..., ::-1].copy()
    _check(rep.run([x]), _expected(model, x))
    assert len(calls) == 2           # the two device partitions, transfers included
    rep.release()


def test_float16_upload_converts(dev):
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "h", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                       [2, 3, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 5])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    rep = vonnx.prepare(model, device=dev, dtype="float16")
    x = np.random.default_rng(3).standard_normal((2, 3, 5)).astype(np.float32) * 100
    (y,) = rep.run([x])
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, np.maximum(x.astype(np.float16), 0).astype(np.float32))
    rep.release()


def test_concurrent_runs_of_one_model(dev):
    model = _model()
    rep = vonnx.prepare(model, device=dev)
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((1, 1, 4, 4)).astype(np.float32) for _ in range(4)]
    want = [_expected(model, x) for x in xs]
    errors = []

    def worker(k):
        for _ in range(15):
            _check(rep.run([xs[k]]), want[k])

    run_in_threads(worker, errors, count=4)
    assert not errors, errors[0]
    rep.release()


def test_run_after_the_device_closed_raises(device):
    d = vkml.Device(device.index, force_staging=True)
    rep = vonnx.prepare(_model(), device=d)
    x = np.zeros((1, 1, 4, 4), np.float32)
    rep.run([x])
    d.close()
    with pytest.raises(vkml.DeviceError):
        rep.run([x])
    rep.release()

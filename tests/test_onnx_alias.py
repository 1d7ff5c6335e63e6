"""vkml.onnx: Reshape, Flatten, Squeeze, Unsqueeze and Dropout (inference) on the device as
aliases of their input's buffer (no copy, no graph node), against ONNX Runtime on the CPU;
Dropout's mask and training mode stay on the host (HOST_ALIASES)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402
from onnx_helpers import make_model as _model, ort_expected as _expected, value_info as _vi  # noqa: E402


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


@pytest.mark.parametrize("opset", [11, 18])
def test_alias_chain_between_device_ops(opset, device):
    """Conv -> Reshape (0 and -1) -> Add -> Unsqueeze -> Squeeze -> Mul -> Flatten ->
    Dropout: one device graph whose nodes are the Conv, Add and Mul only (the aliases add
    no node: no copy); axes as attributes (opset 11) or inputs (18)."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal((1, 1, 20)).astype(np.float32)
    ax = {"axes": [0, -1]} if opset < 13 else {}
    ax_in = [] if opset < 13 else ["ax"]
    sq = {"axes": [0, -1]} if opset < 13 else {}
    sq_in = [] if opset < 13 else ["sq"]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             helper.make_node("Reshape", ["c", "shape"], ["r"], name="reshape"),
             helper.make_node("Add", ["r", "b"], ["a"], name="add"),
             helper.make_node("Unsqueeze", ["a"] + ax_in, ["u"], name="unsqueeze", **ax),
             helper.make_node("Squeeze", ["u"] + sq_in, ["s"], name="squeeze", **sq),
             helper.make_node("Mul", ["s", "s"], ["m"], name="mul"),
             helper.make_node("Flatten", ["m"], ["f"], name="flatten", axis=-1),
             helper.make_node("Dropout", ["f"], ["y"], name="dropout")]
    inits = [numpy_helper.from_array(w, "W"), _i64("shape", [0, 4, -1]),
             numpy_helper.from_array(b, "b"), _i64("ax", [0, -1]), _i64("sq", [0, 4])]
    model = _model(nodes, [_vi("x", [2, 3, 6, 7])], [_vi("y", [2 * 4 * 1, 20])], inits,
                   opset=opset)
    rep = vonnx.prepare(model, device=device, strict=True)
    assert [w for w, _ in rep.partitions] == ["device"]
    x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    (got,) = rep.run({"x": x})
    (want,) = _expected(model, {"x": x})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    graph = rep._parts[0].last.lowered.graph
    assert len(graph.nodes) == 3                    # Conv, Add, Mul: no copies


def test_alias_outputs_are_views_of_one_buffer(device):
    """Two aliases of one device output, both graph outputs: the same allocation under
    each alias's shape; an int64 Reshape of a model input (a partition of aliases only)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["y1"], name="reshape"),
             helper.make_node("Flatten", ["r"], ["y2"], name="flatten", axis=0),
             helper.make_node("Unsqueeze", ["k", "ax"], ["y3"], name="unsq")]
    model = _model(nodes, [_vi("x", [2, 3, 4]), _vi("k", [5], np.int64)],
                   [_vi("y1", [6, 4]), _vi("y2", [1, 24]), _vi("y3", [5, 1], np.int64)],
                   [_i64("shape", [6, 4]), _i64("ax", [1])])
    rep = vonnx.prepare(model, device=device, strict=True)
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4)
    k = np.arange(5, dtype=np.int64)
    got = rep.run({"x": x, "k": k})
    for g, w in zip(got, _expected(model, {"x": x, "k": k})):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    env = {**rep.consts, "x": x, "k": k}
    for part in rep._parts:
        part.run(env)
    assert isinstance(env["y1"], vkml.Tensor) and env["y1"].shape == (6, 4)
    assert env["y1"].allocation is env["y2"].allocation
    assert len(rep._parts[0].last.out_tensors) == 1          # Relu's: r, y1 and y2 share it


def test_reshape_to_a_wrong_size_is_named(device):
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "s"], ["y"], name="bad_reshape")]
    model = _model(nodes, [_vi("x", [2, 3]), _vi("s", [2], np.int64)], [_vi("y", ["a", "b"])])
    rep = vonnx.prepare(model, device=device)
    with pytest.raises(vkml.ValidationError, match="bad_reshape"):
        rep.run({"x": np.ones((2, 3), np.float32), "s": np.array([4, 2], np.int64)})
    (y,) = rep.run({"x": -np.ones((2, 3), np.float32), "s": np.array([3, -1], np.int64)})
    np.testing.assert_array_equal(y, np.zeros((3, 2), np.float32))   # still usable


def test_dropout_mask_and_training_stay_on_the_host(device):
    nodes = [helper.make_node("Dropout", ["x"], ["y", "mask"], name="drop_mask")]
    model = _model(nodes, [_vi("x", [3, 4])], [_vi("y", [3, 4]), _vi("mask", [3, 4], bool)])
    rep = vonnx.prepare(model, device=device)
    assert rep.partitions == [("host", [("drop_mask", "Dropout")])]
    ((label, op, why),) = rep.host_nodes
    assert (label, op) == ("drop_mask", "Dropout") and "mask output" in why, why
    with pytest.raises(vkml.UnsupportedError, match="drop_mask.*mask output"):
        vonnx.prepare(model, device=device, strict=True)
    nodes = [helper.make_node("Dropout", ["x", "ratio", "train"], ["y"], name="drop_train")]
    model = _model(nodes, [_vi("x", [3, 4])], [_vi("y", [3, 4])],
                   [numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
                    numpy_helper.from_array(np.array(True), "train")])
    with pytest.raises(vkml.UnsupportedError, match="drop_train.*training_mode"):
        vonnx.prepare(model, device=device, strict=True)

"""vkml.onnx: a prepared model's inputs are checked against the model's declared inputs
(element type exactly and every fixed dimension, as ONNX Runtime checks them): a
ValidationError naming the model input, the representation usable afterwards; an
initializer that is also a graph input takes the value fed for it, as in ONNX Runtime."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402

F32 = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def _conv_model(shape=(1, 2, 5, 5)):
    """image_in (declared ``shape``, float32) -> Conv (on the device) -> Relu."""
    w = np.random.default_rng(0).standard_normal((3, shape[1], 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["image_in", "W"], ["c"], name="conv", pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return _model(nodes, [helper.make_tensor_value_info("image_in", F32, list(shape))],
                  [helper.make_tensor_value_info("y", F32, ["n", "c", "h", "w"])],
                  [numpy_helper.from_array(w, "W")])


def _reference(model, feeds):
    return ReferenceEvaluator(model).run(None, feeds)


def _bad_values(rng, shape):
    """Values a float32 input declared with ``shape`` must refuse: other element types
    (float16 was run as garbage, float64/int32 moved the model to the host), other
    shapes, and things that are no tensor of numbers."""
    good = rng.standard_normal(shape)
    out = [good.astype(t) for t in (np.float16, np.float64, np.int32, np.int64, np.uint8,
                                    np.bool_, np.complex64)]
    wrong = list(shape)
    d = int(rng.integers(0, len(shape)))
    wrong[d] += int(rng.integers(1, 4))
    out += [np.zeros(wrong, np.float32), np.zeros(shape[1:], np.float32),
            np.zeros((*shape, 1), np.float32), np.zeros((), np.float32),
            np.zeros(shape[::-1], np.float32) if shape != shape[::-1] else
            np.zeros((*shape[:-1], shape[-1] + 1), np.float32)]
    out += [None, "abc", b"abc", good.tolist(), [None], object()]
    return out


def test_inputs_are_checked_against_the_declared_ones(device):
    rng = np.random.default_rng(1)
    model = _conv_model()
    rep = vonnx.prepare(model, device=device)
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    want = _reference(model, {"image_in": x})[0]
    for bad in _bad_values(rng, (1, 2, 5, 5)):
        for given in ([bad], {"image_in": bad}):
            with pytest.raises(vkml.ValidationError) as info:
                rep.run(given)
            assert info.value.field == "input 'image_in'", (bad, info.value)
        # usable afterwards, on the device
        np.testing.assert_allclose(rep.run([x])[0], want, rtol=1e-5, atol=1e-5)
    assert not rep.fallbacks
    assert [w for w, _ in rep.partitions] == ["device"]


@pytest.mark.parametrize("seed", range(3))
def test_symbolic_dimensions_take_any_size(seed, device):
    """A symbolic dimension takes any size, a fixed one only its own; the rank is fixed."""
    rng = np.random.default_rng(seed)
    c = int(rng.integers(1, 4))
    model = _conv_model(("batch", c, "height", "width"))
    rep = vonnx.prepare(model, device=device)
    for _ in range(2):
        shape = (int(rng.integers(1, 3)), c, int(rng.integers(3, 7)), int(rng.integers(3, 7)))
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(rep.run([x])[0], _reference(model, {"image_in": x})[0],
                                   rtol=1e-5, atol=1e-5)
        for bad in (np.zeros((shape[0], c + 1, *shape[2:]), np.float32),
                    np.zeros(shape[:3], np.float32), x.astype(np.float16)):
            with pytest.raises(vkml.ValidationError, match="^input 'image_in': "):
                rep.run([bad])


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "float16", "float64"])
def test_inputs_of_other_declared_types(dtype, device):
    """A Pad declared on ``dtype``: that type runs, a float32 (or any other) is refused."""
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("Pad", ["x", "pads"], ["y"], name="pad", mode="edge")]
    model = _model(nodes, [helper.make_tensor_value_info("x", t, [2, 3])],
                   [helper.make_tensor_value_info("y", t, [3, 5])],
                   [numpy_helper.from_array(np.array([1, 1, 0, 1], np.int64), "pads")])
    rep = vonnx.prepare(model, device=device)
    x = (np.arange(6) * 3).reshape(2, 3).astype(dtype)
    np.testing.assert_array_equal(rep.run([x])[0], np.pad(x, [(1, 0), (1, 1)], mode="edge"))
    for other in {"float32", "int32", "int64", "float16"} - {dtype}:
        with pytest.raises(vkml.ValidationError, match=f"input 'x'.*{dtype}.*got {other}"):
            rep.run([x.astype(other)])
    np.testing.assert_array_equal(rep.run({"x": x})[0], np.pad(x, [(1, 0), (1, 1)], mode="edge"))


def test_input_names_and_counts(device):
    rep = vonnx.prepare(_conv_model(), device=device)
    x = np.zeros((1, 2, 5, 5), np.float32)
    with pytest.raises(vkml.ValidationError, match="'img' is not an input") as info:
        rep.run({"img": x})
    assert info.value.field == "inputs"
    with pytest.raises(vkml.ValidationError, match="takes 1 inputs") as info:
        rep.run([x, x])
    with pytest.raises(vkml.ValidationError, match="missing model input"):
        rep.run([])
    rep.run([x])


def _overridable(device, rng):
    """A Conv whose weights W and a Pad whose pads are initializers listed as graph
    inputs too (overridable), and bias B an initializer only."""
    w = rng.standard_normal((2, 1, 2, 2)).astype(np.float32)
    b = rng.standard_normal(2).astype(np.float32)
    pads = np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["xp"], name="pad"),
             helper.make_node("Conv", ["xp", "W", "B"], ["y"], name="conv")]
    inputs = [helper.make_tensor_value_info("x", F32, [1, 1, 4, 4]),
              helper.make_tensor_value_info("W", F32, [2, 1, 2, 2]),
              helper.make_tensor_value_info("pads", TensorProto.INT64, [8])]
    model = _model(nodes, inputs, [helper.make_tensor_value_info("y", F32, ["a", 2, "b", "c"])],
                   [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B"),
                    numpy_helper.from_array(pads, "pads")])
    return model, w, b, pads


def test_fed_initializers_are_used(device):
    """An initializer that is also a graph input: fed by name, the fed value is used
    (several weights and pads, in turn and together), else the initializer; positional
    inputs are the graph inputs without an initializer, as in ONNX Runtime."""
    rng = np.random.default_rng(2)
    model, w, b, pads = _overridable(device, rng)
    rep = vonnx.prepare(model, device=device)
    assert rep.input_names == ["x"]
    x = rng.standard_normal((1, 1, 4, 4)).astype(np.float32)

    def want(**fed):
        return _reference(model, {"x": x, **fed})[0]

    np.testing.assert_allclose(rep.run([x])[0], want(), rtol=1e-5, atol=1e-5)
    for _ in range(3):
        w2 = rng.standard_normal(w.shape).astype(np.float32)
        p2 = np.array([0, 0, *rng.integers(0, 3, 2), 0, 0, *rng.integers(0, 3, 2)], np.int64)
        for fed in ({"W": w2}, {"pads": p2}, {"W": w2, "pads": p2}):
            got = rep.run({"x": x, **fed})[0]
            np.testing.assert_allclose(got, want(**fed), rtol=1e-5, atol=1e-5)
            if "W" in fed or not np.array_equal(fed["pads"], pads):   # not the default
                default = want()
                assert got.shape != default.shape or not np.allclose(got, default)
        np.testing.assert_allclose(rep.run({"x": x})[0], want(), rtol=1e-5, atol=1e-5)
    with pytest.raises(vkml.ValidationError, match="input 'W'.*float64"):
        rep.run({"x": x, "W": w.astype(np.float64)})
    with pytest.raises(vkml.ValidationError, match="input 'W'.*shape"):
        rep.run({"x": x, "W": w[:1]})
    with pytest.raises(vkml.ValidationError, match="'B' is not an input"):
        rep.run({"x": x, "B": b})
    assert not rep.fallbacks
    rep.release()


@pytest.mark.parametrize("name", ["VKML:abc", "VKML:", "VKML:-1", "VKML:1.5"])
def test_device_names_that_are_no_index(name):
    with pytest.raises(vkml.ValidationError, match="^device: "):
        vonnx.prepare(_conv_model(), device=name)

"""vkml.onnx constant folding: bounded by size before anything is allocated (a model may
not make vkml allocate more than its tensors need), a ValidationError naming the node;
folds within the bound still give ONNX's values."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402
from vkml.onnx import fold as vfold  # noqa: E402


def _model(nodes, inits, rank=2, opset=18, inputs=()):
    """Output y: float32 of ``rank`` symbolic dimensions."""
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"d{i}" for i in range(rank)])
    g = helper.make_graph(nodes, "g", list(inputs), [y],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _c(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
        np.asarray(value), name))


def _huge_models(rng):
    """Models whose constant nodes ask for TiBs or GiBs from a few bytes: (model, the
    node's name).  Several ops, several sizes, values from initializers and Constants."""
    big = int(rng.integers(31, 40))
    side = 1 << int(rng.integers(20, 24))
    x = rng.standard_normal((2, 3)).astype(np.float32)
    out = []
    for pads in ([0, 1 << big, 0, 0], [1 << big, 0, 0, 1], [0, 0, 1 << 20, 1 << 20]):
        out.append((_model([helper.make_node("Pad", ["x", "p"], ["y"], name="pad_big")],
                           {"x": x, "p": np.array(pads, np.int64)}), "pad_big"))
    out.append((_model([helper.make_node("Pad", ["x"], ["y"], name="pad2",
                                         pads=[0, 1 << big, 0, 0])],
                       {"x": x}, opset=2), "pad2"))
    out.append((_model([helper.make_node("Pad", ["x"], ["y"], name="pad1",
                                         paddings=[0, 0, 1 << big, 0])],
                       {"x": x}, opset=1), "pad1"))
    out.append((_model([helper.make_node("Tile", ["x", "t", "a"], ["y"], name="tile1")],
                       {"x": x, "t": np.array(1 << big, np.int64), "a": np.array(1, np.int64)},
                       opset=1), "tile1"))
    out.append((_model([helper.make_node("ConstantOfShape", ["s"], ["y"], name="cos")],
                       {"s": np.array([side, side], np.int64)}), "cos"))
    out.append((_model([_c("s", np.array([side, 3, side], np.int64)),
                        helper.make_node("ConstantOfShape", ["s"], ["y"], name="cos2")], {},
                       rank=3), "cos2"))
    out.append((_model([helper.make_node("Expand", ["x", "s"], ["y"], name="expand")],
                       {"x": x[:1, :1], "s": np.array([side, side], np.int64)}), "expand"))
    out.append((_model([helper.make_node("Tile", ["x", "r"], ["y"], name="tile")],
                       {"x": x, "r": np.array([1 << big, 1], np.int64)}), "tile"))
    out.append((_model([helper.make_node("Range", ["a", "b", "d"], ["y"], name="range")],
                       {"a": np.float32(0), "b": np.float32(2.0 ** big), "d": np.float32(1)},
                       rank=1), "range"))
    out.append((_model([helper.make_node("Resize", ["x4", "", "sc"], ["y"], name="resize")],
                       {"x4": x.reshape(1, 1, 2, 3),
                        "sc": np.array([1, 1, side, side], np.float32)}, rank=4), "resize"))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_folding_is_bounded_before_allocating(seed, device, monkeypatch):
    """Each would have allocated its TiBs (MemoryError, or the machine's memory):
    refused at prepare with a ValidationError naming the node, before the reference
    evaluator runs."""
    run, current = ReferenceEvaluator.run, []

    def guarded(self, *args, **kwargs):
        if any(n.name in current for n in self.proto_.graph.node):
            raise AssertionError("the evaluator ran on a node over the bound")
        return run(self, *args, **kwargs)

    monkeypatch.setattr(ReferenceEvaluator, "run", guarded)
    for model, name in _huge_models(np.random.default_rng(seed)):
        current[:] = [name]
        with pytest.raises(vkml.ValidationError) as info:
            vonnx.prepare(model, device=device)
        assert info.value.field.startswith(f"node {name!r}"), info.value
        assert "bytes" in info.value.rule


def test_folded_total_is_bounded(device, monkeypatch):
    """The bound holds for the folded values together, not only each one: with the
    floor lowered to 64 KiB, four 16 KiB tensors fold (three ConstantOfShape and their
    Sum), a fifth ConstantOfShape is refused."""
    monkeypatch.setattr(vfold, "FOLD_BYTES_MIN", 64 << 10)
    nodes, names = [], []
    for k in range(5):
        nodes.append(helper.make_node("ConstantOfShape", ["s"], [f"z{k}"], name=f"zeros{k}",
                                      value=numpy_helper.from_array(np.ones(1, np.float32))))
        names.append(f"z{k}")
    nodes.append(helper.make_node("Sum", names, ["y"], name="sum"))
    inits = {"s": np.array([64, 64], np.int64)}          # 16 KiB each
    with pytest.raises(vkml.ValidationError, match="^node 'zeros4'"):
        vonnx.prepare(_model(nodes, inits), device=device)
    rep = vonnx.prepare(_model(nodes[:3] + [helper.make_node("Sum", names[:3], ["y"])],
                               inits), device=device)
    np.testing.assert_array_equal(rep.run([])[0], np.full((64, 64), 3, np.float32))


@pytest.mark.parametrize("seed", range(3))
def test_folds_within_the_bound_are_onnx_values(seed, device):
    """Folded chains of several ops give the reference evaluator's values; the folded
    result feeds a device node's parameter (Pad's pads) and a device Add as a constant."""
    rng = np.random.default_rng(seed)
    p = [int(v) for v in rng.integers(0, 3, 4)]
    nodes = [_c("p_lo", np.array(p[:2], np.int64)), _c("p_hi", np.array(p[2:], np.int64)),
             helper.make_node("Concat", ["p_lo", "p_hi"], ["pads"], axis=0),
             helper.make_node("ConstantOfShape", ["shape"], ["ones"],
                              value=numpy_helper.from_array(np.ones(1, np.float32))),
             helper.make_node("Pad", ["x", "pads"], ["xp"], name="pad"),
             helper.make_node("Expand", ["ones", "big"], ["e"]),
             helper.make_node("Pad", ["e", "pads"], ["ep"]),
             helper.make_node("Add", ["xp", "ep"], ["y"], name="add")]
    x_shape = [int(v) for v in rng.integers(1, 5, 2)]
    model = _model(nodes, {"shape": np.array([1, 1], np.int64),
                           "big": np.array(x_shape, np.int64)},
                   inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)])
    rep = vonnx.prepare(model, device=device)
    assert {n.op_type for _, n in rep.folded} == {"Constant", "Concat", "ConstantOfShape",
                                                  "Expand", "Pad"}
    x = rng.standard_normal(x_shape).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(rep.run([x])[0], want)
    assert rep.partitions == [("device", [("pad", "Pad"), ("add", "Add")])]


def test_a_constant_node_that_fails_is_named(device):
    """A folded node whose evaluation fails (a Reshape to a wrong size) raises a
    ValidationError naming it, not the reference evaluator's exception."""
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="bad_reshape")]
    model = _model(nodes, {"x": np.zeros((2, 3), np.float32), "s": np.array([4, 2], np.int64)})
    with pytest.raises(vkml.ValidationError, match="^node 'bad_reshape' \\(Reshape\\)"):
        vonnx.prepare(model, device=device)


def test_identity_of_a_constant_folds_without_the_evaluator(device, monkeypatch):
    """An Identity of an initializer (exporters write one before weights) folds to the
    initializer's value without building the reference evaluator; the model computes
    ONNX's value."""
    import onnx.reference

    def refuse(*args, **kwargs):
        raise AssertionError("the reference evaluator was built for an Identity")

    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    nodes = [helper.make_node("Identity", ["w"], ["wi"]),
             helper.make_node("Add", ["x", "wi"], ["y"], name="add")]
    model = _model(nodes, {"w": w},
                   inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])])
    monkeypatch.setattr(onnx.reference, "ReferenceEvaluator", refuse)
    rep = vonnx.prepare(model, device=device)
    assert [n.op_type for _, n in rep.folded] == ["Identity"]
    x = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(rep.run([x])[0], x + w)

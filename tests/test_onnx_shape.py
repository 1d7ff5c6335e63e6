"""vkml.onnx: shape subgraphs folded at prepare.  With the model's input shapes static,
``Shape`` (start/end) and ``Size`` are constants and what is computed from them alone
(Gather, Unsqueeze, Concat, Slice, Cast, int64 arithmetic, ConstantOfShape, Range,
Equal/Where) folds with them, so that the model exported without simplification (YOLO's
``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``) runs on the device with
``strict=True``; against ONNX Runtime on the CPU.  A symbolic dimension keeps the Shape
that reads it on the host; folding stays within its size bound."""
from __future__ import annotations

import functools

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402
from vkml.onnx import fold as vfold  # noqa: E402
from onnx_helpers import make_model, node_cases, ort_expected, value_info as _vi  # noqa: E402

SHAPE_OPS = {"Shape", "Size", "Gather", "Unsqueeze", "Concat", "Slice", "Cast", "Add", "Sub",
             "Mul", "Div", "ConstantOfShape", "Range", "Equal", "Where", "ReduceProd"}


def _i64(name, value):
    return numpy_helper.from_array(np.asarray(value, np.int64), name)


def _n(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs if isinstance(outs, list) else [outs], **attrs)


def _yolo_nodes():
    """x (N, C, H, W), C even -> y: the shape chains of an unsimplified export around
    a Relu, a Reshape, a Range grid, a ConstantOfShape scale and an Expand."""
    return [
        _n("Relu", ["x"], "r", name="relu"),
        _n("Shape", ["r"], "s"),
        _n("Gather", ["s", "zero"], "n", axis=0), _n("Gather", ["s", "one"], "c", axis=0),
        _n("Div", ["c", "two"], "half"),
        _n("Shape", ["r"], "hw_dims", start=-2),
        _n("ReduceProd", ["hw_dims"], "hw_1", keepdims=1),
        _n("Size", ["r"], "size"), _n("Mul", ["n", "c"], "nc"), _n("Div", ["size", "nc"], "hw"),
        _n("Unsqueeze", ["n", "axis0"], "n_1"), _n("Unsqueeze", ["half", "axis0"], "half_1"),
        _n("Concat", ["n_1", "two_1", "half_1", "hw_1"], "shape4", axis=0),
        _n("Reshape", ["r", "shape4"], "y0", name="reshape"),      # (N, 2, C/2, H*W)
        _n("Range", ["zero", "hw", "one"], "grid_i"),
        _n("Cast", ["grid_i"], "grid", to=TensorProto.FLOAT),
        _n("Add", ["y0", "grid"], "y1", name="add_grid"),
        _n("Slice", ["s", "two_1", "four_1"], "sp"),                # Shape -> Slice: [H, W]
        _n("Cast", ["sp"], "sp_f", to=TensorProto.FLOAT),
        _n("Sub", ["hw", "one"], "hw_m1"), _n("Add", ["hw_m1", "one"], "hw_again"),
        _n("Unsqueeze", ["hw_again", "axis0"], "hw_again_1"),
        _n("Concat", ["n_1", "one_1", "one_1", "hw_again_1"], "ones_shape", axis=0),
        _n("ConstantOfShape", ["ones_shape"], "halves",
           value=numpy_helper.from_array(np.array([0.5], np.float32))),
        _n("Mul", ["y1", "halves"], "y2", name="scale"),
        _n("Slice", ["y0", "zero_1", "one_1", "three_1"], "y0_first", name="first"),
        _n("Concat", ["one_1", "minus_1", "one_1", "hw_1"], "target", axis=0),
        _n("Equal", ["target", "minus_1"], "is_free"),
        _n("Where", ["is_free", "one_1", "target"], "eshape"),
        _n("Expand", ["y0_first", "eshape"], "y0_wide", name="expand"),
        _n("Add", ["y2", "y0_wide"], "y", name="add"),
        _n("Mul", ["sp_f", "half_f"], "half_hw"),
    ]


def _yolo_model(shape):
    inits = [_i64("zero", 0), _i64("one", 1), _i64("two", 2), _i64("axis0", [0]),
             _i64("zero_1", [0]), _i64("one_1", [1]), _i64("two_1", [2]), _i64("three_1", [3]),
             _i64("four_1", [4]), _i64("minus_1", [-1]),
             numpy_helper.from_array(np.float32(0.5), "half_f")]
    n, c, h, w = shape
    return make_model(_yolo_nodes(), [_vi("x", shape)],
                      [_vi("y", [n, 2, c // 2, h * w]), _vi("half_hw", [2])], inits)


@pytest.mark.parametrize("seed", range(3))
def test_yolo_shape_chain_is_folded(seed, device):
    """Every shape node folds (rep.folded lists them); what is left runs on the device
    under strict=True and gives ONNX Runtime's values."""
    rng = np.random.default_rng(seed)
    shape = [int(rng.integers(1, 3)), 2 * int(rng.integers(1, 4)), int(rng.integers(1, 5)),
             int(rng.integers(1, 5))]
    model = _yolo_model(shape)
    rep = vonnx.prepare(model, device=device, strict=True)
    folded = [n.op_type for _, n in rep.folded]
    assert set(folded) == SHAPE_OPS and len(folded) == len(model.graph.node) - 7, folded
    assert rep.partitions == [("device", [("relu", "Relu"), ("reshape", "Reshape"),
                                          ("add_grid", "Add"), ("scale", "Mul"),
                                          ("first", "Slice"), ("expand", "Expand"),
                                          ("add", "Add")])]
    x = rng.standard_normal(shape).astype(np.float32)
    got = rep.run({"x": x})
    for g, w in zip(got, ort_expected(model, {"x": x})):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    assert not rep.fallbacks


def test_a_symbolic_dimension_keeps_its_shape_on_the_host(device):
    """With the batch symbolic, Shape of the whole input stays on the host (strict=True
    names it), Shape(start=1) of the static dimensions folds; both batch sizes run."""
    nodes = [_n("Shape", ["x"], "s", name="shape_all"),
             _n("Shape", ["x"], "chw", name="shape_chw", start=1),
             _n("Concat", ["minus_1", "chw"], "back", axis=0),
             _n("Reshape", ["x", "back"], "y", name="reshape"),
             _n("Cast", ["s"], "s_f", to=TensorProto.FLOAT)]
    model = make_model(nodes, [_vi("x", ["batch", 3, 2])],
                       [_vi("y", ["batch", 3, 2]), _vi("s_f", [3])], [_i64("minus_1", [-1])])
    with pytest.raises(vkml.UnsupportedError, match="shape_all"):
        vonnx.prepare(model, device=device, strict=True)
    rep = vonnx.prepare(model, device=device)
    assert [n.name or n.op_type for _, n in rep.folded] == ["shape_chw", "Concat"]
    assert ("device", [("reshape", "Reshape")]) in rep.partitions
    for batch in (1, 4):
        x = np.arange(batch * 6, dtype=np.float32).reshape(batch, 3, 2)
        for g, w in zip(rep.run({"x": x}), ort_expected(model, {"x": x})):
            np.testing.assert_array_equal(g, w)


def test_a_shape_made_static_by_folding(device, monkeypatch):
    """A Shape whose input is sized by a Reshape to a folded shape that shape inference
    cannot follow before folding (a ReduceMax of the shape) folds in a second round."""
    calls = []
    real = vfold.static_dims
    monkeypatch.setattr(vfold, "static_dims", lambda *a: calls.append(1) or real(*a))
    nodes = [_n("Shape", ["x"], "s"), _n("ReduceMax", ["s"], "m", keepdims=1),
             _n("Concat", ["m", "minus_1"], "target", axis=0),
             _n("Reshape", ["x", "target"], "r", name="reshape"),
             _n("Shape", ["r"], "rs", name="shape_of_reshaped"),
             _n("Cast", ["rs"], "y", to=TensorProto.FLOAT)]
    model = make_model(nodes, [_vi("x", [2, 6])], [_vi("y", [2]), _vi("r", [6, 2])],
                       [_i64("minus_1", [-1])])
    rep = vonnx.prepare(model, device=device, strict=True)
    assert "shape_of_reshaped" in [n.name for _, n in rep.folded] and len(calls) == 2
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for g, w in zip(rep.run({"x": x}), ort_expected(model, {"x": x})):
        np.testing.assert_array_equal(g, w)


def test_a_chain_of_shapes_made_static_by_folding(device):
    """Eight such Reshapes in a row, each sized by a ReduceMax of the previous one's shape
    (as a detection head's neck chains them): every round of inference and folding makes
    the next one static, and all fold (YOLOv8n's export needed more than four rounds)."""
    nodes, prev = [], "x"
    for k in range(8):
        nodes += [_n("Shape", [prev], f"s{k}"), _n("ReduceMax", [f"s{k}"], f"m{k}", keepdims=1),
                  _n("Concat", [f"m{k}", "minus_1"], f"t{k}", axis=0),
                  _n("Reshape", [prev, f"t{k}"], f"r{k}")]
        prev = f"r{k}"
    nodes += [_n("Shape", [prev], "last", name="last_shape"),
              _n("Cast", ["last"], "y", to=TensorProto.FLOAT)]
    model = make_model(nodes, [_vi("x", [2, 6])], [_vi("y", [2])], [_i64("minus_1", [-1])])
    rep = vonnx.prepare(model, device=device, strict=True)
    assert "last_shape" in [n.name for _, n in rep.folded]
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(rep.run({"x": x})[0], ort_expected(model, {"x": x})[0])


def test_shape_folding_is_bounded(device):
    """A ConstantOfShape of a folded shape times 2**20 is refused at prepare, naming the
    node, as any other fold over the bound."""
    nodes = [_n("Shape", ["x"], "s"), _n("Mul", ["s", "big"], "huge"),
             _n("ConstantOfShape", ["huge"], "y", name="zeros")]
    model = make_model(nodes, [_vi("x", [3, 4])], [_vi("y", ["a", "b"])],
                       [_i64("big", 1 << 20)])
    with pytest.raises(vkml.ValidationError, match="^node 'zeros'") as info:
        vonnx.prepare(model, device=device)
    assert "bytes" in info.value.rule


NODE_CASES = node_cases(("shape", "size"),
                        lambda c: c.name.startswith(("test_shape", "test_size")))


@pytest.mark.parametrize("name", sorted(NODE_CASES))
def test_onnx_node_case(name, device):
    """ONNX's Shape (every start/end case) and Size cases: folded, ONNX's values."""
    assert len(NODE_CASES) >= 12
    case = NODE_CASES[name]
    rep = vonnx.prepare(case.model, device=device, strict=True)
    assert [n.op_type for _, n in rep.folded] == [case.model.graph.node[0].op_type]
    assert rep.partitions == []
    for inputs, expected in case.data_sets:
        Runner.assert_similar_outputs(expected, rep.run(inputs), rtol=case.rtol,
                                      atol=case.atol)


@functools.lru_cache(maxsize=None)
def _exported(dynamic_batch: bool):
    """A detection-head-like module exported by torch.onnx (TorchScript, no constant
    folding, no simplification): its ``x.shape`` views, expand and index_select become
    Shape/Gather/Unsqueeze/Concat/Reshape/Expand/Where chains."""
    torch = pytest.importorskip("torch")
    import io

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 6, 3, padding=1)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            b, c, h, w = y.shape
            y = y.view(b, 2, c // 2, h * w)
            first = y[:, :, :, :1].expand(b, 2, c // 2, h * w)
            return (y * 0.5 + first).flatten(2), y[:, :, [2, 0, 1], :], y[:, 1]

    torch.manual_seed(0)
    f = io.BytesIO()
    axes = {"x": {0: "batch"}} if dynamic_batch else None
    torch.onnx.export(Head().eval(), (torch.randn(1, 4, 5, 3),), f, input_names=["x"],
                      opset_version=17, dynamo=False, do_constant_folding=False,
                      dynamic_axes=axes)
    return onnx.load_from_string(f.getvalue())


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_exported_model(device):
    """Static shapes: every shape node folds, strict=True accepts the model, one device
    partition; a symbolic batch: the Shapes reading it stay on the host, values still
    ONNX Runtime's for two batch sizes."""
    model = _exported(dynamic_batch=False)
    assert {"Shape", "Gather", "Unsqueeze", "Concat", "Expand"} <= \
        {n.op_type for n in model.graph.node}
    rep = vonnx.prepare(model, device=device, strict=True)
    assert "Shape" in {n.op_type for _, n in rep.folded}
    assert [w for w, _ in rep.partitions] == ["device"]
    x = np.random.default_rng(1).standard_normal((1, 4, 5, 3)).astype(np.float32)
    for g, w in zip(rep.run([x]), ort_expected(model, {"x": x})):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    model = _exported(dynamic_batch=True)
    rep = vonnx.prepare(model, device=device)
    assert "host" in [w for w, _ in rep.partitions]
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 4, 5, 3)).astype(np.float32)
        for g, w in zip(rep.run([x]), ort_expected(model, {"x": x})):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)

"""vkml.onnx: ONNX's own node test cases, exported and hand-built models, errors.

The node cases are those behind ``onnx.backend.test.BackendTest`` for the ops vkml.onnx maps
(``_expanded`` function-body variants included), compared as BackendTest compares them
(``Runner.assert_similar_outputs`` with the case's rtol/atol), on every device.  A case for
an op in ``vkml.onnx.DEVICE_OPS`` (activations included) on a data type it takes must also
have run on the device: no host fallback, unless HOST_BY_DESIGN says why.
"""
from __future__ import annotations

import io
import subprocess
import sys
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402
from onnx_helpers import node_cases  # noqa: E402

OPS = {"Pad", "Conv", "ConvTranspose", "LpPool", "Col2Im", "Relu", "LeakyRelu", "Sigmoid",
       "Tanh", "HardSigmoid", "Elu", "Selu", "Celu", "Softplus", "Softsign", "ThresholdedRelu",
       "Shrink", "Gelu", "Clip", "Identity", "Add", "Sub", "Mul", "Div", "Max", "Min", "Sum",
       "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Dropout", "MaxPool", "AveragePool",
       "GlobalMaxPool", "GlobalAveragePool", "Transpose", "Slice",
       "Concat", "Split", "BatchNormalization", "Softmax"}

#: THE list of excluded ONNX node cases: case name -> reason (what is wrong).  Empty: every
#: case passes on lavapipe and SwiftShader.
EXCLUDED: dict[str, str] = {}

#: Cases of a device op that run on the host by design (what vkml.onnx.HOST_ACTIVATIONS
#: lists, and values that are not tensors).
HOST_BY_DESIGN = {
    "test_identity_sequence": "a sequence value: vkml tensors are tensors only",
    "test_identity_opt": "an optional value: vkml tensors are tensors only",
    "test_gelu_tanh_1": vonnx.HOST_ACTIVATIONS["gelu_tanh"],
    "test_gelu_tanh_2": vonnx.HOST_ACTIVATIONS["gelu_tanh"],
    **{f"test_{n}": vonnx.HOST_ALIASES["dropout_mask"]
       for n in ("dropout_default_mask", "dropout_default_mask_ratio",
                 "training_dropout_default_mask", "training_dropout_mask",
                 "training_dropout_zero_ratio_mask")},
    **{f"test_{n}": vonnx.HOST_ALIASES["dropout_training"]
       for n in ("training_dropout", "training_dropout_default",
                 "training_dropout_zero_ratio")},
    "test_maxpool_with_argmax_2d_precomputed_strides": vonnx.HOST_POOLING["storage_order"],
    "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True":
        vonnx.HOST_POOLING["ceil_include_pad"],
    "test_slice_start_out_of_bounds": vonnx.HOST_ELEMENT_WISE["empty"],
    "test_split_zero_size_splits_opset13": vonnx.HOST_ELEMENT_WISE["empty"],
    "test_split_zero_size_splits_opset18": vonnx.HOST_ELEMENT_WISE["empty"],
    "test_batchnorm_epsilon_training_mode": vonnx.HOST_BATCH_NORMALIZATION["training"],
    "test_batchnorm_example_training_mode": vonnx.HOST_BATCH_NORMALIZATION["training"],
}


#: The modules of onnx.backend.test.case.node holding those ops' cases (each case, and its
#: ``_expanded`` function-body variants, is generated when its module is imported).
CASE_MODULES = ["pad", "conv", "convtranspose", "lppool", "col2im", "relu", "leakyrelu",
                "sigmoid", "tanh", "hardsigmoid", "elu", "selu", "celu", "softplus",
                "softsign", "thresholdedrelu", "shrink", "gelu", "clip", "identity", "add", "sub",
                "mul", "div", "max", "min", "sum", "reshape", "flatten", "squeeze", "unsqueeze",
                "dropout", "maxpool", "averagepool", "globalmaxpool", "globalaveragepool",
                "transpose", "slice", "concat", "split", "batch_normalization",
                "softmax"]


def _collect():
    """Import only the case modules of our ops (collect_testcases() imports all of them,
    which is slow); every case of our ops they generate is kept, with its ``_expanded``
    function-body variants (other test files import other ops' modules into the same
    process-wide list: those stay out, whatever the order of import)."""
    every = node_cases(CASE_MODULES, lambda c: True)

    def ours(name):
        base = every.get(name.split("_expanded")[0])
        return base is not None and base.model.graph.node[0].op_type in OPS
    cases = {n: c for n, c in every.items() if ours(n)}
    return cases, sorted(cases)


CASES, CASE_NAMES = _collect()


def test_cases_cover_every_op():
    """A case list that lost an op would silently test less."""
    seen = {nd.op_type for n in CASE_NAMES for nd in CASES[n].model.graph.node}
    assert OPS <= seen, OPS - seen
    assert len(CASE_NAMES) > 110
    assert any(n.endswith("_expanded") for n in CASE_NAMES)
    assert set(EXCLUDED) <= set(CASE_NAMES)
    assert OPS <= set(vonnx.DEVICE_OPS), OPS - set(vonnx.DEVICE_OPS)   # all run on the device


@pytest.mark.parametrize("name", CASE_NAMES)
def test_onnx_node_case(name, device):
    if name in EXCLUDED:
        pytest.xfail(EXCLUDED[name])
    case = CASES[name]
    rep = vonnx.prepare(case.model, device=device)
    for inputs, expected in case.data_sets:
        outputs = rep.run(inputs)
        Runner.assert_similar_outputs(expected, outputs, rtol=case.rtol, atol=case.atol)
    # every node of a device op (activations included) on a data type it takes must have
    # run on the device: no quiet host fallback
    on_device = [n for n in case.model.graph.node if n.op_type in vonnx.DEVICE_OPS
                 and rep.types.get(n.input[0]) in vonnx.DEVICE_OPS[n.op_type].dtypes]
    if on_device and name not in HOST_BY_DESIGN:
        assert not rep.fallbacks, rep.fallbacks
        device_ops = {op.split(" ")[0] for where, nodes in rep.partitions if where == "device"
                      for _, op in nodes}
        assert {n.op_type for n in on_device} <= device_ops, rep.partitions


def test_host_by_design_cases_exist():
    assert set(HOST_BY_DESIGN) <= set(CASE_NAMES)


# -- helpers ----------------------------------------------------------------------------------

def _model(nodes, inputs, outputs, initializers=(), opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def _vi(name, shape, t=TensorProto.FLOAT, rank=4):
    """A tensor value info; shape None: ``rank`` unknown dimensions."""
    if shape is None:
        shape = [f"{name}_{i}" for i in range(rank)]
    return helper.make_tensor_value_info(name, t, shape)


def _reference(model, feeds):
    return ReferenceEvaluator(model).run(None, feeds)


# -- activations: fused into Conv by the graph compiler, or standalone --------------------------

ACTIVATION_CASES = [
    ("Relu", {}), ("LeakyRelu", {"alpha": 0.3}), ("Sigmoid", {}), ("Tanh", {}),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("Elu", {"alpha": 0.7}),
    ("Selu", {"alpha": 1.5, "gamma": 1.2}), ("Celu", {"alpha": 0.8}), ("Softplus", {}),
    ("Softsign", {}), ("ThresholdedRelu", {"alpha": 0.2}),
    ("Shrink", {"bias": 0.1, "lambd": 0.3}), ("Gelu", {}), ("Clip", {}),
]


@pytest.mark.parametrize("op,attrs", ACTIVATION_CASES, ids=[a[0] for a in ACTIVATION_CASES])
def test_activation_fused_into_conv(op, attrs, device):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]
    act_inputs = ["c"]
    if op == "Clip":
        inits += [numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
                  numpy_helper.from_array(np.array(0.7, np.float32), "hi")]
        act_inputs += ["lo", "hi"]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node(op, act_inputs, ["y"], name="act", **attrs)]
    model = _model(nodes, [_vi("x", [1, 2, 5, 6])], [_vi("y", None)], inits, opset=20)
    rep = vonnx.prepare(model, device=device, strict=True)
    assert rep.partitions == [("device", [("conv", "Conv"),
                                          ("act", f"{op} (fused into Conv)")])]
    x = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
    (y,) = rep.run([x])
    np.testing.assert_allclose(y, _reference(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_activation_not_fused_runs_standalone(device):
    """An activation whose producer has another consumer is not fused: it runs as an
    operator of its own on the device; Gelu approximate="tanh" (HOST_ACTIVATIONS) runs on
    the host, and strict=True refuses it, naming the node."""
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["z"], name="relu2"),
             helper.make_node("Gelu", ["c"], ["y"], name="gelu_tanh", approximate="tanh")]
    w = np.ones((1, 1, 2, 2), np.float32)
    model = _model(nodes, [_vi("x", [1, 1, 3, 3])], [_vi("y", None), _vi("z", None)],
                   [numpy_helper.from_array(w, "W")], opset=20)
    rep = vonnx.prepare(model, device=device)
    assert rep.partitions == [("device", [("conv", "Conv"), ("relu2", "Relu")]),
                              ("host", [("gelu_tanh", "Gelu")])]
    x = np.linspace(-2, 2, 9, dtype=np.float32).reshape(1, 1, 3, 3)
    for got, want in zip(rep.run([x]), _reference(model, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert rep._parts[0].last.compiled.fusions == []
    with pytest.raises(vkml.UnsupportedError, match="gelu_tanh.*Gelu.*tanh"):
        vonnx.prepare(model, device=device, strict=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_standalone_activations(dtype, device):
    """Every activation op on the device as an operator of its own, float32 and float16,
    after a host node (Sin) and with Clip's bounds as model inputs (read at run)."""
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("Sin", ["x"], ["s"], name="sin")]
    outs = []
    for op, attrs in ACTIVATION_CASES + [("Identity", {})]:
        ins = ["s", "lo", "hi"] if op == "Clip" else ["s"]
        nodes.append(helper.make_node(op, ins, [f"y_{op}"], name=op.lower(), **attrs))
        outs.append(_vi(f"y_{op}", [2, 3, 4], t))
    model = _model(nodes, [_vi("x", [2, 3, 4], t), _vi("lo", [], t), _vi("hi", [], t)],
                   outs, opset=20)
    rep = vonnx.prepare(model, device=device, strict=False)
    assert rep.partitions[0] == ("host", [("sin", "Sin")])
    assert rep.partitions[1][0] == "device" and len(rep.partitions) == 2
    assert rep.host_nodes == [("sin", "Sin", "vkml has no operator for it")]
    x = np.linspace(-3, 3, 24).reshape(2, 3, 4).astype(dtype)
    lo, hi = np.array(-0.5, dtype), np.array(0.25, dtype)
    got = rep.run([x, lo, hi])
    assert not rep.fallbacks
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = _reference(model, {"x": x, "lo": lo, "hi": hi})
    tol = 1e-5 if dtype == np.float32 else 5e-3
    for (op, _), g, w in zip(ACTIVATION_CASES + [("Identity", {})], got, want):
        assert g.dtype == w.dtype, op
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=tol,
                                   atol=tol, err_msg=op)


def test_pad_conv_relu_lppool_conv_is_one_graph(device):
    """Pad (constant 0, spatial) -> Conv -> Relu -> LpPool -> Conv: one device partition,
    one compiled graph; the graph compiler folds the padding into the first Conv and fuses
    the Relu into it, and rep.partitions says so; the weights are OWNED_BY_DML constants."""
    rng = np.random.default_rng(11)
    w1 = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    b1 = rng.standard_normal(3).astype(np.float32)
    w2 = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["xp"], name="pad"),
             helper.make_node("Conv", ["xp", "W1", "B1"], ["c"], name="conv1"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("LpPool", ["r"], ["l"], name="lppool", kernel_shape=[2, 2],
                              strides=[2, 2], p=2),
             helper.make_node("Conv", ["l", "W2"], ["y"], name="conv2")]
    inits = [numpy_helper.from_array(np.array([0, 0, 1, 2, 0, 0, 1, 0], np.int64), "pads"),
             numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(b1, "B1"),
             numpy_helper.from_array(w2, "W2")]
    # x's shape is symbolic (a new shape, a new lowering): compiled at the first run
    model = _model(nodes, [_vi("x", ["N", 2, "H", "W"])], [_vi("y", None)], inits)
    rep = vonnx.prepare(model, device=device, strict=True)
    for x in (rng.standard_normal((1, 2, 7, 8)).astype(np.float32),
              rng.standard_normal((2, 2, 6, 9)).astype(np.float32)):   # replay, new shape
        (y,) = rep.run([x])
        np.testing.assert_allclose(y, _reference(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
        assert rep.partitions == [("device", [
            ("pad", "Pad (folded into Conv)"), ("conv1", "Conv"),
            ("relu", "Relu (fused into Conv)"), ("lppool", "LpPool"), ("conv2", "Conv")])]
    (part,) = rep._parts
    graph = part.last.compiled
    assert [f.kind for f in graph.fusions] == ["padding", "activation"]
    assert len(graph.nodes) == 3
    assert sorted(graph.constant_inputs) == [1, 2, 3]        # W1, B1, W2
    assert len(part._cache) == 2 and not rep.fallbacks


# -- exported and hand-built models -------------------------------------------------------------

def test_torch_exported_model(device):
    """F.pad (reflect) + Conv + ReLU + lp_pool2d exported by torch.onnx.export (TorchScript
    exporter): Pad's pads come from a Constant/ConstantOfShape/Concat/Reshape/Slice/
    Transpose/Cast subgraph, folded at prepare; torch writes lp_pool2d as Pow/AveragePool/
    Sign/Abs/..., of which AveragePool and Mul run on the device, Pow, Sign, Abs on the
    host."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 3, 3)

        def forward(self, x):
            x = F.pad(x, (1, 2, 0, 1), mode="reflect")
            return F.lp_pool2d(torch.relu(self.conv(x)), 2, 2)

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(1, 2, 6, 7)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(net, (x,), buf, dynamo=False, opset_version=17)
        except ImportError as exc:     # pragma: no cover (an exporter that needs onnxscript)
            pytest.skip(f"torch.onnx.export unavailable: {exc}")
    model = onnx.load_from_string(buf.getvalue())
    ops = [n.op_type for n in model.graph.node]
    assert {"ConstantOfShape", "Concat", "Slice", "Cast", "Pad"} <= set(ops)
    rep = vonnx.prepare(buf.getvalue(), device=device)
    assert {"Constant", "ConstantOfShape", "Concat", "Reshape", "Slice", "Transpose",
            "Cast"} <= {n.op_type for _, n in rep.folded}
    where = {op.split(" ")[0]: w for w, nodes in rep.partitions for _, op in nodes}
    assert where["Pad"] == where["Conv"] == where["AveragePool"] == "device"
    assert where["Pow"] == "host"
    assert any("fused into Conv" in op for _, nodes in rep.partitions for _, op in nodes)
    (y,) = rep.run([x.numpy()])
    with torch.no_grad():
        want = net(x).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    assert not rep.fallbacks


def _pads_subgraph_model(ceil_mode=0):
    """Pad whose pads come from Constant/ConstantOfShape/Concat/Reshape/Slice/Cast (as
    torch.onnx.export writes them), then Conv + Relu + LpPool."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    nodes = [
        helper.make_node("Constant", [], ["p_hw"], value=numpy_helper.from_array(
            np.array([1, 2, 0, 1], np.int64))),
        helper.make_node("Constant", [], ["four"], value=numpy_helper.from_array(
            np.array([4], np.int64))),
        helper.make_node("ConstantOfShape", ["four"], ["zeros"], value=numpy_helper.from_array(
            np.array([0], np.int64))),
        helper.make_node("Concat", ["p_hw", "zeros"], ["cat"], axis=0),
        helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(
            np.array([-1, 2], np.int64))),
        helper.make_node("Reshape", ["cat", "shape"], ["pairs"]),
        helper.make_node("Constant", [], ["st"], value=numpy_helper.from_array(
            np.array([-1], np.int64))),
        helper.make_node("Constant", [], ["en"], value=numpy_helper.from_array(
            np.array([-(2 ** 62)], np.int64))),
        helper.make_node("Constant", [], ["ax"], value=numpy_helper.from_array(
            np.array([0], np.int64))),
        helper.make_node("Constant", [], ["step"], value=numpy_helper.from_array(
            np.array([-1], np.int64))),
        helper.make_node("Slice", ["pairs", "st", "en", "ax", "step"], ["rev"]),
        helper.make_node("Transpose", ["rev"], ["tr"], perm=[1, 0]),
        helper.make_node("Constant", [], ["flat"], value=numpy_helper.from_array(
            np.array([-1], np.int64))),
        helper.make_node("Reshape", ["tr", "flat"], ["pads64"]),
        helper.make_node("Cast", ["pads64"], ["pads"], to=TensorProto.INT64),
        helper.make_node("Pad", ["x", "pads"], ["xp"], name="pad", mode="reflect"),
        helper.make_node("Conv", ["xp", "W", "B"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("LpPool", ["r"], ["y"], name="lppool", kernel_shape=[2, 2],
                         strides=[2, 2], p=2, ceil_mode=ceil_mode),
    ]
    return _model(nodes, [_vi("x", ["N", 2, "H", "W"])], [_vi("y", None)],
                  [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]), w, b


def test_pads_subgraph_model_against_torch(device):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    model, w, b = _pads_subgraph_model()
    rep = vonnx.prepare(model, device=device, strict=True)
    assert [w_ for w_, _ in rep.partitions] == ["device"]
    assert {n.op_type for _, n in rep.folded} == {"Constant", "ConstantOfShape", "Concat",
                                                  "Reshape", "Slice", "Transpose", "Cast"}
    x = np.random.default_rng(4).standard_normal((1, 2, 6, 7)).astype(np.float32)
    (y,) = rep.run([x])
    t = F.pad(torch.from_numpy(x), (1, 2, 0, 1), mode="reflect")
    t = F.lp_pool2d(torch.relu(F.conv2d(t, torch.from_numpy(w), torch.from_numpy(b))), 2, 2)
    np.testing.assert_allclose(y, t.numpy(), rtol=1e-4, atol=1e-5)
    # replay with other data, then another shape (a new lowering)
    x2 = -x
    np.testing.assert_allclose(rep.run([x2])[0], _reference(model, {"x": x2})[0],
                               rtol=1e-4, atol=1e-5)
    x3 = np.random.default_rng(5).standard_normal((2, 2, 5, 9)).astype(np.float32)
    np.testing.assert_allclose(rep.run([x3])[0], _reference(model, {"x": x3})[0],
                               rtol=1e-4, atol=1e-5)


def test_lppool_ceil_mode(device):
    """ceil_mode runs on the device where no window hangs over the end; where one does,
    ONNX (and torch) scale that window by kernel size / elements inside, which
    DML_LP_POOLING1 cannot: that lowering falls back to the host."""
    model, _, _ = _pads_subgraph_model(ceil_mode=1)
    rep = vonnx.prepare(model, device=device)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 2, 7, 7)).astype(np.float32)      # LpPool input 6 x 8
    np.testing.assert_allclose(rep.run([x])[0], _reference(model, {"x": x})[0],
                               rtol=1e-4, atol=1e-5)
    assert not rep.fallbacks
    x = rng.standard_normal((1, 2, 6, 7)).astype(np.float32)      # 5 x 8: row 5 hangs over
    (y,) = rep.run([x])
    want = _reference(model, {"x": x})[0]
    assert y.shape == want.shape == (1, 3, 3, 4)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    assert "ceil_mode" in rep.fallbacks[0][1]
    # the fallback holds for that shape only: the first shape runs on the device again,
    # and a third one too
    for shape in ((1, 2, 7, 7), (2, 2, 9, 11), (1, 2, 6, 7)):
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(rep.run([x])[0], _reference(model, {"x": x})[0],
                                   rtol=1e-4, atol=1e-5)
    assert len(rep.fallbacks) == 1
    (part,) = [p for p in rep._parts if p.where == "device"]
    assert sum(isinstance(ex, vonnx.GraphExecutor) for ex in part._cache.values()) == 2


# -- placement, strictness, errors -------------------------------------------------------------

def _mixed_model():
    w = np.random.default_rng(7).standard_normal((2, 1, 2, 2)).astype(np.float32)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["xp"], name="pad", mode="edge"),
             helper.make_node("Sin", ["xp"], ["s"], name="sin"),
             helper.make_node("MatMul", ["s", "m"], ["mm"], name="matmul"),
             helper.make_node("Conv", ["mm", "W"], ["y"], name="conv")]
    inits = [numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
             numpy_helper.from_array(np.eye(6, dtype=np.float32)[::-1].copy(), "m"),
             numpy_helper.from_array(w, "W")]
    return _model(nodes, [_vi("x", [1, 1, 4, 4])], [_vi("y", None)], inits)


def test_partitions_of_a_mixed_model(device):
    model = _mixed_model()
    rep = vonnx.prepare(model, device=device)
    assert rep.partitions == [("device", [("pad", "Pad")]), ("host", [("sin", "Sin")]),
                              ("device", [("matmul", "MatMul"), ("conv", "Conv")])]
    x = np.random.default_rng(8).standard_normal((1, 1, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(rep.run({"x": x})[0], _reference(model, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)


def test_strict_refuses_an_unsupported_op(device):
    with pytest.raises(vkml.UnsupportedError, match=r"'sin'.*op type Sin"):
        vonnx.prepare(_mixed_model(), device=device, strict=True)
    nodes = [helper.make_node("Sin", ["a"], ["y"], name="the_sin")]
    model = _model(nodes, [_vi("a", [2, 2])], [_vi("y", None, rank=2)])
    with pytest.raises(vkml.UnsupportedError, match=r"'the_sin'.*op type Sin"):
        vonnx.prepare(model, device=device, strict=True)


def test_float64_conv(device):
    """Conv takes float32/float16 on the device: a float64 Conv runs on the host, or
    strict=True raises UnsupportedError naming the data type."""
    nodes = [helper.make_node("Conv", ["x", "W"], ["y"], name="conv64")]
    w = np.arange(4, dtype=np.float64).reshape(1, 1, 2, 2)
    model = _model(nodes, [_vi("x", [1, 1, 3, 3], TensorProto.DOUBLE)], [_vi("y", None)],
                   [numpy_helper.from_array(w, "W")])
    rep = vonnx.prepare(model, device=device)
    assert rep.partitions == [("host", [("conv64", "Conv")])]
    x = np.arange(9, dtype=np.float64).reshape(1, 1, 3, 3)
    np.testing.assert_array_equal(rep.run([x])[0], _reference(model, {"x": x})[0])
    with pytest.raises(vkml.UnsupportedError, match="conv64.*float64"):
        vonnx.prepare(model, device=device, strict=True)


def test_float64_col2im_where_the_device_lacks_it(device):
    """Col2Im (DML_FOLD) of float64 sums in float64: a device without fp64 refuses it at
    compile (UnsupportedError); not strict, that partition runs on the host and is listed
    in rep.fallbacks; strict, run raises."""
    nodes = [helper.make_node("Col2Im", ["x", "img", "blk"], ["y"], name="c2i")]
    inits = [numpy_helper.from_array(np.array([3, 3], np.int64), "img"),
             numpy_helper.from_array(np.array([2, 2], np.int64), "blk")]
    model = _model(nodes, [_vi("x", [1, 4, 4], TensorProto.DOUBLE)], [_vi("y", None)], inits)
    x = np.arange(16, dtype=np.float64).reshape(1, 4, 4)
    want = _reference(model, {"x": x})[0]
    rep = vonnx.prepare(model, device=device)
    np.testing.assert_array_equal(rep.run([x])[0], want)
    has_fp64 = device.features.get("fp64")
    assert bool(rep.fallbacks) == (not has_fp64), rep.fallbacks
    strict = vonnx.prepare(model, device=device, strict=True)
    if has_fp64:
        np.testing.assert_array_equal(strict.run([x])[0], want)
    else:
        with pytest.raises(vkml.UnsupportedError, match="c2i.*Col2Im"):
            strict.run([x])


def test_negative_pads_run_on_the_host(device):
    nodes = [helper.make_node("Pad", ["x", "pads"], ["y"], name="crop")]
    model = _model(nodes, [_vi("x", [3, 4]), _vi("pads", [4], TensorProto.INT64)],
                   [_vi("y", None, rank=2)])
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    pads = np.array([-1, 1, 0, -2], np.int64)
    rep = vonnx.prepare(model, device=device)
    # pads [-1, 1 | 0, -2]: drop row 0 and the last two columns, one zero column in front
    np.testing.assert_array_equal(rep.run([x, pads])[0], np.pad(x[1:, :2], [(0, 0), (1, 0)]))
    assert rep.fallbacks and "negative pads" in rep.fallbacks[0][1]


@pytest.mark.parametrize("data", [b"", b"\x00garbage\xff" * 7, "truncated"])
def test_malformed_model_raises_validation_error(data, device, tmp_path):
    if data == "truncated":
        data = _mixed_model().SerializeToString()[:-37]
    for model in (data, str(tmp_path / "m.onnx")):
        (tmp_path / "m.onnx").write_bytes(data)
        with pytest.raises(vkml.ValidationError, match="^model: ") as info:
            vonnx.prepare(model, device=device)
        assert info.value.field == "model"


def test_backend_interface(device):
    assert vonnx.supports_device("VKML") and vonnx.supports_device("VKML:0")
    assert not vonnx.supports_device("VKML:99") and not vonnx.supports_device("CUDA:0")
    assert issubclass(vonnx.VkmlBackend, onnx.backend.base.Backend)
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="wrap")
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    (y,) = vonnx.run_node(node, [x, np.array([1, 2, 0, 1], np.int64)], device=device)
    np.testing.assert_array_equal(y, np.pad(x, [(1, 0), (2, 1)], mode="wrap"))
    model = _mixed_model()
    x = np.ones((1, 1, 4, 4), np.float32)
    np.testing.assert_allclose(vonnx.run_model(model, [x], device=device)[0],
                               _reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_importing_vkml_does_not_import_onnx():
    code = "import sys, vkml; assert 'onnx' not in sys.modules, 'onnx imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_activation_parameters_dml_refuses_run_on_the_host(device):
    """Celu with alpha=0 is valid ONNX, but DML's CELU refuses it (it divides by Alpha): not
    fused, it runs on the host (ONNX's reference evaluator)."""
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             helper.make_node("Celu", ["c"], ["y"], name="celu0", alpha=0.0)]
    model = _model(nodes, [_vi("x", [1, 1, 3, 3])], [_vi("y", None)],
                   [numpy_helper.from_array(np.ones((1, 1, 2, 2), np.float32), "W")])
    rep = vonnx.prepare(model, device=device)
    assert rep.partitions == [("device", [("conv", "Conv")]), ("host", [("celu0", "Celu")])]
    x = np.linspace(-1, 1, 9, dtype=np.float32).reshape(1, 1, 3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = _reference(model, {"x": x})[0]
        got = rep.run([x])[0]
    np.testing.assert_array_equal(got, want)


def test_shape_model_copies_all_but_the_large_initializers():
    """The model shape inference sees (``backend._shape_model``) is the model with every
    field kept (metadata, opsets, docs, value infos, small initializers) and only the
    initializers over ``_INFER_VALUES_MAX`` elements turned into graph inputs: the same
    bytes as a copy of the whole model with those removed."""
    import math

    from vkml.onnx import backend

    rng = np.random.default_rng(3)
    big = backend._INFER_VALUES_MAX + 1
    inits = [numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), f"w{i}")
             for i, n in enumerate([big, 3, big * 2, 1])]
    nodes = [helper.make_node("Add", ["x", f"w{i}"], [f"y{i}"]) for i in range(4)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1])], [helper.make_tensor_value_info(
        f"y{i}", TensorProto.FLOAT, None) for i in range(4)], inits, doc_string="doc")
    graph.value_info.append(helper.make_tensor_value_info("y1", TensorProto.FLOAT, [3]))
    model = helper.make_model(graph, producer_name="p", doc_string="m")
    helper.set_model_props(model, {"k": "v"})
    got, declared = backend._shape_model(model)
    assert declared == {"w0", "w2"}
    want = onnx.ModelProto()
    want.CopyFrom(model)
    del want.graph.initializer[:]
    want.graph.initializer.extend(t for t in model.graph.initializer
                                  if math.prod(t.dims) <= backend._INFER_VALUES_MAX)
    want.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                            for t in model.graph.initializer if t.name in declared)
    assert got.SerializeToString(deterministic=True) == \
        want.SerializeToString(deterministic=True)
    assert len(model.graph.initializer) == 4            # the caller's model untouched

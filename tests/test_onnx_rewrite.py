"""vkml.onnx's graph rewrites at prepare (vkml/onnx/rewrite.py): BatchNormalization folded
into the Conv/ConvTranspose before it, Mul(x, Sigmoid(x)) as one Swish, Mul(x,
HardSigmoid(x, 1/6, 0.5)) as one HardSwish; the cases that must not rewrite; the switch.
Against ONNX Runtime on the CPU with its graph optimizations off (so that it runs the
model as written, not its own folding), and against vkml with the rewrites off."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402
from onnx_helpers import make_model, node_cases, ort_session, value_info as _vi  # noqa: E402
from vkml.onnx.rewrite import Rewrite  # noqa: E402


def _ort(model, feeds):
    """ONNX Runtime (CPU) with every graph optimization off: the model as written."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort_session(model, so).run(None, feeds)


def _close(got, want, dtype):
    """Within 1e-4 of the output's magnitude in float32 (float16: 1e-2, its weights
    rounded once more by the fold)."""
    tol = (1e-4 if np.dtype(dtype) == np.float32 else 1e-2) * float(np.abs(want).max())
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=0,
                               atol=tol)


def _as_float32(model):
    """``model`` with every float16 initializer and declared tensor as float32: ONNX
    Runtime's reference for a float16 model (its CPU provider lacks float16 kernels)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    f16, f32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    for t in m.graph.initializer:
        if t.data_type == f16:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32),
                                               t.name))
    for vi in list(m.graph.input) + list(m.graph.output):
        if vi.type.tensor_type.elem_type == f16:
            vi.type.tensor_type.elem_type = f32
    return m


def _reference(model, feeds, dtype):
    if np.dtype(dtype) == np.float16:
        return _ort(_as_float32(model), {k: v.astype(np.float32) for k, v in feeds.items()})
    return _ort(model, feeds)


def _any(rank):
    """Symbolic dimensions: outputs whose sizes the test does not spell out."""
    return [f"d{i}" for i in range(rank)]


def _conv_bn(rng, *, transposed=False, group=1, depthwise=False, bias=True,
             dtype=np.float32, spatial=2, relu=False, opset=15):
    """x -> Conv(W, B) -> BatchNormalization -> [Relu] -> y, every parameter an
    initializer; returns (model, feeds)."""
    c_in = int(rng.integers(1, 4)) * group
    if depthwise:
        group = c_in
    c_out = c_in if depthwise else int(rng.integers(1, 4)) * group
    k = [int(rng.integers(1, 4)) for _ in range(spatial)]
    xs = [1, c_in] + [int(rng.integers(k[i], k[i] + 4)) for i in range(spatial)]
    ws = [c_in, c_out // group] + k if transposed else [c_out, c_in // group] + k
    params = {"W": rng.standard_normal(ws), "B": rng.standard_normal(c_out),
              "scale": rng.standard_normal(c_out), "bias": rng.standard_normal(c_out),
              "mean": rng.standard_normal(c_out), "var": rng.uniform(0.1, 3.0, c_out)}
    if not bias:
        del params["B"]
    inits = [numpy_helper.from_array(v.astype(dtype), n) for n, v in params.items()]
    conv_in = ["x", "W"] + (["B"] if bias else [])
    nodes = [helper.make_node("ConvTranspose" if transposed else "Conv", conv_in, ["c"],
                              name="conv", group=group, pads=[k[i] // 2 for i in
                                                              range(spatial)] * 2),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"],
                              ["bn_out" if relu else "y"], name="bn",
                              epsilon=float(rng.uniform(1e-5, 1e-1)))]
    if relu:
        nodes.append(helper.make_node("Relu", ["bn_out"], ["y"], name="relu"))
    model = make_model(nodes, [_vi("x", xs, dtype)], [_vi("y", _any(spatial + 2), dtype)],
                       inits, opset)
    return model, {"x": rng.standard_normal(xs).astype(dtype)}


CONV_BN_CASES = {
    "conv": {},
    "conv_no_bias_relu": {"bias": False, "relu": True},
    "groups": {"group": 2, "bias": False},
    "depthwise_f16": {"depthwise": True, "dtype": np.float16},
    "conv1d_f16_no_bias": {"spatial": 1, "bias": False, "dtype": np.float16},
    "conv3d": {"spatial": 3},
    "transposed": {"transposed": True},
    "transposed_groups": {"transposed": True, "group": 2, "bias": False},
}


@pytest.mark.parametrize("case", CONV_BN_CASES)
def test_batch_normalization_folds_into_conv(case, device):
    kw = CONV_BN_CASES[case]
    rng = np.random.default_rng(list(CONV_BN_CASES).index(case))
    dtype = kw.get("dtype", np.float32)
    model, feeds = _conv_bn(rng, **kw)
    op = "ConvTranspose" if kw.get("transposed") else "Conv"
    rep = vonnx.prepare(model, device=device, strict=True)
    assert rep.rewrites == [Rewrite("batch_normalization", ("conv", "bn"), "conv", op)]
    labels = [("conv", op)] + ([("relu", f"Relu (fused into {op})")] if kw.get("relu") else [])
    assert rep.partitions == [("device", labels)]
    (got,) = rep.run(feeds)
    (want,) = _reference(model, feeds, dtype)
    _close(got, want, dtype)
    off = vonnx.prepare(model, device=device, strict=True, rewrites=False)
    assert off.rewrites == []
    assert [op for _, op in off.partitions[0][1]][:2] == [op, "BatchNormalization"]
    (unfused,) = off.run(feeds)
    _close(unfused, want, dtype)
    assert not rep.fallbacks and not off.fallbacks


def test_conv_output_read_twice_does_not_fold(device):
    """The Conv's output is also a graph output: folding would change it."""
    rng = np.random.default_rng(11)
    model, feeds = _conv_bn(rng)
    model.graph.output.append(_vi("c", _any(4)))
    rep = vonnx.prepare(model, device=device)
    assert rep.rewrites == []
    assert [op for _, op in rep.partitions[0][1]] == ["Conv", "BatchNormalization"]
    for got, want in zip(rep.run(feeds), _ort(model, feeds)):
        _close(got, want, np.float32)


@pytest.mark.parametrize("which", ["var", "W"])
def test_batch_normalization_parameters_not_constant_do_not_fold(which, device):
    """A statistic or the weights as a model input (no initializer), or an initializer
    fed by name at run: only known values fold."""
    rng = np.random.default_rng(12)
    model, feeds = _conv_bn(rng)
    init = next(t for t in model.graph.initializer if t.name == which)
    value = numpy_helper.to_array(init)
    keep = [t for t in model.graph.initializer if t.name != which]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    model.graph.input.append(_vi(which, value.shape))
    rep = vonnx.prepare(model, device=device)
    assert rep.rewrites == []
    new = value * 1.5 if which == "var" else value[::-1].copy()
    feeds[which] = new
    (want,) = _ort(model, feeds)
    _close(rep.run(feeds)[0], want, np.float32)
    # the same parameter as an initializer that is also an input: folded with its
    # default, not folded when a value is fed for it
    model.graph.initializer.append(numpy_helper.from_array(value, which))
    rep = vonnx.prepare(model, device=device)
    assert [r.kind for r in rep.rewrites] == ["batch_normalization"]
    _close(rep.run(feeds)[0], want, np.float32)
    assert rep._variant(frozenset([which])).rewrites == []


def _swish_model(act, order, dtype=np.float32, opset=18, extra_output=False, **attrs):
    rng = np.random.default_rng(len(act) + order)
    shape = [2, int(rng.integers(1, 5)), int(rng.integers(1, 7))]
    mul_in = ["x", "s"] if order == 0 else ["s", "x"]
    nodes = [helper.make_node(act, ["x"], ["s"], name="act", **attrs),
             helper.make_node("Mul", mul_in, ["y"], name="mul")]
    outputs = [_vi("y", shape, dtype)] + ([_vi("s", shape, dtype)] if extra_output else [])
    model = make_model(nodes, [_vi("x", shape, dtype)], outputs, opset=opset)
    return model, {"x": (4 * rng.standard_normal(shape)).astype(dtype)}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("order", [0, 1], ids=["x_first", "sigmoid_first"])
def test_silu_is_one_swish(order, dtype, device):
    model, feeds = _swish_model("Sigmoid", order, dtype)
    rep = vonnx.prepare(model, device=device, strict=True)
    assert rep.rewrites == [Rewrite("swish", ("act", "mul"), "mul", "Swish")]
    assert rep.partitions == [("device", [("mul", "Swish")])]
    (want,) = _reference(model, feeds, dtype)
    _close(rep.run(feeds)[0], want, dtype)
    off = vonnx.prepare(model, device=device, strict=True, rewrites=False)
    assert off.partitions == [("device", [("act", "Sigmoid"), ("mul", "Mul")])]
    _close(off.run(feeds)[0], want, dtype)


@pytest.mark.parametrize("order", [0, 1], ids=["x_first", "hard_sigmoid_first"])
def test_hard_sigmoid_times_x_is_one_hard_swish(order, device):
    """Opset 13, as exporters write HardSwish before opset 14 has it."""
    model, feeds = _swish_model("HardSigmoid", order, opset=13, alpha=1 / 6, beta=0.5)
    rep = vonnx.prepare(model, device=device, strict=True)
    assert rep.rewrites == [Rewrite("hard_swish", ("act", "mul"), "mul", "HardSwish")]
    assert rep.partitions == [("device", [("mul", "HardSwish")])]
    (want,) = _ort(model, feeds)
    _close(rep.run(feeds)[0], want, np.float32)


@pytest.mark.parametrize("act,attrs,extra", [
    ("Sigmoid", {}, True),                                 # the Sigmoid is a graph output
    ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}, False),   # not HardSwish's parameters
], ids=["sigmoid_read_twice", "other_hard_sigmoid"])
def test_no_swish_rewrite(act, attrs, extra, device):
    model, feeds = _swish_model(act, 0, extra_output=extra, **attrs)
    rep = vonnx.prepare(model, device=device, strict=True)
    assert rep.rewrites == []
    assert [op for _, op in rep.partitions[0][1]] == [act, "Mul"]
    for got, want in zip(rep.run(feeds), _ort(model, feeds)):
        _close(got, want, np.float32)


def test_switch_by_kind(device):
    """``rewrites`` takes the kinds to do; an unknown kind is refused by name."""
    rng = np.random.default_rng(13)
    model, feeds = _conv_bn(rng)
    bn_out = model.graph.output[0].name
    model.graph.node.extend([helper.make_node("Sigmoid", [bn_out], ["s"], name="act"),
                             helper.make_node("Mul", [bn_out, "s"], ["z"], name="mul")])
    del model.graph.output[:]
    model.graph.output.append(_vi("z", _any(4)))
    (want,) = _ort(model, feeds)
    for kinds, done in [(True, ["batch_normalization", "swish"]), ({"swish"}, ["swish"]),
                        (["batch_normalization"], ["batch_normalization"]), (False, [])]:
        rep = vonnx.prepare(model, device=device, strict=True, rewrites=kinds)
        assert [r.kind for r in rep.rewrites] == done
        _close(rep.run(feeds)[0], want, np.float32)
    with pytest.raises(vkml.ValidationError, match="rewrites.*'silu'"):
        vonnx.prepare(model, device=device, rewrites={"silu"})


def test_host_runs_rewritten_nodes_at_older_opsets():
    """A rewritten Swish/HardSwish that lands on the host (a partition the device
    refuses) runs at the model's opset, which may predate it."""
    from vkml.onnx.execute import host_ops
    x = np.linspace(-8, 8, 41, dtype=np.float32)
    want = {"Swish": x / (1 + np.exp(-x)), "HardSwish": x * np.clip(x / 6 + 0.5, 0, 1)}
    for op, attrs in [("Swish", {"alpha": 1.0}), ("HardSwish", {})]:
        for opset in (9, 13):
            model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)],
                               [_vi("x", [41])], [_vi("y", [41])], opset=24)
            model.opset_import[0].version = opset      # as a model of that opset holds it
            ev = ReferenceEvaluator(model, new_ops=host_ops(model))
            np.testing.assert_allclose(ev.run(None, {"x": x})[0], want[op], rtol=1e-6,
                                       atol=1e-6)


#: ONNX's own node test cases of HardSwish and Swish (opsets 22 and 24), the ops
#: the rewrites write, with their ``_expanded`` function-body variants.
NODE_CASES = node_cases(("hardswish", "swish"),
                        lambda c: c.name.startswith(("test_hardswish", "test_swish")))


def test_node_cases_exist():
    assert set(NODE_CASES) == {"test_hardswish", "test_hardswish_expanded", "test_swish",
                               "test_swish_expanded"}


@pytest.mark.parametrize("name", sorted(NODE_CASES))
def test_onnx_node_case(name, device):
    """On the device (strict, but for the expanded Swish's CastLike, a host op), as
    ``onnx.backend.test`` compares them; the expanded HardSwish (HardSigmoid(1/6, 0.5)
    times x) is rewritten back into one HardSwish."""
    from onnx.backend.test.runner import Runner
    case = NODE_CASES[name]
    rep = vonnx.prepare(case.model, device=device, strict=name != "test_swish_expanded")
    for inputs, expected in case.data_sets:
        Runner.assert_similar_outputs(expected, rep.run(inputs), rtol=case.rtol,
                                      atol=case.atol)
    kinds = [r.kind for r in rep.rewrites]
    assert kinds == (["hard_swish"] if name == "test_hardswish_expanded" else [])
    assert not rep.fallbacks


def test_refused_partition_runs_rewritten_node_on_host(device, monkeypatch):
    """A partition the device refuses at compile runs on the host, rewritten HardSwish
    and all, at opset 13 (which has no HardSwish)."""
    from vkml.onnx import execute
    from vkml.onnx.lower import _HostFallback

    def refuse(self, env):
        raise _HostFallback("refused for the test")
    monkeypatch.setattr(execute.DevicePartition, "_build", refuse)
    model, feeds = _swish_model("HardSigmoid", 1, opset=13, alpha=1 / 6, beta=0.5)
    rep = vonnx.prepare(model, device=device)
    assert [r.kind for r in rep.rewrites] == ["hard_swish"]
    (want,) = _ort(model, feeds)
    _close(rep.run(feeds)[0], want, np.float32)
    assert [why for _, why in rep.fallbacks] == ["refused for the test"]

"""vkml.onnx: the Reduce* family (ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceProd,
ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ReduceSumSquare) on the device as
DML_REDUCE, against ONNX Runtime on the CPU: random ranks, axes (attribute before opset
18, input from it; ReduceSum's input from 13), keepdims, noop_with_empty_axes,
float32/float16; what stays on the host (integers, an empty input) and bad axes."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402

from onnx_helpers import make_model, node_cases, ort_expected, value_info  # noqa: E402

OPS = sorted(vonnx.REDUCE_OPS)


def _reduce_model(op, shape, dtype, opset, axes, keepdims, noop=None):
    """A one-node model of ``op``; ``axes`` None: absent (every axis, or none with noop)."""
    attrs, inputs, inits = {"keepdims": keepdims}, ["x"], []
    if noop is not None:
        attrs["noop_with_empty_axes"] = noop
    as_input = opset >= 18 or (op == "ReduceSum" and opset >= 13)
    if axes is not None and as_input:
        inputs.append("axes")
        inits.append(helper.make_tensor("axes", onnx.TensorProto.INT64, [len(axes)], axes))
    elif axes is not None:
        attrs["axes"] = axes
    node = helper.make_node(op, inputs, ["y"], name="r", **attrs)
    rank = len(shape)
    red = ([] if noop else range(rank)) if not axes else [a % rank for a in axes]
    out = [1 if i in red else s for i, s in enumerate(shape) if keepdims or i not in red]
    return make_model([node], [value_info("x", shape, dtype)], [value_info("y", out, dtype)],
                      inits, opset=opset)


def _input(op, rng, shape, dtype):
    x = rng.standard_normal(shape)
    if op == "ReduceLogSum":
        x = np.abs(x) + 0.1                         # a positive sum: its log is finite
    if op == "ReduceProd":
        x = 1 + 0.2 * x                             # a product of few hundred stays in range
    return x.astype(dtype)


def _check(got, want, dtype, label):
    assert got.shape == want.shape, label
    scale = max(float(np.abs(want.astype(np.float64)).max()), 1e-30)
    err = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max()) / scale
    assert err < (1e-5 if dtype == np.float32 else 4e-3), (label, err)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("op", OPS)
def test_reduce(op, opset, dtype, device):
    pytest.importorskip("onnxruntime")
    rng = np.random.default_rng([OPS.index(op), opset, np.dtype(dtype).num])
    for trial in range(3):
        rank = int(rng.integers(1, 5))
        shape = [int(rng.integers(1, 7)) for _ in range(rank)]
        k = int(rng.integers(1, rank + 1))
        axes = [int(a) - (rank if rng.random() < 0.3 else 0)
                for a in rng.choice(rank, k, replace=False)]
        axes = None if trial == 0 else axes
        keepdims = int(rng.integers(0, 2))
        model = _reduce_model(op, shape, dtype, opset, axes, keepdims)
        rep = vonnx.prepare(model, device=device, strict=True)
        x = _input(op, rng, shape, dtype)
        (got,) = rep.run({"x": x})
        (want,) = ort_expected(model, {"x": x})
        _check(got, want, dtype, (op, shape, axes, keepdims))
        assert [k for k, _ in rep.partitions] == ["device"] and not rep.fallbacks
        rep.release()


def test_global_mean_of_a_cnn_head(device):
    """``x.mean([2, 3])`` as torch.onnx exports it (ShuffleNetV2's and MNASNet's head):
    ReduceMean over the spatial axes, keepdims=0, feeding a Gemm; on the device."""
    pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(3)
    w = helper.make_tensor("w", onnx.TensorProto.FLOAT, [10, 24],
                           rng.standard_normal(240).astype(np.float32))
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[2, 3], keepdims=0),
             helper.make_node("Gemm", ["m", "w"], ["y"], transB=1)]
    model = make_model(nodes, [value_info("x", [2, 24, 7, 5])], [value_info("y", [2, 10])],
                       [w], opset=17)
    rep = vonnx.prepare(model, device=device, strict=True)
    x = rng.standard_normal((2, 24, 7, 5)).astype(np.float32)
    (got,) = rep.run([x])
    (want,) = ort_expected(model, {"x": x})
    _check(got, want, np.float32, "head")
    rep.release()


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
def test_noop_with_empty_axes(op, device):
    """opset 18's noop_with_empty_axes=1 without axes: the output is the input."""
    pytest.importorskip("onnxruntime")
    model = _reduce_model(op, [3, 4], np.float32, 18, None, 1, noop=1)
    rep = vonnx.prepare(model, device=device, strict=True)
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    (got,) = rep.run({"x": x})
    np.testing.assert_array_equal(got, ort_expected(model, {"x": x})[0])
    rep.release()


def test_what_stays_on_the_host(device):
    """An integer reduction is placed on the host (strict refuses it naming the node and
    the data type); an empty input is a host fallback at run, listed."""
    pytest.importorskip("onnxruntime")
    model = _reduce_model("ReduceSum", [3, 4], np.int32, 13, [1], 1)
    with pytest.raises(vkml.UnsupportedError, match=r"ReduceSum.*int32"):
        vonnx.prepare(model, device=device, strict=True)
    rep = vonnx.prepare(model, device=device)
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    np.testing.assert_array_equal(rep.run({"x": x})[0], x.sum(1, keepdims=True))
    empty = _reduce_model("ReduceMax", [0, 4], np.float32, 18, [1], 0)
    rep = vonnx.prepare(empty, device=device)
    (got,) = rep.run({"x": np.zeros((0, 4), np.float32)})
    assert got.shape == (0,) and rep.fallbacks
    rep.release()


def test_bad_axes(device):
    model = _reduce_model("ReduceMean", [3, 4], np.float32, 13, [0], 1)
    (axes,) = [a for a in model.graph.node[0].attribute if a.name == "axes"]
    axes.ints[:] = [2]                  # past the rank: ValidationError naming the axes
    with pytest.raises(vkml.ValidationError, match="axes"):
        vonnx.prepare(model, device=device, strict=True).run({"x": np.zeros((3, 4), np.float32)})


#: onnx.backend.test.case.node's modules of the family
CASE_MODULES = ("reducel1", "reducel2", "reducemax", "reducemean", "reducemin", "reduceprod",
                "reducesum", "reducesumsquare", "reduce_log_sum", "reduce_log_sum_exp")
NODE_CASES = node_cases(CASE_MODULES,
                        lambda c: c.model.graph.node[0].op_type in OPS)


def test_node_cases_exist():
    assert len(NODE_CASES) >= 60
    assert {c.model.graph.node[0].op_type for c in NODE_CASES.values()} == set(OPS)


@pytest.mark.parametrize("name", sorted(NODE_CASES))
def test_onnx_node_case(name, device):
    """ONNX's own cases (``_expanded``: function bodies of Reduce* and Log/Exp), compared as
    onnx.backend.test compares them; the Reduce* nodes of a case of a float type with a
    non-empty input run on the device (integers and empty sets: host by design)."""
    case = NODE_CASES[name]
    rep = vonnx.prepare(case.model, device=device)
    for inputs, expected in case.data_sets:
        Runner.assert_similar_outputs(expected, rep.run(inputs), rtol=case.rtol,
                                      atol=case.atol)
    x = case.data_sets[0][0][0]
    if x.dtype in (np.float32, np.float16) and x.size:
        assert not rep.fallbacks, rep.fallbacks
        reduces = {n.op_type for n in case.model.graph.node if n.op_type in OPS}
        on_device = {op.split(" ")[0] for where, nodes in rep.partitions if where == "device"
                     for _, op in nodes}
        assert reduces <= on_device, rep.partitions     # _expanded: Log, Exp on the host

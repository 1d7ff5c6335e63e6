"""vkml.onnx: Gather on constant indices on the device (DML_SLICE1 per run of indices in
arithmetic progression, DML_JOIN of several) and Expand as a broadcasting
DML_ELEMENT_WISE_IDENTITY, against ONNX Runtime on the CPU: random ranks, axes (negative
too), indices (scalar, 1-D, N-D, negative, repeated, reversed, scattered) and data types;
what stays on the host, each with its reason; ONNX's own node cases."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402
from vkml.onnx.lower import _lower_gather, _Lowering, gather_runs  # noqa: E402
from onnx_helpers import node_cases, ort_expected, value_info as _vi  # noqa: E402

DTYPES = [np.float32, np.float16, np.int32, np.int64]


def _gather_model(shape, dtype, indices, axis, pre=True):
    """x -> (Add x x, so that Gather reads a device intermediate) -> Gather(indices: an
    initializer) -> Relu/Add after it (so that its output feeds a device node)."""
    rank = len(shape)
    out_rank = rank - 1 + np.ndim(indices)
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="pre") if pre else
             helper.make_node("Identity", ["x"], ["a"], name="pre"),
             helper.make_node("Gather", ["a", "i"], ["g"], name="gather", axis=axis),
             helper.make_node("Add", ["g", "g"], ["y"], name="post")]
    g = helper.make_graph(nodes, "g", [_vi("x", shape, dtype)],
                          [_vi("y", [f"d{k}" for k in range(out_rank)], dtype)],
                          [numpy_helper.from_array(np.asarray(indices, np.int64), "i")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


FORMS = ["scalar", "progression", "reversed", "nd", "repeated"]


def _random_indices(rng, n, form):
    """Random indices of ``form`` (the forms the lowering distinguishes; "nd": N-D
    indices, scattered) for an axis of ``n``."""
    if form == "scalar":
        return np.int64(rng.integers(-n, n))
    if form in ("progression", "reversed"):
        step = int(rng.integers(1, 3))
        count = int(rng.integers(1, max(2, (n - 1) // step + 2)))
        first = int(rng.integers(0, max(1, n - step * (count - 1))))
        idx = np.arange(first, first + step * count, step)[:count]
        idx = idx[::-1] if form == "reversed" else idx
        return np.where(rng.random(idx.size) < 0.3, idx - n, idx)     # some negative
    if form == "repeated":
        return np.full(int(rng.integers(2, 4)), rng.integers(-n, n))
    shape = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(1, 3)))]
    return rng.integers(-n, n, size=shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gather(dtype, device):
    rng = np.random.default_rng(300 + np.dtype(dtype).num)
    for form in FORMS * 2:
        rank = int(rng.integers(1, 5))
        shape = [int(rng.integers(1, 6)) for _ in range(rank)]
        axis = int(rng.integers(-rank, rank))
        indices = _random_indices(rng, shape[axis], form)
        model = _gather_model(shape, dtype, indices, axis)
        rep = vonnx.prepare(model, device=device, strict=True)
        assert rep.partitions == [("device", [("pre", "Add"), ("gather", "Gather"),
                                              ("post", "Add")])]
        x = (rng.standard_normal(shape) * 20).astype(dtype)
        (got,) = rep.run({"x": x})
        (want,) = ort_expected(model, {"x": x})
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want, err_msg=str((shape, axis, indices, form)))
        assert not rep.fallbacks


def _lowered(shape, indices, axis):
    """(descriptor class names, (shape, dtype) of the output) of Gather's lowering."""
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)
    lw = _Lowering({"i": np.asarray(indices)}, {"x": (tuple(shape), np.dtype(np.float32))})
    _lower_gather(lw, node)
    return [type(s.desc).__name__ if s.desc else None for s in lw.steps], lw.infos["y"]


def test_gather_forms():
    """A scalar index is one SLICE1 of size 1 and an alias dropping the axis; indices in
    arithmetic progression (either direction) one strided SLICE1; other indices one SLICE1
    per run, a repeated run sliced once, joined by JOIN; the output shape is ONNX's."""
    s1 = "Slice1OperatorDesc"
    assert _lowered((4, 5, 6), 2, 1) == ([s1, None], ((4, 6), np.float32))
    assert _lowered((4, 5, 6), -1, -1) == ([s1, None], ((4, 5), np.float32))
    assert _lowered((4, 5, 6), [4, 2, 0], 1) == ([s1], ((4, 3, 6), np.float32))
    assert _lowered((7,), [[1, 3], [5, 0]], 0)[0] == [s1, s1, "JoinOperatorDesc", None]
    steps, (shape, _) = _lowered((4, 9), [0, 1, 2, 8, 6, 4, 0, 1, 2], 1)
    assert steps == [s1, s1, "JoinOperatorDesc"] and shape == (4, 9)
    assert _lowered((3, 2), [1, 1, 1], 0)[0] == [s1, "JoinOperatorDesc"]


def test_gather_host_reasons(device):
    """Each case that stays on the host, with its reason: indices that are not constants
    (a model input), more than GATHER_SLICES_MAX runs, an empty result; out-of-range
    indices are a ValidationError naming them; each host case still gives ONNX's values."""
    rng = np.random.default_rng(7)
    n = 2 * vonnx.GATHER_SLICES_MAX + 4
    x = rng.standard_normal((3, n)).astype(np.float32)
    scattered = rng.permutation(n)          # runs of two at most, most likely: 66 runs
    assert len(gather_runs(scattered, n)) > vonnx.GATHER_SLICES_MAX
    nodes = [helper.make_node("Gather", ["x", "i"], ["y"], name="gather", axis=1)]
    dynamic = helper.make_model(helper.make_graph(
        nodes, "g", [_vi("x", x.shape), _vi("i", [4], np.int64)], [_vi("y", [3, 4])]),
        opset_imports=[helper.make_opsetid("", 18)])
    for model, feeds, reason in [
            (dynamic, {"x": x, "i": np.array([3, -1, 0, 3])}, vonnx.HOST_GATHER["indices"]),
            (_gather_model(x.shape, np.float32, scattered, 1, pre=False), {"x": x},
             vonnx.HOST_GATHER["slices"])]:
        with pytest.raises(vkml.UnsupportedError, match="gather") as info:
            vonnx.prepare(model, device=device, strict=True)
        assert reason in str(info.value)
        rep = vonnx.prepare(model, device=device)
        assert ("host", [("gather", "Gather")]) in rep.partitions
        for got, want in zip(rep.run(feeds), ort_expected(model, feeds)):
            np.testing.assert_array_equal(got, want)
    rep = vonnx.prepare(_gather_model(x.shape, np.float32, np.zeros((2, 0)), 1, pre=False),
                        device=device)
    (got,) = rep.run({"x": x})
    assert got.shape == (3, 2, 0)
    assert any(vonnx.HOST_ELEMENT_WISE["empty"] in why for _, why in rep.fallbacks)
    rep = vonnx.prepare(_gather_model(x.shape, np.float32, [0, n], 1), device=device)
    with pytest.raises(vkml.ValidationError, match="^Gather 'gather': indices") as info:
        rep.run({"x": x})
    assert f"got {n}" in info.value.rule
    # the device is usable afterwards: the lowest index, counted from the end
    (y,) = vonnx.prepare(_gather_model(x.shape, np.float32, -n, 1), device=device).run([x])
    np.testing.assert_array_equal(y, 2 * x[:, 0] + 2 * x[:, 0])


def _expand_model(shape, dtype, want):
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="pre"),
             helper.make_node("Expand", ["a", "s"], ["y"], name="expand")]
    out_rank = max(len(shape), len(want))
    g = helper.make_graph(nodes, "g", [_vi("x", shape, dtype)],
                          [_vi("y", [f"d{k}" for k in range(out_rank)], dtype)],
                          [numpy_helper.from_array(np.asarray(want, np.int64), "s")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_expand(dtype, device):
    """Expand to a random shape (a longer one, ones where the input has sizes, the input's
    own shape: an alias) as one IDENTITY reading zero strides."""
    rng = np.random.default_rng(400 + np.dtype(dtype).num)
    for _ in range(4):
        rank = int(rng.integers(0, 4))
        shape = [int(rng.choice([1, int(rng.integers(2, 5))])) for _ in range(rank)]
        lead = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(0, 3)))]
        want = lead + [int(rng.integers(2, 4)) if s == 1 and rng.random() < 0.6 else
                       int(rng.choice([1, s])) for s in shape]
        model = _expand_model(shape, dtype, want)
        rep = vonnx.prepare(model, device=device, strict=True)
        assert rep.partitions == [("device", [("pre", "Add"), ("expand", "Expand")])]
        x = np.asarray(rng.standard_normal(shape) * 20).astype(dtype)
        (got,) = rep.run({"x": x})
        (want_y,) = ort_expected(model, {"x": x})
        assert got.shape == want_y.shape and got.dtype == want_y.dtype
        np.testing.assert_array_equal(got, want_y, err_msg=str((shape, want)))
        assert not rep.fallbacks


NODE_CASES = node_cases(("gather", "expand"),
                        lambda c: c.name.startswith(("test_gather_", "test_expand_")))


def _with_constant_input(model, name, value):
    """``model`` with its input ``name`` an initializer of ``value``."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [i for i in m.graph.input if i.name != name]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return m


@pytest.mark.parametrize("name", sorted(NODE_CASES))
def test_onnx_node_case(name, device):
    """ONNX's node cases as shipped (Gather's indices are a model input: on the host,
    Expand's shape a host-known parameter: on the device), then with that input an
    initializer: on the device, no fallback."""
    assert len(NODE_CASES) >= 6
    case = NODE_CASES[name]
    node = case.model.graph.node[0]
    for inputs, expected in case.data_sets:
        rep = vonnx.prepare(case.model, device=device)
        Runner.assert_similar_outputs(expected, rep.run(inputs), rtol=case.rtol,
                                      atol=case.atol)
        assert (("device" if node.op_type == "Expand" else "host"),
                [(node.name or f"{node.op_type}_0", node.op_type)]) in rep.partitions
        model = _with_constant_input(case.model, node.input[1], inputs[1])
        rep = vonnx.prepare(model, device=device, strict=True)
        Runner.assert_similar_outputs(expected, rep.run(inputs[:1]), rtol=case.rtol,
                                      atol=case.atol)
        assert not rep.fallbacks

"""vkml.onnx: Transpose on the device as DML_ELEMENT_WISE_IDENTITY with permuted input
strides, Slice as DML_SLICE1, Concat as DML_JOIN and Split as DML_SPLIT, against ONNX
Runtime on the CPU: random ranks, permutations, slices (negative, out-of-range and
reversing), concatenations, splits and data types, from a model input and from another
device node (an intermediate edge)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402

import vkml.onnx as vonnx  # noqa: E402
from onnx_helpers import ort_expected as _expected, value_info as _vi  # noqa: E402

DTYPES = [np.float32, np.float16, np.int8, np.uint16, np.int32, np.int64, np.float64]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_transpose(dtype, device):
    rng = np.random.default_rng(np.dtype(dtype).num)
    for trial in range(4):
        rank = int(rng.integers(1, 7))
        shape = [int(rng.integers(1, 6)) for _ in range(rank)]
        perm = [int(p) for p in rng.permutation(rank)]
        attrs = {} if trial == 0 else {"perm": perm}
        if trial == 0:                              # no perm: the dimensions reversed
            perm = list(range(rank))[::-1]
        out = [shape[p] for p in perm]
        # after an Add of the input with itself (float64: not on the device, a host
        # partition before it), so that the Transpose reads an intermediate edge
        pre = "Add" if np.dtype(dtype) != np.float64 else "Identity"
        ins = ["x", "x"] if pre == "Add" else ["x"]
        nodes = [helper.make_node(pre, ins, ["a"], name="pre"),
                 helper.make_node("Transpose", ["a"], ["y"], name="t", **attrs)]
        g = helper.make_graph(nodes, "g", [_vi("x", shape, dtype)], [_vi("y", out, dtype)])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
        rep = vonnx.prepare(model, device=device, strict=True)
        x = (rng.standard_normal(shape) * 20).astype(dtype)
        (got,) = rep.run({"x": x})
        (want,) = _expected(model, {"x": x})
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want, err_msg=str((shape, perm)))
        assert not rep.fallbacks


def _random_slice(rng, shape):
    """starts, ends, axes, steps over a random subset of axes (negative and
    out-of-range values, negative steps), each selecting at least one element."""
    rank = len(shape)
    axes = [int(a) for a in rng.permutation(rank)[:int(rng.integers(1, rank + 1))]]
    starts, ends, steps = [], [], []
    for ax in axes:
        n = shape[ax]
        while True:
            st = int(rng.integers(-n - 2, n + 2))
            en = int(rng.choice([int(rng.integers(-n - 2, n + 2)), 2**62, -2**62]))
            sp = int(rng.choice([1, 2, 3, -1, -2]))
            if len(range(*slice(st, en, sp).indices(n))):
                break
        starts.append(st), ends.append(en), steps.append(sp)
    axes = [a - rank if rng.random() < 0.3 else a for a in axes]
    return starts, ends, axes, steps


@pytest.mark.parametrize("dtype", DTYPES[:6], ids=lambda d: np.dtype(d).name)
def test_slice(dtype, device):
    rng = np.random.default_rng(100 + np.dtype(dtype).num)
    for _ in range(5):
        rank = int(rng.integers(1, 6))
        shape = [int(rng.integers(1, 7)) for _ in range(rank)]
        starts, ends, axes, steps = _random_slice(rng, shape)
        x = (rng.standard_normal(shape) * 20).astype(dtype)
        inits = [numpy_helper.from_array(np.array(v, np.int64), n) for v, n in
                 ((starts, "st"), (ends, "en"), (axes, "ax"), (steps, "sp"))]
        nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="pre"),
                 helper.make_node("Slice", ["a", "st", "en", "ax", "sp"], ["y"], name="s")]
        g = helper.make_graph(nodes, "g", [_vi("x", shape, dtype)],
                              [_vi("y", [f"d{i}" for i in range(rank)], dtype)], inits)
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
        rep = vonnx.prepare(model, device=device, strict=True)
        (got,) = rep.run({"x": x})
        (want,) = _expected(model, {"x": x})
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want, err_msg=str((shape, starts, ends, axes,
                                                               steps)))
        assert not rep.fallbacks


@pytest.mark.parametrize("dtype", DTYPES[:6], ids=lambda d: np.dtype(d).name)
def test_concat_and_split(dtype, device):
    """Concat of a model input, a device intermediate and a constant (bound once) along a
    random axis (negative too), then Split of it into random parts (the split as an
    input) and into num_outputs parts; every part a graph output."""
    rng = np.random.default_rng(200 + np.dtype(dtype).num)
    for _ in range(4):
        rank = int(rng.integers(1, 6))
        shape = [int(rng.integers(1, 5)) for _ in range(rank)]
        axis = int(rng.integers(-rank, rank))
        c_shape = list(shape)
        c_shape[axis] = int(rng.integers(1, 4))
        c = (rng.standard_normal(c_shape) * 20).astype(dtype)
        total = 2 * shape[axis] + c_shape[axis]
        cuts = np.sort(rng.choice(np.arange(1, total), size=min(2, total - 1), replace=False))
        parts = np.diff(np.concatenate([[0], cuts, [total]])).astype(np.int64)
        nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="pre"),
                 helper.make_node("Concat", ["x", "a", "c"], ["cat"], name="cat", axis=axis),
                 helper.make_node("Split", ["cat", "parts"], [f"p{i}" for i in
                                                               range(len(parts))],
                                  name="split", axis=axis),
                 helper.make_node("Split", ["cat"], ["q0", "q1"], name="split2", axis=axis,
                                  num_outputs=2)]
        outs = [_vi(n, [f"{n}_{i}" for i in range(rank)], dtype)
                for n in [f"p{i}" for i in range(len(parts))] + ["q0", "q1", "cat"]]
        g = helper.make_graph(nodes, "g", [_vi("x", shape, dtype)], outs,
                              [numpy_helper.from_array(c, "c"),
                               numpy_helper.from_array(parts, "parts")])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
        rep = vonnx.prepare(model, device=device, strict=True)
        x = (rng.standard_normal(shape) * 20).astype(dtype)
        got = rep.run({"x": x})
        for gv, wv in zip(got, _expected(model, {"x": x})):
            assert gv.shape == wv.shape and gv.dtype == wv.dtype
            np.testing.assert_array_equal(gv, wv, err_msg=str((shape, axis, parts)))
        assert not rep.fallbacks

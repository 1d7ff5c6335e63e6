"""vkml.onnx: MaxPool (ceil_mode, dilations, pads, the Indices output), AveragePool
(count_include_pad, ceil_mode), GlobalMaxPool and GlobalAveragePool on the device as
DML_MAX_POOLING2 / DML_AVERAGE_POOLING1, against ONNX Runtime on the CPU with random
geometry; what stays on the host (HOST_POOLING)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402
from onnx_helpers import ort_expected as _expected, value_info as _vi  # noqa: E402


def _model(node, x_shape, dtype, outs):
    g = helper.make_graph([node], "g", [_vi("x", x_shape, dtype)],
                          [_vi(o, [f"{o}{i}" for i in range(len(x_shape))], t)
                           for o, t in outs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    onnx.checker.check_model(m)
    return m


def _geometry(rng, n):
    """Random kernel, strides, dilations, pads (each below the kernel's extent) and input
    sizes large enough for the dilated window."""
    k = [int(rng.integers(1, 4)) for _ in range(n)]
    s = [int(rng.integers(1, 4)) for _ in range(n)]
    d = [int(rng.integers(1, 3)) for _ in range(n)]
    pads = [int(rng.integers(0, kk)) for kk in k] + [int(rng.integers(0, kk)) for kk in k]
    sizes = [int((kk - 1) * dd + 1 + rng.integers(0, 6)) for kk, dd in zip(k, d)]
    return k, s, d, pads, sizes


def _check(rep, model, x, tol):
    got = rep.run({"x": x})
    want = _expected(model, {"x": x})
    assert not rep.fallbacks, rep.fallbacks
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol,
                                   atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.uint8],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_maxpool(n, dtype, device):
    """Random geometry with ceil_mode on and off; float32 also with the Indices output."""
    rng = np.random.default_rng(10 * n + np.dtype(dtype).num)
    for trial in range(4):
        k, s, d, pads, sizes = _geometry(rng, n)
        outs = [("y", dtype)]
        if dtype == np.float32 and trial % 2:
            outs.append(("i", np.int64))
        node = helper.make_node("MaxPool", ["x"], [o for o, _ in outs], kernel_shape=k,
                                strides=s, dilations=d, pads=pads, ceil_mode=trial // 2)
        shape = [2, 3] + sizes
        model = _model(node, shape, dtype, outs)
        rep = vonnx.prepare(model, device=device, strict=True)
        x = (rng.permutation(np.prod(shape)).reshape(shape) % 97).astype(dtype)  # few ties
        if np.dtype(dtype).kind == "f":
            x = rng.standard_normal(shape).astype(dtype)
        _check(rep, model, x, 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_averagepool(n, dtype, device):
    """count_include_pad on and off, ceil_mode (without count_include_pad: DML does not
    count the added end padding), dilations."""
    rng = np.random.default_rng(20 * n + np.dtype(dtype).num)
    for trial in range(4):
        k, s, d, pads, sizes = _geometry(rng, n)
        include, ceil = trial % 2, (trial // 2) * (1 - trial % 2)
        node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=k, strides=s,
                                dilations=d, pads=pads, count_include_pad=include,
                                ceil_mode=ceil)
        shape = [2, 3] + sizes
        model = _model(node, shape, dtype, [("y", dtype)])
        rep = vonnx.prepare(model, device=device, strict=True)
        x = rng.standard_normal(shape).astype(dtype)
        _check(rep, model, x, 1e-5 if dtype == np.float32 else 3e-3)


@pytest.mark.parametrize("op", ["GlobalMaxPool", "GlobalAveragePool"])
@pytest.mark.parametrize("shape", [(2, 3, 7), (1, 4, 5, 6), (2, 2, 3, 4, 5)])
def test_global_pooling(op, shape, device):
    rng = np.random.default_rng(len(shape))
    node = helper.make_node(op, ["x"], ["y"])
    model = _model(node, list(shape), np.float32, [("y", np.float32)])
    rep = vonnx.prepare(model, device=device, strict=True)
    _check(rep, model, rng.standard_normal(shape).astype(np.float32), 1e-5)


def test_host_pooling_cases(device):
    """Column-major Indices are refused at prepare (strict); AveragePool ceil_mode with
    count_include_pad and an overhanging window falls back at run."""
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], name="mp_cols", kernel_shape=[2, 2],
                            storage_order=1)
    model = _model(node, [1, 1, 4, 4], np.float32, [("y", np.float32), ("i", np.int64)])
    with pytest.raises(vkml.UnsupportedError, match="mp_cols.*storage_order"):
        vonnx.prepare(model, device=device, strict=True)
    node = helper.make_node("AveragePool", ["x"], ["y"], name="ap", kernel_shape=[2],
                            strides=[2], ceil_mode=1, count_include_pad=1)
    model = _model(node, [1, 1, 5], np.float32, [("y", np.float32)])
    rep = vonnx.prepare(model, device=device)
    x = np.arange(5, dtype=np.float32).reshape(1, 1, 5)
    np.testing.assert_allclose(rep.run({"x": x})[0], _expected(model, {"x": x})[0])
    assert rep.fallbacks and "count_include_pad" in rep.fallbacks[0][1]

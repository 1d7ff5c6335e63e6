"""vkml.onnx: Add, Sub, Mul, Div, Max, Min and Sum on the device, against ONNX Runtime on
the CPU (ONNX's reference evaluator where ONNX Runtime has no kernel for the type):
randomized shapes with ONNX's multidirectional broadcasting (run as DML zero strides),
every data type the DML element-wise operators take, constants (initializers) as inputs,
and what stays on the host (float64: HOST_ELEMENT_WISE)."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402
from onnx_helpers import make_model as _model, ort_session, value_info as _vi  # noqa: E402

OPS = ["Add", "Sub", "Mul", "Div", "Max", "Min"]
DTYPES = [np.float32, np.float16, np.int8, np.uint8, np.int16, np.uint16, np.int32,
          np.uint32, np.int64, np.uint64]


def _expected(model, feeds):
    """ONNX Runtime (CPU); ONNX's reference evaluator where it has no kernel (Max of
    int8, Sub of uint16, ...)."""
    pytest.importorskip("onnxruntime")
    try:
        sess = ort_session(model)
    except Exception:                               # NOT_IMPLEMENTED for the type
        return ReferenceEvaluator(model).run(None, feeds)
    return sess.run(None, feeds)


def _broadcast_pair(rng):
    """Two shapes that broadcast together: 1 to 5 dimensions, each input dropping
    leading dimensions or holding 1s at random."""
    rank = int(rng.integers(1, 6))
    out = [int(rng.integers(1, 6)) for _ in range(rank)]
    shapes = []
    for _ in range(2):
        s = [1 if rng.random() < 0.35 else d for d in out]
        shapes.append(s[int(rng.integers(0, rank)):] if rng.random() < 0.4 else s)
    return shapes


def _values(rng, shape, dtype, nonzero=False):
    dt = np.dtype(dtype)
    if dt.kind == "f":
        v = rng.uniform(-4, 4, shape)
        if nonzero:
            v = np.where(np.abs(v) < 0.25, 0.5, v)
        return v.astype(dt)
    lo, hi = (-100, 100) if dt.kind == "i" else (0, 200)
    if dt.itemsize == 1:
        lo, hi = (-11, 11) if dt.kind == "i" else (0, 15)   # products stay in range
    v = rng.integers(lo, hi, shape)
    if nonzero:
        v = np.where(v == 0, 3, v)          # integer x / 0 is undefined in ONNX Runtime
    return v.astype(dt)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", OPS)
def test_binary_broadcasting(op, dtype, device):
    """Random broadcast shapes; unsigned Sub wraps (as ONNX Runtime), integer Div
    truncates toward zero."""
    rng = np.random.default_rng(zlib.crc32(f"{op}{np.dtype(dtype).name}".encode()))
    for _ in range(3):
        sa, sb = _broadcast_pair(rng)
        out = list(np.broadcast_shapes(tuple(sa), tuple(sb)))
        model = _model([helper.make_node(op, ["a", "b"], ["y"], name="n")],
                       [_vi("a", sa, dtype), _vi("b", sb, dtype)], [_vi("y", out, dtype)])
        a = _values(rng, sa, dtype)
        b = _values(rng, sb, dtype, nonzero=op == "Div")
        rep = vonnx.prepare(model, device=device, strict=True)
        assert rep.partitions == [("device", [("n", op)])]
        (got,) = rep.run({"a": a, "b": b})
        (want,) = _expected(model, {"a": a, "b": b})
        assert got.dtype == want.dtype and got.shape == want.shape, (sa, sb)
        if np.dtype(dtype) == np.float16:
            np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                                       rtol=2e-3, atol=2e-3, err_msg=str((sa, sb)))
        elif np.dtype(dtype).kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=str((sa, sb)))
        else:
            np.testing.assert_array_equal(got, want, err_msg=str((sa, sb)))


def test_constant_operands_and_a_chain(device):
    """A bias (initializer, bound once as a constant) broadcast along channels after a
    Conv, a scalar constant, and Sum/Max/Min of three inputs, all one device graph."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    bias = rng.standard_normal((4, 1, 1)).astype(np.float32)
    half = np.array(0.5, np.float32)
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             helper.make_node("Add", ["c", "bias"], ["cb"], name="add"),
             helper.make_node("Mul", ["cb", "half"], ["m"], name="mul"),
             helper.make_node("Sum", ["m", "cb", "c"], ["s"], name="sum"),
             helper.make_node("Max", ["s", "m", "cb"], ["mx"], name="max"),
             helper.make_node("Min", ["mx"], ["y"], name="min")]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias, "bias"),
             numpy_helper.from_array(half, "half")]
    model = _model(nodes, [_vi("x", [2, 2, 6, 7], np.float32)],
                   [_vi("y", [2, 4, 4, 5], np.float32)], inits)
    rep = vonnx.prepare(model, device=device, strict=True)
    assert [w for w, _ in rep.partitions] == ["device"]
    x = rng.standard_normal((2, 2, 6, 7)).astype(np.float32)
    (got,) = rep.run({"x": x})
    np.testing.assert_allclose(got, _expected(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_float64_stays_on_the_host(device):
    """The DML element-wise operators take no FLOAT64: placed on the host, and
    strict=True refuses it naming the node."""
    model = _model([helper.make_node("Add", ["a", "b"], ["y"], name="add64")],
                   [_vi("a", [3], np.float64), _vi("b", [3], np.float64)],
                   [_vi("y", [3], np.float64)])
    rep = vonnx.prepare(model, device=device)
    assert rep.partitions == [("host", [("add64", "Add")])]
    a, b = np.arange(3.0), np.ones(3)
    np.testing.assert_array_equal(rep.run({"a": a, "b": b})[0], a + b)
    with pytest.raises(vkml.UnsupportedError, match="add64.*float64"):
        vonnx.prepare(model, device=device, strict=True)

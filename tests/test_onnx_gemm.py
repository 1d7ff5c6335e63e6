"""vkml.onnx: Gemm and MatMul on the device as DML_GEMM, against ONNX Runtime on the CPU.

Gemm: random M, K, N, transA/transB, alpha/beta and every shape of C ONNX's
unidirectional rule broadcasts to (M, N) (absent, scalar, [1], [N], [1, N], [M, 1],
[M, N], [1, 1]), C and B as graph inputs or initializers (constants bound once).
MatMul: NumPy's rules (1-D operands, broadcast batch dimensions, ranks above 4 folded
into M or merged batch dimensions).  ONNX's own node cases for both ops.  What stays on
the host (HOST_GEMM) is placed there and refused by ``strict=True``.  float32 and float16.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402
from onnx_helpers import make_model, node_cases, ort_expected, value_info  # noqa: E402

DTYPES = [np.float32, np.float16]
_ids = {"ids": lambda d: np.dtype(d).name}


def _on_device(rep, op):
    """Every node of ``op`` ran on the device: no host fallback, and a device partition
    lists it."""
    assert not rep.fallbacks, rep.fallbacks
    ops = [o for where, nodes in rep.partitions if where == "device" for _, o in nodes]
    assert op in ops, rep.partitions


def _tol(dtype, k):
    """float32: summation order; float16: ONNX Runtime and vkml both accumulate in
    float32 but round A and B products differently, so a few float16 ulps of the sum."""
    return (1e-5, 1e-5) if dtype == np.float32 else (4e-3, 4e-3 * max(1, k) ** 0.5)


def _check(rep, model, feeds, dtype, k):
    (got,) = rep.run(feeds)
    (want,) = ort_expected(model, feeds)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    rtol, atol = _tol(dtype, k)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                               atol=atol)


_C_SHAPES = [None, (), (1,), "N", "1N", "M1", "MN", (1, 1)]


@pytest.mark.parametrize("dtype", DTYPES, **_ids)
def test_gemm(dtype, device):
    rng = np.random.default_rng(np.dtype(dtype).num)
    for trial, c_kind in enumerate(_C_SHAPES):
        m, k, n = (int(v) for v in rng.integers(1, 10, 3))
        ta, tb = int(rng.integers(0, 2)), int(rng.integers(0, 2))
        attrs = {"transA": ta, "transB": tb}
        if trial % 3:
            attrs.update(alpha=float(rng.uniform(-2, 2)), beta=float(rng.uniform(-2, 2)))
        a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
        b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
        c_shape = {"N": (n,), "1N": (1, n), "M1": (m, 1), "MN": (m, n)}.get(c_kind, c_kind)
        feeds, inits, ins = {"a": a}, [], [value_info("a", a.shape, dtype)]
        const = trial % 2 == 1                     # B and C as initializers (constants)
        values = {"b": b}
        if c_shape is not None:
            values["c"] = rng.standard_normal(c_shape).astype(dtype)
        for name, v in values.items():
            if const:
                inits.append(numpy_helper.from_array(v, name))
            else:
                feeds[name] = v
                ins.append(value_info(name, v.shape, dtype))
        node = helper.make_node("Gemm", ["a", "b"] + (["c"] if c_shape is not None else []),
                                ["y"], name="gemm", **attrs)
        model = make_model([node], ins, [value_info("y", (m, n), dtype)], inits, opset=13)
        rep = vonnx.prepare(model, device=device, strict=True)
        _check(rep, model, feeds, dtype, k)
        _on_device(rep, "Gemm")


#: MatMul operand shapes: 1-D promotions, batch broadcast both ways, a B without batch
#: under a 5-D A (folded into M), 5-D against 5-D (batch dimensions merged to one), batch
#: dimensions one operand could merge and the other broadcasts (kept apart).
_MATMUL_SHAPES = [((5,), (5,)), ((4,), (2, 4, 3)), ((1, 2, 4, 3), (3,)), ((3, 4), (4, 2)),
                  ((2, 3, 4), (4, 5)), ((3, 1, 3, 4), (1, 2, 4, 2)), ((2, 3, 4), (2, 4, 1)),
                  ((2, 1, 2, 3, 5, 4), (4, 3)), ((2, 3, 2, 2, 3), (2, 3, 2, 3, 4)),
                  ((1, 5), (3, 5, 2)), ((2, 3, 2, 3), (2, 1, 3, 4)),
                  ((2, 1, 2, 3), (2, 3, 3, 4))]


@pytest.mark.parametrize("dtype", DTYPES, **_ids)
def test_matmul(dtype, device):
    rng = np.random.default_rng(10 + np.dtype(dtype).num)
    for a_s, b_s in _MATMUL_SHAPES:
        a = rng.standard_normal(a_s).astype(dtype)
        b = rng.standard_normal(b_s).astype(dtype)
        y_s = np.matmul(a, b).shape
        node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
        model = make_model([node], [value_info("a", a_s, dtype), value_info("b", b_s, dtype)],
                           [value_info("y", y_s, dtype)], opset=13)
        rep = vonnx.prepare(model, device=device, strict=True)
        _check(rep, model, {"a": a, "b": b}, dtype, a_s[-1])
        _on_device(rep, "MatMul")


def _random_operand_shapes(rng):
    """Random MatMul operands: ranks 1 to 6, batch dimensions of 1 to 3 each, some 1
    (broadcast) in one operand."""
    ra, rb = (int(r) for r in rng.integers(1, 7, 2))
    batch = [int(s) for s in rng.integers(1, 4, max(ra, rb) - 2)] if max(ra, rb) > 2 else []
    m, k, n = (int(v) for v in rng.integers(1, 6, 3))

    def lead(r):
        return [1 if rng.random() < 0.3 else s for s in batch[len(batch) - (r - 2):]] \
            if r > 2 else []
    return ([k] if ra == 1 else lead(ra) + [m, k]), ([k] if rb == 1 else lead(rb) + [k, n])


def test_matmul_random(device):
    """Random ranks and broadcasts: right everywhere; on the device wherever the output
    has at most two batch dimensions above 1 (GEMM's BatchCount and ChannelCount)."""
    rng = np.random.default_rng(21)
    for _ in range(8):
        a_s, b_s = _random_operand_shapes(rng)
        a = rng.standard_normal(a_s).astype(np.float32)
        b = rng.standard_normal(b_s).astype(np.float32)
        y_s = np.matmul(a, b).shape
        node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
        model = make_model([node], [value_info("a", a_s), value_info("b", b_s)],
                           [value_info("y", [f"d{i}" for i in range(len(y_s))])], opset=13)
        rep = vonnx.prepare(model, device=device)
        _check(rep, model, {"a": a, "b": b}, np.float32, a_s[-1])
        batch = y_s[:len(y_s) - (len(a_s) > 1) - (len(b_s) > 1)]
        if sum(s > 1 for s in batch) <= 2:
            _on_device(rep, "MatMul")


def test_matmul_add_relu_graph(device):
    """MatMul with a constant B, then Add and Relu: one device partition."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bias")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "bias"], ["z"]),
             helper.make_node("Relu", ["z"], ["y"])]
    model = make_model(nodes, [value_info("x", (2, 3, 6))], [value_info("y", (2, 3, 4))],
                       [w, bias])
    rep = vonnx.prepare(model, device=device, strict=True)
    x = rng.standard_normal((2, 3, 6)).astype(np.float32)
    _check(rep, model, {"x": x}, np.float32, 6)
    assert [w for w, _ in rep.partitions] == ["device"], rep.partitions


def test_host_gemm_cases(device):
    """HOST_GEMM: batch dimensions that do not merge into two, an empty K; a data type
    DML_GEMM lacks is refused at placement."""
    cases = [("batch", (2, 1, 3, 2, 4), (1, 4, 1, 4, 3)), ("empty", (2, 0), (0, 3))]
    for key, a_s, b_s in cases:
        node = helper.make_node("MatMul", ["a", "b"], ["y"], name=f"mm_{key}")
        y_s = np.matmul(np.zeros(a_s), np.zeros(b_s)).shape
        model = make_model([node], [value_info("a", a_s), value_info("b", b_s)],
                           [value_info("y", y_s)], opset=13)
        rng = np.random.default_rng(0)
        feeds = {"a": rng.standard_normal(a_s).astype(np.float32),
                 "b": rng.standard_normal(b_s).astype(np.float32)}
        rep = vonnx.prepare(model, device=device)
        (got,) = rep.run(feeds)
        np.testing.assert_allclose(got, ort_expected(model, feeds)[0], rtol=1e-5, atol=1e-5)
        assert rep.fallbacks and vonnx.HOST_GEMM[key] in rep.fallbacks[0][1]
        strict = vonnx.prepare(model, device=device, strict=True)
        with pytest.raises(vkml.UnsupportedError,
                           match=f"mm_{key}.*" + re.escape(vonnx.HOST_GEMM[key][:40])):
            strict.run(feeds)
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm_int")
    model = make_model([node], [value_info("a", (2, 3), np.int32),
                                value_info("b", (3, 2), np.int32)],
                       [value_info("y", (2, 2), np.int32)], opset=13)
    assert vonnx.prepare(model, device=device).partitions[0][0] == "host"
    with pytest.raises(vkml.UnsupportedError, match="mm_int.*data type int32"):
        vonnx.prepare(model, device=device, strict=True)


NODE_CASES = node_cases(("gemm", "matmul"),
                        lambda c: c.model.graph.node[0].op_type in ("Gemm", "MatMul"))


def test_node_cases_exist():
    assert len(NODE_CASES) >= 18


@pytest.mark.parametrize("name", sorted(NODE_CASES))
def test_onnx_node_case(name, device):
    """ONNX's own cases, compared as onnx.backend.test compares them, all on the device."""
    case = NODE_CASES[name]
    rep = vonnx.prepare(case.model, device=device, strict=True)
    for inputs, expected in case.data_sets:
        Runner.assert_similar_outputs(expected, rep.run(inputs), rtol=case.rtol,
                                      atol=case.atol)
    _on_device(rep, case.model.graph.node[0].op_type)


@pytest.mark.parametrize("op, a_s, b_s, field", [
    ("Gemm", (2, 3), (4, 5), "Gemm 'gemm': B"), ("MatMul", (2, 3), (4, 5), "MatMul 'mm'"),
    ("MatMul", (2, 2, 3), (3, 3, 4), "MatMul 'mm'")])
def test_mismatched_operands_raise_validation_error(op, a_s, b_s, field, device):
    """Operands that do not multiply: ValidationError naming the node and the input, and
    the device still usable."""
    name = "gemm" if op == "Gemm" else "mm"
    node = helper.make_node(op, ["a", "b"], ["y"], name=name)
    model = make_model([node], [value_info("a", a_s), value_info("b", b_s)],
                       [value_info("y", ["m", "n", "k"][:len(a_s)])], opset=13)
    rep = vonnx.prepare(model, device=device)
    feeds = {"a": np.ones(a_s, np.float32), "b": np.ones(b_s, np.float32)}
    with pytest.raises(vkml.ValidationError) as err:
        rep.run(feeds)
    assert field in err.value.field, err.value
    test_matmul_add_relu_graph(device)

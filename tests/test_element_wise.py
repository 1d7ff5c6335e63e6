"""Element-wise ADD, ADD1, SUBTRACT, MULTIPLY, DIVIDE, MAX, MIN (vkml/dml/element_wise.py,
vkml/ops/element_wise.py): every data type the pages list against an independent
reference (float64 NumPy for floats, Python integers wrapped to the type for integers),
NumPy broadcasting expressed as zero strides, non-packed layouts with canaries in the
output's gaps, the flat read paths, the row path, windows and split dispatches at lowered limits,
in-place execution, ADD1's fused activations, every rule of the pages, a fuzzer
(tests/fuzzing.py), threads, leaks and a graph node."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

import vkml
from vkml import dml
from vkml.errors import UnsupportedError, ValidationError
from vkml.intmath import round_up

from fuzzing import (TENSOR_BROKEN, bind_with_canary, break_tensor_rule, canaries_intact,
                     compiled_or_refused, fuzzer, lay_out, overlapping_strides, padded_output,
                     placement, run_checked)
from helpers import assert_no_leaks, run_two_node_graph, same_bits, strided_view
from test_activations import FORMULAS
from helpers import run_in_threads

OPS = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": None,
       "maximum": np.maximum, "minimum": np.minimum}
DESCS = {"add": dml.ElementWiseAddOperatorDesc, "subtract": dml.ElementWiseSubtractOperatorDesc,
         "multiply": dml.ElementWiseMultiplyOperatorDesc,
         "divide": dml.ElementWiseDivideOperatorDesc, "maximum": dml.ElementWiseMaxOperatorDesc,
         "minimum": dml.ElementWiseMinOperatorDesc}
TYPES = ["float32", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
         "uint64"]
CANARY = 0xA5


# -- the reference ---------------------------------------------------------------------------
def _trunc_div(x: int, y: int) -> int:
    if y == 0:
        return 0                      # vkml's definition (NumPy's integer result too)
    q = abs(x) // abs(y)
    return -q if (x < 0) != (y < 0) else q


def reference(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``op`` on NumPy-broadcast ``a`` and ``b``: floats in float64 rounded once to the
    type; integers as Python integers (exact), wrapped modulo 2^bits, division truncated
    toward zero with x / 0 = 0."""
    dt = a.dtype
    if dt.kind == "f":
        x, y = a.astype(np.float64), b.astype(np.float64)
        with np.errstate(all="ignore"):
            r = x / y if op == "divide" else OPS[op](x, y)
        return r.astype(dt)
    x, y = np.broadcast_arrays(a.astype(object), b.astype(object))
    fn = {"add": lambda p, q: p + q, "subtract": lambda p, q: p - q,
          "multiply": lambda p, q: p * q, "divide": _trunc_div, "maximum": max,
          "minimum": min}[op]
    bits = 8 * dt.itemsize
    out = []
    for p, q in zip(x.reshape(-1), y.reshape(-1)):
        r = fn(int(p), int(q)) % (1 << bits)
        if dt.kind == "i" and r >= 1 << (bits - 1):
            r -= 1 << bits
        out.append(r)
    return np.array(out, dtype=dt).reshape(x.shape)


def check(got, want, op):
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == np.float16:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=1e-3, atol=1e-4)
    elif want.dtype.kind == "f" and op == "divide":
        np.testing.assert_allclose(got, want, rtol=3e-7, atol=0)
    else:
        np.testing.assert_array_equal(got, want)


def random_values(rng, shape, dtype, op="add", divisor=False):
    dt = np.dtype(dtype)
    if dt.kind == "f":
        x = rng.standard_normal(shape) * 4
        if divisor:
            x = np.where(np.abs(x) < 0.25, 0.5, x)
        return x.astype(dt)
    info = np.iinfo(dt)
    x = rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    if divisor and rng.random() < 0.7:          # small divisors too, so quotients vary
        x = (x % 7).astype(dt)
    return x


def random_shapes(rng):
    """Two NumPy-broadcastable shapes (fewer dimensions, sizes of 1) and their result."""
    rank = int(rng.integers(1, 6)) if rng.random() < 0.9 else 8
    out = [int(rng.integers(1, 7 if rank <= 5 else 3)) for _ in range(rank)]
    shapes = []
    for _ in range(2):
        s = [1 if rng.random() < 0.3 else n for n in out]
        shapes.append(tuple(s[int(rng.integers(0, rank)) if rng.random() < 0.3 else 0:]) or (1,))
    return shapes


# -- randomized comparison -------------------------------------------------------------------
@pytest.mark.parametrize("op", list(OPS))
def test_random_broadcast(device, budget, op):
    """Random shapes with NumPy broadcasting (packed, flat, and zero-stride cases), every
    data type of the page, against the reference."""
    rng = np.random.default_rng(list(OPS).index(op))
    fn = getattr(vkml, op)
    for case in range(max(2, budget // 4)):     # (each case compiles its own pipelines)
        dtype = TYPES[case % len(TYPES)]
        sa, sb = random_shapes(rng) if case % 3 else [(int(rng.integers(1, 300)),)] * 2
        a = random_values(rng, sa, dtype)
        b = random_values(rng, sb, dtype, divisor=op == "divide")
        check(fn(a, b, device=device), reference(op, a, b), op)


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
def test_signed_division(device, dtype):
    """Truncation toward zero (C, not NumPy's floor), x / 0 = 0, INT_MIN / -1 wraps."""
    info = np.iinfo(dtype)
    a = np.array([7, -7, 7, -7, 0, 5, -5, info.min, info.min, info.max, info.min, 1, -1,
                  info.max, info.min + 1, 6], dtype)
    b = np.array([2, 2, -2, -2, 3, 0, 0, -1, 1, -1, 2, info.min, info.max, info.max, -1, 3],
                 dtype)
    got = vkml.divide(a, b, device=device)
    want = reference("divide", a, b)
    np.testing.assert_array_equal(got, want)
    assert got[1] == -3 and got[5] == 0 and got[7] == info.min


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64"])
def test_unsigned_division(device, dtype):
    info = np.iinfo(dtype)
    a = np.array([7, 0, 5, info.max, info.max, info.max, 1, 100], dtype)
    b = np.array([2, 3, 0, 1, info.max, 2, info.max, 7], dtype)
    np.testing.assert_array_equal(vkml.divide(a, b, device=device), reference("divide", a, b))


@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_64_bit_words(device, dtype):
    """The word-pair arithmetic: carries and borrows across the words, products past
    2^32, comparisons decided by the high word (sign) or the low one, wide quotients."""
    rng = np.random.default_rng(64)
    info = np.iinfo(dtype)
    edge = np.array([0, 1, 0xFFFFFFFF, 1 << 32, (1 << 32) + 1, info.max, info.min,
                     info.max - 1, 0x7FFFFFFF, 0x80000000], dtype=object)
    if dtype == "int64":
        edge = np.concatenate([edge, -edge[1:6]])
    edge = edge.astype(dtype)
    a, b = np.meshgrid(edge, edge)
    a = np.concatenate([a.reshape(-1), random_values(rng, 200, dtype)])
    b = np.concatenate([b.reshape(-1), random_values(rng, 200, dtype, divisor=True)])
    # uint64 differs from int64 only in division and comparison (and each op compiles)
    for op in OPS if dtype == "int64" else ("add", "divide", "maximum"):
        np.testing.assert_array_equal(getattr(vkml, op)(a, b, device=device),
                                      reference(op, a, b), err_msg=op)


@pytest.mark.parametrize("dtype", ["int8", "uint16"])
def test_small_int_words(device, dtype):
    """Packed 8/16-bit ADD and SUBTRACT work on whole words at once: carries and borrows
    must stop at each element (every pair of edge values, odd sizes for the tail)."""
    info = np.iinfo(dtype)
    edge = np.array([0, 1, 2, info.max, info.max - 1, info.min, info.min + 1,
                     (info.max + info.min) // 2, 0x7F, 0x80 % (info.max + 1)], dtype=object)
    edge = edge.astype(dtype)
    a, b = (g.reshape(-1) for g in np.meshgrid(edge, edge))
    rng = np.random.default_rng(8)
    a = np.concatenate([a, random_values(rng, 301, dtype)])
    b = np.concatenate([b, random_values(rng, 301, dtype)])
    for op in ("add", "subtract"):
        np.testing.assert_array_equal(getattr(vkml, op)(a, b, device=device),
                                      reference(op, a, b), err_msg=op)


def _run_dml(device, desc, a_flat, b_flat, out_elems):
    """create -> compile -> execute with the output pre-filled by canary bytes; returns
    the output buffer's elements."""
    op = device.compile_operator(device.create_operator(desc))
    try:
        dt = desc.output_tensor.dtype
        out = device.empty(out_elems, dt)
        out.write(np.full(out_elems * np.dtype(dt).itemsize, CANARY, np.uint8).view(dt))
        op.execute([device.tensor(a_flat), device.tensor(b_flat)], [out])
        return out.numpy()
    finally:
        op.release()


def _out_index(shape, strides):
    return sum(np.arange(s).reshape([-1 if i == d else 1 for i in range(len(shape))]) * st
               for d, (s, st) in enumerate(zip(shape, strides)))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "int64"])
@pytest.mark.parametrize("kind", ["padded", "broadcast", "permuted"])
def test_strided_layouts(device, dtype, kind):
    """DML-level strides: A and B in non-packed layouts (B another kind than A) into an
    output with gaps, which must keep their canaries."""
    rng = np.random.default_rng(TYPES.index(dtype) * 3 + len(kind))
    shape = (2, 3, 4, 5)
    a_flat, a_st, a_log = strided_view(rng, shape, dtype, kind)
    other = {"padded": "permuted", "broadcast": "padded", "permuted": "broadcast"}[kind]
    b_flat, b_st, b_log = strided_view(rng, shape, dtype, other)
    if np.dtype(dtype).kind == "f":          # finite values (strided_view draws raw bits)
        a_flat = random_values(rng, a_flat.shape, dtype)
        b_flat = random_values(rng, b_flat.shape, dtype)
        a_log = np.lib.stride_tricks.as_strided(a_flat, shape, [s * a_flat.itemsize for s in a_st])
        b_log = np.lib.stride_tricks.as_strided(b_flat, shape, [s * b_flat.itemsize for s in b_st])
    out_st = (3 * 4 * 12, 4 * 12, 12, 2)
    out_elems = shape[0] * out_st[0]
    for op in [("add", "multiply", "maximum")[len(kind) % 3]]:
        desc = DESCS[op](dml.TensorDesc(dtype, shape, a_st), dml.TensorDesc(dtype, shape, b_st),
                         dml.TensorDesc(dtype, shape, out_st))
        got = _run_dml(device, desc, a_flat, b_flat, out_elems)
        idx = _out_index(shape, out_st)
        check(got[idx], reference(op, np.array(a_log), np.array(b_log)), op)
        gaps = np.ones(out_elems, bool)
        gaps[idx.reshape(-1)] = False
        raw = got[gaps].view(np.uint8)
        assert (raw == CANARY).all(), "a write landed outside the output's elements"


def _compiled(device, desc, read=None, rows=True, store64=None):
    import importlib
    cls = importlib.import_module("vkml.ops.element_wise").CompiledElementWise
    return cls(device, desc, read=read, rows=rows, store64=store64)


@pytest.mark.parametrize("read, dtype", [("ssbo4", "float32"), ("texel4", "float32"),
                                         ("texel4", "int8"), ("ssbo4", "float16"),
                                         ("texel4", "uint64"), ("ssbo4", "int16")])
def test_flat_read_paths(device, read, dtype):
    """Packed tensors run flat (FLAT_V words an invocation, uvec4 reads and stores where a
    whole FLAT_V fit, word by word in the tail), each read path forced; sizes around the
    vector widths.  Elements ending inside a word take the strided path (the flat one
    would write the word's other bytes: test_in_place_leaves_the_last_word_padding)."""
    rng = np.random.default_rng(5)
    for n in (1, 3, 4, 31, 32, 33, 129, 1000, 4099):     # one pipeline for all
        a = random_values(rng, (n,), dtype)
        b = random_values(rng, (n,), dtype)
        t = dml.TensorDesc(dtype, (n,))
        op = _compiled(device, dml.ElementWiseSubtractOperatorDesc(t, t, t), read)
        try:
            whole = n * np.dtype(dtype).itemsize % 4 == 0
            assert op.flat == whole and (op.read == read or not whole)
            out = device.empty((n,), dtype)
            op.execute([device.tensor(a), device.tensor(b)], [out])
            check(out.numpy(), reference("subtract", a, b), "subtract")
        finally:
            op.release()


def _row_case(rng, dtype):
    """Shapes the row path takes: an operand broadcast along the inner dimensions (a
    per-channel bias), along the outer ones, or along both, either operand; rows of any
    length (uvec4 rows, word rows)."""
    rank = int(rng.integers(2, 6))
    out = [int(rng.integers(1, 5)) for _ in range(rank - 1)] + [int(rng.integers(1, 40))]
    per = max(1, 4 // np.dtype(dtype).itemsize)
    out[-1] = round_up(out[-1], per)      # whole words a row (else the strided path)
    cut = int(rng.integers(1, rank))
    kind = rng.choice(["inner", "outer", "mixed"])
    if kind == "inner":      # constant along the trailing dimensions
        small = [n if d < cut else 1 for d, n in enumerate(out)]
    elif kind == "outer":    # varies along the trailing ones only
        small = [1 if d < cut else n for d, n in enumerate(out)]
    else:
        small = [n if rng.random() < 0.5 else 1 for n in out]
    return (small, out) if rng.random() < 0.5 else (out, small)


@pytest.mark.parametrize("read", ["texel4", "ssbo4"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "uint16", "int32", "int64",
                                   "uint64"])
def test_row_path(device, budget, read, dtype):
    """Per-channel and other row broadcasts run by rows (each input contiguous or constant
    along the merged inner extent), each read path forced, uvec4 and word rows, every
    operation; against the reference and against the strided path (a slow device: half
    the cases, uvec4 and word rows as they come)."""
    rng = np.random.default_rng(21 + TYPES.index(dtype) if dtype in TYPES else 99)
    seen = set()
    cases = 12 if budget > 8 else 6
    for i in range(cases):
        sa, sb = _row_case(rng, dtype)
        out = np.broadcast_shapes(tuple(sa), tuple(sb))
        op = list(OPS)[i % len(OPS)]
        a = random_values(rng, sa, dtype)
        b = random_values(rng, sb, dtype, divisor=op == "divide")
        desc = DESCS[op](dml.broadcast_tensor_desc(dtype, sa, out),
                         dml.broadcast_tensor_desc(dtype, sb, out), dml.TensorDesc(dtype, out))
        results = []
        for rows in (True, False):
            c = _compiled(device, desc, read, rows=rows)
            try:
                assert (c.row is not None) == rows or c.flat, (sa, sb)
                if c.row is not None:
                    assert c.read == read
                    seen.add(c.row["vec4"])
                y = device.empty(out, dtype)
                c.execute([device.tensor(a), device.tensor(b)], [y])
                results.append(y.numpy())
            finally:
                c.release()
        check(results[0], reference(op, a, b), op)
        assert same_bits(results[0], results[1])
    assert seen == {True, False} or cases < 12


def test_row_path_split_dispatches(device):
    """The row path with maxComputeWorkGroupCount lowered: its grid split (along rows and
    along the inner extent, which keeps whole uvec4s), the same result."""
    rng = np.random.default_rng(13)
    shape = (3, 20, 136)
    a = random_values(rng, shape, "float32")
    b = random_values(rng, (20, 1), "float32")
    with vkml.Device(device.index, limits={"maxComputeWorkGroupCount": (2, 2, 2)}) as dev:
        t = dml.TensorDesc("float32", shape)
        c = _compiled(dev, dml.ElementWiseMultiplyOperatorDesc(
            t, dml.TensorDesc("float32", shape, (0, 1, 0)), t))
        try:
            assert c.row is not None and c.row["vec4"]
            y = dev.empty(shape, "float32")
            c.execute([dev.tensor(a), dev.tensor(b)], [y])
            check(y.numpy(), reference("multiply", a, b), "multiply")
        finally:
            c.release()


@pytest.mark.parametrize("read", ["texel4", "ssbo4"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "int64"])
def test_row_path_outer_dimensions(device, dtype, read):
    """Merged boxes of more than three dimensions (an operand broadcast along alternate
    dimensions): the row path runs the dimensions before its three as dispatches of their
    own, up to ROW_OUTER combinations, the strided path past them; both against the
    reference and the strided path, the operand on either side."""
    from vkml.ops.element_wise import ROW_OUTER

    rng = np.random.default_rng(17)
    for out, small, rows in [((2, 3, 4, 5, 8), (2, 1, 4, 1, 8), True),
                             ((3, 2, 2, 3, 4, 8), (3, 1, 2, 1, 4, 1), True),
                             ((ROW_OUTER + 1, 2, 3, 4), (ROW_OUTER + 1, 1, 3, 1), False)]:
        for sa, sb in ((out, small), (small, out)):
            a = random_values(rng, sa, dtype)
            b = random_values(rng, sb, dtype)
            desc = dml.ElementWiseSubtractOperatorDesc(
                dml.broadcast_tensor_desc(dtype, sa, out),
                dml.broadcast_tensor_desc(dtype, sb, out), dml.TensorDesc(dtype, out))
            results = []
            for allow in (True, False):
                c = _compiled(device, desc, read, rows=allow)
                try:
                    if allow:
                        assert (c.row is not None) == rows, (sa, sb)
                        assert not rows or c.read == read
                        assert not rows or c.row["outer"], c.row
                    y = device.empty(out, dtype)
                    c.execute([device.tensor(a), device.tensor(b)], [y])
                    results.append(y.numpy())
                finally:
                    c.release()
            check(results[0], reference("subtract", a, b), "subtract")
            assert same_bits(results[0], results[1])


@pytest.mark.parametrize("layout", ["flat", "broadcast"])
@pytest.mark.parametrize("dtype", ["float32", "uint8", "int64"])
def test_windows_and_split_dispatches(device, layout, dtype):
    """maxStorageBufferRange and maxComputeWorkGroupCount lowered: the tensors are bound in
    windows and the grids split, with the same result."""
    rng = np.random.default_rng(11)
    shape = (5, 6, 70)
    a = random_values(rng, shape, dtype)
    b = random_values(rng, (6, 1) if layout == "broadcast" else shape, dtype)
    align = device._ctx.binding_alignment()
    room = max(1024, a.nbytes // 3) + 4 * align           # about a third of the tensor
    limits = {"maxStorageBufferRange": room, "maxComputeWorkGroupCount": (2, 2, 2)}
    with vkml.Device(device.index, limits=limits) as dev:
        t = dml.TensorDesc(dtype, shape)
        tb = dml.TensorDesc(dtype, shape, (0, 1, 0)) if layout == "broadcast" else t
        c = _compiled(dev, dml.ElementWiseMaxOperatorDesc(t, tb, t))
        try:
            assert c.flat == (layout == "flat")
            assert c.windows is not None and len(c.windows) > 1
            out = dev.empty(shape, dtype)
            c.execute([dev.tensor(a), dev.tensor(b)], [out])
            check(out.numpy(), reference("maximum", a, b), "maximum")
        finally:
            c.release()


@pytest.mark.parametrize("layout", ["flat", "broadcast"])
def test_in_place(device, layout):
    """The output may alias A ("supports in-place execution")."""
    rng = np.random.default_rng(3)
    a = random_values(rng, (4, 33), "float32")
    b = random_values(rng, (4, 33) if layout == "flat" else (1, 33), "float32")
    ta = dml.TensorDesc("float32", (4, 33))
    tb = dml.TensorDesc("float32", (4, 33), None if layout == "flat" else (0, 1))
    op = device.compile_operator(device.create_operator(
        dml.ElementWiseSubtractOperatorDesc(ta, tb, ta)))
    try:
        xa, xb = device.tensor(a), device.tensor(b)
        op.execute([xa, xb], [xa])
        np.testing.assert_array_equal(xa.numpy(), a - b)
    finally:
        op.release()


@pytest.mark.parametrize("read", ["texel4", "ssbo4"])
def test_u64_stores(device, read):
    """The _u64 variants (pairs of uvec4s stored as one u64vec4, devices with int64
    shaders) forced against the uvec4 stores and the reference: flat float32 arithmetic
    and copies of several element sizes, per-channel rows (outer dimensions included),
    in place; rows too short or not on whole pairs keep uvec4 stores."""
    rng = np.random.default_rng(31)
    wide = bool(device.features.get("int64"))
    cases = [("add", "float32", (3, 5, 16), (3, 5, 16), True),        # flat, a tail
             ("identity", "float32", (2, 3, 24), None, True),
             ("identity", "uint8", (5, 67), None, True),              # a sub-word tail
             ("identity", "int64", (3, 11), None, True),
             ("multiply", "float32", (2, 64, 4, 6), (1, 64, 1, 1), True),   # rows of 24
             ("multiply", "float32", (2, 8, 6, 6), (1, 8, 1, 1), False),    # rows of 36
             ("subtract", "float32", (2, 3, 4, 5, 8), (2, 1, 4, 1, 8), True),  # outer dims
             ("add", "float32", (4, 8, 4), (4, 8, 1), False),           # rows of 4 words
             ("add", "float32", (4, 3, 12), (1, 3, 1), False)]          # rows of 12 words
    for op, dtype, sa, sb, u64 in cases:
        a = random_values(rng, sa, dtype)
        if sb is None:
            t = dml.TensorDesc(dtype, sa)
            desc, ins, want = dml.ElementWiseIdentityOperatorDesc(t, t), [a], a
        else:
            b = random_values(rng, sb, dtype)
            desc = DESCS[op](dml.TensorDesc(dtype, sa), dml.broadcast_tensor_desc(dtype, sb, sa),
                             dml.TensorDesc(dtype, sa))
            ins, want = [a, b], reference(op, a, b)
        results = []
        for store64 in (True, False):
            c = _compiled(device, desc, read, store64=store64)
            try:
                assert c.kernel.endswith("_u64") == (store64 and wide and u64), c.kernel
                xs = [device.tensor(x) for x in ins]
                c.execute(xs, [xs[0]])                # in place: the output is A
                results.append(xs[0].numpy())
            finally:
                c.release()
        check(results[0], want, op)
        assert same_bits(results[0], results[1])


@pytest.mark.parametrize("name", ["relu", "sigmoid", "leaky_relu", "gelu", "linear"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_add1_fused_activation(device, name, dtype):
    params, formula = FORMULAS[name]
    rng = np.random.default_rng(1)
    a = random_values(rng, (3, 17), dtype)
    b = random_values(rng, (17,), dtype)
    act = dml.ACTIVATIONS[name](**params)
    got = vkml.add(a, b, fused_activation=act, device=device)
    s = (a.astype(np.float32) + b.astype(np.float32)).astype(np.float64)
    want = formula(s, **params)
    tol = 3e-5 if dtype == "float32" else 2e-3
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    # by name, with the page's defaults
    np.testing.assert_allclose(vkml.add(a, b, fused_activation="relu", device=device)
                               .astype(np.float64), np.maximum(s, 0), rtol=tol, atol=tol)


def test_tensor_in_tensor_out(device):
    a = vkml.tensor(np.arange(6, dtype=np.int32).reshape(2, 3), device=device)
    b = vkml.tensor(np.array([10, 20, 30], np.int32), device=device)
    y = vkml.add(a, b)
    assert isinstance(y, vkml.Tensor) and y.shape == (2, 3)
    np.testing.assert_array_equal(y.numpy(), np.arange(6).reshape(2, 3) + [10, 20, 30])
    z = vkml.maximum(y, 23)                     # a Python number takes the other's type
    np.testing.assert_array_equal(z.numpy(), np.maximum(y.numpy(), 23))


def test_functional_arguments(device):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValidationError) as info:
        vkml.add(x, np.zeros((2, 3), np.float16), device=device)
    assert info.value.field == "b"
    with pytest.raises(ValidationError) as info:
        vkml.subtract(x, np.zeros((4,), np.float32), device=device)
    assert info.value.field == "b"
    with pytest.raises(ValidationError):        # 9 dimensions
        vkml.multiply(np.zeros((1,) * 9, np.float32), np.zeros((1,), np.float32), device=device)
    with pytest.raises(ValidationError) as info:   # ADD1 takes floats only
        vkml.add(np.zeros(3, np.int32), np.zeros(3, np.int32), fused_activation="relu",
                 device=device)
    assert "data_type" in info.value.field
    with pytest.raises(ValidationError):        # swish is not fusable
        vkml.add(x, x, fused_activation="swish", device=device)
    np.testing.assert_array_equal(vkml.add(x, 1.5, device=device), x + 1.5)
    np.testing.assert_array_equal(vkml.add(2, x, device=device), x + 2)


# -- validation: every rule of the pages ---------------------------------------------------
T = dml.TensorDesc("float32", (2, 3, 4))
CLASSES = list(DESCS.values()) + [dml.ElementWiseAdd1OperatorDesc]


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("case", ["data_type", "same_type", "rank", "sizes", "overlap",
                                  "no_a", "no_b", "no_output"])
def test_tensor_rules(device, cls, case):
    bad_type = "int32" if cls is dml.ElementWiseAdd1OperatorDesc else "float64"
    a, b, out, field = {
        "data_type": (dml.TensorDesc(bad_type, (2, 3, 4)),) * 3 + ("a_tensor.data_type",),
        "same_type": (T, dml.TensorDesc("float16", (2, 3, 4)), T, "b_tensor.data_type"),
        "rank": (T, T, dml.TensorDesc("float32", (2, 3, 4, 1)), "output_tensor.sizes"),
        "sizes": (T, dml.TensorDesc("float32", (2, 3, 5)), T, "b_tensor.sizes"),
        "overlap": (T, T, dml.TensorDesc("float32", (2, 3, 4), (0, 1, 1)),
                    "output_tensor.strides"),
        "no_a": (None, T, T, "a_tensor"),
        "no_b": (T, None, T, "b_tensor"),
        "no_output": (T, T, None, "output_tensor"),
    }[case]
    with pytest.raises(ValidationError) as info:
        device.create_operator(cls(a, b, out))
    assert info.value.field == f"{cls.__name__}.{field}", str(info.value)
    np.testing.assert_array_equal(vkml.add(np.ones(3, np.float32), np.ones(3, np.float32),
                                           device=device), [2, 2, 2])   # still usable


@pytest.mark.parametrize("act, field, match", [
    (dml.ElementWiseClipOperatorDesc(min=0.0, max=1.0), "fused_activation", "Convolution and GEMM"),
    (dml.ActivationReluOperatorDesc(T, T), "fused_activation.input_tensor", "NULL"),
    (dml.ActivationEluOperatorDesc(alpha=float("nan")), "fused_activation.alpha", "finite"),
    (dml.ActivationSwishOperatorDesc(), "fused_activation", "fused-activation page"),
    ("relu", "fused_activation", "activation descriptor"),
])
def test_add1_fused_activation_rules(device, act, field, match):
    with pytest.raises(ValidationError) as info:
        device.create_operator(dml.ElementWiseAdd1OperatorDesc(T, T, T, act))
    assert info.value.field == f"ElementWiseAdd1OperatorDesc.{field}", str(info.value)
    assert match in info.value.rule


def test_feature_levels():
    FL = dml.FeatureLevel
    i8 = dml.TensorDesc("int8", (2, 3, 4, 5))
    i64 = dml.TensorDesc("int64", (2, 3))
    f4 = dml.TensorDesc("float32", (2, 3, 4, 5))
    assert dml.ElementWiseAddOperatorDesc(f4, f4, f4).feature_level() == FL.FL_1_0
    assert dml.ElementWiseAddOperatorDesc(T, T, T).feature_level() == FL.FL_3_0
    assert dml.ElementWiseAddOperatorDesc(i8, i8, i8).feature_level() == FL.FL_5_1
    assert dml.ElementWiseDivideOperatorDesc(i64, i64, i64).feature_level() == FL.FL_6_0
    assert dml.ElementWiseMaxOperatorDesc(i64, i64, i64).feature_level() == FL.FL_5_0
    assert dml.ElementWiseMaxOperatorDesc(i8, i8, i8).feature_level() == FL.FL_2_1
    add1 = dml.ElementWiseAdd1OperatorDesc(f4, f4, f4, dml.ActivationGeluOperatorDesc())
    assert add1.feature_level() == FL.FL_5_1


# -- threads, leaks, graphs ------------------------------------------------------------------
def test_eight_threads(device):
    """vkml.add from 8 threads (each its own shapes and types) and one compiled operator
    shared by all of them."""
    t = dml.TensorDesc("int32", (3, 40))
    shared = device.compile_operator(device.create_operator(dml.ElementWiseMultiplyOperatorDesc(
        t, dml.TensorDesc("int32", (3, 40), (0, 1)), t)))
    errors = []

    def work(k):
        rng = np.random.default_rng(k)
        for i in range(6):
            dtype = TYPES[(k + i) % len(TYPES)]
            a = random_values(rng, (k + 1, 9), dtype)
            b = random_values(rng, (9,), dtype)
            check(vkml.add(a, b, device=device), reference("add", a, b), "add")
            x = rng.integers(-99, 99, (3, 40)).astype(np.int32)
            w = rng.integers(-99, 99, (40,)).astype(np.int32)
            out = device.empty((3, 40), np.int32)
            shared.execute([device.tensor(x), device.tensor(w)], [out])
            np.testing.assert_array_equal(out.numpy(), x * w)

    run_in_threads(work, errors)
    shared.release()
    assert not errors, errors


def test_functional_does_not_leak(device):
    a = np.ones((8, 8), np.float32)
    b = np.ones((8,), np.float32)

    def calls():
        for _ in range(200):
            vkml.add(a, b, device=device)
            vkml.divide(vkml.tensor(a.astype(np.int16), device=device), np.int16(3).reshape(1))
    assert_no_leaks(device, calls, warm=1, rounds=1, key="used")


def test_graph_node(device):
    """A graph: y = identity(a + b) * 2 + 1 (ADD with a broadcast B, then IDENTITY with a
    ScaleBias), compiled and run as one."""
    x = dml.TensorDesc("float32", (2, 3, 4))
    bb = dml.TensorDesc("float32", (2, 3, 4), (0, 0, 1))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((4,)).astype(np.float32)
    got = run_two_node_graph(device, dml.ElementWiseAddOperatorDesc(x, bb, x),
                             dml.ElementWiseIdentityOperatorDesc(x, x, dml.ScaleBias(2.0, 1.0)),
                             [a, b], (2, 3, 4))
    np.testing.assert_allclose(got, (a + b) * 2 + 1, rtol=1e-6, atol=1e-6)


def test_unsupported_is_named(device):
    t = dml.TensorDesc("float64", (4,))
    with pytest.raises(UnsupportedError):
        device.compile_operator(device.create_operator(
            dml.ElementWiseIdentityOperatorDesc(t, t, dml.ScaleBias(2.0, 0.0))))


# -- fuzzer (tests/fuzzing.py): valid and invalid descriptors, canaries ---------------------
FUZZ_OPS = list(OPS) + ["add1"]
FUZZ_SHARE = 2              # a share of fuzz_examples (fuzzing.fuzzer): one pipeline a case
#: ADD1's fused activations the fuzzer draws (None: plain ADD1).
FUZZ_ACTS = [None, "relu", "sigmoid", "leaky_relu", "linear"]
#: broken rule -> the fields a ValidationError may name.
FUZZ_BROKEN = {"data_type": ["data_type"], "same_type": ["data_type"],
               "rank": ["output_tensor.sizes"], "sizes": ["b_tensor.sizes", "a_tensor.sizes"],
               "overlap": ["output_tensor.strides"], "missing": ["a_tensor: "],
               "activation": ["fused_activation"], **TENSOR_BROKEN}


@st.composite
def element_wise_cases(draw):
    rank = draw(st.integers(1, 8))
    hi = 5 if rank <= 3 else 3 if rank <= 5 else 2
    op = draw(st.sampled_from(FUZZ_OPS))
    shape = draw(st.lists(st.integers(1, hi), min_size=rank, max_size=rank))
    if rank <= 2 and draw(st.booleans()):      # rows past the vector widths, sub-word tails
        shape[-1] = draw(st.integers(6, 300))
    return dict(op=op, shape=shape,
                dtype=draw(st.sampled_from(TYPES[:2] if op == "add1" else TYPES)),
                # dimensions broadcast (stride 0) on top of the layout, per input
                bcast=draw(st.lists(st.one_of(st.just([False] * rank),
                                              st.lists(st.booleans(), min_size=rank,
                                                       max_size=rank)),
                                    min_size=2, max_size=2)),
                act=draw(st.sampled_from(FUZZ_ACTS)) if op == "add1" else None,
                in_place=draw(st.booleans()),
                broken=draw(st.sampled_from(["none"] * 10 + list(FUZZ_BROKEN))),
                **placement(draw, 2))


def _with_edges(rng, x, op: str, divisor: bool):
    """``x`` with about a quarter of its elements replaced by the type's edge values:
    integers' MIN, MAX, 0, 1 and -1 (INT_MIN / -1 and x / 0 included); floats' zeros of
    both signs, infinities and the largest finite values (overflow to infinity), not as
    divisors (the precision Vulkan gives a division holds for normal divisors only) nor
    in ADD1 (its activations are compared with a tolerance)."""
    dt = x.dtype
    if dt.kind == "f":
        if op == "add1" or divisor:
            return x
        big = [] if op == "divide" else [np.finfo(dt).max, -np.finfo(dt).max]
        edges = [0.0, -0.0, np.inf, -np.inf] + big
    else:
        info = np.iinfo(dt)
        edges = [info.min, info.max, 0, 1] + ([-1] if dt.kind == "i" else [])
    mask = rng.random(x.shape) < 0.25
    return np.where(mask, rng.choice(np.array(edges, dt), x.shape), x).astype(dt)


def _fuzz_operand(rng, shape, dtype, bcast, kind, op, divisor=False):
    """One input of a fuzzed case: values (with edge values) broadcast along ``bcast``
    (stride 0) and laid out as ``kind`` (fuzzing.lay_out): (flat buffer, element strides,
    logical array)."""
    small = [1 if b else n for n, b in zip(shape, bcast)]
    x = _with_edges(rng, random_values(rng, small, dtype, divisor=divisor), op, divisor)
    flat, strides, logical = lay_out(rng, x, kind)
    strides = strides or tuple(int(np.prod(small[i + 1:])) for i in range(len(small)))
    strides = tuple(0 if b else s for s, b in zip(strides, bcast))
    return flat, strides, np.broadcast_to(logical, shape)


def _fuzz_reference(case, a, b):
    op, act = case["op"], case["act"]
    if op != "add1":
        with np.errstate(over="ignore"):        # (float16 edge values overflow to inf)
            return reference(op, a, b)
    s = (a.astype(np.float32) + b.astype(np.float32)).astype(np.float64)
    if act is not None:
        params, formula = FORMULAS[act]
        s = formula(s, **params)
    return s


def _fuzz_descriptor(case, shape, dtype, a_st, b_st, out_st):
    """The case's descriptor maker with its one broken rule (``case["broken"]``), and the
    fields a refusal may name (empty: the case is valid)."""
    broken, op, rank = case["broken"], case["op"], len(shape)
    want = FUZZ_BROKEN.get(broken, [])
    ta = tb = to = dtype
    sa, sb, so = list(shape), list(shape), list(shape)
    act = None if case["act"] is None else dml.ACTIVATIONS[case["act"]](**FORMULAS[case["act"]][0])
    total = None
    if broken == "data_type":
        ta = tb = to = "int32" if op == "add1" else "float64"
    elif broken == "same_type":
        tb = {"float32": "float16"}.get(dtype, "float32")
    elif broken == "rank":          # (the output's strides follow, so only the rank breaks)
        so, out_st = (so + [1], out_st and out_st + (1,)) if rank < 8 else \
            (so[:-1], out_st and out_st[:-1])
    elif broken == "sizes":
        sb[-1] += 1
    elif broken == "overlap":
        overlapping = overlapping_strides(shape, out_st)
        if overlapping is None:
            want = []
        else:
            out_st = overlapping
    elif broken in TENSOR_BROKEN:
        sa, a_st, total = break_tensor_rule(broken, sa, a_st)
    elif broken == "activation":
        if op == "add1":
            act = dml.ElementWiseClipOperatorDesc(min=0.0, max=1.0)
        else:
            want = []

    def make():
        a = None if broken == "missing" else dml.TensorDesc(ta, sa, a_st, total)
        args = (a, dml.TensorDesc(tb, sb, b_st), dml.TensorDesc(to, so, out_st))
        if op == "add1":
            return dml.ElementWiseAdd1OperatorDesc(*args, fused_activation=act)
        return DESCS[op](*args)
    return make, want


def _run_in_place(device, compiled, desc, a_flat, b_flat):
    """Run ``compiled`` (then release it) with A's tensor as the output too ("supports
    in-place execution"); nothing may be written outside the tensors or into A's gaps.
    Returns the output's logical elements."""
    ins = [bind_with_canary(device, t.total_tensor_size_in_bytes, f)
           for t, f in zip(desc.inputs(), (a_flat, b_flat))]
    compiled.execute(ins, [ins[0]])
    compiled.release()
    assert all(canaries_intact(t) for t in ins), "wrote outside a tensor"
    out = desc.output_tensor
    raw = ins[0].read_bytes(a_flat.nbytes).view(a_flat.dtype)
    idx = np.zeros(out.sizes, np.int64)
    for d, (n, stride) in enumerate(zip(out.sizes, out.strides)):
        idx += (np.arange(n) * stride).reshape([-1 if k == d else 1 for k in range(len(out.sizes))])
    gaps = np.ones(raw.size, bool)
    gaps[idx.reshape(-1)] = False
    assert same_bits(raw[gaps], a_flat[gaps]), "wrote into the gaps of A's layout"
    return raw[idx]


@pytest.mark.parametrize("dtype, n", [("int8", 5), ("uint8", 7), ("int16", 3),
                                      ("float16", 9), ("int8", 4099)])
@pytest.mark.parametrize("op", ["add", "identity"])
def test_in_place_leaves_the_last_word_padding(dtype, n, op, device):
    """A packed 8/16-bit tensor whose elements end inside a 32-bit word: run in place,
    the bytes after the last element (inside TotalTensorSizeInBytes, rounded up to 4)
    keep their values; the kernels move whole words, so the word's other bytes must not
    take an element's result."""
    rng = np.random.default_rng(n)
    a = rng.integers(-3, 4, n).astype(dtype)
    b = rng.integers(-3, 4, n).astype(dtype)
    total = round_up(a.nbytes, 4)
    t = dml.TensorDesc(dtype, (n,), None, total)
    desc = (dml.ElementWiseIdentityOperatorDesc(t, t) if op == "identity" else
            dml.ElementWiseAddOperatorDesc(t, dml.TensorDesc(dtype, (n,)), t))
    compiled = device.compile_operator(device.create_operator(desc))
    pad = np.frombuffer(bytes([0x7F, 0x3C, 0xA5]), np.uint8)[:total - a.nbytes]
    a_flat = np.concatenate([a.view(np.uint8), pad]).view(np.uint8)
    ins = [bind_with_canary(device, total, a_flat)]
    if op == "add":
        ins.append(bind_with_canary(device, b.nbytes, b))
    compiled.execute(ins, [ins[0]])
    compiled.release()
    assert all(canaries_intact(x) for x in ins), "wrote outside a tensor"
    raw = ins[0].read_bytes(total)
    np.testing.assert_array_equal(raw[a.nbytes:], pad, err_msg="the last word's padding")
    want = a if op == "identity" else (a + b).astype(dtype)
    assert same_bits(raw[:a.nbytes].view(dtype), want)


def test_fuzz_element_wise(device, speed):
    """Random ADD/ADD1/SUBTRACT/MULTIPLY/DIVIDE/MAX/MIN descriptors (the contract of
    ``fuzzing.fuzzer``): ranks 1-8, broadcasts by zero strides on either input, padded,
    permuted and strided layouts, edge values, in-place execution, every data type of the
    pages, one broken rule at a time."""
    @fuzzer(speed, element_wise_cases(), share=FUZZ_SHARE, refused=0.1)
    def fuzz_case(case):
        rng = np.random.default_rng(case["seed"])
        op, dtype, shape = case["op"], case["dtype"], list(case["shape"])
        a_flat, a_st, a = _fuzz_operand(rng, shape, dtype, case["bcast"][0],
                                        case["layouts"][0], op)
        b_flat, b_st, b = _fuzz_operand(rng, shape, dtype, case["bcast"][1],
                                        case["layouts"][1], op, op == "divide")
        out_st, read = padded_output(rng, shape, dtype, case["out_padded"])
        # in place: the output is A's memory, in A's layout (one that does not overlap)
        in_place = case["in_place"] and case["broken"] == "none" and all(
            st or n == 1 for st, n in zip(a_st, shape))
        make, want = _fuzz_descriptor(case, shape, dtype, a_st, b_st,
                                      a_st if in_place else out_st)
        desc, compiled = compiled_or_refused(device, make, want, may_be_unsupported=True)
        if desc is None:
            return
        if in_place:
            got = _run_in_place(device, compiled, desc, a_flat, b_flat)
        else:
            got = run_checked(device, compiled, desc, [a_flat, b_flat], read)
        expect = _fuzz_reference(case, a, b)
        if op == "add1":
            tol = 3e-5 if dtype == "float32" else 2e-3
            np.testing.assert_allclose(got.astype(np.float64), expect, rtol=tol, atol=tol)
        else:
            check(got, expect, op)

    fuzz_case()

"""DML_REDUCE_OPERATOR_DESC (every DML_REDUCE_FUNCTION) and vkml.reduce.

Reference: NumPy, float64 for float inputs (the page's formulas), the input's own integer
type for integer ones (NumPy's sums and products wrap as the kernel's do), ``argmax`` /
``argmin`` over the reduced axes moved last and flattened (their first extreme, as the
kernel's).  Tolerances: float32 results within 2^-18 relative to the same function of
|x| (sums in float32, blocked); float16 one float16 ulp more; min/max/arg exact.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.errors import ValidationError

from hypothesis import given, settings
from hypothesis import strategies as st

from fuzzing import (LAYOUTS, canaries_intact, compiled_or_refused, execute_with_canaries,
                     fuzz_examples, fuzz_settings, lay_out, padded_output)
from helpers import assert_no_leaks, operator_cycle, random_bits

FUNCS = ["argmax", "argmin", "average", "l1", "l2", "log_sum", "log_sum_exp", "max", "min",
         "multiply", "sum", "sum_square"]
FLOAT_ONLY = {"average", "l2", "log_sum", "log_sum_exp"}
WIDE = {"l1", "sum_square", "multiply", "sum"}
INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


def allowed(fn, dtype) -> bool:
    if np.dtype(dtype).kind == "f":
        return True
    if fn in FLOAT_ONLY:
        return False
    return fn not in WIDE or np.dtype(dtype).itemsize >= 4


def reference(x, fn, axes):
    """(result, magnitude): the page's formula over ``axes`` (rank kept), and the same
    sum-like function of |x| (the scale of a float sum's rounding error)."""
    axes = tuple(sorted(axes))
    keep = dict(axis=axes, keepdims=True)
    if fn in ("argmax", "argmin"):
        rest = [a for a in range(x.ndim) if a not in axes]
        moved = np.transpose(x, rest + list(axes)).reshape([x.shape[a] for a in rest] + [-1])
        k = (np.argmax if fn == "argmax" else np.argmin)(moved, axis=-1)
        out_shape = [1 if a in axes else n for a, n in enumerate(x.shape)]
        return k.reshape(out_shape), None
    if fn in ("max", "min"):
        return (np.max if fn == "max" else np.min)(x, **keep), None
    if x.dtype.kind != "f":
        v = x if fn != "l1" else np.abs(x)
        v = v * v if fn == "sum_square" else v
        return (np.prod if fn == "multiply" else np.sum)(v, dtype=x.dtype, **keep), None
    f = x.astype(np.float64)
    a = np.abs(f)
    with np.errstate(all="ignore"):
        if fn == "average":
            return f.mean(**keep), a.mean(**keep)
        if fn == "l1":
            return a.sum(**keep), a.sum(**keep)
        if fn in ("l2", "sum_square"):
            s = (f * f).sum(**keep)
            return (np.sqrt(s), np.sqrt(s)) if fn == "l2" else (s, s)
        if fn == "log_sum":
            return np.log(f.sum(**keep)), a.sum(**keep) / np.abs(f.sum(**keep))
        if fn == "log_sum_exp":
            m = f.max(**keep)
            r = m + np.log(np.exp(f - m).sum(**keep))
            return r, np.maximum(np.abs(r), 1.0)
        if fn == "multiply":
            p = f.prod(**keep)
            return p, np.abs(p) * x.size
        return f.sum(**keep), a.sum(**keep)


def check(got, x, fn, axes, out_type=None):
    want, mag = reference(x, fn, axes)
    assert got.shape == want.shape
    if fn in ("argmax", "argmin"):
        np.testing.assert_array_equal(got.astype(np.int64), want)
    elif mag is None:
        np.testing.assert_array_equal(got, want)
    else:
        g = got.astype(np.float64)
        both_nan = np.isnan(g) & np.isnan(want)
        ok = both_nan | (g == want) | (np.abs(g - want) <= mag * 2.0 ** -18 + (
            np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)
            if x.dtype == np.float16 else 0.0))
        assert ok.all(), (fn, x.dtype, axes, g[~ok][:4], want[~ok][:4])


def random_input(rng, shape, dtype, fn):
    if np.dtype(dtype).kind != "f":
        return random_bits(rng, shape, dtype)
    if fn == "log_sum":
        return rng.uniform(0.1, 2.0, shape).astype(dtype)
    if fn == "multiply":
        sign = rng.choice([-1, 1], shape).astype(dtype)
        return rng.uniform(0.8, 1.25, shape).astype(dtype) * sign
    return (rng.standard_normal(shape) * 3).astype(dtype)


def random_shape(rng, max_elems=3000):
    while True:
        rank = int(rng.integers(1, 9))
        shape = tuple(int(rng.integers(1, 6)) for _ in range(rank))
        if math.prod(shape) <= max_elems:
            return shape


# -- the page's examples ------------------------------------------------------------------
def test_page_examples(device):
    x = np.array([[1, 2, 3], [3, 0, 4], [2, 4, 2]], np.float32)
    np.testing.assert_array_equal(vkml.reduce(x, "sum", axes=[0], device=device), [[6, 6, 9]])
    np.testing.assert_array_equal(vkml.reduce(x, "sum", axes=[1], device=device),
                                  [[6], [7], [8]])
    np.testing.assert_array_equal(vkml.reduce(x, "DML_REDUCE_FUNCTION_SUM", axes=[0, 1],
                                              device=device), [[21]])


# -- every function, random shapes and axes -----------------------------------------------
@pytest.mark.parametrize("fn", FUNCS)
def test_random_against_numpy(device, budget, fn):
    rng = np.random.default_rng(FUNCS.index(fn))
    # every allowed type for a few functions, one integer type for the others (each type
    # is a pipeline of its own, lavapipe compiling one in 0.1-0.6 s)
    ints = [t for t in INTS if allowed(fn, t)]
    if fn not in ("max", "argmax", "sum") or budget < 20:
        ints = ints[FUNCS.index(fn) % len(ints):][:1] if ints else []
    types = ["float32", "float16"] + ints
    for case in range(len(types) + min(3, budget // 8)):
        dtype = types[case % len(types)]
        shape = random_shape(rng)
        axes = sorted(rng.choice(len(shape), int(rng.integers(1, len(shape) + 1)),
                                 replace=False).tolist())
        x = random_input(rng, shape, dtype, fn)
        out_type = ["uint32", "int32", "int64", "uint64"][case % 4]
        got = vkml.reduce(x, fn, axes=axes, output_type=out_type, device=device)
        if fn in ("argmax", "argmin"):
            assert got.dtype == np.dtype(out_type)
        else:
            assert got.dtype == x.dtype
        check(got, x, fn, axes)


@pytest.mark.parametrize("path", ["lane", "group"])
def test_both_paths(device, path):
    """Each path forced, outputs few and many, axes inner and outer: every function on
    "group" (its lanes' states merge in a tree), three on "lane" (which the random tests
    reach for every function)."""
    from vkml.ops.reduce import CompiledReduce

    rng = np.random.default_rng(5)
    cases = (((3, 700), (1,)), ((700, 3), (0,)), ((2, 5, 3, 40), (1, 3)),
             ((4, 5, 6), (0, 1, 2)))
    funcs = FUNCS if path == "group" else ["argmin", "log_sum_exp", "sum"]
    for i, fn in enumerate(funcs):
        for shape, axes in (cases[i % 4],):
            x = random_input(rng, shape, "float32", fn)
            out_type = "uint32" if fn.startswith("arg") else "float32"
            desc = dml.ReduceOperatorDesc(fn, dml.TensorDesc("float32", shape),
                                          dml.TensorDesc(out_type, tuple(
                                              1 if a in axes else n for a, n in
                                              enumerate(shape))), axes)
            op = CompiledReduce(device, desc, path=path)
            assert op.path == path
            y = device.empty(desc.output_tensor.sizes, out_type)
            op.execute([device.tensor(x)], [y])
            op.release()
            check(y.numpy(), x, fn, axes)


VEC4_CASES = (((2, 8, 12), (1,), 1), ((5, 3, 64), (0, 1), 1), ((3, 7, 2, 8), (1, 2), 1),
              ((6, 5, 16), (2,), 2), ((2, 3, 4, 8), (1, 3), 2), ((4, 3, 5, 4), (2, 3), 2),
              ((7, 4), (0, 1), 2), ((5, 3, 7), (2,), 3), ((2, 6, 7, 7), (2, 3), 3),
              ((3, 9), (0, 1), 3), ((4, 2, 5, 6), (3,), 3),
              # runs inside one texel and across two (first and last texel alike)
              ((6, 5, 3), (2,), 3), ((9, 3), (1,), 3))


@pytest.mark.parametrize("fn", FUNCS)
def test_vec4_path(device, fn):
    """The "vec4" path forced, each way (4 outputs an invocation along the kept last axis;
    rows read 4 at a time; unaligned packed runs through the texels covering them), one
    and several merged reduced axes, ties and NaN planted,
    against NumPy and against "lane" (min, max and the arg functions bit-exact)."""
    from vkml.ops.reduce import CompiledReduce

    rng = np.random.default_rng(FUNCS.index(fn))
    out_type = "uint32" if fn.startswith("arg") else "float32"
    for shape, axes, mode in VEC4_CASES:
        x = random_input(rng, shape, "float32", fn)
        x[..., 2] = x[..., 1]                          # ties along the last axis
        if fn in ("max", "min", "argmax", "argmin") and rng.random() < 0.5:
            x.flat[rng.integers(x.size, size=3)] = np.nan
        out = tuple(1 if a in axes else n for a, n in enumerate(shape))
        desc = dml.ReduceOperatorDesc(fn, dml.TensorDesc("float32", shape),
                                      dml.TensorDesc(out_type, out), axes)
        got = {}
        for path in ("vec4", "lane"):
            op = CompiledReduce(device, desc, path=path)
            assert op.path == path and (path == "lane" or op.vec4 == mode)
            y = device.empty(out, out_type)
            op.execute([device.tensor(x)], [y])
            op.release()
            got[path] = y.numpy()
        check(got["vec4"], x, fn, axes)
        if fn in ("max", "min", "argmax", "argmin"):
            np.testing.assert_array_equal(got["vec4"], got["lane"])


#: (shape, row length in memory, reduced axes, glsl/reduce.comp's SPAN): packed runs (mode
#: 3) whose texels between the first and last are one number for every output (one start
#: within a texel, or a length 1 past a multiple of 4), 1 to SPAN_MAX (16), and runs left
#: to the loop (starts at offsets that give different numbers, 2 texels or fewer, more
#: than 16 between).  Rows longer than the shape's last axis hold NaN past it.
SPAN_CASES = (((2, 6, 7, 7), 7, (2, 3), 11), ((5, 18), 20, (1,), 3),
              ((3, 70), 72, (1,), 16), ((4, 66), 68, (1,), 15), ((3, 9), 9, (0, 1), 5),
              ((6, 13), 13, (1,), 2), ((5, 45), 45, (1,), 10), ((6, 10), 10, (1,), 1),
              ((6, 11), 11, (1,), 0), ((3, 73), 73, (1,), 0), ((4, 75), 76, (1,), 0),
              ((5, 5), 8, (1,), 0), ((3, 8), 9, (1,), 0))


@pytest.mark.parametrize("fn", FUNCS)
def test_vec4_span_unrolled(device, fn):
    """"vec4" over packed runs with the texels between a run's ends unrolled (SPAN) where
    every run has as many, else the loop (always for LOG_SUM_EXP), against NumPy and
    (min, max and the arg functions bit-exact) against "lane"."""
    from vkml.ops.reduce import CompiledReduce

    rng = np.random.default_rng(100 + FUNCS.index(fn))
    out_type = "uint32" if fn.startswith("arg") else "float32"
    for shape, row, axes, span in SPAN_CASES:
        x = random_input(rng, shape, "float32", fn)
        if fn in ("max", "min", "argmax", "argmin") and rng.random() < 0.5:
            x.flat[rng.integers(x.size, size=2)] = np.nan
        buf = np.full(shape[:-1] + (row,), np.nan, np.float32)
        buf[..., :shape[-1]] = x
        strides = None if row == shape[-1] else (row, 1)
        out = tuple(1 if a in axes else n for a, n in enumerate(shape))
        desc = dml.ReduceOperatorDesc(fn, dml.TensorDesc("float32", shape, strides),
                                      dml.TensorDesc(out_type, out), axes)
        got = {}
        for path in ("vec4", "lane"):
            op = CompiledReduce(device, desc, path=path)
            if path == "vec4":
                assert (op.path, op.vec4) == ("vec4", 3), shape
                assert op.consts["SPAN"] == (0 if fn == "log_sum_exp" else span), shape
            y = device.empty(out, out_type)
            op.execute([device.tensor(buf.reshape(-1))], [y])
            op.release()
            got[path] = y.numpy()
        check(got["vec4"], x, fn, axes)
        if fn in ("max", "min", "argmax", "argmin"):
            np.testing.assert_array_equal(got["vec4"], got["lane"])


#: (shape, reduced axes, "vec4" path, kept axes packed (True) or the output padded, the
#: kept axes left after merging (KDIMS), SPAN): a division per kept axis but the outermost.
KEPT_CASES = (((1, 64, 12, 8), (1,), "vec4", True, 1, 64),
              ((1, 64, 12, 8), (1,), "vec4", False, 2, 64),
              ((3, 5, 2, 8), (1,), "vec4x2", True, 2, 5),
              ((2, 3, 4, 8), (1, 3), "vec4", True, 2, 0),
              ((4, 6, 20), (2,), "vec4", True, 1, 5), ((4, 6, 20), (2,), "vec4", False, 2, 5),
              ((3, 4, 5, 7, 7), (3, 4), "vec4", False, 3, 11),
              ((2, 3, 4, 5), (0, 1, 2, 3), "vec4", True, 0, 30))


@pytest.mark.parametrize("fn", ["argmin", "max", "sum", "average", "log_sum_exp"])
def test_vec4_kept_axes_merged(device, fn):
    """"vec4" with the kept axes merged where both tensors address them as one (KDIMS of
    them left; packed and padded outputs, canaries around the output and in its gaps) and
    the reduced axis unrolled where SPAN says, against NumPy."""
    from fuzzing import CANARY, execute_with_canaries
    from vkml.ops.reduce import CompiledReduce

    rng = np.random.default_rng(200 + len(fn))
    out_type = "uint32" if fn.startswith("arg") else "float32"
    for shape, axes, path, packed, kdims, span in KEPT_CASES:
        x = random_input(rng, shape, "float32", fn)
        out = [1 if a in axes else n for a, n in enumerate(shape)]
        phys = [n + (0 if packed or n == 1 else 1) for n in out]
        out_strides = tuple(int(np.prod(phys[i + 1:])) for i in range(len(phys)))
        desc = dml.ReduceOperatorDesc(fn, dml.TensorDesc("float32", shape),
                                      dml.TensorDesc(out_type, out, out_strides), axes)
        op = CompiledReduce(device, desc, path=path)
        assert op.taken == path, shape
        want = (kdims, 0 if fn == "log_sum_exp" else span)
        assert (op.consts["KDIMS"], op.consts["SPAN"]) == want, (shape, packed)
        src, dst = execute_with_canaries(device, op, desc, x.reshape(-1))
        count = sum((n - 1) * st for n, st in zip(out, out_strides)) + 1
        raw = np.full(int(np.prod(phys)) * 4, CANARY, np.uint8)   # past the last: none
        raw[:count * 4] = dst.read_bytes(count * 4)
        raw = raw.reshape(phys + [4])
        inside = tuple(slice(0, n) for n in out)
        got = raw[inside].copy().view(np.dtype(out_type)).reshape(out)
        gaps = np.ones(phys, bool)
        gaps[inside] = False
        check(got, x, fn, axes)
        assert np.all(raw[gaps] == CANARY) and canaries_intact(src) and canaries_intact(dst)


@pytest.mark.parametrize("fn", ["argmax", "max", "sum", "log_sum_exp"])
def test_vec4_kept_wide(device, fn):
    """"vec4x2" / "vec4x4" (8 or 16 outputs a lane along the kept last axis, one and
    several merged reduced axes, ties and NaN planted) against NumPy and bit-exact
    against "vec4" (the same order of terms per output); a last axis they do not divide
    falls back to "vec4"."""
    from vkml.ops.reduce import CompiledReduce

    rng = np.random.default_rng(70 + FUNCS.index(fn))
    out_type = "uint32" if fn.startswith("arg") else "float32"
    cases = (((3, 5, 32), (1,)), ((5, 3, 48), (0, 1)), ((2, 3, 7, 16), (1, 2)),
             ((2, 300, 64), (1,)), ((4, 6, 24), (0,)))
    for shape, axes in cases:
        x = random_input(rng, shape, "float32", fn)
        x[..., 5] = x[..., 4]
        if fn in ("max", "argmax") and rng.random() < 0.5:
            x.flat[rng.integers(x.size, size=3)] = np.nan
        out = tuple(1 if a in axes else n for a, n in enumerate(shape))
        desc = dml.ReduceOperatorDesc(fn, dml.TensorDesc("float32", shape),
                                      dml.TensorDesc(out_type, out), axes)
        got = {}
        for path in ("vec4", "vec4x2", "vec4x4"):
            op = CompiledReduce(device, desc, path=path)
            n = int(path[5:] or 1)
            kept = n if shape[-1] % (4 * n) == 0 and not (
                fn == "log_sum_exp" and n > 2) else 1        # see CompiledReduce
            assert (op.path, op.vec4, op.kept) == ("vec4", 1, kept), (shape, path)
            y = device.empty(out, out_type)
            op.execute([device.tensor(x)], [y])
            op.release()
            got[path] = y.numpy()
            check(got[path], x, fn, axes)
        for path in ("vec4x2", "vec4x4"):
            np.testing.assert_array_equal(got[path], got["vec4"])


def test_vec4_kept_wide_is_a_tuner_candidate(device):
    """The tuner times "vec4x2" / "vec4x4" where the kept last axis takes them (their
    run function records that path) and declines them where it does not."""
    import importlib
    from vkml import tuning
    R = importlib.import_module("vkml.ops.reduce")

    def shape(sizes):
        out = [sizes[0], 1, sizes[2]]
        return {"in": [list(sizes), [sizes[1] * sizes[2], sizes[2], 1]],
                "out": [out, [sizes[2], sizes[2], 1]], "axes": [1], "function": 7}
    for sizes, ok in (((2, 8, 32), {"vec4x2", "vec4x4"}), ((2, 8, 24), {"vec4x2"})):
        for name in ("vec4x2", "vec4x4"):
            cand = R.REDUCE_PATH.candidate(name)
            seq = device.sequence()
            if name in ok:
                R._path_run(device, seq, cand, shape(sizes))()
            else:
                with pytest.raises(tuning.Declined):
                    R._path_run(device, seq, cand, shape(sizes))
            seq.close()


def test_vec4_declines_and_storage_reads(device):
    """"vec4" falls back to "lane" where the reduced elements are neither a packed run
    nor 4-aligned or the tensors are windowed; past maxTexelBufferElements (or with
    storage reads forced) it reads vec4s from a storage buffer."""
    from vkml.ops.reduce import CompiledReduce

    rng = np.random.default_rng(40)
    for shape, axes in (((6, 10, 3), (1,)), ((6, 10), (0,)), ((5, 3, 6), (1,))):
        out = tuple(1 if a in axes else n for a, n in enumerate(shape))
        desc = dml.ReduceOperatorDesc("sum", dml.TensorDesc("float32", shape),
                                      dml.TensorDesc("float32", out), axes)
        op = CompiledReduce(device, desc, path="vec4")
        assert op.path == "lane", shape
        op.release()
    with vkml.Device(device.index, limits={"maxTexelBufferElements": 64}) as small:
        for shape, axes, mode in VEC4_CASES[:2] + VEC4_CASES[3:5] + VEC4_CASES[7:9]:
            x = rng.standard_normal(shape).astype(np.float32)
            out = tuple(1 if a in axes else n for a, n in enumerate(shape))
            desc = dml.ReduceOperatorDesc("argmax", dml.TensorDesc("float32", shape),
                                          dml.TensorDesc("uint32", out), axes)
            op = CompiledReduce(small, desc, path="vec4")
            assert op.path == "vec4" and op.vec4 == mode
            assert op.read == ("ssbo4" if x.nbytes > 64 * 16 else "texel4")
            y = small.empty(out, "uint32")
            op.execute([small.tensor(x)], [y])
            op.release()
            check(y.numpy(), x, "argmax", axes)
    x = rng.standard_normal((6, 5, 16)).astype(np.float32)
    desc = dml.ReduceOperatorDesc("max", dml.TensorDesc("float32", x.shape),
                                  dml.TensorDesc("float32", (6, 5, 1)), (2,))
    op = CompiledReduce(device, desc, path="vec4", read="ssbo")
    assert op.path == "vec4" and op.read == "ssbo4"
    y = device.empty((6, 5, 1), np.float32)
    op.execute([device.tensor(x)], [y])
    op.release()
    check(y.numpy(), x, "max", (2,))
    with vkml.Device(device.index, limits={"maxStorageBufferRange": 4096}) as small:
        x = rng.standard_normal((40, 64)).astype(np.float32)
        desc = dml.ReduceOperatorDesc("sum", dml.TensorDesc("float32", x.shape),
                                      dml.TensorDesc("float32", (40, 1)), (1,))
        op = CompiledReduce(small, desc, path="vec4")
        assert op.path == "lane"
        y = small.empty((40, 1), np.float32)
        op.execute([small.tensor(x)], [y])
        op.release()
        check(y.numpy(), x, "sum", (1,))


def test_long_sums_are_blocked(device):
    """2^17 terms of 0.1 (float32; a serial float32 loop is off by 1e-3 relative) and
    4096 float16 ones (a float16 sum stops at 2048), on both paths; 2^20 terms (off by
    1e-2 serially) take the group path even where "lane" is asked for (a lane's loop
    stays within lavapipe's 65535 iterations)."""
    from vkml.ops.reduce import CompiledReduce

    for dtype, n, value in (("float32", 1 << 17, 0.1), ("float16", 4096, 1.0),
                            ("float32", 1 << 20, 0.1)):
        x = np.full((1, n), value, dtype)
        for path in ("lane", "group", "vec4"):
            desc = dml.ReduceOperatorDesc("sum", dml.TensorDesc(dtype, x.shape),
                                          dml.TensorDesc(dtype, (1, 1)), (1,))
            op = CompiledReduce(device, desc, path=path)
            assert op.path == (("lane" if path == "vec4" and dtype == "float16" else path)
                               if n <= 1 << 17 else "group")
            y = device.empty((1, 1), dtype)
            op.execute([device.tensor(x)], [y])
            op.release()
            want = float(np.float32(value) if dtype == "float32" else value) * n
            assert abs(float(y.numpy()[0, 0]) - want) <= want * 2e-5, (path, y.numpy())


def test_log_sum_exp_is_max_subtracted(device):
    x = np.array([[1000, 1000, -np.inf], [-np.inf, -np.inf, -np.inf], [88, 89, 90]],
                 np.float32)
    got = vkml.reduce(x, "log_sum_exp", axes=1, device=device)
    want = [1000 + math.log(2), -np.inf, 90 + math.log(1 + math.exp(-1) + math.exp(-2))]
    np.testing.assert_allclose(got.ravel(), want, rtol=1e-6)
    x16 = np.array([[60000, 60000]], np.float16)
    assert np.isfinite(vkml.reduce(x16, "log_sum_exp", axes=1, device=device)).all()


def test_ties_and_nan(device):
    """ARGMAX/ARGMIN: the first extreme on a tie; NaN is the extreme of max, min and
    both arg functions (the first NaN)."""
    x = np.array([[1, 5, 5, 0, 0], [2, np.nan, 7, np.nan, -1]], np.float32)
    assert vkml.reduce(x, "argmax", axes=1, device=device).ravel().tolist() == [1, 1]
    assert vkml.reduce(x, "argmin", axes=1, device=device).ravel().tolist() == [3, 1]
    assert np.isnan(vkml.reduce(x, "max", axes=1, device=device)[1, 0])
    assert np.isnan(vkml.reduce(x, "min", axes=1, device=device)[1, 0])
    i = np.array([[3, -7, 3, -7]], np.int32)
    assert vkml.reduce(i, "argmax", axes=1, device=device).ravel().tolist() == [0]
    assert vkml.reduce(i, "argmin", axes=1, device=device).ravel().tolist() == [1]


def test_argmax_numbers_the_reduced_axes_row_major(device):
    x = np.zeros((2, 3, 4), np.float32)
    x[0, 2, 1] = 5
    x[1, 0, 3] = 5
    got = vkml.reduce(x, "argmax", axes=(2, 0), output_type="int64", device=device)
    assert got.shape == (1, 3, 1)
    assert got.ravel().tolist() == [1 * 4 + 3, 0, 0 * 4 + 1]


@pytest.mark.parametrize("dtype", INTS)
def test_integer_extremes(device, budget, dtype):
    info = np.iinfo(dtype)
    x = np.array([[info.min, info.max, 0, info.min], [1, 1, info.max, info.max]], dtype)
    fns = ("max", "argmin") + (
        ("sum", "multiply", "l1", "sum_square") if x.itemsize >= 4 else ("min", "argmax"))
    for fn in fns if budget >= 20 else fns[::3]:      # a slow device: every third
        check(vkml.reduce(x, fn, axes=1, device=device), x, fn, (1,))


# -- layouts, devices, limits -------------------------------------------------------------
@pytest.mark.parametrize("kind", ["padded", "permuted", "broadcast"])
def test_strided_inputs_and_outputs(device, kind):
    rng = np.random.default_rng(len(kind))
    for dtype, fn in (("float32", "sum"), ("float16", "average"), ("int8", "max"),
                      ("uint64", "sum"), ("float32", "argmin")):
        x = random_input(rng, (3, 4, 5), dtype, fn)
        flat, in_strides, x = lay_out(rng, x, kind)
        axes = (0, 2)
        out = [1, 4, 1]
        out_type = "uint32" if fn.startswith("arg") else dtype
        out_strides, read = padded_output(rng, out, out_type, True)
        desc = dml.ReduceOperatorDesc(fn, dml.TensorDesc(dtype, x.shape, in_strides),
                                      dml.TensorDesc(out_type, out, out_strides), axes)
        compiled = device.compile_operator(device.create_operator(desc))
        src, dst = execute_with_canaries(device, compiled, desc, flat)
        got, gaps = read(dst)
        check(got, x, fn, axes)
        assert gaps and canaries_intact(src) and canaries_intact(dst)


def test_packed_float16(device):
    with vkml.Device(device.index, disable_features=["storage16"]) as dev:
        rng = np.random.default_rng(12)
        x = rng.standard_normal((3, 7, 9)).astype(np.float16)
        for fn in ("sum", "argmin"):
            check(vkml.reduce(x, fn, axes=(0, 2), device=dev), x, fn, (0, 2))


def test_windows_beyond_max_storage_buffer_range(device):
    with vkml.Device(device.index, limits={"maxStorageBufferRange": 4096}) as small:
        rng = np.random.default_rng(13)
        for dtype, fn, shape, axes in (("float32", "sum", (40, 60), (1,)),
                                       ("int16", "max", (3, 50, 30), (2,)),
                                       ("float16", "argmax", (20, 3, 10), (0, 2))):
            x = random_input(rng, shape, dtype, fn)
            check(vkml.reduce(x, fn, axes=axes, device=small), x, fn, axes)


def test_grids_beyond_max_workgroup_count(device):
    from vkml.ops.reduce import CompiledReduce

    with vkml.Device(device.index, limits={"maxComputeWorkGroupCount": (3, 3, 2)}) as dev:
        rng = np.random.default_rng(17)
        for shape, axes in (((7, 80, 3), (1,)), ((2, 3, 4, 5, 70), (4,)), ((100, 3, 16), (1,)),
                            ((500, 8), (1,))):
            x = rng.standard_normal(shape).astype(np.float32)
            for path in ("lane", "group", "vec4"):
                out = tuple(1 if a in axes else n for a, n in enumerate(shape))
                desc = dml.ReduceOperatorDesc("sum", dml.TensorDesc("float32", shape),
                                              dml.TensorDesc("float32", out), axes)
                op = CompiledReduce(dev, desc, path=path)
                y = dev.empty(out, np.float32)
                op.execute([dev.tensor(x)], [y])
                op.release()
                check(y.numpy(), x, "sum", axes)


def test_path_rule_and_tuning_off(device):
    """``VKML_TUNE=off`` keeps the rule ("auto"): "group" for a long reduction into few
    outputs, "lane" otherwise, "vec4" instead where it runs (instead of "group" from 64
    invocations)."""
    from vkml import tuning
    from vkml.ops.reduce import CompiledReduce, REDUCE_PATH

    for ex in REDUCE_PATH.examples:
        assert tuning.Tuner(mode="off").choose(device, REDUCE_PATH, ex).name == "auto"
    for shape, axes, want in (((4, 5000), (1,), "group"), ((500, 3), (0,), "lane"),
                              ((63, 64, 3), (1,), "lane"), ((1, 1 << 18), (1,), "group"),
                              ((5000, 3), (1,), "vec4"), ((64, 49), (1,), "vec4"),
                              ((5000, 4), (1,), "vec4"), ((64, 64), (1,), "vec4"),
                              ((3000, 256), (0,), "vec4"), ((3000, 8), (0,), "group")):
        desc = dml.ReduceOperatorDesc("sum", dml.TensorDesc("float32", shape),
                                      dml.TensorDesc("float32", tuple(
                                          1 if a in axes else n for a, n in enumerate(shape))),
                                      axes)
        op = CompiledReduce(device, desc, path="auto")
        assert op.path == want
        op.release()


def test_tensor_in_tensor_out(device):
    t = vkml.tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device=device)
    y = vkml.reduce(t, "max", axes=-1)
    assert isinstance(y, vkml.Tensor) and y.shape == (3, 1)
    np.testing.assert_array_equal(y.numpy(), [[3], [7], [11]])
    np.testing.assert_array_equal(vkml.reduce(t, "sum").numpy(), [[66]])


def test_no_leak_and_threads(device):
    from helpers import run_in_threads

    desc = dml.ReduceOperatorDesc("argmax", dml.TensorDesc("float32", (4, 6)),
                                  dml.TensorDesc("uint32", (4, 1)), (1,))
    x = device.tensor(np.arange(24, dtype=np.float32).reshape(4, 6))
    y = device.empty((4, 1), np.uint32)
    assert_no_leaks(device, operator_cycle(device, desc, [x], [y]), warm=1, rounds=30,
                    collect=False)
    assert y.numpy().ravel().tolist() == [5, 5, 5, 5]
    errors = []

    def work(k):
        rng = np.random.default_rng(k)
        for _ in range(3):
            a = rng.standard_normal((5, 33)).astype(np.float32)
            if not np.allclose(vkml.reduce(a, "sum", axes=1, device=device),
                               a.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-5):
                errors.append((k, "sum"))
    run_in_threads(work, errors)
    assert not errors, errors


def test_graph_node(device):
    """A graph: reduce SUM over the last axis, then MAX over the first."""
    T, N = dml.TensorDesc, dml.OperatorGraphNodeDesc
    a, b, c = T("float32", (3, 5)), T("float32", (3, 1)), T("float32", (1, 1))
    nodes = [N(dml.ReduceOperatorDesc("sum", a, b, (1,))),
             N(dml.ReduceOperatorDesc("max", b, c, (0,)))]
    g = dml.GraphDesc(1, 1, nodes, [dml.InputGraphEdgeDesc(0, 0, 0)],
                      [dml.OutputGraphEdgeDesc(1, 0, 0)],
                      [dml.IntermediateGraphEdgeDesc(0, 0, 1, 0)])
    cg = device.compile_graph(g)
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    out = device.empty((1, 1), np.float32)
    cg.execute([device.tensor(x)], [out])
    cg.release()
    assert out.numpy()[0, 0] == x.sum(axis=1).max()


# -- validation ---------------------------------------------------------------------------
def _desc(**kw):
    args = dict(function="sum", input_tensor=dml.TensorDesc("float32", (2, 3, 4)),
                output_tensor=dml.TensorDesc("float32", (2, 1, 4)), axes=(1,))
    args.update(kw)
    return dml.ReduceOperatorDesc(**args)


@pytest.mark.parametrize("kw,field", [
    (dict(output_tensor=dml.TensorDesc("float32", (2, 3, 4))), "output_tensor.sizes[1]"),
    (dict(output_tensor=dml.TensorDesc("float32", (2, 1, 5))), "output_tensor.sizes[2]"),
    (dict(output_tensor=dml.TensorDesc("float32", (2, 1))), "output_tensor.sizes"),
    (dict(axes=(3,)), "axes[0]"),
    (dict(axes=(1, 1)), "axes[1]"),
    (dict(axes=()), "axes"),
    (dict(axes=5), "axes"),
    (dict(function="median"), "function"),
    (dict(function=12), "function"),
    (dict(output_tensor=dml.TensorDesc("float16", (2, 1, 4))), "output_tensor.data_type"),
    (dict(function="argmax"), "output_tensor.data_type"),
    (dict(function="argmax", output_tensor=dml.TensorDesc("int16", (2, 1, 4))),
     "output_tensor.data_type"),
    (dict(function="average", input_tensor=dml.TensorDesc("int32", (2, 3, 4)),
          output_tensor=dml.TensorDesc("int32", (2, 1, 4))), "input_tensor.data_type"),
    (dict(function="sum", input_tensor=dml.TensorDesc("int8", (2, 3, 4)),
          output_tensor=dml.TensorDesc("int8", (2, 1, 4))), "input_tensor.data_type"),
    (dict(function="max", input_tensor=dml.TensorDesc("float64", (2, 3, 4)),
          output_tensor=dml.TensorDesc("float64", (2, 1, 4))), "input_tensor.data_type"),
    (dict(output_tensor=dml.TensorDesc("float32", (2, 1, 4), (4, 0, 0))),
     "output_tensor.strides"),
    (dict(input_tensor=None), "input_tensor"),
])
def test_validation_names_the_field(device, kw, field):
    with pytest.raises(ValidationError) as err:
        device.create_operator(_desc(**kw))
    assert f"ReduceOperatorDesc.{field}" in str(err.value)
    # the device is usable afterwards
    assert vkml.reduce(np.ones((2, 2), np.float32), "sum", device=device)[0, 0] == 4


def test_functional_argument_errors(device):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValidationError, match="axes"):
        vkml.reduce(x, "sum", axes=2, device=device)
    with pytest.raises(ValidationError, match="function"):
        vkml.reduce(x, "mean", device=device)
    with pytest.raises(ValidationError, match="x"):
        vkml.reduce(np.ones((1,) * 9, np.float32), "sum", device=device)
    with pytest.raises(ValidationError, match="output_tensor.data_type"):
        vkml.reduce(x, "argmax", output_type="int8", device=device)


def test_feature_levels():
    FL = dml.FeatureLevel
    assert _desc(input_tensor=dml.TensorDesc("float32", (2, 3, 4, 5)),
                 output_tensor=dml.TensorDesc("float32", (2, 1, 4, 5))
                 ).feature_level() == FL.FL_1_0
    assert _desc().feature_level() == FL.FL_3_0                  # 3 dimensions
    assert _desc(input_tensor=dml.TensorDesc("int64", (2, 3, 4)),
                 output_tensor=dml.TensorDesc("int64", (2, 1, 4))).feature_level() == FL.FL_5_0
    assert _desc(function="argmax", output_tensor=dml.TensorDesc("int64", (2, 1, 4))
                 ).feature_level() == FL.FL_3_0


# -- fuzzing ------------------------------------------------------------------------------
@st.composite
def reduce_cases(draw):
    rank = draw(st.integers(1, 8))
    shape = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    fn = draw(st.sampled_from(FUNCS))
    types = ["float32", "float16"] + [t for t in INTS if allowed(fn, t)]
    return dict(shape=shape, axes=axes, fn=fn, dtype=draw(st.sampled_from(types)),
                mutation=draw(st.sampled_from(["none"] * 8 + ["out", "axis", "dup", "type"])),
                layout=draw(st.sampled_from(LAYOUTS)), out_padded=draw(st.booleans()),
                seed=draw(st.integers(0, 2**31)))


def test_fuzz_reduce(device, speed):
    """Fuzzed reduce descriptors (fuzzing.py): every function, 1-8 dimensions, any axes,
    layouts and types, one broken rule at a time; canaries after every buffer."""
    @settings(fuzz_settings(speed), max_examples=max(20, fuzz_examples(speed) // 2))
    @given(reduce_cases())
    def one(case):
        rng = np.random.default_rng(case["seed"])
        m, fn, dtype = case["mutation"], case["fn"], case["dtype"]
        shape, axes = case["shape"], list(case["axes"])
        out = [1 if a in axes else n for a, n in enumerate(shape)]
        out_type = "uint32" if fn.startswith("arg") else dtype
        want = {"out": ["output_tensor.sizes"], "axis": ["axes"], "dup": ["axes"],
                "type": ["data_type"]}.get(m, [])
        if m == "out":
            out[-1] += 1
        if m == "axis":
            axes[-1] = len(shape)
        if m == "dup":
            axes.append(axes[0])
        if m == "type":
            out_type = "int8" if fn.startswith("arg") else "float64"
        x = random_input(rng, tuple(shape), dtype, fn)
        flat, in_strides, x = lay_out(rng, x, case["layout"])
        out_strides, read = padded_output(rng, out, out_type, case["out_padded"])
        desc, compiled = compiled_or_refused(device, lambda: dml.ReduceOperatorDesc(
            fn, dml.TensorDesc(dtype, shape, in_strides),
            dml.TensorDesc(out_type, out, out_strides), tuple(axes)), want)
        if desc is None:
            return
        src, dst = execute_with_canaries(device, compiled, desc, flat)
        got, gaps = read(dst)
        check(got, x, fn, axes)
        assert gaps, "wrote into the gaps of a non-packed output"
        assert canaries_intact(src) and canaries_intact(dst), "wrote outside the tensor"

    one()


@pytest.mark.parametrize("read", ["texel", "ssbo"])
def test_read_paths(device, read):
    """float32 through an R32F texel buffer (the rule where the input fits
    maxTexelBufferElements) and from a storage buffer (forced), on both paths."""
    from vkml.ops.reduce import CompiledReduce

    rng = np.random.default_rng(32)
    x = rng.standard_normal((6, 50, 7)).astype(np.float32)
    for path in ("lane", "group"):
        for fn in ("sum", "argmax"):
            ot = "uint32" if fn == "argmax" else "float32"
            desc = dml.ReduceOperatorDesc(fn, dml.TensorDesc("float32", x.shape),
                                          dml.TensorDesc(ot, (6, 1, 1)), (1, 2))
            op = CompiledReduce(device, desc, path=path, read=None if read == "texel" else read)
            assert op.read == read and op.path == path
            y = device.empty((6, 1, 1), ot)
            op.execute([device.tensor(x)], [y])
            op.release()
            check(y.numpy(), x, fn, (1, 2))


def test_group_workgroup_fits_the_reduction(device):
    """"group" runs count / GROUP_WALK lanes (a power of 2, at most 256 and the device's
    workgroup size): a short reduction does not idle a wide workgroup through the tree."""
    from vkml.ops.reduce import GROUP_WALK, CompiledReduce

    lim = device.context.limits
    cap = min(256, lim["maxComputeWorkGroupInvocations"], lim["maxComputeWorkGroupSize"][0])
    for count, want in ((112, 4), (64, 4), (1000, 32), (4096, 256), (1 << 18, 256)):
        desc = dml.ReduceOperatorDesc("sum", dml.TensorDesc("float32", (3, count)),
                                      dml.TensorDesc("float32", (3, 1)), (1,))
        op = CompiledReduce(device, desc, path="group")
        assert op.path == "group"
        assert op.group_local == min(want, 1 << (cap.bit_length() - 1)), count
        assert op.group_local * GROUP_WALK <= max(count, GROUP_WALK * 4)
        op.release()

"""DML_MAX_POOLING(1,2)_OPERATOR_DESC, DML_AVERAGE_POOLING(1)_OPERATOR_DESC,
vkml.max_pooling and vkml.average_pooling.

References: float64 NumPy written from the pages over ``window_taps`` (the windows' taps
in row-major order, padding skipped: the first maximum wins, its index numbering the
input as a packed 1-D array), and PyTorch's ``max_pool2d/3d`` (``return_indices``,
``ceil_mode``, dilations) and ``avg_pool2d/3d`` (``count_include_pad``) where their
semantics coincide (symmetric padding of at most half the window).

Tolerances: max pooling is exact (a selection; indices equal); average pooling float32
within 2^-20 of the mean of |x| over the window (float32 sums of a few terms), float16
within one float16 ulp of the float64 mean plus that.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vkml
from vkml import dml
from vkml.errors import UnsupportedError, ValidationError

from hypothesis import given
from hypothesis import strategies as st

from fuzzing import (LAYOUTS, canaries_intact, compiled_or_refused, execute_with_canaries,
                     fuzz_settings, lay_out, padded_output, window_geometry)
from helpers import (POOLING_DESC_ARGS, POOLING_WINDOW_CASES, assert_no_leaks, operator_cycle,
                     random_bits, random_pooling_case, run_two_node_graph, split_grid_windows)
from references import window_counts, window_taps

INT_TYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


def _taps(x, window, strides, dil, start, end):
    outs = window_counts(x.shape[2:], window, strides, dil, start, end)
    return outs, list(window_taps(x.shape[2:], outs, window, strides, dil, start))


def max_reference(x, window, strides, dil, start, end):
    """(maximum, index): the first greatest element of each window (NaN beats numbers),
    the type's lowest and index 0 where the window lies wholly in the padding."""
    outs, taps = _taps(x, window, strides, dil, start, end)
    shape = x.shape[:2] + tuple(outs)
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    best = np.full(shape, low, x.dtype)
    idx = np.zeros(shape, np.int64)
    found = np.zeros(shape, bool)
    flat = np.arange(x.size, dtype=np.int64).reshape(x.shape)
    for _, o_sl, i_sl in taps:
        at = (slice(None), slice(None)) + o_sl
        src = (slice(None), slice(None)) + i_sl
        v, b = x[src], best[at]
        greater = v > b
        if x.dtype.kind == "f":
            greater |= np.isnan(v) & ~np.isnan(b)
        take = ~found[at] | greater
        best[at] = np.where(take, v, b)
        idx[at] = np.where(take, flat[src], idx[at])
        found[at] = True
    return best, idx


def average_reference(x, window, strides, dil, start, end, include_padding):
    """(mean, mean of |x|) in float64; the divisor the whole window or the cells in the
    input (0 where none)."""
    outs, taps = _taps(x, window, strides, dil, start, end)
    shape = x.shape[:2] + tuple(outs)
    total, mag, count = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    xf = x.astype(np.float64)
    for _, o_sl, i_sl in taps:
        at = (slice(None), slice(None)) + o_sl
        v = xf[(slice(None), slice(None)) + i_sl]
        total[at] += v
        mag[at] += np.abs(v)
        count[at] += 1
    div = np.full(shape, float(math.prod(window))) if include_padding else count
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(div > 0, total / div, 0.0), np.where(div > 0, mag / div, 0.0)


def assert_mean_close(got, ref, mag, dtype):
    err = np.abs(got.astype(np.float64) - ref)
    bound = mag * 2.0 ** -20 + 1e-30
    if np.dtype(dtype) == np.float16:
        bound = bound + np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64)
    assert np.all(err <= bound), (err - bound).max()


def random_case(rng, dims, max_elems):
    return random_pooling_case(rng, dims, max_elems, window_below=4, spread=(10, 5))


def random_input(rng, shape, dtype):
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(shape) * 3).astype(dtype)
    return random_bits(rng, shape, dtype)


# -- max pooling --------------------------------------------------------------------------
@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "uint16", "int32", "uint64"])
def test_max_random_against_numpy(device, budget, dims, dtype):
    rng = np.random.default_rng(dims * 100 + len(dtype))
    for case in range(max(2, budget // 3)):
        shape, window, strides, start, end, dil = random_case(rng, dims, 4000)
        x = random_input(rng, shape, dtype)
        itype = ("uint32", "uint64")[case % 2]
        got, idx = vkml.max_pooling(x, window, strides=strides, start_padding=start,
                                    end_padding=end, dilations=dil, return_indices=True,
                                    indices_type=itype, device=device)
        want, want_idx = max_reference(x, window, strides, dil, start, end)
        assert got.dtype == x.dtype and idx.dtype == np.dtype(itype)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(idx.astype(np.int64), want_idx)


@pytest.mark.parametrize("dtype", INT_TYPES)
def test_max_every_integer_type(device, dtype):
    """Every integer type (32-bit words on every device), extremes included."""
    rng = np.random.default_rng(len(dtype))
    x = random_bits(rng, (2, 3, 5, 7), dtype)
    info = np.iinfo(dtype)
    x[0, 0, 0, :3] = [info.min, info.max, info.min]
    got = vkml.max_pooling(x, (2, 3), strides=(1, 2), start_padding=1, device=device)
    np.testing.assert_array_equal(got, max_reference(x, (2, 3), (1, 2), (1, 1), (1, 1),
                                                     (0, 0))[0])


@pytest.mark.parametrize("dims", [2, 3])
def test_max_against_torch(device, budget, dims):
    """torch max_pool2d/3d with return_indices, dilation and ceil_mode (its indices count
    within each (n, c) plane: vkml's minus the plane's start)."""
    rng = np.random.default_rng(7 + dims)
    pool = F.max_pool2d if dims == 2 else F.max_pool3d
    for case in range(max(3, budget // 3)):
        window = [int(rng.integers(1, 4)) for _ in range(dims)]
        pad = [int(rng.integers(0, w // 2 + 1)) for w in window]
        dil = [int(rng.integers(1, 3)) for _ in range(dims)]
        strides = [int(rng.integers(1, 4)) for _ in range(dims)]
        spatial = [d * (w - 1) + 1 + int(rng.integers(0, 8 if dims == 2 else 4))
                   for w, d in zip(window, dil)]
        x = rng.standard_normal((2, 3, *spatial)).astype(np.float32)
        ceil = bool(case % 2)
        got, idx = vkml.max_pooling(x, window, strides=strides, start_padding=pad,
                                    end_padding=pad, dilations=dil, ceil_mode=ceil,
                                    return_indices=True, device=device)
        ref, ridx = pool(torch.from_numpy(x), window, strides, pad, dil, ceil_mode=ceil,
                         return_indices=True)
        np.testing.assert_array_equal(got, ref.numpy())
        plane = math.prod(spatial)
        starts = (np.arange(6).reshape(2, 3) * plane).reshape(2, 3, *([1] * dims))
        np.testing.assert_array_equal(idx.astype(np.int64), ridx.numpy() + starts)


def test_max_ties_nan_and_padding(device):
    """Ties: the first (row-major window order) wins; NaN beats every number (the first
    NaN wins); -inf inputs beat padding; a window wholly in the padding gives -inf."""
    x = np.array([[[[1, 3, 3], [3, -np.inf, np.nan], [2, np.nan, 0]]]], np.float32)
    y, i = vkml.max_pooling(x, 2, return_indices=True, device=device)
    np.testing.assert_array_equal(y, [[[[3, np.nan], [np.nan, np.nan]]]])
    np.testing.assert_array_equal(i, [[[[1, 5], [7, 5]]]])
    x = np.full((1, 1, 2, 2), -np.inf, np.float32)
    y, i = vkml.max_pooling(x, 2, start_padding=1, end_padding=1, return_indices=True,
                            device=device)
    np.testing.assert_array_equal(i, [[[[0, 0, 1], [0, 0, 1], [2, 2, 3]]]])
    assert np.all(y == -np.inf)
    x = np.ones((1, 1, 2, 2), np.float32)
    y, i = vkml.max_pooling(x, 1, strides=3, start_padding=2, end_padding=1,
                            return_indices=True, device=device)
    np.testing.assert_array_equal(y, [[[[-np.inf, -np.inf], [-np.inf, 1]]]])
    np.testing.assert_array_equal(i, [[[[0, 0], [0, 3]]]])


# -- average pooling ----------------------------------------------------------------------
@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_average_random_against_numpy(device, budget, dims, dtype):
    rng = np.random.default_rng(dims * 10 + len(dtype))
    for case in range(max(2, budget // 2)):
        shape, window, strides, start, end, dil = random_case(rng, dims, 6000)
        x = random_input(rng, shape, dtype)
        inc = bool(case % 2)
        got = vkml.average_pooling(x, window, strides=strides, start_padding=start,
                                   end_padding=end, dilations=dil, include_padding=inc,
                                   device=device)
        ref, mag = average_reference(x, window, strides, dil, start, end, inc)
        assert got.dtype == x.dtype
        assert_mean_close(got, ref, mag, dtype)


@pytest.mark.parametrize("dims", [2, 3])
def test_average_against_torch(device, budget, dims):
    rng = np.random.default_rng(70 + dims)
    pool = F.avg_pool2d if dims == 2 else F.avg_pool3d
    for case in range(max(3, budget // 3)):
        window = [int(rng.integers(1, 4)) for _ in range(dims)]
        pad = [int(rng.integers(0, w // 2 + 1)) for w in window]
        strides = [int(rng.integers(1, 4)) for _ in range(dims)]
        spatial = [w + int(rng.integers(0, 8 if dims == 2 else 4)) for w in window]
        x = rng.standard_normal((2, 3, *spatial)).astype(np.float32)
        inc = bool(case % 2)
        ceil = not inc and case % 3 == 0      # ceil mode: divisors agree without padding
        got = vkml.average_pooling(x, window, strides=strides, start_padding=pad,
                                   end_padding=pad, include_padding=inc, ceil_mode=ceil,
                                   device=device)
        ref = pool(torch.from_numpy(x).double(), window, strides, pad, ceil_mode=ceil,
                   count_include_pad=inc).numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_average_page_divisors(device):
    """IncludePadding counts the whole window, else the cells in the input; a window
    wholly in the padding averages nothing: 0."""
    x = np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3)
    inc = vkml.average_pooling(x, 2, start_padding=1, include_padding=True, device=device)
    exc = vkml.average_pooling(x, 2, start_padding=1, include_padding=False, device=device)
    np.testing.assert_allclose(inc[0, 0, 0], [1 / 4, 3 / 4, 5 / 4])
    np.testing.assert_allclose(exc[0, 0, 0], [1, 1.5, 2.5])
    z = vkml.average_pooling(x, 1, strides=4, start_padding=1, device=device)
    np.testing.assert_array_equal(z, [[[[0]]]])


# -- global pooling ---------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["max", "average"])
def test_global_pooling_runs_as_a_reduction(device, kind):
    from vkml.ops.pooling import CompiledPooling

    rng = np.random.default_rng(3)
    for shape in ((2, 3, 7, 9), (1, 2, 3, 4, 5)):
        for dtype in ("float32", "float16"):
            x = rng.standard_normal(shape).astype(dtype)
            n = len(shape) - 2
            osz = shape[:2] + (1,) * n
            cls = dml.MaxPooling2OperatorDesc if kind == "max" else \
                dml.AveragePooling1OperatorDesc
            desc = cls(dml.TensorDesc(dtype, shape), dml.TensorDesc(dtype, osz),
                       window_size=shape[2:])
            results = []
            for path in (None, "window"):
                op = CompiledPooling(device, desc, path=path)
                assert (op.inner is not None) == (path is None)
                y = device.empty(osz, dtype)
                op.execute([device.tensor(x)], [y])
                op.release()
                results.append(y.numpy())
            axes = tuple(range(2, len(shape)))
            if kind == "max":
                want = x.max(axis=axes, keepdims=True)
                for r in results:
                    np.testing.assert_array_equal(r, want)
            else:
                want = x.astype(np.float64).mean(axis=axes, keepdims=True)
                mag = np.abs(x.astype(np.float64)).mean(axis=axes, keepdims=True)
                for r in results:
                    assert_mean_close(r, want, mag, dtype)


# -- layouts, devices, limits -----------------------------------------------------------
@pytest.mark.parametrize("kind", ["padded", "permuted", "broadcast"])
def test_strided_inputs_and_outputs(device, kind):
    """Non-packed inputs (zero strides included) and outputs with gaps, written inside
    the output tensor only (canaries after it)."""
    rng = np.random.default_rng(len(kind))
    for dtype in ("float32", "float16", "int16"):
        x = random_input(rng, (2, 3, 6, 7), dtype)
        flat, in_strides, x = lay_out(rng, x, kind)
        out = [2, 3, 4, 4]
        out_strides, read = padded_output(rng, out, dtype, True)
        for avg in ((False, True) if dtype != "int16" else (False,)):
            cls = dml.AveragePooling1OperatorDesc if avg else dml.MaxPooling2OperatorDesc
            desc = cls(dml.TensorDesc(dtype, x.shape, in_strides),
                       dml.TensorDesc(dtype, out, out_strides), strides=(2, 2),
                       window_size=(2, 2), start_padding=(1, 1), end_padding=(1, 0))
            compiled = device.compile_operator(device.create_operator(desc))
            src, dst = execute_with_canaries(device, compiled, desc, flat)
            got, gaps = read(dst)
            if avg:
                ref, mag = average_reference(x, (2, 2), (2, 2), (1, 1), (1, 1), (1, 0), False)
                assert_mean_close(got, ref, mag, dtype)
            else:
                np.testing.assert_array_equal(
                    got, max_reference(x, (2, 2), (2, 2), (1, 1), (1, 1), (1, 0))[0])
            assert gaps and canaries_intact(src) and canaries_intact(dst)


def test_strided_indices_tensor(device):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    osz, ist = (1, 2, 2, 2), (16, 8, 4, 2)
    desc = dml.MaxPooling1OperatorDesc(
        dml.TensorDesc("float32", x.shape), dml.TensorDesc("float32", osz),
        dml.TensorDesc("uint32", osz, ist), (2, 2), (2, 2), (0, 0), (0, 0))
    op = device.compile_operator(device.create_operator(desc))
    y, i = device.empty(osz, np.float32), device.tensor(np.full(32, 7, np.uint32))
    op.execute([device.tensor(x)], [y, i])
    op.release()
    raw = i.numpy()
    want, want_idx = max_reference(x, (2, 2), (2, 2), (1, 1), (0, 0), (0, 0))
    np.testing.assert_array_equal(y.numpy(), want)
    at = np.ravel(np.tensordot(np.indices(osz), np.array(ist), axes=(0, 0)))
    np.testing.assert_array_equal(raw[at], want_idx.ravel())
    gaps = np.ones(32, bool)
    gaps[at] = False
    assert np.all(raw[gaps] == 7)


def test_packed_float16(device):
    with vkml.Device(device.index, disable_features=["storage16"]) as dev:
        rng = np.random.default_rng(12)
        x = rng.standard_normal((2, 3, 7, 9)).astype(np.float16)
        got = vkml.max_pooling(x, (2, 3), strides=(1, 2), start_padding=1, device=dev)
        np.testing.assert_array_equal(
            got, max_reference(x, (2, 3), (1, 2), (1, 1), (1, 1), (0, 0))[0])
        got = vkml.average_pooling(x, (2, 3), strides=(1, 2), start_padding=1, device=dev)
        assert_mean_close(got, *average_reference(x, (2, 3), (1, 2), (1, 1), (1, 1), (0, 0),
                                                  False), "float16")


def test_windows_beyond_max_storage_buffer_range(device):
    with vkml.Device(device.index, limits={"maxStorageBufferRange": 4096}) as small:
        rng = np.random.default_rng(13)
        for dtype, shape in (("float32", (2, 3, 20, 30)), ("int8", (1, 2, 6, 20, 30)),
                             ("float16", (1, 2, 6, 20, 30))):
            x = random_input(rng, shape, dtype)
            d = len(shape) - 2
            geo = ((3,) * d, (2,) * d, (1,) * d, (1,) * d, (1,) * d)
            got = vkml.max_pooling(x, geo[0], strides=2, start_padding=1, end_padding=1,
                                   device=small)
            np.testing.assert_array_equal(got, max_reference(x, *geo)[0])
            if dtype != "int8":
                got = vkml.average_pooling(x, geo[0], strides=2, start_padding=1,
                                           end_padding=1, device=small)
                assert_mean_close(got, *average_reference(x, *geo, False), dtype)
        x = np.zeros((1, 1, 40, 40), np.float32)     # indices beyond the range: refused
        with pytest.raises(UnsupportedError):
            vkml.max_pooling(x, 1, return_indices=True, indices_type="uint64", device=small)
        assert vkml.max_pooling(x, 2, device=small).shape == (1, 1, 39, 39)


def test_windows_beyond_the_loop_limit(device):
    """A window (not the global one, which runs as a reduction) of more than MAX_WINDOW
    positions that reach the input is refused on every device alike; one of exactly that
    many runs."""
    x = np.ones((1, 1, 300, 301), np.float32)
    with pytest.raises(UnsupportedError, match=r"window_size \(300, 300\)"):
        vkml.max_pooling(x, (300, 300), device=device)
    got = vkml.average_pooling(x[:, :, :255, :258], (255, 257), device=device)
    np.testing.assert_array_equal(got, np.ones((1, 1, 1, 2), np.float32))


def test_grids_beyond_max_workgroup_count(device):
    for dev, x, window in split_grid_windows(device):
        d = len(window)
        geo = (window, (1,) * d, (1,) * d, (1,) * d, (0,) * d)
        got, idx = vkml.max_pooling(x, window, start_padding=1, return_indices=True,
                                    device=dev)
        want, want_idx = max_reference(x, *geo)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(idx, want_idx)
        got = vkml.average_pooling(x, window, start_padding=1, device=dev)
        assert_mean_close(got, *average_reference(x, *geo, False), "float32")


def test_tensor_in_tensor_out(device):
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    t = vkml.tensor(x, device=device)
    y = vkml.max_pooling(t, 2, strides=2)
    assert isinstance(y, vkml.Tensor) and y.shape == (1, 1, 2, 2)
    np.testing.assert_array_equal(y.numpy(), [[[[5, 7], [13, 15]]]])
    y, i = vkml.max_pooling(t, 2, strides=2, return_indices=True)
    assert isinstance(i, vkml.Tensor)
    np.testing.assert_array_equal(i.numpy(), [[[[5, 7], [13, 15]]]])
    a = vkml.average_pooling(t, 2, strides=2)
    np.testing.assert_array_equal(a.numpy(), [[[[2.5, 4.5], [10.5, 12.5]]]])


def test_no_leak_and_threads(device):
    """Create/compile/execute/release cycles leave the device's memory as it was; eight
    threads pooling at once get their own answers."""
    from helpers import run_in_threads

    desc = dml.MaxPooling2OperatorDesc(
        dml.TensorDesc("float32", (1, 2, 5, 5)), dml.TensorDesc("float32", (1, 2, 2, 2)),
        dml.TensorDesc("uint32", (1, 2, 2, 2)), (2, 2), (3, 3), (0, 0), (0, 0), (1, 1))
    x = device.tensor(np.arange(50, dtype=np.float32).reshape(1, 2, 5, 5))
    y, i = device.empty((1, 2, 2, 2), np.float32), device.empty((1, 2, 2, 2), np.uint32)
    assert_no_leaks(device, operator_cycle(device, desc, [x], [y, i]), warm=1, rounds=30,
                    collect=False)
    np.testing.assert_array_equal(y.numpy().ravel(), [12, 14, 22, 24, 37, 39, 47, 49])
    errors = []

    def work(k):
        rng = np.random.default_rng(k)
        for _ in range(3):
            a = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
            got = vkml.average_pooling(a, 2, strides=2, device=device)
            want = a.reshape(1, 2, 3, 2, 3, 2).mean(axis=(3, 5))
            if not np.allclose(got, want, rtol=1e-6, atol=1e-6):
                errors.append((k, "average"))
            if not np.array_equal(vkml.max_pooling(a, 3, device=device),
                                  max_reference(a, (3, 3), (1, 1), (1, 1), (0, 0), (0, 0))[0]):
                errors.append((k, "max"))
    run_in_threads(work, errors)
    assert not errors, errors


def test_graph_node(device):
    """A graph of pooling nodes: max pooling then average pooling."""
    T = dml.TensorDesc
    a, b, c = T("float32", (1, 2, 6, 6)), T("float32", (1, 2, 3, 3)), T("float32", (1, 2, 2, 2))
    x = np.random.default_rng(1).standard_normal((1, 2, 6, 6)).astype(np.float32)
    got = run_two_node_graph(
        device, dml.MaxPoolingOperatorDesc(a, b, (2, 2), (2, 2), (0, 0), (0, 0)),
        dml.AveragePoolingOperatorDesc(b, c, (1, 1), (2, 2), (0, 0), (0, 0), False), [x],
        (1, 2, 2, 2))
    m = x.reshape(1, 2, 3, 2, 3, 2).max(axis=(3, 5))
    want = np.stack([m[..., i:i + 2, j:j + 2].mean(axis=(2, 3))
                     for i in range(2) for j in range(2)], -1).reshape(1, 2, 2, 2)
    np.testing.assert_allclose(got, want, rtol=1e-6)


# -- validation ---------------------------------------------------------------------------
_CLASSES = [dml.MaxPoolingOperatorDesc, dml.MaxPooling1OperatorDesc, dml.MaxPooling2OperatorDesc,
            dml.AveragePoolingOperatorDesc, dml.AveragePooling1OperatorDesc]


def _desc(cls, **kw):
    kw = dict(kw)
    args = dict(POOLING_DESC_ARGS)
    if cls not in (dml.MaxPooling2OperatorDesc, dml.AveragePooling1OperatorDesc):
        args.pop("dilations")
        kw = {k: v for k, v in kw.items() if k != "dilations"}
    if "indices" in kw:
        if cls not in (dml.MaxPooling1OperatorDesc, dml.MaxPooling2OperatorDesc):
            return None
        args["output_indices_tensor"] = kw.pop("indices")
    if "include_padding" in kw and cls not in (dml.AveragePoolingOperatorDesc,
                                               dml.AveragePooling1OperatorDesc):
        return None
    args.update(kw)
    return cls(**args)


@pytest.mark.parametrize("kw,field", POOLING_WINDOW_CASES + [
    (dict(input_tensor=dml.TensorDesc("float64", (1, 2, 8, 8)),
          output_tensor=dml.TensorDesc("float64", (1, 2, 4, 4))), "input_tensor.data_type"),
    (dict(indices=dml.TensorDesc("int32", (1, 2, 4, 4))), "output_indices_tensor.data_type"),
    (dict(indices=dml.TensorDesc("uint32", (1, 2, 4, 5))), "output_indices_tensor.sizes"),
    (dict(indices=dml.TensorDesc("uint32", (1, 2, 4, 4, 1))), "output_indices_tensor.sizes"),
    (dict(indices=dml.TensorDesc("uint32", (1, 2, 4, 4), (32, 16, 0, 1))),
     "output_indices_tensor.strides"),
    (dict(include_padding=1), "include_padding"),
])
@pytest.mark.parametrize("cls", _CLASSES, ids=lambda c: c.__name__)
def test_validation_names_the_field(device, cls, kw, field):
    desc = _desc(cls, **kw)
    if desc is None or ("dilations" in kw and not hasattr(desc, "dilations")):
        pytest.skip(f"{cls.__name__} has no such field")
    with pytest.raises(ValidationError) as err:
        device.create_operator(desc)
    assert f"{cls.__name__}.{field}" in str(err.value)


def test_integer_types_are_max_only(device):
    for cls in (dml.AveragePoolingOperatorDesc, dml.AveragePooling1OperatorDesc):
        desc = _desc(cls, input_tensor=dml.TensorDesc("int32", (1, 2, 8, 8)),
                     output_tensor=dml.TensorDesc("int32", (1, 2, 4, 4)))
        with pytest.raises(ValidationError, match="input_tensor.data_type"):
            device.create_operator(desc)
    device.create_operator(_desc(dml.MaxPoolingOperatorDesc,
                                 input_tensor=dml.TensorDesc("int8", (1, 2, 8, 8)),
                                 output_tensor=dml.TensorDesc("int8", (1, 2, 4, 4))))


def test_functional_argument_errors(device):
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(ValidationError, match="x"):
        vkml.max_pooling(np.zeros((4, 4), np.float32), 2, device=device)
    with pytest.raises(ValidationError, match="window_size"):
        vkml.average_pooling(x, 5, device=device)
    with pytest.raises(ValidationError, match="data_type"):
        vkml.average_pooling(x.astype(np.int32), 2, device=device)
    with pytest.raises(ValidationError, match="output_indices_tensor"):
        vkml.max_pooling(x, 2, return_indices=True, indices_type="int64", device=device)
    # the device is usable afterwards
    np.testing.assert_array_equal(vkml.max_pooling(x + 1, 2, device=device), np.ones((1, 1, 3, 3)))


def test_feature_levels():
    FL = dml.FeatureLevel
    assert _desc(dml.MaxPoolingOperatorDesc).feature_level() == FL.FL_1_0
    assert _desc(dml.MaxPooling1OperatorDesc).feature_level() == FL.FL_2_0
    assert _desc(dml.MaxPooling2OperatorDesc).feature_level() == FL.FL_2_1
    assert _desc(dml.AveragePoolingOperatorDesc).feature_level() == FL.FL_1_0
    assert _desc(dml.AveragePooling1OperatorDesc).feature_level() == FL.FL_6_2
    i8 = dict(input_tensor=dml.TensorDesc("int8", (1, 2, 8, 8)),
              output_tensor=dml.TensorDesc("int8", (1, 2, 4, 4)))
    assert _desc(dml.MaxPoolingOperatorDesc, **i8).feature_level() == FL.FL_3_0
    i32 = dict(input_tensor=dml.TensorDesc("int32", (1, 2, 8, 8)),
               output_tensor=dml.TensorDesc("int32", (1, 2, 4, 4)))
    assert _desc(dml.MaxPoolingOperatorDesc, **i32).feature_level() == FL.FL_5_0
    assert _desc(dml.MaxPooling2OperatorDesc, indices=dml.TensorDesc(
        "uint64", (1, 2, 4, 4))).feature_level() == FL.FL_5_0


# -- fuzzing ------------------------------------------------------------------------------
@st.composite
def pooling_cases(draw):
    g = window_geometry(draw, draw(st.integers(2, 3)))
    spatial = g.pop("spatial")
    return dict(shape=[draw(st.integers(1, 2)), draw(st.integers(1, 3))] + spatial, **g,
                kind=draw(st.sampled_from(["max", "max_idx", "avg", "avg_inc"])),
                dtype=draw(st.sampled_from(["float32", "float16", "int8", "uint16",
                                            "int32", "int64"])),
                mutation=draw(st.sampled_from(["none"] * 8 + ["out", "stride0", "f64",
                                                              "rank3", "idx"])),
                layout=draw(st.sampled_from(LAYOUTS)), out_padded=draw(st.booleans()),
                seed=draw(st.integers(0, 2**31)))


def test_fuzz_pooling(device, speed):
    """Fuzzed max/average pooling descriptors (fuzzing.py): valid ones against the
    reference with canaries after every buffer and in the output's gaps, invalid ones
    (one broken rule at a time) refused naming the field."""
    @fuzz_settings(speed)
    @given(pooling_cases())
    def check(case):
        rng = np.random.default_rng(case["seed"])
        m, kind, dtype = case["mutation"], case["kind"], case["dtype"]
        if kind.startswith("avg") and dtype not in ("float32", "float16"):
            dtype = "float32"
        shape, strides = list(case["shape"]), list(case["strides"])
        geo = (case["window"], strides, case["dilations"], case["start"], case["end"])
        out = shape[:2] + window_counts(shape[2:], *geo[:1], strides, *geo[2:])
        want = {"out": ["output_tensor.sizes"], "stride0": ["strides"], "f64": ["data_type"],
                "rank3": ["input_tensor.sizes", "window_size", "output_tensor.sizes"],
                "idx": ["output_indices_tensor"]}.get(m, [])
        if m == "out":
            out[-1] += 1
        if m == "stride0":
            strides[0] = 0
        if m == "rank3":
            shape, out = shape[:3], out[:3]
        if m == "idx" and kind != "max_idx":
            want = []
        x = random_input(rng, shape, dtype)
        flat, in_strides, x = lay_out(rng, x, case["layout"])
        out_strides, read = padded_output(rng, out, dtype,
                                          case["out_padded"] and kind != "max_idx")
        t = "float64" if m == "f64" else dtype
        idx = None
        if kind == "max_idx":
            idx = dml.TensorDesc("int32" if m == "idx" else "uint32", out)

        def make():
            src, dst = dml.TensorDesc(t, shape, in_strides), dml.TensorDesc(t, out, out_strides)
            tail = (strides, case["window"], case["start"], case["end"], case["dilations"])
            if kind.startswith("max"):
                return dml.MaxPooling2OperatorDesc(src, dst, idx, *tail)
            return dml.AveragePooling1OperatorDesc(src, dst, *tail, kind == "avg_inc")
        desc, compiled = compiled_or_refused(device, make, want)
        if desc is None:
            return
        if idx is not None:            # indices: compared, not canaried
            y, i = device.empty(out, dtype), device.empty(out, np.uint32)
            compiled.execute([device.tensor(flat)], [y, i])
            compiled.release()
            ref, ref_idx = max_reference(x, *geo)
            np.testing.assert_array_equal(y.numpy(), ref)
            np.testing.assert_array_equal(i.numpy(), ref_idx)
            return
        src, dst = execute_with_canaries(device, compiled, desc, flat)
        got, gaps = read(dst)
        if kind == "max":
            np.testing.assert_array_equal(got, max_reference(x, *geo)[0])
        else:
            assert_mean_close(got, *average_reference(x, *geo, kind == "avg_inc"), dtype)
        assert gaps, "wrote into the gaps of a non-packed output"
        assert canaries_intact(src) and canaries_intact(dst), "wrote outside the tensor"

    check()


@pytest.mark.parametrize("read", ["texel", "ssbo"])
def test_read_paths(device, read):
    """float32 through an R32F texel buffer (the rule where the input fits
    maxTexelBufferElements) and from a storage buffer (forced), max with indices and
    average."""
    from vkml.ops.pooling import CompiledPooling

    rng = np.random.default_rng(31)
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    geo = ((3, 2), (2, 1), (1, 2), (1, 0), (0, 1))
    out = (2, 3) + tuple(window_counts(x.shape[2:], geo[0], geo[1], geo[2], geo[3], geo[4]))
    T = dml.TensorDesc
    for desc in (dml.MaxPooling2OperatorDesc(T("float32", x.shape), T("float32", out),
                                             T("uint32", out), geo[1], geo[0], geo[3], geo[4],
                                             geo[2]),
                 dml.AveragePooling1OperatorDesc(T("float32", x.shape), T("float32", out),
                                                 geo[1], geo[0], geo[3], geo[4], geo[2], True)):
        op = CompiledPooling(device, desc, read=None if read == "texel" else read)
        assert op.read == read
        outs = [device.empty(o.sizes, o.data_type.numpy) for o in desc.outputs()]
        op.execute([device.tensor(x)], outs)
        op.release()
        if len(outs) == 2:
            want, want_idx = max_reference(x, *geo)
            np.testing.assert_array_equal(outs[0].numpy(), want)
            np.testing.assert_array_equal(outs[1].numpy(), want_idx)
        else:
            assert_mean_close(outs[0].numpy(), *average_reference(x, *geo, True), "float32")


# -- the "rows" kernel (glsl/pooling_rows.comp) -------------------------------------------
def _run_path(device, desc, x, path, read=None):
    """Run ``desc`` on ``x`` with CompiledPooling forced to ``path``: (op.path, outputs)."""
    from vkml.ops.pooling import CompiledPooling

    op = CompiledPooling(device, desc, path=path, read=read)
    outs = [device.empty(o.sizes, o.data_type.numpy) for o in desc.outputs()]
    op.execute([device.tensor(x)], outs)
    op.release()
    return op.path, [o.numpy() for o in outs]


def _rows_case(rng, dims):
    """A geometry whose last window row fits the rows kernel (T <= 32 for one output),
    rows of 1 to about 30 outputs (V = 8, 4 and 1, tails)."""
    window = [int(rng.integers(1, 4)) for _ in range(dims - 1)] + [int(rng.integers(1, 7))]
    strides = [int(rng.integers(1, 4)) for _ in range(dims)]
    dil = [int(rng.integers(1, 3)) for _ in range(dims - 1)] + [int(rng.integers(1, 4))]
    start = [int(rng.integers(0, 3)) for _ in range(dims)]
    end = [int(rng.integers(0, 3)) for _ in range(dims)]
    lo = [max(1, d * (w - 1) + 1 - a - b) for w, d, a, b in zip(window, dil, start, end)]
    spatial = [int(rng.integers(l, l + 6)) for l in lo[:-1]] + [int(rng.integers(lo[-1],
                                                                                lo[-1] + 40))]
    return (int(rng.integers(1, 3)), int(rng.integers(1, 3)), *spatial), (
        window, strides, dil, start, end)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float16"] + INT_TYPES)
def test_rows_kernel_against_numpy(device, budget, dims, dtype):
    """The rows kernel (the rule without indices) against the reference and against the
    one-output kernel ("general", forced): random geometries with dilations, padding and
    strides, every type for max, floats for average with either divisor, both reads of
    float32."""
    T = dml.TensorDesc
    rng = np.random.default_rng(dims * 1000 + len(dtype) * 7 + INT_TYPES.count(dtype))
    for case in range(max(2, budget // 4)):
        shape, geo = _rows_case(rng, dims)
        window, strides, dil, start, end = geo
        x = random_input(rng, shape, dtype)
        if dtype in ("float32", "float16") and case % 2:
            x.flat[rng.integers(0, x.size, 3)] = np.nan
        out = shape[:2] + tuple(window_counts(shape[2:], window, strides, dil, start, end))
        read = "ssbo" if case % 3 == 2 else None
        max_desc = dml.MaxPooling2OperatorDesc(T(dtype, shape), T(dtype, out), None, strides,
                                               window, start, end, dil)
        want = max_reference(x, window, strides, dil, start, end)[0]
        for path in ("window", "general"):
            got_path, (got,) = _run_path(device, max_desc, x, path, read)
            # "block" or "slide" where float32 has its geometry (test_block_kernel_*,
            # test_slide_kernel_*)
            assert got_path in (("rows", "block", "slide") if path == "window"
                                else ("general",))
            np.testing.assert_array_equal(got, want)
        if dtype not in ("float32", "float16"):
            continue
        inc = bool(case % 2)
        avg_desc = dml.AveragePooling1OperatorDesc(T(dtype, shape), T(dtype, out), strides,
                                                   window, start, end, dil, inc)
        got_path, (got,) = _run_path(device, avg_desc, np.abs(x), "rows", read)
        assert got_path == "rows"
        ref, mag = average_reference(np.abs(x), window, strides, dil, start, end, inc)
        nan = np.isnan(ref)
        np.testing.assert_array_equal(np.isnan(got), nan)
        assert_mean_close(np.where(nan, 0, got), np.where(nan, 0, ref), np.where(nan, 0, mag),
                          dtype)


def test_rows_kernel_choice_and_windows(device):
    """Indices and a window row past 32 inputs take the one-output kernel; the rows kernel
    over windows past a small maxStorageBufferRange (binding windows cut its rows: the
    inputs past the box's last output are not read) and wide rows (V = 8, tails)."""
    T = dml.TensorDesc
    x = np.random.default_rng(5).standard_normal((1, 2, 5, 40)).astype(np.float32)
    long_row = dml.MaxPooling2OperatorDesc(T("float32", x.shape), T("float32", (1, 2, 5, 7)),
                                           None, (1, 1), (1, 12), (0, 0), (0, 0), (1, 3))
    got_path, (got,) = _run_path(device, long_row, x, None)
    assert got_path == "general"
    np.testing.assert_array_equal(got, max_reference(x, (1, 12), (1, 1), (1, 3), (0, 0),
                                                     (0, 0))[0])
    rng = np.random.default_rng(17)
    with vkml.Device(device.index, limits={"maxStorageBufferRange": 2048}) as small:
        for dims in (2, 3):
            for _ in range(3):
                shape, (window, strides, dil, start, end) = _rows_case(rng, dims)
                shape = shape[:-1] + (shape[-1] + 60,)
                x = rng.standard_normal(shape).astype(np.float32)
                got = vkml.max_pooling(x, window, strides=strides, start_padding=start,
                                       end_padding=end, dilations=dil, device=small)
                np.testing.assert_array_equal(
                    got, max_reference(x, window, strides, dil, start, end)[0])
                got = vkml.average_pooling(x, window, strides=strides, start_padding=start,
                                           end_padding=end, dilations=dil, device=small)
                assert_mean_close(got, *average_reference(x, window, strides, dil, start,
                                                          end, False), "float32")


# -- the "block" kernel (glsl/pooling_block.comp) -----------------------------------------
def _block_case(rng, dims):
    """A float32 geometry whose last dimension has a "block" variant (every row shift:
    start padding 0 to 3), the outer dimensions random (dilations, strides, padding)."""
    from vkml.ops.pooling import BLOCK_GEOMETRIES

    wl, sl, dl = BLOCK_GEOMETRIES[int(rng.integers(len(BLOCK_GEOMETRIES)))]
    window = [int(rng.integers(1, 4)) for _ in range(dims - 1)] + [wl]
    strides = [int(rng.integers(1, 3)) for _ in range(dims - 1)] + [sl]
    dil = [int(rng.integers(1, 3)) for _ in range(dims - 1)] + [dl]
    start = [int(rng.integers(0, 3)) for _ in range(dims - 1)] + [int(rng.integers(0, 4))]
    end = [int(rng.integers(0, 3)) for _ in range(dims - 1)] + [int(rng.integers(0, wl))]
    lo = [max(1, d * (w - 1) + 1 - a - b) for w, d, a, b in zip(window, dil, start, end)]
    spatial = [int(rng.integers(l, l + 5)) for l in lo[:-1]] + [
        4 * int(rng.integers(max(1, lo[-1] // 4 + 1), 12))]     # rows of whole texels
    return (int(rng.integers(1, 3)), int(rng.integers(1, 3)), *spatial), (
        window, strides, dil, start, end)


def _check_block(device, rng, shape, geo, nan: bool, expect="block", path="block"):
    """Max and average (either divisor) of one case, forced ``path``, against the
    references and max against the rows kernel (bit for bit)."""
    T = dml.TensorDesc
    window, strides, dil, start, end = geo
    x = rng.standard_normal(shape).astype(np.float32)
    if nan:
        x.flat[rng.integers(0, x.size, 3)] = np.nan
    out = shape[:2] + tuple(window_counts(shape[2:], window, strides, dil, start, end))
    max_desc = dml.MaxPooling2OperatorDesc(T("float32", shape), T("float32", out), None,
                                           strides, window, start, end, dil)
    got_path, (got,) = _run_path(device, max_desc, x, path)
    assert got_path == expect
    np.testing.assert_array_equal(got, max_reference(x, window, strides, dil, start, end)[0])
    np.testing.assert_array_equal(got, _run_path(device, max_desc, x, "rows")[1][0])
    for inc in (False, True):
        avg_desc = dml.AveragePooling1OperatorDesc(T("float32", shape), T("float32", out),
                                                   strides, window, start, end, dil, inc)
        got_path, (got,) = _run_path(device, avg_desc, x, path)
        assert got_path == expect
        ref, mag = average_reference(x, window, strides, dil, start, end, inc)
        nan_at = np.isnan(ref)
        np.testing.assert_array_equal(np.isnan(got), nan_at)
        assert_mean_close(np.where(nan_at, 0, got), np.where(nan_at, 0, ref),
                          np.where(nan_at, 0, mag), "float32")


@pytest.mark.parametrize("dims", [2, 3])
def test_block_kernel_against_numpy(device, budget, dims):
    """The "block" kernel (float32 row segments as RGBA32F texels, the rule where its
    variants apply) against the references and the rows kernel: every geometry it has,
    every row shift, NaN, padding-only windows, short rows (a masked tail)."""
    rng = np.random.default_rng(90 + dims)
    for case in range(max(4, budget // 3)):
        shape, geo = _block_case(rng, dims)
        _check_block(device, rng, shape, geo, nan=bool(case % 2))


def test_block_kernel_windows_and_fallbacks(device):
    """"block" over binding windows (a small maxTexelBufferElements cuts the input into
    windows of whole texels); rows not starting on a texel boundary (a last dimension
    not a multiple of 4), another geometry or indices take the rows or general kernels."""
    rng = np.random.default_rng(31)
    # seeds whose cases take 8 and 2 windows, and one whose windows would cut a row's 8
    # outputs off a texel boundary ("rows")
    for seed, dims, texels, expect in ((36, 2, 64, "block"), (34, 3, 256, "block"),
                                       (33, 2, 64, "rows")):
        with vkml.Device(device.index, limits={"maxTexelBufferElements": texels}) as small:
            shape, geo = _block_case(np.random.default_rng(seed), dims)
            shape = shape[:-1] + (shape[-1] + 64,)
            _check_block(small, rng, shape, geo, nan=False, expect=expect)
    geo = ([3, 3], [2, 2], [1, 1], [1, 1], [1, 1])
    _check_block(device, rng, (1, 3, 9, 10), geo, nan=True, expect="rows")
    _check_block(device, rng, (1, 3, 9, 12), ([3, 4], [2, 2], [1, 1], [1, 1], [1, 1]),
                 nan=False, expect="rows")


def test_block_kernel_strided_layouts(device):
    """"slide" (the rule; "block" reads alike) on an input whose rows are padded to 16 elements (NaN in the gaps, which
    it fetches with the rows' texels and must not use) into an output with gaps: the
    gaps and the bytes after both tensors stay untouched."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 3, 7, 12)).astype(np.float32)
    buf = np.full((2, 3, 8, 16), np.nan, np.float32)
    buf[:, :, :7, :12] = x
    in_strides = tuple(s // 4 for s in buf.strides)
    out = [2, 3, 4, 6]
    out_strides, read = padded_output(rng, out, "float32", True)
    for avg in (False, True):
        cls = dml.AveragePooling1OperatorDesc if avg else dml.MaxPooling2OperatorDesc
        desc = cls(dml.TensorDesc("float32", x.shape, in_strides),
                   dml.TensorDesc("float32", out, out_strides), strides=(2, 2),
                   window_size=(3, 3), start_padding=(1, 1), end_padding=(1, 0))
        compiled = device.compile_operator(device.create_operator(desc))
        assert compiled.path == "slide"     # the rule for this geometry (slide_ok)
        src, dst = execute_with_canaries(device, compiled, desc, buf.reshape(-1))
        got, gaps = read(dst)
        if avg:
            ref, mag = average_reference(x, (3, 3), (2, 2), (1, 1), (1, 1), (1, 0), False)
            assert_mean_close(got, ref, mag, "float32")
        else:
            np.testing.assert_array_equal(
                got, max_reference(x, (3, 3), (2, 2), (1, 1), (1, 1), (1, 0))[0])
        assert gaps and canaries_intact(src) and canaries_intact(dst)


# -- the "slide" kernel (glsl/pooling_slide.comp) -----------------------------------------
def _slide_case(rng, rows=(1, 30)):
    """A float32 2-D case with a "slide" variant: a square window of unit dilation from
    SLIDE_GEOMETRIES, every row shift (start padding 0 to 3 along the rows), padding of
    up to the window along the columns (windows wholly in the padding), output heights
    across and between its row blocks."""
    from vkml.ops.pooling import SLIDE_GEOMETRIES

    w, s = SLIDE_GEOMETRIES[int(rng.integers(len(SLIDE_GEOMETRIES)))]
    start = [int(rng.integers(0, w)), int(rng.integers(0, 4))]
    end = [int(rng.integers(0, w)), int(rng.integers(0, w))]
    h = int(rng.integers(*rows)) * s + w - 1 - start[0] - end[0]
    width = 4 * int(rng.integers(max(1, (w - start[1] - end[1]) // 4 + 1), 12))
    return (int(rng.integers(1, 3)), int(rng.integers(1, 4)), max(1, h), width), (
        [w, w], [s, s], [1, 1], start, end)


def test_slide_kernel_against_numpy(device, budget):
    """The "slide" kernel (an invocation sliding down output rows, the rule for 2-D square
    windows it has) against the references and the rows kernel: every geometry and row
    shift, NaN, padding-only windows, row blocks with a short last one, short rows."""
    rng = np.random.default_rng(77)
    for case in range(max(6, budget // 2)):
        shape, geo = _slide_case(rng)
        _check_block(device, rng, shape, geo, nan=bool(case % 2), expect="slide",
                     path="slide")


def test_slide_kernel_choice_and_splits(device):
    """"slide" by the rule, over binding windows (a small maxTexelBufferElements) and
    grids split along every axis (y in blocks of whole row runs); non-square windows,
    dilations, 3-D, unaligned rows or indices take the other kernels."""
    from vkml.ops.pooling import CompiledPooling

    rng = np.random.default_rng(8)
    shape, geo = (2, 3, 41, 72), ([3, 3], [1, 1], [1, 1], [1, 1], [1, 1])
    _check_block(device, rng, shape, geo, nan=True, expect="slide", path=None)
    limits = ({"maxTexelBufferElements": 256},
              {"maxComputeWorkGroupCount": (1, 2, 2), "maxComputeWorkGroupSize": (8, 1, 1)})
    for lim in limits:
        with vkml.Device(device.index, limits=lim) as small:
            for _ in range(2):
                shape, geo = _slide_case(rng, rows=(10, 40))
                _check_block(small, rng, shape[:3] + (shape[3] + 64,), geo, nan=False,
                             expect="slide", path="slide")
    T = dml.TensorDesc
    for shape, geo, idx, want in (
            ((1, 2, 9, 16), ([3, 2], [2, 2], [1, 1], [1, 1], [1, 1]), False, "block"),
            ((1, 2, 9, 16), ([3, 3], [2, 2], [2, 1], [1, 1], [1, 1]), False, "block"),
            ((1, 2, 9, 18), ([3, 3], [2, 2], [1, 1], [1, 1], [1, 1]), False, "rows"),
            ((1, 2, 9, 16), ([3, 3], [2, 2], [1, 1], [1, 1], [1, 1]), True, "general"),
            ((1, 1, 4, 9, 16), ([3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], [1, 1, 1]),
             False, "block")):
        window, strides, dil, start, end = geo
        out = shape[:2] + tuple(window_counts(shape[2:], window, strides, dil, start, end))
        desc = dml.MaxPooling2OperatorDesc(T("float32", shape), T("float32", out),
                                           T("uint32", out) if idx else None, strides,
                                           window, start, end, dil)
        op = CompiledPooling(device, desc, path="slide" if want != "block" else None)
        assert op.path == want
        op.release()


@pytest.mark.parametrize("groups", [None, 1])
def test_slide_kernel_flat_grid(device, groups):
    """"slide" with x over (plane, row segment) flattened (a workgroup's lanes spanning
    planes, the last one partly outside the box) where the flattened x fits the device's
    workgroup count, else x along the rows and z over the planes (``groups``: a small
    maxComputeWorkGroupCount), against the references and the rows kernel."""
    from vkml.ops.pooling import CompiledPooling

    rng = np.random.default_rng(56)
    T = dml.TensorDesc
    limits = {} if groups is None else {"maxComputeWorkGroupCount": (groups, 65535, 65535)}
    with vkml.Device(device.index, limits=limits) as dev:
        for shape, geo in (((1, 5, 11, 56), ([3, 3], [1, 1], [1, 1], [1, 1], [1, 1])),
                           ((2, 3, 9, 40), ([3, 3], [2, 2], [1, 1], [1, 1], [1, 1]))):
            window, strides, dil, start, end = geo
            out = shape[:2] + tuple(window_counts(shape[2:], window, strides, dil, start,
                                                  end))
            desc = dml.MaxPooling2OperatorDesc(T("float32", shape), T("float32", out), None,
                                               strides, window, start, end, dil)
            op = CompiledPooling(dev, desc, path="slide")
            assert op.path == "slide" and op.flat == (groups is None)
            op.release()
            _check_block(dev, rng, shape, geo, nan=True, expect="slide", path="slide")


@pytest.mark.parametrize("store64", [True, False])
def test_slide_kernel_stores(device, store64):
    """"slide"'s u64vec4 stores (forced: refused without int64 shaders) and vec4
    stores against the references, on outputs whose rows are 8-aligned (one u64vec4 an
    invocation and row), 4-aligned only and unaligned (scalar stores), a short last
    invocation of a row."""
    from vkml.ops.pooling import CompiledPooling

    rng = np.random.default_rng(64 + store64)
    wide = bool(device.features.get("int64"))
    T = dml.TensorDesc
    for shape, geo in (((1, 3, 10, 32), ([3, 3], [1, 1], [1, 1], [1, 1], [1, 1])),
                       ((2, 2, 9, 24), ([3, 3], [2, 2], [1, 1], [1, 0], [1, 1])),
                       ((1, 2, 7, 20), ([2, 2], [2, 2], [1, 1], [0, 0], [0, 0])),
                       ((1, 2, 8, 44), ([5, 5], [1, 1], [1, 1], [2, 2], [2, 2]))):
        window, strides, dil, start, end = geo
        x = rng.standard_normal(shape).astype(np.float32)
        out = shape[:2] + tuple(window_counts(shape[2:], window, strides, dil, start, end))
        for avg in (False, True):
            desc = (dml.AveragePooling1OperatorDesc(T("float32", shape), T("float32", out),
                                                    strides, window, start, end, dil, False)
                    if avg else dml.MaxPooling2OperatorDesc(T("float32", shape),
                                                            T("float32", out), None, strides,
                                                            window, start, end, dil))
            if store64 and not wide:
                with pytest.raises(vkml.UnsupportedError, match="int64"):
                    CompiledPooling(device, desc, path="slide", store64=True)
                continue
            op = CompiledPooling(device, desc, path="slide", store64=store64)
            assert op.path == "slide"
            assert op.kernel.endswith("_u64") == store64
            y = device.empty(out, np.float32)
            op.execute([device.tensor(x)], [y])
            op.release()
            if avg:
                assert_mean_close(y.numpy(), *average_reference(x, window, strides, dil, start,
                                                                end, False), "float32")
            else:
                np.testing.assert_array_equal(
                    y.numpy(), max_reference(x, window, strides, dil, start, end)[0])


@pytest.mark.parametrize("kw", [dict(path="slid"), dict(path="reduce"), dict(path=1),
                                dict(read="texel4"), dict(read="SSBO"), dict(store64="yes"),
                                dict(store64=2)])
def test_forced_choices_are_validated(device, kw):
    """The constructor's ``path=``, ``read=`` and ``store64=`` take only their documented
    values (every tuner candidate among them): anything else is a ValidationError naming
    the argument, and the device runs pooling afterwards."""
    from vkml.ops import pooling as pl

    assert {c.params["path"] for c in pl.PATH.candidates} <= set(pl.PATHS)
    T = dml.TensorDesc
    desc = dml.AveragePooling1OperatorDesc(T("float32", (1, 2, 6, 8)),
                                           T("float32", (1, 2, 6, 8)), (1, 1), (3, 3),
                                           (1, 1), (1, 1), (1, 1), False)
    name = next(iter(kw))
    with pytest.raises(ValidationError) as err:
        pl.CompiledPooling(device, desc, **kw)
    assert err.value.field == name
    x = np.random.default_rng(5).standard_normal((1, 2, 6, 8)).astype(np.float32)
    for path in (None,) + pl.PATHS:
        op = pl.CompiledPooling(device, desc, path=path)
        y = device.empty((1, 2, 6, 8), np.float32)
        op.execute([device.tensor(x)], [y])
        op.release()
        assert_mean_close(y.numpy(), *average_reference(x, (3, 3), (1, 1), (1, 1), (1, 1),
                                                        (1, 1), False), "float32")


def test_tuner_path(device, tmp_path, monkeypatch):
    """The kernel is a registered tunable path whose every candidate runs when measured
    (each timed on its own kernel, or declined); off gives the rule; a stored choice
    ("block") is taken where it may run and the rule where it may not (3-D "slide")."""
    from vkml import tuning
    from vkml.ops import pooling as pl

    assert "pooling_path" in tuning.registered_paths()
    shape = pl.path_shape(dml.AveragePooling1OperatorDesc(
        dml.TensorDesc("float32", (1, 2, 9, 16)), dml.TensorDesc("float32", (1, 2, 9, 16)),
        (1, 1), (3, 3), (1, 1), (1, 1), (1, 1), True))
    c = tuning.Tuner("full", folder=tmp_path, rounds=1).choose(device, "pooling_path", shape)
    assert c.source == "measured" and set(c.times) == {"auto", "slide", "block", "rows"}
    assert tuning.Tuner(mode="off").choose(device, pl.PATH, shape).name == "auto"
    for cand in pl.PATH.candidates:          # the descriptor round trip, each kernel
        op = pl.CompiledPooling(device, pl._path_desc(shape), path=cand.params["path"])
        assert op.path == ("slide" if cand.name == "auto" else cand.name)
        op.release()
    real = tuning.choose
    for forced, geo, want in (("block", (3, 3), "block"), ("slide", (3, 3, 3), "block")):
        monkeypatch.setattr(pl.tuning, "choose", lambda dev, path, s, f=forced: real(
            dev, path, s, force=f))
        n = len(geo)
        x = np.random.default_rng(n).standard_normal((1, 2) + (8,) * n).astype(np.float32)
        out = (1, 2) + (4,) * n
        desc = dml.MaxPooling2OperatorDesc(dml.TensorDesc("float32", x.shape),
                                           dml.TensorDesc("float32", out), None, (2,) * n,
                                           geo, (1,) * n, (0,) * n)
        got_path, (got,) = _run_path(device, desc, x, None)
        assert got_path == want
        np.testing.assert_array_equal(
            got, max_reference(x, geo, (2,) * n, (1,) * n, (1,) * n, (0,) * n)[0])

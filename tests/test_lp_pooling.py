"""DML_LP_POOLING_OPERATOR_DESC / DML_LP_POOLING1_OPERATOR_DESC and vkml.lp_pooling.

References: a NumPy float64 reference written from the page (tests/references.py:
y = (sum |x|^P)^(1/P) over each dilated window, zero padding contributing nothing), and
``torch.nn.functional.lp_pool2d/3d`` where its semantics coincide (no padding, no
dilation, positive inputs: torch has neither and drops the absolute value for odd P).

Tolerances: float32 within 4e-6 relative to each result for P = 1 and 2 (no pow),
2e-5 for other P (``pow`` with 1/P); float16 within one float16 ulp of the float64
reference (vkml computes in float32 and rounds once).
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

from helpers import (POOLING_DESC_ARGS, POOLING_WINDOW_CASES, random_pooling_case,
                     split_grid_windows)
from references import lp_pooling_reference


def assert_close(got, ref, dtype, p):
    if np.dtype(dtype) == np.float16:
        want = ref.astype(np.float16)
        finite = np.isfinite(want)
        assert np.array_equal(np.isfinite(got), finite)
        ulp = np.spacing(np.abs(want[finite])).astype(np.float64)
        err = np.abs(got[finite].astype(np.float64) - ref[finite])
        assert np.all(err <= ulp), (err / ulp).max()
    else:
        rtol = 4e-6 if p in (1, 2) else 2e-5
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=0)


def random_case(rng, dims, max_elems):
    return random_pooling_case(rng, dims, max_elems, window_below=5, spread=(12, 6))


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_random_against_numpy(device, budget, dims, dtype):
    rng = np.random.default_rng(dims * 10 + len(dtype))
    for case in range(budget):
        p = [1, 2, 3, 4, 5, 8][case % 6]
        shape, window, strides, start, end, dil = random_case(
            rng, dims, 6000 if budget < 40 else 100000)
        x = (rng.standard_normal(shape) * 4).astype(dtype)
        got = vkml.lp_pooling(x, window, strides=strides, start_padding=start,
                              end_padding=end, dilations=dil, p=p, device=device)
        assert got.dtype == np.dtype(dtype)
        assert_close(got, lp_pooling_reference(x, window, strides, dil, start, end, p), dtype, p)


@pytest.mark.parametrize("dims", [2, 3])
def test_against_torch(device, budget, dims):
    """torch.nn.functional.lp_pool2d/3d: no padding, no dilation, positive inputs."""
    rng = np.random.default_rng(40 + dims)
    pool = F.lp_pool2d if dims == 2 else F.lp_pool3d
    for case in range(max(4, budget // 2)):
        p = [1, 2, 3, 6][case % 4]
        shape, window, strides, *_ = random_case(rng, dims, 20000)
        spatial = [max(s, w) for s, w in zip(shape[2:], window)]
        x = rng.uniform(0.1, 3.0, (*shape[:2], *spatial)).astype(np.float32)
        got = vkml.lp_pooling(x, window, strides=strides, p=p, device=device)
        ref = pool(torch.from_numpy(x).double(), p, window, strides).numpy()
        assert_close(got, ref, "float32", p)


def test_output_size_uses_the_dilated_window(device):
    """The page's formula (PaddedSize - WindowSize) / Strides + 1 omits the dilation;
    vkml uses the dilated window's extent (as ONNX LpPool)."""
    x = np.arange(1, 1 + 2 * 11 * 9, dtype=np.float32).reshape(1, 2, 11, 9)
    got = vkml.lp_pooling(x, (3, 2), dilations=(2, 3), strides=(1, 2), start_padding=(1, 0),
                          end_padding=(0, 1), p=2, device=device)
    assert got.shape == (1, 2, (11 + 1 - 2 * 2 - 1) // 1 + 1, (9 + 1 - 3 * 1 - 1) // 2 + 1)
    assert_close(got,
                 lp_pooling_reference(x, (3, 2), (1, 2), (2, 3), (1, 0), (0, 1), 2), "float32", 2)
    desc = dml.LpPooling1OperatorDesc(dml.TensorDesc("float32", (1, 2, 11, 9)),
                                      dml.TensorDesc("float32", (1, 2, 8, 4)), (1, 2), (3, 2),
                                      (1, 0), (0, 1), (2, 3), 2)
    device.create_operator(desc)                        # valid
    bad = dml.LpPooling1OperatorDesc(dml.TensorDesc("float32", (1, 2, 11, 9)),
                                     dml.TensorDesc("float32", (1, 2, 10, 5)), (1, 2), (3, 2),
                                     (1, 0), (0, 1), (2, 3), 2)  # the undilated formula
    with pytest.raises(ValidationError, match=r"output_tensor.sizes\[2\]"):
        device.create_operator(bad)


def test_lp_pooling_without_dilations(device):
    """DML_LP_POOLING_OPERATOR_DESC: the page's output formula exactly."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 8, 10)).astype(np.float32)
    osz = (2, 3, (8 + 1 + 0 - 3) // 2 + 1, (10 + 2 + 1 - 2) // 1 + 1)
    desc = dml.LpPoolingOperatorDesc(dml.TensorDesc("float32", x.shape),
                                     dml.TensorDesc("float32", osz), (2, 1), (3, 2), (1, 2),
                                     (0, 1), 3)
    compiled = device.compile_operator(device.create_operator(desc))
    t, y = device.tensor(x), device.empty(osz, np.float32)
    compiled.execute([t], [y])
    compiled.release()
    assert_close(y.numpy(),
                 lp_pooling_reference(x, (3, 2), (2, 1), (1, 1), (1, 2), (0, 1), 3), "float32", 3)
    assert desc.feature_level() == dml.FeatureLevel.FL_1_0


def test_absolute_value_and_exact_fast_paths(device):
    """|x| is taken (odd P included); P = 1 is an exact sum for integer-valued data."""
    x = np.array([[[[-1, 2, -3], [4, -5, 6], [-7, 8, -9]]]], np.float32)
    np.testing.assert_array_equal(vkml.lp_pooling(x, 3, p=1, device=device), [[[[45.0]]]])
    np.testing.assert_allclose(vkml.lp_pooling(x, 3, p=2, device=device),
                               [[[[math.sqrt(285)]]]], rtol=1e-7)
    np.testing.assert_allclose(vkml.lp_pooling(x, 3, p=3, device=device),
                               [[[[2025 ** (1 / 3)]]]], rtol=2e-6)
    np.testing.assert_array_equal(vkml.lp_pooling(x, 2, strides=1, p=1, device=device),
                                  [[[[12, 16], [24, 28]]]])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_large_and_small_magnitudes(device, dtype):
    """No overflow or underflow where the true result is representable: float32 values
    near 1e30 and 1e-30 with P = 2 and 3; float16 values whose P-th powers overflow
    float32 (P = 20) or whose squares are below float16's range."""
    big, small = (3e30, 2e-30) if dtype == "float32" else (300.0, 1e-4)
    for p in (2, 3, 20):
        for scale in (big, small):
            x = (np.arange(1, 19, dtype=np.float64).reshape(1, 2, 3, 3) / 18 * scale).astype(dtype)
            got = vkml.lp_pooling(x, (2, 2), p=p, device=device)
            ref = lp_pooling_reference(x, (2, 2), (1, 1), (1, 1), (0, 0), (0, 0), p)
            assert np.all(np.isfinite(got)) and np.all(got > 0)
            assert_close(got, ref, dtype, p)
    # a true result beyond the type's range is inf
    x = np.full((1, 1, 2, 2), 60000 if dtype == "float16" else 3e38, dtype)
    assert np.isinf(vkml.lp_pooling(x, 2, p=2, device=device)).all()


def test_nan_and_inf(device):
    for p in (1, 2, 3):
        x = np.ones((1, 1, 2, 4), np.float32)
        x[0, 0, 0, 0] = np.inf
        x[0, 0, 1, 3] = np.nan
        got = vkml.lp_pooling(x, 2, strides=2, p=p, device=device)
        assert np.isinf(got[0, 0, 0, 0]) and np.isnan(got[0, 0, 0, 1]), (p, got)
        x[0, 0, 0, 3] = -np.inf                  # inf and NaN in one window: NaN
        assert np.isnan(vkml.lp_pooling(x, 2, strides=2, p=p, device=device)[0, 0, 0, 1])


def test_zero_windows_and_all_padding(device):
    """All-zero windows give 0 (every P); windows wholly in the padding too."""
    x = np.zeros((1, 1, 3, 3), np.float32)
    x[0, 0, 2, 2] = 5
    for p in (1, 2, 4):
        got = vkml.lp_pooling(x, 2, strides=3, start_padding=2, end_padding=1, p=p,
                              device=device)
        np.testing.assert_allclose(got, [[[[0, 0], [0, 5]]]], rtol=1e-6)


@pytest.mark.parametrize("read", ["ssbo", "texel", "texel4"])
@pytest.mark.parametrize("vec", [1, 4, 8])
def test_read_paths(device, read, vec, monkeypatch):
    """Each input path forced (storage buffer, R32 texels, RGBA32 texels shifted into
    place), with 1, 4 or 8 outputs per invocation: row tails, strides, dilations,
    padding on both sides."""
    from vkml.ops.lp_pooling import CompiledLpPooling

    monkeypatch.setattr(CompiledLpPooling, "force_read", read)
    monkeypatch.setattr(CompiledLpPooling, "vec", vec)
    rng = np.random.default_rng(vec)
    for p in (1, 2, 3):
        for shape, window, strides, start, end, dil in (
                ((2, 3, 9, 37), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
                ((1, 2, 5, 13), (2, 4), (1, 1), (0, 2), (1, 3), (2, 1)),
                ((1, 2, 4, 6, 20), (2, 2, 3), (1, 2, 1), (1, 0, 1), (0, 1, 1), (1, 1, 2))):
            x = rng.standard_normal(shape).astype(np.float32)
            got = vkml.lp_pooling(x, window, strides=strides, start_padding=start,
                                  end_padding=end, dilations=dil, p=p, device=device)
            assert_close(got,
                         lp_pooling_reference(x, window, strides, dil, start, end, p), "float32", p)


def _check_cases(device, read, rng, cases, ps):
    """Each of ``cases`` (shape, window, strides, start, end, dilations) for each P of
    ``ps`` on read path ``read``, against the reference (random normal inputs)."""
    for p in ps:
        for shape, window, strides, start, end, dil in cases:
            x = rng.standard_normal(shape).astype(np.float32)
            got = _lp_on_read(device, read, x, window, strides, start, end, dil, p)
            assert_close(got, lp_pooling_reference(x, window, strides, dil, start, end, p),
                         "float32", p)


def _check_lowered(device, read, rng, limits, shapes):
    """P = 2, 3-wide windows of stride 2 and padding 1 on read path ``read`` of a device
    opened with each of ``limits`` lowered (windows, tiles), for each input shape."""
    for lim in limits:
        with vkml.Device(device.index, limits=lim) as small:
            for shape in shapes:
                x = rng.standard_normal(shape).astype(np.float32)
                d = len(shape) - 2
                args = ((3,) * d, (2,) * d, (1,) * d, (1,) * d, (1,) * d)
                got = _lp_on_read(small, read, x, *args, 2)
                assert_close(got, lp_pooling_reference(x, args[0], args[1], args[4], args[2],
                                                       args[3], 2), "float32", 2)


def _check_non_packed(device, read, rng, case):
    """``case`` (shape (2, 3, 9, 37)) with rows of 37 padded to 41 and images 3 elements
    apart, P = 2, on read path ``read``."""
    shape, window, strides, start, end, dil = case
    x = rng.standard_normal(shape).astype(np.float32)
    in_strides = (3 * (9 * 41 + 3), 9 * 41 + 3, 41, 1)
    phys = np.zeros(2 * in_strides[0], np.float32)
    np.lib.stride_tricks.as_strided(phys, shape, [s * 4 for s in in_strides])[...] = x
    got = _lp_on_read(device, read, x, window, strides, start, end, dil, 2, in_strides, phys)
    assert_close(got, lp_pooling_reference(x, window, strides, dil, start, end, 2), "float32", 2)


def _lp_on_read(device, read, x, window, strides, start, end, dil, p, in_strides=None,
                phys=None):
    """LP pooling of ``x`` compiled with ``read=`` forced through the constructor; asserts
    the path was taken (no silent fallback) and returns the output."""
    from vkml.dml.lp_pooling import lp_pooling_output_sizes
    from vkml.ops.lp_pooling import CompiledLpPooling

    osz = tuple(lp_pooling_output_sizes(x.shape, strides, window, start, end, dil))
    desc = dml.LpPooling1OperatorDesc(dml.TensorDesc(x.dtype, x.shape, in_strides),
                                      dml.TensorDesc(x.dtype, osz), strides, window, start,
                                      end, dil, p)
    op = CompiledLpPooling(device, desc, read=read)
    assert op.read == read and ("_" + read) in op.kernel
    t = device.tensor((x if phys is None else phys).reshape(-1))
    y = device.empty(osz, x.dtype)
    op.execute([t], [y])
    op.release()
    return y.numpy()


@pytest.mark.parametrize("vec", [1, 4, 8])
def test_ssbo4_read(device, vec, monkeypatch):
    """The "ssbo4" read (4-element groups from a vec4 storage buffer; the tuner chooses
    it where it is faster), forced by ``read=``: row tails, strides, dilations, padding,
    P = 1, 2, 3; a non-packed input (padded rows); windows (maxStorageBufferRange lowered
    to 4096 bytes: each binding ends on whole vec4s)."""
    from vkml.ops.lp_pooling import CompiledLpPooling

    monkeypatch.setattr(CompiledLpPooling, "vec", vec)
    rng = np.random.default_rng(50 + vec)
    cases = (((2, 3, 9, 37), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
             ((1, 2, 5, 13), (2, 4), (1, 1), (0, 2), (1, 3), (2, 1)),
             ((1, 2, 4, 6, 20), (2, 2, 3), (1, 2, 1), (1, 0, 1), (0, 1, 1), (1, 1, 2)))
    _check_cases(device, "ssbo4", rng, cases, (1, 2, 3))
    # non-packed: rows of 37 padded to 41, images 3 elements apart
    _check_non_packed(device, "ssbo4", rng, cases[0])
    _check_lowered(device, "ssbo4", rng, [{"maxStorageBufferRange": 4096}],
                   ((2, 3, 20, 30), (1, 2, 6, 12, 21)))


@pytest.mark.parametrize("read", ["roll", "tile"])
def test_roll_and_tile_reads(device, read):
    """The "roll" kernel (glsl/lp_pooling_roll.comp: rolled window loops, 4 outputs a
    vec4) and "tile" (the same reading a shared-memory tile the workgroup loads first;
    the tuner chooses either where it is faster), forced by ``read=``: row tails (rows
    shorter than 4 too), strides, dilations, padding, P = 1, 2, 3, 5 in 2-D and 3-D; a
    non-packed input; magnitudes whose squares overflow or underflow float32 (the scaled
    second pass), inf and NaN; windows (maxStorageBufferRange lowered to 4096 bytes);
    "tile" with maxComputeSharedMemorySize lowered to 1 KiB (smaller workgroups)."""
    rng = np.random.default_rng(77)
    cases = (((2, 3, 9, 37), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
             ((1, 2, 5, 13), (2, 4), (1, 1), (0, 2), (1, 3), (2, 1)),
             ((1, 2, 4, 3), (2, 2), (1, 2), (1, 0), (0, 1), (1, 1)),
             ((1, 2, 4, 6, 20), (2, 2, 3), (1, 2, 1), (1, 0, 1), (0, 1, 1), (1, 1, 2)))
    _check_cases(device, read, rng, cases, (1, 2, 3, 5))
    _check_non_packed(device, read, rng, cases[0])
    geo = ((2, 2), (1, 1), (0, 0), (0, 0), (1, 1))
    _check_scaled(device, read, rng, geo, 6)
    x = np.full((1, 1, 2, 2), 3e38, np.float32)
    assert np.isinf(_lp_on_read(device, read, x, *geo[:1], (2, 2), *geo[2:], 2)).all()
    for p in (1, 2, 3):
        x = np.ones((1, 1, 2, 8), np.float32)
        x[0, 0, 0, 0] = np.inf
        x[0, 0, 1, 3] = np.nan
        got = _lp_on_read(device, read, x, (2, 2), (2, 2), (0, 0), (0, 0), (1, 1), p)
        assert np.isinf(got[0, 0, 0, 0]) and np.isnan(got[0, 0, 0, 1]), (p, got)
        np.testing.assert_allclose(got[0, 0, 0, 2:], 2.0 ** (2 / p), rtol=4e-6)
    limits = [{"maxStorageBufferRange": 4096}]
    if read == "tile":
        limits.append({"maxComputeSharedMemorySize": 1024})
    _check_lowered(device, read, rng, limits, ((2, 3, 20, 30), (1, 2, 6, 12, 21)))


def _check_scaled(device, read, rng, geo, width):
    """Magnitudes that take the scaled pass (3e30, 2e-30; P = 2, 3) beside ordinary lanes,
    on read path ``read`` with ``geo`` (window, strides, start, end, dilations) over a
    1x2x3x``width`` input: finite, positive, the reference's."""
    n = 6 * width
    for p in (2, 3):
        for scale in (3e30, 2e-30):
            x = (np.arange(1, n + 1, dtype=np.float64).reshape(1, 2, 3, width) / n * scale)
            x = x.astype(np.float32)
            x[0, 1] = rng.standard_normal((3, width))    # ordinary lanes beside them
            got = _lp_on_read(device, read, x, *geo, p)
            assert np.all(np.isfinite(got)) and np.all(got > 0)
            assert_close(got, lp_pooling_reference(x, geo[0], geo[1], geo[4], geo[2], geo[3],
                                                   p), "float32", p)


def test_block_read(device):
    """The "block" kernel (glsl/lp_pooling_block.comp: 8 outputs an invocation from row
    segments read once as RGBA32F texels; a variant per last-dimension geometry and row
    shift) forced by ``read=``: each geometry and shift (padding 0..3), row tails, P = 1,
    2, 3, 5 in 2-D and 3-D, scaled-pass magnitudes, inf and NaN, texel windows
    (maxTexelBufferElements lowered to 256) and storage windows; a case without a variant
    (unaligned rows, another window) falls back to "ssbo"."""
    rng = np.random.default_rng(91)
    cases = (((2, 3, 9, 36), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
             ((1, 2, 5, 12), (2, 3), (1, 1), (0, 2), (1, 0), (2, 1)),
             ((1, 2, 4, 20), (2, 2), (1, 2), (1, 0), (0, 3), (1, 1)),
             ((1, 2, 6, 8), (3, 3), (1, 2), (2, 3), (2, 3), (1, 1)),
             ((1, 2, 4, 6, 20), (2, 2, 3), (1, 2, 1), (1, 0, 1), (0, 1, 1), (1, 1, 1)))
    _check_cases(device, "block", rng, cases, (1, 2, 3, 5))
    geo = ((2, 2), (2, 2), (0, 0), (0, 0), (1, 1))
    _check_scaled(device, "block", rng, geo, 8)
    x = np.zeros((1, 1, 4, 8), np.float32)                  # zero windows: the rare pass
    assert not _lp_on_read(device, "block", x, *geo, 2).any()
    for p in (1, 2, 3):
        x = np.ones((1, 1, 2, 8), np.float32)
        x[0, 0, 0, 0] = np.inf
        x[0, 0, 1, 3] = np.nan
        got = _lp_on_read(device, "block", x, *geo, p)
        assert np.isinf(got[0, 0, 0, 0]) and np.isnan(got[0, 0, 0, 1]), (p, got)
        np.testing.assert_allclose(got[0, 0, 0, 2:], 2.0 ** (2 / p), rtol=4e-6)
    _check_lowered(device, "block", rng,
                   ({"maxTexelBufferElements": 256}, {"maxStorageBufferRange": 4096}),
                   ((1, 3, 24, 16), (1, 2, 6, 12, 20)))
    from vkml.ops.lp_pooling import CompiledLpPooling
    for shape, window in (((1, 1, 8, 13), (3, 3)), ((1, 1, 8, 16), (5, 5))):
        desc = dml.LpPooling1OperatorDesc(
            dml.TensorDesc(np.float32, shape), dml.TensorDesc(np.float32, (1, 1, 3, 5)),
            (2, 2), window, (0, 0), (0, 0), (1, 1), 2)
        op = CompiledLpPooling(device, desc, read="block")
        assert op.read == "ssbo"
        op.release()


def test_block_p2_rare_pass(device):
    """The "block" kernel's P = 1 and 2 variants (P compile-time, kernel names ending in p1,
    p2): P = 2's rare pass (sums of squares inf or under 2^-100 summed again, inputs scaled
    by 2^-100 or 2^100) next to ordinary outputs of the same invocation -- near float max
    (finite and overflowing results), tiny (squares denormal or 0; denormal inputs a device
    may flush), a zero window in a nonzero segment, a
    segment of zeros, inf, NaN, a row's short last invocation -- and rows padded in
    memory (aligned strides)."""
    from vkml.ops.lp_pooling import CompiledLpPooling

    rng = np.random.default_rng(17)
    geo = ((2, 2), (2, 2), (0, 0), (0, 0), (1, 1))
    x = rng.standard_normal((1, 2, 4, 24)).astype(np.float32)
    row = x[0, 0, 0:2]          # output row 0: windows j = 0..11 (8 stored as vec4s, then 4)
    pairs = {0: 1e38, 1: 1e-30, 2: 0.0, 3: 1e-20, 6: 1.0, 7: 3e38, 8: 1e30, 9: 1e-25}
    for j, v in pairs.items():
        row[:, 2 * j:2 * j + 2] = np.float32(v) * np.array([[1, -0.5], [0.25, 0.75]])
    row[1, 9] = np.inf                              # window 4
    row[0, 10] = np.nan                             # window 5
    x[0, 0, 2:4] = 0.0                              # output row 1: zeros only
    ref = lp_pooling_reference(x, *geo[:2], geo[4], *geo[2:4], 2)
    got = _lp_on_read(device, "block", x, *geo, 2)
    assert np.isinf(got[0, 0, 0, [4, 7]]).all() and np.isnan(got[0, 0, 0, 5])
    keep = np.ones(ref.shape, bool)
    keep[0, 0, 0, [4, 5, 7]] = False
    assert not got[0, 0, 1].any() and got[0, 0, 0, 2] == 0
    np.testing.assert_allclose(got[keep], ref[keep], rtol=4e-6, atol=0)
    for p in (1, 2):       # P = 1 and 2 take their own variants
        small = x.copy()
        small[~np.isfinite(small)] = 1.0
        small[np.abs(small) > 1e20] = 2.0
        desc = dml.LpPooling1OperatorDesc(
            dml.TensorDesc(np.float32, x.shape), dml.TensorDesc(np.float32, ref.shape),
            geo[1], geo[0], geo[2], geo[3], geo[4], p)
        op = CompiledLpPooling(device, desc, read="block")
        assert op.kernel.endswith(f"p{p}"), op.kernel
        op.release()
        assert_close(_lp_on_read(device, "block", small, *geo, p),
                     lp_pooling_reference(small, *geo[:2], geo[4], *geo[2:4], p), "float32", p)
    # 3-D, window 3 stride 2 with padding (row shifts 1), tiny values and zero segments
    x = (rng.standard_normal((1, 2, 3, 4, 20)) * 1e-30).astype(np.float32)
    x[0, 1, :, :2] = 0.0
    args = ((2, 2, 3), (1, 2, 2), (0, 1, 1), (1, 0, 0), (1, 1, 1))
    assert_close(_lp_on_read(device, "block", x, *args, 2),
                 lp_pooling_reference(x, args[0], args[1], args[4], args[2], args[3], 2),
                 "float32", 2)
    # rows of 36 padded to 40 in memory, images 4 elements apart
    x = rng.standard_normal((2, 3, 9, 36)).astype(np.float32)
    in_strides = (3 * (9 * 40 + 4), 9 * 40 + 4, 40, 1)
    phys = np.zeros(2 * in_strides[0], np.float32)
    np.lib.stride_tricks.as_strided(phys, x.shape, [s * 4 for s in in_strides])[...] = x
    args = ((3, 3), (2, 2), (1, 1), (1, 1), (1, 1))
    for p in (1, 2):
        got = _lp_on_read(device, "block", x, *args, p, in_strides, phys)
        assert_close(got, lp_pooling_reference(x, args[0], args[1], args[4], args[2],
                                               args[3], p), "float32", p)


def test_block_random(device, budget):
    """The "block" kernel forced by name on random shapes of its last-dimension geometries
    (2-D and 3-D, padding, P = 1, 2, 3), inputs of random magnitude (2^-100 .. 2^120,
    P = 2's rare pass included) with zero runs, against the float64 reference."""
    from vkml.ops.lp_pooling import BLOCK_GEOMETRIES

    rng = np.random.default_rng(23)
    for case in range(budget):
        dims = 2 + case % 2
        w, s, _ = BLOCK_GEOMETRIES[case % len(BLOCK_GEOMETRIES)]
        window = [int(rng.integers(1, 4)) for _ in range(dims - 1)] + [w]
        strides = [int(rng.integers(1, 3)) for _ in range(dims - 1)] + [s]
        start = [int(rng.integers(0, 2)) for _ in range(dims - 1)] + [int(rng.integers(0, 4))]
        end = [int(rng.integers(0, 2)) for _ in range(dims)]
        spatial = [int(rng.integers(3, 7)) for _ in range(dims - 1)]
        spatial.append(4 * int(rng.integers(2, 9)))         # rows on 16 bytes
        shape = (1, int(rng.integers(1, 3)), *spatial)
        p = (1, 2, 2, 3)[case % 4]
        x = rng.standard_normal(shape) * 2.0 ** rng.integers(-100, 121, shape)
        x[rng.random(shape) < 0.3] = 0.0
        x = x.astype(np.float32)
        if p != 2:          # keep P = 1, 3 within the float range
            x = np.clip(x, -1e30, 1e30)
        dil = (1,) * dims
        got = _lp_on_read(device, "block", x, window, strides, start, end, dil, p)
        ref = lp_pooling_reference(x, window, strides, dil, start, end, p)
        assert_close(got, ref, "float32", p)


@pytest.mark.parametrize("read", ["texel4", "ssbo4", "roll", "tile", "block"])
def test_p2_sum_of_squares_overflow(device, read):
    """P = 2 where every |x| is below the fast paths' bound on the largest |x| (2^63: "roll"
    and "tile" sum squares unscaled below it) but the window's sum of squares overflows
    float32 (9 squares near 2^126): the result is finite, sqrt(9) 2^62.9; and near float
    max, where it is not (inf)."""
    x = np.full((1, 2, 4, 8), 2.0 ** 62.9, np.float32)
    x[0, 1] = np.random.default_rng(5).standard_normal((4, 8))
    args = ((3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    got = _lp_on_read(device, read, x, *args, 2)
    assert np.isfinite(got).all(), got[0, 0]
    assert_close(got, lp_pooling_reference(x, args[0], args[1], args[4], args[2], args[3], 2),
                 "float32", 2)
    x[0, 0] = 3e38
    assert np.isinf(_lp_on_read(device, read, x, *args, 2)[0, 0]).all()


def test_read_path_tuned(device):
    """``VKML_TUNE=off`` keeps the texel rule ("auto") as the read path."""
    from vkml import tuning
    from vkml.ops.lp_pooling import READ_PATH

    assert tuning.Tuner(mode="off").choose(device, READ_PATH, READ_PATH.examples[0]).name == "auto"


def test_large_windows(device):
    """Windows too large to keep in registers are read twice (P > 2, float32 P = 2), and
    window rows too long to read at once are read element by element."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((1, 2, 20, 40)) * 1e20).astype(np.float32)
    for p in (1, 2, 3):
        for window, strides, dil in (((9, 9), (5, 3), (1, 1)), ((2, 5), (1, 2), (1, 8))):
            got = vkml.lp_pooling(x, window, strides=strides, dilations=dil, start_padding=2,
                                  p=p, device=device)
            ref = lp_pooling_reference(x, window, strides, dil, (2, 2), (0, 0), p)
            assert_close(got, ref, "float32", p)


def test_windows_beyond_the_loop_limit(device):
    """A window whose loops (rows, then their positions; twice where sums are scaled) would
    run more than pooling.MAX_WINDOW iterations is refused on every device alike (lavapipe
    would end them early, silently); the largest allowed runs, p = 1 and p = 2."""
    x = np.ones((1, 1, 300, 300), np.float32)
    with pytest.raises(UnsupportedError, match=r"window_size \(300, 300\)"):
        vkml.lp_pooling(x, (300, 300), p=1, device=device)
    for p, want in ((1, 127 * 255), (2, math.sqrt(127 * 255))):
        got = vkml.lp_pooling(x[:, :, :127, :255], (127, 255), p=p, device=device)
        np.testing.assert_allclose(got, np.full((1, 1, 1, 1), want), rtol=1e-6)


def test_packed_float16(device):
    with vkml.Device(device.index, disable_features=["storage16"]) as dev:
        rng = np.random.default_rng(12)
        x = rng.standard_normal((2, 3, 7, 9)).astype(np.float16)
        for p in (1, 2, 3):
            got = vkml.lp_pooling(x, (2, 3), strides=(1, 2), start_padding=1, p=p, device=dev)
            assert_close(got,
                         lp_pooling_reference(x, (2, 3), (1, 2), (1, 1), (1, 1), (0, 0), p),
                         "float16", p)


def test_strided_layouts(device):
    """A channels-last input and an output with padded rows."""
    rng = np.random.default_rng(8)
    for dtype in ("float32", "float16"):
        x = rng.standard_normal((2, 3, 6, 7)).astype(dtype)
        phys = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        in_desc = dml.TensorDesc(dtype, x.shape, (126, 1, 21, 3))
        osz = (2, 3, 5, 3)
        ost = (3 * 5 * 8, 5 * 8, 8, 2)
        desc = dml.LpPooling1OperatorDesc(in_desc, dml.TensorDesc(dtype, osz, ost), (1, 2),
                                          (2, 3), (0, 0), (0, 0), (1, 1), 2)
        compiled = device.compile_operator(device.create_operator(desc))
        t = device.tensor(phys.reshape(-1))
        y = device.empty(desc.output_tensor.total_tensor_size_in_bytes // x.itemsize, dtype)
        compiled.execute([t], [y])
        compiled.release()
        raw = y.numpy()
        got = np.lib.stride_tricks.as_strided(raw, osz, [s * raw.itemsize for s in ost])
        assert_close(np.array(got),
                     lp_pooling_reference(x, (2, 3), (1, 2), (1, 1), (0, 0), (0, 0), 2), dtype, 2)


def test_windows_beyond_max_storage_buffer_range(device):
    with vkml.Device(device.index, limits={"maxStorageBufferRange": 4096}) as small:
        rng = np.random.default_rng(13)
        for dtype, shape in (("float32", (2, 3, 20, 30)), ("float16", (1, 2, 6, 20, 30))):
            x = rng.standard_normal(shape).astype(dtype)
            window = (3,) * (len(shape) - 2)
            got = vkml.lp_pooling(x, window, strides=2, start_padding=1, end_padding=1, p=2,
                                  device=small)
            d = len(window)
            assert_close(got,
                         lp_pooling_reference(x, window, (2,) * d, (1,) * d, (1,) * d, (1,) * d, 2),
                         dtype, 2)


def test_tensor_in_tensor_out(device):
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    t = vkml.tensor(x, device=device)
    y = vkml.lp_pooling(t, 2, strides=2, p=1)
    assert isinstance(y, vkml.Tensor) and y.shape == (1, 1, 2, 2)
    np.testing.assert_array_equal(y.numpy(), [[[[10, 18], [42, 50]]]])


# -- validation -------------------------------------------------------------------------
def _desc(cls=dml.LpPooling1OperatorDesc, **kw):
    args = dict(POOLING_DESC_ARGS, p=2)
    if cls is dml.LpPoolingOperatorDesc:
        args.pop("dilations")
    args.update(kw)
    return cls(**args)


@pytest.mark.parametrize("kw,field", POOLING_WINDOW_CASES + [
    (dict(input_tensor=dml.TensorDesc("int32", (1, 2, 8, 8)),
          output_tensor=dml.TensorDesc("int32", (1, 2, 4, 4))), "input_tensor.data_type"),
    (dict(p=0), "p"),
    (dict(p=2.5), "p"),
])
def test_validation_names_the_field(device, kw, field):
    with pytest.raises(ValidationError) as err:
        device.create_operator(_desc(**kw))
    assert f"LpPooling1OperatorDesc.{field}" in str(err.value)
    if "dilations" not in kw:
        with pytest.raises(ValidationError) as err:
            device.create_operator(_desc(dml.LpPoolingOperatorDesc, **kw))
        assert f"LpPoolingOperatorDesc.{field}" in str(err.value)


@pytest.mark.parametrize("x, window, p, field", [
    ((1, 1, 4, 4), 2, 1.5, "p"), ((1, 1, 4, 4), 2, 0, "p"), ((1, 1, 4, 4), 2, True, "p"),
    ((4, 4), 2, 2, "x"), ((1, 1, 4, 4), 5, 2, "window_size"),
    ("float64", 2, 2, "data_type")])
def test_functional_argument_errors(device, x, window, p, field):
    x = np.zeros((1, 1, 4, 4), x) if isinstance(x, str) else np.zeros(x, np.float32)
    with pytest.raises(ValidationError) as err:
        vkml.lp_pooling(x, window, p=p, device=device)
    assert field in err.value.field


def test_feature_levels():
    assert _desc().feature_level() == dml.FeatureLevel.FL_6_2
    assert _desc(dml.LpPoolingOperatorDesc).feature_level() == dml.FeatureLevel.FL_1_0


def test_grids_beyond_max_workgroup_count(device):
    for dev, x, window in split_grid_windows(device):
        d = len(window)
        got = vkml.lp_pooling(x, window, start_padding=1, p=2, device=dev)
        assert_close(got, lp_pooling_reference(x, window, (1,) * d, (1,) * d, (1,) * d,
                                               (0,) * d, 2), "float32", 2)

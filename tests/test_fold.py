"""DML_FOLD_OPERATOR_DESC (col2im) and vkml.fold, on every device.

References: the page's three examples verbatim (float32, and as float16 and int32);
``torch.nn.functional.fold`` for 2-D with symmetric padding; an independent NumPy
reference (tests/references.py) for 1-D to 6-D and every data type.

Tolerances: integer types exact (sums wrap around modulo 2^bits, as NumPy's); float32
within 1e-5 relative to the largest magnitude of the result (the order of summation
differs from the references'); float16 within one float16 ulp of a float64 reference
(vkml sums in float32 and rounds once); float64 within 1e-12.
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

from helpers import ALL_DTYPES, random_window_case, run_desc
from references import fold_reference, window_counts

# -- the page's examples, verbatim ------------------------------------------------------
EX1_OUT = [[0., 5., 13., 9.], [14., 38., 54., 32.], [38., 86., 102., 56.], [26., 57., 65., 35.]]
EX2_OUT = [[26., 70., 102., 60.], [78., 183., 231., 129.], [84., 195., 243., 135.],
           [82., 182., 214., 116.]]
EX3_OUT2 = [[170., 358., 390., 204.], [294., 615., 663., 345.], [300., 627., 675., 351.],
            [226., 470., 502., 260.]]
EXAMPLES = {
    # name: (input sizes, start padding, end padding, output sizes, expected output)
    "example1": ((1, 9, 4), (0, 0), (0, 0), (1, 1, 4, 4), [[EX1_OUT]]),
    "example2": ((1, 9, 8), (1, 0), (1, 0), (1, 1, 4, 4), [[EX2_OUT]]),
    "example3": ((1, 18, 8), (1, 0), (1, 0), (1, 2, 4, 4), [[EX2_OUT, EX3_OUT2]]),
}


@pytest.mark.parametrize("name", list(EXAMPLES))
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_page_examples(device, name, dtype):
    in_sizes, start, end, out_sizes, expect = EXAMPLES[name]
    x = np.arange(math.prod(in_sizes)).reshape(in_sizes).astype(dtype)
    expect = np.array(expect, dtype=dtype)
    desc = dml.FoldOperatorDesc(dml.TensorDesc(dtype, in_sizes), dml.TensorDesc(dtype, out_sizes),
                                window_sizes=(3, 3), strides=(1, 1), dilations=(1, 1),
                                start_padding=start, end_padding=end)
    np.testing.assert_array_equal(run_desc(device, desc, x)[:math.prod(out_sizes)].reshape(out_sizes), expect)
    got = vkml.fold(x, out_sizes[2:], (3, 3), start_padding=start, end_padding=end,
                    device=device)
    np.testing.assert_array_equal(got, expect)


def test_same_dimension_count_input(device):
    """The page's constraint "the same DimensionCount": the input may carry leading 1s."""
    x = np.arange(36, dtype=np.float32).reshape(1, 1, 9, 4)
    desc = dml.FoldOperatorDesc(dml.TensorDesc("float32", (1, 1, 9, 4)),
                                dml.TensorDesc("float32", (1, 1, 4, 4)), (3, 3))
    got = run_desc(device, desc, x).reshape(1, 1, 4, 4)
    np.testing.assert_array_equal(got, np.array([[EX1_OUT]], np.float32))


def assert_close(got, ref, dtype):
    """The tolerances of the module doc."""
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        np.testing.assert_array_equal(got, ref.astype(dt))
    elif dt == np.float16:
        want = ref.astype(np.float16).astype(np.float64)
        ulp = np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)
        assert np.all(np.abs(got.astype(np.float64) - want) <= ulp), \
            np.abs(got.astype(np.float64) - want).max()
    elif dt == np.float64:
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    else:
        scale = max(1.0, float(np.abs(ref).max()))
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * scale)


def random_values(rng, shape, dtype):
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt)


# -- randomized comparisons ---------------------------------------------------------------
def test_random_2d_against_torch(device, budget):
    """torch.nn.functional.fold (symmetric padding, float32 and float64)."""
    rng = np.random.default_rng(20)
    for case in range(budget):
        dtype = "float32" if case % 4 else "float64"
        if dtype == "float64" and not device.features["fp64"]:
            dtype = "float32"
        n, c, out, window, strides, dil, start, _ = random_window_case(rng, 2, 20000, symmetric=True)
        blocks = window_counts(out, window, strides, dil, start, start)
        x = random_values(rng, (n, c * math.prod(window), math.prod(blocks)), dtype)
        got = vkml.fold(x, out, window, strides=strides, dilations=dil, start_padding=start,
                        end_padding=start, device=device)
        ref = F.fold(torch.from_numpy(x).double(), out, window, dil, start, strides).numpy()
        assert_close(got, ref, dtype)


@pytest.mark.parametrize("dims", [1, 2, 3, 4, 5, 6])
def test_random_against_numpy(device, budget, dims):
    """1 to 6 spatial dimensions, asymmetric padding, every data type the device adds."""
    rng = np.random.default_rng(100 + dims)
    types = [t for t in ALL_DTYPES if t != "float64" or device.features["fp64"]]
    for case in range(max(4, budget // 2)):
        dtype = types[case % len(types)]
        n, c, out, window, strides, dil, start, end = random_window_case(
            rng, dims, 6000 if budget < 40 else 30000)
        blocks = window_counts(out, window, strides, dil, start, end)
        x = random_values(rng, (n, c * math.prod(window), math.prod(blocks)), dtype)
        got = vkml.fold(x, out, window, strides=strides, dilations=dil, start_padding=start,
                        end_padding=end, device=device)
        assert got.shape == (n, c, *out) and got.dtype == np.dtype(dtype)
        assert_close(got, fold_reference(x, out, window, strides, dil, start, end), dtype)


def test_integer_sums_wrap(device):
    """Integer sums wrap modulo 2^bits (two's complement), as NumPy's integer add."""
    for dtype in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"):
        info = np.iinfo(dtype)
        x = np.full((1, 9, 4), info.max, dtype=dtype)
        x[0, ::2] = info.max - 1
        got = vkml.fold(x, (4, 4), (3, 3), device=device)
        np.testing.assert_array_equal(got, fold_reference(x, (4, 4), (3, 3), (1, 1), (1, 1),
                                                     (0, 0), (0, 0)))


def test_deterministic(device):
    """The same input gives bit-identical output on every run (a gather, no atomics)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((2, 3 * 25, 100)) * 10 ** rng.uniform(-6, 6, (2, 75, 100))) \
        .astype(np.float32)
    desc = dml.FoldOperatorDesc(dml.TensorDesc("float32", x.shape),
                                dml.TensorDesc("float32", (2, 3, 12, 12)), (5, 5), (1, 1),
                                (1, 1), (1, 1), (1, 1))
    compiled = device.compile_operator(device.create_operator(desc))
    t = device.tensor(x)
    outs = []
    for _ in range(3):
        y = device.empty((2, 3, 12, 12), np.float32)
        compiled.execute([t], [y])
        outs.append(y.numpy().view(np.uint32))
    compiled.release()
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("read", ["ssbo", "texel", "texel4"])
@pytest.mark.parametrize("vec", [1, 4, 8])
def test_read_paths(device, read, vec, monkeypatch):
    """Every input path (storage buffer, R32 and RGBA32 texels) and outputs per
    invocation, forced, against the reference: rows of several lengths (tails), strides,
    dilations and padding on the last dimension."""
    from vkml.ops.fold import CompiledFold

    monkeypatch.setattr(CompiledFold, "force_read", read)
    monkeypatch.setattr(CompiledFold, "vec", vec)
    rng = np.random.default_rng(vec)
    for dtype in ("float32", "int32", "uint32"):
        for out, window, strides, dil, start, end in (
                ((7, 13), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
                ((5, 37), (2, 4), (1, 1), (1, 2), (0, 3), (1, 2)),
                ((6, 21), (3, 2), (2, 3), (1, 1), (2, 1), (0, 2)),
                ((3, 8), (1, 8), (1, 1), (1, 1), (0, 0), (0, 0))):
            blocks = window_counts(out, window, strides, dil, start, end)
            x = random_values(rng, (2, 3 * math.prod(window), math.prod(blocks)), dtype)
            got = vkml.fold(x, out, window, strides=strides, dilations=dil,
                            start_padding=start, end_padding=end, device=device)
            assert_close(got, fold_reference(x, out, window, strides, dil, start, end), dtype)


def _fold_on_read(device, read, x, out, window, strides, dil, start, end, in_strides=None,
                  phys=None):
    """Fold ``x`` compiled with ``read=`` forced through the constructor; asserts the
    path was taken (no silent fallback) and returns the output."""
    from vkml.ops.fold import CompiledFold

    dtype = x.dtype
    out_sizes = x.shape[:1] + (x.shape[1] // math.prod(window),) + tuple(out)
    desc = dml.FoldOperatorDesc(dml.TensorDesc(dtype, x.shape, in_strides),
                                dml.TensorDesc(dtype, out_sizes), window, strides, dil,
                                start, end)
    op = CompiledFold(device, desc, read=read)
    assert op.read == read and op.kernel.endswith("_" + read)
    raw = run_desc(device, desc, x if phys is None else phys, compiled=op)
    return raw[:math.prod(out_sizes)].reshape(out_sizes)


@pytest.mark.parametrize("vec", [1, 4, 8])
def test_ssbo4_read(device, vec, monkeypatch):
    """The "ssbo4" read (4-element groups from a vec4 storage buffer, chosen by the
    tuner where it is faster: SwiftShader), forced by ``read=``: tails, strides,
    dilations, padding; a non-packed input (padded rows, N outermost); and windows
    (maxStorageBufferRange lowered to 4096 bytes: each binding ends on whole vec4s)."""
    from vkml.ops.fold import CompiledFold

    monkeypatch.setattr(CompiledFold, "vec", vec)
    rng = np.random.default_rng(40 + vec)
    cases = (((7, 13), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
             ((5, 37), (2, 4), (1, 1), (1, 2), (0, 3), (1, 2)),
             ((6, 21), (3, 2), (2, 1), (1, 1), (2, 1), (0, 2)),
             ((3, 8), (1, 8), (1, 1), (1, 1), (0, 0), (0, 0)))
    for dtype in ("float32", "int32"):
        for out, window, strides, dil, start, end in cases:
            blocks = window_counts(out, window, strides, dil, start, end)
            x = random_values(rng, (2, 3 * math.prod(window), math.prod(blocks)), dtype)
            expect = fold_reference(x, out, window, strides, dil, start, end)
            assert_close(_fold_on_read(device, "ssbo4", x, out, window, strides, dil, start,
                                       end), expect, dtype)
        # non-packed: rows padded to count + 3 elements, batches 5 elements apart
        out, window, strides, dil, start, end = cases[0]
        count = math.prod(window_counts(out, window, strides, dil, start, end))
        x = random_values(rng, (2, 9 * 2, count), dtype)
        in_strides = (18 * (count + 3) + 5, count + 3, 1)
        phys = np.zeros(in_strides[0] * 2, x.dtype)
        np.lib.stride_tricks.as_strided(phys, x.shape, [s * x.itemsize for s in in_strides])[...] = x
        assert_close(_fold_on_read(device, "ssbo4", x, out, window, strides, dil, start, end,
                                   in_strides, phys),
                     fold_reference(x, out, window, strides, dil, start, end), dtype)
    with vkml.Device(device.index, limits={"maxStorageBufferRange": 4096}) as small:
        for dtype, c, out, window in (("float32", 4, (6, 7), (3, 3)),
                                      ("int32", 3, (9, 13), (2, 3))):
            pads = (1,) * len(out)
            ones = (1,) * len(out)
            blocks = window_counts(out, window, ones, ones, pads, pads)
            x = random_values(rng, (2, c * math.prod(window), math.prod(blocks)), dtype)
            assert x.nbytes > 4096
            got = _fold_on_read(small, "ssbo4", x, out, window, ones, ones, pads, pads)
            assert_close(got, fold_reference(x, out, window, ones, ones, pads, pads), dtype)


@pytest.mark.parametrize("read", ["roll", "tile"])
def test_roll_and_tile_reads(device, read):
    """The float32 2-D kernels of glsl/fold_roll.comp, forced by ``read=``: "roll" (rolled
    window loops, 4 outputs a vec4) and "tile" (the same adding from a shared-memory tile
    the workgroup loads first), chosen by the tuner where faster: tails (rows shorter
    than 4 too), strides, dilations, padding (more than a window: blocks that meet no
    output); a non-packed input; windows (maxStorageBufferRange lowered to 4096 bytes);
    "tile" with maxComputeSharedMemorySize lowered to 1 KiB (smaller workgroups)."""
    rng = np.random.default_rng(60)
    cases = (((7, 13), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
             ((5, 37), (2, 4), (1, 1), (1, 2), (0, 3), (1, 2)),
             ((6, 21), (3, 2), (2, 1), (1, 1), (2, 1), (0, 2)),
             ((9, 3), (2, 3), (2, 3), (1, 2), (3, 0), (1, 4)),
             ((3, 8), (1, 8), (1, 1), (1, 1), (0, 0), (0, 0)))
    for out, window, strides, dil, start, end in cases:
        blocks = window_counts(out, window, strides, dil, start, end)
        x = random_values(rng, (2, 3 * math.prod(window), math.prod(blocks)), "float32")
        expect = fold_reference(x, out, window, strides, dil, start, end)
        assert_close(_fold_on_read(device, read, x, out, window, strides, dil, start, end),
                     expect, "float32")
    out, window, strides, dil, start, end = cases[0]
    count = math.prod(window_counts(out, window, strides, dil, start, end))
    x = random_values(rng, (2, 9 * 2, count), "float32")
    in_strides = (18 * (count + 3) + 5, count + 3, 1)
    phys = np.zeros(in_strides[0] * 2, x.dtype)
    np.lib.stride_tricks.as_strided(phys, x.shape, [s * x.itemsize for s in in_strides])[...] = x
    assert_close(_fold_on_read(device, read, x, out, window, strides, dil, start, end,
                               in_strides, phys),
                 fold_reference(x, out, window, strides, dil, start, end), "float32")
    limits = [{"maxStorageBufferRange": 4096}]
    if read == "tile":
        limits.append({"maxComputeSharedMemorySize": 1024})
    for lim in limits:
        with vkml.Device(device.index, limits=lim) as small:
            out, window, pads, ones = (6, 7), (3, 3), (1, 1), (1, 1)
            blocks = window_counts(out, window, ones, ones, pads, pads)
            x = random_values(rng, (2, 4 * 9, math.prod(blocks)), "float32")
            got = _fold_on_read(small, read, x, out, window, ones, ones, pads, pads)
            assert_close(got, fold_reference(x, out, window, ones, ones, pads, pads), "float32")


def test_read_path_tuned(device):
    """The tuner's read path: ``VKML_TUNE=off`` keeps the texel rule ("auto"), and each
    candidate it can measure runs the bench's shape class (forced, not stored)."""
    from vkml import tuning
    from vkml.ops.fold import READ_PATH

    shape = READ_PATH.examples[0]
    assert tuning.Tuner(mode="off").choose(device, READ_PATH, shape).name == "auto"
    for name in ("auto", "ssbo4"):
        assert tuning.Tuner(mode="off").choose(device, READ_PATH, shape, force=name).params[
            "read"] == name


@pytest.mark.parametrize("kind", ["input", "output"])
def test_strided_layouts(device, kind):
    """TensorDesc strides are honoured: a permuted/padded input (columns outermost) or a
    padded output."""
    rng = np.random.default_rng(3)
    for dtype in ("float32", "float16", "int8", "int64"):
        out, window, start = (6, 7), (2, 3), (1, 0)
        blocks = window_counts(out, window, (1, 1), (1, 1), start, start)
        n, c, count = 2, 3, math.prod(blocks)
        x = random_values(rng, (n, c * 6, count), dtype)
        expect = fold_reference(x, out, window, (1, 1), (1, 1), start, start)
        out_sizes = (n, c, *out)
        if kind == "input":
            phys = np.ascontiguousarray(x.transpose(2, 0, 1))          # (count, n, rows)
            in_desc = dml.TensorDesc(dtype, x.shape, (c * 6, 1, n * c * 6))
            out_desc = dml.TensorDesc(dtype, out_sizes)
            raw = run_desc(device, dml.FoldOperatorDesc(in_desc, out_desc, window,
                                                        start_padding=start, end_padding=start),
                           phys.reshape(-1))
            got = raw[:math.prod(out_sizes)].reshape(out_sizes)
        else:
            strides = (c * 8 * 9, 8 * 9, 9, 1)                           # rows of 9, 8 rows
            out_desc = dml.TensorDesc(dtype, out_sizes, strides)
            raw = run_desc(device, dml.FoldOperatorDesc(dml.TensorDesc(dtype, x.shape),
                                                        out_desc, window, start_padding=start,
                                                        end_padding=start), x)
            got = np.lib.stride_tricks.as_strided(raw, out_sizes,
                                                  [s * raw.itemsize for s in strides])
        assert_close(np.array(got), expect, dtype)


def test_packed_path_on_every_device(device):
    """Devices without 8/16-bit storage take the packed-word kernels: forced here."""
    with vkml.Device(device.index, disable_features=["storage8", "storage16"]) as dev:
        rng = np.random.default_rng(11)
        for dtype in ("float16", "int8", "uint16"):
            x = random_values(rng, (2, 2 * 9, 24), dtype)
            got = vkml.fold(x, (7, 9), (3, 3), start_padding=(1, 0), end_padding=(0, 1),
                            strides=(1, 2), device=dev)
            assert_close(got, fold_reference(x, (7, 9), (3, 3), (1, 2), (1, 1), (1, 0), (0, 1)), dtype)


def test_float64_needs_shader_float64(device):
    """float64 sums need shaderFloat64: UnsupportedError naming it where it is missing
    (SwiftShader; lavapipe with the feature disabled), exact results where present."""
    x = np.arange(36, dtype=np.float64).reshape(1, 9, 4) / 3
    ref = fold_reference(x, (4, 4), (3, 3), (1, 1), (1, 1), (0, 0), (0, 0))
    if device.features["fp64"]:
        assert_close(vkml.fold(x, (4, 4), (3, 3), device=device), ref, "float64")
    else:
        with pytest.raises(UnsupportedError, match="fp64"):
            vkml.fold(x, (4, 4), (3, 3), device=device)
    with vkml.Device(device.index, disable_features=["fp64"]) as dev:
        with pytest.raises(UnsupportedError, match="fp64"):
            vkml.fold(x, (4, 4), (3, 3), device=dev)
        # 64-bit integers add as 32-bit pairs with carry: no shaderInt64 needed
        xi = (np.arange(36, dtype=np.int64).reshape(1, 9, 4) - 18) * (2 ** 40 + 7)
        np.testing.assert_array_equal(vkml.fold(xi, (4, 4), (3, 3), device=dev),
                                      fold_reference(xi, (4, 4), (3, 3), (1, 1), (1, 1), (0, 0), (0, 0)))


def test_windows_beyond_max_storage_buffer_range(device):
    """Tensors larger than maxStorageBufferRange are split into boxes whose bindings fit
    (tested with the limit lowered to 4096 bytes); where even one output element's inputs
    (a channel's window rows) cannot be bound, UnsupportedError is raised up front."""
    with vkml.Device(device.index, limits={"maxStorageBufferRange": 4096}) as small:
        rng = np.random.default_rng(5)
        # the input of one channel fits a binding (K x BlockCount elements), the whole not
        for dtype, c, out, window, strides in (("float32", 4, (6, 7), (3, 3), (1, 1)),
                                               ("float16", 3, (9, 12), (2, 3), (2, 1)),
                                               ("int8", 2, (900,), (5,), (2,)),
                                               ("int64", 2, (3, 3, 4), (2, 2, 1), (1, 1, 1))):
            d = len(out)
            ones, pads = (1,) * d, (1,) * d
            blocks = window_counts(out, window, strides, ones, pads, pads)
            x = random_values(rng, (2, c * math.prod(window), math.prod(blocks)), dtype)
            assert x.nbytes > 4096
            got = vkml.fold(x, out, window, strides=strides, start_padding=pads,
                            end_padding=pads, device=small)
            assert_close(got, fold_reference(x, out, window, strides, ones, pads, pads), dtype)
        # one output element reading more than the device can bind: refused up front
        x = np.zeros((1, 2000, 1), np.float32)
        with pytest.raises(UnsupportedError, match="maxStorageBufferRange"):
            vkml.fold(x, (2000,), (2000,), device=small)


def test_staging_path(device):
    with vkml.Device(device.index, force_staging=True) as dev:
        x = np.random.default_rng(0).random((1, 18, 8)).astype(np.float32)
        got = vkml.fold(x, (4, 4), (3, 3), start_padding=(1, 0), end_padding=(1, 0), device=dev)
        assert_close(got, fold_reference(x, (4, 4), (3, 3), (1, 1), (1, 1), (1, 0), (1, 0)), "float32")


def test_tensor_in_tensor_out(device):
    x = np.arange(36, dtype=np.float32).reshape(1, 9, 4)
    t = vkml.tensor(x, device=device)
    y = vkml.fold(t, (4, 4), 3)
    assert isinstance(y, vkml.Tensor) and y.device is device and y.shape == (1, 1, 4, 4)
    np.testing.assert_array_equal(y.numpy(), np.array([[EX1_OUT]], np.float32))


# -- validation: every rule names its field -------------------------------------------------
def _desc(**kw):
    args = dict(input_tensor=dml.TensorDesc("float32", (1, 18, 8)),
                output_tensor=dml.TensorDesc("float32", (1, 2, 4, 4)),
                window_sizes=(3, 3), strides=(1, 1), dilations=(1, 1),
                start_padding=(1, 0), end_padding=(1, 0))
    args.update(kw)
    return dml.FoldOperatorDesc(**args)


@pytest.mark.parametrize("kw,field", [
    # input dimension 1 = C x prod(WindowSizes)
    (dict(input_tensor=dml.TensorDesc("float32", (1, 17, 8))), "input_tensor.sizes[1]"),
    # input dimension 2 = BlockCount = prod(BlocksPerDimension)
    (dict(input_tensor=dml.TensorDesc("float32", (1, 18, 9))), "input_tensor.sizes[2]"),
    (dict(strides=(2, 1)), "input_tensor.sizes[2]"),
    (dict(dilations=(2, 1)), "input_tensor.sizes[2]"),
    # N must match
    (dict(input_tensor=dml.TensorDesc("float32", (2, 18, 8))), "input_tensor.sizes[0]"),
    # BlocksPerDimension >= 1: the dilated window must fit
    (dict(window_sizes=(3, 5), input_tensor=dml.TensorDesc("float32", (1, 30, 8))),
     "window_sizes[1]"),
    # dimension counts
    (dict(window_sizes=(3, 3, 1)), "window_sizes"),
    (dict(strides=(1,)), "strides"),
    (dict(dilations=(1, 1, 1)), "dilations"),
    (dict(start_padding=(1,)), "start_padding"),
    (dict(end_padding=(1, 0, 0)), "end_padding"),
    (dict(input_tensor=dml.TensorDesc("float32", (1, 1, 1, 18, 8))), "input_tensor.sizes"),
    (dict(input_tensor=dml.TensorDesc("float32", (2, 1, 18, 8))), "input_tensor.sizes[0]"),
    (dict(output_tensor=dml.TensorDesc("float32", (8, 4))), "output_tensor.sizes"),
    # values
    (dict(window_sizes=(3, 0)), "window_sizes[1]"),
    (dict(strides=(0, 1)), "strides[0]"),
    (dict(dilations=(1, 0)), "dilations[1]"),
    (dict(start_padding=(-1, 0)), "start_padding[0]"),
    # types and layout
    (dict(output_tensor=dml.TensorDesc("float16", (1, 2, 4, 4))), "output_tensor.data_type"),
    (dict(output_tensor=dml.TensorDesc("float32", (1, 2, 4, 4), (32, 16, 4, 0))),
     "output_tensor.strides"),
    (dict(input_tensor=None), "input_tensor"),
    (dict(strides=2), "strides"),
])
def test_validation_names_the_field(device, kw, field):
    with pytest.raises(ValidationError) as err:
        device.create_operator(_desc(**kw))
    assert f"FoldOperatorDesc.{field}" in str(err.value)
    # the device stays usable after an error
    assert vkml.fold(np.ones((1, 1, 4), np.float32), (2, 2), 1, device=device).shape == \
        (1, 1, 2, 2)


def test_functional_argument_errors(device):
    x = np.zeros((1, 9, 4), np.float32)
    with pytest.raises(ValidationError, match="output_size"):
        vkml.fold(x, (2,) * 7, 1, device=device)
    with pytest.raises(ValidationError, match="x"):
        vkml.fold(np.zeros((9, 4), np.float32), (4, 4), 3, device=device)
    with pytest.raises(ValidationError, match="input_tensor.sizes"):
        vkml.fold(x, (4, 5), 3, device=device)


def test_dimension_count_limit():
    """DimensionCount must be <= 6 (TensorDesc allows at most 8 dimensions, N and C
    included)."""
    with pytest.raises(ValidationError):
        dml.TensorDesc("float32", (1,) * 9)


def test_feature_level():
    assert _desc().feature_level() == dml.FeatureLevel.FL_6_4


def test_grids_beyond_max_workgroup_count(device):
    """Dispatches larger than maxComputeWorkGroupCount are split (lowered here): along x,
    y and z, with rows of several invocations and with x over several dimensions."""
    with vkml.Device(device.index, limits={"maxComputeWorkGroupCount": (1, 3, 2)}) as dev:
        rng = np.random.default_rng(15)
        for out, window in (((5, 3, 600), (2, 1, 3)), ((4, 3, 5, 2), (2, 2, 2, 1))):
            d = len(out)
            blocks = window_counts(out, window, (1,) * d, (1,) * d, (1,) * d, (0,) * d)
            x = random_values(rng, (2, 3 * math.prod(window), math.prod(blocks)), "float32")
            got = vkml.fold(x, out, window, start_padding=1, device=dev)
            assert_close(got, fold_reference(x, out, window, (1,) * d, (1,) * d, (1,) * d, (0,) * d),
                         "float32")


def test_large_windows(device):
    """Windows longer than 32 along the last dimension take the loop that is not unrolled
    (a window of 300 compiles as fast as one of 3)."""
    rng = np.random.default_rng(18)
    for dtype, out, window, strides, dil in (("float32", (310,), (300,), (1,), (1,)),
                                             ("int32", (4, 90), (2, 40), (1, 3), (1, 2))):
        d = len(out)
        blocks = window_counts(out, window, strides, dil, (1,) * d, (2,) * d)
        x = random_values(rng, (1, 2 * math.prod(window), math.prod(blocks)), dtype)
        got = vkml.fold(x, out, window, strides=strides, dilations=dil, start_padding=1,
                        end_padding=2, device=device)
        assert_close(got, fold_reference(x, out, window, strides, dil, (1,) * d, (2,) * d), dtype)

"""DML_UNFOLD_OPERATOR_DESC (im2col) and vkml.unfold, on every device.

References: the page's two examples verbatim; ``torch.nn.functional.unfold`` for 2-D
(symmetric padding); an independent NumPy reference (tests/references.py) for 1-D to
6-D.  Unfold moves data, so every comparison is bit-exact (random bit patterns, NaN
payloads included).  And the
identity ``fold(unfold(x)) == x * overlap_counts`` (the counts: fold(unfold(ones))).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vkml
from vkml import dml
from vkml.errors import ValidationError

from helpers import ALL_DTYPES, random_bits, random_window_case, run_desc, same_bits
from references import unfold_reference, window_counts

EX1 = [[0, 1, 2, 5, 6, 7, 10, 11, 12], [1, 2, 3, 6, 7, 8, 11, 12, 13],
       [2, 3, 4, 7, 8, 9, 12, 13, 14], [5, 6, 7, 10, 11, 12, 15, 16, 17],
       [6, 7, 8, 11, 12, 13, 16, 17, 18], [7, 8, 9, 12, 13, 14, 17, 18, 19],
       [10, 11, 12, 15, 16, 17, 20, 21, 22], [11, 12, 13, 16, 17, 18, 21, 22, 23],
       [12, 13, 14, 17, 18, 19, 22, 23, 24]]
EX2 = [[0, 0, 0, 0, 1, 2, 5, 6, 7, 10, 11, 12, 15, 16, 17],
       [0, 0, 0, 1, 2, 3, 6, 7, 8, 11, 12, 13, 16, 17, 18],
       [0, 0, 0, 2, 3, 4, 7, 8, 9, 12, 13, 14, 17, 18, 19],
       [0, 1, 2, 5, 6, 7, 10, 11, 12, 15, 16, 17, 20, 21, 22],
       [1, 2, 3, 6, 7, 8, 11, 12, 13, 16, 17, 18, 21, 22, 23],
       [2, 3, 4, 7, 8, 9, 12, 13, 14, 17, 18, 19, 22, 23, 24],
       [5, 6, 7, 10, 11, 12, 15, 16, 17, 20, 21, 22, 0, 0, 0],
       [6, 7, 8, 11, 12, 13, 16, 17, 18, 21, 22, 23, 0, 0, 0],
       [7, 8, 9, 12, 13, 14, 17, 18, 19, 22, 23, 24, 0, 0, 0]]
EXAMPLES = {"example1": ((0, 0), (0, 0), (1, 9, 9), [EX1]),
            "example2": ((1, 0), (1, 0), (1, 9, 15), [EX2])}


@pytest.mark.parametrize("name", list(EXAMPLES))
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "uint8", "int64"])
def test_page_examples(device, name, dtype):
    start, end, out_sizes, expect = EXAMPLES[name]
    x = np.arange(25).reshape(1, 1, 5, 5).astype(dtype)
    expect = np.array(expect, dtype=dtype)
    desc = dml.UnfoldOperatorDesc(dml.TensorDesc(dtype, (1, 1, 5, 5)),
                                  dml.TensorDesc(dtype, out_sizes), (3, 3), (1, 1), (1, 1),
                                  start, end)
    np.testing.assert_array_equal(run_desc(device, desc, x)[:math.prod(out_sizes)].reshape(out_sizes), expect)
    got = vkml.unfold(x, (3, 3), start_padding=start, end_padding=end, device=device)
    np.testing.assert_array_equal(got, expect)


def random_case(rng, dims, max_elems, symmetric=False):
    n, c, spatial, *geometry = random_window_case(rng, dims, max_elems, symmetric)
    return ((n, c, *spatial), *geometry)


def test_random_2d_against_torch(device, budget):
    rng = np.random.default_rng(30)
    for _ in range(budget):
        shape, window, strides, dil, start, _ = random_case(rng, 2, 20000, symmetric=True)
        x = rng.standard_normal(shape).astype(np.float32)
        got = vkml.unfold(x, window, strides=strides, dilations=dil, start_padding=start,
                          end_padding=start, device=device)
        ref = F.unfold(torch.from_numpy(x), window, dil, start, strides).numpy()
        assert same_bits(got, ref), (shape, window, strides, dil, start)


@pytest.mark.parametrize("dims", [1, 2, 3, 4, 5, 6])
def test_random_against_numpy(device, budget, dims):
    """1 to 6 spatial dimensions, asymmetric padding, every data type, random bits."""
    rng = np.random.default_rng(200 + dims)
    for case in range(max(4, budget // 2)):
        dtype = ALL_DTYPES[case % len(ALL_DTYPES)]
        shape, window, strides, dil, start, end = random_case(
            rng, dims, 6000 if budget < 40 else 30000)
        x = random_bits(rng, shape, dtype)
        got = vkml.unfold(x, window, strides=strides, dilations=dil, start_padding=start,
                          end_padding=end, device=device)
        assert same_bits(got, unfold_reference(x, window, strides, dil, start, end)), \
            (dtype, shape, window, strides, dil, start, end)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_fold_of_unfold_is_x_times_overlap_counts(device, budget, dims):
    """fold(unfold(x)) = x * (how many windows cover each element), the counts being
    fold(unfold(ones)); exact for integers and integer-valued floats."""
    rng = np.random.default_rng(300 + dims)
    for case in range(max(3, budget // 4)):
        shape, window, strides, dil, start, end = random_case(rng, dims, 8000)
        kw = dict(strides=strides, dilations=dil, start_padding=start, end_padding=end,
                  device=device)
        for dtype in ("int32", "float32", "int16"):
            x = rng.integers(-100, 100, size=shape).astype(dtype)
            cols = vkml.unfold(x, window, **kw)
            back = vkml.fold(cols, shape[2:], window, **kw)
            counts = vkml.fold(vkml.unfold(np.ones(shape, dtype), window, **kw), shape[2:],
                               window, **kw)
            np.testing.assert_array_equal(back, x * counts)
        # the counts themselves, from the geometry: windows covering each coordinate
        per_dim = []
        for s, w, st, d, a, b in zip(shape[2:], window, strides, dil, start, end):
            cnt = np.zeros(s, np.int64)
            for blk in range(window_counts([s], [w], [st], [d], [a], [b])[0]):
                for k in range(w):
                    i = blk * st - a + k * d
                    if 0 <= i < s:
                        cnt[i] += 1
            per_dim.append(cnt)
        expect = np.ones(shape[2:], np.int64)
        for i, cnt in enumerate(per_dim):
            expect = expect * cnt.reshape([-1 if j == i else 1 for j in range(dims)])
        np.testing.assert_array_equal(counts[0, 0], expect)
        # and float data within rounding of x * counts
        xf = rng.standard_normal(shape).astype(np.float32)
        backf = vkml.fold(vkml.unfold(xf, window, **kw), shape[2:], window, **kw)
        np.testing.assert_allclose(backf, xf * counts, rtol=1e-6, atol=1e-6)


def test_packed_path_on_every_device(device):
    with vkml.Device(device.index, disable_features=["storage8", "storage16"]) as dev:
        rng = np.random.default_rng(11)
        for dtype in ("uint8", "int16", "float16"):
            x = random_bits(rng, (2, 3, 7, 5), dtype)
            got = vkml.unfold(x, (2, 3), strides=(2, 1), start_padding=(1, 0),
                              end_padding=(0, 2), device=dev)
            assert same_bits(got, unfold_reference(x, (2, 3), (2, 1), (1, 1), (1, 0), (0, 2)))


def test_strided_layouts(device):
    """A channels-last input and an output with padded rows, through the DML layer."""
    rng = np.random.default_rng(4)
    for dtype in ("float32", "uint16", "int8", "float64"):
        x = random_bits(rng, (2, 3, 6, 5), dtype)
        phys = np.ascontiguousarray(x.transpose(0, 2, 3, 1))            # NHWC
        in_desc = dml.TensorDesc(dtype, x.shape, (90, 1, 15, 3))
        blocks = window_counts((6, 5), (3, 2), (1, 2), (1, 1), (1, 1), (1, 0))
        count = math.prod(blocks)
        out_sizes = (2, 18, count)
        out_strides = (18 * (count + 3), count + 3, 1)
        out_desc = dml.TensorDesc(dtype, out_sizes, out_strides)
        raw = run_desc(device, dml.UnfoldOperatorDesc(in_desc, out_desc, (3, 2), (1, 2), (1, 1),
                                                      (1, 1), (1, 0)), phys.reshape(-1))
        got = np.lib.stride_tricks.as_strided(raw, out_sizes,
                                              [s * raw.itemsize for s in out_strides])
        assert same_bits(np.array(got), unfold_reference(x, (3, 2), (1, 2), (1, 1), (1, 1), (1, 0)))


def test_windows_beyond_max_storage_buffer_range(device):
    with vkml.Device(device.index, limits={"maxStorageBufferRange": 4096}) as small:
        rng = np.random.default_rng(6)
        for dtype, shape, window in (("float32", (2, 3, 20, 30), (3, 3)),
                                     ("uint8", (1, 2, 900), (4,)),
                                     ("float16", (2, 2, 6, 7, 8), (2, 2, 2))):
            x = random_bits(rng, shape, dtype)
            d = len(window)
            got = vkml.unfold(x, window, start_padding=1, end_padding=1, device=small)
            assert got.nbytes > 4096
            assert same_bits(got, unfold_reference(x, window, (1,) * d, (1,) * d, (1,) * d, (1,) * d))


def test_tensor_in_tensor_out(device):
    x = np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5)
    t = vkml.tensor(x, device=device)
    cols = vkml.unfold(t, 3)
    assert isinstance(cols, vkml.Tensor) and cols.shape == (1, 9, 9)
    np.testing.assert_array_equal(cols.numpy(), np.array([EX1], np.float32))
    back = vkml.fold(cols, (5, 5), 3)                     # chained on the device
    assert isinstance(back, vkml.Tensor)


# -- validation -------------------------------------------------------------------------
def _desc(**kw):
    args = dict(input_tensor=dml.TensorDesc("float32", (1, 1, 5, 5)),
                output_tensor=dml.TensorDesc("float32", (1, 9, 15)),
                window_sizes=(3, 3), strides=(1, 1), dilations=(1, 1),
                start_padding=(1, 0), end_padding=(1, 0))
    args.update(kw)
    return dml.UnfoldOperatorDesc(**args)


@pytest.mark.parametrize("kw,field", [
    (dict(output_tensor=dml.TensorDesc("float32", (1, 9, 14))), "output_tensor.sizes[2]"),
    (dict(output_tensor=dml.TensorDesc("float32", (1, 8, 15))), "output_tensor.sizes[1]"),
    (dict(output_tensor=dml.TensorDesc("float32", (2, 9, 15))), "output_tensor.sizes[0]"),
    (dict(output_tensor=dml.TensorDesc("float32", (1, 1, 9, 15))), None),  # leading 1: valid
    (dict(output_tensor=dml.TensorDesc("float32", (1, 1, 1, 1, 9, 15))), "output_tensor.sizes"),
    (dict(output_tensor=dml.TensorDesc("float32", (1, 1, 1, 9, 15)),
          input_tensor=dml.TensorDesc("float32", (1, 1, 1, 5, 5)), window_sizes=(1, 3, 3),
          strides=None, dilations=None, start_padding=(0, 1, 0), end_padding=(0, 1, 0)),
     None),                                                     # leading 1s: valid
    (dict(window_sizes=(3, 6)), "window_sizes[1]"),
    (dict(window_sizes=(3,)), "window_sizes"),
    (dict(strides=(1, 0)), "strides[1]"),
    (dict(dilations=(0, 1)), "dilations[0]"),
    (dict(end_padding=(1, -2)), "end_padding[1]"),
    (dict(start_padding=(1, 0, 0)), "start_padding"),
    (dict(input_tensor=dml.TensorDesc("float32", (5, 5))), "input_tensor.sizes"),
    (dict(output_tensor=dml.TensorDesc("int32", (1, 9, 15))), "output_tensor.data_type"),
    (dict(output_tensor=dml.TensorDesc("float32", (1, 9, 15), (135, 0, 1))),
     "output_tensor.strides"),
])
def test_validation_names_the_field(device, kw, field):
    if field is None:
        device.create_operator(_desc(**kw))
        return
    with pytest.raises(ValidationError) as err:
        device.create_operator(_desc(**kw))
    assert f"UnfoldOperatorDesc.{field}" in str(err.value)


def test_functional_argument_errors(device):
    with pytest.raises(ValidationError, match="x"):
        vkml.unfold(np.zeros((4, 4), np.float32), 3, device=device)
    with pytest.raises(ValidationError, match="window_sizes"):
        vkml.unfold(np.zeros((1, 1, 4, 4), np.float32), 5, device=device)
    with pytest.raises(ValidationError, match="strides"):
        vkml.unfold(np.zeros((1, 1, 4, 4), np.float32), 2, strides=(1, 1, 1), device=device)


def test_feature_level():
    assert _desc().feature_level() == dml.FeatureLevel.FL_6_4


def test_grids_beyond_max_workgroup_count(device):
    with vkml.Device(device.index, limits={"maxComputeWorkGroupCount": (1, 3, 2)}) as dev:
        rng = np.random.default_rng(16)
        for shape, window in (((2, 3, 5, 600), (2, 3)), ((1, 2, 4, 3, 5, 2), (2, 2, 1, 2))):
            x = random_bits(rng, shape, "int16")
            d = len(window)
            got = vkml.unfold(x, window, end_padding=1, device=dev)
            assert same_bits(got, unfold_reference(x, window, (1,) * d, (1,) * d, (0,) * d, (1,) * d))


@pytest.mark.parametrize("read", ["ssbo", "texel4"])
@pytest.mark.parametrize("vec", [1, 4, 8])
def test_read_paths(device, read, vec, monkeypatch):
    """Each input path forced (storage buffer; RGBA32 texels shifted into place for
    4-byte elements) with 1, 4 or 8 outputs per invocation: row tails, strides,
    dilations, padding on both sides, 1-D to 3-D."""
    from vkml.ops.unfold import CompiledUnfold

    monkeypatch.setattr(CompiledUnfold, "force_read", read)
    monkeypatch.setattr(CompiledUnfold, "vec", vec)
    rng = np.random.default_rng(vec)
    for dtype in ("float32", "int8", "float64"):
        for shape, window, strides, dil, start, end in (
                ((2, 3, 9, 37), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
                ((1, 2, 5, 13), (2, 4), (1, 2), (2, 1), (0, 2), (1, 3)),
                ((2, 2, 40), (5,), (1,), (3,), (2,), (0,)),
                ((1, 2, 3, 4, 21), (2, 1, 3), (1, 2, 1), (1, 1, 2), (1, 0, 1), (0, 1, 1))):
            x = random_bits(rng, shape, dtype)
            got = vkml.unfold(x, window, strides=strides, dilations=dil, start_padding=start,
                              end_padding=end, device=device)
            assert same_bits(got, unfold_reference(x, window, strides, dil, start, end)), \
                (dtype, shape, window)


def test_large_windows(device):
    """Window rows too long to read at once (more than 32 inputs) are read element by
    element, in a loop that is not unrolled."""
    rng = np.random.default_rng(19)
    for dtype, shape, window, strides, dil in (("float32", (1, 2, 330), (300,), (1,), (1,)),
                                               ("uint16", (2, 1, 5, 100), (2, 40), (1, 3),
                                                (1, 2))):
        x = random_bits(rng, shape, dtype)
        d = len(window)
        got = vkml.unfold(x, window, strides=strides, dilations=dil, start_padding=1,
                          end_padding=2, device=device)
        assert same_bits(got, unfold_reference(x, window, strides, dil, (1,) * d, (2,) * d))


def _unfold_on_read(device, read, x, window, strides, dil, start, end, in_strides=None,
                    phys=None):
    """Unfold ``x`` compiled with ``read=`` forced through the constructor; asserts the
    path was taken (no silent fallback) and returns the output."""
    from vkml.ops.unfold import CompiledUnfold

    blocks = window_counts(x.shape[2:], window, strides, dil, start, end)
    out = (x.shape[0], x.shape[1] * math.prod(window), math.prod(blocks))
    desc = dml.UnfoldOperatorDesc(dml.TensorDesc(x.dtype, x.shape, in_strides),
                                  dml.TensorDesc(x.dtype, out), window, strides, dil, start,
                                  end)
    op = CompiledUnfold(device, desc, read=read)
    assert op.read == read and op.kernel.endswith("_" + read)
    raw = run_desc(device, desc, x if phys is None else phys, compiled=op)
    return raw[:math.prod(out)].reshape(out)


def test_tile_read(device):
    """The "tile" kernel (glsl/unfold_tile.comp: 4-byte elements, 2 spatial dimensions,
    the workgroup's input tile with the halo copied into shared memory first; the tuner
    chooses it where faster), forced by ``read=``: every bit pattern of 4-byte types, row
    tails (rows shorter than 4 too), strides, dilations, padding (more than a window); a
    non-packed input; maxComputeSharedMemorySize lowered to 1 KiB (smaller workgroups)."""
    rng = np.random.default_rng(90)
    cases = (((2, 3, 9, 37), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
             ((1, 2, 5, 13), (2, 4), (1, 2), (2, 1), (0, 2), (1, 3)),
             ((1, 2, 7, 3), (2, 2), (2, 3), (1, 2), (3, 0), (1, 4)))
    for dtype in ("float32", "int32"):
        for shape, window, strides, dil, start, end in cases:
            x = random_bits(rng, shape, dtype)
            got = _unfold_on_read(device, "tile", x, window, strides, dil, start, end)
            assert same_bits(got, unfold_reference(x, window, strides, dil, start, end)), \
                (dtype, shape, window)
    shape, window, strides, dil, start, end = cases[0]
    x = random_bits(rng, shape, "float32")
    in_strides = (3 * (9 * 41 + 3), 9 * 41 + 3, 41, 1)
    phys = np.zeros(2 * in_strides[0], np.float32)
    np.lib.stride_tricks.as_strided(phys, shape, [s * 4 for s in in_strides])[...] = x
    got = _unfold_on_read(device, "tile", x, window, strides, dil, start, end, in_strides, phys)
    assert same_bits(got, unfold_reference(x, window, strides, dil, start, end))
    with vkml.Device(device.index, limits={"maxComputeSharedMemorySize": 1024}) as small:
        x = random_bits(rng, (1, 3, 20, 30), "uint32")
        got = _unfold_on_read(small, "tile", x, (3, 3), (2, 1), (1, 2), (1, 1), (1, 2))
        assert same_bits(got, unfold_reference(x, (3, 3), (2, 1), (1, 2), (1, 1), (1, 2)))


def test_read_path_tuned(device):
    """``VKML_TUNE=off`` keeps "auto" as the read path."""
    from vkml import tuning
    from vkml.ops.unfold import READ_PATH

    assert tuning.Tuner(mode="off").choose(device, READ_PATH, READ_PATH.examples[0]).name == "auto"

"""DML_SLICE and DML_SLICE1 (vkml.slice): the pages' examples verbatim, random slices of
every data type bit for bit against NumPy indexing (positive and negative strides, permuted
and padded input layouts, strided outputs with canaries), both paths, windows and split
grids at lowered limits, every rule of both pages."""
from __future__ import annotations

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.errors import ArgumentTypeError, ValidationError

from helpers import ALL_DTYPES, random_bits, same_bits
from test_join import OPS, check_out, layout, out_layout, run_copies

X = np.arange(1, 17, dtype=np.float32).reshape(1, 1, 4, 4)
T4 = dml.TensorDesc("float32", (1, 1, 4, 4))


def _slice(device, desc):
    (got,), _ = run_copies(device, desc, [X.reshape(-1)])
    return got.reshape(desc.output_tensor.sizes)


@pytest.mark.parametrize("offsets, sizes, strides, want", [
    ((0, 0, 1, 2), (1, 1, 3, 2), (1, 1, 1, 1), [[[[7, 8], [11, 12], [15, 16]]]]),
    ((0, 0, 1, 0), (1, 1, 2, 2), (1, 1, 2, 3), [[[[5, 8], [13, 16]]]]),
])
def test_slice_page_examples(device, offsets, sizes, strides, want):
    desc = dml.SliceOperatorDesc(T4, dml.TensorDesc("float32", sizes), offsets, sizes, strides)
    assert same_bits(_slice(device, desc), np.array(want, np.float32))
    assert same_bits(vkml.slice(X, offsets, sizes, strides, device=device),
                     np.array(want, np.float32))


@pytest.mark.parametrize("strides, want", [
    ((1, 1, 2, 2), [[[[2, 4], [10, 12]]]]),
    ((1, 1, -2, 2), [[[[14, 16], [6, 8]]]]),
])
def test_slice1_page_examples(device, strides, want):
    desc = dml.Slice1OperatorDesc(T4, dml.TensorDesc("float32", (1, 1, 2, 2)), (0, 0, 0, 1),
                                  (1, 1, 4, 3), strides)
    assert same_bits(_slice(device, desc), np.array(want, np.float32))


def _random_slice1(rng, shape):
    offs, wins, steps, outs = [], [], [], []
    for n in shape:
        o = int(rng.integers(0, n))
        w = int(rng.integers(1, n - o + 1))
        s = int(rng.integers(1, 4)) * int(rng.choice([-1, 1]))
        most = 1 + (w - 1) // abs(s)
        offs.append(o)
        wins.append(w)
        steps.append(s)
        outs.append(int(rng.integers(1, most + 1)))
    return offs, wins, steps, outs


@pytest.mark.parametrize("path", [None, "kernel", "copy"])
def test_random_slices(device, budget, path):
    rng = np.random.default_rng({None: 20, "kernel": 21, "copy": 22}[path])
    for i in range(budget):
        dtype = ALL_DTYPES[(i * 3 + len(path or "")) % 11]
        rank = int(rng.integers(1, 6))
        shape = [int(rng.integers(1, 7)) for _ in range(rank)]
        flat, st, logical = layout(rng, shape, dtype)
        offs, wins, steps, outs = _random_slice1(rng, shape)
        if i % 2:
            steps = [abs(s) for s in steps]
            ost, _, idx = out_layout(rng, outs)
            desc = dml.SliceOperatorDesc(dml.TensorDesc(dtype, shape, st),
                                         dml.TensorDesc(dtype, outs, ost), offs, outs, steps)
            start = offs
        else:
            ost, _, idx = out_layout(rng, outs)
            desc = dml.Slice1OperatorDesc(dml.TensorDesc(dtype, shape, st),
                                          dml.TensorDesc(dtype, outs, ost), offs, wins, steps)
            start = [o + (w - 1 if s < 0 else 0) for o, w, s in zip(offs, wins, steps)]
        want = logical[np.ix_(*[a + s * np.arange(n) for a, s, n in zip(start, steps, outs)])]
        (got,), _ = run_copies(device, desc, [flat], path)
        check_out(got, idx, want, None)


def test_functional_all_types(device):
    rng = np.random.default_rng(23)
    for dtype in ALL_DTYPES:
        x = random_bits(rng, (4, 5, 6), dtype)
        assert same_bits(vkml.slice(x, (3, 1, 5), (2, 2, 3), (-2, 3, -1), device=device),
                         x[3::-2, 1::3, 5::-1][:2, :2, :3])
        assert same_bits(vkml.slice(x, (0, 1, 2), (4, 3, 2), device=device), x[:, 1:4, 2:4])
    t = vkml.tensor(x, device=device)
    y = vkml.slice(t, (1, 0, 0), (1, 5, 6))
    assert isinstance(y, vkml.Tensor) and same_bits(y.numpy(), x[1:2])


def test_long_rows_copy_engine(device):
    rng = np.random.default_rng(24)
    x = random_bits(rng, (6, 3000), "float32")
    desc = dml.SliceOperatorDesc(dml.TensorDesc("float32", x.shape),
                                 dml.TensorDesc("float32", (2, 2999)), (1, 1), (2, 2999), (3, 1))
    (got,), paths = run_copies(device, desc, [x.reshape(-1)])
    assert paths == ["copy"] and same_bits(got.reshape(2, 2999), x[1::3, 1:])


@pytest.mark.parametrize("dtype", ["uint64", "int8"])
def test_windows_and_split_grids(device, dtype):
    """A reversing slice bound in windows with split grids."""
    rng = np.random.default_rng(25)
    x = random_bits(rng, (40, 30) if dtype == "uint64" else (96, 30), dtype)
    n0 = x.shape[0]
    align = device._ctx.binding_alignment()
    limits = {"maxStorageBufferRange": x.nbytes // 4 + 4 * align,
              "maxComputeWorkGroupCount": (2, 2, 2)}
    desc = dml.Slice1OperatorDesc(dml.TensorDesc(dtype, x.shape),
                                  dml.TensorDesc(dtype, (n0 - 2, 29)), (1, 0), (n0 - 1, 30),
                                  (-1, -1))
    with vkml.Device(device.index, limits=limits) as dev:
        op = OPS.CompiledSlice(dev, dev.create_operator(desc).desc, path="kernel")
        try:
            assert op.steps[0][2][1] is not None and len(op.steps[0][2][1]) > 1
            y = dev.empty((n0 - 2, 29), dtype)
            op.execute([dev.tensor(x)], [y])
            assert same_bits(y.numpy(), x[n0 - 1:1:-1, 29:0:-1])
        finally:
            op.release()


S = dml.TensorDesc("int16", (4, 5))
O = dml.TensorDesc("int16", (2, 2))


@pytest.mark.parametrize("out, offsets, sizes, strides, field", [
    (O, (0, 0, 0), (2, 2), (1, 1), "offsets"),
    (O, (0, 0), (2, 3), (1, 1), "sizes[1]"),
    (O, (0, 0), (2, 2), (1, 0), "strides[1]"),
    (O, (3, 0), (2, 2), (1, 1), "offsets[0]"),
    (O, (0, 2), (2, 2), (1, 3), "offsets[1]"),
    (O, (-1, 0), (2, 2), (1, 1), "offsets[0]"),
    (dml.TensorDesc("int32", (2, 2)), (0, 0), (2, 2), (1, 1), "output_tensor.data_type"),
    (dml.TensorDesc("int16", (2, 2, 1)), (0, 0), (2, 2), (1, 1), "output_tensor.sizes"),
    (dml.TensorDesc("int16", (2, 2), (1, 0)), (0, 0), (2, 2), (1, 1), "output_tensor.strides"),
])
def test_slice_rules(device, out, offsets, sizes, strides, field):
    with pytest.raises(ValidationError) as info:
        device.create_operator(dml.SliceOperatorDesc(S, out, offsets, sizes, strides))
    assert info.value.field == f"SliceOperatorDesc.{field}", str(info.value)


@pytest.mark.parametrize("out, offsets, sizes, strides, field", [
    (O, (0, 0), (2, 2), (1,), "input_window_strides"),
    (O, (0, 0), (2, 0), (1, 1), "input_window_sizes[1]"),
    (O, (0, 0), (2, 2), (0, 1), "input_window_strides[0]"),
    (O, (0, 0), (2, 2), (1, 2**31), "input_window_strides[1]"),
    (O, (3, 0), (2, 2), (1, 1), "input_window_offsets[0]"),
    (O, (0, 0), (2, 3), (1, -3), "output_tensor.sizes[1]"),
    (O, (0, 0), (2, 2, 1), (1, 1), "input_window_sizes"),
    (dml.TensorDesc("uint16", (2, 2)), (0, 0), (2, 2), (1, 1), "output_tensor.data_type"),
])
def test_slice1_rules(device, out, offsets, sizes, strides, field):
    with pytest.raises(ValidationError) as info:
        device.create_operator(dml.Slice1OperatorDesc(S, out, offsets, sizes, strides))
    assert info.value.field == f"Slice1OperatorDesc.{field}", str(info.value)
    assert same_bits(vkml.slice(np.arange(4, dtype=np.int8), (3,), (2,), (-2,), device=device),
                     np.array([3, 1], np.int8))


def test_functional_rules(device):
    with pytest.raises(ValidationError) as info:
        vkml.slice(np.ones(5), (1,), (3,), (-1,), device=device)
    assert info.value.field == "offsets[0]"
    with pytest.raises(ValidationError) as info:
        vkml.slice(np.ones(5), (1,), (3,), (2,), device=device)
    assert info.value.field == "SliceOperatorDesc.offsets[0]"
    with pytest.raises(ArgumentTypeError):
        vkml.slice(np.ones(5), (0,), (3,), (1.5,), device=device)
    with pytest.raises(ArgumentTypeError):
        device.create_operator(dml.SliceOperatorDesc(S, O, (0, 0), (2, 2), (1, "a")))


def test_feature_levels():
    t = dml.TensorDesc("float32", (1, 1, 2, 2))
    assert dml.SliceOperatorDesc(t, t, (0,) * 4, (1, 1, 2, 2), (1,) * 4).feature_level() \
        == dml.FeatureLevel.FL_1_0
    assert dml.Slice1OperatorDesc(t, t, (0,) * 4, (1, 1, 2, 2), (1,) * 4).feature_level() \
        == dml.FeatureLevel.FL_2_1
    t = dml.TensorDesc("float64", (2,))
    assert dml.Slice1OperatorDesc(t, t, (0,), (2,), (-1,)).feature_level() \
        == dml.FeatureLevel.FL_4_1

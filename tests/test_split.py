"""DML_SPLIT (vkml.split): the page's examples verbatim, random splits of every data type
bit for bit against numpy.split (permuted and padded input layouts, strided outputs with
canaries), both paths, windows and split grids at lowered limits, every rule of the page."""
from __future__ import annotations

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.errors import ValidationError

from helpers import ALL_DTYPES, random_bits, same_bits
from test_join import OPS, check_out, layout, out_layout, run_copies

X = np.arange(1, 13, dtype=np.float32).reshape(1, 1, 6, 2)


def test_page_example_1(device):
    got = vkml.split(X, 2, [2, 1, 3], device=device)
    want = [[[[[1, 2], [3, 4]]]], [[[[5, 6]]]], [[[[7, 8], [9, 10], [11, 12]]]]]
    assert len(got) == 3
    for g, w in zip(got, want):
        assert same_bits(g, np.array(w, np.float32))


def test_page_example_2(device):
    got = vkml.split(X, 3, 2, device=device)
    want = [[[[[1], [3], [5], [7], [9], [11]]]], [[[[2], [4], [6], [8], [10], [12]]]]]
    for g, w in zip(got, want):
        assert same_bits(g, np.array(w, np.float32))


@pytest.mark.parametrize("path", [None, "kernel", "copy"])
def test_random_splits(device, budget, path):
    rng = np.random.default_rng({None: 10, "kernel": 11, "copy": 12}[path])
    for i in range(budget):
        dtype = ALL_DTYPES[(i * 7 + len(path or "")) % 11]
        rank = int(rng.integers(1, 6))
        shape = [int(rng.integers(1, 5)) for _ in range(rank)]
        axis = int(rng.integers(0, rank))
        parts = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(1, 5)))]
        shape[axis] = sum(parts)
        flat, st, logical = layout(rng, shape, dtype)
        outs, idxs = [], []
        for p in parts:
            s = list(shape)
            s[axis] = p
            ost, _, idx = out_layout(rng, s)
            outs.append(dml.TensorDesc(dtype, s, ost))
            idxs.append(idx)
        desc = dml.SplitOperatorDesc(dml.TensorDesc(dtype, shape, st), outs, axis)
        got, _ = run_copies(device, desc, [flat], path)
        wants = np.split(logical, np.cumsum(parts)[:-1], axis)
        for g, idx, w in zip(got, idxs, wants):
            check_out(g, idx, w, None)


def test_functional_all_types(device):
    rng = np.random.default_rng(13)
    for dtype in ALL_DTYPES:
        x = random_bits(rng, (3, 4, 5), dtype)
        for g, w in zip(vkml.split(x, -1, [1, 4], device=device), np.split(x, [1], -1)):
            assert same_bits(g, w)
    t = vkml.tensor(x, device=device)
    ys = vkml.split(t, 0, 3)
    assert all(isinstance(y, vkml.Tensor) for y in ys)
    assert same_bits(ys[2].numpy(), x[2:])


@pytest.mark.parametrize("dtype", ["float64", "int16"])
def test_windows_and_split_grids(device, dtype):
    rng = np.random.default_rng(14)
    x = random_bits(rng, (40, 30), dtype)
    align = device._ctx.binding_alignment()
    limits = {"maxStorageBufferRange": x.nbytes // 4 + 4 * align,
              "maxComputeWorkGroupCount": (2, 2, 2)}
    outs = [dml.TensorDesc(dtype, (40, 11)), dml.TensorDesc(dtype, (40, 19))]
    desc = dml.SplitOperatorDesc(dml.TensorDesc(dtype, x.shape), outs, 1)
    with vkml.Device(device.index, limits=limits) as dev:
        op = OPS.CompiledSplit(dev, dev.create_operator(desc).desc, path="kernel")
        try:
            assert any(w is not None and len(w) > 1 for _, _, (_, w) in op.steps)
            ys = [dev.empty((40, 11), dtype), dev.empty((40, 19), dtype)]
            op.execute([dev.tensor(x)], ys)
            assert same_bits(ys[0].numpy(), x[:, :11]) and same_bits(ys[1].numpy(), x[:, 11:])
        finally:
            op.release()


T = dml.TensorDesc("int32", (2, 6))
H = dml.TensorDesc("int32", (2, 3))


@pytest.mark.parametrize("inp, outs, axis, field", [
    (T, [], 1, "output_tensors"),
    (T, [H, H], 2, "axis"),
    (T, [H, dml.TensorDesc("int32", (2, 2))], 1, "input_tensor.sizes[1]"),
    (T, [H, dml.TensorDesc("int32", (1, 3))], 1, "output_tensors[1].sizes[0]"),
    (T, [H, dml.TensorDesc("uint32", (2, 3))], 1, "output_tensors[1].data_type"),
    (T, [H, dml.TensorDesc("int32", (2, 3, 1))], 1, "output_tensors[1].sizes"),
    (T, [H, dml.TensorDesc("int32", (2, 3), (0, 1))], 1, "output_tensors[1].strides"),
    (None, [H, H], 1, "input_tensor"),
])
def test_rules(device, inp, outs, axis, field):
    with pytest.raises(ValidationError) as info:
        device.create_operator(dml.SplitOperatorDesc(inp, outs, axis))
    assert info.value.field == f"SplitOperatorDesc.{field}", str(info.value)
    assert same_bits(vkml.split(np.arange(4, dtype=np.int8), 0, 2, device=device)[1],
                     np.arange(2, 4, dtype=np.int8))


def test_functional_rules(device):
    with pytest.raises(ValidationError) as info:
        vkml.split(np.ones(5), 0, 2, device=device)
    assert info.value.field == "sizes"
    with pytest.raises(ValidationError) as info:
        vkml.split(np.ones(5), 0, [2, 2], device=device)
    assert info.value.field.endswith("input_tensor.sizes[0]")
    with pytest.raises(ValidationError):
        vkml.split(np.ones(5), 1, 1, device=device)

"""DML_SPLIT (vkml.split): the page's examples verbatim, random splits of every data type
bit for bit against numpy.split (permuted and padded input layouts, strided outputs with
canaries), both paths, windows and split grids at lowered limits, every rule of the page,
a fuzzer (tests/fuzzing.py), threads and leaks."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

import vkml
from vkml import dml
from vkml.errors import ValidationError

from fuzzing import (TENSOR_BROKEN, bind_with_canary, break_tensor_rule, canaries_intact,
                     compiled_or_refused, fuzzer, lay_out, padded_output)
from helpers import ALL_DTYPES, assert_no_leaks, random_bits, same_bits
from test_join import (FUZZ_SHARE, OPS, PARTS_BROKEN, break_shared_rule, check_out,
                       draw_parts_case, layout, on_path, out_layout, overlapping, run_copies)
from helpers import run_in_threads

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


# -- fuzzer (tests/fuzzing.py): valid and invalid descriptors, canaries ---------------------
#: split's broken rules -> the fields a ValidationError may name.
SPLIT_BROKEN = {**PARTS_BROKEN, "empty": ["output_tensors"], "sum": ["input_tensor.sizes["],
                "overlap": ["output_tensors["]}


@st.composite
def split_cases(draw):
    return draw_parts_case(draw, SPLIT_BROKEN, 1)


def _split_descriptor(case, xshape, in_st, shapes, out_sts):
    """The case's descriptor maker with its one broken rule, and the fields a refusal may
    name (empty: the case is valid)."""
    broken, dtype, i = case["broken"], case["dtype"], len(shapes) - 1  # (i: the output broken)
    shapes, out_sts, types, axis, xshape, in_st, want = break_shared_rule(
        case, SPLIT_BROKEN, shapes, out_sts, xshape, in_st)
    total = None
    if broken == "overlap":
        out_sts[i] = overlapping(out_sts[i], shapes[i])
        want = want if out_sts[i] is not None else []
    elif broken in TENSOR_BROKEN:
        xshape, in_st, total = break_tensor_rule(broken, xshape, in_st)

    def make():
        outs = [dml.TensorDesc(t, s, st) for t, s, st in zip(types, shapes, out_sts)]
        if broken == "missing":
            outs[i] = None
        return dml.SplitOperatorDesc(dml.TensorDesc(dtype, xshape, in_st, total),
                                     [] if broken == "empty" else outs, axis)
    return make, want


def _run_split_checked(device, compiled, desc, flat, reads):
    """fuzzing.run_checked for several outputs: the input and every output bound between
    canaries, none written outside a tensor or into an output's gaps, the input unchanged;
    returns the outputs as ``reads`` give them."""
    src = bind_with_canary(device, desc.input_tensor.total_tensor_size_in_bytes, flat)
    dsts = [bind_with_canary(device, t.total_tensor_size_in_bytes) for t in desc.outputs()]
    compiled.execute([src], dsts)
    compiled.release()
    got = [read(d) for read, d in zip(reads, dsts)]
    assert all(intact for _, intact in got), "wrote into the gaps of a non-packed output"
    assert all(canaries_intact(t) for t in [src] + dsts), "wrote outside a tensor"
    assert same_bits(src.read_bytes(flat.nbytes).view(flat.dtype), flat), "input changed"
    return [g for g, _ in got]


def test_fuzz_split(device, speed):
    """Random SPLIT descriptors (the contract of ``fuzzing.fuzzer``): ranks 1-8, all 11
    data types (random bits, compared bit for bit with numpy.split) from padded, permuted
    and broadcast layouts into 1-4 outputs with or without gaps, either path, one broken
    rule at a time."""
    @fuzzer(speed, split_cases(), share=FUZZ_SHARE, refused=0.1)
    def fuzz_case(case):
        rng = np.random.default_rng(case["seed"])
        dtype, axis, shape, parts = case["dtype"], case["axis"], list(case["shape"]), \
            case["parts"]
        xshape = shape[:axis] + [sum(parts)] + shape[axis + 1:]
        flat, in_st, x = lay_out(rng, random_bits(rng, xshape, dtype), case["layouts"][0])
        shapes = [shape[:axis] + [p] + shape[axis + 1:] for p in parts]
        outs = [padded_output(rng, s, dtype, pad) for s, pad in zip(shapes, case["padded"])]
        make, want = _split_descriptor(case, xshape, in_st, shapes, [o[0] for o in outs])
        desc, compiled = compiled_or_refused(device, make, want)
        if desc is None:
            return
        compiled = on_path(device, desc, compiled, case["path"])
        got = _run_split_checked(device, compiled, desc, flat, [o[1] for o in outs])
        for g, w in zip(got, np.split(x, np.cumsum(parts)[:-1], axis)):
            assert same_bits(g, w)

    fuzz_case()


# -- threads and leaks -----------------------------------------------------------------------
def test_eight_threads(device):
    """vkml.split from 8 threads (each its own data types) and one compiled split shared
    by all of them, each thread into its own outputs."""
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    outs = [dml.TensorDesc("float32", (4, 2)), dml.TensorDesc("float32", (4, 4))]
    shared = device.compile_operator(device.create_operator(
        dml.SplitOperatorDesc(dml.TensorDesc("float32", (4, 6)), outs, 1)))
    src = device.tensor(x)
    errors = []

    def work(k):
        rng = np.random.default_rng(300 + k)
        ys = [device.empty((4, 2)), device.empty((4, 4))]
        for i in range(3):
            dtype = ("float16", "int8", "uint64", "int32")[(k + i) % 4]
            y = random_bits(rng, (k + 2, 3), dtype)
            for g, w in zip(vkml.split(y, 0, [1, k + 1], device=device), np.split(y, [1])):
                assert same_bits(g, w)
            shared.execute([src], ys)
            assert same_bits(ys[0].numpy(), x[:, :2]) and same_bits(ys[1].numpy(), x[:, 2:])

    run_in_threads(work, errors)
    shared.release()
    assert not errors, errors


def test_does_not_leak(device):
    """create -> compile -> execute -> release on either path leaves the device's memory
    as it found it."""
    t = dml.TensorDesc("int16", (3, 8))
    desc = dml.SplitOperatorDesc(t, [dml.TensorDesc("int16", (3, 5)),
                                     dml.TensorDesc("int16", (3, 3), (6, 2))], 1)
    x = device.tensor(np.arange(24, dtype=np.int16))
    outs = [device.empty((16,), np.int16), device.empty((18,), np.int16)]
    for path in ("kernel", "copy"):
        def cycle():
            op = OPS.CompiledSplit(device, device.create_operator(desc).desc, path=path)
            op.execute([x], outs)
            op.release()
        assert_no_leaks(device, cycle, warm=5, rounds=30)

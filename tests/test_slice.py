"""DML_SLICE and DML_SLICE1 (vkml.slice): the pages' examples verbatim, random slices of
every data type bit for bit against NumPy indexing (positive and negative strides, permuted
and padded input layouts, strided outputs with canaries), both paths, windows and split
grids at lowered limits, every rule of both pages, a fuzzer (tests/fuzzing.py), threads
and leaks."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

import vkml
from vkml import dml
from vkml.errors import ArgumentTypeError, ValidationError

from fuzzing import (TENSOR_BROKEN, break_tensor_rule, compiled_or_refused, fuzzer, lay_out,
                     padded_output, placement, run_checked)
from helpers import (ALL_DTYPES, assert_no_leaks, random_bits, same_bits,
                     threads_share_one_operator)
from test_join import (FUZZ_SHARE, OPS, check_out, fuzz_shape, layout, on_path, out_layout,
                       overlapping, run_copies)

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


# -- fuzzer (tests/fuzzing.py): valid and invalid descriptors, canaries ---------------------
#: broken rules of both pages -> (the fields a ValidationError may name; {d}: the dimension
#: broken, SLICE's field first where the pages' names differ).
SLICE_BROKEN = {
    "count": ("strides", "input_window_strides"), "negative": ("offsets[{d}]",) * 2,
    "stride0": ("strides[{d}]", "input_window_strides[{d}]"),
    "bounds": ("offsets[{d}]", "input_window_offsets[{d}]"),
    "sizes": ("sizes[{d}]", "output_tensor.sizes[{d}]"),
    "window0": ("sizes[{d}]", "input_window_sizes[{d}]"),
    "stride_int": ("strides[{d}]", "input_window_strides[{d}]"),
    "data_type": ("output_tensor.data_type",) * 2, "rank": ("output_tensor.sizes",) * 2,
    "overlap": ("output_tensor.strides",) * 2, "rank9": ("TensorDesc.sizes",) * 2,
    "total_size": ("total_tensor_size_in_bytes",) * 2, "strides_count": ("TensorDesc.strides",) * 2}


@st.composite
def slice_cases(draw):
    rank = draw(st.integers(1, 8))
    return dict(shape=fuzz_shape(draw, rank), slice1=draw(st.booleans()), dtype=draw(st.sampled_from(ALL_DTYPES)),
                path=draw(st.sampled_from([None, "kernel", "copy"])),
                # two thirds unbroken: with the 64-bit types a device may refuse, about
                # half the cases stay valid, so the floor of valid cases (a quarter) holds
                # on a slow device's few draws
                broken=draw(st.sampled_from(["none"] * 26 + list(SLICE_BROKEN))),
                **placement(draw, 1))


def _slice_geometry(rng, shape, slice1: bool):
    """(offsets, window sizes, signed strides, output sizes, first coordinates copied):
    SLICE's strides are positive and its window is what the output covers."""
    offs, wins, steps, outs = _random_slice1(rng, shape)
    if not slice1:
        steps = [abs(s) for s in steps]
        wins = [s * (n - 1) + 1 for s, n in zip(steps, outs)]
    start = [o + (w - 1 if s < 0 else 0) for o, w, s in zip(offs, wins, steps)]
    return offs, wins, steps, outs, start


def _break_slice(case, geometry, out_st, shape, in_st):
    """The case's one broken rule applied: (offsets, sizes field, strides, output sizes,
    output strides, input shape, input strides, output type, input's total size, the
    fields a refusal may name: empty for a valid case)."""
    broken, slice1, rank = case["broken"], case["slice1"], len(shape)
    offs, wins, steps, outs, _ = (list(g) for g in geometry)
    d = case["seed"] % rank
    sizes = wins if slice1 else list(outs)
    want = [f.format(d=d) for f in SLICE_BROKEN[broken][int(slice1):][:1]] \
        if broken in SLICE_BROKEN else []
    out_type, total = case["dtype"], None
    if broken == "count":
        steps = steps + [1]
    elif broken == "negative":
        offs[d] = -1
    elif broken in ("stride0", "stride_int"):
        steps[d] = 0 if broken == "stride0" else 2**31 if slice1 else 2**32   # not an INT / UINT
    elif broken == "bounds":
        offs[d] = shape[d] - wins[d] + 1
    elif broken == "sizes":
        outs[d], out_st = (1 + (wins[d] - 1) // abs(steps[d]) + 1 if slice1 else outs[d] + 1), None
    elif broken == "window0":
        sizes[d] = 0
    elif broken == "data_type":
        out_type = "int32" if case["dtype"] == "float32" else "float32"
    elif broken == "rank":
        outs, out_st = (outs + [1] if rank < 8 else outs[1:]), None
    elif broken == "overlap":
        out_st = overlapping(out_st, outs)
        want = want if out_st is not None else []
    elif broken in TENSOR_BROKEN:
        shape, in_st, total = break_tensor_rule(broken, shape, in_st)
    return offs, sizes, steps, outs, out_st, shape, in_st, out_type, total, want


def test_fuzz_slice(device, speed):
    """Random SLICE and SLICE1 descriptors (the contract of ``fuzzing.fuzzer``): ranks
    1-8, all 11 data types (random bits, compared bit for bit with NumPy indexing), strides
    of either sign, padded, permuted and broadcast inputs, outputs with gaps, either path,
    one broken rule of either page at a time."""
    @fuzzer(speed, slice_cases(), share=FUZZ_SHARE, refused=0.1)
    def fuzz_case(case):
        rng = np.random.default_rng(case["seed"])
        dtype, shape = case["dtype"], list(case["shape"])
        flat, in_st, x = lay_out(rng, random_bits(rng, shape, dtype), case["layouts"][0])
        geometry = _slice_geometry(rng, shape, case["slice1"])
        out_st, read = padded_output(rng, geometry[3], dtype, case["out_padded"])
        offs, sizes, steps, outs, out_st, xshape, in_st, out_type, total, want = \
            _break_slice(case, geometry, out_st, shape, in_st)
        cls = dml.Slice1OperatorDesc if case["slice1"] else dml.SliceOperatorDesc

        def make():
            return cls(dml.TensorDesc(dtype, xshape, in_st, total),
                       dml.TensorDesc(out_type, outs, out_st), offs, sizes, steps)

        desc, compiled = compiled_or_refused(device, make, want)
        if desc is None:
            return
        compiled = on_path(device, desc, compiled, case["path"])
        got = run_checked(device, compiled, desc, [flat], read)
        start, outs = geometry[4], geometry[3]
        assert same_bits(got, x[np.ix_(*[a + s * np.arange(n)
                                         for a, s, n in zip(start, steps, outs)])])

    fuzz_case()


# -- threads and leaks -----------------------------------------------------------------------
def test_eight_threads(device):
    """vkml.slice from 8 threads (each its own data types) and one compiled reversing
    SLICE1 shared by all of them, each thread into its own output."""
    x = np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32)
    shared = device.compile_operator(device.create_operator(dml.Slice1OperatorDesc(
        dml.TensorDesc("float32", (5, 6)), dml.TensorDesc("float32", (3, 3)), (0, 1), (5, 5),
        (-2, 2))))
    rngs = [np.random.default_rng(400 + k) for k in range(8)]

    def functional(k, i):
        y = random_bits(rngs[k], (k + 3, 4), ("float16", "int8", "uint64")[(k + i) % 3])
        return same_bits(vkml.slice(y, (k + 2, 1), (2, 3), (-1, 1), device=device),
                         y[k + 2:k:-1, 1:4])

    threads_share_one_operator(device, shared, [device.tensor(x)], x[4::-2, 1:6:2], (3, 3),
                               functional, rtol=0, atol=0)


def test_does_not_leak(device):
    """create -> compile -> execute -> release of SLICE and SLICE1 on either path leaves
    the device's memory as it found it."""
    t = dml.TensorDesc("uint8", (6, 8))
    y = dml.TensorDesc("uint8", (2, 3))
    x, out = device.tensor(np.arange(48, dtype=np.uint8)), device.empty((8,), np.uint8)
    for desc in (dml.SliceOperatorDesc(t, y, (1, 2), (2, 3), (3, 1)),
                 dml.Slice1OperatorDesc(t, y, (0, 2), (6, 3), (-3, 1))):
        for path in ("kernel", "copy"):
            def cycle():
                op = OPS.CompiledSlice(device, device.create_operator(desc).desc, path=path)
                op.execute([x], [out])
                op.release()
            assert_no_leaks(device, cycle, warm=3, rounds=20)

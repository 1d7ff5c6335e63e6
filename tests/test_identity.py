"""DML_ELEMENT_WISE_IDENTITY (vkml.identity): strided copies of all 11 data types, bit for
bit (NaN payloads, -0, subnormals: raw bits from helpers.random_bits), transposes and
layout changes through strides with canaries in the output's gaps, windows at lowered
limits, ScaleBias on float types, every rule of the page, a fuzzer (tests/fuzzing.py),
threads and leaks."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import strategies as st

import vkml
from vkml import dml
from vkml.errors import ArgumentTypeError, UnsupportedError, ValidationError

from fuzzing import (TENSOR_BROKEN, break_tensor_rule, compiled_or_refused, count, fuzzer, lay_out,
                     padded_output, placement, run_checked)
from helpers import (ALL_DTYPES, assert_no_leaks, operator_cycle, random_bits, same_bits,
                     strided_view, threads_share_one_operator)

CANARY = 0xA5


def _copy(device, desc, flat, out_elems):
    op = device.compile_operator(device.create_operator(desc))
    try:
        dt = desc.output_tensor.dtype
        out = device.empty(out_elems, dt)
        out.write(np.full(out_elems * np.dtype(dt).itemsize, CANARY, np.uint8).view(dt))
        src = device.tensor(flat)
        op.execute([src], [out])
        assert same_bits(src.numpy(), flat), "the input changed"
        return out.numpy()
    finally:
        op.release()


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_functional_copies_bits(device, dtype):
    rng = np.random.default_rng(ALL_DTYPES.index(dtype))
    for shape in [(7,), (3, 5, 9)]:
        x = random_bits(rng, shape, dtype)
        got = vkml.identity(x, device=device)
        assert same_bits(got, x)
    t = vkml.tensor(x, device=device)
    y = vkml.identity(t)
    assert isinstance(y, vkml.Tensor) and same_bits(y.numpy(), x)


@pytest.mark.parametrize("dtype", ["float64", "float16", "int8", "uint32"])
@pytest.mark.parametrize("kind", ["padded", "broadcast", "permuted"])
def test_strided_copy(device, dtype, kind):
    """Input layouts (padded rows, a broadcast dimension, a permutation: a transpose)
    into an output whose every other element is a gap that must keep its canary."""
    rng = np.random.default_rng(len(kind) * 7 + np.dtype(dtype).itemsize)
    shape = (2, 3, 4, 5)
    flat, strides, logical = strided_view(rng, shape, dtype, kind)
    out_st = (3 * 4 * 10, 4 * 10, 10, 2)
    out_elems = shape[0] * out_st[0]
    desc = dml.ElementWiseIdentityOperatorDesc(dml.TensorDesc(dtype, shape, strides),
                                               dml.TensorDesc(dtype, shape, out_st))
    got = _copy(device, desc, flat, out_elems)
    idx = sum(np.arange(s).reshape([-1 if i == d else 1 for i in range(4)]) * st
              for d, (s, st) in enumerate(zip(shape, out_st)))
    assert same_bits(got[idx], logical)
    gaps = np.ones(out_elems, bool)
    gaps[idx.reshape(-1)] = False
    assert (got[gaps].view(np.uint8) == CANARY).all()


@pytest.mark.parametrize("read", ["texel4", "ssbo4"])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_copy_variants(device, read, dtype):
    """A plain IDENTITY runs the copy variants, bits unchanged: packed (flat) and broadcast
    along rows into a packed output (the row path: uvec4 rows and word rows), each read
    path forced; with a ScaleBias it runs the arithmetic variants."""
    from vkml.ops.element_wise import CompiledElementWise
    rng = np.random.default_rng(ALL_DTYPES.index(dtype) + 40)
    es = np.dtype(dtype).itemsize
    row = 16 // es if es < 8 else 4                     # a whole uvec4, then not
    cases = [((3, 5, 2 * row), None), ((2, 3, 4 * row), (0, 1, 0)), ((2, 3, 4 * row), (1, 0, 0)),
             ((3, 2, 4 // min(es, 4) * 3), (0, 0, 1))]
    for shape, bcast in cases:
        small = shape if bcast is None else tuple(n if b else 1 for n, b in zip(shape, bcast))
        x = random_bits(rng, small, dtype)
        strides = None if bcast is None else tuple(
            int(np.prod(small[d + 1:])) if b else 0 for d, b in enumerate(bcast))
        desc = dml.ElementWiseIdentityOperatorDesc(dml.TensorDesc(dtype, shape, strides),
                                                   dml.TensorDesc(dtype, shape))
        op = CompiledElementWise(device, desc, read=read)
        try:
            assert op.kernel.startswith("element_wise_copy_"), op.kernel
            assert (op.row is not None) == (bcast is not None) and op.read == read
            out = device.empty(shape, dtype)
            op.execute([device.tensor(x.reshape(-1))], [out])
            assert same_bits(out.numpy(), np.broadcast_to(x, shape))
        finally:
            op.release()
    if dtype in ("float32", "float16"):
        t = dml.TensorDesc(dtype, (4, 8))
        op = CompiledElementWise(device, dml.ElementWiseIdentityOperatorDesc(
            t, t, dml.ScaleBias(2.0, 1.0)))
        try:
            assert not op.kernel.startswith("element_wise_copy_")
        finally:
            op.release()


@pytest.mark.parametrize("copy_path", ["engine", "kernel"])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_packed_copy_paths(device, copy_path, dtype):
    """A plain packed IDENTITY on the copy engine and on the flat kernel, forced: bits
    unchanged at random sizes (sub-word tails, odd word counts), nothing written past the
    output's TotalTensorSizeInBytes, and on the engine not the bytes after the last
    element either; in place it leaves the tensor as it was."""
    from fuzzing import bind_with_canary, canaries_intact
    from vkml.ops.element_wise import CompiledElementWise
    rng = np.random.default_rng(ALL_DTYPES.index(dtype) + 70)
    shapes = [(1,), (int(rng.integers(2, 40)),), (3, int(rng.integers(1, 9)), 5),
              (2, int(rng.integers(500, 1500)))]
    for shape in shapes:
        x = random_bits(rng, shape, dtype)
        t = dml.TensorDesc(dtype, shape)
        op = CompiledElementWise(device, dml.ElementWiseIdentityOperatorDesc(t, t),
                                 copy_path=copy_path)
        try:
            assert op.flat and op.copy_path == copy_path
            out = bind_with_canary(device, t.total_tensor_size_in_bytes)
            op.execute([device.tensor(x)], [out])
            raw = out.read_bytes(out.nbytes + 64)
            assert same_bits(raw[:x.nbytes].view(dtype).reshape(shape), x), shape
            assert canaries_intact(out), "wrote past the output"
            if copy_path == "engine":
                assert (raw[x.nbytes:] == CANARY).all(), "wrote past the last element"
            y = device.tensor(x)
            op.execute([y], [y])                                # in place
            assert same_bits(y.numpy(), x)
        finally:
            op.release()


def test_packed_copy_default_and_overlap(device):
    """``VKML_TUNE=off`` (the tests' mode) takes the copy engine for a plain packed
    IDENTITY, a forced read path the kernel, a ScaleBias never the engine; an output
    partly overlapping the input is left to the kernel (vkCmdCopyBuffer takes no
    overlapping regions)."""
    from vkml.ops.element_wise import CompiledElementWise
    t = dml.TensorDesc("float32", (64, 33))
    plain = dml.ElementWiseIdentityOperatorDesc(t, t)
    ops = [CompiledElementWise(device, plain), CompiledElementWise(device, plain, read="ssbo4"),
           CompiledElementWise(device, dml.ElementWiseIdentityOperatorDesc(
               t, t, dml.ScaleBias(2.0, 0.0)))]
    try:
        assert [op.copy_path for op in ops] == ["engine", "kernel", None]
        with pytest.raises(ValidationError, match="copy_path"):
            CompiledElementWise(device, plain, copy_path="dma")
        whole = device.empty((2 * 64 * 33,), "float32")
        a = whole.allocation.sub_allocation(0, t.total_tensor_size_in_bytes)
        y = whole.allocation.sub_allocation(256, t.total_tensor_size_in_bytes)
        with device.sequence() as seq:
            assert not ops[0]._encode_engine(seq, a, y)     # partly overlapping: the kernel
            assert ops[0]._encode_engine(seq, a, a)         # in place: nothing to move
        # apart in one buffer: the engine's region
        b = whole.allocation.sub_allocation(t.total_tensor_size_in_bytes,
                                            t.total_tensor_size_in_bytes)
        x = np.random.default_rng(5).standard_normal((64, 33)).astype(np.float32)
        got = np.zeros_like(x)
        device.context.write(a, x)
        with device.sequence() as seq:
            ops[0].encode(seq, [SimpleNamespace(allocation=a)], [SimpleNamespace(allocation=b)])
            seq.run()
        device.context.read(b, got)
        assert same_bits(got, x)
        for m in (a, y, b):
            m.free()
        whole.free()
    finally:
        for op in ops:
            op.release()


def test_engine_copy_between_kernels(device):
    """A copy on the copy engine between two kernels in one recorded sequence (the
    sequence's barriers order transfers and dispatches both ways), replayed with new
    input values."""
    from vkml.ops.element_wise import CompiledElementWise
    rng = np.random.default_rng(12)
    t = dml.TensorDesc("float32", (3, 129))
    add = CompiledElementWise(device, dml.ElementWiseAddOperatorDesc(t, t, t))
    copy = CompiledElementWise(device, dml.ElementWiseIdentityOperatorDesc(t, t),
                               copy_path="engine")
    x, y, z, w = (device.empty((3, 129), "float32") for _ in range(4))
    try:
        with device.sequence() as seq:
            add.record(seq, [x, x], [y])
            copy.record(seq, [y], [z])
            add.record(seq, [z, y], [w])
            for _ in range(2):
                a = rng.standard_normal((3, 129)).astype(np.float32)
                x.write(a)
                seq.run()
                np.testing.assert_array_equal(z.numpy(), a + a)
                np.testing.assert_array_equal(w.numpy(), (a + a) + (a + a))
    finally:
        add.release()
        copy.release()


@pytest.mark.parametrize("dtype", ["int64", "uint16"])
def test_transpose_in_windows(device, dtype):
    """A transpose (output packed, input read across) bound in windows with split grids."""
    rng = np.random.default_rng(9)
    x = random_bits(rng, (40, 60), dtype)
    shape = (60, 40)
    desc = dml.ElementWiseIdentityOperatorDesc(dml.TensorDesc(dtype, shape, (1, 60)),
                                               dml.TensorDesc(dtype, shape))
    align = device._ctx.binding_alignment()
    limits = {"maxStorageBufferRange": x.nbytes // 3 + 4 * align,
              "maxComputeWorkGroupCount": (2, 2, 2)}
    with vkml.Device(device.index, limits=limits) as dev:
        import importlib
        cls = importlib.import_module("vkml.ops.element_wise").CompiledElementWise
        op = cls(dev, dev.create_operator(desc).desc)
        try:
            assert op.windows is not None and len(op.windows) > 1
            out = dev.empty(shape, dtype)
            op.execute([dev.tensor(x.reshape(-1))], [out])
            assert same_bits(out.numpy(), x.T)
        finally:
            op.release()
        assert same_bits(vkml.identity(x, device=dev), x)        # flat: the copy engine
        t = dml.TensorDesc(dtype, x.shape)
        op = cls(dev, dml.ElementWiseIdentityOperatorDesc(t, t), copy_path="kernel")
        try:                                                     # flat, in windows
            assert op.windows is not None and len(op.windows) > 1
            out = dev.empty(x.shape, dtype)
            op.execute([dev.tensor(x)], [out])
            assert same_bits(out.numpy(), x)
        finally:
            op.release()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_scale_bias(device, dtype):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, 33)) * 3).astype(dtype)
    for sb in [dml.ScaleBias(2.5, -1.0), (0.5, 3.0)]:
        got = vkml.identity(x, sb, device=device)
        s, b = (sb.scale, sb.bias) if isinstance(sb, dml.ScaleBias) else sb
        want = (x.astype(np.float32) * np.float32(s) + np.float32(b)).astype(dtype)
        tol = 1e-6 if dtype == "float32" else 1e-3
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                                   atol=tol)


# -- validation ------------------------------------------------------------------------------
T = dml.TensorDesc("float32", (2, 3, 4))


@pytest.mark.parametrize("case", ["sizes", "rank", "data_type", "no_input", "no_output",
                                  "overlap"])
def test_tensor_rules(device, case):
    inp, out, field = {
        "sizes": (T, dml.TensorDesc("float32", (2, 3, 5)), "output_tensor.sizes"),
        "rank": (T, dml.TensorDesc("float32", (2, 3, 4, 1)), "output_tensor.sizes"),
        "data_type": (T, dml.TensorDesc("int32", (2, 3, 4)), "output_tensor.data_type"),
        "no_input": (None, T, "input_tensor"),
        "no_output": (T, None, "output_tensor"),
        "overlap": (T, dml.TensorDesc("float32", (2, 3, 4), (1, 1, 1)), "output_tensor.strides"),
    }[case]
    with pytest.raises(ValidationError) as info:
        device.create_operator(dml.ElementWiseIdentityOperatorDesc(inp, out))
    assert info.value.field == f"ElementWiseIdentityOperatorDesc.{field}", str(info.value)
    assert same_bits(vkml.identity(np.arange(3, dtype=np.int8), device=device),
                     np.arange(3, dtype=np.int8))


@pytest.mark.parametrize("sb, t, field, error", [
    (dml.ScaleBias(float("nan"), 0.0), T, "scale_bias.scale", ValidationError),
    (dml.ScaleBias(1.0, float("inf")), T, "scale_bias.bias", ValidationError),
    (dml.ScaleBias("2", 0.0), T, "scale_bias.scale", ArgumentTypeError),
    ((2.0, 1.0), T, "scale_bias", ArgumentTypeError),
    (dml.ScaleBias(2.0, 1.0), dml.TensorDesc("int32", (2, 3, 4)), "scale_bias", ValidationError),
])
def test_scale_bias_rules(device, sb, t, field, error):
    with pytest.raises(error) as info:
        device.create_operator(dml.ElementWiseIdentityOperatorDesc(t, t, sb))
    assert info.value.field == f"ElementWiseIdentityOperatorDesc.{field}", str(info.value)


def test_scale_bias_float64_unsupported(device):
    t = dml.TensorDesc("float64", (4,))
    with pytest.raises(UnsupportedError):
        vkml.identity(np.ones(4), (2.0, 0.0), device=device)
    assert dml.ElementWiseIdentityOperatorDesc(t, t).feature_level() == dml.FeatureLevel.FL_4_1
    with pytest.raises(ArgumentTypeError):
        vkml.identity(np.ones(4, np.float32), (1.0,), device=device)


# -- fuzzer (tests/fuzzing.py): valid and invalid descriptors, canaries ---------------------
FUZZ_SHARE = 2              # a share of fuzz_examples (fuzzing.fuzzer): one pipeline a case
#: broken rule -> the fields a ValidationError may name.
FUZZ_BROKEN = {"sizes": ["output_tensor.sizes"], "rank": ["output_tensor.sizes"],
               "data_type": ["output_tensor.data_type"], "overlap": ["output_tensor.strides"],
               "missing": ["input_tensor: is required"], "scale": ["scale_bias.scale"],
               "bias": ["scale_bias.bias"], "int_scale_bias": ["scale_bias"], **TENSOR_BROKEN}


@st.composite
def identity_cases(draw):
    rank = draw(st.integers(1, 8))
    hi = 5 if rank <= 3 else 3 if rank <= 5 else 2
    shape = draw(st.lists(st.integers(1, hi), min_size=rank, max_size=rank))
    if rank <= 2 and draw(st.booleans()):      # rows past the vector widths, sub-word tails
        shape[-1] = draw(st.integers(6, 300))
    return dict(shape=shape, dtype=draw(st.sampled_from(ALL_DTYPES)),
                scale_bias=draw(st.sampled_from([None, None, (2.5, -1.0), (-0.5, 0.25)])),
                broken=draw(st.sampled_from(["none"] * 10 + list(FUZZ_BROKEN))),
                **placement(draw, 1))


def _identity_descriptor(case, shape, dtype, in_st, out_st, sb):
    """The case's descriptor maker with its one broken rule, and the fields a refusal may
    name (empty: the case is valid)."""
    broken, rank = case["broken"], len(shape)
    want = FUZZ_BROKEN.get(broken, [])
    si, so, to, total = list(shape), list(shape), dtype, None
    if broken == "sizes":
        so[-1] += 1
    elif broken == "rank":          # (the output's strides follow, so only the rank breaks)
        so, out_st = (so + [1], out_st and out_st + (1,)) if rank < 8 else \
            (so[:-1], out_st and out_st[:-1])
    elif broken == "data_type":
        to = "int32" if dtype == "float32" else "float32"
    elif broken == "overlap":
        big = [d for d, n in enumerate(shape) if n > 1]
        if big:
            out_st = list(out_st or [int(np.prod(shape[i + 1:])) for i in range(rank)])
            out_st[big[-1]] = 0
        else:
            want = []
    elif broken in ("scale", "bias"):
        sb = dml.ScaleBias(float("nan"), 1.0) if broken == "scale" else \
            dml.ScaleBias(1.0, float("-inf"))
    elif broken == "int_scale_bias":
        if np.dtype(dtype).kind == "f":
            want = []               # (a float tensor takes a ScaleBias)
        sb = dml.ScaleBias(2.0, 1.0)
    elif broken in TENSOR_BROKEN:
        si, in_st, total = break_tensor_rule(broken, si, in_st)

    def make():
        x = None if broken == "missing" else dml.TensorDesc(dtype, si, in_st, total)
        return dml.ElementWiseIdentityOperatorDesc(x, dml.TensorDesc(to, so, out_st), sb)
    return make, want, sb


def test_fuzz_identity(device, speed):
    """Random ELEMENT_WISE_IDENTITY descriptors (the contract of ``fuzzing.fuzzer``):
    ranks 1-8, all 11 data types copied bit for bit from padded, permuted and broadcast
    layouts, ScaleBias on float tensors, one broken rule at a time."""
    @fuzzer(speed, identity_cases(), share=FUZZ_SHARE, refused=0.1)
    def fuzz_case(case):
        rng = np.random.default_rng(case["seed"])
        dtype, shape = case["dtype"], list(case["shape"])
        sb = None if case["scale_bias"] is None else dml.ScaleBias(*case["scale_bias"])
        if sb is not None and dtype not in ("float32", "float16"):
            sb = None               # (a ScaleBias on other types is a broken rule below)
        x = random_bits(rng, shape, dtype)
        if sb is not None or case["broken"] == "int_scale_bias":   # finite values to scale
            x = (rng.standard_normal(shape) * 3).astype(dtype)
        flat, in_st, x = lay_out(rng, x, case["layouts"][0])
        out_st, read = padded_output(rng, shape, dtype, case["out_padded"])
        make, want, sb = _identity_descriptor(case, shape, dtype, in_st, out_st, sb)
        if not want and sb is not None and dtype == "float64":
            with pytest.raises(UnsupportedError):    # (vkml.dml.element_wise's docstring)
                device.compile_operator(device.create_operator(make()))
            return count("unsupported")
        desc, compiled = compiled_or_refused(device, make, want, may_be_unsupported=True)
        if desc is None:
            return
        got = run_checked(device, compiled, desc, [flat], read)
        if sb is None:
            assert same_bits(got, x)
        else:
            expect = (x.astype(np.float32) * np.float32(sb.scale) + np.float32(sb.bias))
            tol = 1e-6 if dtype == "float32" else 1e-3
            np.testing.assert_allclose(got.astype(np.float64), expect.astype(dtype)
                                       .astype(np.float64), rtol=tol, atol=tol)

    fuzz_case()


# -- threads and leaks -----------------------------------------------------------------------
def test_eight_threads(device):
    """vkml.identity from 8 threads (each its own data types) and one compiled transpose
    with a ScaleBias shared by all of them."""
    shape = (6, 5)
    shared = device.compile_operator(device.create_operator(dml.ElementWiseIdentityOperatorDesc(
        dml.TensorDesc("float32", shape, (1, 6)), dml.TensorDesc("float32", shape),
        dml.ScaleBias(2.0, -1.0))))
    x = np.random.default_rng(1).standard_normal((5, 6)).astype(np.float32)
    rngs = [np.random.default_rng(200 + k) for k in range(8)]

    def functional(k, i):
        y = random_bits(rngs[k], (k + 1, 7), ("float16", "int8", "uint64")[(k + i) % 3])
        return same_bits(vkml.identity(y, device=device), y)

    threads_share_one_operator(device, shared, [device.tensor(x.reshape(-1))], x.T * 2 - 1,
                               shape, functional, rtol=1e-6, atol=1e-6)


def test_does_not_leak(device):
    """create -> compile -> execute -> release of a strided copy, and the functional call,
    leave the device's memory as they found it."""
    t = dml.TensorDesc("float16", (4, 6), (1, 4))
    x, out = device.tensor(np.ones(24, np.float16)), device.empty((4, 6), np.float16)
    cycle = operator_cycle(device, dml.ElementWiseIdentityOperatorDesc(
        t, dml.TensorDesc("float16", (4, 6)), dml.ScaleBias(0.5, 0.0)), [x], [out])
    assert_no_leaks(device, cycle, warm=5, rounds=50)
    a = np.arange(12, dtype=np.int64).reshape(3, 4)

    def calls():
        for _ in range(100):
            vkml.identity(a, device=device)
    assert_no_leaks(device, calls, warm=1, rounds=1, key="used")

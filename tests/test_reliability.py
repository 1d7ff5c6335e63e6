"""Reliability: fuzzed descriptors, no leaks, large tensors, threads, device faults.

Fuzzing: hypothesis draws descriptors, valid and invalid (shapes, paddings, modes, data
types, tensor strides).  An independent checker in this file decides whether the case
is valid; valid ones must equal the NumPy reference, invalid ones must raise
ValidationError, and nothing may touch memory outside the output (canary bytes after
every bound buffer) or change the input.  ``VKML_FUZZ_EXAMPLES`` sets the number of
examples per operator and device (default 200 on a fast device, 50 on a slow one).
"""
from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vkml
from vkml import dml
from vkml.errors import DeviceError, UnsupportedError, ValidationError

from helpers import ALL_DTYPES, random_bits, same_bits

CANARY = 0xA5
MODES = ["constant", "edge", "reflection", "symmetric", "wrap"]
NUMPY_MODE = {"constant": "constant", "edge": "edge", "reflection": "reflect",
              "symmetric": "symmetric", "wrap": "wrap"}


def fuzz_examples(speed: float) -> int:
    default = 50 if speed > 0.2 else 200
    return int(os.environ.get("VKML_FUZZ_EXAMPLES", default))


def bind_with_canary(device, nbytes: int, data: np.ndarray | None = None):
    """A tensor of ``nbytes`` (or the data's size, rounded to 4) followed by 64 canary bytes."""
    size = (max(nbytes, data.nbytes if data is not None else 0) + 3) & ~3
    raw = np.full(size + 64, CANARY, dtype=np.uint8)
    if data is not None:
        raw[:data.nbytes] = data.reshape(-1).view(np.uint8)
    t = device.tensor(raw)
    t.nbytes = size            # bind only the tensor's bytes; the canaries sit after them
    return t


def canaries_intact(t) -> bool:
    raw = t.read_bytes(t.nbytes + 64)
    return bool(np.all(raw[t.nbytes:] == CANARY))


def compiled_or_refused(device, make_desc, want: list, may_be_unsupported=False):
    """(desc, compiled operator) for a case the independent checker calls valid (``want``
    empty), or (None, None) after checking that an invalid case was refused with a
    ValidationError naming one of the ``want`` fields (or, where ``may_be_unsupported``,
    refused with UnsupportedError)."""
    try:
        desc = make_desc()
        compiled = device.compile_operator(device.create_operator(desc))
    except ValidationError as err:
        assert want, f"valid case refused: {err}"
        assert any(f in str(err) for f in want), f"expected one of {want}, got {err}"
        return None, None
    except UnsupportedError as err:
        assert not want and may_be_unsupported, str(err)
        return None, None
    assert not want, f"invalid case accepted ({want})"
    return desc, compiled


LAYOUTS = ["packed"] * 3 + ["padded", "permuted", "broadcast"]


def lay_out(rng, logical: np.ndarray, kind: str):
    """``logical`` stored in a non-packed layout: (flat buffer, DML element strides or
    None, the logical array those describe).  "padded" fills the gaps with NaN (floats)
    or random bits, so a kernel that reads them gives a wrong answer; "broadcast" makes
    one dimension a stride-0 repeat (the logical array changes accordingly)."""
    dt, shape, rank = logical.dtype, logical.shape, logical.ndim
    if kind == "packed" or rank == 0:
        return logical.reshape(-1), None, logical
    if kind == "padded":
        phys = [n + int(rng.integers(0, 3)) for n in shape]
        buf = np.full(phys, np.nan, dt) if dt.kind == "f" else random_bits(rng, phys, dt)
        buf[tuple(slice(0, n) for n in shape)] = logical
        return buf.reshape(-1), tuple(st // dt.itemsize for st in buf.strides), logical
    if kind == "permuted":
        perm = rng.permutation(rank)
        buf = np.ascontiguousarray(logical.transpose(perm))
        view = buf.transpose(np.argsort(perm))
        return buf.reshape(-1), tuple(st // dt.itemsize for st in view.strides), logical
    d = int(rng.integers(0, rank))
    small = np.ascontiguousarray(logical[(slice(None),) * d + (slice(0, 1),)])
    strides = [st // dt.itemsize for st in small.strides]
    strides[d] = 0
    return small.reshape(-1), tuple(strides), np.broadcast_to(small, shape).copy()


def padded_output(rng, shape, dtype, padded: bool):
    """Element strides of an output stored with gaps (or None), and a reader returning
    (logical result, whether every byte outside it is still the canary)."""
    dt = np.dtype(dtype)
    if not padded:
        return None, lambda t: (t.read_bytes(int(np.prod(shape)) * dt.itemsize).view(dt)
                                .reshape(shape), True)
    phys = [n + int(rng.integers(0, 3)) for n in shape]
    strides = tuple(int(np.prod(phys[i + 1:])) for i in range(len(phys)))

    def read(t):
        count = sum((n - 1) * st for n, st in zip(shape, strides)) + 1
        raw = t.read_bytes(count * dt.itemsize)
        got = np.lib.stride_tricks.as_strided(raw.view(dt), shape,
                                              [st * dt.itemsize for st in strides]).copy()
        mask = np.ones(count, bool)
        mask[np.ravel_multi_index(np.indices(shape).reshape(len(shape), -1), phys)] = False
        gaps = raw.reshape(count, dt.itemsize)[mask]
        return got, bool(np.all(gaps == CANARY))
    return strides, read


# -- padding ------------------------------------------------------------------------------
@st.composite
def padding_cases(draw):
    rank = draw(st.integers(1, 8))
    shape = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    dtype = draw(st.sampled_from(ALL_DTYPES))
    mode = draw(st.sampled_from(MODES + ["bogus"] * 1))
    start = draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank))
    end = draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank))
    while np.prod([s + a + b for s, a, b in zip(shape, start, end)]) > 30000:
        d = int(np.argmax([a + b for a, b in zip(start, end)]))   # keep the work bounded
        start[d], end[d] = start[d] // 2, end[d] // 2
    out = [s + a + b for s, a, b in zip(shape, start, end)]
    mutation = draw(st.sampled_from(["none"] * 6 + ["out_size", "count", "negative", "dtype",
                                                    "rank", "in_strides", "out_overlap"]))
    in_strides = None
    if draw(st.booleans()):   # a non-packed input layout: padded, broadcast or permuted
        kind = draw(st.sampled_from(["padded", "broadcast", "permuted"]))
        in_strides = kind
    return dict(shape=shape, dtype=dtype, mode=mode, start=start, end=end, out=out,
                mutation=mutation, in_strides=in_strides, seed=draw(st.integers(0, 2**31)))


def _expected_errors(case) -> list[str]:
    """The independent checker: the fields an error may name (any broken rule), or []."""
    fields = ["padding_mode"] if case["mode"] == "bogus" else []
    m = case["mutation"]
    field = {"out_size": "output_tensor.sizes", "count": "start_padding",
             "negative": "end_padding", "dtype": "output_tensor.data_type",
             "rank": "output_tensor.sizes", "out_overlap": "output_tensor.strides"}.get(m)
    return fields + ([field] if field else [])


def _build(case, rng):
    from helpers import strided_view

    shape, dtype, start, end, out = (case["shape"], case["dtype"], list(case["start"]),
                                     list(case["end"]), list(case["out"]))
    out_dtype, out_strides = dtype, None
    m = case["mutation"]
    if m == "out_size":
        out[-1] += 1
    elif m == "count":
        start = start + [0]
    elif m == "negative":
        end[-1] = -1
    elif m == "dtype":
        out_dtype = "int8" if dtype != "int8" else "uint8"
    elif m == "rank":
        out = out + [1] if len(out) < 8 else out[:-1]
    elif m == "out_overlap":
        out_strides = [0] * len(out)
        if max(out) == 1:
            out[-1] += 1
            end[-1] += 1
    if case["in_strides"]:
        flat, strides, logical = strided_view(rng, shape, dtype, case["in_strides"])
    else:
        logical = random_bits(rng, shape, dtype)
        flat, strides = logical.reshape(-1), None
    desc = dml.PaddingOperatorDesc(dml.TensorDesc(dtype, shape, strides),
                                   dml.TensorDesc(out_dtype, out, out_strides),
                                   case["mode"], 5.0, start, end)
    return desc, flat, logical


def test_fuzz_padding(device, speed):
    @settings(max_examples=fuzz_examples(speed), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(padding_cases())
    def check(case):
        rng = np.random.default_rng(case["seed"])
        want = _expected_errors(case)
        try:
            desc, flat, logical = _build(case, rng)
            op = device.create_operator(desc)
        except ValidationError as err:
            assert want, f"valid case refused: {err}"
            assert any(f in str(err) for f in want), f"expected one of {want}, got {err}"
            return
        assert not want, f"invalid case accepted ({want})"
        compiled = device.compile_operator(op)
        src = bind_with_canary(device, desc.input_tensor.total_tensor_size_in_bytes, flat)
        dst = bind_with_canary(device, desc.output_tensor.total_tensor_size_in_bytes)
        compiled.execute([src], [dst])
        compiled.release()
        out = desc.output_tensor
        got = dst.read_bytes(out.element_count * out.data_type.size).view(out.dtype)
        kw = ({"constant_values": np.array(5, case["dtype"])}
              if case["mode"] == "constant" else {})
        expect = np.pad(logical, list(zip(case["start"], case["end"])),
                        NUMPY_MODE[case["mode"]], **kw)
        assert same_bits(got.reshape(expect.shape), expect)
        assert canaries_intact(src) and canaries_intact(dst), "wrote outside the tensor"
        assert same_bits(src.read_bytes(flat.nbytes).view(flat.dtype), flat), "input changed"

    check()


# -- leaks ----------------------------------------------------------------------------------
_LEAK_CHILD = r"""
import gc, json, sys
import numpy as np, psutil, torch, vkml
import torch.nn.functional as F
from vkml import dml
dev = vkml.Device(int(sys.argv[1]))
op_name, cycles = sys.argv[2], int(sys.argv[3])
T = dml.TensorDesc
rng = np.random.default_rng(0)
if op_name == "padding":
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    desc = dml.PaddingOperatorDesc(T("float32", (3, 4)), T("float32", (5, 8)), "reflection",
                                   0.0, (1, 2), (1, 2))
    arrays, expect = [a], np.pad(a, [(1, 1), (2, 2)], "reflect")
elif op_name == "fold":
    a = rng.standard_normal((1, 8, 9)).astype(np.float32)
    desc = dml.FoldOperatorDesc(T("float32", (1, 8, 9)), T("float32", (1, 2, 4, 4)), (2, 2),
                                (1, 1), (1, 1), (0, 0), (0, 0))
    arrays = [a]
    expect = F.fold(torch.from_numpy(a), (4, 4), (2, 2)).numpy()
elif op_name == "unfold":
    a = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    desc = dml.UnfoldOperatorDesc(T("float32", (1, 2, 4, 4)), T("float32", (1, 8, 9)), (2, 2),
                                  (1, 1), (1, 1), (0, 0), (0, 0))
    arrays, expect = [a], F.unfold(torch.from_numpy(a), (2, 2)).numpy()
elif op_name == "lp_pooling":
    a = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    desc = dml.LpPooling1OperatorDesc(T("float32", (1, 2, 5, 5)), T("float32", (1, 2, 2, 2)),
                                      (2, 2), (3, 3), (0, 0), (0, 0), (1, 1), 2)
    arrays = [a]
    expect = F.lp_pool2d(torch.from_numpy(np.abs(a)), 2, 3, 2).numpy()
else:
    a = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal((1, 4, 1, 1)).astype(np.float32)
    desc = dml.ConvolutionOperatorDesc(T("float32", (1, 3, 6, 6)), T("float32", (4, 3, 3, 3)),
                                       T("float32", (1, 4, 1, 1)), T("float32", (1, 4, 6, 6)),
                                       start_padding=(1, 1), end_padding=(1, 1),
                                       fused_activation="relu")
    arrays = [a, w, b]
    expect = F.relu(F.conv2d(torch.from_numpy(a), torch.from_numpy(w),
                             torch.from_numpy(b.reshape(4)), padding=1)).numpy()
ins = [dev.tensor(v) for v in arrays]
y = dev.empty(desc.output_tensor.sizes, np.float32)
def cycle():
    op = dev.create_operator(desc)
    compiled = dev.compile_operator(op)
    compiled.execute(ins, [y])
    compiled.release()
for _ in range(max(500, cycles // 10)):
    cycle()
gc.collect()
proc = psutil.Process()
rss0, mem0 = proc.memory_info().rss, dev.memory_stats()
for _ in range(cycles):
    cycle()
gc.collect()
rss1, mem1 = proc.memory_info().rss, dev.memory_stats()
ok = bool(np.allclose(y.numpy(), expect, rtol=1e-5, atol=1e-5))
print(json.dumps({"rss_growth": rss1 - rss0, "mem0": mem0, "mem1": mem1, "ok": ok}))
"""

LEAK_OPS = ["padding", "fold", "unfold", "lp_pooling", "convolution"]


@pytest.mark.parametrize("op", LEAK_OPS)
def test_no_leaks_create_compile_execute_release(device, speed, op):
    """10,000 create/compile/execute/release cycles of each operator (2,000 on a slow
    device): host RSS and device memory stay flat after warm-up, and the last result is
    right.  Measured in a child process without the validation layer, whose own
    bookkeeping grows by ~3 KiB per submission."""
    import json
    import subprocess
    import sys

    cycles = int(os.environ.get("VKML_LEAK_CYCLES", 10000 if speed < 0.2 else 2000))
    env = dict(os.environ, VKML_VALIDATION="0")
    out = subprocess.run([sys.executable, "-c", _LEAK_CHILD, str(device.index), op,
                          str(cycles)], capture_output=True, text=True, env=env, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["ok"]
    assert r["mem1"] == r["mem0"], (r["mem0"], r["mem1"])
    grown = r["rss_growth"]
    assert grown < 8 << 20, f"host memory grew by {grown / 2**20:.1f} MiB over {cycles} cycles"


def test_functional_and_tensors_do_not_leak(device):
    x = np.ones((16, 16), np.float32)
    for _ in range(300):
        vkml.pad(x, [1, 1], [1, 1], device=device)
        t = vkml.tensor(x, device=device)
        vkml.pad(t, [1, 1], [1, 1], "wrap")
    gc.collect()
    base = device.memory_stats()["used"]
    for _ in range(300):
        vkml.pad(x, [1, 1], [1, 1], device=device)
        t = vkml.tensor(x, device=device)
        vkml.pad(t, [1, 1], [1, 1], "wrap")
    gc.collect()
    assert device.memory_stats()["used"] == base


def test_close_releases_everything_in_any_order(device):
    """Device.close() and the context manager release all; objects may be released before
    or after the device, in any order, and using them afterwards raises DeviceError."""
    with vkml.Device(device.index) as dev:
        x = dev.tensor(np.ones((4, 4), np.float32))
        y = dev.empty((6, 6), np.float32)
        desc = dml.PaddingOperatorDesc(dml.TensorDesc("float32", (4, 4)),
                                       dml.TensorDesc("float32", (6, 6)), "edge", 0.0,
                                       (1, 1), (1, 1))
        c1 = dev.compile_operator(dev.create_operator(desc))
        c2 = dev.compile_operator(dev.create_operator(desc))
        seq = dev.sequence()
        c1.record(seq, [x], [y])
        seq.run()
        c2.execute([x], [y])
        c1.release()            # released before the sequence that uses it
        with pytest.raises(DeviceError):
            seq.run()           # refused: its operator's buffers are gone
        x.free()
        seq.close()
        seq.close()             # idempotent
    # after close: everything refuses cleanly, nothing crashes
    with pytest.raises(DeviceError):
        y.numpy()
    with pytest.raises(DeviceError):
        c2.execute([y], [y])
    c2.release()
    y.free()
    dev.close()


# -- large tensors, faults -----------------------------------------------------------------
REAL_LIMIT = 128 << 20      # lavapipe's maxStorageBufferRange


@pytest.fixture
def big_device(device):
    """The device with maxStorageBufferRange at most 128 MiB: its own where it is that
    small (lavapipe), else lowered to it, so the windowed paths run at real size on
    every driver."""
    if device.limits["maxStorageBufferRange"] <= REAL_LIMIT:
        yield device
        return
    with vkml.Device(device.index, limits={"maxStorageBufferRange": REAL_LIMIT}) as dev:
        yield dev


def test_padding_beyond_max_storage_buffer_range(big_device):
    """A real tensor larger than maxStorageBufferRange."""
    limit = big_device.limits["maxStorageBufferRange"]
    rows = limit // (4 * 1024 * 1024) + 2           # float32 rows of 1 MiB elements
    x = np.arange(rows * 1024 * 1024, dtype=np.float32).reshape(rows, 1024, 1024)
    y = vkml.pad(x, [1, 0, 2], [0, 1, 3], "reflection", device=big_device)
    assert y.nbytes > limit
    np.testing.assert_array_equal(y, np.pad(x, [(1, 0), (0, 1), (2, 3)], "reflect"))


def test_fold_beyond_max_storage_buffer_range(big_device):
    """Fold whose columns and image are each larger than maxStorageBufferRange."""
    import torch
    import torch.nn.functional as F

    device = big_device
    limit = device.limits["maxStorageBufferRange"]
    c = limit // (4 * 1024 * 1024) + 2          # float32 1024x1024 planes
    rng = np.random.default_rng(3)
    cols = rng.standard_normal((1, c * 4, 512 * 512), dtype=np.float32)
    y = vkml.fold(cols, (1024, 1024), (2, 2), strides=(2, 2), device=device)
    assert y.nbytes > limit and cols.nbytes > limit
    np.testing.assert_array_equal(y, F.fold(torch.from_numpy(cols), (1024, 1024), (2, 2),
                                            stride=2).numpy())
    # overlapping windows (sums), padded, columns beyond the limit
    cols = rng.standard_normal((1, 4 * 9, 1022 * 1024), dtype=np.float32)
    assert cols.nbytes > limit
    y = vkml.fold(cols, (1024, 1024), (3, 3), start_padding=(0, 1), end_padding=(0, 1),
                  device=device)
    np.testing.assert_allclose(y, F.fold(torch.from_numpy(cols), (1024, 1024), (3, 3),
                                         padding=(0, 1)).numpy(), rtol=1e-5,
                               atol=1e-5)


def test_convolution_beyond_max_storage_buffer_range(big_device):
    """A convolution whose input and output are larger than maxStorageBufferRange."""
    import torch
    import torch.nn.functional as F

    device = big_device
    limit = device.limits["maxStorageBufferRange"]
    n = limit // (4 * 4 * 128 * 128) + 4
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, 4, 128, 128), dtype=np.float32)
    w = rng.standard_normal((4, 4, 3, 3), dtype=np.float32)
    b = rng.standard_normal(4, dtype=np.float32)
    y = vkml.convolution(x, w, b, start_padding=(1, 1), end_padding=(1, 1), device=device)
    assert x.nbytes > limit and y.nbytes > limit
    expect = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b),
                      padding=1).numpy()
    np.testing.assert_allclose(y, expect, rtol=1e-4, atol=1e-4)


def test_allocation_beyond_the_device_raises_device_error(device):
    too_big = device._ctx.tensor_heap.max_alloc + (1 << 20)
    with pytest.raises(DeviceError) as err:
        device.empty((too_big,), np.uint8)
    assert str(too_big) in str(err.value) and "maxMemoryAllocationSize" in str(err.value)
    assert vkml.pad(np.ones(3, np.float32), [1], [1], device=device).shape == (5,)


def test_out_of_device_memory_then_usable(device):
    """Filling the heap raises DeviceError (asked vs available); freeing makes the device
    usable again."""
    held = []
    chunk = min(256 << 20, device._ctx.tensor_heap.max_alloc)
    with pytest.raises(DeviceError) as err:
        for _ in range(64):
            held.append(device.empty((chunk,), np.uint8))
    assert "out of device memory" in str(err.value) or "cannot allocate" in str(err.value)
    held.clear()
    gc.collect()
    x = np.arange(10, dtype=np.float32)
    np.testing.assert_array_equal(vkml.pad(x, [2], [2], "wrap", device=device),
                                  np.pad(x, 2, "wrap"))


def test_workgroup_limit_is_split(device):
    """A box wider than maxComputeWorkGroupCount * local size is split, not submitted."""
    with vkml.Device(device.index, limits={"maxComputeWorkGroupCount": (3, 2, 2)}) as small:
        x = np.arange(7 * 5 * 3 * 300, dtype=np.int32).reshape(7, 5, 3, 300)
        for mode in ("constant", "symmetric"):
            np.testing.assert_array_equal(
                vkml.pad(x, [1, 2, 0, 3], [2, 0, 1, 1], mode, device=small),
                np.pad(x, [(1, 2), (2, 0), (0, 1), (3, 1)], NUMPY_MODE[mode]))


def run_in_threads(work, errors: list, count: int = 8) -> None:
    """Run ``work(k)`` for k in range(count) concurrently; an exception is an error."""
    def guarded(k):
        try:
            work(k)
        except Exception as exc:  # noqa: BLE001
            errors.append((k, repr(exc)))

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)


# -- threads ----------------------------------------------------------------------------
def test_eight_threads_on_one_device(device):
    """Operators called concurrently from 8 threads give correct results (the scheduler
    serialises queue access; recording and execution are thread safe)."""
    errors = []
    shared = device.compile_operator(device.create_operator(dml.PaddingOperatorDesc(
        dml.TensorDesc("int32", (6, 7)), dml.TensorDesc("int32", (9, 9)), "wrap", 0.0,
        (1, 1), (2, 1))))
    src = np.arange(42, dtype=np.int32).reshape(6, 7)
    expect_shared = np.pad(src, [(1, 2), (1, 1)], "wrap")

    def work(k):
        rng = np.random.default_rng(k)
        x_dev = device.tensor(src)
        out = device.empty((9, 9), np.int32)
        for i in range(25):
            x = rng.random((3 + k, 5), dtype=np.float32)
            mode = MODES[(i + k) % len(MODES)]
            got = vkml.pad(x, [k % 3, 1], [1, k % 2], mode, device=device)
            if not np.array_equal(got, np.pad(x, [(k % 3, 1), (1, k % 2)],
                                              NUMPY_MODE[mode])):
                errors.append((k, i, mode))
            shared.execute([x_dev], [out])
            if not np.array_equal(out.numpy(), expect_shared):
                errors.append((k, i, "shared"))

    run_in_threads(work, errors)
    shared.release()
    assert not errors, errors[:5]


def test_every_operator_from_eight_threads(device):
    """Fold, Unfold, LP pooling, Convolution and Padding called concurrently from 8
    threads, each on its own shapes (so each compiles its own operators), and on one
    shared compiled convolution executed from every thread."""
    import torch
    import torch.nn.functional as F

    errors = []
    rng0 = np.random.default_rng(99)
    wx = rng0.standard_normal((2, 3, 6, 6)).astype(np.float32)
    ww = rng0.standard_normal((4, 3, 3, 3)).astype(np.float32)
    shared_expect = F.conv2d(torch.from_numpy(wx), torch.from_numpy(ww), padding=1).numpy()
    shared = device.compile_operator(device.create_operator(dml.ConvolutionOperatorDesc(
        dml.TensorDesc("float32", wx.shape), dml.TensorDesc("float32", ww.shape), None,
        dml.TensorDesc("float32", shared_expect.shape), start_padding=(1, 1),
        end_padding=(1, 1))))
    shared_in = [device.tensor(wx), device.tensor(ww), None]

    def close(a, b):
        return np.allclose(a, b, rtol=1e-4, atol=1e-4)

    def work(k):
        rng = np.random.default_rng(k)
        out = device.empty(shared_expect.shape, np.float32)
        for i in range(6):
            h = 5 + (k + i) % 4
            x = rng.standard_normal((1, 2, h, h + 1)).astype(np.float32)
            xt = torch.from_numpy(x)
            cols = vkml.unfold(x, (2, 2), device=device)
            if not close(cols, F.unfold(xt, (2, 2)).numpy()):
                errors.append((k, i, "unfold"))
            img = vkml.fold(cols, (h, h + 1), (2, 2), device=device)
            if not close(img, F.fold(torch.from_numpy(cols), (h, h + 1), (2, 2)).numpy()):
                errors.append((k, i, "fold"))
            lp = vkml.lp_pooling(x, (2, 2), strides=(2, 2), device=device)
            if not close(lp, F.lp_pool2d(xt.abs(), 2, 2, 2).numpy()):
                errors.append((k, i, "lp_pooling"))
            w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
            y = vkml.convolution(x, w, start_padding=(1, 1), end_padding=(1, 1),
                                 fused_activation="relu", device=device)
            if not close(y, F.relu(F.conv2d(xt, torch.from_numpy(w), padding=1)).numpy()):
                errors.append((k, i, "convolution"))
            p = vkml.pad(x, [0, 0, 1, k % 3], [0, 0, 2, 1], "symmetric", device=device)
            if not np.array_equal(p, np.pad(x, [(0, 0), (0, 0), (1, 2), (k % 3, 1)],
                                            "symmetric")):
                errors.append((k, i, "padding"))
            shared.execute(shared_in, [out])
            if not close(out.numpy(), shared_expect):
                errors.append((k, i, "shared"))

    run_in_threads(work, errors)
    shared.release()
    assert not errors, errors[:5]


def test_unsupported_is_clear(device):
    """UnsupportedError names the missing feature (here: a descriptor vkml lacks)."""
    class Fake(dml.OperatorDesc):
        OPERATOR_TYPE = "DML_OPERATOR_FAKE"

        def validate(self):
            pass

        def inputs(self):
            return []

        def outputs(self):
            return []

    with pytest.raises(UnsupportedError, match="DML_OPERATOR_FAKE"):
        device.compile_operator(device.create_operator(Fake()))


# -- fold / unfold ------------------------------------------------------------------------
def _blocks(spatial, window, strides, dilations, start, end):
    out = []
    for s, w, step, dl, a, b in zip(spatial, window, strides, dilations, start, end):
        num = s + a + b - dl * (w - 1) - 1
        out.append(num // step + 1 if num >= 0 else 0)
    return out


def _unfold_reference(x, window, strides, dilations, start, end):
    """im2col by direct gathering, written independently of vkml: (N, C*K, L)."""
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    blocks = _blocks(spatial, window, strides, dilations, start, end)
    padded = np.zeros((n, c) + tuple(s + a + b for s, a, b in zip(spatial, start, end)), x.dtype)
    padded[(slice(None), slice(None)) + tuple(slice(a, a + s) for a, s in zip(start, spatial))] = x
    cols = np.zeros((n, c, int(np.prod(window)), int(np.prod(blocks))), x.dtype)
    for bi, block in enumerate(np.ndindex(*blocks)):
        for ki, k in enumerate(np.ndindex(*window)):
            idx = tuple(b * st + kk * dl for b, st, kk, dl in zip(block, strides, k, dilations))
            cols[:, :, ki, bi] = padded[(slice(None), slice(None)) + idx]
    return cols.reshape(n, c * int(np.prod(window)), -1)


def _fold_reference(cols, out_spatial, window, strides, dilations, start, end):
    """col2im by scattering with np.add.at (integer sums wrap, as in the device)."""
    n, ck, _ = cols.shape
    k = int(np.prod(window))
    c = ck // k
    blocks = _blocks(out_spatial, window, strides, dilations, start, end)
    acc_dtype = np.float64 if cols.dtype.kind == "f" else cols.dtype
    padded = np.zeros((n, c) + tuple(s + a + b for s, a, b in zip(out_spatial, start, end)),
                      acc_dtype)
    cols4 = cols.reshape(n, c, k, -1).astype(acc_dtype)
    for bi, block in enumerate(np.ndindex(*blocks)):
        for ki, kk in enumerate(np.ndindex(*window)):
            idx = tuple(b * st + q * dl for b, st, q, dl in zip(block, strides, kk, dilations))
            padded[(slice(None), slice(None)) + idx] += cols4[:, :, ki, bi]
    inner = padded[(slice(None), slice(None)) + tuple(slice(a, a + s) for a, s in
                                                      zip(start, out_spatial))]
    return inner.astype(cols.dtype)


@st.composite
def window_cases(draw):
    d = draw(st.integers(1, 3))
    spatial = draw(st.lists(st.integers(1, 6), min_size=d, max_size=d))
    window = draw(st.lists(st.integers(1, 3), min_size=d, max_size=d))
    strides = draw(st.lists(st.integers(1, 3), min_size=d, max_size=d))
    dilations = draw(st.lists(st.integers(1, 2), min_size=d, max_size=d))
    start = draw(st.lists(st.integers(0, 2), min_size=d, max_size=d))
    end = draw(st.lists(st.integers(0, 2), min_size=d, max_size=d))
    # keep valid cases common: shrink windows that do not fit
    for i in range(d):
        while window[i] > 1 and dilations[i] * (window[i] - 1) + 1 > spatial[i] + start[i] + end[i]:
            window[i] -= 1
    mutation = draw(st.sampled_from(["none"] * 8 + ["rows", "count", "batch", "stride0",
                                                    "too_big", "arr_len", "dtype"]))
    return dict(n=draw(st.integers(1, 2)), c=draw(st.integers(1, 3)), spatial=spatial,
                window=window, strides=strides, dilations=dilations, start=start, end=end,
                dtype=draw(st.sampled_from(ALL_DTYPES)), mutation=mutation,
                layout=draw(st.sampled_from(LAYOUTS)), out_padded=draw(st.booleans()),
                seed=draw(st.integers(0, 2**31)))


_WINDOW_ERRORS = {"stride0": "strides", "too_big": "window_sizes", "arr_len": "strides",
                  "dtype": "data_type"}


def _window_descs(case, op: str, in_strides=None, out_strides=None):
    """(image sizes, columns sizes, desc) for fold or unfold with the case's mutation."""
    from vkml.dml import FoldOperatorDesc, UnfoldOperatorDesc

    n, c, spatial = case["n"], case["c"], list(case["spatial"])
    window, strides = list(case["window"]), list(case["strides"])
    m = case["mutation"]
    if m == "stride0":
        strides[0] = 0
    if m == "too_big":
        window[0] = spatial[0] + case["start"][0] + case["end"][0] + 1
    if m == "arr_len":
        strides = strides + [1]
    blocks = _blocks(spatial, case["window"], case["strides"], case["dilations"],
                     case["start"], case["end"])
    cols = [n, c * int(np.prod(case["window"])), int(np.prod(blocks))]
    if m == "rows":
        cols[1] += 1
    if m == "count":
        cols[2] += 1
    if m == "batch":
        cols[0] += 1
    image = [n, c] + spatial
    dt = case["dtype"]
    other = "int8" if dt != "int8" else "uint8"
    img_dt, col_dt = dt, dt
    if m == "dtype":
        img_dt = other
    if op == "fold":
        desc = FoldOperatorDesc(dml.TensorDesc(col_dt, cols, in_strides),
                                dml.TensorDesc(img_dt, image, out_strides),
                                window, strides, case["dilations"], case["start"], case["end"])
    else:
        desc = UnfoldOperatorDesc(dml.TensorDesc(img_dt, image, in_strides),
                                  dml.TensorDesc(col_dt, cols, out_strides),
                                  window, strides, case["dilations"], case["start"], case["end"])
    return image, cols, desc


def _window_expected_errors(case, op):
    m = case["mutation"]
    if m in ("rows", "count", "batch"):
        return ["input_tensor.sizes" if op == "fold" else "output_tensor.sizes"]
    return [_WINDOW_ERRORS[m]] if m in _WINDOW_ERRORS else []


def _allowed_unsupported(device, dtype) -> bool:
    return dtype == "float64" and not device.features["fp64"]


def _run_window_case(device, case, op):
    rng = np.random.default_rng(case["seed"])
    want = _window_expected_errors(case, op)
    dt = np.dtype(case["dtype"])
    image, cols, _ = _window_descs(case, op)
    in_sizes, out_sizes = (image, cols) if op == "unfold" else (cols, image)
    if dt.kind == "f":
        x = rng.uniform(-4, 4, in_sizes).astype(dt)
    else:
        x = random_bits(rng, in_sizes, dt)
    flat, in_strides, x = lay_out(rng, x, case["layout"])
    out_strides, read = padded_output(rng, out_sizes, dt, case["out_padded"])
    desc, compiled = compiled_or_refused(
        device, lambda: _window_descs(case, op, in_strides, out_strides)[2], want,
        _allowed_unsupported(device, case["dtype"]))
    if desc is None:
        return
    src = bind_with_canary(device, desc.input_tensor.total_tensor_size_in_bytes, flat)
    dst = bind_with_canary(device, desc.output_tensor.total_tensor_size_in_bytes)
    compiled.execute([src], [dst])
    compiled.release()
    got, gaps_intact = read(dst)
    args = (case["window"], case["strides"], case["dilations"], case["start"], case["end"])
    if op == "unfold":
        assert same_bits(got, _unfold_reference(x, *args))
    else:
        expect = _fold_reference(x, case["spatial"], *args)
        if dt.kind == "f":
            np.testing.assert_allclose(got.astype(np.float64), expect.astype(np.float64),
                                       rtol=1e-2 if dt == np.float16 else 1e-5, atol=1e-2)
        else:
            assert same_bits(got, expect)
    assert gaps_intact, "wrote into the gaps of a non-packed output"
    assert canaries_intact(src) and canaries_intact(dst), "wrote outside the tensor"
    assert same_bits(src.read_bytes(flat.nbytes).view(dt), flat), "input changed"


@pytest.mark.parametrize("op", ["fold", "unfold"])
def test_fuzz_fold_unfold(device, speed, op):
    @settings(max_examples=fuzz_examples(speed), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(window_cases())
    def check(case):
        _run_window_case(device, case, op)

    check()


# -- LP pooling ---------------------------------------------------------------------------
def _lp_reference(x, window, strides, dilations, start, end, p):
    """(sum |x|^p)^(1/p) over each dilated window of the zero-padded input, in float64."""
    xp = np.pad(np.abs(x.astype(np.float64)), [(0, 0), (0, 0)] + list(zip(start, end)))
    out_sp = [(s + a + b - dl * (w - 1) - 1) // st + 1 for s, a, b, dl, w, st in
              zip(x.shape[2:], start, end, dilations, window, strides)]
    y = np.zeros(x.shape[:2] + tuple(out_sp))
    for o in np.ndindex(*out_sp):
        acc = 0.0
        for k in np.ndindex(*window):
            idx = tuple(oo * st + kk * dl for oo, st, kk, dl in zip(o, strides, k, dilations))
            acc = acc + xp[(slice(None), slice(None)) + idx] ** p
        y[(slice(None), slice(None)) + o] = acc ** (1.0 / p)
    return y


@st.composite
def lp_cases(draw):
    d = draw(st.integers(2, 3))
    spatial = draw(st.lists(st.integers(1, 6), min_size=d, max_size=d))
    window = draw(st.lists(st.integers(1, 3), min_size=d, max_size=d))
    dil = draw(st.lists(st.integers(1, 2), min_size=d, max_size=d))
    start = draw(st.lists(st.integers(0, 2), min_size=d, max_size=d))
    end = draw(st.lists(st.integers(0, 2), min_size=d, max_size=d))
    for i in range(d):
        while window[i] > 1 and dil[i] * (window[i] - 1) + 1 > spatial[i] + start[i] + end[i]:
            window[i] -= 1
    return dict(shape=[draw(st.integers(1, 2)), draw(st.integers(1, 3))] + spatial,
                window=window, strides=draw(st.lists(st.integers(1, 3), min_size=d, max_size=d)),
                dilations=dil, start=start, end=end, p=draw(st.integers(1, 5)),
                dtype=draw(st.sampled_from(["float32", "float16"])),
                mutation=draw(st.sampled_from(["none"] * 8 + ["out", "p0", "stride0", "int",
                                                              "rank3"])),
                layout=draw(st.sampled_from(LAYOUTS)), out_padded=draw(st.booleans()),
                seed=draw(st.integers(0, 2**31)))


def test_fuzz_lp_pooling(device, speed):
    @settings(max_examples=fuzz_examples(speed), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(lp_cases())
    def check(case):
        rng = np.random.default_rng(case["seed"])
        m = case["mutation"]
        want = {"out": ["output_tensor.sizes"], "p0": ["p"], "stride0": ["strides"],
                "int": ["data_type"], "rank3": ["input_tensor.sizes", "window_size",
                                                 "output_tensor.sizes"]}.get(m, [])
        shape, strides, p, dtype = list(case["shape"]), list(case["strides"]), case["p"], \
            case["dtype"]
        out = [(s + a + b - dl * (w - 1) - 1) // st + 1 for s, a, b, dl, w, st in
               zip(shape[2:], case["start"], case["end"], case["dilations"], case["window"],
                   strides)]
        out = shape[:2] + out
        if m == "out":
            out[-1] += 1
        if m == "p0":
            p = 0
        if m == "stride0":
            strides[0] = 0
        if m == "int":
            dtype = "int32"
        if m == "rank3":
            shape, out = shape[:3], out[:3]
        x = rng.uniform(-3, 3, shape).astype(dtype if dtype != "int32" else "float32")
        flat, in_strides, x = lay_out(rng, x, case["layout"])
        out_strides, read = padded_output(rng, out, dtype, case["out_padded"])
        desc, compiled = compiled_or_refused(device, lambda: dml.LpPooling1OperatorDesc(
            dml.TensorDesc(dtype, shape, in_strides), dml.TensorDesc(dtype, out, out_strides),
            strides, case["window"], case["start"], case["end"], case["dilations"], p), want)
        if desc is None:
            return
        src = bind_with_canary(device, desc.input_tensor.total_tensor_size_in_bytes, flat)
        dst = bind_with_canary(device, desc.output_tensor.total_tensor_size_in_bytes)
        compiled.execute([src], [dst])
        compiled.release()
        got, gaps_intact = read(dst)
        expect = _lp_reference(x, case["window"], strides, case["dilations"], case["start"],
                               case["end"], p)
        tol = 2e-3 if dtype == "float16" else 1e-5
        np.testing.assert_allclose(got.astype(np.float64), expect, rtol=tol, atol=tol)
        assert gaps_intact, "wrote into the gaps of a non-packed output"
        assert canaries_intact(src) and canaries_intact(dst), "wrote outside the tensor"

    check()


# -- convolution --------------------------------------------------------------------------
_CONV_ACTS = {None: lambda y: y, "relu": lambda y: np.maximum(y, 0),
              "sigmoid": lambda y: 1 / (1 + np.exp(-y)), "tanh": np.tanh,
              "leaky_relu": lambda y: np.where(y >= 0, y, 0.01 * y)}


def _conv_reference(x, w, b, strides, dilations, start, end, outpad, groups, backward, flip):
    """The convolution in float64 by summing shifted slices per kernel tap (forward) or
    scattering them (backward), written independently of vkml and of PyTorch."""
    d = x.ndim - 2
    x, w = x.astype(np.float64), w.astype(np.float64)
    if flip:
        w = w[(slice(None), slice(None)) + (slice(None, None, -1),) * d]
    n, cin = x.shape[:2]
    cin_g = cin // groups
    if not backward:
        cout = w.shape[0]
        cout_g = cout // groups
        xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(start, end)))
        conv = [(i + a + e - dl * (k - 1) - 1) // s + 1 for i, a, e, dl, k, s in
                zip(x.shape[2:], start, end, dilations, w.shape[2:], strides)]
        y = np.zeros((n, cout) + tuple(conv))
        for g in range(groups):
            xs_g = xp[:, g * cin_g:(g + 1) * cin_g]
            for tap in np.ndindex(*w.shape[2:]):
                sl = tuple(slice(t * dl, t * dl + s * (o - 1) + 1, s)
                           for t, dl, s, o in zip(tap, dilations, strides, conv))
                wt = w[(slice(g * cout_g, (g + 1) * cout_g), slice(None)) + tap]
                y[:, g * cout_g:(g + 1) * cout_g] += np.einsum(
                    "nc...,oc->no...", xs_g[(slice(None), slice(None)) + sl], wt)
        y = np.pad(y, [(0, 0), (0, 0)] + [(0, p) for p in outpad])
    else:
        cout_g = w.shape[1]
        cout = cout_g * groups
        full = [(i - 1) * s + dl * (k - 1) + 1 for i, s, dl, k in
                zip(x.shape[2:], strides, dilations, w.shape[2:])]
        yf = np.zeros((n, cout) + tuple(f + p for f, p in zip(full, outpad)))
        for g in range(groups):
            for tap in np.ndindex(*w.shape[2:]):
                sl = tuple(slice(t * dl, t * dl + s * (i - 1) + 1, s)
                           for t, dl, s, i in zip(tap, dilations, strides, x.shape[2:]))
                wt = w[(slice(g * cin_g, (g + 1) * cin_g), slice(None)) + tap]
                yf[(slice(None), slice(g * cout_g, (g + 1) * cout_g)) + sl] += np.einsum(
                    "nc...,co->no...", x[:, g * cin_g:(g + 1) * cin_g], wt)
        y = yf[(slice(None), slice(None)) + tuple(
            slice(a, f + p - e) for a, f, p, e in zip(start, full, outpad, end))]
    if b is not None:
        y = y + b.astype(np.float64).reshape((1, -1) + (1,) * d)
    return y


@st.composite
def conv_cases(draw):
    """Small random convolutions of every kind, plus two shapes in the domains of the
    fast paths: "wide" (3x3 stride 1, 16-20 channels, 20-26 pixels a side: Winograd,
    GEMM) and "depthwise" (group count = input channels, channel multipliers)."""
    kind = draw(st.sampled_from(["small"] * 5 + ["wide"] * 2 + ["depthwise"]))
    d = 2 if kind != "small" else draw(st.integers(1, 3))
    backward = draw(st.booleans()) if kind != "depthwise" else False
    lists = {"small": lambda lo, hi: draw(st.lists(st.integers(lo, hi), min_size=d,
                                                   max_size=d)),
             "wide": lambda lo, hi: [lo] * d if hi < 6 else
             draw(st.lists(st.integers(20, 26), min_size=d, max_size=d)),
             "depthwise": lambda lo, hi: draw(st.lists(st.integers(lo, min(hi, 12)),
                                                       min_size=d, max_size=d))}[kind]
    spatial = lists(1 if kind == "small" else 6, {1: 9, 2: 6, 3: 4}[d] if kind == "small"
                    else 12)
    kernel = lists(1, 3) if kind != "wide" else [3] * d
    strides = lists(1, 3 if kind == "small" else 2)
    dilations = lists(1, 2)
    start = lists(0, 2) if kind != "wide" else lists(0, 1)
    end = lists(0, 2) if kind != "wide" else lists(0, 1)
    if kind == "wide":
        groups = 1
        cin, cout = draw(st.integers(16, 20)), draw(st.integers(16, 20))
    elif kind == "depthwise":
        groups = cin = draw(st.integers(4, 8))
        cout = cin * draw(st.integers(1, 2))
    else:
        groups = draw(st.sampled_from([1, 1, 2, 3]))
        cin, cout = groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 3))
    outpad = draw(st.lists(st.integers(0, 2), min_size=d, max_size=d)) \
        if draw(st.integers(0, 3)) == 0 else [0] * d
    for i in range(d):      # keep valid cases common: shrink what does not fit
        if backward:
            full = (spatial[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1
            while start[i] + end[i] >= full + outpad[i]:
                start[i], end[i] = start[i] // 2, end[i] // 2
                if start[i] + end[i] == 0:
                    break
        else:
            while kernel[i] > 1 and dilations[i] * (kernel[i] - 1) + 1 > \
                    spatial[i] + start[i] + end[i]:
                kernel[i] -= 1
    return dict(d=d, backward=backward, groups=groups, n=draw(st.integers(1, 2)),
                cin=cin, cout=cout, path=draw(st.integers(0, 7)), spatial=spatial, kernel=kernel, strides=strides, dilations=dilations,
                start=start, end=end, outpad=outpad, flip=draw(st.booleans()),
                bias=draw(st.sampled_from([None, "dml"])),
                act=draw(st.sampled_from(list(_CONV_ACTS))),
                dtype=draw(st.sampled_from(["float32", "float16"])),
                mutation=draw(st.sampled_from(["none"] * 8 + [
                    "group", "filter", "out", "bias", "dtype", "arr_len", "stride0",
                    "rank6"])),
                x_layout=draw(st.sampled_from(LAYOUTS)), w_layout=draw(st.sampled_from(LAYOUTS)),
                out_padded=draw(st.booleans()),
                seed=draw(st.integers(0, 2**31)))


_CONV_ERRORS = {"group": ["group_count", "filter_tensor.sizes"],
                "filter": ["filter_tensor.sizes"], "out": ["output_tensor.sizes"],
                "bias": ["bias_tensor.sizes"], "dtype": ["data_type"],
                "arr_len": ["strides"], "stride0": ["strides"],
                "rank6": ["input_tensor", "filter_tensor", "bias_tensor", "output_tensor"]}


def _conv_desc(case, strides_of=lambda name: None):
    """(shapes of x, w, b and y; the descriptor) with the case's mutation applied;
    ``strides_of("x" | "w" | "y")`` gives each tensor's element strides."""
    g, cin, cout, sp = case["groups"], case["cin"], case["cout"], list(case["spatial"])
    m, n, d = case["mutation"], case["n"], case["d"]
    strides, kernel = list(case["strides"]), list(case["kernel"])
    if case["backward"]:
        wshape = [cin, cout // g] + kernel
        conv = [(i - 1) * s + dl * (k - 1) + 1 - a - e + p for i, s, dl, k, a, e, p in
                zip(sp, strides, case["dilations"], kernel, case["start"], case["end"],
                    case["outpad"])]
    else:
        wshape = [cout, cin // g] + kernel
        conv = [(i + a + e - dl * (k - 1) - 1) // s + 1 + p for i, a, e, dl, k, s, p in
                zip(sp, case["start"], case["end"], case["dilations"], kernel, strides,
                    case["outpad"])]
    xshape, yshape = [n, cin] + sp, [n, cout] + conv
    bshape = [1, cout] + [1] * d if case["bias"] else None
    dt, ydt = case["dtype"], case["dtype"]
    if m == "group":
        xshape[1] += 1
    elif m == "filter":
        wshape[0 if case["backward"] else 1] += 1
    elif m == "out":
        yshape[-1] += 1
    elif m == "bias":
        bshape = [1, cout + 1] + [1] * d
    elif m == "dtype":
        ydt = "float16" if dt == "float32" else "float32"
    elif m == "arr_len":
        strides = strides + [1]
    elif m == "stride0":
        strides[0] = 0
    elif m == "rank6":
        xshape, wshape, yshape = (s + [1] * (6 - len(s)) for s in (xshape, wshape, yshape))
        bshape = bshape and [1, cout, 1, 1, 1, 1]
    T = dml.TensorDesc
    desc = dml.ConvolutionOperatorDesc(
        T(dt, xshape, strides_of("x")), T(dt, wshape, strides_of("w")),
        T(dt, bshape) if bshape else None, T(ydt, yshape, strides_of("y")),
        "convolution" if case["flip"] else "cross_correlation",
        "backward" if case["backward"] else "forward", strides, case["dilations"],
        case["start"], case["end"], case["outpad"], g, case["act"])
    return xshape, wshape, bshape, yshape, desc


def _with_drawn_path(device, compiled, desc, draw: int):
    """Recompile with one of the kernel paths that accept the descriptor on this device
    (the drawn index modulo their count), so every path meets random descriptors."""
    import importlib

    conv_ops = importlib.import_module("vkml.ops.convolution")
    geo = conv_ops.Geometry.of(desc)
    accepting = [p for p in conv_ops.PATHS if p.accepts(compiled, geo)]
    chosen = accepting[draw % len(accepting)]
    compiled.release()
    saved = conv_ops.PATHS[:]
    conv_ops.PATHS[:] = [chosen]
    try:
        return device.compile_operator(device.create_operator(desc))
    finally:
        conv_ops.PATHS[:] = saved


def _run_conv_case(device, case):
    rng = np.random.default_rng(case["seed"])
    want = _CONV_ERRORS.get(case["mutation"], [])
    dt = np.dtype(case["dtype"])
    try:
        xshape, wshape, bshape, yshape, _ = _conv_desc(case)
    except ValidationError as err:          # a malformed TensorDesc (rank 6)
        assert any(f in str(err) for f in ["TensorDesc"] + want), str(err)
        return
    x = rng.uniform(-1, 1, xshape).astype(dt)
    w = rng.uniform(-1, 1, wshape).astype(dt)
    b = rng.uniform(-1, 1, bshape).astype(dt) if bshape else None
    x_flat, x_strides, x = lay_out(rng, x, case["x_layout"])
    w_flat, w_strides, w = lay_out(rng, w, case["w_layout"])
    y_strides, read = padded_output(rng, yshape, dt, case["out_padded"])
    strides = {"x": x_strides, "w": w_strides, "y": y_strides}
    desc, compiled = compiled_or_refused(device, lambda: _conv_desc(case, strides.get)[-1],
                                         want)
    if desc is None:
        return
    compiled = _with_drawn_path(device, compiled, desc, case["path"])
    flats = (x_flat, w_flat, b.reshape(-1) if b is not None else None)
    ins = [bind_with_canary(device, t.total_tensor_size_in_bytes, f) if f is not None else None
           for t, f in zip(desc.inputs(), flats)]
    out = bind_with_canary(device, desc.output_tensor.total_tensor_size_in_bytes)
    compiled.execute(ins, [out])
    compiled.release()
    got, gaps_intact = read(out)
    args = (case["strides"], case["dilations"], case["start"], case["end"], case["outpad"],
            case["groups"], case["backward"], case["flip"])
    expect = _CONV_ACTS[case["act"]](_conv_reference(x, w, b, *args))
    # error bound: the sum of |terms| of each output, scaled by the type's precision
    scale = _conv_reference(np.abs(x), np.abs(w), np.abs(b) if b is not None else None, *args)
    tol = (2e-3 * scale + 2e-3) if dt == np.float16 else (2e-6 * scale + 1e-6)
    err = np.abs(got.astype(np.float64) - expect)
    assert np.all(err <= tol), f"max error {err.max():.3g} (tolerance {tol.max():.3g})"
    assert gaps_intact, "wrote into the gaps of a non-packed output"
    for t, f in zip(ins, flats):
        if t is not None:
            assert canaries_intact(t), "wrote outside an input"
            assert same_bits(t.read_bytes(f.nbytes).view(dt), f), "input changed"
    assert canaries_intact(out), "wrote outside the output"


def test_fuzz_convolution(device, speed):
    @settings(max_examples=fuzz_examples(speed), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(conv_cases())
    def check(case):
        _run_conv_case(device, case)

    check()

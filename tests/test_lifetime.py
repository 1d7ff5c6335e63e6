"""Lifetime and limits: no leaks over thousands of create/compile/execute/release
cycles, release in any order, tensors beyond maxStorageBufferRange, allocation failures
that leave the device usable, dispatches beyond maxComputeWorkGroupCount, eight threads
on one device, and a clear UnsupportedError."""
from __future__ import annotations

import gc
import os
import tracemalloc

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.errors import DeviceError, UnsupportedError

from helpers import run_in_threads, slow
from references import PAD_MODES, pad_reference

MODES = list(PAD_MODES)


_LEAK_CHILD = r"""
import gc, json, sys
import numpy as np, psutil, vkml
from vkml import dml
dev = vkml.Device(int(sys.argv[1]))
op_name, cycles = sys.argv[2], int(sys.argv[3])
T = dml.TensorDesc
rng = np.random.default_rng(0)
if op_name == "padding":
    desc = dml.PaddingOperatorDesc(T("float32", (3, 4)), T("float32", (5, 8)), "reflection",
                                   0.0, (1, 2), (1, 2))
    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4)]
elif op_name == "fold":
    desc = dml.FoldOperatorDesc(T("float32", (1, 8, 9)), T("float32", (1, 2, 4, 4)), (2, 2),
                                (1, 1), (1, 1), (0, 0), (0, 0))
    arrays = [rng.standard_normal((1, 8, 9)).astype(np.float32)]
elif op_name == "unfold":
    desc = dml.UnfoldOperatorDesc(T("float32", (1, 2, 4, 4)), T("float32", (1, 8, 9)), (2, 2),
                                  (1, 1), (1, 1), (0, 0), (0, 0))
    arrays = [rng.standard_normal((1, 2, 4, 4)).astype(np.float32)]
elif op_name == "lp_pooling":
    desc = dml.LpPooling1OperatorDesc(T("float32", (1, 2, 5, 5)), T("float32", (1, 2, 2, 2)),
                                      (2, 2), (3, 3), (0, 0), (0, 0), (1, 1), 2)
    arrays = [rng.standard_normal((1, 2, 5, 5)).astype(np.float32)]
else:
    desc = dml.ConvolutionOperatorDesc(T("float32", (1, 3, 6, 6)), T("float32", (4, 3, 3, 3)),
                                       T("float32", (1, 4, 1, 1)), T("float32", (1, 4, 6, 6)),
                                       start_padding=(1, 1), end_padding=(1, 1),
                                       fused_activation="relu")
    arrays = [rng.standard_normal(s).astype(np.float32)
              for s in ((1, 3, 6, 6), (4, 3, 3, 3), (1, 4, 1, 1))]
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
print(json.dumps({"rss_growth": rss1 - rss0, "mem0": mem0, "mem1": mem1,
                  "inputs": [a.tolist() for a in arrays], "y": y.numpy().tolist()}))
"""


def _leak_expected(op: str, arrays: list) -> np.ndarray:
    """The PyTorch / NumPy result of the leak child's last cycle, computed here: the child
    does not import torch (seconds of every child's start, for nothing it checks)."""
    import torch
    import torch.nn.functional as F

    t = [torch.from_numpy(a) for a in arrays]
    if op == "padding":
        return np.pad(arrays[0], [(1, 1), (2, 2)], "reflect")
    if op == "fold":
        return F.fold(t[0], (4, 4), (2, 2)).numpy()
    if op == "unfold":
        return F.unfold(t[0], (2, 2)).numpy()
    if op == "lp_pooling":
        return F.lp_pool2d(t[0].abs(), 2, 3, 2).numpy()
    return F.relu(F.conv2d(t[0], t[1], t[2].reshape(4), padding=1)).numpy()


LEAK_OPS = ["padding", "fold", "unfold", "lp_pooling", "convolution"]


@pytest.mark.parametrize("op", LEAK_OPS)
def test_no_leaks_create_compile_execute_release(device, speed, op):
    """3,000 create/compile/execute/release cycles of each operator (1,000 on a slow
    device) after 500 of warm-up: device memory exactly flat, host RSS under 8 MiB of
    growth (2.7 KiB a cycle, 8 on a slow device: a pipeline, buffer or operator kept per
    cycle is far over it; the allocators' own steps, up to ~5 MiB whatever the count, are
    under it), and the last result right.  Measured in a child process without the
    validation layer, whose own bookkeeping grows by ~3 KiB per submission."""
    import json
    import subprocess
    import sys

    cycles = int(os.environ.get("VKML_LEAK_CYCLES", 1000 if slow(speed) else 3000))
    env = dict(os.environ, VKML_VALIDATION="0")
    out = subprocess.run([sys.executable, "-c", _LEAK_CHILD, str(device.index), op,
                          str(cycles)], capture_output=True, text=True, env=env, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    arrays = [np.array(a, np.float32) for a in r["inputs"]]
    np.testing.assert_allclose(np.array(r["y"], np.float32), _leak_expected(op, arrays),
                               rtol=1e-5, atol=1e-5)
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
LOWERED_LIMIT = 16 << 20


@pytest.fixture
def big_device(device):
    """The device with a small maxStorageBufferRange: its own where it is at most 128 MiB
    (lavapipe: the windowed paths at real size), else lowered to 16 MiB (the same windowed
    code, on tensors a slow driver computes in seconds)."""
    if device.limits["maxStorageBufferRange"] <= REAL_LIMIT:
        yield device
        return
    with vkml.Device(device.index, limits={"maxStorageBufferRange": LOWERED_LIMIT}) as dev:
        yield dev


@pytest.fixture
def lowered_device(device):
    """The device with maxStorageBufferRange lowered to 16 MiB on every driver: the same
    windowed code as at the real limit (which the padding test above binds on lavapipe),
    on tensors an operator computes in seconds whatever path it takes."""
    with vkml.Device(device.index, limits={"maxStorageBufferRange": LOWERED_LIMIT}) as dev:
        yield dev


def test_padding_beyond_max_storage_buffer_range(big_device):
    """A real tensor larger than maxStorageBufferRange."""
    limit = big_device.limits["maxStorageBufferRange"]
    rows = limit // (4 * 1024 * 1024) + 2           # float32 rows of 1 MiB elements
    x = np.arange(rows * 1024 * 1024, dtype=np.float32).reshape(rows, 1024, 1024)
    y = vkml.pad(x, [1, 0, 2], [0, 1, 3], "reflection", device=big_device)
    assert y.nbytes > limit
    np.testing.assert_array_equal(y, np.pad(x, [(1, 0), (0, 1), (2, 3)], "reflect"))


def test_fold_beyond_max_storage_buffer_range(lowered_device):
    """Fold whose columns and image are each larger than maxStorageBufferRange."""
    import torch
    import torch.nn.functional as F

    device = lowered_device
    limit = device.limits["maxStorageBufferRange"]
    c = limit // (4 * 1024 * 1024) + 2          # float32 1024x1024 planes
    rng = np.random.default_rng(3)
    cols = rng.standard_normal((1, c * 4, 512 * 512), dtype=np.float32)
    y = vkml.fold(cols, (1024, 1024), (2, 2), strides=(2, 2), device=device)
    assert y.nbytes > limit and cols.nbytes > limit
    np.testing.assert_array_equal(y, F.fold(torch.from_numpy(cols), (1024, 1024), (2, 2),
                                            stride=2).numpy())
    # overlapping windows (sums), padded, columns beyond the limit (an output element's
    # nine reads span a quarter of it)
    h = 1024 * limit // REAL_LIMIT
    cols = rng.standard_normal((1, 4 * 9, (h - 2) * 1024), dtype=np.float32)
    assert cols.nbytes > limit
    y = vkml.fold(cols, (h, 1024), (3, 3), start_padding=(0, 1), end_padding=(0, 1),
                  device=device)
    np.testing.assert_allclose(y, F.fold(torch.from_numpy(cols), (h, 1024), (3, 3),
                                         padding=(0, 1)).numpy(), rtol=1e-5,
                               atol=1e-5)


def test_convolution_beyond_max_storage_buffer_range(lowered_device):
    """A convolution whose input and output are larger than maxStorageBufferRange."""
    import torch
    import torch.nn.functional as F

    device = lowered_device
    limit = device.limits["maxStorageBufferRange"]
    n = limit // (4 * 2 * 128 * 128) + 4
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, 2, 128, 128), dtype=np.float32)
    w = rng.standard_normal((2, 2, 3, 3), dtype=np.float32)
    b = rng.standard_normal(2, dtype=np.float32)
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


def test_result_pages_beyond_any_import_are_not_allocated(device, monkeypatch):
    """HostImports.take refuses (None, counted) a size no memory type could import before
    it allocates the host pages: no 1 GiB NumPy buffer made only to be refused."""
    imports = device.context.host_imports
    if imports is None:
        pytest.skip("the device does not import host memory")
    monkeypatch.setattr(imports, "max_span", [1 << 20] * len(imports.max_span))
    refused = imports.refused
    tracemalloc.start()
    try:
        assert imports.take(1 << 30) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < (1 << 20) and imports.refused == refused + 1
    pages = imports.take(4096)                    # within the span: still imported
    assert pages is not None
    imports.give_back(pages)


def test_out_of_device_memory_then_usable(device):
    """Filling the heap raises DeviceError (asked vs available); freeing makes the device
    usable again."""
    held = []
    heap = device._ctx.tensor_heap
    # 256 MiB chunks on a CPU driver's 2 GiB heap; a GPU's 141 GiB in chunks of a 32nd
    chunk = min(max(256 << 20, heap.heap_size // 32), heap.max_alloc)
    with pytest.raises(DeviceError) as err:
        for _ in range(heap.heap_size // chunk + 8):
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
                pad_reference(x, [1, 2, 0, 3], [2, 0, 1, 1], mode))


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
            if not np.array_equal(got, pad_reference(x, [k % 3, 1], [1, k % 2], mode)):
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

"""The functional NumPy path (vkml/ops/functional.py) with host-memory imports
(runtime/memory.py ``HostImports``): from ``IMPORT_BYTES`` of inputs and outputs, on
devices whose tensors live in host memory, the kernel reads the caller's arrays and
writes the result's pages directly, without copies.

Which path a call took is read from the device's counters (``imported``: new imports,
``reused``: result pages taken from the pool, ``refused``: ranges that could not be
imported).  Results must be bit-identical to the copy path's on every driver.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import vkml
from vkml.ops import functional

from helpers import random_bits, run_in_threads, same_bits, slow

PAGE = 4096


def imports_of(device):
    imports = device._ctx.host_imports
    if imports is None:
        pytest.skip(f"{device.name} does not import host memory")
    return imports


def counts(imports) -> dict:
    s = imports.stats()
    return {k: s[k] for k in ("imported", "reused", "refused")}


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


def aligned(array: np.ndarray, offset: int = 0) -> np.ndarray:
    """A copy of ``array`` starting ``offset`` bytes after a page boundary."""
    raw = np.empty(array.nbytes + offset + 2 * PAGE, np.uint8)
    start = -raw.ctypes.data % PAGE + offset
    out = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def copy_path(monkeypatch, fn):
    """``fn()`` with the import path off (the copy-and-replay path)."""
    with monkeypatch.context() as m:
        m.setattr(functional, "IMPORT_BYTES", 1 << 62)
        return fn()


# Every operator's functional form on arrays large enough (inputs + outputs at least
# 2 MiB) to take the import path at the default threshold.
def _ops():
    rng = np.random.default_rng(7)

    def f32(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    return {
        "pad": ([f32(4, 256, 256)],
                lambda a, dev: vkml.pad(a[0], [0, 1, 2], [0, 2, 1], "reflection", device=dev)),
        "unfold": ([f32(1, 8, 128, 128)],
                   lambda a, dev: vkml.unfold(a[0], (2, 2), device=dev)),
        "fold": ([f32(1, 32, 127 * 127)],
                 lambda a, dev: vkml.fold(a[0], (128, 128), (2, 2), device=dev)),
        "lp_pooling": ([f32(1, 8, 256, 256)],
                       lambda a, dev: vkml.lp_pooling(a[0], (2, 2), strides=(2, 2), device=dev)),
        "convolution": ([f32(1, 16, 128, 128), f32(16, 16, 3, 3), f32(16)],
                        lambda a, dev: vkml.convolution(a[0], a[1], a[2], start_padding=(1, 1),
                                                        end_padding=(1, 1),
                                                        fused_activation="relu", device=dev)),
    }


OPS = _ops()


@pytest.mark.parametrize("op", list(OPS))
def test_every_operator_imports_and_matches_the_copy_path(device, monkeypatch, op):
    """Page-aligned inputs are imported on every driver (SwiftShader's binding alignment
    is 256); the result is written into imported pages; the bytes equal the copy path's."""
    imports = imports_of(device)
    arrays, fn = OPS[op]
    arrays = [aligned(a) for a in arrays]
    expect = copy_path(monkeypatch, lambda: fn(arrays, device))
    before = counts(imports)
    got = fn(arrays, device)
    d = delta(before, counts(imports))
    assert d["refused"] == 0 and d["imported"] >= len(arrays), d
    assert d["imported"] + d["reused"] == len(arrays) + 1, d
    assert got.flags.writeable and got.ctypes.data % PAGE == 0
    assert sum(a.nbytes for a in arrays) + got.nbytes >= functional.IMPORT_BYTES
    assert same_bits(got, expect)
    again = fn(arrays, device)             # the first result is alive: other pages
    assert not np.shares_memory(again, got) and same_bits(again, expect)


def test_ordinary_arrays(device):
    """Arrays as NumPy allocates them (16 bytes past a page for large ones): imported
    where the device's binding alignment allows (lavapipe: 16), copied where not
    (SwiftShader: 256); the result is imported either way."""
    imports = imports_of(device)
    x = np.random.default_rng(1).standard_normal((1, 8, 256, 256), dtype=np.float32)
    before = counts(imports)
    y = vkml.pad(x, [0, 0, 2, 2], [0, 0, 2, 2], "symmetric", device=device)
    d = delta(before, counts(imports))
    importable = x.ctypes.data % imports.alignment == 0
    assert d["refused"] == (0 if importable else 1), d
    assert d["imported"] + d["reused"] == (2 if importable else 1), d
    np.testing.assert_array_equal(y, np.pad(x, [(0, 0), (0, 0), (2, 2), (2, 2)], "symmetric"))


@pytest.mark.parametrize("offset", [4, 16, 64, 256, 260, 2048])
def test_misaligned_inputs_fall_back_to_a_copy(device, offset, monkeypatch):
    """An input starting ``offset`` bytes past a page (a slice of a larger array) is
    imported only where the offset meets the binding alignments; otherwise it is copied,
    with the same result."""
    imports = imports_of(device)
    rng = np.random.default_rng(offset)
    base = aligned(random_bits(rng, (1 << 20) // 4 + offset // 4, np.float32))
    x = base[offset // 4:].reshape(-1, 512)
    assert x.ctypes.data % PAGE == offset
    expect = copy_path(monkeypatch, lambda: vkml.pad(x, [1, 3], [2, 0], "wrap", device=device))
    before = counts(imports)
    y = vkml.pad(x, [1, 3], [2, 0], "wrap", device=device)
    d = delta(before, counts(imports))
    ok = offset % imports.alignment == 0
    assert d["refused"] == (0 if ok else 1), d
    assert d["imported"] + d["reused"] == (2 if ok else 1), d
    assert same_bits(y, expect)
    np.testing.assert_array_equal(y, np.pad(x, [(1, 2), (3, 0)], "wrap"))


def test_import_alignment_rule(device):
    """``fits``: the start must meet the binding alignments, and the range rounded to
    them and to the import alignment must stay in the pages the array touches."""
    imports = imports_of(device)
    a = imports.alignment
    page = imports.page
    assert imports.fits(1 << 30, 1 << 20)
    assert imports.fits((1 << 30) + a, page - a)          # ends exactly at a page end
    assert not imports.fits((1 << 30) + 4, 1 << 20)
    assert imports.fits((1 << 30) + a, 1)
    for nbytes in (1, 3, 4, 5, a - 1, a, a + 1, page):
        assert imports.fits(1 << 30, nbytes)


def test_non_contiguous_and_read_only_inputs(device):
    """A non-contiguous input is made contiguous (a new array, which is imported where
    aligned); read-only arrays and file mappings are copied, never imported."""
    imports = imports_of(device)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((256, 8, 512), dtype=np.float32).transpose(1, 0, 2)[:, ::2]
    assert not x.flags.c_contiguous
    y = vkml.pad(x, [0, 1, 1], [0, 1, 1], "edge", device=device)
    np.testing.assert_array_equal(y, np.pad(x, [(0, 0), (1, 1), (1, 1)], "edge"))

    ro = aligned(rng.standard_normal((4, 256, 256), dtype=np.float32))
    ro.setflags(write=False)
    before = counts(imports)
    y = vkml.pad(ro, [0, 1, 1], [0, 1, 1], device=device)
    d = delta(before, counts(imports))
    assert d["imported"] + d["reused"] == 1 and d["refused"] == 0, d      # the result only
    np.testing.assert_array_equal(y, np.pad(ro, [(0, 0), (1, 1), (1, 1)]))


def test_file_mapped_input_is_copied(device, tmp_path):
    imports = imports_of(device)
    x = np.random.default_rng(3).standard_normal((4, 256, 256), dtype=np.float32)
    m = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=x.dtype, shape=x.shape)
    m[...] = x
    before = counts(imports)
    y = vkml.pad(m, [0, 1, 1], [0, 1, 1], "reflection", device=device)
    d = delta(before, counts(imports))
    assert d["imported"] + d["reused"] == 1, d
    np.testing.assert_array_equal(y, np.pad(x, [(0, 0), (1, 1), (1, 1)], "reflect"))
    del m


def test_small_calls_keep_the_copy_path(device):
    imports = imports_of(device)
    x = np.ones((64, 64), np.float32)
    before = counts(imports)
    for _ in range(3):
        np.testing.assert_array_equal(vkml.pad(x, [1, 1], [1, 1], device=device), np.pad(x, 1))
    assert delta(before, counts(imports)) == {"imported": 0, "reused": 0, "refused": 0}


def test_threshold(device):
    """Calls below IMPORT_BYTES (inputs + outputs) copy; calls at or above it import."""
    imports = imports_of(device)
    half = functional.IMPORT_BYTES // 2
    below = aligned(np.zeros(half // 4 - 64, np.float32))       # + output < IMPORT_BYTES
    above = aligned(np.zeros(half // 4 + 64, np.float32))
    for x, taken in ((below, False), (above, True)):
        before = counts(imports)
        y = vkml.pad(x, [2], [2], device=device)
        d = delta(before, counts(imports))
        assert (d["imported"] + d["reused"] > 0) is taken, (x.nbytes, d)
        assert y.shape == (x.size + 4,) and not y.any()


def test_result_pages_are_reused_only_once_free(device):
    """A result's pages go back to the pool when the array and every view of it are
    gone, and only then; a reused buffer holds the new result."""
    imports = imports_of(device)
    rng = np.random.default_rng(4)
    x1 = rng.standard_normal((4, 256, 256), dtype=np.float32)
    x2 = rng.standard_normal((4, 256, 256), dtype=np.float32)
    pad = [0, 2, 2]

    def run(x):
        return vkml.pad(x, pad, pad, "reflection", device=device)

    y = run(x1)
    view = y[1:3, 5]
    kept = view.copy()
    del y
    gc.collect()
    before = counts(imports)
    z = run(x2)                                # the view still holds y's pages
    assert not np.shares_memory(z, view)
    np.testing.assert_array_equal(view, kept)
    del view, z
    gc.collect()
    for x in (x1, x2, x1):
        w = run(x)
        np.testing.assert_array_equal(w, np.pad(x, [(0, 0), (2, 2), (2, 2)], "reflect"))
        del w
    assert delta(before, counts(imports))["reused"] >= 3


def test_result_passed_back_in_is_not_imported_again(device):
    imports = imports_of(device)
    x = np.random.default_rng(5).standard_normal((8, 256, 256), dtype=np.float32)
    y = vkml.pad(x, [0, 1, 1], [0, 1, 1], "edge", device=device)
    before = counts(imports)
    z = vkml.pad(y, [0, 1, 1], [0, 1, 1], "edge", device=device)
    d = delta(before, counts(imports))
    assert d["imported"] + d["reused"] == 1 and d["refused"] == 0, d     # z only
    np.testing.assert_array_equal(z, np.pad(x, [(0, 0), (2, 2), (2, 2)], "edge"))


def test_results_outlive_the_device(device):
    """Closing the device releases every import (the validation layer reports any object
    left behind); the arrays it returned stay valid NumPy arrays."""
    x = np.random.default_rng(6).standard_normal((8, 256, 256), dtype=np.float32)
    with vkml.Device(device.index) as dev:
        imports_of(dev)
        y = vkml.pad(x, [0, 1, 1], [0, 1, 1], "wrap", device=dev)
        dropped = vkml.pad(x, [0, 2, 2], [0, 2, 2], device=dev)
        del dropped                            # idle in the pool at close
        gc.collect()
        assert dev._ctx.host_imports.stats()["live"] == 2
    np.testing.assert_array_equal(y, np.pad(x, [(0, 0), (1, 1), (1, 1)], "wrap"))
    y += 1
    del y
    gc.collect()


def test_driver_refusal_falls_back(device, monkeypatch):
    """Where the driver refuses the result's pages, the result is copied out."""
    imports = imports_of(device)
    x = aligned(np.random.default_rng(8).standard_normal((4, 256, 256), dtype=np.float32))
    monkeypatch.setattr(imports, "take", lambda nbytes: None)
    monkeypatch.setattr(imports, "allocate_at", lambda address, nbytes: None)
    y = vkml.pad(x, [0, 1, 1], [0, 1, 1], "symmetric", device=device)
    np.testing.assert_array_equal(y, np.pad(x, [(0, 0), (1, 1), (1, 1)], "symmetric"))


def test_imports_beyond_the_heap_are_refused(device, monkeypatch):
    """An import larger than its memory heap or maxMemoryAllocationSize is refused (and
    the call copies), as Vulkan requires of every allocation."""
    imports = imports_of(device)
    monkeypatch.setattr(imports, "max_span", [1 << 20] * len(imports.max_span))
    monkeypatch.setattr(imports, "idle_budget", 0)        # no pooled buffer to reuse
    gc.collect()
    imports.stats()
    x = aligned(np.random.default_rng(11).standard_normal((2, 512, 512), dtype=np.float32))
    before = counts(imports)
    y = vkml.pad(x, [0, 1, 1], [0, 1, 1], "wrap", device=device)
    assert delta(before, counts(imports)) == {"imported": 0, "reused": 0, "refused": 2}
    np.testing.assert_array_equal(y, np.pad(x, [(0, 0), (1, 1), (1, 1)], "wrap"))


def test_turned_off(device, monkeypatch):
    """disable_features=["host_import"], force_staging, VKML_FORCE_STAGING=1 and
    VKML_DISABLE_FEATURES=host_import all keep the copy path, with the same results."""
    x = np.random.default_rng(9).standard_normal((8, 256, 256), dtype=np.float32)
    expect = np.pad(x, [(0, 0), (3, 1), (2, 2)], "reflect")
    cases = [({"disable_features": ["host_import"]}, {}), ({"force_staging": True}, {}),
             ({}, {"VKML_FORCE_STAGING": "1"}), ({}, {"VKML_DISABLE_FEATURES": "host_import"})]
    for kwargs, env in cases:
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            dev = vkml.Device(device.index, **kwargs)
        with dev:
            assert dev._ctx.host_imports is None, (kwargs, env)
            np.testing.assert_array_equal(
                vkml.pad(x, [0, 3, 2], [0, 1, 2], "reflection", device=dev), expect)


def test_eight_threads_import_concurrently(device, monkeypatch):
    """8 threads calling large functional operators at once (each on its own shapes,
    and all on one shared shape): correct results; afterwards the only imports left are
    the pool's idle pages (and results held before)."""
    imports = imports_of(device)
    monkeypatch.setattr(functional, "IMPORT_BYTES", 64 << 10)
    gc.collect()
    s = imports.stats()
    held = s["live"] - s["idle"]            # results other tests still hold
    errors = []
    shared = np.random.default_rng(10).standard_normal((2, 128, 128), dtype=np.float32)
    shared_expect = np.pad(shared, [(0, 0), (1, 1), (1, 1)], "symmetric")

    def work(k):
        rng = np.random.default_rng(k)
        for i in range(10):
            x = rng.standard_normal((2, 96 + 8 * k, 128), dtype=np.float32)
            if i % 2:
                x = aligned(x)
            y = vkml.pad(x, [0, k % 3, 1], [0, 1, k % 2], "wrap", device=device)
            if not np.array_equal(y, np.pad(x, [(0, 0), (k % 3, 1), (1, k % 2)], "wrap")):
                errors.append((k, i, "own"))
            s = vkml.pad(shared, [0, 1, 1], [0, 1, 1], "symmetric", device=device)
            if not np.array_equal(s, shared_expect):
                errors.append((k, i, "shared"))

    threads = [threading.Thread(target=lambda k=k: _guard(work, k, errors)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors[:5]
    gc.collect()
    s = imports.stats()
    assert s["live"] - s["idle"] == held, s


def _guard(work, k, errors):
    try:
        work(k)
    except Exception as exc:  # noqa: BLE001
        errors.append((k, repr(exc)))


_LEAK_CHILD = r"""
import gc, json, sys
import numpy as np, psutil, vkml
from vkml.ops import functional
functional.IMPORT_BYTES = 0
dev = vkml.Device(int(sys.argv[1]))
imports = dev._ctx.host_imports
cycles = int(sys.argv[2])
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 256), dtype=np.float32)
raw = np.empty(x.nbytes + 8192, np.uint8)
xa = raw[-raw.ctypes.data % 4096:][:x.nbytes].view(np.float32).reshape(x.shape)
xa[...] = x
def cycle(i):
    y = vkml.pad(xa if i % 2 else x, [1, 2], [2, 1], "reflection", device=dev)
    z = vkml.unfold(y[None, None], (2, 2), device=dev)
    return y, z
for i in range(max(300, cycles // 10)):
    cycle(i)
gc.collect()
proc = psutil.Process()
rss0, mem0 = proc.memory_info().rss, dev.memory_stats()
keep = []
for i in range(cycles):
    out = cycle(i)
    if i % 97 == 0:
        keep.append(out)          # some results outlive their call
    if len(keep) > 5:
        keep.pop(0)
keep.clear()
del out
gc.collect()
rss1, mem1 = proc.memory_info().rss, dev.memory_stats()
s = imports.stats()
ok = bool(np.array_equal(cycle(0)[0], np.pad(x, [(1, 2), (2, 1)], "reflect")))
print(json.dumps({"rss_growth": rss1 - rss0, "mem0": mem0, "mem1": mem1, "ok": ok,
                  "stats": s}))
"""


def test_imports_do_not_leak(device, speed):
    """Thousands of import-path calls (results dropped at once or kept a while): host
    RSS and device memory flat after warm-up, and no imports left but the idle pool.
    Host growth under 8 MiB over 2,000 cycles (400 on a slow device: 20 KiB a call),
    far under the 64 KiB of pages an import kept per call would hold, and over the
    allocators' own steps (up to ~3 MiB on SwiftShader whatever the count)."""
    imports_of(device)
    cycles = int(os.environ.get("VKML_LEAK_CYCLES", 400 if slow(speed) else 2000))
    env = dict(os.environ, VKML_VALIDATION="0")
    out = subprocess.run([sys.executable, "-c", _LEAK_CHILD, str(device.index), str(cycles)],
                         capture_output=True, text=True, env=env, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["ok"]
    assert r["mem1"] == r["mem0"], (r["mem0"], r["mem1"])
    assert r["stats"]["live"] == r["stats"]["idle"], r["stats"]     # only the pool's pages
    assert r["stats"]["idle_bytes"] <= 16 << 20, r["stats"]
    grown = r["rss_growth"]
    assert grown < 8 << 20, f"host memory grew by {grown / 2**20:.1f} MiB over {cycles} cycles"


# -- prepared calls (functional.prepared): a repeated call skips validation ---------------

def _np_pad(x, start, end, mode, value=0.0):
    modes = {"constant": "constant", "edge": "edge", "reflection": "reflect",
             "symmetric": "symmetric", "wrap": "wrap"}
    kw = {"constant_values": value} if mode == "constant" else {}
    return np.pad(x, list(zip(start, end)), mode=modes[mode], **kw)


def test_prepared_call_is_reused_only_for_equal_arguments(device):
    """Every change the descriptor depends on (shape, dtype, strides of the input, padding
    counts, mode, the value's type and bits) misses the cache: results match numpy.pad,
    and each distinct call adds its own entry."""
    device.prepared_calls.clear()
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 4)).astype(np.float32)
    base = dict(start=[1, 1], end=[1, 1], mode="reflection", value=0.0)
    variants = [
        (x, base),
        (x, base),                                                   # a hit
        (x[:3], base),                                               # shape
        (x.astype(np.float64), base),                                # dtype
        (x.astype(np.int16), base),
        (x.T, base),                                                 # strides (a view)
        (x[::2, ::-1], base),
        (x, dict(base, start=[0, 1])),                               # counts
        (x, dict(base, end=(1, 2))),
        (x, dict(base, start=(1, 1))),                               # tuple, not list
        (x, dict(base, start=1, end=1)),                             # one integer
        (x, dict(base, mode="edge")),                                # mode
        (x, dict(base, mode="constant", value=2.5)),                 # value
        (x, dict(base, mode="constant", value=-0.0)),                # -0.0 is not 0.0
        (x, dict(base, mode="constant", value=0.0)),
        (x, dict(base, mode="constant", value=3)),                   # int, not float
        (x, dict(base, mode="constant", value=3.0)),
    ]
    for a, kw in variants:
        start, end = kw["start"], kw["end"]
        rank = a.ndim
        s = (start,) * rank if isinstance(start, int) else tuple(start)
        e = (end,) * rank if isinstance(end, int) else tuple(end)
        for _ in range(2):
            got = vkml.pad(a, start, end, kw["mode"], kw["value"], device=device)
            want = _np_pad(a, s, e, kw["mode"], kw["value"])
            assert got.dtype == a.dtype and got.shape == want.shape
            assert same_bits(got, want.astype(a.dtype)), (a.shape, a.dtype, kw)
    # 17 calls: the second repeats the first, and x.T is made contiguous first, so it is
    # a (4, 4) float32 input like x (its result above is still x.T's): 15 entries
    assert len(device.prepared_calls) == 15


def test_prepared_results_are_fresh_arrays(device):
    """A prepared call copies through views of its reusable I/O tensors: each result is
    a new array (the next call does not change it), for float and integer types."""
    for dtype in (np.float32, np.int16, np.float16):
        xs = [np.arange(12, dtype=dtype).reshape(3, 4) * k for k in (1, 2, 3)]
        got = [vkml.pad(x, [1, 0], [0, 2], "wrap", device=device) for x in xs]
        for x, g in zip(xs, got):
            np.testing.assert_array_equal(g, np.pad(x, [(1, 0), (0, 2)], "wrap"))
            assert g.flags.owndata and g.flags.writeable
        got[0][...] = 0
        np.testing.assert_array_equal(vkml.pad(xs[0], [1, 0], [0, 2], "wrap", device=device),
                                      np.pad(xs[0], [(1, 0), (0, 2)], "wrap"))


def test_prepared_call_keeps_every_check(device):
    """Bad arguments raise on every call, before and after a good call with the same
    input stored a prepared call, and store nothing."""
    device.prepared_calls.clear()
    x = np.ones((4, 4), np.float32)
    bad = [
        (([1], [1, 1], "reflection"), vkml.ValidationError),          # count
        (([1, -1], [1, 1], "reflection"), vkml.ValidationError),      # negative
        (([1.0, 1], [1, 1], "reflection"), TypeError),                # a float count
        (([True, 1], [1, 1], "reflection"), TypeError),               # a bool count
        (([1, 1], [1, 1], "bogus"), vkml.ValidationError),            # mode
        (([4, 4], [4, 4], "reflection"), None),                       # folds: fine
    ]
    for round_ in range(3):
        for args, error in bad:
            if error is None:
                vkml.pad(x, *args, device=device)
                continue
            with pytest.raises(error):
                vkml.pad(x, *args, device=device)
        if round_ == 0:
            vkml.pad(x, [1, 1], [1, 1], "reflection", device=device)
    assert len(device.prepared_calls) == 2
    with pytest.raises(vkml.ValidationError):     # a dtype DML lacks, same shape
        vkml.pad(x.astype(bool), [1, 1], [1, 1], "reflection", device=device)
    with pytest.raises(TypeError):                # unhashable / wrong-typed mode
        vkml.pad(x, [1, 1], [1, 1], ["reflection"], device=device)
    nan = vkml.pad(x, [1, 1], [1, 1], "constant", float("nan"), device=device)
    assert np.isnan(nan[0, 0]) and len(device.prepared_calls) == 2  # NaN: no key


def test_prepared_call_follows_released_operators(device, monkeypatch):
    """An entry whose compiled operator was released (evicted) is rebuilt; the cache off
    (PREPARED_MAX = 0) gives the same results; a closed device raises on a would-be hit."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    want = np.pad(x, 1, mode="reflect")
    assert same_bits(vkml.pad(x, [1, 1], [1, 1], "reflection", device=device), want)
    from vkml.ops.padding import _pad_key

    key = _pad_key(x, [1, 1], [1, 1], "reflection", 0.0)
    old = functional.prepared(device, key)
    assert old is not None
    with device._compiled_lock:                    # evict it as the LRU would
        for k, c in list(device._compiled.items()):
            if c is old.compiled:
                del device._compiled[k]
    old.compiled.release()
    assert functional.prepared(device, key) is None
    assert same_bits(vkml.pad(x, [1, 1], [1, 1], "reflection", device=device), want)
    assert functional.prepared(device, key).compiled is not old.compiled
    monkeypatch.setattr(functional, "PREPARED_MAX", 0)
    device.prepared_calls.clear()
    assert same_bits(vkml.pad(x, [1, 1], [1, 1], "reflection", device=device), want)
    assert not device.prepared_calls
    monkeypatch.undo()
    dev = vkml.Device(device.index)
    vkml.pad(x, [1, 1], [1, 1], "reflection", device=dev)
    assert dev.prepared_calls
    dev.close()
    with pytest.raises(vkml.DeviceError):
        vkml.pad(x, [1, 1], [1, 1], "reflection", device=dev)


def _prepared_entry(device, x, args):
    from vkml.ops.padding import _pad_key

    return functional.prepared(device, _pad_key(x, *args))


def test_prepared_call_replays_its_bound_copy(device):
    """A repeated tiny call takes the bound copy-and-replay (``functional._Replay``) on
    devices whose I/O tensors are host-visible; new values each call give their own
    results; a Tensor call of the same descriptor (which re-records the operator's
    command buffer for its own tensors) sends the next NumPy call back to the full path,
    which binds the replay again."""
    args = ([1, 1], [1, 1], "reflection", 0.0)
    xs = [np.arange(16, dtype=np.float32).reshape(4, 4) * k - k for k in range(6)]
    for x in xs:
        got = vkml.pad(x, *args, device=device)
        assert same_bits(got, np.pad(x, 1, mode="reflect"))
    entry = _prepared_entry(device, xs[0], args)
    replay = entry.replay
    assert replay is not None
    t = vkml.tensor(xs[2], device=device)
    assert same_bits(vkml.pad(t, *args).numpy(), np.pad(xs[2], 1, mode="reflect"))
    assert same_bits(vkml.pad(xs[3], *args, device=device), np.pad(xs[3], 1, mode="reflect"))
    again = _prepared_entry(device, xs[0], args).replay
    assert again is not None and again is not replay and again.token is not replay.token
    t.free()
    with vkml.Device(device.index, force_staging=True) as staged:   # views of staging
        for x in xs[:3]:
            assert same_bits(vkml.pad(x, *args, device=staged), np.pad(x, 1, mode="reflect"))
        replay = _prepared_entry(staged, xs[0], args).replay
        assert replay is not None and replay.token.transfers is not None


def test_replay_gives_way_to_a_busy_operator(device):
    """With the operator's I/O tensors or its recorded buffer in use by another thread
    (the locks held here), a prepared call runs on fresh tensors or a fresh sequence:
    the same results, and the replay still works afterwards."""
    args = ([0, 2], [1, 0], "symmetric", 0.0)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    want = np.pad(x, [(0, 1), (2, 0)], mode="symmetric")
    for _ in range(2):
        assert same_bits(vkml.pad(x, *args, device=device), want)
    compiled = _prepared_entry(device, x, args).compiled
    for lock in (compiled.io_lock, compiled._lock):
        with lock:
            for k in (1, 2):
                assert same_bits(vkml.pad(x * k, *args, device=device), want * k)
    assert same_bits(vkml.pad(x * 3, *args, device=device), want * 3)


def test_prepared_calls_from_threads(device):
    """Threads repeating one tiny padding with their own values each get their own
    results (the replay's I/O tensors are used by one call at a time)."""
    args = ([1, 0], [2, 1], "edge", 0.0)
    errors: list = []

    def work(seed: int) -> None:
        try:
            for i in range(40):
                x = np.full((3, 5), seed * 1000 + i, np.float32)
                x[0, 0] = -seed
                got = vkml.pad(x, *args, device=device)
                if not same_bits(got, np.pad(x, [(1, 2), (0, 1)], mode="edge")):
                    errors.append((seed, i))
        except Exception as exc:     # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]


# -- staged devices: a NumPy call is one submission (functional._host_views) -----------------

@pytest.fixture(scope="module")
def staged(device):
    """The device again with device-only tensors and staged transfers (a discrete GPU's
    memory), as ``VKML_FORCE_STAGING=1`` makes every device."""
    with vkml.Device(device.index, force_staging=True) as dev:
        yield dev


@pytest.fixture
def submissions(monkeypatch):
    """The number of submissions (``Sequence._submit_and_wait``) since it was made."""
    from vkml.runtime import scheduler

    count = [0]
    submit = scheduler.Sequence._submit_and_wait

    def counted(self, ctx):
        count[0] += 1
        return submit(self, ctx)

    monkeypatch.setattr(scheduler.Sequence, "_submit_and_wait", counted)
    return count


def _staged_calls(rng):
    """(name, arrays, call, reference): small calls of pad, an element-wise op, a
    multi-output op and an op with an optional input left out."""
    a = rng.standard_normal((6, 10), dtype=np.float32)
    b = rng.standard_normal((10,), dtype=np.float32)
    x = rng.integers(-9, 9, (3, 5)).astype(np.int16)
    return [
        ("pad", [x], lambda v, d: vkml.pad(v[0], [1, 0], [2, 3], "symmetric", device=d),
         lambda v: np.pad(v[0], [(1, 2), (0, 3)], "symmetric")),
        ("add", [a, b], lambda v, d: vkml.add(v[0], v[1], device=d), lambda v: v[0] + v[1]),
        ("split", [a], lambda v, d: vkml.split(v[0], 1, [3, 7], device=d),
         lambda v: [v[0][:, :3], v[0][:, 3:]]),
        ("gemm", [a, b.reshape(10, 1)], lambda v, d: vkml.gemm(v[0], v[1], device=d),
         lambda v: v[0] @ v[1]),
    ]


def _evict(dev, compiled) -> None:
    """Release ``compiled`` as the device's LRU of compiled operators would."""
    with dev._compiled_lock:
        for k, c in list(dev._compiled.items()):
            if c is compiled:
                del dev._compiled[k]
    compiled.release()


def _check(got, want) -> None:
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            _check(g, w)
        return
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["device", "staged"])
def test_numpy_call_is_one_submission(device, staged, submissions, kind):
    """A repeated NumPy call (new values each time) is one submission on any device:
    on a staged one its recorded command buffer copies the staging buffers in and out
    around the operator; results equal NumPy's for pad (prepared: the bound replay),
    element-wise add, split (two outputs) and gemm without C (an absent input)."""
    dev = device if kind == "device" else staged
    rng = np.random.default_rng(11)
    for name, arrays, call, reference in _staged_calls(rng):
        for i in range(3):
            values = [v * (i + 1) - i for v in arrays]
            before = submissions[0]
            _check(call(values, dev), reference(values))
            if i:
                assert submissions[0] - before == 1, (name, i, submissions[0] - before)


def test_staged_call_falls_back_and_frees_its_staging(staged, submissions):
    """The staging buffers live with the I/O set: another set of argument shapes for
    the same compiled operator (b as (7,) or (1, 7): one descriptor) frees the old
    set's, the operator's release frees them all, and neither leaves the staging heap
    or the device's memory grown; a released operator's next call is right again."""
    heap = staged.context.staging_heap
    rng = np.random.default_rng(12)
    a = rng.standard_normal((5, 7), dtype=np.float32)     # (shapes no other test adds)
    b = rng.standard_normal((7,), dtype=np.float32)
    gc.collect()
    used = heap.stats()["used"], staged.memory_stats()["used"]
    for i in range(6):
        bb = b if i % 2 else b.reshape(1, 7)
        before = submissions[0]
        _check(vkml.add(a, bb * i, device=staged), a + bb * i)
        assert i == 0 or submissions[0] - before == 1     # (the first builds the operator)
    compiled = [c for c in staged._compiled.values()
                if type(c.desc).__name__ == "ElementWiseAddOperatorDesc"
                and c.desc.output_tensor.sizes == (5, 7)]
    assert len(compiled) == 1 and compiled[0].io is not None
    assert len(compiled[0].io[4][3]) == 3          # staging: the current set's a, b, out
    _evict(staged, compiled[0])
    gc.collect()
    assert (heap.stats()["used"], staged.memory_stats()["used"]) == used
    _check(vkml.add(a, b, device=staged), a + b)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for i in range(3):
        _check(vkml.pad(x + i, [1, 1], [1, 1], "wrap", device=staged),
               np.pad(x + i, 1, mode="wrap"))
    entry = _prepared_entry(staged, x, ([1, 1], [1, 1], "wrap", 0.0))
    assert entry.replay is not None
    _evict(staged, entry.compiled)                 # the replay sees it and steps aside
    assert entry.replay([x]) is None
    _check(vkml.pad(x, [1, 1], [1, 1], "wrap", device=staged), np.pad(x, 1, mode="wrap"))


def test_staged_calls_from_threads_and_a_busy_operator(staged):
    """Two threads calling one staged padding (one waits for nothing: it takes fresh
    tensors and separate transfers while the other holds the I/O set), and calls while
    the I/O set or the recorded buffer is held: each gets its own right result."""
    args = ([2, 0], [0, 1], "reflection", 0.0)
    errors: list = []

    def work(k):
        for i in range(20):
            x = np.full((4, 3), 100 * k + i, np.float32)
            x[0, 0] = -k
            if not same_bits(vkml.pad(x, *args, device=staged),
                             np.pad(x, [(2, 0), (0, 1)], mode="reflect")):
                errors.append((k, i))

    run_in_threads(work, errors, count=2)
    assert not errors, errors[:5]
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    compiled = _prepared_entry(staged, x, args).compiled
    for lock in (compiled.io_lock, compiled._lock):
        with lock:
            assert same_bits(vkml.pad(x * 2, *args, device=staged),
                             np.pad(x * 2, [(2, 0), (0, 1)], mode="reflect"))
    assert same_bits(vkml.pad(x * 3, *args, device=staged),
                     np.pad(x * 3, [(2, 0), (0, 1)], mode="reflect"))


def test_staged_call_of_an_observed_operator(staged, monkeypatch):
    """An operator whose tuned path is re-checked by timed executions
    (``CompiledOperator.observed``) runs those with the staging copies in submissions of
    their own: the results stay right, and the tuner is told the time."""
    from vkml import tuning
    from vkml.ops import base

    told = []

    class Tuner:
        def observe(self, *args, **kwargs):
            told.append(args)

    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    args = ([0, 1], [1, 0], "edge", 0.0)
    vkml.pad(x, *args, device=staged)
    compiled = _prepared_entry(staged, x, args).compiled
    monkeypatch.setattr(tuning, "default_tuner", lambda: Tuner())
    monkeypatch.setattr(base, "OBSERVE_EVERY", 1)
    monkeypatch.setattr(compiled, "observed", ("key", "candidate", None, None))
    for i in range(3):
        assert same_bits(vkml.pad(x - i, *args, device=staged),
                         np.pad(x - i, [(0, 1), (1, 0)], mode="edge"))
    assert len(told) == 3


def test_staged_call_on_a_closed_device(device):
    x = np.ones((3, 3), np.float32)
    dev = vkml.Device(device.index, force_staging=True)
    for _ in range(2):
        vkml.pad(x, [1, 1], [1, 1], device=dev)
        vkml.add(x, x, device=dev)
    dev.close()
    with pytest.raises(vkml.DeviceError):
        vkml.pad(x, [1, 1], [1, 1], device=dev)
    with pytest.raises(vkml.DeviceError):
        vkml.add(x, x, device=dev)

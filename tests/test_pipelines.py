"""Pipeline creation on the compile threads (``vkml/runtime/pipelines.py``).

Many threads asking for the same and different kernel variants get one pipeline per key,
created once; operators compiled and run from many threads at once compute what NumPy
does; a failed ``vkCreateComputePipelines`` raises the same ``DeviceError`` from the call
that asked for the pipeline (a direct request, or the construction of the operator that
needs it), is not cached, and leaves the device usable; closing a device while its
pipelines compile ends cleanly.  Each case runs with the compile threads and with
``VKML_PIPELINE_THREADS=0`` (created on the calling thread), on a device of its own, so
that no other test's pipelines are in its cache.
"""
from __future__ import annotations

import random
import threading

import numpy as np
import pytest

import vkml
from vkml import DeviceError
from vkml.runtime import pipelines, vk

THREADS = 8
#: Kernel variants with constants no operator asks for (so none is cached by an earlier
#: request): the padding kernel's workgroup sizes and modes, and the activation kernel
#: with its ACT frozen into the module (``vkml:frozen`` in glsl/activation.comp).
KEYS = ([("padding_e4", {"LOCAL_SIZE_X": size, "MODE": mode})
         for size in (8, 24, 40) for mode in range(4)]
        + [("activation_f32_texel4", {"LOCAL_SIZE_X": 24, "ACT": act}) for act in (1, 2, 3)])


@pytest.fixture(params=["pool", "inline"])
def fresh(request, device, monkeypatch):
    """A device of its own (an empty in-process pipeline cache), with compile threads
    ("pool") or none ("inline")."""
    if request.param == "inline":
        monkeypatch.setenv("VKML_PIPELINE_THREADS", "0")
    else:
        monkeypatch.setenv("VKML_PIPELINE_THREADS", "2")
    dev = vkml.Device(device.index)
    yield dev
    dev.close()


def _in_threads(fn, count=THREADS):
    """Run ``fn(i)`` on ``count`` threads started together; re-raise the first error."""
    start = threading.Barrier(count)
    errors, results = [], [None] * count

    def body(i):
        try:
            start.wait()
            results[i] = fn(i)
        except BaseException as exc:   # noqa: BLE001  (re-raised below)
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def test_concurrent_requests_make_one_pipeline_per_key(fresh):
    """Eight threads ask for the same keys in different orders, half of them inside a
    batch (their requests return before the creation ends): each key gives one pipeline
    object, created once, with a handle, to every thread."""
    cache = fresh._ctx.pipelines
    before = cache.created

    def ask(i):
        order = KEYS * 2
        random.Random(i).shuffle(order)
        if i % 2:
            with cache.batch():
                got = [cache.variant(n, c) for n, c in order]
        else:
            got = [cache.variant(n, c) for n, c in order]
        return {(n, tuple(sorted(c.items()))): p for (n, c), p in zip(order, got)}

    results = _in_threads(ask)
    assert cache.created - before == len(KEYS)
    for key in results[0]:
        assert len({id(r[key]) for r in results}) == 1, key
        assert results[0][key].handle is not None
    assert not cache.inflight


def _reference(kind, x):
    return {"relu": lambda: np.maximum(x, 0), "sigmoid": lambda: 1 / (1 + np.exp(-x)),
            "tanh": lambda: np.tanh(x), "leaky_relu": lambda: np.where(x > 0, x, 0.01 * x)}[kind]()


def test_operators_compiled_in_threads_compute_as_numpy(fresh):
    """Threads compile and run activations and additions (a fused activation each) of
    drawn shapes at once; every result is NumPy's."""
    kinds = ["relu", "sigmoid", "tanh", "leaky_relu"]

    def work(i):
        rng = np.random.default_rng(i)
        for _ in range(3):
            shape = tuple(int(s) for s in rng.integers(1, 40, size=rng.integers(1, 4)))
            x = rng.standard_normal(shape).astype(np.float32)
            kind = kinds[int(rng.integers(len(kinds)))]
            y = vkml.activation(x, kind, device=fresh)
            np.testing.assert_allclose(y, _reference(kind, x), rtol=1e-5, atol=1e-6)
            b = rng.standard_normal(shape).astype(np.float32)
            z = vkml.add(x, b, fused_activation=kind, device=fresh)
            np.testing.assert_allclose(z, _reference(kind, x + b), rtol=1e-5, atol=1e-6)

    _in_threads(work, 4)


class _FailingLib:
    """``vkml.runtime.vk.lib`` whose ``vkCreateComputePipelines`` fails (host memory)."""

    def __init__(self, real):
        self._real = real
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self._real, name)

    def vkCreateComputePipelines(self, *args):
        self.calls += 1
        return vk.VK_ERROR_OUT_OF_HOST_MEMORY


def test_failed_creation_raises_where_it_was_asked_for(fresh, monkeypatch):
    """A failing creation raises ``DeviceError`` naming the call and kernel from a direct
    request and from the functional call whose operator needs it (its construction),
    is not cached: once the driver creates again, the same requests succeed and compute
    the right values."""
    cache = fresh._ctx.pipelines
    failing = _FailingLib(pipelines.lib)
    monkeypatch.setattr(pipelines, "lib", failing)
    name, consts = KEYS[0]
    message = (rf"vkCreateComputePipelines\({name}\) failed with "
               r"VK_ERROR_OUT_OF_HOST_MEMORY")
    with pytest.raises(DeviceError, match=message):
        cache.variant(name, consts)
    with pytest.raises(DeviceError, match=message):
        with cache.batch():
            pipe = cache.variant(name, consts)
            assert pipe.name == name
    x = np.linspace(-2, 2, 37, dtype=np.float32)
    with pytest.raises(DeviceError, match=r"vkCreateComputePipelines\(\w+\) failed with "
                                          r"VK_ERROR_OUT_OF_HOST_MEMORY"):
        vkml.activation(x, "tanh", device=fresh)
    assert failing.calls >= 3 and not cache.inflight
    monkeypatch.setattr(pipelines, "lib", failing._real)
    assert cache.variant(name, consts).handle is not None
    np.testing.assert_allclose(vkml.activation(x, "tanh", device=fresh), np.tanh(x),
                               rtol=1e-5, atol=1e-6)


def test_a_failure_a_reader_saw_is_not_raised_again_by_the_batch(fresh, monkeypatch):
    """The tuner records a candidate inside a graph's construction and declines it when
    its pipeline fails (reading the handle raised): the batch does not raise that one
    again, but does raise one nobody read."""
    cache = fresh._ctx.pipelines
    monkeypatch.setattr(pipelines, "lib", _FailingLib(pipelines.lib))
    with cache.batch():
        seen = cache.variant(*KEYS[1])
        with pytest.raises(DeviceError):
            seen.handle
    with pytest.raises(DeviceError, match=r"vkCreateComputePipelines\(padding_e4\)"):
        with cache.batch():
            cache.variant(*KEYS[2])


def test_prefetched_pipelines_belong_to_no_batch(fresh, monkeypatch):
    """The tuner asks for every candidate's pipelines before recording the first
    (``prefetching``): they compile at once, the enclosing batch neither waits for them
    nor raises a failed one, which reaches whoever uses that pipeline; one that succeeds
    is the same pipeline a later request gets."""
    cache = fresh._ctx.pipelines
    monkeypatch.setattr(pipelines, "lib", _FailingLib(pipelines.lib))
    with cache.batch():
        with cache.prefetching():
            failed = cache.variant(*KEYS[3])
            assert failed.name == KEYS[3][0]
    with pytest.raises(DeviceError, match=r"vkCreateComputePipelines\(padding_e4\)"):
        failed.handle
    with pytest.raises(DeviceError, match=r"vkCreateComputePipelines\(padding_e4\)"):
        with cache.batch():
            cache.variant(*KEYS[3])
    monkeypatch.setattr(pipelines, "lib", pipelines.lib._real)
    with cache.batch():
        with cache.prefetching():
            made = cache.variant(*KEYS[4])
        assert cache.variant(*KEYS[4]) is made
    assert made.handle is not None


def test_close_while_pipelines_compile(fresh):
    """The device closes while its pipelines are queued or compiling: those created
    are destroyed with it (the validation layer sees no leak), the others raise
    ``DeviceError``; a new device on the same index works."""
    cache = fresh._ctx.pipelines
    got = []
    try:
        with cache.batch():
            got = [cache.variant(n, c) for n, c in KEYS]
            fresh.close()
    except DeviceError as exc:          # (not when all were created before the close)
        assert "closed" in str(exc)
    assert len(got) == len(KEYS)
    for p in got:
        try:
            assert p.handle is not None
        except DeviceError as exc:
            assert "closed" in str(exc)
    with vkml.Device(fresh.info.index) as again:
        np.testing.assert_array_equal(vkml.activation(np.array([-1.0, 2.0], np.float32),
                                                      "relu", device=again), [0, 2])


def test_timed_runs_wait_for_compiles_in_flight(fresh):
    """A timed sequence (the tuner's) runs once no creation of its device is in flight:
    on a CPU device they would share its cores."""
    cache = fresh._ctx.pipelines
    x = fresh.tensor(np.zeros(64, np.float32))
    with cache.batch():
        for n, c in KEYS:
            cache.variant(n, c)
        with fresh.sequence(timed=True) as seq:
            seq.fill(x._alloc, 0, 256, 0)
            seq.run()
        assert not cache.inflight

"""Closing a device that other threads use (vkml/runtime/lifetime.py).

Worker threads call an operator in a loop while the main thread closes the device.
Every worker must end with ``DeviceError`` (or finish its calls first), ``close()`` must
return within seconds, nothing may crash, and a new device opened afterwards must give
the same results as before.  Before the guard these runs hung in ``vkWaitForFences``,
crashed (SIGSEGV, heap corruption on SwiftShader) or raised ``AttributeError``; they run
in a child process (this file run as a script) so a crash fails the test instead of
killing pytest.  Using a closed device's tensors, compiled operators and sequences
raises ``DeviceError``; releasing them is a no-op.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time

if __name__ == "__main__":     # the child: report validation messages last of all, after
    import atexit             # vkml closed its devices at exit (atexit runs in reverse order)

    def _report_validation():
        from vkml import runtime
        for level, text in runtime.validation_messages:
            print(f"vkml-validation [{level}] {text[:2000]}", file=sys.stderr, flush=True)
    atexit.register(_report_validation)

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vkml
from vkml import dml
from vkml.errors import DeviceError

OPS = ("pad", "fold", "unfold", "convolution", "lp_pooling", "tensors", "sequence")
# Hang guards, not speed checks (speed is the bench's): close() waits only for the calls
# already inside Vulkan (milliseconds each), so a close() or a worker still busy after
# these is stuck, whatever the load on a shared 2-core machine with the layer on.
CLOSE_LIMIT_S = 30.0      # close() returns within this once calls in flight finish
JOIN_LIMIT_S = 30.0       # a worker not done this long after close() is a hang


# -- the child process -----------------------------------------------------------------
def _inputs():
    rng = np.random.default_rng(7)
    return {"x": rng.standard_normal((1, 2, 10, 10)).astype(np.float32),
            "w": rng.standard_normal((3, 2, 3, 3)).astype(np.float32),
            "cols": rng.standard_normal((1, 18, 16)).astype(np.float32),
            "img": rng.standard_normal((1, 2, 6, 6)).astype(np.float32)}


def _call(op: str, dev, data: dict) -> np.ndarray:
    """One call of ``op`` on ``dev`` (NumPy in, NumPy out, except the Tensor kinds)."""
    x = data["x"]
    if op == "pad":
        return vkml.pad(x, [0, 0, 1, 2], [0, 0, 2, 1], mode="edge", device=dev)
    if op == "fold":
        return vkml.fold(data["cols"], (6, 6), (3, 3), device=dev)
    if op == "unfold":
        return vkml.unfold(data["img"], (3, 3), device=dev)
    if op == "convolution":
        return vkml.convolution(x, data["w"], device=dev)
    if op == "lp_pooling":
        return vkml.lp_pooling(x, (2, 2), strides=(2, 2), device=dev)
    if op == "tensors":
        t = dev.tensor(x)
        u = vkml.pad(t, [0, 0, 1, 1], [0, 0, 1, 1], mode="reflection")
        out = u.numpy()
        t.free()
        return out
    raise ValueError(op)


def _padding_op(dev, x):
    desc = dml.PaddingOperatorDesc(dml.TensorDesc("float32", x.shape),
                                   dml.TensorDesc("float32", (1, 2, 12, 12)), "wrap", 0.0,
                                   (0, 0, 1, 1), (0, 0, 1, 1))
    return dev.compile_operator(dev.create_operator(desc))


def _sequence_reference(dev, x) -> np.ndarray:
    compiled = _padding_op(dev, x)
    xt, yt = dev.tensor(x), dev.empty((1, 2, 12, 12))
    with dev.sequence() as seq:
        compiled.record(seq, [xt], [yt])
        seq.run()
    compiled.release()
    return yt.numpy()


def _scenario(index: int, op: str, threads: int, delay: float, calls: int, data: dict,
              expected: np.ndarray) -> dict:
    """Workers call ``op`` ``calls`` times each (a sequence worker replays a shared
    sequence or records its own); the main thread closes the device after ``delay``."""
    dev = vkml.Device(index)
    outcome: list = []
    shared = {}
    if op == "sequence":
        x = data["x"]
        compiled = _padding_op(dev, x)
        xt, yt = dev.tensor(x), dev.empty((1, 2, 12, 12))
        seq = dev.sequence()
        compiled.record(seq, [xt], [yt])
        shared.update(compiled=compiled, xt=xt, yt=yt, seq=seq)

    def work(k: int):
        try:
            for _ in range(calls):
                if op != "sequence":
                    _call(op, dev, data)
                elif k % 2:
                    shared["seq"].run()
                else:
                    with dev.sequence() as own:
                        shared["compiled"].record(own, [shared["xt"]], [shared["yt"]])
                        own.run()
            outcome.append("finished")
        except DeviceError:
            outcome.append("DeviceError")
        except BaseException as exc:  # noqa: BLE001 - any other end is the failure
            outcome.append(f"{type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(threads)]
    for t in workers:
        t.start()
    time.sleep(delay)
    t0 = time.perf_counter()
    dev.close()
    close_s = time.perf_counter() - t0
    for t in workers:
        t.join(JOIN_LIMIT_S)
    hung = sum(t.is_alive() for t in workers)
    # the closed device's objects refuse cleanly; releasing them is a no-op
    refused = []
    if op == "sequence":
        for what, fn in (("run", shared["seq"].run), ("numpy", shared["yt"].numpy),
                         ("execute", lambda: shared["compiled"].execute([shared["xt"]],
                                                                        [shared["yt"]]))):
            try:
                fn()
                refused.append(f"{what} did not raise")
            except DeviceError:
                pass
        shared["seq"].close()
        shared["compiled"].release()
        shared["xt"].free()
    # a new device works and agrees with the result taken before
    with vkml.Device(index) as again:
        got = (_sequence_reference(again, data["x"]) if op == "sequence"
               else _call(op, again, data))
    return {"op": op, "threads": threads, "close_s": close_s, "hung": hung,
            "outcome": sorted(outcome), "refused": refused,
            "agrees": bool(np.array_equal(got, expected))}


def _child_scenarios(index: int, cases: list) -> None:
    data = _inputs()
    expected = {}
    with vkml.Device(index) as dev:
        for op in {c[0] for c in cases}:
            expected[op] = (_sequence_reference(dev, data["x"]) if op == "sequence"
                            else _call(op, dev, data))
    for op, threads, delay, calls in cases:
        print(json.dumps(_scenario(index, op, threads, delay, calls, data, expected[op])),
              flush=True)


def _child_gc(index: int, threads: int) -> None:
    """Threads hold the only references to a device: collecting garbage while they run
    changes nothing; the process then exits with them still running (the device is
    closed at exit while they call it)."""
    data = _inputs()
    counts = [0] * threads
    errors: list = []

    def work(dev, k):
        try:
            while True:
                _call("pad", dev, data)
                counts[k] += 1
        except DeviceError:
            pass
        except BaseException as exc:  # noqa: BLE001
            errors.append(repr(exc))

    dev = vkml.Device(index)
    for k in range(threads):
        threading.Thread(target=work, args=(dev, k), daemon=True).start()
    del dev
    deadline = time.monotonic() + 30
    while min(counts) < 3 and time.monotonic() < deadline and not errors:
        gc.collect()
        time.sleep(0.02)
    print(json.dumps({"counts": counts, "errors": errors}), flush=True)
    # exit now: atexit closes the device under the running threads


if __name__ == "__main__":
    import faulthandler

    faulthandler.enable()
    faulthandler.dump_traceback_later(100, exit=True)
    if sys.argv[1] == "gc":
        _child_gc(int(sys.argv[2]), int(sys.argv[3]))
    else:
        _child_scenarios(int(sys.argv[2]), json.loads(sys.argv[3]))
    sys.exit(0)


# -- the tests ------------------------------------------------------------------------
def _run_child(*args: str) -> list[dict]:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         timeout=240, cwd=os.path.dirname(os.path.dirname(__file__)),
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0, (f"child ended with {out.returncode}:\n{out.stdout}\n"
                                 f"{out.stderr[-4000:]}")
    assert "vkml-validation" not in out.stderr, out.stderr[-4000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _check(results: list[dict], cases: list) -> None:
    assert len(results) == len(cases), results
    for r in results:
        assert r["hung"] == 0, r
        assert set(r["outcome"]) <= {"DeviceError", "finished"}, r
        assert len(r["outcome"]) == r["threads"], r
        assert r["close_s"] < CLOSE_LIMIT_S, r
        assert not r["refused"], r
        assert r["agrees"], r


def test_close_under_running_threads_every_operator(device):
    """The reproduction of the issue for every operator, Tensors and a Sequence: four
    workers calling without end, close() after 0.1 s."""
    cases = [[op, 4, 0.1, 10 ** 9] for op in OPS]
    results = _run_child("run", str(device.index), json.dumps(cases))
    _check(results, cases)
    for r in results:     # calls never end by themselves: close() must have ended them
        assert r["outcome"] == ["DeviceError"] * 4, r


@pytest.mark.floor(ran=3)
@settings(max_examples=3, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=st.lists(st.tuples(st.sampled_from(OPS), st.integers(1, 6),
                                st.floats(0.0, 0.25), st.integers(1, 40)),
                      min_size=2, max_size=3))
def test_close_under_running_threads_drawn(device, drawn, cases):
    """Drawn operators, thread counts, close delays and call counts (some workers finish
    before the close, some are cut off by it, some never start a call)."""
    drawn = [list(c) for c in drawn]
    _check(_run_child("run", str(device.index), json.dumps(drawn)), drawn)
    cases.add("ran")


def test_garbage_collected_device_held_by_threads(device):
    threads = 3
    [result] = _run_child("gc", str(device.index), str(threads))
    assert not result["errors"], result
    assert min(result["counts"]) >= 3, result


def test_closed_device_objects_refuse_and_release_quietly(device):
    """Tensors, compiled operators and sequences of a closed device: using them raises
    DeviceError (never a crash or another error); releasing them does nothing."""
    x = np.ones((1, 1, 4, 4), np.float32)
    dev = vkml.Device(device.index)
    t = dev.tensor(x)
    y = dev.empty((1, 1, 6, 6))
    compiled = _padding_op_small(dev)
    seq = dev.sequence()
    compiled.record(seq, [t], [y])
    seq.run()
    fresh = dev.sequence()                      # recorded into after the close
    dev.close()
    for call in (t.numpy, lambda: t.write(x), y.read_bytes, seq.run,
                 lambda: compiled.execute([t], [y]), lambda: compiled.record(fresh, [t], [y]),
                 lambda: fresh.copy(t._alloc, y._alloc, [(0, 0, 4)]), dev.sequence,
                 lambda: dev.tensor(x), lambda: vkml.pad(t, [0, 0, 1, 1], [0, 0, 1, 1]),
                 lambda: vkml.pad(x, [0, 0, 1, 1], [0, 0, 1, 1], device=dev),
                 lambda: dev.create_operator(compiled.desc)):
        with pytest.raises(DeviceError):
            call()
    for release in (seq.close, fresh.close, compiled.release, t.free, y.free, dev.close,
                    dev.synchronize):
        release()
    dev.memory_stats()
    with vkml.Device(device.index) as again:
        np.testing.assert_array_equal(vkml.pad(x, [0, 0, 1, 1], [0, 0, 1, 1], device=again),
                                      np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))))


def _in_four_threads(action) -> tuple[list, list]:
    """Run ``action()`` in four threads at once and join them (JOIN_LIMIT_S each); returns
    the threads and the repr of every exception they raised."""
    errors: list = []

    def guarded():
        try:
            action()
        except BaseException as exc:  # noqa: BLE001
            errors.append(repr(exc))

    ts = [threading.Thread(target=guarded) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(JOIN_LIMIT_S)
    return ts, errors


def _padding_op_small(dev):
    desc = dml.PaddingOperatorDesc(dml.TensorDesc("float32", (1, 1, 4, 4)),
                                   dml.TensorDesc("float32", (1, 1, 6, 6)), "constant", 0.0,
                                   (0, 0, 1, 1), (0, 0, 1, 1))
    return dev.compile_operator(dev.create_operator(desc))


def test_concurrent_close_calls(device):
    """Several threads closing one device: one destroys it, the others return once it
    is gone; none raises."""
    dev = vkml.Device(device.index)
    vkml.pad(np.ones((3, 3), np.float32), [1, 1], [1, 1], device=dev)
    ts, errors = _in_four_threads(dev.close)
    assert not errors and not any(t.is_alive() for t in ts)
    assert dev._ctx.lifetime.closed


def test_first_run_of_one_sequence_from_several_threads(device):
    """Threads making the first ``run()`` of one recorded sequence at once end it once:
    ``end()`` decides ``ended`` under the pool lock (tested outside it, two threads both
    recorded the final barrier and ``vkEndCommandBuffer``, the second on an executable
    buffer: VUID-vkEndCommandBuffer-commandBuffer-00059, seen by the close tests above).
    Recording into a sequence another thread ended raises DeviceError."""
    from vkml import runtime
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    compiled = _padding_op_small(device)
    xt, yt = device.tensor(x), device.empty((1, 1, 6, 6))
    before = len(runtime.validation_messages)
    for _ in range(10):
        seq = device.sequence()
        compiled.record(seq, [xt], [yt])
        start = threading.Barrier(4)

        def first_run():
            start.wait()
            seq.run()

        _, errors = _in_four_threads(first_run)
        assert not errors and seq.ended
        with pytest.raises(DeviceError):
            seq.barrier()
        seq.close()
    assert runtime.validation_messages[before:] == []
    np.testing.assert_array_equal(yt.numpy(), np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))))
    compiled.release()

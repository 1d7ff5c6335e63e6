"""GPU waits: ``VKML_TIMEOUT``, and the allowance a first run gets for pipelines a driver
compiles at their first dispatch (``VKML_FIRST_USE_TIMEOUT``, runtime/scheduler.py).

The integration tests run a child process with a wait limit far below what the work
takes (``VKML_TIMEOUT`` of a millisecond, work of about ten, its pads repeated as the
device's speed asks): with a large per-first-use allowance the first run completes and
its replay, which dispatches no new pipeline, times out; with the allowance 0 the first
run times out, naming the wait.  Lavapipe's shader cache is disabled in the child, so it
really compiles at the first dispatch.  The child's uploads and checks wait the default
(on a discrete GPU they are submissions too); the short limit holds for the runs alone.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from vkml.runtime import scheduler
from vkml.runtime.context import Context

TIMEOUT_S = 0.001
#: rows and columns of each padded tensor
SIDE = 1536
#: device seconds of the child's sequence: ten times ``TIMEOUT_S``, by the ``speed``
#: fixture; at least MIN_REPS rounds of the pads, since a loaded machine's ``speed`` can
#: read tens of times a quiet run's (lavapipe: 10 ms against 0.3 for its 1M floats), and
#: the child's quiet replay of one round then finished within the timeout
WORK_S = 0.01
MIN_REPS = 4


# -- the rule -------------------------------------------------------------------------
def test_wait_limit_adds_an_allowance_per_first_use_pipeline():
    assert scheduler.wait_limit_s(0, 120.0, 10.0) == 120.0
    assert scheduler.wait_limit_s(1, 120.0, 10.0) == 130.0
    assert scheduler.wait_limit_s(70, 120.0, 5.0) == 470.0
    assert scheduler.wait_limit_s(3, 0.05, 0.0) == 0.05
    assert scheduler.wait_limit_s(-1, 2.0, 10.0) == 2.0      # never shortened
    assert scheduler.wait_limit_s(2, 2.0, -1.0) == 2.0
    rng = np.random.default_rng(7)
    for _ in range(50):
        n, t, per = int(rng.integers(0, 200)), float(rng.uniform(0, 300)), float(rng.uniform(0, 30))
        assert scheduler.wait_limit_s(n, t, per) == pytest.approx(t + n * per)
    assert scheduler.wait_limit_s(4) == pytest.approx(
        scheduler.TIMEOUT_S + 4 * scheduler.FIRST_USE_S)


def test_describe_wait_names_the_settings():
    text = scheduler.describe_wait(0)
    assert "VKML_TIMEOUT" in text and "VKML_FIRST_USE_TIMEOUT" not in text
    text = scheduler.describe_wait(3)
    assert "VKML_TIMEOUT" in text and "3 first-use pipeline(s)" in text
    assert "VKML_FIRST_USE_TIMEOUT" in text


def test_default_allowance_covers_a_slow_first_run():
    """efficientnet_b1 (about 70 pipelines) took 86 s for its first run on a loaded
    2-CPU machine with an empty Mesa cache, and passed 120 s under more load: the
    default limit of such a first run leaves room for several times that."""
    if "VKML_TIMEOUT" in os.environ or "VKML_FIRST_USE_TIMEOUT" in os.environ:
        pytest.skip("the defaults are overridden in this environment")
    assert scheduler.wait_limit_s(70) >= 4 * 120


def test_close_waits_for_a_first_run_in_flight(device):
    """A close waits for calls in flight as long as their waits were allowed."""
    from vkml.runtime.lifetime import CLOSE_MARGIN_S, CLOSE_WAIT_S

    ctx: Context = device._ctx
    kept = ctx._waits_until               # (earlier first runs of the session's device)
    try:
        ctx._waits_until = 0.0
        assert ctx.close_wait_s() == CLOSE_WAIT_S
        ctx.expect_wait(1.0)              # shorter than VKML_TIMEOUT: the default holds
        assert ctx.close_wait_s() == CLOSE_WAIT_S
        ctx.expect_wait(CLOSE_WAIT_S + 500.0)
        assert CLOSE_WAIT_S + 499.0 + CLOSE_MARGIN_S <= ctx.close_wait_s() \
            <= CLOSE_WAIT_S + 500.0 + CLOSE_MARGIN_S
        ctx.expect_wait(2.0)              # a shorter wait begun later extends nothing
        assert ctx.close_wait_s() >= CLOSE_WAIT_S + 499.0 + CLOSE_MARGIN_S
    finally:
        ctx._waits_until = kept


def test_replays_wait_the_plain_timeout(device):
    """A sequence's first run allows for its new pipelines once; its replays and a
    second sequence of the same pipelines wait ``VKML_TIMEOUT`` alone."""
    from vkml import dml

    desc = dml.PaddingOperatorDesc(dml.TensorDesc("float16", (5, 7)),
                                   dml.TensorDesc("float16", (9, 9)), "reflection", 0.0,
                                   (1, 2), (3, 0))
    op = device.compile_operator(device.create_operator(desc))
    x = device.tensor(np.ones((5, 7), np.float16))
    y = device.empty((9, 9), "float16")
    for _ in range(2):
        with device.sequence() as seq:
            op.record(seq, [x], [y])
            seq.run()
            assert seq._timeout_ns == scheduler.TIMEOUT_NS and not seq._fresh
            seq.run()
            assert seq._timeout_ns == scheduler.TIMEOUT_NS
    op.release()


# -- a first run in a child process ---------------------------------------------------
def _limit(seconds: float) -> None:
    """``VKML_TIMEOUT`` from here on in this process (the module's values)."""
    scheduler.TIMEOUT_S, scheduler.TIMEOUT_NS = seconds, int(seconds * 1e9)


def _child(index: int, reps: int, per_first_use_s: float) -> None:
    import vkml
    from vkml import dml
    from vkml.errors import DeviceError

    default = scheduler.TIMEOUT_S
    scheduler.FIRST_USE_S = per_first_use_s
    dev = vkml.Device(index)
    ops, ins, outs = [], [], []
    for mode, dtype in (("reflection", "float32"), ("edge", "float16"), ("wrap", "float32")):
        shape = (SIDE, SIDE)
        out = (SIDE + 2, SIDE + 2)
        desc = dml.PaddingOperatorDesc(dml.TensorDesc(dtype, shape), dml.TensorDesc(dtype, out),
                                       mode, 0.0, (1, 1), (1, 1))
        ops.append(dev.compile_operator(dev.create_operator(desc)))
        ins.append(dev.tensor(np.ones(shape, dtype)))
        outs.append(dev.empty(out, dtype))
    _limit(TIMEOUT_S)
    seq = dev.sequence()
    for _ in range(reps):
        for op, x, y in zip(ops, ins, outs):
            op.record(seq, [x], [y])
    result = {"first_use": len(seq._fresh)}
    for name in ("first", "replay"):
        t = time.perf_counter()
        try:
            seq.run()
            result[name] = "ran"
        except DeviceError as e:
            result[name] = str(e)
        result[name + "_s"] = time.perf_counter() - t
        if result[name] != "ran":
            break
        _limit(default)
        result["agrees"] = all(bool(np.all(y.numpy() == 1)) for y in outs)
        _limit(TIMEOUT_S)
    _limit(default)
    t = time.perf_counter()
    dev.close()                        # a device considered lost still closes
    result["close_s"] = time.perf_counter() - t
    with vkml.Device(index) as again:  # and a new one works
        result["again"] = float(again.tensor(np.full(3, 2.0, np.float32)).numpy().sum())
    print(json.dumps(result))


def _spawn(index: int, *args, timeout: float = 120, **env_vars) -> dict:
    """Run this file's child ``args`` on device ``index`` (no tuning, no cache files,
    ``env_vars`` added to the environment); the JSON it printed last."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), VKML_TUNE="off",
               VKML_CACHE_DIR="off", **env_vars)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-m", "tests.test_timeout", str(index),
                          *map(str, args)], capture_output=True, text=True, timeout=timeout,
                         cwd=root, env=env)
    assert out.returncode == 0, f"child ended with {out.returncode}:\n{out.stderr[-4000:]}"
    assert "vkml-validation" not in out.stderr, out.stderr[-4000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, out.stdout[-2000:]
    return json.loads(lines[-1])


def _run_child(device, speed: float, per_first_use_s: float) -> dict:
    """The first-run child's result; ``speed``: the ``speed`` fixture (seconds a pad of
    1M floats takes), which sizes the work to :data:`WORK_S`."""
    reps = max(MIN_REPS, math.ceil(WORK_S / (3 * speed * SIDE * SIDE / 2**20)))
    return _spawn(device.index, reps, per_first_use_s, timeout=240,
                  MESA_SHADER_CACHE_DISABLE="true")


def test_first_run_gets_the_first_use_allowance(device, speed):
    r = _run_child(device, speed, 120.0)
    assert r["first_use"] >= 2, r
    assert r["first"] == "ran" and r["agrees"], r
    # the replay dispatches no new pipeline: VKML_TIMEOUT alone, which the work exceeds
    assert "timed out" in r["replay"] and "VKML_TIMEOUT" in r["replay"], r
    assert "VKML_FIRST_USE_TIMEOUT" not in r["replay"], r
    assert r["again"] == 6.0, r


def test_without_the_allowance_the_first_run_times_out(device, speed):
    r = _run_child(device, speed, 0.0)
    assert r["first_use"] >= 2, r
    assert "waiting for the GPU" in r["first"] and "timed out" in r["first"], r
    assert "VKML_TIMEOUT" in r["first"] and "first-use pipeline(s)" in r["first"], r
    assert r["again"] == 6.0, r


def _hung_submission(dev):
    """A sequence whose submission waits for an event the host has not set, and the
    event (``VkEvent*``)."""
    from vkml.runtime import vk

    ctx = dev._ctx
    event = vk.ffi.new("VkEvent*")
    vk.check(vk.lib.vkCreateEvent(ctx.device, vk.ffi.new("VkEventCreateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_EVENT_CREATE_INFO}), vk.NULL, event), "vkCreateEvent")
    x = dev.tensor(np.ones(64, np.float32))
    y = dev.empty((64,))
    seq = dev.sequence()
    with seq.pool.lock:
        vk.lib.vkCmdWaitEvents(seq.cmd, 1, event, vk.VK_PIPELINE_STAGE_HOST_BIT,
                               vk.VK_PIPELINE_STAGE_TRANSFER_BIT, 0, vk.NULL,
                               0, vk.NULL, 0, vk.NULL)
    seq.copy(x._alloc, y._alloc, [(0, 0, 256)])
    return seq, event


def _child_hang(index: int) -> None:
    """A device whose submission hangs: the wait times out, ``synchronize`` returns
    after ``VKML_TIMEOUT``, a new device works while the hang lasts; once the hang ends
    the lost device closes."""
    import vkml
    from vkml.errors import DeviceError
    from vkml.runtime import vk

    dev = vkml.Device(index)
    handle = dev._ctx.device
    seq, event = _hung_submission(dev)
    result = {}
    t = time.perf_counter()
    try:
        seq.run()
        result["run"] = "ran"
    except DeviceError as e:
        result["run"] = str(e)
    result["run_s"] = time.perf_counter() - t
    t = time.perf_counter()
    dev.synchronize()
    result["synchronize_s"] = time.perf_counter() - t
    with vkml.Device(index) as again:
        result["again"] = float(again.tensor(np.full(3, 2.0, np.float32)).numpy().sum())
    vk.lib.vkSetEvent(handle, event[0])     # the hang ends
    dev.synchronize()
    vk.lib.vkDestroyEvent(handle, event[0], vk.NULL)
    t = time.perf_counter()
    dev.close()
    result["close_s"] = time.perf_counter() - t
    result["destroyed"] = dev._ctx.device is None
    print(json.dumps(result))


def test_synchronize_of_a_hung_device_returns(device):
    r = _spawn(device.index, "hang", VKML_TIMEOUT="0.5")
    assert "timed out" in r["run"] and 0.5 <= r["run_s"] < 20, r
    assert 0.5 <= r["synchronize_s"] < 20 and r["close_s"] < 20 and r["destroyed"], r
    assert r["again"] == 6.0, r


def _child_staged(index: int) -> None:
    """A staged upload (``VKML_FORCE_STAGING``) whose wait times out: its staging buffer
    and tensor may still be read by the copy, so nothing is freed before ``close``,
    which waits for the device; the close does not crash and a new device works."""
    import vkml
    from vkml.errors import DeviceError

    dev = vkml.Device(index)
    result = {}
    _limit(1e-5)
    try:
        dev.tensor(np.ones(16 << 20, np.float32))      # dropped at once: freed, were it not lost
        result["upload"] = "ran"
    except DeviceError as e:
        result["upload"] = str(e)
    _limit(120.0)
    dev.close()
    result["closed"] = dev._ctx.device is None
    with vkml.Device(index) as again:
        result["again"] = float(again.tensor(np.full(3, 2.0, np.float32)).numpy().sum())
    print(json.dumps(result))


def test_a_timed_out_staged_upload_frees_nothing_before_close(device):
    r = _spawn(device.index, "staged", VKML_FORCE_STAGING="1")
    assert "timed out" in r["upload"], r
    assert r["closed"] and r["again"] == 6.0, r


if __name__ == "__main__":
    import faulthandler

    faulthandler.enable()
    faulthandler.dump_traceback_later(100, exit=True)
    if sys.argv[2:] == ["hang"]:
        _child_hang(int(sys.argv[1]))
    elif sys.argv[2:] == ["staged"]:
        _child_staged(int(sys.argv[1]))
    else:
        _child(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))


# -- a real hang: a submission waiting for an event nobody sets -----------------------
def test_a_hang_is_caught_after_the_allowance(device, monkeypatch):
    """A command buffer that waits for an event the host has not set hangs its
    submission: the wait ends with ``DeviceError`` naming the wait once ``VKML_TIMEOUT``
    and the first-use allowance of its new pipelines are spent, not before; the device
    is lost, and it still closes once the work can finish; a new device works."""
    import vkml
    from vkml import dml
    from vkml.errors import DeviceError
    from vkml.runtime import vk

    timeout_s, per_s = 0.3, 0.2
    monkeypatch.setattr(scheduler, "TIMEOUT_S", timeout_s)
    monkeypatch.setattr(scheduler, "TIMEOUT_NS", int(timeout_s * 1e9))
    monkeypatch.setattr(scheduler, "FIRST_USE_S", per_s)
    dev = vkml.Device(device.index)
    ctx = dev._ctx
    event = vk.ffi.new("VkEvent*")
    vk.check(vk.lib.vkCreateEvent(ctx.device, vk.ffi.new("VkEventCreateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_EVENT_CREATE_INFO}), vk.NULL, event), "vkCreateEvent")
    # should the wait never time out, the "hang" ends after a minute and the test fails
    rescue = threading.Timer(60.0, vk.lib.vkSetEvent, (ctx.device, event[0]))
    rescue.start()
    try:
        desc = dml.PaddingOperatorDesc(dml.TensorDesc("float32", (6, 5)),
                                       dml.TensorDesc("float32", (8, 7)), "edge", 0.0,
                                       (1, 1), (1, 1))
        op = dev.compile_operator(dev.create_operator(desc))
        x, y = dev.tensor(np.ones((6, 5), np.float32)), dev.empty((8, 7))
        seq = dev.sequence()
        with seq.pool.lock:
            vk.lib.vkCmdWaitEvents(seq.cmd, 1, event, vk.VK_PIPELINE_STAGE_HOST_BIT,
                                   vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, vk.NULL,
                                   0, vk.NULL, 0, vk.NULL)
        op.record(seq, [x], [y])
        n = len(seq._fresh)
        assert n >= 1
        t = time.perf_counter()
        with pytest.raises(DeviceError, match="timed out") as err:
            seq.run()
        took = time.perf_counter() - t
        assert f"{n} first-use pipeline(s)" in str(err.value) and "VKML_TIMEOUT" in str(err.value)
        assert timeout_s + n * per_s - 0.01 <= took < timeout_s + n * per_s + 30, took
        with pytest.raises(DeviceError, match="lost"):
            dev.tensor(np.ones(3, np.float32))
    finally:
        rescue.cancel()
        vk.lib.vkSetEvent(ctx.device, event[0])     # the "hang" ends: the queue drains
        ctx.wait_idle()
        vk.lib.vkDestroyEvent(ctx.device, event[0], vk.NULL)
        t = time.perf_counter()
        dev.close()
        assert time.perf_counter() - t < 30
    with vkml.Device(device.index) as again:
        assert float(again.tensor(np.full(3, 2.0, np.float32)).numpy().sum()) == 6.0

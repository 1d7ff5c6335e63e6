"""Command sequences: batching, replay, barriers, timestamps, descriptors (runtime/scheduler.py)."""
from __future__ import annotations

import time

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.errors import DeviceError


def _pad_op(device, shape, start, end, mode="constant", dtype="float32"):
    out = [s + a + b for s, a, b in zip(shape, start, end)]
    desc = dml.PaddingOperatorDesc(dml.TensorDesc(dtype, shape), dml.TensorDesc(dtype, out),
                                   mode, 1.0, start, end)
    return device.compile_operator(device.create_operator(desc)), out


def test_dependent_operators_in_one_sequence(device):
    """pad -> pad -> pad recorded once: each reads what the previous wrote (the scheduler
    inserts the barriers), submitted once, replayed after new input."""
    a, s1 = _pad_op(device, (4, 5), (1, 0), (0, 2), "reflection")
    b, s2 = _pad_op(device, s1, (0, 3), (2, 0), "wrap")
    c, s3 = _pad_op(device, s2, (1, 1), (1, 1), "edge")
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    t0 = device.tensor(x)
    t1, t2, t3 = device.empty(s1), device.empty(s2), device.empty(s3)
    seq = device.sequence()
    a.record(seq, [t0], [t1])
    b.record(seq, [t1], [t2])
    c.record(seq, [t2], [t3])

    def expect(v):
        v = np.pad(v, [(1, 0), (0, 2)], "reflect")
        v = np.pad(v, [(0, 2), (3, 0)], "wrap")
        return np.pad(v, 1, "edge")

    seq.run()
    np.testing.assert_array_equal(t3.numpy(), expect(x))
    t0.write(x * 3)                 # new input, same command buffer
    seq.run()
    np.testing.assert_array_equal(t3.numpy(), expect(x * 3))
    seq.close()
    for op in (a, b, c):
        op.release()


def test_many_operators_batched(device):
    op, out = _pad_op(device, (3, 3), (1, 1), (1, 1), "symmetric")
    x = device.tensor(np.arange(9, dtype=np.float32).reshape(3, 3))
    outs = [device.empty(out) for _ in range(300)]   # more sets than one descriptor pool holds
    with device.sequence() as seq:
        for o in outs:
            op.record(seq, [x], [o])
        seq.run()
        seq.run()
    expect = np.pad(np.arange(9, dtype=np.float32).reshape(3, 3), 1, "symmetric")
    for o in outs[::37]:
        np.testing.assert_array_equal(o.numpy(), expect)
    op.release()


def test_descriptor_pools_without_push_descriptors(device):
    """Devices without VK_KHR_push_descriptor get descriptor sets from pools grown on demand."""
    with vkml.Device(device.index, disable_features=["push_descriptor"]) as dev:
        assert dev._ctx.push_descriptor is None
        op, out = _pad_op(dev, (2, 2), (1, 0), (0, 1), "edge")
        x = dev.tensor(np.ones((2, 2), np.float32))
        ys = [dev.empty(out) for _ in range(600)]
        with dev.sequence() as seq:
            for y in ys:
                op.record(seq, [x], [y])
            seq.run()
        assert len(dev._ctx.descriptor_pools.pools) >= 2
        np.testing.assert_array_equal(ys[-1].numpy(), np.ones((3, 3), np.float32))
        op.release()


def test_gpu_timestamps(device):
    if not device.features["timestamps"]:
        pytest.skip("no timestamps on this device")
    op, out = _pad_op(device, (64, 64), (2, 2), (2, 2))
    x, y = device.tensor(np.ones((64, 64), np.float32)), device.empty(out)
    with device.sequence(timed=True) as seq:
        op.record(seq, [x], [y])
        seq.run()
        assert seq.gpu_time_ns is not None and seq.gpu_time_ns > 0
    op.release()


def test_submitted_sequence_refuses_more_commands(device):
    op, out = _pad_op(device, (2,), (1,), (1,))
    x, y = device.tensor(np.ones(2, np.float32)), device.empty(out)
    seq = device.sequence()
    op.record(seq, [x], [y])
    seq.run()
    with pytest.raises(DeviceError, match="already submitted"):
        op.record(seq, [x], [y])
    seq.close()
    with pytest.raises(DeviceError, match="closed"):
        seq.run()
    op.release()


def test_freed_tensor_is_refused_on_replay(device):
    op, out = _pad_op(device, (2,), (1,), (1,))
    x, y = device.tensor(np.ones(2, np.float32)), device.empty(out)
    seq = device.sequence()
    op.record(seq, [x], [y])
    seq.run()
    op.release()
    with pytest.raises(DeviceError):
        seq.run()
    seq.close()


def test_execute_replays_and_rerecords(device):
    """execute() replays its command buffer for the same tensors, records anew for others."""
    op, out = _pad_op(device, (3,), (1,), (2,), "wrap")
    x1, x2 = device.tensor(np.arange(3, dtype=np.float32)), device.tensor(np.ones(3, np.float32))
    y = device.empty(out)
    op.execute([x1], [y])
    first = op._cache.seq
    op.execute([x1], [y])
    assert op._cache.seq is first
    op.execute([x2], [y])
    assert op._cache.seq is not first
    np.testing.assert_array_equal(y.numpy(), np.pad(np.ones(3, np.float32), (1, 2), "wrap"))
    op.release()


def test_execute_with_the_same_tensor_objects(device):
    """The very Tensor objects of the last execute() replay without a new binding check,
    read the data they hold now, and a freed or different one still gets the check."""
    from vkml.errors import ValidationError
    op, out = _pad_op(device, (3,), (1,), (2,), "wrap")
    x, y = device.tensor(np.arange(3, dtype=np.float32)), device.empty(out)
    op.execute([x], [y])
    first = op._cache.seq
    x.write(np.array([5, 6, 7], np.float32))
    op.execute([x], [y])
    assert op._cache.seq is first
    np.testing.assert_array_equal(y.numpy(), np.pad(np.array([5, 6, 7], np.float32), (1, 2), "wrap"))
    same_alloc = vkml.Tensor(device, (3,), np.float32, x.allocation, x.nbytes, owner=False)
    op.execute([same_alloc], [y])              # another object, same buffer: replayed
    assert op._cache.seq is first
    with pytest.raises(ValidationError, match="inputs"):
        op.execute([x, x], [y])                # one input too many: checked
    x.free()
    with pytest.raises(ValidationError, match="freed"):
        op.execute([x], [y])
    with pytest.raises(ValidationError, match="freed"):
        op.execute([same_alloc], [y])
    op.release()


def test_pipeline_cache_is_saved(tmp_path, monkeypatch, device):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    with vkml.Device(device.index) as dev:
        vkml.pad(np.ones(3, np.float32), [1], [1], "symmetric", device=dev)
    files = list(tmp_path.glob("*.bin"))
    assert files and files[0].stat().st_size >= 32
    header = files[0].read_bytes()[:32]
    assert int.from_bytes(header[8:12], "little") == device.info.vendor_id
    # a second device reads it back (and a corrupt file is ignored, not trusted)
    files[0].write_bytes(b"\0" * 64)
    with vkml.Device(device.index) as dev:
        np.testing.assert_array_equal(vkml.pad(np.ones(3, np.float32), [1], [1], device=dev),
                                      [0, 1, 1, 1, 0])


def test_copy_array_in_chunks(device):
    """Many copy regions (recorded as several vkCmdCopyBuffer of COPY_CHUNK regions), in a
    scattered order, then a kernel reading the result: every region lands."""
    from vkml.runtime import scheduler

    n = scheduler.COPY_CHUNK * 3 + 17
    rng = np.random.default_rng(5)
    src_data = rng.integers(0, 2**31, n * 4, dtype=np.int32)
    perm = rng.permutation(n)
    regions = np.stack([perm * 16, np.arange(n) * 16, np.full(n, 16)], axis=1)
    src, dst = device.tensor(src_data), device.empty((n * 4,), np.int32)
    op, out = _pad_op(device, (n * 4,), (1,), (1,), dtype="int32")
    padded = device.empty(tuple(out), np.int32)
    with device.sequence() as seq:
        seq.copy_array(src._alloc, dst._alloc, regions)
        op.record(seq, [dst], [padded])
        seq.run()
    expect = src_data.reshape(n, 4)[perm].reshape(-1)
    np.testing.assert_array_equal(dst.numpy(), expect)
    np.testing.assert_array_equal(padded.numpy()[1:-1], expect)
    op.release()


def test_closed_sequences_lend_their_command_buffer_and_fence(device):
    """A closed sequence's command buffer and fence go back to the command pool (reset,
    unsignalled) and the next sequence takes them; a sequence closed after a run still
    gives back an unsignalled fence; the pool keeps at most ``SPARES``; closing the
    device destroys the kept ones (the validation layer names any left alive)."""
    with vkml.Device(device.index) as dev:
        ctx = dev.context
        pool = ctx.command_pool()
        # the uploads first: on a staged device each is a sequence of its own, and its
        # pair is kept; the sequences below take every kept pair
        x = dev.tensor(np.arange(16, dtype=np.float32))
        compiled, _ = _pad_op(dev, (16,), [1], [1])
        y = dev.empty((18,), "float32")
        seqs = [dev.sequence() for _ in range(pool.SPARES + 2)]
        assert not pool.spares
        pairs = [(s._cmd_ptr[0], s._fence[0]) for s in seqs]
        compiled.record(seqs[0], [x], [y])
        seqs[0].run()
        for s in seqs:
            s.close()
        assert len(pool.spares) == pool.SPARES
        kept = {(c[0], f[0]) for c, f in pool.spares}
        assert kept <= set(pairs)
        again = dev.sequence()
        assert (again._cmd_ptr[0], again._fence[0]) in kept
        compiled.record(again, [x], [y])
        again.run()
        again.run()
        np.testing.assert_array_equal(y.numpy()[1:-1], np.arange(16, dtype=np.float32))
        again.close()
        compiled.release()


@pytest.mark.parametrize("took", [0.0, 1e-4, 1.0])
def test_waits_that_poll_the_tail(device, took):
    """``WAIT_TAIL_S`` (a GPU's long runs: sleep, then poll the last stretch): whatever
    the previous run's time says, every replay waits for its commands to finish."""
    from vkml.runtime import scheduler

    op, out = _pad_op(device, (64, 64), (3, 2), (1, 4), "reflection")
    x = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)
    tx, ty = device.tensor(x), device.empty(out)
    with device.sequence() as seq:
        for _ in range(40):
            op.record(seq, [tx], [ty])
        seq._spin = 0.0
        for k in range(3):
            seq._tail, seq._took = 20e-6, took      # (lavapipe computes on the host: off)
            tx.write(x * k)
            seq.run()
            np.testing.assert_array_equal(ty.numpy(), np.pad(x * k, [(3, 1), (2, 4)],
                                                             "reflect"))
    assert scheduler.WAIT_TAIL_S >= 0
    op.release()


def test_a_tail_wait_ends_by_the_submissions_timeout(device, monkeypatch):
    """A replay after a slow run sleeps for about that run's length before it polls
    (``WAIT_TAIL_S``), but its whole wait ends by its own timeout: a submission that
    never finishes (the fence waits stubbed to time out, its status to read not ready)
    fails after its 50 ms timeout, not after the previous run's 10 s, and no fence
    wait is asked for longer than that timeout.  (Its own device: the timeout loses it.)"""
    from vkml.runtime import scheduler

    asked = []

    def wait(dev, n, fences, wait_all, timeout_ns):
        asked.append(timeout_ns)
        time.sleep(timeout_ns * 1e-9)
        return scheduler.vk.VK_TIMEOUT

    with vkml.Device(device.index) as dev:
        op, out = _pad_op(dev, (4,), (1,), (1,))
        tx, ty = dev.tensor(np.ones(4, np.float32)), dev.empty(out)
        seq = dev.sequence()
        op.record(seq, [tx], [ty])
        seq.run()
        seq._spin, seq._tail, seq._took = 0.0, 1e-3, 10.0
        seq._timeout_ns = int(0.05e9)
        monkeypatch.setattr(scheduler, "_wait_fences", wait)
        monkeypatch.setattr(scheduler, "_fence_status", lambda *_: scheduler._NOT_READY)
        t = time.perf_counter()
        with pytest.raises(DeviceError, match="timed out"):
            seq.run()
        took = time.perf_counter() - t
        monkeypatch.undo()
        assert took < 1.0 and asked and max(asked) <= 0.05e9


def test_rebind_when_a_new_allocation_has_an_old_ones_id(device):
    """``Sequence.rebind`` moves each slot to its own new allocation even where a new
    allocation's id is the id another moved slot was keyed by (CPython gives a new
    object the address of a freed one): every old key leaves before a new one enters."""
    op, out = _pad_op(device, (2,), (1,), (1,))
    x, y = device.tensor(np.ones(2, np.float32)), device.empty(out)
    seq = device.context.sequence(hold=False)       # (a held one is never rebound)
    op.record(seq, [x], [y])
    sx, sy = seq._slots[id(x.allocation)], seq._slots[id(y.allocation)]
    x2, y2 = device.tensor(np.ones(2, np.float32)), device.empty(out)
    # key y's slot by x2's id, as if x2 had taken the address of y's freed allocation
    seq._slots[id(x2.allocation)] = seq._slots.pop(id(y.allocation))
    seq.rebind([(id(x.allocation), x2.allocation), (id(x2.allocation), y2.allocation)])
    assert seq._allocs[sx]() is x2.allocation and seq._allocs[sy]() is y2.allocation
    assert seq._slots[id(x2.allocation)] == sx and seq._slots[id(y2.allocation)] == sy
    seq.close()
    op.release()

"""``CompiledOperator.execute``'s replays of Tensor-in/Tensor-out calls.

A fresh result that takes the range its dropped predecessor gave back replays the
recording moved to it (``vkml.ops.base._rebound``), and ``y = op(...)`` in a loop, whose
results alternate between two ranges, replays the kept spare; these tests check the
results against NumPy on every call, that the recordings are replayed (counted), that a
recording which bound buffer views of a freed tensor is recorded again, and threads.
"""
from __future__ import annotations

import numpy as np
import pytest

import vkml
from vkml.runtime import scheduler

from helpers import run_in_threads


@pytest.fixture
def recordings(monkeypatch):
    """The number of sequences recorded since the fixture was made (a list of one)."""
    count = [0]
    create = scheduler.Sequence._create

    def counted(self, *args, **kwargs):
        count[0] += 1
        return create(self, *args, **kwargs)

    monkeypatch.setattr(scheduler.Sequence, "_create", counted)
    return count


def _padded(x):
    return np.pad(x, [(0, 0), (1, 2), (2, 1)])


def test_dropped_results_are_replayed(device, recordings):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 7)).astype(np.float32)
    xt = vkml.tensor(x, device=device)
    np.testing.assert_array_equal(vkml.pad(xt, [0, 1, 2], [0, 2, 1]).numpy(), _padded(x))
    start = recordings[0]
    for _ in range(6):
        x = rng.standard_normal((2, 5, 7)).astype(np.float32)
        xt.write(x)
        np.testing.assert_array_equal(vkml.pad(xt, [0, 1, 2], [0, 2, 1]).numpy(), _padded(x))
    # each check's .numpy() records its own transfer on staged devices; the pads none
    staged = xt.allocation.host is None
    assert recordings[0] - start <= (12 if staged else 0)


def test_y_equals_op_loop_replays_two_recordings(device, recordings):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 4)).astype(np.float32)
    xt = vkml.tensor(x, device=device)
    # the first call builds the operator (on a staged device its parameter upload is a
    # recording of its own) and records; the loop adds one, for the result kept meanwhile
    y = vkml.pad(xt, [0, 1, 2], [0, 2, 1])
    start = recordings[0]
    for i in range(8):
        y = vkml.pad(xt, [0, 1, 2], [0, 2, 1])
    assert recordings[0] - start <= 1
    np.testing.assert_array_equal(y.numpy(), _padded(x))
    kept = []
    for i in range(4):                      # every result kept: a recording per call
        x = rng.standard_normal((3, 4, 4)).astype(np.float32)
        xt.write(x)
        kept.append((x, vkml.pad(xt, [0, 1, 2], [0, 2, 1])))
    for x, y in kept:
        np.testing.assert_array_equal(y.numpy(), _padded(x))


def test_fresh_inputs_and_sizes(device):
    """Inputs made and dropped on every call (element-wise reads may bind buffer views of
    them: never moved) and results of another size in the freed range."""
    rng = np.random.default_rng(2)
    for n in (64, 64, 48, 64, 80, 64):
        a = rng.standard_normal((n,)).astype(np.float32)
        b = rng.standard_normal((n,)).astype(np.float32)
        got = vkml.add(vkml.tensor(a, device=device), vkml.tensor(b, device=device))
        np.testing.assert_array_equal(got.numpy(), a + b)
        x = rng.standard_normal((2, n // 16, 4)).astype(np.float32)
        got = vkml.pad(vkml.tensor(x, device=device), [0, 1, 2], [0, 2, 1])
        np.testing.assert_array_equal(got.numpy(), _padded(x))


def test_threads_share_a_compiled_operator(device):
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((2, 5, 7)).astype(np.float32) for _ in range(4)]
    ts = [vkml.tensor(x, device=device) for x in xs]
    errors = []

    def worker(k):
        y = None
        for _ in range(20):
            y = vkml.pad(ts[k], [0, 1, 2], [0, 2, 1])
            np.testing.assert_array_equal(y.numpy(), _padded(xs[k]))

    run_in_threads(worker, errors, count=4)
    assert not errors, errors[0]


def test_compiled_graph_with_fresh_outputs(device, recordings):
    """``CompiledGraph.execute`` (vkml.dml) into a new output tensor on every call."""
    from vkml import dml

    td = dml.TensorDesc(dml.DataType.FLOAT32, (2, 3, 4, 5))
    graph = dml.GraphDesc(
        input_count=1, output_count=1,
        nodes=[dml.OperatorGraphNodeDesc(dml.ActivationReluOperatorDesc(td, td)),
               dml.OperatorGraphNodeDesc(dml.ElementWiseIdentityOperatorDesc(
                   td, td, dml.ScaleBias(2.0, 1.0)))],
        input_edges=[dml.InputGraphEdgeDesc(0, 0, 0)],
        output_edges=[dml.OutputGraphEdgeDesc(1, 0, 0)],
        intermediate_edges=[dml.IntermediateGraphEdgeDesc(0, 0, 1, 0)])
    compiled = device.compile_graph(graph, fuse=False)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    tx = device.tensor(x)
    start = None
    for i in range(6):
        x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
        tx.write(x)
        y = device.empty((2, 3, 4, 5))
        compiled.execute([tx], [y])
        np.testing.assert_allclose(y.numpy(), np.maximum(x, 0) * 2 + 1, rtol=1e-6)
        del y
        if i == 1:
            start = recordings[0]
    staged = tx.allocation.host is None
    assert recordings[0] - start <= (8 if staged else 0)
    compiled.release()


def test_a_recording_with_a_freed_buffer_is_not_moved(device):
    """A recording may be moved to a fresh result only while every other buffer it
    bound still holds its memory: an allocation freed while its object lives on (a
    re-planned operator's old parameters, say) makes it unmovable, as ``run`` would
    refuse it."""
    import gc

    from vkml.ops import base

    xt = vkml.tensor(np.ones((2, 5, 7), np.float32), device=device)
    y = vkml.pad(xt, [0, 1, 2], [0, 2, 1])
    (seq,) = [o._cache.seq for o in gc.get_objects() if isinstance(o, base.CompiledOperator)
              and o._cache is not None
              and any(r() is y.allocation for r in o._cache.seq._allocs)]
    moved = [id(y.allocation)]
    assert seq.rebindable(moved)
    other = next(r() for r in seq._allocs if r() not in (xt.allocation, y.allocation))
    other.free()
    assert not seq.rebindable(moved)

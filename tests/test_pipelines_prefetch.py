"""Pipeline prefetch lists (``vkml/runtime/pipelines.py``: ``Recording``,
``PipelineCache.replay``; ``vkml.onnx.prepare``).

A recording lists the kernel variants asked for outside ``unrecorded`` (the tuner's
candidates), in order, once each, and saves them under its key only where they changed;
a later device replaying the key has those pipelines compiling before anything asks, and
a request gets the same pipeline.  The file is input: a corrupt, oversized or hostile
one (unknown variants or constants, workgroups or subgroup sizes the device does not
take) is skipped without an error or an invalid pipeline (the validation layers would
report one), and the next save writes a valid file.  Through ``vkml.onnx``: a second
preparation of a model, tuned in the first, compiles exactly the listed pipelines (the
first compiled the tuner's candidates too) and computes the same outputs.
"""
from __future__ import annotations

import contextlib
import json
import math

import numpy as np
import pytest

import vkml
from vkml import tuning
from vkml.ops.convolution import choice as conv_choice
from vkml.runtime import cache, pipelines

#: Kernel variants no operator of these tests asks for.
KEYS = [("padding_e4", {"LOCAL_SIZE_X": size, "MODE": mode})
        for size in (8, 24, 40) for mode in range(2)]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("VKML_PIPELINE_THREADS", "2")
    return tmp_path


def _lists(info) -> dict:
    found = cache.read_json(pipelines.prefetch_file(info), pipelines.PREFETCH_VERSION,
                            pipelines._valid_prefetch)
    return {} if found is None else {k: v for k, v in found["lists"]}


def _names(dev) -> set:
    """(variant, sorted constants by id) of every pipeline the device holds."""
    return {(k[0], k[3]) for k in dev._ctx.pipelines.pipelines}


def test_recording_lists_requests_in_order_once_and_replays_them(device, folder):
    dev = vkml.Device(device.index)
    try:
        pc = dev._ctx.pipelines
        rec = pc.replay("k")
        assert rec.before == []
        for name, consts in KEYS[:3] + KEYS[:2]:
            pc.variant(name, consts)
        with pc.unrecorded():
            pc.variant(*KEYS[3])
        rec.save()
        pc.variant(*KEYS[4])                    # (after the save: not recorded)
        made = _names(dev)
    finally:
        dev.close()
    assert _lists(device.info) == {"k": [[n, c, 0] for n, c in KEYS[:3]]}
    again = vkml.Device(device.index)
    try:
        pc = again._ctx.pipelines
        rec = pc.replay("k")
        assert len(pc.pipelines) == 3 and _names(again) < made
        held = list(pc.pipelines.values())
        assert [pc.variant(n, c) for n, c in KEYS[:3]] == held
        assert all(p.handle is not None for p in held)
        before = pipelines.prefetch_file(device.info).stat().st_mtime_ns
        rec.save()                             # the same list: not written again
        assert pipelines.prefetch_file(device.info).stat().st_mtime_ns == before
        assert pc.replay("other").before == []
    finally:
        again.close()


def test_requests_from_many_threads_are_recorded_once_each(device, folder):
    """Eight threads ask for the same variants in different orders while a recording is
    open (the tuner's thread-local ``unrecorded`` on one of them): each is listed once."""
    import random
    import threading
    dev = vkml.Device(device.index)
    try:
        pc = dev._ctx.pipelines
        rec = pc.replay("k")
        start = threading.Barrier(8)

        def body(i):
            keys = KEYS[:5]
            random.Random(i).shuffle(keys)
            start.wait()
            with pc.unrecorded() if i == 0 else contextlib.nullcontext():
                for name, consts in keys + [KEYS[5]] * (i == 0):
                    pc.variant(name, consts)
        threads = [threading.Thread(target=body, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rec.save()
    finally:
        dev.close()
    (saved,) = _lists(device.info).values()
    assert sorted(map(json.dumps, saved)) == sorted(json.dumps([n, c, 0]) for n, c in KEYS[:5])


def test_a_list_keeps_the_most_recent_keys(device, folder):
    dev = vkml.Device(device.index)
    try:
        pc = dev._ctx.pipelines
        for i in range(pipelines.PREFETCH_KEYS + 2):
            rec = pc.replay(f"k{i}")
            pc.variant(*KEYS[i % len(KEYS)])
            rec.save()
    finally:
        dev.close()
    keys = list(_lists(device.info))
    assert keys == [f"k{i}" for i in range(2, pipelines.PREFETCH_KEYS + 2)]


HOSTILE = [
    ["no_such_kernel", {}, 0],
    ["padding_e4", {"NO_SUCH_CONSTANT": 1}, 0],
    ["padding_e4", {"LOCAL_SIZE_X": 1 << 20, "MODE": 0}, 0],
    ["padding_e4", {"LOCAL_SIZE_X": 0, "MODE": 0}, 0],
    ["padding_e4", {"LOCAL_SIZE_X": 8.0, "MODE": 0}, 0],
    ["padding_e4", {"LOCAL_SIZE_X": 64, "MODE": 0}, 3],
    ["padding_e4", {"LOCAL_SIZE_X": 48, "MODE": 0}, 1 << 9],
]


@pytest.mark.parametrize("text", [
    b"", b"{", b"[]", b"\xff" * 100, json.dumps({"version": 99, "lists": []}).encode(),
    json.dumps({"version": 1, "lists": [["k", [["padding_e4", {"MODE": None}, 0]]]]}).encode(),
    json.dumps({"version": 1, "lists": [["k", [["padding_e4", {}, True]]]]}).encode(),
    json.dumps({"version": 1, "lists": {"k": []}}).encode(),
    json.dumps({"version": 1, "lists": [["k", HOSTILE]]}).encode(),
])
def test_a_corrupt_or_hostile_list_is_skipped(device, folder, text):
    """Nothing raises, no pipeline is made from the file (a hostile entry would be an
    invalid pipeline: the validation layers fail the test), and saving writes a valid
    file with this time's list."""
    path = pipelines.prefetch_file(device.info)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text)
    dev = vkml.Device(device.index)
    try:
        pc = dev._ctx.pipelines
        rec = pc.replay("k")
        assert not pc.pipelines
        pc.variant(*KEYS[0])
        rec.save()
    finally:
        dev.close()
    assert _lists(device.info) == {"k": [[KEYS[0][0], KEYS[0][1], 0]]}


def test_a_stopped_or_dropped_recording_saves_nothing(device, folder):
    dev = vkml.Device(device.index)
    try:
        pc = dev._ctx.pipelines
        rec = pc.replay("k")
        rec.stop()
        pc.variant(*KEYS[0])
        rec.save()
        pc.replay("dropped")          # (its owner drops it: the device holds it weakly)
        assert not pc.recordings
    finally:
        dev.close()
    assert _lists(device.info) == {}


def _model():
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2
    b = rng.standard_normal(16).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    f = onnx.TensorProto.FLOAT
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [1, 8, 20, 20])],
                          [helper.make_tensor_value_info("y", f, [1, 16, 10, 10])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return m.SerializeToString(), w, b


def _reference(x, w, b):
    cols = np.lib.stride_tricks.sliding_window_view(
        np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
    c = np.einsum("nchwij,ocij->nohw", cols.astype(np.float64), w) + b[:, None, None]
    r = np.maximum(c, 0)
    return r.reshape(1, 16, 10, 2, 10, 2).max(axis=(3, 5))


def test_onnx_prepare_prefetches_the_pipelines_the_last_one_kept(device, folder,
                                                                   monkeypatch):
    """A tuned first preparation saves only the pipelines the model kept (its first run's
    pooling included, the tuner's other candidates not); a second one, on a fresh
    device, has them all compiling before the graph asks and compiles nothing else."""
    import vkml.onnx
    data, w, b = _model()
    x = np.random.default_rng(4).standard_normal((1, 8, 20, 20)).astype(np.float32)
    want = _reference(x, w, b)
    monkeypatch.setattr(tuning, "_DEFAULT", tuning.Tuner("fast", folder=folder))
    # (several candidates timed, whatever the device's family ranking leaves out: the
    # point is that the recording keeps only the one chosen)
    monkeypatch.setattr(conv_choice, "FAR_FACTOR", math.inf)
    made, outs, at_replay = [], [], []
    replay = pipelines.PipelineCache.replay

    def spy(self, key):
        rec = replay(self, key)
        at_replay.append(len(self.pipelines))
        return rec
    monkeypatch.setattr(pipelines.PipelineCache, "replay", spy)
    for _ in range(2):
        dev = vkml.Device(device.index)
        try:
            rep = vkml.onnx.prepare(data, device=dev)
            outs.append(rep.run([x])[0])
            made.append(dev._ctx.pipelines.created)
            rep.release()
        finally:
            dev.close()
        (saved,) = _lists(device.info).values()
    for y in outs:
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    assert any(n.startswith("pooling") for n, _, _ in saved)
    entries = json.loads(next(folder.glob("tuning-*.json")).read_text())["entries"]
    timed = [e for paths in entries.values() for e in paths.get("convolution", {}).values()
             if len(e.get("times", {})) > 1]
    assert timed, "the first preparation timed its convolution's candidates"
    assert at_replay == [0, len(saved)]
    assert made[1] == len(saved) < made[0]


def test_a_serialised_models_key_follows_its_bytes():
    """``backend._bytes_ident``: the same bytes (bytes, bytearray or memoryview) give one
    key; a model up to twice IDENT_ENDS is hashed whole (any byte changed changes it);
    a larger one by its length, its ends (its nodes, inputs and outputs) and pieces
    between."""
    from vkml.onnx import backend

    rng = np.random.default_rng(9)
    ends = backend.IDENT_ENDS
    for n in (0, 1, 1000, 2 * ends):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        key = backend._bytes_ident(data)
        assert key == backend._bytes_ident(bytearray(data)) == \
            backend._bytes_ident(memoryview(data))
        for at in rng.integers(0, max(n, 1), 4) if n else ():
            changed = bytearray(data)
            changed[at] ^= 0xFF
            assert backend._bytes_ident(bytes(changed)) != key
        assert backend._bytes_ident(data + b"\0") != key
    big = rng.integers(0, 256, 5 * ends + 12345, dtype=np.uint8).tobytes()
    key = backend._bytes_ident(big)
    n = len(big)
    step = (n - 2 * ends) // backend.IDENT_SAMPLES
    for at in [0, ends - 1, n - ends, n - 1, ends, ends + 7 * step + 5]:
        changed = bytearray(big)
        changed[at] ^= 1
        assert backend._bytes_ident(bytes(changed)) != key, at
    assert backend._bytes_ident(big[:-1]) != key

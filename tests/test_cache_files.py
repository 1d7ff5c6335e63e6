"""Cache files are input, never trusted (vkml/runtime/cache.py and its users).

Hypothesis draws corrupt contents for each file vkml keeps in its cache folder (the
tuning file, which holds the padding calibration, the Vulkan pipeline cache and its
manifest): JSON of the wrong
shape, wrong keys, types or version, NaN, negative and huge numbers, truncated files,
random bytes, a directory, a FIFO or an oversized file in the file's place.  Each is
ignored (no exception, no trust) and replaced by a valid file; a fresh process (this
file run as a script, ``VKML_CACHE_DIR`` a temporary folder) pads a tensor of 64 KiB or
more correctly over them; the pipeline cache does not grow across processes repeating
the same work.
"""
from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import threading
import time

import numpy as np

if __name__ == "__main__":     # the child: pad on one device, check against NumPy
    import vkml

    index, size = int(sys.argv[1]), int(sys.argv[2])
    x = np.arange(size * size, dtype=np.float32).reshape(1, 1, size, size)
    with vkml.Device(index) as dev:
        y = vkml.pad(x, [0, 0, 2, 2], [0, 0, 2, 2], mode="reflection", device=dev)
    np.testing.assert_array_equal(y, np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)), "reflect"))
    sys.exit(0)

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import vkml
from vkml import tuning
from vkml.ops import padding
from vkml.runtime import cache, pipelines

#: A padding calibration entry as the tuner stores it (made-up point times).
FAKE_TIMES = {c.name: 1e-5 * (i + 1) for i, c in enumerate(padding.MODEL.candidates)}
FAKE_ENTRY = {"choice": padding.MODEL.candidates[0].name, "seconds": 1e-5, "times": FAKE_TIMES,
              "declined": [], "rounds": 1, "mode": "fast", "stale": False,
              "measured_at": 1.7e9, "shape": tuning.MODEL_CLASS}
LARGE = 128       # 128 x 128 float32 = 64 KiB, padded: the calibrated path choice
SMALL = 16

# -- drawn corruptions -------------------------------------------------------------------
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12)
#: Text that parses to a bad cost (NaN and infinities are not JSON, Python writes them).
_bad_numbers = st.sampled_from(["NaN", "Infinity", "-Infinity", "-0.001", "1e308",
                                "1" + "0" * 400, "\"0.1\"", "null", "true", "[]", "{}"])
#: Not a regular file: made in place of the file by ``_place``.
_SPECIAL = ("directory", "directory with a file", "fifo", "oversized", "link to /dev/zero")


def _calibration_key(device) -> tuning.TuneKey:
    return tuning.Tuner("fast").key(device, padding.MODEL, tuning.MODEL_CLASS)


def _tuning_path(folder, device):
    return folder / f"{tuning._stem(device.info)}.json"


def _valid_calibration(device) -> dict:
    """A tuning file holding this device's padding calibration and another features'."""
    key = _calibration_key(device)
    other = dict(FAKE_ENTRY, times={k: 2 * v for k, v in FAKE_TIMES.items()}, seconds=2e-5)
    return {"version": tuning.VERSION, "kind": "vkml-tuning",
            "device": tuning._identity(device.info),
            "entries": {key.features: {"padding": {tuning.MODEL_CLASS: FAKE_ENTRY}},
                        "other,features": {"padding": {tuning.MODEL_CLASS: other}}}}


@st.composite
def corrupt_json(draw, valid: dict, mutate_leaf) -> bytes | str:
    """Bytes that are not a valid file (or a _SPECIAL name): ``valid`` broken one way."""
    kind = draw(st.sampled_from(["shape", "version", "drop key", "extra key", "leaf",
                                 "truncated", "bytes", "special"]))
    text = json.dumps(valid)
    if kind == "shape":
        value = draw(_json_values)
        assume(not isinstance(value, dict) or "version" not in value)
        return json.dumps(value).encode()
    if kind == "version":
        bad = draw(st.sampled_from([None, True, str(valid["version"]), valid["version"] + 0.0,
                                    valid["version"] - 1, valid["version"] + 1, -1, 2 ** 70]))
        return json.dumps(dict(valid, version=bad)).encode()
    if kind == "drop key":
        key = draw(st.sampled_from(sorted(valid)))
        return json.dumps({k: v for k, v in valid.items() if k != key}).encode()
    if kind == "extra key":
        return json.dumps(dict(valid, **{draw(st.text(min_size=1, max_size=6).filter(
            lambda k: k not in valid)): draw(_json_values)})).encode()
    if kind == "leaf":
        return mutate_leaf(draw, valid).encode()
    if kind == "truncated":
        return text.encode()[:draw(st.integers(0, len(text) - 1))]
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    return draw(st.sampled_from(_SPECIAL))


def _calibration_leaf(draw, valid: dict) -> str:
    """The device's calibration entry broken one way (the other entry stays valid)."""
    feats = next(iter(valid["entries"]))
    doc = json.loads(json.dumps(valid))
    entry = doc["entries"][feats]["padding"][tuning.MODEL_CLASS]
    how = draw(st.sampled_from(["number", "seconds", "times", "choice", "field", "entry"]))
    if how == "number":
        entry["times"][draw(st.sampled_from(sorted(entry["times"])))] = "@@"
        return json.dumps(doc).replace('"@@"', draw(_bad_numbers))
    if how == "seconds":
        entry["seconds"] = "@@"
        return json.dumps(doc).replace('"@@"', draw(_bad_numbers | st.just("0.5")))
    if how == "times":
        entry["times"] = draw(st.sampled_from([{}, [], None, "x"]))
    elif how == "choice":
        entry["choice"] = draw(st.sampled_from(["Kernel", "", None, 3]))
    elif how == "field":
        field = draw(st.sampled_from(["rounds", "mode", "stale", "declined", "measured_at"]))
        entry[field] = draw(st.sampled_from([None, "x", -1, [1], 0.5]))
        assume(not (field == "measured_at" and entry[field] == 0.5))
    else:
        doc["entries"][feats]["padding"][tuning.MODEL_CLASS] = draw(
            _json_values.filter(lambda v: not isinstance(v, dict)))
    return json.dumps(doc)


def _manifest_leaf(draw, valid: dict) -> str:
    doc = dict(valid)
    field = draw(st.sampled_from(["blob_sha256", "keys"]))
    doc[field] = draw(st.sampled_from([None, 7, "x", ["0" * 31], [1, 2], "0" * 63, {}]))
    return json.dumps(doc)


def _place(path, content) -> None:
    """Put ``content`` (bytes, or a _SPECIAL name) where the file ``path`` goes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "directory":
        path.mkdir()
    elif content == "directory with a file":
        path.mkdir()
        (path / "inside").write_text("x")
    elif content == "fifo":
        os.mkfifo(path)       # reading it would block forever
    elif content == "oversized":
        with open(path, "wb") as f:
            f.truncate(cache.MAX_BYTES + 1)
    else:
        os.symlink("/dev/zero", path)


def _clear(folder) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


def _header(info, size: int = 32, version: int = 1, vendor=None, device=None, uuid=None):
    return (struct.pack("<IIII", size, version,
                        info.vendor_id if vendor is None else vendor,
                        info.device_id if device is None else device)
            + bytes.fromhex(info.pipeline_cache_uuid if uuid is None else uuid))


@st.composite
def corrupt_blob(draw, info) -> bytes | str:
    """A pipeline cache file whose header does not name this device (or not a file)."""
    kind = draw(st.sampled_from(["bytes", "truncated", "field", "special"]))
    if kind == "bytes":
        data = draw(st.binary(max_size=200))
        assume(len(data) < 32 or data[4:16] != _header(info)[4:16])
        return data
    if kind == "truncated":
        return _header(info)[:draw(st.integers(0, 31))]
    if kind == "special":
        return draw(st.sampled_from(_SPECIAL))
    tail = draw(st.binary(max_size=64))
    field = draw(st.sampled_from(["size", "version", "vendor", "device", "uuid"]))
    if field == "size":
        return _header(info, size=draw(st.sampled_from(
            [0, 16, 31, 32 + len(tail) + 1, 2 ** 32 - 1]))) + tail
    if field == "version":
        return _header(info, version=draw(st.sampled_from([0, 2, 2 ** 31]))) + tail
    if field == "uuid":
        uuid = bytearray(bytes.fromhex(info.pipeline_cache_uuid))
        uuid[draw(st.integers(0, 15))] ^= 1 << draw(st.integers(0, 7))
        return _header(info, uuid=uuid.hex()) + tail
    return _header(info, **{field: (getattr(info, f"{field}_id") + 1) % 2 ** 32}) + tail


_SETTINGS = dict(deadline=None, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture,
                                        HealthCheck.filter_too_much])


# -- in process: every corrupt content is ignored and replaced ------------------------------
@pytest.mark.floor(ran=100)
@settings(max_examples=150, **_SETTINGS)
@given(data=st.data())
def test_corrupt_calibration_is_ignored_and_replaced(tmp_path, device, data, cases):
    """A corrupt tuning file (or entry) is not trusted: the calibration reads as absent,
    and storing one writes a valid file (no temporary left beside it)."""
    folder = tmp_path / "cache"
    _clear(folder)
    key = _calibration_key(device)
    path = _tuning_path(folder, device)
    _place(path, data.draw(corrupt_json(_valid_calibration(device), _calibration_leaf)))
    assert tuning.Tuner("fast", folder=folder).lookup(key) is None
    tuning.Tuner("fast", folder=folder)._store(key, lambda old: FAKE_ENTRY)
    assert tuning.Tuner("fast", folder=folder).lookup(key) == FAKE_ENTRY
    assert tuning._read_json(path) is not None
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [path.name, path.with_suffix(".lock").name])     # the lock file, no temporary
    cases.add("ran")


def test_valid_calibration_is_read_and_other_entries_kept(tmp_path, device):
    key = _calibration_key(device)
    path = _tuning_path(tmp_path, device)
    valid = _valid_calibration(device)
    path.write_text(json.dumps(valid))
    tuner = tuning.Tuner("fast", folder=tmp_path)
    m = tuner.model(device, padding.MODEL)
    assert (m.source, m.times) == ("stored", FAKE_TIMES)     # nothing timed
    assert m.params == padding.MODEL.fit(device, FAKE_TIMES)
    newer = dict(FAKE_ENTRY, measured_at=1.8e9)
    tuner._store(key, lambda old: newer)
    kept = json.loads(path.read_text())["entries"]
    assert kept["other,features"] == valid["entries"]["other,features"]
    assert tuning.Tuner("fast", folder=tmp_path).lookup(key) == newer


def test_a_file_for_other_kernels_is_retuned_and_rewritten(tmp_path, device):
    """A tuning file another vkml wrote (other kernels' sources, another digest) holds
    times of other kernels: ignored, measured again, and the file rewritten for these."""
    path = _tuning_path(tmp_path, device)
    valid = _valid_calibration(device)
    assert valid["device"]["kernels"] == pipelines.kernels_digest()
    old = dict(valid, device=dict(valid["device"], kernels="0" * 16))
    path.write_text(json.dumps(old))
    m = tuning.Tuner("fast", folder=tmp_path).model(device, padding.MODEL)
    assert m.source != "stored" and m.times != FAKE_TIMES
    rewritten = json.loads(path.read_text())
    assert rewritten["device"]["kernels"] == pipelines.kernels_digest()
    assert "other,features" not in rewritten["entries"]


@pytest.mark.floor(ran=30)
@settings(max_examples=40, **_SETTINGS)
@given(data=st.data())
def test_corrupt_pipeline_cache_is_ignored(tmp_path, monkeypatch, device, data, cases):
    """A blob whose header does not name this device (or no blob at all) never reaches
    the driver; pipelines are created anyway and a valid blob and manifest are written."""
    folder = tmp_path / "cache"
    _clear(folder)
    monkeypatch.setenv("VKML_CACHE_DIR", str(folder))
    blob_path, manifest_path = pipelines.cache_files(device.info)
    which = data.draw(st.sampled_from(["blob", "manifest", "both"]))
    if which != "manifest":
        blob = data.draw(corrupt_blob(device.info))
        if isinstance(blob, bytes):
            assert not pipelines.valid_blob(blob, device.info)
        _place(blob_path, blob)
    if which != "blob":
        valid = {"version": pipelines.MANIFEST_VERSION, "blob_sha256": "0" * 64,
                 "keys": ["0" * 32]}
        _place(manifest_path, data.draw(corrupt_json(valid, _manifest_leaf)))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with vkml.Device(device.index) as dev:
        np.testing.assert_array_equal(vkml.pad(x, [1, 2], [2, 1], "symmetric", device=dev),
                                      np.pad(x, ((1, 2), (2, 1)), "symmetric"))
    _assert_valid_pipeline_cache(device.info)
    cases.add("ran")


def test_valid_header_with_garbage_body_does_not_break_pipelines(tmp_path, monkeypatch,
                                                                 device):
    """A header naming this device over garbage reaches the driver, which must cope (the
    spec makes it validate its own data); pipelines still come out right."""
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    blob_path, _ = pipelines.cache_files(device.info)
    blob_path.write_bytes(_header(device.info) + bytes(range(256)) * 4)
    x = np.arange(6, dtype=np.float32)
    with vkml.Device(device.index) as dev:
        np.testing.assert_array_equal(vkml.pad(x, [2], [3], "wrap", device=dev),
                                      np.pad(x, (2, 3), "wrap"))


def test_a_blob_the_driver_refuses_is_replaced(tmp_path, monkeypatch, device):
    """A driver that fails vkCreatePipelineCache on saved data it cannot use (NVIDIA's
    580 driver: VK_ERROR_UNKNOWN on a valid header over garbage) gets an empty cache
    instead: the device opens, pipelines come out right, and a valid blob is saved."""
    from vkml.runtime import vk

    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    blob_path, _ = pipelines.cache_files(device.info)
    blob_path.write_bytes(_header(device.info) + bytes(range(256)) * 4)
    real, tries = vk.lib, []

    class Refusing:
        def __getattr__(self, name):
            return getattr(real, name)

        def vkCreatePipelineCache(self, dev, create, alloc, handle):
            tries.append(create.initialDataSize)
            if create.initialDataSize:
                return vk.VK_ERROR_UNKNOWN
            return real.vkCreatePipelineCache(dev, create, alloc, handle)

    monkeypatch.setattr(pipelines, "lib", Refusing())
    x = np.arange(6, dtype=np.float32)
    with vkml.Device(device.index) as dev:
        np.testing.assert_array_equal(vkml.pad(x, [2], [3], "wrap", device=dev),
                                      np.pad(x, (2, 3), "wrap"))
    assert tries[0] > 0 and tries[1:] == [0]
    _assert_valid_pipeline_cache(device.info)


def _assert_valid_pipeline_cache(info) -> None:
    blob_path, manifest_path = pipelines.cache_files(info)
    blob = cache.read_bytes(blob_path)
    assert blob is not None and pipelines.valid_blob(blob, info)
    manifest = cache.read_json(manifest_path, pipelines.MANIFEST_VERSION,
                               pipelines._valid_manifest)
    import hashlib

    assert manifest is not None and manifest["keys"]
    assert manifest["blob_sha256"] == hashlib.sha256(blob).hexdigest()


# -- the helper itself ----------------------------------------------------------------------
@pytest.mark.floor(ran=60)
@settings(max_examples=100, **_SETTINGS)
@given(raw=st.one_of(_json_values.map(lambda v: json.dumps(v).encode()),
                     st.binary(max_size=200),
                     _bad_numbers.map(lambda t: ('{"version": 1, "n": %s}' % t).encode())))
def test_read_json_never_raises(tmp_path, raw, cases):
    path = tmp_path / "f.json"
    path.write_bytes(raw)
    data = cache.read_json(path, 1, lambda d: cache.is_number(d["n"], 0, 1e6))
    if data is not None:
        assert data["version"] == 1 and cache.is_int(data["version"])
        assert math.isfinite(data["n"]) and 0 <= data["n"] <= 1e6
    cases.add("ran")


def test_atomic_writes_from_many_threads(tmp_path):
    """Writers replacing one file while readers read it: every read sees a whole file."""
    path = tmp_path / "shared.json"
    check = lambda d: d["payload"] == [d["writer"]] * 2000   # noqa: E731
    stop = threading.Event()
    bad: list = []

    def write(k):
        for _ in range(40):
            assert cache.write_json(path, 3, {"writer": k, "payload": [k] * 2000})

    def read():
        while not stop.is_set():
            if path.exists() and cache.read_json(path, 3, check) is None:
                bad.append(cache.read_bytes(path)[:80])

    readers = [threading.Thread(target=read) for _ in range(2)]
    writers = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not bad
    assert [p.name for p in tmp_path.iterdir()] == ["shared.json"]


def test_size_cap(tmp_path):
    path = tmp_path / "big.bin"
    assert not cache.write_bytes(path, b"\0" * (cache.MAX_BYTES + 1)) and not path.exists()
    assert cache.write_bytes(path, b"abc") and cache.read_bytes(path) == b"abc"
    with open(path, "ab") as f:
        f.truncate(cache.MAX_BYTES + 1)
    assert cache.read_bytes(path) is None


def test_killed_writer_leaves_no_temp_files_for_long(tmp_path):
    """A process killed between writing its temporary file and renaming it leaves that
    file; the next write of the same file removes it once it is STALE_TMP_S old (a young
    one may be a live writer's and is kept)."""
    path = tmp_path / "f.json"
    code = ("import os, sys; from pathlib import Path; from vkml.runtime import cache; "
            "os.replace = lambda *a: os._exit(9); "
            "cache.write_bytes(Path(sys.argv[1]), b'half')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code, str(path)], env=env, timeout=120)
    assert r.returncode == 9
    (left,) = tmp_path.glob(".f.json.*.tmp")
    young = tmp_path / ".f.json.young.tmp"
    young.write_bytes(b"live")
    other = tmp_path / ".g.json.old.tmp"            # another file's: not this write's
    other.write_bytes(b"x")
    old = time.time() - cache.STALE_TMP_S - 60
    for p in (left, other):
        os.utime(p, (old, old))
    assert cache.write_bytes(path, b"whole") and cache.read_bytes(path) == b"whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".f.json.young.tmp",
                                                          ".g.json.old.tmp", "f.json"]


# -- fresh processes ------------------------------------------------------------------------
def _child(folder, index: int, size: int, validation: bool = True) -> None:
    env = dict(os.environ, VKML_CACHE_DIR=str(folder), PYTHONPATH=os.pathsep.join(sys.path),
               VKML_VALIDATION=os.environ.get("VKML_VALIDATION", "0") if validation else "0",
               VKML_TUNE="fast")      # these files are about measurements: take them
    out = subprocess.run([sys.executable, __file__, str(index), str(size)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]


@pytest.mark.floor(ran=2)
@settings(max_examples=2, **_SETTINGS)
@given(data=st.data())
def test_fresh_process_pads_over_corrupt_cache_files(tmp_path, device, data, cases):
    """Every cache file of the device corrupt: a new process pads 64 KiB correctly
    (calibrating again: without the validation layer, which would make the calibration
    take half a minute) and leaves valid files behind."""
    folder = tmp_path / "cache"
    _clear(folder)
    info = device.info
    blob_path, manifest_path = pipelines.cache_files(info, folder)
    cal_path = _tuning_path(folder, device)
    _place(cal_path, data.draw(corrupt_json(_valid_calibration(device), _calibration_leaf)))
    _place(blob_path, data.draw(corrupt_blob(info)))
    _place(manifest_path, data.draw(corrupt_json(
        {"version": pipelines.MANIFEST_VERSION, "blob_sha256": "0" * 64, "keys": []},
        _manifest_leaf)))
    _child(folder, device.index, LARGE, validation=False)
    key = _calibration_key(device)
    stored = tuning._parse(tuning._read_json(cal_path), tuning._identity(info))
    assert stored[key[1:]]["times"] and stored[key[1:]]["times"] != FAKE_TIMES
    blob = cache.read_bytes(blob_path)
    assert blob is not None and pipelines.valid_blob(blob, info)
    cases.add("ran")


def test_pipeline_cache_does_not_grow_across_processes(tmp_path, device):
    """The same work in three processes: the first (over a corrupt blob) writes the
    cache, the next two leave it untouched (SwiftShader's cache would grow 32 bytes a
    process if it were saved every time)."""
    folder = tmp_path / "cache"
    _clear(folder)
    blob_path, manifest_path = pipelines.cache_files(device.info, folder)
    blob_path.write_bytes(b"garbage" * 10)
    _child(folder, device.index, SMALL)
    first = (blob_path.read_bytes(), blob_path.stat().st_mtime_ns,
             manifest_path.read_bytes())
    assert pipelines.valid_blob(first[0], device.info)
    for _ in range(2):
        _child(folder, device.index, SMALL)
        assert (blob_path.read_bytes(), blob_path.stat().st_mtime_ns,
                manifest_path.read_bytes()) == first

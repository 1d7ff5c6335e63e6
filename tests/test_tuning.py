"""vkml.tuning: the tuner keeps what it measured fastest, off/fast/full/force behave as
documented, choices are reused across tuners and processes, bad files are never trusted,
concurrent writers merge, observe() marks stale, and the CLI prints its table.

The synthetic path's candidates record real work (1, 4 or 20 copies of the same buffer),
which runs under the validation layer, but the times the tuner sees for them are injected
(:data:`SCRIPTED`, through ``tuning._run_once``): which one is fastest, by how much, and
so what the tuner's logic must do, are facts of the test, never a single timing on a
loaded machine.  Real timings are the bench's (``bench/tuning_cost.py``); the child
processes here time for real, and nothing they assert depends on which candidate won."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vkml
from vkml import tuning
from vkml.tuning import Candidate, Tuner
from tuning_copy import COPY

ROOT = Path(__file__).resolve().parent.parent
SIZE = 1 << 20
#: The seconds the tuner sees for one run of each synthetic candidate, in the order of
#: their work.  Against x1, x20 is past fast mode's WARM_CUTOFF (2x) but within
#: WARM_RECHECK of it (3x): run twice, then dropped; against x4 it is inside the cutoff
#: and behind by more than CLEAR_MARGIN (1.2x): a clear lead after MIN_ROUNDS.
SCRIPTED = {"x1": 1.0e-4, "x4": 1.6e-4, "x20": 2.5e-4}
#: The synthetic candidate each sequence was recorded for (other paths: absent).
_RECORDED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@pytest.fixture(autouse=True)
def scripted_times(monkeypatch):
    """Each run of a synthetic candidate's sequence still runs, but is timed as
    :data:`SCRIPTED` says; other paths' runs (the copy client, padding's model) keep
    their real time, on which no assertion here depends."""
    real = tuning._run_once

    def run_once(seq):
        measured = real(seq)
        name = _RECORDED.get(seq)
        return SCRIPTED[name] if name is not None else measured
    monkeypatch.setattr(tuning, "_run_once", run_once)
    assert SCRIPTED["x20"] / SCRIPTED["x1"] > tuning.WARM_CUTOFF          # (the premises
    assert SCRIPTED["x20"] / SCRIPTED["x4"] > tuning.CLEAR_MARGIN         # stated above)
    assert SCRIPTED["x20"] / SCRIPTED["x4"] < tuning.WARM_CUTOFF


def copies_path(calls: list, fast=("x4", "x20"), name="syn") -> tuning.TunablePath:
    """Candidates x1, x4, x20: that many copies of ``shape`` bytes; default x20."""
    def run(device, seq, cand, shape):
        calls.append(cand.name)
        _RECORDED[seq] = cand.name
        ctx = device._ctx
        n = int(shape)
        src, dst = ctx.allocate(n), ctx.allocate(n)
        ctx.write(src, bytearray_words(n))
        for _ in range(cand.params["copies"]):
            seq.copy(src, dst, [(0, 0, n)])

        def cleanup():
            src.free()
            dst.free()
        return cleanup

    cands = [Candidate(f"x{k}", {"copies": k}, fast=f"x{k}" in fast) for k in (1, 4, 20)]
    return tuning.tunable_path(name, cands, "x20", lambda s: f"{int(s)}B", run)


def bytearray_words(n: int):
    import numpy as np
    return np.arange(n // 4, dtype=np.uint32)


def tuning_file(folder, device) -> Path:
    return Path(folder) / f"{tuning._stem(device.info)}.json"


def entries(folder, device) -> dict:
    raw = tuning._read_json(tuning_file(folder, device))
    return tuning._parse(raw, tuning._identity(device.info))


def test_keeps_the_fastest(device, tmp_path):
    calls = []
    path = copies_path(calls)
    c = Tuner("full", folder=tmp_path, rounds=2).choose(device, path, SIZE)
    assert (c.name, c.source) == ("x1", "measured")
    assert set(calls) == {"x1", "x4", "x20"}
    assert c.times == SCRIPTED
    assert c.speedup() == pytest.approx(SCRIPTED["x20"] / SCRIPTED["x1"])
    assert c.runner_up()[0] == "x4"
    stored = entries(tmp_path, device)[c.key[1:]]
    assert stored["choice"] == "x1" and stored["mode"] == "full" and stored["rounds"] == 2
    assert stored["shape"] == SIZE


def test_asked_again_while_timing_the_same_key(device, tmp_path):
    """Building a candidate may ask the tuner for the same key again (a convolution that
    re-chooses its path while being timed): that call gets the default at once instead
    of waiting for the key's lock, which its own thread holds (a hang until the fix)."""
    tuner = Tuner("full", folder=tmp_path, rounds=1)
    calls, inner = [], []
    path = copies_path(calls, name="reentrant")
    run = path.run

    def run_asking_again(device_, seq, cand, shape):
        inner.append(tuner.choose(device_, path, shape))
        return run(device_, seq, cand, shape)
    path = tuning.tunable_path("reentrant", path.candidates, "x20", path.shape_class,
                               run_asking_again)
    result: list = []
    worker = threading.Thread(target=lambda: result.append(tuner.choose(device, path, SIZE)),
                              daemon=True)
    worker.start()
    worker.join(60)                 # a hang guard, not a timing: the call takes a second
    assert not worker.is_alive(), "the tuner waited on itself"
    assert (result[0].name, result[0].source) == ("x1", "measured")
    assert inner and all((c.name, c.source) == ("x20", "default") for c in inner)
    assert tuner.choose(device, path, SIZE).source == "stored"


def test_prefetch_asks_every_listed_candidate_before_the_first_run(device, tmp_path):
    """A path's ``prefetch_fn`` is called for every listed candidate before the first one
    is recorded (so their pipelines compile side by side); a candidate that declines or
    fails there is still timed by its run function, and the choice is the same."""
    calls, order = [], []
    base = copies_path(calls)

    def prefetch(device_, cand, shape):
        order.append(("prefetch", cand.name))
        if cand.name == "x4":
            raise tuning.Declined("not here")
        if cand.name == "x20":
            raise vkml.UnsupportedError("syn", "nor here")

    def run(device_, seq, cand, shape):
        order.append(("run", cand.name))
        return base.run(device_, seq, cand, shape)
    path = tuning.tunable_path("prefetching", base.candidates, "x20", base.shape_class, run,
                               prefetch_fn=prefetch)
    c = Tuner("full", folder=tmp_path, rounds=1).choose(device, path, SIZE)
    assert (c.name, set(c.times)) == ("x1", {"x1", "x4", "x20"})
    n = len(path.candidates)
    assert order[:n] == [("prefetch", x.name) for x in path.candidates]
    assert [k for k, _ in order[n:]] == ["run"] * n
    assert Tuner("full", folder=tmp_path).choose(device, path, SIZE).source == "stored"


def test_candidates_are_timed_on_zeroed_tensors(device):
    """The tensors a candidate is timed on hold zeros, not what earlier work left (NaN
    there made a constant filter leave Winograd while the tuner timed it)."""
    from vkml.ops.base import empty_for

    desc = vkml.dml.TensorDesc("float32", (3, 37))
    junk = device.tensor(np.full(3 * 37 + 64, np.nan, np.float32))
    del junk
    for _ in range(3):
        t = empty_for(device, desc)
        assert not t.read_bytes(t.nbytes).any()


def test_off_uses_the_default_without_timing(device, tmp_path):
    calls = []
    path = copies_path(calls)
    t = Tuner("full", folder=tmp_path, rounds=1)
    t.choose(device, path, SIZE)                   # a stored choice that off must ignore
    calls.clear()
    for _ in range(2):
        c = Tuner("off", folder=tmp_path).choose(device, path, SIZE)
        assert (c.name, c.source, c.seconds) == ("x20", "default", None)
    assert calls == []
    c = Tuner(folder=tmp_path / "other").choose(device, path, SIZE, mode="off")
    assert c.name == "x20" and not (tmp_path / "other").exists() and calls == []


def test_fast_times_its_list_within_the_budget(device, tmp_path, monkeypatch):
    calls = []
    path = copies_path(calls)
    c = Tuner("fast", folder=tmp_path, budget_s=0.0).choose(device, path, SIZE)
    assert (c.name, c.source) == ("x4", "measured")
    assert set(calls) == {"x4", "x20"}         # x1 is not in the fast list
    # budget spent: the minimum of interleaved rounds (x20 is inside the warm-up cutoff)
    entry = entries(tmp_path, device)[c.key[1:]]
    assert (entry["rounds"], entry["dropped"]) == (tuning.MIN_ROUNDS, [])
    # budget left, x4 ahead of x20 by more than CLEAR_MARGIN: clear after MIN_ROUNDS...
    c = Tuner("fast", folder=tmp_path / "b", budget_s=60.0).choose(device, path, SIZE)
    entry = entries(tmp_path / "b", device)[c.key[1:]]
    assert (entry["rounds"], entry["dropped"]) == (tuning.MIN_ROUNDS, [])
    assert entry["times"] == {"x4": SCRIPTED["x4"], "x20": SCRIPTED["x20"]}
    # ...and FAST_ROUNDS where no margin counts as clear
    margin, cutoff = tuning.CLEAR_MARGIN, tuning.WARM_CUTOFF
    monkeypatch.setattr(tuning, "CLEAR_MARGIN", float("inf"))
    monkeypatch.setattr(tuning, "WARM_CUTOFF", float("inf"))
    c = Tuner("fast", folder=tmp_path / "c", budget_s=60.0).choose(device, path, SIZE)
    assert entries(tmp_path / "c", device)[c.key[1:]]["rounds"] == tuning.FAST_ROUNDS
    monkeypatch.setattr(tuning, "CLEAR_MARGIN", margin)   # (not undo(): the times stay
    monkeypatch.setattr(tuning, "WARM_CUTOFF", cutoff)    # scripted)
    calls.clear()
    assert Tuner("fast", folder=tmp_path).choose(device, path, SIZE).source == "stored"
    assert calls == []
    c = Tuner("full", folder=tmp_path, rounds=1).choose(device, path, SIZE)  # fast is not full
    assert (c.name, c.source) == ("x1", "measured") and "x1" in calls


def test_fast_runs_long_candidates_once_a_round(device, tmp_path, monkeypatch):
    """Fast mode runs a candidate RUNS_PER_ROUND times a round only while that takes
    less than ROUND_RUN_S (a long run once a round, still interleaved); full mode always
    RUNS_PER_ROUND times."""
    counts: dict = {}
    real = tuning._run_once

    def once(seq):
        counts[id(seq)] = counts.get(id(seq), 0) + 1
        return real(seq)
    monkeypatch.setattr(tuning, "_run_once", once)
    monkeypatch.setattr(tuning, "CLEAR_MARGIN", float("inf"))    # every round runs
    monkeypatch.setattr(tuning, "WARM_CUTOFF", float("inf"))
    rounds = tuning.FAST_ROUNDS
    for limit, per_round in ((0.0, 1), (float("inf"), tuning.RUNS_PER_ROUND)):
        monkeypatch.setattr(tuning, "ROUND_RUN_S", limit)
        counts.clear()
        Tuner("fast", folder=tmp_path / str(per_round), budget_s=60.0).choose(
            device, copies_path([]), SIZE)
        # the timed warm-up counts as one run of round 1
        assert sorted(counts.values()) == [rounds * per_round] * 2
    counts.clear()
    Tuner("full", folder=tmp_path / "full", rounds=2).choose(device, copies_path([]), SIZE)
    assert set(counts.values()) == {2 * tuning.RUNS_PER_ROUND}


def test_fast_times_a_lone_candidate_once(device, tmp_path, monkeypatch):
    """A fast list of one candidate (or one left after the warm-up cut) is not timed in
    rounds: its timed warm-up is its time, stored like any choice."""
    runs = []
    real = tuning._run_once
    monkeypatch.setattr(tuning, "_run_once", lambda seq: runs.append(1) or real(seq))
    c = Tuner("fast", folder=tmp_path, budget_s=60.0).choose(
        device, copies_path([], fast=("x4",)), SIZE)
    entry = entries(tmp_path, device)[c.key[1:]]
    assert (c.name, entry["rounds"], len(runs)) == ("x4", 1, 1)
    assert entry["times"]["x4"] > 0


def test_fast_drops_a_candidate_whose_warm_up_is_far_slower(device, tmp_path, monkeypatch):
    """Fast mode: a candidate whose warm-up run took WARM_CUTOFF x the fastest warm-up
    gets no rounds; its one time is kept (considered, listed as dropped), never chosen."""
    calls = []
    path = copies_path(calls, fast=("x1", "x20"))
    runs = []
    timed = tuning._run_once
    monkeypatch.setattr(tuning, "_run_once", lambda seq: runs.append(_RECORDED[seq]) or timed(seq))
    c = Tuner("fast", folder=tmp_path, budget_s=0.0).choose(device, path, SIZE)
    assert c.name == "x1" and calls.count("x20") == 1
    entry = entries(tmp_path, device)[c.key[1:]]
    assert entry["dropped"] == ["x20"] and entry["times"]["x20"] > tuning.WARM_CUTOFF * c.seconds
    assert runs.count("x20") == 2      # near the line (2.5x): a second run, then cut
    assert entry["rounds"] == 1         # x1 left alone: its timed warm-up is its time
    assert Tuner("fast", folder=tmp_path).choose(device, path, SIZE).source == "stored"


def test_fast_drops_a_candidate_whose_first_run_is_hopeless(device, tmp_path, monkeypatch):
    """Fast mode: a candidate whose first run took HOPELESS x the fastest first run plus
    FIRST_RUN_SLACK_S gets no timed run (its first-run time kept, listed as dropped); one
    slower by less than the slack (one-time costs) is timed as before; full mode times
    every candidate."""
    slack = tuning.FIRST_RUN_SLACK_S
    first = {"x1": 1e-4, "x4": tuning.HOPELESS * 1e-4 + slack * 1.5, "x20": slack / 2}
    real_first = tuning._first_run
    monkeypatch.setattr(tuning, "_first_run",
                        lambda seq: (real_first(seq), first[_RECORDED[seq]])[1])
    runs = []
    timed = tuning._run_once
    monkeypatch.setattr(tuning, "_run_once", lambda seq: runs.append(_RECORDED[seq]) or timed(seq))
    path = copies_path([], fast=("x1", "x4", "x20"))
    c = Tuner("fast", folder=tmp_path, budget_s=0.0).choose(device, path, SIZE)
    entry = entries(tmp_path, device)[c.key[1:]]
    assert c.name == "x1" and "x4" not in runs and runs.count("x20") == 2
    assert entry["dropped"] == ["x20", "x4"] and entry["times"]["x4"] == first["x4"]
    assert entry["once"] == ["x4"]      # (x20: cut after its second timed run)
    runs.clear()
    c = Tuner("full", folder=tmp_path / "full", rounds=1).choose(device, path, SIZE)
    assert c.name == "x1" and set(runs) == {"x1", "x4", "x20"}


def test_fast_times_a_near_cutoff_warm_up_twice(device, tmp_path, monkeypatch):
    """Fast mode: a warm-up beyond WARM_CUTOFF x the fastest but within WARM_RECHECK of
    the cutoff gets a second run, its time the faster of the two; one far beyond the
    line is cut on its one run, unless that run was shorter than SHORT_RUN_S."""
    calls = []
    base = copies_path(calls, fast=("x1", "x4", "x20"))
    names = {}

    def run(device, seq, cand, shape):
        names[id(seq)] = cand.name
        return base.run(device, seq, cand, shape)
    path = tuning.tunable_path("recheck", base.candidates, "x20", base.shape_class, run)
    seen = {}
    script = {"x1": [1e-3], "x4": [2.5e-3, 1.1e-3], "x20": [5e-3, 1e-4]}

    def fake_run_once(seq):
        name = names[id(seq)]
        k = seen[name] = seen.get(name, 0) + 1
        return script[name][min(k, len(script[name])) - 1] if k <= len(script[name]) \
            else script[name][0] * (1.2 if name == "x4" else 1.0)
    monkeypatch.setattr(tuning, "_run_once", fake_run_once)
    c = Tuner("fast", folder=tmp_path, budget_s=0.0).choose(device, path, SIZE)
    entry = entries(tmp_path, device)[c.key[1:]]
    assert entry["dropped"] == ["x20"] and seen["x20"] == 1      # 5x: cut on one run
    assert "x4" not in entry["dropped"] and seen["x4"] >= 3      # 2.5x: run again (1.1x)
    assert c.name == "x1" and entry["once"] == ["x20"]
    # one far past the line but shorter than SHORT_RUN_S runs again too: a stall
    # multiplied it, and its second run wins
    seen.clear()
    script["x20"] = [tuning.SHORT_RUN_S / 2] + [1e-4] * 30
    c = Tuner("fast", folder=tmp_path / "short", budget_s=0.0).choose(device, path, SIZE)
    entry = entries(tmp_path / "short", device)[c.key[1:]]
    assert seen["x20"] >= 3 and "x20" not in entry["dropped"] and c.name == "x20"
    # a path with recheck_cuts (a device-wide ranking) runs every cut one twice
    path = tuning.tunable_path("recheck-all", base.candidates, "x20", base.shape_class, run,
                               recheck_cuts=True)
    seen.clear()
    script["x20"] = [5e-3, 4e-3]
    c = Tuner("fast", folder=tmp_path, budget_s=0.0).choose(device, path, SIZE)
    entry = entries(tmp_path, device)[c.key[1:]]
    assert entry["dropped"] == ["x20"] and seen["x20"] == 2 and entry["once"] == []
    assert entry["times"]["x20"] == 4e-3 and c.name == "x1"


def test_env_selects_the_mode(device, tmp_path, monkeypatch):
    calls = []
    path = copies_path(calls)
    monkeypatch.setenv("VKML_TUNE", "off")
    assert Tuner(folder=tmp_path).choose(device, path, SIZE).source == "default"
    monkeypatch.setenv("VKML_TUNE", "sometimes")
    with pytest.raises(vkml.ValidationError, match="VKML_TUNE"):
        Tuner(folder=tmp_path).choose(device, path, SIZE)
    assert calls == []


_CHILD = """
import json, sys
sys.path.insert(0, {tests!r})
import vkml
from vkml import tuning
from test_tuning import copies_path
calls = []
dev = vkml.Device({index})
path = copies_path(calls)
out = []
for shape in {shapes!r}:
    c = tuning.Tuner({mode!r}, rounds=1).choose(dev, path, shape)
    out.append([c.name, c.source])
print(json.dumps({{"choices": out, "calls": calls}}))
dev.close()
"""


def child(device, folder, shapes, mode="full") -> subprocess.Popen:
    code = _CHILD.format(tests=str(ROOT / "tests"), index=device.index, shapes=list(shapes),
                         mode=mode)
    env = dict(os.environ, VKML_CACHE_DIR=str(folder))
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc) -> dict:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_stored_choice_is_reused_by_another_tuner_and_process(device, tmp_path):
    calls = []
    path = copies_path(calls)
    first = Tuner("full", folder=tmp_path, rounds=1).choose(device, path, SIZE)
    assert first.source == "measured" and calls
    calls.clear()
    again = Tuner("full", folder=tmp_path).choose(device, path, SIZE)
    assert (again.name, again.source, again.seconds) == (first.name, "stored", first.seconds)
    assert calls == []
    got = finish(child(device, tmp_path, [SIZE]))
    assert got == {"choices": [[first.name, "stored"]], "calls": []}


def test_refresh_measures_again(device, tmp_path):
    calls = []
    path = copies_path(calls)
    t = Tuner("full", folder=tmp_path, rounds=1)
    t.choose(device, path, SIZE)
    calls.clear()
    assert t.choose(device, path, SIZE, refresh=True).source == "measured" and calls


_BAD_TIMES = st.sampled_from([math.nan, -1.0, math.inf, "fast", True, None, [1.0]])


def _mutations(good: dict):
    """Strategies of documents derived from a valid one that must all be refused."""
    feats = next(iter(good["entries"]))
    def entry_edit(field, values):
        def apply(v):
            doc = json.loads(json.dumps(good))
            e = doc["entries"][feats]["syn"][str(SIZE) + "B"]
            if field == "times":
                e["times"][e["choice"]] = v
            else:
                e[field] = v
            return doc
        return values.map(apply)

    def top(field, values):
        def apply(v):
            doc = json.loads(json.dumps(good))
            doc[field] = v
            return doc
        return values.map(apply)

    return st.one_of(
        top("version", st.sampled_from([0, 2, "1", None, 1.5])),
        top("device", st.fixed_dictionaries({"vendor_id": st.integers(0, 2**32)})),
        top("entries", st.sampled_from([[], "x", None, 3])),
        entry_edit("times", _BAD_TIMES),
        entry_edit("seconds", _BAD_TIMES | st.just(123.0)),
        entry_edit("choice", st.sampled_from(["nope", 3, None, ""])),
        entry_edit("rounds", st.sampled_from([0, -1, "3", 2.5, True])),
        entry_edit("stale", st.sampled_from(["no", 0, None])),
        entry_edit("mode", st.sampled_from(["slow", None, 1])),
        entry_edit("declined", st.sampled_from(["x1", [1], None])),
        entry_edit("measured_at", _BAD_TIMES),
    ).map(lambda doc: json.dumps(doc, allow_nan=True).encode())


_JSON = st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
                     lambda kids: st.lists(kids, max_size=4)
                     | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=12)


@pytest.mark.parametrize("kind", ["garbage", "json", "mutated"])
def test_corrupt_or_foreign_files_are_ignored_and_rewritten(device, kind):
    calls = []
    path = copies_path(calls)
    shape = SIZE
    with tempfile.TemporaryDirectory() as good_dir:
        Tuner("full", folder=good_dir, rounds=1).choose(device, path, shape)
        good = json.loads(tuning_file(good_dir, device).read_bytes())
    strategy = {"garbage": st.binary(max_size=200),
                "json": _JSON.map(lambda v: json.dumps(v, allow_nan=True).encode()),
                "mutated": _mutations(good)}[kind]

    @settings(max_examples=15, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(content=strategy)
    def check(content):
        with tempfile.TemporaryDirectory() as d:
            f = tuning_file(d, device)
            f.write_bytes(content)
            calls.clear()
            c = Tuner("full", folder=d, rounds=1).choose(device, path, shape)
            assert c.source == "measured" and calls, "a bad file was trusted"
            e = entries(d, device)[c.key[1:]]
            assert e["choice"] == c.name and not e["stale"]
            assert json.loads(f.read_bytes())["version"] == tuning.VERSION
            calls.clear()
            assert Tuner("full", folder=d).choose(device, path, shape).source == "stored"
            assert calls == []
            ran.append(content)

    ran = []
    check()
    assert len(ran) >= 10, f"only {len(ran)} bad files tried"


def test_concurrent_threads_merge(device, tmp_path):
    shapes = [4096 + 64 * i for i in range(6)]
    start = threading.Barrier(len(shapes))
    errors = []

    def work(shape):
        try:
            path = copies_path([])
            start.wait()
            Tuner("full", folder=tmp_path, rounds=1).choose(device, path, shape)
        except Exception as exc:          # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in shapes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    got = {cls for (_, p, cls) in entries(tmp_path, device)}
    assert got == {f"{s}B" for s in shapes}
    assert not list(tmp_path.glob("*.tmp"))


def test_concurrent_processes_merge(device, tmp_path):
    a = child(device, tmp_path, [4096 + 64 * i for i in range(4)])
    b = child(device, tmp_path, [8192 + 64 * i for i in range(4)])
    finish(a)
    finish(b)
    got = {cls for (_, p, cls) in entries(tmp_path, device)}
    assert len(got) == 8
    assert not list(tmp_path.glob("*.tmp"))


def test_observe_marks_stale(device, tmp_path):
    calls = []
    path = copies_path(calls)
    t = Tuner("full", folder=tmp_path, rounds=1, stale_observations=4)
    c = t.choose(device, path, SIZE)
    assert not any(t.observe(c.key, c.name, c.seconds * 1.2) for _ in range(8))
    assert not t.observe(c.key, "unknown", 1.0)
    assert [t.observe(c.key, c.name, c.seconds * 10) for _ in range(4)] == [False] * 3 + [True]
    assert t.lookup(c.key)["stale"]
    assert Tuner("full", folder=tmp_path).lookup(c.key)["stale"]     # on disk too
    calls.clear()
    again = t.choose(device, path, SIZE)
    assert again.source == "measured" and calls and not t.lookup(c.key)["stale"]
    # much faster than stored is a disagreement too (the first measurement was loaded)
    assert [t.observe(c.key, again.name, again.seconds / 10) for _ in range(4)][-1]


def test_force_a_candidate_by_name(device, tmp_path):
    calls = []
    path = copies_path(calls)
    t = Tuner("full", folder=tmp_path)
    c = t.choose(device, path, SIZE, force="x4")
    assert (c.name, c.source, c.params["copies"]) == ("x4", "forced", 4)
    assert calls == [] and not tmp_path.exists() or not list(tmp_path.iterdir())
    with pytest.raises(vkml.ValidationError, match="force.*no candidate 'x3'"):
        t.choose(device, path, SIZE, force="x3")


def test_copy_client(device, tmp_path):
    """The copy path (tests/tuning_copy.py): every candidate runs; a texel limit below the shape makes
    the texel candidates decline (and keys the choice apart)."""
    c = Tuner("full", folder=tmp_path, rounds=1).choose(device, "copy", 64 << 10)
    assert c.source == "measured"
    assert set(c.times) == {x.name for x in COPY.candidates}
    with vkml.Device(device.index, limits={"maxTexelBufferElements": 1024}) as small:
        d = Tuner("full", folder=tmp_path, rounds=1).choose(small, "copy", 64 << 10)
    assert d.key.features != c.key.features and "maxTexelBufferElements=1024" in d.key.features
    assert set(d.times) == {"copy-engine", "ssbo-256", "ssbo-64"}
    assert entries(tmp_path, device)[d.key[1:]]["declined"] == ["texel-256", "texel-64"]


def test_registry(device):
    assert "copy" in tuning.registered_paths()
    with pytest.raises(vkml.ValidationError, match="path"):
        Tuner("off").choose(device, "no-such-path", 1)
    with pytest.raises(vkml.ValidationError, match="default"):
        tuning.tunable_path("p", ["a", "b"], "c", str, None)
    with pytest.raises(vkml.ValidationError, match="candidates"):
        tuning.tunable_path("p", ["a", "a"], "a", str, None)


def cli(*args, folder, module="vkml.tune") -> subprocess.CompletedProcess:
    """``python -m vkml.tune ARGS``; ``module="tuning_copy"``: the same with the tests'
    copy path registered (tests/tuning_copy.py)."""
    env = dict(os.environ, VKML_CACHE_DIR=str(folder),
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), *sys.path]))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                          text=True, capture_output=True, timeout=240)


def test_cli_help():
    r = cli("--help", folder="off")
    assert r.returncode == 0 and "VKML_TUNE" in r.stdout and "--refresh" in r.stdout


def test_cli_tunes_the_copy_path(device, tmp_path):
    r = cli("--path", "copy", "--mode", "fast", "--device", str(device.index), folder=tmp_path,
            module="tuning_copy")
    assert r.returncode == 0, r.stderr
    for text in ("Tuned choices", "runner-up", "speedup vs default", "2^16B", "2^22B", "measured"):
        assert text in r.stdout
    r = cli("--path", "copy", "--mode", "fast", "--device", str(device.index), folder=tmp_path,
            module="tuning_copy")
    assert r.returncode == 0 and "stored" in r.stdout and "measured" not in r.stdout
    r = cli("--path", "copy", "--refresh", "--mode", "fast", "--device", str(device.index),
            folder=tmp_path, module="tuning_copy")
    assert r.returncode == 0 and "measured" in r.stdout and "stored" not in r.stdout
    r = cli("--bench", "--path", "copy", "--device", str(device.index), folder=tmp_path,
            module="tuning_copy")
    assert r.returncode == 0 and "no registered tunable path takes them" in r.stdout


def test_tune_api(device, tmp_path):
    calls = []
    path = copies_path(calls)
    seen = []
    out = vkml.tune([(path, SIZE), (path, SIZE // 2)], device, "full",
                    tuner=Tuner(folder=tmp_path, rounds=1),
                    progress=lambda i, n, p, s: seen.append((i, n)))
    assert [c.name for c in out] == ["x1", "x1"] and seen[-1] == (2, 2)


# -- measured models (padding's calibration is one: tests/test_padding.py) -----------------
def copies_model(calls: list, name="synmodel") -> tuning.TunablePath:
    """Points x1, x4, x20 (copies of SIZE bytes); the model: seconds per copy."""
    run = copies_path(calls).run

    def fit(device, times):
        return {"per_copy": [times[f"x{k}"] / k for k in (1, 4, 20) if f"x{k}" in times]}
    return tuning.measured_model(name, [Candidate(f"x{k}", {"copies": k}) for k in (1, 4, 20)],
                                 {"per_copy": [1e-3]}, fit,
                                 lambda device, seq, cand, shape: run(device, seq, cand, SIZE),
                                 features_fn=lambda device: "mine", stale_factor=3.0)


def test_measured_model(device, tmp_path):
    """Every point timed (fast mode too), params fitted, stored once per device, keyed by
    the model's own features; off gives the default; observations against a prediction
    mark it stale by the model's factor."""
    calls = []
    model = copies_model(calls)
    t = Tuner("fast", folder=tmp_path, rounds=1)
    m = t.model(device, model)
    assert m.source == "measured" and sorted(calls) == ["x1", "x20", "x4"]
    assert m.key.features == "mine" and m.key.shape_class == tuning.MODEL_CLASS
    assert len(m.params["per_copy"]) == 3 and m.params == model.fit(device, m.times)
    calls.clear()
    again = Tuner("fast", folder=tmp_path).model(device, model)
    assert (again.source, again.params) == ("stored", m.params) and calls == []
    off = Tuner("off", folder=tmp_path).model(device, model)
    assert (off.source, off.params) == ("default", {"per_copy": [1e-3]}) and calls == []
    with pytest.raises(vkml.ValidationError, match="not a measured model"):
        t.model(device, copies_path([]))
    predicted = m.params["per_copy"][0] * 4
    obs = [t.observe(m.key, "x4", predicted * 2.5, expected=predicted, factor=3.0)
           for _ in range(t.stale_observations)]
    assert not any(obs)                              # within the model's factor
    obs = [t.observe(m.key, "x4", predicted / 4, expected=predicted, factor=3.0)
           for _ in range(t.stale_observations)]
    assert obs[-1] and not any(obs[:-1]) and t.lookup(m.key)["stale"]
    assert t.model(device, model).source == "measured" and calls
    # the same times again: the observations were off, not the measurement; this
    # process widens the key's factor instead of measuring again and again
    assert t.tolerance == {m.key: 2.0}
    obs = [t.observe(m.key, "x4", predicted / 4, expected=predicted, factor=3.0)
           for _ in range(t.stale_observations)]
    assert not any(obs)


def test_cli_refreshes_the_padding_calibration(device, tmp_path):
    """``python -m vkml.tune --path padding``: a stored calibration is used as it is,
    ``--refresh`` measures it again (without the validation layer: it is slow there)."""
    from vkml.ops import padding

    key = Tuner("fast").key(device, padding.MODEL, tuning.MODEL_CLASS)
    times = {c.name: 1e-5 * (i + 1) for i, c in enumerate(padding.MODEL.candidates)}
    first = padding.MODEL.candidates[0].name
    entry = {"choice": first, "seconds": times[first], "times": times, "declined": [],
             "rounds": 1, "mode": "fast", "stale": False, "measured_at": 1.7e9,
             "shape": tuning.MODEL_CLASS}
    Tuner("fast", folder=tmp_path)._store(key, lambda old: entry)
    env = dict(os.environ, VKML_CACHE_DIR=str(tmp_path), VKML_VALIDATION="0")

    def run(*args):
        r = subprocess.run([sys.executable, "-m", "vkml.tune", "--path", "padding", "--mode",
                            "fast", "--device", str(device.index), *args], cwd=ROOT,
                           env=env, text=True, capture_output=True, timeout=240)
        assert r.returncode == 0, r.stderr
        return r.stdout

    out = run()
    assert "model of 9 points" in out and "stored" in out and "measured" not in out
    assert Tuner("fast", folder=tmp_path).lookup(key) == entry
    out = run("--refresh")
    assert "measured" in out and "padding model" in out
    now = Tuner("fast", folder=tmp_path).lookup(key)
    assert now["times"] != times and now["measured_at"] > entry["measured_at"]


def test_tuned_reads_are_rechecked(device, tmp_path, monkeypatch):
    """Fold's, Unfold's, LP pooling's and the activations' read choices, where the tuner
    made them, are re-checked by sampled executions (ops/base.py ``observed``): the key
    of the choice, its candidate, and the stored time as the expectation for the shape
    that was timed (another shape of the class: scaled by elements read and written)."""
    from vkml import dml
    from vkml.ops.activation import CompiledActivation
    from vkml.ops.fold import CompiledFold
    from vkml.ops.lp_pooling import CompiledLpPooling
    from vkml.ops.unfold import CompiledUnfold
    t = Tuner("fast", folder=tmp_path, rounds=1)
    monkeypatch.setattr(tuning, "default_tuner", lambda: t)
    T = dml.TensorDesc
    flat = T("float32", (1, 4096))
    descs = [(CompiledActivation, dml.ActivationReluOperatorDesc(flat, flat)),
             (CompiledFold, dml.FoldOperatorDesc(T("float32", (1, 8 * 9, 36)),
                                                 T("float32", (1, 8, 6, 6)), (3, 3),
                                                 start_padding=(1, 1), end_padding=(1, 1))),
             (CompiledUnfold, dml.UnfoldOperatorDesc(T("float32", (1, 8, 6, 6)),
                                                     T("float32", (1, 8 * 9, 36)), (3, 3),
                                                     start_padding=(1, 1),
                                                     end_padding=(1, 1))),
             (CompiledLpPooling, dml.LpPooling1OperatorDesc(
                 T("float32", (1, 8, 12, 12)), T("float32", (1, 8, 6, 6)), (2, 2), (3, 3),
                 (1, 1), (0, 0), (1, 1), 2))]
    seen = []
    for cls, desc in descs:
        op = cls(device, desc)
        if op.observed is not None:       # (a read the device has one choice for: none)
            key, name, expected, factor = op.observed
            entry = t.lookup(key)
            assert name == entry["choice"] and factor is None
            assert expected == pytest.approx(entry["seconds"])
            seen.append(cls)
        op.release()
    assert CompiledLpPooling in seen and len(seen) >= 2
    assert tuning.io_elements({"in": [[2, 3], [3, 1]], "out": [[4], [1]]}) == 10.0


def test_a_clear_lead_is_the_same_winner_by_the_margin_in_every_round():
    m = tuning.CLEAR_MARGIN
    assert tuning._clear([[1.0, 1.0], [m, m * 1.5]])
    assert not tuning._clear([[1.0, 1.0], [m * 0.99, 2.0]])     # one round too close
    assert not tuning._clear([[1.0, 3.0], [2.0, 1.0]])          # the winner changed
    assert tuning._clear([[1.0, 1.2]])                          # one candidate


def _noisy_path(times: dict, noise: float, calls: dict) -> tuning.TunablePath:
    """Candidates ``a`` (listed first) and ``b`` timed at ``times`` seconds, every other
    round (RUNS_PER_ROUND runs: the timed warm-up starts the first) slower by ``noise``,
    as a burst of load on the machine makes them; nothing is recorded."""
    fake = {}

    def run(dev, seq, cand, shape):
        fake[id(seq)] = cand.name

    def timer(seq):
        name = fake[id(seq)]
        k = calls[name] = calls.get(name, -1) + 1
        return times[name] * (noise if (k // tuning.RUNS_PER_ROUND) % 2 else 1.0)
    calls["timer"] = timer
    return tuning.tunable_path("noisy", ["a", "b"], "a", lambda s: "one", run,
                               tie_margin=1.1)


@pytest.mark.parametrize("a, noise, want", [
    (1.2e-3, 1.4, "a"),        # a lead inside the noise: the listed first keeps it
    (1.2e-3, 1.0, "b"),        # the same lead timed quietly: the faster wins
    (1.2e-3, 1.05, "b"),       # noise under the path's own margin changes nothing
    (1.5e-3, 1.4, "b"),        # a lead past NOISE_TIE_CAP wins through the noise
])
def test_a_lead_within_the_timing_noise_is_a_tie(device, tmp_path, monkeypatch, a, noise,
                                                 want):
    calls: dict = {}
    path = _noisy_path({"a": a, "b": 1.0e-3}, noise, calls)
    monkeypatch.setattr(tuning, "_run_once", calls.pop("timer"))
    c = tuning.Tuner("full", folder=tmp_path, rounds=2).choose(device, path, 1)
    assert c.times["b"] == pytest.approx(1.0e-3) and c.times["a"] == pytest.approx(a)
    assert c.name == want
    margin = tuning.Tuner("full", folder=tmp_path).lookup(c.key)["margin"]
    assert margin == pytest.approx(min(tuning.NOISE_TIE_CAP, max(1.1, noise)))
    # the close pair (within that margin) was timed CLOSE_ROUNDS rounds more
    rounds = 2 + (tuning.CLOSE_ROUNDS if a <= margin * 1.0e-3 else 0)
    assert calls["a"] + 1 == calls["b"] + 1 == rounds * tuning.RUNS_PER_ROUND


def test_noise_is_the_median_spread_of_round_medians():
    t = lambda *m: tuning._Timed(None, None, None, 0.0, medians=list(m))   # noqa: E731
    assert tuning._noise([t(1.0), t(2.0)]) == 1.0                  # one round each
    assert tuning._noise([t(1.0, 1.5), t(2.0, 2.2), t(1.0, 3.0)]) == pytest.approx(1.5)
    plain = tuning.tunable_path("p", ["a"], "a", lambda s: "x", None)
    tied = tuning.tunable_path("p", ["a"], "a", lambda s: "x", None, tie_margin=1.1)
    noisy = [t(1.0, 2.0)]
    assert tuning._margin(noisy, plain) == 1.0
    assert tuning._margin(noisy, tied) == tuning.NOISE_TIE_CAP
    assert tuning._margin([t(1.0, 1.02)], tied) == 1.1


def _timed(name: str, first: float, warm: float) -> "tuning._Timed":
    t = tuning._Timed(Candidate(name, {}), name, None, first)
    t.warm = warm
    return t


def test_long_runs_with_a_clear_lead_take_one_round(monkeypatch):
    """Fast mode: where every candidate's timed warm-up took LONG_RUN_S or more and one
    led each other's warm-up and first run by CLEAR_MARGIN, the warm-ups are the one
    round (no further run); a lead that one first run contradicts, a short run, a path
    that re-checks its cuts or the full mode take their rounds as before."""
    runs = []
    monkeypatch.setattr(tuning, "_run_once", lambda seq: runs.append(seq) or script[seq])
    long, m = tuning.LONG_RUN_S, tuning.CLEAR_MARGIN
    cases = [  # (first, warm) of a and b, at_once, budget, rounds expected
        (((1.1 * long, long), (1.3 * m * long, 1.3 * m * long)), True, 0.2, 1),
        (((1.1 * long, long), (1.3 * m * long, 1.3 * m * long)), False, 0.2, tuning.MIN_ROUNDS),
        (((1.1 * long, long), (0.9 * m * long, 1.3 * m * long)), True, 0.2, tuning.MIN_ROUNDS),
        (((1.1 * long, long), (1.3 * m * long, 0.9 * m * long)), True, 0.2, tuning.MIN_ROUNDS),
        (((0.5 * long, 0.5 * long), (m * long, m * long)), True, 0.2, tuning.MIN_ROUNDS),
        (((1.1 * long, long), (1.3 * m * long, 1.3 * m * long)), True, None, 2),
    ]
    for (fa, wa), (fb, wb) in [c[0] for c in cases]:
        assert tuning._clear_at_once([_timed("a", fa, wa), _timed("b", fb, wb)]) == (
            wb > m * wa and fb > m * wa and min(wa, wb) >= long)
    for ((fa, wa), (fb, wb)), at_once, budget, want in cases:
        script = {"a": wa, "b": wb}
        runs.clear()
        timed = [_timed("a", fa, wa), _timed("b", fb, wb)]
        got = tuning._rounds(timed, 2, budget, at_once=at_once)
        assert got == want
        # (a long run runs once a round in fast mode, the warm-up counting in round 1;
        # RUNS_PER_ROUND a round in full mode)
        per = 1 if budget is not None else tuning.RUNS_PER_ROUND
        assert len(runs) == 2 * (per * got - 1)
        assert all(len(t.medians) == got for t in timed)


def test_one_round_choice_is_the_rounds_choice_wherever_the_lead_holds(monkeypatch):
    """Random long run times, steady from run to run: where the one-round rule stops,
    the choice is the one MIN_ROUNDS rounds make."""
    rng = np.random.default_rng(17)
    monkeypatch.setattr(tuning, "_run_once", lambda seq: script[seq])
    stopped = 0
    for _ in range(200):
        n = int(rng.integers(2, 5))
        warm = rng.uniform(0.5, 4.0, n) * tuning.LONG_RUN_S
        first = warm * rng.uniform(0.8, 1.6, n)
        script = {f"c{i}": float(w) for i, w in enumerate(warm)}
        one = [_timed(f"c{i}", float(f), float(w)) for i, (f, w) in enumerate(zip(first, warm))]
        done = tuning._rounds(one, tuning.FAST_ROUNDS, 10.0)
        two = [_timed(f"c{i}", float(f), float(w)) for i, (f, w) in enumerate(zip(first, warm))]
        tuning._rounds(two, tuning.FAST_ROUNDS, 10.0, at_once=False)
        pick = lambda ts: min(ts, key=lambda t: min(t.medians)).candidate.name  # noqa: E731
        assert pick(one) == pick(two)
        stopped += done == 1
    assert 0 < stopped < 200

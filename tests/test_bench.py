"""The benchmark tool itself (``python -m bench``): a tiny workload end to end on every
device, the result document's schema and its CSV, an absent peer and an absent operator,
the device-limit microkernels, DxDispatch model files, --compare and --plot.  Timings
are never asserted: only that they exist and are positive."""
from __future__ import annotations

import copy
import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import vkml
from bench import dxdispatch, limits, operators, report
from bench import workloads as wl
from bench.__main__ import main
from bench.runners import Absent
from bench.runners.torch_peer import TorchPeer
from vkml.intmath import ceil_div

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "bench" / "models"

TINY = {"workloads": [
    {"name": "tiny-pad-reflection", "op": "pad", "shape": [1, 2, 8, 8], "start": [0, 0, 2, 1],
     "end": [0, 0, 1, 2], "mode": "reflection", "sets": ["quick", "full"]},
    {"name": "tiny-pad-symmetric-f16", "op": "pad", "dtype": "float16", "shape": [3, 5],
     "start": [1, 2], "end": [2, 1], "mode": "symmetric", "sets": ["quick", "full"]},
]}
FAST = ["--repeats", "2", "--warmup", "0"]


def _run(tmp_path, device, *extra, workloads=TINY):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(workloads))
    out = tmp_path / "run.json"
    rc = main(["--device", str(device.index), "--workloads", str(path), "--json", str(out),
               *FAST, *extra])
    return rc, json.loads(out.read_text())


@pytest.fixture(scope="module")
def tiny_run(device, tmp_path_factory):
    """One end-to-end run per device: vkml, NumPy and PyTorch, limits and hot path."""
    tmp = tmp_path_factory.mktemp(f"bench{device.index}")
    rc, doc = _run(tmp, device, "--quick", "--peers", "numpy,torch-cpu", "--csv",
                   str(tmp / "run.csv"))
    return rc, doc, tmp


def test_vkml_runs_before_every_peer(tmp_path, device, monkeypatch):
    """Every workload's vkml run comes before any peer's (a peer's thread pool spins on
    after its call), and the results still stand grouped by workload."""
    from bench import run as bench_run
    calls = []
    vkml_, peer_ = bench_run.Bench.measure_vkml, bench_run.Bench.measure_peer
    monkeypatch.setattr(bench_run.Bench, "measure_vkml", lambda self, r, w, *a: (
        calls.append(("vkml", w.name)), vkml_(self, r, w, *a))[1])
    monkeypatch.setattr(bench_run.Bench, "measure_peer", lambda self, r, w, *a: (
        calls.append((r.name, w.name)), peer_(self, r, w, *a))[1])
    rc, doc = _run(tmp_path, device, "--quick", "--no-limits", "--peers", "numpy")
    assert rc == 0
    names = [w["name"] for w in TINY["workloads"]]
    assert calls == [("vkml", n) for n in names] + [("numpy", n) for n in names]
    assert [(r["workload"], r["runner"]) for r in doc["results"]] == [
        (n, who) for n in names for who in ("vkml", "numpy")]


def test_tiny_workload_end_to_end(tiny_run, device):
    rc, doc, _ = tiny_run
    assert rc == 0
    assert [d["name"] for d in doc["devices"]] == [device.name]
    rows = {(r["workload"], r["runner"]): r for r in doc["results"]}
    assert set(rows) == {(w["name"], r) for w in TINY["workloads"]
                         for r in ("vkml", "numpy", "torch-cpu")}
    for name in ("tiny-pad-reflection", "tiny-pad-symmetric-f16"):
        v = rows[name, "vkml"]
        assert v["status"] == "ok", v.get("reason")
        assert v["max_abs_err"] == 0 and not v["flagged"]
        assert v["wall_ms"]["n"] == 2 and v["wall_ms"]["median"] > 0
        assert v["cold_ms"] > 0 and v["compute_ms"] > 0
        for phase in ("upload", "compute_wall", "download"):
            assert v["phases_ms"][phase]["median"] > 0
        if doc["devices"][0]["timestamps"]:
            assert v["gpu_ms"]["median"] > 0 and v["compute_timer"] == "gpu"
        assert v["gbs"] > 0 and v["pct_shader_copy"] > 0 and v["pct_copy_buffer"] > 0
        assert rows[name, "numpy"]["status"] == "ok"
        assert set(v["speedup"]) >= {"numpy"}
        assert v["speedup"]["numpy"]["e2e"] > 0
    # PyTorch has no symmetric padding: absent with the reason, not an error
    t = rows["tiny-pad-symmetric-f16", "torch-cpu"]
    assert t["status"] == "absent" and "symmetric" in t["reason"]
    assert rows["tiny-pad-reflection", "torch-cpu"]["status"] == "ok"


def test_shader_copy_paths_are_each_checked(device):
    """The shader-copy limit's paths (bench_copy.comp: SSBO, texel, and texel reads with
    u64vec4 stores where the device has int64 shaders) each copy a buffer that is then
    read back and compared (the function raises otherwise)."""
    from bench import limits
    r = limits.shader_copy_gbs(device, 1 << 20, reps=1)
    want = {"ssbo", "texel"} | ({"texel_u64"} if device.context.features.get("int64")
                                else set())
    assert {k for k, v in r["variants"].items() if v.get("gbs")} == want
    assert r["gbs"] == max(v["gbs"] for v in r["variants"].values())


def test_numpy_calls_compares_one_submission_with_separate_transfers(device, capsys):
    """``python -m bench.numpy_calls --staged``: both ways checked against NumPy, and the
    submissions a call makes reported: one on vkml's path, one per transfer and one for
    the operator on the rebuilt path before it."""
    from bench import numpy_calls

    assert numpy_calls.main(["--device", str(device.index), "--staged", "--rounds", "1",
                             "--runs", "2"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if "submission(s)" in line]
    assert [(r[0], r[-4]) for r in rows] == [("pad", "1"), ("pad", "3"), ("add", "1"),
                                             ("add", "4")]


def test_json_schema(tiny_run):
    _, doc, _ = tiny_run
    assert report.validate(doc) == []
    assert doc["schema"] == "vkml-bench/1"
    assert doc["versions"]["vkml"] == vkml.__version__ and "numpy" in doc["versions"]
    d = doc["devices"][0]
    for key in limits.TARGETS:
        assert key in d["hot_path"] or key in d["limits"]
    assert d["limits"]["fma_gflops"] > 0 and d["limits"]["copy_buffer_gbs"] > 0
    assert d["hot_path"]["replay_us_per_submit"] > 0
    assert d["hot_path"]["batched_us_per_padding"] > 0
    # tuning's cost: cold calls in fresh processes, tuning off and fast, then reusing the folder
    tc = d["tuning_cost"]
    assert all(tc[f"{m}_{w}_ms"] > 0 for m in ("off", "fast") for w in ("cold", "warm"))
    assert tc["candidate_off"] and tc["candidate_fast"]
    assert tc["fast_cold_vs_off"] == pytest.approx(tc["fast_cold_ms"] / tc["off_cold_ms"])
    # the issues' device targets are checked in every run (workload ones need their workloads)
    checked = {t["target"] for t in doc["targets"]}
    assert "a replayed recorded sequence (one tiny padding) <= 80 us per submit" in checked
    assert all(isinstance(t["met"], bool) and t["value"] > 0 for t in doc["targets"])
    # the checker notices a broken document
    bad = copy.deepcopy(doc)
    del bad["results"][0]["wall_ms"]
    bad["devices"][0]["limits"]["fma_gflops"] = -1
    bad["schema"] = "other/0"
    problems = report.validate(bad)
    assert any("wall_ms" in p for p in problems)
    assert any("fma_gflops" in p for p in problems)
    assert any("schema" in p for p in problems)


def test_csv_has_every_figure(tiny_run):
    _, doc, tmp = tiny_run
    with open(tmp / "run.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == report.CSV_COLUMNS
    kinds = {r["kind"] for r in rows}
    assert kinds >= {"version", "driver", "limits", "hot_path", "result"}
    results = [r for r in rows if r["kind"] == "result"]
    assert len(results) == len(doc["results"])
    vk = next(r for r in results if r["runner"] == "vkml")
    assert float(vk["median_ms"]) > 0 and json.loads(vk["speedups"])
    md = report.markdown(doc)
    assert "| workload | runner |" in md and "tiny-pad-reflection" in md and "[/" not in md


# -- shares read in turns with the limit's microkernel -------------------------------------
def _turns(work_ms, ref_ms, block=4):
    from bench.stats import Pairs
    return Pairs([[w * 1e-3] * block for w in work_ms], [[r * 1e-3] for r in ref_ms], block)


def test_paired_share_holds_through_a_burst():
    """A burst that slows both halves of one turn, or only one half of another, leaves
    the share (the median over turns) where it was; the spread shows it.  A limit read
    once, during a burst, would move the share by the burst's factor."""
    from bench.stats import paired_share

    quiet = paired_share(_turns([1.0] * 9, [10.0] * 9), 1e6, 16e6)
    assert quiet["n"] == 9 and quiet["block"] == 4
    assert quiet["median"] == quiet["min"] == quiet["max"] == pytest.approx(62.5)
    assert quiet["reference_rate"] == pytest.approx(16e6 / 10e-3)
    work, ref = [1.0] * 9, [10.0] * 9
    work[3], ref[3] = 3.0, 30.0          # both halves of turn 3, 3x slower
    ref[6] = 20.0                         # only the reference's half of turn 6
    work[7] = 2.0                         # only the workload's half of turn 7
    burst = paired_share(_turns(work, ref), 1e6, 16e6)
    assert burst["median"] == pytest.approx(62.5)
    assert burst["min"] == pytest.approx(31.25) and burst["max"] == pytest.approx(125.0)
    assert burst["min_over_min"] == pytest.approx(62.5)
    # the same numbers against a limit measured once, in the burst: off by its factor
    assert 100 * (1e6 / 1e-3) / (16e6 / 30e-3) == pytest.approx(3 * 62.5)
    assert paired_share(_turns([], []), 1, 1) is None


def test_sample_paired_takes_turns_under_a_drifting_clock():
    """Scripted device times on a clock whose speed drops 3x for a stretch: the workload
    runs in blocks lasting about one reference run, the order swapped every turn, as
    many turns as the budget gives; the share read in turns stays at the quiet figure
    while the workload's median time moves."""
    from bench.stats import Budget, paired_share, sample_paired

    clock, calls = [0.0], []

    def timed(name, base):
        def run():
            slow = 3.0 if 0.2 <= clock[0] < 0.45 else 1.0
            clock[0] += base * slow
            calls.append(name)
            return base * slow
        return run

    work, ref = timed("W", 0.5e-3), timed("R", 2.1e-3)
    pairs = sample_paired(work, ref, Budget(warmup=2, min_repeats=5, max_repeats=50,
                                            seconds=1.0))
    assert pairs.block == 4 and calls[:4] == ["W", "R", "W", "R"]       # warm-up
    turns = "".join(calls[4:])
    assert turns.startswith("WWWWR" "RWWWW" "WWWWR")
    assert len(pairs.ref) == len(pairs.work) == Budget(seconds=1.0).count(4 * 0.5e-3 + 2.1e-3)
    assert all(len(w) == 4 for w in pairs.work)
    share = paired_share(pairs, 1.0, 1.0)
    assert share["median"] == share["min_over_min"] == pytest.approx(100 * 2.1 / 0.5)
    assert share["max"] > share["median"] or share["min"] < share["median"]  # the edges
    assert np.median(pairs.work_samples()) in (pytest.approx(0.5e-3), pytest.approx(1.5e-3))


def test_references_cover_the_limits_buffers(device):
    """The copy reference runs the limit's path over chunks of the limit's buffers sized
    like the workload (1 MiB at least), one chunk a run in turn: a round of runs copies
    the whole buffer; the FMA reference's grid follows the workload's FLOPs within its
    bounds."""
    size = 4 << 20
    lim = {"details": {
        "fma": {"local_size": 64, "flops": 1e9, "seconds": 0.1, "invocations": 64 * 64},
        "shader_copy": {"bytes": size, "variants": {
            "ssbo": {"gbs": 1.0, "local_size": 64, "window": size},
            "texel": {"error": "not bound here"}}}}}
    refs = limits.references(device, lim)
    try:
        ctx = device.context
        ctx.write(refs.src, np.arange(size // 4, dtype=np.uint32))
        copy = refs.sized("shader_copy_gbs", 3 << 20)        # moves 3 MiB: 1.5 copied
        try:
            assert copy.amount == 2 * (3 << 19) and "2 chunks" in copy.name
            assert all(copy() > 0 for _ in range(2))
        finally:
            copy.close()
        small = refs.sized("shader_copy_gbs", 1000)
        try:
            assert small.amount == 2 << 20 and "4 chunks" in small.name
            for _ in range(4):
                small()
        finally:
            small.close()
        got = np.empty(size // 4, np.uint32)
        ctx.read(refs.dst, got)
        assert np.array_equal(got, np.arange(size // 4, dtype=np.uint32))
        per_run = 64 * limits._FMA_FLOPS_PER_INVOCATION
        for flops, want in ((None, 2e8), (5e7, 5e7), (1.0, 1e7), (1e9, 1e9), (1e12, 1e10)):
            fma = refs.sized("fma_gflops", flops)
            try:
                assert fma.amount == pytest.approx(want, rel=per_run / want)
                assert want > 1e8 or fma() > 0          # (run only where it is short)
            finally:
                fma.close()
    finally:
        refs.close()


def test_model_shares_read_after_each_hot_run():
    """``bench models``: the microkernels run after each hot run, untimed
    (``sample(between=...)``), and the FMA and roofline shares are the median over the
    hot runs of each against the rates read right after it: a run slowed 3x with its
    references, or one faster run, leaves them where they were; the run-wide ones are
    kept beside them."""
    from bench.cnn import flops
    from bench.cnn.run import paired_shares
    from bench.stats import Budget, sample

    calls = []
    got = sample(lambda: calls.append("run"), Budget(warmup=1, repeats=3),
                 between=lambda: calls.append("ref"))
    assert len(got) == 3 and calls == ["run", "ref"] * 4
    counted = {"conv_gemm_flops": 2e9, "layers": [("Conv", 2e9, 1e8), ("Add", 0, 4e8)]}
    turns = {"run_s": [0.1, 0.3, 0.1, 0.1, 0.1], "fma_s": [0.01, 0.03, 0.01, 0.02, 0.01],
             "copy_s": [0.01, 0.03, 0.01, 0.01, 0.01], "fma_flops": 5e8, "copy_bytes": 1e8,
             "references": ["bench_fma", "bench_copy"]}
    row = {"fma_share": 0.5, "roofline_share": 0.6}
    paired_shares(row, counted, turns)
    assert (row["fma_share_run"], row["roofline_share_run"]) == (0.5, 0.6)
    assert row["fma_share"] == pytest.approx(0.4)        # 20 of 50 GFLOP/s
    assert row["paired"]["n"] == 5 and row["paired"]["fma_share_max"] == pytest.approx(0.8)
    bound = flops.roofline_seconds(counted["layers"], 50.0, 10.0)
    assert row["roofline_share"] == pytest.approx(bound / 0.1)
    turns["run_s"][0] = 0.05                      # one fast run moves the spread only
    paired_shares(row, counted, turns)
    assert row["fma_share"] == pytest.approx(0.4) and row["paired"]["fma_share_max"] == 0.8


def test_shares_in_turns_in_the_json_and_markdown(tiny_run):
    """Each vkml row's share of the shader copy is read in turns with bench_copy as the
    limits table measured it: ``pct_shader_copy`` is the median over turns, the run-wide
    share kept as ``pct_shader_copy_run``; the markdown and CSV show the turns' count
    and spread, the device table the references."""
    _, doc, tmp = tiny_run
    d = doc["devices"][0]
    assert set(d["references"]) == {"fma_gflops", "shader_copy_gbs"}
    assert d["references"]["shader_copy_gbs"].startswith("bench_copy ")
    md = report.markdown(doc)
    assert "| in turns with the limit |" in md and "timed in turns with each workload" in md
    for r in doc["results"]:
        if r["runner"] != "vkml":
            assert "paired" not in r
            continue
        p = r["paired"]
        assert p["limit"] == "shader_copy_gbs" and p["n"] == 2 and p["block"] >= 1
        assert r["pct_shader_copy"] == p["min_over_min"] and p["min"] <= p["median"] <= p["max"]
        assert r["pct_shader_copy_run"] > 0 and p["reference_rate"] > 0
        assert f"| 2 pairs {p['min']:.0f}-{p['max']:.0f}%, median {p['median']:.0f}%; " in md
    with open(tmp / "run.csv") as f:
        vk = [row for row in csv.DictReader(f) if row["runner"] == "vkml"]
    assert all(row["paired_n"] == "2" and float(row["pct_shader_copy_run"]) > 0 for row in vk)
    bad = copy.deepcopy(doc)
    row = next(r for r in bad["results"] if r.get("paired"))
    row["paired"]["n"] = 0
    row["pct_shader_copy"] = row["pct_shader_copy_run"] + 1
    problems = report.validate(bad)
    assert any("paired.n" in p for p in problems)
    assert any("expected the paired share" in p for p in problems)


def test_absent_peer_and_operator(tmp_path, device, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)     # as if not installed
    monkeypatch.delattr(vkml, "pad")                          # as if not written yet
    one = {"workloads": TINY["workloads"][:1]}
    rc, doc = _run(tmp_path, device, "--peers", "onnxruntime-cpu,numpy", "--no-limits",
                   workloads=one)
    assert rc == 0
    assert doc["peers"]["onnxruntime-cpu"]["available"] is False
    rows = {r["runner"]: r for r in doc["results"]}
    assert rows["onnxruntime-cpu"]["status"] == "absent"
    assert "not installed" in rows["onnxruntime-cpu"]["reason"]
    assert rows["vkml"]["status"] == "absent"
    assert "vkml.pad is not implemented yet" in rows["vkml"]["reason"]
    assert rows["numpy"]["status"] == "ok"
    assert report.validate(doc) == []


def test_peer_refuses_what_it_lacks():
    w = wl.parse({"name": "x", "op": "lp_pooling", "shape": [1, 2, 6, 6], "window": 3,
                  "dilations": 2})
    with pytest.raises(Absent, match="dilations"):
        TorchPeer().prepare(w, operators.make_inputs(w.op, w.p, w.np_dtype))


def test_shipped_workloads():
    ws = wl.load()
    assert len({w.name for w in ws}) == len(ws)
    assert {w.op for w in ws} == set(operators.OPS)
    assert {w.p["mode"] for w in ws if w.op == "pad"} == set(operators.PAD_MODES)
    quick = wl.select(ws, quick=True)
    assert quick and {w.op for w in quick} == set(operators.OPS)
    assert wl.select(ws, filters=["conv2d-64-64"]) and not wl.select(ws, filters=["nothing"])
    with pytest.raises(ValueError, match="unknown op"):
        wl.parse({"name": "bad", "op": "matmul"})


@pytest.mark.parametrize("case", [
    ("convolution", {"input": [2, 4, 7, 9], "filter": [6, 2, 3, 2], "groups": 2,
                     "strides": [2, 1], "dilations": [1, 2], "start_padding": [1, 0],
                     "end_padding": [1, 0]}),
    ("convolution", {"input": [1, 4, 5, 6], "filter": [4, 3, 4, 4], "direction": "backward",
                     "strides": 2, "start_padding": 1, "end_padding": 1}),
    ("fold", {"channels": 3, "output_size": [7, 8], "window": [3, 2], "strides": [2, 1],
              "dilations": [1, 2], "start_padding": 1, "end_padding": 1, "batch": 2}),
    ("unfold", {"shape": [2, 3, 7, 8], "window": [3, 2], "strides": [2, 1],
                "dilations": [1, 2], "start_padding": 1, "end_padding": 1}),
    ("lp_pooling", {"shape": [1, 3, 9, 9], "window": 3, "strides": 2, "p": 2}),
    ("element_wise", {"function": "divide", "a": [2, 3, 4, 5], "b": [1, 3, 1, 1]}),
    ("identity", {"shape": [2, 3, 4, 5], "perm": [0, 2, 3, 1]}),
    ("split", {"shape": [2, 5, 4, 3], "axis": 1, "sizes": [2, 3]}),
    ("slice", {"shape": [2, 5, 9, 8], "offsets": [1, 1, 2, 0], "sizes": [1, 2, 3, 4],
               "strides": [1, 2, 3, 2]}),
    ("resample", {"shape": [1, 2, 5, 7], "scales": [1, 1, 2, 3], "mode": "linear"}),
    ("resample", {"shape": [1, 2, 5, 7], "scales": [1, 1, 3, 2], "mode": "nearest"}),
    ("max_pooling", {"shape": [1, 3, 9, 8], "window": [3, 2], "strides": 2,
                     "start_padding": 1, "end_padding": 1}),
    ("average_pooling", {"shape": [1, 3, 9, 8], "window": 3, "strides": [2, 1],
                         "start_padding": 1, "end_padding": 1}),
    ("average_pooling", {"shape": [1, 3, 9, 8], "window": 3, "start_padding": 1,
                         "end_padding": 1, "include_padding": True}),
    ("reduce", {"shape": [2, 3, 4, 5], "function": "average", "axes": [1, 3]}),
    ("gemm", {"a": [7, 9], "b": [5, 9], "trans_b": True, "bias": True}),
    ("batch_normalization", {"shape": [2, 3, 4, 5]}),
    ("softmax", {"shape": [3, 4, 7], "axes": [1]}),
], ids=lambda c: c[0])
def test_reference_matches_torch(case):
    """The float64 references the bench checks every runner against agree with PyTorch."""
    op, params = case
    w = wl.parse(dict(params, name="ref", op=op))
    ins = operators.make_inputs(op, w.p, np.float32)
    ref = operators.compute(op, w.p, ins)
    got = TorchPeer().prepare(w, ins)()
    for g, r in zip(got, ref) if isinstance(ref, list) else [(got, ref)]:
        assert g.shape == r.shape
        assert np.abs(g - r).max() <= 1e-5 * np.abs(r).max()


TINY_MODEL_OPS = {"workloads": [
    {"name": "tiny-split", "op": "split", "shape": [1, 6, 5, 4], "axis": 1, "sizes": [2, 4],
     "sets": ["quick"]},
    {"name": "tiny-gemm-bias", "op": "gemm", "a": [1, 24], "b": [10, 24], "trans_b": True,
     "bias": True, "sets": ["quick"]},
    {"name": "tiny-max-pool", "op": "max_pooling", "shape": [1, 4, 9, 9], "window": 3,
     "strides": 2, "start_padding": 1, "end_padding": 1, "sets": ["quick"]},
]}


@pytest.mark.parametrize("strides, itemsize, row", [
    ([1, 1, 2, 2], 4, 2 * 3 - 1),       # every line of a stride-2 row's span is fetched
    ([1, 1, 1, 1], 4, 3),               # a crop's rows: the elements copied
    ([1, 1, 2, -3], 2, 2 * 3 + 1),      # negative steps span the same
    ([1, 1, 1, 16], 4, 3),              # a step of a whole line: one element a line
])
def test_slice_counts_the_rows_it_reads(strides, itemsize, row):
    """A slice's bytes: its output plus the span of each input row it reads where the
    row's step is shorter than a cache line (derivation in bench.model_ops.slice_bytes)."""
    w = wl.parse({"name": "s", "op": "slice", "shape": [1, 4, 16, 64],
                  "offsets": [0, 0, 0, 0] if strides[-1] > 0 else [0, 0, 0, 63],
                  "sizes": [1, 4, 6, 3], "strides": strides})
    out = 4 * 6 * 3                     # sizes are the output's
    assert w.p["out_shape"][-1] == 3 and np.prod(w.p["out_shape"]) == out
    got = operators.bytes_moved("slice", w.p, [], itemsize)
    assert got == (out + out // 3 * row) * itemsize


def test_model_operator_workloads(tmp_path, device):
    """Tiny model-operator workloads end to end: several outputs (split), FLOPs against
    the FMA peak (GEMM), bytes against shader copy (pooling); vkml and every installed
    CPU peer right, the model-operator goals checked."""
    rc, doc = _run(tmp_path, device, "--quick", "--peers",
                   "numpy,torch-cpu,onnxruntime-cpu,ncnn-cpu", workloads=TINY_MODEL_OPS)
    assert rc == 0 and report.validate(doc) == []
    rows = {(r["workload"], r["runner"]): r for r in doc["results"]}
    for w in TINY_MODEL_OPS["workloads"]:
        v = rows[w["name"], "vkml"]
        assert v["status"] == "ok", v.get("reason")
        assert not v["flagged"] and v["compute_ms"] > 0
        for peer in ("numpy", "torch-cpu", "onnxruntime-cpu", "ncnn-cpu"):
            r = rows[w["name"], peer]
            if doc["peers"][peer]["available"] and r["status"] != "absent":
                assert r["status"] == "ok" and not r["flagged"], (peer, r)
    assert rows["tiny-max-pool", "numpy"]["status"] == "absent"
    assert rows["tiny-split", "vkml"]["max_abs_err"] == 0
    assert rows["tiny-split", "torch-cpu"]["status"] == "ok"
    assert rows["tiny-gemm-bias", "vkml"]["flops"] == 2 * 24 * 10
    assert rows["tiny-gemm-bias", "vkml"]["pct_fma"] > 0
    assert rows["tiny-gemm-bias", "vkml"]["paired"]["limit"] == "fma_gflops"
    assert rows["tiny-max-pool", "vkml"]["pct_shader_copy"] > 0
    areas = {t["target"] for t in doc["targets"] if t["area"] == "model operators"}
    assert areas == set()           # tiny names match no goal's workload patterns


# -- DxDispatch model files ---------------------------------------------------------------
def _model_ops(path: Path) -> set[str]:
    model = dxdispatch.loads(path.read_text())
    return {d["type"] for d in model["dispatchables"].values()}


@pytest.mark.parametrize("path", sorted(p for p in MODELS.glob("*.json")
                                        if "timing" not in p.name), ids=lambda p: p.stem)
def test_model_files(path, device, tmp_path, monkeypatch):
    """Every shipped model runs where vkml has its operator, and names it where not (in a
    scratch folder: writeFile targets are relative to the current one)."""
    from vkml.ops.base import REGISTRY

    monkeypatch.chdir(tmp_path)

    implemented = {cls.OPERATOR_TYPE for cls in REGISTRY}
    lines = []
    timing = dxdispatch.Timing(iterations=2, verbosity=1)
    if _model_ops(path) <= implemented:
        dxdispatch.run_model(path, device, timing, lines.append)
        assert any(line.startswith("Dispatch '") for line in lines)
        assert any(line.startswith("Resource '") for line in lines)   # Microsoft's: 'Out'
    else:
        with pytest.raises(dxdispatch.ModelError, match="DML_OPERATOR_"):
            dxdispatch.run_model(path, device, timing, lines.append)


def test_model_values_padding(device):
    lines = []
    dxdispatch.run_model(MODELS / "padding_reflection.json", device, out=lines.append)
    out = [float(v) for v in lines[-1].split(": ", 1)[1].split(", ")]
    x = np.arange(1, 17, dtype=np.float32).reshape(1, 1, 4, 4)
    assert out == np.pad(x, [(0, 0), (0, 0), (1, 3), (2, 4)], "reflect").ravel().tolist()
    lines.clear()
    dxdispatch.run_model(MODELS / "padding1_wrap_int64.json", device, out=lines.append)
    out = [int(v) for v in lines[-1].split(": ", 1)[1].split(", ")]
    x = np.array([[10, 20, 30], [40, 50, 60]], np.int64)
    assert out == np.pad(x, [(1, 1), (2, 1)], "wrap").ravel().tolist()


def test_model_cli(device, tmp_path, capsys):
    out = tmp_path / "t.json"
    npy = tmp_path / "o.npy"
    model = dxdispatch.loads((MODELS / "padding_constant.json").read_text())
    model["commands"].append({"type": "writeFile", "targetPath": str(npy), "resource": "output"})
    path = tmp_path / "m.json"
    path.write_text("// a comment, as DxDispatch allows\n" + json.dumps(model, indent=1))
    rc = dxdispatch.main([str(path), "-a", str(device.index), "-i", "3", "-r", "2", "-v", "2",
                          "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "Dispatch 'pad': 3 iterations" in text and "iteration 2:" in text
    rec = json.loads(out.read_text())["dispatches"][0]
    assert rec["iterations"] == 3 and rec["repeat"] == 2 and len(rec["cpu_ms"]) == 3
    assert np.load(npy).tolist()[5:10] == [9.5, 1, 2, 3, 9.5]


def _model(dispatchable: dict, bindings=None, resources=None) -> dict:
    return {"resources": resources or {
                "input": {"initialValuesDataType": "FLOAT32", "initialValues": [1, 2, 3]},
                "output": {"initialValuesDataType": "FLOAT32",
                           "initialValues": {"valueCount": 5, "value": 0}}},
            "dispatchables": {"op": dispatchable},
            "commands": [{"type": "dispatch", "dispatchable": "op",
                          "bindings": bindings or {"InputTensor": "input",
                                                   "OutputTensor": "output"}}]}


_PAD = {"type": "DML_OPERATOR_PADDING", "desc": {
    "InputTensor": {"DataType": "FLOAT32", "Sizes": [3]},
    "OutputTensor": {"DataType": "FLOAT32", "Sizes": [5]},
    "PaddingMode": "DML_PADDING_MODE_EDGE", "PaddingValue": 0, "DimensionCount": 1,
    "StartPadding": [1], "EndPadding": [1]}}


@pytest.mark.parametrize("change, message", [
    (lambda m: m["dispatchables"]["op"].update(type="DML_OPERATOR_TOP_K"),
     "vkml has no DML_OPERATOR_TOP_K"),
    (lambda m: m["dispatchables"]["op"]["desc"].update(Bogus=1), "field 'Bogus'"),
    (lambda m: m["dispatchables"]["op"].update(type="hlsl"), "type 'hlsl' is not supported"),
    (lambda m: m["dispatchables"]["op"]["desc"].update(DimensionCount=2), "DimensionCount"),
    (lambda m: m["resources"]["output"]["initialValues"].update(valueCount=4),
     "TotalTensorSizeInBytes = 20"),
    (lambda m: m["commands"][0]["bindings"].update(Foo="input"), "no bind point 'Foo'"),
    (lambda m: m["commands"][0]["bindings"].pop("OutputTensor"), "'OutputTensor' is not bound"),
    (lambda m: m["commands"][0]["bindings"].update(
        InputTensor={"name": "input", "elementCount": 2}), "sub-ranges"),
    (lambda m: m["resources"]["input"].update(initialValues={"sourcePath": "x.png"}),
     "not found"),
    (lambda m: m["commands"].append({"type": "sleep"}), "type 'sleep' is not supported"),
], ids=["op-type", "field", "hlsl", "dimension-count", "small-buffer", "bind-point",
        "unbound", "sub-range", "source", "command"])
def test_model_errors_name_the_problem(change, message, device, tmp_path):
    model = copy.deepcopy(_model(_PAD))
    change(model)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(model))
    with pytest.raises(dxdispatch.ModelError, match=message):
        dxdispatch.run_model(path, device, out=lambda line: None)


def test_model_parsing_rules(device, tmp_path):
    """Abbreviated enums, sequence initializers, comments and trailing commas."""
    model = _model(dict(_PAD, type="PADDING", desc=dict(_PAD["desc"], PaddingMode="WRAP")),
                   resources={
                       "input": {"initialValuesDataType": "DML_TENSOR_DATA_TYPE_FLOAT32",
                                 "initialValues": {"valueCount": 3, "valueStart": 0.5,
                                                   "valueDelta": 2}},
                       "output": {"initialValuesDataType": "FLOAT32", "sizeInBytes": 64,
                                  "initialValues": ["nan", "inf", "-inf", 0, 0]}})
    model["commands"].append({"type": "print", "resource": "output"})
    text = json.dumps(model, indent=1).replace('"commands": [', '"commands": [ /* c */')
    text = text[:text.rindex("}")] + ",}"            # a trailing comma
    path = tmp_path / "m.json"
    path.write_text(text)
    lines = []
    dxdispatch.run_model(path, device, out=lines.append)
    assert lines[-1] == "Resource 'output': 4.5, 0.5, 2.5, 4.5, 0.5"


_TOP_K = {"type": "DML_OPERATOR_TOP_K", "desc": {
    "InputTensor": {"DataType": "FLOAT32", "Sizes": [1, 1, 1, 5]},
    "OutputValueTensor": {"DataType": "FLOAT32", "Sizes": [1, 1, 1, 2]},
    "OutputIndexTensor": {"DataType": "UINT32", "Sizes": [1, 1, 1, 2]}, "Axis": 3, "K": 2}}
_GATHER = {"type": "GATHER", "desc": {
    "InputTensor": {"DataType": "FLOAT32", "Sizes": [5]},
    "IndicesTensor": {"DataType": "UINT32", "Sizes": [2]},
    "OutputTensor": {"DataType": "FLOAT32", "Sizes": [2]}, "Axis": 0, "IndexDimensions": 1}}


@pytest.mark.parametrize("dispatchable, full", [(_TOP_K, "DML_OPERATOR_TOP_K"),
                                                (_GATHER, "DML_OPERATOR_GATHER")],
                         ids=["top_k", "gather"])
def test_model_operator_vkml_lacks(dispatchable, full, device, tmp_path):
    """An operator type vkml has no descriptor for is refused as such, at its ``type``,
    before its desc is read (its array of tensor descs is not "a malformed field")."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps(_model(dispatchable)))
    with pytest.raises(dxdispatch.ModelError) as info:
        dxdispatch.run_model(path, device, out=lambda line: None)
    assert str(info.value).startswith(f"dispatchables.op.type: vkml has no {full} "), info.value
    assert "DML_OPERATOR_PADDING" in str(info.value)        # what vkml has instead


def test_model_operator_table_covers_vkml():
    """Every operator vkml implements is one the DxDispatch runner converts."""
    from vkml.ops.base import REGISTRY

    types = dxdispatch.operator_types()
    for cls in REGISTRY:
        assert types.get(cls.OPERATOR_TYPE) is cls


# -- kernel paths side by side (bench.paths) -------------------------------------------------
_SMALL = {
    "pad": {"shape": [1, 2, 6, 8], "start": [0, 0, 1, 2], "end": [0, 0, 2, 1],
            "mode": "reflection"},
    "convolution": {"input": [1, 4, 6, 6], "filter": [8, 4, 3, 3], "start_padding": [1, 1],
                    "end_padding": [1, 1]},
    "fold": {"channels": 2, "output_size": [6, 6], "window": [3, 3],
             "start_padding": [1, 1], "end_padding": [1, 1]},
    "gemm": {"a": [20, 12], "b": [12, 16]},
}


@pytest.mark.parametrize("op, names", [
    ("pad", ["kernel", "rows", "copy", "rows-256x4"]),
    ("convolution", ["direct", "gemm", "gemm_sg"]),
    ("fold", ["auto", "ssbo4", "roll"]),
    ("gemm", ["direct", "tiled", "sg-16x8"]),
], ids=["pad", "convolution", "fold", "gemm"])
def test_paths_time_each_candidate_checked(op, names, device, monkeypatch):
    """Every named candidate is built forced, checked against the reference and timed;
    a name that is no candidate, and a wrong output, are reported instead of timed."""
    from bench import paths

    w = wl.parse(dict(_SMALL[op], name="small", op=op))
    got = paths.time_paths(device, w, names + ["nope"], rounds=2, runs=1)
    assert got["nope"].startswith("does not run: not a candidate"), got
    timed = {n: v for n, v in got.items() if isinstance(v, float)}
    assert timed and all(v > 0 for v in timed.values()), got
    assert all(isinstance(v, float) or v.startswith("does not run") for v in got.values()), got
    real = operators.compute
    monkeypatch.setattr(operators, "compute", lambda *a, **k: real(*a, **k) + 1.0)
    wrong = paths.time_paths(device, w, list(timed), rounds=1, runs=1)
    assert all(str(v).startswith("wrong output") for v in wrong.values()), wrong


def test_paths_fma_times_the_microkernel_in_turns(device, capsys):
    """``--fma``: bench_fma is timed beside the candidates, its seconds and FLOPs (at
    least the workload's smallest grid), and the CLI gives each candidate's share of it."""
    from bench import paths

    w = wl.parse(dict(_SMALL["gemm"], name="small", op="gemm"))
    got = paths.time_paths(device, w, ["direct"], rounds=1, runs=1, fma=True)
    seconds, flops = got[paths.FMA]
    assert seconds > 0 and flops >= 16 * 64 * 64 * 8 * 4 * 2, got
    assert isinstance(got["direct"], float), got
    assert paths.main(["gemm-256x256x256", "direct", "--fma", "--rounds", "1", "--runs", "1",
                       "--device", str(device.index)]) == 0
    out = capsys.readouterr().out
    assert "GFLOP/s" in out and "% of bench_fma" in out, out


# -- comparing runs and plotting --------------------------------------------------------------
def test_compare_marks_regressions(tiny_run, tmp_path):
    _, doc, _ = tiny_run
    slower = copy.deepcopy(doc)
    for r in slower["results"]:
        if r["runner"] == "vkml" and r["status"] == "ok":
            r["compute_ms"] *= 2
    table, regressions = report.compare(doc, slower)
    assert regressions == 2
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    report.write_json(doc, a)
    report.write_json(slower, b)
    assert main(["--compare", str(a), str(b)]) == 0
    assert main(["--compare", str(a), str(b), "--fail-on-regression"]) == 1
    assert main(["--compare", str(a), str(a), "--fail-on-regression"]) == 0


def test_plot(tiny_run, tmp_path):
    pytest.importorskip("matplotlib")
    from bench.plot import plot

    _, doc, _ = tiny_run
    png = tmp_path / "p.png"
    plot(doc, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_list(capsys):
    assert main(["--list", "--quick"]) == 0
    assert "pad-constant-1x64x256x256" in capsys.readouterr().out


# -- the report as a newcomer reads it ----------------------------------------------------------
def _rendered(doc, wide=False, width=100) -> str:
    from rich.console import Console

    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    report.print_report(doc, console, wide=wide)
    return console.export_text()


def _crowded(doc) -> dict:
    """The tiny run made as wide as a real one gets: two devices, the longest workload name
    of the shipped sets, a flagged result, a failed row and an absent peer with a long
    reason, every speedup in three digits."""
    doc = copy.deepcopy(doc)
    longest = max((w.name for w in wl.load(None)), key=len)
    second = dict(doc["devices"][0], index=doc["devices"][0]["index"] + 1,
                  name="Another Vulkan device with a long name")
    doc["devices"].append(second)
    rows = []
    for r in doc["results"]:
        r = dict(r, workload=longest if r["workload"] == "tiny-pad-reflection" else r["workload"])
        if r["runner"] == "vkml":
            rows += [r, dict(r, device=second["index"], device_name=second["name"])]
            for s in (r.get("speedup") or {}).values():
                s.update(e2e=123.456, compute=234.567)
        else:
            rows.append(dict(r, device=None))
    vk = next(r for r in rows if r["runner"] == "vkml" and r["status"] == "ok")
    vk.update(flagged=True, max_rel_err=0.0123, tolerance=1e-3)
    rows.append({"workload": longest, "runner": "onnxruntime-cpu", "device": None,
                 "status": "absent", "reason": "onnxruntime is not installed (ModuleNotFound"
                 "Error: No module named 'onnxruntime'); pip install onnxruntime (or every "
                 "peer: pip install 'vkml[bench]')"})
    rows.append({"workload": longest, "runner": "ncnn-vulkan", "device": None,
                 "status": "error", "reason": "RuntimeError: " + "a long failure " * 12})
    doc["results"] = rows
    return doc


def test_default_report_fits_100_columns(tiny_run):
    """The default (compact) report fits a 100-column terminal, nothing cut with an
    ellipsis; the crowded case too.  --wide keeps every figure."""
    _, doc, _ = tiny_run
    for d in (doc, _crowded(doc)):
        text = _rendered(d)
        too_long = [line for line in text.splitlines() if len(line) > 100]
        assert not too_long, too_long[:3]
        assert "…" not in text and "..." not in text
        for column in ("workload", "runner", "median", "vkml speedup", "of limit", "rel err"):
            assert column in text
        assert "p10-p90" not in text and "up / down" not in text
        assert all(r["workload"] in text for r in d["results"])
    crowded = _rendered(_crowded(doc))
    assert "123x / 235x" in crowded and "1.2e-02 >" in crowded
    assert "a long failure" in crowded                 # the failure's reason, after the table
    wide = _rendered(doc, wide=True, width=250)
    assert "p10-p90" in wide and "up / down" in wide and "GB/s" in wide


def test_wide_flag_and_pipe_width(tmp_path, device, capsys, monkeypatch):
    """Piped (not a terminal), the report is 100 columns wide, 200 with --wide."""
    monkeypatch.delenv("COLUMNS", raising=False)
    one = {"workloads": TINY["workloads"][:1]}
    for extra, width, columns in (((), 100, "of limit"), (("--wide",), 200, "p10-p90")):
        rc, _ = _run(tmp_path, device, "--peers", "none", "--no-limits", *extra, workloads=one)
        out = capsys.readouterr().out
        assert rc == 0 and columns in out
        assert max(len(line) for line in out.splitlines()) <= width


def test_output_states_goals_not_issue_numbers(tiny_run):
    """What the tool prints and writes names goals, not the tracker's issue numbers."""
    import re

    from bench import targets

    _, doc, tmp = tiny_run
    assert all(isinstance(t.area, str) and t.area for t in targets.TARGETS)
    assert doc["targets"] and all("area" in t and "issue" not in t for t in doc["targets"])
    texts = [_rendered(doc), _rendered(doc, wide=True, width=250), report.markdown(doc),
             (tmp / "run.csv").read_text()]
    for text in texts:
        assert not re.search(r"#\d", text), re.search(r".{30}#\d.{30}", text)
        assert "issue" not in text.lower()
    assert "Performance goals" in texts[0]


def test_absent_peer_names_what_to_install(monkeypatch):
    """The hint names the package and the pyproject extra that installs every peer, and
    the report prints the extra's brackets (rich would take '[bench]' for markup)."""
    import re

    from bench.runners import require

    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(Absent) as exc:
        require("onnxruntime")
    reason = str(exc.value)
    assert "pip install onnxruntime" in reason and "pip install 'vkml[bench]'" in reason
    bench_extra = re.search(r"^bench = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(),
                            re.M).group(1)
    assert '"onnxruntime' in bench_extra
    doc = {"created": "now", "host": {"processor": "cpu", "cpus": 1, "python": "3"},
           "versions": {}, "peers": {"onnxruntime-cpu": {"available": False, "reason": reason}},
           "devices": [], "results": [{"workload": "w", "runner": "onnxruntime-cpu",
                                       "device": None, "status": "absent",
                                       "reason": reason}]}
    text = _rendered(doc)
    assert "'vkml[bench]'" in text and "'vkml'" not in text


# -- the graph workload (bench/graph.py) ----------------------------------------------------
TINY_GRAPH = {"workloads": [
    {"name": "graph-tiny", "op": "graph", "input": [1, 3, 8, 8], "channels": 4,
     "sets": ["quick", "full"]}]}


def test_graph_workload_reports_arena(tmp_path, device, monkeypatch):
    """The graph workload in the tiny quick mode: the compiled graph and the operators one
    by one both correct, the arena next to the sum of the intermediates, the speedup over
    one-by-one, its goal checked; ONNX Runtime absent where it is not installed."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)     # as if not installed
    rc, doc = _run(tmp_path, device, "--quick", "--no-limits", workloads=TINY_GRAPH)
    assert rc == 0 and report.validate(doc) == []
    rows = {r["runner"]: r for r in doc["results"]}
    assert set(rows) == {"vkml", "vkml-ops", "vkml-onnx", "onnxruntime-cpu"}
    g, ops, ox = rows["vkml"], rows["vkml-ops"], rows["vkml-onnx"]
    assert g["status"] == ops["status"] == ox["status"] == "ok"
    assert not g["flagged"] and not ops["flagged"] and not ox["flagged"]
    assert g["graph"]["onnx_vs_graph"] > 0
    a = g["graph"]
    # padding folded into the first convolution, relu fused into it: 3 nodes, and two
    # intermediates (conv1+relu -> pool, pool -> conv2) that share nothing (both alive
    # at the pooling) -- the arena holds both, never more than their sum
    assert a["nodes"] == 3 and len(a["fusions"]) == 2
    assert 0 < a["arena_bytes"] <= a["intermediate_bytes"]
    assert a["intermediate_tensor_bytes"] == 4 * (4 * 8 * 8 + 4 * 4 * 4)
    # as declared: Pad (3x10x10), Conv and Relu (4x8x8 each), LpPool (4x4x4) outputs;
    # lifetime sharing alone puts the Relu's output where the Pad's was
    align = max(16, device.limits["minStorageBufferOffsetAlignment"],
                device.limits["minTexelBufferOffsetAlignment"])
    up = lambda n: ceil_div(n, align) * align      # noqa: E731
    assert a["declared_intermediate_bytes"] == sum(
        up(4 * n) for n in (3 * 10 * 10, 4 * 8 * 8, 4 * 8 * 8, 4 * 4 * 4))
    assert a["arena_bytes"] <= a["unfused_arena_bytes"] < a["declared_intermediate_bytes"]
    assert a["arena_vs_declared"] == a["arena_bytes"] / a["declared_intermediate_bytes"]
    assert a["speedup_vs_one_by_one"] > 0
    assert g["speedup"]["vkml-ops"]["e2e"] == pytest.approx(a["speedup_vs_one_by_one"])
    assert rows["onnxruntime-cpu"]["status"] == "absent"
    goal = {t["threshold"]: t for t in doc["targets"] if t["area"] == "graph"}
    assert set(goal) == {1.3, 1.1, 0.99}
    assert goal[1.3]["values"] == {"graph-tiny": a["speedup_vs_one_by_one"]}
    assert goal[1.1]["values"] == {"graph-tiny": g["speedup"]["vkml-onnx"]["e2e"]}


def test_graph_workload_onnx_model():
    """The ONNX model of the graph workload is valid and, by the ONNX reference
    evaluator, computes the bench's float64 reference."""
    onnx = pytest.importorskip("onnx")
    from onnx.reference import ReferenceEvaluator

    from bench import graph
    w = wl.parse(TINY_GRAPH["workloads"][0])
    p = w.p
    assert p["out_shape"] == [1, 4, 4, 4]
    inputs = operators.make_inputs(w.op, p, w.np_dtype)
    model = graph.onnx_model(p, inputs)
    onnx.checker.check_model(model)
    got = ReferenceEvaluator(model).run(None, {"x": inputs[0]})[0]
    want = operators.compute(w.op, p, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_torch_gpu_peer():
    """torch-gpu runs the torch-cpu functions on the GPU PyTorch sees: absent with the
    reason without one; its results equal torch-cpu's (checked on the CPU here by
    pointing it at the CPU device, on a GPU for real)."""
    import torch

    from bench.runners.torch_peer import TorchGpuPeer
    if not torch.cuda.is_available():
        with pytest.raises(Absent, match="sees no GPU"):
            TorchGpuPeer.probe()

    class OnCpu(TorchGpuPeer):
        torch_device = "cuda" if torch.cuda.is_available() else "cpu"

        def _result(self, torch_, y):
            return y.cpu().numpy() if self.torch_device == "cpu" else super()._result(torch_, y)

    for spec in ({"name": "c", "op": "convolution", "input": [1, 3, 9, 9], "filter": [4, 3, 3, 3],
                  "start_padding": [1, 1], "end_padding": [1, 1]},
                 {"name": "p", "op": "pad", "shape": [1, 2, 5, 5], "start": [0, 0, 1, 2],
                  "end": [0, 0, 2, 1], "mode": "reflection"}):
        w = wl.parse(spec)
        inputs = operators.make_inputs(w.op, w.p, w.np_dtype)
        np.testing.assert_allclose(OnCpu().prepare(w, inputs)(),
                                   TorchPeer().prepare(w, inputs)(), rtol=1e-5, atol=1e-5)


def test_ncnn_goal_leaves_out_workloads_ncnn_gets_wrong():
    """The goal over the convolutions "that ncnn runs correctly": a workload whose
    ncnn-vulkan result was flagged is left out of the geometric mean (and named)."""
    from bench import targets

    def row(w, runner, ratio=None, flagged=False):
        r = {"workload": w, "runner": runner, "device": 0, "status": "ok", "flagged": flagged}
        if ratio is not None:
            r["speedup"] = {"ncnn-vulkan": {"compute": ratio}}
        return r
    doc = {"devices": [{"index": 0, "name": "dev"}], "results": [
        row("conv2d-a", "vkml", 2.0), row("conv2d-a", "ncnn-vulkan"),
        row("conv2d-b", "vkml", 0.5), row("conv2d-b", "ncnn-vulkan", flagged=True),
        row("convT2d-c", "vkml", 2.0), row("convT2d-c", "ncnn-vulkan")]}
    goal = next(t for t in targets.check(doc) if "1.5x ncnn" in t["target"])
    assert goal["values"] == {"conv2d-a": 2.0, "convT2d-c": 2.0} and goal["met"]
    assert any("left out" in n and "conv2d-b" in n for n in goal["notes"])
    seven = next(t for t in targets.check(doc) if ">= 7x ncnn" in t["target"])
    assert "conv2d-b" in seven["values"]                    # that one keeps the ratio


def test_vkml_rows_name_the_candidate(device):
    """A vkml row names what its operator ran: the convolution's candidate, with
    Winograd's GEMM and u64 stores where they apply; GEMM's and padding's path names."""
    import importlib

    from vkml import dml

    from bench.runners.vkml_runner import _candidate
    conv = importlib.import_module("vkml.ops.convolution")
    calibrate = importlib.import_module("vkml.ops.calibrate")
    T = dml.TensorDesc
    desc = dml.ConvolutionOperatorDesc(T("float32", (1, 16, 24, 24)), T("float32", (16, 16, 3, 3)),
                                       None, T("float32", (1, 16, 24, 24)),
                                       start_padding=(1, 1), end_padding=(1, 1))
    op = conv.CompiledConvolution(device, desc, path="winograd-gemm")
    # u64 stores where the device's store-width probe (tuning) took them
    assert _candidate(op) in ("winograd-gemm (gemm gemm)", "winograd-gemm (gemm gemm, u64 stores)")
    op.release()
    if device.features.get("int64"):
        op = conv.CompiledConvolution(device, desc, path="gemm-v8")
        assert _candidate(op) == "gemm-v8 (u64 stores)"
        op.release()
    pad = device.compile_operator(device.create_operator(dml.PaddingOperatorDesc(
        T("float32", (2, 3)), T("float32", (2, 5)), start_padding=(0, 1), end_padding=(0, 1))))
    assert _candidate(pad) == pad.taken and pad.taken in calibrate.PATHS
    pad.release()
    gemm = device.compile_operator(device.create_operator(dml.GemmOperatorDesc(
        T("float32", (4, 8)), T("float32", (8, 4)), None, T("float32", (4, 4)))))
    assert _candidate(gemm) == gemm.path and gemm.path in ("direct", "tiled", "sg")
    gemm.release()

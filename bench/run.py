"""The benchmark run: every selected workload on vkml (per device) and on the peers, with
the device limits and hot-path figures measured in the same run.  Produces the result
document that :mod:`bench.report` prints and writes (schema: :data:`SCHEMA`)."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
import time
from dataclasses import dataclass, field

import numpy as np

import vkml

from . import graph, limits, operators, stats, targets, tuning_cost
from .runners import Absent, peer_classes
from .runners.vkml_runner import VkmlRunner
from .stats import Budget, Stats, sample

SCHEMA = "vkml-bench/1"


@dataclass
class Options:
    devices: list                       # vkml.DeviceInfo to run on
    workloads: list                     # bench.workloads.Workload
    budget: Budget = field(default_factory=Budget)
    peers: list | None = None           # peer names to use (None: all)
    quick: bool = False
    limits: bool = True
    command: list = field(default_factory=list)


def errors(y, ref, tolerance: float) -> dict:
    """Largest absolute error and relative error (to the reference's largest magnitude)
    against the float64 reference; ``flagged`` when over ``tolerance``.  An operator of
    several outputs (split) gives lists: the largest error over them counts."""
    if isinstance(ref, list):
        if not isinstance(y, (list, tuple)) or len(y) != len(ref):
            return {"max_abs_err": None, "max_rel_err": None, "flagged": True,
                    "error_note": f"{len(ref)} outputs expected"}
        parts = [errors(a, r, tolerance) for a, r in zip(y, ref)]
        for part in parts:
            if part["max_abs_err"] is None:
                return part
        return max(parts, key=lambda e: e["max_rel_err"])
    y = np.asarray(y)
    if y.shape != ref.shape:
        return {"max_abs_err": None, "max_rel_err": None, "flagged": True,
                "error_note": f"shape {list(y.shape)} != reference {list(ref.shape)}"}
    diff = np.abs(y.astype(np.float64) - ref)
    diff[np.isnan(diff) & np.isnan(ref)] = 0.0
    max_abs = float(np.nanmax(diff)) if not np.isnan(diff).any() else float("inf")
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    max_rel = max_abs / scale if scale > 0 else max_abs
    return {"max_abs_err": max_abs, "max_rel_err": max_rel,
            "flagged": not (max_rel <= tolerance)}


def rates(work: dict, seconds: float | None, lim: dict | None) -> dict:
    """Throughput of ``work`` done in ``seconds``, and its share of the device limits."""
    if not seconds:
        return {}
    out = {"gbs": work["bytes"] / seconds / 1e9}
    if work["flops"]:
        out["gflops"] = work["flops"] / seconds / 1e9
    if lim:
        if work["flops"] and lim.get("fma_gflops"):
            out["pct_fma"] = 100 * out["gflops"] / lim["fma_gflops"]
        if not work["flops"]:
            for key in ("shader_copy_gbs", "copy_buffer_gbs"):
                if lim.get(key):
                    out["pct_" + key[:-4]] = 100 * out["gbs"] / lim[key]
    return out


#: A row's share key (``pct_*``) for each limit a reference stands for.
PCT_KEYS = {"fma_gflops": "pct_fma", "shader_copy_gbs": "pct_shader_copy"}


def paired(row: dict, pairs, ref, work: dict) -> None:
    """The row's share of the limit ``ref`` stands for, from the compute runs timed in
    turns with it (``pairs``, :func:`bench.stats.paired_share`): ``pct_fma`` or
    ``pct_shader_copy`` becomes that share (each side's fastest run: across processes
    on a loaded machine it moved less than the median of the turns' shares, which is
    kept beside it), the share of the run-wide limit moves to ``..._run``, and
    ``paired`` holds the turns' count and spread and the reference's own rate in the
    limits' unit."""
    amount = work["flops"] if ref.limit == "fma_gflops" else work["bytes"]
    share = stats.paired_share(pairs, amount, ref.amount) if amount else None
    if share is None:
        return
    key = PCT_KEYS[ref.limit]
    if row.get(key) is not None:
        row[key + "_run"] = row[key]
    row[key] = share["min_over_min"]
    row["paired"] = dict(share, limit=ref.limit, reference=ref.name,
                         reference_rate=share["reference_rate"] / 1e9)


def stat(samples) -> dict | None:
    """The summary of timing samples a row stores (``Stats.as_dict``), None for none."""
    s = Stats.of(samples)
    return s.as_dict() if s else None


class Bench:
    """One run; ``progress(step_text)`` is called before each step."""

    def __init__(self, opts: Options, progress=None):
        self.opts = opts
        self.progress = progress or (lambda text: None)
        self.results: list[dict] = []
        self.devices: list[dict] = []
        self._data: dict = {}

    # -- inputs and references ---------------------------------------------------------
    def data(self, w):
        """(inputs, float64 reference, work) of a workload, computed once."""
        found = self._data.get(w.name)
        if found is None:
            p = w.p
            inputs = operators.make_inputs(w.op, p, w.np_dtype)
            ref = operators.compute(w.op, p, inputs, np.float64)
            work = {"flops": operators.flops(w.op, p),
                    "bytes": operators.bytes_moved(w.op, p, inputs, w.np_dtype.itemsize)}
            found = self._data[w.name] = (inputs, ref, work)
        return found

    def steps(self) -> int:
        """How many progress steps the run takes."""
        n_dev = len(self.opts.devices)
        peers = self.peer_list()
        on_dev = sum(1 for c in peers if c.on_device)
        cpu = len(peers) - on_dev
        return n_dev * (1 + int(self.opts.limits) + len(self.opts.workloads) * (1 + on_dev)) \
            + len(self.opts.workloads) * cpu

    def peer_list(self):
        if not hasattr(self, "_peers"):
            want = self.opts.peers
            self._peers = [c for c in peer_classes() if want is None or c.name in want]
        return self._peers

    # -- rows --------------------------------------------------------------------------
    def row(self, w, runner_name: str, device: dict | None, work: dict) -> dict:
        """A new result row of workload ``w`` by one runner (bench.graph fills its own)."""
        return {"workload": w.name, "op": w.op, "dtype": w.dtype, "runner": runner_name,
                "device": device["index"] if device else None,
                "device_name": device["name"] if device else None,
                "status": "ok", "reason": None, "flops": work["flops"], "bytes": work["bytes"],
                "tolerance": w.tolerance}

    def fail(self, row: dict, exc: BaseException) -> dict:
        """``row`` marked absent (the runner lacks something) or failed with ``exc``."""
        if isinstance(exc, Absent):
            row.update(status="absent", reason=str(exc))
        else:
            row.update(status="error", reason=f"{type(exc).__name__}: {exc}")
        return row

    def _time_calls(self, runner, w, inputs, ref, row: dict) -> None:
        """The first call (``cold_ms``, preparation included) checked against the
        reference, then the timed calls (``wall_ms``)."""
        t = time.perf_counter()
        fn = runner.prepare(w, inputs)
        y = fn()
        row["cold_ms"] = (time.perf_counter() - t) * 1e3
        row.update(errors(y, ref, w.tolerance))
        row["wall_ms"] = stat(sample(fn, self.opts.budget))

    def measure_peer(self, runner, w, device: dict | None, lim: dict | None) -> dict:
        inputs, ref, work = self.data(w)
        row = self.row(w, runner.name, device, work)
        try:
            self._time_calls(runner, w, inputs, ref, row)
            row.update(rates(work, row["wall_ms"]["median"] / 1e3,
                              lim if runner.on_device else None))
        except Exception as exc:          # noqa: BLE001  (reported, never fatal)
            self.fail(row, exc)
        finally:
            runner.close()
        return row

    def measure_vkml(self, runner: VkmlRunner, w, device: dict, lim: dict | None,
                     refs: "limits.References | None" = None) -> dict:
        """vkml's row: the functional call end to end, then the DML layer's phases, its
        compute runs in turns with the reference of its limit sized like the workload
        (``refs``: :func:`bench.limits.references`; FMA for FLOP workloads, the shader
        copy for the others), whose share replaces the run-wide limit's
        (:func:`paired`).  A reference that cannot be recorded leaves the run-wide
        share, the reason in ``reference_error``."""
        inputs, ref, work = self.data(w)
        limit = "fma_gflops" if work["flops"] else "shader_copy_gbs"
        try:
            reference = refs.sized(limit, work["flops"] or work["bytes"]) if refs else None
        except Exception as exc:          # noqa: BLE001  (the share then the run-wide one)
            reference, why = None, f"{type(exc).__name__}: {exc}"
        else:
            why = None
        try:
            return self._measure_vkml(runner, w, device, lim, reference, why)
        finally:
            if reference is not None:
                reference.close()

    def _measure_vkml(self, runner, w, device: dict, lim: dict | None, reference,
                      reference_error: str | None) -> dict:
        inputs, ref, work = self.data(w)
        row = self.row(w, runner.name, device, work)
        if reference_error:
            row["reference_error"] = reference_error
        try:
            self._time_calls(runner, w, inputs, ref, row)
        except Exception as exc:          # noqa: BLE001
            return self.fail(row, exc)
        compute = row["wall_ms"]["median"] / 1e3
        try:
            phases, y2 = runner.phases(w, inputs, self.opts.budget, reference)
            row["phases_ms"] = {k: stat(v) for k, v in phases.items()}
            if getattr(runner, "last_candidate", None):
                row["candidate"] = runner.last_candidate
            e2 = errors(y2, ref, w.tolerance)
            if e2["flagged"] and not row["flagged"]:
                row.update(e2, error_note="the DML-layer path's output")
            gpu = row["phases_ms"]["compute_gpu"]
            row["gpu_ms"] = gpu
            compute = (gpu or row["phases_ms"]["compute_wall"])["median"] / 1e3
            row["compute_ms"] = compute * 1e3
            row["compute_timer"] = "gpu" if gpu else "wall"
        except Exception as exc:          # noqa: BLE001
            row["phases_error"] = f"{type(exc).__name__}: {exc}"
        row.update(rates(work, compute, lim))
        if reference is not None and getattr(runner, "last_pairs", None) and \
                "phases_error" not in row:
            paired(row, runner.last_pairs, reference, work)
        row["e2e"] = rates(work, row["wall_ms"]["median"] / 1e3, None)
        return row

    # -- the run -----------------------------------------------------------------------
    def run(self) -> dict:
        opts = self.opts
        peers = {}
        for cls in self.peer_list():
            try:
                peers[cls.name] = {"available": True, "version": cls.probe(), "reason": None}
            except Absent as exc:
                peers[cls.name] = {"available": False, "version": None, "reason": str(exc)}
        for i, info in enumerate(opts.devices):
            self.progress(f"{info.name}: opening")
            dev = vkml.Device(info.index)
            try:
                self._run_device(dev, info, cpu_peers=i == 0, peers=peers)
            finally:
                dev.close()
        _speedups(self.results)
        doc = {
            "schema": SCHEMA,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": list(opts.command),
            "quick": opts.quick,
            "budget": {"warmup": opts.budget.warmup, "min_repeats": opts.budget.min_repeats,
                       "max_repeats": opts.budget.max_repeats, "seconds": opts.budget.seconds,
                       "repeats": opts.budget.repeats},
            "host": {"platform": platform.platform(), "machine": platform.machine(),
                     "processor": _cpu_name(), "cpus": os.cpu_count(),
                     "python": sys.version.split()[0]},
            "versions": {"vkml": vkml.__version__, "numpy": np.__version__,
                         **{k: v["version"] for k, v in peers.items() if v["version"]}},
            "peers": peers,
            "devices": self.devices,
            "workloads": [dict(w.as_dict(), describe=w.describe()) for w in opts.workloads],
            "results": self.results,
        }
        doc["targets"] = targets.check(doc)
        return doc

    def _run_device(self, dev, info, cpu_peers: bool, peers: dict) -> None:
        opts = self.opts
        entry = {"index": info.index, "name": info.name, "device_type": info.device_type,
                 "driver_name": info.driver_name, "driver_info": info.driver_info,
                 "api_version": info.api_version, "driver_version": info.driver_version,
                 "vendor_id": info.vendor_id, "device_id": info.device_id,
                 "timestamps": bool(dev.features.get("timestamps")),
                 "features": {k: bool(v) for k, v in dev.features.items()},
                 "limits": None, "hot_path": None, "tuning_cost": None}
        self.devices.append(entry)
        if opts.limits:
            self.progress(f"{info.name}: device limits (microkernels) and hot path")
            try:
                entry["limits"] = limits.measure(dev, quick=opts.quick)
            except Exception as exc:      # noqa: BLE001
                entry["limits_error"] = f"{type(exc).__name__}: {exc}"
            try:
                entry["hot_path"] = limits.hot_path(dev, quick=opts.quick)
            except Exception as exc:      # noqa: BLE001
                entry["hot_path_error"] = f"{type(exc).__name__}: {exc}"
            try:
                entry["tuning_cost"] = tuning_cost.measure(info.index,
                                                           repeats=1 if opts.quick else 3)
            except Exception as exc:      # noqa: BLE001
                entry["tuning_cost_error"] = f"{type(exc).__name__}: {exc}"
        lim = entry["limits"]
        refs = None
        if lim:
            try:
                refs = limits.references(dev, lim)
                entry["references"] = refs.describe()
            except Exception as exc:      # noqa: BLE001  (shares then against the table's)
                entry["references_error"] = f"{type(exc).__name__}: {exc}"
        try:
            self._workloads(dev, info, cpu_peers, peers, lim, refs)
        finally:
            if refs is not None:
                refs.close()

    def _workloads(self, dev, info, cpu_peers: bool, peers: dict, lim, refs) -> None:
        """Every workload on ``dev``: vkml (in turns with ``refs``), then the peers."""
        opts = self.opts
        device = {"index": info.index, "name": info.name}
        runners = []
        for cls in self.peer_list():
            if (cls.on_device or cpu_peers) and peers[cls.name]["available"]:
                runners.append(cls(dev if cls.on_device else None))
        absent = [c for c in self.peer_list() if (c.on_device or cpu_peers)
                  and not peers[c.name]["available"]]
        vk = VkmlRunner(dev)
        # vkml's runs come first, every workload's, then the peers': a CPU peer's thread
        # pool spins on after its call returns and an in-process Vulkan peer keeps driver
        # threads of its own, so a vkml run timed right after a peer shared the CPUs with it
        rows = []
        for w in opts.workloads:
            if w.op == "graph":             # its own three ways (bench/graph.py)
                self.progress(f"{w.name}: graph, one by one, onnxruntime on {info.name}")
                rows.append(graph.measure(self, w, device, dev, cpu_peers))
                continue
            self.progress(f"{w.name}: vkml on {info.name}")
            rows.append([self.measure_vkml(vk, w, device, lim, refs)])
        for w, got in zip(opts.workloads, rows):
            if w.op == "graph":
                continue
            for r in runners:
                self.progress(f"{w.name}: {r.name}")
                got.append(self.measure_peer(r, w, device if r.on_device else None, lim))
            for c in absent:
                _, _, work = self.data(w)
                row = self.row(w, c.name, device if c.on_device else None, work)
                row.update(status="absent", reason=peers[c.name]["reason"])
                got.append(row)
                self.progress(f"{w.name}: {c.name} (absent)")
        for got in rows:
            self.results += got


def _speedups(results: list[dict]) -> None:
    """For each vkml row: each peer's median time over vkml's, end to end (vkml's NumPy
    in/out call) and compute only (vkml's device time).  > 1 means vkml is faster."""
    ok = [r for r in results if r["status"] == "ok" and r.get("wall_ms")]
    for r in ok:
        if r["runner"] != "vkml":
            continue
        sp = {}
        for peer in ok:
            if peer["workload"] != r["workload"] or peer["runner"] == "vkml":
                continue
            if peer["device"] is not None and peer["device"] != r["device"]:
                continue
            t = peer["wall_ms"]["median"]
            sp[peer["runner"]] = {"e2e": t / r["wall_ms"]["median"],
                                  "compute": t / r["compute_ms"] if r.get("compute_ms") else None}
        r["speedup"] = sp


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()

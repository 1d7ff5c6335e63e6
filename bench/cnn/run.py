"""One row per (model, device) of ``python -m bench models``: vkml (``vkml.onnx.prepare``
on the device: prepare, first run, hot runs; NumPy in and out; prepare plus first run in
fresh processes, with an empty cache and again with it, :func:`cold_start`) next to each
peer, every output checked against ONNX Runtime CPU (max |y - ref| / max |ref|), what ran on the
host (with vkml's reason for each op type), whether ``strict=True`` accepts the model
(else the first node it refuses), and the share of the device's limits: the FMA peak on
the model's convolution/GEMM FLOPs, and the per-layer roofline (``flops``)."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import vkml
import vkml.onnx

from ..runners import Absent
from ..stats import Budget, Stats
from . import flops as flops_mod
from .worker_io import timed


def rel_err(y, ref) -> float:
    """max |y - ref| / max |ref| (inf for a shape mismatch)."""
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    if y.shape != ref.shape:
        return float("inf")
    return float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30))


#: Time limit of each cold-start child process (:func:`cold_start`), in seconds.
COLD_TIMEOUT_S = 900.0
#: The folder holding the ``bench`` package: the children's working directory, so that
#: they import this tree's vkml and bench.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cold_start(data: bytes, dev, x) -> dict:
    """Prepare plus first run in fresh processes (``bench/cnn/cold_worker.py``), as the
    cold-start goal counts them: ``cold`` with an empty ``VKML_CACHE_DIR``, then ``warm``
    in a second process with the same folder (pipeline cache and tuning reused).  Each is
    ``{"status", "import_s", "prepare_s", "first_s"}``, or a status and the reason."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="vkml-cold-") as tmp:
        model, xp = os.path.join(tmp, "model.onnx"), os.path.join(tmp, "x.npy")
        with open(model, "wb") as f:
            f.write(data)
        np.save(xp, x)
        env = dict(os.environ, VKML_CACHE_DIR=os.path.join(tmp, "cache"))
        cmd = [sys.executable, "-m", "bench.cnn.cold_worker", model, xp, str(dev.info.index)]
        for phase in ("cold", "warm"):
            try:
                proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                                      timeout=COLD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                out[phase] = {"status": "timeout", "reason": f"over {COLD_TIMEOUT_S:.0f} s"}
                break
            if proc.returncode:
                out[phase] = {"status": "error", "reason": proc.stderr.strip()[-300:]}
                break
            out[phase] = dict(json.loads(proc.stdout.strip().splitlines()[-1]), status="ok")
    return out


def host_nodes(rep) -> dict:
    """op type -> {"count", "reason"} of the nodes placed on the host (``rep.host_nodes``:
    vkml's own placement reason), and the fallbacks."""
    out: dict = {}
    for _, op_type, why in rep.host_nodes:
        e = out.setdefault(op_type, {"count": 0, "reason": why})
        e["count"] += 1
    for fb in rep.fallbacks:
        out.setdefault("(fallback)", {"count": 0, "reason": str(fb)})["count"] += 1
    return out


def fusion_counts(rep) -> dict:
    """kind -> how many rewrites the graph compiler made in the device partitions last
    run (``rep.fusions``), so a ``fuse`` switch shows in the row."""
    return dict(sorted(collections.Counter(f.kind for f in rep.fusions).items()))


def strict_check(data: bytes, dev, dtype=None, fuse=True) -> dict:
    """Whether ``prepare(strict=True)`` accepts the model; else the refused node."""
    try:
        rep = vkml.onnx.prepare(data, device=dev, strict=True, dtype=dtype, fuse=fuse)
    except vkml.UnsupportedError as exc:
        text = str(exc)
        op = text.split("op type ", 1)[1].split(")")[0].split(",")[0] if "op type " in text \
            else None
        return {"accepted": False, "refused_op": op, "reason": text}
    rep.release()
    return {"accepted": True, "refused_op": None, "reason": None}


def vkml_row(data: bytes, dev, x, ref, budget: Budget, dtype=None, fuse=True,
             cold: bool = True, refs: dict | None = None) -> dict:
    """vkml's figures for one model on ``dev``: timings, rel err, placement.  ``dtype``:
    ``prepare``'s (``"float16"``: the float32 model in float16 on the device, its rel err
    still against ONNX Runtime CPU float32); ``fuse``: ``prepare``'s too (the graph
    fusions switched on, to measure them), recorded in the row.  ``refs``
    (``bench.limits.references``): the FMA and shader-copy microkernels, each run once
    after every hot run, untimed (``turns``: each hot run's seconds with theirs, for
    :func:`shares`)."""
    holder, cpu, wall, after = {}, [], [], []

    def run(a):
        c, t = time.process_time(), time.perf_counter()
        y = holder["rep"].run([a])[0]
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        return y

    def between():
        after.append((refs["fma_gflops"](), refs["shader_copy_gbs"]()))

    def prepare():
        holder["rep"] = vkml.onnx.prepare(data, device=dev, dtype=dtype, fuse=fuse)
        return run

    try:
        fig, y = timed(prepare, x, budget, between=between if refs else None)
    except vkml.VkmlError as exc:
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    # the hot runs' process CPU ms (every thread), beside their wall ms (``shares``)
    n = fig["hot"]["n"]
    fig["hot_cpu"] = Stats.of(cpu[-n:]).as_dict()
    if refs and len(after) >= n:
        fig["turns"] = {"run_s": wall[-n:], "fma_s": [a for a, _ in after[-n:]],
                        "copy_s": [b for _, b in after[-n:]],
                        "fma_flops": refs["fma_gflops"].amount,
                        "copy_bytes": refs["shader_copy_gbs"].amount,
                        "references": [refs[k].name for k in ("fma_gflops", "shader_copy_gbs")]}
    rep = holder["rep"]
    try:
        parts = collections.Counter(w for w, _ in rep.partitions)
        hosted = host_nodes(rep)
        fig.update(status="ok", rel_err=rel_err(y, ref), dtype=dtype or "float32", fuse=fuse,
                   device_partitions=parts.get("device", 0),
                   host_partitions=parts.get("host", 0),
                   host_node_count=sum(v["count"] for k, v in hosted.items()
                                       if k != "(fallback)"),
                   host_ops=hosted, fallbacks=[str(f) for f in rep.fallbacks],
                   folded=len(rep.folded), rewrites=len(rep.rewrites),
                   fusions=fusion_counts(rep))
    finally:
        rep.release()
    fig["strict"] = strict_check(data, dev, dtype, fuse)
    if cold:
        fig["cold_start"] = cold_start(data, dev, x)
    return fig


def peer_row(peer, spec, data, size, dev, x, ref, budget: Budget) -> dict:
    try:
        version = peer.version()
        if hasattr(peer, "measure"):             # measured in a child process
            fig, y = peer.measure(spec, data, size, dev, x, budget)
        else:
            fig, y = timed(lambda: peer.prepare(spec, data, size, dev), x, budget)
    except Absent as exc:
        row = {"status": "absent", "reason": str(exc)}
        if getattr(exc, "first", None):        # a child peer that died after its first run
            row.update(exc.first[0], first_rel_err=rel_err(exc.first[1], ref))
            row["reason"] += f"; that run's rel err {row['first_rel_err']:.1e}"
        return row
    except Exception as exc:           # noqa: BLE001 (a peer never fails the run)
        return {"status": "error", "reason": f"{type(exc).__name__}: {str(exc)[-300:]}"}
    fig.update(status="ok", version=version, rel_err=rel_err(y, ref))
    if getattr(peer, "note", ""):
        fig["note"] = peer.note
    return fig


def shares(row: dict, counted: dict, limits: dict | None) -> None:
    """Add the share of the FMA peak (conv/GEMM FLOPs over the hot median) and of the
    roofline bound to ``row``; and ``fma_cpu_share``: the model's FLOPs per second of
    this process's CPU time over the FMA kernel's (``cli.device_limits``).  On a CPU
    driver the device's work is this process's threads' CPU time, which other
    processes' load leaves nearly unchanged where it stretches wall times 2-8x, so this
    share compares runs on a loaded machine; quiet and with every core busy it is near
    ``fma_share``.  On a GPU it means nothing (the CPU only waits)."""
    row["conv_gemm_gflop"] = counted["conv_gemm_flops"] / 1e9
    row["model_mb"] = counted["bytes"] / 1e6
    vk = row["vkml"]
    if not limits or vk.get("status") != "ok":
        return
    hot_s = vk["hot"]["median"] / 1e3
    peak, bw = limits["fma_gflops"], limits["shader_copy_gbs"]
    row["gflops"] = counted["conv_gemm_flops"] / hot_s / 1e9
    row["fma_share"] = row["gflops"] / peak
    bound = flops_mod.roofline_seconds(counted["layers"], peak, bw)
    row["roofline_ms"] = bound * 1e3
    row["roofline_share"] = bound / hot_s
    if vk.get("turns"):
        paired_shares(row, counted, vk["turns"])
    if limits.get("fma_cpu_gflops") and vk.get("hot_cpu"):
        cpu_s = max(vk["hot_cpu"]["median"] / 1e3, 1e-9)
        row["fma_cpu_share"] = counted["conv_gemm_flops"] / cpu_s / 1e9 / limits["fma_cpu_gflops"]


def paired_shares(row: dict, counted: dict, turns: dict) -> None:
    """``fma_share`` and ``roofline_share`` read against the microkernels run after each
    hot run (``vkml_row``'s ``turns``; a CPU driver's speed drifts within seconds: a
    limit read once, at the start, moved the share by the drift): per hot run, its
    share against the FMA rate and copy bandwidth read right after it, the median over
    the runs.  Not each side's fastest run as ``python -m bench`` takes per operator:
    here the references run far shorter than a model's run (sized like it they would
    double the hot runs' time), and the shorter side catches the busy machine's quiet
    moments more often.  The run-wide ones move to ``..._run``; ``paired`` holds the
    runs' count and the spread."""
    fma, rooflines = [], []
    for run, f, c in zip(turns["run_s"], turns["fma_s"], turns["copy_s"]):
        peak, bw = turns["fma_flops"] / f / 1e9, turns["copy_bytes"] / c / 1e9
        fma.append(counted["conv_gemm_flops"] / run / 1e9 / peak)
        rooflines.append(flops_mod.roofline_seconds(counted["layers"], peak, bw) / run)
    if not fma:
        return
    row["fma_share_run"], row["roofline_share_run"] = row["fma_share"], row["roofline_share"]
    row["fma_share"] = float(np.median(fma))
    row["roofline_share"] = float(np.median(rooflines))
    row["paired"] = {"n": len(fma), "fma_share_min": min(fma), "fma_share_max": max(fma),
                     "roofline_share_min": min(rooflines),
                     "roofline_share_max": max(rooflines),
                     "references": turns["references"]}


def reference(peer, spec, data: bytes, size: int, dev, x, budget: Budget) -> tuple:
    """(ONNX Runtime CPU's row, its output): the reference every output is checked
    against, measured in its child process (``peers.CpuChildPeer``) like any peer; its
    :class:`~bench.runners.Absent` (not installed, failed) ends the model's row."""
    fig, y = peer.measure(spec, data, size, dev, x, budget)
    fig.update(status="ok", version=peer.version(), rel_err=0.0)
    return fig, y


def model_row(spec, size: int, data: bytes, dev, peers, budget: Budget,
              limits: dict | None, seed: int = 0, dtype=None, fuse=True,
              cold: bool = True, refs: dict | None = None) -> dict:
    """Every figure of one model on one device (the CPU peers run once per device too:
    the machine is the same, and their numbers sit next to the device's); vkml's in
    ``dtype`` (``vkml_row``), the peers' as the model says.  The reference output and
    the FLOP count (both ONNX Runtime CPU) come from child processes that have ended
    before vkml prepares: no peer's thread pool shares this process with vkml."""
    x = np.random.default_rng(seed).standard_normal((1, 3, size, size)).astype(np.float32)
    ref_peer = next(p for p in peers if p.name == "onnxruntime-cpu")
    ref_row, ref = reference(ref_peer, spec, data, size, dev, x, budget)
    counted = flops_mod.count_apart(data)
    row = {"model": spec.name, "size": size, "device": dev.info.name,
           "driver": dev.info.driver_info}
    row["vkml"] = vkml_row(data, dev, x, ref, budget, dtype, fuse, cold, refs)
    row["peers"] = {p.name: ref_row if p is ref_peer else
                    peer_row(p, spec, data, size, dev, x, ref, budget) for p in peers}
    vk = row["vkml"]
    for name, pr in row["peers"].items():
        if pr.get("status") == "ok" and vk.get("status") == "ok":
            pr["vkml_speedup"] = pr["hot"]["median"] / vk["hot"]["median"]
    shares(row, counted, limits)
    return row

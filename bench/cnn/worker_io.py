"""What the peers' workers (``wonnx_worker``, ``tinygrad_worker``, ``peer_worker``) share:
their command line (``MODEL.onnx X.npy Y.npy FIG.json DEVICE SECONDS REPEATS``, as
``peers.ChildPeer`` passes it), the timing of prepare / first run / hot runs (vkml's own
rows too), and the files they answer with.  Imports only NumPy and ``bench.stats``: the
WebGPU workers run in the peers' own virtualenv, which has no vkml."""
from __future__ import annotations

import json
import os
import time

import numpy as np

from ..stats import Budget, Stats, sample


class Absent(Exception):
    """The peer cannot run this model here; the message says why (written to FIG.json)."""


#: Hot runs of a whole model: at least this many (fewer only for a run so slow that they
#: would take over ``cap`` x the time budget), so that the median a model's row reports
#: is not one of three runs on a machine whose load moves from second to second.
MIN_HOT_RUNS = 10


def budget(seconds, repeats) -> Budget:
    """The budget of every row of ``python -m bench models`` (vkml's and each peer's),
    from its command-line form (``--seconds``, ``--repeats``; 0 or None: by the time)."""
    return Budget(warmup=1, min_repeats=MIN_HOT_RUNS, max_repeats=50, seconds=float(seconds),
                  repeats=int(repeats or 0) or None, cap=10.0)


def measure(prepare, x: np.ndarray, seconds: str, repeats: str, settle: int = 0,
            files: tuple | None = None) -> tuple:
    """:func:`timed` with the parent's budget in its command-line form."""
    return timed(prepare, x, budget(seconds, repeats), settle, files)


def timed(prepare, x: np.ndarray, budget: Budget, settle: int = 0,
          files: tuple | None = None, between=None) -> tuple:
    """(figures, output): ``prepare()`` returns a function of the input, its seconds
    ``prepare_s``; its first run is timed alone (``first_s``; with ``files`` = (FIG.json,
    Y.npy), recorded there by :func:`partial`), then ``settle`` untimed runs (a tracing
    JIT's capture run, which would otherwise count as a slow warm-up sample), then the
    hot runs within ``budget`` (``hot``: their Stats in ms; ``between``: called after
    each, untimed, as :func:`bench.stats.sample` says).  vkml's own rows and every peer
    time their runs through it."""
    t = time.perf_counter()
    fn = prepare()
    prep = time.perf_counter() - t
    t = time.perf_counter()
    y = fn(x)
    first = time.perf_counter() - t
    if files:
        partial(*files, prep, first, y)
        fn = _marking(fn, files[0], first)
    for _ in range(settle):
        fn(x)
    hot = Stats.of(sample(lambda: fn(x), budget, between))
    return {"prepare_s": prep, "first_s": first, "hot": hot.as_dict()}, y


#: Runs at least this long (the one before, else the first) write their start time to
#: FIG.json (:func:`mark`); shorter ones are left unmarked, since the write would be a
#: noticeable part of their time and they cannot bound a time-out usefully.
MARK_S = 0.5


def _marking(fn, figp: str, first: float):
    """``fn``, each call after a slow one (``MARK_S``) marked in FIG.json first."""
    last = [first]

    def run(x):
        if last[0] >= MARK_S:
            mark(figp, time.time())
        t = time.perf_counter()
        y = fn(x)
        last[0] = time.perf_counter() - t
        return y
    return run


def mark(figp: str, since: float) -> None:
    """Record in the partial FIG.json that a run after the first began at ``since``
    (epoch seconds): a worker stopped by the parent's time limit during it tells the
    parent how long that run had lasted, a lower bound of one warm run."""
    with open(figp) as f:
        fig = json.load(f)
    fig["run_since"] = since
    _write(figp, fig)


def _write(figp: str, fig: dict) -> None:
    """FIG.json replaced whole (a worker killed mid-write leaves the old one)."""
    with open(figp + ".tmp", "w") as f:
        json.dump(fig, f)
    os.replace(figp + ".tmp", figp)


def partial(figp: str, yp: str, prep: float, first: float, y) -> None:
    """FIG.json and Y.npy as they stand after the first run: what the parent reads if
    the worker dies (a driver crash) or runs out of time before :func:`answer` replaces
    them (the parent checks that output too)."""
    np.save(yp, np.asarray(y, np.float32))
    _write(figp, {"absent": f"ended during its hot runs, after prepare {prep:.2f} s and a "
                            f"first run of {first:.2f} s", "prepare_s": prep,
                  "first_s": first})


def answer(figp: str, yp: str, work) -> int:
    """Run ``work()`` -> (figures, output) and write FIG.json and Y.npy, or FIG.json with
    ``{"absent": why}`` when it raised :class:`Absent`."""
    try:
        fig, y = work()
    except Absent as exc:
        fig, y = {"absent": str(exc)}, None
    if y is not None:
        np.save(yp, np.asarray(y, np.float32))
    with open(figp, "w") as f:
        json.dump(fig, f)
    return 0


def same_device(adapter: str, device: str) -> bool:
    """Whether a WebGPU adapter's name is vkml's device (the first word of the Vulkan
    device name, case aside: "llvmpipe", "SwiftShader", a GPU's vendor)."""
    want = device.split(" ")[0].lower()
    return bool(want) and want in adapter.lower()

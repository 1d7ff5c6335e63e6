"""What tuning costs a user: the first ``vkml.convolution`` call on a shape the device has
not seen, timed in fresh processes (``python -m bench.tuning_cost --child``), four ways,
each on a new cache folder where a first process has taken the device's one-time
measurements: it ranked the convolution families
(``vkml.ops.convolution.choice.strong_families``), timed its store width
(``vkml.ops.store_width.wide_stores``) and its concurrent width
(``vkml.ops.concurrent_width``), once per device and folder, reported together as
``rank_ms`` (the same folder state for both modes):

* ``off_cold``: ``VKML_TUNE=off``, the new shape (pipelines compiled, no timing);
* ``fast_cold``: ``VKML_TUNE=fast``, the new shape (its fast list is timed and the choice
  stored);
* ``off_warm`` / ``fast_warm``: a second process on the folder the first left (its pipeline
  cache, and for ``fast`` the stored choice, which must be reused without timing again).

The goals: ``fast_cold`` within 2x of ``off_cold``, and ``fast_warm`` as fast as
``off_warm`` (read as: within 1.25x, the spread of a cold call between processes here).
Each child prints one JSON line: the cold call's milliseconds, the candidate that ran and
the tuning mode; the parent takes the median of ``repeats`` rounds.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

#: A convolution no bench workload uses (so no stored choice covers it), small enough for
#: SwiftShader: 1x48x36x36 -> 40 channels, 3x3, padding 1.
SHAPE = {"input": (1, 48, 36, 36), "filter": (40, 48, 3, 3), "padding": 1}
TARGETS = {"fast_cold_vs_off": 2.0, "fast_warm_vs_off": 1.25}


def _child(index: int) -> dict:
    import numpy as np

    import vkml
    from vkml import dml
    rng = np.random.default_rng(0)
    x = rng.standard_normal(SHAPE["input"], dtype=np.float32)
    w = rng.standard_normal(SHAPE["filter"], dtype=np.float32)
    a = SHAPE["padding"]
    with vkml.Device(index) as dev:
        t = time.perf_counter()
        vkml.convolution(x, w, start_padding=(a, a), end_padding=(a, a), device=dev)
        cold = (time.perf_counter() - t) * 1e3
        n, c, h, wd = SHAPE["input"]
        T = dml.TensorDesc
        desc = dml.ConvolutionOperatorDesc(
            T("float32", SHAPE["input"]), T("float32", SHAPE["filter"]), None,
            T("float32", (n, SHAPE["filter"][0], h, wd)), start_padding=(a, a),
            end_padding=(a, a))
        op = dev.compile_operator(dev.create_operator(desc))
        try:
            chosen = getattr(getattr(op, "path", None), "candidate", None)
        finally:
            op.release()
    return {"cold_ms": cold, "candidate": chosen, "mode": os.environ.get("VKML_TUNE")}


def _rank(index: int) -> dict:
    import importlib

    import vkml
    from vkml.ops.concurrent_width import concurrent_width
    from vkml.ops.store_width import wide_stores
    choice = importlib.import_module("vkml.ops.convolution.choice")
    with vkml.Device(index) as dev:
        t = time.perf_counter()
        strong = choice.strong_families(dev)
        wide = wide_stores(dev)
        width = concurrent_width(dev)
        return {"rank_ms": (time.perf_counter() - t) * 1e3, "strong": list(strong),
                "wide_stores": wide, "concurrent_width": width}


def _spawn(index: int, mode: str, cache: str, what: str = "--child") -> dict:
    env = dict(os.environ, VKML_TUNE=mode, VKML_CACHE_DIR=cache)
    out = subprocess.run([sys.executable, "-m", "bench.tuning_cost", what, str(index)],
                         env=env, capture_output=True, text=True, timeout=600,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if out.returncode != 0:
        raise RuntimeError(f"tuning-cost child ({mode}) failed: "
                           f"{(out.stderr or out.stdout).strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(index: int, repeats: int = 3) -> dict:
    """The four cold-call times (median of ``repeats`` rounds, each round on new folders)
    and their ratios; see the module doc."""
    runs: dict[str, list] = {k: [] for k in ("off_cold", "off_warm", "fast_cold", "fast_warm",
                                             "rank")}
    chosen, strong, wide = {}, [], None
    for _ in range(repeats):
        for mode in ("off", "fast"):
            with tempfile.TemporaryDirectory(prefix="vkml-tuning-cost-") as cache:
                ranked = _spawn(index, "fast", cache, "--rank")
                runs["rank"].append(ranked["rank_ms"])
                strong, wide = ranked["strong"], ranked.get("wide_stores")
                first = _spawn(index, mode, cache)
                second = _spawn(index, mode, cache)
            runs[f"{mode}_cold"].append(first["cold_ms"])
            runs[f"{mode}_warm"].append(second["cold_ms"])
            chosen[mode] = second["candidate"]
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {**{f"{k}_ms": v for k, v in med.items()},
            "fast_cold_vs_off": med["fast_cold"] / med["off_cold"],
            "fast_warm_vs_off": med["fast_warm"] / med["off_warm"],
            "candidate_off": chosen.get("off"), "candidate_fast": chosen.get("fast"),
            "strong_families": strong, "wide_stores": wide,
            "shape": {k: list(v) if isinstance(v, tuple) else v for k, v in SHAPE.items()},
            "repeats": repeats, "targets": dict(TARGETS)}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(_child(int(sys.argv[2]))))
    elif len(sys.argv) == 3 and sys.argv[1] == "--rank":
        print(json.dumps(_rank(int(sys.argv[2]))))
    else:
        print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 0), indent=1))

"""The device's concurrent width: how many workgroups it runs at once, by its own timing
(``glsl/width_probe.comp``).

Every workgroup of the probe does the same fixed work, FMA-dense like a GEMM's inner
loop; a grid of G workgroups takes about one workgroup's time while the device runs
them all at once and longer from there on.  :func:`_sweep` times G = 1, 2, 4, ... and
stops once the time has grown past :data:`GROW` x the smallest grid's (re-timed first
where it grew only a little); the width is the largest grid before that
(:func:`fit`).  lavapipe and SwiftShader run a workgroup a thread (a few), a large GPU
hundreds.  It is a measured model of :mod:`vkml.tuning` (``concurrent_width``, one entry
per device, no feature in its key), measured the first time a choice needs it and
stored with the device's tuning records; ``VKML_TUNE=off`` gives width 0 (nothing is
measured, nothing asks for more workgroups).  The convolution's fast lists offer the
split reductions only where a layer's grid is narrower than this
(``vkml/ops/convolution/choice.py``).
"""
from __future__ import annotations

import time

import numpy as np

from .. import tuning
from ..runtime import Bind
from ..runtime.blocks import pack
from ..tuning import Candidate

#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = {"width_probe": ("LOCAL_SIZE_X", "CHAINS")}
_LOCAL = 64
_CHAINS = 8
#: A workgroup's work (steps of each accumulator) is sized on the device first
#: (:func:`_size`): one workgroup's time at least TARGET_FACTOR x an empty dispatch's and
#: TARGET_S, so that past the width a grid's time grows by nearly a workgroup's and the
#: knee shows.  A CPU driver's second thread starts its share of a grid tens of
#: microseconds late, so workgroups much shorter than TARGET_S read a width of 1 on an
#: idle 2-CPU lavapipe as often as 2; no longer, so that a slow device's sweep stays short
#: (both CPU drivers sweep in about 45 ms).  Steps start at ITERS_MIN and stay within
#: ITERS_MAX (far below lavapipe's 65535-iteration loop limit).
TARGET_S = 500e-6
TARGET_FACTOR = 2
ITERS_MIN = 16
ITERS_MAX = 8192
#: Grids of 1 to 2^16 workgroups (the sweep stops at the first past the width).
POINTS = tuple(Candidate(f"g{1 << i}", {"groups": 1 << i}) for i in range(17))
#: A grid whose time exceeds this factor of the smallest grid's is past the width: one
#: past it runs two waves (2x), a disturbed run of one within it rarely 1.4x.
GROW = 1.4
#: Runs a grid is timed (its time the fastest: load only slows a run down)...
RUNS = 3
#: ...and the runs more a grid just past GROW gets (below GROW * RECHECK) before it
#: ends the sweep.
RECHECK = 1.5
#: Seconds after which the sweep stops whatever it found (a bound, never reached on the
#: devices measured: a CPU driver's sweep ends within a few grids).
MAX_SWEEP_S = 1.0


def _sweep(device, points, run_once) -> dict:
    """``{point: seconds}`` of the grids timed, in increasing size, until one grows past
    :data:`GROW` x the smallest (module doc)."""
    ctx = device.context
    pipe = ctx.pipelines.variant("width_probe", {"LOCAL_SIZE_X": _LOCAL, "CHAINS": _CHAINS})
    y = device.empty((_LOCAL * 4,), np.float32)
    limit = ctx.limits["maxComputeWorkGroupCount"][0]

    def timed(groups: int, iters: int, runs: int = RUNS) -> float:
        """The fastest of ``runs`` runs of a grid (after one untimed warm-up)."""
        seq = device.sequence(timed=True)
        try:
            seq.dispatch(pipe, [Bind(y.allocation, 0, _LOCAL * 16, "w")], (groups, 1, 1),
                         pack("width_probe", "push", iters=iters, seed=1.0))
            return min([run_once(seq) for _ in range(runs + 1)][1:])
        finally:
            seq.close()
    times, start = {}, time.perf_counter()
    try:
        iters = _size(timed)
        for c in sorted(points, key=lambda c: c.params["groups"]):
            g = c.params["groups"]
            if g > limit or time.perf_counter() - start > MAX_SWEEP_S:
                break
            t = timed(g, iters)
            base = min([t] + list(times.values()))
            if GROW * base < t <= RECHECK * GROW * base:
                t = min(t, timed(g, iters))
            times[c.name] = t
            if t > GROW * base:
                break
    finally:
        y.free()
    return times


def _size(timed) -> int:
    """The steps of a probe workgroup, sized on the device (:data:`TARGET_S`) by single
    runs, starting small and multiplied up, so that a slow device never runs a large
    one."""
    empty = timed(1, 0, 1)
    target = max(TARGET_S, TARGET_FACTOR * empty)
    iters = ITERS_MIN
    while True:
        t = timed(1, iters, 1)
        if t >= target or iters >= ITERS_MAX:
            return iters
        grow = target / max(t - empty, t / 16)
        iters = min(ITERS_MAX, int(iters * min(16.0, max(2.0, grow * 1.2))))


def fit(device, times: dict) -> dict:
    """``{"width": workgroups}``: the largest grid timed within :data:`GROW` x the
    fastest grid's time (0 where none was timed).  The sweep ends at the first grid past
    that line, so a smaller grid past it was a disturbed run, not the width."""
    base = min(times.values(), default=0.0)
    return {"width": max((int(n[1:]) for n, t in times.items() if t <= GROW * base),
                         default=0)}


#: The measured model ``concurrent_width`` (keyed by the device alone: no feature
#: changes how many workgroups it runs at once).
MODEL = tuning.register_model("concurrent_width", POINTS, {"width": 0}, fit, None,
                              features_fn=lambda _device: "", measure_fn=_sweep)


def concurrent_width(device) -> int:
    """How many workgroups ``device`` runs at once (module doc): measured once per device
    and stored with its tuning records; 0 with ``VKML_TUNE=off``."""
    return int(tuning.model(device, MODEL).params["width"])

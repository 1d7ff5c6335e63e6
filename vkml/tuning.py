"""One tuner for every operator path: choose among candidates by the device's own measurements.

What: an operator path (a padding's interior copy, a convolution's kernel family, ...)
declares its *candidates* (a name plus parameters: kernel variant, register blocks,
workgroup size, vector width, read path, copy engine or kernel), a *default*, a
*shape-class* function (which shapes share one choice) and a *run* function that records
one candidate's work for one shape into a sequence.  :meth:`Tuner.choose` answers which
candidate to use for (device, path, shape); it measures only when nothing valid is stored.

Why measure, never look at names: the CPU drivers and real GPUs want opposite things
(texel vs SSBO reads, copy engine vs kernel: docs/DEVELOPING.md), and so do two GPUs.

How (the rules a client can rely on):

- Key: device identity (vendor_id, device_id, driver_version, pipeline_cache_uuid; one
  file per device; the file also names the digest of the shipped kernels' sources, and
  one written for other kernels is re-tuned), enabled features (plus any limit lowered by ``Device(limits=...)``;
  or the path's own ``features_fn``), path name, shape class.
- ``VKML_TUNE=off|fast|full`` (default ``fast``; a ``mode=`` argument overrides it):
  ``off`` returns the path's default candidate and reads and writes nothing (the same on
  every run); ``fast`` uses a stored choice, else times the path's fast list within
  :data:`FAST_BUDGET_S` (0.2 s) per shape class; ``full`` times every candidate (and
  re-tunes an entry that did not consider them all).  ``choose(..., force=name)`` returns
  that candidate without timing or storing (tests; no global state).
- Timing: each accepted candidate is recorded once into its own
  ``device.sequence(timed=True)`` and run once to warm up (in fast mode a candidate whose
  first run took :data:`HOPELESS` x the fastest first run plus :data:`FIRST_RUN_SLACK_S`
  is dropped there, its first-run time kept); each left is then run once timed (its timed
  warm-up); then rounds run round robin
  (the order rotated each round), each round running every candidate
  :data:`RUNS_PER_ROUND` times (in ``fast`` mode fewer for long runs,
  :data:`ROUND_RUN_S`).  A run's time is ``seq.gpu_time_ns`` (timestamps) where
  the device has them, else wall time.  Score = the *minimum over rounds of each round's
  median*: the median drops a one-off spike inside a round, the minimum picks the least
  disturbed round, and interleaving makes a burst of load hit all candidates alike.
  ``fast`` stops after the round during which the budget ran out, or where one
  candidate was the fastest by :data:`CLEAR_MARGIN` in every round (at least
  :data:`MIN_ROUNDS`; one for runs of :data:`LONG_RUN_S` and more whose lead held on
  the first runs too), at most :data:`FAST_ROUNDS`, and runs no rounds where one
  candidate is left (its timed warm-up is its time); ``full`` runs
  :data:`FULL_ROUNDS`.  In ``fast`` mode a candidate whose timed warm-up took
  :data:`WARM_CUTOFF` x the fastest one's runs no rounds (one near that line, within
  :data:`WARM_RECHECK` of it, or shorter than :data:`SHORT_RUN_S`, runs once more first;
  every one past it, for a path with ``recheck_cuts``); the entry's ``once`` names the
  candidates dropped on one run.  A
  candidate whose run function raises :class:`Declined` or any ``VkmlError`` (a limit, a
  missing feature) does not take that shape and is skipped.  A path with a
  ``tie_margin`` (:func:`tunable_path`) times the candidates within it of the fastest
  :data:`CLOSE_ROUNDS` rounds more and
  gives a remaining tie to the previous choice, else to the one listed first; the margin
  widens to the timing's own noise (the median over candidates of their slowest round
  median over their fastest), at most to :data:`NOISE_TIE_CAP`, so that what one
  process's load decides is not stored as a choice (the entry's ``margin``).
- Re-checking: :meth:`Tuner.observe` takes the times operators see anyway; when the
  median of the last :data:`STALE_OBSERVATIONS` (8) observations of a candidate differs
  from its stored time (or the ``expected`` time given) by more than
  :data:`STALE_FACTOR` (2x, either way), the entry is marked stale (in memory and on
  disk) and re-tuned at the next ``choose``.  Measurements
  taken under load are thus not kept forever.  A re-tune that finds the stored times
  right after all (the observed shapes, not the measurement, were off) doubles that
  key's factor for the process (:attr:`Tuner.tolerance`): no re-measuring loop.
  ``python -m vkml.tune --refresh`` re-measures on demand (:mod:`vkml.tune`).
- Storage: versioned JSON ``tuning-<vendor>-<device>-<driver>-<uuid>.json`` in
  :func:`vkml.runtime.cache.cache_dir` (beside the pipeline cache; none with
  ``VKML_CACHE_DIR=off``).  Writes take an advisory file lock where the OS has one, merge
  with what is on disk at write time, and replace the file atomically (temp file +
  ``os.replace``, :mod:`vkml.runtime.cache`), so concurrent threads and processes leave
  a valid merged file; files over :data:`vkml.runtime.cache.MAX_BYTES` are not read.  A file
  that is not ours (garbage bytes, another JSON shape, another version or device) and any
  entry with wrong types, NaN, negative or huge (> :data:`MAX_TIME_S`) times is ignored
  and rewritten, never trusted.
  All file access is :func:`_read_json` / :func:`_write_json`.

- Measured models (:func:`measured_model` / :func:`register_model`): where a choice
  depends on the shape so finely that shape classes would each need timing, a path
  declares a cost model instead: a few *points* (candidates that are all timed, by the
  same rounds and score), a ``fit(device, times) -> params`` and a default.  It is stored
  as one entry (shape class :data:`MODEL_CLASS`), refreshed by ``--refresh``, and
  :meth:`Tuner.model` answers the fitted params, memoised in :attr:`Tuner.fitted` per
  key (device identity, features, path).  Re-checking: ``observe(key, name, seconds,
  expected=prediction)`` compares observed times with the model's prediction for the
  shape observed, by the model's own ``stale_factor``.  Padding's choice of path is one
  (:mod:`vkml.ops.calibrate`, key features ``storage8``/``storage16`` only).
- A path's key may name fewer features (``features_fn``): only those that change what
  its candidates do.

A path is registered with :func:`register_path` (``python -m vkml.tune``, :mod:`vkml.tune`,
iterates the registry); :func:`tunable_path` builds one without registering it (tests).
The operators register their paths on import (``vkml.ops``).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from .errors import ValidationError, VkmlError
from .runtime import cache
from .runtime.cache import cache_dir
from .runtime.pipelines import kernels_digest

VERSION = 1
MODES = ("off", "fast", "full")
#: Seconds of timing per shape class in ``fast`` mode (checked after each round).
FAST_BUDGET_S = 0.2
FAST_ROUNDS = 3
FULL_ROUNDS = 5
RUNS_PER_ROUND = 3
#: In fast mode a candidate runs ``RUNS_PER_ROUND`` times a round only while that takes
#: less than this: one whose timed warm-up took ROUND_RUN_S / k runs k times (at least
#: once).  A long run already averages over its length, and the rounds stay interleaved;
#: repeating it only multiplies what a cold first call costs (bench/RESULTS.md).
ROUND_RUN_S = 0.010
#: Rounds a fast tuning takes whatever its budget (the budget may end it after these)...
MIN_ROUNDS = 2
#: ...but for candidates whose timed warm-up each took at least this long, one round
#: (the warm-ups themselves) where one leads by CLEAR_MARGIN there and each other one's
#: first run also took CLEAR_MARGIN x the leader's warm-up (:func:`_clear_at_once`): a
#: run this long already averages over its length, a lagging candidate stays behind on
#: two runs, and a second round of a SwiftShader convolution class is most of its cold
#: start (bench/RESULTS.md, cold start).
LONG_RUN_S = 0.05
#: ...and it ends there too where one candidate was the fastest by this factor in each
#: of them: another round would not change the choice.
CLEAR_MARGIN = 1.2
#: In fast mode a candidate whose first timed run (after an untimed warm-up: a first run
#: carries one-time costs unevenly across candidates) took this many times the fastest
#: one takes no rounds: it would not win them, and they cost the first call.
WARM_CUTOFF = 2.0
#: ...but one within this factor of the cutoff gets a second run first, its time the
#: faster of the two: one disturbed warm-up decides nothing near the line (a cut
#: candidate also leaves every later fast list of the device that ranks families).
WARM_RECHECK = 1.5
#: ...and so does one whose warm-up took less than this, however far past the line: a
#: second run of it costs little, and a short run is the one a stall of the machine
#: multiplies (on this VM's lavapipe a fused squeeze-excitation head's 0.15 ms warm-up
#: once took 1.26 ms, and its shape was stored "apart").
SHORT_RUN_S = 0.002
#: Rounds more for the candidates within a path's ``tie_margin`` of the fastest (a close
#: call is timed again before the tie rule decides it; fast mode too).
CLOSE_ROUNDS = 2
#: A path's ``tie_margin`` widens to the timing's own noise (:func:`_noise`: how far one
#: candidate's round medians disagree with each other), at most to this factor: on a
#: loaded CPU driver the same candidates time 1.5x and more apart from one process to
#: the next, and a lead smaller than that spread picked whichever the load favoured, a
#: different kernel in each process (bench/RESULTS.md, "Whole models").  A quiet timing
#: keeps the path's own margin, so a real lead there still wins.
NOISE_TIE_CAP = 1.3
#: In fast mode a candidate whose first run took this many times the fastest first run,
#: plus FIRST_RUN_SLACK_S, gets no timed run at all: it is dropped like a slow warm-up,
#: its first-run time kept.  A first run carries one-time costs (on lavapipe a
#: pipeline's first dispatch costs tens of ms more than the next, and a loaded machine
#: can stall one run far longer), which the slack covers with room to spare; what this
#: saves is the second run of a candidate seconds slower than the best, which
#: SwiftShader's fast lists have on its larger layers (bench/RESULTS.md).
HOPELESS = 2 * WARM_CUTOFF
FIRST_RUN_SLACK_S = 0.5
#: An observed median this many times off the stored time (either way) marks it stale...
STALE_FACTOR = 2.0
#: ...over this many observations.
STALE_OBSERVATIONS = 8
_perf = time.perf_counter


def _clear(medians: list[list[float]]) -> bool:
    """Whether one candidate was the fastest by :data:`CLEAR_MARGIN` in every round so
    far (``medians``: each candidate's round medians)."""
    best = None
    for r in range(len(medians[0])):
        order = sorted(range(len(medians)), key=lambda i: medians[i][r])
        if best is None:
            best = order[0]
        if order[0] != best or (len(order) > 1 and medians[order[1]][r]
                                < CLEAR_MARGIN * medians[best][r]):
            return False
    return True


class Declined(Exception):
    """Raised by a run function: this candidate does not take this shape."""


@dataclass(frozen=True)
class Candidate:
    """One way to run a path: ``name`` (unique in the path), ``params`` (what the path
    needs to build it), ``fast`` (in the short list ``VKML_TUNE=fast`` times)."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    fast: bool = True


@dataclass(frozen=True)
class TunablePath:
    """An operator path the tuner chooses for; see :func:`tunable_path`."""

    name: str
    candidates: tuple
    default: str
    shape_class: Callable[[Any], str]
    run: Callable
    examples: tuple = ()
    from_workload: Callable | None = None
    #: ``features(device) -> str``: the key's feature part (None: :func:`_features`).
    features: Callable | None = None
    #: A measured model (:func:`measured_model`): ``fit(device, times) -> params``...
    fit: Callable | None = None
    #: ...and the params ``VKML_TUNE=off`` (or a device that declines every point) uses.
    default_model: Mapping | None = None
    #: How far observed times may drift before a re-check (None: the tuner's).
    stale_factor: float | None = None
    #: ``fast_fn(shape, device) -> names``: the fast list of one shape (None: the
    #: candidates marked ``fast``).
    fast_fn: Callable | None = None
    #: ``work_fn(shape) -> float``: a shape's work (FLOPs, bytes), so that a time stored
    #: for one shape of a class predicts another's (:meth:`Tuner.expected`).
    work: Callable | None = None
    #: Times within this factor of the fastest are a tie, which goes to the entry's
    #: previous choice, else to the candidate listed first (1.0: the fastest wins).
    tie_margin: float = 1.0
    #: ``prefetch_fn(device, candidate, shape)``: start the candidate's pipelines
    #: compiling without waiting for them (:func:`_prefetch`; None: the path has none).
    prefetch: Callable | None = None
    #: Fast mode gives every candidate cut after its timed warm-up a second run (its
    #: time the faster of the two), not only those near the line: a device-wide
    #: ranking whose times other choices read (:func:`tunable_path`).
    recheck_cuts: bool = False
    #: A measured model's own sweep (:func:`measured_model`'s ``measure_fn``) instead of
    #: timing every point in rounds.
    measure: Callable | None = None

    @property
    def is_model(self) -> bool:
        return self.fit is not None

    def candidate(self, name: str) -> Candidate:
        for c in self.candidates:
            if c.name == name:
                return c
        raise ValidationError("force", f"{self.name!r} has no candidate {name!r} (it has "
                              f"{', '.join(c.name for c in self.candidates)})")

    def listed(self, mode: str, shape=None, device=None) -> tuple:
        """The candidates ``mode`` times: every one for full, the fast list for fast (the
        shape's, where the path has a ``fast_fn``; the default alone where no candidate
        is marked fast)."""
        if mode == "full":
            return self.candidates
        if self.fast_fn is not None and shape is not None:
            names = dict.fromkeys(self.fast_fn(shape, device))
            return tuple(self.candidate(n) for n in names) or (self.candidate(self.default),)
        return tuple(c for c in self.candidates if c.fast) or (self.candidate(self.default),)


def io_elements(shape) -> float:
    """Elements read and written by a shape given as ``{"in": [sizes, strides], "out":
    [sizes, strides], ...}`` (a ``work_fn`` for memory-bound paths)."""
    return float(math.prod(shape["in"][0]) + math.prod(shape["out"][0]))


def tunable_path(name: str, candidates, default: str, shape_class_fn, run_fn, *,
                 examples=(), from_workload=None, features_fn=None,
                 fast_fn=None, work_fn=None, tie_margin: float = 1.0,
                 prefetch_fn=None, recheck_cuts: bool = False) -> TunablePath:
    """Declare a path (without registering it).

    ``candidates``: :class:`Candidate` objects, names, or (name, params[, fast]) tuples.
    ``default``: the candidate ``VKML_TUNE=off`` uses (and the baseline of "speedup").
    ``shape_class_fn(shape) -> str``: shapes with one class share one choice.
    ``run_fn(device, seq, candidate, shape)`` records the candidate's work for ``shape``
    into ``seq`` (a timed sequence, replayed several times) and returns None or a
    callable that frees what it allocated (called after timing); it raises
    :class:`Declined` (or a ``VkmlError``) where the candidate does not take the shape,
    freeing what it allocated first.
    ``examples``: shapes ``python -m vkml.tune`` tunes when given no workloads (shapes
    should be JSON values, so ``--refresh`` can re-measure stored ones).
    ``from_workload(dict) -> shape | None``: a bench workload (bench/workloads/*.json)
    as this path's shape, None where it does not use this path.
    ``features_fn(device) -> str``: the features that change this path's candidates (the
    key's feature part; default: every enabled feature and every lowered limit).
    ``fast_fn(shape, device) -> candidate names``: the fast list of one shape (e.g. a
    heuristic's choice and its runner-ups), instead of the candidates marked ``fast``.
    ``work_fn(shape) -> float``: the work of a shape (FLOPs, bytes), proportional to its
    time on one candidate; lets sampled executions of other shapes of a class re-check
    the stored time (:meth:`Tuner.expected`).
    ``tie_margin``: candidates timed within this factor of the fastest are re-timed
    (:data:`CLOSE_ROUNDS`) and, still within it, tie: the choice is the entry's previous
    one if among them, else the first of them in the listed order (a heuristic's choice
    first in a fast list).  Noise-level differences then pick the same candidate in
    every process instead of whichever the load favoured.
    ``prefetch_fn(device, candidate, shape)``: request the candidate's pipelines without
    waiting for them (e.g. build its operator inside ``PipelineCache.batch`` and release
    it), so that a fast list's candidates compile side by side (:func:`_prefetch`).
    ``recheck_cuts``: in fast mode every candidate cut for a slow timed warm-up runs once
    more first (its time the faster run), so that only the first-run cuts
    (:data:`HOPELESS`) stay one-run times (the entry's ``once``): for a ranking whose
    times decide other paths' fast lists, where one disturbed run would otherwise rank
    a family out for the device.
    """
    if not tie_margin >= 1.0:
        raise ValidationError("tie_margin", f"{name}: must be at least 1, got {tie_margin!r}")
    cands = []
    for c in candidates:
        if isinstance(c, str):
            c = Candidate(c)
        elif not isinstance(c, Candidate):
            c = Candidate(*c)
        cands.append(c)
    names = [c.name for c in cands]
    if not cands or len(set(names)) != len(names):
        raise ValidationError("candidates", f"{name}: need at least one, names unique ({names})")
    if default not in names:
        raise ValidationError("default", f"{name}: {default!r} is not one of {names}")
    return TunablePath(name, tuple(cands), default, shape_class_fn, run_fn, tuple(examples),
                       from_workload, features_fn, fast_fn=fast_fn, work=work_fn,
                       tie_margin=float(tie_margin), prefetch=prefetch_fn,
                       recheck_cuts=bool(recheck_cuts))


#: The one shape class of a measured model: it covers every shape of its operator.
MODEL_CLASS = "device"


def measured_model(name: str, points, default_model: Mapping, fit_fn, run_fn, *,
                   features_fn=None, stale_factor: float | None = None,
                   from_workload=None, measure_fn=None) -> TunablePath:
    """Declare a *measured model* (without registering it): a cost model whose parameters
    are fitted to a few timed *points*, so one measurement per device covers every shape.

    The points are candidates that are all timed (never "chosen"): the same interleaved
    rounds and robust score as any path, stored as one entry of shape class
    :data:`MODEL_CLASS`, re-measured by ``--refresh``, marked stale by :meth:`Tuner.observe`
    with ``expected=`` (the model's prediction for the shape observed).
    ``run_fn(device, seq, point, shape)`` (shape: :data:`MODEL_CLASS`) records a point (as a path's run function).
    ``fit_fn(device, {point: seconds}) -> params`` (JSON values; points that declined are
    absent).  ``default_model``: the params ``VKML_TUNE=off`` gives, the same on every run.
    :meth:`Tuner.model` answers the fitted params.
    ``measure_fn(device, points, run_once) -> {point: seconds}``: a sweep that times the
    points it needs itself (``run_once(seq)``: one timed run of a sequence, as the rounds
    time them) and stops where it has its answer, instead of every point in rounds
    (whose largest points can cost far more than the answer needs); the points it left
    out are stored as declined.  ``run_fn`` is then unused (None).
    """
    p = tunable_path(name, [Candidate(c.name, c.params) if isinstance(c, Candidate) else c
                            for c in points], _first_name(points), lambda _shape: MODEL_CLASS,
                     run_fn, examples=(MODEL_CLASS,), from_workload=from_workload,
                     features_fn=features_fn)
    cands = tuple(replace(c, fast=True) for c in p.candidates)   # all timed
    return replace(p, candidates=cands, fit=fit_fn, default_model=dict(default_model),
                   stale_factor=stale_factor, measure=measure_fn)


def _first_name(points) -> str:
    first = next(iter(points), None)
    if isinstance(first, Candidate):
        return first.name
    return first if isinstance(first, str) else first[0]


_REGISTRY: dict[str, TunablePath] = {}
_REGISTRY_LOCK = threading.Lock()


def register_path(name: str, candidates, default: str, shape_class_fn, run_fn, **kw) -> TunablePath:
    """:func:`tunable_path`, registered under ``name`` (a later registration replaces it)."""
    return _register(tunable_path(name, candidates, default, shape_class_fn, run_fn, **kw))


def register_model(name: str, points, default_model, fit_fn, run_fn, **kw) -> TunablePath:
    """:func:`measured_model`, registered under ``name``."""
    return _register(measured_model(name, points, default_model, fit_fn, run_fn, **kw))


def _register(p: TunablePath) -> TunablePath:
    with _REGISTRY_LOCK:
        _REGISTRY[p.name] = p
    return p


def registered_paths() -> dict[str, TunablePath]:
    with _REGISTRY_LOCK:
        return dict(_REGISTRY)


class TuneKey(NamedTuple):
    """What one stored choice is for (``device``: the file stem of the device identity)."""

    device: str
    features: str
    path: str
    shape_class: str


@dataclass(frozen=True)
class Choice:
    """The answer of :meth:`Tuner.choose`.

    ``source``: "measured" (timed now), "stored" (from memory or disk), "default"
    (mode off, or no candidate took the shape), "forced".  ``times``: the scores of the
    candidates timed (seconds), ``seconds`` the chosen one's (None when not timed)."""

    path: str
    candidate: Candidate
    key: TuneKey
    source: str
    seconds: float | None = None
    times: Mapping[str, float] = field(default_factory=dict, compare=False)
    default: str = ""

    @property
    def name(self) -> str:
        return self.candidate.name

    @property
    def params(self) -> Mapping[str, Any]:
        return self.candidate.params

    def runner_up(self) -> tuple[str, float] | None:
        rest = sorted((t, n) for n, t in self.times.items() if n != self.name)
        return (rest[0][1], rest[0][0]) if rest else None

    def speedup(self) -> float | None:
        """Default's time over the chosen one's (None when the default was not timed)."""
        d = self.times.get(self.default)
        return d / self.seconds if d and self.seconds else None


@dataclass(frozen=True)
class Model:
    """The answer of :meth:`Tuner.model`: ``params`` fitted to the stored (or just
    measured) point ``times``, or the path's default (``source`` "default": mode off, or
    no point could be timed)."""

    path: str
    params: Mapping[str, Any]
    key: TuneKey
    source: str
    times: Mapping[str, float] = field(default_factory=dict, compare=False)


# -- identity --------------------------------------------------------------------------

def _stem(info) -> str:
    return (f"tuning-{info.vendor_id:04x}-{info.device_id:04x}-{info.driver_version:08x}-"
            f"{info.pipeline_cache_uuid}")


def _identity(info) -> dict:
    return _identity_of(_stem(info))


def _identity_of(stem: str) -> dict:
    """The identity a file stem (:func:`_stem`) names, with the digest of the kernels this
    vkml ships (:func:`~vkml.runtime.pipelines.kernels_digest`): times measured on other
    kernels (another vkml version) are not trusted, the file is re-tuned and rewritten."""
    _, vendor, device, driver, uuid = stem.split("-")
    return {"vendor_id": int(vendor, 16), "device_id": int(device, 16),
            "driver_version": int(driver, 16), "pipeline_cache_uuid": uuid,
            "kernels": kernels_digest()}


def _features(device) -> str:
    """Enabled features, plus limits lowered by ``Device(limits=...)``: both change which
    candidates a device takes and what they cost."""
    ctx = device.context
    out = sorted(k for k, v in ctx.features.items() if v)
    out += sorted(f"{k}={v}" for k, v in ctx.limits.items() if v != ctx.info.limits.get(k))
    return ",".join(out)


# -- file access (vkml.runtime.cache: size cap, no FIFOs, atomic replace) ---------------

def _doc_ok(raw: dict) -> bool:
    """The outer shape of a tuning file (entries are checked one by one in :func:`_parse`)."""
    return (set(raw) == {"version", "kind", "device", "entries"}
            and raw["kind"] == "vkml-tuning" and isinstance(raw["device"], dict)
            and isinstance(raw["entries"], dict))


def _read_json(path: Path):
    """The tuning document in ``path``, or None (absent, unreadable, oversized, not JSON,
    another version or shape): :func:`vkml.runtime.cache.read_json`."""
    return cache.read_json(path, VERSION, _doc_ok)


_WRITE_LOCK = threading.Lock()


def _write_json(path: Path, update: Callable[[Any], Any]) -> Any:
    """Replace ``path`` by ``update(what is on disk now, or None)`` under an advisory lock
    (``<path>.lock``), so concurrent writers merge instead of losing updates; the write
    itself is :func:`vkml.runtime.cache.write_json` (temp file + ``os.replace``).
    Returns what was written (None when the folder cannot be written)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _WRITE_LOCK, open(path.with_suffix(".lock"), "a+b") as lock:
            _lock_file(lock)
            data = update(_read_json(path))
            return data if cache.write_json(path, VERSION, data) else None
    except OSError:
        return None                # a read-only cache folder is no reason to fail


def _lock_file(f) -> None:
    try:
        import fcntl
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)      # released when the file closes
    except ImportError:
        try:
            import msvcrt
            msvcrt.locking(f.fileno(), msvcrt.LK_LOCK, 1)
        except (ImportError, OSError):
            pass        # no lock: os.replace still keeps the file whole


# -- validation of what is read ---------------------------------------------------------

#: The longest time a tuning file may hold (seconds): measured ones are micro- to
#: milliseconds, so anything above is corrupt.
MAX_TIME_S = 3600.0


def _time_ok(t) -> bool:
    """A finite number of seconds in [0, MAX_TIME_S] (huge ints too: no overflow)."""
    return cache.is_number(t, 0.0, MAX_TIME_S)


def _entry_ok(e) -> bool:
    if not isinstance(e, dict):
        return False
    times, declined = e.get("times"), e.get("declined", [])
    return (isinstance(times, dict) and times and all(isinstance(k, str) and _time_ok(v)
                                                      for k, v in times.items())
            and isinstance(e.get("choice"), str) and e["choice"] in times
            and _time_ok(e.get("seconds")) and e["seconds"] == times[e["choice"]]
            and isinstance(declined, list) and all(isinstance(d, str) for d in declined)
            and isinstance(e.get("stale", False), bool)
            and isinstance(e.get("rounds"), int) and not isinstance(e["rounds"], bool)
            and e["rounds"] >= 1 and e.get("mode") in ("fast", "full")
            and cache.is_number(e.get("measured_at"), 0.0, 1e11))


def _parse(raw, identity: dict) -> dict:
    """``{(features, path, shape class): entry}`` of a file's contents; {} for anything
    that is not a version-:data:`VERSION` file of this device; bad entries dropped."""
    out = {}
    if (not isinstance(raw, dict) or raw.get("version") != VERSION
            or raw.get("device") != identity or not isinstance(raw.get("entries"), dict)):
        return out
    for feats, paths in raw["entries"].items():
        if not isinstance(paths, dict):
            continue
        for pname, classes in paths.items():
            if not isinstance(classes, dict):
                continue
            for cls, e in classes.items():
                if _entry_ok(e):
                    out[(feats, pname, cls)] = e
    return out


def _document(entries: dict, identity: dict) -> dict:
    tree: dict = {}
    for (feats, pname, cls), e in entries.items():
        tree.setdefault(feats, {}).setdefault(pname, {})[cls] = e
    return {"version": VERSION, "kind": "vkml-tuning", "device": identity, "entries": tree}


# -- the tuner --------------------------------------------------------------------------

def _mode_from_env() -> str:
    mode = os.environ.get("VKML_TUNE", "fast").strip().lower() or "fast"
    if mode not in MODES:
        raise ValidationError("VKML_TUNE", f"must be off, fast or full, got {mode!r}")
    return mode


class Tuner:
    """Chooses candidates and keeps the choices (in memory and in the cache folder).

    ``mode``: "off" | "fast" | "full", or None for ``$VKML_TUNE`` at each call.
    ``folder``: where the files live (None: ``cache_dir()`` at each use; "off": memory
    only).  ``budget_s``: fast mode's time per shape class; ``rounds``: overrides
    :data:`FAST_ROUNDS` / :data:`FULL_ROUNDS`.  Thread safe; one measurement per key
    at a time.
    """

    def __init__(self, mode: str | None = None, *, folder=None, budget_s: float = FAST_BUDGET_S,
                 rounds: int | None = None, stale_factor: float = STALE_FACTOR,
                 stale_observations: int = STALE_OBSERVATIONS):
        if mode is not None and mode not in MODES:
            raise ValidationError("mode", f"must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.folder = folder
        self.budget_s = budget_s
        self.rounds = rounds
        self.stale_factor = stale_factor
        self.stale_observations = stale_observations
        self._lock = threading.RLock()
        self._entries: dict[str, dict] = {}          # device stem -> {(f, p, c): entry}
        self._key_locks: dict[TuneKey, threading.Lock] = {}
        self._measuring = threading.local()          # .keys: what this thread measures now
        self._observed: dict[tuple, list] = {}
        #: ``{TuneKey: (point times, params)}``: the fits :meth:`model` made (the per-
        #: device store of measured models; a key names the device and its features).
        self.fitted: dict[TuneKey, tuple] = {}
        #: ``{TuneKey: multiplier}`` of the stale factor, doubled each time a re-measure
        #: that observations asked for found the stored times right after all.
        self.tolerance: dict[TuneKey, float] = {}

    # -- where -------------------------------------------------------------------------
    def _file(self, stem: str) -> Path | None:
        folder = self.folder
        if folder is None:
            folder = cache_dir()
        elif isinstance(folder, str) and folder.lower() == "off":
            folder = None
        return None if folder is None else Path(folder) / f"{stem}.json"

    def _load(self, stem: str, reload: bool = False) -> dict:
        with self._lock:
            mem = self._entries.get(stem)
            if mem is not None and not reload:
                return mem
            path = self._file(stem)
            disk = _parse(_read_json(path), _identity_of(stem)) if path else {}
            mem = self._entries.setdefault(stem, {})
            for k, e in disk.items():
                mine = mem.get(k)
                if mine is None or e["measured_at"] >= mine["measured_at"]:
                    mem[k] = e
            return mem

    def _store(self, key: TuneKey, change: Callable[[dict], dict | None]) -> None:
        """Apply ``change(entry on disk or None) -> new entry or None`` to ``key``'s entry
        on disk (merged with the rest of the file) and in memory."""
        sub = key[1:]
        path = self._file(key.device)
        identity = _identity_of(key.device)
        if path is not None:
            def update(raw):
                entries = _parse(raw, identity)
                new = change(entries.get(sub))
                if new is not None:
                    entries[sub] = new
                return _document(entries, identity)

            written = _write_json(path, update)
            if written is not None:
                with self._lock:
                    self._entries[key.device] = _parse(written, identity)
                return
        with self._lock:
            mem = self._entries.setdefault(key.device, {})
            new = change(mem.get(sub))
            if new is not None:
                mem[sub] = new

    # -- public ------------------------------------------------------------------------
    def effective_mode(self, mode: str | None = None) -> str:
        """The mode a :meth:`choose` with ``mode`` would use (``mode``, the tuner's, or
        ``$VKML_TUNE``): callers skip their tuning set-up where it is "off"."""
        mode = mode or self.mode or _mode_from_env()
        if mode not in MODES:
            raise ValidationError("mode", f"must be one of {MODES}, got {mode!r}")
        return mode

    def key(self, device, path, shape) -> TuneKey:
        p = _resolve(path)
        feats = p.features(device) if p.features is not None else _features(device)
        return TuneKey(_stem(device.info), feats, p.name, str(p.shape_class(shape)))

    def stored(self, device) -> list[tuple[str, Any]]:
        """(path, shape) of every entry stored for ``device`` and its features that
        recorded its shape (``--refresh`` re-measures them)."""
        stem, paths = _stem(device.info), registered_paths()

        def feats(pname):
            p = paths.get(pname)
            return p.features(device) if p is not None and p.features else _features(device)
        with self._lock:
            entries = self._load(stem, reload=True)
            return [(pname, e["shape"]) for (f, pname, _), e in sorted(entries.items())
                    if f == feats(pname) and "shape" in e]

    def lookup(self, key: TuneKey) -> dict | None:
        """The stored entry of ``key`` (a copy), or None."""
        with self._lock:
            e = self._load(key.device).get(key[1:])
            return None if e is None else dict(e)

    def choose(self, device, path, shape, *, mode: str | None = None, force: str | None = None,
               refresh: bool = False) -> Choice:
        """The candidate of ``path`` (a registered name or a :class:`TunablePath`) for
        ``shape`` on ``device``: forced, stored, or measured now (see the module doc).
        ``refresh`` re-measures even when a valid choice is stored."""
        p = _resolve(path)
        key = self.key(device, p, shape)
        if force is not None:
            return Choice(p.name, p.candidate(force), key, "forced", default=p.default)
        mode = self.effective_mode(mode)
        if mode == "off":
            return Choice(p.name, p.candidate(p.default), key, "default", default=p.default)
        listed = p.listed(mode, shape, device)
        if not refresh:
            found = self._usable(p, key, listed, reload=False)
            if found is not None:
                return found
        measuring = self._measuring.__dict__.setdefault("keys", set())
        if key in measuring:
            # asked again while timing one of this key's candidates (building it asks its
            # own path): the default, since waiting on the key's lock would never end
            return Choice(p.name, p.candidate(p.default), key, "default", default=p.default)
        with self._lock:
            klock = self._key_locks.setdefault(key, threading.Lock())
        with klock:
            if not refresh:            # another thread or process may have tuned it
                found = self._usable(p, key, listed, reload=True)
                if found is not None:
                    return found
            old = self.lookup(key)
            measuring.add(key)
            try:
                with _unrecorded(device):
                    entry = self._measure(device, p, shape, listed, mode,
                                          old.get("choice") if old else None)
            finally:
                measuring.discard(key)
            if entry is None:
                return Choice(p.name, p.candidate(p.default), key, "default", default=p.default)
            if old is not None and old.get("stale"):
                self._recheck_found(key, p, old["times"], entry["times"])
            self._store(key, lambda _old: entry)
            with self._lock:
                self._observed = {k: v for k, v in self._observed.items() if k[0] != key}
            return Choice(p.name, p.candidate(entry["choice"]), key, "measured",
                          entry["seconds"], dict(entry["times"]), p.default)

    def _recheck_found(self, key: TuneKey, p: TunablePath, old: dict, new: dict) -> None:
        """After a re-measure that observations asked for: when the new times agree with
        the old ones (median ratio within the factor), the disagreement was the shapes',
        not the measurement's (a model that fits some shape poorly), so this process
        doubles the key's tolerance instead of re-measuring again and again."""
        ratios = [new[n] / old[n] for n in new if old.get(n)]
        factor = p.stale_factor or self.stale_factor
        if ratios and 1 / factor <= statistics.median(ratios) <= factor:
            with self._lock:
                self.tolerance[key] = self.tolerance.get(key, 1.0) * 2

    def _usable(self, p: TunablePath, key: TuneKey, listed, reload: bool) -> Choice | None:
        with self._lock:
            e = self._load(key.device, reload).get(key[1:])
        if e is None or e.get("stale"):
            return None
        names = {c.name for c in p.candidates}
        considered = set(e["times"]) | set(e.get("declined", ()))
        if e["choice"] not in names or not {c.name for c in listed} <= considered:
            return None                # the path changed since, or fast ran before full
        return Choice(p.name, p.candidate(e["choice"]), key, "stored", e["seconds"],
                      dict(e["times"]), p.default)

    def model(self, device, path, *, mode: str | None = None,
              refresh: bool = False) -> Model:
        """The params of the measured model ``path`` (:func:`measured_model`) on
        ``device``: fitted to its stored point times, measured now where none are stored
        (or they are stale), the path's default in mode off.  Fits are kept in
        :attr:`fitted` (one per key: device identity, features, path), so asking again is
        a dictionary look-up."""
        p = _resolve(path)
        if not p.is_model:
            raise ValidationError("path", f"{p.name!r} is not a measured model")
        c = self.choose(device, p, MODEL_CLASS, mode=mode, refresh=refresh)
        if c.source == "default":
            return Model(p.name, p.default_model, c.key, "default")
        times = tuple(sorted(c.times.items()))
        with self._lock:
            memo = self.fitted.get(c.key)
        if memo is None or memo[0] != times:
            memo = (times, p.fit(device, dict(times)))
            with self._lock:
                self.fitted[c.key] = memo
        return Model(p.name, memo[1], c.key, c.source, dict(times))

    def expected(self, choice: Choice, shape, path=None) -> float | None:
        """The time ``choice`` (measured or stored) predicts for ``shape`` of its class:
        the stored time where ``shape`` is the one timed, else that time scaled by the
        path's work (``work_fn``) of the two shapes; None where it cannot tell.
        ``path``: the :class:`TunablePath` (default: the one registered by its name)."""
        if choice.source not in ("measured", "stored") or not choice.seconds:
            return None
        e = self.lookup(choice.key)
        timed = e.get("shape") if e is not None else None
        if timed is None:
            return None
        if timed == shape:
            return choice.seconds
        p = path if path is not None else _resolve(choice.path)
        if p.work is None:
            return None
        try:
            w0, w1 = float(p.work(timed)), float(p.work(shape))
        except Exception:              # noqa: BLE001  (a stored shape that no longer parses)
            return None
        return choice.seconds * w1 / w0 if w0 > 0 and w1 > 0 else None

    def observe(self, key: TuneKey, candidate: str, seconds: float, *,
                expected: float | None = None, factor: float | None = None) -> bool:
        """Record a time an operator saw for ``candidate`` under ``key`` (cheap: a list
        append).  It is compared with ``expected`` (a measured model's prediction for the
        shape observed) or else the candidate's stored time.  Marks the entry stale, and
        returns True, when the median ratio of the last ``stale_observations`` is off by
        more than ``factor`` (default: the tuner's ``stale_factor``), either way; the
        next :meth:`choose` then re-tunes."""
        if not _time_ok(seconds) or (expected is not None and not _time_ok(expected)):
            return False
        if factor is None:
            p = registered_paths().get(key.path)
            factor = (p.stale_factor if p is not None else None) or self.stale_factor
        factor *= self.tolerance.get(key, 1.0)
        with self._lock:
            e = self._entries.get(key.device, {}).get(key[1:])
            if e is None or e.get("stale"):
                return False
            ref = expected if expected is not None else e["times"].get(candidate)
            if not ref:
                return False
            obs = self._observed.setdefault((key, candidate), [])
            obs.append(float(seconds) / ref)
            if len(obs) < self.stale_observations:
                return False
            ratio = statistics.median(obs[-self.stale_observations:])
            self._observed.pop((key, candidate), None)
            if 1 / factor <= ratio <= factor:
                return False
            stamp = e["measured_at"]

        def mark(old):
            if old is None or old["measured_at"] != stamp:
                return None            # re-tuned meanwhile by someone else: leave it
            return {**old, "stale": True}

        self._store(key, mark)
        with self._lock:               # memory-only folder, or a write that failed
            mem = self._entries.get(key.device, {})
            if key[1:] in mem and mem[key[1:]]["measured_at"] == stamp:
                mem[key[1:]] = {**mem[key[1:]], "stale": True}
        return True

    # -- measuring ---------------------------------------------------------------------
    def _measure(self, device, p: TunablePath, shape, listed, mode: str,
                 previous: str | None = None) -> dict | None:
        """Time ``listed`` for ``shape`` (module doc, "Timing"); the entry to store, or
        None where every candidate declined.  ``previous``: the entry's earlier choice
        (a tie goes to it, :func:`tunable_path`'s ``tie_margin``)."""
        if p.measure is not None:
            return _swept(device, p, listed, mode)
        fast = mode == "fast"
        rounds = self.rounds or (FULL_ROUNDS if mode == "full" else FAST_ROUNDS)
        t0 = _perf()
        timed, declined, dropped, once = [], [], {}, set()
        _prefetch(device, p, listed, shape)
        try:
            for c in listed:
                t = _Timed.prepare(device, p, c, shape)
                if t is None:
                    declined.append(c.name)
                else:
                    timed.append(t)
            if not timed:
                return None
            if fast:
                dropped = _cut_hopeless(timed)
                once = set(dropped)
            for t in timed:
                t.warm = _run_once(t.seq)
            if fast:
                slow, single = _cut_slow(timed, p.recheck_cuts)
                dropped.update(slow)
                once |= single
            done = _rounds(timed, rounds, self.budget_s if fast else None,
                           at_once=not p.recheck_cuts)
            _retime_close(timed, _margin(timed, p), fast)
        finally:
            for t in timed:
                t.close()
        times = {t.candidate.name: min(t.medians) for t in timed}
        margin = _margin(timed, p)
        choice = _pick(times, p, previous, margin)
        return {"choice": choice, "seconds": times[choice], "times": {**dropped, **times},
                "margin": margin,
                "dropped": sorted(dropped), "once": sorted(once),
                "declined": declined, "rounds": done, "mode": mode, "stale": False,
                "measured_at": time.time(), "elapsed_s": _perf() - t0,
                **({"shape": shape} if _jsonable(shape) else {})}


def _swept(device, p: TunablePath, listed, mode: str) -> dict | None:
    """The entry of a measured model timed by its own sweep (``p.measure``): the points
    it timed, the others declined; its "choice" is the fastest point (the fit reads the
    times, not the choice)."""
    t0 = _perf()
    times = {n: float(t) for n, t in p.measure(device, listed, _run_once).items()}
    if not times:
        return None
    choice = _pick(times, p, None)
    return {"choice": choice, "seconds": times[choice], "times": times,
            "declined": [c.name for c in listed if c.name not in times], "rounds": 1,
            "mode": mode, "stale": False, "measured_at": time.time(),
            "elapsed_s": _perf() - t0, "shape": MODEL_CLASS}


def _unrecorded(device):
    """The candidates' pipelines are left out of the device's pipeline recordings
    (``PipelineCache.unrecorded``): a later process prefetches only those it keeps."""
    pipelines = getattr(getattr(device, "context", None), "pipelines", None)
    return pipelines.unrecorded() if pipelines is not None else contextlib.nullcontext()


def _prefetch(device, p: TunablePath, listed, shape) -> None:
    """Start compiling every listed candidate's pipelines before the first is recorded
    (the path's ``prefetch``).  Recording a candidate waits for its own pipelines, so
    without this they compile one candidate at a time, on one compile thread while the
    others idle.  Timing is unchanged: a timed sequence's run waits until no compilation
    is in flight (``Sequence.run``).  A candidate that declines or fails here is left to
    its run function, which declines it or raises as before (``PipelineCache.prefetching``:
    a failed creation reaches only the run that uses it)."""
    if p.prefetch is None or len(listed) < 2:
        return
    with device.context.pipelines.prefetching():
        for c in listed:
            try:
                p.prefetch(device, c, shape)
            except (Declined, VkmlError):
                continue


@dataclass
class _Timed:
    """One candidate being timed: its recorded sequence, what frees its buffers, its first
    run (``first``, seconds: one-time costs included), its timed warm-up run (``warm``)
    and its round medians."""

    candidate: Candidate
    seq: Any
    cleanup: Callable | None
    first: float
    warm: float = math.inf
    medians: list = field(default_factory=list)

    @classmethod
    def prepare(cls, device, p: TunablePath, c: Candidate, shape) -> "_Timed | None":
        """Record ``c`` for ``shape`` and run it once (its first run, one-time costs
        included); None where it declines the shape (:class:`Declined` or a
        ``VkmlError``)."""
        seq = device.sequence(timed=True)
        cleanup = None
        try:
            cleanup = p.run(device, seq, c, shape)
            return cls(c, seq, cleanup, _first_run(seq))
        except (Declined, VkmlError):
            _free(seq, cleanup)
            return None
        except BaseException:
            _free(seq, cleanup)
            raise

    def close(self) -> None:
        _free(self.seq, self.cleanup)


def _free(seq, cleanup) -> None:
    seq.close()
    if cleanup is not None:
        cleanup()


def _cut_hopeless(timed: list) -> dict:
    """Fast mode: drop (and free), before their timed warm-up, the candidates whose first
    run took more than :data:`HOPELESS` x the fastest first run plus
    :data:`FIRST_RUN_SLACK_S`; their first-run time is kept (``{name: seconds}``,
    "considered", never chosen).  The fastest first run includes its own one-time costs,
    so the line only moves up from them."""
    if len(timed) < 2:
        return {}
    line = HOPELESS * min(t.first for t in timed) + FIRST_RUN_SLACK_S
    dropped = {}
    for t in [t for t in timed if t.first > line]:
        timed.remove(t)
        t.close()
        dropped[t.candidate.name] = t.first
    return dropped


def _cut_slow(timed: list, recheck_all: bool = False) -> tuple[dict, set]:
    """Fast mode: drop (and free) the candidates whose warm-up took :data:`WARM_CUTOFF`
    x the best one's, after a second run for those near the line or shorter than
    :data:`SHORT_RUN_S` (``recheck_all``: for every one past it); their warm-up time is
    kept (``{name: seconds}``, "considered", never chosen).  Also returns the names
    dropped on one timed run."""
    if len(timed) < 2:
        return {}, set()
    best = min(t.warm for t in timed)
    twice = set()
    for t in timed:
        if WARM_CUTOFF * best < t.warm and (recheck_all or t.warm < SHORT_RUN_S
                                            or t.warm <= WARM_RECHECK * WARM_CUTOFF * best):
            t.warm = min(t.warm, _run_once(t.seq))
            twice.add(t.candidate.name)
    dropped = {}
    for t in [t for t in timed if t.warm > WARM_CUTOFF * best]:
        timed.remove(t)
        t.close()
        dropped[t.candidate.name] = t.warm
    return dropped, set(dropped) - twice


def _rounds(timed: list, rounds: int, budget: float | None, at_once: bool = True) -> int:
    """Run interleaved rounds (module doc, "Timing"), appending each candidate's round
    median; returns the rounds run.  ``budget`` None: full mode.  The budget counts
    timing only, not compiling the candidates (a graph's convolution compiles four
    paths), and at least :data:`MIN_ROUNDS` run so that one disturbed run decides
    nothing (``at_once``: but one where :func:`_clear_at_once`; not for a path that
    re-checks its cuts, a device ranking); in fast mode a lone candidate's timed
    warm-up is its time."""
    start = _perf()
    lone = budget is not None and len(timed) == 1
    done = 0
    while done < (1 if lone else rounds):
        k = done % len(timed)
        for t in timed[k:] + timed[:k]:
            runs = RUNS_PER_ROUND if budget is None else 1 if lone else max(
                1, int(min(RUNS_PER_ROUND, ROUND_RUN_S / max(t.warm, 1e-9))))
            # the first round counts the timed warm-up run as one of its runs
            first = [t.warm] if done == 0 else []
            t.medians.append(statistics.median(
                first + [_run_once(t.seq) for _ in range(runs - len(first))]))
        done += 1
        if budget is not None and at_once and done == 1 and _clear_at_once(timed):
            break
        if budget is not None and done >= MIN_ROUNDS and (
                _perf() - start >= budget or _clear([t.medians for t in timed])):
            break
    return done


def _clear_at_once(timed: list) -> bool:
    """Fast mode, after the first round: whether every candidate's timed warm-up took
    :data:`LONG_RUN_S` or more, and one's was faster than each other's warm-up and first
    run by :data:`CLEAR_MARGIN` (no further round would change the choice)."""
    if len(timed) < 2 or min(t.warm for t in timed) < LONG_RUN_S:
        return False
    lead = min(timed, key=lambda t: t.warm)
    return all(CLEAR_MARGIN * lead.warm < min(t.warm, t.first) for t in timed if t is not lead)


def _close(timed: list, margin: float) -> list:
    """The candidates whose score is within ``margin`` of the fastest one's."""
    best = min(min(t.medians) for t in timed)
    return [t for t in timed if min(t.medians) <= margin * best]


def _retime_close(timed: list, margin: float, fast: bool) -> None:
    """A close call timed again: :data:`CLOSE_ROUNDS` more interleaved rounds of the
    candidates within ``margin`` of the fastest (none where ``margin`` is 1 or one
    candidate is that close), appended to their round medians."""
    close = _close(timed, margin) if margin > 1.0 and len(timed) > 1 else []
    if len(close) < 2:
        return
    for r in range(CLOSE_ROUNDS):
        k = r % len(close)
        for t in close[k:] + close[:k]:
            runs = max(1, int(min(RUNS_PER_ROUND, ROUND_RUN_S / max(t.warm, 1e-9)))) \
                if fast else RUNS_PER_ROUND
            t.medians.append(statistics.median([_run_once(t.seq) for _ in range(runs)]))


def _noise(timed: list) -> float:
    """How far the timing's repeats disagree: the median over the candidates timed in
    two rounds or more of their slowest round median over their fastest (1.0 where none
    was): a burst of load that slowed one round shows here."""
    spreads = [max(t.medians) / min(t.medians) for t in timed
               if len(t.medians) > 1 and min(t.medians) > 0]
    return statistics.median(spreads) if spreads else 1.0


def _margin(timed: list, p: TunablePath) -> float:
    """The tie margin of this timing: the path's ``tie_margin`` widened to the noise, at
    most to :data:`NOISE_TIE_CAP` (1.0, no ties, for a path without a margin)."""
    if p.tie_margin <= 1.0:
        return 1.0
    return max(p.tie_margin, min(NOISE_TIE_CAP, _noise(timed)))


def _pick(times: dict, p: TunablePath, previous: str | None, margin: float = 1.0) -> str:
    """The choice among timed candidates (``times``, in the listed order): the fastest
    (the default on an exact tie); with a tie ``margin`` (:func:`_margin`), of those
    within it of the fastest, ``previous`` if among them, else the first listed."""
    if margin <= 1.0:
        return min(times, key=lambda n: (times[n], n != p.default))
    best = min(times.values())
    tied = [n for n in times if times[n] <= margin * best]
    return previous if previous in tied else tied[0]
def _first_run(seq) -> float:
    """A candidate's first run (:func:`_cut_hopeless`), timed as :func:`_run_once` but
    apart from it: ``_run_once`` is the seam tests script timings through, which then
    cover the warm-up and timed runs only."""
    return _timed_run(seq)


def _run_once(seq) -> float:
    return _timed_run(seq)


def _timed_run(seq) -> float:
    t = _perf()
    seq.run()
    wall = _perf() - t
    gpu = seq.gpu_time_ns
    return gpu * 1e-9 if gpu else wall


def _jsonable(x) -> bool:
    try:
        json.dumps(x, allow_nan=False)
        return True
    except (TypeError, ValueError):
        return False


def _resolve(path) -> TunablePath:
    if isinstance(path, TunablePath):
        return path
    found = registered_paths().get(path)
    if found is None:
        raise ValidationError("path", f"no tunable path named {path!r} (registered: "
                              f"{', '.join(sorted(registered_paths())) or 'none'})")
    return found


_DEFAULT: Tuner | None = None


def default_tuner() -> Tuner:
    """The process's tuner (mode from ``$VKML_TUNE``, files in ``cache_dir()``)."""
    global _DEFAULT
    with _REGISTRY_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Tuner()
        return _DEFAULT


def choose(device, path, shape, **kw) -> Choice:
    """:meth:`Tuner.choose` of the default tuner."""
    return default_tuner().choose(device, path, shape, **kw)


def reference(device, path, shape, mode: str | None = None) -> Choice | None:
    """A device-wide measurement: the default tuner's choice of ``path`` on one reference
    ``shape`` (a ranking of kernel families, a store width), measured once per device and
    stored like any choice; ``mode`` as :meth:`Tuner.choose` takes it ("full": every
    candidate its rounds, so that one disturbed run does not rank a device for good).
    None with tuning off, whatever ``mode`` says: nothing is measured then."""
    tuner = default_tuner()
    if tuner.effective_mode() == "off":
        return None
    return tuner.choose(device, path, shape, mode=mode)


def observe(key: TuneKey, candidate: str, seconds: float, **kw) -> bool:
    """:meth:`Tuner.observe` of the default tuner."""
    return default_tuner().observe(key, candidate, seconds, **kw)


def model(device, path, **kw) -> Model:
    """:meth:`Tuner.model` of the default tuner."""
    return default_tuner().model(device, path, **kw)


def tune(workloads: Iterable, device=None, mode: str = "full", *, refresh: bool = False,
         tuner: Tuner | None = None, progress: Callable | None = None) -> list[Choice]:
    """Tune ahead of time: ``workloads`` is (path, shape) pairs; ``device`` defaults to
    ``vkml.default_device()``.  ``progress(done, total, path, shape)`` is called before
    each.  Returns the choices, in order."""
    if device is None:
        from .device import default_device
        device = default_device()
    tuner = tuner or default_tuner()
    work = list(workloads)
    out = []
    for i, (path, shape) in enumerate(work):
        if progress is not None:
            progress(i, len(work), path, shape)
        out.append(tuner.choose(device, path, shape, mode=mode, refresh=refresh))
    if progress is not None and work:
        progress(len(work), len(work), None, None)
    return out

"""Timing samples and their summary (median, min, max, p10/p90)."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Stats:
    """Summary of timing samples, in milliseconds."""

    n: int
    median: float
    min: float
    max: float
    p10: float
    p90: float
    mean: float

    @classmethod
    def of(cls, samples_s) -> "Stats | None":
        """From samples in seconds (``None`` for no samples)."""
        ms = np.asarray([s for s in samples_s if s is not None], dtype=np.float64) * 1e3
        if ms.size == 0:
            return None
        p10, p50, p90 = np.percentile(ms, [10, 50, 90])
        return cls(int(ms.size), float(p50), float(ms.min()), float(ms.max()), float(p10),
                   float(p90), float(ms.mean()))

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Budget:
    """How many times to run something: ``warmup`` discarded runs, then repeats until
    ``seconds`` have passed, at least ``min_repeats`` and at most ``max_repeats``
    (``repeats`` fixes the count).  A run so slow that ``min_repeats`` of them would take
    more than ``cap`` budgets gets fewer repeats (at least one) and no further warm-up (the
    slow run itself counted as a sample), so one slow operator cannot stall the run."""

    warmup: int = 2
    min_repeats: int = 5
    max_repeats: int = 50
    seconds: float = 1.0
    repeats: int | None = None
    cap: float = 8.0

    def count(self, first_s: float) -> int:
        """Repeats to take when one run lasts about ``first_s`` seconds."""
        if self.repeats is not None:
            return self.repeats
        first_s = max(first_s, 1e-6)
        want = max(self.min_repeats, min(self.max_repeats, int(self.seconds / first_s)))
        return max(1, min(want, int(self.cap * self.seconds / first_s)))

    def slow(self, first_s: float) -> bool:
        return (self.repeats is None
                and first_s * self.min_repeats > self.cap * self.seconds)


def sample(fn, budget: Budget, between=None) -> list[float]:
    """Wall-clock seconds of ``fn()`` per run after the warm-up runs.  A warm-up run that
    turns out slow (see :class:`Budget`) ends the warm-up and counts as a sample.
    ``between``, where given, is called after every run, untimed: a reference kernel
    taking turns with ``fn`` (its last call of each sample follows that sample)."""
    def once() -> float:
        t = time.perf_counter()
        fn()
        took = time.perf_counter() - t
        if between is not None:
            between()
        return took

    out: list[float] = []
    first_s = None
    for _ in range(max(budget.warmup, 1)):
        first_s = once()
        if budget.slow(first_s):
            out.append(first_s)
            break
    if budget.warmup == 0 and not out:
        out.append(first_s)
    for _ in range(budget.count(first_s) - len(out)):
        out.append(once())
    return out


def sample_interleaved(fns, budget: Budget, per_turn: int = 3) -> list[list[float]]:
    """Wall-clock seconds of each of ``fns``, timed in turns: the warm-up runs of each,
    then rounds in which each function takes a turn (the order rotated every round) of
    one untimed run and ``per_turn`` timed ones, as many rounds as :meth:`Budget.count`
    gives for one round's time.  Each sample is a hot run (its function ran just
    before, as when it is called repeatedly), and a drift in the machine's speed
    (another process, the clock) lands on every function alike, so the ratios between
    them hold where back-to-back blocks of samples would not."""
    if not fns:
        return []
    round_s = 0.0
    for fn in fns:
        for _ in range(max(budget.warmup, 1)):
            t = time.perf_counter()
            fn()
            first = time.perf_counter() - t
        round_s += first * (per_turn + 1)
    out: list[list[float]] = [[] for _ in fns]
    for r in range(budget.count(round_s)):
        k = r % len(fns)
        for i in [*range(k, len(fns)), *range(k)]:
            fns[i]()
            for _ in range(per_turn):
                t = time.perf_counter()
                fns[i]()
                out[i].append(time.perf_counter() - t)
    return out


#: The most runs of one side in one turn of :func:`sample_paired` (where one side's run
#: is far shorter than the other's, its turn is then the shorter).
MAX_BLOCK = 64


@dataclass
class Pairs:
    """Timings taken in turns by :func:`sample_paired`: per turn, the workload's runs and
    the reference's runs (seconds; ``block`` and ``ref_block`` of them, back to back)."""

    work: list
    ref: list
    block: int
    ref_block: int = 1

    def work_samples(self) -> list[float]:
        return [t for turn in self.work for t in turn]


def sample_paired(work, reference, budget: Budget, max_block: int = MAX_BLOCK) -> Pairs:
    """The workload ``work`` and the ``reference`` kernel (each a callable that runs once
    and returns that run's seconds, device time where the device has timestamps) timed
    in turns: after their warm-up runs, each turn is a block of runs of the shorter one
    lasting about one run of the longer (at most ``max_block`` runs) and that run, the
    order swapped every turn (W R, R W, W R, ...), as many turns as
    :meth:`Budget.count` gives for one turn's time.  On a CPU driver whose speed drifts
    (steal time, other processes) a slow stretch lands on both halves of a turn, so the
    ratio of a turn's halves holds where a limit measured once would not; halves of
    like length also meet the scheduler alike (a short run between sleeps is served
    sooner than a long one on a busy machine)."""
    first_w = first_r = None
    for _ in range(max(budget.warmup, 1)):
        first_w = work()
        first_r = reference()
    first_w, first_r = max(first_w, 1e-9), max(first_r, 1e-9)
    block = max(1, min(max_block, round(first_r / first_w)))
    ref_block = max(1, min(max_block, round(first_w / first_r)))
    pairs = Pairs([], [], block, ref_block)
    for i in range(budget.count(block * first_w + ref_block * first_r)):
        if i % 2:
            pairs.ref.append([reference() for _ in range(ref_block)])
        pairs.work.append([work() for _ in range(block)])
        if not i % 2:
            pairs.ref.append([reference() for _ in range(ref_block)])
    return pairs


def paired_share(pairs: Pairs, work_amount: float, ref_amount: float) -> dict | None:
    """The workload's rate as a share (%) of the reference's, from timings in turns:
    ``min_over_min``, each side's fastest run (the figure: contention only adds time,
    and runs of like length taken in turns over the same stretch get like chances at
    the machine's quiet moments); per turn, ``work_amount`` over the mean of the turn's
    workload runs against ``ref_amount`` over the mean of its reference runs: the turns'
    ``median``, ``min`` and ``max`` (the spread), ``n`` turns, and ``reference_rate``
    (the median turn's reference amount per second).  None without a timed turn."""
    turns = [(sum(w) / len(w), sum(r) / len(r)) for w, r in zip(pairs.work, pairs.ref)
             if w and r]
    if not turns:
        return None
    shares = [100 * (work_amount / w) / (ref_amount / r) for w, r in turns]
    best_w = min(pairs.work_samples())
    best_r = min(t for turn in pairs.ref for t in turn)
    return {"n": len(turns), "block": pairs.block, "ref_block": pairs.ref_block,
            "median": float(np.median(shares)), "min": min(shares), "max": max(shares),
            "min_over_min": 100 * (work_amount / best_w) / (ref_amount / best_r),
            "reference_rate": float(np.median([ref_amount / r for _, r in turns]))}

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


def sample(fn, budget: Budget) -> list[float]:
    """Wall-clock seconds of ``fn()`` per run after the warm-up runs.  A warm-up run that
    turns out slow (see :class:`Budget`) ends the warm-up and counts as a sample."""
    out: list[float] = []
    first_s = None
    for _ in range(max(budget.warmup, 1)):
        t = time.perf_counter()
        fn()
        first_s = time.perf_counter() - t
        if budget.slow(first_s):
            out.append(first_s)
            break
    if budget.warmup == 0 and not out:
        out.append(first_s)
    for _ in range(budget.count(first_s) - len(out)):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
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

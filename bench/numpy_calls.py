"""``python -m bench.numpy_calls``: NumPy-in/NumPy-out functional calls end to end, and
the submissions each makes, on a device whose tensors are not host-visible.

Two ways of each call are timed in turns in one process: "one submission" (vkml's path:
the arrays are copied into host-visible staging buffers kept with the operator's I/O
tensors, and one recorded command buffer copies them in, runs the operator and copies
the results out, ``vkml/ops/functional.py``) and "separate transfers" (the path before
it, rebuilt here by patching the functional module: each input written, the operator
executed and each output read, a submission and a wait each).  Calls: a tiny
``vkml.pad`` (4x4 float32, reflection by 1) and a ``vkml.add`` of two 256x1024 float32
arrays (1 MiB each).  Every result is checked against NumPy first.  A figure is the
fastest round's median microseconds (``--rounds`` rounds, each way ``--runs`` timed
calls a round after one untimed call, the order rotated every round).

    VK_ICD_FILENAMES=<lavapipe's ICD> python -m bench.numpy_calls --staged
    python -m bench.numpy_calls --device NVIDIA

``--staged`` opens the device with ``force_staging`` (as ``VKML_FORCE_STAGING=1``), so
a CPU driver takes the staged path; on a device whose tensors are host-visible
without it, the two ways are one path (the views are the tensors' own memory).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import numpy as np

import vkml
from vkml.ops import functional
from vkml.runtime import scheduler


@contextlib.contextmanager
def separate_transfers():
    """The functional path as it was before a staged call became one submission: no
    staging views (``_host_views`` answers None where it would stage) and no bound
    replay, so a call writes each input, executes and reads each output apart."""
    views, replay = functional._host_views, functional._Replay.__call__

    def host_only(compiled):
        v = views(compiled)
        return None if v is None or v[2] is not None else v

    functional._host_views = host_only
    functional._Replay.__call__ = lambda self, args: None
    try:
        yield
    finally:
        functional._host_views, functional._Replay.__call__ = views, replay


WAYS = {"one submission": contextlib.nullcontext, "separate transfers": separate_transfers}


def calls(dev):
    """name -> (call, NumPy reference)."""
    rng = np.random.default_rng(0)
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    a = rng.standard_normal((256, 1024), dtype=np.float32)
    b = rng.standard_normal((256, 1024), dtype=np.float32)
    return {
        "pad 4x4 (tiny)": (lambda: vkml.pad(x, [1, 1], [1, 1], "reflection", device=dev),
                           lambda: np.pad(x, 1, mode="reflect")),
        "add 2x1 MiB": (lambda: vkml.add(a, b, device=dev), lambda: a + b),
    }


def submissions(fn) -> int:
    """How many submissions (``Sequence._submit_and_wait``) one call of ``fn`` makes."""
    count = [0]
    submit = scheduler.Sequence._submit_and_wait

    def counted(self, ctx):
        count[0] += 1
        return submit(self, ctx)

    scheduler.Sequence._submit_and_wait = counted
    try:
        fn()
    finally:
        scheduler.Sequence._submit_and_wait = submit
    return count[0]


def measure(fn, rounds: int, runs: int) -> dict:
    """Per way: the fastest round's median microseconds and submissions per call."""
    names = list(WAYS)
    medians: dict = {n: [] for n in names}
    subs = {}
    for n in names:
        with WAYS[n]():
            fn()
            subs[n] = submissions(fn)
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            with WAYS[n]():
                fn()
                times = []
                for _ in range(runs):
                    t = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t)
            medians[n].append(statistics.median(times) * 1e6)
    return {n: (min(medians[n]), subs[n]) for n in names}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.numpy_calls",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="index or name substring")
    ap.add_argument("--staged", action="store_true",
                    help="force staged transfers (force_staging=True)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=50, help="timed calls per way per round")
    args = ap.parse_args(argv)
    device = int(args.device) if args.device is not None and args.device.isdigit() \
        else args.device
    with vkml.Device(device, force_staging=args.staged) as dev:
        staged = dev.context.tensor_heap is not dev.context.staging_heap
        print(f"[{dev.index}] {dev.name}, tensors {'staged' if staged else 'host-visible'}: "
              f"min over {args.rounds} rounds of the median of {args.runs} calls")
        for name, (fn, reference) in calls(dev).items():
            for way in WAYS.values():
                with way():
                    if not np.array_equal(fn(), reference()):
                        print(f"  {name}: wrong result", file=sys.stderr)
                        return 1
            for way, (us, subs) in measure(fn, args.rounds, args.runs).items():
                print(f"  {name:16s} {way:20s} {us:9.1f} us  {subs} submission(s) a call")
    return 0


if __name__ == "__main__":
    sys.exit(main())

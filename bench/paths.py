"""``python -m bench.paths WORKLOAD [CANDIDATE ...]``: one workload's kernel paths, timed
side by side on one device.

Each candidate of the operator's tunable path (``convolution``, ``padding-large``,
``fold_read``, ``unfold_read``, ``lp_pooling_read``, ``permute``, ``gemm_path``,
``resample_rows_read``; by default every one) is built for the workload's descriptor and
recorded once into its own timed sequence; the sequences then run in turns, ``--rounds``
rounds of ``--runs`` runs each, the order rotated every round.  A candidate's figure is
the minimum over rounds of each round's median device time (GPU timestamps; wall time
where the device has none), the tuner's score; its output is checked against the
workload's reference first (a wrong one is reported, not timed).  The kernel-design
figures of bench/RESULTS.md are taken this way: the CPU drivers' speed drifts within
minutes, so only candidates timed in turns in one process are compared.

    python -m bench.paths conv2d-64-64-56x56-3x3 winograd-cl winograd-gemm --device 1
    python -m bench.paths pad-constant-1x64x256x256 --rounds 10

``--fma`` times the bench's FMA microkernel (``glsl/bench_fma.comp``, a grid of about the
workload's FLOPs) in the same turns and gives each candidate's FLOP rate as a share of
it, each side's minimum: the like-for-like reading of a GEMM's share of the FMA peak,
which ``python -m bench`` takes as a median against the best run of the limits.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import vkml
from vkml import dml

from . import operators
from . import workloads as wl
from .run import errors

#: Padding candidate parameters -> CompiledPadding's arguments.
_PADDING_ARGS = {"path": "path", "block": "rows_block", "full": "rows_full", "u64": "rows_u64"}

#: Workload operator -> (its tunable path, the compiled operator's arguments forcing a
#: candidate, from the candidate's name and parameters).
FORCE = {
    "convolution": ("convolution", lambda name, params: {"path": name}),
    "pad": ("padding-large", lambda name, params: {
        _PADDING_ARGS[k]: tuple(v) if isinstance(v, list) else v for k, v in params.items()}),
    "fold": ("fold_read", lambda name, params: params),
    "unfold": ("unfold_read", lambda name, params: params),
    "lp_pooling": ("lp_pooling_read", lambda name, params: params),
    "identity": ("permute", lambda name, params: params),
    "slice": ("permute", lambda name, params: params),
    "gemm": ("gemm_path", lambda name, params: params),
    "resample": ("resample_rows_read", lambda name, params: params),
}


def candidates(op: str) -> dict:
    """The candidates of the operator's tunable path: name -> parameters."""
    from vkml import tuning
    import vkml.ops  # noqa: F401  (registers the paths)

    return {c.name: c.params for c in tuning.registered_paths()[FORCE[op][0]].candidates}


def build(dev, w, name: str):
    """The workload's operator compiled with candidate ``name`` forced."""
    from vkml.ops.base import REGISTRY

    known = candidates(w.op)
    if name not in known:
        raise ValueError(f"not a candidate of {FORCE[w.op][0]} ({', '.join(known)})")
    desc = operators.dml_desc(dml, w.op, w.p, w.np_dtype)
    return REGISTRY[type(desc)](dev, desc, **FORCE[w.op][1](name, known[name]))


#: The FMA microkernel's pseudo-candidate (``--fma``).
FMA = "bench_fma"


def _record_fma(dev, seq, flops: float):
    """Record bench_fma as ``python -m bench``'s limits run it (64 invocations a group),
    with about ``flops`` FLOPs; its FLOPs and the buffer it writes."""
    from vkml.runtime import STORAGE, Bind
    from vkml.runtime.blocks import pack

    from . import limits

    ctx = dev.context
    per_group = 64 * limits._FMA_FLOPS_PER_INVOCATION
    groups = max(16, min(int(flops // per_group), ctx.limits["maxComputeWorkGroupCount"][0]))
    out = ctx.allocate(65536 * 16)
    pipe = ctx.pipelines.get("bench_fma", (STORAGE,), 16, {0: 64, 1: limits._FMA_ITERS})
    push = pack("bench_fma", "push", mul=0.999999, add=1e-6, count=groups * 64,
                row=groups * 64)
    seq.dispatch(pipe, [Bind(out, 0, out.size, "w")], (groups, 1, 1), push)
    return groups * per_group, out


def time_paths(dev, w, names, rounds: int = 5, runs: int = 5, fma: bool = False) -> dict:
    """``{candidate: seconds or the reason it does not run}`` (see the module doc);
    ``fma``: also :data:`FMA`'s, as ``(seconds, its FLOPs)``."""
    inputs = operators.make_inputs(w.op, w.p, w.np_dtype)
    ref = operators.compute(w.op, w.p, inputs, np.float64)
    ins = [None if a is None else dev.tensor(a) for a in inputs]
    y = dev.empty(tuple(w.p["out_shape"]), w.np_dtype)
    made, result = [], {}
    try:
        for name in names:
            try:
                op = build(dev, w, name)
            except (vkml.VkmlError, ValueError) as exc:   # declined, unsupported
                result[name] = f"does not run: {exc}"
                continue
            seq = dev.sequence(timed=True)
            op.record(seq, ins, [y])
            y.write(np.zeros(y.shape, w.np_dtype))
            seq.run()                                     # warm-up, untimed, checked
            err = errors(y.numpy(), ref, w.tolerance)
            if err["flagged"]:
                result[name] = f"wrong output: relative error {err['max_rel_err']:.3g}"
                seq.close()
                op.release()
                continue
            made.append((name, op, seq, []))
        if fma:
            seq = dev.sequence(timed=True)
            fma_flops, out = _record_fma(dev, seq, w.flops())
            seq.run()
            made.append((FMA, out, seq, []))
        for r in range(rounds):
            k = r % len(made) if made else 0
            for name, _, seq, medians in made[k:] + made[:k]:
                times = []
                for _ in range(runs):
                    t = time.perf_counter()
                    seq.run()
                    times.append(seq.gpu_time_ns * 1e-9 if seq.gpu_time_ns
                                 else time.perf_counter() - t)
                medians.append(statistics.median(times))
        for name, _, _, medians in made:
            result[name] = (min(medians), fma_flops) if name == FMA else min(medians)
    finally:
        for name, op, seq, _ in made:
            seq.close()
            if name == FMA:               # (its output buffer)
                op.free()
            else:
                op.release()
        for t in ins + [y]:
            if t is not None:
                t.free()
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.paths",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", help="a workload name (python -m bench --list)")
    ap.add_argument("candidates", nargs="*", help="candidate names (default: every one)")
    ap.add_argument("--device", default=None, help="index or name substring")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=5, help="runs per candidate per round")
    ap.add_argument("--fma", action="store_true",
                    help="time the FMA microkernel in the same turns: each share of it")
    args = ap.parse_args(argv)
    found = [w for w in wl.load() if w.name == args.workload]
    if not found:
        ap.error(f"no workload named {args.workload!r}")
    w = found[0]
    if w.op not in FORCE:
        ap.error(f"{w.name}: {w.op} has no candidates to force ({', '.join(FORCE)})")
    if args.rounds < 1 or args.runs < 1:
        ap.error("rounds and runs must be at least 1")
    with vkml.Device(args.device) as dev:
        names = args.candidates or list(candidates(w.op))
        print(f"{w.name} on [{dev.index}] {dev.name}: min over {args.rounds} rounds of the "
              f"median of {args.runs} runs")
        times = time_paths(dev, w, names, args.rounds, args.runs, args.fma)
        rate = None
        if FMA in times:
            t, flops = times.pop(FMA)
            rate = flops / t
            print(f"  {FMA:24s} {t * 1e3:9.3f} ms {rate / 1e9:7.1f} GFLOP/s")
        for name, t in times.items():
            if not isinstance(t, float):
                print(f"  {name:24s} {t}")
                continue
            share = f" {w.flops() / t / rate:7.1%} of {FMA}" if rate else ""
            print(f"  {name:24s} {t * 1e3:9.3f} ms{share}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m vkml.tune``: tune the registered operator paths ahead of time.

Times each candidate (:mod:`vkml.tuning`), keeps the fastest per shape class in the cache
folder and prints what it chose, the runner-up and the speedup over the default.  Give
bench workload files (or ``--bench``) to tune their shapes, else each path's example
shapes; ``--refresh`` re-measures what is stored; ``--list`` lists the paths.

From Python, :func:`vkml.tune` (:func:`vkml.tuning.tune`) does the same.  This module is
a command to run, not to import: importing it would make the name ``vkml.tune`` (the
function) this module, as Python binds a submodule to its package on import.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Mapping

from . import tuning
from .runtime import cache


def _bench_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "bench" / "workloads"


def _parser():
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m vkml.tune",
        description="Tune vkml's operator paths on this device ahead of time: time each "
                    "candidate, keep the fastest per shape class in the cache folder "
                    "(VKML_CACHE_DIR). At run time VKML_TUNE=off|fast|full (default fast) "
                    "decides what is timed on first use.")
    ap.add_argument("workloads", nargs="*", metavar="WORKLOADS.json",
                    help="bench workload files (bench/workloads/*.json); without them, each "
                         "registered path's example shapes")
    ap.add_argument("--bench", action="store_true", help="every bench/workloads/*.json")
    ap.add_argument("--path", action="append", default=[], metavar="NAME",
                    help="only this registered path (repeatable)")
    ap.add_argument("--mode", choices=("fast", "full"), default="full",
                    help="full: every candidate (default); fast: the short list")
    ap.add_argument("--refresh", action="store_true",
                    help="re-measure even where a choice is stored (without workloads: the "
                         "stored shapes too)")
    ap.add_argument("--device", default=None, help="device index or name (default: vkml's)")
    ap.add_argument("--list", action="store_true", help="list the registered paths and exit")
    return ap


def _read_workloads(path: Path):
    """A bench workload file's JSON (no version field there), or None."""
    raw = cache.read_bytes(path)
    try:
        return None if raw is None else json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None


def _workloads(args, paths: dict, device, tuner: tuning.Tuner, say) -> list:
    """(path, shape) pairs to tune: the workload files' shapes, else every path's
    examples (and with ``--refresh`` what is stored for this device and its features)."""
    files = [Path(f) for f in args.workloads]
    if args.bench:
        files += sorted(_bench_dir().glob("*.json"))
    if files:
        return _from_files(files, paths, say)
    work = [(p.name, s) for p in paths.values() for s in p.examples]
    if args.refresh:
        for pname, shape in tuner.stored(device):
            if pname in paths and (pname, shape) not in work:
                work.append((pname, shape))
    return work


def _from_files(files, paths: dict, say) -> list:
    """The shapes of the workloads in ``files`` that registered paths take
    (``from_workload``); what no path takes is counted by op and said."""
    work, skipped = [], {}
    for f in files:
        raw = _read_workloads(f)
        entries = raw.get("workloads", []) if isinstance(raw, dict) else None
        if not isinstance(entries, list):
            say(f"{f}: not a workload file (skipped)")
            continue
        for w in entries:
            shapes = [(p.name, p.from_workload(w)) for p in paths.values() if p.from_workload]
            shapes = [(n, s) for n, s in shapes if s is not None]
            work += shapes
            if not shapes:
                op = w.get("op", "?") if isinstance(w, dict) else "?"
                skipped[op] = skipped.get(op, 0) + 1
    for op, n in sorted(skipped.items()):
        say(f"{n} workload(s) of op {op!r}: no registered tunable path takes them yet")
    return work


def main(argv=None) -> int:
    """The command; returns its exit status (2: an unknown ``--path``)."""
    args = _parser().parse_args(argv)
    console = _console()
    say = console.print if console is not None else print
    paths = tuning.registered_paths()
    unknown = [n for n in args.path if n not in paths]
    if unknown:
        say(f"no tunable path named {', '.join(unknown)} (registered: {', '.join(paths)})")
        return 2
    if args.path:
        paths = {n: paths[n] for n in args.path}
    if args.list:
        for p in paths.values():
            say(_describe(p))
        return 0
    from .device import Device

    with Device(args.device) as device:
        tuner = tuning.Tuner(args.mode)
        work = _workloads(args, paths, device, tuner, say)
        if not work:
            say("nothing to tune")
            return 0
        say(f"tuning {len(work)} shape(s) on {device.info} (mode {args.mode}"
            f"{', refresh' if args.refresh else ''})")
        choices = _tune(work, device, args, tuner, console)
        _report(choices, console)
        for name in dict.fromkeys(c.path for c in choices):
            if paths[name].is_model:
                m = tuner.model(device, name, mode=args.mode)
                say(f"{name} model ({m.source}): {_fmt_params(m.params)}")
    return 0


def _console():
    """A rich console (wide when not a terminal, so tables stay whole in logs), or None
    without rich: plain text then."""
    try:
        from rich.console import Console
    except ImportError:
        return None
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 160))


def _describe(p: tuning.TunablePath) -> str:
    if p.is_model:
        return f"{p.name}: measured model, points " + ", ".join(c.name for c in p.candidates)
    return (f"{p.name}: default {p.default}; candidates "
            + ", ".join(c.name + ("" if c.fast else " (full)") for c in p.candidates))


def _tune(work, device, args, tuner, console) -> list:
    """:func:`vkml.tuning.tune`, with a progress bar on a console."""
    if console is None:
        return tuning.tune(work, device, args.mode, refresh=args.refresh, tuner=tuner)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("tuning", total=len(work))

        def progress(i, n, path, shape):
            bar.update(task, completed=i, description=f"{path} {shape}" if path else "done")
        return tuning.tune(work, device, args.mode, refresh=args.refresh, tuner=tuner,
                           progress=progress)


def _fmt_s(t) -> str:
    if t is None:
        return "-"
    return f"{t * 1e6:.1f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms"


def _fmt_params(params) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}"
        if isinstance(v, (list, tuple)):
            return "(" + ", ".join(fmt(x) for x in v) + ")"
        if isinstance(v, Mapping):
            return "{" + ", ".join(f"{k}: {fmt(x)}" for k, x in v.items()) + "}"
        return str(v)
    return fmt(params)


def _report(choices, console) -> None:
    """The table of choices: chosen, time, runner-up, speedup over the default."""
    rows, seen = [], set()
    for c in choices:
        if c.key in seen:
            continue
        seen.add(c.key)
        p = tuning.registered_paths().get(c.path)
        if p is not None and p.is_model:       # points are all kept, none is "chosen"
            rows.append((c.path, c.key.shape_class,
                         f"model of {len(c.times)} points" if c.times else "default model",
                         "-", "-", "-", c.source))
            continue
        ru = c.runner_up()
        sp = c.speedup()
        rows.append((c.path, c.key.shape_class, c.name, _fmt_s(c.seconds),
                     f"{ru[0]} {_fmt_s(ru[1])}" if ru else "-",
                     f"{sp:.2f}x" if sp else "-", c.source))
    head = ("path", "shape class", "chosen", "time", "runner-up", "speedup vs default", "source")
    if console is None:
        print("  ".join(head))
        for r in rows:
            print("  ".join(r))
        return
    from rich.table import Table

    t = Table(title="Tuned choices", title_justify="left")
    for h in head:
        t.add_column(h, justify="right" if h in ("time", "speedup vs default") else "left")
    for r in rows:
        t.add_row(*r)
    console.print(t)


if __name__ == "__main__":
    sys.exit(main())

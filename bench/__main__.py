"""``python -m bench`` (also ``vkml-bench``): vkml against its peers and against each
device's own limits.

    python -m bench                      # every workload on the default device, all peers
    python -m bench --quick              # the quick set (what tools/demo runs)
    python -m bench --quick --wide       # every figure in the workload table (~170 columns)
    python -m bench --all-devices --json run.json --csv run.csv --plot run.png
    python -m bench -k conv2d --peers torch-cpu,ncnn-vulkan --repeats 20
    python -m bench --compare before.json after.json
    python -m bench dispatch bench/models/padding_reflection.json -i 20 -v 1
    python -m bench --list               # the workloads and what runs them
    python -m bench models -k resnet18   # whole models (see 'python -m bench models --help')

Exit status: 0, or 1 when a vkml result failed or exceeded its workload's tolerance
(peers never fail the run; a missing peer or operator is reported as absent).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import vkml

from . import workloads as wl
from .stats import Budget


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0],
        epilog="Subcommand: 'python -m bench dispatch MODEL.json [options]' runs a DxDispatch "
               "model file (see 'python -m bench dispatch --help').")
    sel = ap.add_argument_group("what to run")
    sel.add_argument("--device", default=None,
                     help="index or name substring (default: $VKML_DEVICE, else the best)")
    sel.add_argument("--all-devices", action="store_true", help="every Vulkan device")
    sel.add_argument("--quick", action="store_true",
                     help="the quick set (under a minute on lavapipe)")
    sel.add_argument("-k", "--filter", action="append", default=[], metavar="TEXT",
                     help="only workloads whose name contains TEXT, or of operator TEXT "
                          "(repeatable)")
    sel.add_argument("--workloads", action="append", default=None, metavar="PATH",
                     help="workload file or folder (default: bench/workloads/)")
    sel.add_argument("--peers", default=None, metavar="LIST",
                     help="comma-separated peers (numpy, torch-cpu, onnxruntime-cpu, "
                          "ncnn-vulkan, ncnn-cpu) or 'none' (default: all installed)")
    sel.add_argument("--no-limits", action="store_true",
                     help="skip the device-limit microkernels and hot-path figures")
    sel.add_argument("--list", action="store_true", help="list the workloads and exit")
    tm = ap.add_argument_group("timing")
    tm.add_argument("--repeats", type=int, default=None,
                    help="timed runs per measurement (default: as many as fit the time "
                         "budget, between a minimum and a maximum)")
    tm.add_argument("--warmup", type=int, default=None, help="discarded runs first")
    tm.add_argument("--seconds", type=float, default=None,
                    help="time budget per measurement (default 1.0, quick 0.25)")
    out = ap.add_argument_group("output")
    out.add_argument("--wide", action="store_true",
                     help="the full workload table: spread, cold and GPU times, transfers, "
                          "rate, every device limit (about 170 columns; the default fits 100)")
    out.add_argument("--json", metavar="PATH", help="every figure, with device/driver/peer "
                                                     "versions")
    out.add_argument("--csv", metavar="PATH", help="the same as CSV rows")
    out.add_argument("--plot", metavar="PNG", help="chart of vkml vs peers and vs limits")
    out.add_argument("--markdown", metavar="PATH", help="the tables as Markdown "
                                                        "(for bench/RESULTS.md)")
    out.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                     help="show the change between two runs (regressions in red) and exit")
    out.add_argument("--threshold", type=float, default=0.05,
                     help="relative slow-down counted as a regression (default 0.05)")
    out.add_argument("--fail-on-regression", action="store_true",
                     help="with --compare: exit 1 when there is a regression")
    return ap


def _list(ws, console) -> None:
    from rich.table import Table

    t = Table(title="Workloads", title_justify="left")
    for c in ("name", "op", "dtype", "shape", "sets", "vkml"):
        t.add_column(c, no_wrap=c == "name")        # a name is what -k takes: keep it whole
    for w in ws:
        have = "yes" if hasattr(vkml, w.spec.function) else "[dim]not yet[/]"
        t.add_row(w.name, w.op, w.dtype, w.describe(), ",".join(w.sets), have)
    console.print(t)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "dispatch":
        from . import dxdispatch
        return dxdispatch.main(argv[1:])
    if argv and argv[0] == "models":
        from .cnn import cli
        return cli.main(argv[1:])
    try:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                   TextColumn, TimeElapsedColumn)
    except ImportError:
        print("python -m bench needs 'rich': pip install 'vkml[bench]'", file=sys.stderr)
        return 2
    from . import report

    args = _parser().parse_args(argv)
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:   # a file or a pipe
        console = Console(width=200 if args.wide else 100)
    if args.compare:
        a, b = (json.load(open(p)) for p in args.compare)
        table, regressions = report.compare(a, b, args.threshold)
        console.print(table)
        console.print(f"{regressions} regression(s)")
        return 1 if regressions and args.fail_on_regression else 0

    all_ws = wl.load(args.workloads)
    ws = wl.select(all_ws, args.quick, args.filter)
    if args.list:
        _list(ws, console)
        return 0
    if not ws:
        console.print(f"[red]no workload matches {args.filter}[/] (try --list)")
        return 2
    from .run import Bench, Options

    infos = vkml.devices()
    console.print("Vulkan devices:")
    for info in infos:
        console.print(f"  {info}  Vulkan {info.api_version}, {info.driver_info}")
    if not infos:
        console.print("[red]no Vulkan device[/]: install a Vulkan driver (lavapipe: "
                      "mesa-vulkan-drivers)")
        return 2
    if args.all_devices:
        devices = infos
    else:
        with vkml.Device(args.device) as dev:      # resolves --device / $VKML_DEVICE
            devices = [dev.info]
    quick = args.quick
    budget = Budget(warmup=args.warmup if args.warmup is not None else (1 if quick else 2),
                    min_repeats=3 if quick else 5, max_repeats=20 if quick else 50,
                    seconds=args.seconds if args.seconds is not None else
                    (0.25 if quick else 1.0), repeats=args.repeats)
    peers = None
    if args.peers:
        peers = [] if args.peers == "none" else [p.strip() for p in args.peers.split(",")]
    opts = Options(devices, ws, budget, peers, quick, not args.no_limits,
                   ["python", "-m", "bench", *argv])
    bench = Bench(opts)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task("starting", total=bench.steps())
        first = [True]

        def step(text):
            if not first[0]:
                progress.advance(task)
            first[0] = False
            progress.update(task, description=text[:70])

        bench.progress = step
        doc = bench.run()
    report.print_report(doc, console, wide=args.wide)
    problems = report.validate(doc)
    if problems:       # a bug of the tool itself: say so loudly
        console.print("[bold red]the result document breaks its schema:[/]\n  "
                      + "\n  ".join(problems))
    if args.json:
        report.write_json(doc, args.json)
        console.print(f"wrote {args.json}")
    if args.csv:
        report.write_csv(doc, args.csv)
        console.print(f"wrote {args.csv}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report.markdown(doc))
        console.print(f"wrote {args.markdown}")
    if args.plot:
        from .plot import plot
        plot(doc, args.plot)
        console.print(f"wrote {args.plot}")
    bad = [r for r in doc["results"] if r["runner"] == "vkml"
           and (r["status"] == "error" or r.get("flagged"))]
    return 1 if bad or problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m bench dispatch MODEL.json``: DxDispatch's command line, on vkml."""
from __future__ import annotations

import argparse
import json
import sys

import vkml

from .run import Timing, run_model
from .schema import ModelError


def main(argv=None) -> int:
    """The command line; a malformed model prints one line naming the place (stderr) and
    returns 2."""
    ap = argparse.ArgumentParser(prog="python -m bench dispatch",
                                 description="Run a DirectML DxDispatch model file on vkml.")
    ap.add_argument("model", help="DxDispatch model file (.json)")
    ap.add_argument("-a", "--device", "--adapter", default=None,
                    help="Vulkan device: index or name substring (DxDispatch's --adapter)")
    ap.add_argument("-i", "--dispatch_iterations", type=int, default=1,
                    help="bind/dispatch/wait iterations (default 1)")
    ap.add_argument("-r", "--dispatch_repeat", type=int, default=1,
                    help="dispatches per iteration (default 1)")
    ap.add_argument("-t", "--milliseconds_to_run", type=float, default=None,
                    help="run iterations for this long instead of -i")
    ap.add_argument("-w", "--warmup_samples", type=int, default=1,
                    help="samples counted as cold (default 1)")
    ap.add_argument("-v", "--timing_verbosity", type=int, default=0, choices=(0, 1, 2),
                    help="0: hot timings, 1: init/cold/hot, 2: every iteration")
    ap.add_argument("--json", metavar="PATH", help="write the timings as JSON")
    args = ap.parse_args(argv)
    if args.dispatch_iterations < 1 or args.dispatch_repeat < 1:
        ap.error("iterations and repeat must be at least 1")
    timing = Timing(args.dispatch_iterations, args.dispatch_repeat, args.warmup_samples,
                    args.milliseconds_to_run, args.timing_verbosity)
    try:
        with vkml.Device(args.device) as dev:
            print(f"Running on [{dev.index}] '{dev.name}' ({dev.info.driver_name} "
                  f"{dev.info.driver_info})")
            records = run_model(args.model, dev, timing)
            info = {"index": dev.index, "name": dev.name, "driver_name": dev.info.driver_name,
                    "driver_info": dev.info.driver_info}
    except (ModelError, vkml.VkmlError) as exc:
        print(f"vkml-bench dispatch: {args.model}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": str(args.model), "device": info, "vkml": vkml.__version__,
                       "dispatches": records}, f, indent=1)
            f.write("\n")
    return 0

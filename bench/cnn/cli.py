"""``python -m bench models``: whole CNNs on each Vulkan device next to their peers.

    python -m bench models                          # every model on the default device
    python -m bench models --all-devices --json models.json --markdown models.md
    python -m bench models -k resnet18 -k unet --size unet=128 --peers onnxruntime-cpu --cpu-threads 1
    python -m bench models -k squeezenet --dtype float16   # vkml in float16
    python -m bench models -k resnet18 --no-fuse            # the graph compiler's fusions off
    python -m bench models -k yolov8n --fuse residual=off,join_in_place=off
    python -m bench models --list
    python -m bench models -k mobilenet --profile   # per-layer ms against the roofline

Models are built from their torchvision / ultralytics definitions with random weights
(``bench/cnn/models.py``), exported to ONNX once and cached (``bench/.models/``, or
$VKML_MODEL_CACHE).  The export, the FLOP count and every peer (ONNX Runtime CPU, the
reference, too) run in child processes: this one imports neither torch nor onnxruntime.  Exit status 0, or 1 when vkml failed on a model or its output is
off ONNX Runtime CPU's by more than ``--tolerance`` (peers never fail the run).
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time

import vkml
from vkml.ops.graph import FUSION_KINDS

from . import models as models_mod
from . import report, worker_io
from .peers import PEERS
from .run import model_row


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench models",
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="index or name substring")
    ap.add_argument("--all-devices", action="store_true", help="every Vulkan device")
    ap.add_argument("-k", "--filter", action="append", default=[], metavar="NAME",
                    help="only models whose name contains NAME (repeatable)")
    ap.add_argument("--size", action="append", default=[], metavar="[MODEL=]N",
                    help="input height and width: for every model, or MODEL=N for one "
                         "(default 224; yolov8n 640)")
    ap.add_argument("--peers", default=None, metavar="LIST",
                    help="comma-separated peers (" + ", ".join(p.name for p in PEERS)
                         + "); onnxruntime-cpu always runs (the reference)")
    ap.add_argument("--seconds", type=float, default=2.0,
                    help="time budget of each row's hot runs (at least 10 runs, fewer only "
                         "where they would take over 10x this)")
    ap.add_argument("--repeats", type=int, default=None, help="hot runs per measurement")
    ap.add_argument("--peer-timeout", type=float, default=300.0, metavar="S",
                    help="time limit of each peer's child process (every peer runs in "
                         "one), per model (default 300)")
    ap.add_argument("--cpu-threads", type=int, default=0, metavar="N",
                    help="threads of ONNX Runtime CPU and PyTorch CPU (default: theirs)")
    ap.add_argument("--no-limits", action="store_true",
                    help="skip measuring the device's FMA peak and copy bandwidth")
    ap.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                    help="vkml's data type on the device: float16 runs the float32 models "
                         "with vkml.onnx.prepare(dtype=\"float16\") (rel err still against "
                         "ONNX Runtime CPU float32; peers unchanged)")
    ap.add_argument("--tolerance", type=float, default=None,
                    help="largest vkml rel err accepted (default 1e-3; 1e-2 with --dtype "
                         "float16, float16's 11 significant bits)")
    ap.add_argument("--fuse", type=parse_fuse, default=True, metavar="KIND=on|off,...",
                    help="vkml's graph fusions by kind (" + ", ".join(FUSION_KINDS)
                         + "; '_' may stand for a space), the kinds not named on; or on, off "
                         "(default on): vkml.onnx.prepare(fuse=...), recorded in the JSON")
    ap.add_argument("--no-fuse", dest="fuse", action="store_const", const=False,
                    help="every fusion off (--fuse off)")
    ap.add_argument("--no-cold-start", dest="cold", action="store_false",
                    help="skip the cold-start columns (prepare plus first run in fresh "
                         "processes, with an empty cache and again with it filled)")
    ap.add_argument("--json", metavar="PATH", help="every figure")
    ap.add_argument("--markdown", metavar="PATH", help="the tables as Markdown")
    ap.add_argument("--profile", action="store_true",
                    help="also profile each model (rep.profile): per layer, device ms next "
                         "to its roofline bound and the share reached")
    ap.add_argument("--profile-repeats", type=int, default=5, metavar="N",
                    help="runs per profile (median per node; default 5)")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    return ap


def parse_fuse(text: str):
    """``--fuse``'s value as ``vkml.onnx.prepare``'s ``fuse``: "on" True, "off" False,
    "residual=off,join_in_place=off" ``{"residual": False, "join in place": False}``."""
    flags = {"on": True, "off": False}
    text = text.strip().lower()
    if text in flags:
        return flags[text]
    out = {}
    for item in text.split(","):
        kind, _, value = item.partition("=")
        kind = " ".join(kind.replace("_", " ").replace("-", " ").split())
        if kind not in FUSION_KINDS or value.strip() not in flags:
            raise argparse.ArgumentTypeError(
                f"{item.strip()!r}: expected KIND=on|off with KIND one of "
                f"{', '.join(FUSION_KINDS)} (or on, off alone)")
        out[kind] = flags[value.strip()]
    return out


def sizes(args_size, specs) -> dict:
    out = {s.name: s.size for s in specs}
    for item in args_size:
        name, _, n = item.rpartition("=")
        for s in specs:
            if not name or name == s.name:
                out[s.name] = int(n)
    return out


def device_limits(dev) -> dict:
    """The device's FMA peak and compute-shader copy bandwidth (``bench/limits.py``), and
    the FMA kernel's FLOPs per second of this process's CPU time (``fma_cpu_gflops``:
    on a CPU driver its threads' work, which another process's load does not stretch;
    :func:`run.shares`)."""
    from .. import limits

    size = max(1 << 16, min(32 << 20, dev.limits["maxStorageBufferRange"] // 2) >> 16 << 16)
    fma = limits.fma_gflops(dev, target_s=0.05)
    copy = limits.shader_copy_gbs(dev, size)
    return {"fma_gflops": fma["gflops"], "shader_copy_gbs": copy["gbs"],
            "fma_cpu_gflops": fma["flops"] / max(fma["cpu_seconds"], 1e-9) / 1e9,
            "details": {"fma": fma, "shader_copy": copy}}


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except Exception:                     # noqa: BLE001
        return None


def run_devices(devices, specs, size_of, peers, budget, with_limits, log,
                profile: int = 0, dtype=None, fuse=True, cold: bool = True) -> list:
    """Rows for every (device, model); each model exported (or read from the cache) once;
    ``dtype`` and ``fuse`` as ``vkml.onnx.prepare`` takes them; ``cold``: measure the
    cold start in child processes (``run.cold_start``)."""
    exported = {}
    rows = []
    for info in devices:
        with vkml.Device(info.index) as dev:
            lim = device_limits(dev) if with_limits else None
            log(f"{info.name}: limits " + str(lim and {k: v for k, v in lim.items()
                                                      if k != "details"}))
            held, refs = _references(dev, lim, log)
            try:
                rows += _device_rows(dev, specs, size_of, peers, budget, lim, log, profile,
                                     dtype, fuse, cold, exported, refs)
            finally:
                for r in refs.values():
                    r.close()
                if held is not None:
                    held.close()
    return rows


def _references(dev, lim: dict | None, log) -> tuple:
    """(their buffers' holder, ``{limit: Reference}``): the limits' microkernels at the
    limits' own sizes, to run after each of vkml's hot runs (``run.paired_shares``);
    none without limits or where they cannot be recorded (the shares then against the
    limits measured once)."""
    from .. import limits

    if not lim:
        return None, {}
    held, refs = None, {}
    try:
        held = limits.references(dev, lim)
        for key in ("fma_gflops", "shader_copy_gbs"):
            refs[key] = held.sized(key)
        return held, refs
    except Exception as exc:              # noqa: BLE001
        log(f"{dev.info.name}: no references in turns ({type(exc).__name__}: {exc})")
        for r in refs.values():
            r.close()
        if held is not None:
            held.close()
        return None, {}


def _device_rows(dev, specs, size_of, peers, budget, lim, log, profile, dtype, fuse, cold,
                 exported: dict, refs: dict) -> list:
    """The rows of every model on one open device (``run_devices``)."""
    rows = []
    info = dev.info
    for spec in specs:
        size = size_of[spec.name]
        if (spec.name, size) not in exported:
            t = time.perf_counter()
            data, path, hit = models_mod.export_apart(spec, size)
            exported[spec.name, size] = data
            log(f"{spec.name} {size}x{size}: {'cached' if hit else 'exported'} "
                f"{path} ({time.perf_counter() - t:.1f} s)")
        log(f"{info.name}: {spec.name}")
        row = model_row(spec, size, exported[spec.name, size], dev, peers, budget, lim,
                        dtype=dtype, fuse=fuse, cold=cold, refs=refs)
        row["limits"] = lim and {k: v for k, v in lim.items() if k != "details"}
        if profile:
            from .profile import measure
            row["profile"] = measure(spec, size, exported[spec.name, size], dev, lim,
                                     profile, log)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    specs = [s for s in models_mod.MODELS
             if not args.filter or any(f in s.name for f in args.filter)]
    size_of = sizes(args.size, models_mod.MODELS)
    if args.list:
        for s in models_mod.MODELS:
            print(f"{s.name:18s} 1x3x{size_of[s.name]}x{size_of[s.name]}")
        return 0
    if not specs:
        print(f"no model matches {args.filter} (try --list)", file=sys.stderr)
        return 2
    peers = PEERS
    if args.peers:
        want = {p.strip() for p in args.peers.split(",")} | {"onnxruntime-cpu"}
        peers = [p for p in PEERS if p.name in want]
    from . import peers as peers_mod
    peers_mod.CPU_THREADS[0] = args.cpu_threads
    for p in peers:
        if hasattr(p, "timeout_s"):
            p.timeout_s = args.peer_timeout
    infos = vkml.devices()
    if args.all_devices:
        devices = infos
    else:
        with vkml.Device(args.device) as dev:
            devices = [dev.info]
    budget = worker_io.budget(args.seconds, args.repeats)
    log = lambda text: print(text, file=sys.stderr, flush=True)   # noqa: E731
    dtype = None if args.dtype == "float32" else args.dtype
    rows = run_devices(devices, specs, size_of, peers, budget, not args.no_limits, log,
                       args.profile_repeats if args.profile else 0, dtype, args.fuse,
                       args.cold)
    doc = {"command": ["python", "-m", "bench", "models", *(argv or sys.argv[2:])],
           "commit": _commit(), "machine": platform.node(), "cpu": platform.processor()
           or platform.machine(), "vkml": vkml.__version__, "fuse": args.fuse,
           "rows": rows}
    report.print_tables(doc)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=float)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report.markdown(doc))
    tolerance = args.tolerance if args.tolerance is not None else \
        (1e-2 if dtype else 1e-3)
    bad = [r for r in rows if r["vkml"].get("status") != "ok"
           or not r["vkml"]["rel_err"] <= tolerance]
    return 1 if bad else 0

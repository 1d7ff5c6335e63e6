"""The performance goals vkml works towards, checked against a run.

Each target reads one figure per workload (or a device figure), aggregates them (each must
pass, or their geometric mean), and compares with a threshold.  They are stated for
lavapipe; the report shows them for every device, marked as such.  A vkml result over its
tolerance never meets a target.
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    area: str                       # what the goal is about: "padding", "convolution", ...
    what: str
    figure: str                     # "speedup.<peer>.<e2e|compute>", "pct_fma", "hot_path.<key>",
    #                                 "graph.<key>" (a graph row's own figures),
    #                                 "limits.<key>", "tuning_cost.<key>"
    workloads: tuple = ()           # name patterns (fnmatch); empty for device figures
    exclude: tuple = ()
    aggregate: str = "each"         # "each" | "geomean"
    at_least: float | None = None
    at_most: float | None = None
    #: leave out workloads where the peer of a "speedup.<peer>..." figure was wrong
    peer_correct_only: bool = False


_PAD = ("pad-constant-1x64x256x256", "pad-reflection-1x64x256x256", "pad-constant-64MiB",
        "pad-reflection-64MiB")
_CONV2D = ("conv2d-*",)
# the model operators (bench/workloads/{element_wise,join_split_slice,resample,pooling,
# reduce,gemm,batch_normalization,softmax}.json), by the share of a limit each is held to
_COPY_LIKE = ("add-*", "multiply-*", "identity-*", "join-*", "split-*", "slice-*",
              "resample-*")
_POOL_REDUCE = ("max-pool-*", "avg-pool-*", "global-avg-pool-*", "reduce-*")

TARGETS = [
    Target("padding", "padding device time beats numpy.pad", "speedup.numpy.compute", _PAD,
           at_least=1.0),
    Target("padding", "padding end to end (NumPy in/out) vs numpy.pad: aim for parity",
           "speedup.numpy.e2e", _PAD, at_least=1.0),
    Target("transfers", "uploads >= 50% of the CPU copy bandwidth",
           "limits.upload_vs_cpu_copy", at_least=0.5),
    Target("transfers", "downloads >= 50% of the CPU copy bandwidth",
           "limits.download_vs_cpu_copy", at_least=0.5),
    Target("hot path", "a replayed recorded sequence (one tiny padding) <= 80 us per submit",
           "hot_path.replay_us_per_submit", at_most=80.0),
    Target("hot path", "a tiny vkml.pad (4x4 float32, NumPy in/out) <= 60 us end to end",
           "hot_path.functional_tiny_pad_us", at_most=60.0),
    Target("hot path", "100 paddings in one submit <= 40 us each",
           "hot_path.batched_us_per_padding", at_most=40.0),
    Target("tuning", "a cold convolution with VKML_TUNE=fast within 2x of tuning off",
           "tuning_cost.fast_cold_vs_off", at_most=2.0),
    Target("tuning", "a second process reuses the stored choice (cold call as with tuning off)",
           "tuning_cost.fast_warm_vs_off", at_most=1.25),
    Target("fold", "fold ahead of PyTorch CPU (device time)", "speedup.torch-cpu.compute",
           ("fold-*",), at_least=1.0),
    Target("LP pooling", "LP pooling ahead of PyTorch CPU (device time)",
           "speedup.torch-cpu.compute", ("lp-pool-*",), at_least=1.0),
    Target("fold", "fold and LP pooling >= 30% of the device's shader-copy bandwidth",
           "pct_shader_copy", ("fold-*", "lp-pool-*"), at_least=30.0),
    Target("padding", "padding >= 80% of the device's shader-copy bandwidth",
           "pct_shader_copy", _PAD, at_least=80.0),
    Target("convolution", "float32 conv2d >= 7x ncnn-vulkan (geometric mean, device time)",
           "speedup.ncnn-vulkan.compute", _CONV2D, ("*-f16",), "geomean", at_least=7.0),
    Target("convolution", "float32 conv2d and transposed conv2d >= 1.5x ncnn-vulkan on every "
           "device (geometric mean over the workloads ncnn runs correctly, device time)",
           "speedup.ncnn-vulkan.compute", _CONV2D + ("convT2d-*",), ("*-f16",), "geomean",
           at_least=1.5, peer_correct_only=True),
    Target("convolution", "conv2d >= 65% of the FMA peak (geometric mean)",
           "pct_fma", _CONV2D, (), "geomean", at_least=65.0),
    Target("convolution", "conv3d and transposed conv2d >= 30% of the FMA peak", "pct_fma",
           ("conv3d-*", "convT2d-*"), at_least=30.0),
    Target("model operators", "element-wise, identity, join/split/slice and resample >= 60% "
           "of the device's shader-copy bandwidth", "pct_shader_copy", _COPY_LIKE,
           at_least=60.0),
    Target("model operators", "max/average pooling and reduce >= 50% of the device's "
           "shader-copy bandwidth", "pct_shader_copy", _POOL_REDUCE, at_least=50.0),
    Target("model operators", "GEMM >= 60% of the FMA peak where it is compute-bound "
           "(M, N, K >= 256)", "pct_fma", ("gemm-256x*", "gemm-512x*", "gemm-1024x*"),
           at_least=60.0),
    Target("model operators", "softmax and batch normalization >= 50% of the device's "
           "shader-copy bandwidth", "pct_shader_copy", ("softmax-*", "batch-norm-*"),
           at_least=50.0),
    Target("graph", "a compiled graph >= 1.3x its operators executed one by one",
           "speedup.vkml-ops.e2e", ("graph-*",), at_least=1.3),
    Target("graph", "the ONNX backend within 10% of the same DML graph built by hand",
           "speedup.vkml-onnx.e2e", ("graph-*",), at_most=1.1),
    Target("graph", "the graph's arena smaller than the sum of the intermediates it declares",
           "graph.arena_vs_declared", ("graph-*",), at_most=0.99),
]


def _figure(row: dict, figure: str):
    parts = figure.split(".")
    if parts[0] == "speedup":
        v = ((row.get("speedup") or {}).get(parts[1]) or {}).get(parts[2])
        return v
    if parts[0] == "graph":
        return (row.get("graph") or {}).get(parts[1])
    return row.get(figure)


def _match(name: str, t: Target) -> bool:
    return (any(fnmatch.fnmatch(name, p) for p in t.workloads)
            and not any(fnmatch.fnmatch(name, p) for p in t.exclude))


def _summary(kind: str, names: list[str]) -> list[str]:
    if not names:
        return []
    return [f"{kind}: {', '.join(names) if len(names) <= 2 else f'{len(names)} workloads'}"]


def check(doc: dict) -> list[dict]:
    """Every target on every device of the run (those with no figure are left out)."""
    flagged_peers = {(r["workload"], r["runner"], r["device"]) for r in doc["results"]
                     if r["runner"] != "vkml" and r.get("flagged")}
    out = []
    for dev in doc["devices"]:
        for t in TARGETS:
            values, wrong, peer_wrong = {}, [], []
            if not t.workloads:
                section, key = t.figure.split(".")
                v = (dev.get(section) or {}).get(key)
                if v is not None:
                    values[section] = v
            else:
                for r in doc["results"]:
                    if r["runner"] != "vkml" or r["device"] != dev["index"]:
                        continue
                    if not _match(r["workload"], t) or r["status"] != "ok":
                        continue
                    v = _figure(r, t.figure)
                    if v is None:
                        continue
                    if r.get("flagged"):
                        wrong.append(r["workload"])
                    if t.figure.startswith("speedup.") and any(
                            (r["workload"], t.figure.split(".")[1], d) in flagged_peers
                            for d in (None, dev["index"])):
                        peer_wrong.append(r["workload"])
                        if t.peer_correct_only:
                            continue
                    values[r["workload"]] = v
            if not values:
                continue
            notes = _summary("vkml result wrong", wrong) + _summary(
                f"{t.figure.split('.')[1] if t.figure.startswith('speedup.') else ''} result "
                f"wrong ({'left out' if t.peer_correct_only else 'ratio kept'})", peer_wrong)
            if t.aggregate == "geomean":
                value = math.exp(sum(math.log(max(v, 1e-12)) for v in values.values())
                                 / len(values))
                checked = [value]
            else:
                checked = list(values.values())
                value = min(checked) if t.at_least is not None else max(checked)
            met = all((t.at_least is None or v >= t.at_least)
                      and (t.at_most is None or v <= t.at_most) for v in checked)
            out.append({"area": t.area, "target": t.what, "device": dev["index"],
                        "device_name": dev["name"], "aggregate": t.aggregate,
                        "value": value, "values": values,
                        "threshold": t.at_least if t.at_least is not None else t.at_most,
                        "direction": ">=" if t.at_least is not None else "<=",
                        "met": met and not wrong, "notes": notes})
    return out

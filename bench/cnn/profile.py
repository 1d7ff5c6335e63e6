"""``python -m bench models --profile``: per layer, vkml's device time (``rep.profile``:
timestamps between the compiled graph's nodes) next to the layer's roofline bound
(``flops``: the larger of its FLOPs over the FMA peak and its bytes over the shader-copy
bandwidth) and the share of that bound it reaches (bound / time: 100% is the roofline).

A profile entry (one compiled node) is joined with the ``flops`` layers whose own ONNX
node it runs; entries that no layer counts (an Add, a pooling counted by bytes: every
layer is counted) show no bound only where ``flops`` skips the node (a free alias)."""
from __future__ import annotations

import numpy as np

from . import flops as flops_mod


def profile_rows(prof, counted: dict, limits: dict | None) -> list:
    """One dict per profile entry: ``names``, ``op_types``, ``kernel``, ``ms``, ``flops``,
    ``bytes``, ``bound_ms`` and ``share`` (None without limits)."""
    by_name = {}
    for (op, f, b), names in zip(counted["layers"], counted["layer_nodes"]):
        by_name[names[0]] = (f, b)
    rows = []
    for e in prof.entries:
        f = sum(by_name.get(n, (0, 0))[0] for n in e.names)
        b = sum(by_name.get(n, (0, 0))[1] for n in e.names)
        bound = None
        if limits and any(n in by_name for n in e.names):
            bound = sum(flops_mod.layer_bound(*by_name[n], limits["fma_gflops"],
                                              limits["shader_copy_gbs"])
                        for n in e.names if n in by_name) * 1e3
        rows.append({"where": e.where, "names": list(e.names), "op_types": list(e.op_types),
                     "kernel": e.kernel, "ms": e.ms, "flops": f, "bytes": b,
                     "bound_ms": bound, "share": bound / e.ms if bound and e.ms else None})
    return rows


def text(model: str, rows: list, prof) -> str:
    """The per-layer table, then the sums by kernel (time, bound, share)."""
    out = [f"{model}: per-layer device time (rep.profile) against the roofline",
           f"{'ms':>8s} {'bound':>7s} {'share':>6s}  {'kernel':22s} {'MFLOP':>7s} {'KB':>7s}  node"]
    for r in rows:
        bound = f"{r['bound_ms']:7.3f}" if r["bound_ms"] is not None else "      -"
        share = f"{r['share']:6.1%}" if r["share"] is not None else "     -"
        out.append(f"{r['ms']:8.3f} {bound} {share}  {r['kernel'] or r['where']:22s} "
                   f"{r['flops'] / 1e6:7.1f} {r['bytes'] / 1e3:7.0f}  "
                   f"{r['names'][0]} ({'+'.join(r['op_types'])})")
    groups: dict = {}
    for r in rows:
        g = groups.setdefault(r["kernel"] or r["where"], [0, 0.0, 0.0])
        g[0] += 1
        g[1] += r["ms"]
        g[2] += r["bound_ms"] or 0.0
    total = sum(r["ms"] for r in rows)
    out.append("by kernel: " + "; ".join(
        f"{k} x{n} {ms:.2f} ms ({ms / total:.0%}, roofline share {b / ms:.0%})"
        for k, (n, ms, b) in sorted(groups.items(), key=lambda kv: -kv[1][1])))
    bound = sum(r["bound_ms"] or 0.0 for r in rows)
    out.append(f"total {total:.2f} ms marked ({prof.run_ms:.2f} ms unmarked, "
               f"{prof.host_ms:.2f} ms host); roofline {bound:.2f} ms = "
               f"{bound / total if total else np.nan:.1%} of the marked time")
    return "\n".join(out)


def measure(spec, size: int, data: bytes, dev, limits: dict | None, repeat: int,
            log=print) -> list:
    """Prepare the model on ``dev``, profile it on the bench's input (seed 0), log the
    table and return :func:`profile_rows`."""
    import vkml.onnx

    x = np.random.default_rng(0).standard_normal((1, 3, size, size)).astype(np.float32)
    rep = vkml.onnx.prepare(data, device=dev)
    try:
        rep.run([x])                            # tuned and compiled before the profile
        prof = rep.profile([x], repeat=repeat)
    finally:
        rep.release()
    rows = profile_rows(prof, flops_mod.count_apart(data), limits)
    log(text(f"{spec.name} {size}x{size} on {dev.info.name}", rows, prof))
    return rows

"""Reports of a run: the terminal tables (rich), JSON, CSV, the schema check, and the
comparison of two runs."""
from __future__ import annotations

import csv
import json
import math

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .run import PCT_KEYS, SCHEMA

# -- formatting -----------------------------------------------------------------------


def ms(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 1 else (f"{v:.2f}" if v < 100 else f"{v:.0f}")


def rate(row: dict) -> str:
    if row.get("gflops") is not None:
        return f"{row['gflops']:.1f} GFLOP/s"
    if row.get("gbs") is not None:
        return f"{row['gbs']:.2f} GB/s"
    return "-"


def pct(row: dict, first_only: bool = False) -> str:
    """vkml's share of the device limits: FMA peak (FLOP workloads), compute-shader copy
    and vkCmdCopyBuffer bandwidth (data movement); ``first_only``: the first of them."""
    parts = []
    for key, name in (("pct_fma", "FMA"), ("pct_shader_copy", "shader"),
                      ("pct_copy_buffer", "copy")):
        if row.get(key) is not None:
            parts.append(f"{row[key]:.0f}% {name}")
    if not parts:
        return "-"
    return parts[0] if first_only else ", ".join(parts)


def paired_note(row: dict) -> str:
    """How the row's share was read in turns with its limit's microkernel
    (``bench.run.paired``): the turns, their shares' min-max and median, and the share
    of the limit measured once at the run's start; "" for a row not read in turns."""
    p = row.get("paired")
    if not p:
        return ""
    key = PCT_KEYS[p["limit"]]
    run = row.get(key + "_run")
    note = f"{p['n']} pairs {p['min']:.0f}-{p['max']:.0f}%, median {p['median']:.0f}%"
    return note + (f"; run-wide {run:.0f}%" if run is not None else "")


def err(row: dict) -> str:
    if row.get("max_rel_err") is None:
        return row.get("error_note", "-") if row.get("flagged") else "-"
    text = f"{row['max_rel_err']:.1e}"
    return f"[bold red]{text} > {row['tolerance']:.0e}[/]" if row["flagged"] else text


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _x3(v) -> str:
    """A speedup in at most four digits: 1234x, 123x, 12.3x, 1.23x."""
    if v is None:
        return "-"
    return f"{v:.0f}x" if v >= 99.5 else (f"{v:.1f}x" if v >= 9.95 else f"{v:.2f}x")


# -- the terminal ---------------------------------------------------------------------


def device_tables(doc: dict) -> list[Table]:
    out = []
    for d in doc["devices"]:
        t = Table(title=f"[{d['index']}] {d['name']} - {d['driver_name']} {d['driver_info']} "
                        f"(Vulkan {d['api_version']}, {d['device_type']})",
                  title_justify="left", show_header=True)
        t.add_column("device limit (measured now)")
        t.add_column("value", justify="right")
        t.add_column("note")
        lim = d.get("limits")
        if lim:
            det = lim["details"]
            variants = ", ".join(f"{k} {v['gbs']:.2f}" for k, v in
                                 det["shader_copy"]["variants"].items() if "gbs" in v)
            t.add_row("FMA throughput", f"{lim['fma_gflops']:.1f} GFLOP/s",
                      f"bench_fma, {det['fma']['timer']} time")
            t.add_row("compute-shader copy", f"{lim['shader_copy_gbs']:.2f} GB/s",
                      f"bench_copy: {variants}")
            t.add_row("vkCmdCopyBuffer", f"{lim['copy_buffer_gbs']:.2f} GB/s",
                      f"{det['copy_buffer']['bytes'] >> 20} MiB, one region")
            t.add_row("CPU copy (NumPy)", f"{lim['cpu_copy_gbs']:.2f} GB/s", "host memory")
            t.add_row("upload", f"{lim['upload_gbs']:.2f} GB/s",
                      f"{100 * lim['upload_vs_cpu_copy']:.0f}% of CPU copy (target >= 50%)")
            t.add_row("download", f"{lim['download_gbs']:.2f} GB/s",
                      f"{100 * lim['download_vs_cpu_copy']:.0f}% of CPU copy (target >= 50%)")
            if d.get("references"):
                t.add_row("timed in turns with each workload", "",
                          escape("; ".join(d["references"].values())))
        elif d.get("limits_error"):
            t.add_row("limits", "[red]error[/]", escape(d["limits_error"]))
        if d.get("references_error"):
            t.add_row("references", "[red]error[/]", escape(d["references_error"]))
        hp = d.get("hot_path")
        if hp:
            tg = hp["targets"]
            t.add_row("replayed sequence, per submit", f"{hp['replay_us_per_submit']:.0f} us",
                      f"one tiny padding (target on lavapipe <= {tg['replay_us_per_submit']:.0f} us)")
            t.add_row("execute() replay", f"{hp['execute_us']:.0f} us", "compiled.execute, same tensors")
            t.add_row(f"{hp['batch']} paddings in one submit", f"{hp['batched_us_per_padding']:.1f} us",
                      f"per padding (target on lavapipe <= {tg['batched_us_per_padding']:.0f} us)")
            t.add_row("vkml.pad on a tiny array", f"{hp['functional_tiny_pad_us']:.0f} us",
                      "NumPy in/out, end to end")
        elif d.get("hot_path_error"):
            t.add_row("hot path", "[red]error[/]", escape(d["hot_path_error"]))
        tc = d.get("tuning_cost")
        if tc:
            t.add_row("cold conv, VKML_TUNE=fast / off", f"{tc['fast_cold_vs_off']:.2f}x",
                      f"{tc['fast_cold_ms']:.0f} / {tc['off_cold_ms']:.0f} ms, new process, new "
                      f"shape (target <= {tc['targets']['fast_cold_vs_off']:.0f}x)")
            if tc.get("rank_ms") is not None:
                t.add_row("device ranking (once)", f"{tc['rank_ms']:.0f} ms",
                          "convolution families timed once per device and cache folder; "
                          f"strong here: {', '.join(tc.get('strong_families') or []) or 'none'}")
            t.add_row("same, second process", f"{tc['fast_warm_vs_off']:.2f}x",
                      f"{tc['fast_warm_ms']:.0f} / {tc['off_warm_ms']:.0f} ms, stored choice "
                      f"reused (target <= {tc['targets']['fast_warm_vs_off']:.2f}x)")
        elif d.get("tuning_cost_error"):
            t.add_row("tuning cost", "[red]error[/]", escape(d["tuning_cost_error"]))
        out.append(t)
    return out


def _speedups(r: dict, vk: dict, multi: bool, fmt=_x) -> str:
    """A peer row's vkml speedups (e2e / device time), per vkml device."""
    parts = []
    for (name, dev), v in vk.items():
        if name != r["workload"] or (r["device"] is not None and dev != r["device"]):
            continue
        sp = (v.get("speedup") or {}).get(r["runner"])
        if sp:
            best = sp["compute"] or sp["e2e"]
            colour = "green" if best >= 1 else "yellow"
            tag = f"[{dev}] " if multi else ""
            parts.append(f"[{colour}]{escape(tag)}{fmt(sp['e2e'])} / {fmt(sp['compute'])}[/]")
    return "; ".join(parts)


def graph_note(g: dict) -> str:
    """A graph row's arena next to the sum of its intermediates, after fusion and as
    declared (bench/graph.py)."""
    big = max(g["intermediate_bytes"], g.get("declared_intermediate_bytes", 0))
    unit, div = ("MiB", 1 << 20) if big >= 1 << 20 else ("KiB", 1024)
    note = f"arena {g['arena_bytes'] / div:.2f} of {g['intermediate_bytes'] / div:.2f} {unit}"
    if "declared_intermediate_bytes" in g:
        note += (f" (declared {g['declared_intermediate_bytes'] / div:.2f}, unfused arena "
                 f"{g['unfused_arena_bytes'] / div:.2f})")
    return note + f", {g['nodes']} nodes"


def results_table(doc: dict, wide: bool = False) -> Table:
    """Every (workload, runner) row.  The default fits 100 columns: workload, runner,
    median, vkml's speedup over the peer, its share of one device limit, rel err; the
    reasons of absent and failed rows are listed after the table.  ``wide`` adds the
    spread, cold and GPU times, transfers, rate, every device limit and the reasons."""
    multi = len(doc["devices"]) > 1
    right = {"justify": "right", "no_wrap": True}
    if wide:
        t = Table(title="Workloads (times in ms, median of hot runs; vkml's rate and share of "
                        "the device limits from its device time)", title_justify="left")
        columns = (("workload", {"no_wrap": True}), ("runner", {"no_wrap": True}),
                   ("median", right), ("p10-p90", right), ("cold", right), ("GPU", right),
                   ("up / down", right), ("rate", right),
                   ("of device limit", {"no_wrap": True}), ("rel err", right),
                   ("vkml speedup e2e / dev", {"overflow": "fold"}))
    else:
        t = Table(title="Workloads (median ms of hot runs; --wide for every figure)",
                  title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        columns = (("workload", {"no_wrap": True}), ("runner", {"no_wrap": True}),
                   ("median", right), ("vkml speedup", {"overflow": "fold"}),
                   ("of limit", {"no_wrap": True}), ("rel err", {"overflow": "fold"}))
    for name, kw in columns:
        t.add_column(name, **kw)
    vk = {(r["workload"], r["device"]): r for r in doc["results"] if r["runner"] == "vkml"}
    last = None
    for r in doc["results"]:
        label = r["runner"] + (f" [{r['device']}]" if multi and r["device"] is not None else "")
        label = escape(label)
        wl = r["workload"] if r["workload"] != last else ""
        if wl and last is not None:
            t.add_section()
        last = r["workload"]
        if r["status"] != "ok":
            style = "dim" if r["status"] == "absent" else "red"
            cells = [wl, f"[{style}]{label}[/]", f"[{style}]{r['status']}[/]"]
            if wide:
                cells += [""] * 7 + [f"[{style}]{escape(r['reason'] or '')}[/]"]
            else:
                cells += [""] * 3
            t.add_row(*cells)
            continue
        w = r["wall_ms"]
        if r["runner"] == "vkml":
            speed = f"[yellow]{escape(r['phases_error'])}[/]" if r.get("phases_error") else ""
            if r.get("graph"):
                speed = graph_note(r["graph"])
        else:
            speed = _speedups(r, vk, multi, _x if wide else _x3)
        if not wide:
            t.add_row(wl, label, ms(w["median"]), speed,
                      pct(r, first_only=True) if r["runner"] == "vkml" else "", err(r))
            continue
        ph = r.get("phases_ms") or {}
        updown = (f"{ms(ph['upload']['median'])} / {ms(ph['download']['median'])}"
                  if ph.get("upload") and ph.get("download") else "")
        gpu = ms(r["gpu_ms"]["median"]) if r.get("gpu_ms") else ""
        share = pct(r)
        if r.get("paired"):             # the note after the share it is about (the first)
            first, _, rest = share.partition(", ")
            share = f"{first} ({paired_note(r)})" + (f", {rest}" if rest else "")
        t.add_row(wl, label, ms(w["median"]), f"{ms(w['p10'])}-{ms(w['p90'])}",
                  ms(r.get("cold_ms")), gpu, updown, rate(r), share, err(r), speed)
    return t


def targets_table(doc: dict) -> Table | None:
    rows = doc.get("targets") or []
    if not rows:
        return None
    multi = len(doc["devices"]) > 1
    t = Table(title="Performance goals (stated for lavapipe; vkml is still being optimised)",
              title_justify="left")
    for name in ("area", "target", "value", "needed", "met"):
        t.add_column(name, justify="right" if name in ("value", "needed") else "left")
    for r in rows:
        v = r["value"]
        text = f"{v:.3g}" + (" (geomean)" if r["aggregate"] == "geomean" else
                             " (worst)" if len(r["values"]) > 1 else "")
        met = "[green]yes[/]" if r["met"] else "[red]no[/]"
        if r["notes"]:
            met += f" [red]({escape('; '.join(r['notes']))})[/]"
        label = (f"[{r['device']}] " if multi else "") + r["target"]
        t.add_row(r["area"], label, text, f"{r['direction']} {r['threshold']:g}", met)
    return t


def absent_notes(doc: dict, status: str = "absent") -> list[str]:
    """Each runner's reasons for rows of ``status`` ("absent" or "error"), once each, with
    the workloads."""
    seen: dict[tuple, list] = {}
    for r in doc["results"]:
        if r["status"] == status:
            seen.setdefault((r["runner"], r["reason"]), []).append(r["workload"])
    return [f"{runner}: {reason} ({', '.join(ws) if len(ws) < 4 else f'{len(ws)} workloads'})"
            for (runner, reason), ws in seen.items()]


def print_report(doc: dict, console: Console | None = None, wide: bool = False) -> None:
    """The run on the terminal; the workload table compact (fits 100 columns) unless
    ``wide``."""
    console = console or Console()
    host = doc["host"]
    console.print(f"[bold]vkml-bench[/] {escape(doc['created'])}  {escape(host['processor'])} "
                  f"({host['cpus']} CPUs), Python {escape(host['python'])}")
    vers = ", ".join(f"{k} {v}" for k, v in doc["versions"].items())
    console.print(f"versions: {escape(vers)}")
    for name, p in doc["peers"].items():
        if not p["available"]:
            console.print(f"[dim]peer {escape(name)} absent: {escape(p['reason'])}[/]")
    for t in device_tables(doc):
        console.print(t)
    console.print(results_table(doc, wide))
    for status, style in (("absent", "dim"), ("error", "red")):
        notes = absent_notes(doc, status)
        if notes and (status == "absent" or not wide):
            console.print(f"[bold]{status}[/]")
            for n in notes:
                console.print(f"  [{style}]{escape(n)}[/]")
    table = targets_table(doc)
    if table is not None:
        console.print(table)
    flagged = [r for r in doc["results"] if r.get("flagged")]
    for r in flagged:
        note = f" ({r['error_note']})" if r.get("error_note") else ""
        console.print(f"[bold red]correctness: {escape(r['workload'])} on "
                      f"{escape(r['runner'])}: max rel err {r.get('max_rel_err')} over "
                      f"tolerance {r['tolerance']}{escape(note)}[/]")
    console.print("[dim]vkml speedup = the peer's median / vkml's: 'e2e' against vkml's "
                  "NumPy-in/NumPy-out call, 'dev' against its device time (GPU timestamps). "
                  "rel err = max |y - ref| / max |ref| against a float64 NumPy reference. "
                  + ("GB/s count bytes read + written." if wide else
                     "'of limit': vkml's share of the FMA peak or the shader-copy "
                     "bandwidth, their microkernel timed in turns with the workload "
                     "(each side's fastest run; --wide: the turns' spread and the share "
                     "of the limit measured above).") + "[/]")


# -- files ----------------------------------------------------------------------------


def write_json(doc: dict, path) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=_plain)
        f.write("\n")


def _plain(v):
    if hasattr(v, "item"):
        return v.item()
    if isinstance(v, (set, tuple)):
        return list(v)
    return str(v)


CSV_COLUMNS = [
    "kind", "device", "device_name", "workload", "op", "dtype", "runner", "status", "reason",
    "value", "cold_ms", "median_ms", "min_ms", "max_ms", "p10_ms", "p90_ms", "gpu_median_ms",
    "compute_wall_median_ms", "upload_median_ms", "download_median_ms", "flops", "bytes",
    "gflops", "gbs", "pct_fma", "pct_shader_copy", "pct_copy_buffer", "max_abs_err",
    "max_rel_err", "tolerance", "flagged", "speedups", "pct_fma_run", "pct_shader_copy_run",
    "paired_n", "paired_min", "paired_max", "paired_min_over_min", "paired_reference_rate"]


def csv_rows(doc: dict):
    """One row per figure: versions, device limits and hot-path figures, then results."""
    for k, v in doc["versions"].items():
        yield {"kind": "version", "workload": k, "value": v}
    for d in doc["devices"]:
        base = {"device": d["index"], "device_name": d["name"]}
        yield dict(base, kind="driver", workload=d["driver_name"], value=d["driver_info"])
        for section in ("limits", "hot_path", "tuning_cost"):
            for k, v in (d.get(section) or {}).items():
                if isinstance(v, (int, float)):
                    yield dict(base, kind=section, workload=k, value=v)
    for tg in doc.get("targets", []):
        yield {"kind": "target", "device": tg["device"], "device_name": tg["device_name"],
               "workload": f"{tg['area']}: {tg['target']}", "value": tg["value"],
               "status": "met" if tg["met"] else "not met"}
    for r in doc["results"]:
        row = {k: r.get(k) for k in ("device", "device_name", "workload", "op", "dtype",
                                     "runner", "status", "reason", "cold_ms", "flops", "bytes",
                                     "gflops", "gbs", "pct_fma", "pct_shader_copy",
                                     "pct_copy_buffer", "max_abs_err", "max_rel_err",
                                     "tolerance", "flagged")}
        row["kind"] = "result"
        w = r.get("wall_ms") or {}
        for k in ("median", "min", "max", "p10", "p90"):
            row[f"{k}_ms"] = w.get(k)
        ph = r.get("phases_ms") or {}
        for k, col in (("compute_gpu", "gpu_median_ms"), ("compute_wall", "compute_wall_median_ms"),
                       ("upload", "upload_median_ms"), ("download", "download_median_ms")):
            row[col] = (ph.get(k) or {}).get("median")
        if r.get("speedup"):
            row["speedups"] = json.dumps(r["speedup"])
        row["pct_fma_run"], row["pct_shader_copy_run"] = (r.get("pct_fma_run"),
                                                          r.get("pct_shader_copy_run"))
        for k in ("n", "min", "max", "min_over_min", "reference_rate"):
            row[f"paired_{k}"] = (r.get("paired") or {}).get(k)
        yield row


def write_csv(doc: dict, path) -> None:
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, CSV_COLUMNS)
        out.writeheader()
        for row in csv_rows(doc):
            out.writerow(row)


def markdown(doc: dict) -> str:
    """The run as Markdown (for bench/RESULTS.md): command, versions, device limits and
    hot path, targets, and every workload."""
    import re

    plain = lambda text: re.sub(r"\[/?[a-z ]*\]", "", text)   # noqa: E731  (drop rich markup)
    host = doc["host"]
    lines = [f"Command: `{' '.join(doc['command'])}`  ", f"Run: {doc['created']} on "
             f"{host['processor']} ({host['cpus']} CPUs), Python {host['python']}  ",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items()), ""]
    for d in doc["devices"]:
        lines += [f"**[{d['index']}] {d['name']}** ({d['driver_name']} {d['driver_info']}, "
                  f"Vulkan {d['api_version']})", "", "| device figure | value |", "|---|---|"]
        lim, hp = d.get("limits") or {}, d.get("hot_path") or {}
        for key, name, unit in (("fma_gflops", "FMA throughput (bench_fma)", "GFLOP/s"),
                                ("shader_copy_gbs", "compute-shader copy (bench_copy)", "GB/s"),
                                ("copy_buffer_gbs", "vkCmdCopyBuffer", "GB/s"),
                                ("cpu_copy_gbs", "CPU copy (NumPy)", "GB/s"),
                                ("upload_gbs", "upload", "GB/s"), ("download_gbs", "download", "GB/s")):
            if lim.get(key) is not None:
                lines.append(f"| {name} | {lim[key]:.2f} {unit} |")
        for key, name in (("replay_us_per_submit", "replayed sequence, per submit"),
                          ("execute_us", "execute() replay"),
                          ("batched_us_per_padding", "100 paddings in one submit, each"),
                          ("functional_tiny_pad_us", "vkml.pad on a tiny NumPy array")):
            if hp.get(key) is not None:
                lines.append(f"| {name} | {hp[key]:.1f} us |")
        if d.get("references"):
            lines.append("| timed in turns with each workload | "
                         f"{'; '.join(d['references'].values())} |")
        tc = d.get("tuning_cost") or {}
        if tc:
            lines.append(f"| cold conv, VKML_TUNE=fast / off | {tc['fast_cold_vs_off']:.2f}x "
                         f"({tc['fast_cold_ms']:.0f} / {tc['off_cold_ms']:.0f} ms) |")
            lines.append(f"| same, second process (stored choice) | {tc['fast_warm_vs_off']:.2f}x "
                         f"({tc['fast_warm_ms']:.0f} / {tc['off_warm_ms']:.0f} ms) |")
            if tc.get("rank_ms") is not None:
                lines.append(f"| device ranking of convolution families (once) | "
                             f"{tc['rank_ms']:.0f} ms (strong: "
                             f"{', '.join(tc.get('strong_families') or []) or 'none'}) |")
        lines.append("")
    if doc.get("targets"):
        lines += ["| area | target | device | value | needed | met |", "|---|---|---|---|---|---|"]
        for t in doc["targets"]:
            note = f" ({'; '.join(t['notes'])})" if t["notes"] else ""
            agg = " geomean" if t["aggregate"] == "geomean" else (
                " worst" if len(t["values"]) > 1 else "")
            lines.append(f"| {t['area']} | {t['target']} | [{t['device']}] | "
                         f"{t['value']:.3g}{agg} | {t['direction']} {t['threshold']:g} | "
                         f"{'yes' if t['met'] else 'no'}{note} |")
        lines.append("")
    multi = len(doc["devices"]) > 1
    lines += ["| workload | runner | median ms | p10-p90 | cold ms | GPU ms | rate | of device "
              "limit | in turns with the limit | rel err | vkml speedup e2e / dev |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    vk = {(r["workload"], r["device"]): r for r in doc["results"] if r["runner"] == "vkml"}
    for r in doc["results"]:
        label = r["runner"] + (f" [{r['device']}]" if multi and r["device"] is not None else "")
        if r["status"] != "ok":
            lines.append(f"| {r['workload']} | {label} | {r['status']} | | | | | | | | "
                         f"{r['reason']} |")
            continue
        w = r["wall_ms"]
        sp = []
        if r["runner"] != "vkml":
            for (name, dev), v in vk.items():
                s_ = (v.get("speedup") or {}).get(r["runner"])
                if name == r["workload"] and s_ and (r["device"] in (None, dev)):
                    sp.append((f"[{dev}] " if multi else "") + f"{_x(s_['e2e'])} / {_x(s_['compute'])}")
        gpu = ms(r["gpu_ms"]["median"]) if r.get("gpu_ms") else ""
        lines.append(f"| {r['workload']} | {label} | {ms(w['median'])} | {ms(w['p10'])}-"
                     f"{ms(w['p90'])} | {ms(r.get('cold_ms'))} | {gpu} | {rate(r)} | {pct(r)} | "
                     f"{paired_note(r)} | {plain(err(r))} | {'; '.join(sp)} |")
    return "\n".join(lines) + "\n"


# -- the schema -----------------------------------------------------------------------

_TOP = {"schema": str, "created": str, "command": list, "quick": bool, "budget": dict,
        "host": dict, "versions": dict, "peers": dict, "devices": list, "workloads": list,
        "results": list, "targets": list}
_DEVICE = {"index": int, "name": str, "driver_name": str, "api_version": str,
           "timestamps": bool}
_RESULT = {"workload": str, "op": str, "dtype": str, "runner": str, "status": str,
           "flops": (int, float), "bytes": int, "tolerance": float}
_RESULT_OK = {"cold_ms": float, "wall_ms": dict, "max_abs_err": (int, float),
              "max_rel_err": (int, float), "flagged": bool}
_STATS = ("n", "median", "min", "max", "p10", "p90", "mean")
_LIMITS = ("fma_gflops", "shader_copy_gbs", "copy_buffer_gbs", "cpu_copy_gbs", "upload_gbs",
           "download_gbs")


_PAIRED = ("median", "min", "max", "min_over_min", "reference_rate")


def _paired_problems(r: dict, where: str) -> list[str]:
    """A row's share read in turns (``bench.run.paired``): its turns' count and shares,
    the limit it stands for, and the share key holding its median."""
    p, out = r["paired"], []
    if not isinstance(p.get("n"), int) or p["n"] < 1:
        out.append(f"{where}.paired.n: expected a positive count of turns")
    for k in _PAIRED:
        if not isinstance(p.get(k), (int, float)) or not p[k] > 0:
            out.append(f"{where}.paired.{k}: expected a positive number")
    key = PCT_KEYS.get(p.get("limit"))
    if key is None:
        out.append(f"{where}.paired.limit: {p.get('limit')!r}")
    elif r.get(key) != p.get("min_over_min"):
        out.append(f"{where}.{key}: expected the paired share (min_over_min)")
    return out


def validate(doc: dict) -> list[str]:
    """Problems with a result document (empty when it follows :data:`SCHEMA`)."""
    problems = []

    def need(obj, spec, where):
        for k, t in spec.items():
            if k not in obj:
                problems.append(f"{where}: missing {k!r}")
            elif not isinstance(obj[k], t) or (t is not bool and isinstance(obj[k], bool)
                                                and bool not in (t if isinstance(t, tuple) else (t,))):
                problems.append(f"{where}.{k}: expected {t}, got {type(obj[k]).__name__}")

    need(doc, _TOP, "doc")
    if doc.get("schema") != SCHEMA:
        problems.append(f"doc.schema: expected {SCHEMA!r}, got {doc.get('schema')!r}")
    for i, d in enumerate(doc.get("devices", [])):
        need(d, _DEVICE, f"devices[{i}]")
        if d.get("limits"):
            for k in _LIMITS:
                v = d["limits"].get(k)
                if not isinstance(v, (int, float)) or not v > 0:
                    problems.append(f"devices[{i}].limits.{k}: expected a positive number")
    for i, r in enumerate(doc.get("results", [])):
        where = f"results[{i}] ({r.get('workload')}, {r.get('runner')})"
        need(r, _RESULT, where)
        if r.get("status") not in ("ok", "absent", "error"):
            problems.append(f"{where}.status: {r.get('status')!r}")
        if r.get("status") == "ok":
            need(r, _RESULT_OK, where)
            for k in _STATS:
                if not isinstance((r.get("wall_ms") or {}).get(k), (int, float)):
                    problems.append(f"{where}.wall_ms.{k}: missing")
        elif not r.get("reason"):
            problems.append(f"{where}: status {r.get('status')} without a reason")
        if r.get("runner") == "vkml" and r.get("status") == "ok" and "speedup" not in r:
            problems.append(f"{where}: vkml row without speedups")
        if r.get("paired") is not None:
            problems += _paired_problems(r, where)
    return problems


# -- comparing two runs -----------------------------------------------------------------


def compare(a: dict, b: dict, threshold: float = 0.05) -> tuple[Table, int]:
    """A table of the change from run ``a`` to run ``b`` per (workload, runner, device),
    and the number of regressions (slower by more than ``threshold``)."""
    def key(r):
        return (r["workload"], r["runner"], r.get("device_name"))

    def timing(r):
        if r.get("status") != "ok":
            return None
        if r["runner"] == "vkml" and r.get("compute_ms"):
            return r["compute_ms"]
        return (r.get("wall_ms") or {}).get("median")

    old = {key(r): r for r in a["results"]}
    t = Table(title=f"{a.get('created', '?')} -> {b.get('created', '?')}: median time "
                    f"(vkml: device time); regressions over {threshold:.0%} in red",
              title_justify="left")
    for name in ("workload", "runner", "device", "before ms", "after ms", "change",
                 "max rel err"):
        t.add_column(name, justify="right" if "ms" in name or name == "change" else "left")
    regressions = 0
    for r in b["results"]:
        o = old.get(key(r))
        ta, tb = (timing(o) if o else None), timing(r)
        if ta and tb:
            change = tb / ta - 1
            if change > threshold:
                style, regressions = "bold red", regressions + 1
            elif change < -threshold:
                style = "green"
            else:
                style = ""
            text = f"[{style}]{change:+.1%}[/]" if style else f"{change:+.1%}"
        else:
            text = "new" if o is None else (r["status"] if tb is None else "was " + o["status"])
        errb = err(r) if r.get("status") == "ok" else "-"
        t.add_row(r["workload"], r["runner"], r.get("device_name") or "cpu", ms(ta), ms(tb),
                  text, errb)
    for d in b.get("devices", []):
        da = next((x for x in a.get("devices", []) if x["name"] == d["name"]), None)
        if not (da and da.get("limits") and d.get("limits")):
            continue
        for k in _LIMITS:
            va, vb = da["limits"].get(k), d["limits"].get(k)
            if va and vb and not (math.isnan(va) or math.isnan(vb)):
                t.add_row(f"limit {k}", "", d["name"], f"{va:.2f}", f"{vb:.2f}",
                          f"{vb / va - 1:+.1%}", "")
    return t, regressions

"""The tables of ``python -m bench models``: per device, a row per model (vkml's times,
each peer's hot median and vkml's speedup over it, rel errs against ONNX Runtime CPU,
placement, shares of the device's limits); the op types left on the host with vkml's
reason; the peers that could not run, with theirs."""
from __future__ import annotations

#: "prepare s"/"first s": in this process, with whatever cache it has; "cold s"/"warm s":
#: prepare plus first run in a fresh process with an empty cache, then in a second one
#: with the same cache (``run.cold_start``).
HEAD = ["model", "input", "prepare s", "first s", "cold s", "warm s", "vkml ms"]
#: "FMA % cpu": the same share counted in process CPU time (``run.shares``: a CPU
#: driver's figure that a loaded machine leaves comparable).
TAIL = ["rel err", "host nodes / parts", "strict", "FMA %", "roofline %", "FMA % cpu"]


def _f(v, fmt="{:.3g}") -> str:
    return "-" if v is None else fmt.format(v)


def _peer_names(rows) -> list:
    names = []
    for r in rows:
        for n in r["peers"]:
            if n not in names:
                names.append(n)
    return names


def _peer_cell(p: dict) -> str:
    if p.get("status") != "ok":
        return "absent" if p.get("status") == "absent" else "error"
    return f"{p['hot']['median']:.1f} ({p.get('vkml_speedup', 0):.2f}x)"


def _cold_cell(c: dict | None) -> str:
    if not c:
        return "-"
    return f"{c['prepare_s'] + c['first_s']:.1f}" if c["status"] == "ok" else c["status"]


def _errs(r: dict) -> str:
    vk = r["vkml"]
    dtype = "" if vk.get("dtype", "float32") == "float32" else f" {vk['dtype']}"
    out = [f"vkml{dtype} {_f(vk.get('rel_err'), '{:.1e}')}"]
    for n, p in r["peers"].items():
        if p.get("status") == "ok" and n != "onnxruntime-cpu":
            out.append(f"{n} {p['rel_err']:.1e}")
    return ", ".join(out)


def table_rows(rows) -> tuple[list, list]:
    """(header, [cells]) of one device's model table."""
    names = _peer_names(rows)
    header = HEAD + [f"{n} ms (vkml x)" for n in names] + TAIL
    out = []
    for r in rows:
        vk = r["vkml"]
        if vk.get("status") != "ok":
            out.append([r["model"], f"{r['size']}", "error: " + vk.get("error", "")[:60]]
                       + [""] * (len(header) - 3))
            continue
        strict = "yes" if vk["strict"]["accepted"] else f"no ({vk['strict']['refused_op']})"
        cold = vk.get("cold_start", {})
        cells = [r["model"], f"{r['size']}", f"{vk['prepare_s']:.1f}", f"{vk['first_s']:.1f}",
                 _cold_cell(cold.get("cold")), _cold_cell(cold.get("warm")),
                 f"{vk['hot']['median']:.1f}"]
        cells += [_peer_cell(r["peers"].get(n, {})) for n in names]
        cells += [_errs(r), f"{vk['host_node_count']} / {vk['device_partitions']}d+"
                  f"{vk['host_partitions']}h", strict,
                  _f(r.get("fma_share") and 100 * r["fma_share"], "{:.1f}"),
                  _f(r.get("roofline_share") and 100 * r["roofline_share"], "{:.1f}"),
                  _f(r.get("fma_cpu_share") and 100 * r["fma_cpu_share"], "{:.1f}")]
        out.append(cells)
    return header, out


def host_ops(rows) -> list:
    """[(op type, nodes, models, reason)] over every row."""
    seen: dict = {}
    for r in rows:
        for op, e in r["vkml"].get("host_ops", {}).items():
            s = seen.setdefault((op, e["reason"]), [0, []])
            if r["model"] not in s[1]:
                s[0] += e["count"]
                s[1].append(r["model"])
    return [(op, n, ", ".join(ms), why) for (op, why), (n, ms) in seen.items()]


def absent(rows) -> list:
    seen = {}
    for r in rows:
        for n, p in r["peers"].items():
            if p.get("status") != "ok":
                seen.setdefault((n, p.get("reason", "")[:300]), []).append(r["model"])
    return [(n, ", ".join(ms), why) for (n, why), ms in seen.items()]


def by_device(doc) -> dict:
    out: dict = {}
    for r in doc["rows"]:
        out.setdefault((r["device"], r["driver"]), []).append(r)
    return out


def _limits_line(rows) -> str:
    lim = rows[0].get("limits")
    if not lim:
        return "device limits not measured"
    paired = any(r.get("paired") for r in rows)
    return (f"FMA peak {lim['fma_gflops']:.1f} GFLOP/s, shader copy "
            f"{lim['shader_copy_gbs']:.1f} GB/s (read + write)"
            + ("; FMA % and roofline % against the microkernels run after each hot run"
               if paired else ""))


def print_tables(doc) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=220)
    for (dev, driver), rows in by_device(doc).items():
        header, cells = table_rows(rows)
        t = Table(title=f"{dev} ({driver}): {_limits_line(rows)}", title_justify="left")
        for h in header:
            t.add_column(h)
        for c in cells:
            t.add_row(*c)
        console.print(t)
        for title, cols, data in (("On the host", ["op", "nodes", "models", "why"],
                                   host_ops(rows)),
                                  ("Absent peers", ["peer", "models", "why"], absent(rows))):
            if data:
                t = Table(title=title, title_justify="left")
                for h in cols:
                    t.add_column(h)
                for d in data:
                    t.add_row(*map(str, d))
                console.print(t)


def _md(header, cells) -> str:
    esc = lambda s: str(s).replace("|", "\\|")     # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def markdown(doc) -> str:
    out = [f"Command: `{' '.join(doc['command'])}`, commit {doc.get('commit')}, "
           f"machine {doc.get('machine')} ({doc.get('cpu')}).\n"]
    for (dev, driver), rows in by_device(doc).items():
        out.append(f"\n**{dev}** ({driver}): {_limits_line(rows)}.\n\n")
        out.append(_md(*table_rows(rows)))
        if host_ops(rows):
            out.append("\nOn the host:\n\n" + _md(["op", "nodes", "models", "why"],
                                                  host_ops(rows)))
        if absent(rows):
            out.append("\nAbsent peers:\n\n" + _md(["peer", "models", "why"], absent(rows)))
    return "".join(out)

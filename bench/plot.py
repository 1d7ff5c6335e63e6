"""``--plot out.png``: vkml's speed relative to each peer and to the device's own limits,
per workload (matplotlib, no display needed)."""
from __future__ import annotations


def plot(doc: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    vk = [r for r in doc["results"] if r["runner"] == "vkml" and r["status"] == "ok"]
    devices = {d["index"]: d["name"] for d in doc["devices"]}
    if not vk:
        raise SystemExit("--plot: no vkml result to plot")
    labels = [r["workload"] + (f" [{r['device']}]" if len(devices) > 1 else "") for r in vk]
    peers = sorted({p for r in vk for p in (r.get("speedup") or {})})
    y = np.arange(len(vk))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 1.2 + 0.42 * len(vk) * max(1, len(peers) / 3)),
                                   sharey=True)
    height = 0.8 / max(1, len(peers))
    for i, peer in enumerate(peers):
        vals = []
        for r in vk:
            sp = (r.get("speedup") or {}).get(peer) or {}
            vals.append(sp.get("compute") or sp.get("e2e") or np.nan)
        ax1.barh(y + (i - (len(peers) - 1) / 2) * height, vals, height, label=peer)
    ax1.axvline(1.0, color="black", linewidth=0.8)
    ax1.set_xscale("log")
    ax1.set_xlabel("vkml speedup over peer (peer time / vkml device time; > 1: vkml faster)")
    ax1.set_yticks(y, labels)
    ax1.invert_yaxis()
    ax1.legend(loc="upper left", bbox_to_anchor=(0, -0.12), ncol=len(peers), fontsize="small")
    ax1.grid(axis="x", which="both", alpha=0.3)

    kinds = [("pct_fma", "% of FMA peak"), ("pct_shader_copy", "% of shader copy"),
             ("pct_copy_buffer", "% of vkCmdCopyBuffer")]
    height2 = 0.8 / len(kinds)
    for i, (key, name) in enumerate(kinds):
        vals = [r.get(key) if r.get(key) is not None else np.nan for r in vk]
        ax2.barh(y + (i - 1) * height2, vals, height2, label=name)
    ax2.axvline(100, color="black", linewidth=0.8)
    ax2.set_xlabel("vkml (device time) as % of the device limit measured in the same run")
    ax2.legend(loc="upper left", bbox_to_anchor=(0, -0.12), ncol=3, fontsize="small")
    ax2.grid(axis="x", alpha=0.3)
    names = "; ".join(f"[{i}] {n}" for i, n in devices.items())
    fig.suptitle(f"vkml-bench {doc['created']} - {names}", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")   # keeps the legends below the axes
    plt.close(fig)

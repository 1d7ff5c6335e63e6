"""``VkmlRep.profile``: where a prepared model's time goes, node by node.

Each device partition's compiled graph is profiled (``CompiledGraph.profile``: device
milliseconds per compiled node from timestamp queries, the nodes kept apart by barriers)
on the values the model computes for the given inputs; each compiled node is reported
with the ONNX nodes it runs (a Conv with the Relu fused into it, a Gather lowered to
several slices and a join: one entry per compiled node, naming every ONNX node it
stands for).  Host partitions are reported with their wall time (the reference
evaluator), ``where="host"``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .execute import DevicePartition, GraphExecutor, node_label

__all__ = ["LayerProfile", "ModelProfile"]


@dataclass(frozen=True)
class LayerProfile:
    """One compiled node (or host partition): ``where`` ("device" or "host"),
    ``partition`` (its index in ``rep.partitions``), ``names`` and ``op_types`` of the
    ONNX nodes it runs, ``operator`` (the DML ``OPERATOR_TYPE``; "host" for a host
    partition), ``kernel`` (the chosen path or kernel, None where there is one) and
    ``ms`` (median: device time on the device, wall time on the host)."""

    where: str
    partition: int
    names: tuple
    op_types: tuple
    operator: str
    kernel: str | None
    ms: float


@dataclass(frozen=True)
class ModelProfile:
    """``entries`` (:class:`LayerProfile`, in execution order); ``device_ms``: the sum
    over device entries; ``run_ms``: the device partitions timed without the marks
    between nodes (summed); ``host_ms``: the host partitions' wall time."""

    entries: tuple
    device_ms: float
    run_ms: float
    host_ms: float

    def table(self) -> str:
        """One line per entry: ms, share of the device total, operator, kernel, nodes."""
        lines = []
        for e in self.entries:
            share = e.ms / self.device_ms if self.device_ms and e.where == "device" else 0.0
            lines.append(f"{e.ms:9.3f} ms {share:6.1%}  {e.where:6s} {e.kernel or '-':22s} "
                         + ", ".join(f"{n} ({t})" for n, t in zip(e.names, e.op_types)))
        lines.append(f"{self.device_ms:9.3f} ms on the device ({self.run_ms:.3f} ms without "
                     f"marks), {self.host_ms:.3f} ms on the host")
        return "\n".join(lines)


def _device_entries(k: int, part: DevicePartition, items, ex: GraphExecutor, env, repeat):
    gp = ex.profile(env, repeat)
    if gp is None:
        return [], 0.0
    out = []
    for e in gp.entries:
        js = sorted({ex.lowered.origins[d] for d in e.nodes})
        out.append(LayerProfile("device", k, tuple(node_label(part.nodes[j], items[j][0])
                                                   for j in js),
                                tuple(part.nodes[j].op_type for j in js), e.operator,
                                e.kernel, e.ms))
    return out, gp.run_ms


def profile_model(rep, inputs, repeat: int = 5) -> ModelProfile:
    """The module doc's profile of ``rep`` (a ``VkmlRep``) for ``inputs`` (as ``run``)."""
    feeds = rep._feeds(inputs)
    fed = frozenset(k for k in feeds if k in rep.overridable)
    if fed:
        return profile_model(rep._variant(fed), feeds, repeat)
    env = dict(rep.consts)
    env.update(feeds)
    entries, run_ms, host_ms = [], 0.0, 0.0
    for k, (part, (w, items)) in enumerate(zip(rep._parts, rep._groups)):
        t = time.perf_counter()
        part.run(env)            # compiles for these shapes; env gets the outputs
        wall = [time.perf_counter() - t]
        ex = part.last if isinstance(part, DevicePartition) else None
        if ex is not None:
            found, ms = _device_entries(k, part, items, ex, env, repeat)
            entries += found
            run_ms += ms
            continue
        for _ in range(repeat - 1):
            t = time.perf_counter()
            part.run(env)
            wall.append(time.perf_counter() - t)
        ms = float(np.median(wall)) * 1e3
        host_ms += ms
        entries.append(LayerProfile("host", k, tuple(node_label(n, i) for i, n in items),
                                    tuple(n.op_type for _, n in items), "host", None, ms))
    return ModelProfile(tuple(entries), sum(e.ms for e in entries if e.where == "device"),
                        run_ms, host_ms)

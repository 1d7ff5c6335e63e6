"""Per-node device time of a compiled graph (``CompiledGraph.profile``).

The graph is recorded as :meth:`CompiledGraph.execute` records it, with a
:meth:`~vkml.runtime.Sequence.mark` (a full barrier and a timestamp) before the first node
and after each node, and run ``repeat`` times; a node's time is the median over the runs
of the time between its two marks.  The barriers keep nodes from overlapping (so each
node's time is its own), which a plain run does not do where nodes are independent: the
profile's ``total_ms`` may exceed ``run_ms`` (the same graph timed without marks) by the
barriers' cost.  Devices without timestamps raise UnsupportedError.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedError

__all__ = ["NodeProfile", "GraphProfile", "kernel_of"]


@dataclass(frozen=True)
class NodeProfile:
    """One compiled node: ``index`` (its ``GraphDesc`` node index, the one ``paths``
    takes), ``nodes`` (every declared node it runs: fused ones too), their ``names``,
    ``operator`` (``OPERATOR_TYPE``), ``kernel`` (the path or kernel it chose, None
    where it has a single one) and ``ms`` (median device milliseconds)."""

    index: int
    nodes: tuple
    names: tuple
    operator: str
    kernel: str | None
    ms: float


@dataclass(frozen=True)
class GraphProfile:
    """``entries`` (:class:`NodeProfile`, in execution order); ``total_ms``: the marked
    runs' first to last mark (median; the entries' medians sum to about it);
    ``run_ms``: the graph run without marks, start to end of its sequence (median, same
    repeats)."""

    entries: tuple
    total_ms: float
    run_ms: float

    def table(self) -> str:
        """One line per node: ms, share of the total, operator, kernel, names."""
        lines = []
        for e in self.entries:
            share = e.ms / self.total_ms if self.total_ms else 0.0
            lines.append(f"{e.ms:9.3f} ms {share:6.1%}  {e.operator:28s} "
                         f"{e.kernel or '-':22s} {', '.join(map(str, e.names))}")
        lines.append(f"{self.total_ms:9.3f} ms total ({self.run_ms:.3f} ms without marks)")
        return "\n".join(lines)


def kernel_of(compiled) -> str | None:
    """The path or kernel variant ``compiled`` runs: a path object's candidate name (a
    convolution: "winograd-cl", the path with its knobs) or name, a path string (GEMM,
    padding, pooling), else its kernel variant name."""
    path = getattr(compiled, "path", None)
    name = getattr(path, "candidate", None) or getattr(path, "name", path)
    if isinstance(name, str):
        return name
    kernel = getattr(compiled, "kernel", None)
    return kernel if isinstance(kernel, str) else None


def profile_graph(graph, inputs, outputs, repeat: int, laid=frozenset()) -> GraphProfile:
    """The module doc's measurement of ``graph`` (a ``CompiledGraph``) on these tensors
    (``laid``: ``CompiledGraph.record``'s)."""
    if not graph.ctx.features.get("timestamps"):
        raise UnsupportedError("timestamps", "a profile times nodes with timestamp queries")
    repeat = max(1, int(repeat))
    graph._check_live()
    inputs, outputs = graph._check_bindings(inputs, outputs)
    order = graph.order
    with graph.ctx.sequence(timed=True, marks=len(order) + 1) as seq:
        graph.encode(seq, inputs, outputs, marks=True, laid=laid)
        runs, totals = [], []
        for _ in range(repeat):
            seq.run()
            stamps = np.asarray(seq.mark_ns, np.float64)
            runs.append(np.diff(stamps))
            totals.append(stamps[-1] - stamps[0])
    with graph.ctx.sequence(timed=True) as seq:
        graph.encode(seq, inputs, outputs, laid=laid)
        plain = []
        for _ in range(repeat):
            seq.run()
            plain.append(seq.gpu_time_ns)
    per_node = np.median(np.stack(runs), axis=0) * 1e-6
    entries = []
    for i, ms in zip(order, per_node):
        n = graph._graph_nodes[i]
        declared = tuple(sorted(n.origin))
        names = tuple(graph.graph.nodes[j].name or f"nodes[{j}]" for j in declared)
        entries.append(NodeProfile(i, declared, names, n.desc.OPERATOR_TYPE,
                                   kernel_of(n.compiled), float(ms)))
    return GraphProfile(tuple(entries), float(np.median(totals)) * 1e-6,
                        float(np.median(plain)) * 1e-6)

"""DML_GRAPH_DESC and its nodes and edges (``IDMLDevice1::CompileGraph``), validated.

Mirrors (snake_case fields, the pages' order): :class:`GraphDesc` (``DML_GRAPH_DESC``;
the counts are implied by the sequences except ``input_count``/``output_count``),
:class:`OperatorGraphNodeDesc` (``DML_OPERATOR_GRAPH_NODE_DESC``, the only
``DML_GRAPH_NODE_TYPE``), :class:`InputGraphEdgeDesc`, :class:`OutputGraphEdgeDesc`,
:class:`IntermediateGraphEdgeDesc` (``DML_*_GRAPH_EDGE_DESC``; the edge type is the list
an edge is in, as ``DML_GRAPH_EDGE_DESC.Type`` must match it).

Rules (``DML_GRAPH_DESC.md`` remarks, the edge pages, ``DML_TENSOR_FLAGS.md``), all checked
by :meth:`GraphDesc.validate` before any Vulkan work, each failure naming the edge or node
(``GraphDesc.intermediate_edges[3]: ...``):

* every node is a valid operator descriptor; every index is in range (graph input/output
  indices below ``input_count``/``output_count``, node indices below the node count,
  input/output indices below the operator's tensor count);
* "The graph ... must be a directed acyclic graph";
* "You must define a connection for the input and output of each supplied node, except
  for inputs and outputs that are optional": every node input whose tensor descriptor is
  set is connected exactly once (by an input or an intermediate edge); an optional input
  left null (a convolution's ``bias_tensor=None``) is not connected; every node output is
  connected at least once (outputs may fan out); every graph output exactly once;
* "It is legal to connect operators whose connected inputs and outputs use different
  dimension counts, sizes, and data types ... The TotalTensorSizeInBytes field of
  connected tensor inputs and outputs must be identical, though": checked on every
  intermediate edge (a graph input bound to several nodes must cover the largest);
* ``DML_TENSOR_FLAG_OWNED_BY_DML`` "can only be used on input tensors"; "any operator
  inputs using this flag must be connected to graph inputs. All operator inputs connected
  to the same graph input must use or omit this flag equivalently."
"""
from __future__ import annotations

import operator as _operator
from dataclasses import dataclass

from ..errors import ArgumentTypeError, ValidationError
from .operator import OperatorDesc
from .tensor_desc import UINT32_MAX, TensorFlags

__all__ = ["GraphDesc", "OperatorGraphNodeDesc", "InputGraphEdgeDesc", "OutputGraphEdgeDesc",
           "IntermediateGraphEdgeDesc", "GraphTopology", "MAX_GRAPH_INPUTS"]


@dataclass(frozen=True)
class OperatorGraphNodeDesc:
    """``DML_OPERATOR_GRAPH_NODE_DESC``: ``operator`` is an operator descriptor (or a
    ``vkml.Operator`` from ``Device.create_operator``); ``name`` is for messages."""

    operator: object
    name: str | None = None

    @property
    def desc(self) -> OperatorDesc:
        return getattr(self.operator, "desc", self.operator)


@dataclass(frozen=True)
class InputGraphEdgeDesc:
    """``DML_INPUT_GRAPH_EDGE_DESC``: graph input -> a node's input."""

    graph_input_index: int
    to_node_index: int
    to_node_input_index: int
    name: str | None = None


@dataclass(frozen=True)
class OutputGraphEdgeDesc:
    """``DML_OUTPUT_GRAPH_EDGE_DESC``: a node's output -> graph output."""

    from_node_index: int
    from_node_output_index: int
    graph_output_index: int
    name: str | None = None


@dataclass(frozen=True)
class IntermediateGraphEdgeDesc:
    """``DML_INTERMEDIATE_GRAPH_EDGE_DESC``: a node's output -> another node's input."""

    from_node_index: int
    from_node_output_index: int
    to_node_index: int
    to_node_input_index: int
    name: str | None = None


@dataclass
class GraphTopology:
    """What validation learns, for the compiler: per node, where each input comes from
    (``("input", g)``, ``("node", j, k)`` or None for an absent optional input); per node
    output, its consumers ``(node, input)`` and graph outputs; a topological order."""

    sources: list
    consumers: list          # [node][output] -> list of (node, input)
    graph_outputs: list      # [node][output] -> list of graph output indices
    output_source: list      # [graph output] -> (node, output)
    order: list
    owned_inputs: set        # graph inputs whose consumers are OWNED_BY_DML


def _uint(value, field: str, limit: int | None = None, what: str = "") -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        v = _operator.index(value)
    except TypeError:
        raise ValidationError(field, f"must be a UINT, got {value!r}") from None
    if not 0 <= v <= UINT32_MAX:
        raise ValidationError(field, f"must be a UINT (0 to 2^32 - 1), got {v}")
    if limit is not None and v >= limit:
        raise ValidationError(field, f"is {v}, out of range: {what} ({limit})")
    return v


#: The most graph inputs a :class:`GraphDesc` may declare.  A DirectML binding table is a
#: range of a descriptor heap, which holds at most 1,000,000 descriptors (D3D12 resource
#: binding tiers 1 and 2): no graph with more inputs could be bound.  (Graph outputs are
#: bounded by the output edges: each is connected exactly once.)
MAX_GRAPH_INPUTS = 1_000_000

_SEQUENCES = {"nodes": "OperatorGraphNodeDesc", "input_edges": "InputGraphEdgeDesc",
              "output_edges": "OutputGraphEdgeDesc",
              "intermediate_edges": "IntermediateGraphEdgeDesc"}


@dataclass(frozen=True)
class GraphDesc:
    """``DML_GRAPH_DESC``; see the module doc for the rules :meth:`validate` applies."""

    input_count: int
    output_count: int
    nodes: tuple = ()
    input_edges: tuple = ()
    output_edges: tuple = ()
    intermediate_edges: tuple = ()

    def __post_init__(self):
        """Lists become tuples (the descriptor hashes); anything but a tuple or list is
        refused here, so no caller iterates a None (ArgumentTypeError naming the field)."""
        for name, item in _SEQUENCES.items():
            v = getattr(self, name)
            if isinstance(v, list):
                object.__setattr__(self, name, tuple(v))
            elif not isinstance(v, tuple):
                raise ArgumentTypeError(f"GraphDesc.{name}", f"must be a tuple or list of "
                                        f"{item}, got {type(v).__name__}")

    def validate(self) -> GraphTopology:
        """Apply every rule (module doc); return the graph's topology.  The fields' types
        and the counts are checked first, before anything is sized by them."""
        n_in, n_out = self._counts()
        c = _Connections(self._node_descs())
        input_flags = c.input_edges(self.input_edges, n_in)
        c.intermediate_edges(self.intermediate_edges)
        output_source = c.output_edges(self.output_edges, n_out)
        c.all_connected()
        order = _topological_order(len(c.descs), self.intermediate_edges)
        return GraphTopology(
            sources=c.sources,
            consumers=[[[(t, s) for t, s, _ in x] for x in node] for node in c.consumers],
            graph_outputs=c.graph_outputs, output_source=output_source, order=order,
            owned_inputs={g for g, (owned, _) in input_flags.items() if owned})

    def _counts(self) -> tuple[int, int]:
        """``input_count``, ``output_count``, counts a graph can have: at least one node,
        at most :data:`MAX_GRAPH_INPUTS` inputs, and no more outputs than output edges
        (each graph output is connected exactly once)."""
        if not self.nodes:
            raise ValidationError("GraphDesc.nodes", "NodeCount must be at least 1")
        n_in = _uint(self.input_count, "GraphDesc.input_count")
        if n_in > MAX_GRAPH_INPUTS:
            raise ValidationError("GraphDesc.input_count", f"is {n_in}: at most "
                                  f"{MAX_GRAPH_INPUTS} graph inputs can be bound")
        n_out = _uint(self.output_count, "GraphDesc.output_count")
        if n_out > len(self.output_edges):
            named = {getattr(e, "graph_output_index", None) for e in self.output_edges}
            g = next(i for i in range(len(self.output_edges) + 1) if i not in named)
            raise ValidationError("GraphDesc.output_edges", f"graph output {g} is not "
                                  "connected: each graph output is connected exactly once "
                                  f"(output_count {n_out}, {len(self.output_edges)} "
                                  "output_edges)")
        return n_in, n_out

    def _node_descs(self) -> list[OperatorDesc]:
        """Each node's operator descriptor, validated (OWNED_BY_DML on inputs only)."""
        descs = []
        for i, node in enumerate(self.nodes):
            f = f"GraphDesc.nodes[{i}]"
            if not isinstance(node, OperatorGraphNodeDesc):
                raise ValidationError(f, "must be an OperatorGraphNodeDesc "
                                      f"(DML_GRAPH_NODE_TYPE_OPERATOR), got {type(node).__name__}")
            d = node.desc
            if not isinstance(d, OperatorDesc):
                raise ValidationError(f + ".operator", "must be a vkml.dml operator descriptor "
                                      f"or a vkml.Operator, got {type(d).__name__}")
            try:
                d.validate()
            except ValidationError as exc:
                raise ValidationError(f + ".operator", f"{exc.field}: {exc.rule}") from None
            for k, t in enumerate(d.outputs()):
                if t is not None and t.flags & TensorFlags.OWNED_BY_DML:
                    raise ValidationError(f + ".operator", f"output {k}: DML_TENSOR_FLAG_OWNED_BY_DML "
                                          "can only be used on input tensors")
            descs.append(d)
        return descs


class _Connections:
    """What :meth:`GraphDesc.validate` learns edge by edge: where each node input comes
    from (and by which edge), each node output's consumers and graph outputs."""

    def __init__(self, descs: list[OperatorDesc]):
        self.descs = descs
        self.ins = [d.inputs() for d in descs]
        self.outs = [d.outputs() for d in descs]
        self.sources: list = [[None] * len(x) for x in self.ins]
        self.where: list = [[None] * len(x) for x in self.ins]   # the edge that connected it
        self.consumers = [[[] for _ in o] for o in self.outs]
        self.graph_outputs = [[[] for _ in o] for o in self.outs]

    def _node(self, v, field: str) -> int:
        return _uint(v, field, len(self.descs), "NodeCount")

    def _connect(self, field: str, to, slot, source) -> tuple[int, int]:
        """Connect a node input once (an absent optional input not at all)."""
        to = self._node(to, field + ".to_node_index")
        ins = self.ins[to]
        slot = _uint(slot, field + ".to_node_input_index", len(ins),
                     f"nodes[{to}] ({self.descs[to].OPERATOR_TYPE}) has {len(ins)} inputs")
        if ins[slot] is None:
            raise ValidationError(field, f"connects nodes[{to}] input {slot}, whose tensor "
                                  "descriptor is null (an absent optional input)")
        if self.sources[to][slot] is not None:
            raise ValidationError(field, f"nodes[{to}] input {slot} is already connected "
                                  f"by {self.where[to][slot]}: each input is connected once")
        self.sources[to][slot] = source
        self.where[to][slot] = field
        return to, slot

    def _from_output(self, field: str, frm, k) -> tuple[int, int]:
        frm = self._node(frm, field + ".from_node_index")
        outs = self.outs[frm]
        k = _uint(k, field + ".from_node_output_index", len(outs),
                  f"nodes[{frm}] ({self.descs[frm].OPERATOR_TYPE}) has {len(outs)} outputs")
        return frm, k

    def input_edges(self, edges, n_in: int) -> dict:
        """Graph inputs to node inputs; ``{graph input: (owned, first edge)}`` (all
        inputs bound to one graph input use or omit OWNED_BY_DML alike)."""
        input_flags: dict = {}
        for e, edge in enumerate(edges):
            f = f"GraphDesc.input_edges[{e}]"
            if not isinstance(edge, InputGraphEdgeDesc):
                raise ValidationError(f, f"must be an InputGraphEdgeDesc, got {type(edge).__name__}")
            g = _uint(edge.graph_input_index, f + ".graph_input_index", n_in, "InputCount")
            to, slot = self._connect(f, edge.to_node_index, edge.to_node_input_index,
                                     ("input", g))
            owned = bool(self.ins[to][slot].flags & TensorFlags.OWNED_BY_DML)
            if g in input_flags and input_flags[g][0] != owned:
                raise ValidationError(f, f"graph input {g} is connected to inputs that use and "
                                      f"omit DML_TENSOR_FLAG_OWNED_BY_DML ({input_flags[g][1]} "
                                      "differs): all must use or omit it equivalently")
            input_flags.setdefault(g, (owned, f))
        return input_flags

    def intermediate_edges(self, edges) -> None:
        """Node outputs to node inputs: not OWNED_BY_DML ones, equal byte sizes."""
        for e, edge in enumerate(edges):
            f = f"GraphDesc.intermediate_edges[{e}]"
            if not isinstance(edge, IntermediateGraphEdgeDesc):
                raise ValidationError(f, "must be an IntermediateGraphEdgeDesc, got "
                                      f"{type(edge).__name__}")
            frm, k = self._from_output(f, edge.from_node_index, edge.from_node_output_index)
            to, slot = self._connect(f, edge.to_node_index, edge.to_node_input_index,
                                     ("node", frm, k))
            src, dst = self.outs[frm][k], self.ins[to][slot]
            if dst.flags & TensorFlags.OWNED_BY_DML:
                raise ValidationError(f, f"nodes[{to}] input {slot} uses "
                                      "DML_TENSOR_FLAG_OWNED_BY_DML: it must be connected to a "
                                      "graph input")
            if src.total_tensor_size_in_bytes != dst.total_tensor_size_in_bytes:
                raise ValidationError(f, "the TotalTensorSizeInBytes of connected tensors must be "
                                      f"identical: nodes[{frm}] output {k} has "
                                      f"{src.total_tensor_size_in_bytes}, nodes[{to}] input "
                                      f"{slot} {dst.total_tensor_size_in_bytes}")
            self.consumers[frm][k].append((to, slot, e))

    def output_edges(self, edges, n_out: int) -> list:
        """Node outputs to graph outputs, each graph output exactly once; returns
        ``[graph output] -> (node, output)``."""
        output_source: list = [None] * n_out
        for e, edge in enumerate(edges):
            f = f"GraphDesc.output_edges[{e}]"
            if not isinstance(edge, OutputGraphEdgeDesc):
                raise ValidationError(f, f"must be an OutputGraphEdgeDesc, got {type(edge).__name__}")
            frm, k = self._from_output(f, edge.from_node_index, edge.from_node_output_index)
            g = _uint(edge.graph_output_index, f + ".graph_output_index", n_out, "OutputCount")
            if output_source[g] is not None:
                raise ValidationError(f, f"graph output {g} is already connected: each graph "
                                      "output is connected exactly once")
            output_source[g] = (frm, k)
            self.graph_outputs[frm][k].append(g)
        for g, s in enumerate(output_source):
            if s is None:
                raise ValidationError("GraphDesc.output_edges", f"graph output {g} is not "
                                      "connected: each graph output is connected exactly once")
        return output_source

    def all_connected(self) -> None:
        """Every input with a tensor descriptor has its edge; every output is read."""
        for i, d in enumerate(self.descs):
            for slot, t in enumerate(self.ins[i]):
                if t is not None and self.sources[i][slot] is None:
                    raise ValidationError(f"GraphDesc.nodes[{i}]", f"input {slot} "
                                          f"({d.OPERATOR_TYPE}) is not connected: every "
                                          "input with a tensor descriptor needs one edge")
        for i, d in enumerate(self.descs):
            for k in range(len(self.outs[i])):
                if not self.consumers[i][k] and not self.graph_outputs[i][k]:
                    raise ValidationError(f"GraphDesc.nodes[{i}]", f"output {k} "
                                          f"({d.OPERATOR_TYPE}) is not connected to a "
                                          "graph output nor to another node")


def _topological_order(n: int, edges) -> list[int]:
    """Kahn's order; a cycle raises naming an intermediate edge on it."""
    succ = [[] for _ in range(n)]
    indeg = [0] * n
    for e, edge in enumerate(edges):
        succ[edge.from_node_index].append((edge.to_node_index, e))
        indeg[edge.to_node_index] += 1
    ready = [i for i in range(n) if indeg[i] == 0]
    order = []
    while ready:
        i = ready.pop(0)
        order.append(i)
        for j, _ in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if len(order) == n:
        return order
    # walk back along edges among the left-over nodes until a node repeats: a cycle
    left = set(range(n)) - set(order)
    pred = {}
    for e, edge in enumerate(edges):
        if edge.from_node_index in left and edge.to_node_index in left:
            pred.setdefault(edge.to_node_index, (edge.from_node_index, e))
    node, seen, path = next(iter(sorted(left))), {}, []
    while node not in seen:
        seen[node] = len(path)
        frm, e = pred[node]
        path.append((frm, node, e))
        node = frm
    cycle = path[seen[node]:]
    nodes = " <- ".join(str(t) for _, t, _ in cycle) + f" <- {cycle[-1][0]}"
    raise ValidationError(f"GraphDesc.intermediate_edges[{cycle[0][2]}]",
                          f"closes a cycle (nodes {nodes}): the graph must be a directed "
                          "acyclic graph")

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

from ..errors import ValidationError
from .operator import OperatorDesc
from .tensor_desc import TensorFlags

__all__ = ["GraphDesc", "OperatorGraphNodeDesc", "InputGraphEdgeDesc", "OutputGraphEdgeDesc",
           "IntermediateGraphEdgeDesc", "GraphTopology"]


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
    if v < 0:
        raise ValidationError(field, f"must be a UINT, got {v}")
    if limit is not None and v >= limit:
        raise ValidationError(field, f"is {v}, out of range: {what} ({limit})")
    return v


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
        for name in ("nodes", "input_edges", "output_edges", "intermediate_edges"):
            v = getattr(self, name)
            if isinstance(v, list):
                object.__setattr__(self, name, tuple(v))

    def validate(self) -> GraphTopology:
        """Apply every rule (module doc); return the graph's topology."""
        n_in = _uint(self.input_count, "GraphDesc.input_count")
        n_out = _uint(self.output_count, "GraphDesc.output_count")
        if not self.nodes:
            raise ValidationError("GraphDesc.nodes", "NodeCount must be at least 1")
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
        n = len(descs)
        ins = [d.inputs() for d in descs]
        outs = [d.outputs() for d in descs]
        sources: list = [[None] * len(x) for x in ins]
        where: list = [[None] * len(x) for x in ins]   # the edge that connected it
        consumers = [[[] for _ in o] for o in outs]
        graph_outputs = [[[] for _ in o] for o in outs]

        def node_index(v, field):
            return _uint(v, field, n, "NodeCount")

        def connect(field, to, slot, source):
            to = node_index(to, field + ".to_node_index")
            slot = _uint(slot, field + ".to_node_input_index", len(ins[to]),
                         f"nodes[{to}] ({descs[to].OPERATOR_TYPE}) has {len(ins[to])} inputs")
            if ins[to][slot] is None:
                raise ValidationError(field, f"connects nodes[{to}] input {slot}, whose tensor "
                                      "descriptor is null (an absent optional input)")
            if sources[to][slot] is not None:
                raise ValidationError(field, f"nodes[{to}] input {slot} is already connected "
                                      f"by {where[to][slot]}: each input is connected once")
            sources[to][slot] = source
            where[to][slot] = field
            return to, slot

        def from_output(field, frm, k):
            frm = node_index(frm, field + ".from_node_index")
            k = _uint(k, field + ".from_node_output_index", len(outs[frm]),
                      f"nodes[{frm}] ({descs[frm].OPERATOR_TYPE}) has {len(outs[frm])} outputs")
            return frm, k

        input_flags: dict = {}
        for e, edge in enumerate(self.input_edges):
            f = f"GraphDesc.input_edges[{e}]"
            if not isinstance(edge, InputGraphEdgeDesc):
                raise ValidationError(f, f"must be an InputGraphEdgeDesc, got {type(edge).__name__}")
            g = _uint(edge.graph_input_index, f + ".graph_input_index", n_in, "InputCount")
            to, slot = connect(f, edge.to_node_index, edge.to_node_input_index, ("input", g))
            owned = bool(ins[to][slot].flags & TensorFlags.OWNED_BY_DML)
            if g in input_flags and input_flags[g][0] != owned:
                raise ValidationError(f, f"graph input {g} is connected to inputs that use and "
                                      f"omit DML_TENSOR_FLAG_OWNED_BY_DML ({input_flags[g][1]} "
                                      "differs): all must use or omit it equivalently")
            input_flags.setdefault(g, (owned, f))
        for e, edge in enumerate(self.intermediate_edges):
            f = f"GraphDesc.intermediate_edges[{e}]"
            if not isinstance(edge, IntermediateGraphEdgeDesc):
                raise ValidationError(f, "must be an IntermediateGraphEdgeDesc, got "
                                      f"{type(edge).__name__}")
            frm, k = from_output(f, edge.from_node_index, edge.from_node_output_index)
            to, slot = connect(f, edge.to_node_index, edge.to_node_input_index, ("node", frm, k))
            src, dst = outs[frm][k], ins[to][slot]
            if dst.flags & TensorFlags.OWNED_BY_DML:
                raise ValidationError(f, f"nodes[{to}] input {slot} uses "
                                      "DML_TENSOR_FLAG_OWNED_BY_DML: it must be connected to a "
                                      "graph input")
            if src.total_tensor_size_in_bytes != dst.total_tensor_size_in_bytes:
                raise ValidationError(f, "the TotalTensorSizeInBytes of connected tensors must be "
                                      f"identical: nodes[{frm}] output {k} has "
                                      f"{src.total_tensor_size_in_bytes}, nodes[{to}] input "
                                      f"{slot} {dst.total_tensor_size_in_bytes}")
            consumers[frm][k].append((to, slot, e))
        output_source: list = [None] * n_out
        for e, edge in enumerate(self.output_edges):
            f = f"GraphDesc.output_edges[{e}]"
            if not isinstance(edge, OutputGraphEdgeDesc):
                raise ValidationError(f, f"must be an OutputGraphEdgeDesc, got {type(edge).__name__}")
            frm, k = from_output(f, edge.from_node_index, edge.from_node_output_index)
            g = _uint(edge.graph_output_index, f + ".graph_output_index", n_out, "OutputCount")
            if output_source[g] is not None:
                raise ValidationError(f, f"graph output {g} is already connected: each graph "
                                      "output is connected exactly once")
            output_source[g] = (frm, k)
            graph_outputs[frm][k].append(g)
        for g, s in enumerate(output_source):
            if s is None:
                raise ValidationError("GraphDesc.output_edges", f"graph output {g} is not "
                                      "connected: each graph output is connected exactly once")
        for i in range(n):
            for slot, t in enumerate(ins[i]):
                if t is not None and sources[i][slot] is None:
                    raise ValidationError(f"GraphDesc.nodes[{i}]", f"input {slot} "
                                          f"({descs[i].OPERATOR_TYPE}) is not connected: every "
                                          "input with a tensor descriptor needs one edge")
        for i in range(n):
            for k in range(len(outs[i])):
                if not consumers[i][k] and not graph_outputs[i][k]:
                    raise ValidationError(f"GraphDesc.nodes[{i}]", f"output {k} "
                                          f"({descs[i].OPERATOR_TYPE}) is not connected to a "
                                          "graph output nor to another node")
        order = _topological_order(n, self.intermediate_edges)
        return GraphTopology(
            sources=sources,
            consumers=[[[(t, s) for t, s, _ in c] for c in node] for node in consumers],
            graph_outputs=graph_outputs, output_source=output_source, order=order,
            owned_inputs={g for g, (owned, _) in input_flags.items() if owned})


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

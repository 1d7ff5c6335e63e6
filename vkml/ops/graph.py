"""Compiled graphs: ``IDMLDevice1::CompileGraph`` on Vulkan (``Device.compile_graph``).

Compilation, after :meth:`vkml.dml.GraphDesc.validate` (every rule, before any Vulkan
work):

1. Fusion (``fuse=True``; ``fuse=False`` none; or a dict switching kinds off for
   measurement, ``fuse={"residual": False}``: kinds of :data:`FUSION_KINDS` not named stay
   on), each rewrite kept only where the rewritten descriptor validates, so the result is
   exactly that of the unfused graph (float16: up to the one rounding the fused node
   leaves out):

   * an activation node (``DML_ACTIVATION_*`` / ``ELEMENT_WISE_CLIP``) whose input is a
     Convolution output that nothing else reads (no other node, no graph output), read
     with the layout the convolution wrote it in, becomes that convolution's
     ``fused_activation``; the convolution writes the activation's output tensor.
     Beyond DirectML's fusions, SWISH and HARD_SWISH (operators only: the fused-activation
     page does not list them, and a user's ``fused_activation=swish`` stays a
     ValidationError) fuse the same way, since the kernels evaluate them like any fused
     activation: the node becomes an ``EpilogueConvolutionDesc``
     (``convolution/epilogue.py``), the convolution's descriptor validated by its page's
     rules plus a private ``epilogue`` field for the activation, which every path
     applies where it applies a fused activation; it is no registered operator, so the
     graph compiles it with ``CompiledConvolution`` itself.  Reported as the other
     activations (kind "activation", operator "swish" / "hard_swish");
   * a Padding node in CONSTANT mode with value +0, padding only the spatial dimensions
     (not N and C), whose output feeds only the input of one forward Convolution or LP
     pooling (read with the layout it was written in), folds into that operator's
     start/end padding: both pad with zeros, so the sums are the same;
   * then (kind "squeeze excitation"): a global average pool (an AVERAGE_POOLING whose
     window is the plane, or a REDUCE with the AVERAGE function over every spatial
     axis) whose output only a 1x1 convolution of 1x1
     planes reads, whose output in turn only another such convolution reads (each read
     as written, no graph output: a squeeze-excitation block's two fully connected
     layers, with their fused activations), run as one node in the exciting layer's
     place where ``squeeze_excitation.head_desc`` takes them (float32, packed planes,
     within shared memory, texel views and subgroups, neither layer's path forced) and
     where it runs faster: which is measured (the tunable path ``squeeze_excitation``:
     the three apart against the one node, timed on the block's shape; ``VKML_TUNE=off``
     fuses): one dispatch instead of three (the pools spread over a few workgroups an
     image, the last of them to finish computing the layers).  This fusion alone adds
     in another order than the nodes apart (float32 rounding, not the unfused graph's
     bits; its module doc);
   * then (kind "input scale"): an ELEMENT_WISE_MULTIPLY whose output only the input of
     one forward Convolution reads (read as written), one of whose operands has the
     output's layout and the other its sizes with stride 0 along every spatial
     dimension (a per-(image, channel) scale: a squeeze-excitation block's ``x * s``),
     runs inside that convolution: an :class:`EpilogueConvolutionDesc` with
     ``input_scale`` (``convolution/epilogue.py``; the scale a fourth input of the node,
     the other operand its input).  The in-place GEMMs (1x1 convolutions on gemm and
     gemm_sg, float32) multiply each input element by its scale as they load it, with
     the product rounded as the multiply stores it (the unfused graph's bits); every
     other path runs the multiply apart inside the operator, into a buffer of its own.
     Either way ``x * s`` is no intermediate of the graph;
   * then, once those have run: an LP pooling node whose input is a forward Convolution
     output that nothing else reads, read as written, with a 2x2 window, stride 2, no
     padding and dilation 1 (``convolution.winograd.pool_rule``: exactly the pooling an
     F(4x4, 3x3) output tile holds whole), runs inside that convolution's output pass
     where that runs faster: which is measured (the tunable path
     ``convolution_pooled``: the pair apart -- the convolution on the path its own tuner
     picks, then the pooling -- against the Winograd candidates with the pooling in their
     output pass, timed on the pair's shapes and stored per shape class like any choice).
     With ``VKML_TUNE=off``, or a ``paths`` entry forcing the convolution's path, the
     pooling is offered to the path the convolution takes anyway
     (``CompiledConvolution(pool=)``), and the pair becomes one node only where that
     path is winograd.  The fused node computes the
     same values in the same order as the pair (the convolution's outputs rounded to
     the tensor type, then glsl/lp_pooling.comp's sums) and stores only the pooled
     output: no pooling pass, no full-size intermediate;
   * with them (kind "global pool"): a global average pool (an AVERAGE_POOLING whose
     window is the plane, or a REDUCE with the AVERAGE function over every spatial axis)
     whose input is a float32 forward Convolution output that nothing else reads, read
     as written, is offered to the convolution's path as it is chosen for the
     convolution alone (``CompiledConvolution(pool=)``); gemm_sg stores the pool's means
     instead of the output where a subgroup holds every pixel block of an image (a
     CNN's last 1x1 layer over 7x7 before its classifier: ``convolution/epilogue.py``,
     "Global average pool"), and the pair becomes one node; elsewhere it stays apart.
     Its sums run in another order than the pool's kernel (float32 rounding);
   * then (kind "residual"): an ELEMENT_WISE_ADD / ADD1 one of whose inputs is a
     Convolution output that nothing else reads, read as written, from a convolution
     that applies no activation of its own (``relu(conv) + skip`` is not
     ``relu(conv + skip)``), and whose other input (the residual) has the add output's
     sizes and element strides (no broadcast: the kernels read it at the output
     element's offset), runs inside that convolution's output pass:
     ``act(conv + bias + residual)``, an :class:`EpilogueConvolutionDesc` with
     ``residual`` (``convolution/epilogue.py``; a fourth input of the node).  ``act`` is
     ADD1's fused activation, or an activation node that alone reads the add, read as
     written (reported apart, kind "activation"; fused only with "activation" on).  The
     fused node runs where the add ran (its residual may be written after the
     convolution).  Only the paths with residual kernels (``Path.RESIDUAL``: winograd,
     gemm, gemm_sg, direct) take it: the convolution's path is chosen as for the
     convolution alone (the tuner's shape leaves the residual out), and where that path
     has none the pair stays apart (``CompiledConvolution(residual=)``);
   * last, join in place (``join_in_place``): a JOIN input that is an intermediate
     written by a node, whose slice of the join's (intermediate, packed) output is laid
     out exactly as the producer writes it (the dimensions before the axis of one
     element: a channel join at N = 1) at a bindable offset, is written there by its
     producer, whose descriptor and so kernel path stay as they are; the join copies only
     the other inputs, and records nothing where none are left.  Graph inputs and
     outputs keep their copies.  Reported as kind "join in place".

2. Each remaining node is compiled as an operator.

3. Memory: node outputs that are graph outputs are written straight into the bound
   output tensors; every other output (an intermediate) gets a range of one arena,
   planned by lifetime in the topological order: an intermediate lives from the node
   that writes it to the last node that reads it, and two whose lifetimes do not overlap
   may share bytes (first fit, in each of a few orders, the smallest arena kept; offsets
   aligned to the device's storage and texel buffer offset alignments).
   ``arena_bytes`` <= ``intermediate_bytes``.  An output written into a join's slice has
   no bytes of its own: the join's output lives from the first write into it to the last
   read of it or of any slice (``in_place``: {(node, output): (join output, byte offset,
   bytes)}).

4. Constant inputs: graph inputs whose consumers' tensors carry
   ``DML_TENSOR_FLAG_OWNED_BY_DML`` are bound once, by :meth:`CompiledGraph.initialize`
   (``IDMLOperatorInitializer``) or ``compile_graph(..., constants={index: array})``;
   binding them at execution is an error, as the flag's page says (the rule is
   ``ops/owned.py``'s, shared with single operators).  A node that owns the input
   itself (a convolution's OWNED_BY_DML filter) is initialized with it and keeps its
   own copy or transformed form (the filter re-layout / Winograd transform run once);
   any other consumer binds a copy the graph owns.

Kernel paths: each node's operator chooses its own (the tuner, see ``vkml.tuning``);
``compile_graph(..., paths={node index: name})`` forces the path of nodes whose
operator takes one (``path=`` of ``CompiledConvolution``: a candidate of
``vkml.ops.convolution.CANDIDATES``; of ``CompiledPadding``), for tests and
measurements.  A node fused into another (module doc, step 1) runs inside it, so its
entry has no effect there; the fused node keeps its convolution's index.

Execution: :meth:`CompiledGraph.execute` records every node into one command buffer
(barriers where data flows, see ``runtime.Sequence``) and replays it while the same
tensors are bound; :meth:`CompiledGraph.record` adds the graph to a caller's sequence,
to compose several graphs and operators in one submission.

Inputs the host writes (kind "host input"; not a rewrite of the graph but of how a caller
feeds it): a graph input that only the input of one convolution reads, where that
convolution copies it into zero-padded planes first (the implicit GEMM's relayout), may
be written by the caller straight into those planes when they are host-visible memory
(:meth:`CompiledGraph.host_inputs`), and the recordings it makes with ``record(...,
laid=...)`` leave the copy out: a dispatch and a pass over the input less per run (the
ONNX backend feeds a model's image this way).
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field, fields, replace

import numpy as np

from .. import tuning
from ..dml.activations import ActivationDesc
from ..dml.convolution import ConvolutionOperatorDesc
from ..dml.data_type import DataType
from ..dml.element_wise import (ElementWiseAdd1OperatorDesc, ElementWiseAddOperatorDesc,
                                ElementWiseMultiplyOperatorDesc)
from ..dml.graph import GraphDesc
from ..dml.lp_pooling import LpPooling1OperatorDesc, LpPoolingOperatorDesc
from ..dml.padding import Padding1OperatorDesc, PaddingMode, PaddingOperatorDesc
from ..dml.tensor_desc import TensorDesc, TensorFlags
from ..errors import UnsupportedError, ValidationError
from ..runtime import UNIFORM_TEXEL
from ..tensor import Tensor
from .base import REGISTRY, CompiledOperator, compile_operator, empty_for, release_all
from .convolution import CompiledConvolution, PooledConvolutionDesc, pool_rule
from .convolution import choice
from .convolution.epilogue import (EPILOGUE_ACTIVATIONS, EpilogueConvolutionDesc,
                                   global_average, global_pool_rule, input_scale_of)
from . import join_in_place
from .squeeze_excitation import TUNED as SQUEEZE_EXCITATION
from .squeeze_excitation import CompiledSqueezeExcitation, head_desc
from .squeeze_excitation import tuning_shape as squeeze_shape
from .owned import device_copy, initializer_inputs, refuse_owned_at_execution
from ..intmath import ceil_div, round_up

__all__ = ["Fusion", "FUSION_KINDS"]

#: The kinds of fusion (module doc, step 1), each switchable by ``fuse={kind: False}``.
FUSION_KINDS = ("activation", "padding", "squeeze excitation", "input scale", "pooling",
                "global pool", "residual", "join in place", "host input")


@dataclass(frozen=True)
class Fusion:
    """One rewrite of step 1 (module doc), as ``CompiledGraph.fusions`` reports it:
    ``kind`` (one of :data:`FUSION_KINDS`), the declared graph's node indices
    ``absorbed`` (nodes that no longer run as nodes of their own) and ``into`` (the node
    they run inside: a convolution, or the LP pooling / convolution a padding folded
    into), their ``GraphDesc`` node names, and ``operator``, the absorbed node's operator.
    A join in place: ``into`` the nodes writing its inputs into its output,
    ``absorbed`` the join where no copy of it is left (else empty), ``operator`` "join".
    ``str()`` gives the sentence (``nodes[2] (relu) fused into the convolution nodes[0,
    1]``)."""

    kind: str
    absorbed: tuple
    into: tuple
    operator: str
    absorbed_names: tuple = ()
    into_names: tuple = ()

    def __str__(self) -> str:
        if self.kind == "padding":
            return f"the zero padding nodes{list(self.absorbed)} folded into nodes{list(self.into)}"
        if self.kind == "join in place":
            if self.absorbed:
                return (f"nodes{list(self.into)} write in place into the output of the join "
                        f"nodes{list(self.absorbed)}")
            return (f"nodes{list(self.into)} write in place into the output of a join "
                    "(which copies its other inputs)")
        if self.kind == "residual":
            return (f"the residual add nodes{list(self.absorbed)} ({self.operator}) fused "
                    f"into the convolution nodes{list(self.into)}")
        if self.kind == "squeeze excitation":
            return (f"the global average pool and squeezing layer nodes{list(self.absorbed)} "
                    f"fused with the exciting layer nodes{list(self.into)} into one "
                    "squeeze-excitation node")
        if self.kind == "input scale":
            return (f"the per-channel scale nodes{list(self.absorbed)} ({self.operator}) "
                    f"fused into the input reads of the convolution nodes{list(self.into)}")
        return (f"nodes{list(self.absorbed)} ({self.operator}) fused into the convolution "
                f"nodes{list(self.into)}")


@dataclass
class _Node:
    """A node of the graph being compiled: its descriptor, where each input comes from
    (``("input", g)``, ``("node", id, k)`` or None) and the original nodes it stands for."""

    desc: object
    sources: list
    origin: list = field(default_factory=list)
    compiled: CompiledOperator | None = None


class _GraphBindings:
    """What ``CompiledOperator``'s binding checks read: the graph's inputs and outputs as
    tensor descriptors (None for a constant or unused input: it is not bound)."""

    OPERATOR_TYPE = "DML graph"

    def __init__(self, ins, outs):
        self._ins, self._outs = ins, outs

    def inputs(self):
        return list(self._ins)

    def outputs(self):
        return list(self._outs)


def _same_layout(a, b) -> bool:
    return (a.data_type == b.data_type and a.sizes == b.sizes
            and a.element_strides == b.element_strides)


def _with_activation(conv, act):
    """``conv`` writing ``act``'s output with ``act`` in its output pass (module doc, step
    1): as its ``fused_activation``, or for SWISH / HARD_SWISH, which the fused-activation
    page does not list, as an :class:`EpilogueConvolutionDesc`'s ``epilogue`` (the
    descriptor validation of user convolutions stays DML's); None where ``conv`` applies
    an activation already."""
    if conv.fused_activation is not None or getattr(conv, "epilogue", None) is not None:
        return None
    if act.SPEC.name in EPILOGUE_ACTIVATIONS:
        own = {f.name: getattr(conv, f.name) for f in fields(conv)}
        return EpilogueConvolutionDesc(**{**own, "output_tensor": act.output_tensor},
                                       epilogue=act.fused())
    return replace(conv, output_tensor=act.output_tensor, fused_activation=act.fused())


def _is_zero_padding(d) -> bool:
    if not isinstance(d, (PaddingOperatorDesc, Padding1OperatorDesc)):
        return False
    if d.mode != PaddingMode.CONSTANT:
        return False
    v = float(d.padding_value)
    return v == 0 and math.copysign(1.0, v) > 0 and not any(d.start_padding[:2]) \
        and not any(d.end_padding[:2])


def _idle(node) -> bool:
    """Whether a node records nothing: a join whose inputs were all written in place."""
    return isinstance(node.compiled, join_in_place.PartialJoin) and not node.compiled.steps


def _lifetimes(order, outputs, readers, graph_out) -> list:
    """``(key, bytes, first step, last step)`` of each node output that is not a graph
    output, in execution ``order``: it lives from the node that writes it to the last
    node that reads it (module doc, step 3)."""
    step = {i: s for s, i in enumerate(order)}
    items = []
    for i in order:
        for k, t in enumerate(outputs(i)):
            if (i, k) not in graph_out:
                last = max((step[j] for j in readers(i, k)), default=step[i])
                items.append(((i, k), ceil_div(t.total_tensor_size_in_bytes, 4) * 4, step[i], last))
    return items


#: Orders :func:`_first_fit` places intermediates in: largest first, longest-lived first,
#: largest bytes x lifetime first.  No one order packs every graph best: a join written
#: in place (module doc, step 1) makes a large buffer that lives long, which largest
#: first places early and the short-lived ones then fragment around.
_FIT_ORDERS = (lambda x: (-x[1], x[2]), lambda x: (x[2] - x[3], -x[1]),
               lambda x: (-x[1] * (x[3] - x[2] + 1), x[2]))


def _first_fit(items, align: int) -> tuple[dict, int]:
    """Place ``items`` (from :func:`_lifetimes`) in one arena, each at the lowest
    ``align``-ed offset free for its whole lifetime, in each of :data:`_FIT_ORDERS`,
    keeping the smallest arena (the first order on a tie): ``({key: (offset, bytes)},
    arena bytes)``."""
    return min((_fit(sorted(items, key=order), align) for order in _FIT_ORDERS),
               key=lambda plan: plan[1])


def _fit(items, align: int) -> tuple[dict, int]:
    placed, offsets = [], {}      # placed: (offset, size, first, last)
    for key, size, first, last in items:
        busy = sorted((o, o + s) for o, s, f, la in placed if f <= last and first <= la)
        off = 0
        for lo, hi in busy:
            if off + size <= lo:
                break
            off = max(off, ceil_div(hi, align) * align)
        placed.append((off, size, first, last))
        offsets[key] = (off, size)
    return offsets, max((o + s for o, s, _, _ in placed), default=0)


class CompiledGraph(CompiledOperator):
    """``IDMLCompiledOperator`` of a graph: ``initialize``, ``execute``, ``record``.

    ``nodes``: the compiled nodes' descriptors in execution order (a join written wholly
    in place is none); ``fusions``: what fusion did, as :class:`Fusion` data (``str()``
    of one is a sentence);
    ``arena_bytes``: the arena's size; ``intermediate_bytes``: the sum of the
    intermediates' sizes each rounded up to the binding alignment (what they would
    take without sharing); ``intermediate_tensor_bytes``: the sum of their
    TotalTensorSizeInBytes.  The graph as declared, before fusion:
    ``declared_intermediate_bytes``, the sum of its intermediates (every node output that
    is not a graph output, aligned likewise: one buffer each, as an unplanned executor
    would hold them), and ``unfused_arena_bytes``, the arena lifetime sharing alone
    would plan for it (``fuse=False`` compiles to that arena).
    """

    def __init__(self, device, graph: GraphDesc, fuse=True, constants=None,
                 paths=None):
        self.graph = graph
        self.fuse = fuse
        self.fusion_kinds = _fusion_kinds(fuse)
        self.topology = graph.validate()          # every rule, before any Vulkan work
        self.paths = _check_paths(graph, paths)
        self._constants_given = constants
        topo = self.topology
        descs = [n.desc for n in graph.nodes]
        # Graph inputs no edge connects are legal (DML_GRAPH_DESC: InputCount may exceed
        # the connected ones) and bound as None: only connected ones are held, so a huge
        # InputCount costs nothing; the binding list ends at the last connected input
        # (``_check_bindings`` takes trailing Nones up to InputCount).
        in_descs: dict = {}
        for i, d in enumerate(descs):
            for slot, src in enumerate(topo.sources[i]):
                if src is not None and src[0] == "input":
                    t = d.inputs()[slot]
                    g = src[1]
                    if g not in in_descs or (t.total_tensor_size_in_bytes
                                             > in_descs[g].total_tensor_size_in_bytes):
                        in_descs[g] = t
        self.constant_inputs = sorted(topo.owned_inputs)
        self._input_descs = in_descs
        bind_ins = [None if g in topo.owned_inputs else in_descs.get(g)
                    for g in range(max(in_descs, default=-1) + 1)]
        out_descs = [descs[i].outputs()[k] for i, k in topo.output_source]
        super().__init__(device, _GraphBindings(bind_ins, out_descs))

    # -- compilation ---------------------------------------------------------------------
    def build(self) -> None:
        topo = self.topology
        nodes = {i: _Node(n.desc, list(topo.sources[i]), [i])
                 for i, n in enumerate(self.graph.nodes)}
        order = list(topo.order)
        graph_out = {(i, k) for i, k in topo.output_source}
        self.fusions: list[Fusion] = []
        self._host_written: frozenset = frozenset()     # (host_inputs' graph inputs)
        self._graph_nodes = nodes
        try:
            self._aliases: dict = {}
            if self.fusion_kinds:
                self._fuse(nodes, order, graph_out)
                if "squeeze excitation" in self.fusion_kinds:
                    self._fuse_squeeze_excitation(nodes, order, graph_out)
                if "input scale" in self.fusion_kinds:
                    self._fuse_input_scale(nodes, order, graph_out)
                if {"pooling", "global pool"} & self.fusion_kinds:
                    self._fuse_pooling(nodes, order, graph_out)
                if "residual" in self.fusion_kinds:
                    self._fuse_residual(nodes, order, graph_out)
                if join_in_place.KIND in self.fusion_kinds:
                    self._join_in_place(nodes, order, graph_out)
            self.order = order
            self.nodes = [nodes[i].desc for i in order if not _idle(nodes[i])]
            self._graph_out = {src: g for g, src in enumerate(topo.output_source)}
            from_host = self._host_written_nodes(nodes, order)
            for i in order:
                n = nodes[i]
                if n.compiled is None:         # (a convolution compiled by _fuse_pooling)
                    op = self.device.create_operator(n.desc)
                    n.compiled = (CompiledConvolution(self.device, n.desc, self.paths.get(i),
                                                      input_from_host=i in from_host)
                                  if isinstance(n.desc, EpilogueConvolutionDesc)  # (unregistered)
                                  or i in from_host
                                  else compile_operator(op, self.paths.get(i)))
            self._plan_arena(nodes, order)
        except BaseException:
            self._release_nodes()
            raise
        self._constants: dict = {}
        self._initialized = not self.constant_inputs
        if self._constants_given is not None:
            self.initialize(self._constants_given)

    def _consumers(self, nodes, i, k):
        return [(j, s) for j, n in nodes.items() for s, src in enumerate(n.sources)
                if src == ("node", i, k)]

    def _only_reader(self, nodes, i, graph_out, k: int = 0):
        """The node that alone reads node ``i``'s output ``k``, as its first input and with
        the layout ``i`` writes (no graph output), else None."""
        readers = self._consumers(nodes, i, k)
        if (i, k) in graph_out or len(readers) != 1 or readers[0][1] != 0:
            return None
        j = readers[0][0]
        produced = nodes[i].desc.outputs()[k]
        return j if _same_layout(produced, nodes[j].desc.inputs()[0]) else None

    def _try(self, desc):
        try:
            self.device.create_operator(desc)
        except (ValidationError, UnsupportedError):
            return False
        return True

    def _fusion(self, kind: str, absorbed: _Node, into: _Node, operator: str) -> Fusion:
        names = [node.name for node in self.graph.nodes]
        return Fusion(kind, tuple(absorbed.origin), tuple(into.origin), operator,
                      tuple(names[i] for i in absorbed.origin),
                      tuple(names[i] for i in into.origin))

    def _fuse(self, nodes, order, graph_out) -> None:
        changed = True
        while changed:
            changed = False
            for i in list(order):
                n = nodes[i]
                src = n.sources[0] if n.sources else None
                if (src is None or src[0] != "node"
                        or self._only_reader(nodes, src[1], graph_out, src[2]) != i):
                    continue
                p = nodes[src[1]]
                new = None
                if (isinstance(n.desc, ActivationDesc) and not n.desc.is_fused_form
                        and isinstance(p.desc, ConvolutionOperatorDesc)
                        and "activation" in self.fusion_kinds):
                    new = _with_activation(p.desc, n.desc)
                    what = self._fusion("activation", n, p, n.desc.SPEC.name)
                elif (_is_zero_padding(p.desc) and "padding" in self.fusion_kinds
                      and isinstance(n.desc, (LpPooling1OperatorDesc, LpPoolingOperatorDesc,
                                              ConvolutionOperatorDesc))
                      and not (isinstance(n.desc, ConvolutionOperatorDesc)
                               and n.desc.is_backward)):
                    start = [a + b for a, b in zip(n.desc.start_padding, p.desc.start_padding[2:])]
                    end = [a + b for a, b in zip(n.desc.end_padding, p.desc.end_padding[2:])]
                    new = replace(n.desc, input_tensor=p.desc.input_tensor,
                                  start_padding=tuple(start), end_padding=tuple(end))
                    what = self._fusion("padding", p, n, p.desc.OPERATOR_TYPE)
                if new is None or not self._try(new):
                    continue
                # the pair becomes one node, in the producer's place (activation) or the
                # consumer's (padding): either way after all the pair's other inputs
                if isinstance(n.desc, ActivationDesc):
                    keep, drop = src[1], i
                    nodes[keep] = _Node(new, p.sources, p.origin + n.origin)
                    for m in nodes.values():          # readers of the activation's output
                        m.sources = [("node", keep, 0) if s == ("node", i, 0) else s
                                     for s in m.sources]
                    for gk in [x for x in graph_out if x[0] == i]:
                        graph_out.discard(gk)
                        graph_out.add((keep, 0))
                        self.topology.output_source = [(keep, 0) if s == gk else s
                                                       for s in self.topology.output_source]
                else:
                    keep, drop = i, src[1]
                    nodes[keep] = _Node(new, [p.sources[0]] + n.sources[1:],
                                        p.origin + n.origin)
                del nodes[drop]
                order.remove(drop)
                self.fusions.append(what)
                changed = True
                break

    def _fuse_squeeze_excitation(self, nodes, order, graph_out) -> None:
        """A global average pool and the two 1x1 layers after it as one node, in the
        exciting layer's place (module doc, step 1; ``squeeze_excitation.head_desc``)."""
        for i in list(order):
            if not global_average(getattr(nodes.get(i), "desc", None)):
                continue
            s = self._only_reader(nodes, i, graph_out)
            e = None if s is None else self._only_reader(nodes, s, graph_out)
            if e is None or s in self.paths or e in self.paths:
                continue
            pool, sq, ex = nodes[i], nodes[s], nodes[e]
            new = head_desc(self.device, pool.desc, sq.desc, ex.desc)
            if new is None or tuning.default_tuner().choose(
                    self.device, SQUEEZE_EXCITATION, squeeze_shape(new)).name == "apart":
                continue
            op = CompiledSqueezeExcitation(self.device, new)
            nodes[e] = _Node(new, [pool.sources[0]] + sq.sources[1:3] + ex.sources[1:3],
                             pool.origin + sq.origin + ex.origin, op)
            for k in (i, s):
                del nodes[k]
                order.remove(k)
            self.fusions.append(self._fusion(
                "squeeze excitation", _Node(None, [], pool.origin + sq.origin), ex,
                f"{pool.desc.OPERATOR_TYPE}, {sq.desc.OPERATOR_TYPE}"))

    def _fuse_input_scale(self, nodes, order, graph_out) -> None:
        """A multiply by a per-(image, channel) scale into the convolution that alone
        reads its output (module doc, step 1): one node in the convolution's place,
        reading the multiply's other operand as its input."""
        for i in list(order):
            n = nodes.get(i)
            if n is None or not isinstance(n.desc, ElementWiseMultiplyOperatorDesc):
                continue
            c = self._only_reader(nodes, i, graph_out)
            if c is None:
                continue
            p = nodes[c]
            if (type(p.desc) not in (ConvolutionOperatorDesc, EpilogueConvolutionDesc)
                    or p.compiled is not None or p.desc.is_backward
                    or input_scale_of(p.desc) is not None
                    or getattr(p.desc, "residual", None) is not None):
                continue
            for slot in (0, 1):
                x, sc = n.desc.inputs()[slot], n.desc.inputs()[1 - slot]
                if not _same_layout(x, n.desc.output_tensor):
                    continue
                own = {f.name: getattr(p.desc, f.name) for f in fields(p.desc)}
                new = EpilogueConvolutionDesc(**{**own, "input_tensor": x, "input_scale": sc})
                if not self._try(new):
                    continue
                nodes[c] = _Node(new, [n.sources[slot]] + p.sources[1:3] + [n.sources[1 - slot]],
                                 p.origin + n.origin)
                del nodes[i]
                order.remove(i)
                self.fusions.append(self._fusion("input scale", n, p, n.desc.OPERATOR_TYPE))
                break

    def _fuse_pooling(self, nodes, order, graph_out) -> None:
        """LP pooling (kind "pooling") and global average pools (kind "global pool") into
        the convolution before them (module doc, step 1): each candidate convolution is
        compiled here with the pooling offered; it keeps that compilation whether or not
        its path took the pooling."""
        for i in list(order):
            n = nodes.get(i)
            if n is None:
                continue
            lp = isinstance(n.desc, (LpPooling1OperatorDesc, LpPoolingOperatorDesc))
            kind, rule = ("pooling", pool_rule) if lp else ("global pool", global_pool_rule)
            if kind not in self.fusion_kinds or not (lp or global_average(n.desc)):
                continue
            src = n.sources[0]
            if src is None or src[0] != "node" or (src[1], src[2]) in graph_out:
                continue
            c = src[1]
            p = nodes[c]
            if (not isinstance(p.desc, ConvolutionOperatorDesc) or p.desc.is_backward
                    or p.compiled is not None or input_scale_of(p.desc) is not None
                    or self._consumers(nodes, c, src[2]) != [(i, 0)]
                    or rule(p.desc, n.desc) is not None):
                continue
            self.device.create_operator(p.desc)       # validated (as build would)
            path, offer = self.paths.get(c), n.desc
            if lp and path is None:
                chosen = tuning.default_tuner().choose(self.device, POOLED,
                                                       pooled_shape(p.desc, n.desc))
                if chosen.source != "default":            # measured (module doc, step 1)
                    path, offer = ((None, None) if chosen.name == "apart"
                                   else (chosen.name, n.desc))
            op = CompiledConvolution(self.device, p.desc, path=path, pool=offer)
            if not isinstance(op.desc, PooledConvolutionDesc):
                p.compiled = op                # its path does not pool: the pair stays
                continue
            # one node in the convolution's place (its index: paths, fusions)
            nodes[c] = _Node(op.desc, p.sources, p.origin + n.origin, op)
            for m in nodes.values():          # readers of the pooling's output
                m.sources = [("node", c, 0) if s == ("node", i, 0) else s for s in m.sources]
            for gk in [x for x in graph_out if x[0] == i]:
                graph_out.discard(gk)
                graph_out.add((c, 0))
                self.topology.output_source = [(c, 0) if s == gk else s
                                               for s in self.topology.output_source]
            del nodes[i]
            order.remove(i)
            self.fusions.append(self._fusion(kind, n, p, n.desc.OPERATOR_TYPE))

    def _fuse_residual(self, nodes, order, graph_out) -> None:
        """Residual adds into the convolution that produces one of their inputs (module
        doc, step 1): each candidate convolution is compiled here with the residual
        offered; it keeps that compilation whether or not its path took it."""
        for i in list(order):
            n = nodes.get(i)
            if not isinstance(n, _Node) or not isinstance(
                    n.desc, (ElementWiseAddOperatorDesc, ElementWiseAdd1OperatorDesc)):
                continue
            for slot in (0, 1):
                c = self._residual_producer(nodes, graph_out, i, slot)
                if c is None:
                    continue
                p = nodes[c]
                act, new = self._residual_desc(nodes, graph_out, c, i, slot)
                if new is None:
                    continue
                self.device.create_operator(p.desc)       # validated (as build would)
                op = CompiledConvolution(self.device, p.desc, self.paths.get(c), residual=new)
                if op.desc is not new:
                    p.compiled = op          # its path adds no residual: the pair stays
                    break
                self._join_residual(nodes, order, graph_out, c, i, act, op, slot)
                break

    def _residual_producer(self, nodes, graph_out, i, slot):
        """The node of the convolution whose output is input ``slot`` of add ``i`` where
        that may take the add (module doc, step 1), else None."""
        src = nodes[i].sources[slot]
        if src is None or src[0] != "node" or (src[1], src[2]) in graph_out:
            return None
        p = nodes[src[1]]
        if (type(p.desc) not in (ConvolutionOperatorDesc, EpilogueConvolutionDesc)
                or p.compiled is not None or p.desc.fused_activation is not None
                or getattr(p.desc, "epilogue", None) is not None
                or getattr(p.desc, "residual", None) is not None
                or self._consumers(nodes, src[1], src[2]) != [(i, slot)]
                or not _same_layout(p.desc.outputs()[0], nodes[i].desc.inputs()[slot])):
            return None
        return src[1]

    def _residual_desc(self, nodes, graph_out, c, i, slot):
        """``(activation node index or None, descriptor)``: convolution ``c`` with add
        ``i``'s other input as its residual, writing the add's output -- or the output of
        the activation node that alone reads the add (ADD1's own activation otherwise);
        (None, None) where no such descriptor validates."""
        p, n = nodes[c], nodes[i]
        residual = n.desc.inputs()[1 - slot]
        own = {f.name: getattr(p.desc, f.name) for f in fields(ConvolutionOperatorDesc)}
        own["input_scale"] = input_scale_of(p.desc)      # (an input scale fused before)
        act = getattr(n.desc, "fused_activation", None)
        tries = []
        j = self._activation_after(nodes, graph_out, i) if act is None else None
        if j is not None:
            a = nodes[j].desc
            extra = ({"epilogue": a.fused()} if a.SPEC.name in EPILOGUE_ACTIVATIONS
                     else {"fused_activation": a.fused()})
            tries.append((j, a.output_tensor, extra))
        tries.append((None, n.desc.output_tensor, {"fused_activation": act}))
        for j, out, extra in tries:
            new = EpilogueConvolutionDesc(**{**own, "output_tensor": out, **extra},
                                          residual=residual)
            if self._try(new):
                return j, new
        return None, None

    def _activation_after(self, nodes, graph_out, i):
        """The activation node that alone reads add ``i``'s output, read as written, where
        activations fuse (``fuse``), else None."""
        n = nodes[i]
        if "activation" not in self.fusion_kinds or (i, 0) in graph_out:
            return None
        readers = self._consumers(nodes, i, 0)
        if len(readers) != 1 or readers[0][1] != 0:
            return None
        a = nodes[readers[0][0]].desc
        if (not isinstance(a, ActivationDesc) or a.is_fused_form
                or not _same_layout(n.desc.output_tensor, a.inputs()[0])):
            return None
        return readers[0][0]

    def _join_residual(self, nodes, order, graph_out, c, i, j, op, slot) -> None:
        """Convolution ``c``, add ``i`` (and activation ``j``) become one node, compiled
        (``op``), in the add's place in ``order`` (after its residual's producer); it keeps
        the convolution's index."""
        p, n = nodes[c], nodes[i]
        gone = [i] if j is None else [i, j]
        last = gone[-1]
        fused = _Node(op.desc, p.sources + [n.sources[1 - slot]], p.origin + n.origin, op)
        if j is not None:
            fused.origin += nodes[j].origin
        self.fusions.append(self._fusion("residual", n, p, n.desc.OPERATOR_TYPE))
        if j is not None:
            self.fusions.append(self._fusion("activation", nodes[j], p,
                                             nodes[j].desc.SPEC.name))
        nodes[c] = fused
        for m in nodes.values():               # readers of the last absorbed node's output
            m.sources = [("node", c, 0) if s == ("node", last, 0) else s for s in m.sources]
        for gk in [x for x in graph_out if x[0] == last]:
            graph_out.discard(gk)
            graph_out.add((c, 0))
            self.topology.output_source = [(c, 0) if s == gk else s
                                           for s in self.topology.output_source]
        order[order.index(i)] = c
        order.remove(c)       # (the first occurrence: the convolution's own place)
        for k in gone:
            del nodes[k]
            if k in order:
                order.remove(k)

    def _join_in_place(self, nodes, order, graph_out) -> None:
        """Producers of a JOIN's inputs write them into its output's slices (module doc,
        step 1; ``join_in_place``): each such join is compiled here copying the rest."""
        plans = join_in_place.plan_join_in_place(nodes, order, graph_out,
                                                 self._arena_align())
        for j, slots in plans:
            n = nodes[j]
            self.device.create_operator(n.desc)       # validated (as build would)
            n.compiled = join_in_place.PartialJoin(self.device, n.desc, slots,
                                                   self.paths.get(j))
            into = []
            for key, off in slots.values():
                self._aliases[key] = ((j, 0), off)
                into += [o for o in nodes[key[0]].origin if o not in into]
            self.fusions.append(Fusion(
                join_in_place.KIND, tuple(n.origin) if _idle(n) else (), tuple(into), "join",
                tuple(self.graph.nodes[i].name for i in n.origin) if _idle(n) else (),
                tuple(self.graph.nodes[i].name for i in into)))

    def _arena_align(self) -> int:
        ctx = self.ctx
        return max(16, ctx.binding_alignment(), ctx.binding_alignment(UNIFORM_TEXEL))

    def _plan_arena(self, nodes, order) -> None:
        """Offsets of the intermediates in one arena (module doc, step 3); also the
        declared graph's figures (``declared_intermediate_bytes``, ``unfused_arena_bytes``)."""
        ctx = self.ctx
        align = self._arena_align()
        items = _lifetimes(order, lambda i: nodes[i].desc.outputs(),
                           lambda i, k: [j for j, _ in self._consumers(nodes, i, k)],
                           self._graph_out)
        # outputs written into a join's slices: no bytes of their own (module doc, step 1)
        items, self.in_place = join_in_place.merge_aliases(items, self._aliases)
        self.offsets, self.arena_bytes = _first_fit(items, align)
        # what the intermediates take apart, each at a binding-aligned offset
        self.intermediate_bytes = sum(ceil_div(s, align) * align for _, s, _, _ in items)
        self.intermediate_tensor_bytes = sum(s for _, s, _, _ in items)
        topo = self.topology       # the graph as declared: every node, no fusion
        declared = _lifetimes(topo.order, lambda i: self.graph.nodes[i].desc.outputs(),
                              lambda i, k: [j for j, _ in topo.consumers[i][k]],
                              {(i, k) for i, outs in enumerate(topo.graph_outputs)
                               for k, gs in enumerate(outs) if gs})
        self.declared_intermediate_bytes = sum(ceil_div(s, align) * align
                                               for _, s, _, _ in declared)
        self.unfused_arena_bytes = _first_fit(declared, align)[1]
        self.arena = None
        self._views: dict = {}
        if self.arena_bytes:
            # each view spans its size rounded up to 16 bytes: a uvec4 / RGBA32UI texel read
            # (element-wise) binds whole texels, and the bytes up to the next 16 are no
            # other intermediate's (offsets are aligned to at least 16)
            self.arena = ctx.tensor_heap.allocate(round_up(self.arena_bytes, 16), align)
            self._owned.append(self.arena)
            for key, (off, size) in self.offsets.items():
                part = self.arena.sub_allocation(off, round_up(size, 16))  # freed with it
                self._views[key] = Tensor(self.device, (size,), np.uint8, part, size,
                                          owner=False)
            for key, (root, off, size) in self.in_place.items():
                part = self.arena.sub_allocation(self.offsets[root][0] + off, round_up(size, 16))
                self._views[key] = Tensor(self.device, (size,), np.uint8, part, size,
                                          owner=False)

    # -- constants -----------------------------------------------------------------------
    def initialize(self, constants) -> None:
        """Bind the graph inputs marked ``DML_TENSOR_FLAG_OWNED_BY_DML`` once
        (``IDMLOperatorInitializer``): ``{graph input index: array or Tensor}``.  Each
        node that owns such an input (a convolution's filter) is initialized with it --
        it copies or transforms it into memory of its own (``CompiledConvolution.
        initialize``); any other consumer binds a copy the graph owns.  May be called
        again to replace them."""
        self._check_live()
        constants = initializer_inputs(self.constant_inputs, constants, "constants")
        given, temps, new = {}, [], {}
        try:
            for g, value in constants.items():
                t, temp = device_copy(self.device, value, self._input_descs[g],
                                      f"constants[{g}]")
                given[g] = t
                if temp:
                    temps.append(t)
            bound = set()                 # constants some node binds at execution
            for n in self._graph_nodes.values():
                owned = getattr(n.compiled, "owned_inputs", ())
                bound |= {src[1] for slot, src in enumerate(n.sources) if src is not None
                          and src[0] == "input" and src[1] in given and slot not in owned}
                if owned:
                    n.compiled.initialize({slot: given[n.sources[slot][1]] for slot in owned})
            for g in sorted(bound):       # the graph's own copy of what nodes bind
                t = given[g]
                if t in temps:
                    temps.remove(t)
                else:
                    t = self.device.tensor(t.read_bytes())
                new[g] = t
        except BaseException:
            for t in new.values():
                t.free()
            raise
        finally:
            for t in temps:
                t.free()
        with self._lock:
            old, self._constants = self._constants, new
            self._initialized = True
            self.drop_recording()                # recorded with the old constants
        for t in old.values():
            t.free()

    # -- binding and recording -----------------------------------------------------------
    def _check_bindings(self, inputs, outputs):
        inputs = list(inputs) if inputs is not None else []
        refuse_owned_at_execution(self.constant_inputs, inputs, self._initialized)
        bound = len(self.desc.inputs())
        if bound < len(inputs) <= self.graph.input_count and \
                all(t is None for t in inputs[bound:]):
            inputs = inputs[:bound]         # unconnected graph inputs, bound as None
        return super()._check_bindings(inputs, outputs)

    def _input_readers(self, nodes, order) -> dict:
        """{graph input index: [(node, slot), ...]} of the inputs bound at execution."""
        readers: dict = {}
        for i in order:
            for slot, src in enumerate(nodes[i].sources):
                if src is not None and src[0] == "input" and src[1] not in self.constant_inputs:
                    readers.setdefault(src[1], []).append((i, slot))
        return readers

    def _host_written_nodes(self, nodes, order) -> set:
        """The convolution nodes whose input :meth:`host_inputs` may offer (kind "host
        input", tensors in host-visible memory, a graph input that only the node's input
        slot reads): compiled with ``input_from_host``, so their tuning leaves the
        input's relayout out as their runs will."""
        if "host input" not in self.fusion_kinds or not self.ctx.mappable:
            return set()
        return {found[0][0] for found in self._input_readers(nodes, order).values()
                if len(found) == 1 and found[0][1] == 0
                and isinstance(nodes[found[0][0]].desc, ConvolutionOperatorDesc)}

    def host_inputs(self) -> dict:
        """{graph input index: view} for the inputs the caller may write itself (module
        doc, "Inputs the host writes"): each one only the input slot of one convolution
        node reads, whose ``CompiledConvolution.host_input`` gives the view (shaped like
        the input; the planes around it zeroed now).  A recording made with
        ``record(..., laid=those indices)`` reads what was written there last, not the
        tensors bound for them.  Empty where kind "host input" is switched off."""
        if "host input" not in self.fusion_kinds:
            return {}
        views = {}
        for g, found in sorted(self._input_readers(self._graph_nodes, self.order).items()):
            if len(found) != 1 or found[0][1] != 0:
                continue
            compiled = self._graph_nodes[found[0][0]].compiled
            view = (compiled.host_input() if isinstance(compiled, CompiledConvolution)
                    else None)
            if view is not None:
                views[g] = view
        self._host_written = frozenset(views)
        return views

    def _check_laid(self, laid) -> frozenset:
        """``laid`` as a set, refused unless :meth:`host_inputs` offered each of them."""
        laid = frozenset(laid)
        if not laid <= self._host_written:
            raise ValidationError("laid", f"graph inputs {sorted(laid)} must be ones "
                                  "host_inputs() gave a view of")
        return laid

    def record(self, seq, inputs, outputs, laid=frozenset()) -> None:
        """Add the graph to ``seq``; ``laid``: graph input indices of :meth:`host_inputs`
        written through their views (their tensors in ``inputs`` are not read)."""
        super().record(seq, inputs, outputs, laid=self._check_laid(laid))

    def encode(self, seq, inputs, outputs, marks: bool = False,
               laid=frozenset()) -> None:
        """Record every node; ``marks``: a ``seq.mark()`` before the first node and
        after each (:meth:`profile`); ``laid``: as :meth:`record`'s."""
        consts = self._constants
        if marks:
            seq.mark()
        for i in self.order:
            n = self._graph_nodes[i]
            owned = getattr(n.compiled, "owned_inputs", ())
            ins = []
            for slot, src in enumerate(n.sources):
                if src is None or slot in owned:     # owned: bound at its initialization
                    ins.append(None)
                elif src[0] == "input":
                    ins.append(consts[src[1]] if src[1] in consts else inputs[src[1]])
                else:
                    ins.append(self._tensor_of(src[1], src[2], outputs))
            outs = [self._tensor_of(i, k, outputs) for k in range(len(n.desc.outputs()))]
            src = n.sources[0] if n.sources else None
            if src is not None and src[0] == "input" and src[1] in laid:
                n.compiled.record(seq, ins, outs, laid=True)
            else:
                n.compiled.record(seq, ins, outs)
            if marks:
                seq.mark()
        seq.keep(self)

    def profile(self, inputs, outputs, repeat: int = 5, laid=frozenset()):
        """Device time per compiled node on these tensors, from timestamp queries: a
        :class:`vkml.ops.profile.GraphProfile` (its ``entries``: node index, the declared
        nodes it runs, names, operator, chosen kernel path, median ms; see that module
        for what the marks between nodes cost); ``laid``: as :meth:`record`'s."""
        from .profile import profile_graph
        return profile_graph(self, inputs, outputs, repeat, self._check_laid(laid))

    def _tensor_of(self, i, k, outputs):
        g = self._graph_out.get((i, k))
        return outputs[g] if g is not None else self._views[(i, k)]

    # -- lifetime ------------------------------------------------------------------------
    def _release_nodes(self) -> None:
        for n in getattr(self, "_graph_nodes", {}).values():
            if n.compiled is not None:
                n.compiled.release()
        for t in getattr(self, "_views", {}).values():
            t.allocation.free()         # its buffer views; the arena is freed apart
        for t in getattr(self, "_constants", {}).values():
            t.free()

    def release(self) -> None:
        if self.released:
            return
        super().release()
        self._release_nodes()
        self._constants = {}


# -- the tunable path ``convolution_pooled`` (module doc, step 1) ------------------------
def pooled_shape(conv: ConvolutionOperatorDesc, pool) -> dict:
    """The tuner's shape of a convolution and the 2x2 stride-2 LP pooling that alone
    reads its output (:func:`pool_rule` accepts the pair): the convolution's
    :func:`~vkml.ops.convolution.tuning_shape`, P and the pooled tensor."""
    return {"convolution": choice.tuning_shape(conv), "p": int(pool.p),
            "pooled": choice.tensor_json(pool.output_tensor)}


def _pooled_descs(shape) -> tuple:
    """:func:`pooled_shape`'s inverse: (convolution, pooling) descriptors."""
    conv = choice.desc_of_shape(shape["convolution"])
    pool = LpPooling1OperatorDesc(conv.output_tensor, choice.tensor_of(shape["pooled"]),
                                  (2, 2), (2, 2), (0, 0), (0, 0), (1, 1), int(shape["p"]))
    return conv, pool


def _pooled_class(shape) -> str:
    return f"{choice.shape_class(shape['convolution'])}-lp{int(shape['p'])}"


def _run_pooled(device, seq, cand, shape):
    """Record candidate ``cand`` of the pair into ``seq`` on fresh tensors, as a graph
    runs it: "apart", the convolution (its own tuner's path) then the pooling operator;
    else that Winograd candidate with the pooling in its output pass."""
    conv, pool = _pooled_descs(shape)
    made: list = []
    try:
        if cand.name == "apart":
            op = CompiledConvolution(device, conv)
            made.append(op)
            y = choice.record_as_run(device, seq, op, made)
            lp = compile_operator(device.create_operator(pool))
            made.append(lp)
            made.append(empty_for(device, pool.output_tensor))
            lp.record(seq, [y], [made[-1]])
        else:
            op = CompiledConvolution(device, conv, path=cand.name, pool=pool)
            made.append(op)
            if not isinstance(op.desc, PooledConvolutionDesc):
                raise tuning.Declined(f"{cand.name} does not take the pooling")
            choice.record_as_run(device, seq, op, made)
    except BaseException:
        release_all(made)
        raise
    return lambda: release_all(made)


def _pooled_fast(shape, device) -> tuple:
    """The fast list: apart and winograd (whose GEMMs already run with lanes along output
    channels where the device has full subgroups with shuffles, the case winograd-sg is
    for, so winograd-sg is timed in ``full`` mode only), and winograd-blocked where the
    device ranks that family strong (``convolution.choice.strong_families``)."""
    return ("apart", "winograd") + tuple(n for n in choice.strong_families(device)
                                         if n == "winograd-blocked")


def _pooled_from_workload(w) -> dict | None:
    """A bench graph workload (bench/workloads/graph.json: Pad -> Conv -> Relu -> LpPool
    -> Conv; ``input``, ``channels``, ``kernel``, ``pad``, ``window``, ``strides``, ``p``)
    as the shape of its first convolution and pooling as the compiled graph holds them
    (the padding folded, the filter OWNED_BY_DML); None for another workload or where the
    pooling cannot fuse."""
    if not isinstance(w, dict) or w.get("op") != "graph":
        return None
    x = tuple(int(v) for v in w["input"])
    c, a = int(w.get("channels", x[1])), int(w.get("pad", 1))
    if (int(w.get("kernel", 3)), int(w.get("window", 2)), int(w.get("strides", 2))) != (3, 2, 2):
        return None
    dt = DataType[str(w.get("dtype", "float32")).upper()]
    y = (x[0], c, x[2] + 2 * a - 2, x[3] + 2 * a - 2)
    conv = ConvolutionOperatorDesc(
        TensorDesc(dt, x), TensorDesc(dt, (c, x[1], 3, 3), flags=TensorFlags.OWNED_BY_DML),
        TensorDesc(dt, (1, c, 1, 1)), TensorDesc(dt, y), start_padding=(a, a),
        end_padding=(a, a))
    return {"convolution": choice.tuning_shape(conv), "p": int(w.get("p", 2)),
            "pooled": choice.tensor_json(TensorDesc(dt, (*y[:2], y[2] // 2, y[3] // 2)))}


#: The tunable path ``convolution_pooled``: how a graph runs a convolution and the LP
#: pooling that alone reads it (module doc, step 1); "apart" is the ``VKML_TUNE=off``
#: answer (the pooling is then offered to the path the convolution takes anyway).
POOLED = tuning.register_path(
    "convolution_pooled", ["apart", "winograd", "winograd-gemm", "winograd-cl",
                           "winograd-narrow", "winograd-blocked", "winograd-sg"],
    "apart", _pooled_class, _run_pooled, fast_fn=_pooled_fast,
    from_workload=_pooled_from_workload)


def _check_paths(graph: GraphDesc, paths) -> dict:
    """``compile_graph``'s ``paths`` as {node index: name}: each key a node whose operator
    takes a ``path`` (the name itself is checked by that operator)."""
    if paths is None:
        return {}
    if not isinstance(paths, dict):
        raise ValidationError("paths", f"must be None or a dict, got {type(paths).__name__}")
    for k, name in paths.items():
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(graph.nodes):
            raise ValidationError("paths", f"keys must be node indices below "
                                  f"{len(graph.nodes)}, got {k!r}")
        impl = REGISTRY.get(type(graph.nodes[k].desc))
        if impl is None or "path" not in inspect.signature(impl).parameters:
            raise ValidationError(f"paths[{k}]", f"node {k} "
                                  f"({graph.nodes[k].desc.OPERATOR_TYPE}) has no path to force")
        if not isinstance(name, str):
            raise ValidationError(f"paths[{k}]", f"must be a path name, got {name!r}")
    return dict(paths)


def _fusion_kinds(fuse) -> frozenset:
    """The kinds of fusion ``fuse`` switches on: True all of :data:`FUSION_KINDS`, False
    none, a dict ``{kind: bool}`` all but those it switches off."""
    if isinstance(fuse, bool):
        return frozenset(FUSION_KINDS) if fuse else frozenset()
    if not isinstance(fuse, dict):
        raise ValidationError("fuse", f"must be True, False or a dict {{kind: bool}}, got "
                              f"{type(fuse).__name__}")
    for k, on in fuse.items():
        if k not in FUSION_KINDS:
            raise ValidationError("fuse", f"keys must be fusion kinds ({', '.join(FUSION_KINDS)})"
                                  f", got {k!r}")
        if not isinstance(on, bool):
            raise ValidationError(f"fuse[{k!r}]", f"must be True or False, got {on!r}")
    return frozenset(k for k in FUSION_KINDS if fuse.get(k, True))


def compile_graph(device, graph_desc, *, fuse=True, constants=None,
                  paths=None) -> CompiledGraph:
    """``IDMLDevice1::CompileGraph`` (module doc).  ``fuse=False`` compiles every node as
    given (to compare with the fused graph), ``fuse={"residual": False}`` (kinds of
    :data:`FUSION_KINDS`) all but the kinds switched off; ``constants`` initializes the
    OWNED_BY_DML inputs at once (else call ``initialize``); ``paths`` forces nodes' kernel
    paths (module doc, "Kernel paths")."""
    device.check_open()
    if not isinstance(graph_desc, GraphDesc):
        raise ValidationError("graph_desc", f"must be a vkml.dml.GraphDesc, got "
                              f"{type(graph_desc).__name__}")
    for i, node in enumerate(graph_desc.nodes):
        op = getattr(node, "operator", None)
        if getattr(op, "device", device) is not device:
            raise ValidationError(f"GraphDesc.nodes[{i}].operator", "was created on another "
                                  "device")
    _fusion_kinds(fuse)                     # (refused before any work)
    return CompiledGraph(device, graph_desc, fuse=fuse, constants=constants, paths=paths)

"""Join in place: a graph's JOIN whose inputs the nodes producing them write straight into
the joined tensor's slices (``vkml/ops/graph.py``, module doc, step 1), so the join copies
only what is left.

An input is written in place where

* it is an intermediate of the graph (not a graph input, not a graph output: a graph output
  lives in the tensor the caller binds, so its copy stays), written by a node, and not
  already written in place into another join (or another slot of this one);
* the join's output is an intermediate too, packed, and the input's slice of it is laid
  out element for element as the producer writes its own output (same data type, and the
  same sizes and strides in every dimension of more than one element, whatever the ranks
  the edge joins): along the axis this holds where the dimensions before it have one
  element (N = 1 and a channel join, as in SqueezeNet's Fire modules, U-Net's skips,
  YOLOv8's C2f / SPPF);
* the slice starts at a byte offset the device can bind a buffer at (the arena's
  alignment, storage and texel buffer offsets alike).

The producer's descriptor is then unchanged, so is the kernel path its operator chose (the
tuner's shape classes hold no binding offset): only its output binding moves, to a view of
the join's buffer.  A strided slice (a join along a later axis with more than one element
before it) would change the producer's output descriptor and may change its path, which
no measurement here can tell beforehand: those inputs keep their copy.  Other readers of
the producer's output read the same bytes as before, through the same view.

The slices are disjoint and every in-place slice starts at an aligned offset, so a kernel
reading or writing whole 16-byte texels past its tensor's end reaches at most a slice the
join copies afterwards, or the arena's own padding.
"""
from __future__ import annotations

from ..dml.join_split_slice import JoinOperatorDesc
from .join_split_slice import CompiledJoin

#: ``Fusion.kind`` of this rewrite.
KIND = "join in place"


class PartialJoin(CompiledJoin):
    """DML_JOIN copying only the inputs not in ``in_place`` (input slots whose producers
    wrote them into the output's slices already); with none left it records nothing."""

    def __init__(self, device, desc, in_place, path: str | None = None):
        self.in_place = frozenset(in_place)
        super().__init__(device, desc, path)

    def plan(self):
        return [c for c in super().plan() if c.src_i not in self.in_place]


def _elements(t) -> tuple:
    """(size, stride) of each dimension of more than one element: the layout of the
    elements, whatever the rank (an edge may join (64, 56, 56) to (1, 64, 56, 56))."""
    return tuple((n, s) for n, s in zip(t.sizes, t.element_strides) if n > 1)


def slice_offset(join: JoinOperatorDesc, slot: int, produced, align: int) -> int | None:
    """Byte offset in ``join``'s output of input ``slot``'s slice, where the producer's
    output ``produced`` can be written there as it is (module doc); else None."""
    y, a, x = join.output_tensor, join.axis, join.input_tensors[slot]
    if not (produced.data_type == x.data_type and _elements(produced) == _elements(x)
            and y.is_packed):
        return None
    ys = y.element_strides
    if any(n > 1 and s != ys[d] for d, (n, s) in enumerate(zip(x.sizes, x.element_strides))):
        return None
    at = sum(t.sizes[a] for t in join.input_tensors[:slot])
    off = at * ys[a] * y.data_type.size
    if off % align or off + produced.total_tensor_size_in_bytes > y.total_tensor_size_in_bytes:
        return None
    return off


def plan_join_in_place(nodes, order, graph_out, align: int) -> list:
    """The joins of ``nodes`` (the graph being compiled, ``graph._Node`` by index) whose
    inputs can be written in place: ``[(join index, {slot: (producer key, byte
    offset)})]`` in execution ``order``.  A join's output may itself be written in place
    into a later join: its in-place inputs then land in that join's buffer."""
    taken, plans = set(), []
    for j in order:
        n = nodes[j]
        if not isinstance(n.desc, JoinOperatorDesc) or (j, 0) in graph_out:
            continue
        slots = {}
        for s, src in enumerate(n.sources):
            if src is None or src[0] != "node":
                continue
            key = (src[1], src[2])
            if key in graph_out or key in taken:
                continue
            off = slice_offset(n.desc, s, nodes[src[1]].desc.outputs()[src[2]], align)
            if off is not None:
                taken.add(key)
                slots[s] = (key, off)
        if slots:
            plans.append((j, slots))
    return plans


def merge_aliases(items, aliases) -> tuple[list, dict]:
    """Lifetimes (``graph._lifetimes``' items) with every output written in place
    (``aliases``: {key: (join output key, byte offset)}) folded into the join output it
    lies in, followed to the outermost join: that buffer lives from the first write into
    it to the last read of any part.  ``(items left, {key: (root key, byte offset,
    bytes)})``."""
    span = {key: (first, last) for key, _, first, last in items}
    size = {key: s for key, s, _, _ in items}
    at = {}
    for key in aliases:
        root, off = key, 0
        while root in aliases:
            root, o = aliases[root]
            off += o
        at[key] = (root, off, size[key])
        f, la = span[root]
        kf, kl = span[key]
        span[root] = (min(f, kf), max(la, kl))
    return [(k, s, *span[k]) for k, s, _, _ in items if k not in aliases], at

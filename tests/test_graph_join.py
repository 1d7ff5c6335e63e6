"""Join in place (vkml/ops/graph.py, step 1; vkml/ops/join_in_place.py): the nodes
producing a JOIN's inputs write them into the joined tensor's slices.  Producers of each
kind (convolution, activation, element-wise, resample, pooling, a split, a nested join) on
the channel axis and others, float32 and float16, against NumPy and the unfused graph
(``fuse=False``, every join a copy); which inputs stay copies (graph inputs and outputs,
strided slices, unaligned offsets, an input joined twice); a producer with a second
reader; the arena's bytes; and through vkml.onnx, a SqueezeNet Fire module against ONNX
Runtime."""
from __future__ import annotations

import numpy as np
import pytest

from vkml import dml
from vkml.intmath import round_up

from references import convolution_reference

F = dml.TensorDesc
N = dml.OperatorGraphNodeDesc
IN, OUT, MID = dml.InputGraphEdgeDesc, dml.OutputGraphEdgeDesc, dml.IntermediateGraphEdgeDesc
KIND = "join in place"


def align_of(device) -> int:
    lim = device.limits
    return max(16, lim["minStorageBufferOffsetAlignment"], lim["minTexelBufferOffsetAlignment"])


class Builder:
    """A graph under construction: graph inputs with their arrays, nodes, edges."""

    def __init__(self, dtype, rng):
        self.dtype, self.rng = dtype, rng
        self.nodes, self.ins, self.mids, self.outs, self.arrays = [], [], [], [], []

    def t(self, shape):
        return F(self.dtype, tuple(shape))

    def graph_input(self, node, slot, shape, scale=1.0):
        """A fresh graph input's array; its edge to ``node``'s ``slot`` unless None."""
        g = len(self.arrays)
        self.arrays.append((scale * self.rng.standard_normal(shape)).astype(self.dtype))
        if node is not None:
            self.ins.append(IN(g, node, slot))
        return self.arrays[-1]

    def node(self, desc, name=""):
        self.nodes.append(N(desc, name=name))
        return len(self.nodes) - 1

    def graph(self):
        return dml.GraphDesc(len(self.arrays), len(self.outs), self.nodes, self.ins,
                             self.outs, self.mids)


def producer(b: Builder, kind: str, shape):
    """A node of ``kind`` writing a tensor of ``shape`` from fresh graph inputs: (node
    index, its NumPy value in float64); kind "input": a graph input (node None)."""
    s = tuple(shape)
    i = len(b.nodes)
    if kind == "convolution":
        xs, ws = (s[0], 3, *s[2:]), (s[1], 3, 3, 3)
        b.node(dml.ConvolutionOperatorDesc(b.t(xs), b.t(ws), None, b.t(s), start_padding=(1, 1),
                                           end_padding=(1, 1)), "conv")
        x, w = b.graph_input(i, 0, xs), b.graph_input(i, 1, ws, 0.3)
        y = convolution_reference(x.astype(np.float64), w.astype(np.float64), None, [1, 1],
                                  [1, 1], [1, 1], [1, 1], [0, 0], 1, "cross_correlation",
                                  "forward")
        return i, y
    if kind == "activation":
        b.node(dml.ActivationReluOperatorDesc(b.t(s), b.t(s)), "relu")
        return i, np.maximum(b.graph_input(i, 0, s).astype(np.float64), 0)
    if kind == "element_wise":
        b.node(dml.ElementWiseAddOperatorDesc(b.t(s), b.t(s), b.t(s)), "add")
        x, z = b.graph_input(i, 0, s), b.graph_input(i, 1, s)
        return i, x.astype(np.float64) + z
    if kind == "resample":
        xs = (*s[:2], s[2] // 2, s[3] // 2)
        b.node(dml.ResampleOperatorDesc(b.t(xs), b.t(s), scales=(1, 1, 2, 2)), "resample")
        x = b.graph_input(i, 0, xs).astype(np.float64)
        return i, x.repeat(2, axis=2).repeat(2, axis=3)
    if kind == "pooling":
        xs = (*s[:2], 2 * s[2], 2 * s[3])
        b.node(dml.MaxPoolingOperatorDesc(b.t(xs), b.t(s), strides=(2, 2), window_size=(2, 2)),
               "pool")
        x = b.graph_input(i, 0, xs).astype(np.float64)
        return i, x.reshape(*s[:2], s[2], 2, s[3], 2).max(axis=(3, 5))
    assert kind == "input"
    return None, b.graph_input(None, 0, s).astype(np.float64)


def join_graph(dtype, kinds, base, axis, parts, rng, second_reader=False, output_of=None):
    """Producers of ``kinds`` writing ``base`` shaped tensors with ``parts[i]`` along
    ``axis``, joined, read by a Sigmoid (graph output 0).  ``second_reader``: a Tanh reads
    producer 0's output too (the next graph output); ``output_of``: that producer's output
    is a graph output as well.  (graph, arrays, wanted outputs, join node index)."""
    b = Builder(dtype, rng)
    srcs, vals, slices, direct = [], [], [], []
    for slot, (kind, n) in enumerate(zip(kinds, parts)):
        s = list(base)
        s[axis] = n
        i, v = producer(b, kind, s)
        if i is None:
            direct.append((len(b.arrays) - 1, slot))
        srcs.append(i)
        vals.append(v)
        slices.append(tuple(s))
    y = list(base)
    y[axis] = sum(parts)
    j = b.node(dml.JoinOperatorDesc(tuple(b.t(s) for s in slices), b.t(y), axis), "join")
    b.ins += [IN(g, j, slot) for g, slot in direct]
    b.mids += [MID(i, 0, j, slot) for slot, i in enumerate(srcs) if i is not None]
    r = b.node(dml.ActivationSigmoidOperatorDesc(b.t(y), b.t(y)), "sigmoid")
    b.mids.append(MID(j, 0, r, 0))
    b.outs.append(OUT(r, 0, 0))
    joined = np.concatenate(vals, axis=axis)
    want = [1 / (1 + np.exp(-joined))]
    if second_reader:
        t = b.node(dml.ActivationTanhOperatorDesc(b.t(slices[0]), b.t(slices[0])), "tanh")
        b.mids.append(MID(srcs[0], 0, t, 0))
        b.outs.append(OUT(t, 0, len(b.outs)))
        want.append(np.tanh(vals[0]))
    if output_of is not None:
        b.outs.append(OUT(srcs[output_of], 0, len(b.outs)))
        want.append(vals[output_of])
    return b.graph(), b.arrays, want, j, srcs, slices


def run(device, graph, arrays, want, dtype, fuse):
    cg = device.compile_graph(graph, fuse=fuse)
    outs = [device.empty(w.shape, dtype) for w in want]
    cg.execute([device.tensor(a) for a in arrays], outs)
    got = [o.numpy() for o in outs]
    return cg, got


def expected_in_place(device, base, axis, parts, srcs, slices, dtype, graph_out=()):
    """The slots the rules say are written in place (module doc of join_in_place)."""
    esize = np.dtype(dtype).itemsize
    y = list(base)
    y[axis] = sum(parts)
    row = int(np.prod(y[axis + 1:]))
    slots, at = [], 0
    for slot, (i, n) in enumerate(zip(srcs, parts)):
        strided = int(np.prod(base[:axis])) > 1
        if (i is not None and i not in graph_out and not strided
                and (at * row * esize) % align_of(device) == 0):
            slots.append(slot)
        at += n
    return slots


def check(device, dtype, kinds, base, axis, parts, seed, **kw):
    rng = np.random.default_rng(seed)
    graph, arrays, want, j, srcs, slices = join_graph(dtype, kinds, base, axis, parts, rng, **kw)
    tol = 1e-5 if dtype == "float32" else 4e-3
    cg, got = run(device, graph, arrays, want, dtype, True)
    ref, plain = run(device, graph, arrays, want, dtype, False)
    for g, p, w in zip(got, plain, want):
        np.testing.assert_allclose(g, p, rtol=tol, atol=tol)
        np.testing.assert_allclose(g, w, rtol=tol * 4, atol=tol * 4)
    assert not ref.fusions and ref.intermediate_bytes == ref.declared_intermediate_bytes
    outs = {srcs[kw["output_of"]]} if kw.get("output_of") is not None else set()
    slots = expected_in_place(device, base, axis, parts, srcs, slices, dtype, outs)
    joins = [f for f in cg.fusions if f.kind == KIND]
    if not slots:
        assert not joins
    else:
        (f,) = joins
        assert f.into == tuple(srcs[s] for s in slots) and f.operator == "join"
        whole = len(slots) == len(parts)
        assert f.absorbed == ((j,) if whole else ())
        assert (f.absorbed_names == ("join",)) == whole
        assert len(cg.nodes) == len(graph.nodes) - whole
        assert "write" in str(f) and "in place" in str(f)
        # the in-place outputs take no bytes of their own
        saved = sum(round_up(int(np.prod(slices[s])) * np.dtype(dtype).itemsize, 4)
                    for s in slots)
        assert cg.intermediate_tensor_bytes == ref.intermediate_tensor_bytes - saved
        assert cg.intermediate_bytes < cg.declared_intermediate_bytes
        # the producers' outputs all live until the join: in place, no arena bytes
        assert cg.arena_bytes < ref.arena_bytes == cg.unfused_arena_bytes
        assert set(cg.in_place) == {(srcs[s], 0) for s in slots}
    cg.release()
    ref.release()
    return slots


ALL = ["convolution", "activation", "element_wise", "resample", "pooling"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_channel_join_of_every_producer_kind(device, dtype):
    """SqueezeNet / U-Net / YOLOv8's join: N = 1, along channels, every input in place."""
    slots = check(device, dtype, ALL, (1, 0, 8, 16), 1, [4, 8, 4, 12, 4], 1)
    assert slots == [0, 1, 2, 3, 4]


def test_switched_off_by_kind(device):
    """``fuse={"join in place": False}`` keeps every join a copy and the other fusions on."""
    rng = np.random.default_rng(3)
    graph, arrays, want, *_ = join_graph("float32", ["convolution", "activation"],
                                         (1, 0, 4, 8), 1, [4, 4], rng)
    cg, (got,) = run(device, graph, arrays, want, "float32", {KIND: False})
    assert not [f for f in cg.fusions if f.kind == KIND] and not cg.in_place
    np.testing.assert_allclose(got, want[0], rtol=1e-5, atol=1e-5)
    cg.release()


@pytest.mark.parametrize("seed", range(6))
def test_random_joins(device, seed):
    """Random kinds, axes, part sizes and batch: in place where the rules say (strided
    slices and unaligned offsets keep their copies), equal to NumPy and to fuse=False."""
    rng = np.random.default_rng(100 + seed)
    count = int(rng.integers(2, 5))
    kinds = [str(k) for k in rng.choice(ALL + ["input"], count)]
    axis = int(rng.integers(0, 4))
    base = [int(rng.integers(1, 3)) if seed % 2 else 1, int(rng.integers(1, 5)),
            2 * int(rng.integers(1, 5)), 2 * int(rng.integers(1, 5))]
    if axis >= 2:
        parts = [2 * int(rng.integers(1, 4)) for _ in kinds]
    else:
        parts = [int(rng.integers(1, 6)) for _ in kinds]
    dtype = ["float32", "float16"][seed % 3 == 2]
    check(device, dtype, kinds, tuple(base), axis, parts, seed)


@pytest.mark.parametrize("axis, base, parts, want", [
    (0, (0, 4, 4, 4), [2, 1], [0, 1]),             # batch: contiguous slices
    (2, (1, 1, 0, 16), [8, 6], [0, 1]),            # rows, one channel: contiguous
    (2, (1, 2, 0, 8), [4, 6], []),                 # rows of two channels: strided, copied
    (3, (1, 1, 4, 0), [4, 8], []),                 # columns: strided, copied
    (1, (2, 0, 4, 4), [4, 4], []),                 # channels at N = 2: strided, copied
    (1, (1, 0, 3, 3), [3, 5], [0]),                # second slice at 108 bytes: unaligned
])
def test_join_axes(device, axis, base, parts, want):
    kinds = ["activation", "element_wise"]
    assert check(device, "float32", kinds, base, axis, parts, 7) == want


def test_edge_of_another_rank(device):
    """U-Net's Resample writes (64, 56, 56) where the join reads (1, 64, 56, 56): the
    same elements, written in place."""
    a, t = F("float32", (4, 4, 8)), F("float32", (1, 4, 4, 8))
    y = F("float32", (1, 8, 4, 8))
    nodes = [N(dml.ActivationReluOperatorDesc(a, a)), N(dml.ActivationTanhOperatorDesc(t, t)),
             N(dml.JoinOperatorDesc((t, t), y, 1)), N(dml.ActivationSigmoidOperatorDesc(y, y))]
    g = dml.GraphDesc(2, 1, nodes, [IN(0, 0, 0), IN(1, 1, 0)], [OUT(3, 0, 0)],
                      [MID(0, 0, 2, 0), MID(1, 0, 2, 1), MID(2, 0, 3, 0)])
    rng = np.random.default_rng(6)
    u, v = rng.standard_normal((4, 4, 8)).astype(np.float32), \
        rng.standard_normal((1, 4, 4, 8)).astype(np.float32)
    cg = device.compile_graph(g)
    assert set(cg.in_place) == {(0, 0), (1, 0)} and len(cg.nodes) == 3
    out = device.empty((1, 8, 4, 8))
    cg.execute([device.tensor(u), device.tensor(v)], [out])
    want = 1 / (1 + np.exp(-np.concatenate([np.maximum(u, 0)[None], np.tanh(v)], 1)))
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    cg.release()


def test_graph_input_and_output_keep_their_copies(device):
    slots = check(device, "float32", ["input", "convolution", "activation"], (1, 0, 4, 4), 1,
                  [4, 4, 4], 3, output_of=2)
    assert slots == [1]


def test_producer_with_a_second_reader(device):
    """The Tanh reads producer 0's output from its slice of the join's buffer."""
    slots = check(device, "float32", ["activation", "pooling", "resample"], (1, 0, 4, 8), 1,
                  [4, 8, 4], 5, second_reader=True)
    assert slots == [0, 1, 2]


def test_join_buffer_lives_from_the_first_write(device):
    """The join's buffer holds producer 0's slice from the first step on: the chain that
    makes input 1 (an intermediate between) gets other bytes of the arena."""
    t = F("float32", (1, 4, 4, 4))
    y = F("float32", (1, 8, 4, 4))
    nodes = [N(dml.ActivationReluOperatorDesc(t, t)), N(dml.ActivationSigmoidOperatorDesc(t, t)),
             N(dml.ActivationTanhOperatorDesc(t, t)), N(dml.JoinOperatorDesc((t, t), y, 1)),
             N(dml.ActivationReluOperatorDesc(y, y))]
    g = dml.GraphDesc(2, 1, nodes, [IN(0, 0, 0), IN(1, 1, 0)], [OUT(4, 0, 0)],
                      [MID(0, 0, 3, 0), MID(1, 0, 2, 0), MID(2, 0, 3, 1), MID(3, 0, 4, 0)])
    rng = np.random.default_rng(4)
    a, b = (rng.standard_normal((1, 4, 4, 4)).astype(np.float32) for _ in range(2))
    cg = device.compile_graph(g)
    assert set(cg.in_place) == {(0, 0), (2, 0)}
    (root,) = {r for r, _, _ in cg.in_place.values()}
    lo, size = cg.offsets[root]
    mid = cg.offsets[(1, 0)][0]
    assert mid >= lo + size or mid + 256 <= lo
    out = device.empty((1, 8, 4, 4))
    cg.execute([device.tensor(a), device.tensor(b)], [out])
    want = np.maximum(np.concatenate([np.maximum(a, 0), np.tanh(1 / (1 + np.exp(-b)))], 1), 0)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    cg.release()


def test_nested_joins_split_and_an_input_joined_twice(device):
    """YOLOv8's C2f / SPPF shapes: a split's outputs and a pooling chain joined, one join
    inside another (its in-place inputs land in the outer join's buffer), an output read
    by the next producer too, and one output joined at two slots (the second copied)."""
    rng = np.random.default_rng(11)
    t = lambda *s: F("float32", s)      # noqa: E731
    x = rng.standard_normal((1, 8, 8, 8)).astype(np.float32)
    pool = lambda a, b: dml.MaxPoolingOperatorDesc(a, b, strides=(1, 1),  # noqa: E731
                                                   window_size=(3, 3), start_padding=(1, 1),
                                                   end_padding=(1, 1))
    c4 = t(1, 4, 8, 8)
    nodes = [N(dml.SplitOperatorDesc(t(1, 8, 8, 8), (c4, c4), 1)),              # 0
             N(pool(c4, c4)),                                                  # 1: p(b)
             N(pool(c4, c4)),                                                  # 2: p(p(b))
             N(dml.JoinOperatorDesc((c4, c4, c4), t(1, 12, 8, 8), 1)),         # 3 inner
             N(dml.JoinOperatorDesc((c4, t(1, 12, 8, 8), c4), t(1, 20, 8, 8), 1)),  # 4 outer
             N(dml.ActivationSigmoidOperatorDesc(t(1, 20, 8, 8), t(1, 20, 8, 8)))]
    mids = [MID(0, 1, 1, 0), MID(1, 0, 2, 0), MID(0, 1, 3, 0), MID(1, 0, 3, 1),
            MID(2, 0, 3, 2), MID(0, 0, 4, 0), MID(3, 0, 4, 1), MID(2, 0, 4, 2), MID(4, 0, 5, 0)]
    g = dml.GraphDesc(1, 1, nodes, [IN(0, 0, 0)], [OUT(5, 0, 0)], mids)

    def mp(a):
        p = np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
        return np.max([p[:, :, i:i + 8, j:j + 8] for i in range(3) for j in range(3)], axis=0)
    a, b = x[:, :4], x[:, 4:]
    p1 = mp(b)
    p2 = mp(p1)
    want = 1 / (1 + np.exp(-np.concatenate([a, b, p1, p2, p2], axis=1).astype(np.float64)))
    got = {}
    for fuse in (True, False):
        cg = device.compile_graph(g, fuse=fuse)
        out = device.empty((1, 20, 8, 8))
        cg.execute([device.tensor(x)], [out])
        got[fuse] = out.numpy()
        if fuse:
            inner, outer = [f for f in cg.fusions if f.kind == KIND]
            assert inner.absorbed == (3,) and inner.into == (0, 1, 2)
            assert outer.absorbed == () and outer.into == (0, 3)   # p(p(b)) is taken
            assert cg.in_place[(3, 0)][:2] == ((4, 0), 4 * 64 * 4)
            assert cg.in_place[(1, 0)][:2] == ((4, 0), 8 * 64 * 4)
            assert len(cg.nodes) == 5
        cg.release()
    np.testing.assert_allclose(got[True], got[False], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[True], want, rtol=1e-5, atol=1e-6)


def test_fire_module_through_onnx(device):
    """SqueezeNet's Fire module (squeeze 1x1 -> Relu, expand 1x1 and 3x3 -> Relu, Concat
    on channels) through vkml.onnx: both expand convolutions write the joined tensor,
    ONNX Runtime's values."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import helper, numpy_helper
    import vkml.onnx as vonnx
    from onnx_helpers import make_model, ort_expected, value_info

    rng = np.random.default_rng(12)
    xs = [1, 16, 12, 12]       # 16 x 12 x 12 floats: the 3x3 half at a 256-byte offset

    def weights(name, shape):
        return [numpy_helper.from_array((rng.standard_normal(shape) / 4).astype(np.float32),
                                        name),
                numpy_helper.from_array((rng.standard_normal(shape[0]) / 4).astype(np.float32),
                                        name + "b")]
    inits = weights("Ws", [8, 16, 1, 1]) + weights("We1", [16, 8, 1, 1]) + \
        weights("We3", [16, 8, 3, 3])
    nodes = [helper.make_node("Conv", ["x", "Ws", "Wsb"], ["s"], name="squeeze"),
             helper.make_node("Relu", ["s"], ["sr"], name="squeeze_relu"),
             helper.make_node("Conv", ["sr", "We1", "We1b"], ["e1"], name="expand1x1"),
             helper.make_node("Relu", ["e1"], ["e1r"], name="expand1x1_relu"),
             helper.make_node("Conv", ["sr", "We3", "We3b"], ["e3"], name="expand3x3",
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["e3"], ["e3r"], name="expand3x3_relu"),
             helper.make_node("Concat", ["e1r", "e3r"], ["cat"], name="concat", axis=1),
             helper.make_node("MaxPool", ["cat"], ["y"], name="pool", kernel_shape=[3, 3],
                              strides=[2, 2])]
    model = make_model(nodes, [value_info("x", xs)], [value_info("y", [1, 32, 5, 5])], inits,
                       opset=13)
    feeds = {"x": rng.standard_normal(xs).astype(np.float32)}
    rep = vonnx.prepare(model, device=device, strict=True)
    (got,) = rep.run(feeds)
    (want,) = ort_expected(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    (part,) = [p for p in rep.partitions if p[0] == "device"]
    assert ("concat", "Concat (fused into Conv)") in part[1]


@pytest.mark.parametrize("path", ["copy", "kernel"])
def test_forced_path_of_a_partial_join(device, path):
    """``paths`` still forces the copies the join keeps (here a graph input's): "copy" the
    copy engine, "kernel" a kernel copy (32-bit rows on :mod:`vkml.ops.permute`'s)."""
    rng = np.random.default_rng(13)
    graph, arrays, want, j, _, _ = join_graph("float32", ["activation", "input", "pooling"],
                                              (1, 0, 8, 8), 1, [4, 4, 4], rng)
    cg = device.compile_graph(graph, paths={j: path})
    (f,) = cg.fusions
    assert f.kind == KIND and f.absorbed == () and f.into == (0, 1)
    kernels = {"copy": ["copy"], "kernel": ["permute"]}[path]
    assert cg._graph_nodes[j].compiled.paths == kernels
    out = device.empty(want[0].shape)
    cg.execute([device.tensor(a) for a in arrays], [out])
    np.testing.assert_allclose(out.numpy(), want[0], rtol=1e-5, atol=1e-6)
    cg.release()

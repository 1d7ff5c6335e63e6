"""The graph compiler's "squeeze excitation" fusion (vkml/ops/graph.py, step 1;
vkml/ops/squeeze_excitation.py): a global average pool and the two 1x1 layers after it
run as one node.  Against a float64 NumPy reference and the unfused graph, on both
drivers, over shapes that take each read of the kernel (the input as RGBA32F texels
whose ends cut through planes, or as floats; each filter's rows as texels or floats),
batches, 3-D and 4-D inputs, with and without biases, from an AVERAGE_POOLING or a
REDUCE; the pools split over several workgroups (the last one computing the layers,
executed again and again); refused where the rule fails; switchable; chosen by the
tuner where tuning is on (and stored); and through vkml.onnx, an EfficientNet block
against ONNX Runtime."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from vkml import dml
from vkml.ops import squeeze_excitation as se

F = dml.TensorDesc
N = dml.OperatorGraphNodeDesc
IN, OUT, MID = dml.InputGraphEdgeDesc, dml.OutputGraphEdgeDesc, dml.IntermediateGraphEdgeDesc


def se_graph(x_shape, c1, *, pool="average", bias=(True, True), dtype="float32",
             x_strides=None, acts=("relu", "sigmoid"), group_count=1, pool_reader=False,
             squeeze_output=False):
    """x (input 0) -> global average pool -> 1x1 conv (w1, b1: inputs 1, 2; acts[0]) ->
    1x1 conv (w2, b2: inputs 3, 4; acts[1]) -> y (output 0).  ``pool``: "average"
    (AVERAGE_POOLING1 over the plane), "reduce" (REDUCE AVERAGE) or "sum" (REDUCE SUM);
    ``pool_reader``: a sigmoid reads the pooled tensor too (output 1); ``squeeze_output``:
    the squeezed tensor is a graph output too (output 1)."""
    n, c, *plane = x_shape
    ones = (1,) * len(plane)
    x = F(dtype, x_shape, x_strides)
    p, h = F(dtype, (n, c) + ones), F(dtype, (n, c1) + ones)
    if pool in ("reduce", "sum"):
        pd = dml.ReduceOperatorDesc("average" if pool == "reduce" else "sum", x, p,
                                    tuple(range(2, 2 + len(plane))))
    else:
        pd = dml.AveragePooling1OperatorDesc(x, p, strides=ones, window_size=tuple(plane),
                                             start_padding=(0,) * len(plane),
                                             end_padding=(0,) * len(plane), dilations=ones)
    w1 = F(dtype, (c1, c // group_count) + ones)
    w2 = F(dtype, (c, c1 // group_count) + ones)
    b1 = F(dtype, (1, c1) + ones) if bias[0] else None
    b2 = F(dtype, (1, c) + ones) if bias[1] else None
    sq = dml.ConvolutionOperatorDesc(p, w1, b1, h, fused_activation=acts[0],
                                     group_count=group_count)
    ex = dml.ConvolutionOperatorDesc(h, w2, b2, F(dtype, (n, c) + ones),
                                     fused_activation=acts[1], group_count=group_count)
    nodes = [N(pd, name="pool"), N(sq, name="squeeze"), N(ex, name="excite")]
    ins = [IN(0, 0, 0), IN(1, 1, 1), IN(3, 2, 1)]
    ins += [IN(2, 1, 2)] if bias[0] else []
    ins += [IN(4, 2, 2)] if bias[1] else []
    mids = [MID(0, 0, 1, 0), MID(1, 0, 2, 0)]
    outs = [OUT(2, 0, 0)]
    if pool_reader:
        nodes.append(N(dml.ActivationSigmoidOperatorDesc(p, p), name="other"))
        mids.append(MID(0, 0, 3, 0))
        outs.append(OUT(3, 0, 1))
    if squeeze_output:
        outs.append(OUT(1, 0, 1))
    return dml.GraphDesc(5, len(outs), nodes, ins, outs, mids)


def se_arrays(rng, x_shape, c1, dtype=np.float32, x_strides=None, group_count=1):
    n, c, *plane = x_shape
    ones = (1,) * len(plane)
    if x_strides is None:
        x = rng.standard_normal(x_shape)
    else:   # the bytes the strided descriptor spans, its elements where they say
        x = rng.standard_normal(x_strides[0] * n)
    return [x.astype(dtype),
            (rng.standard_normal((c1, c // group_count) + ones) / math.sqrt(c)).astype(dtype),
            rng.standard_normal((1, c1) + ones).astype(dtype),
            (rng.standard_normal((c, c1 // group_count) + ones) / math.sqrt(c1)).astype(dtype),
            rng.standard_normal((1, c) + ones).astype(dtype)]


def reference(arrays, x_shape, c1, x_strides=None, bias=(True, True)):
    """float64: mean over the planes, relu(W1 m + b1), sigmoid(W2 h + b2)."""
    n, c, *plane = x_shape
    x = np.asarray(arrays[0], np.float64)
    if x_strides is not None:
        x = np.lib.stride_tricks.as_strided(x, x_shape, [s * 8 for s in x_strides])
    m = x.reshape(n, c, -1).mean(axis=2)
    h = m @ arrays[1].reshape(c1, c).T.astype(np.float64)
    h = np.maximum(h + (arrays[2].reshape(1, c1) if bias[0] else 0), 0)
    e = h @ arrays[3].reshape(c, c1).T.astype(np.float64)
    e = e + (arrays[4].reshape(1, c) if bias[1] else 0)
    return (1 / (1 + np.exp(-e))).reshape((n, c) + (1,) * len(plane))


def fused(cg) -> list:
    return [f for f in cg.fusions if f.kind == "squeeze excitation"]


def _bound(arrays, bias):
    return [a if keep else None for a, keep in zip(arrays, (True, True, bias[0], True, bias[1]))]


def _run(device, g, arrays, bias=(True, True), **kw):
    """Compile ``g`` and run it once on ``arrays`` (an absent bias's input unbound)."""
    cg = device.compile_graph(g, **kw)
    outs = [device.empty(g.nodes[o.from_node_index].desc.outputs()[0].sizes, np.float32)
            for o in g.output_edges]
    cg.execute([device.tensor(a) if a is not None else None
                for a in _bound(arrays, bias)], outs)
    return cg, [o.numpy() for o in outs]


#: (input, squeezed channels, input strides, pool, biases): the input's texels cut through
#: 7x7 planes (X4 with masked ends), both filters' rows whole texels (W4A, W4B); rows of 10
#: and 3 channels (scalar filter reads) over two images of 5x3 planes; 750 elements (not
#: whole texels: scalar input reads); a 3-D input from a REDUCE; no biases; channels
#: apart in memory (each plane packed, two floats between planes)
CASES = [
    ((1, 16, 7, 7), 4, None, "average", (True, True)),
    ((2, 10, 5, 3), 3, None, "average", (True, True)),
    ((1, 10, 5, 15), 6, None, "average", (True, True)),
    ((1, 12, 9), 6, None, "reduce", (True, True)),
    ((1, 24, 4, 4), 8, None, "average", (False, False)),
    ((2, 8, 3, 3), 4, (8 * 11, 11, 3, 1), "reduce", (True, False)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_fused_head_matches_the_reference_and_the_nodes_apart(device, case):
    """One fused node (reported with the pool and squeeze absorbed into the excite
    node) whose output is the float64 reference's and, within float32 rounding, the
    three nodes' apart."""
    x_shape, c1, strides, pool, bias = CASES[case]
    rng = np.random.default_rng(200 + case)
    arrays = se_arrays(rng, x_shape, c1, x_strides=strides)
    g = se_graph(x_shape, c1, pool=pool, bias=bias, x_strides=strides)
    cg, got = _run(device, g, arrays, bias)
    assert [(f.absorbed, f.into) for f in fused(cg)] == [((0, 1), (2,))], cg.fusions
    assert [type(d).__name__ for d in cg.nodes] == ["SqueezeExcitationDesc"]
    assert "squeeze-excitation node" in str(fused(cg)[0])
    cg.release()
    apart, want = _run(device, g, arrays, bias, fuse={"squeeze excitation": False})
    assert not fused(apart) and len(apart.nodes) == 3
    apart.release()
    ref = reference(arrays, x_shape, c1, strides, bias)
    np.testing.assert_allclose(got[0], ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-7)


#: (input, squeezed channels, pooling workgroups): channels not a multiple of the groups
#: (10 in groups of 4, 4, 2) over two images; more groups asked than channels; wide
#: layers (C = 1152, C1 = 48, the squeezing layer's inputs shuffled 32 at a time) in
#: three groups; 76 squeezed channels (more than the 64 lanes: two turns of the
#: squeezing layer) from 9 channels (neither filter's rows whole texels)
SPLITS = [((2, 10, 5, 3), 3, 3), ((1, 6, 3, 3), 4, 9), ((1, 1152, 7, 7), 48, 3),
          ((1, 9, 4, 4), 76, 2)]


@pytest.mark.parametrize("case", range(len(SPLITS)))
def test_pools_split_over_workgroups(device, case):
    """The pools spread over several workgroups per image, the last to finish computing
    the layers (``groups``): the reference's output, and the same again when executed
    twice more and when recorded twice into one sequence (each execution starts its
    count from zero)."""
    from vkml.ops.base import empty_for
    x_shape, c1, groups = SPLITS[case]
    rng = np.random.default_rng(300 + case)
    arrays = se_arrays(rng, x_shape, c1)
    g = se_graph(x_shape, c1)
    desc = se.head_desc(device, *(n.desc for n in g.nodes))
    if desc is None:
        pytest.skip("the kernel does not take the shape on this device")
    op = se.CompiledSqueezeExcitation(device, desc, groups=groups)
    assert op.groups == min(groups, x_shape[1]) or x_shape[1] % op.groups
    ins = [device.tensor(a) for a in arrays]
    out = empty_for(device, desc.outputs()[0])
    ref = reference(arrays, x_shape, c1)
    for _ in range(3):
        op.execute(ins, [out])
        np.testing.assert_allclose(out.numpy().reshape(ref.shape), ref, rtol=1e-5, atol=1e-6)
    outs = [empty_for(device, desc.outputs()[0]) for _ in range(2)]
    seq = device.sequence()
    for o in outs:
        op.record(seq, ins, [o])
    seq.run()
    for o in outs:
        np.testing.assert_allclose(o.numpy().reshape(ref.shape), ref, rtol=1e-5, atol=1e-6)
    op.release()


def test_pool_groups_and_lanes():
    """One pooling workgroup a concurrent workgroup of the device, each of at least eight
    channels; whole subgroups of lanes, as many as the squeezed channels up to 64."""
    assert [se.pool_groups(c, w) for c, w in ((1152, 2), (1152, 0), (12, 4), (4, 16))] \
        == [2, 1, 2, 1]
    assert [se.lanes(8, c1, 256) for c1 in (4, 10, 48, 76)] == [8, 16, 48, 64]
    assert se.lanes(4, 6, 256) == 8 and se.lanes(8, 48, 32) == 32


def test_kernel_reads_as_the_rule_says(device):
    """The whole-texel reads (``whole_texels``) the first three cases take."""
    modes = []
    for x_shape, c1, strides, pool, bias in CASES[:3]:
        g = se_graph(x_shape, c1, pool=pool, bias=bias, x_strides=strides)
        d = se.head_desc(device, *(n.desc for n in g.nodes))
        modes.append(se.whole_texels(d.pool.input_tensor, d.squeeze, d.excite))
    assert modes == [(True, True, True), (True, False, False), (False, False, False)]


@pytest.mark.parametrize("why", ["sum", "float16", "pool_reader", "squeeze_output",
                                 "groups", "forced_path"])
def test_not_fused_where_the_rule_fails(device, why):
    """A REDUCE that sums instead of averaging, float16, a second reader of the pooled
    tensor, the squeezed tensor a graph output, grouped layers, or a layer's path forced:
    the nodes stay apart, and the graph's results are right."""
    x_shape, c1 = (1, 8, 4, 4), 4
    kw, dtype, paths = {}, np.float32, None
    if why == "float16":
        kw, dtype = {"dtype": "float16"}, np.float16
    elif why == "groups":
        kw = {"group_count": 2}
    elif why == "sum":
        kw = {"pool": "sum"}
    elif why == "forced_path":
        paths = {1: "direct"}
    else:
        kw = {why: True}
    g = se_graph(x_shape, c1, **kw)
    rng = np.random.default_rng(7)
    arrays = se_arrays(rng, x_shape, c1, dtype, group_count=kw.get("group_count", 1))
    cg = device.compile_graph(g, paths=paths)
    assert not fused(cg), cg.fusions
    outs = [device.empty(g.nodes[o.from_node_index].desc.outputs()[0].sizes, dtype)
            for o in g.output_edges]
    cg.execute([device.tensor(a) for a in arrays], outs)
    if why not in ("sum", "groups"):
        np.testing.assert_allclose(outs[0].numpy().astype(np.float64),
                                   reference(arrays, x_shape, c1),
                                   rtol=1e-2 if why == "float16" else 1e-5, atol=1e-3)
    cg.release()


class _Choice:
    """A stand-in for the process's tuner: ``squeeze_excitation`` answers ``name``; every
    other path its default."""

    def __init__(self, name, real):
        self.name, self.real = name, real

    def model(self, device, path, **kw):
        return self.real.model(device, path, **kw)

    def choose(self, device, path, shape, **kw):
        from vkml import tuning
        if path is se.TUNED:
            return SimpleNamespace(name=self.name, source="stored", times={})
        return SimpleNamespace(name=tuning._resolve(path).default, source="default", times={})

    def effective_mode(self, mode=None):
        return "fast"


@pytest.mark.parametrize("choice", ["apart", "fused"])
def test_the_measured_choice_decides(device, monkeypatch, choice):
    """With tuning on the tunable path ``squeeze_excitation`` decides: "apart" keeps
    the three nodes, "fused" makes one; the results are the reference's either way."""
    from vkml import tuning
    real = tuning.default_tuner()
    monkeypatch.setattr(tuning, "default_tuner", lambda: _Choice(choice, real))
    x_shape, c1 = (1, 16, 7, 7), 4
    arrays = se_arrays(np.random.default_rng(9), x_shape, c1)
    cg, got = _run(device, se_graph(x_shape, c1), arrays)
    assert bool(fused(cg)) == (choice == "fused") and len(cg.nodes) == (
        1 if choice == "fused" else 3)
    cg.release()
    np.testing.assert_allclose(got[0], reference(arrays, x_shape, c1), rtol=1e-5, atol=1e-6)


def test_the_choice_is_timed_and_stored(device, tmp_path, monkeypatch):
    """The tuner times both candidates on the block's shape, keeps the faster and stores
    it; a second compilation reads it back without timing."""
    from vkml import tuning
    t = tuning.Tuner("fast", folder=tmp_path, rounds=1)
    monkeypatch.setattr(tuning, "default_tuner", lambda: t)
    x_shape, c1 = (1, 16, 7, 7), 4
    g = se_graph(x_shape, c1)
    cg = device.compile_graph(g)
    d = se.head_desc(device, *(n.desc for n in g.nodes))
    c = t.choose(device, se.TUNED, se.tuning_shape(d))
    assert c.source == "stored" and set(c.times) == {"apart", "fused"}
    assert c.name == min(c.times, key=c.times.get)
    assert bool(fused(cg)) == (c.name == "fused")
    cg.release()
    monkeypatch.setattr(tuning, "_run_once", None)          # would fail if it timed again
    device.compile_graph(g).release()


def test_onnx_efficientnet_block_against_onnx_runtime(device):
    """Through vkml.onnx: GlobalAveragePool -> Conv -> SiLU (x * Sigmoid(x)) -> Conv ->
    Sigmoid -> Mul -> 1x1 Conv, a squeeze-excitation block as EfficientNet exports it,
    strict, fused into one node, against ONNX Runtime."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    from vkml.onnx import backend
    rng = np.random.default_rng(3)
    c, c1, hw = 32, 8, 7
    init = {"w1": (c1, c, 1, 1), "b1": (c1,), "w2": (c, c1, 1, 1), "b2": (c,),
            "w3": (16, c, 1, 1)}
    inits = [numpy_helper.from_array((rng.standard_normal(s) / 4).astype(np.float32), k)
             for k, s in init.items()]
    mk = helper.make_node
    nodes = [mk("GlobalAveragePool", ["x"], ["p"]), mk("Conv", ["p", "w1", "b1"], ["h"]),
             mk("Sigmoid", ["h"], ["hs"]), mk("Mul", ["h", "hs"], ["h2"]),
             mk("Conv", ["h2", "w2", "b2"], ["e"]), mk("Sigmoid", ["e"], ["s"]),
             mk("Mul", ["x", "s"], ["xs"]), mk("Conv", ["xs", "w3"], ["y"])]
    g = helper.make_graph(nodes, "se", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, c, hw, hw])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 16, hw, hw])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    rep = backend.prepare(m, device=device, strict=True)
    got = rep.run([x])[0]
    assert [f.kind for f in rep.fusions].count("squeeze excitation") == 1, rep.fusions
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_fused_only_within_the_texel_views(device):
    """A head whose input exceeds the device's RGBA32F texel views (SwiftShader: 65536
    texels; 96 x 56 x 56 floats are 75264) stays apart there and is fused where the
    views hold it; right either way."""
    x_shape, c1 = (1, 96, 56, 56), 4
    arrays = se_arrays(np.random.default_rng(11), x_shape, c1)
    cg, got = _run(device, se_graph(x_shape, c1), arrays)
    fits = 96 * 56 * 56 // 4 <= device.context.limits["maxTexelBufferElements"]
    assert bool(fused(cg)) == fits, cg.fusions
    cg.release()
    np.testing.assert_allclose(got[0], reference(arrays, x_shape, c1), rtol=1e-5, atol=1e-6)

"""DML graphs (``Device.compile_graph``): every validation rule naming its edge or node,
random DAGs of padding / convolution / activation / LP pooling nodes against NumPy run one
operator at a time, fused == unfused, the arena shared by lifetime, replay, constants
(OWNED_BY_DML) bound once, and composition with ``Sequence``."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vkml
from vkml import dml
from vkml.errors import ValidationError

from test_activations import FORMULAS
from references import convolution_reference, lp_pooling_reference, pad_reference

F = dml.TensorDesc
N = dml.OperatorGraphNodeDesc
IN, OUT, MID = dml.InputGraphEdgeDesc, dml.OutputGraphEdgeDesc, dml.IntermediateGraphEdgeDesc
OWNED = dml.TensorFlags.OWNED_BY_DML


def f32(*s, flags=0):
    return F("float32", s, flags=flags)


def chain(n=3, shape=(1, 2, 4, 4)):
    """x -> relu -> sigmoid -> ... (n activations), one graph output."""
    t = f32(*shape)
    acts = [dml.ActivationReluOperatorDesc, dml.ActivationSigmoidOperatorDesc,
            dml.ActivationTanhOperatorDesc]
    nodes = [N(acts[i % 3](t, t)) for i in range(n)]
    return dml.GraphDesc(1, 1, nodes, [IN(0, 0, 0)], [OUT(n - 1, 0, 0)],
                         [MID(i, 0, i + 1, 0) for i in range(n - 1)])


def conv_graph(owned=True, act=True, pad=True):
    """x -> zero pad -> conv(w, b) -> relu: the fusable pattern."""
    x, xp = f32(1, 2, 5, 5), f32(1, 2, 7, 7)
    w, b, y = f32(3, 2, 3, 3, flags=OWNED if owned else 0), f32(1, 3, 1, 1), f32(1, 3, 5, 5)
    nodes = [N(dml.PaddingOperatorDesc(x, xp, start_padding=(0, 0, 1, 1),
                                       end_padding=(0, 0, 1, 1))),
             N(dml.ConvolutionOperatorDesc(xp, w, b, y)),
             N(dml.ActivationLeakyReluOperatorDesc(y, y, alpha=0.1))]
    return dml.GraphDesc(3, 1, nodes, [IN(0, 0, 0), IN(1, 1, 1), IN(2, 1, 2)], [OUT(2, 0, 0)],
                         [MID(0, 0, 1, 0), MID(1, 0, 2, 0)])


def conv_inputs(rng):
    return (rng.standard_normal((1, 2, 5, 5)).astype(np.float32),
            (rng.standard_normal((3, 2, 3, 3)) * 0.5).astype(np.float32),
            rng.standard_normal((1, 3, 1, 1)).astype(np.float32))


def conv_want(x, w, b):
    y = convolution_reference(x, w, b.reshape(-1), [1, 1], [1, 1], [1, 1], [1, 1], [0, 0], 1,
                              "cross_correlation", "forward")
    return np.where(y >= 0, y, 0.1 * y)


# -- validation ------------------------------------------------------------------------------
def _replace(g, **kw):
    from dataclasses import replace
    return replace(g, **kw)


def _raises(device, g, field, match=None):
    with pytest.raises(ValidationError) as info:
        device.compile_graph(g)
    assert info.value.field in ((field,) if isinstance(field, str) else field), str(info.value)
    if match:
        assert match in info.value.rule, str(info.value)
    return info.value


@pytest.mark.parametrize("fuse", [True, False])
def test_valid_graphs_compile(device, fuse):
    """The valid graphs these tests start from validate, compile (fused or not) and
    compute what their nodes describe."""
    rng = np.random.default_rng(3)
    g = chain()
    g.validate()
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    cg = device.compile_graph(g, fuse=fuse)
    out = device.empty((1, 2, 4, 4))
    cg.execute([device.tensor(x)], [out])
    want = np.tanh(1 / (1 + np.exp(-np.maximum(x.astype(np.float64), 0))))
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    cg.release()
    g = conv_graph()
    g.validate()
    x, w, b = conv_inputs(rng)
    cg = device.compile_graph(g, fuse=fuse, constants={1: w})
    out = device.empty((1, 3, 5, 5))
    cg.execute([device.tensor(x), None, device.tensor(b)], [out])
    np.testing.assert_allclose(out.numpy(), conv_want(x, w, b), rtol=1e-5, atol=1e-5)
    cg.release()


@pytest.mark.parametrize("case, field, match", [
    ("input index", "GraphDesc.input_edges[0].graph_input_index", "InputCount"),
    ("to node", "GraphDesc.input_edges[0].to_node_index", "NodeCount"),
    ("to slot", "GraphDesc.input_edges[0].to_node_input_index", "has 1 inputs"),
    ("output index", "GraphDesc.output_edges[0].graph_output_index", "OutputCount"),
    ("from node", "GraphDesc.output_edges[0].from_node_index", "NodeCount"),
    ("from slot", "GraphDesc.output_edges[0].from_node_output_index", "has 1 outputs"),
    ("mid from", "GraphDesc.intermediate_edges[1].from_node_index", "NodeCount"),
    ("mid to slot", "GraphDesc.intermediate_edges[1].to_node_input_index", "has 1 inputs"),
    ("negative", "GraphDesc.intermediate_edges[0].to_node_index", "UINT"),
])
def test_indices_in_range(device, case, field, match):
    g = chain()
    ie, oe, me = list(g.input_edges), list(g.output_edges), list(g.intermediate_edges)
    if case == "input index":
        ie[0] = IN(1, 0, 0)
    elif case == "to node":
        ie[0] = IN(0, 3, 0)
    elif case == "to slot":
        ie[0] = IN(0, 0, 1)
    elif case == "output index":
        oe[0] = OUT(2, 0, 1)
    elif case == "from node":
        oe[0] = OUT(5, 0, 0)
    elif case == "from slot":
        oe[0] = OUT(2, 1, 0)
    elif case == "mid from":
        me[1] = MID(7, 0, 2, 0)
    elif case == "mid to slot":
        me[1] = MID(1, 0, 2, 3)
    else:
        me[0] = MID(0, 0, -1, 0)
    _raises(device, _replace(g, input_edges=ie, output_edges=oe, intermediate_edges=me),
            field, match)


def test_each_input_connected_exactly_once(device):
    g = chain()
    _raises(device, _replace(g, intermediate_edges=g.intermediate_edges[:1]),
            "GraphDesc.nodes[2]", "input 0")
    _raises(device, _replace(g, input_edges=g.input_edges + (IN(0, 1, 0),)),
            "GraphDesc.intermediate_edges[0]", "already connected by GraphDesc.input_edges[1]")


def test_every_output_connected(device):
    g = chain()
    _raises(device, _replace(g, output_edges=()), "GraphDesc.output_edges", "graph output 0")
    _raises(device, _replace(g, output_edges=g.output_edges + (OUT(1, 0, 0),)),
            "GraphDesc.output_edges[1]", "already connected")
    # a node output nobody reads
    _raises(device, _replace(g, output_count=1, output_edges=(OUT(1, 0, 0),),
                             intermediate_edges=g.intermediate_edges[:1] + (MID(0, 0, 2, 0),)),
            "GraphDesc.nodes[2]", "output 0")


def test_optional_input(device):
    """A convolution's null bias is not connected; connecting it is refused."""
    g = conv_graph()
    nodes = list(g.nodes)
    nodes[1] = N(dml.ConvolutionOperatorDesc(f32(1, 2, 7, 7), f32(3, 2, 3, 3, flags=OWNED), None,
                                             f32(1, 3, 5, 5)))
    ok = _replace(g, input_count=2, nodes=nodes, input_edges=g.input_edges[:2])
    device.compile_graph(ok, constants={1: np.zeros((3, 2, 3, 3), np.float32)}).release()
    _raises(device, _replace(ok, input_count=3, input_edges=g.input_edges),
            "GraphDesc.input_edges[2]", "absent optional input")
    _raises(device, _replace(g, input_edges=g.input_edges[:2], input_count=2),
            "GraphDesc.nodes[1]", "input 2")


def test_no_cycles(device):
    g = chain()
    cyc = _replace(g, input_count=1, input_edges=(IN(0, 0, 0),),
                   intermediate_edges=(MID(0, 0, 1, 0), MID(2, 0, 1, 0)))
    _raises(device, cyc, "GraphDesc.intermediate_edges[1]", "already connected")
    loop = dml.GraphDesc(0, 1, chain().nodes[:2], (), (OUT(1, 0, 0),),
                         (MID(0, 0, 1, 0), MID(1, 0, 0, 0)))
    err = _raises(device, loop, ("GraphDesc.intermediate_edges[0]",
                                 "GraphDesc.intermediate_edges[1]"), "cycle")
    assert "directed acyclic" in err.rule
    self_loop = dml.GraphDesc(0, 1, chain().nodes[:1], (), (OUT(0, 0, 0),), (MID(0, 0, 0, 0),))
    _raises(device, self_loop, "GraphDesc.intermediate_edges[0]", "cycle")


def test_edge_sizes(device):
    """The page's rule: connected tensors' TotalTensorSizeInBytes are identical (other
    sizes and types are legal reinterpretations)."""
    t, u = f32(1, 2, 4, 4), f32(1, 2, 4, 5)
    nodes = [N(dml.ActivationReluOperatorDesc(t, t)), N(dml.ActivationReluOperatorDesc(u, u))]
    g = dml.GraphDesc(1, 1, nodes, [IN(0, 0, 0)], [OUT(1, 0, 0)], [MID(0, 0, 1, 0)])
    _raises(device, g, "GraphDesc.intermediate_edges[0]", "TotalTensorSizeInBytes")
    # same bytes, other sizes: legal, and computed as a reinterpretation
    v = f32(32)
    nodes[1] = N(dml.ActivationNegativeOperatorDesc(v, v)) if hasattr(
        dml, "ActivationNegativeOperatorDesc") else N(dml.ActivationLinearOperatorDesc(
            v, v, alpha=-1.0))
    g = _replace(g, nodes=nodes)
    cg = device.compile_graph(g)
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(1, 2, 4, 4)
    out = device.empty(32)
    cg.execute([device.tensor(x)], [out])
    np.testing.assert_array_equal(out.numpy(), -np.maximum(x, 0).reshape(-1))
    cg.release()


def test_node_descriptor_errors_name_the_node(device):
    g = chain()
    nodes = list(g.nodes)
    t = f32(1, 2, 4, 4)
    nodes[1] = N(dml.ActivationEluOperatorDesc(t, f32(1, 2, 4, 5)))
    err = _raises(device, _replace(g, nodes=nodes), "GraphDesc.nodes[1].operator")
    assert "ActivationEluOperatorDesc.output_tensor.sizes" in err.rule
    nodes[1] = "relu"
    _raises(device, _replace(g, nodes=nodes), "GraphDesc.nodes[1]", "OperatorGraphNodeDesc")
    _raises(device, dml.GraphDesc(1, 1, ()), "GraphDesc.nodes", "NodeCount")
    _raises(device, _replace(g, input_edges=[OUT(0, 0, 0)]), "GraphDesc.input_edges[0]",
            "InputGraphEdgeDesc")


def test_owned_by_dml_rules(device):
    g = conv_graph()
    # the flag on an input connected by an intermediate edge
    t = f32(1, 2, 5, 5, flags=OWNED)
    nodes = [N(dml.ActivationReluOperatorDesc(f32(1, 2, 5, 5), f32(1, 2, 5, 5))),
             N(dml.ActivationReluOperatorDesc(t, f32(1, 2, 5, 5)))]
    bad = dml.GraphDesc(1, 1, nodes, [IN(0, 0, 0)], [OUT(1, 0, 0)], [MID(0, 0, 1, 0)])
    _raises(device, bad, "GraphDesc.intermediate_edges[0]", "graph input")
    # one graph input to inputs that use and omit the flag
    mixed = dml.GraphDesc(1, 2, [N(dml.ActivationReluOperatorDesc(t, f32(1, 2, 5, 5))),
                                 N(dml.ActivationReluOperatorDesc(f32(1, 2, 5, 5),
                                                                  f32(1, 2, 5, 5)))],
                          [IN(0, 0, 0), IN(0, 1, 0)], [OUT(0, 0, 0), OUT(1, 0, 1)])
    _raises(device, mixed, "GraphDesc.input_edges[1]", "equivalently")
    # on an output
    out_flag = dml.GraphDesc(1, 1, [N(dml.ActivationReluOperatorDesc(
        f32(4), f32(4, flags=OWNED)))], [IN(0, 0, 0)], [OUT(0, 0, 0)])
    _raises(device, out_flag, "GraphDesc.nodes[0].operator", "only be used on input")
    # bound at execution / not initialized
    rng = np.random.default_rng(0)
    x, w, b = conv_inputs(rng)
    cg = device.compile_graph(g)
    out = device.empty((1, 3, 5, 5))
    with pytest.raises(ValidationError, match="initialize"):
        cg.execute([device.tensor(x), None, device.tensor(b)], [out])
    with pytest.raises(ValidationError) as info:
        cg.execute([device.tensor(x), device.tensor(w), device.tensor(b)], [out])
    assert info.value.field == "inputs[1]"
    with pytest.raises(ValidationError) as info:
        cg.initialize({0: x})
    assert info.value.field == "constants[0]"
    cg.initialize({1: w})
    cg.execute([device.tensor(x), None, device.tensor(b)], [out])
    np.testing.assert_allclose(out.numpy(), conv_want(x, w, b), rtol=1e-5, atol=1e-5)
    cg.release()


# -- execution -------------------------------------------------------------------------------
@pytest.mark.parametrize("fuse", [True, False])
def test_fused_pattern(device, fuse):
    rng = np.random.default_rng(1)
    x, w, b = conv_inputs(rng)
    graph = conv_graph()
    graph = dml.GraphDesc(graph.input_count, graph.output_count,
                          [replace(n, name=k) for n, k in zip(graph.nodes, ("pad", "conv", "act"))],
                          graph.input_edges, graph.output_edges, graph.intermediate_edges)
    cg = device.compile_graph(graph, fuse=fuse, constants={1: w})
    if fuse:
        assert [type(d).__name__ for d in cg.nodes] == ["ConvolutionOperatorDesc"]
        assert cg.nodes[0].start_padding == (1, 1) and cg.nodes[0].fused_activation.alpha == 0.1
        assert cg.arena_bytes == 0
        pad, act = cg.fusions
        assert (pad.kind, pad.absorbed, pad.into) == ("padding", (0,), (1,))
        assert (act.kind, act.absorbed, act.into) == ("activation", (2,), (0, 1))
        assert (pad.absorbed_names, pad.into_names) == (("pad",), ("conv",))
        assert act.into_names == ("pad", "conv") and act.absorbed_names == ("act",)
        assert str(pad) == "the zero padding nodes[0] folded into nodes[1]"
        assert str(act) == f"nodes[2] ({act.operator}) fused into the convolution nodes[0, 1]"
    else:
        assert len(cg.nodes) == 3 and not cg.fusions
    out = device.empty((1, 3, 5, 5))
    xt, bt = device.tensor(x), device.tensor(b)
    cg.execute([xt, None, bt], [out])
    np.testing.assert_allclose(out.numpy(), conv_want(x, w, b), rtol=1e-5, atol=1e-5)
    # replay with new data in the same tensors: no re-recording
    seq = cg._cache.seq
    x2 = x[:, ::-1].copy()
    xt.write(x2)
    cg.execute([xt, None, bt], [out])
    assert cg._cache.seq is seq
    np.testing.assert_allclose(out.numpy(), conv_want(x2, w, b), rtol=1e-5, atol=1e-5)
    cg.release()


def test_no_fusion_where_not_exact(device):
    """The convolution's output read by a second node, a non-zero padding value, padding
    of the channel dimension: nothing fuses."""
    x, xp = f32(1, 2, 5, 5), f32(1, 2, 7, 7)
    w, y = f32(3, 2, 3, 3), f32(1, 3, 5, 5)
    conv = dml.ConvolutionOperatorDesc(xp, w, None, y)
    nodes = [N(dml.PaddingOperatorDesc(x, xp, padding_value=1.0, start_padding=(0, 0, 1, 1),
                                       end_padding=(0, 0, 1, 1))),
             N(conv), N(dml.ActivationReluOperatorDesc(y, y))]
    g = dml.GraphDesc(2, 2, nodes, [IN(0, 0, 0), IN(1, 1, 1)], [OUT(2, 0, 0), OUT(1, 0, 1)],
                      [MID(0, 0, 1, 0), MID(1, 0, 2, 0)])
    cg = device.compile_graph(g)
    assert not cg.fusions and len(cg.nodes) == 3
    cg.release()
    xc = f32(1, 1, 5, 5)
    chan = [N(dml.PaddingOperatorDesc(xc, xp, start_padding=(0, 1, 1, 1),
                                      end_padding=(0, 0, 1, 1))), N(conv)]
    g = dml.GraphDesc(2, 1, chan, [IN(0, 0, 0), IN(1, 1, 1)], [OUT(1, 0, 0)], [MID(0, 0, 1, 0)])
    cg = device.compile_graph(g)
    assert not cg.fusions
    cg.release()


def test_arena_shares_memory_in_a_chain(device):
    cg = device.compile_graph(chain(6, (1, 4, 8, 8)))
    assert cg.intermediate_bytes == cg.declared_intermediate_bytes == 5 * 4 * 64 * 4
    assert cg.arena_bytes == cg.unfused_arena_bytes < cg.intermediate_bytes
    align = device.limits["minStorageBufferOffsetAlignment"]
    assert all(off % align == 0 for off, _ in cg.offsets.values())
    x = np.linspace(-3, 3, 256, dtype=np.float32).reshape(1, 4, 8, 8)
    out = device.empty(x.shape)
    cg.execute([device.tensor(x)], [out])
    want = x.astype(np.float64)
    for i in range(6):
        want = [np.maximum(want, 0), 1 / (1 + np.exp(-want)), np.tanh(want)][i % 3]
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    cg.release()


def test_sequence_composition(device):
    """Two graphs and an operator recorded into one sequence, run twice."""
    rng = np.random.default_rng(2)
    x, w, b = conv_inputs(rng)
    g1 = device.compile_graph(conv_graph(), constants={1: w})
    g2 = device.compile_graph(chain(3, (1, 3, 5, 5)))
    t = f32(1, 3, 5, 5)
    op = device.compile_operator(device.create_operator(dml.ActivationLinearOperatorDesc(
        t, t, alpha=2.0, beta=1.0)))
    xt, bt = device.tensor(x), device.tensor(b)
    mid, mid2, out = device.empty((1, 3, 5, 5)), device.empty((1, 3, 5, 5)), device.empty((1, 3, 5, 5))
    seq = device.sequence()
    g1.record(seq, [xt, None, bt], [mid])
    g2.record(seq, [mid], [mid2])
    op.record(seq, [mid2], [out])
    for _ in range(2):
        seq.run()
        y = conv_want(x, w, b)
        y = np.tanh(1 / (1 + np.exp(-np.maximum(y, 0))))
        np.testing.assert_allclose(out.numpy(), 2 * y + 1, rtol=1e-5, atol=1e-5)
    seq.close()
    for c in (g1, g2, op):
        c.release()


def test_release(device):
    cg = device.compile_graph(chain())
    cg.release()
    cg.release()
    with pytest.raises(vkml.DeviceError):
        cg.execute([device.empty((1, 2, 4, 4))], [device.empty((1, 2, 4, 4))])


# -- random DAGs -----------------------------------------------------------------------------
ACTS = ["relu", "leaky_relu", "sigmoid", "tanh", "elu", "clip", "softplus", "gelu"]


@st.composite
def dags(draw):
    """A random DAG over small NCHW tensors: each node takes one of the values so far
    (the graph input or a node's output), so values fan out; conv filters and biases are
    graph inputs (filters sometimes OWNED_BY_DML)."""
    rng_seed = draw(st.integers(0, 2**31))
    values = [(1, draw(st.integers(1, 3)), draw(st.integers(3, 6)), draw(st.integers(3, 6)))]
    ops = []
    for _ in range(draw(st.integers(1, 6))):
        src = draw(st.integers(0, len(values) - 1))
        n, c, h, w = values[src]
        kind = draw(st.sampled_from(["pad", "pad", "conv", "conv", "act", "act", "lp"]))
        if kind == "pad":
            s = draw(st.lists(st.integers(0, 2), min_size=2, max_size=2))
            e = draw(st.lists(st.integers(0, 2), min_size=2, max_size=2))
            mode = draw(st.sampled_from(["constant", "constant", "constant", "edge"]))
            value = draw(st.sampled_from([0.0, 0.0, 0.5]))
            ops.append(("pad", src, dict(start=s, end=e, mode=mode, value=value)))
            values.append((n, c, h + s[0] + e[0], w + s[1] + e[1]))
        elif kind == "conv":
            k = [draw(st.integers(1, min(3, h))), draw(st.integers(1, min(3, w)))]
            pad = draw(st.lists(st.integers(0, 1), min_size=4, max_size=4))
            co = draw(st.integers(1, 3))
            bias = draw(st.booleans())
            owned = draw(st.booleans())
            ops.append(("conv", src, dict(k=k, pad=pad, co=co, bias=bias, owned=owned)))
            values.append((n, co, h + pad[0] + pad[2] - k[0] + 1, w + pad[1] + pad[3] - k[1] + 1))
        elif kind == "act":
            ops.append(("act", src, dict(name=draw(st.sampled_from(ACTS)))))
            values.append((n, c, h, w))
        else:
            k = [draw(st.integers(1, min(2, h))), draw(st.integers(1, min(2, w)))]
            pad = draw(st.lists(st.integers(0, 1), min_size=4, max_size=4))
            p = draw(st.sampled_from([1, 2, 3]))
            ops.append(("lp", src, dict(k=k, pad=pad, p=p)))
            values.append((n, c, h + pad[0] + pad[2] - k[0] + 1, w + pad[1] + pad[3] - k[1] + 1))
    extra = draw(st.lists(st.integers(1, len(values) - 1), max_size=2))   # also graph outputs
    return rng_seed, values, ops, extra


def build_dag(values, ops, extra, rng):
    """(GraphDesc, input arrays, constants, references of the outputs) for a drawn DAG."""
    nodes, in_edges, mid_edges = [], [], []
    arrays = [rng.standard_normal(values[0]).astype(np.float32)]
    refs = [arrays[0].astype(np.float64)]
    constants = {}
    used = set()

    def connect(src, node, slot):
        used.add(src)
        if src == 0:
            in_edges.append(IN(0, node, slot))
        else:
            mid_edges.append(MID(src - 1, 0, node, slot))

    for vi, (kind, src, a) in enumerate(ops, start=1):
        i = len(nodes)
        shp, out = values[src], values[vi]
        x = refs[src]
        if kind == "pad":
            mode = dml.PaddingMode.CONSTANT if a["mode"] == "constant" else dml.PaddingMode.EDGE
            nodes.append(N(dml.PaddingOperatorDesc(
                f32(*shp), f32(*out), mode, a["value"], (0, 0, *a["start"]), (0, 0, *a["end"]))))
            y = pad_reference(x, (0, 0, *a["start"]), (0, 0, *a["end"]), a["mode"], a["value"])
        elif kind == "conv":
            co, ci = out[1], shp[1]
            wshape = (co, ci, *a["k"])
            wt = (rng.standard_normal(wshape) * 0.5).astype(np.float32)
            bt = rng.standard_normal((1, co, 1, 1)).astype(np.float32) if a["bias"] else None
            g = len(arrays)
            arrays.append(None if a["owned"] else wt)
            if a["owned"]:
                constants[g] = wt
            nodes.append(N(dml.ConvolutionOperatorDesc(
                f32(*shp), f32(*wshape, flags=OWNED if a["owned"] else 0),
                f32(1, co, 1, 1) if a["bias"] else None, f32(*out),
                start_padding=a["pad"][:2], end_padding=a["pad"][2:])))
            in_edges.append(IN(g, i, 1))
            if a["bias"]:
                in_edges.append(IN(len(arrays), i, 2))
                arrays.append(bt)
            y = convolution_reference(x, wt, None if bt is None else bt.reshape(-1), [1, 1],
                                      [1, 1], a["pad"][:2], a["pad"][2:], [0, 0], 1,
                                      "cross_correlation", "forward")
        elif kind == "act":
            params = dict(FORMULAS[a["name"]][0])
            nodes.append(N(dml.ACTIVATIONS[a["name"]](f32(*shp), f32(*out), **params)))
            with np.errstate(over="ignore"):
                y = FORMULAS[a["name"]][1](x, **params)
        else:
            nodes.append(N(dml.LpPooling1OperatorDesc(
                f32(*shp), f32(*out), (1, 1), tuple(a["k"]), tuple(a["pad"][:2]),
                tuple(a["pad"][2:]), (1, 1), a["p"])))
            y = lp_pooling_reference(x, a["k"], [1, 1], [1, 1], a["pad"][:2], a["pad"][2:], a["p"])
        connect(src, i, 0)
        refs.append(y.astype(np.float32).astype(np.float64))   # each operator rounds once
    outs = sorted({v for v in range(1, len(values)) if v not in used} | set(extra))
    out_edges = [OUT(v - 1, 0, g) for g, v in enumerate(outs)]
    g = dml.GraphDesc(len(arrays), len(outs), nodes, in_edges, out_edges, mid_edges)
    return g, arrays, constants, [refs[v] for v in outs], [values[v] for v in outs]


@pytest.mark.floor(ran=20)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=dags())
def test_random_dags(device, case, cases):
    seed, values, ops, extra = case
    rng = np.random.default_rng(seed)
    g, arrays, constants, refs, shapes = build_dag(values, ops, extra, rng)
    results = []
    for fuse in (True, False):
        cg = device.compile_graph(g, fuse=fuse, constants=constants)
        assert cg.arena_bytes <= cg.intermediate_bytes <= cg.declared_intermediate_bytes
        assert cg.unfused_arena_bytes <= cg.declared_intermediate_bytes
        if not fuse:            # the declared graph is the compiled one
            assert (cg.arena_bytes, cg.intermediate_bytes) == (
                cg.unfused_arena_bytes, cg.declared_intermediate_bytes)
        ins = [None if a is None else device.tensor(a) for a in arrays]
        outs = [device.empty(s) for s in shapes]
        cg.execute(ins, outs)
        cg.execute(ins, outs)                       # replayed
        got = [o.numpy() for o in outs]
        for r, w in zip(got, refs):
            np.testing.assert_allclose(r, w, rtol=2e-4, atol=2e-4)
        results.append(got)
        cg.release()
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    cases.add("ran")


# -- owned filters through a graph -------------------------------------------------------------
def winograd_graph(owned):
    """x -> zero pad 1 -> conv 3x3 16->16 (Winograd's shape, filter a graph input) -> relu."""
    x, xp, y = f32(1, 16, 22, 22), f32(1, 16, 24, 24), f32(1, 16, 22, 22)
    w = f32(16, 16, 3, 3, flags=OWNED if owned else 0)
    nodes = [N(dml.PaddingOperatorDesc(x, xp, start_padding=(0, 0, 1, 1),
                                       end_padding=(0, 0, 1, 1))),
             N(dml.ConvolutionOperatorDesc(xp, w, None, y)),
             N(dml.ActivationReluOperatorDesc(y, y))]
    return dml.GraphDesc(2, 1, nodes, [IN(0, 0, 0), IN(1, 1, 1)], [OUT(2, 0, 0)],
                         [MID(0, 0, 1, 0), MID(1, 0, 2, 0)])


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("path", ["winograd", "gemm"])
def test_owned_filter_constant_transformed_once(device, fuse, path):
    """A graph's OWNED_BY_DML filter is handed to its convolution node, which transforms
    it at initialization (forced, by ``paths``, to each path that transforms it):
    the graph records fewer dispatches than with the filter bound at execution, keeps no
    copy of its own, gives the same results, and later writes to the initializing tensor
    change nothing."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 16, 22, 22)).astype(np.float32)
    w = (rng.standard_normal((16, 16, 3, 3)) * 0.3).astype(np.float32)
    tw = device.tensor(w)
    owned = device.compile_graph(winograd_graph(True), fuse=fuse, constants={1: tw},
                                 paths={1: path})
    plain = device.compile_graph(winograd_graph(False), fuse=fuse, paths={1: path})
    conv = [n.compiled for n in owned._graph_nodes.values()
            if isinstance(n.desc, dml.ConvolutionOperatorDesc)][0]
    assert conv.owned_inputs == [1] and owned._constants == {}
    xt = device.tensor(x)
    y1, y2 = device.empty((1, 16, 22, 22)), device.empty((1, 16, 22, 22))
    plain.execute([xt, tw], [y1])
    owned.execute([xt, None], [y2])
    want = np.maximum(convolution_reference(x, w, None, [1, 1], [1, 1], [1, 1], [1, 1],
                                            [0, 0], 1, "cross_correlation", "forward"), 0)
    np.testing.assert_allclose(y2.numpy(), want, rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(y2.numpy(), y1.numpy())
    counts = []
    for cg, ins, out in ((plain, [xt, tw], y1), (owned, [xt, None], y2)):
        seq = device.sequence()
        cg.record(seq, ins, [out])
        counts.append(seq.dispatches)
        seq.close()
    assert conv.path.name == path and conv.path.filter_ready
    assert counts[1] < counts[0], counts           # the filter transform is not recorded
    tw.write(np.zeros_like(w))
    owned.execute([xt, None], [y2])
    np.testing.assert_array_equal(y2.numpy(), y1.numpy())
    with pytest.raises(ValidationError) as info:
        owned.execute([xt, tw], [y2])
    assert info.value.field == "inputs[1]"
    owned.release()
    plain.release()


def test_paths_force_a_node_and_name_what_is_wrong(device):
    """``compile_graph(..., paths={node: name})`` forces a node's kernel path (the
    convolution keeps its index when the padding and the activation fuse into it); a key
    that is no node, a node without paths and a name the operator lacks are refused."""
    for fuse in (True, False):
        cg = device.compile_graph(winograd_graph(False), fuse=fuse, paths={1: "direct"})
        conv = [n.compiled for n in cg._graph_nodes.values()
                if isinstance(n.desc, dml.ConvolutionOperatorDesc)][0]
        assert conv.path.name == "direct" and conv.force == "direct"
        cg.release()
    for paths, field in (({3: "direct"}, "paths"), ({"1": "direct"}, "paths"),
                         ({2: "direct"}, "paths[2]"), ({1: 7}, "paths[1]"),
                         ({1: "fastest"}, "path")):
        with pytest.raises(ValidationError) as info:
            device.compile_graph(winograd_graph(False), paths=paths)
        assert info.value.field == field, (paths, str(info.value))


# -- LP pooling fused into the Winograd output pass ------------------------------------------
def pool_graph(dtype="float32", size=(22, 22), window=(2, 2), strides=(2, 2), start=(0, 0),
               end=(0, 0), dilations=(1, 1), p=2, conv_is_output=False, lp0=False,
               owned=False):
    """x -> conv 3x3, pad 1, 16 -> 16 channels (Winograd's shape; filter a graph input) ->
    relu -> LP pooling (one graph output; with ``conv_is_output`` the relu's output is a
    second one; ``lp0``: DML_LP_POOLING_OPERATOR_DESC, no dilations; ``owned``: the
    filter OWNED_BY_DML)."""
    x, y = F(dtype, (1, 16, *size)), F(dtype, (1, 16, *size))
    w, b = F(dtype, (16, 16, 3, 3), flags=OWNED if owned else 0), F(dtype, (1, 16, 1, 1))
    pooled = F(dtype, dml.lp_pooling_output_sizes(y.sizes, strides, window, start, end,
                                                  dilations))
    nodes = [N(dml.ConvolutionOperatorDesc(x, w, b, y, start_padding=(1, 1),
                                           end_padding=(1, 1))),
             N(dml.ActivationReluOperatorDesc(y, y)),
             N(dml.LpPoolingOperatorDesc(y, pooled, strides, window, start, end, p) if lp0 else
               dml.LpPooling1OperatorDesc(y, pooled, strides, window, start, end, dilations, p))]
    outs = [OUT(2, 0, 0)] + ([OUT(1, 0, 1)] if conv_is_output else [])
    g = dml.GraphDesc(3, len(outs), nodes, [IN(0, 0, 0), IN(1, 0, 1), IN(2, 0, 2)], outs,
                      [MID(0, 0, 1, 0), MID(1, 0, 2, 0)])
    return g, [pooled.sizes] + ([y.sizes] if conv_is_output else [])


def pool_inputs(rng, dtype, size):
    return [rng.standard_normal((1, 16, *size)).astype(dtype),
            (rng.standard_normal((16, 16, 3, 3)) / 12).astype(dtype),
            (rng.standard_normal((1, 16, 1, 1)) * 0.1).astype(dtype)]


def run_graph(device, g, arrays, shapes, dtype, **kw):
    cg = device.compile_graph(g, **kw)
    outs = [device.empty(s, dtype) for s in shapes]
    cg.execute([device.tensor(a) for a in arrays], outs)
    return cg, [o.numpy() for o in outs]


def pool_reference(arrays, window=(2, 2), strides=(2, 2), start=(0, 0), end=(0, 0),
                   dilations=(1, 1), p=2):
    x, w, b = [a.astype(np.float64) for a in arrays]
    y = np.maximum(convolution_reference(x, w, b.reshape(-1), [1, 1], [1, 1], [1, 1], [1, 1],
                                         [0, 0], 1, "cross_correlation", "forward"), 0)
    return lp_pooling_reference(y, window, strides, dilations, start, end, p)


def pooled(cg) -> bool:
    """Whether the compiled graph fused an LP pooling into a convolution."""
    return any(f.kind == "pooling" for f in cg.fusions)


@pytest.mark.parametrize("dtype, size, p, lp0", [
    ("float32", (22, 22), 2, False), ("float16", (22, 22), 2, False),
    ("float32", (23, 21), 2, False),               # odd: the last row and column unread
    ("float32", (21, 23), 1, True), ("float16", (23, 22), 3, False)])
def test_lp_pooling_fused_into_winograd(device, dtype, size, p, lp0):
    """Conv (Winograd, forced) -> Relu -> LP pooling 2x2/2: the pooling runs in the
    convolution's output pass (one node, no intermediate), with the same results as the
    unfused graph (the same sums in the same order: equal up to the last bit of the
    tensor type) and the LP pooling reference; odd convolution outputs give floor(/2)."""
    rng = np.random.default_rng(7)
    g, shapes = pool_graph(dtype, size, p=p, lp0=lp0)
    arrays = pool_inputs(rng, dtype, size)
    assert shapes[0] == (1, 16, size[0] // 2, size[1] // 2)
    cg, (fused,) = run_graph(device, g, arrays, shapes, dtype, paths={0: "winograd"})
    assert [type(d).__name__ for d in cg.nodes] == ["PooledConvolutionDesc"], cg.fusions
    what = "LP_POOLING" if lp0 else "LP_POOLING1"
    f = cg.fusions[-1]
    assert (f.kind, f.absorbed, f.into, f.operator) == ("pooling", (2,), (0, 1),
                                                        f"DML_OPERATOR_{what}")
    assert str(f) == f"nodes[2] (DML_OPERATOR_{what}) fused into the convolution nodes[0, 1]"
    assert cg.arena_bytes == 0 and cg._graph_nodes[0].compiled.path.pool is not None
    cg.release()
    cg, (plain,) = run_graph(device, g, arrays, shapes, dtype, fuse=False,
                             paths={0: "winograd"})
    cg.release()
    ulp = 1e-6 if dtype == "float32" else 1e-3
    np.testing.assert_allclose(fused.astype(np.float64), plain.astype(np.float64),
                               rtol=ulp, atol=ulp)
    tol = 1e-4 if dtype == "float32" else 5e-3    # Winograd: ~1e-5 x sqrt(9 C_in)
    np.testing.assert_allclose(fused.astype(np.float64), pool_reference(arrays, p=p),
                               rtol=tol, atol=tol)


@pytest.mark.parametrize("case", [
    {"window": (3, 3)}, {"window": (2, 3)}, {"strides": (1, 1)}, {"strides": (2, 1)},
    {"start": (1, 0)}, {"end": (0, 1)}, {"dilations": (2, 2)}, {"conv_is_output": True},
    {"path": "gemm"}])
def test_lp_pooling_fusion_only_where_exact(device, case):
    """No pooling fusion for windows, strides, padding or dilations other than 2x2 / 2 /
    none / 1, where the convolution's output is also a graph output, or where the
    convolution's path (here forced) is not winograd; the results are the reference's."""
    case = dict(case)
    path = case.pop("path", "winograd")
    size = (22, 22)                                # 6 x 6 tiles: Winograd takes it
    rng = np.random.default_rng(3)
    g, shapes = pool_graph("float32", size, **case)
    arrays = pool_inputs(rng, np.float32, size)
    cg, got = run_graph(device, g, arrays, shapes, np.float32, paths={0: path})
    assert not pooled(cg), cg.fusions
    assert [type(d).__name__ for d in cg.nodes] == ["ConvolutionOperatorDesc",
                                                    "LpPooling1OperatorDesc"]
    assert cg._graph_nodes[0].compiled.path.name == path
    cg.release()
    case.pop("conv_is_output", None)
    np.testing.assert_allclose(got[0], pool_reference(arrays, **case), rtol=1e-4, atol=1e-4)


def test_lp_pooling_fusion_follows_the_chosen_path(device, monkeypatch):
    """Unforced, the convolution's own choice decides: the heuristic's path (gemm_sg or
    gemm for 16 channels where they run it) keeps both nodes; Winograd preferred, the
    pooling fuses, and the ONNX backend reports "LpPool (fused into Conv)"."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    import vkml.onnx as vonnx
    from vkml.ops.convolution import WinogradPath
    rng = np.random.default_rng(5)
    x, w, b = pool_inputs(rng, np.float32, (22, 22))
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("LpPool", ["r"], ["y"], name="lppool", kernel_shape=[2, 2],
                              strides=[2, 2], p=2)]
    graph = helper.make_graph(
        nodes, "conv_pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                           [1, 16, 22, 22])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 11, 11])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b.reshape(-1), "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = min(model.ir_version, 8)
    want = pool_reference([x, w, b])
    for prefer in (False, True):
        if prefer:
            monkeypatch.setattr(WinogradPath, "prefers", classmethod(lambda cls, op, geo: True))
        rep = vonnx.prepare(model, device=device, strict=True)
        (y,) = rep.run([x])
        (part,) = rep._parts
        conv = part.last.compiled._graph_nodes[0].compiled
        fused = conv.path.name == "winograd"
        assert fused or not prefer
        assert rep.partitions == [("device", [
            ("conv", "Conv"), ("relu", "Relu (fused into Conv)"),
            ("lppool", "LpPool (fused into Conv)" if fused else "LpPool")])]
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
        rep.release()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_lp_pooling_fused_storage_reads(device, dtype):
    """The pooled output pass reading M from a storage buffer (``_ssbo_pool`` variants:
    texel buffers too small for it) gives the texel variants' results."""
    rng = np.random.default_rng(9)
    g, shapes = pool_graph(dtype, (22, 22), p=2)
    arrays = pool_inputs(rng, dtype, (22, 22))
    got = []
    with vkml.Device(device.index, limits={"maxTexelBufferElements": 1024}) as small:
        for dev in (device, small):
            cg, (y,) = run_graph(dev, g, arrays, shapes, dtype, paths={0: "winograd"})
            path = cg._graph_nodes[0].compiled.path
            assert path.pool is not None and path.m_texel == (dev is device)
            got.append(y)
            cg.release()
    np.testing.assert_array_equal(got[0], got[1])


@pytest.mark.parametrize("path", ["winograd-blocked", "winograd-narrow", "winograd-sg",
                                  "winograd-cl", "winograd-gemm"])
def test_lp_pooling_fused_with_winograd_knobs(device, path):
    """The tuner's other Winograd candidates (other GEMMs, same output pass) pool too,
    with the unfused graph's results; the fast list times apart and winograd (plus
    winograd-blocked where the device ranks it strong), the others in full mode."""
    from vkml.ops import graph as graph_ops
    f = device.context.features
    sg = bool(f.get("subgroup_shuffle") and f.get("full_subgroups"))
    assert graph_ops._pooled_fast({}, device)[:2] == ("apart", "winograd")
    assert set(graph_ops._pooled_fast({}, device)) <= {"apart", "winograd", "winograd-blocked"}
    if path in ("winograd-sg", "winograd-cl") and not sg:
        pytest.skip("no full subgroups with shuffles on this device")
    rng = np.random.default_rng(4)
    g, shapes = pool_graph("float32", (22, 22))
    arrays = pool_inputs(rng, np.float32, (22, 22))
    got = []
    for fuse in (True, False):
        cg, (y,) = run_graph(device, g, arrays, shapes, np.float32, fuse=fuse, paths={0: path})
        assert pooled(cg) == fuse
        got.append(y)
        cg.release()
    np.testing.assert_allclose(got[0], got[1], rtol=1e-6, atol=1e-6)


def test_lp_pooling_fused_owned_filter(device):
    """With the filter OWNED_BY_DML, the fused node transforms it once at initialization
    (it is not bound at execution) and gives the unfused graph's results."""
    rng = np.random.default_rng(6)
    x, w, b = pool_inputs(rng, np.float32, (22, 22))
    got = []
    for fuse in (True, False):
        g, shapes = pool_graph("float32", (22, 22), owned=True)
        cg = device.compile_graph(g, fuse=fuse, constants={1: w}, paths={0: "winograd"})
        conv = cg._graph_nodes[0].compiled
        assert conv.owned_inputs == [1] and conv.path.filter_ready
        assert isinstance(conv.desc, dml.ConvolutionOperatorDesc) != fuse
        out = device.empty(shapes[0])
        cg.execute([device.tensor(x), None, device.tensor(b)], [out])
        got.append(out.numpy())
        cg.release()
    np.testing.assert_allclose(got[0], got[1], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[0], pool_reference([x, w, b]), rtol=1e-4, atol=1e-4)


class _PoolChoice:
    """A stand-in for the process's tuner: ``convolution_pooled`` answers ``name`` (as a
    stored choice); every other path its default (the heuristic decides)."""

    def __init__(self, name):
        self.name = name

    def effective_mode(self, mode=None):
        return "fast"

    def choose(self, device, path, shape, **kw):
        from vkml.ops import graph as graph_ops
        if path is graph_ops.POOLED:
            return SimpleNamespace(name=self.name, source="stored", times={})
        from vkml import tuning
        return SimpleNamespace(name=tuning._resolve(path).default, source="default", times={})


@pytest.mark.parametrize("choice", ["apart", "winograd", "winograd-narrow"])
def test_lp_pooling_fusion_follows_the_measured_choice(device, monkeypatch, choice):
    """Unforced, with tuning on, the tunable path ``convolution_pooled`` decides: "apart"
    keeps both nodes (the convolution on its own choice, the pooling not offered), a
    Winograd candidate runs the pair as one node on that candidate; the results are the
    reference's either way."""
    from vkml import tuning
    monkeypatch.setattr(tuning, "default_tuner", lambda: _PoolChoice(choice))
    rng = np.random.default_rng(11)
    g, shapes = pool_graph("float32", (22, 22))
    arrays = pool_inputs(rng, np.float32, (22, 22))
    cg, got = run_graph(device, g, arrays, shapes, np.float32)
    conv = cg._graph_nodes[0].compiled
    if choice == "apart":
        assert not pooled(cg), cg.fusions
        assert len(cg.nodes) == 2 and getattr(conv.path, "pool", None) is None
    else:
        assert [type(d).__name__ for d in cg.nodes] == ["PooledConvolutionDesc"], cg.fusions
        assert conv.path.candidate == choice and conv.path.pool is not None
    cg.release()
    np.testing.assert_allclose(got[0], pool_reference(arrays), rtol=1e-4, atol=1e-4)


def test_lp_pooling_fusion_is_timed_and_stored(device, tmp_path, monkeypatch):
    """The tuner times the pair apart and fused (Winograd) on the pair's shapes, keeps the
    faster, stores it (a second graph reads it back without timing), and the graph fuses
    exactly when the kept candidate is a fused one."""
    from vkml import tuning
    from vkml.ops import graph as graph_ops
    t = tuning.Tuner("fast", folder=tmp_path, rounds=1)
    monkeypatch.setattr(tuning, "default_tuner", lambda: t)
    rng = np.random.default_rng(12)
    g, shapes = pool_graph("float32", (22, 22), owned=True)
    x, w, b = pool_inputs(rng, np.float32, (22, 22))
    cg = device.compile_graph(g, constants={1: w})
    conv_desc, pool_desc = g.nodes[0].desc, g.nodes[2].desc
    shape = graph_ops.pooled_shape(conv_desc, pool_desc)
    c = t.choose(device, graph_ops.POOLED, shape)
    assert c.source == "stored" and {"apart", "winograd"} <= set(c.times)
    assert c.name == min(c.times, key=c.times.get)
    fused = pooled(cg)
    assert fused == (c.name != "apart"), (c.name, cg.fusions)
    out = device.empty(shapes[0], np.float32)
    cg.execute([device.tensor(x), None, device.tensor(b)], [out])
    np.testing.assert_allclose(out.numpy(), pool_reference([x, w, b]), rtol=1e-4, atol=1e-4)
    cg.release()
    monkeypatch.setattr(tuning, "_run_once", None)          # would fail if it timed again
    device.compile_graph(g, constants={1: w}).release()


@pytest.mark.parametrize("count, at", [(dml.MAX_GRAPH_INPUTS, 0), (dml.MAX_GRAPH_INPUTS, 7),
                                       (2 ** 17, 3), (1000, 997), (12, 5)])
def test_unconnected_graph_inputs_cost_nothing(device, count, at):
    """InputCount may exceed the graph inputs any edge connects (DML_GRAPH_DESC): the
    largest count vkml takes (MAX_GRAPH_INPUTS) compiles without holding a slot per
    input; the binding list ends at the last connected input, or runs on with Nones up
    to InputCount; a constant (OWNED_BY_DML) input at a high index is initialized by its
    index.  A larger count is refused, naming the field, before anything is sized."""
    rng = np.random.default_rng(at)
    x, w, b = conv_inputs(rng)
    src = conv_graph()
    with pytest.raises(ValidationError, match="input_count"):
        device.compile_graph(dml.GraphDesc(2 ** 32 - 1, 1, src.nodes, [IN(at, 0, 0)],
                                           src.output_edges, src.intermediate_edges))
    g = dml.GraphDesc(count, 1, src.nodes, [IN(at, 0, 0), IN(at + 1, 1, 1), IN(at + 2, 1, 2)],
                      src.output_edges, src.intermediate_edges)
    cg = device.compile_graph(g, constants={at + 1: w})
    assert cg.constant_inputs == [at + 1]
    ins = [None] * at + [device.tensor(x), None, device.tensor(b)]
    bindings = [ins] + ([ins + [None] * (count - len(ins))] if count <= 1000 else [])
    for given in bindings:
        out = device.empty((1, 3, 5, 5))
        cg.execute(given, [out])
        np.testing.assert_allclose(out.numpy(), conv_want(x, w, b), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValidationError, match="inputs"):
        cg.execute(ins + [device.tensor(x)], [out])      # a tensor for an unconnected input
    cg.release()

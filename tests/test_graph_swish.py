"""The graph compiler runs SWISH and HARD_SWISH in the output pass of the convolution
before them (vkml/ops/graph.py, step 1; vkml/ops/convolution/epilogue.py), beyond
DirectML's fused-activation page: on every convolution path forced in turn, float32 and
float16, against PyTorch (its silu / hardswish on a float64 convolution) and the numbers
of the unfused graph; reported as Fusion data; not where the convolution's output has a
second reader; DML's own rule (no fused_activation=swish) unchanged; and through vkml.onnx,
Conv -> Sigmoid -> Mul as one fused device node against ONNX Runtime."""
from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.ops.convolution.epilogue import EpilogueConvolutionDesc

from helpers import run_graph

conv_ops = importlib.import_module("vkml.ops.convolution")   # the module, not the function

torch = pytest.importorskip("torch")

F = dml.TensorDesc
N = dml.OperatorGraphNodeDesc
IN, OUT, MID = dml.InputGraphEdgeDesc, dml.OutputGraphEdgeDesc, dml.IntermediateGraphEdgeDesc

#: (activation, its parameters): the defaults are PyTorch's silu / hardswish; the others
#: show the parameters reach the kernel (a path applying the defaults fails those).
ACTS = [("swish", {}), ("swish", {"sigmoid_input_scale": 0.5}),
        ("hard_swish", {}), ("hard_swish", {"alpha": 0.25, "beta": 0.375})]


def _shapes(depthwise: bool):
    """(input, filter, groups): dense 16 -> 16 channels with 36 output tiles (Winograd,
    the tiled and blocked GEMMs take it), or depthwise over 8 channels."""
    if depthwise:
        return (1, 8, 9, 11), (8, 1, 3, 3), 8
    return (1, 16, 24, 24), (16, 16, 3, 3), 1


def act_graph(dtype, name, params, depthwise=False, second_reader=False):
    """x -> conv 3x3 pad 1 (w, b graph inputs) -> SWISH / HARD_SWISH -> y; with
    ``second_reader`` a Sigmoid reads the convolution's output too (a second output)."""
    xs, ws, groups = _shapes(depthwise)
    x, w, b = F(dtype, xs), F(dtype, ws), F(dtype, (1, ws[0], 1, 1))
    y = F(dtype, (1, ws[0], *xs[2:]))
    nodes = [N(dml.ConvolutionOperatorDesc(x, w, b, y, start_padding=(1, 1),
                                           end_padding=(1, 1), group_count=groups),
               name="conv"),
             N(dml.OPERATOR_ACTIVATIONS[name](y, y, **params), name="act")]
    outs, mids = [OUT(1, 0, 0)], [MID(0, 0, 1, 0)]
    if second_reader:
        nodes.append(N(dml.ActivationSigmoidOperatorDesc(y, y), name="other"))
        outs.append(OUT(2, 0, 1))
        mids.append(MID(0, 0, 2, 0))
    return dml.GraphDesc(3, len(outs), nodes, [IN(0, 0, 0), IN(1, 0, 1), IN(2, 0, 2)],
                         outs, mids)


def inputs(rng, dtype, depthwise=False):
    xs, ws, _ = _shapes(depthwise)
    fan_in = math.prod(ws[1:])
    return [(2 * rng.standard_normal(xs)).astype(dtype),        # outputs of a few units
            (rng.standard_normal(ws) / math.sqrt(fan_in)).astype(dtype),
            (0.5 * rng.standard_normal((1, ws[0], 1, 1))).astype(dtype)]


def conv_reference(arrays, depthwise=False):
    """float64: torch's convolution (pad 1)."""
    x, w, b = (torch.from_numpy(a.astype(np.float64)) for a in arrays)
    return torch.nn.functional.conv2d(x, w, b.reshape(-1), padding=1,
                                      groups=_shapes(depthwise)[2])


def reference(arrays, name, params, depthwise=False):
    """float64: torch's convolution, then torch's silu / hardswish for the default
    parameters, else the activation page's formula."""
    c = conv_reference(arrays, depthwise)
    if name == "swish":
        s = params.get("sigmoid_input_scale", 1.0)
        y = torch.nn.functional.silu(c) if s == 1.0 else c * torch.sigmoid(s * c)
    else:
        a, bb = params.get("alpha", 1 / 6), params.get("beta", 0.5)
        y = (torch.nn.functional.hardswish(c) if (a, bb) == (1 / 6, 0.5)
             else c * torch.clamp(a * c + bb, 0, 1))
    return y.numpy()


def _tolerance(dtype):
    """float32: the convolution's accumulation (Winograd's transforms the widest); float16:
    the output's rounding and tiled-f16's float16 partial sums ((TK + 1) 2^-11 sum |w x|)."""
    return dict(rtol=5e-3, atol=4e-2) if dtype == "float16" else dict(rtol=1e-4, atol=3e-4)


def _cases(dtype):
    """The candidates a test of ``dtype`` forces, each with its activation: every path's
    own candidate (its default knobs) in both data types, the other candidates (knob
    variants: other kernel variants of the same family) in one data type each, in turn;
    the activations and their parameters in turn over all of them (tiled-f16, float16
    arithmetic, in float16; the -v8 ones, float32 stores as u64vec4, in float32)."""
    out = []
    for k, (cand, (path, knobs)) in enumerate(conv_ops.CANDIDATES.items()):
        u64 = knobs.get("store64") or knobs.get("dw_v8")
        turn = ("float16" if knobs.get("f16_arith") else "float32" if u64
                else ["float32", "float16"][k % 2])
        if cand == path or turn == dtype:
            out.append((cand, *ACTS[len(out) % len(ACTS)]))
    return out


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fused_on_every_path(device, dtype):
    """Each candidate of ``convolution.CANDIDATES`` the device runs (the depthwise ones on
    a depthwise convolution), forced by ``paths=`` (:func:`_cases`): one node, an
    EpilogueConvolutionDesc on that path, the fusion reported; PyTorch's values; for each
    path's own candidate, the unfused graph's numbers (float32: the same sum and formula;
    float16: one rounding fewer)."""
    rng = np.random.default_rng(5)
    ran = set()
    for cand, name, params in _cases(dtype):
        path = conv_ops.CANDIDATES[cand][0]
        dw = path == "depthwise"
        g = act_graph(dtype, name, params, depthwise=dw)
        arrays = inputs(rng, dtype, dw)
        try:
            cg, (got,) = run_graph(device, g, arrays, dtype, paths={0: cand})
        except vkml.UnsupportedError:
            continue                      # the device lacks the path's features
        ran.add(cand)
        assert [type(d) for d in cg.nodes] == [EpilogueConvolutionDesc], cand
        assert cg.nodes[0].epilogue.SPEC.name == name and cg.nodes[0].fused_activation is None
        assert cg._graph_nodes[0].compiled.path.name == path, cand
        (f,) = cg.fusions
        assert (f.kind, f.absorbed, f.into, f.operator) == ("activation", (1,), (0,), name)
        assert (f.absorbed_names, f.into_names) == (("act",), ("conv",))
        assert str(f) == f"nodes[1] ({name}) fused into the convolution nodes[0]"
        assert cg.arena_bytes == 0
        cg.release()
        want = reference(arrays, name, params, dw)
        np.testing.assert_allclose(got.astype(np.float64), want, err_msg=f"{cand} {name}",
                                   **_tolerance(dtype))
        if cand != path:
            continue
        cg, (plain,) = run_graph(device, g, arrays, dtype, fuse=False, paths={0: cand})
        assert not cg.fusions and len(cg.nodes) == 2
        cg.release()
        same = dict(rtol=1e-6, atol=1e-6) if dtype == "float32" else dict(rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(got.astype(np.float64), plain.astype(np.float64),
                                   err_msg=cand, **same)
    # every path family ran (gemm_sg and the like where the device has their features)
    assert {"direct", "gemm", "winograd", "depthwise", "tiled", "blocked"} <= ran, ran


@pytest.mark.parametrize("name", ["swish", "hard_swish"])
def test_not_fused_where_the_output_has_a_second_reader(device, name):
    """A Sigmoid reads the convolution's output too: nothing fuses, the values are still
    the references'."""
    rng = np.random.default_rng(6)
    g = act_graph("float32", name, {}, second_reader=True)
    arrays = inputs(rng, np.float32)
    cg, (y, s) = run_graph(device, g, arrays, np.float32)
    assert not cg.fusions and len(cg.nodes) == 3
    assert type(cg.nodes[0]) is dml.ConvolutionOperatorDesc
    cg.release()
    np.testing.assert_allclose(y, reference(arrays, name, {}), **_tolerance("float32"))
    want = torch.sigmoid(conv_reference(arrays)).numpy()
    np.testing.assert_allclose(s, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["swish", "hard_swish"])
def test_with_lp_pooling_in_winograd(device, name):
    """Conv (Winograd) -> SWISH / HARD_SWISH -> LP pooling 2x2/2: both run in the
    convolution's output pass (the activation before the pooling), one node; the
    reference's values (p = 2: the root of the window's sum of squares)."""
    rng = np.random.default_rng(9)
    g = act_graph("float32", name, {})
    y = g.nodes[1].desc.output_tensor
    pooled = F("float32", (1, 16, 12, 12))
    pool = dml.LpPooling1OperatorDesc(y, pooled, (2, 2), (2, 2), (0, 0), (0, 0), (1, 1), 2)
    g = dml.GraphDesc(3, 1, [*g.nodes, N(pool, name="pool")], g.input_edges,
                      [OUT(2, 0, 0)], [*g.intermediate_edges, MID(1, 0, 2, 0)])
    arrays = inputs(rng, np.float32)
    cg, (got,) = run_graph(device, g, arrays, np.float32, paths={0: "winograd"})
    assert [type(d).__name__ for d in cg.nodes] == ["PooledConvolutionDesc"], cg.fusions
    assert [(f.kind, f.absorbed, f.into) for f in cg.fusions] == [
        ("activation", (1,), (0,)), ("pooling", (2,), (0, 1))]
    assert cg.nodes[0].epilogue.SPEC.name == name
    cg.release()
    a = reference(arrays, name, {})
    want = np.sqrt((a.reshape(1, 16, 12, 2, 12, 2) ** 2).sum(axis=(3, 5)))
    np.testing.assert_allclose(got, want, **_tolerance("float32"))


def test_transposed_convolution(device):
    """A transposed convolution (stride 2) -> SWISH with its own scale: fused, on the path
    the device chooses; torch's conv_transpose2d then the formula."""
    rng = np.random.default_rng(10)
    x, w, b, y = F("float32", (1, 4, 5, 6)), F("float32", (4, 3, 3, 3)), \
        F("float32", (1, 3, 1, 1)), F("float32", (1, 3, 11, 13))
    conv = dml.ConvolutionOperatorDesc(x, w, b, y, direction="backward", strides=(2, 2))
    act = dml.OPERATOR_ACTIVATIONS["swish"](y, y, sigmoid_input_scale=1.5)
    g = dml.GraphDesc(3, 1, [N(conv), N(act)], [IN(0, 0, 0), IN(1, 0, 1), IN(2, 0, 2)],
                      [OUT(1, 0, 0)], [MID(0, 0, 1, 0)])
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((1, 4, 5, 6), (4, 3, 3, 3),
                                                                 (1, 3, 1, 1))]
    cg, (got,) = run_graph(device, g, arrays, np.float32)
    assert [type(d) for d in cg.nodes] == [EpilogueConvolutionDesc] and cg.nodes[0].is_backward
    assert [f.operator for f in cg.fusions] == ["swish"]
    cg.release()
    xt, wt, bt = (torch.from_numpy(a.astype(np.float64)) for a in arrays)
    c = torch.nn.functional.conv_transpose2d(xt, wt, bt.reshape(-1), stride=2)
    np.testing.assert_allclose(got, (c * torch.sigmoid(1.5 * c)).numpy(), rtol=1e-4, atol=1e-4)


def test_dml_rule_unchanged(device):
    """DML's rule stays: a convolution descriptor with fused_activation swish or hard_swish
    is refused; the private descriptor refuses an activation DML fuses itself, and both."""
    xs, ws, _ = _shapes(False)
    x, w, y = F("float32", xs), F("float32", ws), F("float32", (1, 16, 22, 22))
    for act in (dml.OPERATOR_ACTIVATIONS["swish"](), dml.OPERATOR_ACTIVATIONS["hard_swish"]()):
        with pytest.raises(vkml.ValidationError) as info:
            device.create_operator(dml.ConvolutionOperatorDesc(x, w, None, y,
                                                               fused_activation=act))
        assert info.value.field.endswith("fused_activation")
    with pytest.raises(vkml.ValidationError, match="epilogue"):
        device.create_operator(EpilogueConvolutionDesc(x, w, None, y,
                                                       epilogue=dml.ActivationReluOperatorDesc()))
    with pytest.raises(vkml.ValidationError, match="fused_activation"):
        device.create_operator(EpilogueConvolutionDesc(
            x, w, None, y, fused_activation=dml.ActivationReluOperatorDesc(),
            epilogue=dml.OPERATOR_ACTIVATIONS["swish"]()))
    with pytest.raises(vkml.ValidationError, match="epilogue.sigmoid_input_scale"):
        device.create_operator(EpilogueConvolutionDesc(
            x, w, None, y, epilogue=dml.OPERATOR_ACTIVATIONS["swish"](
                sigmoid_input_scale=float("nan"))))


# -- through vkml.onnx ---------------------------------------------------------------------
@pytest.mark.parametrize("act", ["Sigmoid", "HardSigmoid"])
def test_onnx_conv_silu_is_one_fused_node(device, act):
    """Conv -> Sigmoid -> Mul (SiLU; or HardSigmoid(1/6, 1/2) -> Mul, HardSwish): the
    rewrite makes one Swish (HardSwish) node, the graph compiler runs it in the Conv;
    ONNX Runtime's values."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import helper, numpy_helper
    import vkml.onnx as vonnx
    from onnx_helpers import make_model, ort_expected, value_info

    rng = np.random.default_rng(8)
    xs, ws = [1, 4, 7, 9], [6, 4, 3, 3]
    inits = [numpy_helper.from_array((rng.standard_normal(ws) / 6).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "B")]
    attrs = {"alpha": 1 / 6, "beta": 0.5} if act == "HardSigmoid" else {}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node(act, ["c"], ["s"], name="act", **attrs),
             helper.make_node("Mul", ["c", "s"], ["y"], name="mul")]
    model = make_model(nodes, [value_info("x", xs)], [value_info("y", [1, 6, 7, 9])], inits,
                       opset=13)
    feeds = {"x": (2 * rng.standard_normal(xs)).astype(np.float32)}
    rep = vonnx.prepare(model, device=device, strict=True)
    (got,) = rep.run(feeds)
    fused = "Swish" if act == "Sigmoid" else "HardSwish"
    assert rep.partitions == [("device", [("conv", "Conv"),
                                          ("mul", f"{fused} (fused into Conv)")])]
    (want,) = ort_expected(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))

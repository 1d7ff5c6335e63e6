"""The graph compiler runs a multiply by a per-(image, channel) scale -- a
squeeze-excitation block's ``x * s``, ``s`` of N x C x 1 x 1 broadcast over H and W --
inside the convolution that alone reads its output (vkml/ops/graph.py, step 1, kind
"input scale"; vkml/ops/convolution/epilogue.py): the in-place GEMMs' ``_sc`` kernels
multiply each input element as they load it, every other path runs the multiply apart
inside the operator (``ScaleApart``).  On every convolution candidate forced in turn,
float32 and float16, with and without a residual add fused after it, against PyTorch
(float64) and the unfused graph's numbers (float32: the same bits); reported as Fusion
data and switchable; refused where the multiply's output has another reader, where
neither operand is per channel, and for a transposed convolution; and through vkml.onnx,
an EfficientNet-style block (depthwise Conv -> SiLU -> GlobalAveragePool -> 1x1 Conv ->
SiLU -> 1x1 Conv -> Sigmoid -> Mul -> 1x1 Conv -> Add) against ONNX Runtime."""
from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

import vkml
import vkml.tuning
from vkml import dml
from vkml.ops.convolution.epilogue import EpilogueConvolutionDesc

from helpers import run_graph

conv_ops = importlib.import_module("vkml.ops.convolution")   # the module, not the function

torch = pytest.importorskip("torch")

F = dml.TensorDesc
N = dml.OperatorGraphNodeDesc
IN, OUT, MID = dml.InputGraphEdgeDesc, dml.OutputGraphEdgeDesc, dml.IntermediateGraphEdgeDesc


def _shapes(kind: str):
    """(input, filter, groups, padding): a 1x1 convolution (the in-place GEMMs, which
    multiply by the scale in their kernels), a 3x3 dense one and a depthwise one."""
    if kind == "depthwise":
        return (1, 8, 9, 11), (8, 1, 3, 3), 8, 1
    if kind == "1x1":
        return (2, 24, 7, 8), (16, 24, 1, 1), 1, 0
    if kind == "1x1-7x7":         # planes of no whole float4s (gemm_sg's XSKEW)
        return (2, 16, 7, 7), (24, 16, 1, 1), 1, 0
    return (1, 16, 12, 12), (16, 16, 3, 3), 1, 1


def scale_graph(dtype, kind="1x1", residual=False, scale_first=False, second_reader=False,
                scale_strides=None):
    """x (input 0) * s (input 1, N x C broadcast) -> conv (w, b inputs 2, 3) [-> Add(skip,
    input 4)] -> y.  ``scale_first``: s is the multiply's first operand;
    ``second_reader``: a Sigmoid reads the product too (a second graph output);
    ``scale_strides``: the scale's strides (None: per channel)."""
    xs, ws, groups, pad = _shapes(kind)
    x = F(dtype, xs)
    s = F(dtype, xs, scale_strides or (xs[1], 1, 0, 0))
    w, b = F(dtype, ws), F(dtype, (1, ws[0], 1, 1))
    y = F(dtype, (xs[0], ws[0], xs[2] + 2 * pad - ws[2] + 1, xs[3] + 2 * pad - ws[3] + 1))
    mul = dml.ElementWiseMultiplyOperatorDesc(*((s, x) if scale_first else (x, s)), x)
    conv = dml.ConvolutionOperatorDesc(x, w, b, y, start_padding=(pad, pad),
                                       end_padding=(pad, pad), group_count=groups)
    nodes = [N(mul, name="mul"), N(conv, name="conv")]
    ins = [IN(0, 0, 1 if scale_first else 0), IN(1, 0, 0 if scale_first else 1),
           IN(2, 1, 1), IN(3, 1, 2)]
    mids = [MID(0, 0, 1, 0)]
    outs = [OUT(1, 0, 0)]
    if residual:
        nodes.append(N(dml.ElementWiseAddOperatorDesc(y, y, y), name="add"))
        ins.append(IN(4, 2, 1))
        mids.append(MID(1, 0, 2, 0))
        outs = [OUT(2, 0, 0)]
    if second_reader:
        nodes.append(N(dml.ActivationSigmoidOperatorDesc(x, x), name="other"))
        mids.append(MID(0, 0, len(nodes) - 1, 0))
        outs.append(OUT(len(nodes) - 1, 0, 1))
    return dml.GraphDesc(len(ins), len(outs), nodes, ins, outs, mids)


def inputs(rng, dtype, kind="1x1", residual=False):
    xs, ws, _, pad = _shapes(kind)
    arrays = [(2 * rng.standard_normal(xs)).astype(dtype),
              rng.uniform(0.05, 1.0, (xs[0], xs[1], 1, 1)).astype(dtype),   # a sigmoid's
              (rng.standard_normal(ws) / math.sqrt(math.prod(ws[1:]))).astype(dtype),
              (0.5 * rng.standard_normal((1, ws[0], 1, 1))).astype(dtype)]
    if residual:
        ys = (xs[0], ws[0], xs[2] + 2 * pad - ws[2] + 1, xs[3] + 2 * pad - ws[3] + 1)
        arrays.append(rng.standard_normal(ys).astype(dtype))
    return arrays


def reference(arrays, kind="1x1"):
    """float64: x * s rounded to the data type (as the multiply stores it), then torch's
    convolution (plus the skip)."""
    dt = arrays[0].dtype
    x = torch.from_numpy((arrays[0] * arrays[1]).astype(dt).astype(np.float64))
    w, b = (torch.from_numpy(a.astype(np.float64)) for a in arrays[2:4])
    _, _, groups, pad = _shapes(kind)
    z = torch.nn.functional.conv2d(x, w, b.reshape(-1), padding=pad, groups=groups)
    if len(arrays) > 4:
        z = z + torch.from_numpy(arrays[4].astype(np.float64))
    return z.numpy()


def _tolerance(dtype):
    return dict(rtol=5e-3, atol=5e-2) if dtype == "float16" else dict(rtol=1e-4, atol=3e-4)


def _cases():
    """(candidate, shape kind, residual?): every candidate, on the 1x1 shape for the
    GEMM families (their in-place input, where the kernels take the scale), the
    depthwise shape for depthwise, else 3x3; with a residual add every other case."""
    out = []
    for k, (cand, (path, _)) in enumerate(conv_ops.CANDIDATES.items()):
        kind = ("depthwise" if path == "depthwise" else
                "1x1" if path.startswith("gemm") or k % 3 == 0 else "3x3")
        out.append((cand, kind, k % 2 == 1))
    return out


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fused_on_every_path(device, dtype):
    """Each candidate forced by ``paths=``: one node, an EpilogueConvolutionDesc with the
    scale (and the residual), the fusions reported; the GEMMs on a 1x1 float32
    convolution multiply in their kernels (``takes_scale``, an ``_sc`` pipeline), the
    others run the multiply apart; PyTorch's values; the unfused graph's numbers
    (float32: the same bits, the products rounded as the multiply stores them)."""
    rng = np.random.default_rng(21)
    ran, took = set(), set()
    for cand, kind, residual in _cases():
        path = conv_ops.CANDIDATES[cand][0]
        g = scale_graph(dtype, kind, residual)
        arrays = inputs(rng, dtype, kind, residual)
        what = f"{cand} {kind} residual={residual}"
        try:
            cg, (got,) = run_graph(device, g, arrays, dtype, paths={1: cand})
        except vkml.UnsupportedError:
            continue                      # the device lacks the path's features
        ran.add(cand)
        op = cg._graph_nodes[1].compiled
        assert op.path.name == path, what
        apart = residual and not op.path.RESIDUAL        # (the add stays a node)
        assert [type(d) for d in cg.nodes] == [EpilogueConvolutionDesc] + (
            [dml.ElementWiseAddOperatorDesc] if apart else []), what
        d = cg.nodes[0]
        assert d.input_scale == g.nodes[0].desc.b_tensor, what
        assert d.input_tensor == g.nodes[0].desc.a_tensor, what
        kinds = [(f.kind, f.absorbed, f.into) for f in cg.fusions]
        assert kinds == [("input scale", (0,), (1,))] + (
            [("residual", (2,), (1, 0))] if residual and not apart else []), what
        assert str(cg.fusions[0]) == ("the per-channel scale nodes[0] (DML_OPERATOR_ELEMENT_"
                                      "WISE_MULTIPLY) fused into the input reads of the "
                                      "convolution nodes[1]")
        in_kernel = op.path.takes_scale
        if in_kernel:
            took.add(path)
            assert kind == "1x1" and dtype == "float32", what
            assert all(s.kernel.endswith("_sc") for s in op.path.steps if "gemm" in s.kernel)
        cg.release()
        np.testing.assert_allclose(got.astype(np.float64), reference(arrays, kind),
                                   err_msg=what, **_tolerance(dtype))
        cg, (plain,) = run_graph(device, g, arrays, dtype, fuse={"input scale": False},
                           paths={1: cand})
        assert not any(f.kind == "input scale" for f in cg.fusions)
        cg.release()
        if dtype == "float32":
            np.testing.assert_array_equal(got, plain, err_msg=what)
        else:
            np.testing.assert_allclose(got.astype(np.float64), plain.astype(np.float64),
                                       err_msg=what, rtol=2e-3, atol=4e-3)
    assert {"direct", "gemm"} <= ran, ran
    if dtype == "float32":
        assert "gemm" in took, took


@pytest.mark.parametrize("residual", [False, True])
def test_skewed_planes_scale_in_kernel(device, residual):
    """gemm_sg on 7x7 planes (channel strides of no whole float4s), its rows read as
    float4 texels all the same (XSKEW), multiplies by the scale as it loads them, with and
    without a residual: PyTorch's values and the unfused graph's bits."""
    arrays = inputs(np.random.default_rng(23), "float32", "1x1-7x7", residual)
    g = scale_graph("float32", "1x1-7x7", residual)
    try:
        cg, (got,) = run_graph(device, g, arrays, "float32", paths={1: "gemm_sg"})
    except vkml.UnsupportedError:
        pytest.skip("no gemm_sg on this device")
    op = cg._graph_nodes[1].compiled
    assert op.path.takes_scale and op.path.dispatches[0]["xskew"] == 49 % 4
    cg.release()
    np.testing.assert_allclose(got.astype(np.float64), reference(arrays, "1x1-7x7"),
                               **_tolerance("float32"))
    cg, (plain,) = run_graph(device, g, arrays, "float32", fuse={"input scale": False},
                             paths={1: "gemm_sg"})
    cg.release()
    np.testing.assert_array_equal(got, plain)


def test_chosen_path_and_switch(device):
    """No path forced, a ResNet-like 1x1 scale + conv + residual: one node; ``fuse={"input
    scale": False}`` keeps the multiply a node (the residual still fused); the scale as
    the multiply's first operand fuses the same way; the same bits every way."""
    rng = np.random.default_rng(22)
    arrays = inputs(rng, np.float32, "1x1", True)
    want = reference(arrays)
    g = scale_graph("float32", "1x1", residual=True)
    cg, (got,) = run_graph(device, g, arrays, np.float32)
    assert [f.kind for f in cg.fusions][0] == "input scale"
    assert len(cg.nodes) == 1 if cg._graph_nodes[1].compiled.path.RESIDUAL else 2
    cg.release()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=3e-4)
    cg, (off,) = run_graph(device, g, arrays, np.float32, fuse={"input scale": False})
    assert "input scale" not in [f.kind for f in cg.fusions]
    assert isinstance(cg.nodes[0], dml.ElementWiseMultiplyOperatorDesc)
    cg.release()
    np.testing.assert_array_equal(got, off)
    g = scale_graph("float32", "1x1", residual=True, scale_first=True)
    cg, (first,) = run_graph(device, g, arrays, np.float32)
    assert [f.kind for f in cg.fusions][0] == "input scale"
    cg.release()
    np.testing.assert_array_equal(got, first)


def test_refused(device):
    """Left apart: the product has a second reader; the 'scale' varies along W (not one
    per channel); a transposed convolution."""
    rng = np.random.default_rng(23)
    arrays = inputs(rng, np.float32)
    g = scale_graph("float32", second_reader=True)
    cg, (got, other) = run_graph(device, g, arrays, np.float32)
    assert "input scale" not in [f.kind for f in cg.fusions]
    cg.release()
    np.testing.assert_allclose(got, reference(arrays), rtol=1e-4, atol=3e-4)
    xs = _shapes("1x1")[0]
    g = scale_graph("float32", scale_strides=(xs[1] * xs[3], xs[3], 0, 1))
    arrays[1] = rng.uniform(0.05, 1.0, (xs[0], xs[1], 1, xs[3])).astype(np.float32)
    cg, (got,) = run_graph(device, g, arrays, np.float32)
    assert "input scale" not in [f.kind for f in cg.fusions]
    cg.release()
    x = torch.from_numpy((arrays[0] * arrays[1]).astype(np.float64))
    ref = torch.nn.functional.conv2d(x, torch.from_numpy(arrays[2].astype(np.float64)),
                                     torch.from_numpy(arrays[3].astype(np.float64)).reshape(-1))
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=3e-4)


def test_descriptor_rules():
    """EpilogueConvolutionDesc's input_scale: the input's sizes, stride 0 spatially, a
    forward convolution's."""
    x, w = F("float32", (1, 4, 5, 5)), F("float32", (8, 4, 1, 1))
    y = F("float32", (1, 8, 5, 5))
    ok = EpilogueConvolutionDesc(x, w, None, y, input_scale=F("float32", (1, 4, 5, 5),
                                                              (4, 1, 0, 0)))
    ok.validate()
    assert ok.inputs()[3] is ok.input_scale
    for bad in (F("float32", (1, 4, 5, 5)), F("float32", (1, 4, 1, 1)),
                F("float16", (1, 4, 5, 5), (4, 1, 0, 0))):
        with pytest.raises(vkml.ValidationError, match="input_scale"):
            EpilogueConvolutionDesc(x, w, None, y, input_scale=bad).validate()


def test_onnx_squeeze_excitation_block(device):
    """Through vkml.onnx, an EfficientNet MBConv block with its squeeze-excitation:
    1x1 Conv -> SiLU -> depthwise 3x3 Conv -> SiLU -> GlobalAveragePool -> 1x1 Conv ->
    SiLU -> 1x1 Conv -> Sigmoid -> Mul -> 1x1 Conv -> Add(x): the Mul fused into the
    projecting convolution (and the Add after it), the pool and the SE's 1x1
    convolutions of 1x1 planes one squeeze-excitation node (``VKML_TUNE=off``), those
    convolutions on gemv where the device takes it with that fusion off; ONNX Runtime's
    values, fused or not."""
    from onnx import helper, numpy_helper
    import vkml.onnx as vonnx
    from onnx_helpers import make_model, ort_expected, value_info

    rng = np.random.default_rng(24)
    c, e, r, hw = 16, 64, 4, 14
    shapes = {"We": (e, c, 1, 1), "Wd": (e, 1, 3, 3), "W1": (r, e, 1, 1), "W2": (e, r, 1, 1),
              "Wp": (c, e, 1, 1)}
    inits = [numpy_helper.from_array(
        (rng.standard_normal(s) / math.sqrt(math.prod(s[1:]))).astype(np.float32), n)
        for n, s in shapes.items()]
    inits += [numpy_helper.from_array((0.1 * rng.standard_normal(s[0])).astype(np.float32),
                                      "B" + n[1:]) for n, s in shapes.items()]

    def silu(src, dst):
        return [helper.make_node("Sigmoid", [src], [dst + "_s"], name=dst + "_sig"),
                helper.make_node("Mul", [src, dst + "_s"], [dst], name=dst + "_mul")]
    nodes = [helper.make_node("Conv", ["x", "We", "Be"], ["ce"], name="expand"),
             *silu("ce", "ae"),
             helper.make_node("Conv", ["ae", "Wd", "Bd"], ["cd"], name="dw", group=e,
                              pads=[1, 1, 1, 1]),
             *silu("cd", "ad"),
             helper.make_node("GlobalAveragePool", ["ad"], ["p"], name="pool"),
             helper.make_node("Conv", ["p", "W1", "B1"], ["c1"], name="fc1"),
             *silu("c1", "a1"),
             helper.make_node("Conv", ["a1", "W2", "B2"], ["c2"], name="fc2"),
             helper.make_node("Sigmoid", ["c2"], ["s"], name="gate"),
             helper.make_node("Mul", ["ad", "s"], ["m"], name="scale"),
             helper.make_node("Conv", ["m", "Wp", "Bp"], ["cp"], name="project"),
             helper.make_node("Add", ["cp", "x"], ["y"], name="skip")]
    xs = [1, c, hw, hw]
    model = make_model(nodes, [value_info("x", xs)], [value_info("y", xs)], inits, opset=13)
    feeds = {"x": rng.standard_normal(xs).astype(np.float32)}
    (want,) = ort_expected(model, feeds)
    tol = dict(rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    rep = vonnx.prepare(model, device=device, strict=True)
    (got,) = rep.run(feeds)
    np.testing.assert_allclose(got, want, **tol)
    labels = dict(rep.partitions[0][1])
    assert labels["scale"] == "Mul (fused into Conv)", labels
    assert "input scale" in {f.kind for f in rep.fusions}
    cg = rep._parts[0].last.compiled
    kinds = {f.kind for f in rep.fusions}
    if vkml.tuning.default_tuner().effective_mode() == "off":      # (else the tuner's)
        assert "squeeze excitation" in kinds
    # the two fully connected layers as convolutions of their own: on gemv
    apart = vonnx.prepare(model, device=device, strict=True,
                          fuse={"squeeze excitation": False})
    np.testing.assert_allclose(apart.run(feeds)[0], want, **tol)
    cg = apart._parts[0].last.compiled
    names = {n.desc: n.compiled.path.name for n in cg._graph_nodes.values()
             if isinstance(n.desc, dml.ConvolutionOperatorDesc)}
    fcs = [p for d, p in names.items() if d.input_tensor.sizes[2:] == (1, 1)]
    assert len(fcs) == 2
    if vkml.tuning.default_tuner().effective_mode() == "off":      # (else the tuner's)
        assert all(p == "gemv" for p in fcs) or conv_ops.subgroup_shuffle_size(
            cg._graph_nodes[0].compiled) == 0, fcs
    rep = vonnx.prepare(model, device=device, strict=True, fuse={"input scale": False})
    (off,) = rep.run(feeds)
    assert labels["scale"] != dict(rep.partitions[0][1])["scale"]
    np.testing.assert_array_equal(got, off)


def test_owned_filter_not_finite(device):
    """A fused 3x3 convolution forced onto Winograd with an OWNED filter holding an
    infinity leaves Winograd (as an unfused one does) and still multiplies by the scale:
    the unfused graph's values, infinities and NaNs where they are."""
    rng = np.random.default_rng(25)
    xs, ws, _, pad = _shapes("3x3")
    x, s = F("float32", xs), F("float32", xs, (xs[1], 1, 0, 0))
    w = F("float32", ws, flags=dml.TensorFlags.OWNED_BY_DML)
    y = F("float32", (xs[0], ws[0], xs[2], xs[3]))
    conv = dml.ConvolutionOperatorDesc(x, w, None, y, start_padding=(pad, pad),
                                       end_padding=(pad, pad))
    g = dml.GraphDesc(3, 1, [N(dml.ElementWiseMultiplyOperatorDesc(x, s, x)), N(conv)],
                      [IN(0, 0, 0), IN(1, 0, 1), IN(2, 1, 1)], [OUT(1, 0, 0)],
                      [MID(0, 0, 1, 0)])
    arrays = inputs(rng, np.float32, "3x3")[:3]
    arrays[2][3, 5, 1, 1] = np.inf
    outs = []
    for fuse in (True, False):
        cg = device.compile_graph(g, fuse=fuse, paths={1: "winograd"},
                                  constants={2: device.tensor(arrays[2])})
        assert ("input scale" in [f.kind for f in cg.fusions]) == fuse
        assert cg._graph_nodes[1].compiled.path.name != "winograd"
        out = device.empty(y.sizes)
        cg.execute([device.tensor(arrays[0]), device.tensor(arrays[1]), None], [out])
        outs.append(out.numpy())
        cg.release()
    assert np.isinf(outs[1]).any()
    np.testing.assert_array_equal(outs[0], outs[1])

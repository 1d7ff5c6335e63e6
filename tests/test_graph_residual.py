"""The graph compiler runs a residual Add (and the activation after it) in the output pass
of the convolution that produces one of its inputs (vkml/ops/graph.py, step 1, kind
"residual"; vkml/ops/convolution/epilogue.py): on every convolution candidate forced in
turn, float32 and float16, against PyTorch (a float64 convolution plus the residual) and
the numbers of the unfused graph; the paths without residual kernels leave the pair apart
(with the same values); reported as Fusion data and switchable per kind; refused where
the add broadcasts, where the convolution's output has another reader and where the
convolution applies an activation of its own; and through vkml.onnx, a ResNet-style
block Conv -> Relu -> Conv -> Add(skip) -> Relu against ONNX Runtime."""
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

#: The paths whose output pass adds a residual (``Path.RESIDUAL``).
RESIDUAL_PATHS = {"winograd", "gemm", "gemm_sg", "direct"}


def _shapes(kind: str):
    """(input, filter, groups, padding) of a 3x3 dense 16 -> 16 convolution with 36 output
    tiles (Winograd, the tiled and blocked GEMMs take it), the same over 22x21 (an output
    width of no whole float4s: Winograd's scalar stores), a 1x1 one (the in-place GEMM),
    or a depthwise one over 8 channels."""
    if kind == "depthwise":
        return (1, 8, 9, 11), (8, 1, 3, 3), 8, 1
    if kind == "3x3-odd":
        return (1, 16, 22, 21), (16, 16, 3, 3), 1, 1
    if kind == "1x1":
        return (2, 12, 7, 8), (16, 12, 1, 1), 1, 0
    return (1, 16, 24, 24), (16, 16, 3, 3), 1, 1


def residual_graph(dtype, kind="3x3", act=None, add1=False, skip_first=False,
                   skip_strides=None, second_reader=False, conv_act=None):
    """x -> conv (w, b graph inputs) -> Add(conv, skip) [-> act] -> y, skip graph input 3.
    ``add1``: ELEMENT_WISE_ADD1 with ``act`` as its fused activation (no node);
    ``skip_first``: the skip is the add's first input; ``skip_strides``: the skip's
    strides (a broadcast); ``second_reader``: a Sigmoid reads the convolution's output
    too (a second graph output); ``conv_act``: the convolution's own fused activation."""
    xs, ws, groups, pad = _shapes(kind)
    x, w, b = F(dtype, xs), F(dtype, ws), F(dtype, (1, ws[0], 1, 1))
    y = F(dtype, (xs[0], ws[0], xs[2] + 2 * pad - ws[2] + 1, xs[3] + 2 * pad - ws[3] + 1))
    skip = F(dtype, y.sizes, skip_strides)
    conv = dml.ConvolutionOperatorDesc(
        x, w, b, y, start_padding=(pad, pad), end_padding=(pad, pad), group_count=groups,
        fused_activation=None if conv_act is None else dml.OPERATOR_ACTIVATIONS[conv_act]())
    a, bb = (skip, y) if skip_first else (y, skip)
    if add1:
        add = dml.ElementWiseAdd1OperatorDesc(
            a, bb, y, fused_activation=None if act is None else dml.OPERATOR_ACTIVATIONS[act]())
    else:
        add = dml.ElementWiseAddOperatorDesc(a, bb, y)
    nodes = [N(conv, name="conv"), N(add, name="add")]
    mids = [MID(0, 0, 1, 1 if skip_first else 0)]
    ins = [IN(0, 0, 0), IN(1, 0, 1), IN(2, 0, 2), IN(3, 1, 0 if skip_first else 1)]
    outs = [OUT(1, 0, 0)]
    if act is not None and not add1:
        nodes.append(N(dml.OPERATOR_ACTIVATIONS[act](y, y), name="act"))
        mids.append(MID(1, 0, 2, 0))
        outs = [OUT(2, 0, 0)]
    if second_reader:
        nodes.append(N(dml.ActivationSigmoidOperatorDesc(y, y), name="other"))
        mids.append(MID(0, 0, len(nodes) - 1, 0))
        outs.append(OUT(len(nodes) - 1, 0, 1))
    return dml.GraphDesc(4, len(outs), nodes, ins, outs, mids)


def inputs(rng, dtype, kind="3x3", skip_shape=None):
    xs, ws, _, _ = _shapes(kind)
    fan_in = math.prod(ws[1:])
    g = residual_graph("float32", kind)
    return [(2 * rng.standard_normal(xs)).astype(dtype),        # outputs of a few units
            (rng.standard_normal(ws) / math.sqrt(fan_in)).astype(dtype),
            (0.5 * rng.standard_normal((1, ws[0], 1, 1))).astype(dtype),
            rng.standard_normal(skip_shape or g.nodes[0].desc.output_tensor.sizes).astype(dtype)]


def reference(arrays, kind="3x3", act=None):
    """float64: torch's convolution plus the skip, then torch's activation."""
    x, w, b, s = (torch.from_numpy(a.astype(np.float64)) for a in arrays)
    _, _, groups, pad = _shapes(kind)
    z = torch.nn.functional.conv2d(x, w, b.reshape(-1), padding=pad, groups=groups) + s
    if act == "relu":
        z = torch.relu(z)
    elif act == "swish":
        z = torch.nn.functional.silu(z)
    elif act is not None:
        raise AssertionError(act)
    return z.numpy()


def _tolerance(dtype):
    """float32: the convolution's accumulation (Winograd's transforms the widest);
    float16: the output's rounding and tiled-f16's float16 partial sums."""
    return dict(rtol=5e-3, atol=5e-2) if dtype == "float16" else dict(rtol=1e-4, atol=3e-4)


def _cases(dtype):
    """(candidate, shape kind, activation, ADD1?) a test of ``dtype`` forces: every path's
    own candidate in both data types, the knob variants in one data type each in turn;
    activations (none, a Relu node, ADD1's fused Relu, a Swish node) and the shapes (3x3,
    and 1x1 for the GEMMs: their in-place input) in turn over them."""
    acts = [(None, False), ("relu", False), ("relu", True), ("swish", False)]
    out = []
    for k, (cand, (path, knobs)) in enumerate(conv_ops.CANDIDATES.items()):
        u64 = knobs.get("store64") or knobs.get("dw_v8")
        turn = ("float16" if knobs.get("f16_arith") else "float32" if u64
                else ["float32", "float16"][k % 2])
        if cand == path or turn == dtype:
            kind = ("depthwise" if path == "depthwise" else
                    "1x1" if path.startswith("gemm") and len(out) % 2 else "3x3")
            out.append((cand, kind, *acts[len(out) % len(acts)]))
    return out


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fused_on_every_path(device, dtype):
    """Each candidate the device runs, forced by ``paths=`` (:func:`_cases`): on a path
    with residual kernels one node, an EpilogueConvolutionDesc with the residual, on that
    path, the fusions reported; on the others the pair apart; PyTorch's values; for each
    path's own candidate, the unfused graph's numbers (float32: the same sums; float16:
    one rounding fewer)."""
    rng = np.random.default_rng(15)
    ran = set()
    for cand, kind, act, add1 in _cases(dtype):
        path = conv_ops.CANDIDATES[cand][0]
        g = residual_graph(dtype, kind, act, add1=add1)
        arrays = inputs(rng, dtype, kind)
        try:
            cg, (got,) = run_graph(device, g, arrays, dtype, paths={0: cand})
        except vkml.UnsupportedError:
            continue                      # the device lacks the path's features
        ran.add(cand)
        what = f"{cand} {kind} {act} add1={add1}"
        assert cg._graph_nodes[0].compiled.path.name == path, what
        if path in RESIDUAL_PATHS:
            assert [type(d) for d in cg.nodes] == [EpilogueConvolutionDesc], what
            (d,) = cg.nodes
            assert d.residual == g.nodes[1].desc.b_tensor
            kinds = [(f.kind, f.absorbed, f.into) for f in cg.fusions]
            want = [("residual", (1,), (0,))] + (
                [("activation", (2,), (0,))] if act is not None and not add1 else [])
            assert kinds == want, what
            op = g.nodes[1].desc.OPERATOR_TYPE
            assert str(cg.fusions[0]) == (f"the residual add nodes[1] ({op}) fused into the "
                                          "convolution nodes[0]")
            assert cg.arena_bytes == 0
        else:
            assert not any(f.kind == "residual" for f in cg.fusions), what
            assert len(cg.nodes) >= 2
        cg.release()
        np.testing.assert_allclose(got.astype(np.float64), reference(arrays, kind, act),
                                   err_msg=what, **_tolerance(dtype))
        if cand != path:
            continue
        cg, (plain,) = run_graph(device, g, arrays, dtype, fuse=False, paths={0: cand})
        assert not cg.fusions and len(cg.nodes) == len(g.nodes)
        cg.release()
        same = dict(rtol=1e-6, atol=1e-6) if dtype == "float32" else dict(rtol=2e-3, atol=4e-3)
        np.testing.assert_allclose(got.astype(np.float64), plain.astype(np.float64),
                                   err_msg=what, **same)
    assert {"direct", "gemm", "winograd"} <= ran, ran


#: 1x1 convolutions whose outputs the implicit GEMMs store eight a u64vec4 (knob
#: store64): (input, output channels).  16x16 and 28x28 planes, and a 12x12 plane whose
#: 144 floats end in a u64vec2 of four.
U64_RESIDUAL = [((1, 16, 16, 16), 8), ((1, 24, 12, 12), 8), ((1, 8, 28, 28), 16)]


@pytest.mark.parametrize("case", range(len(U64_RESIDUAL)))
@pytest.mark.parametrize("path", ["gemm_sg", "gemm"])
def test_residual_read_eight_at_a_time(device, path, case):
    """Where the output pass stores eight floats as one u64vec4 (``-v8``) it reads their
    residual as one too: PyTorch's values, and the same bits as the float4 stores'
    output pass (the path's own candidate)."""
    xs, cout = U64_RESIDUAL[case]
    rng = np.random.default_rng(70 + case)
    x = F("float32", xs)
    y = F("float32", (xs[0], cout) + xs[2:])
    conv = dml.ConvolutionOperatorDesc(x, F("float32", (cout, xs[1], 1, 1)),
                                       F("float32", (1, cout, 1, 1)), y)
    g = dml.GraphDesc(4, 1, [N(conv, name="conv"), N(dml.ElementWiseAddOperatorDesc(y, y, y),
                                                     name="add")],
                      [IN(0, 0, 0), IN(1, 0, 1), IN(2, 0, 2), IN(3, 1, 1)], [OUT(1, 0, 0)],
                      [MID(0, 0, 1, 0)])
    arrays = [rng.standard_normal(xs).astype(np.float32),
              (rng.standard_normal((cout, xs[1], 1, 1)) / math.sqrt(xs[1])).astype(np.float32),
              rng.standard_normal((1, cout, 1, 1)).astype(np.float32),
              rng.standard_normal(y.sizes).astype(np.float32)]
    try:
        cg, got = run_graph(device, g, arrays, np.float32, paths={0: path + "-v8"})
    except vkml.UnsupportedError:
        assert not device.features.get("int64")
        pytest.skip("no int64 shaders: no u64vec4 stores")
    kernels = [st.kernel for st in cg._graph_nodes[0].compiled.path.steps]
    assert [f.kind for f in cg.fusions] == ["residual"] and kernels[-1].endswith("_v8_res")
    cg.release()
    cg, want = run_graph(device, g, arrays, np.float32, paths={0: path})
    cg.release()
    np.testing.assert_array_equal(got[0].view(np.uint32), want[0].view(np.uint32))
    ref = reference([a.astype(np.float64) for a in arrays], "1x1")
    np.testing.assert_allclose(got[0], ref, rtol=1e-4, atol=3e-4)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_winograd_one_output_kernel_with_and_without_residual(device, dtype):
    """Winograd's output pass adds the residual by a run-time switch: the fused graph and
    the plain one (the convolution apart, no residual) run the same kernel variant, each
    with PyTorch's values, over float4 rows (and u64vec4 pairs where wide stores are
    offered) and over rows of no whole float4s (scalar stores)."""
    rng = np.random.default_rng(16)
    for kind in ("3x3", "3x3-odd"):
        for cand in ("winograd", "winograd-v8"):
            g = residual_graph(dtype, kind, "relu", add1=True)
            arrays = inputs(rng, dtype, kind)
            try:
                fused, (got,) = run_graph(device, g, arrays, dtype, paths={0: cand})
            except vkml.UnsupportedError:
                continue                  # (winograd-v8: no int64 shaders)
            what = f"{cand} {kind} {dtype}"
            assert [type(d) for d in fused.nodes] == [EpilogueConvolutionDesc], what
            np.testing.assert_allclose(got.astype(np.float64), reference(arrays, kind, "relu"),
                                       err_msg=what, **_tolerance(dtype))
            plain, (apart,) = run_graph(device, g, arrays, dtype, fuse=False, paths={0: cand})
            np.testing.assert_allclose(apart.astype(np.float64),
                                       reference(arrays, kind, "relu"),
                                       err_msg=what, **_tolerance(dtype))
            kernels = [c.path.out_kernel for c in (fused._graph_nodes[0].compiled,
                                                   plain._graph_nodes[0].compiled)]
            assert kernels[0] == kernels[1] and not kernels[0].endswith("_res"), what
            assert (kind == "3x3-odd") != ("_v" in kernels[0]), what
            fused.release()
            plain.release()


@pytest.mark.parametrize("skip_first", [False, True])
def test_chosen_path_and_switch(device, skip_first):
    """No path forced: fused where the path the convolution takes has residual kernels;
    ``fuse={"residual": False}`` keeps the add apart (other kinds on: the Relu after the
    add stays a node, the add reads no convolution), ``fuse={"activation": False}`` fuses
    the add but not the Relu; the same values every way."""
    rng = np.random.default_rng(16)
    g = residual_graph("float32", "3x3", "relu", skip_first=skip_first)
    arrays = inputs(rng, np.float32)
    want = reference(arrays, "3x3", "relu")
    cg, (got,) = run_graph(device, g, arrays, np.float32)
    fused = cg._graph_nodes[0].compiled.path.RESIDUAL
    assert [f.kind for f in cg.fusions] == (["residual", "activation"] if fused else [])
    cg.release()
    np.testing.assert_allclose(got, want, **_tolerance("float32"))
    cg, (off,) = run_graph(device, g, arrays, np.float32, fuse={"residual": False})
    assert not cg.fusions and len(cg.nodes) == 3
    cg.release()
    np.testing.assert_allclose(off, got, rtol=1e-6, atol=1e-6)
    cg, (noact,) = run_graph(device, g, arrays, np.float32, fuse={"activation": False})
    if fused:
        assert [f.kind for f in cg.fusions] == ["residual"] and len(cg.nodes) == 2
        assert cg.nodes[0].fused_activation is None
    cg.release()
    np.testing.assert_allclose(noact, got, rtol=1e-6, atol=1e-6)


def test_fuse_argument_checked(device):
    g = residual_graph("float32")
    with pytest.raises(vkml.ValidationError, match="fusion kinds"):
        device.compile_graph(g, fuse={"resid": False})
    with pytest.raises(vkml.ValidationError) as info:
        device.compile_graph(g, fuse={"residual": 0})
    assert info.value.field == "fuse['residual']"
    with pytest.raises(vkml.ValidationError):
        device.compile_graph(g, fuse="residual")


@pytest.mark.parametrize("case", ["broadcast", "second_reader", "conv_act"])
def test_refused(device, case):
    """Not fused (the values still the references'): the skip broadcast along channels
    (strides 0), the convolution's output read by a Sigmoid too, the convolution with a
    fused Relu of its own (relu(conv) + skip is not relu(conv + skip))."""
    rng = np.random.default_rng(17)
    kw = {"broadcast": dict(skip_strides=(16 * 24 * 24, 0, 24, 1)),
          "second_reader": dict(second_reader=True),
          "conv_act": dict(conv_act="relu")}[case]
    g = residual_graph("float32", "3x3", **kw)
    shape = (1, 1, 24, 24) if case == "broadcast" else None
    arrays = inputs(rng, np.float32, skip_shape=shape)
    cg, outs = run_graph(device, g, arrays, np.float32, paths={0: "gemm"})
    assert not any(f.kind == "residual" for f in cg.fusions), cg.fusions
    assert not any(isinstance(d, EpilogueConvolutionDesc) for d in cg.nodes)
    cg.release()
    x, w, b, s = (torch.from_numpy(a.astype(np.float64)) for a in arrays)
    c = torch.nn.functional.conv2d(x, w, b.reshape(-1), padding=1)
    want = (torch.relu(c) if case == "conv_act" else c) + s
    np.testing.assert_allclose(outs[0], want.numpy(), **_tolerance("float32"))
    if case == "second_reader":
        np.testing.assert_allclose(outs[1], torch.sigmoid(c).numpy(), rtol=1e-4, atol=1e-4)


def test_residual_written_after_the_convolution(device):
    """ResNet's downsampling block: Add(conv3x3(x), conv1x1(x)) with the 1x1 declared
    after the add's other producer: the fused node runs where the add ran, after the
    residual's producer; torch's values."""
    rng = np.random.default_rng(18)
    x, y = F("float32", (1, 16, 24, 24)), F("float32", (1, 16, 24, 24))
    w3, w1, b = F("float32", (16, 16, 3, 3)), F("float32", (16, 16, 1, 1)), \
        F("float32", (1, 16, 1, 1))
    c3 = dml.ConvolutionOperatorDesc(x, w3, b, y, start_padding=(1, 1), end_padding=(1, 1))
    c1 = dml.ConvolutionOperatorDesc(x, w1, None, y)
    nodes = [N(c3, name="c3"), N(c1, name="c1"), N(dml.ElementWiseAddOperatorDesc(y, y, y)),
             N(dml.ActivationReluOperatorDesc(y, y))]
    g = dml.GraphDesc(4, 1, nodes, [IN(0, 0, 0), IN(1, 0, 1), IN(2, 0, 2), IN(0, 1, 0),
                                    IN(3, 1, 1)],
                      [OUT(3, 0, 0)], [MID(0, 0, 2, 0), MID(1, 0, 2, 1), MID(2, 0, 3, 0)])
    arrays = [rng.standard_normal((1, 16, 24, 24)).astype(np.float32),
              (rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32),
              rng.standard_normal((1, 16, 1, 1)).astype(np.float32),
              (rng.standard_normal((16, 16, 1, 1)) / 4).astype(np.float32)]
    cg, (got,) = run_graph(device, g, arrays, np.float32, paths={0: "gemm", 1: "gemm"})
    assert [(f.kind, f.into) for f in cg.fusions] == [("residual", (0,)), ("activation", (0,))]
    assert cg.order == [1, 0]
    cg.release()
    xt, a, bt, c = (torch.from_numpy(v.astype(np.float64)) for v in arrays)
    want = torch.relu(torch.nn.functional.conv2d(xt, a, bt.reshape(-1), padding=1)
                      + torch.nn.functional.conv2d(xt, c))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=3e-4)


def test_descriptor_rules(device):
    """The private descriptor: the residual of the output's type, sizes and strides; an
    epilogue or a residual given."""
    x, w, y = F("float32", (1, 16, 24, 24)), F("float32", (16, 16, 3, 3)), \
        F("float32", (1, 16, 22, 22))
    device.create_operator(EpilogueConvolutionDesc(x, w, None, y, residual=y))
    for bad, field in ((F("float16", y.sizes), "residual.data_type"),
                       (F("float32", (1, 16, 22, 21)), "residual"),
                       (F("float32", y.sizes, (16 * 22 * 22, 0, 22, 1)), "residual")):
        with pytest.raises(vkml.ValidationError) as info:
            device.create_operator(EpilogueConvolutionDesc(x, w, None, y, residual=bad))
        assert info.value.field.endswith(field), info.value
    with pytest.raises(vkml.ValidationError, match="epilogue"):
        device.create_operator(EpilogueConvolutionDesc(x, w, None, y))


# -- through vkml.onnx ---------------------------------------------------------------------
def test_onnx_resnet_block(device):
    """A ResNet basic block, Conv -> Relu -> Conv -> Add(x) -> Relu: the first Relu fused
    into its Conv, the Add and the last Relu into the second Conv (where its path has
    residual kernels); ``fuse={"residual": False}`` at prepare keeps them apart; ONNX
    Runtime's values both ways."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import helper, numpy_helper
    import vkml.onnx as vonnx
    from onnx_helpers import make_model, ort_expected, value_info

    rng = np.random.default_rng(19)
    xs, ws = [1, 16, 12, 12], [16, 16, 3, 3]
    inits = [numpy_helper.from_array((rng.standard_normal(ws) / 12).astype(np.float32), n)
             for n in ("W1", "W2")]
    inits += [numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), n)
              for n in ("B1", "B2")]
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], name="conv1",
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], name="conv2",
                              pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "x"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu2")]
    model = make_model(nodes, [value_info("x", xs)], [value_info("y", xs)], inits, opset=13)
    feeds = {"x": rng.standard_normal(xs).astype(np.float32)}
    (want,) = ort_expected(model, feeds)
    rep = vonnx.prepare(model, device=device, strict=True)
    (got,) = rep.run(feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    ((where, labels),) = rep.partitions
    assert where == "device"
    assert labels[:3] == [("conv1", "Conv"), ("relu1", "Relu (fused into Conv)"),
                          ("conv2", "Conv")]
    cg = rep._parts[0].last.compiled
    convs = [n.compiled.path for n in cg._graph_nodes.values()
             if isinstance(n.desc, dml.ConvolutionOperatorDesc)]
    assert labels[3:] == ([("add", "Add (fused into Conv)"), ("relu2", "Relu (fused into Conv)")]
                          if all(p.RESIDUAL for p in convs) else
                          [("add", "Add"), ("relu2", "Relu")]), [p.name for p in convs]
    assert [f.kind for f in rep.fusions] == [f.kind for f in cg.fusions]
    assert ("residual" in {f.kind for f in rep.fusions}) == all(p.RESIDUAL for p in convs)
    rep = vonnx.prepare(model, device=device, strict=True, fuse={"residual": False})
    (off,) = rep.run(feeds)
    assert rep.partitions[0][1][3:] == [("add", "Add"), ("relu2", "Relu")]
    assert "residual" not in {f.kind for f in rep.fusions}
    np.testing.assert_allclose(off, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("path", ["gemm", "direct"])
def test_transposed_convolution(device, path):
    """A transposed convolution (stride 2, one GEMM dispatch per output phase) -> Add(skip)
    -> Relu: fused on the paths that run it; torch's conv_transpose2d plus the skip."""
    rng = np.random.default_rng(20)
    x, w, b, y = F("float32", (1, 6, 5, 6)), F("float32", (6, 8, 3, 3)), \
        F("float32", (1, 8, 1, 1)), F("float32", (1, 8, 11, 13))
    conv = dml.ConvolutionOperatorDesc(x, w, b, y, direction="backward", strides=(2, 2))
    g = dml.GraphDesc(4, 1, [N(conv), N(dml.ElementWiseAddOperatorDesc(y, y, y)),
                             N(dml.ActivationReluOperatorDesc(y, y))],
                      [IN(0, 0, 0), IN(1, 0, 1), IN(2, 0, 2), IN(3, 1, 0)], [OUT(2, 0, 0)],
                      [MID(0, 0, 1, 1), MID(1, 0, 2, 0)])
    arrays = [rng.standard_normal(s).astype(np.float32)
              for s in ((1, 6, 5, 6), (6, 8, 3, 3), (1, 8, 1, 1), (1, 8, 11, 13))]
    cg, (got,) = run_graph(device, g, arrays, np.float32, paths={0: path})
    assert [f.kind for f in cg.fusions] == ["residual", "activation"]
    assert cg._graph_nodes[0].compiled.path.name == path
    cg.release()
    xt, wt, bt, s = (torch.from_numpy(a.astype(np.float64)) for a in arrays)
    c = torch.nn.functional.conv_transpose2d(xt, wt, bt.reshape(-1), stride=2)
    np.testing.assert_allclose(got, torch.relu(c + s).numpy(), rtol=1e-4, atol=1e-4)

"""A global average pool in the output pass of the convolution before it (vkml/ops/graph.py,
step 1, kind "global pool"; vkml/ops/convolution/epilogue.py, "Global average pool"):
gemm_sg stores the pool's means instead of the output where a subgroup's lanes hold every
pixel block of an image.  Checked against PyTorch (a float64 convolution, the activation,
the mean) and the unfused graph, for ONNX's two forms of the pool (AVERAGE_POOLING over
the plane, REDUCE AVERAGE over the spatial axes), 1x1 and 3x3 convolutions, batches,
groups and channel counts off the register block; reported as Fusion data and switchable;
left apart (with the same values) where the pool is not global, where another node reads
the convolution's output, in float16, on a path without the epilogue and where the plane
is wider than a subgroup holds; the fused descriptor's rule named in its error; and
through vkml.onnx, Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm against ONNX
Runtime."""
from __future__ import annotations

import numpy as np
import pytest

from vkml import dml
from vkml.errors import UnsupportedError, ValidationError
from vkml.ops.convolution import PooledConvolutionDesc
from vkml.ops.convolution.gemm import subgroup_shuffle_size

torch = pytest.importorskip("torch")

F = dml.TensorDesc
N = dml.OperatorGraphNodeDesc
IN, OUT, MID = dml.InputGraphEdgeDesc, dml.OutputGraphEdgeDesc, dml.IntermediateGraphEdgeDesc


def gap_graph(x_shape, cout, k=1, groups=1, form="pooling", dtype="float32",
              second_reader=False, window=None):
    """x, w, b -> convolution (stride 1, 'same' padding, fused ReLU) -> global average pool
    (``form``: "pooling" or "reduce"; ``window``: a smaller pooling window instead) ->
    the pooled output 0; ``second_reader``: a Sigmoid of the convolution's output as
    output 1."""
    n, c, h, w_ = x_shape
    pad = k // 2
    x, w = F(dtype, x_shape), F(dtype, (cout, c // groups, k, k))
    b, y = F(dtype, (1, cout, 1, 1)), F(dtype, (n, cout, h, w_))
    conv = dml.ConvolutionOperatorDesc(x, w, b, y, start_padding=(pad, pad),
                                       end_padding=(pad, pad), group_count=groups,
                                       fused_activation="relu")
    if form == "reduce":
        pooled = F(dtype, (n, cout, 1, 1))
        pool = dml.ReduceOperatorDesc(function=dml.ReduceFunction.AVERAGE, input_tensor=y,
                                      output_tensor=pooled, axes=(2, 3))
    else:
        win = window or (h, w_)
        pooled = F(dtype, (n, cout, h // win[0], w_ // win[1]))
        pool = dml.AveragePooling1OperatorDesc(y, pooled, strides=win, window_size=win,
                                               start_padding=(0, 0), end_padding=(0, 0),
                                               dilations=(1, 1), include_padding=False)
    nodes, outs = [N(conv, name="conv"), N(pool, name="pool")], [OUT(1, 0, 0)]
    mids = [MID(0, 0, 1, 0)]
    if second_reader:
        nodes.append(N(dml.ActivationSigmoidOperatorDesc(y, y), name="other"))
        mids.append(MID(0, 0, 2, 0))
        outs.append(OUT(2, 0, 1))
    g = dml.GraphDesc(3, len(outs), nodes, [IN(0, 0, 0), IN(1, 0, 1), IN(2, 0, 2)], outs,
                      mids)
    return g, [pooled.sizes] + ([y.sizes] if second_reader else [])


def inputs(rng, x_shape, cout, k=1, groups=1, dtype="float32"):
    c = x_shape[1]
    return [rng.standard_normal(x_shape).astype(dtype),
            (rng.standard_normal((cout, c // groups, k, k)) / np.sqrt(c * k * k)).astype(dtype),
            (rng.standard_normal((1, cout, 1, 1)) * 0.3).astype(dtype)]


def reference(arrays, k, groups) -> np.ndarray:
    x, w, b = (torch.from_numpy(a.astype(np.float64)) for a in arrays)
    y = torch.relu(torch.nn.functional.conv2d(x, w, b.reshape(-1), padding=k // 2,
                                              groups=groups))
    return y.mean(dim=(2, 3), keepdim=True).numpy()


def run(device, g, arrays, shapes, dtype="float32", **kw):
    try:
        cg = device.compile_graph(g, **kw)
    except UnsupportedError as e:
        pytest.skip(str(e))
    outs = [device.empty(s, dtype) for s in shapes]
    cg.execute([device.tensor(a) for a in arrays], outs)
    return cg, [o.numpy() for o in outs]


def fused(cg) -> bool:
    return any(f.kind == "global pool" for f in cg.fusions)


#: (input, output channels, kernel, groups): a 1x1 over 7x7 (a CNN's last layer), a 3x3,
#: two images with 20 channels (off the register block), two groups, a 4x4 plane (two
#: blocks: within SwiftShader's 4 lanes too).
CASES = [((1, 32, 7, 7), 48, 1, 1), ((1, 16, 7, 7), 24, 3, 1), ((2, 24, 7, 7), 20, 1, 1),
         ((1, 16, 7, 7), 32, 1, 2), ((2, 8, 4, 4), 16, 1, 1)]


@pytest.mark.parametrize("form", ["pooling", "reduce"])
@pytest.mark.parametrize("case", CASES, ids=["1x1", "3x3", "batch-20ch", "groups", "4x4"])
def test_global_pool_in_the_output_pass(device, case, form):
    x_shape, cout, k, groups = case
    rng = np.random.default_rng(11)
    arrays = inputs(rng, x_shape, cout, k, groups)
    g, shapes = gap_graph(x_shape, cout, k, groups, form)
    cg, (got,) = run(device, g, arrays, shapes, paths={0: "gemm_sg"})
    sg = cg._graph_nodes[0].compiled.path.sg
    path = cg._graph_nodes[0].compiled.path
    blocks = max(d["qsize"][0] * d["qsize"][1] * d["qsize"][3] for d in path.dispatches)
    assert fused(cg) == (blocks <= sg), (blocks, sg, cg.fusions)
    if fused(cg):
        assert [type(d).__name__ for d in cg.nodes] == ["PooledConvolutionDesc"]
        f = [f for f in cg.fusions if f.kind == "global pool"][0]
        assert (f.absorbed, f.into) == ((1,), (0,))
        assert str(f).startswith("nodes[1] (DML_OPERATOR_") and cg.arena_bytes == 0
    if x_shape[2] == 4:
        assert fused(cg)                 # two blocks: every device's subgroup holds them
    cg.release()
    cg, (apart,) = run(device, g, arrays, shapes, fuse={"global pool": False},
                       paths={0: "gemm_sg"})
    assert not fused(cg) and len(cg.nodes) == 2
    cg.release()
    want = reference(arrays, k, groups)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, apart, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("what", ["window", "second-reader", "float16", "gemm", "winograd"])
def test_left_apart_with_the_same_values(device, what):
    x_shape, cout, k, groups = (1, 16, 8, 8), 16, 3, 1
    dtype = "float16" if what == "float16" else "float32"
    rng = np.random.default_rng(2)
    arrays = inputs(rng, x_shape, cout, k, groups, dtype)
    g, shapes = gap_graph(x_shape, cout, k, groups, dtype=dtype,
                          second_reader=what == "second-reader",
                          window=(4, 4) if what == "window" else None)
    path = what if what in ("gemm", "winograd") else "gemm_sg"
    cg, outs = run(device, g, arrays, shapes, dtype, paths={0: path})
    assert not fused(cg) and len(cg.nodes) == len(g.nodes), cg.fusions
    cg.release()
    if what == "window":
        return
    tol = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(outs[0].astype(np.float64), reference(arrays, k, groups),
                               rtol=tol, atol=tol)


def test_fused_descriptor_names_its_rule():
    y = F("float32", (1, 8, 7, 7))
    x, w = F("float32", (1, 4, 7, 7)), F("float32", (8, 4, 1, 1))
    conv = dml.ConvolutionOperatorDesc(x, w, None, y)
    other = F("float32", (1, 8, 7, 7), (8 * 49, 1, 56, 8))      # another layout
    pool = dml.ReduceOperatorDesc(function=dml.ReduceFunction.AVERAGE, input_tensor=other,
                                  output_tensor=F("float32", (1, 8, 1, 1)), axes=(2, 3))
    with pytest.raises(ValidationError, match="pooling.*as it is written"):
        PooledConvolutionDesc(conv, pool).validate()
    pool = dml.ReduceOperatorDesc(function=dml.ReduceFunction.MAX, input_tensor=y,
                                  output_tensor=F("float32", (1, 8, 1, 1)), axes=(2, 3))
    with pytest.raises(ValidationError, match="pooling.*not a global average pool"):
        PooledConvolutionDesc(conv, pool).validate()


def test_onnx_classifier_head(device):
    """Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm: the pool runs in the Conv's
    output pass (reported in ``rep.fusions``), against ONNX Runtime; with the kind off the
    pool runs apart."""
    pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    import vkml.onnx as vonnx
    from onnx_helpers import make_model, ort_expected, value_info

    rng = np.random.default_rng(4)
    init = [numpy_helper.from_array(a, n) for a, n in (
        ((rng.standard_normal((64, 32, 1, 1)) / 6).astype(np.float32), "w"),
        (rng.standard_normal(64).astype(np.float32), "b"),
        ((rng.standard_normal((10, 64)) / 8).astype(np.float32), "fc"),
        (rng.standard_normal(10).astype(np.float32), "fb"))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], transB=1)]
    model = make_model(nodes, [value_info("x", (1, 32, 7, 7))], [value_info("y", (1, 10))],
                       init)
    x = rng.standard_normal((1, 32, 7, 7)).astype(np.float32)
    want = ort_expected(model, {"x": x})[0]
    for fuse, kinds in ((True, {"global pool"}), ({"global pool": False}, set())):
        rep = vonnx.prepare(model.SerializeToString(), device=device, fuse=fuse)
        got = rep.run([x])[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        if subgroup_shuffle_size(device) >= 8 or not kinds:     # (7 blocks of 8 pixels)
            assert {f.kind for f in rep.fusions} & {"global pool"} == kinds, rep.fusions
        rep.release()

"""Graph inputs the host writes (vkml/ops/graph.py, "Inputs the host writes"; kind "host
input"): a graph input that only a convolution reads, which the implicit GEMM copies into
zero-padded planes, is written by the caller through ``CompiledGraph.host_inputs``' view
and the recording made with ``laid`` leaves the copy out.  Checked against PyTorch's
float64 convolution on both GEMM paths, with the planes' memory filled with NaN before
(their borders zeroed once), over several inputs through one recording (none stale), the
same bits as the plain execution; not offered where the copy is more than a move (a second
reader, an input read in place, float16, strides, a path that reads the input otherwise,
memory the host cannot map, the kind switched off); and through vkml.onnx, a model's image
before its first convolution against ONNX Runtime."""
from __future__ import annotations

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.errors import UnsupportedError, ValidationError

torch = pytest.importorskip("torch")

F = dml.TensorDesc
N = dml.OperatorGraphNodeDesc
IN, OUT, MID = dml.InputGraphEdgeDesc, dml.OutputGraphEdgeDesc, dml.IntermediateGraphEdgeDesc

#: (input, output channels, kernel, stride, padding): a first layer (3 channels, 3x3
#: stride 2), a ResNet-style 7x7 stride 2 pad 3 one, a 3x3 stride 1 one over rows of no
#: whole float4s.
CASES = [((1, 3, 32, 32), 8, 3, 2, 1), ((1, 3, 30, 30), 8, 7, 2, 3),
         ((2, 5, 9, 11), 8, 3, 1, 1)]


def conv_graph(shape, cout, k, stride, pad, dtype="float32", x_strides=None,
               second_reader=False):
    """x (input 0), w (1), b (2) -> convolution with a fused ReLU -> y (output 0);
    ``second_reader``: a Sigmoid of x as output 1."""
    x = F(dtype, shape, x_strides)
    w, b = F(dtype, (cout, shape[1], k, k)), F(dtype, (1, cout, 1, 1))
    out = [(s + 2 * pad - k) // stride + 1 for s in shape[2:]]
    y = F(dtype, (shape[0], cout, *out))
    conv = dml.ConvolutionOperatorDesc(x, w, b, y, strides=(stride, stride),
                                       start_padding=(pad, pad), end_padding=(pad, pad),
                                       fused_activation="relu")
    nodes, outs = [N(conv, name="conv")], [OUT(0, 0, 0)]
    if second_reader:
        nodes.append(N(dml.ActivationSigmoidOperatorDesc(F(dtype, shape), F(dtype, shape)),
                       name="other"))
        outs.append(OUT(1, 0, 1))
    ins = [IN(0, 0, 0), IN(1, 0, 1), IN(2, 0, 2)] + ([IN(0, 1, 0)] if second_reader else [])
    return dml.GraphDesc(3, len(outs), nodes, ins, outs, []), y.sizes


def reference(x, w, b, stride, pad) -> np.ndarray:
    t = torch.nn.functional.conv2d(torch.from_numpy(x.astype(np.float64)),
                                   torch.from_numpy(w.astype(np.float64)),
                                   torch.from_numpy(b.reshape(-1).astype(np.float64)),
                                   stride=stride, padding=pad)
    return np.maximum(t.numpy(), 0.0)


def compiled(device, g, path, **kw):
    try:
        return device.compile_graph(g, paths={0: path}, **kw)
    except UnsupportedError as e:
        pytest.skip(f"{path} does not run here: {e}")


@pytest.mark.parametrize("path", ["gemm_sg", "gemm"])
@pytest.mark.parametrize("case", CASES, ids=["first-layer", "7x7-pad3", "3x3-odd-rows"])
def test_written_planes_match_the_reference(device, path, case):
    shape, cout, k, stride, pad = case
    g, ys = conv_graph(shape, cout, k, stride, pad)
    cg = compiled(device, g, path)
    rng = np.random.default_rng(7)
    w = rng.standard_normal((cout, shape[1], k, k)).astype(np.float32)
    b = rng.standard_normal((1, cout, 1, 1)).astype(np.float32)
    xp = cg._graph_nodes[0].compiled.path.xp
    xp.host[:] = 0xFF                       # NaN everywhere: the borders must be zeroed
    views = cg.host_inputs()
    assert list(views) == [0] and views[0].shape == shape
    # the bound input is NaN: a recording that copied it would show
    unused = device.tensor(np.full(shape, np.nan, np.float32))
    wt, bt = device.tensor(w), device.tensor(b)
    y, y_plain = device.empty(ys, np.float32), device.empty(ys, np.float32)
    seq = device.sequence()
    cg.record(seq, [unused, wt, bt], [y], laid={0})
    for _ in range(3):                      # one recording, a new input each run
        x = rng.standard_normal(shape).astype(np.float32)
        views[0][...] = x
        seq.run()
        got = y.numpy()
        want = reference(x, w, b, stride, pad)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        cg.execute([device.tensor(x), wt, bt], [y_plain])
        np.testing.assert_array_equal(got, y_plain.numpy())
    seq.close()
    profile = cg.profile([unused, wt, bt], [y], repeat=1, laid={0})
    assert [e.index for e in profile.entries] == [0]
    np.testing.assert_array_equal(y.numpy(), y_plain.numpy())
    cg.release()


def _offered(device, g, path="gemm_sg", **kw) -> dict:
    cg = compiled(device, g, path, **kw)
    try:
        return {k: v.shape for k, v in cg.host_inputs().items()}
    finally:
        cg.release()


def test_not_offered_where_the_copy_is_more_than_a_move(device):
    case = CASES[0]
    assert _offered(device, conv_graph(*case)[0]) == {0: case[0]}
    assert _offered(device, conv_graph(*case, second_reader=True)[0]) == {}
    assert _offered(device, conv_graph((1, 8, 6, 6), 8, 1, 1, 0)[0]) == {}   # read in place
    strided = (3 * 32 * 40, 32 * 40, 40, 1)
    assert _offered(device, conv_graph(*case, x_strides=strided)[0]) == {}
    assert _offered(device, conv_graph(*case)[0], path="direct") == {}
    assert _offered(device, conv_graph(*case)[0], fuse={"host input": False}) == {}
    assert _offered(device, conv_graph(*case)[0], fuse=False) == {}
    assert _offered(device, conv_graph(*case, dtype="float16")[0], path="gemm") == {}
    with vkml.Device(device.index, force_staging=True) as staged:   # planes not mapped
        assert _offered(staged, conv_graph(*case)[0]) == {}


def test_tuned_without_the_relayout(device, monkeypatch, tmp_path):
    """A convolution whose input the host will write is compiled with
    ``input_from_host``: its tuning shape says so (a shape class of its own) and the
    candidates are timed without the input's relayout; with the kind off, not."""
    from vkml import tuning
    from vkml.ops.convolution import choice

    monkeypatch.setattr(tuning, "_DEFAULT", tuning.Tuner("fast", folder=tmp_path))
    recorded = []
    real = choice.record_as_run

    def spy(dev, seq, op, made, output=None, laid=False):     # (this shape's candidates)
        if tuple(op.desc.input_tensor.sizes) == CASES[0][0]:
            recorded.append((op.path.name, laid))
        return real(dev, seq, op, made, output, laid)
    monkeypatch.setattr(choice, "record_as_run", spy)
    g, _ = conv_graph(*CASES[0])
    cg = device.compile_graph(g)
    assert cg._graph_nodes[0].compiled.input_from_host
    assert recorded and all(laid for _, laid in recorded), recorded
    shape = choice.tuning_shape(cg._graph_nodes[0].compiled.desc, laid=True)
    assert choice.shape_class(shape).endswith("-host")
    assert not choice.shape_class(choice.tuning_shape(cg._graph_nodes[0].compiled.desc)
                                  ).endswith("-host")
    cg.release()
    recorded.clear()
    cg = device.compile_graph(g, fuse={"host input": False})
    assert not cg._graph_nodes[0].compiled.input_from_host
    assert recorded and not any(laid for _, laid in recorded), recorded
    cg.release()


def test_laid_names_only_offered_inputs(device):
    """``laid`` naming an input host_inputs() gave no view of: a ValidationError naming
    the field, and the graph still records and runs as before."""
    shape, cout, k, stride, pad = CASES[0]
    g, ys = conv_graph(shape, cout, k, stride, pad)
    cg = compiled(device, g, "gemm_sg")
    x = np.ones(shape, np.float32)
    w, b = np.ones((cout, shape[1], k, k), np.float32), np.zeros((1, cout, 1, 1), np.float32)
    ins = [device.tensor(x), device.tensor(w), device.tensor(b)]
    y = device.empty(ys, np.float32)
    seq = device.sequence()
    with pytest.raises(ValidationError, match="laid"):
        cg.record(seq, ins, [y], laid={0})           # (host_inputs() not asked yet)
    assert list(cg.host_inputs()) == [0]
    with pytest.raises(ValidationError, match="laid"):
        cg.record(seq, ins, [y], laid={1})
    seq.close()
    cg.execute(ins, [y])
    assert y.numpy().max() == 27.0                  # 3 channels x 3 x 3 ones
    cg.release()


def test_onnx_image_is_written_into_the_first_convolutions_planes(device):
    """Conv (3x3, pads 1, stride 2) -> Relu -> Conv: the executor writes the image into the
    first convolution's planes (``laid``), three images through one recording match ONNX
    Runtime, and with the kind switched off the bits are the same; an image that an Add
    reads too is uploaded as before."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    import vkml.onnx as vonnx
    from onnx_helpers import make_model, ort_expected, value_info

    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 8, 3, 3)).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]
    model = make_model(nodes, [value_info("x", (1, 3, 20, 20))],
                       [value_info("y", (1, 4, 10, 10))], [w1, w2])
    data = model.SerializeToString()
    rep = vonnx.prepare(data, device=device)
    plain = vonnx.prepare(data, device=device, fuse={"host input": False})
    for _ in range(3):
        x = rng.standard_normal((1, 3, 20, 20)).astype(np.float32)
        got = rep.run([x])[0]
        want = ort_expected(model, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        np.testing.assert_array_equal(got, plain.run([x])[0])
    executors = [p.last for p in rep._parts if getattr(p, "last", None) is not None]
    assert [list(e.laid) for e in executors] == [["x"]]
    assert [list(p.last.laid) for p in plain._parts if getattr(p, "last", None)] == [[]]
    prof = rep.profile([x])
    assert prof.entries and prof.run_ms > 0

    nodes.append(helper.make_node("Add", ["x", "x"], ["s"]))
    both = make_model(nodes, [value_info("x", (1, 3, 20, 20))],
                      [value_info("y", (1, 4, 10, 10)), value_info("s", (1, 3, 20, 20))],
                      [w1, w2])
    rep2 = vonnx.prepare(both.SerializeToString(), device=device)
    got = rep2.run([x])
    want = ort_expected(both, {"x": x})
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4 * np.abs(e).max())
    assert [list(p.last.laid) for p in rep2._parts if getattr(p, "last", None)] == [[]]
    for r in (rep, plain, rep2):
        r.release()

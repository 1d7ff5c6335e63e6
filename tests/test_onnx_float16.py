"""vkml.onnx in float16, end to end: every op the bench models lower to (convolution:
plain, depthwise, grouped, transposed, with fused Relu/Clip/Swish/HardSwish epilogues;
Gemm, MatMul; max/average pooling and the global ones; element-wise arithmetic with
broadcasting; Resize; Split, Concat, Slice, Transpose; Softmax; activations;
BatchNormalization alone and folded into a Conv), each in small graphs built with
onnx.helper with random geometry, both ways: ``prepare(dtype="float16")`` on a float32
model (float32 in and out, float16 on the device) and a float16 model (float16 in and
out).  Against ONNX Runtime on the CPU in float32: for the float16 model, ONNX Runtime
runs the float32 model with the same (float16-rounded) weights and input, so only vkml's
float16 intermediates differ; for ``dtype="float16"`` it runs the original float32 model,
so the error includes the initializers' rounding.

Tolerance (:data:`TOL`): every output within 1e-2 of the largest output magnitude.
float16 keeps 11 significant bits (a stored value is off by at most 2^-11 ~ 4.9e-4 of
itself); each op here rounds its output once and accumulates in float32, so a chain of
a few ops stays within a few 1e-3 of its magnitude.  A float32 run would pass this bound
too, so each check also asserts that the device partitions ran on float16 tensors.

SwiftShader has no 16-bit storage: every kernel has a packed variant (two halves a 32-bit
word), so float16 runs there too (no refusal, no float32 fallback: ``strict=True`` and no
``rep.fallbacks``); tested on SwiftShader itself and on lavapipe with ``storage16`` and
``fp16`` disabled.  The squeezenet test runs torchvision's SqueezeNet 1.1 (64x64) on fast
devices only.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402
from helpers import slow  # noqa: E402
from onnx_helpers import make_model, ort_expected, value_info  # noqa: E402
from vkml.onnx.execute import DevicePartition, GraphExecutor  # noqa: E402

#: |vkml - ONNX Runtime float32| <= TOL * max |ONNX Runtime float32| (module doc)
TOL = 1e-2
MODES = ["dtype", "model"]
N = helper.make_node


def _w(rng, shape, scale=None):
    """Random float32 weights of about unit gain (fan-in scaled)."""
    fan = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return (rng.standard_normal(shape) * (scale or fan ** -0.5)).astype(np.float32)


def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


# -- the cases: rng -> (nodes, float initializers {name: array} in the model's float type,
#    other initializers (TensorProto, as given), x shape) --

def _conv(rng):
    c, o, k = int(rng.integers(2, 6)), int(rng.integers(2, 9)), int(rng.choice([1, 3, 5]))
    s, d = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    hw = [int(rng.integers((k - 1) * d + 1, 14)) for _ in range(2)]
    nodes = [N("Conv", ["x", "w", "b"], ["c"], strides=[s, s], dilations=[d, d],
               pads=[k // 2] * 4), N("Relu", ["c"], ["y"])]
    return nodes, {"w": _w(rng, (o, c, k, k)), "b": _w(rng, (o,), 0.3)}, [], [2, c] + hw


def _depthwise(rng):
    c, s = int(rng.integers(3, 17)), int(rng.integers(1, 3))
    nodes = [N("Conv", ["x", "w", "b"], ["c"], group=c, strides=[s, s], pads=[1, 1, 1, 1]),
             N("Clip", ["c", "lo", "hi"], ["y"])]
    fl = {"w": _w(rng, (c, 1, 3, 3)), "b": _w(rng, (c,), 0.3),
          "lo": np.array(0, np.float32), "hi": np.array(1, np.float32)}
    return nodes, fl, [], [1, c, int(rng.integers(4, 15)), int(rng.integers(4, 15))]


def _grouped(rng):
    g = int(rng.integers(2, 5))
    c, o = g * int(rng.integers(1, 4)), g * int(rng.integers(1, 4))
    nodes = [N("Conv", ["x", "w"], ["c"], group=g, pads=[1, 0, 1, 0], kernel_shape=[3, 1]),
             N("LeakyRelu", ["c"], ["y"], alpha=0.1)]
    return nodes, {"w": _w(rng, (o, c // g, 3, 1))}, [], [2, c, 7, 6]


def _conv_transpose(rng):
    c, o, k, s = int(rng.integers(2, 6)), int(rng.integers(2, 6)), int(rng.integers(2, 5)), 2
    nodes = [N("ConvTranspose", ["x", "w", "b"], ["y"], strides=[s, s],
               output_padding=[1, 0] if k % 2 else [0, 0])]
    return nodes, {"w": _w(rng, (c, o, k, k)), "b": _w(rng, (o,), 0.3)}, [], [1, c, 5, 6]


def _gemm(rng):
    c, n = int(rng.integers(2, 9)), int(rng.integers(1, 40))
    nodes = [N("GlobalAveragePool", ["x"], ["p"]), N("Flatten", ["p"], ["f"]),
             N("Gemm", ["f", "w", "b"], ["y"], transB=1, alpha=0.5)]
    return nodes, {"w": _w(rng, (n, c)), "b": _w(rng, (n,), 0.3)}, [], [3, c, 4, 4]


def _matmul(rng):
    k, n = int(rng.integers(1, 40)), int(rng.integers(1, 30))
    nodes = [N("MatMul", ["x", "w"], ["m"]), N("Add", ["m", "b"], ["y"])]
    return nodes, {"w": _w(rng, (k, n)), "b": _w(rng, (n,), 0.3)}, [], [2, 3, k]


def _pooling(rng):
    k, s = int(rng.integers(2, 4)), int(rng.integers(1, 3))
    nodes = [N("MaxPool", ["x"], ["m"], kernel_shape=[k, k], strides=[s, s], ceil_mode=1),
             N("AveragePool", ["m"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 0, 0],
               count_include_pad=int(rng.integers(0, 2)))]
    return nodes, {}, [], [2, 3, int(rng.integers(k, 16)), int(rng.integers(k, 16))]


def _global_pooling(rng):
    nodes = [N("GlobalAveragePool", ["x"], ["a"]), N("GlobalMaxPool", ["x"], ["m"]),
             N("Sub", ["m", "a"], ["y"])]
    return nodes, {}, [], [2, int(rng.integers(1, 9)), int(rng.integers(1, 30)), 17]


def _element_wise(rng):
    c = int(rng.integers(1, 6))
    nodes = [N("Mul", ["x", "s"], ["a"]), N("Add", ["a", "t"], ["b"]),
             N("Div", ["b", "d"], ["e"]), N("Max", ["e", "x"], ["f"]),
             N("Sub", ["f", "x"], ["y"])]
    fl = {"s": _w(rng, (c, 1, 1), 1), "t": _w(rng, (1, 1, 5), 1),
          "d": (rng.random((c, 4, 1)) + 1).astype(np.float32)}
    return nodes, fl, [], [2, c, 4, 5]


def _resize(rng):
    mode = str(rng.choice(["nearest", "linear"]))
    nodes = [N("Resize", ["x", "", "sc"], ["y"], mode=mode,
               coordinate_transformation_mode="half_pixel" if mode == "linear"
               else "asymmetric")]
    scales = np.array([1, 1, 2, float(rng.choice([1.5, 2, 3]))], np.float32)
    # Resize's scales are float32 in any model (not a tensor of the data's type)
    return nodes, {}, [numpy_helper.from_array(scales, "sc")], [1, 3, int(rng.integers(2, 9)), 5]


def _join_split_slice(rng):
    c = 2 * int(rng.integers(1, 5))
    nodes = [N("Split", ["x"], ["a", "b"], axis=1, num_outputs=2),
             N("Slice", ["b", "st", "en", "ax", "sp"], ["s"]),
             N("Concat", ["s", "a"], ["j"], axis=1),
             N("Transpose", ["j"], ["y"], perm=[0, 2, 3, 1])]
    ints = [_ints("st", [-1]), _ints("en", [-100]), _ints("ax", [2]), _ints("sp", [-1])]
    return nodes, {}, ints, [2, c, int(rng.integers(1, 9)), 6]


def _softmax(rng):
    nodes = [N("Mul", ["x", "k"], ["a"]), N("Softmax", ["a"], ["y"], axis=1)]
    return nodes, {"k": np.array(3, np.float32)}, [], [2, int(rng.integers(2, 40)), 3, 2]


def _activations(rng):
    nodes = [N("Sigmoid", ["x"], ["a"]), N("Tanh", ["x"], ["b"]), N("Add", ["a", "b"], ["c"]),
             N("Elu", ["c"], ["e"]), N("HardSigmoid", ["e"], ["h"], alpha=0.3),
             N("Softplus", ["x"], ["p"]), N("Mul", ["h", "p"], ["y"])]
    return nodes, {}, [], [int(rng.integers(1, 4)), 3, 7, int(rng.integers(1, 9))]


def _conv_swish(rng):
    """Conv -> Mul(c, Sigmoid(c)): rewritten to Swish, run in the Conv's output pass."""
    c, o = int(rng.integers(2, 6)), int(rng.integers(2, 9))
    nodes = [N("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), N("Sigmoid", ["c"], ["s"]),
             N("Mul", ["c", "s"], ["y"])]
    return nodes, {"w": _w(rng, (o, c, 3, 3)), "b": _w(rng, (o,), 0.3)}, [], [1, c, 9, 8]


def _conv_hard_swish(rng):
    c = int(rng.integers(2, 9))
    nodes = [N("Conv", ["x", "w"], ["c"], group=c, pads=[1, 1, 1, 1]),
             N("HardSigmoid", ["c"], ["s"], alpha=1 / 6, beta=0.5),
             N("Mul", ["s", "c"], ["y"])]
    return nodes, {"w": _w(rng, (c, 1, 3, 3), 1.0)}, [], [1, c, 8, 9]


def _batch_normalization(rng):
    """One BatchNormalization folded into the Conv before it, one on its own."""
    c, o = int(rng.integers(2, 6)), int(rng.integers(2, 7))

    def stats(n, p):
        return {p + "s": _w(rng, (n,), 1), p + "b": _w(rng, (n,), 1),
                p + "m": _w(rng, (n,), 1), p + "v": (rng.random(n) + 0.5).astype(np.float32)}
    nodes = [N("BatchNormalization", ["x", "1s", "1b", "1m", "1v"], ["n"]),
             N("Conv", ["n", "w"], ["c"]),
             N("BatchNormalization", ["c", "2s", "2b", "2m", "2v"], ["y"])]
    return nodes, {"w": _w(rng, (o, c, 1, 1)), **stats(c, "1"), **stats(o, "2")}, [], \
        [2, c, 5, 5]


CASES = {f.__name__[1:]: f for f in (
    _conv, _depthwise, _grouped, _conv_transpose, _gemm, _matmul, _pooling, _global_pooling,
    _element_wise, _resize, _join_split_slice, _softmax, _activations, _conv_swish,
    _conv_hard_swish, _batch_normalization)}


def _model(nodes, floats: dict, fixed: list, shape, dtype):
    """One model of ``nodes``: input x of ``shape``, output y, the float initializers in
    ``dtype``."""
    inits = [numpy_helper.from_array(v.astype(dtype), k) for k, v in floats.items()] + fixed
    g = helper.make_graph(nodes, "g", [value_info("x", shape, dtype)],
                          [value_info("y", None, dtype)], inits)
    inferred = onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))
    rank = len(inferred.graph.output[0].type.tensor_type.shape.dim)
    return make_model(nodes, [value_info("x", shape, dtype)],
                      [value_info("y", [f"y{i}" for i in range(rank)], dtype)], inits)


def device_dtypes(rep) -> set:
    """The float element types of every value of every compiled device partition."""
    out = set()
    for part in rep._parts:
        if isinstance(part, DevicePartition):
            for ex in part._cache.values():
                if isinstance(ex, GraphExecutor):
                    out |= {np.dtype(dt) for _, dt in ex.lowered.infos.values()
                            if np.dtype(dt).kind == "f"}
    return out


def check(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL * scale)


def run_case(device, case: str, mode: str, trial: int):
    """``case`` (seeded by its name and ``trial``) in float16 the ``mode`` way, against
    ONNX Runtime float32; returns the prepared model."""
    seed = [trial, *map(ord, case)]
    nodes, floats, ints, shape = CASES[case](np.random.default_rng(seed))
    x = np.random.default_rng(seed + [1]).standard_normal(shape).astype(np.float32)
    if mode == "model":
        floats16 = {k: v.astype(np.float16) for k, v in floats.items()}
        model, x_in = _model(nodes, floats16, ints, shape, np.float16), x.astype(np.float16)
        ref = _model(nodes, {k: v.astype(np.float32) for k, v in floats16.items()}, ints,
                     shape, np.float32)
        (want,) = ort_expected(ref, {"x": x_in.astype(np.float32)})
        rep = vonnx.prepare(model, device=device, strict=True)
    else:
        model, x_in = _model(nodes, floats, ints, shape, np.float32), x
        (want,) = ort_expected(model, {"x": x})
        rep = vonnx.prepare(model, device=device, strict=True, dtype="float16")
    (got,) = rep.run({"x": x_in})
    assert not rep.fallbacks, rep.fallbacks
    assert [w for w, _ in rep.partitions] == ["device"], rep.partitions
    assert got.dtype == (np.float16 if mode == "model" else np.float32)
    assert device_dtypes(rep) == {np.dtype(np.float16)}
    check(got, want)
    return rep


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(CASES))
def test_ops_in_float16(case, mode, device, speed):
    """Each case with random geometry (two draws; one on a slow device)."""
    for trial in range(1 if slow(speed) else 2):
        rep = run_case(device, case, mode, trial)
        ops = [o for _, nodes in rep.partitions for _, o in nodes]
        if case == "conv_swish":
            assert "Swish (fused into Conv)" in ops, ops
        if case == "conv_hard_swish":
            assert "HardSwish (fused into Conv)" in ops, ops
        if case == "batch_normalization":
            assert [r.kind for r in rep.rewrites] == ["batch_normalization"]
            assert "BatchNormalization" in ops, ops
        rep.release()


def test_without_16_bit_storage(device):
    """A device without 16-bit storage or float16 arithmetic runs float16 through the
    kernels' packed variants (SwiftShader natively; lavapipe with them disabled)."""
    with vkml.Device(device.index, disable_features=("storage16", "fp16")) as small:
        assert not small.features["storage16"] and not small.features["fp16"]
        for case in ("conv", "depthwise", "conv_transpose", "pooling", "gemm", "softmax"):
            run_case(small, case, "dtype", 0).release()


def test_interface_and_dtype_argument(device):
    """dtype="float16" keeps the model's interface (float32 in, float32 out: a float16
    input is refused as for any float32 model); other dtypes are refused."""
    nodes, floats, ints, shape = _conv(np.random.default_rng(5))
    model = _model(nodes, floats, ints, shape, np.float32)
    x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    (want,) = ort_expected(model, {"x": x})
    (got,) = vonnx.run_model(model, [x], device=device, strict=True, dtype=np.float16)
    assert got.dtype == np.float32
    check(got, want)
    rep = vonnx.VkmlBackend.prepare(model, device=device, dtype="float16")
    with pytest.raises(vkml.ValidationError, match="input 'x'.*float32"):
        rep.run([x.astype(np.float16)])
    check(rep.run([x])[0], want)                    # still usable
    rep.release()
    for bad in ("float64", "float32", "bfloat16", "half-ish", 3):
        with pytest.raises(vkml.ValidationError) as info:
            vonnx.prepare(model, device=device, dtype=bad)
        assert info.value.field == "dtype"


def test_overflow_rounds_to_infinity(device):
    """Initializers beyond float16's range become +-inf on the device, as PyTorch's
    ``.half()`` and NumPy round them (65504 is float16's largest; 65520 rounds up)."""
    big = np.array([1e5, -1e5, 65504, 65520, 3e-8, 1.0], np.float32)
    model = make_model([N("Add", ["x", "c"], ["y"])], [value_info("x", (6,))],
                       [value_info("y", (6,))], [numpy_helper.from_array(big, "c")])
    (got,) = vonnx.run_model(model, [np.zeros(6, np.float32)], device=device, strict=True,
                             dtype="float16")
    with np.errstate(over="ignore"):
        want = big.astype(np.float16).astype(np.float32)
    assert np.array_equal(got, want) and np.isinf(got[[0, 1, 3]]).all(), got
    try:
        import torch
    except ImportError:
        return
    assert np.array_equal(torch.from_numpy(big).half().float().numpy(), want)


def test_host_nodes_compute_in_float32(device):
    """A node on the host between device partitions reads the model's float32 (the device
    values converted back), and the device reads its float32 result converted again."""
    rng = np.random.default_rng(7)
    nodes = [N("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), N("Cos", ["a"], ["h"]),
             N("Conv", ["h", "w2"], ["y"])]
    floats = {"w1": _w(rng, (4, 3, 3, 3)), "w2": _w(rng, (2, 4, 1, 1))}
    model = _model(nodes, floats, [], [1, 3, 6, 6], np.float32)
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    rep = vonnx.prepare(model, device=device, dtype="float16")
    assert [w for w, _ in rep.partitions] == ["device", "host", "device"]
    host = rep._parts[1]
    seen = []
    evaluator = host.evaluator()
    host._evaluator = type("Spy", (), {"run": lambda self, o, feeds: (
        seen.extend(v.dtype for v in feeds.values()), evaluator.run(o, feeds))[1]})()
    (got,) = rep.run([x])
    assert seen == [np.float32] and got.dtype == np.float32
    assert device_dtypes(rep) == {np.dtype(np.float16)}
    check(got, ort_expected(model, {"x": x})[0])
    rep.release()


def _as_float16(model):
    """``model`` with its float32 initializers and graph inputs/outputs in float16, as
    ``torch.onnx.export`` writes a ``.half()`` model (its value_info dropped: inferred)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16),
                                               t.name))
    for vi in list(m.graph.input) + list(m.graph.output):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    del m.graph.value_info[:]
    onnx.checker.check_model(m)
    return m


def test_squeezenet(device, speed, tmp_path):
    """torchvision's SqueezeNet 1.1 (random weights, 64x64), exported as the bench exports
    it, in float16 both ways, against ONNX Runtime float32; fast devices only."""
    if slow(speed):
        pytest.skip("a whole model on a slow device (SwiftShader) is beyond this file's "
                    "time budget; the op cases above cover it there")
    pytest.importorskip("torch")
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("torchvision (the bench's models: VKML_SETUP_BENCH=1 tools/setup) is "
                    "not installed")
    from bench.cnn import models

    data, _, _ = models.export(models.by_name("squeezenet1_1"), 64, cache=str(tmp_path))
    model = onnx.load_from_string(data)
    x = np.random.default_rng(8).standard_normal((1, 3, 64, 64)).astype(np.float32)
    (want,) = ort_expected(model, {model.graph.input[0].name: x})
    rep = vonnx.prepare(model, device=device, strict=True, dtype="float16")
    (got,) = rep.run([x])
    assert got.dtype == np.float32 and device_dtypes(rep) == {np.dtype(np.float16)}
    check(got, want)
    rep.release()
    half = _as_float16(model)
    rep = vonnx.prepare(half, device=device, strict=True)
    (got,) = rep.run([x.astype(np.float16)])
    assert got.dtype == np.float16
    check(got, want)
    rep.release()


def test_bench_row_in_float16(device, speed, tmp_path):
    """``python -m bench models --dtype float16``'s row: vkml prepared in float16, its
    rel err against ONNX Runtime CPU float32 (a tiny U-Net, 32x32); fast devices only."""
    if slow(speed):
        pytest.skip("a whole model on a slow device (SwiftShader): beyond the time budget")
    pytest.importorskip("torch")
    from bench.cnn import models
    from bench.cnn.peers import OrtCpu
    from bench.cnn.run import model_row
    from bench.stats import Budget

    spec = models.ModelSpec("unet-tiny", lambda size: models.unet(base=4, depth=2), size=32,
                            source=[models.__file__])
    data, _, _ = models.export(spec, 32, cache=str(tmp_path))
    budget = Budget(warmup=0, min_repeats=1, max_repeats=1, seconds=0.1)
    # cold=False: the cold-start children run float32 whatever the dtype (test_bench_models
    # checks them)
    rows = {dt: model_row(spec, 32, data, device, [OrtCpu()], budget, None, dtype=dt,
                          cold=False)["vkml"] for dt in (None, "float16")}
    assert [r["dtype"] for r in rows.values()] == ["float32", "float16"]
    assert rows[None]["rel_err"] < 1e-4 and 0 < rows["float16"]["rel_err"] < TOL, rows

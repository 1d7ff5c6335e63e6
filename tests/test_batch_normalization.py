"""DML_BATCH_NORMALIZATION (``vkml.batch_normalization``): against a float64 NumPy
reference and PyTorch's ``batch_norm`` over ranks 1 to 8, every broadcast pattern of the
statistics, float32 and float16 (halves, or packed words without 16-bit storage),
strided and broadcast tensors with NaN canaries in an output's gaps, both read paths,
fused activations, windows past maxStorageBufferRange and grids past
maxComputeWorkGroupCount, every rule of the page, a graph node, threads and leaks."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st
import torch

import vkml
from vkml import dml
from vkml.errors import ValidationError

from helpers import (assert_no_leaks, operator_cycle, run_into_nan, run_two_node_graph,
                     threads_share_one_operator)
from test_activations import FORMULAS
from fuzzing import compiled_or_refused, fuzzer, lay_out, padded_output, placement, run_checked

T = dml.TensorDesc
Desc = dml.BatchNormalizationOperatorDesc


def reference(x, mean, var, scale, bias, eps, act=None, params=None):
    """The page's formula in float64 (NumPy broadcasting = the page's size-1 broadcast)."""
    x, mean, var, scale, bias = (np.asarray(a, np.float64) for a in (x, mean, var, scale, bias))
    y = scale * ((x - mean) / np.sqrt(var + eps)) + bias
    if act is not None:
        y = FORMULAS[act][1](y, **(params or {}))
    return y


def _stats(rng, shapes, dtype):
    mean = rng.standard_normal(shapes[0]).astype(dtype)
    var = (rng.random(shapes[1]) * 2 + 0.1).astype(dtype)
    scale = rng.standard_normal(shapes[2]).astype(dtype)
    bias = rng.standard_normal(shapes[3]).astype(dtype)
    return mean, var, scale, bias


def _broadcast_shape(rng, shape):
    """A statistic's sizes: each dimension 1 or the input's."""
    return tuple(s if rng.random() < 0.5 else 1 for s in shape)


def _tol(dtype):
    return dict(rtol=2e-5, atol=2e-5) if dtype == "float32" else dict(rtol=2e-3, atol=4e-3)


def _run(device, desc, arrays, out_elems, read=None, **kw):
    from vkml.ops.batch_normalization import CompiledBatchNormalization

    op = CompiledBatchNormalization(device, device.create_operator(desc).desc, read=read,
                                    **kw)
    return op, run_into_nan(device, op, arrays, out_elems, desc.output_tensor.dtype)


def test_page_formula_per_channel(device):
    """ONNX-style per-channel statistics (1-D, C values) against PyTorch's batch_norm
    in inference mode, and the same as (1, C, 1, 1) tensors."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    mean, var, scale, bias = _stats(rng, [(3,)] * 4, np.float32)
    want = torch.nn.functional.batch_norm(
        torch.from_numpy(x.astype(np.float64)), torch.from_numpy(mean.astype(np.float64)),
        torch.from_numpy(var.astype(np.float64)), torch.from_numpy(scale.astype(np.float64)),
        torch.from_numpy(bias.astype(np.float64)), training=False, eps=1e-3).numpy()
    got = vkml.batch_normalization(x, mean, var, scale, bias, epsilon=1e-3, device=device)
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    got4 = vkml.batch_normalization(x, *(a.reshape(1, 3, 1, 1) for a in (mean, var, scale, bias)),
                                    epsilon=1e-3, device=device)
    np.testing.assert_allclose(got4, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_random_ranks_and_broadcasts(device, budget, dtype):
    """Ranks 1 to 8, each statistic broadcast along a random set of dimensions (the
    row variants where all four are constant along the merged last dimension)."""
    rng = np.random.default_rng(1 if dtype == "float32" else 2)
    kernels = set()
    for case in range(budget):
        rank = 1 + case % 8
        shape = tuple(int(rng.integers(1, 5 if rank > 4 else 9)) for _ in range(rank))
        shapes = [_broadcast_shape(rng, shape) for _ in range(4)]
        if case % 3 == 0:               # per-channel-like: constant along the last dims
            shapes = [tuple(s if d < max(1, rank - 2) else 1 for d, s in enumerate(sh))
                      for sh in shapes]
        x = (rng.standard_normal(shape) * 3).astype(dtype)
        stats = _stats(rng, shapes, dtype)
        eps = float(rng.choice([1e-5, 0.1]))
        desc = Desc(T(dtype, shape), *(T(dtype, s) for s in shapes), T(dtype, shape),
                    epsilon=eps)
        op, got = _run(device, desc, [x, *stats], x.size)
        kernels.add(op.kernel)
        np.testing.assert_allclose(got.reshape(shape).astype(np.float64),
                                   reference(x, *stats, eps), **_tol(dtype),
                                   err_msg=f"{shape} {shapes}")
    assert any("row" in k for k in kernels) and any("row" not in k for k in kernels), kernels


@pytest.mark.parametrize("read", ["texel4", "ssbo"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_strides_and_canaries(device, dtype, read):
    """A permuted input, statistics with explicit zero strides and a padded one, into an
    output whose gaps hold NaN canaries that must stay."""
    rng = np.random.default_rng(3)
    shape = (2, 3, 4, 6)
    base = rng.standard_normal((2, 4, 6, 3)).astype(dtype)         # NHWC in memory
    x = base.transpose(0, 3, 1, 2)
    xs = (72, 1, 18, 3)
    mean, var, scale, bias = _stats(rng, [(3,), (3,), (3, 4), (3,)], dtype)
    zero = (0, 1, 0, 0)
    out_strides = (3 * 4 * 16, 4 * 16, 16, 2)
    out_elems = 2 * out_strides[0]
    desc = Desc(T(dtype, shape, xs), T(dtype, shape, zero), T(dtype, shape, zero),
                T(dtype, (1, 3, 4, 1), (0, 8, 1, 0)), T(dtype, (1, 3, 1, 1)),
                T(dtype, shape, out_strides), epsilon=1e-4)
    scale_buf = np.zeros((3, 8), dtype)
    scale_buf[:, :4] = scale
    op, got = _run(device, desc, [base, mean, var, scale_buf, bias], out_elems, read=read)
    assert op.read == (read if dtype == "float32" else "ssbo")
    idx = sum(np.arange(s).reshape([-1 if i == d else 1 for i in range(4)]) * st
              for d, (s, st) in enumerate(zip(shape, out_strides)))
    want = reference(x, mean.reshape(1, 3, 1, 1), var.reshape(1, 3, 1, 1),
                     scale.reshape(1, 3, 4, 1), bias.reshape(1, 3, 1, 1), 1e-4)
    np.testing.assert_allclose(got[idx].astype(np.float64), want, **_tol(dtype))
    gaps = np.ones(out_elems, bool)
    gaps[idx.reshape(-1)] = False
    assert np.isnan(got[gaps].astype(np.float64)).all(), "a write landed outside the output"


@pytest.mark.parametrize("read", ["texel4", "ssbo"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_row_tails(device, dtype, read):
    """Per-channel statistics over rows of H * W elements that end inside an invocation's
    32 (the vec4 main loop, then the row's last elements one by one), with a fused
    activation so that the tail's element code is not the main loop's by accident."""
    rng = np.random.default_rng(7)
    for hw in [(1, 4), (3, 12), (6, 6), (4, 11), (10, 10), (3, 44), (5, 7)]:
        shape = (2, 3) + hw
        x = (rng.standard_normal(shape) * 3).astype(dtype)
        stats = _stats(rng, [(1, 3, 1, 1)] * 4, dtype)
        fused = dml.ACTIVATIONS["leaky_relu"](alpha=0.25)
        desc = Desc(T(dtype, shape), *(T(dtype, a.shape) for a in stats), T(dtype, shape),
                    fused_activation=fused)
        op, got = _run(device, desc, [x, *stats], x.size, read=read)
        assert op.row, op.kernel
        want = reference(x, *stats, 1e-5, "leaky_relu", {"alpha": 0.25})
        np.testing.assert_allclose(got.reshape(shape).astype(np.float64), want, **_tol(dtype),
                                   err_msg=f"{shape}")


@pytest.mark.parametrize("store64", [False, True])
def test_u64_stores(device, store64):
    """float32 texel4 rows stored as u64vec4 pairs (``store64``, int64 shaders) where every
    invocation's 32 elements start 8-aligned in X and Y, vec4 stores elsewhere (rows of
    4 mod 8 elements), the row tails one by one; per-channel and per-element statistics,
    with a fused activation."""
    from vkml.ops.batch_normalization import CompiledBatchNormalization

    rng = np.random.default_rng(16 + store64)
    int64 = bool(device._ctx.features.get("int64"))
    fused = dml.ACTIVATIONS["leaky_relu"](alpha=0.25)
    for hw, sshape, aligned in [((8, 8), (1, 3, 1, 1), True), ((4, 14), (1, 3, 1, 1), True),
                                ((3, 44), (1, 3, 1, 1), False), ((8, 8), (1, 3, 8, 8), True),
                                ((5, 12), (2, 3, 5, 1), False)]:
        shape = (2, 3) + hw
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        stats = _stats(rng, [sshape] * 4, np.float32)
        desc = Desc(T("float32", shape), *(T("float32", a.shape) for a in stats),
                    T("float32", shape), fused_activation=fused)
        used = []
        real = CompiledBatchNormalization.pipeline

        def spy(self, name, consts=None):
            used.append(name)
            return real(self, name, consts)

        CompiledBatchNormalization.pipeline = spy
        try:
            op, got = _run(device, desc, [x, *stats], x.size, read="texel4", store64=store64)
        finally:
            CompiledBatchNormalization.pipeline = real
        assert op.read == "texel4" and op.store64 == (store64 and int64)
        assert any(n.endswith("_u64") for n in used) == (store64 and int64 and aligned), used
        want = reference(x, *stats, 1e-5, "leaky_relu", {"alpha": 0.25})
        np.testing.assert_allclose(got.reshape(shape), want, **_tol("float32"),
                                   err_msg=f"{shape} {sshape}")
    with pytest.raises(ValidationError) as err:
        _run(device, desc, [x, *stats], x.size, store64="yes")
    assert err.value.field == "store64"


@pytest.mark.parametrize("act, params", [("relu", {}), ("leaky_relu", {"alpha": 0.2}),
                                         ("sigmoid", {}), ("elu", {"alpha": 0.5}),
                                         ("gelu", {})])
def test_fused_activation(device, act, params):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 4, 3, 5)).astype(np.float32)
    stats = _stats(rng, [(1, 4, 1, 1)] * 4, np.float32)
    fused = dml.ACTIVATIONS[act](**params)
    got = vkml.batch_normalization(x, *stats, fused_activation=fused, device=device)
    np.testing.assert_allclose(got, reference(x, *stats, 1e-5, act, params),
                               rtol=3e-5, atol=3e-6)


@pytest.mark.parametrize("read", ["texel4", "ssbo"])
def test_windows_and_split_grids(device, read):
    """maxStorageBufferRange lowered: the tensors (statistics as large as the input
    included) are bound in windows; maxComputeWorkGroupCount lowered: grids split."""
    rng = np.random.default_rng(5)
    shape = (3, 5, 7, 40)
    x = rng.standard_normal(shape).astype(np.float32)
    stats = _stats(rng, [(3, 5, 7, 40), (1, 5, 1, 1), (3, 1, 7, 40), (1, 5, 7, 1)], np.float32)
    want = reference(x, *stats, 1e-5)
    align = device._ctx.binding_alignment()
    for limits in ({"maxStorageBufferRange": 2048 + 4 * align},
                   {"maxComputeWorkGroupCount": (2, 2, 2)}):
        with vkml.Device(device.index, limits=limits) as small:
            desc = Desc(T("float32", shape), *(T("float32", s.shape) for s in stats),
                        T("float32", shape))
            op, got = _run(small, desc, [x, *stats], x.size, read=read)
            if "maxStorageBufferRange" in limits:
                assert op.windows is not None and len(op.windows) > 1 and op.read == "ssbo"
            np.testing.assert_allclose(got.reshape(shape), want, rtol=2e-5, atol=2e-5)


def test_tensor_in_tensor_out(device):
    x = vkml.tensor(np.arange(6, dtype=np.float32).reshape(1, 2, 3), device=device)
    one = vkml.tensor(np.ones((1, 2, 1), np.float32), device=device)
    zero = vkml.tensor(np.zeros((1, 2, 1), np.float32), device=device)
    y = vkml.batch_normalization(x, zero, one, one, zero, epsilon=0.0)
    assert isinstance(y, vkml.Tensor)
    np.testing.assert_allclose(y.numpy(), np.arange(6).reshape(1, 2, 3), rtol=1e-6)


# -- validation: every rule of the page, with the field it names ----------------------------
X = T("float32", (2, 3, 4, 5))
S = T("float32", (1, 3, 1, 1))


@pytest.mark.parametrize("kw, field", [
    (dict(input_tensor=T("int32", (2, 3, 4, 5))), "input_tensor.data_type"),
    (dict(mean_tensor=T("float16", (1, 3, 1, 1))), "mean_tensor.data_type"),
    (dict(bias_tensor=T("float32", (3,))), "bias_tensor.sizes"),
    (dict(variance_tensor=T("float32", (1, 2, 1, 1))), "variance_tensor.sizes[1]"),
    (dict(scale_tensor=T("float32", (2, 3, 4, 2))), "scale_tensor.sizes[3]"),
    (dict(output_tensor=T("float32", (2, 3, 4, 6))), "output_tensor.sizes"),
    (dict(output_tensor=T("float32", (2, 3, 4, 5), (0, 20, 5, 1))), "output_tensor.strides"),
    (dict(input_tensor=None), "input_tensor"),
    (dict(epsilon=float("nan")), "epsilon"),
    (dict(epsilon=float("inf")), "epsilon"),
    (dict(epsilon="0.1"), "epsilon"),
    (dict(spatial=2), "spatial"),
    (dict(fused_activation=dml.ElementWiseClipOperatorDesc(min=0.0, max=6.0)),
     "fused_activation"),
    (dict(fused_activation=dml.ActivationReluOperatorDesc(X, X)),
     "fused_activation.input_tensor"),
    (dict(fused_activation=dml.ActivationEluOperatorDesc(alpha=float("nan"))),
     "fused_activation.alpha"),
    (dict(fused_activation="softmax"), "fused_activation"),
])
def test_rules(device, kw, field):
    args = dict(input_tensor=X, mean_tensor=S, variance_tensor=S, scale_tensor=S,
                bias_tensor=S, output_tensor=X)
    args.update(kw)
    with pytest.raises(ValidationError) as info:
        device.create_operator(Desc(**args))
    assert info.value.field == f"BatchNormalizationOperatorDesc.{field}", str(info.value)
    one = np.ones(2, np.float32)          # the device is usable afterwards
    np.testing.assert_allclose(vkml.batch_normalization(one, one * 0, one, one, one * 0,
                                                        epsilon=0.0, device=device), one)


def test_feature_levels():
    assert Desc(X, S, S, S, S, X).feature_level() == dml.FeatureLevel.FL_1_0
    t3 = T("float32", (2, 3, 4))
    s3 = T("float32", (1, 3, 1))
    assert Desc(t3, s3, s3, s3, s3, t3).feature_level() == dml.FeatureLevel.FL_3_1
    # Spatial FALSE with broadcast Width/Height of Mean: an error before 4_0, no effect since
    assert Desc(X, S, S, S, S, X, spatial=False).feature_level() == dml.FeatureLevel.FL_4_0
    full = T("float32", (1, 3, 4, 5))
    assert Desc(X, full, full, S, S, X, spatial=False).feature_level() == dml.FeatureLevel.FL_1_0
    assert Desc(X, S, S, S, S, X, fused_activation="gelu").feature_level() == \
        dml.FeatureLevel.FL_5_1


def test_functional_argument_errors(device):
    x = np.zeros((2, 3, 4), np.float32)
    c = np.ones(3, np.float32)
    with pytest.raises(ValidationError) as info:
        vkml.batch_normalization(x, np.ones(4, np.float32), c, c, c, device=device)
    assert info.value.field == "mean"
    with pytest.raises(ValidationError) as info:
        vkml.batch_normalization(x, c, c, c, c, fused_activation="nope", device=device)
    assert info.value.field.endswith("fused_activation")
    with pytest.raises(ValidationError):
        vkml.batch_normalization(x.astype(np.float16), c, c, c, c, device=device)


# -- graph, threads, leaks ------------------------------------------------------------------
def test_graph_node(device):
    """batch normalization -> softmax over the channels as a two-node graph."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    stats = _stats(rng, [(1, 3, 1, 1)] * 4, np.float32)
    got = run_two_node_graph(device, Desc(X, S, S, S, S, X, fused_activation="relu"),
                             dml.ActivationSoftmax1OperatorDesc(X, X, (1,)), (x, *stats),
                             x.shape)
    y = reference(x, *stats, 1e-5, "relu")
    e = np.exp(y - y.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=2e-5, atol=1e-6)


def test_threads(device):
    x = np.random.default_rng(7).standard_normal((2, 3, 4, 5)).astype(np.float32)
    stats = _stats(np.random.default_rng(8), [(1, 3, 1, 1)] * 4, np.float32)
    shared = device.compile_operator(device.create_operator(Desc(X, S, S, S, S, X)))
    ins = [device.tensor(a) for a in (x, *stats)]
    want = reference(x, *stats, 1e-5)

    def functional(k, i):
        shape = (1, 2 + k % 3, 3 + i)
        xi = np.full(shape, float(k), np.float32)
        c = np.arange(shape[1], dtype=np.float32)
        got = vkml.batch_normalization(xi, c, c + 1, c, c, device=device)
        return np.allclose(got, reference(xi, *(a.reshape(1, -1, 1) for a in (c, c + 1, c, c)),
                                          1e-5), rtol=1e-5, atol=1e-5)

    threads_share_one_operator(device, shared, ins, want, x.shape, functional,
                               rtol=1e-5, atol=1e-5)


def test_no_leaks(device):
    """create -> compile -> execute -> release cycles leave the device's memory as it was."""
    x = np.ones((2, 3, 4), np.float32)
    s = np.ones((1, 3, 1), np.float32)
    ins = [device.tensor(a) for a in (x, s, s, s, s)]
    out = device.empty(x.shape)
    t, st = T("float32", x.shape), T("float32", s.shape)
    cycle = operator_cycle(device, Desc(t, st, st, st, st, t), ins, [out])
    assert_no_leaks(device, cycle, warm=20, rounds=100)


# -- fuzzer (tests/fuzzing.py): valid and invalid descriptors, canaries ---------------------


@st.composite
def bn_cases(draw):
    rank = draw(st.integers(1, 5))
    shape = draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank))
    masks = draw(st.lists(st.lists(st.booleans(), min_size=rank, max_size=rank),
                          min_size=4, max_size=4))
    return dict(shape=shape, masks=masks, dtype=draw(st.sampled_from(["float32", "float16"])),
                mutation=draw(st.sampled_from(["none"] * 8 + ["stat_size", "stat_rank",
                                                              "int", "out", "eps", "clip"])),
                act=draw(st.sampled_from([None, None, "relu", "tanh", "hard_sigmoid"])),
                **placement(draw, 5))


def test_fuzz_batch_normalization(device, speed):
    """Random batch normalization descriptors (the contract of ``fuzzing.fuzzer``)."""
    @fuzzer(speed, bn_cases(), share=2)
    def check(case):
        rng = np.random.default_rng(case["seed"])
        m, shape, dtype = case["mutation"], list(case["shape"]), case["dtype"]
        want = {"stat_size": ["variance_tensor.sizes"], "stat_rank": ["bias_tensor.sizes"],
                "int": ["data_type"], "out": ["output_tensor.sizes"], "eps": ["epsilon"],
                "clip": ["fused_activation"]}.get(m, [])
        sshapes = [[s if keep else 1 for s, keep in zip(shape, mask)] for mask in case["masks"]]
        if m == "stat_size":
            sshapes[1][-1] = shape[-1] + 1
        if m == "stat_rank":
            sshapes[3] = sshapes[3] + [1]
        out = shape[:-1] + [shape[-1] + 1] if m == "out" else list(shape)
        x = rng.uniform(-3, 3, shape).astype(dtype)
        stats = list(_stats(rng, sshapes, dtype))
        laid = [lay_out(rng, a, kind) for a, kind in zip([x] + stats, case["layouts"])]
        x, stats = laid[0][2], [l[2] for l in laid[1:]]
        out_strides, read = padded_output(rng, out, dtype, case["out_padded"])
        eps = float("nan") if m == "eps" else float(rng.choice([1e-5, 0.5]))
        act = dml.ElementWiseClipOperatorDesc() if m == "clip" else case["act"]
        in_type = "int32" if m == "int" else dtype

        def make():
            return Desc(T(in_type, shape, laid[0][1]),
                        *(T(dtype, s, l[1]) for s, l in zip(sshapes, laid[1:])),
                        T(dtype, out, out_strides), epsilon=eps, fused_activation=act)

        desc, compiled = compiled_or_refused(device, make, want)
        if desc is None:
            return
        got = run_checked(device, compiled, desc, [l[0] for l in laid], read)
        params = {"hard_sigmoid": {"alpha": 0.2, "beta": 0.5}}.get(act, {})
        np.testing.assert_allclose(got.astype(np.float64),
                                   reference(x, *stats, eps, act, params), **_tol(dtype))

    check()


def test_float16_without_16bit_storage(device):
    """float16 packed two to a 32-bit word (the device's 16-bit storage turned off), an
    odd element count so the last word is shared with nothing."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((3, 5, 7)).astype(np.float16)
    stats = _stats(rng, [(1, 5, 1), (1, 5, 7), (3, 1, 1), (1, 1, 7)], np.float16)
    with vkml.Device(device.index, disable_features=["storage16"]) as dev:
        desc = Desc(T("float16", x.shape), *(T("float16", s.shape) for s in stats),
                    T("float16", x.shape))
        op, got = _run(dev, desc, [x, *stats], x.size)
        assert "f16_packed" in op.kernel
    np.testing.assert_allclose(got.reshape(x.shape).astype(np.float64),
                               reference(x, *stats, 1e-5), **_tol("float16"))

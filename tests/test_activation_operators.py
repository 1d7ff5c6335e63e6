"""The 18 activations as operators of their own (DML_ACTIVATION_*_OPERATOR_DESC,
DML_ELEMENT_WISE_CLIP_OPERATOR_DESC with their tensors set) and ``vkml.activation``:
each against its page's formula in float64 (the same FORMULAS the fused tests use),
float32 and float16 (halves, or packed words where the device lacks 16-bit storage),
strided tensors, and every rule of the pages' "Tensor constraints" / "Tensor support"."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import vkml
from vkml import dml
from vkml.errors import ValidationError

from helpers import run_into_nan, strided_view
from test_activations import DEFAULTS, FORMULAS, POINTS


def _run(device, desc, x_flat, out_elems):
    op = device.compile_operator(device.create_operator(desc))
    return run_into_nan(device, op, [x_flat], out_elems, desc.output_tensor.dtype)


@pytest.mark.parametrize("name", list(FORMULAS))
@pytest.mark.parametrize("which", ["defaults", "parameters"])
def test_formula(device, name, which):
    params, formula = FORMULAS[name]
    kwargs = DEFAULTS.get(name, {}) if which == "defaults" else params
    x = POINTS.reshape(1, -1)
    got = vkml.activation(x, name, device=device, **kwargs)
    assert got.shape == x.shape and got.dtype == np.float32
    with np.errstate(over="ignore"):
        want = formula(x.astype(np.float64), **kwargs)
    np.testing.assert_allclose(got, want, rtol=3e-5, atol=2e-6, err_msg=name)
    if name in ("identity", "relu") or (name == "clip" and which == "defaults"):
        np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("name", list(FORMULAS))
def test_float16(device, name):
    """float16: the float32 activation rounded once; an odd element count exercises the
    packed path's last half-word."""
    params, formula = FORMULAS[name]
    x = POINTS[np.abs(POINTS) < 60].astype(np.float16)
    x = x[:x.size - 1 + x.size % 2]
    assert x.size % 2 == 1
    got = vkml.activation(x, name, device=device, **params)
    assert got.dtype == np.float16
    want = formula(x.astype(np.float64), **params)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-3, atol=1e-4, err_msg=name)


TORCH = {   # the activations PyTorch has, with vkml's parameters mapped to its own
    "sigmoid": ({}, torch.sigmoid), "tanh": ({}, torch.tanh), "relu": ({}, torch.relu),
    "leaky_relu": (dict(alpha=0.2), lambda t: torch.nn.functional.leaky_relu(t, 0.2)),
    "elu": (dict(alpha=0.7), lambda t: torch.nn.functional.elu(t, 0.7)),
    "celu": (dict(alpha=2.5), lambda t: torch.nn.functional.celu(t, 2.5)),
    "softplus": (dict(steepness=2.0),
                 lambda t: torch.nn.functional.softplus(t, beta=2.0, threshold=1e9)),
    "softsign": ({}, torch.nn.functional.softsign),
    "gelu": ({}, torch.nn.functional.gelu),
    "hard_sigmoid": (dict(alpha=1 / 6, beta=0.5), torch.nn.functional.hardsigmoid),
    "clip": (dict(min=-1.0, max=2.0), lambda t: torch.clamp(t, -1.0, 2.0)),
}


@pytest.mark.parametrize("name", list(TORCH))
def test_against_pytorch(device, name):
    params, fn = TORCH[name]
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((2, 3, 5, 7)) * 4).astype(np.float32)
    got = vkml.activation(x, name, device=device, **params)
    want = fn(torch.from_numpy(x.astype(np.float64))).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("kind", ["padded", "broadcast", "permuted"])
def test_strides(device, dtype, kind):
    """Non-packed input layouts (padded, broadcast, permuted) into a padded output whose
    gaps must stay untouched (NaN canaries)."""
    rng = np.random.default_rng(3)
    shape = (2, 3, 4, 5)
    flat, strides, logical = strided_view(rng, shape, dtype, kind)
    flat = np.nan_to_num(flat.astype(np.float64), posinf=1, neginf=-1).clip(-8, 8).astype(dtype)
    logical = np.nan_to_num(logical.astype(np.float64), posinf=1, neginf=-1).clip(-8, 8)
    out_strides = (3 * 4 * 8 * 2, 4 * 8 * 2, 8 * 2, 2)       # every other element, rows padded
    out_elems = shape[0] * out_strides[0]
    act = dml.ActivationEluOperatorDesc(alpha=0.5)
    desc = act.standalone(dml.TensorDesc(dtype, shape, strides),
                          dml.TensorDesc(dtype, shape, out_strides))
    got = _run(device, desc, flat, out_elems)
    idx = sum(np.arange(s).reshape([-1 if i == d else 1 for i in range(4)]) * st
              for d, (s, st) in enumerate(zip(shape, out_strides)))
    want = np.where(logical >= 0, logical, 0.5 * np.expm1(logical))
    tol = 1e-6 if dtype == "float32" else 2e-3
    np.testing.assert_allclose(got[idx].astype(np.float64), want, rtol=tol, atol=tol)
    gaps = np.ones(out_elems, bool)
    gaps[idx.reshape(-1)] = False
    assert np.isnan(got[gaps]).all(), "a write landed outside the output's elements"


def test_ranks_1_and_8(device):
    for shape in [(5,), (1, 2, 1, 2, 1, 2, 1, 3)]:
        x = np.linspace(-2, 2, int(np.prod(shape)), dtype=np.float32).reshape(shape)
        np.testing.assert_array_equal(vkml.activation(x, "relu", device=device),
                                      np.maximum(x, 0))


def _compiled(device, desc, read):
    import importlib
    cls = importlib.import_module("vkml.ops.activation").CompiledActivation
    return cls(device, desc, read=read)


def _elu(x):
    x = x.astype(np.float64)
    return np.where(x >= 0, x, 0.5 * np.expm1(x))


@pytest.mark.parametrize("read", ["ssbo", "ssbo4", "texel4"])
@pytest.mark.parametrize("n", [1, 3, 4, 31, 32, 33, 1000, 4099])
def test_flat_read_paths(device, read, n):
    """Packed tensors of one layout run flat, 32 elements an invocation (vec4 reads and
    stores where a whole 32 fit), each read path forced by name; every size, tails too."""
    x = np.linspace(-3, 3, n, dtype=np.float32).reshape(1, n)
    t = dml.TensorDesc("float32", x.shape)
    op = _compiled(device, dml.ActivationEluOperatorDesc(t, t, alpha=0.5), read)
    try:
        assert op.flat and op.read == read
        out = device.empty(x.shape)
        out.write(np.full(x.shape, np.nan, np.float32))
        op.execute([device.tensor(x)], [out])
        np.testing.assert_allclose(out.numpy(), _elu(x), rtol=3e-6, atol=1e-7)
    finally:
        op.release()


@pytest.mark.parametrize("read", ["ssbo", "ssbo4", "texel4"])
@pytest.mark.parametrize("shape", [(3, 4, 50), (7, 333)])
def test_windowed(device, read, shape):
    """Tensors bound in windows (maxStorageBufferRange lowered) give the same result on
    each read path; texel4 needs the whole input in one binding and falls back."""
    x = np.linspace(-4, 4, int(np.prod(shape)), dtype=np.float32).reshape(shape)
    t = dml.TensorDesc("float32", x.shape)
    align = device._ctx.binding_alignment()
    with vkml.Device(device.index, limits={"maxStorageBufferRange": 1024 + 4 * align}) as dev:
        op = _compiled(dev, dml.ActivationSigmoidOperatorDesc(t, t), read)
        try:
            assert op.windows is not None and len(op.windows) > 1
            assert op.read == ("ssbo" if read == "texel4" else read)
            out = dev.empty(x.shape)
            op.execute([dev.tensor(x)], [out])
            np.testing.assert_allclose(out.numpy(), 1 / (1 + np.exp(-x.astype(np.float64))),
                                       rtol=3e-6, atol=1e-7)
        finally:
            op.release()


def test_tensor_in_tensor_out(device):
    x = np.array([-1.0, 0.5, 7.0], np.float32)
    t = vkml.tensor(x, device=device)
    y = vkml.activation(t, dml.ElementWiseClipOperatorDesc(min=0.0, max=6.0))
    assert isinstance(y, vkml.Tensor)
    np.testing.assert_array_equal(y.numpy(), [0.0, 0.5, 6.0])
    # an instance's parameters are kept, keywords override them
    z = vkml.activation(t, dml.ElementWiseClipOperatorDesc(min=0.0, max=6.0), max=1.0)
    np.testing.assert_array_equal(z.numpy(), [0.0, 0.5, 1.0])


# -- validation: every rule of the pages, with the field it names --------------------------
T = dml.TensorDesc("float32", (2, 3, 4))


@pytest.mark.parametrize("cls", list(dml.OPERATOR_ACTIVATIONS.values()))
@pytest.mark.parametrize("case", ["sizes", "data_type", "rank", "int", "no_input", "no_output",
                                  "overlap"])
def test_tensor_rules(device, cls, case):
    inp, out, field = {
        "sizes": (T, dml.TensorDesc("float32", (2, 3, 5)), "output_tensor.sizes"),
        "data_type": (T, dml.TensorDesc("float16", (2, 3, 4)), "output_tensor.data_type"),
        "rank": (T, dml.TensorDesc("float32", (2, 3, 4, 1)), "output_tensor.sizes"),
        "int": (dml.TensorDesc("int32", (2, 3, 4)), dml.TensorDesc("int32", (2, 3, 4)),
                "input_tensor.data_type"),
        "no_input": (None, T, "input_tensor"),
        "no_output": (T, None, "output_tensor"),
        "overlap": (T, dml.TensorDesc("float32", (2, 3, 4), (0, 1, 1)), "output_tensor.strides"),
    }[case]
    desc = cls(inp, out)
    with pytest.raises(ValidationError) as info:
        device.create_operator(desc)
    assert info.value.field == f"{cls.__name__}.{field}", str(info.value)
    vkml.activation(np.zeros(3, np.float32), cls, device=device)   # still usable


@pytest.mark.parametrize("name, kwargs, field", [
    ("elu", dict(alpha=float("nan")), "alpha"),
    ("linear", dict(beta=float("inf")), "beta"),
    ("softplus", dict(steepness=0.0), "steepness"),
    ("celu", dict(alpha=0.0), "alpha"),
    ("clip", dict(max=float("nan")), "max"),
    ("clip", dict(scale_bias=dml.ScaleBias(float("inf"), 0.0)), "scale_bias.scale"),
    ("scaled_elu", dict(gamma="1"), "gamma"),
    ("swish", dict(sigmoid_input_scale=float("nan")), "sigmoid_input_scale"),
    ("hard_swish", dict(alpha=float("inf")), "alpha"),
    ("hard_swish", dict(beta=None), "beta"),
])
def test_parameter_rules(device, name, kwargs, field):
    desc = dml.OPERATOR_ACTIVATIONS[name](T, T, **kwargs)
    with pytest.raises(ValidationError) as info:
        device.create_operator(desc)
    assert info.value.field == f"{type(desc).__name__}.{field}"
    with pytest.raises(ValidationError) as info:
        vkml.activation(np.zeros(3, np.float32), name, device=device, **kwargs)


def test_softplus_below_one_needs_6_4(device):
    desc = dml.ActivationSoftplusOperatorDesc(T, T, steepness=0.5)
    assert desc.feature_level() == dml.FeatureLevel.FL_6_4
    x = np.linspace(-3, 3, 7, dtype=np.float32)
    np.testing.assert_allclose(vkml.activation(x, "softplus", steepness=0.5, device=device),
                               np.logaddexp(0, 0.5 * x) / 0.5, rtol=1e-5)


def test_functional_argument_errors(device):
    x = np.zeros(3, np.float32)
    with pytest.raises(ValidationError, match="kind"):
        vkml.activation(x, "softmax", device=device)
    with pytest.raises(ValidationError) as info:
        vkml.activation(x, "relu", alpha=1.0, device=device)
    assert info.value.field == "alpha"


def test_fused_and_standalone_forms():
    act = dml.ActivationLeakyReluOperatorDesc(alpha=0.3)
    assert act.is_fused_form
    s = act.standalone(T, T)
    assert not s.is_fused_form and s.alpha == 0.3 and s.fused() == act
    # the fused form still goes into a convolution; the standalone one is refused there
    t = dml.TensorDesc("float32", (1, 1, 4))
    w = dml.TensorDesc("float32", (1, 1, 1))
    dml.ConvolutionOperatorDesc(t, w, None, t, fused_activation=act).validate()
    with pytest.raises(ValidationError, match="fused_activation.input_tensor"):
        dml.ConvolutionOperatorDesc(t, w, None, t, fused_activation=s).validate()


# -- SWISH and HARD_SWISH (feature level 6_2): operators only, not fusable --------------------
SWISH_TORCH = {
    "swish": [({}, lambda t: torch.nn.functional.silu(t)),
              (dict(sigmoid_input_scale=1.702), lambda t: t * torch.sigmoid(1.702 * t))],
    "hard_swish": [({}, torch.nn.functional.hardswish),
                   (dict(alpha=0.25, beta=0.4),
                    lambda t: t * torch.clamp(0.25 * t + 0.4, 0.0, 1.0))],
}


@pytest.mark.parametrize("name", list(SWISH_TORCH))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_swish_against_pytorch(device, name, dtype):
    """The pages' formulas: x * Sigmoid(SigmoidInputScale * x) and
    x * HardSigmoid(x, Alpha, Beta), defaults 1.0 and 1/6, 0.5, against PyTorch in
    float64; a strided (transposed) input as well."""
    x = np.concatenate([POINTS[np.abs(POINTS) < 60], [-95.0, 95.0, -1e4]]).astype(dtype)
    for params, fn in SWISH_TORCH[name]:
        got = vkml.activation(x, name, device=device, **params)
        want = fn(torch.from_numpy(x.astype(np.float64))).numpy()
        tol = dict(rtol=3e-5, atol=2e-6) if dtype == "float32" else dict(rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(got.astype(np.float64), want, **tol, err_msg=str(params))
    rng = np.random.default_rng(2)
    a = (rng.standard_normal((6, 5)) * 4).astype(np.float32)
    t_in = dml.TensorDesc("float32", (5, 6), (1, 5))
    desc = dml.OPERATOR_ACTIVATIONS[name](t_in, dml.TensorDesc("float32", (5, 6)))
    got = _run(device, desc, a.reshape(-1), 30).reshape(5, 6)
    want = SWISH_TORCH[name][0][1](torch.from_numpy(a.T.astype(np.float64))).numpy()
    np.testing.assert_allclose(got, want, rtol=3e-5, atol=2e-6)


def test_swish_is_not_fusable(device):
    """dml-fused-activations.md does not list SWISH or HARD_SWISH: they are operators only."""
    assert "swish" not in dml.ACTIVATIONS and "hard_swish" not in dml.ACTIVATIONS
    assert dml.OPERATOR_ACTIVATIONS["swish"] is dml.ActivationSwishOperatorDesc
    for cls in (dml.ActivationSwishOperatorDesc, dml.ActivationHardSwishOperatorDesc):
        assert cls().feature_level() == dml.FeatureLevel.FL_6_2
        assert cls.OPERATOR_TYPE.startswith("DML_OPERATOR_ACTIVATION_")
        with pytest.raises(ValidationError, match="fused"):
            dml.activation(cls.OPERATOR_TYPE)
        t = dml.TensorDesc("float32", (1, 1, 4))
        w = dml.TensorDesc("float32", (1, 1, 1))
        with pytest.raises(ValidationError) as info:
            dml.ConvolutionOperatorDesc(t, w, None, t, fused_activation=cls()).validate()
        assert "fused_activation" in info.value.field
    x = np.zeros((1, 1, 4), np.float32)
    with pytest.raises(ValidationError):
        vkml.convolution(x, np.ones((1, 1, 1), np.float32), fused_activation="swish",
                         device=device)
    assert dml.activation("hard_swish", fusable=False) == dml.ActivationHardSwishOperatorDesc()


@pytest.mark.parametrize("name", ["swish", "hard_swish"])
@pytest.mark.parametrize("fuser", ["convolution", "gemm", "batch_normalization", "add1"])
def test_operator_only_activations_are_not_fused(name, fuser):
    """dml-fused-activations.md does not list SWISH or HARD_SWISH: every operator that
    takes a fused activation refuses them, naming fused_activation."""
    from vkml.dml.activations import OPERATOR_ACTIVATIONS
    act = next(c for c in OPERATOR_ACTIVATIONS.values() if c.SPEC.name == name)()
    T = lambda *s: vkml.dml.TensorDesc("float32", s)        # noqa: E731
    x, one = T(1, 1, 4, 4), T(1, 1, 1, 1)
    make = {
        "convolution": lambda: vkml.dml.ConvolutionOperatorDesc(
            x, T(1, 1, 3, 3), None, T(1, 1, 2, 2), fused_activation=act),
        "gemm": lambda: vkml.dml.GemmOperatorDesc(T(1, 1, 4, 3), T(1, 1, 3, 5), None,
                                                  T(1, 1, 4, 5), fused_activation=act),
        "batch_normalization": lambda: vkml.dml.BatchNormalizationOperatorDesc(
            x, one, one, one, one, x, fused_activation=act),
        "add1": lambda: vkml.dml.ElementWiseAdd1OperatorDesc(x, x, x, fused_activation=act),
    }[fuser]
    with pytest.raises(vkml.ValidationError, match="fused_activation"):
        make().validate()

"""The activations fusable into Convolution (dml-fused-activations.md), each against the
formula of its own page (tests/references.py, written independently of vkml).

The convolution under test is a 1x1 identity (one channel, weight 1, no bias), so the
activation sees the chosen points exactly; a second test fuses each activation into a
random convolution on every kernel path.
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.errors import ValidationError

from helpers import compile_on_path, run_desc
from references import ACTIVATION_DEFAULTS, ACTIVATION_FORMULAS, convolution_reference

conv_ops = importlib.import_module("vkml.ops.convolution")   # vkml.ops.convolution: the function

# name -> parameters to test besides the page's defaults (the formulas and defaults are
# ACTIVATION_FORMULAS / ACTIVATION_DEFAULTS of tests/references.py)
PARAMETERS = {
    "linear": dict(alpha=-1.5, beta=0.25), "hard_sigmoid": dict(alpha=0.3, beta=0.1),
    "scaled_tanh": dict(alpha=2.0, beta=1.5), "leaky_relu": dict(alpha=0.3),
    "thresholded_relu": dict(alpha=-0.5), "elu": dict(alpha=0.7), "celu": dict(alpha=2.5),
    "scaled_elu": dict(alpha=1.2, gamma=0.8), "softplus": dict(steepness=3.0),
    "parametric_softplus": dict(alpha=0.5, beta=2.0), "shrink": dict(bias=0.25, threshold=1.0),
    "clip": dict(min=-0.5, max=2.0, scale_bias=dml.ScaleBias(2.0, 0.5)),
}
FORMULAS = {name: (PARAMETERS.get(name, {}), formula)
            for name, formula in ACTIVATION_FORMULAS.items()}
DEFAULTS = ACTIVATION_DEFAULTS

POINTS = np.concatenate([np.linspace(-12, 12, 481), [0.0, -0.0, 1e-3, -1e-3, 1e-6, -1e-6,
                         0.5, -0.5, 1.0, -1.0, 40.0, -40.0, 95.0, -95.0]]).astype(np.float32)


def test_the_fusable_list_is_the_pages():
    assert list(dml.ACTIVATIONS) == list(FORMULAS)
    types = [s.operator_type for s in dml.ACTIVATION_TABLE.values()]
    assert types == ["DML_OPERATOR_ACTIVATION_" + n.upper() for n in FORMULAS if n != "clip"] \
        + ["DML_OPERATOR_ELEMENT_WISE_CLIP"]


@pytest.mark.parametrize("name", list(FORMULAS))
def test_defaults(name):
    cls = dml.ACTIVATIONS[name]
    desc = cls()
    assert desc.input_tensor is None and desc.output_tensor is None
    for field, value in DEFAULTS.get(name, {}).items():
        assert getattr(desc, field) == value, field
    assert dml.activation(name) == desc
    assert dml.activation(name.upper()) == desc
    assert dml.activation(cls.OPERATOR_TYPE) == desc


def _identity_conv(device, x, act, dtype="float32"):
    """x (1-D) through a 1x1 convolution with weight 1: the activation of x."""
    n = x.size
    desc = dml.ConvolutionOperatorDesc(
        dml.TensorDesc(dtype, (1, 1, n)), dml.TensorDesc(dtype, (1, 1, 1)), None,
        dml.TensorDesc(dtype, (1, 1, n)), fused_activation=act)
    got = run_desc(device, desc, x.reshape(1, 1, n).astype(dtype), np.ones((1, 1, 1), dtype))
    return got.reshape(-1)[:n]


@pytest.mark.parametrize("name", list(FORMULAS))
@pytest.mark.parametrize("which", ["defaults", "parameters"])
def test_formula(device, name, which):
    params, formula = FORMULAS[name]
    kwargs = DEFAULTS.get(name, {}) if which == "defaults" else params
    act = dml.ACTIVATIONS[name](**kwargs)
    got = _identity_conv(device, POINTS, act)
    with np.errstate(over="ignore"):
        want = formula(POINTS.astype(np.float64), **kwargs)
    # float32 transcendental functions: Vulkan allows exp/log a few ulp (more for large |x|)
    np.testing.assert_allclose(got, want, rtol=3e-5, atol=2e-6, err_msg=name)
    if which == "parameters" and not kwargs:
        return
    if name in ("identity", "relu"):      # exact
        np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("name", ["sigmoid", "gelu", "clip", "softplus"])
def test_formula_float16(device, name):
    """float16 output: the float32 activation rounded once (to nearest even)."""
    params, formula = FORMULAS[name]
    act = dml.ACTIVATIONS[name](**params)
    x = POINTS[np.abs(POINTS) < 60].astype(np.float16)
    got = _identity_conv(device, x, act, "float16")
    want = formula(x.astype(np.float64), **params)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("shape", ["dense", "depthwise"])
@pytest.mark.parametrize("name", list(FORMULAS))
def test_fused_in_every_path(device, name, shape):
    """Each activation inside a real convolution, on every kernel path that accepts the
    shape: 16 -> 16 channels 3x3 over 24x24 (direct, implicit GEMM, Winograd, tiled,
    blocked), and a depthwise 3x3 (direct, depthwise, tiled, blocked)."""
    params, formula = FORMULAS[name]
    act = dml.ACTIVATIONS[name](**params)
    rng = np.random.default_rng(list(FORMULAS).index(name))
    groups = 16 if shape == "depthwise" else 1
    x = rng.standard_normal((1, 16, 24, 24)).astype(np.float32)
    w = (rng.standard_normal((16, 16 // groups, 3, 3)) * 0.3).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    want = formula(convolution_reference(x, w, b, start=[1, 1], end=[1, 1], groups=groups),
                   **params)
    desc = dml.ConvolutionOperatorDesc(
        dml.TensorDesc("float32", x.shape), dml.TensorDesc("float32", w.shape),
        dml.TensorDesc("float32", (1, 16, 1, 1)), dml.TensorDesc("float32", x.shape),
        start_padding=(1, 1), end_padding=(1, 1), group_count=groups, fused_activation=act)
    geo = conv_ops.Geometry.of(desc)
    op = device.compile_operator(device.create_operator(desc))
    accepting = [p.name for p in conv_ops.PATHS if p.accepts(op, geo)]
    op.release()
    sg = conv_ops.subgroup_shuffle_size(op) >= 4
    assert set(accepting) == {"direct", "tiled", "blocked"} | (
        {"depthwise"} if groups > 1 else {"gemm", "winograd"} | ({"gemm_sg"} if sg else set()))
    for path in accepting:
        compiled = compile_on_path(device, desc, path)
        got = run_desc(device, desc, x, w, b, compiled=compiled)
        assert compiled.path.name == path
        np.testing.assert_allclose(got.reshape(x.shape), want, rtol=1e-4, atol=3e-4,
                                   err_msg=path)


def test_functional_names_and_instances(device):
    x = np.linspace(-3, 3, 16, dtype=np.float32).reshape(1, 1, 16)
    w = np.ones((1, 1, 1), np.float32)
    a = vkml.convolution(x, w, fused_activation="leaky_relu", device=device)
    np.testing.assert_allclose(a, np.where(x >= 0, x, 0.01 * x), rtol=1e-6)
    b = vkml.convolution(x, w, fused_activation=dml.ActivationLeakyReluOperatorDesc(alpha=0.5),
                         device=device)
    np.testing.assert_allclose(b, np.where(x >= 0, x, 0.5 * x), rtol=1e-6)
    c = vkml.convolution(x, w, fused_activation="DML_OPERATOR_ELEMENT_WISE_CLIP", device=device)
    np.testing.assert_array_equal(c, x)
    d = vkml.convolution(x, w, fused_activation=dml.ActivationEluOperatorDesc, device=device)
    np.testing.assert_allclose(d, np.where(x >= 0, x, np.expm1(x)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, kwargs, field", [
    ("elu", dict(alpha=float("nan")), "alpha"),
    ("linear", dict(beta=float("inf")), "beta"),
    ("leaky_relu", dict(alpha="0.1"), "alpha"),
    ("leaky_relu", dict(alpha=True), "alpha"),
    ("softplus", dict(steepness=0.0), "steepness"),
    ("celu", dict(alpha=0.0), "alpha"),
    ("clip", dict(min=float("nan")), "min"),
    ("clip", dict(scale_bias=dml.ScaleBias(1.0, float("nan"))), "scale_bias.bias"),
    ("clip", dict(scale_bias=1.0), "scale_bias"),
])
def test_parameter_validation(name, kwargs, field):
    desc = dml.ACTIVATIONS[name](**kwargs)

    def fail(f, rule):
        raise ValidationError(f, rule)

    with pytest.raises(ValidationError) as info:
        desc.validate_parameters(fail)
    assert info.value.field == field


def test_clip_infinite_bounds_are_allowed(device):
    act = dml.ElementWiseClipOperatorDesc(min=float("-inf"), max=1.0)
    got = _identity_conv(device, np.array([-1e30, 0.5, 3.0], np.float32), act)
    np.testing.assert_array_equal(got, np.array([-1e30, 0.5, 1.0], np.float32))


def test_standalone_descriptor_rules():
    """As an operator of its own, the tensors follow the pages' tensor constraints."""
    t = dml.TensorDesc("float32", (2, 3))
    dml.ActivationReluOperatorDesc(t, t).validate()
    with pytest.raises(ValidationError, match="output_tensor.sizes"):
        dml.ActivationReluOperatorDesc(t, dml.TensorDesc("float32", (3, 2))).validate()
    with pytest.raises(ValidationError, match="output_tensor.data_type"):
        dml.ActivationReluOperatorDesc(t, dml.TensorDesc("float16", (2, 3))).validate()
    with pytest.raises(ValidationError, match="input_tensor"):
        dml.ActivationReluOperatorDesc(None, t).validate()

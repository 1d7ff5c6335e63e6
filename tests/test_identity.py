"""DML_ELEMENT_WISE_IDENTITY (vkml.identity): strided copies of all 11 data types, bit for
bit (NaN payloads, -0, subnormals: raw bits from helpers.random_bits), transposes and
layout changes through strides with canaries in the output's gaps, windows at lowered
limits, ScaleBias on float types, and every rule of the page."""
from __future__ import annotations

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.errors import ArgumentTypeError, UnsupportedError, ValidationError

from helpers import ALL_DTYPES, random_bits, same_bits, strided_view

CANARY = 0xA5


def _copy(device, desc, flat, out_elems):
    op = device.compile_operator(device.create_operator(desc))
    try:
        dt = desc.output_tensor.dtype
        out = device.empty(out_elems, dt)
        out.write(np.full(out_elems * np.dtype(dt).itemsize, CANARY, np.uint8).view(dt))
        src = device.tensor(flat)
        op.execute([src], [out])
        assert same_bits(src.numpy(), flat), "the input changed"
        return out.numpy()
    finally:
        op.release()


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_functional_copies_bits(device, dtype):
    rng = np.random.default_rng(ALL_DTYPES.index(dtype))
    for shape in [(7,), (3, 5, 9)]:
        x = random_bits(rng, shape, dtype)
        got = vkml.identity(x, device=device)
        assert same_bits(got, x)
    t = vkml.tensor(x, device=device)
    y = vkml.identity(t)
    assert isinstance(y, vkml.Tensor) and same_bits(y.numpy(), x)


@pytest.mark.parametrize("dtype", ["float64", "float16", "int8", "uint32"])
@pytest.mark.parametrize("kind", ["padded", "broadcast", "permuted"])
def test_strided_copy(device, dtype, kind):
    """Input layouts (padded rows, a broadcast dimension, a permutation: a transpose)
    into an output whose every other element is a gap that must keep its canary."""
    rng = np.random.default_rng(len(kind) * 7 + np.dtype(dtype).itemsize)
    shape = (2, 3, 4, 5)
    flat, strides, logical = strided_view(rng, shape, dtype, kind)
    out_st = (3 * 4 * 10, 4 * 10, 10, 2)
    out_elems = shape[0] * out_st[0]
    desc = dml.ElementWiseIdentityOperatorDesc(dml.TensorDesc(dtype, shape, strides),
                                               dml.TensorDesc(dtype, shape, out_st))
    got = _copy(device, desc, flat, out_elems)
    idx = sum(np.arange(s).reshape([-1 if i == d else 1 for i in range(4)]) * st
              for d, (s, st) in enumerate(zip(shape, out_st)))
    assert same_bits(got[idx], logical)
    gaps = np.ones(out_elems, bool)
    gaps[idx.reshape(-1)] = False
    assert (got[gaps].view(np.uint8) == CANARY).all()


@pytest.mark.parametrize("dtype", ["int64", "uint16"])
def test_transpose_in_windows(device, dtype):
    """A transpose (output packed, input read across) bound in windows with split grids."""
    rng = np.random.default_rng(9)
    x = random_bits(rng, (40, 60), dtype)
    shape = (60, 40)
    desc = dml.ElementWiseIdentityOperatorDesc(dml.TensorDesc(dtype, shape, (1, 60)),
                                               dml.TensorDesc(dtype, shape))
    align = device._ctx.binding_alignment()
    limits = {"maxStorageBufferRange": x.nbytes // 3 + 4 * align,
              "maxComputeWorkGroupCount": (2, 2, 2)}
    with vkml.Device(device.index, limits=limits) as dev:
        import importlib
        cls = importlib.import_module("vkml.ops.element_wise").CompiledElementWise
        op = cls(dev, dev.create_operator(desc).desc)
        try:
            assert op.windows is not None and len(op.windows) > 1
            out = dev.empty(shape, dtype)
            op.execute([dev.tensor(x.reshape(-1))], [out])
            assert same_bits(out.numpy(), x.T)
        finally:
            op.release()
        assert same_bits(vkml.identity(x, device=dev), x)        # flat, in windows


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_scale_bias(device, dtype):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, 33)) * 3).astype(dtype)
    for sb in [dml.ScaleBias(2.5, -1.0), (0.5, 3.0)]:
        got = vkml.identity(x, sb, device=device)
        s, b = (sb.scale, sb.bias) if isinstance(sb, dml.ScaleBias) else sb
        want = (x.astype(np.float32) * np.float32(s) + np.float32(b)).astype(dtype)
        tol = 1e-6 if dtype == "float32" else 1e-3
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                                   atol=tol)


# -- validation ------------------------------------------------------------------------------
T = dml.TensorDesc("float32", (2, 3, 4))


@pytest.mark.parametrize("case", ["sizes", "rank", "data_type", "no_input", "no_output",
                                  "overlap"])
def test_tensor_rules(device, case):
    inp, out, field = {
        "sizes": (T, dml.TensorDesc("float32", (2, 3, 5)), "output_tensor.sizes"),
        "rank": (T, dml.TensorDesc("float32", (2, 3, 4, 1)), "output_tensor.sizes"),
        "data_type": (T, dml.TensorDesc("int32", (2, 3, 4)), "output_tensor.data_type"),
        "no_input": (None, T, "input_tensor"),
        "no_output": (T, None, "output_tensor"),
        "overlap": (T, dml.TensorDesc("float32", (2, 3, 4), (1, 1, 1)), "output_tensor.strides"),
    }[case]
    with pytest.raises(ValidationError) as info:
        device.create_operator(dml.ElementWiseIdentityOperatorDesc(inp, out))
    assert info.value.field == f"ElementWiseIdentityOperatorDesc.{field}", str(info.value)
    assert same_bits(vkml.identity(np.arange(3, dtype=np.int8), device=device),
                     np.arange(3, dtype=np.int8))


@pytest.mark.parametrize("sb, t, field, error", [
    (dml.ScaleBias(float("nan"), 0.0), T, "scale_bias.scale", ValidationError),
    (dml.ScaleBias(1.0, float("inf")), T, "scale_bias.bias", ValidationError),
    (dml.ScaleBias("2", 0.0), T, "scale_bias.scale", ArgumentTypeError),
    ((2.0, 1.0), T, "scale_bias", ArgumentTypeError),
    (dml.ScaleBias(2.0, 1.0), dml.TensorDesc("int32", (2, 3, 4)), "scale_bias", ValidationError),
])
def test_scale_bias_rules(device, sb, t, field, error):
    with pytest.raises(error) as info:
        device.create_operator(dml.ElementWiseIdentityOperatorDesc(t, t, sb))
    assert info.value.field == f"ElementWiseIdentityOperatorDesc.{field}", str(info.value)


def test_scale_bias_float64_unsupported(device):
    t = dml.TensorDesc("float64", (4,))
    with pytest.raises(UnsupportedError):
        vkml.identity(np.ones(4), (2.0, 0.0), device=device)
    assert dml.ElementWiseIdentityOperatorDesc(t, t).feature_level() == dml.FeatureLevel.FL_4_1
    with pytest.raises(ArgumentTypeError):
        vkml.identity(np.ones(4, np.float32), (1.0,), device=device)

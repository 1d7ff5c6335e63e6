"""The depthwise ``rows`` kernel (tuning candidates depthwise-rows*, knob ``dw_rows``:
a rolled loop over a band's output rows, KH input rows in registers) forced by name
against the float64 reference on every device: odd widths (column tails, scalar rows
and stores), float4 rows and stores, band remainders, strides and dilations along w,
channel multipliers, asymmetric padding, convolution mode (flipped filter), 1-D, a
fused activation, float32 and float16; and the geometries it declines."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.errors import UnsupportedError

from helpers import compile_on_path, run_desc
from test_convolution import desc_reference, tolerance

conv_ops = importlib.import_module("vkml.ops.convolution")
conv_choice = importlib.import_module("vkml.ops.convolution.choice")

ROWS = [n for n in conv_ops.CANDIDATES if n.startswith("depthwise-rows")
        and not conv_ops.CANDIDATES[n][1].get("dw_v8")]

CASES = [
    ((2, 3, 19, 13), (3, 1, 3, 3), dict(group_count=3, start_padding=(1, 1),
                                        end_padding=(1, 1))),
    ((1, 2, 9, 24), (6, 1, 3, 5), dict(group_count=2, strides=(1, 2), dilations=(1, 2),
                                       start_padding=(1, 3), end_padding=(1, 0),
                                       mode="convolution")),
    ((1, 4, 33, 32), (4, 1, 3, 3), dict(group_count=4, start_padding=(1, 1),
                                        end_padding=(1, 1), fused_activation="leaky_relu")),
    ((2, 4, 30), (8, 1, 5), dict(group_count=4, strides=(3,), start_padding=(2,))),
    ((1, 3, 11, 21), (3, 1, 5, 2), dict(group_count=3, start_padding=(2, 0),
                                        end_padding=(1, 1))),
]


def _desc(dtype, x_shape, w_shape, fused_activation=None, **kw):
    xd, wd = dml.TensorDesc(dtype, x_shape), dml.TensorDesc(dtype, w_shape)
    out = dml.ConvolutionOperatorDesc(xd, wd, None, xd, **kw).expected_output_sizes()
    bd = dml.TensorDesc(dtype, (1, out[1]) + (1,) * (len(x_shape) - 2))
    if fused_activation is not None:
        kw["fused_activation"] = fused_activation
    return dml.ConvolutionOperatorDesc(xd, wd, bd, dml.TensorDesc(dtype, out), **kw)


@pytest.mark.parametrize("candidate", ROWS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_rows_matches_the_reference(device, case, candidate):
    xs, ws, kw = CASES[case]
    rng = np.random.default_rng(90 + case)
    for dtype in ("float32", "float16"):
        desc = _desc(dtype, xs, ws, **kw)
        x = rng.standard_normal(xs).astype(dtype)
        w = rng.standard_normal(ws).astype(dtype)
        b = rng.standard_normal(desc.output_tensor.sizes[1]).astype(dtype)
        op = compile_on_path(device, desc, candidate)
        assert op.path.candidate == candidate and op.path.nb % 4 == 0
        most, band = conv_ops.CANDIDATES[candidate][1]["dw_rows"]
        assert op.path.nb <= most and op.path.R <= band
        got = run_desc(device, desc, x, w, b, compiled=op)
        ref = desc_reference(desc, x, w, b)
        if kw.get("fused_activation"):
            ref = np.where(ref >= 0, ref, 0.01 * ref)
        np.testing.assert_allclose(got[:ref.size].reshape(ref.shape).astype(np.float64),
                                   ref, err_msg=f"{candidate} {dtype}", **tolerance(w, dtype))


@pytest.mark.parametrize("kw", [dict(strides=(2, 1)), dict(dilations=(2, 1))])
def test_rows_declines_strided_or_dilated_rows(device, kw):
    desc = _desc("float32", (1, 2, 9, 8), (2, 1, 3, 3), group_count=2, **kw)
    with pytest.raises(UnsupportedError):
        compile_on_path(device, desc, "depthwise-rows")
    op = compile_on_path(device, desc, "depthwise")      # the default path still runs it
    op.release()


def test_fast_list_times_rows_next_to_depthwise(device):
    desc = _desc("float32", (1, 8, 9, 9), (8, 1, 3, 3), group_count=8,
                 start_padding=(1, 1), end_padding=(1, 1))
    fast = conv_choice._fast(desc, device)
    assert fast[:2] == ("depthwise", "depthwise-rows")
    strided = _desc("float32", (1, 8, 9, 9), (8, 1, 3, 3), group_count=8, strides=(2, 2))
    assert "depthwise-rows" not in conv_choice._fast(strided, device)


# depthwise-rows-v8 (knob ``dw_v8``: eight float32 outputs a u64vec4 store, int64 shaders):
# strips of NB = 8k (u64vec4s only: 24, 32) and 8k + 4 (20: even strips end, odd strips
# start with a u64vec2), 2 and 4 strips a row, a channel multiplier, flipped filter,
# activation, 1-D
V8_CASES = [
    ((1, 3, 7, 40), (3, 1, 3, 3), dict(group_count=3, start_padding=(1, 1),
                                       end_padding=(1, 1))),                       # NB 20
    ((2, 2, 6, 48), (2, 1, 3, 5), dict(group_count=2, start_padding=(1, 2), end_padding=(1, 2),
                                       fused_activation="leaky_relu")),            # NB 24
    ((1, 2, 5, 82), (4, 1, 3, 3), dict(group_count=2, start_padding=(0, 0),
                                       mode="convolution")),                       # NB 20 x 4
    ((2, 3, 64), (3, 1, 3), dict(group_count=3, start_padding=(2,), end_padding=(0,))),  # NB 32
]


@pytest.mark.parametrize("case", range(len(V8_CASES)))
def test_rows_v8_matches_the_reference(device, case):
    xs, ws, kw = V8_CASES[case]
    desc = _desc("float32", xs, ws, **kw)
    if not device.context.features.get("int64"):
        with pytest.raises(UnsupportedError):     # (SwiftShader: no shaderInt64)
            compile_on_path(device, desc, "depthwise-rows-v8")
        return
    rng = np.random.default_rng(70 + case)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(desc.output_tensor.sizes[1]).astype(np.float32)
    op = compile_on_path(device, desc, "depthwise-rows-v8")
    assert op.path.v8 and op.path.nb % 4 == 0 and op.path.strips >= 2
    got = run_desc(device, desc, x, w, b, compiled=op)
    ref = desc_reference(desc, x, w, b)
    if kw.get("fused_activation"):
        ref = np.where(ref >= 0, ref, 0.01 * ref)
    np.testing.assert_allclose(got.reshape(ref.shape).astype(np.float64), ref, **tolerance(w))


@pytest.mark.parametrize("width", [28, 12])
def test_rows_v8_on_rows_of_8k_plus_4(device, width):
    """Rows of 28 (one strip a row) and 12 outputs: every other row starts 4 past a
    group of 8, so its strip stores the u64vec2 first (the parity read off the offset);
    the same bits as the float4 stores of depthwise-rows, and the reference."""
    desc = _desc("float32", (2, 3, 9, width), (3, 1, 3, 3), group_count=3,
                 start_padding=(1, 1), end_padding=(1, 1), fused_activation="relu")
    if not device.context.features.get("int64"):
        with pytest.raises(UnsupportedError):
            compile_on_path(device, desc, "depthwise-rows-v8")
        return
    rng = np.random.default_rng(width)
    x = rng.standard_normal(desc.input_tensor.sizes).astype(np.float32)
    w = rng.standard_normal(desc.filter_tensor.sizes).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    op = compile_on_path(device, desc, "depthwise-rows-v8")
    assert op.path.v8 and op.path.nb % 8 == 4
    got = run_desc(device, desc, x, w, b, compiled=op)
    four = run_desc(device, desc, x, w, b,
                    compiled=compile_on_path(device, desc, "depthwise-rows"))
    np.testing.assert_array_equal(got, four)
    ref = np.maximum(desc_reference(desc, x, w, b), 0)
    np.testing.assert_allclose(got.reshape(ref.shape).astype(np.float64), ref, **tolerance(w))


def test_rows_v8_declines(device):
    """Output rows not a multiple of 4 (of 8 where the strips are of 8k), float16, or no
    int64: UnsupportedError."""
    odd = _desc("float32", (1, 2, 6, 10), (2, 1, 3, 3), group_count=2, start_padding=(1, 1),
                end_padding=(1, 1))
    half = _desc("float16", (1, 2, 6, 16), (2, 1, 3, 3), group_count=2, start_padding=(1, 1),
                 end_padding=(1, 1))
    for desc in (odd, half):
        with pytest.raises(UnsupportedError):
            compile_on_path(device, desc, "depthwise-rows-v8")
    fits = _desc("float32", (1, 2, 6, 16), (2, 1, 3, 3), group_count=2)
    with vkml.Device(device.index, disable_features=["int64"]) as dev:
        with pytest.raises(UnsupportedError):
            compile_on_path(dev, fits, "depthwise-rows-v8")

"""DML_CONVOLUTION_OPERATOR_DESC and vkml.convolution, on every device.

Reference: ``convolution_reference`` of tests/references.py in float64 (NumPy, checked
against PyTorch's ``conv{1,2,3}d`` / ``conv_transpose{1,2,3}d`` in test_references.py;
the tests named "against_torch" compare with it).  A few tests use torch directly.
"""
from __future__ import annotations

import dataclasses
import importlib
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vkml
from vkml import dml
from vkml.intmath import ceil_div
from vkml.errors import ValidationError

from helpers import compile_on_path, conv_add_relu_graph, run_desc, run_into_nan
from references import convolution_reference

conv_ops = importlib.import_module("vkml.ops.convolution")   # vkml.ops.convolution: the function

def tolerance(w, dtype=np.float32):
    """float32: accumulation error of a dot product of len(filter window) terms;
    float16 adds the final rounding (2^-11 relative) and the rounding of a float16 sum."""
    terms = math.prod(w.shape[1:]) if w.ndim else 1
    if np.dtype(dtype) == np.float16:
        return dict(rtol=2e-3, atol=2e-3 * math.sqrt(terms))
    return dict(rtol=1e-5, atol=2e-5 * math.sqrt(terms))


def run_path(device, desc, *arrays, path):
    """(output, compiled operator) of ``desc`` run on the kernel path named ``path``."""
    compiled = compile_on_path(device, desc, path)
    return run_desc(device, desc, *arrays, compiled=compiled), compiled


def random_case(rng, small: bool):
    """A random valid configuration (kwargs of vkml.convolution plus arrays)."""
    while True:
        nd = int(rng.integers(1, 4))
        backward = bool(rng.integers(0, 2))
        g = int(rng.choice([1, 1, 2, 3]))
        cin = g * int(rng.integers(1, 3 if small else 5))
        cout = g * int(rng.integers(1, 3 if small else 5))
        n = int(rng.integers(1, 3))
        hi = {1: 12, 2: 7, 3: 5}[nd] if small else {1: 24, 2: 12, 3: 7}[nd]
        sp = [int(rng.integers(1, hi)) for _ in range(nd)]
        k = [int(rng.integers(1, 4)) for _ in range(nd)]
        s = [int(rng.integers(1, 4)) for _ in range(nd)]
        d = [int(rng.integers(1, 3)) for _ in range(nd)]
        st = [int(rng.integers(0, 3)) for _ in range(nd)]
        en = [int(rng.integers(0, 3)) for _ in range(nd)]
        op = [int(rng.integers(0, 3)) if rng.random() < 0.3 else 0 for _ in range(nd)]
        for i in range(nd):
            if backward:
                full = (sp[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1
                ok = full - st[i] - en[i] >= 1
            else:
                ok = sp[i] + st[i] + en[i] >= d[i] * (k[i] - 1) + 1
            if not ok:
                break
        else:
            wshape = ((cin, cout // g) if backward else (cout, cin // g)) + tuple(k)
            x = rng.standard_normal((n, cin, *sp)).astype(np.float32)
            w = rng.standard_normal(wshape).astype(np.float32)
            b = rng.standard_normal(cout).astype(np.float32) if rng.random() < 0.6 else None
            mode = "convolution" if rng.random() < 0.3 else "cross_correlation"
            return dict(x=x, w=w, b=b, strides=s, dilations=d, start=st, end=en, outpad=op,
                        groups=g, mode=mode, direction="backward" if backward else "forward")


def call(case, device, **extra):
    return vkml.convolution(case["x"], case["w"], case["b"], strides=case["strides"],
                            dilations=case["dilations"], start_padding=case["start"],
                            end_padding=case["end"], output_padding=case["outpad"],
                            group_count=case["groups"], mode=case["mode"],
                            direction=case["direction"], device=device, **extra)


def expect(case):
    return convolution_reference(case["x"], case["w"], case["b"], case["strides"],
                                 case["dilations"], case["start"], case["end"], case["outpad"],
                                 case["groups"], case["mode"],
                     case["direction"])


# -- correctness ----------------------------------------------------------------------------
def test_random_against_torch(device, budget):
    """The whole parameter space: 1-3 spatial dims, batch, both directions and modes,
    groups, strides, dilations, asymmetric padding, output padding, optional bias."""
    rng = np.random.default_rng(5)
    small = budget < 40
    for _ in range(budget * 2):
        case = random_case(rng, small)
        got = call(case, device)
        np.testing.assert_allclose(got, expect(case), **tolerance(case["w"]),
                                   err_msg=str({k: v for k, v in case.items()
                                                if k not in ("x", "w", "b")}))


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_each_rank_and_direction(device, nd, direction):
    rng = np.random.default_rng(nd)
    sp = {1: (9,), 2: (6, 5), 3: (4, 5, 3)}[nd]
    k = {1: (3,), 2: (3, 2), 3: (2, 3, 2)}[nd]
    x = rng.standard_normal((2, 4) + sp).astype(np.float32)
    g = 2       # forward filter (C_out=6, C_in/g=2, ...); backward (C_in=4, C_out/g=3, ...)
    w = rng.standard_normal(((4, 3) if direction == "backward" else (6, 2)) + k).astype(
        np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    kw = dict(strides=[2] * nd, dilations=[1] * (nd - 1) + [2], start_padding=[1] * nd,
              end_padding=[0] * (nd - 1) + [2], group_count=g, direction=direction)
    got = vkml.convolution(x, w, b, **kw, device=device)
    ref = convolution_reference(x, w, b, [2] * nd, [1] * (nd - 1) + [2], [1] * nd,
                                [0] * (nd - 1) + [2], None, g, "cross_correlation", direction)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, **tolerance(w))


def test_mode_table(device):
    """The page's mode-interaction table on a 1-D asymmetric kernel, values by hand.

    x = [1, 2, 3, 4], w = [1, 10, 100]:
    * cross-correlation forward (identity orientation): y[o] = sum_k x[o+k] w[k]
    * convolution forward (flipped): y[o] = sum_k x[o+k] w[2-k]
    * cross-correlation backward (ConvTranspose): y[i+k] += x[i] w[k]
    * convolution backward (identity orientation of the flipped one): y[i+k] += x[i] w[2-k]
    """
    x = np.array([[[1, 2, 3, 4]]], np.float32)
    w = np.array([[[1, 10, 100]]], np.float32)
    table = {
        ("cross_correlation", "forward"): [1 + 20 + 300, 2 + 30 + 400],
        ("convolution", "forward"): [100 + 20 + 3, 200 + 30 + 4],
        ("cross_correlation", "backward"): [1, 12, 123, 234, 340, 400],
        ("convolution", "backward"): [100, 210, 321, 432, 43, 4],
    }
    for (mode, direction), want in table.items():
        got = vkml.convolution(x, w, mode=mode, direction=direction, device=device)
        np.testing.assert_array_equal(got[0, 0], np.array(want, np.float32), err_msg=mode + direction)
        ref = convolution_reference(x, w, mode=mode, direction=direction)
        np.testing.assert_array_equal(got, ref.astype(np.float32))
    # the DML enum members and names work as well as the strings
    got = vkml.convolution(x, w, mode=dml.ConvolutionMode.CONVOLUTION,
                           direction="DML_CONVOLUTION_DIRECTION_BACKWARD", device=device)
    np.testing.assert_array_equal(got[0, 0], table[("convolution", "backward")])


def test_mode_table_2d_3d(device):
    """Flipping is along every spatial axis, in both directions."""
    rng = np.random.default_rng(3)
    for nd in (2, 3):
        x = rng.standard_normal((1, 2) + (4,) * nd).astype(np.float32)
        for direction in ("forward", "backward"):
            chans = (2, 3) if direction == "backward" else (3, 2)    # C_in=2, C_out=3
            ww = rng.standard_normal(chans + (2, 3, 2)[:nd]).astype(np.float32)
            for mode in ("convolution", "cross_correlation"):
                got = vkml.convolution(x, ww, mode=mode, direction=direction, device=device)
                np.testing.assert_allclose(
                    got, convolution_reference(x, ww, mode=mode, direction=direction),
                    **tolerance(ww))


def test_depthwise_and_channel_multiplier(device):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 6, 9, 8)).astype(np.float32)
    for mult in (1, 3):                            # depthwise, then 3 outputs per channel
        w = rng.standard_normal((6 * mult, 1, 3, 3)).astype(np.float32)
        b = rng.standard_normal(6 * mult).astype(np.float32)
        got = vkml.convolution(x, w, b, start_padding=[1, 1], end_padding=[1, 1],
                               group_count=6, device=device)
        np.testing.assert_allclose(
            got, convolution_reference(x, w, b, start=[1, 1], end=[1, 1], groups=6),
            **tolerance(w))
        # transposed depthwise
        wt = rng.standard_normal((6, mult, 3, 3)).astype(np.float32)
        got = vkml.convolution(x, wt, strides=[2, 2], group_count=6, direction="backward",
                               device=device)
        np.testing.assert_allclose(got, convolution_reference(x, wt, strides=[2, 2], groups=6,
                                                  direction="backward"), **tolerance(wt))


def test_bias_shapes(device):
    """Bias as (C_out,) or the DML shape (1, C_out, 1, 1): the same result."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 3, 5, 5)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    a = vkml.convolution(x, w, b, device=device)
    c = vkml.convolution(x, w, b.reshape(1, 4, 1, 1), device=device)
    np.testing.assert_array_equal(a, c)
    np.testing.assert_allclose(a, convolution_reference(x, w, b), **tolerance(w))


def test_transposed_output_padding_holds_values(device):
    """Positions added by output_padding hold what ConvTranspose puts there (torch's
    output_padding with symmetric padding), not zeros."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 2, 4, 5)).astype(np.float32)
    w = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    got = vkml.convolution(x, w, b, strides=[3, 2], start_padding=[2, 1], end_padding=[2, 1],
                           output_padding=[2, 1], direction="backward", device=device)
    want = F.conv_transpose2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                              torch.from_numpy(b).double(), stride=(3, 2), padding=(2, 1),
                              output_padding=(2, 1)).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, **tolerance(w))
    assert np.abs(got[0, :, -1, :] - b[:, None]).max() > 1e-3   # real contributions there


def test_forward_output_padding_is_zero_padding_plus_bias(device):
    """Forward: the added positions are the literal zero padding of the result, then the
    bias and the activation like every output element (documented choice)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 6)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3)).astype(np.float32)
    b = np.array([0.5, -2.0, 1.5], np.float32)
    got = vkml.convolution(x, w, b, output_padding=[2], fused_activation="relu", device=device)
    assert got.shape == (1, 3, 6)
    np.testing.assert_allclose(got[..., :4], np.maximum(convolution_reference(x, w, b), 0),
                               **tolerance(w))
    np.testing.assert_array_equal(got[0, :, 4:], np.maximum(b, 0)[:, None].repeat(2, 1))


@pytest.mark.parametrize("packed", [False, True])
def test_float16(device, budget, packed):
    """float16 tensors, float32 accumulation: within 2^-9 relative + 2e-3*sqrt(terms)
    absolute of the float64 result of the same float16 inputs.  ``packed`` forces the
    path of devices without 16-bit storage (halves packed in 32-bit words)."""
    if packed and device.features.get("storage16"):
        dev = vkml.Device(device.index, disable_features=["storage16", "storage8"])
    elif packed:
        dev = device                         # already the packed path (SwiftShader)
    else:
        dev = device
    try:
        rng = np.random.default_rng(21 + packed)
        for _ in range(max(3, budget // 4)):
            case = random_case(rng, True)
            for k in ("x", "w", "b"):
                if case[k] is not None:
                    case[k] = case[k].astype(np.float16)
            got = call(case, dev)
            assert got.dtype == np.float16
            ref = expect(case)
            np.testing.assert_allclose(got.astype(np.float64), ref, **tolerance(case["w"],
                                                                                 np.float16))
    finally:
        if dev is not device:
            dev.close()


def test_float16_rounding_is_to_nearest_even(device):
    """The float32 result is rounded to nearest even: 1 + 2^-11 (a tie) -> 1,
    1 + 3*2^-11 (a tie) -> 1 + 2^-9... via a 1x1 convolution summing two exact halves."""
    x = np.array([[[1.0], [2.0 ** -11]], [[1.0], [3 * 2.0 ** -11]]], np.float16)  # (2, 2, 1)
    w = np.ones((1, 2, 1), np.float16)
    got = vkml.convolution(x, w, device=device)
    assert got[0, 0, 0] == np.float16(1.0)
    assert got[1, 0, 0] == np.float16(1 + 2 * 2.0 ** -10)


def test_strided_tensors(device):
    """Any DML layout: a channels-last input, a padded filter, a strided bias and output."""
    rng = np.random.default_rng(4)
    n, c, h, wd, co = 2, 3, 5, 6, 4
    x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    w = rng.standard_normal((co, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    x_desc = dml.TensorDesc("float32", (n, c, h, wd), (h * wd * c, 1, wd * c, c))
    w_pad = np.zeros((co, c, 3, 4), np.float32)
    w_pad[..., :3] = w
    w_desc = dml.TensorDesc("float32", (co, c, 3, 3), (c * 12, 12, 4, 1))
    b_buf = np.zeros(2 * co, np.float32)
    b_buf[::2] = b
    b_desc = dml.TensorDesc("float32", (1, co, 1, 1), (0, 2, 0, 0))
    y_desc = dml.TensorDesc("float32", (n, co, h, wd), (co * h * wd * 2, h * wd * 2, wd * 2, 2))
    desc = dml.ConvolutionOperatorDesc(x_desc, w_desc, b_desc, y_desc,
                                       start_padding=(1, 1), end_padding=(1, 1))
    got = run_desc(device, desc, x_nhwc, w_pad, b_buf)
    got = np.lib.stride_tricks.as_strided(got, (n, co, h, wd),
                                          tuple(4 * s for s in y_desc.strides))
    np.testing.assert_allclose(got, convolution_reference(x, w, b, start=[1, 1], end=[1, 1]),
                               **tolerance(w))


def test_large_tensors_are_split(device):
    """Tensors larger than maxStorageBufferRange are bound a batch window at a time, and
    dispatches larger than maxComputeWorkGroupCount are split."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((5, 3, 7, 9)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    with vkml.Device(device.index, limits={"maxStorageBufferRange": 4096,
                                           "maxComputeWorkGroupCount": (1, 2, 3)}) as small:
        got = vkml.convolution(x, w, b, start_padding=[1, 0], strides=[1, 2], device=small)
        np.testing.assert_allclose(
            got, convolution_reference(x, w, b, start=[1, 0], strides=[1, 2]), **tolerance(w))
        got = vkml.convolution(x, w.transpose(1, 0, 2, 3).copy(), b, strides=[2, 1],
                               direction="backward", device=small)
        np.testing.assert_allclose(got, convolution_reference(x, w.transpose(1, 0, 2, 3), b,
                                                  strides=[2, 1], direction="backward"),
                                   **tolerance(w))


def test_winograd_declines_beyond_the_workgroup_count(device):
    """Winograd's transforms run their lanes along (channel, tiles) in x alone: where
    that exceeds maxComputeWorkGroupCount the path declines (forced: UnsupportedError
    naming the limit) and the heuristic's next path runs the shape, its padded copy split
    along x into dispatches within the limit; within the limit Winograd takes it."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 16, 48, 48)).astype(np.float32)   # 144 tiles: 576 lanes
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    desc = _conv_desc("float32", x.shape, w.shape, bias=False, start_padding=(1, 1),
                      end_padding=(1, 1))
    with vkml.Device(device.index, limits={"maxComputeWorkGroupCount": (8, 65535, 65535)}) as small:
        with pytest.raises(vkml.UnsupportedError, match="maxComputeWorkGroupCount"):
            compile_on_path(small, desc, "winograd")
        got = vkml.convolution(x, w, None, start_padding=[1, 1], end_padding=[1, 1],
                               device=small)
    np.testing.assert_allclose(got, convolution_reference(x, w, None, start=[1, 1], end=[1, 1]),
                               **tolerance(w))
    with vkml.Device(device.index, limits={"maxComputeWorkGroupCount": (9, 65535, 65535)}) as fits:
        compile_on_path(fits, desc, "winograd").release()


def test_device_tensors_stay_on_device(device):
    rng = np.random.default_rng(0)
    x = vkml.tensor(rng.standard_normal((1, 2, 5, 5)).astype(np.float32), device=device)
    w = vkml.tensor(rng.standard_normal((3, 2, 3, 3)).astype(np.float32), device=device)
    b = vkml.tensor(rng.standard_normal(3).astype(np.float32), device=device)
    y = vkml.convolution(x, w, b, fused_activation="tanh")
    assert isinstance(y, vkml.Tensor) and y.shape == (1, 3, 3, 3)
    np.testing.assert_allclose(
        y.numpy(), np.tanh(convolution_reference(x.numpy(), w.numpy(), b.numpy())),
        rtol=1e-5, atol=1e-5)


def test_dml_flow_and_replay(device):
    """create -> compile -> execute through the descriptor; a second execute replays."""
    rng = np.random.default_rng(9)
    xd = dml.TensorDesc("float32", (1, 2, 6, 6))
    wd = dml.TensorDesc("float32", (4, 1, 3, 3))
    bd = dml.TensorDesc("float32", (1, 4, 1, 1))
    yd = dml.TensorDesc("float32", (1, 4, 3, 3))
    desc = dml.ConvolutionOperatorDesc(
        xd, wd, bd, yd, dml.ConvolutionMode.CROSS_CORRELATION,
        dml.ConvolutionDirection.FORWARD, (2, 2), (1, 1), (1, 1), (0, 0), (0, 0), 2,
        dml.ActivationLeakyReluOperatorDesc(alpha=0.25))
    op = device.create_operator(desc)
    compiled = device.compile_operator(op)
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    tx, tw, tb = device.tensor(x), device.tensor(w), device.tensor(b)
    ty = device.empty((1, 4, 3, 3))
    for scale in (1, 2):          # the second execute replays with new input contents
        tx.write(x * scale)
        compiled.execute([tx, tw, tb], [ty])
        ref = convolution_reference(x * scale, w, b, strides=[2, 2], start=[1, 1], groups=2)
        np.testing.assert_allclose(ty.numpy(), np.where(ref >= 0, ref, 0.25 * ref),
                                   **tolerance(w))
    compiled.release()


# -- the fast paths -----------------------------------------------------------------------
def dense_case(rng, small: bool, dtype="float32"):
    """A random configuration with enough output channels per group for the dense paths,
    as a descriptor and its arrays."""
    while True:
        nd = int(rng.integers(1, 4))
        back = bool(rng.integers(0, 2))
        g = int(rng.choice([1, 1, 2]))
        cig, cog = int(rng.integers(1, 4 if small else 7)), int(rng.integers(4, 10 if small else 21))
        k = [int(rng.integers(1, 5)) for _ in range(nd)]
        s = [int(rng.integers(1, 4)) for _ in range(nd)]
        d = [int(rng.integers(1, 3)) for _ in range(nd)]
        hi = {1: 24, 2: 9, 3: 5} if small else {1: 48, 2: 16, 3: 8}
        sp = [int(rng.integers(1, hi[nd])) for _ in range(nd)]
        st = [int(rng.integers(0, 3)) for _ in range(nd)]
        en = [int(rng.integers(0, 3)) for _ in range(nd)]
        op = [int(rng.integers(0, 3)) if back and rng.random() < 0.4 else 0 for _ in range(nd)]
        n = int(rng.integers(1, 3))
        cin, cout = g * cig, g * cog
        xd = dml.TensorDesc(dtype, (n, cin, *sp))
        wd = dml.TensorDesc(dtype, ((cin, cog) if back else (cout, cig)) + tuple(k))
        kw = dict(strides=tuple(s), dilations=tuple(d), start_padding=tuple(st),
                  end_padding=tuple(en), output_padding=tuple(op), group_count=g,
                  mode="convolution" if rng.random() < 0.3 else "cross_correlation",
                  direction="backward" if back else "forward")
        out = dml.ConvolutionOperatorDesc(xd, wd, None, xd, **kw).expected_output_sizes()
        if min(out) < 1:
            continue
        bias = rng.random() < 0.6
        desc = dml.ConvolutionOperatorDesc(
            xd, wd, dml.TensorDesc(dtype, (1, cout) + (1,) * nd) if bias else None,
            dml.TensorDesc(dtype, out), **kw)
        x = rng.standard_normal(xd.sizes).astype(dtype)
        w = rng.standard_normal(wd.sizes).astype(dtype)
        b = rng.standard_normal(cout).astype(dtype) if bias else None
        return desc, x, w, b


def desc_reference(desc, x, w, b):
    return convolution_reference(x, w, b, list(desc.strides), list(desc.dilations),
                                 list(desc.start_padding), list(desc.end_padding),
                                 list(desc.output_padding), desc.group_count,
                                 desc.conv_mode.name.lower(), desc.conv_direction.name.lower())


def accepting_paths(device, desc):
    op = device.compile_operator(device.create_operator(desc))
    geo = conv_ops.Geometry.of(desc)
    names = [p.name for p in conv_ops.PATHS if p.accepts(op, geo)]
    op.release()
    return names


def winograd_case(rng, small: bool, dtype="float32"):
    """3x3 stride 1 with 16-24 channels and >= 32 output tiles (Winograd's domain)."""
    n = int(rng.integers(1, 3))
    cin, cout = int(rng.integers(16, 25)), int(rng.integers(16, 25))
    h, w = (int(rng.integers(18, 26)), int(rng.integers(18, 26))) if n == 1 else \
        (int(rng.integers(14, 20)), int(rng.integers(14, 20)))
    st = tuple(int(v) for v in rng.integers(0, 3, 2))
    en = tuple(int(v) for v in rng.integers(0, 3, 2))
    xd = dml.TensorDesc(dtype, (n, cin, h, w))
    wd = dml.TensorDesc(dtype, (cout, cin, 3, 3))
    mode = "convolution" if rng.random() < 0.3 else "cross_correlation"
    out = dml.ConvolutionOperatorDesc(xd, wd, None, xd, start_padding=st,
                                      end_padding=en).expected_output_sizes()
    bias = rng.random() < 0.6
    desc = dml.ConvolutionOperatorDesc(xd, wd, dml.TensorDesc(dtype, (1, cout, 1, 1)) if bias
                                       else None, dml.TensorDesc(dtype, out), mode=mode,
                                       start_padding=st, end_padding=en)
    return (desc, rng.standard_normal(xd.sizes).astype(dtype),
            rng.standard_normal(wd.sizes).astype(dtype),
            rng.standard_normal(cout).astype(dtype) if bias else None)


def depthwise_case(rng, small: bool, dtype="float32"):
    """Depthwise (group count = input channels), channel multiplier 1-3, any stride,
    dilation and padding, 1-3 spatial dims; rows sometimes a multiple of 4 (float4 paths)."""
    while True:
        nd = int(rng.integers(1, 4))
        c, m = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        k = [int(rng.integers(1, 6)) for _ in range(nd)]
        s = [int(rng.integers(1, 3)) for _ in range(nd)]
        d = [int(rng.integers(1, 3)) for _ in range(nd)]
        hi = {1: 40, 2: 14, 3: 7}[nd]
        sp = [int(rng.integers(1, hi)) for _ in range(nd)]
        if rng.random() < 0.5:
            sp[-1] = 4 * int(rng.integers(2, 6))
        st = [int(rng.integers(0, 3)) for _ in range(nd)]
        en = [int(rng.integers(0, 3)) for _ in range(nd)]
        n = int(rng.integers(1, 3))
        xd = dml.TensorDesc(dtype, (n, c, *sp))
        wd = dml.TensorDesc(dtype, (c * m, 1, *k))
        kw = dict(strides=tuple(s), dilations=tuple(d), start_padding=tuple(st),
                  end_padding=tuple(en), group_count=c,
                  mode="convolution" if rng.random() < 0.3 else "cross_correlation")
        probe = dml.ConvolutionOperatorDesc(xd, wd, None, xd, **kw)
        if min(probe.convolution_sizes()) < 1:
            continue
        bias = rng.random() < 0.6
        desc = dml.ConvolutionOperatorDesc(xd, wd, dml.TensorDesc(dtype, (1, c * m) + (1,) * nd)
                                           if bias else None,
                                           dml.TensorDesc(dtype, probe.expected_output_sizes()),
                                           **kw)
        return (desc, rng.standard_normal(xd.sizes).astype(dtype),
                rng.standard_normal(wd.sizes).astype(dtype),
                rng.standard_normal(c * m).astype(dtype) if bias else None)


CASES = {"gemm": dense_case, "gemm_sg": dense_case, "winograd": winograd_case,
         "depthwise": depthwise_case}


def path_tolerance(path, w, dtype="float32"):
    """Winograd F(4x4,3x3) adds its transforms' rounding: 10x the direct float32 bound."""
    tol = tolerance(w, dtype)
    if path == "winograd" and np.dtype(dtype) == np.float32:
        tol = {k: v * 10 for k, v in tol.items()}
    return tol


@pytest.mark.parametrize("path", list(CASES))
def test_fast_paths_against_torch(device, budget, path):
    """Each fast path, forced, over random configurations it accepts (gemm: forward and
    transposed, 1-3 spatial dims, groups, strides, dilations, padding, output padding;
    winograd: 3x3 stride 1 with padding; depthwise: multipliers, strides, dilations).
    Each case compiles its own pipelines: 24 cases at most on a fast device (with its
    bigger shapes), the budget (8) on a slow one."""
    rng = np.random.default_rng(31)
    done, tries = 0, 0
    count = min(budget, 24) if path != "winograd" else max(2, budget // 8)
    while done < count:
        tries += 1
        assert tries < 50 * count, f"no case {path} accepts"
        desc, x, w, b = CASES[path](rng, budget < 40)
        if path not in accepting_paths(device, desc):
            continue
        got, compiled = run_path(device, desc, x, w, b, path=path)
        assert compiled.path.name == path
        ref = desc_reference(desc, x, w, b)
        np.testing.assert_allclose(got[:ref.size].reshape(ref.shape), ref,
                                   **path_tolerance(path, w), err_msg=str(desc))
        done += 1


@pytest.mark.parametrize("path", list(CASES))
@pytest.mark.parametrize("case", ["float16", "float16-packed", "storage-buffers", "strided"])
def test_fast_path_variants(device, path, case):
    """Each fast path with float16 tensors (native and packed storage), with storage
    buffers where texel buffers are too small (maxTexelBufferElements), and with a
    strided (channels-last) input."""
    rng = np.random.default_rng(41)
    kwargs = {}
    if case == "float16-packed":
        kwargs["disable_features"] = ["storage16", "storage8"]
    if case == "storage-buffers":
        kwargs["limits"] = {"maxTexelBufferElements": 64}
    dtype = "float16" if case.startswith("float16") else "float32"
    if path == "gemm_sg" and case == "storage-buffers":
        pytest.skip("gemm_sg reads through texel views only (gemm is its fallback)")
    with vkml.Device(device.index, **kwargs) as dev:
        done = 0
        while done < (2 if path != "winograd" else 1):
            desc, x, w, b = CASES[path](rng, True, dtype)
            if path not in accepting_paths(dev, desc):
                continue
            if case == "strided":        # the same data through a channels-last layout
                perm = (0, *range(2, x.ndim), 1)
                buf = np.ascontiguousarray(x.transpose(perm))
                st = np.array(buf.strides)[np.argsort(perm)] // x.itemsize
                desc = dml.ConvolutionOperatorDesc(
                    dml.TensorDesc(dtype, x.shape, tuple(int(v) for v in st)),
                    *[getattr(desc, f.name) for f in dataclasses.fields(desc)][1:])
                got, compiled = run_path(dev, desc, buf, w, b, path=path)
            else:
                got, compiled = run_path(dev, desc, x, w, b, path=path)
            ref = desc_reference(desc, x, w, b)
            np.testing.assert_allclose(got[:ref.size].reshape(ref.shape).astype(np.float64), ref,
                                       **path_tolerance(path, w, dtype))
            done += 1


def _has_sg(device) -> bool:
    return conv_ops.subgroup_shuffle_size(_probe_op(device)) >= 4


def _conv_desc(dtype, x_shape, w_shape, bias=True, **kw):
    """A descriptor with the output size of the page's formula."""
    xd, wd = dml.TensorDesc(dtype, x_shape), dml.TensorDesc(dtype, w_shape)
    out = dml.ConvolutionOperatorDesc(xd, wd, None, xd, **kw).expected_output_sizes()
    cout = out[1]
    bd = dml.TensorDesc(dtype, (1, cout) + (1,) * (len(x_shape) - 2)) if bias else None
    return dml.ConvolutionOperatorDesc(xd, wd, bd, dml.TensorDesc(dtype, out), **kw)


def _check_forced(device, desc, path, rng, tol_scale=1.0):
    dtype = desc.input_tensor.dtype
    x = rng.standard_normal(desc.input_tensor.sizes).astype(dtype)
    w = rng.standard_normal(desc.filter_tensor.sizes).astype(dtype)
    b = (rng.standard_normal(desc.output_tensor.sizes[1]).astype(dtype)
         if desc.bias_tensor is not None else None)
    got, compiled = run_path(device, desc, x, w, b, path=path)
    assert compiled.path.name == conv_ops.CANDIDATES[path][0]
    ref = desc_reference(desc, x, w, b)
    tol = {k: v * tol_scale for k, v in tolerance(w, dtype).items()}
    np.testing.assert_allclose(got[:ref.size].reshape(ref.shape).astype(np.float64), ref,
                               err_msg=str(desc), **tol)
    return compiled


# (input, filter, descriptor fields): the subgroup's padding lanes (pixel blocks not a
# multiple of the subgroup size), output channels not a multiple of the block, C_in not
# a multiple of 4, batch, groups, strides and dilations, short rows (one block per row,
# NB not a multiple of 4), transposed phases, flipped kernels, 3-D
SG_EDGES = [
    ((2, 5, 7, 7), (20, 5, 3, 3), dict(start_padding=(1, 1), end_padding=(1, 1))),
    ((1, 6, 5, 13), (10, 3, 2, 3), dict(group_count=2, strides=(2, 1), dilations=(1, 2),
                                        mode="convolution")),
    ((2, 3, 9, 9), (7, 3, 1, 1), {}),
    ((1, 4, 6, 5), (4, 6, 4, 4), dict(strides=(2, 2), start_padding=(1, 1),
                                      end_padding=(1, 1), direction="backward")),
    ((1, 4, 5, 5), (4, 5, 3, 3), dict(strides=(3, 2), group_count=2, start_padding=(1, 0),
                                      end_padding=(0, 1), output_padding=(1, 1),
                                      direction="backward", mode="convolution")),
    ((1, 3, 4, 5, 6), (5, 3, 2, 3, 3), dict(start_padding=(1, 1, 1), end_padding=(0, 1, 1))),
]


@pytest.mark.parametrize("case", range(len(SG_EDGES)))
def test_gemm_sg_edges(device, case):
    """gemm_sg (the filter read in place, shared by subgroup shuffles) on edge shapes,
    float32 and float16, against torch."""
    xs, ws, kw = SG_EDGES[case]
    rng = np.random.default_rng(60 + case)
    for dtype in ("float32", "float16"):
        desc = _conv_desc(dtype, xs, ws, **kw)
        if not _has_sg(device):
            pytest.skip("no subgroup shuffles on this device")
        assert "gemm_sg" in accepting_paths(device, desc)
        _check_forced(device, desc, "gemm_sg", rng)


#: (input, filter, descriptor fields) whose gemm_sg loop takes several channels an
#: iteration (CU > 1: a 1x1 and a 3x3 with few pixels) or loads each column tap's pixels
#: on its own (a strided 1x3: the row span exceeds the products' operands)
SG_RUNS = SG_EDGES + [
    ((1, 16, 6, 10), (12, 16, 1, 1), {}),
    ((1, 8, 5, 7), (8, 8, 3, 3), dict(start_padding=(1, 1), end_padding=(1, 1))),
    ((1, 4, 3, 24), (8, 4, 1, 3), dict(strides=(1, 4))),
]


@pytest.mark.parametrize("case", range(len(SG_RUNS)))
def test_gemm_sg_step_order(device, case):
    """gemm_sg-step (knob ``sg_acc_run`` False: one channel and column tap at a time over
    the block) runs its own pipeline and gives the same bits as gemm_sg (each accumulator
    takes its products in the same order either way), float32 and float16, with and
    without a bias, and matches torch."""
    if not _has_sg(device):
        pytest.skip("no subgroup shuffles on this device")
    xs, ws, kw = SG_RUNS[case]
    for dtype in ("float32", "float16"):
        desc = _conv_desc(dtype, xs, ws, bias=case % 2 == 0, **kw)
        rng = np.random.default_rng(90 + case)
        x = rng.standard_normal(desc.input_tensor.sizes).astype(dtype)
        w = rng.standard_normal(desc.filter_tensor.sizes).astype(dtype)
        b = (rng.standard_normal(desc.output_tensor.sizes[1]).astype(dtype)
             if desc.bias_tensor is not None else None)
        a, run = run_path(device, desc, x, w, b, path="gemm_sg")
        c, step = run_path(device, desc, x, w, b, path="gemm_sg-step")
        assert run.path.name == step.path.name == "gemm_sg"
        assert all("ACC_RUN" not in d["constants"] for d in run.path.dispatches)
        assert all(d["constants"]["ACC_RUN"] == 0 for d in step.path.dispatches)
        np.testing.assert_array_equal(a, c, err_msg=str(desc))
        ref = desc_reference(desc, x, w, b)
        np.testing.assert_allclose(c[:ref.size].reshape(ref.shape).astype(np.float64), ref,
                                   err_msg=str(desc), **tolerance(w, dtype))


#: (input, filter, descriptor fields) of 1x1 convolutions whose gemm_sg loop takes 4 or 8
#: input channels an iteration with the filter's channels packed: W4 (a lane's weights of
#: four channels one RGBA32F fetch): a 112x112-like flat plane of whole float4s, 7x7
#: planes (49 pixels) in a batch, groups, a strided 1x1 (run on its subsampled view) and
#: a fused activation
SG_W4_CASES = [
    ((1, 16, 12, 12), (24, 16, 1, 1), dict(fused_activation="relu")),
    ((2, 24, 7, 7), (40, 24, 1, 1), {}),
    ((1, 32, 5, 6), (20, 16, 1, 1), dict(group_count=2)),
    ((1, 8, 9, 9), (12, 8, 1, 1), dict(strides=(2, 2), fused_activation="leaky_relu")),
    ((1, 64, 3, 5), (8, 64, 1, 1), {}),
]


@pytest.mark.parametrize("case", range(len(SG_W4_CASES)))
def test_gemm_sg_w4(device, case, monkeypatch):
    """gemm_sg fetches a lane's weights of four input channels as one RGBA32F texel (W4)
    where its loop takes channels four at a time over one column tap: the same bits as
    the R32F fetches (the same weights, the same products in the same order), with and
    without a bias, and it matches torch; float16 never takes it."""
    if not _has_sg(device):
        pytest.skip("no subgroup shuffles on this device")
    xs, ws, kw = SG_W4_CASES[case]
    desc = _conv_desc("float32", xs, ws, bias=case % 2 == 0, **kw)
    rng = np.random.default_rng(110 + case)
    x = rng.standard_normal(desc.input_tensor.sizes).astype(np.float32)
    w = rng.standard_normal(desc.filter_tensor.sizes).astype(np.float32)
    b = (rng.standard_normal(desc.output_tensor.sizes[1]).astype(np.float32)
         if desc.bias_tensor is not None else None)
    a, on = run_path(device, desc, x, w, b, path="gemm_sg")
    assert [d["constants"].get("W4") for d in on.path.dispatches] == [1]
    sg_module = importlib.import_module("vkml.ops.convolution.gemm_sg")
    monkeypatch.setattr(sg_module, "SG_W4", False)
    c, off = run_path(device, desc, x, w, b, path="gemm_sg")
    assert [d["constants"].get("W4") for d in off.path.dispatches] == [None]
    np.testing.assert_array_equal(a, c, err_msg=str(desc))
    ref = desc_reference(desc, x, w, b)
    act = kw.get("fused_activation")
    if act == "relu":
        ref = np.maximum(ref, 0)
    elif act == "leaky_relu":        # (the page's default alpha)
        ref = np.where(ref >= 0, ref, 0.01 * ref)
    np.testing.assert_allclose(a[:ref.size].reshape(ref.shape).astype(np.float64), ref,
                               err_msg=str(desc), **tolerance(w))
    monkeypatch.undo()
    half = _conv_desc("float16", xs, ws, bias=b is not None, **kw)
    _, f16 = run_path(device, half, x.astype(np.float16), w.astype(np.float16),
                      None if b is None else b.astype(np.float16), path="gemm_sg")
    assert all("W4" not in d["constants"] for d in f16.path.dispatches)


def test_gemm_sg_strided_filter(device):
    """gemm_sg reads the filter through its DML strides: a channels-last filter."""
    rng = np.random.default_rng(70)
    co, ci, k = 8, 5, 3
    w = rng.standard_normal((co, ci, k, k)).astype(np.float32)
    w_nhwc = np.ascontiguousarray(w.transpose(0, 2, 3, 1))
    wd = dml.TensorDesc("float32", (co, ci, k, k), (k * k * ci, 1, k * ci, ci))
    xd = dml.TensorDesc("float32", (2, ci, 6, 7))
    desc = dml.ConvolutionOperatorDesc(xd, wd, None, dml.TensorDesc("float32", (2, co, 6, 7)),
                                       start_padding=(1, 1), end_padding=(1, 1))
    if not _has_sg(device):
        pytest.skip("no subgroup shuffles on this device")
    x = rng.standard_normal(xd.sizes).astype(np.float32)
    got, compiled = run_path(device, desc, x, w_nhwc, None, path="gemm_sg")
    assert compiled.path.name == "gemm_sg"
    np.testing.assert_allclose(got.reshape(2, co, 6, 7),
                               convolution_reference(x, w, start=[1, 1], end=[1, 1]),
                               **tolerance(w))


def _strided_1x1_case(rng, dtype):
    """A forward 1x1 convolution with strides: 1-3 spatial dims (a stride of 1 on some),
    groups, batch, end padding (outputs reading it are not subsampled), bias or none."""
    nd = int(rng.integers(1, 4))
    g = int(rng.choice([1, 1, 2]))
    cin, cout = g * int(rng.integers(1, 6)), g * int(rng.integers(4, 11))
    hi = {1: 40, 2: 15, 3: 8}[nd]
    sp = tuple(int(rng.integers(1, hi)) for _ in range(nd))
    s = tuple(int(rng.integers(1, 4)) for _ in range(nd))
    if s == (1,) * nd:
        s = (2,) + s[1:]
    en = tuple(int(rng.integers(0, 2)) if rng.random() < 0.3 else 0 for _ in range(nd))
    return _conv_desc(dtype, (int(rng.integers(1, 3)), cin, *sp), (cout, cin // g) + (1,) * nd,
                      bias=rng.random() < 0.7, strides=s, start_padding=(0,) * nd,
                      end_padding=en, group_count=g)


@pytest.mark.parametrize("path", ["gemm", "gemm_sg"])
def test_strided_1x1_subsampled(device, budget, path):
    """A strided 1x1 convolution on the GEMM paths runs on the subsampled copy of its
    input (``gemm.subsampled``, a 1x1 stride-1 GEMM over a flattened plane) and matches
    torch and the candidate it replaced (``-stride``: the whole input re-laid, read with
    the stride), float32 and float16, packed and channels-last inputs."""
    gemm = importlib.import_module("vkml.ops.convolution.gemm")
    if path == "gemm_sg" and not _has_sg(device):
        pytest.skip("no subgroup shuffles on this device")
    rng = np.random.default_rng(80)
    done = subsampled = 0
    while done < max(6, budget // 3):
        dtype = "float16" if done % 4 == 3 else "float32"
        desc = _strided_1x1_case(rng, dtype)
        if path not in accepting_paths(device, desc):
            continue
        if done % 3 == 2:                 # the same data through a channels-last layout
            xs = desc.input_tensor.sizes
            perm = (0, *range(2, len(xs)), 1)
            last = [0] * len(xs)
            step = 1
            for a in reversed(perm):
                last[a], step = step, step * xs[a]
            desc = dataclasses.replace(desc, input_tensor=dml.TensorDesc(
                dtype, xs, tuple(last)))
        x = rng.standard_normal(desc.input_tensor.sizes).astype(dtype)
        w = rng.standard_normal(desc.filter_tensor.sizes).astype(dtype)
        b = (rng.standard_normal(desc.output_tensor.sizes[1]).astype(dtype)
             if desc.bias_tensor is not None else None)
        xin = x if done % 3 != 2 else np.ascontiguousarray(
            x.transpose((0, *range(2, x.ndim), 1)))
        ref = desc_reference(desc, x, w, b)
        expect = gemm.subsampled(conv_ops.Geometry.of(desc)) is not None
        for name in (path, path + "-stride"):
            if name != path and not expect:
                with pytest.raises(vkml.UnsupportedError):
                    compile_on_path(device, desc, name).release()
                continue
            got, compiled = run_path(device, desc, xin, w, b, path=name)
            assert (compiled.path.subsampled is not None) == (expect and name == path)
            np.testing.assert_allclose(got[:ref.size].reshape(ref.shape).astype(np.float64),
                                       ref, err_msg=f"{name} {desc}", **tolerance(w, dtype))
        subsampled += expect
        done += 1
    assert subsampled >= done // 2


def test_gemm_sg_resnet_shortcuts_share_constants(device):
    """ResNet-18's strided 1x1 shortcuts onto 14x14 and 7x7 maps (input channels cut, the
    blocks the same: MB 16, CU 8, 8 subgroups a workgroup) take one constant set on gemm_sg with 8-lane subgroups
    (``gemm.SG_SHARED_NB``: NB 8 for the 14x14 one, not the 16 of an unstrided 1x1's
    plane), so one pipeline; each matches the reference; without the rule (``share``
    False) the 14x14 block is NB 16."""
    if not _has_sg(device):
        pytest.skip("no subgroup shuffles on this device")
    gemm = importlib.import_module("vkml.ops.convolution.gemm")
    rng = np.random.default_rng(98)
    made = []
    for x_shape, w_shape in (((1, 16, 28, 28), (128, 16, 1, 1)),
                             ((1, 32, 14, 14), (256, 32, 1, 1))):
        desc = _conv_desc("float32", x_shape, w_shape, strides=(2, 2))
        x = rng.standard_normal(desc.input_tensor.sizes).astype(np.float32)
        w = rng.standard_normal(desc.filter_tensor.sizes).astype(np.float32)
        b = rng.standard_normal(w_shape[0]).astype(np.float32)
        got, compiled = run_path(device, desc, x, w, b, path="gemm_sg")
        ref = desc_reference(desc, x, w, b)
        np.testing.assert_allclose(got.reshape(ref.shape).astype(np.float64), ref,
                                   **tolerance(w, "float32"))
        p = compiled.path
        assert p.subsampled is not None
        made.append([(d["kernel"], d["constants"]) for d in p.dispatches])
        if x_shape[2] == 28:
            pl = p.planes
            unshared = gemm.sg_blocks(p.geo.cout_per_group, pl.phases, pl.row_len, pl.flat,
                                      p.sg)
    if _probe_op(device).ctx.limits["subgroupSize"] == 8:
        assert made[0] == made[1] and made[0][0][1]["NB"] == 8
        assert unshared[1] == 16


#: (input, filter, groups, the kernel's XSKEW): 1x1 convolutions on planes of no whole
#: float4s (channel strides 1, 3 and 2 mod 4) over 2 images and 2 groups; 6 input
#: channels are no whole groups of 4, so rows there load element by element
SKEWED = [((2, 16, 7, 7), (24, 16, 1, 1), 1, 1), ((1, 8, 5, 3), (8, 4, 1, 1), 2, 3),
          ((1, 12, 3, 6), (4, 12, 1, 1), 1, 2), ((1, 6, 7, 7), (8, 6, 1, 1), 1, 0)]


@pytest.mark.parametrize("case", range(len(SKEWED)))
def test_gemm_sg_reads_skewed_planes_as_texels(device, case, monkeypatch):
    """gemm_sg on a 1x1 convolution whose planes are no whole float4s reads its rows as
    float4 texels all the same (XSKEW, the channel stride mod 4) where the loop takes the
    group's channels four at a time: the reference's values, and the bits of the rows
    read element by element (each sum adds in the same order)."""
    if not _has_sg(device):
        pytest.skip("no subgroup shuffles on this device")
    gs = importlib.import_module("vkml.ops.convolution.gemm_sg")
    x_shape, w_shape, groups, skew = SKEWED[case]
    desc = _conv_desc("float32", x_shape, w_shape, group_count=groups)
    rng = np.random.default_rng(120 + case)
    x = rng.standard_normal(desc.input_tensor.sizes).astype(np.float32)
    w = rng.standard_normal(desc.filter_tensor.sizes).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    got, compiled = run_path(device, desc, x, w, b, path="gemm_sg")
    d = compiled.path.dispatches[0]
    assert (d["xskew"], d["xvec4"]) == (skew, bool(skew)), d
    if skew:
        assert compiled.path.steps[-1].constants["XSKEW"] == skew
    ref = desc_reference(desc, x, w, b)
    np.testing.assert_allclose(got.reshape(ref.shape).astype(np.float64), ref,
                               **tolerance(w, "float32"))
    monkeypatch.setattr(gs.GemmSgPath, "_skews", lambda self, in_place, flat: False)
    plain, compiled = run_path(device, desc, x, w, b, path="gemm_sg")
    assert not compiled.path.dispatches[0]["xvec4"]
    np.testing.assert_array_equal(got, plain)


@pytest.mark.parametrize("path", ["gemm", "gemm_sg", "gemm-stride", "gemm_sg-stride"])
def test_strided_1x1_with_residual(device, path):
    """ResNet's downsample shortcut fused with the block's Add and Relu (a graph: the
    residual kernel variants) on the subsampled GEMM and the candidate it replaced,
    against torch."""
    if path.startswith("gemm_sg") and not _has_sg(device):
        pytest.skip("no subgroup shuffles on this device")
    rng = np.random.default_rng(90)
    TD = dml.TensorDesc
    x, w, b = TD("float32", (2, 12, 13, 9)), TD("float32", (16, 12, 1, 1)), \
        TD("float32", (1, 16, 1, 1))
    y = TD("float32", (2, 16, 7, 5))
    g = conv_add_relu_graph(dml.ConvolutionOperatorDesc(x, w, b, y, strides=(2, 2)), y)
    arrays = [rng.standard_normal(t.sizes).astype(np.float32) for t in (x, w, b, y)]
    cg = device.compile_graph(g, paths={0: path})
    out = device.empty(y.sizes, np.float32)
    cg.execute([device.tensor(a) for a in arrays], [out])
    assert any(f.kind == "residual" for f in cg.fusions)
    cg.release()
    xt, wt, bt, st = (torch.from_numpy(a.astype(np.float64)) for a in arrays)
    ref = torch.relu(F.conv2d(xt, wt, bt.reshape(-1), stride=2) + st).numpy()
    np.testing.assert_allclose(out.numpy().astype(np.float64), ref, **tolerance(arrays[1]))


#: (input, filter, descriptor fields) whose gemm_sg block loads rows of more than 24
#: input elements: the 7x7 stride-2 stem, 5x5 and 3x3 stride 2, a dilated 3x3, float16
SPAN_CASES = [
    ((1, 3, 60, 60), (16, 3, 7, 7), dict(strides=(2, 2), start_padding=(3, 3),
                                         end_padding=(3, 3)), "float32"),
    ((2, 5, 30, 41), (12, 5, 5, 5), dict(strides=(2, 2), start_padding=(2, 2),
                                         end_padding=(2, 2)), "float32"),
    ((1, 8, 20, 64), (8, 8, 3, 3), dict(strides=(1, 2), start_padding=(1, 1),
                                        end_padding=(1, 1)), "float16"),
    ((1, 4, 9, 40), (8, 4, 3, 3), dict(dilations=(1, 6), start_padding=(0, 6),
                                       end_padding=(0, 6)), "float32"),
]


@pytest.mark.parametrize("case", range(len(SPAN_CASES)))
def test_gemm_sg_span(device, case):
    """gemm_sg-span24 (knob ``sg_span``: a lane's pixels kept to rows of at most 24 input
    elements) where the default block's rows are longer: its block within the bound,
    the fast list times it, and it matches torch and gemm_sg; where the default's rows
    already fit (a 3x3 stride 1, a 1x1, a case's rows on a device whose subgroup size
    gives shorter blocks) it declines."""
    gemm = importlib.import_module("vkml.ops.convolution.gemm")
    choice = importlib.import_module("vkml.ops.convolution.choice")
    if not _has_sg(device):
        pytest.skip("no subgroup shuffles on this device")
    xs, ws, kw, dtype = SPAN_CASES[case]
    desc = _conv_desc(dtype, xs, ws, **kw)
    rng = np.random.default_rng(100 + case)
    default = _check_forced(device, desc, "gemm_sg", rng)
    phases = default.path.planes.phases
    if gemm.sg_span(phases, default.path.nb) <= 24:     # (the subgroup size sets NB)
        with pytest.raises(vkml.UnsupportedError):
            compile_on_path(device, desc, "gemm_sg-span24")
    else:
        bounded = _check_forced(device, desc, "gemm_sg-span24", rng)
        assert gemm.sg_span(phases, bounded.path.nb) <= 24
        assert "gemm_sg-span24" in choice._fast(desc, device)
        bounded.release()
    default.release()
    for xs, ws, kw in (((1, 8, 20, 64), (8, 8, 3, 3), dict(start_padding=(1, 1),
                                                          end_padding=(1, 1))),
                       ((1, 8, 9, 9), (8, 8, 1, 1), dict(strides=(2, 2)))):
        with pytest.raises(vkml.UnsupportedError):
            compile_on_path(device, _conv_desc(dtype, xs, ws, **kw), "gemm_sg-span24")


def test_gemm_sg_mb8(device):
    """gemm_sg-mb8 (knob ``sg_mb``: at most 8 output channels a block) on a stem-like
    3 -> 32 3x3 stride 2: its blocks hold 8 channels, it matches torch, float32 and
    float16, and the fast list times it; a 1x1 of 16 input channels takes it when forced
    but its fast list does not; where the default block holds 8 channels or fewer it
    declines (the default's twin)."""
    choice = importlib.import_module("vkml.ops.convolution.choice")
    if not _has_sg(device):
        pytest.skip("no subgroup shuffles on this device")
    rng = np.random.default_rng(130)
    for dtype in ("float32", "float16"):
        desc = _conv_desc(dtype, (1, 3, 22, 30), (32, 3, 3, 3), strides=(2, 2),
                          start_padding=(1, 1), end_padding=(1, 1))
        default = _check_forced(device, desc, "gemm_sg", rng)
        small = _check_forced(device, desc, "gemm_sg-mb8", rng)
        assert default.path.mb > 8 >= small.path.mb
        assert "gemm_sg-mb8" in choice._fast(desc, device)
        default.release()
        small.release()
        one = _conv_desc(dtype, (1, 16, 6, 6), (32, 16, 1, 1))
        _check_forced(device, one, "gemm_sg-mb8", rng).release()
        assert "gemm_sg-mb8" not in choice._fast(one, device)
        with pytest.raises(vkml.UnsupportedError):
            compile_on_path(device, _conv_desc(dtype, (1, 3, 9, 9), (8, 3, 3, 3),
                                               start_padding=(1, 1), end_padding=(1, 1)),
                            "gemm_sg-mb8")


@pytest.mark.parametrize("width", [0, 2, 64])
def test_workgroups_follow_the_concurrent_width(device, monkeypatch, width):
    """gemm_sg's channel blocks a workgroup (CBW) and the depthwise kernel's lanes a
    workgroup are :func:`~vkml.ops.grid.per_workgroup`'s for the device's concurrent
    width (patched: unknown, two threads, a wide GPU), as are the gemv path's subgroups
    a workgroup, and every count matches torch: a 1x1 to 144 channels (9 blocks of 16:
    never 8 + 1), a 3x3 depthwise of 20 channels and a 64 -> 40 gemv."""
    grid = importlib.import_module("vkml.ops.grid")
    sg_mod = importlib.import_module("vkml.ops.convolution.gemm_sg")
    dw_mod = importlib.import_module("vkml.ops.convolution.depthwise")
    gemv_mod = importlib.import_module("vkml.ops.convolution.gemv")
    for mod in (sg_mod, dw_mod, gemv_mod):
        monkeypatch.setattr(mod, "concurrent_width", lambda _device: width)
    rng = np.random.default_rng(140 + width)
    if _has_sg(device):
        compiled = _check_forced(device, _conv_desc("float32", (1, 24, 12, 12),
                                                    (144, 24, 1, 1)), "gemm_sg", rng)
        path = compiled.path
        d = path.dispatches[0]
        gx = ceil_div(math.prod(d["qsize"][i] for i in (0, 1, 3)), path.sg)
        cbw = grid.per_workgroup(path.groups_y, path.local // path.sg, gx, width)
        assert path.groups_y == 9 and d["constants"]["CBW"] == cbw
        assert d["constants"]["LOCAL_SIZE_X"] == cbw * path.sg
        compiled.release()
    compiled = _check_forced(device, _conv_desc("float32", (1, 20, 9, 9), (20, 1, 3, 3),
                                                group_count=20, start_padding=(1, 1),
                                                end_padding=(1, 1)), "depthwise", rng)
    path = compiled.path
    unit = min(64, device.context.limits["subgroupSize"])
    lanes = ceil_div(20, path.pc) * path.strips
    assert path.local % unit == 0 and path.local == unit * grid.per_workgroup(
        ceil_div(lanes, unit), min(64, compiled.workgroup_size) // unit,
        ceil_div(9, path.R), width)
    compiled.release()
    if _has_sg(device):
        compiled = _check_forced(device, _conv_desc("float32", (1, 64, 1, 1), (40, 64, 1, 1)),
                                 "gemv", rng)
        path = compiled.path
        step = path.steps[0]
        subgroups = ceil_div(10, path.sg // path.split)
        local = path.sg * grid.per_workgroup(subgroups, min(64, compiled.workgroup_size)
                                             // path.sg, 1, width)
        assert step.constants["LOCAL_SIZE_X"] == local
        assert step.grid[0] == ceil_div(10, local // path.split)
        compiled.release()


def same_bits_with_rows_apart(device, desc, got, arrays, path):
    """Asserts that ``got`` (``desc`` run on ``path``) has the same bits as the same
    convolution writing output rows 3 elements apart (rows no longer packed: element
    stores); returns that run's compiled operator."""
    sizes = desc.output_tensor.sizes
    strides = [1]
    for i, n in enumerate(reversed(sizes[1:])):
        strides.insert(0, strides[0] * (n + 3 * (i == 0)))
    apart = dataclasses.replace(desc, output_tensor=dml.TensorDesc(
        desc.output_tensor.dtype, sizes, strides=tuple(strides)))
    flat, compiled = run_path(device, apart, *arrays, path=path)
    gathered = np.lib.stride_tricks.as_strided(flat, sizes, [s * flat.itemsize for s in strides])
    bits = f"u{got.itemsize}"
    np.testing.assert_array_equal(got.reshape(sizes).view(bits),
                                  np.ascontiguousarray(gathered).view(bits))
    return compiled


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("width, v4", [(20, True), (21, False)])
def test_winograd_row_stores(device, width, v4, dtype):
    """Winograd's output transform stores whole tile rows at once (a float4, or float16's
    four halves as one uvec2, rounded as element stores round) where the output rows are
    packed and a multiple of 4, else element by element: the same bits as the element
    stores of the same output written with a row stride of width + 3, and the
    reference's values."""
    rng = np.random.default_rng(90 + width)
    desc = _conv_desc(dtype, (2, 16, 18, width), (17, 16, 3, 3), start_padding=(1, 1),
                      end_padding=(1, 1), fused_activation="relu")
    x = rng.standard_normal(desc.input_tensor.sizes).astype(dtype)
    w = rng.standard_normal(desc.filter_tensor.sizes).astype(dtype)
    b = rng.standard_normal(17).astype(dtype)
    got, compiled = run_path(device, desc, x, w, b, path="winograd")
    assert compiled.path.y4 == v4
    assert compiled.path.gemm_yv4        # M's tiles 4 a store (T4 rows)
    element_stores = same_bits_with_rows_apart(device, desc, got, (x, w, b), "winograd")
    assert not element_stores.path.y4
    ref = np.maximum(desc_reference(desc, x, w, b), 0)
    np.testing.assert_allclose(got.reshape(ref.shape), ref,
                               **path_tolerance("winograd", w, dtype))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("width, start, x4", [(20, 0, True), (20, 1, True), (24, 2, True),
                                               (16, 3, True), (21, 1, False)])
def test_winograd_row_loads(device, width, start, x4, dtype):
    """Winograd's input transform reads tile rows four elements a fetch (RGBA32F or
    RGBA16F views) where the input rows are packed and a multiple of 4 (WINO_XO = the
    start padding's offset in the first texel: 0, 3, 2, 1 here; texels wholly in the
    padding read as zeros), else element by element; the same results."""
    rng = np.random.default_rng(70 + start)
    desc = _conv_desc(dtype, (2, 16, 17, width), (16, 16, 3, 3), start_padding=(1, start),
                      end_padding=(2, 3 - start))
    x = rng.standard_normal(desc.input_tensor.sizes).astype(dtype)
    w = rng.standard_normal(desc.filter_tensor.sizes).astype(dtype)
    b = rng.standard_normal(16).astype(dtype)
    got, compiled = run_path(device, desc, x, w, b, path="winograd")
    assert compiled.path.x4 == x4
    ref = desc_reference(desc, x, w, b)
    np.testing.assert_allclose(got.reshape(ref.shape), ref,
                               **path_tolerance("winograd", w, dtype))


@pytest.mark.parametrize("name, seed", [("winograd-sg", 19), ("winograd-cl", 23)])
def test_winograd_with_subgroup_gemms(device, budget, name, seed):
    """Winograd's 36 GEMMs sharing operands by subgroup shuffles, same results as the
    reference; refused without full subgroups.  ``winograd-sg``: on gemm_sg (U read in
    place as a filter per transform point, shared across the lanes); ``winograd-cl``:
    the lanes of a subgroup along output channels, the tiles' V values shared (its
    u64vec4 stores: tests/test_store_width.py)."""
    rng = np.random.default_rng(seed)
    if not _has_sg(device):
        desc, x, w, b = winograd_case(rng, True)
        with pytest.raises(vkml.UnsupportedError, match=name):
            run_path(device, desc, x, w, b, path=name)
        return
    for compiled in check_winograd_candidate(device, rng, budget, name):
        if name == "winograd-sg":
            assert compiled.path.sg >= 4
        else:
            mb, nb = compiled.path.cl
            assert mb in (4, 8) and nb % 4 == 0 and mb * nb <= 224


def check_winograd_candidate(device, rng, budget, name):
    """Winograd candidate ``name`` forced on random cases Winograd accepts, each equal to
    the reference; yields each compiled operator for the caller's own checks."""
    done = 0
    while done < max(1, budget // 16):
        desc, x, w, b = winograd_case(rng, True)
        if "winograd" not in accepting_paths(device, desc):
            continue
        done += 1
        got, compiled = run_path(device, desc, x, w, b, path=name)
        ref = desc_reference(desc, x, w, b)
        np.testing.assert_allclose(got[:ref.size].reshape(ref.shape), ref,
                                   **path_tolerance("winograd", w), err_msg=str(desc))
        yield compiled


@pytest.mark.parametrize("name", [n for n in conv_ops.CANDIDATES if n.startswith("winograd")])
def test_winograd_few_tiles(device, name):
    """Every Winograd candidate, forced, where the output has fewer tiles than the
    ``VKML_TUNE=off`` choice takes Winograd for (1 to 30 4x4 tiles: ResNet's 14x14 and
    7x7 stages; partial tiles, two images, a 1x1 output), equal to the reference and to
    gemm's result; not the heuristic's choice there."""
    rng = np.random.default_rng(41)
    ran = 0
    for x_shape, cout, st, en in [((1, 16, 4, 4), 16, (1, 1), (1, 1)),
                                  ((1, 24, 7, 7), 20, (1, 1), (1, 1)),
                                  ((2, 17, 6, 5), 33, (0, 2), (1, 0)),
                                  ((1, 40, 14, 14), 24, (1, 1), (1, 1)),
                                  ((1, 20, 3, 3), 16, (0, 0), (0, 0)),
                                  ((1, 33, 11, 3), 18, (2, 1), (0, 1))]:
        xd = dml.TensorDesc("float32", x_shape)
        wd = dml.TensorDesc("float32", (cout, x_shape[1], 3, 3))
        kw = dict(start_padding=st, end_padding=en)
        out = dml.ConvolutionOperatorDesc(xd, wd, None, xd, **kw).expected_output_sizes()
        desc = dml.ConvolutionOperatorDesc(xd, wd, dml.TensorDesc("float32", (1, cout, 1, 1)),
                                           dml.TensorDesc("float32", out), **kw)
        x = rng.standard_normal(x_shape).astype(np.float32)
        w = rng.standard_normal(wd.sizes).astype(np.float32)
        b = rng.standard_normal(cout).astype(np.float32)
        try:
            got, compiled = run_path(device, desc, x, w, b, path=name)
        except vkml.UnsupportedError:
            assert name != "winograd", desc          # every device takes the default
            continue
        geo = conv_ops.Geometry.of(desc)
        assert conv_ops.choice.heuristic(compiled, geo)[0] != "winograd"
        compiled.release()
        ran += 1
        ref = desc_reference(desc, x, w, b)
        np.testing.assert_allclose(got[:ref.size].reshape(ref.shape), ref,
                                   **path_tolerance("winograd", w), err_msg=str(desc))
        other, compiled = run_path(device, desc, x, w, b, path="gemm")
        compiled.release()
        np.testing.assert_allclose(got, other, **path_tolerance("winograd", w))
    if ran == 0:
        pytest.skip(f"{name} takes none of these geometries here")


@pytest.mark.parametrize("path", ["gemm", "gemm_sg"])
@pytest.mark.parametrize("x_shape, w_shape, kw", [
    ((2, 5, 6, 12), (9, 5, 3, 3), dict(start_padding=(1, 1), end_padding=(1, 1))),
    ((1, 6, 5, 12), (8, 6, 1, 1), {}),                       # flattened plane, in place
    # flattened, rows of 14: the plane in 4s (float32, read in place; float16's padded
    # copy has rows of 16, whose output rows are not packed: element stores)
    ((1, 6, 6, 14), (8, 6, 1, 1), {}),
    ((1, 4, 3, 5, 12), (6, 4, 1, 2, 3), dict(start_padding=(0, 1, 1), end_padding=(0, 0, 1))),
])
def test_gemm_row_stores(device, path, x_shape, w_shape, kw):
    """The implicit GEMM stores 4 pixels at a time (a float4, or float16's four halves as
    one uvec2) where output rows are packed and a multiple of 4, or (a flattened plane of
    packed rows) the plane is (other rows element by element): the same bits as element
    stores, and the reference's values."""
    if path == "gemm_sg" and not _has_sg(device):
        pytest.skip("no subgroup shuffles on this device")
    rng = np.random.default_rng(95)
    for dtype in ("float32", "float16"):
        desc = _conv_desc(dtype, x_shape, w_shape, fused_activation="leaky_relu", **kw)
        x = rng.standard_normal(desc.input_tensor.sizes).astype(dtype)
        w = rng.standard_normal(desc.filter_tensor.sizes).astype(dtype)
        b = rng.standard_normal(w_shape[0]).astype(dtype)
        got, compiled = run_path(device, desc, x, w, b, path=path)
        assert all(d["yv4"] for d in compiled.path.dispatches) == (
            dtype == "float32" or x_shape[-1] % 4 == 0)
        apart = same_bits_with_rows_apart(device, desc, got, (x, w, b), path)
        assert not any(d["yv4"] for d in apart.path.dispatches)
        ref = desc_reference(desc, x, w, b)
        ref = np.where(ref >= 0, ref, 0.01 * ref)
        np.testing.assert_allclose(got.reshape(ref.shape).astype(np.float64), ref,
                                   **tolerance(w, dtype))


@pytest.mark.parametrize("path", ["gemm-v8", "gemm_sg-v8"])
@pytest.mark.parametrize("x_shape, w_shape, kw, narrow", [
    ((2, 5, 6, 16), (9, 5, 3, 3), dict(start_padding=(1, 1), end_padding=(1, 1)),
     (2, 5, 6, 12)),
    ((1, 6, 6, 40), (16, 6, 1, 1), {}, (1, 6, 5, 36)),       # flattened plane, NB 12 (sg)
    # flattened, rows of 12 (not whole 8s) in a plane of 96 (whole 8s); a plane of 84 not
    ((1, 6, 8, 12), (16, 6, 1, 1), {}, (1, 6, 7, 12)),
    ((1, 8, 10, 40), (16, 8, 3, 3), dict(start_padding=(1, 1), end_padding=(1, 1)),
     (1, 8, 10, 36)),
])
def test_gemm_v8_row_stores(device, path, x_shape, w_shape, kw, narrow):
    """``gemm-v8`` / ``gemm_sg-v8`` store 8 float32 pixels as one u64vec4 (int64 shaders;
    a block of 8a + 4 pixels that starts 4 past a group stores a u64vec2 first): the same
    bits as ``gemm``'s float4 stores, and the reference's values; refused without int64
    shaders, and where output rows (a flattened plane of packed rows: the plane) do not
    hold whole groups of 8."""
    if path == "gemm_sg-v8" and not _has_sg(device):
        pytest.skip("no subgroup shuffles on this device")
    rng = np.random.default_rng(96)
    desc = _conv_desc("float32", x_shape, w_shape, fused_activation="leaky_relu", **kw)
    x = rng.standard_normal(desc.input_tensor.sizes).astype(np.float32)
    w = rng.standard_normal(desc.filter_tensor.sizes).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    if not device.info.features.get("int64"):
        with pytest.raises(vkml.UnsupportedError, match=path):
            run_path(device, desc, x, w, b, path=path)
        return
    if not all(d["yv4"] for d in compile_on_path(device, desc, path[:-3]).path.dispatches):
        # the register block follows the subgroup size (gemm_sg pads pixel blocks to whole
        # subgroups): on 32 lanes rows of 40 take NB = 14, no float4 stores, so no v8
        with pytest.raises(vkml.UnsupportedError, match="groups of 8"):
            run_path(device, desc, x, w, b, path=path)
        return
    got, compiled = run_path(device, desc, x, w, b, path=path)
    assert all(d["yv8"] for d in compiled.path.dispatches)
    four, plain = run_path(device, desc, x, w, b, path=path[:-3])
    assert not any(d["yv8"] for d in plain.path.dispatches)
    np.testing.assert_array_equal(got.view(np.uint32), four.view(np.uint32))
    ref = desc_reference(desc, x, w, b)
    ref = np.where(ref >= 0, ref, 0.01 * ref)
    np.testing.assert_allclose(got.reshape(ref.shape).astype(np.float64), ref,
                               **tolerance(w, "float32"))
    narrow = _conv_desc("float32", narrow, w_shape, **kw)
    with pytest.raises(vkml.UnsupportedError, match="groups of 8"):
        compile_on_path(device, narrow, path)


@pytest.mark.parametrize("path", ["gemm", "gemm_sg"])
def test_gemm_flat_plane_float4(device, path):
    """A 1x1 convolution on 14x14 maps (a flattened plane of 196 pixels, rows of 14: not
    whole float4s, the plane is) reads its input rows and stores its pixels as float4s
    (gemm_sg: a 12-pixel block, not 13), and matches the reference; with rows stored
    apart (not packed) it stores element by element, the same bits."""
    if path == "gemm_sg" and not _has_sg(device):
        pytest.skip("no subgroup shuffles on this device")
    rng = np.random.default_rng(97)
    desc = _conv_desc("float32", (1, 8, 14, 14), (24, 8, 1, 1), fused_activation="leaky_relu")
    x = rng.standard_normal(desc.input_tensor.sizes).astype(np.float32)
    w = rng.standard_normal(desc.filter_tensor.sizes).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    got, compiled = run_path(device, desc, x, w, b, path=path)
    p = compiled.path
    assert p.nb % 4 == 0 and all(d["xvec4"] and d["yv4"] for d in p.dispatches)
    apart = same_bits_with_rows_apart(device, desc, got, (x, w, b), path)
    assert not any(d["yv4"] for d in apart.path.dispatches)
    ref = desc_reference(desc, x, w, b)
    ref = np.where(ref >= 0, ref, 0.01 * ref)
    np.testing.assert_allclose(got.reshape(ref.shape).astype(np.float64), ref,
                               **tolerance(w, "float32"))


# depthwise blocks: strips and bands with remainders, strided/dilated rows, 3-D, float4
# rows and stores, the unrolled-body cap (a 4x4x4 kernel)
DW_EDGES = [
    ((2, 3, 19, 13), (3, 1, 3, 3), dict(group_count=3, start_padding=(1, 1),
                                        end_padding=(1, 1))),
    ((1, 2, 17, 24), (4, 1, 3, 5), dict(group_count=2, strides=(2, 2), dilations=(2, 1),
                                        start_padding=(2, 3), end_padding=(1, 0),
                                        mode="convolution")),
    ((1, 2, 5, 6, 8), (2, 1, 4, 4, 4), dict(group_count=2, start_padding=(1, 2, 1),
                                            end_padding=(2, 1, 2))),
    ((2, 4, 30), (8, 1, 5), dict(group_count=4, strides=(3,), start_padding=(2,))),
]


@pytest.mark.parametrize("candidate", ["depthwise", "depthwise-4x1"])
@pytest.mark.parametrize("case", range(len(DW_EDGES)))
def test_depthwise_blocks(device, case, candidate):
    """The depthwise kernel's R x NB blocks (each tuning candidate's), float32 and float16."""
    block = {**conv_ops.DEFAULT_KNOBS, **conv_ops.CANDIDATES[candidate][1]}["dw_block"]
    xs, ws, kw = DW_EDGES[case]
    rng = np.random.default_rng(80 + case)
    for dtype in ("float32", "float16"):
        desc = _conv_desc(dtype, xs, ws, **kw)
        compiled = _check_forced(device, desc, candidate, rng)
        assert compiled.path.candidate == candidate
        assert compiled.path.nb <= block[0] and compiled.path.R <= block[1]


# plane stores: 14x14 maps in two bands (8 + 6 rows), a batch, stride 2 from 28x28, a
# channel multiplier, 3-D (planes along d), 6x10 rows in one band
DW_PLANES = [
    ((2, 5, 14, 14), (5, 1, 3, 3), dict(group_count=5, start_padding=(1, 1),
                                        end_padding=(1, 1))),
    ((1, 3, 28, 28), (3, 1, 3, 3), dict(group_count=3, strides=(2, 2), start_padding=(1, 1),
                                        end_padding=(1, 1))),
    ((1, 2, 6, 10), (6, 1, 3, 3), dict(group_count=2, start_padding=(1, 1),
                                       end_padding=(1, 1), mode="convolution")),
    ((1, 2, 3, 6, 6), (2, 1, 3, 3, 3), dict(group_count=2, start_padding=(1, 1, 1),
                                            end_padding=(1, 1, 1))),
]


@pytest.mark.parametrize("case", range(len(DW_PLANES)))
def test_depthwise_plane_stores(device, case):
    """The depthwise block stores its band as float4s of the flattened rows where its
    rows are packed, not a multiple of 4 and the band and plane are whole float4s: the
    reference's values (with a fused activation) and the same bits as the element stores
    of ``depthwise-scalar``; not taken where neither the plane nor four packed planes
    are whole float4s (7x7, 6 channels), and then ``depthwise-scalar`` declines (it
    would be the default's twin)."""
    xs, ws, kw = DW_PLANES[case]
    rng = np.random.default_rng(140 + case)
    desc = _conv_desc("float32", xs, ws, fused_activation="leaky_relu", **kw)
    x = rng.standard_normal(desc.input_tensor.sizes).astype(np.float32)
    w = rng.standard_normal(desc.filter_tensor.sizes).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    got, compiled = run_path(device, desc, x, w, b, path="depthwise")
    path = compiled.path
    texel = path.texel
    assert path.pw == (desc.output_tensor.sizes[-1] if texel else 0)
    plain, apart = run_path(device, desc, x, w, b, path="depthwise-scalar") if texel else (
        got, compiled)
    assert apart.path.pw == 0
    np.testing.assert_array_equal(got.view(np.uint32), plain.view(np.uint32))
    ref = desc_reference(desc, x, w, b)
    ref = np.where(ref >= 0, ref, 0.01 * ref)
    np.testing.assert_allclose(got.reshape(ref.shape).astype(np.float64), ref,
                               **tolerance(w, "float32"))
    seven = _conv_desc("float32", (1, 6, 7, 7), (6, 1, 3, 3), group_count=6,
                       start_padding=(1, 1), end_padding=(1, 1))
    assert compile_on_path(device, seven, "depthwise").path.pw == 0
    with pytest.raises(vkml.UnsupportedError, match="depthwise-scalar"):
        compile_on_path(device, seven, "depthwise-scalar")


# several channels a lane (PC): 7x7 maps (MobileNetV2's last depthwise layers, four
# channels' planes make whole float4s) with 3x3 and 5x5 kernels, a batch, a channel
# multiplier, stride 2 from 14x14, 5x5, 3x6 (two channels) and 3x3 maps, the flipped
# kernel; expected PC
DW_PACKED = [
    ((1, 8, 7, 7), (8, 1, 3, 3), dict(group_count=8, start_padding=(1, 1),
                                      end_padding=(1, 1)), 4),
    ((2, 12, 7, 7), (12, 1, 5, 5), dict(group_count=12, start_padding=(2, 2),
                                        end_padding=(2, 2), mode="convolution"), 4),
    ((1, 2, 7, 7), (8, 1, 3, 3), dict(group_count=2, start_padding=(1, 1),
                                      end_padding=(1, 1)), 4),
    ((1, 4, 14, 14), (4, 1, 3, 3), dict(group_count=4, strides=(2, 2), start_padding=(1, 1),
                                        end_padding=(1, 1)), 4),
    ((1, 8, 5, 5), (8, 1, 3, 3), dict(group_count=8, start_padding=(1, 1),
                                      end_padding=(1, 1)), 4),
    ((1, 6, 3, 6), (6, 1, 3, 3), dict(group_count=6, start_padding=(1, 1),
                                      end_padding=(1, 1)), 2),
    ((3, 4, 3, 3), (4, 1, 3, 3), dict(group_count=4, start_padding=(1, 1),
                                      end_padding=(1, 1)), 4),
]


def _leaky_case(case, seed):
    """A float32 case of :data:`DW_PACKED` / :data:`DW_WHOLE` with a leaky ReLU fused:
    (descriptor, input, filter, bias, the channels a lane takes)."""
    xs, ws, kw, pc = case
    rng = np.random.default_rng(seed)
    desc = _conv_desc("float32", xs, ws, fused_activation="leaky_relu", **kw)
    return (desc, rng.standard_normal(desc.input_tensor.sizes).astype(np.float32),
            rng.standard_normal(desc.filter_tensor.sizes).astype(np.float32),
            rng.standard_normal(ws[0]).astype(np.float32), pc)


@pytest.mark.parametrize("case", range(len(DW_PACKED)))
def test_depthwise_packed_planes(device, case):
    """Where one plane is not whole float4s but a few packed ones are (7x7: 49 floats), a
    lane of the depthwise block computes PC channels' whole planes and stores them as
    float4s of the flattened (channel, row, column): the reference's values (with a
    fused activation and a bias) and the same bits as ``depthwise-scalar``'s element
    stores."""
    desc, x, w, b, pc = _leaky_case(DW_PACKED[case], 170 + case)
    got, compiled = run_path(device, desc, x, w, b, path="depthwise")
    if not compiled.path.texel:
        pytest.skip("no texel views of these sizes on this device")
    assert (compiled.path.pc, compiled.path.pw) == (pc, desc.output_tensor.sizes[-1])
    plain, apart = run_path(device, desc, x, w, b, path="depthwise-scalar")
    assert (apart.path.pc, apart.path.pw) == (1, 0)
    np.testing.assert_array_equal(got.view(np.uint32), plain.view(np.uint32))
    ref = desc_reference(desc, x, w, b)
    ref = np.where(ref >= 0, ref, 0.01 * ref)
    np.testing.assert_allclose(got.reshape(ref.shape).astype(np.float64), ref,
                               **tolerance(w, "float32"))


#: (input, filter, fields, the channels a lane takes whole): 7x7 planes four channels a
#: lane (flipped kernel, two images), 14x14 one (the plane is whole float4s), stride 2
#: from 14x14 to 7x7 (the output's four planes), dilation 2 with uneven padding on 6x6
#: planes (36 floats: one), 5x5 planes of a 3x3 whose 25 floats take four, and an input
#: of more floats than SwiftShader's 65536 texels (as RGBA32F texels, a quarter)
DW_WHOLE = [
    ((2, 8, 7, 7), (8, 1, 3, 3), dict(group_count=8, start_padding=(1, 1), end_padding=(1, 1),
                                      mode="convolution"), 4),
    ((1, 3, 14, 14), (3, 1, 3, 3), dict(group_count=3, start_padding=(1, 1),
                                        end_padding=(1, 1)), 1),
    ((1, 8, 14, 14), (8, 1, 3, 3), dict(group_count=8, strides=(2, 2), start_padding=(1, 1),
                                        end_padding=(1, 1)), 4),
    ((1, 4, 6, 6), (4, 1, 3, 3), dict(group_count=4, dilations=(2, 2), start_padding=(2, 1),
                                      end_padding=(2, 3)), 1),
    ((1, 4, 5, 5), (4, 1, 3, 3), dict(group_count=4, start_padding=(1, 1),
                                      end_padding=(1, 1)), 4),
    ((1, 344, 14, 14), (344, 1, 3, 3), dict(group_count=344, start_padding=(1, 1),
                                            end_padding=(1, 1)), 1),
]


@pytest.mark.parametrize("case", range(len(DW_WHOLE)))
def test_depthwise_whole_planes(device, case):
    """``depthwise-plane`` (knob ``dw_whole``): a lane reads its channels' whole input
    planes as float4 texels and computes their whole output planes: the channels a
    lane the rule says, the reference's values (a fused activation and a bias, an
    infinite weight's NaNs where a padded tap meets it) and the same bits as the
    default block's row reads; declined where the channel multiplier is not 1."""
    desc, x, w, b, pc = _leaky_case(DW_WHOLE[case], 180 + case)
    try:
        got, compiled = run_path(device, desc, x, w, b, path="depthwise-plane")
    except vkml.UnsupportedError:
        pytest.skip("no texel views of these sizes on this device")
    assert compiled.path.whole_planes and compiled.path.pc == pc
    ref = desc_reference(desc, x, w, b)
    ref = np.where(ref >= 0, ref, 0.01 * ref)
    np.testing.assert_allclose(got.reshape(ref.shape).astype(np.float64), ref,
                               **tolerance(w, "float32"))
    w[0, 0, 0, 0] = np.inf
    for weights in (w.copy(), np.where(np.isinf(w), 1.0, w)):
        got, _ = run_path(device, desc, x, weights, b, path="depthwise-plane")
        rows, _ = run_path(device, desc, x, weights, b, path="depthwise")
        np.testing.assert_array_equal(got.view(np.uint32), rows.view(np.uint32))
    multiplier = _conv_desc("float32", (1, 2, 7, 7), (8, 1, 3, 3), group_count=2,
                            start_padding=(1, 1), end_padding=(1, 1))
    with pytest.raises(vkml.UnsupportedError, match="depthwise-plane"):
        compile_on_path(device, multiplier, "depthwise-plane")


#: u64vec4 plane stores (the kernel's V8 without ROWS; candidates ``depthwise-plane-v8``
#: and ``depthwise-v8``, knob store64): (candidate, input, filter, keywords, output
#: strides).  Whole 7x7 planes four channels a lane (196 floats: a u64vec2 at one end,
#: lanes starting 8-aligned and 4 past in turn), whole 14x14 planes one a lane (the flipped
#: kernel), two images stride 2 from 14x14 on the default block, a 6-wide map whose
#: channels lie 52 floats apart (48 floats a lane, the odd channels' starting 4 past 8:
#: a u64vec2 at both ends); and the default block's rows of 16 (not plane stores): stride
#: 2 from 32x32, and 24-wide rows of 20 (a strip's second group of eight past the row, a
#: band's last rows past the output)
DW_V8 = [
    ("depthwise-plane-v8", (1, 8, 7, 7), (8, 1, 3, 3),
     dict(group_count=8, start_padding=(1, 1), end_padding=(1, 1)), None),
    ("depthwise-plane-v8", (1, 6, 14, 14), (6, 1, 3, 3),
     dict(group_count=6, start_padding=(1, 1), end_padding=(1, 1), mode="convolution"), None),
    ("depthwise-v8", (2, 8, 14, 14), (8, 1, 3, 3),
     dict(group_count=8, strides=(2, 2), start_padding=(1, 1), end_padding=(1, 1)), None),
    ("depthwise-v8", (1, 4, 8, 6), (4, 1, 3, 3),
     dict(group_count=4, start_padding=(1, 1), end_padding=(1, 1)), (208, 52, 6, 1)),
    ("depthwise-v8", (1, 8, 32, 32), (8, 1, 3, 3),
     dict(group_count=8, strides=(2, 2), start_padding=(1, 1), end_padding=(1, 1)), None),
    ("depthwise-v8", (2, 4, 20, 24), (4, 1, 3, 3),
     dict(group_count=4, start_padding=(1, 1), end_padding=(1, 1)), None),
]


@pytest.mark.parametrize("case", range(len(DW_V8)))
def test_depthwise_u64vec4_stores(device, case):
    """The stores as u64vec4s (plane stores with u64vec2s where a lane's floats start or
    end 4 past a multiple of 8, or rows): the reference's values, the same bits as the
    float4 stores of the same block, and no element written outside the output's;
    refused without int64 shaders (SwiftShader)."""
    path, xs, ws, kw, ystrides = DW_V8[case]
    rng = np.random.default_rng(400 + case)
    plain = _conv_desc("float32", xs, ws, fused_activation="leaky_relu", **kw)
    y = plain.output_tensor
    desc = dataclasses.replace(plain, output_tensor=dml.TensorDesc("float32", y.sizes,
                                                                   ystrides))
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    try:
        wide = compile_on_path(device, desc, path)
    except vkml.UnsupportedError:
        assert not device.features.get("int64")
        pytest.skip("no int64 shaders: no u64vec4 stores")
    narrow = compile_on_path(device, desc, path[:-3])
    assert wide.path.stores_v8 and wide.path.kernel == "convolution_depthwise_f32_v8"
    assert not narrow.path.stores_v8 and wide.path.pc == narrow.path.pc
    elems = desc.output_tensor.total_tensor_size_in_bytes // 4
    got = run_into_nan(device, wide, [x, w, b], elems, np.float32)
    want = run_into_nan(device, narrow, [x, w, b], elems, np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    strides = desc.output_tensor.element_strides
    view = np.lib.stride_tricks.as_strided(got, y.sizes, [4 * s for s in strides])
    ref = desc_reference(plain, x, w, b)
    ref = np.where(ref >= 0, ref, 0.01 * ref)
    np.testing.assert_allclose(view.astype(np.float64), ref, **tolerance(w, "float32"))
    written = np.zeros(elems, bool)
    np.lib.stride_tricks.as_strided(written, y.sizes, [s for s in strides])[...] = True
    assert np.isnan(got[~written]).all()


#: MobileNetV2's and EfficientNet-B0's depthwise layers at full size: inputs beyond
#: SwiftShader's 65536 single-float texels, where a candidate takes another variant
MODEL_DEPTHWISE = [((1, 384, 14, 14), 3, 1), ((1, 576, 14, 14), 3, 2), ((1, 960, 7, 7), 3, 1),
                   ((1, 144, 56, 56), 3, 1), ((1, 672, 7, 7), 5, 1)]


@pytest.mark.parametrize("case", range(len(MODEL_DEPTHWISE)))
def test_depthwise_candidates_on_model_layers(device, case):
    """Every depthwise candidate that takes a model's layer (what the tuner may choose
    there) matches torch, a bias and a ReLU fused."""
    xs, k, stride = MODEL_DEPTHWISE[case]
    c = xs[1]
    desc = _conv_desc("float32", xs, (c, 1, k, k), group_count=c, strides=(stride, stride),
                      start_padding=(k // 2,) * 2, end_padding=(k // 2,) * 2,
                      fused_activation="relu")
    rng = np.random.default_rng(190 + case)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    ref = np.maximum(desc_reference(desc, x, w, b), 0.0)
    ran = []
    for name in [n for n in conv_ops.CANDIDATES if n.startswith("depthwise")]:
        try:
            got, compiled = run_path(device, desc, x, w, b, path=name)
        except vkml.UnsupportedError:
            continue
        ran.append(name)
        np.testing.assert_allclose(got.reshape(ref.shape).astype(np.float64), ref,
                                   err_msg=name, **tolerance(w, "float32"))
        compiled.release()
    assert "depthwise" in ran, ran


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gemm_filter_transpose(device, dtype):
    """The blocked filter transpose (packed filters, C_in/groups * kernel a multiple of
    4) with groups, both modes and padded output channels, against torch."""
    rng = np.random.default_rng(12)
    for g, cig, cog, k, mode in [(1, 4, 5, (3, 3), "cross_correlation"),
                                 (2, 8, 6, (1, 1), "convolution"),
                                 (3, 2, 7, (2, 2), "convolution"),
                                 (1, 4, 9, (1, 4), "cross_correlation")]:
        xd = dml.TensorDesc(dtype, (2, g * cig, 7, 9))
        wd = dml.TensorDesc(dtype, (g * cog, cig) + k)
        kw = dict(group_count=g, start_padding=(1, 0), end_padding=(0, 1))
        out = dml.ConvolutionOperatorDesc(xd, wd, None, xd, **kw).expected_output_sizes()
        desc = dml.ConvolutionOperatorDesc(xd, wd, dml.TensorDesc(dtype, (1, g * cog, 1, 1)),
                                           dml.TensorDesc(dtype, out), mode=mode, **kw)
        x = rng.standard_normal(xd.sizes).astype(dtype)
        w = rng.standard_normal(wd.sizes).astype(dtype)
        b = rng.standard_normal(g * cog).astype(dtype)
        got, compiled = run_path(device, desc, x, w, b, path="gemm")
        assert any(isinstance(r, conv_ops.FilterTranspose) for r, _ in compiled.path.w_relayouts)
        ref = desc_reference(desc, x, w, b)
        np.testing.assert_allclose(got[:ref.size].reshape(ref.shape).astype(np.float64), ref,
                                   **tolerance(w, dtype))


def _probe_op(device):
    xd = dml.TensorDesc("float32", (1, 4, 4, 4))
    op = device.compile_operator(device.create_operator(dml.ConvolutionOperatorDesc(
        xd, dml.TensorDesc("float32", (4, 4, 1, 1)), None, xd)))
    op.release()
    return op


def test_path_choice(device):
    """Which path takes which shape (the per-shape dispatch of the module doc)."""
    def path_of(x, w, **kw):
        xd, wd = dml.TensorDesc("float32", x), dml.TensorDesc("float32", w)
        probe = dml.ConvolutionOperatorDesc(xd, wd, None, xd, **kw)
        desc = dml.ConvolutionOperatorDesc(xd, wd, None,
                                           dml.TensorDesc("float32", probe.expected_output_sizes()),
                                           **kw)
        op = device.compile_operator(device.create_operator(desc))
        name = op.path.name
        op.release()
        return name
    # the implicit GEMM: gemm_sg on CPU devices with subgroup shuffles, else gemm
    gemm = "gemm_sg" if _has_sg(device) else "gemm"
    pad = dict(start_padding=(1, 1), end_padding=(1, 1))
    # Winograd: where gemm_sg can run it, only with enough channels and tiles
    small = path_of((1, 32, 24, 24), (32, 32, 3, 3), **pad)
    big = path_of((1, 64, 56, 56), (64, 64, 3, 3), **pad)
    sg_small = "gemm_sg" in accepting_paths(device, _conv_desc("float32", (1, 32, 24, 24),
                                                               (32, 32, 3, 3), **pad))
    assert small == ("gemm_sg" if sg_small else "winograd")
    assert big == "winograd"
    assert path_of((1, 32, 8, 8), (32, 32, 3, 3)) == gemm            # too few tiles
    assert path_of((1, 8, 16, 16), (8, 1, 3, 3), group_count=8) == "depthwise"
    assert path_of((1, 16, 16, 16), (8, 16, 1, 1)) == gemm
    assert path_of((1, 8, 8, 8), (8, 4, 4, 4), strides=(2, 2),
                   direction="backward") == gemm
    assert path_of((1, 4, 8, 8), (2, 4, 3, 3)) == "direct"            # 2 output channels
    assert path_of((1, 8, 8, 8), (8, 1, 3, 3), group_count=8, direction="backward") in (
        "direct", "gemm")


# -- validation -----------------------------------------------------------------------------
def _desc(**over):
    """A valid 2-D forward descriptor with fields replaced by ``over``."""
    base = dict(input_tensor=dml.TensorDesc("float32", (2, 4, 8, 8)),
                filter_tensor=dml.TensorDesc("float32", (6, 2, 3, 3)),
                bias_tensor=dml.TensorDesc("float32", (1, 6, 1, 1)),
                output_tensor=dml.TensorDesc("float32", (2, 6, 6, 6)),
                group_count=2)
    base.update(over)
    return dml.ConvolutionOperatorDesc(**base)


def _fails(device, field, desc_or_fn):
    with pytest.raises(ValidationError) as info:
        d = desc_or_fn() if callable(desc_or_fn) else desc_or_fn
        device.create_operator(d)
    assert field in str(info.value), str(info.value)
    return str(info.value)


T = dml.TensorDesc


@pytest.mark.parametrize("field, over", [
    ("input_tensor.sizes", dict(input_tensor=T("float32", (2, 4)))),
    ("input_tensor.sizes", dict(input_tensor=T("float32", (1, 2, 4, 8, 8, 8)))),
    ("input_tensor.data_type", dict(input_tensor=T("float64", (2, 4, 8, 8)))),
    ("filter_tensor.data_type", dict(filter_tensor=T("float16", (6, 2, 3, 3)))),
    ("bias_tensor.data_type", dict(bias_tensor=T("float16", (1, 6, 1, 1)))),
    ("output_tensor.data_type", dict(output_tensor=T("float16", (2, 6, 6, 6)))),
    ("input_tensor.data_type", dict(input_tensor=T("int32", (2, 4, 8, 8)))),
    ("filter_tensor.sizes", dict(filter_tensor=T("float32", (6, 2, 3)))),
    ("bias_tensor.sizes", dict(bias_tensor=T("float32", (6,)))),
    ("bias_tensor.sizes", dict(bias_tensor=T("float32", (1, 5, 1, 1)))),
    ("output_tensor.sizes", dict(output_tensor=T("float32", (2, 6, 6, 6, 1)))),
    ("group_count", dict(group_count=3)),
    ("group_count", dict(group_count=0)),
    ("filter_tensor.sizes[0]", dict(filter_tensor=T("float32", (5, 2, 3, 3)),
                                    bias_tensor=None, output_tensor=T("float32", (2, 5, 6, 6)))),
    ("filter_tensor.sizes[1]", dict(filter_tensor=T("float32", (6, 4, 3, 3)))),
    ("output_tensor.sizes[0]", dict(output_tensor=T("float32", (1, 6, 6, 6)))),
    ("output_tensor.sizes[1]", dict(output_tensor=T("float32", (2, 4, 6, 6)))),
    ("output_tensor.sizes[2]", dict(output_tensor=T("float32", (2, 6, 7, 6)))),
    ("output_tensor.sizes[3]", dict(output_tensor=T("float32", (2, 6, 6, 5)))),
    ("strides", dict(strides=(1,))),
    ("strides[1]", dict(strides=(1, 0))),
    ("dilations", dict(dilations=(1, 1, 1))),
    ("dilations[0]", dict(dilations=(0, 1))),
    ("start_padding", dict(start_padding=(1,))),
    ("end_padding", dict(end_padding=(0, 0, 0))),
    ("output_padding", dict(output_padding=(0,))),
    ("start_padding[0]", dict(start_padding=(-1, 0))),
    ("strides", dict(strides=3)),
    ("filter_tensor.sizes[2]", dict(filter_tensor=T("float32", (6, 2, 9, 3)))),
    ("output_tensor.strides", dict(output_tensor=T("float32", (2, 6, 6, 6), (0, 36, 6, 1)))),
    ("fused_activation", dict(fused_activation="swish")),
    ("fused_activation", dict(fused_activation=3)),
    ("fused_activation.input_tensor", dict(
        fused_activation=dml.ActivationReluOperatorDesc(input_tensor=T("float32", (2, 6, 6, 6))))),
    ("fused_activation.output_tensor", dict(
        fused_activation=dml.ActivationReluOperatorDesc(output_tensor=T("float32", (1, 1, 1))))),
    ("fused_activation.alpha", dict(fused_activation=dml.ActivationEluOperatorDesc(
        alpha=float("nan")))),
    ("fused_activation.steepness", dict(fused_activation=dml.ActivationSoftplusOperatorDesc(
        steepness=0.0))),
    ("fused_activation.alpha", dict(fused_activation=dml.ActivationCeluOperatorDesc(alpha=0))),
    ("fused_activation.scale_bias", dict(fused_activation=dml.ElementWiseClipOperatorDesc(
        scale_bias=(1, 2)))),
    ("fused_activation.scale_bias.scale", dict(fused_activation=dml.ElementWiseClipOperatorDesc(
        scale_bias=dml.ScaleBias(float("inf"), 0)))),
    ("fused_activation.min", dict(fused_activation=dml.ElementWiseClipOperatorDesc(min="x"))),
    ("mode", dict(mode="diagonal")),
    ("direction", dict(direction=7)),
])
def test_validation(device, field, over):
    msg = _fails(device, "ConvolutionOperatorDesc." + field, lambda: _desc(**over))
    assert "ConvolutionOperatorDesc" in msg


def test_validation_backward(device):
    """Backward: filter {C_in, C_out/groups, ...}, output by the transposed formula."""
    x = T("float32", (1, 4, 5, 5))
    good = dict(input_tensor=x, filter_tensor=T("float32", (4, 3, 3, 3)), bias_tensor=None,
                output_tensor=T("float32", (1, 6, 9, 9)), group_count=2, strides=(2, 2),
                start_padding=(1, 1), end_padding=(1, 1), output_padding=(0, 0),
                direction="backward")
    device.create_operator(dml.ConvolutionOperatorDesc(**good))
    for field, over in [
        ("filter_tensor.sizes[0]", dict(filter_tensor=T("float32", (2, 3, 3, 3)))),
        ("output_tensor.sizes[1]", dict(filter_tensor=T("float32", (4, 2, 3, 3)))),
        ("output_tensor.sizes[2]", dict(output_padding=(1, 0))),
        ("output_tensor.sizes[3]", dict(end_padding=(1, 0))),
        ("end_padding[0]", dict(start_padding=(9, 1), end_padding=(5, 1))),
    ]:
        _fails(device, "ConvolutionOperatorDesc." + field,
               lambda: dml.ConvolutionOperatorDesc(**{**good, **over}))
    # through the functional form the output size is computed, the rule still holds
    with pytest.raises(ValidationError, match="end_padding"):
        vkml.convolution(np.zeros((1, 1, 2), np.float32), np.zeros((1, 1, 2), np.float32),
                         start_padding=[2], end_padding=[2], direction="backward",
                         device=device)


def test_validation_functional(device):
    x = np.zeros((1, 4, 6, 6), np.float32)
    w = np.zeros((2, 4, 3, 3), np.float32)
    with pytest.raises(ValidationError, match="filter_tensor.data_type"):
        vkml.convolution(x, w.astype(np.float16), device=device)
    with pytest.raises(ValidationError, match="input_tensor.data_type"):
        vkml.convolution(x.astype(np.float64), w.astype(np.float64), device=device)
    with pytest.raises(ValidationError, match="strides"):
        vkml.convolution(x, w, strides=[1, 1, 1], device=device)
    with pytest.raises(ValidationError, match="group_count"):
        vkml.convolution(x, w, group_count=3, device=device)
    with pytest.raises(ValidationError, match="filter_tensor.sizes"):
        vkml.convolution(x, w[:, :, :, :, None], device=device)
    with pytest.raises(ValidationError, match="input_tensor.sizes"):
        vkml.convolution(x[0, 0], w[0, 0], device=device)
    with pytest.raises(ValidationError, match="bias_tensor.sizes"):
        vkml.convolution(x, w, np.zeros(3, np.float32), device=device)
    with pytest.raises(ValidationError, match="mode"):
        vkml.convolution(x, w, mode="correlation", device=device)
    with pytest.raises(ValidationError, match="fused_activation"):
        vkml.convolution(x, w, fused_activation="hardmax", device=device)


def test_feature_levels():
    """3-D tensors need DML_FEATURE_LEVEL_4_0; a fused activation raises the level to the
    one that introduced it (CELU 3_0, SHRINK 2_0, GELU 5_1, CLIP fused 6_0, SOFTPLUS with
    steepness < 1: 6_4)."""
    FL = dml.FeatureLevel
    assert _desc().feature_level() == FL.FL_1_0
    d3 = dml.ConvolutionOperatorDesc(T("float32", (1, 1, 4)), T("float32", (1, 1, 2)), None,
                                     T("float32", (1, 1, 3)))
    assert d3.feature_level() == FL.FL_4_0
    for act, level in [("celu", FL.FL_3_0), ("shrink", FL.FL_2_0), ("gelu", FL.FL_5_1),
                       ("clip", FL.FL_6_0), ("relu", FL.FL_1_0),
                       (dml.ActivationSoftplusOperatorDesc(steepness=0.5), FL.FL_6_4),
                       (dml.ActivationSoftplusOperatorDesc(steepness=2.0), FL.FL_1_0)]:
        assert _desc(fused_activation=act).feature_level() == level, act


@pytest.mark.parametrize("dtype", ["float32", "float16", "float16-packed"])
@pytest.mark.parametrize("shape", [(2, 16, 17, 20), (1, 24, 16, 40), (3, 16, 24, 8)])
def test_winograd_v8_stores(device, shape, dtype):
    """``winograd-v8``: the input transform stores eight tiles of a transform point as one
    u64vec4 (int64 shaders, float4 input rows; V's rows padded to 8 tiles, the padding
    tiles zero), and the output transform two tiles' rows as one u64vec4 (float16: a
    u64vec2; rows of a multiple of 8): the same bits as ``winograd``'s float4 stores and
    the reference's values, packed float16 (no 16-bit storage) too; refused where the
    device has no int64 shaders."""
    if dtype == "float16-packed":
        if not device.info.features.get("storage16"):
            pytest.skip("float16 is packed on this device already (the float16 case)")
        with vkml.Device(device.index, disable_features=["storage16", "storage8"]) as dev:
            return check_winograd_v8(dev, shape, "float16")
    check_winograd_v8(device, shape, dtype)


def check_winograd_v8(device, shape, dtype):
    """test_winograd_v8_stores on ``device``."""
    rng = np.random.default_rng(sum(shape))
    desc = _conv_desc(dtype, shape, (shape[1] + 1, shape[1], 3, 3), start_padding=(1, 1),
                      end_padding=(1, 1), fused_activation="relu")
    x = rng.standard_normal(desc.input_tensor.sizes).astype(dtype)
    w = rng.standard_normal(desc.filter_tensor.sizes).astype(dtype)
    b = rng.standard_normal(shape[1] + 1).astype(dtype)
    if not device.info.features.get("int64"):
        with pytest.raises(vkml.UnsupportedError, match="winograd-v8"):
            run_path(device, desc, x, w, b, path="winograd-v8")
        return
    got, compiled = run_path(device, desc, x, w, b, path="winograd-v8")
    assert compiled.path.v8 and compiled.path.qt == 8 and compiled.path.gemm_v8
    # rows of a multiple of 8: the output pass stores two tiles' rows at once too
    assert compiled.path.y8 == (shape[3] % 8 == 0)
    four, plain = run_path(device, desc, x, w, b, path="winograd")
    assert not plain.path.v8
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), four.view(f"u{got.itemsize}"))
    ref = np.maximum(desc_reference(desc, x, w, b), 0)
    np.testing.assert_allclose(got.reshape(ref.shape), ref,
                               **path_tolerance("winograd", w, dtype))


def _same_nonfinite(got, want):
    """Equal inf/NaN patterns (NaN where the reference has NaN, +-inf where it has them,
    with their signs) and the finite outputs within float32 tolerance."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-4, atol=1e-4 * 12)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_owned_nonfinite_filter_on_every_path(device, bad):
    """An OWNED filter with one infinite (or NaN) weight: on every candidate the operator
    may take -- the heuristic's and each forced one, Winograd's included, which moves to
    another path at initialization (its transforms would make inf - inf = NaN) -- the
    output has the float64 reference's inf/NaN pattern (an ONNX Conv's default: no
    padding, where every tap meets the input)."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 16, 26, 26)).astype(np.float32)
    w = (rng.standard_normal((16, 16, 3, 3)) * 0.3).astype(np.float32)
    w[5, 3, 1, 2] = bad
    b = rng.standard_normal(16).astype(np.float32)
    owned = dml.TensorDesc("float32", w.shape, flags=dml.TensorFlags.OWNED_BY_DML)
    desc = dml.ConvolutionOperatorDesc(
        dml.TensorDesc("float32", x.shape), owned, dml.TensorDesc("float32", (1, 16, 1, 1)),
        dml.TensorDesc("float32", (1, 16, 24, 24)))
    want = convolution_reference(x, w, b)
    assert np.isinf(want).any() or np.isnan(want).any()
    ran = set()
    for name in [None] + list(conv_ops.CANDIDATES):
        try:
            op = (device.compile_operator(device.create_operator(desc)) if name is None
                  else compile_on_path(device, desc, name))
        except vkml.UnsupportedError:
            continue
        winograd = op.path.name == "winograd"
        op.initialize(filter=w)
        assert op.path.name != "winograd"
        assert not winograd or op.path.candidate != name
        ran.add(op.path.name)
        tx, tb = device.tensor(x), device.tensor(b.reshape(1, 16, 1, 1))
        y = device.empty((1, 16, 24, 24))
        op.execute([tx, None, tb], [y])
        _same_nonfinite(y.numpy(), want)
        op.release()
    assert "direct" in ran and len(ran) >= 3


def test_owned_finite_filter_keeps_winograd(device):
    """A finite OWNED filter stays on the Winograd path it was compiled for."""
    rng = np.random.default_rng(12)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    owned = dml.TensorDesc("float32", w.shape, flags=dml.TensorFlags.OWNED_BY_DML)
    desc = dml.ConvolutionOperatorDesc(
        dml.TensorDesc("float32", (1, 16, 26, 26)), owned, None,
        dml.TensorDesc("float32", (1, 16, 24, 24)))
    op = compile_on_path(device, desc, "winograd")
    try:
        op.initialize(filter=w)
        assert op.path.name == "winograd" and op.path.filter_ready
    finally:
        op.release()


def test_owned_nonfinite_filter_with_absorbed_pooling(device):
    """Winograd with the LP pooling in its output pass (a graph's fusion): an OWNED filter
    with an infinite weight moves the convolution off Winograd and runs the pooling
    apart, the operator's output still the pooled tensor: the reference's pooled
    inf/NaN pattern."""
    from references import lp_pooling_reference
    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 16, 26, 26)).astype(np.float32)
    w = (rng.standard_normal((16, 16, 3, 3)) * 0.3).astype(np.float32)
    w[2, 7, 0, 0] = -np.inf
    f32 = lambda *s: dml.TensorDesc("float32", s)     # noqa: E731
    owned = dml.TensorDesc("float32", w.shape, flags=dml.TensorFlags.OWNED_BY_DML)
    desc = dml.ConvolutionOperatorDesc(f32(1, 16, 26, 26), owned, None, f32(1, 16, 24, 24))
    pool = dml.LpPooling1OperatorDesc(f32(1, 16, 24, 24), f32(1, 16, 12, 12), (2, 2), (2, 2),
                                      (0, 0), (0, 0), (1, 1), 2)
    device.create_operator(desc)
    op = conv_ops.CompiledConvolution(device, desc, path="winograd", pool=pool)
    try:
        assert isinstance(op.desc, conv_ops.PooledConvolutionDesc)
        op.initialize(filter=w)
        assert op.path.name != "winograd" and op.path.pool is pool
        y = device.empty((1, 16, 12, 12))
        op.execute([device.tensor(x), None, None], [y])
        want = lp_pooling_reference(convolution_reference(x, w), (2, 2), (2, 2), p=2)
        assert np.isinf(want).any()
        _same_nonfinite(y.numpy(), want)
    finally:
        op.release()

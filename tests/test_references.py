"""The references of tests/references.py checked once against PyTorch's CPU operators in
float64, on small random cases of every configuration torch can express: F.pad,
F.unfold / F.fold (2-D) and, for 1-D to 3-D, the same through convolutions with one-hot
filters; F.lp_pool*d and, with padding and dilation, a convolution with a ones filter;
F.conv*d / F.conv_transpose*d.  torch has no symmetric padding mode, nor asymmetric
padding in its window operators: those go through F.pad or a crop first.  No device.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from references import (activation_reference, convolution_reference, fold_reference,
                        lp_pooling_reference, pad_reference, unfold_reference, window_counts)

CASES = 25
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
TORCH_PAD_MODE = {"constant": "constant", "edge": "replicate", "reflection": "reflect",
                  "wrap": "circular"}


def _t(a):
    return torch.from_numpy(np.asarray(a, np.float64))


def _torch_pads(start, end):
    """F.pad's order: last dimension first, (start, end) each."""
    pads = []
    for a, e in zip(reversed(start), reversed(end)):
        pads += [a, e]
    return pads


def _case(rng, d):
    window = [int(rng.integers(1, 4)) for _ in range(d)]
    strides = [int(rng.integers(1, 4)) for _ in range(d)]
    dil = [int(rng.integers(1, 3)) for _ in range(d)]
    start = [int(rng.integers(0, 3)) for _ in range(d)]
    end = [int(rng.integers(0, 3)) for _ in range(d)]
    spatial = [max(1, dl * (w - 1) + 1 - a - e) + int(rng.integers(0, 5))
               for w, dl, a, e in zip(window, dil, start, end)]
    return spatial, window, strides, dil, start, end


@pytest.mark.parametrize("mode", list(TORCH_PAD_MODE))
def test_pad(mode):
    """torch pads only the last 1-3 dimensions; reflect needs padding < size, circular
    padding <= size."""
    rng = np.random.default_rng(1)
    for _ in range(CASES):
        d = int(rng.integers(1, 4))
        shape = [int(rng.integers(1, 3)), int(rng.integers(1, 3))] + \
            [int(rng.integers(2, 6)) for _ in range(d)]
        limit = {"reflection": -1, "wrap": 0}.get(mode, 4)
        start = [0, 0] + [int(rng.integers(0, min(4, s + limit) + 1)) for s in shape[2:]]
        end = [0, 0] + [int(rng.integers(0, min(4, s + limit) + 1)) for s in shape[2:]]
        x = rng.standard_normal(shape)
        kw = {"value": 2.5} if mode == "constant" else {}
        want = F.pad(_t(x), _torch_pads(start[2:], end[2:]), TORCH_PAD_MODE[mode], **kw)
        got = pad_reference(x, start, end, mode, 2.5)
        np.testing.assert_array_equal(got, want.numpy())


def test_pad_page_rows():
    """torch has no symmetric mode: a row of each of the page's examples (StartPadding 2,
    EndPadding 4 on the row [1, 2, 3, 4]) checks every mode by hand."""
    row = np.array([1, 2, 3, 4])
    rows = {"constant": [9, 9, 1, 2, 3, 4, 9, 9, 9, 9], "edge": [1, 1, 1, 2, 3, 4, 4, 4, 4, 4],
            "reflection": [3, 2, 1, 2, 3, 4, 3, 2, 1, 2],
            "symmetric": [2, 1, 1, 2, 3, 4, 4, 3, 2, 1], "wrap": [3, 4, 1, 2, 3, 4, 1, 2, 3, 4]}
    for mode, want in rows.items():
        np.testing.assert_array_equal(pad_reference(row, [2], [4], mode, 9), want, mode)


def test_unfold_and_fold_2d():
    """F.unfold / F.fold, the asymmetric padding applied (unfold) or cropped (fold)."""
    rng = np.random.default_rng(2)
    for _ in range(CASES):
        spatial, window, strides, dil, start, end = _case(rng, 2)
        x = rng.standard_normal([2, 3] + spatial)
        padded = F.pad(_t(x), _torch_pads(start, end))
        want = F.unfold(padded, window, dil, 0, strides).numpy()
        np.testing.assert_array_equal(unfold_reference(x, window, strides, dil, start, end),
                                      want)
        cols = rng.standard_normal(want.shape)
        full = F.fold(_t(cols), list(padded.shape[2:]), window, dil, 0, strides)
        want = full[:, :, start[0]:start[0] + spatial[0], start[1]:start[1] + spatial[1]]
        np.testing.assert_allclose(fold_reference(cols, spatial, window, strides, dil, start,
                                                  end), want.numpy(), rtol=1e-12, atol=1e-12)


def _one_hot(window):
    k = math.prod(window)
    return _t(np.eye(k).reshape(k, 1, *window))


@pytest.mark.parametrize("d", [1, 2, 3])
def test_unfold_and_fold_as_one_hot_convolutions(d):
    """Unfold is a convolution of each channel with the K one-hot filters; Fold the
    transposed convolution of the columns with them, cropped by the padding."""
    rng = np.random.default_rng(10 + d)
    for _ in range(CASES):
        spatial, window, strides, dil, start, end = _case(rng, d)
        n, c, k = 2, 3, math.prod(window)
        x = rng.standard_normal([n, c] + spatial)
        padded = F.pad(_t(x), _torch_pads(start, end)).reshape(n * c, 1, *[
            s + a + e for s, a, e in zip(spatial, start, end)])
        blocks = CONV[d](padded, _one_hot(window), None, strides, 0, dil)
        want = blocks.reshape(n, c * k, -1).numpy()
        np.testing.assert_array_equal(unfold_reference(x, window, strides, dil, start, end),
                                      want)
        cols = rng.standard_normal(want.shape)
        counts = window_counts(spatial, window, strides, dil, start, end)
        full = CONV_T[d](_t(cols).reshape(n * c, k, *counts), _one_hot(window), None, strides,
                         0, 0, 1, dil)
        crop = tuple(slice(a, a + s) for a, s in zip(start, spatial))
        full = F.pad(full, _torch_pads([0] * d, [max(0, a + s - f) for a, s, f in
                                                 zip(start, spatial, full.shape[2:])]))
        want = full[(slice(None), slice(None)) + crop].reshape(n, c, *spatial).numpy()
        np.testing.assert_allclose(fold_reference(cols, spatial, window, strides, dil, start,
                                                  end), want, rtol=1e-12, atol=1e-12)


def test_fold_sums_integers_in_their_type():
    cols = np.full((1, 4, 4), 200, np.uint8)
    got = fold_reference(cols, (3, 3), (2, 2))
    assert got.dtype == np.uint8 and got[0, 0, 1, 1] == (4 * 200) % 256


@pytest.mark.parametrize("d", [1, 2, 3])
def test_lp_pooling(d):
    """F.lp_pool*d (no padding, no dilation, positive inputs: torch drops |x|); and with
    padding and dilation, (ones-filter convolution of |x|^p)^(1/p)."""
    rng = np.random.default_rng(20 + d)
    pool = {1: F.lp_pool1d, 2: F.lp_pool2d, 3: F.lp_pool3d}[d]
    for i in range(CASES):
        p = [1, 2, 3, 5][i % 4]
        spatial, window, strides, dil, start, end = _case(rng, d)
        x = rng.uniform(0.1, 3.0, [2, 3] + [max(s, w) for s, w in zip(spatial, window)])
        k, s = (window[0], strides[0]) if d == 1 else (window, strides)
        want = pool(_t(x), p, k, s).numpy()
        np.testing.assert_allclose(lp_pooling_reference(x, window, strides, None, None, None,
                                                         p), want, rtol=1e-12)
        x = rng.standard_normal([2, 3] + spatial) * 4
        powers = F.pad(_t(np.abs(x)) ** p, _torch_pads(start, end))
        sums = CONV[d](powers.reshape(6, 1, *powers.shape[2:]), _t(np.ones([1, 1] + window)),
                       None, strides, 0, dil)
        want = (sums ** (1.0 / p)).reshape(2, 3, *sums.shape[2:]).numpy()
        np.testing.assert_allclose(lp_pooling_reference(x, window, strides, dil, start, end,
                                                         p), want, rtol=1e-12, atol=1e-300)


def test_lp_pooling_extremes():
    """No overflow where the result is representable; NaN wins over infinity."""
    x = np.array([[[1e300, 1e300, np.inf, 1.0, np.nan, np.inf]]])
    np.testing.assert_allclose(lp_pooling_reference(x[:, :, :2], [2], p=3),
                               [[[2 ** (1 / 3) * 1e300]]])
    got = lp_pooling_reference(x, [2], [2], p=2)
    assert np.isinf(got[0, 0, 1]) and np.isnan(got[0, 0, 2])


def torch_convolution(x, w, b, strides, dilations, start, end, outpad, groups, mode,
                      direction):
    """The convolution through torch: asymmetric padding applied to the input (forward)
    or cropped from the full transposed result (backward); output padding appended."""
    nd = x.ndim - 2
    wt = _t(w)
    if mode == "convolution":
        wt = torch.flip(wt, dims=list(range(2, 2 + nd)))
    tail = _torch_pads([0] * nd, outpad)
    if direction == "forward":
        y = F.pad(CONV[nd](F.pad(_t(x), _torch_pads(start, end)), wt, None, strides, 0,
                           dilations, groups), tail)
    else:
        y = F.pad(CONV_T[nd](_t(x), wt, None, strides, 0, 0, groups, dilations), tail)
        y = y[(slice(None), slice(None)) + tuple(
            slice(a, y.shape[2 + i] - e) for i, (a, e) in enumerate(zip(start, end)))]
    y = y.numpy()
    if b is not None:
        y = y + np.asarray(b, np.float64).reshape((1, -1) + (1,) * nd)
    return y


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("d", [1, 2, 3])
def test_convolution(d, direction):
    rng = np.random.default_rng(30 + d + (direction == "backward"))
    done = 0
    while done < CASES:
        spatial, k, strides, dil, start, end = _case(rng, d)
        outpad = [int(rng.integers(0, 3)) if rng.random() < 0.3 else 0 for _ in range(d)]
        g = int(rng.choice([1, 2, 3]))
        cin, cout = g * int(rng.integers(1, 3)), g * int(rng.integers(1, 3))
        if direction == "backward":
            spatial = [int(rng.integers(1, 5)) for _ in range(d)]
            full = [(i - 1) * s + dl * (kk - 1) + 1 for i, s, dl, kk in
                    zip(spatial, strides, dil, k)]
            if any(a + e >= f for a, e, f in zip(start, end, full)):
                continue
        wshape = ((cin, cout // g) if direction == "backward" else (cout, cin // g)) + tuple(k)
        x = rng.standard_normal([2, cin] + spatial)
        w = rng.standard_normal(wshape)
        b = rng.standard_normal(cout) if rng.random() < 0.6 else None
        mode = "convolution" if rng.random() < 0.3 else "cross_correlation"
        args = (strides, dil, start, end, outpad, g, mode, direction)
        np.testing.assert_allclose(convolution_reference(x, w, b, *args),
                                   torch_convolution(x, w, b, *args), rtol=1e-10, atol=1e-10)
        done += 1


def test_activations_against_torch():
    y = np.linspace(-6, 6, 97)
    checks = {"relu": F.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "gelu": F.gelu,
              "softsign": F.softsign, "elu": F.elu, "celu": lambda t: F.celu(t, 2.5),
              "leaky_relu": lambda t: F.leaky_relu(t, 0.01),
              "hard_sigmoid": lambda t: torch.clamp(0.2 * t + 0.5, 0, 1),
              "softplus": lambda t: F.softplus(t, 3.0),
              "shrink": lambda t: F.softshrink(t, 0.5)}
    params = {"celu": dict(alpha=2.5), "softplus": dict(steepness=3.0),
              "shrink": dict(bias=0.5, threshold=0.5)}
    for name, fn in checks.items():
        np.testing.assert_allclose(activation_reference(y, name, **params.get(name, {})),
                                   fn(_t(y)).numpy(), rtol=1e-12, atol=1e-12, err_msg=name)
    assert activation_reference(y, None) is y


def test_parameters_never_wrap():
    """Strides, dilations and paddings beyond 32 bits (also as NumPy uint32 scalars, which
    would wrap in NumPy arithmetic) are Python ints inside the references."""
    x = np.arange(1.0, 6.0).reshape(1, 1, 5)
    huge = 2 ** 40
    cols = unfold_reference(x, [2], [huge], [1], [huge], [0])
    np.testing.assert_array_equal(cols, [[[0, 1], [0, 2]]])     # block 0 all padding
    u32 = np.uint32(2 ** 32 - 1)
    np.testing.assert_array_equal(unfold_reference(x, [2], [u32], [u32], [0], [u32]),
                                  [[[1], [0]]])
    np.testing.assert_array_equal(fold_reference(cols, [5], [2], [huge], [1], [huge], [0]),
                                  [[[1, 2, 0, 0, 0]]])
    np.testing.assert_array_equal(lp_pooling_reference(x, [2], [u32], [u32], [u32], [u32], 2),
                                  [[[1, 1]]])
    y = convolution_reference(x, np.ones((1, 1, 2)), None, [u32], [u32], [0], [u32])
    np.testing.assert_array_equal(y, [[[1]]])
    y = convolution_reference(x, np.ones((1, 1, 2)), None, [u32], [1], [u32], [u32])
    np.testing.assert_array_equal(y, [[[0, 3, 0]]])

"""The gemv convolution path (``glsl/convolution_gemv.comp``): 1x1 convolutions of 1x1
planes -- a squeeze-excitation block's fully connected layers -- with the input channels
split over a subgroup's lanes.  Against a float64 NumPy product: random channel counts
(from fewer than a subgroup to more than a thousand, not multiples of 4), batches, bias
or none, fused activations, strided tensors and every split of the reduction (the knob
``gemv_split``); what it declines; and that it is the heuristic's choice for the shape."""
from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

import vkml
from vkml import dml

from helpers import compile_on_path, run_desc

conv_ops = importlib.import_module("vkml.ops.convolution")   # the module, not the function


def _desc(n, cin, cout, bias=True, act=None, x_strides=None, y_strides=None, dtype="float32"):
    x = dml.TensorDesc(dtype, (n, cin, 1, 1), x_strides)
    w = dml.TensorDesc(dtype, (cout, cin, 1, 1))
    b = dml.TensorDesc(dtype, (1, cout, 1, 1)) if bias else None
    y = dml.TensorDesc(dtype, (n, cout, 1, 1), y_strides)
    return dml.ConvolutionOperatorDesc(
        x, w, b, y, fused_activation=None if act is None else dml.OPERATOR_ACTIVATIONS[act]())


def _strided(a: np.ndarray, strides) -> np.ndarray:
    """``a`` (N, C, 1, 1) laid out with element ``strides`` (N, C, -, -) in a flat array."""
    n, c = a.shape[:2]
    flat = np.full(strides[0] * (n - 1) + strides[1] * (c - 1) + 1, np.nan, a.dtype)
    for i in range(n):
        flat[i * strides[0]:i * strides[0] + strides[1] * c:strides[1]] = a[i, :, 0, 0]
    return flat


def _reference(x, w, b, act):
    z = x[:, :, 0, 0].astype(np.float64) @ w[:, :, 0, 0].astype(np.float64).T
    if b is not None:
        z = z + b.reshape(1, -1)
    if act == "relu":
        z = np.maximum(z, 0)
    elif act == "sigmoid":
        z = 1 / (1 + np.exp(-z))
    return z


def _run(device, desc, path, x, w, b):
    compiled = compile_on_path(device, desc, path)
    got = run_desc(device, desc, x, w, b, compiled=compiled)
    y = desc.output_tensor
    n, c = y.sizes[:2]
    s = y.element_strides
    return np.array([[got[i * s[0] + j * s[1]] for j in range(c)] for i in range(n)]), compiled


@pytest.mark.parametrize("split", [None, 1, 4, 8])
def test_against_numpy(device, monkeypatch, split):
    """Random shapes on the gemv path with the reduction split ``split`` ways (None: the
    heuristic's split); the input and output strided every other case (channels apart:
    fetched one at a time), the last case's images apart by a padded stride (channels
    packed: fetched four at a time, X4, as every packed case of 4k channels)."""
    name = "gemv" if split is None else f"gemv-split{split}"
    monkeypatch.setitem(conv_ops.CANDIDATES, name, ("gemv", {"gemv_split": split}))
    rng = np.random.default_rng(51 + (split or 0))
    for k, (cin, cout) in enumerate([(1152, 48), (48, 1152), (6, 144), (240, 10),
                                     (3, 5), (37, 1), (96, 4), (1000, 33), (64, 24)]):
        n = int(rng.integers(1, 4))
        bias, act = k % 3 != 2, [None, "relu", "sigmoid"][k % 3]
        xs = (cin * 3 + 5, 3, 1, 1) if k % 2 else (cin + 8, 1, 1, 1) if k == 8 else None
        ys = (cout * 2 + 1, 2, 1, 1) if k % 2 else None
        desc = _desc(n, cin, cout, bias, act, xs, ys)
        x = rng.standard_normal((n, cin, 1, 1)).astype(np.float32)
        w = (rng.standard_normal((cout, cin, 1, 1)) / math.sqrt(cin)).astype(np.float32)
        b = rng.standard_normal(cout).astype(np.float32) if bias else None
        try:
            got, compiled = _run(device, desc, name, _strided(x, xs) if xs else x, w, b)
        except vkml.UnsupportedError:
            pytest.skip("the device has no full subgroups with shuffles")
        assert compiled.path.x4 == (cin % 4 == 0 and k % 2 == 0)
        np.testing.assert_allclose(got, _reference(x, w, b, act), rtol=1e-5,
                                   atol=2e-5 * math.sqrt(cin), err_msg=f"{cin}->{cout} n={n}")


def test_declines_and_heuristic(device):
    """Not a 1x1 plane, a 3x3 kernel, groups, float16: UnsupportedError when forced;
    the 1x1-plane shape is the heuristic's first choice where the device takes it."""
    x = dml.TensorDesc("float32", (1, 8, 2, 1))
    bad = [dml.ConvolutionOperatorDesc(x, dml.TensorDesc("float32", (4, 8, 1, 1)), None,
                                       dml.TensorDesc("float32", (1, 4, 2, 1))),
           dml.ConvolutionOperatorDesc(
               dml.TensorDesc("float32", (1, 8, 3, 3)), dml.TensorDesc("float32", (4, 8, 3, 3)),
               None, dml.TensorDesc("float32", (1, 4, 1, 1))),
           dml.ConvolutionOperatorDesc(
               dml.TensorDesc("float32", (1, 8, 1, 1)), dml.TensorDesc("float32", (4, 4, 1, 1)),
               None, dml.TensorDesc("float32", (1, 4, 1, 1)), group_count=2),
           _desc(1, 8, 4, dtype="float16")]
    for desc in bad:
        with pytest.raises(vkml.UnsupportedError):
            compile_on_path(device, desc, "gemv")
    desc = _desc(1, 64, 16)
    op = device.create_operator(desc)
    probe = conv_ops.CompiledConvolution(device, op.desc, path="direct")
    order = conv_ops.heuristic(probe, probe.geometry)
    probe.release()
    assert order[0] == "gemv" or "gemv" not in order

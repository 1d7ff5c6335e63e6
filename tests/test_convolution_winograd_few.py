"""Winograd's 36 GEMMs on few tiles with many output channels (ResNet's layer4: 512
channels on 7x7, 4 tiles): the lanes along output channels then take 16 channels each
(``winograd.cl_blocks``, up to ``FEW_TILES`` tiles).  Against the float64 reference
(``convolution_reference``): 1 to 4 tiles, one and two images, channel counts padded to
the block or not, bias, a fused activation, both modes; the small cases fit
SwiftShader's texel views (the larger ones are declined there)."""
from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

import vkml
from vkml import dml

from helpers import compile_on_path, run_desc
from references import convolution_reference

winograd = importlib.import_module("vkml.ops.convolution.winograd")


def test_cl_blocks_rule():
    """16 channels a lane only up to FEW_TILES tiles and where it pads no more channels
    than 8 or 4 would; the blocks of more tiles are unchanged."""
    assert winograd.cl_blocks(512, 4, 8) == (16, 4)
    assert winograd.cl_blocks(128, 4, 4) == (16, 4)
    assert winograd.cl_blocks(64, 4, 4) == (16, 4)          # SwiftShader: subgroups of 4
    assert winograd.cl_blocks(136, 4, 8)[0] == 4          # 16 would pad to 256
    assert winograd.cl_blocks(512, 16, 8) == (8, 16)
    assert winograd.cl_blocks(64, 196, 8) == (8, 28)


@pytest.mark.parametrize("x_shape, cout, act, mode", [
    ((1, 24, 7, 7), 128, None, "CROSS_CORRELATION"),       # 2x2 tiles, the last partial
    ((2, 16, 4, 4), 256, "relu", "CROSS_CORRELATION"),     # one tile an image
    ((1, 40, 5, 8), 136, None, "CONVOLUTION"),             # 2 tiles, channels padded
    ((1, 17, 3, 3), 192, "sigmoid", "CROSS_CORRELATION"),  # a 3x3 output: one tile
    # small enough for U and V to fit SwiftShader's texel views (65536 elements)
    ((2, 16, 4, 4), 64, "relu", "CROSS_CORRELATION"),
    ((1, 16, 7, 7), 64, None, "CONVOLUTION"),
])
def test_few_tiles_many_channels(device, x_shape, cout, act, mode):
    rng = np.random.default_rng(cout + x_shape[1])
    cin = x_shape[1]
    kw = dict(start_padding=(1, 1), end_padding=(1, 1), mode=dml.ConvolutionMode[mode])
    xd = dml.TensorDesc("float32", x_shape)
    wd = dml.TensorDesc("float32", (cout, cin, 3, 3))
    out = dml.ConvolutionOperatorDesc(xd, wd, None, xd, **kw).expected_output_sizes()
    desc = dml.ConvolutionOperatorDesc(
        xd, wd, dml.TensorDesc("float32", (1, cout, 1, 1)), dml.TensorDesc("float32", out),
        fused_activation=None if act is None else dml.OPERATOR_ACTIVATIONS[act](), **kw)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (rng.standard_normal((cout, cin, 3, 3)) / math.sqrt(9 * cin)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    try:
        compiled = compile_on_path(device, desc, "winograd-cl")
    except vkml.UnsupportedError:
        pytest.skip("winograd-cl declined: no full subgroups with shuffles, or U and V "
                    "beyond the device's texel views")
    p = compiled.path
    tiles = p.T
    assert tiles <= winograd.FEW_TILES
    assert (p.mb, p.nb) == winograd.cl_blocks(cout, tiles, p.sg)
    if cout % (16 * p.sg) == 0:
        assert p.mb == 16
    got = run_desc(device, desc, x, w, b.reshape(1, -1, 1, 1), compiled=compiled)
    want = convolution_reference(x.astype(np.float64), w.astype(np.float64),
                                 b.astype(np.float64), [1, 1], [1, 1], [1, 1], [1, 1],
                                 [0, 0], 1, mode.lower(), "forward")
    if act == "relu":
        want = np.maximum(want, 0)
    elif act == "sigmoid":
        want = 1 / (1 + np.exp(-want))
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)

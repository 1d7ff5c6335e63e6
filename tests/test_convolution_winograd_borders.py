"""Winograd's input transform at the input's borders: every tile reads its 6x6 window
unconditionally (at index 0 where an element lies outside the input) and selects zero
there, so the padding, the partial last tiles, the tiles past the last one and strided
inputs all go through that selection.  Against the float64 reference
(``convolution_reference``) on the logical input (strided inputs read with
``as_strided``): planes not a multiple of the tile, one-tile planes, padding 0/1/2 on
either side, channels-last and padded-row strides, both read forms (float4 rows and
element reads), float32 and float16."""
from __future__ import annotations

import math

import numpy as np
import pytest

import vkml
from vkml import dml

from helpers import compile_on_path, run_desc
from references import convolution_reference


def _strides(layout, shape):
    """Element strides of an NCHW ``shape`` laid out as ``layout``."""
    n, c, h, w = shape
    if layout == "nhwc":
        return (h * w * c, 1, w * c, c)
    if layout == "rows+4":                     # rows 4 elements longer than the plane's
        return (c * h * (w + 4), h * (w + 4), w + 4, 1)
    return None


CASES = [
    # shape, start, end, layout, dtype
    ((32, 16, 4, 4), (1, 1), (1, 1), None, "float32"),       # one tile an image
    ((40, 16, 3, 2), (2, 2), (1, 2), None, "float32"),       # one partial tile an image
    ((1, 16, 23, 26), (2, 0), (0, 2), None, "float32"),      # planes not a multiple of 4
    ((2, 16, 13, 9), (2, 2), (2, 2), None, "float32"),
    ((1, 17, 30, 30), (0, 0), (0, 0), None, "float32"),      # no padding
    ((1, 16, 16, 16), (0, 2), (2, 0), None, "float32"),      # float4 rows, offset 2
    ((1, 16, 20, 28), (1, 3), (1, 1), None, "float32"),      # float4 rows, offset 1
    ((2, 16, 12, 16), (1, 2), (2, 1), "nhwc", "float32"),    # channels last
    ((1, 16, 21, 20), (1, 1), (2, 0), "rows+4", "float32"),  # padded rows (float4 rows)
    ((1, 16, 22, 19), (2, 1), (0, 1), "rows+4", "float32"),
    ((1, 16, 23, 26), (2, 0), (0, 2), None, "float16"),
    ((1, 16, 20, 20), (0, 1), (2, 1), "nhwc", "float16"),
    ((1, 16, 16, 24), (1, 2), (1, 0), None, "float16"),
]


@pytest.mark.parametrize("shape, start, end, layout, dtype", CASES)
def test_input_borders(device, shape, start, end, layout, dtype):
    rng = np.random.default_rng(sum(shape) + 7 * start[0] + 3 * end[1])
    cout = 16
    xd = dml.TensorDesc(dtype, shape, _strides(layout, shape))
    wd = dml.TensorDesc(dtype, (cout, shape[1], 3, 3))
    kw = dict(start_padding=start, end_padding=end)
    out = dml.ConvolutionOperatorDesc(xd, wd, None, xd, **kw).expected_output_sizes()
    desc = dml.ConvolutionOperatorDesc(xd, wd, dml.TensorDesc(dtype, (1, cout, 1, 1)),
                                       dml.TensorDesc(dtype, out), **kw)
    esize = np.dtype(dtype).itemsize
    flat = rng.standard_normal(xd.total_tensor_size_in_bytes // esize).astype(dtype)
    x = np.lib.stride_tricks.as_strided(flat, shape, tuple(esize * s for s in xd.strides)
                                        ) if xd.strides else flat.reshape(shape)
    w = (rng.standard_normal(wd.sizes) / math.sqrt(9 * shape[1])).astype(dtype)
    b = rng.standard_normal(cout).astype(dtype)
    try:
        compiled = compile_on_path(device, desc, "winograd")
    except vkml.UnsupportedError as exc:
        pytest.skip(f"winograd declined: {exc}")
    got = run_desc(device, desc, flat, w, b.reshape(1, -1, 1, 1), compiled=compiled)
    want = convolution_reference(x.astype(np.float64), w.astype(np.float64),
                                 b.astype(np.float64), [1, 1], [1, 1], list(start),
                                 list(end), [0, 0], 1, "cross_correlation", "forward")
    tol = 2e-3 if dtype == "float16" else 1e-4
    np.testing.assert_allclose(got.reshape(want.shape).astype(np.float64), want,
                               rtol=tol, atol=tol * 4)

"""Winograd's output pass at the output's borders: with float4 rows (V4, and V8's pairs of
tiles) no store is conditional, a partial tile's rows past the output stored again at the
last row inside with that row's values; element by element the stores stay guarded.  The
bias is read at index 0 and selected away where the descriptor has none, the residual
likewise where the graph fuses none.  Against the float64 reference
(``convolution_reference``): output planes of partial bottom tiles, partial right tiles,
one-tile planes and whole tiles, on each store form, with and without bias, a fused
activation, float32 and float16, alone and with a fused residual Add (ADD1's Relu)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import vkml
from vkml import dml

from helpers import compile_on_path, run_desc, run_graph
from references import convolution_reference

F = dml.TensorDesc

CASES = [
    # input (padding 1 keeps the plane), candidate, rows' store form
    ((2, 16, 13, 16), "winograd", "_v4"),          # partial bottom tiles, float4 rows
    ((1, 16, 10, 24), "winograd-v8", "_v"),        # the same, tile pairs where offered
    ((1, 16, 3, 8), "winograd-v8", "_v"),          # one partial tile row
    ((1, 16, 11, 13), "winograd", ""),             # partial bottom and right tiles
    ((3, 16, 2, 3), "winograd", ""),               # one partial tile an image
    ((1, 16, 8, 12), "winograd", "_v4"),           # whole tiles
]


def _want(x, w, b, skip=None, act=None):
    want = convolution_reference(x.astype(np.float64), w.astype(np.float64),
                                 None if b is None else b.reshape(-1).astype(np.float64),
                                 [1, 1], [1, 1], [1, 1], [1, 1], [0, 0], 1,
                                 "cross_correlation", "forward")
    if skip is not None:
        want = want + skip.astype(np.float64)
    return np.maximum(want, 0) if act == "relu" else want


def _tol(dtype):
    return dict(rtol=5e-3, atol=5e-2) if dtype == "float16" else dict(rtol=1e-4, atol=3e-4)


def _arrays(rng, shape, cout, dtype):
    x = (2 * rng.standard_normal(shape)).astype(dtype)
    w = (rng.standard_normal((cout, shape[1], 3, 3)) / math.sqrt(9 * shape[1])).astype(dtype)
    b = (0.5 * rng.standard_normal((1, cout, 1, 1))).astype(dtype)
    return x, w, b


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape,cand,form", CASES)
def test_output_borders(device, shape, cand, form, dtype):
    rng = np.random.default_rng(sum(shape) + len(cand))
    cout = 16
    for k, (bias, act) in enumerate(((True, "relu"), (False, None))):
        x, w, b = _arrays(rng, shape, cout, dtype)
        xd = F(dtype, shape)
        out = (shape[0], cout, shape[2], shape[3])
        desc = dml.ConvolutionOperatorDesc(
            xd, F(dtype, w.shape), F(dtype, b.shape) if bias else None, F(dtype, out),
            start_padding=(1, 1), end_padding=(1, 1),
            fused_activation=dml.OPERATOR_ACTIVATIONS[act]() if act else None)
        try:
            compiled = compile_on_path(device, desc, cand)
        except vkml.UnsupportedError as exc:
            pytest.skip(f"{cand} declined: {exc}")
        kernel = compiled.path.out_kernel
        assert (form in kernel) if form else "_v" not in kernel, kernel
        got = run_desc(device, desc, x, w, b if bias else None, compiled=compiled)
        np.testing.assert_allclose(got.reshape(out).astype(np.float64),
                                   _want(x, w, b if bias else None, act=act),
                                   err_msg=f"{kernel} bias={bias} act={act}", **_tol(dtype))


def _residual_graph(dtype, shape, cout):
    """x -> conv (w, b) -> ADD1(conv, skip) with a fused Relu -> y."""
    x, w, b = F(dtype, shape), F(dtype, (cout, shape[1], 3, 3)), F(dtype, (1, cout, 1, 1))
    y = F(dtype, (shape[0], cout, shape[2], shape[3]))
    conv = dml.ConvolutionOperatorDesc(x, w, b, y, start_padding=(1, 1), end_padding=(1, 1))
    add = dml.ElementWiseAdd1OperatorDesc(y, y, y,
                                          fused_activation=dml.OPERATOR_ACTIVATIONS["relu"]())
    N, IN, OUT = dml.OperatorGraphNodeDesc, dml.InputGraphEdgeDesc, dml.OutputGraphEdgeDesc
    return dml.GraphDesc(4, 1, [N(conv, name="conv"), N(add, name="add")],
                         [IN(0, 0, 0), IN(1, 0, 1), IN(2, 0, 2), IN(3, 1, 1)],
                         [OUT(1, 0, 0)], [dml.IntermediateGraphEdgeDesc(0, 0, 1, 0)])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape,cand,form", CASES)
def test_output_borders_residual(device, shape, cand, form, dtype):
    rng = np.random.default_rng(3 * sum(shape) + len(cand))
    cout = 16
    x, w, b = _arrays(rng, shape, cout, dtype)
    skip = rng.standard_normal((shape[0], cout, shape[2], shape[3])).astype(dtype)
    try:
        cg, (got,) = run_graph(device, _residual_graph(dtype, shape, cout), [x, w, b, skip],
                               dtype, paths={0: cand})
    except vkml.UnsupportedError as exc:
        pytest.skip(f"{cand} declined: {exc}")
    kernel = cg._graph_nodes[0].compiled.path.out_kernel
    assert [f.kind for f in cg.fusions][:1] == ["residual"], cg.fusions
    assert (form in kernel) if form else "_v" not in kernel, kernel
    cg.release()
    np.testing.assert_allclose(got.astype(np.float64), _want(x, w, b, skip, "relu"),
                               err_msg=kernel, **_tol(dtype))

"""vkml.onnx: BatchNormalization (inference) on the device as DML_BATCH_NORMALIZATION,
against ONNX Runtime on the CPU: ranks 2 to 5, float32/float16, the statistics as
constants (bound once) or model inputs; training mode stays on the host."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402
from onnx_helpers import ort_expected as _expected, value_info as _vi  # noqa: E402


@pytest.mark.parametrize("constants", [True, False], ids=["constants", "inputs"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("rank", [2, 3, 4, 5])
def test_batch_normalization(rank, dtype, constants, device):
    rng = np.random.default_rng(rank * 10 + constants)
    shape = [int(rng.integers(1, 5)) for _ in range(rank)]
    c = shape[1]
    stats = {"scale": rng.standard_normal(c), "B": rng.standard_normal(c),
             "mean": rng.standard_normal(c), "var": rng.uniform(0.2, 2.0, c)}
    stats = {k: v.astype(dtype) for k, v in stats.items()}
    eps = float(rng.uniform(1e-5, 1e-2))
    node = helper.make_node("BatchNormalization", ["x", "scale", "B", "mean", "var"], ["y"],
                            name="bn", epsilon=eps)
    inputs = [_vi("x", shape, dtype)]
    inits = []
    if constants:
        inits = [numpy_helper.from_array(v, k) for k, v in stats.items()]
    else:
        inputs += [_vi(k, [c], dtype) for k in stats]
    g = helper.make_graph([node], "g", inputs, [_vi("y", shape, dtype)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    rep = vonnx.prepare(model, device=device, strict=True)
    feeds = {"x": rng.standard_normal(shape).astype(dtype)}
    if not constants:
        feeds.update(stats)
    (got,) = rep.run(feeds)
    (want,) = _expected(model, feeds)
    tol = 1e-5 if dtype == np.float32 else 5e-3
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol,
                               atol=tol)
    assert not rep.fallbacks


def test_training_mode_stays_on_the_host(device):
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"],
                            name="bn_train", training_mode=1)
    one = np.ones(2, np.float32)
    inits = [numpy_helper.from_array(one, k) for k in "sbmv"]
    g = helper.make_graph([node], "g", [_vi("x", [1, 2, 3], np.float32)],
                          [_vi("y", [1, 2, 3], np.float32)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    rep = vonnx.prepare(model, device=device)
    assert rep.partitions == [("host", [("bn_train", "BatchNormalization")])]
    with pytest.raises(vkml.UnsupportedError, match="bn_train.*training_mode"):
        vonnx.prepare(model, device=device, strict=True)

"""vkml.onnx: Softmax on the device as DML_ACTIVATION_SOFTMAX1, against ONNX Runtime on the
CPU: opset 13's single axis and opset 11's coercion to 2-D at ``axis`` (the axes from it to
the last, normalized jointly), random ranks and axes, float32/float16."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

import vkml.onnx as vonnx  # noqa: E402
from onnx_helpers import ort_session  # noqa: E402


def _vi(name, shape, dtype):
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return helper.make_tensor_value_info(name, t, list(shape))


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("opset", [11, 13])
def test_softmax(opset, dtype, device):
    pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(opset + np.dtype(dtype).num)
    for trial in range(4):
        rank = int(rng.integers(1, 6))
        shape = [int(rng.integers(1, 6)) for _ in range(rank)]
        attrs = {} if trial == 0 else {"axis": int(rng.integers(-rank, rank))}
        if opset < 13 and rank < 2 and not attrs:
            attrs = {"axis": 0}                    # opset 11's default axis 1 needs rank 2
        node = helper.make_node("Softmax", ["x"], ["y"], name="sm", **attrs)
        g = helper.make_graph([node], "g", [_vi("x", shape, dtype)], [_vi("y", shape, dtype)])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        rep = vonnx.prepare(model, device=device, strict=True)
        x = (rng.standard_normal(shape) * 3).astype(dtype)
        (got,) = rep.run({"x": x})
        (want,) = ort_session(model).run(None, {"x": x})
        tol = 1e-5 if dtype == np.float32 else 2e-3
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol,
                                   atol=tol, err_msg=str((shape, attrs)))
        assert not rep.fallbacks

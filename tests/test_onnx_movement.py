"""vkml.onnx: Transpose on the device as DML_ELEMENT_WISE_IDENTITY with permuted input
strides, against ONNX Runtime on the CPU: random ranks, permutations and data types, from a
model input and from another device node (an intermediate edge)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

import vkml.onnx as vonnx  # noqa: E402

DTYPES = [np.float32, np.float16, np.int8, np.uint16, np.int32, np.int64, np.float64]


def _vi(name, shape, dtype):
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return helper.make_tensor_value_info(name, t, list(shape))


def _expected(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_transpose(dtype, device):
    rng = np.random.default_rng(np.dtype(dtype).num)
    for trial in range(4):
        rank = int(rng.integers(1, 7))
        shape = [int(rng.integers(1, 6)) for _ in range(rank)]
        perm = [int(p) for p in rng.permutation(rank)]
        attrs = {} if trial == 0 else {"perm": perm}
        if trial == 0:                              # no perm: the dimensions reversed
            perm = list(range(rank))[::-1]
        out = [shape[p] for p in perm]
        # after an Add of the input with itself (float64: not on the device, a host
        # partition before it), so that the Transpose reads an intermediate edge
        pre = "Add" if np.dtype(dtype) != np.float64 else "Identity"
        ins = ["x", "x"] if pre == "Add" else ["x"]
        nodes = [helper.make_node(pre, ins, ["a"], name="pre"),
                 helper.make_node("Transpose", ["a"], ["y"], name="t", **attrs)]
        g = helper.make_graph(nodes, "g", [_vi("x", shape, dtype)], [_vi("y", out, dtype)])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
        rep = vonnx.prepare(model, device=device, strict=True)
        x = (rng.standard_normal(shape) * 20).astype(dtype)
        (got,) = rep.run({"x": x})
        (want,) = _expected(model, {"x": x})
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want, err_msg=str((shape, perm)))
        assert not rep.fallbacks

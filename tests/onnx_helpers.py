"""Small ONNX model builders and the ONNX Runtime reference shared by the ONNX tests
(import after ``pytest.importorskip("onnx")``)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper


def value_info(name, shape, dtype=np.float32):
    """A tensor value info; ``shape`` None: unknown rank, a str in it: a symbolic dim."""
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return helper.make_tensor_value_info(name, t, None if shape is None else list(shape))


def make_model(nodes, inputs, outputs, inits=(), opset=18):
    """A checked model of one graph of ``nodes`` at default-domain ``opset``."""
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def ort_expected(model, feeds):
    """ONNX Runtime's (CPU) outputs of ``model`` for ``feeds``."""
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def node_cases(modules, keep) -> dict:
    """ONNX's own node test cases (``onnx.backend.test.case.node``) of ``modules`` that
    ``keep(case)`` accepts, by name.  Importing a module registers its cases in one list
    shared by the process (other modules' cases too), hence ``keep``."""
    import importlib
    import warnings

    import onnx.backend.test.case.node as cases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mod in modules:
            importlib.import_module(f"onnx.backend.test.case.node.{mod}")
    return {c.name: c for c in cases._NodeTestCases if keep(c)}

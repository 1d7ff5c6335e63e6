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


def ort_session(model, options=None):
    """An ONNX Runtime CPU session of ``model``, declared at the lowest IR version its
    opsets need: ``helper.make_model`` stamps the installed onnx's IR version, which an
    older onnxruntime beside a newer onnx refuses ("Unsupported model IR version")."""
    ort = pytest.importorskip("onnxruntime")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.ir_version = min(m.ir_version, helper.find_min_ir_version_for(list(m.opset_import)))
    return ort.InferenceSession(m.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def ort_expected(model, feeds):
    """ONNX Runtime's (CPU) outputs of ``model`` for ``feeds``."""
    return ort_session(model).run(None, feeds)


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

"""Specialization constants frozen on the host (vkml/runtime/spirv.py): the SpecId
decoration goes, the constant becomes a plain OpConstant of the value, every other
instruction stays; a frozen pipeline computes what the specialized one does."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from vkml import dml
from vkml.runtime import pipelines, spirv


def _insts(code: bytes):
    words = struct.unpack(f"<{len(code) // 4}I", code)
    return [(op, list(words[i:i + n])) for i, op, n in spirv._instructions(words)]


def _spec_ids(code: bytes) -> dict:
    return {w[1]: w[3] for op, w in _insts(code)
            if op == spirv.OP_DECORATE and len(w) == 4 and w[2] == spirv.DECORATION_SPEC_ID}


@pytest.mark.parametrize("value", [0, 6, 18])
def test_freeze_one_constant(value):
    code = pipelines.load_spirv("activation_f32")
    consts = pipelines.kernel_manifest()["activation_f32"]["constants"]
    act = consts["ACT"]["id"]
    before = _spec_ids(code)
    result_id = next(r for r, sid in before.items() if sid == act)
    frozen = spirv.freeze(code, {act: value})
    after = _spec_ids(frozen)
    assert after == {r: s for r, s in before.items() if s != act}
    constant = [w for op, w in _insts(frozen) if op == spirv.OP_CONSTANT and w[2] == result_id]
    assert constant and constant[0][3] == value
    assert not any(op == spirv.OP_SPEC_CONSTANT and w[2] == result_id
                   for op, w in _insts(frozen))
    # nothing else changed: the same instructions but the decoration and the constant
    assert len(_insts(frozen)) == len(_insts(code)) - 1
    # ...and the function bodies (after the declarations) are the same bytes
    end = spirv._declarations_end(struct.unpack(f"<{len(code) // 4}I", code))
    assert end < len(code) // 4 and frozen.endswith(code[4 * end:])
    assert spirv.freeze(code, {}) == code


def test_freeze_bool_and_float_and_refusals():
    code = pipelines.load_spirv("activation_f32")
    consts = pipelines.kernel_manifest()["activation_f32"]["constants"]
    vs = consts["VEC_STORE"]["id"]
    for value, op in ((1, spirv.OP_CONSTANT_TRUE), (0, spirv.OP_CONSTANT_FALSE)):
        frozen = spirv.freeze(code, {vs: value})
        assert vs not in _spec_ids(frozen).values()
        assert any(o == op for o, _ in _insts(frozen))
    with pytest.raises(ValueError, match="SPIR-V"):
        spirv.freeze(b"\0" * 20, {1: 2})


def test_frozen_activation_matches_fused_formula(device):
    """The standalone Relu and the fused one (convolution) run frozen ACT modules."""
    assert "ACT" in pipelines.kernel_manifest()["activation_f32_texel4"]["frozen"]
    x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(1, 1, 8, 8)
    t = dml.TensorDesc("float32", x.shape)
    op = device.compile_operator(device.create_operator(dml.ActivationLeakyReluOperatorDesc(
        t, t, alpha=0.25)))
    try:
        out = device.empty(x.shape)
        op.execute([device.tensor(x)], [out])
        np.testing.assert_array_equal(out.numpy(), np.where(x >= 0, x, np.float32(0.25) * x))
    finally:
        op.release()

"""Convolution with ``DML_TENSOR_FLAG_OWNED_BY_DML`` inputs (the flag's page; the
initializer's): the filter is bound once by ``initialize``, the gemm re-layout and the
Winograd transform run then and not at execution, results equal those of the unflagged
operator on every path, later changes to the source do not reach the operator, and binding
an owned tensor at execution is refused.  Reference: ``convolution_reference`` (float64)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from vkml import dml
from vkml.errors import UnsupportedError, ValidationError

from helpers import compile_on_path
from references import convolution_reference

OWNED = dml.TensorFlags.OWNED_BY_DML
F = dml.TensorDesc

#: name -> (path, x shape, w shape, keyword fields); small enough for SwiftShader
CASES = {
    "winograd": ("winograd", (1, 16, 22, 22), (16, 16, 3, 3), dict(start_padding=(1, 1),
                                                                    end_padding=(1, 1))),
    "gemm-transpose": ("gemm", (1, 4, 9, 9), (8, 4, 3, 3), dict(start_padding=(1, 1),
                                                                 end_padding=(1, 1))),
    "gemm-relayout": ("gemm", (1, 3, 9, 9), (8, 3, 3, 3), dict(strides=(2, 2))),
    "gemm-backward": ("gemm", (1, 4, 5, 5), (4, 6, 3, 3),
                      dict(strides=(2, 2), direction=dml.ConvolutionDirection.BACKWARD)),
    "gemm_sg": ("gemm_sg", (1, 4, 9, 9), (8, 4, 3, 3), dict(start_padding=(1, 1),
                                                             end_padding=(1, 1))),
    "depthwise": ("depthwise", (1, 4, 9, 9), (4, 1, 3, 3), dict(group_count=4)),
    "direct": ("direct", (1, 2, 6, 6), (3, 2, 3, 3), dict(mode=dml.ConvolutionMode.CONVOLUTION)),
}


def make_desc(x_shape, w_shape, kw, w_flags=0, b_flags=0):
    backward = kw.get("direction") == dml.ConvolutionDirection.BACKWARD
    cout = w_shape[1] * kw.get("group_count", 1) if backward else w_shape[0]
    xd, wd = F("float32", x_shape), F("float32", w_shape, flags=w_flags)
    bd = F("float32", (1, cout, 1, 1), flags=b_flags)
    probe = dml.ConvolutionOperatorDesc(xd, wd, None, xd, **kw)
    yd = F("float32", tuple(probe.expected_output_sizes()))
    return dml.ConvolutionOperatorDesc(xd, wd, bd, yd, **kw)


def reference(desc, x, w, b):
    def field(name, n):
        v = getattr(desc, name)
        return list(v) if v is not None else [n] * 2
    return convolution_reference(
        x, w, b.reshape(-1), field("strides", 1), field("dilations", 1),
        field("start_padding", 0), field("end_padding", 0), field("output_padding", 0),
        desc.group_count, desc.mode.name.lower(), desc.direction.name.lower())


def compile_forced(device, desc, path):
    """``path`` forced; skipped only where choose_path refuses it with UnsupportedError
    (the device lacks what the path needs); an AssertionError is an internal invariant
    broken (convolution/geometry.py's 32-bit range) and fails the test."""
    try:
        return compile_on_path(device, desc, path)
    except UnsupportedError as e:
        pytest.skip(f"{path} does not run this case on {device.name}: {e}")


def arrays(rng, desc):
    x = rng.standard_normal(desc.input_tensor.sizes).astype(np.float32)
    w = (rng.standard_normal(desc.filter_tensor.sizes) * 0.5).astype(np.float32)
    b = rng.standard_normal(desc.bias_tensor.sizes).astype(np.float32)
    return x, w, b


def dispatches(device, compiled, ins, outs) -> int:
    seq = device.sequence()
    try:
        compiled.record(seq, ins, outs)
        return seq.dispatches
    finally:
        seq.close()


@pytest.mark.parametrize("case", list(CASES))
def test_owned_filter_on_each_path(device, case):
    """Owned vs not owned on each forced path: the same bits, both near the reference;
    the owned one records fewer dispatches where the path re-lays the filter (as many
    where it reads it in place), and ignores later writes to the initializing tensor."""
    path, xs, ws, kw = CASES[case]
    plain_desc = make_desc(xs, ws, kw)
    owned_desc = make_desc(xs, ws, kw, w_flags=OWNED)
    rng = np.random.default_rng(list(CASES).index(case))
    x, w, b = arrays(rng, plain_desc)
    plain = compile_forced(device, plain_desc, path)
    owned = compile_forced(device, owned_desc, path)
    assert plain.path.name == owned.path.name == path
    assert owned.owned_inputs == [1] and plain.owned_inputs == []
    transforms = owned.path.filter_buffer() is not None
    assert transforms == (path in ("gemm", "winograd"))
    tx, tw, tb = device.tensor(x), device.tensor(w), device.tensor(b)
    yd = plain_desc.output_tensor
    y1, y2 = device.empty(yd.sizes), device.empty(yd.sizes)
    owned.initialize(filter=tw)
    plain.execute([tx, tw, tb], [y1])
    owned.execute([tx, None, tb], [y2])
    want = reference(plain_desc, x, w, b)
    tol = 2e-4 * math.sqrt(math.prod(ws[1:]))
    np.testing.assert_allclose(y1.numpy(), want, rtol=tol, atol=tol)
    np.testing.assert_array_equal(y2.numpy(), y1.numpy())

    n_plain = dispatches(device, plain, [tx, tw, tb], [y1])
    n_owned = dispatches(device, owned, [tx, None, tb], [y2])
    if path == "winograd":
        assert n_owned == n_plain - 1                          # U = G g G^T
    elif transforms:
        assert n_owned == n_plain - len(owned.path.w_relayouts) < n_plain
    else:
        assert n_owned == n_plain

    # the filter was copied / transformed at initialization: new contents do not reach it
    first = y2.numpy()
    tw.write(-3 * w)
    owned.execute([tx, None, tb], [y2])            # replayed
    np.testing.assert_array_equal(y2.numpy(), first)
    plain.execute([tx, tw, tb], [y1])              # (the change is visible unowned)
    assert not np.allclose(y1.numpy(), first)
    # initializing again (from an array) replaces it
    owned.initialize({1: -3 * w})
    owned.execute([tx, None, tb], [y2])
    np.testing.assert_array_equal(y2.numpy(), y1.numpy())
    plain.release()
    owned.release()


def test_owned_rules(device):
    """Binding an owned filter at execution, executing before initialization, initializing
    a tensor that is not owned, an unknown name, a missing or too small filter: each a
    ValidationError naming the binding; the operator works afterwards."""
    desc = make_desc((1, 2, 6, 6), (3, 2, 3, 3), {}, w_flags=OWNED)
    rng = np.random.default_rng(5)
    x, w, b = arrays(rng, desc)
    op = device.compile_operator(device.create_operator(desc))
    tx, tw, tb = device.tensor(x), device.tensor(w), device.tensor(b)
    y = device.empty(desc.output_tensor.sizes)
    cases = [(lambda: op.execute([tx, None, tb], [y]), "initialize"),
             (lambda: op.initialize(input=x, filter=w), "inputs[0]"),
             (lambda: op.initialize(weights=w), "weights"),
             (lambda: op.initialize({}), "inputs[1]"),
             (lambda: op.initialize(filter=w[:1]), "inputs[1]"),
             (lambda: op.initialize(filter=device.empty(4)), "inputs[1]")]
    for call, field in cases:
        with pytest.raises(ValidationError) as info:
            call()
        assert info.value.field == field, str(info.value)
    op.initialize([None, w])
    with pytest.raises(ValidationError) as info:
        op.execute([tx, tw, tb], [y])
    assert info.value.field == "inputs[1]" and "OWNED_BY_DML" in info.value.rule
    op.execute([tx, None, tb], [y])
    np.testing.assert_allclose(y.numpy(), reference(desc, x, w, b), rtol=1e-4, atol=1e-4)
    op.release()


def test_owned_bias_and_filter(device):
    """Bias and filter both owned (copied; the filter transformed on gemm): the results of
    the unflagged operator, and later writes to the sources change nothing."""
    kw = dict(start_padding=(1, 1), end_padding=(1, 1))
    desc = make_desc((1, 4, 9, 9), (8, 4, 3, 3), kw, w_flags=OWNED, b_flags=OWNED)
    rng = np.random.default_rng(6)
    x, w, b = arrays(rng, desc)
    op = compile_forced(device, desc, "gemm")
    assert op.owned_inputs == [1, 2]
    tw, tb = device.tensor(w), device.tensor(b)
    op.initialize(filter=tw, bias=tb)
    tw.write(np.zeros_like(w))
    tb.write(np.zeros_like(b))
    y = device.empty(desc.output_tensor.sizes)
    op.execute([device.tensor(x)], [y])
    np.testing.assert_allclose(y.numpy(), reference(desc, x, w, b), rtol=1e-4, atol=1e-4)
    op.release()


def test_unowned_unchanged(device):
    """Without the flag nothing is initialized: ``initialize`` takes nothing, the filter is
    bound at execution as before."""
    desc = make_desc((1, 4, 9, 9), (8, 4, 3, 3), {})
    op = compile_forced(device, desc, "gemm")
    op.initialize()
    with pytest.raises(ValidationError) as info:
        op.initialize(filter=np.zeros((8, 4, 3, 3), np.float32))
    assert info.value.field == "inputs[1]"
    assert not op.path.filter_ready
    x, w, b = arrays(np.random.default_rng(7), desc)
    y = device.empty(desc.output_tensor.sizes)
    op.execute([device.tensor(x), device.tensor(w), device.tensor(b)], [y])
    np.testing.assert_allclose(y.numpy(), reference(desc, x, w, b), rtol=1e-4, atol=1e-4)
    op.release()


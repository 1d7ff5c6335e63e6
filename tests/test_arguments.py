"""Argument types, as NumPy and PyTorch treat them (vkml.dml.operator / tensor_desc).

Integers are what ``operator.index`` takes (ints, NumPy integer scalars); bools, floats
(inf and nan included), strings, None and nested lists raise ArgumentTypeError, which is
a TypeError and a ValidationError naming the field; out-of-range integers raise
ValidationError; never an OverflowError or AttributeError from deep code.  FLOAT fields
take real numbers only.  A 0-d input is refused.  The device stays usable after each.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vkml
from vkml import dml
from vkml.errors import ArgumentTypeError, ValidationError

X = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


# -- the issue's examples, verbatim -------------------------------------------------------
def test_issue_examples(device):
    x = vkml.tensor(X, device=device)
    with pytest.raises(TypeError, match=r"start_padding\[2\]"):
        vkml.pad(x, [0, 0, 1.5, 0], 0)
    with pytest.raises(TypeError, match="start_padding"):
        vkml.pad(x, "0011", "0000")
    with pytest.raises(TypeError, match=r"start_padding\[2\]"):
        vkml.pad(x, [0, 0, float("inf"), 0], 0)
    with pytest.raises(TypeError, match="x"):
        vkml.pad(None, 1, 1)
    w = vkml.tensor(np.ones((1, 1, 3, 3), np.float32), device=device)
    with pytest.raises(TypeError, match="group_count"):
        vkml.convolution(x, w, group_count=float("inf"))
    with pytest.raises(TypeError, match="data_type"):
        dml.TensorDesc(None, (2, 3))
    with pytest.raises(TypeError, match=r"sizes\[0\]"):
        dml.TensorDesc("float32", (2.5, 3))
    desc = dml.PaddingOperatorDesc(dml.TensorDesc("float32", (2,)),
                                   dml.TensorDesc("float32", (4,)), "constant", None, (1,), (1,))
    with pytest.raises(TypeError, match="PaddingOperatorDesc.padding_value"):
        device.create_operator(desc)
    with pytest.raises(vkml.ValidationError, match=r"shape\[0\]"):
        vkml.empty((-1,), device=device)
    # what stays valid: NumPy integer scalars, as numpy.pad takes them
    y = vkml.pad(X, np.int64(1), [0, 0, np.int32(1), 0], device=device)
    assert (y == np.pad(X, [(1, 0), (1, 0), (1, 1), (1, 0)])).all()


def test_zero_d_input_refused(device):
    with pytest.raises(vkml.ValidationError, match="0-d"):
        vkml.pad(np.float32(1), 1, 1, device=device)


def test_allocation_limits(device):
    """vkml.empty is checked against the device before anything is allocated, and the
    DeviceError names the size asked and the limit."""
    with pytest.raises(vkml.DeviceError, match=r"needs 4398046511104 bytes.*at most \d+"):
        vkml.empty((1 << 20, 1 << 20), device=device)
    with pytest.raises(TypeError, match="dtype"):
        vkml.empty((2,), None, device=device)
    with pytest.raises(TypeError, match=r"shape\[0\]"):
        vkml.empty((2.0,), device=device)
    assert vkml.empty(3, device=device).shape == (3,)


def test_bools_are_not_integers(device):
    """Python makes bool an int; vkml refuses it wherever an integer is needed (no DML
    field is a BOOL) and wherever a number is (padding value)."""
    with pytest.raises(TypeError):
        vkml.pad(X, True, 0, device=device)
    with pytest.raises(TypeError):
        vkml.pad(X, 1, 1, value=True, device=device)
    with pytest.raises(TypeError):
        dml.TensorDesc("float32", (True, 2))


# -- hypothesis: arguments of every kind --------------------------------------------------
class _Thing:
    pass


ANY_VALUE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4), st.none(),
    st.booleans(), st.integers(-(1 << 70), 1 << 70), st.integers(-3, 6),
    st.sampled_from([np.int64(2), np.float32(1.5), np.bool_(True), np.uint8(1), _Thing(),
                     [[1, 2]], [1, [2]], {"a": 1}, {1, 2}, b"12", 1 + 2j, (1,), [0, 0]]),
    st.lists(st.one_of(st.integers(-2, 4), st.floats(), st.none(), st.text(max_size=2)),
             max_size=4))

ALLOWED = (TypeError, vkml.ValidationError, vkml.UnsupportedError)


def _outcome(call):
    """Run ``call``: a result, or one of the documented errors (never OverflowError,
    AttributeError or anything from deep code)."""
    try:
        call()
    except OverflowError:
        raise AssertionError("OverflowError escaped") from None
    except ALLOWED as exc:
        if isinstance(exc, TypeError):
            assert isinstance(exc, ArgumentTypeError), f"a TypeError not naming a field: {exc}"
        return exc
    except vkml.DeviceError as exc:       # a huge but valid size: refused by the limit
        # before allocating ("needs N bytes; the device allows at most L"), or by the heap
        # when other tensors fill it ("cannot allocate N bytes; U of the L bytes heap ...")
        assert "at most" in str(exc) or "heap is in use" in str(exc), str(exc)
        return exc
    return None


def _functional_calls(x4, x3, value, w=None):
    return {
        "pad.start": lambda: vkml.pad(x4, value, 0),
        "pad.end": lambda: vkml.pad(x4, 0, value),
        "pad.mode": lambda: vkml.pad(x4, 1, 1, value),
        "pad.value": lambda: vkml.pad(x4, 1, 1, "constant", value),
        "pad.x": lambda: vkml.pad(value, 1, 1),
        "fold.output_size": lambda: vkml.fold(x3, value, 2),
        "fold.window": lambda: vkml.fold(x3, (3, 3), value),
        "fold.strides": lambda: vkml.fold(x3, (3, 3), 2, strides=value),
        "unfold.window": lambda: vkml.unfold(x4, value),
        "unfold.dilations": lambda: vkml.unfold(x4, 2, dilations=value),
        "unfold.start": lambda: vkml.unfold(x4, 2, start_padding=value),
        "conv.strides": lambda: vkml.convolution(x4, w, strides=value),
        "conv.group_count": lambda: vkml.convolution(x4, w, group_count=value),
        "conv.output_padding": lambda: vkml.convolution(x4, w,
                                                        output_padding=value),
        "conv.mode": lambda: vkml.convolution(x4, w, mode=value),
        "conv.activation": lambda: vkml.convolution(x4, w,
                                                    fused_activation=value),
        "conv.bias": lambda: vkml.convolution(x4, w, value),
        "lp.window": lambda: vkml.lp_pooling(x4, value),
        "lp.p": lambda: vkml.lp_pooling(x4, 2, p=value),
        "lp.end": lambda: vkml.lp_pooling(x4, 2, end_padding=value),
    }


# accepted values are a few percent of ANY_VALUE's draws: 60 examples gave 2 in one run,
# so the floor asks for one (the refusals are the test's subject)
@pytest.mark.floor(accepted=1, refused=30)
@SETTINGS
@given(value=ANY_VALUE, which=st.sampled_from(sorted(_functional_calls(None, None, None))))
def test_functional_arguments(device, value, which, cases):
    x4 = vkml.tensor(X, device=device)
    x3 = vkml.tensor(np.ones((1, 4, 4), np.float32), device=device)
    w = vkml.tensor(np.ones((1, 1, 3, 3), np.float32), device=device)
    refused = _outcome(_functional_calls(x4, x3, value, w)[which])
    # the device stays usable
    assert (vkml.pad(x4, 1, 1).numpy() == np.pad(X, 1)).all()
    cases.add("accepted" if refused is None else "refused")


def _tensor(sizes=(1, 1, 4, 4)):
    return dml.TensorDesc("float32", sizes)


def _descs(value):
    t, o = _tensor(), _tensor((1, 1, 6, 6))
    f = _tensor((1, 1, 3, 3))
    return {
        "tensor.data_type": lambda: dml.TensorDesc(value, (2, 3)),
        "tensor.sizes": lambda: dml.TensorDesc("float32", value),
        "tensor.strides": lambda: dml.TensorDesc("float32", (2, 3), value),
        "tensor.total": lambda: dml.TensorDesc("float32", (2, 3), None, value),
        "tensor.alignment": lambda: dml.TensorDesc("float32", (2, 3), None, None, value),
        "tensor.flags": lambda: dml.TensorDesc("float32", (2, 3), None, None, 0, value),
        "padding.mode": lambda: dml.PaddingOperatorDesc(t, o, value, 0.0, (0, 0, 1, 1),
                                                        (0, 0, 1, 1)),
        "padding.value": lambda: dml.PaddingOperatorDesc(t, o, "constant", value,
                                                         (0, 0, 1, 1), (0, 0, 1, 1)),
        "padding.start": lambda: dml.PaddingOperatorDesc(t, o, "constant", 0.0, value,
                                                         (0, 0, 1, 1)),
        "padding1.value": lambda: dml.Padding1OperatorDesc(t, o, "constant", "float32", value,
                                                           (0, 0, 1, 1), (0, 0, 1, 1)),
        "conv.group_count": lambda: dml.ConvolutionOperatorDesc(t, f, None, _tensor(
            (1, 1, 2, 2)), group_count=value),
        "conv.dilations": lambda: dml.ConvolutionOperatorDesc(t, f, None, _tensor(
            (1, 1, 2, 2)), dilations=value),
        "conv.direction": lambda: dml.ConvolutionOperatorDesc(t, f, None, _tensor(
            (1, 1, 2, 2)), direction=value),
        "lp.p": lambda: dml.LpPooling1OperatorDesc(t, _tensor((1, 1, 3, 3)), None, (2, 2),
                                                   p=value),
        "lp.window": lambda: dml.LpPooling1OperatorDesc(t, _tensor((1, 1, 3, 3)), None, value),
        "unfold.strides": lambda: dml.UnfoldOperatorDesc(t, _tensor((1, 4, 9)), (2, 2), value),
        "fold.window": lambda: dml.FoldOperatorDesc(_tensor((1, 4, 9)), t, value),
        "act.alpha": lambda: dml.ActivationLeakyReluOperatorDesc(t, t, alpha=value),
        "act.beta": lambda: dml.ActivationLinearOperatorDesc(t, t, beta=value),
    }


@pytest.mark.floor(accepted=3, refused=30)
@SETTINGS
@given(value=ANY_VALUE, which=st.sampled_from(sorted(_descs(None))))
def test_descriptor_fields(device, value, which, cases):
    def make():
        desc = _descs(value)[which]()
        if isinstance(desc, dml.OperatorDesc):
            device.create_operator(desc)
    cases.add("accepted" if _outcome(make) is None else "refused")
    op = device.create_operator(dml.PaddingOperatorDesc(_tensor(), _tensor((1, 1, 6, 6)),
                                                        "constant", 0.0, (0, 0, 1, 1),
                                                        (0, 0, 1, 1)))
    assert op is not None


@pytest.mark.parametrize("name", ["01", "f99", "i4,", "(2)f4x", "bogus"])
def test_data_type_names_numpy_cannot_parse(name):
    """Strings NumPy's dtype parser rejects with SyntaxError/ValueError (found by the
    fuzzer above: "01") are a ValidationError naming the field."""
    with pytest.raises(ValidationError, match="data_type"):
        dml.TensorDesc(name, (2, 3))


def test_zero_d_tensor_keeps_its_shape(device):
    """Device.tensor uploads a 0-d array as 0-d (numpy.ascontiguousarray would make it
    1-d), and it reads back as one."""
    for value in (np.float32(2.5), np.array(7, np.int64), 3.0):
        t = device.tensor(value)
        assert t.shape == () and t.size == 1
        back = t.numpy()
        assert back.shape == () and back == np.asarray(value)
    assert vkml.tensor(np.float64(-1.5), device=device).numpy()[()] == -1.5


@pytest.mark.parametrize("op", [None, "relu", 3, object()])
def test_compile_operator_takes_operators_only(device, op):
    """compile_operator of anything but an Operator: ValidationError naming ``op``
    (None used to raise AttributeError); a descriptor given directly, likewise."""
    with pytest.raises(ValidationError, match="^op: .*vkml.Operator"):
        device.compile_operator(op)
    desc = dml.ActivationReluOperatorDesc(dml.TensorDesc("float32", (4,)),
                                          dml.TensorDesc("float32", (4,)))
    with pytest.raises(ValidationError, match="^op: "):
        device.compile_operator(desc)
    device.compile_operator(device.create_operator(desc)).release()

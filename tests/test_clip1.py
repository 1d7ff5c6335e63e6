"""ELEMENT_WISE_CLIP1 (vkml/dml/element_wise.py, vkml/ops/clip.py): the ten data types of
the page against NumPy (floats: float64 then rounded once to the type; integers exactly),
Min > Max, bounds at the types' edges, ScaleBias, in-place execution, non-packed layouts
with canaries (a fuzzer, tests/fuzzing.py), every rule of the page, the functional form
``vkml.clip``, a graph node, and leaks."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

import vkml
from vkml import dml
from vkml.errors import ArgumentTypeError, ValidationError

from fuzzing import (TENSOR_BROKEN, break_tensor_rule, compiled_or_refused, fuzzer, lay_out,
                     overlapping_strides, padded_output, placement, run_checked)
from helpers import assert_no_leaks, run_two_node_graph
from test_element_wise import _run_in_place, _with_edges, random_values

TYPES = ["float32", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
         "uint64"]


def reference(x: np.ndarray, lo, hi, scale_bias=None) -> np.ndarray:
    """The page's f(x) = max(Min, min(g(x), Max)), g(x) = x * scale + bias: floats in
    float64 rounded once to the type, integers in the type (no ScaleBias there)."""
    dt = x.dtype
    if dt.kind == "f":
        v = x.astype(np.float64)
        if scale_bias is not None:
            v = v * scale_bias[0] + scale_bias[1]
        with np.errstate(over="ignore"):
            return np.maximum(np.float64(lo), np.minimum(v, np.float64(hi))).astype(dt)
    return np.maximum(dt.type(lo), np.minimum(x, dt.type(hi))).astype(dt)


def check(got, want, scale_bias=None):
    assert got.dtype == want.dtype and got.shape == want.shape
    if scale_bias is not None and want.dtype.kind == "f":
        tol = 1e-6 if want.dtype == np.float32 else 1e-3
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got, want)


def random_bounds(rng, dtype):
    """(Min, Max) of the type: drawn from its values, now and then swapped (Min > Max)
    or None (the type's lowest / highest)."""
    a, b = sorted(random_values(rng, (2,), dtype).tolist())
    if rng.random() < 0.2:
        a, b = b, a
    if rng.random() < 0.15:
        a = None
    if rng.random() < 0.15:
        b = None
    return a, b


def _bound(v, dtype, low: bool):
    dt = np.dtype(dtype)
    if v is not None:
        return v
    if dt.kind == "f":
        return -np.inf if low else np.inf
    return np.iinfo(dt).min if low else np.iinfo(dt).max


# -- the DxDispatch example, and every type against NumPy ------------------------------------
def test_scalar_union_fp16_example(device):
    """Microsoft's dml_scalar_union_fp16 model: float16 1..5 clipped to [2, 4]."""
    t = dml.TensorDesc("float16", (5,))
    desc = dml.ElementWiseClip1OperatorDesc(t, t, None, "FLOAT16", 2, 4)
    op = device.compile_operator(device.create_operator(desc))
    x = device.tensor(np.arange(1, 6, dtype=np.float16))
    y = device.empty((5,), np.float16)
    op.execute([x], [y])
    op.release()
    np.testing.assert_array_equal(y.numpy(), [2, 2, 3, 4, 4])


@pytest.mark.parametrize("dtype", TYPES)
def test_random(device, dtype):
    rng = np.random.default_rng(TYPES.index(dtype))
    for _ in range(4):
        rank = int(rng.integers(1, 6))
        shape = tuple(int(rng.integers(1, 7)) for _ in range(rank))
        x = _with_edges(rng, random_values(rng, shape, dtype), "clip", False)
        lo, hi = random_bounds(rng, dtype)
        sb = None
        if np.dtype(dtype).kind == "f" and rng.random() < 0.5:
            sb = (float(rng.uniform(-2, 2)), float(rng.uniform(-3, 3)))
        got = vkml.clip(x, lo, hi, scale_bias=sb, device=device)
        check(got, reference(x, _bound(lo, dtype, True), _bound(hi, dtype, False), sb), sb)


@pytest.mark.parametrize("dtype", TYPES)
def test_edges(device, dtype):
    """Bounds at the type's extremes (64-bit ones beyond float64's exact integers) and
    Min > Max (the formula gives Min everywhere)."""
    dt = np.dtype(dtype)
    info = np.finfo(dt) if dt.kind == "f" else np.iinfo(dt)
    lo, hi = (info.min, info.max)
    x = np.array([lo, hi, 0, 1, lo + 1 if dt.kind != "f" else -1, hi - 1], dt)
    for a, b in [(lo, hi), (hi, lo), (hi - 1, hi), (lo, lo + 1), (1, 0), (0, 0)]:
        a, b = dt.type(a).item(), dt.type(b).item()
        got = vkml.clip(x, a, b, device=device)
        np.testing.assert_array_equal(got, reference(x, a, b), err_msg=f"[{a}, {b}]")
        if a > b:
            assert np.all(got == dt.type(a))


def test_float_infinities(device):
    x = np.array([-np.inf, -1e30, -2, 0, 2, 1e30, np.inf], np.float32)
    np.testing.assert_array_equal(vkml.clip(x, -np.inf, 5, device=device),
                                  np.minimum(x, 5))
    np.testing.assert_array_equal(vkml.clip(x, device=device), x)
    with np.errstate(over="ignore"):
        h = x.astype(np.float16)      # (+-1e30 are infinities in float16)
    np.testing.assert_array_equal(vkml.clip(h, -3, np.inf, device=device), np.maximum(h, -3))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "uint16", "int64"])
def test_in_place(device, dtype):
    """The output may alias the input ("supports in-place execution"); the integer path's
    second pass reads what its first wrote."""
    rng = np.random.default_rng(5)
    x = random_values(rng, (3, 37), dtype)
    lo, hi = sorted(random_values(rng, (2,), dtype).tolist())
    t = dml.TensorDesc(dtype, (3, 37))
    op = device.compile_operator(device.create_operator(
        dml.ElementWiseClip1OperatorDesc(t, t, None, dtype, lo, hi)))
    try:
        xt = device.tensor(x)
        op.execute([xt], [xt])
        np.testing.assert_array_equal(xt.numpy(), reference(x, lo, hi))
    finally:
        op.release()


def test_functional_arguments(device):
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(vkml.clip(x, -1, 1, scale_bias=dml.ScaleBias(2.0, 0.5),
                                         device=device), np.clip(x * 2 + 0.5, -1, 1))
    np.testing.assert_allclose(vkml.clip(x, 0, None, scale_bias=(1.0, 1.0), device=device),
                               np.maximum(x + 1, 0))
    t = vkml.tensor(np.arange(-4, 4, dtype=np.int32), device=device)
    y = vkml.clip(t, -2, 2)
    assert isinstance(y, vkml.Tensor)
    np.testing.assert_array_equal(y.numpy(), np.clip(np.arange(-4, 4), -2, 2))
    with pytest.raises(ArgumentTypeError) as info:
        vkml.clip(x, 0, 1, scale_bias=(1.0,), device=device)
    assert info.value.field == "scale_bias"
    with pytest.raises(ValidationError) as info:          # not an integer of int8
        vkml.clip(np.zeros(3, np.int8), 0.5, 1, device=device)
    assert info.value.field.endswith(".min")
    with pytest.raises(ValidationError) as info:          # no ScaleBias on integers
        vkml.clip(np.zeros(3, np.int8), 0, 1, scale_bias=(2.0, 0.0), device=device)
    assert info.value.field.endswith(".scale_bias")
    with pytest.raises(ValidationError):                  # float64: not in the page's list
        vkml.clip(np.zeros(3, np.float64), 0, 1, device=device)


# -- validation: every rule of the page ------------------------------------------------------
F = dml.TensorDesc("float32", (2, 3, 4))
I8 = dml.TensorDesc("int8", (2, 3, 4))
Clip1 = dml.ElementWiseClip1OperatorDesc


@pytest.mark.parametrize("case, desc, field", [
    ("data_type", Clip1(dml.TensorDesc("float64", (4,)), dml.TensorDesc("float64", (4,)), None,
                        "FLOAT64", 0, 1), "input_tensor.data_type"),
    ("same_type", Clip1(F, dml.TensorDesc("float16", (2, 3, 4)), None, "FLOAT16", 0, 1),
     "output_tensor.data_type"),
    ("rank_out", Clip1(F, dml.TensorDesc("float32", (2, 3, 4, 1)), None, "FLOAT32", 0, 1),
     "output_tensor.sizes"),
    ("rank", Clip1(dml.TensorDesc("float32", (2, 3, 4, 1)), F, None, "FLOAT32", 0, 1),
     "output_tensor.sizes"),
    ("sizes", Clip1(F, dml.TensorDesc("float32", (2, 3, 5)), None, "FLOAT32", 0, 1),
     "output_tensor.sizes"),
    ("overlap", Clip1(F, dml.TensorDesc("float32", (2, 3, 4), (0, 1, 1)), None, "FLOAT32",
                      0, 1), "output_tensor.strides"),
    ("no_input", Clip1(None, F, None, "FLOAT32", 0, 1), "input_tensor"),
    ("no_output", Clip1(F, None, None, "FLOAT32", 0, 1), "output_tensor"),
    ("min_max_type", Clip1(F, F, None, "FLOAT16", 0, 1), "min_max_data_type"),
    ("min_max_type_int", Clip1(I8, I8, None, "INT16", 0, 1), "min_max_data_type"),
    ("min_max_type_unknown", Clip1(F, F, None, "FLOAT99", 0, 1), "min_max_data_type"),
    ("min_fraction", Clip1(I8, I8, None, "INT8", 0.5, 1), "min"),
    ("max_range", Clip1(I8, I8, None, "INT8", 0, 128), "max"),
    ("min_range", Clip1(I8, I8, None, "INT8", -129, 1), "min"),
    ("max_inf_int", Clip1(I8, I8, None, "INT8", 0, float("inf")), "max"),
    ("min_nan", Clip1(F, F, None, "FLOAT32", float("nan"), 1), "min"),
    ("max_beyond_half", Clip1(dml.TensorDesc("float16", (4,)), dml.TensorDesc("float16", (4,)),
                              None, "FLOAT16", 0, 70000.0), "max"),
    ("max_string", Clip1(F, F, None, "FLOAT32", 0, "1"), "max"),
    ("scale_bias_int", Clip1(I8, I8, dml.ScaleBias(2.0, 0.0), "INT8", 0, 1), "scale_bias"),
    ("scale_bias_inf", Clip1(F, F, dml.ScaleBias(float("inf"), 0.0), "FLOAT32", 0, 1),
     "scale_bias.scale"),
    ("scale_bias_type", Clip1(F, F, (2.0, 0.0), "FLOAT32", 0, 1), "scale_bias"),
], ids=lambda v: v if isinstance(v, str) and " " not in v and "." not in v else None)
def test_rules(device, case, desc, field):
    with pytest.raises(ValidationError) as info:
        device.create_operator(desc)
    assert info.value.field == f"ElementWiseClip1OperatorDesc.{field}", str(info.value)
    np.testing.assert_array_equal(vkml.clip(np.arange(3, dtype=np.int32), 1, 1,
                                            device=device), [1, 1, 1])   # still usable


def test_valid_edges_of_the_rules(device):
    """What the rules allow: integral floats for integer bounds, infinities for float
    ones, a float16 bound rounded to the type, Min > Max; the feature level is 5_0."""
    for desc in [Clip1(I8, I8, None, "INT8", -128.0, 127), Clip1(F, F, None, "FLOAT32",
                 -float("inf"), float("inf")),
                 Clip1(dml.TensorDesc("float16", (4,)), dml.TensorDesc("float16", (4,)), None,
                       "FLOAT16", 0.1, 65504), Clip1(F, F, None, "FLOAT32", 3, -3)]:
        device.create_operator(desc)
        assert desc.feature_level() == dml.FeatureLevel.FL_5_0
    assert Clip1.OPERATOR_TYPE == "DML_OPERATOR_ELEMENT_WISE_CLIP1"


# -- graphs, leaks ---------------------------------------------------------------------------
def test_graph_node(device):
    """IDENTITY (ScaleBias) -> CLIP1 compiled as one graph; and an int64 CLIP1 alone."""
    t = dml.TensorDesc("float32", (2, 3, 5))
    x = np.linspace(-4, 4, 30, dtype=np.float32).reshape(2, 3, 5)
    got = run_two_node_graph(device, dml.ElementWiseIdentityOperatorDesc(t, t, dml.ScaleBias(
        2.0, 1.0)), Clip1(t, t, None, "FLOAT32", -1.5, 2.5), [x], (2, 3, 5))
    np.testing.assert_allclose(got, np.clip(x * 2 + 1, -1.5, 2.5))
    i = dml.TensorDesc("int64", (7,))
    g = dml.GraphDesc(1, 1, [dml.OperatorGraphNodeDesc(Clip1(i, i, None, "INT64", -2 ** 40,
                                                             2 ** 62))],
                      [dml.InputGraphEdgeDesc(0, 0, 0)], [dml.OutputGraphEdgeDesc(0, 0, 0)])
    v = np.array([-2 ** 63, -2 ** 41, -5, 0, 2 ** 61, 2 ** 62 + 1, 2 ** 63 - 1], np.int64)
    compiled = device.compile_graph(g)
    out = device.empty((7,), np.int64)
    compiled.execute([device.tensor(v)], [out])
    compiled.release()
    np.testing.assert_array_equal(out.numpy(), np.clip(v, -2 ** 40, 2 ** 62))


def test_does_not_leak(device):
    x = np.arange(-20, 20, dtype=np.int16)

    def cycle():
        t = dml.TensorDesc("int16", (40,))
        op = device.compile_operator(device.create_operator(Clip1(t, t, None, "INT16", -3, 9)))
        xt, yt = device.tensor(x), device.empty((40,), np.int16)
        op.execute([xt], [yt])
        op.release()
        xt.free()
        yt.free()
    assert_no_leaks(device, cycle, warm=2, rounds=4)


# -- fuzzer (tests/fuzzing.py): valid and invalid descriptors, canaries ---------------------
#: broken rule -> the fields a ValidationError may name.
FUZZ_BROKEN = {"data_type": ["data_type"], "same_type": ["data_type"],
               "sizes": ["output_tensor.sizes"], "type_field": ["min_max_data_type"],
               "bound": [".min", ".max"], "overlap": ["output_tensor.strides"],
               **TENSOR_BROKEN}


@st.composite
def clip1_cases(draw):
    rank = draw(st.integers(1, 8))
    hi = 5 if rank <= 3 else 3 if rank <= 5 else 2
    shape = draw(st.lists(st.integers(1, hi), min_size=rank, max_size=rank))
    if rank <= 2 and draw(st.booleans()):      # rows past the vector widths, sub-word tails
        shape[-1] = draw(st.integers(6, 300))
    dtype = draw(st.sampled_from(TYPES))
    return dict(shape=shape, dtype=dtype, in_place=draw(st.booleans()),
                scale_bias=draw(st.booleans()) and dtype.startswith("float"),
                broken=draw(st.sampled_from(["none"] * 10 + list(FUZZ_BROKEN))),
                **placement(draw, 1))


def _fuzz_descriptor(case, shape, dtype, x_st, out_st, lo, hi, sb):
    broken = case["broken"]
    want = FUZZ_BROKEN.get(broken, [])
    tx = to = tv = dtype
    sx, so = list(shape), list(shape)
    total = None
    if broken == "data_type":
        tx = to = tv = "float64"
    elif broken == "same_type":
        to = {"float32": "float16"}.get(dtype, "float32")
    elif broken == "sizes":
        so[-1] += 1
        out_st = None
    elif broken == "type_field":
        tv = {"int8": "uint8"}.get(dtype, "int8")
    elif broken == "bound":
        dt = np.dtype(dtype)
        hi = float("nan") if dt.kind == "f" else int(np.iinfo(dt).max) + 1
    elif broken == "overlap":
        overlapping = overlapping_strides(shape, out_st)
        if overlapping is None:
            want = []
        else:
            out_st = overlapping
    elif broken in TENSOR_BROKEN:
        sx, x_st, total = break_tensor_rule(broken, sx, x_st)

    def make():
        return Clip1(dml.TensorDesc(tx, sx, x_st, total), dml.TensorDesc(to, so, out_st),
                     None if sb is None else dml.ScaleBias(*sb), tv, lo, hi)
    return make, want


def test_fuzz_clip1(device, speed):
    """Random CLIP1 descriptors (the contract of ``fuzzing.fuzzer``): ranks 1-8, padded,
    permuted, broadcast and strided layouts, edge values, random bounds (Min > Max and
    None among them), ScaleBias on floats, in-place execution, the ten types, one broken
    rule at a time."""
    @fuzzer(speed, clip1_cases(), share=2, refused=0.1)
    def fuzz_case(case):
        rng = np.random.default_rng(case["seed"])
        dtype, shape = case["dtype"], list(case["shape"])
        x = _with_edges(rng, random_values(rng, shape, dtype), "clip", False)
        flat, x_st, logical = lay_out(rng, x, case["layouts"][0])
        # explicit strides (in place, _run_in_place walks the output's strides)
        x_st = x_st or tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        lo, hi = random_bounds(rng, dtype)
        sb = (float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))) if case["scale_bias"] \
            else None
        out_st, read = padded_output(rng, shape, dtype, case["out_padded"])
        # in place: the output is the input's memory, in its layout (one that does not
        # overlap), and the elements end on a whole word: the element-wise kernel's flat
        # path computes the last word whole, so a sub-word tail past the last element
        # (inside TotalTensorSizeInBytes, which is a multiple of 4) is rewritten there
        span = (sum((n - 1) * s for n, s in zip(shape, x_st)) + 1) * np.dtype(dtype).itemsize
        in_place = case["in_place"] and case["broken"] == "none" and span % 4 == 0 and all(
            s or n == 1 for s, n in zip(x_st, shape))
        make, want = _fuzz_descriptor(case, shape, dtype, x_st,
                                      x_st if in_place else out_st, lo, hi, sb)
        desc, compiled = compiled_or_refused(device, make, want)
        if desc is None:
            return
        if in_place:
            got = _run_in_place(device, compiled, desc, flat, flat)
        else:
            got = run_checked(device, compiled, desc, [flat], read)
        expect = reference(logical, _bound(lo, dtype, True), _bound(hi, dtype, False), sb)
        check(got, expect, sb)

    fuzz_case()

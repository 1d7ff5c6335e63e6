"""Fuzzed LP pooling descriptors (see tests/fuzzing.py): 2-3 spatial dimensions, windows,
strides, dilations, paddings, P from 1 to 5, float32 and float16, non-packed layouts, and
one broken rule at a time."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from vkml import dml

from fuzzing import (LAYOUTS, canaries_intact, compiled_or_refused, execute_with_canaries,
                     fuzz_settings, lay_out, padded_output, real_cases, window_geometry)
from references import lp_pooling_reference, window_counts


@st.composite
def lp_cases(draw):
    g = window_geometry(draw, draw(st.integers(2, 3)))
    spatial = g.pop("spatial")
    return dict(shape=[draw(st.integers(1, 2)), draw(st.integers(1, 3))] + spatial, **g,
                p=draw(st.integers(1, 5)),
                dtype=draw(st.sampled_from(["float32", "float16"])),
                mutation=draw(st.sampled_from(["none"] * 8 + ["out", "p0", "stride0", "int",
                                                              "rank3"])),
                layout=draw(st.sampled_from(LAYOUTS)), out_padded=draw(st.booleans()),
                seed=draw(st.integers(0, 2**31)))


def test_fuzz_lp_pooling(device, speed):
    @fuzz_settings(speed)
    @given(lp_cases())
    def check(case):
        rng = np.random.default_rng(case["seed"])
        m = case["mutation"]
        want = {"out": ["output_tensor.sizes"], "p0": ["p"], "stride0": ["strides"],
                "int": ["data_type"], "rank3": ["input_tensor.sizes", "window_size",
                                                 "output_tensor.sizes"]}.get(m, [])
        shape, strides, p, dtype = list(case["shape"]), list(case["strides"]), case["p"], \
            case["dtype"]
        out = shape[:2] + window_counts(shape[2:], case["window"], strides, case["dilations"],
                                        case["start"], case["end"])
        if m == "out":
            out[-1] += 1
        if m == "p0":
            p = 0
        if m == "stride0":
            strides[0] = 0
        if m == "int":
            dtype = "int32"
        if m == "rank3":
            shape, out = shape[:3], out[:3]
        x = rng.uniform(-3, 3, shape).astype(dtype if dtype != "int32" else "float32")
        flat, in_strides, x = lay_out(rng, x, case["layout"])
        out_strides, read = padded_output(rng, out, dtype, case["out_padded"])
        desc, compiled = compiled_or_refused(device, lambda: dml.LpPooling1OperatorDesc(
            dml.TensorDesc(dtype, shape, in_strides), dml.TensorDesc(dtype, out, out_strides),
            strides, case["window"], case["start"], case["end"], case["dilations"], p), want)
        if desc is None:
            return
        src, dst = execute_with_canaries(device, compiled, desc, flat)
        got, gaps_intact = read(dst)
        expect = lp_pooling_reference(x, case["window"], strides, case["dilations"],
                                      case["start"], case["end"], p)
        tol = 2e-3 if dtype == "float16" else 1e-5
        np.testing.assert_allclose(got.astype(np.float64), expect, rtol=tol, atol=tol)
        assert gaps_intact, "wrote into the gaps of a non-packed output"
        assert canaries_intact(src) and canaries_intact(dst), "wrote outside the tensor"

    with real_cases(speed):
        check()

"""Fuzzed Fold and Unfold descriptors (see tests/fuzzing.py): 1-3 spatial dimensions,
strides, dilations, asymmetric paddings, every data type, non-packed layouts, and one
broken rule at a time."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vkml import dml

from fuzzing import (LAYOUTS, canaries_intact, compiled_or_refused, execute_with_canaries,
                     fuzz_settings, lay_out, padded_output, real_cases, window_geometry)
from helpers import ALL_DTYPES, random_bits, same_bits
from references import fold_reference, unfold_reference, window_counts


@st.composite
def window_cases(draw):
    g = window_geometry(draw, draw(st.integers(1, 3)))
    mutation = draw(st.sampled_from(["none"] * 8 + ["rows", "count", "batch", "stride0",
                                                    "too_big", "arr_len", "dtype"]))
    return dict(n=draw(st.integers(1, 2)), c=draw(st.integers(1, 3)), **g,
                dtype=draw(st.sampled_from(ALL_DTYPES)), mutation=mutation,
                layout=draw(st.sampled_from(LAYOUTS)), out_padded=draw(st.booleans()),
                seed=draw(st.integers(0, 2**31)))


_WINDOW_ERRORS = {"stride0": "strides", "too_big": "window_sizes", "arr_len": "strides",
                  "dtype": "data_type"}


def _window_descs(case, op: str, in_strides=None, out_strides=None):
    """(image sizes, columns sizes, desc) for fold or unfold with the case's mutation."""
    from vkml.dml import FoldOperatorDesc, UnfoldOperatorDesc

    n, c, spatial = case["n"], case["c"], list(case["spatial"])
    window, strides = list(case["window"]), list(case["strides"])
    m = case["mutation"]
    if m == "stride0":
        strides[0] = 0
    if m == "too_big":
        window[0] = spatial[0] + case["start"][0] + case["end"][0] + 1
    if m == "arr_len":
        strides = strides + [1]
    blocks = window_counts(spatial, case["window"], case["strides"], case["dilations"],
                     case["start"], case["end"])
    cols = [n, c * int(np.prod(case["window"])), int(np.prod(blocks))]
    if m == "rows":
        cols[1] += 1
    if m == "count":
        cols[2] += 1
    if m == "batch":
        cols[0] += 1
    image = [n, c] + spatial
    dt = case["dtype"]
    other = "int8" if dt != "int8" else "uint8"
    img_dt, col_dt = dt, dt
    if m == "dtype":
        img_dt = other
    if op == "fold":
        desc = FoldOperatorDesc(dml.TensorDesc(col_dt, cols, in_strides),
                                dml.TensorDesc(img_dt, image, out_strides),
                                window, strides, case["dilations"], case["start"], case["end"])
    else:
        desc = UnfoldOperatorDesc(dml.TensorDesc(img_dt, image, in_strides),
                                  dml.TensorDesc(col_dt, cols, out_strides),
                                  window, strides, case["dilations"], case["start"], case["end"])
    return image, cols, desc


def _window_expected_errors(case, op):
    m = case["mutation"]
    if m in ("rows", "count", "batch"):
        return ["input_tensor.sizes" if op == "fold" else "output_tensor.sizes"]
    return [_WINDOW_ERRORS[m]] if m in _WINDOW_ERRORS else []


def _allowed_unsupported(device, dtype) -> bool:
    return dtype == "float64" and not device.features["fp64"]


def _run_window_case(device, case, op):
    rng = np.random.default_rng(case["seed"])
    want = _window_expected_errors(case, op)
    dt = np.dtype(case["dtype"])
    image, cols, _ = _window_descs(case, op)
    in_sizes, out_sizes = (image, cols) if op == "unfold" else (cols, image)
    if dt.kind == "f":
        x = rng.uniform(-4, 4, in_sizes).astype(dt)
    else:
        x = random_bits(rng, in_sizes, dt)
    flat, in_strides, x = lay_out(rng, x, case["layout"])
    out_strides, read = padded_output(rng, out_sizes, dt, case["out_padded"])
    desc, compiled = compiled_or_refused(
        device, lambda: _window_descs(case, op, in_strides, out_strides)[2], want,
        _allowed_unsupported(device, case["dtype"]))
    if desc is None:
        return
    src, dst = execute_with_canaries(device, compiled, desc, flat)
    got, gaps_intact = read(dst)
    args = (case["window"], case["strides"], case["dilations"], case["start"], case["end"])
    if op == "unfold":
        assert same_bits(got, unfold_reference(x, *args))
    else:
        expect = fold_reference(x, case["spatial"], *args)
        if dt.kind == "f":
            # the sums of up to a few overlapping values in [-4, 4]: float16 rounds them
            # to ~1e-3 relative, float32 to ~1e-7, float64 to ~1e-16
            rtol, atol = {np.float16: (1e-2, 1e-2), np.float32: (1e-5, 1e-5),
                          np.float64: (1e-12, 1e-12)}[dt.type]
            np.testing.assert_allclose(got.astype(np.float64), expect.astype(np.float64),
                                       rtol=rtol, atol=atol)
        else:
            assert same_bits(got, expect)
    assert gaps_intact, "wrote into the gaps of a non-packed output"
    assert canaries_intact(src) and canaries_intact(dst), "wrote outside the tensor"
    assert same_bits(src.read_bytes(flat.nbytes).view(dt), flat), "input changed"


@pytest.mark.parametrize("op", ["fold", "unfold"])
def test_fuzz_fold_unfold(device, speed, op):
    @fuzz_settings(speed)
    @given(window_cases())
    def check(case):
        _run_window_case(device, case, op)

    with real_cases(speed):
        check()

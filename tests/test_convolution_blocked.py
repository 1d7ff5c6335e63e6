"""The register-blocked convolution path and Winograd's blocked GEMMs
(``glsl/convolution_blocked.comp``), forced by candidate name on every device, against
the float64 reference of tests/references.py (``convolution_reference``)."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

from vkml import dml

from test_convolution import check_winograd_candidate, desc_reference, run_path
from test_convolution_tiled import _check, check_variant, dense_cases, tile_case

conv_ops = importlib.import_module("vkml.ops.convolution")

BLOCKED = [n for n, (path, _) in conv_ops.CANDIDATES.items() if path == "blocked"]


@pytest.mark.parametrize("name", BLOCKED)
def test_blocked_against_reference(device, budget, name):
    """Every register block, forced: random forward convolutions (1-3 spatial
    dimensions, groups, strides, dilations, padding, both modes), with partial channel
    blocks and pixel blocks."""
    rng = np.random.default_rng(3)
    for _ in range(max(2, budget // 8)):
        _check(device, *tile_case(rng), name)
    for case in dense_cases(rng, max(2, budget // 8)):
        _check(device, *case, name)


@pytest.mark.parametrize("case", ["float16", "float16-packed", "strided"])
def test_blocked_variants(device, case):
    check_variant(device, case, "blocked")


def transposed_case(rng, dtype="float32"):
    """A random transposed convolution (BACKWARD direction, ONNX ConvTranspose): 1-3
    spatial dimensions, strides 1-3, dilations 1-2, padding, output padding, groups,
    both modes, output channels past one register block."""
    while True:
        nd = int(rng.integers(1, 4))
        g = int(rng.choice([1, 2]))
        cig, cog = int(rng.integers(1, 6)), int(rng.integers(1, 12))
        k = [int(rng.integers(1, 5)) for _ in range(nd)]
        s = [int(rng.integers(1, 4)) for _ in range(nd)]
        d = [int(rng.integers(1, 3)) for _ in range(nd)]
        sp = [int(rng.integers(1, {1: 20, 2: 7, 3: 4}[nd])) for _ in range(nd)]
        st = [int(rng.integers(0, 3)) for _ in range(nd)]
        en = [int(rng.integers(0, 3)) for _ in range(nd)]
        op = [int(rng.integers(0, max(s_, d_))) if rng.random() < 0.5 else 0
              for s_, d_ in zip(s, d)]
        xd = dml.TensorDesc(dtype, (int(rng.integers(1, 3)), g * cig, *sp))
        wd = dml.TensorDesc(dtype, (g * cig, cog, *k))
        kw = dict(strides=tuple(s), dilations=tuple(d), start_padding=tuple(st),
                  end_padding=tuple(en), output_padding=tuple(op), group_count=g,
                  mode="convolution" if rng.random() < 0.3 else "cross_correlation",
                  direction="backward")
        try:
            out = dml.ConvolutionOperatorDesc(xd, wd, None, xd, **kw).expected_output_sizes()
        except Exception:
            continue
        if min(out) < 1:
            continue
        bias = rng.random() < 0.6
        desc = dml.ConvolutionOperatorDesc(
            xd, wd, dml.TensorDesc(dtype, (1, g * cog) + (1,) * nd) if bias else None,
            dml.TensorDesc(dtype, out), **kw)
        x = rng.standard_normal(xd.sizes).astype(dtype)
        w = rng.standard_normal(wd.sizes).astype(dtype)
        b = rng.standard_normal(g * cog).astype(dtype) if bias else None
        return desc, x, w, b


@pytest.mark.parametrize("name", BLOCKED)
def test_blocked_transposed_against_reference(device, budget, name):
    """Every register block, forced: random transposed convolutions, run one dispatch
    per stride phase (including phases no tap reaches: bias only), and dense_case's
    transposed draws."""
    rng = np.random.default_rng(23)
    for _ in range(max(3, budget // 4)):
        _check(device, *transposed_case(rng), name)
    for case in dense_cases(rng, max(2, budget // 8), backward=True):
        _check(device, *case, name)


@pytest.mark.parametrize("case", ["float16", "float16-packed", "strided"])
def test_blocked_transposed_variants(device, case):
    """float16 tensors with and without 16-bit storage, and a channels-last input read
    in place through its strides, transposed."""
    check_variant(device, case, "blocked", make=transposed_case, count=2, seed=29)


def test_blocked_transposed_phases():
    """The stride phases of a transposed axis cover every output once, and each lists
    exactly the taps (k d = o + a - i s) whose input lands in range or not: a
    brute-force count of the (output, tap) pairs that divide."""
    from vkml.ops.convolution.blocked import _phase_axis
    rng = np.random.default_rng(5)
    for _ in range(300):
        o_n, k_n = int(rng.integers(1, 20)), int(rng.integers(1, 6))
        s, d, a = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(0, 4))
        seen = []
        for r in range(s):
            o0, cnt, k0, nt, step, base, dd = _phase_axis(o_n, k_n, s, d, a, r)
            for j in range(cnt):
                o = o0 + j * s
                seen.append(o)
                want = {k for k in range(k_n) if (o + a - k * d) % s == 0}
                got = {k0 + t * step for t in range(nt)}
                assert got == want, (o_n, k_n, s, d, a, r)
                for t in range(nt):
                    assert (o + a - (k0 + t * step) * d) // s == base + j - t * dd
        assert sorted(seen) == list(range(o_n))


def test_blocked_registers_are_frozen():
    """RM and RN are frozen into the module (the block's loops unroll on every driver)."""
    from vkml.runtime import pipelines
    assert {"RM", "RN"} <= set(pipelines.kernel_manifest()["convolution_blocked_f32"]["frozen"])


def test_winograd_with_blocked_gemms(device, budget):
    """``winograd-blocked``: Winograd's 36 GEMMs on the blocked kernel, same results."""
    rng = np.random.default_rng(17)
    for compiled in check_winograd_candidate(device, rng, budget, "winograd-blocked"):
        assert compiled.path.blocked is not None


def test_transposed_large_strides_plan_only_phases_with_outputs(device):
    """A transposed convolution with strides of 70000 x 90000 (three outputs a row and
    four a column, the end padding cutting the rest) plans only the stride phases that
    hold outputs: it compiles at once (a loop over all 6.3e9 phases never ended) and
    gives the reference's result."""
    s, t = 70000, 90000
    T = lambda shape: dml.TensorDesc("float32", shape)   # noqa: E731
    desc = dml.ConvolutionOperatorDesc(
        T((1, 2, 2, 2)), T((2, 4, 2, 2)), T((1, 4, 1, 1)), T((1, 4, 3, 4)),
        direction=dml.ConvolutionDirection.BACKWARD, strides=(s, t),
        end_padding=(s - 1, t - 2))
    assert conv_ops.Geometry.of(desc).plain
    rng = np.random.default_rng(1)
    x, w, b = (rng.integers(-3, 4, d.sizes).astype(np.float32) for d in desc.inputs())
    got = run_path(device, desc, x, w, b, path="blocked")[0].reshape(1, 4, 3, 4)
    np.testing.assert_array_equal(got, desc_reference(desc, x, w, b.reshape(-1)))

"""The register-blocked convolution path and Winograd's blocked GEMMs
(``glsl/convolution_blocked.comp``), forced by candidate name on every device, against
the float64 reference of tests/references.py (``convolution_reference``)."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

from test_convolution import (accepting_paths, dense_case, desc_reference, path_tolerance,
                              run_path, winograd_case)
from test_convolution_tiled import _check, check_variant, tile_case

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
    done = 0
    while done < max(2, budget // 8):
        desc, x, w, b = dense_case(rng, True)
        if desc.is_backward:
            continue
        _check(device, desc, x, w, b, name)
        done += 1


@pytest.mark.parametrize("case", ["float16", "float16-packed", "strided"])
def test_blocked_variants(device, case):
    check_variant(device, case, "blocked")


def test_blocked_registers_are_frozen():
    """RM and RN are frozen into the module (the block's loops unroll on every driver)."""
    from vkml.runtime import pipelines
    assert {"RM", "RN"} <= set(pipelines.FROZEN_CONSTANTS)


def test_winograd_with_blocked_gemms(device, budget):
    """``winograd-blocked``: Winograd's 36 GEMMs on the blocked kernel, same results."""
    rng = np.random.default_rng(17)
    done = 0
    while done < max(1, budget // 16):
        desc, x, w, b = winograd_case(rng, True)
        if "winograd" not in accepting_paths(device, desc):
            continue
        done += 1
        got, compiled = run_path(device, desc, x, w, b, path="winograd-blocked")
        assert compiled.path.blocked is not None
        ref = desc_reference(desc, x, w, b)
        np.testing.assert_allclose(got[:ref.size].reshape(ref.shape), ref,
                                   **path_tolerance("winograd", w), err_msg=str(desc))

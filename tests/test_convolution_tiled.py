"""The shared-memory tiled convolution path (``glsl/convolution_tiled.comp``), forced by
candidate name on every device, against the float64 reference of tests/references.py
(``convolution_reference``, checked against PyTorch in test_references.py)."""
from __future__ import annotations

import dataclasses
import importlib
import math

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.errors import UnsupportedError

from test_convolution import dense_case, desc_reference, path_tolerance, run_path

conv_ops = importlib.import_module("vkml.ops.convolution")

TILED = [n for n, (path, _) in conv_ops.CANDIDATES.items() if path == "tiled"
         and not conv_ops.CANDIDATES[n][1].get("f16_arith")]


def tile_case(rng, dtype="float32"):
    """Channels and pixels past one tile and one shared-memory stage (TM, TN, TK), so
    partial tiles, several stages and a partial last stage all occur."""
    nd = int(rng.integers(1, 4))
    g = int(rng.choice([1, 2]))
    cig, cog = int(rng.integers(17, 40)), int(rng.integers(33, 70))
    k = [int(rng.integers(1, 4)) for _ in range(nd)]
    s = [int(rng.integers(1, 3)) for _ in range(nd)]
    d = [int(rng.integers(1, 3)) for _ in range(nd)]
    sp = [int(rng.integers(k_ * d_, k_ * d_ + {1: 70, 2: 9, 3: 4}[nd])) for k_, d_ in zip(k, d)]
    pad = [int(rng.integers(0, 2)) for _ in range(nd)]
    xd = dml.TensorDesc(dtype, (1, g * cig, *sp))
    wd = dml.TensorDesc(dtype, (g * cog, cig, *k))
    kw = dict(strides=tuple(s), dilations=tuple(d), start_padding=tuple(pad),
              end_padding=tuple(pad), group_count=g,
              mode="convolution" if rng.random() < 0.3 else "cross_correlation")
    out = dml.ConvolutionOperatorDesc(xd, wd, None, xd, **kw).expected_output_sizes()
    desc = dml.ConvolutionOperatorDesc(xd, wd, dml.TensorDesc(dtype, (1, g * cog) + (1,) * nd),
                                       dml.TensorDesc(dtype, out), **kw)
    x = rng.standard_normal(xd.sizes).astype(dtype)
    w = rng.standard_normal(wd.sizes).astype(dtype)
    return desc, x, w, rng.standard_normal(g * cog).astype(dtype)


def dense_cases(rng, count: int, backward: bool = False):
    """``count`` of test_convolution's small dense cases of one direction."""
    done = 0
    while done < count:
        desc, x, w, b = dense_case(rng, True)
        if desc.is_backward == backward:
            done += 1
            yield desc, x, w, b


def _check(device, desc, x, w, b, name, dtype="float32", buf=None):
    got, compiled = run_path(device, desc, buf if buf is not None else x, w, b, path=name)
    assert compiled.path.candidate == name
    assert compiled.path.name == conv_ops.CANDIDATES[name][0]
    ref = desc_reference(desc, x, w, b)
    np.testing.assert_allclose(got[:ref.size].reshape(ref.shape).astype(np.float64), ref,
                               err_msg=f"{name}: {desc}", **path_tolerance("tiled", w, dtype))


@pytest.mark.parametrize("name", TILED)
def test_tiled_against_reference(device, budget, name):
    """Every tile shape, forced: random forward convolutions (1-3 spatial dimensions,
    groups, strides, dilations, padding, both modes) over several tiles and stages."""
    rng = np.random.default_rng(7)
    for _ in range(max(2, budget // 8)):
        _check(device, *tile_case(rng), name)
    for case in dense_cases(rng, max(2, budget // 8)):   # the small cases the others meet
        _check(device, *case, name)


def check_variant(device, case, name, make=tile_case, count=1, seed=11):
    """float16 tensors with and without 16-bit storage, and a channels-last input read
    in place through its strides, on candidate ``name``: ``count`` cases of ``make``."""
    rng = np.random.default_rng(seed)
    dtype = "float16" if case.startswith("float16") else "float32"
    kwargs = {"disable_features": ["storage16", "storage8"]} if case == "float16-packed" else {}
    with vkml.Device(device.index, **kwargs) as dev:
        for _ in range(count):
            desc, x, w, b = make(rng, dtype)
            buf = None
            if case == "strided":
                perm = (0, *range(2, x.ndim), 1)
                buf = np.ascontiguousarray(x.transpose(perm))
                st = np.array(buf.strides)[np.argsort(perm)] // x.itemsize
                desc = dataclasses.replace(desc, input_tensor=dml.TensorDesc(
                    dtype, x.shape, tuple(int(v) for v in st)))
            _check(dev, desc, x, w, b, name, dtype, buf)


@pytest.mark.parametrize("case", ["float16", "float16-packed", "strided"])
def test_tiled_variants(device, case):
    check_variant(device, case, "tiled")


def test_tiled_float16_arithmetic_error_bound(device):
    """``tiled-f16`` (float16 arithmetic, devices with shaderFloat16 and 16-bit storage):
    each stage's TK products are summed in float16, so per output
    |y - ref| <= (TK + 1) 2^-11 sum_k |w_k x_k| + 2^-11 |ref| (the float16 output);
    refused with UnsupportedError elsewhere and for float32 tensors."""
    rng = np.random.default_rng(5)
    desc, x, w, b = tile_case(rng, "float16")
    has = device.info.features["fp16"] and device.info.features["storage16"]
    if not has:
        with pytest.raises(UnsupportedError):
            run_path(device, desc, x, w, b, path="tiled-f16")
        return
    got, compiled = run_path(device, desc, x, w, b, path="tiled-f16")
    assert compiled.path.tile[2] == conv_ops.TILES["64"][2]
    tk = compiled.path.tile[2]
    ref = desc_reference(desc, x, w, b)
    mag = desc_reference(desc, np.abs(x), np.abs(w), None)       # sum |w x| per output
    bound = (tk + 1) * 2.0 ** -11 * mag + 2.0 ** -11 * np.abs(ref) + 1e-3 * np.abs(b).max()
    err = np.abs(got[:ref.size].reshape(ref.shape).astype(np.float64) - ref)
    assert (err <= bound).all(), float((err / bound).max())
    f32 = dataclasses.replace(desc, **{f: dml.TensorDesc("float32", getattr(desc, f).sizes)
                                       for f in ("input_tensor", "filter_tensor",
                                                 "bias_tensor", "output_tensor")})
    with pytest.raises(UnsupportedError):
        run_path(device, f32, x.astype(np.float32), w.astype(np.float32),
                 b.astype(np.float32), path="tiled-f16")


def test_tiled_declines_what_it_cannot_run(device):
    """Transposed convolutions and outputs past the covered positions go to other paths;
    forcing the tiled path there is an UnsupportedError naming it."""
    xd, wd = dml.TensorDesc("float32", (1, 4, 5, 5)), dml.TensorDesc("float32", (4, 4, 3, 3))
    back = dml.ConvolutionOperatorDesc(xd, wd, None, dml.TensorDesc("float32", (1, 4, 7, 7)),
                                       direction="backward")
    with pytest.raises(UnsupportedError, match="tiled"):
        run_path(device, back, np.zeros((1, 4, 5, 5), np.float32),
                 np.zeros((4, 4, 3, 3), np.float32), None, path="tiled")
    assert math.prod(conv_ops.TILES["64"][:2]) // 16 <= 256     # its workgroup size

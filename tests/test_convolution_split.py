"""Split-K on the convolution GEMMs (knob ``split_k``: ``gemm.SplitK``, candidates
``gemm-split4`` ... ``gemm_sg-split16``) against the float64 reference on every device,
and the fast lists that offer them only where a layer's grid is narrower than the
device's measured concurrent width (``vkml/ops/concurrent_width.py``)."""
from __future__ import annotations

import importlib
import math
import time

import numpy as np
import pytest

import vkml
from vkml import dml, tuning
from vkml.errors import UnsupportedError
from vkml.ops import concurrent_width as cw

from helpers import compile_on_path, conv_add_relu_graph, run_desc
from references import convolution_reference

conv_ops = importlib.import_module("vkml.ops.convolution")
choice = importlib.import_module("vkml.ops.convolution.choice")
gemm_mod = importlib.import_module("vkml.ops.convolution.gemm")

SPLITS = ["gemm-split4", "gemm-split16", "gemm_sg-split4", "gemm_sg-split16"]


def _desc(dtype, x_shape, w_shape, y_strides=None, **kw):
    xd, wd = dml.TensorDesc(dtype, x_shape), dml.TensorDesc(dtype, w_shape)
    out = dml.ConvolutionOperatorDesc(xd, wd, None, xd, **kw).expected_output_sizes()
    bd = dml.TensorDesc(dtype, (1, out[1]) + (1,) * (len(x_shape) - 2))
    return dml.ConvolutionOperatorDesc(xd, wd, bd, dml.TensorDesc(dtype, out, y_strides), **kw)


def _has_sg(device) -> bool:
    return gemm_mod.subgroup_shuffle_size(choice._Probe(device, _desc(
        "float32", (1, 4, 4, 4), (4, 4, 1, 1)))) >= 4


def _reference(desc, x, w, b):
    ref = convolution_reference(x, w, b, list(desc.strides), list(desc.dilations),
                                list(desc.start_padding), list(desc.end_padding),
                                list(desc.output_padding), desc.group_count,
                                desc.conv_mode.name.lower(), desc.conv_direction.name.lower())
    if desc.fused_activation is not None:
        ref = np.maximum(ref, 0.0)            # (the cases fuse relu only)
    return ref


def _check(device, desc, path, rng):
    """``desc`` on candidate ``path`` against the reference; the compiled path."""
    dtype = desc.input_tensor.dtype
    x = rng.standard_normal(desc.input_tensor.sizes).astype(dtype)
    w = rng.standard_normal(desc.filter_tensor.sizes).astype(dtype)
    b = rng.standard_normal(desc.output_tensor.sizes[1]).astype(dtype)
    compiled = compile_on_path(device, desc, path)
    got = run_desc(device, desc, x, w, b, compiled=compiled)
    ref = _reference(desc, x, w, b)
    yd = desc.output_tensor
    if not yd.is_packed:
        got = np.lib.stride_tricks.as_strided(
            got, yd.sizes, [s * got.itemsize for s in yd.element_strides])
    terms = math.prod(desc.filter_tensor.sizes[1:])
    tol = (dict(rtol=2e-3, atol=2e-3 * math.sqrt(terms)) if dtype == np.float16
           else dict(rtol=1e-5, atol=2e-5 * math.sqrt(terms)))
    np.testing.assert_allclose(got[:ref.size].reshape(ref.shape).astype(np.float64), ref,
                               err_msg=f"{path} {desc}", **tol)
    return compiled.path


#: (input, filter, fields, slices the split4 / split16 plans take): 3x3 s1 on a 7x7
#: plane, 3x3 s2 over two images with channels that no CU group count divides, a 1x1
#: with fewer channels than slices (K 3 < S), groups with a fused activation, a
#: transposed convolution (phases), 3-D, a strided output
CASES = [
    ((1, 16, 7, 7), (8, 16, 3, 3), dict(start_padding=(1, 1), end_padding=(1, 1))),
    ((2, 10, 9, 9), (12, 10, 3, 3), dict(strides=(2, 2), start_padding=(1, 1),
                                         end_padding=(1, 1))),
    ((1, 3, 5, 5), (8, 3, 1, 1), {}),
    ((1, 8, 5, 7), (12, 4, 3, 3), dict(group_count=2, start_padding=(1, 1),
                                       end_padding=(1, 1), fused_activation="relu")),
    ((1, 8, 6, 5), (8, 6, 4, 4), dict(strides=(2, 2), start_padding=(1, 1),
                                      end_padding=(1, 1), direction="backward")),
    ((1, 6, 3, 4, 5), (4, 6, 2, 3, 3), dict(start_padding=(0, 1, 1), end_padding=(0, 1, 1))),
    ((1, 12, 5, 5), (4, 12, 3, 3), dict(start_padding=(1, 1), end_padding=(1, 1),
                                        y_strides=(4 * 5 * 6, 5 * 6, 6, 1))),
]


@pytest.mark.parametrize("path", SPLITS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_split_candidates_against_the_reference(device, path, case):
    """Each split candidate forced on each geometry, float32, against float64: the
    slices' partials, the second pass's bias, activation and strided stores."""
    if path.startswith("gemm_sg") and not _has_sg(device):
        pytest.skip("no subgroup shuffles on this device")
    xs, ws, kw = CASES[case]
    rng = np.random.default_rng(100 + case)
    p = _check(device, _desc("float32", xs, ws, **kw), path, rng)
    want = conv_ops.CANDIDATES[path][1]["split_k"]
    cig = xs[1] // kw.get("group_count", 1)
    assert 2 <= p.ks <= min(want, cig), p.ks


@pytest.mark.parametrize("path", ["gemm-split4", "gemm_sg-split16"])
def test_split_float16(device, path):
    """float16 tensors: the GEMM stores float32 partials whatever the type, the second
    pass reads the float16 bias and rounds its stores."""
    if path.startswith("gemm_sg") and not _has_sg(device):
        pytest.skip("no subgroup shuffles on this device")
    rng = np.random.default_rng(7)
    for xs, ws, kw in (CASES[0], CASES[1]):
        _check(device, _desc("float16", xs, ws, **kw), path, rng)


def test_split_slices_cover_k(device):
    """Slices of whole CU groups, none empty: S not dividing the channels (10 channels in
    CU pairs: 5 pairs, 3 slices of 2 + 2 + 1), fewer channels than slices (3 in 16: 3
    slices), CU halved so that 8 channels still split 4 ways; each checked against the
    reference."""
    assert gemm_mod.split_slices(10, 4) == 4 and gemm_mod.split_slices(5, 4) == 3
    assert gemm_mod.split_slices(3, 16) == 3 and gemm_mod.split_slices(64, 16) == 16
    assert gemm_mod.split_cu(8, 8, 4) == 2 and gemm_mod.split_cu(8, 512, 16) == 8
    assert gemm_mod.split_cu(8, 8, 1) == 8
    rng = np.random.default_rng(3)
    for cin, path, ks in ((10, "gemm-split4", 3), (3, "gemm-split16", 3),
                          (8, "gemm-split4", 4)):
        p = _check(device, _desc("float32", (1, cin, 5, 6), (4, cin, 1, 3),
                                 start_padding=(0, 1), end_padding=(0, 1)), path, rng)
        assert p.ks == ks


def test_split_declines_without_channels_to_split(device):
    """A group of one input channel (depthwise) has no reduction along channels to
    split: the split candidates do not take it."""
    desc = _desc("float32", (1, 4, 6, 6), (8, 1, 3, 3), group_count=4)
    for path in ("gemm-split4", "gemm_sg-split4"):
        with pytest.raises(UnsupportedError):
            compile_on_path(device, desc, path)


def test_split_with_residual(device):
    """A graph's Add and Relu fused into a split convolution: the residual is added by
    the second pass (its ``_res`` variant), not by the GEMM's partial stores."""
    rng = np.random.default_rng(11)
    TD = dml.TensorDesc
    x, w, b = TD("float32", (1, 12, 6, 6)), TD("float32", (8, 12, 3, 3)), \
        TD("float32", (1, 8, 1, 1))
    y = TD("float32", (1, 8, 6, 6))
    conv = dml.ConvolutionOperatorDesc(x, w, b, y, start_padding=(1, 1), end_padding=(1, 1))
    g = conv_add_relu_graph(conv, y)
    arrays = [rng.standard_normal(t.sizes).astype(np.float32) for t in (x, w, b, y)]
    cg = device.compile_graph(g, paths={0: "gemm-split4"})
    try:
        out = device.empty(y.sizes, np.float32)
        cg.execute([device.tensor(a) for a in arrays], [out])
        assert any(f.kind == "residual" for f in cg.fusions)
    finally:
        cg.release()
    ref = np.maximum(_reference(conv, *arrays[:2], arrays[2].reshape(-1)) + arrays[3], 0.0)
    np.testing.assert_allclose(out.numpy().astype(np.float64), ref, rtol=1e-5, atol=2e-4)


# -- the concurrent width -------------------------------------------------------------
def test_width_fit():
    """The width is the largest grid timed within GROW of the fastest one's; a smaller
    grid's disturbed run past the line does not end it (the sweep stops at the first
    grid past the line as it stands then)."""
    assert cw.fit(None, {"g1": 1e-4, "g2": 1.1e-4, "g4": 2e-4}) == {"width": 2}
    assert cw.fit(None, {"g1": 2e-4, "g2": 1e-4, "g4": 3e-4}) == {"width": 2}
    assert cw.fit(None, {f"g{1 << i}": 5e-5 for i in range(9)}) == {"width": 256}
    assert cw.fit(None, {}) == {"width": 0}


def test_width_is_measured_once_and_stored(device, tmp_path, monkeypatch):
    """Measured on first need (a short sweep: it stops one grid past the width), stored
    with the device's tuning records, and read back by a later tuner (another process)
    without running the probe; tuning off gives 0 and measures nothing."""
    t = tuning.Tuner("fast", folder=tmp_path)
    m = t.model(device, cw.MODEL)
    assert m.source == "measured" and m.params["width"] >= 1
    timed = sorted(int(n[1:]) for n in m.times)
    assert timed == [1 << i for i in range(len(timed))] and len(timed) < len(cw.POINTS)
    assert m.params["width"] < timed[-1]          # the sweep ended past the width
    e = t.lookup(m.key)
    assert set(e["declined"]) == {c.name for c in cw.POINTS} - set(m.times)

    def no_probe(*_):
        raise AssertionError("measured again")
    monkeypatch.setattr(tuning, "_swept", no_probe)
    again = tuning.Tuner("fast", folder=tmp_path).model(device, cw.MODEL)
    assert again.source == "stored" and again.params == m.params
    monkeypatch.setattr(tuning, "_DEFAULT", tuning.Tuner("off", folder=tmp_path))
    assert cw.concurrent_width(device) == 0


def _fake_width(tuner, device, width: int) -> None:
    """Store a width record for ``device``: grids up to ``width`` at one time, the next
    one twice that (what a sweep ending there stores)."""
    times = {f"g{1 << i}": 1e-4 for i in range(width.bit_length())}
    times[f"g{1 << width.bit_length()}"] = 2e-4
    key = tuner.key(device, cw.MODEL, tuning.MODEL_CLASS)
    entry = {"choice": "g1", "seconds": 1e-4, "times": times,
             "declined": [c.name for c in cw.POINTS if c.name not in times], "rounds": 1,
             "mode": "fast", "stale": False, "measured_at": time.time()}
    tuner._store(key, lambda _old: entry)


def test_fast_list_offers_splits_only_below_the_width(device, tmp_path, monkeypatch):
    """A layer whose GEMM grid is narrower than the stored width gets the split
    candidates of one GEMM path in its fast list (those whose slices keep
    SPLIT_MIN_SLICE_K products; the path the device's family ranking puts ahead, gemm_sg
    unranked); at or past the width, or with a short reduction, none."""
    t = tuning.Tuner("fast", folder=tmp_path)
    monkeypatch.setattr(tuning, "_DEFAULT", t)
    monkeypatch.setattr(choice, "family_times", lambda _device: {})
    monkeypatch.setattr(choice, "_family_once", lambda _device: set())
    desc = _desc("float32", (1, 64, 7, 7), (64, 64, 3, 3), start_padding=(1, 1),
                 end_padding=(1, 1))          # K 576: 4 slices of 144, not 16 of 36
    probe = choice._Probe(device, desc)
    grid = gemm_mod.gemm_workgroups(probe, probe.geo)
    assert grid >= 1
    family = "gemm_sg" if _has_sg(device) else "gemm"
    shape = choice.tuning_shape(desc)
    _fake_width(t, device, 1 << grid.bit_length())          # wider than the grid
    assert cw.concurrent_width(device) > grid
    fast = choice._fast(shape, device)
    assert f"{family}-split4" in fast and f"{family}-split16" not in fast
    monkeypatch.setattr(choice, "family_times", lambda _device: {"gemm_sg": 2e-3, "gemm": 1e-3})
    assert "gemm-split4" in choice._fast(shape, device)   # the family the device ranks ahead
    monkeypatch.setattr(choice, "family_times", lambda _device: {})
    short = _desc("float32", (1, 8, 7, 7), (64, 8, 3, 3), start_padding=(1, 1),
                  end_padding=(1, 1))         # K 72: no slice of 64 products in 4
    assert not any("split" in n for n in choice._fast(choice.tuning_shape(short), device))
    t2 = tuning.Tuner("fast", folder=tmp_path / "narrow")
    monkeypatch.setattr(tuning, "_DEFAULT", t2)
    _fake_width(t2, device, 1 << (grid.bit_length() - 1))     # at most the grid
    assert cw.concurrent_width(device) <= grid
    assert not any("split" in n for n in choice._fast(shape, device))

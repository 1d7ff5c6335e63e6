"""The device's store width (vkml/ops/store_width.py): measured once by the tuner, the
faster form kept; kernels that can store eight float32 as one u64vec4 follow it."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

from vkml import dml, tuning
from vkml.errors import UnsupportedError
from vkml.ops import store_width
from vkml.tuning import Tuner

from helpers import compile_on_path, run_desc
from references import convolution_reference

conv_ops = importlib.import_module("vkml.ops.convolution")


class _Measured:
    """A stand-in tuner whose store-width probe read these times (and nothing else)."""

    def __init__(self, u64: float, vec4: float):
        self.times = {"u64vec4": u64, "vec4": vec4}

    def effective_mode(self, mode=None):
        return "fast"

    def choose(self, device, path, shape, **kw):
        assert path is store_width.PATH
        return type("C", (), {"name": min(self.times, key=self.times.get),
                              "times": self.times})()


def test_probe_keeps_the_faster_form(device, tmp_path):
    """Both forms are timed where the device has int64 shaders (the u64vec4 probe
    declines elsewhere) and the faster is the choice, stored once per device."""
    t = Tuner("full", folder=tmp_path, rounds=2)
    c = t.choose(device, store_width.PATH, "device")
    if device.info.features.get("int64"):
        assert set(c.times) == {"vec4", "u64vec4"}
        assert c.name == min(c.times, key=c.times.get)
    else:
        assert set(c.times) == {"vec4"} and c.name == "vec4"
    again = Tuner("fast", folder=tmp_path).choose(device, store_width.PATH, "device")
    assert again.source == "stored" and again.name == c.name


def test_wide_stores_follow_the_tuner(device, tmp_path, monkeypatch):
    """``wide_stores``: the stored measurement where the device has int64 shaders (u64vec4
    unless float4 stores were faster by more than TIE); never without them; never with
    tuning off (the documented default, float4 stores)."""
    t = Tuner("fast", folder=tmp_path, rounds=2)
    monkeypatch.setattr(tuning, "default_tuner", lambda: t)
    times = t.choose(device, store_width.PATH, "device", mode="full").times or {}
    wide = ("u64vec4" in times and times["u64vec4"] <= store_width.TIE * times["vec4"])
    assert store_width.wide_stores(device) == (bool(device.info.features.get("int64"))
                                               and wide)
    monkeypatch.setattr(tuning, "default_tuner", lambda: Tuner("off", folder=tmp_path))
    assert store_width.wide_stores(device) is False


@pytest.mark.parametrize("u64, vec4, wide", [(0.20e-3, 0.25e-3, True), (0.26e-3, 0.25e-3, True),
                                             (0.30e-3, 0.25e-3, False)])
def test_a_tie_goes_to_the_wide_stores(device, monkeypatch, u64, vec4, wide):
    """u64vec4 stores unless float4 stores were faster by more than TIE (a probe taken
    while the machine was slow read both alike); never without int64 shaders."""
    monkeypatch.setattr(tuning, "default_tuner", lambda: _Measured(u64, vec4))
    assert store_width.wide_stores(device) == (wide and bool(device.info.features.get("int64")))


@pytest.mark.parametrize("path, x_shape, w_shape", [
    ("winograd-sg", (1, 16, 16, 40), (24, 16, 3, 3)),
    ("winograd-cl", (2, 16, 16, 40), (24, 16, 3, 3)),
    ("winograd-blocked", (1, 16, 16, 40), (24, 16, 3, 3)),
    ("winograd", (1, 16, 16, 40), (24, 16, 3, 3)),
    ("gemm_sg", (1, 8, 10, 40), (16, 8, 3, 3)),
    ("gemm", (1, 8, 10, 40), (16, 8, 3, 3)),
])
def test_kernels_follow_the_device_store_width(device, monkeypatch, path, x_shape, w_shape):
    """Where the device's store width is u64vec4 the Winograd passes (every GEMM of
    them) and the implicit GEMM store eight float32 at once without being asked, with
    the same bits as their float4 stores; without int64 shaders nothing changes."""
    desc = dml.ConvolutionOperatorDesc(
        dml.TensorDesc("float32", x_shape), dml.TensorDesc("float32", w_shape), None,
        dml.TensorDesc("float32", (x_shape[0], w_shape[0], *x_shape[2:])),
        start_padding=(1, 1), end_padding=(1, 1))
    rng = np.random.default_rng(5)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    try:
        narrow = compile_on_path(device, desc, path)
    except UnsupportedError as e:       # the device lacks what the path needs (by name)
        pytest.skip(f"{path} does not run here: {e}")
    four = run_desc(device, desc, x, w, None, compiled=narrow)
    monkeypatch.setattr(tuning, "default_tuner", lambda: _Measured(1e-4, 2e-4))
    wide = compile_on_path(device, desc, path)
    int64 = bool(device.info.features.get("int64"))
    p = wide.path
    # (Winograd's output pass stores u64vec4s only where asked, knob store64: its float4
    # stores' pipeline serves every output width, test_winograd_output_width_shares)
    used = (p.v8 and not p.y8 and (p.gemm_v8 or p.blocked is not None)
            if path.startswith("winograd")
            else all(d["yv8"] for d in p.dispatches))
    # the implicit GEMM stores 8 at once where its float4 plan stores 4 (gemm_sg's block
    # follows the subgroup size: on 32 lanes rows of 40 take NB = 14, no float4 stores)
    four_plan = path.startswith("winograd") or all(d["yv4"] for d in narrow.path.dispatches)
    assert used == (int64 and four_plan)
    got = run_desc(device, desc, x, w, None, compiled=wide)
    np.testing.assert_array_equal(got.view(np.uint32), four.view(np.uint32))
    ref = convolution_reference(x, w, None, [1, 1], [1, 1], [1, 1], [1, 1], [0, 0], 1,
                                desc.conv_mode.name.lower(), desc.conv_direction.name.lower())
    np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-3, atol=2e-3)  # (Winograd)


@pytest.mark.parametrize("n, c_in, c_out", [(1, 16, 24), (2, 24, 20)])
def test_winograd_output_width_shares(device, monkeypatch, n, c_in, c_out):
    """Where the device's store width is u64vec4, Winograd's output pass keeps float4
    stores unless knob store64 asks (``winograd-v8``), so output rows of a multiple of 8
    and of 4 alone run one output pipeline (a model's layers share it); the asked-for
    u64vec4 rows give the same bits, and both the reference's values."""
    monkeypatch.setattr(tuning, "default_tuner", lambda: _Measured(1e-4, 2e-4))
    kernels, outs = {}, {}
    for width, path in ((16, "winograd"), (12, "winograd"), (16, "winograd-v8")):
        x_shape, w_shape = (n, c_in, 10, width), (c_out, c_in, 3, 3)
        desc = dml.ConvolutionOperatorDesc(
            dml.TensorDesc("float32", x_shape), dml.TensorDesc("float32", w_shape), None,
            dml.TensorDesc("float32", (n, c_out, 10, width)),
            start_padding=(1, 1), end_padding=(1, 1))
        rng = np.random.default_rng(n * width)       # (both paths of a width: one input)
        x = rng.standard_normal(x_shape).astype(np.float32)
        w = rng.standard_normal(w_shape).astype(np.float32)
        try:
            compiled = compile_on_path(device, desc, path)
        except UnsupportedError as e:
            if path == "winograd-v8":       # (no int64 shaders: nothing else to compare)
                assert not device.info.features.get("int64")
                break
            raise
        p = compiled.path
        kernels[width, path] = (p.out_kernel, tuple(sorted(p.out_constants.items())), p.y8)
        got = run_desc(device, desc, x, w, None, compiled=compiled)
        ref = convolution_reference(x, w, None, [1, 1], [1, 1], [1, 1], [1, 1], [0, 0], 1,
                                    "cross_correlation", "forward")
        np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-3, atol=2e-3)
        if width == 16:
            outs[path] = got
    assert kernels[16, "winograd"] == kernels[12, "winograd"]
    assert not kernels[16, "winograd"][2]
    if "winograd-v8" in outs:
        assert kernels[16, "winograd-v8"][2]
        np.testing.assert_array_equal(outs["winograd"].view(np.uint32),
                                      outs["winograd-v8"].view(np.uint32))

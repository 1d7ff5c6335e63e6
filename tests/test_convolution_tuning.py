"""Convolution's kernel path chosen by the tuner (tunable path ``convolution`` of
vkml/ops/convolution.py): the documented default with ``VKML_TUNE=off``, every candidate
against the float64 reference, the measured fastest kept and reused.  What tuning costs a
first call (fast against off, and a second process reusing the choice) is a bench figure
(bench/tuning_cost.py), not a timed test."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

import vkml
from vkml import dml, tuning
from vkml.errors import UnsupportedError

from helpers import compile_on_path, run_desc
from references import convolution_reference

conv_ops = importlib.import_module("vkml.ops.convolution")
conv_choice = importlib.import_module("vkml.ops.convolution.choice")    # _run, _Probe


def _desc(x_shape, w_shape, groups=1, pad=0):
    xd, wd = dml.TensorDesc("float32", x_shape), dml.TensorDesc("float32", w_shape)
    n = len(x_shape) - 2
    kw = dict(group_count=groups, start_padding=(pad,) * n, end_padding=(pad,) * n)
    out = dml.ConvolutionOperatorDesc(xd, wd, None, xd, **kw).expected_output_sizes()
    return dml.ConvolutionOperatorDesc(xd, wd, dml.TensorDesc("float32", (1, w_shape[0], 1, 1)),
                                       dml.TensorDesc("float32", out), **kw)


#: (descriptor, the VKML_TUNE=off choice where gemm_sg is offered, where it is not)
SHAPES = [
    (_desc((1, 8, 9, 9), (8, 1, 3, 3), groups=8, pad=1), "depthwise", "depthwise"),
    (_desc((1, 16, 7, 7), (12, 16, 1, 1)), "gemm_sg", "gemm"),
    (_desc((1, 16, 22, 22), (16, 16, 3, 3), pad=1), "gemm_sg", "winograd"),
    (_desc((1, 3, 6, 6), (2, 3, 3, 3)), "direct", "direct"),
]


def _has_sg(device) -> bool:
    op = compile_on_path(device, SHAPES[-1][0], "direct")
    try:
        return conv_ops.subgroup_shuffle_size(op) >= 4
    finally:
        op.release()


@pytest.mark.parametrize("case", range(len(SHAPES)))
def test_off_is_the_documented_default(device, case, monkeypatch):
    """VKML_TUNE=off: the heuristic's first path (features and limits only), default knobs."""
    monkeypatch.setenv("VKML_TUNE", "off")
    desc, with_sg, without = SHAPES[case]
    op = device.compile_operator(device.create_operator(desc))
    try:
        assert op.path.candidate == (with_sg if _has_sg(device) else without)
        assert op.path.knobs == conv_ops.DEFAULT_KNOBS
    finally:
        op.release()


@pytest.mark.parametrize("case", range(len(SHAPES)))
def test_every_candidate_matches_the_reference(device, case):
    desc, _, _ = SHAPES[case]
    rng = np.random.default_rng(case)
    x = rng.standard_normal(desc.input_tensor.sizes).astype(np.float32)
    w = rng.standard_normal(desc.filter_tensor.sizes).astype(np.float32)
    b = rng.standard_normal(desc.bias_tensor.sizes).astype(np.float32)
    ref = convolution_reference(x, w, b.reshape(-1), desc.strides, desc.dilations,
                                desc.start_padding, desc.end_padding,
                                groups=desc.group_count)
    ran = []
    for name in conv_ops.CANDIDATES:
        try:
            op = compile_on_path(device, desc, name)
        except UnsupportedError:
            continue
        assert op.path.candidate == name
        got = run_desc(device, desc, x, w, b, compiled=op)
        np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4,
                                   err_msg=name)
        ran.append(name)
    assert "direct" in ran and (len(ran) >= 2 or desc.input_tensor.sizes[1] == 3)


@pytest.mark.parametrize("case", ["7x7-s2", "1x1"])
def test_gemm_sg_blocks_bounded(device, case):
    """gemm_sg's register blocks keep the unrolled body within GEMM_UNROLL (7 column taps:
    MB gives way) and at most SG_ACC accumulators (SG_ACC_FLAT on a 1x1's flattened plane
    of whole float4s), and still match the reference."""
    gemm = importlib.import_module("vkml.ops.convolution.gemm")
    if case == "7x7-s2":
        xd, wd = dml.TensorDesc("float32", (1, 3, 20, 20)), dml.TensorDesc("float32",
                                                                           (16, 3, 7, 7))
        kw = dict(strides=(2, 2), start_padding=(3, 3), end_padding=(3, 3))
        out = dml.ConvolutionOperatorDesc(xd, wd, None, xd, **kw).expected_output_sizes()
        desc = dml.ConvolutionOperatorDesc(xd, wd, dml.TensorDesc("float32", (1, 16, 1, 1)),
                                           dml.TensorDesc("float32", out), **kw)
    else:
        desc = _desc((1, 16, 12, 12), (16, 16, 1, 1))
    try:
        op = compile_on_path(device, desc, "gemm_sg")
    except UnsupportedError:
        pytest.skip("no gemm_sg on this device")
    p = op.path
    taps = desc.filter_tensor.sizes[3]
    acc = gemm.SG_ACC_FLAT if case == "1x1" else gemm.SG_ACC
    assert p.mb * p.nb * taps <= gemm.GEMM_UNROLL and p.mb * p.nb <= acc
    rng = np.random.default_rng(7)
    x = rng.standard_normal(desc.input_tensor.sizes).astype(np.float32)
    w = rng.standard_normal(desc.filter_tensor.sizes).astype(np.float32)
    b = rng.standard_normal(desc.bias_tensor.sizes).astype(np.float32)
    ref = convolution_reference(x, w, b.reshape(-1), desc.strides, desc.dilations,
                                desc.start_padding, desc.end_padding)
    got = run_desc(device, desc, x, w, b, compiled=op)
    np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)


def test_forcing_an_unknown_candidate_is_a_validation_error(device):
    with pytest.raises(vkml.ValidationError):
        compile_on_path(device, SHAPES[0][0], "fastest")


def test_keeps_the_fastest_and_a_second_tuner_reuses_it(device, tmp_path, monkeypatch):
    """Fake times (the timer mocked): the tuner keeps the candidate it measured fastest;
    a second Tuner on the same folder reuses the stored choice without timing."""
    desc = SHAPES[1][0]
    fake = {}

    def run(dev, seq, cand, shape):
        free = conv_choice._run(dev, seq, cand, shape)
        fake[id(seq)] = {"gemm": 3e-3, "gemm-g256": 1e-3}.get(cand.name, 2e-3)
        return free
    path = tuning.tunable_path("convolution-test", list(conv_ops.CANDIDATES), "direct",
                               conv_ops.shape_class, run)
    monkeypatch.setattr(tuning, "_run_once", lambda seq: fake[id(seq)])
    c = tuning.Tuner("full", folder=tmp_path, rounds=1).choose(device, path, desc)
    assert c.source == "measured" and c.name == "gemm-g256"
    assert c.times["gemm-g256"] == min(c.times.values())
    assert "winograd" in tuning.Tuner(folder=tmp_path).lookup(c.key)["declined"]
    monkeypatch.setattr(tuning, "_run_once", None)          # would fail if it timed
    again = tuning.Tuner("full", folder=tmp_path).choose(device, path, desc)
    assert again.source == "stored" and again.name == "gemm-g256"


def test_close_times_tie_to_the_listed_first_or_the_previous_choice(device, tmp_path,
                                                                    monkeypatch):
    """Fake times within the convolution path's tie margin: the close pair is timed
    again (CLOSE_ROUNDS more rounds each), the choice is the one listed first, not the
    faster by noise; re-measured, the entry's previous choice keeps the tie; a margin of
    1 keeps the fastest; beyond the margin the fastest wins."""
    desc = SHAPES[1][0]
    fake, runs = {}, {}

    def run(dev, seq, cand, shape):         # (nothing recorded: the timer is fake)
        fake[id(seq)] = (cand.name, times.get(cand.name, 5e-3))

    def timer(seq):
        name, t = fake[id(seq)]
        runs[name] = runs.get(name, 0) + 1
        return t
    monkeypatch.setattr(tuning, "_run_once", timer)
    names = ["gemm", "gemm-g256", "direct"]          # (listed in this order)
    tied = tuning.tunable_path("convolution-tie", names, "direct", conv_ops.shape_class, run,
                               tie_margin=conv_choice.TIE_MARGIN)
    plain = tuning.tunable_path("convolution-tie", names, "direct", conv_ops.shape_class, run)
    times = {"gemm": 1.05e-3, "gemm-g256": 1.0e-3}
    c = tuning.Tuner("full", folder=tmp_path, rounds=1).choose(device, tied, desc)
    assert c.name == "gemm" and c.times["gemm-g256"] < c.times["gemm"]
    # one round (the timed warm-up its first run), then CLOSE_ROUNDS for the close
    # pair only, RUNS_PER_ROUND runs each
    per = tuning.RUNS_PER_ROUND
    assert runs["gemm"] == runs["gemm-g256"] == per * (1 + tuning.CLOSE_ROUNDS)
    assert runs["direct"] == per
    assert tuning.Tuner("full", folder=tmp_path / "p", rounds=1).choose(
        device, plain, desc).name == "gemm-g256"
    # re-measured with the order of speed reversed: the stored choice stays
    times = {"gemm": 1.0e-3, "gemm-g256": 1.05e-3}
    kept = tuning.Tuner("full", folder=tmp_path / "p", rounds=1).choose(
        device, tied, desc, refresh=True)
    assert kept.source == "measured" and kept.name == "gemm-g256"
    # a clear difference is no tie
    times = {"gemm": 1.5e-3, "gemm-g256": 1.0e-3}
    assert tuning.Tuner("full", folder=tmp_path / "c", rounds=1).choose(
        device, tied, desc).name == "gemm-g256"
    with pytest.raises(vkml.ValidationError) as err:
        tuning.tunable_path("convolution-tie", ["gemm"], "gemm", conv_ops.shape_class, run,
                            tie_margin=0.5)
    assert err.value.field == "tie_margin"


def test_fast_list_is_the_default_and_its_cheap_variants(device, tmp_path):
    desc, with_sg, without = SHAPES[1]
    first = with_sg if _has_sg(device) else without
    c = tuning.Tuner("fast", folder=tmp_path, rounds=1).choose(device, conv_ops.TUNABLE, desc)
    # (gemm_sg's other accumulation order, a pipeline of its own, times only 3x3s)
    assert set(c.times) == {first, first + "-g256"}
    assert tuning.Tuner("fast", folder=tmp_path).choose(
        device, conv_ops.TUNABLE, desc).source == "stored"


def test_step_order_is_timed_on_3x3_blocks_of_12_pixels_only(device, monkeypatch):
    """gemm_sg-step (a pipeline of its own) joins gemm_sg's fast list for a unit-stride
    3x3 whose default block holds STEP_NB pixels, the geometry where it was measured
    ahead, and for no other (a 1x1, a stride of 2, another block)."""
    if not _has_sg(device):
        pytest.skip("no gemm_sg on this device")
    heuristic = conv_choice.heuristic          # gemm_sg first, as for a 3x3 it may not be
    monkeypatch.setattr(conv_choice, "heuristic", lambda op, geo: sorted(
        heuristic(op, geo), key=lambda n: n != "gemm_sg"))
    monkeypatch.setenv("VKML_TUNE", "off")     # (no ranking: the family rules stay out)
    seen = set()
    cases = [((1, 64, 56, 56), (64, 64, 3, 3), 1), ((1, 64, 48, 48), (64, 64, 3, 3), 1),
             ((1, 32, 28, 28), (32, 32, 3, 3), 1), ((1, 16, 22, 22), (16, 16, 3, 3), 1),
             ((1, 64, 56, 56), (64, 64, 3, 3), 2), ((1, 64, 56, 56), (64, 64, 1, 1), 1)]
    for x, w, stride in cases:
        desc = conv_choice.desc_of_shape(conv_choice.shape_from_workload({
            "op": "convolution", "input": list(x), "filter": list(w), "strides": [stride] * 2,
            "start_padding": [w[2] // 2] * 2, "end_padding": [w[2] // 2] * 2}))
        probe = conv_choice._Probe(device, desc)
        if not conv_ops.GemmSgPath.accepts(probe, probe.geo):
            continue                        # (SwiftShader: texel views too small)
        nb = conv_ops.GemmSgPath.default_nb(probe, probe.geo)
        wanted = w[2] == 3 and stride == 1 and nb == conv_choice.STEP_NB
        got = conv_choice._fast(desc, device)
        assert got[0] == "gemm_sg" and ("gemm_sg-step" in got) == wanted, (x, w, stride, nb)
        seen.add(wanted)
    assert seen == {True, False} or conv_ops.subgroup_shuffle_size(probe) != 8


def test_owned_filter_is_timed_bound_once_on_every_path(device, tmp_path):
    """An OWNED_BY_DML filter (graphs, ONNX initializers): its own shape class, every
    accepting path but direct in the fast list, each timed with the filter bound by
    ``initialize`` (none declined for want of a filter at execution); the chosen path
    then runs correctly with the filter bound once."""
    from dataclasses import replace
    desc = SHAPES[2][0]
    owned = replace(desc, filter_tensor=replace(desc.filter_tensor,
                                                flags=dml.TensorFlags.OWNED_BY_DML))
    assert conv_ops.shape_class(owned) == conv_ops.shape_class(desc) + "-owned1"
    c = tuning.Tuner("fast", folder=tmp_path, rounds=1).choose(device, conv_ops.TUNABLE, owned)
    probe = conv_choice._Probe(device, owned)
    paths = [n for n in conv_ops.heuristic(probe, probe.geo)
             if n != "direct" and n not in conv_choice.TUNER_ONLY]
    assert len(paths) >= 2 and set(paths) <= set(c.times), (paths, c.times)
    assert not tuning.Tuner(folder=tmp_path).lookup(c.key).get("declined")
    rng = np.random.default_rng(3)
    x = rng.standard_normal(desc.input_tensor.sizes).astype(np.float32)
    w = rng.standard_normal(desc.filter_tensor.sizes).astype(np.float32)
    b = rng.standard_normal(desc.bias_tensor.sizes).astype(np.float32)
    op = compile_on_path(device, owned, c.name)
    try:
        op.initialize(filter=w)
        y = device.empty(desc.output_tensor.sizes, np.float32)
        op.execute([device.tensor(x), None, device.tensor(b)], [y])
        ref = convolution_reference(x, w, b.reshape(-1), [1, 1], [1, 1], [1, 1], [1, 1],
                                    [0, 0], 1, "cross_correlation", "forward")
        np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)
    finally:
        op.release()


def test_candidates_are_timed_with_the_fused_activation(device, tmp_path, monkeypatch):
    """The tuning shape names the fused activation (its class leaves it out), so the
    candidates run the kernels the operator will (``ACT`` is frozen into them): building
    the tuned operator afterwards compiles no pipeline of its own."""
    from dataclasses import replace
    desc = replace(SHAPES[2][0], fused_activation="relu")
    shape = conv_ops.tuning_shape(desc)
    assert shape["activation"] == "relu" and "activation" not in conv_ops.tuning_shape(
        SHAPES[2][0])
    assert conv_ops.shape_class(shape) == conv_ops.shape_class(SHAPES[2][0])
    assert conv_ops.desc_of_shape(shape).fused_activation == desc.fused_activation
    t = tuning.Tuner("fast", folder=tmp_path, rounds=1)
    monkeypatch.setattr(tuning, "default_tuner", lambda: t)
    c = t.choose(device, conv_ops.TUNABLE, shape)
    assert c.source == "measured"
    made = device.context.pipelines.created
    op = device.compile_operator(device.create_operator(desc))
    try:
        assert op.path.candidate == c.name
        assert device.context.pipelines.created == made
    finally:
        op.release()


def test_json_shapes_and_ahead_of_time(device, tmp_path):
    """Convolution shapes are JSON (stored with the choice): a bench workload becomes one,
    it round-trips to the descriptor, shares its class, and ``vkml.tune`` tunes it ahead
    of time so that a later operator of that class reuses the stored choice."""
    import json
    w = {"name": "t", "op": "convolution", "input": [1, 16, 22, 22], "filter": [16, 16, 3, 3],
         "start_padding": [1, 1], "end_padding": [1, 1]}
    shape = conv_ops.shape_from_workload(w)
    assert json.loads(json.dumps(shape)) == shape
    assert conv_ops.shape_from_workload({"op": "padding"}) is None
    desc = conv_ops.desc_of_shape(shape)
    assert conv_ops.tuning_shape(desc) == shape
    assert conv_ops.shape_class(shape) == conv_ops.shape_class(SHAPES[2][0])
    from dataclasses import replace      # enums given by name, as the functional form does
    named = replace(SHAPES[2][0], mode="cross_correlation", direction="forward")
    assert conv_ops.tuning_shape(named) == conv_ops.tuning_shape(SHAPES[2][0])
    back = conv_ops.shape_from_workload({"op": "convolution", "direction": "backward",
                                         "input": [1, 8, 5, 5], "filter": [8, 4, 4, 4],
                                         "strides": [2, 2]})
    assert conv_ops.desc_of_shape(back).output_tensor.sizes == (1, 4, 12, 12)
    t = tuning.Tuner("fast", folder=tmp_path, rounds=1)
    [c] = vkml.tune([("convolution", shape)], device, mode="fast", tuner=t)
    assert c.source == "measured"
    assert ("convolution", shape) in t.stored(device)
    again = tuning.Tuner("fast", folder=tmp_path).choose(device, conv_ops.TUNABLE,
                                                          conv_ops.tuning_shape(SHAPES[2][0]))
    assert again.source == "stored" and again.name == c.name


class _Ranked:
    """A stand-in for the process's tuner whose family ranking is given."""

    def __init__(self, times, dropped=()):
        self.times, self.dropped = times, list(dropped)

    def effective_mode(self, mode=None):
        return "fast"

    def choose(self, device, path, shape, **kw):
        assert path is conv_choice.FAMILY and shape == conv_choice.FAMILY_SHAPE
        return type("C", (), {"times": self.times, "key": "reference"})()

    def lookup(self, key):
        assert key == "reference"
        return {"times": self.times, "dropped": self.dropped, "once": self.dropped}


def test_fast_lists_follow_the_device_ranking(device, monkeypatch):
    """The tuner-only families join a fast list where the device's own ranking of the
    reference convolution puts them within STRONG_FACTOR of its fastest family (and they
    accept the shape); with tuning off, or ranked slow, they do not."""
    times = {"gemm_sg": 4e-3, "gemm": 4e-3, "winograd": 3e-3, "winograd-blocked": 1.2e-3,
             "tiled": 9e-3, "blocked": 1e-3}
    monkeypatch.setattr(tuning, "default_tuner", lambda: _Ranked(times))
    assert conv_choice.strong_families(device) == ("blocked", "winograd-blocked")
    one_by_one, three_by_three = SHAPES[1][0], SHAPES[2][0]
    fast = conv_choice._fast(one_by_one, device)
    assert "blocked" in fast and "winograd-blocked" not in fast and "tiled" not in fast
    assert {"blocked", "winograd-blocked"} <= set(conv_choice._fast(three_by_three, device))
    depthwise = SHAPES[0][0]
    assert "blocked-1x8" in conv_choice._fast(depthwise, device)    # one channel a group
    monkeypatch.setattr(tuning, "default_tuner", lambda: _Ranked({**times, "blocked": 8e-3,
                                                                   "winograd-blocked": 8e-3}))
    assert conv_choice.strong_families(device) == ()
    assert not set(conv_choice._fast(three_by_three, device)) & set(conv_choice.TUNER_ONLY)


def test_fast_lists_add_families_ahead_of_the_heuristic_choice(device, monkeypatch):
    """A tuner-only family beyond STRONG_FACTOR of the fastest family still joins the
    fast list of a shape it takes where the reference ranks it ahead of the heuristic's
    choice for that shape by STRONG_FACTOR (a loaded CPU driver's ranking: blocked far
    behind winograd-blocked, far ahead of gemm); one less clearly ahead (tiled) does
    not, nor one behind, and a family that does not take the shape never does."""
    strided = conv_choice.shape_from_workload({
        "op": "convolution", "input": [1, 16, 18, 18], "filter": [24, 16, 3, 3],
        "strides": [2, 2], "start_padding": [1, 1], "end_padding": [1, 1]})
    probe = conv_choice._Probe(device, conv_choice.desc_of_shape(strided))
    first = conv_choice.heuristic(probe, probe.geo)[0]
    assert first in ("gemm", "gemm_sg")         # Winograd does not take a stride of 2
    loaded = {"gemm_sg": 0.30, "gemm": 0.30, "winograd": 0.07, "winograd-blocked": 0.009,
              "tiled": 0.25, "blocked": 0.05}
    # (gemm's one-run times: trusted, 6x behind blocked would leave it out, _far_behind)
    monkeypatch.setattr(tuning, "default_tuner",
                        lambda: _Ranked(loaded, ("gemm", "gemm_sg", "tiled")))
    assert conv_choice.strong_families(device) == ("winograd-blocked",)
    got = conv_choice._fast(strided, device)
    assert got[0] == first and "blocked" in got and "tiled" not in got
    assert "winograd-blocked" not in got        # strong, but takes no stride of 2
    assert conv_choice._strong(loaded, first) == ("blocked", "winograd-blocked")
    assert "tiled" in conv_choice._strong({**loaded, "tiled": 0.15}, first)
    slow = {**loaded, "blocked": 0.31, "tiled": 0.9}          # behind gemm and gemm_sg
    monkeypatch.setattr(tuning, "default_tuner", lambda: _Ranked(slow, ("gemm", "gemm_sg")))
    got = conv_choice._fast(strided, device)
    assert not {"blocked", "tiled"} & set(got)
    assert conv_choice._strong(slow, first) == ("winograd-blocked",)
    assert conv_choice._strong(loaded) == ("winograd-blocked",)     # no first: the ranking


def test_fast_list_leaves_out_a_heuristic_choice_its_strong_variant_outranks(device,
                                                                             monkeypatch):
    """Winograd (the heuristic's choice for a 3x3) leaves the fast list where the device
    ranks it beyond STRONG_FACTOR of the fastest family and winograd-blocked (the same
    transforms, another GEMM) strong; it stays where either does not hold."""
    three_by_three = SHAPES[2][0]
    heuristic = conv_choice.heuristic          # winograd first (on a device with
    monkeypatch.setattr(conv_choice, "heuristic", lambda op, geo: sorted(   # subgroups the
        heuristic(op, geo), key=lambda n: n != "winograd"))                # shape is gemm_sg's)
    probe = conv_choice._Probe(device, conv_choice.desc_of_shape(three_by_three))
    assert conv_choice.heuristic(probe, probe.geo)[0] == "winograd"
    base = {"gemm_sg": 4e-3, "gemm": 4e-3, "tiled": 9e-3, "blocked": 1e-3}

    def fast(**times):
        monkeypatch.setattr(tuning, "default_tuner", lambda: _Ranked({**base, **times}))
        return conv_choice._fast(three_by_three, device)
    got = fast(winograd=3e-3, **{"winograd-blocked": 1.2e-3})
    assert "winograd" not in got and {"winograd-blocked", "blocked"} <= set(got)
    got = fast(winograd=1.4e-3, **{"winograd-blocked": 1.2e-3})     # winograd strong
    assert {"winograd", "winograd-blocked"} <= set(got)
    got = fast(winograd=3e-3, **{"winograd-blocked": 4e-3})         # its variant is not
    assert "winograd" in got and "winograd-blocked" not in got
    got = fast(winograd=3e-3, **{"winograd-blocked": 1.8e-3})   # ...but beats winograd
    assert {"winograd", "winograd-blocked"} <= set(got)


def test_owned_filter_fast_list_leaves_out_families_ranked_behind(device, monkeypatch):
    """An OWNED_BY_DML filter's extra paths leave its fast list where the device's ranking
    puts their family beyond STRONG_FACTOR of the fastest family taking the shape (the
    fastest one overall need not take it: Winograd and a 1x1); a family timed by
    one run only (dropped by the ranking's own cuts) and the heuristic's choice stay."""
    from dataclasses import replace
    owned = lambda d: replace(d, filter_tensor=replace(               # noqa: E731
        d.filter_tensor, flags=dml.TensorFlags.OWNED_BY_DML))
    three, one = owned(SHAPES[2][0]), owned(SHAPES[1][0])
    base = {"tiled": 9e-3, "blocked": 9e-3, "winograd-blocked": 9e-3}

    def fast(desc, dropped=(), **times):
        monkeypatch.setattr(tuning, "default_tuner",
                            lambda: _Ranked({**base, **times}, dropped))
        probe = conv_choice._Probe(device, desc)
        return conv_choice.heuristic(probe, probe.geo), conv_choice._fast(desc, device)
    order, got = fast(three, gemm_sg=1e-3, gemm=1e-3, winograd=1e-3)
    every = [n for n in order[1:] if n != "direct" and n not in conv_choice.TUNER_ONLY]
    assert len(every) >= 2 and set(every) <= set(got)           # none behind: all timed
    order, got = fast(three, gemm_sg=1e-3, gemm=2e-3, winograd=0.9e-3)
    assert got[0] == order[0] and "gemm" in every
    assert ("gemm" in got) == (order[0] == "gemm")          # behind: out unless first
    kept = {"gemm_sg", "winograd"} & set(every)
    assert kept <= set(got)
    _, got = fast(three, ("gemm",), gemm_sg=1e-3, gemm=2e-3, winograd=0.9e-3)
    assert "gemm" in got                                    # one run: decides nothing
    order, got = fast(one, gemm_sg=1e-3, gemm=1.4e-3, winograd=0.2e-3)
    assert "winograd" not in order and set(order[:2]) == {"gemm", "gemm_sg"}
    assert {"gemm", "gemm_sg"} <= set(got)          # within 1.5x of the fastest taking it
    _, got = fast(one, gemm_sg=1e-3, gemm=1.6e-3, winograd=0.2e-3)
    assert got[0] == order[0] and ("gemm" in got) == (order[0] == "gemm")


def test_fast_list_leaves_out_families_far_behind_a_listed_one(device, monkeypatch):
    """Any listed candidate, the heuristic's choice and its knob variants included,
    leaves a fast list where the device's ranking (times of more than one run) puts its
    family beyond FAR_FACTOR of another listed candidate's family (SwiftShader's gemm
    against blocked); within it, or ranked by one run only, it stays."""
    strided = conv_choice.shape_from_workload({
        "op": "convolution", "input": [1, 16, 18, 18], "filter": [24, 16, 3, 3],
        "strides": [2, 2], "start_padding": [1, 1], "end_padding": [1, 1]})
    probe = conv_choice._Probe(device, conv_choice.desc_of_shape(strided))
    first = conv_choice.heuristic(probe, probe.geo)[0]
    sws = {"gemm_sg": 0.11, "gemm": 0.13, "winograd": 0.015, "winograd-blocked": 0.006,
           "tiled": 0.042, "blocked": 0.005}

    def fast(times, once=()):
        monkeypatch.setattr(tuning, "default_tuner", lambda: _Ranked(times, once))
        return conv_choice._fast(strided, device)
    got = fast(sws)
    assert got and not {n for n in got if conv_choice.CANDIDATES[n][0] == first}, got
    assert got[0].startswith("blocked")
    got = fast(sws, ("gemm", "gemm_sg"))                # one run: decides nothing
    assert got[0] == first and any(n.startswith("blocked") for n in got)
    near = {**sws, "gemm": 0.019, "gemm_sg": 0.019}     # 3.8x: within FAR_FACTOR
    got = fast(near)
    assert got[0] == first and any(n.startswith("blocked") for n in got)
    assert conv_choice._far_behind(("gemm", "gemm-g256", "depthwise", "blocked-4x4"),
                                   sws) == ("depthwise", "blocked-4x4")   # (unranked stays)
    assert conv_choice._far_behind(("gemm", "gemm-g256"), sws) == ("gemm", "gemm-g256")
    assert conv_choice._far_behind(("gemm", "blocked"), {}) == ("gemm", "blocked")


def test_device_ranking_is_measured_once(device, tmp_path, monkeypatch):
    """The ranking is a tuner choice like any other (tunable path convolution_family):
    measured on the first call, stored, then read back without timing."""
    t = tuning.Tuner("fast", folder=tmp_path, rounds=1)
    monkeypatch.setattr(tuning, "default_tuner", lambda: t)
    strong = conv_choice.strong_families(device)
    assert set(strong) <= set(conv_choice.TUNER_ONLY)
    c = t.choose(device, conv_choice.FAMILY, conv_choice.FAMILY_SHAPE)
    assert c.source == "stored" and {"gemm", "blocked"} <= set(c.times)
    monkeypatch.setattr(tuning, "_run_once", None)          # would fail if it timed again
    assert conv_choice.strong_families(device) == strong


def test_sampled_executions_recheck_the_choice(device, tmp_path, monkeypatch):
    """A convolution whose path the tuner chose reports its sampled executions' times
    (ops/base.py, OBSERVE_EVERY): against the stored time for the shape that was timed,
    scaled by FLOPs for another shape of its class; a stored choice whose times are far
    off (here 100x too short, as if timed on another machine) is marked stale by them and
    measured again at the next compile."""
    from vkml.ops import base
    t = tuning.Tuner("fast", folder=tmp_path, rounds=1, stale_observations=4)
    monkeypatch.setattr(tuning, "default_tuner", lambda: t)
    desc = SHAPES[2][0]
    op = conv_ops.CompiledConvolution(device, desc)
    key, name, expected, factor = op.observed
    entry = t.lookup(key)
    assert name == entry["choice"] == op.path.candidate and factor is None
    assert expected == pytest.approx(entry["seconds"])
    op.release()
    other = _desc((1, 16, 20, 22), (16, 16, 3, 3), pad=1)      # same class, fewer outputs
    c = t.choose(device, conv_ops.TUNABLE, conv_ops.tuning_shape(other))
    assert c.source == "stored" and t.expected(c, conv_ops.tuning_shape(other)) == (
        pytest.approx(entry["seconds"] * 20 / 22))

    t._store(key, lambda old: {**old, "seconds": old["seconds"] / 100,
                               "times": {k: v / 100 for k, v in old["times"].items()}})
    monkeypatch.setattr(base, "OBSERVE_EVERY", 1)
    op = conv_ops.CompiledConvolution(device, desc)
    assert op.observed[2] == pytest.approx(entry["seconds"] / 100)
    rng = np.random.default_rng(0)
    x, w, b = (device.tensor(rng.standard_normal(d.sizes).astype(np.float32))
               for d in desc.inputs())
    y = device.empty(desc.output_tensor.sizes)
    for _ in range(t.stale_observations):
        op.execute([x, w, b], [y])
    op.release()
    ref = convolution_reference(
        x.numpy(), w.numpy(), b.numpy().reshape(-1), [1, 1], [1, 1], [1, 1], [1, 1], [0, 0],
        1, "cross_correlation", "forward")
    # relative to the output's magnitude: the tuner may choose Winograd, whose float32
    # transforms round differently from the direct sum
    np.testing.assert_allclose(y.numpy(), ref, rtol=0, atol=1e-4 * np.abs(ref).max())
    assert t.lookup(key)["stale"]
    again = t.choose(device, conv_ops.TUNABLE, conv_ops.tuning_shape(desc))
    assert again.source == "measured" and not t.lookup(key)["stale"]


@pytest.mark.parametrize("side, nb", [(7, 7), (13, 11), (27, 14), (14, 16), (28, 16),
                                      (56, 16), (112, 16)])
def test_gemm_sg_flat_plane_blocks(side, nb):
    """gemm_sg's pixel block on a 1x1 convolution's flattened side x side plane: 16 pixels
    (float4 rows, two u64vec4 stores a channel: SG_ACC_FLAT's 16 x 16 block) where the
    plane is whole float4s, 14x14's included (not 13 pixels in 16 lanes: its element
    loads and stores cost more than 3 more pixels a lane); where it is not (49, 169, 729
    pixels: element loads and stores whatever the block) at most SG_ACC accumulators,
    the block padding the fewest pixels (7, 11, 14)."""
    gemm = importlib.import_module("vkml.ops.convolution.gemm")
    plane = side * side
    axes = [[gemm.Axis(0, 1, 1, 1, [(0, 0)]), gemm.Axis(0, 1, 1, 1, [(0, 0)]),
             gemm.Axis(0, 1, plane, 1, [(0, 0)])]]
    assert gemm.sg_blocks(96, axes, [plane], True, 8) == (16, nb)


@pytest.mark.parametrize("side, nb", [(7, 8), (13, 12), (27, 12), (14, 16)])
def test_gemm_sg_skewed_plane_blocks(side, nb):
    """With XSKEW (``skew``: rows read as float4 texels on a plane of no whole ones) the
    block is a multiple of 4 pixels there (7x7: 8, its 7 blocks one subgroup; 13x13 and
    27x27: 12), at most SG_ACC accumulators; a plane of whole float4s is unchanged."""
    gemm = importlib.import_module("vkml.ops.convolution.gemm")
    plane = side * side
    axes = [[gemm.Axis(0, 1, 1, 1, [(0, 0)]), gemm.Axis(0, 1, 1, 1, [(0, 0)]),
             gemm.Axis(0, 1, plane, 1, [(0, 0)])]]
    assert gemm.sg_blocks(96, axes, [plane], True, 8, skew=True) == (16, nb)

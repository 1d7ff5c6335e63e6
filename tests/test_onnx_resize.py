"""vkml.onnx: Resize (opsets 10, 11, 13, 18, 19) and Upsample (7, 9) on the device as
DML_RESAMPLE1, against ONNX Runtime on the CPU.

Every coordinate_transformation_mode RESAMPLE1 expresses, with nearest (each
nearest_mode) and linear, from ``scales`` and from ``sizes``; ``axes`` and
keep_aspect_ratio_policy; opset 10's and Upsample's asymmetric mapping (ONNX Runtime's
nearest: floor scaling up, ceil scaling down); 1-D, 3-D and 5-D inputs (copied
dimensions merged); a resize to the same size (an alias); float32, float16 and, nearest,
int8/uint8.  Many Resize nodes share one model, so one graph runs them all.  Nearest
results are input elements: compared exactly.  ONNX's own node cases.  Every
HOST_RESIZE reason: placed on the host (or falling back there at run) and refused by
``strict=True``.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402
from onnx_helpers import make_model, node_cases, ort_expected, value_info  # noqa: E402

CTMS = ["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners",
        "tf_half_pixel_for_nn", "half_pixel_symmetric"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
_MODES = [("nearest", m) for m in NEAREST_MODES] + [("linear", None)]


def _inputs(name, opset, scales=None, sizes=None):
    """A Resize node's inputs and initializers for ``scales`` or ``sizes`` at ``opset``
    (10: X, scales; 11: roi and scales always present, empty where unused; 13 on: absent
    inputs named '')."""
    inits, ins = [], ["x"]
    sc = None if scales is None else numpy_helper.from_array(
        np.asarray(scales, np.float32), f"{name}_scales")
    sz = None if sizes is None else numpy_helper.from_array(
        np.asarray(sizes, np.int64), f"{name}_sizes")
    if opset < 11:
        return ins + [sc.name], [sc]
    if opset < 13:
        roi = numpy_helper.from_array(np.zeros(0, np.float32), f"{name}_roi")
        if sc is None:
            sc = numpy_helper.from_array(np.zeros(0, np.float32), f"{name}_scales")
        inits = [roi, sc] + ([sz] if sz is not None else [])
        return ins + [roi.name, sc.name] + ([sz.name] if sz is not None else []), inits
    if sc is not None:
        return ins + ["", sc.name], [sc]
    return ins + ["", "", sz.name], [sz]


def _out(name, shape, dtype=np.float32):
    """An output of ``shape``'s rank, its sizes symbolic."""
    return value_info(name, [f"{name}_{i}" for i in range(len(shape))], dtype)


def _model(shape, dtype, opset, specs, op="Resize"):
    """One model of a Resize node per spec ``(attrs, scales, sizes)``, each reading x."""
    nodes, inits, outs = [], [], []
    for i, (attrs, scales, sizes) in enumerate(specs):
        ins, its = _inputs(f"r{i}", opset, scales, sizes)
        nodes.append(helper.make_node(op, ins, [f"y{i}"], name=f"r{i}", **attrs))
        inits += its
        outs.append(_out(f"y{i}", shape, dtype))
    return make_model(nodes, [value_info("x", shape, dtype)], outs, inits, opset=opset)


def _data(rng, shape, dtype):
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max + 1, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _run_and_check(model, x, device, specs):
    """vkml (strict: every node on the device) against ONNX Runtime, output by output:
    nearest exactly, linear within float32/float16 rounding."""
    rep = vonnx.prepare(model, device=device, strict=True)
    got = rep.run({"x": x})
    want = ort_expected(model, {"x": x})
    assert not rep.fallbacks, rep.fallbacks
    assert {w for w, _ in rep.partitions} == {"device"}, rep.partitions
    tol = 1e-5 if x.dtype == np.float32 else 4e-3
    for (attrs, _, _), g, w in zip(specs, got, want):
        msg = f"{attrs}"
        assert g.shape == w.shape and g.dtype == w.dtype, (msg, g.shape, w.shape)
        if attrs.get("mode", "nearest") == "nearest":
            np.testing.assert_array_equal(g, w, err_msg=msg)
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                       rtol=tol, atol=tol, err_msg=msg)
    return rep


def _mode_attrs(ctm, mode, nearest_mode):
    a = {"mode": mode, "coordinate_transformation_mode": ctm}
    if nearest_mode:
        a["nearest_mode"] = nearest_mode
    return a


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("target", ["scales", "sizes"])
def test_resize_modes(target, dtype, device):
    """Every (coordinate mode, mode, nearest_mode) on a 4-D input scaled down along one
    axis and up along the other: scales (1, 1, 0.5, 1.5) or sizes (2, 3, 22, 4) (10 -> 22
    puts exact ties where float32 coordinates fall a hair short of them)."""
    shape = (2, 3, 10, 6)
    scales, sizes = ((1, 1, 0.5, 1.5), None) if target == "scales" else (None, (2, 3, 22, 4))
    specs = [(_mode_attrs(ctm, m, nm), scales, sizes) for ctm in CTMS for m, nm in _MODES]
    x = _data(np.random.default_rng(len(target)), shape, dtype)
    _run_and_check(_model(shape, dtype, 19, specs), x, device, specs)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=lambda d: np.dtype(d).name)
def test_resize_nearest_8bit(dtype, device):
    shape = (1, 2, 5, 3)
    specs = [(_mode_attrs(ctm, "nearest", nm), None, (1, 2, 3, 7))
             for ctm in ("half_pixel", "asymmetric") for nm in NEAREST_MODES]
    x = _data(np.random.default_rng(8), shape, dtype)
    _run_and_check(_model(shape, dtype, 19, specs), x, device, specs)


def test_resize_axes_policy_ranks(device):
    """axes, keep_aspect_ratio_policy, antialias scaling up (no filter to widen), 1-D,
    3-D and 5-D inputs, a resize to the same sizes (an alias)."""
    rng = np.random.default_rng(5)
    lin = {"mode": "linear"}
    cases = [
        ((2, 3, 4, 6), [({"axes": [3, 2]}, (1.5, 0.5), None),
                        ({"axes": [2], **lin}, None, (7,)),
                        ({"axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}, None,
                         (8, 8)),
                        ({"axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller", **lin},
                         None, (6, 4)),
                        ({"antialias": 1, **lin}, (1, 1, 2, 1.5), None),
                        ({}, None, (2, 3, 4, 6))]),
        ((7,), [({}, None, (12,)), ({"nearest_mode": "ceil"}, (0.5,), None)]),
        ((2, 5, 7), [(lin, None, (2, 5, 12)), ({"nearest_mode": "floor"}, None, (1, 9, 4))]),
        ((2, 3, 3, 4, 5), [(lin, None, (2, 3, 5, 6, 3)), ({}, None, (2, 3, 2, 8, 5))]),
    ]
    for shape, specs in cases:
        x = _data(rng, shape, np.float32)
        _run_and_check(_model(shape, np.float32, 18, specs), x, device, specs)


@pytest.mark.parametrize("opset", [10, 11, 13])
def test_resize_older_opsets(opset, device):
    """Opset 10 (asymmetric; ONNX Runtime's nearest floors scaling up and ceils scaling
    down), 11 (roi and scales present even when empty, tf_half_pixel_for_nn), 13."""
    shape = (1, 2, 8, 6)
    if opset == 10:
        specs = [({"mode": m}, s, None) for m in ("nearest", "linear")
                 for s in ((1, 1, 0.75, 2), (1, 1, 1.5, 0.5))]
    else:
        specs = [(_mode_attrs(ctm, m, nm), s, z)
                 for ctm in ("half_pixel", "tf_half_pixel_for_nn", "align_corners")
                 for m, nm in (("nearest", "round_prefer_floor"), ("linear", None))
                 for s, z in (((1, 1, 0.5, 1.5), None), (None, (1, 2, 5, 9)))]
    x = _data(np.random.default_rng(opset), shape, np.float32)
    _run_and_check(_model(shape, np.float32, opset, specs), x, device, specs)


@pytest.mark.parametrize("opset", [7, 9])
def test_upsample(opset, device):
    shape = (1, 2, 3, 4)
    rng = np.random.default_rng(opset)
    for mode in ("nearest", "linear"):
        scales = [1.0, 1.0, 2.0, 1.5]
        if opset == 7:
            node = helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=scales)
            inits = []
        else:
            node = helper.make_node("Upsample", ["x", "s"], ["y"], mode=mode)
            inits = [numpy_helper.from_array(np.asarray(scales, np.float32), "s")]
        model = make_model([node], [value_info("x", shape)], [_out("y", shape)], inits,
                           opset=opset)
        _run_and_check(model, _data(rng, shape, np.float32), device, [({"mode": mode}, None, None)])


#: HOST_RESIZE reason -> (node attributes, input shape, scales, sizes, dtype, at prepare)
HOST_CASES = {
    "cubic": ({"mode": "cubic"}, (1, 1, 4, 4), (1, 1, 2, 2), None, np.float32, True),
    "crop": ({"coordinate_transformation_mode": "tf_crop_and_resize", "mode": "linear"},
             (1, 1, 4, 4), None, (1, 1, 3, 3), np.float32, True),
    "exclude_outside": ({"mode": "linear", "exclude_outside": 1}, (1, 1, 4, 4),
                        (1, 1, 2, 2), None, np.float32, True),
    "int_linear": ({"mode": "linear"}, (1, 1, 4, 4), (1, 1, 2, 2), None, np.uint8, True),
    "antialias": ({"mode": "linear", "antialias": 1}, (1, 1, 4, 8), (1, 1, 0.5, 0.5), None,
                  np.float32, False),
    "rank": ({}, (2, 2, 2, 2, 2), (2, 2, 2, 2, 2), None, np.float32, False),
    "empty": ({}, (1, 1, 2, 2), (1, 1, 0.4, 1), None, np.float32, False),
    "fractional": ({"coordinate_transformation_mode": "align_corners", "mode": "linear"},
                   (1, 1, 2, 4), (1, 1, 1, 0.6), None, np.float32, False),
    "nearest_ties": ({"nearest_mode": "round_prefer_floor"}, (1, 1, 2, 6), (1, 1, 1, 0.7),
                     None, np.float32, False),
}


def test_host_cases_cover_every_reason():
    assert set(HOST_CASES) == set(vonnx.HOST_RESIZE)


@pytest.mark.parametrize("key", sorted(HOST_CASES))
def test_host_resize_cases(key, device):
    """The node runs on the host (placed there when its attributes decide, else falling
    back at run) with ONNX's reference evaluator's result; strict=True names it."""
    attrs, shape, scales, sizes, dtype, at_prepare = HOST_CASES[key]
    roi = [numpy_helper.from_array(np.array([0, 0, .1, .2, 1, 1, .8, .9], np.float32), "roi")]
    ins, inits = _inputs("r", 19, scales, sizes)
    if key == "crop":
        ins[1] = "roi"
    node = helper.make_node("Resize", ins, ["y"], name=f"resize_{key}", **attrs)
    model = make_model([node], [value_info("x", shape, dtype)], [_out("y", shape, dtype)],
                       inits + (roi if key == "crop" else []), opset=19)
    x = _data(np.random.default_rng(1), shape, dtype)
    reason = re.escape(vonnx.HOST_RESIZE[key][:40])
    rep = vonnx.prepare(model, device=device)
    (got,) = rep.run({"x": x})
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-6,
                               atol=1e-6)
    if at_prepare:
        assert rep.partitions[0][0] == "host" and not rep.fallbacks, rep.partitions
        with pytest.raises(vkml.UnsupportedError, match=f"resize_{key}.*{reason}"):
            vonnx.prepare(model, device=device, strict=True)
    else:
        assert rep.fallbacks and vonnx.HOST_RESIZE[key] in rep.fallbacks[0][1]
        strict = vonnx.prepare(model, device=device, strict=True)
        with pytest.raises(vkml.UnsupportedError, match=f"resize_{key}.*{reason}"):
            strict.run({"x": x})


NODE_CASES = node_cases(("resize", "upsample"),
                        lambda c: c.model.graph.node[0].op_type in ("Resize", "Upsample"))

#: ONNX's cases that stay on the host by design: case name -> the HOST_RESIZE reason.
HOST_BY_DESIGN = {
    **{n: "cubic" for n in NODE_CASES if "cubic" in n},
    **{n: "crop" for n in NODE_CASES if "crop_and_resize" in n},
    **{n: "antialias" for n in NODE_CASES if "linear_antialias" in n},
    "test_resize_downsample_scales_linear_align_corners": "fractional",
}


def test_node_cases_exist():
    assert len(NODE_CASES) >= 40 and set(HOST_BY_DESIGN) <= set(NODE_CASES)


@pytest.mark.parametrize("name", sorted(NODE_CASES))
def test_onnx_node_case(name, device):
    """ONNX's own cases, compared as onnx.backend.test compares them; on the device but
    for HOST_BY_DESIGN, whose reason the host placement or fallback gives."""
    case = NODE_CASES[name]
    rep = vonnx.prepare(case.model, device=device)
    for inputs, expected in case.data_sets:
        Runner.assert_similar_outputs(expected, rep.run(inputs), rtol=case.rtol,
                                      atol=case.atol)
    if name in HOST_BY_DESIGN:
        why = vonnx.HOST_RESIZE[HOST_BY_DESIGN[name]]
        if rep.partitions[0][0] == "host":          # placed there: strict names the reason
            with pytest.raises(vkml.UnsupportedError, match=re.escape(why[:40])):
                vonnx.prepare(case.model, device=device, strict=True)
        else:
            assert rep.fallbacks and why in rep.fallbacks[0][1], rep.partitions
    else:
        assert not rep.fallbacks, rep.fallbacks
        assert rep.partitions[0][0] == "device", rep.partitions


@pytest.mark.parametrize("scales, sizes, field", [
    ((1, 1, 2, 2), (1, 1, 4, 4), "scales/sizes"), ((1, 1, -2, 2), None, "scales"),
    ((2, 2), None, "scales/sizes")])
def test_bad_scales_raise_validation_error(scales, sizes, field, device):
    """Both scales and sizes, a negative scale, a count other than the rank:
    ValidationError naming the node and the input."""
    ins = ["x", "", "s" if scales else "", "z" if sizes else ""]
    inits = [numpy_helper.from_array(np.asarray(v, dt), n)
             for v, dt, n in ((scales, np.float32, "s"), (sizes, np.int64, "z")) if v]
    node = helper.make_node("Resize", ins, ["y"], name="rs")
    shape = (1, 1, 2, 2)
    model = make_model([node], [value_info("x", shape)], [_out("y", shape)], inits)
    with pytest.raises(vkml.ValidationError) as err:
        vonnx.prepare(model, device=device).run({"x": np.ones(shape, np.float32)})
    assert err.value.field == f"Resize 'rs': {field}", err.value


@pytest.mark.parametrize("target", ["scales", "sizes"])
def test_resize_2x_rows_kernel(target, device, monkeypatch):
    """Every (coordinate mode, mode, nearest_mode) doubling W of a 4-D float32 input with
    rows of whole quads (the rows kernel's geometry, vkml/ops/resample.py) and H by 3
    (scales) or by 2 (sizes): against ONNX Runtime, and the rows kernel taken by some
    nodes and declined by others (align_corners, nearest modes whose map is not o // 2)."""
    import importlib
    # vkml.ops.resample is also the functional form's name: the module by importlib
    cls = importlib.import_module("vkml.ops.resample").CompiledResample
    taken = []
    plan = cls._plan_rows

    def spy(self):
        taken.append(plan(self))
        return taken[-1]
    monkeypatch.setattr(cls, "_plan_rows", spy)
    shape = (2, 3, 5, 8)
    scales, sizes = ((1, 1, 3, 2), None) if target == "scales" else (None, (2, 3, 10, 16))
    specs = [(_mode_attrs(ctm, m, nm), scales, sizes) for ctm in CTMS for m, nm in _MODES]
    x = _data(np.random.default_rng(5 + len(target)), shape, np.float32)
    _run_and_check(_model(shape, np.float32, 19, specs), x, device, specs)
    assert True in taken and False in taken, taken

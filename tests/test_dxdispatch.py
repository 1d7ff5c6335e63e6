"""Malformed DxDispatch model files: mutations of the shipped models in bench/models/.

Each one must end in exactly one line naming the place in the file (a JSON path) and
exit status 2: no traceback, and no large allocation (the schema checks sizes against
the device before anything is allocated).
"""
from __future__ import annotations

import copy
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import dxdispatch

ROOT = Path(__file__).resolve().parent.parent
MODELS = sorted((ROOT / "bench" / "models").glob("*.json"))
LOADED = {p.stem: dxdispatch.loads(p.read_text()) for p in MODELS}

#: Values of every wrong kind a field can get.
BAD_VALUES = st.one_of(
    st.none(), st.booleans(), st.just(-1), st.just(-2), st.just(10 ** 12),
    st.just(1e12), st.just(2.5), st.just(float("inf")), st.just("abc"), st.just("FLOAT99"),
    st.just([]), st.just([1]), st.just(["pad"]), st.just([-2, 3]), st.just({}),
    st.just({"x": 1}), st.just([[1, 2]]), st.just(1 << 70))


def _paths(value, prefix=()):
    """Every (path, value) in a JSON document."""
    yield prefix, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


def _set(doc, path, value):
    for k in path[:-1]:
        doc = doc[k]
    doc[path[-1]] = value


def _delete(doc, path):
    for k in path[:-1]:
        doc = doc[k]
    del doc[path[-1]]


@st.composite
def mutated(draw):
    """A shipped model with one field replaced by a wrong value, one key deleted, or
    one size made huge or negative."""
    name = draw(st.sampled_from(sorted(k for k in LOADED if "timing" not in k)))
    model = copy.deepcopy(LOADED[name])
    paths = [p for p, _ in _paths(model) if p and p[-1] != "$schema"]
    path = draw(st.sampled_from(paths))
    how = draw(st.sampled_from(["replace", "delete", "huge"]))
    if how == "delete" and isinstance(path[-1], str):
        _delete(model, path)
    elif how == "huge":
        sizes = [p for p in paths if p[-1] in ("valueCount", "sizeInBytes")
                 or (len(p) > 1 and p[-2] == "Sizes")]
        _set(model, draw(st.sampled_from(sizes)),
             draw(st.sampled_from([10 ** 12, 1 << 40, -2, 0, 1e12, 3 * 10 ** 9])))
    else:
        _set(model, path, draw(BAD_VALUES))
    return name, model


def _run(model: dict, tmp_path: Path, device) -> tuple[int, str]:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(model))
    lines = []
    try:
        dxdispatch.run_model(path, device, dxdispatch.Timing(), lines.append)
    except dxdispatch.ModelError as exc:
        return 2, str(exc)
    return 0, "\n".join(lines)


def _assert_refused(name: str, change, place: str, tmp_path: Path, device) -> None:
    """The shipped model ``name`` with ``change(model)`` applied is refused (exit status 2)
    with a message that starts with the field ``place``."""
    model = copy.deepcopy(LOADED[name])
    change(model)
    rc, text = _run(model, tmp_path, device)
    assert rc == 2 and text.startswith(place + ": "), text


def _peak_rss_mb() -> float:
    """This process's peak memory since :func:`_reset_peak` (Linux: VmHWM), else its
    peak ever (which a large earlier test may already hold above anything a model does)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")               # the peak reset to the current size (Linux)
    except OSError:
        pass


@pytest.mark.floor(refused=60, ran__refused=100)
@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=mutated())
def test_malformed_models_name_the_place(case, device, tmp_path, cases):
    """Every mutation runs (some are still valid) or is refused with one line naming a
    JSON path of the file; nothing else escapes and no large allocation is made."""
    name, model = case
    _reset_peak()
    before = _peak_rss_mb()
    rc, text = _run(model, tmp_path, device)
    assert _peak_rss_mb() - before < 512, "a malformed model allocated a lot of memory"
    if rc == 2:
        assert "\n" not in text and "Traceback" not in text
        place = text.split(": ", 1)[0]
        assert place and " " not in place.split("line ")[-1], text   # a JSON path
        top = place.split(".")[0].split("[")[0]
        assert top in ("resources", "dispatchables", "commands", "$") or place == "", text
    cases.add("refused" if rc == 2 else "ran")


@pytest.mark.parametrize("change, place", [
    (lambda m: m["resources"]["input"].update(initialValues={"valueCount": 10 ** 12,
                                                             "value": 0}),
     "resources.input.initialValues.valueCount"),
    (lambda m: m["resources"]["output"].update(sizeInBytes=1e12),
     "resources.output.sizeInBytes"),
    (lambda m: m["resources"]["output"].update(sizeInBytes=10 ** 12),
     "resources.output.sizeInBytes"),
    (lambda m: m["resources"]["output"].update(initialValues={
        "valueCount": 10 ** 9, "valueStart": 0, "valueDelta": 1}),
     "resources.output.initialValues.valueCount"),
    (lambda m: m["dispatchables"]["pad"]["desc"]["InputTensor"].update(Sizes=[-2, 3]),
     "dispatchables.pad.desc.InputTensor.Sizes[0]"),
    (lambda m: m["dispatchables"]["pad"]["desc"]["InputTensor"].update(DataType="FLOAT99"),
     "dispatchables.pad.desc.InputTensor.DataType"),
    (lambda m: m.update(resources=[1]), "resources"),
    (lambda m: m["commands"][0].update(bindings="abc"), "commands[0].bindings"),
    (lambda m: m["dispatchables"].update(pad=["pad"]), "dispatchables.pad"),
    (lambda m: m["resources"]["input"].update(initialValues=[1, "x", 3]),
     "resources.input.initialValues[1]"),
    (lambda m: m["dispatchables"]["pad"]["desc"].update(StartPadding=[1.5, 1]),
     "dispatchables.pad.desc.StartPadding[0]"),
    (lambda m: m["dispatchables"]["pad"]["desc"].update(PaddingValue=None),
     "dispatchables.pad.desc.PaddingValue"),
    (lambda m: m["commands"].append({"type": "print", "resource": "nope"}),
     "commands[2].resource"),
    (lambda m: m["resources"]["input"].update(initialValuesDataType="INT8",
                                              initialValues=[1, 300]),
     "resources.input.initialValues[1]"),
], ids=["count", "size-float", "size", "sequence", "negative-size", "data-type",
        "resources-list", "bindings-string", "dispatchable-list", "string-value",
        "float-padding", "null-value", "unknown-resource", "int8-range"])
def test_issue_examples(change, place, device, tmp_path):
    _assert_refused("padding_constant", change, place, tmp_path, device)


def test_struct_missing_a_field(device, tmp_path):
    """A nested struct (UPSAMPLE_2D's ScaleSize) without one of its fields names it (a
    fuzzer found ``"ScaleSize": {}`` raising TypeError)."""
    _assert_refused("dml_upsample_2d",
                    lambda m: m["dispatchables"]["upsample"]["desc"].update(ScaleSize={}),
                    "dispatchables.upsample.desc.ScaleSize.Width", tmp_path, device)


def test_corrupt_npy(device, tmp_path):
    model = copy.deepcopy(LOADED["padding_constant"])
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"\x93NUMPY\x01\x00garbage")
    model["resources"]["input"]["initialValues"] = {"sourcePath": str(bad)}
    rc, text = _run(model, tmp_path, device)
    assert rc == 2 and text.startswith("resources.input.initialValues.sourcePath: ")
    # a valid header claiming far more data than the file holds
    np.save(bad, np.zeros(6, np.float32))
    raw = bad.read_bytes().replace(b"(6,)", b"(9,)")
    bad.write_bytes(raw)
    rc, text = _run(model, tmp_path, device)
    assert rc == 2 and text.startswith("resources.input.initialValues.sourcePath: ")
    np.save(bad, np.zeros(6, np.float32))     # and a good one runs
    assert _run(model, tmp_path, device)[0] == 0


def test_sequences_are_numpy(device, tmp_path):
    """valueStart/valueDelta sequences of integer types, exact at the type's edges."""
    model = copy.deepcopy(LOADED["padding1_wrap_int64"])
    init = {"valueCount": 6, "valueStart": 2 ** 62, "valueDelta": -(2 ** 60)}
    model["resources"]["input"]["initialValues"] = init
    model["commands"] = [{"type": "print", "resource": "input"}]
    rc, text = _run(model, tmp_path, device)
    assert rc == 0
    assert text.split(": ", 1)[1] == ", ".join(str(2 ** 62 - i * 2 ** 60) for i in range(6))
    init["valueDelta"] = 2 ** 62                           # the last value overflows int64
    rc, text = _run(model, tmp_path, device)
    assert rc == 2 and text.startswith("resources.input.initialValues.valueCount: ")


@pytest.mark.parametrize("change", [
    lambda m: m["resources"]["output"]["initialValues"].update(valueCount=10 ** 12),
    lambda m: m["dispatchables"].update(pad=["pad"]),
], ids=["huge", "list"])
def test_cli_exit_status(change, device, tmp_path):
    """The command line: one line on stderr, exit status 2, no traceback."""
    model = copy.deepcopy(LOADED["padding_constant"])
    change(model)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(model))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    proc = subprocess.run([sys.executable, "-m", "bench", "dispatch", str(path), "-a",
                           str(device.index)], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert ": resources.output" in lines[0] or ": dispatchables.pad" in lines[0]


# -- Microsoft's model format: dispatchable bindings, executionFlags, images, files ----------
from bench import references as ref  # noqa: E402


def _values(line: str) -> np.ndarray:
    return np.array([float(v) for v in line.split(": ", 1)[1].split(", ")])


def _lines(path, device) -> list[str]:
    lines = []
    dxdispatch.run_model(path, device, dxdispatch.Timing(), lines.append)
    return lines


def test_owned_tensors_and_execution_flags(device, tmp_path):
    """FilterTensor and BiasTensor are OWNED_BY_DML, bound by the dispatchable's own
    ``bindings`` (once, at initialization); executionFlags are accepted (no-ops)."""
    model = copy.deepcopy(LOADED["dml_owned_tensors_convolution"])
    res = model["resources"]
    x = np.arange(32, dtype=np.float64).reshape(1, 1, 4, 8) * 0.25 - 4
    w = np.array(res["filter"]["initialValues"], np.float64).reshape(2, 1, 3, 3)
    b = np.array(res["bias"]["initialValues"], np.float64)
    want = ref.activation_reference(ref.convolution_reference(x, w, b), "leaky_relu",
                                    alpha=0.125)
    lines = []
    records = dxdispatch.run_model(ROOT / "bench/models/dml_owned_tensors_convolution.json",
                                   device, dxdispatch.Timing(), lines.append)
    np.testing.assert_allclose(_values(lines[-1]), want.ravel(), rtol=1e-5, atol=1e-5)
    assert records[0]["execution_flags"] == ["ALLOW_HALF_PRECISION_COMPUTATION",
                                             "DISABLE_META_COMMANDS"]
    # a command may not bind an owned input; an owned input needs the dispatchable binding
    bad = copy.deepcopy(model)
    bad["commands"][0]["bindings"]["FilterTensor"] = "filter"
    rc, text = _run(bad, tmp_path, device)
    assert rc == 2 and text.startswith("commands[0].bindings.FilterTensor: "), text
    bad = copy.deepcopy(model)
    del bad["dispatchables"]["conv_owned"]["bindings"]["FilterTensor"]
    rc, text = _run(bad, tmp_path, device)
    assert rc == 2 and text.startswith("dispatchables.conv_owned: ") and "OWNED" in text
    bad = copy.deepcopy(model)
    bad["dispatchables"]["conv_owned"]["bindings"]["InputTensor"] = "input"
    rc, text = _run(bad, tmp_path, device)
    assert rc == 2 and text.startswith("dispatchables.conv_owned.bindings.InputTensor: ")


def test_write_file_and_print(device, tmp_path, monkeypatch):
    """A binding object with an element offset, DxDispatch's print (plain and verbose)
    and writeFile (.npy with dimensions, raw .dat of the whole buffer)."""
    monkeypatch.chdir(tmp_path)
    lines = _lines(ROOT / "bench/models/dml_write_file_padding.json", device)
    x = np.arange(1, 7, dtype=np.float64).reshape(1, 1, 2, 3)
    want = ref.pad_reference(x, [0, 0, 1, 2], [0, 0, 2, 1], "reflection")
    assert lines[1] == "Resource 'output': " + ", ".join(f"{v:g}" for v in want.ravel())
    assert lines[2] == "Resource 'data':"
    assert lines[3] == "[ 0] -1 (0xBF800000)" and lines[7] == "[ 4] 1 (0x3F800000)"
    assert len(lines) == 3 + 12
    npy = np.load(tmp_path / "bench/out/dml_write_file_padding.npy")
    assert npy.dtype == np.float32 and npy.shape == (1, 1, 5, 6)
    np.testing.assert_array_equal(npy, want)
    raw = (tmp_path / "bench/out/dml_write_file_padding.dat").read_bytes()
    assert len(raw) == 128                               # sizeInBytes, the whole buffer
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32)[:30], want.ravel())


@pytest.mark.parametrize("size", [(5, 4), (3, 2)], ids=["exact", "resampled"])
def test_image_resource(size, device, tmp_path, monkeypatch):
    """A .png resource: RGB, NCHW, components / 255, scaled to resampleSize; and the
    grey output written back as an 8-bit image (clamped, times 255, truncated)."""
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)      # H, W, C
    Image.fromarray(pixels, "RGB").save(tmp_path / "in.png")
    h, w = size
    model = copy.deepcopy(LOADED["dml_image_io"])
    model["resources"]["input"]["initialValues"]["sourcePath"] = "in.png"
    model["resources"]["input"]["resampleSize"] = [1, 3, h, w]
    model["resources"]["output"]["initialValues"]["valueCount"] = h * w
    desc = model["dispatchables"]["convert_to_grayscale"]["desc"]
    desc["InputTensor"]["Sizes"] = [1, 3, h, w]
    desc["OutputTensor"]["Sizes"] = [1, 1, h, w]
    model["commands"][2]["dimensions"] = [1, 1, h, w]
    rc, text = _run(model, tmp_path, device)
    assert rc == 0, text
    if size == (5, 4):
        image = pixels.astype(np.float64)
    else:   # Pillow's bicubic scaling, as DxDispatch's WIC high-quality cubic
        image = np.asarray(Image.fromarray(pixels).resize((w, h), Image.Resampling.BICUBIC),
                           np.float64)
    x = (image / 255).transpose(2, 0, 1)[None]
    f = np.array(model["resources"]["filter"]["initialValues"]).reshape(1, 3, 1, 1)
    want = ref.convolution_reference(x, f)
    got = _values(text.splitlines()[-1])
    np.testing.assert_allclose(got, want.ravel(), rtol=1e-5, atol=1e-6)
    grey = np.asarray(Image.open(tmp_path / "bench/out/dml_image_io.png"))
    assert grey.shape == (h, w)
    expect = (np.clip(got.astype(np.float32), 0, 1) * 255).astype(np.uint8).reshape(h, w)
    np.testing.assert_array_equal(grey, expect)


@pytest.mark.parametrize("change, place", [
    (lambda m: m["dispatchables"]["pad"].update(executionFlags="FAST"),
     "dispatchables.pad.executionFlags"),
    (lambda m: m["dispatchables"]["pad"].update(executionFlags=["NONE", 3]),
     "dispatchables.pad.executionFlags[1]"),
    (lambda m: m["commands"][1].update(verbose="yes"), "commands[1].verbose"),
    (lambda m: m["commands"][3].update(dimensions=[1, 1, 50, 60]), "commands[3].dimensions"),
    (lambda m: m["commands"][0]["bindings"]["InputTensor"].update(format="R99"),
     "commands[0].bindings.InputTensor.format"),
    (lambda m: m["commands"][0]["bindings"]["InputTensor"].update(elementOffset=9),
     "commands[0].bindings.InputTensor"),
    (lambda m: m["dispatchables"]["pad"].update(bindings={"InputTensor": "data"}),
     "dispatchables.pad.bindings.InputTensor"),
    (lambda m: m["resources"]["data"].update(resampleSize=[1, 3]), "resources.data.resampleSize"),
], ids=["flag", "flag-type", "verbose", "dimensions", "format", "offset", "init-binding",
        "resample"])
def test_new_fields_malformed(change, place, device, tmp_path):
    _assert_refused("dml_write_file_padding", change, place, tmp_path, device)


def test_image_malformed(device, tmp_path):
    model = copy.deepcopy(LOADED["dml_image_io"])
    model["resources"]["input"]["initialValues"]["sourcePath"] = str(
        ROOT / "bench/models/dml_image_io.jpg")
    for change, place in [
            (lambda r: r.pop("resampleSize"), "resources.input.resampleSize"),
            (lambda r: r.update(resampleSize=[2, 3, 8, 8]), "resources.input.resampleSize[0]"),
            (lambda r: r.update(resampleSize=[1, 2, 8, 8]), "resources.input.resampleSize[1]"),
            (lambda r: r.update(resampleMode="crop"), "resources.input.resampleMode"),
            (lambda r: r.update(initialValuesDataType="INT32"),
             "resources.input.initialValuesDataType")]:
        m = copy.deepcopy(model)
        change(m["resources"]["input"])
        rc, text = _run(m, tmp_path, device)
        assert rc == 2 and text.startswith(place + ": "), text
    (tmp_path / "bad.png").write_bytes(b"\x89PNG not really")
    model["resources"]["input"]["initialValues"]["sourcePath"] = str(tmp_path / "bad.png")
    rc, text = _run(model, tmp_path, device)
    assert rc == 2 and text.startswith("resources.input.initialValues.sourcePath: "), text


# -- arrays of tensors: JOIN's InputTensors, SPLIT's OutputTensors ---------------------------
def test_microsoft_join_split_slice(device):
    """Microsoft's dml_join/dml_split/dml_slice models as DxDispatch runs them: a list of
    resources (binding objects with offsets among them) on an array bind point."""
    a = np.arange(1, 11)
    lines = _lines(ROOT / "bench/models/dml_join.json", device)
    np.testing.assert_array_equal(_values(lines[-1]), np.concatenate([a[:3], [100, 115],
                                                                      a[4:9]]))
    lines = _lines(ROOT / "bench/models/dml_split.json", device)
    assert [list(_values(v)) for v in lines[-3:]] == [[1, 2], [3, 4], [5, 6]]
    x = np.arange(1, 26).reshape(5, 5)
    lines = _lines(ROOT / "bench/models/dml_slice.json", device)
    np.testing.assert_array_equal(_values(lines[-1]), x[1:4, 1:4:2].ravel())


@pytest.mark.parametrize("model, point, value", [
    ("dml_join", "InputTensors", ["A", "B"]),
    ("dml_split", "OutputTensors", ["Out1", "Out2", "Out3", "Out1"]),
    ("dml_split", "InputTensor", ["A", "A"]),
    ("dml_join", "OutputTensor", []),
])
def test_array_binding_counts(model, point, value, device, tmp_path):
    """A list binding must have one resource per tensor of the bind point."""
    bad = copy.deepcopy(LOADED[model])
    bad["commands"][0]["bindings"][point] = value
    rc, text = _run(bad, tmp_path, device)
    assert rc == 2 and text.startswith(f"commands[0].bindings.{point}"), text


def test_array_binding_unbound(device, tmp_path):
    bad = copy.deepcopy(LOADED["dml_split"])
    del bad["commands"][0]["bindings"]["OutputTensors"]
    rc, text = _run(bad, tmp_path, device)
    assert rc == 2 and "OutputTensors[0]" in text, text


# -- Microsoft's own models, run as DxDispatch's CMakeLists.txt tests them ------------------
import re  # noqa: E402

#: ``model_test`` lines of microsoft/DirectML DxDispatch/CMakeLists.txt: the model's
#: PASS_REGULAR_EXPRESSION, verbatim (CMake's "\n" is a newline).  None: Microsoft tests
#: the model with no expectation line (dml_gemm, dml_gemm_graph); the values are checked
#: against NumPy below, as every model's are.
MICROSOFT_EXPECT = {
    "dml_convolution_2d": "Resource 'output': 6, 8, 12, 14",
    "dml_convolution_3d": "Resource 'output': 4, 4, 4, 4, 4, 4, 4, 4",
    "dml_element_wise_add": "Resource 'Out': 6, 10, -2",
    "dml_element_wise_add_npy": "Resource 'Out': 2, 4, 6, 8, 10, 12",
    "dml_element_wise_add1": "Resource 'Out': 6, 10, -0.432332",
    "dml_element_wise_clip": "Resource 'A': -2.5, -2.5, -2, -1, 0, 1, 2, 2.5, 2.5",
    "dml_element_wise_identity": "Resource 'Out': 12, 14, 16",
    "dml_join": "Resource 'Out': 1, 2, 3, 100, 115, 5, 6, 7, 8, 9",
    "dml_reduce": "Resource 'output': 6, 15, 24",
    "dml_slice": "Resource 'output': 7, 9, 12, 14, 17, 19",
    "dml_split": "Resource 'Out1': 1, 2\nResource 'Out2': 3, 4\nResource 'Out3': 5, 6",
    "dml_upsample_2d": "Resource 'output': 1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, "
                       "3.25, 3.5, 3, 3.25, 3.75, 4",
    "dml_owned_tensors": "Resource 'Out': 6, 10, -2",
    "dml_scalar_union_fp16": "Resource 'output': 2, 2, 3, 4, 4",
    "dml_gemm": None,
    "dml_gemm_graph": None,
}


def _bilinear_2x(x: np.ndarray) -> np.ndarray:
    """UPSAMPLE_2D LINEAR by 2 (half-pixel centres, edges clamped), in float64."""
    def axis(n):
        src = np.clip((np.arange(2 * n) + 0.5) / 2 - 0.5, 0, n - 1)
        lo = np.floor(src).astype(int)
        hi = np.minimum(lo + 1, n - 1)
        w = np.zeros((2 * n, n))
        w[np.arange(2 * n), lo] += 1 - (src - lo)
        w[np.arange(2 * n), hi] += src - lo
        return w
    return axis(x.shape[0]) @ x @ axis(x.shape[1]).T


def _numpy_values(name: str) -> dict:
    """Each printed resource of Microsoft's model ``name`` as NumPy computes it."""
    a, b = np.array([1, 2, 3], np.float64), np.array([5, 8, -5], np.float64)
    s = a + b
    models = ROOT / "bench" / "models"
    windows = np.lib.stride_tricks.sliding_window_view
    return {
        "dml_convolution_2d": {"output": windows(np.arange(1.0, 10).reshape(3, 3), (2, 2))
                               .sum(axis=(2, 3)).ravel() * 0.5},
        "dml_convolution_3d": {"output": np.full(8, 8 * 0.5)},
        "dml_element_wise_add": {"Out": s},
        "dml_element_wise_add_npy": {"Out": np.load(models / "dml_element_wise_add_input.npy")
                                     + np.fromfile(models / "dml_element_wise_add_input.dat",
                                                   np.float32)},
        "dml_element_wise_add1": {"Out": np.where(s >= 0, s, 0.5 * np.expm1(s))},
        "dml_element_wise_clip": {"A": np.clip(np.arange(-4, 5), -2.5, 2.5)},
        "dml_element_wise_identity": {"Out": a * 2 + 10},
        "dml_join": {"Out": np.r_[1:4, 100, 115, 5:10]},
        "dml_reduce": {"input": np.arange(1, 10),
                       "output": np.arange(1, 10).reshape(3, 3).sum(axis=1)},
        "dml_slice": {"output": np.arange(1, 26).reshape(5, 5)[1:4, 1:4:2].ravel()},
        "dml_split": {"Out1": [1, 2], "Out2": [3, 4], "Out3": [5, 6]},
        "dml_upsample_2d": {"output": _bilinear_2x(np.array([[1.0, 2], [3, 4]])).ravel()},
        "dml_owned_tensors": {"Out": s},
        "dml_scalar_union_fp16": {"output": np.clip(np.arange(1, 6), 2, 4)},
        "dml_gemm": {"output": (np.outer(a, [4, 5, 6]) + 2).ravel()},
        "dml_gemm_graph": {"output": (np.ones((32, 32)) @ np.ones((32, 32))).ravel()},
    }[name]


def _printed(text: str) -> dict:
    """``Resource 'NAME': v0, v1, ...`` lines as {NAME: values}."""
    return {m.group(1): np.array([float(v) for v in m.group(2).split(", ")])
            for m in re.finditer(r"^Resource '([^']*)': (.+)$", text, re.M)}


@pytest.mark.parametrize("name", sorted(MICROSOFT_EXPECT))
def test_microsoft_models(name, device, tmp_path):
    """Microsoft's model run as its tests run it (``dxdispatch models/NAME.json``: here
    ``python -m bench dispatch``, in a scratch folder for the files it writes): exit
    status 0, the output matching CMakeLists.txt's regular expression, and every printed
    resource equal to NumPy's values (the regexes hold 6 significant digits, and '.'
    matches any character)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    proc = subprocess.run([sys.executable, "-m", "bench", "dispatch",
                           str(ROOT / "bench" / "models" / f"{name}.json"), "-a",
                           str(device.index)], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    expect = MICROSOFT_EXPECT[name]
    if expect is not None:
        assert re.search(expect, proc.stdout + proc.stderr), proc.stdout
    printed = _printed(proc.stdout)
    for res, want in _numpy_values(name).items():
        np.testing.assert_allclose(printed[res], want, rtol=5e-6, atol=0, err_msg=res)
    if name == "dml_element_wise_add_npy":       # its writeFile commands, into the folder
        out = np.load(tmp_path / "dml_element_wise_add_output.npy")
        assert out.dtype == np.float32 and out.shape == (6,)
        np.testing.assert_array_equal(out, [2, 4, 6, 8, 10, 12])
        raw = (tmp_path / "dml_element_wise_add_output.dat").read_bytes()
        np.testing.assert_array_equal(np.frombuffer(raw, np.float32), out)


@pytest.mark.parametrize("model, dispatchable", [("dml_gemm_graph", "gemm"),
                                                 ("dml_owned_tensors_convolution", "conv_owned"),
                                                 ("dml_owned_tensors", "add")])
def test_compile_as_graph(model, dispatchable, device):
    """``dmlCompileType: DmlCompileGraph`` compiles the operator as a one-node graph (its
    owned inputs the graph's constant inputs); the results equal the operator's."""
    from vkml.ops.graph import CompiledGraph

    results = {}
    for kind in ("DmlCompileOp", "DmlCompileGraph"):
        m = copy.deepcopy(LOADED[model])
        m["dispatchables"][dispatchable]["dmlCompileType"] = kind
        dxdispatch.check_model(m, dxdispatch.device_limits(device))
        lines = []
        ex = dxdispatch.Executor(m, ROOT / "bench" / "models", device, dxdispatch.Timing(),
                                 lines.append)
        try:
            records = ex.run()
            compiled = ex.dispatchables[dispatchable].compiled
            assert isinstance(compiled, CompiledGraph) == (kind == "DmlCompileGraph")
            assert records[0]["compile_type"] == kind
        finally:
            ex.release()
        results[kind] = lines[-1]
    assert results["DmlCompileOp"] == results["DmlCompileGraph"]


def _clip1_model(dtype: str, lo, hi) -> dict:
    m = copy.deepcopy(LOADED["dml_scalar_union_fp16"])
    for r in m["resources"].values():
        r["initialValuesDataType"] = dtype
    desc = m["dispatchables"]["clip"]["desc"]
    desc["InputTensor"]["DataType"] = desc["OutputTensor"]["DataType"] = dtype
    desc.update(MinMaxDataType=dtype, Min=lo, Max=hi)
    return m


@pytest.mark.parametrize("dtype, lo, hi", [
    ("FLOAT16", {"UInt16": 0x4000}, {"UInt16": 0x4400}),      # 2.0 and 4.0 as half bits
    ("FLOAT32", {"Float32": 2}, 4.0),
    ("INT32", {"Int32": 2}, {"Int32": 4}),
    ("UINT8", 2, {"UInt8": 4}),
    ("INT64", {"Int64": 2}, 4),
])
def test_scalar_unions(dtype, lo, hi, device, tmp_path):
    """CLIP1's Min and Max as DxDispatch reads a DML_SCALAR_UNION: a number of
    MinMaxDataType, or an object naming the union member (FLOAT16: its bits)."""
    rc, text = _run(_clip1_model(dtype, lo, hi), tmp_path, device)
    assert rc == 0, text
    assert text.splitlines()[-1] == "Resource 'output': 2, 2, 3, 4, 4"


@pytest.mark.parametrize("dtype, lo, hi, place", [
    ("FLOAT16", {"Float32": 2}, 4, "Min"),                   # not FLOAT16's member
    ("FLOAT16", 2, {"UInt16": 70000}, "Max.UInt16"),
    ("FLOAT16", 2, {"UInt16": 1.5}, "Max.UInt16"),
    ("INT32", {"Int32": 2, "Float32": 1}, 4, "Min"),
    ("INT32", 2.5, 4, "Min"),                               # not an integer of INT32
    ("UINT8", 2, 256, "Max"),
    ("INT32", {"Int32": "2"}, 4, "Min.Int32"),              # (the schema: a number)
])
def test_scalar_unions_malformed(dtype, lo, hi, place, device, tmp_path):
    rc, text = _run(_clip1_model(dtype, lo, hi), tmp_path, device)
    assert rc == 2 and text.startswith(f"dispatchables.clip.desc.{place}: "), text


def test_clip1_type_must_match(device, tmp_path):
    m = _clip1_model("FLOAT16", 2, 4)
    m["dispatchables"]["clip"]["desc"]["MinMaxDataType"] = "FLOAT32"
    rc, text = _run(m, tmp_path, device)
    assert rc == 2 and text.startswith("dispatchables.clip.desc.MinMaxDataType: "), text


def test_one_letter_fields():
    """DirectML's ATensor, BTensor, CTensor, TransA read as vkml's a_tensor, ..."""
    assert [dxdispatch.schema.snake(n) for n in ("ATensor", "CTensor", "TransA",
                                                   "MinMaxDataType", "P", "StartPadding")] \
        == ["a_tensor", "c_tensor", "trans_a", "min_max_data_type", "p", "start_padding"]

"""The WebGPU peers of ``python -m bench models`` (``bench/cnn/peers.py``: wonnx and
tinygrad on Dawn, measured by workers in the peers' own virtualenv): the choice of the
measured device's one Vulkan driver, the adapter check, wonnx's model rewrite (checked
against ONNX Runtime CPU on the rewritten model), the worker's answer files, and a peer
that is missing, crashes or hangs reported absent, never failing the run.  Where
.venv-peers has the packages, each peer runs a tiny model on every device, its output
against ONNX Runtime CPU; elsewhere those tests skip."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from bench.cnn import peers as peers_mod                           # noqa: E402
from bench.cnn import worker_io, wonnx_worker                       # noqa: E402
from bench.cnn.run import peer_row, rel_err                         # noqa: E402
from bench.runners import Absent                                    # noqa: E402
from bench.stats import Budget                                      # noqa: E402

LVP = "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"
SWS = "/x/.drivers/swiftshader/vk_swiftshader_icd.json"
BUDGET = Budget(warmup=0, seconds=0.05, repeats=2)


def tiny_model(seed: int = 0) -> bytes:
    """Conv 3x3 + Relu + GlobalAveragePool + Flatten + Gemm(transB=1): what the CNNs of
    the model set end with, the Gemm in the layout torch.onnx exports."""
    h, rng = onnx.helper, np.random.default_rng(seed)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (4, 3, 3, 3)), ("b", (4,)), ("fw", (5, 4)), ("fb", (5,)))]
    # no kernel_shape (ONNX: W's), which wonnx requires
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             h.make_node("Relu", ["c"], ["r"], name="relu"),
             h.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
             h.make_node("Flatten", ["g"], ["f"], name="flatten"),
             h.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1, name="fc")]
    graph = h.make_graph(nodes, "tiny", [h.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
                         [h.make_tensor_value_info("y", 1, [1, 5])], initializer=inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def run_ort(data: bytes, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


class _Named:
    def __init__(self, name):
        self.info = type("Info", (), {"name": name})()


@pytest.mark.parametrize("name, want", [
    ("llvmpipe (LLVM 15.0.6, 256 bits)", LVP),
    ("SwiftShader Device (Subzero)", SWS),
    ("NVIDIA H100 80GB HBM3", None),                # its manifest is not listed
])
def test_one_icd(name, want):
    assert peers_mod.one_icd(name, os.pathsep.join([LVP, SWS])) == want
    # one listed driver that is not the device's: not narrowed to it
    assert peers_mod.one_icd(name, LVP) == (LVP if want == LVP else None)


def test_one_icd_refuses_two_matches():
    assert peers_mod.one_icd("llvmpipe", os.pathsep.join([LVP, "/y/lvp_icd.i686.json"])) is None


def test_worker_env_names_one_driver(monkeypatch):
    monkeypatch.setenv("VK_ICD_FILENAMES", os.pathsep.join([LVP, SWS]))
    env = peers_mod.Wonnx().env(_Named("SwiftShader Device (Subzero)"))
    assert env["VK_ICD_FILENAMES"] == SWS and env["PATH"] == os.environ["PATH"]
    assert peers_mod.Wonnx().env(_Named("Other GPU")) is None
    monkeypatch.delenv("VK_ICD_FILENAMES")
    assert peers_mod.TinygradWebGpu().env(_Named("llvmpipe")) is None


@pytest.mark.parametrize("adapter, device, same", [
    ("llvmpipe (LLVM 15.0.6, 256 bits)", "llvmpipe (LLVM 15.0.6, 256 bits)", True),
    ("SwiftShader Device (Subzero)", "SwiftShader Device (Subzero)", True),
    ("SwiftShader Device (Subzero)", "llvmpipe (LLVM 15.0.6, 256 bits)", False),
    ("llvmpipe (LLVM 15.0.6, 256 bits)", "", False),
])
def test_same_device(adapter, device, same):
    assert worker_io.same_device(adapter, device) is same


def test_wonnx_ready_keeps_the_model():
    """The rewrite for wonnx (transposed constant B, shapes inferred) computes what the
    exported model does, and names what it changed."""
    data = tiny_model()
    model, done = wonnx_worker.ready(onnx.load_from_string(data))
    assert done == ["Conv conv: kernel_shape from W", "Gemm fc: transB=1 -> B transposed"]
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    assert [list(a.ints) for a in conv.attribute if a.name == "kernel_shape"] == [[3, 3]]
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    assert [a.i for a in gemm.attribute if a.name == "transB"] == [0]
    inferred = {v.name for v in model.graph.value_info}
    assert {"c", "r", "g", "f"} <= inferred
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    ref = run_ort(data, x)
    assert rel_err(run_ort(model.SerializeToString(), x), ref) < 1e-6
    # a second pass has nothing left to rewrite
    assert wonnx_worker.ready(model)[1] == []


def split_model() -> bytes:
    """YOLOv8n's pattern in small (torch.onnx's export of its C2f ``chunk`` and box
    halves, opset 17): Shape -> Gather -> Div -> the channel Slices, a Slice whose end is
    past the dimension, and a Softmax on axis 1."""
    h = onnx.helper
    c = lambda name, v: h.make_node("Constant", [], [name], name=name,   # noqa: E731
                                    value=onnx.numpy_helper.from_array(np.array(v)))
    nodes = [h.make_node("Relu", ["x"], ["r"], name="relu"),
             h.make_node("Shape", ["r"], ["s"], name="shape"),
             c("one", np.array([1], np.int64)), c("two", np.array([2], np.int64)),
             c("zero", np.array([0], np.int64)), c("big", np.array([9], np.int64)),
             h.make_node("Gather", ["s", "one"], ["ch"], axis=0, name="gather"),
             h.make_node("Div", ["ch", "two"], ["half"], name="div"),
             h.make_node("Slice", ["r", "zero", "half", "one"], ["a"], name="lo"),
             h.make_node("Slice", ["r", "half", "ch", "one"], ["b"], name="hi"),
             h.make_node("Softmax", ["b"], ["sb"], axis=1, name="softmax"),
             h.make_node("Add", ["a", "sb"], ["ab"], name="add"),
             h.make_node("Slice", ["ab", "one", "big", "one"], ["y"], name="end")]
    graph = h.make_graph(nodes, "split", [h.make_tensor_value_info("x", 1, [1, 6, 4, 5])],
                         [h.make_tensor_value_info("y", 1, None)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_wonnx_ready_folds_and_rewrites_slices():
    """Shapes computed from the input's shape folded to constants (wonnx refuses the
    symbolic sizes shape inference leaves), each Slice as Reshape + Gather (int32) +
    Reshape, the opset lowered to one wonnx's Softmax takes: the same output as the
    exported model on ONNX Runtime CPU, every shape static."""
    data = split_model()
    model, done = wonnx_worker.ready(onnx.load_from_string(data))
    assert done == ["constants folded: 4 Constant, 1 Div, 1 Gather, 1 Shape",
                    "3 Slice as Reshape + Gather (int32) + Reshape",
                    "opset 17 -> 15 (the same definitions of its ops)"]
    ops = [n.op_type for n in model.graph.node]
    assert "Slice" not in ops and "Shape" not in ops and "Constant" not in ops
    gathers = [n for n in model.graph.node if n.op_type == "Gather"]
    assert len(gathers) == 3 and all(a.i == 0 for g in gathers for a in g.attribute)
    inits = {t.name: t for t in model.graph.initializer}
    assert all(inits[g.input[1]].data_type == onnx.TensorProto.INT32 for g in gathers)
    for v in [*model.graph.value_info, *model.graph.output]:
        assert all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim), v.name
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == \
        [1, 2, 4, 5]
    x = np.random.default_rng(3).standard_normal((1, 6, 4, 5)).astype(np.float32)
    assert rel_err(run_ort(model.SerializeToString(), x), run_ort(data, x)) < 1e-6
    assert wonnx_worker.ready(model)[1] == []


def test_wonnx_concat_on_a_later_axis():
    """A Concat on an axis after a dimension above 1 (YOLOv8n's head: [1, 64, n] joined
    on axis 2) becomes Transposes around a Concat on axis 0, computing the same; one on
    the channels of a batch of 1 is left alone."""
    h = onnx.helper
    nodes = [h.make_node("Concat", ["a", "b"], ["ab"], axis=2, name="join"),
             h.make_node("Concat", ["ab", "ab"], ["y"], axis=1, name="channels")]
    graph = h.make_graph(nodes, "cat", [h.make_tensor_value_info("a", 1, [1, 3, 4]),
                                        h.make_tensor_value_info("b", 1, [1, 3, 2])],
                         [h.make_tensor_value_info("y", 1, [1, 6, 6])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    model, done = wonnx_worker.ready(model)
    assert done == ["1 Concat on axis 0 between Transposes"]
    assert [n.op_type for n in model.graph.node] == ["Transpose"] * 2 + [
        "Concat", "Transpose", "Concat"]
    assert [a.i for a in model.graph.node[2].attribute] == [0]
    rng = np.random.default_rng(4)
    feeds = {"a": rng.standard_normal((1, 3, 4)).astype(np.float32),
             "b": rng.standard_normal((1, 3, 2)).astype(np.float32)}
    runs = [ort.InferenceSession(d, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
            for d in (data, model.SerializeToString())]
    assert runs[0].shape == (1, 6, 6) and np.array_equal(runs[0], runs[1])


def test_wonnx_opset_kept_where_an_op_changed():
    """A model with a Softmax and an op whose definition differs between the model's
    opset and wonnx's (Resize: opset 18 changed it) keeps the model's opset; a model
    without a Softmax keeps it too."""
    h = onnx.helper
    scales = onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "sc")
    nodes = [h.make_node("Resize", ["x", "", "sc"], ["r"], mode="nearest"),
             h.make_node("Softmax", ["r"], ["y"], axis=1)]
    graph = h.make_graph(nodes, "r", [h.make_tensor_value_info("x", 1, [1, 2, 3, 3])],
                         [h.make_tensor_value_info("y", 1, [1, 2, 6, 6])], initializer=[scales])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    assert wonnx_worker.lower_opset(model) == [] and model.opset_import[0].version == 18
    model.opset_import[0].version = 17                  # Resize-13 in both 17 and 15
    assert wonnx_worker.lower_opset(model) == [
        "opset 17 -> 15 (the same definitions of its ops)"]
    assert model.opset_import[0].version == 15
    del model.graph.node[1:]
    model.opset_import[0].version = 17
    assert wonnx_worker.lower_opset(model) == [] and model.opset_import[0].version == 17


def test_wonnx_refusal_names_the_op():
    model = onnx.load_from_string(tiny_model())
    text = ('called `Result::unwrap()` on an `Err` value: GpuError(CompileError { node: '
            '"fc", error: InvalidInputShape { input_index: 1 } })')
    assert wonnx_worker.refusal(model, text).startswith("wonnx refuses Gemm (node fc): ")
    fused = 'AttributeNotFoundError { attribute: "kernel_shape", node_name: "conv+relu" }'
    assert wonnx_worker.refusal(model, fused).startswith("wonnx refuses Conv (node conv+relu)")
    assert wonnx_worker.refusal(model, "boom").startswith("wonnx refused the model: boom")


def test_answer_files(tmp_path):
    fig, y = tmp_path / "fig.json", tmp_path / "y.npy"

    def absent():
        raise worker_io.Absent("no adapter")
    assert worker_io.answer(str(fig), str(y), absent) == 0
    assert json.loads(fig.read_text()) == {"absent": "no adapter"} and not y.exists()
    worker_io.answer(str(fig), str(y), lambda: ({"first_s": 1.0}, np.ones(3, np.float64)))
    assert json.loads(fig.read_text()) == {"first_s": 1.0}
    assert np.load(y).dtype == np.float32


def test_measure_settles_before_sampling():
    calls = []

    def prepare():
        return lambda x: calls.append(len(calls)) or x * 2
    fig, y = worker_io.measure(prepare, np.ones(2), "0.01", "3", settle=1)
    assert len(calls) == 1 + 1 + 1 + 3          # first, settle, warm-up, samples
    assert fig["hot"]["n"] == 3 and fig["first_s"] >= 0 and (y == 2).all()


def test_partial_figures_name_the_first_run(tmp_path):
    figp, yp = tmp_path / "fig.json", tmp_path / "y.npy"
    worker_io.measure(lambda: (lambda x: x * 3), np.ones(2), "0.01", "1",
                      files=(str(figp), str(yp)))
    assert (np.load(yp) == 3).all()
    # measure leaves the partial figures; answer() replaces them with the full ones
    fig = json.loads(figp.read_text())
    assert fig["absent"].startswith("ended during its hot runs, after prepare ")
    assert fig["first_s"] >= 0 and fig["prepare_s"] >= 0


def test_missing_virtualenv_is_absent(monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_WEBGPU_PYTHON", str(tmp_path / "none" / "python"))
    for peer in (peers_mod.Wonnx(), peers_mod.TinygradWebGpu(), peers_mod.OrtWebGpu()):
        with pytest.raises(Absent, match="the peers' virtualenv"):
            peer.version()
        row = peer_row(peer, None, b"", 8, _Named("llvmpipe"), None, None, BUDGET)
        assert row["status"] == "absent" and "tools/setup" in row["reason"]


def test_missing_package_is_absent(monkeypatch):
    """A Python without the peer's package (here a made-up one) answers absent."""
    monkeypatch.setenv("VKML_WEBGPU_PYTHON", sys.executable)
    peer = peers_mod.Wonnx()
    peer.package = "vkml-no-such-package"
    with pytest.raises(Absent, match="vkml-no-such-package is not installed"):
        peer.version()


def _fake_worker(tmp_path, monkeypatch, code: str) -> None:
    """$VKML_WEBGPU_PYTHON: a script running ``code`` in the worker's place, with its
    arguments (sys.argv[6] is FIG.json); this Python for anything else (the version)."""
    prog = tmp_path / "py"
    prog.write_text(f"#!/bin/sh\n[ \"$1\" = -m ] || exec {sys.executable} \"$@\"\n"
                    f"exec {sys.executable} -c '{code}' \"$@\"\n")
    prog.chmod(0o755)
    monkeypatch.setenv("VKML_WEBGPU_PYTHON", str(prog))


def test_crashing_or_hanging_worker_is_absent(monkeypatch, tmp_path):
    """A worker that dies (exit status, signal) or outlives the time limit makes the row
    absent with the reason; one that got through its first run says so."""
    x = np.zeros((1, 3, 8, 8), np.float32)
    peer = peers_mod.Wonnx()
    peer.package = "numpy"                  # what this Python has
    _fake_worker(tmp_path, monkeypatch, "import sys; sys.exit(\"worker died\")")
    with pytest.raises(Absent, match=r"wonnx-vulkan failed \(exit status 1\): worker died"):
        peer.measure(None, tiny_model(), 8, _Named("llvmpipe"), x, BUDGET)
    _fake_worker(tmp_path, monkeypatch, "import os, signal, sys; import numpy as np; "
                 "from bench.cnn import worker_io; "
                 "worker_io.partial(sys.argv[6], sys.argv[5], 0.5, 2.0, np.full(3, 2.0)); "
                 "os.kill(os.getpid(), signal.SIGSEGV)")
    with pytest.raises(Absent, match=r"ended during its hot runs, after prepare 0.50 s and "
                                     r"a first run of 2.00 s \(killed by SIGSEGV\)") as info:
        peer.measure(None, tiny_model(), 8, _Named("llvmpipe"), x, BUDGET)
    assert info.value.first[0] == {"prepare_s": 0.5, "first_s": 2.0}
    # the row keeps that first run, its output checked against the reference
    row = peer_row(peer, None, tiny_model(), 8, _Named("llvmpipe"), x, np.full(3, 1.0),
                   BUDGET)
    assert row["status"] == "absent" and row["first_s"] == 2.0
    assert row["first_rel_err"] == 1.0 and row["reason"].endswith("that run's rel err 1.0e+00")
    _fake_worker(tmp_path, monkeypatch, "import time; time.sleep(30)")
    peer.timeout_s = 0.5
    with pytest.raises(Absent, match="no result within"):
        peer.measure(None, tiny_model(), 8, _Named("llvmpipe"), x, BUDGET)
    # stopped by the time limit during a run after its first: how long that run had
    # lasted (marked 5 s before it began) is said, a lower bound of a warm run
    _fake_worker(tmp_path, monkeypatch, "import sys, time; import numpy as np; "
                 "from bench.cnn import worker_io; "
                 "worker_io.partial(sys.argv[6], sys.argv[5], 0.5, 2.0, np.full(3, 2.0)); "
                 "worker_io.mark(sys.argv[6], time.time() - 5); time.sleep(30)")
    peer.timeout_s = 2.0
    with pytest.raises(Absent, match=r"no result within 2 s .*; a run after the first "
                                     r"unfinished after [5-9]\.\d s") as info:
        peer.measure(None, tiny_model(), 8, _Named("llvmpipe"), x, BUDGET)
    assert 5.0 <= info.value.first[0]["run_over_s"] < 10.0
    assert info.value.first[0]["first_s"] == 2.0


def test_slow_runs_are_marked(tmp_path):
    """After a run of at least MARK_S, the next run's start is in FIG.json before it
    ends (what the parent reads if it stops the worker); fast runs are not marked."""
    fig, y = str(tmp_path / "fig.json"), str(tmp_path / "y.npy")
    seen = []

    def prepare():
        def run(x):
            if not os.path.exists(fig):
                seen.append(None)
            else:
                with open(fig) as f:
                    seen.append(json.load(f).get("run_since"))
            if len(seen) == 1:
                time.sleep(worker_io.MARK_S)       # the first run: slow
            return x
        return run
    t = time.time()
    worker_io.measure(prepare, np.zeros(3, np.float32), "0", "3", files=(fig, y))
    # the first run (before partial) found no FIG; the next (after a slow one) was
    # marked; the rest followed fast runs and kept that one mark
    assert seen[0] is None and t <= seen[1] <= time.time() and seen[2:] == [seen[1]] * 3


def _installed(peer) -> None:
    try:
        peer.version()
    except Absent as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("peer", [peers_mod.Wonnx(), peers_mod.TinygradWebGpu()],
                         ids=lambda p: p.name)
def test_peer_on_device(device, peer):
    """The tiny model on every device, against ONNX Runtime CPU; on a device whose
    driver the worker cannot be given alone, absent saying so."""
    _installed(peer)
    data = tiny_model()
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    ref = run_ort(data, x)
    row = peer_row(peer, None, data, 8, device, x, ref, BUDGET)
    if row["status"] == "absent" and "VK_ICD_FILENAMES" in row["reason"]:
        pytest.skip(row["reason"])
    assert row["status"] == "ok", row
    assert row["rel_err"] < 1e-5 and row["hot"]["n"] == 2 and row["first_s"] > 0
    assert worker_io.same_device(row["adapter"], device.info.name)
    if peer.name == "wonnx-vulkan":
        assert row["note"] == "Conv conv: kernel_shape from W; Gemm fc: transB=1 -> B transposed"


def test_workers_need_no_vkml(monkeypatch):
    """The workers run in the peers' virtualenv, which has no vkml (nor torch)."""
    monkeypatch.delenv("VKML_WEBGPU_PYTHON", raising=False)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert peers_mod.Wonnx().python() == os.path.join(root, ".venv-peers", "bin", "python")
    code = ("import sys; sys.modules['vkml'] = sys.modules['torch'] = None; "
            "import bench.cnn.wonnx_worker, bench.cnn.tinygrad_worker, bench.cnn.webgpu_worker")
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr


def test_ort_webgpu_on_device(device):
    """ONNX Runtime WebGPU on the tiny model, against ONNX Runtime CPU; on a device Dawn
    offers it only as a fallback adapter (lavapipe), absent saying so."""
    peer = peers_mod.OrtWebGpu()
    _installed(peer)
    data = tiny_model()
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    row = peer_row(peer, None, data, 8, device, x, run_ort(data, x), BUDGET)
    if row["status"] == "absent" and "VK_ICD_FILENAMES" in row["reason"]:
        pytest.skip(row["reason"])
    if row["status"] == "absent":
        assert "fallback adapter" in row["reason"], row
        return
    assert row["status"] == "ok", row
    assert row["rel_err"] < 1e-5 and row["hot"]["n"] == 2 and row["first_s"] > 0


def test_ncnn_in_a_child_process(device, monkeypatch):
    """ncnn-vulkan runs in ``bench.cnn.peer_worker``'s child process (its own Vulkan
    device kept out of the process measuring vkml), the tiny model against ONNX Runtime
    CPU; ncnn is imported by the child only."""
    peer = peers_mod.NcnnVulkan()
    try:
        peer.version()
    except Absent as exc:
        pytest.skip(str(exc))
    assert isinstance(peer, peers_mod.ChildPeer) and peer.worker_args == ("ncnn-vulkan",)
    monkeypatch.setattr(peers_mod.NcnnVulkan, "prepare",
                        lambda *a, **k: pytest.fail("ncnn prepared in the bench's process"))
    data = tiny_model()
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    row = peer_row(peer, None, data, 8, device, x, run_ort(data, x), BUDGET)
    assert row["status"] == "ok", row
    assert row["rel_err"] < 1e-5 and row["first_s"] > 0

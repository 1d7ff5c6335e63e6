"""``python -m bench models`` on a tiny model: a small U-Net (``bench/cnn/models.TINY``,
32x32) exported by torch.onnx through the same code path as the model set, on every
device: the row's fields, vkml's and PyTorch's outputs against ONNX Runtime CPU, the
placement figures, the FLOP count against one taken independently (forward hooks on
the torch modules), and that neither CPU peer (nor the export, nor the count) runs in
the process measuring vkml.  Timings are never asserted, only that they exist."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from bench.cnn import flops, models, report                       # noqa: E402
from bench.cnn import peers as peers_mod                            # noqa: E402
from bench.cnn.peers import OrtCpu, TorchCpu                       # noqa: E402
from bench.cnn.run import model_row                                # noqa: E402
from bench.stats import Budget                                     # noqa: E402

SIZE = 32
TINY = models.TINY                 # found by name in the CPU peers' child processes
LIMITS = {"fma_gflops": 10.0, "shader_copy_gbs": 5.0, "fma_cpu_gflops": 4.0}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    data, path, hit = models.export(TINY, SIZE, cache=str(folder))
    again, path2, hit2 = models.export(TINY, SIZE, cache=str(folder))
    assert (hit, hit2, path2, again) == (False, True, path, data)
    return data


def hooked_flops() -> float:
    """Multiply-add FLOPs counted on the torch modules as they run."""
    import torch

    total = [0.0]

    def hook(mod, inp, out):
        k = np.prod(mod.kernel_size) * (mod.in_channels if isinstance(
            mod, torch.nn.Conv2d) else mod.out_channels) // mod.groups
        n = out.numel() if isinstance(mod, torch.nn.Conv2d) else inp[0].numel()
        total[0] += 2.0 * n * k
    torch.manual_seed(models.SEED)
    net = TINY.build(SIZE)
    for m in net.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)):
            m.register_forward_hook(hook)
    with torch.no_grad():
        net(torch.zeros(1, 3, SIZE, SIZE))
    return total[0]


def test_flops_match_torch_hooks(exported):
    import onnx

    counted = flops.count(onnx.load_from_string(exported))
    assert counted["conv_gemm_flops"] == pytest.approx(hooked_flops(), rel=1e-9)
    assert counted["bytes"] > 0 and all(b > 0 for _, _, b in counted["layers"])
    # the ReLU after each convolution is counted with it: no layer of its own
    assert "Relu" not in {op for op, _, _ in counted["layers"]}
    t = flops.roofline_seconds(counted["layers"], 1.0, 1.0)
    assert t == pytest.approx(sum(max(f, b) for _, f, b in counted["layers"]) * 1e-9)


def _not_here(*a, **k):
    pytest.fail("a CPU peer prepared in the bench's process")


def test_row(device, exported, monkeypatch):
    # the CPU peers run in child processes (peer_worker), never in this one
    for cls in (peers_mod.OrtCpu, peers_mod.TorchCpu):
        monkeypatch.setattr(cls, "prepare", _not_here)
    budget = Budget(warmup=0, repeats=2)
    row = model_row(TINY, SIZE, exported, device, [OrtCpu(), TorchCpu()], budget, LIMITS)
    vk = row["vkml"]
    assert vk["status"] == "ok", vk
    assert vk["rel_err"] < 1e-4
    for key in ("prepare_s", "first_s"):
        assert vk[key] > 0
    # cold start: a fresh process with an empty cache, then one with the same cache
    for phase in ("cold", "warm"):
        fig = vk["cold_start"][phase]
        assert fig["status"] == "ok", fig
        assert fig["prepare_s"] > 0 and fig["first_s"] > 0 and fig["import_s"] > 0
    quick = model_row(TINY, SIZE, exported, device, [OrtCpu()], budget, LIMITS, cold=False)
    assert "cold_start" not in quick["vkml"] and quick["vkml"]["status"] == "ok"
    assert vk["hot"]["n"] == 2 and vk["hot"]["median"] > 0
    assert vk["device_partitions"] >= 1
    assert vk["host_node_count"] == sum(e["count"] for op, e in vk["host_ops"].items()
                                        if op != "(fallback)")
    assert vk["strict"]["accepted"] == (vk["host_node_count"] == 0 and not vk["fallbacks"])
    if not vk["strict"]["accepted"]:
        assert vk["strict"]["refused_op"] in vk["host_ops"]
    peers = row["peers"]
    assert peers["onnxruntime-cpu"]["rel_err"] == 0.0
    assert peers["onnxruntime-cpu"]["hot"]["n"] == 2
    assert peers["torch-cpu"]["status"] == "ok" and peers["torch-cpu"]["rel_err"] < 1e-4
    assert peers["torch-cpu"]["vkml_speedup"] > 0
    hot_s = vk["hot"]["median"] / 1e3
    assert row["fma_share"] == pytest.approx(row["conv_gemm_gflop"] / hot_s / 10.0)
    assert 0 < row["roofline_share"] == pytest.approx(row["roofline_ms"] / 1e3 / hot_s)
    # the same hot runs' process CPU time, and the share counted in it
    assert vk["hot_cpu"]["n"] == 2 and vk["hot_cpu"]["median"] > 0
    assert row["fma_cpu_share"] == pytest.approx(
        row["conv_gemm_gflop"] / (vk["hot_cpu"]["median"] / 1e3) / 4.0)
    md = report.markdown({"command": ["x"], "rows": [row]})
    assert "| unet-tiny | 32 |" in md


def test_torch_gpu_absent_without_gpu(monkeypatch):
    """The GPU peer names why it cannot run: no GPU tools found (it is not started), or
    a PyTorch that sees no GPU; on a machine with one, the device run covers it."""
    import shutil

    from bench.runners import Absent

    from importlib.metadata import version

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(Absent, match="nvidia-smi nor rocm-smi"):
        peers_mod.TorchGpu().version()
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    # (the wheel's version: a CUDA build's torch.__version__ adds "+cu130")
    assert peers_mod.TorchGpu().version() == version("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(Absent, match="sees no GPU"):
        peers_mod.TorchGpu().prepare(TINY, b"", SIZE)


def test_rel_err():
    from bench.cnn.run import rel_err

    assert rel_err(np.array([1.0, 2.5]), np.array([1.0, 2.0])) == pytest.approx(0.25)
    assert rel_err(np.zeros(2), np.zeros(3)) == float("inf")


def test_calibration_is_deterministic_and_normalizes(tmp_path, monkeypatch):
    """Two exports into separate caches give the same bytes; each BatchNorm's running
    statistics are its input's (eval-mode outputs about unit variance, not the defaults
    0 and 1), and the cache key follows the calibration."""
    import torch

    a, path_a, _ = models.export(TINY, SIZE, cache=str(tmp_path / "a"))
    b, path_b, hit = models.export(TINY, SIZE, cache=str(tmp_path / "b"))
    assert not hit and a == b
    torch.manual_seed(models.SEED)
    net = TINY.build(SIZE)
    assert not net.training
    bns = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all(bn.momentum == 0.1 and not bn.training for bn in bns)
    outs = []
    for bn in bns:
        bn.register_forward_hook(lambda m, i, o: outs.append(o))
        assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    with torch.no_grad():
        net(torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(7)))
    for o in outs:
        std = o.std(dim=(0, 2, 3))
        assert 0.5 < float(std.median()) < 2.0
    key = models.cache_key(TINY, SIZE)
    monkeypatch.setattr(models, "CALIBRATION", {"passes": 1, "batch": 2})
    assert models.cache_key(TINY, SIZE) != key


def test_fuse_option():
    import argparse

    from bench.cnn.cli import _parser, parse_fuse
    from vkml.ops.graph import FUSION_KINDS

    parse = lambda *a: _parser().parse_args(list(a)).fuse       # noqa: E731
    assert parse() is True and parse("--no-fuse") is False
    assert parse("--fuse", "off") is False and parse("--fuse", "ON") is True
    assert parse("--fuse", "residual=off,join_in_place=off") == {
        "residual": False, "join in place": False}
    assert parse_fuse("join in place=on, activation=off") == {
        "join in place": True, "activation": False}
    assert set(parse_fuse(",".join(k + "=off" for k in FUSION_KINDS))) == set(FUSION_KINDS)
    for bad in ("residual", "residual=no", "relu=off", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_fuse(bad)
    with pytest.raises(SystemExit):
        _parser().parse_args(["--fuse", "bogus=off"])


def test_row_fuse_switch(device, exported):
    """``fuse`` reaches prepare: the row records it, and the fusions made follow it."""
    from bench.cnn.run import vkml_row

    x = np.random.default_rng(0).standard_normal((1, 3, SIZE, SIZE)).astype(np.float32)
    ref = OrtCpu().prepare(TINY, exported, SIZE)(x)
    budget = Budget(warmup=0, repeats=1)
    # (the cold-start children are test_row's)
    on = vkml_row(exported, device, x, ref, budget, cold=False)
    assert on["fuse"] is True and on["fusions"].get("activation", 0) > 0
    off = vkml_row(exported, device, x, ref, budget, fuse={"activation": False}, cold=False)
    assert off["fuse"] == {"activation": False} and "activation" not in off["fusions"]
    none = vkml_row(exported, device, x, ref, budget, fuse=False, cold=False)
    assert none["fusions"] == {}
    for row in (on, off, none):
        assert row["status"] == "ok" and row["rel_err"] < 1e-4


#: Run in a fresh process where importing torch or onnxruntime fails: the tiny model
#: exported (a cache miss: the export's child process), then its row with both CPU peers.
_NO_PEERS_HERE = """
import json, sys
sys.modules["torch"] = sys.modules["onnxruntime"] = None
import numpy as np, vkml
from bench.cnn import models
from bench.cnn.peers import OrtCpu, TorchCpu
from bench.cnn.run import model_row
from bench.stats import Budget
index, cache = int(sys.argv[1]), sys.argv[2]
data, path, hit = models.export_apart(models.TINY, 32, cache)
again = models.export_apart(models.TINY, 32, cache)
with vkml.Device(index) as dev:
    row = model_row(models.TINY, 32, data, dev, [OrtCpu(), TorchCpu()],
                    Budget(warmup=0, repeats=1), {"fma_gflops": 1.0, "shader_copy_gbs": 1.0},
                    cold=False)
print(json.dumps({"hit": [hit, again[2]], "same": again[0] == data, "row": row},
                 default=float))
"""


def test_cpu_peers_stay_out_of_the_bench_process(device, exported, tmp_path):
    """The bench's process measures vkml without ever importing torch or onnxruntime
    (their thread pools spin on the cores the CPU drivers use): the export, the FLOP
    count, the reference and both CPU peers run in child processes, and the row is
    whole: the same exported bytes as in this process, every output checked."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, "-c", _NO_PEERS_HERE, str(device.info.index),
                          str(tmp_path)], cwd=root, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["hit"] == [False, True] and out["same"]
    row = out["row"]
    assert row["vkml"]["status"] == "ok" and row["vkml"]["rel_err"] < 1e-4
    assert row["peers"]["onnxruntime-cpu"]["rel_err"] == 0.0
    torch_row = row["peers"]["torch-cpu"]
    assert torch_row["status"] == "ok" and torch_row["rel_err"] < 1e-4, torch_row
    assert row["conv_gemm_gflop"] * 1e9 == pytest.approx(hooked_flops(), rel=1e-9)
    with open(next(tmp_path.glob("unet-tiny-32-*.onnx")), "rb") as f:
        assert f.read() == exported


def test_hot_runs_are_enough_for_a_median():
    """Every row's hot figure is the median of at least MIN_HOT_RUNS runs, whatever a run
    lasts within the cap (a loaded machine's 0.8 s ResNet-18 too); fewer only for runs
    so slow that they would take over ``cap`` x the budget; ``--repeats`` fixes it."""
    from bench.cnn import worker_io
    from bench.cnn.cli import _parser

    args = _parser().parse_args(["--seconds", "1"])
    b = worker_io.budget(args.seconds, args.repeats)
    assert worker_io.MIN_HOT_RUNS >= 10
    assert b.count(0.8) == worker_io.MIN_HOT_RUNS and b.count(0.01) == 50
    assert b.count(0.09) == 11
    assert 1 <= b.count(5.0) < worker_io.MIN_HOT_RUNS
    assert worker_io.budget("1", "3").count(0.8) == 3


def test_device_limits_count_the_fma_kernel_in_cpu_time(device):
    """The FMA kernel's rate per second of process CPU time is measured beside its wall
    rate (``fma_cpu_gflops``: a CPU driver's work; on a GPU, host time only)."""
    from bench.cnn.cli import device_limits

    lim = device_limits(device)
    assert lim["fma_gflops"] > 0 and lim["shader_copy_gbs"] > 0
    assert lim["fma_cpu_gflops"] > 0


def test_stand_in_packages_answer_find_spec(monkeypatch):
    """The bare torchvision packages and stand-ins the model set puts in ``sys.modules``
    carry a module spec, so a later ``importlib.util.find_spec`` in the same process (a
    test asking whether torchvision is there) answers instead of raising."""
    import importlib.util
    import types

    monkeypatch.setitem(sys.modules, "vkml_bare_pkg", None)
    bare = models._bare("vkml_bare_pkg", os.path.dirname(__file__))
    assert importlib.util.find_spec("vkml_bare_pkg") is bare.__spec__
    assert bare.__path__ == bare.__spec__.submodule_search_locations
    plain = models._stand_in(types.ModuleType("vkml_plain_mod"))
    monkeypatch.setitem(sys.modules, "vkml_plain_mod", plain)
    assert importlib.util.find_spec("vkml_plain_mod") is plain.__spec__

"""``python -m bench models`` on a tiny model: a small U-Net (``bench/cnn/models.unet``,
32x32) exported by torch.onnx through the same code path as the model set, on every
device: the row's fields, vkml's and PyTorch's outputs against ONNX Runtime CPU, the
placement figures, and the FLOP count against one taken independently (forward hooks
on the torch modules).  Timings are never asserted, only that they exist."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from bench.cnn import flops, models, report                       # noqa: E402
from bench.cnn.peers import OrtCpu, TorchCpu                       # noqa: E402
from bench.cnn.run import model_row                                # noqa: E402
from bench.stats import Budget                                     # noqa: E402

SIZE = 32
TINY = models.ModelSpec("unet-tiny", lambda size: models.unet(base=4, depth=2), size=SIZE,
                        source=[models.__file__])
LIMITS = {"fma_gflops": 10.0, "shader_copy_gbs": 5.0}


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


def test_row(device, exported):
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
    assert vk["hot"]["n"] == 2 and vk["hot"]["median"] > 0
    assert vk["device_partitions"] >= 1
    assert vk["host_node_count"] == sum(e["count"] for op, e in vk["host_ops"].items()
                                        if op != "(fallback)")
    assert vk["strict"]["accepted"] == (vk["host_node_count"] == 0 and not vk["fallbacks"])
    if not vk["strict"]["accepted"]:
        assert vk["strict"]["refused_op"] in vk["host_ops"]
    peers = row["peers"]
    assert peers["onnxruntime-cpu"]["rel_err"] == 0.0
    assert peers["torch-cpu"]["status"] == "ok" and peers["torch-cpu"]["rel_err"] < 1e-4
    assert peers["torch-cpu"]["vkml_speedup"] > 0
    hot_s = vk["hot"]["median"] / 1e3
    assert row["fma_share"] == pytest.approx(row["conv_gemm_gflop"] / hot_s / 10.0)
    assert 0 < row["roofline_share"] == pytest.approx(row["roofline_ms"] / 1e3 / hot_s)
    md = report.markdown({"command": ["x"], "rows": [row]})
    assert "| unet-tiny | 32 |" in md


def test_rel_err():
    from bench.cnn.run import rel_err

    assert rel_err(np.array([1.0, 2.5]), np.array([1.0, 2.0])) == pytest.approx(0.25)
    assert rel_err(np.zeros(2), np.zeros(3)) == float("inf")

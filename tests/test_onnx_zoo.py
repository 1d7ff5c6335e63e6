"""vkml.onnx on more of the CNNs a user exports from PyTorch: torchvision's model
definitions (random weights, BatchNorms calibrated as the bench's models are), exported by
``torch.onnx.export`` as ``bench/cnn`` exports them (opset 17, constant folding), each
accepted with ``strict=True`` (every node on the device, no fallback) and matching ONNX
Runtime on the CPU to 1e-4 of the output's magnitude (float32), on every device.

Each model is torchvision's own class at a small input and, where its definition takes
one, a smaller width or depth (the same operator set, fewer channels and blocks), so the
file stays cheap on SwiftShader: ResNeXt (grouped convs, bottlenecks), MobileNetV3 small
and large (HardSwish, HardSigmoid, squeeze-excitation with ReLU), ShuffleNetV2 (channel
shuffle: Reshape/Transpose/Reshape, chunk as Slice, ReduceMean), DenseNet (Concat chains,
AveragePool), GoogLeNet and Inception v3 (Concat, MaxPool ceil_mode, AveragePool with
count_include_pad), MNASNet (ReduceMean), RegNetX/RegNetY (grouped convs, SE), SqueezeNet
1.0 (MaxPool ceil_mode), VGG-11 and AlexNet (their big Gemm classifiers behind the adaptive
average pool at 224, Dropout), EfficientNet (SiLU, SE with Sigmoid).  ``ops`` lists op
types the export must hold, so a case cannot pass by exporting something else.  And
MobileNetV2 and EfficientNet-B0 at full size with every tuning choice measured afresh
(``TUNED``): the kernels the tuner picks for real layers, on both drivers."""
from __future__ import annotations

import importlib.util
import io
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
if importlib.util.find_spec("torchvision") is None:
    pytest.skip("torchvision (the bench's models: VKML_SETUP_BENCH=1 tools/setup) is not "
                "installed", allow_module_level=True)

import vkml.onnx as vonnx  # noqa: E402
from bench.cnn import models  # noqa: E402
from helpers import slow  # noqa: E402
from onnx_helpers import ort_expected  # noqa: E402

TOL = 1e-4


def _tv(module):
    return models.torchvision_models(module)


@dataclass
class Case:
    build: object               # () -> an eval-mode torch module
    size: int                   # input 1x3xSIZExSIZE
    ops: tuple = ()             # op types the exported model must hold
    slow: str = ""              # why it runs on fast devices only (lavapipe), if it does


def _resnext():
    m = _tv("resnet")
    return m.ResNet(m.Bottleneck, [1, 1, 1, 1], groups=8, width_per_group=8, num_classes=10)


def _vgg11():
    m = _tv("vgg")
    # VGG-11's layer pattern at a fraction of its widths; the last stage keeps the 512
    # channels the 25088 x 4096 classifier reads (VGG's constructor fixes it)
    return m.VGG(m.make_layers([8, "M", 16, "M", 32, 32, "M", 64, 64, "M", 512, "M"]),
                 num_classes=10)


def _efficientnet():
    m = _tv("efficientnet")
    setting, last = m._efficientnet_conf("efficientnet_b1", width_mult=0.25, depth_mult=0.5)
    return m.EfficientNet(setting, 0.2, num_classes=10, last_channel=last)


def _regnet(se_ratio):
    m = _tv("regnet")
    params = m.BlockParams.from_init_params(depth=4, w_0=16, w_a=8.0, w_m=2.0, group_width=8,
                                            se_ratio=se_ratio)
    return m.RegNet(params, num_classes=10, stem_width=16)


#: the classifiers behind VGG's and AlexNet's adaptive pools (their inputs at least 224)
BIG = "a classifier of 60M to 100M weights: minutes on SwiftShader"

CASES = {
    "resnext": Case(_resnext, 32, ("Conv", "Add", "MaxPool", "GlobalAveragePool", "Gemm")),
    "mobilenet_v3_small": Case(lambda: _tv("mobilenetv3").mobilenet_v3_small(
        width_mult=0.5, num_classes=10), 32, ("HardSwish", "HardSigmoid", "Mul")),
    "mobilenet_v3_large": Case(lambda: _tv("mobilenetv3").mobilenet_v3_large(
        width_mult=0.5, num_classes=10), 32, ("HardSwish", "HardSigmoid", "Mul")),
    "shufflenet_v2": Case(lambda: _tv("shufflenetv2").ShuffleNetV2(
        [2, 2, 2], [8, 16, 32, 64, 128], num_classes=10), 32,
        ("Transpose", "Reshape", "Slice", "Concat", "ReduceMean")),
    "densenet": Case(lambda: _tv("densenet").DenseNet(
        growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16, bn_size=2,
        num_classes=10), 32, ("Concat", "AveragePool")),
    "googlenet": Case(lambda: _tv("googlenet").GoogLeNet(
        num_classes=10, aux_logits=False, init_weights=True), 32, ("Concat", "MaxPool")),
    "inception_v3": Case(lambda: _tv("inception").Inception3(
        num_classes=10, aux_logits=False, init_weights=True), 75, ("Concat", "AveragePool"),
        slow="Inception v3's fixed widths at its smallest input (75x75): about a minute on "
             "SwiftShader"),
    "mnasnet": Case(lambda: _tv("mnasnet").MNASNet(0.5, num_classes=10), 32, ("ReduceMean",)),
    "regnet_x": Case(lambda: _regnet(None), 32, ("Conv", "Add")),
    "regnet_y": Case(lambda: _regnet(0.25), 32, ("Sigmoid", "Mul")),
    "squeezenet1_0": Case(lambda: _tv("squeezenet").squeezenet1_0(num_classes=10), 48,
                          ("Concat", "MaxPool")),
    "vgg11": Case(_vgg11, 224, ("Gemm", "MaxPool"), slow=BIG),
    "alexnet": Case(lambda: _tv("alexnet").AlexNet(num_classes=10), 224, ("Gemm", "MaxPool"),
                    slow=BIG),
    "efficientnet": Case(_efficientnet, 32, ("Sigmoid", "Mul", "Conv")),
}


def _export(case: Case) -> onnx.ModelProto:
    """As ``bench.cnn.models.export``: seeded weights, BatchNorms calibrated, opset 17.
    torch runs on one thread here: its pool's threads, beside the test workers on a
    small machine, make the calibration passes many times slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(models.SEED)
        net = models.calibrate(case.build(), case.size)
        buf = io.BytesIO()
        with torch.no_grad():
            torch.onnx.export(net, (torch.randn(1, 3, case.size, case.size),), buf,
                              dynamo=False, opset_version=models.OPSET, input_names=["images"],
                              output_names=["output"], do_constant_folding=True)
    finally:
        torch.set_num_threads(threads)
    return onnx.load_from_string(buf.getvalue())


@pytest.fixture(scope="module")
def exported():
    """Each model exported once for the module (every device runs the same file)."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = _export(CASES[name])
        return cache[name]
    return get


@pytest.mark.parametrize("name", sorted(CASES))
def test_model(name, exported, device, speed):
    if CASES[name].slow and slow(speed):
        pytest.skip(f"beyond the suite's time budget on a slow device: {CASES[name].slow}")
    model = exported(name)
    ops = {n.op_type for n in model.graph.node}
    assert set(CASES[name].ops) <= ops, set(CASES[name].ops) - ops
    size = CASES[name].size
    x = np.random.default_rng(1).standard_normal((1, 3, size, size)).astype(np.float32)
    (want,) = ort_expected(model, {"images": x})
    rep = vonnx.prepare(model, device=device, strict=True)
    (got,) = rep.run([x])
    assert [where for where, _ in rep.partitions] == ["device"] and not rep.fallbacks
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert got.shape == want.shape and err < TOL, (name, err)
    rep.release()


#: Models at full size under the default tuning, each fast-list candidate timed afresh:
#: the kernels the tuner may choose for real layers (inputs beyond SwiftShader's 65536
#: single-float texels among them), where the cases above run small and untuned
TUNED = {"mobilenet_v2": Case(lambda: _tv("mobilenetv2").mobilenet_v2(), 224,
                              ("Conv", "Add", "Clip", "Gemm")),
         "efficientnet_b0": Case(lambda: _tv("efficientnet").efficientnet_b0(), 224,
                                 ("Conv", "Sigmoid", "Mul", "GlobalAveragePool"))}


@pytest.mark.parametrize("name", sorted(TUNED))
def test_tuned_model_at_full_size(name, device, tmp_path, monkeypatch):
    """MobileNetV2 and EfficientNet-B0 at 224x224, prepared with ``VKML_TUNE=fast`` in an
    empty tuning folder: every choice measured on this device, and the output ONNX
    Runtime's to 1e-4 of its magnitude."""
    from vkml import tuning
    t = tuning.Tuner("fast", folder=tmp_path)
    monkeypatch.setattr(tuning, "default_tuner", lambda: t)
    model = _export(TUNED[name])
    ops = {n.op_type for n in model.graph.node}
    assert set(TUNED[name].ops) <= ops, set(TUNED[name].ops) - ops
    x = np.random.default_rng(2).standard_normal((1, 3, 224, 224)).astype(np.float32)
    (want,) = ort_expected(model, {"images": x})
    rep = vonnx.prepare(model, device=device, strict=True)
    (got,) = rep.run([x])
    assert list(tmp_path.iterdir()), "nothing was tuned"
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert got.shape == want.shape and err < TOL, (name, err)
    rep.release()

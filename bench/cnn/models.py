"""The model set of ``python -m bench models``: CNNs built at bench time from their
torchvision / ultralytics definitions with random weights (a fixed seed; nothing is
downloaded), exported to ONNX once and cached in a git-ignored folder keyed by the
definition, so that re-runs skip the export.

torchvision's wheel here may be a build whose C++ operators cannot load against the
installed torch: its package ``__init__`` registers them, so only the model modules are
loaded, under bare stand-ins for the ``torchvision`` packages they import from.
ultralytics imports OpenCV at import time for its image I/O only; where ``cv2`` is not
installed a stand-in module takes its place (the network definition never calls it).
"""
from __future__ import annotations

import enum
import hashlib
import importlib
import importlib.machinery
import importlib.util
import io
import json
import os
import sys
import types
from dataclasses import dataclass, field

#: The folder exported models are cached in (git-ignored); $VKML_MODEL_CACHE overrides it.
CACHE = os.path.join(os.path.dirname(os.path.dirname(__file__)), ".models")
OPSET = 17
SEED = 0
#: BatchNorm calibration before export (:func:`calibrate`): forward passes, inputs per pass.
#: Part of the cache key, so a change re-exports.
CALIBRATION = {"passes": 4, "batch": 2}


@dataclass
class ModelSpec:
    """One model of the set: ``build(size)`` returns an eval-mode torch module (its
    BatchNorms calibrated: :func:`calibrated`); ``source`` names the files whose text keys
    the cache.  The export and the PyTorch peer both call ``build`` after seeding torch
    with :data:`SEED`, so they hold the same weights."""
    name: str
    build: object
    size: int = 224
    source: list = field(default_factory=list)


def _stand_in(m: types.ModuleType, path: str | None = None) -> types.ModuleType:
    """``m`` with a module spec (a package's where ``path`` is given), so that
    ``importlib.util.find_spec`` answers for it as for an imported module instead of
    raising (a module in ``sys.modules`` without ``__spec__``)."""
    m.__spec__ = importlib.machinery.ModuleSpec(m.__name__, None, is_package=path is not None)
    if path is not None:
        m.__spec__.submodule_search_locations = [path]
        m.__path__ = [path]
    return m


def _bare(name: str, path: str) -> types.ModuleType:
    m = _stand_in(types.ModuleType(name), path)
    sys.modules[name] = m
    return m


def torchvision_models(name: str):
    """``torchvision.models.<name>`` without running torchvision's package ``__init__``
    (which loads its C++ operators): bare packages, and stand-ins for the transform
    presets the weight enums mention."""
    full = f"torchvision.models.{name}"
    if full in sys.modules:
        return sys.modules[full]
    root = _torchvision_root()
    if root is None:
        raise ImportError("torchvision is not installed (pip install --no-deps "
                          "torchvision==<the version matching torch>)")
    if "torchvision.ops.misc" not in sys.modules:
        _bare("torchvision", root)
        _bare("torchvision.models", os.path.join(root, "models"))
        _bare("torchvision.transforms", os.path.join(root, "transforms"))
        presets = types.ModuleType("torchvision.transforms._presets")

        class _Preset:
            def __init__(self, *a, **k):
                pass
        for c in ("ImageClassification", "ObjectDetection", "SemanticSegmentation",
                  "VideoClassification", "OpticalFlow"):
            setattr(presets, c, _Preset)
        presets.InterpolationMode = enum.Enum(
            "InterpolationMode", "NEAREST NEAREST_EXACT BILINEAR BICUBIC BOX HAMMING LANCZOS")
        sys.modules[presets.__name__] = _stand_in(presets)
        ops = _bare("torchvision.ops", os.path.join(root, "ops"))
        ops.misc = importlib.import_module("torchvision.ops.misc")
        depth = importlib.import_module("torchvision.ops.stochastic_depth")
        ops.StochasticDepth = depth.StochasticDepth
    return importlib.import_module(full)


def _tv(module: str, fn: str):
    def build(size):
        return getattr(torchvision_models(module), fn)(weights=None).eval()
    return build


def _torchvision_root() -> str | None:
    mod = sys.modules.get("torchvision")
    if mod is not None and getattr(mod, "__path__", None):     # loaded, or our stand-in
        return list(mod.__path__)[0]
    spec = importlib.util.find_spec("torchvision")
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


def _tv_source(module: str) -> list:
    root = _torchvision_root()
    return [os.path.join(root, "models", module + ".py")] if root else []


def ultralytics_detection(cfg: str = "yolov8n.yaml"):
    """ultralytics' DetectionModel built from its own architecture file, random weights,
    its Detect head in export mode (the one tensor of boxes and class scores)."""
    if "cv2" not in sys.modules and importlib.util.find_spec("cv2") is None:
        class _NoCv2(types.ModuleType):
            def __getattr__(self, name):
                if name.startswith("__"):
                    raise AttributeError(name)
                return lambda *a, **k: None
        sys.modules["cv2"] = _stand_in(_NoCv2("cv2"))
    os.environ.setdefault("YOLO_CONFIG_DIR", os.path.join(_cache_dir(), "ultralytics"))
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics.nn.modules import Detect
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel(cfg, verbose=False).eval()
    for m in model.modules():
        if isinstance(m, Detect):
            m.export, m.format, m.dynamic = True, "onnx", False
    return model


def _yolo_source() -> list:
    spec = importlib.util.find_spec("ultralytics")
    if spec is None or spec.origin is None:
        return []
    root = os.path.dirname(spec.origin)
    return [os.path.join(root, "cfg", "models", "v8", "yolov8.yaml"),
            os.path.join(root, "nn", "tasks.py"), os.path.join(root, "nn", "modules", "head.py"),
            os.path.join(root, "nn", "modules", "block.py")]


def unet(base: int = 16, depth: int = 3):
    """A small U-Net: Conv+BN+ReLU pairs, MaxPool down, ConvTranspose up, a nearest
    Resize on the deepest skip, Concat skips."""
    import torch
    from torch import nn

    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            ch = [base * 2 ** i for i in range(depth + 1)]
            self.down = nn.ModuleList([block(3 if i == 0 else ch[i - 1], ch[i])
                                       for i in range(depth)])
            self.pool = nn.MaxPool2d(2)
            self.mid = block(ch[depth - 1], ch[depth])
            self.up = nn.ModuleList([nn.ConvTranspose2d(ch[i + 1], ch[i], 2, stride=2)
                                     for i in reversed(range(depth - 1))])
            self.resize = nn.Conv2d(ch[depth], ch[depth - 1], 1)
            self.dec = nn.ModuleList([block(2 * ch[i], ch[i]) for i in reversed(range(depth))])
            self.head = nn.Conv2d(ch[0], 2, 1)

        def forward(self, x):
            skips = []
            for d in self.down:
                x = d(x)
                skips.append(x)
                x = self.pool(x)
            x = self.mid(x)
            # the deepest step up is a nearest Resize (upsampling), the others ConvTranspose
            x = nn.functional.interpolate(self.resize(x), scale_factor=2.0, mode="nearest")
            x = self.dec[0](torch.cat([x, skips[-1]], 1))
            for up, dec, skip in zip(self.up, self.dec[1:], reversed(skips[:-1])):
                x = dec(torch.cat([up(x), skip], 1))
            return self.head(x)

    return UNet().eval()


def calibrate(model, size: int, passes: int | None = None, batch: int | None = None):
    """Set every BatchNorm's running mean and variance to the statistics of its own input
    on seeded N(0, 1) images of ``size``, so each normalizes to about N(0, 1) as in a
    trained net.  BatchNorm's defaults (mean 0, var 1) under random weights let some
    models' activations shrink layer after layer (MobileNetV2, EfficientNet-B0 to 1e-8
    and below, under float16's smallest subnormal), which no trained model does.  Only
    the BatchNorms run in train mode (``momentum=None``: the cumulative average over the
    passes), so dropout and stochastic depth stay off; the model is returned in eval mode."""
    import torch

    passes = passes or CALIBRATION["passes"]
    batch = batch or CALIBRATION["batch"]
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return model.eval()
    model.eval()
    kept = [bn.momentum for bn in bns]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
        bn.train()
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for _ in range(passes):
            model(torch.randn(batch, 3, size, size, generator=gen))
    for bn, m in zip(bns, kept):
        bn.momentum = m
    return model.eval()


def calibrated(build):
    """``build`` followed by :func:`calibrate` at the size asked for."""
    def calibrated_build(size):
        return calibrate(build(size), size)
    return calibrated_build


MODELS = [
    ModelSpec("resnet18", calibrated(_tv("resnet", "resnet18")), source=_tv_source("resnet")),
    ModelSpec("mobilenet_v2", calibrated(_tv("mobilenetv2", "mobilenet_v2")),
              source=_tv_source("mobilenetv2")),
    ModelSpec("squeezenet1_1", calibrated(_tv("squeezenet", "squeezenet1_1")),
              source=_tv_source("squeezenet")),
    ModelSpec("efficientnet_b0", calibrated(_tv("efficientnet", "efficientnet_b0")),
              source=_tv_source("efficientnet")),
    ModelSpec("yolov8n", calibrated(lambda size: ultralytics_detection()), size=640,
              source=_yolo_source()),
    ModelSpec("unet", calibrated(lambda size: unet()), size=224, source=[__file__]),
]


#: A tiny U-Net (32x32) for the tests: not in the model set, but found by :func:`by_name`,
#: which the child processes that build a model by name (PyTorch CPU, the export) use.
TINY = ModelSpec("unet-tiny", calibrated(lambda size: unet(base=4, depth=2)), size=32,
                 source=[__file__])


def by_name(name: str) -> ModelSpec:
    for m in [*MODELS, TINY]:
        if m.name == name:
            return m
    raise KeyError(name)


def _cache_dir() -> str:
    return os.environ.get("VKML_MODEL_CACHE") or CACHE


def cache_key(spec: ModelSpec, size: int) -> str:
    """A digest of what the exported model depends on: the definition files' text, the
    sizes, seed, opset and BatchNorm calibration, and torch's version (its exporter), read
    from its installed metadata: a cached model is found without importing torch."""
    h = hashlib.sha256(json.dumps([spec.name, size, SEED, OPSET, _torch_version(),
                                   CALIBRATION]).encode())
    for path in spec.source:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def _torch_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _path(spec: ModelSpec, size: int, cache: str | None) -> str:
    return os.path.join(cache or _cache_dir(), f"{spec.name}-{size}-{cache_key(spec, size)}.onnx")


def export_apart(spec: ModelSpec, size: int | None = None, cache: str | None = None) -> tuple:
    """:func:`export`'s answer, the export itself (on a cache miss) in a child process
    (``python -m bench.cnn.models NAME SIZE FOLDER``): the bench's process, which measures
    vkml, never imports torch, whose thread pool would compete with the CPU drivers'
    threads there."""
    import subprocess

    size = size or spec.size
    path = _path(spec, size, cache)
    hit = os.path.exists(path)
    if not hit:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        res = subprocess.run([sys.executable, "-m", "bench.cnn.models", spec.name, str(size),
                              cache or _cache_dir()], cwd=root, capture_output=True, text=True)
        if res.returncode != 0 or res.stdout.strip().splitlines()[-1:] != [path]:
            raise RuntimeError(f"exporting {spec.name} in a child process failed: "
                               f"{res.stderr.strip()[-500:]}")
    with open(path, "rb") as f:
        return f.read(), path, hit


def export(spec: ModelSpec, size: int | None = None, cache: str | None = None) -> tuple:
    """(ONNX model bytes, path, whether it came from the cache) of ``spec`` at input
    1x3x``size``x``size`` (``spec.build``: BatchNorms calibrated), exported by
    TorchScript ``torch.onnx.export`` (no onnx simplifier), opset :data:`OPSET`, static
    shapes, constant folding on."""
    import torch

    size = size or spec.size
    folder = cache or _cache_dir()
    path = _path(spec, size, folder)
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read(), path, True
    torch.manual_seed(SEED)
    model = spec.build(size)
    x = torch.randn(1, 3, size, size)
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=OPSET,
                          input_names=["images"], output_names=["output"],
                          do_constant_folding=True)
    data = buf.getvalue()
    os.makedirs(folder, exist_ok=True)
    tmp = path + f".{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return data, path, False


if __name__ == "__main__":       # python -m bench.cnn.models NAME SIZE FOLDER: export_apart's
    name, size, folder = sys.argv[1:]
    print(export(by_name(name), int(size), folder)[1])

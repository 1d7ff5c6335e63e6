"""``python -m bench.cnn.tinygrad_worker MODEL.onnx X.npy Y.npy FIG.json DEVICE SECONDS REPEATS``:
tinygrad's figures for one model (``peers.TinygradWebGpu``), run by the peers'
virtualenv: tinygrad's own ONNX runner (``tinygrad.nn.onnx.OnnxRunner``; older releases
kept it in ``extra.onnx``, which no wheel ships) on its WEBGPU device, which is Dawn
(the ``dawn-python`` wheel's library) on its Vulkan backend.  The model runs under
``TinyJit``, as tinygrad's own ONNX benchmark runs it: its first call compiles, the
second captures the kernels, later calls replay them."""
from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np

from .worker_io import Absent, answer, measure, same_device


def dawn_library() -> str:
    """The Dawn library inside the ``dawn-python`` wheel (tinygrad looks for a system
    ``libwebgpu_dawn.so`` unless $WEBGPU_PATH names one)."""
    spec = importlib.util.find_spec("pydawn")
    if spec is None or not spec.submodule_search_locations:
        raise Absent("dawn-python is not installed in the peers' virtualenv")
    path = os.path.join(list(spec.submodule_search_locations)[0], "lib",
                        "libwebgpu_dawn_x86_64.so")
    if not os.path.exists(path):
        raise Absent(f"dawn-python ships no {os.path.basename(path)} for this machine")
    return path


def adapter_name() -> tuple[str, str]:
    """(name, backend) of the adapter Dawn gives tinygrad: the same request as tinygrad's
    WebGpuDevice (high performance, $WEBGPU_BACKEND)."""
    from tinygrad.helpers import getenv
    from tinygrad.runtime import ops_webgpu as w
    from tinygrad.runtime.autogen import webgpu

    opts = webgpu.WGPURequestAdapterOptions(
        powerPreference=webgpu.WGPUPowerPreference_HighPerformance,
        backendType=w.backend_types.get(getenv("WEBGPU_BACKEND", ""), 0))
    try:
        adapter = w.InstanceRequestAdapter(w.instance, opts)
    except RuntimeError as exc:
        raise Absent(f"Dawn gives no WebGPU adapter: {exc}") from None
    info = webgpu.WGPUAdapterInfo()
    webgpu.wgpuAdapterGetInfo(adapter, info)
    webgpu.wgpuAdapterRelease(adapter)
    return (w.from_wgpu_str(info.device),
            webgpu.enum_WGPUBackendType.get(info.backendType, "?"))


def main(argv) -> int:
    model_p, xp, yp, figp, device, seconds, repeats = argv

    def work():
        # read by tinygrad when imported: its device, Dawn's backend, Dawn's library
        os.environ.setdefault("DEV", "WEBGPU")
        os.environ.setdefault("WEBGPU_BACKEND", "WGPUBackendType_Vulkan")
        os.environ.setdefault("WEBGPU_PATH", dawn_library())
        name, backend = adapter_name()
        if backend != "WGPUBackendType_Vulkan" or not same_device(name, device):
            raise Absent(f"Dawn's adapter for tinygrad is {name!r} ({backend}), not "
                         f"{device!r} (run with VK_ICD_FILENAMES naming its one driver)")
        from tinygrad import Device, Tensor, TinyJit, dtypes
        from tinygrad.nn.onnx import OnnxRunner

        if Device.DEFAULT != "WEBGPU":
            raise Absent(f"tinygrad's default device is {Device.DEFAULT}, not WEBGPU")

        def prepare():
            runner = OnnxRunner(model_p)
            feed = next(iter(runner.graph_inputs))
            jit = TinyJit(lambda **kw: next(iter(runner(kw).values())).cast(dtypes.float32),
                          prune=True)
            return lambda x: jit(**{feed: Tensor(x).realize()}).numpy()
        fig, y = measure(prepare, np.load(xp), seconds, repeats, settle=1,
                         files=(figp, yp))
        fig["adapter"] = name
        return fig, y
    return answer(figp, yp, work)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

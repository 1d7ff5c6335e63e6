"""``python -m bench.cnn.webgpu_worker MODEL.onnx X.npy Y.npy FIG.json DEVICE SECONDS REPEATS``:
ONNX Runtime WebGPU's figures for one model, run by the virtualenv that has the
``onnxruntime-webgpu`` wheel (``peers.OrtWebGpu``): prepare (session creation), first
run and hot runs (``worker_io.measure``, so a worker stopped by the time limit after its
first run still reports it); writes the output to Y.npy and the figures (or
``{"absent": why}``) to FIG.json.  Imports only NumPy, onnxruntime and ``bench.stats``."""
from __future__ import annotations

import sys

import numpy as np

from .worker_io import Absent, answer, measure


def main(argv) -> int:
    model, xp, yp, figp, device, seconds, repeats = argv

    def work():
        import onnxruntime as ort

        def prepare():
            so = ort.SessionOptions()
            so.add_session_config_entry("ep.webgpuexecutionprovider.dawnBackendType",
                                        "Vulkan")
            sess = ort.InferenceSession(model, so, providers=["WebGpuExecutionProvider"])
            if sess.get_providers()[0] != "WebGpuExecutionProvider":
                raise Absent(f"Dawn (onnxruntime-webgpu {ort.__version__}) found no WebGPU "
                             f"adapter it accepts on {device} (it runs CPU Vulkan drivers "
                             f"only as a fallback adapter, which this provider does not "
                             f"request)")
            name = sess.get_inputs()[0].name
            return lambda x: sess.run(None, {name: x})[0]
        return measure(prepare, np.load(xp), seconds, repeats, files=(figp, yp))
    return answer(figp, yp, work)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``python -m bench.cnn.webgpu_worker MODEL.onnx X.npy Y.npy FIG.json DEVICE SECONDS REPEATS``:
ONNX Runtime WebGPU's figures for one model, run by the virtualenv that has the
``onnxruntime-webgpu`` wheel (``peers.OrtWebGpu``): prepare (session creation), first
run and hot runs; writes the output to Y.npy and the figures (or ``{"absent": why}``) to
FIG.json.  Imports only NumPy, onnxruntime and ``bench.stats``."""
from __future__ import annotations

import json
import sys
import time

import numpy as np

from ..stats import Budget, Stats, sample


def main(argv) -> int:
    model, xp, yp, figp, device, seconds, repeats = argv
    import onnxruntime as ort

    x = np.load(xp)
    so = ort.SessionOptions()
    so.add_session_config_entry("ep.webgpuexecutionprovider.dawnBackendType", "Vulkan")
    t = time.perf_counter()
    sess = ort.InferenceSession(model, so, providers=["WebGpuExecutionProvider"])
    prep = time.perf_counter() - t
    if sess.get_providers()[0] != "WebGpuExecutionProvider":
        fig = {"absent": f"Dawn (onnxruntime-webgpu {ort.__version__}) found no WebGPU "
                         f"adapter it accepts on {device} (it runs CPU Vulkan drivers only "
                         f"as a fallback adapter, which this provider does not request)"}
        with open(figp, "w") as f:
            json.dump(fig, f)
        return 0
    name = sess.get_inputs()[0].name
    run = lambda: sess.run(None, {name: x})[0]      # noqa: E731
    t = time.perf_counter()
    y = run()
    first = time.perf_counter() - t
    budget = Budget(warmup=1, min_repeats=3, max_repeats=30, seconds=float(seconds),
                    repeats=int(repeats) or None, cap=4.0)
    hot = Stats.of(sample(run, budget))
    np.save(yp, np.asarray(y))
    with open(figp, "w") as f:
        json.dump({"prepare_s": prep, "first_s": first, "hot": hot.as_dict()}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

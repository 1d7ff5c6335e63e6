"""``python -m bench.cnn.cold_worker MODEL.onnx X.npy DEVICE``: vkml's cold-start figures for
one model in a fresh process, a child of ``python -m bench models`` (``run.cold_start``),
whose ``VKML_CACHE_DIR`` it inherits: an empty folder for the cold figure, the same folder
again for the warm one.  Prints one JSON line: importing vkml, ``vkml.onnx.prepare`` on
device index DEVICE and the first run, in seconds; ``cpu_s``, the process's CPU time over
prepare and first run (every thread: compiling pipelines, the driver's own), which a busy
machine inflates far less than the wall times; ``pipelines``, how many it compiled."""
from __future__ import annotations

import json
import resource
import sys
import time


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv) -> int:
    model, xp, device = argv
    t = time.perf_counter()
    import numpy as np

    import vkml
    import vkml.onnx
    imported = time.perf_counter() - t
    with open(model, "rb") as f:
        data = f.read()
    x = np.load(xp)
    with vkml.Device(int(device)) as dev:
        cpu = _cpu()
        t = time.perf_counter()
        rep = vkml.onnx.prepare(data, device=dev)
        prepared = time.perf_counter() - t
        t = time.perf_counter()
        rep.run([x])
        first = time.perf_counter() - t
        cpu = _cpu() - cpu
        made = dev.context.pipelines.created
        rep.release()
    print(json.dumps({"import_s": imported, "prepare_s": prepared, "first_s": first,
                      "cpu_s": cpu, "pipelines": made}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

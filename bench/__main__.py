"""``python -m bench``: run vkml's operators on a device, check them against NumPy and
time them next to NumPy.  (The full comparison tool grows here: see issue "The
performance comparison tool".)"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def _time(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> int:
    import vkml

    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="index or name substring (default: best)")
    ap.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    args = ap.parse_args(argv)
    print("Vulkan devices:")
    for info in vkml.devices():
        print(f"  {info}  api {info.api_version}")
    dev = vkml.Device(args.device)
    print(f"running on {dev}\n")
    reps = 5 if args.quick else 20
    shape = (1, 16, 128, 128) if args.quick else (1, 64, 256, 256)
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    print(f"{'workload':40s} {'vkml ms':>9s} {'numpy ms':>9s} {'ratio':>7s}  check")
    ok = True
    for mode, np_mode in (("constant", "constant"), ("edge", "edge"), ("reflection", "reflect"),
                          ("symmetric", "symmetric"), ("wrap", "wrap")):
        pads = [(0, 0), (0, 0), (2, 2), (2, 2)]
        got = vkml.pad(x, [p[0] for p in pads], [p[1] for p in pads], mode, device=dev)
        good = np.array_equal(got, np.pad(x, pads, np_mode))
        ok &= good
        tv = _time(lambda: vkml.pad(x, [0, 0, 2, 2], [0, 0, 2, 2], mode, device=dev), reps)
        tn = _time(lambda: np.pad(x, pads, np_mode), reps)
        print(f"{'pad ' + mode + ' ' + 'x'.join(map(str, shape)):40s} {tv * 1e3:9.2f} "
              f"{tn * 1e3:9.2f} {tn / tv:7.2f}  {'ok' if good else 'MISMATCH'}")
    dev.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

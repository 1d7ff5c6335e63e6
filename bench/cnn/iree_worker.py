"""``python -m bench.cnn.iree_worker MODEL.onnx X.npy Y.npy FIG.json DEVICE SECONDS REPEATS``:
IREE's figures for one model, in a child process of ``python -m bench models`` (which
bounds its time): prepare (import + compile + load), first run and hot runs on ``DEVICE``;
writes the output to Y.npy and the figures (or ``{"absent": why}``) to FIG.json."""
from __future__ import annotations

import json
import sys

import numpy as np

from ..runners import Absent
from ..stats import Budget
from .peers import IreeVulkan


class _Named:
    def __init__(self, name):
        self.info = type("Info", (), {"name": name})()


def main(argv) -> int:
    model, xp, yp, figp, device, seconds, repeats = argv
    from .run import timed

    with open(model, "rb") as f:
        data = f.read()
    x = np.load(xp)
    budget = Budget(warmup=1, min_repeats=3, max_repeats=30, seconds=float(seconds),
                    repeats=int(repeats) or None, cap=4.0)
    try:
        fig, y = timed(lambda: IreeVulkan().prepare(None, data, 0, _Named(device)), x, budget)
    except Absent as exc:
        fig, y = {"absent": str(exc)}, None
    if y is not None:
        np.save(yp, np.asarray(y))
    with open(figp, "w") as f:
        json.dump(fig, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

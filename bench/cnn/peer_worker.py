"""``python -m bench.cnn.peer_worker PEER MODEL.onnx X.npy Y.npy FIG.json DEVICE SECONDS
REPEATS``: one in-tree peer's figures for one model (``PEER``: its name in
:data:`.peers.PEERS`, e.g. ``iree-vulkan``, ``ncnn-vulkan``), in a child process of
``python -m bench models`` (which bounds its time, and keeps the peer's own Vulkan device
out of the process that measures vkml): prepare, first run and hot runs on ``DEVICE``
(the input's last size is the model's); writes the output to Y.npy and the figures (or
``{"absent": why}``) to FIG.json."""
from __future__ import annotations

import json
import sys

import numpy as np

from ..runners import Absent
from .peers import PEERS
from .worker_io import measure


class _Named:
    def __init__(self, name):
        self.info = type("Info", (), {"name": name})()


def main(argv) -> int:
    name, model, xp, yp, figp, device, seconds, repeats = argv
    peer = next(p for p in PEERS if p.name == name)
    with open(model, "rb") as f:
        data = f.read()
    x = np.load(xp)
    try:
        fig, y = measure(lambda: peer.prepare(None, data, x.shape[-1], _Named(device)), x,
                         seconds, repeats)
        if getattr(peer, "note", ""):
            fig["note"] = peer.note
    except Absent as exc:
        fig, y = {"absent": str(exc)}, None
    if y is not None:
        np.save(yp, np.asarray(y))
    with open(figp, "w") as f:
        json.dump(fig, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

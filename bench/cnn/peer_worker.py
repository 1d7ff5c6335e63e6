"""``python -m bench.cnn.peer_worker PEER MODEL.onnx X.npy Y.npy FIG.json DEVICE SECONDS
REPEATS [SPEC THREADS]``: one in-tree peer's figures for one model (``PEER``: its name in
:data:`.peers.PEERS`, e.g. ``onnxruntime-cpu``, ``torch-cpu``, ``iree-vulkan``,
``ncnn-vulkan``), in a child process of ``python -m bench models`` (which bounds its
time, and keeps the peer's own Vulkan device and thread pools out of the process that
measures vkml): prepare, first run and hot runs on ``DEVICE`` (the input's last size is
the model's); writes the output to Y.npy and the figures (or ``{"absent": why}``) to
FIG.json.  The CPU peers add ``SPEC`` (the model's name for ``models.by_name``, ``-`` for
none) and ``THREADS`` (``peers.CPU_THREADS``)."""
from __future__ import annotations

import json
import sys

import numpy as np

from ..runners import Absent
from . import peers as peers_mod
from .peers import PEERS
from .worker_io import measure


class _Named:
    def __init__(self, name):
        self.info = type("Info", (), {"name": name})()


def main(argv) -> int:
    name, model, xp, yp, figp, device, seconds, repeats, *rest = argv
    peer = next(p for p in PEERS if p.name == name)
    spec = None
    if rest:
        from .models import by_name

        try:
            spec = by_name(rest[0])
        except KeyError:                 # a model outside the set: only PyTorch needs it
            spec = None
        peers_mod.CPU_THREADS[0] = int(rest[1])
    with open(model, "rb") as f:
        data = f.read()
    x = np.load(xp)
    try:
        fig, y = measure(lambda: peer.prepare(spec, data, x.shape[-1], _Named(device)), x,
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

"""The device's store width, chosen by its own timing (``glsl/store_probe.comp``).

Kernels that can write eight float32 as one ``u64vec4`` (int64 shaders) instead of two
float4 stores ask :func:`wide_stores`: a tunable path (:mod:`vkml.tuning`) that times a
store-only kernel writing the same bytes both ways, once per device and driver, and keeps
the faster.  On lavapipe a storage-buffer store takes a turn per lane and a scalar store
per component within it, so the 64-bit form is faster (docs/DEVELOPING.md, "u64vec4
stores"); a device without int64 shaders, or tuning off, stores float4s.  The kernels'
own candidates force either form (``store64``: True/False) for tests and the tuner.
"""
from __future__ import annotations

import numpy as np

from .. import tuning
from ..runtime import Bind
from ..runtime.blocks import pack
from ..intmath import ceil_div

#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = {"store_probe_vec4": ("LOCAL_SIZE_X", "R"), "store_probe_u64": ("LOCAL_SIZE_X", "R")}
#: Bytes the probe writes (large enough to hide the dispatch, small enough to be cheap).
PROBE_BYTES = 2 << 20
_RUNS = 4              # 32-byte runs an invocation writes
_LOCAL = 64
#: u64vec4 stores unless float4 stores were faster by more than this factor: a tie goes
#: to the form with half the store components (a probe taken while the machine is busy
#: can read a tie, and would turn the wide stores off for that device's whole cache).
TIE = 1.1


def _run(device, seq, cand, _shape):
    """Record the probe of candidate ``cand`` ("vec4" or "u64vec4") into ``seq``."""
    u64 = cand.name == "u64vec4"
    if u64 and not device.features.get("int64"):
        raise tuning.Declined("u64vec4 stores need int64 shaders")
    y = device.empty((PROBE_BYTES // 4,), np.float32)
    lanes = PROBE_BYTES // (32 * _RUNS)
    pipe = device.context.pipelines.variant("store_probe_u64" if u64 else "store_probe_vec4",
                                            {"LOCAL_SIZE_X": _LOCAL, "R": _RUNS})
    seq.dispatch(pipe, [Bind(y.allocation, 0, PROBE_BYTES, "w")], (ceil_div(lanes, _LOCAL), 1, 1),
                 pack(pipe.name, "push", lanes=lanes, seed=1.0))
    return y.free


#: The tunable path ``store_width``: one shape class (the device).
PATH = tuning.register_path("store_width", ["vec4", "u64vec4"], "vec4",
                            lambda _shape: "device", _run, examples=["device"])


def wide_stores(device) -> bool:
    """Whether kernels store eight float32 as one u64vec4 on ``device``: it has int64
    shaders and its own timing of :data:`PATH` found that no slower than float4 stores
    (within :data:`TIE`; measured once, stored
    with the tuner's choices, every mode but off timing it as ``full`` does); False with
    ``VKML_TUNE=off`` (the documented default)."""
    if not device.features.get("int64"):
        return False
    # every round of the full mode: the probe's runs cost little next to compiling the
    # two probes, and fast mode's few rounds have picked either on lavapipe
    c = tuning.reference(device, PATH, "device", mode="full")
    if c is None:
        return False
    t = c.times or {}
    if t.get("u64vec4") and t.get("vec4"):
        return t["u64vec4"] <= TIE * t["vec4"]
    return c.name == "u64vec4"

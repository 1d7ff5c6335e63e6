"""Shared fixtures: every test that takes ``device`` runs on every Vulkan device present.

``VKML_REQUIRE_DEVICES`` (comma-separated name substrings, set by ``tools/test`` to
"llvmpipe,SwiftShader") makes the session fail when one of them is missing: no silent
skip.  With ``VKML_VALIDATION=1`` any validation-layer error or warning fails the test
that caused it.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

import vkml
from vkml import runtime

INFOS = vkml.devices()


def _short(info) -> str:
    name = info.name.split(" (")[0].split()[0]
    return f"{info.index}-{name}"


def pytest_sessionstart(session):
    required = [r.strip() for r in os.environ.get("VKML_REQUIRE_DEVICES", "").split(",") if r.strip()]
    names = [d.name for d in INFOS]
    missing = [r for r in required if not any(r.lower() in n.lower() for n in names)]
    if missing:
        pytest.exit(f"required Vulkan devices missing: {missing}; present: {names}", returncode=3)


_OPEN: dict[int, vkml.Device] = {}


def open_device(index: int) -> vkml.Device:
    dev = _OPEN.get(index)
    if dev is None or dev._closed:
        dev = _OPEN[index] = vkml.Device(index)
    return dev


@pytest.fixture(scope="session", params=[d.index for d in INFOS], ids=[_short(d) for d in INFOS])
def device(request) -> vkml.Device:
    """A device per Vulkan driver present (session-wide)."""
    return open_device(request.param)


_SPEED: dict[int, float] = {}


@pytest.fixture(scope="session")
def speed(device) -> float:
    """Device seconds (GPU timestamps, so the validation layer's host overhead does not
    count) to pad 1M float32 elements with the kernel alone; tests size their work by it
    (SwiftShader's arithmetic is ~50x slower than lavapipe's)."""
    if device.index not in _SPEED:
        from vkml.ops.padding import CompiledPadding

        d_in = vkml.dml.TensorDesc("float32", (1024, 1024))
        d_out = vkml.dml.TensorDesc("float32", (1026, 1026))
        op = CompiledPadding(device, vkml.dml.PaddingOperatorDesc(d_in, d_out, "reflection",
                                                                  0.0, (1, 1), (1, 1)),
                             path="kernel")
        x, y = device.empty((1024, 1024)), device.empty((1026, 1026))
        times = []
        for _ in range(3):
            with device.sequence(timed=True) as seq:
                op.record(seq, [x], [y])
                t = time.perf_counter()
                seq.run()
                times.append(seq.gpu_time_ns * 1e-9 if seq.gpu_time_ns else
                             time.perf_counter() - t)
        op.release()
        _SPEED[device.index] = min(times)
    return _SPEED[device.index]


@pytest.fixture(scope="session")
def budget(speed) -> int:
    """How many randomized cases a test may afford on this device (fast device: many)."""
    return 8 if speed > 0.2 else 40


@pytest.fixture(autouse=True)
def _validation_clean():
    runtime.validation_messages.clear()
    yield
    if runtime.validation_messages:
        msgs = "\n".join(f"[{lvl}] {text}" for lvl, text in runtime.validation_messages[:5])
        runtime.validation_messages.clear()
        pytest.fail(f"Vulkan validation layer reported:\n{msgs}")


def pytest_sessionfinish(session, exitstatus):
    for dev in _OPEN.values():
        dev.close()

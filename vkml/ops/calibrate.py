"""One-time measurements that choose between padding's three paths (element kernel, rows
kernel, copy engine for the interior), per device.

Measured on the device itself (GPU timestamps where it has them, else wall time), the
first time an operator asks, then kept in memory and in the cache folder next to the
pipeline cache.  Nothing here looks at a device's name.

Each path is timed on two float32 paddings with the same bytes and different row counts
(4096 rows of 256 elements and 256 of 4096, padded by 2 on each side of the rows) and on
a tiny one, and modelled as ``seconds = fixed + per_row * rows + per_byte * output bytes``
(rows: copy regions for the copy engine, which on lavapipe pays ~0.25 us per region).  The
fast paths are timed at 16 MiB, the element kernel at 4 MiB: lavapipe's copy engine moves
4 MiB at 0.07 ns/byte (cache) but 64 MiB at 0.14, the rows kernel 0.14-0.16 at both.

The file is input, not trusted (:mod:`vkml.runtime.cache`): one that is not exactly
``{"version": VERSION, "padding_paths": {features: {path: [fixed, per_row, per_byte]}}}``
with finite costs in ``[0, MAX_COST_S]`` is ignored, measured again and replaced.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from ..runtime import cache
from ..runtime.cache import cache_dir

VERSION = 5
#: The largest cost a calibration file may hold for one term (seconds; per row and per
#: byte too): measured ones are micro- to milliseconds, so anything above is corrupt.
MAX_COST_S = 60.0
_lock = threading.Lock()
#: (rows, elements per row) of the two float32 paddings each path is timed on.
_SHAPES = ((4096, 256), (256, 4096))
_SCALE = {"kernel": 1, "rows": 4, "copy": 4}     # rows multiplied by this
_PAD = 2
PATHS = ("kernel", "rows", "copy")


def _path(info):
    folder = cache_dir()
    if folder is None:
        return None
    return folder / (f"calibration-{info.vendor_id:04x}-{info.device_id:04x}-"
                     f"{info.driver_version:08x}-{info.pipeline_cache_uuid}.json")


def path_costs(device) -> dict:
    """``{path: (fixed_s, per_row_s, per_byte_s)}`` for the padding paths this device can
    take (see the module doc)."""
    ctx = device._ctx
    found = getattr(ctx, "_padding_costs", None)
    if found is not None:
        return found
    with _lock:
        found = getattr(ctx, "_padding_costs", None)
        if found is None:
            found = _load(ctx) or _measure(device)
            ctx._padding_costs = found
    return found


def _key(ctx) -> str:
    """Measurements depend on the kernels a device gets, hence on its enabled features."""
    return ",".join(sorted(k for k, v in ctx.features.items() if v))


def _valid(data: dict) -> bool:
    """The calibration file's schema (see the module doc)."""
    paths = data["padding_paths"]
    return (set(data) == {"version", "padding_paths"} and isinstance(paths, dict)
            and all(isinstance(key, str) and isinstance(costs, dict)
                    and all(p in PATHS and isinstance(c, list) and len(c) == 3
                            and all(cache.is_number(v, 0.0, MAX_COST_S) for v in c)
                            for p, c in costs.items())
                    for key, costs in paths.items()))


def _load(ctx):
    path = _path(ctx.info)
    if path is None:
        return None
    data = cache.read_json(path, VERSION, _valid)
    found = data["padding_paths"].get(_key(ctx)) if data else None
    return {k: tuple(float(x) for x in v) for k, v in found.items()} if found else None


def _store(ctx, costs: dict) -> None:
    """Add this device's costs to its calibration file (atomically; an invalid file is
    replaced, valid entries of other feature sets are kept)."""
    path = _path(ctx.info)
    if path is None:
        return

    def change(data):
        data.setdefault("padding_paths", {})[_key(ctx)] = {
            k: [float(x) for x in v] for k, v in costs.items()}
    cache.update_json(path, VERSION, _valid, change)


def _timed(ctx, record, reps: int = 5) -> float:
    """The fastest of ``reps`` runs after a warm-up (other load only adds time)."""
    times = []
    for _ in range(reps + 1):
        with ctx.sequence(timed=True) as seq:
            record(seq)
            t0 = time.perf_counter()
            seq.run()
            wall = time.perf_counter() - t0
            times.append(seq.gpu_time_ns * 1e-9 if seq.gpu_time_ns else wall)
    return min(times[1:])


def _measure(device) -> dict:
    from .padding import CompiledPadding

    ctx = device._ctx
    texels = ctx.limits["maxTexelBufferElements"]
    costs = {}
    for path in PATHS:
        cls = type(f"Only_{path}", (CompiledPadding,), {"path": path})   # not registered
        points = []
        for rows, width in ((2, 64),) + tuple((r * _SCALE[path], w) for r, w in _SHAPES):
            if path == "rows":      # the input is bound as 16-byte texels: shrink to fit
                rows = min(rows, max(1, texels * 4 // width))
            t = _time_padding(device, cls, rows, width)
            if t is None:
                break               # the device cannot take this path
            points.append((rows, rows * (width + 2 * _PAD) * 4, t))
        if len(points) < 3:
            continue
        fixed = points[0][2]
        a = np.array([p[:2] for p in points[1:]], dtype=np.float64)
        per_row, per_byte = np.linalg.lstsq(a, np.array([p[2] - fixed for p in points[1:]]),
                                            rcond=None)[0]
        costs[path] = (fixed, max(float(per_row), 0.0), max(float(per_byte), 1e-13))
    _store(ctx, costs)
    return costs


def _time_padding(device, cls, rows: int, width: int) -> float | None:
    """Device seconds of ``cls`` padding float32 (rows, width) by _PAD on each side of the
    rows (reflection), or None where it falls back to another path."""
    from ..dml.padding import PaddingOperatorDesc
    from ..dml.tensor_desc import TensorDesc

    out = (rows, width + 2 * _PAD)
    op = cls(device, PaddingOperatorDesc(TensorDesc("float32", (rows, width)),
                                         TensorDesc("float32", out), "reflection", 0.0,
                                         (0, _PAD), (0, _PAD)))
    src = device.tensor(np.zeros((rows, width), np.float32))    # touched: no page faults
    dst = device.tensor(np.zeros(out, np.float32))
    try:
        if (cls.path == "rows" and op.rows is None) or (cls.path == "copy"
                                                         and op.copy_regions is None):
            return None
        return _timed(device._ctx, lambda seq: op.encode(seq, [src], [dst]))
    finally:
        op.release()
        src.free()
        dst.free()

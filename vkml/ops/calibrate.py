"""One-time measurements that choose between the copy engine and kernels, per device.

Measured on the device itself (GPU timestamps where it has them, else wall time), the
first time an operator asks, then kept in memory and in the cache folder next to the
pipeline cache.  Nothing here looks at a device's name.
"""
from __future__ import annotations

import json
import statistics
import threading
import time

import numpy as np

from ..runtime.pipelines import cache_dir

VERSION = 4
_lock = threading.Lock()
_SIZE = 4 << 20
_REGIONS = 4096


def _path(info):
    folder = cache_dir()
    if folder is None:
        return None
    return folder / (f"calibration-{info.vendor_id:04x}-{info.device_id:04x}-"
                     f"{info.driver_version:08x}-{info.pipeline_cache_uuid}.json")


def copy_costs(device) -> dict:
    """Seconds per byte of the padding kernels (element and rows) and of
    ``vkCmdCopyBuffer``, seconds per copy region, and the fixed cost of a dispatch and of a
    copy command."""
    ctx = device._ctx
    found = getattr(ctx, "_copy_costs", None)
    if found is not None:
        return found
    with _lock:
        found = getattr(ctx, "_copy_costs", None)
        if found is None:
            found = _load(ctx) or _measure(device)
            ctx._copy_costs = found
    return found


def _key(ctx) -> str:
    """Measurements depend on the kernels a device gets, hence on its enabled features."""
    return ",".join(sorted(k for k, v in ctx.features.items() if v))


def _read(path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if data.get("version") == VERSION else {}


def _load(ctx):
    path = _path(ctx.info)
    if path is None or not path.exists():
        return None
    return _read(path).get("copy_costs", {}).get(_key(ctx))


def _timed(ctx, record, reps: int = 3) -> float:
    times = []
    for _ in range(reps + 1):
        with ctx.sequence(timed=True) as seq:
            record(seq)
            t0 = time.perf_counter()
            seq.run()
            wall = time.perf_counter() - t0
            times.append(seq.gpu_time_ns * 1e-9 if seq.gpu_time_ns else wall)
    return statistics.median(times[1:])


def _measure(device) -> dict:
    from ..dml.padding import PaddingOperatorDesc
    from ..dml.tensor_desc import TensorDesc
    from .padding import CompiledPadding

    class KernelOnly(CompiledPadding):      # not registered: calibration only
        path = "kernel"

    class RowsOnly(CompiledPadding):
        path = "rows"

    ctx = device._ctx
    src = device.empty(_SIZE // 4, np.float32)
    dst = device.empty(_SIZE // 4, np.float32)
    ops = []
    try:
        def kernel_time(count, cls=KernelOnly):
            d = TensorDesc("float32", (count,))
            op = cls(device, PaddingOperatorDesc(d, d, "constant", 0.0, (0,), (0,)))
            ops.append(op)
            if cls is RowsOnly and op.rows is None:
                return None                 # the device cannot bind it as texels
            return _timed(ctx, lambda seq: op.encode(seq, [src], [dst]))

        t_small = kernel_time(16)
        t_kernel = kernel_time(_SIZE // 4)
        t_rows = kernel_time(_SIZE // 4, RowsOnly)
        a, b = src._alloc, dst._alloc
        c_small = _timed(ctx, lambda seq: seq.copy(a, b, [(0, 0, 64)]))
        c_one = _timed(ctx, lambda seq: seq.copy(a, b, [(0, 0, _SIZE)]))
        step = _SIZE // _REGIONS
        regions = np.array([[i * step, i * step, step] for i in range(_REGIONS)])
        c_many = _timed(ctx, lambda seq: seq.copy_array(a, b, regions))
    finally:
        for op in ops:
            op.release()
        src.free()
        dst.free()
    costs = {
        "dispatch_s": t_small,
        "kernel_s_per_byte": max(t_kernel - t_small, 1e-12) / _SIZE,
        "copy_s": c_small,
        "copy_s_per_byte": max(c_one - c_small, 1e-12) / _SIZE,
        "copy_s_per_region": max(c_many - c_one, 0.0) / _REGIONS,
    }
    if t_rows is not None:
        costs["rows_s_per_byte"] = max(t_rows - t_small, 1e-12) / _SIZE
    path = _path(ctx.info)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            data = _read(path) if path.exists() else {}
            data["version"] = VERSION
            data.setdefault("copy_costs", {})[_key(ctx)] = costs
            path.write_text(json.dumps(data, indent=1))
        except OSError:
            pass
    return costs

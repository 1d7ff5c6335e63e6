"""The device's own limits, measured in the same run as the workloads.

Microkernels (``glsl/bench_*.comp``, shipped as ``vkml/shaders/bench_*.spv``) measure
float32 FMA throughput and compute-shader copy bandwidth; ``vkCmdCopyBuffer`` gives the
copy engine's bandwidth.  Host-side figures: the CPU's own copy bandwidth, and vkml's
upload/download bandwidth next to it.  The hot-path figures measure what a submission
costs: a replayed recorded sequence, and many tiny paddings batched into one submit.

Bandwidths count bytes read plus bytes written (a copy of N bytes moves 2N), the same
convention as the workloads' GB/s, so a workload's percentage of a limit is like for like.
GPU time comes from timestamp queries where the device has them, else wall time.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

import vkml
from vkml.runtime import FORMAT_RGBA32_UINT, STORAGE, UNIFORM_TEXEL, Bind
from vkml.intmath import ceil_div
from vkml.ops.grid import grid_cap
from vkml.runtime.blocks import pack

_LOCAL = 64
_PER = 4                  # uvec4s per invocation in bench_copy.comp
_FMA_ITERS = 64
_FMA_FLOPS_PER_INVOCATION = _FMA_ITERS * 8 * 4 * 2   # ITERS x chains x vec4 x (mul+add)

#: The hot-path and transfer goals on lavapipe (shown next to the figures).
TARGETS = {"replay_us_per_submit": 80.0, "batched_us_per_padding": 40.0,
           "functional_tiny_pad_us": 60.0,
           "upload_vs_cpu_copy": 0.5, "download_vs_cpu_copy": 0.5}


def _timed_runs(ctx, record, reps: int, cpu: list | None = None) -> tuple[list[float], list[float]]:
    """Record once into a timed sequence, run it ``reps`` times after one warm-up run:
    (GPU seconds per run or [] without timestamps, wall seconds per run); ``cpu``, where
    given, gets each run's process CPU seconds (every thread: a CPU driver's work)."""
    gpu, wall = [], []
    with ctx.sequence(timed=True) as seq:
        record(seq)
        seq.run()
        for _ in range(reps):
            t, c = time.perf_counter(), time.process_time()
            seq.run()
            wall.append(time.perf_counter() - t)
            if cpu is not None:
                cpu.append(time.process_time() - c)
            if seq.gpu_time_ns:
                gpu.append(seq.gpu_time_ns * 1e-9)
    return gpu, wall


def _best_time(gpu, wall) -> float:
    return min(gpu) if gpu else min(wall)


def _grid(groups: int, max_x: int) -> tuple[int, int]:
    gx = max(1, min(groups, max_x))
    return gx, ceil_div(groups, gx)


def _record_fma(seq, pipe, out, groups: int, local: int, max_x: int) -> None:
    """Record one bench_fma dispatch of ``groups`` workgroups of ``local`` invocations."""
    gx, gy = _grid(groups, max_x)
    push = pack("bench_fma", "push", mul=0.999999, add=1e-6, count=groups * local,
                row=gx * local)
    seq.dispatch(pipe, [Bind(out, 0, out.size, "w")], (gx, gy, 1), push)


def fma_gflops(dev, target_s: float = 0.05, reps: int = 3) -> dict:
    """Float32 FMA throughput: for each workgroup size, grow the grid until one dispatch
    lasts ``target_s``; the best of them."""
    ctx = dev.context
    lim = ctx.limits
    max_local = min(lim["maxComputeWorkGroupInvocations"], lim["maxComputeWorkGroupSize"][0])
    max_x = grid_cap(lim["maxComputeWorkGroupCount"][0])
    max_y = lim["maxComputeWorkGroupCount"][1]
    out = ctx.allocate(65536 * 16)
    best = None
    try:
        for local in sorted({min(n, max_local) for n in (64, 256)}):
            pipe = ctx.pipelines.get("bench_fma", (STORAGE,), 16, {0: local, 1: _FMA_ITERS})
            groups = max(1, 1024 // local)
            while True:
                gy = _grid(groups, max_x)[1]

                def record(seq, pipe=pipe, groups=groups, local=local):
                    _record_fma(seq, pipe, out, groups, local, max_x)

                cpu: list = []
                gpu, wall = _timed_runs(ctx, record, reps, cpu)
                t = _best_time(gpu, wall)
                if t >= target_s or gy * 4 > max_y:
                    break
                groups *= max(2, min(16, int(target_s / max(t, 1e-6))))
            flops = groups * local * _FMA_FLOPS_PER_INVOCATION
            if best is None or flops / t > best["gflops"] * 1e9:
                best = {"gflops": flops / t / 1e9, "flops": flops, "seconds": t,
                        "invocations": groups * local, "local_size": local,
                        "timer": "gpu" if gpu else "wall", "cpu_seconds": min(cpu)}
        return best
    finally:
        out.free()


def _copy_windows(size: int, window: int):
    off = 0
    while off < size:
        n = min(window, size - off)
        yield off, n
        off += n


def _copy_paths(ctx) -> list:
    """(variant, descriptor kind, bytes one binding may span) of each bench_copy read path."""
    lim = ctx.limits
    paths = [("ssbo", STORAGE, lim["maxStorageBufferRange"]),
             ("texel", UNIFORM_TEXEL, lim["maxTexelBufferElements"] * 16)]
    if ctx.features.get("int64"):        # stores of 32 bytes (bench_copy.comp, U64)
        paths.append(("texel_u64", UNIFORM_TEXEL, lim["maxTexelBufferElements"] * 16))
    return paths


def _record_copy(seq, pipe, src, dst, size: int, window: int, fmt, local: int, max_x: int):
    """Record bench_copy of ``size`` bytes from ``src`` to ``dst``, one dispatch per
    ``window`` bytes (a binding's range is bounded)."""
    for off, n in _copy_windows(size, window):
        count = n // 16
        gx, gy = _grid(ceil_div(count, (local * _PER)), max_x)
        push = pack(pipe.name, "push", count=count, row=gx * local)
        seq.dispatch(pipe, [Bind(src, off, n, "r", fmt), Bind(dst, off, n, "w")],
                     (gx, gy, 1), push)


def shader_copy_gbs(dev, size: int, reps: int = 3) -> dict:
    """Compute-shader copy bandwidth of each read path (SSBO, uniform texel buffer; and
    texel reads with 32-byte u64vec4 stores where the device has int64 shaders), the best
    of a few workgroup sizes each."""
    ctx = dev.context
    lim = ctx.limits
    max_local = min(lim["maxComputeWorkGroupInvocations"], lim["maxComputeWorkGroupSize"][0])
    locals_ = sorted({min(n, max_local) for n in (64, 256)})
    max_x = grid_cap(lim["maxComputeWorkGroupCount"][0])
    src, dst = ctx.allocate(size), ctx.allocate(size)
    out = {}
    check = np.empty(size // 4, np.uint32)
    try:
        ctx.write(src, np.arange(size // 4, dtype=np.uint32))
        for variant, kind, limit in _copy_paths(ctx):
            window = max(1 << 16, (min(size, limit) >> 16) << 16)
            fmt = FORMAT_RGBA32_UINT if kind == UNIFORM_TEXEL else 0
            for local in locals_:
                pipe = ctx.pipelines.get(f"bench_copy_{variant}", (kind, STORAGE), 8, {0: local})

                def record(seq, pipe=pipe, window=window, fmt=fmt, local=local):
                    _record_copy(seq, pipe, src, dst, size, window, fmt, local, max_x)

                try:
                    gpu, wall = _timed_runs(ctx, record, reps)
                except vkml.VkmlError as exc:        # a path this device cannot bind
                    out[variant] = {"error": str(exc)}
                    break
                t = _best_time(gpu, wall)
                if variant not in out or out[variant]["seconds"] > t:
                    out[variant] = {"gbs": 2 * size / t / 1e9, "seconds": t, "local_size": local,
                                    "window": window}
            if "gbs" in out.get(variant, {}):     # each path's copy checked, then cleared
                ctx.read(dst, check)
                if not np.array_equal(check, np.arange(size // 4, dtype=np.uint32)):
                    raise AssertionError(f"bench_copy_{variant} copied wrong data")
                ctx.write(dst, np.zeros(size // 4, np.uint32))
    finally:
        src.free()
        dst.free()
    speeds = [v["gbs"] for v in out.values() if "gbs" in v]
    return {"gbs": max(speeds) if speeds else None, "bytes": size, "variants": out}


def copy_buffer_gbs(dev, size: int, reps: int = 3) -> dict:
    """``vkCmdCopyBuffer`` bandwidth (one region)."""
    ctx = dev.context
    src, dst = ctx.allocate(size), ctx.allocate(size)
    try:
        gpu, wall = _timed_runs(ctx, lambda seq: seq.copy(src, dst, [(0, 0, size)]), reps)
    finally:
        src.free()
        dst.free()
    t = _best_time(gpu, wall)
    return {"gbs": 2 * size / t / 1e9, "bytes": size, "seconds": t}


def host_copy_gbs(dev, size: int, reps: int = 5) -> dict:
    """CPU copy bandwidth (NumPy), and vkml's upload and download next to it."""
    a = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    b = np.empty_like(a)
    t = dev.empty(size, np.uint8)

    def best(fn):
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    try:
        cpu = best(lambda: np.copyto(b, a))
        up = best(lambda: t.write(a))
        down = best(lambda: dev.context.read(t.allocation, b))
        if not np.array_equal(a, b):
            raise AssertionError("upload/download round trip changed the data")
    finally:
        t.free()
    g = lambda s: 2 * size / s / 1e9   # noqa: E731
    return {"cpu_copy_gbs": g(cpu), "upload_gbs": g(up), "download_gbs": g(down),
            "upload_vs_cpu_copy": cpu / up, "download_vs_cpu_copy": cpu / down, "bytes": size}


def measure(dev, quick: bool = False, size: int | None = None) -> dict:
    """Every device limit the report uses (``size``: bytes of the copy measurements)."""
    size = size or ((16 << 20) if quick else (64 << 20))
    size = min(size, dev.limits["maxStorageBufferRange"] // 2)
    size = max(1 << 16, (size >> 16) << 16)
    fma = fma_gflops(dev, target_s=0.02 if quick else 0.08)
    shader = shader_copy_gbs(dev, size)
    engine = copy_buffer_gbs(dev, size)
    host = host_copy_gbs(dev, size)
    return {"fma_gflops": fma["gflops"], "shader_copy_gbs": shader["gbs"],
            "copy_buffer_gbs": engine["gbs"], **{k: v for k, v in host.items() if k != "bytes"},
            "details": {"fma": fma, "shader_copy": shader, "copy_buffer": engine,
                        "host_bytes": host["bytes"]}}


#: How long one run of the FMA reference lasts (:func:`references`): long enough that a
#: dispatch's fixed cost is a small part of it, short enough to take turns with a
#: GEMM of a millisecond several times within a workload's time budget.
REF_FMA_S = 0.02


class Reference:
    """One limit's microkernel recorded once into a timed sequence, run in turns with
    each workload (:func:`bench.stats.sample_paired`): ``limit`` is the limits key it
    stands for, ``amount`` the bytes (read + written) or FLOPs of one run, ``name`` what
    it runs.  A call runs it once and returns that run's seconds (GPU time from the
    timestamps, wall time where the device has none)."""

    def __init__(self, ctx, limit: str, name: str, amount: float, record, buffers):
        self.limit, self.name, self.amount = limit, name, amount
        self._buffers = buffers
        self._seq = ctx.sequence(timed=True)
        try:
            record(self._seq)
        except BaseException:
            self.close()
            raise

    def __call__(self) -> float:
        t = time.perf_counter()
        self._seq.run()
        wall = time.perf_counter() - t
        return self._seq.gpu_time_ns * 1e-9 if self._seq.gpu_time_ns else wall

    def close(self) -> None:
        self._seq.close()
        for b in self._buffers:
            b.free()


def _copy_reference(ctx, det: dict) -> Reference:
    """bench_copy as the shader-copy limit was read: its fastest path, workgroup size and
    binding window, over the limit's buffer size (the same DRAM-sized copy as the
    table's figure: a copy that fits the CPU's caches reads faster)."""
    size = det["bytes"]
    variant, best = max(((k, v) for k, v in det["variants"].items() if "gbs" in v),
                        key=lambda kv: kv[1]["gbs"])
    texel = variant.startswith("texel")
    max_x = grid_cap(ctx.limits["maxComputeWorkGroupCount"][0])
    local = best["local_size"]
    pipe = ctx.pipelines.get(f"bench_copy_{variant}", (UNIFORM_TEXEL if texel else STORAGE,
                                                       STORAGE), 8, {0: local})
    src, dst = ctx.allocate(size), ctx.allocate(size)
    ctx.write(src, np.zeros(size // 4, np.uint32))     # every page touched before timing
    ctx.write(dst, np.zeros(size // 4, np.uint32))
    fmt = FORMAT_RGBA32_UINT if texel else 0
    return Reference(ctx, "shader_copy_gbs", f"bench_copy {variant} {size >> 20} MiB",
                     2 * size, lambda seq: _record_copy(seq, pipe, src, dst, size,
                                                        best["window"], fmt, local, max_x),
                     [src, dst])


def _fma_reference(ctx, det: dict) -> Reference:
    """bench_fma at the FMA limit's workgroup size, its grid cut to last about
    :data:`REF_FMA_S` at the limit's rate (the rate is flat well before the limit's own
    target time, which only keeps a dispatch's fixed cost out of the figure)."""
    local = det["local_size"]
    groups = max(1, round(det["invocations"] // local * REF_FMA_S / det["seconds"]))
    max_x = grid_cap(ctx.limits["maxComputeWorkGroupCount"][0])
    pipe = ctx.pipelines.get("bench_fma", (STORAGE,), 16, {0: local, 1: _FMA_ITERS})
    out = ctx.allocate(65536 * 16)
    return Reference(ctx, "fma_gflops", f"bench_fma {groups * local} invocations",
                     groups * local * _FMA_FLOPS_PER_INVOCATION,
                     lambda seq: _record_fma(seq, pipe, out, groups, local, max_x), [out])


def references(dev, lim: dict) -> dict:
    """``{limit key: Reference}`` for the FMA peak and the shader-copy bandwidth that
    :func:`measure` read (``lim``, its result), each recorded as that limit was measured,
    to time in turns with the workloads; close each when done."""
    ctx = dev.context
    det = lim["details"]
    out = {}
    try:
        out["fma_gflops"] = _fma_reference(ctx, det["fma"])
        out["shader_copy_gbs"] = _copy_reference(ctx, det["shader_copy"])
    except BaseException:
        for ref in out.values():
            ref.close()
        raise
    return out


def hot_path(dev, quick: bool = False, runs: int | None = None) -> dict:
    """Per-submit costs of the fast paths: a replayed recorded sequence (one tiny padding),
    ``execute()`` replaying its cached command buffer, 100 tiny paddings recorded into one
    submit, and the functional ``vkml.pad`` on a tiny NumPy array (4x4 float32, reflection
    by 1: NumPy in, NumPy out)."""
    from vkml import dml

    runs = runs or (100 if quick else 400)
    shape_in, shape_out = (1, 16), (1, 18)
    desc = dml.PaddingOperatorDesc(dml.TensorDesc("float32", shape_in),
                                   dml.TensorDesc("float32", shape_out),
                                   dml.PaddingMode.CONSTANT, 0.0, (0, 1), (0, 1))
    compiled = dev.compile_operator(dev.create_operator(desc))
    x0 = np.arange(16, dtype=np.float32).reshape(shape_in)
    xs = [dev.tensor(x0) for _ in range(100)]
    ys = [dev.empty(shape_out, np.float32) for _ in range(100)]

    def per_call(fn, n):
        fn()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e6

    try:
        with dev.sequence() as seq:
            compiled.record(seq, [xs[0]], [ys[0]])
            replay = per_call(seq.run, runs)
        execute = per_call(lambda: compiled.execute([xs[0]], [ys[0]]), runs)
        with dev.sequence() as seq:
            for x, y in zip(xs, ys):
                compiled.record(seq, [x], [y])
            batched = per_call(seq.run, max(5, runs // 20)) / len(xs)
        expect = np.pad(x0, [(0, 0), (1, 1)])
        if not all(np.array_equal(y.numpy(), expect) for y in ys):
            raise AssertionError("batched tiny paddings gave wrong results")
        x4 = np.arange(16, dtype=np.float32).reshape(4, 4)
        functional = per_call(lambda: vkml.pad(x4, [1, 1], [1, 1], "reflection", device=dev),
                              runs)
    finally:
        compiled.release()
        for t in xs + ys:
            t.free()
    return {"replay_us_per_submit": replay, "execute_us": execute,
            "batched_us_per_padding": batched, "functional_tiny_pad_us": functional,
            "batch": len(xs), "targets": TARGETS}

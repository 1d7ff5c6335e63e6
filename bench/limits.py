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


def _record_copy(seq, pipe, src, dst, size: int, window: int, fmt, local: int, max_x: int,
                 base: int = 0):
    """Record bench_copy of ``size`` bytes from ``src`` to ``dst`` from offset ``base``,
    one dispatch per ``window`` bytes (a binding's range is bounded)."""
    for off, n in _copy_windows(size, window):
        count = n // 16
        gx, gy = _grid(ceil_div(count, (local * _PER)), max_x)
        push = pack(pipe.name, "push", count=count, row=gx * local)
        seq.dispatch(pipe, [Bind(src, base + off, n, "r", fmt),
                            Bind(dst, base + off, n, "w")], (gx, gy, 1), push)


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


#: The FMA reference's run at the limit's rate where no workload sizes it (a model's
#: hot runs, :meth:`References.sized`); its shortest (shorter, a dispatch's fixed cost
#: reads below the peak) and its longest (a workload's turn stays within its budget).
REF_FMA_S, REF_FMA_MIN_S, REF_FMA_MAX_S = 0.02, 0.001, 1.0
#: The copy reference's smallest chunk (bytes copied; it moves twice that).
REF_COPY_MIN = 1 << 20


class Reference:
    """A limit's microkernel recorded into timed sequences, run in turns with one
    workload (:func:`bench.stats.sample_paired`): ``limit`` is the limits key it stands
    for, ``amount`` the bytes (read + written) or FLOPs of one run, ``name`` what it
    runs.  A call runs the next sequence (they take turns) and returns that run's
    seconds (GPU time from the timestamps, wall time where the device has none)."""

    def __init__(self, ctx, limit: str, name: str, amount: float, records: list):
        self.limit, self.name, self.amount = limit, name, amount
        self._seqs, self._next = [], 0
        try:
            for record in records:
                self._seqs.append(ctx.sequence(timed=True))
                record(self._seqs[-1])
        except BaseException:
            self.close()
            raise

    def __call__(self) -> float:
        seq = self._seqs[self._next % len(self._seqs)]
        self._next += 1
        t = time.perf_counter()
        seq.run()
        wall = time.perf_counter() - t
        return seq.gpu_time_ns * 1e-9 if seq.gpu_time_ns else wall

    def close(self) -> None:
        for seq in self._seqs:
            seq.close()
        self._seqs = []


class References:
    """The microkernels of the FMA peak and the shader-copy bandwidth as :func:`measure`
    read them (``lim``, its result: the same kernels, paths, workgroup sizes and
    buffers), from which :meth:`sized` records a :class:`Reference` sized like one
    workload.  ``close`` frees the buffers."""

    def __init__(self, dev, lim: dict):
        ctx = self.ctx = dev.context
        det = lim["details"]
        self.fma, self.copy = det["fma"], det["shader_copy"]
        self.size = self.copy["bytes"]
        self.variant, self.best = max(((k, v) for k, v in self.copy["variants"].items()
                                       if "gbs" in v), key=lambda kv: kv[1]["gbs"])
        self.max_x = grid_cap(ctx.limits["maxComputeWorkGroupCount"][0])
        self.buffers = []
        try:
            self.out = self._buffer(65536 * 16)
            self.src, self.dst = self._buffer(self.size), self._buffer(self.size)
        except BaseException:
            self.close()
            raise

    def _buffer(self, size: int):
        self.buffers.append(self.ctx.allocate(size))
        self.ctx.write(self.buffers[-1], np.zeros(size // 4, np.uint32))  # pages touched
        return self.buffers[-1]

    def sized(self, limit: str, amount: float | None = None) -> Reference:
        """The reference of ``limit`` ("fma_gflops", "shader_copy_gbs") for a workload
        of ``amount`` FLOPs or bytes moved (None: the longest run)."""
        if limit == "fma_gflops":
            return self._fma(amount)
        return self._copy(amount)

    def _fma(self, flops: float | None) -> Reference:
        """bench_fma at the limit's workgroup size, a grid of about ``flops`` (so a run
        lasts about as long as the workload's at the peak), kept between
        :data:`REF_FMA_MIN_S` and :data:`REF_FMA_MAX_S` at the limit's rate."""
        det, local = self.fma, self.fma["local_size"]
        rate = det["flops"] / det["seconds"]
        flops = min(max(flops or rate * REF_FMA_S, rate * REF_FMA_MIN_S), rate * REF_FMA_MAX_S)
        groups = max(1, round(flops / (local * _FMA_FLOPS_PER_INVOCATION)))
        pipe = self.ctx.pipelines.get("bench_fma", (STORAGE,), 16, {0: local, 1: _FMA_ITERS})
        return Reference(self.ctx, "fma_gflops", f"bench_fma {groups * local} invocations",
                         groups * local * _FMA_FLOPS_PER_INVOCATION,
                         [lambda seq: _record_fma(seq, pipe, self.out, groups, local,
                                                  self.max_x)])

    def _copy(self, moved: float | None) -> Reference:
        """bench_copy's fastest path of the limit over chunks of the limit's buffers, each
        chunk moving about ``moved`` bytes (at least :data:`REF_COPY_MIN` copied), the
        chunks taken in turns: a chunk is read again only after the rest of the buffers,
        larger than the CPU's caches, so it reads from memory as the limit's copy of the
        whole buffer does, in a run as short as the workload's."""
        chunk = min(self.size, max(REF_COPY_MIN, int(moved or 2 * self.size) // 2))
        chunk = max(1 << 16, chunk >> 16 << 16)
        texel = self.variant.startswith("texel")
        local, window = self.best["local_size"], min(self.best["window"], chunk)
        pipe = self.ctx.pipelines.get(f"bench_copy_{self.variant}",
                                      (UNIFORM_TEXEL if texel else STORAGE, STORAGE), 8,
                                      {0: local})
        fmt = FORMAT_RGBA32_UINT if texel else 0

        def record(off):
            return lambda seq: _record_copy(seq, pipe, self.src, self.dst, chunk, window, fmt,
                                            local, self.max_x, off)

        offsets = range(0, self.size - chunk + 1, chunk)
        return Reference(self.ctx, "shader_copy_gbs",
                         f"bench_copy {self.variant}, {len(offsets)} chunks of "
                         f"{chunk / (1 << 20):.4g} MiB", 2 * chunk, [record(o) for o in offsets])

    def describe(self) -> dict:
        """What each limit's reference runs, for the device's entry of the results."""
        return {"fma_gflops": f"bench_fma, {self.fma['local_size']} invocations a group, "
                              "a grid of about the workload's FLOPs",
                "shader_copy_gbs": f"bench_copy {self.variant} over the limit's "
                                   f"{self.size >> 20} MiB buffers in chunks moving about "
                                   "the workload's bytes"}

    def close(self) -> None:
        for b in self.buffers:
            b.free()
        self.buffers = []


def references(dev, lim: dict) -> References:
    """The references of the limits :func:`measure` read (``lim``) to time in turns with
    each workload; close it when done."""
    return References(dev, lim)


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

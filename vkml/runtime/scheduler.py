"""The command-buffer scheduler: record dispatches and copies, submit, wait, replay.

A :class:`Sequence` is one command buffer.  Operators record into it (several operators
may share one, submitted once); :meth:`Sequence.run` submits it and waits on its fence,
and may be called again to replay it without re-recording: the hot path of repeated
inference calls the cffi ``lib`` functions with structs built once at recording time.

Barriers are inserted automatically from what each command reads and writes: a
command that reads or writes a byte range written earlier in the sequence, or writes
a range read earlier, is preceded by a memory barrier; independent commands (the
interior copy and the border kernel of a padding, say) run without one.

Every fence wait (operators, transfers, replays, graphs: all are sequences) is bounded,
so a hung GPU raises :class:`DeviceError` instead of hanging.  The bound is
``VKML_TIMEOUT``, plus ``VKML_FIRST_USE_TIMEOUT`` for each pipeline the submission
dispatches that no completed submission on the device dispatched before: a driver may
compile a pipeline at its first dispatch (lavapipe does), so a model's first run on a
machine with an empty shader cache may take minutes at no fault.  Counting the new
pipelines a submission binds, rather than lengthening every first submission or asking
the device's type, makes the allowance grow with the compilation that can happen and
vanish once it cannot: replays, and later sequences of the same pipelines, wait
``VKML_TIMEOUT`` alone.
"""
from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import dataclass

from ..errors import DeviceError
from . import lifetime, vk
from .memory import Allocation
from .pipelines import STORAGE, STORAGE_TEXEL, UNIFORM, UNIFORM_TEXEL, Pipeline
from .vk import ffi, lib

_SHADER_RW = vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
_XFER_RW = vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
_STAGES = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
_WRITES = vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
_NOT_READY = vk.VK_NOT_READY
#: How long a submission's fence is waited for before the device is considered lost
#: (``VKML_TIMEOUT``, seconds), plus :data:`FIRST_USE_S` per first-use pipeline.
TIMEOUT_S = float(os.environ.get("VKML_TIMEOUT", "120"))
TIMEOUT_NS = int(TIMEOUT_S * 1e9)
#: Seconds added to a submission's wait for each pipeline it dispatches that no completed
#: submission of this device dispatched before (``VKML_FIRST_USE_TIMEOUT``).  A driver may
#: make a pipeline's machine code at its first dispatch, not at its creation (lavapipe
#: does, 1-2 s a pipeline with an empty Mesa shader cache and several times that on a
#: loaded machine), so a first run of a model on a fresh machine may take minutes while
#: nothing hangs; what is allowed depends on what the submission dispatches, never on the
#: device's type.  A real hang is still caught: on a replay at once, on a first run once
#: the allowance is spent.
FIRST_USE_S = float(os.environ.get("VKML_FIRST_USE_TIMEOUT", "10"))


def wait_limit_s(first_use: int, timeout_s: float | None = None,
                 per_first_use_s: float | None = None) -> float:
    """Seconds a submission dispatching ``first_use`` pipelines never completed on its
    device before may wait for its fence: ``VKML_TIMEOUT`` + ``first_use`` x
    ``VKML_FIRST_USE_TIMEOUT`` (the module's values unless given)."""
    t = TIMEOUT_S if timeout_s is None else timeout_s
    per = FIRST_USE_S if per_first_use_s is None else per_first_use_s
    return t + max(0, first_use) * max(0.0, per)


def describe_wait(first_use: int) -> str:
    """What a timed-out wait was allowed, naming the settings that allowed it."""
    text = f"more than {wait_limit_s(first_use):g} s: VKML_TIMEOUT={TIMEOUT_S:g}"
    if first_use:
        text += f" + {first_use} first-use pipeline(s) x VKML_FIRST_USE_TIMEOUT={FIRST_USE_S:g}"
    return text
#: How long :meth:`Sequence.run` polls the fence before sleeping in vkWaitForFences, for
#: sequences whose last run was short.  A sleeping thread's wake-up is one more hop on the
#: hot path, costly when other processes load the cores (bench/RESULTS.md).  Long runs
#: never poll (it would take a core from a CPU driver's own threads).
SPIN_S = 100e-6
#: Whether each poll gives the core away (``sched_yield``) before the next.  On a loaded
#: 2-core machine a CPU driver's queue thread may be waiting for the core the poller
#: holds (SwiftShader's replays turn bimodal by the load of the moment without yielding;
#: lavapipe's are the same either way).
#: ``VKML_SPIN_YIELD=0`` polls without yielding.
SPIN_YIELD = os.environ.get("VKML_SPIN_YIELD", "1") != "0"
#: The last stretch of a long run's wait that :meth:`Sequence.run` polls the fence for
#: instead of sleeping in vkWaitForFences (which it does until then, timed by the
#: sequence's previous run), on devices that do not compute on the host's cores (a
#: CPU driver's threads need them): a thread woken from vkWaitForFences returns a
#: tenth of a millisecond or more after the GPU finished (bench/RESULTS.md, "Whole
#: models").  ``VKML_WAIT_TAIL_US``; 0 sleeps to the end.
WAIT_TAIL_S = float(os.environ.get("VKML_WAIT_TAIL_US", "300")) * 1e-6
_perf = time.perf_counter
_yield = os.sched_yield
_submit = lib.vkQueueSubmit
_fence_status = lib.vkGetFenceStatus
_reset_fences = lib.vkResetFences
_wait_fences = lib.vkWaitForFences


def _ns_until(deadline: float) -> int:
    """Nanoseconds from now to ``deadline`` (perf_counter seconds), 0 once past it."""
    return max(0, int((deadline - _perf()) * 1e9))


@dataclass(frozen=True)
class Bind:
    """One kernel binding: ``size`` bytes of ``alloc`` from ``offset`` (bytes).

    ``access`` is "r", "w" or "rw"; ``fmt`` is the ``VkFormat`` of a texel-buffer binding.
    """

    alloc: Allocation
    offset: int = 0
    size: int | None = None
    access: str = "r"
    fmt: int = 0

    def span(self) -> tuple[int, int]:
        size = self.alloc.size - self.offset if self.size is None else self.size
        return self.offset, size


class CommandPool:
    """A command pool for one recording thread; its lock guards every ``vkCmd*`` call.

    It keeps the command buffers and fences of closed sequences (reset, unsignalled) for
    the next ones: a discrete GPU's driver takes far longer to create and destroy them
    than to record a copy, and every NumPy-in/NumPy-out call stages its transfers through
    short-lived sequences (bench/RESULTS.md, "NVIDIA H200")."""

    #: Idle command buffer + fence pairs kept at most.
    SPARES = 8

    def __init__(self, ctx):
        self.device = ctx.device
        self.lock = threading.Lock()
        self.spares: list = []         # (command buffer pointer, fence pointer)
        info = ffi.new("VkCommandPoolCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
            "flags": vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
            "queueFamilyIndex": ctx.queue_family})
        h = ffi.new("VkCommandPool*")
        vk.check(lib.vkCreateCommandPool(self.device, info, vk.NULL, h), "vkCreateCommandPool")
        self.handle = h[0]

    def allocate(self):
        info = ffi.new("VkCommandBufferAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, "commandPool": self.handle,
            "level": vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, "commandBufferCount": 1})
        h = ffi.new("VkCommandBuffer*")
        with self.lock:
            vk.check(lib.vkAllocateCommandBuffers(self.device, info, h), "vkAllocateCommandBuffers")
        return h

    def free(self, cmd_ptr) -> None:
        with self.lock:
            lib.vkFreeCommandBuffers(self.device, self.handle, 1, cmd_ptr)

    def take_spare(self) -> tuple | None:
        """An idle (command buffer, fence) pair kept by :meth:`keep`, or None."""
        with self.lock:
            return self.spares.pop() if self.spares else None

    def keep(self, cmd_ptr, fence) -> bool:
        """Keep an idle command buffer (reset here) and its unsignalled fence for a later
        sequence; False when the pool holds enough or either is not idle (the caller
        then destroys them)."""
        with self.lock:
            if (len(self.spares) >= self.SPARES
                    or lib.vkGetFenceStatus(self.device, fence[0]) != _NOT_READY
                    or lib.vkResetCommandBuffer(cmd_ptr[0], 0) != vk.VK_SUCCESS):
                return False
            self.spares.append((cmd_ptr, fence))
            return True

    def destroy(self) -> None:
        for _, fence in self.spares:
            lib.vkDestroyFence(self.device, fence[0], vk.NULL)
        self.spares.clear()
        lib.vkDestroyCommandPool(self.device, self.handle, vk.NULL)


class DescriptorPools:
    """Descriptor sets for devices without push descriptors: pools grown on demand.

    Capacity is tracked here (sets and descriptors of each type), so a new pool is made
    before one is over-committed, whatever a driver would return.
    """

    SETS_PER_POOL = 256
    PER_SET = {STORAGE: 8, UNIFORM: 2, UNIFORM_TEXEL: 4, STORAGE_TEXEL: 2}

    def __init__(self, ctx):
        self.device = ctx.device
        self.lock = threading.Lock()
        self.pools: list = []            # [handle, sets used, {type: descriptors used}]
        self.capacity = {t: n * self.SETS_PER_POOL for t, n in self.PER_SET.items()}

    def _new_pool(self, need: dict):
        cap = {t: max(c, need.get(t, 0)) for t, c in self.capacity.items()}
        sizes = ffi.new("VkDescriptorPoolSize[]", [
            {"type": t, "descriptorCount": c} for t, c in cap.items()])
        info = ffi.new("VkDescriptorPoolCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
            "flags": vk.VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT,
            "maxSets": self.SETS_PER_POOL, "poolSizeCount": len(cap), "pPoolSizes": sizes})
        h = ffi.new("VkDescriptorPool*")
        vk.check(lib.vkCreateDescriptorPool(self.device, info, vk.NULL, h), "vkCreateDescriptorPool")
        entry = [h[0], 0, {t: 0 for t in cap}, cap]
        self.pools.append(entry)
        return entry

    @staticmethod
    def _fits(entry, need: dict, sets: int) -> bool:
        return entry[1] < sets and all(entry[2][t] + n <= entry[3][t] for t, n in need.items())

    def allocate(self, set_layout, kinds: tuple):
        need: dict = {}
        for k in kinds:
            need[k] = need.get(k, 0) + 1
        layouts = ffi.new("VkDescriptorSetLayout[]", [set_layout])
        out = ffi.new("VkDescriptorSet*")
        with self.lock:
            entry = next((e for e in reversed(self.pools)
                          if self._fits(e, need, self.SETS_PER_POOL)), None)
            if entry is None or not self._try(entry[0], layouts, out):
                entry = self._new_pool(need)
                if not self._try(entry[0], layouts, out):
                    raise DeviceError("vkAllocateDescriptorSets failed on a fresh pool")
            entry[1] += 1
            for t, n in need.items():
                entry[2][t] += n
            return (entry, need), out[0]

    def _try(self, pool, layouts, out) -> bool:
        info = ffi.new("VkDescriptorSetAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, "descriptorPool": pool,
            "descriptorSetCount": 1, "pSetLayouts": layouts})
        result = lib.vkAllocateDescriptorSets(self.device, info, out)
        if result in (vk.VK_ERROR_OUT_OF_POOL_MEMORY, vk.VK_ERROR_FRAGMENTED_POOL):
            return False
        vk.check(result, "vkAllocateDescriptorSets")
        return True

    def free(self, token, dset) -> None:
        entry, need = token
        sets = ffi.new("VkDescriptorSet[]", [dset])
        with self.lock:
            lib.vkFreeDescriptorSets(self.device, entry[0], 1, sets)
            entry[1] -= 1
            for t, n in need.items():
                entry[2][t] -= n

    def destroy(self) -> None:
        for entry in self.pools:
            lib.vkDestroyDescriptorPool(self.device, entry[0], vk.NULL)
        self.pools.clear()


#: Regions per ``vkCmdCopyBuffer`` (see :meth:`Sequence.copy_array`).
COPY_CHUNK = 256


class Sequence:
    """A recorded command buffer that can be submitted any number of times."""

    def __init__(self, ctx, timed: bool = False, hold: bool = True, marks: int = 0):
        self.ctx = ctx
        with ctx.lifetime:
            self._create(ctx, timed, hold, marks)

    def _create(self, ctx, timed: bool, hold: bool, marks: int = 0) -> None:
        self.device = ctx.device
        self.pool = ctx.command_pool()
        self._res = _Resources(ctx, self.pool)
        self._cmd_ptr = self._res.cmd_ptr
        self.cmd = self._cmd_ptr[0]
        self._fence = self._res.fence
        self._hold = hold
        self._allocs: list = []        # weak references to every bound allocation
        self._slots: dict = {}         # id(allocation) -> its index in _allocs
        self._keep: list = []          # strong references (allocations if hold, cffi data)
        self._seen: set = set()
        self._written: list = []       # (buffer, lo, hi) since the last barrier
        self._read: list = []
        self.dispatches = 0
        self.ended = False
        self.closed = False
        self.gpu_time_ns: float | None = None
        self._spin = SPIN_S             # 0 once a run took long (see run)
        self._tail = WAIT_TAIL_S if ctx.info.device_type != "cpu" else 0.0
        self._took = 0.0                # the previous run's seconds
        self._fresh: dict = {}          # id -> pipeline recorded here, not yet dispatched
        self._first_use = 0             # of those, in the submission being waited for
        self._timeout_ns = TIMEOUT_NS   # that submission's wait (see wait_limit_s)
        self._lock = threading.Lock()
        self._query_pool = None
        self._queries = 2 + max(0, int(marks))
        self._marked = 0
        #: per :meth:`mark`, nanoseconds from the sequence's start stamp (after a run)
        self.mark_ns: list = []
        self._timed = timed
        if timed and ctx.features.get("timestamps"):
            qinfo = ffi.new("VkQueryPoolCreateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                "queryType": vk.VK_QUERY_TYPE_TIMESTAMP, "queryCount": self._queries})
            qp = ffi.new("VkQueryPool*")
            vk.check(lib.vkCreateQueryPool(self.device, qinfo, vk.NULL, qp), "vkCreateQueryPool")
            self._query_pool = self._res.query_pool = qp[0]
            self._stamps = ffi.new(f"uint64_t[{self._queries}]")
        self._finalizer = weakref.finalize(self, ctx.defer_release, self._res)
        begin = ffi.new("VkCommandBufferBeginInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO})
        with self.pool.lock:
            vk.check(lib.vkBeginCommandBuffer(self.cmd, begin), "vkBeginCommandBuffer")
            if self._query_pool is not None:
                lib.vkCmdResetQueryPool(self.cmd, self._query_pool, 0, self._queries)
                lib.vkCmdWriteTimestamp(self.cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT,
                                        self._query_pool, 0)
            # Whatever earlier submissions wrote is visible to this one.
            self._barrier(vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, _STAGES,
                          vk.VK_ACCESS_MEMORY_WRITE_BIT, _SHADER_RW | _XFER_RW)
        self.submit_info = ffi.new("VkSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "commandBufferCount": 1,
            "pCommandBuffers": self._cmd_ptr})

    # -- recording ---------------------------------------------------------------------
    def _barrier(self, src_stage, dst_stage, src_access, dst_access) -> None:
        mb = ffi.new("VkMemoryBarrier*", {"sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                          "srcAccessMask": src_access, "dstAccessMask": dst_access})
        lib.vkCmdPipelineBarrier(self.cmd, src_stage, dst_stage, 0, 1, mb, 0, vk.NULL, 0, vk.NULL)

    def _hazard(self, reads, writes) -> None:
        """Insert a barrier if these accesses depend on ones recorded since the last."""
        def overlaps(a, ranges):
            buf, lo, hi = a
            return any(b == buf and lo < h and l < hi for b, l, h in ranges)

        if (any(overlaps(r, self._written) for r in reads)
                or any(overlaps(w, self._written) or overlaps(w, self._read) for w in writes)):
            self._barrier(_STAGES, _STAGES, _WRITES, _SHADER_RW | _XFER_RW)
            self._written.clear()
            self._read.clear()
        self._written.extend(writes)
        self._read.extend(reads)

    def _use(self, alloc: Allocation) -> None:
        if not alloc.alive:
            raise DeviceError("a bound buffer was already freed")
        key = id(alloc)
        if key not in self._seen:
            self._seen.add(key)
            self._slots[key] = len(self._allocs)
            self._allocs.append(weakref.ref(alloc))
            if self._hold:
                self._keep.append(alloc)

    def rebind(self, pairs) -> None:
        """Let the recorded commands stand for the allocation ``new`` where they bound
        the one whose ``id`` is ``old``, for each ``(old, new)`` of ``pairs``: the caller
        checked that ``new`` is the same range of the same live block (the same
        ``VkBuffer``, offset and size, so the recorded commands and descriptors are
        those ``new`` would be recorded with) and that no buffer view of the old one
        was recorded (views die with their allocation).  Then :meth:`run` checks the new
        allocations' liveness in place of the old ones'.  Sequences that hold their
        allocations (``hold``) are not rebound."""
        if self._hold:
            raise DeviceError("a sequence holding its allocations cannot be rebound")
        # every old key out before any new one goes in: a new allocation may have the id
        # of another old one (CPython reuses a freed object's address)
        pairs = list(pairs)
        moved = [(self._slots.pop(old), new) for old, new in pairs]
        self._seen.difference_update(old for old, _ in pairs)
        for i, new in moved:
            self._allocs[i] = weakref.ref(new)
            self._slots[id(new)] = i
            self._seen.add(id(new))

    def rebindable(self, olds) -> bool:
        """Whether :meth:`rebind` of the allocations whose ids are ``olds`` leaves every
        allocation the commands use alive: each was bound here, and every other bound
        allocation lives."""
        slots = self._slots
        if any(o not in slots for o in olds):
            return False
        moved = {slots[o] for o in olds}
        return all(i in moved or _live(r()) for i, r in enumerate(self._allocs))

    def keep(self, obj) -> None:
        """Hold a strong reference to ``obj`` (an operator whose pipelines and buffers
        the recorded commands use) until the sequence is closed."""
        self._keep.append(obj)

    def _check_open(self) -> None:
        if self.ended:
            raise DeviceError("this sequence was already submitted; record a new one")

    @lifetime.entry
    def dispatch(self, pipeline: Pipeline, binds: list[Bind], groups: tuple[int, int, int],
                 push: bytes = b"") -> None:
        """Record one compute dispatch of ``pipeline`` with ``binds`` in binding order."""
        self._check_open()
        limits = self.ctx.limits
        max_groups = limits["maxComputeWorkGroupCount"]
        if any(g > m for g, m in zip(groups, max_groups)) or min(groups) < 0:
            raise DeviceError(f"{pipeline.name}: {groups} workgroups exceed the device's "
                              f"maxComputeWorkGroupCount {max_groups}")
        if min(groups) == 0:
            return
        if len(binds) != len(pipeline.kinds):
            raise DeviceError(f"{pipeline.name}: {len(binds)} bindings for "
                              f"{len(pipeline.kinds)} descriptors")
        if len(push) != pipeline.push_size:
            # the kernel reads its whole push-constant block (blocks.pack fills it by name)
            raise DeviceError(f"{pipeline.name}: {len(push)} bytes of push constants for a "
                              f"block of {pipeline.push_size}")
        reads, writes = [], []
        infos = []
        for b, kind in zip(binds, pipeline.kinds):
            self._use(b.alloc)
            off, size = b.span()
            self.ctx.check_binding(pipeline.name, kind, off + b.alloc.offset, size, b.fmt)
            rng = (b.alloc.buffer, b.alloc.offset + off, b.alloc.offset + off + size)
            if "r" in b.access:
                reads.append(rng)
            if "w" in b.access:
                writes.append(rng)
            infos.append((kind, b, off, size))
        with self.pool.lock:
            self._check_open()      # again under the lock: another thread may have ended it
            self._hazard(reads, writes)
            lib.vkCmdBindPipeline(self.cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle)
            if not pipeline.dispatched:
                self._fresh[id(pipeline)] = pipeline
            self._bind_descriptors(pipeline, infos)
            if push:
                data = ffi.new("char[]", push)
                lib.vkCmdPushConstants(self.cmd, pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT,
                                       0, len(push), data)
            lib.vkCmdDispatch(self.cmd, *groups)
        self.dispatches += 1

    def _bind_descriptors(self, pipeline: Pipeline, infos) -> None:
        n = len(infos)
        writes = ffi.new("VkWriteDescriptorSet[]", n)
        buffer_infos = ffi.new("VkDescriptorBufferInfo[]", n)
        views = ffi.new("VkBufferView[]", n)
        dset = vk.NULL
        if self.ctx.push_descriptor is None:
            pool, dset = self.ctx.descriptor_pools.allocate(pipeline.set_layout, pipeline.kinds)
            self._res.sets.append((pool, dset))
        for i, (kind, b, off, size) in enumerate(infos):
            w = writes[i]
            w.sType = vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET
            w.dstSet = dset
            w.dstBinding = i
            w.descriptorCount = 1
            w.descriptorType = kind
            if kind in (UNIFORM_TEXEL, STORAGE_TEXEL):
                views[i] = b.alloc.view(b.fmt, off, size)
                w.pTexelBufferView = views + i
            else:
                buffer_infos[i].buffer = b.alloc.buffer
                buffer_infos[i].offset = b.alloc.offset + off
                buffer_infos[i].range = size
                w.pBufferInfo = buffer_infos + i
        if self.ctx.push_descriptor is not None:
            self.ctx.push_descriptor(self.cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout,
                                     0, n, writes)
        else:
            lib.vkUpdateDescriptorSets(self.device, n, writes, 0, vk.NULL)
            sets = ffi.new("VkDescriptorSet[]", [dset])
            lib.vkCmdBindDescriptorSets(self.cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE,
                                        pipeline.layout, 0, 1, sets, 0, vk.NULL)

    @lifetime.entry
    def copy(self, src: Allocation, dst: Allocation, regions: list[tuple[int, int, int]]) -> None:
        """Record ``vkCmdCopyBuffer``: regions of (src offset, dst offset, bytes)."""
        self._check_open()
        if not regions:
            return
        self._use(src)
        self._use(dst)
        reads = [(src.buffer, src.offset + s, src.offset + s + n) for s, _, n in regions]
        writes = [(dst.buffer, dst.offset + d, dst.offset + d + n) for _, d, n in regions]
        if len(regions) > 64:   # keep the hazard lists short: one range per side
            reads = [(src.buffer, min(r[1] for r in reads), max(r[2] for r in reads))]
            writes = [(dst.buffer, min(w[1] for w in writes), max(w[2] for w in writes))]
        arr = ffi.new("VkBufferCopy[]", len(regions))
        for i, (s, d, n) in enumerate(regions):
            arr[i].srcOffset = src.offset + s
            arr[i].dstOffset = dst.offset + d
            arr[i].size = n
        with self.pool.lock:
            self._check_open()
            self._hazard(reads, writes)
            lib.vkCmdCopyBuffer(self.cmd, src.buffer, dst.buffer, len(regions), arr)

    @lifetime.entry
    def copy_array(self, src: Allocation, dst: Allocation, regions) -> None:
        """Like :meth:`copy` with an (n, 3) integer array of regions (no Python loop).

        Recorded as one ``vkCmdCopyBuffer`` per :data:`COPY_CHUNK` regions: the validation
        layer checks every pair of a command's regions for overlap (src and dst may be one
        sub-allocated ``VkBuffer``), quadratic in a command's regions; in chunks the
        padding calibration records in seconds, not minutes, and lavapipe runs the chunks
        as fast per region as one command."""
        import numpy as np

        self._check_open()
        regions = np.asarray(regions, dtype=np.uint64).reshape(-1, 3)
        if not len(regions):
            return
        self._use(src)
        self._use(dst)
        shifted = regions + np.array([src.offset, dst.offset, 0], dtype=np.uint64)
        arr = ffi.new("VkBufferCopy[]", len(regions))
        ffi.memmove(arr, shifted.tobytes(), shifted.nbytes)
        lo_s, hi_s = int(shifted[:, 0].min()), int((shifted[:, 0] + shifted[:, 2]).max())
        lo_d, hi_d = int(shifted[:, 1].min()), int((shifted[:, 1] + shifted[:, 2]).max())
        with self.pool.lock:
            self._check_open()
            self._hazard([(src.buffer, lo_s, hi_s)], [(dst.buffer, lo_d, hi_d)])
            for a in range(0, len(regions), COPY_CHUNK):     # disjoint regions: no barriers
                lib.vkCmdCopyBuffer(self.cmd, src.buffer, dst.buffer,
                                    min(COPY_CHUNK, len(regions) - a), arr + a)
            self._keep.append(arr)

    @lifetime.entry
    def fill(self, dst: Allocation, offset: int, size: int, word: int) -> None:
        """Record ``vkCmdFillBuffer`` of a 32-bit word (offset and size multiples of 4)."""
        self._check_open()
        self._use(dst)
        rng = (dst.buffer, dst.offset + offset, dst.offset + offset + size)
        with self.pool.lock:
            self._check_open()
            self._hazard([], [rng])
            lib.vkCmdFillBuffer(self.cmd, dst.buffer, dst.offset + offset, size, word & 0xFFFFFFFF)

    @lifetime.entry
    def barrier(self) -> None:
        """An explicit full barrier (rarely needed: hazards are tracked)."""
        with self.pool.lock:
            self._check_open()
            self._barrier(_STAGES, _STAGES, _WRITES, _SHADER_RW | _XFER_RW)
            self._written.clear()
            self._read.clear()

    @lifetime.entry
    def mark(self) -> None:
        """A full barrier, then a timestamp once everything recorded before it is done:
        the time between two marks is what the commands between them took, none of
        them overlapping commands outside (a profile's per-node times).  A sequence
        takes the ``marks`` its constructor was given; without timestamps (not timed, or
        a device without them) it records the barrier only."""
        with self.pool.lock:
            self._check_open()
            self._barrier(_STAGES, _STAGES, _WRITES, _SHADER_RW | _XFER_RW)
            self._written.clear()
            self._read.clear()
            if self._query_pool is None:
                return
            if self._marked + 2 >= self._queries:
                raise DeviceError(f"this sequence takes {self._queries - 2} marks")
            lib.vkCmdWriteTimestamp(self.cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT,
                                    self._query_pool, 2 + self._marked)
            self._marked += 1

    # -- submission --------------------------------------------------------------------
    @lifetime.entry
    def end(self) -> None:
        """End recording (idempotent).  ``ended`` is tested and set under the pool lock:
        threads making the first :meth:`run` of one sequence at once end it once (testing
        it outside recorded the barrier and ``vkEndCommandBuffer`` twice, the second time
        on an executable buffer: VUID-vkEndCommandBuffer-commandBuffer-00059)."""
        if self.ended:
            return
        with self.pool.lock:
            if self.ended:
                return
            # Device writes become visible to the host once the fence signals.
            self._barrier(_STAGES, vk.VK_PIPELINE_STAGE_HOST_BIT, _WRITES,
                          vk.VK_ACCESS_HOST_READ_BIT)
            if self._query_pool is not None:
                lib.vkCmdWriteTimestamp(self.cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT,
                                        self._query_pool, 1)
            vk.check(lib.vkEndCommandBuffer(self.cmd), "vkEndCommandBuffer")
            self.ended = True

    def run(self) -> "Sequence":
        """Submit and wait; can be called again to replay the same commands."""
        ctx = self.ctx
        with ctx.lifetime:              # (inline: the hot path of every replay)
            if self.closed:
                raise DeviceError("this sequence was closed")
            if not self.ended:
                self.end()
            for ref in self._allocs:
                if not _live(ref()):
                    raise DeviceError("a buffer this sequence uses was freed; record it again")
            if self._timed and ctx.pipelines.inflight:
                ctx.pipelines.quiesce()     # (a CPU device's timing shares no CPU with them)
            with self._lock:
                if self._fresh:
                    self._allow_first_use(ctx)
                self._submit_and_wait(ctx)
                if self._first_use:
                    self._first_use_done()
        return self

    def _allow_first_use(self, ctx) -> None:
        """Lengthen this submission's wait by the allowance of the pipelines it dispatches
        that no completed submission dispatched yet (see :data:`FIRST_USE_S`), and tell
        the context, whose ``close`` waits for calls in flight that long."""
        fresh = [p for p in self._fresh.values() if not p.dispatched]
        if not fresh:
            self._fresh.clear()
            return
        self._first_use = len(fresh)
        limit = wait_limit_s(len(fresh))
        self._timeout_ns = int(limit * 1e9)
        ctx.expect_wait(limit)

    def _first_use_done(self) -> None:
        """The submission completed: its pipelines were dispatched; replays wait
        ``VKML_TIMEOUT`` alone."""
        for p in self._fresh.values():
            p.dispatched = True
        self._fresh.clear()
        self._first_use = 0
        self._timeout_ns = TIMEOUT_NS

    def _submit_and_wait(self, ctx) -> None:
        device, fence_ptr = self.device, self._fence
        fence = fence_ptr[0]
        t0 = _perf()
        res = self._res
        res.idle = False
        with ctx.queue_lock:
            result = _submit(ctx.queue, 1, self.submit_info, fence)
        if result < 0:
            res.idle = True             # nothing was submitted: no fence to wait for
            ctx.fail(result, "vkQueueSubmit")
        result = _NOT_READY
        spin = self._spin
        if spin:
            until = t0 + spin
            while True:
                result = _fence_status(device, fence)
                if result != _NOT_READY or _perf() >= until:
                    break
                if SPIN_YIELD:
                    _yield()
        if result == _NOT_READY:
            tail = self._tail
            deadline = t0 + self._timeout_ns * 1e-9    # the submission's whole wait
            if tail and self._took > 2 * tail:
                result = self._wait_tail(device, fence_ptr, t0 + self._took - tail, deadline)
            else:
                result = _wait_fences(device, 1, fence_ptr, vk.VK_TRUE, _ns_until(deadline))
        self._took = took = _perf() - t0
        self._spin = SPIN_S if took < 4 * SPIN_S else 0.0
        if result == vk.VK_TIMEOUT:
            ctx.fail(result, f"waiting for the GPU ({describe_wait(self._first_use)})")
        if result < 0:
            ctx.fail(result, "vkWaitForFences")
        _reset_fences(device, 1, fence_ptr)
        res.idle = True
        if self._query_pool is not None:
            n = 2 + self._marked
            r = lib.vkGetQueryPoolResults(
                device, self._query_pool, 0, n, 8 * n, self._stamps, 8,
                vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
            if r == vk.VK_SUCCESS:
                period, s = ctx.limits["timestampPeriod"], self._stamps
                ticks = ctx.mask_timestamp(s[1] - s[0])
                self.gpu_time_ns = ticks * period
                if n > 2:
                    self.mark_ns = [ctx.mask_timestamp(s[k] - s[0]) * period
                                    for k in range(2, n)]

    def _wait_tail(self, device, fence_ptr, poll_from: float, deadline: float) -> int:
        """Sleep in vkWaitForFences until ``poll_from`` (perf_counter seconds), then poll
        the fence for up to twice :data:`WAIT_TAIL_S`, then sleep again; all of it ends
        by ``deadline`` (the submission's timeout: a previous run's length, which sets
        ``poll_from``, can exceed it)."""
        left = min(poll_from, deadline) - _perf()
        result = _NOT_READY
        if left > 0:
            result = _wait_fences(device, 1, fence_ptr, vk.VK_TRUE, int(left * 1e9))
            if result != vk.VK_TIMEOUT:
                return result
        fence, until = fence_ptr[0], min(_perf() + 2 * self._tail, deadline)
        while result != vk.VK_SUCCESS and result >= 0 and _perf() < until:
            result = _fence_status(device, fence)
        if result == vk.VK_SUCCESS or result < 0:
            return result
        return _wait_fences(device, 1, fence_ptr, vk.VK_TRUE, _ns_until(deadline))

    def close(self) -> None:
        """Release the command buffer, fence and descriptor sets (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self._finalizer.detach()
        with self._lock:
            self._res.release()     # nothing to do once the device is closing
        self._keep.clear()
        self._allocs.clear()
        self._slots.clear()
        self._fresh.clear()

    def __enter__(self) -> "Sequence":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _live(alloc) -> bool:
    """Whether an allocation a recording bound still holds its memory (the object may
    outlive its freeing)."""
    return alloc is not None and alloc.block is not None


def place_of(alloc: Allocation):
    """``(block, offset, size)`` of an allocation without buffer views or
    sub-allocations (what :meth:`Sequence.rebind` may move a recording to), else None."""
    if alloc.block is None or alloc._views or alloc._subs:
        return None
    return (alloc.block, alloc.offset, alloc.size)


class _Resources:
    """The Vulkan objects of a sequence, released by ``close`` or, after garbage
    collection, by the context at its next safe point (never inside ``__del__``).
    Created inside an entry of the device (see :mod:`.lifetime`) and tracked by the
    context, which destroys those still alive when it closes."""

    def __init__(self, ctx, pool: CommandPool):
        self.ctx, self.pool = ctx, pool
        self.query_pool = None
        self.sets: list = []
        self.released = False
        #: False from a submission until its fence was waited for and reset
        self.idle = True
        spare = pool.take_spare()
        if spare is not None:
            self.cmd_ptr, self.fence = spare
            ctx.track(self)
            return
        self.cmd_ptr = pool.allocate()
        info = ffi.new("VkFenceCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO})
        self.fence = ffi.new("VkFence*")
        try:
            vk.check(lib.vkCreateFence(ctx.device, info, vk.NULL, self.fence), "vkCreateFence")
        except DeviceError:
            pool.free(self.cmd_ptr)
            raise
        ctx.track(self)

    @lifetime.release
    def release(self) -> None:
        if not self.released:
            self.destroy()

    def destroy(self) -> None:
        """Destroy the objects now (unguarded: ``release``, or the closing context)."""
        if self.released:
            return
        self.released = True
        self.ctx.forget(self)
        device = self.ctx.device
        for pool, dset in self.sets:
            self.ctx.descriptor_pools.free(pool, dset)
        self.sets.clear()
        if not (self.idle and not self.ctx.lost and self.pool.keep(self.cmd_ptr, self.fence)):
            self.pool.free(self.cmd_ptr)
            lib.vkDestroyFence(device, self.fence[0], vk.NULL)
        if self.query_pool is not None:
            lib.vkDestroyQueryPool(device, self.query_pool, vk.NULL)

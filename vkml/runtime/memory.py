"""Device memory: large blocks, sub-allocated, each block one ``VkBuffer``.

* Where the device has host-visible device-local memory that reads back fast (CPU
  drivers, integrated GPUs, or any host-cached type) tensors live there and are mapped
  once; uploads and downloads are plain memory copies.
* Otherwise (discrete GPUs) tensors live in device-local memory and transfers go
  through staging blocks with ``vkCmdCopyBuffer``.  ``VKML_FORCE_STAGING=1`` takes this
  path on any device, so the CPU drivers test it too.
* Allocations larger than half a block get a dedicated block.  A request larger than
  ``maxMemoryAllocationSize`` or than what is left of the heap raises
  :class:`~vkml.DeviceError` before the driver is asked, naming both figures.
* :class:`HostImports` (VK_EXT_external_memory_host, where the tensors live in host
  memory anyway): NumPy arrays' own pages as allocations, and page-aligned result
  buffers handed out as NumPy arrays, so the functional API copies nothing.
"""
from __future__ import annotations

import bisect
import gc
import mmap
import os
import threading
import weakref

import numpy as np

from ..errors import DeviceError
from . import lifetime, vk
from .vk import ffi, lib
from ..intmath import ceil_div

MiB = 1 << 20
BUFFER_USAGE = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_UNIFORM_BUFFER_BIT
                | vk.VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT
                | vk.VK_BUFFER_USAGE_STORAGE_TEXEL_BUFFER_BIT
                | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
_DL = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
_HV = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
_HC = vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
_CACHED = vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT


def _fmt(n: int) -> str:
    return f"{n} bytes ({n / MiB:.1f} MiB)"


class Block:
    """One ``VkDeviceMemory`` with a ``VkBuffer`` over all of it and a free list."""

    def __init__(self, heap: "Heap", size: int, dedicated: bool):
        ctx = heap.ctx
        self.heap, self.size, self.dedicated = heap, size, dedicated
        self.device = ctx.device
        info = ffi.new("VkBufferCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "size": size,
            "usage": BUFFER_USAGE, "sharingMode": vk.VK_SHARING_MODE_EXCLUSIVE})
        buf = ffi.new("VkBuffer*")
        vk.check(lib.vkCreateBuffer(self.device, info, vk.NULL, buf), "vkCreateBuffer")
        self.buffer = buf[0]
        req = ffi.new("VkMemoryRequirements*")
        lib.vkGetBufferMemoryRequirements(self.device, self.buffer, req)
        alloc = ffi.new("VkMemoryAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
            "allocationSize": req.size, "memoryTypeIndex": heap.type_index})
        mem = ffi.new("VkDeviceMemory*")
        result = lib.vkAllocateMemory(self.device, alloc, vk.NULL, mem)
        if result < 0:
            lib.vkDestroyBuffer(self.device, self.buffer, vk.NULL)
            raise DeviceError(f"out of device memory: vkAllocateMemory of {_fmt(req.size)} "
                              f"failed with {vk.result_name(result)} ({heap.describe()})", result)
        self.memory = mem[0]
        self.footprint = req.size
        vk.check(lib.vkBindBufferMemory(self.device, self.buffer, self.memory, 0),
                 "vkBindBufferMemory")
        self.host = None
        if heap.mappable:
            ptr = ffi.new("void**")
            vk.check(lib.vkMapMemory(self.device, self.memory, 0, size, 0, ptr), "vkMapMemory")
            self.host = np.frombuffer(ffi.buffer(ptr[0], size), dtype=np.uint8)
        self.free_list = [(0, size)]          # sorted (offset, size)
        #: Buffer views over this block, also listed by their allocation: destroyed with
        #: the block even where the allocation was dropped without being freed.
        self.views: set = set()
        self.used = 0

    def try_alloc(self, size: int, align: int) -> int | None:
        for i, (off, length) in enumerate(self.free_list):
            start = ceil_div(off, align) * align
            if start + size <= off + length:
                del self.free_list[i]
                if start + size < off + length:
                    self.free_list.insert(i, (start + size, off + length - start - size))
                if start > off:
                    self.free_list.insert(i, (off, start - off))
                self.used += size
                return start
        return None

    def release(self, offset: int, size: int) -> None:
        i = bisect.bisect_left(self.free_list, (offset, 0))
        self.free_list.insert(i, (offset, size))
        # merge with the neighbours
        if i + 1 < len(self.free_list) and offset + size == self.free_list[i + 1][0]:
            self.free_list[i] = (offset, size + self.free_list[i + 1][1])
            del self.free_list[i + 1]
        if i > 0 and self.free_list[i - 1][0] + self.free_list[i - 1][1] == offset:
            prev = self.free_list[i - 1]
            self.free_list[i - 1] = (prev[0], prev[1] + self.free_list[i][1])
            del self.free_list[i]
        self.used -= size

    def destroy(self) -> None:
        if self.memory is None:
            return
        self.host = None
        for v in self.views:
            lib.vkDestroyBufferView(self.device, v, vk.NULL)
        self.views.clear()
        lib.vkDestroyBuffer(self.device, self.buffer, vk.NULL)
        lib.vkFreeMemory(self.device, self.memory, vk.NULL)
        self.memory = None


class Allocation:
    """A sub-range of a block: what a tensor or a parameter buffer owns."""

    __slots__ = ("heap", "block", "offset", "size", "parent", "_views", "_subs",
                 "__weakref__")

    def __init__(self, heap: "Heap", block: Block, offset: int, size: int,
                 parent: "Allocation | None" = None):
        self.heap, self.block, self.offset, self.size = heap, block, offset, size
        #: The allocation this one is a part of (see :meth:`sub_allocation`), else None.
        self.parent = parent
        self._views: dict | None = None
        self._subs: list | None = None      # live sub-allocations, released with this one

    @property
    def buffer(self):
        return self.block.buffer

    @property
    def host(self) -> np.ndarray | None:
        """The mapped bytes of this allocation (``None`` for device-only memory)."""
        if self.block.host is None:
            return None
        return self.block.host[self.offset:self.offset + self.size]

    def view(self, fmt: int, offset: int, size: int):
        """A ``VkBufferView`` over ``[offset, offset+size)`` of this allocation (cached)."""
        key = (fmt, offset, size)
        if self._views is None:
            self._views = {}
        v = self._views.get(key)
        if v is None:
            info = ffi.new("VkBufferViewCreateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO, "buffer": self.buffer,
                "format": fmt, "offset": self.offset + offset, "range": size})
            h = ffi.new("VkBufferView*")
            vk.check(lib.vkCreateBufferView(self.heap.ctx.device, info, vk.NULL, h),
                     "vkCreateBufferView")
            v = self._views[key] = h[0]
            self.block.views.add(v)
        return v

    def sub_allocation(self, offset: int, size: int) -> "Allocation":
        """``[offset, offset+size)`` of this allocation as an allocation of its own (see
        :meth:`Heap.sub_allocation`)."""
        return self.heap.sub_allocation(self, offset, size)

    def free(self) -> None:
        if self.block is not None:
            self.heap.release(self)

    @property
    def alive(self) -> bool:
        return self.block is not None


class _Releasing:
    """Release of allocations under ``self.lock``, and of those that finalizers free."""

    def defer_free(self, a: "Allocation") -> None:
        """Free ``a`` at the next safe point: for finalizers, which may run anywhere."""
        self.pending.append(a)

    def _drain(self) -> None:
        while self.pending:
            self._release(self.pending.pop())

    @lifetime.release
    def release(self, a: "Allocation") -> None:
        with self.lock:
            self._release(a)
            self._drain()

    @lifetime.release
    def _drain_released(self) -> None:
        """Free what finalizers handed over (nothing to do once the device closes)."""
        with self.lock:
            self._drain()

    @lifetime.entry
    def sub_allocation(self, parent: "Allocation", offset: int, size: int) -> "Allocation":
        """A part of ``parent`` bound as an allocation of its own (a graph's intermediates
        in its arena).  It has its own buffer views; freeing it destroys only those (the
        bytes stay ``parent``'s), freeing ``parent`` releases it too, and closing the
        device marks it dead like any allocation."""
        if not (0 <= offset and 0 <= size and offset + size <= parent.size):
            raise ValueError(f"[{offset}, {offset + size}) is not inside an allocation of "
                             f"{parent.size} bytes")
        with self.lock:
            if parent.block is None:
                raise DeviceError("the allocation was already freed")
            a = Allocation(self, parent.block, parent.offset + offset, size, parent)
            if parent._subs is None:
                parent._subs = []
            parent._subs.append(a)
            self.live.add(a)
        return a

    def _detach(self, a: "Allocation"):
        """Destroy ``a``'s views (and its sub-allocations') and mark it released; return
        the block whose range it gives back: None if it was released already, or if it
        is a sub-allocation (its bytes are its parent's)."""
        block = a.block
        if block is None:
            return None
        subs, a._subs = a._subs, None
        for sub in subs or ():
            self._detach(sub)
        for v in (a._views or {}).values():
            lib.vkDestroyBufferView(self.ctx.device, v, vk.NULL)
            block.views.discard(v)
        a._views = None
        a.block = None
        if a.parent is not None:
            if a.parent._subs is not None:
                a.parent._subs.remove(a)
            self.live.discard(a)
            return None
        return block


class Heap(_Releasing):
    """Blocks of one memory type, and the policy to carve them."""

    def __init__(self, ctx, type_index: int, heap_index: int, heap_size: int, mappable: bool,
                 block_size: int, alignment: int, max_alloc: int, name: str):
        self.ctx, self.type_index, self.heap_index = ctx, type_index, heap_index
        self.heap_size, self.mappable, self.block_size = heap_size, mappable, block_size
        self.alignment, self.max_alloc, self.name = alignment, max_alloc, name
        self.blocks: list[Block] = []
        self.lock = threading.Lock()
        self.reserved = 0             # bytes of device memory held by blocks
        self.live: "weakref.WeakSet[Allocation]" = weakref.WeakSet()
        self.pending: list[Allocation] = []   # freed by garbage collection, see defer_free
        #: Empty dedicated blocks kept for reuse, in bytes (given back under pressure).
        self.spare_budget = min(256 << 20, heap_size // 8)

    def describe(self) -> str:
        return (f"{self.name} memory type {self.type_index}: heap of {_fmt(self.heap_size)}, "
                f"{_fmt(self.reserved)} held by vkml, at most {_fmt(self.max_alloc)} "
                f"per allocation (maxMemoryAllocationSize)")

    @lifetime.entry
    def allocate(self, size: int, align: int = 0) -> Allocation:
        size = max(int(size), 4)
        align = max(align, self.alignment)
        size = ceil_div(size, align) * align
        if size > self.max_alloc:
            raise DeviceError(
                f"cannot allocate {_fmt(size)}: the device allows at most {_fmt(self.max_alloc)} "
                f"in one allocation (maxMemoryAllocationSize)")
        if size > self.heap_size:
            raise DeviceError(
                f"cannot allocate {_fmt(size)}: the device's memory heap holds "
                f"{_fmt(self.heap_size)}")
        with self.lock:
            self._drain()
            if size <= self.block_size // 2:
                for block in self.blocks:
                    if not block.dedicated and block.size - block.used >= size:
                        off = block.try_alloc(size, align)
                        if off is not None:
                            return self._track(Allocation(self, block, off, size))
                block = self._new_block(self.block_size, dedicated=False)
            else:
                block = self._spare_dedicated(size) or self._new_block(size, dedicated=True)
            off = block.try_alloc(size, align)
            return self._track(Allocation(self, block, off, size))

    def _spare_dedicated(self, size: int) -> Block | None:
        """An empty dedicated block that fits ``size`` without wasting half of itself:
        reusing it skips the driver's allocation and the first-touch page faults (a
        64 MiB tensor allocated afresh on every call cost more than the operator)."""
        fits = [b for b in self.blocks
                if b.dedicated and b.used == 0 and size <= b.size <= 2 * size]
        return min(fits, key=lambda b: b.size) if fits else None

    def _track(self, a: Allocation) -> Allocation:
        self.live.add(a)
        return a

    def _new_block(self, size: int, dedicated: bool) -> Block:
        if self.reserved + size > self.heap_size:
            self._trim()
            if self.reserved + size > self.heap_size:
                gc.collect()     # tensors dropped by the user but not yet collected
                self._drain()
                self._trim()
            if self.reserved + size > self.heap_size:
                raise DeviceError(
                    f"out of device memory: cannot allocate {_fmt(size)}; "
                    f"{_fmt(self.reserved)} of the {_fmt(self.heap_size)} heap is in use")
        try:
            block = Block(self, size, dedicated)
        except DeviceError as err:
            if err.result not in vk.OUT_OF_MEMORY:
                raise
            gc.collect()
            self._drain()
            self._trim()
            block = Block(self, size, dedicated)
        self.blocks.append(block)
        self.reserved += block.footprint
        return block

    def _trim(self) -> None:
        """Give back every empty block (the caller holds the lock)."""
        for block in [b for b in self.blocks if b.used == 0]:
            self._destroy_block(block)

    def _destroy_block(self, block: Block) -> None:
        self.blocks.remove(block)
        self.reserved -= block.footprint
        block.destroy()

    def _release(self, a: Allocation) -> None:
        block = self._detach(a)
        if block is None:
            return
        block.release(a.offset, a.size)
        if block.used == 0:
            if block.dedicated:
                spare = sum(b.size for b in self.blocks if b.dedicated and b.used == 0)
                if spare > self.spare_budget:
                    self._destroy_block(block)
            elif sum(1 for b in self.blocks if b.used == 0 and not b.dedicated) > 1:
                self._destroy_block(block)

    def stats(self) -> dict:
        self._drain_released()
        with self.lock:
            return {"blocks": len(self.blocks), "reserved": self.reserved,
                    "used": sum(b.used for b in self.blocks)}

    def destroy(self) -> None:
        """Destroy every block and its views (``Context.close``, after the device's last
        entry); allocations still held become dead (``alive`` is False)."""
        with self.lock:
            for a in list(self.live):
                a._views = a._subs = None
                a.block = None
            self.pending.clear()
            for block in list(self.blocks):
                self._destroy_block(block)


def choose_heaps(ctx, pd, info, force_staging: bool = False) -> tuple[Heap, Heap]:
    """Pick the tensor heap and the staging heap of a device (see module doc)."""
    props = ffi.new("VkPhysicalDeviceMemoryProperties*")
    lib.vkGetPhysicalDeviceMemoryProperties(pd, props)
    types = [(i, props.memoryTypes[i].propertyFlags, props.memoryTypes[i].heapIndex)
             for i in range(props.memoryTypeCount)]
    heaps = [props.memoryHeaps[i].size for i in range(props.memoryHeapCount)]
    limits = ctx.limits
    align = max(16, limits["minStorageBufferOffsetAlignment"],
                limits["minTexelBufferOffsetAlignment"], limits["minUniformBufferOffsetAlignment"],
                limits["nonCoherentAtomSize"])
    max_alloc = _max_allocation(pd, info)
    force_staging = force_staging or os.environ.get("VKML_FORCE_STAGING", "0") not in ("", "0")
    unified = info.device_type in ("cpu", "integrated")

    def pick(want, prefer=0, avoid=0):
        best = None
        for i, flags, h in types:
            if flags & want != want:
                continue
            score = (bool(flags & prefer), not (flags & avoid), heaps[h])
            if best is None or score > best[0]:
                best = (score, i, flags, h)
        return best

    direct = pick(_DL | _HV | _HC, prefer=_CACHED)
    if direct and not force_staging and (unified or direct[2] & _CACHED):
        _, ti, _, hi = direct
        tensor_heap = Heap(ctx, ti, hi, heaps[hi], True, _block_size(heaps[hi], max_alloc),
                           align, max_alloc, "host-visible device-local")
        return tensor_heap, tensor_heap
    dev = pick(_DL, avoid=_HV) or pick(_DL)
    stage = pick(_HV | _HC, prefer=_CACHED, avoid=_DL) or pick(_HV | _HC)
    if dev is None or stage is None:
        raise DeviceError("the device exposes no usable memory type")
    tensor_heap = Heap(ctx, dev[1], dev[3], heaps[dev[3]], False,
                       _block_size(heaps[dev[3]], max_alloc), align, max_alloc, "device-local")
    staging_heap = Heap(ctx, stage[1], stage[3], heaps[stage[3]], True,
                        _block_size(heaps[stage[3]], max_alloc), align, max_alloc, "staging")
    return tensor_heap, staging_heap


def _block_size(heap_size: int, max_alloc: int) -> int:
    return int(min(64 * MiB, max_alloc, max(heap_size // 16, 4 * MiB)))


def _max_allocation(pd, info) -> int:
    """``maxMemoryAllocationSize`` (Vulkan 1.1), or the largest heap where it is unknown."""
    m3 = ffi.new("VkPhysicalDeviceMaintenance3Properties*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES})
    p2 = ffi.new("VkPhysicalDeviceProperties2*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, "pNext": m3})
    lib.vkGetPhysicalDeviceProperties2(pd, p2)
    value = int(m3.maxMemoryAllocationSize)
    return value if value > 0 else max(size for size, _ in info.memory_heaps)


# -- host memory imported as device memory (VK_EXT_external_memory_host) ----------------------
_HOST_ALLOCATION = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT


class ImportedBlock(Block):
    """Pages of host memory imported as one ``VkDeviceMemory`` with a ``VkBuffer`` over all
    of them: a dedicated block holding one allocation (``destroy`` as for any block)."""

    dedicated = True

    def __init__(self, imports: "HostImports", buffer, memory, base: int, size: int):
        self.heap = imports
        self.device = imports.ctx.device
        self.buffer, self.memory, self.base, self.size = buffer, memory, base, size
        self.used = size
        self.footprint = 0            # the pages belong to the host array, not to vkml
        self.views = set()
        self.host = np.frombuffer(ffi.buffer(ffi.cast("void *", base), size), np.uint8)


class HostImports(_Releasing):
    """Host memory (a NumPy array's pages) bound as device memory without a copy.

    :meth:`allocate_at` imports the pages that hold ``[address, address + size)`` (the
    range rounded out to ``minImportedHostPointerAlignment``) with a buffer over all of
    them; the result is an :class:`Allocation` at the offset of ``address`` in that buffer,
    used like any other (bindings, texel views, windows); :meth:`~Allocation.free`
    releases the import.  The host memory must stay allocated until then: the functional
    API frees an input's import as soon as the execution that used it has completed.

    Results: :meth:`take` gives page-aligned host memory that NumPy owns, imported once;
    :meth:`array` hands it out as the result array, whose base (a ``_Lease``) returns
    it to an idle pool when the array and all its views are gone.  Its import lives as
    long as vkml holds the pages (never longer): it is freed when the pool gives them
    up or at ``Device.close()``, after which the array stays a valid NumPy array.
    """

    name = "imported host"
    mappable = True
    #: An idle result buffer is reused for a request this much smaller (a quarter).
    REUSE_SLACK = 4

    def __init__(self, ctx, heap: Heap):
        self.ctx = ctx
        lim = ctx.limits
        self.page = int(lim["minImportedHostPointerAlignment"])
        #: Where an allocation may start in its buffer, and how its size is rounded:
        #: operators align binding offsets (storage, texel and uniform) relative to the
        #: allocation and view it in whole 16-byte texels, as on the tensor heap.
        self.alignment = max(16, lim["minStorageBufferOffsetAlignment"],
                             lim["minTexelBufferOffsetAlignment"],
                             lim["minUniformBufferOffsetAlignment"])
        self.preferred_type = heap.type_index
        props = ffi.new("VkPhysicalDeviceMemoryProperties*")
        lib.vkGetPhysicalDeviceMemoryProperties(ctx.physical_device, props)
        #: The most one import may span, per memory type: its heap's size (a Vulkan rule
        #: for every allocation) and maxMemoryAllocationSize.
        self.max_span = [min(props.memoryHeaps[props.memoryTypes[i].heapIndex].size,
                             heap.max_alloc) for i in range(props.memoryTypeCount)]
        self.lock = threading.Lock()
        self.live: set[Allocation] = set()    # every import not yet released
        self.pending: list[Allocation] = []
        #: Imports made and refused, and result buffers reused, since the device was
        #: opened (tests check which path a call took).
        self.imported = 0
        self.refused = 0
        self.reused = 0
        self._props = vk.proc(ctx.device, "vkGetMemoryHostPointerPropertiesEXT", device=True)
        self._ext = ffi.new("VkExternalMemoryBufferCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
            "handleTypes": _HOST_ALLOCATION})
        #: Result pages (see :meth:`take`): idle ones, most recently used last, and those
        #: whose arrays died since the last call (appended by ``_Lease.__del__``).
        self.idle: list[HostPages] = []
        self.returned: list[HostPages] = []
        self.idle_budget = min(256 << 20, heap.heap_size // 8)
        self.closed = False

    def fits(self, address: int, nbytes: int) -> bool:
        """Whether :meth:`allocate_at` can take this range without asking the driver: the
        start meets the binding alignments, and neither the size rounded up to them nor
        the range rounded out to the import alignment reaches a page of the process that
        the range does not touch (it might not be mapped)."""
        size = ceil_div(max(nbytes, 4), self.alignment) * self.alignment
        last = address + max(nbytes, 1) - 1
        base = address - address % self.page
        end = ceil_div(address + size, self.page) * self.page
        os_page = mmap.PAGESIZE
        return (address % self.alignment == 0 and base // os_page == address // os_page
                and (end - 1) // os_page == last // os_page)

    def _refuse(self) -> None:
        with self.lock:
            self.refused += 1

    @lifetime.entry
    def allocate_at(self, address: int, nbytes: int) -> Allocation | None:
        """Import the pages holding ``nbytes`` at ``address``; ``None`` (counted in
        ``refused``) where :meth:`fits` says no or the driver refuses the pointer."""
        if not self.fits(address, nbytes):
            self._refuse()
            return None
        device = self.ctx.device
        size = ceil_div(max(nbytes, 4), self.alignment) * self.alignment
        base = address - address % self.page
        span = ceil_div(address + size, self.page) * self.page - base
        props = ffi.new("VkMemoryHostPointerPropertiesEXT*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT})
        ptr = ffi.cast("void *", base)
        if self._props(device, _HOST_ALLOCATION, ptr, props) != vk.VK_SUCCESS:
            self._refuse()
            return None
        info = ffi.new("VkBufferCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "pNext": self._ext, "size": span,
            "usage": BUFFER_USAGE, "sharingMode": vk.VK_SHARING_MODE_EXCLUSIVE})
        buf = ffi.new("VkBuffer*")
        vk.check(lib.vkCreateBuffer(device, info, vk.NULL, buf), "vkCreateBuffer")
        req = ffi.new("VkMemoryRequirements*")
        lib.vkGetBufferMemoryRequirements(device, buf[0], req)
        types = props.memoryTypeBits & req.memoryTypeBits
        if not types or req.size > span:
            lib.vkDestroyBuffer(device, buf[0], vk.NULL)
            self._refuse()
            return None
        type_index = (self.preferred_type if types >> self.preferred_type & 1
                      else (types & -types).bit_length() - 1)
        if span > self.max_span[type_index]:
            lib.vkDestroyBuffer(device, buf[0], vk.NULL)
            self._refuse()
            return None
        host = ffi.new("VkImportMemoryHostPointerInfoEXT*", {
            "sType": vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT,
            "handleType": _HOST_ALLOCATION, "pHostPointer": ptr})
        ainfo = ffi.new("VkMemoryAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, "pNext": host,
            "allocationSize": span, "memoryTypeIndex": type_index})
        mem = ffi.new("VkDeviceMemory*")
        if lib.vkAllocateMemory(device, ainfo, vk.NULL, mem) != vk.VK_SUCCESS:
            lib.vkDestroyBuffer(device, buf[0], vk.NULL)
            self._refuse()
            return None
        result = lib.vkBindBufferMemory(device, buf[0], mem[0], 0)
        if result != vk.VK_SUCCESS:
            lib.vkDestroyBuffer(device, buf[0], vk.NULL)
            lib.vkFreeMemory(device, mem[0], vk.NULL)
            raise DeviceError(f"vkBindBufferMemory of imported host memory failed with "
                              f"{vk.result_name(result)}", result)
        block = ImportedBlock(self, buf[0], mem[0], base, span)
        a = Allocation(self, block, address - base, size)
        with self.lock:
            self._drain()
            self.live.add(a)
            self.imported += 1
        return a

    def _release(self, a: Allocation) -> None:
        block = self._detach(a)
        if block is None:
            return
        self.live.discard(a)
        block.destroy()

    # -- result pages ------------------------------------------------------------------
    @lifetime.entry
    def take(self, nbytes: int) -> "HostPages | None":
        """Page-aligned host memory of at least ``nbytes`` (rounded up to the alignment),
        imported: an idle buffer whose array died, else a new one.  Reuse skips the
        first-touch page faults, which the kernel writing fresh pages pays (lavapipe:
        ~0.06 ms per MiB; a 64 MiB padding, bench/RESULTS.md "Kernel design").  The idle
        buffers (and their imports) are kept up to ``idle_budget`` bytes, oldest given
        back first.  Hand it out with :meth:`array`, or back with :meth:`give_back`.
        ``None`` (counted in ``refused``) where the device cannot import it: larger than
        any memory type's :attr:`max_span` (checked before the host pages are
        allocated), or refused by :meth:`allocate_at`."""
        size = ceil_div(max(nbytes, 4), self.alignment) * self.alignment
        with self.lock:
            self._drain()
            fits = [p for p in self.idle
                    if size <= p.size <= size + size // self.REUSE_SLACK + self.page]
            if fits:
                found = min(fits, key=lambda p: p.size)
                self.idle.remove(found)
                self.reused += 1
                return found
        span = ceil_div(size, self.page) * self.page
        if span > max(self.max_span, default=0):
            # no memory type could import it: refuse before allocating the host pages
            self._refuse()
            return None
        raw = np.empty(span + self.page, np.uint8)
        raw = raw[-raw.ctypes.data % self.page:][:span]
        alloc = self.allocate_at(raw.ctypes.data, span)
        return None if alloc is None else HostPages(raw, alloc)

    def array(self, pages: "HostPages", shape, dtype) -> np.ndarray:
        """A NumPy array over ``pages``; they come back to :meth:`take` once that array
        and every view of it are gone (their base is a ``_Lease``)."""
        dtype = np.dtype(dtype)
        lease = _Lease()
        lease.__array_interface__ = {"data": (pages.raw.ctypes.data, False),
                                     "shape": tuple(shape), "typestr": dtype.str,
                                     "version": 3}
        lease.pages, lease.imports = pages, self
        return np.asarray(lease)

    def leased(self, array: np.ndarray) -> Allocation | None:
        """The import of the pages under ``array`` when it starts where one of this
        device's result arrays does (a result passed back in: no second import)."""
        base = array
        while isinstance(base, np.ndarray):
            base = base.base
        if (isinstance(base, _Lease) and base.imports is self and base.pages.alloc.alive
                and array.ctypes.data == base.pages.raw.ctypes.data):
            return base.pages.alloc
        return None

    def give_back(self, pages: "HostPages") -> None:
        self.returned.append(pages)

    def _drain(self) -> None:
        super()._drain()
        while self.returned:
            pages = self.returned.pop()
            if pages.alloc.alive:
                self.idle.append(pages)
        held = sum(p.size for p in self.idle)
        while held > self.idle_budget:
            old = self.idle.pop(0)
            held -= old.size
            self._release(old.alloc)

    def stats(self) -> dict:
        self._drain_released()
        with self.lock:
            return {"live": len(self.live), "imported": self.imported, "refused": self.refused,
                    "reused": self.reused, "idle": len(self.idle),
                    "idle_bytes": sum(p.size for p in self.idle)}

    def destroy(self) -> None:
        with self.lock:
            self.closed = True
            for a in list(self.live):
                self._release(a)
            self.pending.clear()
            self.returned.clear()
            self.idle.clear()


class HostPages:
    """Page-aligned host memory (``raw``, owned by NumPy) and its import (``alloc``)."""

    __slots__ = ("raw", "alloc", "size")

    def __init__(self, raw: np.ndarray, alloc: Allocation):
        self.raw, self.alloc, self.size = raw, alloc, raw.nbytes


class _Lease:
    """The base of a result array over pooled pages (see :meth:`HostImports.array`)."""

    __slots__ = ("__array_interface__", "pages", "imports", "__weakref__")

    def __del__(self):
        imports = self.imports
        if not imports.closed:        # may run in any thread: only a list append here
            imports.returned.append(self.pages)

"""A logical device: queue, enabled features, memory, pipelines, descriptors, commands.

Optional features are enabled when the device has them (16/8-bit storage, float16 and
int8 arithmetic, int16, int64, float64).  ``VKML_DISABLE_FEATURES`` (comma separated:
``storage16,storage8,fp16,int8,int16,int64,fp64,push_descriptor,host_import,full_subgroups``) turns
some off, so one driver can exercise the fallback paths another driver would take.

``host_import`` (VK_EXT_external_memory_host) lets the functional NumPy path bind the
caller's arrays and the result's pages as device memory instead of copying them; it is
used only where tensors live in host memory anyway (CPU drivers, integrated GPUs: a
discrete GPU would read the imported pages over PCIe), never with ``force_staging`` /
``VKML_FORCE_STAGING=1``.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from ..errors import DeviceError
from . import scheduler, vk
from .instance import DeviceInfo, Instance
from .lifetime import CLOSE_MARGIN_S, CLOSE_WAIT_S, Lifetime
from .memory import Allocation, HostImports, choose_heaps
from .pipelines import STORAGE, STORAGE_TEXEL, UNIFORM, UNIFORM_TEXEL, PipelineCache
from .scheduler import CommandPool, DescriptorPools, Sequence
from .vk import ffi, lib

FEATURE_NAMES = ("storage16", "storage8", "fp16", "int8", "int16", "int64", "fp64",
                 "push_descriptor", "host_import", "full_subgroups")
_TEXEL_BYTES = {vk.VK_FORMAT_R32_UINT: 4, vk.VK_FORMAT_R32_SFLOAT: 4,
                vk.VK_FORMAT_R32G32_UINT: 8, vk.VK_FORMAT_R32G32_SFLOAT: 8,
                vk.VK_FORMAT_R32G32B32A32_UINT: 16, vk.VK_FORMAT_R32G32B32A32_SFLOAT: 16,
                vk.VK_FORMAT_R16G16B16A16_SFLOAT: 8, vk.VK_FORMAT_R16_SFLOAT: 2,
                vk.VK_FORMAT_R8_UINT: 1, vk.VK_FORMAT_R16_UINT: 2}


def disabled_features() -> set[str]:
    raw = os.environ.get("VKML_DISABLE_FEATURES", "")
    return {f.strip() for f in raw.split(",") if f.strip()}


class Context:
    """Everything vkml holds for one Vulkan device."""

    def __init__(self, info: DeviceInfo, disable: set[str] | None = None,
                 limits: dict | None = None, force_staging: bool = False):
        inst = Instance.get()
        self.instance = inst
        self.info = info
        pd = inst.physical_device(info.index)
        self.physical_device = pd
        off = disabled_features() | set(disable or ())
        unknown = off - set(FEATURE_NAMES)
        if unknown:
            raise DeviceError(f"unknown feature names to disable: {sorted(unknown)} "
                              f"(known: {', '.join(FEATURE_NAMES)})")
        self.features = {k: (v and k not in off) for k, v in info.features.items()}
        # Not one of ``features``: those choose kernels (and key the calibrations made for
        # them); this only chooses how NumPy arrays reach the kernels.
        self.host_import = (info.features.get("external_memory_host", False)
                            and "host_import" not in off
                            and 0 < info.limits["minImportedHostPointerAlignment"] <= 1 << 16)
        # Limits may be lowered (never raised), so tests reach the paths of small devices.
        self.limits = dict(info.limits)
        for key, value in (limits or {}).items():
            if key not in self.limits:
                raise DeviceError(f"unknown device limit {key!r}")
            self.limits[key] = min(self.limits[key], value) if not isinstance(value, tuple) \
                else tuple(min(a, b) for a, b in zip(self.limits[key], value))
        if not info.features.get("compute_queue"):
            raise DeviceError(f"{info.name} has no compute queue")
        self.queue_family, ts_bits = self._pick_queue(pd)
        self._ts_mask = (1 << ts_bits) - 1 if 0 < ts_bits < 64 else (1 << 64) - 1
        self.device = self._create_device(pd, info)
        q = ffi.new("VkQueue*")
        lib.vkGetDeviceQueue(self.device, self.queue_family, 0, q)
        self.queue = q[0]
        self.queue_lock = threading.Lock()
        #: Every call into Vulkan goes through this guard (see :mod:`.lifetime`).
        self.lifetime = Lifetime()
        self.push_descriptor = (vk.proc(self.device, "vkCmdPushDescriptorSetKHR", device=True)
                                if self.features["push_descriptor"] else None)
        self.tensor_heap, self.staging_heap = choose_heaps(self, pd, info, force_staging)
        self.mappable = self.tensor_heap.mappable
        #: Host memory imports (see the module doc), or None where they are not used.
        self.host_imports = None
        if self.host_import and self.mappable and info.device_type in ("cpu", "integrated"):
            self.host_imports = HostImports(self, self.tensor_heap)
        self.pipelines = PipelineCache(self)
        self.descriptor_pools = DescriptorPools(self)
        self._pool = CommandPool(self)
        self._pending: list = []
        self._resources: set = set()
        self._res_lock = threading.Lock()
        #: monotonic time by which every wait allowed more than ``VKML_TIMEOUT`` ends
        self._waits_until = 0.0

    # -- creation ----------------------------------------------------------------------
    @staticmethod
    def _pick_queue(pd) -> tuple[int, int]:
        count = ffi.new("uint32_t*")
        lib.vkGetPhysicalDeviceQueueFamilyProperties(pd, count, vk.NULL)
        props = ffi.new("VkQueueFamilyProperties[]", count[0])
        lib.vkGetPhysicalDeviceQueueFamilyProperties(pd, count, props)
        for i in range(count[0]):
            if props[i].queueFlags & vk.VK_QUEUE_COMPUTE_BIT:
                return i, props[i].timestampValidBits
        raise DeviceError("no compute queue family")

    def _create_device(self, pd, info: DeviceInfo):
        f = self.features
        exts = info.extensions
        api = tuple(int(x) for x in info.api_version.split(".")[:2])
        api12, api11 = api >= (1, 2), api >= (1, 1)
        enable = []
        if f["push_descriptor"]:
            enable.append("VK_KHR_push_descriptor")
        if self.host_import:
            enable.append("VK_EXT_external_memory_host")
            if "VK_KHR_external_memory" in exts and not api11:
                enable.append("VK_KHR_external_memory")
        for name in ("VK_KHR_portability_subset", "VK_KHR_storage_buffer_storage_class"):
            if name in exts:
                enable.append(name)
        if not api12:
            for name in ("VK_KHR_8bit_storage", "VK_KHR_shader_float16_int8"):
                if name in exts:
                    enable.append(name)
        s16 = ffi.new("VkPhysicalDevice16BitStorageFeatures*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES,
            "storageBuffer16BitAccess": f["storage16"]})
        chain = [s16]
        if api12 or "VK_KHR_8bit_storage" in exts:
            chain.append(ffi.new("VkPhysicalDevice8BitStorageFeatures*", {
                "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES,
                "storageBuffer8BitAccess": f["storage8"]}))
        if api12 or "VK_KHR_shader_float16_int8" in exts:
            chain.append(ffi.new("VkPhysicalDeviceShaderFloat16Int8Features*", {
                "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES,
                "shaderFloat16": f["fp16"], "shaderInt8": f["int8"]}))
        if f.get("full_subgroups"):       # pipelines may require full subgroups of a size
            if api < (1, 3):
                enable.append("VK_EXT_subgroup_size_control")
            chain.append(ffi.new("VkPhysicalDeviceSubgroupSizeControlFeatures*", {
                "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES,
                "subgroupSizeControl": 1, "computeFullSubgroups": 1}))
        for a, b in zip(chain, chain[1:]):
            a.pNext = b
        features2 = ffi.new("VkPhysicalDeviceFeatures2*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, "pNext": chain[0]})
        features2.features.shaderInt64 = f["int64"]
        features2.features.shaderFloat64 = f["fp64"]
        features2.features.shaderInt16 = f["int16"]
        priority = ffi.new("float*", 1.0)
        qinfo = ffi.new("VkDeviceQueueCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
            "queueFamilyIndex": self.queue_family, "queueCount": 1, "pQueuePriorities": priority})
        names = [ffi.new("char[]", e.encode()) for e in enable]
        c_names = ffi.new("char*[]", names)
        dinfo = ffi.new("VkDeviceCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, "pNext": features2,
            "queueCreateInfoCount": 1, "pQueueCreateInfos": qinfo,
            "enabledExtensionCount": len(enable), "ppEnabledExtensionNames": c_names})
        h = ffi.new("VkDevice*")
        vk.check(lib.vkCreateDevice(pd, dinfo, vk.NULL, h), f"vkCreateDevice({info.name})")
        return h[0]

    # -- services for the layers above -------------------------------------------------
    @property
    def lost(self) -> bool:
        return self.lifetime.lost

    @lost.setter
    def lost(self, value: bool) -> None:
        self.lifetime.lost = bool(value)

    def command_pool(self) -> CommandPool:
        self.require_open()
        self._drain()
        return self._pool

    def sequence(self, timed: bool = False, hold: bool = True, marks: int = 0) -> Sequence:
        """A new command sequence (see :class:`~vkml.runtime.scheduler.Sequence`);
        ``marks``: how many :meth:`~vkml.runtime.scheduler.Sequence.mark` it takes."""
        return Sequence(self, timed=timed, hold=hold, marks=marks)

    def defer_release(self, res) -> None:
        self._pending.append(res)

    def _drain(self) -> None:
        while True:
            try:
                res = self._pending.pop()
            except IndexError:      # empty (another thread may have taken the last)
                return
            res.release()

    def track(self, res) -> None:
        """Remember ``res`` (a sequence's Vulkan objects) until it is released, so
        :meth:`close` destroys it; called inside an entry, so never after close began."""
        with self._res_lock:
            self._resources.add(res)

    def forget(self, res) -> None:
        with self._res_lock:
            self._resources.discard(res)

    def allocate(self, nbytes: int) -> Allocation:
        return self.tensor_heap.allocate(nbytes)

    def import_host(self, address: int, nbytes: int) -> Allocation | None:
        """Host memory at ``address`` as an allocation, without a copy (see
        :class:`~vkml.runtime.memory.HostImports`); ``None`` where imports are off or the
        range cannot be imported."""
        self.require_open()
        if self.host_imports is None:
            return None
        return self.host_imports.allocate_at(address, nbytes)

    def require_open(self) -> None:
        """Raise :class:`DeviceError` if the device is closing, closed or lost."""
        self.lifetime.check()

    def check_binding(self, name: str, kind: int, offset: int, size: int, fmt: int) -> None:
        """Refuse up front a binding the device cannot take (see the limits named)."""
        lim = self.limits
        if kind in (STORAGE, UNIFORM):
            key = "maxStorageBufferRange" if kind == STORAGE else "maxUniformBufferRange"
            akey = ("minStorageBufferOffsetAlignment" if kind == STORAGE
                    else "minUniformBufferOffsetAlignment")
            if size > lim[key]:
                raise DeviceError(f"{name}: a binding of {size} bytes exceeds {key} "
                                  f"({lim[key]}); the operator must split it")
        else:
            akey = "minTexelBufferOffsetAlignment"
            texels = size // _TEXEL_BYTES.get(fmt, 4)
            if texels > lim["maxTexelBufferElements"]:
                raise DeviceError(f"{name}: a texel binding of {texels} elements exceeds "
                                  f"maxTexelBufferElements ({lim['maxTexelBufferElements']})")
        if offset % lim[akey]:
            raise DeviceError(f"{name}: binding offset {offset} is not a multiple of {akey} "
                              f"({lim[akey]})")

    def binding_alignment(self, kind: int = STORAGE) -> int:
        lim = self.limits
        return lim["minTexelBufferOffsetAlignment" if kind in (UNIFORM_TEXEL, STORAGE_TEXEL)
                   else "minStorageBufferOffsetAlignment"]

    def expect_wait(self, seconds: float) -> None:
        """A submission's fence is about to be waited for up to ``seconds`` (more than
        ``VKML_TIMEOUT``: a first run, see ``scheduler.wait_limit_s``); :meth:`close`
        waits for calls in flight that long."""
        until = time.monotonic() + seconds
        with self._res_lock:
            self._waits_until = max(self._waits_until, until)

    def close_wait_s(self) -> float:
        """How long :meth:`close` waits for calls in flight: ``VKML_TIMEOUT`` and a
        margin, or longer while a first run's longer wait may be in flight."""
        return max(CLOSE_WAIT_S, self._waits_until - time.monotonic() + CLOSE_MARGIN_S)

    def mask_timestamp(self, ticks: int) -> int:
        return ticks & self._ts_mask

    def fail(self, result: int, what: str):
        if result == vk.VK_ERROR_DEVICE_LOST:
            self.lifetime.lost = True
            raise DeviceError(f"{what}: the device was lost (VK_ERROR_DEVICE_LOST)", result)
        if result == vk.VK_TIMEOUT:
            self.lifetime.lost = self.lifetime.timed_out = True
            raise DeviceError(f"{what}: timed out; the device is considered lost", result)
        raise DeviceError(f"{what} failed with {vk.result_name(result)}", result)

    # -- transfers ---------------------------------------------------------------------
    def write(self, alloc: Allocation, data: np.ndarray, offset: int = 0) -> None:
        """Copy the bytes of C-contiguous ``data`` into ``alloc`` at ``offset``."""
        raw = data.reshape(-1).view(np.uint8)
        with self.lifetime:
            block = self._block(alloc)
            if block.host is not None:
                np.copyto(alloc.host[offset:offset + raw.size], raw)
                return
            self._staged(alloc, offset, raw.size, raw, upload=True)

    def read(self, alloc: Allocation, out: np.ndarray, offset: int = 0) -> np.ndarray:
        """Copy ``out.nbytes`` bytes of ``alloc`` from ``offset`` into C-contiguous ``out``."""
        raw = out.reshape(-1).view(np.uint8)
        with self.lifetime:
            block = self._block(alloc)
            if block.host is not None:
                np.copyto(raw, alloc.host[offset:offset + raw.size])
                return out
            self._staged(alloc, offset, raw.size, raw, upload=False)
        return out

    @staticmethod
    def _block(alloc: Allocation):
        block = alloc.block
        if block is None:
            raise DeviceError("the tensor's memory was freed")
        return block

    def _staged(self, alloc, offset, nbytes, raw, upload: bool) -> None:
        chunk = min(self.staging_heap.block_size // 2, 32 << 20)
        done = 0
        while done < nbytes:
            n = min(chunk, nbytes - done)
            stage = self.staging_heap.allocate(n)
            try:
                if upload:
                    np.copyto(stage.host[:n], raw[done:done + n])
                with self.sequence() as seq:
                    if upload:
                        seq.copy(stage, alloc, [(0, offset + done, n)])
                    else:
                        seq.copy(alloc, stage, [(offset + done, 0, n)])
                    seq.run()
                if not upload:
                    np.copyto(raw[done:done + n], stage.host[:n])
            finally:
                stage.free()
            done += n

    # -- teardown ----------------------------------------------------------------------
    def wait_idle(self) -> None:
        """Wait for the queue to drain (nothing to wait for once closing); on a lost
        device, for its timed-out submissions, as long as ``VKML_TIMEOUT`` (a hung one
        would never let ``vkDeviceWaitIdle`` return)."""
        if self.lifetime.try_enter():
            try:
                if self.lost:
                    self._drained()
                    return
                with self.queue_lock:
                    lib.vkDeviceWaitIdle(self.device)
            finally:
                self.lifetime.__exit__()

    def _drained(self) -> bool:
        """Whether the submissions whose waits timed out (their fences neither waited
        for to the end nor reset) have finished or the device is really lost, waiting
        at most ``VKML_TIMEOUT``."""
        with self._res_lock:
            fences = [r.fence[0] for r in self._resources if not r.idle and not r.released]
        if not fences:
            return True
        arr = ffi.new("VkFence[]", fences)
        # VK_ERROR_DEVICE_LOST too: a lost device runs nothing more
        return lib.vkWaitForFences(self.device, len(fences), arr, vk.VK_TRUE,
                                   scheduler.TIMEOUT_NS) != vk.VK_TIMEOUT

    def close(self) -> None:
        """Release every Vulkan object of this device (idempotent, thread safe).

        New calls raise ``DeviceError`` from here on; calls already inside Vulkan finish
        first (see :mod:`.lifetime`), then everything is destroyed at once."""
        if not self.lifetime.close(self.close_wait_s()):
            return
        try:
            with self.queue_lock:
                lib.vkDeviceWaitIdle(self.device)
            self._pending.clear()        # their objects are in _resources too
            with self._res_lock:
                alive = list(self._resources)
                self._resources.clear()
            for res in alive:
                res.destroy()
            self.pipelines.destroy()
            self.descriptor_pools.destroy()
            self._pool.destroy()
            if self.host_imports is not None:
                self.host_imports.destroy()
            self.tensor_heap.destroy()
            if self.staging_heap is not self.tensor_heap:
                self.staging_heap.destroy()
            lib.vkDestroyDevice(self.device, vk.NULL)
            self.device = None
        finally:
            self.lifetime.destroyed()

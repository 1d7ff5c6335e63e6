"""The process-wide Vulkan instance and what each physical device offers.

``VKML_VALIDATION=1`` enables ``VK_LAYER_KHRONOS_validation`` (with synchronization
validation) and a debug messenger that records every error and warning message in
:data:`validation_messages`; the test suite fails on any of them.

``VKML_VALIDATION_LOG=<file>`` also appends each message, as it arrives, to that file as
one JSON line ``{"pid", "argv", "level", "text"}``: the test suite sets it for the whole
session, so the messages of the processes it starts (which inherit both variables) reach
it too, a crashing child's included (each line is written before the callback returns).
"""
from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import dataclass, field

from ..errors import DeviceError
from . import vk
from .vk import ffi, lib

_DEVICE_TYPES = {
    vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: "discrete",
    vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: "integrated",
    vk.VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: "virtual",
    vk.VK_PHYSICAL_DEVICE_TYPE_CPU: "cpu",
    vk.VK_PHYSICAL_DEVICE_TYPE_OTHER: "other",
}
#: Preference order when no device is named: discrete > integrated > virtual > cpu.
DEVICE_TYPE_RANK = {"discrete": 0, "integrated": 1, "virtual": 2, "cpu": 3, "other": 4}

_LIMIT_NAMES = (
    "maxStorageBufferRange", "maxUniformBufferRange", "maxTexelBufferElements",
    "maxPushConstantsSize", "maxMemoryAllocationCount", "maxBoundDescriptorSets",
    "maxPerStageDescriptorStorageBuffers", "maxComputeSharedMemorySize",
    "maxComputeWorkGroupInvocations", "minStorageBufferOffsetAlignment",
    "minTexelBufferOffsetAlignment", "minUniformBufferOffsetAlignment", "nonCoherentAtomSize",
    "timestampPeriod", "timestampComputeAndGraphics", "optimalBufferCopyOffsetAlignment",
)

#: Validation-layer messages (severity, text) seen since the last clear; see module doc.
validation_messages: list[tuple[str, str]] = []


def _record(level: str, text: str) -> None:
    """Keep a validation message in :data:`validation_messages` and, where
    ``VKML_VALIDATION_LOG`` names a file, append it there (read at each message, so a
    process that sets the variable later still reports to it)."""
    validation_messages.append((level, text))
    log = os.environ.get("VKML_VALIDATION_LOG")
    if not log:
        return
    line = json.dumps({"pid": os.getpid(), "argv": sys.argv, "level": level,
                       "text": text}) + "\n"
    try:
        # one write of one line to an O_APPEND file: processes appending at once do not
        # interleave their lines
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        # the messenger callback must return to the driver; the message is still in
        # validation_messages
        pass


def _version_str(v: int) -> str:
    return f"{(v >> 22) & 0x7F}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


@dataclass(frozen=True)
class DeviceInfo:
    """What :func:`vkml.devices` reports for one Vulkan physical device."""

    index: int
    name: str
    device_type: str            # "discrete" | "integrated" | "virtual" | "cpu" | "other"
    vendor_id: int
    device_id: int
    driver_name: str
    driver_info: str
    api_version: str
    driver_version: int
    pipeline_cache_uuid: str
    limits: dict = field(hash=False, compare=False)
    features: dict = field(hash=False, compare=False)
    extensions: frozenset = field(hash=False, compare=False, repr=False)
    memory_heaps: tuple = field(hash=False, compare=False, repr=False)

    def __str__(self) -> str:
        return f"[{self.index}] {self.name} ({self.device_type}, {self.driver_name})"


class Instance:
    """One ``VkInstance`` per process, created on first use."""

    _lock = threading.Lock()
    _current: "Instance | None" = None

    @classmethod
    def get(cls) -> "Instance":
        with cls._lock:
            if cls._current is None:
                cls._current = Instance()
            return cls._current

    def __init__(self) -> None:
        self._keep = []
        self.validation = os.environ.get("VKML_VALIDATION", "0") not in ("", "0")
        version = ffi.new("uint32_t*")
        try:
            lib.vkEnumerateInstanceVersion(version)
            self.api_version = min(version[0], (1 << 22) | (3 << 12))
        except AttributeError:  # a Vulkan 1.0 loader
            self.api_version = 1 << 22
        available = self._instance_extensions()
        extensions = []
        flags = 0
        if "VK_KHR_portability_enumeration" in available:  # MoltenVK
            extensions.append("VK_KHR_portability_enumeration")
            flags |= vk.VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR
        if self.api_version < ((1 << 22) | (1 << 12)):
            extensions.append("VK_KHR_get_physical_device_properties2")
        layers = []
        pnext = vk.NULL
        if self.validation:
            layers.append("VK_LAYER_KHRONOS_validation")
            extensions.append("VK_EXT_debug_utils")
            enables = ffi.new("VkValidationFeatureEnableEXT[]", [
                vk.VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT])
            features = ffi.new("VkValidationFeaturesEXT*", {
                "sType": vk.VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT,
                "enabledValidationFeatureCount": 1, "pEnabledValidationFeatures": enables})
            self._keep += [enables, features]
            pnext = features
        app = ffi.new("VkApplicationInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_APPLICATION_INFO,
            "pApplicationName": self._str("vkml"), "pEngineName": self._str("vkml"),
            "apiVersion": self.api_version})
        ext_ptrs = [self._str(e) for e in extensions]
        layer_ptrs = [self._str(n) for n in layers]
        c_ext = ffi.new("char*[]", ext_ptrs)
        c_layers = ffi.new("char*[]", layer_ptrs)
        info = ffi.new("VkInstanceCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, "pNext": pnext, "flags": flags,
            "pApplicationInfo": app,
            "enabledLayerCount": len(layers), "ppEnabledLayerNames": c_layers,
            "enabledExtensionCount": len(extensions), "ppEnabledExtensionNames": c_ext})
        handle = ffi.new("VkInstance*")
        result = lib.vkCreateInstance(info, vk.NULL, handle)
        if result == vk.VK_ERROR_LAYER_NOT_PRESENT and self.validation:
            raise DeviceError("VKML_VALIDATION asks for VK_LAYER_KHRONOS_validation, which "
                              "the Vulkan loader does not find: install the Khronos "
                              "validation layer or unset VKML_VALIDATION", result)
        vk.check(result, "vkCreateInstance")
        self.handle = handle[0]
        self._messenger = None
        if self.validation:
            self._install_messenger()
        self._physical = self._enumerate()
        self.devices = [self._describe(i, pd) for i, pd in enumerate(self._physical)]

    def _str(self, s: str):
        c = ffi.new("char[]", s.encode())
        self._keep.append(c)
        return c

    @staticmethod
    def _instance_extensions() -> set[str]:
        count = ffi.new("uint32_t*")
        lib.vkEnumerateInstanceExtensionProperties(vk.NULL, count, vk.NULL)
        props = ffi.new("VkExtensionProperties[]", count[0])
        lib.vkEnumerateInstanceExtensionProperties(vk.NULL, count, props)
        return {vk.cstr(props[i].extensionName) for i in range(count[0])}

    def _install_messenger(self) -> None:
        create = vk.proc(self.handle, "vkCreateDebugUtilsMessengerEXT", device=False)
        if create is None:
            return

        @ffi.callback("PFN_vkDebugUtilsMessengerCallbackEXT")
        def _callback(severity, types, data, user):
            text = vk.cstr(data.pMessage) if data.pMessage != vk.NULL else ""
            level = ("error" if severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT
                     else "warning")
            _record(level, text)
            return vk.VK_FALSE

        info = ffi.new("VkDebugUtilsMessengerCreateInfoEXT*", {
            "sType": vk.VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
            "messageSeverity": (vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT
                                | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT),
            "messageType": (vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
                            | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
                            | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT),
            "pfnUserCallback": _callback})
        messenger = ffi.new("VkDebugUtilsMessengerEXT*")
        vk.check(create(self.handle, info, vk.NULL, messenger), "vkCreateDebugUtilsMessengerEXT")
        self._messenger = messenger[0]
        self._keep.append(_callback)

    def _enumerate(self) -> list:
        count = ffi.new("uint32_t*")
        vk.check(lib.vkEnumeratePhysicalDevices(self.handle, count, vk.NULL),
                 "vkEnumeratePhysicalDevices")
        handles = ffi.new("VkPhysicalDevice[]", count[0])
        vk.check(lib.vkEnumeratePhysicalDevices(self.handle, count, handles),
                 "vkEnumeratePhysicalDevices")
        return [handles[i] for i in range(count[0])]

    def physical_device(self, index: int):
        return self._physical[index]

    @staticmethod
    def device_extensions(pd) -> frozenset:
        count = ffi.new("uint32_t*")
        lib.vkEnumerateDeviceExtensionProperties(pd, vk.NULL, count, vk.NULL)
        props = ffi.new("VkExtensionProperties[]", count[0])
        lib.vkEnumerateDeviceExtensionProperties(pd, vk.NULL, count, props)
        return frozenset(vk.cstr(props[i].extensionName) for i in range(count[0]))

    def _describe(self, index: int, pd) -> DeviceInfo:
        exts = self.device_extensions(pd)
        props, subgroup, size_ctl, driver, host_ptr = _properties(pd, exts)
        driver_name, driver_info = "", ""
        if driver is not None:
            driver_name, driver_info = vk.cstr(driver.driverName), vk.cstr(driver.driverInfo)
        feats = self.query_features(pd, exts)
        limits = _limits(props, subgroup, size_ctl, host_ptr)
        compute, ts_bits = _compute_queues(pd)

        mem = ffi.new("VkPhysicalDeviceMemoryProperties*")
        lib.vkGetPhysicalDeviceMemoryProperties(pd, mem)
        heaps = tuple((mem.memoryHeaps[i].size, mem.memoryHeaps[i].flags)
                      for i in range(mem.memoryHeapCount))

        features = dict(feats)
        cbit = vk.VK_SHADER_STAGE_COMPUTE_BIT
        # full subgroups of a size a pipeline names: the size-control features, with the
        # compute stage among those that take a required size
        features["full_subgroups"] = bool(
            features.pop("_size_control") and size_ctl is not None
            and size_ctl.requiredSubgroupSizeStages & cbit)
        features.update({
            # subgroup shuffles in compute shaders (gemm_sg shares the filter by them)
            "subgroup_shuffle": bool(
                subgroup.supportedStages & cbit
                and subgroup.supportedOperations & vk.VK_SUBGROUP_FEATURE_SHUFFLE_BIT
                and subgroup.supportedOperations & vk.VK_SUBGROUP_FEATURE_BASIC_BIT),
            "push_descriptor": "VK_KHR_push_descriptor" in exts,
            "external_memory_host": "VK_EXT_external_memory_host" in exts,
            "timestamps": bool(ts_bits) and bool(props.limits.timestampComputeAndGraphics
                                                 or ts_bits),
            "compute_queue": bool(compute),
        })
        uuid = bytes(props.pipelineCacheUUID).hex()
        return DeviceInfo(
            index=index, name=vk.cstr(props.deviceName),
            device_type=_DEVICE_TYPES.get(props.deviceType, "other"),
            vendor_id=props.vendorID, device_id=props.deviceID,
            driver_name=driver_name, driver_info=driver_info,
            api_version=_version_str(props.apiVersion), driver_version=props.driverVersion,
            pipeline_cache_uuid=uuid, limits=limits, features=features,
            extensions=exts, memory_heaps=heaps)

    @staticmethod
    def query_features(pd, exts) -> dict:
        """Optional features vkml can use, as booleans with short names."""
        s16 = ffi.new("VkPhysicalDevice16BitStorageFeatures*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES})
        s8 = ffi.new("VkPhysicalDevice8BitStorageFeatures*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES})
        f16 = ffi.new("VkPhysicalDeviceShaderFloat16Int8Features*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES})
        ssc = ffi.new("VkPhysicalDeviceSubgroupSizeControlFeatures*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES})
        chain = [s16]
        if "VK_EXT_subgroup_size_control" in exts or _api(pd) >= (1 << 22 | 3 << 12):
            chain.append(ssc)
        if "VK_KHR_8bit_storage" in exts or _api(pd) >= (1 << 22 | 2 << 12):
            chain.append(s8)
        if "VK_KHR_shader_float16_int8" in exts or _api(pd) >= (1 << 22 | 2 << 12):
            chain.append(f16)
        f2 = _chained("VkPhysicalDeviceFeatures2*", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                      chain)
        lib.vkGetPhysicalDeviceFeatures2(pd, f2)
        core = f2.features
        return {
            "fp64": bool(core.shaderFloat64),
            "int64": bool(core.shaderInt64),
            "int16": bool(core.shaderInt16),
            "fp16": bool(f16.shaderFloat16),
            "int8": bool(f16.shaderInt8),
            "storage16": bool(s16.storageBuffer16BitAccess),
            "storage8": bool(s8.storageBuffer8BitAccess),
            # (folded into "full_subgroups" by _describe)
            "_size_control": bool(ssc.subgroupSizeControl and ssc.computeFullSubgroups),
        }


def _properties(pd, exts):
    """The device's core properties and the extension structs vkml reads (subgroups,
    subgroup size control, driver, host pointer import; None where the device's API
    version and extensions do not offer one): (props, subgroup, size_ctl, driver,
    host_ptr)."""
    base = ffi.new("VkPhysicalDeviceProperties*")
    lib.vkGetPhysicalDeviceProperties(pd, base)
    props = base[0]
    api = props.apiVersion
    subgroup = ffi.new("VkPhysicalDeviceSubgroupProperties*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES})
    chain = [subgroup]
    size_ctl = None
    if api >= (1 << 22 | 3 << 12) or "VK_EXT_subgroup_size_control" in exts:
        size_ctl = ffi.new("VkPhysicalDeviceSubgroupSizeControlProperties*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES})
        chain.append(size_ctl)
    driver = None
    if api >= (1 << 22 | 2 << 12) or "VK_KHR_driver_properties" in exts:
        driver = ffi.new("VkPhysicalDeviceDriverProperties*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES})
        chain.append(driver)
    host_ptr = None
    if "VK_EXT_external_memory_host" in exts:
        host_ptr = ffi.new("VkPhysicalDeviceExternalMemoryHostPropertiesEXT*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT})
        chain.append(host_ptr)
    props2 = _chained("VkPhysicalDeviceProperties2*",
                      vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, chain)
    lib.vkGetPhysicalDeviceProperties2(pd, props2)
    return props, subgroup, size_ctl, driver, host_ptr


def _limits(props, subgroup, size_ctl, host_ptr) -> dict:
    """The limits :class:`DeviceInfo` reports, by their Vulkan names."""
    limits = {name: getattr(props.limits, name) for name in _LIMIT_NAMES}
    limits["maxComputeWorkGroupCount"] = tuple(props.limits.maxComputeWorkGroupCount)
    limits["maxComputeWorkGroupSize"] = tuple(props.limits.maxComputeWorkGroupSize)
    limits["subgroupSize"] = subgroup.subgroupSize
    # VK_EXT_subgroup_size_control (core in 1.3): the sizes a pipeline may require
    limits["minSubgroupSize"] = size_ctl.minSubgroupSize if size_ctl else subgroup.subgroupSize
    limits["maxSubgroupSize"] = size_ctl.maxSubgroupSize if size_ctl else subgroup.subgroupSize
    limits["maxComputeWorkgroupSubgroups"] = (size_ctl.maxComputeWorkgroupSubgroups
                                              if size_ctl else 0)
    limits["minImportedHostPointerAlignment"] = (
        host_ptr.minImportedHostPointerAlignment if host_ptr is not None else 0)
    return limits


def _compute_queues(pd) -> tuple[list, int]:
    """The queue families with compute, and the first one's timestampValidBits."""
    qcount = ffi.new("uint32_t*")
    lib.vkGetPhysicalDeviceQueueFamilyProperties(pd, qcount, vk.NULL)
    qprops = ffi.new("VkQueueFamilyProperties[]", qcount[0])
    lib.vkGetPhysicalDeviceQueueFamilyProperties(pd, qcount, qprops)
    compute = [i for i in range(qcount[0])
               if qprops[i].queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
    return compute, (qprops[compute[0]].timestampValidBits if compute else 0)


def _chained(ctype: str, stype: int, chain: list):
    """A new ``ctype`` struct whose ``pNext`` chain is ``chain``, in order."""
    for a, b in zip(chain, chain[1:]):
        a.pNext = b
    return ffi.new(ctype, {"sType": stype, "pNext": chain[0]})


def _api(pd) -> int:
    p = ffi.new("VkPhysicalDeviceProperties*")
    lib.vkGetPhysicalDeviceProperties(pd, p)
    return p.apiVersion


def devices() -> list[DeviceInfo]:
    return list(Instance.get().devices)

"""SPIR-V modules and compute pipelines, created lazily and cached.

In process, pipelines are cached by (kernel variant, specialization constants).  Across
processes a ``VkPipelineCache`` is kept on disk, one file per device and driver version
(vendor, device, driver version, ``pipelineCacheUUID``), in ``$VKML_CACHE_DIR`` or the
user's cache folder.  ``VKML_CACHE_DIR=off`` disables the disk cache.
"""
from __future__ import annotations

import os
import struct
import sys
import threading
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import DeviceError
from . import vk
from .vk import ffi, lib

#: Descriptor kinds a kernel binding may have.
STORAGE = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
UNIFORM = vk.VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER
UNIFORM_TEXEL = vk.VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER
STORAGE_TEXEL = vk.VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER


def cache_dir() -> Path | None:
    env = os.environ.get("VKML_CACHE_DIR")
    if env:
        return None if env.lower() == "off" else Path(env)
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
        return base / "vkml" / "cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "vkml"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vkml"


def load_spirv(name: str) -> bytes:
    """The shipped SPIR-V of kernel variant ``name`` (``vkml/shaders/<name>.spv``)."""
    try:
        return resources.files("vkml.shaders").joinpath(f"{name}.spv").read_bytes()
    except FileNotFoundError:
        raise DeviceError(f"no compiled kernel named {name!r}: run tools/build_shaders.py") from None


@dataclass(frozen=True)
class Pipeline:
    handle: object
    layout: object
    set_layout: object
    kinds: tuple           # descriptor kind of each binding, in binding order
    push_size: int
    name: str


class PipelineCache:
    """Modules, layouts and pipelines of one device, plus the on-disk pipeline cache."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.device = ctx.device
        self.lock = threading.Lock()
        self.modules: dict[str, object] = {}
        self.layouts: dict[tuple, tuple] = {}
        self.pipelines: dict[tuple, Pipeline] = {}
        info = ctx.info
        self.path = None
        folder = cache_dir()
        if folder is not None:
            self.path = folder / (f"{info.vendor_id:04x}-{info.device_id:04x}-"
                                  f"{info.driver_version:08x}-{info.pipeline_cache_uuid}.bin")
        initial = self._read_disk(info)
        data = ffi.new("char[]", initial) if initial else vk.NULL
        create = ffi.new("VkPipelineCacheCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO,
            "initialDataSize": len(initial), "pInitialData": data})
        handle = ffi.new("VkPipelineCache*")
        vk.check(lib.vkCreatePipelineCache(self.device, create, vk.NULL, handle),
                 "vkCreatePipelineCache")
        self.handle = handle[0]
        self.created = 0

    def _read_disk(self, info) -> bytes:
        """The saved cache, if its header names this exact device and driver."""
        if self.path is None or not self.path.exists():
            return b""
        try:
            data = self.path.read_bytes()
        except OSError:
            return b""
        if len(data) < 32:
            return b""
        size, version, vendor, device = struct.unpack_from("<IIII", data)
        uuid = data[16:32].hex()
        if (size < 32 or version != 1 or vendor != info.vendor_id or device != info.device_id
                or uuid != info.pipeline_cache_uuid):
            return b""
        return data

    def save(self) -> None:
        if self.path is None or not self.created:
            return
        size = ffi.new("size_t*")
        if lib.vkGetPipelineCacheData(self.device, self.handle, size, vk.NULL) < 0 or not size[0]:
            return
        buf = ffi.new("char[]", size[0])
        if lib.vkGetPipelineCacheData(self.device, self.handle, size, buf) < 0:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(ffi.buffer(buf, size[0])[:])
            os.replace(tmp, self.path)
        except OSError:
            pass  # a read-only home is no reason to fail

    def module(self, name: str):
        mod = self.modules.get(name)
        if mod is None:
            code = load_spirv(name)
            words = ffi.new("char[]", code)
            info = ffi.new("VkShaderModuleCreateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                "codeSize": len(code), "pCode": ffi.cast("uint32_t*", words)})
            h = ffi.new("VkShaderModule*")
            vk.check(lib.vkCreateShaderModule(self.device, info, vk.NULL, h), "vkCreateShaderModule")
            mod = self.modules[name] = h[0]
        return mod

    def layout(self, kinds: tuple, push_size: int):
        key = (kinds, push_size)
        found = self.layouts.get(key)
        if found is not None:
            return found
        bindings = ffi.new("VkDescriptorSetLayoutBinding[]", [
            {"binding": i, "descriptorType": k, "descriptorCount": 1,
             "stageFlags": vk.VK_SHADER_STAGE_COMPUTE_BIT} for i, k in enumerate(kinds)])
        flags = (vk.VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR
                 if self.ctx.push_descriptor is not None else 0)
        info = ffi.new("VkDescriptorSetLayoutCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, "flags": flags,
            "bindingCount": len(kinds), "pBindings": bindings})
        sl = ffi.new("VkDescriptorSetLayout*")
        vk.check(lib.vkCreateDescriptorSetLayout(self.device, info, vk.NULL, sl),
                 "vkCreateDescriptorSetLayout")
        ranges = ffi.new("VkPushConstantRange*", {
            "stageFlags": vk.VK_SHADER_STAGE_COMPUTE_BIT, "offset": 0, "size": push_size})
        pl_info = ffi.new("VkPipelineLayoutCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
            "setLayoutCount": 1, "pSetLayouts": sl,
            "pushConstantRangeCount": 1 if push_size else 0,
            "pPushConstantRanges": ranges if push_size else vk.NULL})
        pl = ffi.new("VkPipelineLayout*")
        vk.check(lib.vkCreatePipelineLayout(self.device, pl_info, vk.NULL, pl),
                 "vkCreatePipelineLayout")
        found = self.layouts[key] = (sl[0], pl[0])
        return found

    def get(self, name: str, kinds: tuple, push_size: int = 0,
            constants: dict[int, int | float] | None = None) -> Pipeline:
        """The compute pipeline of kernel variant ``name``.

        ``kinds`` gives the descriptor kind of each binding (set 0, bindings 0..n-1);
        ``constants`` maps specialization-constant ids to 32-bit int or float values.
        """
        consts = tuple(sorted((constants or {}).items()))
        key = (name, kinds, push_size, consts)
        p = self.pipelines.get(key)
        if p is not None:
            return p
        with self.lock:
            p = self.pipelines.get(key)
            if p is None:
                p = self.pipelines[key] = self._create(name, kinds, push_size, consts)
        return p

    def _create(self, name, kinds, push_size, consts) -> Pipeline:
        set_layout, layout = self.layout(kinds, push_size)
        spec = vk.NULL
        if consts:
            entries = ffi.new("VkSpecializationMapEntry[]", [
                {"constantID": cid, "offset": 4 * i, "size": 4} for i, (cid, _) in enumerate(consts)])
            data = b"".join(struct.pack("<f" if isinstance(v, float) else
                                        ("<i" if v < 0 else "<I"), v) for _, v in consts)
            blob = ffi.new("char[]", data)
            spec = ffi.new("VkSpecializationInfo*", {
                "mapEntryCount": len(consts), "pMapEntries": entries,
                "dataSize": len(data), "pData": blob})
        entry = ffi.new("char[]", b"main")
        info = ffi.new("VkComputePipelineCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
            "stage": {"sType": vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                      "stage": vk.VK_SHADER_STAGE_COMPUTE_BIT, "module": self.module(name),
                      "pName": entry, "pSpecializationInfo": spec},
            "layout": layout})
        h = ffi.new("VkPipeline*")
        vk.check(lib.vkCreateComputePipelines(self.device, self.handle, 1, info, vk.NULL, h),
                 f"vkCreateComputePipelines({name})")
        self.created += 1
        return Pipeline(h[0], layout, set_layout, kinds, push_size, name)

    def destroy(self) -> None:
        self.save()
        for p in self.pipelines.values():
            lib.vkDestroyPipeline(self.device, p.handle, vk.NULL)
        for sl, pl in self.layouts.values():
            lib.vkDestroyPipelineLayout(self.device, pl, vk.NULL)
            lib.vkDestroyDescriptorSetLayout(self.device, sl, vk.NULL)
        for m in self.modules.values():
            lib.vkDestroyShaderModule(self.device, m, vk.NULL)
        lib.vkDestroyPipelineCache(self.device, self.handle, vk.NULL)
        self.pipelines.clear()
        self.layouts.clear()
        self.modules.clear()

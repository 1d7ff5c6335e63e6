"""The runtime layer: the only part of vkml that talks to Vulkan.

Above it, :mod:`vkml.dml` and :mod:`vkml.ops` see devices, allocations, pipelines and
sequences, never a Vulkan handle they must manage themselves.
"""
from .context import FEATURE_NAMES, Context
from .instance import DEVICE_TYPE_RANK, DeviceInfo, devices, validation_messages
from .memory import Allocation
from .pipelines import STORAGE, STORAGE_TEXEL, UNIFORM, UNIFORM_TEXEL, Pipeline
from .scheduler import Bind, Sequence
from . import vk as _vk

#: Texel formats the kernels bind texel buffers with.
FORMAT_R32_UINT = _vk.VK_FORMAT_R32_UINT
FORMAT_R32_SFLOAT = _vk.VK_FORMAT_R32_SFLOAT
FORMAT_RGBA32_SFLOAT = _vk.VK_FORMAT_R32G32B32A32_SFLOAT
FORMAT_RGBA32_UINT = _vk.VK_FORMAT_R32G32B32A32_UINT
FORMAT_RG32_UINT = _vk.VK_FORMAT_R32G32_UINT
FORMAT_R16_SFLOAT = _vk.VK_FORMAT_R16_SFLOAT
FORMAT_RGBA16_SFLOAT = _vk.VK_FORMAT_R16G16B16A16_SFLOAT

__all__ = ["Context", "DeviceInfo", "devices", "validation_messages", "Allocation", "Bind",
           "Sequence", "Pipeline", "STORAGE", "STORAGE_TEXEL", "UNIFORM", "UNIFORM_TEXEL",
           "DEVICE_TYPE_RANK", "FEATURE_NAMES"]

"""The one place that loads Vulkan: the cffi ``ffi``/``lib`` of the ``vulkan`` package.

The runtime calls ``lib`` functions directly with structs it builds once, so the hot
path (submit, wait, replay) does no per-call Python struct building.
"""
from __future__ import annotations

import vulkan as _vulkan

from ..errors import DeviceError

ffi = _vulkan.ffi
lib = _vulkan.lib
NULL = ffi.NULL

# The constants the runtime uses, re-exported under short names.
globals().update({k: v for k, v in vars(_vulkan).items() if k.startswith("VK_")})

_RESULT_NAMES = {v: k for k, v in vars(_vulkan).items()
                 if k.startswith(("VK_ERROR_", "VK_SUCCESS", "VK_NOT_READY", "VK_TIMEOUT",
                                  "VK_INCOMPLETE", "VK_EVENT_"))
                 and isinstance(v, int) and not k.endswith("_KHR") and not k.endswith("_EXT")}

OUT_OF_MEMORY = (_vulkan.VK_ERROR_OUT_OF_DEVICE_MEMORY, _vulkan.VK_ERROR_OUT_OF_HOST_MEMORY)


def result_name(code: int) -> str:
    return _RESULT_NAMES.get(code, f"VkResult({code})")


def check(result: int, what: str) -> int:
    """Raise :class:`DeviceError` for a failing ``VkResult``; return non-error codes."""
    if result < 0:
        raise DeviceError(f"{what} failed with {result_name(result)}", result)
    return result


def new(ctype: str, init=None):
    """``ffi.new`` for a struct pointer with ``sType`` filled from its name."""
    return ffi.new(ctype, init) if init is not None else ffi.new(ctype)


def cstr(data) -> str:
    return ffi.string(data).decode("utf-8", "replace")


def proc(handle, name: str, device: bool):
    """Look up an extension entry point; ``None`` when the driver lacks it."""
    getter = lib.vkGetDeviceProcAddr if device else lib.vkGetInstanceProcAddr
    ptr = getter(handle, name.encode())
    if ptr == NULL:
        return None
    return ffi.cast(f"PFN_{name}", ptr)

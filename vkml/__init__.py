"""vkml: DirectML's operator model on every Vulkan device.

    import vkml, numpy as np
    y = vkml.pad(np.ones((1, 1, 4, 4), np.float32), [0, 0, 1, 1], [0, 0, 1, 1], "reflection")

See ``shared/spec/API.md`` (the public contract) and README.md.
"""
from __future__ import annotations

from . import dml, ops  # noqa: F401  (ops registers the implementations)
from .device import Device, default_device, devices
from .errors import DeviceError, UnsupportedError, ValidationError, VkmlError
from .ops import *  # noqa: F401,F403  (the functional forms: pad, fold, ...)
from .runtime import DeviceInfo
from .tensor import Tensor
from .tuning import tune  # noqa: F401  (python -m vkml.tune: the same, from a shell)

__version__ = "0.1.0"


def tensor(array, device=None) -> Tensor:
    """Upload ``array`` to ``device`` (the default device when None)."""
    return (device or default_device()).tensor(array)


def empty(shape, dtype="float32", device=None, nbytes: int | None = None) -> Tensor:
    """An uninitialised device tensor."""
    return (device or default_device()).empty(shape, dtype, nbytes=nbytes)


__all__ = ["Device", "DeviceInfo", "Tensor", "devices", "default_device", "tensor", "empty",
           "VkmlError", "ValidationError", "UnsupportedError", "DeviceError", "dml", "tune",
           *ops.__all__]

"""The three errors of the public contract (see ``shared/spec/API.md``, "Errors")."""
from __future__ import annotations


class VkmlError(Exception):
    """Base class of every error vkml raises on purpose."""


class ValidationError(VkmlError, ValueError):
    """A descriptor or argument breaks a rule of the operator.

    The message names the field (``PaddingOperatorDesc.end_padding[2]``) and the rule.
    """

    def __init__(self, field: str, rule: str):
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}")


class ArgumentTypeError(ValidationError, TypeError):
    """A field or argument of the wrong type (a float, string, None or bool where an
    integer is needed; a non-number where a FLOAT is).  A :class:`TypeError`, as NumPy
    and PyTorch raise for such arguments, and a :class:`ValidationError` (the contract:
    a bad argument raises ValidationError naming the field)."""


class UnsupportedError(VkmlError):
    """Valid, but this device cannot run it; the message names the missing feature."""

    def __init__(self, feature: str, detail: str = ""):
        self.feature = feature
        msg = f"the device lacks {feature}"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class DeviceError(VkmlError):
    """The Vulkan device failed: out of memory, lost, or a limit that cannot be met."""

    def __init__(self, message: str, result: int | None = None):
        self.result = result
        super().__init__(message)

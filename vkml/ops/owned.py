"""``DML_TENSOR_FLAG_OWNED_BY_DML``: the binding rules, in one place for compiled
operators and compiled graphs.

The flag's page: "the corresponding tensor must be bound to the binding table during
operator initialization, and not during execution.  Attempting to bind the tensor during
execution while this flag is set results in an error."  ``IDMLOperatorInitializer``: "You
must initialize all operators exactly once before they can be executed" (vkml lets
``initialize`` be called again, replacing the data).
"""
from __future__ import annotations

import numpy as np

from ..dml.tensor_desc import TensorFlags
from ..errors import ValidationError
from ..tensor import Tensor

__all__: list[str] = []


def owned_slots(descs) -> list[int]:
    """Indices of the tensor descriptors that carry ``DML_TENSOR_FLAG_OWNED_BY_DML``."""
    return [i for i, d in enumerate(descs)
            if d is not None and int(d.flags) & int(TensorFlags.OWNED_BY_DML)]


def initializer_inputs(owned, given, field: str) -> dict:
    """``given`` (a dict ``{index: value}`` or a sequence by index, None entries left out)
    checked against the owned indices: each owned one present, nothing else."""
    if not isinstance(given, dict):
        given = {i: v for i, v in enumerate(given) if v is not None}
    for i in given:
        if i not in owned:
            raise ValidationError(f"{field}[{i}]", "is not a tensor flagged "
                                  f"DML_TENSOR_FLAG_OWNED_BY_DML (those are {list(owned)}): "
                                  "it is bound at execution, not at initialization")
    for i in owned:
        if i not in given or given[i] is None:
            raise ValidationError(f"{field}[{i}]", "is missing: it is OWNED_BY_DML and must "
                                  "be bound at initialization")
    return dict(given)


def refuse_owned_at_execution(owned, inputs, initialized: bool) -> None:
    """The execution-time rule: an owned input bound -> ValidationError naming it; owned
    inputs never initialized -> ValidationError naming ``initialize``."""
    for i in owned:
        if i < len(inputs) and inputs[i] is not None:
            raise ValidationError(f"inputs[{i}]", "is OWNED_BY_DML: it is bound once at "
                                  "initialization, binding it at execution is an error")
    if owned and not initialized:
        raise ValidationError("initialize", f"inputs {list(owned)} are OWNED_BY_DML: call "
                              "initialize() first")


def device_copy(device, value, desc, field: str) -> tuple[Tensor, bool]:
    """``value`` (a Tensor on ``device`` or an array) as a Tensor holding at least the
    descriptor's TotalTensorSizeInBytes; True where it is a new upload the caller frees."""
    need = desc.total_tensor_size_in_bytes
    if isinstance(value, Tensor):
        if value.device is not device:
            raise ValidationError(field, "is on another device")
        if not value.allocation.alive:
            raise ValidationError(field, "was freed")
        if value.nbytes < need:
            raise ValidationError(field, f"holds {value.nbytes} bytes, the descriptor needs "
                                  f"TotalTensorSizeInBytes = {need}")
        return value, False
    data = np.ascontiguousarray(value)
    if data.nbytes < need - 3:          # the last DWORD of an odd float16 count
        raise ValidationError(field, f"holds {data.nbytes} bytes, the descriptor needs "
                              f"TotalTensorSizeInBytes = {need}")
    t = device.empty(data.shape, data.dtype, nbytes=need)
    t.write(data)
    return t, True

"""What every functional operator (``vkml.pad``, ``vkml.fold``, ...) does around its desc.

NumPy in -> NumPy out; Tensor in -> Tensor out (the result stays on the device).
``device=None`` means the device of a Tensor argument, else the default device.
"""
from __future__ import annotations

import numpy as np

from ..errors import ValidationError
from ..tensor import Tensor


def pick_device(device, *args):
    """The device to run on (see module doc); Tensor arguments must all be on it."""
    from ..device import Device, default_device

    tensors = [a for a in args if isinstance(a, Tensor)]
    if device is None:
        device = tensors[0].device if tensors else default_device()
    elif not isinstance(device, Device):
        raise ValidationError("device", f"must be a vkml.Device, got {type(device).__name__}")
    for t in tensors:
        if t.device is not device:
            raise ValidationError("device", "a Tensor argument is on another device")
    return device


def as_array(x, name: str):
    """A Tensor stays a Tensor; anything else becomes a C-contiguous NumPy array."""
    if x is None or isinstance(x, Tensor):
        return x
    try:
        return np.ascontiguousarray(x)
    except Exception as exc:  # noqa: BLE001
        raise ValidationError(name, f"must be a numpy array or a vkml.Tensor ({exc})") from None


def run(device, desc, args: list, out_shapes: list[tuple] | None = None):
    """Compile (cached) and execute ``desc`` on ``args``; return the output(s) in the
    kind the arguments came in (one output -> not a list)."""
    compiled = device.compiled(desc)
    want_tensor = any(isinstance(a, Tensor) for a in args)
    temps = []
    inputs = []
    for a in args:
        if a is None or isinstance(a, Tensor):
            inputs.append(a)
        else:
            t = device.tensor(a)
            temps.append(t)
            inputs.append(t)
    outs = []
    for i, d in enumerate(desc.outputs()):
        shape = out_shapes[i] if out_shapes else d.sizes
        outs.append(device.empty(shape, d.dtype, nbytes=d.total_tensor_size_in_bytes))
    try:
        compiled.execute(inputs, outs)
        if want_tensor:
            result = outs
        else:
            result = [o.numpy() for o in outs]
            for o in outs:
                o.free()
    finally:
        for t in temps:
            t.free()
    return result[0] if len(result) == 1 else result

"""The standalone activation operators: ``DML_ACTIVATION_*_OPERATOR_DESC`` and
``DML_ELEMENT_WISE_CLIP_OPERATOR_DESC`` with their tensors set, and ``vkml.activation``.

The same 18 descriptors Convolution fuses (``vkml/dml/activations.py``) run on their own
here: ``glsl/activation.comp`` applies the fused kernels' ``vkml_activation()`` to every
element of the output box, reading and writing each tensor through its own element
strides (0 broadcasts an input).  float32 and float16 on every device: float16 as halves
with 16-bit storage, else packed two to a 32-bit word.  Tensors larger than
``maxStorageBufferRange`` are processed in windows (:class:`~vkml.ops.fold.BoxKernel`).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..dml.activations import ACTIVATIONS, activation as activation_desc
from ..dml.tensor_desc import TensorDesc
from ..errors import ValidationError
from ..runtime import Bind
from .base import implements
from .grid import BOX_CONSTANTS, BoxKernel
from .functional import as_array, pick_device, run

__all__ = ["activation"]

#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = dict.fromkeys(["activation_f32", "activation_f16", "activation_f16_packed"],
                         BOX_CONSTANTS + ("ACT",))


@implements(*ACTIVATIONS.values())
class CompiledActivation(BoxKernel):
    """An activation operator on this device: see the module doc."""

    def build(self) -> None:
        d = self.desc
        self.float_box("activation")
        self.in_strides = list(d.input_tensor.element_strides)
        self.local = min(64, self.workgroup_size)
        self.windows = self.plan_windows()
        p = np.zeros(4 * 5, dtype=np.uint32)
        p[0:self.rank] = self.box_out_strides
        p[8:8 + self.rank] = self.in_strides
        p[16:20] = d.kernel_parameters().view(np.uint32)
        self.params = self.upload(p)

    def in_span(self, origin, extent):
        lo = sum(o * s for o, s in zip(origin, self.in_strides))
        hi = sum((o + e - 1) * s for o, e, s in zip(origin, extent, self.in_strides))
        return lo, hi + 1

    def encode(self, seq, inputs, outputs) -> None:
        x, y = inputs[0].allocation, outputs[0].allocation
        act = self.desc.SPEC.kernel_id

        def pipeline_for(local, ly, xdims, v, vec_store):
            return self.pipeline(self.kernel, {"LOCAL_SIZE_X": local, "LOCAL_SIZE_Y": ly,
                                               "RANK": self.rank, "XDIMS": xdims, "ACT": act})

        self.dispatch_windows(seq, x, y, self.windows, pipeline_for, [Bind(self.params)])


def activation(x, kind, *, device=None, **params):
    """One of the 18 activations applied elementwise: ``vkml.activation(x, "relu")``,
    ``vkml.activation(x, "leaky_relu", alpha=0.2)``, ``vkml.activation(x, "clip",
    min=0.0, max=6.0)``.

    ``kind`` is a name (as ``fused_activation`` takes it: "relu", "elu", "clip" or
    "DML_OPERATOR_ACTIVATION_ELU", ...), a descriptor class, or a descriptor instance
    with its tensors None (its parameters are kept unless ``params`` overrides them).
    ``params`` are the descriptor's parameter fields (``alpha``, ``beta``, ``gamma``,
    ``steepness``, ``bias``, ``threshold``, ``scale_bias``, ``min``, ``max``); those not
    given take the page's default.  ``x``: float32 or float16, 1 to 8 dimensions; the
    result has its shape and type.
    """
    dev = pick_device(device, x)
    x = as_array(x, "x")
    try:
        base = activation_desc(kind)
    except ValidationError as exc:
        raise ValidationError("kind", exc.rule) from None
    if base is None:
        raise ValidationError("kind", "must name an activation, got None")
    names = {n for n, _ in base.SPEC.params}
    for k in params:
        if k not in names:
            raise ValidationError(k, f"is not a parameter of {base.OPERATOR_TYPE} (its "
                                  f"parameters: {', '.join(sorted(names)) or 'none'})")
    t = TensorDesc(x.dtype, tuple(x.shape) or (1,))
    desc = replace(base, input_tensor=t, output_tensor=t, **params)
    out = run(dev, desc, [x])
    if x.shape == () and not hasattr(out, "_alloc"):
        out = out.reshape(())
    return out

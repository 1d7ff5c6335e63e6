"""The standalone activation operators: ``DML_ACTIVATION_*_OPERATOR_DESC`` and
``DML_ELEMENT_WISE_CLIP_OPERATOR_DESC`` with their tensors set, and ``vkml.activation``.

The same 18 descriptors Convolution fuses (``vkml/dml/activations.py``), and SWISH and
HARD_SWISH, which are operators only, run on their own
here: ``glsl/activation.comp`` applies the fused kernels' ``vkml_activation()`` to every
element of the output box, reading and writing each tensor through its own element
strides (0 broadcasts an input).  float32 and float16 on every device: float16 as halves
with 16-bit storage, else packed two to a 32-bit word.  Tensors larger than
``maxStorageBufferRange`` are processed in windows (:class:`~vkml.ops.grid.BoxKernel`).
Packed tensors of one layout (the common case) run as one flat dimension, many elements
an invocation with vector reads and stores (:class:`CompiledActivation`).
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..dml.activations import (OPERATOR_ACTIVATIONS, ActivationReluOperatorDesc,
                               activation as activation_desc)
from ..dml.data_type import DataType
from ..dml.tensor_desc import TensorDesc, packed_strides
from ..errors import ValidationError
from ..runtime import Bind
from .base import implements
from .grid import BOX_CONSTANTS, BoxKernel, register_read_path
from .functional import as_array, pick_device, run
from ..intmath import ceil_div

__all__ = ["activation"]

#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = dict.fromkeys(["activation_f32", "activation_f32_texel4", "activation_f32_ssbo4",
                          "activation_f16", "activation_f16_packed"],
                         BOX_CONSTANTS + ("V", "VEC_STORE", "ACT"))


@implements(*OPERATOR_ACTIVATIONS.values())
class CompiledActivation(BoxKernel):
    """An activation operator on this device: see the module doc.

    Packed input and output of one layout are one flat dimension, :attr:`flat_v`
    elements an invocation (4 at a short tail); float32 reads them by ``read``: "ssbo" (an element at a time), "texel4"
    (RGBA32F texels: lavapipe vectorizes texel reads; the whole input within
    ``maxTexelBufferElements``) or "ssbo4" (vec4 storage-buffer loads).  None: the tuner
    chooses between the texel rule ("auto") and "ssbo4" (:data:`READ_PATH`); the
    constructor's ``read=`` forces one (:meth:`~.grid.BoxKernel.choose_read`)."""

    def build(self) -> None:
        d = self.desc
        self.float_box("activation")
        self.in_strides = list(d.input_tensor.element_strides)
        self.flat = self.in_strides == self.box_out_strides == list(packed_strides(self.box))
        if self.flat:                  # one dimension, flat_v neighbours an invocation
            self.rank, self.box = 1, [math.prod(self.box)]
            self.box_out_strides, self.in_strides = [1], [1]
        self.local = min(64, self.workgroup_size)
        self.windows = self.plan_windows()
        self.apply_read(self._choose_read())
        self.params = self.upload_block(self.kernel, "Params", out_stride=self.box_out_strides,
                                        in_stride=self.in_strides, p=d.kernel_parameters())

    def _choose_read(self) -> str:
        if not (self.flat and self.kernel == "activation_f32"):
            return "ssbo"
        ok = {"ssbo": True,
              "texel4": (self.windows is None and ceil_div(self.in_bytes, 16)
                         <= self.ctx.limits["maxTexelBufferElements"]),
              "ssbo4": self.ctx.binding_alignment() % 16 == 0}
        rule = "texel4" if ok["texel4"] else "ssbo4" if ok["ssbo4"] else "ssbo"
        return self.choose_read(ok, rule, ok["ssbo4"] and rule != "ssbo4",
                                lambda: {"elements": self.box[0]})

    #: Elements a flat activation's invocation takes: the most of those measured, as
    #: both drivers' cost per invocation is high (bench/RESULTS.md).
    flat_v = 32

    def vector_width(self, origin, extent, out_base) -> int:
        if not self.flat:
            return 1
        return next((v for v in (self.flat_v, 4) if extent[-1] >= v), 1)

    def vector_store(self, origin, out_base, v) -> bool:
        return self.flat and v % 4 == 0 and origin[-1] % 4 == 0 and out_base % 4 == 0

    def in_span(self, origin, extent):
        lo = sum(o * s for o, s in zip(origin, self.in_strides))
        hi = sum((o + e - 1) * s for o, e, s in zip(origin, extent, self.in_strides))
        return lo, hi + 1

    def encode(self, seq, inputs, outputs) -> None:
        x, y = inputs[0].allocation, outputs[0].allocation
        act = self.desc.SPEC.kernel_id

        def pipeline_for(local, ly, xdims, v, vec_store):
            return self.pipeline(self.kernel, {"LOCAL_SIZE_X": local, "LOCAL_SIZE_Y": ly,
                                               "RANK": self.rank, "XDIMS": xdims, "V": v,
                                               "VEC_STORE": int(vec_store), "ACT": act})

        self.dispatch_windows(seq, x, y, self.windows, pipeline_for, [Bind(self.params)],
                              self.in_kind, self.in_fmt)


def _read_class(shape) -> str:
    """Flat float32 activations sharing a read choice: size within a factor of 4."""
    return f"flat 4^{(4 * shape['elements']).bit_length() // 2}"


def _read_desc(shape):
    """A flat float32 Relu of ``shape``."""
    t = TensorDesc(DataType.FLOAT32, (1, int(shape["elements"])))
    return ActivationReluOperatorDesc(t, t)


#: A flat float32 activation's read path where "ssbo4" is possible besides the texel
#: rule: "auto" (the rule, the ``VKML_TUNE=off`` default) or "ssbo4", by measurement.
READ_PATH = register_read_path(
    "activation_read", ("auto", "ssbo4"), CompiledActivation, _read_desc, _read_class,
    examples=[{"elements": 64 * 56 * 56}], work_fn=lambda shape: float(shape["elements"]))


def activation(x, kind, *, device=None, **params):
    """One of the 20 activations (the 18 fusable ones, swish and hard_swish) applied
    elementwise: ``vkml.activation(x, "relu")``, ``vkml.activation(x, "leaky_relu",
    alpha=0.2)``, ``vkml.activation(x, "clip", min=0.0, max=6.0)``.

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
        base = activation_desc(kind, fusable=False)
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

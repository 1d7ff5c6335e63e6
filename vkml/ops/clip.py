"""``DML_ELEMENT_WISE_CLIP1_OPERATOR_DESC`` (``vkml/dml/element_wise.py``): ``vkml.clip``.

No kernel of its own: the element-wise family (``glsl/element_wise.comp``) runs it.

* Float types (FLOAT32, FLOAT16): one pass, the kernel's IDENTITY with the CLIP activation
  (scale, bias, min, max), as IDENTITY's ScaleBias runs as LINEAR; so CLIP1 takes that
  operator's flat, row and strided paths, windows and read choices.
* Integer types: the kernel has no clamp of integers, and the activations are float code.
  They run its MAX and MIN instead, two passes, each against its bound held in a
  one-element buffer read with zero strides (the row path's constant operand):
  ``max(x, Min)`` into the output, then ``min(that, Max')`` in place (the kernel lets the
  output alias an input; the sequence's hazard tracking puts the barrier between them).
  ``Max' = max(Min, Max)``, so the result is the page's ``max(Min, min(x, Max))`` also
  where Min > Max (Min everywhere).  MAX and MIN are exact on every integer type, 64-bit
  ones included, on every device; a clamp op in the kernel would save the second pass,
  at the cost of more code in the variants SwiftShader compiles slowly.
"""
from __future__ import annotations

import numpy as np

from ..dml.element_wise import (ElementWiseClip1OperatorDesc, ElementWiseMaxOperatorDesc,
                                ElementWiseMinOperatorDesc)
from ..dml.data_type import DataType
from ..dml.tensor_desc import TensorDesc
from ..errors import ValidationError
from ..tensor import Tensor
from .base import CompiledOperator, implements, release_all
from .element_wise import CompiledElementWise, as_scale_bias
from .functional import as_array, pick_device, run

__all__ = ["clip"]


@implements(ElementWiseClip1OperatorDesc)
class CompiledClip1(CompiledOperator):
    """CLIP1 as one element-wise pass (float types) or two (integers): module doc."""

    def build(self) -> None:
        d = self.desc
        out = d.output_tensor
        dt = out.data_type
        self.passes: list[CompiledElementWise] = []
        self.bounds: list[Tensor] = []
        if dt.is_float:
            self.passes.append(CompiledElementWise(self.device, d))
            return
        lo, hi = d.bounds()
        hi = max(lo, hi)
        const = TensorDesc(dt, out.sizes, (0,) * len(out.sizes))
        try:
            for value, cls, a in ((lo, ElementWiseMaxOperatorDesc, d.input_tensor),
                                  (hi, ElementWiseMinOperatorDesc, out)):
                alloc = self.upload(np.array([value], dt.numpy))
                self.bounds.append(Tensor(self.device, (1,), dt.numpy, alloc, 4, owner=False))
                self.passes.append(CompiledElementWise(self.device, cls(a, const, out)))
        except BaseException:
            release_all(self.passes)
            raise

    def encode(self, seq, inputs, outputs) -> None:
        x, y = inputs[0], outputs[0]
        if not self.bounds:
            self.passes[0].encode(seq, [x], [y])
            return
        self.passes[0].encode(seq, [x, self.bounds[0]], [y])
        self.passes[1].encode(seq, [y, self.bounds[1]], [y])
        for p in self.passes:
            seq.keep(p)

    def release(self) -> None:
        if not self.released:
            release_all(self.passes)
        super().release()


def clip(x, min=None, max=None, *, scale_bias=None, device=None):     # noqa: A002
    """``x`` clamped to ``[min, max]`` (DML_ELEMENT_WISE_CLIP1: ``max(min, min(x,
    max))``), after ``x * scale + bias`` where ``scale_bias`` (a ``vkml.dml.ScaleBias`` or
    a ``(scale, bias)`` pair; float32 and float16 only) is given.  ``x``: float32,
    float16 or an 8/16/32/64-bit integer type, 1 to 8 dimensions; ``min``/``max`` are
    values of that type (None: its lowest / highest; an integer bound must be an
    integer in the type's range).  The result has ``x``'s shape and type."""
    dev = pick_device(device, x)
    x = as_array(x, "x")
    scale_bias = as_scale_bias(scale_bias)
    dtype = np.dtype(x.dtype)
    try:
        dt = DataType.of(dtype)
    except ValidationError as exc:
        raise ValidationError("x", exc.rule) from None
    t = TensorDesc(dtype, tuple(x.shape) or (1,))
    desc = ElementWiseClip1OperatorDesc(t, t, scale_bias, dt, min, max)
    out = run(dev, desc, [x])
    if x.shape == () and not hasattr(out, "_alloc"):
        out = out.reshape(())
    return out

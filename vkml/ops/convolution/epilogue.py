"""SWISH and HARD_SWISH in a convolution's output pass: a graph fusion beyond DirectML's.

dml-fused-activations.md lists the activations a convolution may fuse, and SWISH /
HARD_SWISH are not among them: ``ConvolutionOperatorDesc(fused_activation=swish)`` stays a
ValidationError (``vkml.dml.activations.check_fused_activation``).  The kernels evaluate
both anyway (``ACT_SWISH``, ``ACT_HARD_SWISH`` in glsl/include/vkml_activation.glsl), so
the graph compiler (``vkml/ops/graph.py``) runs a SWISH or HARD_SWISH node that alone
reads a convolution's output inside that convolution, as it does a fusable activation.

The fused node's descriptor is :class:`EpilogueConvolutionDesc`: the convolution's
fields, validated by the public rules unchanged (its ``fused_activation`` None), and
``epilogue``, the activation, checked apart.  It is private to the graph compiler: not in
``vkml.dml`` nor in the operator registry (``create_operator`` validates it, the graph
compiles it with ``CompiledConvolution`` itself), so no user descriptor can carry it.
Every path reads the activation its kernels apply through :func:`kernel_activation`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...dml.activations import ActivationDesc
from ...dml.convolution import ConvolutionOperatorDesc
from ...dml.operator import FeatureLevel

#: The operator-only activations a graph runs in a convolution's output pass.
EPILOGUE_ACTIVATIONS = ("swish", "hard_swish")


@dataclass(frozen=True)
class EpilogueConvolutionDesc(ConvolutionOperatorDesc):
    """A convolution and the SWISH / HARD_SWISH node that alone reads its output, as one
    graph node (module doc): the convolution writes the activation's output tensor.
    ``epilogue``: the activation with its tensors None, applied where a fused activation
    would be."""

    epilogue: ActivationDesc | None = None

    def validate(self) -> None:
        """The convolution page's rules, then: ``epilogue`` a SWISH or HARD_SWISH
        descriptor in fused form (tensors None) with valid parameters, and no
        ``fused_activation`` besides (the kernels apply one activation)."""
        super().validate()
        act = self.epilogue
        if not isinstance(act, ActivationDesc) or act.SPEC.name not in EPILOGUE_ACTIVATIONS:
            self.fail("epilogue", f"must be an activation descriptor of "
                      f"{', '.join(EPILOGUE_ACTIVATIONS)}, got {type(act).__name__}")
        if not act.is_fused_form:
            self.fail("epilogue", "must have its InputTensor and OutputTensor None")
        if self.fused_activation is not None:
            self.fail("fused_activation", "must be None where an epilogue is given (the "
                      "output pass applies one activation)")
        act.validate_parameters(lambda name, rule: self.fail(f"epilogue.{name}", rule))

    def feature_level(self) -> FeatureLevel:
        return max(super().feature_level(), self.epilogue.feature_level())


def kernel_activation(desc) -> ActivationDesc | None:
    """The activation a convolution's output pass applies: ``fused_activation``, else an
    :class:`EpilogueConvolutionDesc`'s ``epilogue`` (also read through a
    ``PooledConvolutionDesc``), else None."""
    act = desc.fused_activation
    return act if act is not None else getattr(desc, "epilogue", None)

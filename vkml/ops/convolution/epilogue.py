"""SWISH, HARD_SWISH and a residual Add in a convolution's output pass: graph fusions
beyond DirectML's.

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

Residual: the graph compiler also runs an ELEMENT_WISE_ADD / ADD1 whose one input is a
convolution's output that only the add reads inside that convolution
(``EpilogueConvolutionDesc.residual``, the add's other input, a fourth input of the node):
the output pass computes ``act(conv + bias + residual)``, the activation (``fused_activation``
or ``epilogue``) applied after the add -- ADD1's fused activation, or an activation node
that alone reads the add.  The kernels read the residual at the output element's own
offset, so it must be laid out as the output (type, sizes, element strides); paths whose
kernels have no residual variant (``Path.RESIDUAL`` False) leave the pair unfused
(``CompiledConvolution(residual=)``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...dml.activations import ActivationDesc
from ...dml.convolution import ConvolutionOperatorDesc
from ...dml.operator import FeatureLevel
from ...dml.tensor_desc import TensorDesc

#: The operator-only activations a graph runs in a convolution's output pass.
EPILOGUE_ACTIVATIONS = ("swish", "hard_swish")


@dataclass(frozen=True)
class EpilogueConvolutionDesc(ConvolutionOperatorDesc):
    """A convolution and what alone reads its output, as one graph node (module doc): a
    SWISH / HARD_SWISH node (``epilogue``: the activation with its tensors None, applied
    where a fused activation would be) and / or a residual add (``residual``: the add's
    other input, added after the bias and before the activation).  The convolution
    writes the last absorbed node's output tensor."""

    epilogue: ActivationDesc | None = None
    residual: TensorDesc | None = None

    def inputs(self):
        """The convolution's inputs, then the residual where there is one."""
        ins = super().inputs()
        return ins + [self.residual] if self.residual is not None else ins

    def validate(self) -> None:
        """The convolution page's rules, then: ``epilogue`` None or a SWISH or HARD_SWISH
        descriptor in fused form (tensors None) with valid parameters, and no
        ``fused_activation`` besides (the kernels apply one activation); ``residual``
        None or a tensor of the output's data type, sizes and element strides (the
        kernels read it at the output element's offset); one of the two given."""
        super().validate()
        act, res = self.epilogue, self.residual
        if act is None and res is None:
            self.fail("epilogue", "an epilogue or a residual must be given (else the "
                      "node is a plain convolution)")
        if res is not None:
            self.check_tensor("residual", res, range(3, 6), (self.output_tensor.data_type,))
            y = self.output_tensor
            if res.sizes != y.sizes or res.element_strides != y.element_strides:
                self.fail("residual", f"must have the output's sizes {y.sizes} and element "
                          f"strides {y.element_strides} (read at the output's offsets), got "
                          f"{res.sizes} and {res.element_strides}")
        if act is None:
            return
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
        if self.epilogue is None:
            return super().feature_level()
        return max(super().feature_level(), self.epilogue.feature_level())


def residual_of(desc) -> TensorDesc | None:
    """The residual tensor a convolution's output pass adds (an
    :class:`EpilogueConvolutionDesc`'s ``residual``), else None."""
    return getattr(desc, "residual", None)


def kernel_activation(desc) -> ActivationDesc | None:
    """The activation a convolution's output pass applies: ``fused_activation``, else an
    :class:`EpilogueConvolutionDesc`'s ``epilogue`` (also read through a
    ``PooledConvolutionDesc``), else None."""
    act = desc.fused_activation
    return act if act is not None else getattr(desc, "epilogue", None)

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

Input scale: the graph compiler also runs an ELEMENT_WISE_MULTIPLY whose output only a
convolution's input reads, and whose one operand is broadcast over the spatial
dimensions (a squeeze-excitation block's ``x * s``, ``s`` of N x C x 1 x 1), inside that
convolution (``EpilogueConvolutionDesc.input_scale``, the broadcast operand; the
convolution reads the other operand as its input): ``conv(x * s)``.  The in-place GEMMs'
``_sc`` kernels multiply each input element by its channel's scale as they load it (the
products rounded as the multiply would store them), so nothing is written for ``x * s``;
every other path runs the multiply apart inside the operator (:class:`ScaleApart` in
``__init__.py``), into a buffer of its own, with the same values.

Global average pool: the graph compiler also offers a global average pool that alone reads
a convolution's output (:func:`global_average`: ONNX GlobalAveragePool as an
AVERAGE_POOLING over the plane or a REDUCE AVERAGE over the spatial axes) to the
convolution's path (``CompiledConvolution(pool=)``).  gemm_sg takes it where a subgroup's
lanes hold every pixel block of an image (7x7 planes: 7 blocks of 8 pixels on 8 lanes):
its output pass sums each channel's activated outputs within the lanes and across the
subgroup and stores the means, the pooled tensor its output (the operator's descriptor a
``PooledConvolutionDesc``); no output plane is written and no pooling pass runs.  The sums
run in another order than the pool's own kernel (float32 rounding, not the unfused bits).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ...dml.activations import ActivationDesc
from ...dml.convolution import ConvolutionOperatorDesc
from ...dml.data_type import DataType
from ...dml.operator import FeatureLevel
from ...dml.pooling import AveragePooling1OperatorDesc, AveragePoolingOperatorDesc
from ...dml.reduce import ReduceFunction, ReduceOperatorDesc
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
    input_scale: TensorDesc | None = None

    def inputs(self):
        """The convolution's inputs, then the input scale and the residual where there
        are those."""
        ins = super().inputs()
        return ins + [t for t in (self.input_scale, self.residual) if t is not None]

    def validate(self) -> None:
        """The convolution page's rules, then: ``epilogue`` None or a SWISH or HARD_SWISH
        descriptor in fused form (tensors None) with valid parameters, and no
        ``fused_activation`` besides (the kernels apply one activation); ``residual``
        None or a tensor of the output's data type, sizes and element strides (the
        kernels read it at the output element's offset); ``input_scale`` None or a
        tensor of the input's data type and sizes, of stride 0 along every spatial
        dimension (one scale per image and channel), for a forward convolution; one of
        the three given."""
        super().validate()
        act, res = self.epilogue, self.residual
        if act is None and res is None and self.input_scale is None:
            self.fail("epilogue", "an epilogue, a residual or an input scale must be given "
                      "(else the node is a plain convolution)")
        if self.input_scale is not None:
            self._validate_input_scale()
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

    def _validate_input_scale(self) -> None:
        sc, x = self.input_scale, self.input_tensor
        self.check_tensor("input_scale", sc, range(3, 6), (x.data_type,))
        if sc.sizes != x.sizes or any(sc.element_strides[2:]):
            self.fail("input_scale", f"must have the input's sizes {x.sizes} and stride 0 "
                      f"along the spatial dimensions (one scale per image and channel), got "
                      f"{sc.sizes} with strides {sc.element_strides}")
        if self.is_backward:
            self.fail("input_scale", "a forward convolution's only")

    def feature_level(self) -> FeatureLevel:
        if self.epilogue is None:
            return super().feature_level()
        return max(super().feature_level(), self.epilogue.feature_level())


def residual_of(desc) -> TensorDesc | None:
    """The residual tensor a convolution's output pass adds (an
    :class:`EpilogueConvolutionDesc`'s ``residual``), else None."""
    return getattr(desc, "residual", None)


def input_scale_of(desc) -> TensorDesc | None:
    """The per-(image, channel) scale a convolution's input is multiplied by (an
    :class:`EpilogueConvolutionDesc`'s ``input_scale``), else None."""
    return getattr(desc, "input_scale", None)


def without_input_scale(desc):
    """``desc`` without its input scale: a plain :class:`ConvolutionOperatorDesc` where
    nothing else is fused into it."""
    if getattr(desc, "epilogue", None) is None and residual_of(desc) is None:
        return ConvolutionOperatorDesc(**{f.name: getattr(desc, f.name)
                                          for f in fields(ConvolutionOperatorDesc)})
    return replace(desc, input_scale=None)


def kernel_activation(desc) -> ActivationDesc | None:
    """The activation a convolution's output pass applies: ``fused_activation``, else an
    :class:`EpilogueConvolutionDesc`'s ``epilogue`` (also read through a
    ``PooledConvolutionDesc``), else None."""
    act = desc.fused_activation
    return act if act is not None else getattr(desc, "epilogue", None)


def global_average(pool) -> bool:
    """Whether ``pool`` averages each whole (image, channel) plane: a REDUCE with the
    AVERAGE function over every spatial axis, or an AVERAGE_POOLING (ONNX
    GlobalAveragePool) whose one window is the plane (no padding, dilation 1); False
    for any other descriptor."""
    if isinstance(pool, ReduceOperatorDesc):
        return (pool.reduce_function == ReduceFunction.AVERAGE
                and sorted(pool.axes) == list(range(2, pool.input_tensor.dimension_count)))
    if isinstance(pool, (AveragePooling1OperatorDesc, AveragePoolingOperatorDesc)):
        return (tuple(pool.window_size) == tuple(pool.input_tensor.sizes[2:])
                and all(s == 1 for s in pool.output_tensor.sizes[2:])
                and not any(pool.start_padding) and not any(pool.end_padding)
                and all(d == 1 for d in (getattr(pool, "dilations", None) or ())))
    return False


def global_pool_rule(conv, pool) -> str | None:
    """Why a convolution's output pass cannot store global average ``pool`` of its output
    in place of the output (module doc, "Global average pool"), else None: a global
    average (:func:`global_average`) of the output read as written, float32, no residual
    (the path checks that a subgroup holds an image's blocks)."""
    if not global_average(pool):
        return "not a global average pool"
    src, y = pool.input_tensor, conv.output_tensor
    if (src.data_type != y.data_type or src.sizes != y.sizes
            or src.element_strides != y.element_strides):
        return "the pool does not read the convolution's output as it is written"
    if y.data_type != DataType.FLOAT32:
        return "float32 only"
    if residual_of(conv) is not None or input_scale_of(conv) is not None:
        return "a residual or input scale fused into the convolution"
    return None

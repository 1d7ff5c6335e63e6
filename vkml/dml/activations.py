"""The activation descriptors DirectML can fuse into Convolution (and GEMM).

Source: ``dml-fused-activations.md`` ("Activations that are supported for fusion") and each
activation's page ``DML_ACTIVATION_<NAME>_OPERATOR_DESC`` / ``DML_ELEMENT_WISE_CLIP_OPERATOR_DESC``.
One table, :data:`ACTIVATION_TABLE`, holds for each of them the DML operator type, the
parameters with the page's "typical default", the feature level that introduced it, the
formula (from its page) and the kernel's id for it (``glsl/include/vkml_activation.glsl``).
The descriptor classes (``ActivationReluOperatorDesc``, ``ElementWiseClipOperatorDesc``, ...)
are generated from that table.

Rules:
* The same descriptor serves both uses: with ``input_tensor``/``output_tensor`` set it is an
  operator of its own (``vkml/ops/activation.py``; the pages' "Tensor constraints":
  FLOAT32/FLOAT16, 1 to 8 dimensions, the same DataType, DimensionCount and Sizes); with
  both None it is fused (``standalone()`` / ``fused()`` convert between the two).
* When fused, ``input_tensor`` and ``output_tensor`` must be None ("you must set the
  *InputTensor* and *OutputTensor* parameters for the activation function to NULL"); the
  fusing operator checks that.
* Every parameter is a FLOAT (stored as float32) and must be a number; NaN is refused,
  and so is a finite value beyond float32's range (it would become infinite).
  Infinities are refused except for Clip's ``min``/``max`` (an unbounded side).
* SOFTPLUS: ``steepness`` "cannot be less than 1" before DML_FEATURE_LEVEL_6_4, which
  "allow[s] Steepness < 1": a steepness below 1 raises the descriptor's feature level to 6_4.
  Zero is refused at every level (the formula divides by it).
* CELU divides by ``alpha`` (``exp(x / Alpha)``): zero is refused.

SWISH and HARD_SWISH (feature level 6_2) are operators only: the fused-activation page does
not list them, so they are in :data:`OPERATOR_ACTIVATIONS` (``vkml.activation``) but not in
:data:`ACTIVATIONS` / :data:`ACTIVATION_TABLE` (what Convolution and ADD1 fuse).

Where a page gives no default (LINEAR's and PARAMETRIC_SOFTPLUS's alpha/beta, CLIP's
min/max) vkml chooses the ONNX ones: Affine alpha=1, beta=0; ParametricSoftplus alpha=1,
beta=1; Clip min=-FLT_MAX, max=+FLT_MAX (the type's lowest and highest values).
"""
from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass

import numpy as np

from ..errors import ArgumentTypeError, ValidationError
from .operator import FLT_MAX, FeatureLevel, OperatorDesc, check_float
from .tensor_desc import fail_with



@dataclass(frozen=True)
class ScaleBias:
    """``DML_SCALE_BIAS``: ``g(x) = x * scale + bias`` (Clip applies it before clamping)."""

    scale: float = 1.0
    bias: float = 0.0


@dataclass(frozen=True)
class ActivationSpec:
    """One row of :data:`ACTIVATION_TABLE`."""

    name: str                   # snake_case name, as vkml.convolution(fused_activation=name)
    operator_type: str          # DML_OPERATOR_TYPE
    class_name: str
    params: tuple               # ((field, default), ...) in the struct's order
    feature_level: FeatureLevel
    formula: str                # from the page
    kernel_id: int              # ACT_* in glsl/include/vkml_activation.glsl


_FL = FeatureLevel
#: name, DML type suffix, parameters (struct order, page default), introduced, formula.
_ROWS = [
    ("linear", "ACTIVATION_LINEAR", (("alpha", 1.0), ("beta", 0.0)), _FL.FL_1_0,
     "f(x) = Alpha * x + Beta"),
    ("sigmoid", "ACTIVATION_SIGMOID", (), _FL.FL_1_0, "f(x) = 1 / (1 + exp(-x))"),
    ("hard_sigmoid", "ACTIVATION_HARD_SIGMOID", (("alpha", 0.2), ("beta", 0.5)), _FL.FL_1_0,
     "f(x) = max(0, min(Alpha * x + Beta, 1))"),
    ("tanh", "ACTIVATION_TANH", (), _FL.FL_1_0,
     "f(x) = (1 - exp(-2 * x)) / (1 + exp(-2 * x))"),
    ("scaled_tanh", "ACTIVATION_SCALED_TANH", (("alpha", 1.0), ("beta", 0.5)), _FL.FL_1_0,
     "f(x) = Alpha * tanh(Beta * x)"),
    ("relu", "ACTIVATION_RELU", (), _FL.FL_1_0, "f(x) = max(0, x)"),
    ("leaky_relu", "ACTIVATION_LEAKY_RELU", (("alpha", 0.01),), _FL.FL_1_0,
     "f(x) = x if x >= 0 else Alpha * x"),
    ("thresholded_relu", "ACTIVATION_THRESHOLDED_RELU", (("alpha", 1.0),), _FL.FL_1_0,
     "f(x) = x if x > Alpha else 0"),
    ("elu", "ACTIVATION_ELU", (("alpha", 1.0),), _FL.FL_1_0,
     "f(x) = x if x >= 0 else Alpha * (exp(x) - 1)"),
    ("celu", "ACTIVATION_CELU", (("alpha", 1.0),), _FL.FL_3_0,
     "f(x) = max(0, x) + min(0, Alpha * (exp(x / Alpha) - 1))"),
    ("scaled_elu", "ACTIVATION_SCALED_ELU", (("alpha", 1.6732), ("gamma", 1.0507)), _FL.FL_1_0,
     "f(x) = Gamma * x if x > 0 else Gamma * (Alpha * exp(x) - Alpha)"),
    ("softplus", "ACTIVATION_SOFTPLUS", (("steepness", 1.0),), _FL.FL_1_0,
     "f(x) = ln(1 + exp(Steepness * x)) / Steepness"),
    ("parametric_softplus", "ACTIVATION_PARAMETRIC_SOFTPLUS", (("alpha", 1.0), ("beta", 1.0)),
     _FL.FL_1_0, "f(x) = Alpha * ln(1 + exp(Beta * x))"),
    ("softsign", "ACTIVATION_SOFTSIGN", (), _FL.FL_1_0, "f(x) = x / (1 + abs(x))"),
    ("identity", "ACTIVATION_IDENTITY", (), _FL.FL_1_0, "f(x) = x"),
    ("shrink", "ACTIVATION_SHRINK", (("bias", 0.0), ("threshold", 0.5)), _FL.FL_2_0,
     "f(x) = x - Bias if x > Threshold; x + Bias if x < -Threshold; else 0"),
    ("gelu", "ACTIVATION_GELU", (), _FL.FL_5_1, "f(x) = 0.5 * x * (1 + erf(x / sqrt(2)))"),
    # ELEMENT_WISE_CLIP is fusable "for Convolution and GEMM only", since feature level 6_0.
    ("clip", "ELEMENT_WISE_CLIP", (("scale_bias", None), ("min", -FLT_MAX), ("max", FLT_MAX)),
     _FL.FL_6_0, "f(x) = min(Max, max(Min, x * Scale + Bias))"),
]


#: Activations that run only as operators of their own: the fused-activation page does not
#: list them (rows as above; kernel ids continue after the fusable ones).
_STANDALONE_ROWS = [
    ("swish", "ACTIVATION_SWISH", (("sigmoid_input_scale", 1.0),), _FL.FL_6_2,
     "f(x) = x * Sigmoid(SigmoidInputScale * x)"),
    ("hard_swish", "ACTIVATION_HARD_SWISH", (("alpha", 1 / 6), ("beta", 0.5)), _FL.FL_6_2,
     "f(x) = x * HardSigmoid(x, Alpha, Beta) = x * max(0, min(Alpha * x + Beta, 1))"),
]


def _class_name(suffix: str) -> str:
    return "".join(w.capitalize() for w in suffix.split("_")) + "OperatorDesc"


def _table(rows, first_id: int) -> dict[str, ActivationSpec]:
    return {name: ActivationSpec(name, "DML_OPERATOR_" + suffix, _class_name(suffix), params,
                                 level, formula, kernel_id)
            for kernel_id, (name, suffix, params, level, formula) in enumerate(rows, first_id)}


#: name -> ActivationSpec of the fusable activations, in the order of the fused-activation page.
ACTIVATION_TABLE: dict[str, ActivationSpec] = _table(_ROWS, 1)
#: name -> ActivationSpec of the activations that are operators only (not fusable).
STANDALONE_ACTIVATION_TABLE: dict[str, ActivationSpec] = _table(_STANDALONE_ROWS,
                                                                len(_ROWS) + 1)


class ActivationDesc(OperatorDesc):
    """Base of the generated activation descriptors (frozen dataclasses)."""

    SPEC: ActivationSpec

    def inputs(self):
        return [self.input_tensor]

    def outputs(self):
        return [self.output_tensor]

    def feature_level(self) -> FeatureLevel:
        level = self.SPEC.feature_level
        if self.SPEC.name == "softplus" and self.steepness < 1:
            level = max(level, FeatureLevel.FL_6_4)   # "allow Steepness < 1" (6_4)
        return level

    def validate(self) -> None:
        """The parameter rules (module docstring); the tensors, when given, as the page's
        'Tensor constraints': same DataType, DimensionCount and Sizes, FLOAT32/FLOAT16."""
        from .data_type import DataType

        from .operator import check_no_overlap

        self.validate_parameters(self.fail)
        for name in ("input_tensor", "output_tensor"):
            if getattr(self, name) is None:
                self.fail(name, "is required when the activation runs as an operator of its "
                          "own (None is only for an activation fused into another operator)")
        floats = (DataType.FLOAT32, DataType.FLOAT16)
        self.check_tensor("input_tensor", self.input_tensor, range(1, 9), floats)
        self.check_tensor("output_tensor", self.output_tensor, range(1, 9), floats)
        self.check_same_type(["input_tensor", "output_tensor"])
        if self.input_tensor.dimension_count != self.output_tensor.dimension_count:
            self.fail("output_tensor.sizes", "InputTensor and OutputTensor must have the same "
                      f"DimensionCount, got {self.input_tensor.dimension_count} and "
                      f"{self.output_tensor.dimension_count}")
        if self.input_tensor.sizes != self.output_tensor.sizes:
            self.fail("output_tensor.sizes", "InputTensor and OutputTensor must have the same "
                      f"Sizes, got {self.input_tensor.sizes} and {self.output_tensor.sizes}")
        check_no_overlap(self, "output_tensor", self.output_tensor)

    @property
    def is_fused_form(self) -> bool:
        """Both tensors None: the form another operator fuses (``fused_activation``)."""
        return self.input_tensor is None and self.output_tensor is None

    def standalone(self, input_tensor, output_tensor) -> "ActivationDesc":
        """This activation (same parameters) as an operator of its own on these tensors."""
        from dataclasses import replace

        return replace(self, input_tensor=input_tensor, output_tensor=output_tensor)

    def fused(self) -> "ActivationDesc":
        """This activation (same parameters) with its tensors None, ready to be fused."""
        return self.standalone(None, None)

    def validate_parameters(self, fail) -> None:
        """Check the parameters; ``fail(field, rule)`` raises (it names the field)."""
        for name, _ in self.SPEC.params:
            value = getattr(self, name)
            if name == "scale_bias":
                if value is None:
                    continue
                if not isinstance(value, ScaleBias):
                    fail_with(name, "must be a ScaleBias (DML_SCALE_BIAS) or None, got "
                              f"{type(value).__name__}", fail, ArgumentTypeError)
                for sub in ("scale", "bias"):
                    check_float(fail, f"scale_bias.{sub}", getattr(value, sub), False)
                continue
            check_float(fail, name, value, name in ("min", "max"))
        if self.SPEC.name == "softplus" and self.steepness == 0:
            fail("steepness", "must not be 0 (the formula divides by Steepness)")
        if self.SPEC.name == "celu" and self.alpha == 0:
            fail("alpha", "must not be 0 (the formula divides by Alpha: exp(x / Alpha))")

    def kernel_parameters(self) -> np.ndarray:
        """The four float32 values the kernel's activation reads (see vkml_activation.glsl)."""
        values = [float(getattr(self, n)) for n, _ in self.SPEC.params if n != "scale_bias"]
        if self.SPEC.name == "clip":
            sb = self.scale_bias or ScaleBias()
            values = [float(sb.scale), float(sb.bias)] + values
        values += [0.0] * (4 - len(values))
        return np.array(values, dtype=np.float32)


def _make_class(spec: ActivationSpec) -> type:
    params = [(n, object, field(default=v)) for n, v in spec.params]
    cls = make_dataclass(
        spec.class_name,
        [("input_tensor", object, field(default=None)),
         ("output_tensor", object, field(default=None))] + params,
        bases=(ActivationDesc,), frozen=True,
        namespace={"SPEC": spec, "OPERATOR_TYPE": spec.operator_type,
                   "FEATURE_LEVEL": spec.feature_level})
    cls.__module__ = __name__
    args = ", ".join(f"{n}={v!r}" for n, v in spec.params)
    cls.__doc__ = (f"``{spec.operator_type.replace('DML_OPERATOR_', 'DML_')}_OPERATOR_DESC``"
                   f" ({spec.feature_level}): {spec.formula}.\n\n"
                   f"Fields: input_tensor=None, output_tensor=None" + (f", {args}" if args else "")
                   + " (defaults: the page's typical values; ONNX's where it gives none).")
    return cls


#: name -> descriptor class of the fusable activations (the fused-activation page's list).
ACTIVATIONS: dict[str, type] = {}
#: name -> descriptor class of every activation operator: ACTIVATIONS, then swish and
#: hard_swish (operators only).
OPERATOR_ACTIVATIONS: dict[str, type] = {}
for _spec in list(ACTIVATION_TABLE.values()) + list(STANDALONE_ACTIVATION_TABLE.values()):
    OPERATOR_ACTIVATIONS[_spec.name] = globals()[_spec.class_name] = _make_class(_spec)
    if _spec.name in ACTIVATION_TABLE:
        ACTIVATIONS[_spec.name] = OPERATOR_ACTIVATIONS[_spec.name]
del _spec


def activation(value, fusable: bool = True) -> ActivationDesc | None:
    """An activation descriptor from None, an instance, its class, or a name: "relu",
    "leaky_relu", "DML_OPERATOR_ACTIVATION_ELU", "element_wise_clip" (any case).
    ``fusable``: only those the fused-activation page lists (else swish and hard_swish
    too, which are operators only)."""
    from ..errors import ValidationError

    table = ACTIVATIONS if fusable else OPERATOR_ACTIVATIONS
    if value is None or (isinstance(value, ActivationDesc) and type(value) in table.values()):
        return value
    if isinstance(value, type) and issubclass(value, ActivationDesc) and value in table.values():
        return value()
    if isinstance(value, str):
        key = value.strip().lower()
        for prefix in ("dml_operator_activation_", "dml_operator_", "activation_"):
            key = key.removeprefix(prefix)
        key = {"element_wise_clip": "clip"}.get(key, key)
        if key in table:
            return table[key]()
    error = ValidationError if isinstance(value, (str, type, ActivationDesc)) else \
        ArgumentTypeError
    what = "that can be fused" if fusable else "operator"
    raise error("fused_activation", f"{value!r} is not an activation {what} "
                          f"({', '.join(table)}), nor one of their descriptors")


def coerce_fused_activation(desc) -> None:
    """A fusing descriptor's ``__post_init__``: an activation name or class given for
    ``fused_activation`` is stored as its descriptor (:func:`activation`); an unknown one
    raises ValidationError naming the field."""
    if isinstance(desc.fused_activation, (str, type)):
        try:
            act = activation(desc.fused_activation)
        except ValidationError as exc:
            raise ValidationError(desc.field("fused_activation"), exc.rule) from None
        object.__setattr__(desc, "fused_activation", act)


def fused_activation_level(desc, level: FeatureLevel) -> FeatureLevel:
    """``level``, raised to the fused activation's feature level where there is one."""
    act = desc.fused_activation
    return level if act is None else max(level, act.feature_level())


def check_fused_activation(desc, clip: bool) -> None:
    """dml-fused-activations.md: ``fused_activation`` is None or an activation descriptor
    of the page's list (:data:`ACTIVATIONS`; not SWISH or HARD_SWISH) with both tensors NULL;
    ELEMENT_WISE_CLIP only where ``clip`` (the page: "for Convolution and GEMM only")."""
    act = desc.fused_activation
    if act is None:
        return
    if not isinstance(act, ActivationDesc) or type(act) not in ACTIVATIONS.values():
        desc.fail("fused_activation", "must be None or an activation descriptor the "
                  "fused-activation page lists (vkml.dml.ACTIVATIONS), got "
                  f"{type(act).__name__}")
    for t in ("input_tensor", "output_tensor"):
        if getattr(act, t) is not None:
            desc.fail(f"fused_activation.{t}", "must be None: a fused activation's "
                      "InputTensor and OutputTensor are NULL")
    if not clip and act.SPEC.name == "clip":
        desc.fail("fused_activation", "DML_OPERATOR_ELEMENT_WISE_CLIP can be fused "
                  "for Convolution and GEMM only")
    act.validate_parameters(lambda name, rule: desc.fail(f"fused_activation.{name}", rule))


__all__ = ["ACTIVATION_TABLE", "ACTIVATIONS", "ActivationDesc", "ActivationSpec", "ScaleBias",
           "OPERATOR_ACTIVATIONS", "STANDALONE_ACTIVATION_TABLE", "activation", "FLT_MAX"] + [
    s.class_name for s in list(ACTIVATION_TABLE.values())
    + list(STANDALONE_ACTIVATION_TABLE.values())]

"""Element-wise arithmetic and identity: ``DML_ELEMENT_WISE_{ADD, ADD1, SUBTRACT, MULTIPLY,
DIVIDE, MAX, MIN}_OPERATOR_DESC`` (two inputs), ``DML_ELEMENT_WISE_IDENTITY_OPERATOR_DESC``
and ``DML_ELEMENT_WISE_CLIP1_OPERATOR_DESC``.

Rules (each page's "Tensor constraints" and "Tensor support"):
* the tensors "must have the same DataType, DimensionCount, and Sizes"; broadcasting is
  expressed, as in DirectML, by an input's strides (0 repeats an element);
* 1 to 8 dimensions (the tables' latest rows; 4 to 5, or 4, at the first levels:
  :meth:`ElementWiseDesc.feature_level` reports the lowest level whose table admits the
  descriptor);
* data types: ADD, SUBTRACT, MULTIPLY (5_1), DIVIDE (6_0), MAX, MIN (5_0): FLOAT32,
  FLOAT16 and the 8/16/32/64-bit integers; ADD1: FLOAT32, FLOAT16; IDENTITY (4_1): all 11;
* the output's elements may not overlap (writes would race); the output may alias an
  input ("supports in-place execution"), which the kernels allow: each element is read
  and written by the same invocation;
* ADD1's ``fused_activation``: None or an activation the fused-activation page lists,
  its tensors None ("Fused activation may be used only when the output datatype is
  FLOAT16 or FLOAT32"); ELEMENT_WISE_CLIP is fusable "for Convolution and GEMM only";
* IDENTITY's ``scale_bias``: None or a ScaleBias of finite FLOATs, applied as
  ``x * scale + bias`` before the identity.  vkml applies it to FLOAT32 and FLOAT16
  tensors (in float32 arithmetic) and refuses it for integer types, whose page gives no
  rounding for a scaled integer; FLOAT64 with a ScaleBias is UnsupportedError.

* CLIP1 (5_0; learn.microsoft.com, ``DML_ELEMENT_WISE_CLIP1_OPERATOR_DESC``): ``f(x) =
  max(Min, min(x, Max))`` after the optional ScaleBias; FLOAT32, FLOAT16 and the 8/16/32/
  64-bit integers, 1 to 8 dimensions; ``min_max_data_type`` "must match
  OutputTensor.DataType"; ``min``/``max`` are DML_SCALAR_UNIONs read as that type, so
  each must be exactly representable in it (an integer in the type's range; for floats
  any number within the type's range, rounded to it, or an infinity; NaN is refused, as
  CLIP's FLOATs refuse it).  None (vkml's default) is the type's lowest / highest value.
  Min > Max is legal: the formula then gives Min everywhere.  ScaleBias as IDENTITY's
  (float types only).

Integer semantics (the pages say only "For integer divisions, the result is truncated"):
results wrap modulo 2^bits like C's unsigned arithmetic (NumPy's too); division truncates
toward zero; an integer division by zero gives 0 (NumPy's result; ONNX Runtime leaves it
undefined, the CPU traps), and INT_MIN / -1 wraps to INT_MIN.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .activations import (ACTIVATIONS, ActivationDesc, ScaleBias, check_fused_activation,
                          fused_activation_level)
from .data_type import ALL_TYPES, DataType
from .operator import FeatureLevel, OperatorDesc, as_real, check_no_overlap
from .tensor_desc import TensorDesc, fail_with
from ..errors import ArgumentTypeError

_FL = FeatureLevel
_F = (DataType.FLOAT32, DataType.FLOAT16)
_I32 = (DataType.INT32, DataType.UINT32)
_I64 = (DataType.INT64, DataType.UINT64)
_SMALL = (DataType.INT16, DataType.INT8, DataType.UINT16, DataType.UINT8)
_ARITH = _F + _I32 + _I64 + _SMALL
_R18, _R45, _R4 = range(1, 9), (4, 5), (4,)
_CLIP1 = _F + _I64 + _I32 + _SMALL      # the page's ten types (no FLOAT64)

#: Per operator: "Tensor support" rows, newest first: (level, dimension counts, types).
SUPPORT = {
    "ADD": [(_FL.FL_5_1, _R18, _ARITH), (_FL.FL_4_1, _R18, _F + _I32 + _I64),
            (_FL.FL_3_0, _R18, _F + _I32), (_FL.FL_2_1, _R45, _F + _I32),
            (_FL.FL_1_0, _R45, _F)],
    "ADD1": [(_FL.FL_3_0, _R18, _F), (_FL.FL_2_0, _R45, _F)],
    "SUBTRACT": [(_FL.FL_5_1, _R18, _ARITH), (_FL.FL_4_1, _R18, _F + _I32 + _I64),
                 (_FL.FL_3_0, _R18, _F + _I32), (_FL.FL_2_1, _R4, _F + _I32),
                 (_FL.FL_1_0, _R4, _F)],
    "MULTIPLY": [(_FL.FL_5_1, _R18, _ARITH), (_FL.FL_4_1, _R18, _F + _I32 + _I64),
                 (_FL.FL_3_0, _R18, _F + _I32), (_FL.FL_2_1, _R45, _F + _I32),
                 (_FL.FL_1_0, _R45, _F)],
    "DIVIDE": [(_FL.FL_6_0, _R18, _ARITH), (_FL.FL_5_1, _R18, _F + _I32 + _SMALL),
               (_FL.FL_3_0, _R18, _F + _I32), (_FL.FL_2_1, _R4, _F + _I32),
               (_FL.FL_1_0, _R4, _F)],
    "MAX": [(_FL.FL_5_0, _R18, _ARITH), (_FL.FL_3_0, _R18, _F + _I32 + _SMALL),
            (_FL.FL_2_1, _R4, _F + _I32 + _SMALL), (_FL.FL_1_0, _R4, _F)],
    "IDENTITY": [(_FL.FL_4_1, _R18, ALL_TYPES),
                 (_FL.FL_3_0, _R18, _F + _I32 + _SMALL),
                 (_FL.FL_2_1, _R45, _F + _I32 + _SMALL), (_FL.FL_1_0, _R45, _F)],
}
SUPPORT["MIN"] = SUPPORT["MAX"]
SUPPORT["CLIP1"] = [(_FL.FL_5_0, _R18, _CLIP1)]

#: The kernel's OP_* (glsl/element_wise.comp) per operator.
KERNEL_OP = {"IDENTITY": 0, "ADD": 1, "ADD1": 1, "SUBTRACT": 2, "MULTIPLY": 3,
             "DIVIDE": 4, "MAX": 5, "MIN": 6, "CLIP1": 0}     # CLIP1: identity, then ACT


class ElementWiseDesc(OperatorDesc):
    """What the element-wise descriptors share: tensors of one type, rank and sizes."""

    NAME = ""                    # key of SUPPORT / KERNEL_OP
    TENSORS: tuple = ()          # input field names, in binding order

    def inputs(self):
        return [getattr(self, n) for n in self.TENSORS]

    def outputs(self):
        return [self.output_tensor]

    def feature_level(self) -> FeatureLevel:
        """The lowest level whose "Tensor support" row admits these tensors."""
        t = self.output_tensor
        rows = [lv for lv, ranks, types in SUPPORT[self.NAME]
                if t.dimension_count in ranks and t.data_type in types]
        return min(rows) if rows else SUPPORT[self.NAME][0][0]

    def validate(self) -> None:
        """The page's tensor constraints (module docstring)."""
        level, ranks, types = SUPPORT[self.NAME][0]
        names = list(self.TENSORS) + ["output_tensor"]
        for n in names:
            self.check_tensor(n, getattr(self, n), ranks, types)
        self.check_same_type(names)
        first = self.TENSORS[0]
        ref = getattr(self, first)
        for n in names[1:]:
            t = getattr(self, n)
            if t.dimension_count != ref.dimension_count:
                self.fail(f"{n}.sizes", f"must have the DimensionCount of {first} "
                          f"({ref.dimension_count}), got {t.dimension_count}")
            if t.sizes != ref.sizes:
                self.fail(f"{n}.sizes", f"must equal {first}.sizes {ref.sizes} (the "
                          f"tensors must have the same Sizes; broadcast with strides of 0), "
                          f"got {t.sizes}")
        check_no_overlap(self, "output_tensor", self.output_tensor)

    def kernel_act(self) -> tuple[int, tuple]:
        """(ACT_* id, its four float parameters) the kernel applies after the operation."""
        return 0, (0.0, 0.0, 0.0, 0.0)


def _binary(name: str, doc: str, level: FeatureLevel):
    cls = dataclass(frozen=True)(type(
        f"ElementWise{name.capitalize()}OperatorDesc", (ElementWiseDesc,),
        {"__annotations__": {"a_tensor": TensorDesc, "b_tensor": TensorDesc,
                             "output_tensor": TensorDesc},
         "NAME": name, "TENSORS": ("a_tensor", "b_tensor"),
         "OPERATOR_TYPE": f"DML_OPERATOR_ELEMENT_WISE_{name}", "FEATURE_LEVEL": level,
         "__doc__": f"``DML_ELEMENT_WISE_{name}_OPERATOR_DESC``: {doc}.",
         "__module__": __name__}))
    return cls


ElementWiseAddOperatorDesc = _binary("ADD", "f(a, b) = a + b", _FL.FL_1_0)
ElementWiseSubtractOperatorDesc = _binary("SUBTRACT", "f(a, b) = a - b", _FL.FL_1_0)
ElementWiseMultiplyOperatorDesc = _binary("MULTIPLY", "f(a, b) = a * b", _FL.FL_1_0)
ElementWiseDivideOperatorDesc = _binary(
    "DIVIDE", "f(a, b) = a / b (integers: truncated toward zero; x / 0 = 0)", _FL.FL_1_0)
ElementWiseMaxOperatorDesc = _binary("MAX", "f(a, b) = max(a, b)", _FL.FL_1_0)
ElementWiseMinOperatorDesc = _binary("MIN", "f(a, b) = min(a, b)", _FL.FL_1_0)


@dataclass(frozen=True)
class ElementWiseAdd1OperatorDesc(ElementWiseDesc):
    """``DML_ELEMENT_WISE_ADD1_OPERATOR_DESC`` (2_0): f(a, b) = FusedActivation(a + b)."""

    a_tensor: TensorDesc
    b_tensor: TensorDesc
    output_tensor: TensorDesc
    fused_activation: ActivationDesc | None = None

    NAME = "ADD1"
    TENSORS = ("a_tensor", "b_tensor")
    OPERATOR_TYPE = "DML_OPERATOR_ELEMENT_WISE_ADD1"
    FEATURE_LEVEL = _FL.FL_2_0

    def feature_level(self) -> FeatureLevel:
        return fused_activation_level(self, super().feature_level())

    def validate(self) -> None:
        super().validate()
        check_fused_activation(self, clip=False)

    def kernel_act(self):
        act = self.fused_activation
        if act is None:
            return 0, (0.0, 0.0, 0.0, 0.0)
        return act.SPEC.kernel_id, tuple(float(v) for v in act.kernel_parameters())


@dataclass(frozen=True)
class ElementWiseIdentityOperatorDesc(ElementWiseDesc):
    """``DML_ELEMENT_WISE_IDENTITY_OPERATOR_DESC``: f(x) = x, after ``x * scale + bias``
    where ``scale_bias`` is given (strided copies: transposes, layout changes)."""

    input_tensor: TensorDesc
    output_tensor: TensorDesc
    scale_bias: ScaleBias | None = None

    NAME = "IDENTITY"
    TENSORS = ("input_tensor",)
    OPERATOR_TYPE = "DML_OPERATOR_ELEMENT_WISE_IDENTITY"
    FEATURE_LEVEL = _FL.FL_1_0

    def validate(self) -> None:
        super().validate()
        _check_scale_bias(self)

    def kernel_act(self):
        sb = self.scale_bias
        if sb is None:
            return 0, (0.0, 0.0, 0.0, 0.0)
        return ACTIVATIONS["linear"].SPEC.kernel_id, (float(sb.scale), float(sb.bias), 0.0, 0.0)


def _check_scale_bias(desc) -> None:
    """IDENTITY's and CLIP1's ``scale_bias``: None or a ScaleBias of finite FLOATs, for
    float tensors only (module doc)."""
    sb = desc.scale_bias
    if sb is None:
        return
    if not isinstance(sb, ScaleBias):
        fail_with("scale_bias", "must be a ScaleBias (DML_SCALE_BIAS) or None, got "
                  f"{type(sb).__name__}", desc.fail, ArgumentTypeError)
    for sub in ("scale", "bias"):
        v = float(as_real(getattr(sb, sub), f"scale_bias.{sub}", desc.fail))
        if not math.isfinite(v):
            desc.fail(f"scale_bias.{sub}", f"must be a finite FLOAT, got {v}")
    dt = desc.input_tensor.data_type
    if not dt.is_float:
        desc.fail("scale_bias", f"g(x) = x * scale + bias is applied to float tensors "
                  f"only (FLOAT32, FLOAT16); input_tensor.data_type is {dt.name}")


@dataclass(frozen=True)
class ElementWiseClip1OperatorDesc(ElementWiseDesc):
    """``DML_ELEMENT_WISE_CLIP1_OPERATOR_DESC`` (5_0): f(x) = max(Min, min(x, Max)), after
    ``x * scale + bias`` where ``scale_bias`` is given; ``min``/``max`` typed by
    ``min_max_data_type`` (DML_SCALAR_UNION; None: the type's lowest / highest)."""

    input_tensor: TensorDesc
    output_tensor: TensorDesc
    scale_bias: ScaleBias | None = None
    min_max_data_type: DataType = DataType.FLOAT32
    min: float | int | None = None
    max: float | int | None = None

    NAME = "CLIP1"
    TENSORS = ("input_tensor",)
    OPERATOR_TYPE = "DML_OPERATOR_ELEMENT_WISE_CLIP1"
    FEATURE_LEVEL = _FL.FL_5_0

    def validate(self) -> None:
        """The tensors as the other element-wise pages (1 to 8 dimensions, the ten types,
        same DataType and Sizes); MinMaxDataType "must match OutputTensor.DataType";
        Min and Max representable in it; ScaleBias as IDENTITY's."""
        super().validate()
        vt = DataType.of(self.min_max_data_type, self.field("min_max_data_type"))
        if vt != self.output_tensor.data_type:
            self.fail("min_max_data_type", "must match OutputTensor.DataType "
                      f"({self.output_tensor.data_type.name}), got {vt.name}")
        self.bounds()
        _check_scale_bias(self)

    def bounds(self) -> tuple:
        """(Min, Max) as values of the tensors' NumPy type (None: the type's lowest /
        highest), each checked to be exactly a DML_SCALAR_UNION of MinMaxDataType."""
        from .padding import padding_value_bits

        dt = self.output_tensor.data_type
        out = []
        for name in ("min", "max"):
            v = getattr(self, name)
            if v is None and dt.is_float:
                v = -math.inf if name == "min" else math.inf
            elif v is None:
                info = np.iinfo(dt.numpy)
                v = int(info.min if name == "min" else info.max)
            elif isinstance(as_real(v, name, self.fail), float) and math.isnan(v):
                self.fail(name, f"must be a number of type {dt.name}, got NaN")
            bits = padding_value_bits(v, dt, True, name, self.fail)
            out.append(np.array([bits], f"u{dt.size}").view(dt.numpy)[0])
        return tuple(out)

    def kernel_act(self):
        """Float types: the kernel's identity with the CLIP activation (scale, bias, min,
        max), Max raised to Min where Min > Max (the page's formula then gives Min)."""
        lo, hi = (float(v) for v in self.bounds())
        sb = self.scale_bias or ScaleBias()
        return ACTIVATIONS["clip"].SPEC.kernel_id, (float(sb.scale), float(sb.bias), lo,
                                                    max(lo, hi))


#: Every element-wise descriptor class of this module.
ELEMENT_WISE = (ElementWiseAddOperatorDesc, ElementWiseAdd1OperatorDesc,
                ElementWiseSubtractOperatorDesc, ElementWiseMultiplyOperatorDesc,
                ElementWiseDivideOperatorDesc, ElementWiseMaxOperatorDesc,
                ElementWiseMinOperatorDesc, ElementWiseIdentityOperatorDesc)

__all__ = ["ELEMENT_WISE", "ElementWiseDesc", "ElementWiseClip1OperatorDesc"] + [
    c.__name__ for c in ELEMENT_WISE]

"""DML_ACTIVATION_SOFTMAX_OPERATOR_DESC and DML_ACTIVATION_SOFTMAX1_OPERATOR_DESC
(``dml-docs/DML_ACTIVATION_SOFTMAX_OPERATOR_DESC.md``, ``..._SOFTMAX1_...``).

Softmax is not one of the activations DirectML fuses (``dml-fused-activations.md``) and
reduces over axes, so its descriptors live here rather than in the activation table.
"""
from __future__ import annotations

from dataclasses import dataclass

from .data_type import FLOAT_TYPES
from .operator import FeatureLevel, InputOutputDesc, check_no_overlap
from .tensor_desc import TensorDesc, as_ints

__all__ = ["ActivationSoftmaxOperatorDesc", "ActivationSoftmax1OperatorDesc"]


class _SoftmaxRules(InputOutputDesc):
    """The tensor rules both pages share: FLOAT32/FLOAT16, 1 to 8 dimensions, "InputTensor
    and OutputTensor must have the same DataType, DimensionCount, and Sizes"; the output's
    elements must not overlap (its writes would race)."""

    def validate_tensors(self) -> None:
        self.check_tensor("input_tensor", self.input_tensor, range(1, 9), FLOAT_TYPES)
        self.check_tensor("output_tensor", self.output_tensor, range(1, 9), FLOAT_TYPES)
        self.check_same_type(["input_tensor", "output_tensor"])
        self.check_same_rank(["input_tensor", "output_tensor"])
        if self.input_tensor.sizes != self.output_tensor.sizes:
            self.fail("output_tensor.sizes", "InputTensor and OutputTensor must have the same "
                      f"Sizes, got {self.input_tensor.sizes} and {self.output_tensor.sizes}")
        check_no_overlap(self, "output_tensor", self.output_tensor)

    def reduced_axes(self) -> tuple[int, ...]:
        """The axes each softmax runs over (sorted)."""
        raise NotImplementedError


@dataclass(frozen=True)
class ActivationSoftmaxOperatorDesc(_SoftmaxRules):
    """``DML_ACTIVATION_SOFTMAX_OPERATOR_DESC``: ``f(x[i]) = exp(x[i]) / sum_j exp(x[j])``
    over the last dimension.

    Rules (the page): the input has an *effective rank* no greater than 2 (its
    DimensionCount excluding leftmost dimensions of size 1: ``{1, 1, BatchCount, Width}``
    is ``{BatchCount, Width}``); 1 to 8 dimensions from DML_FEATURE_LEVEL_3_0, 4 to 5 from
    2_0, 4 at 1_0 (:meth:`feature_level`); the shared rules of :class:`_SoftmaxRules`.
    """

    input_tensor: TensorDesc
    output_tensor: TensorDesc

    OPERATOR_TYPE = "DML_OPERATOR_ACTIVATION_SOFTMAX"
    FEATURE_LEVEL = FeatureLevel.FL_1_0

    def feature_level(self) -> FeatureLevel:
        rank = self.input_tensor.dimension_count
        return (FeatureLevel.FL_1_0 if rank == 4 else FeatureLevel.FL_2_0 if rank == 5
                else FeatureLevel.FL_3_0)

    def validate(self) -> None:
        self.validate_tensors()
        sizes = list(self.input_tensor.sizes)
        while len(sizes) > 1 and sizes[0] == 1:
            sizes.pop(0)
        if len(sizes) > 2:
            self.fail("input_tensor.sizes", "must have an effective rank no greater than 2 "
                      "(the DimensionCount excluding leftmost dimensions of size 1), got "
                      f"{len(sizes)} for sizes {self.input_tensor.sizes}")

    def reduced_axes(self) -> tuple[int, ...]:
        return (self.input_tensor.dimension_count - 1,)


@dataclass(frozen=True)
class ActivationSoftmax1OperatorDesc(_SoftmaxRules):
    """``DML_ACTIVATION_SOFTMAX1_OPERATOR_DESC``: softmax over the elements of ``axes``
    (every combination of the other coordinates is one softmax).

    Rules (the page): ``axes`` "Values must be in the range [0, InputTensor.DimensionCount
    - 1]"; AxisCount is implied by its length.  vkml's reading where the page is silent:
    at least one axis (AxisCount is "the number of axes to calculate reduce sum"), and
    each axis once (a repeated axis names no further elements).  With ``axes`` =
    ``(DimensionCount - 1,)`` it is ACTIVATION_SOFTMAX (the page's remark).  The shared
    rules of :class:`_SoftmaxRules`.
    """

    input_tensor: TensorDesc
    output_tensor: TensorDesc
    axes: tuple = ()

    OPERATOR_TYPE = "DML_OPERATOR_ACTIVATION_SOFTMAX1"
    FEATURE_LEVEL = FeatureLevel.FL_5_1
    _TUPLE_FIELDS = ("axes",)

    def validate(self) -> None:
        self.validate_tensors()
        axes = as_ints(self.axes, "axes", self.fail)
        rank = self.input_tensor.dimension_count
        if not axes:
            self.fail("axes", "must name at least one axis (AxisCount >= 1)")
        for i, a in enumerate(axes):
            if not 0 <= a <= rank - 1:
                self.fail(f"axes[{i}]", "values must be in the range [0, "
                          f"InputTensor.DimensionCount - 1] = [0, {rank - 1}], got {a}")
            if a in axes[:i]:
                self.fail(f"axes[{i}]", f"axis {a} is given twice (each axis at most once)")

    def reduced_axes(self) -> tuple[int, ...]:
        return tuple(sorted(self.axes))

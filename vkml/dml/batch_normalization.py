"""DML_BATCH_NORMALIZATION_OPERATOR_DESC (``dml-docs/DML_BATCH_NORMALIZATION_OPERATOR_DESC.md``)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .activations import (ActivationDesc, check_fused_activation, coerce_fused_activation,
                          fused_activation_level)
from .data_type import FLOAT_TYPES
from .operator import FeatureLevel, OperatorDesc, check_float, check_no_overlap
from .tensor_desc import TensorDesc

__all__ = ["BatchNormalizationOperatorDesc"]

#: The statistics tensors, in DirectML's binding order after the input.
STATISTICS = ("mean_tensor", "variance_tensor", "scale_tensor", "bias_tensor")


@dataclass(frozen=True)
class BatchNormalizationOperatorDesc(OperatorDesc):
    """``DML_BATCH_NORMALIZATION_OPERATOR_DESC``: ``Output = FusedActivation(Scale *
    ((Input - Mean) / sqrt(Variance + Epsilon)) + Bias)``.

    Rules (the page):
    * every tensor FLOAT32 or FLOAT16, 1 to 8 dimensions (4 only before
      DML_FEATURE_LEVEL_3_1: :meth:`feature_level`), all of the same DataType and
      DimensionCount; InputTensor and OutputTensor of the same Sizes;
    * "Any dimension in MeanTensor, VarianceTensor, ScaleTensor, and BiasTensor can be set
      to 1, and be automatically broadcast to match InputTensor, but otherwise must equal
      the corresponding dimension's size from InputTensor";
    * ``spatial`` (a BOOL) "was deprecated in DML_FEATURE_LEVEL_4_0, and has no effect";
      before it, FALSE required the Width and Height dimensions of Mean and Variance not
      to be broadcast, so a FALSE with them broadcast raises the descriptor's feature
      level to 4_0 (vkml implements 6_4: it is accepted, without effect);
    * ``epsilon`` a FLOAT: a finite number (NaN and infinities refused, vkml's reading:
      they make every output NaN or the bias);
    * ``fused_activation``: None or an activation of the fused-activation page, its
      tensors None; ELEMENT_WISE_CLIP is fusable "for Convolution and GEMM only".
    * The output's elements must not overlap (its writes would race).
    """

    input_tensor: TensorDesc
    mean_tensor: TensorDesc
    variance_tensor: TensorDesc
    scale_tensor: TensorDesc
    bias_tensor: TensorDesc
    output_tensor: TensorDesc
    spatial: bool = True
    epsilon: float = 1e-5
    fused_activation: ActivationDesc | None = None

    OPERATOR_TYPE = "DML_OPERATOR_BATCH_NORMALIZATION"
    FEATURE_LEVEL = FeatureLevel.FL_1_0

    def __post_init__(self):
        coerce_fused_activation(self)

    def inputs(self):
        return [self.input_tensor] + [getattr(self, n) for n in STATISTICS]

    def outputs(self):
        return [self.output_tensor]

    def feature_level(self) -> FeatureLevel:
        level = self.FEATURE_LEVEL
        if self.input_tensor.dimension_count != 4:
            level = FeatureLevel.FL_3_1           # "1 to 8" from 3_1, 4 before
        if not self.spatial and self.input_tensor.dimension_count == 4:
            sizes = self.input_tensor.sizes
            for t in (self.mean_tensor, self.variance_tensor):
                if any(t.sizes[d] != sizes[d] for d in (2, 3)):
                    level = max(level, FeatureLevel.FL_4_0)   # Spatial FALSE: no effect
        return fused_activation_level(self, level)

    def validate(self) -> None:
        names = ["input_tensor"] + list(STATISTICS) + ["output_tensor"]
        for n in names:
            self.check_tensor(n, getattr(self, n), range(1, 9), FLOAT_TYPES)
        self.check_same_type(names)
        self.check_same_rank(names)
        x = self.input_tensor
        if self.output_tensor.sizes != x.sizes:
            self.fail("output_tensor.sizes", "InputTensor and OutputTensor must have the same "
                      f"Sizes, got {x.sizes} and {self.output_tensor.sizes}")
        for n in STATISTICS:
            for d, (s, want) in enumerate(zip(getattr(self, n).sizes, x.sizes)):
                if s not in (1, want):
                    self.fail(f"{n}.sizes[{d}]", "can be 1 (broadcast) but otherwise must "
                              f"equal InputTensor's size {want}, got {s}")
        check_no_overlap(self, "output_tensor", self.output_tensor)
        if not isinstance(self.spatial, (bool, int, np.bool_)) or self.spatial not in (0, 1):
            self.fail("spatial", f"must be a BOOL (True or False), got {self.spatial!r}")
        check_float(self.fail, "epsilon", self.epsilon)
        check_fused_activation(self, clip=False)

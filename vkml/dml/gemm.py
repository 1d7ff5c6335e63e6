"""DML_GEMM_OPERATOR_DESC (``dml-docs/DML_GEMM_OPERATOR_DESC.md``) and DML_MATRIX_TRANSFORM."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from .activations import (ActivationDesc, check_fused_activation, coerce_fused_activation,
                          fused_activation_level)
from .data_type import FLOAT_TYPES
from .operator import FeatureLevel, OperatorDesc, as_real, check_no_overlap, enum_of
from .tensor_desc import TensorDesc

__all__ = ["GemmOperatorDesc", "MatrixTransform"]


class MatrixTransform(enum.IntEnum):
    """``DML_MATRIX_TRANSFORM`` (DirectML's values)."""

    NONE = 0
    TRANSPOSE = 1


@dataclass(frozen=True)
class GemmOperatorDesc(OperatorDesc):
    """``DML_GEMM_OPERATOR_DESC``: ``Output = FusedActivation(Alpha * TransA(A) x
    TransB(B) + Beta * C)``, one product per {BatchCount, ChannelCount} pair.

    Rules (the page):
    * every tensor FLOAT32 or FLOAT16, 2 to 4 dimensions (4 only before
      DML_FEATURE_LEVEL_4_0: :meth:`feature_level`), all of the same DataType and
      DimensionCount;
    * ATensor's Sizes ``{[BatchCount], [ChannelCount], M, K}`` ({K, M} transposed),
      BTensor's ``{..., K, N}`` ({N, K} transposed), OutputTensor's ``{..., M, N}``:
      the batch sizes and K, M, N agree between them (broadcasting is by strides, as
      DirectML's is: a zero stride, never a size of 1 against a larger one);
    * "CTensor and OutputTensor must have the same Sizes" (C optional);
    * ``trans_a``/``trans_b`` a DML_MATRIX_TRANSFORM; ``alpha``/``beta`` FLOATs (any
      value: NaN and infinities propagate as the formula says);
    * ``fused_activation``: None or an activation of the fused-activation page, its
      tensors None (ELEMENT_WISE_CLIP included: fusable "for Convolution and GEMM only");
    * the output's elements must not overlap (its writes would race).
    """

    a_tensor: TensorDesc
    b_tensor: TensorDesc
    c_tensor: TensorDesc | None
    output_tensor: TensorDesc
    trans_a: MatrixTransform = MatrixTransform.NONE
    trans_b: MatrixTransform = MatrixTransform.NONE
    alpha: float = 1.0
    beta: float = 1.0
    fused_activation: ActivationDesc | None = None

    OPERATOR_TYPE = "DML_OPERATOR_GEMM"
    FEATURE_LEVEL = FeatureLevel.FL_1_0

    def __post_init__(self):
        coerce_fused_activation(self)

    def inputs(self):
        return [self.a_tensor, self.b_tensor, self.c_tensor]

    def outputs(self):
        return [self.output_tensor]

    @property
    def transpose_a(self) -> bool:
        return enum_of(MatrixTransform, self.trans_a, self.field("trans_a"),
                       "DML_MATRIX_TRANSFORM_") == MatrixTransform.TRANSPOSE

    @property
    def transpose_b(self) -> bool:
        return enum_of(MatrixTransform, self.trans_b, self.field("trans_b"),
                       "DML_MATRIX_TRANSFORM_") == MatrixTransform.TRANSPOSE

    def mkn(self) -> tuple[int, int, int]:
        """(M, K, N) as ATensor and BTensor give them after their transforms."""
        a, b = self.a_tensor.sizes, self.b_tensor.sizes
        m, k = (a[-1], a[-2]) if self.transpose_a else (a[-2], a[-1])
        n = b[-2] if self.transpose_b else b[-1]
        return m, k, n

    def feature_level(self) -> FeatureLevel:
        level = self.FEATURE_LEVEL
        if self.a_tensor.dimension_count != 4:
            level = FeatureLevel.FL_4_0            # "2 to 4" from 4_0, 4 before
        return fused_activation_level(self, level)

    def validate(self) -> None:
        names = ["a_tensor", "b_tensor", "c_tensor", "output_tensor"]
        for n in names:
            self.check_tensor(n, getattr(self, n), range(2, 5), FLOAT_TYPES,
                              optional=n == "c_tensor")
        self.check_same_type(names)
        self.check_same_rank(names)
        self.transpose_a, self.transpose_b      # noqa: B018  (enum_of raises for a bad one)
        self._validate_sizes()
        check_no_overlap(self, "output_tensor", self.output_tensor)
        for name in ("alpha", "beta"):
            as_real(getattr(self, name), name, self.fail)
        check_fused_activation(self, clip=True)

    def _validate_sizes(self) -> None:
        """The page's Sizes table: {batch..., M, K} x {batch..., K, N} -> {batch..., M, N}."""
        a, b, y = self.a_tensor.sizes, self.b_tensor.sizes, self.output_tensor.sizes
        m, k, n = self.mkn()
        kb = b[-1] if self.transpose_b else b[-2]
        if kb != k:
            self.fail("b_tensor.sizes", f"K must equal ATensor's K ({k}) "
                      f"(BTensor is {{..., K, N}}, {{..., N, K}} transposed), got {b}")
        for d in range(len(y) - 2):
            for name, s in (("a_tensor", a), ("b_tensor", b)):
                if s[d] != y[d]:
                    self.fail(f"{name}.sizes[{d}]", "the batch sizes {BatchCount, "
                              "ChannelCount} must equal OutputTensor's "
                              f"({y[d]}), got {s[d]}")
        if tuple(y[-2:]) != (m, n):
            self.fail("output_tensor.sizes", f"must be {{..., M, N}} = {{..., {m}, {n}}}, "
                      f"got {y}")
        c = self.c_tensor
        if c is not None and c.sizes != y:
            self.fail("c_tensor.sizes", "CTensor and OutputTensor must have the same "
                      f"Sizes, got {c.sizes} and {y}")


"""DML_LP_POOLING_OPERATOR_DESC and DML_LP_POOLING1_OPERATOR_DESC
(``dml-docs/DML_LP_POOLING_OPERATOR_DESC.md``, ``seeds/DML_LP_POOLING1_OPERATOR_DESC.md``)."""
from __future__ import annotations

from dataclasses import dataclass

from .operator import FeatureLevel
from .pooling import DilatedWindowFields, PoolingWindowRules, WindowFields, pooling_output_sizes

__all__ = ["LpPoolingOperatorDesc", "LpPooling1OperatorDesc", "lp_pooling_output_sizes"]


#: The output sizes follow max and average pooling's formula (with dilations).
lp_pooling_output_sizes = pooling_output_sizes


class _LpPoolingRules(PoolingWindowRules):
    """Rules both LP pooling descriptors share (see LpPooling1OperatorDesc)."""

    def validate(self) -> None:
        self.validate_tensors()
        window = self.validate_window()
        self.check_uint("p", 1)     # P >= 1: Y = (X1^P + ... + Xn^P)^(1/P)
        self.validate_sizes(*window)


@dataclass(frozen=True)
class LpPooling1OperatorDesc(_LpPoolingRules, DilatedWindowFields):
    """``DML_LP_POOLING1_OPERATOR_DESC``: ``Y = (|X1|^P + ... + |Xn|^P)^(1/P)`` over each
    (dilated) window.

    Rules (both pages): 4D or 5D input and output of the same DataType (FLOAT32 or
    FLOAT16) and DimensionCount; ``strides``, ``window_size``, ``start_padding``,
    ``end_padding``, ``dilations`` have DimensionCount - 2 entries (2 for 4D, 3 for 5D);
    strides, window sizes and dilations are at least 1; ``p`` is a UINT, at least 1
    (``1/P`` must exist).  N and C are kept and each spatial output size is

        (Input + StartPadding + EndPadding - Dilations * (WindowSize - 1) - 1) / Strides + 1

    The page's formula ``(PaddedSize - WindowSizes[i]) / Strides[i] + 1`` omits the
    dilation; it is the same formula when Dilations are 1, and with dilations vkml uses
    the dilated window's extent as ONNX LpPool and PyTorch pooling do.  The dilated
    window must fit the padded input (at least one output element per dimension).

    Choices where the page is silent: the absolute value of each element is taken (the
    norm's definition, as ONNX LpPool and PyTorch ``lp_pool``'s ``|x|`` do for even P,
    and for odd P where they would produce NaN or a negative base); padding elements are
    zeros and contribute nothing; a window lying wholly in padding gives 0.
    """

    p: int = 2

    OPERATOR_TYPE = "DML_OPERATOR_LP_POOLING1"
    FEATURE_LEVEL = FeatureLevel.FL_6_2


@dataclass(frozen=True)
class LpPoolingOperatorDesc(_LpPoolingRules, WindowFields):
    """``DML_LP_POOLING_OPERATOR_DESC``: LP pooling without dilations (all 1); every other
    rule as :class:`LpPooling1OperatorDesc`, whose output-size formula (the page's) it
    follows exactly."""

    p: int = 2

    OPERATOR_TYPE = "DML_OPERATOR_LP_POOLING"
    FEATURE_LEVEL = FeatureLevel.FL_1_0

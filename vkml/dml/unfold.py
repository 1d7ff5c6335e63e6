"""DML_UNFOLD_OPERATOR_DESC (im2col), from ``dml-docs/DML_UNFOLD_OPERATOR_DESC.md``."""
from __future__ import annotations

from dataclasses import dataclass

from .fold import SlidingWindowDesc
from .operator import FeatureLevel

__all__ = ["UnfoldOperatorDesc"]


@dataclass(frozen=True)
class UnfoldOperatorDesc(SlidingWindowDesc):
    """``DML_UNFOLD_OPERATOR_DESC``: extract sliding local blocks (im2col).

    ``input_tensor`` (N, C, *SpatialSize) -> ``output_tensor``
    (N, C x prod(WindowSizes), BlockCount).  Output row ``c * prod(WindowSizes) + k``
    (window position ``k`` in row-major order) and column ``b`` (block in row-major
    order) hold input element ``b[d] * Strides[d] - StartPadding[d] + k[d] *
    Dilations[d]`` of each spatial dimension, or zero where that falls in the padding
    (as the page's example 2 and ``torch.nn.functional.unfold``).  Rules from the page:

    * DimensionCount, the length of every per-dimension array, is "in the range [1, 6]":
      the input has 3 to 8 dimensions;
    * ``BlocksPerDimension[d] = ((SpatialSize[d] + StartPadding[d] + EndPadding[d] -
      Dilations[d] * (WindowSizes[d] - 1) - 1) / Strides[d]) + 1`` must be at least 1,
      ``output_tensor.sizes = (N, C x prod(WindowSizes), prod(BlocksPerDimension))``;
    * window sizes, strides and dilations are at least 1;
    * the same data type (any of the 11) for input and output.

    The output may have 3 dimensions (the page's examples) or, by the page's "the same
    DimensionCount" constraint, the input's count with leading sizes of 1.  Unfold moves
    data only: every type runs on every device, every bit pattern is kept.
    """

    OPERATOR_TYPE = "DML_OPERATOR_UNFOLD"
    FEATURE_LEVEL = FeatureLevel.FL_6_4
    _image_name = "input_tensor"
    _columns_name = "output_tensor"

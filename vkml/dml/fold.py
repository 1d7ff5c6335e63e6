"""DML_FOLD_OPERATOR_DESC (col2im), from ``seeds/DML_FOLD_OPERATOR_DESC.md``.

The sliding-window rules here are shared with DML_UNFOLD_OPERATOR_DESC
(:mod:`vkml.dml.unfold`), whose page states the same formulas.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .data_type import ALL_TYPES
from .operator import FeatureLevel, OperatorDesc, check_no_overlap, field_tuple
from .tensor_desc import TensorDesc

__all__ = ["FoldOperatorDesc", "blocks_per_dimension"]

#: DimensionCount (spatial dimensions) "must be <= 6" (Fold) / "in the range [1, 6]" (Unfold).
MAX_SPATIAL = 6


def blocks_per_dimension(spatial, window_sizes, strides, dilations, start_padding,
                         end_padding) -> tuple[int, ...]:
    """``BlocksPerDimension[d] = ((SpatialSize[d] + StartPadding[d] + EndPadding[d]
    - Dilations[d] * (WindowSizes[d] - 1) - 1) / Strides[d]) + 1`` (integer division of a
    non-negative numerator; a negative one means the window does not fit: 0 blocks)."""
    out = []
    for s, w, st, dl, a, b in zip(spatial, window_sizes, strides, dilations, start_padding,
                                  end_padding):
        num = s + a + b - dl * (w - 1) - 1
        out.append(num // st + 1 if num >= 0 else 0)
    return tuple(out)


@dataclass(frozen=True)
class SlidingWindowDesc(OperatorDesc):
    """The fields (both pages list the same, in the same order) and rules Fold and Unfold
    share.

    ``image`` is the (N, C, *spatial) side, ``columns`` the (N, C x prod(WindowSizes),
    BlockCount) side; ``_image_name``/``_columns_name`` say which tensor field each is.
    """

    input_tensor: TensorDesc
    output_tensor: TensorDesc
    window_sizes: tuple = ()
    strides: tuple | None = None
    dilations: tuple | None = None
    start_padding: tuple | None = None
    end_padding: tuple | None = None

    _image_name = ""
    _columns_name = ""

    def __post_init__(self):
        rank = None
        img = getattr(self, self._image_name)
        if isinstance(img, TensorDesc):
            rank = img.dimension_count - 2
        set_ = object.__setattr__
        for name, neutral in (("strides", 1), ("dilations", 1), ("start_padding", 0),
                              ("end_padding", 0)):
            v = getattr(self, name)
            if v is None and rank is not None and rank > 0:
                v = (neutral,) * rank      # None: the neutral value (API.md)
            v = field_tuple(v)
            set_(self, name, v)
        v = self.window_sizes
        set_(self, "window_sizes", field_tuple(v))

    def inputs(self):
        return [self.input_tensor]

    def outputs(self):
        return [self.output_tensor]

    @property
    def spatial_count(self) -> int:
        return getattr(self, self._image_name).dimension_count - 2

    @property
    def blocks(self) -> tuple[int, ...]:
        """BlocksPerDimension for each spatial dimension."""
        img = getattr(self, self._image_name)
        return blocks_per_dimension(img.sizes[2:], self.window_sizes, self.strides,
                                    self.dilations, self.start_padding, self.end_padding)

    @property
    def window_count(self) -> int:
        """prod(WindowSizes): the window positions of one channel."""
        return math.prod(self.window_sizes)

    def columns_sizes(self) -> tuple[int, int, int]:
        """(N, C x prod(WindowSizes), BlockCount): the logical columns tensor."""
        cols = getattr(self, self._columns_name)
        return tuple(cols.sizes[-3:])

    def columns_strides(self) -> tuple[int, int, int]:
        cols = getattr(self, self._columns_name)
        return tuple(cols.element_strides[-3:])

    def validate(self) -> None:
        img_name, col_name = self._image_name, self._columns_name
        self.check_tensor("input_tensor", self.input_tensor, range(3, 9), ALL_TYPES)
        self.check_tensor("output_tensor", self.output_tensor, range(3, 9), ALL_TYPES)
        self.check_same_type(["input_tensor", "output_tensor"])
        check_no_overlap(self, "output_tensor", self.output_tensor)
        img, cols = getattr(self, img_name), getattr(self, col_name)
        d = img.dimension_count - 2
        if not 1 <= d <= MAX_SPATIAL:     # rank 3..8 already checked; kept for clarity
            self.fail(f"{img_name}.sizes", f"DimensionCount must be 1 to {MAX_SPATIAL}")
        # The columns tensor is (N, C x prod(WindowSizes), BlockCount): 3 dimensions as in
        # the page's examples, or -- "InputTensor and OutputTensor must have the same
        # DimensionCount" -- the image's DimensionCount with leading sizes of 1.
        if cols.dimension_count not in (3, img.dimension_count):
            self.fail(f"{col_name}.sizes", f"DimensionCount must be 3 (N, C x "
                      f"prod(WindowSizes), BlockCount) or {img.dimension_count} (the same as "
                      f"{img_name}, leading sizes 1), got {cols.dimension_count}")
        for i in range(cols.dimension_count - 3):
            if cols.sizes[i] != 1:
                self.fail(f"{col_name}.sizes[{i}]", "the dimensions before (N, C x "
                          f"prod(WindowSizes), BlockCount) must have size 1, got {cols.sizes[i]}")
        what = f"DimensionCount = {d}, the spatial dimensions of {img_name}"
        for name in ("window_sizes", "strides", "dilations", "start_padding", "end_padding"):
            if not isinstance(getattr(self, name), tuple):
                self.fail(name, f"must be a sequence of {d} UINTs, got {getattr(self, name)!r}")
        window = self.check_uints("window_sizes", self.window_sizes, d, 1, what)
        self.check_uints("strides", self.strides, d, 1, what)
        self.check_uints("dilations", self.dilations, d, 1, what)
        self.check_uints("start_padding", self.start_padding, d, 0, what)
        self.check_uints("end_padding", self.end_padding, d, 0, what)
        blocks = self.blocks
        for i, b in enumerate(blocks):
            if b < 1:
                padded = img.sizes[2 + i] + self.start_padding[i] + self.end_padding[i]
                self.fail(f"window_sizes[{i}]", "the dilated window Dilations[d] * "
                          f"(WindowSizes[d] - 1) + 1 = {self.dilations[i] * (window[i] - 1) + 1} "
                          f"must fit the padded size SpatialSize[d] + StartPadding[d] + "
                          f"EndPadding[d] = {padded} (BlocksPerDimension[{i}] would be < 1)")
        n_img, c = img.sizes[0], img.sizes[1]
        n_col, rows, count = cols.sizes[-3:]
        k = math.prod(window)
        r = cols.dimension_count
        if n_col != n_img:
            self.fail(f"{col_name}.sizes[{r - 3}]", f"the batch size N must equal "
                      f"{img_name}.sizes[0] = {n_img}, got {n_col}")
        if rows != c * k:
            self.fail(f"{col_name}.sizes[{r - 2}]", f"must be C x prod(WindowSizes) = {c} x "
                      f"{k} = {c * k}, got {rows}")
        block_count = math.prod(blocks)
        if count != block_count:
            self.fail(f"{col_name}.sizes[{r - 1}]", "must be BlockCount = prod(BlocksPerDimension)"
                      f" = prod({list(blocks)}) = {block_count}, BlocksPerDimension[d] = "
                      "((SpatialSize[d] + StartPadding[d] + EndPadding[d] - Dilations[d] * "
                      f"(WindowSizes[d] - 1) - 1) / Strides[d]) + 1; got {count}")


@dataclass(frozen=True)
class FoldOperatorDesc(SlidingWindowDesc):
    """``DML_FOLD_OPERATOR_DESC``: sum sliding-window columns back into an image (col2im).

    ``input_tensor`` (N, C x prod(WindowSizes), BlockCount) -> ``output_tensor``
    (N, C, *OutputSize); overlapping values are summed.  Rules from the page:

    * DimensionCount (the length of every per-dimension array) is the output's spatial
      dimension count, 1 to 6 ("must be <= 6"); the output has 3 to 8 dimensions;
    * ``input_tensor.sizes[1] = C x prod(WindowSizes)``, ``input_tensor.sizes[0] = N``;
    * ``BlocksPerDimension[d] = ((OutputSize[d] + StartPadding[d] + EndPadding[d] -
      Dilations[d] * (WindowSizes[d] - 1) - 1) / Strides[d]) + 1`` must be at least 1
      and ``input_tensor.sizes[2] = BlockCount = prod(BlocksPerDimension)``;
    * window sizes, strides and dilations are at least 1;
    * input and output have the same data type (any of the 11).

    The page's examples give a 3-dimensional input with a 4-dimensional output although
    its tensor constraints say "the same DimensionCount": both are accepted, the input as
    3 dimensions or as the output's count with leading sizes of 1.

    Integer sums wrap around modulo 2^bits (two's complement, as NumPy's integer add);
    float16 sums are accumulated in float32 and rounded once.  The summation order is
    fixed (window positions in row-major order), so results are bit-identical run to run.
    """

    OPERATOR_TYPE = "DML_OPERATOR_FOLD"
    FEATURE_LEVEL = FeatureLevel.FL_6_4
    _image_name = "output_tensor"
    _columns_name = "input_tensor"

"""DML_RESAMPLE_OPERATOR_DESC, DML_RESAMPLE1_OPERATOR_DESC (``dml-docs/``) and the older
DML_UPSAMPLE_2D_OPERATOR_DESC (learn.microsoft.com, directml.h), mapped onto resample."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from .data_type import DataType
from .operator import FeatureLevel, InputOutputDesc, as_real, check_no_overlap, enum_of
from .tensor_desc import UINT32_MAX, TensorDesc, as_ints

__all__ = ["InterpolationMode", "ResampleOperatorDesc", "Resample1OperatorDesc", "Size2d",
           "Upsample2dOperatorDesc"]


class InterpolationMode(enum.IntEnum):
    """``DML_INTERPOLATION_MODE``."""

    NEAREST_NEIGHBOR = 0
    LINEAR = 1


@dataclass(frozen=True)
class Size2d:
    """``DML_SIZE_2D``: ``{UINT Width; UINT Height;}`` (UPSAMPLE_2D's ScaleSize)."""

    width: int
    height: int


#: Data types by the feature level that lists them (both resample pages' tables).
_BASE_TYPES = (DataType.FLOAT32, DataType.FLOAT16)
_INT8_TYPES = (DataType.INT8, DataType.UINT8)


class _InterpolationRules(InputOutputDesc):
    """What RESAMPLE, RESAMPLE1 and UPSAMPLE_2D share: one input, one output and an
    ``interpolation_mode``."""

    @property
    def mode(self) -> InterpolationMode:
        return enum_of(InterpolationMode, self.interpolation_mode,
                       self.field("interpolation_mode"), "DML_INTERPOLATION_MODE_")


class _ResampleRules(_InterpolationRules):
    """The rules RESAMPLE and RESAMPLE1 share (see Resample1OperatorDesc)."""

    def feature_level(self) -> FeatureLevel:
        """INT8/UINT8 from 6_2, 1-3 dimensions from 5_1 (the pages' tables)."""
        level = self.FEATURE_LEVEL
        t = self.input_tensor
        if isinstance(t, TensorDesc):
            if t.data_type in _INT8_TYPES:
                level = max(level, FeatureLevel.FL_6_2)
            if t.dimension_count != 4:
                level = max(level, FeatureLevel.FL_5_1)
        return level

    def _reals(self, name: str, n: int, positive: bool) -> tuple[float, ...]:
        """A per-dimension FLOAT array: DimensionCount finite values (> 0 for scales)."""
        values = getattr(self, name)
        if not isinstance(values, tuple):
            self.fail(name, f"must be a sequence of {n} FLOATs, got {values!r}")
        if len(values) != n:
            self.fail(name, f"must have DimensionCount = {n} entries (the tensors' "
                      f"dimension count), got {len(values)}")
        out = []
        for i, v in enumerate(values):
            f = float(as_real(v, f"{name}[{i}]", self.fail))
            f32 = float(np.float32(f)) if math.isfinite(f) and abs(f) < 3.4e38 else math.inf
            if not math.isfinite(f32):
                self.fail(f"{name}[{i}]", f"must be a finite FLOAT, got {v!r}")
            if positive and not f32 > 0:
                self.fail(f"{name}[{i}]", "must be > 0 (scales > 1 scale up, < 1 scale "
                          f"down), got {v!r}")
            out.append(f32)
        return tuple(out)

    def validate(self) -> None:
        types = _BASE_TYPES + _INT8_TYPES
        self.check_tensor("input_tensor", self.input_tensor, range(1, 5), types)
        self.check_tensor("output_tensor", self.output_tensor, range(1, 5), types)
        self.check_same_type(["input_tensor", "output_tensor"])
        self.check_same_rank(["input_tensor", "output_tensor"])
        check_no_overlap(self, "output_tensor", self.output_tensor)
        self.mode  # noqa: B018  (raises for an unknown mode)
        self.geometry()

    def geometry(self) -> tuple[tuple, tuple, tuple]:
        """(scales, input pixel offsets, output pixel offsets) as float32 values."""
        raise NotImplementedError


@dataclass(frozen=True)
class Resample1OperatorDesc(_ResampleRules):
    """``DML_RESAMPLE1_OPERATOR_DESC``: ``OutputX = (InputX + InputPixelOffset) * Scale +
    OutputPixelOffset`` per dimension, so output element o reads input coordinate

        x = (o - OutputPixelOffset) / Scale - InputPixelOffset

    NEAREST_NEIGHBOR takes the element nearest to x; LINEAR the weighted average of the
    2 nearest per dimension (up to 16 for 4 dimensions).

    Rules: InputTensor and OutputTensor have the same DataType and DimensionCount (1 to
    4; FLOAT32, FLOAT16, and INT8/UINT8 from feature level 6_2); ``scales``,
    ``input_pixel_offsets``, ``output_pixel_offsets`` have DimensionCount entries
    (DimensionCount is implied by their lengths); output sizes are free ("the scales
    don't need to be exactly OutputSize / InputSize": coordinates past the input are
    clamped to its edges).  FLOAT fields are float32: each must be finite once rounded
    to float32 and every scale > 0 (the page's up/down-scaling needs a positive scale).

    Choices where the page is silent (see ``vkml.resample`` for the ONNX mapping):
    nearest rounds halves up, index ``floor(x + 0.5)`` (DirectML's own behaviour, as
    ONNX Runtime's DirectML provider documents it, and PyTorch's "nearest-exact");
    linear takes ``x0 = floor(x)``, weight ``x - x0``, both neighbours clamped to
    ``[0, size - 1]``.  INT8/UINT8 linear results are rounded to nearest, ties to even.
    """

    input_tensor: TensorDesc
    output_tensor: TensorDesc
    interpolation_mode: InterpolationMode = InterpolationMode.NEAREST_NEIGHBOR
    scales: tuple = ()
    input_pixel_offsets: tuple = ()
    output_pixel_offsets: tuple = ()

    OPERATOR_TYPE = "DML_OPERATOR_RESAMPLE1"
    FEATURE_LEVEL = FeatureLevel.FL_2_1
    _TUPLE_FIELDS = ("scales", "input_pixel_offsets", "output_pixel_offsets")

    def geometry(self):
        n = self.input_tensor.dimension_count
        return (self._reals("scales", n, True), self._reals("input_pixel_offsets", n, False),
                self._reals("output_pixel_offsets", n, False))


@dataclass(frozen=True)
class ResampleOperatorDesc(_ResampleRules):
    """``DML_RESAMPLE_OPERATOR_DESC``: RESAMPLE1 with InputPixelOffsets 0.5 and
    OutputPixelOffsets -0.5 (pixel centres, RESAMPLE1's remarks); ScaleCount is implied
    by ``scales``' length and must equal the tensors' DimensionCount.  Every other rule
    as :class:`Resample1OperatorDesc`."""

    input_tensor: TensorDesc
    output_tensor: TensorDesc
    interpolation_mode: InterpolationMode = InterpolationMode.NEAREST_NEIGHBOR
    scales: tuple = ()

    OPERATOR_TYPE = "DML_OPERATOR_RESAMPLE"
    FEATURE_LEVEL = FeatureLevel.FL_2_0
    _TUPLE_FIELDS = ("scales",)

    def geometry(self):
        n = self.input_tensor.dimension_count
        return self._reals("scales", n, True), (0.5,) * n, (-0.5,) * n


@dataclass(frozen=True)
class Upsample2dOperatorDesc(_InterpolationRules):
    """``DML_UPSAMPLE_2D_OPERATOR_DESC`` (directml.h; its page is not in dml-docs):
    upsample the last two dimensions (height, width) of a 4D (NCHW) or 5D (NCDHW)
    tensor by the UINT factors ``scale_size``: a :class:`Size2d` or ``(width, height)``
    (``DML_SIZE_2D``'s order).

    Rules: InputTensor and OutputTensor have the same DataType (FLOAT32, FLOAT16) and
    DimensionCount (4 or 5); ``0 < ScaleSize.Height <= UINT_MAX / InputHeight`` and
    ``0 < ScaleSize.Width <= UINT_MAX / InputWidth``; OutputTensor.Sizes is the input's
    with height and width multiplied by them.  NEAREST_NEIGHBOR picks the nearest input
    pixel centre, LINEAR is bilinear over height and width only: it runs as RESAMPLE
    with scales (1, ..., 1, height, width) (pixel centres, offsets 0.5 / -0.5).
    """

    input_tensor: TensorDesc
    output_tensor: TensorDesc
    scale_size: tuple = (1, 1)
    interpolation_mode: InterpolationMode = InterpolationMode.NEAREST_NEIGHBOR

    OPERATOR_TYPE = "DML_OPERATOR_UPSAMPLE_2D"
    FEATURE_LEVEL = FeatureLevel.FL_1_0
    _TUPLE_FIELDS = ("scale_size",)

    def validate(self) -> None:
        self.check_tensor("input_tensor", self.input_tensor, (4, 5), _BASE_TYPES)
        self.check_tensor("output_tensor", self.output_tensor, (4, 5), _BASE_TYPES)
        self.check_same_type(["input_tensor", "output_tensor"])
        self.check_same_rank(["input_tensor", "output_tensor"])
        check_no_overlap(self, "output_tensor", self.output_tensor)
        self.mode  # noqa: B018
        if self.scale_size is None:
            self.fail("scale_size", "is required")
        sw, sh = self._scale_pair()
        sizes = self.input_tensor.sizes
        for name, s, n in (("scale_size.height", sh, sizes[-2]), ("scale_size.width", sw,
                                                                   sizes[-1])):
            if not 0 < s <= UINT32_MAX // n:
                what = "Height" if name.endswith("height") else "Width"
                self.fail(name, f"0 < ScaleSize.{what} <= UINT_MAX / Input{what} must "
                          f"hold, got {s} for Input{what} {n}")
        want = tuple(sizes[:-2]) + (sizes[-2] * sh, sizes[-1] * sw)
        for i, (got, w) in enumerate(zip(self.output_tensor.sizes, want)):
            if got != w:
                self.fail(f"output_tensor.sizes[{i}]", "OutputTensor.Sizes must be the "
                          "input's with Height * ScaleSize.Height and Width * "
                          f"ScaleSize.Width: expected {w}, got {got}")

    def _scale_pair(self) -> tuple[int, int]:
        v = self.scale_size
        if isinstance(v, Size2d):
            v = (v.width, v.height)
        v = as_ints(v, "scale_size", fail=self.fail)
        if len(v) != 2:
            self.fail("scale_size", f"must be (width, height), got {len(v)} values")
        return v

    def geometry(self):
        """RESAMPLE's (scales, input offsets, output offsets): height and width scaled,
        pixel centres."""
        sw, sh = self._scale_pair()
        n = self.input_tensor.dimension_count
        return (1.0,) * (n - 2) + (float(sh), float(sw)), (0.5,) * n, (-0.5,) * n

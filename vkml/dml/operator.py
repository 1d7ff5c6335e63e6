"""What every DML-style operator descriptor shares: feature levels, rule checks, enums.

A descriptor is a frozen dataclass mirroring ``DML_*_OPERATOR_DESC`` (snake_case fields;
``DimensionCount`` is implied by the sequence lengths).  ``validate()`` applies the rules
of the operator's page and raises :class:`~vkml.ValidationError` naming the field, as in
``PaddingOperatorDesc.end_padding[2]: ...``.
"""
from __future__ import annotations

import enum
from dataclasses import fields

from ..errors import ValidationError
from .tensor_desc import TensorDesc


class FeatureLevel(enum.IntEnum):
    """``DML_FEATURE_LEVEL``."""

    FL_1_0 = 0x1000
    FL_2_0 = 0x2000
    FL_2_1 = 0x2100
    FL_3_0 = 0x3000
    FL_3_1 = 0x3100
    FL_4_0 = 0x4000
    FL_4_1 = 0x4100
    FL_5_0 = 0x5000
    FL_5_1 = 0x5100
    FL_5_2 = 0x5200
    FL_6_0 = 0x6000
    FL_6_1 = 0x6100
    FL_6_2 = 0x6200
    FL_6_3 = 0x6300
    FL_6_4 = 0x6400

    def __str__(self) -> str:
        return "DML_FEATURE_LEVEL_" + self.name[3:]


#: The feature level every vkml device implements (Fold, Unfold, WRAP padding: 6_4).
IMPLEMENTED_FEATURE_LEVEL = FeatureLevel.FL_6_4


def enum_of(cls: type[enum.Enum], value, field: str, prefix: str = ""):
    """An enum member from a member, its int value or its name in any case, with or
    without the DirectML prefix (``"reflection"``, ``"DML_PADDING_MODE_REFLECTION"``)."""
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        key = value.upper()
        if prefix and key.startswith(prefix):
            key = key[len(prefix):]
        if key in cls.__members__:
            return cls[key]
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            return cls(value)
        except ValueError:
            pass
    names = ", ".join(m.lower() for m in cls.__members__)
    raise ValidationError(field, f"{value!r} is not one of {names}")


class OperatorDesc:
    """Base of the operator descriptors (the subclasses are frozen dataclasses)."""

    #: ``DML_OPERATOR_TYPE`` name, for messages and DxDispatch model files.
    OPERATOR_TYPE = ""
    #: Feature level that introduced the operator.
    FEATURE_LEVEL = FeatureLevel.FL_1_0

    def inputs(self) -> list[TensorDesc | None]:
        """Input tensor descriptors in binding order (``None``: an absent optional one)."""
        raise NotImplementedError

    def outputs(self) -> list[TensorDesc]:
        raise NotImplementedError

    def feature_level(self) -> FeatureLevel:
        """The lowest DML feature level that has everything this descriptor uses."""
        return self.FEATURE_LEVEL

    def validate(self) -> None:
        raise NotImplementedError

    # -- helpers for subclasses --------------------------------------------------------
    def field(self, name: str) -> str:
        return f"{type(self).__name__}.{name}"

    def fail(self, name: str, rule: str):
        raise ValidationError(self.field(name), rule)

    def check_tensor(self, name: str, t, ranks=None, types=None, optional: bool = False):
        if t is None:
            if optional:
                return
            self.fail(name, "is required")
        if not isinstance(t, TensorDesc):
            self.fail(name, f"must be a TensorDesc, got {type(t).__name__}")
        if ranks is not None and t.dimension_count not in ranks:
            self.fail(f"{name}.sizes", f"DimensionCount must be {_span(ranks)} for "
                      f"{self.OPERATOR_TYPE}, got {t.dimension_count}")
        if types is not None and t.data_type not in types:
            allowed = ", ".join(x.name for x in types)
            self.fail(f"{name}.data_type", f"{t.data_type.name} is not supported by "
                      f"{self.OPERATOR_TYPE} (supported: {allowed})")

    def check_uints(self, name: str, values, count: int, minimum: int = 0,
                    what: str = "") -> tuple[int, ...]:
        """A per-dimension array: ``count`` entries, each a UINT >= ``minimum``."""
        if values is None:
            self.fail(name, "is required")
        if len(values) != count:
            self.fail(name, f"must have {count} entries ({what or 'DimensionCount'}), "
                      f"got {len(values)}")
        for i, v in enumerate(values):
            if not minimum <= v <= 0xFFFFFFFF:
                self.fail(f"{name}[{i}]", f"must be a UINT >= {minimum}, got {v}")
        return tuple(values)

    def check_same_type(self, names: list[str]) -> None:
        tensors = [(n, getattr(self, n)) for n in names if getattr(self, n) is not None]
        first_name, first = tensors[0]
        for n, t in tensors[1:]:
            if t.data_type != first.data_type:
                self.fail(f"{n}.data_type", f"must equal {first_name}.data_type "
                          f"({first.data_type.name}), got {t.data_type.name}")

    def check_same_rank(self, names: list[str]) -> None:
        tensors = [(n, getattr(self, n)) for n in names if getattr(self, n) is not None]
        first_name, first = tensors[0]
        for n, t in tensors[1:]:
            if t.dimension_count != first.dimension_count:
                self.fail(f"{n}.sizes", f"DimensionCount must equal {first_name}'s "
                          f"({first.dimension_count}), got {t.dimension_count}")

    def describe(self) -> dict:
        """The fields as plain Python values (for reports and model files)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v
        return out


def _span(ranks) -> str:
    r = sorted(ranks)
    return f"{r[0]} to {r[-1]}" if r == list(range(r[0], r[-1] + 1)) and len(r) > 1 else \
        " or ".join(map(str, r))


def as_tuple(value, default: int, count: int) -> tuple[int, ...]:
    """A per-dimension argument: ``None`` -> ``count`` copies of ``default``."""
    if value is None:
        return (default,) * count
    if isinstance(value, int):
        return (value,) * count
    return tuple(int(v) for v in value)


def check_no_overlap(desc: OperatorDesc, name: str, t: TensorDesc) -> None:
    """An output's elements must not share addresses (writes would race).

    The test is the usual sufficient one: ordered by stride, every stride exceeds the
    span of the dimensions inside it.
    """
    if t.strides is None:
        return
    dims = sorted((st, s) for s, st in zip(t.sizes, t.strides) if s > 1)
    span = 0
    for st, s in dims:
        if st <= span:
            desc.fail(f"{name}.strides", f"elements of an output tensor must not overlap "
                      f"(strides {t.strides} for sizes {t.sizes})")
        span += (s - 1) * st

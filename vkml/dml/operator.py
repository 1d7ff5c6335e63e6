"""What every DML-style operator descriptor shares: feature levels, rule checks, enums.

A descriptor is a frozen dataclass mirroring ``DML_*_OPERATOR_DESC`` (snake_case fields;
``DimensionCount`` is implied by the sequence lengths).  ``validate()`` applies the rules
of the operator's page and raises :class:`~vkml.ValidationError` naming the field, as in
``PaddingOperatorDesc.end_padding[2]: ...``.
"""
from __future__ import annotations

import enum
import math
import numbers
import operator
from dataclasses import fields

import numpy as np

from ..errors import ArgumentTypeError, ValidationError
from .tensor_desc import UINT32_MAX, TensorDesc, as_int, as_ints, fail_with


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


def enum_of(cls: type[enum.Enum], value, field: str, prefix: str = "", fail=None):
    """An enum member from a member, its int value or its name in any case, with or
    without the DirectML prefix (``"reflection"``, ``"DML_PADDING_MODE_REFLECTION"``).
    Anything but a string or an integer (bools included) raises ArgumentTypeError; an
    unknown name or value, ValidationError."""
    if isinstance(value, cls):
        return value
    names = ", ".join(m.lower() for m in cls.__members__)
    if isinstance(value, str):
        key = value.upper()
        if prefix and key.startswith(prefix):
            key = key[len(prefix):]
        if key in cls.__members__:
            return cls[key]
    else:
        number = as_int(value, field, fail=fail, what=f"one of {names} (or its value)")
        try:
            return cls(number)
        except ValueError:
            pass
    fail_with(field, f"{value!r} is not one of {names}", fail)


def as_uint(value, field: str, minimum: int = 0, maximum: int = UINT32_MAX, fail=None) -> int:
    """A UINT field: an integer (:func:`as_int`) in ``[minimum, maximum]``."""
    v = as_int(value, field, fail=fail)
    if not minimum <= v <= maximum:
        fail_with(field, f"must be a UINT >= {minimum}" + (
            f" and <= {maximum}" if maximum != UINT32_MAX else " (at most 2^32 - 1)")
            + f", got {v}", fail)
    return v


def as_real(value, field: str, fail=None):
    """A FLOAT field or argument: a real number -- int (kept exact: PADDING1's int64
    constants), float, or a NumPy integer/floating scalar; NaN and infinities pass (the
    field's own rules decide).  Strings, None, bools, complex numbers and other objects
    raise ArgumentTypeError: ``float("1.5")`` and ``float(True)`` would succeed, but a
    string or a bool given for a number is a mistake, not a value."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        fail_with(field, f"must be a real number, got {value!r} ({type(value).__name__})",
                  fail, ArgumentTypeError)
    if isinstance(value, numbers.Integral):
        return operator.index(value)
    return float(value)


#: The largest finite FLOAT (float32).
FLT_MAX = float(np.finfo(np.float32).max)


def check_float(fail, name: str, value, allow_inf: bool = False) -> float:
    """A FLOAT field (every descriptor's float parameters): a real number (:func:`as_real`:
    strings, None and bools raise ArgumentTypeError), finite unless ``allow_inf``, never
    NaN, and within float32's range (a larger finite value would reach the kernel as
    infinity).  Returns it as a Python float."""
    v = as_real(value, name, fail)
    if isinstance(v, int) and abs(v) > FLT_MAX:       # float() of a huge int overflows
        fail(name, f"{v} is beyond the range of a FLOAT (float32)")
    v = float(v)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        fail(name, f"must be a finite FLOAT, got {v}")
    if math.isfinite(v) and abs(v) > FLT_MAX:
        fail(name, f"{v!r} is beyond the range of a FLOAT (float32)")
    return v


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

    def check_tensor(self, name: str, t, ranks=None, types=None, optional: bool = False,
                     context: str = ""):
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
                      f"{self.OPERATOR_TYPE}{context} (supported: {allowed})")

    def check_uints(self, name: str, values, count: int, minimum: int = 0,
                    what: str = "") -> tuple[int, ...]:
        """A per-dimension array: ``count`` entries, each a UINT >= ``minimum``
        (types as :func:`as_ints`: integers only, ArgumentTypeError otherwise)."""
        if values is None:
            self.fail(name, "is required")
        values = as_ints(values, name, fail=self.fail)
        if len(values) != count:
            self.fail(name, f"must have {count} entries ({what or 'DimensionCount'}), "
                      f"got {len(values)}")
        for i, v in enumerate(values):
            if not minimum <= v <= UINT32_MAX:
                self.fail(f"{name}[{i}]", f"must be a UINT >= {minimum}, got {v}")
        return values

    def check_uint(self, name: str, minimum: int = 0) -> int:
        """A scalar UINT field (``group_count``, ``p``): an integer >= ``minimum``."""
        return as_uint(getattr(self, name), name, minimum, fail=self.fail)

    def check_same_type(self, names: list[str]) -> None:
        self._check_same(names, "data_type", "data_type", lambda first, want, got:
                         f"must equal {first}.data_type ({want.name}), got {got.name}")

    def check_same_rank(self, names: list[str]) -> None:
        self._check_same(names, "dimension_count", "sizes", lambda first, want, got:
                         f"DimensionCount must equal {first}'s ({want}), got {got}")

    def _check_same(self, names: list[str], attr: str, field: str, rule) -> None:
        """Every present tensor of ``names`` has the first one's ``attr``; ``rule(first
        name, its value, the differing value)`` words the failure on ``<name>.<field>``."""
        tensors = [(n, getattr(self, n)) for n in names if getattr(self, n) is not None]
        first_name, first = tensors[0]
        want = getattr(first, attr)
        for n, t in tensors[1:]:
            if getattr(t, attr) != want:
                self.fail(f"{n}.{field}", rule(first_name, want, getattr(t, attr)))

    def describe(self) -> dict:
        """The fields as plain Python values (for reports and model files)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v
        return out


class InputOutputDesc(OperatorDesc):
    """A descriptor of one input, ``input_tensor``, and one output, ``output_tensor``.
    The per-dimension fields ``_TUPLE_FIELDS`` names are stored as tuples
    (:func:`field_tuple`: a list or array given for one still hashes)."""

    _TUPLE_FIELDS: tuple = ()

    def __post_init__(self):
        for name in self._TUPLE_FIELDS:
            object.__setattr__(self, name, field_tuple(getattr(self, name)))

    def inputs(self):
        return [self.input_tensor]

    def outputs(self):
        return [self.output_tensor]


def _span(ranks) -> str:
    r = sorted(ranks)
    return f"{r[0]} to {r[-1]}" if r == list(range(r[0], r[-1] + 1)) and len(r) > 1 else \
        " or ".join(map(str, r))


def as_tuple(value, default, count: int, field: str = "argument",
             minimum: int = 0) -> tuple[int, ...]:
    """A per-dimension argument of a functional form (``strides``, ``start_padding``, ...):
    ``None`` -> ``count`` copies of ``default``; one integer -> ``count`` copies of it; a
    sequence -> its integers (any length: the descriptor checks the count).

    Integers are what ``operator.index`` accepts (Python ints, NumPy integer scalars, as
    ``numpy.pad`` does); bools, floats (1.5, inf, nan, even 2.0), strings ("0011" is not
    four digits), None entries and nested sequences raise ArgumentTypeError (a TypeError)
    naming the field and entry; values below ``minimum`` or above 2^32 - 1 raise
    ValidationError before any size is computed from them."""
    if value is None:
        if default is None:
            fail_with(field, "is required", None, ArgumentTypeError)
        return (default,) * count
    if isinstance(value, (numbers.Integral, np.integer)) or not _is_sequence(value):
        one = as_uint(value, field, minimum)
        return (one,) * count
    values = as_ints(value, field)
    for i, v in enumerate(values):
        if not minimum <= v <= UINT32_MAX:
            raise ValidationError(f"{field}[{i}]", f"must be a UINT >= {minimum}, got {v}")
    return values


def field_tuple(value):
    """A per-dimension descriptor field as stored: a list or array becomes a tuple (so the
    frozen descriptor hashes); anything else is kept for ``validate`` to name."""
    return tuple(value) if _is_sequence(value) and not isinstance(value, tuple) else value


def _is_sequence(value) -> bool:
    return not isinstance(value, (str, bytes)) and hasattr(value, "__len__") \
        and hasattr(value, "__getitem__")


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

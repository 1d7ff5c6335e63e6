"""Sizes, strides, dilations and paddings across the whole UINT range DML allows.

Padding, Fold, Unfold and LP pooling either compute the right answer or refuse with a
ValidationError naming the field (DeviceError where memory cannot hold the output),
never a wrapped one.  The shared references (``references.py``) index in Python ints
(exact arithmetic) and visit only the window taps that land inside the image, so huge
paddings, strides, dilations and windows cost nothing.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vkml
from references import (PAD_MODES, fold_reference, lp_pooling_reference, pad_reference,
                        unfold_reference, window_counts)
from vkml import dml
from vkml.errors import DeviceError, ValidationError

from helpers import Cases

UINT_MAX = 2**32 - 1
EDGES = [2**31 - 2, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 2, UINT_MAX]
#: Outputs above this many bytes are neither computed nor expected to fail.
SMALL = 1 << 14
#: Outputs above this many bytes cannot be allocated on either CPU driver.
HUGE = 1 << 33


def uints(lo=0):
    """A UINT >= lo, biased to 0..8, the 2^31 and 2^32 edges and their neighbours."""
    return st.one_of(st.integers(max(lo, 0), 8), st.sampled_from(EDGES),
                     st.integers(lo, UINT_MAX))


def small_uints(lo=0):
    return st.one_of(st.integers(max(lo, 0), 4), st.integers(max(lo, 0), 4),
                     st.sampled_from(EDGES))


def _fields(err) -> str:
    return str(err).split(":")[0]


# -- the examples of the task, verbatim -------------------------------------------------
def test_fold_stride_and_padding_2_31(device):
    got = vkml.fold(np.array([[[10., 20.]]], np.float32), [4], [1], strides=[2**31],
                    start_padding=[2**31], device=device)
    np.testing.assert_array_equal(got, [[[20., 0., 0., 0.]]])


def test_unfold_stride_and_padding_2_32_minus_1(device):
    x = np.arange(1, 5, dtype=np.float32).reshape(1, 1, 4)
    got = vkml.unfold(x, [1], strides=[2**32 - 1], start_padding=[2**32 - 1], device=device)
    np.testing.assert_array_equal(got, [[[0., 1.]]])


def test_lp_pooling_huge_window_and_padding(device):
    """A window of 2^31 taps, 2^31 - 2 of them in the padding: only the reachable taps
    run (the rest add nothing)."""
    x = np.arange(1, 17, dtype=np.float32).reshape(1, 1, 4, 4)
    args = ([2**31, 1], [1, 1], [1, 1], [2**31 - 2, 0], [0, 0], 1)
    got = vkml.lp_pooling(x, args[0], strides=args[1], dilations=args[2],
                          start_padding=args[3], end_padding=args[4], p=1, device=device)
    np.testing.assert_allclose(got, lp_pooling_reference(x, *args[:5], p=args[5]), rtol=1e-6)
    assert got.shape == (1, 1, 3, 4)


def test_padding_output_beyond_uint_or_memory(device):
    x = np.zeros(1, np.uint8)
    with pytest.raises(ValidationError, match="sizes"):
        vkml.pad(x, [2**32 - 1], [1], device=device)
    with pytest.raises((DeviceError, ValidationError)):
        vkml.pad(np.zeros(1, np.float64), [2**32 - 2], [0], device=device)
    assert vkml.pad(np.ones(2, np.float32), [1], [1], device=device).tolist() == [0, 1, 1, 0]


def test_padding_huge_stride_on_size_one_dimension(device):
    """A size-1 input dimension padded by edge mode reads coordinate 0 whatever its
    stride (2^32 - 1 here)."""
    x = np.arange(1, 4, dtype=np.float32)
    src = dml.TensorDesc("float32", (1, 3), strides=(UINT_MAX, 1))
    dst = dml.TensorDesc("float32", (3, 5))
    desc = dml.PaddingOperatorDesc(src, dst, dml.PaddingMode.EDGE, 0.0, (1, 1), (1, 1))
    op = device.compile_operator(device.create_operator(desc))
    out = device.empty((3, 5), "float32")
    op.execute([device.tensor(x)], [out])
    np.testing.assert_array_equal(out.numpy(), pad_reference(x[None], (1, 1), (1, 1), "edge"))
    op.release()


def test_unsafe_windows_are_refused_by_field(device):
    """LP pooling whose two outputs reach the input through taps 2^31 apart has no
    equivalent 32-bit window: refused, naming the field."""
    x = np.ones((1, 1, 4, 4), np.float32)
    with pytest.raises(ValidationError, match=r"(start_padding|strides|dilations|"
                                              r"window_size)\[0\]"):
        vkml.lp_pooling(x, [2**31, 1], strides=[2**31, 1], start_padding=[2**31 - 1, 0],
                        end_padding=[2**31, 0], device=device)


# -- whole-range properties ---------------------------------------------------------------
# Each test counts what its examples did (helpers.Cases) and requires a floor of computed
# cases (and, for the window operators, computed cases with a value >= 2^30: the ones a
# wrapped 32-bit index would get wrong); the strategies make those common on purpose.
def _big(values) -> bool:
    return any(v >= 2**30 for v in values)


@st.composite
def padding_cases(draw):
    """Mostly small paddings (computed against the reference); else one padding drawn
    from the whole range (an output refused by size or by memory)."""
    rank = draw(st.integers(1, 3))
    pads = lambda: draw(st.lists(st.integers(0, 8), min_size=rank, max_size=rank))  # noqa
    start, end = pads(), pads()
    if draw(st.integers(0, 2)) == 0:
        side = draw(st.sampled_from([start, end]))
        side[draw(st.integers(0, rank - 1))] = draw(st.one_of(st.sampled_from(EDGES),
                                                              st.integers(2**30, UINT_MAX)))
    return dict(shape=draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)),
                start=start, end=end, mode=draw(st.sampled_from(sorted(PAD_MODES))),
                dtype=draw(st.sampled_from(["uint8", "float32", "int64"])))


def _examples(budget) -> int:
    """Examples a whole-range test draws: the device's budget, and enough on a slow one
    that the floors below stand on more than a handful."""
    return max(budget * 2, 16)


def _settings(budget):
    return settings(max_examples=_examples(budget), deadline=None, derandomize=True,
                    database=None, suppress_health_check=list(HealthCheck))


def _check_too_big(err, nbytes: int, names=()) -> None:
    """An output beyond what a UINT counts or memory holds is refused naming why: a
    DeviceError naming the bytes the output needs, or a ValidationError naming the
    sizes (or, where some value is >= 2^30, a window field by index)."""
    if isinstance(err, DeviceError):
        assert f"needs {nbytes} bytes" in str(err), (nbytes, str(err))
        return
    fields = _fields(err)
    assert "sizes" in fields or any(f"{n}[" in fields for n in names), str(err)


def test_padding_whole_range(device, budget):
    cases = Cases()

    @_settings(budget)
    @given(padding_cases())
    def check(case):
        x = np.arange(1, math.prod(case["shape"]) + 1).reshape(case["shape"]).astype(
            case["dtype"])
        out = [s + a + b for s, a, b in zip(case["shape"], case["start"], case["end"])]
        nbytes = math.prod(out) * x.itemsize
        call = lambda: vkml.pad(x, case["start"], case["end"], case["mode"], device=device)
        if max(out) > UINT_MAX or math.prod(out) > UINT_MAX:
            with pytest.raises(ValidationError, match="sizes"):
                call()
            return cases.add("refused")
        if nbytes > HUGE:
            with pytest.raises((DeviceError, ValidationError)) as err:
                call()
            _check_too_big(err.value, nbytes)
            return cases.add("too_big")
        if nbytes > SMALL:
            return cases.add("not_computed")
        want = pad_reference(x, case["start"], case["end"], case["mode"])
        np.testing.assert_array_equal(call(), want)
        cases.add("ran")

    check()
    n = _examples(budget)
    cases.require(ran=n // 3, refused__too_big=n // 8)


@st.composite
def window_cases(draw, lp=False):
    d = draw(st.integers(2, 2) if lp else st.integers(1, 2))
    lists = lambda s: st.lists(s, min_size=d, max_size=d)
    case = dict(spatial=draw(lists(st.integers(1, 4))),
                window=draw(lists(uints(1) if lp else st.integers(1, 3))),
                strides=draw(lists(uints(1))), dilations=draw(lists(uints(1))),
                start=draw(lists(uints())), end=draw(lists(small_uints())),
                p=draw(st.integers(1, 3)))
    for i in range(d):        # mostly windows that fit, with 1-4 outputs along the axis
        if not draw(st.integers(0, 4)):
            continue
        _fit(case, i, draw(st.integers(1, 4)), draw(st.integers(0, 2)))
    return case


def _fit(case, i: int, want: int, extra: int) -> None:
    """Paddings along axis ``i`` that give ``want`` outputs (one where the strides
    cannot), keeping the drawn start padding where it fits: the padded extent is the
    window's span plus ``want - 1`` strides (plus ``extra``, less than a stride)."""
    if case["dilations"][i] * (case["window"][i] - 1) + 1 > 2 * UINT_MAX:
        case["dilations"][i] = 1                  # (no padding reaches this span)
    span = case["dilations"][i] * (case["window"][i] - 1) + 1
    stride = case["strides"][i]
    if span + (want - 1) * stride > 2 * UINT_MAX:
        want = 1
    pad = max(0, span + (want - 1) * stride + extra % stride - case["spatial"][i])
    start = min(case["start"][i], pad)
    case["start"][i], case["end"][i] = start, pad - start
    if pad - start > UINT_MAX:
        case["start"][i], case["end"][i] = pad - UINT_MAX, UINT_MAX


def _geometry(case):
    return (case["window"], case["strides"], case["dilations"], case["start"], case["end"])


def _small(case) -> bool:
    """Every value below 2^30: nothing to reduce, so nothing may be refused."""
    return not _big(itertools.chain(*_geometry(case)))


def _check_refusal(err, case, names):
    assert not _small(case), err
    assert any(f"{n}[" in _fields(err) for n in names), err


def _ran(cases, case) -> None:
    cases.add("ran" if _small(case) else "ran_big")


def _window_floor(cases, budget) -> None:
    """Computed cases: a quarter of the examples, and some with a value >= 2^30."""
    n = _examples(budget)
    cases.require(ran__ran_big=n // 4, ran_big=max(1, n // 16))


def test_fold_whole_range(device, budget):
    cases = Cases()

    @_settings(budget)
    @given(window_cases())
    def check(case):
        blocks = window_counts(case["spatial"], *_geometry(case))
        k = math.prod(case["window"])
        fold = lambda cols: vkml.fold(cols, case["spatial"], case["window"],
                                      strides=case["strides"], dilations=case["dilations"],
                                      start_padding=case["start"], end_padding=case["end"],
                                      device=device)
        if min(blocks) < 1:
            with pytest.raises(ValidationError, match="window_sizes|sizes"):
                fold(np.zeros((1, k, 1), np.float32))
            return cases.add("invalid")
        count = math.prod(blocks)
        if count * k > 256:
            return cases.add("not_computed")
        cols = np.arange(1, k * count + 1, dtype=np.float32).reshape(1, k, count)
        try:
            got = fold(cols)
        except ValidationError as err:
            _check_refusal(err, case, ("start_padding", "strides", "dilations"))
            return cases.add("refused")
        want = fold_reference(cols, case["spatial"], *_geometry(case))
        np.testing.assert_allclose(got, want, rtol=1e-6)
        _ran(cases, case)

    check()
    _window_floor(cases, budget)


def test_unfold_whole_range(device, budget):
    cases = Cases()

    @_settings(budget)
    @given(window_cases())
    def check(case):
        x = np.arange(1, math.prod(case["spatial"]) + 1, dtype=np.float32).reshape(
            [1, 1] + case["spatial"])
        blocks = window_counts(case["spatial"], *_geometry(case))
        unfold = lambda: vkml.unfold(x, case["window"], strides=case["strides"],
                                     dilations=case["dilations"], start_padding=case["start"],
                                     end_padding=case["end"], device=device)
        if min(blocks) < 1:
            with pytest.raises(ValidationError, match="window_sizes|sizes"):
                unfold()
            return cases.add("invalid")
        nbytes = math.prod(blocks) * math.prod(case["window"]) * 4
        if math.prod(blocks) > UINT_MAX or nbytes > HUGE:
            with pytest.raises((DeviceError, ValidationError)) as err:
                unfold()
            _check_too_big(err.value, nbytes, ("start_padding", "strides", "dilations"))
            return cases.add("too_big")
        if nbytes > SMALL:
            return cases.add("not_computed")
        try:
            got = unfold()
        except ValidationError as err:
            _check_refusal(err, case, ("start_padding", "strides", "dilations"))
            return cases.add("refused")
        np.testing.assert_array_equal(got, unfold_reference(x, *_geometry(case)))
        _ran(cases, case)

    check()
    _window_floor(cases, budget)


def test_lp_pooling_whole_range(device, budget):
    cases = Cases()

    @_settings(budget)
    @given(window_cases(lp=True))
    def check(case):
        x = (np.arange(math.prod(case["spatial"]), dtype=np.float32) % 5 - 2).reshape(
            [1, 1] + case["spatial"])
        out = window_counts(case["spatial"], *_geometry(case))
        lp = lambda: vkml.lp_pooling(x, case["window"], strides=case["strides"],
                                     dilations=case["dilations"], start_padding=case["start"],
                                     end_padding=case["end"], p=case["p"], device=device)
        if min(out) < 1:
            with pytest.raises(ValidationError, match="window_size|sizes"):
                lp()
            return cases.add("invalid")
        nbytes = math.prod(out) * 4
        if math.prod(out) > UINT_MAX or nbytes > HUGE:
            with pytest.raises((DeviceError, ValidationError)) as err:
                lp()
            _check_too_big(err.value, nbytes,
                           ("start_padding", "strides", "dilations", "window_size"))
            return cases.add("too_big")
        if nbytes > SMALL:
            return cases.add("not_computed")
        try:
            got = lp()
        except ValidationError as err:
            _check_refusal(err, case, ("start_padding", "strides", "dilations", "window_size"))
            return cases.add("refused")
        want = lp_pooling_reference(x, *_geometry(case), p=case["p"])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30)
        _ran(cases, case)

    check()
    _window_floor(cases, budget)

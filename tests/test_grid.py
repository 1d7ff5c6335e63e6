"""vkml/ops/grid.py: grid splitting, window planning and aligned bindings.

Pure-Python properties (hypothesis): every element of a box is covered exactly once, and
every piece fits the limits; then the operators on both drivers with lowered
``maxComputeWorkGroupCount`` / ``maxStorageBufferRange``, against NumPy.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vkml
from references import fold_reference, lp_pooling_reference, pad_reference, unfold_reference
from vkml.ops.grid import (GRID_LIMIT, TURNS_SLACK, binding_window, box_grid, div_magic,
                           grid_cap, per_workgroup,
                           pick_xdims, plan_windows, split_groups, strided_span, vector_width)
from vkml.intmath import ceil_div

FAST = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


def _cells(origin, extent):
    return itertools.product(*[range(o, o + e) for o, e in zip(origin, extent)])


@st.composite
def boxes(draw):
    rank = draw(st.integers(1, 5))
    extent = draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank))
    origin = draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank))
    return origin, extent


@pytest.mark.floor(ran=100)
@FAST
@given(boxes(), st.sampled_from([1, 2, 8, 64]), st.tuples(*[st.integers(1, 5)] * 3),
       st.sampled_from([1, 4, 8]), st.integers(1, 3), st.booleans(), st.integers(0, 3))
def test_split_groups_covers_once_within_limits(cases, box, local, max_groups, v, ly, magic,
                                                xd):
    origin, extent = box
    xdims = max(1, min(len(extent), xd or pick_xdims(extent, local)))
    v = v if xdims == 1 else 1
    pieces = split_groups(origin, extent, local, max_groups, xdims, v, ly, magic)
    seen = [c for o, e in pieces for c in _cells(o, e)]
    assert sorted(seen) == sorted(_cells(origin, extent))       # each cell exactly once
    for o, e in pieces:
        gx, gy, gz = box_grid(e, local, xdims, v, ly)
        assert gx <= max_groups[0] and gy <= max_groups[1] and gz <= max_groups[2]
        if xdims == 1 and o[-1] != origin[-1]:
            assert (o[-1] - origin[-1]) % v == 0      # vector pieces stay aligned
    cases.add("ran")


def test_split_groups_caps_divided_coordinates_below_grid_limit():
    """z (and a multi-dimension x) is divided by div_magic multiply-highs, exact below
    2^16 only: a device reporting 2^20 workgroups still gets z below 2^16."""
    big = (1 << 20, 1 << 20, 1 << 20)
    for o, e in split_groups([0, 0, 0, 0], [300, 300, 2, 8], 8, big, 1):
        assert box_grid(e, 8, 1)[2] < GRID_LIMIT
    for o, e in split_groups([0, 0], [2, 1 << 17], 64, big, 2):
        assert math.prod(e) < GRID_LIMIT
    # without division (the padding element kernel) only the device's limits apply
    assert len(split_groups([0, 0, 0, 0], [300, 300, 2, 8], 8, big, 1, magic=False)) == 1


def test_grid_cap_is_the_least_count_and_65535():
    """Every device takes 65535 workgroups an axis and the multiply-high divisions are
    exact below it: the cap never exceeds it, nor any count given."""
    assert grid_cap(1 << 31) == grid_cap(1 << 31, 70000) == GRID_LIMIT - 1 == 65535
    assert grid_cap(65535, 100) == grid_cap(100) == 100


@pytest.mark.floor(ran=100)
@FAST
@given(st.integers(0, GRID_LIMIT - 1), st.integers(1, GRID_LIMIT - 1))
def test_div_magic_exact_below_grid_limit(cases, z, e):
    q = z if e == 1 else (z * div_magic(e)) >> 32
    assert q == z // e
    cases.add("ran")


@pytest.mark.floor(ran=100)
@FAST
@given(boxes(), st.integers(1, 5), st.integers(8, 200))
def test_plan_windows_covers_once_within_room(cases, box, esize, room):
    _, extent = box
    strides = [math.prod(extent[i + 1:]) for i in range(len(extent))]
    span = lambda o, e: strided_span(o, e, strides)
    if esize > room:
        with pytest.raises(vkml.UnsupportedError):
            plan_windows(extent, span, span, esize, esize, room)
        return cases.add("refused")
    windows = plan_windows(extent, span, span, esize, esize, room)
    seen = [c for o, e, *_ in windows for c in _cells(o, e)]
    assert sorted(seen) == sorted(_cells([0] * len(extent), extent))
    for o, e, ilo, ihi, olo, ohi in windows:
        assert (ihi - ilo) * esize <= room and (ohi - olo) * esize <= room
        flat = [sum(c * s for c, s in zip(cell, strides)) for cell in _cells(o, e)]
        assert olo == min(flat) and ohi == max(flat) + 1
    cases.add("ran")


@pytest.mark.floor(ran=100)
@FAST
@given(st.integers(0, 1 << 20), st.integers(1, 1 << 12), st.sampled_from([4, 16, 64, 256]),
       st.integers(0, 64))
def test_binding_window_aligned_and_covering(cases, lo, length, align, slack):
    hi = lo + length
    size = ceil_div(hi, 4) * 4 + slack
    off, n = binding_window(lo, hi, size, align)
    assert off % align == 0 and off <= lo and off + n >= hi and off + n <= size
    assert n % 4 == 0 or off + n == size
    cases.add("ran")


def test_vector_width():
    assert [vector_width([n], 8) for n in (1, 3, 4, 7, 8, 100)] == [1, 1, 4, 4, 8, 8]
    assert vector_width([100], 4) == 4 and vector_width([100], 1) == 1


# -- the operators at lowered limits, both drivers ------------------------------------------
def _lowered(device, groups=(3, 2, 2), range_=4096):
    return vkml.Device(device.index, limits={"maxComputeWorkGroupCount": groups,
                                             "maxStorageBufferRange": range_})


@pytest.mark.parametrize("mode", ["constant", "reflection", "symmetric", "wrap"])
def test_padding_at_lowered_limits(device, mode):
    dev = _lowered(device)
    x = np.arange(3 * 7 * 40, dtype=np.float32).reshape(3, 7, 40)
    got = vkml.pad(x, [1, 2, 5], [2, 3, 50], mode, device=dev)
    np.testing.assert_array_equal(got, pad_reference(x, [1, 2, 5], [2, 3, 50], mode))


def test_fold_unfold_at_lowered_limits(device):
    dev = _lowered(device)
    x = np.arange(2 * 3 * 12 * 11, dtype=np.float32).reshape(2, 3, 12, 11)
    args = dict(strides=[2, 1], dilations=[1, 2], start_padding=[1, 2], end_padding=[2, 1])
    cols = vkml.unfold(x, [3, 2], device=dev, **args)
    geometry = ([3, 2], [2, 1], [1, 2], [1, 2], [2, 1])
    np.testing.assert_array_equal(cols, unfold_reference(x, *geometry))
    got = vkml.fold(cols, [12, 11], [3, 2], device=dev, **args)
    np.testing.assert_allclose(got, fold_reference(cols, [12, 11], *geometry), rtol=1e-6)


def test_lp_pooling_at_lowered_limits(device):
    dev = _lowered(device)
    x = np.random.default_rng(0).standard_normal((2, 3, 14, 30)).astype(np.float32)
    got = vkml.lp_pooling(x, [3, 2], strides=[1, 2], start_padding=[1, 0],
                          end_padding=[1, 1], p=2, device=dev)
    want = lp_pooling_reference(x, [3, 2], [1, 2], None, [1, 0], [1, 1], p=2)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _turns(units, c, others, width):
    return ceil_div(others * ceil_div(units, c), max(width, 1)) * c


@pytest.mark.parametrize("units, most, others, width, expected", [
    (9, 8, 33, 2, 3),      # 144 channels in blocks of 16 at 56x56: 3 a workgroup, not 8 + 1
    (4, 8, 3, 2, 2),       # 3 pixel blocks of a 14x14 map: 6 workgroups of 2, not 3 of 4
    (4, 8, 1000, 2, 4),    # a long grid: the whole 4
    (9, 8, 1, 0, 3),       # width unknown: no short last workgroup
    (20, 8, 1, 2, 5),      # 4 workgroups of 5, two turns each, not 3 of 8 (8, 8, 4)
    (3, 8, 1, 64, 1),      # a wide device: one piece a workgroup
    (1, 8, 5, 2, 1),
    (5, 1, 7, 2, 1),
])
def test_per_workgroup_examples(units, most, others, width, expected):
    assert per_workgroup(units, most, others, width) == expected


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 200), st.integers(1, 16), st.integers(1, 300), st.integers(0, 300))
def test_per_workgroup_fewest_turns_then_most_pieces(units, most, others, width):
    """The count is allowed, within the slack of the fewest turns of any allowed count,
    and no larger count is."""
    c = per_workgroup(units, most, others, width)
    allowed = range(1, max(1, min(most, units)) + 1)
    assert c in allowed
    least = min(_turns(units, k, others, width) for k in allowed)
    assert _turns(units, c, others, width) <= least * (1 + TURNS_SLACK)
    assert all(_turns(units, k, others, width) > least * (1 + TURNS_SLACK)
               for k in allowed if k > c)

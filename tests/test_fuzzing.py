"""The fuzzers' own contract (tests/fuzzing.py): a run whose first batch of examples left
the valid-case floor unmet draws fresh batches, up to TOP_UPS, and passes once the floor
is met; a strategy that stays short still fails, with its counts."""
from __future__ import annotations

import pytest
from hypothesis import strategies as st

import fuzzing
from fuzzing import count, fuzzer

#: Examples a batch draws (VKML_FUZZ_EXAMPLES with share 1)
BATCH = 10


def test_a_short_batch_is_topped_up(monkeypatch):
    """The first batch counts no valid case, the examples after it do: the run draws more
    and passes."""
    monkeypatch.setenv("VKML_FUZZ_EXAMPLES", str(BATCH))
    seen = []

    @fuzzer(1.0, st.integers(0, 10 ** 9), share=1, refused=0.0)
    def check(x):
        seen.append(x)
        count("valid" if len(seen) > BATCH else "refused")
    check()
    assert len(seen) > BATCH


def test_a_drifting_strategy_still_fails(monkeypatch):
    """A strategy whose cases are all refused stays short after every top-up: the run
    fails naming the counts, having drawn more than its first batch."""
    monkeypatch.setenv("VKML_FUZZ_EXAMPLES", str(BATCH))
    seen = []

    @fuzzer(1.0, st.integers(0, 10 ** 9), share=1, refused=0.0)
    def check(x):
        seen.append(x)
        count("refused")
    with pytest.raises(AssertionError, match="of kind 'valid'"):
        check()
    assert len(seen) > fuzzing.TOP_UPS * BATCH // 2

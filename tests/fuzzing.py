"""Shared pieces of the fuzzers (tests/test_fuzz_*.py): hypothesis draws descriptors,
valid and invalid (shapes, paddings, modes, data types, tensor strides); an independent
checker in each fuzzer decides whether the case is valid; valid ones must equal the
reference (tests/references.py), invalid ones must raise ValidationError, and nothing may
touch memory outside the output (canary bytes after every bound buffer, in the gaps of a
non-packed output) or change the input.  ``VKML_FUZZ_EXAMPLES`` sets the number of
examples per operator and device (default 200 on a fast device, 50 on a slow one).
Each fuzzer runs its examples inside :func:`real_cases`, which counts the valid cases
computed and the invalid ones refused (:func:`compiled_or_refused` counts them) and fails
the test unless both reached their floor: a strategy that drifts to nearly all-invalid
(or all-valid) cases would otherwise still pass.
"""
from __future__ import annotations

import contextlib
import functools
import os

import numpy as np
from hypothesis import given, HealthCheck, settings
from hypothesis import strategies as st

from vkml.errors import UnsupportedError, ValidationError

from helpers import Cases, random_bits, slow

CANARY = 0xA5


def fuzz_examples(speed: float) -> int:
    default = 50 if slow(speed) else 200
    return int(os.environ.get("VKML_FUZZ_EXAMPLES", default))


def fuzz_settings(speed: float):
    """The hypothesis settings of every fuzzer: ``fuzz_examples`` cases, no deadline, no
    example database, no health checks (the device's speed varies)."""
    return settings(max_examples=fuzz_examples(speed), deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


#: The fewest examples of a fuzzer run that must count a refused (broken) case.
REFUSED_FROM = 20


#: Batches of fresh examples a fuzzer draws more where its first left a floor unmet:
#: hypothesis's draws are no fixed mix of the strategy's choices (a 25-example run of the
#: identity fuzzer once drew 21 broken cases and 4 valid ones, against 10 "none" among 16
#: choices), while a strategy that drifted to nearly all-invalid cases stays short.
TOP_UPS = 3


def fuzzer(speed: float, cases, share: int = 4, valid: float = 0.25, refused: float = 0.05):
    """The decorator of a fuzzer's inner check: ``cases`` drawn with :func:`fuzz_settings`
    and a ``share``-th of :func:`fuzz_examples` (at least 10): the operators whose
    pipelines are many and slow to compile draw fewer.  The contract of a check: a valid
    descriptor's result equals the reference with every canary intact; an invalid one
    (one broken rule at a time) raises ValidationError naming the field.  Calling the
    decorated check runs it and then requires that at least ``valid`` of the examples
    drawn were valid cases computed and ``refused`` of them (at least one, from
    :data:`REFUSED_FROM` examples on) refused, as :func:`count` (which
    :func:`compiled_or_refused` calls) counted them; where a floor is unmet it draws up
    to :data:`TOP_UPS` batches more, every example checked, the floors those of one
    batch."""
    def deco(check):
        drawn = max(10, fuzz_examples(speed) // share)
        run = settings(fuzz_settings(speed), max_examples=drawn)(given(cases)(check))

        @functools.wraps(check)
        def counted():
            with _floor(drawn, valid, refused) as found:
                top_up(run, lambda: found.short(**_floors(drawn, valid, refused)))
        return counted
    return deco


def top_up(run, short) -> None:
    """``run()``, then again while ``short()`` (a floor of cases unmet), at most
    :data:`TOP_UPS` times more: fresh batches of examples, every one checked."""
    run()
    for _ in range(TOP_UPS):
        if not short():
            break
        run()


_COUNTING: list[Cases] = []


def count(kind: str) -> None:
    """Count one example of the running fuzzer as ``kind`` ("valid": computed and
    compared; "refused": an invalid case refused by name; "unsupported")."""
    if _COUNTING:
        _COUNTING[-1].add(kind)


@contextlib.contextmanager
def _floor(examples: int, valid: float, refused: float):
    cases = Cases()
    _COUNTING.append(cases)
    try:
        yield cases
    finally:
        _COUNTING.pop()
    cases.require(**_floors(examples, valid, refused))


def _floors(examples: int, valid: float, refused: float) -> dict:
    """The counts :func:`_floor` requires of ``examples`` drawn.  Hypothesis favours
    simple draws (a mutation list's first entry, "none"), so a dozen examples (a slow
    device's share) may hold no broken case, fifty only one: one refused case is
    required, from REFUSED_FROM examples on.  Refusals are host-side validation, the same
    on every device, and the fast device's run counts them."""
    return dict(valid=int(examples * valid),
                refused=1 if examples >= REFUSED_FROM and refused else 0)


def real_cases(speed: float, valid: float = 0.25, refused: float = 0.05):
    """Around a fuzzer's ``check()`` drawn with :func:`fuzz_settings`: at least ``valid``
    of its examples must have been valid cases computed against the reference and
    ``refused`` of them invalid cases refused (fractions of :func:`fuzz_examples`);
    :func:`fuzzer` does this itself."""
    return _floor(fuzz_examples(speed), valid, refused)


def bind_with_canary(device, nbytes: int, data: np.ndarray | None = None):
    """A tensor of ``nbytes`` (or the data's size, rounded to 4) followed by 64 canary bytes."""
    size = (max(nbytes, data.nbytes if data is not None else 0) + 3) & ~3
    raw = np.full(size + 64, CANARY, dtype=np.uint8)
    if data is not None:
        raw[:data.nbytes] = data.reshape(-1).view(np.uint8)
    t = device.tensor(raw)
    t.nbytes = size            # bind only the tensor's bytes; the canaries sit after them
    return t


def execute_into_canaries(device, compiled, desc, ins: list):
    """Run ``compiled`` (then release it) from ``ins`` into a fresh output bound with
    canaries (:func:`bind_with_canary`): returns the output tensor."""
    dst = bind_with_canary(device, desc.output_tensor.total_tensor_size_in_bytes)
    compiled.execute(ins, [dst])
    compiled.release()
    return dst


def run_checked(device, compiled, desc, buffers: list, read):
    """Run ``compiled`` (then release it) with each input of ``desc`` bound from its flat
    buffer (``None``: an absent optional input) between canaries; check that nothing was
    written outside a tensor or into the output's gaps, and return the output as ``read``
    (:func:`padded_output`) gives it."""
    ins = [None if t is None else bind_with_canary(device, t.total_tensor_size_in_bytes, b)
           for t, b in zip(desc.inputs(), buffers)]
    dst = execute_into_canaries(device, compiled, desc, ins)
    got, gaps_intact = read(dst)
    assert gaps_intact, "wrote into the gaps of a non-packed output"
    assert all(canaries_intact(t) for t in ins + [dst] if t is not None), \
        "wrote outside a tensor"
    return got


def execute_with_canaries(device, compiled, desc, flat: np.ndarray):
    """Run ``compiled`` (then release it) from ``flat`` into a fresh output, both bound
    with canaries (:func:`bind_with_canary`): returns the input and output tensors."""
    src = bind_with_canary(device, desc.input_tensor.total_tensor_size_in_bytes, flat)
    return src, execute_into_canaries(device, compiled, desc, [src])


def canaries_intact(t) -> bool:
    raw = t.read_bytes(t.nbytes + 64)
    return bool(np.all(raw[t.nbytes:] == CANARY))


def compiled_or_refused(device, make_desc, want: list, may_be_unsupported=False):
    """(desc, compiled operator) for a case the independent checker calls valid (``want``
    empty), or (None, None) after checking that an invalid case was refused with a
    ValidationError naming one of the ``want`` fields (or, where ``may_be_unsupported``,
    refused with UnsupportedError)."""
    try:
        desc = make_desc()
        compiled = device.compile_operator(device.create_operator(desc))
    except ValidationError as err:
        assert want, f"valid case refused: {err}"
        assert any(f in str(err) for f in want), f"expected one of {want}, got {err}"
        count("refused")
        return None, None
    except UnsupportedError as err:
        assert not want and may_be_unsupported, str(err)
        count("unsupported")
        return None, None
    assert not want, f"invalid case accepted ({want})"
    count("valid")
    return desc, compiled


LAYOUTS = ["packed"] * 3 + ["padded", "permuted", "broadcast"]

#: The TensorDesc rules a fuzzer breaks on one tensor -> the field a ValidationError names.
TENSOR_BROKEN = {"rank9": ["TensorDesc.sizes"], "total_size": ["total_tensor_size_in_bytes"],
                 "strides_count": ["TensorDesc.strides"]}


def overlapping_strides(shape, strides):
    """``strides`` (None: packed) with the first dimension of more than one element given
    stride 0, so the tensor's elements overlap (an output must not); None when no
    dimension has more than one element (nothing to break)."""
    big = [d for d, n in enumerate(shape) if n > 1]
    if not big:
        return None
    out = list(strides or [int(np.prod(shape[i + 1:])) for i in range(len(shape))])
    out[big[0]] = 0
    return out


def break_tensor_rule(broken: str, sizes, strides):
    """``(sizes, strides, total_tensor_size_in_bytes)`` of one tensor with the rule
    ``broken`` of :data:`TENSOR_BROKEN` broken (nine dimensions; a total below
    DMLCalcBufferTensorSize, a multiple of 4; one stride too many); any other ``broken``
    leaves the tensor as it is (total None)."""
    rank = len(sizes)
    if broken == "rank9":
        return [1] * (9 - rank) + list(sizes), None, None
    if broken == "total_size":
        return list(sizes), strides, 2
    if broken == "strides_count":
        return list(sizes), tuple(strides or (1,) * rank) + (1,), None
    return list(sizes), strides, None


def placement(draw, inputs: int) -> dict:
    """Draws shared by the fuzzers of several inputs: each input's ``layouts`` (for
    :func:`lay_out`), ``out_padded`` (for :func:`padded_output`) and the values' ``seed``."""
    return dict(layouts=draw(st.lists(st.sampled_from(LAYOUTS), min_size=inputs,
                                      max_size=inputs)),
                out_padded=draw(st.booleans()), seed=draw(st.integers(0, 2**31)))


def lay_out(rng, logical: np.ndarray, kind: str):
    """``logical`` stored in a non-packed layout: (flat buffer, DML element strides or
    None, the logical array those describe).  "padded" fills the gaps with NaN (floats)
    or random bits, so a kernel that reads them gives a wrong answer; "broadcast" makes
    one dimension a stride-0 repeat (the logical array changes accordingly)."""
    dt, shape, rank = logical.dtype, logical.shape, logical.ndim
    if kind == "packed" or rank == 0:
        return logical.reshape(-1), None, logical
    if kind == "padded":
        phys = [n + int(rng.integers(0, 3)) for n in shape]
        buf = np.full(phys, np.nan, dt) if dt.kind == "f" else random_bits(rng, phys, dt)
        buf[tuple(slice(0, n) for n in shape)] = logical
        return buf.reshape(-1), tuple(st // dt.itemsize for st in buf.strides), logical
    if kind == "permuted":
        perm = rng.permutation(rank)
        buf = np.ascontiguousarray(logical.transpose(perm))
        view = buf.transpose(np.argsort(perm))
        return buf.reshape(-1), tuple(st // dt.itemsize for st in view.strides), logical
    d = int(rng.integers(0, rank))
    small = np.ascontiguousarray(logical[(slice(None),) * d + (slice(0, 1),)])
    strides = [st // dt.itemsize for st in small.strides]
    strides[d] = 0
    return small.reshape(-1), tuple(strides), np.broadcast_to(small, shape).copy()


def padded_output(rng, shape, dtype, padded: bool):
    """Element strides of an output stored with gaps (or None), and a reader returning
    (logical result, whether every byte outside it is still the canary)."""
    dt = np.dtype(dtype)
    if not padded:
        return None, lambda t: (t.read_bytes(int(np.prod(shape)) * dt.itemsize).view(dt)
                                .reshape(shape), True)
    phys = [n + int(rng.integers(0, 3)) for n in shape]
    strides = tuple(int(np.prod(phys[i + 1:])) for i in range(len(phys)))

    def read(t):
        count = sum((n - 1) * st for n, st in zip(shape, strides)) + 1
        raw = t.read_bytes(count * dt.itemsize)
        got = np.lib.stride_tricks.as_strided(raw.view(dt), shape,
                                              [st * dt.itemsize for st in strides]).copy()
        mask = np.ones(count, bool)
        mask[np.ravel_multi_index(np.indices(shape).reshape(len(shape), -1), phys)] = False
        gaps = raw.reshape(count, dt.itemsize)[mask]
        return got, bool(np.all(gaps == CANARY))
    return strides, read


def window_geometry(draw, d: int) -> dict:
    """A window operator's ``spatial``, ``window``, ``strides``, ``dilations``, ``start``
    and ``end`` for ``d`` dimensions (``draw`` of a composite strategy); windows that do
    not fit their padded image are shrunk, so valid cases stay common."""
    def lists(values):
        return draw(st.lists(values, min_size=d, max_size=d))

    g = dict(spatial=lists(st.integers(1, 6)), window=lists(st.integers(1, 3)),
             strides=lists(st.integers(1, 3)), dilations=lists(st.integers(1, 2)),
             start=lists(st.integers(0, 2)), end=lists(st.integers(0, 2)))
    for i in range(d):
        while (g["window"][i] > 1 and g["dilations"][i] * (g["window"][i] - 1) + 1
               > g["spatial"][i] + g["start"][i] + g["end"][i]):
            g["window"][i] -= 1
    return g

"""Fuzzed Padding descriptors (see tests/fuzzing.py): random ranks, shapes, modes, data
types, paddings and input layouts, and one broken rule at a time."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from vkml import dml
from vkml.errors import ValidationError

from fuzzing import canaries_intact, count, execute_with_canaries, fuzz_settings, real_cases
from helpers import ALL_DTYPES, random_bits, same_bits, strided_view
from references import PAD_MODES, pad_reference

MODES = list(PAD_MODES)


@st.composite
def padding_cases(draw):
    rank = draw(st.integers(1, 8))
    shape = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    dtype = draw(st.sampled_from(ALL_DTYPES))
    mode = draw(st.sampled_from(MODES + ["bogus"] * 1))
    start = draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank))
    end = draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank))
    # Keep the work bounded: halve the largest padding, and once no padding is left, the
    # largest dimension (4^8 elements alone exceed the bound, so paddings cannot always do it).
    while math.prod(s + a + b for s, a, b in zip(shape, start, end)) > 30000:
        d = int(np.argmax([a + b for a, b in zip(start, end)]))
        if start[d] + end[d] == 0:
            d = int(np.argmax(shape))
            shape[d] = max(1, shape[d] // 2)
        else:
            start[d], end[d] = start[d] // 2, end[d] // 2
    out = [s + a + b for s, a, b in zip(shape, start, end)]
    # about half the cases valid (with the bogus mode's sixth): the floor of valid cases
    # (fuzzing.real_cases, a quarter) then holds by a wide margin on a slow device's draws
    mutation = draw(st.sampled_from(["none"] * 12 + ["out_size", "count", "negative", "dtype",
                                                     "rank", "in_strides", "out_overlap"]))
    in_strides = None
    if draw(st.booleans()):   # a non-packed input layout: padded, broadcast or permuted
        kind = draw(st.sampled_from(["padded", "broadcast", "permuted"]))
        in_strides = kind
    return dict(shape=shape, dtype=dtype, mode=mode, start=start, end=end, out=out,
                mutation=mutation, in_strides=in_strides, seed=draw(st.integers(0, 2**31)))


def _expected_errors(case) -> list[str]:
    """The independent checker: the fields an error may name (any broken rule), or []."""
    fields = ["padding_mode"] if case["mode"] == "bogus" else []
    m = case["mutation"]
    field = {"out_size": "output_tensor.sizes", "count": "start_padding",
             "negative": "end_padding", "dtype": "output_tensor.data_type",
             "rank": "output_tensor.sizes", "out_overlap": "output_tensor.strides"}.get(m)
    return fields + ([field] if field else [])


def _build(case, rng):
    shape, dtype, start, end, out = (case["shape"], case["dtype"], list(case["start"]),
                                     list(case["end"]), list(case["out"]))
    out_dtype, out_strides = dtype, None
    m = case["mutation"]
    if m == "out_size":
        out[-1] += 1
    elif m == "count":
        start = start + [0]
    elif m == "negative":
        end[-1] = -1
    elif m == "dtype":
        out_dtype = "int8" if dtype != "int8" else "uint8"
    elif m == "rank":
        out = out + [1] if len(out) < 8 else out[:-1]
    elif m == "out_overlap":
        out_strides = [0] * len(out)
        if max(out) == 1:
            out[-1] += 1
            end[-1] += 1
    if case["in_strides"]:
        flat, strides, logical = strided_view(rng, shape, dtype, case["in_strides"])
    else:
        logical = random_bits(rng, shape, dtype)
        flat, strides = logical.reshape(-1), None
    desc = dml.PaddingOperatorDesc(dml.TensorDesc(dtype, shape, strides),
                                   dml.TensorDesc(out_dtype, out, out_strides),
                                   case["mode"], 5.0, start, end)
    return desc, flat, logical


def test_fuzz_padding(device, speed):
    @fuzz_settings(speed)
    @given(padding_cases())
    def check(case):
        rng = np.random.default_rng(case["seed"])
        want = _expected_errors(case)
        try:
            desc, flat, logical = _build(case, rng)
            op = device.create_operator(desc)
        except ValidationError as err:
            assert want, f"valid case refused: {err}"
            assert any(f in str(err) for f in want), f"expected one of {want}, got {err}"
            return count("refused")
        assert not want, f"invalid case accepted ({want})"
        compiled = device.compile_operator(op)
        count("valid")
        src, dst = execute_with_canaries(device, compiled, desc, flat)
        out = desc.output_tensor
        got = dst.read_bytes(out.element_count * out.data_type.size).view(out.dtype)
        expect = pad_reference(logical, case["start"], case["end"], case["mode"], 5)
        assert same_bits(got.reshape(expect.shape), expect)
        assert canaries_intact(src) and canaries_intact(dst), "wrote outside the tensor"
        assert same_bits(src.read_bytes(flat.nbytes).view(flat.dtype), flat), "input changed"

    with real_cases(speed):
        check()

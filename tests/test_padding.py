"""DML_PADDING_OPERATOR_DESC / DML_PADDING1_OPERATOR_DESC and vkml.pad, on every device.

References: the page's four examples verbatim, and ``pad_reference`` (tests/references.py:
``numpy.pad`` with the page's modes) over random shapes, paddings, data types and layouts.
"""
from __future__ import annotations

import json
import warnings
import zlib

import numpy as np
import pytest

import vkml
from vkml import dml, tuning
from vkml.errors import ValidationError

from helpers import ALL_DTYPES, random_bits, run_desc, same_bits, strided_view
from references import PAD_MODES, pad_reference

from vkml.ops.calibrate import U64_BLOCKS
from vkml.intmath import ceil_div

#: The u64vec4-store candidates a large padding times (int64 devices).
U64_NAMES = {f"rows-{a}x{b}-u64" for a, b in U64_BLOCKS}

EXAMPLE_INPUT = np.array([[[[1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 3, 4], [5, 6, 7, 8]]]])
# The page's outputs, verbatim (StartPadding {0,0,1,2}, EndPadding {0,0,3,4}).
EXAMPLES = {
    "constant": [[9, 9, 9, 9, 9, 9, 9, 9, 9, 9], [9, 9, 1, 2, 3, 4, 9, 9, 9, 9],
                 [9, 9, 5, 6, 7, 8, 9, 9, 9, 9], [9, 9, 1, 2, 3, 4, 9, 9, 9, 9],
                 [9, 9, 5, 6, 7, 8, 9, 9, 9, 9], [9, 9, 9, 9, 9, 9, 9, 9, 9, 9],
                 [9, 9, 9, 9, 9, 9, 9, 9, 9, 9], [9, 9, 9, 9, 9, 9, 9, 9, 9, 9]],
    "edge": [[1, 1, 1, 2, 3, 4, 4, 4, 4, 4], [1, 1, 1, 2, 3, 4, 4, 4, 4, 4],
             [5, 5, 5, 6, 7, 8, 8, 8, 8, 8], [1, 1, 1, 2, 3, 4, 4, 4, 4, 4],
             [5, 5, 5, 6, 7, 8, 8, 8, 8, 8], [5, 5, 5, 6, 7, 8, 8, 8, 8, 8],
             [5, 5, 5, 6, 7, 8, 8, 8, 8, 8], [5, 5, 5, 6, 7, 8, 8, 8, 8, 8]],
    "reflection": [[7, 6, 5, 6, 7, 8, 7, 6, 5, 6], [3, 2, 1, 2, 3, 4, 3, 2, 1, 2],
                   [7, 6, 5, 6, 7, 8, 7, 6, 5, 6], [3, 2, 1, 2, 3, 4, 3, 2, 1, 2],
                   [7, 6, 5, 6, 7, 8, 7, 6, 5, 6], [3, 2, 1, 2, 3, 4, 3, 2, 1, 2],
                   [7, 6, 5, 6, 7, 8, 7, 6, 5, 6], [3, 2, 1, 2, 3, 4, 3, 2, 1, 2]],
    "symmetric": [[2, 1, 1, 2, 3, 4, 4, 3, 2, 1], [2, 1, 1, 2, 3, 4, 4, 3, 2, 1],
                  [6, 5, 5, 6, 7, 8, 8, 7, 6, 5], [2, 1, 1, 2, 3, 4, 4, 3, 2, 1],
                  [6, 5, 5, 6, 7, 8, 8, 7, 6, 5], [6, 5, 5, 6, 7, 8, 8, 7, 6, 5],
                  [2, 1, 1, 2, 3, 4, 4, 3, 2, 1], [6, 5, 5, 6, 7, 8, 8, 7, 6, 5]],
}


@pytest.mark.parametrize("mode", list(EXAMPLES))
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "uint8", "int16", "int64",
                                   "float64"])
def test_page_examples(device, mode, dtype):
    x = EXAMPLE_INPUT.astype(dtype)
    expect = np.array([[EXAMPLES[mode]]], dtype=dtype)
    desc = dml.PaddingOperatorDesc(
        dml.TensorDesc(dtype, (1, 1, 4, 4)), dml.TensorDesc(dtype, (1, 1, 8, 10)),
        dml.PaddingMode[mode.upper()], 9.0, (0, 0, 1, 2), (0, 0, 3, 4))
    got = run_desc(device, desc, x).reshape(1, 1, 8, 10)
    np.testing.assert_array_equal(got, expect)
    # the same through DML_PADDING1_OPERATOR_DESC and the functional form
    desc1 = dml.Padding1OperatorDesc(desc.input_tensor, desc.output_tensor, mode, dtype, 9,
                                     (0, 0, 1, 2), (0, 0, 3, 4))
    np.testing.assert_array_equal(run_desc(device, desc1, x).reshape(1, 1, 8, 10), expect)
    np.testing.assert_array_equal(vkml.pad(x, [0, 0, 1, 2], [0, 0, 3, 4], mode, 9,
                                           device=device), expect)


def _random_case(rng, max_elems):
    rank = int(rng.integers(1, 9))
    while True:
        shape = [int(rng.integers(1, 6)) for _ in range(rank)]
        start = [int(rng.integers(0, 3 * s + 2)) if rng.random() < 0.6 else 0 for s in shape]
        end = [int(rng.integers(0, 3 * s + 2)) if rng.random() < 0.6 else 0 for s in shape]
        out = np.prod([s + a + b for s, a, b in zip(shape, start, end)])
        if out <= max_elems:
            return shape, start, end
        rank = max(1, rank - 1)


def _seed(mode: str) -> int:
    """A seed per mode that is the same in every process (``hash`` of a str is salted
    per process: a failure could not be replayed)."""
    return zlib.crc32(mode.encode())


MODE_LIST = list(PAD_MODES)


def _modes_of_case(i: int) -> list[str]:
    """Three of the five modes for the ``i``-th hand-picked case of a forced-path test
    (consecutive cases overlap by one): each case's specialised pipelines compile per mode,
    and over four or more cases every mode still meets at least two of them."""
    return [MODE_LIST[(2 * i + k) % len(MODE_LIST)] for k in range(3)]


@pytest.mark.parametrize("mode", list(PAD_MODES))
def test_random_against_numpy(device, budget, mode):
    """Random ranks 1-8, every data type, paddings from 0 to several times the size."""
    rng = np.random.default_rng(_seed(mode))
    for case in range(budget):
        dtype = ALL_DTYPES[case % len(ALL_DTYPES)]
        shape, start, end = _random_case(rng, 20000)
        x = random_bits(rng, shape, dtype)
        value = 7 if np.dtype(dtype).kind in "iu" else -2.5
        got = vkml.pad(x, start, end, mode, value, device=device)
        expect = pad_reference(x, start, end, mode, value)
        assert same_bits(got, expect), (dtype, shape, start, end)


@pytest.mark.parametrize("kind", ["padded", "broadcast", "permuted"])
@pytest.mark.parametrize("mode", ["constant", "reflection", "wrap"])
def test_strided_layouts(device, kind, mode):
    """Input and output TensorDesc strides are honoured (DML_BUFFER_TENSOR_DESC.Strides)."""
    rng = np.random.default_rng(3)
    for dtype in ["float32", "uint8", "float16", "int64"]:
        shape = [2, 3, 4, 5]
        flat, strides, logical = strided_view(rng, shape, dtype, kind)
        start, end = [0, 1, 2, 1], [1, 0, 3, 6]
        out_shape = [s + a + b for s, a, b in zip(shape, start, end)]
        # an output with padded rows and a permuted order
        out_phys = [out_shape[1], out_shape[0], out_shape[2], out_shape[3] + 3]
        out_strides = (out_phys[2] * out_phys[3], out_phys[0] * out_phys[2] * out_phys[3],
                       out_phys[3], 1)
        desc = dml.PaddingOperatorDesc(
            dml.TensorDesc(dtype, shape, strides), dml.TensorDesc(dtype, out_shape, out_strides),
            mode, 3.0, start, end)
        raw = run_desc(device, desc, flat)
        got = np.lib.stride_tricks.as_strided(
            raw, out_shape, [s * raw.itemsize for s in out_strides])
        expect = pad_reference(logical, start, end, mode, 3)
        assert same_bits(np.array(got), expect), (dtype, kind)


def test_tensor_in_tensor_out(device):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = vkml.tensor(x, device=device)
    y = vkml.pad(t, [1, 0, 2], [0, 1, 1], "edge")
    assert isinstance(y, vkml.Tensor) and y.device is device
    assert y.shape == (3, 4, 7)
    np.testing.assert_array_equal(y.numpy(), np.pad(x, [(1, 0), (0, 1), (2, 1)], "edge"))
    z = vkml.pad(y, [0, 0, 1], [0, 0, 1], "symmetric")   # chained on the device
    np.testing.assert_array_equal(
        z.numpy(), np.pad(np.pad(x, [(1, 0), (0, 1), (2, 1)], "edge"), [(0, 0), (0, 0), (1, 1)],
                          "symmetric"))


@pytest.mark.parametrize("dtype,value,expect", [
    ("int32", 10.6, 10), ("int32", -10.6, -10), ("uint8", 300.0, 255), ("uint8", -4.0, 0),
    ("int8", float("nan"), 0), ("float16", 10.6, np.float16(10.6)), ("float32", 1e-3, 1e-3),
    ("float16", 1e5, np.inf), ("float32", -1e300, -np.inf)])
def test_constant_conversion(device, dtype, value, expect):
    """PaddingValue is a FLOAT: truncated for integer types (10.6 -> 10, as the page says),
    then saturated to the type's range; beyond a float type's range it is +-inf, as
    numpy.pad makes it, with no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = vkml.pad(np.zeros(2, dtype), [1], [0], "constant", value, device=device)
    assert y[0] == np.array(expect, dtype) and y[1] == 0


def test_padding1_exact_64bit_constants(device):
    """DML_PADDING1's typed PaddingValue keeps int64/uint64 constants exact."""
    for dtype, value in (("int64", -(2**62) - 3), ("uint64", 2**64 - 5)):
        x = np.arange(3, dtype=dtype)
        desc = dml.Padding1OperatorDesc(dml.TensorDesc(dtype, (3,)), dml.TensorDesc(dtype, (5,)),
                                        "constant", dtype, value, (1,), (1,))
        got = run_desc(device, desc, x)
        assert got[0] == value and got[4] == value, got
        assert vkml.pad(x, [1], [1], value=value, device=device)[0] == value


def test_reflection_on_size_one(device):
    """Reflection on a dimension of size 1 repeats the element (numpy.pad's choice)."""
    x = np.array([[5.0], [6.0]], np.float32)
    y = vkml.pad(x, [0, 3], [0, 2], "reflection", device=device)
    np.testing.assert_array_equal(y, np.pad(x, [(0, 0), (3, 2)], "reflect"))


def test_large_padding_fold_periodically(device):
    x = np.arange(1, 5, dtype=np.int32)
    for mode in ("reflection", "symmetric", "wrap", "edge"):
        y = vkml.pad(x, [13], [17], mode, device=device)
        np.testing.assert_array_equal(y, pad_reference(x, [13], [17], mode))


@pytest.mark.parametrize("mode", ["constant", "reflection"])
def test_windows_beyond_max_storage_buffer_range(device, mode):
    """A tensor larger than maxStorageBufferRange is split into windows: tested with a
    lowered limit on every device (the real 128 MiB case is in test_lifetime)."""
    with vkml.Device(device.index, limits={"maxStorageBufferRange": 4096}) as small:
        rng = np.random.default_rng(5)
        for dtype, shape in (("float32", (3, 5, 40, 33)), ("uint8", (2, 300, 17)),
                             ("float16", (6000,))):
            x = random_bits(rng, shape, dtype)
            start = [1] * len(shape)
            end = [2] * len(shape)
            got = vkml.pad(x, start, end, mode, 1, device=small)
            assert same_bits(got, pad_reference(x, start, end, mode, 1))


@pytest.mark.parametrize("path", ["kernel", "copy"])
def test_both_paths(device, path):
    """The kernel alone, and the copy engine for the interior with kernels for the border
    boxes, give the same bits (the choice between them is measured per device)."""
    from vkml.ops.padding import CompiledPadding

    rng = np.random.default_rng(7)
    for dtype, shape, start, end in (("float32", (3, 17, 9), (0, 2, 1), (1, 0, 3)),
                                     ("uint8", (2, 5, 6, 7), (1, 0, 2, 2), (0, 3, 1, 0)),
                                     ("float64", (40,), (3,), (5,))):
        x = random_bits(rng, shape, dtype)
        for mode in PAD_MODES:
            desc = dml.PaddingOperatorDesc(
                dml.TensorDesc(dtype, shape),
                dml.TensorDesc(dtype, [s + a + b for s, a, b in zip(shape, start, end)]),
                mode, 2.0, start, end)
            op = CompiledPadding(device, desc, path=path)
            assert (op.copy_regions is not None) == (path == "copy")
            src, dst = device.tensor(x), device.empty(desc.output_tensor.sizes, dtype)
            op.execute([src], [dst])
            op.release()
            assert same_bits(dst.numpy(), pad_reference(x, start, end, mode, 2)), \
                (dtype, mode, path)


def _forced(path):
    """A constructor of paddings forced onto ``path``."""
    from vkml.ops.padding import CompiledPadding

    return lambda device, desc: CompiledPadding(device, desc, path=path)


def _check_forced(device, cls, x, start, end, mode, in_strides=None, logical=None,
                  out_strides=None, expect_path=True):
    """Run ``cls`` on x (flat buffer + strides, or a packed array) and compare with
    numpy.pad bit for bit; returns the compiled operator's rows plan."""
    logical = x if logical is None else logical
    dtype = logical.dtype
    shape = list(logical.shape)
    out_shape = [s + a + b for s, a, b in zip(shape, start, end)]
    desc = dml.PaddingOperatorDesc(
        dml.TensorDesc(dtype, shape, in_strides), dml.TensorDesc(dtype, out_shape, out_strides),
        mode, 3.0, start, end)
    op = cls(device, desc)
    assert (op.rows is not None) == expect_path, (shape, start, end, mode)
    src = device.tensor(x)
    nbytes = desc.output_tensor.total_tensor_size_in_bytes
    dst = device.empty(nbytes // dtype.itemsize, dtype)
    op.execute([src], [dst])
    rows = op.rows
    op.release()
    raw = dst.numpy()
    strides = out_strides or [int(np.prod(out_shape[d + 1:])) for d in range(len(shape))]
    got = np.lib.stride_tricks.as_strided(raw, out_shape, [st * dtype.itemsize for st in strides])
    expect = pad_reference(logical, start, end, mode, 3)
    assert same_bits(np.array(got), expect), (str(dtype), shape, start, end, mode)
    return rows


@pytest.mark.parametrize("mode", list(PAD_MODES))
def test_rows_path_against_numpy(device, budget, mode):
    """The rows path (whole 16-byte words of each row's copied run, texel reads shifted
    into place, plus an edge pass) forced on random shapes: every data type, ranks 1-5,
    run starts at every byte offset, paddings up to several periods, tiny outer sizes.
    Each case compiles its own shape-specialised pipelines: two cases per data type and
    mode at most (a fast device's budget would be nearly four)."""
    cls = _forced("rows")
    rng = np.random.default_rng(_seed(mode) + 1)
    for case in range(min(budget, 2 * len(ALL_DTYPES))):
        dtype = np.dtype(ALL_DTYPES[case % len(ALL_DTYPES)])
        e = dtype.itemsize
        rank = int(rng.integers(1, 6))
        inner = int(rng.integers(ceil_div(32, e), 160 // e + 3))        # >= 32 bytes
        shape = [int(rng.integers(1, 4)) for _ in range(rank - 1)] + [inner]
        start = [int(rng.integers(0, 3)) if rng.random() < 0.5 else 0 for _ in shape]
        end = [int(rng.integers(0, 3)) if rng.random() < 0.5 else 0 for _ in shape]
        start[-1] = int(rng.integers(0, 17 // e + 2))
        end[-1] = int(rng.integers(0, 17 // e + 2))
        if case % 4 == 3:                      # beyond one period: the modulo folding
            start[-1], end[-1] = inner + 5, 2 * inner + 1
            if rank > 1:
                start[0] = 2 * shape[0] + 1
        _check_forced(device, cls, random_bits(rng, shape, dtype), start, end, mode)


def test_rows_path_words_per_lane(device, monkeypatch):
    """Large tensors take fewer 16-byte words per lane: forced on small ones here."""
    from vkml.ops import padding

    monkeypatch.setattr(padding, "ROWS_PER_BYTES", 0)
    cls = _forced("rows")
    rng = np.random.default_rng(21)
    for dtype, shape, start, end in (("float32", (3, 2, 77), (1, 0, 3), (0, 1, 2)),
                                     ("uint8", (5, 150), (2, 7), (1, 9)),
                                     ("float64", (2, 31), (0, 1), (1, 0))):
        for mode in ("constant", "symmetric"):
            _check_forced(device, cls, random_bits(rng, shape, dtype), list(start), list(end),
                          mode)


def test_rows_path_packed_variants(device):
    """Devices without 8/16-bit storage: the edge pass stores sub-word elements with
    atomics (neighbouring rows share 32-bit words).  Every mode on each element width:
    the two cases of a width (the kernel variant) share the modes out between them (a
    fresh device compiles every pipeline)."""
    cls = _forced("rows")
    with vkml.Device(device.index, disable_features=["storage8", "storage16"]) as dev:
        rng = np.random.default_rng(12)
        for i, (dtype, shape, start, end) in enumerate((
                ("uint8", (3, 5, 37), (1, 0, 3), (0, 2, 5)),
                ("int16", (4, 21), (2, 1), (1, 3)),
                ("float16", (2, 3, 50), (0, 1, 7), (1, 0, 1)),
                ("int8", (7, 33), (0, 1), (0, 2)))):
            x = random_bits(rng, shape, dtype)
            for mode in MODE_LIST[i % 2::2]:          # uint8 + int8, int16 + float16
                _check_forced(dev, cls, x, start, end, mode)


@pytest.mark.parametrize("kind", ["padded", "broadcast", "permuted"])
def test_rows_path_strided_layouts(device, kind):
    """Outer strides of any size (rows starting at any byte, broadcast rows) and output
    rows with gaps between them; permuted layouts without a unit innermost stride fall
    back to the element kernel."""
    cls = _forced("rows")
    rng = np.random.default_rng(4)
    for dtype in ("float32", "uint8", "int64", "float16"):
        e = np.dtype(dtype).itemsize
        shape = [2, 3, max(9, 40 // e)]
        flat, strides, logical = strided_view(rng, shape, dtype, kind)
        start, end = [1, 0, 3], [0, 2, 2]
        out_shape = [s + a + b for s, a, b in zip(shape, start, end)]
        row = out_shape[2] + 5                 # output rows with a gap after each
        out_strides = [out_shape[1] * row, row, 1]
        for mode in ("constant", "reflection", "wrap"):
            _check_forced(device, cls, flat, start, end, mode, strides, logical,
                          out_strides, expect_path=strides[-1] == 1)


def test_rows_path_falls_back(device):
    """Rows too short for a whole 16-byte word, or an input beyond maxTexelBufferElements,
    take the element kernel even when the rows path is asked for."""
    cls = _forced("rows")
    rng = np.random.default_rng(2)
    _check_forced(device, cls, random_bits(rng, (5, 7), "float32"), [1, 2], [0, 1], "edge",
                  expect_path=False)
    with vkml.Device(device.index, limits={"maxTexelBufferElements": 16}) as small:
        _check_forced(small, cls, random_bits(rng, (4, 40), "float32"), [1, 2], [0, 1],
                      "symmetric", expect_path=False)
        _check_forced(small, cls, random_bits(rng, (2, 70), "int16"), [0, 2], [0, 1],
                      "symmetric", expect_path=False)


def test_rows_path_workgroup_limit_is_split(device):
    """Both passes of the rows path, and its whole-rows dispatch, split their
    dispatches at maxComputeWorkGroupCount."""
    cls = _forced("rows")
    rng = np.random.default_rng(9)
    with vkml.Device(device.index, limits={"maxComputeWorkGroupCount": (2, 3, 2)}) as small:
        for shape, start, end in (((5, 3, 4, 300), (1, 0, 2, 3), (0, 1, 1, 2)),
                                  ((7000,), (5,), (3,)),
                                  ((3, 40, 70), (0, 30, 9), (2, 41, 40)),
                                  ((5, 3, 40, 60), (1, 0, 2, 2), (0, 1, 1, 2)),  # whole rows
                                  ((600,), (2,), (2,))):
            x = random_bits(rng, shape, "int32")
            for mode in ("constant", "symmetric"):
                _check_forced(small, cls, x, list(start), list(end), mode)
            op = _forced("rows")(small, dml.PaddingOperatorDesc(
                dml.TensorDesc("int32", shape), dml.TensorDesc("int32", [
                    s + a + b for s, a, b in zip(shape, start, end)]), "constant", 0.0,
                start, end))
            assert op.full_rows == (shape[-1] in (60, 600))
            op.release()


def _compile_pad(device, shape, start, end, dtype="float32"):
    out = [s + a + b for s, a, b in zip(shape, start, end)]
    return device.compile_operator(device.create_operator(dml.PaddingOperatorDesc(
        dml.TensorDesc(dtype, shape), dml.TensorDesc(dtype, out), "reflection", 0.0,
        start, end)))


def _path_of(op) -> str:
    return "rows" if op.rows else "copy" if op.copy_regions is not None else "kernel"


class _FixedCosts:
    """A tuner whose padding model is ``costs`` (as if stored)."""

    def __init__(self, costs):
        self.costs = costs

    def model(self, device, path, **kw):
        return tuning.Model(path.name, self.costs,
                            tuning.TuneKey("test", "", path.name, tuning.MODEL_CLASS), "stored")


def test_path_choice_follows_the_measured_costs(device, monkeypatch):
    """The path is the cheapest by the device's calibrated model (never its name): with
    made-up costs each path wins where it should; small outputs skip the model."""
    def choose(costs, shape, start, end):
        monkeypatch.setattr(tuning, "default_tuner", lambda: _FixedCosts(costs))
        op = _compile_pad(device, shape, start, end)
        path = _path_of(op)
        op.release()
        return path

    fast_rows = {"kernel": (0, 0, 1e-9), "rows": (0, 0, 1e-10), "copy": (0, 1e-6, 1e-10)}
    assert choose(fast_rows, (64, 1024), (0, 2), (0, 2)) == "rows"
    # a copy engine with cheap regions wins on a few long rows
    cheap_regions = dict(fast_rows, copy=(0, 1e-8, 1e-11))
    assert choose(cheap_regions, (4, 65536), (0, 2), (0, 2)) == "copy"
    assert choose(dict(fast_rows, kernel=(0, 0, 1e-12)), (64, 1024), (0, 2), (0, 2)) == "kernel"
    # rows too short for the rows path, and outputs too small to measure
    assert choose(fast_rows, (8192, 5), (0, 2), (0, 2)) == "kernel"
    assert choose(dict(fast_rows, copy=(0, 0, 1e-11)), (8192, 5), (0, 2), (0, 2)) == "copy"
    assert choose(fast_rows, (16, 32), (0, 2), (0, 2)) == "kernel"


def test_path_argument_is_checked(device):
    from vkml.ops.padding import CompiledPadding

    desc = dml.PaddingOperatorDesc(dml.TensorDesc("float32", (4, 8)),
                                   dml.TensorDesc("float32", (4, 12)), "edge", 0.0,
                                   (0, 2), (0, 2))
    with pytest.raises(ValidationError, match="path"):
        CompiledPadding(device, desc, path="fastest")
    assert CompiledPadding(device, desc, path="kernel").path == "kernel"
    for bad in ((0, 4), (64, 0), (64, 17), (64,), (64.0, 4), "64x4", (True, 4)):
        with pytest.raises(ValidationError, match="rows_block"):
            CompiledPadding(device, desc, path="rows", rows_block=bad)
    op = CompiledPadding(device, desc, path="rows", rows_block=[256, 4])
    assert op.rows_block == (256, 4)
    op.release()
    for field in ("rows_full", "rows_u64"):        # None, True or False
        for bad in (1, "yes", 0.0):
            with pytest.raises(ValidationError, match=field):
                CompiledPadding(device, desc, path="rows", **{field: bad})


# -- the calibration: a measured model of the tuner (vkml/ops/calibrate.py) ----------------
#: A quick calibration (tiny points) for the tests of its mechanism; the real one is timed
#: by the tests that pad 64 KiB or more (once per device and session).
SMALL_SHAPES = ((64, 64), (8, 512))
BIG = ((128, 256), (0, 2), (0, 2))       # 130 KiB out: the model chooses


@pytest.fixture
def small_model(monkeypatch, tmp_path):
    """Padding calibrated by a quick model, stored in ``tmp_path`` by a fresh default tuner."""
    from vkml.ops import calibrate, padding

    model = calibrate.padding_model(padding.CompiledPadding, name="padding-test",
                                    shapes=SMALL_SHAPES, register=False)
    monkeypatch.setattr(padding, "MODEL", model)
    tuner = tuning.Tuner("fast", folder=tmp_path)   # about tuning: its own mode
    monkeypatch.setattr(tuning, "_DEFAULT", tuner)
    return model, tuner


def _no_timing(monkeypatch) -> list:
    timed: list = []
    real = tuning.Tuner._measure
    monkeypatch.setattr(tuning.Tuner, "_measure",
                        lambda self, *a, **k: timed.append(a[1].name) or real(self, *a, **k))
    return timed


def test_calibration_off_uses_the_default_without_timing(device, monkeypatch, tmp_path):
    """VKML_TUNE=off: the documented default costs, nothing timed, read or written, the
    same choice every time (rows for row-contiguous paddings, the kernel elsewhere)."""
    from vkml.ops import calibrate, padding

    monkeypatch.setenv("VKML_TUNE", "off")
    monkeypatch.setattr(tuning, "_DEFAULT", tuning.Tuner(folder=tmp_path))
    timed = _no_timing(monkeypatch)
    for _ in range(2):
        m = tuning.model(device, padding.MODEL)
        assert m.source == "default" and m.times == {}
        assert m.params == {k: list(v) for k, v in calibrate.DEFAULT_COSTS.items()}
        op = _compile_pad(device, *BIG)
        assert _path_of(op) == "rows" and op.observed is None
        op.release()
        op = _compile_pad(device, (8192, 5), (0, 2), (0, 2))    # rows too short, many
        assert _path_of(op) == "kernel"
        op.release()
    assert timed == [] and not (tmp_path.exists() and list(tmp_path.iterdir()))


def test_calibration_is_stored_and_keyed_by_padding_features(device, small_model):
    model, tuner = small_model
    m = tuner.model(device, model)
    assert m.source == "measured" and set(m.params) <= {"kernel", "rows", "copy"}
    assert "kernel" in m.params and all(len(c) == 3 and min(c) >= 0 for c in m.params.values())
    # the key holds only the features that choose padding kernels
    assert set(filter(None, m.key.features.split(","))) <= {"storage8", "storage16"}
    assert tuner.model(device, model).source == "stored"
    assert m.key in tuner.fitted
    with vkml.Device(device.index, disable_features=["push_descriptor", "host_import"]) as d:
        assert tuner.model(d, model).source == "stored"           # the same calibration
    with vkml.Device(device.index, limits={"maxComputeWorkGroupCount": (4, 4, 4)}) as d:
        assert tuner.model(d, model).source == "stored"           # used, never measured
    with vkml.Device(device.index, disable_features=["storage8", "storage16"]) as d:
        other = tuner.model(d, model)
        assert other.key != m.key or not device.features["storage8"]


def test_limited_device_never_calibrates(device, monkeypatch, tmp_path, small_model):
    model, tuner = small_model
    with vkml.Device(device.index, limits={"maxComputeWorkGroupCount": (4, 4, 4)}) as d:
        m = tuner.model(d, model)
        assert m.source == "default" and tuner.lookup(m.key) is None


def test_stale_calibration_is_measured_again(device, monkeypatch, tmp_path, small_model):
    """A calibration taken under load (every stored time 1000x too long: far beyond what
    another test process sharing the CPUs can make the re-measurement look like) is found
    out by the times executions observe and measured again."""
    from vkml.ops import base

    model, tuner = small_model
    first = tuner.model(device, model)
    path = tmp_path / f"{tuning._stem(device.info)}.json"
    doc = json.loads(path.read_text())
    entry = doc["entries"][first.key.features][model.name][tuning.MODEL_CLASS]
    entry["times"] = {k: v * 1000 for k, v in entry["times"].items()}
    entry["seconds"] = entry["times"][entry["choice"]]
    path.write_text(json.dumps(doc))
    fresh = tuning.Tuner("fast", folder=tmp_path)
    monkeypatch.setattr(tuning, "_DEFAULT", fresh)
    loaded = fresh.model(device, model)
    assert loaded.source == "stored"
    assert loaded.params["kernel"][0] == pytest.approx(1000 * first.params["kernel"][0])

    monkeypatch.setattr(base, "OBSERVE_EVERY", 1)
    op = _compile_pad(device, *BIG)
    assert op.observed is not None and op.observed[0] == loaded.key
    x = device.tensor(np.zeros(BIG[0], np.float32))
    y = device.empty(op.desc.output_tensor.sizes)
    timed = _no_timing(monkeypatch)
    for _ in range(fresh.stale_observations):
        op.execute([x], [y])
    op.release()
    assert timed == [] and fresh.lookup(loaded.key)["stale"]
    again = fresh.model(device, model)
    assert again.source == "measured" and timed == [model.name]
    assert not fresh.lookup(loaded.key)["stale"] and fresh.tolerance == {}
    assert again.params["kernel"][0] < loaded.params["kernel"][0] / 3


def test_sampled_observations_only(device, monkeypatch, small_model):
    """Only every OBSERVE_EVERY-th execution is timed; the others replay as usual."""
    from vkml.ops import base

    model, tuner = small_model
    tuner.model(device, model)
    seen = []
    monkeypatch.setattr(tuning.Tuner, "observe", lambda self, *a, **k: seen.append((a, k)))
    monkeypatch.setattr(base, "OBSERVE_EVERY", 4)
    monkeypatch.setattr(base, "_CALLS", iter(range(1, 100)))
    op = _compile_pad(device, *BIG)
    path = _path_of(op)
    x = device.tensor(np.arange(128 * 256, dtype=np.float32).reshape(128, 256))
    y = device.empty(op.desc.output_tensor.sizes)
    for _ in range(8):
        op.execute([x], [y])
        assert np.array_equal(y.numpy(), np.pad(x.numpy(), ((0, 0), (2, 2)), "reflect"))
    op.release()
    assert len(seen) == 2               # calls 4 and 8
    for (key, name, seconds), kw in seen:
        assert (key, name) == op.observed[:2] and name == path and seconds > 0
        assert kw["expected"] == op.observed[2] > 0 and kw["factor"] == model.stale_factor


def test_refresh_measures_the_calibration_again(device, small_model):
    model, tuner = small_model
    first = tuner.model(device, model)
    again = vkml.tune([(model, tuning.MODEL_CLASS)], device, "fast", refresh=True,
                      tuner=tuner)
    assert again[0].source == "measured"
    assert tuner.lookup(first.key)["measured_at"] > 0
    assert tuner.model(device, model).source == "stored"


# -- large paddings: timed at their own size class (calibrate.large_path) -------------------
@pytest.fixture
def large(monkeypatch, small_model):
    """BIG counts as large; the model puts rows and copy even (both near), so the tuner
    decides; every candidate's time is ``fake[name]`` where given (else measured)."""
    import dataclasses

    from vkml.ops import calibrate, padding

    model, tuner = small_model
    costs = {"kernel": [0.0, 0.0, 1e-8], "rows": [0.0, 0.0, 1e-9], "copy": [0.0, 0.0, 1e-9]}
    monkeypatch.setattr(tuner, "model", lambda device, path, **kw: tuning.Model(
        path.name, costs, tuner.key(device, path, tuning.MODEL_CLASS), "stored"))
    monkeypatch.setattr(calibrate, "LARGE_BYTES", 1)
    fake, seqs = {}, {}
    path = calibrate.large_path(padding.CompiledPadding, name="padding-large-test",
                                register=False)

    def run(device, seq, cand, shape):
        seqs[id(seq)] = cand.name
        return path.run(device, seq, cand, shape)
    monkeypatch.setattr(padding, "LARGE", dataclasses.replace(path, run=run))
    real = tuning._run_once
    monkeypatch.setattr(tuning, "_run_once",
                        lambda seq: fake.get(seqs.get(id(seq)), None) or real(seq))
    return tuner, fake


@pytest.mark.parametrize("fastest", ["rows", "copy", "rows-256x4", "rows-256x4-split",
                                     "rows-128x6-u64"])
def test_large_padding_keeps_the_fastest_measured_path(device, monkeypatch, large, fastest):
    """Past the model's points the near paths are timed at the padding's own class and
    the fastest measured is kept (times faked: each path wins where it measures best);
    the next padding of the class takes the stored choice without timing, and the chosen
    path pads right.  The u64vec4-store candidates only where the device has int64."""
    tuner, fake = large
    int64 = bool(device.context.features.get("int64"))
    if fastest.endswith("u64") and not int64:
        pytest.skip("no int64 shaders: the u64 candidates decline")
    names = {"rows", "copy", "rows-256x4", "rows-256x4-split"} | (U64_NAMES if int64 else set())
    fake.update({**dict.fromkeys(names, 2e-3), fastest: 1e-3})
    op = _compile_pad(device, *BIG)
    key = op.observed[0]
    entry = tuner.lookup(key)
    assert key.path == "padding-large-test"
    assert set(entry["times"]) == names
    assert entry["choice"] == op.observed[1] == fastest
    assert _path_of(op) == op.taken == fastest.split("-")[0]
    assert op.rows_block == ((256, 4) if fastest.startswith("rows-256x4") else
                             (128, 6) if fastest.startswith("rows-128x6") else None)
    assert op.full_rows == (fastest in ("rows", "rows-256x4", "rows-128x6-u64"))
    assert op.u64 == fastest.endswith("u64")
    x = device.tensor(np.arange(128 * 256, dtype=np.float32).reshape(128, 256))
    y = device.empty(op.desc.output_tensor.sizes)
    op.execute([x], [y])
    assert np.array_equal(y.numpy(), np.pad(x.numpy(), ((0, 0), (2, 2)), "reflect"))
    op.release()
    timed = _no_timing(monkeypatch)
    again = _compile_pad(device, (130, 256), (0, 2), (0, 2))      # same class: stored
    assert again.observed[1] == fastest and timed == []
    again.release()


@pytest.mark.parametrize("block", [(256, 4), (64, 8), (32, 2)])
def test_rows_blocks_forced(device, block):
    """Each words-pass block a large padding's timing may choose, forced, against
    numpy.pad (odd shapes: partial blocks and rows)."""
    from vkml.ops.padding import CompiledPadding

    rng = np.random.default_rng(5)
    for shape, start, end, mode in [((3, 37, 300), (0, 1, 3), (1, 2, 5), "reflection"),
                                    ((2, 5, 64), (0, 2, 2), (0, 2, 2), "constant")]:
        x = rng.random(shape).astype(np.float32)
        out = [s + a + b for s, a, b in zip(shape, start, end)]
        op = CompiledPadding(device, dml.PaddingOperatorDesc(
            dml.TensorDesc("float32", shape), dml.TensorDesc("float32", out), mode, 0.0,
            start, end), path="rows", rows_block=block)
        assert op.taken == "rows"
        t, y = device.tensor(x), device.empty(out)
        op.execute([t], [y])
        np.testing.assert_array_equal(y.numpy(), np.pad(
            x, list(zip(start, end)), "reflect" if mode == "reflection" else "constant"))
        op.release()


def test_large_padding_times_the_rows_blocks_alone(device, monkeypatch, large):
    """Where the model puts the rows path alone within LARGE_SPREAD, its blocks (and the
    two-dispatch form) are still timed at the padding's class."""
    from vkml.ops import calibrate

    tuner, fake = large
    monkeypatch.setattr(tuner, "model", lambda device, path, **kw: tuning.Model(
        path.name, {"kernel": [0.0, 0.0, 1e-7], "rows": [0.0, 0.0, 1e-9],
                    "copy": [0.0, 0.0, 1e-7]},
        tuner.key(device, path, tuning.MODEL_CLASS), "stored"))
    fake.update({"rows": 2e-3, "rows-256x4": 2e-3, "rows-256x4-split": 1e-3,
                 **dict.fromkeys(U64_NAMES, 2e-3)})
    op = _compile_pad(device, *BIG)
    entry = tuner.lookup(op.observed[0])
    assert set(entry["times"]) == {"rows", "rows-256x4", "rows-256x4-split"} | (
        U64_NAMES if device.context.features.get("int64") else set())
    assert op.taken == "rows" and not op.full_rows and op.rows_block == (256, 4)
    assert calibrate.LARGE_SPREAD * 1e-9 < 1e-7
    op.release()


@pytest.mark.parametrize("full", [True, False])
def test_rows_full_forced(device, full):
    """The rows path as one whole-rows dispatch (row ends 16-byte aligned, 4- and 8-byte
    elements, each border within a row's first or last word) and as two, forced, against
    numpy.pad: every mode, borders of 0 to 16 bytes, odd blocks (a row's last word at
    several places of its invocation)."""
    from vkml.ops.padding import CompiledPadding

    rng = np.random.default_rng(8)
    cases = [("float32", (3, 5, 24), (1, 2, 2), (0, 1, 2), (64, 4)),
             ("float32", (2, 36), (0, 4), (1, 0), (32, 2)),
             ("float64", (3, 2, 6), (0, 1, 1), (2, 0, 1), (8, 1)),
             ("float32", (4, 28), (1, 1), (0, 3), (256, 8))]
    for i, (dtype, shape, start, end, block) in enumerate(cases):
        x = random_bits(rng, shape, dtype)
        out = [s + a + b for s, a, b in zip(shape, start, end)]
        for mode in _modes_of_case(i):
            op = CompiledPadding(device, dml.PaddingOperatorDesc(
                dml.TensorDesc(dtype, shape), dml.TensorDesc(dtype, out), mode, 3.0, start,
                end), path="rows", rows_block=block, rows_full=full)
            # wrap's borders come from the row's far end: whole rows only where one
            # invocation holds the row
            assert op.taken == "rows" and (op.full_rows == full or mode == "wrap"), \
                (dtype, shape, mode)
            t, y = device.tensor(x), device.empty(out, dtype)
            op.execute([t], [y])
            op.release()
            assert same_bits(y.numpy(), pad_reference(x, start, end, mode, 3)), \
                (dtype, shape, start, end, mode, full)


@pytest.mark.parametrize("full", [True, False])
def test_rows_u64_forced(device, full):
    """The rows path's words stored as u64vec4 pairs (``rows_u64``, int64 devices), whole
    rows and two dispatches, forced, against numpy.pad: rows of odd and even words (a
    row's first word at either place of a pair), blocks of 2, 4 and 6 words, borders at
    several places of an invocation, unaligned rows (bytes and halves), rank 1.  Declined
    without int64 (SwiftShader: one case, the uvec4 stores)."""
    from vkml.ops.padding import CompiledPadding

    rng = np.random.default_rng(12)
    cases = [("float32", (3, 5, 24), (1, 2, 2), (0, 1, 2), (64, 4)),
             ("float32", (2, 36), (0, 4), (1, 0), (32, 2)),
             ("float64", (3, 2, 10), (0, 1, 1), (2, 0, 1), (8, 2)),
             ("float32", (4, 36), (1, 1), (0, 3), (256, 6)),
             ("float32", (3, 2, 52), (0, 1, 2), (1, 0, 2), (128, 6)),
             ("float32", (60,), (2,), (2,), (64, 4)),
             ("uint8", (5, 70), (0, 3), (0, 9), (64, 2)),
             ("float16", (4, 50), (1, 3), (0, 5), (32, 4))]
    int64 = bool(device.context.features.get("int64"))
    for i, (dtype, shape, start, end, block) in enumerate(cases if int64 else cases[:1]):
        x = random_bits(rng, shape, dtype)
        out = [s + a + b for s, a, b in zip(shape, start, end)]
        for mode in _modes_of_case(i) if int64 else PAD_MODES:
            op = CompiledPadding(device, dml.PaddingOperatorDesc(
                dml.TensorDesc(dtype, shape), dml.TensorDesc(dtype, out), mode, 3.0, start,
                end), path="rows", rows_block=block, rows_full=full, rows_u64=True)
            assert op.taken == "rows" and op.u64 == int64, (dtype, shape, mode)
            t, y = device.tensor(x), device.empty(out, dtype)
            op.execute([t], [y])
            op.release()
            assert same_bits(y.numpy(), pad_reference(x, start, end, mode, 3)), \
                (dtype, shape, start, end, mode, full)


def test_large_padding_off_and_far_paths_time_nothing(device, monkeypatch, large):
    """Nothing is timed with VKML_TUNE=off (the documented defaults), nor where the
    model puts only one path within LARGE_SPREAD of its best."""
    from vkml.ops import calibrate

    tuner, _ = large
    timed = _no_timing(monkeypatch)
    monkeypatch.setattr(calibrate, "LARGE_SPREAD", 1.0 - 1e-9)
    op = _compile_pad(device, *BIG)
    assert op.observed[0].path == "padding-test"
    op.release()
    monkeypatch.setattr(tuner, "mode", "off")
    monkeypatch.setattr(tuner, "model", lambda device, path, **kw: tuning.Model(
        path.name, calibrate.DEFAULT_COSTS, tuner.key(device, path, tuning.MODEL_CLASS),
        "default"))
    op = _compile_pad(device, *BIG)
    assert op.observed is None and op.taken == "rows"
    op.release()
    assert timed == []


_CHILD = """
import json, sys
import numpy as np
import vkml
from vkml import tuning
from vkml.ops import calibrate, padding
padding.MODEL = calibrate.padding_model(padding.CompiledPadding, name="padding-test",
                                        shapes={shapes!r}, register=False)
timed = []
real = tuning.Tuner._measure
tuning.Tuner._measure = lambda self, *a, **k: timed.append(a[1].name) or real(self, *a, **k)
x = np.arange(128 * 256, dtype=np.float32).reshape(128, 256)
with vkml.Device({index}) as dev:
    y = vkml.pad(x, [0, 2], [0, 2], "reflection", device=dev)
    src = tuning.model(dev, padding.MODEL).source
assert np.array_equal(y, np.pad(x, ((0, 0), (2, 2)), "reflect"))
print(json.dumps({{"timed": timed, "source": src}}))
"""


def test_second_process_reuses_the_calibration(device, tmp_path):
    import os
    import subprocess
    import sys

    def child():
        env = dict(os.environ, VKML_CACHE_DIR=str(tmp_path), VKML_TUNE="fast",
                   PYTHONPATH=os.pathsep.join(sys.path))
        out = subprocess.run([sys.executable, "-c", _CHILD.format(shapes=SMALL_SHAPES,
                                                                   index=device.index)],
                             env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-4000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert child() == {"timed": ["padding-test"], "source": "stored"}
    assert child() == {"timed": [], "source": "stored"}


def test_packed_path_on_every_device(device):
    """Devices without 8/16-bit storage take the packed-word kernels: force that path."""
    with vkml.Device(device.index, disable_features=["storage8", "storage16"]) as dev:
        rng = np.random.default_rng(11)
        for dtype in ("uint8", "int16", "float16"):
            x = random_bits(rng, (3, 7, 5), dtype)
            got = vkml.pad(x, [1, 2, 3], [2, 1, 0], "reflection", device=dev)
            assert same_bits(got, np.pad(x, [(1, 2), (2, 1), (3, 0)], "reflect"))


def test_staging_path(device):
    """Discrete GPUs keep tensors in device-only memory: the staging path, forced here."""
    with vkml.Device(device.index, force_staging=True) as dev:
        x = np.random.default_rng(0).random((5, 6)).astype(np.float32)
        np.testing.assert_array_equal(vkml.pad(x, [1, 1], [1, 1], "wrap", device=dev),
                                      np.pad(x, 1, "wrap"))


# -- validation: every rule of the page names its field ------------------------------------
def _desc(**kw):
    args = dict(input_tensor=dml.TensorDesc("float32", (1, 1, 4, 4)),
                output_tensor=dml.TensorDesc("float32", (1, 1, 8, 10)),
                padding_mode="constant", padding_value=0.0,
                start_padding=(0, 0, 1, 2), end_padding=(0, 0, 3, 4))
    args.update(kw)
    return dml.PaddingOperatorDesc(**args)


@pytest.mark.parametrize("kw,field", [
    (dict(output_tensor=dml.TensorDesc("float32", (1, 1, 8, 11))), "output_tensor.sizes[3]"),
    (dict(output_tensor=dml.TensorDesc("float16", (1, 1, 8, 10))), "output_tensor.data_type"),
    (dict(output_tensor=dml.TensorDesc("float32", (1, 8, 10))), "output_tensor.sizes"),
    (dict(start_padding=(0, 1, 2)), "start_padding"),
    (dict(end_padding=(0, 0, 3, 4, 0)), "end_padding"),
    (dict(end_padding=(0, 0, 3, -1)), "end_padding[3]"),
    (dict(padding_mode="mirror"), "padding_mode"),
    (dict(output_tensor=dml.TensorDesc("float32", (1, 1, 8, 10), (80, 80, 5, 1))),
     "output_tensor.strides"),
    (dict(input_tensor=None), "input_tensor"),
])
def test_validation_names_the_field(device, kw, field):
    with pytest.raises(ValidationError) as err:
        device.create_operator(_desc(**kw))
    assert f"PaddingOperatorDesc.{field}" in str(err.value)
    # the device stays usable after an error
    assert vkml.pad(np.ones(2, np.float32), [1], [1], device=device).shape == (4,)


def test_padding1_value_rules(device):
    d_in, d_out = dml.TensorDesc("uint8", (2,)), dml.TensorDesc("uint8", (4,))
    with pytest.raises(ValidationError, match="padding_value_data_type"):
        device.create_operator(dml.Padding1OperatorDesc(d_in, d_out, "constant", "int8", 1,
                                                        (1,), (1,)))
    with pytest.raises(ValidationError, match="padding_value"):
        device.create_operator(dml.Padding1OperatorDesc(d_in, d_out, "constant", "uint8", 256,
                                                        (1,), (1,)))


@pytest.mark.parametrize("build,field", [
    (lambda: dml.TensorDesc("float32", (1, 0, 3)), "TensorDesc.sizes[1]"),
    (lambda: dml.TensorDesc("float32", ()), "TensorDesc.sizes"),
    (lambda: dml.TensorDesc("float32", (1,) * 9), "TensorDesc.sizes"),
    (lambda: dml.TensorDesc("float32", (2, 3), (3,)), "TensorDesc.strides"),
    (lambda: dml.TensorDesc("float32", (2, 3), None, 20), "TensorDesc.total_tensor_size_in_bytes"),
    (lambda: dml.TensorDesc("float32", (2, 3), None, None, 3),
     "TensorDesc.guaranteed_base_offset_alignment"),
    (lambda: dml.TensorDesc("complex64", (2,)), "TensorDesc.data_type"),
    (lambda: dml.TensorDesc("float32", (65536, 65536)), "TensorDesc.sizes"),
])
def test_tensor_desc_rules(build, field):
    with pytest.raises(ValidationError) as err:
        build()
    assert field in str(err.value)


def test_calc_buffer_tensor_size():
    """DMLCalcBufferTensorSize, with the page's rounding to 4 bytes."""
    assert dml.calc_buffer_tensor_size("float16", (1, 1, 3, 5)) == 32
    assert dml.calc_buffer_tensor_size("float32", (1, 1, 3, 5), (15, 15, 5, 1)) == 60
    assert dml.calc_buffer_tensor_size("uint8", (2, 3), (0, 1)) == 4
    assert dml.calc_buffer_tensor_size("int64", (2, 3), (6, 2)) == 8 * 11


def test_feature_levels(device):
    assert device.feature_level == dml.FeatureLevel.FL_6_4
    assert _desc(padding_mode="wrap").feature_level() == dml.FeatureLevel.FL_6_4
    assert _desc(padding_mode="symmetric").feature_level() == dml.FeatureLevel.FL_3_0
    assert _desc().feature_level() == dml.FeatureLevel.FL_1_0


def test_bindings_are_checked(device):
    compiled = device.compile_operator(device.create_operator(_desc()))
    small = device.empty((4,), np.float32)
    out = device.empty((80,), np.float32)
    with pytest.raises(ValidationError, match=r"inputs\[0\]"):
        compiled.execute([small], [out])
    with pytest.raises(ValidationError, match="outputs"):
        compiled.execute([device.empty((16,), np.float32)], [])
    compiled.release()

"""Strided copies on glsl/permute.comp (vkml/ops/permute.py): transposes (IDENTITY) and
stepped slices (SLICE1), each choice forced ("texel", "ssbo", and the strided element path
they replace), uvec4 and u64vec4 stores, bit for bit against NumPy on random shapes,
permutations, steps of either sign, offsets and padded outputs with canaries in the gaps;
every data type (the 32-bit ones take the kernel, the others keep the element path but
for rows of whole words, copied as words);
grids past maxComputeWorkGroupCount, bindings past maxStorageBufferRange and inputs past
maxTexelBufferElements."""
from __future__ import annotations

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.ops import permute
from vkml.ops.element_wise import CompiledElementWise
from vkml.ops.join_split_slice import CompiledSlice

from helpers import ALL_DTYPES, random_bits, same_bits

CANARY = 0xA5
STORES = ["uvec4", "u64vec4"]


@pytest.fixture(params=STORES)
def stores(request, device, monkeypatch):
    """Force the store form (u64vec4 needs int64 shaders)."""
    wide = request.param == "u64vec4"
    if wide and not device.features.get("int64"):
        pytest.skip("u64vec4 stores need int64 shaders")
    monkeypatch.setattr(permute, "wide_stores", lambda _device: wide)
    return request.param


def _execute(dev, op, x, out_elems, dtype):
    """Run ``op`` on the flat input ``x`` into an output of ``out_elems`` canaries."""
    try:
        out = dev.empty((out_elems,), dtype)
        out.write(np.full(out_elems * np.dtype(dtype).itemsize, CANARY, np.uint8).view(dtype))
        op.execute([dev.tensor(x.reshape(-1))], [out])
        return out.numpy()
    finally:
        op.release()


def _placed(got, shape, out_st):
    """The elements of ``got`` at the output view (shape, strides) and a mask of the gaps."""
    idx = np.zeros(shape, np.int64)
    for d, (n, s) in enumerate(zip(shape, out_st)):
        idx = idx + (np.arange(n) * s).reshape([-1 if i == d else 1 for i in range(len(shape))])
    gaps = np.ones(got.size, bool)
    gaps[idx.reshape(-1)] = False
    return got[idx], gaps


def _out_strides(rng, shape):
    """Packed strides, or (one draw in three) rows padded by a few elements."""
    pad = int(rng.integers(1, 6)) if rng.integers(3) == 0 else 0
    st, n = [], 1
    for i, s in enumerate(reversed(shape)):
        st.insert(0, n)
        n *= s + (pad if i == 0 else 0)
    return tuple(st), n


def _transpose_case(rng, dtype):
    rank = int(rng.integers(2, 6))
    mult4 = rng.integers(3) > 0          # tiles where p and q are multiples of 4
    shape = tuple(int(4 * rng.integers(1, 6) if mult4 else rng.integers(1, 12))
                  for _ in range(rank))
    return random_bits(rng, shape, dtype), tuple(int(p) for p in rng.permutation(rank))


def _transpose(dev, x, perm, dtype, rng, **kw):
    """IDENTITY reading packed ``x`` through permuted strides into a packed or padded
    output: (the output at its view, NumPy's transpose, the gaps' elements, the operator)."""
    ref = np.transpose(x, perm)
    in_st = [s // x.itemsize for s in x.strides]
    out_st, out_elems = _out_strides(rng, ref.shape)
    desc = dml.ElementWiseIdentityOperatorDesc(
        dml.TensorDesc(dtype, ref.shape, tuple(in_st[p] for p in perm)),
        dml.TensorDesc(dtype, ref.shape, out_st))
    op = CompiledElementWise(dev, dev.create_operator(desc).desc, **kw)
    got = _execute(dev, op, x, out_elems, dtype)
    view, gaps = _placed(got, ref.shape, out_st)
    return view, ref, got[gaps], op


@pytest.mark.parametrize("choice", permute.CHOICES)
@pytest.mark.parametrize("dtype", ["float32", "int32", "uint32"])
def test_transposes(device, stores, choice, dtype):
    """Random transposes of 32-bit elements, each choice forced: NumPy's bits, the
    output's gaps untouched; the kernel taken wherever it applies."""
    rng = np.random.default_rng([permute.CHOICES.index(choice), STORES.index(stores),
                                 len(dtype)])
    kinds, r4 = set(), 0
    for _ in range(12):
        x, perm = _transpose_case(rng, dtype)
        view, ref, gap_bytes, op = _transpose(device, x, perm, dtype, rng, permute=choice)
        assert same_bits(view, ref), (x.shape, perm, op.permuted and op.permuted.geo)
        assert (gap_bytes.view(np.uint8) == CANARY).all()
        if choice == "strided":
            assert op.permuted is None
        elif op.permuted is not None:
            kinds.add(op.permuted.geo["kind"])
            # texel: within the limit
            assert op.permuted.read == choice.split("_")[-1] or choice.endswith("texel")
            # the r4 and tsm kernels take every tile copy of at most four dimensions
            fixed = op.permuted.geo["kind"] in ("tile", "tsm") and len(x.shape) <= 4
            if choice[:3] in ("r4_", "tsm") and fixed:
                assert choice.split("_")[0] in op.permuted.kernel, op.permuted.kernel
                r4 += 1
    if choice != "strided":
        assert "rows" in kinds and kinds & {"tile", "tsm"}, kinds
    assert r4 > 0 or choice[:3] not in ("r4_", "tsm")


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_transpose_every_type(device, dtype):
    """Every data type transposes bit for bit; 32-bit ones on the tile kernel."""
    rng = np.random.default_rng(ALL_DTYPES.index(dtype) + 70)
    x = random_bits(rng, (2, 8, 12, 16), dtype)
    view, ref, gaps, op = _transpose(device, x, (0, 2, 3, 1), dtype, rng, permute="texel")
    assert same_bits(view, ref)
    assert (gaps.view(np.uint8) == CANARY).all()
    assert (op.permuted is not None) == (np.dtype(dtype).itemsize == 4)


def _slice_case(rng, shape):
    """Random SLICE1 window: offsets, sizes, strides of either sign (the last one not 1
    in two draws of three: a stepped row)."""
    offs, sizes, steps = [], [], []
    for d, n in enumerate(shape):
        o = int(rng.integers(0, max(1, n // 4)))
        size = int(rng.integers(max(1, (n - o) // 2), n - o + 1))
        s = int(rng.integers(1, 4)) * (-1 if rng.integers(3) == 0 else 1)
        if d == len(shape) - 1 and rng.integers(3) > 0 and abs(s) == 1:
            s = 2 * s
        offs.append(o)
        sizes.append(size)
        steps.append(s)
    out = tuple(1 + (n - 1) // abs(s) for n, s in zip(sizes, steps))
    return tuple(offs), tuple(sizes), tuple(steps), out


def _numpy_slice(x, offs, sizes, steps):
    idx = []
    for o, n, s in zip(offs, sizes, steps):
        if s > 0:
            idx.append(slice(o, o + n, s))
        else:
            idx.append(slice(o + n - 1, o - 1 if o > 0 else None, s))
    return x[tuple(idx)]


@pytest.mark.parametrize("choice", permute.CHOICES)
def test_stepped_slices(device, stores, choice):
    """Random SLICE1 windows (odd sizes, negative steps, offsets) of 32-bit elements into
    packed or padded outputs, each choice forced: NumPy's bits, the gaps untouched."""
    rng = np.random.default_rng([permute.CHOICES.index(choice), STORES.index(stores), 5])
    taken = 0
    for i in range(12):
        dtype = ["float32", "int32", "uint32"][i % 3]
        shape = tuple(int(rng.integers(1, 40)) for _ in range(int(rng.integers(2, 5))))
        x = random_bits(rng, shape, dtype)
        offs, sizes, steps, out = _slice_case(rng, shape)
        ref = _numpy_slice(x, offs, sizes, steps)
        assert ref.shape == out
        out_st, out_elems = _out_strides(rng, out)
        desc = dml.Slice1OperatorDesc(dml.TensorDesc(dtype, shape),
                                      dml.TensorDesc(dtype, out, out_st), offs, sizes, steps)
        op = CompiledSlice(device, device.create_operator(desc).desc, permute=choice)
        taken += op.permuted is not None
        if choice == "strided":
            assert op.permuted is None
        got = _execute(device, op, x, out_elems, dtype)
        view, gaps = _placed(got, out, out_st)
        assert same_bits(view, ref), (shape, offs, sizes, steps)
        assert (got[gaps].view(np.uint8) == CANARY).all()
    assert taken >= 4 or choice == "strided", taken


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_stepped_slice_every_type(device, dtype):
    """A stride-2 subsample of every data type; the 32-bit ones on the rows kernel."""
    rng = np.random.default_rng(ALL_DTYPES.index(dtype) + 90)
    x = random_bits(rng, (1, 3, 20, 22), dtype)
    y = x[:, :, ::2, ::2]
    desc = dml.Slice1OperatorDesc(dml.TensorDesc(dtype, x.shape), dml.TensorDesc(dtype, y.shape),
                                  (0, 0, 0, 0), x.shape, (1, 1, 2, 2))
    op = CompiledSlice(device, device.create_operator(desc).desc, permute="texel")
    assert (op.permuted is not None) == (np.dtype(dtype).itemsize == 4)
    got = _execute(device, op, x, y.size, dtype)
    assert same_bits(got.reshape(y.shape), y)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_word_rows_every_type(device, dtype):
    """Crops of every data type kept off the copy engine into rows padded by 8 elements:
    rows of whole words on both sides (8, 16 and 64-bit elements too) run the rows or
    span kernel as 32-bit words, rows starting or ending inside a word keep the element
    path; NumPy's bits, the gaps untouched."""
    rng = np.random.default_rng(ALL_DTYPES.index(dtype) + 110)
    es = np.dtype(dtype).itemsize
    x = random_bits(rng, (3, 10, 24), dtype)
    for choice in ("span_texel", "texel", "ssbo"):
        for offs, sizes in (((0, 1, 4), (3, 8, 16)), ((1, 2, 0), (2, 7, 24)),
                            ((0, 0, 1), (3, 9, 21)), ((1, 0, 2), (2, 10, 6))):
            ref = x[tuple(slice(o, o + n) for o, n in zip(offs, sizes))]
            out_st = (sizes[1] * (sizes[2] + 8), sizes[2] + 8, 1)
            out_elems = sizes[0] * out_st[0]
            desc = dml.Slice1OperatorDesc(dml.TensorDesc(dtype, x.shape),
                                          dml.TensorDesc(dtype, ref.shape, out_st), offs,
                                          sizes, (1, 1, 1))
            op = CompiledSlice(device, device.create_operator(desc).desc, path="kernel",
                               permute=choice)
            words = offs[2] * es % 4 == 0 and sizes[2] * es % 4 == 0
            assert (op.permuted is not None) == words, (offs, sizes)
            got = _execute(device, op, x, out_elems, dtype)
            view, gaps = _placed(got, ref.shape, out_st)
            assert same_bits(view, ref), (choice, offs, sizes)
            assert (got[gaps].view(np.uint8) == CANARY).all(), (choice, offs, sizes)


def test_grids_split(device):
    """maxComputeWorkGroupCount lowered: both kinds' grids split along x, y and z."""
    rng = np.random.default_rng(3)
    with vkml.Device(device.index, limits={"maxComputeWorkGroupCount": (1, 3, 2)}) as dev:
        x = random_bits(rng, (3, 4, 24, 40), "float32")
        view, ref, _, op = _transpose(dev, x, (0, 2, 3, 1), "float32", rng, permute="texel")
        assert op.permuted is not None and op.permuted.geo["kind"] == "tile"
        assert same_bits(view, ref)
        # the r4 and shared-memory tiles: more tiles along p and q than the grid takes
        x2 = random_bits(rng, (2, 72, 3, 136), "float32")
        for choice in ("r4_texel", "tsm_ssbo", "tsm_texel"):
            packed = type("Packed", (), {"integers": staticmethod(lambda *a: 1)})  # no pad
            view, ref, _, op = _transpose(dev, x2, (0, 2, 3, 1), "float32", packed,
                                          permute=choice)
            assert op.permuted is not None and choice[:3] in op.permuted.kernel
            assert same_bits(view, ref), choice
        y = x[:, :, 1::3, ::-2]
        desc = dml.Slice1OperatorDesc(dml.TensorDesc("float32", x.shape),
                                      dml.TensorDesc("float32", y.shape), (0, 0, 1, 0),
                                      (3, 4, 23, 40), (1, 1, 3, -2))
        op = CompiledSlice(dev, dev.create_operator(desc).desc, permute="ssbo")
        assert op.permuted is not None and op.permuted.geo["kind"] == "rows"
        got = _execute(dev, op, x, y.size, "float32")
        assert same_bits(got.reshape(y.shape), y)


def test_limits_decline(device):
    """Tensors past maxStorageBufferRange leave the copy to the strided path (windows);
    an input past maxTexelBufferElements is read through a storage buffer."""
    rng = np.random.default_rng(4)
    x = random_bits(rng, (32, 48), "float32")
    align = device._ctx.binding_alignment()
    limits = {"maxStorageBufferRange": x.nbytes // 3 + 4 * align}
    with vkml.Device(device.index, limits=limits) as dev:
        view, ref, _, op = _transpose(dev, x, (1, 0), "float32", rng, permute="texel")
        assert op.permuted is None and op.windows is not None
        assert same_bits(view, ref)
    with vkml.Device(device.index, limits={"maxTexelBufferElements": 64}) as dev:
        view, ref, _, op = _transpose(dev, x, (1, 0), "float32", rng, permute="texel")
        assert op.permuted is not None and op.permuted.read == "ssbo"
        assert same_bits(view, ref)


def test_tuned_choice(device, monkeypatch):
    """With the tuner on, each kind's choice is measured (every candidate runs) and the
    result still right."""
    monkeypatch.setenv("VKML_TUNE", "fast")
    rng = np.random.default_rng(6)
    x = random_bits(rng, (16, 24), "float32")
    view, ref, _, op = _transpose(device, x, (1, 0), "float32", rng)
    assert same_bits(view, ref)
    y = vkml.slice(x, [0, 1], [16, 11], [1, 2], device=device)
    assert same_bits(np.asarray(y), x[:, 1:23:2])


@pytest.mark.parametrize("choice", ["texel", "ssbo"])
def test_crop_on_rows(device, stores, choice):
    """A crop (rows contiguous both sides) kept off the copy engine runs the rows kernel
    at step 1: offsets off and on whole uvec4s, rows of whole and partial eights."""
    rng = np.random.default_rng([STORES.index(stores), len(choice)])
    for offs, sizes in (((0, 8, 8), (5, 24, 24)), ((1, 3, 5), (4, 17, 13)),
                        ((0, 0, 4), (6, 32, 8))):
        x = random_bits(rng, (6, 33, 36), "float32")
        y = x[tuple(slice(o, o + n) for o, n in zip(offs, sizes))]
        desc = dml.Slice1OperatorDesc(dml.TensorDesc("float32", x.shape),
                                      dml.TensorDesc("float32", y.shape), offs, sizes, (1, 1, 1))
        op = CompiledSlice(device, device.create_operator(desc).desc, path="kernel",
                           permute=choice)
        assert op.paths == ["permute"] and op.permuted.geo["kind"] == "rows"
        got = _execute(device, op, x, y.size, "float32")
        assert same_bits(got.reshape(y.shape), y)


def test_forced_choices_are_checked(device):
    """``permute=`` (IDENTITY, SLICE) and a resample's ``path=`` name one of their
    choices; another value is a ValidationError naming the argument, before anything is
    built."""
    from vkml.errors import ValidationError
    from vkml.ops.resample import CompiledResample

    x = dml.TensorDesc("float32", (4, 6))
    y = dml.TensorDesc("float32", (6, 4), (1, 6))
    s = dml.Slice1OperatorDesc(x, dml.TensorDesc("float32", (2, 3)), (0, 0), (4, 6), (2, 2))
    up = dml.Resample1OperatorDesc(dml.TensorDesc("float32", (1, 1, 2, 2)),
                                   dml.TensorDesc("float32", (1, 1, 4, 4)),
                                   scales=(1.0, 1.0, 2.0, 2.0), input_pixel_offsets=(0.5,) * 4,
                                   output_pixel_offsets=(-0.5,) * 4)
    for build, field in (
            (lambda: CompiledElementWise(device, dml.ElementWiseIdentityOperatorDesc(x, y),
                                         permute="tiles"), "permute"),
            (lambda: CompiledSlice(device, device.create_operator(s).desc, permute="tiles"),
             "permute"),
            (lambda: CompiledResample(device, device.create_operator(up).desc,
                                      path="tiles"), "path")):
        with pytest.raises(ValidationError) as err:
            build()
        assert err.value.field == field


def _slice_op(dev, x, offs, sizes, steps, **kw):
    """SLICE1 of packed ``x`` into a packed output: (operator, NumPy's slice)."""
    y = _numpy_slice(x, offs, sizes, steps)
    dt = x.dtype.name
    desc = dml.Slice1OperatorDesc(dml.TensorDesc(dt, x.shape), dml.TensorDesc(dt, y.shape),
                                  offs, sizes, steps)
    return CompiledSlice(dev, dev.create_operator(desc).desc, **kw), y


@pytest.mark.parametrize("choice", ["span_texel", "span_ssbo", "r4_texel", "r4_ssbo"])
def test_span_rows(device, stores, choice):
    """Rows read as uvec4s (the span kernel, forced by its choice): steps 1 and 2 along
    rows whose input starts at each of the four words of a uvec4, odd and even row lengths
    (8, 12 or 16 words an invocation, partial last ones), reversed outer axes; NumPy's
    bits.  The plain choice, a row stride off whole uvec4s or a step of 3 keep the scalar
    rows kernel, also right."""
    rng = np.random.default_rng([STORES.index(stores), len(choice), 11])
    seen = set()
    for width in (36, 40, 52, 100, 132):
        x = random_bits(rng, (3, 5, width), "float32")
        for shift in range(4):
            for step in (1, 2):
                n = (width - shift - 1) // step + 1 - int(rng.integers(0, 3))
                back = bool(rng.integers(2))
                sizes = (3, 4, step * (n - 1) + 1)
                steps = (-1 if back else 1, -1 if back else 1, step)
                op, y = _slice_op(device, x, (0, 1, shift), sizes, steps, path="kernel",
                                  permute=choice)
                pm = op.permuted
                assert pm is not None and "span" in pm.kernel, pm and pm.kernel
                assert pm.span == (step, shift)
                assert ("_r4_" in pm.kernel) == choice.startswith("r4_"), pm.kernel
                seen.add(pm.v)
                got = _execute(device, op, x, y.size, "float32")
                assert same_bits(got.reshape(y.shape), y), (width, shift, step, steps)
                plain, _ = _slice_op(device, x, (0, 1, shift), sizes, steps, path="kernel",
                                     permute=choice[choice.index("_") + 1:])
                assert "rows" in plain.permuted.kernel
                plain.release()
    assert seen == {8, 16, 32}, seen
    for shape, steps in (((3, 5, 37), (1, 1, 2)), ((3, 5, 40), (1, 1, 3))):
        x = random_bits(rng, shape, "float32")
        sizes = (3, 5, shape[-1] - 1)
        op, y = _slice_op(device, x, (0, 0, 1), sizes, steps, path="kernel", permute=choice)
        assert op.permuted is not None and "rows" in op.permuted.kernel
        got = _execute(device, op, x, y.size, "float32")
        assert same_bits(got.reshape(y.shape), y), (shape, steps)


def test_span_chunks(device, stores):
    """The span grid's chunks: one row (a 1-D slice, its partial last chunk looped) and
    rows starting on 8 words (whole chunks, u64vec4 stores where forced), V of 8 and 32;
    NumPy's bits, the gaps past the output untouched."""
    rng = np.random.default_rng([STORES.index(stores), 14])
    for shape, offs, sizes, steps, v in (((203,), (3,), (199,), (2,), 8),
                                         ((1000,), (5,), (990,), (1,), 32),
                                         ((4, 6, 72), (0, 0, 4), (4, 6, 64), (1, 1, 1), 32)):
        x = random_bits(rng, shape, "float32")
        op, y = _slice_op(device, x, offs, sizes, steps, path="kernel", permute="span_texel")
        pm = op.permuted
        assert pm is not None and "span" in pm.kernel and pm.v == v, pm and pm.kernel
        assert pm.kernel.endswith("_u64") == (stores == "u64vec4")
        got = _execute(device, op, x, y.size + 8, "float32")
        assert same_bits(got[:y.size].reshape(y.shape), y), shape
        assert (got[y.size:].view(np.uint8) == CANARY).all(), shape


def test_span_grids_split(device):
    """The span kernel's grid split along x, y and z by a lowered
    maxComputeWorkGroupCount."""
    rng = np.random.default_rng(12)
    with vkml.Device(device.index, limits={"maxComputeWorkGroupCount": (1, 3, 2)}) as dev:
        x = random_bits(rng, (3, 4, 24, 168), "float32")
        op, y = _slice_op(dev, x, (0, 0, 1, 3), (3, 4, 23, 163), (1, 1, 2, 2),
                          permute="span_texel")
        assert op.permuted is not None and op.permuted.span == (2, 3)
        got = _execute(dev, op, x, y.size, "float32")
        assert same_bits(got.reshape(y.shape), y)


def test_span_limits(device):
    """A span copy past maxStorageBufferRange goes to the strided path (windows); one past
    maxTexelBufferElements (counted in uvec4s) reads through a storage buffer."""
    rng = np.random.default_rng(13)
    x = random_bits(rng, (16, 64), "float32")
    align = device._ctx.binding_alignment()
    with vkml.Device(device.index,
                     limits={"maxStorageBufferRange": x.nbytes // 3 + 4 * align}) as dev:
        op, y = _slice_op(dev, x, (0, 2), (16, 61), (1, 2), path="kernel",
                          permute="span_texel")
        assert op.permuted is None
        got = _execute(dev, op, x, y.size, "float32")
        assert same_bits(got.reshape(y.shape), y)
    with vkml.Device(device.index, limits={"maxTexelBufferElements": 64}) as dev:
        op, y = _slice_op(dev, x, (0, 2), (16, 61), (1, 2), path="kernel",
                          permute="span_texel")
        assert op.permuted is not None and op.permuted.read == "ssbo"
        assert "span" in op.permuted.kernel
        got = _execute(dev, op, x, y.size, "float32")
        assert same_bits(got.reshape(y.shape), y)


def test_span_tuning_follows_the_copy(device, monkeypatch):
    """The tuner's span shape carries the copy's step and row length: a crop's rows and a
    stride-2 slice's are classed apart, and the proxy it times copies rows of that step
    and length on the candidate's span kernel (a step-1 proxy never rides the copy
    engine, whose own tuner would decline every candidate)."""
    from vkml import tuning

    asked = []
    real = tuning.choose

    def spy(dev, path, shape, **kw):
        if path is permute.PATH:
            asked.append(dict(shape))
        return real(dev, path, shape, **kw)
    monkeypatch.setattr(tuning, "choose", spy)
    x = dml.TensorDesc("float32", (1, 8, 28, 28))
    for sizes, strides in (((1, 8, 24, 24), (1, 1, 1, 1)), ((1, 8, 14, 14), (1, 1, 2, 2))):
        op = CompiledSlice(device, dml.Slice1OperatorDesc(
            x, dml.TensorDesc("float32", sizes), (0, 0, 0, 4 * (strides[-1] == 1)), sizes,
            strides), path="kernel")
        op.release()
    assert [(s["step"], s["row"]) for s in asked] == [(1, 24), (2, 14)]
    assert permute._class(asked[0]) != permute._class(asked[1])
    for shape in asked:
        for name in ("span_texel", "r4_texel"):
            seq = device.sequence()
            free = permute._run(device, seq, permute.PATH.candidate(name), shape)
            seq.run()
            free()
            seq.close()

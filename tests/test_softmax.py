"""DML_ACTIVATION_SOFTMAX and DML_ACTIVATION_SOFTMAX1 (``vkml.softmax``): against a
float64 NumPy reference and ``torch.softmax`` over ranks 1 to 8 and random axis sets,
float32 and float16 (accumulated in float32), every kernel path ("lane": a row an
invocation, "sg": a row a subgroup, held in registers or streamed, with vec4 or u64vec4
stores; "group": a row a workgroup) and every float32 read forced, strided inputs and
outputs with NaN canaries in the gaps, numerical stability (large values, -inf masks),
windows past maxStorageBufferRange, grids past maxComputeWorkGroupCount, every rule of
the pages, the tuner's path, threads and leaks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import vkml
from vkml import dml, tuning
from vkml.errors import ValidationError

from helpers import assert_no_leaks, operator_cycle, run_into_nan, threads_share_one_operator

T = dml.TensorDesc
S1 = dml.ActivationSoftmax1OperatorDesc
S0 = dml.ActivationSoftmaxOperatorDesc


def reference(x, axes):
    x = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(axis=tuple(axes), keepdims=True))
        return e / e.sum(axis=tuple(axes), keepdims=True)


def _tol(dtype):
    return dict(rtol=2e-5, atol=1e-6) if dtype == "float32" else dict(rtol=2e-3, atol=2e-4)


def _compiled(device, desc, path=None, read=None, **kw):
    from vkml.ops.softmax import CompiledSoftmax

    return CompiledSoftmax(device, device.create_operator(desc).desc, path=path, read=read,
                           **kw)


def _run(device, desc, x_flat, out_elems, path=None, read=None, **kw):
    op = _compiled(device, desc, path, read, **kw)
    return op, run_into_nan(device, op, [x_flat], out_elems, desc.output_tensor.dtype)


def test_page_formula_1d(device):
    """The pages' 1-D formula: f(x[i]) = exp(x[i]) / sum(exp(x[0]), ..., exp(x[j-1]))."""
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    e = np.exp(x.astype(np.float64))
    np.testing.assert_allclose(vkml.softmax(x, device=device), e / e.sum(), rtol=1e-6)
    t = T("float32", (1, 1, 1, 4))
    _, got = _run(device, S0(t, t), x, 4)
    np.testing.assert_allclose(got, e / e.sum(), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("path", ["lane", "sg", "group"])
def test_random_ranks_and_axes(device, budget, dtype, path):
    """Ranks 1 to 8, a random non-empty set of axes, each path forced."""
    rng = np.random.default_rng({"lane": 1, "group": 2, "sg": 3}[path] + (dtype == "float16"))
    for case in range(max(4, budget // 2)):
        rank = 1 + case % 8
        shape = tuple(int(rng.integers(1, 4 if rank > 4 else 8)) for _ in range(rank))
        axes = tuple(int(a) for a in rng.choice(rank, int(rng.integers(1, rank + 1)),
                                                replace=False))
        x = (rng.standard_normal(shape) * 4).astype(dtype)
        t = T(dtype, shape)
        op, got = _run(device, S1(t, t, axes), x, x.size, path=path)
        assert op.path == path
        np.testing.assert_allclose(got.reshape(shape).astype(np.float64), reference(x, axes),
                                   **_tol(dtype), err_msg=f"{shape} {axes}")


@pytest.mark.parametrize("path", ["lane", "sg", "group"])
@pytest.mark.parametrize("read", ["texel4", "ssbo4", "texel", "ssbo"])
@pytest.mark.parametrize("count", [1, 7, 64, 1000])
def test_row_lengths(device, path, read, count):
    """Rows shorter and longer than a workgroup, each float32 read forced ("texel4" and
    "ssbo4" need rows a multiple of 4 long: "texel" otherwise)."""
    rng = np.random.default_rng(count)
    x = (rng.standard_normal((5, count)) * 10).astype(np.float32)
    t = T("float32", x.shape)
    op, got = _run(device, S1(t, t, (1,)), x, x.size, path=path, read=read)
    assert op.read == ("texel" if read in ("texel4", "ssbo4") and count % 4 else read)
    np.testing.assert_allclose(got.reshape(x.shape), reference(x, (1,)), rtol=2e-5, atol=1e-7)


def test_against_pytorch(device):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((2, 3, 5, 7)) * 3).astype(np.float32)
    for dim in range(4):
        want = torch.softmax(torch.from_numpy(x.astype(np.float64)), dim).numpy()
        np.testing.assert_allclose(vkml.softmax(x, dim, device=device), want,
                                   rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(vkml.softmax(x, (-1, -2), device=device),
                               reference(x, (2, 3)), rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("path", ["lane", "sg", "group"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_stability(device, path, dtype):
    """Values whose exp overflows float32 (the maximum is subtracted) and rows with -inf
    (an attention mask), leading ones too; a fully masked row is NaN as in PyTorch."""
    x = np.array([[1000.0, 999.0, 998.0, -1000.0],
                  [-np.inf, -np.inf, 3.0, 4.0],
                  [-np.inf, 0.0, -np.inf, -np.inf],
                  [-60000.0, -60001.0, -60002.0, -60000.5]], dtype)
    t = T(dtype, x.shape)
    _, got = _run(device, S1(t, t, (1,)), x, x.size, path=path)
    want = torch.softmax(torch.from_numpy(x.astype(np.float64)), 1).numpy()
    np.testing.assert_allclose(got.reshape(x.shape).astype(np.float64), want, **_tol(dtype))


@pytest.mark.parametrize("path", ["lane", "sg", "group"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_strides_and_canaries(device, path, dtype):
    """A permuted input with a broadcast (zero-stride) dimension into a padded output
    whose gaps hold NaN canaries."""
    rng = np.random.default_rng(10)
    shape = (3, 4, 5)
    base = (rng.standard_normal((5, 3)) * 3).astype(dtype)      # (W, N) in memory, C broadcast
    x_strides = (1, 0, 3)
    x = np.broadcast_to(base.T[:, None, :], shape)
    out_strides = (4 * 16, 16, 2)
    out_elems = 3 * out_strides[0]
    for axes in ((2,), (0, 2), (1,)):
        desc = S1(T(dtype, shape, x_strides), T(dtype, shape, out_strides), axes)
        _, got = _run(device, desc, base, out_elems, path=path)
        idx = sum(np.arange(s).reshape([-1 if i == d else 1 for i in range(3)]) * st
                  for d, (s, st) in enumerate(zip(shape, out_strides)))
        np.testing.assert_allclose(got[idx].astype(np.float64), reference(x, axes),
                                   **_tol(dtype), err_msg=str(axes))
        gaps = np.ones(out_elems, bool)
        gaps[idx.reshape(-1)] = False
        assert np.isnan(got[gaps].astype(np.float64)).all(), "a write outside the output"


@pytest.mark.parametrize("path", ["lane", "sg", "group"])
def test_windows_and_split_grids(device, path):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 7, 40)).astype(np.float32)
    t = T("float32", x.shape)
    align = device._ctx.binding_alignment()
    for limits, axes in (({"maxStorageBufferRange": 2048 + 4 * align}, (2,)),
                         ({"maxStorageBufferRange": 2048 + 4 * align}, (1,)),
                         ({"maxComputeWorkGroupCount": (2, 2, 2)}, (2,))):
        with vkml.Device(device.index, limits=limits) as small:
            op, got = _run(small, S1(t, t, axes), x, x.size, path=path)
            if "maxStorageBufferRange" in limits:
                assert op.windows is not None and len(op.windows) > 1 and op.read == "ssbo"
            np.testing.assert_allclose(got.reshape(x.shape), reference(x, axes),
                                       rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("path", ["lane", "sg", "group"])
def test_vec4_storage_reads_past_the_texel_limit(device, path):
    """Rows of 4-aligned packed elements whose input exceeds maxTexelBufferElements
    RGBA32F texels read vec4s from the storage buffer ("ssbo4"), the texel4 path's
    arithmetic, by the rule; within it they read texels."""
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((9, 3, 64)) * 5).astype(np.float32)
    t = T("float32", x.shape)
    for limit, want in ((64, "ssbo4"), (1 << 16, "texel4")):
        with vkml.Device(device.index, limits={"maxTexelBufferElements": limit}) as small:
            op, got = _run(small, S1(t, t, (2,)), x, x.size, path=path)
            assert op.read == want and op.path == path
            np.testing.assert_allclose(got.reshape(x.shape), reference(x, (2,)),
                                       rtol=2e-5, atol=1e-7)


def test_row_too_large_for_a_binding(device):
    """One row larger than maxStorageBufferRange cannot be windowed: UnsupportedError."""
    from vkml.errors import UnsupportedError

    align = device._ctx.binding_alignment()
    with vkml.Device(device.index, limits={"maxStorageBufferRange": 1024 + 4 * align}) as small:
        with pytest.raises(UnsupportedError):
            vkml.softmax(np.zeros((2, 4096), np.float32), device=small)
        np.testing.assert_allclose(vkml.softmax(np.zeros((2, 4), np.float32), device=small),
                                   np.full((2, 4), 0.25))


def test_tensor_in_tensor_out(device):
    x = vkml.tensor(np.zeros((2, 4), np.float32), device=device)
    y = vkml.softmax(x)
    assert isinstance(y, vkml.Tensor)
    np.testing.assert_allclose(y.numpy(), np.full((2, 4), 0.25), rtol=1e-7)


def test_tuner_path(device, tmp_path):
    """The path is a registered tunable path whose every candidate runs when measured;
    VKML_TUNE=off gives the rule (group for fewer than GROUP_MAX_ROWS rows of at least
    GROUP_MIN_COUNT elements or rows longer than LANE_MAX_COUNT, else sg for rows of
    SG_MIN_TEXELS texels a lane where the device has subgroup shuffles, else lane)."""
    import importlib

    sm = importlib.import_module("vkml.ops.softmax")
    assert "softmax_path" in tuning.registered_paths()
    c = tuning.Tuner("full", folder=tmp_path, rounds=1).choose(
        device, "softmax_path", {"rows": 16, "count": 40, "dtype": "float32"})
    assert c.source == "measured" and set(c.times) == {"auto", "lane", "sg", "group"}
    t = T("float32", (4, sm.GROUP_MIN_COUNT))
    short = T("float32", (4, 8))
    many = T("float32", (sm.GROUP_MAX_ROWS, sm.GROUP_MIN_COUNT))
    long = T("float32", (sm.GROUP_MAX_ROWS, sm.LANE_MAX_COUNT + 1))
    sg = subgroup_size(device)
    assert sm.SG_MIN_TEXELS * 4 * sg > 8
    # rows of GROUP_MIN_COUNT hold SG_MIN_TEXELS texels a lane on 8- and 4-lane subgroups,
    # not on a GPU's 32 (lane then)
    held = sg and sm.GROUP_MIN_COUNT >= sm.SG_MIN_TEXELS * 4 * sg
    for desc, want in ((S1(t, t, (1,)), "group"), (S1(short, short, (1,)), "lane"),
                       (S1(many, many, (1,)), "sg" if held else "lane"),
                       (S1(long, long, (1,)), "group")):
        op = _compiled(device, desc)
        assert op.path == want
        op.release()
    op = _compiled(device, S1(t, t, (1,)), path="auto")
    assert op.path == "group"
    op.release()


def test_lane_never_takes_rows_past_its_loop_limit(device, monkeypatch):
    """A tuner's "lane" (a class spans a factor of 4 in row length, so its choice may
    come from shorter rows) gives way to the rule for rows longer than LANE_MAX_COUNT;
    the tuner's lane candidate declines such rows and a forced "lane" refuses them."""
    import importlib

    sm = importlib.import_module("vkml.ops.softmax")
    real = tuning.choose
    monkeypatch.setattr(sm.tuning, "choose",
                        lambda dev, path, shape: real(dev, path, shape, force="lane"))
    long = T("float32", (2, sm.LANE_MAX_COUNT + 1))
    fits = T("float32", (2, sm.LANE_MAX_COUNT))
    for desc, want in ((S1(long, long, (1,)), "group"), (S1(fits, fits, (1,)), "lane")):
        op = _compiled(device, desc)
        assert op.path == want
        op.release()
    with pytest.raises(ValidationError) as err:
        _compiled(device, S1(long, long, (1,)), path="lane")
    assert err.value.field == "path"
    lane = next(c for c in sm.PATH.candidates if c.name == "lane")
    with device.sequence(timed=True) as seq, pytest.raises(tuning.Declined):
        sm._path_run(device, seq, lane, {"rows": 2, "count": sm.LANE_MAX_COUNT + 1,
                                         "dtype": "float32"})


def subgroup_size(device) -> int:
    """The "sg" path's subgroup size on ``device`` (0: it has no such path)."""
    f, lim = device._ctx.features, device._ctx.limits
    return lim["subgroupSize"] if f.get("subgroup_shuffle") and f.get("full_subgroups") else 0


@pytest.mark.parametrize("store64", [False, True])
def test_sg_held_and_streamed_rows(device, store64):
    """"sg" rows around the held limit (HOLD_MAX texels a lane): held with vec4 stores,
    with u64vec4 texel-pair stores (rows a multiple of 8, store64, int64 shaders) and
    streamed past it; a row count that leaves a workgroup's last subgroups idle."""
    import importlib

    sm = importlib.import_module("vkml.ops.softmax")
    sg = subgroup_size(device)
    if not sg:
        pytest.skip("no subgroup shuffles in full subgroups")
    if store64 and not device._ctx.features.get("int64"):
        pytest.skip("no int64 shaders")
    most = 4 * sg * sm.HOLD_MAX
    rng = np.random.default_rng(15 + store64)
    for count, held in ((8, True), (12, True), (1000, 1000 <= most), (most - 4, True),
                        (most, True), (most + 8, False)):
        x = (rng.standard_normal((int(rng.integers(1, 12)), count)) * 30).astype(np.float32)
        x[0, count // 2] = -np.inf
        t = T("float32", x.shape)
        op, got = _run(device, S1(t, t, (1,)), x, x.size, path="sg", store64=store64)
        assert (op.path, op.read, op.hold) == ("sg", "texel4", held), count
        assert op.kernel.endswith("_u64") == (held and store64 and count % 8 == 0), count
        np.testing.assert_allclose(got.reshape(x.shape), reference(x, (1,)), rtol=2e-5,
                                   atol=1e-7, err_msg=str(count))
    # rows of the lowest float32 (the row's maximum then equals the value a lane's
    # texels past the row could hold): held rows, their last texels past the row
    for count in (12, 4 * sg + 8, min(1000, most - 8)):
        x = np.full((3, count), np.finfo(np.float32).min, np.float32)
        x[1, 3] = 0.0
        t = T("float32", x.shape)
        op, got = _run(device, S1(t, t, (1,)), x, x.size, path="sg", store64=store64)
        assert op.hold, count
        np.testing.assert_allclose(got.reshape(x.shape), reference(x, (1,)), rtol=2e-5,
                                   atol=1e-7, err_msg=str(count))
    x = (rng.standard_normal((5, 8 * sg)) * 30).astype(np.float32)    # vec4 storage reads
    t = T("float32", x.shape)
    with vkml.Device(device.index, limits={"maxTexelBufferElements": 16}) as small:
        op, got = _run(small, S1(t, t, (1,)), x, x.size, path="sg", store64=store64)
    assert (op.read, op.hold, op.kernel.endswith("_u64")) == ("ssbo4", True, store64)
    np.testing.assert_allclose(got.reshape(x.shape), reference(x, (1,)), rtol=2e-5, atol=1e-7)


def test_sg_without_subgroups_and_past_its_loop_limit(device):
    """A forced "sg" is an UnsupportedError without subgroup shuffles in full subgroups
    and a ValidationError naming the path for rows of more than LANE_MAX_COUNT
    subgroups; the tuner's "sg" gives way to the rule for such rows; a ``store64`` other
    than True / False / None is a ValidationError naming it."""
    import importlib

    from vkml.errors import UnsupportedError

    sm = importlib.import_module("vkml.ops.softmax")
    sg = subgroup_size(device)
    t = T("float32", (3, 64))
    with pytest.raises(ValidationError) as err:
        _compiled(device, S1(t, t, (1,)), path="sg", store64="yes")
    assert err.value.field == "store64"
    if not sg:
        with pytest.raises(UnsupportedError):
            _compiled(device, S1(t, t, (1,)), path="sg")
        return
    long = T("float32", (2, sm.LANE_MAX_COUNT * sg + 4))
    with pytest.raises(ValidationError) as err:
        _compiled(device, S1(long, long, (1,)), path="sg")
    assert err.value.field == "path"
    real = tuning.choose
    try:
        sm.tuning.choose = lambda dev, path, shape: real(dev, path, shape, force="sg")
        op = _compiled(device, S1(long, long, (1,)))
        assert op.path == "group"
        op.release()
    finally:
        sm.tuning.choose = real


# -- validation ---------------------------------------------------------------------------
X = T("float32", (2, 3, 4))


@pytest.mark.parametrize("cls, kw, field", [
    (S1, dict(axes=(3,)), "axes[0]"),
    (S1, dict(axes=(0, 0)), "axes[1]"),
    (S1, dict(axes=()), "axes"),
    (S1, dict(axes=(-1,)), "axes[0]"),
    (S1, dict(axes=(1.0,)), "axes[0]"),
    (S1, dict(input_tensor=T("int32", (2, 3, 4))), "input_tensor.data_type"),
    (S1, dict(output_tensor=T("float16", (2, 3, 4))), "output_tensor.data_type"),
    (S1, dict(output_tensor=T("float32", (2, 3, 5))), "output_tensor.sizes"),
    (S1, dict(output_tensor=T("float32", (2, 3, 4, 1))), "output_tensor.sizes"),
    (S1, dict(output_tensor=T("float32", (2, 3, 4), (12, 0, 1))), "output_tensor.strides"),
    (S1, dict(input_tensor=None), "input_tensor"),
    (S0, dict(), "input_tensor.sizes"),          # effective rank 3 > 2
    (S0, dict(input_tensor=T("float64", (3, 4)), output_tensor=T("float64", (3, 4))),
     "input_tensor.data_type"),
])
def test_rules(device, cls, kw, field):
    args = dict(input_tensor=X, output_tensor=X)
    if cls is S1:
        args["axes"] = (2,)
    args.update(kw)
    with pytest.raises(ValidationError) as info:
        device.create_operator(cls(**args))
    assert info.value.field == f"{cls.__name__}.{field}", str(info.value)
    np.testing.assert_allclose(vkml.softmax(np.zeros(2, np.float32), device=device), [0.5, 0.5])


def test_softmax_effective_rank_and_levels(device):
    """SOFTMAX: leftmost 1s do not count toward the effective rank; feature levels by
    DimensionCount (4 at 1_0, 5 at 2_0, others 3_0); SOFTMAX1 is 5_1."""
    t = T("float32", (1, 1, 3, 4))
    x = np.arange(12, dtype=np.float32)
    _, got = _run(device, S0(t, t), x, 12)
    np.testing.assert_allclose(got.reshape(3, 4), reference(x.reshape(3, 4), (1,)), rtol=2e-5)
    assert S0(t, t).feature_level() == dml.FeatureLevel.FL_1_0
    t5 = T("float32", (1, 1, 1, 3, 4))
    assert S0(t5, t5).feature_level() == dml.FeatureLevel.FL_2_0
    t2 = T("float32", (3, 4))
    assert S0(t2, t2).feature_level() == dml.FeatureLevel.FL_3_0
    assert S1(t2, t2, (1,)).feature_level() == dml.FeatureLevel.FL_5_1


def test_functional_argument_errors(device):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValidationError) as info:
        vkml.softmax(x, 2, device=device)
    assert info.value.field.endswith("axes[0]")
    with pytest.raises(ValidationError):
        vkml.softmax(x, (-3,), device=device)
    with pytest.raises(TypeError):
        vkml.softmax(x, "1", device=device)
    with pytest.raises(ValidationError):
        vkml.softmax(x.astype(np.int32), device=device)


# -- threads, leaks -------------------------------------------------------------------------
def test_threads(device):
    x = np.random.default_rng(12).standard_normal((3, 50)).astype(np.float32)
    t = T("float32", x.shape)
    shared = device.compile_operator(device.create_operator(S1(t, t, (1,))))
    xt = device.tensor(x)
    want = reference(x, (1,))

    def functional(k, i):
        xi = np.random.default_rng(k * 10 + i).standard_normal((2 + k, 3 + i))
        xi = xi.astype(np.float32)
        return np.allclose(vkml.softmax(xi, k % 2, device=device), reference(xi, (k % 2,)),
                           rtol=2e-5, atol=1e-7)

    threads_share_one_operator(device, shared, [xt], want, x.shape, functional,
                               rtol=2e-5, atol=1e-7)


def test_no_leaks(device):
    t = T("float32", (3, 8))
    xt, out = device.tensor(np.ones((3, 8), np.float32)), device.empty((3, 8))
    cycle = operator_cycle(device, S1(t, t, (1,)), [xt], [out])
    assert_no_leaks(device, cycle, warm=20, rounds=100)
    np.testing.assert_allclose(out.numpy(), np.full((3, 8), 0.125))


# -- fuzzer (tests/fuzzing.py): valid and invalid descriptors, canaries ---------------------
from hypothesis import strategies as st  # noqa: E402

from fuzzing import (LAYOUTS, fuzzer, canaries_intact, compiled_or_refused,  # noqa: E402
                     execute_with_canaries, lay_out, padded_output)


@st.composite
def softmax_cases(draw):
    rank = draw(st.integers(1, 5))
    shape = draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank))
    axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    return dict(shape=shape, axes=axes, dtype=draw(st.sampled_from(["float32", "float16"])),
                mutation=draw(st.sampled_from(["none"] * 8 + ["axis", "repeat", "empty",
                                                              "int", "out", "overlap"])),
                layout=draw(st.sampled_from(LAYOUTS)), out_padded=draw(st.booleans()),
                path=draw(st.sampled_from([None, "lane", "sg", "group"])),
                seed=draw(st.integers(0, 2**31)))


def test_fuzz_softmax(device, speed):
    """Random SOFTMAX1 descriptors, one broken rule at a time: valid ones equal the
    reference with every canary intact (after the bound buffers, in the output's gaps),
    invalid ones raise ValidationError naming the field."""
    @fuzzer(speed, softmax_cases())
    def check(case):
        rng = np.random.default_rng(case["seed"])
        m, shape, axes, dtype = case["mutation"], list(case["shape"]), list(case["axes"]), \
            case["dtype"]
        want = {"axis": ["axes[0]"], "repeat": [f"axes[{len(axes)}]"], "empty": ["axes"],
                "int": ["data_type"], "out": ["output_tensor.sizes"],
                "overlap": ["output_tensor.strides"]}.get(m, [])
        out = list(shape)
        if m == "axis":
            axes[0] = len(shape) + int(rng.integers(0, 3))
        if m == "repeat":
            axes.append(axes[0])
        if m == "empty":
            axes = []
        if m == "out":
            out[-1] += 1
        x = rng.uniform(-20, 20, shape).astype(dtype)
        flat, in_strides, x = lay_out(rng, x, case["layout"])
        out_strides, read = padded_output(rng, out, dtype, case["out_padded"])
        if m == "overlap":
            out, out_strides = out + [2], (out_strides or tuple(
                int(np.prod(out[i + 1:])) for i in range(len(out)))) + (0,)
            shape, in_strides = shape + [2], (in_strides or tuple(
                int(np.prod(shape[i + 1:])) for i in range(len(shape)))) + (0,)
        in_type = "int32" if m == "int" else dtype
        desc, compiled = compiled_or_refused(device, lambda: S1(
            T(in_type, shape, in_strides), T(in_type if m == "int" else dtype, out, out_strides),
            tuple(axes)), want)
        if desc is None:
            return
        if case["path"] is not None and (case["path"] != "sg" or subgroup_size(device)):
            compiled.release()
            compiled = _compiled(device, desc, path=case["path"])
        src, dst = execute_with_canaries(device, compiled, desc, flat)
        got, gaps_intact = read(dst)
        np.testing.assert_allclose(got.astype(np.float64), reference(x, axes), **_tol(dtype))
        assert gaps_intact, "wrote into the gaps of a non-packed output"
        assert canaries_intact(src) and canaries_intact(dst), "wrote outside the tensor"

    check()


@pytest.mark.parametrize("path", ["lane", "sg", "group"])
def test_float16_without_16bit_storage(device, path):
    """float16 packed two to a 32-bit word (the device's 16-bit storage turned off)."""
    x = (np.random.default_rng(14).standard_normal((3, 5, 7)) * 4).astype(np.float16)
    t = T("float16", x.shape)
    with vkml.Device(device.index, disable_features=["storage16"]) as dev:
        op, got = _run(dev, S1(t, t, (0, 2)), x, x.size, path=path)
        assert op.kernel == f"softmax_{path}_f16_packed"
    np.testing.assert_allclose(got.reshape(x.shape).astype(np.float64), reference(x, (0, 2)),
                               **_tol("float16"))

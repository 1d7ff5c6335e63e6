"""DML_RESAMPLE / DML_RESAMPLE1 / DML_UPSAMPLE_2D and vkml.resample.

References: a NumPy float64 reference written from RESAMPLE1's page (input coordinate
``x = (o - OutputPixelOffset) / Scale - InputPixelOffset``; nearest ``floor(x + 0.5)``,
linear ``floor(x)``/``floor(x) + 1`` weighted by ``frac(x)``, indices clamped), PyTorch's
``F.interpolate`` (nearest, nearest-exact, linear/bilinear/trilinear, align_corners True
and False) and ONNX Runtime's Resize (coordinate and nearest modes through
``vkml.onnx_resize_geometry``).  Nearest results are input elements bit for bit: the
page's, or its neighbour where x + 0.5 lies within float32 rounding of an integer (a tie
the float32 coordinates may resolve either way).  Linear: float32 within 2e-6 absolute
plus what float32 coordinates move (2^-22 of the coordinate times the largest neighbour
difference: ``coordinate_atol``), float16 one float16 ulp more, 8-bit within 1 (rounding
of a float32 sum).  A fuzzer with canaries (tests/fuzzing.py) at the end.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
import torch.nn.functional as F

import vkml
from vkml import dml
from vkml.errors import ValidationError
from vkml.intmath import ceil_div
from vkml.ops.resample import NEAREST_MODES

from fuzzing import (LAYOUTS, canaries_intact, compiled_or_refused, execute_with_canaries,
                     fuzz_settings, lay_out, padded_output)
from helpers import run_desc, run_two_node_graph, same_bits, strided_view
from helpers import run_in_threads, slow

T = dml.TensorDesc
NEAREST, LINEAR = dml.InterpolationMode.NEAREST_NEIGHBOR, dml.InterpolationMode.LINEAR


def resample_reference(x, out_sizes, linear, scales, ins, outs):
    """RESAMPLE1 from its page, in float64, one dimension after another (separable)."""
    y = np.asarray(x, dtype=np.float64)
    for d, (m, s, io, oo) in enumerate(zip(out_sizes, scales, ins, outs)):
        n = y.shape[d]
        xf = (np.arange(m, dtype=np.float64) - oo) / s - io
        f = np.floor(xf)
        if linear:
            i0 = np.clip(f, 0, n - 1).astype(np.int64)
            i1 = np.clip(f + 1, 0, n - 1).astype(np.int64)
            w = (xf - f).reshape([-1 if k == d else 1 for k in range(y.ndim)])
            y = (1 - w) * np.take(y, i0, axis=d) + w * np.take(y, i1, axis=d)
        else:
            y = np.take(y, np.clip(np.floor(xf + 0.5), 0, n - 1).astype(np.int64), axis=d)
    return y


def nearest_candidates(x, out_sizes, scales, ins, outs):
    """Per dimension the nearest indices, floor(x + 0.5) from the page's formula in
    float64, and the other neighbour where x + 0.5 lies within float32 rounding
    (2^-21 relative) of an integer: the kernel's float32 coordinates may fall either
    side of such a tie (ONNX Runtime's and PyTorch's float32 coordinates too)."""
    cands = []
    for d, (m, s, io, oo) in enumerate(zip(out_sizes, scales, ins, outs)):
        n = x.shape[d]
        xf = (np.arange(m, dtype=np.float64) - oo) / s - io + 0.5
        near = np.floor(xf)
        r = np.round(xf)
        tie = np.abs(xf - r) <= 2.0 ** -21 * (np.abs(xf) + 1)
        other = np.where(tie, np.where(r == near, r - 1, r), near)
        cands.append((np.clip(near, 0, n - 1).astype(np.int64),
                      np.clip(other, 0, n - 1).astype(np.int64)))
    return cands


def assert_nearest(got, x, out_sizes, scales, ins, outs):
    """Nearest results are input elements bit for bit, the page's one or, at a tie
    within float32 rounding, its neighbour."""
    cands = nearest_candidates(x, out_sizes, scales, ins, outs)
    ok = np.zeros(got.shape, bool)
    for combo in range(1 << len(cands)):
        idx = [c[(combo >> d) & 1] for d, c in enumerate(cands)]
        ok |= same_elements(got, x[np.ix_(*idx)])
    assert ok.all(), np.argwhere(~ok)[:5]


def same_elements(a, b):
    u = np.dtype(f"u{a.dtype.itemsize}")
    return a.view(u) == np.ascontiguousarray(b).view(u)


def coordinate_atol(x, out, scales, ins=0.0, outs=0.0):
    """What float32 input coordinates (``o * (1 / s) + b``, two roundings: PyTorch's and
    ONNX Runtime's are float32 too) may move a linear result from the float64 reference:
    a coordinate error of 2^-22 of its magnitude times the largest neighbour difference."""
    mag = max((m + abs(np.max(outs))) / s + abs(np.max(ins)) for m, s in zip(out, scales))
    spread = 2 * float(np.max(np.abs(np.asarray(x, np.float64)))) if np.size(x) else 0.0
    return 2.0 ** -22 * mag * spread


def assert_matches(got, ref, dtype, coord_tol=0.0):
    """Linear results against the float64 reference (nearest: :func:`assert_nearest`)."""
    dt = np.dtype(dtype)
    assert got.dtype == dt and got.shape == ref.shape
    if dt == np.float16:
        ulp = np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64)
        assert np.all(np.abs(got.astype(np.float64) - ref) <= ulp + 2e-6 + coord_tol)
    elif dt.kind in "iu":
        assert np.all(np.abs(got.astype(np.float64) - ref) <= 1 + coord_tol)
    else:
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6 + coord_tol)


def random_data(rng, shape, dtype):
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)
    return (rng.standard_normal(shape) * 2).astype(dtype)


def random_geometry(rng, rank, max_elems):
    while True:
        shape = tuple(int(rng.integers(1, 9)) for _ in range(rank))
        kinds = rng.integers(0, 3, rank)
        # ratios of sizes (ONNX-like), random reals, and scales not matching the sizes
        scales = [float(rng.choice([0.5, 1, 2, 3, 1.5, 0.75])) if k == 0 else
                  float(rng.uniform(0.3, 3.5)) for k in kinds]
        out = tuple(max(1, int(n * s) + int(rng.integers(-1, 2)) * (k == 2))
                    for n, s, k in zip(shape, scales, kinds))
        ins = [float(rng.choice([0, 0.5, 0.25, -0.3, 1.0])) for _ in range(rank)]
        outs = [float(rng.choice([0, -0.5, 0.5, -1.25])) for _ in range(rank)]
        if math.prod(shape) + math.prod(out) * (2 ** rank) <= max_elems:
            return shape, out, scales, ins, outs


@pytest.mark.parametrize("rank", [1, 2, 3, 4])
@pytest.mark.parametrize("dtypes", ["float32", "float16", "int8 uint8"])
@pytest.mark.parametrize("linear", [False, True])
def test_random_against_numpy(device, budget, rank, dtypes, linear):
    rng = np.random.default_rng(rank * 100 + len(dtypes) * 3 + linear)
    for case in range(max(3, budget // 8)):
        dtype = dtypes.split()[case % len(dtypes.split())]
        shape, out, scales, ins, outs = random_geometry(rng, rank, 4000 if budget < 40 else 40000)
        x = random_data(rng, shape, dtype)
        got = vkml.resample(x, scales, sizes=out, mode="linear" if linear else "nearest",
                            input_pixel_offsets=ins, output_pixel_offsets=outs, device=device)
        s32, i32, o32 = (np.float32(v).astype(np.float64) for v in (scales, ins, outs))
        if not linear:
            assert_nearest(got, x, out, s32, i32, o32)
            continue
        ref = resample_reference(x, out, linear, s32, i32, o32)
        assert_matches(got, ref, dtype, coordinate_atol(x, out, scales, ins, outs))


def test_nearest_rounds_halves_up(device):
    """Ties: downsampling by 2 with pixel centres puts x exactly on n + 0.5; DirectML's
    rounding (floor(x + 0.5)) takes n + 1, as PyTorch's nearest-exact."""
    x = np.arange(8, dtype=np.float32)
    got = vkml.resample(x, 0.5, device=device)
    np.testing.assert_array_equal(got, [1, 3, 5, 7])
    # asymmetric x = o / 0.4 - 0 -> 0, 2.5, 5, 7.5 -> 0, 3, 5, 8 (clamped to 7)
    got = vkml.resample(np.arange(8, dtype=np.float32), 0.4, sizes=(4,), input_pixel_offsets=0,
                        output_pixel_offsets=0, device=device)
    np.testing.assert_array_equal(got, [0, 3, 5, 7])


def test_nearest_moves_every_bit(device):
    """Nearest is data movement: NaN payloads, -0 and subnormals of float16 survive."""
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 1 << 16, (3, 5, 7)).astype(np.uint16)
    bits[bits & 0x7C00 == 0x7C00] &= 0xFDFF          # quiet NaNs only: a signalling one
    x = bits.view(np.float16)                          # may be quieted by the conversion
    got = vkml.resample(x, (1, 2, 1.5), device=device)
    ref_idx = resample_reference(np.arange(x.size).reshape(x.shape), got.shape, False,
                                 (1, 2, 1.5), (0.5,) * 3, (-0.5,) * 3).astype(np.int64)
    assert same_bits(got, x.reshape(-1)[ref_idx])


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_against_torch(device, budget, dims):
    rng = np.random.default_rng(dims)
    linear_mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[dims]
    for case in range(max(4, budget // 3)):
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 4))) + tuple(
            int(rng.integers(1, 9)) for _ in range(dims))
        if dims == 3:
            shape = shape[1:]      # 4 dimensions at most: (C, D, H, W) as N = 1
        size = tuple(int(rng.integers(1, 13)) for _ in range(dims))
        x = rng.standard_normal(shape).astype(np.float32)
        tx = torch.from_numpy(x if dims < 3 else x[None])
        keep = x.shape[:len(shape) - dims]
        for tmode, kw in (("nearest", dict(coordinate_transformation_mode="asymmetric",
                                           nearest_mode="floor")),
                          ("nearest-exact", dict(coordinate_transformation_mode="half_pixel",
                                                 nearest_mode="round_prefer_ceil")),
                          (linear_mode, dict(mode="linear")),
                          ((linear_mode, True),
                           dict(mode="linear", coordinate_transformation_mode="align_corners"))):
            if isinstance(tmode, tuple):
                want = F.interpolate(tx, size=size, mode=tmode[0], align_corners=True)
            elif tmode in ("nearest", "nearest-exact"):
                want = F.interpolate(tx, size=size, mode=tmode)
            else:
                want = F.interpolate(tx, size=size, mode=tmode, align_corners=False)
            want = want.numpy().reshape(keep + size)
            got = vkml.resample(x, sizes=keep + size, device=device, **kw)
            if tmode in ("nearest", "nearest-exact"):
                np.testing.assert_array_equal(got, want, err_msg=str((shape, size, tmode)))
            else:
                np.testing.assert_allclose(got, want, rtol=0, atol=3e-6,
                                           err_msg=str((shape, size, tmode)))


def _onnx_resize(x, sizes, mode, ctm, nearest_mode):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode,
                            coordinate_transformation_mode=ctm, nearest_mode=nearest_mode)
    graph = helper.make_graph(
        [node], "r", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("sizes", TensorProto.INT64, (len(sizes),), list(sizes))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


CTMS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
        "tf_half_pixel_for_nn", "half_pixel_symmetric"]


@pytest.mark.parametrize("ctm", CTMS)
def test_against_onnxruntime(device, ctm):
    pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(len(ctm))
    cases = [((1, 2, 4, 6), (1, 2, 8, 3)), ((1, 1, 8, 8), (1, 1, 4, 4)),
             ((2, 3, 5, 7), (2, 3, 1, 10)), ((1, 1, 6, 9), (1, 1, 9, 4)),
             # float32's o * a + b puts some exact ties and integers a hair below them
             ((1, 1, 3, 2), (1, 1, 19, 25)), ((1, 1, 2, 6), (1, 1, 42, 74))]
    if ctm == "half_pixel_symmetric":
        # ONNX Runtime's own float arithmetic puts integers below themselves here (3 -> 19
        # floor: row 9 reads 0 where the formula gives exactly 1); vkml follows the
        # formula, test_onnx_nearest_indices_exact
        cases = cases[:4]
    for shape, sizes in cases:
        x = rng.standard_normal(shape).astype(np.float32)
        for nm in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
            want = _onnx_resize(x, sizes, "nearest", ctm, nm)
            got = vkml.resample(x, sizes=sizes, coordinate_transformation_mode=ctm,
                                nearest_mode=nm, device=device)
            np.testing.assert_array_equal(got, want, err_msg=str((shape, sizes, nm)))
        if ctm != "tf_half_pixel_for_nn":
            want = _onnx_resize(x, sizes, "linear", ctm, "round_prefer_floor")
            got = vkml.resample(x, sizes=sizes, mode="linear",
                                coordinate_transformation_mode=ctm, device=device)
            np.testing.assert_allclose(got, want, rtol=0, atol=3e-6,
                                       err_msg=str((shape, sizes)))


@pytest.mark.parametrize("ctm", CTMS)
def test_onnx_nearest_indices_exact(ctm):
    """Every nearest mode's indices, as the kernel computes them in float32 from
    ``onnx_resize_geometry``, equal ONNX's formula in exact rational arithmetic over
    random sizes and known hard ones (a dimension of scale 1 and the same size is a copy, as ONNX Runtime
    runs it)."""
    from fractions import Fraction
    from vkml.onnx.lower import _nearest_kernel, _nearest_onnx
    rng = np.random.default_rng(len(ctm))
    # sizes where float32 put ties or integers a hair below themselves before the nudge
    sizes = [(2, 25), (3, 19), (2, 42), (6, 74), (3, 74), (4, 75), (14, 23), (7, 46)]
    sizes += [tuple(p) for p in rng.integers(1, 80, size=(60, 2))]
    for nm in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
        for n_in, n_out in sizes:
            g = tuple(v[0] for v in vkml.onnx_resize_geometry(
                (n_in,), (n_out,), coordinate_transformation_mode=ctm, nearest_mode=nm))
            got = _nearest_kernel(np.arange(n_out), n_in, *g)
            want = (np.arange(n_out) if g == (1.0, 0.0, 0.0) else
                    _nearest_onnx(n_in, n_out, Fraction(n_out, n_in), ctm, nm))
            np.testing.assert_array_equal(got, want, err_msg=str((nm, n_in, n_out)))


def test_onnx_mapping_refuses_what_it_cannot_express():
    with pytest.raises(ValidationError, match="coordinate_transformation_mode"):
        vkml.onnx_resize_geometry((4,), (8,), coordinate_transformation_mode="tf_crop_and_resize")
    with pytest.raises(ValidationError, match="nearest_mode"):
        vkml.onnx_resize_geometry((4,), (8,), nearest_mode="nearest")
    s, i, o = vkml.onnx_resize_geometry((4, 5), (8, 5), coordinate_transformation_mode="asymmetric",
                                        nearest_mode="floor")
    # floor: half a pixel, less the eps towards its ties; scale 1: a copy
    assert s == (2.0, 1.0) and i == (0.5 - 1 / 32, 0.0) and o == (0.0, 0.0)


@pytest.mark.parametrize("kind", ["padded", "broadcast", "permuted"])
@pytest.mark.parametrize("linear", [False, True])
def test_strided_tensors(device, kind, linear):
    rng = np.random.default_rng(len(kind) + linear)
    shape, out = (2, 3, 5, 6), (2, 4, 9, 4)
    flat, strides, logical = strided_view(rng, shape, "float32", kind)
    logical = np.nan_to_num(logical.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    flat = np.nan_to_num(flat, nan=0.0, posinf=0.0, neginf=0.0).clip(-1e3, 1e3)
    logical = np.lib.stride_tricks.as_strided(flat, shape, [s * 4 for s in strides])
    ost = (4 * 9 * 5 + 7, 9 * 5, 5, 1)                 # padded output rows
    scales, ins, outs = (1, 4 / 3, 1.8, 0.7), (0.5,) * 4, (-0.5,) * 4
    desc = dml.Resample1OperatorDesc(T("float32", shape, strides), T("float32", out, ost),
                                     LINEAR if linear else NEAREST, scales, ins, outs)
    raw = run_desc(device, desc, flat)
    got = np.lib.stride_tricks.as_strided(raw, out, [s * 4 for s in ost])
    ref = resample_reference(np.array(logical), out, linear, np.float32(scales), ins, outs)
    atol = coordinate_atol(logical, out, scales, 0.5, 0.5) + 2e-6 if linear else 0
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=atol)


def test_resample_desc_is_resample1_with_pixel_centres(device):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    for mode in (NEAREST, LINEAR):
        a = run_desc(device, dml.ResampleOperatorDesc(
            T("float32", x.shape), T("float32", (2, 3, 7, 9)), mode, (1, 1, 1.4, 2.25)), x)
        b = run_desc(device, dml.Resample1OperatorDesc(
            T("float32", x.shape), T("float32", (2, 3, 7, 9)), mode, (1, 1, 1.4, 2.25),
            (0.5,) * 4, (-0.5,) * 4), x)
        assert np.array_equal(a, b)


@pytest.mark.parametrize("rank", [4, 5])
@pytest.mark.parametrize("linear", [False, True])
def test_upsample_2d_against_torch(device, rank, linear):
    rng = np.random.default_rng(rank + 2 * linear)
    shape = (2, 3, 5, 7) if rank == 4 else (1, 2, 3, 4, 5)
    x = rng.standard_normal(shape).astype(np.float32)
    sh, sw = 3, 2
    out = shape[:-2] + (shape[-2] * sh, shape[-1] * sw)
    desc = dml.Upsample2dOperatorDesc(T("float32", shape), T("float32", out), (sw, sh),
                                      LINEAR if linear else NEAREST)
    got = run_desc(device, desc, x).reshape(out)
    tx = torch.from_numpy(x.reshape((-1,) + shape[-3:]) if rank == 5 else x)
    if rank == 5:      # bilinear over H and W only: each depth slice on its own
        tx = tx.reshape(-1, 1, *shape[-2:])
    if linear:
        want = F.interpolate(tx, scale_factor=(sh, sw), mode="bilinear", align_corners=False)
    else:
        want = F.interpolate(tx, scale_factor=(sh, sw), mode="nearest")
    want = want.numpy().reshape(out)
    np.testing.assert_allclose(got, want, rtol=0, atol=3e-6 if linear else 0)


def _check_functional_both_modes(device, x, out, dtype):
    """``vkml.resample(x, sizes=out)`` nearest and linear (half-pixel offsets) against the
    references."""
    scales = [o / i for i, o in zip(x.shape, out)]
    s32 = np.float32(scales).astype(np.float64)
    half = ((0.5,) * len(out), (-0.5,) * len(out))
    for linear in (False, True):
        got = vkml.resample(x, sizes=out, mode="linear" if linear else "nearest", device=device)
        if not linear:
            assert_nearest(got, x, out, s32, *half)
            continue
        ref = resample_reference(x, out, linear, s32, *half)
        assert_matches(got, ref, dtype, coordinate_atol(x, out, scales, 0.5))


def test_windows_beyond_max_storage_buffer_range(device):
    rng = np.random.default_rng(13)
    with vkml.Device(device.index, limits={"maxStorageBufferRange": 4096}) as small:
        for dtype, shape, out in (("float32", (2, 3, 20, 30), (2, 3, 31, 47)),
                                  ("float16", (3, 20, 30), (2, 9, 70)),
                                  ("uint8", (4, 50, 60), (5, 70, 33))):
            _check_functional_both_modes(small, random_data(rng, shape, dtype), out, dtype)


def test_grids_beyond_max_workgroup_count(device):
    rng = np.random.default_rng(17)
    with vkml.Device(device.index, limits={"maxComputeWorkGroupCount": (1, 3, 2)}) as dev:
        for shape, out in (((2, 3, 7, 60), (3, 4, 9, 700)), ((5, 4, 3), (7, 6, 5))):
            x = rng.standard_normal(shape).astype(np.float32)
            _check_functional_both_modes(dev, x, out, "float32")


@pytest.mark.parametrize("read", ["ssbo", "texel"])
def test_wide_stores(device, read, monkeypatch):
    """float32's u64vec4 stores (forced on, int64 devices): the same bits as the vec4
    stores, rows of whole and partial 8s, outputs at offsets of 4 and 8 (padded rows),
    windows (maxStorageBufferRange lowered) and split grids."""
    import importlib
    mod = importlib.import_module("vkml.ops.resample")
    if not device.features.get("int64"):
        pytest.skip("u64vec4 stores need int64 shaders")
    rng = np.random.default_rng(29)
    cases = [((1, 4, 14, 14), (1, 4, 28, 28), None), ((2, 3, 9, 13), (2, 3, 17, 28), None),
             ((1, 2, 7, 10), (1, 2, 14, 20), (2 * 14 * 24, 14 * 24, 24, 1)),
             ((1, 2, 7, 10), (1, 2, 14, 20), (2 * 14 * 28, 14 * 28, 28, 1))]
    limits = {"maxStorageBufferRange": 4096, "maxComputeWorkGroupCount": (1, 3, 2)}
    with vkml.Device(device.index, limits=limits) as small:
        for dev in (device, small):
            for shape, out, out_st in cases:
                x = rng.standard_normal(shape).astype(np.float32)
                y = T("float32", out, out_st)
                for mode in (NEAREST, LINEAR):
                    desc = dml.Resample1OperatorDesc(T("float32", shape), y, mode,
                                                     (1.0, 1.0) + tuple(o / i for i, o in
                                                                        zip(shape[2:], out[2:])),
                                                     (0.5,) * 4, (-0.5,) * 4)
                    got = {}
                    for wide in (False, True):
                        monkeypatch.setattr(mod, "wide_stores", lambda _d, w=wide: w)
                        op = mod.CompiledResample(dev, desc, read=read, path="general")
                        assert op.kernel.endswith("_u64") == wide
                        flat = run_desc(dev, desc, x, compiled=op)
                        got[wide] = np.lib.stride_tricks.as_strided(
                            flat, out, [4 * s for s in y.element_strides])
                    assert same_bits(got[True], got[False]), (shape, out, out_st, mode)
                    view = got[True]
                    ref = resample_reference(x, out, mode == LINEAR,
                                             np.float32([1, 1, out[2] / shape[2],
                                                         out[3] / shape[3]]),
                                             (0.5,) * 4, (-0.5,) * 4)
                    if mode == LINEAR:
                        assert_matches(np.ascontiguousarray(view), ref, "float32", 1e-6)


@pytest.mark.parametrize("read", ["ssbo", "texel"])
def test_read_paths_and_packed_storage(device, read):
    """Both float32 read paths, and float16/8-bit through 32-bit words on a device
    opened without 16/8-bit storage (SwiftShader's case on lavapipe)."""
    from vkml.ops.resample import CompiledResample

    rng = np.random.default_rng(23)
    x = rng.standard_normal((2, 5, 9)).astype(np.float32)
    desc = dml.Resample1OperatorDesc(T("float32", x.shape), T("float32", (3, 7, 13)), LINEAR,
                                     (1.3, 1.5, 1.45), (0.5, 0, 0.25), (-0.5, 0, 0.5))
    op = CompiledResample(device, desc, read=read)
    assert op.read == read or read == "texel" and op.read == "ssbo"
    ref = resample_reference(x, (3, 7, 13), True, np.float32((1.3, 1.5, 1.45)), (0.5, 0, 0.25),
                             (-0.5, 0, 0.5))
    assert_matches(run_desc(device, desc, x, compiled=op).reshape(3, 7, 13), ref, "float32")
    with vkml.Device(device.index, disable_features=["storage16", "storage8"]) as dev:
        for dtype in ("float16", "int8", "uint8"):
            xi = random_data(rng, (3, 5, 7), dtype)
            for linear in (False, True):
                got = vkml.resample(xi, (1, 1.7, 0.6), mode="linear" if linear else "nearest",
                                    device=dev)
                s32 = np.float32((1, 1.7, 0.6)).astype(np.float64)
                if not linear:
                    assert_nearest(got, xi, got.shape, s32, (0.5,) * 3, (-0.5,) * 3)
                    continue
                ref = resample_reference(xi, got.shape, linear, s32, (0.5,) * 3, (-0.5,) * 3)
                assert_matches(got, ref, dtype)


def test_tensor_in_tensor_out(device):
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    t = vkml.tensor(x, device=device)
    y = vkml.resample(t, 2)
    assert isinstance(y, vkml.Tensor) and y.shape == (4, 4)
    np.testing.assert_array_equal(y.numpy(), np.repeat(np.repeat(x, 2, 0), 2, 1))


def test_graph_node(device):
    x, mid, y = T("float32", (1, 2, 3, 4)), T("float32", (1, 2, 6, 8)), T("float32", (1, 2, 6, 8))
    a = np.random.default_rng(3).standard_normal((1, 2, 3, 4)).astype(np.float32)
    got = run_two_node_graph(device, dml.ResampleOperatorDesc(x, mid, LINEAR, (1, 1, 2, 2)),
                             dml.ActivationReluOperatorDesc(mid, y), [a], (1, 2, 6, 8))
    want = np.maximum(resample_reference(a, (1, 2, 6, 8), True, (1, 1, 2, 2), (0.5,) * 4,
                                         (-0.5,) * 4), 0)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_no_leak_and_threads(device):
    desc = dml.ResampleOperatorDesc(T("float32", (2, 3, 4)), T("float32", (2, 6, 8)), LINEAR,
                                    (1, 2, 2))
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    want = resample_reference(x, (2, 6, 8), True, (1, 2, 2), (0.5,) * 3, (-0.5,) * 3)
    xt, y = device.tensor(x), device.empty((2, 6, 8), np.float32)

    def cycle():
        c = device.compile_operator(device.create_operator(desc))
        c.execute([xt], [y])
        c.release()
    cycle()
    base = device.memory_stats()["used"]
    for _ in range(50):
        cycle()
    assert device.memory_stats()["used"] == base
    np.testing.assert_allclose(y.numpy(), want, rtol=0, atol=2e-6)

    errors = []

    def work(k):
        xs = (x + k).astype(np.float32)
        for _ in range(5):
            got = vkml.resample(xs, (1, 2, 2), mode="linear", device=device)
            np.testing.assert_allclose(got, want + k, rtol=0, atol=1e-5)
    run_in_threads(work, errors)
    assert not errors, errors


# -- validation -------------------------------------------------------------------------
def _desc(cls=dml.Resample1OperatorDesc, **kw):
    args = dict(input_tensor=T("float32", (1, 2, 4, 4)), output_tensor=T("float32", (1, 2, 8, 8)),
                interpolation_mode=NEAREST, scales=(1, 1, 2, 2),
                input_pixel_offsets=(0.5,) * 4, output_pixel_offsets=(-0.5,) * 4)
    if cls is dml.ResampleOperatorDesc:
        args.pop("input_pixel_offsets")
        args.pop("output_pixel_offsets")
    args.update(kw)
    return cls(**args)


@pytest.mark.parametrize("kw,field", [
    (dict(input_tensor=T("float32", (1, 1, 2, 4, 4)),
          output_tensor=T("float32", (1, 1, 2, 8, 8)), scales=(1,) * 5), "input_tensor.sizes"),
    (dict(output_tensor=T("float32", (2, 8, 8))), "output_tensor.sizes"),
    (dict(input_tensor=T("int32", (1, 2, 4, 4)), output_tensor=T("int32", (1, 2, 8, 8))),
     "input_tensor.data_type"),
    (dict(output_tensor=T("float16", (1, 2, 8, 8))), "output_tensor.data_type"),
    (dict(output_tensor=T("float32", (1, 2, 8, 8), (128, 64, 0, 1))), "output_tensor.strides"),
    (dict(input_tensor=None), "input_tensor"),
    (dict(interpolation_mode=7), "interpolation_mode"),
    (dict(scales=(1, 1, 2)), "scales"),
    (dict(scales=(1, 1, 0, 2)), "scales[2]"),
    (dict(scales=(1, 1, 2, -1)), "scales[3]"),
    (dict(scales=(1, 1, 2, float("nan"))), "scales[3]"),
    (dict(scales=(1, float("inf"), 2, 2)), "scales[1]"),
    (dict(scales=(1, 1, 2, 1e39)), "scales[3]"),
    (dict(scales=2), "scales"),
])
@pytest.mark.parametrize("cls", [dml.Resample1OperatorDesc, dml.ResampleOperatorDesc])
def test_validation_names_the_field(device, kw, field, cls):
    with pytest.raises(ValidationError) as err:
        device.create_operator(_desc(cls, **kw))
    assert f"{cls.__name__}.{field}" in str(err.value)
    # the device stays usable
    np.testing.assert_array_equal(vkml.resample(np.ones(2, np.float32), 2, device=device),
                                  np.ones(4, np.float32))


@pytest.mark.parametrize("kw,field", [
    (dict(input_pixel_offsets=(0.5,) * 3), "input_pixel_offsets"),
    (dict(output_pixel_offsets=(0.5,) * 5), "output_pixel_offsets"),
    (dict(input_pixel_offsets=(0.5, 0.5, float("nan"), 0.5)), "input_pixel_offsets[2]"),
    (dict(output_pixel_offsets=(0, 0, 0, float("-inf"))), "output_pixel_offsets[3]"),
])
def test_resample1_offsets_validation(device, kw, field):
    with pytest.raises(ValidationError) as err:
        device.create_operator(_desc(**kw))
    assert f"Resample1OperatorDesc.{field}" in str(err.value)


@pytest.mark.parametrize("kw,field", [
    (dict(scale_size=(0, 2)), "scale_size.width"),
    (dict(scale_size=(2, 0)), "scale_size.height"),
    (dict(scale_size=(2, 2**31)), "scale_size.height"),
    (dict(scale_size=(2,)), "scale_size"),
    (dict(output_tensor=T("float32", (1, 2, 8, 7))), "output_tensor.sizes[3]"),
    (dict(output_tensor=T("float32", (1, 3, 8, 8))), "output_tensor.sizes[1]"),
    (dict(input_tensor=T("float32", (2, 4, 4)), output_tensor=T("float32", (2, 8, 8))),
     "input_tensor.sizes"),
    (dict(input_tensor=T("int8", (1, 2, 4, 4)), output_tensor=T("int8", (1, 2, 8, 8))),
     "input_tensor.data_type"),
    (dict(output_tensor=T("float16", (1, 2, 8, 8))), "output_tensor.data_type"),
    (dict(interpolation_mode="cubic"), "interpolation_mode"),
])
def test_upsample_2d_validation(device, kw, field):
    args = dict(input_tensor=T("float32", (1, 2, 4, 4)), output_tensor=T("float32", (1, 2, 8, 8)),
                scale_size=(2, 2), interpolation_mode=NEAREST)
    args.update(kw)
    with pytest.raises(ValidationError) as err:
        device.create_operator(dml.Upsample2dOperatorDesc(**args))
    assert f"Upsample2dOperatorDesc.{field}" in str(err.value)


def test_feature_levels():
    assert _desc().feature_level() == dml.FeatureLevel.FL_2_1
    assert _desc(dml.ResampleOperatorDesc).feature_level() == dml.FeatureLevel.FL_2_0
    assert _desc(input_tensor=T("float32", (4, 4)), output_tensor=T("float32", (8, 8)),
                 scales=(2, 2), input_pixel_offsets=(0, 0),
                 output_pixel_offsets=(0, 0)).feature_level() == dml.FeatureLevel.FL_5_1
    assert _desc(input_tensor=T("uint8", (1, 2, 4, 4)),
                 output_tensor=T("uint8", (1, 2, 8, 8))).feature_level() == dml.FeatureLevel.FL_6_2


def test_functional_argument_errors(device):
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(TypeError):
        vkml.resample(x, device=device)
    with pytest.raises(ValidationError, match="sizes"):
        vkml.resample(x, sizes=(2, 4, 1), device=device)
    with pytest.raises(ValidationError, match="scales"):
        vkml.resample(x, (2, 0), device=device)
    with pytest.raises(ValidationError, match="data_type"):
        vkml.resample(x.astype(np.float64), 2, device=device)
    with pytest.raises(ValidationError, match="coordinate_transformation_mode"):
        vkml.resample(x, 2, input_pixel_offsets=0, coordinate_transformation_mode="asymmetric",
                      device=device)
    with pytest.raises(ValidationError, match="mode"):
        vkml.resample(x, 2, mode="cubic", device=device)


def test_dxdispatch_descs(device):
    """DxDispatch model files' RESAMPLE, RESAMPLE1 and UPSAMPLE_2D descs (PascalCase
    fields, ScaleCount / DimensionCount, DML_SIZE_2D) build the descriptors."""
    from bench.dxdispatch.descs import build_desc

    t = lambda s: {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT32", "Sizes": s}   # noqa: E731
    up = build_desc("UPSAMPLE_2D", {"InputTensor": t([1, 2, 3, 4]),
                                    "OutputTensor": t([1, 2, 6, 12]),
                                    "ScaleSize": {"Width": 3, "Height": 2},
                                    "InterpolationMode": "DML_INTERPOLATION_MODE_LINEAR"})
    rs = build_desc("RESAMPLE", {"InputTensor": t([1, 2, 3, 4]), "OutputTensor": t([1, 2, 6, 12]),
                                 "InterpolationMode": "DML_INTERPOLATION_MODE_LINEAR",
                                 "ScaleCount": 4, "Scales": [1.0, 1.0, 2.0, 3.0]})
    r1 = build_desc("RESAMPLE1", {"InputTensor": t([1, 2, 3, 4]), "OutputTensor": t([1, 2, 6, 12]),
                                  "InterpolationMode": "DML_INTERPOLATION_MODE_NEAREST_NEIGHBOR",
                                  "DimensionCount": 4, "Scales": [1.0, 1.0, 2.0, 3.0],
                                  "InputPixelOffsets": [0.5] * 4,
                                  "OutputPixelOffsets": [-0.5] * 4})
    x = np.random.default_rng(2).standard_normal((1, 2, 3, 4)).astype(np.float32)
    assert np.array_equal(run_desc(device, up, x), run_desc(device, rs, x))
    want = np.repeat(np.repeat(x, 2, 2), 3, 3)
    assert np.array_equal(run_desc(device, r1, x).reshape(want.shape), want)


def test_tuner_read_candidates_run(device):
    """The tunable path ``resample_read``: each candidate records and runs a shape."""
    import importlib

    from vkml import tuning

    mod = importlib.import_module("vkml.ops.resample")
    desc = dml.ResampleOperatorDesc(T("float32", (1, 2, 5, 6)), T("float32", (1, 2, 10, 12)),
                                    NEAREST, (1, 1, 2, 2))
    shape = mod.read_shape(desc)
    assert mod._read_class(shape).startswith("mode 0 rank 4")
    for cand in mod.READ_PATH.candidates:
        with device.context.sequence() as seq:
            free = mod._read_run(device, seq, cand, shape)
            seq.run()
            free()
    assert tuning.registered_paths()["resample_read"] is mod.READ_PATH


# -- fuzzer ------------------------------------------------------------------------------
@st.composite
def resample_cases(draw):
    rank = draw(st.integers(1, 4))
    shape = [draw(st.integers(1, 6)) for _ in range(rank)]
    scales = [draw(st.sampled_from([0.5, 1.0, 2.0, 3.0, 0.75, 1.7, 0.4])) for _ in range(rank)]
    out = [max(1, int(n * s) + draw(st.integers(-1, 1))) for n, s in zip(shape, scales)]
    return dict(shape=shape, out=out, scales=scales,
                ins=[draw(st.sampled_from([0.0, 0.5, 0.25, -1.0])) for _ in range(rank)],
                outs=[draw(st.sampled_from([0.0, -0.5, 0.5, 2.0])) for _ in range(rank)],
                linear=draw(st.booleans()),
                dtype=draw(st.sampled_from(["float32", "float16", "int8", "uint8"])),
                mutation=draw(st.sampled_from(["none"] * 8 + ["scale0", "int32", "rank5",
                                                              "count", "nan", "type"])),
                layout=draw(st.sampled_from(LAYOUTS)), out_padded=draw(st.booleans()),
                seed=draw(st.integers(0, 2**31)))


def test_fuzz_resample(device, speed):
    """Fuzzed RESAMPLE1 descriptors (tests/fuzzing.py): 1-4 dimensions, scales, offsets,
    both modes, the four data types, non-packed layouts (NaN gaps), padded outputs with
    canaries, and one broken rule at a time."""
    @fuzz_settings(speed)
    @given(resample_cases())
    def check(case):
        rng = np.random.default_rng(case["seed"])
        m, dtype = case["mutation"], case["dtype"]
        shape, out, scales = list(case["shape"]), list(case["out"]), list(case["scales"])
        ins, outs = list(case["ins"]), list(case["outs"])
        want = {"scale0": ["scales[0]"], "int32": ["data_type"], "rank5": ["sizes"],
                "count": ["scales"], "nan": ["input_pixel_offsets[0]"],
                "type": ["output_tensor.data_type"]}.get(m, [])
        out_dtype = dtype
        if m == "scale0":
            scales[0] = 0.0
        elif m == "int32":
            dtype = out_dtype = "int32"
        elif m == "rank5":
            shape, out = [1] + shape + [1] * (4 - len(shape)), [1] + out + [1] * (4 - len(out))
            scales, ins, outs = [1.0] * 5, [0.0] * 5, [0.0] * 5
        elif m == "count":
            scales = scales + [1.0]
        elif m == "nan":
            ins[0] = float("nan")
        elif m == "type":
            out_dtype = "float32" if dtype != "float32" else "float16"
        x = random_data(rng, shape, dtype)
        flat, in_strides, x = lay_out(rng, x, case["layout"])
        out_strides, read = padded_output(rng, out, out_dtype, case["out_padded"])
        desc, compiled = compiled_or_refused(device, lambda: dml.Resample1OperatorDesc(
            T(dtype, shape, in_strides), T(out_dtype, out, out_strides),
            LINEAR if case["linear"] else NEAREST, scales, ins, outs), want)
        if desc is None:
            return
        src, dst = execute_with_canaries(device, compiled, desc, flat)
        got, gaps_intact = read(dst)
        s32, i32, o32 = (np.float32(v).astype(np.float64) for v in (scales, ins, outs))
        if case["linear"]:
            ref = resample_reference(x, out, True, s32, i32, o32)
            assert_matches(got, ref, dtype, coordinate_atol(x, out, scales, ins, outs))
        else:
            assert_nearest(got, x, out, s32, i32, o32)
        assert gaps_intact, "wrote into the gaps of a non-packed output"
        assert canaries_intact(src) and canaries_intact(dst), "wrote outside the tensor"

    check()


# -- nearest by integer factors: the broadcast copy (vkml/ops/resample.py's module doc) --

def _copy_taken(op) -> bool:
    return op.copy is not None or op.inner is not None


def _repeat(x, factors):
    """NumPy's nearest resample by integer factors: each element repeated s times."""
    for d, s in enumerate(factors):
        x = np.repeat(x, s, axis=d)
    return x


def _run_both_paths(device, desc, flat):
    """(copy path's output, general kernel's output, whether the copy ran), flat."""
    from vkml.ops.resample import CompiledResample
    op = CompiledResample(device, desc, path="copy")
    taken = _copy_taken(op)
    # the element-wise IDENTITY exactly where the last dimension is not resampled
    assert op.inner is None or desc.output_tensor.sizes[-1] == desc.input_tensor.sizes[-1]
    assert op.copy is None or desc.output_tensor.sizes[-1] != desc.input_tensor.sizes[-1]
    got = run_desc(device, desc, flat, compiled=op)
    general = CompiledResample(device, desc, path="general")
    assert not _copy_taken(general)
    return got, run_desc(device, desc, flat, compiled=general), taken


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "uint8"])
def test_integer_factors_copy_against_general_and_numpy(device, dtype):
    """Scales 2, 3, mixed (2 on H, 1 on W; 1 on H, 3 on W) and 1, ranks 1 to 4, rows of
    whole uvec4s (the quad reads) and not, pixel centres (DML's default offsets) and
    ONNX's asymmetric floor offsets: the copy runs (an element-wise IDENTITY where the
    last factor is 1, else the rows kernel for 32-bit types), bit for bit the general
    kernel's output and NumPy's repeat."""
    rng = np.random.default_rng(len(dtype))
    cases = [((2, 3, 5, 8), (1, 1, 2, 2)), ((1, 2, 4, 7), (1, 1, 3, 3)),
             ((2, 3, 6, 5), (1, 1, 2, 1)), ((3, 4, 12), (1, 1, 3)), ((2, 9), (2, 2)),
             ((7,), (4,)), ((2, 3, 4, 4), (1, 1, 1, 1)), ((1, 2, 3, 16), (2, 1, 2, 8)),
             ((1, 1, 1, 1), (1, 1, 5, 4))]
    for shape, factors in cases:
        x = random_data(rng, shape, dtype)
        out = tuple(n * s for n, s in zip(shape, factors))
        want = _repeat(x, factors)
        # pixel centres; x = o / s shifted by 0.5 - 1 / (4 s) (ONNX's asymmetric floor)
        for ins, outs in (((0.5,) * len(shape), (-0.5,) * len(shape)),
                          (tuple(0.5 - 0.25 / f for f in factors), (0.0,) * len(shape))):
            desc = dml.Resample1OperatorDesc(T(dtype, shape), T(dtype, out), NEAREST,
                                             tuple(map(float, factors)), ins, outs)
            got, general, taken = _run_both_paths(device, desc, x)
            assert taken == (np.dtype(dtype).itemsize == 4 or factors[-1] == 1), (shape, factors)
            assert same_bits(got, general), (shape, factors, ins)
            assert same_bits(got.reshape(out), want), (shape, factors, ins)


@pytest.mark.parametrize("ctm", CTMS)
def test_integer_factors_copy_only_where_the_map_is_o_div_s(device, ctm):
    """Every ONNX coordinate/nearest mode at factors 2 and 3 (and 2 on H only): the copy
    runs exactly where ONNX's index map (exact rational arithmetic) is ``o // s`` along
    every dimension -- asymmetric floor, half_pixel round_prefer_floor among them, not
    asymmetric round_prefer_ceil or align_corners -- and the output equals ONNX's
    formula either way."""
    from fractions import Fraction
    from vkml.onnx.lower import _nearest_onnx
    from vkml.ops.resample import CompiledResample
    rng = np.random.default_rng(len(ctm) + 7)
    seen = set()
    for shape, out in [((1, 2, 4, 8), (1, 2, 8, 16)), ((1, 2, 3, 4), (1, 2, 9, 12)),
                       ((2, 1, 5, 6), (2, 1, 10, 6))]:
        x = rng.standard_normal(shape).astype(np.float32)
        for nm in NEAREST_MODES:
            maps = [np.arange(o) if i == o else
                    _nearest_onnx(i, o, Fraction(o, i), ctm, nm) for i, o in zip(shape, out)]
            expect = all(np.array_equal(m, np.arange(o) // (o // i))
                         for m, i, o in zip(maps, shape, out))
            geo = vkml.onnx_resize_geometry(shape, out, coordinate_transformation_mode=ctm,
                                            nearest_mode=nm)
            desc = dml.Resample1OperatorDesc(T("float32", shape), T("float32", out), NEAREST,
                                             *geo)
            op = CompiledResample(device, desc, path="copy")
            assert _copy_taken(op) == expect, (shape, out, nm)
            seen.add(expect)
            got = run_desc(device, desc, x, compiled=op).reshape(out)
            np.testing.assert_array_equal(got, x[np.ix_(*maps)], err_msg=str((shape, nm)))
    if ctm in ("asymmetric", "half_pixel"):
        assert seen == {True, False}       # both kinds met: the test can tell them apart


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("kind", ["padded", "broadcast", "permuted"])
def test_integer_factors_copy_strided_tensors(device, dtype, kind):
    """Strided inputs (padded rows: the quad reads decline; a broadcast dimension;
    permuted: rows not contiguous) into padded output rows: the copy against the general
    kernel and NumPy."""
    rng = np.random.default_rng(len(kind) + len(dtype))
    for shape, factors in (((2, 3, 4, 8), (1, 1, 2, 2)), ((2, 3, 5, 6), (1, 1, 3, 1))):
        flat, strides, logical = strided_view(rng, shape, dtype, kind)
        out = tuple(n * s for n, s in zip(shape, factors))
        ost = (out[1] * out[2] * (out[3] + 4) + 3, out[2] * (out[3] + 4), out[3] + 4, 1)
        desc = dml.Resample1OperatorDesc(T(dtype, shape, strides), T(dtype, out, ost),
                                         NEAREST, tuple(map(float, factors)),
                                         (0.5,) * 4, (-0.5,) * 4)
        got, general, taken = _run_both_paths(device, desc, flat)
        assert taken == (dtype == "float32" or factors[-1] == 1)
        view, gview = (np.lib.stride_tricks.as_strided(a, out, [s * a.itemsize for s in ost])
                       for a in (got, general))
        assert same_bits(view, gview), (kind, shape, factors)
        assert same_bits(view, _repeat(logical, factors)), (kind, shape, factors)


def test_integer_factors_copy_declines_linear_weights(device):
    """Linear with non-zero weights keeps the general kernel; linear at scale 1 (every
    weight zero) is a copy."""
    from vkml.ops.resample import CompiledResample
    lin = dml.Resample1OperatorDesc(T("float32", (1, 1, 4, 8)), T("float32", (1, 1, 8, 16)),
                                    LINEAR, (1.0, 1.0, 2.0, 2.0), (0.5,) * 4, (-0.5,) * 4)
    same = dml.Resample1OperatorDesc(T("float32", (1, 1, 4, 8)), T("float32", (1, 1, 4, 8)),
                                     LINEAR, (1.0,) * 4, (0.5,) * 4, (-0.5,) * 4)
    with CompiledResample(device, lin, path="copy") as a, \
            CompiledResample(device, same, path="copy") as b:
        assert not _copy_taken(a) and _copy_taken(b)


def test_integer_factors_copy_read_paths_and_limits(device):
    """The rows kernel's storage-buffer reads (quad and scalar) where the input passes
    maxTexelBufferElements, grids split past maxComputeWorkGroupCount, and the general
    kernel where a tensor passes maxStorageBufferRange: each against NumPy's repeat."""
    from vkml.ops.resample import CompiledResample
    rng = np.random.default_rng(31)
    cases = [((2, 3, 6, 8), (1, 1, 2, 2), "ssbo4"), ((2, 3, 5, 7), (1, 1, 3, 3), "ssbo"),
             ((3, 4, 40, 64), (1, 1, 2, 2), "ssbo4")]
    limits = [({"maxTexelBufferElements": 16}, True),
              ({"maxTexelBufferElements": 16, "maxComputeWorkGroupCount": (1, 3, 2)}, True),
              ({"maxStorageBufferRange": 4096}, False)]
    for lim, taken in limits:
        with vkml.Device(device.index, limits=lim) as dev:
            for shape, factors, read in cases:
                x = rng.standard_normal(shape).astype(np.float32)
                out = tuple(n * s for n, s in zip(shape, factors))
                desc = dml.Resample1OperatorDesc(T("float32", shape), T("float32", out),
                                                 NEAREST, tuple(map(float, factors)),
                                                 (0.5,) * 4, (-0.5,) * 4)
                op = CompiledResample(dev, desc, path="copy")
                big = 4 * math.prod(out) > lim.get("maxStorageBufferRange", 2 ** 40)
                assert (op.copy is not None) == (taken or not big), (lim, shape)
                assert op.copy is None or op.copy.read == read, (lim, shape)
                got = run_desc(dev, desc, x, compiled=op).reshape(out)
                assert same_bits(got, _repeat(x, factors)), (lim, shape, factors)


# -- the rows kernel (glsl/resample_rows.comp): the last dimension upsampled by 2 --

def _rows_case(device, desc, flat, path="rows"):
    """(forced path's op, its output, the general kernel's output), flat."""
    from vkml.ops.resample import CompiledResample
    op = CompiledResample(device, desc, path=path)
    got = run_desc(device, desc, flat, compiled=op)
    general = CompiledResample(device, desc, path="general")
    assert general.path == "general"
    return op, got, run_desc(device, desc, flat, compiled=general)


def _check_rows(got, general, x, out, linear, scales, ins, outs, dtype="float32"):
    """Nearest: the general kernel's bits and the page's elements; linear: within a
    float32 rounding of the general kernel (the rows kernel combines the input rows
    first) and the float64 reference."""
    s32, i32, o32 = (np.float32(v).astype(np.float64) for v in (scales, ins, outs))
    if linear:
        tol = 4 * np.finfo(np.float32).eps * max(1.0, float(np.max(np.abs(x))))
        np.testing.assert_allclose(got, general, rtol=0, atol=tol)
        ref = resample_reference(x, out, True, s32, i32, o32)
        assert_matches(got.reshape(out), ref, dtype, coordinate_atol(x, out, scales, ins, outs))
    else:
        assert same_bits(got, general)
        assert_nearest(got.reshape(out), x, out, s32, i32, o32)


ROWS_CASES = [  # (input shape, output shape): the last dimension 2x, the others anything
    ((2, 3, 5, 8), (2, 3, 10, 16)), ((1, 2, 7, 12), (1, 2, 21, 24)),
    ((2, 3, 6, 4), (2, 3, 6, 8)), ((1, 3, 9, 20), (1, 3, 4, 40)), ((3, 5, 8), (3, 10, 16)),
    ((5, 36), (11, 72)), ((1, 64, 14, 28), (1, 64, 28, 56)), ((2, 1, 1, 4), (2, 1, 2, 8))]


@pytest.mark.parametrize("linear", [False, True])
def test_rows_against_general_and_numpy(device, linear):
    """The rows kernel forced, at pixel centres (DML's default offsets: ONNX half_pixel)
    and asymmetric offsets (x = o / 2): the other dimensions scaled by 1, 2, 3, down or
    odd, rows of whole input quads, ranks 2 to 4, partial last invocations (rows of 1 or
    3 quads) -- taken (nearest: storing the 1, 2 or 3 output rows of an input row at
    once), nearest bit for bit the general kernel, linear within a float32 rounding of
    it, both against the float64 reference."""
    rng = np.random.default_rng(41 + linear)
    mode = LINEAR if linear else NEAREST
    for shape, out in ROWS_CASES:
        x = rng.standard_normal(shape).astype(np.float32)
        scales = tuple(o / i for i, o in zip(shape, out))
        n = len(shape)
        for ins, outs in (((0.5,) * n, (-0.5,) * n), ((0.0,) * n, (0.0,) * n)):
            desc = dml.Resample1OperatorDesc(T("float32", shape), T("float32", out), mode,
                                             scales, ins, outs)
            op, got, general = _rows_case(device, desc, x)
            # nearest asymmetric rounds x = k + 0.5 up: not o // 2, so not the rows kernel;
            # linear needs the dimension before the last interpolated (not of size 1 or
            # scale 1)
            expect = (ins[0] == 0.5 or linear) and (not linear or 1 < shape[-2] != out[-2])
            assert (op.path == "rows") == expect, (shape, out, ins)
            if expect and not linear:   # o // s along H: one invocation stores s rows
                rep = out[-2] // shape[-2] if out[-2] % shape[-2] == 0 else 1
                assert op.rows["rep_h"] == rep, (shape, out)
            _check_rows(got, general, x, out, linear, scales, ins, outs)


PAIR_CASES = [  # (input shape, output shape): both of the last two dimensions 2x
    ((2, 3, 5, 8), (2, 3, 10, 16)), ((1, 2, 7, 12), (1, 2, 14, 24)), ((3, 2, 4), (3, 4, 8)),
    ((5, 8), (10, 16)), ((1, 3, 2, 20), (1, 3, 4, 40)), ((1, 16, 9, 28), (1, 16, 18, 56))]


@pytest.mark.parametrize("offset", [0.5, 0.0, 0.75, 1.0, 1.7])
def test_rows_pair_against_general_and_numpy(device, offset):
    """Linear 2x along both rows and columns: the rows kernel's PAIR mode (two output
    rows an invocation from three input rows) at input offsets along H giving H[j] of
    (-1, 0) weighted (0.75, 0.25) (pixel centres), (0, 0) (0.0), (-1, 0) weighted (0.5,
    0) (0.75), (-1, -1) (1.0), and 1.7 (H[0] = -2: PAIR declines, one row an invocation
    runs); odd and even H (the first and last rows clamped), ranks 2 to 4, rows of 2, 3
    and 7 quads.  Against the general kernel (within a float32 rounding) and the float64
    reference, and against path="rows1" (one output row an invocation, never PAIR)."""
    rng = np.random.default_rng(53 + int(10 * offset))
    for shape, out in PAIR_CASES:
        n = len(shape)
        x = rng.standard_normal(shape).astype(np.float32)
        scales = tuple(o / i for i, o in zip(shape, out))
        ins = (0.5,) * (n - 2) + (offset, 0.5)
        outs = (-0.5,) * n
        desc = dml.Resample1OperatorDesc(T("float32", shape), T("float32", out), LINEAR,
                                         scales, ins, outs)
        op, got, general = _rows_case(device, desc, x)
        assert op.path == "rows" and op.rows["pair"] == (offset != 1.7), (shape, offset)
        if op.rows["pair"]:
            assert op.kernel.startswith("resample_rows_pair_")
            h = {0.5: (-1, 0), 0.0: (0, 0), 0.75: (-1, 0), 1.0: (-1, -1)}[offset]
            assert op.rows["h"] == h, (shape, offset)
        _check_rows(got, general, x, out, True, scales, ins, outs)
        single, got1, _ = _rows_case(device, desc, x, path="rows1")
        assert single.path == "rows" and not single.rows["pair"]
        assert single.kernel.startswith("resample_rows_lin_")
        _check_rows(got1, general, x, out, True, scales, ins, outs)


@pytest.mark.parametrize("linear", [False, True])
def test_rows_walk_down_rows(device, linear):
    """An invocation walking down several input rows (nearest: ``walk=`` forced 1, 2, 3,
    8, the count the largest divisor of the input rows up to it; PAIR: up to PAIR_ROWS
    pairs of output rows, likewise) and storing whole vectors without the partial store
    (FULL: rows of an even number of quads and output rows on 8 elements) or with it
    (rows of 1, 3 or 7 quads): nearest bit for bit the general kernel, linear within a
    float32 rounding of it, both against the float64 reference."""
    import importlib
    mod = importlib.import_module("vkml.ops.resample")
    rng = np.random.default_rng(61 + linear)
    mode = LINEAR if linear else NEAREST
    for h, w in ((1, 8), (5, 12), (6, 16), (7, 28), (8, 4), (12, 8), (16, 56), (11, 24)):
        if linear and h == 1:
            continue                      # H not interpolated: not the rows kernel
        shape, out = (2, 3, h, w), (2, 3, 2 * h, 2 * w)
        x = rng.standard_normal(shape).astype(np.float32)
        desc = dml.Resample1OperatorDesc(T("float32", shape), T("float32", out), mode,
                                         (1.0, 1.0, 2.0, 2.0), (0.5,) * 4, (-0.5,) * 4)
        for walk in ((None,) if linear else (1, 2, 3, 8)):
            op = mod.CompiledResample(device, desc, path="rows", walk=walk)
            assert op.path == "rows", (shape, walk)
            plan = op.rows
            most = mod.PAIR_ROWS if linear else walk
            k = max(d for d in range(1, most + 1) if h % d == 0)
            want = (2 * k, 1) if plan["pair"] else (2, k)
            assert (plan["rep_h"], plan["rows_k"]) == want, (shape, walk)
            assert plan["full"] == (w // 4 % mod.ROWS_Q == 0), (shape, walk)
            got = run_desc(device, desc, x, compiled=op)
            general = run_desc(device, desc, x, compiled=mod.CompiledResample(
                device, desc, path="general"))
            _check_rows(got, general, x, out, linear, (1.0, 1.0, 2.0, 2.0), (0.5,) * 4,
                        (-0.5,) * 4)


def test_rows_weights_frozen_per_map(device):
    """The rows kernel's weights (WT[j] along the row, WH[j] along the dimension before
    for PAIR) are frozen into each pipeline: resamples of one shape whose offsets give
    different period-2 maps along W and H, run one after the other on one device, each
    get their own weights (those of :func:`rows_phases`, the general kernel's) and match
    the general kernel and the float64 reference; rows of whole quad pairs (FULL) and of
    3 quads, PAIR and one row an invocation (H 3x)."""
    from vkml.ops.resample import CompiledResample, rows_phases
    rng = np.random.default_rng(67)
    for shape, out in [((1, 4, 8, 16), (1, 4, 16, 32)), ((2, 3, 5, 12), (2, 3, 10, 24)),
                       ((1, 2, 4, 8), (1, 2, 12, 16))]:
        x = rng.standard_normal(shape).astype(np.float32)
        scales = tuple(o / i for i, o in zip(shape, out))
        seen = set()
        for off_w in (0.5, 0.0, 0.75, 0.25, 0.125):
            for off_h in (0.5, 0.0, 0.75):
                ins, outs = (0.5, 0.5, off_h, off_w), (-0.5,) * 4
                desc = dml.Resample1OperatorDesc(T("float32", shape), T("float32", out),
                                                 LINEAR, scales, ins, outs)
                op, got, general = _rows_case(device, desc, x, path=None)
                assert op.path == "rows", (shape, ins)
                (_, wt0), (_, wt1) = rows_phases(op)
                pair = rows_phases(op, 2) if op.rows["pair"] else ((0, 0.0), (0, 0.0))
                assert op.rows["pair"] == (out[2] == 2 * shape[2]), (shape, ins)
                assert op.rows["w"] == (wt0, wt1, pair[0][1], pair[1][1]), (shape, ins)
                seen.add(op.rows["w"])
                _check_rows(got, general, x, out, True, scales, ins, outs)
        # W's five maps (H 3x: weights along W only), PAIR times H's three
        assert len(seen) == (15 if out[2] == 2 * shape[2] else 5), seen


def test_rows_pair_declines(device):
    """PAIR only for linear with the dimension before the last exactly 2x and of period
    2: H 2x + 1, 3x, halved, scale 1, size 1, and nearest keep one output row an
    invocation (or leave the rows kernel), still correct."""
    rng = np.random.default_rng(59)
    cases = [((1, 2, 5, 8), (1, 2, 11, 16), LINEAR), ((1, 2, 4, 8), (1, 2, 12, 16), LINEAR),
             ((1, 2, 8, 8), (1, 2, 4, 16), LINEAR), ((1, 2, 4, 8), (1, 2, 4, 16), LINEAR),
             ((1, 2, 1, 8), (1, 2, 2, 16), LINEAR), ((1, 2, 4, 8), (1, 2, 8, 16), NEAREST)]
    for shape, out, mode in cases:
        x = rng.standard_normal(shape).astype(np.float32)
        scales = tuple(o / i for i, o in zip(shape, out))
        desc = dml.Resample1OperatorDesc(T("float32", shape), T("float32", out), mode,
                                         scales, (0.5,) * 4, (-0.5,) * 4)
        op, got, general = _rows_case(device, desc, x)
        assert op.rows is None or not op.rows["pair"], (shape, out, mode)
        assert not op.kernel.startswith("resample_rows_pair_")
        if op.path == "rows":
            _check_rows(got, general, x, out, mode == LINEAR, scales, (0.5,) * 4, (-0.5,) * 4)


def test_rows_only_where_the_map_agrees(device):
    """The rows kernel declines every geometry whose last dimension's map is not its
    own, and the rule then runs the copy or the general kernel, still correct: scale 2
    with offsets moving D out of {-1, 0} or the weights off period 2, align_corners,
    scale 3 or 1 along the last dimension, rows not of whole quads (nearest: pairs),
    linear with an outer
    dimension interpolated or the one before the last not, float16 / 8-bit types."""
    rng = np.random.default_rng(43)
    cases = [  # (shape, out, mode, ins, outs, dtype)
        ((1, 2, 4, 8), (1, 2, 8, 16), LINEAR, (0.5, 0.5, 0.5, 1.7), (-0.5,) * 4, "float32"),
        ((1, 2, 4, 8), (1, 2, 8, 16), NEAREST, (0.5, 0.5, 0.5, 1.25), (-0.5,) * 4, "float32"),
        ((1, 2, 4, 8), (1, 2, 8, 16), LINEAR, (0.0,) * 4, (0.0, 0.0, 0.0, 0.3), "float32"),
        ((1, 2, 4, 8), (1, 2, 8, 24), LINEAR, (0.5,) * 4, (-0.5,) * 4, "float32"),
        ((1, 2, 4, 8), (1, 2, 8, 8), LINEAR, (0.5,) * 4, (-0.5,) * 4, "float32"),
        ((1, 2, 4, 6), (1, 2, 8, 12), LINEAR, (0.5,) * 4, (-0.5,) * 4, "float32"),
        ((1, 2, 4, 7), (1, 2, 8, 14), NEAREST, (0.5,) * 4, (-0.5,) * 4, "float32"),
        ((1, 2, 4, 8), (1, 4, 8, 16), LINEAR, (0.5,) * 4, (-0.5,) * 4, "float32"),
        ((1, 2, 4, 8), (1, 2, 4, 16), LINEAR, (0.5,) * 4, (-0.5,) * 4, "float32"),
        ((8,), (16,), LINEAR, (0.5,), (-0.5,), "float32"),
        ((1, 2, 4, 8), (1, 2, 8, 16), NEAREST, (0.5,) * 4, (-0.5,) * 4, "float16"),
        ((1, 2, 4, 8), (1, 2, 8, 16), LINEAR, (0.5,) * 4, (-0.5,) * 4, "float16"),
        ((1, 2, 4, 8), (1, 2, 8, 16), NEAREST, (0.5,) * 4, (-0.5,) * 4, "uint8")]
    for shape, out, mode, ins, outs, dtype in cases:
        if dtype == "float16" and not device.features.get("storage16"):
            continue
        x = random_data(rng, shape, dtype)
        scales = tuple(o / i for i, o in zip(shape, out))
        desc = dml.Resample1OperatorDesc(T(dtype, shape), T(dtype, out), mode, scales, ins,
                                         outs)
        op, got, general = _rows_case(device, desc, x)
        assert op.path == "general", (shape, out, mode, ins, outs, dtype)
        rule, got, _ = _rows_case(device, desc, x, path=None)
        assert rule.path != "rows"
        s32, i32, o32 = (np.float32(v).astype(np.float64) for v in (scales, ins, outs))
        if mode == LINEAR:
            ref = resample_reference(x, out, True, s32, i32, o32)
            assert_matches(got.reshape(out), ref, dtype,
                           coordinate_atol(x, out, scales, ins, outs))
        else:
            assert_nearest(got.reshape(out), x, out, s32, i32, o32)


@pytest.mark.parametrize("ctm", CTMS)
def test_rows_onnx_modes(device, ctm):
    """Every ONNX coordinate mode (nearest: every nearest_mode) resizing H by 2 or 3 and W
    by 2: the rule takes the rows kernel exactly where ONNX's map along W (exact rational
    arithmetic) is its period-2 map -- linear: half_pixel, pytorch_half_pixel,
    asymmetric, half_pixel_symmetric, tf_half_pixel_for_nn; nearest: where it is o // 2
    -- and matches ONNX's formula either way."""
    from fractions import Fraction
    from vkml.onnx.lower import _nearest_onnx
    from vkml.ops.resample import CompiledResample
    rng = np.random.default_rng(len(ctm) + 11)
    for shape, out in [((1, 2, 4, 8), (1, 2, 8, 16)), ((1, 2, 3, 12), (1, 2, 9, 24))]:
        x = rng.standard_normal(shape).astype(np.float32)
        w_in, w_out = shape[-1], out[-1]
        for mode, nm in [("linear", "round_prefer_floor")] + [("nearest", m)
                                                              for m in NEAREST_MODES]:
            geo = vkml.onnx_resize_geometry(shape, out, coordinate_transformation_mode=ctm,
                                            nearest_mode=nm, mode=mode)
            desc = dml.Resample1OperatorDesc(T("float32", shape), T("float32", out),
                                             LINEAR if mode == "linear" else NEAREST, *geo)
            op = CompiledResample(device, desc)
            if mode == "nearest":
                m = _nearest_onnx(w_in, w_out, Fraction(w_out, w_in), ctm, nm)
                expect = np.array_equal(m, np.arange(w_out) // 2)
            else:
                expect = _onnx_linear_periodic(w_in, w_out, ctm)
            assert (op.path == "rows") == expect, (shape, out, mode, nm)
            got = run_desc(device, desc, x, compiled=op).reshape(out)
            if mode == "nearest":
                maps = [np.arange(o) if i == o else _nearest_onnx(i, o, Fraction(o, i), ctm, nm)
                        for i, o in zip(shape, out)]
                np.testing.assert_array_equal(got, x[np.ix_(*maps)], err_msg=str((shape, nm)))
            else:
                ref = resample_reference(x, out, True, *(np.float32(v).astype(np.float64)
                                                          for v in geo))
                assert_matches(got, ref, "float32", coordinate_atol(x, out, *geo))


def _onnx_linear_periodic(n_in, n_out, ctm) -> bool:
    """Whether ONNX's linear map along a dimension of n_in -> n_out = 2 n_in (exact
    rational coordinates, indices clamped) has period 2: output 2k + j reads
    ``clamp(k + D[j])`` and ``clamp(k + D[j] + 1)`` weighted ``WT[j]``, D[j] in {-1, 0}."""
    from fractions import Fraction
    half, s = Fraction(1, 2), Fraction(n_out, n_in)
    xs = {"half_pixel": lambda o: (o + half) / s - half,
          "pytorch_half_pixel": lambda o: (o + half) / s - half,
          "half_pixel_symmetric": lambda o: (o + half) / s - half,   # out = 2 in: no shift
          "asymmetric": lambda o: o / s, "tf_half_pixel_for_nn": lambda o: (o + half) / s,
          "align_corners": lambda o: Fraction(o * (n_in - 1), n_out - 1)}[ctm]
    phases = {}
    for o in range(n_out):
        x = min(max(xs(o), Fraction(-1)), Fraction(n_in))
        f = math.floor(x)
        d, w = f - o // 2, x - f
        if d not in (-1, 0):
            return False
        i0, i1 = min(max(f, 0), n_in - 1), min(max(f + 1, 0), n_in - 1)
        if phases.setdefault(o % 2, (d, w)) != (d, w) or (i0, i1) != (
                min(max(o // 2 + d, 0), n_in - 1), min(max(o // 2 + d + 1, 0), n_in - 1)):
            return False
    return True


@pytest.mark.parametrize("kind", ["padded", "broadcast", "permuted"])
@pytest.mark.parametrize("linear", [False, True])
def test_rows_strided_tensors(device, kind, linear):
    """Strided inputs (padded rows of whole quads and not, a broadcast dimension,
    permuted: rows not contiguous) into padded output rows (strides of whole quads, and
    one of 2: the kernel declines it): the rule against the general kernel and the
    float64 reference, the rows kernel taken exactly where the strides allow it."""
    rng = np.random.default_rng(len(kind) + 3 * linear)
    mode = LINEAR if linear else NEAREST
    shape, out = (2, 3, 5, 8), (2, 3, 10, 16)
    for pad in (4, 2):
        flat, strides, logical = strided_view(rng, shape, "float32", kind)
        if linear:   # finite values (strided_view's random bits hold NaNs and infinities)
            flat = rng.standard_normal(flat.shape).astype(np.float32)
            logical = np.lib.stride_tricks.as_strided(flat, shape, [4 * s for s in strides])
        ost = (out[1] * out[2] * (out[3] + pad), out[2] * (out[3] + pad), out[3] + pad, 1)
        desc = dml.Resample1OperatorDesc(T("float32", shape, strides),
                                         T("float32", out, ost), mode, (1.0, 1.0, 2.0, 2.0),
                                         (0.5,) * 4, (-0.5,) * 4)
        op, got, general = _rows_case(device, desc, flat, path=None)
        whole = strides[-1] == 1 and all(st % 4 == 0 for st in strides[:-1]) and pad == 4
        assert (op.path == "rows") == whole, (kind, strides, pad)
        assert op.rows is None or op.rows["pair"] == linear   # H 5 -> 10: PAIR for linear
        view, gview = (np.lib.stride_tricks.as_strided(a, out, [4 * s for s in ost])
                       for a in (got, general))
        _check_rows(np.ascontiguousarray(view), np.ascontiguousarray(gview), np.array(logical), out,
                    linear, (1.0, 1.0, 2.0, 2.0), (0.5,) * 4, (-0.5,) * 4)


@pytest.mark.parametrize("store64", [False, True])
def test_rows_read_paths_stores_and_limits(device, store64, monkeypatch):
    """The rows kernel's texel and storage-buffer reads (forced, and the storage buffer
    where the input passes maxTexelBufferElements), u64vec4 stores and vec4 stores,
    grids split past maxComputeWorkGroupCount, and the general kernel where a tensor
    passes maxStorageBufferRange: each against the general kernel."""
    import importlib
    mod = importlib.import_module("vkml.ops.resample")
    if store64 and not device.features.get("int64"):
        pytest.skip("u64vec4 stores need int64 shaders")
    monkeypatch.setattr(mod, "wide_stores", lambda _d: store64)
    rng = np.random.default_rng(47)
    limits = [({}, "texel"), ({"maxTexelBufferElements": 16}, "ssbo"),
              ({"maxTexelBufferElements": 16, "maxComputeWorkGroupCount": (1, 3, 2)}, "ssbo"),
              ({"maxStorageBufferRange": 4096}, None)]
    for lim, read in limits:
        with vkml.Device(device.index, limits=lim) as dev:
            for shape, out in (((2, 3, 6, 8), (2, 3, 12, 16)), ((3, 4, 20, 28), (3, 4, 40, 56))):
                x = rng.standard_normal(shape).astype(np.float32)
                for linear in (False, True):
                    desc = dml.Resample1OperatorDesc(
                        T("float32", shape), T("float32", out), LINEAR if linear else NEAREST,
                        (1.0, 1.0, 2.0, 2.0), (0.5,) * 4, (-0.5,) * 4)
                    big = 4 * math.prod(out) > lim.get("maxStorageBufferRange", 2 ** 40)
                    for force in ((None, "ssbo") if read == "texel" else (None,)):
                        op = mod.CompiledResample(dev, desc, read=force, path="rows")
                        want = None if big else (force or read)
                        assert (op.rows or {}).get("read") == want, (lim, shape, force)
                        assert op.rows is None or op.kernel.endswith("_u64") == store64
                        assert op.rows is None or op.rows["pair"] == linear
                        got = run_desc(dev, desc, x, compiled=op)
                        general = run_desc(dev, desc, x, compiled=mod.CompiledResample(
                            dev, desc, path="general"))
                        _check_rows(got, general, x, out, linear, (1.0, 1.0, 2.0, 2.0),
                                    (0.5,) * 4, (-0.5,) * 4)


def test_tuner_rows_read_candidates_run(device):
    """The tunable path ``resample_rows_read``: each candidate records and runs the rows
    kernel on a shape it takes (nearest: rows of 6, whole pairs), and is declined on one
    it does not (rows of 7; linear: rows of 6 and the candidates walking more nearest
    rows)."""
    import importlib

    from vkml import tuning

    mod = importlib.import_module("vkml.ops.resample")
    for mode in (NEAREST, LINEAR):
        for w, runs in ((8, True), (7, False), (6, mode == NEAREST)):
            desc = dml.ResampleOperatorDesc(T("float32", (1, 2, 5, w)),
                                            T("float32", (1, 2, 10, 2 * w)), mode, (1, 1, 2, 2))
            shape = mod.read_shape(desc)
            assert mod._rows_read_class(shape).startswith(f"rows mode {int(mode)}")
            for cand in mod.ROWS_READ_PATH.candidates:
                with device.context.sequence() as seq:
                    # linear walks its own PAIR rows: the walk candidates decline it
                    walks = cand.params["walk"] != mod.NEAR_ROWS
                    if not runs or (mode == LINEAR and walks):
                        with pytest.raises(tuning.Declined):
                            mod._rows_read_run(device, seq, cand, shape)
                        continue
                    free = mod._rows_read_run(device, seq, cand, shape)
                    seq.run()
                    free()
    assert tuning.registered_paths()["resample_rows_read"] is mod.ROWS_READ_PATH


SPREAD_CASES = [  # (input shape, output shape): rows of 1 to 14 quads, planes not whole groups
    ((1, 3, 5, 4), (1, 3, 10, 8)), ((2, 3, 7, 8), (2, 3, 14, 16)), ((1, 5, 5, 20), (1, 5, 10, 40)),
    ((1, 4, 7, 28), (1, 4, 14, 56)), ((3, 2, 3, 12), (3, 2, 6, 24)), ((2, 9, 16), (2, 18, 32)),
    ((3, 24), (6, 48)), ((1, 2, 3, 56), (1, 2, 6, 112)), ((1, 1, 1, 4), (1, 1, 2, 8)),
    ((1, 2, 5, 32), (1, 2, 10, 64)), ((2, 3, 9, 24), (2, 3, 9, 48))]


@pytest.mark.parametrize("linear", [False, True])
def test_rows_spread_over_rows(device, speed, linear):
    """Rows narrower than a workgroup (SPREAD row groups along x, the flattened rows of
    the whole box along y, a plane's last rows sharing a workgroup with the next plane's
    first): the rule's spread (taken exactly where a row has fewer than 8 invocations,
    linear at most 5) and forced 1, 2, 3, 5, 8 and 64, PAIR and one row an invocation
    for linear, walks of 1 and 3 for nearest: nearest bit for bit the general kernel,
    linear within a float32 rounding of it, both against the float64 reference.  Each
    spread is a pipeline of its own: a slow device (SwiftShader, which compiles at
    creation) takes the rule's, one, a prime and the largest."""
    import importlib
    mod = importlib.import_module("vkml.ops.resample")
    rng = np.random.default_rng(71 + linear)
    spreads = (None, 1, 3, 64) if slow(speed) else (None, 1, 2, 3, 5, 8, 64)
    mode = LINEAR if linear else NEAREST
    for shape, out in SPREAD_CASES:
        n = len(shape)
        x = rng.standard_normal(shape).astype(np.float32)
        scales = tuple(o / i for i, o in zip(shape, out))
        ins, outs = (0.5,) * n, (-0.5,) * n
        desc = dml.Resample1OperatorDesc(T("float32", shape), T("float32", out), mode,
                                         scales, ins, outs)
        general = run_desc(device, desc, x, compiled=mod.CompiledResample(
            device, desc, path="general"))
        paths = ("rows", "rows1") if linear else ("rows",)
        walks = (None,) if linear else (1, 3)
        for path, walk, spread in itertools.product(paths, walks, spreads):
            op = mod.CompiledResample(device, desc, path=path, walk=walk, spread=spread)
            if op.rows is None:
                # H not interpolated: not the rows kernel
                assert linear and 1 in (shape[-2], out[-2] // shape[-2]), shape
                continue
            per = ceil_div(shape[-1] // 4, mod.ROWS_Q)
            taken = op._spread(op._rows_box())
            if spread is None:
                assert (taken > 1) == (per <= (5 if linear else 7)), (shape, taken)
                assert taken == 1 or taken * per % 8 == 0 and taken * per <= 64
            else:
                # a workgroup of 64 fits every device
                assert taken == spread or taken == 1 and spread * per > 64, (shape, spread)
            got = run_desc(device, desc, x, compiled=op)
            _check_rows(got, general, x, out, linear, scales, ins, outs)


def test_rows_spread_strided_and_limits(device):
    """The spread rows kernel on strided tensors (a broadcast input dimension, padded
    output rows of whole quads), and declined
    where the flattened rows pass maxComputeWorkGroupCount's y (the split grid runs):
    each against the general kernel and the reference."""
    import importlib
    mod = importlib.import_module("vkml.ops.resample")
    rng = np.random.default_rng(83)
    shape, out = (2, 3, 5, 8), (2, 3, 10, 16)
    for linear in (False, True):
        mode = LINEAR if linear else NEAREST
        flat = rng.standard_normal(3 * 5 * 8).astype(np.float32)
        strides = (0, 40, 8, 1)                  # the batch dimension broadcast
        ost = (3 * 10 * 20, 10 * 20, 20, 1)      # output rows padded to 20
        desc = dml.Resample1OperatorDesc(T("float32", shape, strides),
                                         T("float32", out, ost), mode, (1.0, 1.0, 2.0, 2.0),
                                         (0.5,) * 4, (-0.5,) * 4)
        op, got, general = _rows_case(device, desc, flat)
        assert op.path == "rows" and op._spread(op._rows_box()) > 1
        logical = np.lib.stride_tricks.as_strided(flat, shape, [4 * s for s in strides])
        view, gview = (np.ascontiguousarray(np.lib.stride_tricks.as_strided(
            a, out, [4 * s for s in ost])) for a in (got, general))
        _check_rows(view, gview, np.array(logical), out, linear, (1.0, 1.0, 2.0, 2.0),
                    (0.5,) * 4, (-0.5,) * 4)
    shape, out = (4, 8, 22, 8), (4, 8, 44, 16)
    x = rng.standard_normal(shape).astype(np.float32)
    with vkml.Device(device.index, limits={"maxComputeWorkGroupCount": (1, 2, 2)}) as dev:
        for linear in (False, True):
            desc = dml.Resample1OperatorDesc(T("float32", shape), T("float32", out),
                                             LINEAR if linear else NEAREST,
                                             (1.0, 1.0, 2.0, 2.0), (0.5,) * 4, (-0.5,) * 4)
            op, got, general = _rows_case(dev, desc, x)
            # 352 row groups, 64 a workgroup, 2 workgroups a grid's y
            assert op._spread(op._rows_box()) == 1
            _check_rows(got, general, x, out, linear, (1.0, 1.0, 2.0, 2.0), (0.5,) * 4,
                        (-0.5,) * 4)


def test_rows_pairs_nearest(device):
    """Nearest 2x on rows of whole input pairs but not quads (widths 2 to 30: the
    ``near2`` variants, YOLOv8n's 10 and U-Net's 14), their rows spread or not, walks of
    1 and 3, H scaled by 1, 2 or 3, ranks 2 to 4, a broadcast input dimension and padded
    output rows of whole quads; odd widths (1 to 33) and input strides of odd elements
    keep the broadcast copy or the general kernel.  Bit for bit the general kernel and
    the page's elements."""
    import importlib
    mod = importlib.import_module("vkml.ops.resample")
    rng = np.random.default_rng(97)
    dtype = "float32"

    def check(shape, out, strides=None, ost=None, **kw):
        n = len(shape)
        scales = tuple(o / i for i, o in zip(shape, out))
        desc = dml.Resample1OperatorDesc(T(dtype, shape, strides), T(dtype, out, ost),
                                         NEAREST, scales, (0.5,) * n, (-0.5,) * n)
        span = 1 + sum((d - 1) * s for d, s in zip(shape, strides or C_strides(shape)))
        flat = rng.standard_normal(span).astype(np.float32)
        op = mod.CompiledResample(device, desc, **kw)
        got = run_desc(device, desc, flat, compiled=op)
        general = run_desc(device, desc, flat, compiled=mod.CompiledResample(
            device, desc, path="general"))
        assert same_bits(got, general), (shape, out, strides, kw)
        x = np.lib.stride_tricks.as_strided(flat, shape, [4 * s for s in strides or
                                                          C_strides(shape)])
        view = np.lib.stride_tricks.as_strided(got, out, [4 * s for s in ost or C_strides(out)])
        s32 = np.float32(scales).astype(np.float64)
        assert_nearest(np.ascontiguousarray(view), np.array(x), out, s32,
                       np.float32((0.5,) * n).astype(np.float64),
                       np.float32((-0.5,) * n).astype(np.float64))
        return op

    for w in range(1, 34):
        shape = (2, 3, 5, w)
        for hs in ((1, 2) if w % 2 else (1, 2, 3)):
            out = (2, 3, 5 * hs, 2 * w)
            for kw in (({},) if w % 2 or w % 4 == 0 or hs != 2 else
                       ({}, {"spread": 1}, {"walk": 3}, {"spread": 3, "walk": 1})):
                op = check(shape, out, **kw)
                pairs = w % 4 != 0 and w % 2 == 0
                assert (op.path == "rows") == (w % 2 == 0), (w, hs)
                assert op.rows is None or op.rows["unit"] == (2 if pairs else 4)
                assert not pairs or op.kernel.startswith("resample_rows_near2_")
    op = check((6, 10), (12, 20))
    assert op.path == "rows" and op.rows["unit"] == 2
    op = check((3, 14), (3, 28))
    assert op.path == "rows" and op.rows["unit"] == 2
    # a broadcast batch, rows of 10 padded to 12 (pairs): padded output rows of 24
    op = check((2, 3, 4, 10), (2, 3, 8, 20), (0, 48, 12, 1), (3 * 8 * 24, 8 * 24, 24, 1))
    assert op.path == "rows" and op.rows["unit"] == 2
    # input rows of 10 at a stride of 11 (not whole pairs): not the rows kernel
    op = check((2, 3, 4, 10), (2, 3, 8, 20), (132, 44, 11, 1))
    assert op.path != "rows"
    # storage-buffer reads
    op = check((1, 4, 7, 14), (1, 4, 14, 28), read="ssbo")
    assert op.path == "rows" and op.rows["read"] == "ssbo"


def C_strides(shape):
    """Packed element strides of ``shape``."""
    return tuple(int(np.prod(shape[k + 1:])) for k in range(len(shape)))

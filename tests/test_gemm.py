"""DML_GEMM (``vkml.gemm``): against a float64 NumPy reference (and PyTorch's ``addmm``)
over 2 to 4 dimensions, both transforms, batch broadcast by zero strides, C broadcast,
Alpha/Beta, float32 and float16 (halves, or packed words without 16-bit storage), every
read path, strided operands with NaN in their gaps and NaN canaries in an output's gaps,
fused activations (CLIP included), windows past maxStorageBufferRange and grids past
maxComputeWorkGroupCount, every rule of the page, a graph node, threads and leaks."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import strategies as st
import torch

import vkml
from vkml import dml
from vkml.errors import ValidationError
from vkml.intmath import ceil_div

from helpers import (assert_no_leaks, operator_cycle, run_into_nan, run_two_node_graph,
                     threads_share_one_operator)
from test_activations import FORMULAS
from fuzzing import compiled_or_refused, fuzzer, lay_out, padded_output, placement, run_checked

T = dml.TensorDesc
Desc = dml.GemmOperatorDesc
#: (path, read) of every kernel CompiledGemm has: forced in turn where a test takes them.
PATHS = [("direct", "dot4"), ("direct", "texel4"), ("direct", "ssbo4"), ("direct", "texel"),
         ("direct", "ssbo"), ("tiled", "texel"), ("tiled", "ssbo")]


def reference(a, b, c=None, ta=False, tb=False, alpha=1.0, beta=1.0, act=None, params=None):
    """The page's formula in float64 on logical (already broadcast) arrays."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if ta:
        a = np.swapaxes(a, -1, -2)
    if tb:
        b = np.swapaxes(b, -1, -2)
    y = alpha * (a @ b)
    if c is not None:
        y = y + beta * np.asarray(c, np.float64)
    if act is not None:
        y = FORMULAS[act][1](y, **(params or {}))
    return y


def _tol(dtype, k=16):
    if dtype == "float32":
        return dict(rtol=1e-5, atol=1e-5 * max(1.0, np.sqrt(k)))
    return dict(rtol=3e-3, atol=3e-3 * max(1.0, np.sqrt(k)))


def _run(device, desc, arrays, out_elems, path=None, read=None):
    """Execute ``desc`` on flat buffers through CompiledGemm with a forced read path; the
    output starts as NaN canaries."""
    from vkml.ops.gemm import CompiledGemm

    op = CompiledGemm(device, device.create_operator(desc).desc, path=path, read=read)
    return op, run_into_nan(device, op, arrays, out_elems, desc.output_tensor.dtype)


def test_torch_addmm(device):
    """A plain 2-D GEMM with C against PyTorch's addmm (an independent implementation)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 53)).astype(np.float32)
    b = rng.standard_normal((53, 45)).astype(np.float32)
    c = rng.standard_normal((37, 45)).astype(np.float32)
    want = torch.addmm(torch.from_numpy(c.astype(np.float64)), torch.from_numpy(
        a.astype(np.float64)), torch.from_numpy(b.astype(np.float64)), beta=0.5,
        alpha=1.5).numpy()
    got = vkml.gemm(a, b, c, alpha=1.5, beta=0.5, device=device)
    assert got.shape == (37, 45) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_random_shapes(device, budget, dtype):
    """Ranks 2 to 4, both transforms, batch dimensions broadcast (NumPy matmul rules, as
    zero strides), C broadcast or absent, random Alpha and Beta, every read path."""
    rng = np.random.default_rng(1 if dtype == "float32" else 2)
    kernels = set()
    for case in range(budget):
        rank = 2 + case % 3
        batch = tuple(int(rng.integers(1, 4)) for _ in range(rank - 2))
        m, k, n = (int(rng.integers(1, 70)) for _ in range(3))
        ta, tb = bool(case & 1), bool(case & 2)
        abatch = tuple(s if rng.random() < 0.7 else 1 for s in batch)
        bbatch = tuple(s if rng.random() < 0.7 else 1 for s in batch)[int(rng.integers(0, 2)):]
        a = rng.standard_normal(abatch + ((k, m) if ta else (m, k))).astype(dtype)
        b = rng.standard_normal(bbatch + ((n, k) if tb else (k, n))).astype(dtype)
        c = None
        if case % 4 != 3:
            cshape = tuple(s if rng.random() < 0.5 else 1 for s in batch + (m, n))
            c = rng.standard_normal(cshape[int(rng.integers(0, len(cshape))):]).astype(dtype)
        alpha, beta = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
        got = vkml.gemm(a, b, c, trans_a=ta, trans_b=tb, alpha=alpha, beta=beta,
                        device=device)
        want = reference(a, b, c, ta, tb, alpha, beta)
        assert got.shape == want.shape and got.dtype == np.dtype(dtype)
        np.testing.assert_allclose(got.astype(np.float64), want, **_tol(dtype, k),
                                   err_msg=f"{a.shape} {b.shape} {ta} {tb}")
        kernels.add(device.compiled(_last_desc(a, b, c, ta, tb, alpha, beta)).kernel)
    assert kernels


def _last_desc(a, b, c, ta, tb, alpha, beta):
    """The descriptor vkml.gemm builds for these arguments (its compiled-operator key)."""
    from vkml.ops.gemm import _broadcast_desc

    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    ad = _broadcast_desc(a, "a", batch + a.shape[-2:])
    bd = _broadcast_desc(b, "b", batch + b.shape[-2:])
    m = a.shape[-1] if ta else a.shape[-2]
    n = b.shape[-2] if tb else b.shape[-1]
    yd = T(ad.data_type, batch + (m, n))
    cd = None if c is None else _broadcast_desc(c, "c", yd.sizes)
    return Desc(ad, bd, cd, yd, int(ta), int(tb), alpha=alpha, beta=beta)


@pytest.mark.parametrize("path, read", PATHS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_strides_and_canaries(device, dtype, path, read):
    """A stored transposed (element strides), B padded with NaN in its gaps and broadcast
    along the batch by a zero stride, C broadcast along M, into an output whose gaps hold
    NaN canaries that must stay."""
    rng = np.random.default_rng(3)
    bt, ch, m, k, n = 2, 3, 13, 11, 9
    a_mem = rng.standard_normal((bt, ch, k, m)).astype(dtype)       # A stored as (K, M)
    a = a_mem.swapaxes(-1, -2)
    a_strides = (ch * k * m, k * m, 1, m)
    b_mem = np.full((ch, k, n + 3), np.nan, dtype)
    b_mem[:, :, :n] = rng.standard_normal((ch, k, n))
    b = np.broadcast_to(b_mem[:, :, :n], (bt, ch, k, n))
    b_strides = (0, k * (n + 3), n + 3, 1)
    c_mem = rng.standard_normal((bt, ch, n)).astype(dtype)
    c = np.broadcast_to(c_mem[:, :, None, :], (bt, ch, m, n))
    c_strides = (ch * n, n, 0, 1)
    y_strides = (ch * m * 16, m * 16, 16, 1)
    out_elems = bt * y_strides[0]
    shape = (bt, ch, m, n)
    desc = Desc(T(dtype, (bt, ch, m, k), a_strides), T(dtype, (bt, ch, k, n), b_strides),
                T(dtype, shape, c_strides), T(dtype, shape, y_strides), alpha=0.75, beta=-1.25)
    op, got = _run(device, desc, [a_mem, b_mem, c_mem], out_elems, path=path, read=read)
    assert op.path == path
    assert op.read == ("ssbo" if dtype == "float16" or read == "ssbo4" else
                       "texel" if read in ("texel4", "dot4") else read)
    idx = sum(np.arange(s).reshape([-1 if i == d else 1 for i in range(4)]) * st
              for d, (s, st) in enumerate(zip(shape, y_strides)))
    np.testing.assert_allclose(got[idx].astype(np.float64),
                               reference(a, b, c, alpha=0.75, beta=-1.25), **_tol(dtype, k))
    gaps = np.ones(out_elems, bool)
    gaps[idx.reshape(-1)] = False
    assert np.isnan(got[gaps].astype(np.float64)).all(), "a write landed outside the output"


@pytest.mark.parametrize("path, read", PATHS)
def test_transforms_descriptor(device, path, read):
    """TransA / TransB given as DML_MATRIX_TRANSFORM members on 4-D descriptors, odd
    sizes past one workgroup's block on every axis."""
    rng = np.random.default_rng(4)
    for ta in (dml.MatrixTransform.NONE, dml.MatrixTransform.TRANSPOSE):
        for tb in (dml.MatrixTransform.NONE, dml.MatrixTransform.TRANSPOSE):
            m, k, n = 41, 36, 68
            a = rng.standard_normal((1, 2) + ((k, m) if ta else (m, k))).astype(np.float32)
            b = rng.standard_normal((1, 2) + ((n, k) if tb else (k, n))).astype(np.float32)
            desc = Desc(T("float32", a.shape), T("float32", b.shape), None,
                        T("float32", (1, 2, m, n)), ta, tb, alpha=2.0, beta=5.0)
            op, got = _run(device, desc, [a, b, None], 2 * m * n, path=path, read=read)
            fits = {"texel4": not ta and not tb, "ssbo4": not ta and not tb,
                    "dot4": not ta and tb}.get(read, True)
            want_read = read if fits else "ssbo" if read == "ssbo4" else "texel"
            assert (op.path, op.read) == (path, want_read)
            np.testing.assert_allclose(got.reshape(1, 2, m, n),
                                       reference(a, b, None, ta, tb, 2.0), **_tol("float32", k))


def test_texel4_edges(device):
    """The RGBA32F read at its edges: N of one or an odd number of 4-column groups (the
    last group clamped), M of one row, K of one texel, C and the batch layers."""
    rng = np.random.default_rng(11)
    for b, m, k, n in ((1, 1, 4, 4), (2, 9, 8, 12), (1, 70, 4, 20), (3, 65, 16, 36)):
        a = rng.standard_normal((b, m, k)).astype(np.float32)
        bb = rng.standard_normal((b, k, n)).astype(np.float32)
        c = rng.standard_normal((b, m, n)).astype(np.float32)
        desc = Desc(T("float32", a.shape), T("float32", bb.shape), T("float32", c.shape),
                    T("float32", c.shape), alpha=-1.0, beta=0.5)
        op, got = _run(device, desc, [a, bb, c], c.size, path="direct")
        assert op.read == "texel4"
        np.testing.assert_allclose(got.reshape(c.shape), reference(a, bb, c, alpha=-1.0,
                                                                   beta=0.5), **_tol("float32", k))


def test_dot4_edges(device):
    """gemm_dot.comp (A along K, B transposed): every rows-an-invocation choice (M of 1,
    2, 3, 5, 9, 70: blocks of 1, 2, 4 and 8 rows, the last clamped), N past one
    workgroup and odd, K of one texel, batch layers with B broadcast by a zero stride, C
    broadcast along M, a fused activation; the classifier's 1 x 512 by 1000 GEMV (as vec4
    storage buffers where its weights exceed maxTexelBufferElements: SwiftShader)."""
    rng = np.random.default_rng(12)
    for bt, m, k, n in ((1, 1, 4, 1), (1, 1, 512, 1000), (2, 2, 8, 13), (1, 3, 12, 260),
                        (3, 5, 16, 7), (1, 9, 20, 33), (2, 70, 4, 130)):
        a = rng.standard_normal((bt, m, k)).astype(np.float32)
        w = rng.standard_normal((1, n, k)).astype(np.float32)
        c = rng.standard_normal((bt, 1, n)).astype(np.float32)
        wd = T("float32", (bt, n, k), (0, k, 1))
        cd = T("float32", (bt, m, n), (n, 0, 1))
        desc = Desc(T("float32", a.shape), wd, cd, T("float32", (bt, m, n)), 0, 1,
                    alpha=0.5, beta=2.0, fused_activation=dml.ACTIVATIONS["relu"]())
        op, got = _run(device, desc, [a, w, c], bt * m * n, path="direct")
        texels = max(a.size, w.size) // 4 <= device.limits["maxTexelBufferElements"]  # RGBA
        assert op.read == "dot4"
        assert op.kernel == "gemm_dot_f32" + ("" if texels else "_ssbo")
        want = reference(a, np.broadcast_to(w, (bt, n, k)), np.broadcast_to(c, (bt, m, n)),
                         tb=True, alpha=0.5, beta=2.0, act="relu")
        np.testing.assert_allclose(got.reshape(bt, m, n), want, **_tol("float32", k),
                                   err_msg=f"{(bt, m, k, n)}")


def test_texel4_past_texel_limit(device):
    """The 8 x 8 block of texel4 past maxTexelBufferElements (lowered) reads vec4 storage
    buffers (ssbo4), not scalar ones; the limit counts RGBA32F texels, so an operand of
    up to 4 x the limit in floats still reads texels.  Odd M, N of an odd number of
    4-column groups (the last clamped), batch layers with B broadcast, C and alpha/beta."""
    rng = np.random.default_rng(14)
    with vkml.Device(device.index, limits={"maxTexelBufferElements": 64}) as small:
        for bt, m, k, n, want_read in ((1, 3, 8, 28, "texel4"), (2, 13, 12, 36, "ssbo4"),
                                       (1, 70, 20, 20, "ssbo4")):
            a = rng.standard_normal((bt, m, k)).astype(np.float32)
            b = rng.standard_normal((1, k, n)).astype(np.float32)
            c = rng.standard_normal((bt, m, n)).astype(np.float32)
            bd = T("float32", (bt, k, n), (0, n, 1))
            desc = Desc(T("float32", a.shape), bd, T("float32", c.shape), T("float32", c.shape),
                        alpha=-0.75, beta=1.5)
            op, got = _run(small, desc, [a, b, c], c.size, path="direct")
            assert op.read == want_read, (bt, m, k, n)
            assert op.kernel == "gemm_direct_f32_" + want_read
            want = reference(a, np.broadcast_to(b, (bt, k, n)), c, alpha=-0.75, beta=1.5)
            np.testing.assert_allclose(got.reshape(c.shape), want, **_tol("float32", k))


def test_dot4_past_texel_limit(device):
    """dot4 with operands past maxTexelBufferElements (lowered) reads vec4 storage
    buffers (gemm_dot_f32_ssbo), clamped rows and columns included; the limit counts
    RGBA32F texels (B of 192 floats, 48 texels, still reads texels)."""
    rng = np.random.default_rng(13)
    with vkml.Device(device.index, limits={"maxTexelBufferElements": 64}) as small:
        for m, k, n, kernel in ((1, 16, 37, "gemm_dot_f32_ssbo"), (11, 24, 20, "gemm_dot_f32_ssbo"),
                                (3, 8, 24, "gemm_dot_f32")):
            a = rng.standard_normal((m, k)).astype(np.float32)
            w = rng.standard_normal((n, k)).astype(np.float32)
            c = rng.standard_normal((n,)).astype(np.float32)
            cd = T("float32", (m, n), (0, 1))
            desc = Desc(T("float32", a.shape), T("float32", w.shape), cd, T("float32", (m, n)),
                        0, 1, alpha=1.5, beta=-0.5)
            op, got = _run(small, desc, [a, w, c], m * n)
            assert (op.read, op.kernel) == ("dot4", kernel)
            want = reference(a, w, np.broadcast_to(c, (m, n)), tb=True, alpha=1.5, beta=-0.5)
            np.testing.assert_allclose(got.reshape(m, n), want, **_tol("float32", k))


@pytest.mark.parametrize("m", [1, 2, 7, 9, 33])
@pytest.mark.parametrize("path, read", PATHS)
def test_few_rows(device, m, path, read):
    """Products of few rows on every kernel (the direct family's workgroups then take
    fewer invocation rows, :func:`vkml.ops.gemm.block_shape`)."""
    from vkml.ops.gemm import block_shape

    rng = np.random.default_rng(m)
    k, n = 8, 300
    tb = read == "dot4"
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    desc = Desc(T("float32", a.shape), T("float32", b.shape), None, T("float32", (m, n)),
                0, int(tb))
    op, got = _run(device, desc, [a, b, None], m * n, path=path, read=read)
    assert (op.path, op.read) == (path, read)
    lx, ly, rows, cols = block_shape(path, read, m)
    assert lx * ly == 64 and (op.block_m, op.block_n) == (rows * ly, cols * lx)
    assert path == "tiled" or rows * ly < 2 * m + rows
    np.testing.assert_allclose(got.reshape(m, n), reference(a, b, tb=tb), **_tol("float32", k))


@pytest.mark.parametrize("act, params", [("relu", {}), ("leaky_relu", {"alpha": 0.2}),
                                         ("sigmoid", {}), ("elu", {"alpha": 0.5}),
                                         ("gelu", {}), ("clip", {"min": -0.5, "max": 1.0})])
def test_fused_activation(device, act, params):
    """The fused activation after Alpha * AB + Beta * C (CLIP is fusable for GEMM)."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 7, 12)).astype(np.float32)
    b = rng.standard_normal((2, 12, 9)).astype(np.float32)
    c = rng.standard_normal((9,)).astype(np.float32)
    fused = dml.ACTIVATIONS[act](**params)
    got = vkml.gemm(a, b, c, alpha=0.5, beta=2.0, fused_activation=fused, device=device)
    want = reference(a, b, c, alpha=0.5, beta=2.0)
    want = np.clip(want, -0.5, 1.0) if act == "clip" else FORMULAS[act][1](want, **params)
    np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-5)


def test_alpha_beta_edge_values(device):
    """Alpha 0 gives Beta * C; Beta with no C is ignored; NaN Alpha propagates."""
    a = np.ones((3, 4), np.float32)
    b = np.ones((4, 5), np.float32)
    c = np.full((3, 5), 2.0, np.float32)
    np.testing.assert_array_equal(vkml.gemm(a, b, c, alpha=0.0, beta=3.0, device=device), 6.0)
    np.testing.assert_array_equal(vkml.gemm(a, b, beta=7.0, device=device), 4.0)
    assert np.isnan(vkml.gemm(a, b, alpha=float("nan"), device=device)).all()


@pytest.mark.parametrize("path, read", PATHS)
def test_windows_and_split_grids(device, path, read):
    """maxStorageBufferRange lowered: the tensors are bound in windows of the output;
    maxComputeWorkGroupCount lowered: grids split along N, M and the batch layers (B
    transposed for dot4)."""
    rng = np.random.default_rng(6)
    tb = read == "dot4"
    a = rng.standard_normal((3, 2, 40, 24)).astype(np.float32)
    b = rng.standard_normal((3, 2) + ((72, 24) if tb else (24, 72))).astype(np.float32)
    c = rng.standard_normal((3, 2, 40, 72)).astype(np.float32)
    want = reference(a, b, c, tb=tb, alpha=1.5, beta=0.5)
    align = device._ctx.binding_alignment()
    for limits in ({"maxStorageBufferRange": 8192 + 4 * align},
                   {"maxComputeWorkGroupCount": (2, 1, 2)},
                   {"maxComputeWorkGroupCount": (1, 2, 7)}):
        with vkml.Device(device.index, limits=limits) as small:
            desc = Desc(T("float32", a.shape), T("float32", b.shape), T("float32", c.shape),
                        T("float32", c.shape), 0, int(tb), alpha=1.5, beta=0.5)
            op, got = _run(small, desc, [a, b, c], c.size, path=path, read=read)
            if "maxStorageBufferRange" in limits:
                assert op.windows is not None and len(op.windows) > 1 and op.read == "ssbo"
            else:
                assert op.read == read
            np.testing.assert_allclose(got.reshape(c.shape), want, **_tol("float32", 24))


def test_windows_float16_packed(device):
    """Windows over packed float16 (bases in half-words, 4-byte aligned windows)."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((4, 33, 17)).astype(np.float16)
    b = rng.standard_normal((4, 17, 31)).astype(np.float16)
    align = device._ctx.binding_alignment()
    with vkml.Device(device.index, disable_features=["storage16"],
                     limits={"maxStorageBufferRange": 2048 + 4 * align}) as dev:
        desc = Desc(T("float16", a.shape), T("float16", b.shape), None,
                    T("float16", (4, 33, 31)))
        for path in ("direct", "tiled"):
            op, got = _run(dev, desc, [a, b, None], 4 * 33 * 31, path=path)
            assert op.kernel == f"gemm_{path}_f16_packed" and len(op.windows) > 1
            np.testing.assert_allclose(got.reshape(4, 33, 31).astype(np.float64),
                                       reference(a, b), **_tol("float16", 17))


def test_float16_without_16bit_storage(device):
    """float16 packed two to a 32-bit word, odd sizes so words are shared by neighbours
    that other invocations write."""
    rng = np.random.default_rng(8)
    a = rng.standard_normal((3, 5, 7)).astype(np.float16)
    b = rng.standard_normal((3, 7, 9)).astype(np.float16)
    c = rng.standard_normal((1, 5, 9)).astype(np.float16)
    with vkml.Device(device.index, disable_features=["storage16"]) as dev:
        got = vkml.gemm(a, b, c, beta=0.5, fused_activation="tanh", device=dev)
    np.testing.assert_allclose(got.astype(np.float64),
                               np.tanh(reference(a, b, c, beta=0.5)), **_tol("float16"))


def test_tensor_in_tensor_out(device):
    a = vkml.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device)
    b = vkml.tensor(np.eye(3, dtype=np.float32), device=device)
    y = vkml.gemm(a, b)
    assert isinstance(y, vkml.Tensor)
    np.testing.assert_array_equal(y.numpy(), np.arange(6).reshape(2, 3))


# -- validation: every rule of the page, with the field it names ----------------------------
A = T("float32", (2, 3, 4, 5))
B = T("float32", (2, 3, 5, 6))
Y = T("float32", (2, 3, 4, 6))


@pytest.mark.parametrize("kw, field", [
    (dict(a_tensor=T("int32", (2, 3, 4, 5))), "a_tensor.data_type"),
    (dict(b_tensor=T("float16", (2, 3, 5, 6))), "b_tensor.data_type"),
    (dict(c_tensor=T("float16", (2, 3, 4, 6))), "c_tensor.data_type"),
    (dict(a_tensor=T("float32", (4,)), ), "a_tensor.sizes"),
    (dict(a_tensor=T("float32", (1, 2, 3, 4, 5))), "a_tensor.sizes"),
    (dict(b_tensor=T("float32", (3, 5, 6))), "b_tensor.sizes"),
    (dict(b_tensor=T("float32", (2, 3, 4, 6))), "b_tensor.sizes"),
    (dict(a_tensor=T("float32", (1, 3, 4, 5))), "a_tensor.sizes[0]"),
    (dict(b_tensor=T("float32", (2, 1, 5, 6))), "b_tensor.sizes[1]"),
    (dict(output_tensor=T("float32", (2, 3, 4, 7))), "output_tensor.sizes"),
    (dict(c_tensor=T("float32", (2, 3, 1, 6))), "c_tensor.sizes"),
    (dict(trans_a=dml.MatrixTransform.TRANSPOSE), "b_tensor.sizes"),
    (dict(trans_b=dml.MatrixTransform.TRANSPOSE), "b_tensor.sizes"),
    (dict(trans_a=2), "trans_a"),
    (dict(trans_b="flip"), "trans_b"),
    (dict(output_tensor=T("float32", (2, 3, 4, 6), (0, 24, 6, 1))), "output_tensor.strides"),
    (dict(a_tensor=None), "a_tensor"),
    (dict(alpha="1"), "alpha"),
    (dict(beta=None), "beta"),
    (dict(fused_activation=dml.ActivationReluOperatorDesc(Y, Y)),
     "fused_activation.input_tensor"),
    (dict(fused_activation=dml.ActivationEluOperatorDesc(alpha=float("nan"))),
     "fused_activation.alpha"),
    (dict(fused_activation="softmax"), "fused_activation"),
])
def test_rules(device, kw, field):
    args = dict(a_tensor=A, b_tensor=B, c_tensor=Y, output_tensor=Y)
    args.update(kw)
    with pytest.raises(ValidationError) as info:
        device.create_operator(Desc(**args))
    assert info.value.field == f"GemmOperatorDesc.{field}", str(info.value)
    one = np.ones((1, 1), np.float32)          # the device is usable afterwards
    np.testing.assert_array_equal(vkml.gemm(one, one, device=device), one)


def test_transposed_sizes_accepted(device):
    """The Sizes the page gives for each transform are accepted."""
    device.create_operator(Desc(T("float32", (5, 4)), T("float32", (6, 5)), None,
                                T("float32", (4, 6)), "transpose",
                                "DML_MATRIX_TRANSFORM_TRANSPOSE"))


def test_feature_levels():
    assert Desc(A, B, Y, Y).feature_level() == dml.FeatureLevel.FL_1_0
    a3, b3, y3 = T("float32", (3, 4, 5)), T("float32", (3, 5, 6)), T("float32", (3, 4, 6))
    assert Desc(a3, b3, None, y3).feature_level() == dml.FeatureLevel.FL_4_0
    assert Desc(A, B, None, Y, fused_activation="gelu").feature_level() == \
        dml.FeatureLevel.FL_5_1


def test_functional_argument_errors(device):
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(ValidationError) as info:
        vkml.gemm(np.zeros(3, np.float32), a, device=device)
    assert info.value.field == "a"
    with pytest.raises(ValidationError) as info:
        vkml.gemm(np.zeros((2, 2, 2, 2, 3, 2), np.float32), a, device=device)
    assert info.value.field == "a"
    with pytest.raises(ValidationError) as info:
        vkml.gemm(np.zeros((2, 4, 2), np.float32), np.zeros((3, 3, 2), np.float32),
                  device=device)
    assert info.value.field == "b"
    with pytest.raises(ValidationError) as info:
        vkml.gemm(a.T, a, np.zeros((3, 2), np.float32), device=device)
    assert info.value.field == "c"
    with pytest.raises(ValidationError) as info:
        vkml.gemm(a, a, device=device)               # K mismatch
    assert info.value.field == "GemmOperatorDesc.b_tensor.sizes"
    with pytest.raises(ValidationError) as info:
        vkml.gemm(a, a.T, fused_activation="nope", device=device)
    assert info.value.field.endswith("fused_activation")
    with pytest.raises(ValidationError):
        vkml.gemm(a.astype(np.float16), a.T, device=device)


# -- graph, threads, leaks ------------------------------------------------------------------
def test_graph_node(device):
    """GEMM (fused relu) -> softmax over N as a two-node graph."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    c = rng.standard_normal((2, 3, 4, 6)).astype(np.float32)
    got = run_two_node_graph(device, Desc(A, B, Y, Y, alpha=0.5, fused_activation="relu"),
                             dml.ActivationSoftmax1OperatorDesc(Y, Y, (3,)), (a, b, c), Y.sizes)
    y = np.maximum(reference(a, b, c, alpha=0.5), 0)
    e = np.exp(y - y.max(axis=3, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=3, keepdims=True), rtol=2e-5, atol=1e-6)


def test_threads(device):
    rng = np.random.default_rng(10)
    arrays = [rng.standard_normal(t.sizes).astype(np.float32) for t in (A, B, Y)]
    shared = device.compile_operator(device.create_operator(Desc(A, B, Y, Y)))
    ins = [device.tensor(x) for x in arrays]
    want = reference(*arrays)

    def functional(k, i):
        a = np.full((2 + k % 3, 3 + i), float(k), np.float32)
        b = np.ones((3 + i, 4), np.float32)
        return np.allclose(vkml.gemm(a, b, device=device), reference(a, b))

    threads_share_one_operator(device, shared, ins, want, Y.sizes, functional,
                               rtol=1e-5, atol=1e-5)


def test_no_leaks(device):
    """create -> compile -> execute -> release cycles leave the device's memory as it was."""
    ins = [device.tensor(np.ones(t.sizes, np.float32)) for t in (A, B, Y)]
    out = device.empty(Y.sizes)
    cycle = operator_cycle(device, Desc(A, B, Y, Y, beta=0.5), ins, [out])
    assert_no_leaks(device, cycle, warm=20, rounds=100)


# -- fuzzer (tests/fuzzing.py): valid and invalid descriptors, canaries ---------------------


@st.composite
def gemm_cases(draw):
    rank = draw(st.integers(2, 4))
    return dict(batch=draw(st.lists(st.integers(1, 3), min_size=rank - 2, max_size=rank - 2)),
                mkn=draw(st.lists(st.integers(1, 20), min_size=3, max_size=3)),
                ta=draw(st.booleans()), tb=draw(st.booleans()), with_c=draw(st.booleans()),
                dtype=draw(st.sampled_from(["float32", "float16"])),
                mutation=draw(st.sampled_from(["none"] * 8 + ["k", "batch", "c", "int",
                                                              "rank", "trans"])),
                act=draw(st.sampled_from([None, None, "relu", "tanh", "clip"])),
                alpha=draw(st.sampled_from([1.0, -0.5, 2.0])),
                beta=draw(st.sampled_from([1.0, 0.0, 0.25])), **placement(draw, 3))


def test_fuzz_gemm(device, speed):
    """GEMM descriptors drawn at random, checked as ``fuzzing.fuzzer`` says."""
    @fuzzer(speed, gemm_cases())
    def check(case):
        rng = np.random.default_rng(case["seed"])
        mut, dtype, batch = case["mutation"], case["dtype"], list(case["batch"])
        m, k, n = case["mkn"]
        ta, tb = case["ta"], case["tb"]
        want = {"k": ["b_tensor.sizes"], "batch": ["b_tensor.sizes["], "c": ["c_tensor.sizes"],
                "int": ["data_type"], "rank": ["sizes"], "trans": ["trans_a"]}.get(mut, [])
        if mut == "batch" and not batch:
            mut, want = "k", ["b_tensor.sizes"]
        ashape = batch + ([k, m] if ta else [m, k])
        kb = k + 1 if mut == "k" else k
        bbatch = [s + 1 for s in batch] if mut == "batch" else batch
        bshape = bbatch + ([n, kb] if tb else [kb, n])
        yshape = batch + [m, n]
        with_c = case["with_c"] or mut == "c"
        cshape = yshape[:-1] + [n + 1] if mut == "c" else yshape
        if mut == "rank":
            ashape = [1] + ashape if len(ashape) < 4 else ashape[1:]
        arrays = [rng.uniform(-2, 2, s).astype(dtype) for s in (ashape, bshape, cshape)]
        laid = [lay_out(rng, x, kind) for x, kind in zip(arrays, case["layouts"])]
        out_strides, read = padded_output(rng, yshape, dtype, case["out_padded"])
        act = {"clip": dml.ElementWiseClipOperatorDesc(min=-1.0, max=1.5)}.get(
            case["act"], case["act"])
        a_type = "int32" if mut == "int" else dtype

        def make():
            return Desc(T(a_type, ashape, laid[0][1]), T(dtype, bshape, laid[1][1]),
                        T(dtype, cshape, laid[2][1]) if with_c else None,
                        T(dtype, yshape, out_strides), 2 if mut == "trans" else int(ta), int(tb),
                        alpha=case["alpha"], beta=case["beta"], fused_activation=act)

        desc, compiled = compiled_or_refused(device, make, want)
        if desc is None:
            return
        got = run_checked(device, compiled, desc, [lay[0] for lay in laid], read)
        y = reference(laid[0][2], laid[1][2], laid[2][2] if with_c else None, ta, tb,
                      case["alpha"], case["beta"])
        y = np.clip(y, -1.0, 1.5) if case["act"] == "clip" else (
            FORMULAS[case["act"]][1](y) if case["act"] else y)
        np.testing.assert_allclose(got.astype(np.float64), y, **_tol(dtype, k))

    check()


def _sg_or_skip(device, desc, **kw):
    """``desc`` compiled on the sg family (forced), skipping where the device has no
    subgroup shuffles in full subgroups (the family then runs "direct")."""
    from vkml.ops.gemm import CompiledGemm

    from vkml.ops.convolution.gemm import subgroup_shuffle_size

    op = CompiledGemm(device, device.create_operator(desc).desc, path="sg", **kw)
    if op.path != "sg":
        lacks = subgroup_shuffle_size(op) < 4
        op.release()
        assert lacks, "the sg family handed a product it takes to the direct family"
        pytest.skip("no subgroup shuffles in full subgroups on this device")
    return op


@pytest.mark.parametrize("block", [(16, 8), (16, 12), (8, 16)])
def test_sg_random(device, budget, block):
    """The sg family against float64 NumPy and the direct family (forced) on the same
    operands: ranks 2 to 4, both transforms, batch broadcast by zero strides, C broadcast
    or absent, random Alpha and Beta, odd sizes (K not a multiple of 4: the guarded last
    step; N not a multiple of 4: scalar stores), sizes past one workgroup's block; every
    read of A and B (texels along K or N, elements) is taken."""
    from vkml.ops.gemm import CompiledGemm

    rng = np.random.default_rng(20 + block[1])
    modes = set()
    for case in range(max(8, budget // 4)):
        rank = 2 + case % 3
        batch = tuple(int(rng.integers(1, 4)) for _ in range(rank - 2))
        big = case % 5 == 4
        m, k, n = (int(rng.integers(1, 200 if big else 70)) for _ in range(3))
        m = max(m, block[0] + case % 3)                 # (fewer rows: the direct family)
        if case % 8 < 4:                        # whole texels: RGBA32F reads, vec4 stores
            k, n = 4 * ceil_div(k, 4), 4 * ceil_div(n, 4)
        ta, tb = bool(case & 1), bool(case & 2)
        abatch = tuple(s if rng.random() < 0.7 else 1 for s in batch)
        bbatch = tuple(s if rng.random() < 0.7 else 1 for s in batch)
        batch = np.broadcast_shapes(abatch, bbatch)
        a = rng.standard_normal(abatch + ((k, m) if ta else (m, k))).astype(np.float32)
        b = rng.standard_normal(bbatch + ((n, k) if tb else (k, n))).astype(np.float32)
        c = None
        if case % 4 != 3:
            c = rng.standard_normal(tuple(s if rng.random() < 0.5 else 1
                                          for s in batch + (m, n))).astype(np.float32)
        alpha, beta = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
        desc = _last_desc(a, b, c, ta, tb, alpha, beta)
        arrays = [a, b, c]
        op = _sg_or_skip(device, desc, sg_block=block)
        assert (op.kernel, op.read) == ("gemm_sg_f32", "sg")
        modes.add((op.sg["A_MODE"], op.sg["B_MODE"], op.sg["YV4"]))
        got = run_into_nan(device, op, arrays, int(np.prod(desc.output_tensor.sizes)),
                           "float32")
        old = CompiledGemm(device, device.create_operator(desc).desc, path="direct")
        was = run_into_nan(device, old, arrays, got.size, "float32")
        want = reference(a, b, c, ta, tb, alpha, beta)
        msg = f"{a.shape} {b.shape} {ta} {tb} {op.sg}"
        np.testing.assert_allclose(got.reshape(want.shape), want, **_tol("float32", k),
                                   err_msg=msg)
        np.testing.assert_allclose(got, was, **_tol("float32", k), err_msg=msg)
    assert {mode[:2] for mode in modes} >= {(1, 1), (0, 1), (1, 2), (0, 0)}, modes


def test_sg_modes(device):
    """Each read of the sg family chosen where its rule holds: A as RGBA32F texels of 4 k
    (A_MODE 1) only along K with K a multiple of 4; B along N (1) with N a multiple of 4,
    else along K (2), else elements (0); vec4 stores where N is a multiple of 4."""
    rng = np.random.default_rng(21)
    for (m, k, n, ta, tb), want in {(19, 12, 20, 0, 0): (1, 1, True),
                                    (19, 12, 20, 1, 0): (0, 1, True),
                                    (19, 12, 21, 0, 1): (1, 2, False),
                                    (19, 13, 21, 0, 1): (0, 0, False),
                                    (19, 13, 21, 1, 0): (0, 0, False),
                                    (19, 13, 24, 0, 0): (0, 1, True)}.items():
        a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
        desc = Desc(T("float32", a.shape), T("float32", b.shape), None, T("float32", (m, n)),
                    ta, tb)
        op = _sg_or_skip(device, desc)
        assert (op.sg["A_MODE"], op.sg["B_MODE"], op.sg["YV4"]) == want, (m, k, n, ta, tb)
        got = run_into_nan(device, op, [a, b, None], m * n, "float32")
        np.testing.assert_allclose(got.reshape(m, n), reference(a, b, None, ta, tb),
                                   **_tol("float32", k))


def test_sg_strides_and_canaries(device):
    """The sg family through element strides: A stored transposed, B with NaN in its
    gaps broadcast along the batch, C broadcast along M, an output with NaN canaries in
    its gaps (scalar stores: its rows are not whole vec4s)."""
    rng = np.random.default_rng(22)
    bt, ch, m, k, n = 2, 3, 21, 11, 19
    a_mem = rng.standard_normal((bt, ch, k, m)).astype(np.float32)
    a = a_mem.swapaxes(-1, -2)
    b_mem = np.full((ch, k, n + 3), np.nan, np.float32)
    b_mem[:, :, :n] = rng.standard_normal((ch, k, n))
    b = np.broadcast_to(b_mem[:, :, :n], (bt, ch, k, n))
    c_mem = rng.standard_normal((bt, ch, n)).astype(np.float32)
    c = np.broadcast_to(c_mem[:, :, None, :], (bt, ch, m, n))
    y_strides = (ch * m * 24, m * 24, 24, 1)
    out_elems = bt * y_strides[0]
    shape = (bt, ch, m, n)
    desc = Desc(T("float32", (bt, ch, m, k), (ch * k * m, k * m, 1, m)),
                T("float32", (bt, ch, k, n), (0, k * (n + 3), n + 3, 1)),
                T("float32", shape, (ch * n, n, 0, 1)), T("float32", shape, y_strides),
                alpha=0.75, beta=-1.25)
    op = _sg_or_skip(device, desc)
    assert not op.sg["YV4"]
    got = run_into_nan(device, op, [a_mem, b_mem, c_mem], out_elems, "float32")
    idx = sum(np.arange(s).reshape([-1 if i == d else 1 for i in range(4)]) * st
              for d, (s, st) in enumerate(zip(shape, y_strides)))
    np.testing.assert_allclose(got[idx], reference(a, b, c, alpha=0.75, beta=-1.25),
                               **_tol("float32", k))
    gaps = np.ones(out_elems, bool)
    gaps[idx.reshape(-1)] = False
    assert np.isnan(got[gaps]).all(), "a write landed outside the output"


@pytest.mark.parametrize("act, params", [("relu", {}), ("sigmoid", {}),
                                         ("clip", {"min": -0.5, "max": 1.0})])
def test_sg_fused_activation(device, act, params):
    """The fused activation after Alpha * AB + Beta * C on the sg family, vec4 stores and
    scalar ones."""
    rng = np.random.default_rng(23)
    for n in (12, 9):
        a = rng.standard_normal((2, 17, 12)).astype(np.float32)
        b = rng.standard_normal((2, 12, n)).astype(np.float32)
        c = rng.standard_normal((n,)).astype(np.float32)
        desc = Desc(T("float32", a.shape), T("float32", b.shape),
                    T("float32", (2, 17, n), (0, 0, 1)), T("float32", (2, 17, n)),
                    alpha=0.5, beta=2.0, fused_activation=dml.ACTIVATIONS[act](**params))
        op = _sg_or_skip(device, desc)
        got = run_into_nan(device, op, [a, b, c], 2 * 17 * n, "float32").reshape(2, 17, n)
        want = reference(a, b, c, alpha=0.5, beta=2.0)
        want = np.clip(want, -0.5, 1.0) if act == "clip" else FORMULAS[act][1](want, **params)
        np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-5)


def test_sg_split_grids_and_declines(device):
    """maxComputeWorkGroupCount lowered: the sg family's grid split along N, M and the
    layers; where it does not take the product (float16, windows past
    maxStorageBufferRange, a read forced to "ssbo", fewer rows than its block) "sg" runs
    the direct family, and the tuner's sg candidates decline."""
    from vkml import tuning
    from vkml.ops.gemm import PATH, CompiledGemm, _path_run

    rng = np.random.default_rng(24)
    a = rng.standard_normal((3, 2, 150, 24)).astype(np.float32)
    b = rng.standard_normal((3, 2, 24, 136)).astype(np.float32)
    c = rng.standard_normal((3, 2, 150, 136)).astype(np.float32)
    want = reference(a, b, c, alpha=1.5, beta=0.5)
    desc = Desc(T("float32", a.shape), T("float32", b.shape), T("float32", c.shape),
                T("float32", c.shape), alpha=1.5, beta=0.5)
    for limits in ({"maxComputeWorkGroupCount": (2, 1, 2)},
                   {"maxComputeWorkGroupCount": (1, 2, 7)}):
        with vkml.Device(device.index, limits=limits) as small:
            op = _sg_or_skip(small, desc)
            got = run_into_nan(small, op, [a, b, c], c.size, "float32")
            np.testing.assert_allclose(got.reshape(c.shape), want, **_tol("float32", 24))
    align = device._ctx.binding_alignment()
    a, b, c = (np.ascontiguousarray(x) for x in (a[..., :40, :], b[..., :72], c[..., :40, :72]))
    desc = Desc(T("float32", a.shape), T("float32", b.shape), T("float32", c.shape),
                T("float32", c.shape), alpha=1.5, beta=0.5)
    with vkml.Device(device.index, limits={"maxStorageBufferRange": 8192 + 4 * align}) as small:
        op = CompiledGemm(small, small.create_operator(desc).desc, path="sg")
        assert op.path == "direct" and op.windows is not None
        got = run_into_nan(small, op, [a, b, c], c.size, "float32")
        np.testing.assert_allclose(got.reshape(c.shape), reference(a, b, c, alpha=1.5, beta=0.5),
                                   **_tol("float32", 24))
    op = CompiledGemm(device, device.create_operator(desc).desc, path="sg", read="ssbo")
    assert (op.path, op.read) == ("direct", "ssbo")
    op.release()
    h = [x.astype(np.float16) for x in (a, b)]
    hdesc = Desc(T("float16", a.shape), T("float16", b.shape), None, T("float16", c.shape))
    op = CompiledGemm(device, device.create_operator(hdesc).desc, path="sg")
    assert op.path == "direct"
    got = run_into_nan(device, op, h + [None], c.size, "float16")
    np.testing.assert_allclose(got.reshape(c.shape).astype(np.float64), reference(*h),
                               **_tol("float16", 24))
    few = Desc(T("float32", (15, 8)), T("float32", (8, 8)), None, T("float32", (15, 8)))
    op = CompiledGemm(device, device.create_operator(few).desc, path="sg")
    assert op.path == "direct"
    op.release()
    sg = next(cand for cand in PATH.candidates if cand.name == "sg-16x8")
    for dtype, m in (("float16", 16), ("float32", 15)):
        with device.sequence(timed=True) as seq, pytest.raises(tuning.Declined):
            _path_run(device, seq, sg, {"m": m, "k": 8, "n": 8, "batch": 1, "dtype": dtype})


def test_sg_rules(device):
    """``sg_block`` must be one of SG_BLOCKS."""
    from vkml.ops.gemm import CompiledGemm

    desc = Desc(T("float32", (4, 4)), T("float32", (4, 4)), None, T("float32", (4, 4)))
    with pytest.raises(ValidationError) as err:
        CompiledGemm(device, device.create_operator(desc).desc, path="sg", sg_block=(4, 4))
    assert err.value.field == "sg_block"


#: (M, K, N, trans_a, trans_b, k_block, KB the kernel takes: where K has K_BLOCKS_MIN
#: blocks and a workgroup more than one subgroup of 16 rows, else 0).
K_BLOCK_CASES = [
    (70, 64, 36, 0, 0, 8, 8),        # 5 row blocks: subgroups past the last row
    (40, 45, 20, 1, 0, 8, 8),        # K past the last whole 4, a partial last block
    (33, 100, 17, 0, 1, 12, 12),     # a block of 12 k, N not a multiple of 4, B along K
    (50, 64, 24, 0, 0, 16, 16),      # exactly K_BLOCKS_MIN blocks, batch broadcast
    (40, 28, 20, 0, 0, 8, 0),        # fewer blocks than K_BLOCKS_MIN: none
    (16, 64, 20, 0, 0, 8, 0),        # one subgroup a workgroup: nothing to share
]


@pytest.mark.parametrize("m, k, n, ta, tb, k_block, want_kb", K_BLOCK_CASES)
def test_sg_k_blocks(device, m, k, n, ta, tb, k_block, want_kb):
    """The sg family's K blocking (``k_block`` forced small, so that small products have
    blocks) against float64 NumPy and the family without it: K a multiple of the block or
    not, K past the last whole 4 (the guarded step after the blocks), subgroups past the
    last row (they skip their steps and still meet every barrier), both transforms, batch
    broadcast by zero strides, C broadcast, Alpha/Beta and a fused activation."""
    rng = np.random.default_rng(26 + k)
    a = rng.standard_normal((2, 1) + ((k, m) if ta else (m, k))).astype(np.float32)
    b = rng.standard_normal((3,) + ((n, k) if tb else (k, n))).astype(np.float32)
    c = rng.standard_normal((1, 3, 1, n)).astype(np.float32)
    desc = _last_desc(a, b, c, ta, tb, -0.75, 1.5)
    desc = dataclasses.replace(desc, fused_activation=dml.ACTIVATIONS["leaky_relu"](alpha=0.1))
    want = reference(np.broadcast_to(a, (2, 3) + a.shape[2:]), b, c, ta, tb, -0.75, 1.5,
                     act="leaky_relu", params={"alpha": 0.1})
    got = {}
    for kb in (k_block, None):
        op = _sg_or_skip(device, desc, k_block=kb)
        got[kb] = op.sg["KB"]
        out = run_into_nan(device, op, [a, b, c], want.size, "float32").reshape(want.shape)
        np.testing.assert_allclose(out, want, **_tol("float32", k), err_msg=f"k_block {kb}")
    assert got == {k_block: want_kb, None: 0}


@pytest.mark.parametrize("k_block", [3, -4, 2.0, True, "8"])
def test_sg_k_block_rules(device, k_block):
    """``k_block`` must be a multiple of 4, at least 0 (an int)."""
    from vkml.ops.gemm import CompiledGemm

    desc = Desc(T("float32", (4, 4)), T("float32", (4, 4)), None, T("float32", (4, 4)))
    with pytest.raises(ValidationError) as err:
        CompiledGemm(device, device.create_operator(desc).desc, path="sg", k_block=k_block)
    assert err.value.field == "k_block"


def test_sg_k_block_candidate(device, monkeypatch):
    """The tuner's K-blocked candidate (full mode; ranked as its block's family should it
    join the fast list) declines a product without K_BLOCKS_MIN blocks of K_BLOCK (it
    would time the unblocked kernel again) and times one with them; chosen, it builds
    that blocking."""
    import importlib

    from vkml import tuning

    gemm_mod = importlib.import_module("vkml.ops.gemm")
    kb = gemm_mod.K_BLOCK
    cand = next(c for c in gemm_mod.PATH.candidates if c.params.get("k_block"))
    assert cand.params == {"path": "sg", "sg_block": (16, 8), "k_block": kb}
    assert gemm_mod._family(cand.name) == "sg-16x8" == gemm_mod._family("sg-16x8")
    short = {"m": 64, "k": gemm_mod.K_BLOCKS_MIN * kb - 4, "n": 32, "batch": 1,
             "dtype": "float32"}
    with device.sequence(timed=True) as seq, pytest.raises(tuning.Declined):
        gemm_mod._path_run(device, seq, cand, short)
    m, k, n = 40, gemm_mod.K_BLOCKS_MIN * kb, 12
    desc = Desc(T("float32", (m, k)), T("float32", (k, n)), None, T("float32", (m, n)))
    real = tuning.choose
    monkeypatch.setattr(gemm_mod.tuning, "choose",
                        lambda dev, path, shape: real(dev, path, shape, force=cand.name))
    op = gemm_mod.CompiledGemm(device, device.create_operator(desc).desc)
    if op.path != "sg":
        op.release()
        pytest.skip("no subgroup shuffles in full subgroups on this device")
    assert op.sg["KB"] == kb
    rng = np.random.default_rng(27)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n)))
    got = run_into_nan(device, op, [a, b, None], m * n, "float32")
    np.testing.assert_allclose(got.reshape(m, n), reference(a, b), **_tol("float32", k))
    with device.sequence(timed=True) as seq:
        gemm_mod._path_run(device, seq, cand, {"m": m, "k": k, "n": n, "batch": 1,
                                               "dtype": "float32"})()


def test_sg_tuner_candidates(device, tmp_path, monkeypatch):
    """Every candidate of gemm_path runs when measured (the sg ones where the device has
    subgroup shuffles in full subgroups, else declined; the K-blocked one where K has its
    blocks); a choice of an sg candidate
    builds that register block."""
    import importlib

    from vkml import tuning
    from vkml.ops.convolution.gemm import subgroup_shuffle_size

    gemm_mod = importlib.import_module("vkml.ops.gemm")      # the module, not the function

    c = tuning.Tuner("full", folder=tmp_path, rounds=1).choose(
        device, "gemm_path", {"m": 40, "k": 12, "n": 36, "batch": 2, "dtype": "float32"})
    names = {cand.name for cand in gemm_mod.PATH.candidates}
    sg = {n for n in names if n.startswith("sg-")}
    blocked = {n for n in sg if n != gemm_mod._family(n)}  # (K 12: no K blocks, declined)
    assert c.source == "measured" and len(sg - blocked) == len(gemm_mod.SG_BLOCKS)
    desc = Desc(T("float32", (40, 12)), T("float32", (12, 36)), None, T("float32", (40, 36)))
    real = tuning.choose
    monkeypatch.setattr(gemm_mod.tuning, "choose",
                        lambda dev, path, shape: real(dev, path, shape, force="sg-16x12"))
    op = gemm_mod.CompiledGemm(device, device.create_operator(desc).desc)
    has_sg = subgroup_shuffle_size(op) >= 4
    assert set(c.times) == (names - blocked if has_sg else names - sg)
    assert (op.path, op.sg_block) == (("sg", (16, 12)) if has_sg else ("direct", (16, 12)))
    rng = np.random.default_rng(25)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((40, 12), (12, 36)))
    got = run_into_nan(device, op, [a, b, None], 40 * 36, "float32")
    np.testing.assert_allclose(got.reshape(40, 36), reference(a, b), **_tol("float32", 12))


def test_sg_choice_not_taken_is_not_observed(device, monkeypatch):
    """A tuner's sg choice for a product the family does not take (fewer rows than its
    block, a class-mate of one it takes) runs direct and is not re-checked against the sg
    candidate's stored time."""
    import importlib

    from vkml import tuning

    gemm_mod = importlib.import_module("vkml.ops.gemm")
    real = tuning.choose

    def stored(dev, path, shape):
        c = real(dev, path, shape, force="sg-16x8")
        return dataclasses.replace(c, source="stored", seconds=1e-3)
    monkeypatch.setattr(gemm_mod.tuning, "choose", stored)
    monkeypatch.setattr(tuning.Tuner, "expected", lambda self, *a, **k: 1e-3)
    few = Desc(T("float32", (12, 8)), T("float32", (8, 8)), None, T("float32", (12, 8)))
    op = gemm_mod.CompiledGemm(device, device.create_operator(few).desc)
    assert op.path == "direct" and op.observed is None
    op.release()


def test_tuner_times_transposed_weights_on_their_layout(device, monkeypatch):
    """A fully connected layer's product (B stored N x K, transposed) is tuned as that
    layout: its shape says ``b_along_k`` (its own shape class), and the tuner's direct
    candidate records the dot-product kernel the layer runs, not a plain product's."""
    import importlib

    gemm_mod = importlib.import_module("vkml.ops.gemm")      # the module, not the function

    desc = Desc(T("float32", (1, 64)), T("float32", (40, 64)), None, T("float32", (1, 40)),
                trans_b=dml.MatrixTransform.TRANSPOSE)
    op = gemm_mod.CompiledGemm(device, device.create_operator(desc).desc)
    shape = op.shape()
    assert shape["b_along_k"] is True and op.kernel.startswith("gemm_dot")
    plain = dict(shape)
    del plain["b_along_k"]
    assert gemm_mod._path_class(shape) != gemm_mod._path_class(plain)
    op.release()
    built = []
    real = gemm_mod.CompiledGemm.build

    def spy(self):
        real(self)
        built.append(self.kernel)
    monkeypatch.setattr(gemm_mod.CompiledGemm, "build", spy)
    direct = next(c for c in gemm_mod.PATH.candidates if c.name == "direct")
    for s, want in ((shape, "gemm_dot"), (plain, "gemm_direct")):
        with device.sequence(timed=True) as seq:
            free = gemm_mod._path_run(device, seq, direct, s)
            seq.run()
            free()
        assert built[-1].startswith(want), (s, built)


def test_one_disturbed_warm_up_cuts_no_candidate(monkeypatch):
    """gemm_path re-runs a candidate cut on one slow timed warm-up (``recheck_cuts``):
    sg's warm-up stalled past the recheck line (3x direct's) is timed again, and with
    its real time neither candidate is cut, so the rounds decide."""
    import importlib

    from vkml import tuning

    gemm_mod = importlib.import_module("vkml.ops.gemm")
    assert gemm_mod.PATH.recheck_cuts
    seq = type("Seq", (), {"close": lambda self: None})()
    timed = [tuning._Timed(c, seq, None, 0.02) for c in gemm_mod.PATH.candidates
             if c.name in ("direct", "sg-16x8")]
    timed[0].warm, timed[1].warm = 2.7e-3, 10e-3       # direct's, sg's stalled one
    monkeypatch.setattr(tuning, "_run_once", lambda s: 0.6e-3)
    dropped, once = tuning._cut_slow(timed, gemm_mod.PATH.recheck_cuts)
    assert (dropped, once) == ({}, set())
    assert [t.warm for t in timed] == [2.7e-3, 0.6e-3]


class _Ranked:
    """A tuner whose only answer is the given family times (gemm_family's reference)."""

    def __init__(self, times, mode="fast"):
        self.times, self.mode = times, mode

    def effective_mode(self, mode=None):
        return mode or self.mode

    def choose(self, device, path, shape, **kw):
        import importlib

        gemm_mod = importlib.import_module("vkml.ops.gemm")
        assert path is gemm_mod.FAMILY and shape == gemm_mod.FAMILY_SHAPE
        assert kw.get("mode") == "full"             # every family its rounds
        return type("C", (), {"times": self.times})()


def test_fast_list_follows_the_device_ranking(device, monkeypatch):
    """gemm_path's fast list leaves out a family the device's own timing of the reference
    product puts beyond WEAK_FACTOR of its fastest (never the default, "direct"); a family
    within it, or one the reference did not time, stays; with tuning off nothing is
    timed and the marked candidates are the list."""
    import importlib

    from vkml import tuning

    gemm_mod = importlib.import_module("vkml.ops.gemm")
    marked = [c.name for c in gemm_mod.PATH.candidates if c.fast]
    assert marked == ["direct", "tiled", "sg-16x8"] and set(gemm_mod.FAMILIES) == set(marked)
    shape = {"m": 512, "k": 512, "n": 512, "batch": 1, "dtype": "float32"}
    w = gemm_mod.WEAK_FACTOR

    def fast(times, mode="fast"):
        monkeypatch.setattr(tuning, "default_tuner", lambda: _Ranked(times, mode))
        return gemm_mod._fast(shape, device)
    assert fast({"direct": 1e-3, "sg-16x8": 0.6e-3, "tiled": 0.6e-3 * w * 1.01}) == \
        ["direct", "sg-16x8"]                                   # lavapipe's ranking
    assert fast({"direct": 1e-3, "sg-16x8": 1e-3 * w * 1.01, "tiled": 1e-3 * w * 0.99}) == \
        ["direct", "tiled"]                                     # SwiftShader's
    assert fast({"direct": 1e-3 * w * 2, "sg-16x8": 1e-3, "tiled": 1e-3}) == marked
    assert fast({"direct": 1e-3, "tiled": 1e-3 * w * 2}) == ["direct", "sg-16x8"]
    assert fast({"direct": 1e-3, "sg-16x8": 1e-3, "tiled": 1e-3}) == marked
    assert fast({"direct": 1e-3, "tiled": 1.0}, mode="off") == marked
    assert tuning.Tuner("off").choose(device, gemm_mod.PATH, shape).name == "direct"


def test_device_ranking_is_measured_once(device, tmp_path, monkeypatch):
    """The ranking is a tuner choice like any other (tunable path gemm_family), timed in
    the full mode on the first fast call, stored, then read back without timing; the
    product's own choice then times only the families it keeps."""
    import importlib

    from vkml import tuning

    gemm_mod = importlib.import_module("vkml.ops.gemm")
    t = tuning.Tuner("fast", folder=tmp_path, rounds=1)
    monkeypatch.setattr(tuning, "default_tuner", lambda: t)
    times = gemm_mod.family_times(device)
    assert {"direct", "tiled"} <= set(times) <= set(gemm_mod.FAMILIES)
    c = t.choose(device, gemm_mod.FAMILY, gemm_mod.FAMILY_SHAPE, mode="full")
    assert c.source == "stored" and c.times == times
    kept = gemm_mod._fast({"m": 32, "k": 32, "n": 32, "batch": 1, "dtype": "float32"}, device)
    best = min(times.values())
    assert kept == [n for n in ("direct", "tiled", "sg-16x8")
                    if n == "direct" or times.get(n, 0.0) <= gemm_mod.WEAK_FACTOR * best]
    choice = t.choose(device, gemm_mod.PATH, {"m": 32, "k": 32, "n": 32, "batch": 1,
                                               "dtype": "float32"})
    assert set(choice.times) <= set(kept) and choice.name in kept
    monkeypatch.setattr(tuning, "_run_once", None)          # would fail if it timed again
    assert gemm_mod.family_times(device) == times


def test_fast_list_of_few_rows_needs_no_ranking(device, monkeypatch):
    """A product of fewer rows than sg's block and "tiled"'s TILED_MIN_ROWS (a classifier's
    one-row product) times "direct" alone: its fast list asks for no family ranking
    (which would compile every family); sg joins from its block's rows on, "tiled" from
    TILED_MIN_ROWS, both then filtered by the ranking as before."""
    import importlib

    from vkml import tuning

    gemm_mod = importlib.import_module("vkml.ops.gemm")

    class _NoRanking:
        def effective_mode(self, mode=None):
            return mode or "fast"

        def choose(self, *a, **k):
            raise AssertionError("ranked the families for a one-row product")
    monkeypatch.setattr(tuning, "default_tuner", lambda: _NoRanking())
    rng = np.random.default_rng(11)
    for m in [1] + [int(v) for v in rng.integers(1, gemm_mod.TILED_MIN_ROWS, size=4)]:
        shape = {"m": m, "k": int(rng.integers(1, 2048)), "n": int(rng.integers(1, 2048)),
                 "batch": 1, "dtype": "float32"}
        assert gemm_mod._fast(shape, device) == ["direct"]
    mb = gemm_mod.SG_BLOCKS[0][0]
    times = {"direct": 1e-3, "sg-16x8": 1e-3, "tiled": 1e-3}
    monkeypatch.setattr(tuning, "default_tuner", lambda: _Ranked(times))
    for m, want in ((gemm_mod.TILED_MIN_ROWS, ["direct", "tiled"]),
                    (mb - 1, ["direct", "tiled"]), (mb, ["direct", "tiled", "sg-16x8"])):
        shape = {"m": m, "k": 64, "n": 64, "batch": 1, "dtype": "float32"}
        assert gemm_mod._fast(shape, device) == want


def test_sg_declines_the_rows_its_fast_list_leaves_out(device):
    """The sg rule of the fast list is the kernel's own: a product of fewer rows than the
    block runs on "direct" even when sg is asked for (so its run declines)."""
    import importlib

    gemm_mod = importlib.import_module("vkml.ops.gemm")
    mb = gemm_mod.SG_BLOCKS[0][0]
    for m in (1, mb - 1):
        t = [dml.TensorDesc("float32", (1, 1, r, c)) for r, c in ((m, 64), (64, 64), (m, 64))]
        op = gemm_mod.CompiledGemm(device, dml.GemmOperatorDesc(t[0], t[1], None, t[2]),
                                   path="sg", sg_block=gemm_mod.SG_BLOCKS[0])
        try:
            assert op.path == "direct"
        finally:
            op.release()

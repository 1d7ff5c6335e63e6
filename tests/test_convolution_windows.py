"""Convolutions whose input, output or residual exceed maxStorageBufferRange, run a window
of the batch at a time on the path a window gets (vkml/ops/convolution/windows.py), not on
the direct path; against PyTorch, on a device whose limit is lowered to 4 MiB (the same
code as at a real limit, on tensors SwiftShader convolves in seconds on any path)."""
from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vkml
from vkml import dml
from vkml.dml.activations import activation
from vkml.errors import UnsupportedError
from vkml.ops.convolution.epilogue import EpilogueConvolutionDesc
from vkml.tensor import Tensor

conv_ops = importlib.import_module("vkml.ops.convolution")
LIMIT = 4 << 20


@pytest.fixture
def lowered(device):
    """The device with maxStorageBufferRange lowered to 4 MiB (as test_lifetime's)."""
    with vkml.Device(device.index, limits={"maxStorageBufferRange": LIMIT}) as dev:
        yield dev


def conv_desc(x_shape, w_shape, y_shape, dtype=np.float32, bias=True, act=None,
              x_strides=None, backward=False, **kw):
    t = lambda shape, strides=None: dml.TensorDesc(dtype, shape, strides)  # noqa: E731
    cout = y_shape[1]
    return dml.ConvolutionOperatorDesc(
        t(x_shape, x_strides), t(w_shape), t((1, cout, 1, 1)) if bias else None, t(y_shape),
        direction=dml.ConvolutionDirection.BACKWARD if backward else
        dml.ConvolutionDirection.FORWARD, fused_activation=activation(act), **kw)


def execute(device, compiled, *arrays):
    """Run ``compiled`` on ``arrays`` (inputs; the output sized by its descriptor)."""
    ins = [device.tensor(np.ascontiguousarray(a).reshape(-1)) if a is not None else None
           for a in arrays]
    out = compiled.desc.outputs()[0]
    y = device.empty(out.total_tensor_size_in_bytes // out.data_type.size, out.dtype)
    try:
        compiled.execute(ins, [y])
        return y.numpy()
    finally:
        compiled.release()


def check_windows(compiled, n: int):
    """The operator runs windows of the batch on a path other than direct; the last one
    smaller where the items do not divide."""
    path = compiled.path
    assert isinstance(path, conv_ops.WindowedPath) and path.name != "direct"
    items = [k for _, k, _ in path.windows]
    assert sum(items) == n and len(items) >= 2 and max(items) == items[0] == path.size
    return items


def torch_conv(x, w, b, act=None, **kw):
    y = F.conv2d(torch.from_numpy(x.astype(np.float32)), torch.from_numpy(w.astype(np.float32)),
                 None if b is None else torch.from_numpy(b.astype(np.float32)), **kw)
    return torch.relu(y).numpy() if act == "relu" else y.numpy()


def compile_or_skip(device, desc, path=None, **kw):
    try:
        return conv_ops.CompiledConvolution(device, device.create_operator(desc).desc,
                                            path=path, **kw)
    except UnsupportedError as exc:
        pytest.skip(f"{path} does not run here: {exc}")


def test_default_path_with_bias_and_activation(lowered):
    """19 items (odd), 2 -> 4 channels of 128 x 128: the output exceeds the limit."""
    rng = np.random.default_rng(1)
    n = 19
    x = rng.standard_normal((n, 2, 128, 128), dtype=np.float32)
    w = rng.standard_normal((4, 2, 3, 3), dtype=np.float32)
    b = rng.standard_normal(4, dtype=np.float32)
    desc = conv_desc(x.shape, w.shape, (n, 4, 128, 128), act="relu", start_padding=(1, 1),
                     end_padding=(1, 1))
    assert desc.output_tensor.total_tensor_size_in_bytes > LIMIT
    compiled = lowered.compile_operator(lowered.create_operator(desc))
    items = check_windows(compiled, n)
    assert items[-1] < items[0]             # the last window partial
    got = execute(lowered, compiled, x, w, b).reshape(n, 4, 128, 128)
    np.testing.assert_allclose(got, torch_conv(x, w, b, "relu", padding=1), rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("path", ["gemm", "gemm_sg", "winograd", "tiled", "blocked",
                                  "depthwise"])
def test_forced_paths(lowered, path):
    """Each fast path, forced, over windows: the input exceeds the limit (tiled: 1x1,
    its 3x3 on four channels takes a minute on SwiftShader)."""
    rng = np.random.default_rng(2)
    c, hw, groups = {"winograd": (16, 40, 1), "depthwise": (4, 128, 4)}.get(path, (4, 128, 1))
    k = 1 if path == "tiled" else 3
    n = LIMIT // (4 * c * hw * hw) + 3
    x = rng.standard_normal((n, c, hw, hw), dtype=np.float32)
    w = rng.standard_normal((c, c // groups, k, k), dtype=np.float32)
    b = rng.standard_normal(c, dtype=np.float32)
    pad = (k // 2, k // 2)
    desc = conv_desc(x.shape, w.shape, x.shape, act="relu", start_padding=pad,
                     end_padding=pad, group_count=groups)
    compiled = compile_or_skip(lowered, desc, path)
    assert compiled.path.name == conv_ops.CANDIDATES[path][0]
    check_windows(compiled, n)
    got = execute(lowered, compiled, x, w, b).reshape(x.shape)
    # (Winograd's transforms add their rounding: test_convolution's path_tolerance)
    np.testing.assert_allclose(got, torch_conv(x, w, b, "relu", padding=k // 2, groups=groups),
                               rtol=1e-4, atol=3e-3 if path == "winograd" else 1e-4)


def test_transposed_and_strided_layout(lowered):
    """A transposed convolution (stride 2) of an NHWC-strided input whose items are not a
    multiple of the alignment: windows start on multiples of the items that are."""
    rng = np.random.default_rng(3)
    n, c, h, k = 53, 3, 36, 4
    x = rng.standard_normal((n, h, h, c), dtype=np.float32)      # NHWC in memory
    w = rng.standard_normal((c, k, 2, 2), dtype=np.float32)
    b = rng.standard_normal(k, dtype=np.float32)
    desc = conv_desc((n, c, h, h), w.shape, (n, k, 2 * h, 2 * h),
                     x_strides=(h * h * c, 1, h * c, c), backward=True, strides=(2, 2))
    assert desc.output_tensor.total_tensor_size_in_bytes > LIMIT
    compiled = compile_or_skip(lowered, desc)
    path = compiled.path
    align = max(lowered.limits["minStorageBufferOffsetAlignment"],
                lowered.limits["minTexelBufferOffsetAlignment"])
    check_windows(compiled, n)
    for n0, _, _ in path.windows:
        assert (n0 * h * h * c * 4) % align == 0 and (n0 * k * 4 * h * h * 4) % align == 0
    got = execute(lowered, compiled, x, w, b).reshape(n, k, 2 * h, 2 * h)
    expect = F.conv_transpose2d(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()),
                                torch.from_numpy(w), torch.from_numpy(b), stride=2).numpy()
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4)


def test_residual(lowered):
    """A graph's residual add fused into a windowed path: the residual read at each
    window's output offset."""
    rng = np.random.default_rng(4)
    n = 19
    x = rng.standard_normal((n, 4, 128, 128), dtype=np.float32)
    w = rng.standard_normal((4, 4, 3, 3), dtype=np.float32)
    b = rng.standard_normal(4, dtype=np.float32)
    r = rng.standard_normal(x.shape, dtype=np.float32)
    plain = conv_desc(x.shape, w.shape, x.shape, start_padding=(1, 1), end_padding=(1, 1))
    fused = EpilogueConvolutionDesc(**{f.name: getattr(plain, f.name) for f in
                                       plain.__dataclass_fields__.values()},
                                    residual=plain.output_tensor)
    compiled = conv_ops.CompiledConvolution(lowered, plain, residual=fused)
    if compiled.desc is not fused:
        compiled.release()
        pytest.skip(f"{compiled.path.name} adds no residual")
    check_windows(compiled, n)
    got = execute(lowered, compiled, x, w, b, r).reshape(x.shape)
    np.testing.assert_allclose(got, torch_conv(x, w, b, padding=1) + r, rtol=1e-4, atol=1e-4)


def test_float16(lowered):
    """float16 tensors (16-bit storage: lavapipe; packed float16 elsewhere)."""
    rng = np.random.default_rng(5)
    n = 35
    x = rng.standard_normal((n, 4, 128, 128)).astype(np.float16)
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float16)
    b = rng.standard_normal(4).astype(np.float16)
    desc = conv_desc(x.shape, w.shape, x.shape, dtype=np.float16, start_padding=(1, 1),
                     end_padding=(1, 1))
    compiled = lowered.compile_operator(lowered.create_operator(desc))
    check_windows(compiled, n)
    got = execute(lowered, compiled, x, w, b).reshape(x.shape).astype(np.float32)
    np.testing.assert_allclose(got, torch_conv(x, w, b, padding=1), rtol=2e-3, atol=2e-2)


def test_owned_filter(lowered):
    """An OWNED_BY_DML filter: copied at initialization, re-laid per execution."""
    rng = np.random.default_rng(6)
    n = 19
    x = rng.standard_normal((n, 4, 128, 128), dtype=np.float32)
    w = rng.standard_normal((4, 4, 3, 3), dtype=np.float32)
    plain = conv_desc(x.shape, w.shape, x.shape, bias=False, start_padding=(1, 1),
                      end_padding=(1, 1))
    owned = dml.TensorDesc(np.float32, w.shape, flags=dml.TensorFlags.OWNED_BY_DML)
    desc = plain.__class__(**{**{f: getattr(plain, f) for f in plain.__dataclass_fields__},
                              "filter_tensor": owned})
    compiled = lowered.compile_operator(lowered.create_operator(desc))
    check_windows(compiled, n)
    compiled.initialize(filter=w)
    got = execute(lowered, compiled, x, None).reshape(x.shape)
    np.testing.assert_allclose(got, torch_conv(x, w, None, padding=1), rtol=1e-4, atol=1e-4)


def test_tensors_in_slices_of_larger_buffers(lowered):
    """Tensors that are themselves sub-allocations at an aligned offset of a larger buffer
    (as a graph's arena views and join slices): the windows' sub-allocations of them."""
    rng = np.random.default_rng(7)
    n = 19
    x = rng.standard_normal((n, 4, 128, 128), dtype=np.float32)
    w = rng.standard_normal((4, 4, 3, 3), dtype=np.float32)
    b = rng.standard_normal(4, dtype=np.float32)
    desc = conv_desc(x.shape, w.shape, x.shape, start_padding=(1, 1), end_padding=(1, 1))
    compiled = lowered.compile_operator(lowered.create_operator(desc))
    check_windows(compiled, n)
    align = max(lowered.limits["minStorageBufferOffsetAlignment"],
                lowered.limits["minTexelBufferOffsetAlignment"], 16)
    made = []

    def sliced(nbytes):
        parent = lowered.empty((nbytes + 3 * align,), np.uint8)
        made.append(parent)
        part = parent.allocation.sub_allocation(2 * align, nbytes)
        return Tensor(lowered, (nbytes,), np.uint8, part, nbytes, owner=False)
    xt, yt = sliced(x.nbytes), sliced(x.nbytes)
    xt.write(x.view(np.uint8).reshape(-1))
    try:
        compiled.execute([xt, lowered.tensor(w), lowered.tensor(b)], [yt])
        got = yt.numpy().view(np.float32).reshape(x.shape)
    finally:
        compiled.release()
        for t in made:
            t.free()
    np.testing.assert_allclose(got, torch_conv(x, w, b, padding=1), rtol=1e-4, atol=1e-4)


def test_one_item_beyond_the_limit_is_refused(lowered):
    x = (2, 65, 128, 128)                        # one item: 4.06 MiB of float32
    desc = conv_desc(x, (4, 65, 1, 1), (2, 4, 128, 128), bias=False)
    with pytest.raises(UnsupportedError) as err:
        lowered.compile_operator(lowered.create_operator(desc))
    assert "maxStorageBufferRange" in str(err.value)
    small = conv_desc((1, 1, 4, 4), (1, 1, 1, 1), (1, 1, 4, 4))      # the device still works
    with lowered.compile_operator(lowered.create_operator(small)) as op:
        assert op.path.name

"""Parameter blocks packed by member name (vkml/runtime/blocks.py): a kernel whose members
are reordered reads what it was given, and every wrong fill fails loudly, naming kernel,
block and member; a push of the wrong size is refused at dispatch."""
from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import vkml
from vkml.errors import DeviceError
from vkml.runtime import Bind, blocks, pipelines
from vkml.runtime.blocks import BlockError, Layout, layout, pack

ROOT = Path(__file__).resolve().parent.parent

#: A test kernel's members (GLSL declaration, name) and the words it copies each one to.
MEMBERS = [("uint a;", "a"), ("float b;", "b"), ("uvec4 c[2];", "c"), ("ivec2 d;", "d"),
           ("vec3 e;", "e"), ("int f;", "f"), ("uint g[3];", "g")]
KERNEL = """#version 450
layout(local_size_x = 1) in;
layout(std430, set = 0, binding = 0) buffer Out { uint y[]; };
layout(std140, set = 0, binding = 1) uniform Params { %s };
layout(push_constant) uniform Push { %s };
void main() {
    y[0] = a; y[1] = floatBitsToUint(b);
    for (int i = 0; i < 2; i++) for (int j = 0; j < 4; j++) y[2 + 4 * i + j] = c[i][j];
    y[10] = uint(d.x); y[11] = uint(d.y);
    y[12] = floatBitsToUint(e.x); y[13] = floatBitsToUint(e.y); y[14] = floatBitsToUint(e.z);
    y[15] = uint(f);
    for (int i = 0; i < 3; i++) y[16 + i] = g[i];
    y[19] = 19u;                  // every word of the output written
    y[20] = pa; y[21] = floatBitsToUint(pb); y[22] = uint(pc.x); y[23] = uint(pc.y);
    y[24] = uint(pc.z); y[25] = pd[0]; y[26] = pd[1];
}
"""
PUSH_MEMBERS = [("uint pa;", "pa"), ("float pb;", "pb"), ("ivec3 pc;", "pc"),
                ("uint pd[2];", "pd")]
VALUES = {"a": 7, "b": -1.5, "c": [1, 2, 3, 4, 5, 6, 7, 8], "d": (-3, 4), "e": (0.25, 2.0, -8.0),
          "f": -(1 << 31), "g": [9, 10]}
PUSH_VALUES = {"pa": (1 << 32) - 1, "pb": 3.0, "pc": (-1, 0, 1 << 30), "pd": [11]}


def _expected() -> np.ndarray:
    f = lambda v: int(np.float32(v).view(np.uint32))                   # noqa: E731
    u = lambda v: v & 0xFFFFFFFF                                        # noqa: E731
    return np.array([7, f(-1.5), 1, 2, 3, 4, 5, 6, 7, 8, u(-3), 4, f(0.25), f(2.0), f(-8.0),
                     u(-(1 << 31)), 9, 10, 0, 19, (1 << 32) - 1, f(3.0), u(-1), 0, 1 << 30, 11,
                     0], np.uint32)


def _build_shaders():
    spec = importlib.util.spec_from_file_location("build_shaders",
                                                  ROOT / "tools" / "build_shaders.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _compile(tmp_path: Path, name: str, order: list[int]) -> tuple[bytes, dict]:
    """(SPIR-V, manifest entry) of the test kernel with its members in ``order``."""
    glslc = shutil.which("glslc")
    if glslc is None:
        pytest.skip("glslc not installed")
    src = tmp_path / f"{name}.comp"
    params = " ".join(MEMBERS[i][0] for i in order)
    push = " ".join(PUSH_MEMBERS[i][0] for i in order if i < len(PUSH_MEMBERS))
    src.write_text(KERNEL % (params, push))
    out = tmp_path / f"{name}.spv"
    # unoptimized: names kept, so the module is its own manifest entry
    subprocess.run([glslc, "-fshader-stage=compute", "--target-env=vulkan1.1", "-O0",
                    str(src), "-o", str(out)], check=True, capture_output=True)
    code = out.read_bytes()
    return code, {**_build_shaders().reflect(code), "frozen": []}


@pytest.fixture
def test_kernels(tmp_path, monkeypatch):
    """Two variants of the test kernel, members in declaration order and reversed, as if
    vkml/shaders shipped them."""
    orders = {"blocktest_forward": list(range(len(MEMBERS))),
              "blocktest_reversed": list(reversed(range(len(MEMBERS))))}
    code = {}
    manifest = pipelines.kernel_manifest()
    for name, order in orders.items():
        code[name], entry = _compile(tmp_path, name, order)
        monkeypatch.setitem(manifest, name, entry)
    real = pipelines.load_spirv
    monkeypatch.setattr(pipelines, "load_spirv", lambda n: code[n] if n in code else real(n))
    layout.cache_clear()
    yield list(orders)
    layout.cache_clear()


def test_reordered_members_are_packed_where_the_kernel_reads_them(device, test_kernels):
    """The same values packed for two kernels whose blocks declare the members in opposite
    orders: their offsets differ, and each kernel reads back exactly what it was given."""
    forward, reversed_ = (layout(k, "Params") for k in test_kernels)
    assert forward.members["a"].offset != reversed_.members["a"].offset
    assert layout(test_kernels[0]).members["pa"].offset != layout(test_kernels[1]).members[
        "pa"].offset
    ctx = device._ctx
    for name in test_kernels:
        params = ctx.allocate(layout(name, "Params").size)
        ctx.write(params, np.frombuffer(pack(name, "Params", **VALUES), np.uint8))
        out = device.empty((27,), np.uint32)
        pipe = ctx.pipelines.variant(name, {})
        with device.sequence() as seq:
            seq.dispatch(pipe, [Bind(out._alloc, 0, 27 * 4, "w"), Bind(params)], (1, 1, 1),
                         pack(name, "push", **PUSH_VALUES))
            seq.run()
        np.testing.assert_array_equal(out.numpy(), _expected(), err_msg=name)
        params.free()
        out.free()


def test_permuted_layout_follows_the_offsets():
    """A real block (fold_f32's Params) with its members laid out in reverse order, as a
    reordered GLSL block would be reflected: each value lands at its member's new offset
    (and nowhere else)."""
    real = layout("fold_f32", "Params")
    members, at = {}, 0
    for name in reversed(list(real.members)):
        m = real.members[name]
        members[name] = dataclasses.replace(m, offset=at)
        at += -(m.stride * m.count) % 16 + m.stride * m.count if m.array else 16
    values = {"out_stride": list(range(1, 9)), "in_stride": [11, 12, 13, 0],
              "start": [-1, 2, -3, 4, 0, 0], "blocks": [5, 6, 7], "block_stride": [8, 9],
              "in_texels": 99}
    for lay in (real, Layout(real.kernel, real.block, at, members)):
        words = np.frombuffer(lay.pack(values), np.uint32)
        placed = np.zeros(words.size, bool)
        for n, v in values.items():
            m = lay.members[n]
            for i, x in enumerate(np.asarray(v).reshape(-1)):
                w = m.offset // 4 + (i // m.components) * (m.stride // 4) + i % m.components
                assert words[w] == np.int64(x).astype(np.uint32), (n, i)
                placed[w] = True
        assert not words[~placed].any()
    assert members["in_texels"].offset != real.members["in_texels"].offset


@pytest.mark.parametrize("values, match", [
    (dict(origin=[0], extent=[1], in_base=0, out_base=0, x_count=1, magic=[0], bogus=1),
     "member bogus: the block has no such member; it declares origin"),
    (dict(origin=[0], extent=[1], in_base=0, out_base=0, magic=[0]),
     "member x_count: not given"),
    (dict(origin=[0], extent=[1], in_base=0.5, out_base=0, x_count=1, magic=[0]),
     "member in_base: uint takes integers"),
    (dict(origin=[0], extent=[1], in_base="0", out_base=0, x_count=1, magic=[0]),
     "member in_base: uint takes numbers"),
    (dict(origin=[0], extent=[1], in_base=-1, out_base=0, x_count=1, magic=[0]),
     r"member in_base: -1 is outside uint's range"),
    (dict(origin=[0], extent=[1], in_base=0, out_base=1 << 32, x_count=1, magic=[0]),
     r"member out_base: 4294967296 is outside uint's range"),
    (dict(origin=list(range(9)), extent=[1], in_base=0, out_base=0, x_count=1, magic=[0]),
     r"member origin: uvec4\[2\] takes at most 8 values"),
    (dict(origin=[0], extent=[1], in_base=0, out_base=0, x_count=[1, 2], magic=[0]),
     r"member x_count: uint takes 1 value\(s\), got 2"),
])
def test_wrong_fills_name_kernel_block_and_member(values, match):
    with pytest.raises(BlockError, match="kernel fold_f32, block push, " + match):
        pack("fold_f32", "push", **values)


def test_wrong_vector_and_float_members():
    ok = dict(out_stride=[1], in_stride=[1, 2, 3, 0], start=[0], blocks=[1], block_stride=[1],
              in_texels=0)
    assert len(pack("fold_f32", "Params", **ok)) == layout("fold_f32", "Params").size
    with pytest.raises(BlockError, match=r"member in_stride: uvec4 takes 4 value\(s\), got 3"):
        pack("fold_f32", "Params", **{**ok, "in_stride": [1, 2, 3]})
    with pytest.raises(BlockError, match=r"member start: -2147483649 is outside ivec4\[2\]"):
        pack("fold_f32", "Params", **{**ok, "start": [-(1 << 31) - 1]})
    act = dict(out_stride=[1], in_stride=[1])
    with pytest.raises(BlockError, match="member p: vec4 takes numbers"):
        pack("activation_f32", "Params", **act, p=[None] * 4)
    words = np.frombuffer(pack("activation_f32", "Params", **act, p=[0.5, -2, np.inf, 1e-40]),
                          np.float32)
    off = layout("activation_f32", "Params").members["p"].offset // 4
    np.testing.assert_array_equal(words[off:off + 4], np.float32([0.5, -2, np.inf, 1e-40]))


def test_unknown_kernels_and_blocks():
    with pytest.raises(BlockError, match="no kernel variant named 'fold_f33'"):
        pack("fold_f33", "push")
    with pytest.raises(BlockError, match="kernel fold_f32 has no uniform block named 'Parms'; "
                                         "it declares Params"):
        layout("fold_f32", "Parms")
    with pytest.raises(BlockError, match="kernel store_probe_u64 has no uniform block"):
        layout("store_probe_u64", "Params")
    with pytest.raises(BlockError, match="kernel convolution_tiled_f16 declares no push"):
        layout("convolution_tiled_f16")
    with pytest.raises(BlockError, match="block Params, member value_bits: not given"):
        layout("padding_e4", "Params").pack({})


def test_every_block_of_every_kernel_has_a_layout():
    """Each shipped kernel's push constants and uniform blocks can be packed by name, and
    a block's members fit its size without overlapping."""
    for name, entry in pipelines.kernel_manifest().items():
        blocks_ = ([blocks.PUSH] if entry["push_constants"]["members"] else []) + [
            b["names"][0] for b in entry["bindings"] if b["kind"] == "uniform_buffer"]
        for block in blocks_:
            lay = layout(name, block)
            taken = set()
            for m in lay.members.values():
                for e in range(m.count):
                    words = range(m.offset // 4 + e * m.stride // 4,
                                  m.offset // 4 + e * m.stride // 4 + m.components)
                    assert not taken & set(words), (name, block, m.name)
                    assert words.stop <= lay.size // 4, (name, block, m.name)
                    taken |= set(words)


def test_dispatch_refuses_a_push_of_the_wrong_size(device):
    """A push shorter or longer than the kernel's block is refused when recorded, naming
    the kernel; the device runs the next operator as before."""
    ctx = device._ctx
    pipe = ctx.pipelines.variant("padding_e4", {"LOCAL_SIZE_X": 64, "MODE": 0})
    x, y = device.tensor(np.ones(4, np.float32)), device.empty((6,), np.float32)
    size = layout("padding_e4").size
    for push in (bytes(size - 4), bytes(size + 4), b""):
        with device.sequence() as seq:
            with pytest.raises(DeviceError, match=f"padding_e4: {len(push)} bytes of push "
                                                  f"constants for a block of {size}"):
                seq.dispatch(pipe, [Bind(x._alloc), Bind(y._alloc, access="w"),
                                    Bind(x._alloc), Bind(x._alloc)], (1, 1, 1), push)
    np.testing.assert_array_equal(vkml.pad(np.ones(4, np.float32), [1], [1], device=device),
                                  [0, 1, 1, 1, 1, 0])

"""The shipped SPIR-V matches its GLSL: a stale .spv fails here (tools/build_shaders.py)."""
from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _build_module():
    spec = importlib.util.spec_from_file_location("build_shaders", ROOT / "tools" / "build_shaders.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_stale_spirv():
    mod = _build_module()
    specs, _, todo = mod.stale()
    assert not todo, f"stale SPIR-V, run tools/build_shaders.py: {todo}"
    shipped = {p.stem for p in mod.OUT.glob("*.spv")}
    assert shipped == set(specs), f"orphan or missing .spv files: {shipped ^ set(specs)}"


def test_spirv_is_spirv():
    mod = _build_module()
    for path in mod.OUT.glob("*.spv"):
        data = path.read_bytes()
        assert len(data) % 4 == 0 and struct.unpack_from("<I", data)[0] == 0x07230203, path.name


def test_every_variant_has_a_source():
    mod = _build_module()
    for name, spec in mod.variants().items():
        assert (mod.GLSL / spec["source"]).exists(), name

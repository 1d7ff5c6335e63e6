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


def test_manifest_matches_the_spirv():
    """Each variant's recorded interface agrees with its shipped SPIR-V (constant ids and
    types, binding kinds, block and push-constant offsets), and bindings run 0..n-1."""
    import json
    mod = _build_module()
    manifest = json.loads(mod.MANIFEST.read_text())
    assert set(manifest) == set(mod.variants())
    for name, entry in manifest.items():
        shipped = mod.reflect((mod.OUT / f"{name}.spv").read_bytes())
        assert not mod.mismatches(entry, shipped), (name, mod.mismatches(entry, shipped))
        assert [(b["set"], b["binding"]) for b in entry["bindings"]] == \
            [(0, i) for i in range(len(entry["bindings"]))], name
        ids = [c["id"] for c in entry["constants"].values()]
        assert len(ids) == len(set(ids)) and "LOCAL_SIZE_X" in entry["constants"], name


def test_manifest_records_the_interface():
    """Known facts of two kernels, read by hand from their GLSL."""
    import json
    manifest = json.loads(_build_module().MANIFEST.read_text())
    pad = manifest["padding_e4"]
    assert {n: (c["id"], c["type"]) for n, c in pad["constants"].items()} == {
        "LOCAL_SIZE_X": (0, "uint"), "RANK": (1, "int"), "MODE": (2, "uint"), "XDIMS": (3, "int")}
    assert [(b["kind"], b["access"]) for b in pad["bindings"]] == [
        ("storage_buffer", "readonly"), ("storage_buffer", "readwrite"),
        ("uniform_buffer", "readonly"), ("storage_buffer", "readonly")]
    assert pad["push_constants"]["size"] == 76
    rows = manifest["padding_rows_e4"]
    assert rows["constants"]["MODE"]["id"] == 3 and rows["constants"]["LOCAL_SIZE_Y"]["id"] == 1
    assert rows["bindings"][0]["kind"] == "uniform_texel_buffer"
    assert rows["constants"]["SIMPLE"] == {"id": 6, "type": "bool", "default": True}
    filt = manifest["convolution_filter_texel"]
    assert [(b["kind"], b["access"]) for b in filt["bindings"]][:2] == [
        ("uniform_texel_buffer", "readonly"), ("storage_buffer", "writeonly")]
    params = filt["bindings"][2]
    assert params["kind"] == "uniform_buffer" and params["members"][0]["offset"] == 0
    assert pad["frozen"] == [] and rows["frozen"] == ["ROWS_FULL", "ROWS_BL", "ROWS_BR"]


def test_frozen_lines_name_declared_constants(tmp_path, monkeypatch):
    """``// vkml:frozen`` names become each variant's ``frozen`` list (those it declares);
    a name no variant of its file declares is reported, naming file and constant."""
    build = _build_module()
    text = "\n".join(["#version 450", "// vkml:variant k_a A=1", "// vkml:variant k_b B=1",
                     "// why: selects code", "// vkml:frozen MODE", "// vkml:frozen EXTRA",
                     "layout(constant_id = 1) const int MODE = 0;", "void main() {}", ""])
    (tmp_path / "k.comp").write_text(text)
    monkeypatch.setattr(build, "GLSL", tmp_path)
    specs = build.variants()
    assert specs["k_a"]["frozen"] == specs["k_b"]["frozen"] == ["MODE", "EXTRA"]
    consts = {"MODE": {"id": 1}, "LOCAL_SIZE_X": {"id": 0}}
    assert build.frozen_of(specs["k_a"], consts) == ["MODE"]
    manifest = {n: {"source": "k.comp", "constants": consts} for n in specs}
    assert build.unknown_frozen(specs, manifest) == [
        "glsl/k.comp: vkml:frozen EXTRA is no constant of its variants"]
    del manifest["k_b"]["constants"]["MODE"], manifest["k_a"]
    assert "MODE" in " ".join(build.unknown_frozen(specs, manifest))


def test_every_frozen_constant_is_declared():
    """The shipped manifest: every variant's ``frozen`` names are constants it declares,
    and the runtime freezes exactly their ids."""
    import json
    from vkml.runtime.pipelines import interface
    manifest = json.loads(_build_module().MANIFEST.read_text())
    assert sum(bool(e["frozen"]) for e in manifest.values()) > 50
    for name, entry in manifest.items():
        assert set(entry["frozen"]) <= set(entry["constants"]), name
        assert set(interface(name)[3]) == {entry["constants"][c]["id"] for c in entry["frozen"]}


def test_reflection_rejects_non_spirv():
    import pytest
    mod = _build_module()
    with pytest.raises(ValueError):
        mod.reflect(b"\0" * 32)

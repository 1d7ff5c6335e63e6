"""The module cache (``vkml/runtime/pipelines.py``: :func:`read_module`,
:func:`write_module`): a frozen and pruned module is saved in the cache folder's
``modules`` and a later process (here: another device) takes it without freezing or
pruning again, the same bytes; a truncated, altered or foreign file there is never
handed to the driver but made again and rewritten; the folder keeps at most
``MODULES_KEPT`` files; ``VKML_CACHE_DIR=off`` writes nothing; and an operator whose
module came from the cache computes what NumPy does.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.runtime import pipelines, spirv

from helpers import run_desc

#: A kernel variant with ACT frozen into its module (``vkml:frozen`` in
#: glsl/activation.comp), and constants no operator of these tests asks for.
NAME = "activation_f32_texel4"


def _consts(act: int, size: int = 24) -> dict:
    return {"LOCAL_SIZE_X": size, "ACT": act}


def _frozen_ids(name: str, consts: dict) -> tuple:
    """The (id, value) pairs :meth:`PipelineCache.module` freezes for ``consts``."""
    _, _, ids, frozen = pipelines.interface(name, consts)
    return tuple(sorted((c, v) for c, v in ids.items() if c in frozen))


def _expected(name: str, consts: dict) -> bytes:
    code = pipelines.load_spirv(name)
    if pipelines.kernel_manifest()[name].get("aliased"):
        code = spirv.alias(code)
    return spirv.prune(spirv.freeze(code, dict(_frozen_ids(name, consts))))


def _key(name: str, consts: dict) -> str:
    return pipelines.module_key(hashlib.sha256(pipelines.load_spirv(name)).digest(),
                                bool(pipelines.kernel_manifest()[name].get("aliased")),
                                _frozen_ids(name, consts))


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_a_later_device_takes_the_saved_module_without_pruning(device, folder, monkeypatch):
    act = 2
    with vkml.Device(device.index) as dev:
        dev.context.pipelines.variant(NAME, _consts(act))
    path = folder / "modules" / f"{_key(NAME, _consts(act))}.spv"
    saved = path.read_bytes()
    assert saved[32:] == _expected(NAME, _consts(act))
    assert pipelines.read_module(_key(NAME, _consts(act))) == saved[32:]

    def refuse(*a, **k):
        raise AssertionError("freeze/prune ran although the module was saved")
    monkeypatch.setattr(spirv, "prune", refuse)
    monkeypatch.setattr(spirv, "freeze", refuse)
    with vkml.Device(device.index) as dev:
        assert dev.context.pipelines.variant(NAME, _consts(act)).handle
        # the saved module serves every workgroup size: LOCAL_SIZE_X is not frozen
        assert dev.context.pipelines.variant(NAME, _consts(act, 40)).handle


@pytest.mark.parametrize("damage", ["truncated", "altered", "digest", "not_spirv", "dir"])
def test_a_damaged_file_is_made_again(device, folder, damage):
    consts = _consts(3)
    key = _key(NAME, consts)
    path = folder / "modules" / f"{key}.spv"
    good = _expected(NAME, consts)
    path.parent.mkdir(parents=True)
    blob = hashlib.sha256(good).digest() + good
    if damage == "truncated":
        path.write_bytes(blob[:len(blob) // 2])
    elif damage == "altered":
        path.write_bytes(blob[:40] + bytes([blob[40] ^ 1]) + blob[41:])
    elif damage == "digest":
        path.write_bytes(bytes(32) + good)
    elif damage == "not_spirv":
        other = b"\0" * len(good)
        path.write_bytes(hashlib.sha256(other).digest() + other)
    else:
        path.mkdir()
    assert pipelines.read_module(key) is None
    with vkml.Device(device.index) as dev:
        assert dev.context.pipelines.variant(NAME, consts).handle
    assert pipelines.read_module(key) == good


def test_keys_differ_with_constants_aliasing_and_source():
    h = hashlib.sha256(b"x").digest()
    keys = {pipelines.module_key(h, False, ((1, 2),)), pipelines.module_key(h, True, ((1, 2),)),
            pipelines.module_key(h, False, ((1, 3),)), pipelines.module_key(h, False, ((2, 2),)),
            pipelines.module_key(hashlib.sha256(b"y").digest(), False, ((1, 2),))}
    assert len(keys) == 5


def test_the_folder_keeps_at_most_modules_kept(folder, monkeypatch):
    monkeypatch.setattr(pipelines, "MODULES_KEPT", 8)
    code = _expected(NAME, _consts(1))
    for i in range(30):
        pipelines.write_module(f"{i:032x}", code)
        assert len(list((folder / "modules").glob("*.spv"))) <= 8
    # the one written last is kept
    assert pipelines.read_module(f"{29:032x}") == code


def test_no_cache_folder_writes_nothing(device, tmp_path, monkeypatch):
    monkeypatch.setenv("VKML_CACHE_DIR", "off")
    monkeypatch.chdir(tmp_path)
    assert pipelines.module_folder() is None
    assert pipelines.read_module("0" * 32) is None
    with vkml.Device(device.index) as dev:
        assert dev.context.pipelines.variant(NAME, _consts(4)).handle
    assert not list(tmp_path.rglob("*"))


def test_a_cached_module_computes_as_numpy(device, folder):
    """An Elu (its ACT frozen into the activation kernel's module) on two devices in
    turn, the second one's modules read from the cache: both give NumPy's values, and
    the same bits."""
    rng = np.random.default_rng(5)
    shape = tuple(int(v) for v in rng.integers(2, 9, size=4))
    x = rng.standard_normal(shape).astype(np.float32)
    t = dml.TensorDesc("float32", shape)
    got = []
    for _ in range(2):
        with vkml.Device(device.index) as dev:
            got.append(run_desc(dev, dml.ActivationEluOperatorDesc(t, t, 1.0), x)
                       .reshape(shape))
    assert list((folder / "modules").glob("*.spv"))
    want = np.where(x > 0, x, np.expm1(x.astype(np.float64))).astype(np.float32)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
    assert got[0].tobytes() == got[1].tobytes()

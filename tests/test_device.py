"""vkml.devices(), device selection, features and limits (vkml/device.py, runtime/instance.py)."""
from __future__ import annotations

import numpy as np
import pytest

import vkml
from vkml import dml, runtime
from vkml.errors import DeviceError


def test_devices_describe_themselves():
    infos = vkml.devices()
    assert infos, "no Vulkan device"
    for i, info in enumerate(infos):
        assert info.index == i
        assert info.name and info.device_type in ("discrete", "integrated", "virtual", "cpu", "other")
        assert info.api_version.count(".") == 2
        for key in ("maxStorageBufferRange", "maxComputeWorkGroupCount", "subgroupSize",
                    "minStorageBufferOffsetAlignment"):
            assert key in info.limits
        assert info.limits["subgroupSize"] >= 1
        for key in ("fp16", "fp64", "int64", "storage16", "storage8", "push_descriptor"):
            assert isinstance(info.features[key], bool)


def test_select_by_index_and_name(device):
    info = device.info
    with vkml.Device(info.index) as by_index:
        assert by_index.name == info.name
    word = info.name.split()[0].lower()
    with vkml.Device(word) as by_name:
        assert word in by_name.name.lower()


def test_select_by_environment(monkeypatch, device):
    monkeypatch.setenv("VKML_DEVICE", str(device.index))
    with vkml.Device() as dev:
        assert dev.index == device.index


def test_default_prefers_type_then_features():
    from vkml.runtime import DEVICE_TYPE_RANK

    with vkml.Device() as dev:
        best = min(DEVICE_TYPE_RANK[d.device_type] for d in vkml.devices())
        assert DEVICE_TYPE_RANK[dev.info.device_type] == best


@pytest.mark.parametrize("selector", [99, "no-such-gpu"])
def test_unknown_device_is_a_clear_error(selector):
    with pytest.raises(DeviceError, match="no Vulkan device"):
        vkml.Device(selector)


def test_disabled_features_and_lowered_limits(device):
    with vkml.Device(device.index, disable_features=["fp64", "storage16"],
                     limits={"maxStorageBufferRange": 1 << 20}) as dev:
        assert not dev.features["fp64"] and not dev.features["storage16"]
        assert dev.limits["maxStorageBufferRange"] == 1 << 20
    with pytest.raises(DeviceError, match="unknown feature"):
        vkml.Device(device.index, disable_features=["warp-drive"])


def test_feature_level(device):
    assert device.feature_level == dml.FeatureLevel.FL_6_4
    assert str(device.feature_level) == "DML_FEATURE_LEVEL_6_4"


def test_tensor_round_trip_every_dtype(device):
    from helpers import ALL_DTYPES, random_bits, same_bits

    rng = np.random.default_rng(1)
    for dtype in ALL_DTYPES:
        x = random_bits(rng, (3, 5, 7), dtype)
        t = vkml.tensor(x, device=device)
        assert t.shape == (3, 5, 7) and t.dtype == np.dtype(dtype) and t.device is device
        assert same_bits(t.numpy(), x)
        assert same_bits(np.asarray(t), x)


def test_default_device_is_shared():
    assert vkml.default_device() is vkml.default_device()


def test_one_registry_of_shared_devices(monkeypatch):
    """vkml.device's registry: every way of naming one Vulkan device (the default, its
    index, its name, vkml.onnx's "VKML" and "VKML:<index>") gives one Device object,
    opened again once closed; ``closed`` says whether it was."""
    from vkml import device as vdevice

    monkeypatch.setattr(vdevice, "_SHARED", {})   # the session's own shared devices stay
    made = []
    try:
        default = vdevice.default_device()
        made.append(default)
        assert not default.closed
        assert vdevice.shared_device(default.index) is default
        assert vdevice.shared_device(str(default.index)) is default
        assert vdevice.shared_device(default.info) is default
        for info in vkml.devices():
            dev = vdevice.shared_device(info.index)
            made.append(dev)
            assert dev.index == info.index and vdevice.shared_device(info.index) is dev
            word = info.name.split()[0]
            assert vdevice.shared_device(word).name.lower().find(word.lower()) >= 0
        try:
            import vkml.onnx as vonnx
        except ImportError:
            vonnx = None
        if vonnx is not None:
            from vkml.onnx.backend import resolve_device
            assert resolve_device("VKML") is default and resolve_device(None) is default
            for info in vkml.devices():
                assert resolve_device(f"VKML:{info.index}") is vdevice.shared_device(info.index)
        default.close()
        assert default.closed
        again = vdevice.default_device()
        made.append(again)
        assert again is not default and not again.closed and again.index == default.index
        assert vdevice.shared_device(default.index) is again
    finally:
        for dev in made:
            dev.close()


def test_shared_device_replaced_once_lost(monkeypatch):
    """A shared device that was lost (a timed-out wait marks it so) is replaced by a new
    one for the functional API; the lost one still refuses new work with the
    DeviceError naming what to do, and still closes."""
    from vkml import device as vdevice

    monkeypatch.setattr(vdevice, "_SHARED", {})   # the session's own shared devices stay
    lost = vdevice.default_device()
    try:
        x = lost.tensor(np.ones(4, np.float32))
        lost.context.lost = True
        fresh = vdevice.default_device()
        try:
            assert fresh is not lost and not fresh.context.lost
            assert vdevice.shared_device(lost.index) is fresh
            out = vkml.pad(np.ones((2, 2), np.float32), (1, 1), (1, 1))  # the default
            assert out.shape == (4, 4) and out.sum() == 4.0
            with pytest.raises(DeviceError, match="create a new vkml.Device"):
                lost.tensor(np.ones(4, np.float32))
        finally:
            fresh.close()
        del x
    finally:
        lost.close()
    assert lost.closed


def test_validation_layer_reports_misuse(device):
    """With VKML_VALIDATION=1 (as tools/test runs) the Khronos layer is active and its
    messages reach ``validation_messages`` (which fail the test that caused them): a
    zero-sized buffer, which Vulkan forbids, is reported."""
    from vkml.runtime import vk
    from vkml.runtime.instance import Instance

    if not Instance.get().validation:
        pytest.skip("VKML_VALIDATION is off")
    info = vk.new("VkBufferCreateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "size": 0,
        "usage": vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
        "sharingMode": vk.VK_SHARING_MODE_EXCLUSIVE})
    buf = vk.ffi.new("VkBuffer*")
    result = vk.lib.vkCreateBuffer(device._ctx.device, info, vk.NULL, buf)
    if result == vk.VK_SUCCESS:
        vk.lib.vkDestroyBuffer(device._ctx.device, buf[0], vk.NULL)
    seen = [text for _, text in runtime.validation_messages]
    runtime.validation_messages.clear()
    assert any("VkBufferCreateInfo-size" in text for text in seen), seen


def test_validation_without_the_layer_is_a_clear_error(tmp_path):
    """VKML_VALIDATION on a machine whose loader finds no validation layer (here: an
    empty layer path) names the layer and the variable, rather than the bare
    VK_ERROR_LAYER_NOT_PRESENT."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, VKML_VALIDATION="1", VK_LAYER_PATH=str(tmp_path),
               PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("VK_ADD_LAYER_PATH", None)
    out = subprocess.run([sys.executable, "-c", "import vkml; vkml.devices()"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "VK_LAYER_KHRONOS_validation" in out.stderr and "VKML_VALIDATION" in out.stderr, \
        out.stderr[-2000:]

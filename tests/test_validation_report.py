"""The suite's own validation check (tests/conftest.py) catches messages wherever they
arise: a session of this conftest is run on a provoked misuse in a module fixture, in a
child process and in an object left alive until the session closes its devices, and must
fail, naming each place, while the tests that caused nothing pass."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vkml.runtime.instance import Instance

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

MISUSE = textwrap.dedent('''
    from vkml.runtime import vk


    def zero_sized_buffer(device, destroy=True):
        """Vulkan forbids a buffer of size 0 (VUID-VkBufferCreateInfo-size-00912)."""
        return buffer(device, 0, destroy)


    def buffer(device, size, destroy=True):
        info = vk.new("VkBufferCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "size": size,
            "usage": vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
            "sharingMode": vk.VK_SHARING_MODE_EXCLUSIVE})
        buf = vk.ffi.new("VkBuffer*")
        ok = vk.lib.vkCreateBuffer(device._ctx.device, info, vk.NULL, buf) == vk.VK_SUCCESS
        if ok and destroy:
            vk.lib.vkDestroyBuffer(device._ctx.device, buf[0], vk.NULL)
''')

INNER = textwrap.dedent('''
    import subprocess
    import sys

    import pytest

    from misuse import buffer, zero_sized_buffer

    CHILD = ("import sys; sys.path.insert(0, %r); import vkml; from misuse import "
             "zero_sized_buffer; d = vkml.Device(0); zero_sized_buffer(d); d.close()")


    @pytest.fixture(scope="module")
    def misused_in_fixture(device):
        zero_sized_buffer(device)


    def test_after_a_fixture_misuse(misused_in_fixture):
        pass


    def test_clean(device):
        pass


    def test_child_misuse(device):
        import os
        subprocess.run([sys.executable, "-c", CHILD % os.path.dirname(__file__)], check=True)


    def test_clean_again(device):
        pass


    def test_leak_until_session_end(device):
        buffer(device, 64, destroy=False)      # reported when the session destroys the device
''')


@pytest.mark.parametrize("workers", [[], ["-n", "2", "--dist", "loadfile"]],
                         ids=["one-process", "xdist-workers"])
def test_messages_from_fixtures_children_and_session_end_fail_the_run(tmp_path, workers):
    """Also under pytest-xdist (as tools/test runs): a worker's session-end messages reach
    the controller's report and exit status."""
    if not Instance.get().validation:
        pytest.skip("VKML_VALIDATION is off: there is no layer to report anything")
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "misuse.py").write_text(MISUSE)
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path), *sys.path]))
    env.pop("VKML_REQUIRE_DEVICES", None)
    icds = [p for p in env.get("VK_ICD_FILENAMES", "").split(os.pathsep) if p]
    if icds:        # one driver is enough to show the mechanism (lavapipe where present)
        env["VK_ICD_FILENAMES"] = next((p for p in icds if "lvp" in p), icds[0])
    r = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                        *workers, "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-6000:]
    for clean in ("test_clean", "test_clean_again", "test_leak_until_session_end"):
        # "test_inner.py::name[id] PASSED" in one process, "PASSED test_inner.py::name[id]"
        # from an xdist worker
        assert re.search(rf"test_inner.py::{clean}\[[^]]*\] PASSED|PASSED test_inner.py::"
                         rf"{clean}\[", out), out[-6000:]
    assert "ERROR at teardown of test_after_a_fixture_misuse" in out, out[-6000:]
    assert "setup of fixture 'misused_in_fixture' (module scope" in out, out[-6000:]
    assert "ERROR at teardown of test_child_misuse" in out, out[-6000:]
    assert re.search(r"test_child_misuse\[[^]]*\] \(the test itself\), in child process",
                     out), out[-6000:]
    assert out.count("VkBufferCreateInfo-size") >= 2, out[-6000:]
    assert "Vulkan validation messages outside any test" in out, out[-6000:]
    assert "session finish (closing the devices)" in out, out[-6000:]
    # exactly the two misusing tests got an error: nothing is smeared onto the clean ones
    assert "2 errors" in out.splitlines()[-1], out[-3000:]

"""Shared fixtures: every test that takes ``device`` runs on every Vulkan device present.

``VKML_REQUIRE_DEVICES`` (comma-separated name substrings, set by ``tools/test`` to
"llvmpipe,SwiftShader") makes the session fail when one of them is missing: no silent
skip.

With ``VKML_VALIDATION=1`` every validation-layer error or warning fails the run and names
where it came from.  Messages of this process are gathered after each fixture's setup and
teardown and after each test body; this file also sets ``VKML_VALIDATION_LOG`` (a fresh
file for the session), to which every process it starts appends its messages
(``vkml/runtime/instance.py``), so a child's messages count too.  A test's report gets an
error at teardown listing what arrived from its setup (each fixture, whatever its scope,
named), its body and its teardown; messages at session finish (objects still alive when
the devices are destroyed) are listed in the summary and make the run exit with status 1;
under pytest-xdist each worker gathers its own and the controller lists them.
"""
from __future__ import annotations

import json
import os
import tempfile
import time

import pytest

import vkml
from vkml import runtime


def _session_log() -> str:
    """A fresh file for this session's child processes' validation messages (set before
    any device is enumerated, so every process inherits it)."""
    fd, path = tempfile.mkstemp(prefix="vkml-validation-", suffix=".jsonl")
    os.close(fd)
    os.environ["VKML_VALIDATION_LOG"] = path
    return path


VALIDATION_LOG = _session_log()
INFOS = vkml.devices()


def _short(info) -> str:
    name = info.name.split(" (")[0].split()[0]
    return f"{info.index}-{name}"


def pytest_sessionstart(session):
    required = [r.strip() for r in os.environ.get("VKML_REQUIRE_DEVICES", "").split(",") if r.strip()]
    names = [d.name for d in INFOS]
    missing = [r for r in required if not any(r.lower() in n.lower() for n in names)]
    if missing:
        pytest.exit(f"required Vulkan devices missing: {missing}; present: {names}", returncode=3)


_OPEN: dict[int, vkml.Device] = {}


def open_device(index: int) -> vkml.Device:
    dev = _OPEN.get(index)
    if dev is None or dev.closed:
        dev = _OPEN[index] = vkml.Device(index)
    return dev


@pytest.fixture(scope="session", params=[d.index for d in INFOS], ids=[_short(d) for d in INFOS])
def device(request) -> vkml.Device:
    """A device per Vulkan driver present (session-wide)."""
    return open_device(request.param)


_SPEED: dict[int, float] = {}


@pytest.fixture(scope="session")
def speed(device) -> float:
    """Device seconds (GPU timestamps, so the validation layer's host overhead does not
    count) to pad 1M float32 elements with the kernel alone; tests size their work by it
    (SwiftShader's arithmetic is ~50x slower than lavapipe's)."""
    if device.index not in _SPEED:
        from vkml.ops.padding import CompiledPadding

        d_in = vkml.dml.TensorDesc("float32", (1024, 1024))
        d_out = vkml.dml.TensorDesc("float32", (1026, 1026))
        op = CompiledPadding(device, vkml.dml.PaddingOperatorDesc(d_in, d_out, "reflection",
                                                                  0.0, (1, 1), (1, 1)),
                             path="kernel")
        x, y = device.empty((1024, 1024)), device.empty((1026, 1026))
        times = []
        for _ in range(3):
            with device.sequence(timed=True) as seq:
                op.record(seq, [x], [y])
                t = time.perf_counter()
                seq.run()
                times.append(seq.gpu_time_ns * 1e-9 if seq.gpu_time_ns else
                             time.perf_counter() - t)
        op.release()
        _SPEED[device.index] = min(times)
    return _SPEED[device.index]


@pytest.fixture(scope="session")
def budget(speed) -> int:
    """How many randomized cases a test may afford on this device (fast device: many)."""
    from helpers import slow

    return 8 if slow(speed) else 40


#: Test files that take longest (big tensors, leak cycles in child processes, SwiftShader's
#: pipeline compiles).  ``tools/test`` hands whole files to its pytest-xdist workers in
#: collection order: these go first, so that no worker is left with one at the end while
#: the others idle.  A file missing here only starts later.  Ordered by a fresh run's
#: seconds per file (``tools/test --durations=40`` prints them).
LONG_FIRST = ("test_convolution.py", "test_padding.py", "test_bench.py", "test_gemm.py",
              "test_element_wise.py", "test_lifetime.py", "test_pooling.py",
              "test_activations.py", "test_resample.py", "test_lp_pooling.py",
              "test_bench_models.py", "test_onnx_zoo.py", "test_dxdispatch.py", "test_reduce.py",
              "test_functional.py", "test_onnx_backend.py", "test_tuning.py",
              "test_onnx_element_wise.py", "test_graph.py", "test_cache_files.py",
              "test_fold.py", "test_permute.py", "test_unfold.py", "test_onnx_float16.py",
              "test_device_lifetime.py", "test_fuzz_convolution.py",
              "test_activation_operators.py", "test_fuzz_windows.py",
              "test_convolution_windows.py", "test_clip1.py", "test_graph_swish.py",
              "test_fuzz_lp_pooling.py", "test_graph_residual.py", "test_graph_join.py")


def pytest_collection_modifyitems(session, config, items):
    first = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))    # (stable)


# -- hypothesis tests state how many real cases they ran ------------------------------------
def pytest_configure(config):
    config.addinivalue_line(
        "markers", "floor(**kinds): the least number of examples of each kind a hypothesis "
        "test using the `cases` fixture must have counted (helpers.Cases.require)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def cases(request):
    """A :class:`helpers.Cases` shared by every example of a ``@given`` test (a fixture
    of the test, so hypothesis keeps it across examples): the body counts each example
    by kind, and when the test passed the counts must reach its
    ``@pytest.mark.floor(kind=n, ...)``."""
    from helpers import Cases

    marker = request.node.get_closest_marker("floor")
    assert marker is not None, "a test using `cases` states its floor: @pytest.mark.floor"
    counted = Cases()
    yield counted
    if not request.node.stash.get(_CALL_FAILED, True):
        counted.require(**marker.kwargs)


# -- validation messages: every one fails the run, named by where it came from ---------------
#: (where, level, text) of messages gathered and not reported yet.
_PENDING: list[tuple[str, str, str]] = []
_LOG_OFFSET = 0


def collect_validation(where: str) -> None:
    """Move the messages that arrived since the last call (this process's, and those
    child processes appended to ``VALIDATION_LOG``) to the pending list, labelled
    ``where``.  Lines of this process in the log are skipped: they are in
    ``runtime.validation_messages``, which a test may have consumed on purpose."""
    global _LOG_OFFSET
    own = runtime.validation_messages
    n = len(own)                       # (another thread may append meanwhile)
    _PENDING.extend((where, level, text) for level, text in own[:n])
    del own[:n]
    try:
        with open(VALIDATION_LOG, "rb") as f:
            f.seek(_LOG_OFFSET)
            data = f.read()
    except OSError:
        return
    data = data[:data.rfind(b"\n") + 1]          # a line still being written: next time
    _LOG_OFFSET += len(data)
    for line in data.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            _PENDING.append((where, "error", f"unreadable line in {VALIDATION_LOG}: {line!r}"))
            continue
        if rec.get("pid") != os.getpid():
            argv = " ".join(map(str, rec.get("argv") or []))[:160]
            _PENDING.append((f"{where}, in child process {rec.get('pid')} [{argv}]",
                             rec.get("level", "?"), str(rec.get("text"))))


def _take_report() -> str:
    lines = [f"[{level}] from {where}:\n    {text[:1500]}" for where, level, text in _PENDING]
    _PENDING.clear()
    return "\n".join(lines)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    node = request.node.nodeid or "the session"
    collect_validation(f"setup of {node}")
    try:
        return (yield)
    finally:
        collect_validation(f"setup of fixture '{fixturedef.argname}' ({fixturedef.scope} "
                           f"scope, for {node})")


def pytest_fixture_post_finalizer(fixturedef, request):
    collect_validation(f"teardown of fixture '{fixturedef.argname}' ({fixturedef.scope} scope)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    # anything before: collection (module imports) or the previous test's hooks
    collect_validation(f"before {item.nodeid} (collection or between tests)")
    try:
        return (yield)
    finally:
        collect_validation(f"setup of {item.nodeid}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    finally:
        collect_validation(f"{item.nodeid} (the test itself)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After every fixture torn down here (a module's or the session's too, after the
    last test that uses it): this test's report fails with what arrived since its setup."""
    try:
        return (yield)
    finally:
        collect_validation(f"teardown of {item.nodeid}")
        if _PENDING:
            pytest.fail("Vulkan validation layer reported:\n" + _take_report(), pytrace=False)


_SESSION_REPORT: list[str] = []


@pytest.hookimpl(tryfirst=True)     # before an xdist worker sends its output to the controller
def pytest_sessionfinish(session, exitstatus):
    """Close every device (the shared ones, the default one, any a test left open), then
    fail the run on messages that arrived after the last test (objects still alive at
    ``vkDestroyDevice``, a child still writing)."""
    collect_validation("after the last test")
    for dev in _OPEN.values():
        dev.close()
    from vkml import device as device_module
    device_module._close_all()
    collect_validation("session finish (closing the devices)")
    if _PENDING:
        report = _take_report()
        _SESSION_REPORT.append(report)
        worker_output = getattr(session.config, "workeroutput", None)
        if worker_output is not None:        # a pytest-xdist worker: the controller reports
            worker_output["vkml_validation"] = report
    else:
        try:
            os.unlink(VALIDATION_LOG)
        except OSError:
            pass
    if _SESSION_REPORT and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller, when a worker ends: what the worker's session finish
    gathered joins this session's report (and fails the run)."""
    report = getattr(node, "workeroutput", {}).get("vkml_validation")
    if report:
        _SESSION_REPORT.append(f"(in test worker {node.gateway.id})\n{report}")


_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Sum each test file's setup, call and teardown seconds (in pytest-xdist's controller
    too, which receives every worker's reports), for :data:`LONG_FIRST`'s order."""
    path = report.nodeid.split("::")[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if config.option.durations is not None and _FILE_SECONDS:
        terminalreporter.section("seconds per test file (the 25 longest)")
        for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:25]:
            terminalreporter.write_line(f"{seconds:8.1f}s {path}")
    if _SESSION_REPORT:
        terminalreporter.section("Vulkan validation messages outside any test", sep="=",
                                 red=True, bold=True)
        terminalreporter.write_line("\n".join(_SESSION_REPORT))
        terminalreporter.write_line(f"(these make the run fail; log: {VALIDATION_LOG})",
                                    red=True)

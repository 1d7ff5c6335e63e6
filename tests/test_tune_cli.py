"""``python -m vkml.tune`` (vkml/tune.py) as a user runs it, and what it leaves alone:
``vkml.tune`` stays the function, the tests' copy path is not registered by vkml."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import vkml
from vkml import tuning

ROOT = Path(__file__).resolve().parent.parent


def run(*args, code=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "vkml.tune", *args]
    env = dict(os.environ, VKML_CACHE_DIR="off")
    return subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True, timeout=240)


def test_list_names_the_operators_paths():
    """--list: every path the operators register, none of the tests' (copy)."""
    r = run("--list")
    assert r.returncode == 0, r.stderr
    names = {line.split(":")[0] for line in r.stdout.splitlines() if ":" in line}
    assert {"convolution", "padding", "padding-large"} <= names and "copy" not in names
    assert "measured model" in r.stdout and "default" in r.stdout


def test_unknown_path_is_refused():
    r = run("--path", "copy", "--path", "nope")
    assert r.returncode == 2 and "no tunable path named copy, nope" in r.stdout
    assert "convolution" in r.stdout          # the registered ones are listed


def test_the_package_keeps_the_function():
    """``vkml.tune`` is :func:`vkml.tuning.tune` (README), and importing vkml registers
    the operators' paths but not the tests' copy example."""
    assert vkml.tune is tuning.tune
    code = ("import vkml, vkml.tuning as t; "
            "assert vkml.tune is t.tune; assert 'copy' not in t.registered_paths(); "
            "assert 'convolution' in t.registered_paths(); print('ok')")
    r = run(code=code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_nothing_to_tune(device, tmp_path):
    """A workload file no registered path takes: said, and nothing tuned."""
    f = tmp_path / "w.json"
    f.write_text('{"workloads": [{"op": "nothing"}]}')
    r = run(str(f), "--path", "padding-large", "--device", str(device.index))
    assert r.returncode == 0, r.stderr
    assert "op 'nothing': no registered tunable path takes them" in r.stdout
    assert "nothing to tune" in r.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    r = run(str(bad), "--path", "padding-large", "--device", str(device.index))
    assert r.returncode == 0 and "not a workload file" in r.stdout

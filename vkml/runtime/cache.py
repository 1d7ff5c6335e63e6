"""Files in vkml's cache folder: input to validate, never to trust; replaced atomically.

Everything vkml keeps there (the Vulkan pipeline cache, padding calibrations, tuning
results, the pipelines each prepared ONNX model asked for, the frozen and pruned SPIR-V
modules in ``modules``) is read through :func:`read_bytes` or :func:`read_json`, which give ``None``
for anything but a regular file of at most :data:`MAX_BYTES` that passes its format's
checks: a missing, truncated, oversized, unreadable or corrupt file, a directory or a
FIFO in its place, JSON of the wrong shape or version.  The caller then works as if
there were no file and writes a fresh one with :func:`write_bytes` / :func:`write_json`:
a temporary file in the same folder, renamed over the old one (``os.replace``), so a
reader in another process sees the old file or the new one, never half of one.  When
several processes write the same file at once the last rename wins; each one is whole.
A process killed between the two leaves its temporary file; the next write of that file
removes such leftovers once they are :data:`STALE_TMP_S` old.

``VKML_CACHE_DIR`` chooses the folder (``off``: no disk cache); else the user's cache
folder.  Failing to write (a read-only home) is never an error.
"""
from __future__ import annotations

import glob
import json
import math
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

#: The largest cache file vkml reads or writes (64 MiB).  A bigger one is ignored and
#: replaced: the pipeline cache of a long-lived folder cannot grow without bound, and
#: a stray huge file is never read into memory.
MAX_BYTES = 64 << 20
#: A temporary file (``.<name>.*.tmp``) older than this was left by a writer that died
#: before its rename (a live one renames within seconds of creating it): the next write
#: of that file removes it.
STALE_TMP_S = 600.0


def cache_dir() -> Path | None:
    """The cache folder (see the module doc); ``None`` when ``VKML_CACHE_DIR=off``."""
    env = os.environ.get("VKML_CACHE_DIR")
    if env:
        return None if env.lower() == "off" else Path(env)
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
        return base / "vkml" / "cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "vkml"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vkml"


def read_bytes(path: Path, limit: int = MAX_BYTES) -> bytes | None:
    """The contents of the regular file ``path`` if it holds at most ``limit`` bytes,
    else ``None``.  Opened without blocking and checked before reading, so a FIFO or a
    device in its place is never read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks) if total <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)


def write_bytes(path: Path, data: bytes, limit: int = MAX_BYTES) -> bool:
    """Replace ``path`` with ``data`` atomically (see the module doc); False where it was
    not written (more than ``limit`` bytes, or the folder is not writable).  A directory
    in the file's place (not a link to one) is removed first."""
    if len(data) > limit:
        return False
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        _remove_stale_temps(path)
        return True
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False


def _remove_stale_temps(path: Path) -> None:
    """Remove the temporary files of ``path`` older than :data:`STALE_TMP_S`: a writer
    killed between writing and renaming leaves one, and nothing else ever would."""
    now = time.time()
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        try:
            st = tmp.lstat()
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime > STALE_TMP_S:
                tmp.unlink()
        except OSError:
            pass                    # another writer removed it first, or no permission


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


def read_json(path: Path, version: int, check: Callable[[dict], bool]) -> dict | None:
    """The JSON object in ``path`` if it is one, its ``"version"`` is ``version`` and
    ``check(data)`` returns true; else ``None`` (``check`` raising counts as false).
    NaN and infinities are refused while parsing (they are not JSON)."""
    raw = read_bytes(path)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constants)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not is_int(data.get("version")) \
            or data["version"] != version:
        return None
    try:
        return data if check(data) else None
    except Exception:  # noqa: BLE001 - a schema check tripping on odd data means invalid
        return None


def write_json(path: Path, version: int, data: dict) -> bool:
    """Write ``data`` with ``"version": version`` atomically (see :func:`write_bytes`)."""
    payload = dict(data, version=version)
    try:
        text = json.dumps(payload, indent=1, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return write_bytes(path, text.encode())


def is_int(value) -> bool:
    """An int that is not a bool (``True == 1`` in Python, not in a schema)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value, lo: float = -math.inf, hi: float = math.inf) -> bool:
    """A finite int or float (not a bool) in ``[lo, hi]``: for schema checks."""
    if is_int(value):
        return lo <= value <= hi            # no float conversion: ints may be huge
    return isinstance(value, float) and math.isfinite(value) and lo <= value <= hi

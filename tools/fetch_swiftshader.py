"""Unpack the SwiftShader Vulkan ICD from the npm package @sparticuz/chromium.

The package ships ``bin/swiftshader.tar.br``: a brotli-compressed tar holding
``libvk_swiftshader.so`` and ``vk_swiftshader_icd.json``.  Usage::

    python tools/fetch_swiftshader.py DEST_DIR

Idempotent: does nothing when DEST_DIR already holds the ICD manifest.
"""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = os.environ.get("VKML_SWIFTSHADER_NPM", "@sparticuz/chromium@153.0.0")
MEMBER = "package/bin/swiftshader.tar.br"


def main(dest: str) -> int:
    dest_dir = Path(dest)
    manifest = dest_dir / "vk_swiftshader_icd.json"
    if manifest.exists():
        return 0
    npm = shutil.which("npm")
    if npm is None:
        print("fetch_swiftshader: npm is required to fetch", PACKAGE, file=sys.stderr)
        return 1
    import brotli  # the PyPI package, installed by tools/setup

    with tempfile.TemporaryDirectory() as tmp:
        print(f"setup: fetching SwiftShader from npm {PACKAGE}")
        subprocess.run([npm, "pack", "--silent", PACKAGE], cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL)
        tgz = next(Path(tmp).glob("*.tgz"))
        with tarfile.open(tgz, "r:gz") as outer:
            compressed = outer.extractfile(MEMBER).read()
        inner = io.BytesIO(brotli.decompress(compressed))
        staging = Path(tmp) / "icd"
        with tarfile.open(fileobj=inner, mode="r:") as tar:
            tar.extractall(staging, filter="data")
        dest_dir.mkdir(parents=True, exist_ok=True)
        for item in staging.iterdir():
            shutil.copy2(item, dest_dir / item.name)
    if not manifest.exists():
        print("fetch_swiftshader: the archive held no vk_swiftshader_icd.json", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ".drivers/swiftshader"))

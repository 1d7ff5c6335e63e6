"""Compile the GLSL kernels in ``glsl/`` to the SPIR-V shipped in ``vkml/shaders/``.

Each ``glsl/<family>.comp`` may declare variants, one per line::

    // vkml:variant padding_e2_packed ELEM_BYTES=2 PACKED=1

A variant is compiled with its ``-D`` defines to ``vkml/shaders/<variant>.spv``; a file
with no such line gives one variant named after the file.  ``glsl/include/*.glsl`` are
shared headers.  The build is incremental: ``vkml/shaders/manifest.json`` records, per
variant, the SHA-256 of its source, the headers it includes and its defines, and a
variant whose hash is unchanged is not recompiled.

    python tools/build_shaders.py           # build what is stale
    python tools/build_shaders.py --check   # exit 1 and list what is stale (the tests call this)
    python tools/build_shaders.py --force   # rebuild everything
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GLSL = ROOT / "glsl"
OUT = ROOT / "vkml" / "shaders"
MANIFEST = OUT / "manifest.json"
FLAGS = ["-fshader-stage=compute", "--target-env=vulkan1.1", "-O"]
_VARIANT = re.compile(r"^//\s*vkml:variant\s+(\w+)((?:\s+\w+=\S+)*)\s*$", re.M)
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def variants() -> dict[str, dict]:
    """Every variant: name -> {source, defines}."""
    found: dict[str, dict] = {}
    for src in sorted(GLSL.glob("*.comp")):
        text = src.read_text()
        decls = _VARIANT.findall(text)
        if not decls:
            decls = [(src.stem, "")]
        for name, defs in decls:
            if name in found:
                raise SystemExit(f"variant {name} is declared twice")
            found[name] = {"source": src.name, "defines": defs.split()}
    return found


def _includes(path: Path, seen: set[Path]) -> list[Path]:
    out = []
    for inc in _INCLUDE.findall(path.read_text()):
        p = (path.parent / inc) if (path.parent / inc).exists() else GLSL / "include" / inc
        p = p.resolve()
        if p not in seen:
            seen.add(p)
            out.append(p)
            out += _includes(p, seen)
    return out


def digest(spec: dict) -> str:
    src = GLSL / spec["source"]
    h = hashlib.sha256()
    for part in [src] + sorted(_includes(src, set())):
        h.update(part.name.encode())
        h.update(part.read_bytes().replace(b"\r\n", b"\n"))
    h.update(" ".join(spec["defines"] + FLAGS).encode())
    return h.hexdigest()


def stale() -> tuple[dict, dict, list[str]]:
    specs = variants()
    old = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    todo = [n for n, s in specs.items()
            if old.get(n, {}).get("sha256") != digest(s) or not (OUT / f"{n}.spv").exists()]
    return specs, old, todo


def compile_one(name: str, spec: dict, glslc: str) -> str | None:
    cmd = [glslc, *FLAGS, "-I", str(GLSL / "include"),
           *[f"-D{d}" for d in spec["defines"]],
           str(GLSL / spec["source"]), "-o", str(OUT / f"{name}.spv")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        return f"{name} ({spec['source']} {' '.join(spec['defines'])}):\n{res.stderr}"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="list stale variants; build nothing")
    ap.add_argument("--force", action="store_true", help="rebuild every variant")
    args = ap.parse_args()
    specs, old, todo = stale()
    orphans = sorted(p.stem for p in OUT.glob("*.spv") if p.stem not in specs)
    if args.force:
        todo = list(specs)
    if args.check:
        for n in todo:
            print(f"stale: {n} ({specs[n]['source']})")
        for n in orphans:
            print(f"orphan: {n}.spv has no source variant")
        return 1 if todo or orphans else 0
    glslc = shutil.which("glslc")
    if todo and glslc is None:
        print("build_shaders: glslc not found (Debian package 'glslc')", file=sys.stderr)
        return 1
    OUT.mkdir(parents=True, exist_ok=True)
    for n in orphans:
        (OUT / f"{n}.spv").unlink()
    errors = []
    with cf.ThreadPoolExecutor() as pool:
        for err in pool.map(lambda n: compile_one(n, specs[n], glslc), todo):
            if err:
                errors.append(err)
    manifest = {n: {"source": s["source"], "defines": s["defines"], "sha256": digest(s)}
                for n, s in specs.items()
                if (OUT / f"{n}.spv").exists() and not any(e.startswith(n + " ") for e in errors)}
    for n, entry in old.items():   # keep the old hash of a variant that failed to build
        if n in specs and n not in manifest and n in old:
            manifest[n] = entry
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    for err in errors:
        print(err, file=sys.stderr)
    print(f"build_shaders: {len(todo) - len(errors)} compiled, {len(errors)} failed, "
          f"{len(specs) - len(todo)} up to date")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

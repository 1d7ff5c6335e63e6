"""Compile the GLSL kernels in ``glsl/`` to the SPIR-V shipped in ``vkml/shaders/``.

Each ``glsl/<family>.comp`` may declare variants, one per line::

    // vkml:variant padding_e2_packed ELEM_BYTES=2 PACKED=1

A variant is compiled with its ``-D`` defines to ``vkml/shaders/<variant>.spv``; a file
with no such line gives one variant named after the file.  ``glsl/include/*.glsl`` are
shared headers.  The build is incremental: ``vkml/shaders/manifest.json`` records, per
variant, the SHA-256 of its source, the headers it includes and its defines, and a
variant whose hash is unchanged is not recompiled.

A file names the specialization constants the host freezes into the module (as plain
constants, for drivers that do not fold specialization constants before generating code;
:mod:`vkml.runtime.spirv`) on a line of their own, beside a comment saying why::

    // vkml:frozen ACT FUNC

Every variant's manifest entry lists those it declares as ``frozen``; a name that no
variant of the file declares stops the build.

A file whose kernels may run in place (an output bound to the memory of an input, as
DirectML's element-wise and activation operators allow) says so on a line of its own::

    // vkml:aliased

and its variants' entries say ``"aliased": true``: the runtime decorates their bindings
``Aliased`` (:func:`vkml.runtime.spirv.alias`), which glslang does not emit.

The manifest also records each variant's interface, reflected from SPIR-V (:func:`reflect`),
which the runtime reads so that operators ask for pipelines by variant and constant name:

* ``constants``: specialization constant name -> ``{id, type, default}``; the workgroup
  size (``local_size_x_id`` ...) appears as ``LOCAL_SIZE_X`` / ``LOCAL_SIZE_Y`` / ``LOCAL_SIZE_Z``;
* ``bindings``: ``{set, binding, kind, access, names}`` in binding order, kind one of
  ``storage_buffer``, ``uniform_buffer`` (with the std140 ``members`` and their offsets and
  the block's ``size``), ``uniform_texel_buffer``, ``storage_texel_buffer``; access
  ``readonly``, ``writeonly`` or ``readwrite``;
* ``push_constants``: ``{size, members}``;
* ``frozen``: the names of the constants the runtime freezes (``vkml:frozen``);
* ``aliased``: whether the runtime decorates the bindings ``Aliased`` (``vkml:aliased``).

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
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GLSL = ROOT / "glsl"
OUT = ROOT / "vkml" / "shaders"
MANIFEST = OUT / "manifest.json"
FLAGS = ["-fshader-stage=compute", "--target-env=vulkan1.1", "-O"]
_VARIANT = re.compile(r"^//\s*vkml:variant\s+(\w+)((?:\s+\w+=\S+)*)\s*$", re.M)
_FROZEN = re.compile(r"^//\s*vkml:frozen((?:\s+\w+)+)\s*$", re.M)
_ALIASED = re.compile(r"^//\s*vkml:aliased\s*$", re.M)
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


# -- SPIR-V reflection --------------------------------------------------------------------
# A SPIR-V module is a stream of 32-bit little-endian words: a 5-word header (magic
# 0x07230203, version, generator, id bound, 0), then instructions, each starting with one
# word holding (word count << 16) | opcode.  Only what a kernel's interface needs is read
# (opcodes, decorations and enums from the SPIR-V 1.6 specification, section 3):
#   names            OpName / OpMemberName (``glslc -O`` strips them: names are read from an
#                    unoptimized compile of the same variant, see :func:`interface`)
#   specialization   OpSpecConstant{,True,False} + OpDecorate SpecId; the workgroup size
#                    (local_size_x_id ...) is an OpSpecConstantComposite decorated
#                    BuiltIn WorkgroupSize whose components have no name of their own
#   bindings         OpVariable in UniformConstant / Uniform / StorageBuffer + DescriptorSet,
#                    Binding; Block vs BufferBlock, NonWritable / NonReadable give kind and access
#   push constants   the OpVariable in PushConstant and its struct's member Offsets
_OP = {"Name": 5, "MemberName": 6, "Decorate": 71, "MemberDecorate": 72,
       "TypeBool": 20, "TypeInt": 21, "TypeFloat": 22, "TypeVector": 23, "TypeMatrix": 24,
       "TypeImage": 25, "TypeSampledImage": 27, "TypeArray": 28, "TypeRuntimeArray": 29,
       "TypeStruct": 30, "TypePointer": 32, "Constant": 43, "SpecConstantTrue": 48,
       "SpecConstantFalse": 49, "SpecConstant": 50, "SpecConstantComposite": 51, "Variable": 59}
_DEC = {"SpecId": 1, "Block": 2, "BufferBlock": 3, "ArrayStride": 6, "BuiltIn": 11,
        "NonWritable": 24, "NonReadable": 25, "Binding": 33, "DescriptorSet": 34, "Offset": 35}
_BUILTIN_WORKGROUP_SIZE = 25
_SC_UNIFORM_CONSTANT, _SC_UNIFORM, _SC_PUSH_CONSTANT, _SC_STORAGE_BUFFER = 0, 2, 9, 12
_DIM_BUFFER = 5
_AXES = "XYZ"


def _string(words: list[int]) -> str:
    """A nul-terminated UTF-8 literal packed into words."""
    raw = b"".join(w.to_bytes(4, "little") for w in words)
    return raw.split(b"\0", 1)[0].decode()


def reflect(spirv: bytes) -> dict:
    """The interface of one compiled kernel: specialization constants, bindings and push
    constants (see the comment above for where each fact comes from)."""
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    if len(spirv) % 4 or words[0] != 0x07230203:
        raise ValueError("not a SPIR-V module")
    names: dict[int, str] = {}
    member_names: dict[tuple[int, int], str] = {}
    decos: dict[int, dict[int, list[int]]] = {}            # id -> decoration -> literals
    member_decos: dict[tuple[int, int], dict[int, list[int]]] = {}
    types: dict[int, tuple] = {}                            # id -> (opcode, operands...)
    consts: dict[int, int] = {}                             # OpConstant values (array lengths)
    spec: dict[int, tuple] = {}                             # id -> (type id, default)
    composites: dict[int, list[int]] = {}                   # OpSpecConstantComposite parts
    variables: list[tuple[int, int, int]] = []              # (pointer type, id, storage class)
    i = 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        args = list(words[i + 1:i + count])
        i += count
        if op == _OP["Name"]:
            names[args[0]] = _string(args[1:])
        elif op == _OP["MemberName"]:
            member_names[args[0], args[1]] = _string(args[2:])
        elif op == _OP["Decorate"]:
            decos.setdefault(args[0], {})[args[1]] = args[2:]
        elif op == _OP["MemberDecorate"]:
            member_decos.setdefault((args[0], args[1]), {})[args[2]] = args[3:]
        elif _OP["TypeBool"] <= op <= _OP["TypePointer"]:
            types[args[0]] = (op, *args[1:])
        elif op == _OP["Constant"]:
            consts[args[1]] = args[2]
        elif op in (_OP["SpecConstantTrue"], _OP["SpecConstantFalse"]):
            spec[args[1]] = (args[0], op == _OP["SpecConstantTrue"])
        elif op == _OP["SpecConstant"]:
            spec[args[1]] = (args[0], args[2])
        elif op == _OP["SpecConstantComposite"]:
            composites[args[1]] = args[2:]
        elif op == _OP["Variable"]:
            variables.append((args[0], args[1], args[2]))

    def type_name(t: int) -> str:
        op, *a = types[t]
        if op == _OP["TypeBool"]:
            return "bool"
        if op == _OP["TypeInt"]:
            return ("int" if a[1] else "uint") + ("" if a[0] == 32 else str(a[0]))
        if op == _OP["TypeFloat"]:
            return {16: "float16", 32: "float", 64: "double"}[a[0]]
        if op == _OP["TypeVector"]:
            prefix = {"float": "", "uint": "u", "int": "i", "bool": "b", "double": "d"}
            scalar = type_name(a[0])
            return (f"{prefix[scalar]}vec{a[1]}" if scalar in prefix else f"{scalar}x{a[1]}")
        if op == _OP["TypeArray"]:
            return f"{type_name(a[0])}[{consts[a[1]]}]"
        if op == _OP["TypeRuntimeArray"]:
            return f"{type_name(a[0])}[]"
        if op == _OP["TypeStruct"]:
            return names.get(t, "struct")
        return f"op{op}"

    def size_of(t: int) -> int:
        """Bytes a (non runtime-sized) type occupies with its explicit layout."""
        op, *a = types[t]
        if op in (_OP["TypeInt"], _OP["TypeFloat"]):
            return a[0] // 8
        if op == _OP["TypeBool"]:
            return 4
        if op in (_OP["TypeVector"], _OP["TypeMatrix"]):
            return a[1] * size_of(a[0])
        if op == _OP["TypeArray"]:
            return consts[a[1]] * decos.get(t, {}).get(_DEC["ArrayStride"], [size_of(a[0])])[0]
        if op == _OP["TypeStruct"]:
            return max((member_decos[t, m][_DEC["Offset"]][0] + size_of(mt)
                        for m, mt in enumerate(a) if types[mt][0] != _OP["TypeRuntimeArray"]),
                       default=0)
        raise ValueError(f"no size for type {type_name(t)}")

    def members(t: int) -> list[dict]:
        out = []
        for m, mt in enumerate(types[t][1:]):
            d = {"name": member_names.get((t, m), f"m{m}"), "type": type_name(mt),
                 "offset": member_decos[t, m][_DEC["Offset"]][0]}
            if types[mt][0] == _OP["TypeArray"]:
                d["stride"] = decos[mt][_DEC["ArrayStride"]][0]
            out.append(d)
        return out

    # Specialization constants by name; workgroup-size components are named LOCAL_SIZE_X...
    constants: dict[str, dict] = {}
    for cid, (t, default) in spec.items():
        name = names.get(cid)
        for comp, parts in composites.items():
            if cid in parts and decos.get(comp, {}).get(_DEC["BuiltIn"]) == [_BUILTIN_WORKGROUP_SIZE]:
                name = f"LOCAL_SIZE_{_AXES[parts.index(cid)]}"
        if _DEC["SpecId"] not in decos.get(cid, {}):
            continue                    # a literal workgroup-size component, not settable
        name = name or f"%{decos[cid][_DEC['SpecId']][0]}"     # stripped: named by its id
        if name in constants:
            raise ValueError(f"specialization constant name {name} is not unique")
        tname = type_name(t)
        constants[name] = {"id": decos[cid][_DEC["SpecId"]][0], "type": tname,
                           "default": (bool(default) if tname == "bool" else
                                       struct.unpack("<i", struct.pack("<I", default))[0]
                                       if tname == "int" else default)}

    # Bindings: several variables may alias one binding (e.g. Out and Out4); they must agree.
    bindings: dict[tuple[int, int], dict] = {}
    push: dict = {"size": 0, "members": []}
    for ptr, var, sc in variables:
        t = types[ptr][2]                                   # OpTypePointer's pointee
        d = decos.get(var, {})
        if sc == _SC_PUSH_CONSTANT:
            push = {"size": size_of(t), "members": members(t)}
            continue
        if sc not in (_SC_UNIFORM_CONSTANT, _SC_UNIFORM, _SC_STORAGE_BUFFER):
            continue
        td = decos.get(t, {})
        if sc == _SC_UNIFORM_CONSTANT:
            img = types[t][1] if types[t][0] == _OP["TypeSampledImage"] else t
            op, _, dim, _, _, _, sampled, *_ = types[img]
            if op != _OP["TypeImage"] or dim != _DIM_BUFFER:
                raise ValueError(f"binding {names.get(var)}: only texel buffers are supported")
            kind = "uniform_texel_buffer" if sampled == 1 else "storage_texel_buffer"
            flags = set(d)
        else:
            kind = ("storage_buffer" if sc == _SC_STORAGE_BUFFER or _DEC["BufferBlock"] in td
                    else "uniform_buffer")
            count = len(types[t]) - 1
            flags = set(d) | {f for f in (_DEC["NonWritable"], _DEC["NonReadable"])
                              if count and all(f in member_decos.get((t, m), {})
                                               for m in range(count))}
        if kind == "uniform_texel_buffer" or kind == "uniform_buffer":
            access = "readonly"
        else:
            access = ("readonly" if _DEC["NonWritable"] in flags else
                      "writeonly" if _DEC["NonReadable"] in flags else "readwrite")
        key = (d.get(_DEC["DescriptorSet"], [0])[0], d[_DEC["Binding"]][0])
        entry = {"set": key[0], "binding": key[1], "kind": kind, "access": access,
                 "names": [names.get(t) or names.get(var) or ""]}
        if kind == "uniform_buffer":
            entry["size"], entry["members"] = size_of(t), members(t)
        old = bindings.get(key)
        if old is None:
            bindings[key] = entry
            continue
        if old["kind"] != kind:
            raise ValueError(f"set {key[0]} binding {key[1]} is both {old['kind']} and {kind}")
        old["names"].append(entry["names"][0])
        if old["access"] != access:
            old["access"] = "readwrite"
    return {"constants": dict(sorted(constants.items(), key=lambda kv: kv[1]["id"])),
            "bindings": [bindings[k] for k in sorted(bindings)],
            "push_constants": push}


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
            found[name] = {"source": src.name, "defines": defs.split(),
                           "frozen": [n for line in _FROZEN.findall(text) for n in line.split()],
                           "aliased": bool(_ALIASED.search(text))}
    return found


def frozen_of(spec: dict, constants: dict) -> list[str]:
    """The file's ``vkml:frozen`` names that the variant declares."""
    return [n for n in spec["frozen"] if n in constants]


def unknown_frozen(specs: dict, manifest: dict) -> list[str]:
    """``vkml:frozen`` names that no built variant of their file declares (a typo, or a
    constant renamed without its line)."""
    out = []
    for src in sorted({s["source"] for s in specs.values()}):
        names = {n for s in specs.values() if s["source"] == src for n in s["frozen"]}
        declared = {c for n, e in manifest.items() if e["source"] == src for c in e["constants"]}
        out += [f"glsl/{src}: vkml:frozen {n} is no constant of its variants"
                for n in sorted(names - declared)]
    return out


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


#: The interface facts a manifest entry holds next to source, defines and sha256.
INTERFACE = ("constants", "bindings", "push_constants")


def _glslc_cmd(glslc: str, spec: dict, flags: list[str]) -> list[str]:
    return [glslc, *flags, "-I", str(GLSL / "include"), *[f"-D{d}" for d in spec["defines"]],
            str(GLSL / spec["source"])]


def declared_interface(spec: dict, glslc: str) -> dict:
    """The interface as the GLSL declares it: reflected from an unoptimized compile of the
    variant (``-O`` strips names, and may drop a constant or binding the code never uses,
    which the pipeline layout and specialization info may still name)."""
    flags = [f for f in FLAGS if f != "-O"] + ["-O0"]
    res = subprocess.run(_glslc_cmd(glslc, spec, flags) + ["-o", "-"], capture_output=True)
    if res.returncode:
        raise RuntimeError(res.stderr.decode())
    return reflect(res.stdout)


def mismatches(entry: dict, shipped: dict) -> list[str]:
    """How a manifest entry disagrees with its shipped (optimized) SPIR-V: every constant,
    binding and push-constant member the optimized module has must be declared alike."""
    if any(k not in entry for k in INTERFACE):
        return ["no interface recorded"]
    out = []
    by_id = {c["id"]: (n, c["type"]) for n, c in entry["constants"].items()}
    for n, c in shipped["constants"].items():
        if by_id.get(c["id"], (None, c["type"]))[1] != c["type"] or c["id"] not in by_id:
            out.append(f"constant_id {c['id']} ({c['type']}) is not declared alike")
    declared = {(b["set"], b["binding"]): b for b in entry["bindings"]}
    for b in shipped["bindings"]:
        d = declared.get((b["set"], b["binding"]))
        if d is None or d["kind"] != b["kind"] or d.get("members", []) and [
                m["offset"] for m in d["members"]] != [m["offset"] for m in b["members"]]:
            out.append(f"set {b['set']} binding {b['binding']} ({b['kind']}) is not declared alike")
    got, want = shipped["push_constants"], entry["push_constants"]
    if got["members"] and ([m["offset"] for m in got["members"]] !=
                           [m["offset"] for m in want["members"]] or got["size"] != want["size"]):
        out.append("push constants differ")
    return out


def stale() -> tuple[dict, dict, list[str]]:
    """(variants, old manifest, names to rebuild): a variant is stale when its hash changed,
    its .spv is missing, or its recorded interface does not match its .spv."""
    specs = variants()
    old = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    todo = []
    for n, s in specs.items():
        spv = OUT / f"{n}.spv"
        if (old.get(n, {}).get("sha256") != digest(s) or not spv.exists()
                or mismatches(old[n], reflect(spv.read_bytes()))):
            todo.append(n)
    return specs, old, todo


def compile_one(name: str, spec: dict, glslc: str) -> str | None:
    res = subprocess.run(_glslc_cmd(glslc, spec, FLAGS) + ["-o", str(OUT / f"{name}.spv")],
                         capture_output=True, text=True)
    if res.returncode:
        return f"{name} ({spec['source']} {' '.join(spec['defines'])}):\n{res.stderr}"
    try:
        entry = declared_interface(spec, glslc)
        problems = mismatches(entry, reflect((OUT / f"{name}.spv").read_bytes()))
    except (RuntimeError, ValueError, KeyError) as e:
        return f"{name} ({spec['source']}): interface: {e}"
    if problems:
        return f"{name} ({spec['source']}): interface: {'; '.join(problems)}"
    _interfaces[name] = entry
    return None


_interfaces: dict[str, dict] = {}     # variant -> interface of the variants compiled now


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
    manifest = {}
    for n, s in specs.items():
        if n in _interfaces or (n not in todo and (OUT / f"{n}.spv").exists()):
            facts = _interfaces.get(n) or {k: old[n][k] for k in INTERFACE}
            manifest[n] = {"source": s["source"], "defines": s["defines"],
                           "sha256": digest(s), **facts,
                           "frozen": frozen_of(s, facts["constants"]),
                           "aliased": s["aliased"]}
    for n, entry in old.items():   # keep the old hash of a variant that failed to build
        if n in specs and n not in manifest and n in old:
            manifest[n] = entry
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    unknown = unknown_frozen(specs, manifest)
    for err in errors + unknown:
        print(err, file=sys.stderr)
    print(f"build_shaders: {len(todo) - len(errors)} compiled, {len(errors)} failed, "
          f"{len(specs) - len(todo)} up to date")
    return 1 if errors or unknown else 0


if __name__ == "__main__":
    sys.exit(main())

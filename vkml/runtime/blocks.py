"""Parameter blocks filled by member name.

A kernel declares its parameters once, in GLSL: a std140 uniform block or a push-constant
block.  ``tools/build_shaders.py`` reflects every member's name, type and offset (and an
array's stride) from the SPIR-V into ``vkml/shaders/manifest.json``; :func:`pack` reads
that layout and places each value where the kernel reads it::

    push = pack("padding_e4", "push", origin=o, extent=e, in_base=0, out_base=0, ...)
    params = pack("convolution_gemm_f32", "Params", geo=(ci, co, cog, 0), rows=offsets, ...)

Reordering, adding or retyping a member in GLSL moves the packing with it.  A member the
block does not have, one left out, a value of the wrong shape, kind (a float for an int)
or range raises :class:`BlockError` naming the kernel, block and member.  Arrays may be
given fewer values than declared, flat or by element (the rest are zero: per-dimension
lists of any rank in ``uvec4 x[2]``); every other member must be given, padding included,
so a forgotten value is an error rather than a zero.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import numpy as np

__all__ = ["BlockError", "Member", "Layout", "layout", "pack", "PUSH"]

#: The block name :func:`layout` and :func:`pack` take for a kernel's push constants.
PUSH = "push"

#: Scalar kinds by GLSL type prefix: (numpy dtype, components of the vector type).
_SCALARS = {"int": np.int32, "uint": np.uint32, "float": np.float32, "bool": np.uint32}
_VECTORS = {"ivec": np.int32, "uvec": np.uint32, "vec": np.float32, "bvec": np.uint32}
_RANGES = {np.int32: (-(1 << 31), (1 << 31) - 1), np.uint32: (0, (1 << 32) - 1)}
_TYPE = re.compile(r"^([a-z]+?)([234])?(?:\[(\d+)\])?$")


class BlockError(ValueError):
    """A parameter block filled wrongly: the message names kernel, block and member."""


@dataclass(frozen=True)
class Member:
    """One member of a parameter block, as the manifest reflects it."""
    name: str
    type: str          # GLSL type as the manifest writes it: "ivec4", "uint", "uvec4[2]"
    offset: int        # bytes from the block's start
    dtype: type        # numpy scalar type of one component
    components: int    # components of one element (1 for a scalar)
    count: int         # elements (1 unless an array)
    stride: int        # bytes between array elements (the element's size otherwise)
    array: bool


@dataclass(frozen=True)
class Layout:
    """A parameter block of a kernel variant: its members by name and its size in bytes."""
    kernel: str
    block: str
    size: int
    members: dict[str, Member]

    def pack(self, values: dict) -> bytes:
        """The block's bytes with ``values`` (member name -> value) in place."""
        given = set(values)
        unknown = given - set(self.members)
        if unknown:
            raise BlockError(f"{self.where(sorted(unknown)[0])}: the block has no such member; "
                             f"it declares {', '.join(self.members)}")
        missing = [n for n in self.members if n not in given]
        if missing:
            raise BlockError(f"{self.where(missing[0])}: not given (every member of a "
                             f"parameter block must be)")
        words = np.zeros(self.size // 4, np.uint32)
        for name, value in values.items():
            self._place(words, self.members[name], value)
        return words.tobytes()

    def where(self, member: str) -> str:
        return f"kernel {self.kernel}, block {self.block}, member {member}"

    def _place(self, words: np.ndarray, m: Member, value) -> None:
        arr = np.asarray(value)
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number)
                                       or arr.dtype == np.bool_):
            raise BlockError(f"{self.where(m.name)}: {m.type} takes numbers, got {value!r}")
        flat = arr.reshape(-1)
        n = m.components * m.count
        if m.array:
            if flat.size > n:
                raise BlockError(f"{self.where(m.name)}: {m.type} takes at most {n} values "
                                 f"({m.count} elements of {m.components}), got {flat.size}")
        elif flat.size != n:
            raise BlockError(f"{self.where(m.name)}: {m.type} takes {n} value(s), got "
                             f"{flat.size}")
        data = self._convert(m, flat)
        # an array given flat (a per-dimension list in uvec4s, say) ends mid-element: zeros
        data = np.concatenate([data, np.zeros(-data.size % m.components, np.uint32)])
        step = m.stride // 4
        base = m.offset // 4
        for e in range(data.size // m.components):
            at = base + e * step
            words[at:at + m.components] = data[e * m.components:(e + 1) * m.components]

    def _convert(self, m: Member, flat: np.ndarray) -> np.ndarray:
        if m.dtype is np.float32:
            return flat.astype(np.float32).view(np.uint32)
        if flat.dtype.kind == "f":
            if not np.all(np.isfinite(flat)) or np.any(flat != np.floor(flat)):
                raise BlockError(f"{self.where(m.name)}: {m.type} takes integers, got "
                                 f"{flat.tolist()}")
            flat = flat.astype(np.int64)
        lo, hi = _RANGES[m.dtype]
        ints = [int(v) for v in flat]
        bad = [v for v in ints if not lo <= v <= hi]
        if bad:
            raise BlockError(f"{self.where(m.name)}: {bad[0]} is outside {m.type}'s range "
                             f"[{lo}, {hi}]")
        return np.array(ints, np.int64).astype(m.dtype).view(np.uint32)


def _member(kernel: str, block: str, entry: dict) -> Member:
    t = entry["type"]
    match = _TYPE.match(t)
    base = match and match.group(1)
    if base in _SCALARS and not match.group(2):
        dtype, comps = _SCALARS[base], 1
    elif base in _VECTORS and match.group(2):
        dtype, comps = _VECTORS[base], int(match.group(2))
    else:
        raise BlockError(f"kernel {kernel}, block {block}, member {entry['name']}: type {t} "
                         f"cannot be packed by name (scalars, vectors and arrays of them)")
    array = match.group(3) is not None
    count = int(match.group(3)) if array else 1
    stride = entry.get("stride", 4 * comps)
    if array and "stride" not in entry:
        raise BlockError(f"kernel {kernel}, block {block}, member {entry['name']}: the "
                         f"manifest gives no array stride (run tools/build_shaders.py)")
    return Member(entry["name"], t, entry["offset"], dtype, comps, count, stride, array)


@functools.cache
def layout(kernel: str, block: str = PUSH) -> Layout:
    """The layout of ``kernel``'s parameter block ``block``: :data:`PUSH` for its push
    constants, else a uniform block by its (block or instance) name as the manifest lists
    it."""
    from .pipelines import kernel_manifest
    entry = kernel_manifest().get(kernel)
    if entry is None:
        raise BlockError(f"no kernel variant named {kernel!r} in vkml/shaders/manifest.json")
    if block == PUSH:
        found = entry["push_constants"]
        if not found["members"]:
            raise BlockError(f"kernel {kernel} declares no push constants")
    else:
        blocks = [b for b in entry["bindings"] if b["kind"] == "uniform_buffer"]
        found = next((b for b in blocks if block in b["names"]), None)
        if found is None:
            have = [n for b in blocks for n in b["names"]]
            raise BlockError(f"kernel {kernel} has no uniform block named {block!r}"
                             + (f"; it declares {', '.join(have)}" if have else ""))
    members = {m["name"]: _member(kernel, block, m) for m in found["members"]}
    size = 4 * math.ceil(found["size"] / 4)
    return Layout(kernel, block, size, members)


def pack(kernel: str, block: str = PUSH, /, **values) -> bytes:
    """The bytes of ``kernel``'s parameter block ``block`` with each member set by name
    (module doc)."""
    return layout(kernel, block).pack(values)

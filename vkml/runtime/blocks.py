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
import struct
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

    @functools.cached_property
    def words(self) -> tuple[int, ...]:
        """The block's 32-bit word of each value, flat (element by element)."""
        return tuple(self.offset // 4 + e * (self.stride // 4) + c
                     for e in range(self.count) for c in range(self.components))


@dataclass(frozen=True)
class Layout:
    """A parameter block of a kernel variant: its members by name and its size in bytes."""
    kernel: str
    block: str
    size: int
    members: dict[str, Member]

    def pack(self, values: dict) -> bytes:
        """The block's bytes with ``values`` (member name -> value) in place."""
        names, fmt, places = self._fast
        if values.keys() == names:
            # every dispatch packs its push: plain numbers straight into a struct, whose
            # format (uint, int or float a word) refuses what does not fit; anything else,
            # or anything refused, goes the checked way below for the error naming it
            words = [0] * (self.size // 4)
            try:
                for name, value in values.items():
                    at, whole = places[name]
                    if type(value) is int or type(value) is float:
                        if len(at) != 1:
                            raise TypeError
                        words[at[0]] = value
                        continue
                    if len(value) > len(at) or (whole and len(value) != len(at)):
                        raise TypeError
                    for w, v in zip(at, value):
                        words[w] = v
                return fmt.pack(*words)
            except (TypeError, struct.error):
                pass
        return self._checked(values)

    @functools.cached_property
    def _fast(self):
        """(member names, the block's struct, {name: (words, whole)}): whole members
        (not arrays) take exactly their words' values."""
        codes = ["I"] * (self.size // 4)
        for m in self.members.values():
            for w in m.words:
                codes[w] = {np.uint32: "I", np.int32: "i", np.float32: "f"}[m.dtype]
        return (self.members.keys(), struct.Struct("<" + "".join(codes)),
                {n: (m.words, not m.array) for n, m in self.members.items()})

    def _checked(self, values: dict) -> bytes:
        """:meth:`pack` checking every value, a :class:`BlockError` for the first wrong."""
        given = set(values)
        unknown = given - set(self.members)
        if unknown:
            raise BlockError(f"{self.where(sorted(unknown)[0])}: the block has no such member; "
                             f"it declares {', '.join(self.members)}")
        missing = [n for n in self.members if n not in given]
        if missing:
            raise BlockError(f"{self.where(missing[0])}: not given (every member of a "
                             f"parameter block must be)")
        words = [0] * (self.size // 4)
        for name, value in values.items():
            self._place(words, self.members[name], value)
        return struct.pack(f"<{len(words)}I", *words)

    def where(self, member: str) -> str:
        return f"kernel {self.kernel}, block {self.block}, member {member}"

    def _place(self, words: list, m: Member, value) -> None:
        # Python ints (the common case: every dispatch packs its push) skip NumPy
        ints = (value,) if type(value) is int else value if (
            type(value) in (list, tuple) and all(type(v) is int for v in value)) else None
        if ints is not None and m.dtype is not np.float32:
            lo, hi = _RANGES[m.dtype]
            if len(ints) == m.components * m.count or (m.array and len(ints) <= len(m.words)):
                if all(lo <= v <= hi for v in ints):
                    for w, v in zip(m.words, ints):
                        words[w] = v & 0xFFFFFFFF
                    return
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
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
        # an array given flat (a per-dimension list in uvec4s, say) may end mid-element:
        # the words after it stay zero
        for w, v in zip(m.words, self._convert(m, flat).tolist()):
            words[w] = v

    def _convert(self, m: Member, flat: np.ndarray) -> np.ndarray:
        if m.dtype is np.float32:
            return flat.astype(np.float32).view(np.uint32)
        if flat.dtype.kind == "f":
            if not np.all(np.isfinite(flat)) or np.any(flat != np.floor(flat)):
                raise BlockError(f"{self.where(m.name)}: {m.type} takes integers, got "
                                 f"{flat.tolist()}")
        lo, hi = _RANGES[m.dtype]
        if flat.size and (flat.min() < lo or flat.max() > hi):
            bad = next(v for v in flat.tolist() if not lo <= v <= hi)
            raise BlockError(f"{self.where(m.name)}: {int(bad)} is outside {m.type}'s range "
                             f"[{lo}, {hi}]")
        return flat.astype(np.int64).astype(m.dtype).view(np.uint32)


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

"""Specialization applied to SPIR-V on the host ("freezing" specialization constants).

A driver that does not fold specialization constants before generating code runs every
block a constant guards: SwiftShader executes both sides of each branch under lane
masks and, measured here, kept all 18 cases of ``vkml_activation()``'s switch on the
specialization constant ``ACT`` (a Relu 10x slower than the same kernel with ``max``
written in).  :func:`freeze` rewrites each ``OpSpecConstant*`` whose ID is given into
the plain ``OpConstant*`` of that value and drops its ``SpecId`` decoration, so the
module carries ordinary constants that every compiler folds, branches and switches on
them included.  The result is the module the specialization would give: the same
values, the same code (``OpSpecConstantOp``/``Composite`` over the frozen constants stay
as they are; their operands are now constants).
"""
from __future__ import annotations

import struct

MAGIC = 0x07230203
OP_DECORATE = 71
OP_FUNCTION = 54
DECORATION_SPEC_ID = 1
OP_CONSTANT_TRUE, OP_CONSTANT_FALSE, OP_CONSTANT = 41, 42, 43
OP_SPEC_CONSTANT_TRUE, OP_SPEC_CONSTANT_FALSE, OP_SPEC_CONSTANT = 48, 49, 50


def _instructions(words, start=5, stop=None):
    i, stop = start, len(words) if stop is None else stop
    while i < stop:
        count = words[i] >> 16
        if count == 0:
            raise ValueError(f"SPIR-V: zero-length instruction at word {i}")
        yield i, words[i] & 0xFFFF, count
        i += count


def _declarations_end(words) -> int:
    """The word offset of the first ``OpFunction`` (the module's length if none): the
    SPIR-V logical layout puts every decoration and constant before it, so freezing
    rewrites that part and copies the function bodies (most of a kernel) as they are."""
    for i, op, _ in _instructions(words):
        if op == OP_FUNCTION:
            return i
    return len(words)


def freeze(code: bytes, constants: dict[int, int | float]) -> bytes:
    """``code`` (a SPIR-V module) with the specialization constants of the given IDs
    replaced by plain constants of those values (32-bit ints or floats, as
    ``VkSpecializationInfo`` packs them; a boolean constant is true when nonzero)."""
    if not constants:
        return code
    words = struct.unpack(f"<{len(code) // 4}I", code)
    if words[0] != MAGIC:
        raise ValueError("not a little-endian SPIR-V module")
    end = _declarations_end(words)
    spec_ids: dict[int, int] = {}                 # result id -> SpecId
    drop: set[int] = set()                        # word offsets of decorations to remove
    for i, op, n in _instructions(words, stop=end):
        if op == OP_DECORATE and n == 4 and words[i + 2] == DECORATION_SPEC_ID:
            if words[i + 3] in constants:
                spec_ids[words[i + 1]] = words[i + 3]
                drop.add(i)
    out = list(words[:5])
    for i, op, n in _instructions(words, stop=end):
        inst = words[i:i + n]
        if i in drop:
            continue
        if op in (OP_SPEC_CONSTANT_TRUE, OP_SPEC_CONSTANT_FALSE) and inst[2] in spec_ids:
            value = constants[spec_ids[inst[2]]]
            inst = ((3 << 16) | (OP_CONSTANT_TRUE if value else OP_CONSTANT_FALSE),) + inst[1:3]
        elif op == OP_SPEC_CONSTANT and inst[2] in spec_ids:
            if n != 4:
                raise ValueError(f"SPIR-V: {n - 3}-word specialization constant "
                                 f"{spec_ids[inst[2]]} (only 32-bit ones are frozen)")
            value = constants[spec_ids[inst[2]]]
            word = (struct.unpack("<I", struct.pack("<f", value))[0] if isinstance(value, float)
                    else value & 0xFFFFFFFF)
            inst = ((4 << 16) | OP_CONSTANT, inst[1], inst[2], word)
        out.extend(inst)
    return struct.pack(f"<{len(out)}I", *out) + code[4 * end:]

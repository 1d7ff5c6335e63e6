"""Specialization applied to SPIR-V on the host ("freezing" specialization constants).

A driver that does not fold specialization constants before generating code runs every
block a constant guards: SwiftShader executes both sides of each branch under lane
masks and, measured here, kept all 18 cases of ``vkml_activation()``'s switch on the
specialization constant ``ACT`` (a Relu 10x slower than the same kernel with ``max``
written in).  :func:`freeze` rewrites each ``OpSpecConstant*`` whose ID is given into
the plain ``OpConstant*`` of that value and drops its ``SpecId`` decoration, so the
module carries ordinary constants that every compiler folds, branches and switches on
them included.  The result is the module the specialization would give: the same
values, the same code.  An ``OpSpecConstantOp`` whose operands are all plain constants
then (``FUNC == MAX``, ``RANK - 1``: integer and boolean arithmetic, comparisons, logic
and select) is folded into the plain constant of its value as well: SwiftShader's
optimizer folds a branch on a plain constant but not on such an operation, and ran
every one of the reduction's twelve functions under lane masks with ``FUNC`` frozen.
Other ones (``OpSpecConstantComposite``, operations over an unfrozen constant) stay.
"""
from __future__ import annotations

import struct

MAGIC = 0x07230203
OP_DECORATE = 71
OP_FUNCTION = 54
DECORATION_SPEC_ID = 1
OP_CONSTANT_TRUE, OP_CONSTANT_FALSE, OP_CONSTANT = 41, 42, 43
OP_SPEC_CONSTANT_TRUE, OP_SPEC_CONSTANT_FALSE, OP_SPEC_CONSTANT = 48, 49, 50
OP_SPEC_CONSTANT_OP = 52
#: Changes when freezing (or :func:`alias`) makes different modules of the same constants
#: (the pipeline cache's keys include it: a blob's pipelines of older modules are not
#: counted as saved).
FREEZE_VERSION = 4
OP_VARIABLE = 59
DECORATION_RESTRICT, DECORATION_ALIASED = 19, 20
#: Storage classes of the memory a descriptor binds: UniformConstant (texel buffers),
#: Uniform (uniform blocks; storage blocks before SPIR-V 1.3), StorageBuffer.
BOUND_STORAGE = (0, 2, 12)
OP_TYPE_BOOL, OP_TYPE_INT, OP_TYPE_FLOAT = 20, 21, 22
OP_SELECT = 169
_M = 0xFFFFFFFF


def _s(v: int) -> int:
    return v - (1 << 32) if v & 0x80000000 else v


def _sdiv(a: int, b: int) -> int:
    q = abs(_s(a)) // abs(_s(b))
    return -q if (_s(a) < 0) != (_s(b) < 0) else q


#: OpSpecConstantOp's operations folded on the host (opcode -> value of 32-bit operands as
#: unsigned words; booleans 0/1); a division by zero is left to the driver.
FOLD = {
    126: lambda a: -a, 200: lambda a: ~a, 168: lambda a: 1 - a,
    128: lambda a, b: a + b, 130: lambda a, b: a - b, 132: lambda a, b: a * b,
    134: lambda a, b: a // b if b else None, 137: lambda a, b: a % b if b else None,
    135: lambda a, b: _sdiv(a, b) if b else None,
    194: lambda a, b: a >> (b & 31), 196: lambda a, b: a << (b & 31),
    195: lambda a, b: _s(a) >> (b & 31),
    197: lambda a, b: a | b, 198: lambda a, b: a ^ b, 199: lambda a, b: a & b,
    164: lambda a, b: int(a == b), 165: lambda a, b: int(a != b),
    166: lambda a, b: a | b, 167: lambda a, b: a & b,
    170: lambda a, b: int(a == b), 171: lambda a, b: int(a != b),
    172: lambda a, b: int(a > b), 173: lambda a, b: int(_s(a) > _s(b)),
    174: lambda a, b: int(a >= b), 175: lambda a, b: int(_s(a) >= _s(b)),
    176: lambda a, b: int(a < b), 177: lambda a, b: int(_s(a) < _s(b)),
    178: lambda a, b: int(a <= b), 179: lambda a, b: int(_s(a) <= _s(b)),
    169: lambda c, a, b: a if c else b,
}


def _fold(inst, known: dict, scalar: dict):
    """``inst`` (an OpSpecConstantOp) as the plain constant of its value where its
    operation is in :data:`FOLD`, its type a 32-bit integer or boolean (or float, for a
    select) and its operands known constants (``known``: id -> value; ``scalar``: type id
    -> "int", "bool" or "float"), else None."""
    kind = scalar.get(inst[1])
    fn = FOLD.get(inst[3])
    if (kind is None or fn is None or (kind == "float" and inst[3] != OP_SELECT)
            or any(a not in known for a in inst[4:])):
        return None
    value = fn(*(known[a] for a in inst[4:]))
    if value is None:
        return None
    known[inst[2]] = value = value & (1 if kind == "bool" else _M)
    if kind == "bool":
        return ((3 << 16) | (OP_CONSTANT_TRUE if value else OP_CONSTANT_FALSE), inst[1], inst[2])
    return ((4 << 16) | OP_CONSTANT, inst[1], inst[2], value)


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
    known: dict[int, int] = {}                    # constant id -> value (32-bit word)
    scalar: dict[int, str] = {}                   # 32-bit int / bool type id -> its kind
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
        elif op == OP_SPEC_CONSTANT_OP:
            inst = _fold(inst, known, scalar) or inst
        if inst[0] & 0xFFFF in (OP_CONSTANT_TRUE, OP_CONSTANT_FALSE):
            known[inst[2]] = int(inst[0] & 0xFFFF == OP_CONSTANT_TRUE)
        elif inst[0] & 0xFFFF == OP_CONSTANT and len(inst) == 4 and scalar.get(inst[1]):
            known[inst[2]] = inst[3]
        elif op == OP_TYPE_BOOL:
            scalar[inst[1]] = "bool"
        elif op in (OP_TYPE_INT, OP_TYPE_FLOAT) and inst[2] == 32:
            scalar[inst[1]] = "int" if op == OP_TYPE_INT else "float"
        out.extend(inst)
    return struct.pack(f"<{len(out)}I", *out) + code[4 * end:]


def alias(code: bytes) -> bytes:
    """``code`` with every variable a descriptor binds decorated ``Aliased`` (unless the
    source said ``restrict``).  A SPIR-V variable without it may be compiled as if no
    other variable reached its memory (SPIR-V specification, "Aliasing"), and glslang
    does not emit it for GLSL buffers; but DirectML's element-wise and activation
    operators run in place, the output bound to the memory of an input, so a driver that
    reorders one binding's loads past another's stores (a GPU's compiler may; the CPU
    drivers' did not) would read what the invocation had already written.  Only the
    kernels whose source says ``vkml:aliased`` get it (tools/build_shaders.py): it costs
    the others' code the compiler's freedom to reorder."""
    words = struct.unpack(f"<{len(code) // 4}I", code)
    if words[0] != MAGIC:
        raise ValueError("not a little-endian SPIR-V module")
    end = _declarations_end(words)
    first = None                       # the first decoration: the new ones go before it
    done, bound = set(), []
    for i, op, _ in _instructions(words, stop=end):
        if op == OP_DECORATE:
            first = i if first is None else first
            if words[i + 2] in (DECORATION_RESTRICT, DECORATION_ALIASED):
                done.add(words[i + 1])
        elif op == OP_VARIABLE and words[i + 3] in BOUND_STORAGE:
            bound.append(words[i + 2])
    new = [w for v in bound if v not in done
           for w in ((3 << 16) | OP_DECORATE, v, DECORATION_ALIASED)]
    if first is None or not new:
        return code
    return struct.pack(f"<{len(words) + len(new)}I", *words[:first], *new, *words[first:])


OP_NAME, OP_PHI, OP_LOOP_MERGE, OP_LABEL, OP_UNREACHABLE = 5, 245, 246, 248, 255
OP_SELECTION_MERGE, OP_BRANCH, OP_BRANCH_CONDITIONAL, OP_SWITCH = 247, 249, 250, 251
OP_FUNCTION_END = 56
#: Terminators that end a block (OpBranch .. OpUnreachable, OpTerminateInvocation).
_TERMINATORS = set(range(249, 256)) | {4416}


def _constants(words, end) -> tuple[dict, set]:
    """The declarations' 32-bit integer and boolean constants (id -> word) and type ids."""
    known, ints, types = {}, set(), set()
    for i, op, n in _instructions(words, stop=end):
        if 19 <= op <= 39 or op == 322:                 # OpTypeVoid .. OpTypeForwardPointer
            types.add(words[i + 1])
            if op == OP_TYPE_INT and words[i + 2] == 32:
                ints.add(words[i + 1])
        elif op == OP_CONSTANT and n == 4 and words[i + 1] in ints:
            known[words[i + 2]] = words[i + 3]
        elif op in (OP_CONSTANT_TRUE, OP_CONSTANT_FALSE):
            known[words[i + 2]] = int(op == OP_CONSTANT_TRUE)
    return known, types


def _blocks(words, start):
    """The functions after ``start``: (head instructions, [(label, [instructions])],
    OpFunctionEnd), each instruction a tuple of words."""
    funcs, head, blocks = [], [], None
    for i, op, n in _instructions(words, start=start):
        inst = words[i:i + n]
        if op == OP_FUNCTION_END:
            funcs.append((head, blocks or [], inst))
            head, blocks = [], None
        elif op == OP_LABEL:
            blocks = [] if blocks is None else blocks
            blocks.append((inst[1], [inst]))
        elif blocks is None:
            head.append(inst)
        else:
            blocks[-1][1].append(inst)
    return funcs


def _taken(body: list, known: dict) -> list:
    """A block's instructions with a selection on a known constant reduced to the block
    it takes: a switch to a switch of that default alone (its construct kept: a case
    may break to its merge from a nested one, as the inliner's single-case switches
    do), a conditional branch to the OpBranch to it (its OpSelectionMerge dropped)."""
    if len(body) < 2 or body[-2][0] & 0xFFFF != OP_SELECTION_MERGE:
        return body
    t = body[-1]
    op = t[0] & 0xFFFF
    if op == OP_SWITCH and t[1] in known and len(t) > 3:
        target = dict(zip(t[3::2], t[4::2])).get(known[t[1]], t[2])
        return body[:-1] + [((3 << 16) | OP_SWITCH, t[1], target)]
    if op == OP_BRANCH_CONDITIONAL and t[1] in known:
        target = t[2] if known[t[1]] else t[3]
        return body[:-2] + [((2 << 16) | OP_BRANCH, target)]
    return body


def _successors(body: list) -> list:
    t = body[-1]
    op = t[0] & 0xFFFF
    if op == OP_BRANCH:
        return [t[1]]
    if op == OP_BRANCH_CONDITIONAL:
        return [t[2], t[3]]
    if op == OP_SWITCH:
        return [t[2], *t[4::2]]
    return []


def _reachable(blocks: list) -> set:
    succ = {label: _successors(body) for label, body in blocks}
    seen, todo = set(), [blocks[0][0]] if blocks else []
    while todo:
        b = todo.pop()
        if b not in seen:
            seen.add(b)
            todo.extend(succ.get(b, ()))
    return seen


def _prune_function(blocks: list, known: dict, types: set):
    """The function's blocks with selections on constants taken (:func:`_taken`), the
    blocks no branch reaches then dropped (a merge block a kept header names kept as
    ``OpUnreachable``), its phis' pairs from dropped blocks removed, and the ids the
    dropped blocks defined; None where that would leave a loop or a use unresolved."""
    taken = [(label, _taken(body, known)) for label, body in blocks]
    if all(a[1] is b[1] for a, b in zip(blocks, taken)):
        return None                     # (nothing to take: the function as it is)
    blocks = taken
    live = _reachable(blocks)
    merges, continues = set(), set()
    for label, body in blocks:
        if label in live and len(body) >= 2:
            m = body[-2]
            if m[0] & 0xFFFF == OP_SELECTION_MERGE:
                merges.add(m[1])
            elif m[0] & 0xFFFF == OP_LOOP_MERGE:
                merges.add(m[1])
                continues.add(m[2])
    if continues - live:
        return None
    preds: dict[int, set] = {}           # the live blocks' edges, each phi's parents
    for label, body in blocks:
        if label in live:
            for s in _successors(body):
                preds.setdefault(s, set()).add(label)
    kept, gone = [], set()
    for label, body in blocks:
        if label in live:
            kept.append((label, [(i[0] & 0xFFFF != OP_PHI and i) or _phi(i, preds[label])
                                 for i in body]))
            continue
        gone.update(i[2] for i in body[1:] if len(i) > 2 and i[1] in types)
        if label in merges:
            kept.append((label, [body[0], ((1 << 16) | OP_UNREACHABLE,)]))
        else:
            gone.add(label)
    for _, body in kept:
        for inst in body:
            if gone.intersection(inst[1:]):
                return None
    return kept, gone


def _phi(inst: tuple, parents: set) -> tuple:
    """``inst``, an OpPhi, with the pairs of its block's remaining ``parents`` only."""
    pairs = [w for v, p in zip(inst[3::2], inst[4::2]) if p in parents for w in (v, p)]
    return ((3 + len(pairs)) << 16 | OP_PHI, inst[1], inst[2], *pairs)


def prune(code: bytes) -> bytes:
    """``code`` with each selection on a plain constant (an ``OpSwitch`` on a 32-bit
    integer constant, an ``OpBranchConditional`` on a boolean one, the branch of an
    ``OpSelectionMerge``) reduced to the block it takes (:func:`_taken`) and the blocks
    no branch then reaches removed: what a specializing compiler's dead-branch pass
    leaves, the same code.  A frozen ``ACT`` (:func:`freeze`) leaves the activation's
    switch in every inlined ``vkml_activation()`` call, and lavapipe translates and
    optimizes every case of each before folding them: most of the Winograd output pass's
    pipeline creation (bench/RESULTS.md, "What a pipeline costs lavapipe").  A function with nothing to take, or that it cannot prune safely (a
    loop's continue block left unreachable, a kept instruction naming a removed id), is
    left as it is."""
    words = struct.unpack(f"<{len(code) // 4}I", code)
    if words[0] != MAGIC:
        raise ValueError("not a little-endian SPIR-V module")
    end = _declarations_end(words)
    known, types = _constants(words, end)
    if not any(op in (OP_SWITCH, OP_BRANCH_CONDITIONAL) and words[i + 1] in known
               for i, op, _ in _instructions(words, start=end)):
        return code                     # (no selection on a constant: a quick look)
    funcs, gone = [], set()
    for head, blocks, tail in _blocks(words, end):
        done = _prune_function(blocks, known, types)
        if done is not None:
            blocks, dropped = done
            gone |= dropped
        funcs.append((head, blocks, tail))
    if not gone:
        return code
    out = [w for i, op, n in _instructions(words, stop=end)
           if not (op in (OP_NAME, OP_DECORATE) and words[i + 1] in gone)
           for w in words[i:i + n]]
    out = list(words[:5]) + out
    for head, blocks, tail in funcs:
        for inst in head + [i for _, body in blocks for i in body] + [tail]:
            out.extend(inst)
    return struct.pack(f"<{len(out)}I", *out)

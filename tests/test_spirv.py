"""Specialization constants frozen on the host (vkml/runtime/spirv.py): the SpecId
decoration goes, the constant becomes a plain OpConstant of the value, every other
instruction stays; a frozen pipeline computes what the specialized one does."""
from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.runtime import pipelines, spirv

ROOT = Path(__file__).resolve().parent.parent


def _insts(code: bytes):
    words = struct.unpack(f"<{len(code) // 4}I", code)
    return [(op, list(words[i:i + n])) for i, op, n in spirv._instructions(words)]


def _spec_ids(code: bytes) -> dict:
    return {w[1]: w[3] for op, w in _insts(code)
            if op == spirv.OP_DECORATE and len(w) == 4 and w[2] == spirv.DECORATION_SPEC_ID}


@pytest.mark.parametrize("value", [0, 6, 18])
def test_freeze_one_constant(value):
    code = pipelines.load_spirv("activation_f32")
    consts = pipelines.kernel_manifest()["activation_f32"]["constants"]
    act = consts["ACT"]["id"]
    before = _spec_ids(code)
    result_id = next(r for r, sid in before.items() if sid == act)
    frozen = spirv.freeze(code, {act: value})
    after = _spec_ids(frozen)
    assert after == {r: s for r, s in before.items() if s != act}
    constant = [w for op, w in _insts(frozen) if op == spirv.OP_CONSTANT and w[2] == result_id]
    assert constant and constant[0][3] == value
    assert not any(op == spirv.OP_SPEC_CONSTANT and w[2] == result_id
                   for op, w in _insts(frozen))
    # nothing else changed: the same instructions but the decoration and the constant
    assert len(_insts(frozen)) == len(_insts(code)) - 1
    # ...and the function bodies (after the declarations) are the same bytes
    end = spirv._declarations_end(struct.unpack(f"<{len(code) // 4}I", code))
    assert end < len(code) // 4 and frozen.endswith(code[4 * end:])
    assert spirv.freeze(code, {}) == code


def test_freeze_bool_and_float_and_refusals():
    code = pipelines.load_spirv("activation_f32")
    consts = pipelines.kernel_manifest()["activation_f32"]["constants"]
    vs = consts["VEC_STORE"]["id"]
    for value, op in ((1, spirv.OP_CONSTANT_TRUE), (0, spirv.OP_CONSTANT_FALSE)):
        frozen = spirv.freeze(code, {vs: value})
        assert vs not in _spec_ids(frozen).values()
        assert any(o == op for o, _ in _insts(frozen))
    with pytest.raises(ValueError, match="SPIR-V"):
        spirv.freeze(b"\0" * 20, {1: 2})


def test_frozen_activation_matches_fused_formula(device):
    """The standalone Relu and the fused one (convolution) run frozen ACT modules."""
    assert "ACT" in pipelines.kernel_manifest()["activation_f32_texel4"]["frozen"]
    x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(1, 1, 8, 8)
    t = dml.TensorDesc("float32", x.shape)
    op = device.compile_operator(device.create_operator(dml.ActivationLeakyReluOperatorDesc(
        t, t, alpha=0.25)))
    try:
        out = device.empty(x.shape)
        op.execute([device.tensor(x)], [out])
        np.testing.assert_array_equal(out.numpy(), np.where(x >= 0, x, np.float32(0.25) * x))
    finally:
        op.release()


def _module(ops, spec_value_ids):
    """A declarations-only module: int (id 1), bool (id 2), spec constant A (id 3, SpecId
    7), plain constant B (id 4), then ``ops`` as OpSpecConstantOp (opcode, result type,
    operand ids) with results from id 10, then one OpFunction word to end the part."""
    w = [spirv.MAGIC, 0x10300, 0, 64, 0]
    w += [(4 << 16) | spirv.OP_DECORATE, 3, spirv.DECORATION_SPEC_ID, 7]
    w += [(4 << 16) | spirv.OP_TYPE_INT, 1, 32, 1, (2 << 16) | spirv.OP_TYPE_BOOL, 2]
    w += [(4 << 16) | spirv.OP_SPEC_CONSTANT, 1, 3, 0, (4 << 16) | spirv.OP_CONSTANT, 1, 4,
          spec_value_ids]
    for k, (opcode, rtype, args) in enumerate(ops):
        w += [((4 + len(args)) << 16) | spirv.OP_SPEC_CONSTANT_OP, rtype, 10 + k, opcode, *args]
    w += [(5 << 16) | spirv.OP_FUNCTION, 0, 0, 0, 0]
    return struct.pack(f"<{len(w)}I", *w)


def _values(code: bytes) -> dict:
    out = {}
    for op, w in _insts(code):
        if op == spirv.OP_CONSTANT:
            out[w[2]] = w[3] - (1 << 32) if w[3] >> 31 else w[3]
        elif op in (spirv.OP_CONSTANT_TRUE, spirv.OP_CONSTANT_FALSE):
            out[w[2]] = op == spirv.OP_CONSTANT_TRUE
    return out


def test_freeze_folds_constant_operations():
    """OpSpecConstantOp over frozen and plain constants becomes the plain constant of its
    value (signed and unsigned arithmetic, comparisons, logic, select), against Python;
    one over an unfrozen constant stays."""
    rng = np.random.default_rng(5)
    int_ops = {128: lambda a, b: a + b, 130: lambda a, b: a - b, 132: lambda a, b: a * b,
               135: lambda a, b: int(a / b), 195: lambda a, b: a >> (b & 31),
               199: lambda a, b: a & b}
    cmp_ops = {170: lambda a, b: a == b, 171: lambda a, b: a != b, 173: lambda a, b: a > b,
               177: lambda a, b: a < b, 175: lambda a, b: a >= b, 179: lambda a, b: a <= b,
               176: lambda a, b: a % (1 << 32) < b % (1 << 32)}
    wrap = lambda v: (v + (1 << 31)) % (1 << 32) - (1 << 31)      # noqa: E731
    for _ in range(20):
        a, b = (int(v) for v in rng.integers(-40, 40, 2))
        b = b or 3
        ops = ([(op, 1, [3, 4]) for op in int_ops] + [(op, 2, [3, 4]) for op in cmp_ops])
        n = len(ops)
        ops += [(166, 2, [10 + len(int_ops), 11 + len(int_ops)]),     # ==  or  !=
                (168, 2, [10 + len(int_ops)]),                       # not (==)
                (169, 1, [12 + len(int_ops), 3, 4])]                 # (a > b) ? a : b
        code = _module(ops, b & 0xFFFFFFFF)
        got = _values(spirv.freeze(code, {7: a & 0xFFFFFFFF}))
        want = [wrap(f(a, b)) for f in int_ops.values()] + [f(a, b) for f in cmp_ops.values()]
        want += [a == b or a != b, not a == b, a if a > b else b]
        assert [got.get(10 + k) for k in range(n + 3)] == want, (a, b)
        # unfrozen: every operation stays a specialization-constant operation
        assert not any(10 <= r for r in _values(spirv.freeze(code, {99: 1})))


def test_reduce_function_branches_fold():
    """With the reduction's code-selecting constants frozen, no specialization-constant
    operation over plain constants is left (SwiftShader only folds branches on plain
    constants: unfolded, it ran all twelve functions)."""
    name = "reduce_f32"
    consts = pipelines.kernel_manifest()[name]["constants"]
    frozen = {consts[c]["id"]: v for c, v in
              {"FUNC": 10, "RDIMS": 1, "OUT_INDEX": 0, "GROUP": 0, "VEC4": 0}.items()}
    code = spirv.freeze(pipelines.load_spirv(name), frozen)
    plain = set(_values(code))
    left = [w for op, w in _insts(code)
            if op == spirv.OP_SPEC_CONSTANT_OP and all(a in plain for a in w[4:])
            and w[3] in spirv.FOLD]
    assert not left
    assert len(plain) > len(_values(pipelines.load_spirv(name)))


def _aliased(code: bytes) -> set:
    return {w[1] for op, w in _insts(code)
            if op == spirv.OP_DECORATE and w[2] == spirv.DECORATION_ALIASED}


def _bound(code: bytes) -> set:
    return {w[2] for op, w in _insts(code)
            if op == spirv.OP_VARIABLE and w[3] in spirv.BOUND_STORAGE}


def test_alias_decorates_every_bound_variable_once():
    """``alias``: each variable a descriptor binds gets one ``Aliased`` decoration, the
    other instructions stay as they were (in order), and a second pass adds nothing;
    freezing afterwards still finds its constants."""
    code = pipelines.load_spirv("element_wise_int_row_texel4")
    out = spirv.alias(code)
    bound = _bound(code)
    assert len(bound) >= 3 and not _aliased(code) and _aliased(out) == bound
    added = [w for op, w in _insts(out) if op == spirv.OP_DECORATE
             and w[2] == spirv.DECORATION_ALIASED]
    assert len(added) == len(bound)
    assert [i for i in _insts(out) if i[1] not in added] == _insts(code)
    assert spirv.alias(out) == out
    ids = _spec_ids(out)
    assert spirv.freeze(out, {ids[next(iter(ids))]: 1}) != out


def test_in_place_kernels_are_the_aliased_ones(device, monkeypatch):
    """The manifest marks exactly the element-wise and activation variants (the operators
    DirectML runs in place) ``aliased``, and the pipeline cache decorates those modules
    and no other (the decoration would cost a convolution's code the compiler's freedom
    to reorder)."""
    manifest = pipelines.kernel_manifest()
    assert {e["source"] for e in manifest.values() if e["aliased"]} == {
        "element_wise.comp", "activation.comp"}
    seen = []
    monkeypatch.setattr(spirv, "alias", lambda code: seen.append(code) or code)
    with vkml.Device(device.index) as dev:       # (its own modules, made here)
        for name in ("convolution_direct_f16", "element_wise_int_row_texel4"):
            dev.context.pipelines.module(name)
    assert seen == [pipelines.load_spirv("element_wise_int_row_texel4")]


# -- hazards a GPU exposed that the CPU drivers hide, checked on the shipped SPIR-V --------
OP_FUNCTION_PARAMETER, OP_FUNCTION_CALL, OP_LOAD, OP_STORE = 55, 57, 61, 62
OP_TYPE_POINTER, OP_ACCESS_CHAINS = 32, (65, 66, 67)
OP_ATOMIC_AND, OP_ATOMICS = 240, range(227, 243)
OP_IMAGE_READS = (95, 98)                     # OpImageFetch, OpImageRead
OP_SREM, OP_SMOD = 138, 139
DECORATION_BUFFER_BLOCK = 3
STORAGE_UNIFORM, STORAGE_BUFFER = 2, 12
#: Function-body instructions without a result id (the rest: result type, result, operands)
NO_RESULT = {8, 56, 62, 224, 225, 228, 246, 247, 249, 250, 251, 252, 253, 254, 255, 317}
#: Instructions whose operands after these many words are literals, not ids
LITERALS_FROM = {79: 5, 81: 4, 82: 5}         # OpVectorShuffle, OpCompositeExtract, -Insert


def _shipped():
    return sorted(pipelines.kernel_manifest())


def _data_flow(code: bytes):
    """(edges, data, atomic_ands) of a module: ``edges`` maps an id to the ids its value
    may come from (through function-local variables, parameters and calls, flow
    insensitively); ``data`` holds the ids whose value is read from a bound buffer (a
    storage buffer, a texel fetch, an atomic); ``atomic_ands`` the OpAtomicAnds' value
    operands."""
    words = struct.unpack(f"<{len(code) // 4}I", code)
    insts = [list(words[i:i + n]) for i, _, n in spirv._instructions(words)]
    blocks = {w[1] for w in insts if w[0] & 0xFFFF == spirv.OP_DECORATE
              and w[2] == DECORATION_BUFFER_BLOCK}
    pointee = {w[1]: (w[2], w[3]) for w in insts if w[0] & 0xFFFF == OP_TYPE_POINTER}
    edges, data, ands, base = {}, set(), [], {}
    params, calls, returns, fn = {}, [], {}, None
    for w in insts:
        op = w[0] & 0xFFFF
        if op == spirv.OP_VARIABLE:
            ty = pointee[w[1]][1]
            if w[3] == STORAGE_BUFFER or (w[3] == STORAGE_UNIFORM and ty in blocks):
                data.add(w[2])
        elif op == spirv.OP_FUNCTION:
            fn = w[2]
            params[fn] = []
        elif op == OP_FUNCTION_PARAMETER:
            params[fn].append(w[2])
        elif op == 254:                           # OpReturnValue
            returns.setdefault(fn, []).append(w[1])
        elif op == OP_STORE:
            edges.setdefault(("store", w[1]), []).append(w[2])
        elif op == OP_FUNCTION_CALL:
            calls.append(w)
        elif op == 248 or op in NO_RESULT or fn is None:   # OpLabel, declarations
            continue
        elif op in OP_ACCESS_CHAINS:
            base[w[2]] = w[3]
            edges[w[2]] = w[3:]
        elif op == OP_LOAD:
            edges[w[2]] = [w[3]]
        elif op in OP_IMAGE_READS or op in OP_ATOMICS:
            data.add(w[2])
            if op == OP_ATOMIC_AND:
                ands.append(w[6])
        elif op == 12:                            # OpExtInst: set, instruction, operands
            edges[w[2]] = w[5:]
        else:
            edges[w[2]] = w[3:LITERALS_FROM.get(op, len(w))]

    def root(p):
        while p in base:
            p = base[p]
        return p

    # a variable's (or a parameter pointer's) value: what is stored through it
    for key in [k for k in edges if isinstance(k, tuple)]:
        edges.setdefault(root(key[1]), []).extend(edges.pop(key))
    for w in calls:                               # parameters: the calls' arguments
        edges[w[2]] = w[4:] + returns.get(w[3], [])
        for p, a in zip(params.get(w[3], []), w[4:]):
            edges.setdefault(p, []).append(a)
    return edges, data, ands


def _reads_data(edges, data, start) -> bool:
    seen, todo = set(), [start]
    while todo:
        i = todo.pop()
        if i in data:
            return True
        if i not in seen:
            seen.add(i)
            todo.extend(edges.get(i, ()))
    return False


def test_sub_word_store_atomics_wait_for_the_value():
    """Every atomicAnd of a shipped kernel (the sub-word stores of VKML_ST8 / VKML_ST16)
    takes an operand computed from data read from a bound buffer, so that no compiler
    or GPU can issue it before the loads of the element's inputs: run in place, one
    clearing the element ahead of its input's load made an NVIDIA GPU read 0 there (in-place
    8-bit ADD, CLIP1), which lavapipe and SwiftShader, running in program order, never show."""
    late = []
    checked = 0
    for name in _shipped():
        edges, data, ands = _data_flow(pipelines.load_spirv(name))
        checked += len(ands)
        late += [name for v in ands if not _reads_data(edges, data, v)]
    assert checked > 100 and not late, sorted(set(late))


#: An in-place 8-bit kernel: Y (the memory of X) = X + 1, four elements an invocation,
#: through STORE (the old sub-word store, whose atomicAnd depends on the index alone, or
#: vkml_index.glsl's VKML_ST8).
_IN_PLACE = """#version 450
#include "vkml_index.glsl"
#define OLD_ST8(B, i, v) { uint s_ = ((i) & 3u) << 3; \\
    atomicAnd(B[(i) >> 2], ~(0xFFu << s_)); atomicOr(B[(i) >> 2], ((v) & 0xFFu) << s_); }
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) buffer Y { uint y[]; };
void main() {
    for (uint j = 0u; j < 4u; j++) {
        uint i = 4u * gl_GlobalInvocationID.x + j;
        STORE(y, i, VKML_LD8(x, i) + 1u)
    }
}
"""


def _compile_in_place(tmp_path, store: str) -> bytes:
    glslc = shutil.which("glslc")
    if glslc is None:
        pytest.skip("glslc not installed")
    src = tmp_path / f"{store}.comp"
    src.write_text(_IN_PLACE)
    out = tmp_path / f"{store}.spv"
    subprocess.run([glslc, "-fshader-stage=compute", "--target-env=vulkan1.1", "-O",
                    "-I", str(ROOT / "glsl" / "include"), f"-DSTORE={store}", str(src),
                    "-o", str(out)], check=True, capture_output=True)
    return out.read_bytes()


def test_sub_word_store_check_flags_an_index_only_mask(tmp_path):
    """The check above fails on the earlier sub-word store (its atomicAnd cleared the
    element whatever the value) and passes vkml_index.glsl's, compiled as the kernels are."""
    for store, ok in (("OLD_ST8", False), ("VKML_ST8", True)):
        edges, data, ands = _data_flow(_compile_in_place(tmp_path, store))
        assert ands and all(_reads_data(edges, data, v) == ok for v in ands), store


def test_padding_rows_take_no_signed_remainder():
    """The rows padding kernels fold coordinates with ``%`` on non-negative operands only
    (no OpSMod / OpSRem): GLSL leaves ``%`` of a negative operand undefined, and an NVIDIA
    GPU computed glslang's OpSMod of a negative coordinate as the unsigned remainder
    (reflection / symmetric / wrap paddings beyond one period read the wrong elements),
    where lavapipe and SwiftShader computed the floor modulo the code expected."""
    names = [n for n in _shipped() if n.startswith(("padding_rows", "padding_e"))]
    assert len(names) >= 10
    for name in names:
        ops = {op for op, _ in _insts(pipelines.load_spirv(name))}
        assert not ops & {OP_SREM, OP_SMOD}, name


def _cfg(code: bytes):
    """The module's instructions, each function's blocks as {label: (successors, [phi
    parents])}, and the ids its functions define (typed results and labels)."""
    words = struct.unpack(f"<{len(code) // 4}I", code)
    insts = [(op, words[i:i + n]) for i, op, n in spirv._instructions(words)]
    end = spirv._declarations_end(words)
    known, types = spirv._constants(words, end)
    funcs, defined = [], set()
    for _, blocks, _ in spirv._blocks(words, end):
        funcs.append({label: (spirv._successors(body),
                              [set(i[4::2]) for i in body if i[0] & 0xFFFF == spirv.OP_PHI])
                      for label, body in blocks})
        defined |= {i[2] for _, body in blocks for i in body if len(i) > 2 and i[1] in types}
        defined |= set(funcs[-1])
    return insts, known, funcs, defined


@pytest.mark.parametrize("act, every", [(6, 3), (0, 7), (11, 11)])
def test_prune_takes_the_activations_case(act, every):
    """With ACT frozen, the kernel variants that freeze it (every 3rd, 7th, 11th of
    their sorted names: a sample) lose the other cases of the activation's switch: no switch on a
    constant keeps more than one target, most modules shrink, every branch target is a
    block that is left, each phi names exactly its block's predecessors, and no name or
    decoration names a removed id (rules the validation layer checks on the device)."""
    names = sorted(n for n, e in pipelines.kernel_manifest().items() if "ACT" in e["frozen"])
    names = names[act % every::every]
    smaller = 0
    for name in names:
        e = pipelines.kernel_manifest()[name]
        code = spirv.freeze(pipelines.load_spirv(name), {e["constants"]["ACT"]["id"]: act})
        pruned = spirv.prune(code)
        smaller += len(pruned) < len(code)
        insts, known, funcs, defined = _cfg(pruned)
        assert not [w for op, w in insts
                    if op == spirv.OP_SWITCH and w[1] in known and len(w) > 3], name
        for blocks in funcs:
            preds = {}
            for label, (succ, _) in blocks.items():
                for t in succ:
                    assert t in blocks, (name, label, t)
                    preds.setdefault(t, set()).add(label)
            for label, (_, phis) in blocks.items():
                assert all(p == preds.get(label, set()) for p in phis), (name, label)
        removed = _cfg(code)[3] - defined
        assert not removed & {w[1] for op, w in insts
                              if op in (spirv.OP_NAME, spirv.OP_DECORATE)}, name
    assert smaller > len(names) // 2
    # nothing to take: the module as it is
    plain = pipelines.load_spirv("activation_f32")
    assert spirv.prune(plain) == plain


def test_pruned_modules_compute_the_same_bits(device, monkeypatch):
    """A Winograd convolution with a fused Relu (its output pass's 16 activation calls
    pruned to the Relu's case) and a fused Elu on the implicit GEMM give the same bits
    pruned and unpruned, and the reference's values."""
    from helpers import compile_on_path, run_desc
    from references import convolution_reference

    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 16, 12, 16)).astype(np.float32)
    w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
    outs = {}
    for prune in (True, False):
        if not prune:
            monkeypatch.setattr(spirv, "prune", lambda code: code)
        with vkml.Device(device.index) as dev:    # (a device of its own: its own modules)
            for path, act in (("winograd", dml.ActivationReluOperatorDesc()),
                              ("gemm_sg", dml.ActivationEluOperatorDesc(alpha=0.5))):
                desc = dml.ConvolutionOperatorDesc(
                    dml.TensorDesc("float32", x.shape), dml.TensorDesc("float32", w.shape),
                    None, dml.TensorDesc("float32", (1, 24, 12, 16)), start_padding=(1, 1),
                    end_padding=(1, 1), fused_activation=act)
                try:
                    compiled = compile_on_path(dev, desc, path)
                except vkml.UnsupportedError:
                    continue
                outs[prune, path] = run_desc(dev, desc, x, w, None, compiled=compiled)
    ref = convolution_reference(x, w, None, [1, 1], [1, 1], [1, 1], [1, 1], [0, 0], 1,
                                "cross_correlation", "forward")
    want = {"winograd": np.maximum(ref, 0), "gemm_sg": np.where(ref > 0, ref, 0.5 * np.expm1(ref))}
    assert ("winograd" in {p for _, p in outs}) or not outs
    for (prune, path), got in outs.items():
        np.testing.assert_array_equal(got.view(np.uint32), outs[not prune, path].view(np.uint32))
        np.testing.assert_allclose(got.reshape(ref.shape), want[path], rtol=1e-3, atol=2e-3)

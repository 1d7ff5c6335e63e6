"""DML_JOIN (vkml.join): the page's examples verbatim, random joins of every data type bit
for bit against numpy.concatenate (permuted and padded layouts in, a strided output with
canaries in its gaps), both paths (kernel, copy engine), windows and split grids at
lowered limits, a 27-input join, every rule of the page, a fuzzer (tests/fuzzing.py),
threads, leaks and a graph.

The helpers here (``layout``, ``out_layout``, ``run_copies``; the fuzzers' ``fuzz_shape``,
``on_path``, ``overlapping``) serve test_split.py and test_slice.py too."""
from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import strategies as st

import vkml
from vkml import dml
from vkml.errors import ArgumentTypeError, ValidationError

from fuzzing import (TENSOR_BROKEN, break_tensor_rule, compiled_or_refused, fuzzer, lay_out,
                     padded_output, placement, run_checked)
from helpers import ALL_DTYPES, assert_no_leaks, random_bits, same_bits
from helpers import run_in_threads

CANARY = 0xA5
OPS = importlib.import_module("vkml.ops.join_split_slice")


# -- helpers shared with test_split.py and test_slice.py ----------------------------------
def layout(rng, shape, dtype, kind=None):
    """Random bits of ``shape`` in a random memory layout: dimensions permuted and/or
    padded (or packed).  Returns (flat buffer, DML element strides, logical array)."""
    kind = kind or rng.choice(["packed", "padded", "permuted", "both"])
    rank = len(shape)
    perm = rng.permutation(rank) if kind in ("permuted", "both") else np.arange(rank)
    pad = [int(rng.integers(0, 2)) if kind in ("padded", "both") else 0 for _ in shape]
    phys = [shape[p] + pad[p] for p in perm]
    buf = random_bits(rng, phys, dtype)
    view = buf[tuple(slice(0, shape[p]) for p in perm)].transpose(np.argsort(perm))
    strides = tuple(int(s) // np.dtype(dtype).itemsize for s in view.strides)
    return buf.reshape(-1), strides, np.array(view)


def out_layout(rng, shape, kind=None):
    """A random output layout (as :func:`layout`): (strides, elements of its buffer,
    flat indices of the logical elements)."""
    kind = kind or rng.choice(["packed", "padded", "permuted", "both"])
    rank = len(shape)
    perm = rng.permutation(rank) if kind in ("permuted", "both") else np.arange(rank)
    pad = [int(rng.integers(0, 2)) if kind in ("padded", "both") else 0 for _ in shape]
    phys = [shape[p] + pad[p] for p in perm]
    idx = np.arange(int(np.prod(phys))).reshape(phys)
    view = idx[tuple(slice(0, shape[p]) for p in perm)].transpose(np.argsort(perm))
    strides = tuple(int(s) // idx.itemsize for s in view.strides)
    return strides, idx.size, np.array(view)


def run_copies(device, desc, flats, path=None):
    """Compile ``desc`` (forcing ``path`` when given), run it on the flat input buffers
    into outputs filled with CANARY bytes; returns (output buffers, the operator's paths)."""
    op_desc = device.create_operator(desc).desc
    cls = {dml.JoinOperatorDesc: OPS.CompiledJoin, dml.SplitOperatorDesc: OPS.CompiledSplit,
           dml.SliceOperatorDesc: OPS.CompiledSlice,
           dml.Slice1OperatorDesc: OPS.CompiledSlice}[type(desc)]
    op = cls(device, op_desc, path=path)
    try:
        outs = []
        for t in desc.outputs():
            n = t.total_tensor_size_in_bytes
            o = device.empty((n,), np.uint8)
            o.write(np.full(n, CANARY, np.uint8))
            outs.append(o)
        op.execute([device.tensor(f) for f in flats], outs)
        dt = desc.outputs()[0].dtype
        size = np.dtype(dt).itemsize
        got = [o.numpy()[:o.numpy().size // size * size].view(dt) for o in outs]
        return got, op.paths
    finally:
        op.release()


def check_out(got, idx, want, nelems):
    """The logical elements equal ``want`` bit for bit; every gap keeps its canary."""
    assert same_bits(got[idx], want)
    gaps = np.ones(got.size, bool)
    gaps[idx.reshape(-1)] = False
    assert (got[gaps].view(np.uint8) == CANARY).all()


# -- the page's examples ---------------------------------------------------------------
def test_page_example_1(device):
    a = np.array([[[[1, 2, 3], [4, 5, 6]]]], np.float32)
    b = np.array([[[[7, 8, 9, 10], [11, 12, 13, 14]]]], np.float32)
    want = np.array([[[[1, 2, 3, 7, 8, 9, 10], [4, 5, 6, 11, 12, 13, 14]]]], np.float32)
    assert same_bits(vkml.join([a, b], 3, device=device), want)


@pytest.mark.parametrize("axis, want", [
    (1, [[[[1, 2], [3, 4]], [[5, 6], [7, 8]], [[9, 10], [11, 12]]]]),
    (2, [[[[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12]]]]),
    (3, [[[[1, 2, 5, 6, 9, 10], [3, 4, 7, 8, 11, 12]]]]),
])
def test_page_example_2(device, axis, want):
    ins = [np.array([[[[1, 2], [3, 4]]]], np.float32), np.array([[[[5, 6], [7, 8]]]], np.float32),
           np.array([[[[9, 10], [11, 12]]]], np.float32)]
    assert same_bits(vkml.join(ins, axis, device=device), np.array(want, np.float32))


# -- randomized ------------------------------------------------------------------------
def random_join(rng, device, dtype, path, max_rank=5):
    rank = int(rng.integers(1, max_rank + 1))
    shape = [int(rng.integers(1, 5)) for _ in range(rank)]
    axis = int(rng.integers(0, rank))
    count = int(rng.integers(1, 5))
    parts = [int(rng.integers(1, 4)) for _ in range(count)]
    ins, flats, logicals = [], [], []
    for p in parts:
        s = list(shape)
        s[axis] = p
        flat, st, logical = layout(rng, s, dtype)
        ins.append(dml.TensorDesc(dtype, s, st))
        flats.append(flat)
        logicals.append(logical)
    out_shape = list(shape)
    out_shape[axis] = sum(parts)
    ost, n, idx = out_layout(rng, out_shape)
    desc = dml.JoinOperatorDesc(ins, dml.TensorDesc(dtype, out_shape, ost), axis)
    (got,), paths = run_copies(device, desc, flats, path)
    check_out(got, idx, np.concatenate(logicals, axis), n)
    return paths


@pytest.mark.parametrize("path", [None, "kernel", "copy"])
def test_random_joins(device, budget, path):
    rng = np.random.default_rng({None: 0, "kernel": 1, "copy": 2}[path])
    for i in range(budget):
        random_join(rng, device, ALL_DTYPES[(i * 5 + len(path or "")) % 11], path)


def test_functional_all_types(device):
    rng = np.random.default_rng(3)
    for dtype in ALL_DTYPES:
        a, b = random_bits(rng, (2, 3, 5), dtype), random_bits(rng, (2, 1, 5), dtype)
        assert same_bits(vkml.join([a, b], -2, device=device), np.concatenate([a, b], 1))
    t = vkml.tensor(a, device=device)
    y = vkml.join([t, a], 0)
    assert isinstance(y, vkml.Tensor) and same_bits(y.numpy(), np.concatenate([a, a]))


def test_eight_dimensions(device):
    rng = np.random.default_rng(4)
    a = random_bits(rng, (2, 1, 2, 1, 2, 1, 2, 3), "uint16")
    b = random_bits(rng, (2, 1, 2, 1, 2, 1, 2, 2), "uint16")
    assert same_bits(vkml.join([a, b], 7, device=device), np.concatenate([a, b], 7))


def test_copy_engine_rows(device):
    """Long rows (a join along the outermost axis) go to the copy engine by default; the
    kernel path (rows of whole words: permute's, as 32-bit words) gives the same bits."""
    rng = np.random.default_rng(5)
    a, b = random_bits(rng, (3, 4096), "int8"), random_bits(rng, (2, 4096), "int8")
    ta, tb = dml.TensorDesc("int8", a.shape), dml.TensorDesc("int8", b.shape)
    desc = dml.JoinOperatorDesc([ta, tb], dml.TensorDesc("int8", (5, 4096)), 0)
    want = np.concatenate([a, b]).reshape(-1)
    for path, expect in [(None, ["copy"]), ("kernel", ["permute"])]:
        (got,), paths = run_copies(device, desc, [a.reshape(-1), b.reshape(-1)], path)
        assert paths == expect and same_bits(got, want)


@pytest.mark.parametrize("path", ["kernel", "copy"])
def test_broadcast_inputs(device, path):
    """Zero strides (DirectML's broadcasting) in the inputs, as rows and as columns."""
    rng = np.random.default_rng(11)
    row, col = random_bits(rng, (1, 6), "int16"), random_bits(rng, (5, 1), "int16")
    ins = [dml.TensorDesc("int16", (5, 6), (0, 1)), dml.TensorDesc("int16", (5, 6), (1, 0))]
    desc = dml.JoinOperatorDesc(ins, dml.TensorDesc("int16", (5, 12)), 1)
    (got,), _ = run_copies(device, desc, [row.reshape(-1), col.reshape(-1)], path)
    want = np.concatenate([np.broadcast_to(row, (5, 6)), np.broadcast_to(col, (5, 6))], 1)
    assert same_bits(got[:60].reshape(5, 12), want)


def test_many_inputs(device):
    """27 small inputs (Microsoft's concat model has that many)."""
    rng = np.random.default_rng(6)
    xs = [random_bits(rng, (1, int(rng.integers(1, 4)), 3, 3), "float32") for _ in range(27)]
    assert same_bits(vkml.join(xs, 1, device=device), np.concatenate(xs, 1))


@pytest.mark.parametrize("dtype", ["int64", "uint8"])
def test_windows_and_split_grids(device, dtype):
    """Lowered limits: every binding windowed, every grid split."""
    rng = np.random.default_rng(7)
    a, b = random_bits(rng, (30, 20), dtype), random_bits(rng, (30, 24), dtype)
    align = device._ctx.binding_alignment()
    limits = {"maxStorageBufferRange": a.nbytes // 3 + 4 * align,
              "maxComputeWorkGroupCount": (2, 2, 2)}
    desc = dml.JoinOperatorDesc([dml.TensorDesc(dtype, a.shape), dml.TensorDesc(dtype, b.shape)],
                                dml.TensorDesc(dtype, (30, 44)), 1)
    with vkml.Device(device.index, limits=limits) as dev:
        op = OPS.CompiledJoin(dev, dev.create_operator(desc).desc, path="kernel")
        try:
            assert all(w is not None and len(w) > 1 for _, _, (_, w) in op.steps)
            out = dev.empty((30, 44), dtype)
            op.execute([dev.tensor(a), dev.tensor(b)], [out])
            assert same_bits(out.numpy(), np.concatenate([a, b], 1))
        finally:
            op.release()


# -- rules -----------------------------------------------------------------------------
T = dml.TensorDesc("float32", (2, 3, 4))


@pytest.mark.parametrize("ins, out, axis, field", [
    ([], T, 0, "input_tensors"),
    ([T], T, 3, "axis"),
    ([T, T], dml.TensorDesc("float32", (2, 3, 9)), 2, "output_tensor.sizes[2]"),
    ([T, dml.TensorDesc("float32", (2, 4, 4))], dml.TensorDesc("float32", (2, 3, 8)), 2,
     "input_tensors[1].sizes[1]"),
    ([T, dml.TensorDesc("int32", (2, 3, 4))], dml.TensorDesc("float32", (2, 3, 8)), 2,
     "input_tensors[1].data_type"),
    ([T, dml.TensorDesc("float32", (2, 3, 4, 1))], dml.TensorDesc("float32", (2, 3, 8)), 2,
     "input_tensors[1].sizes"),
    ([T], dml.TensorDesc("float32", (2, 3, 4), (0, 0, 1)), 0, "output_tensor.strides"),
    ([T, None], T, 0, "input_tensors[1]"),
    ([T], None, 0, "output_tensor"),
    ([T], T, -1, "axis"),
])
def test_rules(device, ins, out, axis, field):
    with pytest.raises(ValidationError) as info:
        device.create_operator(dml.JoinOperatorDesc(ins, out, axis))
    assert info.value.field == f"JoinOperatorDesc.{field}", str(info.value)
    assert same_bits(vkml.join([np.arange(3, dtype=np.int8)], device=device),
                     np.arange(3, dtype=np.int8))


def test_argument_rules(device):
    with pytest.raises(ArgumentTypeError):
        device.create_operator(dml.JoinOperatorDesc(T, T, 0))
    with pytest.raises(ArgumentTypeError):
        vkml.join(np.ones(3), device=device)
    with pytest.raises(ValidationError):
        vkml.join([], device=device)
    with pytest.raises(ValidationError) as info:
        vkml.join([np.ones((2, 3)), np.ones((3, 3))], 1, device=device)
    assert info.value.field.endswith("input_tensors[1].sizes[0]")


def test_feature_level():
    f32 = dml.TensorDesc("float32", (1, 1, 2, 2))
    assert dml.JoinOperatorDesc([f32], f32, 0).feature_level() == dml.FeatureLevel.FL_1_0
    i64 = dml.TensorDesc("int64", (2,))
    assert dml.JoinOperatorDesc([i64], i64, 0).feature_level() == dml.FeatureLevel.FL_4_1


# -- threads, leaks, graph -------------------------------------------------------------
def test_eight_threads(device):
    errors = []

    def work(k):
        rng = np.random.default_rng(100 + k)
        for i in range(3):
            dtype = ALL_DTYPES[(k + i) % 11]
            a, b = random_bits(rng, (k + 1, 3), dtype), random_bits(rng, (k + 1, 2), dtype)
            assert same_bits(vkml.join([a, b], 1, device=device), np.concatenate([a, b], 1))

    run_in_threads(work, errors)
    assert not errors, errors


def test_functional_does_not_leak(device):
    a = np.ones((4, 8), np.float32)

    def calls():
        for _ in range(100):
            vkml.join([a, a], 1, device=device)
            vkml.split(a, 0, 2, device=device)
            vkml.slice(a, (1, 7), (2, 3), (1, -2), device=device)
    assert_no_leaks(device, calls, warm=1, rounds=1, key="used")


def test_graph_nodes(device):
    """A graph: split x along axis 1, join the pieces back in the other order, slice
    (reversed rows): JOIN, SPLIT and SLICE1 as nodes."""
    x = dml.TensorDesc("float32", (2, 5, 3))
    p0, p1 = dml.TensorDesc("float32", (2, 2, 3)), dml.TensorDesc("float32", (2, 3, 3))
    nodes = [dml.OperatorGraphNodeDesc(dml.SplitOperatorDesc(x, [p0, p1], 1)),
             dml.OperatorGraphNodeDesc(dml.JoinOperatorDesc([p1, p0], x, 1)),
             dml.OperatorGraphNodeDesc(dml.Slice1OperatorDesc(
                 x, x, (0, 0, 0), (2, 5, 3), (1, -1, 1)))]
    g = dml.GraphDesc(1, 1, nodes, [dml.InputGraphEdgeDesc(0, 0, 0)],
                      [dml.OutputGraphEdgeDesc(2, 0, 0)],
                      [dml.IntermediateGraphEdgeDesc(0, 0, 1, 1),
                       dml.IntermediateGraphEdgeDesc(0, 1, 1, 0),
                       dml.IntermediateGraphEdgeDesc(1, 0, 2, 0)])
    compiled = device.compile_graph(g)
    a = np.random.default_rng(8).standard_normal((2, 5, 3)).astype(np.float32)
    out = device.empty((2, 5, 3))
    compiled.execute([device.tensor(a)], [out])
    want = np.concatenate([a[:, 2:], a[:, :2]], 1)[:, ::-1]
    assert same_bits(out.numpy(), want)
    compiled.release()


def test_fields_of_every_kind(device):
    """Every field of the four descriptors and every functional argument, given values of
    every kind: a ValidationError (ArgumentTypeError for a wrong type) or a run, nothing
    else; the device stays usable."""
    t = dml.TensorDesc("float32", (2, 3))
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    vals = [None, True, -1, 10**12, 2**32, 2.5, "abc", [], [1], [1, 2, 3], [None, 1], [t],
            (t, t), t, {}, [2**31, 1], [-1, 1], [0, 0]]
    makers = [
        lambda v: dml.JoinOperatorDesc((t, t), dml.TensorDesc("float32", (4, 3)), v),
        lambda v: dml.JoinOperatorDesc(v, t, 0),
        lambda v: dml.JoinOperatorDesc((t,), v, 0),
        lambda v: dml.SplitOperatorDesc(t, v, 0),
        lambda v: dml.SplitOperatorDesc(t, (t,), v),
        lambda v: dml.SliceOperatorDesc(t, t, v, (2, 3), (1, 1)),
        lambda v: dml.SliceOperatorDesc(t, t, (0, 0), (2, 3), v),
        lambda v: dml.Slice1OperatorDesc(t, t, (0, 0), (2, 3), v),
        lambda v: dml.Slice1OperatorDesc(t, t, (0, 0), v, (1, 1)),
    ]
    calls = [lambda v: vkml.join([x, x], v, device=device),
             lambda v: vkml.join(v, 0, device=device),
             lambda v: vkml.split(x, v, 2, device=device),
             lambda v: vkml.split(x, 0, v, device=device),
             lambda v: vkml.slice(x, v, 1, device=device),
             lambda v: vkml.slice(x, 0, v, device=device),
             lambda v: vkml.slice(x, 0, 1, v, device=device)]
    for v in vals:
        for make in makers:
            try:
                device.compile_operator(device.create_operator(make(v))).release()
            except ValidationError as exc:
                assert not isinstance(exc, TypeError) or isinstance(exc, ArgumentTypeError)
        for call in calls:
            try:
                call(v)
            except (ValidationError, vkml.DeviceError) as exc:
                assert not isinstance(exc, TypeError) or isinstance(exc, ArgumentTypeError)
    assert same_bits(vkml.slice(x, 0, 1, device=device), x[:1, :1, :1])


# -- fuzzer (tests/fuzzing.py): valid and invalid descriptors, canaries ---------------------
#: The fuzzers of join, split and slice: a share of fuzz_examples (fuzzing.fuzzer) each.
FUZZ_SHARE = 2


def fuzz_shape(draw, rank: int) -> list[int]:
    """Small sizes, smaller for higher ranks (every case compiles and runs); at ranks 1
    and 2 now and then a long last dimension (rows past the vector widths, sub-word tails)."""
    hi = 4 if rank <= 3 else 3 if rank <= 5 else 2
    shape = draw(st.lists(st.integers(1, hi), min_size=rank, max_size=rank))
    if rank <= 2 and draw(st.booleans()):
        shape[-1] = draw(st.integers(6, 300))
    return shape


def on_path(device, desc, compiled, path):
    """``compiled`` (the device's choice) or, where ``path`` is given, ``desc`` compiled
    on that path instead (the copy engine takes contiguous rows, the kernel the rest)."""
    if path is None:
        return compiled
    compiled.release()
    cls = {dml.JoinOperatorDesc: OPS.CompiledJoin, dml.SplitOperatorDesc: OPS.CompiledSplit,
           dml.SliceOperatorDesc: OPS.CompiledSlice,
           dml.Slice1OperatorDesc: OPS.CompiledSlice}[type(desc)]
    return cls(device, device.create_operator(desc).desc, path=path)


def overlapping(strides, shape):
    """``strides`` (None: packed) with a dimension of more than one element made stride 0,
    so the tensor's elements overlap; None where every size is 1."""
    big = [d for d, n in enumerate(shape) if n > 1]
    if not big:
        return None
    out = list(strides or [int(np.prod(shape[i + 1:])) for i in range(len(shape))])
    out[big[-1]] = 0
    return tuple(out)


#: The broken rules join and split share -> the fields a ValidationError may name.
PARTS_BROKEN = {"axis": ["axis"], "other_size": [".sizes["], "data_type": ["data_type"],
                "rank": ["sizes"], "missing": ["]: is required"], **TENSOR_BROKEN}
#: join's broken rules -> the fields a ValidationError may name.
JOIN_BROKEN = {**PARTS_BROKEN, "empty": ["input_tensors"], "sum": [".sizes["],
               "overlap": ["output_tensor.strides"]}


def draw_parts_case(draw, broken: dict, inputs: int) -> dict:
    """A join or split case (``draw`` of a composite strategy): rank 1-8, 1-4 parts of
    1-3 along ``axis`` (``padded``: per part, whether split stores it with gaps), a data
    type, the path, a rule of ``broken`` or none, and the placement of ``inputs``."""
    rank = draw(st.integers(1, 8))
    count = draw(st.integers(1, 4))
    return dict(shape=fuzz_shape(draw, rank), axis=draw(st.integers(0, rank - 1)),
                parts=draw(st.lists(st.integers(1, 3), min_size=count, max_size=count)),
                padded=draw(st.lists(st.booleans(), min_size=count, max_size=count)),
                dtype=draw(st.sampled_from(ALL_DTYPES)),
                path=draw(st.sampled_from([None, "kernel", "copy"])),
                broken=draw(st.sampled_from(["none"] * 10 + list(broken))),
                **placement(draw, inputs))


@st.composite
def join_cases(draw):
    return draw_parts_case(draw, JOIN_BROKEN, 4)


def break_shared_rule(case, table, shapes, strides, whole, whole_st):
    """Break the case's rule if it is one JOIN and SPLIT share, on the last part
    (``shapes`` and ``strides``: the parts, join's inputs or split's outputs; ``whole``
    and ``whole_st``: the other tensor's sizes and strides; ``table``: the operator's
    broken rules).  Returns new lists (shapes, strides, types) of the parts, the axis,
    whole, whole_st and the fields a refusal may name (empty: the case is valid)."""
    broken, axis, rank, i = case["broken"], case["axis"], len(whole), len(shapes) - 1
    shapes, strides = [list(s) for s in shapes], list(strides)
    types = [case["dtype"]] * len(shapes)
    if broken == "axis":
        axis = rank if case["seed"] % 2 else -1
    elif broken == "other_size" and rank > 1:
        shapes[i][(axis + 1) % rank] += 1
        strides[i] = None
    elif broken == "sum":
        whole = list(whole)
        whole[axis] += 1
        whole_st = None
    elif broken == "data_type":
        types[i] = "int32" if case["dtype"] == "float32" else "float32"
    elif broken == "rank":
        shapes[i], strides[i] = (shapes[i] + [1], None) if rank < 8 else (shapes[i][1:], None)
    want = [] if broken == "other_size" and rank == 1 else table.get(broken, [])
    return shapes, strides, types, axis, whole, whole_st, want


def _join_descriptor(case, shapes, yshape, strides, out_st):
    """The case's descriptor maker with its one broken rule, and the fields a refusal may
    name (empty: the case is valid)."""
    broken, dtype, i = case["broken"], case["dtype"], len(shapes) - 1   # (i: the input broken)
    shapes, strides, types, axis, yshape, out_st, want = break_shared_rule(
        case, JOIN_BROKEN, shapes, strides, yshape, out_st)
    total = None
    if broken == "overlap":
        out_st = overlapping(out_st, yshape)
        want = want if out_st is not None else []
    elif broken in TENSOR_BROKEN:
        shapes[i], strides[i], total = break_tensor_rule(broken, shapes[i], strides[i])

    def make():
        ins = [dml.TensorDesc(t, s, st, total if k == i else None)
               for k, (t, s, st) in enumerate(zip(types, shapes, strides))]
        if broken == "missing":
            ins[i] = None
        return dml.JoinOperatorDesc([] if broken == "empty" else ins,
                                    dml.TensorDesc(dtype, yshape, out_st), axis)
    return make, want


def test_fuzz_join(device, speed):
    """Random JOIN descriptors (the contract of ``fuzzing.fuzzer``): ranks 1-8, 1-4 inputs
    of all 11 data types (random bits, compared bit for bit with numpy.concatenate) in
    padded, permuted and broadcast layouts, either path, one broken rule at a time."""
    @fuzzer(speed, join_cases(), share=FUZZ_SHARE, refused=0.1)
    def fuzz_case(case):
        rng = np.random.default_rng(case["seed"])
        dtype, axis, shape = case["dtype"], case["axis"], list(case["shape"])
        shapes = [shape[:axis] + [p] + shape[axis + 1:] for p in case["parts"]]
        laid = [lay_out(rng, random_bits(rng, s, dtype), kind)
                for s, kind in zip(shapes, case["layouts"])]
        yshape = shape[:axis] + [sum(case["parts"])] + shape[axis + 1:]
        out_st, read = padded_output(rng, yshape, dtype, case["out_padded"])
        make, want = _join_descriptor(case, shapes, yshape, [l[1] for l in laid], out_st)
        desc, compiled = compiled_or_refused(device, make, want)
        if desc is None:
            return
        compiled = on_path(device, desc, compiled, case["path"])
        got = run_checked(device, compiled, desc, [l[0] for l in laid], read)
        assert same_bits(got, np.concatenate([l[2] for l in laid], axis))

    fuzz_case()

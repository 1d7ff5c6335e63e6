"""Test helpers: random data per data type, strided layouts, running one descriptor or a
two-node graph, the pooling validation cases, and the leak and thread checks the operator
tests share.  The references are in tests/references.py, the fuzzers' helpers in
tests/fuzzing.py."""
from __future__ import annotations

import gc
import math
import threading

import numpy as np

from vkml import dml

from references import window_counts

#: ``speed`` (conftest.py) above which a device counts as slow (SwiftShader: about 0.13 s
#: or more, lavapipe 0.03 s or less, loaded or not): tests size their work by the class,
#: not by the figure, so that their cost does not jump with the machine's load.
SLOW_DEVICE_S = 0.09


def slow(speed: float) -> bool:
    return speed > SLOW_DEVICE_S


ALL_DTYPES = ["float32", "float16", "float64", "int8", "int16", "int32", "int64",
              "uint8", "uint16", "uint32", "uint64"]


# -- pooling descriptors' validation ------------------------------------------------------
#: The window geometry the pooling validation tests start from (max/average and LP pooling):
#: (1, 2, 8, 8) -> (1, 2, 4, 4), a 3x3 window, stride 2, start padding 1.
POOLING_DESC_ARGS = dict(input_tensor=dml.TensorDesc("float32", (1, 2, 8, 8)),
                         output_tensor=dml.TensorDesc("float32", (1, 2, 4, 4)),
                         strides=(2, 2), window_size=(3, 3), start_padding=(1, 1),
                         end_padding=(0, 0), dilations=(1, 1))

#: (changes to POOLING_DESC_ARGS, the field the ValidationError must name) that every pooling
#: descriptor refuses alike: the window rules of the pooling pages.
POOLING_WINDOW_CASES = [
    (dict(output_tensor=dml.TensorDesc("float32", (1, 2, 4, 5))), "output_tensor.sizes[3]"),
    (dict(output_tensor=dml.TensorDesc("float32", (1, 2, 3, 4))), "output_tensor.sizes[2]"),
    (dict(output_tensor=dml.TensorDesc("float32", (1, 3, 4, 4))), "output_tensor.sizes[1]"),
    (dict(output_tensor=dml.TensorDesc("float32", (2, 2, 4, 4))), "output_tensor.sizes[0]"),
    (dict(output_tensor=dml.TensorDesc("float32", (1, 2, 4, 4, 1))), "output_tensor.sizes"),
    (dict(input_tensor=dml.TensorDesc("float32", (2, 8, 8)),
          output_tensor=dml.TensorDesc("float32", (2, 4, 4))), "input_tensor.sizes"),
    (dict(input_tensor=dml.TensorDesc("float32", (1, 1, 1, 2, 8, 8)),
          output_tensor=dml.TensorDesc("float32", (1, 1, 1, 2, 4, 4))), "input_tensor.sizes"),
    (dict(output_tensor=dml.TensorDesc("float16", (1, 2, 4, 4))), "output_tensor.data_type"),
    (dict(window_size=(3, 10)), "window_size[1]"),
    (dict(window_size=(3, 0)), "window_size[1]"),
    (dict(window_size=(3,)), "window_size"),
    (dict(window_size=3), "window_size"),
    (dict(strides=(0, 2)), "strides[0]"),
    (dict(strides=(2, 2, 2)), "strides"),
    (dict(start_padding=(1,)), "start_padding"),
    (dict(end_padding=(0, -1)), "end_padding[1]"),
    (dict(dilations=(1, 0)), "dilations[1]"),
    (dict(dilations=(1, 1, 1)), "dilations"),
    (dict(dilations=(1, 5)), "window_size[1]"),
    (dict(output_tensor=dml.TensorDesc("float32", (1, 2, 4, 4), (32, 16, 0, 1))),
     "output_tensor.strides"),
    (dict(input_tensor=None), "input_tensor"),
]


def split_grid_windows(device):
    """(a device whose maxComputeWorkGroupCount is (1, 3, 2), a float32 input, its window)
    for a 2-D and a 3-D pooling, with start padding 1 in the tests: grids that must split
    into several dispatches."""
    import vkml

    with vkml.Device(device.index, limits={"maxComputeWorkGroupCount": (1, 3, 2)}) as dev:
        rng = np.random.default_rng(17)
        for shape, window in (((2, 3, 7, 600), (2, 3)), ((1, 3, 4, 5, 3), (2, 2, 2))):
            yield dev, rng.standard_normal(shape).astype(np.float32), window


def random_bits(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Random raw bits viewed as ``dtype``: data-movement operators must move every bit
    pattern (NaN payloads, negative zero, subnormals) unchanged."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) * dt.itemsize
    return rng.integers(0, 256, n, dtype=np.uint8).view(dt).reshape(shape)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    u = np.dtype(f"u{a.dtype.itemsize}")
    return np.array_equal(a.view(u), b.view(u))


def strided_view(rng, base_shape, dtype, kind: str):
    """An array with a non-packed layout and the DML element strides describing it.

    kind: "padded" (row strides larger than packed), "broadcast" (a stride of 0),
    "permuted" (another dimension order in memory).  Returns (buffer, strides, logical).
    """
    dt = np.dtype(dtype)
    rank = len(base_shape)
    if kind == "padded":
        phys = [s + int(rng.integers(0, 3)) for s in base_shape]
        buf = random_bits(rng, phys, dt)
        logical = buf[tuple(slice(0, s) for s in base_shape)]
    elif kind == "broadcast":
        d = int(rng.integers(0, rank))
        small = list(base_shape)
        small[d] = 1
        buf = random_bits(rng, small, dt)
        logical = np.broadcast_to(buf, base_shape)
    else:
        perm = rng.permutation(rank)
        buf = np.ascontiguousarray(random_bits(rng, base_shape, dt).transpose(perm))
        logical = buf.transpose(np.argsort(perm))
    strides = tuple(st // dt.itemsize for st in logical.strides)
    flat = np.ascontiguousarray(buf).reshape(-1)
    return flat, strides, np.array(logical)


def run_desc(device, desc, *inputs, compiled=None):
    """create -> compile -> execute ``desc`` on NumPy ``inputs`` (None: an absent optional
    tensor), the output buffer sized by its descriptor's TotalTensorSizeInBytes; returns
    that buffer's elements (a strided output is read through ``as_strided``).
    ``compiled``: an operator already compiled from ``desc`` (e.g. on a forced path);
    it is released either way."""
    if compiled is None:
        compiled = device.compile_operator(device.create_operator(desc))
    ins = [device.tensor(x) if x is not None else None for x in inputs]
    out_desc = desc.outputs()[0]
    out = device.empty(out_desc.total_tensor_size_in_bytes // out_desc.data_type.size,
                       out_desc.dtype)
    try:
        compiled.execute(ins, [out])
        return out.numpy()
    finally:
        compiled.release()


def run_into_nan(device, op, arrays, out_elems: int, out_dtype) -> np.ndarray:
    """Execute the compiled operator ``op`` (then release it) on flat copies of ``arrays``
    (``None``: an absent optional input) into an output that starts as NaN, so an element
    the kernel never wrote shows; returns the output, flat."""
    try:
        ins = [None if a is None else device.tensor(np.ascontiguousarray(a).reshape(-1))
               for a in arrays]
        out = device.empty(out_elems, out_dtype)
        out.write(np.full(out_elems, np.nan, out_dtype))
        op.execute(ins, [out])
        return out.numpy()
    finally:
        op.release()


def compile_on_path(device, desc, path: str):
    """``desc`` (a ConvolutionOperatorDesc) compiled on the kernel path or tuning
    candidate named ``path`` (``CompiledConvolution(device, desc, path=...)``, the
    documented way to force one), so a test reaches a path the heuristic or the tuner
    would not choose; UnsupportedError where it does not take the geometry."""
    import importlib

    conv_ops = importlib.import_module("vkml.ops.convolution")   # the module, not the function
    op = device.create_operator(desc)          # validation as compile_operator's
    return conv_ops.CompiledConvolution(device, op.desc, path=path)


def random_window_case(rng, dims, max_elems, symmetric=False):
    """A Fold / Unfold geometry whose columns and image together hold at most
    ``max_elems`` elements: ``(n, c, spatial, window, strides, dilations, start, end)``."""
    while True:
        window = [int(rng.integers(1, 4)) for _ in range(dims)]
        strides = [int(rng.integers(1, 4)) for _ in range(dims)]
        dil = [int(rng.integers(1, 3)) for _ in range(dims)]
        start = [int(rng.integers(0, 3)) for _ in range(dims)]
        end = list(start) if symmetric else [int(rng.integers(0, 3)) for _ in range(dims)]
        lo = [max(1, d * (w - 1) + 1 - a - b) for w, d, a, b in zip(window, dil, start, end)]
        spatial = [int(rng.integers(l, l + (6 if dims <= 3 else 3))) for l in lo]
        n, c = int(rng.integers(1, 3)), int(rng.integers(1, 4))
        blocks = window_counts(spatial, window, strides, dil, start, end)
        size = n * c * math.prod(window) * math.prod(blocks) + n * c * math.prod(spatial)
        if size <= max_elems:
            return n, c, spatial, window, strides, dil, start, end


def random_pooling_case(rng, dims, max_elems, window_below, spread):
    """A pooling geometry ``(shape, window, strides, start, end, dilations)`` whose input
    times window holds at most ``max_elems`` elements: windows of 1 to ``window_below - 1``,
    spatial sizes from ``lo``, the least the padded, dilated window fits in, to below
    ``lo + spread[0]`` (2-D; ``spread[1]`` otherwise)."""
    while True:
        window = [int(rng.integers(1, window_below)) for _ in range(dims)]
        strides = [int(rng.integers(1, 4)) for _ in range(dims)]
        dil = [int(rng.integers(1, 3)) for _ in range(dims)]
        start = [int(rng.integers(0, 3)) for _ in range(dims)]
        end = [int(rng.integers(0, 3)) for _ in range(dims)]
        lo = [max(1, d * (w - 1) + 1 - a - b) for w, d, a, b in zip(window, dil, start, end)]
        spatial = [int(rng.integers(l, l + spread[dims != 2])) for l in lo]
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 4)), *spatial)
        if math.prod(shape) * math.prod(window) <= max_elems:
            return shape, window, strides, start, end, dil


def operator_cycle(device, desc, ins, outs):
    """The cycle assert_no_leaks repeats for one operator: create -> compile -> execute
    (``ins`` into ``outs``) -> release."""
    def cycle():
        op = device.compile_operator(device.create_operator(desc))
        op.execute(ins, outs)
        op.release()

    return cycle


def assert_no_leaks(device, cycle, *, warm: int, rounds: int, collect: bool = True,
                    key: str | None = None) -> None:
    """Run ``cycle()`` ``warm`` times, note the device's memory stats (only ``key`` of them
    when given), run it ``rounds`` more times and assert the stats came back: a cycle that
    creates and releases objects must leave the device's memory as it found it.  With
    ``collect``, ``gc.collect()`` after each batch so that dropped Python handles count."""
    def stats():
        got = device.memory_stats()
        return got if key is None else got[key]

    def run(n: int) -> None:
        for _ in range(n):
            cycle()
        if collect:
            gc.collect()

    run(warm)
    base = stats()
    run(rounds)
    assert stats() == base


def threads_share_one_operator(device, shared, ins, want, out_shape, functional, *,
                               rtol: float, atol: float) -> None:
    """Eight threads, five rounds each: ``functional(k, i)`` (a functional call checked
    against its reference; False is an error) and the ``shared`` compiled operator run on
    ``ins`` into the thread's own output, which must match ``want``.  Releases ``shared``,
    then asserts that no thread saw an error."""
    errors: list = []

    def work(k):
        out = device.empty(out_shape)
        for i in range(5):
            if not functional(k, i):
                errors.append((k, i))
            shared.execute(ins, [out])
            if not np.allclose(out.numpy(), want, rtol=rtol, atol=atol):
                errors.append((k, i, "shared"))

    run_in_threads(work, errors)
    shared.release()
    assert not errors, errors[:5]


def run_in_threads(work, errors: list, count: int = 8) -> None:
    """Run ``work(k)`` for k in range(count) concurrently; an exception is an error."""
    def guarded(k):
        try:
            work(k)
        except Exception as exc:  # noqa: BLE001
            errors.append((k, repr(exc)))

    threads = [threading.Thread(target=guarded, args=(k,), daemon=True) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    # a thread still running is a hang (and its work was never checked)
    assert not [t for t in threads if t.is_alive()], "threads did not finish within 600 s"


def run_graph(device, g, arrays, dtype, **kw):
    """Compile graph ``g`` (``compile_graph`` keywords ``kw``) and execute it once on
    ``arrays`` into fresh ``dtype`` outputs: (the compiled graph, the outputs as arrays)."""
    cg = device.compile_graph(g, **kw)
    outs = [device.empty(g.nodes[o.from_node_index].desc.outputs()[0].sizes, dtype)
            for o in g.output_edges]
    cg.execute([device.tensor(a) for a in arrays], outs)
    return cg, [o.numpy() for o in outs]


def run_two_node_graph(device, first, second, inputs, out_shape) -> np.ndarray:
    """Compile and run the graph ``first -> second``: ``first`` takes every array of
    ``inputs`` in order, its output 0 is ``second``'s input 0, and ``second``'s output 0 (a
    float32 tensor of ``out_shape``) is the graph's, returned as a NumPy array."""
    n = len(inputs)
    g = dml.GraphDesc(n, 1, [dml.OperatorGraphNodeDesc(first), dml.OperatorGraphNodeDesc(second)],
                      [dml.InputGraphEdgeDesc(i, 0, i) for i in range(n)],
                      [dml.OutputGraphEdgeDesc(1, 0, 0)],
                      [dml.IntermediateGraphEdgeDesc(0, 0, 1, 0)])
    compiled = device.compile_graph(g)
    out = device.empty(out_shape, np.float32)
    compiled.execute([device.tensor(a) for a in inputs], [out])
    compiled.release()
    return out.numpy()


def conv_add_relu_graph(conv, y) -> "dml.GraphDesc":
    """The graph ``relu(conv(input, filter, bias) + residual)`` (inputs in that order, the
    residual of desc ``y``, the convolution's output): the residual fusion's shape."""
    N = dml.OperatorGraphNodeDesc
    nodes = [N(conv, name="conv"), N(dml.ElementWiseAddOperatorDesc(y, y, y), name="add"),
             N(dml.ActivationReluOperatorDesc(y, y), name="relu")]
    return dml.GraphDesc(4, 1, nodes, [dml.InputGraphEdgeDesc(i, 0, i) for i in range(3)]
                         + [dml.InputGraphEdgeDesc(3, 1, 1)], [dml.OutputGraphEdgeDesc(2, 0, 0)],
                         [dml.IntermediateGraphEdgeDesc(0, 0, 1, 0),
                          dml.IntermediateGraphEdgeDesc(1, 0, 2, 0)])


class Cases:
    """What the examples of a hypothesis test did, so that the test states and checks how
    many real cases it ran: ``assume()``, early returns and refusals can otherwise leave a
    property test checking (almost) nothing.  In the body, ``cases.add(kind)`` once per
    example (e.g. "ran", "refused"); after ``check()``, ``cases.require(ran=10)`` fails
    with every count unless each named kind (a "__"-joined name sums several: ``ran__big=3``)
    was seen that often.  Only examples that reached ``add`` count (hypothesis replays a
    failing one while shrinking, but then the test fails anyway)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def short(self, **floors: int) -> bool:
        """Whether some kind of ``floors`` (as :meth:`require` names them) was seen fewer
        times than its floor."""
        return any(sum(self.counts.get(k, 0) for k in kinds.split("__")) < floor
                   for kinds, floor in floors.items())

    def require(self, **floors: int) -> None:
        for kinds, floor in floors.items():
            got = sum(self.counts.get(k, 0) for k in kinds.split("__"))
            assert got >= floor, (f"only {got} example(s) of kind {kinds.replace('__', '+')!r}"
                                  f" (want >= {floor}); all: {self.counts}")

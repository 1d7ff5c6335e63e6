"""Host time of a prepared model's run: wall time of ``rep.run([x])`` against its device time.

    python -m bench.host                              # convrelu (built in) and resnet18 at 32
    python -m bench.host -k resnet18 --size 224 -k mobilenet_v2 --size 224
    python -m bench.host -k convrelu --cprofile 200   # where the host time goes, by function
    python -m bench.host --calls                      # also functional and CompiledGraph calls

Per model: the median wall milliseconds of ``--runs`` replayed runs (NumPy in, NumPy out),
after ``--warmup`` seconds of runs; "replay": the model's compiled graph replayed alone
(one submission and its wait, no transfers, no Python of the ONNX layer); the device
milliseconds of one run (``rep.profile``: the device partitions timed by timestamp
queries, without the marks between nodes, measured right after the timed runs) and
"host": wall minus device, the host's share of a run (staging the input, submitting,
waiting, reading the output back and the Python around them); "over replay": wall minus
replay, measured interleaved with it (what the ONNX layer and the transfers add to a
bare replay: the steadier figure on a loaded CPU driver, whose timestamps move with the
load).  ``convrelu`` is a small model built here (four 3x3 Conv+Relu layers
on 1x8x16x16) whose device time is small on any device; other names are
``bench/cnn/models.py``'s, exported as ``python -m bench models`` does (cached in
``bench/.models``).  ``--calls`` adds a tiny ``vkml.add`` (NumPy in/out, Tensor in/out)
and a ``CompiledGraph.execute`` of Tensors, wall against device time the same way.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import pstats
import statistics
import sys
import time

import numpy as np

import vkml


def convrelu_model():
    """Four 3x3 Conv+Relu layers, 8 channels, on a 1x8x16x16 input (opset 13)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(4):
        w = numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2,
                                    f"w{i}")
        b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, f"b{i}")
        inits += [w, b]
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"],
                                      pads=[1, 1, 1, 1]))
        x = f"r{i}" if i < 3 else "y"
        nodes.append(helper.make_node("Relu", [f"c{i}"], [x]))
    g = helper.make_graph(nodes, "convrelu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
                          inits)
    return onnx.helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), (1, 8, 16, 16)


def load(name: str, size: int):
    """(ONNX model, input shape) of ``name`` at ``size``."""
    if name == "convrelu":
        return convrelu_model()
    import onnx

    from .cnn.models import by_name, export_apart

    data = export_apart(by_name(name), size)[0]
    return onnx.load_from_string(data), (1, 3, size, size)


def _median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _warm(fn, seconds: float) -> None:
    """Run ``fn`` for ``seconds`` (at least 5 times): a GPU's clocks rise under load."""
    until = time.perf_counter() + seconds
    for i in itertools.count():
        fn()
        if i >= 4 and time.perf_counter() >= until:
            break


def _replay(rep, x):
    """A one-partition model's compiled graph replayed alone (``CompiledGraph.execute``
    on its bound tensors: one submission and its wait, no transfers), else None."""
    parts = rep._parts
    ex = getattr(parts[0], "last", None) if len(parts) == 1 else None
    if ex is None or ex.compiled is None:
        return None
    env = dict(rep.consts)
    env.update(rep._feeds([x]))
    ins = ex._bound_inputs(env)
    return lambda: ex.compiled.execute(ins, ex.out_tensors)


def _interleaved_ms(fns, runs: int) -> list:
    """The median wall ms of each of ``fns`` (None: NaN), called in turn ``runs`` times:
    a load that comes and goes touches them alike."""
    times = [[] for _ in fns]
    for _ in range(runs):
        for fn, ts in zip(fns, times):
            if fn is not None:
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
    return [statistics.median(ts) * 1e3 if ts else float("nan") for ts in times]


def measure_model(dev, name: str, size: int, runs: int, cprofile: int,
                  warmup: float) -> dict:
    from vkml.onnx import backend

    model, shape = load(name, size)
    rep = backend.prepare(model, device=dev)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    _warm(lambda: rep.run([x]), warmup)
    wall, replay = _interleaved_ms([lambda: rep.run([x]), _replay(rep, x)], runs)
    device_ms = rep.profile([x], repeat=max(5, min(runs, 20))).run_ms
    row = {"what": f"{name} {size}" if name != "convrelu" else "convrelu 16",
           "wall_ms": wall, "replay_ms": replay, "device_ms": device_ms,
           "host_ms": wall - device_ms}
    if cprofile:
        row["cprofile"] = _cprofile(lambda: rep.run([x]), cprofile)
    rep.release()
    return row


def _timed_graph(dev):
    """A CompiledGraph of two element-wise nodes on 1x8x16x16 and its I/O Tensors."""
    from vkml import dml

    td = dml.TensorDesc(dml.DataType.FLOAT32, (1, 8, 16, 16))
    relu = dml.ActivationReluOperatorDesc(td, td)
    ident = dml.ElementWiseIdentityOperatorDesc(td, td)
    graph = dml.GraphDesc(input_count=1, output_count=1, nodes=[
        dml.OperatorGraphNodeDesc(relu), dml.OperatorGraphNodeDesc(ident)],
        input_edges=[dml.InputGraphEdgeDesc(0, 0, 0)],
        output_edges=[dml.OutputGraphEdgeDesc(1, 0, 0)],
        intermediate_edges=[dml.IntermediateGraphEdgeDesc(0, 0, 1, 0)])
    compiled = dev.compile_graph(graph)
    x = dev.tensor(np.random.default_rng(2).standard_normal((1, 8, 16, 16)).astype(np.float32))
    y = dev.empty((1, 8, 16, 16), np.float32)
    return compiled, x, y


def measure_calls(dev, runs: int, cprofile: int, warmup: float) -> list:
    """Tiny functional calls and a CompiledGraph execute: wall against device time."""
    x = np.random.default_rng(3).standard_normal((1, 8, 16, 16)).astype(np.float32)
    xt = dev.tensor(x)
    rows = []
    compiled, gx, gy = _timed_graph(dev)
    cases = [("vkml.add numpy", lambda: vkml.add(x, x, device=dev)),
             ("vkml.add tensor", lambda: vkml.add(xt, xt)),
             ("CompiledGraph.execute", lambda: compiled.execute([gx], [gy]))]
    graph_ms = compiled.profile([gx], [gy], repeat=20).run_ms
    for what, fn in cases:
        _warm(fn, warmup)
        wall = _median_ms(fn, runs)
        row = {"what": what, "wall_ms": wall, "replay_ms": float("nan"),
               "device_ms": graph_ms if what.startswith("Compiled") else float("nan")}
        row["host_ms"] = wall - row["device_ms"] if row["device_ms"] == row["device_ms"] \
            else float("nan")
        if cprofile:
            row["cprofile"] = _cprofile(fn, cprofile)
        rows.append(row)
    compiled.release()
    return rows


def _cprofile(fn, runs: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(runs):
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    return out.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.host", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", "--model", action="append", default=[],
                    help="convrelu or a bench/cnn/models.py name (repeatable; default "
                         "convrelu and resnet18)")
    ap.add_argument("--size", action="append", type=int, default=[],
                    help="input height and width, one per -k in order (default 32)")
    ap.add_argument("--runs", type=int, default=200, help="timed runs per row")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="also cProfile N runs per row (top functions by own time)")
    ap.add_argument("--calls", action="store_true",
                    help="also tiny functional calls and a CompiledGraph execute")
    ap.add_argument("--warmup", type=float, default=1.0, metavar="S",
                    help="seconds of untimed runs before each row (a GPU's clocks rise)")
    ap.add_argument("--device", default=None, help="index or name substring")
    args = ap.parse_args(argv)
    names = args.model or ["convrelu", "resnet18"]
    sizes = args.size + [32] * (len(names) - len(args.size))
    rows = []
    with vkml.Device(args.device) as dev:
        print(f"{dev.name}  (Python {sys.version.split()[0]})")
        for name, size in zip(names, sizes):
            rows.append(measure_model(dev, name, size, args.runs, args.cprofile, args.warmup))
        if args.calls:
            rows += measure_calls(dev, args.runs, args.cprofile, args.warmup)
    print(f"{'':24s} {'wall ms':>9s} {'replay ms':>10s} {'device ms':>10s} {'host ms':>9s} "
          f"{'over replay':>12s}")
    for r in rows:
        print(f"{r['what']:24s} {r['wall_ms']:9.3f} {r['replay_ms']:10.3f} "
              f"{r['device_ms']:10.3f} {r['host_ms']:9.3f} "
              f"{r['wall_ms'] - r['replay_ms']:12.3f}")
    for r in rows:
        if "cprofile" in r:
            print(f"\n== {r['what']}: cProfile of {args.cprofile} runs\n{r['cprofile']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Running a checked DxDispatch model on a vkml device: the executor (resources uploaded,
operators compiled and initialized, commands run in order) and DxDispatch's timing."""
from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path

import numpy as np

import vkml
from vkml import dml
from vkml.intmath import round_up

from .descs import (Dispatchable, bind_points, check_operator_types, one_node_graph,
                    parse_dispatchables)
from .resources import (IMAGE_SUFFIXES, Resource, check_sizes, check_write, parse_resources,
                        write_image)
from .schema import DXGI_FORMAT_BYTES, ModelError, check_structure, device_limits, join, loads


def check_model(model, limits: dict, base: Path = Path(".")) -> None:
    """The whole file, before anything is read from it or allocated: its operator types,
    the schema (types, required keys, ranges; sizes against ``limits``), then the sizes of
    the resources together."""
    check_operator_types(model)
    check_structure(model, limits)
    check_sizes(model, limits, base)


def _point_name(points: dict, kind: str, idx: int) -> str | None:
    """The bind point of input or output ``idx`` (``InputTensors[1]`` in an array)."""
    for p, (k, i) in points.items():
        if k == kind and i == idx:
            return p
        if k == kind and isinstance(i, tuple) and idx in i:
            return f"{p}[{i.index(idx)}]"
    return None


@dataclasses.dataclass
class Bound:
    """One resource bound to a bind point: ``offset`` bytes into it (a binding object's
    ``elementOffset`` times its element size), the tensor taking ``nbytes`` from there."""
    resource: Resource
    offset: int = 0
    nbytes: int = 0


@dataclasses.dataclass
class Timing:
    iterations: int = 1
    repeat: int = 1
    warmup: int = 1
    milliseconds: float | None = None
    verbosity: int = 0


def _stats_line(label: str, samples: list[float]) -> str:
    if not samples:
        return f"{label}: 0 samples"
    return (f"{label}: {len(samples)} samples, {statistics.fmean(samples):.4f} ms average, "
            f"{min(samples):.4f} ms min, {statistics.median(samples):.4f} ms median, "
            f"{max(samples):.4f} ms max")


def _owned(tdesc) -> bool:
    return tdesc is not None and bool(tdesc.flags & dml.TensorFlags.OWNED_BY_DML)


class Executor:
    """Runs a model that :func:`check_model` accepted; every reference (dispatchable,
    resource, bind point) and binding size is checked in ``__init__``, before anything is
    allocated on the device."""

    def __init__(self, model: dict, base: Path, device, timing: Timing, out=print,
                 limits: dict | None = None):
        self.device = device
        self.timing = timing
        self.out = out
        limits = limits or device_limits(device)
        self.resources = parse_resources(model, base)
        self.dispatchables = parse_dispatchables(model, limits)
        self.commands = model["commands"]
        for name, d in self.dispatchables.items():
            spec = model["dispatchables"][name]
            self._init_bindings(d, spec.get("bindings") or {},
                                join(join("dispatchables", name), "bindings"))
        self.bound = {}
        for i, cmd in enumerate(self.commands):
            where = f"commands[{i}]"
            if cmd["type"] == "dispatch":
                name = cmd["dispatchable"]
                if name not in self.dispatchables:
                    raise ModelError(join(where, "dispatchable"), f"no dispatchable named "
                                     f"{name!r}")
                self.bound[i] = self._bindings(self.dispatchables[name], cmd.get("bindings"),
                                               join(where, "bindings"))
            else:
                self._resource(cmd["resource"], join(where, "resource"))
                if cmd["type"] == "writeFile":
                    check_write(cmd, self.resources[cmd["resource"]], where)
        self.records: list[dict] = []

    def setup(self) -> None:
        """Allocate and upload the resources, then initialize the dispatchables (compile;
        copy the resources bound to OWNED_BY_DML inputs into memory the dispatchable
        owns, as DirectML's operator initializer does: later writes to those resources
        do not reach the operator)."""
        dev = self.device
        for r in self.resources.values():
            raw = np.zeros(r.nbytes, np.uint8)
            raw[:r.values.nbytes] = r.values.view(np.uint8)
            r.tensor = dev.tensor(raw)
        from vkml.ops.base import REGISTRY

        for d in self.dispatchables.values():
            where = join("dispatchables", d.name)
            if type(d.desc) not in REGISTRY:
                raise ModelError(where, f"vkml does not implement {d.desc.OPERATOR_TYPE} yet "
                                 "(its descriptor exists)")
            t = time.perf_counter()
            try:
                d.compiled = (one_node_graph(dev, d) if d.compile_type == "DmlCompileGraph"
                              else dev.compile_operator(dev.create_operator(d.desc)))
            except (vkml.ValidationError, vkml.UnsupportedError) as exc:
                raise ModelError(where, f"{d.desc.OPERATOR_TYPE}: {exc}") from None
            for point, b in d.init.items():
                d.owned[point] = dev.tensor(self._read_range(b.resource, b.offset, b.nbytes))
            if d.owned and (getattr(d.compiled, "owned_inputs", None)
                            or getattr(d.compiled, "constant_inputs", None)):
                # the operator's (or graph's) own initializer (IDMLOperatorInitializer): it
                # keeps (or transforms) the owned inputs (a graph's constant inputs, indexed
                # as the operator's inputs), and executions bind nothing in their place
                points = bind_points(d.desc)
                d.compiled.initialize({points[p][1]: t for p, t in d.owned.items()})
                d.initialized = True
            d.init_ms = (time.perf_counter() - t) * 1e3
            if self.timing.verbosity >= 1:
                self.out(f"Initialize '{d.name}': {d.init_ms:.4f} ms")

    def run(self) -> list[dict]:
        self.setup()
        for i, cmd in enumerate(self.commands):
            kind = cmd["type"]
            if kind == "dispatch":
                self.dispatch(cmd, i)
            elif kind == "print":
                self.print_(cmd, i)
            else:
                self.write_file(cmd, i)
        return self.records

    def release(self) -> None:
        for d in self.dispatchables.values():
            if d.compiled is not None:
                d.compiled.release()
            for t in d.owned.values():
                t.free()
        for r in self.resources.values():
            if r.tensor is not None:
                r.tensor.free()

    def _resource(self, name, where) -> Resource:
        if name not in self.resources:
            raise ModelError(where, f"no resource named {name!r}")
        return self.resources[name]

    def _source(self, target, where: str, need: int, point: str) -> Bound:
        """A binding (a name or a binding object) checked against the bytes the tensor
        needs (``TotalTensorSizeInBytes``)."""
        if isinstance(target, str):
            r = self._resource(target, where)
            offset, size, what = 0, r.nbytes, f"resource '{r.name}'"
        else:
            for key in ("counter", "counterOffsetBytes", "shape"):
                if key in target:
                    raise ModelError(join(where, key), f"{key!r} is for HLSL/ONNX "
                                     "dispatchables, not DirectML operators")
            r = self._resource(target["name"], join(where, "name"))
            if "format" in target:
                elem = DXGI_FORMAT_BYTES[target["format"].removeprefix("DXGI_FORMAT_")]
            else:
                elem = target.get("elementSizeInBytes") or r.dtype.itemsize
            offset = target.get("elementOffset", 0) * elem
            size = r.nbytes - offset
            what = f"the sub-range of resource '{r.name}' at byte {offset}"
            if "elementCount" in target:
                size = min(size, target["elementCount"] * elem)
                what += f" ({target['elementCount']} elements)"
            if offset > r.nbytes or size < 0:
                raise ModelError(join(where, "elementOffset"), f"byte offset {offset} is past "
                                 f"the end of resource '{r.name}' ({r.nbytes} bytes)")
            if offset % 4:
                raise ModelError(join(where, "elementOffset"), f"byte offset {offset} is not "
                                 "a multiple of 4 (DirectML binds buffers at 4-byte "
                                 "alignment)")
        if size < need:
            raise ModelError(where, f"{point} -> {what} holds {size} bytes; the tensor needs "
                         f"TotalTensorSizeInBytes = {need}" + ("" if isinstance(target, str)
                         else " (binding sub-ranges: elementOffset, elementCount)"))
        return Bound(r, offset, round_up(need, 4))

    def _point(self, d: Dispatchable, point: str, target, at: str, points: dict):
        """The (kind, index, tensor desc, Bound) of each tensor ``target`` binds at
        ``point``: one, or one per entry of an array bind point (``InputTensors``), whose
        list must have an entry for every tensor of the array, as DirectML binds them."""
        if point not in points:
            raise ModelError(at, f"{d.desc.OPERATOR_TYPE} has no bind point {point!r} "
                             f"(bind points: {', '.join(points)})")
        kind, idx = points[point]
        if isinstance(idx, tuple):
            targets = target if isinstance(target, list) else [target]
            if len(targets) != len(idx):
                raise ModelError(at, f"{point} has {len(idx)} tensors; the binding lists "
                                 f"{len(targets)} resources")
            pairs = [(i, t, join(at, j)) for j, (i, t) in enumerate(zip(idx, targets))]
        else:
            if isinstance(target, list):
                if len(target) != 1:
                    raise ModelError(at, f"{point} is one tensor; the binding lists "
                                     f"{len(target)} resources")
                target, at = target[0], join(at, 0)
            pairs = [(idx, target, at)]
        out = []
        for i, t, where in pairs:
            tdesc = (d.desc.inputs() if kind == "in" else d.desc.outputs())[i]
            if tdesc is None:
                raise ModelError(where, f"bind point {point!r} has a null tensor desc")
            out.append((kind, i, tdesc, self._source(t, where, tdesc.total_tensor_size_in_bytes,
                                                     point)))
        return out

    def _init_bindings(self, d: Dispatchable, bindings: dict, where: str) -> None:
        """A dispatchable's own ``bindings``: DxDispatch binds them once, when it
        initializes the operator; DirectML reads only its OWNED_BY_DML inputs there."""
        points = bind_points(d.desc)
        for point, target in bindings.items():
            at = join(where, point)
            (kind, idx, tdesc, b), *more = self._point(d, point, target, at, points)
            if more or kind != "in" or not _owned(tdesc):
                raise ModelError(at, f"{point} is not an input with DML_TENSOR_FLAG_OWNED_BY_DML;"
                                 " a dispatchable's bindings are bound at initialization, "
                                 "which only owned inputs are (bind it in the dispatch "
                                 "command)")
            d.init[point] = b
        for point, (kind, idx) in points.items():
            if isinstance(idx, tuple):
                continue        # an array of tensors: never owned (JOIN, SPLIT)
            tdesc = (d.desc.inputs() if kind == "in" else d.desc.outputs())[idx]
            if _owned(tdesc) and point not in d.init:
                raise ModelError(where.rsplit(".", 1)[0], f"{point} is "
                                 "DML_TENSOR_FLAG_OWNED_BY_DML: bind it in the dispatchable's "
                                 "'bindings' (bound once, at initialization)")
            if kind == "out" and _owned(tdesc):
                raise ModelError(where.rsplit(".", 1)[0], f"{point}: "
                                 "DML_TENSOR_FLAG_OWNED_BY_DML is for input tensors only")

    def _bindings(self, d: Dispatchable, bindings: dict, where: str):
        """The Bounds of the inputs and outputs (None: an absent optional; an owned input
        is None here and comes from ``d.owned`` at dispatch)."""
        points = bind_points(d.desc)
        ins = [None] * len(d.desc.inputs())
        outs = [None] * len(d.desc.outputs())
        for point, target in (bindings or {}).items():
            at = join(where, point)
            if point in d.init:
                raise ModelError(at, f"{point} is DML_TENSOR_FLAG_OWNED_BY_DML and was bound "
                                 "at initialization (the dispatchable's bindings); DirectML "
                                 "binds nothing there at execution")
            for kind, idx, _, b in self._point(d, point, target, at, points):
                (ins if kind == "in" else outs)[idx] = b
        for kind, lst, descs in (("in", ins, d.desc.inputs()), ("out", outs, d.desc.outputs())):
            for idx, (t, tdesc) in enumerate(zip(lst, descs)):
                name = _point_name(points, kind, idx)
                if t is None and tdesc is not None and name not in d.init:
                    raise ModelError(where, f"bind point {name!r} is not bound")
        return ins, outs

    def _read_range(self, r: Resource, offset: int, nbytes: int) -> np.ndarray:
        out = np.empty(nbytes, np.uint8)
        self.device.context.read(r.tensor.allocation, out, offset)
        return out

    def dispatch(self, cmd: dict, index: int) -> None:
        """Record ``-r`` dispatches, run ``-i`` times.  A binding at a byte offset is
        staged: its bytes are copied into a tensor of its own before the timed loop and
        (outputs) back after it, so the operator sees that range as DirectML would."""
        name = cmd["dispatchable"]
        d = self.dispatchables[name]
        bins, bouts = self.bound[index]
        points = bind_points(d.desc)
        staged = []

        def tensor_of(b: Bound | None, kind: str, idx: int):
            if b is None:
                point = _point_name(points, kind, idx)
                return None if d.initialized else d.owned.get(point)
            if b.offset == 0:
                return b.resource.tensor
            t = self.device.tensor(self._read_range(b.resource, b.offset, b.nbytes))
            staged.append((t, b, kind))
            return t

        try:
            ins = [tensor_of(b, "in", i) for i, b in enumerate(bins)]
            outs = [tensor_of(b, "out", i) for i, b in enumerate(bouts)]
            self._timed(name, d, ins, outs)
            for t, b, kind in staged:
                if kind == "out":
                    self.device.context.write(b.resource.tensor.allocation, t.read_bytes(b.nbytes),
                                           b.offset)
        finally:
            for t, _, _ in staged:
                t.free()

    def _timed(self, name: str, d: Dispatchable, ins, outs) -> None:
        tm = self.timing
        cpu, gpu = [], []
        with self.device.sequence(timed=True) as seq:
            for _ in range(tm.repeat):          # barriers between repeats come from hazards
                d.compiled.record(seq, ins, outs)
            start = time.perf_counter()
            i = 0
            while True:
                t = time.perf_counter()
                seq.run()
                cpu.append((time.perf_counter() - t) * 1e3 / tm.repeat)
                if seq.gpu_time_ns:
                    gpu.append(seq.gpu_time_ns * 1e-6 / tm.repeat)
                i += 1
                if tm.milliseconds is not None:
                    if (time.perf_counter() - start) * 1e3 >= tm.milliseconds:
                        break
                elif i >= tm.iterations:
                    break
        n = len(cpu)
        line = f"Dispatch '{name}': {n} iterations, {statistics.median(cpu):.4f} ms median (CPU)"
        if gpu:
            line += f", {statistics.median(gpu):.4f} ms median (GPU)"
        self.out(line)
        w = min(tm.warmup, n - 1) if n > 1 else 0
        if tm.verbosity >= 1:
            self.out(_stats_line("CPU Timings (Cold)", cpu[:w]))
            if gpu:
                self.out(_stats_line("GPU Timings (Cold)", gpu[:w]))
            self.out(_stats_line("CPU Timings (Hot) ", cpu[w:]))
            if gpu:
                self.out(_stats_line("GPU Timings (Hot) ", gpu[w:]))
        if tm.verbosity >= 2:
            self.out("The timings of each iteration:")
            for k, c in enumerate(cpu):
                g = f", {gpu[k]:.4f} ms (GPU)" if k < len(gpu) else ""
                self.out(f"iteration {k}: {c:.4f} ms (CPU){g}")
        self.records.append({"dispatchable": name, "operator": d.desc.OPERATOR_TYPE,
                             "init_ms": d.init_ms, "iterations": n, "repeat": tm.repeat,
                             "cpu_ms": cpu, "gpu_ms": gpu, "cold_samples": w,
                             "execution_flags": list(d.flags),
                             "compile_type": d.compile_type})

    def _read(self, r: Resource) -> np.ndarray:
        raw = r.tensor.read_bytes(r.nbytes)
        return raw[:r.values.nbytes].view(r.dtype).copy()

    def print_(self, cmd: dict, index: int) -> None:
        """DxDispatch's print: ``Resource 'NAME': v0, v1, ...`` over the initialized
        elements (C++ ostream formatting: 6 significant digits); ``verbose``: the name
        line, then ``[index] value (0xHEX)`` per element, the index right-aligned to the
        width of the count and the hex to the element's digit count (fmt's ``{:{}X}``)."""
        r = self._resource(cmd["resource"], f"commands[{index}].resource")
        vals = self._read(r)
        if not cmd.get("verbose"):
            self.out(f"Resource '{r.name}': " + ", ".join(_fmt(v) for v in vals.tolist()))
            return
        self.out(f"Resource '{r.name}':")
        n = len(vals)
        iw = int(np.floor(np.log10(n))) + 1 if n else 1
        hw = r.dtype.itemsize * 2
        bits = vals.view(f"u{r.dtype.itemsize}").tolist()
        for k, (v, h) in enumerate(zip(vals.tolist(), bits)):
            self.out(f"[{k:>{iw}}] {_fmt(v)} (0x{h:>{hw}X})")

    def write_file(self, cmd: dict, index: int) -> None:
        """DxDispatch's writeFile: ``.npy`` (the resource's data type, shape
        ``dimensions`` or 1-D over the whole buffer), ``.png``/``.jpg`` (``dimensions``
        NCHW: 1 channel grey, 3 RGB, 4 RGBA; each value clamped to [0, 1] times 255,
        truncated), anything else raw bytes of the whole buffer.  Folders are created."""
        where = f"commands[{index}].targetPath"
        r = self._resource(cmd["resource"], f"commands[{index}].resource")
        path = Path(cmd["targetPath"])
        raw = r.tensor.read_bytes(r.nbytes)
        dims = cmd.get("dimensions")
        suffix = path.suffix.lower()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if suffix == ".npy":
                shape = tuple(dims) if dims else (r.nbytes // r.dtype.itemsize,)
                count = int(np.prod(shape))
                np.save(path, raw[:count * r.dtype.itemsize].view(r.dtype).reshape(shape))
            elif suffix in IMAGE_SUFFIXES:
                write_image(path, raw, r, dims, where)
            else:
                path.write_bytes(raw.tobytes())
        except OSError as exc:
            raise ModelError(where, f"cannot write {path}: {exc}") from None


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def run_model(path, device, timing: Timing | None = None, out=print) -> list[dict]:
    """Run a model file on ``device``; returns one record per dispatch command.  A
    malformed model raises ModelError naming the place before anything is allocated."""
    path = Path(path)
    try:
        model = loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"line {exc.lineno} column {exc.colno}", f"not valid JSON: "
                         f"{exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError("", f"cannot read the model: {exc}") from None
    limits = device_limits(device)
    check_model(model, limits, path.parent)
    ex = Executor(model, path.parent, device, timing or Timing(), out, limits)
    try:
        return ex.run()
    finally:
        ex.release()



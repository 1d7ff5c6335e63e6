"""``python -m bench dispatch MODEL.json``: run DirectML DxDispatch model files on vkml.

A model file has ``resources`` (buffers and their initial values), ``dispatchables``
(``DML_OPERATOR_*`` operators, their ``desc`` written with DirectML's field and enum
names) and ``commands`` (``dispatch`` with named bindings, ``print``, ``writeFile``), so
the same file can be timed by DxDispatch on DirectML and by vkml on any Vulkan device.

What vkml reads (DxDispatch's documented format):

* resources: ``initialValuesDataType`` (``FLOAT32`` or ``DML_TENSOR_DATA_TYPE_FLOAT32``),
  ``initialValues`` as an array (``"nan"``, ``"inf"``, ``"-inf"`` allowed for floats),
  ``{valueCount, value}``, ``{valueCount, valueStart, valueDelta}`` or
  ``{sourcePath}`` (``.npy``, or raw ``.dat``/``.bin``); optional ``sizeInBytes``;
* dispatchables: ``type`` ``DML_OPERATOR_X`` (or ``X``) and ``desc``/``Desc`` with every
  field in PascalCase, enums by full name or suffix, ``DML_TENSOR_DESC`` as
  ``{DataType, Sizes, Strides?, TotalTensorSizeInBytes?, ...}``, a fused activation as
  ``{"Type": "ACTIVATION_RELU", ...its fields}``;
* commands: ``dispatch`` (bindings by bind-point name: a resource name, or
  ``{"name": ...}``), ``print``, ``writeFile`` (``.npy``, ``.dat``, ``.bin``).

Comments (``//``, ``/* */``) and trailing commas are accepted, as DxDispatch's parser does.
Anything else (HLSL or ONNX dispatchables, image files, binding sub-ranges, an operator
vkml does not implement, a field its descriptor does not have) is refused with an error
naming it.  Timing follows DxDispatch: ``-i`` iterations of bind + ``-r`` dispatches +
wait; the first ``-w`` samples are "cold", the rest "hot"; CPU (wall) and GPU
(timestamp-query) times per dispatch.
"""
from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import vkml
from vkml import dml


class ModelError(Exception):
    """The model file is invalid, or uses something vkml does not support."""


# -- reading the file -------------------------------------------------------------------
_STRING = r'"(?:\\.|[^"\\])*"'
_COMMENT = re.compile(_STRING + r"|//[^\n]*|/\*[\s\S]*?\*/")
_TRAILING = re.compile(_STRING + r"|,(?=\s*[}\]])")


def loads(text: str) -> dict:
    """JSON with ``//`` and ``/* */`` comments and trailing commas."""
    keep = lambda m: m.group(0) if m.group(0).startswith('"') else ""   # noqa: E731
    text = _TRAILING.sub(keep, _COMMENT.sub(keep, text))
    return json.loads(text)


def snake(name: str) -> str:
    """``StartPadding`` -> ``start_padding``, ``P`` -> ``p``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def pascal(name: str) -> str:
    return "".join(w[:1].upper() + w[1:] for w in name.split("_"))


# -- resources ------------------------------------------------------------------------
@dataclasses.dataclass
class Resource:
    name: str
    dtype: np.dtype
    values: np.ndarray          # the initial values (what print/writeFile show)
    nbytes: int                 # buffer size (>= values.nbytes, a multiple of 4)
    tensor: object = None


def _data_type(value, where: str) -> np.dtype:
    if value in (None, "UNKNOWN", "DML_TENSOR_DATA_TYPE_UNKNOWN"):
        raise ModelError(f"{where}: initialValuesDataType {value!r} (a list initializer for "
                         "HLSL constant buffers) is not supported by vkml")
    try:
        return dml.DataType.of(value).numpy
    except vkml.ValidationError as exc:
        raise ModelError(f"{where}: {exc.rule}") from None


def _values(init, dtype: np.dtype, base: Path, where: str) -> np.ndarray:
    def typed(vals):
        if dtype.kind == "f":
            vals = [float(v) if isinstance(v, str) else v for v in vals]
        try:
            return np.array(vals, dtype=dtype if dtype.kind != "f" else np.float64).astype(dtype)
        except (ValueError, OverflowError, TypeError) as exc:
            raise ModelError(f"{where}: initial values do not fit {dtype}: {exc}") from None

    if isinstance(init, list):
        if not init:
            raise ModelError(f"{where}: initialValues is an empty array")
        return typed(init)
    if not isinstance(init, dict):
        raise ModelError(f"{where}: initialValues must be an array or an object")
    if "sourcePath" in init:
        path = Path(init["sourcePath"])
        for cand in (base / path, Path.cwd() / path):
            if cand.exists():
                path = cand
                break
        else:
            raise ModelError(f"{where}: sourcePath {init['sourcePath']!r} not found next to "
                             "the model or in the current folder")
        if path.suffix == ".npy":
            return np.load(path).reshape(-1)
        if path.suffix in (".dat", ".bin"):
            return np.fromfile(path, dtype=dtype)
        raise ModelError(f"{where}: sourcePath {path.name}: only .npy, .dat and .bin files "
                         "are supported by vkml (no images)")
    count = init.get("valueCount")
    if not isinstance(count, int) or count < 1:
        raise ModelError(f"{where}: valueCount must be an integer > 0")
    unknown = set(init) - {"valueCount", "value", "valueStart", "valueDelta"}
    if unknown:
        raise ModelError(f"{where}: unknown initializer field(s) {sorted(unknown)}")
    if "value" in init:
        return np.full(count, typed([init["value"]])[0], dtype=dtype)
    if "valueStart" in init and "valueDelta" in init:
        start, delta = init["valueStart"], init["valueDelta"]
        if dtype.kind == "f":
            return (float(start) + float(delta) * np.arange(count, dtype=np.float64)).astype(dtype)
        return typed([start + delta * i for i in range(count)])
    raise ModelError(f"{where}: give 'value', or 'valueStart' and 'valueDelta'")


def parse_resources(model: dict, base: Path) -> dict[str, Resource]:
    out = {}
    for name, r in (model.get("resources") or {}).items():
        where = f"resource '{name}'"
        if not isinstance(r, dict):
            raise ModelError(f"{where}: must be an object")
        unknown = set(r) - {"initialValuesDataType", "initialValues", "sizeInBytes"}
        if unknown:
            raise ModelError(f"{where}: unsupported field(s) {sorted(unknown)} (vkml reads "
                             "initialValuesDataType, initialValues, sizeInBytes)")
        if "initialValues" not in r:
            raise ModelError(f"{where}: initialValues is required")
        src = r["initialValues"]
        dtype = (None if isinstance(src, dict) and str(src.get("sourcePath", "")).endswith(".npy")
                 else _data_type(r.get("initialValuesDataType"), where))
        values = _values(src, dtype or np.dtype(np.float32), base, where)
        size = int(r.get("sizeInBytes", values.nbytes))
        if size < values.nbytes:
            raise ModelError(f"{where}: sizeInBytes {size} is smaller than its initial values "
                             f"({values.nbytes} bytes)")
        out[name] = Resource(name, values.dtype, values, (size + 3) & ~3)
    return out


# -- descriptors ------------------------------------------------------------------------
def _classes():
    """DML operator type -> vkml descriptor class, and DML enum prefix -> enum class."""
    ops, enums = {}, {}
    for name in dml.__all__:
        obj = getattr(dml, name, None)
        if isinstance(obj, type) and issubclass(obj, dml.OperatorDesc) and obj.OPERATOR_TYPE:
            ops[obj.OPERATOR_TYPE] = obj
        elif isinstance(obj, type) and issubclass(obj, enum.Enum):
            enums["DML_" + snake(obj.__name__).upper() + "_"] = obj
    return ops, enums


def _desc_fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]


def _tensor_desc(value: dict, where: str) -> dml.TensorDesc:
    if "Desc" in value and "DataType" not in value:
        kind = str(value.get("Type", "BUFFER")).removeprefix("DML_TENSOR_TYPE_")
        if kind != "BUFFER":
            raise ModelError(f"{where}: tensor type {value.get('Type')!r} is not supported "
                             "(DML_TENSOR_TYPE_BUFFER only)")
        value = value["Desc"]
    allowed = {"Type", "DataType", "Sizes", "Strides", "TotalTensorSizeInBytes",
               "GuaranteedBaseOffsetAlignment", "Flags", "DimensionCount"}
    unknown = set(value) - allowed
    if unknown:
        raise ModelError(f"{where}: unknown DML_BUFFER_TENSOR_DESC field(s) {sorted(unknown)}")
    if "Sizes" not in value or "DataType" not in value:
        raise ModelError(f"{where}: a tensor desc needs DataType and Sizes")
    if "DimensionCount" in value and value["DimensionCount"] != len(value["Sizes"]):
        raise ModelError(f"{where}: DimensionCount {value['DimensionCount']} but Sizes has "
                         f"{len(value['Sizes'])} entries")
    flags = dml.TensorFlags.NONE
    for f in (value.get("Flags") or "NONE").replace(" ", "").split("|"):
        key = f.removeprefix("DML_TENSOR_FLAG_").removeprefix("DML_TENSOR_FLAGS_")
        if key not in dml.TensorFlags.__members__:
            raise ModelError(f"{where}: unknown tensor flag {f!r}")
        flags |= dml.TensorFlags[key]
    return dml.TensorDesc(value["DataType"], tuple(value["Sizes"]),
                          tuple(value["Strides"]) if value.get("Strides") else None,
                          value.get("TotalTensorSizeInBytes"),
                          value.get("GuaranteedBaseOffsetAlignment", 0), flags)


def _convert(value, field: str, where: str, enums: dict):
    if isinstance(value, dict):
        if "DataType" in value or ("Desc" in value and "Sizes" in value.get("Desc", {})):
            return _tensor_desc(value, where)
        if "Type" in value:            # a nested operator desc (a fused activation)
            inner = value.get("Desc", {k: v for k, v in value.items() if k != "Type"})
            return build_desc(value["Type"], inner, where)
        struct = {"scale_bias": "ScaleBias"}.get(field)
        if struct and hasattr(dml, struct):
            try:
                return getattr(dml, struct)(**{snake(k): v for k, v in value.items()})
            except TypeError as exc:
                raise ModelError(f"{where}: {exc}") from None
        raise ModelError(f"{where}: cannot read the object {value!r}")
    if isinstance(value, list):
        return tuple(_convert(v, field, where, enums) for v in value)
    if isinstance(value, str):
        if field.endswith("data_type"):
            return dml.DataType.of(value)
        for prefix, cls in enums.items():
            if value.startswith(prefix) and value[len(prefix):] in cls.__members__:
                return cls[value[len(prefix):]]
    return value


def build_desc(type_name: str, desc: dict, where: str = ""):
    """The vkml descriptor of a DxDispatch ``desc`` for ``DML_OPERATOR_<type>``."""
    ops, enums = _classes()
    full = type_name if type_name.startswith("DML_OPERATOR_") else "DML_OPERATOR_" + type_name
    where = f"{where}{' / ' if where else ''}{full}"
    cls = ops.get(full)
    if cls is None:
        raise ModelError(f"{where}: vkml has no {full} (it implements: "
                         f"{', '.join(sorted(t for t in ops if 'ACTIVATION' not in t))})")
    if not isinstance(desc, dict):
        raise ModelError(f"{where}: desc must be an object")
    fields = _desc_fields(cls)
    kwargs = {}
    counts = {}
    for key, value in desc.items():
        name = snake(key)
        if name in fields:
            kwargs[name] = _convert(value, name, f"{where}.{key}", enums)
        elif key.endswith("Count") and isinstance(value, int):
            counts[key] = value        # implied by the arrays in vkml (checked below)
        else:
            raise ModelError(f"{where}: field {key!r} is not a field of "
                             f"{full.replace('DML_OPERATOR_', 'DML_')}_OPERATOR_DESC as vkml "
                             f"implements it (fields: {', '.join(pascal(f) for f in fields)})")
    for name in fields:       # optional (_Maybenull_) fields left out are null, as in DxDispatch
        if name not in kwargs and (name.endswith("_tensor") or name == "fused_activation"):
            kwargs[name] = None
    dim = counts.pop("DimensionCount", None)
    if counts:
        raise ModelError(f"{where}: field(s) {sorted(counts)} are not supported by vkml")
    if dim is not None:
        for name, v in kwargs.items():
            if isinstance(v, tuple) and v and all(isinstance(x, int) for x in v) \
                    and len(v) != dim:
                raise ModelError(f"{where}: DimensionCount is {dim} but {pascal(name)} has "
                                 f"{len(v)} entries")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        missing = [pascal(f) for f in fields if f not in kwargs]
        raise ModelError(f"{where}: {exc} (fields not given: {', '.join(missing)})") from None
    except vkml.ValidationError as exc:
        raise ModelError(f"{where}: {exc}") from None


def bind_points(desc) -> dict[str, tuple[str, int]]:
    """Bind-point name (``InputTensor``) -> ("in" | "out", index in inputs()/outputs())."""
    ins, outs = desc.inputs(), desc.outputs()
    out = {}
    nones = [i for i, t in enumerate(ins) if t is None]
    for f in _desc_fields(type(desc)):
        v = getattr(desc, f)
        if isinstance(v, dml.TensorDesc):
            for kind, lst in (("in", ins), ("out", outs)):
                idx = next((i for i, t in enumerate(lst) if t is v), None)
                if idx is not None:
                    out[pascal(f)] = (kind, idx)
                    break
        elif v is None and f.endswith("_tensor") and nones:
            out[pascal(f)] = ("in", nones.pop(0))
    return out


# -- running ----------------------------------------------------------------------------
@dataclasses.dataclass
class Dispatchable:
    name: str
    desc: object
    compiled: object = None
    init_ms: float = 0.0


def parse_dispatchables(model: dict) -> dict[str, Dispatchable]:
    out = {}
    for name, d in (model.get("dispatchables") or {}).items():
        where = f"dispatchable '{name}'"
        if not isinstance(d, dict) or "type" not in d:
            raise ModelError(f"{where}: needs a 'type'")
        kind = d["type"]
        if not str(kind).upper().startswith("DML_OPERATOR_") and not str(kind).isupper():
            raise ModelError(f"{where}: type {kind!r} is not supported by vkml (it runs "
                             "DirectML operators, DML_OPERATOR_*; not HLSL, ONNX or serialized "
                             "graphs)")
        unknown = set(d) - {"type", "desc", "Desc", "executionFlags", "dmlCompileType"}
        if unknown:
            raise ModelError(f"{where}: unsupported field(s) {sorted(unknown)}")
        desc = d.get("desc", d.get("Desc"))
        if desc is None:
            raise ModelError(f"{where}: needs a 'desc'")
        out[name] = Dispatchable(name, build_desc(kind, desc, where))
    return out


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


class Executor:
    def __init__(self, model: dict, base: Path, device, timing: Timing, out=print):
        self.device = device
        self.timing = timing
        self.out = out
        self.resources = parse_resources(model, base)
        self.dispatchables = parse_dispatchables(model)
        self.commands = model.get("commands")
        if not isinstance(self.commands, list):
            raise ModelError("the model needs a 'commands' array")
        self.records: list[dict] = []

    def setup(self) -> None:
        dev = self.device
        for r in self.resources.values():
            raw = np.zeros(r.nbytes, np.uint8)
            raw[:r.values.nbytes] = r.values.view(np.uint8)
            r.tensor = dev.tensor(raw)
        from vkml.ops.base import REGISTRY

        for d in self.dispatchables.values():
            if type(d.desc) not in REGISTRY:
                raise ModelError(f"dispatchable '{d.name}': vkml does not implement "
                                 f"{d.desc.OPERATOR_TYPE} yet (its descriptor exists)")
            t = time.perf_counter()
            try:
                d.compiled = dev.compile_operator(dev.create_operator(d.desc))
            except (vkml.ValidationError, vkml.UnsupportedError) as exc:
                raise ModelError(f"dispatchable '{d.name}' ({d.desc.OPERATOR_TYPE}): "
                                 f"{exc}") from None
            d.init_ms = (time.perf_counter() - t) * 1e3
            if self.timing.verbosity >= 1:
                self.out(f"Initialize '{d.name}': {d.init_ms:.4f} ms")

    def run(self) -> list[dict]:
        self.setup()
        for i, cmd in enumerate(self.commands):
            kind = cmd.get("type") if isinstance(cmd, dict) else None
            if kind == "dispatch":
                self.dispatch(cmd, i)
            elif kind == "print":
                self.print_(cmd, i)
            elif kind == "writeFile":
                self.write_file(cmd, i)
            else:
                raise ModelError(f"command {i}: type {kind!r} is not supported (dispatch, "
                                 "print, writeFile)")
        return self.records

    def _resource(self, name, where) -> Resource:
        if isinstance(name, dict):
            extra = set(name) - {"name"}
            if extra - {"elementOffset"} or name.get("elementOffset", 0):
                raise ModelError(f"{where}: binding options {sorted(extra)} (sub-ranges and "
                                 "views) are not supported by vkml; bind whole resources")
            name = name.get("name")
        if name not in self.resources:
            raise ModelError(f"{where}: no resource named {name!r}")
        return self.resources[name]

    def _bindings(self, d: Dispatchable, bindings: dict, where: str):
        points = bind_points(d.desc)
        ins = [None] * len(d.desc.inputs())
        outs = [None] * len(d.desc.outputs())
        for point, target in (bindings or {}).items():
            if point not in points:
                raise ModelError(f"{where}: {d.desc.OPERATOR_TYPE} has no bind point {point!r} "
                                 f"(bind points: {', '.join(points)})")
            if isinstance(target, list):
                if len(target) != 1:
                    raise ModelError(f"{where}: bind point {point!r} takes one resource")
                target = target[0]
            r = self._resource(target, f"{where}, {point}")
            kind, idx = points[point]
            tdesc = (d.desc.inputs() if kind == "in" else d.desc.outputs())[idx]
            if tdesc is None:
                raise ModelError(f"{where}: bind point {point!r} has a null tensor desc")
            need = tdesc.total_tensor_size_in_bytes
            if r.nbytes < need:
                raise ModelError(f"{where}: {point} -> resource '{r.name}' holds {r.nbytes} "
                                 f"bytes; the tensor needs TotalTensorSizeInBytes = {need}")
            (ins if kind == "in" else outs)[idx] = r.tensor
        for kind, lst, descs in (("in", ins, d.desc.inputs()), ("out", outs, d.desc.outputs())):
            for idx, (t, tdesc) in enumerate(zip(lst, descs)):
                if t is None and tdesc is not None:
                    name = next(p for p, v in points.items() if v == (kind, idx))
                    raise ModelError(f"{where}: bind point {name!r} is not bound")
        return ins, outs

    def dispatch(self, cmd: dict, index: int) -> None:
        name = cmd.get("dispatchable")
        where = f"command {index} (dispatch '{name}')"
        if name not in self.dispatchables:
            raise ModelError(f"{where}: no dispatchable named {name!r}")
        d = self.dispatchables[name]
        ins, outs = self._bindings(d, cmd.get("bindings"), where)
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
                             "cpu_ms": cpu, "gpu_ms": gpu, "cold_samples": w})

    def _read(self, r: Resource) -> np.ndarray:
        raw = r.tensor.read_bytes(r.nbytes)
        return raw[:r.values.nbytes].view(r.dtype).copy()

    def print_(self, cmd: dict, index: int) -> None:
        r = self._resource(cmd.get("resource"), f"command {index} (print)")
        vals = self._read(r)
        text = ", ".join(_fmt(v) for v in vals.tolist())
        self.out(f"Resource '{r.name}': {text}")

    def write_file(self, cmd: dict, index: int) -> None:
        where = f"command {index} (writeFile)"
        r = self._resource(cmd.get("resource"), where)
        target = cmd.get("targetPath")
        if not target:
            raise ModelError(f"{where}: needs a targetPath")
        path = Path(target)
        if path.suffix == ".npy":
            np.save(path, self._read(r))
        elif path.suffix in (".dat", ".bin"):
            path.write_bytes(r.tensor.read_bytes(r.nbytes).tobytes())
        else:
            raise ModelError(f"{where}: {path.name}: vkml writes .npy, .dat and .bin "
                             "(no images)")
        self.out(f"Resource '{r.name}' written to '{path}'")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def run_model(path, device, timing: Timing | None = None, out=print) -> list[dict]:
    """Run a model file on ``device``; returns one record per dispatch command."""
    path = Path(path)
    try:
        model = loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"not valid JSON: {exc}") from None
    if not isinstance(model, dict):
        raise ModelError("a model is a JSON object")
    for key in ("resources", "dispatchables", "commands"):
        if key not in model:
            raise ModelError(f"the model has no {key!r}")
    ex = Executor(model, path.parent, device, timing or Timing(), out)
    try:
        return ex.run()
    finally:
        for d in ex.dispatchables.values():
            if d.compiled is not None:
                d.compiled.release()
        for r in ex.resources.values():
            if r.tensor is not None:
                r.tensor.free()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench dispatch",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="DxDispatch model file (.json)")
    ap.add_argument("-a", "--device", "--adapter", default=None,
                    help="Vulkan device: index or name substring (DxDispatch's --adapter)")
    ap.add_argument("-i", "--dispatch_iterations", type=int, default=1,
                    help="bind/dispatch/wait iterations (default 1)")
    ap.add_argument("-r", "--dispatch_repeat", type=int, default=1,
                    help="dispatches per iteration (default 1)")
    ap.add_argument("-t", "--milliseconds_to_run", type=float, default=None,
                    help="run iterations for this long instead of -i")
    ap.add_argument("-w", "--warmup_samples", type=int, default=1,
                    help="samples counted as cold (default 1)")
    ap.add_argument("-v", "--timing_verbosity", type=int, default=0, choices=(0, 1, 2),
                    help="0: hot timings, 1: init/cold/hot, 2: every iteration")
    ap.add_argument("--json", metavar="PATH", help="write the timings as JSON")
    args = ap.parse_args(argv)
    if args.dispatch_iterations < 1 or args.dispatch_repeat < 1:
        ap.error("iterations and repeat must be at least 1")
    timing = Timing(args.dispatch_iterations, args.dispatch_repeat, args.warmup_samples,
                    args.milliseconds_to_run, args.timing_verbosity)
    try:
        with vkml.Device(args.device) as dev:
            print(f"Running on [{dev.index}] '{dev.name}' ({dev.info.driver_name} "
                  f"{dev.info.driver_info})")
            records = run_model(args.model, dev, timing)
            info = {"index": dev.index, "name": dev.name, "driver_name": dev.info.driver_name,
                    "driver_info": dev.info.driver_info}
    except ModelError as exc:
        print(f"vkml-bench dispatch: {args.model}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": str(args.model), "device": info, "vkml": vkml.__version__,
                       "dispatches": records}, f, indent=1)
            f.write("\n")
    return 0

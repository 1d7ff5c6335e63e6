"""Workloads: the data files under ``bench/workloads/`` (one per operator).

A file is ``{"workloads": [...]}``; each workload is an object with

* ``name`` (unique), ``op`` (``pad``, ``fold``, ``unfold``, ``convolution``,
  ``lp_pooling``, ``graph``: Pad -> Conv -> Relu -> LpPool -> Conv, see ``bench/graph.py``;
  the operators CNN models are made of: ``element_wise``, ``identity``, ``join``,
  ``split``, ``slice``, ``resample``, ``max_pooling``, ``average_pooling``, ``reduce``,
  ``gemm``, ``batch_normalization``, ``softmax``, see ``bench/model_ops.py``), ``dtype``
  (``float32`` by default, ``float16``);
* the operator's parameters (see :func:`bench.operators.normalize`), e.g. for ``pad``:
  ``shape``, ``start``, ``end``, ``mode``, ``value``; for ``convolution``: ``input``,
  ``filter``, ``bias``, ``strides``, ``dilations``, ``start_padding``, ``end_padding``,
  ``output_padding``, ``groups``, ``direction``;
* ``sets``: the sets it belongs to (``"quick"``, ``"full"``; default ``["full"]``);
* ``tolerance``: the largest acceptable relative error (max |y - ref| / max |ref|) against
  the float64 reference; a default per operator and data type otherwise.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import operators

DIR = Path(__file__).resolve().parent / "workloads"

#: Default tolerances (relative to the reference's largest magnitude).
_TOLERANCE = {
    ("pad", "float32"): 0.0, ("pad", "float16"): 0.0, ("unfold", "float32"): 0.0,
    ("unfold", "float16"): 0.0, ("fold", "float32"): 1e-6, ("fold", "float16"): 2e-3,
    ("convolution", "float32"): 1e-4, ("convolution", "float16"): 1e-2,
    ("lp_pooling", "float32"): 1e-5, ("lp_pooling", "float16"): 2e-3,
    ("graph", "float32"): 1e-4, ("graph", "float16"): 1e-2,
    # the operators CNN models are made of (bench/model_ops.py): copies are exact; one
    # rounding per element for element-wise, resample and batch normalization; sums of
    # many terms for pooling, reduce, GEMM and softmax
    **{(op, "float32"): 0.0 for op in ("identity", "join", "split", "slice", "max_pooling")},
    **{(op, "float16"): 0.0 for op in ("identity", "join", "split", "slice", "max_pooling")},
    **{(op, "float32"): 1e-6 for op in ("element_wise", "resample")},
    **{(op, "float32"): 1e-5 for op in ("average_pooling", "reduce", "gemm", "softmax",
                                        "batch_normalization")},
    **{(op, "float16"): 2e-3 for op in ("element_wise", "resample", "batch_normalization",
                                        "average_pooling", "softmax")},
    ("reduce", "float16"): 1e-2, ("gemm", "float16"): 1e-2,
}


@dataclass(frozen=True)
class Workload:
    name: str
    op: str
    dtype: str
    params: dict = field(hash=False, compare=False)   # as written in the file
    sets: tuple = ("full",)
    tolerance: float = 0.0
    source: str = ""

    @property
    def spec(self) -> operators.OpSpec:
        return operators.OPS[self.op]

    @property
    def p(self) -> dict:
        """The parameters with defaults filled and shapes derived."""
        return operators.normalize(self.op, self.params)

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    def describe(self) -> str:
        p = self.p
        if self.op == "convolution":
            return (f"{'x'.join(map(str, p['input']))} * {'x'.join(map(str, p['filter']))}"
                    f" -> {'x'.join(map(str, p['out_shape']))}")
        ins = {"element_wise": ("a", "b"), "gemm": ("a", "b")}.get(self.op)
        ins = [p[k] for k in ins] if ins else p["shapes"] if self.op == "join" else [p["shape"]]
        outs = p["out_shapes"] if self.op == "split" else [p["out_shape"]]
        return " -> ".join(", ".join("x".join(map(str, s)) for s in side) for side in (ins, outs))

    def flops(self) -> float:
        return operators.flops(self.op, self.p)

    def as_dict(self) -> dict:
        return {"name": self.name, "op": self.op, "dtype": self.dtype, "params": self.params,
                "sets": list(self.sets), "tolerance": self.tolerance, "source": self.source}


_KEYS = {"name", "op", "dtype", "sets", "tolerance", "comment"}


def parse(entry: dict, source: str = "") -> Workload:
    """One workload from its JSON object (checks the operator and its parameters)."""
    missing = {"name", "op"} - set(entry)
    if missing:
        raise ValueError(f"{source}: a workload lacks {sorted(missing)}: {entry}")
    op = entry["op"]
    if op not in operators.OPS:
        raise ValueError(f"{source}: workload {entry['name']!r}: unknown op {op!r} "
                         f"(known: {', '.join(operators.OPS)})")
    dtype = entry.get("dtype", "float32")
    if dtype not in ("float32", "float16"):
        raise ValueError(f"{source}: workload {entry['name']!r}: dtype must be float32 or "
                         f"float16, got {dtype!r}")
    params = {k: v for k, v in entry.items() if k not in _KEYS}
    try:
        p = operators.normalize(op, params)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{source}: workload {entry['name']!r}: bad parameters ({exc!r})") from None
    if min(p["out_shape"]) < 1 or math.prod(p["shape"]) < 1:
        raise ValueError(f"{source}: workload {entry['name']!r}: empty shape {p['out_shape']}")
    tol = entry.get("tolerance", _TOLERANCE.get((op, dtype), 1e-4))
    return Workload(entry["name"], op, dtype, params, tuple(entry.get("sets", ["full"])),
                    float(tol), source)


def load(paths=None) -> list[Workload]:
    """Every workload of the given files or folders (default: ``bench/workloads/``)."""
    files: list[Path] = []
    for p in [Path(x) for x in (paths or [DIR])]:
        files += sorted(p.glob("*.json")) if p.is_dir() else [p]
    out: list[Workload] = []
    seen: dict[str, str] = {}
    for f in files:
        doc = json.loads(f.read_text())
        for entry in doc.get("workloads", []):
            w = parse(entry, f.name)
            if w.name in seen:
                raise ValueError(f"workload name {w.name!r} appears in {seen[w.name]} and {f.name}")
            seen[w.name] = f.name
            out.append(w)
    return out


def select(workloads: list[Workload], quick: bool = False, filters=()) -> list[Workload]:
    """The ``quick`` set (or the ``full`` set), narrowed to names containing any of
    ``filters`` (case-insensitive)."""
    want = "quick" if quick else "full"
    out = [w for w in workloads if want in w.sets]
    if filters:
        fl = [f.lower() for f in filters]
        out = [w for w in out if any(f in w.name.lower() or f == w.op for f in fl)]
    return out

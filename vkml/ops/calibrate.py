"""Padding's cost model, a measured model of :mod:`vkml.tuning` (its one calibration).

Padding chooses between three paths (element kernel, rows kernel, copy engine for the
interior; :mod:`.padding`) by estimated device time, modelled per path as
``seconds = fixed + per_row * rows + per_byte * output bytes`` (rows: copy regions for
the copy engine, which on lavapipe pays a fixed cost per region).  One calibration per device
covers every shape: each path is timed on a tiny padding (2 x 64, the fixed cost) and on
two float32 paddings with the same bytes and different row counts (4096 rows of 256
elements and 256 of 4096, padded by 2 on each side of the rows), and the two other terms
are fitted to them.  The fast paths are timed at 16 MiB, the element kernel at 4 MiB:
lavapipe's copy engine moves 4 MiB at 0.07 ns/byte (cache) but 64 MiB at 0.14, the rows
kernel 0.14-0.16 at both.  Nothing here looks at a device's name.

How the tuner carries it (:func:`vkml.tuning.measured_model`): the nine (path, shape)
points are the "candidates" of the model ``padding``, all timed, interleaved round robin
(score: minimum over rounds of each round's median), stored in the tuning file of the
device under shape class ``device`` and keyed by the only features that change which
padding kernels run (``storage8``, ``storage16``: the packed variants).  A device with
limits lowered by ``Device(limits=...)`` uses a stored calibration but never measures (its
limits would skew it).  ``VKML_TUNE=off`` gives :data:`DEFAULT_COSTS`, nothing timed.
Padding's ``execute`` re-checks the stored costs: every
:data:`vkml.ops.padding.OBSERVE_EVERY`-th call runs timed and reports its time against the
model's prediction; a median off by more than :data:`STALE_FACTOR` either way re-measures
(the model fits some shapes only within ~3x, e.g. SwiftShader's copy engine on 4096 short
rows: a re-measure finding the same costs doubles the margin for the process).
``python -m vkml.tune --refresh`` (or ``--path padding``) re-measures on demand.

From about the points' size on (:data:`LARGE_BYTES`) the model fails on a machine whose
last-level cache holds the 16 MiB points for one path and not the other
(docs/DEVELOPING.md): there the paths the model puts within
:data:`LARGE_SPREAD` of its best are timed at the padding's own size class instead
(:func:`large_path`, tuner path ``padding-large``), once per class and device.
"""
from __future__ import annotations

import numpy as np

from ..dml.padding import PaddingOperatorDesc
from ..dml.tensor_desc import TensorDesc
from ..tuning import (MODEL_CLASS, Candidate, Declined, measured_model, register_model,
                      register_path, tunable_path)
from .base import release_all

PATHS = ("kernel", "rows", "copy")
#: (rows, elements per row) of the two float32 paddings each path is timed on...
SHAPES = ((4096, 256), (256, 4096))
#: ...and of the tiny one (its time is the fixed cost).
TINY = (2, 64)
_SCALE = {"kernel": 1, "rows": 4, "copy": 4}     # rows multiplied by this
_PAD = 2
#: The costs (fixed s, per row s, per byte s) ``VKML_TUNE=off`` uses, the same on every
#: run: the rows kernel for row-contiguous paddings, the element kernel elsewhere, the
#: copy engine only where the rows kernel does not apply and runs are few and long (the
#: order lavapipe and SwiftShader measure).
DEFAULT_COSTS = {"kernel": (1e-4, 0.0, 2e-9), "rows": (1e-4, 0.0, 3e-10),
                 "copy": (1e-4, 1e-6, 3e-10)}
#: Observed times this many times off the model's prediction (median, either way) mark the
#: calibration stale: wider than the tuner's 2x, as the model is a fit, not a measurement
#: of the very shape (measurements taken under load are several times off, not 1.5x).
STALE_FACTOR = 4.0
_FEATURES = ("storage8", "storage16")
#: Input + output bytes of the largest point (the rows and copy points: 16 MiB in)...
POINT_BYTES = max(r * _SCALE[p] * (2 * w + 2 * _PAD) * 4 for p in ("rows", "copy")
                  for r, w in SHAPES)
#: ...and of the smallest padding the model is not trusted with: from half the points'
#: size on, whether a path's data stays in the last-level cache between runs decides its
#: time, and the interleaved points measure that for one path and not for another.  Such
#: a padding's paths (those within LARGE_SPREAD of the model's best) are timed at its own
#: size class instead; its own runs take milliseconds, the timing is once per class
#: (the model alone has sent such paddings to the copy engine at twice the rows kernel's
#: time: bench/RESULTS.md).
LARGE_BYTES = POINT_BYTES // 2
LARGE_SPREAD = 4.0
#: Words-pass blocks (workgroup size, 16-byte words per invocation) a large padding's
#: timing tries besides the rows path's defaults (64, ROWS_PER): the one that beat them
#: on large paddings on lavapipe.
ROWS_BLOCKS = ((256, 4),)
#: ...and, where the rows path writes whole rows in one dispatch (``rows_full``), the
#: same blocks as two dispatches (words, then edge elements; the default before):
#: candidates ``rows-<local>x<per>-split``.
SPLIT_BLOCKS = ROWS_BLOCKS
#: ...and, on devices with int64 shaders, the rows path with its words stored as u64vec4
#: pairs (``rows_u64``) with these blocks: candidates ``rows-<local>x<per>-u64``
#: (declined elsewhere, and where the pairs do not apply).  lavapipe stores per
#: component, not per byte (docs/DEVELOPING.md, "u64vec4 stores"): interleaved in one
#: process, whole rows by 2, ms: 1x64x256x256 constant (256, 4) uvec4 1.62, u64 1.54,
#: (256, 6) u64 1.49, (64, 4) u64 1.57; 1x64x512x512 constant 6.59, 5.88, 5.74, 6.00,
#: reflection 6.33, 5.72, 5.39, 5.99.  Then (u64, min of 8-15 rounds): 1x64x256x256
#: reflection (256, 4) 1.52, (256, 6) 1.48-1.51, (128, 6) 1.38-1.44, (128, 4) 1.57,
#: (128, 8) 1.48, (64, 6) 1.41, (32, 6) 1.63, (256, 8) 1.52, (256, 10) 1.68; constant
#: (256, 6) 1.55, (128, 6) 1.50; 1x64x512x512 constant (256, 4) 5.99, (256, 6) 5.69,
#: (128, 6) 5.50, (64, 6) 5.66.
U64_BLOCKS = ((128, 6), (256, 6))


def features(device) -> str:
    """The key's feature part: only the features that change which padding kernels run."""
    f = device.context.features
    return ",".join(k for k in _FEATURES if f.get(k))


def points(shapes=SHAPES, tiny=TINY) -> list[Candidate]:
    """The (path, rows, width) points timed, named ``<path>-<rows>x<width>``."""
    out = []
    for path in PATHS:
        for rows, width in (tiny,) + tuple((r * _SCALE[path], w) for r, w in shapes):
            out.append(Candidate(f"{path}-{rows}x{width}",
                                 {"path": path, "rows": rows, "width": width}))
    return out


def _geometry(device, params) -> tuple[int, int]:
    rows, width = params["rows"], params["width"]
    if params["path"] == "rows":      # the input is bound as 16-byte texels: shrink to fit
        texels = device.context.limits["maxTexelBufferElements"]
        rows = min(rows, max(1, texels * 4 // width))
    return rows, width


def _lowered(ctx) -> bool:
    return any(v != ctx.info.limits.get(k) for k, v in ctx.limits.items())


def fit(model_points, device, times: dict) -> dict:
    """``{path: [fixed_s, per_row_s, per_byte_s]}`` from the point times (a path missing a
    point, because it declined, is left out: padding then does not consider it)."""
    by_path: dict[str, list] = {}
    for c in model_points:
        if c.name in times:
            rows, width = _geometry(device, c.params)
            by_path.setdefault(c.params["path"], []).append(
                (rows, rows * (width + 2 * _PAD) * 4, times[c.name]))
    costs = {}
    for path, pts in by_path.items():
        if len(pts) < 3:
            continue
        fixed = pts[0][2]
        a = np.array([p[:2] for p in pts[1:]], dtype=np.float64)
        per_row, per_byte = np.linalg.lstsq(a, np.array([p[2] - fixed for p in pts[1:]]),
                                            rcond=None)[0]
        costs[path] = [float(fixed), max(float(per_row), 0.0), max(float(per_byte), 1e-13)]
    return costs


def _run(op_class):
    def run(device, seq, point, _shape):
        """Record ``op_class(..., path=point's path)`` padding float32 (rows, width) by
        _PAD on each side of the rows (reflection); Declined where the path does not
        apply (it would fall back to the element kernel)."""
        ctx = device.context
        if _lowered(ctx):
            raise Declined("limits lowered by Device(limits=...): not measured there")
        path = point.params["path"]
        rows, width = _geometry(device, point.params)
        out = (rows, width + 2 * _PAD)
        op = op_class(device, PaddingOperatorDesc(TensorDesc("float32", (rows, width)),
                                                  TensorDesc("float32", out), "reflection",
                                                  0.0, (0, _PAD), (0, _PAD)), path=path)
        if (path == "rows" and op.rows is None) or (path == "copy"
                                                     and op.copy_regions is None):
            op.release()
            raise Declined(f"the {path} path does not take {rows}x{width}")
        made = [op]
        try:
            src = device.tensor(np.zeros((rows, width), np.float32))  # touched: no faults
            made.append(src)
            dst = device.tensor(np.zeros(out, np.float32))
            made.append(dst)
            op.record(seq, [src], [dst])
        except BaseException:
            release_all(made)
            raise
        return lambda: release_all(made)
    return run


def padding_model(op_class, *, name: str = "padding", shapes=SHAPES, tiny=TINY,
                  register: bool = True):
    """The measured model of ``op_class`` (:class:`.padding.CompiledPadding`, given here
    so this module does not import padding).  ``shapes``/``tiny`` smaller than the
    defaults and ``register=False`` make a quick one (tests)."""
    pts = points(shapes, tiny)
    make = register_model if register else measured_model
    return make(name, pts, {k: list(v) for k, v in DEFAULT_COSTS.items()},
                lambda device, times: fit(pts, device, times), _run(op_class),
                features_fn=features, stale_factor=STALE_FACTOR,
                from_workload=lambda w: None if not isinstance(w, dict)
                or w.get("op") != "pad" else MODEL_CLASS)


# -- paddings past the points: timed at their own size class ---------------------------

def large_class(shape) -> str:
    """Shape class of a large padding: constant or another mode (they differ only in
    the border's reads), element bytes, input + output bytes and innermost run bytes to
    the power of two (the copy engine pays per run)."""
    def p2(n):
        return max(int(n), 1).bit_length() - 1
    kind = "constant" if shape["mode"] == "constant" else "fold"
    return f"{kind}-e{shape['esize']}-2^{p2(shape['bytes'])}B-run2^{p2(shape['run'])}B"


def _run_large(op_class):
    def run(device, seq, cand, shape):
        """Record ``op_class(..., path=cand)`` on packed tensors of ``shape``'s sizes
        (Declined where that path does not take them)."""
        if _lowered(device.context):
            raise Declined("limits lowered by Device(limits=...): not measured there")
        dtype = np.dtype(shape["dtype"])
        sin, sout, start = shape["in"], shape["out"], shape["start"]
        end = [o - i - s for i, o, s in zip(sin, sout, start)]
        path, block = cand.params["path"], cand.params.get("block")
        op = op_class(device, PaddingOperatorDesc(TensorDesc(dtype, sin), TensorDesc(dtype, sout),
                                                  shape["mode"], 0.0, start, end),
                      path=path, rows_block=None if block is None else tuple(block),
                      rows_full=cand.params.get("full"), rows_u64=cand.params.get("u64"))
        if op.taken != path:
            op.release()
            raise Declined(f"the {path} path does not take {sin} -> {sout}")
        if cand.params.get("full") is False and op.full_plan() is None:
            op.release()
            raise Declined("no whole-rows dispatch here: the same as the rows candidate")
        if cand.params.get("u64") and not op.u64:
            op.release()
            raise Declined("no u64vec4 stores here (int64 shaders, even words an "
                           "invocation, rows longer than one)")
        made = [op]
        try:
            made.append(device.tensor(np.zeros(sin, dtype)))        # touched: no faults
            made.append(device.tensor(np.zeros(sout, dtype)))
            op.record(seq, [made[1]], [made[2]])
        except BaseException:
            release_all(made)
            raise
        return lambda: release_all(made)
    return run


def large_path(op_class, *, name: str = "padding-large", register: bool = True):
    """The tuner path of large paddings (:data:`LARGE_BYTES`): candidates ``PATHS``,
    ``rows-<local>x<per>`` (the rows path with a words-pass block of :data:`ROWS_BLOCKS`)
    ``rows-<local>x<per>-split`` (:data:`SPLIT_BLOCKS`, two dispatches where one
    would write whole rows; declined elsewhere) and ``rows-<local>x<per>-u64``
    (:data:`U64_BLOCKS`, u64vec4 stores; declined without int64), the fast list the shape's ``paths``
    (what the model put within :data:`LARGE_SPREAD`, the rows blocks with rows),
    shape a JSON dict (``in``, ``out``, ``start``, ``mode``, ``dtype``, ``esize``,
    ``bytes``, ``run``, ``paths``), key features as the model's."""
    make = register_path if register else tunable_path
    blocks = [Candidate(f"rows-{b[0]}x{b[1]}", {"path": "rows", "block": list(b)})
              for b in ROWS_BLOCKS]
    blocks += [Candidate(f"rows-{b[0]}x{b[1]}-split", {"path": "rows", "block": list(b),
                                                       "full": False})
               for b in SPLIT_BLOCKS]
    blocks += [Candidate(f"rows-{b[0]}x{b[1]}-u64", {"path": "rows", "block": list(b),
                                                     "u64": True})
               for b in U64_BLOCKS]

    def fast(shape, _device):
        return list(shape["paths"]) + ([c.name for c in blocks] if "rows" in shape["paths"]
                                       else [])
    return make(name, [Candidate(p, {"path": p}) for p in PATHS] + blocks, "rows",
                large_class, _run_large(op_class), features_fn=features, fast_fn=fast,
                work_fn=lambda shape: float(shape["bytes"]))

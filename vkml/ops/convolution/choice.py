"""Which path runs a geometry: the candidates (paths with their knobs), the heuristic
``VKML_TUNE=off`` follows, :func:`choose_path`, and the tunable path ``convolution``
(:mod:`vkml.tuning`: shape classes, the fast list, running a candidate)."""
from __future__ import annotations

import math

from ... import tuning
from ...tuning import Declined
from ...dml.convolution import ConvolutionDirection, ConvolutionMode, ConvolutionOperatorDesc
from ...dml.data_type import DataType
from ...dml.tensor_desc import TensorDesc, TensorFlags
from ...errors import UnsupportedError, ValidationError
from ..base import CompiledOperator, empty_for, release_all
from ..concurrent_width import concurrent_width
from ..owned import owned_slots
from .depthwise import DepthwisePath
from .direct import DirectPath
from .gemm import SPLIT_MIN_SLICE_K, GemmPath, gemm_workgroups
from .gemm_sg import GemmSgPath
from .gemv import GemvPath
from .geometry import RELAYOUT_GROUPS, Geometry, Path, knobs_of
from .blocked import BLOCKS, BlockedPath
from .tiled import TiledPath
from .winograd import WinogradPath


#: Slices of the split-K candidates (``gemm-split4``, ``gemm_sg-split16``, ...: knob
#: ``split_k``), offered by a fast list only where a layer's GEMM has fewer workgroups
#: than the device runs at once (:func:`_splits`).
SPLITS = (4, 16)

#: Paths in order of preference: without tuning (``VKML_TUNE=off``) the first that
#: accepts and prefers a geometry runs it (:func:`heuristic`); tiled and blocked never
#: prefer (they come after direct): only the tuner picks them.
PATHS: list[type[Path]] = [WinogradPath, DepthwisePath, GemvPath, GemmSgPath, GemmPath,
                           DirectPath, TiledPath, BlockedPath]

#: The candidates of the tunable path ``convolution``: name -> (path, knobs other than
#: the defaults).  A path's own name is that path with the default knobs.  ``-stride``:
#: a strided 1x1 convolution's GEMM reading the whole input's copy with the stride
#: (no subsampled copy, ``gemm.subsampled``); they take only such convolutions.
CANDIDATES = {
    "winograd": ("winograd", {}),
    "winograd-gemm": ("winograd", {"gemm": "gemm"}),
    "winograd-narrow": ("winograd", {"blocks": "narrow", "gemm": "gemm"}),
    "winograd-blocked": ("winograd", {"gemm": "blocked"}),
    "winograd-sg": ("winograd", {"gemm": "sg"}),
    "winograd-cl": ("winograd", {"gemm": "cl"}),
    "winograd-v8": ("winograd", {"store64": True}),
    "depthwise": ("depthwise", {}),
    "depthwise-4x1": ("depthwise", {"dw_block": (4, 1)}),
    "depthwise-scalar": ("depthwise", {"dw_plane": False}),
    "depthwise-plane": ("depthwise", {"dw_whole": True}),
    "depthwise-rows": ("depthwise", {"dw_rows": (32, 28)}),
    "depthwise-rows8": ("depthwise", {"dw_rows": (8, 28)}),
    "depthwise-rows-v8": ("depthwise", {"dw_rows": (32, 28), "dw_v8": True}),
    "depthwise-v8": ("depthwise", {"store64": True}),
    "depthwise-plane-v8": ("depthwise", {"dw_whole": True, "store64": True}),
    "gemv": ("gemv", {}),
    "gemm_sg": ("gemm_sg", {}),
    "gemm_sg-g256": ("gemm_sg", {"relayout_groups": RELAYOUT_GROUPS[1]}),
    "gemm_sg-v8": ("gemm_sg", {"store64": True}),
    "gemm_sg-stride": ("gemm_sg", {"subsample": False}),
    "gemm_sg-span24": ("gemm_sg", {"sg_span": 24}),
    "gemm_sg-step": ("gemm_sg", {"sg_acc_run": False}),
    "gemm_sg-mb8": ("gemm_sg", {"sg_mb": 8}),
    "gemm": ("gemm", {}),
    "gemm-g256": ("gemm", {"relayout_groups": RELAYOUT_GROUPS[1]}),
    "gemm-v8": ("gemm", {"store64": True}),
    "gemm-narrow": ("gemm", {"blocks": "narrow", "relayout_groups": RELAYOUT_GROUPS[1]}),
    "gemm-stride": ("gemm", {"subsample": False}),
    **{f"{p}-split{k}": (p, {"split_k": k}) for p in ("gemm", "gemm_sg") for k in SPLITS},
    "tiled": ("tiled", {}),
    "tiled-32": ("tiled", {"tile": "32"}),
    "tiled-64x32": ("tiled", {"tile": "64x32"}),
    "tiled-f16": ("tiled", {"f16_arith": True}),
    **{"blocked" + ("" if k == "8x4" else "-" + k): ("blocked", {"block": k}) for k in BLOCKS},
    "direct": ("direct", {}),
}
#: Candidates that differ from their path's default only in knobs that are parameters,
#: not pipelines: timing them costs runs, no compilation (the fast list adds them).
_CHEAP = {"gemm_sg": ("gemm_sg-g256",), "gemm": ("gemm-g256",)}
#: Candidates the fast list times next to a heuristic choice although they compile a
#: pipeline of their own, where they accept the shape: depthwise-rows (faster than the
#: default block on lavapipe, slower on SwiftShader, so only timing tells),
#: depthwise-rows-v8 (its stores as u64vec4s, int64 devices) and depthwise-plane (whole
#: planes read as float4 texels: 7x7 and 14x14 maps, 10-35% ahead of the default block on
#: both CPU drivers in chains of one layer, bench/RESULTS.md); gemm_sg-span24 where its
#: default block loads rows of more than 24 input elements (a 7x7 stride-2 stem: fewer
#: pixels a lane, fewer registers; it takes no other shape); gemm_sg-step (gemm_sg's
#: products one channel and column tap at a time over the block: slower on most shapes
#: on lavapipe, faster on some 3x3 blocks of 12 pixels, so only timing tells, and only
#: there: :func:`_also_takes`).  The order is the fast list's, which decides a tie within
#: the timing's noise (``tuning._pick``): gemm_sg-mb8 before span24, as it joins only the
#: first layers it measured ahead on (MobileNetV2's 3x3 stem: 716-874 us against
#: gemm_sg-span24's 967-1116 in quiet tunings, tied with it in a loaded one, where span24,
#: listed first, took it; bench/RESULTS.md "1x1 blocks of 16 pixels"), and before the
#: heuristic's own choice where the layer is narrow (:data:`MB8_FIRST_COUT`).
_ALSO = {"depthwise": ("depthwise-rows", "depthwise-rows-v8", "depthwise-plane"),
         "gemm_sg": ("gemm_sg-mb8", "gemm_sg-span24", "gemm_sg-step")}
#: gemm_sg-step joins a fast list only for a unit-stride 3x3 whose default block holds
#: this many pixels: the one geometry where it was measured ahead of gemm_sg (1.15-1.59x
#: on 64->64 and 128->128 on 56x56, 64->64 on 48x48); on the stem, strided, 1x1 and
#: other 3x3 blocks it was 1.1-1.8x behind (bench/RESULTS.md, "gemm_sg's accumulation
#: order").  Elsewhere it compiled a pipeline and ran twice in each class of a model's
#: cold start (ResNet-18: 10 of its 11 classes) for nothing; ``full`` still times it.
STEP_NB = 12
#: gemm_sg-mb8 (blocks of at most 8 output channels: fewer accumulators, and on a 112-wide
#: row 16 pixels, stored as float4s, where the default takes 16 x 14 stored one by one)
#: joins a fast list only for a first layer: at most this many input channels a group
#: and several column taps, each loop iteration one channel (MobileNetV2's and
#: EfficientNet-B0's 3 -> 32 3x3 stride-2 stem, where it measured ahead; slower on the
#: 1x1 expansions: bench/RESULTS.md "Where the models lose").
MB8_CIN = 4
#: ... and leads that fast list (a tie within the timing's noise is its: ``tuning._pick``)
#: where the layer has at most this many output channels a group: chains of 40 on
#: lavapipe, gemm_sg / gemm_sg-mb8, 3 -> 32 3x3 stride 2 on 224x224 (MobileNetV2's and
#: EfficientNet-B0's stem) 844 / 643 us, 3 -> 16 on 320x320 (YOLOv8n's) 999 / 759, but
#: 3 -> 64 unpadded (SqueezeNet's) 1428 / 1589; a single timed run of a first layer
#: reads its first dispatch's wake-up in the driver (bench/RESULTS.md).
MB8_FIRST_COUT = 32


def _path_class(name: str) -> type[Path]:
    return next(p for p in PATHS if p.name == name)


def heuristic(op: CompiledOperator, geo: Geometry) -> list[str]:
    """The paths of :data:`PATHS` that accept the geometry, in the order ``VKML_TUNE=off``
    tries them: those that also prefer it first (from features and limits only)."""
    accepting = [cls for cls in PATHS if cls.accepts(op, geo)]
    return ([c.name for c in accepting if c.prefers(op, geo)]
            + [c.name for c in accepting if not c.prefers(op, geo)])


def _build(op, geo, name: str, pool=None) -> Path:
    """Candidate ``name`` built for the geometry with its knobs (and ``pool``, the
    pooling offered to a path that can absorb it); raises Declined where it does not
    take the geometry."""
    path, extra = CANDIDATES[name]
    knobs = knobs_of(extra)
    cls = _path_class(path)
    if not cls.accepts(op, geo, knobs):
        raise Declined(f"{path} does not accept the geometry")
    built = cls(op, geo, knobs, pool=pool) if cls.POOLS else cls(op, geo, knobs)
    built.candidate = name
    return built


def choose_path(op: CompiledOperator, geo: Geometry, force: str | None = None, pool=None,
                avoid: tuple = ()) -> Path:
    """The path that runs the geometry: ``force`` (a candidate name, see
    :data:`CANDIDATES`), else the tuner's choice (``VKML_TUNE``; tunable path
    ``convolution``), else the first of :func:`heuristic` that builds.  ``pool``: the
    pooling offered to the path (``CompiledConvolution(pool=)``).  ``avoid``: path names
    not to take (a forced candidate of one of them included): an OWNED filter with
    non-finite values avoids Winograd (``CompiledConvolution.initialize``)."""
    if force is not None and CANDIDATES.get(force, ("",))[0] in avoid:
        force = None
    if force is not None:
        if force not in CANDIDATES:
            raise ValidationError("path", f"must be None or one of {', '.join(CANDIDATES)}, "
                                  f"got {force!r}")
        try:
            return _build(op, geo, force, pool)
        except Declined as exc:
            raise UnsupportedError("convolution", f"path {force!r} does not take this "
                                   f"geometry ({exc})") from None
    order = [n for n in heuristic(op, geo) if n not in avoid]
    tuner = tuning.default_tuner()
    if geo.plain and len(order) > 1 and tuner.effective_mode() != "off":
        shape = tuning_shape(op.desc, laid=getattr(op, "input_from_host", False))
        c = tuner.choose(op.device, TUNABLE, shape)
        if c.source != "default" and CANDIDATES[c.name][0] not in avoid:
            try:
                built = _build(op, geo, c.name, pool)
            except Declined:
                pass
            else:
                op.observe_choice(c, shape)
                return built
    for name in order:
        try:
            return _build(op, geo, name, pool)
        except Declined:
            continue
    raise AssertionError("DirectPath accepts every geometry")


# -- tuning ---------------------------------------------------------------------------------
def _round(v: int) -> int:
    """``v`` rounded up to a power of two (the shape class's sizes)."""
    return 1 << max(0, int(v) - 1).bit_length()


def tensor_json(t: TensorDesc | None):
    if t is None:
        return None
    return {"dtype": t.data_type.name.lower(), "sizes": list(t.sizes),
            "strides": None if t.strides is None else list(t.strides), "flags": int(t.flags)}


def tensor_of(j) -> TensorDesc | None:
    if j is None:
        return None
    return TensorDesc(DataType[j["dtype"].upper()], tuple(j["sizes"]),
                      None if j.get("strides") is None else tuple(j["strides"]),
                      flags=TensorFlags(j.get("flags", 0)))


def tuning_shape(desc: ConvolutionOperatorDesc, laid: bool = False) -> dict:
    """The tuner's shape of a convolution: its descriptor as JSON (stored with the
    choice, so ``python -m vkml.tune --refresh`` can re-measure it); ``laid``: its input
    is written by the host into the planes a GEMM path pads it into
    (``CompiledConvolution(input_from_host=True)``), so the candidates are timed without
    that relayout (:func:`record_as_run`) and the shape is a class of its own.  The fused
    activation goes in by name only (default parameters) and :func:`shape_class` leaves
    it out: it does not change which path is fastest, but the candidates are timed with
    it because it is frozen into their kernels (``ACT``), so the winner's pipelines are
    the ones the operator then uses instead of a second compile of each."""
    g = lambda v: None if v is None else list(v)   # noqa: E731
    act = getattr(desc, "fused_activation", None)
    return {"input": tensor_json(desc.input_tensor), "filter": tensor_json(desc.filter_tensor),
            "bias": tensor_json(desc.bias_tensor), "output": tensor_json(desc.output_tensor),
            "mode": desc.conv_mode.name, "direction": desc.conv_direction.name,
            "strides": g(desc.strides), "dilations": g(desc.dilations),
            "start_padding": g(desc.start_padding), "end_padding": g(desc.end_padding),
            "output_padding": g(desc.output_padding), "group_count": int(desc.group_count),
            **({"activation": act.SPEC.name} if act is not None else {}),
            **({"laid": True} if laid else {})}


def _laid(shape) -> bool:
    """Whether a :func:`tuning_shape` says the host writes the input (``laid``)."""
    return isinstance(shape, dict) and bool(shape.get("laid"))


def desc_of_shape(shape) -> ConvolutionOperatorDesc:
    """:func:`tuning_shape`'s inverse (a descriptor passes through)."""
    if isinstance(shape, ConvolutionOperatorDesc):
        return shape
    t = lambda v: None if v is None else tuple(v)   # noqa: E731
    return ConvolutionOperatorDesc(
        tensor_of(shape["input"]), tensor_of(shape["filter"]), tensor_of(shape["bias"]),
        tensor_of(shape["output"]), ConvolutionMode[shape["mode"]],
        ConvolutionDirection[shape["direction"]], t(shape["strides"]), t(shape["dilations"]),
        t(shape["start_padding"]), t(shape["end_padding"]), t(shape["output_padding"]),
        shape["group_count"], shape.get("activation"))


def shape_from_workload(w) -> dict | None:
    """A bench workload (bench/workloads/convolution.json: ``input``, ``filter``,
    ``strides``, ``dilations``, ``start_padding``, ``end_padding``, ``groups``,
    ``direction``, ``dtype``; a bias is bound) as the tuner's shape; None for another op."""
    if not isinstance(w, dict) or w.get("op") != "convolution":
        return None
    dt = DataType[str(w.get("dtype", "float32")).upper()]
    x, f = tuple(w["input"]), tuple(w["filter"])
    back = str(w.get("direction", "forward")).upper() == "BACKWARD"
    cout = f[1] * int(w.get("groups", 1)) if back else f[0]
    kw = {k: tuple(w[k]) for k in ("strides", "dilations", "start_padding", "end_padding")
          if w.get(k) is not None}
    direction = ConvolutionDirection.BACKWARD if back else ConvolutionDirection.FORWARD
    probe = ConvolutionOperatorDesc(TensorDesc(dt, x), TensorDesc(dt, f), None,
                                    TensorDesc(dt, x), direction=direction,
                                    group_count=int(w.get("groups", 1)), **kw)
    out = (x[0], cout) + tuple(probe.expected_output_sizes()[2:])
    bias = TensorDesc(dt, (1, cout) + (1,) * (len(x) - 2))
    return tuning_shape(ConvolutionOperatorDesc(
        TensorDesc(dt, x), TensorDesc(dt, f), bias, TensorDesc(dt, out), direction=direction,
        group_count=int(w.get("groups", 1)), **kw))


def work(shape) -> float:
    """A convolution's FLOPs (the tuner's ``work_fn``: a time stored for one shape of a
    class, scaled by this, predicts another's)."""
    return float(Geometry.of(desc_of_shape(shape)).flops)


def shape_class(desc: ConvolutionOperatorDesc) -> str:
    """Convolutions that share one tuned choice: same direction, data type, kernel,
    stride, dilation, group kind (one, depthwise, other), layout (packed or not), the
    OWNED_BY_DML inputs (bound once: a path that transforms the filter then pays no
    transform per run, so the choice differs), and batch, channels in and out and output
    sizes within the same power of two; an input the host writes (:func:`tuning_shape`'s
    ``laid``) is a class of its own.  ``desc``: a descriptor or :func:`tuning_shape`."""
    laid = _laid(desc)
    desc = desc_of_shape(desc)
    g = Geometry.of(desc)
    grp = "1" if g.groups == 1 else "dw" if g.cin_per_group == 1 else f"g{_round(g.groups)}"

    def dims(v):
        return "x".join(str(x) for x in v)
    owned = "".join(str(i) for i in owned_slots(desc.inputs()))
    return (f"{'bwd' if g.backward else 'fwd'}-{g.dtype.name.lower()}-n{_round(g.n)}"
            f"-c{_round(g.c_in)}-{_round(g.c_out)}-g{grp}-o{dims(_round(v) for v in g.out_size)}"
            f"-k{dims(g.kernel)}-s{dims(g.stride)}-d{dims(g.dilation)}"
            f"{'' if g.packed else '-strided'}{f'-owned{owned}' if owned else ''}"
            f"{'-host' if laid else ''}")


def _fast(desc: ConvolutionOperatorDesc, device) -> tuple[str, ...]:
    """The fast list of a shape: the heuristic's choice and its runner-ups that compile
    nothing new (its knob variants, :data:`_CHEAP`), plus the families the device itself
    ranks strong (:func:`strong_families`) or clearly ahead of the heuristic's choice
    (:func:`_strong`) that accept the shape, less the heuristic's choice where a strong
    variant of its own path outranks it (:func:`_outranked`).
    Other paths would compile their own pipelines, each about as long as the first
    call's, so they are timed in ``full`` mode only (``python -m vkml.tune``), except for
    an OWNED_BY_DML filter (below)."""
    desc = desc_of_shape(desc)
    probe = _Probe(device, desc)
    order = heuristic(probe, probe.geo)
    fast = tuple(order[:1]) + _CHEAP.get(order[0], ())
    for name in _ALSO.get(order[0], ()):
        path, extra = CANDIDATES[name]
        if (_path_class(path).accepts(probe, probe.geo, knobs_of(extra))
                and _also_takes(name, probe)):
            fast += (name,)
    times = family_times(device)       # (read once: the strong families and _outranked)
    ranked = {n: t for n, t in times.items() if n not in _family_once(device)}
    strong = _strong(times, order[0])
    if 1 in owned_slots(desc.inputs()):
        # an OWNED_BY_DML filter: the operator is compiled for many runs of one filter (a
        # graph, a model), and paths that transform the filter pay it once, so every other
        # accepting path is timed too (but direct: slow wherever another path accepts,
        # and the tuner-only paths unless the device ranks them strong)
        # -- less the families the device's own ranking puts clearly behind (_ranked_out)
        fast += tuple(n for n in order[1:] if n != "direct" and n not in TUNER_ONLY
                      and not _ranked_out(n, ranked, probe))
    for name in strong:
        if name == "blocked":          # the block whose channels fit the group's
            name = _blocked_fit(probe.geo.cout_per_group)
        path = CANDIDATES[name][0]
        if name not in fast and path in order:
            fast += (name,)
    if _outranked(order[0], fast, times if strong else {}, probe):
        fast = tuple(n for n in fast if n != order[0])
    if "gemm_sg-mb8" in fast and probe.geo.cout_per_group <= MB8_FIRST_COUT:
        fast = ("gemm_sg-mb8",) + tuple(n for n in fast if n != "gemm_sg-mb8")
    return _far_behind(fast, ranked) + _splits(probe, ranked)


def _splits(probe, ranked: dict) -> tuple[str, ...]:
    """The split-K candidates a fast list times (after the family ranking's cut: the
    reference convolution fills a device that a small plane does not): those of one GEMM
    path, the one the device's ranking (``ranked``) puts ahead (unranked: gemm_sg, else
    gemm), that accepts a split of the shape with at least
    :data:`~.gemm.SPLIT_MIN_SLICE_K` products a slice, and only where the GEMM's grid
    unsplit has fewer workgroups than the device runs at once (its measured
    :func:`~vkml.ops.concurrent_width.concurrent_width`, asked for only then): a CPU
    driver, a few workgroups wide, compiles and times none of them."""
    g = probe.geo
    k = g.cin_per_group * math.prod(g.kernel)
    for path in sorted(("gemm_sg", "gemm"), key=lambda p: ranked.get(p, math.inf)):
        names = tuple(f"{path}-split{s}" for s in SPLITS if k >= SPLIT_MIN_SLICE_K * s
                      and _path_class(path).accepts(probe, g, knobs_of({"split_k": s})))
        if names:
            break
    if not names or gemm_workgroups(probe, g) >= concurrent_width(probe.device):
        return ()
    return names


def _family_of(name: str, times: dict) -> str:
    """The family of the ranking (:data:`FAMILY`) candidate ``name`` belongs to: itself
    where the ranking times it (winograd-blocked), else its path (gemm-g256: gemm)."""
    return name if name in times else CANDIDATES[name][0]


def _far_behind(fast: tuple, ranked: dict) -> tuple:
    """The fast list less the candidates whose family the device's ranking (``ranked``:
    times of more than one run) puts beyond :data:`FAR_FACTOR` of another listed
    candidate's family, the heuristic's choice included (every listed one takes the
    shape).  On SwiftShader gemm ranked 26x behind blocked, and each class's first runs
    of gemm and its g256 twin (0.1-15 s each on ResNet-18's layers, 4-12x behind blocked
    in every class) were about half its cold start (bench/RESULTS.md "Whole models")."""
    fam = {n: ranked.get(_family_of(n, ranked)) for n in fast}
    known = [t for t in fam.values() if t is not None]
    if not known:
        return fast
    line = FAR_FACTOR * min(known)
    return tuple(n for n in fast if fam[n] is None or fam[n] <= line)


def _also_takes(name: str, probe) -> bool:
    """Whether an :data:`_ALSO` candidate the shape accepts joins its fast list: all but
    gemm_sg-step, which joins a unit-stride 3x3 of :data:`STEP_NB`-pixel blocks only, and
    gemm_sg-mb8, a first layer's (:data:`MB8_CIN`) only."""
    g = probe.geo
    if name == "gemm_sg-mb8":
        return g.cin_per_group <= MB8_CIN and g.kernel[2] > 1
    if name != "gemm_sg-step":
        return True
    return (g.kernel[1:] == (3, 3) and g.stride[1:] == (1, 1) and g.dilation[1:] == (1, 1)
            and GemmSgPath.default_nb(probe, g) == STEP_NB)


def _ranked_out(name: str, times: dict, probe) -> bool:
    """Whether path ``name``, an OWNED_BY_DML filter's extra candidate, stays out of a fast
    list: the device's family timing (``times``: :func:`family_times` less
    :func:`_family_once`) puts it beyond :data:`STRONG_FACTOR` of the fastest family
    that takes the shape.  Each such extra compiles its own pipelines and runs at least
    twice, and on a model the extras were most of a cold start's tuning (ResNet-18 on
    lavapipe: gemm timed in all 11 classes, 2-12x behind gemm_sg or Winograd in each,
    bench/RESULTS.md "Whole models"); a family this far behind on the reference is
    measured out, not guessed out.  Nothing is left out without a ranking (tuning off)
    or for a family the ranking does not time."""
    if name not in times:
        return False
    taking = [t for n, t in times.items()
              if _path_class(CANDIDATES[n][0]).accepts(probe, probe.geo,
                                                       knobs_of(CANDIDATES[n][1]))]
    return bool(taking) and times[name] > STRONG_FACTOR * min(taking)


def _blocked_fit(cout_per_group: int) -> str:
    """The blocked candidate a fast list times: one output channel per invocation for
    depthwise-like groups (1x8), four for a few channels (4x4), else the default 8x4."""
    return "blocked-1x8" if cout_per_group == 1 else (
        "blocked-4x4" if cout_per_group <= 4 else "blocked")


#: Candidates no heuristic takes (their paths never prefer, or a knob the heuristic
#: does not set): they join a fast list where the device ranks their family strong.
TUNER_ONLY = ("tiled", "blocked", "winograd-blocked")
#: The reference convolution every family is timed on once per device
#: (tunable path ``convolution_family``): 3x3, 32 -> 32 channels over 24x24 (36 of
#: Winograd's tiles), small enough for the slowest device to time in a second.
FAMILY_SHAPE = shape_from_workload({"op": "convolution", "input": [1, 32, 24, 24],
                                    "filter": [32, 32, 3, 3], "start_padding": [1, 1],
                                    "end_padding": [1, 1]})
#: A family within this factor of the fastest on the reference is strong.
STRONG_FACTOR = 1.5
#: A listed candidate whose family the reference puts beyond this factor of another
#: listed one's leaves a fast list (:func:`_far_behind`), even the heuristic's choice:
#: twice the tuner's own cut for a slow warm-up (WARM_CUTOFF), on a ranking whose cut
#: families ran twice (``recheck_cuts``).
FAR_FACTOR = 2 * tuning.WARM_CUTOFF


def family_times(device) -> dict:
    """This device's own timing of each family on the reference convolution
    (:data:`FAMILY_SHAPE`, tunable path ``convolution_family``, measured once per device
    and stored like any choice): ``{candidate: seconds}``; empty with tuning off."""
    c = tuning.reference(device, FAMILY, FAMILY_SHAPE)
    return dict(c.times or {}) if c is not None else {}


def _family_once(device) -> set:
    """The families :func:`family_times` timed by one run only (the entry's ``once``;
    an entry stored before it, every one dropped by the fast tuning's cuts,
    :mod:`vkml.tuning`): one disturbed run on a loaded CPU driver put Winograd at 14x
    gemm_sg there, so such a time leaves no candidate out (:func:`_ranked_out`,
    :func:`_far_behind`)."""
    c = tuning.reference(device, FAMILY, FAMILY_SHAPE)
    if c is None:
        return set()
    e = tuning.default_tuner().lookup(c.key) or {}
    return set(e.get("once", e.get("dropped", ())))


def strong_families(device) -> tuple[str, ...]:
    """The tuner-only families (:data:`TUNER_ONLY`) that :func:`family_times` puts within
    :data:`STRONG_FACTOR` of the fastest family; none with tuning off.  This is how a
    device picks which kernel families its fast lists try -- never by its type or name
    (the same family is several times faster than gemm on one CPU driver and several
    times slower on another)."""
    return _strong(family_times(device))


def _strong(times: dict, first: str | None = None) -> tuple[str, ...]:
    """:func:`strong_families` of given family times (none where there are none), and
    with ``first`` (the heuristic's choice for a shape) the tuner-only families ahead of
    ``first``'s family on the reference by :data:`STRONG_FACTOR` as well: the family that
    would run the shape is what they must beat (by a clear lead: each one timed compiles
    its own pipelines).  Ranked only against the fastest family, a loaded CPU driver
    left blocked out (far behind winograd-blocked under load, near it quiet, and still
    well ahead of gemm), and a strided or 1x1 convolution, which Winograd does not take,
    then had gemm alone timed and ran it several times slower than blocked
    (bench/RESULTS.md, "Whole models")."""
    if not times:
        return ()
    best = min(times.values())
    line = max(STRONG_FACTOR * best, times.get(first, 0.0) / STRONG_FACTOR)
    return tuple(n for n in TUNER_ONLY if times.get(n, math.inf) <= line)


def _outranked(first: str, fast: tuple, times: dict, probe) -> bool:
    """Whether the heuristic's ``first`` choice stays out of a fast list: the device's
    family timing puts it beyond :data:`STRONG_FACTOR` of the fastest family while a
    variant of its own path in the list (the same transforms, another GEMM:
    winograd-blocked for winograd) is strong and takes the shape: timing it anyway
    would compile its GEMM and run it twice only to drop it."""
    if first not in times:
        return False
    best = min(times.values())
    if times[first] <= STRONG_FACTOR * best:
        return False
    path = CANDIDATES[first][0]
    for name in fast:
        other, extra = CANDIDATES[name]
        if (name != first and other == path and times.get(name, math.inf) <= STRONG_FACTOR * best
                and _path_class(path).accepts(probe, probe.geo, knobs_of(extra))):
            return True
    return False


class _Probe:
    """What ``accepts`` reads of an operator, without building one."""

    def __init__(self, device, desc):
        self.device, self.desc, self.ctx = device, desc, device.context
        self.features = self.ctx.features
        self.geo = Geometry.of(desc)


def _run(device, seq, cand, desc):
    """Record candidate ``cand`` of a convolution on zeroed tensors into ``seq``, as it
    will run (:func:`record_as_run`)."""
    from . import CompiledConvolution     # (the package, which imports this module first)
    # UnsupportedError where the candidate does not take the shape: declined
    op = CompiledConvolution(device, desc_of_shape(desc), path=cand.name)
    made = [op]
    try:
        record_as_run(device, seq, op, made, laid=_laid(desc))
    except BaseException:
        release_all(made)
        raise
    return lambda: release_all(made)


def _prefetch(device, cand, shape) -> None:
    """Build candidate ``cand`` for ``shape`` and release it: its pipelines, requested
    inside the tuner's batch, go on compiling (the tuner's ``prefetch_fn``)."""
    from . import CompiledConvolution
    CompiledConvolution(device, desc_of_shape(shape), path=cand.name).release()


def record_as_run(device, seq, op, made: list, output=None, laid: bool = False):
    """Record compiled convolution ``op`` into ``seq`` on fresh device tensors, as it will
    run: OWNED_BY_DML inputs bound once by :meth:`CompiledConvolution.initialize` (their
    transforms are not timed), the others bound at execution; ``output`` (None: a fresh
    tensor) receives ``op.desc``'s output; ``laid``: where the op's path takes its input
    from the host (``host_input``), without the input's relayout.  What it allocates joins
    ``made``; returns the output tensor."""
    ins, owned = [], {}
    for i, t in enumerate(op.desc.inputs()):
        if t is None:
            ins.append(None)
            continue
        a = empty_for(device, t)
        made.append(a)
        if i in op.owned_inputs:
            owned[i] = a
            ins.append(None)
        else:
            ins.append(a)
    if owned:
        op.initialize(owned)
    if output is None:
        output = empty_for(device, op.desc.outputs()[0])
        made.append(output)
    laid = laid and op.host_input() is not None
    op.record(seq, ins, [output], **({"laid": True} if laid else {}))
    return output


#: Convolution candidates timed within this factor of each other tie (:mod:`vkml.tuning`,
#: ``tie_margin``): the fast list's first (the heuristic's choice) or the previous choice
#: keeps the shape.  On the shared CPU drivers two kernels this close swap places from
#: one process to the next (gemm_sg and its g256 twin on SqueezeNet's classifier, one
#: kernel with two re-layout grids), so the fastest alone picked by the load.
TIE_MARGIN = 1.1

#: The tunable path ``convolution`` (:mod:`vkml.tuning`): its candidates are
#: :data:`CANDIDATES` that accept a shape, its shape class :func:`shape_class`, its fast
#: list :func:`_fast` (so ``VKML_TUNE=fast`` compiles little beyond what the heuristic's
#: choice compiles anyway); the per-shape default is :func:`heuristic`'s first.
#: The families the device ranks once (:func:`strong_families`): a path with its default
#: knobs each, timed on :data:`FAMILY_SHAPE` in every mode but off.
FAMILY = tuning.register_path(
    "convolution_family", ["gemm_sg", "gemm", "winograd", "winograd-blocked", "tiled",
                           "blocked"], "gemm", lambda _shape: "reference", _run,
    examples=[FAMILY_SHAPE], prefetch_fn=_prefetch, recheck_cuts=True)

TUNABLE = tuning.register_path(
    "convolution", list(CANDIDATES), "direct", shape_class, _run, fast_fn=_fast,
    from_workload=shape_from_workload, work_fn=work, tie_margin=TIE_MARGIN,
    prefetch_fn=_prefetch,
    examples=[shape_from_workload({"op": "convolution", "input": [1, 64, 56, 56],
                                   "filter": [64, 64, 3, 3], "start_padding": [1, 1],
                                   "end_padding": [1, 1]})])

"""Resample: ``DML_RESAMPLE_OPERATOR_DESC``, ``DML_RESAMPLE1_OPERATOR_DESC``,
``DML_UPSAMPLE_2D_OPERATOR_DESC`` and ``vkml.resample``.

Kernel: ``glsl/resample.comp``, a :class:`~vkml.ops.grid.BoxKernel` over the output box
(windows past maxStorageBufferRange and split dispatches come from grid.py): an
invocation computes 8 neighbouring outputs of the last dimension (compile-time, so its
loops unroll into registers; stored as two vec4s where aligned), each from its input
coordinate ``o * a + b`` (a = 1 / Scale, b = -OutputPixelOffset / Scale -
InputPixelOffset, folded on the host in float64 and rounded to float32 once).  Float32
reads through an R32F texel buffer (lavapipe vectorizes texel fetches, not storage
loads) or storage buffers, chosen by the tuner (``resample_read``) where the input fits
``maxTexelBufferElements``; the constructor's ``read=`` forces one.  Float32's eight
outputs are stored as one u64vec4 where the device's ``store_width`` timing says so.
Float16 is stored as halves (or packed in 32-bit words without 16-bit storage),
INT8/UINT8 as bytes (or packed without 8-bit storage).

Where every dimension's index map (as the kernel computes it, :meth:`CompiledResample.indices`)
is exactly ``o // s`` for an integer s (1: a copy), the resample is a copy of the input
viewed with zero strides: output ``(..., H, s_h, W, s_w)`` reads input strides
``(..., W, 0, 1, 0)``.  The resample then owns a copy kernel that moves whole words an
invocation where the general kernel computes every output's coordinate: an element-wise
IDENTITY of that view where the last dimension is not resampled (its rows contiguous
both sides), else for 32-bit elements glsl/permute.comp's rows kernel reading each input
element of a row s_w times (:meth:`CompiledResample._plan_copy`); 8/16-bit elements
resampled along the last dimension keep the general kernel.  Deciding it from the
computed map (no reasoning about modes) keeps it exact for any offsets or ONNX modes
giving that map; ``path="general"`` forces the general kernel.

Before the copy, the rows kernel (``glsl/resample_rows.comp``,
:meth:`CompiledResample._plan_rows`): where the last dimension is upsampled by 2 with a
map of period 2 (output 2k + j reads input ``clamp(k + D[j])``, and for linear
``clamp(k + D[j] + 1)`` weighted ``WT[j]``: pixel centres and ONNX's half_pixel,
asymmetric, nearest ``o // 2``), whatever the other dimensions' maps: an invocation reads
input quads of one or two input rows and writes 16 outputs of a row as whole vectors
(nearest: to every output row reading that input row, where the map of the dimension
before the last is ``o // s``; nearest also on rows of whole input pairs, its ``near2``
variants).  Its map is compared on the host with the general kernel's at every output
coordinate of the last dimension (:func:`rows_phases`), so it runs only where the two
kernels read the same inputs with the same weights.  Nearest moves the same bits as the
general kernel; linear combines the two input rows before
interpolating along the row (three operations an input, not an output), so it may differ
from the general kernel by a float32 rounding.  Linear with the dimension before the
last upsampled by 2 with a period-2 map too (:meth:`CompiledResample._pair_phases`, the
same check along that dimension) runs its PAIR mode: an invocation computes pairs of
output rows walking down the input rows, up to :data:`PAIR_ROWS` pairs (each input row
read once, where one pair an invocation read three for two output rows).  Nearest walks
down :data:`NEAR_ROWS` input rows where the map of the dimension before the last is
``o // s`` (SwiftShader wants 8: each invocation's fixed cost, the tuner's ``-walk8``
candidates; lavapipe 2).  Its read (texels or storage loads) and nearest's walk are
the tunable path ``resample_rows_read``.  ``path="rows"`` / ``"copy"`` force one where
it applies, ``"rows1"`` the rows kernel without PAIR; ``walk=`` nearest's walk.  Rows
of fewer than 8 invocations (linear: 5) share a workgroup row: :meth:`CompiledResample._spread`,
``spread=`` forces a count.
"""
from __future__ import annotations

import math

import numpy as np

from ..dml.data_type import DataType
from ..dml.element_wise import ElementWiseIdentityOperatorDesc
from ..dml.operator import as_real, enum_of
from ..dml.resample import (InterpolationMode, Resample1OperatorDesc, ResampleOperatorDesc,
                            Upsample2dOperatorDesc)
from ..dml.tensor_desc import TensorDesc, as_ints
from ..intmath import ceil_div, round_up
from ..errors import ArgumentTypeError, ValidationError
from ..runtime import FORMAT_RG32_UINT, FORMAT_RGBA32_SFLOAT, FORMAT_RGBA32_UINT, Bind
from ..runtime.blocks import pack
from .. import tuning
from . import permute
from .base import check_choice, implements
from .element_wise import CompiledElementWise
from .functional import as_array, pick_device, run
from .grid import (BOX_CONSTANTS, GRID_LIMIT, BoxKernel, box_grid, div_magic,
                   record_on_scratch, split_groups, timed_read_candidate, words8)
from .store_width import wide_stores

__all__ = ["resample", "onnx_resize_geometry"]

_CONSTS = BOX_CONSTANTS + ("VEC_STORE", "MODE", "LIN_MASK")
#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = dict.fromkeys(
    ["resample_f32", "resample_f32_texel", "resample_f32_u64", "resample_f32_texel_u64",
     "resample_f16", "resample_f16_packed",
     "resample_i8", "resample_i8_packed", "resample_u8", "resample_u8_packed"], _CONSTS)
VARIANTS.update(dict.fromkeys(
    [f"resample_rows_{m}_{r}{w}" for m in ("near", "near2", "lin", "pair")
     for r in ("texel", "ssbo") for w in ("", "_u64")],
    ("LOCAL_SIZE_X", "LOCAL_SIZE_Y", "RANK", "LIN_MASK", "PHASE_D0", "PHASE_D1", "REP_H",
     "PHASE_H0", "PHASE_H1", "FULL", "ROWS_K", "WT0", "WT1", "WH0", "WH1", "SPREAD",
     "SPREAD_X")))
#: Input quads an invocation of glsl/resample_rows.comp (its compile-time Q).
ROWS_Q = 2
#: PAIR mode: at most this many pairs of output rows an invocation (its REP_H / 2).
PAIR_ROWS = 8
#: Nearest: at most this many input rows an invocation (its ROWS_K) by default; the
#: tuner's candidates (:data:`ROWS_READ_PATH`) walk 2 or 8.
NEAR_ROWS = 2
#: |a| and |b| are kept below this, so ``o * a + b`` stays finite in float32 for every
#: 32-bit coordinate (a scale of 1e-38 reads the input's first element, as any tiny one).
_COORD_CAP = 2.0 ** 96


def coordinate_map(scale: float, in_offset: float, out_offset: float) -> tuple[float, float]:
    """(a, b), float32: input coordinate ``o * a + b`` for output coordinate o, the page's
    ``OutputX = (InputX + InputPixelOffset) * Scale + OutputPixelOffset`` solved for InputX."""
    a = 1.0 / scale
    b = -out_offset / scale - in_offset
    a, b = (float(np.float32(min(max(v, -_COORD_CAP), _COORD_CAP))) for v in (a, b))
    return a, b


def input_coordinates(o, a: float, b: float) -> np.ndarray:
    """The kernel's float32 ``o * a + b`` (no fused multiply-add: ``precise``)."""
    o = np.asarray(o, dtype=np.float32)
    return (o * np.float32(a)).astype(np.float32) + np.float32(b)


def _vec4s(values) -> list:
    """Per-dimension values padded with zeros to whole vec4s (the blocks' arrays)."""
    return list(values) + [0] * (-len(values) % 4)


@implements(Resample1OperatorDesc, ResampleOperatorDesc, Upsample2dOperatorDesc)
class CompiledResample(BoxKernel):
    """Resample on this device: see the module doc."""

    #: "texel" (float32 through an R32F uniform texel buffer) or "ssbo" (a path the
    #: tensor or device does not allow falls back to "ssbo"); None: the tuner chooses
    #: (:data:`READ_PATH`); "auto": texel where the whole input fits
    #: maxTexelBufferElements, without measuring.  The constructor's ``read=`` sets it.
    force_read: str | None = None
    #: Output elements along the last dimension per invocation: always 8 (the kernel's
    #: compile-time V), the grid's x along the last dimension only.
    vec: int = 8
    x_last_only = True
    #: None (the rule: the rows kernel, else the broadcast copy, where the index maps
    #: allow them, module doc), "rows" or "copy" (that path where it applies, else the
    #: general kernel), "rows1" (the rows kernel without PAIR: one output row an
    #: invocation) or "general" (always glsl/resample.comp); the constructor's ``path=``
    #: sets it.
    force_path: str | None = None
    #: The broadcast copy this resample runs as, or None (glsl/resample.comp).
    inner: CompiledElementWise | None = None
    #: The broadcast copy of 32-bit elements on glsl/permute.comp, or None.
    copy: permute.StridedCopy | None = None
    #: The rows kernel's plan (:meth:`_plan_rows`), or None.
    rows: dict | None = None

    #: Nearest on the rows kernel: at most this many input rows an invocation (None: the
    #: tuner's :data:`ROWS_READ_PATH` candidate, else :data:`NEAR_ROWS`); ``walk=`` sets
    #: it.
    force_walk: int | None = None
    #: The rows kernel: row groups sharing a workgroup row (its SPREAD; None: the rule of
    #: :meth:`_spread`, 1: none); ``spread=`` sets it.
    force_spread: int | None = None

    def __init__(self, device, desc, read: str | None = None, path: str | None = None,
                 walk: int | None = None, spread: int | None = None):
        check_choice("path", path, ("copy", "rows", "rows1", "general"))
        self.force_path = path
        self.force_walk = walk
        self.force_spread = spread
        super().__init__(device, desc, read=read)

    @property
    def path(self) -> str:
        """The path this resample runs: "copy", "rows" or "general"."""
        if self.inner is not None or self.copy is not None:
            return "copy"
        return "rows" if self.rows is not None else "general"

    def build(self) -> None:
        d = self.desc
        src, dst = d.input_tensor, d.output_tensor
        scales, ins, outs = d.geometry()
        dt = src.data_type
        if dt in (DataType.INT8, DataType.UINT8):
            family = "resample_" + ("i8" if dt == DataType.INT8 else "u8")
            self.kernel = family + ("" if self.features.get("storage8") else "_packed")
            self.in_esize = self.out_esize = 1
            self.in_bytes = self.in_bind = src.total_tensor_size_in_bytes
            self.out_bytes = dst.total_tensor_size_in_bytes
            self.rank = dst.dimension_count
            self.box = list(dst.sizes)
            self.box_out_strides = list(dst.element_strides)
        else:
            self.float_box("resample")
        self.in_sizes = list(src.sizes)
        self.in_strides = list(src.element_strides)
        self.coords = [coordinate_map(s, i, o) for s, i, o in zip(scales, ins, outs)]
        self.linear = d.mode == InterpolationMode.LINEAR
        # dimensions whose weights can be non-zero: elsewhere linear is nearest's floor(x)
        self.lin_mask = 0
        for k, ((a, b), n) in enumerate(zip(self.coords, self.in_sizes)):
            if self.linear and n > 1 and not (a == 1.0 and b == 0.0):
                self.lin_mask |= 1 << k
        # the rows kernel first: a 2x nearest ran 3.5x the copy's speed on lavapipe and
        # 4.9x on SwiftShader (bench/RESULTS.md, Findings)
        if self.force_path in (None, "rows", "rows1") and self._plan_rows():
            return
        factors = integer_factors(self) if self.force_path in (None, "copy") else None
        if factors is not None and self._plan_copy(factors):
            return
        self.local = min(256, self.workgroup_size)
        self.windows = self.plan_windows()
        texel_ok = (self.kernel == "resample_f32" and self.windows is None
                    and self.in_bytes // 4 <= self.ctx.limits["maxTexelBufferElements"])
        read = "texel" if texel_ok and self.force_read in (None, "auto", "texel") else "ssbo"
        if self.force_read is None and texel_ok:
            read = self.tuned_read(READ_PATH, read_shape(d), {"ssbo": True}) or read
        self.apply_read(read)
        if self.kernel.startswith("resample_f32") and wide_stores(self.device):
            self.kernel += "_u64"
        n = self.rank
        self.params = self.upload(np.frombuffer(pack(
            self.kernel, "Params", out_stride=_vec4s(self.box_out_strides),
            in_stride=_vec4s(self.in_strides), in_size=_vec4s(self.in_sizes),
            coord_a=_vec4s([a for a, _ in self.coords]),
            coord_b=_vec4s([b for _, b in self.coords])), np.uint8))
        self.consts = {"RANK": n, "MODE": int(self.linear), "LIN_MASK": self.lin_mask}

    def _plan_copy(self, factors) -> bool:
        """The broadcast copy (module doc) where it applies: where the last dimension is
        not resampled, an element-wise IDENTITY (its row path: rows contiguous both
        sides; faster than the rows kernel on both drivers); else, for 32-bit elements,
        glsl/permute.comp's rows kernel, whose REP reads each input element of a row s
        times (quad reads where input rows are whole uvec4s)."""
        src, dst = self.desc.input_tensor, self.desc.output_tensor
        if factors[-1] == 1:
            self.inner = CompiledElementWise(self.device, ElementWiseIdentityOperatorDesc(
                *broadcast_view(src, dst, factors)))
            return True
        geo = rows_geometry(src, dst, factors) if src.data_type.size == 4 else None
        lim = self.ctx.limits
        if geo is None or max(self.in_bytes, self.out_bytes) > lim["maxStorageBufferRange"]:
            return False
        # whole input rows of whole uvec4s: the kernel's quad reads
        quad = (geo["in"][-1] == 1 and factors[-1] <= 8
                and dst.sizes[-1] // factors[-1] % 4 == 0
                and all(st % 4 == 0 for st in geo["in"][:-1]))
        unit = 16 if quad else 4
        texel = ceil_div(self.in_bytes, unit) <= lim["maxTexelBufferElements"]
        read = ("texel" if texel else "ssbo") + ("4" if quad else "")
        self.copy = permute.StridedCopy(self, geo, read, self.in_bytes, self.out_bytes)
        return True

    def _plan_rows(self) -> bool:
        """glsl/resample_rows.comp where it applies (its doc): float32 (nearest: any
        32-bit type), the last dimension contiguous both sides, of whole input quads
        (nearest: or pairs, the ``near2`` variants) and upsampled by 2 with the map the
        kernel assumes (:func:`rows_phases`; nearest: ``o // 2``), every other input
        stride a whole unit (quad or pair) and output stride a whole quad, linear
        weights along exactly the last two dimensions, whole tensors in one binding."""
        src = self.desc.input_tensor
        if src.data_type.size != 4 or (self.linear and src.data_type != DataType.FLOAT32):
            return False
        n, k = self.in_sizes[-1], self.rank - 1
        # rows of 10 or 14 (YOLOv8n's and U-Net's narrowest upsamples) are whole pairs
        unit = 4 if n % 4 == 0 else 2 if n % 2 == 0 and not self.linear else 0
        if (not unit or self.in_strides[-1] != 1 or self.box_out_strides[-1] != 1
                or self.box[-1] != 2 * n
                or (self.linear and (k < 1 or self.lin_mask != 3 << (k - 1)))
                or any(st % unit for st in self.in_strides[:-1])
                or any(st % 4 for st in self.box_out_strides[:-1])):
            return False
        phases = rows_phases(self)
        lim = self.ctx.limits
        if (phases is None or (not self.linear and phases[0][0] | phases[1][0])
                or max(self.in_bytes, self.out_bytes) > lim["maxStorageBufferRange"]):
            return False       # nearest: the kernel reads input k for outputs 2k, 2k + 1
        fits = ceil_div(self.in_bytes, 4 * unit) <= lim["maxTexelBufferElements"]
        read = "texel" if fits and self.force_read in (None, "auto", "texel") else "ssbo"
        walk = self.force_walk or NEAR_ROWS
        if self.force_read is None and (fits or not self.linear):
            # the drivers disagree (lavapipe: texel reads, short walks; SwiftShader:
            # storage reads, walks of 8 rows): measured, bench/RESULTS.md
            name = self.tuned_read(ROWS_READ_PATH, read_shape(self.desc),
                                   {c.name: fits or "ssbo" in c.name
                                    for c in ROWS_READ_PATH.candidates})
            if name:
                read = ROWS_READ_PATH.candidate(name).params["read"]
                walk = self.force_walk or ROWS_READ_PATH.candidate(name).params["walk"]
        pair = self._pair_phases()
        mode = "pair" if pair else "lin" if self.linear else "near" if unit == 4 else "near2"
        kernel = f"resample_rows_{mode}_{read}" + ("_u64" if wide_stores(self.device) else "")
        (d0, w0), (d1, w1) = phases
        (h0, wh0), (h1, wh1) = pair or ((0, 0.0), (0, 0.0))
        # PAIR: an invocation walks down PAIR_ROWS pairs of output rows where they divide
        # the input rows (fewer loads and less index work a row: bench/RESULTS.md)
        rep_h = 2 * _rows_an_invocation(self.in_sizes[k - 1], PAIR_ROWS) if pair else 1
        rows_k = 1
        if not self.linear and k >= 1:
            # output rows sharing their input row: one invocation stores them all, and
            # where the map is o // rep_h, walks down NEAR_ROWS input rows
            factor = integer_factor(self.indices(k - 1, np.arange(self.box[k - 1]))[0])
            rep_h = factor or 1
            if factor:
                rows_k = _rows_an_invocation(self.box[k - 1] // factor, walk)
        self.rows = {"kernel": kernel, "read": read, "params": self.upload(np.frombuffer(pack(
            kernel, "Params", out_stride=_vec4s(self.box_out_strides),
            in_stride=_vec4s(self.in_strides), in_size=_vec4s(self.in_sizes),
            coord_a=_vec4s([a for a, _ in self.coords]),
            coord_b=_vec4s([b for _, b in self.coords]),
            phase=[n // unit, 0, 0, 0]), np.uint8)),
                     # input elements a unit of the row, and units an invocation
                     "unit": unit, "group": ROWS_Q if unit == 4 else 2 * ROWS_Q,
                     "d": (d0, d1), "h": (h0, h1), "rep_h": rep_h, "rows_k": rows_k,
                     "walk": walk, "pair": bool(pair),
                     # WT[0], WT[1], WH[0], WH[1]: the kernel's frozen constants
                     "w": tuple(float(v) for v in (w0, w1, wh0, wh1)),
                     "full": self._full_stores(kernel)}
        self.kernel = kernel
        return True

    def _full_stores(self, kernel: str) -> bool:
        """Whether every live invocation of the rows kernel stores whole vectors (its
        FULL): the input rows hold whole groups of ROWS_Q quads (2 ROWS_Q pairs;
        dispatch pieces along the row start on such groups) and, for u64vec4 stores,
        every output row starts on 8 elements."""
        out = 8 if kernel.endswith("_u64") else 4
        unit, group = (2, 2 * ROWS_Q) if "_near2_" in kernel else (4, ROWS_Q)
        return (self.in_sizes[-1] // unit % group == 0
                and all(st % out == 0 for st in self.box_out_strides[:-1]))

    def _pair_phases(self) -> tuple | None:
        """The PAIR mode's ((H[0], WH[0]), (H[1], WH[1])) of the dimension before the last
        (glsl/resample_rows.comp): linear, that dimension upsampled by 2 with the period-2
        map :func:`rows_phases` finds there; None where it does not apply or
        ``path="rows1"``."""
        k = self.rank - 2
        if not self.linear or self.force_path == "rows1" or self.box[k] != 2 * self.in_sizes[k]:
            return None
        phases = rows_phases(self, k)
        # the kernel's rows r + H[0] .. r + H[0] + 2 hold both output rows' inputs
        return phases if phases and phases[1][0] - phases[0][0] in (0, 1) else None

    def _rows_box(self) -> list:
        """The rows kernel's box: the last dimension in input units (quads, or pairs
        for ``near2``), the one before in groups of the output rows an invocation
        stores."""
        box = list(self.box[:-1]) + [self.in_sizes[-1] // self.rows["unit"]]
        if len(box) > 1:
            box[-2] //= self.rows["rep_h"] * self.rows["rows_k"]
        return box

    def _spread(self, box) -> int:
        """Row groups sharing a workgroup row (the kernel's SPREAD; 1: none): where a row
        takes fewer invocations than 8 (lavapipe's lanes; SwiftShader's 4 divide them;
        linear: at most 5), as many rows as keep a workgroup of whole lanes within 64
        invocations, the whole box in one dispatch of at most that many rows.  A row of
        3 invocations in a workgroup of 8 left 5 lanes idle; linear's PAIR with rows of
        7 (one lane idle) ran slower spread on lavapipe (bench/RESULTS.md)."""
        per = ceil_div(box[-1], self.rows["group"])
        if self.force_spread is not None:
            spread = self.force_spread
        else:
            unit = 8 // math.gcd(per, 8)
            most = 5 if self.linear else 7
            spread = unit * max(1, 64 // (unit * per)) if len(box) > 1 and per <= most else 1
        if spread <= 1 or len(box) < 2:
            return 1
        lim = self.ctx.limits
        flat = math.prod(box[:-1])
        lx = spread * per
        ok = (lx <= min(lim["maxComputeWorkGroupSize"][0], self.workgroup_size)
              and ceil_div(flat, spread) <= lim["maxComputeWorkGroupCount"][1]
              and flat < GRID_LIMIT)
        return spread if ok else 1

    def _encode_rows(self, seq, x, y) -> None:
        """Record the rows kernel over the output box, its last dimension in input
        quads (whole tensors bound)."""
        plan, ctx = self.rows, self.ctx
        box = self._rows_box()
        fmt = (FORMAT_RGBA32_SFLOAT if self.linear else FORMAT_RGBA32_UINT if plan["unit"] == 4
               else FORMAT_RG32_UINT)
        # whole units: the last input element ends one (the strides and rows are units)
        ub = 4 * plan["unit"]
        size = min(self.in_bytes // ub * ub, x.size)
        rd = Bind(x, 0, size, "r", fmt) if plan["read"] == "texel" else Bind(x, 0, size, "r")
        binds = [rd, Bind(y, 0, self.out_bytes, "w"), Bind(plan["params"])]
        spread = self._spread(box)
        if spread > 1:
            self._encode_spread(seq, box, spread, binds)
            return
        local = min(64, self.workgroup_size)
        group = plan["group"]
        lx = min(local, max(8, round_up(ceil_div(box[-1], group), 8)))
        ly = max(1, min(local // lx, box[-2], int(ctx.limits["maxComputeWorkGroupSize"][1]))
                 ) if len(box) > 1 else 1
        pipe = self._rows_pipeline(lx, ly, len(box))
        for o, e in split_groups([0] * len(box), box, lx,
                                 ctx.limits["maxComputeWorkGroupCount"], 1, group, ly):
            push = pack(plan["kernel"], "push", origin=words8(o), extent=words8(e),
                        x_count=ceil_div(e[-1], group), flat_rows=0, pad1=0, pad2=0,
                        magic=words8(map(div_magic, e)))
            seq.dispatch(pipe, binds, box_grid(e, lx, 1, group, ly), push)

    def _encode_spread(self, seq, box, spread: int, binds) -> None:
        """One dispatch of the rows kernel with SPREAD row groups a workgroup row
        (:meth:`_spread`): x one workgroup of whole rows, y the flattened row groups."""
        per = ceil_div(box[-1], self.rows["group"])
        flat = math.prod(box[:-1])
        pipe = self._rows_pipeline(spread * per, 1, len(box), spread, per)
        push = pack(self.rows["kernel"], "push", origin=words8([0] * len(box)),
                    extent=words8(box), x_count=per, flat_rows=flat, pad1=0, pad2=0,
                    magic=words8(map(div_magic, box)))
        seq.dispatch(pipe, binds, (1, ceil_div(flat, spread), 1), push)

    def _rows_pipeline(self, lx: int, ly: int, rank: int, spread: int = 1, per: int = 1):
        """The rows kernel's pipeline for a workgroup of lx by ly and the plan's frozen
        constants."""
        plan = self.rows
        return self.pipeline(plan["kernel"], {"LOCAL_SIZE_X": lx, "LOCAL_SIZE_Y": ly,
                                              "RANK": rank,
                                              "LIN_MASK": self.lin_mask,
                                              "PHASE_D0": plan["d"][0],
                                              "PHASE_D1": plan["d"][1],
                                              "REP_H": plan["rep_h"],
                                              "PHASE_H0": plan["h"][0],
                                              "PHASE_H1": plan["h"][1],
                                              "FULL": int(plan["full"]),
                                              "ROWS_K": plan["rows_k"],
                                              "SPREAD": spread, "SPREAD_X": per,
                                              **dict(zip(("WT0", "WT1", "WH0", "WH1"),
                                                         plan["w"]))})

    def weights(self, k: int, o) -> np.ndarray:
        """glsl/resample.comp's ``locate`` weight of i1 along dimension k (0 where the
        dimension is not interpolated)."""
        if not (self.linear and self.lin_mask >> k & 1):
            return np.zeros(len(np.atleast_1d(o)), np.float32)
        xf = np.clip(input_coordinates(o, *self.coords[k]), np.float32(-1.0),
                     np.float32(self.in_sizes[k]))
        return (xf - np.floor(xf)).astype(np.float32)

    def in_span(self, origin, extent):
        """The input elements a box reads: per dimension the indices its first and last
        coordinates take (the map is increasing), as the kernel computes them."""
        lo = hi = 0
        for k in range(self.rank):
            first, last = self.indices(k, [origin[k], origin[k] + extent[k] - 1])
            lo += int(first[0]) * self.in_strides[k]
            hi += int(last[-1]) * self.in_strides[k]
        return lo, hi + 1

    def indices(self, k: int, o) -> tuple[np.ndarray, np.ndarray]:
        """glsl/resample.comp's ``locate``: the (i0, i1) input indices of output
        coordinates ``o`` along dimension k (i0 only is read by nearest)."""
        n = self.in_sizes[k]
        xf = np.clip(input_coordinates(o, *self.coords[k]), -1.0, float(n))
        f = np.floor(xf)
        i = f.astype(np.int64)
        if self.linear and self.lin_mask >> k & 1:
            return np.clip(i, 0, n - 1), np.clip(i + 1, 0, n - 1)
        near = np.clip(i + (xf - f >= 0.5), 0, n - 1)
        return near, near

    def fit_local(self, lx: int, ly: int, v: int) -> tuple[int, int]:
        """Rows a workgroup rounded up to a power of two (rows past the box are masked):
        fewer distinct pipelines to build across shapes."""
        cap = max(1, min(self.local // lx, self.max_local_y))
        return lx, min(1 << (ly - 1).bit_length(), cap)

    def vector_width(self, origin, extent, out_base) -> int:
        """Always the kernel's V = 8 (a short row's tail is masked)."""
        return 8

    def vector_store(self, origin, out_base, v) -> bool:
        return self.kernel.startswith("resample_f32") and super().vector_store(
            origin, out_base, v)

    def encode(self, seq, inputs, outputs) -> None:
        if self.inner is not None:
            self.inner.encode(seq, inputs, outputs)
            return
        if self.copy is not None:
            self.copy.encode(seq, inputs[0].allocation, outputs[0].allocation)
            return
        if self.rows is not None:
            self._encode_rows(seq, inputs[0].allocation, outputs[0].allocation)
            return
        x, y = inputs[0].allocation, outputs[0].allocation

        def pipeline_for(local, ly, xdims, v, vec_store):
            return self.pipeline(self.kernel, {
                "LOCAL_SIZE_X": local, "LOCAL_SIZE_Y": ly, "XDIMS": xdims,
                "VEC_STORE": int(vec_store), **self.consts})

        self.dispatch_windows(seq, x, y, self.windows, pipeline_for, [Bind(self.params)],
                              self.in_kind, self.in_fmt)

    def release(self) -> None:
        if self.inner is not None:
            self.inner.release()
        super().release()


def _rows_an_invocation(rows: int, most: int) -> int:
    """Input rows (PAIR: pairs of output rows) a rows-kernel invocation walks down: the
    largest count up to ``most`` dividing ``rows`` (the grid counts whole groups)."""
    return max(p for p in range(1, most + 1) if rows % p == 0)


def integer_factor(index_map) -> int | None:
    """s where ``index_map[o] == o // s`` for every o and s divides the map's length
    (whole blocks of s outputs per input element), else None."""
    m = np.asarray(index_map)
    n = len(m)
    moved = np.flatnonzero(m != 0)
    s = int(moved[0]) if len(moved) else n
    if s == 0 or n % s or not np.array_equal(m, np.arange(n) // s):
        return None
    return s


def integer_factors(op) -> list | None:
    """Per dimension the factor s of resample ``op`` whose index maps (as the kernel
    computes them: :meth:`CompiledResample.indices`) are all ``o // s``, or None (one is
    not, or linear weights can be non-zero)."""
    if op.linear and op.lin_mask:
        return None
    factors = [integer_factor(op.indices(k, np.arange(n))[0])
               for k, n in enumerate(op.desc.output_tensor.sizes)]
    return None if None in factors else factors


def rows_phases(op, k: int | None = None) -> tuple | None:
    """((D[0], WT[0]), (D[1], WT[1])) of glsl/resample_rows.comp for resample ``op``:
    output 2k + j of dimension ``k`` (None: the last) reads input ``clamp(k + D[j])`` (and
    ``clamp(k + D[j] + 1)`` weighted WT[j], linear), D[j] in {-1, 0}; None unless that
    map equals the general kernel's (:meth:`CompiledResample.indices`, ``weights``) at
    every output coordinate, so the two kernels read the same inputs with the same
    weights."""
    k = op.rank - 1 if k is None else k
    n = op.in_sizes[k]
    o = np.arange(op.box[k])
    i0, i1 = op.indices(k, o)
    w = op.weights(k, o)
    mid = 2 * (n // 2)                   # a pair away from the edges where n allows
    d = [int(i0[mid + j]) - n // 2 for j in (0, 1)]
    if any(dj not in (-1, 0) for dj in d):
        return None
    base = o // 2 + np.array(d)[o % 2]
    if not np.array_equal(i0, np.clip(base, 0, n - 1)):
        return None
    wt = [float(w[mid + j]) for j in (0, 1)]
    if op.linear and not (np.array_equal(i1, np.clip(base + 1, 0, n - 1))
                          and np.array_equal(w, np.array(wt, np.float32)[o % 2])):
        return None
    return (d[0], wt[0]), (d[1], wt[1])


def split_dims(src, dst, factors) -> tuple[list, list, list]:
    """(sizes, input strides, output strides) of the broadcast copy equal to a resample
    of ``factors``: a dimension of factor s > 1 splits into (out / s, s), the output's
    stride times s and its own, the input's stride and 0."""
    sizes, in_st, out_st = [], [], []
    for n, s, ist, ost in zip(dst.sizes, factors, src.element_strides, dst.element_strides):
        sizes += [n // s] + [s] * (s > 1)
        in_st += [ist] + [0] * (s > 1)
        out_st += [ost * s] + [ost] * (s > 1)
    return sizes, in_st, out_st


def broadcast_view(src, dst, factors) -> tuple:
    """(input view, output view) TensorDescs of :func:`split_dims` (at most 8
    dimensions: the caller keeps the last dimension's factor 1)."""
    sizes, in_st, out_st = split_dims(src, dst, factors)
    dt = src.data_type
    return (TensorDesc(dt, tuple(sizes), tuple(in_st), src.total_tensor_size_in_bytes),
            TensorDesc(dt, tuple(sizes), tuple(out_st), dst.total_tensor_size_in_bytes))


def rows_geometry(src, dst, factors) -> dict | None:
    """glsl/permute.comp's rows geometry of the broadcast copy (:func:`broadcast_view`
    but the last dimension, read at REP = its factor), or None where the output is not
    contiguous along it.  The dimensions before it are coalesced (permute.coalesce);
    the last is kept apart, its input stride counting input elements.  A dimension
    of size 1 coalesces away, so the kernel gets at most 7."""
    if dst.element_strides[-1] != 1:
        return None
    last = dst.sizes[-1]
    sizes, in_st, out_st = split_dims(src, dst, list(factors[:-1]) + [1])
    box, ist, ost = permute.coalesce(sizes[:-1] or [1], in_st[:-1] or [0], out_st[:-1] or [0])
    # the largest leading dimension as the grid's y (a workgroup spans rows along it:
    # a factor's dimension of 2 there left lavapipe workgroups of 16 invocations)
    k = box.index(max(box))
    for lst in (box, ist, ost):
        lst.append(lst.pop(k))
    return {"kind": "rows", "box": box + [last], "in": ist + [src.element_strides[-1]],
            "out": ost + [1], "bases": (0, 0), "vec4": all(s % 4 == 0 for s in ost),
            "rep": factors[-1]}


def read_shape(desc) -> dict:
    """A float32 resample as the tuner's JSON shape (RESAMPLE1's fields)."""
    src, dst = desc.input_tensor, desc.output_tensor
    scales, ins, outs = desc.geometry()
    return {"in": [list(src.sizes), list(src.element_strides)],
            "out": [list(dst.sizes), list(dst.element_strides)],
            "mode": int(desc.mode), "scales": list(scales), "ins": list(ins),
            "outs": list(outs)}


def _out_class(shape) -> str:
    """A tuner shape's float32 output size, to a factor of 4."""
    return f"out 4^{(4 * math.prod(shape['out'][0])).bit_length() // 2}"


def _read_class(shape) -> str:
    """Shapes sharing a read path choice: mode, rank and output size (a factor of 4)."""
    return f"mode {shape['mode']} rank {len(shape['out'][0])} {_out_class(shape)}"


def _read_run(device, seq, cand, shape):
    """Record a resample of ``shape`` read by candidate ``cand`` (its own tensors)."""
    desc = _shape_desc(shape)
    # the read path is the general kernel's (a copy-path shape would time the copy)
    op = CompiledResample(device, desc, read=cand.params["read"], path="general")
    return timed_read_candidate(device, seq, op, cand)


def _f32_desc(sizes, strides) -> TensorDesc:
    """A float32 TensorDesc (the tuner's shapes are float32)."""
    return TensorDesc(DataType.FLOAT32, tuple(sizes), tuple(strides))


def _shape_desc(shape) -> Resample1OperatorDesc:
    """The float32 RESAMPLE1 descriptor of a tuner shape (:func:`read_shape`)."""
    (isz, ist), (osz, ost) = shape["in"], shape["out"]
    return Resample1OperatorDesc(_f32_desc(isz, ist), _f32_desc(osz, ost), shape["mode"],
                                 tuple(shape["scales"]), tuple(shape["ins"]),
                                 tuple(shape["outs"]))


#: Resample's float32 read path where the input fits a texel buffer: "auto" (R32F texel
#: reads, the ``VKML_TUNE=off`` default) or "ssbo" (storage-buffer reads), by measurement.
READ_PATH = tuning.register_path(
    "resample_read", [("auto", {"read": "auto"}), ("ssbo", {"read": "ssbo"})], "auto",
    _read_class, _read_run, work_fn=tuning.io_elements,
    examples=[{"in": [[1, 64, 112, 112], [802816, 12544, 112, 1]],
               "out": [[1, 64, 224, 224], [3211264, 50176, 224, 1]], "mode": 0,
               "scales": [1.0, 1.0, 2.0, 2.0], "ins": [0.5] * 4, "outs": [-0.5] * 4}])


def _rows_read_class(shape) -> str:
    """Rows-kernel shapes sharing a read choice: mode and output size (a factor of 4)."""
    return f"rows mode {shape['mode']} {_out_class(shape)}"


def _rows_read_run(device, seq, cand, shape):
    """Record the rows kernel on a resample of ``shape`` read by candidate ``cand`` (one
    walking more rows than the default declines linear, whose PAIR walk is fixed)."""
    desc = _shape_desc(shape)
    walk = cand.params["walk"]
    op = CompiledResample(device, desc, read=cand.params["read"], path="rows", walk=walk)
    if (op.rows is None or op.rows["read"] != cand.params["read"]
            or (op.linear and walk != NEAR_ROWS)):
        op.release()
        raise tuning.Declined(cand.name)
    return record_on_scratch(device, seq, op, desc.input_tensor, desc.output_tensor)


#: The rows kernel's read path: RGBA32 texels ("texel", the ``VKML_TUNE=off`` default;
#: where the input fits a texel buffer) or vec4 storage loads ("ssbo"), by measurement;
#: nearest's "-walk8" candidates walk 8 input rows an invocation instead of NEAR_ROWS.
ROWS_READ_PATH = tuning.register_path(
    "resample_rows_read",
    [(f"{read}{suffix}", {"read": read, "walk": walk})
     for suffix, walk in (("", NEAR_ROWS), ("-walk8", 8)) for read in ("texel", "ssbo")],
    "texel",
    _rows_read_class, _rows_read_run, work_fn=tuning.io_elements,
    examples=[{"in": [[1, 64, 56, 56], [200704, 3136, 56, 1]],
               "out": [[1, 64, 112, 112], [802816, 12544, 112, 1]], "mode": mode,
               "scales": [1.0, 1.0, 2.0, 2.0], "ins": [0.5] * 4, "outs": [-0.5] * 4}
              for mode in (0, 1)])


#: ONNX Resize's coordinate_transformation_mode values this mapping takes.
COORDINATE_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_half_pixel_for_nn", "half_pixel_symmetric")
#: ONNX Resize's nearest_mode values.
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def onnx_resize_geometry(in_sizes, out_sizes, scales=None, *,
                         coordinate_transformation_mode="half_pixel",
                         nearest_mode="round_prefer_floor", mode="nearest"):
    """ONNX Resize's coordinate mapping as RESAMPLE1's ``(scales, input_pixel_offsets,
    output_pixel_offsets)``.

    ``scales``: ONNX's per-dimension scales (None: ``out / in``, as ONNX when sizes
    are given).  ONNX maps output coordinate o to input coordinate x; RESAMPLE1 reads
    ``x = (o - OutputPixelOffset) / Scale - InputPixelOffset``:

    * asymmetric ``x = o / s``: Scale s, offsets 0, 0 -- exact;
    * half_pixel ``x = (o + 0.5) / s - 0.5``: offsets 0.5, -0.5 (RESAMPLE) -- exact;
    * pytorch_half_pixel: half_pixel, and ``x = 0`` where the output size is 1
      (offsets 0, 0) -- exact;
    * align_corners ``x = o (in - 1) / (out - 1)``: Scale ``(out - 1) / (in - 1)``,
      offsets 0 (``x = 0`` where in or out is 1) -- exact up to the float32 rounding of
      the scale;
    * tf_half_pixel_for_nn ``x = (o + 0.5) / s``: offsets 0, -0.5 -- exact;
    * half_pixel_symmetric: half_pixel shifted by ``in / 2 * (1 - out / (in s))`` --
      exact;
    * tf_crop_and_resize (needs a region of interest and an extrapolation value): not
      expressible; ValidationError.

    A dimension of scale 1 whose size does not change is a copy (scale 1, offsets 0,
    whatever the modes), as ONNX Runtime treats it.

    Nearest modes (mode "nearest"): RESAMPLE1 rounds halves up (index
    ``floor(x + 0.5)``), which is round_prefer_ceil, and floor with x shifted by half a
    pixel (``floor(x) = floor((x - 0.5) + 0.5)``); round_prefer_floor and ceil differ
    from it exactly at ties, the one place an offset cannot reach.  Every mode is
    therefore mapped with x shifted by ``eps = 1 / (4 * out)`` towards the side its ties
    resolve to (ONNX Runtime's DirectML provider nudges by an epsilon the same way): up
    for round_prefer_ceil and floor, whose exact ties and integers float32's rounding of
    ``o * a + b`` can otherwise put a hair below, down for round_prefer_floor and ceil.
    Exact wherever x is farther than eps from a tie, which holds for every x of an
    ONNX-sized resize (its coordinates are multiples of ``1 / (2 out)``) while
    ``in * out`` stays below about 2^20 per dimension (tests/test_resample.py checks
    every mode against ONNX's formula in exact arithmetic).  Linear mode ignores
    nearest_mode (ONNX's linear/bilinear/trilinear ``Resize`` with
    ``cubic``/``antialias`` are not resample).
    """
    n = len(in_sizes)
    ctm = str(coordinate_transformation_mode).lower()
    nm = str(nearest_mode).lower()
    if ctm not in COORDINATE_MODES:
        raise ValidationError("coordinate_transformation_mode", f"{ctm!r} has no RESAMPLE1 "
                              f"equivalent (one of {', '.join(COORDINATE_MODES)})")
    if nm not in NEAREST_MODES:
        raise ValidationError("nearest_mode", f"must be one of {', '.join(NEAREST_MODES)}, "
                              f"got {nm!r}")
    if scales is None:
        scales = [o / i for i, o in zip(in_sizes, out_sizes)]
    out_s, out_i, out_o = [], [], []
    for k in range(n):
        i, o, s = in_sizes[k], out_sizes[k], float(scales[k])
        io, oo = {"half_pixel": (0.5, -0.5), "pytorch_half_pixel": (0.5, -0.5),
                  "asymmetric": (0.0, 0.0), "align_corners": (0.0, 0.0),
                  "tf_half_pixel_for_nn": (0.0, -0.5),
                  "half_pixel_symmetric": (0.5, -0.5)}[ctm]
        if s == 1.0 and i == o:
            # ONNX Runtime copies a dimension of scale 1, whatever the modes (with
            # tf_half_pixel_for_nn the formula would shift it by half a pixel)
            out_s.append(1.0)
            out_i.append(0.0)
            out_o.append(0.0)
            continue
        if ctm == "pytorch_half_pixel" and o == 1:
            io, oo = 0.0, 0.0
        elif ctm == "align_corners":
            s = (o - 1) / (i - 1) if o > 1 and i > 1 else 1.0
        elif ctm == "half_pixel_symmetric":
            io -= i / 2 * (1 - o / (i * s))
        if mode == "nearest":
            eps = 0.25 / max(o, 1)
            io += {"round_prefer_ceil": -eps, "floor": 0.5 - eps, "round_prefer_floor": eps,
                   "ceil": eps - 0.5}[nm]
        out_s.append(s)
        out_i.append(io)
        out_o.append(oo)
    return tuple(out_s), tuple(out_i), tuple(out_o)


def _reals(value, n: int, field: str, default=None) -> tuple:
    if value is None:
        if default is None:
            raise ArgumentTypeError(field, "is required")
        return (default,) * n
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        return (as_real(value, field),) * n
    return tuple(as_real(v, f"{field}[{i}]") for i, v in enumerate(value))


def resample(x, scales=None, *, sizes=None, mode="nearest", input_pixel_offsets=None,
             output_pixel_offsets=None, coordinate_transformation_mode=None,
             nearest_mode=None, device=None):
    """Resample ``x`` (1 to 4 dimensions; float32, float16, int8, uint8),
    ``DML_RESAMPLE1_OPERATOR_DESC``: output element o reads input coordinate
    ``x = (o - output_pixel_offset) / scale - input_pixel_offset`` per dimension.

    ``mode``: "nearest" (the element at ``floor(x + 0.5)``: halves round up, DirectML's
    rounding) or "linear" (weights ``1 - frac(x)``, ``frac(x)`` along each dimension);
    indices are clamped to the input.  ``scales`` (one per dimension, or one for all)
    and ``sizes`` (the output's): either or both; sizes default to ``floor(in *
    scale)``, scales to ``out / in``.  Offsets default to 0.5 and -0.5 (pixel centres:
    DML_RESAMPLE_OPERATOR_DESC, ONNX's half_pixel, PyTorch's ``align_corners=False``).

    ``coordinate_transformation_mode`` / ``nearest_mode`` (ONNX Resize's attributes,
    instead of the offsets) map through :func:`onnx_resize_geometry`, whose doc says
    which map exactly.  PyTorch ``F.interpolate`` given ``size``: "nearest" is
    asymmetric + floor, "nearest-exact" half_pixel + round_prefer_ceil, linear modes
    with ``align_corners`` False / True are half_pixel / align_corners (all exact).
    """
    dev = pick_device(device, x)
    x = as_array(x, "x")
    n = len(x.shape)
    mode = enum_of(InterpolationMode, {"nearest": 0, "linear": 1}.get(mode, mode), "mode",
                   "DML_INTERPOLATION_MODE_")
    if sizes is None and scales is None:
        raise ArgumentTypeError("scales", "scales or sizes is required")
    if sizes is not None:
        sizes = as_ints(sizes, "sizes")
        if len(sizes) != n:
            raise ValidationError("sizes", f"must have {n} entries (x's dimensions), got "
                                  f"{len(sizes)}")
        if scales is None:
            scales = tuple(o / i if i else 1.0 for i, o in zip(x.shape, sizes))
    scales = _reals(scales, n, "scales")
    if sizes is None and len(scales) == n:
        sizes = tuple(max(1, math.floor(i * s)) if math.isfinite(s) and s > 0 else 1
                      for i, s in zip(x.shape, scales))
    if coordinate_transformation_mode is not None or nearest_mode is not None:
        if input_pixel_offsets is not None or output_pixel_offsets is not None:
            raise ValidationError("coordinate_transformation_mode", "give either the ONNX "
                                  "modes or the pixel offsets, not both")
        scales, ins, outs = onnx_resize_geometry(
            x.shape, sizes, scales,
            coordinate_transformation_mode=coordinate_transformation_mode or "half_pixel",
            nearest_mode=nearest_mode or "round_prefer_floor",
            mode="linear" if mode == InterpolationMode.LINEAR else "nearest")
    else:
        ins = _reals(input_pixel_offsets, n, "input_pixel_offsets", 0.5)
        outs = _reals(output_pixel_offsets, n, "output_pixel_offsets", -0.5)
    desc = Resample1OperatorDesc(TensorDesc(x.dtype, tuple(x.shape)),
                                 TensorDesc(x.dtype, tuple(sizes)), mode, scales, ins, outs)
    return run(dev, desc, [x])

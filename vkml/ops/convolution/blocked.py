"""The register-blocked path: an in-place implicit GEMM whose small register blocks are
frozen into the module (``glsl/convolution_blocked.comp``, CONV variants), forward and
transposed (one dispatch per stride phase); its GEMM variant also runs Winograd's 36
GEMMs (``winograd-blocked``, see winograd.py)."""
from __future__ import annotations

import itertools
import math

import numpy as np

from ...runtime import Bind
from ...runtime.blocks import layout, pack
from .geometry import (STORAGES, Path, in_place_accepts, in_place_binds, knobs_of,
                       storage_suffix, variant)
from ...intmath import ceil_div

#: Kernel variants this module requests and the specialization constants it sets.
VARIANTS = {f"convolution_blocked_{s}": ("LOCAL_SIZE_X", "RM", "RN", "ACT")
            for s in STORAGES + ("gemm",)}

#: Register blocks of the blocked path: (RM output channels, RN pixels, invocations per
#: workgroup).  Frozen into the module (the kernel's ``vkml:frozen``), so they stay small.
BLOCKS = {"8x4": (8, 4, 16), "4x4": (4, 4, 16), "8x8": (8, 8, 16), "8x2": (8, 2, 16),
          "1x8": (1, 8, 64)}


def _phase_axis(o_n: int, k_n: int, s: int, d: int, a: int, r: int):
    """Phase ``r`` of one transposed axis ``y[o] += x[i] w[k]`` where
    ``o + a - k d = i s``: the outputs ``o = o0 + j s`` (``(o + a) % s == r``), ``cnt``
    of them, and the taps that reach them, ``k = k0 + t step`` for ``t < nt`` (``k d % s
    == r``, so ``step = s / gcd(s, d)``), which read input ``i = base + j - t d/gcd``.
    Returns ``(o0, cnt, k0, nt, step, base, d/gcd)``; ``nt`` = 0 where no tap reaches
    the phase (its outputs get the bias only)."""
    o0 = (r - a) % s
    cnt = max(0, ceil_div(o_n - o0, s))
    gg = math.gcd(s, d)
    step = s // gg
    k0 = next((k for k in range(min(k_n, step)) if (k * d) % s == r), None)
    if k0 is None:
        return o0, cnt, 0, 0, step, 0, d // gg
    nt = ceil_div(k_n - k0, step)
    return o0, cnt, k0, nt, step, (o0 + a - k0 * d) // s, d // gg


def _params(kernel: str, g, mblocks: int, act_params, osz, ksz, stride, dil, pad, y0, w_tap0,
            w_steps, ys) -> bytes:
    """The kernel's parameter block (the CONV Params of the kernel)."""
    back = g.backward
    w0, w1 = g.w_strides[0], g.w_strides[1]
    # forward filters are (C_out, C_in/groups, k...), transposed ones (C_in, C_out/groups, k...)
    wm, wc, wg = (w1, w0, g.cin_per_group * w0) if back else (w0, w1, g.cout_per_group * w0)
    return pack(kernel, "Params", isz=(*g.in_size, g.cin_per_group),
                osz=(*osz, g.cout_per_group), ksz=(*ksz, int(g.b_stride is not None)),
                str=(*stride, mblocks), dil=(*dil, math.prod(osz)), pad=(*pad, y0),
                xs=g.x_strides[:4], ws=(wm, wc, wg, w_tap0), wt=(*w_steps, 0),
                ys=(g.y_strides[0], g.y_strides[1], *ys[:2]),
                s2=(g.x_strides[4], ys[2], g.b_stride or 0, 0), act=act_params)


def _dispatches(g):
    """``[(osz, ksz, stride, dil, pad, y0, w_tap0, w_steps, ys)]``: the kernel's
    per-dispatch geometry: the forward convolution as given, or each stride phase of a
    transposed one that has outputs (see :func:`_phase_axis`), in ascending order."""
    wsp, ysp = g.w_strides[2:], g.y_strides[2:]
    if not g.backward:
        tap0 = sum((k - 1) * s for k, s in zip(g.kernel, wsp)) if g.flip else 0
        steps = [-s if g.flip else s for s in wsp]
        return [(g.out_size, g.kernel, g.stride, g.dilation, g.start, 0, tap0, steps, ysp)]
    out = []
    # the phases that hold outputs: each axis's residues (o + a) % s of its outputs
    # (never a loop over a stride: strides reach 2^32 - 1)
    phases = [range(s) if o >= s else sorted({(j + a) % s for j in range(o)})
              for o, s, a in zip(g.out_size, g.stride, g.start)]
    for rs in itertools.product(*phases):
        ax = [_phase_axis(o, k, s, d, a, r) for o, k, s, d, a, r in
              zip(g.out_size, g.kernel, g.stride, g.dilation, g.start, rs)]
        if any(a[1] == 0 for a in ax):
            continue
        ksz = [a[3] for a in ax] if all(a[3] for a in ax) else [0, 0, 0]
        tap0 = sum(((k - 1 - a[2]) if g.flip else a[2]) * ws
                   for a, k, ws in zip(ax, g.kernel, wsp))
        steps = [(-a[4] if g.flip else a[4]) * ws for a, ws in zip(ax, wsp)]
        out.append(([a[1] for a in ax], ksz, (1, 1, 1), [-a[6] for a in ax],
                    [-a[5] for a in ax], sum(a[0] * y for a, y in zip(ax, ysp)), tap0, steps,
                    [s * y for s, y in zip(g.stride, ysp)]))
    return out


class BlockedPath(Path):
    """``glsl/convolution_blocked.comp`` (CONV): a convolution as an implicit GEMM read in
    place through the DML strides, RM output channels x RN pixels per invocation with RM
    and RN frozen into the module, so that drivers which do not fold specialization
    constants keep the block in registers (SwiftShader, where the other paths' large
    blocks live in memory).  A transposed convolution runs one dispatch
    per stride phase, each over only the taps that reach its outputs (no product
    wasted on a tap that does not divide).  Knob: the block (:data:`BLOCKS`)."""

    name = "blocked"

    @classmethod
    def prefers(cls, op, geo) -> bool:
        """Not the ``VKML_TUNE=off`` default (after direct): the tuner times it."""
        return False

    @classmethod
    def _shape(cls, op, geo, knobs):
        rm, rn, local = BLOCKS[knobs_of(knobs).get("block", "8x4")]
        local = min(local, op.ctx.limits["maxComputeWorkGroupSize"][0])
        mblocks = ceil_div(geo.cout_per_group, rm)
        pix = math.prod(geo.out_size)
        if geo.backward:        # phase 0 has the most outputs
            pix = math.prod(ceil_div(o, s) for o, s in zip(geo.out_size, geo.stride))
        groups = (ceil_div(pix, (local * rn)), geo.groups * mblocks, geo.n)
        return rm, rn, local, mblocks, groups

    @classmethod
    def accepts(cls, op, geo, knobs=None) -> bool:
        return in_place_accepts(op, geo, cls._shape(op, geo, knobs)[4], transposed=True)

    def __init__(self, op, geo, knobs=None):
        super().__init__(op, geo, knobs)
        rm, rn, self.local, mblocks, _ = self._shape(op, geo, self.knobs)
        kernel = variant("blocked", storage_suffix(op, geo.dtype))
        self.pipe = op.pipeline(kernel, {
            "LOCAL_SIZE_X": self.local, "RM": rm, "RN": rn, "ACT": self.act_id})
        align = max(16, op.ctx.limits["minUniformBufferOffsetAlignment"])
        self.param_bytes = layout(kernel, "Params").size
        stride = ceil_div(self.param_bytes, align) * align
        blocks, self.grids = [], []
        for d in _dispatches(geo):
            blk = np.zeros(stride, np.uint8)
            blk[:self.param_bytes] = np.frombuffer(
                _params(kernel, geo, mblocks, self.act_params, *d), np.uint8)
            blocks.append(blk)
            self.grids.append((ceil_div(math.prod(d[0]), (self.local * rn)),
                               geo.groups * mblocks, geo.n))
        self.params = op.upload(np.concatenate(blocks))
        self.param_stride = stride

    def encode(self, seq, x, w, b, y) -> None:
        binds = in_place_binds(self.op, self.geo, x, w, b, y)
        for i, grid in enumerate(self.grids):
            seq.dispatch(self.pipe, binds + [Bind(self.params, i * self.param_stride,
                                                  self.param_bytes)], grid)

"""The gemm_sg path: the implicit GEMM of ``gemm.py`` with the filter read in place and
shared across a subgroup by shuffles (``convolution_gemm.comp``, SGW variants):
:class:`GemmSgPath` is :class:`~.gemm.GemmPath`'s plan with the hooks that differ (the
subgroup, the register block, no filter re-layout, the filter's strides in the parameter
block, subgroups along channel blocks in the grid)."""
from __future__ import annotations

import math

from ... import runtime
from ...dml.data_type import DataType
from ...tuning import Declined
from .gemm import (GEMM_CONSTANTS, SG_BLOCKS, SG_CBW, GemmPath, forward_axes,
                   padded_extents, sg_blocks, sg_span, subgroup_shuffle_size, transposed_axes,
                   whole_vec4)
from .epilogue import global_pool_rule
from .geometry import knobs_of
from .geometry import STORAGES, texel_ok
from .plan import Buf
from ..concurrent_width import concurrent_width
from ..grid import per_workgroup
from ...intmath import ceil_div

#: Kernel variants this path runs and the specialization constants it sets.
SG_CONSTANTS = GEMM_CONSTANTS + ("SG", "CBW", "ACC_RUN", "W4", "XSKEW", "GPOOL")
VARIANTS = {f"convolution_gemm_sg_{s}{r}": SG_CONSTANTS
            for s in STORAGES + ("f32_v8",) for r in ("", "_res")}
VARIANTS.update({f"convolution_gemm_sg_f32{v}{r}_sc": SG_CONSTANTS
                 for v in ("", "_v8") for r in ("", "_res")})
#: W4: where the kernel's loop takes input channels four at a time (CU) over one column
#: tap and the filter's input channels are packed, a lane fetches its weights of four
#: channels as one RGBA32F texel instead of four R32F ones (lavapipe pays a texel fetch
#: per lane whatever its width): 1x1 convolutions, the weights' fetches a quarter.
SG_W4 = True


class GemmSgPath(GemmPath):
    """The implicit GEMM reading the filter in place through its DML strides, shared
    across a subgroup by shuffles (``convolution_gemm.comp``, SGW variants): no
    re-laid filter per execution.  The kernel needs full subgroups of the reported size
    (lavapipe: 8 lanes, SwiftShader: 4), so its pipelines require them
    (:func:`subgroup_shuffle_size`); a device that cannot guarantee them is not offered
    this path."""

    name = "gemm_sg"
    FAMILY = "gemm_sg"
    POOLS = True

    def __init__(self, op, geo, knobs=None, pool=None):
        #: the global average pool offered (``CompiledConvolution(pool=)``); ``self.pool``
        #: holds it where the output pass stores it (:meth:`_stores`), else None
        self.pool_offer, self.pool = pool, None
        super().__init__(op, geo, knobs)

    @classmethod
    def accepts(cls, op, geo, knobs=None) -> bool:
        if not (super().accepts(op, geo, knobs) and subgroup_shuffle_size(op) >= 4):
            return False
        fd = op.desc.filter_tensor
        # texel views of the filter and of the padded input (a bound on its size: the
        # last block's row may run past the planes)
        phases = transposed_axes(geo) if geo.backward else forward_axes(geo)
        _, ext = padded_extents(geo, phases)
        tail = (SG_BLOCKS[1] + 4) * geo.stride[2] + geo.kernel[2] * geo.dilation[2] + 4
        x_bound = geo.n * geo.c_in * math.prod(ext[:2]) * (ceil_div(ext[2], 4) * 4) + tail
        return (texel_ok(op, fd.total_tensor_size_in_bytes // fd.data_type.size)
                and texel_ok(op, x_bound) and cls._span_differs(op, geo, phases, knobs)
                and cls._mb_differs(op, geo, phases, knobs))

    @staticmethod
    def _mb_differs(op, geo, phases, knobs) -> bool:
        """Without knob ``sg_mb``, True; with it, whether the default block holds more
        output channels (else the candidate is the default's twin).  Rows as planned
        unflattened (MB does not depend on the rows)."""
        mb_max = knobs_of(knobs)["sg_mb"]
        if mb_max is None:
            return True
        mb, _ = sg_blocks(geo.cout_per_group, phases, [ph[2].count for ph in phases], False,
                          subgroup_shuffle_size(op))
        return mb > mb_max

    @staticmethod
    def _span_differs(op, geo, phases, knobs) -> bool:
        """Without knob ``sg_span``, True; with it, whether the default block's row span
        exceeds it (else the candidate is the default's twin).  Rows as planned (1x1
        convolutions flatten, their span is NB <= 16)."""
        span = knobs_of(knobs)["sg_span"]
        if span is None:
            return True
        if geo.kernel == (1, 1, 1):
            return False
        _, nb = sg_blocks(geo.cout_per_group, phases, [ph[2].count for ph in phases], False,
                          subgroup_shuffle_size(op))
        return sg_span(phases, nb) > span

    @staticmethod
    def default_nb(op, geo) -> int:
        """NB, the pixels a lane's register block holds along a row, of the default block
        (knob ``sg_span`` None; rows as planned unflattened, as for a kernel wider than
        1x1)."""
        phases = transposed_axes(geo) if geo.backward else forward_axes(geo)
        return sg_blocks(geo.cout_per_group, phases, [ph[2].count for ph in phases], False,
                         subgroup_shuffle_size(op))[1]

    def _subgroup(self) -> int:
        op = self.op
        sg = subgroup_shuffle_size(op)
        fd = op.desc.filter_tensor
        if not (sg and self.local % sg == 0
                and texel_ok(op, fd.total_tensor_size_in_bytes // fd.data_type.size)
                and self.local <= sg * max(op.ctx.limits["maxComputeWorkgroupSubgroups"], 1)):
            raise Declined("no subgroup shuffles, or the filter is too large for a texel view")
        return sg

    def _skews(self, in_place: bool, flat: bool) -> bool:
        """XSKEW (a 1x1's plane of no whole float4s, 7x7's 49 pixels, read as float4
        texels): in place, the GEMM_RUN accumulation order (its loop body unrolls the
        channels, whose offsets mod 4 are then constants) and the group's channels whole
        groups of 4 (every iteration's first channel on a texel where the images are;
        ``_dispatches`` checks CU)."""
        return (in_place and flat and self.knobs["sg_acc_run"]
                and self.geo.cin_per_group % 4 == 0)

    def _blocks(self, phases, row_len, flat, skew=False) -> tuple[int, int]:
        return sg_blocks(self.geo.cout_per_group, phases, row_len, flat, self.sg,
                         self.knobs["sg_span"], share=self.subsampled is not None,
                         mb_max=self.knobs["sg_mb"], skew=skew)

    def _flat_short_rows(self) -> bool:
        return False

    def _stores(self, kernel: str) -> None:
        """The output pass stores the offered global average pool instead of the output
        (GPOOL, ``epilogue.py``'s "Global average pool") where
        ``epilogue.global_pool_rule`` takes it and a subgroup holds every pixel block of an
        image (one dispatch, no split); else as the GEMM stores."""
        pool, (d, *more) = self.pool_offer, self.dispatches
        if (pool is not None and global_pool_rule(self.op.desc, pool) is None
                and self.split == 1 and not more
                and d["qsize"][0] * d["qsize"][1] * d["qsize"][3] <= self.sg):
            self.pool = pool
            d["yv4"] = d["yv8"] = False
            return
        super()._stores(kernel)

    def _check_dispatches(self) -> None:
        """The filter offsets of every dispatch's row taps (``self.w_rows``) and the one
        step between column taps they share (Declined where phases step differently)."""
        self.w_rows, steps = [], set()
        for d in self.dispatches:
            if d["nrows"]:
                rows, step = self._filter_taps(d["axes"])
                self.w_rows += rows
                if len(d["axes"][2].taps) > 1:
                    steps.add(step)
        if len(steps) > 1:
            raise Declined("column taps of the phases step differently through the filter")
        self.w_step = steps.pop() if steps else 0

    def _filter_taps(self, axes) -> tuple[list, int]:
        """Filter element offsets of one dispatch's row taps (first column tap included)
        and the step between its column taps (kernel flipped in the CONVOLUTION mode)."""
        g = self.geo
        ws = g.w_strides

        def f(a, k):
            return g.kernel[a] - 1 - k if g.flip else k
        ad, ah, aw = axes
        k0 = f(2, aw.taps[0][0])
        step = (f(2, aw.taps[1][0]) - k0) * ws[4] if len(aw.taps) > 1 else 0
        return [f(0, kd) * ws[2] + f(1, kh) * ws[3] + k0 * ws[4]
                for kd, _ in ad.taps for kh, _ in ah.taps], step

    def _filter_relayouts(self, pl) -> list:
        self.wt = None                   # the filter is read in place
        return []

    def _storage(self, w_texels: int) -> bool:
        if not texel_ok(self.op, self.xp_floats):
            raise Declined("the padded input is too large for a texel view")
        fd = self.op.desc.filter_tensor
        self.w_bytes = fd.total_tensor_size_in_bytes
        self.w_fmt = (runtime.FORMAT_R32_SFLOAT if self.geo.dtype == DataType.FLOAT32
                      else runtime.FORMAT_R16_SFLOAT)
        return True

    def _constants(self, d) -> dict:
        """Adds SG; CBW where there are several channel blocks: channel blocks of the
        same pixels as subgroups of a workgroup (the input rows stay in cache between
        them), as many as :func:`~vkml.ops.grid.per_workgroup` gives for the device's
        concurrent width (144 channels in 9 blocks: 3 a workgroup, not 8 and a workgroup
        of 1 idling one of lavapipe's threads); ACC_RUN 0 for knob ``sg_acc_run`` False
        (one channel and column tap at a time over the block)."""
        consts = {**super()._constants(d), "SG": self.sg}
        if self.pool is not None:
            consts["GPOOL"] = math.prod(self.geo.out_size)
        if d["xskew"]:
            consts["XSKEW"] = d["xskew"]
        if not self.knobs["sg_acc_run"]:
            consts["ACC_RUN"] = 0
        if self._w4():
            consts["W4"] = 1
        qs = d["qsize"]
        gx = ceil_div(qs[0] * qs[1] * qs[3], self.sg)
        cbw = 0
        if SG_CBW and self.groups_y >= 2 and gx <= self.ctx.limits["maxComputeWorkGroupCount"][0]:
            cbw = per_workgroup(self.groups_y, self.local // self.sg,
                                gx * self.geo.n * self.ks, concurrent_width(self.op.device))
        if cbw:
            consts["CBW"] = cbw
            consts["LOCAL_SIZE_X"] = cbw * self.sg
        d["cbw"] = consts.get("CBW", 0)
        return consts

    def _filter_strides(self) -> tuple[int, int, int]:
        """The filter's element strides: output channel (within a group), input channel,
        group."""
        g = self.geo
        ws = g.w_strides
        if g.backward:       # filter (C_in, C_out/groups, *k)
            return ws[1], ws[0], g.cin_per_group * ws[0]
        return ws[0], ws[1], g.cout_per_group * ws[0]     # (C_out, C_in/groups, *k)

    def _w4(self) -> bool:
        """Whether the kernel fetches a lane's weights of four input channels as one
        RGBA32F texel (W4, :data:`SG_W4`): float32, the accumulation order of GEMM_RUN
        with CU a multiple of 4, one column tap, the filter's input channels packed and
        every weight offset a multiple of 4 (whole texels)."""
        g = self.geo
        col_s, ci_s, grp_s = self._filter_strides()
        return (SG_W4 and g.dtype == DataType.FLOAT32 and self.knobs["sg_acc_run"]
                and all(d["kw"] == 1 for d in self.dispatches)
                and self._cu(1) % 4 == 0
                and ci_s == 1 and col_s % 4 == 0 and grp_s % 4 == 0
                and all(r % 4 == 0 for r in self.w_rows) and self.w_bytes % 16 == 0)

    def _params(self, pl, row_offsets) -> dict:
        col_s, ci_s, grp_s = self._filter_strides()
        params = super()._params(pl, row_offsets)
        if self.pool is not None:         # the pooled tensor's image and channel strides
            ps = self.pool.output_tensor.element_strides
            params["ys_w"] = (params["ys_w"][0], ps[0], ps[1], 0)
        return {**params, "w_sg": (col_s, ci_s, self.w_step, 0),
                "w_sg_apart": (grp_s, 0, 0, 0), "wrows": whole_vec4(self.w_rows)}

    def _grid(self, d) -> tuple[int, int, int]:
        qs = d["qsize"]
        blocks = qs[0] * qs[1] * qs[3]
        if d["cbw"]:          # subgroups: channel blocks of the same pixels
            return ceil_div(blocks, self.sg), ceil_div(self.groups_y, d["cbw"]), 1
        blocks = ceil_div(blocks, self.sg) * self.sg          # whole subgroups a block
        cbl = max(1, min(self.groups_y, (4 * self.local) // blocks))
        return ceil_div(blocks * cbl, self.local), ceil_div(self.groups_y, cbl), cbl

    def _filter_bind(self) -> Buf:
        if self._w4():
            return Buf("w", self.w_bytes, "r", runtime.FORMAT_RGBA32_SFLOAT, 16)
        return Buf("w", self.w_bytes, "r", self.w_fmt)

"""The tuner's worked example for its tests: a copy by the device's own copy kernels
(glsl/bench_copy.comp, read through a storage buffer or a uniform texel buffer) against
the copy engine (``vkCmdCopyBuffer``), a path whose candidates really differ per device.

No operator uses it, so it is registered by importing this module (``from tuning_copy
import COPY``), never by vkml itself.  ``python -m tuning_copy ARGS`` (with ``tests/`` on
the path) is ``python -m vkml.tune ARGS`` with it registered: the CLI's tests tune it.
"""
from __future__ import annotations

import sys

import numpy as np

from vkml import tuning
from vkml.intmath import ceil_div, round_up
from vkml.runtime import FORMAT_RGBA32_UINT, STORAGE, UNIFORM_TEXEL, Bind
from vkml.runtime.blocks import pack
from vkml.tuning import Candidate, Declined

#: uvec4s each invocation of glsl/bench_copy.comp copies.
PER_INVOCATION = 4


def copy_class(nbytes) -> str:
    """Copies within a power of two of each other share a choice."""
    n = max(int(nbytes), 1)
    return f"2^{n.bit_length() - 1}B"


def _grid(lim, groups: int) -> tuple[int, int]:
    """The dispatch's (x, y) workgroup counts for ``groups`` workgroups, within the
    device's maxComputeWorkGroupCount (rows of x groups; the kernel skips the tail)."""
    gx = max(1, min(groups, lim["maxComputeWorkGroupCount"][0]))
    gy = ceil_div(groups, gx)
    if gy > lim["maxComputeWorkGroupCount"][1]:
        raise Declined(f"{groups} workgroups exceed maxComputeWorkGroupCount")
    return gx, gy


def copy_run(device, seq, cand: Candidate, nbytes):
    """Record ``cand``'s copy of ``nbytes`` (rounded up to 16) into ``seq``."""
    ctx = device.context
    lim = ctx.limits
    n = round_up(max(int(nbytes), 16), 16)
    read = cand.params.get("read")
    if read == "texel" and n // 16 > lim["maxTexelBufferElements"]:
        raise Declined(f"{n} bytes is more than maxTexelBufferElements texels")
    if read and n > lim["maxStorageBufferRange"]:
        raise Declined(f"{n} bytes is more than maxStorageBufferRange")
    src, dst = ctx.allocate(n), ctx.allocate(n)

    def cleanup():
        src.free()
        dst.free()
    try:
        ctx.write(src, np.arange(n // 4, dtype=np.uint32))
        ctx.write(dst, np.zeros(n // 4, dtype=np.uint32))      # pages touched
        if read is None:
            seq.copy(src, dst, [(0, 0, n)])
            return cleanup
        local = min(cand.params["local_size"], lim["maxComputeWorkGroupInvocations"],
                    lim["maxComputeWorkGroupSize"][0])
        kernel = f"bench_copy_{read}"
        kind, fmt = (UNIFORM_TEXEL, FORMAT_RGBA32_UINT) if read == "texel" else (STORAGE, 0)
        pipe = ctx.pipelines.get(kernel, (kind, STORAGE), 8, {0: local})
        count = n // 16
        gx, gy = _grid(lim, ceil_div(count, local * PER_INVOCATION))
        seq.dispatch(pipe, [Bind(src, 0, n, "r", fmt), Bind(dst, 0, n, "w")], (gx, gy, 1),
                     pack(kernel, "push", count=count, row=gx * local))
    except BaseException:
        cleanup()
        raise
    return cleanup


#: Candidates ``copy-engine`` (the default: every device has it), ``ssbo-<local>`` and
#: ``texel-<local>`` (the 64-wide ones only in full mode).
COPY = tuning.register_path(
    "copy",
    [Candidate("copy-engine", {"engine": "vkCmdCopyBuffer"}),
     Candidate("ssbo-256", {"read": "ssbo", "local_size": 256}),
     Candidate("texel-256", {"read": "texel", "local_size": 256}),
     Candidate("ssbo-64", {"read": "ssbo", "local_size": 64}, fast=False),
     Candidate("texel-64", {"read": "texel", "local_size": 64}, fast=False)],
    "copy-engine", copy_class, copy_run, examples=(64 << 10, 1 << 20, 4 << 20))


if __name__ == "__main__":
    from vkml.tune import main

    sys.exit(main())

"""Convolutions whose input, output or residual is larger than maxStorageBufferRange, run
on the path a window of the batch gets.

Every path but direct binds each tensor whole, so such a convolution used to run on the
direct path (the only one binding a window of batch items at a time,
``DirectPath._batch_windows``): one invocation per output, about 100x slower on lavapipe
than the GEMM and Winograd paths on the same per-item geometry.  Batch items are
independent in both directions, so :func:`windowed_path` cuts the batch into windows of
equal item counts (the last one may be smaller), each of whose tensors fits one binding
and starts at a byte offset every binding kind takes (minStorageBufferOffsetAlignment and
minTexelBufferOffsetAlignment: the paths read through texel views), and builds the path
:func:`~.choice.choose_path` gives a window's descriptor (the tuner's choice for the
window's shape) -- one for the full windows, one for a smaller last window.
:class:`WindowedPath` records that path once per window on sub-allocations of the input,
output and residual at the window's offset, as a graph's join in place hands a path a
slice of its arena.  Every tensor vkml binds starts at such an aligned offset
(allocations, a graph's arena views and join slices), so windows starting on multiples
of the items whose bytes are aligned (:func:`_quantum`) are too; where not one such
multiple fits the limit, the direct path runs the convolution, as before.
"""
from __future__ import annotations

import dataclasses
import math

from ...dml.tensor_desc import TensorDesc
from ...intmath import ceil_div, round_up
from ...runtime import UNIFORM_TEXEL
from .epilogue import residual_of
from .geometry import Geometry


class _WindowOp:
    """The operator as a path built for one window sees it: its descriptor with the
    window's batch; the rest (pipelines, uploads, scratch, limits) is the operator's.
    A tuned choice is not observed per window: an execution runs every window, so its
    time is not the window's the tuner measured."""

    def __init__(self, op, desc):
        self._op, self.desc = op, desc

    def __getattr__(self, name):
        return getattr(self._op, name)

    def observe_choice(self, choice, shape, path=None) -> None:
        pass


def _batch_of(t: TensorDesc | None, n: int) -> TensorDesc | None:
    """Tensor ``t`` with ``n`` batch items, its element strides kept."""
    if t is None:
        return None
    return TensorDesc(t.data_type, (n, *t.sizes[1:]), t.strides, flags=t.flags)


def window_desc(desc, n: int):
    """The convolution descriptor of ``n`` batch items of ``desc`` (residual too)."""
    kw = dict(input_tensor=_batch_of(desc.input_tensor, n),
              output_tensor=_batch_of(desc.output_tensor, n))
    if residual_of(desc) is not None:
        kw["residual"] = _batch_of(desc.residual, n)
    return dataclasses.replace(desc, **kw)


def _bytes(t: TensorDesc | None) -> int:
    return round_up(t.total_tensor_size_in_bytes, 16) if t is not None else 0


def _most_items(desc, limit: int) -> int:
    """The most batch items whose tensors each fit ``limit`` bytes (0: not one)."""
    lo, hi = 0, desc.input_tensor.sizes[0]
    while lo < hi:                      # tensor bytes grow with the items: bisection
        mid = (lo + hi + 1) // 2
        d = window_desc(desc, mid)
        if max(_bytes(t) for t in (d.input_tensor, d.output_tensor, residual_of(d))) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _quantum(desc, align: int) -> int:
    """The least item count whose batch stride in bytes, in every windowed tensor, is a
    multiple of ``align``: windows start on multiples of it."""
    e = desc.input_tensor.data_type.size
    q = 1
    for t in (desc.input_tensor, desc.output_tensor):
        step = t.element_strides[0] * e
        q = math.lcm(q, align // math.gcd(step, align))
    return q


def windowed_path(op, geo: Geometry, force: str | None = None):
    """A :class:`WindowedPath` for a convolution whose input, output or residual exceeds
    maxStorageBufferRange while windows of its batch fit, where a path other than
    direct takes a window (``force``: that candidate); else None (the direct path,
    which windows the batch itself, or refuses one item beyond the limit)."""
    from .choice import choose_path
    d, ctx = op.desc, op.ctx
    limit = ctx.limits["maxStorageBufferRange"]
    if (not geo.plain or force == "direct" or geo.n < 2
            or max(t.total_tensor_size_in_bytes for t in (d.input_tensor, d.output_tensor,
                                                            residual_of(d)) if t is not None)
            <= limit):
        return None
    align = max(16, ctx.binding_alignment(), ctx.binding_alignment(UNIFORM_TEXEL))
    found = _window_size(op, geo, force, _quantum(d, align), limit)
    if found is None:
        return None
    size, wop, wgeo = found
    full = choose_path(wop, wgeo, force)
    if full.name == "direct" and force is None:
        return None
    last = geo.n - (ceil_div(geo.n, size) - 1) * size
    tail = full
    if last != size:
        lop = _WindowOp(op, window_desc(d, last))
        tail = choose_path(lop, Geometry.of(lop.desc), force)
    return WindowedPath(op, geo, size, full, tail)


def _window_size(op, geo: Geometry, force, q: int, limit: int):
    """(items, window operator, window geometry) of the largest equal windows (multiples
    of ``q`` items within ``limit``) that a path other than direct takes (``force``: that
    candidate), or None.  Bisection over the multiples of ``q``: a path that takes a
    window takes a smaller one (their limits are bytes: gemm's and Winograd's scratch
    buffers must fit too, so their windows are about half the limit)."""
    from .choice import CANDIDATES, _path_class, heuristic
    from .geometry import knobs_of

    def window(m):
        size = round_up(ceil_div(geo.n, ceil_div(geo.n, m)), q)    # the last one smaller
        wop = _WindowOp(op, window_desc(op.desc, size))
        wgeo = Geometry.of(wop.desc)
        if not wgeo.plain:
            return None
        if force is not None:
            path, extra = CANDIDATES.get(force, (None, None))
            ok = path is None or _path_class(path).accepts(wop, wgeo, knobs_of(extra))
        else:
            ok = heuristic(wop, wgeo)[0] != "direct"
        return (size, wop, wgeo) if ok else None

    lo, hi = 0, _most_items(op.desc, limit) // q       # in multiples of q
    best = None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        found = window(mid * q)
        if found is not None:
            lo, best = mid, found
        else:
            hi = mid - 1
    return best


class WindowedPath:
    """A path built for a window of ``size`` batch items (``full``; ``tail`` for the last,
    smaller window), recorded once per window on sub-allocations of the tensors at the
    window's offsets (module doc).  ``name`` and ``candidate``: the window path's.

    The window paths re-lay or transform the filter once per execution, not once per
    window; an OWNED_BY_DML filter is copied at initialization (no buffer of its own
    here: two window paths may each have one) and re-laid per execution."""

    filter_ready = False

    def __init__(self, op, geo: Geometry, size: int, full, tail):
        self.op, self.geo, self.size = op, geo, size
        self.name = full.name
        self.candidate = getattr(full, "candidate", full.name)
        self.paths = [full] if tail is full else [full, tail]
        self.RESIDUAL = all(p.RESIDUAL for p in self.paths)
        for p in self.paths:
            p.filter_ready = True       # (encode re-lays the filter once, for every window)
        #: (first item, items, path) per window
        self.windows = [(n0, min(size, geo.n - n0), full if n0 + size <= geo.n else tail)
                        for n0 in range(0, geo.n, size)]
        e = op.desc.input_tensor.data_type.size
        self.steps = {"x": op.desc.input_tensor.element_strides[0] * e,
                      "y": op.desc.output_tensor.element_strides[0] * e}
        self._parts: dict = {}

    def filter_buffer(self):
        return None

    def encode_filter(self, seq, w) -> None:
        for p in self.paths:
            if p.filter_buffer() is not None:
                p.encode_filter(seq, w)

    def _part(self, seq, alloc, offset: int, desc: TensorDesc):
        """Bytes of ``alloc`` from ``offset`` holding ``desc`` (rounded up to 16 within
        it) as a sub-allocation, kept per (allocation, window) while both live."""
        size = min(round_up(desc.total_tensor_size_in_bytes, 16), alloc.size - offset)
        key = (id(alloc), offset, size)
        part = self._parts.get(key)
        if part is None or not part.alive or part.parent is not alloc:
            part = self._parts[key] = alloc.sub_allocation(offset, size)
        seq.keep(part)
        return part

    def encode(self, seq, x, w, b, y, r=None) -> None:
        self._parts = {k: p for k, p in self._parts.items() if p.alive}
        if not self.filter_ready:
            self.encode_filter(seq, w)
        for n0, _, path in self.windows:
            d = path.op.desc
            xs = self._part(seq, x, n0 * self.steps["x"], d.input_tensor)
            ys = self._part(seq, y, n0 * self.steps["y"], d.output_tensor)
            if r is not None:
                path.encode(seq, xs, w, b, ys, self._part(seq, r, n0 * self.steps["y"],
                                                           d.residual))
            else:
                path.encode(seq, xs, w, b, ys)

"""What every functional operator (``vkml.pad``, ``vkml.fold``, ...) does around its desc.

NumPy in -> NumPy out; Tensor in -> Tensor out (the result stays on the device).
``device=None`` means the device of a Tensor argument, else the default device.

For NumPy calls the device tensors that carry the arrays are kept with the compiled
operator (up to ``REUSE_BYTES``) and reused by the next call with the same descriptor,
so a repeated call is: copy in, replay the recorded command buffer, copy out.  Where
those tensors are not host-visible (a discrete GPU: staged transfers), host-visible
staging buffers are kept with them, and the recorded command buffer copies the staging
buffers into the input tensors, runs the operator and copies the outputs back: still
one submission a call (``_host_views``).

Larger NumPy calls on devices that import host memory (``Context.host_imports``: CPU
drivers and integrated GPUs with VK_EXT_external_memory_host; never with staging) copy
nothing: each input array's pages are imported where its address meets the binding
alignments (else that input is copied into a device tensor), and the result is written
by the kernel into page-aligned host memory that is returned as the NumPy array (its
pages recycled once the array is dropped, see ``HostImports.take``).  Such a call
records its command buffer afresh (new bindings), which is why small calls keep the
copy-and-replay path: the import path pays from ``IMPORT_BYTES`` of inputs + outputs.
"""
from __future__ import annotations

import math
import mmap

import numpy as np

from ..dml.operator import as_real, as_tuple, as_uint  # noqa: F401  (the coercion helpers)
from ..dml.tensor_desc import allocation_size
from ..errors import ArgumentTypeError, ValidationError
from ..tensor import Tensor
from .base import Transfers

#: Largest total size of NumPy-call tensors kept for reuse per compiled operator.  Beyond
#: it the tensors are allocated per call, which costs nothing measurable (the heap keeps
#: freed dedicated blocks).
REUSE_BYTES = 32 << 20
#: Smallest total size (inputs + outputs) of a NumPy call that imports host memory instead
#: of copying.  Measured on lavapipe, vkml.pad of float32 by 2 on each side of H and W,
#: copy vs import path interleaved in one process (fastest of 5-9 rounds, ms), by input
#: size: 256 KiB 0.33 vs 0.50, 512 KiB 0.49 vs 0.62, 1 MiB 0.66-0.73 vs 0.66-0.69,
#: 2 MiB 0.94 vs 0.85, 4 MiB 1.55 vs 1.21, 16 MiB 6.9 vs 2.9, 64 MiB 42 vs 14.1.  On
#: SwiftShader (whose 256-byte binding alignment refuses NumPy's usual addresses, so
#: inputs are copied) 1-4 MiB are even and 16 MiB 19.5 vs 16.5.
IMPORT_BYTES = 2 << 20


def pick_device(device, *args):
    """The device to run on (see module doc); Tensor arguments must all be on it."""
    mod = _device_module or _import_device()
    tensors = [a for a in args if isinstance(a, Tensor)] if args else ()
    if device is None:
        device = tensors[0].device if tensors else mod.default_device()
    elif not isinstance(device, mod.Device):
        raise ValidationError("device", f"must be a vkml.Device, got {type(device).__name__}")
    for t in tensors:
        if t.device is not device:
            raise ValidationError("device", "a Tensor argument is on another device")
    return device


_device_module = None


def _import_device():
    """``vkml.device``, imported on first use (it imports this module's package)."""
    global _device_module
    from .. import device as mod

    _device_module = mod
    return mod


def as_array(x, name: str, optional: bool = False):
    """A Tensor stays a Tensor; anything else becomes a C-contiguous NumPy array.

    Argument types, for every functional form (the per-dimension and scalar arguments
    go through ``vkml.dml.operator.as_tuple`` / ``as_uint`` / ``as_real``):
    * None raises ArgumentTypeError (a TypeError) unless the input is ``optional``
      (``bias``); so does an array of strings, objects, complex numbers or dates, or a
      nested list NumPy cannot make numeric.  A bool array is refused by the data type
      rule (DML has no boolean type): ValidationError.
    * A 0-d input (a NumPy scalar, ``np.float32(1)``) is refused with ValidationError:
      ``numpy.pad`` returns it unchanged, but DML tensors have 1 to 8 dimensions and no
      operator here has a dimension to work on in a scalar.
    """
    if x is None:
        if optional:
            return None
        raise ArgumentTypeError(name, "must be a numpy array or a vkml.Tensor, got None")
    if not isinstance(x, Tensor):
        try:
            x = np.asarray(x)
            if x.ndim:            # (ascontiguousarray would make a 0-d array 1-d)
                x = np.ascontiguousarray(x)
        except Exception as exc:  # noqa: BLE001
            raise ArgumentTypeError(name, f"must be a numpy array or a vkml.Tensor ({exc})") \
                from None
        if x.dtype.kind not in "biuf":
            raise ArgumentTypeError(name, f"must hold numbers, got an array of {x.dtype} "
                                    f"({type(x).__name__})")
    if len(x.shape) == 0:
        raise ValidationError(name, "a 0-d array (a scalar) has no dimension to work on; "
                              "DML tensors have 1 to 8 dimensions")
    return x


def check_outputs(device, shapes, out_descs) -> None:
    """Refuse, before anything is allocated (host pages included), a result larger than
    the device can hold in one allocation: DeviceError naming the size and the limit."""
    heap = device.context.tensor_heap
    for s, d in zip(shapes, out_descs):
        allocation_size(s, d.dtype, d.total_tensor_size_in_bytes, heap, what="a result")


def run(device, desc, args: list, out_shapes: list[tuple] | None = None, key=None):
    """Compile (cached) and execute ``desc`` on ``args``; return the output(s) in the
    kind the arguments came in (one output -> not a list).

    ``key``: the functional form's arguments as a hashable value that determines ``desc``
    completely (see :func:`prepared`); once ``desc`` has passed validation, compilation
    and the result-size check on this device, the next call with an equal key skips them
    (``run_prepared``)."""
    out_descs = desc.outputs()
    shapes = out_shapes or [d.sizes for d in out_descs]
    try:
        hash(desc)                  # the compiled-operator cache's key
    except TypeError:               # a field of a wrong type (a list as a mode): name it
        desc.validate()
        raise
    # Validation first (a descriptor the kernels cannot index is a ValidationError naming
    # its field), then the result sizes against the device, before NumPy allocates them.
    compiled = device.compiled(desc)
    check_outputs(device, shapes, out_descs)
    entry = _Prepared(compiled, shapes, out_descs)
    if key is not None and PREPARED_MAX:
        cache = device.prepared_calls
        if len(cache) >= PREPARED_MAX:
            cache.clear()
        cache[key] = entry
    return run_prepared(device, entry, args)


#: Most prepared calls kept per device (0 turns the cache off: every call validates).
PREPARED_MAX = 256


class _Prepared:
    """A validated, compiled functional call: what ``run`` derived from its descriptor."""

    __slots__ = ("compiled", "shapes", "out_descs", "out_bytes", "replay")

    def __init__(self, compiled, shapes, out_descs):
        self.compiled = compiled
        self.shapes = shapes
        self.out_descs = out_descs
        self.out_bytes = sum(d.total_tensor_size_in_bytes for d in out_descs)
        self.replay: _Replay | None = None     # set by the first copy-and-replay call


class _Replay:
    """The copy-and-replay of a prepared call, bound once: the I/O set, its typed host
    views (``_host_views``) and the recorded command buffer (a
    ``CompiledOperator.replay`` token, with the staging copies where there are any).
    A repeated call copies in, replays and copies out without re-checking what the
    first call established (the I/O tensors' key and liveness, ``execute``'s argument
    checks): a third of a tiny ``vkml.pad``'s Python time (docs/DEVELOPING.md, "A tiny
    call's time").  Any change (another I/O set, a re-recorded buffer, a busy or
    released operator, a size now over ``IMPORT_BYTES``) falls back to the full path."""

    __slots__ = ("compiled", "io", "nargs", "ins", "absent", "outs", "token", "lifetime",
                 "imported_from")

    def __init__(self, compiled, io, views, token, ctx, out_bytes):
        self.compiled, self.io, self.token, self.lifetime = compiled, io, token, ctx.lifetime
        self.nargs = len(views[0])
        self.ins = [(i, v) for i, v in enumerate(views[0]) if v is not None]
        self.absent = [i for i, v in enumerate(views[0]) if v is None]   # optional inputs
        self.outs = views[1]
        #: The call's bytes as ``run_prepared`` counts them against ``IMPORT_BYTES`` (read
        #: at each call), or None where the device imports nothing.
        self.imported_from = None if ctx.host_imports is None else \
            sum(v.nbytes for v in views[0] if v is not None) + out_bytes

    def __call__(self, args):
        """The result, or None (nothing done) where the full path must run."""
        compiled = self.compiled
        if compiled.io is not self.io or (self.imported_from is not None
                                          and self.imported_from >= IMPORT_BYTES):
            return None
        if len(args) != self.nargs:
            return None
        for i in self.absent:
            if args[i] is not None:
                return None
        for i, v in self.ins:
            a = args[i]
            if type(a) is not np.ndarray or a.shape != v.shape or a.dtype != v.dtype:
                return None
        lock = compiled.io_lock
        if not lock.acquire(blocking=False):
            return None
        try:
            if compiled.released:       # (its I/O tensors are freed with it)
                return None
            with self.lifetime:         # one entry: no close while we touch the memory
                for i, v in self.ins:
                    np.copyto(v, args[i])
                if not compiled.replay(self.token):
                    return None
                if len(self.outs) == 1:
                    return self.outs[0].copy()
                return [v.copy() for v in self.outs]
        finally:
            lock.release()


def prepared(device, key):
    """The prepared call ``run`` stored for ``key`` on ``device``, or None.

    A functional form builds ``key`` only from arguments of exact built-in types (int,
    float by its bits, str, tuples and lists of ints) together with the input's shape and
    dtype, so that an equal key means an equal descriptor: anything else (a NumPy scalar,
    a bool, a NaN) gives no key and takes the full path, whose checks raise on every call
    with bad arguments (a call that raised stored nothing).  An entry whose compiled
    operator was released (evicted from ``Device.compiled``) is dropped."""
    entry = device.prepared_calls.get(key)
    if entry is not None and entry.compiled.released:
        device.prepared_calls.pop(key, None)
        return None
    return entry


def run_prepared(device, entry, args: list):
    """``run`` after its checks: execute the prepared call on ``args``."""
    replay = entry.replay
    if replay is not None:
        result = replay(args)
        if result is not None:
            return result
        entry.replay = None
    compiled, shapes, out_descs = entry.compiled, entry.shapes, entry.out_descs
    for a in args:
        if isinstance(a, Tensor):
            inputs = [a if a is None or isinstance(a, Tensor) else device.tensor(a)
                      for a in args]
            outs = [device.empty(s, d.dtype, nbytes=d.total_tensor_size_in_bytes)
                    for s, d in zip(shapes, out_descs)]
            compiled.execute(inputs, outs)
            return outs[0] if len(outs) == 1 else outs
    imports = device.context.host_imports
    if imports is not None and (sum(a.nbytes for a in args if a is not None)
                                + entry.out_bytes) >= IMPORT_BYTES:
        return _run_imported(device, compiled, args, shapes, out_descs)
    lock = compiled.io_lock
    if lock.acquire(blocking=False):
        try:
            inputs, outs, kept = _io_tensors(device, compiled, args, shapes, out_descs)
            views = _host_views(compiled) if kept else None
            if views is not None:           # kept I/O tensors: copy through host views
                ctx = device.context
                transfers = views[2]
                with ctx.lifetime:          # one entry: no close while we touch the memory
                    for v, a in zip(views[0], args):
                        if v is not None:
                            np.copyto(v, a)
                    compiled.execute(inputs, outs, transfers)
                    result = [v.copy() for v in views[1]]
                token = compiled.replay_token(inputs, outs, transfers)
                if token is not None and compiled.io is not None:
                    entry.replay = _Replay(compiled, compiled.io, views, token, ctx,
                                           entry.out_bytes)
                return result[0] if len(result) == 1 else result
            write = device.context.write
            device.check_open()
            for t, a in zip(inputs, args):
                if a is not None:         # (as_array made it C-contiguous, its shape is t's)
                    write(t.allocation, a)
            compiled.execute(inputs, outs)
            if len(outs) == 1:
                result = outs[0].numpy()
            else:
                result = [o.numpy() for o in outs]
            if not kept:
                for t in inputs + outs:
                    if t is not None:
                        t.free()
        finally:
            lock.release()
        return result
    # another thread is using this operator's tensors: use fresh ones
    inputs = [None if a is None else device.tensor(a) for a in args]
    outs = [device.empty(s, d.dtype, nbytes=d.total_tensor_size_in_bytes)
            for s, d in zip(shapes, out_descs)]
    compiled.execute(inputs, outs)
    result = [o.numpy() for o in outs]
    for t in inputs + outs:
        if t is not None:
            t.free()
    return result[0] if len(result) == 1 else result


def _host_views(compiled):
    """``(inputs, outputs, transfers)``: typed NumPy views through which a call's arrays
    reach the compiled operator's reusable I/O tensors, made once per I/O set and kept
    with it, so a prepared call's copies are one ``np.copyto`` each way (None without an
    I/O set).  A host-visible tensor is viewed itself.  One that is not (staged
    transfers) is viewed through a host-visible staging buffer of its own, which
    ``transfers`` (a ``base.Transfers``, None where nothing is staged) copies into the
    input, or out of the output, in the operator's recorded command buffer: the call
    stays one submission, where separate staged copies would cost a submission and a
    wait each.  The staging buffers go with the I/O set (``_io_tensors``) or with the
    operator (``CompiledOperator.own``)."""
    io = compiled.io
    if io is None:
        return None
    if len(io) > 4:
        return io[4]
    heap = compiled.ctx.staging_heap
    staging: list = []
    uploads: list = []
    downloads: list = []

    def typed(t, upload: bool):
        n = t.size * t.dtype.itemsize
        alloc = t.allocation
        if alloc.host is None:
            stage = heap.allocate(n)
            staging.append(stage)
            if n and upload:
                uploads.append((stage, alloc, n))
            elif n:
                downloads.append((alloc, stage, n))
            alloc = stage
        return alloc.host[:n].view(t.dtype).reshape(t.shape)

    try:
        ins = [None if t is None else typed(t, True) for t in io[1]]
        outs = [typed(t, False) for t in io[2]]
    except BaseException:
        for a in staging:
            a.free()
        raise
    compiled.own(staging)
    transfers = Transfers(tuple(uploads), tuple(downloads)) if staging else None
    views = (ins, outs, transfers, staging)
    compiled.io = io[:4] + (views,)
    return views


def _io_tensors(device, compiled, args, shapes, out_descs):
    """The compiled operator's reusable input/output tensors for these arguments."""
    cached = compiled.io
    if cached is not None:
        key, tensors = cached[0], cached[3]
        ok = len(key) == len(args)
        if ok:
            for k, a in zip(key, args):
                if a is None or k is None:
                    if a is not k:
                        ok = False
                        break
                elif k[0] != a.shape or k[1] != a.dtype.str:
                    ok = False
                    break
            for t in tensors:
                if not t.allocation.alive:
                    ok = False
                    break
        if ok:
            return cached[1], cached[2], True
        for t in tensors:
            t.free()
        for a in cached[4][3] if len(cached) > 4 else ():
            a.free()                # (its staging buffers, see _host_views)
        compiled.io = None
    inputs = [None if a is None else device.empty(a.shape, a.dtype) for a in args]
    outs = [device.empty(s, d.dtype, nbytes=d.total_tensor_size_in_bytes)
            for s, d in zip(shapes, out_descs)]
    total = sum(t.nbytes for t in inputs + outs if t is not None)
    if total > REUSE_BYTES:
        return inputs, outs, False
    key = tuple(None if a is None else (a.shape, a.dtype.str) for a in args)
    compiled.io = (key, inputs, outs, [t for t in inputs + outs if t is not None])
    compiled.own([t.allocation for t in inputs + outs if t is not None])  # freed on release
    return inputs, outs, True


def _importable(a: np.ndarray) -> bool:
    """Whether an input array's pages may be imported: ordinary writable host memory
    (not a read-only array such as one over ``bytes``, nor a file mapping)."""
    if not a.flags.writeable:
        return False
    base = a
    while isinstance(base, np.ndarray):
        base = base.base
    return not isinstance(base, mmap.mmap)


def _input_tensor(device, a: np.ndarray) -> Tensor:
    """``a`` as a tensor: its own pages where they can be imported, else a copy."""
    imports = device.context.host_imports
    nbytes = (a.nbytes + 3) & ~3
    alloc = imports.leased(a)
    if alloc is not None:                         # a result of this device passed back in
        return Tensor(device, a.shape, a.dtype, alloc, nbytes, owner=False)
    if a.nbytes and _importable(a):
        alloc = device.context.import_host(a.ctypes.data, a.nbytes)
        if alloc is not None:
            return Tensor(device, a.shape, a.dtype, alloc, nbytes)
    return device.tensor(a)


def _run_imported(device, compiled, args, shapes, out_descs):
    """``run`` for large NumPy calls on a device that imports host memory (module doc)."""
    imports = device.context.host_imports
    temps: list[Tensor] = []
    taken: list = []
    try:
        inputs = []
        for a in args:
            t = None if a is None else _input_tensor(device, a)
            if t is not None:
                temps.append(t)
            inputs.append(t)
        outs = []
        for s, d in zip(shapes, out_descs):
            dtype = np.dtype(d.dtype)
            nbytes = max(math.prod(s) * dtype.itemsize, d.total_tensor_size_in_bytes)
            pages = imports.take(nbytes)
            if pages is None:                     # the driver refused: copy out
                t = device.empty(s, dtype, nbytes=d.total_tensor_size_in_bytes)
                temps.append(t)
            else:
                t = Tensor(device, s, dtype, pages.alloc, (nbytes + 3) & ~3, owner=False)
            taken.append(pages)
            outs.append(t)
        with device.context.sequence() as seq:
            compiled.record(seq, inputs, outs)
            seq.run()
        result = [t.numpy() if p is None else imports.array(p, t.shape, t.dtype)
                  for t, p in zip(outs, taken)]
        taken.clear()                             # the arrays hold them now
    finally:
        for t in temps:
            t.free()
        for p in taken:
            if p is not None:
                imports.give_back(p)
    return result[0] if len(result) == 1 else result

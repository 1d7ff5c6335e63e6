"""Compiled operators: the common half of every operator implementation.

An implementation subclasses :class:`CompiledOperator`, decorates itself with
``@implements(SomeOperatorDesc)`` and defines ``build()`` (choose kernels, create
pipelines and parameter buffers: ``IDMLDevice::CompileOperator``) and
``encode(seq, inputs, outputs)`` (record its dispatches into a sequence).  Binding
checks, execution, replay and release are done here, and so is the re-check of a tuned
choice: an operator whose kernel path the tuner chose sets :attr:`CompiledOperator.observed`,
and every :data:`OBSERVE_EVERY`-th execution of such operators runs timed and reports its
time to the tuner (:meth:`vkml.tuning.Tuner.observe`), which marks the choice stale when
the times disagree with it by a wide margin (a choice measured under load).
"""
from __future__ import annotations

import itertools
import threading
import time
import weakref
from dataclasses import dataclass, replace

import numpy as np

from .. import runtime, tuning
from ..dml.operator import OperatorDesc
from ..errors import DeviceError, UnsupportedError, ValidationError
from ..tensor import Tensor
from ..runtime.blocks import pack
from ..runtime.scheduler import place_of

REGISTRY: dict[type, type["CompiledOperator"]] = {}
#: Every this-many-th ``execute`` of an operator whose path the tuner chose (counted over
#: all such operators of the process) runs in a timed sequence and reports its time
#: (GPU timestamps, else wall time, as the tuner measures); the other calls pay one
#: counter increment.
OBSERVE_EVERY = 64
_CALLS = itertools.count()


def release_all(made) -> None:
    """Release (operators) or free (tensors) each of ``made``: what a tuner's run
    function allocated."""
    for m in made:
        m.release() if hasattr(m, "release") else m.free()


def empty_for(device, desc) -> Tensor:
    """A zeroed device tensor holding ``desc``'s TotalTensorSizeInBytes (its data type):
    what the tuner times a candidate on.  Zeroed, because memory left by earlier work may
    hold NaN or infinity (a constant filter with one takes another path:
    ``CompiledConvolution.initialize``) or subnormals (which some drivers time apart)."""
    t = device.empty(desc.total_tensor_size_in_bytes // desc.data_type.size, desc.dtype)
    with device.sequence() as seq:
        seq.fill(t.allocation, 0, t.allocation.size - t.allocation.size % 4, 0)
        seq.run()
    return t


def check_choice(field: str, value, allowed) -> None:
    """ValidationError naming ``field`` unless ``value`` is None (the operator's own
    choice) or one of ``allowed`` (a constructor's forced path or read)."""
    if value not in (None, *allowed):
        names = [repr(a) for a in allowed]
        listed = " or ".join(filter(None, [", ".join(names[:-1]), names[-1]]))
        raise ValidationError(field, f"must be {listed}, got {value!r}")


def implements(*desc_types):
    """Class decorator: register a CompiledOperator for these descriptor types."""
    def deco(cls):
        for t in desc_types:
            REGISTRY[t] = cls
        return cls
    return deco


class Operator:
    """A validated descriptor on a device (``IDMLOperator``)."""

    def __init__(self, device, desc: OperatorDesc):
        self.device = device
        self.desc = desc

    def __repr__(self) -> str:
        return f"vkml.Operator({self.desc.OPERATOR_TYPE})"


def compile_operator(op: Operator, path: str | None = None) -> "CompiledOperator":
    """The operator's implementation built for it; ``path`` (operators with several
    kernel paths: convolution, padding) forces one, as their ``path=`` argument."""
    impl = REGISTRY.get(type(op.desc))
    if impl is None:
        raise UnsupportedError(op.desc.OPERATOR_TYPE, "vkml has no implementation of it")
    return impl(op.device, op.desc) if path is None else impl(op.device, op.desc, path=path)


class CompiledOperator:
    """``IDMLCompiledOperator``: ``execute(inputs, outputs)`` or ``record(seq, ...)``."""

    #: ``(tuning key, candidate, expected seconds or None, stale factor or None)`` where
    #: the tuner chose this operator's path (set by ``build``): its sampled executions
    #: are reported with :meth:`vkml.tuning.Tuner.observe` (module doc).
    observed: tuple | None = None

    def __init__(self, device, desc: OperatorDesc):
        self.device = device
        self.ctx: runtime.Context = device.context
        self.desc = desc
        self.features = self.ctx.features
        self._owned: list = []          # allocations this operator owns (parameters, weights)
        self._cache: _Recording | None = None     # ``execute``'s recorded command buffer
        self._lock = threading.Lock()
        #: The functional API's reusable input/output tensors for this operator
        #: (``(key, inputs, outputs)`` or None) and the lock of their use.
        self.io = None
        self.io_lock = threading.Lock()
        self.released = False
        # Its pipelines (a graph's: all its nodes') compile in the background while it is
        # built; a failed creation raises here, as when they were created inline.
        with self.ctx.pipelines.batch():
            self.build()

    # -- for subclasses ----------------------------------------------------------------
    def build(self) -> None:
        raise NotImplementedError

    def encode(self, seq: runtime.Sequence, inputs: list, outputs: list) -> None:
        """Record the dispatches; ``inputs``/``outputs`` are Tensors (or None)."""
        raise NotImplementedError

    def pipeline(self, name: str, consts: dict | None = None):
        """The pipeline of kernel variant ``name`` (a ``vkml:variant`` of glsl/) with
        specialization constants by name; its bindings and push constants are those the
        kernel declares (vkml/shaders/manifest.json).  A variant or constant the manifest
        does not list raises ValueError here."""
        return self.ctx.pipelines.variant(name, consts)

    def upload(self, array: np.ndarray) -> runtime.Allocation:
        """A device buffer owned by this operator holding ``array`` (parameters, weights)."""
        data = np.ascontiguousarray(array)
        alloc = self.ctx.allocate(max(data.nbytes, 4))
        self.ctx.write(alloc, data)
        self._owned.append(alloc)
        return alloc

    def upload_block(self, kernel: str, block: str, **values) -> runtime.Allocation:
        """:meth:`upload` of ``kernel``'s uniform block ``block`` with its members set by
        name (:func:`vkml.runtime.blocks.pack`)."""
        return self.upload(np.frombuffer(pack(kernel, block, **values), np.uint8))

    def scratch(self, nbytes: int) -> runtime.Allocation:
        """A device buffer owned by this operator (temporary results)."""
        alloc = self.ctx.allocate(max(int(nbytes), 4))
        self._owned.append(alloc)
        return alloc

    def own(self, allocations) -> None:
        """Take ownership of ``allocations``: freed when this operator is released
        (e.g. the functional API's reusable input and output tensors)."""
        self._owned.extend(allocations)

    def require(self, feature: str, why: str) -> None:
        """Raise UnsupportedError unless the device has ``feature``."""
        if not self.features.get(feature):
            raise UnsupportedError(feature, why)

    @property
    def workgroup_size(self) -> int:
        """A 1-D workgroup size every device takes (read from its limits)."""
        lim = self.ctx.limits
        return int(min(256, lim["maxComputeWorkGroupInvocations"],
                       lim["maxComputeWorkGroupSize"][0]))

    # -- binding -----------------------------------------------------------------------
    def _check_bindings(self, inputs, outputs) -> tuple[list, list]:
        descs_in, descs_out = self.desc.inputs(), self.desc.outputs()
        inputs = list(inputs) if inputs is not None else []
        outputs = list(outputs) if outputs is not None else []
        if len(inputs) != len(descs_in):
            # optional trailing inputs may be left out
            if len(inputs) < len(descs_in) and all(d is None for d in descs_in[len(inputs):]):
                inputs += [None] * (len(descs_in) - len(inputs))
            else:
                raise ValidationError("inputs", f"{self.desc.OPERATOR_TYPE} takes "
                                      f"{len(descs_in)} inputs, got {len(inputs)}")
        if len(outputs) != len(descs_out):
            raise ValidationError("outputs", f"{self.desc.OPERATOR_TYPE} takes "
                                  f"{len(descs_out)} outputs, got {len(outputs)}")
        for kind, tensors, descs in (("inputs", inputs, descs_in), ("outputs", outputs, descs_out)):
            for i, (t, d) in enumerate(zip(tensors, descs)):
                if d is None:
                    if t is not None:
                        raise ValidationError(f"{kind}[{i}]", "is bound but its tensor "
                                              "descriptor is null")
                    continue
                if not isinstance(t, Tensor):
                    raise ValidationError(f"{kind}[{i}]", f"must be a vkml.Tensor, got "
                                          f"{type(t).__name__}")
                if t.device is not self.device:
                    raise ValidationError(f"{kind}[{i}]", "is on another device")
                if not t.allocation.alive:
                    self._check_live()      # a closed device's tensors: DeviceError
                    raise ValidationError(f"{kind}[{i}]", "was freed")
                if t.nbytes < d.total_tensor_size_in_bytes:
                    raise ValidationError(f"{kind}[{i}]", f"holds {t.nbytes} bytes, the "
                                          f"descriptor needs TotalTensorSizeInBytes = "
                                          f"{d.total_tensor_size_in_bytes}")
        return inputs, outputs

    def observe_choice(self, choice, shape, path=None) -> None:
        """This operator runs ``choice`` (``Tuner.choose``'s answer for ``shape`` on
        tunable path ``path``, default the one registered by the choice's name): where it
        was measured or stored, its sampled executions re-check it (module doc)."""
        if choice.source in ("measured", "stored"):
            self.observed = (choice.key, choice.name,
                             tuning.default_tuner().expected(choice, shape, path), None)

    def _execute_observed(self, inputs, outputs, transfers=None) -> None:
        """One execution in a timed sequence of its own, its time told to the tuner
        (``transfers`` in sequences of their own, so that the time is the operator's)."""
        self._check_live()
        inputs, outputs = self._check_bindings(inputs, outputs)
        if transfers is not None:
            transfers.run(self.ctx, transfers.uploads)
        with self.ctx.sequence(timed=True) as seq:
            self.encode(seq, inputs, outputs)
            t0 = time.perf_counter()
            seq.run()
            wall = time.perf_counter() - t0
            seconds = seq.gpu_time_ns * 1e-9 if seq.gpu_time_ns else wall
        key, candidate, expected, factor = self.observed
        tuning.default_tuner().observe(key, candidate, seconds, expected=expected,
                                       factor=factor)
        if transfers is not None:
            transfers.run(self.ctx, transfers.downloads)

    def _encode(self, seq, inputs, outputs, transfers) -> None:
        """:meth:`encode`, between the copies of ``transfers`` where given."""
        if transfers is not None:
            transfers.record(seq, transfers.uploads)
        self.encode(seq, inputs, outputs)
        if transfers is not None:
            transfers.record(seq, transfers.downloads)

    def record(self, seq: runtime.Sequence, inputs, outputs, **encode_args) -> None:
        """Record this operator into ``seq`` (several operators may share one sequence).
        ``encode_args``: what the operator's ``encode`` takes beyond the bindings (a
        convolution's ``laid``)."""
        self._check_live()
        inputs, outputs = self._check_bindings(inputs, outputs)
        self.encode(seq, inputs, outputs, **encode_args)
        seq.keep(self)   # the sequence uses this operator's pipelines and buffers

    def execute(self, inputs, outputs, transfers: "Transfers | None" = None) -> None:
        """Run once and wait.  Repeated calls with the same tensors replay the recorded
        command buffer instead of recording it again; with the very Tensor objects of the
        last call (still alive), without checking their bindings again either; with new
        tensors standing where the last call's freed ones stood, moved to them
        (:func:`_rebound`).  ``transfers``: copies recorded into the same command
        buffer before and after the operator (:class:`Transfers`); a recording is
        replayed only for the very ``transfers`` it was made with."""
        if self.observed is not None and next(_CALLS) % OBSERVE_EVERY == 0:
            self._execute_observed(inputs, outputs, transfers)
            return
        self._check_live()
        if not self._lock.acquire(blocking=False):
            inputs, outputs = self._check_bindings(inputs, outputs)
            with self.ctx.sequence(hold=True) as seq:   # another thread is executing this one
                self._encode(seq, inputs, outputs, transfers)
                seq.run()
            return
        try:
            c = self._cache
            mine = c is not None and c.transfers is transfers
            given = _given(inputs, outputs)
            if mine and given is not None and _same_tensors(c.tensors, given):
                c.seq.run()
                return
            inputs, outputs = self._check_bindings(inputs, outputs)
            allocs = [t.allocation if t is not None else None for t in inputs + outputs]
            ids = tuple(id(a) for a in allocs)
            refs = _tensor_refs(given)
            if (mine and c.ids == ids
                    and all((r() if r is not None else None) is a
                            for r, a in zip(c.allocs, allocs))):
                self._cache = replace(c, tensors=refs)
                c.seq.run()
                return
            weak = [weakref.ref(a) if a is not None else None for a in allocs]
            # (recordings with transfers are bound to their I/O set: never moved)
            movable = transfers is None and c is not None and c.transfers is None
            if movable and _rebound(c, allocs):
                self._cache = replace(c, ids=ids, allocs=weak, tensors=refs)
                c.seq.run()
                return
            if (movable and c.spare is not None and c.spare.transfers is None
                    and _rebound(c.spare, allocs)):
                spare = c.spare      # ``y = op(y)``: the results alternate between two ranges
                self._cache = replace(spare, ids=ids, allocs=weak, tensors=refs,
                                      spare=replace(c, spare=None))
                spare.seq.run()
                return
            if c is not None:
                if c.spare is not None:
                    c.spare.seq.close()
                self._cache = None
            seq = self.ctx.sequence(hold=False)
            try:
                self._encode(seq, inputs, outputs, transfers)
            except BaseException:
                seq.close()
                if c is not None:
                    c.seq.close()
                raise
            # the last recording is kept as a spare (``_rebound``)
            self._cache = _Recording(ids, weak, seq, refs,
                                     tuple(None if a is None else place_of(a) for a in allocs),
                                     None if c is None else replace(c, spare=None), transfers)
            seq.run()
        finally:
            self._lock.release()

    def replay_token(self, inputs, outputs, transfers: "Transfers | None" = None):
        """An opaque token for :meth:`replay`: the command buffer ``execute`` recorded
        for these very Tensor objects (the last call's) and ``transfers``, or None when
        it holds others."""
        c = self._cache
        given = _given(inputs, outputs)
        if (c is not None and c.transfers is transfers and given is not None
                and _same_tensors(c.tensors, given)):
            return c
        return None

    def replay(self, token) -> bool:
        """``execute`` of the tensors ``token`` was taken for, without its argument and
        binding checks (they held when the token was taken, and the tensors are the
        caller's own: the functional API's reusable I/O tensors).  False, with nothing
        run, where ``execute`` must decide: the recorded buffer was replaced or the
        operator released since, another thread is executing it, or it is observed (the
        tuner's sampled executions are counted by ``execute``)."""
        if self.observed is not None or not self._lock.acquire(blocking=False):
            return False
        try:
            if self._cache is not token or self.released:
                return False
            token.seq.run()     # checks the device, the sequence and its allocations
            return True
        finally:
            self._lock.release()

    def drop_recording(self) -> None:
        """Close the command buffers ``execute`` keeps (its recording and the spare):
        what they bound changed (the caller holds the operator's lock, or owns it)."""
        c, self._cache = self._cache, None
        if c is not None:
            c.seq.close()
            if c.spare is not None:
                c.spare.seq.close()

    def _check_live(self) -> None:
        if self.released:
            raise DeviceError("this compiled operator was released")
        self.device.check_open()

    def release(self) -> None:
        """Free the operator's buffers and cached command buffer (idempotent)."""
        if self.released:
            return
        self.released = True
        with self._lock:
            self.drop_recording()
            for a in self._owned:
                a.free()
            self._owned.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


@dataclass(frozen=True, eq=False)
class _Recording:
    """``execute``'s recorded command buffer and what it was recorded for.  Replaced,
    never changed: :meth:`CompiledOperator.replay` checks a token by identity."""

    ids: tuple              # the bound allocations' ids, inputs then outputs
    allocs: list            # weak references to them (None: an unbound optional tensor)
    seq: runtime.Sequence
    tensors: tuple | None   # the caller's Tensor objects (:func:`_tensor_refs`)
    places: tuple           # each allocation's ``place_of`` when recorded (:func:`_rebound`)
    spare: "_Recording | None" = None   # the recording before this one
    transfers: "Transfers | None" = None    # the copies recorded around the operator


@dataclass(frozen=True, eq=False)
class Transfers:
    """Buffer copies recorded into ``execute``'s command buffer around an operator:
    ``uploads`` before it, ``downloads`` after it, each ``(source, destination, bytes)``
    of allocations, copied from offset 0 to offset 0.  The functional API passes its
    staging copies this way on devices whose tensors are not host-visible, so that a
    NumPy call is one submission (``functional._host_views``).  The sequence's hazard
    tracking puts the barriers between the copies and the operator, and its end makes
    the downloads visible to the host."""

    uploads: tuple
    downloads: tuple

    @staticmethod
    def record(seq: runtime.Sequence, copies) -> None:
        for src, dst, nbytes in copies:
            seq.copy(src, dst, [(0, 0, nbytes)])

    def run(self, ctx, copies) -> None:
        """``copies`` in a submission of their own."""
        if copies:
            with ctx.sequence() as seq:
                self.record(seq, copies)
                seq.run()


def _rebound(rec: _Recording, allocs) -> bool:
    """Move ``execute``'s recording (``rec``) to ``allocs`` where each differing one
    stands where the recorded one stood (``scheduler.place_of``: the same range of the
    same live block, neither with buffer views) and the recorded one was freed: a
    Tensor-out call's fresh result often takes the range its dropped predecessor gave
    back, and re-recording costs several times a replay."""
    seq = rec.seq
    pairs: dict = {}
    for old, r, place, a in zip(rec.ids, rec.allocs, rec.places, allocs):
        if r is None or a is None:
            if (r is None) != (a is None):
                return False
            continue
        if r() is a:
            continue
        if (place is None or r() is not None or place[0].memory is None
                or place_of(a) != place or pairs.setdefault(old, a) is not a):
            return False
    if not pairs or not seq.rebindable(pairs):
        return False
    seq.rebind(pairs.items())
    return True


def _given(inputs, outputs):
    """The tensors a caller passed to ``execute``, as one tuple (None: not lists)."""
    if not isinstance(inputs, (list, tuple)) or not isinstance(outputs, (list, tuple)):
        return None
    return (len(inputs),) + tuple(inputs) + tuple(outputs)


def _tensor_refs(given):
    """Weak references to the Tensor objects of ``given`` (None where not a Tensor)."""
    if given is None:
        return None
    return (given[0],) + tuple(weakref.ref(t) if isinstance(t, Tensor) else
                               (None if t is None else False) for t in given[1:])


def _same_tensors(refs, given) -> bool:
    """Whether ``given`` holds the very Tensor objects ``refs`` names, each still alive
    (then the bindings checked when they were recorded still hold)."""
    if refs is None or len(refs) != len(given) or refs[0] != given[0]:
        return False
    for r, t in zip(refs[1:], given[1:]):
        if r is None:
            if t is not None:
                return False
        elif r is False or r() is not t or not t.allocation.alive:
            return False
    return True

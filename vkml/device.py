"""``vkml.Device``: choosing a Vulkan device and the DML create -> compile -> execute flow.

Selection (``vkml.Device()`` with no argument): ``$VKML_DEVICE`` (an index, or a
substring of the name, case-insensitive), else the best device: discrete > integrated >
virtual > cpu; among equals the one with more of the optional features vkml uses
(16/8-bit storage, float16, int64, float64), then the lower index.
"""
from __future__ import annotations

import atexit
import os
import threading
from collections import OrderedDict

import numpy as np

from . import runtime
from .dml.operator import IMPLEMENTED_FEATURE_LEVEL, FeatureLevel, OperatorDesc
from .dml.tensor_desc import allocation_size
from .errors import DeviceError, ValidationError
from .tensor import Tensor

_FEATURE_SCORE = ("storage16", "storage8", "fp16", "int64", "fp64", "int16", "int8")


def devices() -> list[runtime.DeviceInfo]:
    """Every Vulkan device, as :class:`DeviceInfo` (index, name, type, limits, features)."""
    return runtime.devices()


def _select(selector) -> runtime.DeviceInfo:
    infos = runtime.devices()
    if not infos:
        raise DeviceError("no Vulkan device found: install a Vulkan driver (a GPU driver, or "
                          "Mesa's lavapipe / SwiftShader for the CPU)")
    if selector is None:
        selector = os.environ.get("VKML_DEVICE") or None
    if selector is None:
        def rank(d):
            score = sum(bool(d.features.get(f)) for f in _FEATURE_SCORE)
            return (runtime.DEVICE_TYPE_RANK[d.device_type], -score, d.index)
        return min(infos, key=rank)
    if isinstance(selector, runtime.DeviceInfo):
        return infos[selector.index]
    text = str(selector).strip()
    if text.lstrip("-").isdigit():
        i = int(text)
        if not 0 <= i < len(infos):
            raise DeviceError(f"no Vulkan device with index {i} (there are {len(infos)}: "
                              + "; ".join(map(str, infos)) + ")")
        return infos[i]
    matches = [d for d in infos if text.lower() in d.name.lower()]
    if not matches:
        raise DeviceError(f"no Vulkan device named like {text!r}; there are: "
                          + "; ".join(map(str, infos)))
    return matches[0]


class Device:
    """One Vulkan device.  ``Device()``, ``Device(1)`` or ``Device("llvmpipe")``.

    Usable as a context manager; :meth:`close` releases every Vulkan object it holds.

    Testing knobs, so one driver can take the paths another device would take:
    ``disable_features`` (names from ``runtime.FEATURE_NAMES``: "storage16", "fp64", ...)
    makes it behave as a device without them; ``limits`` lowers device limits
    (``{"maxStorageBufferRange": 1 << 20}``); ``force_staging`` keeps tensors in
    device-only memory with staging copies, as on a discrete GPU.
    """

    def __init__(self, selector=None, *, disable_features=None, limits=None,
                 force_staging: bool = False):
        self.info = _select(selector)
        self._ctx = runtime.Context(self.info, set(disable_features or ()), limits,
                                    force_staging)
        self._compiled: OrderedDict = OrderedDict()   # functional API's compiled operators
        self._compiled_lock = threading.Lock()
        #: functional calls that passed validation here: key -> (compiled, result sizes),
        #: kept and read by ``vkml.ops.functional`` (``prepared``, ``run``)
        self.prepared_calls: dict = {}
        self._closed = False
        _LIVE.add(self)

    # -- identity ----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.info.name

    @property
    def index(self) -> int:
        return self.info.index

    @property
    def features(self) -> dict:
        """The optional features this device has enabled (after ``disable_features``)."""
        return dict(self._ctx.features)

    @property
    def limits(self) -> dict:
        return dict(self._ctx.limits)

    @property
    def feature_level(self) -> FeatureLevel:
        """The DML feature level vkml implements on this device."""
        return IMPLEMENTED_FEATURE_LEVEL

    def __repr__(self) -> str:
        return f"vkml.Device({self.info.index}: {self.info.name!r}, {self.info.driver_name})"

    # -- tensors -----------------------------------------------------------------------
    def tensor(self, array) -> Tensor:
        """Upload a NumPy array (or anything ``numpy.asarray`` takes), its shape kept (a
        0-d array too: ``numpy.ascontiguousarray`` would make it 1-d)."""
        data = np.asarray(array, order="C")
        t = self.empty(data.shape, data.dtype)
        self._ctx.write(t.allocation, data)
        return t

    def empty(self, shape, dtype=np.float32, nbytes: int | None = None) -> Tensor:
        """An uninitialised tensor; ``nbytes`` reserves more than ``shape`` needs."""
        self.check_open()
        shape, dtype, size = allocation_size(shape, dtype, nbytes, self._ctx.tensor_heap)
        alloc = self._ctx.allocate(size)
        return Tensor(self, shape, dtype, alloc, size)

    # -- the DML flow --------------------------------------------------------------------
    def create_operator(self, desc: OperatorDesc) -> "Operator":
        """``IDMLDevice::CreateOperator``: validate ``desc``; raises ValidationError."""
        from .ops.base import Operator

        self.check_open()
        if not isinstance(desc, OperatorDesc):
            raise ValidationError("desc", f"must be a vkml.dml operator descriptor, got "
                                  f"{type(desc).__name__}")
        desc.validate()
        level = desc.feature_level()
        if level > self.feature_level:
            raise ValidationError(type(desc).__name__, f"needs {level}, the device implements "
                                  f"{self.feature_level}")
        return Operator(self, desc)

    def compile_operator(self, op: "Operator") -> "CompiledOperator":
        """``IDMLDevice::CompileOperator``: build the pipelines; raises UnsupportedError
        when this device cannot run the operator."""
        from .ops.base import Operator, compile_operator

        self.check_open()
        if not isinstance(op, Operator):
            raise ValidationError("op", "must be a vkml.Operator (from create_operator), got "
                                  f"{type(op).__name__}")
        if op.device is not self:
            raise ValidationError("op", "was created on another device")
        return compile_operator(op)

    def compile_graph(self, graph_desc, *, fuse=True, constants=None, paths=None):
        """``IDMLDevice1::CompileGraph``: validate a ``vkml.dml.GraphDesc``, fuse, plan
        its intermediates in one arena and compile its nodes (``vkml/ops/graph.py``).
        ``paths``: {node index: path name} forces the kernel path of those nodes
        (convolution candidates, padding paths), for tests and measurements."""
        from .ops.graph import compile_graph

        return compile_graph(self, graph_desc, fuse=fuse, constants=constants, paths=paths)

    def compiled(self, desc: OperatorDesc):
        """A compiled operator for ``desc``, cached (LRU) for the functional API.

        The key is the descriptor and its repr: descriptors compare field by field with
        ``==``, which takes -0.0 for 0.0 (and 1 for 1.0), so a padding by -0.0 would
        otherwise reuse the operator compiled for 0.0 and write +0.0."""
        key = (desc, repr(desc))
        with self._compiled_lock:
            found = self._compiled.get(key)
            if found is not None:
                self._compiled.move_to_end(key)
                return found
        compiled = self.compile_operator(self.create_operator(desc))
        with self._compiled_lock:
            self._compiled[key] = compiled
            while len(self._compiled) > 64:
                _, old = self._compiled.popitem(last=False)
                old.release()
        return compiled

    def sequence(self, timed: bool = False) -> runtime.Sequence:
        """A command sequence: record several operators with ``compiled.record(seq, ...)``,
        then ``seq.run()`` submits them at once; ``run()`` again replays them."""
        self.check_open()
        return self._ctx.sequence(timed=timed)

    @property
    def context(self) -> runtime.Context:
        """The runtime context (Vulkan objects, memory, pipelines) the operator layer and
        the bench tool build on; not part of the user API."""
        return self._ctx

    def memory_stats(self) -> dict:
        return self._ctx.tensor_heap.stats()

    # -- lifetime ----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def check_open(self) -> None:
        """Raise :class:`DeviceError` once the device was closed."""
        if self._closed:
            raise DeviceError("this vkml.Device was closed")
        self._ctx.require_open()

    def synchronize(self) -> None:
        self._ctx.wait_idle()

    def close(self) -> None:
        """Release everything: compiled operators, tensors' memory, pipelines (idempotent,
        and safe while other threads use the device: their calls already inside Vulkan
        finish, later ones raise ``DeviceError``; see ``runtime/lifetime.py``).
        Tensors, compiled operators and sequences of a closed device raise
        ``DeviceError`` when used; releasing them is a no-op."""
        self._closed = True
        self._ctx.close()            # waits for calls in flight, then destroys
        with self._compiled_lock:
            compiled = list(self._compiled.values())
            self._compiled.clear()
            self.prepared_calls.clear()
        for c in compiled:
            c.release()              # Python bookkeeping only: the device is gone
        _LIVE.discard(self)

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_LIVE: set = set()
#: THE registry of shared devices: Vulkan device index -> the process-wide Device for it
#: (``default_device``, ``shared_device``; ``vkml.onnx``'s "VKML" and "VKML:<index>").
_SHARED: dict = {}
_shared_lock = threading.Lock()
_default_index: int | None = None


def shared_device(selector=None) -> Device:
    """The process-wide :class:`Device` for ``selector`` (as ``Device(selector)`` takes
    it; None: the default selection), created on first use and again once closed or lost
    (a timed-out wait or VK_ERROR_DEVICE_LOST: the functional API goes on with a new
    device; the lost one is left to its holders, not closed here, since closing waits for
    work that may never end): every caller naming the same Vulkan device gets the same
    object."""
    global _default_index
    if selector is None:
        # chosen once, as the default device always was: the functional API asks per call
        if _default_index is None:
            _default_index = _select(None).index
        index = _default_index
    else:
        index = _select(selector).index
    with _shared_lock:
        dev = _SHARED.get(index)
        if dev is None or dev.closed or dev.context.lost:
            dev = _SHARED[index] = Device(index)
        return dev


def default_device() -> Device:
    """The process-wide default device (``$VKML_DEVICE`` or the best device, as
    ``Device()`` selects), created on first use."""
    return shared_device(None)


@atexit.register
def _close_all() -> None:
    for dev in list(_LIVE):
        try:
            dev.close()
        except Exception:
            pass

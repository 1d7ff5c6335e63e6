"""The backend (``onnx.backend.base.Backend``) and a prepared model (:class:`VkmlRep`):
``prepare`` loads, folds, places and compiles; ``run`` checks the inputs against the
model's declared inputs and runs the partitions in order."""
from __future__ import annotations

import hashlib
import math
import os
import threading

import numpy as np

import onnx
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep

from ..device import Device, shared_device
from ..errors import ValidationError
from ..tensor import Tensor
from ..tuning import default_tuner
from .execute import DevicePartition, host_copy, host_value, node_label
from .fold import _INFER_VALUES_MAX, fold
from .load import load, sparse_to_dense
from .place import device_refusal, place
from .rewrite import rewrite, rewrite_kinds

_FLOAT16, _FLOAT32 = np.dtype(np.float16), np.dtype(np.float32)


def compute_dtype(dtype) -> np.dtype | None:
    """``prepare``'s ``dtype``: None (every tensor as the model types it) or float16
    (``"float16"``, ``np.float16``); ValidationError naming ``dtype`` otherwise."""
    if dtype is None:
        return None
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt != _FLOAT16:
        raise ValidationError("dtype", f"must be None (the model's own types) or "
                              f"\"float16\", got {dtype!r}")
    return dt


def resolve_device(device) -> Device:
    """A ``vkml.Device``, or one of the process-wide shared devices (``vkml.device``'s
    registry): None or "VKML" the default one, "VKML:<index>", an index, or a name."""
    if isinstance(device, Device):
        return device
    if device is None:
        return shared_device(None)
    if isinstance(device, int):
        return shared_device(device)
    text = str(device).strip()
    up = text.upper()
    if up == "VKML":
        return shared_device(None)
    if up.startswith("VKML:"):
        if not text[5:].isdigit():
            raise ValidationError("device", f"must be \"VKML\", \"VKML:<index>\" or a "
                                  f"vkml.Device, got {text!r}")
        return shared_device(int(text[5:]))
    return shared_device(text)


def _declared(vi):
    """(dtype or None, dims or None) of a graph input declared as a tensor; dims: int,
    or None for a symbolic or absent dimension; None when it is not a tensor."""
    t = vi.type
    if not t.HasField("tensor_type"):
        return None
    tt = t.tensor_type
    dtype = None
    if tt.elem_type:
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except Exception:
            dtype = None
    dims = None
    if tt.HasField("shape"):
        dims = [int(d.dim_value) if d.HasField("dim_value") else None for d in tt.shape.dim]
    return dtype, dims


def check_input(name: str, value, declared):
    """``value`` for the model input ``name``, checked against its declaration (element
    type exactly, as ONNX Runtime does, and every fixed dimension); ValidationError
    naming the input otherwise.  A NumPy array (or a vkml Tensor) comes back."""
    if declared is None:
        return value                    # a sequence, optional or map: as given
    dtype, dims = declared
    field = f"input {name!r}"
    if value is None:
        raise ValidationError(field, "is a tensor input: give a NumPy array, got None")
    if not isinstance(value, Tensor):
        try:
            value = np.asarray(value)
        except Exception as exc:
            raise ValidationError(field, f"must be a NumPy array, got {type(value).__name__} "
                                  f"({exc})") from None
    got = np.dtype(value.dtype)
    if dtype is not None:
        same = (got.kind in "USO") if dtype == np.dtype(object) else got == dtype
        if not same:
            raise ValidationError(field, f"the model declares element type {dtype}, got "
                                  f"{got} (vkml converts no input)")
    if dims is not None:
        shape = tuple(value.shape)
        if len(shape) != len(dims) or any(d is not None and d != s
                                          for d, s in zip(dims, shape)):
            want = tuple(d if d is not None else "?" for d in dims)
            raise ValidationError(field, f"the model declares shape {want}, got {shape}")
    return value


def _shape_model(model) -> tuple:
    """(model, names): ``model`` for shape inference, its initializers of over
    ``fold._INFER_VALUES_MAX`` elements (weights; no shape depends on their values)
    declared as graph inputs of their type and dimensions instead, and the names so
    declared.  Inference serialises the model it is given and parses the result back:
    with the weights, tens of megabytes each way."""
    g = model.graph
    big = [t for t in g.initializer if math.prod(t.dims) > _INFER_VALUES_MAX]
    if not big:
        return model, set()
    inputs = {i.name for i in g.input}
    declared = {t.name for t in big if t.name not in inputs}
    # (the model's fields but the graph, and the graph's but its initializers, copied one
    # by one: a CopyFrom of the whole model copied tens of megabytes of weights only to
    # drop them)
    m = onnx.ModelProto()
    _copy_fields(model, m, "graph")
    _copy_fields(g, m.graph, "initializer")
    m.graph.initializer.extend(t for t in g.initializer
                               if math.prod(t.dims) <= _INFER_VALUES_MAX)
    m.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                         for t in big if t.name in declared)
    return m, declared


def _copy_fields(src, dst, skip: str) -> None:
    """Copy every field ``src`` has set into ``dst`` (a fresh message of its type) but
    ``skip``."""
    for fd, value in src.ListFields():
        if fd.name == skip:
            continue
        into = getattr(dst, fd.name)
        if hasattr(into, "extend"):            # (a repeated field)
            into.extend(value)
        elif fd.message_type is not None:
            into.CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


#: A serialised model's identity for its prefetch list (:func:`_bytes_ident`): its first
#: and last ``IDENT_ENDS`` bytes, and ``IDENT_SAMPLES`` pieces of ``IDENT_PIECE`` bytes
#: spread between them.
IDENT_ENDS = 1 << 20
IDENT_SAMPLES = 32
IDENT_PIECE = 1 << 16


def _bytes_ident(data) -> str:
    """A serialised model's identity for :func:`_replay`: the SHA-256 of its length, its
    ends (the graph's nodes come first, its inputs and outputs last: protobuf writes
    fields in number order) and pieces between them, all of a model up to 2
    ``IDENT_ENDS``.  Hashing every byte of the weights held up the main thread before
    anything else started (bench/RESULTS.md, cold start); the key only picks a hint (a
    path's is its size and time, and another model under the same key only compiles
    pipelines it does not ask for, once)."""
    view = memoryview(data).cast("B")
    n = len(view)
    h = hashlib.sha256(str(n).encode())
    if n <= 2 * IDENT_ENDS:
        h.update(view)
    else:
        h.update(view[:IDENT_ENDS])
        step = (n - 2 * IDENT_ENDS) // IDENT_SAMPLES
        for i in range(IDENT_SAMPLES):
            at = IDENT_ENDS + i * step
            h.update(view[at:at + min(IDENT_PIECE, step)])
        h.update(view[n - IDENT_ENDS:])
    return h.hexdigest()


def _replay(model, dev: Device, args: tuple):
    """Start compiling the pipelines this model's preparation and first run asked for in
    an earlier process, and record this one's (``PipelineCache.replay``): the key is the
    model (its bytes' :func:`_bytes_ident`; a file's path, size and modification time),
    ``prepare``'s arguments, the tuning mode and the device's features and limits, which
    choose the kernels.  None for a ModelProto (hashing it would serialise its weights again)."""
    if isinstance(model, onnx.ModelProto):
        return None
    if isinstance(model, (bytes, bytearray, memoryview)):
        ident = _bytes_ident(model)
    else:
        try:
            st = os.stat(model)
        except (OSError, TypeError, ValueError):
            return None                   # (load raises the error)
        ident = repr((os.path.abspath(os.fspath(model)), st.st_size, st.st_mtime_ns))
    ctx = dev.context
    text = repr((ident, args, default_tuner().effective_mode(),
                 sorted(k for k, v in ctx.features.items() if v), sorted(ctx.limits.items())))
    return ctx.pipelines.replay(hashlib.sha256(text.encode()).hexdigest()[:32])


class VkmlRep(BackendRep):
    """A prepared model: ``run(inputs)`` -> list of NumPy outputs; ``partitions``,
    ``folded`` (constant-folded nodes), ``rewrites`` (``vkml.onnx.rewrite.Rewrite`` s:
    the graph rewrites done, of the kinds ``rewrite_kinds`` asked for), ``fallbacks``
    (partitions the device could not run, with the reason), ``dtype`` (None, or float16:
    the model's float32 tensors are float16 on the device, :meth:`device_dtype`);
    ``fuse``: what the graph compiler fuses (``Device.compile_graph``'s ``fuse``)."""

    def __init__(self, model: onnx.ModelProto, device: Device, strict: bool,
                 rewrites=True, dtype=None, fuse=True):
        self.model = model
        self.device = device
        self.strict = strict
        self.dtype = compute_dtype(dtype)
        self.fuse = fuse
        self.rewrite_kinds = rewrite_kinds(rewrites)
        self.fallbacks: list = []
        self._run_lock = threading.Lock()
        g = model.graph
        inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        for sp in g.sparse_initializer:
            inits[sp.values.name] = sparse_to_dense(sp)
        #: positional inputs: the graph inputs without an initializer
        self.input_names = [i.name for i in g.input if i.name not in inits]
        #: every graph input, by name: those with an initializer may be fed by name (the
        #: initializer is their default, as in ONNX Runtime)
        self.all_input_names = [i.name for i in g.input]
        self.declared = {i.name: _declared(i) for i in g.input}
        self.overridable = [i.name for i in g.input if i.name in inits]
        self._variants: dict = {}
        self.output_names = [o.name for o in g.output]
        self.output_types = {o.name: (_declared(o) or (None,))[0] for o in g.output}
        self._infer_types(model, inits)
        self.consts, self.folded, rest = fold(model, inits, self.output_names)
        rest, self.consts, self.rewrites = rewrite(rest, self.consts, self.types,
                                                   self.output_names, self.rewrite_kinds)
        for name, v in self.consts.items():
            if isinstance(v, np.ndarray):
                self.types[name] = v.dtype
        self._groups, self._parts = place(self, rest)
        self.device_consts = self._device_consts()
        self._warm()

    def device_dtype(self, dt) -> np.dtype:
        """The element type a value the model types as ``dt`` has on the device: float16
        for float32 under ``dtype="float16"``, else ``dt`` itself."""
        dt = np.dtype(dt)
        return self.dtype if self.dtype is not None and dt == _FLOAT32 else dt

    def _device_consts(self) -> dict:
        """The constants the device partitions bind, in :meth:`device_dtype`: float32 ones
        converted to float16 here, once, under ``dtype="float16"``, rounded to nearest as
        PyTorch's ``.half()`` does (a value beyond float16's range becomes +-inf, no
        error: a model exported from ``.half()`` would hold the same)."""
        out = {}
        for part in self._parts:
            for name in getattr(part, "tensor_inputs", ()):
                if name not in self.consts or name in out:
                    continue
                v = self.consts[name]
                if isinstance(v, np.ndarray):
                    with np.errstate(over="ignore"):
                        v = v.astype(self.device_dtype(v.dtype), copy=False)
                out[name] = v
        return out

    def host_feed(self, name: str, value):
        """``value`` of ``name`` as the host (a host partition, ``run``'s result) reads it:
        a float16 device value the model types as float32 (``dtype="float16"``) back in
        float32, so the host computes in the model's own types."""
        value = host_value(value)
        if self.dtype is not None and getattr(value, "dtype", None) == _FLOAT16:
            want = self.output_types.get(name) if name in self.output_types else \
                self.types.get(name)
            if want == _FLOAT32:
                return value.astype(_FLOAT32)
        return value

    def _infer_types(self, model, inits) -> None:
        shaped, stand_ins = _shape_model(model)
        try:
            inferred = onnx.shape_inference.infer_shapes(shaped)
        except Exception:
            inferred = model
        self.types, self.shapes = {}, {}
        for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + \
                list(inferred.graph.output):
            if vi.name in stand_ins:
                continue
            t = vi.type
            if t.HasField("tensor_type") and t.tensor_type.HasField("shape"):
                dims = t.tensor_type.shape.dim
                if all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
                    self.shapes[vi.name] = tuple(int(d.dim_value) for d in dims)
            declared = _declared(vi)
            self.types[vi.name] = declared[0] if declared else None
        for name, v in inits.items():
            self.types[name] = v.dtype

    @property
    def partitions(self) -> list:
        """[(where, [(node label, op type), ...]), ...] in execution order; a device
        partition's nodes that its compiled graph fused say so ("Relu (fused into Conv)")."""
        out = []
        for part, (w, items) in zip(self._parts, self._groups):
            idx = [i for i, _ in items]
            if isinstance(part, DevicePartition):
                out.append((w, part.labels(idx)))
            else:
                out.append((w, [(node_label(n, i), n.op_type) for i, n in items]))
        return out

    @property
    def fusions(self) -> list:
        """The graph compiler's :class:`vkml.ops.graph.Fusion` records of every device
        partition, as its latest compiled graph made them (what ``fuse`` switched on)."""
        return [f for part in self._parts if isinstance(part, DevicePartition)
                and part.last is not None and part.last.compiled is not None
                for f in part.last.compiled.fusions]

    @property
    def host_nodes(self) -> list:
        """[(node label, op type, reason), ...] of the nodes placed on the host, in
        execution order, each with the reason the device refused it
        (:func:`vkml.onnx.place.device_refusal`; "placed on the host" for a node the
        device could run but placement kept beside its host neighbours).  Partitions the
        device refused when compiling are in ``fallbacks``."""
        out, where = [], {}
        for w, items in self._groups:
            for i, node in items:
                if w == "host":
                    why = device_refusal(self, node, where) or "placed on the host"
                    out.append((node_label(node, i), node.op_type, why))
                for o in node.output:
                    where[o] = w
        return out

    def _warm(self) -> None:
        """Compile the device partitions for the shapes the model declares, when all of
        them are static and known and every parameter input is a constant."""
        env = dict(self.consts)
        for part in self._parts:
            if not isinstance(part, DevicePartition):
                continue
            if any(n not in self.consts for n in part.params):
                continue
            ok = True
            for n in part.tensor_inputs:
                if n in env:
                    continue
                shape, dt = self.shapes.get(n), self.types.get(n)
                if shape is None or dt is None:
                    ok = False
                    break
                # a zero-stride stand-in: the lowering reads only its shape and dtype
                env[n] = np.lib.stride_tricks.as_strided(np.zeros(1, dt), shape,
                                                         (0,) * len(shape))
            if ok:
                part.warm(env)

    # -- run ----------------------------------------------------------------------------
    def _feeds(self, inputs) -> dict:
        """``run``'s inputs by name, each checked against the model's declaration."""
        if isinstance(inputs, dict):
            unknown = [k for k in inputs if k not in self.declared]
            if unknown:
                raise ValidationError("inputs", f"{unknown[0]!r} is not an input of the "
                                      f"model (its inputs: {self.all_input_names})")
            feeds = dict(inputs)
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            if len(inputs) > len(self.input_names):
                raise ValidationError("inputs", f"the model takes {len(self.input_names)} "
                                      f"inputs ({self.input_names}), got {len(inputs)}")
            feeds = dict(zip(self.input_names, inputs))
        return {k: check_input(k, v, self.declared[k]) for k, v in feeds.items()}

    def _variant(self, names: frozenset) -> "VkmlRep":
        """This model with the initializers ``names`` as plain inputs (fed at ``run``):
        prepared on first use, so that folding and the constants bound to the device
        see the fed values, not the defaults."""
        rep = self._variants.get(names)
        if rep is None:
            m = onnx.ModelProto()
            m.CopyFrom(self.model)
            keep = [t for t in m.graph.initializer if t.name not in names]
            del m.graph.initializer[:]
            m.graph.initializer.extend(keep)
            rep = self._variants[names] = VkmlRep(m, self.device, self.strict,
                                                  self.rewrite_kinds, self.dtype, self.fuse)
            rep.fallbacks = self.fallbacks
        return rep

    #: The pipeline recording ``prepare`` started (:func:`_replay`), saved after the
    #: first run: that run compiles the pipelines planning did not ask for.
    _recording = None

    def run(self, inputs, **kwargs):
        feeds = self._feeds(inputs)
        fed = frozenset(k for k in feeds if k in self.overridable)
        if fed:
            return self._variant(fed).run(feeds)
        env = dict(self.consts)
        env.update(feeds)
        # One run at a time: the partitions' I/O buffers and compiled graphs (their
        # intermediates) are the model's own, bound in every run.
        with self._run_lock:
            for part in self._parts:
                missing = [x for x in part.inputs if x not in env]
                if missing:
                    raise ValidationError("inputs", f"missing model input(s) {missing}")
                part.run(env)
            recording, self._recording = self._recording, None
            if recording is not None:
                recording.save()
            return [self.host_feed(o, host_copy(env, o)) for o in self.output_names]

    def profile(self, inputs, repeat: int = 5):
        """Where ``run(inputs)``'s time goes: a :class:`vkml.onnx.profile.ModelProfile`,
        per compiled node the ONNX nodes it runs, its DML operator and kernel path, and
        its median device milliseconds from timestamp queries (host partitions: wall
        time)."""
        from .profile import profile_model
        with self._run_lock:
            return profile_model(self, inputs, repeat)

    def release(self) -> None:
        recording, self._recording = self._recording, None
        if recording is not None:
            recording.stop()
        with self._run_lock:            # (after a run in flight)
            for p in self._parts:
                if isinstance(p, DevicePartition):
                    p.release()
        for rep in self._variants.values():
            rep.release()
        self._variants.clear()


class VkmlBackend(Backend):
    """``onnx.backend.base.Backend`` for vkml.  Devices: "VKML" (the default vkml device),
    "VKML:<index>" (``vkml.devices()`` order), or a ``vkml.Device``."""

    @classmethod
    def prepare(cls, model, device=None, strict: bool = False, rewrites=True,
                dtype=None, fuse=True, **kwargs) -> VkmlRep:
        """``rewrites``: the graph rewrites to do (``vkml.onnx.rewrite``): True all of them,
        False none (to measure them), or a collection of kinds (``rewrite.KINDS``).
        ``dtype``: None (the model's types) or ``"float16"``: the model's float32 tensors
        are float16 on the device (initializers converted once here, rounded as PyTorch's
        ``.half()``: beyond float16's range to +-inf), its float32 inputs converted on
        upload and its outputs given back in the types it declares; host nodes compute in
        the model's types.  Every device kernel stores float16 as halves, or packed two to
        a 32-bit word where the device lacks 16-bit storage (SwiftShader).
        ``fuse``: the graph compiler's fusions in each device partition
        (``Device.compile_graph``): True all, False none, or ``{kind: False}`` to switch
        kinds off (``vkml.ops.graph.FUSION_KINDS``), e.g. ``fuse={"residual": False}`` to
        measure one."""
        kinds = rewrite_kinds(rewrites)
        dt = compute_dtype(dtype)
        from ..ops.graph import _fusion_kinds
        _fusion_kinds(fuse)                       # (refused before any work)
        dev = resolve_device(device)
        recording = _replay(model, dev, (strict, sorted(kinds), str(dt), repr(fuse)))
        try:
            rep = VkmlRep(load(model), dev, strict, kinds, dt, fuse)
        except BaseException:
            if recording is not None:
                recording.stop()
            raise
        rep._recording = recording
        return rep

    @classmethod
    def run_model(cls, model, inputs, device=None, strict: bool = False, rewrites=True,
                  dtype=None, fuse=True, **kwargs):
        return cls.prepare(model, device, strict=strict, rewrites=rewrites,
                           dtype=dtype, fuse=fuse).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device=None, outputs_info=None, strict: bool = False,
                 opset_version: int | None = None, **kwargs):
        """Run one NodeProto on ``inputs`` (a list in the node's input order)."""
        ins = [helper.make_value_info(n, onnx.TypeProto()) for n in node.input if n]
        outs = [helper.make_value_info(n, onnx.TypeProto()) for n in node.output if n]
        for vi, x in zip(ins, inputs):
            a = np.asarray(x)
            vi.CopyFrom(helper.make_tensor_value_info(
                vi.name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
        opset = opset_version or onnx.defs.onnx_opset_version()
        g = helper.make_graph([node], "vkml_node", ins, outs)
        model = helper.make_model(g, opset_imports=[helper.make_opsetid(node.domain, opset)])
        rep = VkmlRep(model, resolve_device(device), strict)
        return rep.run(list(inputs))

    @classmethod
    def supports_device(cls, device) -> bool:
        if isinstance(device, Device):
            return True
        text = str(device).strip().upper()
        if text == "VKML":
            return True
        if text.startswith("VKML:") and text[5:].isdigit():
            from ..device import devices
            return int(text[5:]) < len(devices())
        return False


prepare = VkmlBackend.prepare
run_model = VkmlBackend.run_model
run_node = VkmlBackend.run_node
supports_device = VkmlBackend.supports_device

"""Running partitions: a device partition as one compiled DML graph (:class:`GraphExecutor`,
cached per input shapes and parameter values), a host partition through ONNX's reference
evaluator."""
from __future__ import annotations

import threading
import weakref

import numpy as np

import onnx
from onnx import helper

from ..device import Device
from ..errors import UnsupportedError
from ..tensor import Tensor
from .lower import DEVICE_OPS, _HostFallback, _Lowered, _Lowering, _lower_graph

#: The key of a run's ``env`` under which device partitions leave host copies of the
#: outputs they downloaded in their own submission (``{name: array}``): read by
#: :func:`host_copy` for the model's outputs and the host partitions' inputs.
HOST_COPIES = object()


def host_copy(env: dict, name: str):
    """``env[name]`` as a host array where a device partition downloaded it in its run,
    else ``env[name]`` itself (a Tensor is then read by the caller)."""
    copies = env.get(HOST_COPIES)
    if copies is not None:
        v = copies.get(name)
        if v is not None:
            return v
    return env[name]


class GraphExecutor:
    """Runs one lowered device partition: ``device.compile_graph`` (fusion, one arena for
    intermediates, constants bound once), tensors for its inputs and outputs, and
    :meth:`run` (``execute``: one command buffer, replayed while the same tensors are
    bound).  ``fusions``: what the graph compiler fused, as ``(absorbed, into)`` pairs of
    ONNX node indices in the partition.

    A run is one submission, replayed: the host values' upload, the graph and the
    download of the outputs named in ``download`` (the model's outputs, the host
    partitions' inputs) are recorded into one command buffer (:meth:`_record`) with
    host-visible buffers of their own on devices whose tensors are not host-visible; a
    replayed run copies the inputs in, submits once, waits once and copies the outputs
    out.  Separate transfers cost a submission, a wait and a sequence each.  A host
    value that only a convolution's zero-padded planes take (``CompiledGraph.
    host_inputs``: a model's image before its first convolution) is copied straight into
    them (``laid``, by input name), and the graph runs without that relayout."""

    def __init__(self, device: Device, lowered: _Lowered, fuse=True, download=()):
        self.device = device
        self.lowered = lw = lowered
        self.compiled = None
        self.staging: dict = {}
        self.out_tensors: list = []
        self.fusions: list = []
        self.download = frozenset(download)
        self._io = None                 # (key, weak refs, sequence, uploads, downloads)
        self._host: list = []           # host-visible staging allocations (uploads, downloads)
        self.laid: dict = {}            # input name -> (graph input index, host view)
        self._lock = threading.Lock()
        if lw.graph is None:
            return
        try:
            consts = {g: np.asarray(lw.constants[n]) for g, n in enumerate(lw.inputs)
                      if n in lw.constants}
            self.compiled = device.compile_graph(lw.graph, constants=consts or None,
                                                 fuse=fuse)
            self.fusions = self._fusions()
            self.laid = {lw.inputs[g]: (g, view)
                         for g, view in self.compiled.host_inputs().items()}
            bound = self.compiled.desc.inputs()
            for g, name in enumerate(lw.inputs):
                if name not in lw.constants:
                    shape, dt = lw.infos[name]
                    self.staging[name] = device.empty(
                        shape, dt, nbytes=bound[g].total_tensor_size_in_bytes)
            for d, names in zip(self.compiled.desc.outputs(), lw.outputs):
                shape, dt = lw.infos[names[0]]
                self.out_tensors.append(device.empty(shape, dt,
                                                     nbytes=d.total_tensor_size_in_bytes))
        except BaseException:
            self.release()
            raise

    def _fusions(self) -> list:
        """``CompiledGraph.fusions`` (``vkml.ops.graph.Fusion``: GraphDesc node indices)
        as ``(absorbed, into)`` lists of ONNX node indices in the partition."""
        origins = self.lowered.origins
        return [([origins[i] for i in f.absorbed], [origins[i] for i in f.into])
                for f in self.compiled.fusions]

    def _bindings(self, env: dict):
        """``(ins, fed)``: the graph's inputs from ``env`` (a previous partition's device
        output as it is, else its staging tensor; None for a constant), and ``(name,
        staging tensor, host value)`` for each staging tensor among them, in input order."""
        lw = self.lowered
        ins, fed = [], []
        for name in lw.inputs:
            if name in lw.constants:
                ins.append(None)
                continue
            v, t = env[name], self.staging[name]
            if (isinstance(v, Tensor) and v.device is self.device and v.dtype == t.dtype
                    and v.nbytes >= t.nbytes):
                ins.append(v)                  # a previous partition's output
            else:
                ins.append(t)
                fed.append((name, t, host_value(v)))
        return ins, fed

    def profile(self, env: dict, repeat: int):
        """``CompiledGraph.profile`` on ``env``'s values (None: nothing on the device),
        each written where a run writes it."""
        if self.compiled is None:
            return None
        ins, fed = self._bindings(env)
        laid = set()
        for name, t, v in fed:
            if name in self.laid:
                g, view = self.laid[name]
                _put(view, v)
                laid.add(g)
            else:
                t.write(np.ascontiguousarray(v, dtype=t.dtype))
        return self.compiled.profile(ins, self.out_tensors, repeat, laid=laid)

    def run(self, env: dict) -> None:
        lw = self.lowered
        if self.compiled is not None:
            ins, fed = self._bindings(env)
            with self._lock:                       # (the I/O buffers are this executor's)
                copies = self._run_once(ins, [v for _, _, v in fed])
            for t, names in zip(self.out_tensors, lw.outputs):
                for name in names:
                    env[name] = reshaped(t, lw.infos[name][0])
            if copies:
                host = env.setdefault(HOST_COPIES, {})
                for k, arr in copies.items():
                    for name in lw.outputs[k]:
                        host[name] = np.reshape(arr, lw.infos[name][0])
        for name, src in lw.aliases.items():
            env[name] = reshaped(env[src], lw.infos[name][0])
            host = env.get(HOST_COPIES)
            if host is not None and src in host:
                host[name] = np.reshape(host[src], lw.infos[name][0])

    def _run_once(self, ins: list, fed: list) -> dict:
        """Copy ``fed`` (the host values, in input order) in, replay the recorded
        submission for the bindings ``ins`` (recorded again where they changed), and
        return the downloaded outputs: {output index: a new array}."""
        allocs = [t.allocation if t is not None else None for t in ins]
        with self.device.context.lifetime:     # one entry: no close while we touch the memory
            io = self._io
            if (io is None or io[0] != tuple(map(id, allocs))
                    or not all((r() if r is not None else None) is a
                               for r, a in zip(io[1], allocs))):
                io = self._record(ins, allocs)
            for view, value in zip(io[3], fed):
                _put(view, value)
            io[2].run()
            return {k: view.copy() for k, view in io[4]}

    def _record(self, ins: list, allocs: list):
        """Record the run's submission for these bindings (module doc of the class)."""
        self._drop_io()
        ctx = self.device.context
        seq = ctx.sequence(hold=False)
        try:
            ups, downs, laid = [], [], set()
            for name, t in zip(self.lowered.inputs, ins):
                if t is not None and t is self.staging.get(name):
                    if name in self.laid:
                        g, view = self.laid[name]
                        ups.append(view)
                        laid.add(g)
                    else:
                        ups.append(self._host_view(seq, t, upload=True))
            self.compiled.record(seq, ins, self.out_tensors, laid=laid)
            for k, (t, names) in enumerate(zip(self.out_tensors, self.lowered.outputs)):
                if self.download.intersection(names):
                    downs.append((k, self._host_view(seq, t, upload=False)))
        except BaseException:
            seq.close()
            raise
        refs = [weakref.ref(a) if a is not None else None for a in allocs]
        self._io = (tuple(map(id, allocs)), refs, seq, ups, downs)
        return self._io

    def _host_view(self, seq, t: Tensor, upload: bool) -> np.ndarray:
        """A typed host view of ``t``'s values: its own mapped memory, or a host-visible
        staging buffer copied to (``upload``) or from ``t`` in ``seq``."""
        n = t.size * t.dtype.itemsize
        alloc = t.allocation
        if alloc.host is None:
            stage = self.device.context.staging_heap.allocate(max(n, 4))
            self._host.append(stage)
            if n:
                seq.copy(stage, alloc, [(0, 0, n)]) if upload else \
                    seq.copy(alloc, stage, [(0, 0, n)])
            alloc = stage
        return alloc.host[:n].view(t.dtype).reshape(t.shape)

    def _drop_io(self) -> None:
        """Close the recorded submission and free its host-visible buffers."""
        if self._io is not None:
            self._io[2].close()
            self._io = None
        for a in self._host:
            a.free()
        self._host = []

    def release(self) -> None:
        with self._lock:
            self._drop_io()
        if self.compiled is not None:
            self.compiled.release()
            self.compiled = None
        for t in list(self.staging.values()) + self.out_tensors:
            t.free()
        self.staging, self.out_tensors = {}, []


# -- partitions -------------------------------------------------------------------------------

def node_label(node, index) -> str:
    return node.name or f"{node.op_type}_{index}"


def subgraph_inputs(node) -> set:
    """Names a node's subgraphs (If/Loop/Scan bodies) read from the enclosing scope."""
    names = set()
    for a in node.attribute:
        graphs = list(a.g and [a.g] or []) + list(a.graphs)
        for g in graphs:
            for n in g.node:
                names.update(i for i in n.input if i)
                names |= subgraph_inputs(n)
    return names


class HostPartition:
    where = "host"

    def __init__(self, rep, nodes, inputs, outputs):
        self.rep, self.nodes, self.inputs, self.outputs = rep, nodes, inputs, outputs
        self._evaluator = None

    def evaluator(self):
        if self._evaluator is None:
            from onnx.reference import ReferenceEvaluator
            m = self.rep.model
            g = helper.make_graph(
                [n for n, _ in self.nodes], "vkml_host",
                [helper.make_value_info(i, onnx.TypeProto()) for i in self.inputs],
                [helper.make_value_info(o, onnx.TypeProto()) for o in self.outputs])
            sub = helper.make_model(g, opset_imports=m.opset_import, ir_version=m.ir_version,
                                    functions=m.functions)
            self._evaluator = ReferenceEvaluator(sub, new_ops=host_ops(m))
        return self._evaluator

    def run(self, env: dict) -> None:
        feeds = {i: self.rep.host_feed(i, host_copy(env, i)) for i in self.inputs}
        for name, value in zip(self.outputs, self.evaluator().run(None, feeds)):
            env[name] = value


def host_ops(model) -> list:
    """Replacements for the reference evaluator's kernels where it lacks a case: Pad with
    negative pads (cropping, allowed by the ONNX spec; the reference's ``np.pad`` refuses
    them) crops, then pads with the rest.  Opset 11 and up (pads as an input).  And the
    Swish and HardSwish nodes ``vkml.onnx.rewrite`` writes, at opsets that predate them."""
    from .rewrite import host_ops as rewritten_ops

    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                default=0)
    if opset < 11:
        return rewritten_ops(opset)
    from onnx.reference.ops.op_pad import Pad_18

    class Pad(Pad_18):
        op_domain = ""

        def _run(self, data, pads, constant_value=None, axes=None, mode=None):
            pads = np.asarray(pads, dtype=np.int64).reshape(-1)
            if (pads < 0).any():
                rank = data.ndim
                ax = (list(range(rank)) if axes is None else
                      [int(a) + rank if a < 0 else int(a) for a in np.asarray(axes).reshape(-1)])
                k = len(ax)
                index = [slice(None)] * rank
                for j, a in enumerate(ax):
                    index[a] = slice(max(-pads[j], 0), data.shape[a] - max(-pads[j + k], 0))
                data = data[tuple(index)]
                pads = np.maximum(pads, 0)
            return super()._run(data, pads, constant_value, axes, mode)

    return [Pad] + rewritten_ops(opset)


def reshaped(value, shape):
    """``value`` (a Tensor or an array) under ``shape``, no copy: an alias (Reshape,
    Squeeze, ...) of a device tensor is a view of its allocation, which the tensor it
    views (an executor's output, or a value of the run) keeps alive."""
    shape = tuple(shape)
    if tuple(value.shape) == shape:
        return value
    if isinstance(value, Tensor):
        return Tensor(value.device, shape, value.dtype, value.allocation, value.nbytes,
                      owner=False)
    return np.reshape(value, shape)


def host_value(value):
    return value.numpy() if isinstance(value, Tensor) else value


def _put(view: np.ndarray, value) -> None:
    """Write a host value into an upload's host view: a staging view takes the bytes it
    has, as ``Tensor.write`` does; a convolution's padded planes (no contiguous view)
    its elements in the view's shape."""
    value = np.asarray(value)
    if value.shape != view.shape:
        if view.flags.c_contiguous:
            view, value = view.reshape(-1)[:value.size], value.reshape(-1)
        else:
            value = value.reshape(view.shape)
    np.copyto(view, value, casting="unsafe")     # (as ``astype``: float32 to float16)


class DevicePartition:
    where = "device"

    def __init__(self, rep, nodes, inputs, outputs):
        self.rep, self.nodes, self.inputs, self.outputs = rep, nodes, inputs, outputs
        self._cache: dict = {}
        self.last: GraphExecutor | None = None      # the latest built (its fusions)
        #: the partition on the host, for the input shapes and parameter values (keys of
        #: ``_cache``) the device could not run: only those, not every later run
        self.host: HostPartition | None = None
        params, tensors = [], []
        for node in nodes:
            spec = DEVICE_OPS[node.op_type]
            for i, name in enumerate(node.input):
                if name and name in inputs:
                    (params if i in spec.params else tensors).append(name)
        self.params = list(dict.fromkeys(params))
        self.tensor_inputs = [n for n in dict.fromkeys(tensors) if n not in self.params]
        self._fixed = None      # (the constants' part of _key, the other tensors, params)

    def labels(self, indices) -> list:
        """(node label, op type) per node; what the latest compiled graph fused says so:
        "Relu (fused into Conv)", "Pad (folded into Conv)"."""
        ops = [n.op_type for n in self.nodes]
        for absorbed, into in (self.last.fusions if self.last is not None else []):
            main = [j for j in into if self.nodes[j].op_type in
                    ("Conv", "ConvTranspose", "LpPool")] or into
            for j in absorbed:
                how = "folded" if self.nodes[j].op_type == "Pad" else "fused"
                ops[j] = f"{self.nodes[j].op_type} ({how} into {self.nodes[main[0]].op_type})"
        return [(node_label(n, i), op) for n, i, op in zip(self.nodes, indices, ops)]

    def _key(self, env):
        """The input shapes and types and the parameter values a compiled graph is built
        for.  The model's constants' part is made once (they are the same objects in
        every run of this model: a fed initializer runs a variant of it), the rest per
        run."""
        fixed = self._fixed
        if fixed is None:
            consts = self.rep.consts
            self._fixed = fixed = (
                self._key_of([n for n in self.tensor_inputs if n in consts],
                             sorted(n for n in self.params if n in consts), consts),
                [n for n in self.tensor_inputs if n not in consts],
                sorted(n for n in self.params if n not in consts))
        return fixed[0] + self._key_of(fixed[1], fixed[2], env)

    @staticmethod
    def _key_of(tensors, params, env) -> tuple:
        key = []
        for name in tensors:
            v = env[name]
            key.append((name, tuple(v.shape), np.dtype(v.dtype)))
        for name in params:
            v = np.asarray(host_value(env[name]))
            key.append((name, v.dtype.str, v.shape, v.tobytes()))
        return tuple(key)

    def _build(self, env):
        # under prepare(dtype="float16") the model's float32 values are float16 here: the
        # staging tensors convert float32 inputs on upload (GraphExecutor.run)
        infos = {n: (tuple(env[n].shape), self.rep.device_dtype(env[n].dtype))
                 for n in self.tensor_inputs}
        values = {n: host_value(env[n]) for n in self.params}
        opset = max((o.version for o in self.rep.model.opset_import
                     if o.domain in ("", "ai.onnx")), default=1)
        lw = _Lowering(values, infos, opset)
        for j, node in enumerate(self.nodes):
            spec = DEVICE_OPS[node.op_type]
            dt = infos[node.input[0]][1]
            if dt not in spec.dtypes:
                raise _HostFallback(f"data type {dt} ({node.op_type} on the device takes "
                                    f"{sorted(map(str, spec.dtypes))})")
            lw.origin = j
            spec.lower(lw, node)
        consts = {n: self.rep.device_consts[n] for n in self.tensor_inputs
                  if n in self.rep.device_consts}
        # the outputs the host reads: downloaded in the partition's own submission
        download = set(self.rep.output_names)
        for part in getattr(self.rep, "_parts", ()):
            if isinstance(part, HostPartition):
                download.update(part.inputs)
        return GraphExecutor(self.rep.device, _lower_graph(lw.steps, self.outputs, consts,
                                                            lw.infos),
                             getattr(self.rep, "fuse", True), download)

    def warm(self, env) -> None:
        """Compile for the shapes the model declares (``prepare``), so that
        ``rep.partitions`` shows what the graph compiler fused; errors wait for ``run``."""
        try:
            key = self._key(env)
            if key not in self._cache:
                self._cache[key] = self.last = self._build(env)
        except Exception:
            pass

    def run(self, env: dict) -> None:
        key = self._key(env)
        ex = self._cache.get(key)
        if ex is None:
            try:
                ex = self._build(env)
            except (_HostFallback, UnsupportedError) as exc:
                names = ", ".join(f"{node_label(n, i)} ({n.op_type})"
                                  for i, n in enumerate(self.nodes))
                if self.rep.strict:
                    raise UnsupportedError("an operator for " + names, str(exc)) from None
                self.rep.fallbacks.append((names, str(exc)))
                if self.host is None:
                    self.host = HostPartition(self.rep, [(n, None) for n in self.nodes],
                                              self.inputs, self.outputs)
                ex = self.host
            self._cache[key] = ex
        # the partitions report the fusions of the graph that ran last (none on the host)
        self.last = ex if isinstance(ex, GraphExecutor) else None
        ex.run(env)

    def release(self):
        for ex in self._cache.values():
            if isinstance(ex, GraphExecutor):
                ex.release()
        self._cache.clear()
        self.last = None


"""Loading a model (package doc, step 1): parsing, external data, ``onnx.checker``."""
from __future__ import annotations

import math
import os

import numpy as np

import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import ValidationError
from ..intmath import ceil_div

#: Element types stored two to a byte (their raw data is ceil(n / 2) bytes).
_PACKED4 = {getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1")
            if hasattr(TensorProto, n)}


def load(model) -> onnx.ModelProto:
    """Parse and check ``model`` (ModelProto, bytes, or a path); ValidationError if bad.
    External data is read from the model's folder (:func:`_read_external`)."""
    folder = None
    # The serialised model, where there is one: the checker takes it as it is (given a
    # ModelProto it serialises the model again, weights included).
    data = None
    try:
        if isinstance(model, onnx.ModelProto):
            proto = model
        elif isinstance(model, (bytes, bytearray, memoryview)):
            data = bytes(model)
            proto = onnx.ModelProto()
            proto.ParseFromString(data)
        else:
            with open(model, "rb") as f:
                data = f.read()
            folder = os.path.dirname(os.path.abspath(os.fspath(model)))
            proto = onnx.ModelProto()
            proto.ParseFromString(data)
    except OSError:
        raise
    except Exception as exc:           # protobuf DecodeError and friends
        raise ValidationError("model", f"not a valid ONNX model (protobuf parse failed: "
                              f"{exc})") from None
    if any(_is_external(t) for _, t in _stored_tensors(proto)):
        if isinstance(model, onnx.ModelProto):    # the caller's proto stays as given
            proto = onnx.ModelProto()
            proto.CopyFrom(model)
        for what, t in _stored_tensors(proto):
            if _is_external(t):
                _read_external(t, what, folder)
        data = None                     # (the proto now holds what the bytes did not)
    try:
        onnx.checker.check_model(proto if data is None else data)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValidationError("model", f"onnx.checker rejects it: {first}") from None
    if not proto.graph.node and not proto.graph.output:
        raise ValidationError("model", "the graph is empty (a truncated or non-ONNX file?)")
    return proto


def _stored_tensors(model):
    """``(what, tensor)`` for every tensor the model stores: initializers (dense, and the
    parts of sparse ones) and attribute tensors (``Constant``'s value), in the graph, its
    subgraphs and the model's functions."""
    def nodes(node_list):
        for node in node_list:
            label = node.name or node.op_type
            for a in node.attribute:
                what = f"node {label!r} attribute {a.name!r}"
                if a.HasField("t"):
                    yield what, a.t
                yield from ((what, t) for t in a.tensors)
                for sp in ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + \
                        list(a.sparse_tensors):
                    yield from ((what, t) for t in (sp.values, sp.indices))
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    yield from graph(g)

    def graph(g):
        for t in g.initializer:
            yield f"initializer {t.name!r}", t
        for sp in g.sparse_initializer:
            yield f"initializer {sp.values.name!r}", sp.values
            yield f"initializer {sp.values.name!r}", sp.indices
        yield from nodes(g.node)

    yield from graph(model.graph)
    for f in model.functions:
        yield from nodes(f.node)


def _is_external(t) -> bool:
    return t.data_location == TensorProto.EXTERNAL


def _read_external(t, what, folder) -> None:
    """Read tensor ``t``'s (``what``: the initializer or attribute) external data into it (ONNX external data: ``location``
    relative to the model's folder, ``offset`` and ``length`` in bytes).  The file must
    lie inside the model's folder: no absolute path, no ``..``, no symbolic link; its
    bytes must be exactly what ``dims`` and the element type need.  ValidationError
    naming the initializer otherwise."""
    field = f"{what}: external data"

    def fail(rule):
        raise ValidationError(field, rule)

    if folder is None:
        fail("the model was given as bytes or a ModelProto, so it has no folder to read "
             "external data from: give prepare() the model's path")
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location", "")
    parts = location.replace("\\", "/").split("/")
    if not location or os.path.isabs(location) or location.startswith(("/", "\\")) \
            or ".." in parts or (len(location) > 1 and location[1] == ":"):
        fail(f"location {location!r} must be a relative path inside the model's folder")
    path = os.path.join(os.path.realpath(folder), *[p for p in parts if p not in ("", ".")])
    if os.path.realpath(path) != path:
        fail(f"location {location!r} goes through a symbolic link")
    if not os.path.isfile(path):
        fail(f"location {location!r}: no such file in the model's folder")
    offset, length = (_nonnegative(info.get(k), k, fail) for k in ("offset", "length"))
    if t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        fail(f"element type {t.data_type} cannot be stored externally")
    if any(d < 0 for d in t.dims):
        fail(f"dims {list(t.dims)} must not be negative")
    count = math.prod(t.dims)
    need = ceil_div(count, 2) if t.data_type in _PACKED4 else \
        count * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    offset = offset or 0
    size = os.path.getsize(path)
    if length is None:
        length = size - offset
    if length != need:
        fail(f"length {length} (bytes) must be the {need} bytes dims {list(t.dims)} of "
             f"{helper.tensor_dtype_to_string(t.data_type)} take")
    if offset + length > size:
        fail(f"offset {offset} + length {length} runs past the end of {location!r} "
             f"({size} bytes)")
    with open(path, "rb") as f:
        f.seek(offset)
        t.raw_data = f.read(length)
    t.data_location = TensorProto.DEFAULT
    del t.external_data[:]


def _nonnegative(text, key, fail):
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        fail(f"{key} {text!r} must be a non-negative integer")
    return value


def sparse_to_dense(sp) -> np.ndarray:
    values = numpy_helper.to_array(sp.values)
    idx = numpy_helper.to_array(sp.indices)
    dense = np.zeros(int(np.prod(sp.dims)), dtype=values.dtype)
    if idx.ndim == 2:
        idx = np.ravel_multi_index(idx.T, tuple(sp.dims))
    dense[idx.reshape(-1)] = values.reshape(-1)
    return dense.reshape(tuple(sp.dims))

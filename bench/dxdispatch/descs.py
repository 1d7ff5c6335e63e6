"""DirectML operator descs of a DxDispatch model as vkml descriptors.

The conversion is by name: a ``desc`` field in PascalCase is the vkml descriptor's field
in snake_case, enums are read by full name or suffix, tensor descs and fused activations
by their keys.  What is not by name is in the tables below, so a new operator type needs
at most one entry:

* ``operator_types()``: every ``vkml.dml`` descriptor class (vkml.dml re-exports each of
  its modules, so a new operator's descriptor is found with no entry here);
* ``STRUCTS``: a field whose value is a DirectML struct (``ScaleBias``: DML_SCALE_BIAS);
* ``COUNTS``: a ``...Count`` field DirectML has and vkml implies by an array's length.
"""
from __future__ import annotations

import dataclasses
import enum

import numpy as np

import vkml
from vkml import dml

from .schema import (NESTED_DESC, TENSOR_DESC, WRAPPED_TENSOR_DESC, ModelError, desc_object,
                     join, pascal, short, snake)

#: snake_case desc field -> the name of the vkml.dml class its JSON object builds (the
#: class's dataclass fields are the struct's fields in snake_case).
STRUCTS = {"scale_bias": "ScaleBias", "scale_size": "Size2d"}

#: DML_SCALAR_UNION fields -> the field holding their DML_TENSOR_DATA_TYPE.  DxDispatch
#: reads a union as a JSON number of that type, or as an object naming the union's member
#: ({"Int32": 5}; FLOAT16 is {"UInt16": its bits}, as DirectML stores a half).
SCALAR_UNIONS = {"min": "MinMaxDataType", "max": "MinMaxDataType",
                 "padding_value": "PaddingValueDataType"}
#: The DML_SCALAR_UNION member DxDispatch reads for each data type.
UNION_MEMBERS = {"FLOAT16": "UInt16", "FLOAT32": "Float32", "FLOAT64": "Float64",
                 "UINT8": "UInt8", "UINT16": "UInt16", "UINT32": "UInt32", "UINT64": "UInt64",
                 "INT8": "Int8", "INT16": "Int16", "INT32": "Int32", "INT64": "Int64"}

#: DirectML count field -> the PascalCase array fields whose length it states (None: every
#: array of integers, as DimensionCount states the length of sizes, strides and paddings).
#: vkml's descriptors hold tuples, so the count is checked and dropped.
COUNTS = {"DimensionCount": None, "InputCount": ("InputTensors",),
          "OutputCount": ("OutputTensors",), "AxisCount": ("Axes",), "ScaleCount": ("Scales",)}


def _dml_classes(base: type) -> list[type]:
    """The classes ``vkml.dml`` exports that derive from ``base``."""
    found = (getattr(dml, name, None) for name in dml.__all__)
    return [obj for obj in found if isinstance(obj, type) and issubclass(obj, base)]


def operator_types() -> dict[str, type]:
    """DML operator type (``DML_OPERATOR_PADDING``) -> vkml descriptor class."""
    return {cls.OPERATOR_TYPE: cls for cls in _dml_classes(dml.OperatorDesc)
            if cls.OPERATOR_TYPE}


def _enums() -> dict[str, type]:
    """DML enum prefix (``DML_PADDING_MODE_``) -> vkml enum class."""
    return {"DML_" + snake(cls.__name__).upper() + "_": cls for cls in _dml_classes(enum.Enum)}


def full_type(type_name: str) -> str:
    """``PADDING`` or ``DML_OPERATOR_PADDING`` -> ``DML_OPERATOR_PADDING``."""
    return type_name if type_name.startswith("DML_OPERATOR_") else "DML_OPERATOR_" + type_name


def check_operator_types(model) -> None:
    """Refuse a dispatchable that is not a DirectML operator, or whose operator type vkml
    lacks, before its desc is checked: the desc of an operator vkml does not know cannot
    be read by field (a JOIN's ``InputTensors`` would otherwise be refused as a malformed
    field, not as the operator vkml lacks).  Anything not shaped like a model is left to
    the schema."""
    items = model.get("dispatchables") if isinstance(model, dict) else None
    for name, d in (items.items() if isinstance(items, dict) else ()):
        kind = d.get("type") if isinstance(d, dict) else None
        if not isinstance(kind, str):
            continue
        where = join(join("dispatchables", name), "type")
        if not _is_dml(kind):
            raise ModelError(where, f"type {kind!r} is not supported by vkml (it runs "
                             "DirectML operators, DML_OPERATOR_*; not HLSL, ONNX or "
                             "serialized graphs)")
        if full_type(kind) not in operator_types():
            raise ModelError(where, _lacks(full_type(kind)))


def _is_dml(kind: str) -> bool:
    return kind.upper().startswith("DML_OPERATOR_") or kind.isupper()


def _lacks(full: str) -> str:
    known = sorted(t for t in operator_types() if "ACTIVATION" not in t)
    return f"vkml has no {full} (it implements: {', '.join(known)})"


def desc_fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]


def _field_path(where: str, field: str) -> str:
    """A vkml field name in a ValidationError (``PaddingOperatorDesc.start_padding[1]``,
    ``TensorDesc.sizes[0]``) as the JSON path below ``where`` (``...StartPadding[1]``)."""
    parts = field.split(".")
    if parts and parts[0][:1].isupper():          # the class name
        parts = parts[1:]
    for p in parts:
        name, _, index = p.partition("[")
        where = join(where, pascal(name)) + (f"[{index}" if index else "")
    return where


def _tensor_desc(value: dict, where: str, limits: dict) -> dml.TensorDesc:
    if "DataType" not in value:                   # DML_TENSOR_DESC {Type, Desc}
        value, where = value["Desc"], join(where, "Desc")
    if "DimensionCount" in value and value["DimensionCount"] != len(value["Sizes"]):
        raise ModelError(join(where, "DimensionCount"), f"DimensionCount "
                         f"{value['DimensionCount']} but Sizes has {len(value['Sizes'])} "
                         "entries")
    flags = dml.TensorFlags.NONE
    for f in (value.get("Flags") or "NONE").replace(" ", "").split("|"):
        key = f.removeprefix("DML_TENSOR_FLAG_").removeprefix("DML_TENSOR_FLAGS_")
        if key not in dml.TensorFlags.__members__:
            raise ModelError(join(where, "Flags"), f"unknown tensor flag {f!r}")
        flags |= dml.TensorFlags[key]
    try:
        desc = dml.TensorDesc(value["DataType"], tuple(value["Sizes"]),
                              tuple(value["Strides"]) if value.get("Strides") else None,
                              value.get("TotalTensorSizeInBytes"),
                              value.get("GuaranteedBaseOffsetAlignment", 0), flags)
    except vkml.ValidationError as exc:
        raise ModelError(_field_path(where, exc.field), exc.rule) from None
    if desc.total_tensor_size_in_bytes > limits["resource"]:
        raise ModelError(join(where, "Sizes"), f"the tensor needs "
                         f"{desc.total_tensor_size_in_bytes} bytes; the device allows at most "
                         f"{limits['resource']} in one resource")
    return desc



def _convert(value, field: str, where: str, limits: dict):
    """A checked desc value (see DESC_VALUE) as the descriptor field wants it."""
    if isinstance(value, dict):
        schema = desc_object(value)
        if schema is TENSOR_DESC or schema is WRAPPED_TENSOR_DESC:
            return _tensor_desc(value, where, limits)
        if schema is NESTED_DESC:       # a nested operator desc (a fused activation)
            inner = value.get("Desc", {k: v for k, v in value.items() if k != "Type"})
            return build_desc(value["Type"], inner,
                              join(where, "Desc") if "Desc" in value else where, limits,
                              validate=False)
        if field in STRUCTS and hasattr(dml, STRUCTS[field]):
            return _struct(getattr(dml, STRUCTS[field]), value, where)
        raise ModelError(where, f"cannot read the object {short(value)}")
    if isinstance(value, list):
        return tuple(_convert(v, field, join(where, i), limits) if isinstance(v, dict) else v
                     for i, v in enumerate(value))
    if isinstance(value, str):
        if field.endswith("data_type"):
            try:
                return dml.DataType.of(value)
            except vkml.ValidationError as exc:
                raise ModelError(where, exc.rule) from None
        for prefix, cls in _enums().items():
            if value.startswith(prefix) and value[len(prefix):] in cls.__members__:
                return cls[value[len(prefix):]]
    return value


def _scalar_union(value: dict, desc: dict, field: str, where: str):
    """A DML_SCALAR_UNION given as ``{"<member>": number}``: the member DxDispatch reads
    for the desc's data type field (FLOAT16's ``UInt16`` holds the half's bits)."""
    type_field = SCALAR_UNIONS[field]
    try:
        dt = dml.DataType.of(desc.get(type_field, "FLOAT32"))
    except vkml.ValidationError:
        raise ModelError(join(where.rsplit(".", 1)[0], type_field), "is not a data type") \
            from None
    member = UNION_MEMBERS[dt.name]
    if set(value) != {member} or not isinstance(value[member], (int, float)) \
            or isinstance(value[member], bool):
        raise ModelError(where, f"a DML_SCALAR_UNION of {type_field} {dt.name} is a number "
                         f'or {{"{member}": number}}, got {short(value)}')
    v = value[member]
    if dt == dml.DataType.FLOAT16:
        if not isinstance(v, int) or not 0 <= v <= 0xFFFF:
            raise ModelError(join(where, member), f"the bits of a FLOAT16 (0 to 65535), "
                             f"got {v!r}")
        return float(np.array([v], np.uint16).view(np.float16)[0])
    return v


def _struct(cls, value: dict, where: str):
    names = [f.name for f in dataclasses.fields(cls)]
    for k in value:
        if snake(k) not in names:
            raise ModelError(join(where, k), f"is not a field of DML_{snake(cls.__name__).upper()}"
                             f" ({', '.join(pascal(n) for n in names)})")
    required = [f.name for f in dataclasses.fields(cls) if f.init
                and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [n for n in required if n not in {snake(k) for k in value}]
    if missing:
        raise ModelError(join(where, pascal(missing[0])), f"is required (a field of "
                         f"DML_{snake(cls.__name__).upper()})")
    return cls(**{snake(k): v for k, v in value.items()})


def _check_counts(counts: dict, kwargs: dict, where: str) -> None:
    """The COUNTS fields given against the lengths of the arrays they state."""
    for key, count in counts.items():
        if key not in COUNTS:
            raise ModelError(join(where, key), f"field {key!r} is not supported by vkml")
        arrays = COUNTS[key]
        for name, v in kwargs.items():
            if not isinstance(v, tuple) or not v:
                continue
            stated = pascal(name) in arrays if arrays is not None else \
                all(isinstance(x, int) for x in v)
            if stated and len(v) != count:
                raise ModelError(join(where, key), f"{key} is {count} but {pascal(name)} has "
                                 f"{len(v)} entries")


def build_desc(type_name: str, desc: dict, where: str = "", limits: dict | None = None,
               validate: bool = True):
    """The vkml descriptor of a DxDispatch ``desc`` (at JSON path ``where``) for
    ``DML_OPERATOR_<type>``; ModelError names the place of anything wrong."""
    limits = limits or {"resource": 1 << 62}
    full = full_type(type_name)
    cls = operator_types().get(full)
    if cls is None:
        raise ModelError(join(where, "Type") if where.endswith("Desc") or not where else
                         where, _lacks(full))
    if not isinstance(desc, dict):
        raise ModelError(where, "desc must be an object")
    fields = desc_fields(cls)
    kwargs, counts = {}, {}
    for key, value in desc.items():
        name = snake(key)
        if name in fields and name in SCALAR_UNIONS and isinstance(value, dict):
            kwargs[name] = _scalar_union(value, desc, name, join(where, key))
        elif name in fields:
            kwargs[name] = _convert(value, name, join(where, key), limits)
        elif key.endswith("Count") and isinstance(value, int) and not isinstance(value, bool):
            counts[key] = value        # implied by the arrays in vkml (checked below)
        else:
            raise ModelError(join(where, key), f"field {key!r} is not a field of "
                             f"{full.replace('DML_OPERATOR_', 'DML_')}_OPERATOR_DESC as vkml "
                             f"implements it (fields: {', '.join(pascal(f) for f in fields)})")
    for name in fields:       # optional (_Maybenull_) fields left out are null, as in DxDispatch
        if name not in kwargs and (name.endswith("_tensor") or name == "fused_activation"):
            kwargs[name] = None
    _check_counts(counts, kwargs, where)
    required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING}
    missing = [pascal(f) for f in fields if f not in kwargs and f in required]
    if missing:
        raise ModelError(where, f"{full} needs {', '.join(missing)}")
    try:
        desc_obj = cls(**kwargs)
        if validate:                  # a fused activation: by the operator that fuses it
            desc_obj.validate()
    except vkml.ValidationError as exc:
        raise ModelError(_field_path(where, exc.field), exc.rule) from None
    return desc_obj


def _slot(v, ins, outs):
    """("in" | "out", index) of the tensor desc object ``v``, or None."""
    for kind, lst in (("in", ins), ("out", outs)):
        idx = next((i for i, t in enumerate(lst) if t is v), None)
        if idx is not None:
            return kind, idx
    return None


def bind_points(desc) -> dict[str, tuple]:
    """Bind-point name (``InputTensor``) -> ("in" | "out", index in inputs()/outputs());
    an array of tensors (JOIN's ``InputTensors``) -> ("in" | "out", (index, ...))."""
    ins, outs = desc.inputs(), desc.outputs()
    out = {}
    nones = [i for i, t in enumerate(ins) if t is None]
    for f in desc_fields(type(desc)):
        v = getattr(desc, f)
        if isinstance(v, dml.TensorDesc):
            slot = _slot(v, ins, outs)
            if slot is not None:
                out[pascal(f)] = slot
        elif isinstance(v, tuple) and v and all(isinstance(t, dml.TensorDesc) for t in v):
            slots = [_slot(t, ins, outs) for t in v]
            if None not in slots and len({k for k, _ in slots}) == 1:
                out[pascal(f)] = (slots[0][0], tuple(i for _, i in slots))
        elif v is None and f.endswith("_tensor") and nones:
            out[pascal(f)] = ("in", nones.pop(0))
    return out


# -- dispatchables ------------------------------------------------------------------------
@dataclasses.dataclass
class Dispatchable:
    name: str
    desc: object
    #: DML_EXECUTION_FLAGS names (suffixes); every one is a no-op in vkml, see
    #: EXECUTION_FLAG_EFFECT.
    flags: tuple = ()
    #: Bind point -> Bound for the dispatchable's own ``bindings`` (its
    #: DML_TENSOR_FLAG_OWNED_BY_DML inputs), copied into ``owned`` at initialization.
    init: dict = dataclasses.field(default_factory=dict)
    owned: dict = dataclasses.field(default_factory=dict)
    #: the operator's initializer took the owned inputs (executions bind None there)
    initialized: bool = False
    compiled: object = None
    init_ms: float = 0.0
    #: ``dmlCompileType``: "DmlCompileOp" (IDMLDevice::CompileOperator) or
    #: "DmlCompileGraph" (a one-node graph through IDMLDevice1::CompileGraph).
    compile_type: str = "DmlCompileOp"


def _flag_names(value) -> tuple:
    names = [value] if isinstance(value, str) else list(value or [])
    return tuple(dict.fromkeys(n.removeprefix("DML_EXECUTION_FLAG_") for n in names
                               if n.removeprefix("DML_EXECUTION_FLAG_") != "NONE"))


def parse_dispatchables(model: dict, limits: dict) -> dict[str, Dispatchable]:
    out = {}
    for name, d in model["dispatchables"].items():
        where = join("dispatchables", name)
        key = "desc" if "desc" in d else "Desc"
        if key not in d:
            raise ModelError(where, "needs a 'desc'")
        out[name] = Dispatchable(name, build_desc(d["type"], d[key], join(where, key), limits),
                                 _flag_names(d.get("executionFlags")),
                                 compile_type=d.get("dmlCompileType", "DmlCompileOp"))
    return out




def one_node_graph(device, d: Dispatchable):
    """DxDispatch's ``DmlCompileGraph``: the operator as the one node of a DML graph whose
    graph input ``i`` feeds the operator's input ``i`` (each input whose tensor desc is
    set; an absent optional one is left unconnected) and whose graph output ``k`` is the
    operator's output ``k``; OWNED_BY_DML inputs become the graph's constant inputs."""
    desc = d.desc
    ins, outs = desc.inputs(), desc.outputs()
    names = {v: k for k, v in bind_points(desc).items() if not isinstance(v[1], tuple)}
    graph = dml.GraphDesc(
        input_count=len(ins), output_count=len(outs),
        nodes=(dml.OperatorGraphNodeDesc(device.create_operator(desc), d.name),),
        input_edges=tuple(dml.InputGraphEdgeDesc(i, 0, i, names.get(("in", i)))
                          for i, t in enumerate(ins) if t is not None),
        output_edges=tuple(dml.OutputGraphEdgeDesc(0, k, k, names.get(("out", k)))
                           for k in range(len(outs))))
    return device.compile_graph(graph)

"""The DxDispatch model schema: a small schema language, the schema of a model file, and
the structural check that runs before anything is read from the file or allocated.

The schema is vkml's own rather than Microsoft's ``DxDispatch/models/_schema.json`` checked
by ``jsonschema``: that schema leaves an operator's ``desc`` an untyped object, has no
``writeFile``, ``sourcePath`` initializer or image resource, and no sizes; this one checks
the desc's values, checks sizes against the device (see ``device_limits``), refuses what
vkml cannot run (HLSL/ONNX dispatchables, several resources on one bind point), and
reports every refusal as one ``ModelError`` line naming the JSON path of the place.
"""
from __future__ import annotations

import dataclasses
import json
import re


class ModelError(Exception):
    """The model file is invalid, or uses something vkml does not support.

    ``path`` is the place in the file, as a JSON path
    (``resources.input.initialValues.valueCount``, ``commands[0].bindings``)."""

    def __init__(self, path: str, rule: str = ""):
        if not rule:                      # ModelError("message") with no place
            path, rule = "", path
        self.path, self.rule = path, rule
        super().__init__(f"{path}: {rule}" if path else rule)


def join(path: str, key) -> str:
    """``path`` and one key or index below it, as a JSON path."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


# -- reading the file -------------------------------------------------------------------
_STRING = r'"(?:\\.|[^"\\])*"'
_COMMENT = re.compile(_STRING + r"|//[^\n]*|/\*[\s\S]*?\*/")
_TRAILING = re.compile(_STRING + r"|,(?=\s*[}\]])")


def loads(text: str) -> dict:
    """JSON with ``//`` and ``/* */`` comments and trailing commas, as DxDispatch's parser
    reads it."""
    keep = lambda m: m.group(0) if m.group(0).startswith('"') else ""   # noqa: E731
    text = _TRAILING.sub(keep, _COMMENT.sub(keep, text))
    return json.loads(text)


# -- the schema ---------------------------------------------------------------------------
# One checker for the whole file: every value is checked for its type, its required keys
# and its range before anything is read from it or allocated for it, so a malformed file
# gets one ModelError naming the place, never a traceback.  Sizes are checked against the
# device: one resource at most ``limits["resource"]`` bytes (maxMemoryAllocationSize or the
# heap, whichever is smaller; not maxStorageBufferRange, as vkml binds larger tensors in
# windows), all of them together at most ``limits["total"]`` (the heap).
UINT32_MAX = 0xFFFFFFFF
NUMBER_STRINGS = ("nan", "inf", "-inf")


@dataclasses.dataclass(frozen=True)
class Int:
    lo: int = 0
    hi: int | str = UINT32_MAX    # a number, or a key of the limits


@dataclasses.dataclass(frozen=True)
class Num:
    """A JSON number; ``special``: also "nan", "inf", "-inf"."""
    special: bool = False


@dataclasses.dataclass(frozen=True)
class Str:
    choices: tuple = ()


@dataclasses.dataclass(frozen=True)
class Arr:
    item: object
    lo: int = 0
    hi: int | str | None = None


@dataclasses.dataclass(frozen=True)
class Obj:
    """``fields``: name -> (schema, required); ``values``: the schema of keys not in
    ``fields`` (a map of names), None: unknown keys are refused."""
    fields: dict = dataclasses.field(default_factory=dict)
    values: object = None
    what: str = "field"


@dataclasses.dataclass(frozen=True)
class Either:
    """The first option whose JSON type matches (object, array, string, number, null)."""
    options: tuple
    what: str = ""


@dataclasses.dataclass(frozen=True)
class Null:
    pass


@dataclasses.dataclass(frozen=True)
class Bool:
    pass


@dataclasses.dataclass(frozen=True)
class Any:
    """Anything (checked later by a schema chosen from its contents)."""


@dataclasses.dataclass(frozen=True)
class Pick:
    """An object whose schema depends on its keys: ``choose(value)`` gives it."""
    choose: object


_JSON_TYPE = {Int: "integer", Num: "number", Str: "string", Arr: "array", Obj: "object",
              Null: "null", Pick: "object", Bool: "boolean"}


def json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def _matches(schema, value) -> bool:
    if isinstance(schema, Any):
        return True
    t = json_type(value)
    want = _JSON_TYPE[type(schema)]
    return t == want or (want == "number" and t == "integer") or \
        (isinstance(schema, Num) and schema.special and t == "string")


def check(value, schema, path: str, limits: dict) -> None:
    """Raise ModelError(path, rule) where ``value`` breaks ``schema``."""
    if isinstance(schema, Any):
        return
    if isinstance(schema, Either):
        for option in schema.options:
            if _matches(option, value):
                return check(value, option, path, limits)
        kinds = schema.what or " or ".join(_JSON_TYPE[type(o)] for o in schema.options)
        raise ModelError(path, f"must be {kinds}, got {json_type(value)} {short(value)}")
    if not _matches(schema, value):
        want = _JSON_TYPE[type(schema)]
        if isinstance(schema, Num) and schema.special:
            want += ' (or "nan", "inf", "-inf")'
        raise ModelError(path, f"must be {'an' if want[0] in 'aeiou' else 'a'} {want}, got "
                               f"{json_type(value)} {short(value)}")
    if isinstance(schema, Pick):
        return check(value, schema.choose(value), path, limits)
    if isinstance(schema, Int):
        hi = limits[schema.hi] if isinstance(schema.hi, str) else schema.hi
        if not schema.lo <= value <= hi:
            raise ModelError(path, f"must be in [{schema.lo}, {hi}], got {value}" + (
                f" (the device's limit: {schema.hi})" if isinstance(schema.hi, str) else ""))
    elif isinstance(schema, Num):
        if isinstance(value, str) and value.lower() not in NUMBER_STRINGS:
            raise ModelError(path, f'must be a number, "nan", "inf" or "-inf", got {value!r}')
    elif isinstance(schema, Str):
        if schema.choices and value not in schema.choices:
            raise ModelError(path, f"{value!r} is not supported ({', '.join(schema.choices)})")
    elif isinstance(schema, Arr):
        hi = limits[schema.hi] if isinstance(schema.hi, str) else schema.hi
        if len(value) < schema.lo or (hi is not None and len(value) > hi):
            raise ModelError(path, f"must have {schema.lo} to {hi} entries, got {len(value)}"
                             if hi is not None else
                             f"must have at least {schema.lo} entries, got {len(value)}")
        for i, v in enumerate(value):
            check(v, schema.item, join(path, i), limits)
    elif isinstance(schema, Obj):
        for key, (sub, required) in schema.fields.items():
            if required and key not in value:
                raise ModelError(join(path, key), "is required")
        for key, v in value.items():
            if key in schema.fields:
                check(v, schema.fields[key][0], join(path, key), limits)
            elif schema.values is not None:
                check(v, schema.values, join(path, key), limits)
            else:
                raise ModelError(join(path, key), f"unsupported {schema.what} {key!r} (vkml "
                                 f"reads {', '.join(schema.fields)})")


def short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_UINT = Int(0, UINT32_MAX)
TENSOR_DESC = Obj({
    "Type": (Str(("BUFFER", "DML_TENSOR_TYPE_BUFFER")), False),
    "DataType": (Either((Str(), Int(0, 11))), True),
    "Sizes": (Arr(_UINT, 1, 8), True),
    "Strides": (Either((Arr(_UINT, 1, 8), Null())), False),
    "TotalTensorSizeInBytes": (Either((Int(0, (1 << 64) - 1), Null())), False),
    "GuaranteedBaseOffsetAlignment": (_UINT, False),
    "Flags": (Str(), False),
    "DimensionCount": (Int(1, 8), False),
}, what="DML_BUFFER_TENSOR_DESC field")
#: A DML_TENSOR_DESC: the buffer desc itself, or {Type, Desc: buffer desc}.
WRAPPED_TENSOR_DESC = Obj({"Type": (Str(("BUFFER", "DML_TENSOR_TYPE_BUFFER")), False),
                           "Desc": (TENSOR_DESC, True)}, what="DML_TENSOR_DESC field")
#: A value in an operator desc: a tensor desc, a nested operator desc (a fused
#: activation), a struct of numbers (DML_SCALE_BIAS), an array (of numbers: sizes,
#: strides, paddings; or of tensor descs: JOIN's InputTensors, SPLIT's OutputTensors), an
#: enum name, a number, or null (an optional tensor left out).
DESC_VALUE = Either((
    Pick(lambda v: desc_object(v)),
    Arr(Either((Pick(lambda v: desc_object(v)), Int(-(1 << 63), (1 << 64) - 1), Num()),
               "a number or a tensor desc"), 0, "elements"),
    Str(), Num(), Null()),
    "a tensor desc, an operator desc, an array, a string, a number or null")
OPERATOR_DESC = Obj(values=DESC_VALUE)
NESTED_DESC = Obj({"Type": (Str(), True), "Desc": (OPERATOR_DESC, False)}, values=DESC_VALUE)
STRUCT = Obj(values=Num())


def desc_object(value: dict):
    """Which object a desc value is, by its keys (as ``_convert`` reads it)."""
    if "DataType" in value or "Sizes" in value:
        return TENSOR_DESC
    if isinstance(value.get("Desc"), dict) and "Sizes" in value["Desc"]:
        return WRAPPED_TENSOR_DESC
    if "Type" in value:
        return NESTED_DESC
    return STRUCT


#: DXGI formats a DML binding may name (DxDispatch reads ``format`` as a DXGI_FORMAT;
#: for a DML operator it only sets the element size that ``elementOffset`` counts in).
DXGI_FORMAT_BYTES = {
    "R32_FLOAT": 4, "R32_UINT": 4, "R32_SINT": 4, "R32_TYPELESS": 4,
    "R16_FLOAT": 2, "R16_UINT": 2, "R16_SINT": 2, "R16_TYPELESS": 2,
    "R8_UINT": 1, "R8_SINT": 1, "R8_TYPELESS": 1,
    "R32G32_UINT": 8, "R32G32_SINT": 8, "R32G32_FLOAT": 8, "R32G32_TYPELESS": 8,
    "R32G32B32A32_FLOAT": 16, "R32G32B32A32_UINT": 16, "R32G32B32A32_TYPELESS": 16,
}
DXGI_FORMATS = tuple(sorted(DXGI_FORMAT_BYTES) +
                     sorted("DXGI_FORMAT_" + f for f in DXGI_FORMAT_BYTES))
BINDING_OBJECT = Obj({"name": (Str(), True), "elementOffset": (Int(0), False),
                      "elementCount": (Int(0), False), "format": (Str(DXGI_FORMATS), False),
                      "elementStride": (Int(0), False), "elementSizeInBytes": (Int(0), False),
                      "counter": (Str(), False), "counterOffsetBytes": (Int(0), False),
                      "shape": (Arr(Int(1), 0, 8), False)}, what="binding field")
BINDING = Either((Str(), BINDING_OBJECT, Arr(Either((Str(), BINDING_OBJECT)), 1)),
                 'a resource name, {"name": ...} or a list of them (one per tensor of an '
                 'array bind point such as InputTensors)')
RESOURCE = Obj({
    "initialValuesDataType": (Str(), False),
    "initialValues": (Either((
        Arr(Num(special=True), 1, "elements"),
        Obj({"valueCount": (Int(1, "elements"), False), "value": (Num(special=True), False),
             "valueStart": (Num(special=True), False), "valueDelta": (Num(special=True), False),
             "sourcePath": (Str(), False)}, what="initializer field"))), True),
    "sizeInBytes": (Int(0, "resource"), False),
    "resampleSize": (Arr(Int(1, "elements"), 4, 4), False),
    "resampleMode": (Str(("scale",)), False),
}, what="resource field")
COMMAND = {
    "dispatch": Obj({"type": (Str(), True), "dispatchable": (Str(), True),
                     "bindings": (Obj(values=BINDING), False),
                     "threadGroupCount": (Arr(Int(1), 3, 3), False)},   # HLSL only: ignored
                    what="dispatch field"),
    "print": Obj({"type": (Str(), True), "resource": (Str(), True),
                  "verbose": (Bool(), False)}, what="print field"),
    "writeFile": Obj({"type": (Str(), True), "resource": (Str(), True),
                      "targetPath": (Str(), True),
                      "dimensions": (Arr(Int(1, "elements"), 1, 8), False)},
                     what="writeFile field"),
}
#: DML_EXECUTION_FLAGS values, by full name or suffix (DxDispatch: "flag values are
#: singular", DML_EXECUTION_FLAG_X).  What each does in vkml: see ``EXECUTION_FLAG_EFFECT``.
EXECUTION_FLAG_EFFECT = {
    "NONE": "no flags",
    "ALLOW_HALF_PRECISION_COMPUTATION": "no-op: vkml computes float16 tensors in float32 "
    "(it never lowers precision below what the flag would allow)",
    "DISABLE_META_COMMANDS": "no-op: Vulkan has no meta commands; vkml always runs its own "
    "compute shaders",
    "DESCRIPTORS_VOLATILE": "no-op: vkml writes its descriptors when a dispatch is recorded, "
    "so bindings may always change until then",
}
EXECUTION_FLAGS = tuple(EXECUTION_FLAG_EFFECT) + tuple("DML_EXECUTION_FLAG_" + f
                                                       for f in EXECUTION_FLAG_EFFECT)
MODEL = Obj({
    "$schema": (Str(), False),
    "resources": (Obj(values=RESOURCE), True),
    "dispatchables": (Obj(values=Obj({"type": (Str(), True), "desc": (Obj(values=DESC_VALUE),
                                                                       False),
                                      "Desc": (Obj(values=DESC_VALUE), False),
                                      "executionFlags": (Either((
                                          Str(EXECUTION_FLAGS), Arr(Str(EXECUTION_FLAGS)))),
                                          False),
                                      "bindings": (Obj(values=BINDING), False),
                                      "dmlCompileType": (Str(("DmlCompileOp", "DmlCompileGraph")),
                                                         False)},
                                     what="dispatchable field")), True),
    "commands": (Arr(Either((Obj(values=Any()),), "an object")), True),
}, what="top-level key")


def check_structure(model, limits: dict) -> None:
    """The whole file against the schema: types, required keys, ranges (sizes against
    ``limits``); each command against the schema of its type."""
    if not isinstance(model, dict):
        raise ModelError("$", f"a model is a JSON object, got {json_type(model)}")
    check(model, MODEL, "", limits)
    for i, cmd in enumerate(model["commands"]):
        path = f"commands[{i}]"
        kind = cmd.get("type")
        if not isinstance(kind, str) or kind not in COMMAND:
            raise ModelError(join(path, "type"), f"type {kind!r} is not supported (dispatch, "
                                                 "print, writeFile)")
        check(cmd, COMMAND[kind], path, limits)


def device_limits(device) -> dict:
    """The limits the schema checks sizes against (see the schema's comment)."""
    heap = device.context.tensor_heap
    one = min(heap.max_alloc, heap.heap_size)
    return {"resource": one, "total": heap.heap_size, "elements": one}


def snake(name: str) -> str:
    """``StartPadding`` -> ``start_padding``, ``P`` -> ``p``, ``ATensor`` -> ``a_tensor``
    (a capital followed by a word starts a word: GEMM's and ADD's one-letter tensors)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def pascal(name: str) -> str:
    """``start_padding`` -> ``StartPadding``."""
    return "".join(w[:1].upper() + w[1:] for w in name.split("_"))


"""``python -m bench dispatch MODEL.json``: run DirectML DxDispatch model files on vkml.

A model file has ``resources`` (buffers and their initial values), ``dispatchables``
(``DML_OPERATOR_*`` operators, their ``desc`` written with DirectML's field and enum
names) and ``commands`` (``dispatch`` with named bindings, ``print``, ``writeFile``), so
the same file can be timed by DxDispatch on DirectML and by vkml on any Vulkan device.

What vkml reads (DxDispatch's documented format, doc/Guide.md and models/_schema.json):

* resources: ``initialValuesDataType`` (``FLOAT32`` or ``DML_TENSOR_DATA_TYPE_FLOAT32``),
  ``initialValues`` as an array (``"nan"``, ``"inf"``, ``"-inf"`` allowed for floats),
  ``{valueCount, value}``, ``{valueCount, valueStart, valueDelta}`` or
  ``{sourcePath}`` (``.npy``, raw ``.dat``/``.bin``, or a ``.png``/``.jpg`` image with
  ``resampleSize`` and ``resampleMode``); optional ``sizeInBytes``;
* dispatchables: ``type`` ``DML_OPERATOR_X`` (or ``X``) and ``desc``/``Desc`` with every
  field in PascalCase, enums by full name or suffix, ``DML_TENSOR_DESC`` as
  ``{DataType, Sizes, Strides?, Flags?, TotalTensorSizeInBytes?, ...}``, a fused
  activation as ``{"Type": "ACTIVATION_RELU", ...its fields}``; ``executionFlags``
  (no-ops in vkml, see EXECUTION_FLAG_EFFECT); ``bindings`` of OWNED_BY_DML inputs;
* commands: ``dispatch`` (bindings by bind-point name: a resource name, a binding object
  ``{name, format, elementOffset, elementCount}``, or a list of one), ``print``
  (``verbose``), ``writeFile`` (``.npy``, images, raw; ``dimensions``).

Comments (``//``, ``/* */``) and trailing commas are accepted, as DxDispatch's parser does.
Anything else (HLSL or ONNX dispatchables, list initializers, several resources on one
bind point, an operator vkml does not implement, a field its descriptor does not have)
is refused with an error naming it.  Timing follows DxDispatch: ``-i`` iterations of
bind + ``-r`` dispatches + wait; the first ``-w`` samples are "cold", the rest "hot";
CPU (wall) and GPU (timestamp-query) times per dispatch.
"""
from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import vkml
from vkml import dml


class ModelError(Exception):
    """The model file is invalid, or uses something vkml does not support.

    ``path`` is the place in the file, as a JSON path
    (``resources.input.initialValues.valueCount``, ``commands[0].bindings``)."""

    def __init__(self, path: str, rule: str = ""):
        if not rule:                      # ModelError("message") with no place
            path, rule = "", path
        self.path, self.rule = path, rule
        super().__init__(f"{path}: {rule}" if path else rule)


def _join(path: str, key) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


# -- reading the file -------------------------------------------------------------------
_STRING = r'"(?:\\.|[^"\\])*"'
_COMMENT = re.compile(_STRING + r"|//[^\n]*|/\*[\s\S]*?\*/")
_TRAILING = re.compile(_STRING + r"|,(?=\s*[}\]])")


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


def _json_type(value) -> str:
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
    t = _json_type(value)
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
        raise ModelError(path, f"must be {kinds}, got {_json_type(value)} {_short(value)}")
    if not _matches(schema, value):
        want = _JSON_TYPE[type(schema)]
        if isinstance(schema, Num) and schema.special:
            want += ' (or "nan", "inf", "-inf")'
        raise ModelError(path, f"must be {'an' if want[0] in 'aeiou' else 'a'} {want}, got "
                               f"{_json_type(value)} {_short(value)}")
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
            check(v, schema.item, _join(path, i), limits)
    elif isinstance(schema, Obj):
        for key, (sub, required) in schema.fields.items():
            if required and key not in value:
                raise ModelError(_join(path, key), "is required")
        for key, v in value.items():
            if key in schema.fields:
                check(v, schema.fields[key][0], _join(path, key), limits)
            elif schema.values is not None:
                check(v, schema.values, _join(path, key), limits)
            else:
                raise ModelError(_join(path, key), f"unsupported {schema.what} {key!r} (vkml "
                                 f"reads {', '.join(schema.fields)})")


def _short(value) -> str:
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
#: activation), a struct of numbers (DML_SCALE_BIAS), an array of UINTs, an enum name,
#: a number, or null (an optional tensor left out).
DESC_VALUE = Either((
    Pick(lambda v: _desc_object(v)),
    Arr(Either((Int(-(1 << 63), (1 << 64) - 1), Num()), "a number"), 0, 8),
    Str(), Num(), Null()),
    "a tensor desc, an operator desc, an array, a string, a number or null")
OPERATOR_DESC = Obj(values=DESC_VALUE)
NESTED_DESC = Obj({"Type": (Str(), True), "Desc": (OPERATOR_DESC, False)}, values=DESC_VALUE)
STRUCT = Obj(values=Num())


def _desc_object(value: dict):
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
BINDING = Either((Str(), BINDING_OBJECT, Arr(Either((Str(), BINDING_OBJECT)), 1, 1)),
                 'a resource name, {"name": ...} or [one of them]')
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


def _check_commands(model: dict, limits: dict) -> None:
    for i, cmd in enumerate(model["commands"]):
        path = f"commands[{i}]"
        kind = cmd.get("type")
        if not isinstance(kind, str) or kind not in COMMAND:
            raise ModelError(_join(path, "type"), f"type {kind!r} is not supported (dispatch, "
                                                  "print, writeFile)")
        check(cmd, COMMAND[kind], path, limits)


def check_model(model, limits: dict, base: Path = Path(".")) -> None:
    """The whole file against the schema (types, required keys, ranges; sizes against
    ``limits``), then the sizes of the resources together."""
    if not isinstance(model, dict):
        raise ModelError("$", f"a model is a JSON object, got {_json_type(model)}")
    check(model, MODEL, "", limits)
    _check_commands(model, limits)
    total = 0
    for name, r in model["resources"].items():
        path = _join("resources", name)
        total += _resource_bytes(r, path, limits, base)
        if total > limits["total"]:
            raise ModelError(path, f"the resources up to this one need {total} bytes; the "
                             f"device holds at most {limits['total']} (its memory heap)")


def _resource_bytes(r: dict, path: str, limits: dict, base: Path) -> int:
    """The bytes a resource will take, known before anything is read or allocated."""
    init = r["initialValues"]
    ipath = _join(path, "initialValues")
    npy = isinstance(init, dict) and str(init.get("sourcePath", "")).endswith(".npy")
    dtype = np.dtype(np.float32) if npy else _data_type(r.get("initialValuesDataType"), path)
    if isinstance(init, list):
        count = len(init)
    elif "sourcePath" in init:
        extra = set(init) - {"sourcePath"}
        if extra:
            raise ModelError(_join(ipath, sorted(extra)[0]), "a sourcePath initializer has no "
                             "other fields")
        if _is_image(init["sourcePath"]):
            count = _image_shape(r, dtype, path, base)[0]
        else:
            count, dtype = _file_count(init["sourcePath"], dtype, _join(ipath, "sourcePath"),
                                       base)
    else:
        if "valueCount" not in init:
            raise ModelError(ipath, "'valueCount' is required (or give 'sourcePath')")
        if "value" not in init and not ("valueStart" in init and "valueDelta" in init):
            raise ModelError(ipath, "give 'value', or 'valueStart' and 'valueDelta'")
        if "value" in init and ("valueStart" in init or "valueDelta" in init):
            raise ModelError(ipath, "give 'value' or 'valueStart' and 'valueDelta', not both")
        count = init["valueCount"]
    nbytes = count * dtype.itemsize
    where = _join(ipath, "valueCount") if isinstance(init, dict) and "valueCount" in init \
        else ipath
    if nbytes > limits["resource"]:
        raise ModelError(where, f"{count} values of {dtype} need {nbytes} bytes; the device "
                         f"allows at most {limits['resource']} in one resource")
    size = r.get("sizeInBytes", nbytes)
    if size < nbytes:
        raise ModelError(_join(path, "sizeInBytes"), f"sizeInBytes {size} is smaller than "
                         f"its initial values ({nbytes} bytes)")
    return (size + 3) & ~3


def _file_count(source: str, dtype: np.dtype, path: str, base: Path):
    """(element count, dtype) of a ``sourcePath`` file, from its size or ``.npy`` header."""
    file = _source(source, path, base)
    if file.suffix == ".npy":
        try:
            with open(file, "rb") as f:
                fmt = np.lib.format
                version = fmt.read_magic(f)
                read = fmt.read_array_header_1_0 if version == (1, 0) else \
                    fmt.read_array_header_2_0
                shape, _, dt = read(f)
        except Exception as exc:  # noqa: BLE001  (any corrupt header)
            raise ModelError(path, f"{file.name} is not a valid .npy file ({exc})") from None
        if dt.hasobject or dt.kind not in "biuf":
            raise ModelError(path, f"{file.name} holds {dt}, not numbers")
        count = 1
        for s in shape:
            count *= s
        return count, dt
    if file.suffix in (".dat", ".bin"):
        size = file.stat().st_size
        if size % dtype.itemsize:
            raise ModelError(path, f"{file.name} has {size} bytes, not a whole number of "
                             f"{dtype} values")
        return size // dtype.itemsize, dtype
    raise ModelError(path, f"sourcePath {file.name}: vkml reads .npy, .dat, .bin, .png "
                           "and .jpg files")


# -- image resources ----------------------------------------------------------------------
# DxDispatch (model/JsonParsers.cpp, ImageReaderWriter.cpp): a ``.png``/``.jpg`` source
# needs ``resampleSize`` [N, C, H, W] (N = 1) and ``initialValuesDataType`` FLOAT32 or
# FLOAT16; the image is converted to RGB (C = 3) or RGBA (otherwise), scaled to W x H
# (high-quality cubic), and stored NCHW (planar, channels in RGB(A) order), each uint8
# component divided by 255.  ``resampleMode`` must be "scale" (the default).
IMAGE_SUFFIXES = (".png", ".jpg")


def _is_image(source: str) -> bool:
    return Path(source).suffix.lower() in IMAGE_SUFFIXES


def _pillow(where: str):
    try:
        from PIL import Image
    except ImportError:
        raise ModelError(where, "image files need Pillow (pip install 'vkml[bench]')") \
            from None
    return Image


def _image_shape(r: dict, dtype: np.dtype, path: str, base: Path):
    """(element count, (C, H, W), file) of an image resource, checked before decoding:
    the header is read, not the pixels."""
    spath = _join(_join(path, "initialValues"), "sourcePath")
    file = _source(r["initialValues"]["sourcePath"], spath, base)
    if "resampleSize" not in r:
        raise ModelError(_join(path, "resampleSize"), "is required for an image sourcePath "
                         "(DxDispatch reads it as [N, C, H, W])")
    n, c, h, w = r["resampleSize"]
    rpath = _join(path, "resampleSize")
    if n != 1:
        raise ModelError(_join(rpath, 0), f"N must be 1, got {n}")
    if c not in (3, 4):
        raise ModelError(_join(rpath, 1), f"C must be 3 (RGB) or 4 (RGBA), got {c}")
    if dtype not in (np.float32, np.float16):
        raise ModelError(_join(path, "initialValuesDataType"), "an image is read as FLOAT32 "
                         f"or FLOAT16, not {dtype}")
    Image = _pillow(spath)
    try:
        with Image.open(file) as im:
            if im.format not in ("PNG", "JPEG"):
                raise ValueError(f"a {im.format} image, not PNG or JPEG")
    except Exception as exc:  # noqa: BLE001  (any unreadable image)
        raise ModelError(spath, f"{file.name} is not a readable image ({exc})") from None
    return c * h * w, (c, h, w), file


def _image_values(r: dict, dtype: np.dtype, path: str, base: Path) -> np.ndarray:
    """The image as DxDispatch lays it out (see the comment above)."""
    _, (c, h, w), file = _image_shape(r, dtype, path, base)
    spath = _join(_join(path, "initialValues"), "sourcePath")
    Image = _pillow(spath)
    try:
        with Image.open(file) as im:
            im = im.convert("RGB" if c == 3 else "RGBA")
            if im.size != (w, h):
                im = im.resize((w, h), Image.Resampling.BICUBIC)
            hwc = np.asarray(im, dtype=np.uint8)
    except Exception as exc:  # noqa: BLE001  (a corrupt image body)
        raise ModelError(spath, f"{file.name} cannot be decoded ({exc})") from None
    chw = hwc.transpose(2, 0, 1).astype(np.float32) / np.float32(255)
    return chw.reshape(-1).astype(dtype)


def _source(source: str, path: str, base: Path) -> Path:
    for cand in (base / source, Path.cwd() / source):
        if cand.is_file():
            return cand
    raise ModelError(path, f"sourcePath {source!r} not found next to the model or in the "
                           "current folder")


def device_limits(device) -> dict:
    """The limits the schema checks sizes against (see the schema's comment)."""
    heap = device.context.tensor_heap
    one = min(heap.max_alloc, heap.heap_size)
    return {"resource": one, "total": heap.heap_size, "elements": one}


def loads(text: str) -> dict:
    """JSON with ``//`` and ``/* */`` comments and trailing commas."""
    keep = lambda m: m.group(0) if m.group(0).startswith('"') else ""   # noqa: E731
    text = _TRAILING.sub(keep, _COMMENT.sub(keep, text))
    return json.loads(text)


def snake(name: str) -> str:
    """``StartPadding`` -> ``start_padding``, ``P`` -> ``p``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def pascal(name: str) -> str:
    return "".join(w[:1].upper() + w[1:] for w in name.split("_"))


# -- resources ------------------------------------------------------------------------
@dataclasses.dataclass
class Resource:
    name: str
    dtype: np.dtype
    values: np.ndarray          # the initial values (what print/writeFile show)
    nbytes: int                 # buffer size (>= values.nbytes, a multiple of 4)
    tensor: object = None


def _data_type(value, where: str) -> np.dtype:
    path = _join(where, "initialValuesDataType")
    if value in (None, "UNKNOWN", "DML_TENSOR_DATA_TYPE_UNKNOWN"):
        raise ModelError(path, f"initialValuesDataType {value!r} (a list initializer for "
                         "HLSL constant buffers) is not supported by vkml")
    try:
        return dml.DataType.of(value).numpy
    except vkml.ValidationError as exc:
        raise ModelError(path, exc.rule) from None


def _typed(vals: list, dtype: np.dtype, path: str) -> np.ndarray:
    """JSON numbers as ``dtype``: floats through float64 ("nan", "inf", "-inf" allowed),
    integers exactly, each in the type's range (else the entry is named)."""
    if dtype.kind == "f":
        return np.array([float(v) for v in vals], dtype=np.float64).astype(dtype)
    info = np.iinfo(dtype)
    for i, v in enumerate(vals):
        if isinstance(v, str) or (isinstance(v, float) and not v.is_integer()):
            raise ModelError(_join(path, i) if len(vals) > 1 else path,
                             f"{v!r} is not an integer of type {dtype}")
        if not info.min <= int(v) <= info.max:
            raise ModelError(_join(path, i) if len(vals) > 1 else path,
                             f"{v!r} does not fit {dtype} ({info.min}..{info.max})")
    return np.array([int(v) for v in vals], dtype=dtype)


def _sequence(start, delta, count: int, dtype: np.dtype, path: str) -> np.ndarray:
    """``start + delta * i`` for ``i < count``, made by NumPy (never a Python list)."""
    if dtype.kind == "f":
        return (float(start) + float(delta) * np.arange(count, dtype=np.float64)).astype(dtype)
    for key, v in (("valueStart", start), ("valueDelta", delta)):
        _typed([v], np.dtype(np.int64) if key == "valueDelta" else dtype, _join(path, key))
    last = int(start) + int(delta) * (count - 1)
    _typed([last], dtype, _join(path, "valueCount"))    # the last value fits the type
    wide = np.uint64 if dtype == np.uint64 else np.int64
    i = np.arange(count, dtype=wide)
    if delta < 0:
        return (np.asarray(int(start), wide) - i * wide(-int(delta))).astype(dtype)
    return (np.asarray(int(start), wide) + i * wide(int(delta))).astype(dtype)


def _values(init, dtype: np.dtype, path: str, base: Path, r: dict | None = None) \
        -> np.ndarray:
    """The initial values (the schema and the size check have passed)."""
    if isinstance(init, list):
        return _typed(init, dtype, path)
    if "sourcePath" in init and _is_image(init["sourcePath"]):
        return _image_values(r, dtype, path.rsplit(".initialValues", 1)[0], base)
    if "sourcePath" in init:
        spath = _join(path, "sourcePath")
        file = _source(init["sourcePath"], spath, base)
        try:
            if file.suffix == ".npy":
                return np.load(file, allow_pickle=False).reshape(-1)
            return np.fromfile(file, dtype=dtype)
        except (ValueError, OSError, EOFError) as exc:
            raise ModelError(spath, f"{file.name} cannot be read ({exc})") from None
    count = init["valueCount"]
    if "value" in init:
        return np.full(count, _typed([init["value"]], dtype, _join(path, "value"))[0],
                       dtype=dtype)
    return _sequence(init["valueStart"], init["valueDelta"], count, dtype, path)


def parse_resources(model: dict, base: Path) -> dict[str, Resource]:
    out = {}
    for name, r in model["resources"].items():
        where = _join("resources", name)
        src = r["initialValues"]
        npy = isinstance(src, dict) and str(src.get("sourcePath", "")).endswith(".npy")
        dtype = np.dtype(np.float32) if npy else _data_type(r.get("initialValuesDataType"),
                                                            where)
        values = _values(src, dtype, _join(where, "initialValues"), base, r)
        size = r.get("sizeInBytes", values.nbytes)
        out[name] = Resource(name, values.dtype, values, (size + 3) & ~3)
    return out


# -- descriptors ------------------------------------------------------------------------
def _classes():
    """DML operator type -> vkml descriptor class, and DML enum prefix -> enum class."""
    ops, enums = {}, {}
    for name in dml.__all__:
        obj = getattr(dml, name, None)
        if isinstance(obj, type) and issubclass(obj, dml.OperatorDesc) and obj.OPERATOR_TYPE:
            ops[obj.OPERATOR_TYPE] = obj
        elif isinstance(obj, type) and issubclass(obj, enum.Enum):
            enums["DML_" + snake(obj.__name__).upper() + "_"] = obj
    return ops, enums


def _desc_fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]


def _field_path(where: str, field: str) -> str:
    """A vkml field name in a ValidationError (``PaddingOperatorDesc.start_padding[1]``,
    ``TensorDesc.sizes[0]``) as the JSON path below ``where`` (``...StartPadding[1]``)."""
    parts = field.split(".")
    if parts and parts[0][:1].isupper():          # the class name
        parts = parts[1:]
    for p in parts:
        name, _, index = p.partition("[")
        where = _join(where, pascal(name)) + (f"[{index}" if index else "")
    return where


def _tensor_desc(value: dict, where: str, limits: dict) -> dml.TensorDesc:
    if "DataType" not in value:                   # DML_TENSOR_DESC {Type, Desc}
        value, where = value["Desc"], _join(where, "Desc")
    if "DimensionCount" in value and value["DimensionCount"] != len(value["Sizes"]):
        raise ModelError(_join(where, "DimensionCount"), f"DimensionCount "
                         f"{value['DimensionCount']} but Sizes has {len(value['Sizes'])} "
                         "entries")
    flags = dml.TensorFlags.NONE
    for f in (value.get("Flags") or "NONE").replace(" ", "").split("|"):
        key = f.removeprefix("DML_TENSOR_FLAG_").removeprefix("DML_TENSOR_FLAGS_")
        if key not in dml.TensorFlags.__members__:
            raise ModelError(_join(where, "Flags"), f"unknown tensor flag {f!r}")
        flags |= dml.TensorFlags[key]
    try:
        desc = dml.TensorDesc(value["DataType"], tuple(value["Sizes"]),
                              tuple(value["Strides"]) if value.get("Strides") else None,
                              value.get("TotalTensorSizeInBytes"),
                              value.get("GuaranteedBaseOffsetAlignment", 0), flags)
    except vkml.ValidationError as exc:
        raise ModelError(_field_path(where, exc.field), exc.rule) from None
    if desc.total_tensor_size_in_bytes > limits["resource"]:
        raise ModelError(_join(where, "Sizes"), f"the tensor needs "
                         f"{desc.total_tensor_size_in_bytes} bytes; the device allows at most "
                         f"{limits['resource']} in one resource")
    return desc


def _convert(value, field: str, where: str, enums: dict, limits: dict):
    """A checked desc value (see DESC_VALUE) as the descriptor field wants it."""
    if isinstance(value, dict):
        schema = _desc_object(value)
        if schema is TENSOR_DESC or schema is WRAPPED_TENSOR_DESC:
            return _tensor_desc(value, where, limits)
        if schema is NESTED_DESC:       # a nested operator desc (a fused activation)
            inner = value.get("Desc", {k: v for k, v in value.items() if k != "Type"})
            return build_desc(value["Type"], inner,
                              _join(where, "Desc") if "Desc" in value else where, limits,
                              validate=False)
        struct = {"scale_bias": "ScaleBias"}.get(field)
        if struct and hasattr(dml, struct):
            cls = getattr(dml, struct)
            names = [f.name for f in dataclasses.fields(cls)]
            for k in value:
                if snake(k) not in names:
                    raise ModelError(_join(where, k), f"is not a field of DML_SCALE_BIAS "
                                     f"({', '.join(pascal(n) for n in names)})")
            return cls(**{snake(k): v for k, v in value.items()})
        raise ModelError(where, f"cannot read the object {_short(value)}")
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, str):
        if field.endswith("data_type"):
            try:
                return dml.DataType.of(value)
            except vkml.ValidationError as exc:
                raise ModelError(where, exc.rule) from None
        for prefix, cls in enums.items():
            if value.startswith(prefix) and value[len(prefix):] in cls.__members__:
                return cls[value[len(prefix):]]
    return value


def build_desc(type_name: str, desc: dict, where: str = "", limits: dict | None = None,
               validate: bool = True):
    """The vkml descriptor of a DxDispatch ``desc`` (at JSON path ``where``) for
    ``DML_OPERATOR_<type>``; ModelError names the place of anything wrong."""
    limits = limits or {"resource": 1 << 62}
    ops, enums = _classes()
    full = type_name if type_name.startswith("DML_OPERATOR_") else "DML_OPERATOR_" + type_name
    cls = ops.get(full)
    if cls is None:
        raise ModelError(_join(where, "Type") if where.endswith("Desc") or not where else
                         where, f"vkml has no {full} (it implements: "
                         f"{', '.join(sorted(t for t in ops if 'ACTIVATION' not in t))})")
    if not isinstance(desc, dict):
        raise ModelError(where, "desc must be an object")
    fields = _desc_fields(cls)
    kwargs = {}
    counts = {}
    for key, value in desc.items():
        name = snake(key)
        if name in fields:
            kwargs[name] = _convert(value, name, _join(where, key), enums, limits)
        elif key.endswith("Count") and isinstance(value, int) and not isinstance(value, bool):
            counts[key] = value        # implied by the arrays in vkml (checked below)
        else:
            raise ModelError(_join(where, key), f"field {key!r} is not a field of "
                             f"{full.replace('DML_OPERATOR_', 'DML_')}_OPERATOR_DESC as vkml "
                             f"implements it (fields: {', '.join(pascal(f) for f in fields)})")
    for name in fields:       # optional (_Maybenull_) fields left out are null, as in DxDispatch
        if name not in kwargs and (name.endswith("_tensor") or name == "fused_activation"):
            kwargs[name] = None
    dim = counts.pop("DimensionCount", None)
    if counts:
        raise ModelError(_join(where, sorted(counts)[0]), f"field(s) {sorted(counts)} are not "
                         "supported by vkml")
    if dim is not None:
        for name, v in kwargs.items():
            if isinstance(v, tuple) and v and all(isinstance(x, int) for x in v) \
                    and len(v) != dim:
                raise ModelError(_join(where, "DimensionCount"), f"DimensionCount is {dim} but "
                                 f"{pascal(name)} has {len(v)} entries")
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


def bind_points(desc) -> dict[str, tuple[str, int]]:
    """Bind-point name (``InputTensor``) -> ("in" | "out", index in inputs()/outputs())."""
    ins, outs = desc.inputs(), desc.outputs()
    out = {}
    nones = [i for i, t in enumerate(ins) if t is None]
    for f in _desc_fields(type(desc)):
        v = getattr(desc, f)
        if isinstance(v, dml.TensorDesc):
            for kind, lst in (("in", ins), ("out", outs)):
                idx = next((i for i, t in enumerate(lst) if t is v), None)
                if idx is not None:
                    out[pascal(f)] = (kind, idx)
                    break
        elif v is None and f.endswith("_tensor") and nones:
            out[pascal(f)] = ("in", nones.pop(0))
    return out


# -- running ----------------------------------------------------------------------------
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


def _flag_names(value) -> tuple:
    names = [value] if isinstance(value, str) else list(value or [])
    return tuple(dict.fromkeys(n.removeprefix("DML_EXECUTION_FLAG_") for n in names
                               if n.removeprefix("DML_EXECUTION_FLAG_") != "NONE"))


def parse_dispatchables(model: dict, limits: dict) -> dict[str, Dispatchable]:
    out = {}
    for name, d in model["dispatchables"].items():
        where = _join("dispatchables", name)
        kind = d["type"]
        if not kind.upper().startswith("DML_OPERATOR_") and not kind.isupper():
            raise ModelError(_join(where, "type"), f"type {kind!r} is not supported by vkml (it "
                             "runs DirectML operators, DML_OPERATOR_*; not HLSL, ONNX or "
                             "serialized graphs)")
        key = "desc" if "desc" in d else "Desc"
        if key not in d:
            raise ModelError(where, "needs a 'desc'")
        out[name] = Dispatchable(name, build_desc(kind, d[key], _join(where, key), limits),
                                 _flag_names(d.get("executionFlags")))
    return out


@dataclasses.dataclass
class Bound:
    """One resource bound to a bind point: ``offset`` bytes into it (a binding object's
    ``elementOffset`` times its element size), the tensor taking ``nbytes`` from there."""
    resource: Resource
    offset: int = 0
    nbytes: int = 0


@dataclasses.dataclass
class Timing:
    iterations: int = 1
    repeat: int = 1
    warmup: int = 1
    milliseconds: float | None = None
    verbosity: int = 0


def _stats_line(label: str, samples: list[float]) -> str:
    if not samples:
        return f"{label}: 0 samples"
    return (f"{label}: {len(samples)} samples, {statistics.fmean(samples):.4f} ms average, "
            f"{min(samples):.4f} ms min, {statistics.median(samples):.4f} ms median, "
            f"{max(samples):.4f} ms max")


def _owned(tdesc) -> bool:
    return tdesc is not None and bool(tdesc.flags & dml.TensorFlags.OWNED_BY_DML)


class Executor:
    """Runs a model that :func:`check_model` accepted; every reference (dispatchable,
    resource, bind point) and binding size is checked in ``__init__``, before anything is
    allocated on the device."""

    def __init__(self, model: dict, base: Path, device, timing: Timing, out=print,
                 limits: dict | None = None):
        self.device = device
        self.timing = timing
        self.out = out
        limits = limits or device_limits(device)
        self.resources = parse_resources(model, base)
        self.dispatchables = parse_dispatchables(model, limits)
        self.commands = model["commands"]
        for name, d in self.dispatchables.items():
            spec = model["dispatchables"][name]
            self._init_bindings(d, spec.get("bindings") or {},
                                _join(_join("dispatchables", name), "bindings"))
        self.bound = {}
        for i, cmd in enumerate(self.commands):
            where = f"commands[{i}]"
            if cmd["type"] == "dispatch":
                name = cmd["dispatchable"]
                if name not in self.dispatchables:
                    raise ModelError(_join(where, "dispatchable"), f"no dispatchable named "
                                     f"{name!r}")
                self.bound[i] = self._bindings(self.dispatchables[name], cmd.get("bindings"),
                                               _join(where, "bindings"))
            else:
                self._resource(cmd["resource"], _join(where, "resource"))
                if cmd["type"] == "writeFile":
                    self._check_write(cmd, where)
        self.records: list[dict] = []

    def setup(self) -> None:
        """Allocate and upload the resources, then initialize the dispatchables (compile;
        copy the resources bound to OWNED_BY_DML inputs into memory the dispatchable
        owns, as DirectML's operator initializer does: later writes to those resources
        do not reach the operator)."""
        dev = self.device
        for r in self.resources.values():
            raw = np.zeros(r.nbytes, np.uint8)
            raw[:r.values.nbytes] = r.values.view(np.uint8)
            r.tensor = dev.tensor(raw)
        from vkml.ops.base import REGISTRY

        for d in self.dispatchables.values():
            where = _join("dispatchables", d.name)
            if type(d.desc) not in REGISTRY:
                raise ModelError(where, f"vkml does not implement {d.desc.OPERATOR_TYPE} yet "
                                 "(its descriptor exists)")
            t = time.perf_counter()
            try:
                d.compiled = dev.compile_operator(dev.create_operator(d.desc))
            except (vkml.ValidationError, vkml.UnsupportedError) as exc:
                raise ModelError(where, f"{d.desc.OPERATOR_TYPE}: {exc}") from None
            for point, b in d.init.items():
                d.owned[point] = dev.tensor(self._read_range(b.resource, b.offset, b.nbytes))
            if d.owned and getattr(d.compiled, "owned_inputs", None):
                # the operator's own initializer (IDMLOperatorInitializer): it keeps (or
                # transforms) the owned inputs, and executions bind nothing in their place
                points = bind_points(d.desc)
                d.compiled.initialize({points[p][1]: t for p, t in d.owned.items()})
                d.initialized = True
            d.init_ms = (time.perf_counter() - t) * 1e3
            if self.timing.verbosity >= 1:
                self.out(f"Initialize '{d.name}': {d.init_ms:.4f} ms")

    def run(self) -> list[dict]:
        self.setup()
        for i, cmd in enumerate(self.commands):
            kind = cmd["type"]
            if kind == "dispatch":
                self.dispatch(cmd, i)
            elif kind == "print":
                self.print_(cmd, i)
            else:
                self.write_file(cmd, i)
        return self.records

    def release(self) -> None:
        for d in self.dispatchables.values():
            if d.compiled is not None:
                d.compiled.release()
            for t in d.owned.values():
                t.free()
        for r in self.resources.values():
            if r.tensor is not None:
                r.tensor.free()

    def _resource(self, name, where) -> Resource:
        if name not in self.resources:
            raise ModelError(where, f"no resource named {name!r}")
        return self.resources[name]

    def _source(self, target, where: str, need: int, point: str) -> Bound:
        """A binding (a name or a binding object) checked against the bytes the tensor
        needs (``TotalTensorSizeInBytes``)."""
        if isinstance(target, str):
            r = self._resource(target, where)
            offset, size, what = 0, r.nbytes, f"resource '{r.name}'"
        else:
            for key in ("counter", "counterOffsetBytes", "shape"):
                if key in target:
                    raise ModelError(_join(where, key), f"{key!r} is for HLSL/ONNX "
                                     "dispatchables, not DirectML operators")
            r = self._resource(target["name"], _join(where, "name"))
            if "format" in target:
                elem = DXGI_FORMAT_BYTES[target["format"].removeprefix("DXGI_FORMAT_")]
            else:
                elem = target.get("elementSizeInBytes") or r.dtype.itemsize
            offset = target.get("elementOffset", 0) * elem
            size = r.nbytes - offset
            what = f"the sub-range of resource '{r.name}' at byte {offset}"
            if "elementCount" in target:
                size = min(size, target["elementCount"] * elem)
                what += f" ({target['elementCount']} elements)"
            if offset > r.nbytes or size < 0:
                raise ModelError(_join(where, "elementOffset"), f"byte offset {offset} is past "
                                 f"the end of resource '{r.name}' ({r.nbytes} bytes)")
            if offset % 4:
                raise ModelError(_join(where, "elementOffset"), f"byte offset {offset} is not "
                                 "a multiple of 4 (DirectML binds buffers at 4-byte "
                                 "alignment)")
        if size < need:
            raise ModelError(where, f"{point} -> {what} holds {size} bytes; the tensor needs "
                         f"TotalTensorSizeInBytes = {need}" + ("" if isinstance(target, str)
                         else " (binding sub-ranges: elementOffset, elementCount)"))
        return Bound(r, offset, (need + 3) & ~3)

    def _point(self, d: Dispatchable, point: str, target, at: str, points: dict):
        if point not in points:
            raise ModelError(at, f"{d.desc.OPERATOR_TYPE} has no bind point {point!r} "
                             f"(bind points: {', '.join(points)})")
        if isinstance(target, list):
            target, at = target[0], _join(at, 0)
        kind, idx = points[point]
        tdesc = (d.desc.inputs() if kind == "in" else d.desc.outputs())[idx]
        if tdesc is None:
            raise ModelError(at, f"bind point {point!r} has a null tensor desc")
        return kind, idx, tdesc, self._source(target, at, tdesc.total_tensor_size_in_bytes,
                                              point)

    def _init_bindings(self, d: Dispatchable, bindings: dict, where: str) -> None:
        """A dispatchable's own ``bindings``: DxDispatch binds them once, when it
        initializes the operator; DirectML reads only its OWNED_BY_DML inputs there."""
        points = bind_points(d.desc)
        for point, target in bindings.items():
            at = _join(where, point)
            kind, idx, tdesc, b = self._point(d, point, target, at, points)
            if kind != "in" or not _owned(tdesc):
                raise ModelError(at, f"{point} is not an input with DML_TENSOR_FLAG_OWNED_BY_DML;"
                                 " a dispatchable's bindings are bound at initialization, "
                                 "which only owned inputs are (bind it in the dispatch "
                                 "command)")
            d.init[point] = b
        for point, (kind, idx) in points.items():
            tdesc = (d.desc.inputs() if kind == "in" else d.desc.outputs())[idx]
            if _owned(tdesc) and point not in d.init:
                raise ModelError(where.rsplit(".", 1)[0], f"{point} is "
                                 "DML_TENSOR_FLAG_OWNED_BY_DML: bind it in the dispatchable's "
                                 "'bindings' (bound once, at initialization)")
            if kind == "out" and _owned(tdesc):
                raise ModelError(where.rsplit(".", 1)[0], f"{point}: "
                                 "DML_TENSOR_FLAG_OWNED_BY_DML is for input tensors only")

    def _bindings(self, d: Dispatchable, bindings: dict, where: str):
        """The Bounds of the inputs and outputs (None: an absent optional; an owned input
        is None here and comes from ``d.owned`` at dispatch)."""
        points = bind_points(d.desc)
        ins = [None] * len(d.desc.inputs())
        outs = [None] * len(d.desc.outputs())
        for point, target in (bindings or {}).items():
            at = _join(where, point)
            kind, idx, tdesc, b = self._point(d, point, target, at, points)
            if point in d.init:
                raise ModelError(at, f"{point} is DML_TENSOR_FLAG_OWNED_BY_DML and was bound "
                                 "at initialization (the dispatchable's bindings); DirectML "
                                 "binds nothing there at execution")
            (ins if kind == "in" else outs)[idx] = b
        for kind, lst, descs in (("in", ins, d.desc.inputs()), ("out", outs, d.desc.outputs())):
            for idx, (t, tdesc) in enumerate(zip(lst, descs)):
                name = next((p for p, v in points.items() if v == (kind, idx)), None)
                if t is None and tdesc is not None and name not in d.init:
                    raise ModelError(where, f"bind point {name!r} is not bound")
        return ins, outs

    def _read_range(self, r: Resource, offset: int, nbytes: int) -> np.ndarray:
        out = np.empty(nbytes, np.uint8)
        self.device.context.read(r.tensor.allocation, out, offset)
        return out

    def dispatch(self, cmd: dict, index: int) -> None:
        """Record ``-r`` dispatches, run ``-i`` times.  A binding at a byte offset is
        staged: its bytes are copied into a tensor of its own before the timed loop and
        (outputs) back after it, so the operator sees that range as DirectML would."""
        name = cmd["dispatchable"]
        d = self.dispatchables[name]
        bins, bouts = self.bound[index]
        points = bind_points(d.desc)
        staged = []

        def tensor_of(b: Bound | None, kind: str, idx: int):
            if b is None:
                point = next((p for p, v in points.items() if v == (kind, idx)), None)
                return None if d.initialized else d.owned.get(point)
            if b.offset == 0:
                return b.resource.tensor
            t = self.device.tensor(self._read_range(b.resource, b.offset, b.nbytes))
            staged.append((t, b, kind))
            return t

        try:
            ins = [tensor_of(b, "in", i) for i, b in enumerate(bins)]
            outs = [tensor_of(b, "out", i) for i, b in enumerate(bouts)]
            self._timed(name, d, ins, outs)
            for t, b, kind in staged:
                if kind == "out":
                    self.device.context.write(b.resource.tensor.allocation, t.read_bytes(b.nbytes),
                                           b.offset)
        finally:
            for t, _, _ in staged:
                t.free()

    def _timed(self, name: str, d: Dispatchable, ins, outs) -> None:
        tm = self.timing
        cpu, gpu = [], []
        with self.device.sequence(timed=True) as seq:
            for _ in range(tm.repeat):          # barriers between repeats come from hazards
                d.compiled.record(seq, ins, outs)
            start = time.perf_counter()
            i = 0
            while True:
                t = time.perf_counter()
                seq.run()
                cpu.append((time.perf_counter() - t) * 1e3 / tm.repeat)
                if seq.gpu_time_ns:
                    gpu.append(seq.gpu_time_ns * 1e-6 / tm.repeat)
                i += 1
                if tm.milliseconds is not None:
                    if (time.perf_counter() - start) * 1e3 >= tm.milliseconds:
                        break
                elif i >= tm.iterations:
                    break
        n = len(cpu)
        line = f"Dispatch '{name}': {n} iterations, {statistics.median(cpu):.4f} ms median (CPU)"
        if gpu:
            line += f", {statistics.median(gpu):.4f} ms median (GPU)"
        self.out(line)
        w = min(tm.warmup, n - 1) if n > 1 else 0
        if tm.verbosity >= 1:
            self.out(_stats_line("CPU Timings (Cold)", cpu[:w]))
            if gpu:
                self.out(_stats_line("GPU Timings (Cold)", gpu[:w]))
            self.out(_stats_line("CPU Timings (Hot) ", cpu[w:]))
            if gpu:
                self.out(_stats_line("GPU Timings (Hot) ", gpu[w:]))
        if tm.verbosity >= 2:
            self.out("The timings of each iteration:")
            for k, c in enumerate(cpu):
                g = f", {gpu[k]:.4f} ms (GPU)" if k < len(gpu) else ""
                self.out(f"iteration {k}: {c:.4f} ms (CPU){g}")
        self.records.append({"dispatchable": name, "operator": d.desc.OPERATOR_TYPE,
                             "init_ms": d.init_ms, "iterations": n, "repeat": tm.repeat,
                             "cpu_ms": cpu, "gpu_ms": gpu, "cold_samples": w,
                             "execution_flags": list(d.flags)})

    def _read(self, r: Resource) -> np.ndarray:
        raw = r.tensor.read_bytes(r.nbytes)
        return raw[:r.values.nbytes].view(r.dtype).copy()

    def print_(self, cmd: dict, index: int) -> None:
        """DxDispatch's print: ``Resource 'NAME': v0, v1, ...`` over the initialized
        elements (C++ ostream formatting: 6 significant digits); ``verbose``: the name
        line, then ``[index] value (0xHEX)`` per element, the index right-aligned to the
        width of the count and the hex to the element's digit count (fmt's ``{:{}X}``)."""
        r = self._resource(cmd["resource"], f"commands[{index}].resource")
        vals = self._read(r)
        if not cmd.get("verbose"):
            self.out(f"Resource '{r.name}': " + ", ".join(_fmt(v) for v in vals.tolist()))
            return
        self.out(f"Resource '{r.name}':")
        n = len(vals)
        iw = int(np.floor(np.log10(n))) + 1 if n else 1
        hw = r.dtype.itemsize * 2
        bits = vals.view(f"u{r.dtype.itemsize}").tolist()
        for k, (v, h) in enumerate(zip(vals.tolist(), bits)):
            self.out(f"[{k:>{iw}}] {_fmt(v)} (0x{h:>{hw}X})")

    def _check_write(self, cmd: dict, where: str) -> None:
        r = self.resources[cmd["resource"]]
        suffix = Path(cmd["targetPath"]).suffix.lower()
        dims = cmd.get("dimensions")
        if dims is not None:
            count = 1
            for s in dims:
                count *= s
            if count * r.dtype.itemsize > r.nbytes:
                raise ModelError(_join(where, "dimensions"), f"{dims} is {count} elements; "
                                 f"resource '{r.name}' holds {r.nbytes // r.dtype.itemsize}")
        if suffix in IMAGE_SUFFIXES:
            if r.dtype not in (np.float32, np.float16):
                raise ModelError(_join(where, "targetPath"), "an image is written from FLOAT32 "
                                 f"or FLOAT16 resources, not {r.dtype}")
            channels = dims[1] if dims and len(dims) > 1 else 1
            if channels not in (1, 3, 4):
                raise ModelError(_join(where, "dimensions"), f"an image has 1, 3 or 4 channels "
                                 f"(dimensions [N, C, H, W]), got C = {channels}")

    def write_file(self, cmd: dict, index: int) -> None:
        """DxDispatch's writeFile: ``.npy`` (the resource's data type, shape
        ``dimensions`` or 1-D over the whole buffer), ``.png``/``.jpg`` (``dimensions``
        NCHW: 1 channel grey, 3 RGB, 4 RGBA; each value clamped to [0, 1] times 255,
        truncated), anything else raw bytes of the whole buffer.  Folders are created."""
        where = f"commands[{index}].targetPath"
        r = self._resource(cmd["resource"], f"commands[{index}].resource")
        path = Path(cmd["targetPath"])
        raw = r.tensor.read_bytes(r.nbytes)
        dims = cmd.get("dimensions")
        suffix = path.suffix.lower()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if suffix == ".npy":
                shape = tuple(dims) if dims else (r.nbytes // r.dtype.itemsize,)
                count = int(np.prod(shape))
                np.save(path, raw[:count * r.dtype.itemsize].view(r.dtype).reshape(shape))
            elif suffix in IMAGE_SUFFIXES:
                self._write_image(path, raw, r, dims, where)
            else:
                path.write_bytes(raw.tobytes())
        except OSError as exc:
            raise ModelError(where, f"cannot write {path}: {exc}") from None

    def _write_image(self, path: Path, raw: np.ndarray, r: Resource, dims, where: str):
        Image = _pillow(where)
        dims = list(dims or [])
        c = dims[1] if len(dims) > 1 else 1
        h = dims[2] if len(dims) > 2 else 1
        w = dims[3] if len(dims) > 3 else 1
        vals = raw[:c * h * w * r.dtype.itemsize].view(r.dtype).astype(np.float32)
        if vals.size < c * h * w:
            raise ModelError(where, f"resource '{r.name}' holds {vals.size} values, the image "
                             f"{c * h * w}")
        px = (np.clip(vals, 0, 1) * 255).astype(np.uint8).reshape(c, h, w).transpose(1, 2, 0)
        mode = {1: "L", 3: "RGB", 4: "RGBA"}[c]
        Image.fromarray(px[:, :, 0] if c == 1 else px, mode).save(path)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def run_model(path, device, timing: Timing | None = None, out=print) -> list[dict]:
    """Run a model file on ``device``; returns one record per dispatch command.  A
    malformed model raises ModelError naming the place before anything is allocated."""
    path = Path(path)
    try:
        model = loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"line {exc.lineno} column {exc.colno}", f"not valid JSON: "
                         f"{exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError("", f"cannot read the model: {exc}") from None
    limits = device_limits(device)
    check_model(model, limits, path.parent)
    ex = Executor(model, path.parent, device, timing or Timing(), out, limits)
    try:
        return ex.run()
    finally:
        ex.release()


def main(argv=None) -> int:
    """The command line; a malformed model prints one line naming the place (stderr) and
    returns 2."""
    ap = argparse.ArgumentParser(prog="python -m bench dispatch",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="DxDispatch model file (.json)")
    ap.add_argument("-a", "--device", "--adapter", default=None,
                    help="Vulkan device: index or name substring (DxDispatch's --adapter)")
    ap.add_argument("-i", "--dispatch_iterations", type=int, default=1,
                    help="bind/dispatch/wait iterations (default 1)")
    ap.add_argument("-r", "--dispatch_repeat", type=int, default=1,
                    help="dispatches per iteration (default 1)")
    ap.add_argument("-t", "--milliseconds_to_run", type=float, default=None,
                    help="run iterations for this long instead of -i")
    ap.add_argument("-w", "--warmup_samples", type=int, default=1,
                    help="samples counted as cold (default 1)")
    ap.add_argument("-v", "--timing_verbosity", type=int, default=0, choices=(0, 1, 2),
                    help="0: hot timings, 1: init/cold/hot, 2: every iteration")
    ap.add_argument("--json", metavar="PATH", help="write the timings as JSON")
    args = ap.parse_args(argv)
    if args.dispatch_iterations < 1 or args.dispatch_repeat < 1:
        ap.error("iterations and repeat must be at least 1")
    timing = Timing(args.dispatch_iterations, args.dispatch_repeat, args.warmup_samples,
                    args.milliseconds_to_run, args.timing_verbosity)
    try:
        with vkml.Device(args.device) as dev:
            print(f"Running on [{dev.index}] '{dev.name}' ({dev.info.driver_name} "
                  f"{dev.info.driver_info})")
            records = run_model(args.model, dev, timing)
            info = {"index": dev.index, "name": dev.name, "driver_name": dev.info.driver_name,
                    "driver_info": dev.info.driver_info}
    except (ModelError, vkml.VkmlError) as exc:
        print(f"vkml-bench dispatch: {args.model}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": str(args.model), "device": info, "vkml": vkml.__version__,
                       "dispatches": records}, f, indent=1)
            f.write("\n")
    return 0

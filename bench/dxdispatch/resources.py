"""Resources of a DxDispatch model: their sizes (checked against the device before anything
is read), their initial values (lists, constants, sequences, ``.npy``/raw files, images),
and the files ``writeFile`` writes from them."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

import vkml
from vkml import dml
from vkml.intmath import round_up

from .schema import ModelError, join


def check_sizes(model: dict, limits: dict, base: Path) -> None:
    """Each resource's bytes against ``limits["resource"]``, all of them together against
    ``limits["total"]`` (the model has passed the schema)."""
    total = 0
    for name, r in model["resources"].items():
        path = join("resources", name)
        total += resource_bytes(r, path, limits, base)
        if total > limits["total"]:
            raise ModelError(path, f"the resources up to this one need {total} bytes; the "
                             f"device holds at most {limits['total']} (its memory heap)")


def resource_bytes(r: dict, path: str, limits: dict, base: Path) -> int:
    """The bytes a resource will take, known before anything is read or allocated."""
    init = r["initialValues"]
    ipath = join(path, "initialValues")
    npy = isinstance(init, dict) and str(init.get("sourcePath", "")).endswith(".npy")
    dtype = np.dtype(np.float32) if npy else data_type(r.get("initialValuesDataType"), path)
    if isinstance(init, list):
        count = len(init)
    elif "sourcePath" in init:
        extra = set(init) - {"sourcePath"}
        if extra:
            raise ModelError(join(ipath, sorted(extra)[0]), "a sourcePath initializer has no "
                             "other fields")
        if is_image(init["sourcePath"]):
            count = image_shape(r, dtype, path, base)[0]
        else:
            count, dtype = file_count(init["sourcePath"], dtype, join(ipath, "sourcePath"),
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
    where = join(ipath, "valueCount") if isinstance(init, dict) and "valueCount" in init \
        else ipath
    if nbytes > limits["resource"]:
        raise ModelError(where, f"{count} values of {dtype} need {nbytes} bytes; the device "
                         f"allows at most {limits['resource']} in one resource")
    size = r.get("sizeInBytes", nbytes)
    if size < nbytes:
        raise ModelError(join(path, "sizeInBytes"), f"sizeInBytes {size} is smaller than "
                         f"its initial values ({nbytes} bytes)")
    return round_up(size, 4)


def file_count(source: str, dtype: np.dtype, path: str, base: Path):
    """(element count, dtype) of a ``sourcePath`` file, from its size or ``.npy`` header."""
    file = source_file(source, path, base)
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


def is_image(source: str) -> bool:
    return Path(source).suffix.lower() in IMAGE_SUFFIXES


def pillow(where: str):
    try:
        from PIL import Image
    except ImportError:
        raise ModelError(where, "image files need Pillow (pip install 'vkml[bench]')") \
            from None
    return Image


def image_shape(r: dict, dtype: np.dtype, path: str, base: Path):
    """(element count, (C, H, W), file) of an image resource, checked before decoding:
    the header is read, not the pixels."""
    spath = join(join(path, "initialValues"), "sourcePath")
    file = source_file(r["initialValues"]["sourcePath"], spath, base)
    if "resampleSize" not in r:
        raise ModelError(join(path, "resampleSize"), "is required for an image sourcePath "
                         "(DxDispatch reads it as [N, C, H, W])")
    n, c, h, w = r["resampleSize"]
    rpath = join(path, "resampleSize")
    if n != 1:
        raise ModelError(join(rpath, 0), f"N must be 1, got {n}")
    if c not in (3, 4):
        raise ModelError(join(rpath, 1), f"C must be 3 (RGB) or 4 (RGBA), got {c}")
    if dtype not in (np.float32, np.float16):
        raise ModelError(join(path, "initialValuesDataType"), "an image is read as FLOAT32 "
                         f"or FLOAT16, not {dtype}")
    Image = pillow(spath)
    try:
        with Image.open(file) as im:
            if im.format not in ("PNG", "JPEG"):
                raise ValueError(f"a {im.format} image, not PNG or JPEG")
    except Exception as exc:  # noqa: BLE001  (any unreadable image)
        raise ModelError(spath, f"{file.name} is not a readable image ({exc})") from None
    return c * h * w, (c, h, w), file


def image_values(r: dict, dtype: np.dtype, path: str, base: Path) -> np.ndarray:
    """The image as DxDispatch lays it out (see the comment above)."""
    _, (c, h, w), file = image_shape(r, dtype, path, base)
    spath = join(join(path, "initialValues"), "sourcePath")
    Image = pillow(spath)
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


def source_file(source: str, path: str, base: Path) -> Path:
    for cand in (base / source, Path.cwd() / source):
        if cand.is_file():
            return cand
    raise ModelError(path, f"sourcePath {source!r} not found next to the model or in the "
                           "current folder")


# -- resources ------------------------------------------------------------------------
@dataclasses.dataclass
class Resource:
    name: str
    dtype: np.dtype
    values: np.ndarray          # the initial values (what print/writeFile show)
    nbytes: int                 # buffer size (>= values.nbytes, a multiple of 4)
    tensor: object = None


def data_type(value, where: str) -> np.dtype:
    path = join(where, "initialValuesDataType")
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
            raise ModelError(join(path, i) if len(vals) > 1 else path,
                             f"{v!r} is not an integer of type {dtype}")
        if not info.min <= int(v) <= info.max:
            raise ModelError(join(path, i) if len(vals) > 1 else path,
                             f"{v!r} does not fit {dtype} ({info.min}..{info.max})")
    return np.array([int(v) for v in vals], dtype=dtype)


def _sequence(start, delta, count: int, dtype: np.dtype, path: str) -> np.ndarray:
    """``start + delta * i`` for ``i < count``, made by NumPy (never a Python list)."""
    if dtype.kind == "f":
        return (float(start) + float(delta) * np.arange(count, dtype=np.float64)).astype(dtype)
    for key, v in (("valueStart", start), ("valueDelta", delta)):
        _typed([v], np.dtype(np.int64) if key == "valueDelta" else dtype, join(path, key))
    last = int(start) + int(delta) * (count - 1)
    _typed([last], dtype, join(path, "valueCount"))    # the last value fits the type
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
    if "sourcePath" in init and is_image(init["sourcePath"]):
        return image_values(r, dtype, path.rsplit(".initialValues", 1)[0], base)
    if "sourcePath" in init:
        spath = join(path, "sourcePath")
        file = source_file(init["sourcePath"], spath, base)
        try:
            if file.suffix == ".npy":
                return np.load(file, allow_pickle=False).reshape(-1)
            return np.fromfile(file, dtype=dtype)
        except (ValueError, OSError, EOFError) as exc:
            raise ModelError(spath, f"{file.name} cannot be read ({exc})") from None
    count = init["valueCount"]
    if "value" in init:
        return np.full(count, _typed([init["value"]], dtype, join(path, "value"))[0],
                       dtype=dtype)
    return _sequence(init["valueStart"], init["valueDelta"], count, dtype, path)


def parse_resources(model: dict, base: Path) -> dict[str, Resource]:
    out = {}
    for name, r in model["resources"].items():
        where = join("resources", name)
        src = r["initialValues"]
        npy = isinstance(src, dict) and str(src.get("sourcePath", "")).endswith(".npy")
        dtype = np.dtype(np.float32) if npy else data_type(r.get("initialValuesDataType"),
                                                            where)
        values = _values(src, dtype, join(where, "initialValues"), base, r)
        size = r.get("sizeInBytes", values.nbytes)
        out[name] = Resource(name, values.dtype, values, round_up(size, 4))
    return out


# -- writeFile ----------------------------------------------------------------------------
def check_write(cmd: dict, r: Resource, where: str) -> None:
    """A writeFile command's ``dimensions`` and image format against its resource."""
    suffix = Path(cmd["targetPath"]).suffix.lower()
    dims = cmd.get("dimensions")
    if dims is not None:
        count = 1
        for s in dims:
            count *= s
        if count * r.dtype.itemsize > r.nbytes:
            raise ModelError(join(where, "dimensions"), f"{dims} is {count} elements; "
                             f"resource '{r.name}' holds {r.nbytes // r.dtype.itemsize}")
    if suffix in IMAGE_SUFFIXES:
        if r.dtype not in (np.float32, np.float16):
            raise ModelError(join(where, "targetPath"), "an image is written from FLOAT32 "
                             f"or FLOAT16 resources, not {r.dtype}")
        channels = dims[1] if dims and len(dims) > 1 else 1
        if channels not in (1, 3, 4):
            raise ModelError(join(where, "dimensions"), f"an image has 1, 3 or 4 channels "
                             f"(dimensions [N, C, H, W]), got C = {channels}")


def write_image(path: Path, raw: np.ndarray, r: Resource, dims, where: str) -> None:
    """``raw`` (the resource's bytes) as an 8-bit image of ``dims`` (NCHW)."""
    Image = pillow(where)
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

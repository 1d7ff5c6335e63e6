"""SPIR-V modules and compute pipelines, created lazily and cached.

In process, pipelines are cached by (kernel variant, specialization constants).  Across
processes a ``VkPipelineCache`` is kept on disk, one file per device and driver version
(vendor, device, driver version, ``pipelineCacheUUID``), in the cache folder
(:func:`~vkml.runtime.cache.cache_dir`; ``VKML_CACHE_DIR=off`` disables it).

The file is input, not trusted: its header (Vulkan's ``VkPipelineCacheHeaderVersionOne``:
length, version, vendorID, deviceID, pipelineCacheUUID) must name this device before the
driver sees it, and a file over :data:`~vkml.runtime.cache.MAX_BYTES` is ignored.  A
manifest next to it (``pipelines-<same name>.json``) lists the pipelines the blob holds,
bound to the blob by its SHA-256; the blob is written back only when this process created
a pipeline the manifest does not list.  SwiftShader returns the data it was created with
plus a header of its own, so a cache saved by every process would grow by 32 bytes per
process forever.

Neither lavapipe nor SwiftShader keeps anything in that blob (32-byte headers), so each
process compiles every pipeline it uses (lavapipe's LLVM code, made at a pipeline's first
dispatch, is kept by Mesa's own disk cache, keyed by the NIR; the SPIR-V-to-NIR work of
each creation is not, hence :func:`~vkml.runtime.spirv.prune`, whose results are kept in
the cache folder's ``modules``, :func:`read_module`, so that a later process skips its
Python).  Compilation therefore
runs on a small pool of threads (one per CPU; ``VKML_PIPELINE_THREADS`` sets the count, 0
compiles on the calling thread): cffi releases the GIL inside ``vkCreateComputePipelines``,
which is thread safe per device, and a ``VkPipelineCache`` created without the
EXTERNALLY_SYNCHRONIZED flag is internally synchronised (Vulkan spec,
``vkCreatePipelineCache``).  Outside a
:meth:`PipelineCache.batch` a request waits for its pipeline, as if created inline; inside
one (an operator's or a whole graph's construction) it returns at once and the batch
waits for all on leaving, so a graph's pipelines compile while it is still being planned
and a failed creation still raises from the call that built the operator.

A graph's first pipeline is asked for only after its model is loaded, lowered and
planned, and some (pooling's) only at its first run, so a warm process would leave both
compile threads idle for that long.  A :class:`Recording` therefore lists the kernel
variants a piece of work (``vkml.onnx.prepare`` of one model and its first run) asked for,
and saves the list in ``prefetch-<same name>.json`` under a caller's key; the next process
doing that work starts compiling the listed pipelines before anything asks for them
(:meth:`PipelineCache.replay`).  The list is a hint: a variant the manifest no longer has
is skipped, and one nothing asks for only costs its compile.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import struct
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import resources

from ..errors import DeviceError
from . import cache, spirv, vk
from .cache import cache_dir
from .vk import ffi, lib

#: Descriptor kinds a kernel binding may have.
STORAGE = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
UNIFORM = vk.VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER
UNIFORM_TEXEL = vk.VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER
STORAGE_TEXEL = vk.VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER
#: The manifest's binding kinds (tools/build_shaders.py) as descriptor kinds.
KINDS = {"storage_buffer": STORAGE, "uniform_buffer": UNIFORM,
         "uniform_texel_buffer": UNIFORM_TEXEL, "storage_texel_buffer": STORAGE_TEXEL}
#: VK_PIPELINE_CACHE_HEADER_VERSION_ONE and its header's length (4 uint32 + a 16-byte UUID).
HEADER_VERSION_ONE = 1
HEADER_BYTES = 32
#: Version of the manifest's JSON layout.
MANIFEST_VERSION = 1
#: Version of the prefetch lists' JSON layout; the most work keys a file keeps (the least
#: recently saved go first) and the most pipelines a list names.
PREFETCH_VERSION = 1
PREFETCH_KEYS = 32
PREFETCH_PIPELINES = 256
#: The most frozen modules the module cache keeps (:func:`write_module`), and the
#: largest it reads (the shipped modules are 2-130 KB).
MODULES_KEPT = 1024
MODULE_BYTES = 4 << 20


#: VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT (the Python binding's
#: constant is None in some releases).
REQUIRE_FULL_SUBGROUPS = (getattr(vk, "VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT",
                                  None) or 0x2)


def valid_blob(data: bytes, info) -> bool:
    """Whether ``data`` starts with a pipeline cache header for this device (Vulkan spec,
    "Pipeline Cache Header": little-endian headerSize >= 32 and within the data,
    headerVersion ONE, vendorID, deviceID and pipelineCacheUUID of the device)."""
    if len(data) < HEADER_BYTES:
        return False
    size, version, vendor, device = struct.unpack_from("<IIII", data)
    return (HEADER_BYTES <= size <= len(data) and version == HEADER_VERSION_ONE
            and vendor == info.vendor_id and device == info.device_id
            and data[16:32].hex() == info.pipeline_cache_uuid)


def cache_files(info, folder=None) -> tuple:
    """The pipeline cache blob and its manifest for device ``info`` in ``folder`` (by
    default the cache folder; None, None when the disk cache is off)."""
    folder = cache_dir() if folder is None else folder
    if folder is None:
        return None, None
    stem = (f"{info.vendor_id:04x}-{info.device_id:04x}-{info.driver_version:08x}-"
            f"{info.pipeline_cache_uuid}")
    return folder / f"{stem}.bin", folder / f"pipelines-{stem}.json"


def prefetch_file(info, folder=None):
    """The prefetch lists' file for device ``info`` in ``folder`` (by default the cache
    folder; None when the disk cache is off): named as its pipeline cache."""
    blob, _ = cache_files(info, folder)
    return None if blob is None else blob.with_name(f"prefetch-{blob.stem}.json")


def _valid_recipe(r) -> bool:
    """A prefetch list's entry: [kernel variant, {constant name: int, float or bool},
    subgroup size] (the arguments of :meth:`PipelineCache.variant`)."""
    return (isinstance(r, list) and len(r) == 3 and isinstance(r[0], str)
            and isinstance(r[1], dict)
            and all(isinstance(k, str) and (isinstance(v, bool) or cache.is_number(v))
                    for k, v in r[1].items())
            and cache.is_int(r[2]) and 0 <= r[2] <= 1024)


def _valid_prefetch(data: dict) -> bool:
    """``{"version", "lists": [[key, [recipe, ...]], ...]}``, the least recently saved
    first (a list: JSON objects are written with sorted keys)."""
    lists = data["lists"]
    return (set(data) == {"version", "lists"} and isinstance(lists, list)
            and len(lists) <= PREFETCH_KEYS
            and all(isinstance(e, list) and len(e) == 2 and isinstance(e[0], str)
                    and isinstance(e[1], list) and len(e[1]) <= PREFETCH_PIPELINES
                    and all(_valid_recipe(r) for r in e[1]) for e in lists))


def _within_limits(consts: dict, subgroup_size: int, limits: dict) -> bool:
    """Whether a prefetch entry's workgroup is one the device takes (each
    ``LOCAL_SIZE_*`` within ``maxComputeWorkGroupSize``, their product within
    ``maxComputeWorkGroupInvocations``) and its subgroup size one it may require (a
    power of two within ``minSubgroupSize..maxSubgroupSize`` dividing the x size): a
    corrupt entry must not reach the driver as an invalid pipeline."""
    size = [consts.get(f"LOCAL_SIZE_{a}", 1) for a in "XYZ"]
    if not all(cache.is_int(n) and 1 <= n <= m
               for n, m in zip(size, limits["maxComputeWorkGroupSize"])):
        return False
    if size[0] * size[1] * size[2] > limits["maxComputeWorkGroupInvocations"]:
        return False
    return not subgroup_size or (
        subgroup_size & (subgroup_size - 1) == 0 and size[0] % subgroup_size == 0
        and limits["minSubgroupSize"] <= subgroup_size <= limits["maxSubgroupSize"])


def _read_prefetch(path) -> dict:
    """The prefetch file's lists by key, in the file's order ({} where there is none)."""
    found = None if path is None else cache.read_json(path, PREFETCH_VERSION, _valid_prefetch)
    return {k: v for k, v in found["lists"]} if found else {}


def module_key(spirv_sha256: bytes, aliased: bool, consts: tuple) -> str:
    """The module cache's name of a frozen module: the shipped SPIR-V's SHA-256, whether
    it was aliased (a source comment: the same words either way), the frozen ``(id,
    value)`` pairs and :data:`~vkml.runtime.spirv.FREEZE_VERSION`."""
    text = repr((spirv_sha256.hex(), bool(aliased), tuple(consts), spirv.FREEZE_VERSION))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def module_folder(folder=None):
    """The module cache's folder (``modules`` in the cache folder; None when the disk
    cache is off).  Modules are the same on every device: one folder for all."""
    folder = cache_dir() if folder is None else folder
    return None if folder is None else folder / "modules"


def read_module(key: str, folder=None) -> bytes | None:
    """The frozen module saved under ``key``: a file of its SHA-256 and its words, taken
    only where the digest matches and the words start with SPIR-V's magic number (a
    truncated or altered file is input, not trusted: it is made again and rewritten)."""
    where = module_folder(folder)
    data = None if where is None else cache.read_bytes(where / f"{key}.spv", MODULE_BYTES)
    if data is None or len(data) < 52 or len(data) % 4:
        return None
    body = data[32:]
    if hashlib.sha256(body).digest() != data[:32] \
            or struct.unpack_from("<I", body)[0] != spirv.MAGIC:
        return None
    return body


def write_module(key: str, code: bytes, folder=None) -> None:
    """Save a frozen module under ``key`` (:func:`read_module`'s format), leaving at most
    :data:`MODULES_KEPT` files: the least recently written go first (a folder shared
    by every kernel version ever run would grow without bound)."""
    where = module_folder(folder)
    if where is None or not cache.write_bytes(where / f"{key}.spv",
                                              hashlib.sha256(code).digest() + code,
                                              MODULE_BYTES):
        return
    try:
        found = [e for e in os.scandir(where) if e.name.endswith(".spv") and e.is_file()]
        if len(found) > MODULES_KEPT:
            found.sort(key=lambda e: e.stat().st_mtime)
            for e in found[:len(found) - MODULES_KEPT * 3 // 4]:
                os.unlink(e.path)
    except OSError:
        pass                        # (another process removed it first, or no permission)


def _valid_manifest(data: dict) -> bool:
    keys = data["keys"]
    return (set(data) == {"version", "blob_sha256", "keys"}
            and isinstance(data["blob_sha256"], str) and len(data["blob_sha256"]) == 64
            and isinstance(keys, list) and all(isinstance(k, str) and len(k) == 32 for k in keys))


@functools.cache
def _shader_files() -> dict:
    """``vkml/shaders``' files by name, listed once: the folder is a namespace package, and
    its ``importlib.resources`` path lists the folder again on every ``joinpath``."""
    return {f.name: f for f in resources.files("vkml.shaders").iterdir()}


def load_spirv(name: str) -> bytes:
    """The shipped SPIR-V of kernel variant ``name`` (``vkml/shaders/<name>.spv``)."""
    f = _shader_files().get(f"{name}.spv")
    try:
        if f is None:
            raise FileNotFoundError(name)
        return f.read_bytes()
    except FileNotFoundError:
        raise DeviceError(f"no compiled kernel named {name!r}: run tools/build_shaders.py") from None


@functools.cache
def kernel_manifest() -> dict:
    """``vkml/shaders/manifest.json``: every kernel variant's specialization constants,
    bindings and push constants, reflected from its SPIR-V by tools/build_shaders.py."""
    return json.loads(_shader_files()["manifest.json"].read_text())


@functools.cache
def kernels_digest() -> str:
    """A digest of every shipped kernel variant's source (the manifest's ``sha256`` of its
    GLSL, headers and defines): what a measurement of kernels is valid for."""
    h = hashlib.sha256()
    for name, entry in sorted(kernel_manifest().items()):
        h.update(f"{name}={entry.get('sha256', '')};".encode())
    return h.hexdigest()[:16]


def interface(name: str, constants: dict | None = None) -> tuple[tuple, int, dict, tuple]:
    """(binding kinds, push-constant bytes, {constant_id: value}, ids of the constants its
    source freezes into the module: its ``vkml:frozen`` line) of kernel variant ``name``
    with specialization ``constants`` given by name; a variant or constant name the
    manifest does not list raises ValueError naming what it does list."""
    manifest = kernel_manifest()
    entry = manifest.get(name)
    if entry is None:
        family = sorted(v for v in manifest if v.split("_")[0] == name.split("_")[0])
        raise ValueError(f"no kernel variant named {name!r} in vkml/shaders/manifest.json"
                         + (f" (variants of that family: {', '.join(family)})" if family else ""))
    declared = entry["constants"]
    ids = {}
    frozen = tuple(declared[n]["id"] for n in entry["frozen"])
    for cname, value in (constants or {}).items():
        c = declared.get(cname)
        if c is None:
            raise ValueError(f"kernel variant {name!r} has no specialization constant "
                             f"{cname!r}; it declares {', '.join(declared)}")
        ids[c["id"]] = float(value) if c["type"] == "float" else int(value)
    bindings = entry["bindings"]
    assert [(b["set"], b["binding"]) for b in bindings] == [(0, i) for i in range(len(bindings))], \
        f"{name}: bindings must be set 0, 0..n-1"
    return (tuple(KINDS[b["kind"]] for b in bindings), entry["push_constants"]["size"], ids,
            frozen)


def compile_threads() -> int:
    """Threads that compile pipelines: ``VKML_PIPELINE_THREADS``, else one per CPU this
    process may run on (0: compile on the calling thread)."""
    given = os.environ.get("VKML_PIPELINE_THREADS", "").strip()
    if given:
        return max(0, int(given))
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # (not on every platform)
        return os.cpu_count() or 1


_pool_lock = threading.Lock()
_pool: tuple | None = None          # (process id, executor): threads do not survive fork


def _executor() -> ThreadPoolExecutor | None:
    """The process's compile threads (None where :func:`compile_threads` is 0)."""
    global _pool
    threads = compile_threads()
    if not threads:
        return None
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(threads, "vkml-pipelines"))
        return _pool[1]


class Pipeline:
    """A compute pipeline: its layouts and interface at once, its ``handle`` once
    compiled (reading it waits, and raises the creation's :class:`DeviceError`)."""

    __slots__ = ("layout", "set_layout", "kinds", "push_size", "name", "future", "_handle",
                 "reported", "dispatched")

    def __init__(self, layout, set_layout, kinds: tuple, push_size: int, name: str):
        self.layout = layout
        self.set_layout = set_layout
        self.kinds = kinds                # descriptor kind of each binding, in binding order
        self.push_size = push_size
        self.name = name
        self.future: Future = Future()    # (before the pipeline is cached: others wait on it)
        self._handle = None               # set by the compiling thread inside its entry
        self.reported = False             # a failed creation already raised to a reader
        #: whether a submission dispatching it completed on this device (a driver may
        #: compile at the first dispatch: the scheduler's wait allows for that once)
        self.dispatched = False

    @property
    def handle(self):
        h = self._handle
        return h if h is not None else self.wait()

    def wait(self):
        """The handle, once created; raises the creation's error."""
        try:
            return self.future.result()
        except BaseException:
            self.reported = True
            raise

    def settle(self) -> None:
        """Wait for the creation; raise its error unless a reader already saw it (the
        tuner declines a candidate whose pipeline failed, and goes on)."""
        if not self.reported:
            self.wait()


class Recording:
    """The kernel variants asked for on a device (:meth:`PipelineCache.variant`, on any
    thread outside :meth:`PipelineCache.unrecorded`) from its start until :meth:`save`
    or :meth:`stop`, in order of first request, to save under ``key`` in the prefetch
    file (module doc)."""

    def __init__(self, cache: "PipelineCache", key: str, before: list):
        self.cache = cache
        self.key = key
        self.before = before            # the list this key had (written only if it changed)
        self.recipes: dict = {}
        self.stopped = False

    def add(self, name: str, constants, subgroup_size: int) -> None:
        consts = dict(constants or {})
        rkey = (name, tuple(sorted(consts.items())), subgroup_size)
        if rkey not in self.recipes and len(self.recipes) < PREFETCH_PIPELINES:
            self.recipes[rkey] = [name, consts, subgroup_size]

    def stop(self) -> None:
        """Record no more (a failed preparation: nothing is saved)."""
        if not self.stopped:
            self.stopped = True
            with self.cache.lock:
                self.cache.recordings.discard(self)

    def save(self) -> None:
        """Stop and write the list under the key, where it differs from the saved one."""
        if self.stopped:
            return
        self.stop()
        path = self.cache.prefetch_path
        got = list(self.recipes.values())
        if path is None or not got or got == self.before:
            return
        lists = _read_prefetch(path)
        lists.pop(self.key, None)
        while len(lists) >= PREFETCH_KEYS:          # (the least recently saved first)
            del lists[next(iter(lists))]
        lists[self.key] = got
        cache.write_json(path, PREFETCH_VERSION, {"lists": [[k, v] for k, v in lists.items()]})


class PipelineCache:
    """Modules, layouts and pipelines of one device, plus the on-disk pipeline cache."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.device = ctx.device
        # (re-entrant: with no compile threads, the creation runs under get's hold)
        self.lock = threading.RLock()
        self.modules: dict[str, object] = {}
        self.layouts: dict[tuple, tuple] = {}
        self.pipelines: dict[tuple, Pipeline] = {}
        info = ctx.info
        self.path, self.manifest = cache_files(info)
        initial = self._read_disk(info)
        #: Keys (see :meth:`_key`) of the pipelines the loaded blob holds, and of those
        #: created by this process.
        self.known = self._read_keys(initial)
        self.made: set[str] = set()
        self._spirv_hash: dict[str, bytes] = {}
        result, self.handle = self._new_handle(initial)
        if result < 0 and initial:
            # The spec has drivers validate the data they are given, yet some fail the call
            # on a blob they cannot use (NVIDIA: VK_ERROR_UNKNOWN) instead of ignoring it:
            # the saved blob is worth nothing then, and an empty cache replaces it.
            self.known = set()
            result, self.handle = self._new_handle(b"")
        vk.check(result, "vkCreatePipelineCache")
        self.created = 0
        self._local = threading.local()     # .pending: this thread's open batch
        #: Pipelines whose creation was submitted and has not finished.
        self.inflight: set[Pipeline] = set()
        #: Open :class:`Recording` s (held weakly: one whose owner is dropped unsaved
        #: records no more), and the file they save to.
        self.recordings: weakref.WeakSet = weakref.WeakSet()
        self.prefetch_path = prefetch_file(info)

    def _new_handle(self, initial: bytes):
        """``vkCreatePipelineCache`` over ``initial``: (its VkResult, the handle)."""
        data = ffi.new("char[]", initial) if initial else vk.NULL
        create = ffi.new("VkPipelineCacheCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO,
            "initialDataSize": len(initial), "pInitialData": data})
        handle = ffi.new("VkPipelineCache*")
        return lib.vkCreatePipelineCache(self.device, create, vk.NULL, handle), handle[0]

    def _read_disk(self, info) -> bytes:
        """The saved blob if it is one for this exact device (:func:`valid_blob`)."""
        if self.path is None:
            return b""
        data = cache.read_bytes(self.path)
        return data if data is not None and valid_blob(data, info) else b""

    def _read_keys(self, blob: bytes) -> set[str]:
        """The manifest's keys, if it describes ``blob``; else none are known."""
        if not blob:
            return set()
        found = cache.read_json(self.manifest, MANIFEST_VERSION, _valid_manifest)
        if found is None or found["blob_sha256"] != hashlib.sha256(blob).hexdigest():
            return set()
        return set(found["keys"])

    def _key(self, name, kinds, push_size, consts) -> str:
        """What makes a pipeline: its SPIR-V, bindings, push constants, constants, the
        device features in use (they change the layouts and the compiled code) and how
        constants are frozen (:data:`vkml.runtime.spirv.FREEZE_VERSION`)."""
        text = repr((self._spirv_hash[name].hex(), kinds, push_size, consts,
                     spirv.FREEZE_VERSION,
                     self.ctx.push_descriptor is not None,
                     sorted(k for k, v in self.ctx.features.items() if v)))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def save(self) -> None:
        """Write the blob and its manifest, only if this process created pipelines the
        saved blob lacks (see the module doc)."""
        if self.path is None or self.made <= self.known:
            return
        size = ffi.new("size_t*")
        if lib.vkGetPipelineCacheData(self.device, self.handle, size, vk.NULL) < 0 or not size[0]:
            return
        if size[0] > cache.MAX_BYTES:
            return
        buf = ffi.new("char[]", size[0])
        if lib.vkGetPipelineCacheData(self.device, self.handle, size, buf) != vk.VK_SUCCESS:
            return
        blob = ffi.buffer(buf, size[0])[:]
        if not valid_blob(blob, self.ctx.info):
            return
        keys = sorted(self.known | self.made)
        if cache.write_bytes(self.path, blob):
            cache.write_json(self.manifest, MANIFEST_VERSION,
                             {"blob_sha256": hashlib.sha256(blob).hexdigest(), "keys": keys})

    def module(self, name: str, consts: tuple = ()):
        """The shader module of variant ``name``, its bindings ``Aliased`` where its source
        says ``vkml:aliased`` (:func:`vkml.runtime.spirv.alias`); with ``consts`` ((id,
        value) pairs), one with those specialization constants frozen into plain constants
        (:func:`vkml.runtime.spirv.freeze`, then :func:`~vkml.runtime.spirv.prune`)."""
        key = (name, consts) if consts else name
        mod = self.modules.get(key)
        if mod is None:
            code = load_spirv(name)
            self._spirv_hash[name] = hashlib.sha256(code).digest()
            code = self._transformed(name, code, consts)
            words = ffi.new("char[]", code)
            info = ffi.new("VkShaderModuleCreateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                "codeSize": len(code), "pCode": ffi.cast("uint32_t*", words)})
            h = ffi.new("VkShaderModule*")
            vk.check(lib.vkCreateShaderModule(self.device, info, vk.NULL, h), "vkCreateShaderModule")
            mod = self.modules[key] = h[0]
        return mod

    def _transformed(self, name: str, code: bytes, consts: tuple) -> bytes:
        """``code``, variant ``name``'s, aliased where its source says so, with ``consts``
        frozen and the selections on them pruned (lavapipe translates every case of an
        unpruned switch before folding it, :func:`~vkml.runtime.spirv.prune`); a frozen
        one is read from the module cache where an earlier process saved it
        (:func:`read_module`): the passes are Python on the thread that asks for the
        pipeline, tens of ms a model."""
        aliased = bool(kernel_manifest()[name].get("aliased"))
        key = module_key(self._spirv_hash[name], aliased, consts) if consts else None
        found = None if key is None else read_module(key)
        if found is not None:
            return found
        if aliased:
            code = spirv.alias(code)
        if consts:
            code = spirv.prune(spirv.freeze(code, dict(consts)))
            write_module(key, code)
        return code

    def layout(self, kinds: tuple, push_size: int):
        key = (kinds, push_size)
        found = self.layouts.get(key)
        if found is not None:
            return found
        bindings = ffi.new("VkDescriptorSetLayoutBinding[]", [
            {"binding": i, "descriptorType": k, "descriptorCount": 1,
             "stageFlags": vk.VK_SHADER_STAGE_COMPUTE_BIT} for i, k in enumerate(kinds)])
        flags = (vk.VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR
                 if self.ctx.push_descriptor is not None else 0)
        info = ffi.new("VkDescriptorSetLayoutCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, "flags": flags,
            "bindingCount": len(kinds), "pBindings": bindings})
        sl = ffi.new("VkDescriptorSetLayout*")
        vk.check(lib.vkCreateDescriptorSetLayout(self.device, info, vk.NULL, sl),
                 "vkCreateDescriptorSetLayout")
        ranges = ffi.new("VkPushConstantRange*", {
            "stageFlags": vk.VK_SHADER_STAGE_COMPUTE_BIT, "offset": 0, "size": push_size})
        pl_info = ffi.new("VkPipelineLayoutCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
            "setLayoutCount": 1, "pSetLayouts": sl,
            "pushConstantRangeCount": 1 if push_size else 0,
            "pPushConstantRanges": ranges if push_size else vk.NULL})
        pl = ffi.new("VkPipelineLayout*")
        vk.check(lib.vkCreatePipelineLayout(self.device, pl_info, vk.NULL, pl),
                 "vkCreatePipelineLayout")
        found = self.layouts[key] = (sl[0], pl[0])
        return found

    def variant(self, name: str, constants: dict[str, int | float] | None = None, *,
                subgroup_size: int = 0) -> Pipeline:
        """The compute pipeline of kernel variant ``name`` with specialization ``constants``
        by name (``{"MODE": 2}``); bindings and push constants come from the manifest.
        ``subgroup_size``: run it in full subgroups of that size (the device's
        ``full_subgroups`` feature; the workgroup's x size a multiple of it)."""
        kinds, push_size, ids, frozen = interface(name, constants)
        if self.recordings and not getattr(self._local, "unrecorded", False):
            with self.lock:
                for r in self.recordings:
                    r.add(name, constants, subgroup_size)
        return self.get(name, kinds, push_size, ids, subgroup_size=subgroup_size,
                        frozen=frozen)

    def replay(self, key: str) -> Recording:
        """Start compiling the pipelines saved under ``key`` (the module doc), without
        waiting and without raising (an entry the manifest or device no longer takes is
        skipped; a failed creation reaches only a later request), and return a
        :class:`Recording` of this time's requests for that key."""
        before = _read_prefetch(self.prefetch_path).get(key, [])
        with self.unrecorded(), self.prefetching():
            for name, consts, sg in before:
                if not _within_limits(consts, sg, self.ctx.limits):
                    continue
                try:
                    self.variant(name, consts, subgroup_size=sg)
                except (ValueError, DeviceError):
                    continue
        rec = Recording(self, key, before)
        with self.lock:
            self.recordings.add(rec)
        return rec

    @contextlib.contextmanager
    def unrecorded(self):
        """Requests on this thread inside are left out of the open recordings (the
        tuner's candidates: a later process needs only the ones it keeps)."""
        local = self._local
        outer = getattr(local, "unrecorded", False)
        local.unrecorded = True
        try:
            yield
        finally:
            local.unrecorded = outer

    def get(self, name: str, kinds: tuple, push_size: int = 0,
            constants: dict[int, int | float] | None = None, *,
            subgroup_size: int = 0, frozen: tuple = ()) -> Pipeline:
        """The compute pipeline of kernel variant ``name``.

        ``kinds`` gives the descriptor kind of each binding (set 0, bindings 0..n-1);
        ``constants`` maps specialization-constant ids to 32-bit int or float values;
        those whose ids ``frozen`` lists are frozen into the module instead.
        """
        consts = tuple(sorted((constants or {}).items()))
        frozen = tuple(sorted(set(frozen) & {c for c, _ in consts}))
        if subgroup_size and not self.ctx.features.get("full_subgroups"):
            raise DeviceError(f"{name}: this device cannot require full subgroups")
        key = ((name, kinds, push_size, consts) + ((subgroup_size,) if subgroup_size else ())
               + ((("frozen",) + frozen,) if frozen else ()))
        p = self.pipelines.get(key)
        if p is None:
            with self.ctx.lifetime, self.lock:
                p = self.pipelines.get(key)
                if p is None:
                    p = self._start(key, name, kinds, push_size, consts, subgroup_size, frozen)
        pending = getattr(self._local, "pending", None)
        if pending is None:
            p.wait()
        else:
            pending.append(p)
        return p

    @contextlib.contextmanager
    def batch(self):
        """Pipelines asked for inside (on this thread) compile in the background; leaving
        the outermost batch without an exception waits for them all and raises the first
        failed creation (:meth:`Pipeline.settle`)."""
        local = self._local
        if getattr(local, "pending", None) is not None:
            yield
            return
        local.pending = pending = []
        try:
            yield
        finally:
            local.pending = None
        for p in pending:
            p.settle()

    @contextlib.contextmanager
    def prefetching(self):
        """Pipelines asked for inside (on this thread) start compiling at once and belong
        to no batch: nothing waits for them on leaving, and a failed creation reaches only
        whoever uses that pipeline later (the tuner asks for every candidate's pipelines
        before recording the first, and declines one whose creation fails)."""
        local = self._local
        outer = getattr(local, "pending", None)
        local.pending = []
        try:
            yield
        finally:
            local.pending = outer

    def quiesce(self) -> None:
        """Wait until no creation is in flight (errors are left to the pipelines' readers):
        a timed run on a CPU device would otherwise share the CPUs with compilation."""
        for p in list(self.inflight):
            with contextlib.suppress(Exception):
                p.future.result()

    def _start(self, key, name, kinds, push_size, consts, subgroup_size: int = 0,
               frozen: tuple = ()) -> Pipeline:
        """Make the pipeline's layouts and module here (their errors raise from
        :meth:`get`), cache it under ``key`` and submit its creation (:meth:`_compile`)."""
        set_layout, layout = self.layout(kinds, push_size)
        p = Pipeline(layout, set_layout, kinds, push_size, name)
        fixed = tuple((c, v) for c, v in consts if c in frozen)
        consts = tuple((c, v) for c, v in consts if c not in frozen)
        module = self.module(name, fixed)
        self.pipelines[key] = p
        made = self._key(name, kinds, push_size,
                         consts + tuple(("frozen", c, v) for c, v in fixed)
                         + ((("subgroup", subgroup_size),) if subgroup_size else ()))
        args = (p, key, made, module, consts, subgroup_size)
        pool = _executor()
        if pool is not None:
            self.inflight.add(p)            # (before it can finish: _compile discards it)
            try:
                pool.submit(self._settle, *args)
            except RuntimeError:        # (the interpreter is shutting down: no new threads)
                self.inflight.discard(p)
                pool = None
        if pool is None:
            self._settle(*args)
        return p

    def _settle(self, p: Pipeline, *args) -> None:
        """:meth:`_compile` ``p``, its handle or error into ``p.future``."""
        try:
            p.future.set_result(self._compile(p, *args))
        except BaseException as exc:       # noqa: BLE001  (raised to the pipeline's readers)
            p.future.set_exception(exc)

    def _compile(self, p: Pipeline, key, made: str, module, consts, subgroup_size: int):
        """``vkCreateComputePipelines`` of ``p`` (on a compile thread), inside the device's
        entry: ``close`` waits for it, and a creation queued past ``close`` raises.  A
        failed one leaves the cache, so that the next request tries again."""
        try:
            with self.ctx.lifetime:
                handle = self._create(p, module, consts, subgroup_size)
                p._handle = handle          # (inside the entry: destroy sees it)
        except BaseException:
            with self.lock:
                if self.pipelines.get(key) is p:
                    del self.pipelines[key]
            raise
        else:
            with self.lock:
                self.created += 1
                self.made.add(made)
        finally:
            self.inflight.discard(p)
        return handle

    def _create(self, p: Pipeline, module, consts, subgroup_size: int):
        spec = vk.NULL
        if consts:
            entries = ffi.new("VkSpecializationMapEntry[]", [
                {"constantID": cid, "offset": 4 * i, "size": 4} for i, (cid, _) in enumerate(consts)])
            data = b"".join(struct.pack("<f" if isinstance(v, float) else
                                        ("<i" if v < 0 else "<I"), v) for _, v in consts)
            blob = ffi.new("char[]", data)
            spec = ffi.new("VkSpecializationInfo*", {
                "mapEntryCount": len(consts), "pMapEntries": entries,
                "dataSize": len(data), "pData": blob})
        entry = ffi.new("char[]", b"main")
        required, flags = vk.NULL, 0
        if subgroup_size:
            required = ffi.new("VkPipelineShaderStageRequiredSubgroupSizeCreateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO,
                "requiredSubgroupSize": subgroup_size})
            flags = REQUIRE_FULL_SUBGROUPS
        info = ffi.new("VkComputePipelineCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
            "stage": {"sType": vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                      "pNext": required, "flags": flags,
                      "stage": vk.VK_SHADER_STAGE_COMPUTE_BIT,
                      "module": module, "pName": entry, "pSpecializationInfo": spec},
            "layout": p.layout})
        h = ffi.new("VkPipeline*")
        vk.check(lib.vkCreateComputePipelines(self.device, self.handle, 1, info, vk.NULL, h),
                 f"vkCreateComputePipelines({p.name})")
        return h[0]

    def destroy(self) -> None:
        """Destroy everything (after the device's ``close``: no creation runs any more, and
        one still queued raises ``DeviceError`` on entering, for its readers)."""
        self.save()
        with self.lock:                     # (a queued creation failing now leaves the dict)
            made = list(self.pipelines.values())
        for p in made:
            if p._handle is not None:
                lib.vkDestroyPipeline(self.device, p._handle, vk.NULL)
        for sl, pl in self.layouts.values():
            lib.vkDestroyPipelineLayout(self.device, pl, vk.NULL)
            lib.vkDestroyDescriptorSetLayout(self.device, sl, vk.NULL)
        for m in self.modules.values():
            lib.vkDestroyShaderModule(self.device, m, vk.NULL)
        lib.vkDestroyPipelineCache(self.device, self.handle, vk.NULL)
        self.pipelines.clear()
        self.layouts.clear()
        self.modules.clear()

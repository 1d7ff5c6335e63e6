"""The peers of ``python -m bench models``: each ``prepare(spec, onnx_bytes, size)``
returns a function running the model once on a NumPy input (NumPy out), or raises
:class:`~bench.runners.Absent` with the reason; each is checked against ONNX Runtime
CPU in the same run."""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from ..runners import Absent, require


#: Threads of the CPU peers (ONNX Runtime's intra-op pool, torch.set_num_threads); 0:
#: their defaults.  On a loaded machine their default pools spin against each other and
#: the CPU drivers' threads (``--cpu-threads``).
CPU_THREADS = [0]


def _root() -> str:
    """The repository root (the workers run there, as ``python -m bench.cnn.<worker>``)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Peer:
    name = ""
    on_device = False          # a Vulkan peer: runs once per device

    def version(self) -> str:
        raise NotImplementedError

    def prepare(self, spec, data: bytes, size: int, device=None):
        raise NotImplementedError


def _iree_driver_devices(rt) -> list:
    try:
        return rt.get_driver("vulkan").query_available_devices()
    except Exception as exc:                 # noqa: BLE001
        raise Absent(f"IREE's vulkan driver: {type(exc).__name__}: {exc}") from None


class ChildPeer(Peer):
    """A peer measured in a child process (``python -m <worker>``) under a time limit:
    a call into its runtime cannot be interrupted, and its kernels can run for many
    minutes on a CPU driver.  The worker writes its figures and output to files."""
    worker = ""
    #: arguments before the worker's files (the in-tree peers' worker takes the peer's name)
    worker_args: tuple = ()
    timeout_s = 300.0

    def python(self) -> str:
        import sys
        return sys.executable

    def env(self, device) -> dict | None:
        """The worker's environment (None: this process's)."""
        return None

    def extra_args(self, spec) -> list:
        """Arguments after the worker's usual ones (none)."""
        return []

    def measure(self, spec, data, size, device, x, budget) -> tuple:
        """(figures, output) from the worker, or Absent with why."""
        import json
        import subprocess

        folder = tempfile.mkdtemp(prefix=f"vkml-{self.name}-")
        paths = [os.path.join(folder, n) for n in ("m.onnx", "x.npy", "y.npy", "fig.json")]
        with open(paths[0], "wb") as f:
            f.write(data)
        np.save(paths[1], x)
        cmd = [self.python(), "-m", self.worker, *self.worker_args, *paths,
               device.info.name, str(budget.seconds), str(budget.repeats or 0),
               *self.extra_args(spec)]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, cwd=_root(),
                                 timeout=self.timeout_s, env=self.env(device))
            ended = _ending(res.returncode)
        except subprocess.TimeoutExpired:
            res, ended = None, (f"no result within {self.timeout_s:.0f} s (prepare + first "
                                f"run + hot runs) on {device.info.name}")
        if not os.path.exists(paths[3]):
            raise Absent(ended if res is None else
                         f"{self.name} failed ({ended}): {res.stderr.strip()[-300:]}")
        with open(paths[3]) as f:
            fig = json.load(f)
        if "absent" in fig:
            first = {k: fig[k] for k in ("prepare_s", "first_s") if k in fig}
            if res is None and "run_since" in fig:      # stopped during a marked run
                first["run_over_s"] = time.time() - fig["run_since"]
                ended += (f"; a run after the first unfinished after "
                          f"{first['run_over_s']:.1f} s")
            exc = Absent(fig["absent"] + (f" ({ended})" if ended else ""))
            if "first_s" in fig:          # it died after its first run (worker_io.partial)
                exc.first = (first, np.load(paths[2]))
            raise exc
        return fig, np.load(paths[2])


def _installed(dist: str) -> str:
    """The version of the installed distribution ``dist``, read from its metadata (the
    package itself is not imported), or :class:`Absent` naming what to install."""
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        raise Absent(f"{dist} is not installed; pip install {dist} (or every peer: pip "
                     f"install 'vkml[bench]')") from None


class CpuChildPeer(ChildPeer):
    """A CPU peer, measured in ``bench.cnn.peer_worker``'s child process like the Vulkan
    ones: its thread pool (ONNX Runtime's, PyTorch's OpenMP) spins on the cores the CPU
    drivers' threads run on, so in the bench's process it slowed vkml's tuning and runs
    and made one process's choices differ from the next (bench/RESULTS.md, "Whole
    models").  The worker also gets the model's name (the PyTorch peer rebuilds the
    definition) and :data:`CPU_THREADS`."""
    worker = "bench.cnn.peer_worker"

    def extra_args(self, spec) -> list:
        return [spec.name if spec is not None else "-", str(CPU_THREADS[0])]


class OrtCpu(CpuChildPeer):
    """ONNX Runtime's CPU provider on the exported model: the correctness reference (its
    output comes back from the child process)."""
    name = "onnxruntime-cpu"
    worker_args = (name,)

    def version(self):
        return _installed("onnxruntime")

    def prepare(self, spec, data, size, device=None):
        ort = require("onnxruntime", "onnxruntime")
        so = ort.SessionOptions()
        if CPU_THREADS[0]:
            so.intra_op_num_threads = CPU_THREADS[0]
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        return lambda x: sess.run(None, {name: x})[0]


class TorchCpu(CpuChildPeer):
    """PyTorch (eager, CPU) on the same definition, rebuilt with the same seed, so the
    same weights as the exported model."""
    name = "torch-cpu"
    worker_args = (name,)

    def version(self):
        return _installed("torch")

    def prepare(self, spec, data, size, device=None):
        torch = require("torch")
        from .models import SEED

        if spec is None:
            raise Absent("PyTorch CPU rebuilds the model from its definition, found by name "
                         "(bench.cnn.models.by_name): this model is not in the set")
        if CPU_THREADS[0]:
            torch.set_num_threads(CPU_THREADS[0])
        torch.manual_seed(SEED)
        try:
            model = spec.build(size)
        except Exception as exc:             # noqa: BLE001 (a definition that needs more)
            raise Absent(f"building {spec.name}: {type(exc).__name__}: {exc}") from None

        def run(x):
            with torch.inference_mode():
                y = model(torch.from_numpy(x))
            return (y[0] if isinstance(y, (tuple, list)) else y).numpy()
        run.model = model
        return run


class TorchGpu(TorchCpu):
    """PyTorch (eager) on the GPU PyTorch sees (CUDA, so cuDNN; or ROCm, so MIOpen): the
    same rebuilt definition, ``cudnn.benchmark`` on (PyTorch's own kernel choice by
    measurement, as vkml's tuner), TF32 off (float32 arithmetic, as vkml's: cuDNN's
    default TF32 convolutions are 1e-3 off), each run from the NumPy input to the NumPy
    output (the upload and read-back inside the time, as vkml's).  Absent without such a GPU; on a
    machine without NVIDIA's or AMD's tools it is not even started."""
    name = "torch-gpu"
    worker_args = (name,)

    def version(self):
        import shutil

        if not (shutil.which("nvidia-smi") or shutil.which("rocm-smi")):
            raise Absent("no GPU PyTorch can use (neither nvidia-smi nor rocm-smi found)")
        return _installed("torch")

    def prepare(self, spec, data, size, device=None):
        torch = require("torch")
        if not torch.cuda.is_available():
            raise Absent(f"PyTorch {torch.__version__} sees no GPU (a CUDA or ROCm build "
                         "and a GPU are needed)")
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        run_cpu = super().prepare(spec, data, size, device)
        model = run_cpu.model.to("cuda")

        def run(x):
            with torch.inference_mode():
                y = model(torch.from_numpy(x).to("cuda"))
            return (y[0] if isinstance(y, (tuple, list)) else y).cpu().numpy()
        return run


def _ending(returncode: int) -> str:
    """How a worker ended, in words ("" when it exited 0)."""
    import signal

    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}" if returncode else ""


class IreeVulkan(ChildPeer):
    """IREE: the ONNX model imported (``iree.compiler.tools.import_onnx``), compiled for
    ``--iree-hal-target-device=vulkan`` and run on its ``vulkan`` driver, on the device
    whose name matches vkml's (``bench.cnn.peer_worker``, in a child process)."""
    name = "iree-vulkan"
    on_device = True
    worker = "bench.cnn.peer_worker"
    worker_args = (name,)

    def version(self):
        rt = require("iree.runtime", "iree-base-runtime")
        require("iree.compiler", "iree-base-compiler")
        return getattr(rt, "__version__", None) or "installed"

    def prepare(self, spec, data, size, device=None):
        rt = require("iree.runtime", "iree-base-runtime")
        from iree.compiler import compile_file
        from iree.compiler.tools.import_onnx import __main__ as import_onnx

        folder = tempfile.mkdtemp(prefix="vkml-iree-")
        src, mlir = os.path.join(folder, "m.onnx"), os.path.join(folder, "m.mlir")
        with open(src, "wb") as f:
            f.write(data)
        try:
            import_onnx.main(import_onnx.parse_arguments([src, "-o", mlir]))
            vmfb = compile_file(mlir,
                                extra_args=["--iree-hal-target-device=vulkan",
                                            "--iree-input-type=onnx"])
        except Exception as exc:             # noqa: BLE001
            raise Absent(f"IREE compile: {type(exc).__name__}: {str(exc)[-300:]}") from None
        avail = _iree_driver_devices(rt)
        want = (device.info.name if device is not None else "").lower()
        pick = next((d for d in avail if want and want.split(" ")[0] in d["name"].lower()),
                    None)
        if pick is None:
            raise Absent(f"IREE's vulkan driver does not list {want!r} (it lists "
                         f"{[d['name'] for d in avail]})")
        dev = rt.get_driver("vulkan").create_device(pick["device_id"])
        config = rt.Config(device=dev)
        ctx = rt.SystemContext(config=config)
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
        names = [k for k in ctx.modules.module.vm_module.function_names
                 if not k.startswith("__") and "$async" not in k]
        fn = ctx.modules.module[names[0]]
        return lambda x: _to_host(rt, _first(fn(_aligned(x))))


def _first(y):
    return y[0] if isinstance(y, (tuple, list)) else y


def _to_host(rt, arr) -> np.ndarray:
    """An IREE DeviceArray's data, read through a staging buffer: ``to_host`` imports a
    fresh NumPy array's memory, whose address these drivers refuse (they import only
    4096-byte-aligned host pointers)."""
    if arr._is_mappable():
        return np.array(arr.to_host())
    view, dev = arr._buffer_view, arr._device
    src = view.get_buffer()
    staging = dev.allocator.allocate_buffer(
        memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
        allowed_usage=int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_SCOPED),
        allocation_size=src.byte_length())
    sem = dev.create_semaphore(0)
    dev.queue_copy(src, staging, wait_semaphores=rt.HalFence.create_at(sem, 0),
                   signal_semaphores=rt.HalFence.create_at(sem, 1))
    rt.HalFence.create_at(sem, 1).wait()
    return np.array(staging.map().asarray(view.shape, arr._get_raw_dtype()))


def _aligned(x: np.ndarray) -> np.ndarray:
    """A copy of ``x`` at a 4096-byte-aligned address: IREE imports host memory in
    place on these drivers, which they accept only page-aligned."""
    raw = np.empty(x.nbytes + 4096, np.uint8)
    off = (-raw.ctypes.data) % 4096
    out = raw[off:off + x.nbytes].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


class NcnnVulkan(ChildPeer):
    """ncnn's Vulkan backend on the same device, the model converted from the exported
    ONNX by pnnx (the ``pnnx`` wheel's converter; ``fp16=0``), with float16 storage and
    arithmetic off (float32 like the others); ncnn blobs have no batch dimension, so the
    output gets its batch of one back.  Measured in a child process
    (``bench.cnn.peer_worker``): ncnn's own Vulkan device on the same driver in the bench's
    process slowed vkml's tuning and runs there."""
    name = "ncnn-vulkan"
    on_device = True
    worker = "bench.cnn.peer_worker"
    worker_args = (name,)

    def version(self):
        ncnn = require("ncnn")
        require("pnnx")
        return ncnn.__version__

    @staticmethod
    def convert(data: bytes, size: int) -> tuple[str, str]:
        import subprocess

        import pnnx

        folder = tempfile.mkdtemp(prefix="vkml-pnnx-")
        src = os.path.join(folder, "m.onnx")
        with open(src, "wb") as f:
            f.write(data)
        outs = {k: os.path.join(folder, v) for k, v in (
            ("ncnnparam", "m.param"), ("ncnnbin", "m.bin"), ("pnnxparam", "p.param"),
            ("pnnxbin", "p.bin"), ("pnnxpy", "p.py"), ("pnnxonnx", "p.onnx"),
            ("ncnnpy", "n.py"))}
        cmd = [pnnx.EXEC_PATH, src, f"inputshape=[1,3,{size},{size}]", "fp16=0",
               *[f"{k}={v}" for k, v in outs.items()]]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=folder)
        if res.returncode != 0 or not os.path.exists(outs["ncnnparam"]):
            raise Absent(f"pnnx could not convert the model: {res.stderr.strip()[-300:]}")
        return outs["ncnnparam"], outs["ncnnbin"]

    def prepare(self, spec, data, size, device=None):
        ncnn = require("ncnn")
        from ..runners.ncnn_peer import _gpu_index

        param, binary = self.convert(data, size)
        net = ncnn.Net()
        opt = net.opt
        opt.use_vulkan_compute = True
        for flag in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic",
                     "use_bf16_storage"):
            setattr(opt, flag, False)
        net.set_vulkan_device(_gpu_index(ncnn, device.info.name))
        if net.load_param(param) != 0 or net.load_model(binary) != 0:
            raise Absent("ncnn could not load pnnx's conversion")
        on_cpu = sorted({ly.type for ly in net.layers() if not ly.support_vulkan} - {"Input"})
        self.note = f"layers without a Vulkan kernel: {on_cpu}" if on_cpu else ""

        def run(x):
            ex = net.create_extractor()
            ex.input("in0", ncnn.Mat(np.ascontiguousarray(x[0])))
            ret, out = ex.extract("out0")
            if ret != 0:
                raise RuntimeError(f"ncnn extract failed ({ret})")
            y = np.array(out)
            return y.reshape((1,) + y.shape)
        self._net = net                     # kept alive while the row is measured
        return run


#: Words of a Vulkan device's name -> words of its ICD manifest's file name, where they
#: differ (Mesa names lavapipe's manifest lvp_icd.*).
_ICD_WORDS = {"llvmpipe": "lvp"}


def one_icd(device_name: str, icds: str) -> str | None:
    """The one manifest of $VK_ICD_FILENAMES (``icds``) that is ``device_name``'s
    driver, judged by its file name (the first word of the device name, or its
    ``_ICD_WORDS`` alias); None when not exactly one matches."""
    word = device_name.split(" ")[0].lower()
    words = {word, _ICD_WORDS.get(word, word)} - {""}
    hits = [p for p in icds.split(os.pathsep) if p
            and any(w in os.path.basename(p).lower() for w in words)]
    return hits[0] if len(hits) == 1 else None


class VenvPeer(ChildPeer):
    """A peer measured by the peers' own virtualenv ($VKML_WEBGPU_PYTHON, else
    ``.venv-peers/bin/python`` at the repository root): onnxruntime-webgpu installs the
    module name onnxruntime, and the WebGPU peers need none of vkml's packages.  The
    WebGPU runtimes pick their adapter themselves among the Vulkan devices the loader
    lists, so the worker's $VK_ICD_FILENAMES names only the measured device's driver
    where the parent's names several; each worker checks the adapter it got."""
    on_device = True
    package = ""

    def python(self) -> str:
        return os.environ.get("VKML_WEBGPU_PYTHON") or os.path.join(
            _root(), ".venv-peers", "bin", "python")

    def env(self, device) -> dict | None:
        icds = os.environ.get("VK_ICD_FILENAMES", "")
        pick = one_icd(device.info.name, icds) if icds else None
        return dict(os.environ, VK_ICD_FILENAMES=pick) if pick else None

    def version(self):
        import subprocess

        if not os.path.exists(self.python()):
            raise Absent(f"no {self.python()} (the peers' virtualenv: "
                         f"VKML_SETUP_BENCH=1 tools/setup)")
        res = subprocess.run([self.python(), "-c", "import importlib.metadata as m, sys; "
                              "print(' '.join(m.version(p) for p in sys.argv[1:]))",
                              *self.package.split()],
                             capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise Absent(f"{self.package} is not installed in {self.python()} "
                         f"(VKML_SETUP_BENCH=1 tools/setup): {res.stderr.strip()[-200:]}")
        return " ".join(f"{p} {v}" for p, v in zip(self.package.split(), res.stdout.split()))

    def prepare(self, spec, data, size, device=None):
        raise Absent("measured in a child process only")


class OrtWebGpu(VenvPeer):
    """ONNX Runtime's WebGPU provider (the ``onnxruntime-webgpu`` wheel: Dawn on Vulkan)
    (``bench.cnn.webgpu_worker``)."""
    name = "onnxruntime-webgpu"
    worker = "bench.cnn.webgpu_worker"
    package = "onnxruntime-webgpu"


class Wonnx(VenvPeer):
    """wonnx (the ``wonnx`` wheel: wgpu on Vulkan) on the model after ONNX shape
    inference, with each Gemm's transposed constant B stored transposed (what wonnx
    refuses otherwise; ``bench.cnn.wonnx_worker``).  A node it cannot compile makes the
    row absent, naming the node's op type."""
    name = "wonnx-vulkan"
    worker = "bench.cnn.wonnx_worker"
    package = "wonnx onnx"


class TinygradWebGpu(VenvPeer):
    """tinygrad's ONNX runner on its WEBGPU device: Dawn from the ``dawn-python`` wheel,
    Vulkan backend, the model under ``TinyJit`` (``bench.cnn.tinygrad_worker``)."""
    name = "tinygrad-webgpu"
    worker = "bench.cnn.tinygrad_worker"
    package = "tinygrad dawn-python"


PEERS = [OrtCpu(), TorchCpu(), TorchGpu(), IreeVulkan(), NcnnVulkan(), OrtWebGpu(), Wonnx(),
         TinygradWebGpu()]

"""vkml on one Vulkan device, measured three ways.

* **cold**: the first call of the functional form (``vkml.pad(numpy, ...)``): descriptor
  validation, compilation and pipeline creation, upload, compute, download.
* **end to end (hot)**: the same call again: NumPy in, NumPy out.
* **phases**, through the DML layer (create -> compile -> ``record`` into a timed
  sequence): upload of the inputs into device tensors, compute (the recorded sequence
  replayed; GPU time from timestamp queries where the device has them, and wall time of
  submit + wait), and download of the output; the row names the candidate it ran.

An operator vkml does not have yet (``hasattr(vkml, "fold")`` false) is absent.
"""
from __future__ import annotations

import time

import numpy as np

import vkml
from vkml import dml

from .. import operators
from ..stats import sample, sample_paired
from . import Absent, Runner


class VkmlRunner(Runner):
    name = "vkml"
    on_device = True
    #: What the last ``phases`` call's operator ran (:func:`_candidate`; the JSON row's
    #: ``candidate``), None where it has no candidates.
    last_candidate: str | None = None
    #: The last ``phases`` call's compute runs in turns with its reference
    #: (``bench.stats.Pairs``), None without one.
    last_pairs = None

    @classmethod
    def probe(cls) -> str:
        return vkml.__version__

    def check(self, workload) -> None:
        spec = workload.spec
        if not hasattr(vkml, spec.function):
            raise Absent(f"vkml.{spec.function} is not implemented yet")

    def prepare(self, workload, inputs):
        self.check(workload)
        dev, op, p = self.device, workload.op, workload.p
        return lambda: operators.vkml_call(vkml, op, p, inputs, dev)

    def phases(self, workload, inputs, budget, reference=None):
        """Upload, compute (GPU and wall) and download samples, in seconds, and the
        output of the DML-layer path: (dict of sample lists, output array).  With a
        ``reference`` (``bench.limits.Reference``) the compute runs take turns with it
        (``bench.stats.sample_paired``), the turns kept in ``last_pairs``."""
        dev = self.device
        if not hasattr(dml, workload.spec.desc):
            raise Absent(f"vkml.dml.{workload.spec.desc} is not implemented yet")
        desc = operators.dml_desc(dml, workload.op, workload.p, workload.np_dtype)
        compiled = dev.compile_operator(dev.create_operator(desc))
        self.last_candidate = _candidate(compiled)
        ins = [None if a is None else dev.empty(a.shape, a.dtype) for a in inputs]
        shapes = [tuple(s) for s in workload.p.get("out_shapes", [workload.p["out_shape"]])]
        outs = [dev.empty(s, workload.np_dtype, nbytes=d.total_tensor_size_in_bytes)
                for s, d in zip(shapes, desc.outputs())]
        results = [np.empty(s, workload.np_dtype) for s in shapes]
        seq = dev.sequence(timed=True)
        try:
            def upload():
                for t, a in zip(ins, inputs):
                    if t is not None:
                        t.write(a)

            def download():
                for out, result in zip(outs, results):
                    dev.context.read(out.allocation, result)

            up = sample(upload, budget)
            compiled.record(seq, ins, outs)
            gpu, wall = [], []

            def compute():
                t = time.perf_counter()
                seq.run()
                wall.append(time.perf_counter() - t)
                if seq.gpu_time_ns:
                    gpu.append(seq.gpu_time_ns * 1e-9)
                return gpu[-1] if seq.gpu_time_ns else wall[-1]

            self.last_pairs = None
            if reference is None:
                n = len(sample(compute, budget))
            else:
                self.last_pairs = sample_paired(compute, reference, budget)
                n = len(self.last_pairs.work_samples())
            wall, gpu = wall[-n:], gpu[-n:]
            down = sample(download, budget)
            return {"upload": up, "compute_wall": wall, "compute_gpu": gpu,
                    "download": down}, results[0] if len(results) == 1 else results
        finally:
            seq.close()
            compiled.release()
            for tensor in ins + outs:
                if tensor is not None:
                    tensor.free()


def _candidate(compiled) -> str | None:
    """What the compiled operator runs, where it chose among candidates (a convolution's
    tuned candidate, with Winograd's GEMM and store width; the path name of an operator
    whose ``path`` is one, as GEMM's, softmax's, pooling's, reduce's, or its ``taken``
    where that names the tuner's candidate; global pooling's reduction's after its own):
    reported with its times."""
    path = getattr(compiled, "taken", None) or getattr(compiled, "path", None)
    inner = getattr(compiled, "inner", None)      # global pooling as the reduction
    if isinstance(path, str) and inner is not None:
        return f"{path} {_candidate(inner)}"
    if isinstance(path, str):
        return path
    name = getattr(path, "candidate", None)
    if name is None:
        return None
    how = getattr(path, "how", None)
    if how is not None:
        name += f" (gemm {how}{', u64 stores' if getattr(path, 'v8', False) else ''})"
    elif any(d.get("yv8") for d in getattr(path, "dispatches", None) or ()):
        name += " (u64 stores)"
    return name


RUNNERS = [VkmlRunner]

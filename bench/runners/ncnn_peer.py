"""ncnn (PyPI ``ncnn``): its Vulkan backend on the same device as vkml, and its CPU backend.

Each workload is a single-layer net built in memory: a ``.param`` text and a ``.bin`` blob
(Padding, Fold, Unfold, Convolution, ConvolutionDepthWise, Deconvolution, Convolution3D;
the model operators' layers are in ``ncnn_model_ops.py``), fed by one Input layer per
input.
ncnn blobs have no batch dimension, so batch > 1 is absent; so are modes and layers ncnn
lacks (symmetric/wrap padding, LP pooling), and on Vulkan a layer this ncnn build has no
Vulkan kernel for (ncnn would run it on the CPU).  float32 workloads run with ncnn's
float16 storage and arithmetic off (it would otherwise round to float16); float16
workloads with them on.  Timing is end to end: NumPy in, upload, compute, download.
"""
from __future__ import annotations

import contextlib
import os
import struct
import sys

import numpy as np

from .. import model_ops
from . import Absent, Runner, ncnn_model_ops, require

_PAD_TYPE = {"constant": 0, "edge": 1, "reflection": 2}


def _gpu_index(ncnn, name: str) -> int:
    for i in range(ncnn.get_gpu_count()):
        if ncnn.get_gpu_info(i).device_name() == name:
            return i
    seen = [ncnn.get_gpu_info(i).device_name() for i in range(ncnn.get_gpu_count())]
    raise Absent(f"ncnn does not see {name!r} (it sees {seen or 'no Vulkan device'})")


def _layer(workload) -> tuple[str, str, bytes, int]:
    """(layer type, its parameters, weight blob, input rank without the batch)."""
    op, p = workload.op, workload.p
    if p["shape"][0] != 1:
        raise Absent("ncnn blobs have no batch dimension (batch > 1)")
    if op == "pad":
        t = _PAD_TYPE.get(p["mode"])
        if t is None:
            raise Absent(f"ncnn Padding has no {p['mode']} mode")
        rank = len(p["shape"])
        if rank != 4 or p["start"][:1] != (0,) or p["end"][:1] != (0,):
            raise Absent("the ncnn runner pads 4-D NCHW tensors on C, H and W")
        _, c, h, w = zip(p["start"], p["end"])
        params = (f"0={h[0]} 1={h[1]} 2={w[0]} 3={w[1]} 4={t} 5={float(p['value'])} "
                  f"7={c[0]} 8={c[1]}")
        return "Padding", params, b"", 3
    if op in ("fold", "unfold"):
        if len(p["window"]) != 2:
            raise Absent(f"ncnn {op} is 2-D only")
        (kh, kw), (dh, dw), (sh, sw) = p["window"], p["dilations"], p["strides"]
        (pt, pl), (pb, pr) = p["start_padding"], p["end_padding"]
        params = (f"1={kw} 11={kh} 2={dw} 12={dh} 3={sw} 13={sh} 4={pl} 14={pt} 15={pr} "
                  f"16={pb}")
        if op == "fold":
            oh, ow = p["image_shape"][2:]
            return "Fold", params + f" 20={ow} 21={oh}", b"", 2
        return "Unfold", params, b"", 3
    if op == "lp_pooling":
        raise Absent("ncnn has no LP pooling layer")
    return _conv_layer(p)


def _conv_layer(p):
    n = len(p["input"]) - 2
    if p["mode"] == "convolution" or p["activation"] is not None:
        raise Absent("the ncnn runner does cross-correlation without a fused activation")
    if any(p["output_padding"]) and p["direction"] == "forward":
        raise Absent("ncnn Convolution has no output_padding")
    g = p["groups"]
    back = p["direction"] == "backward"
    f = p["filter"]
    cout = p["out_shape"][1]
    k = list(reversed(f[2:]))            # w, h, d
    d = list(reversed(p["dilations"]))
    s = list(reversed(p["strides"]))
    a = list(reversed(p["start_padding"]))
    e = list(reversed(p["end_padding"]))
    if n == 2:
        params = (f"0={cout} 1={k[0]} 11={k[1]} 2={d[0]} 12={d[1]} 3={s[0]} 13={s[1]} "
                  f"4={a[0]} 14={a[1]} 15={e[0]} 16={e[1]}")
    elif n == 3:
        if back or g != 1:
            raise Absent("ncnn has no grouped or transposed 3-D convolution layer")
        params = (f"0={cout} 1={k[0]} 11={k[1]} 21={k[2]} 2={d[0]} 12={d[1]} 22={d[2]} "
                  f"3={s[0]} 13={s[1]} 23={s[2]} 4={a[0]} 14={a[1]} 24={a[2]} 15={e[0]} "
                  f"16={e[1]} 25={e[2]}")
    else:
        raise Absent(f"the ncnn runner has no {n}-D convolution")
    count = int(np.prod(f))
    params += f" 5={1 if p['bias'] else 0} 6={count}"
    if back:
        params += f" 18={p['output_padding'][-1]} 19={p['output_padding'][0]}"
        kind = "Deconvolution" if g == 1 else "DeconvolutionDepthWise"
    elif n == 3:
        kind = "Convolution3D"
    else:
        kind = "Convolution" if g == 1 else "ConvolutionDepthWise"
    if g != 1:
        params += f" 7={g}"
    return kind, params, None, n + 1


def _weights(workload, inputs, kind) -> bytes:
    """ncnn's .bin: the weight blob with its 4-byte float32 tag, then the raw bias."""
    w, b = inputs[1].astype(np.float32), inputs[2]
    if kind.startswith("Deconvolution"):
        # ncnn keeps (group, C_out/group, C_in/group, *k); torch/ONNX/DML (C_in, C_out/group, *k)
        g = workload.p["groups"]
        cin, cog = w.shape[:2]
        w = w.reshape(g, cin // g, cog, *w.shape[2:]).swapaxes(1, 2)
    blob = struct.pack("<I", 0) + np.ascontiguousarray(w).tobytes()
    if b is not None:
        blob += b.astype(np.float32).tobytes()
    return blob


@contextlib.contextmanager
def _quiet_stderr():
    """ncnn prints every GPU's properties to stderr when it creates its Vulkan instance."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class _NcnnPeer(Runner):
    vulkan = False

    @classmethod
    def probe(cls) -> str:
        ncnn = require("ncnn")
        with _quiet_stderr():
            count = ncnn.get_gpu_count()
        if cls.vulkan and count == 0:
            raise Absent("ncnn sees no Vulkan device")
        return ncnn.__version__

    def prepare(self, workload, inputs):
        ncnn = require("ncnn")
        if workload.op in model_ops.OPS:
            kind, params, blob, xs = ncnn_model_ops.layer(workload, inputs)
            outs = [tuple(s) for s in workload.p["out_shapes"]]
        else:
            kind, params, blob, rank = _layer(workload)
            if blob is None:
                blob = _weights(workload, inputs, kind)
            xs = [np.ascontiguousarray(inputs[0][0].astype(np.float32))]
            if xs[0].ndim != rank:
                raise Absent(f"ncnn {kind} takes {rank}-D blobs, the input is {xs[0].ndim}-D")
            outs = None
        net = self._net(ncnn, workload, kind, params, blob, len(xs), len(outs or [0]))
        out_dtype = workload.np_dtype

        def result(out, shape):
            y = np.array(out)
            y = y[None] if shape is None else y.reshape(shape)   # (ncnn drops the batch)
            return y.astype(out_dtype, copy=False)

        # An in-place layer (BatchNorm, Softmax) reads the input's reference count, which a
        # Mat over NumPy memory lacks (ncnn crashes): it gets a copy it owns.
        own = kind in ("BatchNorm", "Softmax")

        def run():
            ex = net.create_extractor()
            for i, x in enumerate(xs):
                ex.input(f"in{i}", ncnn.Mat(x).clone() if own else ncnn.Mat(x))
            ys = []
            for i, shape in enumerate(outs or [None]):
                ret, out = ex.extract(f"out{i}")
                if ret != 0:
                    raise RuntimeError(f"ncnn extract failed ({ret})")
                if shape is not None and np.array(out).size != np.prod(shape):
                    raise RuntimeError(f"ncnn gave {np.array(out).shape}, expected {shape}")
                ys.append(result(out, shape))
            return ys[0] if len(ys) == 1 else ys

        return run

    def _net(self, ncnn, workload, kind, params, blob, n_in, n_out):
        """A net of ``n_in`` Input layers feeding one ``kind`` layer of ``n_out`` outputs."""
        net = ncnn.Net()
        opt = net.opt
        opt.use_vulkan_compute = self.vulkan
        half = workload.dtype == "float16"
        for flag in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic"):
            setattr(opt, flag, half)
        opt.use_bf16_storage = False
        opt.num_threads = os.cpu_count() or 1
        if self.vulkan:
            net.set_vulkan_device(_gpu_index(ncnn, self.device.name))
        ins = [f"in{i}" for i in range(n_in)]
        outs = [f"out{i}" for i in range(n_out)]
        text = (f"7767517\n{n_in + 1} {n_in + n_out}\n"
                + "".join(f"Input {b} 0 1 {b}\n" for b in ins)
                + f"{kind} layer0 {n_in} {n_out} {' '.join(ins + outs)} {params}\n")
        if net.load_param_mem(text) != 0:
            raise Absent(f"ncnn cannot load a {kind} layer with {params}")
        if self.vulkan and not net.layers()[n_in].support_vulkan:
            raise Absent(f"this ncnn build has no Vulkan {kind} (it would run on the CPU)")
        # load_model also creates the layer's pipelines: needed even without weights
        if blob:
            net.load_model_mem(blob)
        else:
            net.load_model(ncnn.DataReaderFromEmpty())
        self._loaded = net
        return net

    def close(self) -> None:
        net = getattr(self, "_loaded", None)
        if net is not None:
            net.clear()
            self._loaded = None


class NcnnVulkanPeer(_NcnnPeer):
    name = "ncnn-vulkan"
    on_device = True
    vulkan = True


class NcnnCpuPeer(_NcnnPeer):
    name = "ncnn-cpu"


RUNNERS = [NcnnVulkanPeer, NcnnCpuPeer]

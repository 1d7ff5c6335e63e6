"""PyTorch on the CPU (``torch.nn.functional``), with every CPU core.

Padding: ``F.pad`` (constant, replicate = edge, reflect = reflection, circular = wrap;
PyTorch has no symmetric mode).  Fold/Unfold: ``F.fold``/``F.unfold`` (2-D, equal start
and end padding).  Convolution: ``F.conv{1,2,3}d`` (asymmetric padding through ``F.pad``)
and ``F.conv_transpose{1,2,3}d`` (equal padding).  LP pooling: ``F.pad`` + ``F.lp_pool{2,3}d``
(no dilations; ``|x|`` first for odd P, where PyTorch's formula differs).  The model
operators: ``torch.add``/..., ``clone``/``permute().contiguous()``, ``cat``, ``split``,
indexing, ``F.interpolate``, ``F.max_pool*d``/``F.avg_pool*d``, ``sum``/``mean``/``amax``,
``@``/``addmm``, ``F.batch_norm`` (inference), ``softmax``.

``torch-gpu`` runs the same functions on the GPU PyTorch sees (CUDA, so cuDNN; or ROCm,
so MIOpen; TF32 off, float32 arithmetic as vkml's), whenever it sees one: the inputs are
uploaded once, each run is timed to the end of a device synchronization, and the result
is read back (NumPy out, like every runner). Without a GPU it is absent, with the
reason.
"""
from __future__ import annotations

import os

from .. import model_ops
from . import Absent, Runner, require

_PAD_MODE = {"constant": "constant", "edge": "replicate", "reflection": "reflect",
             "wrap": "circular"}


class TorchPeer(Runner):
    name = "torch-cpu"
    #: ``torch.device`` the functions run on.
    torch_device = "cpu"

    @classmethod
    def probe(cls) -> str:
        torch = require("torch")
        return torch.__version__

    def prepare(self, workload, inputs):
        torch = require("torch")
        fn = self._function(torch, workload, [
            None if a is None else torch.from_numpy(a).to(self.torch_device) for a in inputs])
        return lambda: self._result(torch, fn())

    def _result(self, torch, y):
        """The output as NumPy (read back after the device finished, on a GPU)."""
        if isinstance(y, (list, tuple)):
            return [a.numpy() for a in y]
        return y.numpy()

    def _function(self, torch, workload, ts):
        """A callable computing ``workload`` on the tensors ``ts`` (a torch tensor out)."""
        F = torch.nn.functional
        torch.set_num_threads(os.cpu_count() or 1)
        op, p = workload.op, workload.p
        x = ts[0]
        if op in model_ops.OPS:
            return _model_op(torch, F, op, p, ts)

        def torch_pads(start, end):       # F.pad: last dimension first
            out = []
            for a, b in zip(reversed(start), reversed(end)):
                out += [a, b]
            return out

        if op == "pad":
            mode = _PAD_MODE.get(p["mode"])
            if mode is None:
                raise Absent(f"PyTorch has no {p['mode']} padding")
            pads = torch_pads(p["start"], p["end"])
            while len(pads) > 2 and pads[-2:] == [0, 0]:
                pads = pads[:-2]
            if mode == "constant":
                fn = lambda: F.pad(x, pads, "constant", p["value"])   # noqa: E731
            else:
                fn = lambda: F.pad(x, pads, mode)   # noqa: E731
        elif op in ("fold", "unfold"):
            if len(p["window"]) != 2:
                raise Absent(f"torch {op} is 2-D only")
            if p["start_padding"] != p["end_padding"]:
                raise Absent(f"torch {op} pads both ends equally")
            kw = dict(kernel_size=p["window"], dilation=p["dilations"],
                      padding=p["start_padding"], stride=p["strides"])
            if op == "fold":
                fn = lambda: F.fold(x, p["image_shape"][2:], **kw)   # noqa: E731
            else:
                fn = lambda: F.unfold(x, **kw)   # noqa: E731
        elif op == "lp_pooling":
            n = len(p["window"])
            if n not in (2, 3):
                raise Absent("torch lp_pool is 2-D or 3-D")
            if any(d != 1 for d in p["dilations"]):
                raise Absent("torch lp_pool has no dilations")
            pool = F.lp_pool2d if n == 2 else F.lp_pool3d
            pads = torch_pads(p["start_padding"], p["end_padding"])
            pw = p["p"]

            def fn():
                v = x.abs() if pw % 2 else x
                if any(pads):
                    v = F.pad(v, pads)
                return pool(v, pw, p["window"], p["strides"])
        else:
            fn = self._convolution(torch, F, p, ts)
        return fn

    @staticmethod
    def _convolution(torch, F, p, ts):
        x, w, b = ts
        n = len(p["input"]) - 2
        if n not in (1, 2, 3):
            raise Absent(f"torch has no {n}-D convolution")
        if p["mode"] == "convolution":
            w = torch.flip(w, dims=list(range(2, 2 + n)))
        if p["activation"] not in (None, "relu"):
            raise Absent(f"the torch runner has no fused {p['activation']}")
        act = (lambda y: torch.relu_(y)) if p["activation"] == "relu" else (lambda y: y)
        if p["direction"] == "backward":
            if p["start_padding"] != p["end_padding"]:
                raise Absent("torch conv_transpose pads both ends equally")
            conv = getattr(F, f"conv_transpose{n}d")
            return lambda: act(conv(x, w, b, p["strides"], p["start_padding"],
                                    p["output_padding"], p["groups"], p["dilations"]))
        if any(p["output_padding"]):
            raise Absent("torch conv has no output_padding")
        conv = getattr(F, f"conv{n}d")
        if p["start_padding"] == p["end_padding"]:
            return lambda: act(conv(x, w, b, p["strides"], p["start_padding"], p["dilations"],
                                    p["groups"]))
        pads = []
        for a, e in zip(reversed(p["start_padding"]), reversed(p["end_padding"])):
            pads += [a, e]
        return lambda: act(conv(F.pad(x, pads), w, b, p["strides"], 0, p["dilations"],
                                p["groups"]))


_BINARY = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "div",
           "maximum": "maximum", "minimum": "minimum"}
_REDUCE = {"sum": "sum", "average": "mean", "max": "amax", "min": "amin"}


def _model_op(torch, F, op, p, ts):
    """The operators CNN models are made of: each a callable returning a new tensor
    (views made contiguous: every runner writes its output)."""
    x = ts[0]
    if op == "element_wise":
        fn, b = getattr(torch, _BINARY[p["function"]]), ts[1]
        return lambda: fn(x, b)
    if op == "identity":
        if p["perm"] is None:
            return lambda: x.clone()
        return lambda: x.permute(p["perm"]).contiguous()
    if op == "join":
        return lambda: torch.cat(ts, p["axis"])
    if op == "split":
        return lambda: [t.contiguous() for t in torch.split(x, list(p["sizes"]), p["axis"])]
    if op == "slice":
        index = tuple(slice(o, o + (n - 1) * s + 1, s) for o, n, s in
                      zip(p["offsets"], p["sizes"], p["strides"]))
        return lambda: x[index].contiguous()
    if op == "resample":
        return _resample(F, p, x)
    if op in ("max_pooling", "average_pooling"):
        return _pooling(F, op, p, x)
    if op == "reduce":
        name = _REDUCE.get(p["function"])
        if name is None:
            raise Absent(f"the torch runner has no reduce {p['function']}")
        fn = getattr(torch, name)
        return lambda: fn(x, p["axes"], keepdim=True)
    if op == "gemm":
        a, b, c = ts
        b = b.t() if p["trans_b"] else b
        return (lambda: a @ b) if c is None else (lambda: torch.addmm(c, a, b))
    if op == "batch_normalization":
        stats = [t.reshape(-1) for t in ts[1:]]
        return lambda: F.batch_norm(x, stats[0], stats[1], stats[2], stats[3], False, 0.0,
                                    p["epsilon"])
    if len(p["axes"]) != 1:
        raise Absent("torch softmax takes one axis")
    return lambda: torch.softmax(x, p["axes"][0])


def _resample(F, p, x):
    n = len(p["shape"]) - 2
    if n not in (1, 2, 3) or p["scales"][:2] != [1.0, 1.0]:
        raise Absent("torch interpolate scales the 1 to 3 spatial dimensions only")
    if any(a != 0.5 for a in p["input_pixel_offsets"][2:]) or any(
            b != -0.5 for b in p["output_pixel_offsets"][2:]):
        raise Absent("torch interpolate samples pixel centres (offsets 0.5, -0.5) only")
    if p["mode"] == "nearest":
        return lambda: F.interpolate(x, size=p["out_shape"][2:], mode="nearest")
    mode = ("linear", "bilinear", "trilinear")[n - 1]
    return lambda: F.interpolate(x, size=p["out_shape"][2:], mode=mode, align_corners=False)


def _pooling(F, op, p, x):
    n = len(p["window"])
    if n not in (1, 2, 3):
        raise Absent(f"torch has no {n}-D pooling")
    if p["start_padding"] != p["end_padding"]:
        raise Absent("torch pooling pads both ends equally")
    kw = dict(kernel_size=p["window"], stride=p["strides"], padding=p["start_padding"])
    if op == "max_pooling":
        fn = getattr(F, f"max_pool{n}d")
        return lambda: fn(x, dilation=p["dilations"], **kw)
    if any(d != 1 for d in p["dilations"]):
        raise Absent("torch avg_pool has no dilations")
    fn = getattr(F, f"avg_pool{n}d")
    return lambda: fn(x, count_include_pad=p["include_padding"], **kw)


class TorchGpuPeer(TorchPeer):
    """The same PyTorch functions on the GPU PyTorch sees (cuDNN / MIOpen)."""

    name = "torch-gpu"
    torch_device = "cuda"

    def prepare(self, workload, inputs):
        """As on the CPU, with float32 arithmetic (TF32 off) as vkml's."""
        torch = require("torch")
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        return super().prepare(workload, inputs)

    @classmethod
    def probe(cls) -> str:
        torch = require("torch")
        if not torch.cuda.is_available():
            raise Absent(f"PyTorch {torch.__version__} sees no GPU (a CUDA or ROCm build "
                         "and a GPU are needed)")
        backend = f"ROCm {torch.version.hip}" if torch.version.hip else \
            f"CUDA {torch.version.cuda}"
        return f"{torch.__version__} ({backend}, {torch.cuda.get_device_name(0)})"

    def _result(self, torch, y):
        torch.cuda.synchronize()
        if isinstance(y, (list, tuple)):
            return [a.cpu().numpy() for a in y]
        return y.cpu().numpy()


RUNNERS = [TorchPeer, TorchGpuPeer]

"""Lowering a device partition's ONNX nodes into ``vkml.dml`` descriptors (:class:`Step` s)
and those into one ``vkml.dml.GraphDesc`` (package doc, steps 3 and 4): :data:`DEVICE_OPS`
is THE list of ONNX ops that run on the device, :data:`HOST_ACTIVATIONS` THE list of
activation cases DML cannot express."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np
from onnx import helper

from .. import dml
from ..dml.batch_normalization import STATISTICS
from ..errors import ValidationError
from ..intmath import ceil_div
from ..ops.resample import coordinate_map, input_coordinates, onnx_resize_geometry


class _HostFallback(Exception):
    """Raised by a lowering: this node, with these values, has no vkml descriptor."""


@dataclass
class Step:
    """One device operation: ``desc`` (a vkml.dml descriptor, or None for an alias: the
    output is the input tensor, e.g. Identity) reading ``inputs`` and writing ``outputs``
    (value names; None for an absent optional tensor).  A tensor is bound as raw memory,
    so a descriptor may view it with other sizes of the same element count (LpPool 1-D
    runs as 2-D with a trailing 1)."""

    desc: object
    inputs: list
    outputs: list
    origin: int = -1            # the ONNX node's index in its partition


# -- lowering helpers -------------------------------------------------------------------------

def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def _tdesc(shape, dtype) -> dml.TensorDesc:
    return dml.TensorDesc(dml.DataType.of(np.dtype(dtype)), tuple(int(s) for s in shape))


def _auto_pads(auto_pad, sizes, kernel, strides, dilations, pads):
    """Start and end paddings of Conv/LpPool (ONNX's auto_pad rules)."""
    n = len(sizes)
    auto_pad = _s(auto_pad or "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        start, end = [], []
        for i in range(n):
            out = ceil_div(sizes[i], strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - sizes[i])
            small = total // 2
            if auto_pad == "SAME_UPPER":
                start.append(small), end.append(total - small)
            else:
                start.append(total - small), end.append(small)
        return start, end
    if auto_pad == "VALID":
        return [0] * n, [0] * n
    pads = list(pads or [0] * (2 * n))
    return pads[:n], pads[n:]


class _Lowering:
    """Lowers the nodes of one device partition for concrete shapes: ``infos`` maps value
    names to (shape, dtype); ``values`` gives host values of parameter inputs."""

    def __init__(self, values: dict, infos: dict, opset: int = 10**6):
        self.values = values
        self.infos = infos
        self.opset = opset          # the model's default-domain opset (Softmax's axis)
        self.steps: list[Step] = []
        self.origin = -1            # the index (in the partition) of the node being lowered

    def param(self, node, i, default=None):
        if i >= len(node.input) or not node.input[i]:
            return default
        return np.asarray(self.values[node.input[i]])

    def info(self, name):
        return self.infos[name]

    def emit(self, desc, inputs, outputs, out_infos):
        self.steps.append(Step(desc, list(inputs), list(outputs), self.origin))
        for name, inf in zip(outputs, out_infos):
            self.infos[name] = inf


def _lower_pad(lw: _Lowering, node):
    shape, dtype = lw.info(node.input[0])
    rank = len(shape)
    a = _attrs(node)
    mode = _s(a.get("mode", "constant"))
    if "pads" in a or "paddings" in a:              # opsets 2 and 1: attributes
        pads = list(a["pads"] if "pads" in a else a["paddings"])
        value, axes = a.get("value", 0.0), None
    else:
        pads = [int(p) for p in lw.param(node, 1).reshape(-1)]
        v = lw.param(node, 2)
        value = v.reshape(-1)[0].item() if v is not None and v.size else 0
        ax = lw.param(node, 3)
        axes = None if ax is None else [int(x) for x in ax.reshape(-1)]
    axes = list(range(rank)) if axes is None else [x + rank if x < 0 else x for x in axes]
    k = len(axes)
    if len(pads) != 2 * k:
        raise ValidationError(f"{node.op_type} {node.name!r}: pads", f"must have 2 x {k} "
                              f"entries (one begin and one end per axis), got {len(pads)}")
    start, end = [0] * rank, [0] * rank
    for j, ax in enumerate(axes):
        start[ax], end[ax] = pads[j], pads[j + k]
    if min(start + end) < 0:
        raise _HostFallback("negative pads (cropping): DML_PADDING takes UINT paddings")
    modes = {"constant": dml.PaddingMode.CONSTANT, "reflect": dml.PaddingMode.REFLECTION,
             "edge": dml.PaddingMode.EDGE, "wrap": dml.PaddingMode.WRAP}
    if mode not in modes:
        raise ValidationError(f"Pad {node.name!r}: mode", f"must be one of {sorted(modes)}, "
                              f"got {mode!r}")
    dt = np.dtype(dtype)
    value = np.array(value).astype(dt).item()       # ONNX: constant_value has x's type
    out_shape = tuple(s + b + e for s, b, e in zip(shape, start, end))
    desc = dml.Padding1OperatorDesc(
        _tdesc(shape, dt), _tdesc(out_shape, dt), modes[mode], dml.DataType.of(dt), value,
        tuple(start), tuple(end))
    lw.emit(desc, [node.input[0]], [node.output[0]], [(out_shape, dt)])


def _lower_conv(lw: _Lowering, node):
    (xs, dt), (ws, _) = lw.info(node.input[0]), lw.info(node.input[1])
    has_bias = len(node.input) > 2 and bool(node.input[2])
    a = _attrs(node)
    n = len(xs) - 2
    kernel = list(ws[2:])
    strides = list(a.get("strides", [1] * n))
    dil = list(a.get("dilations", [1] * n))
    group = int(a.get("group", 1))
    transposed = node.op_type == "ConvTranspose"
    if not transposed:
        start, end = _auto_pads(a.get("auto_pad"), xs[2:], kernel, strides, dil, a.get("pads"))
        out_pad = [0] * n
        c_out = ws[0]
    else:
        out_pad_attr = list(a.get("output_padding", [0] * n))
        auto_pad = _s(a.get("auto_pad", "NOTSET"))
        out_shape = list(a.get("output_shape", []))[-n:] if "output_shape" in a else None
        full = [(xs[2 + i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 for i in range(n)]
        if out_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out_shape = [xs[2 + i] * strides[i] for i in range(n)]
        if out_shape is not None:
            # ONNX: total_padding = stride*(in-1) + output_padding + ((k-1)*d+1) - output_shape
            start = []
            for i in range(n):
                total = full[i] + out_pad_attr[i] - out_shape[i]
                start.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        else:
            pads = list(a.get("pads", [0] * (2 * n)))
            start = pads[:n]
            out_shape = [full[i] + out_pad_attr[i] - pads[i] - pads[n + i] for i in range(n)]
        if min(start) < 0:
            raise _HostFallback("a negative start padding (output_shape larger than the "
                                "transposed convolution at its start)")
        # DML: out = full - start - end + output_padding, the added positions holding what
        # the transposed convolution puts there: only start and the total size matter.
        end, out_pad = [], []
        for i in range(n):
            rem = full[i] - start[i] - out_shape[i]
            end.append(max(rem, 0)), out_pad.append(max(-rem, 0))
        c_out = ws[1] * group
    bias = None
    if has_bias:
        bias = _tdesc((1, c_out) + (1,) * n, dt)
    desc = dml.ConvolutionOperatorDesc(
        _tdesc(xs, dt), _tdesc(ws, dt), bias, _tdesc((1, 1) + (1,) * n, dt),  # output: below
        mode=dml.ConvolutionMode.CROSS_CORRELATION,
        direction=(dml.ConvolutionDirection.BACKWARD if transposed
                   else dml.ConvolutionDirection.FORWARD),
        strides=tuple(strides), dilations=tuple(dil), start_padding=tuple(start),
        end_padding=tuple(end), output_padding=tuple(out_pad), group_count=group)
    if min(desc.expected_output_sizes()) < 1:
        raise ValidationError(f"{node.op_type} {node.name!r}", "the output would be empty: "
                              f"{desc.expected_output_sizes()}")
    out_shape = desc.expected_output_sizes()
    desc = replace(desc, output_tensor=_tdesc(out_shape, dt))
    lw.emit(desc, [node.input[0], node.input[1], node.input[2] if has_bias else None],
            [node.output[0]], [(out_shape, dt)])


def _lower_lp_pool(lw: _Lowering, node):
    xs, dt = lw.info(node.input[0])
    a = _attrs(node)
    n = len(xs) - 2
    kernel = list(a["kernel_shape"])
    strides = list(a.get("strides", [1] * n))
    dil = list(a.get("dilations", [1] * n))
    p = a.get("p", 2)
    if float(p) != int(p) or int(p) < 1:
        raise _HostFallback(f"p={p}: DML_LP_POOLING1 takes an integer P >= 1")
    p = int(p)
    start, end = _auto_pads(a.get("auto_pad"), xs[2:], kernel, strides, dil, a.get("pads"))
    if a.get("ceil_mode", 0):
        # ceil_mode: a last window may hang over the end.  ONNX's reference (and torch's
        # lp_pool, both an average pool times the kernel size) scale such a window by
        # kernel size / elements inside; DML_LP_POOLING1 sums the elements it covers.
        # Only where no window hangs over does ceil_mode equal floor on the device.
        for i in range(n):
            span = xs[2 + i] + start[i] + end[i] - ((kernel[i] - 1) * dil[i] + 1)
            if span >= 0 and span % strides[i]:
                out = span // strides[i] + 2
                if (out - 1) * strides[i] < xs[2 + i] + start[i]:
                    raise _HostFallback("ceil_mode with a window hanging over the end (ONNX "
                                        "scales it by kernel size / elements inside; "
                                        "DML_LP_POOLING1 does not)")
    view = list(xs)
    if n == 1:                                      # 1-D: run as 2-D with a trailing 1
        view, kernel, strides, dil = view + [1], kernel + [1], strides + [1], dil + [1]
        start, end = start + [0], end + [0]
    if len(view) not in (4, 5):
        raise _HostFallback(f"{n} spatial dimensions (DML_LP_POOLING1: 2 or 3)")
    out = list(dml.lp_pooling_output_sizes(view, strides, kernel, start, end, dil))
    desc = dml.LpPooling1OperatorDesc(_tdesc(view, dt), _tdesc(out, dt), tuple(strides),
                                      tuple(kernel), tuple(start), tuple(end), tuple(dil), p)
    out_shape = tuple(out[:-1]) if n == 1 else tuple(out)
    lw.emit(desc, [node.input[0]], [node.output[0]], [(out_shape, dt)])


def _lower_col2im(lw: _Lowering, node):
    xs, dt = lw.info(node.input[0])
    image = [int(v) for v in lw.param(node, 1).reshape(-1)]
    block = [int(v) for v in lw.param(node, 2).reshape(-1)]
    a = _attrs(node)
    n = len(image)
    strides = list(a.get("strides", [1] * n))
    dil = list(a.get("dilations", [1] * n))
    pads = list(a.get("pads", [0] * (2 * n)))
    c = xs[1] // max(1, math.prod(block))
    out_shape = (xs[0], c, *image)
    desc = dml.FoldOperatorDesc(_tdesc(xs, dt), _tdesc(out_shape, dt), tuple(block),
                                tuple(strides), tuple(dil), tuple(pads[:n]), tuple(pads[n:]))
    lw.emit(desc, [node.input[0]], [node.output[0]], [(out_shape, dt)])


def _lower_identity(lw: _Lowering, node):
    shape, dt = lw.info(node.input[0])
    if np.dtype(dt) in _FLOATS:                     # DML_ACTIVATION_IDENTITY: a node (a copy)
        return _lower_activation(lw, node)
    lw.emit(None, [node.input[0]], [node.output[0]], [(shape, dt)])   # other types: alias


# -- element-wise arithmetic ------------------------------------------------------------------

#: ONNX element-wise op -> the vkml.dml descriptor class (two inputs; Sum, Max and Min with
#: more take a chain of them, one input is an alias).
BINARY_OPS = {"Add": dml.ElementWiseAddOperatorDesc, "Sum": dml.ElementWiseAddOperatorDesc,
              "Sub": dml.ElementWiseSubtractOperatorDesc,
              "Mul": dml.ElementWiseMultiplyOperatorDesc,
              "Div": dml.ElementWiseDivideOperatorDesc,
              "Max": dml.ElementWiseMaxOperatorDesc, "Min": dml.ElementWiseMinOperatorDesc}

#: THE list of element-wise cases that stay on the host: reason key -> why.
HOST_ELEMENT_WISE: dict[str, str] = {
    "rank": "more than 8 dimensions (DML tensors have 1 to 8)",
    "empty": "an empty tensor (DML sizes are at least 1)",
    "dtype": "a data type the DML element-wise operators do not take (float64, bool, "
             "bfloat16: they take float32, float16 and the 8- to 64-bit integers)",
}


def _broadcast_tdesc(shape, out_shape, dt) -> dml.TensorDesc:
    """``shape`` broadcast to ``out_shape`` (ONNX's multidirectional rule, NumPy's) as a
    DML tensor of the output's sizes with stride 0 along the broadcast dimensions, so that
    nothing is copied: the element-wise pages' "same Sizes" with broadcasting by strides."""
    return dml.broadcast_tensor_desc(dml.DataType.of(np.dtype(dt)), shape,
                                     tuple(out_shape) or (1,))


def _lower_element_wise(lw: _Lowering, node):
    """Add, Sub, Mul, Div, Max, Min (and Sum/Max/Min of any count) as DML_ELEMENT_WISE_*:
    inputs broadcast by zero strides; Div of integers truncates toward zero (DIVIDE's page:
    "For integer divisions, the result is truncated"), as ONNX Runtime's C++ division."""
    names = [x for x in node.input if x]
    dt = np.dtype(lw.info(names[0])[1])
    if len(names) == 1:                             # Sum/Max/Min of one input: itself
        lw.emit(None, names, [node.output[0]], [lw.info(names[0])])
        return
    shapes = [tuple(lw.info(x)[0]) for x in names]
    try:
        out_shape = tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValidationError(f"{node.op_type} {node.name!r}: inputs", f"shapes {shapes} do "
                              f"not broadcast (ONNX's multidirectional rule)") from None
    if len(out_shape) > 8:
        raise _HostFallback(HOST_ELEMENT_WISE["rank"] + f" ({len(out_shape)})")
    if 0 in out_shape:
        raise _HostFallback(HOST_ELEMENT_WISE["empty"] + f" ({out_shape})")
    cls = BINARY_OPS[node.op_type]
    acc = names[0]
    for k, b in enumerate(names[1:], 1):
        # a chain broadcasts its partial results too: each step's output has the sizes
        # of the inputs it has combined so far
        a_shape = lw.info(acc)[0]
        step_shape = tuple(np.broadcast_shapes(a_shape, lw.info(b)[0]))
        desc = cls(_broadcast_tdesc(a_shape, step_shape, dt),
                   _broadcast_tdesc(lw.info(b)[0], step_shape, dt),
                   _tdesc(step_shape or (1,), dt))
        out = node.output[0] if k == len(names) - 1 else f"{node.output[0]}#vkml{k}"
        lw.emit(desc, [acc, b], [out], [(step_shape, dt)])
        acc = out


# -- aliases: ops that only rename or reshape ----------------------------------------------

def _axes(node, lw: _Lowering, rank: int):
    """Squeeze/Unsqueeze axes: the attribute (opsets < 13) or input 1; None if absent;
    negative axes count from ``rank``'s end."""
    a = _attrs(node)
    ax = a.get("axes")
    if ax is None:
        v = lw.param(node, 1)
        ax = None if v is None else [int(x) for x in v.reshape(-1)]
    return None if ax is None else [int(x) + rank if int(x) < 0 else int(x) for x in ax]


def _reshape_shape(node, lw: _Lowering, shape) -> tuple:
    """Reshape's output shape (ONNX's rules: 0 copies the input's size unless allowzero,
    one -1 takes the rest)."""
    a = _attrs(node)
    want = list(a["shape"]) if "shape" in a else [int(v) for v in lw.param(node, 1).reshape(-1)]
    allowzero = int(a.get("allowzero", 0))
    out = [shape[i] if v == 0 and not allowzero and i < len(shape) else v
           for i, v in enumerate(want)]
    if out.count(-1) > 1:
        raise ValidationError(f"Reshape {node.name!r}: shape", f"may hold one -1, got {want}")
    if -1 in out:
        rest = math.prod(v for v in out if v != -1)
        out[out.index(-1)] = math.prod(shape) // rest if rest else 0
    if math.prod(out) != math.prod(shape) or min(out, default=0) < 0:
        raise ValidationError(f"Reshape {node.name!r}: shape", f"{want} does not hold the "
                              f"{math.prod(shape)} elements of an input of shape {tuple(shape)}")
    return tuple(out)


def _alias_shape(node, lw: _Lowering, shape) -> tuple:
    """The output shape of an alias op (its elements are the input's, in the same order)."""
    rank = len(shape)
    op = node.op_type
    if op == "Reshape":
        return _reshape_shape(node, lw, shape)
    if op == "Flatten":
        axis = int(_attrs(node).get("axis", 1))
        axis = axis + rank if axis < 0 else axis
        return (math.prod(shape[:axis]), math.prod(shape[axis:]))
    if op == "Squeeze":
        axes = _axes(node, lw, rank)
        if axes is None:
            return tuple(s for s in shape if s != 1)
        if any(shape[x] != 1 for x in axes):
            raise ValidationError(f"Squeeze {node.name!r}: axes", f"{axes} must name "
                                  f"dimensions of size 1 of shape {tuple(shape)}")
        return tuple(s for i, s in enumerate(shape) if i not in axes)
    if op == "Unsqueeze":
        out_rank = rank + len(_axes(node, lw, 0) or [])
        axes = sorted(_axes(node, lw, out_rank))
        out, it = [], iter(shape)
        for i in range(out_rank):
            out.append(1 if i in axes else next(it))
        return tuple(out)
    return tuple(shape)                             # Dropout (inference)


#: THE list of alias cases that stay on the host: reason key -> why.
HOST_ALIASES: dict[str, str] = {
    "dropout_mask": "Dropout's mask output (a bool tensor of ones: vkml tensors hold no bool)",
    "dropout_training": "Dropout with training_mode true (random: no DML operator)",
}


def _lower_alias(lw: _Lowering, node):
    """Reshape, Flatten, Squeeze, Unsqueeze and Dropout (inference) as aliases: the output
    is the input's buffer under another shape, no copy (a DML tensor is bound as raw
    memory; the consumers' descriptors give its sizes)."""
    shape, dt = lw.info(node.input[0])
    if node.op_type == "Dropout":
        if len(node.output) > 1 and node.output[1]:
            raise _HostFallback(HOST_ALIASES["dropout_mask"])
        training = lw.param(node, 2)
        if training is not None and bool(training.reshape(-1)[0]):
            raise _HostFallback(HOST_ALIASES["dropout_training"])
    out = _alias_shape(node, lw, tuple(shape))
    lw.emit(None, [node.input[0]], [node.output[0]], [(out, dt)])


# -- max and average pooling ------------------------------------------------------------------

#: THE list of pooling cases that stay on the host: reason key -> why.
HOST_POOLING: dict[str, str] = {
    "storage_order": "MaxPool storage_order=1 (column-major Indices: DML numbers them "
                     "row-major)",
    "rank": "a spatial rank other than 1 to 3 (DML pooling takes 4-D and 5-D tensors)",
    "ceil_include_pad": "AveragePool ceil_mode with count_include_pad=1 and a window hanging "
                        "over the end (ONNX divides by the window inside the padded input; "
                        "DML_AVERAGE_POOLING1 IncludePadding by the whole window)",
}


def _ceil_extra(sizes, kernel, strides, dil, start, end) -> list:
    """End padding to add per spatial axis so that DML's floor output sizes equal ONNX's
    ceil_mode sizes: ceil((in + pads - dilated window) / stride) + 1, less a last window
    that would start in the end padding (ONNX Runtime's and PyTorch's rule)."""
    extra = []
    for i, n in enumerate(sizes):
        span = n + start[i] + end[i] - ((kernel[i] - 1) * dil[i] + 1)
        floor_out = span // strides[i] + 1
        out = ceil_div(span, strides[i]) + 1
        if (out - 1) * strides[i] >= n + start[i]:
            out -= 1
        extra.append(max(out - floor_out, 0) * strides[i])
    return extra


def _pool_geometry(node, xs):
    """(view sizes, kernel, strides, dilations, start, end, spatial rank) of a MaxPool or
    AveragePool (Global*: the window is the whole plane); 1-D runs as 2-D with a trailing
    1, as LpPool."""
    n = len(xs) - 2
    if not 1 <= n <= 3:
        raise _HostFallback(HOST_POOLING["rank"] + f" ({n})")
    a = _attrs(node)
    if node.op_type.startswith("Global"):
        kernel, strides, dil = list(xs[2:]), [1] * n, [1] * n
        start, end = [0] * n, [0] * n
    else:
        kernel = list(a["kernel_shape"])
        strides = list(a.get("strides", [1] * n))
        dil = list(a.get("dilations", [1] * n))
        start, end = _auto_pads(a.get("auto_pad"), xs[2:], kernel, strides, dil, a.get("pads"))
    view = list(xs)
    if n == 1:
        view, kernel, strides, dil = view + [1], kernel + [1], strides + [1], dil + [1]
        start, end = start + [0], end + [0]
    return view, kernel, strides, dil, list(start), list(end), n


def _lower_pool(lw: _Lowering, node):
    """MaxPool (its Indices output too), AveragePool, GlobalMaxPool, GlobalAveragePool as
    DML_MAX_POOLING2 / DML_AVERAGE_POOLING1; ceil_mode as added end padding, which a max
    never picks and an average without count_include_pad does not count."""
    xs, dt = lw.info(node.input[0])
    a = _attrs(node)
    view, kernel, strides, dil, start, end, n = _pool_geometry(node, xs)
    if int(a.get("ceil_mode", 0)):
        extra = _ceil_extra(view[2:], kernel, strides, dil, start, end)
        if any(extra) and node.op_type == "AveragePool" and int(a.get("count_include_pad", 0)):
            raise _HostFallback(HOST_POOLING["ceil_include_pad"])
        end = [e + x for e, x in zip(end, extra)]
    out = list(dml.lp_pooling_output_sizes(view, strides, kernel, start, end, dil))
    out_shape = tuple(out[:-1]) if n == 1 else tuple(out)
    common = dict(strides=tuple(strides), window_size=tuple(kernel),
                  start_padding=tuple(start), end_padding=tuple(end), dilations=tuple(dil))
    outputs, infos = [node.output[0]], [(out_shape, dt)]
    if "Max" in node.op_type:
        idx = None
        if len(node.output) > 1 and node.output[1]:
            if int(a.get("storage_order", 0)):
                raise _HostFallback(HOST_POOLING["storage_order"])
            # ONNX's int64 Indices as DML's UINT64 (the same bits: indices are >= 0)
            idx = dml.TensorDesc(dml.DataType.UINT64, tuple(out))
            outputs.append(node.output[1])
            infos.append((out_shape, np.dtype(np.int64)))
        desc = dml.MaxPooling2OperatorDesc(_tdesc(view, dt), _tdesc(out, dt), idx, **common)
    else:
        include = bool(int(a.get("count_include_pad", 0)))
        desc = dml.AveragePooling1OperatorDesc(_tdesc(view, dt), _tdesc(out, dt),
                                               include_padding=include, **common)
    lw.emit(desc, [node.input[0]], outputs, infos)


# -- data movement ----------------------------------------------------------------------------

def _lower_transpose(lw: _Lowering, node):
    """Transpose as DML_ELEMENT_WISE_IDENTITY whose input is viewed with permuted strides
    (the identity page: strided copies), every data type."""
    shape, dt = lw.info(node.input[0])
    rank = len(shape)
    perm = [int(p) for p in _attrs(node).get("perm", list(range(rank))[::-1])]
    if sorted(perm) != list(range(rank)):
        raise ValidationError(f"Transpose {node.name!r}: perm", f"must be a permutation of "
                              f"0..{rank - 1}, got {perm}")
    out_shape = tuple(shape[p] for p in perm)
    if rank > 8:
        raise _HostFallback(HOST_ELEMENT_WISE["rank"] + f" ({rank})")
    if 0 in out_shape:
        raise _HostFallback(HOST_ELEMENT_WISE["empty"] + f" ({out_shape})")
    if perm == sorted(perm) or rank == 0:          # nothing moves: an alias
        lw.emit(None, [node.input[0]], [node.output[0]], [(out_shape, dt)])
        return
    packed = dml.packed_strides(tuple(shape))
    src = dml.TensorDesc(dml.DataType.of(np.dtype(dt)), out_shape,
                         tuple(packed[p] for p in perm))
    desc = dml.ElementWiseIdentityOperatorDesc(src, _tdesc(out_shape, dt))
    lw.emit(desc, [node.input[0]], [node.output[0]], [(out_shape, dt)])


def _lower_slice(lw: _Lowering, node):
    """Slice (constant or host-known starts/ends/axes/steps) as DML_SLICE1: per axis the
    elements ONNX selects (NumPy's slice rules: negatives count from the end, clamped) as
    an input window and a signed stride (a negative one walks it from its end)."""
    shape, dt = lw.info(node.input[0])
    rank = len(shape)
    a = _attrs(node)
    if "starts" in a:                               # opset 1: attributes
        starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
    else:
        def ints(i):
            v = lw.param(node, i)
            return None if v is None else [int(x) for x in v.reshape(-1)]
        starts, ends, axes, steps = ints(1), ints(2), ints(3), ints(4)
    axes = list(range(len(starts))) if axes is None else [x + rank if x < 0 else x
                                                          for x in axes]
    steps = [1] * len(starts) if steps is None else steps
    if not (len(starts) == len(ends) == len(axes) == len(steps)) or \
            sorted(set(axes)) != sorted(axes) or any(not 0 <= x < rank for x in axes):
        raise ValidationError(f"Slice {node.name!r}: starts/ends/axes/steps", "must have one "
                              f"entry per distinct axis of a rank-{rank} input")
    offs, sizes, strides, out = [0] * rank, list(shape), [1] * rank, list(shape)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        if sp == 0:
            raise ValidationError(f"Slice {node.name!r}: steps", "may not be 0")
        idx = range(*slice(st, en, sp).indices(shape[ax]))
        out[ax] = len(idx)
        if len(idx):
            lo, hi = min(idx[0], idx[-1]), max(idx[0], idx[-1])
            offs[ax], sizes[ax], strides[ax] = lo, hi - lo + 1, sp
    if 0 in out or rank > 8 or rank == 0:
        raise _HostFallback(HOST_ELEMENT_WISE["empty" if 0 in out else "rank"]
                            + f" ({tuple(out)})")
    desc = dml.Slice1OperatorDesc(_tdesc(shape, dt), _tdesc(out, dt), tuple(offs),
                                  tuple(sizes), tuple(strides))
    lw.emit(desc, [node.input[0]], [node.output[0]], [(tuple(out), dt)])


def _lower_concat(lw: _Lowering, node):
    """Concat as DML_JOIN (inputs empty along the axis dropped; one left: an alias)."""
    names = [x for x in node.input if x]
    shape, dt = lw.info(names[0])
    rank = len(shape)
    axis = int(_attrs(node)["axis"])
    axis = axis + rank if axis < 0 else axis
    shapes = [tuple(lw.info(x)[0]) for x in names]
    if not 0 <= axis < rank or any(len(s) != rank or s[:axis] + s[axis + 1:] !=
                                   shape[:axis] + shape[axis + 1:] for s in shapes):
        raise ValidationError(f"Concat {node.name!r}: inputs", f"shapes {shapes} must match "
                              f"but along axis {axis}")
    keep = [(x, s) for x, s in zip(names, shapes) if s[axis]]
    out = list(shape)
    out[axis] = sum(s[axis] for _, s in keep)
    if not keep or 0 in out or rank > 8:
        raise _HostFallback(HOST_ELEMENT_WISE["empty" if not keep or 0 in out else "rank"]
                            + f" ({tuple(out)})")
    if len(keep) == 1:
        lw.emit(None, [keep[0][0]], [node.output[0]], [(tuple(out), dt)])
        return
    desc = dml.JoinOperatorDesc(tuple(_tdesc(s, dt) for _, s in keep), _tdesc(out, dt), axis)
    lw.emit(desc, [x for x, _ in keep], [node.output[0]], [(tuple(out), dt)])


def _split_sizes(node, lw: _Lowering, dim: int) -> list:
    """Split's part sizes: ``split`` (attribute before opset 13, else input 1), else
    ``num_outputs`` parts of ceil(dim / num_outputs) (the last smaller), else equal."""
    a = _attrs(node)
    split = a.get("split")
    if split is None and lw.param(node, 1) is not None:
        split = [int(v) for v in lw.param(node, 1).reshape(-1)]
    count = len(node.output)
    if split is None:
        if "num_outputs" in a:
            part = ceil_div(dim, int(a["num_outputs"]))
            split = [min(part, dim - part * i) for i in range(count)]
        else:
            split = [dim // count] * count
    if len(split) != count or sum(split) != dim or min(split) < 0:
        raise ValidationError(f"Split {node.name!r}: split", f"{list(split)} must give "
                              f"{count} sizes summing to the axis' {dim}")
    return list(split)


def _lower_split(lw: _Lowering, node):
    """Split as DML_SPLIT (an empty part, which DML cannot state, keeps it on the host)."""
    shape, dt = lw.info(node.input[0])
    rank = len(shape)
    axis = int(_attrs(node).get("axis", 0))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        raise ValidationError(f"Split {node.name!r}: axis", f"must be within the rank {rank}")
    sizes = _split_sizes(node, lw, shape[axis])
    outs = []
    for k in sizes:
        o = list(shape)
        o[axis] = k
        outs.append(tuple(o))
    if any(0 in o for o in outs) or rank > 8:
        raise _HostFallback(HOST_ELEMENT_WISE["empty" if rank <= 8 else "rank"]
                            + f" ({outs})")
    if len(outs) == 1:
        lw.emit(None, [node.input[0]], [node.output[0]], [(outs[0], dt)])
        return
    desc = dml.SplitOperatorDesc(_tdesc(shape, dt), tuple(_tdesc(o, dt) for o in outs), axis)
    lw.emit(desc, [node.input[0]], list(node.output), [(o, dt) for o in outs])


# -- gather and expand (constant indices and shapes) -----------------------------------------

#: The most DML_SLICE1 operators a Gather with constant indices is lowered to (one per run
#: of indices in arithmetic progression, joined by DML_JOIN): past it, a table lookup of
#: many scattered indices would be as many copies, and stays on the host.
GATHER_SLICES_MAX = 64

#: THE list of Gather cases that stay on the host: reason key -> why.  (An empty result or
#: more than 8 dimensions: :data:`HOST_ELEMENT_WISE`.)
HOST_GATHER: dict[str, str] = {
    "indices": "indices that are not constants (vkml has no DML_GATHER: constant indices "
               "run as DML_SLICE1 and DML_JOIN, chosen by their values)",
    "slices": f"indices forming more than {GATHER_SLICES_MAX} runs in arithmetic "
              f"progression (one DML_SLICE1 each, joined by DML_JOIN)",
}


def gather_runs(indices, n: int, name: str = "Gather") -> list:
    """Gather's indices (negatives count from the end of an axis of ``n``) as maximal runs
    ``(first, count, step)`` of a constant non-zero step, in order; each is one
    DML_SLICE1 ("Strides may not be 0": a repeated index starts a new run).
    ValidationError for an index outside [-n, n) (ONNX: out of bounds is an error)."""
    idx = [int(v) for v in np.asarray(indices).reshape(-1)]
    bad = [v for v in idx if not -n <= v < n]
    if bad:
        raise ValidationError(f"{name}: indices", f"must lie within [{-n}, {n - 1}] (the "
                              f"axis has {n} elements), got {bad[0]}")
    idx = [v + n if v < 0 else v for v in idx]
    runs, i = [], 0
    while i < len(idx):
        j = i + 1
        if j < len(idx) and idx[j] != idx[i]:
            step = idx[j] - idx[i]
            while j + 1 < len(idx) and idx[j + 1] - idx[j] == step:
                j += 1
            runs.append((idx[i], j - i + 1, step))
            i = j + 1
        else:
            runs.append((idx[i], 1, 1))
            i += 1
    return runs


def _lower_gather(lw: _Lowering, node):
    """Gather with constant indices as DML_SLICE1 along ``axis`` (a scalar index: a
    window of one, its axis dropped by an alias; indices in arithmetic progression: one
    window walked by a signed stride, SLICE1's page) or, for other indices, one SLICE1 per
    run joined by DML_JOIN; the result viewed as data.shape[:axis] + indices.shape +
    data.shape[axis + 1:] (an alias, no copy)."""
    shape, dt = lw.info(node.input[0])
    rank = len(shape)
    indices = lw.param(node, 1)
    axis = int(_attrs(node).get("axis", 0))
    if not -rank <= axis < rank:
        raise ValidationError(f"Gather {node.name!r}: axis", f"must lie within [{-rank}, "
                              f"{rank - 1}] for data of rank {rank}")
    axis = axis + rank if axis < 0 else axis
    runs = gather_runs(indices, shape[axis], f"Gather {node.name!r}")
    out_shape = tuple(shape[:axis]) + tuple(indices.shape) + tuple(shape[axis + 1:])
    mid = list(shape)
    mid[axis] = indices.size
    if 0 in mid or rank > 8 or len(out_shape) > 8:
        raise _HostFallback(HOST_ELEMENT_WISE["empty" if 0 in mid else "rank"]
                            + f" ({out_shape})")
    if len(runs) > GATHER_SLICES_MAX:
        raise _HostFallback(HOST_GATHER["slices"] + f" ({len(runs)})")
    mid = tuple(mid)
    out = node.output[0]
    joined = out if mid == out_shape else f"{out}#vkml_gathered"
    parts, made = [], {}
    for first, count, step in runs:
        if (first, count, step) in made:            # a repeated run: sliced once
            parts.append(made[first, count, step])
            continue
        part = joined if len(runs) == 1 else f"{out}#vkml_run{len(made)}"
        offs, sizes, strides = [0] * rank, list(shape), [1] * rank
        last = first + step * (count - 1)
        offs[axis], sizes[axis], strides[axis] = min(first, last), abs(last - first) + 1, step
        sliced = list(shape)
        sliced[axis] = count
        desc = dml.Slice1OperatorDesc(_tdesc(shape, dt), _tdesc(sliced, dt), tuple(offs),
                                      tuple(sizes), tuple(strides))
        lw.emit(desc, [node.input[0]], [part], [(tuple(sliced), dt)])
        made[first, count, step] = part
        parts.append(part)
    if len(runs) > 1:
        desc = dml.JoinOperatorDesc(tuple(_tdesc(lw.info(p)[0], dt) for p in parts),
                                    _tdesc(mid, dt), axis)
        lw.emit(desc, parts, [joined], [(mid, dt)])
    if joined != out:
        lw.emit(None, [joined], [out], [(out_shape, dt)])


def _lower_expand(lw: _Lowering, node):
    """Expand (constant or host-known shape) as DML_ELEMENT_WISE_IDENTITY reading its
    input broadcast by zero strides (ONNX's bidirectional broadcast, NumPy's); an output
    of the input's shape is an alias."""
    shape, dt = lw.info(node.input[0])
    want = tuple(int(v) for v in lw.param(node, 1).reshape(-1))
    try:
        out = tuple(np.broadcast_shapes(tuple(shape), want))
    except ValueError:
        raise ValidationError(f"Expand {node.name!r}: shape", f"{list(want)} does not "
                              f"broadcast with the input's {tuple(shape)}") from None
    if out == tuple(shape):
        lw.emit(None, [node.input[0]], [node.output[0]], [(out, dt)])
        return
    if len(out) > 8 or 0 in out:
        raise _HostFallback(HOST_ELEMENT_WISE["empty" if 0 in out else "rank"] + f" ({out})")
    desc = dml.ElementWiseIdentityOperatorDesc(_broadcast_tdesc(shape, out, dt),
                                               _tdesc(out, dt))
    lw.emit(desc, [node.input[0]], [node.output[0]], [(out, dt)])


# -- batch normalization ----------------------------------------------------------------------

_BN_FIELDS = ("input_tensor",) + tuple(STATISTICS)     # desc.inputs() order

#: THE list of BatchNormalization cases that stay on the host: reason key -> why.
HOST_BATCH_NORMALIZATION: dict[str, str] = {
    "training": "training_mode or the running mean/variance outputs (DML_BATCH_NORMALIZATION "
                "is the inference form; DML's training operator is not in vkml)",
    "rank": "an input of rank other than 2 to 8",
}


def _lower_batch_normalization(lw: _Lowering, node):
    """BatchNormalization (inference) as DML_BATCH_NORMALIZATION: ONNX's per-channel 1-D
    scale, bias, mean and variance viewed as (1, C, 1, ...), broadcast by their sizes of 1
    (the page)."""
    xs, dt = lw.info(node.input[0])
    a = _attrs(node)
    if int(a.get("training_mode", 0)) or any(o for o in node.output[1:]):
        raise _HostFallback(HOST_BATCH_NORMALIZATION["training"])
    if not 2 <= len(xs) <= 8 or 0 in xs:
        raise _HostFallback(HOST_BATCH_NORMALIZATION["rank"] + f" ({tuple(xs)})")
    stat = (1, xs[1]) + (1,) * (len(xs) - 2)
    for i in range(1, 5):
        if tuple(lw.info(node.input[i])[0]) != (xs[1],):
            raise ValidationError(f"BatchNormalization {node.name!r}: input {i}", f"must "
                                  f"have shape ({xs[1]},), got {lw.info(node.input[i])[0]}")
    t = _tdesc(stat, dt)
    desc = dml.BatchNormalizationOperatorDesc(
        _tdesc(xs, dt), t, t, t, t, _tdesc(xs, dt), spatial=True,
        epsilon=float(a.get("epsilon", 1e-5)))
    onnx_of = {"mean_tensor": node.input[3], "variance_tensor": node.input[4],
               "scale_tensor": node.input[1], "bias_tensor": node.input[2]}
    ins = [node.input[0]] + [onnx_of[n] for n in _BN_FIELDS[1:]]
    lw.emit(desc, ins, [node.output[0]], [(tuple(xs), dt)])


# -- reductions -------------------------------------------------------------------------------

#: ONNX Reduce* op -> its DML_REDUCE_FUNCTION (one to one: the same formula per function).
REDUCE_OPS = {"ReduceMean": "AVERAGE", "ReduceSum": "SUM", "ReduceMax": "MAX",
              "ReduceMin": "MIN", "ReduceProd": "MULTIPLY", "ReduceL1": "L1", "ReduceL2": "L2",
              "ReduceLogSum": "LOG_SUM", "ReduceLogSumExp": "LOG_SUM_EXP",
              "ReduceSumSquare": "SUM_SQUARE"}

#: THE list of Reduce* cases that stay on the host: reason key -> why.
HOST_REDUCE: dict[str, str] = {
    "rank": "more than 8 dimensions (DML_REDUCE takes 1 to 8)",
    "empty": "an empty input (DML sizes are at least 1; ONNX reduces it to the function's "
             "identity value)",
}


def _reduce_axes(node, lw: _Lowering, rank: int):
    """The reduced axes (sorted, non-negative), or None for ONNX's no-op (empty axes with
    noop_with_empty_axes=1: the output is the input).  Axes are an attribute before
    opset 18 (ReduceSum: 13), else input 1; absent or empty, every axis."""
    axes = _axes(node, lw, rank)        # read as Squeeze/Unsqueeze read theirs
    if not axes:
        noop = int(_attrs(node).get("noop_with_empty_axes", 0))
        return None if noop else list(range(rank))
    out = []
    for x in axes:
        if not 0 <= x < rank:
            raise ValidationError(f"{node.op_type} {node.name!r}: axes", f"axis {x} (a "
                                  f"negative one counted from the end) is outside the "
                                  f"input's rank {rank}")
        if x in out:
            raise ValidationError(f"{node.op_type} {node.name!r}: axes", f"names axis {x} "
                                  f"twice")
        out.append(x)
    return sorted(out)


def _lower_reduce(lw: _Lowering, node):
    """ReduceMean, ReduceSum, ReduceMax, ... as DML_REDUCE with the function of
    :data:`REDUCE_OPS`; keepdims=0 as an alias view of the kept-dimension output (the same
    elements in the same order)."""
    shape, dt = lw.info(node.input[0])
    shape = tuple(shape)
    rank = len(shape)
    axes = _reduce_axes(node, lw, rank)
    if axes is None:
        lw.emit(None, [node.input[0]], [node.output[0]], [(shape, dt)])
        return
    if rank > 8:
        raise _HostFallback(HOST_REDUCE["rank"] + f" ({rank})")
    if 0 in shape:
        raise _HostFallback(HOST_REDUCE["empty"] + f" ({shape})")
    view = shape or (1,)
    axes = axes or [0]                              # a scalar: reduce its one element
    kept = dml.reduce_output_sizes(view, axes)
    keepdims = int(_attrs(node).get("keepdims", 1))
    out = tuple(kept[:rank]) if keepdims else tuple(s for i, s in enumerate(shape)
                                                    if i not in axes)
    desc = dml.ReduceOperatorDesc(REDUCE_OPS[node.op_type], _tdesc(view, dt),
                                  _tdesc(kept, dt), tuple(axes))
    lw.emit(desc, [node.input[0]], [node.output[0]], [(out, dt)])


# -- softmax --------------------------------------------------------------------------------

def _lower_softmax(lw: _Lowering, node):
    """Softmax as DML_ACTIVATION_SOFTMAX1 over ``axes``: opset 13 on ``axis`` alone;
    before it the input is coerced to 2-D at ``axis`` (default 1), so the axes are
    ``axis`` to the last, normalized jointly."""
    shape, dt = lw.info(node.input[0])
    rank = len(shape)
    opset13 = lw.opset >= 13
    axis = int(_attrs(node).get("axis", -1 if opset13 else 1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < max(rank, 1):
        raise ValidationError(f"Softmax {node.name!r}: axis", f"must be within the rank "
                              f"{rank}")
    if rank > 8 or 0 in shape:
        raise _HostFallback(HOST_ELEMENT_WISE["rank" if rank > 8 else "empty"])
    view = tuple(shape) or (1,)
    axes = (axis,) if opset13 else tuple(range(axis, len(view)))
    t = _tdesc(view, dt)
    desc = dml.ActivationSoftmax1OperatorDesc(t, t, axes)
    lw.emit(desc, [node.input[0]], [node.output[0]], [(tuple(shape), dt)])


# -- activations ------------------------------------------------------------------------------

#: THE list of ONNX activation cases that DML cannot express: they run on the host (placed
#: there at ``prepare`` when their parameters are constants, else listed in
#: ``rep.fallbacks`` at ``run``).  Reason key -> why.
HOST_ACTIVATIONS: dict[str, str] = {
    "gelu_tanh": 'Gelu approximate="tanh": DML_ACTIVATION_GELU is the erf form only',
    "refused": "parameters the DML descriptor refuses (its rule, e.g. Celu alpha=0: "
               "DML_ACTIVATION_CELU divides by Alpha; NaN bounds of Clip)",
    "dtype": "a data type other than float32/float16 (the activation operators' only types; "
             "Identity of other types is an alias, on the device)",
    "rank": "more than 8 dimensions (DML tensors have 1 to 8)",
    "empty": "an empty tensor (DML sizes are at least 1)",
}


def _host_activation(key: str, detail: str = "") -> _HostFallback:
    return _HostFallback(HOST_ACTIVATIONS[key] + (f" ({detail})" if detail else ""))


def _clip_bounds(node, a, param):
    if "min" in a or "max" in a:                   # opset 6: attributes
        return a.get("min", -dml.FLT_MAX), a.get("max", dml.FLT_MAX)

    def get(i, default):
        v = param(i)
        return default if v is None else float(np.asarray(v).reshape(-1)[0])
    return get(1, -dml.FLT_MAX), get(2, dml.FLT_MAX)


#: ONNX activation op -> f(attributes) giving (DML activation name, its parameters).
#: Each runs through ``vkml.dml.OPERATOR_ACTIVATIONS[name]``: standalone (its tensors set),
#: or fused into the convolution before it by the graph compiler (``Device.compile_graph``;
#: swish and hard_swish too, beyond DML's fused-activation page).
ACTIVATION_OPS = {
    "Relu": lambda a: ("relu", {}),
    "LeakyRelu": lambda a: ("leaky_relu", {"alpha": a.get("alpha", 0.01)}),
    "Sigmoid": lambda a: ("sigmoid", {}),
    "Tanh": lambda a: ("tanh", {}),
    "HardSigmoid": lambda a: ("hard_sigmoid", {"alpha": a.get("alpha", 0.2),
                                               "beta": a.get("beta", 0.5)}),
    "Elu": lambda a: ("elu", {"alpha": a.get("alpha", 1.0)}),
    "Selu": lambda a: ("scaled_elu", {"alpha": a.get("alpha", 1.67326319217681884765625),
                                      "gamma": a.get("gamma", 1.05070102214813232421875)}),
    "Celu": lambda a: ("celu", {"alpha": a.get("alpha", 1.0)}),
    "Softplus": lambda a: ("softplus", {"steepness": 1.0}),
    "Softsign": lambda a: ("softsign", {}),
    "ThresholdedRelu": lambda a: ("thresholded_relu", {"alpha": a.get("alpha", 1.0)}),
    "Shrink": lambda a: ("shrink", {"bias": a.get("bias", 0.0),
                                    "threshold": a.get("lambd", 0.5)}),
    "Gelu": lambda a: ("gelu", {}),
    "HardSwish": lambda a: ("hard_swish", {}),
    "Swish": lambda a: ("swish", {"sigmoid_input_scale": a.get("alpha", 1.0)}),
    "Clip": None,                                  # bounds: attributes or inputs 1, 2
    "Identity": lambda a: ("identity", {}),
}


def _activation_desc(node, param):
    """The vkml.dml activation descriptor (tensors None) for an ONNX activation node;
    ``param(i)`` gives the host value of input i (None: absent).  Raises _HostFallback
    with a :data:`HOST_ACTIVATIONS` reason where DML cannot express it."""
    a = _attrs(node)
    if node.op_type == "Gelu" and _s(a.get("approximate", "none")) != "none":
        raise _host_activation("gelu_tanh")
    if node.op_type == "Clip":
        lo, hi = _clip_bounds(node, a, param)
        name, params = "clip", {"min": lo, "max": hi}
    else:
        name, params = ACTIVATION_OPS[node.op_type](a)
    desc = dml.OPERATOR_ACTIVATIONS[name](**params)
    try:
        desc.validate_parameters(desc.fail)
    except ValidationError as exc:
        raise _host_activation("refused", f"{exc.field}: {exc.rule}") from None
    return desc


def _lower_activation(lw: _Lowering, node):
    shape, dt = lw.info(node.input[0])
    if np.dtype(dt) not in _FLOATS:
        raise _host_activation("dtype", str(np.dtype(dt)))
    if len(shape) > 8:
        raise _host_activation("rank", str(len(shape)))
    if 0 in shape:
        raise _host_activation("empty", str(tuple(shape)))
    desc = _activation_desc(node, lambda i: lw.param(node, i))
    t = _tdesc(tuple(shape) or (1,), dt)            # a scalar runs as one element
    lw.emit(desc.standalone(t, t), [node.input[0]], [node.output[0]], [(tuple(shape), dt)])


_FLOATS = {np.dtype(np.float32), np.dtype(np.float16)}
_ALL = {np.dtype(t) for t in ("float32", "float16", "float64", "int8", "int16", "int32",
                              "int64", "uint8", "uint16", "uint32", "uint64")}


@dataclass(frozen=True)
class DeviceOp:
    """How an ONNX op runs on the device: its lowering, the data types of its tensor input
    0 it takes, and which inputs are parameters (read on the host when lowering)."""

    lower: object
    dtypes: frozenset
    params: tuple = ()          # indices of inputs read as host values
    tensors: tuple = (0,)       # indices of inputs bound as device tensors


#: THE list of ONNX ops that run on the vkml device (op type -> DeviceOp).  Activations
#: run as operators of their own (fused into a Conv/ConvTranspose before them by the graph
#: compiler where it is their only consumer); :data:`HOST_ACTIVATIONS` lists what stays on
#: the host.
DEVICE_OPS: dict[str, DeviceOp] = {
    "Pad": DeviceOp(_lower_pad, frozenset(_ALL), params=(1, 2, 3)),
    "Conv": DeviceOp(_lower_conv, frozenset(_FLOATS), tensors=(0, 1, 2)),
    "ConvTranspose": DeviceOp(_lower_conv, frozenset(_FLOATS), tensors=(0, 1, 2)),
    "LpPool": DeviceOp(_lower_lp_pool, frozenset(_FLOATS)),
    "Col2Im": DeviceOp(_lower_col2im, frozenset(_ALL), params=(1, 2)),
    "Identity": DeviceOp(_lower_identity, frozenset(_ALL)),
}
DEVICE_OPS.update({op: DeviceOp(_lower_alias, frozenset(_ALL), params=(1, 2))
                   for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Dropout")})
_MAX_POOL = frozenset(_FLOATS | {np.dtype(np.int8), np.dtype(np.uint8)})
DEVICE_OPS.update({"MaxPool": DeviceOp(_lower_pool, _MAX_POOL),
                   "GlobalMaxPool": DeviceOp(_lower_pool, _MAX_POOL),
                   "AveragePool": DeviceOp(_lower_pool, frozenset(_FLOATS)),
                   "GlobalAveragePool": DeviceOp(_lower_pool, frozenset(_FLOATS))})
DEVICE_OPS["Transpose"] = DeviceOp(_lower_transpose, frozenset(_ALL))
DEVICE_OPS["Slice"] = DeviceOp(_lower_slice, frozenset(_ALL), params=(1, 2, 3, 4))
DEVICE_OPS["Concat"] = DeviceOp(_lower_concat, frozenset(_ALL), tensors=tuple(range(64)))
DEVICE_OPS["Split"] = DeviceOp(_lower_split, frozenset(_ALL), params=(1,))
DEVICE_OPS["Softmax"] = DeviceOp(_lower_softmax, frozenset(_FLOATS))
# float32/float16, which every DML reduce function takes (AVERAGE, L2 and the LOG_SUMs take
# no integers): integer reductions stay on the host
DEVICE_OPS.update({op: DeviceOp(_lower_reduce, frozenset(_FLOATS), params=(1,))
                   for op in REDUCE_OPS})
DEVICE_OPS["BatchNormalization"] = DeviceOp(_lower_batch_normalization, frozenset(_FLOATS),
                                            tensors=(0, 1, 2, 3, 4))
DEVICE_OPS["Gather"] = DeviceOp(_lower_gather, frozenset(_ALL), params=(1,))
DEVICE_OPS["Expand"] = DeviceOp(_lower_expand, frozenset(_ALL), params=(1,))
#: the DML element-wise operators' types (no float64: HOST_ELEMENT_WISE)
_ARITH = frozenset(_ALL - {np.dtype(np.float64)})
DEVICE_OPS.update({op: DeviceOp(_lower_element_wise, _ARITH, tensors=tuple(range(8)))
                   for op in BINARY_OPS})
DEVICE_OPS.update({op: DeviceOp(_lower_activation, frozenset(_FLOATS),
                                params=(1, 2) if op == "Clip" else ())
                   for op in ACTIVATION_OPS if op != "Identity"})


# -- GEMM: Gemm and MatMul --------------------------------------------------------------------

#: THE list of Gemm/MatMul cases that stay on the host: reason key -> why.
HOST_GEMM: dict[str, str] = {
    "empty": "an empty operand or output (DML sizes are at least 1; an empty K would "
             "give zeros)",
    "batch": "MatMul batch dimensions that do not fold into DML_GEMM's two (BatchCount, "
             "ChannelCount): more than two after merging the dimensions whose strides "
             "allow it",
}


def _gemm_tdesc(dt, sizes, strides) -> dml.TensorDesc:
    """A GEMM operand: packed strides stated as None (the plain descriptor)."""
    sizes, strides = tuple(sizes), tuple(strides)
    return dml.TensorDesc(dml.DataType.of(np.dtype(dt)), sizes,
                          None if strides == dml.packed_strides(sizes) else strides)


def _lower_gemm(lw: _Lowering, node):
    """Gemm as DML_GEMM: ``Y = alpha * A' B' + beta * C`` (the GEMM page's formula) with
    TransA/TransB as DML_MATRIX_TRANSFORM; C of any shape ONNX's unidirectional rule lets
    broadcast to (M, N) is viewed with (M, N) sizes and stride 0 along its broadcast
    dimensions ("CTensor and OutputTensor must have the same Sizes")."""
    (a_s, dt), (b_s, _) = lw.info(node.input[0]), lw.info(node.input[1])
    a = _attrs(node)
    trans_a, trans_b = int(a.get("transA", 0)), int(a.get("transB", 0))
    if len(a_s) != 2 or len(b_s) != 2:
        raise ValidationError(f"Gemm {node.name!r}: inputs", f"A and B must be 2-D, got "
                              f"{tuple(a_s)} and {tuple(b_s)}")
    m, k = (a_s[1], a_s[0]) if trans_a else (a_s[0], a_s[1])
    kb, n = (b_s[1], b_s[0]) if trans_b else (b_s[0], b_s[1])
    if k != kb:
        raise ValidationError(f"Gemm {node.name!r}: B", f"K of B ({kb}) must equal K of A "
                              f"({k})")
    has_c = len(node.input) > 2 and bool(node.input[2])
    c = None
    if has_c:
        c_s = tuple(lw.info(node.input[2])[0])
        if len(c_s) > 2 or any(s not in (1, w) for s, w in zip(c_s[::-1], (n, m))):
            raise ValidationError(f"Gemm {node.name!r}: C", f"shape {c_s} must broadcast "
                                  f"to ({m}, {n}) (ONNX's unidirectional rule)")
        if 0 in c_s:
            raise _HostFallback(HOST_GEMM["empty"] + f" (C {c_s})")
        c = _broadcast_tdesc(c_s, (m, n), dt)
    if 0 in (m, k, n):
        raise _HostFallback(HOST_GEMM["empty"] + f" (M, K, N = {m}, {k}, {n})")
    desc = dml.GemmOperatorDesc(
        _tdesc(a_s, dt), _tdesc(b_s, dt), c, _tdesc((m, n), dt),
        trans_a=dml.MatrixTransform(trans_a), trans_b=dml.MatrixTransform(trans_b),
        alpha=float(a.get("alpha", 1.0)), beta=float(a.get("beta", 1.0)) if has_c else 0.0)
    lw.emit(desc, [node.input[0], node.input[1], node.input[2] if has_c else None],
            [node.output[0]], [((m, n), dt)])


def _merge_batch(dims) -> list:
    """MatMul's batch dimensions ``(size, a_stride, b_stride)`` with the dimensions of
    size 1 dropped and each pair merged where both operands' strides run on from one
    into the next (``stride[i] == stride[i + 1] * size[i + 1]``, a zero stride after a
    zero stride too): the same elements under fewer dimensions."""
    out = []
    for size, sa, sb in dims:
        if size == 1:
            continue
        if out:
            ps, pa, pb = out[-1]
            if pa == sa * size and pb == sb * size:
                out[-1] = (ps * size, sa, sb)
                continue
        out.append((size, sa, sb))
    return out


def _lower_matmul(lw: _Lowering, node):
    """MatMul (NumPy's matmul) as DML_GEMM: a 1-D A is a row (1, K), a 1-D B a column
    (K, 1), both viewed without a copy and the added dimension dropped from the output;
    batch dimensions broadcast by stride 0.  Where B has no batch, A's batch dimensions
    fold into M (one product); else they merge as their strides allow into GEMM's
    {BatchCount, ChannelCount}."""
    (a_s, dt), (b_s, _) = lw.info(node.input[0]), lw.info(node.input[1])
    a_s, b_s = tuple(a_s), tuple(b_s)
    if not a_s or not b_s:
        raise ValidationError(f"MatMul {node.name!r}: inputs", "must be at least 1-D")
    a2 = (1,) + a_s if len(a_s) == 1 else a_s
    b2 = b_s + (1,) if len(b_s) == 1 else b_s
    (m, k), (kb, n) = a2[-2:], b2[-2:]
    try:
        batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    except ValueError:
        batch = None
    if k != kb or batch is None:
        raise ValidationError(f"MatMul {node.name!r}: inputs", f"shapes {a_s} and {b_s} do "
                              "not multiply (NumPy's matmul rules)")
    out_shape = batch + ((m,) if len(a_s) > 1 else ()) + ((n,) if len(b_s) > 1 else ())
    if 0 in batch + (m, k, n):
        raise _HostFallback(HOST_GEMM["empty"] + f" ({a_s} x {b_s})")
    if math.prod(b2[:-2]) == 1:                    # B is one matrix: A's batch joins M
        rows = math.prod(a2[:-1])
        desc = dml.GemmOperatorDesc(_tdesc((rows, k), dt), _tdesc((k, n), dt), None,
                                    _tdesc((rows, n), dt))
    else:
        dims = []
        for shape in (a2, b2):
            packed = dml.packed_strides(shape)
            lead = len(batch) - (len(shape) - 2)
            dims.append([0] * lead + [0 if s == 1 else p for s, p in
                                      zip(shape[:-2], packed[:-2])])
        merged = _merge_batch(zip(batch, *dims))
        if len(merged) > 2:
            raise _HostFallback(HOST_GEMM["batch"] + f" ({a_s} x {b_s})")
        sizes = [s for s, _, _ in merged]
        y_sizes = tuple(sizes) + (m, n)
        desc = dml.GemmOperatorDesc(
            _gemm_tdesc(dt, tuple(sizes) + (m, k), [sa for _, sa, _ in merged] + [k, 1]),
            _gemm_tdesc(dt, tuple(sizes) + (k, n), [sb for _, _, sb in merged] + [n, 1]),
            None, _tdesc(y_sizes, dt))
    lw.emit(desc, [node.input[0], node.input[1]], [node.output[0]], [(out_shape, dt)])


# -- Resize and Upsample ----------------------------------------------------------------------

#: THE list of Resize/Upsample cases that stay on the host: reason key -> why.
HOST_RESIZE: dict[str, str] = {
    "cubic": 'mode "cubic" (DML_INTERPOLATION_MODE has nearest neighbour and linear only)',
    "crop": 'coordinate_transformation_mode "tf_crop_and_resize" (a region of interest and '
            "an extrapolation value outside it: RESAMPLE1 clamps to the input's edges)",
    "antialias": "antialias=1 when a dimension is scaled down in linear mode (a widened "
                 "filter: RESAMPLE1 reads 2 neighbours per dimension)",
    "exclude_outside": "exclude_outside=1 in linear mode (ONNX renormalizes the weights "
                       "inside the input; RESAMPLE1 clamps)",
    "int_linear": "linear mode on int8/uint8 (ONNX Runtime truncates the interpolated "
                  "value; RESAMPLE1 rounds it to nearest)",
    "rank": "more than 4 dimensions that change (RESAMPLE1 takes 1 to 4; dimensions "
            "copied as they are merge into one)",
    "empty": "an empty input or output (DML sizes are at least 1)",
    "fractional": "align_corners (or pytorch_half_pixel to one element) with scales whose "
                  "in * scale is not a whole length: ONNX's reference takes that fractional "
                  "length, ONNX Runtime the output size",
    "nearest_ties": "a nearest_mode whose ties RESAMPLE1 cannot reach for these sizes "
                    "(RESAMPLE1 rounds halves up; round_prefer_floor and ceil map by an "
                    "offset that is exact only where no coordinate lies within it of a "
                    "tie, checked output by output when lowering)",
}


def _resize_attrs(node) -> dict:
    a = {k: _s(v) for k, v in _attrs(node).items()}
    return {"mode": str(a.get("mode", "nearest")).lower(),
            "ctm": str(a.get("coordinate_transformation_mode", "half_pixel")).lower(),
            "nearest_mode": str(a.get("nearest_mode", "round_prefer_floor")).lower(),
            "antialias": int(a.get("antialias", 0)), "axes": a.get("axes"),
            "exclude_outside": int(a.get("exclude_outside", 0)),
            "policy": str(a.get("keep_aspect_ratio_policy", "stretch")).lower()}


def resize_refusal(node, dtype) -> str | None:
    """The :data:`HOST_RESIZE` reason a Resize/Upsample node's attributes and data type
    alone give (at placement), or None."""
    a = _resize_attrs(node)
    if a["mode"] == "cubic":
        return HOST_RESIZE["cubic"]
    if node.op_type == "Resize" and a["ctm"] == "tf_crop_and_resize":
        return HOST_RESIZE["crop"]
    if a["mode"] != "nearest" and a["exclude_outside"]:
        return HOST_RESIZE["exclude_outside"]
    if a["mode"] != "nearest" and dtype is not None and np.dtype(dtype).kind in "iu":
        return HOST_RESIZE["int_linear"]
    return None


def _resize_targets(lw: _Lowering, node, shape, axes):
    """(scales or None, output sizes) of a Resize/Upsample: its ``scales`` (attribute
    before opset 9, else input 1 or, from opset 11, input 2) or ``sizes`` (input 3),
    given for ``axes`` (the rest keep scale 1 and their size).  Output sizes from scales
    are ``floor(in * scale)`` in float32, as ONNX Runtime computes them;
    keep_aspect_ratio_policy "not_larger"/"not_smaller" takes one scale for every axis,
    the smallest/largest of ``sizes / in``, and sizes ``round_half_up(scale * in)``
    (ONNX's reference), the scale mapping the coordinates."""
    rank = len(shape)
    a = _attrs(node)
    if "scales" in a:                               # Upsample-7
        scales, sizes = a["scales"], None
    else:
        i = 1 if node.op_type == "Upsample" or lw.opset < 11 else 2
        scales, sizes = lw.param(node, i), lw.param(node, 3)
    scales = None if scales is None or not np.size(scales) else \
        [float(v) for v in np.asarray(scales, np.float32).reshape(-1)]
    sizes = None if sizes is None or not np.size(sizes) else \
        [int(v) for v in np.asarray(sizes).reshape(-1)]
    if (scales is None) == (sizes is None):
        raise ValidationError(f"{node.op_type} {node.name!r}: scales/sizes", "exactly one "
                              "of them must be given (non-empty)")
    given = scales if sizes is None else sizes
    if len(given) != len(axes):
        raise ValidationError(f"{node.op_type} {node.name!r}: scales/sizes", f"must have "
                              f"{len(axes)} entries (one per axis), got {len(given)}")
    full_scales = [1.0] * rank
    out = list(shape)
    for ax, v in zip(axes, given):
        if sizes is None:
            if not v > 0:
                raise ValidationError(f"{node.op_type} {node.name!r}: scales", f"must be "
                                      f"> 0, got {scales}")
            full_scales[ax] = v
            out[ax] = int(np.float32(v) * np.float32(shape[ax]))
        elif v < 0:
            raise ValidationError(f"{node.op_type} {node.name!r}: sizes", f"must be >= 0, "
                                  f"got {sizes}")
        else:
            out[ax] = v
    policy = _resize_attrs(node)["policy"]
    if sizes is not None and policy != "stretch":
        ratios = [v / shape[ax] for ax, v in zip(axes, sizes)]
        scale = min(ratios) if policy == "not_larger" else max(ratios)
        for ax in axes:
            full_scales[ax] = scale
            out[ax] = int(scale * shape[ax] + 0.5)
        return full_scales, out
    return (full_scales if sizes is None else None), out


def _nearest_onnx(n_in, n_out, s, ctm, nearest_mode) -> np.ndarray:
    """ONNX's nearest input index of every output coordinate, clamped to the input, in
    exact rational arithmetic (``s``: a Fraction) so that its ties are ties."""
    half = Fraction(1, 2)

    def coordinate(o):
        if ctm == "half_pixel" or ctm == "pytorch_half_pixel" and n_out > 1:
            return (o + half) / s - half
        if ctm == "align_corners":
            return Fraction(o * (n_in - 1), n_out - 1) if n_out > 1 else Fraction(0)
        if ctm == "tf_half_pixel_for_nn":
            return (o + half) / s
        if ctm == "half_pixel_symmetric":
            return n_in * half * (1 - n_out / (s * n_in)) + (o + half) / s - half
        return o / s if ctm == "asymmetric" else Fraction(0)
    pick = {"round_prefer_floor": lambda v: math.ceil(v - half),
            "round_prefer_ceil": lambda v: math.floor(v + half),
            "floor": math.floor, "ceil": math.ceil}[nearest_mode]
    return np.clip([pick(coordinate(o)) for o in range(n_out)], 0, n_in - 1)


def _nearest_kernel(o, n_in, scale, in_offset, out_offset):
    """The nearest index RESAMPLE1's kernel takes (``CompiledResample.indices``: float32
    ``o * a + b`` clamped to [-1, n], then ``floor(x + 0.5)`` as ``f + (x - f >= 0.5)``)."""
    a, b = coordinate_map(scale, in_offset, out_offset)
    xf = np.clip(input_coordinates(o, a, b), np.float32(-1), np.float32(n_in))
    f = np.floor(xf)
    return np.clip(f.astype(np.int64) + (xf - f >= np.float32(0.5)), 0, n_in - 1)


def _resize_geometry(node, shape, out, scales, a, opset):
    """Per dimension RESAMPLE1's (scale, input offset, output offset): ONNX's modes through
    ``onnx_resize_geometry`` (before opset 11: asymmetric, and ONNX Runtime's nearest
    rounding then, floor scaling up and ceil scaling down); nearest indices checked
    against ONNX's formula output by output."""
    old = node.op_type == "Upsample" or opset < 11
    ctm = "asymmetric" if old else a["ctm"]
    geo = []
    for k, (n_in, n_out) in enumerate(zip(shape, out)):
        s = None if scales is None else scales[k]
        if s is not None and abs(n_in * s - n_out) > 1e-5 * n_out and (
                ctm == "align_corners" and n_in > 1 and n_out > 1 or
                ctm == "pytorch_half_pixel" and n_out == 1 < n_in * s):
            raise _HostFallback(HOST_RESIZE["fractional"] + f" (axis {k}: {n_in} x {s})")
        mode = a["nearest_mode"]
        if old:
            mode = "floor" if (s if s is not None else n_out / n_in) >= 1 else "ceil"
        g = onnx_resize_geometry([n_in], [n_out], None if s is None else [s],
                                 coordinate_transformation_mode=ctm, nearest_mode=mode,
                                 mode="nearest" if a["mode"] == "nearest" else "linear")
        g = tuple(v[0] for v in g)
        if a["mode"] == "nearest" and n_in > 1 and g != (1.0, 0.0, 0.0):
            exact = Fraction(n_out, n_in) if s is None else Fraction(s)
            want = _nearest_onnx(n_in, n_out, exact, ctm, mode)
            if not np.array_equal(want, _nearest_kernel(np.arange(n_out), n_in, *g)):
                raise _HostFallback(HOST_RESIZE["nearest_ties"] + f" ({mode}, axis {k}: "
                                    f"{n_in} -> {n_out})")
        geo.append(g)
    return geo


def _lower_resize(lw: _Lowering, node):
    """Resize (opsets 10 to 19) and Upsample (7, 9) as DML_RESAMPLE1: ONNX's coordinate
    transformation as RESAMPLE1's scale and pixel offsets (``onnx_resize_geometry`` says
    which map exactly), ``axes`` expanded to every dimension; dimensions copied as they
    are (size 1 to 1, or scale 1 and the same size) merge with copied neighbours, so a
    5-D resize of 3 dimensions runs as 4-D.  :data:`HOST_RESIZE` lists the rest."""
    shape, dt = lw.info(node.input[0])
    shape = tuple(shape)
    rank = len(shape)
    a = _resize_attrs(node)
    why = resize_refusal(node, dt)
    if why:
        raise _HostFallback(why)
    axes = list(range(rank)) if a["axes"] is None else \
        [int(x) + rank if int(x) < 0 else int(x) for x in a["axes"]]
    scales, out = _resize_targets(lw, node, shape, axes)
    if 0 in shape or 0 in out or rank == 0:
        raise _HostFallback(HOST_RESIZE["empty"] + f" ({shape} -> {tuple(out)})")
    if a["mode"] != "nearest" and a["antialias"] and any(o < i for i, o in zip(shape, out)):
        raise _HostFallback(HOST_RESIZE["antialias"])
    geo = _resize_geometry(node, shape, out, scales, a, lw.opset)
    view_in, view_out, view_geo = [], [], []
    for n_in, n_out, g in zip(shape, out, geo):
        copy = n_in == n_out and (n_in == 1 or g == (1.0, 0.0, 0.0))
        if copy and view_geo and view_geo[-1] is None:
            view_in[-1] *= n_in
            view_out[-1] *= n_out
            continue
        view_in.append(n_in), view_out.append(n_out), view_geo.append(None if copy else g)
    out = tuple(out)
    if all(g is None for g in view_geo):            # nothing moves: an alias
        lw.emit(None, [node.input[0]], [node.output[0]], [(out, dt)])
        return
    if len(view_in) > 4:
        raise _HostFallback(HOST_RESIZE["rank"] + f" ({shape} -> {out})")
    view_geo = [(1.0, 0.0, 0.0) if g is None else g for g in view_geo]
    mode = dml.InterpolationMode.NEAREST_NEIGHBOR if a["mode"] == "nearest" else \
        dml.InterpolationMode.LINEAR
    desc = dml.Resample1OperatorDesc(
        _tdesc(view_in, dt), _tdesc(view_out, dt), mode, tuple(g[0] for g in view_geo),
        tuple(g[1] for g in view_geo), tuple(g[2] for g in view_geo))
    lw.emit(desc, [node.input[0]], [node.output[0]], [(out, dt)])


#: Gemm and MatMul as DML_GEMM (float32/float16: GEMM's types), Resize and Upsample as
#: DML_RESAMPLE1 (its types): HOST_GEMM and HOST_RESIZE list what stays on the host.
DEVICE_OPS["Gemm"] = DeviceOp(_lower_gemm, frozenset(_FLOATS), tensors=(0, 1, 2))
DEVICE_OPS["MatMul"] = DeviceOp(_lower_matmul, frozenset(_FLOATS), tensors=(0, 1))
_RESAMPLE = frozenset(_FLOATS | {np.dtype(np.int8), np.dtype(np.uint8)})
DEVICE_OPS.update({op: DeviceOp(_lower_resize, _RESAMPLE, params=(1, 2, 3))
                   for op in ("Resize", "Upsample")})


# -- a lowered device partition as one DML graph ---------------------------------------------

#: Descriptor fields of each input slot (to mark constant inputs OWNED_BY_DML).
_INPUT_FIELDS = {dml.ConvolutionOperatorDesc: ("input_tensor", "filter_tensor", "bias_tensor"),
                 **{cls: ("a_tensor", "b_tensor") for cls in BINARY_OPS.values()},
                 dml.BatchNormalizationOperatorDesc: _BN_FIELDS}
_INPUT_FIELDS[dml.GemmOperatorDesc] = ("a_tensor", "b_tensor", "c_tensor")


@dataclass
class _Lowered:
    """A device partition lowered to a DML graph: the GraphDesc; the value names of its
    graph inputs (in order) and which of them are constants (OWNED_BY_DML, with values);
    per graph output its value names; (shape, dtype) of every value; aliases (an output
    that is an input value, e.g. Identity of an int tensor); per graph node the index of
    the ONNX node (in the partition) it comes from."""

    graph: object
    inputs: list
    constants: dict
    outputs: list
    infos: dict
    aliases: dict
    origins: list


def _owned_input(desc, fields, slot):
    """``desc`` with input ``slot`` flagged OWNED_BY_DML (a constant); JOIN's inputs are
    one tuple field."""
    if isinstance(desc, dml.JoinOperatorDesc):
        ts = list(desc.input_tensors)
        ts[slot] = replace(ts[slot], flags=dml.TensorFlags.OWNED_BY_DML)
        return replace(desc, input_tensors=tuple(ts))
    t = getattr(desc, fields[slot])
    return replace(desc, **{fields[slot]: replace(t, flags=dml.TensorFlags.OWNED_BY_DML)})


def _lower_graph(steps: list, outputs: list, consts: dict, infos: dict) -> _Lowered:
    """Steps -> a ``vkml.dml.GraphDesc``: a step's input read from another step is an
    intermediate edge, else a graph input (OWNED_BY_DML when a constant); the partition's
    outputs (and outputs nothing reads) are graph outputs."""
    alias: dict = {}

    def res(name):
        while name in alias:
            name = alias[name]
        return name

    producer: dict = {}
    nodes, origins, in_names = [], [], []
    in_edges, inter = [], []
    read = set()
    for st in steps:
        if st.desc is None:
            alias[st.outputs[0]] = res(st.inputs[0])
            continue
        i = len(nodes)
        desc = st.desc
        fields = _INPUT_FIELDS.get(type(desc), ("input_tensor",))
        for slot, name in enumerate(st.inputs):
            if not name:
                continue
            name = res(name)
            if name in producer:
                inter.append(dml.IntermediateGraphEdgeDesc(*producer[name], i, slot))
                read.add(producer[name])
                continue
            if name not in in_names:
                in_names.append(name)
            in_edges.append(dml.InputGraphEdgeDesc(in_names.index(name), i, slot))
            if name in consts:
                desc = _owned_input(desc, fields, slot)
        for k, name in enumerate(st.outputs):
            producer[name] = (i, k)
        nodes.append(dml.OperatorGraphNodeDesc(desc, name=st.outputs[0]))
        origins.append(st.origin)
    out_of: dict = {}                  # (node, output) -> graph output index
    out_names: list = []
    aliases = {}
    for name in outputs:
        r = res(name)
        if r not in producer:
            aliases[name] = r
            continue
        g = out_of.setdefault(producer[r], len(out_of))
        if g == len(out_names):
            out_names.append([])
        out_names[g].append(name)
    for name, src in producer.items():           # outputs nothing reads: bound anyway
        if src not in read and src not in out_of:
            out_of[src] = len(out_of)
            out_names.append([name])
    graph = None
    if nodes:
        graph = dml.GraphDesc(
            input_count=len(in_names), output_count=len(out_of), nodes=nodes,
            input_edges=in_edges, intermediate_edges=inter,
            output_edges=[dml.OutputGraphEdgeDesc(i, k, g) for (i, k), g in out_of.items()])
    return _Lowered(graph, in_names, {n: consts[n] for n in in_names if n in consts},
                    out_names, infos, aliases, origins)


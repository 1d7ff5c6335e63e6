"""``vkml.onnx``: an ONNX backend (``onnx.backend.base.Backend``) running models on a vkml device.

    import vkml.onnx
    rep = vkml.onnx.prepare("model.onnx", device="VKML:0")   # or a vkml.Device
    (y,) = rep.run([x])
    rep.partitions     # [("host", [("pads_concat", "Concat"), ...]), ("device", [...]), ...]

How a model runs (``prepare``), one module each:

1. ``load``: the model is parsed (a path, bytes or a ``ModelProto``) and checked with
   ``onnx.checker``; a malformed or truncated model raises :class:`vkml.ValidationError`
   whose field is ``"model"`` and whose rule says what is wrong.  External data is read
   from the model's folder only (a model given by path), each file inside it.
2. ``fold``: nodes whose inputs are all constant (initializers, ``Constant``, and what is
   computed from them: the ``Constant/ConstantOfShape/Concat/Reshape/Slice/Cast`` chains
   ``torch.onnx.export`` writes for ``Pad``'s pads) are evaluated once by ONNX's own
   reference evaluator (``onnx.reference.ReferenceEvaluator``) and become constants, each
   only where its outputs fit ``fold.fold_limit`` (ValidationError naming the node).
   Shape-only subgraphs fold too: ``Shape`` (its start/end) and ``Size`` of a value whose
   dimensions are static (the model's declared input shapes, through ONNX shape inference)
   are constants, and so is what is computed from them (Gather, Unsqueeze, Concat, Slice,
   Cast, arithmetic, ConstantOfShape, Range, Equal/Where), so that Reshape, Slice and
   Expand get constant parameters.  ``rep.folded`` lists every folded node as ``(index,
   node)`` (``len(rep.folded)``: how many); a Shape of a symbolic dimension stays.
3. ``rewrite``: graph rewrites beyond DirectML's documented fusions, each listed in
   ``rep.rewrites`` (:class:`Rewrite`: its kind, the ONNX nodes it absorbed, the node
   that replaces them): a BatchNormalization (inference) after a Conv or ConvTranspose
   that only it reads, with constant weights and statistics, folded into the
   convolution's weights and bias (``"batch_normalization"``); ``Mul(x, Sigmoid(x))``
   (SiLU) as one Swish (``"swish"``) and ``Mul(x, HardSigmoid(x, 1/6, 0.5))`` as one
   HardSwish (``"hard_swish"``), for float32/float16: ONNX ops (opsets 24 and 14; the
   host runs them at any opset) that the device runs as DML_ACTIVATION_SWISH and
   DML_ACTIVATION_HARD_SWISH, one operator each instead of two.
   ``prepare(model, rewrites=False)`` does none (to measure them), ``rewrites={"swish"}``
   only the kinds named (:data:`REWRITE_KINDS`).
4. ``place``: every other node is placed: on the device when :data:`DEVICE_OPS` has a
   lowering for its op type and its data types (the activations, :data:`ACTIVATION_OPS`, as DML's
   activation operators, float32/float16; :data:`HOST_ACTIVATIONS` lists what DML cannot
   express; Add/Sub/Mul/Div/Max/Min/Sum, :data:`BINARY_OPS`, as DML's element-wise
   operators with ONNX broadcasting as zero strides, :data:`HOST_ELEMENT_WISE` listing
   what stays on the host; Reshape/Flatten/Squeeze/Unsqueeze/Dropout as aliases of their
   input's buffer, no copy, :data:`HOST_ALIASES` listing what stays on the host;
   MaxPool/AveragePool/GlobalMaxPool/GlobalAveragePool as DML's pooling operators,
   :data:`HOST_POOLING` listing what stays on the host; Transpose as DML's identity with
   permuted strides, Slice as DML_SLICE1, Concat and Split as DML_JOIN and DML_SPLIT,
   BatchNormalization's inference form, :data:`HOST_BATCH_NORMALIZATION` listing what
   stays on the host, Softmax as DML_ACTIVATION_SOFTMAX1 over opset 13's axis or the
   older opsets' coerced 2-D axes;
   Gather on constant indices as DML_SLICE1 (one per run of indices in arithmetic
   progression, a scalar index's axis dropped by an alias) joined by DML_JOIN,
   :data:`HOST_GATHER` listing what stays on the host; Expand as DML's identity reading
   its input with zero strides; Gemm and MatMul as DML_GEMM, :data:`HOST_GEMM`
   listing what stays on the host; Resize and Upsample as DML_RESAMPLE1,
   :data:`HOST_RESIZE` listing what stays on the host; ReduceMean/ReduceSum/ReduceMax/...
   (:data:`REDUCE_OPS`) as DML_REDUCE, float32/float16, :data:`HOST_REDUCE` listing what
   stays on the host); else on the host (the reference
   evaluator), between device partitions, as
   ONNX Runtime does with nodes its GPU providers lack.  ``prepare(model, strict=True)``
   instead raises :class:`vkml.UnsupportedError` naming the node and its op type, as
   ``prepare`` does for a node neither side implements (an unknown domain).
   Consecutive nodes with the same placement form a partition (``rep.partitions``).
5. Device partitions whose input shapes the model declares (and whose parameter inputs
   are constants) are compiled at once, so ``rep.partitions`` shows what the graph
   compiler fused ("Relu (fused into Conv)", "Pad (folded into Conv)").

``prepare(model, dtype="float16")`` runs a float32 model's device partitions in float16
(``VkmlRep.device_dtype``): its float32 constants converted once (beyond float16's range
to +-inf, as PyTorch's ``.half()``), its float32 inputs on upload; host partitions and the
outputs get the model's own float32 back (``VkmlRep.host_feed``).  A float16 model runs
as it is.

``run`` checks each input against the model's declaration (element type exactly, fixed
dimensions; ValidationError naming the input) and runs the partitions in order
(``execute``).  An initializer that is also a graph input may be fed by name: the fed
value is used (the model is prepared again with it as a plain input).

``lower``: a device partition is lowered, for its input shapes (and the values of its
parameter inputs, e.g. ``Pad``'s pads), into :class:`Step` s (a ``vkml.dml`` descriptor, input and
output value names) and from them into one ``vkml.dml.GraphDesc``: values passed between
steps are intermediate edges, the partition's inputs graph inputs -- constants
(initializers, folded values) marked ``DML_TENSOR_FLAG_OWNED_BY_DML`` and bound once --
and its outputs graph outputs.  ``execute``'s :class:`GraphExecutor` compiles it with
``Device.compile_graph`` (which fuses an activation into the convolution before it, a
zero padding into the convolution or LP pooling after it, a Mul by a per-channel scale
(a squeeze-excitation's) into the convolution reading its product, and a residual Add,
with the activation after it, into the convolution producing one of its inputs -- ``prepare``'s
``fuse`` switches kinds off for measurement: the one place that fuses DML
operators, see ``vkml/ops/graph.py``, which reports its fusions as data; ``rewrite``
changes the ONNX graph before it) and replays its command buffer
on later runs with the same shapes.
When the device cannot run a partition (``UnsupportedError`` at compile, e.g. float64
arithmetic on SwiftShader, or an ONNX case vkml has no descriptor for, such as a negative
(cropping) Pad) it runs on the host instead and is listed in ``rep.fallbacks``; with
``strict=True`` that raises :class:`vkml.UnsupportedError`.
"""
from __future__ import annotations

from .backend import VkmlBackend, VkmlRep, prepare, run_model, run_node, supports_device
from .execute import GraphExecutor
from .lower import (ACTIVATION_OPS, BINARY_OPS, DEVICE_OPS, GATHER_SLICES_MAX, HOST_ACTIVATIONS,
                    HOST_ALIASES, HOST_BATCH_NORMALIZATION, HOST_ELEMENT_WISE, HOST_GATHER,
                    HOST_GEMM, HOST_POOLING, HOST_REDUCE, HOST_RESIZE, REDUCE_OPS, Step)
from .rewrite import KINDS as REWRITE_KINDS, Rewrite

__all__ = ["VkmlBackend", "VkmlRep", "Step", "GraphExecutor", "DEVICE_OPS", "ACTIVATION_OPS",
           "BINARY_OPS", "HOST_ACTIVATIONS", "HOST_ELEMENT_WISE", "HOST_ALIASES", "HOST_POOLING",
           "HOST_BATCH_NORMALIZATION", "HOST_GATHER", "GATHER_SLICES_MAX", "HOST_GEMM",
           "HOST_RESIZE", "HOST_REDUCE", "REDUCE_OPS", "Rewrite", "REWRITE_KINDS", "prepare",
           "run_model", "run_node", "supports_device"]

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
3. ``place``: every other node is placed: on the device when :data:`DEVICE_OPS` has a
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
   older opsets' coerced 2-D axes; Gemm and MatMul as DML_GEMM, :data:`HOST_GEMM`
   listing what stays on the host; Resize and Upsample as DML_RESAMPLE1,
   :data:`HOST_RESIZE` listing what stays on the host); else on the host (the reference evaluator), between device partitions, as
   ONNX Runtime does with nodes its GPU providers lack.  ``prepare(model, strict=True)``
   instead raises :class:`vkml.UnsupportedError` naming the node and its op type, as
   ``prepare`` does for a node neither side implements (an unknown domain).
   Consecutive nodes with the same placement form a partition (``rep.partitions``).
4. Device partitions whose input shapes the model declares (and whose parameter inputs
   are constants) are compiled at once, so ``rep.partitions`` shows what the graph
   compiler fused ("Relu (fused into Conv)", "Pad (folded into Conv)").

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
``Device.compile_graph`` (which fuses an activation into the convolution before it and a
zero padding into the convolution or LP pooling after it: the one place that fuses, see
``vkml/ops/graph.py``, which reports its fusions as data) and replays its command buffer
on later runs with the same shapes.
When the device cannot run a partition (``UnsupportedError`` at compile, e.g. float64
arithmetic on SwiftShader, or an ONNX case vkml has no descriptor for, such as a negative
(cropping) Pad) it runs on the host instead and is listed in ``rep.fallbacks``; with
``strict=True`` that raises :class:`vkml.UnsupportedError`.
"""
from __future__ import annotations

from .backend import VkmlBackend, VkmlRep, prepare, run_model, run_node, supports_device
from .execute import GraphExecutor
from .lower import (ACTIVATION_OPS, BINARY_OPS, DEVICE_OPS, HOST_ACTIVATIONS, HOST_ALIASES,
                    HOST_BATCH_NORMALIZATION, HOST_ELEMENT_WISE, HOST_POOLING, Step)
from .lower import HOST_GEMM, HOST_RESIZE

__all__ = ["VkmlBackend", "VkmlRep", "Step", "GraphExecutor", "DEVICE_OPS", "ACTIVATION_OPS",
           "BINARY_OPS", "HOST_ACTIVATIONS", "HOST_ELEMENT_WISE", "HOST_ALIASES", "HOST_POOLING",
           "HOST_BATCH_NORMALIZATION", "prepare", "run_model", "run_node", "supports_device",
           "HOST_GEMM", "HOST_RESIZE"]

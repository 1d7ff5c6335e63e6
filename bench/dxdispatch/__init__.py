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
  ``{name, format, elementOffset, elementCount}``, or a list of them: one entry, or one
  per tensor of an array bind point such as JOIN's ``InputTensors``), ``print``
  (``verbose``), ``writeFile`` (``.npy``, images, raw; ``dimensions``).

Comments (``//``, ``/* */``) and trailing commas are accepted, as DxDispatch's parser does.
Anything else (HLSL or ONNX dispatchables, list initializers, several resources on a
bind point of one tensor, an operator vkml does not implement, a field its descriptor
does not have) is refused with an error naming it.  Timing follows DxDispatch: ``-i``
iterations of bind + ``-r`` dispatches + wait; the first ``-w`` samples are "cold", the rest "hot";
CPU (wall) and GPU (timestamp-query) times per dispatch.

The modules, in the order a file goes through them: ``schema`` (the schema language, the
model's schema, ``loads``), ``descs`` (operator descs as vkml descriptors, by name and a
few tables), ``resources`` (sizes, initial values, images, written files), ``run`` (the
checks together, the executor, timing), ``cli`` (the command line).
"""
from __future__ import annotations

from .cli import main
from .descs import bind_points, build_desc, operator_types
from .resources import Resource, parse_resources
from .run import Executor, Timing, check_model, run_model
from .schema import ModelError, device_limits, loads

__all__ = ["Executor", "ModelError", "Resource", "Timing", "bind_points", "build_desc",
           "check_model", "device_limits", "loads", "main", "operator_types",
           "parse_resources", "run_model"]

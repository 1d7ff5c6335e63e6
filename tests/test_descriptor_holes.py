"""Every descriptor field, given a value of the wrong kind, raises ValidationError naming
that field, and nothing else (no bare ValueError, OverflowError, TypeError or MemoryError
from deeper code).

The descriptors are drawn from the class: every operator descriptor ``vkml.dml`` exports
(a new one must be given a valid instance in :func:`valid_descs`, or
:func:`test_every_descriptor_is_drawn` fails) and every one of its fields, each given
NaN, infinities, a huge value, a huge integer, a negative one, wrong types and an absurdly
long list.  FLOAT fields are checked against their rules: NaN, infinities and values
beyond float32 are refused where the page or the type says so.  GraphDesc's counts and
lists are checked before anything is sized by them.
"""
from __future__ import annotations

import dataclasses
import math
import tracemalloc

import numpy as np
import pytest

import vkml
from vkml import dml
from vkml.dml.activations import ActivationDesc
from vkml.errors import ValidationError


def T(*sizes, dtype="float32"):
    return dml.TensorDesc(dtype, sizes)


def valid_descs() -> dict:
    """One valid instance of every operator descriptor class, by class."""
    x, y = T(1, 1, 4, 4), T(1, 1, 6, 6)
    i32 = dict(dtype="int32")
    out = {
        dml.PaddingOperatorDesc: dml.PaddingOperatorDesc(x, y, "constant", 0.0, (0, 0, 1, 1),
                                                         (0, 0, 1, 1)),
        dml.Padding1OperatorDesc: dml.Padding1OperatorDesc(
            T(1, 1, 4, 4, **i32), T(1, 1, 6, 6, **i32), "constant", "int32", 0, (0, 0, 1, 1),
            (0, 0, 1, 1)),
        dml.ConvolutionOperatorDesc: dml.ConvolutionOperatorDesc(x, T(1, 1, 3, 3), None,
                                                                 T(1, 1, 2, 2)),
        dml.FoldOperatorDesc: dml.FoldOperatorDesc(T(1, 4, 9), x, (2, 2)),
        dml.UnfoldOperatorDesc: dml.UnfoldOperatorDesc(x, T(1, 4, 9), (2, 2)),
        dml.LpPoolingOperatorDesc: dml.LpPoolingOperatorDesc(x, T(1, 1, 3, 3), None, (2, 2)),
        dml.LpPooling1OperatorDesc: dml.LpPooling1OperatorDesc(x, T(1, 1, 3, 3), None, (2, 2)),
        dml.BatchNormalizationOperatorDesc: dml.BatchNormalizationOperatorDesc(
            x, T(1, 1, 1, 1), T(1, 1, 1, 1), T(1, 1, 1, 1), T(1, 1, 1, 1), x),
        dml.ActivationSoftmaxOperatorDesc: dml.ActivationSoftmaxOperatorDesc(T(2, 8), T(2, 8)),
        dml.ActivationSoftmax1OperatorDesc: dml.ActivationSoftmax1OperatorDesc(x, x, (3,)),
        dml.MaxPoolingOperatorDesc: dml.MaxPoolingOperatorDesc(x, T(1, 1, 3, 3),
                                                               window_size=(2, 2)),
        dml.MaxPooling1OperatorDesc: dml.MaxPooling1OperatorDesc(x, T(1, 1, 3, 3),
                                                                 window_size=(2, 2)),
        dml.MaxPooling2OperatorDesc: dml.MaxPooling2OperatorDesc(x, T(1, 1, 3, 3),
                                                                 window_size=(2, 2)),
        dml.AveragePoolingOperatorDesc: dml.AveragePoolingOperatorDesc(x, T(1, 1, 3, 3),
                                                                       window_size=(2, 2)),
        dml.AveragePooling1OperatorDesc: dml.AveragePooling1OperatorDesc(x, T(1, 1, 3, 3),
                                                                         window_size=(2, 2)),
        dml.ReduceOperatorDesc: dml.ReduceOperatorDesc("sum", x, T(1, 1, 1, 4), (2,)),
        dml.JoinOperatorDesc: dml.JoinOperatorDesc((x, x), T(2, 1, 4, 4), 0),
        dml.SplitOperatorDesc: dml.SplitOperatorDesc(T(2, 1, 4, 4), (x, x), 0),
        dml.SliceOperatorDesc: dml.SliceOperatorDesc(x, T(1, 1, 2, 2), (0, 0, 1, 1),
                                                     (1, 1, 2, 2), (1, 1, 1, 1)),
        dml.Slice1OperatorDesc: dml.Slice1OperatorDesc(x, T(1, 1, 2, 2), (0, 0, 1, 1),
                                                       (1, 1, 2, 2), (1, 1, 1, -1)),
        dml.ElementWiseAdd1OperatorDesc: dml.ElementWiseAdd1OperatorDesc(x, x, x),
        dml.ElementWiseIdentityOperatorDesc: dml.ElementWiseIdentityOperatorDesc(x, x),
        dml.ElementWiseClip1OperatorDesc: dml.ElementWiseClip1OperatorDesc(x, x, None,
                                                                           "FLOAT32", 0, 6),
        dml.ResampleOperatorDesc: dml.ResampleOperatorDesc(x, y, scales=(1, 1, 1.5, 1.5)),
        dml.Resample1OperatorDesc: dml.Resample1OperatorDesc(
            x, y, scales=(1, 1, 1.5, 1.5), input_pixel_offsets=(0.5,) * 4,
            output_pixel_offsets=(-0.5,) * 4),
        dml.Upsample2dOperatorDesc: dml.Upsample2dOperatorDesc(x, T(1, 1, 8, 8), (2, 2)),
        dml.GemmOperatorDesc: dml.GemmOperatorDesc(T(1, 1, 4, 3), T(1, 1, 3, 5), None,
                                                   T(1, 1, 4, 5)),
    }
    for cls in (dml.ElementWiseAddOperatorDesc, dml.ElementWiseSubtractOperatorDesc,
                dml.ElementWiseMultiplyOperatorDesc, dml.ElementWiseDivideOperatorDesc,
                dml.ElementWiseMaxOperatorDesc, dml.ElementWiseMinOperatorDesc):
        out[cls] = cls(x, x, x)
    for cls in dml.OPERATOR_ACTIVATIONS.values():
        out[cls] = cls(x, x)
    return out


def descriptor_classes() -> set:
    return {v for n in dml.__all__ for v in [getattr(dml, n)]
            if isinstance(v, type) and issubclass(v, dml.OperatorDesc)
            and dataclasses.is_dataclass(v) and v.OPERATOR_TYPE}


BASES = valid_descs()

#: Values of every wrong kind (and some that are right for some fields).
ODD = [math.nan, -math.nan, math.inf, -math.inf, 1e300, -1e300, 1e39, 2**64, 2**2000, -1, 0,
       None, "1", b"1", object(), 1.5, True, np.float64(np.nan), np.float32(np.inf), 1 + 2j,
       (), [None], (1.5, 2), [1] * 100_000, {"a": 1}]


def test_every_descriptor_is_drawn():
    assert descriptor_classes() == set(BASES)
    for desc in BASES.values():
        desc.validate()


def _named(exc: ValidationError, name: str) -> bool:
    return name in exc.field or name in exc.rule


@pytest.mark.parametrize("cls, name", [(c, f.name) for c, d in BASES.items()
                                       for f in dataclasses.fields(d) if f.init],
                         ids=lambda v: v if isinstance(v, str) else v.__name__)
def test_every_field_given_any_value(cls, name):
    """Accepted, or ValidationError (ArgumentTypeError for a wrong type) naming the field."""
    for value in ODD:
        try:
            dataclasses.replace(BASES[cls], **{name: value}).validate()
        except ValidationError as exc:
            assert _named(exc, name), (cls.__name__, name, value, exc)
        except Exception as exc:    # noqa: BLE001  (what this test is about)
            raise AssertionError(f"{cls.__name__}.{name}={value!r:.40}: "
                                 f"{type(exc).__name__}: {exc}") from None


def float_fields():
    """(class, field, refused): every FLOAT field and which odd values its rules refuse
    (nan, inf, huge: finite beyond float32), by the rules of its page."""
    out = []
    for cls in dml.OPERATOR_ACTIVATIONS.values():
        for name, _ in cls.SPEC.params:
            if name != "scale_bias":
                unbounded = cls.SPEC.name == "clip"          # Clip's min/max may be +-inf
                out.append((cls, name, {"nan", "huge"} | (set() if unbounded else {"inf"})))
    out.append((dml.PaddingOperatorDesc, "padding_value", set()))  # converted as numpy does
    return out


BAD_FLOATS = {"nan": [math.nan, np.float32(np.nan)], "inf": [math.inf, -math.inf],
              "huge": [1e39, -1e300, 2**200, 2**2000]}


@pytest.mark.parametrize("cls, name, refused", float_fields(),
                         ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", ""))
def test_float_fields(cls, name, refused):
    for kind, values in BAD_FLOATS.items():
        for v in values:
            d = dataclasses.replace(BASES[cls], **{name: v})
            if kind in refused:
                with pytest.raises(ValidationError, match=name):
                    d.validate()
            else:
                d.validate()
    for v in ("1.0", None, True, 1 + 0j, [1.0]):
        with pytest.raises(TypeError, match=name):
            dataclasses.replace(BASES[cls], **{name: v}).validate()


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "uint32", "int64", "uint64",
                                   "float16", "float32"])
def test_padding1_typed_value(dtype):
    """PADDING1's value must be representable in its type: NaN and infinities are not in
    an integer type, a finite value beyond a float type's range is not either."""
    d = dml.Padding1OperatorDesc(T(4, dtype=dtype), T(6, dtype=dtype), "constant", dtype, 0,
                                 (1,), (1,))
    is_float = dtype.startswith("float")
    for v in (math.nan, math.inf, -math.inf, np.float64(np.nan), 1e300, -1e300, 2**64, -2**64,
              2**2000, 70000.0):
        bad = dataclasses.replace(d, padding_value=v)
        finite = not isinstance(v, float) or math.isfinite(v)
        if is_float and (not finite or abs(v) <= float(np.finfo(dtype).max)):
            bad.validate()                     # NaN, infinities, values in the type's range
            continue
        if not is_float and v == 70000.0 and 70000 <= np.iinfo(dtype).max:
            bad.validate()
            continue
        with pytest.raises(ValidationError, match="padding_value"):
            bad.validate()


def test_padding1_nan_on_the_device(device):
    """The issue's example: a NaN for an int32 PADDING1 is a ValidationError at create,
    and the device pads afterwards."""
    d = dml.Padding1OperatorDesc(T(4, dtype="int32"), T(6, dtype="int32"), "constant",
                                 "int32", math.nan, (1,), (1,))
    for v in (math.nan, math.inf):
        with pytest.raises(ValidationError, match="Padding1OperatorDesc.padding_value"):
            device.create_operator(dataclasses.replace(d, padding_value=v))
    x = np.arange(4, dtype=np.int32)
    assert (vkml.pad(x, [1], [1], "constant", 7, device=device) == np.pad(x, 1,
                                                                         constant_values=7)).all()


# -- GraphDesc: counts and lists ------------------------------------------------------------
def graph(**kw) -> dml.GraphDesc:
    t = T(1, 1, 4, 4)
    g = dml.GraphDesc(1, 1, [dml.OperatorGraphNodeDesc(dml.ActivationReluOperatorDesc(t, t))],
                      [dml.InputGraphEdgeDesc(0, 0, 0)], [dml.OutputGraphEdgeDesc(0, 0, 0)])
    return dataclasses.replace(g, **kw)


#: Values of the right kind that break another rule (no edge left for a node input, an
#: edge's index out of a count of 0): the error names what they leave broken.
PLAUSIBLE = (0, ())


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(dml.GraphDesc)])
def test_graph_fields_given_any_value(name):
    """Every field given None, a wrong type or an absurd size: ValidationError naming it,
    raised before anything is sized by it (far less allocated than the count asks)."""
    for value in ODD + [2**32 - 1, 2**32, "abc"]:
        tracemalloc.start()
        try:
            graph(**{name: value}).validate()
        except ValidationError as exc:
            assert _named(exc, name) or value in PLAUSIBLE, (name, value, exc)
        except Exception as exc:    # noqa: BLE001
            raise AssertionError(f"GraphDesc.{name}={value!r:.40}: {type(exc).__name__}: "
                                 f"{exc}") from None
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < (64 << 20), (name, repr(value)[:40], peak)


@pytest.mark.parametrize("name, value", [("input_count", 2**32 - 1),
                                         ("input_count", dml.MAX_GRAPH_INPUTS + 1),
                                         ("output_count", 2**32 - 1), ("output_count", 2),
                                         ("input_count", 2**64), ("output_count", -1),
                                         ("nodes", None), ("input_edges", None),
                                         ("output_edges", 3), ("intermediate_edges", "ab")])
def test_graph_counts_refused(device, name, value):
    """The issue's examples, through compile_graph: a ValidationError naming the field
    (before ops/graph.py sizes anything by the counts); the device compiles afterwards."""
    with pytest.raises(ValidationError) as info:
        device.compile_graph(graph(**{name: value}))
    assert _named(info.value, name), info.value
    if value is None or isinstance(value, str):
        assert isinstance(info.value, TypeError)          # ArgumentTypeError
    device.compile_graph(graph()).release()


def test_graph_inputs_may_be_unconnected():
    """Graph inputs no edge reads stay legal (the page: each may connect to a variable
    number of nodes), up to the bindable count."""
    graph(input_count=3).validate()
    graph(input_count=dml.MAX_GRAPH_INPUTS).validate()


def test_graph_edges_of_odd_values():
    """Every edge field given any value: ValidationError naming the edge's field."""
    edges = {"input_edges": dml.InputGraphEdgeDesc(0, 0, 0),
             "output_edges": dml.OutputGraphEdgeDesc(0, 0, 0)}
    for where, edge in edges.items():
        for f in dataclasses.fields(edge):
            if f.name == "name":
                continue
            for value in ODD:
                try:
                    graph(**{where: [dataclasses.replace(edge, **{f.name: value})]}).validate()
                except ValidationError as exc:
                    assert f.name in exc.field or "is not connected" in exc.rule, exc
    for value in ODD:
        with pytest.raises(ValidationError, match=r"nodes\[0\]"):
            graph(nodes=[dml.OperatorGraphNodeDesc(value)]).validate()


def test_activation_desc_is_abstract():
    """ActivationDesc itself is the base of the generated classes, not a descriptor."""
    assert ActivationDesc not in descriptor_classes()

"""A new operator is picked up by the registry, the kernel manifest and the functional form
(docs/DEVELOPING.md, "Adding an operator"), and every operator's kernel requests are
declared where a test can check them against vkml/shaders/manifest.json."""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

import numpy as np
import pytest

import vkml
import vkml.dml
import vkml.ops
from vkml.dml.activations import ACTIVATIONS
from vkml.dml.data_type import DataType
from vkml.dml.operator import OperatorDesc
from vkml.dml.tensor_desc import TensorDesc
from vkml.ops.base import REGISTRY, implements
from vkml.ops.functional import run
from vkml.ops.grid import BOX_CONSTANTS, BoxKernel
from vkml.runtime.pipelines import interface, kernel_manifest

#: Manifest variants no operator requests: the bench tool's and the tuner's probes.
BENCH_ONLY = {"bench_copy_ssbo", "bench_copy_texel", "bench_copy_texel_u64", "bench_fma"}


def ops_modules():
    return [importlib.import_module(f"vkml.ops.{m.name}")
            for m in pkgutil.iter_modules(vkml.ops.__path__)]


# -- a throwaway operator, written the way docs/DEVELOPING.md says ----------------------
@dataclass(frozen=True)
class AffineOperatorDesc(OperatorDesc):
    """y = alpha * x + beta (float32), a stand-in for a new DML operator."""

    OPERATOR_TYPE = "DML_OPERATOR_TEST_AFFINE"
    input_tensor: TensorDesc
    output_tensor: TensorDesc
    alpha: float = 1.0
    beta: float = 0.0

    def inputs(self):
        return [self.input_tensor]

    def outputs(self):
        return [self.output_tensor]

    def validate(self) -> None:
        if self.input_tensor.data_type != DataType.FLOAT32:
            self.fail("input_tensor.data_type", "must be FLOAT32")
        if self.output_tensor.sizes != self.input_tensor.sizes:
            self.fail("output_tensor.sizes", "must equal input_tensor.sizes")


#: The kernel variants and constants the throwaway operator requests.
VARIANTS = {"activation_f32": BOX_CONSTANTS + ("ACT",)}


class CompiledAffine(BoxKernel):
    """An existing kernel variant (activation_f32 with ACT = linear) asked for by name."""

    def build(self) -> None:
        d = self.desc
        src, dst = d.input_tensor, d.output_tensor
        self.kernel = "activation_f32"
        self.in_esize = self.out_esize = 4
        self.in_bytes = self.in_bind = src.total_tensor_size_in_bytes
        self.out_bytes = dst.total_tensor_size_in_bytes
        self.rank = dst.dimension_count
        self.box = list(dst.sizes)
        self.box_out_strides = list(dst.element_strides)
        self.in_strides = list(src.element_strides)
        self.local = min(64, self.workgroup_size)
        self.windows = self.plan_windows()
        self.params = self.upload_block(self.kernel, "Params", out_stride=self.box_out_strides,
                                        in_stride=self.in_strides, p=[d.alpha, d.beta, 0, 0])

    def in_span(self, origin, extent):
        lo = sum(o * s for o, s in zip(origin, self.in_strides))
        hi = sum((o + e - 1) * s for o, e, s in zip(origin, extent, self.in_strides))
        return lo, hi + 1

    def encode(self, seq, inputs, outputs) -> None:
        act = ACTIVATIONS["linear"].SPEC.kernel_id

        def pipeline_for(local, ly, xdims, v, vec_store):
            return self.pipeline(self.kernel, {"LOCAL_SIZE_X": local, "LOCAL_SIZE_Y": ly,
                                               "RANK": self.rank, "XDIMS": xdims, "ACT": act})

        self.dispatch_windows(seq, inputs[0]._alloc, outputs[0]._alloc, self.windows,
                              pipeline_for, [vkml.runtime.Bind(self.params)])


def affine(x, alpha=1.0, beta=0.0, *, device):
    """The functional form: ``affine(x, 2.0, 1.0)``."""
    t = TensorDesc(np.float32, tuple(x.shape))
    return run(device, AffineOperatorDesc(t, t, float(alpha), float(beta)), [x])


@pytest.fixture
def registered():
    implements(AffineOperatorDesc)(CompiledAffine)
    try:
        yield
    finally:
        del REGISTRY[AffineOperatorDesc]


def test_new_operator_runs(device, registered):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    t = TensorDesc(np.float32, x.shape)
    op = device.create_operator(AffineOperatorDesc(t, t, 2.0, -0.5))
    with device.compile_operator(op) as compiled:
        xt, yt = device.tensor(x), device.empty(x.shape, np.float32)
        compiled.execute([xt], [yt])
        np.testing.assert_allclose(yt.numpy(), 2.0 * x - 0.5, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(affine(x, 3.0, 1.0, device=device), 3.0 * x + 1.0,
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(vkml.ValidationError, match="output_tensor.sizes"):
        device.create_operator(AffineOperatorDesc(t, TensorDesc(np.float32, (1, 1, 1, 1))))


def test_unregistered_operator_is_unsupported(device):
    t = TensorDesc(np.float32, (4,))
    op = device.create_operator(AffineOperatorDesc(t, t))
    with pytest.raises(vkml.UnsupportedError):
        device.compile_operator(op)


def test_wrong_names_fail_at_request(device):
    """A variant or constant the manifest does not list is refused when the pipeline is
    asked for, naming what is there; the device stays usable."""
    pipes = device._ctx.pipelines
    with pytest.raises(ValueError, match="padding_e4.*padding_e8"):
        pipes.variant("padding_e3", {"MODE": 0})
    with pytest.raises(ValueError, match="'MDOE'.*MODE"):
        pipes.variant("padding_e4", {"MDOE": 2})
    pipe = pipes.variant("padding_e4", {"LOCAL_SIZE_X": 64, "MODE": 2})
    assert pipe.push_size == 76 and len(pipe.kinds) == 4


def test_constant_ids_come_from_each_kernel():
    """MODE is constant_id 2 in padding.comp and 3 in padding_rows.comp: asked for by name,
    each kernel gets its own id."""
    assert interface("padding_e4", {"MODE": 2})[2] == {2: 2}
    assert interface("padding_rows_e4", {"MODE": 2})[2] == {3: 2}


def test_every_descriptor_has_an_implementation():
    descs = {obj for name in dir(vkml.dml) for obj in [getattr(vkml.dml, name)]
             if isinstance(obj, type) and issubclass(obj, OperatorDesc) and obj.OPERATOR_TYPE}
    assert descs, "no descriptor types found in vkml.dml"
    missing = sorted(d.__name__ for d in descs if d not in REGISTRY)
    assert not missing, f"descriptors without an implementation: {missing}"


def test_functional_forms_are_exported():
    for mod in ops_modules():
        for name in getattr(mod, "__all__", ()):
            assert getattr(vkml, name, None) is getattr(mod, name), f"vkml.{name} ({mod.__name__})"


def test_variant_tables_match_the_manifest():
    """Every operator's table names variants and constants the kernels declare, and every
    variant in the manifest is requested by some table (or is a bench probe)."""
    manifest = kernel_manifest()
    requested = set()
    tables = [(m.__name__, m.VARIANTS) for m in ops_modules() if hasattr(m, "VARIANTS")]
    assert {n.rsplit(".", 1)[1] for n, _ in tables} >= {
        "activation", "convolution", "fold", "lp_pooling", "padding", "unfold"}
    for module, table in tables:
        for variant, names in table.items():
            assert variant in manifest, f"{module}: no kernel variant {variant}"
            declared = manifest[variant]["constants"]
            unknown = sorted(set(names) - set(declared))
            assert not unknown, f"{module}: {variant} declares no {unknown}"
            requested.add(variant)
    unused = sorted(set(manifest) - requested - BENCH_ONLY)
    assert not unused, f"kernel variants no operator requests: {unused}"

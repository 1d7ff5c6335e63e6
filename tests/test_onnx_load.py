"""vkml.onnx loading and placement: external data read from the model's folder only
(never the working directory, nothing outside the folder), errors naming the
initializer; nodes of a domain nothing implements refused at prepare, naming the node;
Pad of opsets 1 and 2 (pads as attributes) on the device."""
from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import vkml  # noqa: E402
import vkml.onnx as vonnx  # noqa: E402

F32 = TensorProto.FLOAT


def _add_model(w: np.ndarray, location: str, offset=None, length=None, dims=None):
    """y = x + W, W stored externally at ``location`` (``offset``/``length`` as given)."""
    t = numpy_helper.from_array(w, "W")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    if dims is not None:
        del t.dims[:]
        t.dims.extend(dims)
    for k, v in (("location", location), ("offset", offset), ("length", length)):
        if v is not None:
            e = t.external_data.add()
            e.key, e.value = k, str(v)
    g = helper.make_graph([helper.make_node("Add", ["x", "W"], ["y"], name="add")], "g",
                          [helper.make_tensor_value_info("x", F32, list(w.shape))],
                          [helper.make_tensor_value_info("y", F32, list(w.shape))], [t])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _save(folder, model, name="m.onnx"):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(model.SerializeToString())
    return str(path)


@pytest.mark.parametrize("seed", range(3))
def test_external_data_comes_from_the_model_folder(seed, device, tmp_path, monkeypatch):
    """A relative location names a file in the model's folder (or below it), whatever
    the working directory holds under that name; offset and length select the bytes."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(v) for v in rng.integers(1, 5, 2))
    w = rng.standard_normal(shape).astype(np.float32)
    decoy = np.full(shape, 1e6, np.float32)
    lead = int(rng.integers(0, 3)) * 16
    loc = ["w.bin", "cwd_only.bin", "sub/w.bin", "./sub/deeper/w.bin"][seed % 4]
    model_dir, cwd = tmp_path / "model", tmp_path / "cwd"
    (model_dir / os.path.dirname(loc)).mkdir(parents=True, exist_ok=True)
    (model_dir / loc).write_bytes(b"\xff" * lead + w.tobytes() + b"\xee" * 8)
    (cwd / os.path.dirname(loc)).mkdir(parents=True, exist_ok=True)
    (cwd / loc).write_bytes(b"\xff" * lead + decoy.tobytes() + b"\xee" * 8)
    monkeypatch.chdir(cwd)
    model = _add_model(w, loc, offset=lead, length=w.nbytes)
    rep = vonnx.prepare(_save(model_dir, model), device=device)
    x = rng.standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(rep.run([x])[0], x + w)
    # the caller's ModelProto is left as given
    assert model.graph.initializer[0].data_location == TensorProto.EXTERNAL


def _bad_external(tmp_path, w):
    """(model path or bytes, what the message says) for external data to refuse."""
    folder = tmp_path / "m"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(w.tobytes())
    (folder / "sub").mkdir(parents=True)
    (folder / "w.bin").write_bytes(w.tobytes())
    os.symlink(outside, folder / "link.bin")
    os.symlink(tmp_path, folder / "up")
    n = w.nbytes
    cases = [
        (_add_model(w, str(outside)), "relative path"),
        (_add_model(w, "../outside.bin"), "relative path"),
        (_add_model(w, "sub/../../outside.bin"), "relative path"),
        (_add_model(w, "link.bin"), "symbolic link"),
        (_add_model(w, "up/outside.bin"), "symbolic link"),
        (_add_model(w, "missing.bin"), "no such file"),
        (_add_model(w, "sub"), "no such file"),
        (_add_model(w, ""), "relative path"),
        (_add_model(w, "w.bin", offset=-4), "offset"),
        (_add_model(w, "w.bin", offset="four"), "offset"),
        (_add_model(w, "w.bin", offset=8), "length"),
        (_add_model(w, "w.bin", offset=4, length=n), "runs past the end"),
        (_add_model(w, "w.bin", length=n - 4), "length"),
        (_add_model(w, "w.bin", length="1e3"), "length"),
        (_add_model(w, "w.bin", dims=[-1, 2]), "dims"),
        (_add_model(w, "w.bin", dims=[w.size * 4]), "length"),
    ]
    out = [(_save(folder, m, f"m{i}.onnx"), why) for i, (m, why) in enumerate(cases)]
    good = _add_model(w, "w.bin")
    out += [(good.SerializeToString(), "no folder"), (good, "no folder")]
    return out


def test_external_data_outside_the_folder_or_malformed_is_refused(device, tmp_path,
                                                                  monkeypatch):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    monkeypatch.chdir(tmp_path)              # the outside file is in the working directory
    for model, why in _bad_external(tmp_path, w):
        with pytest.raises(vkml.ValidationError) as info:
            vonnx.prepare(model, device=device)
        assert info.value.field == "initializer 'W': external data", (why, info.value)
        assert why in info.value.rule, (why, info.value)
    # the same folder's own file, referenced plainly, loads
    rep = vonnx.prepare(_save(tmp_path / "m", _add_model(w, "w.bin"), "ok.onnx"), device=device)
    np.testing.assert_array_equal(rep.run([w])[0], 2 * w)


def _custom_domain_models():
    """(model, node name): nodes of domains neither ONNX's reference evaluator nor the
    model's functions implement, alone, after a device node and among host nodes."""
    x = helper.make_tensor_value_info("x", F32, [1, 1, 3, 3])
    y = helper.make_tensor_value_info("y", F32, ["a", "b", "c", "d"])
    w = numpy_helper.from_array(np.ones((1, 1, 2, 2), np.float32), "W")
    out = []
    for domain, op, name in (("com.example", "MyOp", "mine"), ("org.custom", "Foo", "foo"),
                             ("ai.vendor.experimental", "Conv", "vendor_conv")):
        opsets = [helper.make_opsetid("", 18), helper.make_opsetid(domain, 1)]
        alone = [helper.make_node(op, ["x"], ["y"], domain=domain, name=name)]
        after = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
                 helper.make_node(op, ["c"], ["y"], domain=domain, name=name)]
        among = [helper.make_node("Sin", ["x"], ["s"], name="sin"),
                 helper.make_node(op, ["s"], ["t"], domain=domain, name=name),
                 helper.make_node("Cos", ["t"], ["y"], name="cos")]
        for nodes in (alone, after, among):
            g = helper.make_graph(nodes, "g", [x], [y], [w] if nodes is after else [])
            out.append((helper.make_model(g, opset_imports=opsets), name, op))
    return out


def test_unknown_domain_refused_at_prepare(device):
    for model, name, op in _custom_domain_models():
        # strict=True refuses the first node off the device, Sin where there is one
        hosted = any(n.op_type == "Sin" for n in model.graph.node)
        for strict in (False,) if hosted else (False, True):
            with pytest.raises(vkml.UnsupportedError, match=f"'{name}' \\(op type {op}"):
                vonnx.prepare(model, device=device, strict=strict)


def test_a_model_function_of_a_custom_domain_runs(device):
    """A custom-domain op the model defines as a function is known: it runs (host)."""
    f = helper.make_function("com.example", "Twice", ["a"], ["b"],
                             [helper.make_node("Add", ["a", "a"], ["b"])],
                             [helper.make_opsetid("", 18)])
    g = helper.make_graph([helper.make_node("Twice", ["x"], ["y"], domain="com.example",
                                            name="twice")], "g",
                          [helper.make_tensor_value_info("x", F32, [3])],
                          [helper.make_tensor_value_info("y", F32, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18),
                                            helper.make_opsetid("com.example", 1)],
                          functions=[f])
    rep = vonnx.prepare(m, device=device)
    x = np.array([1, 2, 3], np.float32)
    np.testing.assert_array_equal(rep.run([x])[0], 2 * x)


@pytest.mark.parametrize("opset", [1, 2])
def test_pad_with_attribute_pads(opset, device):
    """Pad of opset 1 (``paddings``) and 2 (``pads``): modes, values and sizes drawn at
    random, on the device, against NumPy."""
    rng = np.random.default_rng(opset)
    key = "paddings" if opset == 1 else "pads"
    for mode in ("constant", "reflect", "edge"):
        for _ in range(2):
            shape = [int(v) for v in rng.integers(2, 5, int(rng.integers(1, 4)))]
            begin = [int(rng.integers(0, s)) for s in shape]
            end = [int(rng.integers(0, s)) for s in shape]
            value = float(rng.integers(-3, 4))
            node = helper.make_node("Pad", ["x"], ["y"], name="pad", mode=mode,
                                    value=value, **{key: begin + end})
            g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F32, shape)],
                                  [helper.make_tensor_value_info("y", F32, None)])
            g.output[0].type.tensor_type.shape.SetInParent()
            for i in range(len(shape)):
                g.output[0].type.tensor_type.shape.dim.add().dim_param = f"d{i}"
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
            rep = vonnx.prepare(m, device=device, strict=True)
            assert rep.partitions == [("device", [("pad", "Pad")])]
            x = rng.standard_normal(shape).astype(np.float32)
            kw = {"constant_values": value} if mode == "constant" else {}
            want = np.pad(x, list(zip(begin, end)), mode=mode, **kw)
            np.testing.assert_array_equal(rep.run([x])[0], want)
            if opset == 2:
                np.testing.assert_array_equal(ReferenceEvaluator(m).run(None, {"x": x})[0], want)


def _constant_model(w: np.ndarray, location: str, in_function: bool):
    """y = x + c, c a Constant node's value stored externally at ``location``; the node
    in the graph, or in a model-local function's body."""
    t = numpy_helper.from_array(w, "c")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", location
    const = helper.make_node("Constant", [], ["c"], name="the_constant", value=t)
    add = helper.make_node("Add", ["x", "c"], ["y"], name="add")
    opsets = [helper.make_opsetid("", 18)]
    functions = []
    if in_function:
        functions = [helper.make_function("com.example", "AddC", ["x"], ["y"], [const, add],
                                          opsets)]
        nodes = [helper.make_node("AddC", ["x"], ["y"], domain="com.example", name="addc")]
        opsets = opsets + [helper.make_opsetid("com.example", 1)]
    else:
        nodes = [const, add]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, list(w.shape))],
                          [helper.make_tensor_value_info("y", F32, list(w.shape))])
    return helper.make_model(g, opset_imports=opsets, functions=functions)


@pytest.mark.parametrize("in_function", [False, True])
def test_external_data_of_attribute_tensors(in_function, device, tmp_path, monkeypatch):
    """A Constant's value stored externally (in the graph or a function body) follows the
    same rules as an initializer's: the model's folder, never the working directory."""
    rng = np.random.default_rng(int(in_function))
    w = rng.standard_normal((2, 3)).astype(np.float32)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "c.bin").write_bytes(w.tobytes())
    (tmp_path / "c.bin").write_bytes(np.ones_like(w).tobytes())
    monkeypatch.chdir(tmp_path)
    rep = vonnx.prepare(_save(tmp_path / "m", _constant_model(w, "c.bin", in_function)),
                        device=device)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(rep.run([x])[0], x + w)
    for loc in ("../c.bin", str(tmp_path / "c.bin"), "nowhere.bin"):
        with pytest.raises(vkml.ValidationError) as info:
            vonnx.prepare(_save(tmp_path / "m", _constant_model(w, loc, in_function), "b.onnx"),
                          device=device)
        assert info.value.field == "node 'the_constant' attribute 'value': external data"

"""Fuzzed Convolution descriptors (see tests/fuzzing.py): 1-3 spatial dimensions, both
directions, groups, strides, dilations, paddings, output padding, both modes, fused
activations, bias, float32 and float16, non-packed layouts, each on a kernel path drawn
from those that accept it, and one broken rule at a time."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from vkml import dml
from vkml.errors import ValidationError

from fuzzing import (LAYOUTS, bind_with_canary, canaries_intact, compiled_or_refused,
                     count, fuzz_settings, lay_out, padded_output, real_cases)
from helpers import compile_on_path, same_bits
from references import activation_reference, convolution_reference

# the fused activations drawn (with the page's default parameters)
CONV_ACTIVATIONS = [None, "relu", "sigmoid", "tanh", "leaky_relu"]


@st.composite
def conv_cases(draw):
    """Small random convolutions of every kind, plus two shapes in the domains of the
    fast paths: "wide" (3x3 stride 1, 16-20 channels, 20-26 pixels a side: Winograd,
    GEMM) and "depthwise" (group count = input channels, channel multipliers)."""
    kind = draw(st.sampled_from(["small"] * 5 + ["wide"] * 2 + ["depthwise"]))
    d = 2 if kind != "small" else draw(st.integers(1, 3))
    backward = draw(st.booleans()) if kind != "depthwise" else False
    lists = {"small": lambda lo, hi: draw(st.lists(st.integers(lo, hi), min_size=d,
                                                   max_size=d)),
             "wide": lambda lo, hi: [lo] * d if hi < 6 else
             draw(st.lists(st.integers(20, 26), min_size=d, max_size=d)),
             "depthwise": lambda lo, hi: draw(st.lists(st.integers(lo, min(hi, 12)),
                                                       min_size=d, max_size=d))}[kind]
    spatial = lists(1 if kind == "small" else 6, {1: 9, 2: 6, 3: 4}[d] if kind == "small"
                    else 12)
    kernel = lists(1, 3) if kind != "wide" else [3] * d
    strides = lists(1, 3 if kind == "small" else 2)
    dilations = lists(1, 2)
    start = lists(0, 2) if kind != "wide" else lists(0, 1)
    end = lists(0, 2) if kind != "wide" else lists(0, 1)
    if kind == "wide":
        groups = 1
        cin, cout = draw(st.integers(16, 20)), draw(st.integers(16, 20))
    elif kind == "depthwise":
        groups = cin = draw(st.integers(4, 8))
        cout = cin * draw(st.integers(1, 2))
    else:
        groups = draw(st.sampled_from([1, 1, 2, 3]))
        cin, cout = groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 3))
    outpad = draw(st.lists(st.integers(0, 2), min_size=d, max_size=d)) \
        if draw(st.integers(0, 3)) == 0 else [0] * d
    for i in range(d):      # keep valid cases common: shrink what does not fit
        if backward:
            full = (spatial[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1
            while start[i] + end[i] >= full + outpad[i]:
                start[i], end[i] = start[i] // 2, end[i] // 2
                if start[i] + end[i] == 0:
                    break
        else:
            while kernel[i] > 1 and dilations[i] * (kernel[i] - 1) + 1 > \
                    spatial[i] + start[i] + end[i]:
                kernel[i] -= 1
    return dict(d=d, backward=backward, groups=groups, n=draw(st.integers(1, 2)),
                cin=cin, cout=cout, path=draw(st.integers(0, 7)), spatial=spatial, kernel=kernel, strides=strides, dilations=dilations,
                start=start, end=end, outpad=outpad, flip=draw(st.booleans()),
                bias=draw(st.sampled_from([None, "dml"])),
                act=draw(st.sampled_from(CONV_ACTIVATIONS)),
                dtype=draw(st.sampled_from(["float32", "float16"])),
                mutation=draw(st.sampled_from(["none"] * 8 + [
                    "group", "filter", "out", "bias", "dtype", "arr_len", "stride0",
                    "rank6"])),
                x_layout=draw(st.sampled_from(LAYOUTS)), w_layout=draw(st.sampled_from(LAYOUTS)),
                out_padded=draw(st.booleans()),
                seed=draw(st.integers(0, 2**31)))


_CONV_ERRORS = {"group": ["group_count", "filter_tensor.sizes"],
                "filter": ["filter_tensor.sizes"], "out": ["output_tensor.sizes"],
                "bias": ["bias_tensor.sizes"], "dtype": ["data_type"],
                "arr_len": ["strides"], "stride0": ["strides"],
                "rank6": ["input_tensor", "filter_tensor", "bias_tensor", "output_tensor"]}


def _conv_desc(case, strides_of=lambda name: None):
    """(shapes of x, w, b and y; the descriptor) with the case's mutation applied;
    ``strides_of("x" | "w" | "y")`` gives each tensor's element strides."""
    g, cin, cout, sp = case["groups"], case["cin"], case["cout"], list(case["spatial"])
    m, n, d = case["mutation"], case["n"], case["d"]
    strides, kernel = list(case["strides"]), list(case["kernel"])
    if case["backward"]:
        wshape = [cin, cout // g] + kernel
        conv = [(i - 1) * s + dl * (k - 1) + 1 - a - e + p for i, s, dl, k, a, e, p in
                zip(sp, strides, case["dilations"], kernel, case["start"], case["end"],
                    case["outpad"])]
    else:
        wshape = [cout, cin // g] + kernel
        conv = [(i + a + e - dl * (k - 1) - 1) // s + 1 + p for i, a, e, dl, k, s, p in
                zip(sp, case["start"], case["end"], case["dilations"], kernel, strides,
                    case["outpad"])]
    xshape, yshape = [n, cin] + sp, [n, cout] + conv
    bshape = [1, cout] + [1] * d if case["bias"] else None
    dt, ydt = case["dtype"], case["dtype"]
    if m == "group":
        xshape[1] += 1
    elif m == "filter":
        wshape[0 if case["backward"] else 1] += 1
    elif m == "out":
        yshape[-1] += 1
    elif m == "bias":
        bshape = [1, cout + 1] + [1] * d
    elif m == "dtype":
        ydt = "float16" if dt == "float32" else "float32"
    elif m == "arr_len":
        strides = strides + [1]
    elif m == "stride0":
        strides[0] = 0
    elif m == "rank6":
        xshape, wshape, yshape = (s + [1] * (6 - len(s)) for s in (xshape, wshape, yshape))
        bshape = bshape and [1, cout, 1, 1, 1, 1]
    T = dml.TensorDesc
    desc = dml.ConvolutionOperatorDesc(
        T(dt, xshape, strides_of("x")), T(dt, wshape, strides_of("w")),
        T(dt, bshape) if bshape else None, T(ydt, yshape, strides_of("y")),
        "convolution" if case["flip"] else "cross_correlation",
        "backward" if case["backward"] else "forward", strides, case["dilations"],
        case["start"], case["end"], case["outpad"], g, case["act"])
    return xshape, wshape, bshape, yshape, desc


def _with_drawn_path(device, compiled, desc, draw: int):
    """Recompile with one of the kernel paths that accept the descriptor on this device
    (the drawn index modulo their count), so every path meets random descriptors."""
    import importlib

    conv_ops = importlib.import_module("vkml.ops.convolution")
    geo = conv_ops.Geometry.of(desc)
    accepting = [p.name for p in conv_ops.PATHS if p.accepts(compiled, geo)]
    compiled.release()
    return compile_on_path(device, desc, accepting[draw % len(accepting)])


def _run_conv_case(device, case):
    rng = np.random.default_rng(case["seed"])
    want = _CONV_ERRORS.get(case["mutation"], [])
    dt = np.dtype(case["dtype"])
    try:
        xshape, wshape, bshape, yshape, _ = _conv_desc(case)
    except ValidationError as err:          # a malformed TensorDesc (rank 6)
        assert any(f in str(err) for f in ["TensorDesc"] + want), str(err)
        return count("refused")
    x = rng.uniform(-1, 1, xshape).astype(dt)
    w = rng.uniform(-1, 1, wshape).astype(dt)
    b = rng.uniform(-1, 1, bshape).astype(dt) if bshape else None
    x_flat, x_strides, x = lay_out(rng, x, case["x_layout"])
    w_flat, w_strides, w = lay_out(rng, w, case["w_layout"])
    y_strides, read = padded_output(rng, yshape, dt, case["out_padded"])
    strides = {"x": x_strides, "w": w_strides, "y": y_strides}
    desc, compiled = compiled_or_refused(device, lambda: _conv_desc(case, strides.get)[-1],
                                         want)
    if desc is None:
        return
    compiled = _with_drawn_path(device, compiled, desc, case["path"])
    flats = (x_flat, w_flat, b.reshape(-1) if b is not None else None)
    ins = [bind_with_canary(device, t.total_tensor_size_in_bytes, f) if f is not None else None
           for t, f in zip(desc.inputs(), flats)]
    out = bind_with_canary(device, desc.output_tensor.total_tensor_size_in_bytes)
    compiled.execute(ins, [out])
    path = compiled.path.name
    compiled.release()
    got, gaps_intact = read(out)
    args = (case["strides"], case["dilations"], case["start"], case["end"], case["outpad"],
            case["groups"], "convolution" if case["flip"] else "cross_correlation",
            "backward" if case["backward"] else "forward")
    expect = activation_reference(convolution_reference(x, w, b, *args), case["act"])
    # error bound: the sum of |terms| of each output, scaled by the type's precision
    scale = convolution_reference(np.abs(x), np.abs(w), None if b is None else np.abs(b),
                                  *args)
    tol = (2e-3 * scale + 2e-3) if dt == np.float16 else (2e-6 * scale + 1e-6)
    if path == "winograd" and dt == np.float32:     # its transforms' rounding: 10x, as in
        tol = tol * 10                              # test_convolution.path_tolerance
    err = np.abs(got.astype(np.float64) - expect)
    assert np.all(err <= tol), f"max error {err.max():.3g} (tolerance {tol.max():.3g})"
    assert gaps_intact, "wrote into the gaps of a non-packed output"
    for t, f in zip(ins, flats):
        if t is not None:
            assert canaries_intact(t), "wrote outside an input"
            assert same_bits(t.read_bytes(f.nbytes).view(dt), f), "input changed"
    assert canaries_intact(out), "wrote outside the output"


def test_fuzz_convolution(device, speed):
    @fuzz_settings(speed)
    @given(conv_cases())
    def check(case):
        _run_conv_case(device, case)

    with real_cases(speed):
        check()

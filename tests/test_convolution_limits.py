"""Convolution across the whole range of DML's UINT parameters (strides, dilations,
paddings, output padding up to 2^32 - 1), both directions and modes, groups, every
kernel path that accepts a case, against the shared reference (``references.py``), whose
index arithmetic is exact (Python ints); and compile cost bounded by the work, not by a
parameter (a cold call with extreme values neither runs for minutes nor grows the
process's memory by gigabytes)."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vkml
from references import convolution_reference
from vkml import dml
from vkml.errors import ValidationError

from fuzzing import top_up
from helpers import compile_on_path
from vkml.intmath import ceil_div

conv_ops = importlib.import_module("vkml.ops.convolution")

U32 = 2**32 - 1
EDGES = [2**31 - 2, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 2, 2**32 - 1]


# -- sizes ------------------------------------------------------------------------------------
def conv_sizes(backward, ins, ks, strides, dils, start, end):
    """The page's spatial output sizes before output_padding (Python ints)."""
    if backward:
        return [(i - 1) * s + d * (k - 1) + 1 - a - b
                for i, k, s, d, a, b in zip(ins, ks, strides, dils, start, end)]
    return [(i + a + b - d * (k - 1) - 1) // s + 1
            for i, k, s, d, a, b in zip(ins, ks, strides, dils, start, end)]


# -- cases ----------------------------------------------------------------------------------
def uints(lo):
    """UINTs biased to small values and to 2^31 - 1, 2^31, 2^32 - 1 and neighbours."""
    return st.one_of(st.integers(lo, 3), st.integers(lo, 3), st.sampled_from(EDGES),
                     st.integers(lo, U32))


@st.composite
def cases(draw):
    nd = draw(st.sampled_from([1, 1, 2, 2, 3]))
    backward = draw(st.booleans())
    flip = draw(st.booleans())
    kind = draw(st.sampled_from(["plain", "plain", "depthwise", "dense"]))
    groups = draw(st.integers(1, 2))
    if kind == "depthwise":            # the depthwise path: groups = input channels
        cig, cog = 1, draw(st.integers(1, 2))
        backward = False
    elif kind == "dense":              # gemm/gemm_sg: >= 4 output channels a group
        cig, cog = draw(st.integers(1, 2)), 4
    else:
        cig, cog = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    n = draw(st.integers(1, 2))
    ins = draw(st.lists(st.integers(1, 4), min_size=nd, max_size=nd))
    ks = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    lst = lambda lo: draw(st.lists(uints(lo), min_size=nd, max_size=nd))  # noqa: E731
    strides, dils, start, end = lst(1), lst(1), lst(0), lst(0)
    outpad = draw(st.lists(st.one_of(st.integers(0, 2), st.integers(0, 2), uints(0)),
                           min_size=nd, max_size=nd))
    # mostly: an end padding (else a start padding) that makes the output 1-4 long
    for ax in range(nd):
        if draw(st.integers(0, 3)) == 0:
            continue
        want = draw(st.integers(1, 4))
        i, k, s, d, a = ins[ax], ks[ax], strides[ax], dils[ax], start[ax]
        outpad[ax] = min(outpad[ax], 2)
        if backward:
            e = (i - 1) * s + d * (k - 1) + 1 - a + outpad[ax] - want
            if 0 <= e <= U32:
                end[ax] = e
            elif 0 <= e + a <= U32:
                start[ax], end[ax] = e + a, 0
        else:
            c = max(1, want - outpad[ax])
            e = (c - 1) * s + d * (k - 1) + 1 - i - a + draw(st.integers(0, 3)) % s
            if 0 <= e <= U32:
                end[ax] = e
            elif 0 <= e + a <= U32:
                start[ax], end[ax] = e + a, 0
    dtype = draw(st.sampled_from([np.float32, np.float32, np.float16]))
    return dict(nd=nd, backward=backward, flip=flip, groups=groups, cig=cig, cog=cog, n=n,
                ins=ins, ks=ks, strides=strides, dils=dils, start=start, end=end,
                outpad=outpad, dtype=dtype, bias=draw(st.booleans()),
                path=draw(st.integers(0, 7)), seed=draw(st.integers(0, 2**16)))


def _shapes(c):
    cin, cout = c["cig"] * c["groups"], c["cog"] * c["groups"]
    if c["backward"]:
        wshape = (cin, c["cog"], *c["ks"])
    else:
        wshape = (cout, c["cig"], *c["ks"])
    conv = conv_sizes(c["backward"], c["ins"], c["ks"], c["strides"], c["dils"], c["start"],
                      c["end"])
    outs = [a + p for a, p in zip(conv, c["outpad"])]
    return (c["n"], cin, *c["ins"]), wshape, (c["n"], cout, *outs), conv


def _desc(c, xshape, wshape, yshape):
    dt = np.dtype(c["dtype"])
    t = lambda shape: dml.TensorDesc(dt, tuple(shape))  # noqa: E731
    bias = t((1, yshape[1]) + (1,) * c["nd"]) if c["bias"] else None
    return dml.ConvolutionOperatorDesc(
        t(xshape), t(wshape), bias, t(yshape),
        mode=dml.ConvolutionMode.CONVOLUTION if c["flip"] else
        dml.ConvolutionMode.CROSS_CORRELATION,
        direction=dml.ConvolutionDirection.BACKWARD if c["backward"] else
        dml.ConvolutionDirection.FORWARD,
        strides=c["strides"], dilations=c["dils"], start_padding=c["start"],
        end_padding=c["end"], output_padding=c["outpad"], group_count=c["groups"])


def _compile_with_path(device, desc, draw):
    """Compile with one of the kernel paths that accept the descriptor on this device
    (the drawn index modulo their count); returns (compiled, path name)."""
    probe = device.compile_operator(device.create_operator(desc))
    geo = conv_ops.Geometry.of(desc)
    accepting = conv_ops.heuristic(probe, geo)
    probe.release()
    chosen = accepting[draw % len(accepting)]
    return compile_on_path(device, desc, chosen), chosen


def run_case(device, c):
    """Run one drawn case; returns what happened ("ran", "refused", "too big")."""
    xshape, wshape, yshape, conv = _shapes(c)
    if any(v < 1 for v in yshape) or (not c["backward"] and min(conv) < 1):
        placeholder = yshape[:2] + (1,) * c["nd"]         # (any: the sizes rule comes first)
        with pytest.raises(ValidationError) as err:       # the page's size rules
            device.create_operator(_desc(c, xshape, wshape, placeholder))
        assert any(f in str(err.value) for f in ("end_padding[", "filter_tensor.sizes[")), \
            str(err.value)
        return "invalid"
    if max(yshape[2:]) > 2**31 - 1 or np.prod(yshape, dtype=object) > U32:
        # an output the kernels cannot index (or no UINT can count): refused up front
        with pytest.raises(ValidationError) as err:
            desc = _desc(c, xshape, wshape, yshape)
            device.compile_operator(device.create_operator(desc))
        assert "output_tensor" in str(err.value) or "sizes" in str(err.value), str(err.value)
        return "refused"
    if np.prod(yshape, dtype=object) > 4096:
        return "too big"
    desc = _desc(c, xshape, wshape, yshape)
    try:
        compiled, path = _compile_with_path(device, desc, c["path"])
    except ValidationError as err:
        # only where the positions an output and a tap meet are 2^31 apart or more
        msg = str(err)
        assert "32-bit" in msg and ("strides[" in msg or "dilations[" in msg), msg
        assert max(c["strides"] + c["dils"] + c["start"]) >= 2**30, msg
        return "refused"
    rng = np.random.default_rng(c["seed"])
    dt = np.dtype(c["dtype"])
    x = rng.integers(-3, 4, xshape).astype(dt)
    w = rng.integers(-3, 4, wshape).astype(dt)
    b = rng.integers(-3, 4, yshape[1]).astype(dt) if c["bias"] else None
    ins = [device.tensor(x), device.tensor(w),
           device.tensor(b.reshape((1, -1) + (1,) * c["nd"])) if b is not None else None]
    out = device.empty(int(np.prod(yshape)), dt)
    try:
        compiled.execute(ins, [out])
    finally:
        compiled.release()
    got = out.numpy().reshape(yshape).astype(np.float64)
    want = convolution_reference(x, w, b, c["strides"], c["dils"], c["start"], c["end"],
                                 c["outpad"], c["groups"],
                                 "convolution" if c["flip"] else "cross_correlation",
                                 "backward" if c["backward"] else "forward")
    if dt == np.float16:
        want = want.astype(np.float16).astype(np.float64)
    assert np.array_equal(got, want), f"path {path}: got {got.ravel()}, want {want.ravel()}"
    return "ran"


def test_whole_uint_range(device, budget):
    seen = []

    @settings(max_examples=budget * 5, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(cases())
    def check(c):
        seen.append(run_case(device, c))

    # a quarter of the examples drawn ran (not of those that ran: hypothesis may stop
    # early), fresh batches drawn where one left it short (fuzzing.top_up)
    floor = budget * 5 // 4
    top_up(check, lambda: seen.count("ran") < floor)
    print("cases:", {k: seen.count(k) for k in set(seen)})
    assert seen.count("ran") >= floor, seen


# -- the examples, verbatim ---------------------------------------------------------
def test_stride_2048_three_outputs(device):
    x = np.arange(4097, dtype=np.float32).reshape(1, 1, 1, 4097)
    y = vkml.convolution(x, np.ones((1, 1, 1, 1), np.float32), strides=[1, 2048],
                         device=device)
    np.testing.assert_array_equal(np.asarray(y), [[[[0, 2048, 4096]]]])


@pytest.mark.parametrize("stride", [1000, 3 * 10**9, 2**31, 2**32 - 1])
def test_huge_strides_small_input(device, stride):
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    y = vkml.convolution(x, np.full((1, 1, 1, 1), 2, np.float32), strides=[stride, stride],
                         device=device)
    n = ceil_div(4, stride)
    np.testing.assert_array_equal(np.asarray(y), 2 * x[:, :, ::stride, ::stride][..., :n, :n])


def test_backward_stride_and_start_2_31(device):
    """The fold example of the issue as the transposed convolution it is: input 1 lands
    at 1 * 2^31 - 2^31 = 0."""
    y = vkml.convolution(np.array([[[10., 20.]]], np.float32), np.ones((1, 1, 1), np.float32),
                         strides=[2**31], start_padding=[2**31], output_padding=[3],
                         direction="backward", device=device)
    np.testing.assert_array_equal(np.asarray(y), [[[20, 0, 0, 0]]])


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("value", [2**31 - 1, 2**31, 2**32 - 1])
def test_extremes_both_directions(device, direction, value):
    """Each parameter alone at an extreme (backward: cropped to 4 outputs by the end
    padding), compared with the exact reference; outputs the kernels cannot index are
    refused by name."""
    x = np.arange(1, 7, dtype=np.float32).reshape(1, 1, 6)
    w = np.array([[[1., 10., 100.]]], np.float32)
    back = direction == "backward"
    ran = 0
    for field in ("strides", "dilations", "start_padding", "end_padding", "output_padding"):
        kw = dict(strides=[1], dilations=[1], start_padding=[0], end_padding=[0],
                  output_padding=[0])
        kw[field] = [value]
        size = lambda: conv_sizes(back, [6], [3], kw["strides"], kw["dilations"],  # noqa
                                  kw["start_padding"], kw["end_padding"])[0]
        excess = size() + kw["output_padding"][0] - 4
        if back and field != "end_padding" and excess > 0:
            kw["end_padding"] = [min(U32, excess)]
            if excess > U32 and field != "start_padding":
                kw["start_padding"] = [min(U32, excess - U32)]
        c = size()
        total = c + kw["output_padding"][0]
        if (total if back else c) < 1 or total > 2**31 - 1:
            with pytest.raises(ValidationError, match="padding|sizes|strides|dilations"):
                vkml.convolution(x, w, direction=direction, device=device, **kw)
            continue
        if total > 4096:
            continue
        y = vkml.convolution(x, w, direction=direction, device=device, **kw)
        want = convolution_reference(x, w, None, kw["strides"], kw["dilations"],
                                     kw["start_padding"], kw["end_padding"],
                                     kw["output_padding"], direction=direction)
        np.testing.assert_array_equal(np.asarray(y), want, err_msg=f"{field}={value}")
        ran += 1
    assert ran >= 1


def test_refusal_names_the_field(device):
    """Two taps 2^32 - 1 apart both meeting the input, 2^32 - 1 outputs apart in
    stride: the positions span 2^33, beyond 32-bit indexing; refused, naming the field."""
    x = np.array([[[10., 20.]]], np.float32)
    w = np.array([[[1., 2.]]], np.float32)
    with pytest.raises(ValidationError, match=r"(strides|dilations)\[0\].*32-bit"):
        vkml.convolution(x, w, strides=[U32], dilations=[U32], start_padding=[U32],
                         end_padding=[U32], device=device)
    # the device stays usable
    np.testing.assert_array_equal(
        np.asarray(vkml.convolution(x, w, device=device)), [[[50.]]])


# -- compile cost bounded by the work ---------------------------------------------------------
COLD = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import vkml
    x1 = np.arange(4097, dtype=np.float32).reshape(1, 1, 1, 4097)
    x4 = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    one = np.ones((1, 1, 1, 1), np.float32)
    four = np.ones((4, 1, 3, 3), np.float32)
    dw = np.ones((2, 1, 3, 3), np.float32)
    x2 = np.ones((1, 2, 5, 5), np.float32)
    calls = {
        "stride 2048": lambda: vkml.convolution(x1, one, strides=[1, 2048]),
        "stride 1000": lambda: vkml.convolution(x1, one, strides=[1, 1000]),
        "stride 3e9": lambda: vkml.convolution(x4, one, strides=[3 * 10**9, 3 * 10**9]),
        "stride 2^31": lambda: vkml.convolution(x4, one, strides=[2**31, 2**31]),
        "depthwise dilation 2^31": lambda: vkml.convolution(
            x2, dw, group_count=2, dilations=[1, 2**31], end_padding=[0, 2**32 - 4]),
        "depthwise stride 4000": lambda: vkml.convolution(
            x2, dw, group_count=2, strides=[4000, 4000], end_padding=[0, 3998]),
        "dense dilation 4000": lambda: vkml.convolution(
            np.ones((1, 1, 5, 8001), np.float32), four, dilations=[1, 4000]),
        "dense kernel 1x200": lambda: vkml.convolution(
            np.ones((1, 1, 1, 200), np.float32), np.ones((4, 1, 1, 200), np.float32)),
        "backward stride 2^32-1": lambda: vkml.convolution(
            x4[..., :2, :2], np.ones((1, 4, 3, 3), np.float32), strides=[2**32 - 1] * 2,
            end_padding=[2**32 - 2] * 2, direction="backward"),
    }
    vkml.pad(np.ones(2, np.float32), [1], [1])     # the device opened: not a convolution's cost

    def peak_rss():
        # this process's own peak (getrusage's ru_maxrss keeps the parent's across
        # fork and exec: pytest's, gigabytes by then); Linux only, else None
        try:
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
        except (OSError, StopIteration, ValueError):
            return None
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                   # the peak so far reset to the current size
    except OSError:
        peak_rss = lambda: None
    out, rss = {}, {}
    for name, call in calls.items():
        t = time.perf_counter()
        np.asarray(call())
        out[name] = time.perf_counter() - t
        rss[name] = peak_rss()
    print(json.dumps({"seconds": out, "peak_rss": rss}))
""")


#: A cold call's guard against a compile that grows with a parameter.  The failure this
#: file exists for took minutes, 24 GB and then a segfault; a healthy cold call takes well
#: under a second on lavapipe.  Speed is the bench's business: these bounds are far enough
#: above any healthy run (a loaded 2-core machine, the validation layer on) that only the
#: pathology reaches them, and memory, which load does not change, is the sharper one.
COLD_GUARD_S = 60.0
COLD_PEAK_RSS = 2 << 30


def test_cold_compile_bounded():
    """Every extreme call finishes from a cold pipeline cache on lavapipe (a fresh
    VKML_CACHE_DIR, a child process) within :data:`COLD_GUARD_S` and without the
    process's peak memory passing :data:`COLD_PEAK_RSS` (where the OS reports it)."""
    icds = [p for p in os.environ.get("VK_ICD_FILENAMES", "").split(os.pathsep) if "lvp" in p]
    if not icds:
        pytest.skip("lavapipe is not among the drivers")
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, VK_ICD_FILENAMES=icds[0], VKML_CACHE_DIR=cache)
        r = subprocess.run([sys.executable, "-c", COLD], env=env, capture_output=True,
                           text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    print("cold call seconds:", {k: round(v, 3) for k, v in got["seconds"].items()},
          "peak MiB:", {k: v and v >> 20 for k, v in got["peak_rss"].items()})
    slow = {k: v for k, v in got["seconds"].items() if v > COLD_GUARD_S}
    assert not slow, f"cold calls over {COLD_GUARD_S} s (a compile growing with a parameter?): {slow}"
    big = {k: v for k, v in got["peak_rss"].items() if v is not None and v > COLD_PEAK_RSS}
    assert not big, f"peak memory over {COLD_PEAK_RSS} bytes after these calls: {big}"

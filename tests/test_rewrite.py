"""Identity rewrites: matching, the rewritten graphs' invariants, and their numerics against the real
runtimes (LiteRT and TFLite Micro, each compared with itself)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpu_pipeline.toolchain.ir import Graph, Op, Quantization, Tensor
from tpu_pipeline.toolchain.loader import load
from tpu_pipeline.toolchain.ir import ops as ir_ops
from tpu_pipeline.toolchain.ir.convert import rewritten_model, standalone_model
from tpu_pipeline.toolchain.ir.options import (ACTIVATIONS, ConcatenationOptions, Conv2DOptions, DepthwiseConv2DOptions,
                                  FieldlessOptions, FullyConnectedOptions, ReshapeOptions)
from tpu_pipeline.toolchain.memory import peak_memory
from tpu_pipeline.toolchain.rewrite import EXACT, FLOAT_ROUNDING, LOSSY, apply_candidate, find_candidates, rewrite_graph
from tpu_pipeline.toolchain.execute.compare import verify_models
from tpu_pipeline.toolchain.execute.inputs import random_inputs
from tpu_pipeline.toolchain.execute.litert import input_details, run_litert
from tpu_pipeline.toolchain.execute.tflm import run_tflm
from tpu_pipeline.toolchain.rewrite.numerics import conv2d_nhwc
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

FIX = Path(__file__).parent / "fixtures"
U = 2.0 ** -24  # float32 unit roundoff


# ---- helpers ------------------------------------------------------------------------------------
def _bytes_of(graph: Graph, model=None) -> bytes:
    return model_to_bytes(standalone_model(graph, model))


def _index_by_name(graph: Graph, name: str) -> int:
    (idx,) = [t.index for t in graph.tensors if t.name == name]
    return idx


def _check_invariants(before: Graph, after: Graph) -> None:
    assert all(t.index == k for k, t in enumerate(after.tensors))
    assert after.is_topological(range(len(after.ops)))
    used = set(after.inputs) | set(after.outputs)
    for op in after.ops:
        used.update(t for t in (*op.inputs, *op.outputs) if t >= 0)
        assert all(-1 <= t < len(after.tensors) for t in (*op.inputs, *op.outputs))
    # Orphans are gone: every tensor is used, or was already unused in the source graph.
    used_before = {t for op in before.ops for t in (*op.inputs, *op.outputs)} | set(before.inputs) | set(before.outputs)
    unused_before = {before.tensors[t].name for t in range(len(before.tensors)) if t not in used_before}
    for t in after.tensors:
        assert t.index in used or t.name in unused_before, f"orphan tensor {t.name}"
    assert len({t.name for t in after.tensors}) == len(after.tensors) or \
        len({t.name for t in before.tensors}) < len(before.tensors)
    assert [after.tensors[t].name for t in after.outputs] == [before.tensors[t].name for t in before.outputs]


def _runs(data_a: bytes, data_b: bytes, runs=2, seed=0, tflm=True):
    rng = np.random.default_rng(seed)
    details = input_details(data_a)
    for _ in range(runs):
        x = random_inputs(details, rng)
        yield "litert", run_litert(data_a, x)[0], run_litert(data_b, x)[0]
        if tflm:
            yield "tflm", run_tflm(data_a, x), run_tflm(data_b, x)


class Builder:
    """Graphs built by hand (no TensorFlow): tensors, constants, ops."""

    def __init__(self):
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []

    def act(self, name, shape, dtype="float32", quant=None):
        self.tensors.append(Tensor(len(self.tensors), name, dtype, tuple(shape), quant=quant))
        return len(self.tensors) - 1

    def const(self, name, arr, dtype, quant=None):
        arr = np.ascontiguousarray(arr.astype(dtype))
        data = np.frombuffer(arr.tobytes(), dtype=np.uint8).copy()
        self.tensors.append(Tensor(len(self.tensors), name, dtype, arr.shape, quant=quant, data=data))
        return len(self.tensors) - 1

    def op(self, opcode, ins, outs, options=None, version=1):
        self.ops.append(ir_ops.op(opcode, ins, outs, options, version))

    def graph(self, inputs, outputs):
        return Graph(tuple(self.tensors), tuple(self.ops), tuple(inputs), tuple(outputs), "built")


def _conv_opts(fused=0, stride=1, same=True):
    return (Conv2DOptions(padding="SAME" if same else "VALID", stride_w=stride, stride_h=stride,
                          fused_activation=ACTIVATIONS[fused]),)


def _dw_opts(mult, fused=0, same=True):
    return (DepthwiseConv2DOptions(padding="SAME" if same else "VALID", depth_multiplier=mult,
                                   fused_activation=ACTIVATIONS[fused]),)


def _concat_opts(axis=3):
    return (ConcatenationOptions(axis=axis),)


# ---- fixtures: int8 and float32 models from the zoo builder -------------------------------------
@pytest.mark.parametrize("name", ["tiny_irregular_int8", "tiny_irregular_float32"])
def test_depthwise_split_is_bit_exact_in_litert_and_tflm(name):
    model, g = load(FIX / f"{name}.tflite")
    cands = [c for c in find_candidates(g) if c.kinds == ("depthwise_split",)]
    assert cands and all(c.numerics == EXACT for c in cands)
    g2, new_concats = apply_candidate(g, cands[0])
    _check_invariants(g, g2)
    assert len(g2.ops) == len(g.ops) + 1 and len(new_concats) == 1
    assert g2.opcode_histogram()["DEPTHWISE_CONV_2D"] == g.opcode_histogram()["DEPTHWISE_CONV_2D"] + 1
    a, b = model_to_bytes(model), model_to_bytes(rewritten_model(g2, model))
    for runtime, ya, yb in _runs(a, b):
        for u, v in zip(ya, yb):
            assert u.dtype == v.dtype and np.array_equal(u, v), runtime
    # The split depthwise outputs (the new concat's inputs) are slices of the original output.
    y_name = g.tensors[g.ops[cands[0].consumers[0]].outputs[0]].name
    x = random_inputs(input_details(a), np.random.default_rng(7))
    _, ta = run_litert(a, x, [_index_by_name(g, y_name)])
    parts = g2.ops[g2.producer[_index_by_name(g2, y_name)]].inputs
    _, tb = run_litert(b, x, parts)
    assert np.array_equal(ta[_index_by_name(g, y_name)], np.concatenate([tb[p] for p in parts], axis=-1))


def test_int8_partial_conv_needs_allow_lossy():
    _, g = load(FIX / "concat_conv_int8.tflite")
    exact = find_candidates(g)
    assert all(c.numerics != LOSSY for c in exact)
    assert not any("conv_split" in c.kinds for c in exact)
    lossy = find_candidates(g, allow_lossy=True)
    assert any("conv_split" in c.kinds and c.numerics == LOSSY for c in lossy)
    r = rewrite_graph(g, time_limit=5.0)
    assert r.peak_after == r.peak_before and not r.applied  # nothing exact pays here


def test_float_conv_split_within_rounding_bound():
    """Each output element of the split conv differs from the original's by at most
    2 (K + n) u (sum_k |x_k w_k| + |b|): both compute the same sum of K products and a bias,
    associated differently (n partial sums); u = 2^-24."""
    model, g = load(FIX / "concat_conv_float32.tflite")
    (cand,) = find_candidates(g)
    k = next(k for k, kind in zip(cand.consumers, cand.kinds) if kind == "conv_split")
    conv = g.ops[k]
    g2, _ = apply_candidate(g, cand)
    _check_invariants(g, g2)
    a, b = model_to_bytes(model), model_to_bytes(rewritten_model(g2, model))
    cat, y = conv.inputs[0], conv.outputs[0]
    w = g.tensors[conv.inputs[1]].values().astype(np.float64)
    bias = g.tensors[conv.inputs[2]].values().astype(np.float64)
    K = w.shape[1] * w.shape[2] * w.shape[3]
    o = conv.options
    y2 = _index_by_name(g2, g.tensors[y].name)
    for seed in range(2):
        x = random_inputs(input_details(a), np.random.default_rng(seed))
        _, va = run_litert(a, x, [cat, y])
        _, vb = run_litert(b, x, [y2])
        mag = conv2d_nhwc(np.abs(va[cat]), np.abs(w), o.stride_h, o.stride_w, o.dilation_h, o.dilation_w,
                          o.padding == "SAME") + np.abs(bias)
        bound = 2 * (K + cand.branches) * U * mag
        diff = np.abs(va[y].astype(np.float64) - vb[y2])
        assert np.all(diff <= bound), float(np.max(diff - bound))
        # equality is allowed; what makes the check above mean something is that the outputs are
        # not all zero and the bound is far below them (a few ulps, not the values' own size)
        assert np.max(np.abs(va[y])) > 0
        assert np.all(bound <= 1e-3 * mag), float(np.max(bound / np.maximum(mag, 1e-30)))


def test_driver_float_cell_peak_drops_and_outputs_match():
    model, g = load(FIX / "concat_conv_float32.tflite")
    r = rewrite_graph(g, time_limit=5.0, model=model)
    assert r.peak_after < r.peak_before
    assert r.peak_after == peak_memory(r.graph)  # stored order is the scheduled one
    assert r.applied and r.applied[-1].peak_after == r.peak_after
    assert all(a.numerics in (EXACT, FLOAT_ROUNDING) for a in r.applied)
    assert r.ops_after == len(r.graph.ops) > r.ops_before
    assert "CONCATENATION" not in r.graph.opcode_histogram()  # both concats gone
    _check_invariants(g, r.graph)
    new = model_to_bytes(rewritten_model(r.graph, model))
    res = verify_models(model_to_bytes(model), new, runs=2)
    assert [v.runtime for v in res] == ["litert", "tflm"] and all(v.ok and not v.skipped for v in res)


def test_driver_int8_lossy_reports_lsb_deviation():
    model, g = load(FIX / "concat_conv_int8.tflite")
    r = rewrite_graph(g, time_limit=5.0, allow_lossy=True, model=model)
    assert r.lossy and r.peak_after < r.peak_before
    res = verify_models(model_to_bytes(model), model_to_bytes(rewritten_model(r.graph, model)), runs=2,
                        lossy_ok=True)
    for v in res:
        assert v.ok and v.max_deviation_lsb is not None
        assert 0 <= v.max_deviation_lsb <= 16  # calibrated partial sums: a few LSBs, not garbage
    strict = verify_models(model_to_bytes(model), model_to_bytes(rewritten_model(r.graph, model)), runs=1,
                           runtimes=("litert",))
    assert strict[0].ok == strict[0].bit_exact


def test_no_gain_means_no_change():
    model, g = load(FIX / "tiny_irregular_int8.tflite")
    r = rewrite_graph(g, time_limit=5.0, model=model)
    assert r.peak_after <= r.peak_before
    if not r.applied:
        assert r.graph.tensors == g.tensors and len(r.graph.ops) == len(g.ops)


def test_rewritten_model_drops_replaced_filters():
    model, g = load(FIX / "concat_conv_float32.tflite")
    r = rewrite_graph(g, time_limit=5.0, model=model)
    new = rewritten_model(r.graph, model)
    data = model_to_bytes(new)
    # The sliced filters replace the originals: constant bytes grow only by the zero biases.
    before = sum(len(b.data) for b in model.buffers if b.data is not None)
    after = sum(len(b.data) for b in new.buffers if b.data is not None)
    zero_bias = sum(t.nbytes for t in r.graph.tensors if t.is_constant and "/zero" in t.name)
    assert after == before + zero_bias
    read_model(data)  # valid flatbuffer


# ---- hand-built int8 graph: depthwise multiplier 2, per-channel quantization ---------------------
def _int8_dw_graph(mult=2, fused=3):
    rng = np.random.default_rng(3)
    b = Builder()
    q_in = Quantization((0.02,), (-3,), 0)
    q_cat = Quantization((0.05,), (2,), 0)
    x = b.act("x", (1, 8, 8, 4), "int8", q_in)
    branches = []
    for j, c in enumerate((3, 5)):
        sw = tuple(0.01 * (1 + i / 10) for i in range(c))
        w = b.const(f"w{j}", rng.integers(-127, 128, (c, 1, 1, 4)), "int8", Quantization(sw, (0,) * c, 0))
        bias = b.const(f"b{j}", rng.integers(-500, 500, (c,)), "int32",
                       Quantization(tuple(0.02 * s for s in sw), (0,) * c, 0))
        y = b.act(f"y{j}", (1, 8, 8, c), "int8", q_cat)
        b.op("CONV_2D", (x, w, bias), (y,), *_conv_opts(fused=1), version=3)
        branches.append(y)
    cat = b.act("cat", (1, 8, 8, 8), "int8", q_cat)
    b.op("CONCATENATION", branches, (cat,), *_concat_opts(), version=2)
    n = 8 * mult
    sw = tuple(0.004 * (1 + i / 7) for i in range(n))
    w = b.const("dw_w", rng.integers(-127, 128, (1, 3, 3, n)), "int8", Quantization(sw, (0,) * n, 3))
    bias = b.const("dw_b", rng.integers(-900, 900, (n,)), "int32", Quantization(tuple(0.05 * s for s in sw), (0,) * n, 0))
    out = b.act("out", (1, 8, 8, n), "int8", Quantization((0.04,), (-5,), 0))
    b.op("DEPTHWISE_CONV_2D", (cat, w, bias), (out,), *_dw_opts(mult, fused=fused), version=3)
    return b.graph([x], [out])


def test_int8_depthwise_multiplier_two_per_channel_bit_exact():
    g = _int8_dw_graph()
    (cand,) = find_candidates(g)
    assert cand.kinds == ("depthwise_split",) and cand.numerics == EXACT
    g2, _ = apply_candidate(g, cand)
    _check_invariants(g, g2)
    parts = [op for op in g2.ops if op.opcode == "DEPTHWISE_CONV_2D"]
    assert [g2.tensors[op.inputs[1]].shape[-1] for op in parts] == [6, 10]
    assert [len(g2.tensors[op.inputs[1]].quant.scale) for op in parts] == [6, 10]
    a, b = _bytes_of(g), _bytes_of(g2)
    for runtime, ya, yb in _runs(a, b, runs=3):
        assert np.array_equal(ya[0], yb[0]), runtime


# ---- random float DAGs (hypothesis) --------------------------------------------------------------
@st.composite
def float_cells(draw):
    """A random cell: branches from the input (conv / depthwise / relu / pad chains), concatenated on
    channels, the concat read by a conv, a depthwise conv, an element-wise op or a pad, possibly
    more than one of them; outputs summed."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    b = Builder()
    H = draw(st.sampled_from([4, 6]))
    c0 = draw(st.integers(1, 4))
    x = b.act("x", (1, H, H, c0))
    nodes = [(x, c0)]
    for i in range(draw(st.integers(2, 4))):
        src, cs = nodes[draw(st.integers(0, len(nodes) - 1))]
        kind = draw(st.sampled_from(["conv", "conv3", "relu"]))
        c = cs if kind == "relu" else draw(st.integers(1, 5))
        y = b.act(f"n{i}", (1, H, H, c))
        if kind == "relu":
            b.op("RELU", (src,), (y,))
        else:
            k = 1 if kind == "conv" else 3
            w = b.const(f"w{i}", rng.standard_normal((c, k, k, cs)), "float32")
            bias = b.const(f"b{i}", rng.standard_normal(c), "float32")
            b.op("CONV_2D", (src, w, bias), (y,), *_conv_opts(fused=draw(st.sampled_from([0, 1, 3]))))
        nodes.append((y, c))
    picks = draw(st.lists(st.integers(1, len(nodes) - 1), min_size=2, max_size=4))
    ins = [nodes[p][0] for p in picks]
    C = sum(nodes[p][1] for p in picks)
    cat = b.act("cat", (1, H, H, C))
    b.op("CONCATENATION", ins, (cat,), *_concat_opts(draw(st.sampled_from([3, -1]))))
    readers = draw(st.lists(st.sampled_from(["conv", "dw", "relu_conv", "pad_dw", "fc"]), min_size=1, max_size=2,
                            unique=True))
    if readers == ["fc"]:
        readers.append("conv")
    outs = []
    for j, r in enumerate(readers):
        if r == "fc":
            flat = b.act(f"flat{j}", (1, H * H * C))
            shape = b.const(f"shape{j}", np.array([1, H * H * C]), "int32")
            b.op("RESHAPE", (cat, shape), (flat,), ReshapeOptions())
            y = b.act(f"out{j}", (1, 3))
            w = b.const(f"fw{j}", rng.standard_normal((3, H * H * C)), "float32")
            b.op("FULLY_CONNECTED", (flat, w, -1), (y,), FullyConnectedOptions())
            outs.append(y)
            continue
        src = cat
        if r == "relu_conv":
            src = b.act(f"relu{j}", (1, H, H, C))
            b.op("RELU6", (cat,), (src,))
        if r == "pad_dw":
            src = b.act(f"pad{j}", (1, H + 2, H + 2, C))
            pads = b.const(f"pads{j}", np.array([[0, 0], [1, 1], [1, 1], [0, 0]]), "int32")
            b.op("PAD", (cat, pads), (src,), FieldlessOptions("PadOptions"))
        if r in ("conv", "relu_conv"):
            k = draw(st.sampled_from([1, 3]))
            co = draw(st.integers(1, 6))
            w = b.const(f"cw{j}", rng.standard_normal((co, k, k, C)), "float32")
            bias = b.const(f"cb{j}", rng.standard_normal(co), "float32")
            y = b.act(f"out{j}", (1, H, H, co))
            b.op("CONV_2D", (src, w, bias), (y,), *_conv_opts(fused=draw(st.sampled_from([0, 1, 2, 3]))))
        else:
            m = draw(st.integers(1, 2))
            w = b.const(f"dw{j}", rng.standard_normal((1, 3, 3, C * m)), "float32")
            bias = b.const(f"db{j}", rng.standard_normal(C * m), "float32")
            hw = H if r == "dw" else H + 2
            y = b.act(f"out{j}", (1, hw, hw, C * m))
            b.op("DEPTHWISE_CONV_2D", (src, w, bias), (y,), *_dw_opts(m, fused=draw(st.sampled_from([0, 1, 3]))))
        outs.append(y)
    return b.graph([x], outs)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(float_cells())
def test_random_float_cells_every_rewrite_preserves_outputs(g):
    a = _bytes_of(g)
    cands = find_candidates(g)
    assert cands, "every generated cell has a concat a rewrite matches"
    for cand in cands:
        g2, new_concats = apply_candidate(g, cand)
        _check_invariants(g, g2)
        follow = find_candidates(g2, concat_outputs=new_concats) if new_concats else []
        graphs = [(cand, g2)] + [(f, apply_candidate(g2, f)[0]) for f in follow]
        for c, gx in graphs:
            bx = _bytes_of(gx)
            for runtime, ya, yb in _runs(a, bx, runs=1, tflm=False):
                for u, v in zip(ya, yb):
                    if c.numerics == EXACT and gx is g2:
                        assert np.array_equal(u, v), (runtime, c.kind)
                    tol = 1e-4 * max(1.0, float(np.max(np.abs(u))))
                    assert np.max(np.abs(u - v)) <= tol, (runtime, c.kind)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(float_cells())
def test_random_float_cells_driver_never_worse(g):
    r = rewrite_graph(g, time_limit=2.0)
    assert r.peak_after <= r.peak_before
    assert r.peak_after == peak_memory(r.graph)
    _check_invariants(g, r.graph)
    if r.applied:
        for runtime, ya, yb in _runs(_bytes_of(g), _bytes_of(r.graph), runs=1):
            for u, v in zip(ya, yb):
                assert np.max(np.abs(u - v)) <= 1e-4 * max(1.0, float(np.max(np.abs(u)))), runtime


def _fc_graph(int8=False):
    rng = np.random.default_rng(5)
    b = Builder()
    dt = "int8" if int8 else "float32"
    q = (lambda s, z: Quantization((s,), (z,), 0)) if int8 else (lambda s, z: None)
    x = b.act("x", (1, 6), dt, q(0.05, 0))
    parts = []
    for j, n in enumerate((4, 7, 5)):
        if int8:
            w = b.const(f"w{j}", rng.integers(-127, 128, (n, 6)), "int8", q(0.01, 0))
            bias = b.const(f"b{j}", rng.integers(-300, 300, (n,)), "int32", q(0.0005, 0))
        else:
            w = b.const(f"w{j}", rng.standard_normal((n, 6)), "float32")
            bias = b.const(f"b{j}", rng.standard_normal(n), "float32")
        y = b.act(f"h{j}", (1, n), dt, q(0.08, -10))
        b.op("FULLY_CONNECTED", (x, w, bias), (y,), FullyConnectedOptions(fused_activation="RELU"), 4 if int8 else 1)
        parts.append(y)
    cat = b.act("cat", (1, 16), dt, q(0.08, -10))
    b.op("CONCATENATION", parts, (cat,), *_concat_opts(1))
    if int8:
        w = b.const("wo", rng.integers(-127, 128, (3, 16)), "int8", q(0.01, 0))
        bias = b.const("bo", rng.integers(-300, 300, (3,)), "int32", q(0.0008, 0))
    else:
        w = b.const("wo", rng.standard_normal((3, 16)), "float32")
        bias = b.const("bo", rng.standard_normal(3), "float32")
    out = b.act("out", (1, 3), dt, q(0.1, 0))
    b.op("FULLY_CONNECTED", (cat, w, bias), (out,), FullyConnectedOptions(fused_activation="RELU6"), 4 if int8 else 1)
    return b.graph([x], [out])


def test_fully_connected_split_float_and_lossy_int8():
    g = _fc_graph()
    (cand,) = find_candidates(g)
    assert cand.kinds == ("fc_split",) and cand.numerics == FLOAT_ROUNDING and cand.removes_concat
    g2, _ = apply_candidate(g, cand)
    _check_invariants(g, g2)
    assert g2.opcode_histogram() == {"FULLY_CONNECTED": 6, "ADD": 2}
    for runtime, ya, yb in _runs(_bytes_of(g), _bytes_of(g2), runs=2):
        assert np.max(np.abs(ya[0] - yb[0])) <= 2 * (16 + 3) * U * 100, runtime
    gi = _fc_graph(int8=True)
    assert not find_candidates(gi)
    (cand,) = find_candidates(gi, allow_lossy=True)
    assert cand.numerics == LOSSY
    r = rewrite_graph(gi, time_limit=2.0, allow_lossy=True, kinds={"fc_split"})
    g3, _ = apply_candidate(gi, cand, _values(gi, cand))
    res = verify_models(_bytes_of(gi), _bytes_of(g3), runs=3, lossy_ok=True)
    assert all(v.ok and v.max_deviation_lsb <= 8 for v in res)
    assert r.peak_after <= r.peak_before


def _values(g, cand):
    from tpu_pipeline.toolchain.rewrite.numerics import calibration_values

    vals = calibration_values(g, g.ops[cand.concat].inputs)
    return lambda t: vals[t]


def _wide_cell(branches=4, width=16, out_ch=8, H=16):
    """Branches wider than the conv that mixes them: the textbook case where splitting pays."""
    rng = np.random.default_rng(11)
    b = Builder()
    x = b.act("x", (1, H, H, 4))
    ys = []
    for j in range(branches):
        w = b.const(f"w{j}", rng.standard_normal((width, 3, 3, 4)) * 0.3, "float32")
        bias = b.const(f"b{j}", rng.standard_normal(width), "float32")
        y = b.act(f"y{j}", (1, H, H, width))
        b.op("CONV_2D", (x, w, bias), (y,), *_conv_opts(fused=1))
        ys.append(y)
    cat = b.act("cat", (1, H, H, branches * width))
    b.op("CONCATENATION", ys, (cat,), *_concat_opts())
    w = b.const("mix_w", rng.standard_normal((out_ch, 1, 1, branches * width)) * 0.2, "float32")
    bias = b.const("mix_b", rng.standard_normal(out_ch), "float32")
    out = b.act("out", (1, H, H, out_ch))
    b.op("CONV_2D", (cat, w, bias), (out,), *_conv_opts(fused=3))
    return b.graph([x], [out])


def test_generated_wide_cell_peak_drops_outputs_match():
    g = _wide_cell()
    r = rewrite_graph(g, time_limit=5.0)
    assert r.proven_optimal and r.peak_after < r.peak_before
    # before: the four branches and their concat (2 x 64 float channels at 16x16); after: at a
    # partial conv, the input, one branch, its partial sum and the running sum (4+16+8+8 channels)
    assert r.peak_before == 2 * 64 * 16 * 16 * 4
    assert r.peak_after == (4 + 16 + 8 + 8) * 16 * 16 * 4
    assert [a.kind for a in r.applied] == ["conv_split"]
    for runtime, ya, yb in _runs(_bytes_of(g), _bytes_of(r.graph), runs=2):
        assert np.max(np.abs(ya[0] - yb[0])) <= 1e-4 * max(1.0, float(np.max(np.abs(ya[0])))), runtime


def test_runtime_exactness_check_that_guards_int8_depthwise_splits():
    """Under the exact policy an int8 depthwise split is kept only if LiteRT's optimized kernels
    (which pick a path by channel count) and TFLite Micro both reproduce the unsplit outputs."""
    from tpu_pipeline.toolchain.rewrite.driver import _bit_exact_in_runtimes

    model, graph = load(FIX / "concat_conv_int8.tflite")
    assert _bit_exact_in_runtimes(graph, graph, model)
    lossy = rewrite_graph(graph, time_limit=5.0, allow_lossy=True, model=model)
    assert any(a.numerics == LOSSY for a in lossy.applied)
    assert not _bit_exact_in_runtimes(graph, lossy.graph, model)  # requantized partial sums differ

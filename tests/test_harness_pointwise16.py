"""The pointwise kernel on re-laid weights (flag "pointwise16", ir/kernel_variants/pointwise16.py,
harness/tpup_pointwise.cc): which convolutions it takes; its input 4 laid out as the pass reads
it (checked by replaying the pass's arithmetic on the words against the layer's integer sums);
fit's fastest point takes it before "pointwise"; on the emulated board (both kernel sets)
bit-identical to the host's TFLite Micro on 1x1 layers with odd sizes, channel counts not
multiples of four or three, strides 1 and 2, relu / relu6 / none, per-channel and per-tensor
scales, no bias, in place (rows through a ring), one-pixel outputs (a lone pixel paired with
itself), 257 to 512 input channels (the widened pair on the stack) and more (its fallback) and
cheap requantisation proven and refused; and on MLPerf Tiny's kws (TPUP_MLPERF_DIR)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.cnn_builder import CnnBuilder
from helpers.firmware import (graph_in_qemu, mlperf_on_harness, model_for_qemu, needs_arm, needs_mlperf, needs_qemu,
                              qemu_run_as_planned)
from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.toolchain.ir import from_model, kernels
from tpu_pipeline.toolchain.ir.convert import to_model
from tpu_pipeline.toolchain.ir.graph import Quantization
from tpu_pipeline.toolchain.ir.kernel_variants import pointwise16
from tpu_pipeline.toolchain.ir.kernel_variants.packed import WINS_MAX_CHANNELS
from tpu_pipeline.toolchain.ir.kernels import OVERLAP, POINTWISE, can_run_variant, kernel_name, with_kernel
from tpu_pipeline.toolchain.ir.requant import pointwise_requant_proven, requant
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

PW16 = "pointwise16"
BOARD = load_device("qemu-mps2-an386")


def _per_tensor(b: CnnBuilder, op_pos: int) -> None:
    """Op `op_pos`'s weights quantised per tensor (their largest scale)."""
    t = b.tensors[b.ops[op_pos].inputs[1]]
    b.tensors[t.index] = dataclasses.replace(t, quant=Quantization((max(t.quant.scale),), (0,), 0))


def _halves(b: CnnBuilder, x: int, cout: int) -> int:
    """A 1x1 layer whose rounding meets exact halves often (weights in [-2, 2], no bias, shift -1:
    a negative half rounds away from zero, which a plain add-and-shift gets wrong)."""
    y = b.conv(x, cout, k=1)
    op = b.ops[-1]
    w, bias = b.tensors[op.inputs[1]], b.tensors[op.inputs[2]]
    for t, v in ((w, b.rng.integers(-2, 3, w.shape).astype(np.int8)), (bias, np.zeros(cout, "<i4"))):
        data = np.frombuffer(v.tobytes(), dtype=np.uint8).copy()
        data.flags.writeable = False
        b.tensors[t.index] = dataclasses.replace(t, data=data)
    t = b.tensors[y]
    scale = b._scale(x) * float(np.max(w.quant.scale)) * 2.1
    b.tensors[y] = dataclasses.replace(t, quant=Quantization((scale,), t.quant.zero_point))
    return y


def _layers(seed=17):
    """(builder, outputs): a chain of 1x1 layers covering the kernel's paths."""
    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 7, 9, 13))  # 63 pixels (odd), 13 channels: three groups of four and one left over
    a = b.conv(x, 22, k=1, act="RELU6")  # 22 = 7 triples + 1: the last triple overlaps
    s = b.conv(a, 5, k=1)  # projection, no activation
    halves = _halves(b, s, 7)
    e = b.conv(s, 17, k=1, stride=2, act="RELU")  # strided: 4 x 5 pixels
    _per_tensor(b, len(b.ops) - 1)
    f = b.conv(e, 3, k=1, act="RELU6")  # exactly one triple
    b.ops[-1] = dataclasses.replace(b.ops[-1], inputs=(*b.ops[-1].inputs[:2], -1))  # no bias
    wide = b.conv(f, 520, k=1, act="RELU")  # 520 output channels ...
    deep = b.conv(wide, 7, k=1, stride=2)  # ... read by 520 input channels: past the stack's pair (512)
    mid = b.conv(deep, 300, k=1, act="RELU")  # 300 channels ...
    narrow = b.conv(mid, 7, k=1)  # ... read by 300: the pair on the stack (257 to 512 input channels)
    lone = b.conv(b.pool(mid, k=2, stride=2), 5, k=1)  # one pixel of 300 channels: paired with itself
    one = b.conv(b.pool(narrow, k=2, stride=2), 9, k=1, act="RELU6")  # a 1 x 1 output: one pixel
    one = b.add(one, b.conv(lone, 9, k=1))
    return b, [one, halves]


def _on_pw16(b, outs):
    g = b.graph(outs)
    convs = [i for i, op in enumerate(g.ops) if op.opcode == "CONV_2D"]
    g = with_kernel(g, convs, kernel_name(PW16))
    g = with_kernel(g, [convs[0]], kernel_name(PW16, OVERLAP))  # output over its input: rows through a ring
    return g, model_to_bytes(to_model(g, read_model(b.model_bytes(outs))))


def test_what_it_takes():
    b = CnnBuilder(seed=2, spread=True)
    x = b.input((1, 8, 8, 8))
    one = b.conv(x, 8, k=1, stride=2)
    two = b.conv(one, 2, k=1)
    three = b.conv(two, 8, k=3)
    g = b.graph([three])
    assert [can_run_variant(g, i, PW16) for i in range(3)] == [True, False, False]
    assert can_run_variant(g, 1, POINTWISE)  # two channels: the pointwise kernel's
    for i in (1, 2):
        with pytest.raises(ValueError):
            with_kernel(g, [i], kernel_name(PW16))


def _replay(words: np.ndarray, x: np.ndarray, c_in: int, k_out: int) -> np.ndarray:
    """What the pass computes from input 4's words: per triple its biases plus, per pair-word,
    the SMLAD of the widened input pair (lanes (0, 2), (1, 3) of each four channels) with each
    channel's word; int64 [K] (a channel of an overlapping last triple from that triple)."""
    groups = -(-c_in // 4)
    xp = np.zeros(groups * 4, np.int64)
    xp[:c_in] = x
    xq = xp.reshape(groups, 4)
    xpairs = np.stack([xq[:, [0, 2]], xq[:, [1, 3]]], axis=1).reshape(-1, 2)  # per pair-word
    stride = 12 + 6 * groups
    out = np.zeros(k_out, np.int64)
    u = words.astype(np.int64)
    for t, c in enumerate(min(c, k_out - 3) for c in range(0, k_out, 3)):
        block = u[t * stride:(t + 1) * stride]
        pw = block[12:].reshape(-1, 3).astype(np.uint32)
        lo = (pw & 0xFFFF).astype(np.int16).astype(np.int64)
        hi = (pw >> 16).astype(np.int16).astype(np.int64)
        out[c:c + 3] = block[:3] + xpairs[:, :1].T @ lo + xpairs[:, 1:].T @ hi
    return out


def test_its_relaid_weights_are_what_the_pass_reads():
    """Replaying the pass on input 4 gives the layer's integer sums for random inputs, and the
    header carries each channel's multiplier, right shift and rounding nudge. (Swap the lanes of
    a pair-word in `relaid_weights` and this fails.)"""
    from tpu_pipeline.toolchain.ir.requant import requant, weights_bias

    b, outs = _layers()
    g = b.graph(outs)
    rng = np.random.default_rng(3)
    for op in [op for op in g.ops if op.opcode == "CONV_2D"]:
        w, bias = weights_bias(g, op)
        k_out, c_in = w.shape[0], w.shape[3]
        words = pointwise16.relaid_weights(g, op)
        assert words.dtype == np.dtype("<i4") and len(words) == -(-k_out // 3) * (12 + 6 * -(-c_in // 4))
        for _ in range(3):
            x = rng.integers(-255, 256, c_in)
            assert np.array_equal(_replay(words, x, c_in, k_out), bias + w.reshape(k_out, -1) @ x)
        m, shift = requant(g, op)
        last = min(3 * ((k_out - 1) // 3), k_out - 3)
        header = words[-(12 + 6 * -(-c_in // 4)):][:12]
        assert list(header[3:6]) == list(m[last:last + 3]) and list(header[6:9]) == list(-shift[last:last + 3])
        zp = int(g.tensors[op.outputs[0]].quant.zero_point[0])
        r = -int(shift[last])
        assert int(header[9]) == (1 << (r - 1)) + zp * (1 << r)


def test_no_buffer_its_flags_survive_the_file_and_fit_takes_it_first():
    from tpu_pipeline.toolchain.fit.variants import on_harness

    b, outs = _layers()
    g, data = _on_pw16(b, outs)
    sem = get_semantics("tflm-cmsis-nn")
    assert all(scratch_requests(g, i, sem) == [] for i, op in enumerate(g.ops) if kernels.flags(op) == {PW16})
    back = from_model(read_model(data))
    assert [op.kernel for op in back.ops] == [op.kernel for op in g.ops]
    assert all(len(op.inputs) == 5 for op in back.ops if PW16 in kernels.flags(op))
    h, _ = on_harness(b.graph(outs))
    convs = [op for op in h.ops if op.opcode == "CONV_2D"]
    few = [h.tensors[op.inputs[1]].shape[3] <= WINS_MAX_CHANNELS for op in convs]  # (packed's first)
    assert [PW16 in kernels.flags(op) for op in convs] == [not f for f in few] and sum(few) == 1
    proven = [pointwise_requant_proven(h, op) for op in convs]
    assert any(proven)
    halves = next(op for op in h.ops if op.outputs[0] == h.outputs[1])
    assert set(requant(h, halves)[1]) == {-1} and pointwise_requant_proven(h, halves)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    b, out = _layers()
    return model_for_qemu(tmp_path_factory, "pw16", _on_pw16(b, out)[1])


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_it_is_bit_identical_in_qemu(model, kernels_set):
    r = qemu_run_as_planned(model, BOARD, kernels_set, iterations=3, seed=9)
    # the firmware's stack high-water mark holds the pair's 2 KB frame (257 to 512 input channels)
    assert 4 * 512 < r.stack_used_bytes < r.stack_bytes_reserved


@needs_arm
@needs_qemu
@needs_mlperf("kws_ref_model")
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_mlperf_kws_on_it_is_bit_identical_in_qemu(tmp_path, kernels_set):
    g, src = mlperf_on_harness("kws_ref_model")
    assert sum(PW16 in kernels.flags(op) for op in g.ops) == 4
    graph_in_qemu(tmp_path, g, src, BOARD, kernels_set, iterations=2, seed=4)


def test_a_patch_stage_runs_its_layers_on_pointwise16_and_a_dropped_one_on_its_twin():
    """tpup_stage.cc runs pointwise16 (layer word 21 names the re-laid weights): a stage keeps those
    1x1 layers on it. Where a stage does not run it (`without`), the layer goes on its twin
    "pointwise", not on the kernel set's paths. (Drop the twin in rewrite/patch_stage.py
    stage_layers and this fails.)"""
    from tpu_pipeline.toolchain.fit.variants import on_harness
    from tpu_pipeline.toolchain.ir import stage
    from tpu_pipeline.toolchain.rewrite.patch import checked_region, patch_regions
    from tpu_pipeline.toolchain.rewrite.patch_stage import build_stage, stage_layers, stage_refusal

    b = CnnBuilder(seed=8, spread=True)
    x = b.input((1, 21, 18, 8))
    e = b.conv(x, 30, k=1, act="RELU6")
    out = b.conv(b.dw(e, k=3, act="RELU6"), 12, k=1)
    g, _ = on_harness(b.graph([out]))
    assert [PW16 in kernels.flags(op) for op in g.ops] == [True, False, True]
    regions = [r for r in patch_regions(g) if stage_refusal(g, checked_region(g, r)[2]) is None]
    tin, tout, positions = checked_region(g, max(regions, key=lambda r: len(r.ops)))
    staged = build_stage(g, tin, tout, positions, (3, 2))
    body = next(op for op in staged.ops if stage.is_stage(op)).options.body
    ones = [op.kernel for op in body.ops if op.opcode == "CONV_2D"]
    assert ones == [kernel_name(PW16)] * 2
    lean = stage_layers(g, positions, without={PW16: set(positions)})
    assert [lean.ops[i].kernel for i in positions if lean.ops[i].opcode == "CONV_2D"] == [kernel_name(POINTWISE)] * 2

"""The harness's MEAN and MUL (tpu_pipeline.toolchain.ir.kernels "means and products",
harness/tpup_mean_mul.cc): which ops they take, their options through the file, the host's
builtin view, no tail and no scratch; on the emulated board (both kernel sets) bit-identical to
the host's TFLite Micro on squeeze-and-excitation shapes as MCUNetV2 and MobileNetV3 write them."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

from helpers.cnn_builder import CnnBuilder
from helpers.firmware import model_for_qemu, needs_arm, needs_qemu, qemu_run_as_planned, qemu_run_matching, written
from tpu_pipeline.toolchain.device import CMSIS_NN, REFERENCE, load_device
from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.execute.compare import verify_models
from tpu_pipeline.toolchain.fit.variants import on_harness
from tpu_pipeline.toolchain.ir import from_model, kernels
from tpu_pipeline.toolchain.ir.convert import builtin_view_bytes, standalone_model, to_model
from tpu_pipeline.toolchain.ir.kernels import kernel_name, mean_axes, mean_mul_refusal, mean_requant, with_kernel
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.memory.tflm_target import target_tail
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

BOARD = load_device("qemu-mps2-an386")


def _se(seed=23):
    """Two squeeze-and-excitation blocks: MCUNetV2's (MEAN over W, then over H, a scalar MUL, the
    scaling MUL with the per-channel operand second; 10 channels: a group of 4 left over) and
    MobileNetV3's (one MEAN over H and W, the per-channel operand first, a RELU6 product of equal
    shapes), and a MEAN over the last axis (one element per run)."""
    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 9, 7, 10))
    d = b.dw(b.conv(x, 10, k=1, act="RELU6"), k=3, act="RELU6")
    s = b.mean(b.mean(d, axes=(2,), scale=0.03), axes=(1,), scale=0.02)
    s = b.conv(b.conv(s, 4, k=1, act="RELU"), 10, k=1)
    three = b._tensor((1,), "int8", quant=b.tensors[s].quant, values=[60])
    m = b.mul(s, three)
    y = b.mul(d, m)
    g = b.mean(y, axes=(1, 2), scale=0.05)
    e = b.conv(y, 12, k=1, act="RELU6")
    gc = b.conv(g, 12, k=1)
    z = b.mul(e, gc, act="RELU6")
    b.ops[-1] = dataclasses.replace(b.ops[-1], inputs=(gc, e))  # the broadcast operand first
    w = b.mul(z, b.conv(z, 12, k=1), act="RELU6")  # equal shapes
    last = b.mean(w, axes=(-1,), keep_dims=False, scale=0.04)
    return b, [last, w]


def _mean_mul(graph):
    return [i for i, op in enumerate(graph.ops) if op.opcode in kernels.MEAN_MUL]


def test_every_mean_and_mul_of_the_blocks_runs_on_the_harness():
    b, outs = _se()
    g = b.graph(outs)
    ops = _mean_mul(g)
    assert len(ops) == 8 and all(mean_mul_refusal(g, g.ops[i]) is None for i in ops)
    moved, notes = on_harness(g)
    assert {i for i, op in enumerate(moved.ops) if op.opcode in kernels.MEAN_MUL and op.kernel == "tpup"} == set(ops)
    assert "4 MEAN and 4 MUL on the harness's own kernels" in notes[0]
    means = [i for i in ops if g.ops[i].opcode == "MEAN"]
    assert [mean_axes(g, g.ops[i]) for i in means] == [(9, 7, 10), (1, 9, 10), (1, 63, 10), (63, 12, 1)]


def test_means_and_muls_the_harness_refuses():
    b = CnnBuilder(seed=2, spread=True)
    x = b.input((1, 6, 5, 8))
    apart = b.mean(x, axes=(1, 3), scale=0.05)  # not adjacent axes
    h = b.conv(x, 8, k=1)
    col = b.conv(b.mean(x, axes=(2,)), 8, k=1)  # [1, 6, 1, 8]: a broadcast along W, not the last axis
    m = b.mul(h, col)
    g = b.graph([apart, m])
    assert "adjacent" in mean_mul_refusal(g, g.ops[0])
    assert "broadcast" in mean_mul_refusal(g, g.ops[-1])
    with pytest.raises(ValueError):
        with_kernel(g, [0], kernel_name())
    with pytest.raises(ValueError):  # no flags for these
        with_kernel(g, [2], kernel_name(kernels.DIRECT))


def test_mean_requantization_is_tflites_with_the_count_folded_in():
    b = CnnBuilder(seed=3)
    x = b.input((1, 28, 28, 8))
    y = b.mean(x, axes=(2,), scale=b._scale(x))  # equal scales: 2^30 x 2 / 28
    g = b.graph([y])
    m, s = mean_requant(g, g.ops[0])
    assert (m, s) == ((1 << 30 << 4) // 28, 1 - 4)


def test_options_round_trip_and_the_builtin_view_computes_the_same():
    b, outs = _se()
    g = b.graph(outs)
    src = b.model_bytes(outs)
    h = with_kernel(g, _mean_mul(g), kernel_name())
    data = written(h, src)
    back = from_model(read_model(data))
    assert [(op.opcode, op.inputs, op.options, op.kernel) for op in back.ops] == \
        [(op.opcode, op.inputs, op.options, op.kernel) for op in h.ops]
    codes = {bytes(c.customCode or b"").decode() for c in read_model(data).operatorCodes}
    assert {"TPUP_MEAN", "TPUP_MUL"} <= codes
    assert builtin_view_bytes(data) != data
    results = verify_models(src, data, runs=2)
    assert all(o.ok and o.max_abs == 0 for r in results for o in r.outputs)


@pytest.mark.parametrize("code,words", [("TPUP_MEAN", [1, 1, 0, 7, 10, 0, 0, 1, -3, 1]),
                                        ("TPUP_MEAN", [1, 1, 1]),
                                        ("TPUP_MUL", [1, 1, 3, 0, 0, 0, 1 << 30, 0, -128, 127, 0]),
                                        ("TPUP_MUL", [1, 1, 0, 0, 0, 0, 1 << 30, 0, 5, 4, 0])])
def test_malformed_options_are_a_model_error(code, words):
    b, outs = _se()
    g = b.graph(outs)
    at = next(i for i in _mean_mul(g) if kernels.custom_code(g.ops[i]) == code)
    model = to_model(with_kernel(g, [at], kernel_name()), standalone_model(g))
    model.subgraphs[0].operators[at].customOptions = list(struct.pack(f"<{len(words)}i", *words))
    with pytest.raises(ModelError, match=code):
        from_model(read_model(model_to_bytes(model)))


def test_no_tail_and_no_scratch():
    b, outs = _se()
    g = b.graph(outs)
    h = with_kernel(g, _mean_mul(g), kernel_name())
    for kset, sem_name in ((REFERENCE, "tflm"), (CMSIS_NN, "tflm-cmsis-nn")):
        sem = get_semantics(sem_name)
        means = [i for i in _mean_mul(g) if g.ops[i].opcode == "MEAN"]
        assert all(scratch_requests(g, i, sem) for i in means)  # TFLite's MEAN asks for three
        assert not any(scratch_requests(h, i, sem) for i in _mean_mul(h))
        names = [what for what, _, _ in target_tail(h, kset).allocations]
        assert not any(f"op {i} " in what for i in _mean_mul(h) for what in names)
        assert target_tail(h, kset).bytes < target_tail(g, kset).bytes


# ---- on the emulated board ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(tmp_path_factory):
    b, outs = _se()
    g = b.graph(outs)
    h = with_kernel(g, _mean_mul(g), kernel_name())
    return model_for_qemu(tmp_path_factory, "se", written(h, b.model_bytes(outs))), h


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_mean_and_mul_run_bit_identical_in_qemu(model, kernels_set):
    path, h = model
    r = qemu_run_as_planned(path, BOARD, kernels_set, iterations=3, seed=5)
    ran = {o["index"]: o["opcode"] for o in r.op_instructions}
    assert {i for i, code in ran.items() if code in ("TPUP_MEAN", "TPUP_MUL")} == set(_mean_mul(h))
    assert np.isfinite(r.instructions)


# ---- the fast MUL (harness/tpup_mean_mul.cc MulFast): its requantization exact at every shift ----
# Scale ratios whose TFLite shifts are 1 (right 1: the fast loop's first), 5, 22 (its last), 26 and 0
# (the exact loop: rounding beyond its proof, no rounding shift) and +1 (a left shift: the exact loop).
RATIOS = (0.3, 1 / 60, 2.0e-7, 1.0e-8, 0.7, 2.0)


def _muls(seed=41):
    """Broadcast MULs over 13 channels (three groups of four and one left over) at every ratio of
    RATIOS, RELU6 and none, the per-channel operand second and first, and a scalar one."""
    from tpu_pipeline.toolchain.ir.graph import Quantization

    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 5, 7, 13))
    d = b.conv(x, 13, k=1, act="RELU6")  # (ReLU's zeros: whole words at the zero point)
    s = b.conv(b.mean(d, scale=0.03), 13, k=1)
    one = b._tensor((1,), "int8", quant=b.tensors[s].quant, values=[-77])
    outs = []
    for k, ratio in enumerate(RATIOS):
        for act in ("NONE", "RELU6"):
            y = b.mul(d, s, act=act)
            if k % 2:
                b.ops[-1] = dataclasses.replace(b.ops[-1], inputs=(s, d))
            q = b.tensors[y].quant
            b.tensors[y] = dataclasses.replace(b.tensors[y], quant=Quantization(
                (b._scale(d) * b._scale(s) / ratio,), (q.zero_point[0] if act == "NONE" else -128,)))
            outs.append(y)
    outs.append(b.mul(d, one))
    return b, outs


def test_the_muls_cover_both_loops():
    b, outs = _muls()
    g = b.graph(outs)
    shifts = {kernels.mul_requant(g, op)[1] for op in g.ops if op.opcode == "MUL"}
    assert {-1, -5, -22, -26, 0, 1} <= shifts
    assert {kernels.mul_broadcast(g, op) for op in g.ops if op.opcode == "MUL"} == {1, 2}


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_fast_mul_is_bit_identical_at_every_shift(tmp_path, kernels_set):
    b, outs = _muls()
    g = b.graph(outs)
    h = with_kernel(g, _mean_mul(g), kernel_name())
    path = tmp_path / "muls.tflite"
    path.write_bytes(written(h, b.model_bytes(outs)))
    r = qemu_run_matching(path, BOARD, kernels_set, iterations=2, seed=9)
    assert sum(o["opcode"] == "TPUP_MUL" for o in r.op_instructions) == len(RATIOS) * 2 + 1

"""The harness's own 1x1 kernel (flag "pointwise", harness/tpup_pointwise.cc): which convolutions
it takes, no buffer in the memory model, the flag and its requantisation proof through the file,
the proof refusing what it must; on the emulated board (both kernel sets) bit-identical to the
host's TFLite Micro on 1x1 layers with odd and non-multiple-of-four channel counts, strides 1 and
2, relu6, no bias, in place, tiny outputs (no room for the widened pair), per-channel scales whose
cheap requantisation is proven and refused, and on a real model (DARTS, tests/fixtures)."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import numpy as np
import pytest

from helpers.cnn_builder import CnnBuilder
from helpers.firmware import (HAVE_ARM, HAVE_QEMU, exported_arena, graph_in_qemu, model_for_qemu, needs_arm, needs_qemu,
                              qemu_run_as_planned, qemu_run_matching)
from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.toolchain.ir import from_model, kernels
from tpu_pipeline.toolchain.ir.convert import to_model
from tpu_pipeline.toolchain.ir.graph import Quantization
from tpu_pipeline.toolchain.ir.kernels import OVERLAP, POINTWISE, can_run_variant, kernel_name, with_kernel
from tpu_pipeline.toolchain.ir.requant import pointwise_requant_proven, requant
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

BOARD = load_device("qemu-mps2-an386")
FIXTURES = Path(__file__).resolve().parent / "fixtures"
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _with_bias(b: CnnBuilder, op_pos: int, values) -> None:
    """Op `op_pos`'s bias replaced by `values` (same quantization)."""
    t = b.tensors[b.ops[op_pos].inputs[2]]
    data = np.frombuffer(np.asarray(values, dtype="<i4").tobytes(), dtype=np.uint8).copy()
    data.flags.writeable = False
    b.tensors[t.index] = dataclasses.replace(t, data=data)


def _with_output_scale(b: CnnBuilder, y: int, scale: float) -> None:
    t = b.tensors[y]
    b.tensors[y] = dataclasses.replace(t, quant=Quantization((scale,), t.quant.zero_point))


def _with_weights(b: CnnBuilder, op_pos: int, values) -> None:
    t = b.tensors[b.ops[op_pos].inputs[1]]
    data = np.frombuffer(np.asarray(values, dtype=np.int8).tobytes(), dtype=np.uint8).copy()
    data.flags.writeable = False
    b.tensors[t.index] = dataclasses.replace(t, data=data)


def _layers(seed=41):
    """(builder, outputs) of a chain of 1x1 layers covering the kernel's paths, and a layer whose
    rounding meets exact halves often (shift -1, small sums: a negative half rounds away from
    zero, which a plain add-and-shift gets wrong)."""
    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 9, 11, 13))  # 13 channels: three groups of four and one left over
    a = b.conv(x, 24, k=1, act="RELU6")  # expansion
    s = b.conv(a, 7, k=1)  # odd output channels, projection (the widened pair takes most of the output)
    d = b.dw(s, k=3, act="RELU6")
    halves = b.conv(d, 6, k=1)
    _with_weights(b, len(b.ops) - 1, b.rng.integers(-2, 3, (6, 1, 1, 7)))
    _with_bias(b, len(b.ops) - 1, [0] * 6)
    _with_output_scale(b, halves, b._scale(d) * float(np.max(b.tensors[b.ops[-1].inputs[1]].quant.scale)) * 2.1)
    e = b.conv(d, 21, k=1, stride=2, act="RELU6")  # strided, odd channels
    b.ops[-1] = dataclasses.replace(b.ops[-1], inputs=(*b.ops[-1].inputs[:2], -1))  # no bias
    f = b.conv(e, 16, k=1, act="RELU6")
    ref = b.conv(f, 12, k=1)  # scales >= 0.5 on some channels: the cheap requantisation refused
    _with_output_scale(b, ref, b._scale(f) * float(np.min(b.tensors[b.ops[-1].inputs[1]].quant.scale)) * 1.3)
    big = b.conv(ref, 9, k=1)  # accumulators past 2^30: refused
    _with_bias(b, len(b.ops) - 1, [(1 << 30) - 5] * 4 + [-(1 << 30)] * 5)
    tiny = b.conv(b.pool(big, k=3, stride=3), 40, k=1, act="RELU")  # a 1 x 2 output, 9 -> 40: no room for the pair
    one = b.conv(tiny, 1, k=1)  # one output channel
    return b, [b.conv(one, 6, k=1, act="RELU6"), halves]  # one input channel (no group of four)


def _on_pointwise(b, outs):
    g = b.graph(outs)
    convs = [i for i, op in enumerate(g.ops) if op.opcode == "CONV_2D"]
    g = with_kernel(g, convs, kernel_name(POINTWISE))
    g = with_kernel(g, [convs[0]], kernel_name(POINTWISE, OVERLAP))  # output over its input: rows through a ring
    return g, model_to_bytes(to_model(g, read_model(b.model_bytes(outs))))


def test_what_the_pointwise_kernel_takes():
    b = CnnBuilder(seed=2, spread=True)
    x = b.input((1, 8, 8, 8))
    one = b.conv(x, 8, k=1, stride=2)
    three = b.conv(one, 8, k=3)
    dw = b.dw(three, k=1)
    g = b.graph([dw])
    assert [can_run_variant(g, i, POINTWISE) for i in range(3)] == [True, False, False]
    for i in (1, 2):
        with pytest.raises(ValueError):
            with_kernel(g, [i], kernel_name(POINTWISE))


def test_it_asks_for_no_buffer_and_its_flags_survive_the_file():
    b, out = _layers()
    g, data = _on_pointwise(b, out)
    sem = get_semantics("tflm-cmsis-nn")
    plain = [i for i, op in enumerate(g.ops) if kernels.flags(op) == {POINTWISE}]
    assert all(scratch_requests(g, i, sem) == [] for i in plain)
    back = read_model(data)
    assert [op.kernel for op in from_model(back).ops] == [op.kernel for op in g.ops]
    words = [struct.unpack("<16i", bytes(bytearray(op.customOptions))) for op in back.subgraphs[0].operators
             if op.customOptions is not None and len(op.customOptions) == 64]
    proven = [bool(w[2] & 0x200) for w in words if w[2] & 0x100]
    assert proven == [True, True, True, True, True, False, False, True, True, True]
    halves = next(op for op in g.ops if op.outputs[0] == g.outputs[1])
    assert set(requant(g, halves)[1]) == {-1}


def _srdhm(a: int, b: int) -> int:
    """gemmlowp's SaturatingRoundingDoublingHighMul (int32)."""
    if a == b == INT32_MIN:
        return INT32_MAX
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    q = abs(ab + nudge) // (1 << 31)  # (C's division truncates toward zero)
    return q if ab + nudge >= 0 else -q


def _rdbpot(x: int, e: int) -> int:
    mask = (1 << e) - 1
    rem, threshold = x & mask, (mask >> 1) + (1 if x < 0 else 0)
    return (x >> e) + (1 if rem > threshold else 0)


def _wrap(v: int) -> int:
    return (v + (1 << 31)) % (1 << 32) - (1 << 31)


def _fast(acc: int, m: int, shift: int, offset: int) -> int:
    """The kernel's cheap path in int32 arithmetic: SMMULR(2 acc, m), then the nudged shift."""
    h = (_wrap(2 * acc) * m + (1 << 31)) >> 32
    nudge = _wrap((1 << (-shift - 1)) + offset * (1 << -shift))
    return _wrap(h + nudge + (-1 if h < 0 else 0)) >> -shift


def _exact(acc: int, m: int, shift: int, offset: int) -> int:
    left, right = max(shift, 0), max(-shift, 0)
    return _rdbpot(_srdhm(_wrap(acc * (1 << left)), m), right) + offset


def test_the_cheap_requantisation_is_proven_where_it_is_exact_and_refused_where_not():
    """The proof's bounds are tight: at the accumulators it admits the cheap path equals TFLite's
    integers for the op's own multipliers; one step past the bound it does not, and the proof says
    no. (Break `pointwise_requant_proven` to admit 2^30 and this fails.)"""
    rng = np.random.default_rng(5)
    for shift in (-1, -7, -22):
        for m in (1 << 30, (1 << 31) - 1, int(rng.integers(1 << 30, 1 << 31))):
            for acc in (-(1 << 30), (1 << 30) - 1, *map(int, rng.integers(-(1 << 30), 1 << 30, 200))):
                for offset in (-128, 0, 127):
                    assert _fast(acc, m, shift, offset) == _exact(acc, m, shift, offset), (acc, m, shift, offset)
    assert _fast(1 << 30, (1 << 31) - 1, -1, 0) != _exact(1 << 30, (1 << 31) - 1, -1, 0)  # 2 acc wraps
    # the proof on layers: bias at the edge admitted, one past refused; shifts outside [-22, -1] refused
    b = CnnBuilder(seed=3, spread=True)
    x = b.input((1, 4, 4, 4))
    y = b.conv(x, 2, k=1)
    g = b.graph([y])
    op = g.ops[0]
    w = np.asarray(g.tensors[op.inputs[1]].values(), dtype=np.int64).reshape(2, -1)
    zp = int(g.tensors[op.inputs[0]].quant.zero_point[0])
    top = np.maximum(w * (-128 - zp), w * (127 - zp)).sum(axis=1)
    assert requant(g, op)[1].max() <= -1 and pointwise_requant_proven(g, op)
    _with_bias(b, 0, (1 << 30) - 1 - top)
    assert pointwise_requant_proven(b.graph([y]), op)
    _with_bias(b, 0, (1 << 30) - top)
    assert not pointwise_requant_proven(b.graph([y]), op)
    _with_bias(b, 0, [0, 0])
    _with_output_scale(b, y, b._scale(x) * float(np.max(b.tensors[op.inputs[1]].quant.scale)) * 1.9)
    assert requant(b.graph([y]), op)[1].max() == 0 and not pointwise_requant_proven(b.graph([y]), op)


def test_the_model_on_the_harness_takes_the_pointwise_kernel_and_the_cost_model_agrees():
    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
    from tpu_pipeline.toolchain.fit.variants import on_harness

    b = CnnBuilder(seed=4, spread=True)
    x = b.input((1, 14, 14, 16))
    y = b.conv(b.dw(b.conv(x, 48, k=1, act="RELU6"), k=3, act="RELU6"), 16, k=1)
    g, _ = on_harness(b.graph([y]))
    assert ["pointwise16" in kernels.flags(op) for op in g.ops] == [True, False, True]  # (re-laid first)
    g = with_kernel(g, [0, 2], kernel_name(POINTWISE))
    slow = with_kernel(g, [0, 2], kernel_name())
    board = load_device("qemu-mps2-an386")
    assert estimate_mcu(g, board).instructions < estimate_mcu(slow, board).instructions


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    b, out = _layers()
    return model_for_qemu(tmp_path_factory, "pw", _on_pointwise(b, out)[1])


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_the_pointwise_kernel_is_bit_identical_in_qemu(model, kernels_set):
    qemu_run_as_planned(model, BOARD, kernels_set, iterations=3, seed=9)


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_a_real_model_on_the_pointwise_kernel_is_bit_identical_in_qemu(tmp_path, kernels_set):
    from tpu_pipeline.toolchain.fit.variants import on_harness

    src = read_model((FIXTURES / "darts_s2b_int8.tflite").read_bytes())
    g, _ = on_harness(from_model(src))
    relaid = [i for i, op in enumerate(g.ops) if "pointwise16" in kernels.flags(op)]  # (the pointwise kernel's here)
    g = with_kernel(g, relaid, kernel_name(POINTWISE))
    assert sum(POINTWISE in kernels.flags(op) for op in g.ops) == 8
    graph_in_qemu(tmp_path, g, src, BOARD, kernels_set, iterations=2, seed=4)


# ---- in patch stages ------------------------------------------------------------------------------
def _block():
    """(graph on the harness kernels, source bytes): a stem conv, an inverted residual block with
    an ADD, a strided expansion, at 21 x 18 (tiles of uneven sizes)."""
    from tpu_pipeline.toolchain.rewrite.fold_pad import fold_pads

    b = CnnBuilder(seed=8, spread=True)
    x = b.input((1, 21, 18, 3))
    s = b.conv(x, 12, k=3, stride=2, act="RELU6")
    e = b.conv(s, 30, k=1, act="RELU6")
    p = b.conv(b.dw(e, k=3, act="RELU6"), 12, k=1)
    r = b.add(p, s)
    out = b.conv(b.dw(b.conv(r, 20, k=1, act="RELU6"), k=3, stride=2, act="RELU6"), 9, k=1)
    src = b.model_bytes([out])
    g, _ = fold_pads(b.graph([out]), harness=True)
    convs = [i for i, op in enumerate(g.ops) if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D")]
    g = with_kernel(g, convs, kernel_name())
    return with_kernel(g, [i for i in convs if can_run_variant(g, i, POINTWISE)], kernel_name(POINTWISE)), src


def _staged_on_pointwise(grid, stream):
    from tpu_pipeline.toolchain.ir import stage
    from tpu_pipeline.toolchain.memory.lifetimes import lifetimes
    from tpu_pipeline.toolchain.memory.tflm import plan_for_tflm
    from tpu_pipeline.toolchain.rewrite.patch import checked_region, patch_regions
    from tpu_pipeline.toolchain.rewrite.patch_stage import build_stage, stage_refusal
    from tpu_pipeline.toolchain.tflite.metadata import with_offline_plan

    g, src = _block()
    regions = [r for r in patch_regions(g) if r.input == g.tensors[g.inputs[0]].name
               and stage_refusal(g, checked_region(g, r)[2]) is None]
    tin, tout, positions = checked_region(g, max(regions, key=lambda r: len(r.ops)))
    staged = build_stage(g, tin, tout, positions, grid, stream=stream)
    body = next(op for op in staged.ops if stage.is_stage(op)).options.body
    kinds = [op.kernel for op in body.ops if op.opcode == "CONV_2D" and body.tensors[op.inputs[1]].shape[1] == 1]
    assert len(kinds) >= 2 and set(kinds) == {kernel_name(POINTWISE)}
    plan = plan_for_tflm(staged, lifetimes(staged, semantics="tflm"), n_tensors=len(staged.tensors))
    data = model_to_bytes(with_offline_plan(to_model(staged, read_model(src)), list(plan.tensor_offsets)))
    back = from_model(read_model(data))  # the layer flags survive the file
    body_back = next(op for op in back.ops if stage.is_stage(op)).options.body
    assert [op.kernel for op in body_back.ops] == [op.kernel for op in body.ops]
    return staged, data


def test_a_stage_keeps_its_layers_on_the_pointwise_kernel_through_the_file():
    _staged_on_pointwise((3, 2), False)
    _staged_on_pointwise((3, 1), True)


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set,grid,stream", [("reference", (3, 2), False), ("cmsis-nn", (3, 2), False),
                                                     ("cmsis-nn", (3, 1), True)])
def test_patch_stages_run_their_1x1_layers_on_the_pointwise_kernel_in_qemu(tmp_path, kernels_set, grid, stream):
    if not (HAVE_ARM and HAVE_QEMU):
        pytest.skip("ARM toolchain or QEMU not installed (.ci/run installs them)")
    _, data = _staged_on_pointwise(grid, stream)
    path = tmp_path / "staged.tflite"
    path.write_bytes(data)
    r = qemu_run_matching(path, BOARD, kernels_set, iterations=2, seed=5)
    predicted = exported_arena(r)
    assert (predicted.head, predicted.tail) == (r.head_bytes, r.tail_bytes)

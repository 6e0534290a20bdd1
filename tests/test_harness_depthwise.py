"""The harness's own depthwise kernel (flag "fast", harness/tpup_depthwise.cc): which convolutions
it takes, no buffer in the memory model, the flag through the file; on the emulated board (both
kernel sets) bit-identical to the host's TFLite Micro on 3x3, 5x5 and 7x7 windows, strides 1 and
2, SAME, VALID and folded explicit padding, windows larger than the input, channels not a
multiple of four, no bias, and in place (overlapped)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.cnn_builder import CnnBuilder
from helpers.firmware import model_for_qemu, needs_arm, needs_qemu, qemu_run_as_planned, qemu_run_matching
from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.toolchain.ir import from_model, kernels
from tpu_pipeline.toolchain.ir.convert import to_model
from tpu_pipeline.toolchain.ir.kernels import FAST, OVERLAP, can_run_variant, kernel_name, with_kernel
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.rewrite.fold_pad import fold_pads
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

BOARD = load_device("qemu-mps2-an386")


def _dws(seed=31):
    """(graph with every depthwise convolution on the fast kernel, model bytes)."""
    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 15, 13, 10))
    s = b.conv(x, 10, k=1, act="RELU6")
    d5 = b.dw(s, k=5, act="RELU6")
    d7 = b.dw(d5, k=7, stride=2, act="RELU6")
    d3 = b.dw(d7, k=3, act="RELU")
    b.ops[-1] = dataclasses.replace(b.ops[-1], inputs=(*b.ops[-1].inputs[:2], -1))  # no bias
    p = b.dw(b.pad(d3, 2, 1, 1, 2), k=5, stride=2, padding="VALID")  # folds into explicit padding
    e = b.conv(p, 12, k=1, act="RELU6")
    big = b.dw(e, k=7, act="RELU6")  # a 4x4 input: every window crosses the border
    v = b.dw(b.conv(big, 8, k=1, act="RELU6"), k=3, padding="VALID", act="RELU6")
    g, folded = fold_pads(b.graph([v]), harness=True)
    assert folded == 1
    dws = [i for i, op in enumerate(g.ops) if op.opcode == "DEPTHWISE_CONV_2D"]
    convs = [i for i, op in enumerate(g.ops) if op.opcode == "CONV_2D"]
    g = with_kernel(g, convs, kernel_name())
    g = with_kernel(g, dws, kernel_name(FAST))
    g = with_kernel(g, [dws[0]], kernel_name(FAST, OVERLAP))  # in place: rows through a ring
    return g, model_to_bytes(to_model(g, read_model(b.model_bytes([v]))))


def test_what_the_fast_kernel_takes():
    b = CnnBuilder(seed=2, spread=True)
    x = b.input((1, 8, 8, 8))
    plain = b.dw(x, k=5)
    dilated = b.dw(plain, k=3, dilation=2)
    huge = b.dw(dilated, k=11)  # 121 taps: more than the stack holds
    conv = b.conv(huge, 8, k=3)
    g = b.graph([conv])
    assert [can_run_variant(g, i, FAST) for i in range(4)] == [True, False, False, False]
    with pytest.raises(ValueError):
        with_kernel(g, [1], kernel_name(FAST))
    with pytest.raises(ValueError):
        with_kernel(g, [3], kernel_name(FAST))


def test_the_fast_kernel_asks_for_no_buffer_and_its_flag_survives_the_file():
    g, data = _dws()
    sem = get_semantics("tflm-cmsis-nn")
    d5 = next(i for i, op in enumerate(g.ops) if op.opcode == "DEPTHWISE_CONV_2D" and OVERLAP not in kernels.flags(op))
    assert scratch_requests(g, d5, sem) == []
    assert scratch_requests(with_kernel(g, [d5], kernel_name()), d5, sem)  # CMSIS-NN's "opt" kernel asks
    back = from_model(read_model(data))
    assert [op.kernel for op in back.ops] == [op.kernel for op in g.ops]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return model_for_qemu(tmp_path_factory, "dw", _dws()[1])


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_the_fast_depthwise_kernel_is_bit_identical_in_qemu(model, kernels_set):
    qemu_run_as_planned(model, BOARD, kernels_set, iterations=3, seed=9)


def _threes(seed=57):
    """(graph with every depthwise convolution on the fast kernel, model bytes): 3x3 windows at
    stride 1, where the kernel takes two outputs at a time: odd and even widths and channel
    counts, SAME, VALID and folded asymmetric padding, RELU6 / RELU / none, widths too narrow for
    a pair, one layer whose right shifts are all 1 (FastRequant's rounding of ties), and one whose
    bias is too large for FastRequant (Requant's path)."""
    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 11, 9, 6))
    e = b.conv(x, 13, k=1, act="RELU6")
    d1 = b.dw(e, k=3, act="RELU6")  # 13 channels: three groups of four and one channel
    d2 = b.dw(b.pad(d1, 0, 2, 1, 0), k=3, padding="VALID", act="RELU")  # folds: explicit, asymmetric
    unit = b.dw(d2, k=3)  # small weights, multipliers in [0.25, 0.5): a right shift of 1, ties every other sum
    wt, y = b.ops[-1].inputs[1], b.ops[-1].outputs[0]
    small = np.random.default_rng(seed).integers(-3, 4, b.tensors[wt].shape).astype(np.int8)
    b.tensors[wt] = dataclasses.replace(b.tensors[wt], data=np.frombuffer(small.tobytes(), dtype=np.uint8).copy())
    s_in, s_w, q = b.tensors[d2].quant.scale[0], b.tensors[wt].quant.scale, b.tensors[y].quant
    b.tensors[y] = dataclasses.replace(b.tensors[y], quant=dataclasses.replace(q, scale=(s_in * max(s_w) * 2.05,)))
    big = b.dw(unit, k=3)
    bias = b.ops[-1].inputs[2]
    huge = np.array([((1 << 30) + (1 << 28)) * (-1) ** k - 7 * k for k in range(13)], dtype=np.int32)  # sums past 2^30
    b.tensors[bias] = dataclasses.replace(b.tensors[bias], data=np.frombuffer(huge.tobytes(), dtype=np.uint8).copy())
    v = b.dw(b.conv(big, 20, k=1, act="RELU6"), k=3, padding="VALID", act="RELU6")  # 20 channels, VALID
    n = b.dw(b.conv(b.pool(v, k=3, stride=3), 7, k=1), k=3, act="RELU6")  # 2 x 2 x 7: no pair fits
    outs = [n, unit]  # (unit's own output too: the large bias after it saturates whatever it reads)
    g, folded = fold_pads(b.graph(outs), harness=True)
    assert folded == 1
    dws = [i for i, op in enumerate(g.ops) if op.opcode == "DEPTHWISE_CONV_2D"]
    g = with_kernel(g, [i for i, op in enumerate(g.ops) if op.opcode == "CONV_2D"], kernel_name())
    g = with_kernel(g, dws, kernel_name(FAST))
    return g, model_to_bytes(to_model(g, read_model(b.model_bytes(outs))))


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_3x3_stride_1_pairs_and_both_requantizations_are_bit_identical_in_qemu(tmp_path, kernels_set):
    g, data = _threes()
    assert sum(FAST in kernels.flags(op) for op in g.ops) == 6
    path = tmp_path / "threes.tflite"
    path.write_bytes(data)
    qemu_run_matching(path, BOARD, kernels_set, iterations=2, seed=5)


def test_the_model_on_the_harness_takes_the_fast_kernel_where_it_won():
    """fit's on_harness: 5x5 and 7x7 windows, and 3x3 at stride 1, on the fast kernel (faster than
    CMSIS-NN's there, and no buffer), 3x3 at stride 2 left on CMSIS-NN's 3x3 kernel (faster there);
    the cost model says the same. (20 x 20 maps: too wide for "dw3", which takes narrower 3x3
    layers first: test_harness_depthwise3x3.py.)"""
    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
    from tpu_pipeline.toolchain.fit.variants import on_harness

    b = CnnBuilder(seed=4, spread=True)
    x = b.input((1, 20, 20, 16))
    y = b.dw(b.dw(b.dw(b.dw(b.conv(x, 16, k=1), k=3), k=5), k=7, stride=2), k=3, stride=2)
    g, _ = on_harness(b.graph([y]))
    fast = [(g.tensors[op.inputs[1]].shape[1], op.options.stride_h, FAST in kernels.flags(op)) for op in g.ops
            if op.opcode == "DEPTHWISE_CONV_2D"]
    assert fast == [(3, 1, True), (5, 1, True), (7, 2, True), (3, 2, False)]
    slow = with_kernel(g, [i for i, op in enumerate(g.ops) if FAST in kernels.flags(op)], kernel_name())
    board = load_device("qemu-mps2-an386")
    assert estimate_mcu(g, board).instructions < estimate_mcu(slow, board).instructions

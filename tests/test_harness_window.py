"""The harness's window convolution (flag "window", ir/kernel_variants/window.py,
harness/tpup_window.cc): which convolutions it takes, its constant (the folded bias, the padding
terms, the int16 weight pairs in the order the kernel reads them), no buffer, its flags and
requantisation proof through the file; on the emulated board (both kernel sets) bit-identical to
the host's TFLite Micro on layers of odd sizes (13 x 11, output channels left over from the fours),
3x3 and 5x5 windows, strides 1 and 2, SAME, VALID and folded asymmetric padding, relu / relu6 /
none, per-channel and per-tensor weights, a requantisation the cheap path is refused for, an output
overlapped over its input (rows through a ring), and on
MLPerf Tiny's ResNet-8 when its checkout is here (TPUP_MLPERF_DIR)."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

from helpers.cnn_builder import CnnBuilder
from helpers.firmware import (graph_in_qemu, mlperf_on_harness, model_for_qemu, needs_arm, needs_mlperf, needs_qemu,
                              qemu_run_as_planned)
from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.toolchain.execute.compare import verify_models
from tpu_pipeline.toolchain.fit.variants import on_harness
from tpu_pipeline.toolchain.ir import Quantization, from_model, kernels
from tpu_pipeline.toolchain.ir.convert import to_model
from tpu_pipeline.toolchain.ir.kernel_variants import window
from tpu_pipeline.toolchain.ir.kernels import can_run_variant, kernel_name, with_kernel
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

BOARD = load_device("qemu-mps2-an386")
WINDOW = window.VARIANT.flag


def _with_bias(b: CnnBuilder, op_pos: int, values) -> None:
    t = b.tensors[b.ops[op_pos].inputs[2]]
    data = np.frombuffer(np.asarray(values, dtype="<i4").tobytes(), dtype=np.uint8).copy()
    data.flags.writeable = False
    b.tensors[t.index] = dataclasses.replace(t, data=data)


def _per_tensor(b: CnnBuilder, op_pos: int) -> None:
    w = b.tensors[b.ops[op_pos].inputs[1]]
    b.tensors[w.index] = dataclasses.replace(w, quant=Quantization((float(np.mean(w.quant.scale)),), (0,), 0))
    bias = b.tensors[b.ops[op_pos].inputs[2]]
    x_scale = b._scale(b.ops[op_pos].inputs[0])
    b.tensors[bias.index] = dataclasses.replace(
        bias, quant=Quantization((x_scale * float(np.mean(w.quant.scale)),), (0,), 0))


def _layers(seed=21):
    """(builder, outputs): 3x3 and 5x5 layers on 13 x 11 inputs covering the kernel's paths."""
    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 13, 11, 8))
    a = b.conv(x, 12, k=3, act="RELU6")  # SAME, stride 1
    odd = b.conv(a, 7, k=3, stride=2)  # 7 channels: 3 left over from the fours; stride 2
    c = b.conv(a, 16, k=5, padding="VALID", act="RELU")  # 5x5 VALID, per-tensor weights
    _per_tensor(b, len(b.ops) - 1)
    big = b.conv(c, 8, k=3)  # accumulators past 2^30: the cheap requantisation refused
    _with_bias(b, len(b.ops) - 1, [(1 << 30) - 5] * 4 + [-(1 << 30)] * 4)
    asym = b.conv(b.pad(big, 1, 2, 0, 1), 4, k=3, padding="VALID", act="RELU6")  # folded: explicit padding
    return b, [odd, asym]


def _on_window(b, outs):
    from tpu_pipeline.toolchain.rewrite.fold_pad import fold_pads

    g, _ = fold_pads(b.graph(outs), harness=True)
    convs = [i for i, op in enumerate(g.ops) if op.opcode == "CONV_2D"]
    g = with_kernel(g, convs, kernel_name(WINDOW))
    g = with_kernel(g, [convs[0]], kernel_name(WINDOW, kernels.OVERLAP))  # output over its input: rows through a ring
    return g, model_to_bytes(to_model(g, read_model(b.model_bytes(outs))))


def test_what_the_window_kernel_takes():
    b = CnnBuilder(seed=2, spread=True)
    x = b.input((1, 8, 8, 3))
    three = b.conv(x, 8, k=3)  # 3 input channels: not in fours (the packed kernel's)
    fours = b.conv(three, 8, k=3)
    one = b.conv(fours, 8, k=1)  # 1x1: the pointwise kernel's on re-laid weights
    dil = b.conv(one, 8, k=3, dilation=2)
    g = b.graph([dil])
    assert [can_run_variant(g, i, WINDOW) for i in range(4)] == [False, True, False, False]
    moved, _ = on_harness(g)
    assert [kernels.flags(op) for op in moved.ops] == [{"packed"}, {WINDOW}, {"pointwise16"}, set()]


def test_its_constant_is_what_the_kernel_reads():
    """The folded bias, the padding terms per tap, then the pairs: the sums the kernel makes from
    them over a window with its top row and left column in the padding equal the reference's."""
    b, outs = _layers()
    g = b.graph(outs)
    op = g.ops[0]  # 8 -> 12, 3x3
    w = np.asarray(g.tensors[op.inputs[1]].values(), dtype=np.int64)
    bias = np.asarray(g.tensors[op.inputs[2]].values(), dtype=np.int64)
    zp = int(g.tensors[op.inputs[0]].quant.zero_point[0])
    p = window.window_weights(g, op).astype(np.int64)
    k, taps, c = 12, 9, 8
    assert p.shape == (k * (1 + taps) + k * taps * c // 2,)
    folded, pads, pairs = p[:k], p[k:k * (1 + taps)].reshape(k, taps), p[k * (1 + taps):]
    x = np.random.default_rng(3).integers(-128, 128, (3, 3, c))
    x[0, :, :] = zp  # padding: what TFLite pads with
    x[:, 0, :] = zp
    want = (w * (x - zp)[None]).reshape(k, -1).sum(axis=1) + bias
    lo, hi = pairs << 48 >> 48, pairs << 32 >> 48
    lo, hi = lo.reshape(k // 4, taps * c // 4, 2, 4), hi.reshape(k // 4, taps * c // 4, 2, 4)
    xs = x.reshape(-1, 4)  # per four inputs (x0..x3)
    valid = np.array([ky > 0 and kx > 0 for ky in range(3) for kx in range(3) for _ in range(c // 4)])
    acc = ((lo[:, :, 0] * xs[None, :, 0, None] + hi[:, :, 0] * xs[None, :, 2, None] + lo[:, :, 1] * xs[None, :, 1, None]
            + hi[:, :, 1] * xs[None, :, 3, None]) * valid[None, :, None]).sum(axis=1).reshape(-1)
    padded = [t for t in range(taps) if t < 3 or t % 3 == 0]
    assert np.array_equal(acc + folded + pads[:, padded].sum(axis=1), want)


def test_no_buffer_and_its_flags_and_constant_survive_the_file():
    b, outs = _layers()
    g, data = _on_window(b, outs)
    sem = get_semantics("tflm-cmsis-nn")
    convs = [i for i, op in enumerate(g.ops) if op.opcode == "CONV_2D"]
    assert len(convs) == 5 and all(scratch_requests(g, i, sem) == [] for i in convs[1:])
    assert kernels.flags(g.ops[convs[0]]) == {WINDOW, kernels.OVERLAP}  # (its ring: the only scratch)
    back = from_model(read_model(data))
    assert [op.kernel for op in back.ops] == [op.kernel for op in g.ops]
    assert all(kernels.requant_tensor_ok(back, back.ops[i]) for i in convs)
    words = [struct.unpack("<16i", bytes(bytearray(op.customOptions))) for op in read_model(data).subgraphs[0].operators
             if op.customOptions is not None and len(op.customOptions) == 64]
    assert [bool(w[2] & window.FAST_REQUANT) for w in words] == [True, True, True, False, True]
    assert [w[3:5] for w in words][-1] == (1, 0)  # the folded PAD's explicit leading padding
    results = verify_models(b.model_bytes(outs), data, runs=2)
    assert all(o.ok and o.max_abs == 0 for r in results for o in r.outputs)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    b, outs = _layers()
    return model_for_qemu(tmp_path_factory, "window", _on_window(b, outs)[1])


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_the_window_kernel_is_bit_identical_in_qemu(model, kernels_set):
    qemu_run_as_planned(model, BOARD, kernels_set, iterations=3, seed=9)


@needs_arm
@needs_qemu
@needs_mlperf("pretrainedResnet_quant")
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_mlperf_resnet8_on_the_window_kernel_is_bit_identical_in_qemu(tmp_path, kernels_set):
    g, src = mlperf_on_harness("pretrainedResnet_quant")
    assert sum(WINDOW in kernels.flags(op) for op in g.ops) == 6
    graph_in_qemu(tmp_path, g, src, BOARD, kernels_set, iterations=2, seed=4)

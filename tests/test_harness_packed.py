"""The harness's convolution for few input channels (flag "packed", harness/tpup_first_conv.cc):
which convolutions it takes, its packed weights (the layout the kernel reads), no buffer, the
flag and the weights through the file, the host's builtin view without them; on the emulated board
(both kernel sets) bit-identical to the host's TFLite Micro on first layers (3 channels, 3x3,
stride 2, SAME and folded explicit padding) and their like: 1, 4 and 5 input channels, 5x5 and
1x3 windows, odd output widths and channel counts, RELU6, no bias, and in place (overlapped)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.cnn_builder import CnnBuilder
from helpers.firmware import model_for_qemu, needs_arm, needs_qemu, qemu_run_as_planned, qemu_run_matching, written
from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.toolchain.execute.compare import verify_models
from tpu_pipeline.toolchain.ir import from_model, kernels
from tpu_pipeline.toolchain.ir.convert import builtin_view_bytes
from tpu_pipeline.toolchain.ir.kernel_variants.packed import VARIANT, packed_pairs, packed_weights
from tpu_pipeline.toolchain.ir.kernels import OVERLAP, can_run_variant, kernel_name, with_kernel
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.rewrite.fold_pad import fold_pads
from tpu_pipeline.toolchain.tflite import read_model

PACKED = VARIANT.flag

BOARD = load_device("qemu-mps2-an386")


def _convs(seed=17):
    """(graph with the few-channel convolutions packed, the source model bytes, the packed ops)."""
    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 21, 19, 3))
    first = b.conv(b.pad(x, 1, 1, 1, 1), 11, k=3, stride=2, padding="VALID", act="RELU6")  # (folds: explicit)
    same = b.conv(x, 7, k=3, stride=2, act="RELU6")  # SAME: no padding above, one below
    one = b.conv(b.conv(first, 1, k=1), 5, k=5, act="RELU")  # 1 channel, 5x5, stride 1
    b.ops[-1] = dataclasses.replace(b.ops[-1], inputs=(*b.ops[-1].inputs[:2], -1))  # no bias
    four = b.conv(b.conv(same, 4, k=1), 6, k=3, stride=2)  # 4 channels: whole words only
    five = b.conv(b.conv(one, 5, k=1), 9, k=3)  # 5 channels: 15 bytes a row
    row = b.conv(b.conv(five, 3, k=1), 8, k=1)  # 3 channels, 1x1: a tail pair only
    outs = [four, row]
    g, folded = fold_pads(b.graph(outs), harness=True)
    assert folded == 1
    convs = [i for i, op in enumerate(g.ops) if op.opcode == "CONV_2D"]
    g = with_kernel(g, convs, kernel_name())
    packed = [i for i in convs if g.tensors[g.ops[i].inputs[1]].shape[3] in (1, 3, 4, 5)
              and g.tensors[g.ops[i].inputs[1]].shape[1] > 1 or g.ops[i].outputs[0] == row]
    g = with_kernel(g, packed, kernel_name(PACKED))
    five_at = next(i for i in packed if g.tensors[g.ops[i].inputs[1]].shape[3] == 5)
    g = with_kernel(g, [five_at], kernel_name(OVERLAP, PACKED))  # over its input: rows through a ring
    return g, b.model_bytes(outs), packed


def test_what_the_packed_kernel_takes():
    b = CnnBuilder(seed=2, spread=True)
    x = b.input((1, 8, 8, 3))
    plain = b.conv(x, 8, k=3)
    dilated = b.conv(plain, 8, k=3, dilation=2)
    wide = b.conv(dilated, 8, k=3)  # 24 bytes a row: fits
    dw = b.dw(wide, k=3)
    g = b.graph([b.conv(dw, 4, k=9)])  # 72 bytes a row: more than the stack holds
    assert [can_run_variant(g, i, PACKED) for i in range(5)] == [True, False, True, False, False]
    for i in (1, 3, 4):
        with pytest.raises(ValueError):
            with_kernel(g, [i], kernel_name(PACKED))


def _per_channel(words):
    """(folded biases [out_c], pairs [out_c, pairs]) of packed weights laid out as the kernel reads
    them: per channel pair (c, c + 1) in its 2 x (1 + pairs) words bias c, bias c + 1, then pair k
    of c and of c + 1 for each k; a last odd channel alone, its bias then its pairs."""
    out_c, width = words.shape
    flat = words.reshape(-1)
    bias, pairs = np.zeros(out_c, np.int32), np.zeros((out_c, width - 1), np.int32)
    for c in range(out_c):
        if c < out_c // 2 * 2:
            base, half = c // 2 * 2 * width, c % 2
            bias[c], pairs[c] = flat[base + half], flat[base + 2 + half:base + 2 * width:2]
        else:
            bias[c], pairs[c] = flat[c * width], flat[c * width + 1:(c + 1) * width]
    return bias, pairs


def test_packed_weights_are_the_windows_order_with_the_offset_folded_in():
    """A window packed as the kernel packs it (per row, (b0, b2), (b1, b3) per four bytes, the rows'
    leftover bytes paired at the end), dotted with the packed weights pair by pair, gives TFLite's
    sum: bias + sum w x (x - zero point), padding taps reading the zero point; two channels'
    words interleaved (one LDRD loads both channels' pair k), a last odd channel alone."""
    g, _, packed = _convs()
    rng = np.random.default_rng(0)
    for i in packed:
        op = g.ops[i]
        w = g.tensors[op.inputs[1]].values().astype(np.int64)
        out_c, k_h, k_w, in_c = w.shape
        words = packed_weights(g, op)
        assert words.shape == (out_c, 1 + packed_pairs(k_h, k_w, in_c)) and words.dtype == np.dtype("<i4")
        zp = int(g.tensors[op.inputs[0]].quant.zero_point[0])
        x = rng.integers(-128, 128, (k_h, k_w * in_c))
        x[0, :in_c] = zp  # (a padding tap)
        row = k_w * in_c
        whole = row // 4 * 4
        flat = [v for r in x for q in range(0, whole, 4) for v in ((r[q], r[q + 2]), (r[q + 1], r[q + 3]))]
        tail = [v for r in x for v in r[whole:]] + [0]
        flat += [(tail[k], tail[k + 1]) for k in range(0, len(tail) - 1, 2)]
        bias_words, pair_words = _per_channel(words)
        lo, hi = (pair_words << 16 >> 16).astype(np.int64), (pair_words >> 16).astype(np.int64)
        got = bias_words + sum(lo[:, k] * a + hi[:, k] * c for k, (a, c) in enumerate(flat))
        bias = g.tensors[op.inputs[2]].values() if op.inputs[2] >= 0 else np.zeros(out_c)
        want = bias + (w.reshape(out_c, -1) * (x.reshape(-1) - zp)).sum(axis=1)
        assert np.array_equal(got, want)


def test_no_buffer_the_flag_and_weights_survive_the_file_and_the_host_runs_the_builtins():
    g, src, packed = _convs()
    sem = get_semantics("tflm-cmsis-nn")
    assert all(scratch_requests(g, i, sem) == [] for i in packed if OVERLAP not in kernels.flags(g.ops[i]))
    assert scratch_requests(with_kernel(g, [packed[0]], kernel_name()), packed[0], sem)  # CMSIS-NN's im2col
    data = written(g, src)
    back = from_model(read_model(data))
    assert [op.kernel for op in back.ops] == [op.kernel for op in g.ops]
    assert all(kernels.requant_tensor_ok(back, back.ops[i]) for i in packed)
    assert all(len(back.ops[i].inputs) == 5 for i in packed)
    unpacked = with_kernel(back, packed, kernel_name())
    assert all(len(unpacked.ops[i].inputs) == 4 for i in packed)
    view = read_model(builtin_view_bytes(data))
    assert all(len(op.inputs) <= 3 for op in view.subgraphs[0].operators)
    results = verify_models(src, data, runs=2)
    assert all(o.ok and o.max_abs == 0 for r in results for o in r.outputs)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    g, src, _ = _convs()
    return model_for_qemu(tmp_path_factory, "packed", written(g, src))


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_the_packed_kernel_is_bit_identical_in_qemu(model, kernels_set):
    qemu_run_as_planned(model, BOARD, kernels_set, iterations=3, seed=9)


def _requantize_like_a_first_layer(b, y):
    """Output `y` at zero point -128 and scale 6/255 (a ReLU6 first layer as converted: its clamp
    is the whole int8 range)."""
    q = b.tensors[y].quant
    b.tensors[y] = dataclasses.replace(b.tensors[y], quant=dataclasses.replace(q, scale=(6 / 255,), zero_point=(-128,)))


def _first_layers(seed=31):
    """(graph, model bytes, packed ops): 3x3 convolutions over 3 channels, the kernel's unrolled
    block and its 3 x 9-byte packer, on odd and even output widths (a lone last pixel), SAME,
    explicit (folded) and no padding, strides 2 and 1, even, odd (a lone last channel) and more
    than one chunk of 32 output channels (40, 66), no activation, RELU and RELU6 clamps (any
    bounds, and the whole int8 range: the streamed assembly loop, 17 and 40 channels), a 1x1
    output, and rows through a ring (overlap)."""
    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 17, 21, 3))
    outs = [b.conv(x, 17, k=3, stride=2, act="NONE"),  # SAME: 9 x 11
            b.conv(b.pad(x, 1, 1, 1, 1), 9, k=3, stride=2, padding="VALID", act="RELU"),  # 9 x 11
            b.conv(x, 66, k=3, stride=1, padding="VALID", act="RELU6"),  # 15 x 19, chunks of 64 + 2
            b.conv(b.pad(x, 0, 1, 0, 1), 40, k=3, stride=2, padding="VALID", act="RELU6"),  # 8 x 10, 32 + 8
            b.conv(b.pad(x, 1, 0, 1, 0), 7, k=3, stride=2, padding="VALID", act="RELU6")]  # 8 x 10
    _requantize_like_a_first_layer(b, outs[3])
    tiny = b.input((1, 3, 4, 3))
    outs.append(b.conv(tiny, 6, k=3, stride=2, padding="VALID", act="RELU"))  # 1 x 1
    g, folded = fold_pads(b.graph(outs), harness=True)
    assert folded == 3
    packed = [i for i, op in enumerate(g.ops) if op.opcode == "CONV_2D"]
    g = with_kernel(g, packed, kernel_name(PACKED))
    ringed = next(i for i in packed if g.ops[i].outputs[0] == g.outputs[4])
    g = with_kernel(g, [ringed], kernel_name(OVERLAP, PACKED))
    return g, written(g, b.model_bytes(outs)), packed


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_first_layers_of_the_packed_kernel_are_bit_identical_in_qemu(tmp_path, kernels_set):
    g, data, packed = _first_layers()
    assert all(packed_pairs(*g.tensors[g.ops[i].inputs[1]].shape[1:]) == 14 for i in packed)
    path = tmp_path / "first.tflite"
    path.write_bytes(data)
    qemu_run_matching(path, BOARD, kernels_set, iterations=3, seed=5)


def _requantizations(seed=23):
    """(graph, model bytes): a first layer of 65 output channels (three chunks of its
    requantization set-up: 32, 32, then a lone last channel) whose last channel's bias is too large
    for FastRequant (that chunk on Requant, the others on FastRequant), one whose multipliers are 2^0 and more
    (Requant's left shift), and a first layer one of whose channels has a multiplier of about
    2^-27: FastRequant fits its sums, but its output offset x 2^27 does not fit int32 (Requant)."""
    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 13, 11, 3))
    first = b.conv(x, 65, k=3, stride=2, act="RELU6")
    bias = b.ops[-1].inputs[2]
    values = np.frombuffer(b.tensors[bias].data.tobytes(), dtype=np.int32).copy()
    values[64] = (1 << 30) + (1 << 28)  # sums past 2^30: doubled, past 2^31
    b.tensors[bias] = dataclasses.replace(b.tensors[bias], data=np.frombuffer(values.tobytes(), dtype=np.uint8).copy())
    mix = b.conv(b.conv(first, 3, k=1), 5, k=3)
    wt, y, src = b.ops[-1].inputs[1], b.ops[-1].outputs[0], b.ops[-1].inputs[0]
    small = np.random.default_rng(seed).integers(-2, 3, b.tensors[wt].shape).astype(np.int8)
    b.tensors[wt] = dataclasses.replace(b.tensors[wt], data=np.frombuffer(small.tobytes(), dtype=np.uint8).copy())
    s_w, q = b.tensors[wt].quant.scale, b.tensors[y].quant
    b.tensors[y] = dataclasses.replace(b.tensors[y], quant=dataclasses.replace(
        q, scale=(b.tensors[src].quant.scale[0] * min(s_w) / 3,)))  # multipliers 3 x 2^0 .. 2 x 3 x 2^0
    far = b.conv(x, 8, k=3, stride=2, act="RELU6")
    wt = b.ops[-1].inputs[1]
    scales = list(b.tensors[wt].quant.scale)
    scales[3] /= 1 << 20
    b.tensors[wt] = dataclasses.replace(b.tensors[wt], quant=dataclasses.replace(b.tensors[wt].quant, scale=tuple(scales)))
    g = b.graph([mix, far])
    convs = [i for i, op in enumerate(g.ops) if op.opcode == "CONV_2D"]
    g = with_kernel(g, convs, kernel_name())
    g = with_kernel(g, [convs[0], convs[2], convs[3]], kernel_name(PACKED))
    return g, written(g, b.model_bytes([mix, far]))


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_both_requantizations_of_the_packed_kernel_are_bit_identical_in_qemu(tmp_path, kernels_set):
    g, data = _requantizations()
    assert sum(PACKED in kernels.flags(op) for op in g.ops) == 3
    path = tmp_path / "requant.tflite"
    path.write_bytes(data)
    qemu_run_matching(path, BOARD, kernels_set, iterations=2, seed=4)


def test_the_model_on_the_harness_packs_its_first_layer():
    from tpu_pipeline.toolchain.fit.variants import on_harness

    b = CnnBuilder(seed=4, spread=True)
    x = b.input((1, 16, 16, 3))
    y = b.conv(b.conv(x, 16, k=3, stride=2, act="RELU6"), 16, k=3)
    g, _ = on_harness(b.graph([y]))
    assert [PACKED in kernels.flags(op) for op in g.ops] == [True, False]

"""Flag "packed": the harness's convolution for few input channels (harness/tpup_first_conv.cc,
both firmware builds). The windows of two neighbouring output pixels are packed once into int16
pairs, interleaved; the weights are laid out offline in that order (the op's constant input 4,
`packed_weights`), two output channels interleaved, with the input offset folded into the bias,
so padding taps read the zero point; two pixels x two channels per four SMLADs; no buffer;
TFLite's ConvPerChannel integers. It beat CMSIS-NN's im2col kernel in QEMU on inputs of at most
WINS_MAX_CHANNELS channels (docs/bench/harness_kernels.md: first layers 1.54-4.22x). Patch stages
run it too (`in_stages`; the layer record names its packed weights, ir/stage.py): a first layer
in a stage on CMSIS-NN's im2col kernel cost TinyEngine's detection 8 M instructions."""

from __future__ import annotations

import numpy as np

from tpu_pipeline.toolchain.ir.graph import Graph, Op
from tpu_pipeline.toolchain.ir.kernel_variants.record import KernelVariant
from tpu_pipeline.toolchain.ir.requant import activation_range

WINS_MAX_CHANNELS = 4
PACKED_MAX_PAIRS = PACKED_MAX_ROW = 64  # (harness/tpup_conv.h kPackedMaxPairs, kPackedMaxRow: windows on the stack)


def packed_pairs(k_h: int, k_w: int, in_c: int) -> int:
    """The int16 pairs a window of the packed kernel holds (harness/tpup_first_conv.cc PackedPairs):
    per row of k_w x in_c bytes two pairs per four bytes, then the rows' leftover bytes paired."""
    row = k_w * in_c
    return k_h * (row // 4) * 2 + (k_h * (row % 4) + 1) // 2


def packed_weights(graph: Graph, op: Op) -> np.ndarray:
    """Input 4 of a packed convolution, int32 [out_c, 1 + pairs] (the shape, its words in the
    kernel's order): per output channel the bias plus input offset x the sum of its weights (exact
    in int32: padding taps then read the zero point) and its weights as int16 pairs in the order
    the kernel packs a window (`packed_pairs`); two channels interleaved, so one LDRD loads both
    channels' pair k: per channel pair (c, c + 1) bias c, bias c + 1, then pair k of c, pair k of
    c + 1 for each k; a last odd channel alone, its bias then its pairs."""
    w = graph.tensors[op.inputs[1]].values().astype(np.int64)  # [out_c, kh, kw, in_c]
    out_c, k_h, k_w, in_c = w.shape
    bias = op.inputs[2] if len(op.inputs) > 2 else -1
    b = graph.tensors[bias].values().astype(np.int64) if bias >= 0 else np.zeros(out_c, np.int64)
    offset = -int(graph.tensors[op.inputs[0]].quant.zero_point[0])
    rows = w.reshape(out_c, k_h, k_w * in_c)
    whole = (k_w * in_c) // 4 * 4
    groups = rows[:, :, :whole].reshape(out_c, k_h, -1, 4)
    lo = groups[..., [0, 1]].reshape(out_c, -1)  # per four bytes the pairs (b0, b2), (b1, b3)
    hi = groups[..., [2, 3]].reshape(out_c, -1)
    tail = rows[:, :, whole:].reshape(out_c, -1)
    if tail.shape[1] % 2:
        tail = np.concatenate([tail, np.zeros((out_c, 1), np.int64)], axis=1)
    lo, hi = np.concatenate([lo, tail[:, 0::2]], axis=1), np.concatenate([hi, tail[:, 1::2]], axis=1)
    pairs = (lo & 0xFFFF) | (hi & 0xFFFF) << 16
    folded = b + offset * w.reshape(out_c, -1).sum(axis=1)
    if np.abs(folded).max(initial=0) >= 1 << 31:
        raise ValueError("the folded bias does not fit int32")
    words = np.concatenate([folded[:, None] & 0xFFFFFFFF, pairs], axis=1)  # [out_c, 1 + pairs], per channel
    even = out_c // 2 * 2
    two = words[:even].reshape(even // 2, 2, -1).transpose(0, 2, 1)  # [pair of channels, word, channel]
    words = np.concatenate([two.reshape(even, -1), words[even:]])
    return words.astype("<u4").view("<i4")


def stage_setup_bytes(out_c: int) -> int:
    """The bytes of arena scratch a patch stage keeps a packed layer's set-up in, set up once an
    invoke instead of once a tile (harness/tpup_first_conv.cc PackedSetupBytes: a 16-byte header,
    then each channel's requantization, three int32 words; 16-aligned)."""
    return -(-(16 + 12 * out_c) // 16) * 16


def applies(graph: Graph, i: int) -> bool:
    """No dilation, window rows and pairs within the kernel's stack buffers, and a folded bias
    that fits int32."""
    op = graph.ops[i]
    o, w_t = op.options, graph.tensors[op.inputs[1]]
    _, k_h, k_w, in_c = w_t.shape
    if not (o.dilation_h == 1 and o.dilation_w == 1 and k_w * in_c <= PACKED_MAX_ROW
            and packed_pairs(k_h, k_w, in_c) <= PACKED_MAX_PAIRS):
        return False
    bias = op.inputs[2] if len(op.inputs) > 2 else -1
    b = np.abs(graph.tensors[bias].values().astype(np.int64)) if bias >= 0 else 0
    offset = abs(int(graph.tensors[op.inputs[0]].quant.zero_point[0]))
    w = np.abs(w_t.values().astype(np.int64)).reshape(w_t.shape[0], -1).sum(axis=1)
    return bool(np.max(b + offset * w) < 1 << 31)


def wins(graph: Graph, i: int) -> bool:
    return graph.tensors[graph.ops[i].inputs[1]].shape[3] <= WINS_MAX_CHANNELS


STREAMED = "tpup_conv_packed_3x3c3"  # (its cost row: the streamed first-layer path)


def cost_class_of(graph: Graph, op: Op) -> str:
    """The kernel's two speeds (harness/tpup_first_conv.cc RunConvPacked): a 3x3 window over 3
    channels (14 pairs) clamped to the whole int8 range, as a first layer's ReLU6 usually is, runs
    the streamed path (its weights and requantisation in one stream: STREAMED, about 1.2
    instructions a MAC in QEMU); any other window the generic one (about 2.2-5.6)."""
    _, k_h, k_w, in_c = graph.tensors[op.inputs[1]].shape
    lo, hi = activation_range(graph, op)
    return STREAMED if (k_h == 3 and k_w * in_c == 9 and lo == -128 and hi == 127) else VARIANT.cost_class


VARIANT = KernelVariant(flag="packed", bit=8, opcode="CONV_2D", applies=applies, wins=wins,
                        cost_class="tpup_conv_packed", cost_fallback="conv", source="tpup_first_conv.cc",
                        constant_input=packed_weights, in_stages=True, cost_class_of=cost_class_of,
                        cost_subclasses=(STREAMED,))

"""Flag "pointwise16": the pointwise kernel (harness/tpup_pointwise.cc, both firmware builds) on
weights re-laid offline as int16 pairs, three output channels x two pixels a pass. The two
pixels are widened once to int16 (input offset added) into the output's unwritten bytes, as the
pointwise kernel does, but interleaved so one LDRD gives both pixels' pair of input channels; one
LDM gives three channels' weight pairs for it; six SMLADs: 8 instructions per 12 MACs in the
loop (pointwise: 15 per 16, two of them SXTB16 per weight word), and each pass's setup and
requantisation is shared by six outputs instead of four. TFLite's ConvPerChannel integers; the
requantisation is SMMULR plus one nudged shift where `pointwise_requant_proven` proves it exact
(option bit 0x8000), else TFLite's integers. Pixels the widened pair's bytes hold, and cores
without the DSP extension, take the pointwise kernel's own paths on the int8 filter.

What it costs: flash, input 4 (`relaid_weights`): per triple of output channels a header of 12
words (biases and requantisation constants, so a pass loads nothing else) and its weights as int16 pairs, 2 bytes a weight (twice the int8 weights, which stay as input 1;
an output channel count not a multiple of three repeats up to two channels); TFLite Micro's
tail: that tensor's 16-byte entry. Arena: nothing. Patch stages run it too (`in_stages`; the
layer record's word 21 names the re-laid weights, as packed's, ir/stage.py)."""

from __future__ import annotations

import numpy as np

from tpu_pipeline.toolchain.ir.graph import Graph, Op
from tpu_pipeline.toolchain.ir.kernel_variants import pointwise
from tpu_pipeline.toolchain.ir.kernel_variants.record import KernelVariant
from tpu_pipeline.toolchain.ir.requant import pointwise_requant_proven, requant, weights_bias

FAST_REQUANT = 0x8000  # (harness/tpup_conv.h kFlagPointwise16FastRequant)
CHANNELS = 3  # output channels a pass


def _scales(graph: Graph, op: Op) -> np.ndarray:
    """int64 [3, K]: per output channel its multiplier, its right shift r (-shift) and the fast
    requantisation's rounding nudge 2^(r-1) + output offset x 2^r (0 where r is outside [1, 31])."""
    m, shift = (requant(graph, op).astype(np.int64))
    r = -shift
    offset = int(graph.tensors[op.outputs[0]].quant.zero_point[0])
    ok = (r >= 1) & (r <= 31)
    rr = np.where(ok, r, 1)
    nudge = np.where(ok, (1 << (rr - 1)) + offset * (1 << rr), 0)
    return np.stack([m, r, (nudge + (1 << 31)) % (1 << 32) - (1 << 31)])


def relaid_weights(graph: Graph, op: Op) -> np.ndarray:
    """Input 4, int32 [ceil(K / 3) (12 + 6 ceil(C / 4))] (harness Pointwise16Words): per triple of
    output channels c, c + 1, c + 2 (the last triple K - 3 .. K - 1) a header of their biases,
    multipliers, right shifts and rounding nudges (`_scales`), then per pair-word of the input
    (per four channels the pairs (0, 2), (1, 3), as SXTB16 widens them; channels past C zero) the
    three channels' int16 pairs (low half the first)."""
    w, b = weights_bias(graph, op)
    scales = _scales(graph, op)
    k_out = w.shape[0]
    w = w.reshape(k_out, -1)
    c_in = w.shape[1]
    groups = -(-c_in // 4)
    padded = np.zeros((k_out, groups * 4), np.int64)
    padded[:, :c_in] = w
    quads = padded.reshape(k_out, groups, 4)
    lo = quads[:, :, [0, 1]].reshape(k_out, -1)  # pair-words in order: (0, 2), (1, 3) per group
    hi = quads[:, :, [2, 3]].reshape(k_out, -1)
    pairs = (lo & 0xFFFF) | (hi & 0xFFFF) << 16  # [K, 2 groups]
    starts = [min(c, k_out - CHANNELS) for c in range(0, k_out, CHANNELS)]
    words = [np.concatenate([b[s:s + CHANNELS], scales[:, s:s + CHANNELS].reshape(-1), pairs[s:s + CHANNELS].T.reshape(-1)])
             & 0xFFFFFFFF for s in starts]
    return np.concatenate(words).astype("<u4").view("<i4")


def applies(graph: Graph, i: int) -> bool:
    """The pointwise kernel's convolutions with at least three output channels."""
    return pointwise.applies(graph, i) and graph.tensors[graph.ops[i].outputs[0]].shape[3] >= CHANNELS


def wins(graph: Graph, i: int) -> bool:
    return True


def requant_bits(graph: Graph, op: Op) -> int:
    return FAST_REQUANT if pointwise_requant_proven(graph, op) else 0


VARIANT = KernelVariant(flag="pointwise16", bit=0x4000, opcode="CONV_2D", applies=applies, wins=wins,
                        cost_class="tpup_pointwise16", cost_fallback="conv_1x1", source="tpup_pointwise.cc",
                        derived_bits=requant_bits, derived_mask=FAST_REQUANT, constant_input=relaid_weights,
                        in_stages=True)

"""Flag "window": the harness's own int8 convolution for windows of several taps over input channels
in fours (harness/tpup_window.cc, both firmware builds). No im2col: an output pixel's window is read
in place, one contiguous run of kw x C input bytes per window row; four output channels per pass
share each word of it, widened to two int16 pairs by SXTB16, and their weights are laid out
offline as int16 pairs in the order the pass reads them (input 4, `window_weights`: one LDM per
pair of the four channels, one SMLAD per channel; 13 instructions per 16 MACs, the fully
connected kernel's loop). The input offset is folded into the bias offline; a padding tap adds
its channel's zero-point term (precomputed per tap) instead of being read. Channels left over
(fewer than four) are summed from the int8 weights. Requantisation: SMMULR plus one nudged shift
where `requant_within` proves it exact for the op (option bit 0x800), else TFLite's integers.

What it costs: flash, input 4: per output channel the folded bias and kh x kw padding terms
(4 bytes each), then the int16 weights of the first C_out - C_out % 4 channels (2 bytes a
weight: twice the int8 weights, which stay as input 1); TFLite Micro's tail: that tensor's
16-byte entry. Arena: nothing (CMSIS-NN's im2col kernel asks for 2 x kh x kw x C_in x 2 bytes
of scratch; this reads the input in place). It beat CMSIS-NN's im2col kernel in QEMU on every layer
measured (docs/bench/harness_kernels.md: 1.16-2.13x, 3x3 and 5x5, strides 1 and 2), so it wins
wherever it applies."""

from __future__ import annotations

import numpy as np

from tpu_pipeline.toolchain.ir.graph import Graph, Op
from tpu_pipeline.toolchain.ir.kernel_variants.record import KernelVariant
from tpu_pipeline.toolchain.ir.requant import requant, requant_within, weights_bias

FAST_REQUANT = 0x800  # (harness/tpup_conv.h kFlagWindowFastRequant)


def window_weights(graph: Graph, op: Op) -> np.ndarray:
    """Input 4, int32 [C_out (1 + kh kw) + (C_out - C_out % 4) kh kw C_in / 2]: per output channel
    the bias less the input zero point x its weights' sum; per channel and tap (ky, kx) zero point
    x that tap's weights' sum (what a padding tap adds); then the weights as [C_out, kh kw C_in]
    in the fully connected kernel's pair order (ir/fully_connected.py `packed_pairs`)."""
    from tpu_pipeline.toolchain.ir.fully_connected import packed_pairs

    w, b = weights_bias(graph, op)
    zp = int(graph.tensors[op.inputs[0]].quant.zero_point[0])
    c_out = w.shape[0]
    folded = b - zp * w.reshape(c_out, -1).sum(axis=1)
    pad_terms = zp * w.reshape(c_out, -1, w.shape[3]).sum(axis=2)  # [C_out, taps]
    if max(np.abs(folded).max(initial=0), np.abs(pad_terms).max(initial=0)) >= 1 << 31:
        raise ValueError("the folded bias does not fit int32")
    words = np.concatenate([folded & 0xFFFFFFFF, pad_terms.reshape(-1) & 0xFFFFFFFF,
                            packed_pairs(w.reshape(c_out, -1))])
    return words.astype("<u4").view("<i4")


def applies(graph: Graph, i: int) -> bool:
    """More than one tap, no dilation, input channels in fours, and a folded bias that fits int32."""
    op = graph.ops[i]
    o, w_t = op.options, graph.tensors[op.inputs[1]]
    c_out, k_h, k_w, c_in = w_t.shape
    if not (o.dilation_h == 1 and o.dilation_w == 1 and k_h * k_w > 1 and c_in % 4 == 0
            and graph.tensors[op.inputs[0]].shape[3] == c_in):
        return False
    w, b = weights_bias(graph, op)
    zp = abs(int(graph.tensors[op.inputs[0]].quant.zero_point[0]))
    return bool((np.abs(b) + zp * np.abs(w).reshape(c_out, -1).sum(axis=1)).max() < 1 << 31)


def wins(graph: Graph, i: int) -> bool:
    return True


def requant_bits(graph: Graph, op: Op) -> int:
    w, b = weights_bias(graph, op)
    zp = int(graph.tensors[op.inputs[0]].quant.zero_point[0])
    return FAST_REQUANT if requant_within(requant(graph, op)[1], w.reshape(w.shape[0], -1), b, zp) else 0


VARIANT = KernelVariant(flag="window", bit=0x400, opcode="CONV_2D", applies=applies, wins=wins,
                        cost_class="tpup_conv_window", cost_fallback="conv", source="tpup_window.cc",
                        derived_bits=requant_bits, derived_mask=FAST_REQUANT, constant_input=window_weights)

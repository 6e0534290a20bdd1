"""Flag "fast": the harness's own int8 depthwise kernel (harness/tpup_depthwise.cc), in both
firmware builds. Four channels at a time with the DSP extension's SIMD multiplies, the int8 input
read in place, no buffer; the same integers as TFLite's DepthwiseConvPerChannel (SMMULR's
requantization where the sums provably fit). It beats CMSIS-NN's "opt" kernel on 5x5 and 7x7
windows, and CMSIS-NN's 3x3 kernel on 3x3 windows at stride 1 on maps from 6 x 6, two outputs at
a time there (docs/bench/harness_kernels.md), so it wins there; 3x3 at stride 2 stays on CMSIS-NN's. Patch
stages run it on streamed row stripes only (rewrite/patch_stage.py STRIPES_ONLY): elsewhere a
stage's depthwise layer is written over its dying input, a call per row through a ring, and its
per-call set-up made those calls slower than CMSIS-NN's (11454fd). That set-up (weights widened
per four channels, their sums, the requantisation) is now about 10 instructions a tap instead of
about 85: through a ring a layer costs 1.05-1.16x its whole call in QEMU (docs/bench/harness_kernels.md;
1.23-1.53x before), and whole calls 0.4-18 % less. It stays per call rather than per invoke: kept for
every channel, it would cost about 26 bytes a channel of arena (on the very ops overlapped to save
arena) or, re-laid offline, flash and a constant input per op (a tail entry, and off on boards
without the flash for re-laid weights)."""

from __future__ import annotations

from tpu_pipeline.toolchain.ir.graph import Graph
from tpu_pipeline.toolchain.ir.kernel_variants.record import KernelVariant

MAX_TAPS = 81  # (harness/tpup_conv.h kFastMaxTaps: the weights of four channels on the stack)
WINS_FROM_TAPS = 25  # windows from 5x5 up: where it beat CMSIS-NN's in QEMU (and 3x3 at stride 1 ...)
THREE_FROM_OUTPUTS = 36  # (... on maps of at least 6 x 6 outputs: 5 x 5 and smaller lost, 0.94-0.77x)


def applies(graph: Graph, i: int) -> bool:
    """One output channel per input channel, no dilation, at most MAX_TAPS taps."""
    op = graph.ops[i]
    if op.opcode != "DEPTHWISE_CONV_2D":
        return False
    o, w, x = op.options, graph.tensors[op.inputs[1]].shape, graph.tensors[op.inputs[0]].shape
    return (o.depth_multiplier == 1 and o.dilation_h == 1 and o.dilation_w == 1 and x[3] == w[3]
            and w[1] * w[2] <= MAX_TAPS)


def wins(graph: Graph, i: int) -> bool:
    op = graph.ops[i]
    w, y = graph.tensors[op.inputs[1]].shape, graph.tensors[op.outputs[0]].shape
    three_s1 = w[1] == w[2] == 3 and op.options.stride_h == op.options.stride_w == 1 and y[1] * y[2] >= THREE_FROM_OUTPUTS
    return w[1] * w[2] >= WINS_FROM_TAPS or three_s1


VARIANT = KernelVariant(flag="fast", bit=4, opcode="DEPTHWISE_CONV_2D", applies=applies, wins=wins,
                        cost_class="tpup_depthwise_fast", cost_fallback="depthwise_opt", source="tpup_depthwise.cc",
                        in_stages=True)

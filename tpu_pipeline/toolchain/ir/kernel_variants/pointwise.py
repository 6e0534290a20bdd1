"""Flag "pointwise": the harness's own int8 1x1 convolution (harness/tpup_pointwise.cc), in both
firmware builds. Two output pixels widened once to int16 (input offset added) and reused by every
output channel, two channels x two pixels per pass in an inline-assembly SMLAD loop, no buffer in
the arena (the widened pair lives in output bytes not yet written); TFLite's ConvPerChannel
integers. Its requantisation is SMMULR plus one nudged shift where `requant_bits` proves that
exact for every accumulator the op can produce (option bit 0x200), else TFLite's integers. It beat
CMSIS-NN's 1x1 kernel on every layer measured in QEMU (docs/bench/harness_kernels.md: 1.06-1.46x);
with one output channel it runs a plain per-pixel loop, so it wins from two. "pointwise16" (the
same kernel on weights re-laid offline, registered before this) takes the layers of three output
channels and more wherever the re-laid weights may go in flash; this one is its lean twin."""

from __future__ import annotations

from tpu_pipeline.toolchain.ir.geometry import leading_pads
from tpu_pipeline.toolchain.ir.graph import Graph, Op
from tpu_pipeline.toolchain.ir.kernel_variants.record import KernelVariant
from tpu_pipeline.toolchain.ir.requant import pointwise_requant_proven

FAST_REQUANT = 0x200  # (harness/tpup_conv.h kFlagFastRequant)


def applies(graph: Graph, i: int) -> bool:
    """A 1x1 window over all input channels, no padding (any stride)."""
    op = graph.ops[i]
    w, x = graph.tensors[op.inputs[1]].shape, graph.tensors[op.inputs[0]].shape
    return w[1] == w[2] == 1 and w[3] == x[3] and leading_pads(graph, op) == (0, 0)


def wins(graph: Graph, i: int) -> bool:
    return graph.tensors[graph.ops[i].outputs[0]].shape[3] >= 2


def requant_bits(graph: Graph, op: Op) -> int:
    return FAST_REQUANT if pointwise_requant_proven(graph, op) else 0


VARIANT = KernelVariant(flag="pointwise", bit=0x100, opcode="CONV_2D", applies=applies, wins=wins,
                        cost_class="tpup_pointwise", cost_fallback="conv_1x1", source="tpup_pointwise.cc",
                        derived_bits=requant_bits, derived_mask=FAST_REQUANT, in_stages=True)

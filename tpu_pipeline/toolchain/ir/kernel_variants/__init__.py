"""The harness's faster kernel variants, one module each, registered here.

A variant is a kernel of the MCU harness that computes exactly what an op's builtin computes
(bit-identical under both kernel sets) and is faster on the shapes it takes. Unlike the memory
flags of tpu_pipeline.toolchain.ir.kernels (`direct`, `overlap`), which fit trades against time,
a variant needs no persistent data of its own and at most a small kernel buffer (dw3's, under a
kilobyte, arena scratch), so the model on the harness takes it wherever QEMU measured it faster
(`wins`); one that reads a constant of its own (packed's re-laid weights) adds that tensor's
16-byte entry to TFLite Micro's tail.

A new variant is one module here defining `VARIANT`, plus one line in `REGISTRY`; beside them only
data: its firmware source (data/firmware/harness/<source>, dispatched on its flag bit in
tpup_conv.cc) and, once measured, its rows in data/mcu_cost.toml. Everything else follows from the
record: the kernel name and the custom options' flag bit (ir/kernels.py), fit's fastest point
(fit/variants.py `on_harness`), the scratch model (memory/scratch.py: its `scratch`: dw3's),
TFLite Micro's tail (its constant input is a tensor, counted there), the cost model (cost/mcu.py:
its own row, else its `cost_fallback`), the patch-stage rewrite (a stage drops the flag unless
tpup_stage.cc runs the variant: `in_stages`), the builtin view (its constant input dropped), the
custom op it runs under (its opcode's, ir/harness_ops.py) and the sources of the firmware project
(firmware/project.py) and of the drop-in library (deploy/library.py), via ir/harness_ops.py.
tests/test_kernel_variants.py registers a probe variant and checks each of these.
"""

from __future__ import annotations

from tpu_pipeline.toolchain.ir.kernel_variants import depthwise3x3, fast_depthwise, packed, pointwise, pointwise16, window
from tpu_pipeline.toolchain.ir.kernel_variants.record import KernelVariant

REGISTRY: tuple[KernelVariant, ...] = (
    depthwise3x3.VARIANT,  # (before "fast": where both run an op, the narrow-map kernel takes it)
    fast_depthwise.VARIANT,
    packed.VARIANT,
    pointwise16.VARIANT,  # (before "pointwise": where both run an op, the re-laid weights take it)
    pointwise.VARIANT,
    window.VARIANT,
)


def registered() -> dict[str, KernelVariant]:
    """Flag -> variant, in registration order (read at call time, so a registration is all it takes)."""
    return {v.flag: v for v in REGISTRY}

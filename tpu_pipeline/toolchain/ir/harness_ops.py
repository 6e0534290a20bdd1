"""The harness firmware's custom ops, one registration each: the single list that the op codes
(ir/kernels.py `custom_codes`), the op resolver's calls (export/sources.py `harness_custom_ops`), the
firmware project's objects (firmware/project.py) and the drop-in library's sources
(deploy/library.py) are read from.

Each op's module declares its `HarnessOp` (tpu_pipeline.toolchain.ir.kernel_variants.record): the
patch stage (ir/stage.py), the MEAN and MUL loops (ir/mean_mul.py), the fully connected kernel
(ir/fully_connected.py), the ADD (ir/add.py); the two convolutions are declared here, since the kernels module that
writes them reads this one. Every op registers through tpup_conv.h, and tpup_conv.cc dispatches the
faster variants (tpu_pipeline.toolchain.ir.kernel_variants), so any harness op brings those in.
"""

from __future__ import annotations

from tpu_pipeline.toolchain.ir import add, fully_connected, kernel_variants, mean_mul, stage
from tpu_pipeline.toolchain.ir.kernel_variants.record import HarnessOp

CONV = HarnessOp("TPUP_CONV_2D", "CONV_2D", "tpup::Register_CONV_2D")
DEPTHWISE = HarnessOp("TPUP_DEPTHWISE_CONV_2D", "DEPTHWISE_CONV_2D", "tpup::Register_DEPTHWISE_CONV_2D")
COMMON_SOURCES = ("tpup_conv.h", "tpup_add.h", "tpup_conv.cc")  # every harness op registers through them
# (tpup_add.h: the ADD tables TPUP_ADD and the patch stage share)

REGISTRY: tuple[HarnessOp, ...] = (
    CONV,
    DEPTHWISE,
    stage.HARNESS_OP,
    mean_mul.MEAN_OP,
    mean_mul.MUL_OP,
    fully_connected.HARNESS_OP,
    add.HARNESS_OP,
)


def by_code() -> dict[str, HarnessOp]:
    """Custom op code -> the op, in registration order (read at call time)."""
    return {h.custom_code: h for h in REGISTRY}


def variant_sources() -> list[str]:
    return sorted({v.source for v in kernel_variants.REGISTRY})


def sources(custom_codes=None) -> list[str]:
    """The firmware sources the harness ops `custom_codes` need (None: every registered op), in
    build order: the shared ones, each variant's, then each op's own; [] when none is a harness op."""
    ops = [h for h in REGISTRY if custom_codes is None or h.custom_code in custom_codes]
    if not ops:
        return []
    own = [s for h in ops for s in h.sources]
    return [*COMMON_SOURCES, *variant_sources(), *dict.fromkeys(own)]


def cost_fallbacks() -> dict[str, str]:
    """Cost class -> the class it is priced as until its rows are fitted (variants and harness ops)."""
    return {**{h.cost_class: h.cost_fallback for h in REGISTRY if h.cost_class},
            **{v.cost_class: v.cost_fallback for v in kernel_variants.REGISTRY},
            **{c: v.cost_class for v in kernel_variants.REGISTRY for c in v.cost_subclasses}}

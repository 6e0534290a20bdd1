"""How a runtime turns an op order into buffer lifetimes: one definition, used everywhere."""

from __future__ import annotations

from dataclasses import dataclass

from tpu_pipeline.toolchain.device import CMSIS_NN, REFERENCE, KernelSet
from tpu_pipeline.toolchain.errors import UsageError


@dataclass(frozen=True)
class Semantics:
    name: str
    alignment: int  # every buffer size is rounded up to this
    inputs_live_whole_run: bool  # TFLite keeps graph inputs allocated for the whole invocation
    in_place_ops: frozenset[str]  # ops whose output shares its first input's buffer when that dies there
    allocates_unused: bool = False  # tensors no op touches get arena bytes too (TFLite Micro)
    kernels: KernelSet | None = None  # TFLite Micro's kernel set (its scratch, tail and cost tables); None: not TFLM

    @property
    def is_tflm(self) -> bool:
        """TFLite Micro's lifetimes (either kernel set): asked of the value, never of its name."""
        return self.kernels is not None


# TFLite Micro: inputs freed after their last use, 16-byte rounding (its GreedyMemoryPlanner, first
# fit, is runtime_planners.tflm_greedy).
TFLM = Semantics("tflm", 16, False, frozenset(), allocates_unused=True, kernels=REFERENCE)
# TFLite Micro built with CMSIS-NN kernels (what Cortex-M deployments run): the same planner and
# lifetimes, but the optimised kernels request their own scratch buffers (tpu_pipeline/toolchain/memory/scratch.py).
TFLM_CMSIS_NN = Semantics("tflm-cmsis-nn", 16, False, frozenset(), allocates_unused=True, kernels=CMSIS_NN)
# TFLite / LiteRT: 64-byte alignment, reshape-like ops share their input's buffer (its ArenaPlanner,
# best fit, is runtime_planners.tflite_arena).
TFLITE = Semantics("tflite", 64, True, frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS", "BITCAST"}))

SEMANTICS = {s.name: s for s in (TFLM, TFLM_CMSIS_NN, TFLITE)}


def get_semantics(name: str | Semantics) -> Semantics:
    if isinstance(name, Semantics):
        return name
    try:
        return SEMANTICS[name]
    except KeyError:
        raise UsageError(f"unknown semantics '{name}' (choose from {', '.join(SEMANTICS)})") from None


def tflm_semantics(kernels: KernelSet | Semantics) -> Semantics:
    """The TFLite Micro semantics of a kernel set (the host wheel runs the reference kernels).
    Resolved once where a command starts and passed down as the object: a TFLite Micro Semantics
    is returned as it is (`.kernels` is its KernelSet)."""
    if isinstance(kernels, Semantics) and kernels.kernels is not None:
        return kernels
    for s in (TFLM, TFLM_CMSIS_NN):
        if s.kernels == kernels:
            return s
    raise UsageError(f"not a TFLite Micro kernel set: {kernels!r}")


def align(size: int, alignment: int) -> int:
    return (size + alignment - 1) // alignment * alignment

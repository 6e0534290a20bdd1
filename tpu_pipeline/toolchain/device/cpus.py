"""The CPU profiles a board's `[firmware] cpu` names: code generation flags per profile.

ARMv7E-M cores with the FPU share one instruction set and the hard-float ABI, so a TFLite Micro
library built for one links into firmware for the other (a board's `library_cpu`).
"""

from __future__ import annotations

from tpu_pipeline.toolchain.errors import UsageError

CPU_FLAGS = {
    "cortex-m4+fp": ("-mcpu=cortex-m4", "-mfpu=fpv4-sp-d16", "-mfloat-abi=hard", "-mthumb"),
    "cortex-m7+fp": ("-mcpu=cortex-m7", "-mfpu=fpv5-d16", "-mfloat-abi=hard", "-mthumb"),
    "cortex-m33+fp": ("-mcpu=cortex-m33", "-mfpu=fpv5-sp-d16", "-mfloat-abi=hard", "-mthumb"),
}
DEFAULT_CPU = "cortex-m4+fp"


def check_cpu(cpu: str) -> str:
    if cpu not in CPU_FLAGS:
        raise UsageError(f"unknown CPU profile {cpu!r} (known: {', '.join(CPU_FLAGS)})")
    return cpu

"""TFLite Micro's kernel sets, defined once: the value every room passes instead of a name.

    ks = kernel_set(args.kernels)    # at the entry point (command line, API): a name becomes the value
    ks.name                          # "reference" / the CMSIS-NN set: reports, make KERNELS=, shared/tflm/<name>
    ks.defines                       # its TFLite Micro build defines
    ks.tail_column                   # its column in memory/tflm_target.py's per-kernel-set tables
    ks.cost_key                      # its section of data/mcu_cost.toml

A new kernel set is one entry here (and its columns in the tables it names).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_pipeline.toolchain.errors import UsageError


@dataclass(frozen=True)
class KernelSet:
    name: str  # as the command line, reports and the firmware's Makefile spell it
    defines: tuple[str, ...]  # TFLite Micro build defines (library and firmware)
    tail_column: int  # column of memory/tflm_target.py's OP_DATA (kernels' persistent data)
    cost_key: str  # section of tpu_pipeline/toolchain/data/mcu_cost.toml (fitted instruction counts)

    def __str__(self) -> str:
        return self.name


# The Python wheel's and the portable build's kernels: what the host's TFLite Micro runs.
REFERENCE = KernelSet("reference", (), 0, "reference")
# TFLite Micro's cmsis_nn kernels (what Cortex-M deployments run).
CMSIS_NN = KernelSet("cmsis-nn", ("-DCMSIS_NN",), 1, "cmsis-nn")

KERNEL_SETS = (CMSIS_NN, REFERENCE)
KERNEL_SET_NAMES = tuple(k.name for k in KERNEL_SETS)
DEFAULT_KERNEL_SET = CMSIS_NN  # what `fit`, `export-mcu` and the firmware build for unless told


def kernel_set(value: str | KernelSet | None) -> KernelSet:
    """The kernel set named `value` (None: the default); a KernelSet is returned as it is.
    Resolve once at an entry point and pass the value down."""
    if isinstance(value, KernelSet):
        return value
    if value is None:
        return DEFAULT_KERNEL_SET
    for k in KERNEL_SETS:
        if k.name == value:
            return k
    raise UsageError(f"unknown kernel set '{value}' (choose from {', '.join(KERNEL_SET_NAMES)})")

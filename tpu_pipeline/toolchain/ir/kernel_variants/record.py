"""What a kernel variant declares (see the package's docstring), and what a harness op declares
(tpu_pipeline.toolchain.ir.harness_ops)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tpu_pipeline.toolchain.ir.graph import Graph, Op


@dataclass(frozen=True)
class KernelVariant:
    flag: str  # in Op.kernel ("tpup+fast") and on the command line's kernel names
    bit: int  # its bit in the custom options' flags word (harness/tpup_conv.h)
    opcode: str  # the builtin op it runs
    applies: Callable[[Graph, int], bool]  # the ops it can run (besides kernels.can_run_harness)
    wins: Callable[[Graph, int], bool]  # where QEMU measured it faster than the kernel set's own
    cost_class: str  # its rows in data/mcu_cost.toml ([<kernel set>.<cost_class>])
    cost_fallback: str  # the builtin's class it is costed as until its rows are fitted
    source: str  # its firmware source under data/firmware/harness/
    # Bits the writer derives from the op's constants (e.g. a proof that a cheaper arithmetic is
    # exact for it), and which of the options' bits they may set: read back, they need the flag.
    derived_bits: Callable[[Graph, Op], int] | None = None
    derived_mask: int = 0
    # A constant the kernel reads as the op's input 4 (e.g. weights re-laid offline): written with
    # the flag, checked against the op's constants when read, dropped by the builtin view.
    constant_input: Callable[[Graph, Op], np.ndarray] | None = None
    in_stages: bool = False  # patch stages run their layers of this op on it (tpup_stage.cc)
    # The kernel buffer it asks for at Prepare, in bytes (memory/scratch.py); None: none (dw3 asks for one).
    scratch: Callable[[Graph, Op], int] | None = None
    # A kernel with paths of different speeds: the row an op's path is priced by (one of
    # `cost_subclasses`, each priced as `cost_class` until fitted), else `cost_class`.
    cost_class_of: Callable[[Graph, Op], str] | None = None
    cost_subclasses: tuple[str, ...] = ()


@dataclass(frozen=True)
class HarnessOp:
    """A custom op of the harness firmware: what the model names it by, what registers it, what it
    is built from and how the cost model prices it until its own rows are fitted."""
    custom_code: str  # the op code the model names it by, and the resolver registers it under
    opcode: str  # the IR op it runs (a builtin's code; the patch stage's own)
    register: str  # the C function returning its TfLiteRegistration* (harness/tpup_conv.h)
    sources: tuple[str, ...] = ()  # its own firmware sources under data/firmware/harness/
    cost_class: str | None = None  # its rows in data/mcu_cost.toml; None: priced as the builtin's class
    cost_fallback: str | None = None  # the class it is costed as until those rows are fitted

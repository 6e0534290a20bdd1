"""`FitParams`: every switch of a fit in one validated record, as `ScheduleParams` is the scheduler's.

The API and the command line build it once; the fit's stages (stages/) and the file-level steps
(model.py) read it, so no switch is threaded through the rooms by hand. The device and the kernel
set are objects here (resolved at the entry point); a wrong value is a UsageError when the
record is made.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_pipeline.toolchain.device import DEFAULT_KERNEL_SET, Device, KernelSet
from tpu_pipeline.toolchain.errors import UsageError

OBJECTIVES = ("latency", "memory")
ARENAS = ("whole", "head")


@dataclass(frozen=True)
class FitParams:
    budget: int | None = None  # bytes of arena (None: from `device`, or the smallest/fastest by `objective`)
    device: Device | None = None  # an MCU: its SRAM gives the budget (fit_model) and its cost model prices
    objective: str = "latency"  # latency: fastest within the budget; memory: smallest arena
    kernels: KernelSet = DEFAULT_KERNEL_SET  # TFLite Micro kernel set: costs, scratch, tail
    int8_io: bool = False  # drop the float QUANTIZE/DEQUANTIZE at the interface (rewrite.interface)
    input_outside_arena: bool = False  # the application keeps the inputs in its own buffer
    head_only: bool = False  # the budget and the memory objective count the head alone, not head + tail
    patches: bool = True  # offer patch-based execution
    harness: bool = True  # the harness firmware's kernels may be chosen (False: --builtin-kernels)
    # ... and those whose weights are re-laid in flash, larger: True every op, False none, or the
    # first-output names of the ops that may (fit_file narrows it where the written model would not
    # fit the device's flash: fit/flash.py)
    relaid_weights: bool | frozenset[str] = True
    allow_lossy: bool = False  # also offer the int8 partial-sum splits (requantized)
    pareto: bool = False  # also the arena/latency frontier
    probe_budgets: tuple[int, ...] = ()  # also the fastest selection within each of these (benchmarks)
    time_limit: float = 30.0  # seconds for the search (checks in the runtimes come on top)
    verify_runs: int = 2  # random inputs per runtime for the check of the written model

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise UsageError(f"unknown objective '{self.objective}' (choose from {', '.join(OBJECTIVES)})")
        if self.budget is not None and (isinstance(self.budget, bool) or self.budget < 0):
            raise UsageError(f"--budget must be a number of bytes >= 0, got {self.budget}")
        t = self.time_limit
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (0 < t < float("inf")):
            raise UsageError(f"--time-limit must be a number of seconds > 0, got {t!r}")
        if isinstance(self.verify_runs, bool) or not isinstance(self.verify_runs, int) or self.verify_runs < 1:
            raise UsageError(f"--runs must be at least 1, got {self.verify_runs}")
        if not isinstance(self.kernels, KernelSet):
            raise UsageError(f"kernels must be a KernelSet (resolved at the entry point), got {self.kernels!r}")
        r = self.relaid_weights
        if not isinstance(r, (bool, frozenset)) or (isinstance(r, frozenset) and not all(isinstance(n, str) for n in r)):
            raise UsageError(f"fit parameter relaid_weights must be True, False or a frozenset of op names, got {r!r}")
        for name in ("int8_io", "input_outside_arena", "head_only", "patches", "harness", "allow_lossy", "pareto"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"fit parameter {name} must be True or False, got {getattr(self, name)!r}")
        object.__setattr__(self, "probe_budgets", tuple(self.probe_budgets))

    @property
    def arena(self) -> str:
        """What the budget and the memory objective count: "whole" (head + tail) or "head"."""
        return "head" if self.head_only else "whole"

    @property
    def passes(self) -> tuple[str, ...]:
        """The optional stages that are on (the driver's switch)."""
        return ("kernel_twins",) * self.harness + ("patches",) * self.patches

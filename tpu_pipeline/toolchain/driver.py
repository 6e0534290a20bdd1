"""The pass driver: runs a list of passes over one state, the way torch.fx's PassManager does
(compile's passes, fit's stages, export-mcu's stages). It times each pass, gives each its share of one total time budget, reports
progress with the elapsed time, names the failing pass in errors and lints the graph after each
pass. Adding a pass is writing a `Pass` and putting it in the list (tpu_pipeline/toolchain/compile/__init__.py).
`fit` and `export-mcu` run their stages on the same machinery (toolchain/fit/stages/,
toolchain/export/): a state is any frozen record with `options` (its params: `time_limit`, the
optional passes that are on as `passes`) and `graph`; fit hands its stages Deadlines instead of
seconds (`DeadlineBudget`), so one clock, or a test's counted deadline, bounds the whole fit.

The budget: a pass with `share` s may search for s x --time-limit seconds, and never longer than
what is left of BUDGET_FACTOR x --time-limit for the whole run. The shares of the standard list
add up to less than BUDGET_FACTOR, so every pass gets its full share unless a solver overran.
An optional pass with nothing left is skipped; a required one still gets MIN_SLICE_S (it has a
fast answer to fall back on). Verification runs the model and is bounded by its size, not by
the budget; reading and writing files are not counted either.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tpu_pipeline.toolchain.budget import Deadline
from tpu_pipeline.toolchain.errors import ToolchainError

BUDGET_FACTOR = 4.0
MIN_SLICE_S = 0.5


@dataclass(frozen=True)
class PassRecord:
    name: str
    status: str                 # "ran", "no gain" or "skipped"
    seconds: float = 0.0
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[Any, Any], tuple[Any, PassRecord]]  # (state, allowed: seconds, or a Deadline for fit)
    share: float = 0.0          # of --time-limit this pass may spend searching; 0: it does not search
    optional: bool = False      # skippable: switched off by the user (--no-<name>) or out of time
    when: Callable[[Any], bool] = lambda options: True   # runs at all for these options


class PassError(RuntimeError):
    """A bug inside a pass (not a user error): carries the pass name to the CLI's one line."""


class Budget:
    """`factor` x `time_limit` for all passes together, on `clock` (tests pass one they advance
    themselves, so a share is the same on every machine)."""

    def __init__(self, time_limit: float, factor: float = BUDGET_FACTOR, clock: Callable[[], float] = time.monotonic):
        self.time_limit = time_limit
        self.total = factor * time_limit
        self.clock = clock
        self.start = clock()

    @property
    def elapsed(self) -> float:
        return self.clock() - self.start

    def allowance(self, share: float, required: bool) -> float:
        if share <= 0:
            return 0.0
        left = min(share * self.time_limit, self.total - self.elapsed)
        return max(left, MIN_SLICE_S) if required else left

    @staticmethod
    def spent(allowed: float) -> bool:
        return allowed <= 0


class DeadlineBudget:
    """Shares of one Deadline (fit's stages): a pass with `share` s gets `search.sub(fraction=s)`,
    a Deadline, so nested searches keep asking the same clock; a pass with share 0 gets the
    whole run's deadline (it bounds its own work, e.g. scheduling the chosen graph)."""

    def __init__(self, whole: Deadline, search: Deadline | None = None):
        self.whole, self.search = whole, search or whole
        self.start = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def allowance(self, share: float, required: bool) -> Deadline:
        return self.search.sub(fraction=share) if share > 0 else self.whole

    @staticmethod
    def spent(allowed: Deadline) -> bool:
        return False  # a stage out of time answers from what it has (its Deadline says so)


def run_passes(passes: list[Pass], state, progress: Callable[[str], None] | None = None,
               lint: bool = True, clock: Callable[[], float] = time.monotonic,
               budget: Budget | DeadlineBudget | None = None,
               after: Callable[[str, Any], None] | None = None) -> tuple[Any, list[PassRecord]]:
    """`after(name, state)`, when given, sees the state each pass that ran left (compile starts
    writing its files from there while the later passes run)."""
    say = progress or (lambda msg: None)
    budget = budget or Budget(state.options.time_limit, clock=clock)
    records: list[PassRecord] = []
    for p in passes:
        if not p.when(state.options):
            continue
        if p.optional and p.name not in state.options.passes:
            records.append(PassRecord(p.name, "skipped", 0.0, {"reason": "switched off"}))
            continue
        allowed = budget.allowance(p.share, required=not p.optional)
        if p.share and budget.spent(allowed):
            records.append(PassRecord(p.name, "skipped", 0.0, {"reason": "the time budget is spent"}))
            say(f"[{budget.elapsed:6.1f} s] {p.name}: skipped, the time budget is spent")
            continue
        if isinstance(allowed, float):  # fit's stages say their own progress
            say(f"[{budget.elapsed:6.1f} s] {p.name}" + (f" (up to {allowed:.1f} s)" if p.share else ""))
        t0 = clock()
        try:
            state, record = p.run(state, allowed)
        except ToolchainError:
            raise
        except Exception as exc:
            raise PassError(f"pass '{p.name}' failed: {type(exc).__name__}: {exc}") from exc
        record = PassRecord(record.name, record.status, clock() - t0, record.detail)
        if lint and state.graph is not None:
            problems = state.graph.lint()
            if problems:
                raise PassError(f"pass '{p.name}' left an invalid graph: {problems[0]}")
        records.append(record)
        if isinstance(allowed, float):
            say(f"[{budget.elapsed:6.1f} s] {p.name}: {record.status} in {record.seconds:.2f} s")
        if after is not None:
            after(p.name, state)
    return state, records

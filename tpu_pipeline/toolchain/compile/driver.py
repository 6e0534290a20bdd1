"""The compile driver: runs a list of passes over one `CompileState`, the way torch.fx's
PassManager does. It times each pass, gives each its share of one total time budget, reports
progress with the elapsed time, names the failing pass in errors and lints the graph after each
pass. Adding a pass is writing a `Pass` and putting it in the list (tpu_pipeline/toolchain/compile/__init__.py).

The budget: a pass with `share` s may search for s x --time-limit seconds, and never longer than
what is left of BUDGET_FACTOR x --time-limit for the whole run. The shares of the standard list
add up to less than BUDGET_FACTOR, so every pass gets its full share unless a solver overran.
An optional pass with nothing left is skipped; a required one still gets MIN_SLICE_S (it has a
fast answer to fall back on). Verification runs the model and is bounded by its size, not by
the budget; reading and writing files are not counted either.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from tpu_pipeline.toolchain.compile.state import CompileOptions, CompileState, PassRecord
from tpu_pipeline.toolchain.errors import ToolchainError

BUDGET_FACTOR = 4.0
MIN_SLICE_S = 0.5


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[CompileState, float], tuple[CompileState, PassRecord]]  # (state, seconds allowed)
    share: float = 0.0          # of --time-limit this pass may spend searching; 0: it does not search
    optional: bool = False      # skippable: switched off by the user (--no-<name>) or out of time
    when: Callable[[CompileOptions], bool] = lambda options: True   # runs at all for these options


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


def run_passes(passes: list[Pass], state: CompileState, progress: Callable[[str], None] | None = None,
               lint: bool = True, clock: Callable[[], float] = time.monotonic) -> tuple[CompileState, list[PassRecord]]:
    say = progress or (lambda msg: None)
    budget = Budget(state.options.time_limit, clock=clock)
    records: list[PassRecord] = []
    for p in passes:
        if not p.when(state.options):
            continue
        if p.optional and p.name not in state.options.passes:
            records.append(PassRecord(p.name, "skipped", 0.0, {"reason": "switched off"}))
            continue
        allowed = budget.allowance(p.share, required=not p.optional)
        if p.share and allowed <= 0:
            records.append(PassRecord(p.name, "skipped", 0.0, {"reason": "the time budget is spent"}))
            say(f"[{budget.elapsed:6.1f} s] {p.name}: skipped, the time budget is spent")
            continue
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
        say(f"[{budget.elapsed:6.1f} s] {p.name}: {record.status} in {record.seconds:.2f} s")
    return state, records

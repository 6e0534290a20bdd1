"""`fit`: the fastest exact variant of a model whose TFLite Micro arena fits a budget.

    spans (cuts) -> variants per run of spans (as is, rewrites, kernel twins, patches) -> CP-SAT
    selection (select.py) -> the chosen variants applied to the whole graph -> exact schedule ->
    arena plan (head)

as the stage list of stages/__init__.py, run by the pass driver over a FitState (params.py says
every switch).

The answer is checked end to end: the whole rewritten graph is scheduled by the exact scheduler
and planned by the arena planner; `head` is what TFLite Micro allocates with that offline plan
(tests and `tpu-pipeline fit` measure it with the real interpreter).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tpu_pipeline.toolchain.budget import Deadline, Progress
from tpu_pipeline.toolchain.device import Device, KernelSet
from tpu_pipeline.toolchain.driver import DeadlineBudget, Pass, run_passes
from tpu_pipeline.toolchain.fit.params import ARENAS, FitParams
from tpu_pipeline.toolchain.fit.select import MAX_FRONTIER_POINTS, Selection
from tpu_pipeline.toolchain.fit.stages import REALISE_SHARE, STAGES
from tpu_pipeline.toolchain.fit.state import FitState
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.memory.semantics import Semantics, tflm_semantics
from tpu_pipeline.toolchain.memory.tflm_target import target_tail
from tpu_pipeline.toolchain.schedule.api import Schedule


@dataclass(frozen=True)
class FitResult:
    graph: Graph  # the chosen variant, ops in their final order
    selection: Selection
    schedule: Schedule  # of the whole chosen graph
    head: int  # TFLite Micro arena head with `offline_plan`
    offline_plan: tuple[int, ...] | None
    plan_proven: bool  # the head equals the peak (the planner's lower bound)
    budget: int | None
    fits: bool
    baseline_peak: int  # the proven optimal peak of the model as it is
    baseline_latency_s: float
    spans: int
    variants_evaluated: int
    candidates: int
    candidates_dropped: int = 0  # patch candidates that do not exist after all (a tile reads nothing of a tensor)
    tail: int | None = None  # the persistent tail on the 32-bit target (None: an op's allocations not modelled)
    baseline_tail: int | None = None  # the model as it is
    arena: str = "whole"  # what the budget and the memory objective counted: "whole" (head + tail) or "head"
    frontier: tuple[Selection, ...] = ()
    frontier_complete: bool = False  # the sweep reached the smallest arena (else it stopped at the time limit)
    probes: dict = field(default_factory=dict)  # budget -> the fastest Selection within it, None (there is
    # none), or "time limit" (none among the variants measured before the time limit)
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())
    variants_estimated: int = 0  # patch candidates whose tile geometry was estimated (built: variants_evaluated)

    def to_json(self) -> dict:
        return {
            "fits": self.fits, "budget_bytes": self.budget, "budget_counts": self.arena, "arena_head_bytes": self.head,
            "arena_tail_bytes_predicted": self.tail,
            "arena_bytes_predicted": None if self.tail is None else self.head + self.tail,
            "baseline_tail_bytes": self.baseline_tail,
            "baseline_arena_bytes": None if self.baseline_tail is None else self.baseline_peak + self.baseline_tail,
            "peak_bytes": self.schedule.peak, "proven_optimal_order": self.schedule.proven_optimal,
            "plan_reaches_peak": self.plan_proven,
            "baseline_peak_bytes": self.baseline_peak, "baseline_latency_s_predicted": self.baseline_latency_s,
            "latency_s_predicted": self.selection.latency_s,
            "latency_overhead_predicted": self.selection.latency_s / self.baseline_latency_s - 1
            if self.baseline_latency_s else None,
            "ops": len(self.graph.ops), "spans": self.spans, "variants_evaluated": self.variants_evaluated,
            "variants_estimated": self.variants_estimated,
            "patch_candidates": self.candidates, "patch_candidates_dropped": self.candidates_dropped,
            "selection": self.selection.to_json(),
            "frontier": [p.to_json() for p in self.frontier], "frontier_complete": self.frontier_complete,
            "seconds": self.seconds, "notes": list(self.notes),
        }


def fit_graph(graph: Graph, *, budget: int | None, device: Device, kernels: KernelSet | Semantics,
              objective: str = "latency", time_limit: float = 30.0, want_pareto: bool = False,
              probe_budgets: tuple[int, ...] = (), deadline: Deadline | None = None,
              progress: Progress = None, allow_lossy: bool = False, model=None, harness: bool = True,
              arena: str = "whole", patches: bool = True) -> FitResult:
    """`run_fit` with the switches as keywords (tests and tools call it so). `budget=None` with
    objective "memory" asks for the smallest arena; with "latency" for the fastest variant.
    `arena`: "whole" (head + tail on the 32-bit target) or "head"; the rest as in FitParams."""
    if arena not in ARENAS:
        raise UsageError(f"unknown arena '{arena}' (choose from {', '.join(ARENAS)})")
    sem = tflm_semantics(kernels)
    params = FitParams(budget=budget, objective=objective, kernels=sem.kernels, head_only=arena == "head",
                       patches=patches, harness=harness, allow_lossy=allow_lossy, pareto=want_pareto,
                       probe_budgets=probe_budgets, time_limit=time_limit)
    return run_fit(graph, params, device, deadline=deadline, progress=progress, model=model)


def run_fit(graph: Graph, params: FitParams, device: Device, *, deadline: Deadline | None = None,
            progress: Progress = None, model=None, stages: list[Pass] = STAGES) -> FitResult:
    """Choose, apply, schedule and plan: fit's stages (stages/) over one FitState. `device` prices
    the variants; `model` is the source model as tflite/ reads it (for calibrating lossy splits);
    `stages`: the list to run (tests run a list with a stage of their own)."""
    t0 = time.monotonic()
    whole_run = deadline or Deadline(params.time_limit)
    # the chosen graph is scheduled and planned at the end: a patched graph has thousands of ops,
    # so that work is not left with what the search happens to leave over
    budget = DeadlineBudget(whole_run, whole_run.sub(fraction=1.0 - REALISE_SHARE))
    state = FitState(params, device, tflm_semantics(params.kernels), graph, graph, graph, whole_run, t0,
                     progress, model)
    state, _ = run_passes(stages, state, lint=True, budget=budget)
    return result_of(state, time.monotonic() - t0)


def result_of(state: FitState, seconds: float) -> FitResult:
    """The FitResult of a finished FitState, with the notes the user must hear."""
    p, sem, pool, sel = state.params, state.sem, state.pool, state.selection
    whole, sched, plan = state.realised
    notes = list(state.notes)
    if state.cut_short:
        notes.append(f"the selection stopped at the time limit ({pool.measured} of {len(state.candidates)} patch "
                     "candidates built): it is the best of those built, and a longer --time-limit may find a faster "
                     "or smaller one")
    if p.pareto and not state.complete:
        notes.append(f"the frontier sweep stopped at the time limit (or at {MAX_FRONTIER_POINTS} points): it holds "
                     "the points found and the smallest arena")
    if plan.head > sched.peak:
        notes.append(f"the arena head ({plan.head:,} B) is above the order's peak ({sched.peak:,} B): the planner did "
                     "not reach the peak within the time limit (a longer --time-limit may)")
    if sched.peak > sel.peak:
        notes.append(f"the whole graph's schedule peaks at {sched.peak:,} B, above the selection's {sel.peak:,} B")
    offsets = tuple(plan.tensor_offsets) if any(o >= 0 for o in plan.tensor_offsets) else None
    tail = target_tail(whole, sem).bytes
    fits = p.budget is None or plan.head + ((tail or 0) if p.arena == "whole" else 0) <= p.budget
    return FitResult(whole, sel, sched, plan.head, offsets, plan.head <= sched.peak, p.budget, fits,
                     state.baseline.peak, state.baseline.latency_s, len(state.spans), pool.measured,
                     len(state.candidates), pool.dropped, tail, target_tail(state.original, sem).bytes, p.arena,
                     state.frontier, state.complete, state.probes, seconds, tuple(notes), pool.estimated)

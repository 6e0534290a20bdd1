"""`fit`: the fastest exact variant of a model whose TFLite Micro arena fits a budget.

    spans (cuts) -> variants per run of spans (as is, patches) -> CP-SAT selection (selection.py)
    -> the chosen variants applied to the whole graph -> exact schedule -> arena plan (head)

The answer is checked end to end: the whole rewritten graph is scheduled by the exact scheduler
and planned by the arena planner; `head` is what TFLite Micro allocates with that offline plan
(tests and `tpu-pipeline fit` measure it with the real interpreter).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from toolchain.budget import Deadline, Progress, say
from toolchain.errors import UsageError
from toolchain.fit.select import Selection, pareto, select
from toolchain.fit.spans import split_spans
from toolchain.fit.variants import Variant, as_is_variants, patch_variants, refine
from toolchain.ir import Graph
from toolchain.memory.tflm import plan_for_tflm
from toolchain.schedule.api import Schedule, schedule

OBJECTIVES = ("latency", "memory")


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
    frontier: tuple[Selection, ...] = ()
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict:
        return {
            "fits": self.fits, "budget_bytes": self.budget, "arena_head_bytes": self.head,
            "peak_bytes": self.schedule.peak, "proven_optimal_order": self.schedule.proven_optimal,
            "plan_reaches_peak": self.plan_proven,
            "baseline_peak_bytes": self.baseline_peak, "baseline_latency_s_predicted": self.baseline_latency_s,
            "latency_s_predicted": self.selection.latency_s,
            "latency_overhead_predicted": self.selection.latency_s / self.baseline_latency_s - 1
            if self.baseline_latency_s else None,
            "ops": len(self.graph.ops), "spans": self.spans, "variants_evaluated": self.variants_evaluated,
            "patch_candidates": self.candidates, "selection": self.selection.to_json(),
            "frontier": [p.to_json() for p in self.frontier], "seconds": self.seconds, "notes": list(self.notes),
        }


def fit_graph(graph: Graph, *, budget: int | None, objective: str = "latency", device="qemu-mps2-an386",
              kernels: str | None = None, time_limit: float = 30.0, want_pareto: bool = False,
              deadline: Deadline | None = None, progress: Progress = None) -> FitResult:
    """Choose, apply, schedule and plan. `budget=None` with objective "memory" asks for the
    smallest arena; with "latency" for the fastest variant (the model as it is, usually)."""
    if objective not in OBJECTIVES:
        raise UsageError(f"unknown objective '{objective}' (choose from {', '.join(OBJECTIVES)})")
    t0 = time.monotonic()
    deadline = deadline or Deadline(time_limit)
    spans = split_spans(graph)
    say(progress, t0, f"fit: {len(graph.ops)} ops in {len(spans)} spans")
    as_is = as_is_variants(graph, spans, device, kernels, deadline.sub(fraction=0.25), progress)
    patches, n_cands = patch_variants(graph, spans, as_is, device, kernels, deadline.sub(fraction=0.6), progress, t0)
    variants = as_is + patches
    say(progress, t0, f"fit: {len(variants)} variants ({len(patches)} of {n_cands} patch candidates evaluated)")
    baseline = _selection_of(as_is)
    sel = _choose(variants, len(spans), budget, objective, deadline)
    if sel is None:  # nothing fits: the smallest arena we can reach
        sel = select(variants, len(spans), objective="memory", deadline=deadline.sub(fraction=0.5))
    frontier = tuple(pareto(variants, len(spans), deadline.sub(fraction=0.5))) if want_pareto else ()
    whole = _apply(graph, sel.variants)
    say(progress, t0, f"fit: chosen peak {sel.peak:,} B, {len(whole.ops)} ops; scheduling and planning")
    sched = schedule(whole, time_limit=None, deadline=Deadline(max(2.0, deadline.remaining())))
    whole = whole.reordered(sched.order)
    plan = plan_for_tflm(whole, time_limit=None, n_tensors=len(whole.tensors),
                         deadline=Deadline(max(1.0, deadline.remaining())))
    offsets = tuple(plan.tensor_offsets) if any(o >= 0 for o in plan.tensor_offsets) else None
    notes = []
    if sched.peak > sel.peak:
        notes.append(f"the whole graph's schedule peaks at {sched.peak:,} B, above the selection's {sel.peak:,} B")
    fits = budget is None or plan.head <= budget
    return FitResult(whole, sel, sched, plan.head, offsets, plan.head <= sched.peak, budget, fits,
                     baseline.peak, baseline.latency_s, len(spans), len(variants), n_cands, frontier,
                     time.monotonic() - t0, tuple(notes))


def _choose(variants: list[Variant], n_spans: int, budget, objective, deadline) -> Selection | None:
    """Select, then give the exact scheduler the variants whose bound says they might fit where
    their emitted order does not, and select again if that changed anything."""
    sel = select(variants, n_spans, budget=budget, objective=objective, deadline=deadline.sub(fraction=0.3))
    if budget is None:
        return sel
    refined = refine(variants, budget, deadline.sub(fraction=0.5))
    if refined != variants:
        sel = select(refined, n_spans, budget=budget, objective=objective, deadline=deadline.sub(fraction=0.3)) or sel
    return sel


def _selection_of(chosen: list[Variant]) -> Selection:
    return Selection(tuple(chosen), max(v.peak for v in chosen), sum(v.latency_s for v in chosen), True)


def _apply(graph: Graph, chosen) -> Graph:
    from toolchain.rewrite.patch import apply_patches

    for v in chosen:
        if v.kind == "patch":
            graph = apply_patches(graph, v.region, v.grid)
    return graph

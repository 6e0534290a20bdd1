"""`fit`: the fastest exact variant of a model whose TFLite Micro arena fits a budget.

    spans (cuts) -> variants per run of spans (as is, patches) -> CP-SAT selection (select.py)
    -> the chosen variants applied to the whole graph -> exact schedule -> arena plan (head)

The answer is checked end to end: the whole rewritten graph is scheduled by the exact scheduler
and planned by the arena planner; `head` is what TFLite Micro allocates with that offline plan
(tests and `tpu-pipeline fit` measure it with the real interpreter).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from tpu_pipeline.toolchain.budget import Deadline, Progress, say
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
from tpu_pipeline.toolchain.fit.select import Selection, chain_select, pareto, select
from tpu_pipeline.toolchain.fit.spans import split_spans
from tpu_pipeline.toolchain.fit.variants import (Variant, as_is_variants, best_order, kernel_twins, on_harness,
                                   patch_candidates, refine,
                                   rewrite_variants, splice, upgrade)
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.ir.kernels import with_kernel
from tpu_pipeline.toolchain.memory.lifetimes import lifetimes
from tpu_pipeline.toolchain.memory.semantics import tflm_semantics
from tpu_pipeline.toolchain.memory.tflm import plan_for_tflm
from tpu_pipeline.toolchain.rewrite.patch import apply_patches
from tpu_pipeline.toolchain.schedule.api import Schedule, schedule

OBJECTIVES = ("latency", "memory")
REALISE_SHARE = 0.25  # of the time limit, kept for scheduling and planning the chosen graph


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
    frontier_complete: bool = False  # the sweep reached the smallest arena (else it stopped at the time limit)
    probes: dict = field(default_factory=dict)  # budget -> the fastest Selection within it, None (there is
    # none), or "time limit" (none among the variants measured before the time limit)
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
            "frontier": [p.to_json() for p in self.frontier], "frontier_complete": self.frontier_complete,
            "seconds": self.seconds, "notes": list(self.notes),
        }


def fit_graph(graph: Graph, *, budget: int | None, objective: str = "latency", device="qemu-mps2-an386",
              kernels: str = "cmsis-nn", time_limit: float = 30.0, want_pareto: bool = False,
              probe_budgets: tuple[int, ...] = (), deadline: Deadline | None = None,
              progress: Progress = None, allow_lossy: bool = False, model=None, harness: bool = True) -> FitResult:
    """Choose, apply, schedule and plan. `budget=None` with objective "memory" asks for the
    smallest arena; with "latency" for the fastest variant (the model as it is, usually).
    `probe_budgets`: also report the fastest selection within each of these (benchmarks).
    `allow_lossy`: also offer the int8 partial-sum splits (requantized: not bit-identical), which
    calibrate on `model` (the source ModelT, for graphs with custom ops). `harness`: the model
    will run on the harness firmware, so its kernels may be chosen (`on_harness`, kernel twins);
    without it every op stays on a builtin kernel (a model for any TFLite Micro build)."""
    if objective not in OBJECTIVES:
        raise UsageError(f"unknown objective '{objective}' (choose from {', '.join(OBJECTIVES)})")
    t0 = time.monotonic()
    whole_run = deadline or Deadline(time_limit)
    original = graph
    harness_notes: list[str] = []
    if harness:
        graph, harness_notes = on_harness(graph)
    # the chosen graph is scheduled and planned at the end: a patched graph has thousands of ops,
    # so that work is not left with what the search happens to leave over
    deadline = whole_run.sub(fraction=1.0 - REALISE_SHARE)
    spans = split_spans(graph)
    say(progress, t0, f"fit: {len(graph.ops)} ops in {len(spans)} spans")
    as_is = as_is_variants(graph, spans, device, kernels, deadline.sub(fraction=0.25), progress)
    op_seconds = {o.index: o.seconds for o in estimate_mcu(graph, device, kernels=kernels).ops}
    rewrites = rewrite_variants(graph, spans, as_is, device, kernels, allow_lossy, model, deadline.sub(fraction=0.15),
                                harness)
    twins = [t for v in as_is + rewrites for t in kernel_twins(v, device, kernels)] if harness else []
    candidates = patch_candidates(graph, spans, as_is)
    pool = _Pool(graph, spans, as_is + rewrites + twins + candidates, device, kernels, op_seconds, harness)
    say(progress, t0, f"fit: {len(candidates)} patch candidates, {len(rewrites)} rewrite variants, "
                      f"{len(twins)} kernel variants; selecting")
    baseline = _selection_of(as_is)
    frontier, complete = (), False
    if want_pareto:  # the frontier first: every selection asked for is then a point of it
        frontier, complete = _frontier(pool, len(spans), deadline)
        say(progress, t0, f"fit: frontier of {len(frontier)} points{'' if complete else ' (incomplete)'}")
        sel = _from_frontier(frontier, budget, objective)
    else:
        sel = _choose(pool, len(spans), budget, objective, deadline)
    probes = {}
    for b in probe_budgets:  # after the main search: its measured variants answer most of these
        pool.stopped = False
        found = pool.select(len(spans), b, "latency", deadline.sub(fraction=0.3))
        probes[b] = "time limit" if found is None and pool.stopped else found
    if sel is None:  # nothing fits: the smallest arena we can reach
        sel = frontier[-1] if frontier else pool.select(len(spans), None, "memory", deadline.sub(fraction=0.5))
    say(progress, t0, f"fit: {pool.estimated} variants estimated, {pool.measured} built and measured")
    whole, sched, plan = _realise(graph, spans, sel, kernels, whole_run, progress, t0)
    notes = []
    as_is_chosen = len(sel.variants) == len(baseline.variants) and all(
        a is b for a, b in zip(sel.variants, baseline.variants))
    if not as_is_chosen and plan.head > baseline.peak and (budget is None or baseline.peak <= budget):
        # the chosen variant's real arena came out above the model as it is (its graph is too big
        # for the scheduler or the planner in the time left): keep whichever is smaller
        again = _realise(graph, spans, baseline, kernels, whole_run, progress, t0)
        if again[2].head < plan.head:
            notes.append(f"the chosen variant's arena ({plan.head:,} B) came out above the model as it is "
                         f"({again[2].head:,} B); the model as it is was kept")
            sel, (whole, sched, plan) = baseline, again
    offsets = tuple(plan.tensor_offsets) if any(o >= 0 for o in plan.tensor_offsets) else None
    notes = harness_notes + notes
    if harness:  # the model as the user gave it is the baseline, not its harness form
        base_sched = schedule(original, time_limit=None, deadline=Deadline(max(0.5, 0.05 * time_limit)),
                              semantics=tflm_semantics(kernels).name)
        baseline = replace(baseline, peak=base_sched.peak,
                           latency_s=estimate_mcu(original, device, kernels=kernels).latency_s)
    if want_pareto and not complete:
        notes.append("the frontier sweep stopped at the time limit: it holds the points found and the smallest arena")
    if plan.head > sched.peak:
        notes.append(f"the arena head ({plan.head:,} B) is above the order's peak ({sched.peak:,} B): the planner did "
                     "not reach the peak within the time limit (a longer --time-limit may)")
    if sched.peak > sel.peak:
        notes.append(f"the whole graph's schedule peaks at {sched.peak:,} B, above the selection's {sel.peak:,} B")
    fits = budget is None or plan.head <= budget
    return FitResult(whole, sel, sched, plan.head, offsets, plan.head <= sched.peak, budget, fits,
                     baseline.peak, baseline.latency_s, len(spans), pool.measured, len(candidates),
                     frontier, complete, probes, time.monotonic() - t0, tuple(notes))


class _Pool:
    """The variants, each at the cheapest stage that answers the question: a selection is made on
    what is known (floors are optimistic: bounds <= estimates <= measured), every variant it picks
    that is not measured yet is taken one stage further, and the selection is made again, until
    it picks only measured variants. The answer is then `select`'s (CP-SAT) over the measured
    variants, which must agree with the chain DP that steered the loop."""

    def __init__(self, graph, spans, variants, device, kernels, op_seconds, harness=True):
        self.graph, self.spans, self.variants = graph, spans, list(variants)
        self.device, self.kernels, self.op_seconds = device, kernels, op_seconds
        self.harness = harness  # kernel twins of measured variants may be offered
        self.estimated = self.measured = 0
        self.stopped = False  # a selection ended at its deadline (its answer: the best measured one)

    def select(self, n_spans, budget, objective, deadline, latency_bound=None) -> Selection | None:
        while True:
            pick = chain_select(self.variants, n_spans, budget=budget, objective=objective,
                                latency_bound=latency_bound)
            if pick is None or all(v.stage == "measured" for v in pick):
                break
            if deadline.expired():
                self.stopped = True
                break  # out of time: the best among the measured variants
            for v in pick:
                if v.stage != "measured" and not deadline.expired():  # a build can take seconds
                    k = self._index(v)
                    self.variants[k] = self._upgraded(v)
                    if self.variants[k].stage == "measured" and self.harness:
                        self.variants += kernel_twins(self.variants[k], self.device, self.kernels)
        measured = [v for v in self.variants if v.stage == "measured"]
        sel = select(measured, n_spans, budget=budget, objective=objective, latency_bound=latency_bound,
                     deadline=Deadline(max(1.0, deadline.remaining())))
        if sel is not None and pick is not None and all(v.stage == "measured" for v in pick):
            dp = (sum(round(v.latency_s * 1e9) for v in pick), max(v.peak for v in pick))
            cp = (sum(round(v.latency_s * 1e9) for v in sel.variants), sel.peak)
            if sel.proven and dp != cp:  # same optimum; variants may differ on ties
                raise AssertionError(f"fit: CP-SAT's selection {cp} disagrees with the chain DP's {dp}")
        return sel

    def order(self, v: Variant, deadline: Deadline, below: int | None = None) -> None:
        """Build `v` if it is not yet, then ask the exact scheduler for its best order (`below`:
        for one under this peak)."""
        k = self._index(v)
        while v.stage != "measured":
            v = self._upgraded(v)
        v = best_order(v, tflm_semantics(self.kernels).name, deadline, below)
        self.variants[k] = v
        if self.harness:
            self.variants += kernel_twins(v, self.device, self.kernels)

    def refine(self, budget, deadline, only=None) -> bool:
        measured = [v for v in self.variants
                    if v.stage == "measured" and (only is None or any(v is w for w in only))]
        better = refine(measured, budget, deadline, self.kernels)
        changed = [(a, b) for a, b in zip(measured, better) if a != b]
        for old, new in changed:
            self.variants[self._index(old)] = new
        return bool(changed)

    def _index(self, v: Variant) -> int:
        return next(k for k, w in enumerate(self.variants) if w is v)

    def _upgraded(self, v: Variant) -> Variant:
        """`v` one stage further (upgrade), counted."""
        self.estimated += v.stage == "bound"
        self.measured += v.stage == "estimate"
        return upgrade(self.graph, self.spans, v, self.op_seconds, self.device, self.kernels)


MAX_SMALLEST_ROUNDS = 4
MAX_ORDER_ROUNDS = 32


def _with_best_orders(pool: _Pool, n_spans: int, sel: Selection | None, budget, objective,
                      deadline: Deadline) -> Selection | None:
    """A patch variant is measured in the order the rewrite emits it in, which is achievable but not
    optimal: one whose emitted order misses the budget may have an order that meets it. So select
    again as if every patch variant not yet scheduled reached its any-order lower bound; if that
    would beat `sel`, schedule the patch variants it picks exactly, and select again; repeat."""
    for _ in range(MAX_ORDER_ROUNDS):
        if deadline.expired():
            break
        hopeful = [replace(v, peak=v.lower_bound) if v.kind == "patch" and not v.ordered else v
                   for v in pool.variants]
        origin = {id(h): v for h, v in zip(hopeful, pool.variants)}
        pick = chain_select(hopeful, n_spans, budget=budget, objective=objective)
        if pick is None or not _beats(pick, sel, objective):
            break
        todo = [origin[id(h)] for h in pick if h.kind == "patch" and not origin[id(h)].ordered]
        if not todo:
            break
        below = budget + 1 if budget is not None else (sel.peak if sel is not None else None)
        for v in todo:
            if deadline.expired():
                break
            pool.order(v, deadline.sub(fraction=0.5), below)
        sel = pool.select(n_spans, budget, objective, deadline.sub(fraction=0.5)) or sel
    return sel


def _beats(pick: list[Variant], sel: Selection | None, objective: str) -> bool:
    if sel is None:
        return True
    if objective == "memory":
        return max(v.peak for v in pick) < sel.peak
    return sum(v.latency_s for v in pick) < sel.latency_s * (1 - 1e-9)


def _smallest(pool: _Pool, n_spans: int, deadline: Deadline) -> Selection | None:
    """The smallest arena: select; then ask the exact scheduler whether the patch variants at the
    selection's peak have an order below it (the order a patch variant is measured in is
    achievable, not optimal), and select again while that lowers the peak."""
    sel = pool.select(n_spans, None, "memory", deadline.sub(fraction=0.5))
    for _ in range(MAX_SMALLEST_ROUNDS):
        if sel is None or deadline.expired():
            break
        at_peak = [v for v in sel.variants if v.peak == sel.peak and v.kind == "patch" and not v.proven]
        if not at_peak or not pool.refine(sel.peak - 1, deadline.sub(fraction=0.5), only=at_peak):
            break
        again = pool.select(n_spans, None, "memory", deadline.sub(fraction=0.5))
        if again is None or again.peak >= sel.peak:
            break
        sel = again
    return _with_best_orders(pool, n_spans, sel, None, "memory", deadline.sub(fraction=0.3))


def _choose(pool: _Pool, n_spans: int, budget, objective, deadline) -> Selection | None:
    """Select; then let the exact scheduler try the measured variants whose bound says they might
    fit where their emitted order does not, and select again if that changed anything."""
    if budget is None and objective == "memory":
        return _smallest(pool, n_spans, deadline)
    sel = pool.select(n_spans, budget, objective, deadline.sub(fraction=0.5))
    if budget is not None and pool.refine(budget, deadline.sub(fraction=0.5)):
        sel = pool.select(n_spans, budget, objective, deadline.sub(fraction=0.5)) or sel
    return _with_best_orders(pool, n_spans, sel, budget, objective, deadline.sub(fraction=0.3))


def _frontier(pool: _Pool, n_spans: int, deadline: Deadline) -> tuple[tuple[Selection, ...], bool]:
    """The smallest arena first (so it is known whatever happens), then the sweep from the fastest
    selection down; if the sweep stops at the time limit, the smallest is appended to what it has."""
    smallest = _smallest(pool, n_spans, deadline.sub(fraction=0.4))
    sweep = deadline.sub(fraction=0.8)
    points = list(pareto(lambda b: pool.select(n_spans, b, "latency", sweep), sweep))
    complete = bool(points) and smallest is not None and points[-1].peak <= smallest.peak
    if smallest is not None and not complete:
        points = [p for p in points if p.peak > smallest.peak] + [smallest]
    return tuple(points), complete


def _from_frontier(frontier, budget, objective) -> Selection | None:
    """The selection `_choose` would make, read off the frontier (fastest first, peaks falling):
    the fastest point within the budget, or the smallest point."""
    if not frontier:
        return None
    if objective == "memory":
        return frontier[-1]
    return next((p for p in frontier if budget is None or p.peak <= budget), None)


def _selection_of(chosen: list[Variant]) -> Selection:
    return Selection(tuple(chosen), max(v.peak for v in chosen), sum(v.latency_s for v in chosen), True)


def _realise(graph: Graph, spans, sel: Selection, kernels: str, deadline: Deadline, progress, t0):
    """(graph, schedule, arena plan) of a selection applied to the whole graph, under the memory
    semantics of the kernel set it will run with."""
    sem = tflm_semantics(kernels)
    whole = _apply(graph, sel.variants, spans)
    say(progress, t0, f"fit: chosen peak {sel.peak:,} B, {len(whole.ops)} ops; scheduling and planning")
    # the variants' own orders reach the selection's peak; the scheduler may only improve on them
    whole = whole.reordered(_variant_order(whole, sel.variants))
    # (the spans are separated by cuts and each variant's order is its best: the scheduler rarely
    # gains here, while the planner needs its time to reach the peak on thousands of buffers)
    sched = schedule(whole, time_limit=None, deadline=Deadline(max(1.0, 0.35 * deadline.remaining())),
                     semantics=sem.name)
    whole = whole.reordered(sched.order)
    plan = plan_for_tflm(whole, lifetimes(whole, None, sem), time_limit=None, n_tensors=len(whole.tensors),
                         deadline=Deadline(max(2.0, deadline.remaining())))
    return whole, sched, plan


def _variant_order(whole: Graph, chosen) -> list[int]:
    """The op order of the applied graph that runs each chosen variant in the order its peak was
    measured in (ops matched by their first output's name, unique in the graph); the stored order
    if any op cannot be matched."""
    pos = {whole.tensors[op.outputs[0]].name: i for i, op in enumerate(whole.ops)}
    order = []
    for v in chosen:
        idx = [pos.get(v.graph.tensors[op.outputs[0]].name) for op in v.graph.ops] if v.graph is not None else [None]
        if None in idx:
            return list(range(len(whole.ops)))
        order += idx
    if sorted(order) != list(range(len(whole.ops))) or not whole.is_topological(order):
        return list(range(len(whole.ops)))
    return order


def _apply(graph: Graph, chosen, spans) -> Graph:
    # rewrites first, spliced by position into the graph their spans index; then the patches,
    # which find their regions by tensor name
    for v in sorted((v for v in chosen if v.kind == "rewrite"), key=lambda v: -v.first):
        graph = splice(graph, v, spans)
    for v in chosen:
        if v.kind == "patch":
            graph = apply_patches(graph, v.region, v.grid)
    moved = dict(kv for v in chosen for kv in v.kernels)
    if moved:  # ops matched by their first output's name, unique in the graph (as _variant_order)
        for i, op in enumerate(graph.ops):
            kernel = moved.get(graph.tensors[op.outputs[0]].name)
            if kernel is not None and op.kernel != kernel:
                graph = with_kernel(graph, [i], kernel)
    return graph

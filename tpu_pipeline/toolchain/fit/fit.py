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
from tpu_pipeline.toolchain.device import Device, KernelSet
from tpu_pipeline.toolchain.fit.select import Selection, chain_select, pareto, select
from tpu_pipeline.toolchain.fit.spans import split_spans
from tpu_pipeline.toolchain.fit.variants import (Variant, as_is_variants, best_order, kernel_twins, on_harness,
                                   patch_candidates, refine,
                                   rewrite_variants, splice, upgrade)
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.ir.kernels import IN_PLACE, with_in_place, with_kernel
from tpu_pipeline.toolchain.memory.lifetimes import lifetimes
from tpu_pipeline.toolchain.memory.semantics import Semantics, tflm_semantics
from tpu_pipeline.toolchain.memory.tflm import plan_for_tflm
from tpu_pipeline.toolchain.memory.tflm_target import ops_tail, target_tail
from tpu_pipeline.toolchain.rewrite.patch import checked_region, apply_patches
from tpu_pipeline.toolchain.rewrite.patch_stage import build_stage
from tpu_pipeline.toolchain.schedule.api import Schedule, schedule

OBJECTIVES = ("latency", "memory")
ARENAS = ("whole", "head")
REALISE_SHARE = 0.25  # of the time limit, kept for scheduling and planning the chosen graph
REPLAN_ROUNDS = 3  # selections re-made when overlapped ops' groups keep the plan above the promised peak


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
    """Choose, apply, schedule and plan. `budget=None` with objective "memory" asks for the
    smallest arena; with "latency" for the fastest variant (the model as it is, usually).
    `probe_budgets`: also report the fastest selection within each of these (benchmarks).
    `allow_lossy`: also offer the int8 partial-sum splits (requantized: not bit-identical), which
    calibrate on `model` (the source model as tflite/ reads it, for graphs with custom ops). `harness`: the model
    will run on the harness firmware, so its kernels may be chosen (`on_harness`, kernel twins);
    without it every op stays on a builtin kernel (a model for any TFLite Micro build). `arena`:
    "whole" counts the budget and the memory objective as head + the persistent tail on the
    32-bit target (what the board needs), "head" the planned head alone. `patches`: offer
    patch-based execution (off: every layer runs whole, the rest of the choices remain)."""
    if objective not in OBJECTIVES:
        raise UsageError(f"unknown objective '{objective}' (choose from {', '.join(OBJECTIVES)})")
    if arena not in ARENAS:
        raise UsageError(f"unknown arena '{arena}' (choose from {', '.join(ARENAS)})")
    sem = tflm_semantics(kernels)  # the kernel set's semantics: every floor below takes the object
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
    as_is = as_is_variants(graph, spans, device, sem, deadline.sub(fraction=0.25), progress)
    op_seconds = {o.index: o.seconds for o in estimate_mcu(graph, device, sem.kernels).ops}
    rewrites = rewrite_variants(graph, spans, as_is, device, sem, allow_lossy, model, deadline.sub(fraction=0.15),
                                harness)
    twins = [t for v in as_is + rewrites for t in kernel_twins(v, device, sem)] if harness else []
    candidates = patch_candidates(graph, spans, as_is, harness) if patches else []
    tail_fixed, tail_note = _tail_fixed(graph, sem, arena)
    pool = _Pool(graph, spans, as_is + rewrites + twins + candidates, device, sem, op_seconds, harness, tail_fixed)
    say(progress, t0, f"fit: {len(candidates)} patch candidates, {len(rewrites)} rewrite variants, "
                      f"{len(twins)} kernel variants; selecting")
    baseline = _selection_of(as_is, tail_fixed)
    frontier, complete = (), False
    if want_pareto:  # the frontier first: every selection asked for is then a point of it
        frontier, complete = _frontier(pool, len(spans), deadline)
        say(progress, t0, f"fit: frontier of {len(frontier)} points{'' if complete else ' (incomplete)'}")
        sel = _from_frontier(frontier, budget, objective)
    else:
        sel = _choose(pool, len(spans), budget, objective, deadline)
    # the search ran out of time before its pick was all built and measured: the answer is the best
    # of what was measured, which can be far from the best there is (MobileNetV2 at 320 KiB: +127 %
    # latency at 30 s, +3.4 % at 120 s); the user must hear it
    cut_short = pool.stopped
    probes = {}
    for b in probe_budgets:  # after the main search: its measured variants answer most of these
        pool.stopped = False
        found = pool.select(len(spans), b, "latency", deadline.sub(fraction=0.3))
        probes[b] = "time limit" if found is None and pool.stopped else found
    if sel is None:  # nothing fits: the smallest arena we can reach
        sel = frontier[-1] if frontier else pool.select(len(spans), None, "memory", deadline.sub(fraction=0.5))
    say(progress, t0, f"fit: {pool.estimated} variants estimated, {pool.measured} built and measured")
    whole, sched, plan = _realise(graph, spans, sel, sem, whole_run, progress, t0)
    for _ in range(REPLAN_ROUNDS):  # overlapped ops' rigid groups can leave the plan above the peak
        over = _overshoot(whole, plan, sel, sem)
        if not over or whole_run.expired():
            break
        for v, top in over:
            pool.variants[pool.index(v)] = replace(v, peak=top, lower_bound=min(v.lower_bound, top))
        more = Deadline(max(2.0, 0.3 * whole_run.remaining()))  # the search's own time is spent
        again = (pool.select(len(spans), budget, objective, more)
                 or pool.select(len(spans), None, "memory", more))
        if again is None or [id(v) for v in again.variants] == [id(v) for v in sel.variants]:
            break
        tried = _realise(graph, spans, again, sem, whole_run, progress, t0)
        if tried[2].head + (target_tail(tried[0], sem).bytes or 0) >= plan.head + (target_tail(whole, sem).bytes or 0):
            break
        sel, (whole, sched, plan) = again, tried
    notes = []
    as_is_chosen = len(sel.variants) == len(baseline.variants) and all(
        a is b for a, b in zip(sel.variants, baseline.variants))
    def counted(g: Graph, p) -> int:  # what the budget and the memory objective count
        return p.head + ((target_tail(g, sem).bytes or 0) if arena == "whole" else 0)

    if not as_is_chosen and counted(whole, plan) > baseline.arena and (budget is None or baseline.arena <= budget):
        # the chosen variant's real arena came out above the model as it is (its graph is too big
        # for the scheduler or the planner in the time left, or its ops' tail was not known to the
        # selection): keep whichever is smaller
        again = _realise(graph, spans, baseline, sem, whole_run, progress, t0)
        as_is_arena = counted(again[0], again[2])
        if as_is_arena < counted(whole, plan):
            notes.append(f"the chosen variant's arena ({counted(whole, plan):,} B) came out above the model as it "
                         f"is ({as_is_arena:,} B); the model as it is was kept")
            sel, (whole, sched, plan) = baseline, again
    offsets = tuple(plan.tensor_offsets) if any(o >= 0 for o in plan.tensor_offsets) else None
    notes = harness_notes + ([tail_note] if tail_note else []) + notes
    baseline_tail = target_tail(original, sem).bytes
    if harness:  # the model as the user gave it is the baseline, not its harness form
        base_sched = schedule(original, time_limit=None, deadline=Deadline(max(0.5, 0.05 * time_limit)),
                              semantics=sem)
        baseline = replace(baseline, peak=base_sched.peak,
                           latency_s=estimate_mcu(original, device, sem.kernels).latency_s)
    if cut_short:
        notes.append(f"the selection stopped at the time limit ({pool.measured} of {len(candidates)} patch candidates "
                     "built): it is the best of those built, and a longer --time-limit may find a faster or smaller one")
    if want_pareto and not complete:
        notes.append("the frontier sweep stopped at the time limit: it holds the points found and the smallest arena")
    if plan.head > sched.peak:
        notes.append(f"the arena head ({plan.head:,} B) is above the order's peak ({sched.peak:,} B): the planner did "
                     "not reach the peak within the time limit (a longer --time-limit may)")
    if sched.peak > sel.peak:
        notes.append(f"the whole graph's schedule peaks at {sched.peak:,} B, above the selection's {sel.peak:,} B")
    tail = target_tail(whole, sem).bytes
    fits = budget is None or plan.head + ((tail or 0) if arena == "whole" else 0) <= budget
    return FitResult(whole, sel, sched, plan.head, offsets, plan.head <= sched.peak, budget, fits,
                     baseline.peak, baseline.latency_s, len(spans), pool.measured, len(candidates), pool.dropped,
                     tail, baseline_tail, arena, frontier, complete, probes, time.monotonic() - t0, tuple(notes))


class _Pool:
    """The variants, each at the cheapest stage that answers the question: a selection is made on
    what is known (floors are optimistic: bounds <= estimates <= measured), every variant it picks
    that is not measured yet is taken one stage further, and the selection is made again, until
    it picks only measured variants. The answer is then `select`'s (CP-SAT) over the measured
    variants, which must agree with the chain DP that steered the loop."""

    def __init__(self, graph, spans, variants, device, sem: Semantics, op_seconds, harness=True, tail_fixed=None):
        self.graph, self.spans, self.variants = graph, spans, list(variants)
        self.device, self.sem, self.op_seconds = device, sem, op_seconds
        self.harness = harness  # kernel twins of measured variants may be offered
        self.tail_fixed = tail_fixed  # the whole arena is selected on (None: the head alone)
        self.estimated = self.measured = 0
        self.dropped = 0  # candidates whose tiles would read nothing of some tensor (a grid too fine)
        self.stopped = False  # a selection ended at its deadline (its answer: the best measured one)

    def select(self, n_spans, budget, objective, deadline, latency_bound=None) -> Selection | None:
        while True:
            pick = chain_select(self.variants, n_spans, budget=budget, objective=objective,
                                latency_bound=latency_bound, tail_fixed=self.tail_fixed)
            if pick is None or all(v.stage == "measured" for v in pick):
                break
            if deadline.expired():
                self.stopped = True
                break  # out of time: the best among the measured variants
            for v in pick:
                if v.stage != "measured" and not deadline.expired():  # a build can take seconds
                    # a bound picked: its region's other grids are estimated with it (cheap, and
                    # the next pick is most often one of them)
                    group = [w for w in self.variants if w.stage == "bound" and w.first == v.first
                             and w.last == v.last and w.form == v.form and w.region == v.region] \
                        if v.stage == "bound" else [v]
                    for w in group:
                        self._step(w)
        measured = [v for v in self.variants if v.stage == "measured"]
        sel = select(measured, n_spans, budget=budget, objective=objective, latency_bound=latency_bound,
                     deadline=Deadline(max(1.0, deadline.remaining())), tail_fixed=self.tail_fixed)
        if sel is not None and pick is not None and all(v.stage == "measured" for v in pick):
            dp = (sum(round(v.latency_s * 1e9) for v in pick), _arena(pick, self.tail_fixed))
            cp = (sum(round(v.latency_s * 1e9) for v in sel.variants), sel.arena)
            if sel.proven and dp != cp:  # same optimum; variants may differ on ties
                raise AssertionError(f"fit: CP-SAT's selection {cp} disagrees with the chain DP's {dp}")
        return sel

    def order(self, v: Variant, deadline: Deadline, below: int | None = None) -> None:
        """Build `v` if it is not yet, then ask the exact scheduler for its best order (`below`:
        for one under this peak)."""
        k = self.index(v)
        while v is not None and v.stage != "measured":
            v = self._upgraded(v)
        if v is None:
            del self.variants[k]
            self.dropped += 1
            return
        v = best_order(v, self.sem, deadline, below)
        self.variants[k] = v
        if self.harness:
            self.variants += kernel_twins(v, self.device, self.sem)

    def refine(self, budget, deadline, only=None) -> bool:
        measured = [v for v in self.variants
                    if v.stage == "measured" and (only is None or any(v is w for w in only))]
        better = refine(measured, budget, deadline, self.sem)
        changed = [(a, b) for a, b in zip(measured, better) if a != b]
        for old, new in changed:
            self.variants[self.index(old)] = new
        return bool(changed)

    def _step(self, v: Variant) -> None:
        """`v` one stage further in the pool (a candidate that does not exist after all: dropped,
        counted); kernel twins of a newly measured variant join the pool."""
        k = self.index(v)
        up = self._upgraded(v)
        if up is None:
            del self.variants[k]
            self.dropped += 1
            return
        self.variants[k] = up
        if up.stage == "measured" and self.harness:
            self.variants += kernel_twins(up, self.device, self.sem)

    def index(self, v: Variant) -> int:
        return next(k for k, w in enumerate(self.variants) if w is v)

    def _upgraded(self, v: Variant) -> Variant | None:
        """`v` one stage further (upgrade), counted; None if it does not exist after all."""
        self.estimated += v.stage == "bound"
        self.measured += v.stage == "estimate"
        return upgrade(self.graph, self.spans, v, self.op_seconds, self.device, self.sem)


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
        pick = chain_select(hopeful, n_spans, budget=budget, objective=objective, tail_fixed=pool.tail_fixed)
        if pick is None or not _beats(pick, sel, objective, pool.tail_fixed):
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


def _arena(pick: list[Variant], tail_fixed: int | None) -> int:
    """The memory a list of variants is selected on: the peak, plus the tail when counted."""
    peak = max(v.peak for v in pick)
    return peak if tail_fixed is None else peak + sum(v.tail for v in pick) + tail_fixed


def _beats(pick: list[Variant], sel: Selection | None, objective: str, tail_fixed: int | None) -> bool:
    if sel is None:
        return True
    if objective == "memory":
        return _arena(pick, tail_fixed) < sel.arena
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
        if again is None or again.arena >= sel.arena:
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
    complete = bool(points) and smallest is not None and points[-1].arena <= smallest.arena
    if smallest is not None and not complete:
        points = [p for p in points if p.arena > smallest.arena] + [smallest]
    return tuple(points), complete


def _from_frontier(frontier, budget, objective) -> Selection | None:
    """The selection `_choose` would make, read off the frontier (fastest first, peaks falling):
    the fastest point within the budget, or the smallest point."""
    if not frontier:
        return None
    if objective == "memory":
        return frontier[-1]
    return next((p for p in frontier if budget is None or p.arena <= budget), None)


def _overshoot(whole: Graph, plan, sel: Selection, sem: Semantics) -> list[tuple[Variant, int]]:
    """Chosen variants whose ops run at a step where the realised plan reaches above the
    selection's peak, with the highest such reach: what the selection should have been told. Only
    where overlapped ops are planned (their groups' fixed offsets are what a span's figure cannot
    see; other plans reach their peak or are left as the planner's note says)."""
    if plan.head <= sel.peak:
        return []
    lt = lifetimes(whole, None, sem)
    if not any(b.group >= 0 for b in lt.buffers) or len(plan.buffer_offsets) != len(lt.buffers):
        return []
    top = [0] * lt.n_steps
    for b, off in zip(lt.buffers, plan.buffer_offsets):
        for s in range(b.first, b.last + 1):
            top[s] = max(top[s], off + b.size)
    owner = {}
    for v in sel.variants:
        if v.graph is not None:
            for op in v.graph.ops:
                owner[v.graph.tensors[op.outputs[0]].name] = v
    reach: dict[int, tuple[Variant, int]] = {}
    for i, op in enumerate(whole.ops):  # op i runs at step i + 1 (the realised graph is in its order)
        v = owner.get(whole.tensors[op.outputs[0]].name)
        if v is not None and top[i + 1] > sel.peak and top[i + 1] > v.peak:
            old = reach.get(id(v), (v, 0))[1]
            reach[id(v)] = (v, max(old, top[i + 1]))
    return list(reach.values())


def _selection_of(chosen: list[Variant], tail_fixed: int | None = None) -> Selection:
    tail = 0 if tail_fixed is None else sum(v.tail for v in chosen) + tail_fixed
    return Selection(tuple(chosen), max(v.peak for v in chosen), sum(v.latency_s for v in chosen), True, tail)


def _tail_fixed(graph: Graph, sem: Semantics, arena: str) -> tuple[int | None, str]:
    """The part of the target's tail no variant changes (the allocator's structs, the I/O tensors,
    the graph inputs' eval tensors): what the selection adds to the variants' own tails; None
    (and a note) when the head alone is selected on."""
    if arena == "head":
        return None, ""
    whole, ops = target_tail(graph, sem).bytes, ops_tail(graph, sem)
    if whole is None or ops is None:
        missing = ", ".join(target_tail(graph, sem).unmodelled)
        return None, (f"the target's tail is not modelled for {missing}: the selection counts the head alone "
                      "(the tail is added once the model is fitted)")
    return whole - ops, ""


def _realise(graph: Graph, spans, sel: Selection, sem: Semantics, deadline: Deadline, progress, t0):
    """(graph, schedule, arena plan) of a selection applied to the whole graph, under the memory
    semantics of the kernel set it will run with."""
    whole = _apply(graph, sel.variants, spans)
    say(progress, t0, f"fit: chosen peak {sel.peak:,} B, {len(whole.ops)} ops; scheduling and planning")
    # the variants' own orders reach the selection's peak; the scheduler may only improve on them
    whole = whole.reordered(_variant_order(whole, sel.variants))
    # (the spans are separated by cuts and each variant's order is its best: the scheduler rarely
    # gains here, while the planner needs its time to reach the peak on thousands of buffers)
    sched = schedule(whole, time_limit=None, deadline=Deadline(max(1.0, 0.35 * deadline.remaining())),
                     semantics=sem)
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
        if v.kind == "patch" and v.form == "stage":
            tin, tout, positions = checked_region(graph, v.region)
            graph = build_stage(graph, tin, tout, positions, v.grid)
        elif v.kind == "patch":
            graph = apply_patches(graph, v.region, v.grid)
    moved = dict(kv for v in chosen for kv in v.kernels)
    if moved:  # ops matched by their first output's name, unique in the graph (as _variant_order)
        for i, op in enumerate(graph.ops):
            kernel = moved.get(graph.tensors[op.outputs[0]].name)
            if kernel is not None and op.kernel != kernel:
                graph = with_in_place(graph, [i]) if kernel == IN_PLACE else with_kernel(graph, [i], kernel)
    return graph

"""How a fit asks its pool: the smallest arena, the fastest within a budget, the frontier; each
selection re-asked while the exact scheduler or a finer order could still improve it."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.budget import Deadline
from tpu_pipeline.toolchain.fit.pool import Pool, arena_of
from tpu_pipeline.toolchain.fit.select import Selection, chain_select, pareto
from tpu_pipeline.toolchain.fit.variants import Variant


MAX_SMALLEST_ROUNDS = 4
MAX_ORDER_ROUNDS = 32


def with_best_orders(pool: Pool, n_spans: int, sel: Selection | None, budget, objective,
                      deadline: Deadline) -> Selection | None:
    """A patch variant is measured in the order the rewrite emits it in, which is achievable but not
    optimal: one whose emitted order misses the budget may have an order that meets it. So select
    again as if every patch variant not yet scheduled reached its any-order lower bound; if that
    would beat `sel`, schedule the patch variants it picks exactly, and select again; repeat."""
    for _ in range(MAX_ORDER_ROUNDS):
        if deadline.expired():
            break
        hopeful = [_hopeful(pool, v) for v in pool.variants]
        origin = {id(h): v for h, v in zip(hopeful, pool.variants)}
        pick = chain_select(hopeful, n_spans, budget=budget, objective=objective, tail_fixed=pool.tail_fixed,
                            pruned=pool.pruned_hopeful)
        if pick is None or not beats(pick, sel, objective, pool.tail_fixed):
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


def _hopeful(pool: Pool, v: Variant) -> Variant:
    """`v` at its any-order lower bound where it is a patch variant not yet scheduled exactly: the
    same object for the same `v` from one round to the next (the chain DP's caches, kept apart
    from the real variants' in `pool.pruned_hopeful`, are by identity: thousands of variants)."""
    if v.kind != "patch" or v.ordered:
        return v
    hit = pool.hopeful.get(id(v))
    if hit is None or hit[0] is not v:
        hit = pool.hopeful[id(v)] = (v, replace(v, peak=v.lower_bound))
    return hit[1]


def beats(pick: list[Variant], sel: Selection | None, objective: str, tail_fixed: int | None) -> bool:
    if sel is None:
        return True
    if objective == "memory":
        return arena_of(pick, tail_fixed) < sel.arena
    return sum(v.latency_s for v in pick) < sel.latency_s * (1 - 1e-9)


def smallest_arena(pool: Pool, n_spans: int, deadline: Deadline) -> Selection | None:
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
    return with_best_orders(pool, n_spans, sel, None, "memory", deadline.sub(fraction=0.3))


def choose(pool: Pool, n_spans: int, budget, objective, deadline) -> Selection | None:
    """Select; then let the exact scheduler try the measured variants whose bound says they might
    fit where their emitted order does not, and select again if that changed anything."""
    if budget is None and objective == "memory":
        return smallest_arena(pool, n_spans, deadline)
    sel = pool.select(n_spans, budget, objective, deadline.sub(fraction=0.5))
    # (under a budget a variant's best order need only be within it: the first order found that is)
    if budget is not None and pool.refine(budget, deadline.sub(fraction=0.5), below=budget + 1):
        sel = pool.select(n_spans, budget, objective, deadline.sub(fraction=0.5)) or sel
    return with_best_orders(pool, n_spans, sel, budget, objective, deadline.sub(fraction=0.3))


def frontier_of(pool: Pool, n_spans: int, deadline: Deadline) -> tuple[tuple[Selection, ...], bool]:
    """The smallest arena first (so it is known whatever happens), then the sweep from the fastest
    selection down; if the sweep stops at the time limit, the smallest is appended to what it has."""
    smallest = smallest_arena(pool, n_spans, deadline.sub(fraction=0.4))
    sweep = deadline.sub(fraction=0.8)
    points = list(pareto(lambda b: pool.select(n_spans, b, "latency", sweep), sweep))
    complete = bool(points) and smallest is not None and points[-1].arena <= smallest.arena
    if smallest is not None and not complete:
        points = [p for p in points if p.arena > smallest.arena] + [smallest]
    return tuple(points), complete


def from_frontier(frontier, budget, objective) -> Selection | None:
    """The selection `_choose` would make, read off the frontier (fastest first, peaks falling):
    the fastest point within the budget, or the smallest point."""
    if not frontier:
        return None
    if objective == "memory":
        return frontier[-1]
    return next((p for p in frontier if budget is None or p.arena <= budget), None)


def selection_of(chosen: list[Variant], tail_fixed: int | None = None) -> Selection:
    tail = 0 if tail_fixed is None else sum(v.tail for v in chosen) + tail_fixed
    return Selection(tuple(chosen), max(v.peak for v in chosen), sum(v.latency_s for v in chosen), True, tail)

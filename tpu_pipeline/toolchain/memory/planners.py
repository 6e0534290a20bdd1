"""Arena planners behind one interface: buffers with lifetimes and sizes in, an `ArenaPlan` out.

Every planner takes the buffers of a `Lifetimes` (inclusive [first, last] steps, sizes already
rounded to the runtime's alignment) and returns an `ArenaPlan` with one offset per buffer, the
arena size, the lower bound (the most bytes live at any one time: no placement needs fewer) and
whether the size is proven optimal. Every plan is checked by `check_plan` before it is returned.

Planners (`REGISTRY`, names in `PLANNERS`; a new one is a function of a `Request` under
`@register(name)`):
- `tflm`, `tflite`: the runtimes' own planners, reproduced exactly (runtime_planners.py).
- `greedy-size`: largest first, each buffer into the smallest gap that fits (best fit).
- `greedy-conflicts`: most contended first (the largest live sum over the buffer's lifetime, then
  size), best fit.
- `search`: the exact search over canonical placements of search.py (MiniMalloc-style); given
  enough time it either finds a plan at the lower bound or proves there is none.
- `cpsat`: OR-Tools CP-SAT, offsets as interval variables under a 2-D no-overlap with the fixed
  lifetimes, the arena size minimised, hinted with the best greedy plan, the lower bound enforced.
- `auto`: the greedy planners, then `search` at the lower bound, then (if the bound was not met)
  a binary search on the capacity and CP-SAT, all within the time limit; the smallest plan wins.

Bounds (large problems, e.g. 200,000 buffers). Time: every planner takes a `deadline`
(tpu_pipeline.toolchain.budget.Deadline; the earlier of it and `time_limit` wins); `auto` first runs
`sweep_first_fit`, O(n log n + n k) for k buffers live at once, which always completes (past the
deadline it stacks the rest above everything placed, still a valid plan), then the greedy
portfolio, each greedy checking the clock every few thousand buffers and dropped unfinished when
time is up; the best complete plan wins. Memory: the overlap lists of the portfolio and the exact
search hold one entry per pair of buffers live together, so they are built only when there are at
most MAX_OVERLAP_PAIRS pairs (counted first in O(n log n)); beyond that only the sweep runs. Plans
of more than FAST_CHECK_ABOVE buffers are checked by `first_conflict`, an O(n log n) sweep,
instead of listing every problem with `check_plan`.

Rooms: preprocess.py (bounds, overlaps, sections: computed once per problem), greedy.py,
search.py (with `SearchParams`), cpsat.py; this module dispatches and runs `auto`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from tpu_pipeline.toolchain import budget as _budget
from tpu_pipeline.toolchain.budget import Deadline, Progress
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.memory.cpsat import cpsat_plan
from tpu_pipeline.toolchain.memory.greedy import (greedy_by_conflicts, greedy_by_size, greedy_portfolio,
                                                  grouped_portfolio, sweep_first_fit)
from tpu_pipeline.toolchain.memory.lifetimes import Buffer, Lifetimes
from tpu_pipeline.toolchain.memory.plan import ArenaPlan, arena_size, check_plan, first_conflict
from tpu_pipeline.toolchain.memory.preprocess import MAX_OVERLAP_PAIRS, live_lower_bound, overlap_lists, sections, size_unit
from tpu_pipeline.toolchain.memory.runtime_planners import tflite_arena, tflm_greedy
from tpu_pipeline.toolchain.memory.search import search_plan

__all__ = ["PLANNERS", "REGISTRY", "Request", "register", "plan_arena", "plan_buffers", "finish"]

FAST_CHECK_ABOVE = 20_000  # buffers: above this a plan is checked by the O(n log n) sweep
EARLY_SEARCH_S = 1.0  # auto: the exact search's first slice at the lower bound
EARLY_CPSAT_S = 2.0  # then CP-SAT's short look (problems of up to EARLY_CPSAT_BUFFERS buffers)
EARLY_CPSAT_BUFFERS = 2_000


@dataclass(frozen=True)
class Request:
    """One planning problem as every registered planner receives it."""

    buffers: tuple[Buffer, ...]
    lower_bound: int  # live_lower_bound(buffers)
    deadline: Deadline
    started: float  # time.monotonic() when the request came in
    alignment: int = 1
    progress: Progress = None
    time_limit: float = 0.0  # seconds the deadline left when the request came in

    def finish(self, offsets, name: str, proven: bool = False, lower_bound: int | None = None) -> ArenaPlan:
        lb = self.lower_bound if lower_bound is None else lower_bound
        return finish(self.buffers, offsets, lb, name, self.started, proven, self.alignment)


Planner = Callable[[Request], ArenaPlan]
REGISTRY: dict[str, Planner] = {}


def register(name: str):
    """Add a planner under `name` (the order of registration is the order of `PLANNERS`)."""
    def add(fn: Planner) -> Planner:
        REGISTRY[name] = fn
        return fn
    return add


def finish(bufs, offsets, lb, name, t0, proven=False, alignment=1) -> ArenaPlan:
    """The checked plan: AssertionError (a planner bug) rather than an unsound plan handed out."""
    if len(bufs) > FAST_CHECK_ABOVE:
        problem = first_conflict(bufs, offsets, alignment)
    else:
        problems = check_plan(bufs, offsets, alignment)
        problem = problems[0] if problems else None
    if problem:
        raise AssertionError(f"planner {name} produced an unsound plan: {problem}")
    size = arena_size(bufs, offsets)
    return ArenaPlan(tuple(int(o) for o in offsets), size, lb, name, proven or size == lb,
                     time.monotonic() - t0)


# --------------------------------------------------------------------------------------------
# auto


@register("auto")
def _plan_auto(req: Request) -> ArenaPlan:
    bufs, lb, t0 = req.buffers, req.lower_bound, req.started
    # probes overshoot their limits slightly: stay inside ours
    deadline = req.deadline.end - 0.07 * max(0.0, req.deadline.end - t0)
    inner = Deadline.at(deadline)
    name, best, overlaps = _auto_greedy(req, inner)
    if arena_size(bufs, best) == lb:
        return req.finish(best, name, True)
    if overlaps is None or inner.expired():
        return req.finish(best, name, False)
    return _auto_exact(req, deadline, name, best)


def _auto_greedy(req: Request, inner: Deadline):
    """The sweep, then (when the overlap lists fit) the greedy portfolio: (name, offsets, overlaps)
    of the smallest plan, ties by name; overlaps None when the lists were not built."""
    bufs, t0 = req.buffers, req.started
    candidates = [("sweep-first-fit", sweep_first_fit(bufs, inner))]
    _budget.say(req.progress, t0, f"plan: sweep first fit of {len(bufs):,} buffers done")
    overlaps = None
    if not inner.expired():
        overlaps = overlap_lists(bufs, MAX_OVERLAP_PAIRS)
        if overlaps is None:
            _budget.say(req.progress, t0, f"plan: more than {MAX_OVERLAP_PAIRS:,} overlapping pairs; "
                                          "only the sweep runs")
    if overlaps is not None:
        candidates += greedy_portfolio(bufs, overlaps, inner, req.progress)
    name, best = min(candidates, key=lambda c: (arena_size(bufs, c[1]), c[0]))
    return name, best, overlaps


def _auto_exact(req: Request, deadline: float, name: str, best) -> ArenaPlan:
    """Search at the lower bound (most instances fit exactly there), then a binary search on the
    capacity between the last failure and the best plan so far, then CP-SAT on what time is left."""
    bufs, lb = req.buffers, req.lower_bound
    prepared = sections(bufs)  # the same for every capacity asked about
    # the search at the bound settles most instances in milliseconds; where it does not within a
    # first slice, CP-SAT gets a short look before the long search (tiny_irregular_float32's
    # patched graph, 89 buffers: the search failed for 20 s, CP-SAT proves the bound in 0.3 s)
    first = min(EARLY_SEARCH_S, 0.4 * (deadline - time.monotonic()))
    found = search_plan(bufs, lb, max(0.0, first), prepared=prepared)
    if isinstance(found, list):
        return req.finish(found, "search", True)
    early_lb = lb
    if found == "timeout" and len(bufs) <= EARLY_CPSAT_BUFFERS:
        name, best, size, early_lb = _cpsat_polish(bufs, min(deadline, time.monotonic() + EARLY_CPSAT_S), name, best,
                                                arena_size(bufs, best), lb)
        if size <= early_lb:
            return req.finish(best, name, True, lower_bound=size)
    if found == "timeout":  # the search's own slice, as it had before the first
        found = search_plan(bufs, lb, max(0.0, 0.4 * (deadline - time.monotonic())), prepared=prepared)
        if isinstance(found, list):
            return req.finish(found, "search", True)
    g = size_unit(bufs)
    best_size = arena_size(bufs, best)
    proven_lb = max(early_lb, lb + g if found is None else lb)
    # A probe that runs out of time counts as a failure but proves nothing.
    failed = lb
    while best_size - failed > g and time.monotonic() < deadline - 0.05:
        mid = max(failed + g, (failed + best_size) // 2 // g * g)
        if mid >= best_size:
            break
        r = search_plan(bufs, mid, max(0.0, 0.25 * (deadline - time.monotonic())), prepared=prepared)
        if isinstance(r, list):
            best, best_size, name = r, arena_size(bufs, r), "search"
        else:
            failed = mid
            if r is None:
                proven_lb = max(proven_lb, mid + g)
    if best_size <= proven_lb:
        return req.finish(best, name, True, lower_bound=best_size)
    name, best, best_size, proven_lb = _cpsat_polish(bufs, deadline, name, best, best_size, proven_lb)
    return req.finish(best, name, best_size <= proven_lb, lower_bound=proven_lb)


def _cpsat_polish(bufs, deadline: float, name: str, best, size: int, lb: int):
    """CP-SAT from the best plan so far (its hint and upper bound) in what time is left, when that
    is worth starting: (name, offsets, size, proven lower bound), improved where it found better."""
    remaining = deadline - time.monotonic() - 0.1 - 0.002 * len(bufs)  # building the model takes time too
    if remaining > 0.5:
        offsets, got, bound, optimal = cpsat_plan(bufs, remaining, hint=best, lower_bound=lb, upper_bound=size)
        lb = max(lb, bound)
        if offsets is not None and got < size:
            best, size, name = offsets, got, "cpsat"
        if optimal:
            lb = max(lb, size)
    return name, best, size, lb


# --------------------------------------------------------------------------------------------
# The others


@register("search")
def _plan_search(req: Request) -> ArenaPlan:
    bufs, lb = req.buffers, req.lower_bound
    found = search_plan(bufs, lb, req.time_limit)
    if isinstance(found, list):
        return req.finish(found, "search", True)
    # Not at the bound: fall back to the best greedy, honestly labelled.
    overlaps = overlap_lists(bufs, MAX_OVERLAP_PAIRS)
    offsets = greedy_by_size(bufs, overlaps) if overlaps is not None else sweep_first_fit(bufs)
    return req.finish(offsets, "search(greedy fallback)", lower_bound=lb + (1 if found is None else 0))


@register("cpsat")
def _plan_cpsat(req: Request) -> ArenaPlan:
    bufs, dl = req.buffers, req.deadline
    overlaps = overlap_lists(bufs, MAX_OVERLAP_PAIRS)
    hints = [sweep_first_fit(bufs)] + ([c[1] for c in greedy_portfolio(bufs, overlaps, dl)] if overlaps else [])
    hint = min(hints, key=lambda o: arena_size(bufs, o))
    offsets, size, bound, optimal = cpsat_plan(bufs, max(0.05, dl.remaining()), hint=hint,
                                               lower_bound=req.lower_bound, upper_bound=arena_size(bufs, hint))
    if offsets is None or size > arena_size(bufs, hint):
        offsets = hint
    return req.finish(offsets, "cpsat", optimal, lower_bound=max(req.lower_bound, bound))


def _greedy(name: str, fn) -> Planner:
    def run(req: Request) -> ArenaPlan:
        bufs = req.buffers
        overlaps = overlap_lists(bufs, MAX_OVERLAP_PAIRS)
        offsets = fn(bufs, overlaps, req.deadline) if overlaps is not None else None
        if offsets is None:  # too many overlaps to list, or out of time: the bounded sweep
            return req.finish(sweep_first_fit(bufs, req.deadline), f"{name}(sweep fallback)")
        return req.finish(offsets, name)
    return run


register("greedy-size")(_greedy("greedy-size", greedy_by_size))
register("greedy-conflicts")(_greedy("greedy-conflicts", greedy_by_conflicts))


def _runtime(name: str) -> Planner:
    def run(req: Request) -> ArenaPlan:
        bufs = req.buffers
        lt = Lifetimes(bufs, max(b.last for b in bufs) + 1)
        plan = tflm_greedy(lt) if name == "tflm" else tflite_arena(lt, alignment=max(req.alignment, 1))
        return req.finish(plan.offsets, name)
    return run


register("tflm")(_runtime("tflm"))
register("tflite")(_runtime("tflite"))

PLANNERS = tuple(REGISTRY)


# --------------------------------------------------------------------------------------------
# The interface


def plan_buffers(buffers, planner: str = "auto", time_limit: float | None = 5.0, alignment: int = 1, *,
                 deadline: Deadline | None = None, progress: Progress = None) -> ArenaPlan:
    """Plan offsets for arbitrary buffers (inclusive [first, last] lifetimes).

    Bounded by the earlier of `time_limit` (None: the deadline alone) and `deadline`; returns a
    checked plan within budget.SLACK of it plus the linear work of a sweep and the check (see the
    module docstring). `progress(msg)` hears a line per stage of `auto`."""
    t0 = time.monotonic()
    if planner not in REGISTRY:
        raise UsageError(f"unknown planner '{planner}' (choose from {', '.join(PLANNERS)})")
    dl = _budget.resolve(time_limit, deadline)
    bufs = buffers.buffers if isinstance(buffers, Lifetimes) else tuple(buffers)
    if not bufs:
        return ArenaPlan((), 0, 0, planner, True, 0.0)
    req = Request(bufs, live_lower_bound(bufs), dl, t0, alignment, progress, dl.remaining())
    if any(b.group >= 0 for b in bufs):
        return _plan_grouped(req, planner)
    return REGISTRY[planner](req)


def _plan_grouped(req: Request, planner: str) -> ArenaPlan:
    """Buffers in rigid groups (overlapped ops, lifetimes.Buffer.group): the groups' first-fit
    portfolio, then CP-SAT with each group's offsets tied, in what time is left. The runtimes' own
    planners know no groups, and the exact search places single buffers: both are refused."""
    if planner in ("tflm", "tflite", "search"):
        raise UsageError(f"planner '{planner}' cannot place overlapped ops (buffers at fixed offsets from each "
                         "other); use auto, cpsat or a greedy planner")
    bufs, lb = req.buffers, req.lower_bound
    overlaps = overlap_lists(bufs, MAX_OVERLAP_PAIRS)
    if overlaps is None:
        raise UsageError(f"{len(bufs):,} buffers with overlapped ops are too many to plan (more than "
                         f"{MAX_OVERLAP_PAIRS:,} overlapping pairs)")
    deadline = req.deadline.end - 0.07 * max(0.0, req.deadline.end - req.started)
    candidates = grouped_portfolio(bufs, overlaps, Deadline.at(deadline))
    if not candidates:  # out of time before the first finished: one more, unbounded (linear work)
        candidates = grouped_portfolio(bufs, overlaps)[:1]
    name, best = min(candidates, key=lambda c: (arena_size(bufs, c[1]), c[0]))
    size = arena_size(bufs, best)
    if size > lb and planner in ("auto", "cpsat"):
        name, best, size, lb = _cpsat_polish(bufs, deadline, name, best, size, lb)
    return req.finish(best, name, size <= lb, lower_bound=lb)


def plan_arena(lifetimes: Lifetimes, planner: str = "auto", time_limit: float | None = 5.0, *,
               deadline: Deadline | None = None, progress: Progress = None) -> ArenaPlan:
    """The best plan `planner` finds for these lifetimes within `time_limit` seconds (and before
    `deadline`, whichever ends first), checked.

    `lower_bound` is the most bytes live at once (raised when a solver proves more are needed);
    `proven_optimal` is true when the size equals a proven lower bound.
    """
    return plan_buffers(lifetimes, planner, time_limit, deadline=deadline, progress=progress)

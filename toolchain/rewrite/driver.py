"""The apply-only-if-better driver: rewrite, reschedule, keep a rewrite only when the optimal peak drops.

Search. For the current graph (stored in its best known order) every matching rewrite is a
candidate, largest concat first. A candidate is applied and the result rescheduled; it is kept
when the peak drops. A commute or depthwise split creates a new concat, so when it does not pay
on its own the rewrites that match the new concat are tried on top of it (up to `depth` steps):
concat -> DEPTHWISE -> CONV only pays once both splits are made. After a kept rewrite the
candidates are listed again, until a full pass keeps nothing or the time budget is spent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from toolchain.errors import ModelError
from toolchain.ir import Graph
from toolchain.memory import get_semantics, order_free_lower_bound
from toolchain.rewrite.rules import LOSSY, Candidate, apply_candidate, find_candidates


def _scheduler():
    try:
        from toolchain.schedule import schedule  # the real one, when it has landed
        return schedule
    except ImportError:
        from toolchain.rewrite._standin_schedule import schedule
        return schedule


@dataclass(frozen=True)
class AppliedRewrite:
    kind: str  # conv_split, fc_split, depthwise_split, commute (a chain is several entries)
    target: str  # name of the rewritten op's output tensor
    branches: int
    numerics: str  # bit-exact | float-rounding | lossy-int8
    peak_before: int
    peak_after: int
    ops_added: int
    enabling: bool = False  # a step of a chain that pays only with the rewrites after it

    def to_json(self):
        return dict(self.__dict__)


@dataclass(frozen=True)
class RewriteResult:
    graph: Graph  # the rewritten graph, ops in its best schedule's order
    applied: tuple  # AppliedRewrite, in the order applied
    peak_before: int  # best peak of the input graph (the scheduler's)
    peak_after: int  # best peak of the rewritten graph
    proven_optimal: bool  # the scheduler proved peak_after optimal for the rewritten graph
    # Additive fields.
    lower_bound: int = 0
    ops_before: int = 0
    ops_after: int = 0
    seconds: float = 0.0
    schedule_calls: int = 0
    candidates_tried: int = 0
    proven_before: bool = False
    method: str = ""
    notes: tuple = field(default=())

    @property
    def lossy(self) -> bool:
        return any(a.numerics == LOSSY for a in self.applied)

    def to_json(self):
        return {
            "peak_before": self.peak_before, "peak_after": self.peak_after,
            "proven_optimal": self.proven_optimal, "proven_before": self.proven_before,
            "lower_bound": self.lower_bound, "ops_before": self.ops_before, "ops_after": self.ops_after,
            "seconds": round(self.seconds, 3), "schedule_calls": self.schedule_calls,
            "candidates_tried": self.candidates_tried, "scheduler": self.method, "lossy": self.lossy,
            "applied": [a.to_json() for a in self.applied], "notes": list(self.notes),
        }


class _Search:
    def __init__(self, time_limit, semantics, allow_lossy, model, deadline, depth):
        self.schedule = _scheduler()
        self.time_limit = time_limit
        self.sem = get_semantics(semantics)
        self.allow_lossy = allow_lossy
        self.model = model
        self.deadline = deadline
        self.depth = depth
        self.calls = 0
        self.tried = 0
        self.notes: list[str] = []

    def run_schedule(self, graph: Graph):
        self.calls += 1
        remaining = self.deadline - time.monotonic()
        limit = max(0.5, min(self.time_limit, remaining)) if remaining > 0 else 0.5
        return self.schedule(graph, method="auto", time_limit=limit, semantics=self.sem.name)

    def values_for(self, graph: Graph, cand: Candidate):
        if cand.numerics != LOSSY:
            return None
        from toolchain.rewrite.numerics import calibration_values

        xs = graph.ops[cand.concat].inputs
        vals = calibration_values(graph, xs, model=self.model)
        return lambda t: vals[t]

    def try_candidate(self, graph: Graph, cand: Candidate, peak: int, level: int):
        """(graph, schedule, [(candidate, graph before)]) of the best chain from `cand` whose
        peak is below `peak`, or None."""
        self.tried += 1
        try:
            g2, new_concats = apply_candidate(graph, cand, self.values_for(graph, cand))
        except ModelError as exc:  # calibration impossible (e.g. custom ops without the model)
            self.notes.append(f"{cand.kind} at {cand.target}: skipped ({exc})")
            return None
        if order_free_lower_bound(g2, self.sem) < peak:
            s2 = self.run_schedule(g2)
            if s2.peak < peak:
                return g2.reordered(s2.order), s2, [(cand, graph)]
        if new_concats and level < self.depth and time.monotonic() < self.deadline:
            for follow in find_candidates(g2, self.allow_lossy, concat_outputs=new_concats):
                found = self.try_candidate(g2, follow, peak, level + 1)
                if found is not None:
                    g3, s3, chain = found
                    return g3, s3, [(cand, graph), *chain]
        return None


def rewrite_graph(graph: Graph, time_limit: float = 10.0, semantics: str = "tflm", allow_lossy: bool = False,
                  *, model=None, budget: float | None = None, depth: int = 3, kinds=None) -> RewriteResult:
    """Apply the identity rewrites that lower the best peak, each checked by rescheduling.

    `time_limit` bounds each scheduler call; `budget` (default 30 x time_limit, at least 60 s)
    bounds the whole search. int8 partial-sum splits are lossy and only tried with
    `allow_lossy`; they calibrate their partial sums' quantization on random inputs (LiteRT),
    which needs the source `model` when the graph has custom ops. `kinds` restricts the
    rewrites tried (default: all).
    """
    t0 = time.monotonic()
    budget = max(60.0, 30.0 * time_limit) if budget is None else budget
    search = _Search(time_limit, semantics, allow_lossy, model, t0 + budget, depth)
    s0 = search.run_schedule(graph)
    current = graph.reordered(s0.order)
    peak, sched = s0.peak, s0
    applied: list[AppliedRewrite] = []
    while time.monotonic() < search.deadline:
        cands = [c for c in find_candidates(current, allow_lossy) if kinds is None or set(c.kinds) <= set(kinds)]
        cands.sort(key=lambda c: (-c.saved_bytes, c.target))
        kept = False
        for cand in cands:
            if time.monotonic() >= search.deadline:
                search.notes.append("time budget spent; the search stopped early")
                break
            found = search.try_candidate(current, cand, peak, 1)
            if found is None:
                continue
            g2, s2, chain = found
            for k, (c, before) in enumerate(chain):
                last = k == len(chain) - 1
                after = g2 if last else chain[k + 1][1]
                applied.append(AppliedRewrite(c.kind, c.target, c.branches, c.numerics, peak,
                                              s2.peak if last else peak, len(after.ops) - len(before.ops),
                                              enabling=not last))
            current, peak, sched, kept = g2, s2.peak, s2, True
            break
        if not kept:
            break
    return RewriteResult(
        graph=current, applied=tuple(applied), peak_before=s0.peak, peak_after=peak,
        proven_optimal=bool(sched.proven_optimal), lower_bound=int(sched.lower_bound),
        ops_before=len(graph.ops), ops_after=len(current.ops), seconds=time.monotonic() - t0,
        schedule_calls=search.calls, candidates_tried=search.tried,
        proven_before=bool(s0.proven_optimal), method=str(sched.method), notes=tuple(search.notes))

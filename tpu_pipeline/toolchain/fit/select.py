"""TASO's selection as a CP-SAT model: one variant per run of spans, fastest under a memory budget.

Wen et al. (TASO) pick one primitive per layer with an ILP whose memory is the SUM of the chosen
primitives' footprints (their Formula 13); an arena's cost is its PEAK, so here memory is a
maximum: `peak >= peak(v)` for every chosen variant `v`, and the constraint is `peak <= budget`.
Each variant covers a contiguous run of spans (`first..last`); the chosen variants cover every span
exactly once. Objectives are lexicographic: latency then peak (`objective="latency"`), or peak then
latency (`"memory"`, optionally under a latency bound). The Pareto frontier is the
epsilon-constraint sweep: the fastest selection, then the fastest one strictly smaller, and so on.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from tpu_pipeline.toolchain.budget import Deadline
from tpu_pipeline.toolchain.cpsat import new_solver
from tpu_pipeline.toolchain.fit.variants import Variant

_NS = 1e9  # latency is modelled in integer nanoseconds


@dataclass(frozen=True)
class Selection:
    variants: tuple[Variant, ...]  # in span order
    peak: int  # max of the chosen variants' peaks
    latency_s: float  # sum of their predicted latencies
    proven: bool  # CP-SAT proved the lexicographic optimum

    def to_json(self) -> dict:
        return {"peak_bytes": self.peak, "latency_s_predicted": self.latency_s, "proven_optimal": self.proven,
                "variants": [v.to_json() for v in self.variants]}


def select(variants: list[Variant], n_spans: int, *, budget: int | None = None, objective: str = "latency",
           latency_bound: float | None = None, deadline: Deadline | None = None) -> Selection | None:
    """The best selection, or None when no selection meets `budget` (and `latency_bound`)."""
    usable = [v for v in variants if budget is None or v.peak <= budget]
    first = _solve(usable, n_spans, budget, latency_bound, "latency" if objective == "latency" else "peak",
                   None, deadline)
    if first is None:
        return None
    chosen, proven1 = first
    lat = sum(_ns(v) for v in chosen)
    peak = max(v.peak for v in chosen)
    if objective == "latency":  # second level: the smallest peak at that latency
        second = _solve(usable, n_spans, budget, None, "peak", lat, deadline)
    else:  # the fastest at that peak
        second = _solve(usable, n_spans, peak, latency_bound, "latency", None, deadline)
    if second is not None:
        chosen, proven2 = second
    else:
        proven2 = False
    return _selection(chosen, proven1 and proven2)


def chain_select(variants: list[Variant], n_spans: int, *, budget: int | None = None, objective: str = "latency",
                 latency_bound: float | None = None) -> list[Variant] | None:
    """The same optimum as `select`, by dynamic programming over the chain of spans (a variant is
    an arc from span `first` to `last + 1`): milliseconds for thousands of variants, so the lazy
    evaluation in fit.py can ask it after every variant it measures; the answer `fit` returns is
    `select`'s (CP-SAT) over the measured variants, checked against this one."""
    usable = [v for v in variants if budget is None or v.peak <= budget]
    if objective == "latency":
        best = _fastest(usable, n_spans)
        if best is None or (latency_bound is not None and best[0] > latency_bound * _NS):
            return None
        return best[2]
    if latency_bound is None:  # the smallest peak of any covering (a minimax path), then the fastest at it
        top = _smallest_peak(usable, n_spans)
        return None if top is None else _fastest([v for v in usable if v.peak <= top], n_spans)[2]
    peaks = sorted({v.peak for v in usable})  # the smallest threshold with a covering (under the bound)
    lo, hi, found = 0, len(peaks) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        best = _fastest([v for v in usable if v.peak <= peaks[mid]], n_spans)
        if best is not None and (latency_bound is None or best[0] <= latency_bound * _NS):
            found, hi = best, mid - 1
        else:
            lo = mid + 1
    return None if found is None else found[2]


def _smallest_peak(variants: list[Variant], n_spans: int) -> int | None:
    """The least max-peak over coverings of the spans (None if the variants cover none)."""
    best: list = [None] * (n_spans + 1)
    best[0] = 0
    for v in sorted(variants, key=lambda v: v.last):
        prev = best[v.first]
        if prev is not None:
            cand = max(prev, v.peak)
            if best[v.last + 1] is None or cand < best[v.last + 1]:
                best[v.last + 1] = cand
    return best[n_spans]


def _fastest(variants: list[Variant], n_spans: int):
    """(latency ns, peak, variants) of the covering that is fastest, then smallest; None if none."""
    ending: dict[int, list[Variant]] = {}
    for v in variants:
        ending.setdefault(v.last + 1, []).append(v)
    best: list = [None] * (n_spans + 1)
    best[0] = (0, 0, [])
    for s in range(1, n_spans + 1):
        for v in ending.get(s, ()):
            prev = best[v.first]
            if prev is None:
                continue
            cand = (prev[0] + _ns(v), max(prev[1], v.peak), prev[2] + [v])
            if best[s] is None or cand[:2] < best[s][:2]:
                best[s] = cand
    return best[n_spans]


def pareto(choose, deadline: Deadline | None = None, max_points: int = 64) -> list[Selection]:
    """The time/memory frontier, fastest first, by the epsilon-constraint sweep: `choose(budget)`
    gives the fastest selection with a peak <= budget (ties to the smaller peak; None when there is
    none); each next point is asked for strictly less memory than the previous one."""
    points: list[Selection] = []
    budget = None
    while len(points) < max_points and not (deadline is not None and deadline.expired()):
        sel = choose(budget)
        if sel is None:
            break
        points.append(sel)
        budget = sel.peak - 1
    return points


def _ns(v: Variant) -> int:
    return int(round(v.latency_s * _NS))


def _solve(variants, n_spans, budget, latency_bound, minimise, latency_cap, deadline):
    if not variants:
        return None
    m = cp_model.CpModel()
    x = [m.NewBoolVar(f"v{k}") for k in range(len(variants))]
    for s in range(n_spans):  # every span covered exactly once
        m.AddExactlyOne([x[k] for k, v in enumerate(variants) if v.first <= s <= v.last])
    top = max(v.peak for v in variants)
    peak = m.NewIntVar(0, top, "peak")
    for k, v in enumerate(variants):
        m.Add(peak >= v.peak).OnlyEnforceIf(x[k])
    if budget is not None:
        m.Add(peak <= budget)
    latency = sum(_ns(v) * x[k] for k, v in enumerate(variants))
    if latency_bound is not None:
        m.Add(latency <= int(latency_bound * _NS))
    if latency_cap is not None:
        m.Add(latency <= latency_cap)
    m.Minimize(latency if minimise == "latency" else peak)
    seconds = 10.0 if deadline is None else max(0.05, deadline.remaining())
    solver = new_solver(seconds, workers=1)
    status = solver.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    chosen = [v for k, v in enumerate(variants) if solver.Value(x[k])]
    return sorted(chosen, key=lambda v: v.first), status == cp_model.OPTIMAL


def _selection(chosen, proven) -> Selection:
    return Selection(tuple(chosen), max(v.peak for v in chosen), sum(v.latency_s for v in chosen), proven)

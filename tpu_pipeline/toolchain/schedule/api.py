"""`schedule(graph, ...)`: the one entry. Fuse, cut, solve each piece, concatenate, verify."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tpu_pipeline.toolchain import budget as _budget
from tpu_pipeline.toolchain.budget import Deadline, Progress
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.memory import lifetimes, order_free_lower_bound
from tpu_pipeline.toolchain.memory.semantics import TFLM, Semantics, get_semantics
from tpu_pipeline.toolchain.schedule import heuristics
from tpu_pipeline.toolchain.schedule.bounds.static import model_lower_bound
from tpu_pipeline.toolchain.schedule.branches import body_units
from tpu_pipeline.toolchain.schedule.divide import pieces as split_pieces
from tpu_pipeline.toolchain.schedule.fusion import fuse
from tpu_pipeline.toolchain.schedule.model import MemModel, build_model
from tpu_pipeline.toolchain.schedule.params import ScheduleParams
from tpu_pipeline.toolchain.schedule.solve import Request, solve_pieces

METHODS = ("auto", "dp", "cpsat", "greedy")


@dataclass(frozen=True)
class Schedule:
    order: tuple[int, ...]  # positions into graph.ops
    peak: int  # lifetimes(graph, order, semantics).peak
    lower_bound: int  # no topological order peaks below this
    proven_optimal: bool
    method: str
    seconds: float
    # additive details
    stored_peak: int = 0  # peak of the graph's own order
    semantics: str = TFLM.name  # (the Semantics' name, for the JSON)
    ops: int = 0
    units: int = 0  # after fusion
    pieces: int = 0  # after divide-and-conquer
    largest_piece: int = 0  # units in the largest piece
    notes: tuple[str, ...] = field(default=())
    # lower bound name -> the highest value it proved ("static" includes the whole graph's)
    bounds: tuple[tuple[str, int], ...] = field(default=())

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["order"] = list(self.order)
        d["notes"] = list(self.notes)
        d["bounds"] = dict(self.bounds)
        return d


def _best_baseline(model: MemModel, candidates: dict[str, list[int]]) -> tuple[str, list[int], int]:
    best = None
    for name, order in candidates.items():
        p = model.peak(order)
        if best is None or p < best[2]:
            best = (name, order, p)
    return best


def schedule(graph: Graph, method: str = "auto", time_limit: float | None = 10.0,
             semantics: str | Semantics = TFLM, seed: int = 0, *, params: ScheduleParams = ScheduleParams(),
             deadline: Deadline | None = None, below: int | None = None,
             progress: Progress = None) -> Schedule:
    """The op order with the smallest peak found within `time_limit` seconds; never worse than
    the graph's stored order; `proven_optimal` only when the peak equals a proven lower bound.

    `deadline` (a tpu_pipeline.toolchain.budget.Deadline) bounds the call too (the earlier end wins;
    `time_limit=None` means the deadline alone); the call returns within budget.SLACK of it.
    `below`: only an order peaking below this is of interest (the rewrite search's question
    "can this graph beat the current peak?"). The search then stops at the first order under
    it, or as soon as a lower bound shows there is none (`lower_bound >= below`); the order
    returned is then not necessarily optimal. `progress(msg)` hears one line per hard piece.
    `params`: the switches, time shares and caps of the search (params.py); benchmarks and tests
    switch parts off with `ScheduleParams().without(...)`."""
    t0 = time.monotonic()
    if method not in METHODS:
        raise UsageError(f"unknown scheduling method '{method}' (choose from {', '.join(METHODS)})")
    if not isinstance(params, ScheduleParams):
        raise UsageError(f"schedule params must be a ScheduleParams, got {type(params).__name__}")
    sem = get_semantics(semantics)
    if deadline is None and (time_limit is None or time_limit <= 0):
        raise UsageError(f"time limit must be positive, got {time_limit}")
    if time_limit is not None and time_limit <= 0:
        raise UsageError(f"time limit must be positive, got {time_limit}")
    deadline = _budget.resolve(time_limit, deadline).end
    n = len(graph.ops)
    stored_peak = lifetimes(graph, None, sem).peak
    if n == 0:
        return Schedule((), stored_peak, stored_peak, True, "trivial", 0.0, stored_peak, sem.name)
    model = build_model(graph, sem)
    notes: list[str] = []
    if not model.exact:
        notes.append("TFLite in-place sharing depends on the order for some ops: the search "
                     "optimises a model of it; optimality is not claimed")

    base_name, base_order, base_peak = _best_baseline(model, _baselines(model, method))
    global_lb = model_lower_bound(model)
    proven_by = {"static": global_lb}

    if method == "greedy" or base_peak <= global_lb or (below is not None and global_lb >= below):
        order, peak, lb, used = base_order, base_peak, global_lb, f"heuristic:{base_name}"
        units_n = pieces_n = largest = 0
    else:
        units = _units(model, params, t0 + params.body_share * (deadline - t0))
        plist = split_pieces(model, units) if params.cuts else [list(range(len(units)))]
        units_n, pieces_n = len(units), len(plist)
        largest = max(len(p) for p in plist)
        solved = solve_pieces(model, units, plist, base_order, base_peak, global_lb,
                              Request(method, deadline, params, seed, below, progress, t0))
        order, peak, lb, used = solved.order, solved.peak, solved.lower_bound, solved.method
        notes.extend(solved.notes)
        proven_by = solved.bounds
        if base_peak <= peak:
            order, peak = base_order, base_peak
            used = f"heuristic:{base_name}" if base_peak < peak else used

    # never worse than the stored order, and verified with the shared memory model
    order = list(order)
    if not graph.is_topological(order):
        raise AssertionError("scheduler produced a non-topological order")
    real = lifetimes(graph, order, sem).peak
    if model.exact and real != peak:
        raise AssertionError(f"scheduler's peak {peak} disagrees with lifetimes() {real}")
    if not model.exact:  # the search used a model of the order-dependent sharing: judge for real
        for cand in (base_order,):
            p = lifetimes(graph, cand, sem).peak
            if p < real:
                order, real = list(cand), p
    if stored_peak <= real:
        order, real = list(range(n)), stored_peak
    lb = min(max(lb, global_lb), real)
    proven = real == lb and model.exact
    if not model.exact:  # the model's own bounds assume no sharing: use the runtime-level bound
        lb = min(order_free_lower_bound(graph, sem), real)
        proven_by = {"order-free (runtime)": lb}
    return Schedule(tuple(order), real, lb, proven, used, time.monotonic() - t0, stored_peak,
                    sem.name, n, units_n, pieces_n, largest, tuple(notes), tuple(proven_by.items()))


def _baselines(model: MemModel, method: str) -> dict:
    """The heuristic orders every search starts from (method greedy: the cheap ones)."""
    baselines = {"converter": heuristics.stored(model), "greedy": heuristics.greedy(model),
                 "greedy-free": heuristics.greedy(model, key="resident")}
    if method != "greedy":
        baselines["rpo"] = heuristics.reverse_post_order(model)
        baselines["kahn"] = heuristics.kahn(model)
    return baselines


def _units(model: MemModel, params: ScheduleParams, body_until: float) -> list[tuple[int, ...]]:
    """The units the searches order: fused ops (with branch bodies), or one op each."""
    if not params.fusion:
        return [(v,) for v in heuristics.kahn(model)]
    # the body search is a pre-pass: it gets at most `body_share` of the time
    return fuse(model, body_units(model, until=body_until) if params.branches else None)

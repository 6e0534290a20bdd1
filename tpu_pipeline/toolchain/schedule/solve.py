"""Solve the pieces of a graph one by one, in context: bounds first, then the stages.

Every piece gets an upper bound (the best baseline order restricted to it, or greedy) and the
lower bounds of bounds.PIECE_BOUNDS; the graph's floor is the highest bound of any piece (the
graph peaks at its worst piece, so no piece needs an order below the floor). The pieces still
above the floor then run the method's stages (stages.py), the highest bound first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tpu_pipeline.toolchain import budget as _budget
from tpu_pipeline.toolchain.budget import Progress
from tpu_pipeline.toolchain.schedule import bounds, heuristics
from tpu_pipeline.toolchain.schedule.dp import best_first
from tpu_pipeline.toolchain.schedule.model import MemModel
from tpu_pipeline.toolchain.schedule.params import ScheduleParams
from tpu_pipeline.toolchain.schedule.problem import BoundQuery, Known, Piece, StageContext, pieces_in_context
from tpu_pipeline.toolchain.schedule.stages import run_stages


@dataclass(frozen=True)
class Request:
    """What schedule() asks of the pieces, resolved."""
    method: str  # auto, dp or cpsat
    deadline: float  # monotonic seconds
    params: ScheduleParams
    seed: int = 0
    below: int | None = None  # only an order peaking below this is of interest (see schedule())
    progress: Progress = None
    t0: float = 0.0  # when the call began (for the progress lines)


@dataclass(frozen=True)
class PieceResult:
    order: list[int]  # op order of the piece
    peak: int
    lower_bound: int  # proven for the piece, or the graph's floor when that is higher
    complete: bool  # the order is proven as good as the floor allows


@dataclass(frozen=True)
class Solved:
    order: list[int]  # op order of the graph
    peak: int
    lower_bound: int  # proven: no order of the graph peaks below this
    method: str  # the searches that ran, "+"-joined ("heuristic+bound": none)
    notes: tuple[str, ...]
    bounds: dict[str, int]  # lower bound name -> the highest value it proved


def piece_upper_bound(model: MemModel, pc: Piece, base_order, deadline: float) -> tuple[list[int], int]:
    """Upper bound for the piece: the best global heuristic order restricted to it, or greedy
    (while time is left)."""
    cand = [v for v in base_order if (pc.ops >> v) & 1]
    ub_order, ub = cand, pc.evaluate(cand)
    if len(pc.units) > 1 and time.monotonic() < deadline:
        g = heuristics.greedy(model, pc.units, pc.S0, pc.R0)
        pg = pc.evaluate(g)
        if pg < ub:
            ub_order, ub = g, pg
    return ub_order, ub


def solve_pieces(model: MemModel, units, plist, base_order, base_peak: int, global_lb: int,
                 request: Request) -> Solved:
    """Solve every piece in context; pieces with the highest lower bound first. With `below`,
    stop at the first proof that no order peaks below it, and leave alone the pieces whose
    heuristic order already does."""
    params, deadline, below = request.params, request.deadline, request.below
    piece_objs = pieces_in_context(model, units, plist)
    if params.lazy_slices:
        piece_objs = [pc.use_lazy_slices() for pc in piece_objs]
    if params.twins:
        piece_objs = [pc.use_twins() for pc in piece_objs]
    ubs = [piece_upper_bound(model, pc, base_order, deadline) for pc in piece_objs]
    lbs, floor, proven = _piece_bounds(piece_objs, ubs, global_lb, request)
    if below is not None and floor >= below:  # proven: no order of the graph peaks below `below`
        return Solved(base_order, base_peak, floor, "bound", (), proven)
    results: list[PieceResult | None] = [None] * len(plist)
    # pieces in order of decreasing lower bound, then by size (the hard one first)
    todo = sorted(range(len(plist)), key=lambda i: (-lbs[i], -len(plist[i]), i))
    methods_used: set[str] = set()
    for i in todo:
        pc = piece_objs[i]
        ub_order, ub = ubs[i]
        if len(pc.units) == 1:
            # one unit: its own inner order is optimal (the fusion and body theorems)
            own = list(pc.units[0])
            peak = pc.evaluate(own)
            results[i] = PieceResult(own, peak, peak, True) if peak <= ub else PieceResult(ub_order, ub, ub, True)
            continue
        if ub <= floor or (below is not None and (ub < below or floor >= below)):
            results[i] = PieceResult(ub_order, ub, lbs[i], True)
            continue
        if time.monotonic() >= deadline:  # out of time (a large graph's linear passes took it)
            results[i] = PieceResult(ub_order, ub, lbs[i], False)
            continue
        _budget.say(request.progress, request.t0,
                    f"schedule: piece of {len(pc.units)} units, peak {ub:,} vs bound {floor:,}, "
                    f"{max(deadline - time.monotonic(), 0.0):.1f} s left")
        if below is not None:
            # Any order under `below` will do: search with `below` as the bound to beat, diving
            # depth-first under it; exhausting the search proves there is none.
            res = best_first(pc, below, below - 1, deadline, free_moves=params.free_moves, native=params.native)
            methods_used.add("dp")
            order, peak = (res.order, res.peak) if res.order is not None else (ub_order, ub)
            results[i] = PieceResult(order, peak, max(res.lower_bound, lbs[i]), res.complete)
            floor = max(floor, res.lower_bound if res.order is None else lbs[i])
            continue
        known = run_stages(pc, Known(ub_order, ub, floor),
                           StageContext(params, request.method, deadline, request.seed))
        methods_used |= known.methods
        for name, value in known.bounds:
            proven[name] = max(proven.get(name, 0), value)
        results[i] = PieceResult(known.order, known.peak, max(known.floor, lbs[i]), known.settled)
        floor = max(floor, results[i].lower_bound)
    order = [v for r in results for v in r.order]
    notes = ()
    if any(not r.complete for r in results):
        notes = ("time limit reached in %d of %d pieces" % (sum(not r.complete for r in results), len(results)),)
    return Solved(order, model.peak(order), max([global_lb] + [r.lower_bound for r in results]),
                  "+".join(sorted(methods_used)) or "heuristic+bound", notes, proven)


def _piece_bounds(piece_objs: list[Piece], ubs, global_lb: int, request: Request):
    """Run bounds.PIECE_BOUNDS: (each piece's bound, the graph's floor, name -> best value)."""
    lbs = [0] * len(piece_objs)
    floor = global_lb
    proven = {"static": global_lb}
    below = request.below
    for bound in bounds.PIECE_BOUNDS:
        if bound.switch is not None and not getattr(request.params, bound.switch):
            continue
        for i, pc in enumerate(piece_objs):
            if not bound.every_piece:
                if below is not None and (floor >= below or ubs[i][1] < below):
                    continue  # the answer to "anything below?" is already known, or this piece is fine
                if len(pc.units) <= 1 or ubs[i][1] <= max(floor, lbs[i]):
                    continue  # one unit, or its heuristic order is already within the bounds
            value = bound.compute(pc, BoundQuery(lbs[i], ubs[i][1], request.deadline))
            lbs[i] = max(lbs[i], value)
            proven[bound.name] = max(proven.get(bound.name, 0), value)
        floor = max([floor, *lbs])
    return lbs, floor, proven

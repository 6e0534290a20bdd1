"""`schedule(graph, ...)`: the one entry. Fuse, cut, solve each piece, concatenate, verify."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tpu_pipeline.toolchain import budget as _budget
from tpu_pipeline.toolchain.budget import Deadline, Progress
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.memory import lifetimes, order_free_lower_bound
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.schedule import _native_search, heuristics
from tpu_pipeline.toolchain.schedule.bounds import branch_lower_bound, cut_lower_bound
from tpu_pipeline.toolchain.schedule.divide import pieces as split_pieces
from tpu_pipeline.toolchain.schedule.dp import Piece, best_first
from tpu_pipeline.toolchain.schedule.beam import TooWide, beam_order
from tpu_pipeline.toolchain.schedule.branches import body_units
from tpu_pipeline.toolchain.schedule.fusion import fuse
from tpu_pipeline.toolchain.schedule.model import MemModel, build_model

METHODS = ("auto", "dp", "cpsat", "greedy")
# A dive that has kept this many states without an order stalls (about 0.5 s of either search):
# the next dive gets a higher trial budget. Keyed by "the search runs in C".
DIVE_STATES = {False: 20_000, True: 500_000}
CPSAT_MAX_CELLS = 60_000  # (unit, step) pairs of a piece CP-SAT may model in auto mode: about 200 MB


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
    semantics: str = "tflm"
    ops: int = 0
    units: int = 0  # after fusion
    pieces: int = 0  # after divide-and-conquer
    largest_piece: int = 0  # units in the largest piece
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["order"] = list(self.order)
        d["notes"] = list(self.notes)
        return d


def _best_baseline(model: MemModel, candidates: dict[str, list[int]]) -> tuple[str, list[int], int]:
    best = None
    for name, order in candidates.items():
        p = model.peak(order)
        if best is None or p < best[2]:
            best = (name, order, p)
    return best


def schedule(graph: Graph, method: str = "auto", time_limit: float | None = 10.0,
             semantics: str = "tflm", seed: int = 0, *, ablate: frozenset[str] = frozenset(),
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

    `ablate` (benchmarks only) switches parts off: "fusion", "branches", "lazy_slices", "cuts",
    "free_moves", "cut_bound", "branch_bound", "beam", "dives"."""
    t0 = time.monotonic()
    if method not in METHODS:
        raise UsageError(f"unknown scheduling method '{method}' (choose from {', '.join(METHODS)})")
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

    baselines = {"converter": heuristics.stored(model), "greedy": heuristics.greedy(model),
                 "greedy-free": heuristics.greedy(model, key="resident")}
    if method != "greedy":
        baselines["rpo"] = heuristics.reverse_post_order(model)
        baselines["kahn"] = heuristics.kahn(model)
    base_name, base_order, base_peak = _best_baseline(model, baselines)
    global_lb = model.lower_bound()

    if method == "greedy" or base_peak <= global_lb or (below is not None and global_lb >= below):
        order, peak, lb, used = base_order, base_peak, global_lb, f"heuristic:{base_name}"
        units_n = pieces_n = largest = 0
    else:
        if "fusion" in ablate:
            units = [(v,) for v in heuristics.kahn(model)]
        else:
            # the body search is a pre-pass: it gets at most a quarter of the time
            bodies = None if "branches" in ablate else body_units(model, until=t0 + 0.25 * (deadline - t0))
            units = fuse(model, bodies)
        plist = [list(range(len(units)))] if "cuts" in ablate else split_pieces(model, units)
        units_n, pieces_n = len(units), len(plist)
        largest = max(len(p) for p in plist)
        order, peak, lb, used = _solve_pieces(model, units, plist, base_order, base_peak,
                                              global_lb, method, deadline, seed, notes, ablate,
                                              below, progress, t0)
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
    return Schedule(tuple(order), real, lb, proven, used, time.monotonic() - t0, stored_peak,
                    sem.name, n, units_n, pieces_n, largest, tuple(notes))


def _pieces_in_context(model, units, plist) -> list[Piece]:
    """One Piece per part of `plist`; its context (S0, R0) follows from the pieces before it."""
    contexts = []
    S, R = 0, model.r0
    for p in plist:
        contexts.append((S, R))
        for k in p:
            for v in units[k]:
                _, R = model.step(v, S, R)
                S |= 1 << v
    return [Piece(model, [units[k] for k in p], S0, R0) for p, (S0, R0) in zip(plist, contexts)]


def _with_lazy_slices(pieces: list[Piece], ablate) -> list[Piece]:
    return pieces if "lazy_slices" in ablate else [pc.use_lazy_slices() for pc in pieces]


def _piece_upper_bound(model, pc: Piece, base_order, deadline: float) -> tuple[list[int], int]:
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


def _search_piece(pc: Piece, ub_order, ub: int, floor: int, method: str, now: float, left: float,
                  deadline: float, seed: int, ablate, methods_used: set):
    """The DP and/or CP-SAT on one piece (method auto, dp or cpsat); adds the ones run to
    `methods_used`. Returns the search result with the better lower bound / order."""
    res = None
    # building the CP-SAT model costs about 0.1 ms per (unit, step) pair: in auto mode it is
    # tried only when that is a small part of the time left
    cells = len(pc.units) * bin(pc.ops).count("1")
    build = cells * 1e-4
    # memory: about 3 KB per (unit, step) pair (measured: 136k pairs, 400 MB), so auto mode
    # leaves larger pieces to the DP (whose states are capped by dp.MAX_STATE_BYTES)
    cpsat_ok = build < 0.12 * left and cells <= CPSAT_MAX_CELLS
    if method in ("auto", "dp"):
        share = 1.0 if method == "dp" else (0.6 if cpsat_ok else 0.9)
        res = best_first(pc, ub, floor, now + share * left, free_moves="free_moves" not in ablate)
        methods_used.add("dp")
    if method == "cpsat" or (method == "auto" and cpsat_ok and res is not None and not res.complete):
        from tpu_pipeline.toolchain.schedule.cpsat import cpsat_piece

        left = deadline - time.monotonic()
        if (left > 0.2 and build < 0.3 * left) or method == "cpsat":
            budget = max(left * (0.7 if method == "auto" else 1.0), 0.5)
            res2 = cpsat_piece(pc, ub_order, ub, floor, budget, seed)
            methods_used.add("cpsat")
            if res is None or res2.lower_bound > res.lower_bound or (
                    res2.order is not None and res2.peak < (res.peak if res.order else ub)):
                lbm = max(res2.lower_bound, res.lower_bound if res else 0)
                res = res2
                res.lower_bound = lbm
    return res


def _first_try(pc: Piece, ub: int, floor: int, now: float, left: float, deadline: float, ablate,
               methods_used: set):
    """A short exact search (most pieces end here, 20 % of the time left); if it does not
    finish: the branching min-cut bound raises the floor (25 %), beams (25 %) and dives (20 %)
    look for better orders; the full search gets the rest. Returns (the result, the floor)."""
    def until(share):
        return min(time.monotonic() + share * left, deadline)

    res = best_first(pc, ub, floor, until(0.2), free_moves="free_moves" not in ablate)
    methods_used.add("dp")
    if res.complete:
        return res, floor
    floor = max(floor, res.lower_bound)
    if "branch_bound" not in ablate:
        floor = max(floor, branch_lower_bound(pc, until(0.25), floor, ub))
    if res.order is not None:
        ub = res.peak
    if "beam" not in ablate and floor < ub:
        found = _beams(pc, ub, until(0.25), 0 if "beam_floor" in ablate else floor)
        if found is not None and found[1] < ub:
            res.order, res.peak = found
            ub = found[1]
    if "dives" not in ablate and floor < ub:
        dive, proven = _dives(pc, ub, floor, until(0.2), ablate)
        floor = max(floor, proven)
        if dive is not None:
            res.order, res.peak = dive
    return res, floor


def _beams(pc: Piece, ub: int, until: float, floor: int) -> tuple[list[int], int] | None:
    """Beam searches (beam.py) of doubling width while time is left: the best order found.
    `floor` is a proven bound: no order of the piece peaks below it (beam.py)."""
    best, width = None, 48
    while time.monotonic() < until:
        try:
            found = beam_order(pc, width, until, ub, floor=floor)
        except TooWide:  # the memory cap: wider beams fit even less
            break
        if found is not None and found[1] < ub:  # None: the beam died under ub, or the time
            best, ub = found, found[1]
        width *= 2
    return best


def _dives(pc: Piece, ub: int, floor: int, until: float, ablate):
    """Better orders: depth-first dives of the exact search under a trial budget B (every
    state under B looks alike, so the search goes deep first), bisecting B between the proven
    floor and the best peak; a dive that stalls just raises the next B. Returns (the best
    (order, peak) found or None, a proven bound). The bound a dive reports is valid: it is
    above B only once every state below it was expanded (dp.best_first)."""
    lo, best, proven = floor, None, floor
    while ub - lo > max(ub // 200, 1) and time.monotonic() < until:
        B = (lo + ub) // 2
        cap = min(until, time.monotonic() + 0.5)
        r = best_first(pc, ub, B, cap, max_states=DIVE_STATES[_native_search.available()],
                       free_moves="free_moves" not in ablate)
        proven = max(proven, min(r.lower_bound, ub))
        if r.order is not None and r.peak < ub:
            best, ub = (r.order, r.peak), r.peak
        else:
            lo = B
    return best, proven


def _solve_pieces(model, units, plist, base_order, base_peak, global_lb, method, deadline, seed, notes, ablate,
                  below=None, progress=None, t0=0.0):
    """Solve every piece in context; pieces with the highest lower bound first. With `below`,
    stop at the first proof that no order peaks below it, and leave alone the pieces whose
    heuristic order already does."""
    piece_objs = _with_lazy_slices(_pieces_in_context(model, units, plist), ablate)
    lbs = [pc.static_lower_bound() for pc in piece_objs]
    ubs = [_piece_upper_bound(model, pc, base_order, deadline) for pc in piece_objs]
    floor = max([global_lb, *lbs])
    # min-cut certificates for the pieces whose heuristic is above every bound so far
    for i, pc in enumerate(piece_objs):
        if below is not None and (floor >= below or ubs[i][1] < below):
            continue  # the answer to "anything below?" is already known, or this piece is fine
        if "cut_bound" not in ablate and len(pc.units) > 1 and ubs[i][1] > max(floor, lbs[i]):
            lbs[i] = max(lbs[i], cut_lower_bound(pc, deadline))
    floor = max([floor, *lbs])
    if below is not None and floor >= below:  # proven: no order of the graph peaks below `below`
        return base_order, base_peak, floor, "bound"
    results = [None] * len(plist)
    # pieces in order of decreasing lower bound, then by size (the hard one first)
    todo = sorted(range(len(plist)), key=lambda i: (-lbs[i], -len(plist[i]), i))
    methods_used = set()
    for i in todo:
        pc = piece_objs[i]
        ub_order, ub = ubs[i]
        if len(pc.units) == 1:
            # one unit: its own inner order is optimal (the fusion and body theorems)
            own = list(pc.units[0])
            peak = pc.evaluate(own)
            results[i] = (own, peak, peak, True) if peak <= ub else (ub_order, ub, ub, True)
            continue
        if ub <= floor or (below is not None and (ub < below or floor >= below)):
            results[i] = (ub_order, ub, lbs[i], True)
            continue
        if time.monotonic() >= deadline:  # out of time (a large graph's linear passes took it)
            results[i] = (ub_order, ub, lbs[i], False)
            continue
        now = time.monotonic()
        left = max(deadline - now, 0.0)
        _budget.say(progress, t0, f"schedule: piece of {len(pc.units)} units, peak {ub:,} vs bound {floor:,}, "
                                 f"{left:.1f} s left")
        if below is not None:
            # Any order under `below` will do: search with `below` as the bound to beat, diving
            # depth-first under it; exhausting the search proves there is none.
            res = best_first(pc, below, below - 1, deadline, free_moves="free_moves" not in ablate)
            methods_used.add("dp")
            order, peak = (res.order, res.peak) if res.order is not None else (ub_order, ub)
            results[i] = (order, peak, max(res.lower_bound, lbs[i]), res.complete)
            floor = max(floor, res.lower_bound if res.order is None else lbs[i])
            continue
        res = None
        if method == "auto":
            res, floor = _first_try(pc, ub, floor, now, left, deadline, ablate, methods_used)
            lbs[i] = max(lbs[i], floor)
        if res is None or not res.complete:
            if res is not None and res.order is not None:
                ub_order, ub = res.order, res.peak  # the short search's order is the one to beat
            now = time.monotonic()
            res2 = _search_piece(pc, ub_order, ub, floor, method, now, max(deadline - now, 0.0), deadline,
                                 seed, ablate, methods_used)
            if res is not None:
                res2.lower_bound = max(res2.lower_bound, res.lower_bound)
            res = res2
        order, peak = (res.order, res.peak) if res.order is not None else (ub_order, ub)
        lb = max(res.lower_bound, lbs[i])
        done = res.complete
        results[i] = (order, peak, lb, done)
        floor = max(floor, lb)
    order = []
    for r in results:
        order.extend(r[0])
    peak = model.peak(order)
    lb = max([global_lb] + [r[2] for r in results])
    if any(not r[3] for r in results):
        notes.append("time limit reached in %d of %d pieces" % (sum(not r[3] for r in results), len(results)))
    used = "+".join(sorted(methods_used)) or "heuristic+bound"
    return order, peak, lb, used

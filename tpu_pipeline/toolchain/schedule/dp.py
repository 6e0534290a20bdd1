"""Exact dynamic programming over scheduled sets (SERENITY's zero-indegree signatures).

A state is the set S of units already run (a bitset; its zero-indegree signature is determined by
it). The bytes resident between steps, R(S), and the bytes live while the next unit runs depend
only on S, so the best peak to reach S, g(S) = min over predecessors of max(g(S'), step cost), is
a bottleneck shortest-path problem over the lattice of down-sets, memoised on S.

Adaptive soft budgeting, as done here (what differs from SERENITY's Algorithm 2):
- The hard budget is the best heuristic peak (UB): partial schedules that reach UB are pruned, and
  if the search exhausts, the heuristic order is proven optimal.
- Instead of restarting a budgeted DP with a bisected soft budget (which re-expands the same
  states on every try and, when a try fails, learns only "> budget"), the states are expanded in
  increasing order of max(g(S), floor): a best-first (Dijkstra) search on the bottleneck cost.
  This is exactly what an oracle soft budget = OPT would expand, needs no meta-search, and the
  key of the state being expanded is at every moment a proven lower bound (anytime).
- `floor` is a proven lower bound from elsewhere (the order-free bound of the op footprints, or
  the optimum of another piece): every state below it costs the same, so ties are broken by depth
  and the search dives depth-first until the floor is exceeded — the soft budget.
- Free moves: if a ready unit k, run now, peaks at most max(g(S), floor) and leaves no more bytes
  resident (R(S+k) <= R(S)), some optimal completion from S starts with k, so k is the only child
  expanded. Proof: in any completion ... x1..xj k ..., moving k to the front adds to each x step at
  most R(S+k) - R(S) <= 0 (k's surviving outputs appear earlier; inputs that die at k now die
  earlier, and inputs shared with the x's die no later), k's own step costs what it costs at S,
  and every step after k sees the same set, hence the same bytes. This prunes most of the lattice
  on real networks (an ADD that joins two branches is scheduled as soon as it is ready).
- The search runs in C (`_best_first.c`, through `_native_search.py`) when a C compiler is at
  hand: the same states, moves and keys, about 20x the states per second. The Python version
  below is the fallback and the reference the tests hold the C one to.
- `budgeted_dp` + `bisect_budget` keep the paper's literal scheme (a memoised DFS under a budget,
  bisection between the proven lower bound and the known feasible peak, a time cap per try) for
  comparison; `schedule()` uses the best-first search.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

from tpu_pipeline.toolchain.schedule import _native_search
from tpu_pipeline.toolchain.schedule.forks import lazy_slices, moves
from tpu_pipeline.toolchain.schedule.model import MemModel, bits


@dataclass
class SearchResult:
    order: list[int] | None  # op order of the piece, None if nothing better than `ub` was found
    peak: int  # peak of `order` over the piece's steps (or ub if order is None)
    lower_bound: int  # proven: no order of the piece peaks below this
    complete: bool  # the search finished (order optimal, or ub proven optimal)
    states: int


class Piece:
    """Units to order after the ops in S0 (with R0 = R(S0)); all outside predecessors are in S0."""

    def __init__(self, model: MemModel, units, S0: int = 0, R0: int | None = None):
        self.model = model
        self.units = [tuple(u) for u in units]
        self.S0 = S0
        self.R0 = model.r0 if (R0 is None and S0 == 0) else (model.resident(S0) if R0 is None else R0)
        self.inside = []
        owner = {}
        for k, u in enumerate(self.units):
            m = 0
            for v in u:
                m |= 1 << v
                owner[v] = k
            self.inside.append(m)
        self.ops = 0
        for m in self.inside:
            self.ops |= m
        self.upred = []
        for k, u in enumerate(self.units):
            pm = 0
            for v in u:
                pm |= model.preds[v]
            pm &= ~self.inside[k]
            if pm & ~(S0 | self.ops):
                raise ValueError("piece has predecessors outside the piece and S0")
            loc = 0
            for w in bits(pm & self.ops):
                loc |= 1 << owner[w]
            self.upred.append(loc)
        self.usucc = [[] for _ in self.units]
        for k, p in enumerate(self.upred):
            for j in bits(p):
                self.usucc[j].append(k)
        self.lazy: dict[int, tuple[int, int]] = {}  # see forks.py; set by use_lazy_slices()
        self.fork_groups: dict[int, list[int]] = {}

    def use_lazy_slices(self) -> "Piece":
        """Let the search offer slices of a fork only as pairs or one final run (forks.py)."""
        self.lazy, self.fork_groups = lazy_slices(self.model, self.units, self.ops, self.upred)
        return self

    def apply(self, k: int, S: int, R: int) -> tuple[int, int, int]:
        """Run unit k after S: (peak over its steps, S after, R after)."""
        peak = 0
        step = self.model.step
        for v in self.units[k]:
            live, R = step(v, S, R)
            S |= 1 << v
            if live > peak:
                peak = live
        return peak, S, R

    @property
    def step0(self) -> int:
        """Bytes live at step 0 (the graph inputs) if this piece starts the graph, else 0: step 0
        belongs to the first piece."""
        return self.model.step0 if self.S0 == 0 else 0

    def evaluate(self, order) -> int:
        """Peak over the piece's steps for an op order of the piece's ops."""
        return self.model.peak(order, self.S0, self.R0) if order else 0

    def static_lower_bound(self) -> int:
        """No order of this piece peaks below this: each op's own footprint plus the tensors
        resident through the whole piece (alive before its first and after its last step)."""
        model = self.model
        S_end = self.S0 | self.ops
        thru = []
        for t in range(len(model.size)):
            m = model.mask[t]
            if m & self.ops:
                continue
            # untouched by the piece: alive before its first step iff alive after its last
            if (model.pin_start[t] or m & self.S0) and (model.pin_end[t] or m & ~self.S0):
                thru.append(model.size[t])
        base = sum(thru) + model.const_all
        lb = self.step0
        for v in bits(self.ops):
            fp = base + model.extra[v] + sum(model.size[t] for t in model.touch[v])
            lb = max(lb, fp)
        if S_end == model.full:
            end = model.const_all + model.final_only + sum(
                model.size[t] for t in range(len(model.size)) if model.pin_end[t])
            lb = max(lb, end)
        return lb


# Memory cap of one search. A state costs its entries in `best` and `parent`, a heap entry (a
# 7-tuple with the ready tuple) and the bitsets U (units) and S (ops): measured with tracemalloc
# on CPython 3.12, about 570 bytes at 100 ops, 630 at 500 and 1,010 at 2,000 ops per state. The
# cap counts states plus heap entries (about two per state) at 560 + 3n/8 bytes each, so it errs
# on the safe side by about 2x. Past it the search stops, incomplete but with its proven bound.
MAX_STATE_BYTES = 256 * 2**20


def state_cap(piece: "Piece", max_bytes: int = MAX_STATE_BYTES) -> int:
    """How many states (dict entries plus heap entries) fit in `max_bytes` for this piece."""
    n_ops = piece.model.n
    per_state = 560 + 3 * (n_ops // 8) + (len(piece.units) // 8)
    return max(10_000, max_bytes // per_state)


def best_first(piece: Piece, ub: int, floor: int = 0, deadline: float | None = None,
               max_states: int | None = None, free_moves: bool = True, native: bool = True) -> SearchResult:
    """Exact bottleneck search; returns an order with peak < ub if one exists (optimal, or at
    most `floor` — any order within the floor is as good as optimal for the caller).
    `max_states` caps the states kept plus the heap entries queued (default: about
    MAX_STATE_BYTES of memory; the C search also stops at that many bytes).
    `native`: run the C version (_best_first.c) when it can be built; the Python one below is
    the same algorithm and the reference the tests compare it with."""
    if max_states is None:
        max_states = state_cap(piece) if not (native and _native_search.available()) else 2**62
    m = len(piece.units)
    full_u = (1 << m) - 1
    static_lb = piece.static_lower_bound()
    floor = max(floor, static_lb)
    if m == 0:
        return SearchResult([], 0, 0, True, 0)
    if ub <= floor:
        return SearchResult(None, ub, static_lb, True, 0)
    ready0 = tuple(k for k in range(m) if piece.upred[k] == 0)
    g0 = piece.step0
    if g0 >= ub:
        return SearchResult(None, ub, max(static_lb, g0), True, 0)
    # A graph output no op touches is live at the last step only, i.e. at whichever op runs last:
    # a free move can change that op, so the exchange argument fails in the piece that ends the
    # graph (fusion makes the same exception; the brute-force test pins it).
    if piece.model.final_only and (piece.S0 | piece.ops) == piece.model.full:
        free_moves = False
    if native and _native_search.available():
        return _native_search.best_first(piece, ub, floor, static_lb, g0, deadline, max_states,
                                         MAX_STATE_BYTES, free_moves)
    best = {0: g0}
    parent: dict[int, tuple[int, int]] = {}
    heap = [(max(floor, g0), 0, g0, 0, piece.S0, piece.R0, ready0)]
    upred, usucc = piece.upred, piece.usucc
    apply = piece.apply
    popped_f = floor
    pops = 0
    while heap:
        f, negd, g, U, S, R, ready = heapq.heappop(heap)
        if g > best.get(U, g):
            continue
        popped_f = f
        if U == full_u:
            order = _reconstruct(piece, parent, U)
            lb = f if f > floor else static_lb
            return SearchResult(order, g, max(lb, static_lb), True, len(best))
        pops += 1
        if (pops & 511) == 0:
            if deadline is not None and time.monotonic() > deadline:
                break
            if len(best) + len(heap) > max_states:
                break
        # Free moves (see the module docstring): a ready unit whose steps stay within
        # max(g, floor) and after which fewer bytes are resident is the only child expanded.
        # Around a fork read only by slices, a move may be a slice with its consumer's unit or
        # the run of all remaining slices (forks.py).
        children = []
        cap = g if g > floor else floor
        for ks in (moves(piece, U, ready) if piece.lazy else [(k,) for k in ready]):
            peak, S2, R2 = 0, S, R
            for k in ks:
                p, S2, R2 = apply(k, S2, R2)
                peak = p if p > peak else peak
            if free_moves and peak <= cap and R2 <= R:
                children = [(ks, peak, S2, R2)]
                break
            children.append((ks, peak, S2, R2))
        for ks, peak, S2, R2 in children:
            g2 = peak if peak > g else g
            if g2 >= ub:
                continue
            U2 = U
            for k in ks:
                U2 |= 1 << k
            old = best.get(U2)
            if old is not None and old <= g2:
                continue
            best[U2] = g2
            parent[U2] = (U, ks)
            nr = [j for j in ready if not (U2 >> j) & 1]
            for k in ks:
                for j in usucc[k]:
                    if upred[j] & ~U2 == 0 and not (U2 >> j) & 1 and j not in nr:
                        nr.append(j)
            heapq.heappush(heap, (g2 if g2 > floor else floor, negd - 1, g2, U2, S2, R2, tuple(nr)))
    else:
        # exhausted without reaching the goal below ub: ub is optimal
        return SearchResult(None, ub, ub, True, len(best))
    lb = popped_f if popped_f > floor else static_lb
    return SearchResult(None, ub, max(lb, static_lb), False, len(best))


def _reconstruct(piece: Piece, parent, U: int) -> list[int]:
    seq = []
    while U:
        U, ks = parent[U]
        seq.append(ks)
    return _units_to_ops(piece, [k for ks in reversed(seq) for k in ks])


def _units_to_ops(piece: Piece, unit_order) -> list[int]:
    return [v for k in unit_order for v in piece.units[k]]


def budgeted_dp(piece: Piece, budget: int, deadline: float | None = None) -> tuple[list[int] | None, bool]:
    """SERENITY-style budgeted search: a memoised depth-first DP that prunes partial schedules
    whose peak exceeds `budget`. Returns (order or None, finished within the deadline)."""
    m = len(piece.units)
    full_u = (1 << m) - 1
    failed: set[int] = set()
    upred = piece.upred
    counter = [0]
    timed_out = [False]

    def ready_of(U):
        return [k for k in range(m) if not (U >> k) & 1 and upred[k] & ~U == 0]

    # iterative DFS with explicit stack to avoid recursion limits
    stack = [(0, piece.S0, piece.R0, None)]
    path: list[int] = []
    iters: list = []
    # children sorted by step peak (greedy first)
    def children(U, S, R):
        out = []
        for k in ready_of(U):
            peak, S2, R2 = piece.apply(k, S, R)
            if peak <= budget:
                out.append((peak, R2, k, S2))
        out.sort()
        return out

    U, S, R = 0, piece.S0, piece.R0
    if piece.step0 > budget:
        return None, True
    if U == full_u:
        return [], True
    iters.append((U, iter(children(U, S, R))))
    while iters:
        counter[0] += 1
        if (counter[0] & 255) == 0 and deadline is not None and time.monotonic() > deadline:
            timed_out[0] = True
            return None, False
        U, it = iters[-1]
        nxt = next(it, None)
        if nxt is None:
            failed.add(U)
            iters.pop()
            if path:
                path.pop()
            continue
        _, R2, k, S2 = nxt
        U2 = U | (1 << k)
        if U2 in failed:
            continue
        path.append(k)
        if U2 == full_u:
            order: list[int] = []
            for j in path:
                order.extend(piece.units[j])
            return order, True
        iters.append((U2, iter(children(U2, S2, R2))))
    return None, True


def bisect_budget(piece: Piece, lb: int, ub_order, ub: int, deadline: float | None = None,
                  step_cap: float = 1.0) -> SearchResult:
    """The paper's meta-search, fixed to bisect between a proven lower bound and a known feasible
    peak; each try gets at most `step_cap` seconds (a timed-out try counts as 'unknown')."""
    lo, hi = lb, ub  # invariant: OPT >= lo (proven), an order with peak hi is known
    best_order = ub_order
    proven = True
    while lo < hi:
        if deadline is not None and time.monotonic() > deadline:
            proven = False
            break
        mid = (lo + hi) // 2
        cap = time.monotonic() + step_cap
        if deadline is not None:
            cap = min(cap, deadline)
        order, finished = budgeted_dp(piece, mid, cap)
        if order is not None:
            hi = piece.evaluate(order)
            best_order = order
        elif finished:
            lo = mid + 1
        else:
            proven = False  # unknown: treat as infeasible for the search, but no proof
            lo = mid + 1
    return SearchResult(best_order, hi, lo if proven else lb, proven and lo >= hi, 0)

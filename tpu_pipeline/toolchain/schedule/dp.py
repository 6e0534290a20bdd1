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
- The search runs in C (`_best_first.c`, through `native_search.py`) when a C compiler is at
  hand: the same states, moves and keys, about 20x the states per second. The Python version
  below is the fallback and the reference the tests hold the C one to.
- `budgeted_dp` + `bisect_budget` keep the paper's literal scheme (a memoised DFS under a budget,
  bisection between the proven lower bound and the known feasible peak, a time cap per try) for
  comparison; `schedule()` uses the best-first search.
"""

from __future__ import annotations

import heapq
import time

from tpu_pipeline.toolchain.schedule import native_search
from tpu_pipeline.toolchain.schedule.bounds.static import static_lower_bound
from tpu_pipeline.toolchain.schedule.forks import moves
from tpu_pipeline.toolchain.schedule.problem import Known, Piece, SearchResult, StageContext, units_to_ops


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
        max_states = state_cap(piece) if not (native and native_search.available()) else 2**62
    m = len(piece.units)
    static_lb = static_lower_bound(piece)
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
    if piece.model.final_only and piece.ends_graph:
        free_moves = False
    if native and native_search.available():
        return native_search.best_first(piece, ub, floor, static_lb, g0, deadline, max_states,
                                         MAX_STATE_BYTES, free_moves)
    return _python_best_first(piece, ub, floor, static_lb, g0, ready0, deadline, max_states, free_moves)


def _python_best_first(piece: Piece, ub: int, floor: int, static_lb: int, g0: int, ready0: tuple,
                       deadline: float | None, max_states: int, free_moves: bool) -> SearchResult:
    """best_first's search in Python (the reference of the C one): states are sets of units done."""
    full_u = (1 << len(piece.units)) - 1
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
        for ks in (moves(piece, U, ready, twins=True) if piece.lazy or piece.twin else [(k,) for k in ready]):
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
    return units_to_ops(piece, [k for ks in reversed(seq) for k in ks])


def short_search(piece: Piece, known: Known, until: float, ctx: StageContext) -> Known:
    """The stage that settles most pieces: the exact search for a short while (stages.py): its
    share of the time, or `try_states` states where it is not timed."""
    p = ctx.params
    cap = None if p.timed else min(p.try_states, state_cap(piece))
    r = best_first(piece, known.peak, known.floor, until, max_states=cap, free_moves=p.free_moves, native=p.native)
    return known.searched(r, "dp")


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

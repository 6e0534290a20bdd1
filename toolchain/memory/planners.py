"""Arena planners behind one interface: buffers with lifetimes and sizes in, an `ArenaPlan` out.

Every planner takes the buffers of a `Lifetimes` (inclusive [first, last] steps, sizes already
rounded to the runtime's alignment) and returns an `ArenaPlan` with one offset per buffer, the
arena size, the lower bound (the most bytes live at any one time: no placement needs fewer) and
whether the size is proven optimal. Every plan is checked by `check_plan` before it is returned.

Planners (`PLANNERS`):
- `tflm`, `tflite`: the runtimes' own planners, reproduced exactly (runtime_planners.py).
- `greedy-size`: largest first, each buffer into the smallest gap that fits (best fit).
- `greedy-conflicts`: most contended first (the largest live sum over the buffer's lifetime, then
  size), best fit.
- `search`: an exact depth-first search over canonical placements in the style of MiniMalloc
  (Moffitt, ASPLOS 2023): buffers are placed bottom-up at the lowest offset their placed neighbours
  allow, in non-decreasing offset order; partial plans are pruned when some section's floor plus
  the unplaced bytes there exceed the capacity, when they leave a gap another buffer would fill,
  and the problem splits in time wherever no unplaced buffer crosses. Given enough time it either
  finds a plan at the capacity or proves there is none.
- `cpsat`: OR-Tools CP-SAT, offsets as interval variables under a 2-D no-overlap with the fixed
  lifetimes, the arena size minimised, hinted with the best greedy plan, the lower bound enforced.
- `auto`: the greedy planners, then `search` at the lower bound, then (if the bound was not met)
  a binary search on the capacity and CP-SAT, all within the time limit; the smallest plan wins.

Bounds (large problems, e.g. 200,000 buffers). Time: every planner takes a `deadline`
(toolchain.budget.Deadline; the earlier of it and `time_limit` wins); `auto` first runs
`sweep_first_fit`, O(n log n + n k) for k buffers live at once, which always completes (past the
deadline it stacks the rest above everything placed, still a valid plan), then the greedy
portfolio, each greedy checking the clock every few thousand buffers and dropped unfinished when
time is up; the best complete plan wins. Memory: the overlap lists of the portfolio and the exact
search hold one entry per pair of buffers live together, so they are built only when there are at
most MAX_OVERLAP_PAIRS pairs (counted first in O(n log n)); beyond that only the sweep runs. Plans
of more than FAST_CHECK_ABOVE buffers are checked by `first_conflict`, an O(n log n) sweep,
instead of listing every problem with `check_plan`.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from toolchain import budget as _budget
from toolchain.budget import Deadline, Progress
from toolchain.errors import ModelError, UsageError
from toolchain.memory.lifetimes import Buffer, Lifetimes
from toolchain.memory.plan import ArenaPlan, arena_size, check_plan
from toolchain.memory.runtime_planners import tflite_arena, tflm_greedy

__all__ = [
    "PLANNERS", "plan_arena", "plan_buffers", "live_lower_bound", "greedy_by_size",
    "greedy_by_conflicts", "search_plan", "cpsat_plan", "OrderAndOffsets", "plan_order_and_offsets",
    "sweep_first_fit", "first_conflict",
]

MAX_OVERLAP_PAIRS = 3_000_000  # about 60 MB of overlap lists (two list entries per pair)
NATIVE_MAX_CELLS = 32_000_000  # the C search's slot table (4 bytes per buffer and section): 128 MB
FAST_CHECK_ABOVE = 20_000  # buffers: above this a plan is checked by the O(n log n) sweep
_CLOCK_EVERY = 2048  # buffers placed between two looks at the clock


# --------------------------------------------------------------------------------------------
# Shared helpers


def live_lower_bound(buffers: Sequence[Buffer]) -> int:
    """The most bytes live at any one time (a sweep, so any time coordinates work)."""
    events: dict[int, int] = {}
    for b in buffers:
        events[b.first] = events.get(b.first, 0) + b.size
        events[b.last + 1] = events.get(b.last + 1, 0) - b.size
    best = acc = 0
    for t in sorted(events):
        acc += events[t]
        best = max(best, acc)
    return best


def overlap_pairs(buffers: Sequence[Buffer]) -> int:
    """How many pairs of buffers have intersecting lifetimes, in O(n log n) (nothing listed)."""
    firsts = sorted(b.first for b in buffers)
    lasts = sorted(b.last for b in buffers)
    pairs = 0
    for k, f in enumerate(firsts):
        # buffers starting before this one (k of them, ties by position) minus those already over
        pairs += k - bisect.bisect_left(lasts, f)
    return pairs


def _overlap_lists(buffers: Sequence[Buffer], max_pairs: int | None = None) -> list[list[int]] | None:
    """For each buffer, the buffers whose lifetimes intersect its own (a sweep over starts);
    None when there are more than `max_pairs` such pairs (the lists would not fit in memory)."""
    if max_pairs is not None and overlap_pairs(buffers) > max_pairs:
        return None
    n = len(buffers)
    out: list[list[int]] = [[] for _ in range(n)]
    order = sorted(range(n), key=lambda i: (buffers[i].first, i))
    active: list[int] = []
    for i in order:
        b = buffers[i]
        active = [j for j in active if buffers[j].last >= b.first]
        for j in active:
            out[i].append(j)
            out[j].append(i)
        active.append(i)
    return out


def _place_in_order(buffers: Sequence[Buffer], order: Sequence[int], overlaps, best_fit: bool,
                    deadline: Deadline | None = None) -> list[int] | None:
    """Place buffers one by one: first fit (lowest gap) or best fit (smallest gap that fits).
    None if the deadline passes first."""
    offsets = [-1] * len(buffers)
    for k, i in enumerate(order):
        if deadline is not None and k % _CLOCK_EVERY == 0 and deadline.expired():
            return None
        size = buffers[i].size
        live = sorted((offsets[j], offsets[j] + buffers[j].size) for j in overlaps[i] if offsets[j] >= 0)
        cursor, best, best_gap = 0, None, None
        for start, end in live:
            gap = start - cursor
            if gap >= size:
                if not best_fit:
                    best = cursor
                    break
                if best_gap is None or gap < best_gap:
                    best, best_gap = cursor, gap
            cursor = max(cursor, end)
        offsets[i] = cursor if best is None else best
    return offsets


def _section_totals(buffers: Sequence[Buffer]) -> list[int]:
    """For each buffer, the largest live sum at any time within its lifetime."""
    points = sorted({b.first for b in buffers} | {b.last + 1 for b in buffers})
    index = {p: k for k, p in enumerate(points)}
    delta = [0] * (len(points) + 1)
    for b in buffers:
        delta[index[b.first]] += b.size
        delta[index[b.last + 1]] -= b.size
    live, acc = [], 0
    for d in delta[:-1]:
        acc += d
        live.append(acc)
    return [max(live[index[b.first]:index[b.last + 1]], default=b.size) for b in buffers]


# --------------------------------------------------------------------------------------------
# Greedy planners (each returns offsets)


def _native_sweep(buffers, order, deadline: Deadline | None):
    """The C sweep (in _canonical_search.c): (offsets, placed count) or None without a compiler."""
    import ctypes

    from toolchain.memory import _native

    lib = _native.load()
    if lib is None:
        return None
    fn = lib.sweep_first_fit
    i64 = ctypes.c_longlong
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(i64), ctypes.POINTER(i64),
                   ctypes.POINTER(i64), ctypes.c_double, ctypes.POINTER(i64)]
    n = len(buffers)
    m = max(n, 1)
    out = (i64 * m)()
    placed = fn(n, (ctypes.c_int * m)(*order), (i64 * m)(*(b.first for b in buffers)),
                (i64 * m)(*(b.last for b in buffers)), (i64 * m)(*(b.size for b in buffers)),
                1e9 if deadline is None else deadline.remaining(), out)
    return list(out)[:n], placed


def sweep_first_fit(buffers: Sequence[Buffer], deadline: Deadline | None = None) -> list[int]:
    """Buffers in order of their first step, each at the lowest gap among the buffers live then:
    O(n log n + n k) time and O(n) memory for k buffers live at once (in C when a compiler is
    available). Every pair that overlaps in time is separated when the later one is placed (the
    earlier is live then). Always returns a valid plan: past the deadline the remaining buffers
    are stacked above everything placed."""
    n = len(buffers)
    order = sorted(range(n), key=lambda i: (buffers[i].first, -buffers[i].size, i))
    native = _native_sweep(buffers, order, deadline)
    if native is not None:
        offsets, placed = native
        top = max((offsets[i] + buffers[i].size for i in order[:placed]), default=0)
        for j in order[placed:]:  # out of time: stack the rest, still sound
            offsets[j] = top
            top += buffers[j].size
        return offsets
    offsets = [0] * n
    live_off: list[int] = []  # offsets of the live buffers, ascending
    live_end: list[int] = []  # their ends, same order
    ending: list[tuple[int, int, int]] = []  # heap of (last step, offset, buffer)
    top = 0
    for k, i in enumerate(order):
        b = buffers[i]
        if k % _CLOCK_EVERY == 0 and deadline is not None and deadline.expired():
            for j in order[k:]:  # out of time: stack the rest, still sound
                offsets[j] = top
                top += buffers[j].size
            return offsets
        while ending and ending[0][0] < b.first:
            _, off, j = heapq.heappop(ending)
            p = bisect.bisect_left(live_off, off)
            while live_off[p] != off or live_end[p] != off + buffers[j].size:
                p += 1
            del live_off[p], live_end[p]
        cursor = 0
        for off, end in zip(live_off, live_end):
            if off - cursor >= b.size:
                break
            if end > cursor:
                cursor = end
        offsets[i] = cursor
        if b.size:
            p = bisect.bisect_right(live_off, cursor)
            live_off.insert(p, cursor)
            live_end.insert(p, cursor + b.size)
            heapq.heappush(ending, (b.last, cursor, i))
            top = max(top, cursor + b.size)
    return offsets


def first_conflict(buffers: Sequence[Buffer], offsets, alignment: int = 1) -> str | None:
    """The first problem with a plan, or None if it is sound; O(n log n) (a sweep in time over the
    live buffers kept sorted by offset).

    Why neighbours suffice: the live buffers are pairwise disjoint in bytes (each was checked when
    it arrived), so a new buffer at offset o overlaps one of them only if it overlaps the one with
    the largest offset <= o or the one with the smallest offset > o."""
    n = len(buffers)
    if len(offsets) != n:
        return f"{len(offsets)} offsets for {n} buffers"
    for i, (b, o) in enumerate(zip(buffers, offsets)):
        if o < 0:
            return f"buffer {i} ({b.name}) has negative offset {o}"
        if alignment > 1 and o % alignment:
            return f"buffer {i} ({b.name}) at offset {o} is not {alignment}-byte aligned"
    firsts = [b.first for b in buffers]
    order = sorted(range(n), key=firsts.__getitem__)
    keys: list[int] = []  # offset * n + buffer of the live buffers, ascending (plain ints sort fast)
    ending: list[tuple[int, int]] = []
    sizes = [b.size for b in buffers]
    for i in order:
        size = sizes[i]
        if not size:
            continue
        first = firsts[i]
        while ending and ending[0][0] < first:
            j = heapq.heappop(ending)[1]
            del keys[bisect.bisect_left(keys, offsets[j] * n + j)]
        o = offsets[i]
        key = o * n + i
        p = bisect.bisect_left(keys, key)
        for q in (p - 1, p):
            if 0 <= q < len(keys):
                j = keys[q] % n
                oj = offsets[j]
                if o < oj + sizes[j] and oj < o + size:
                    b, c = buffers[i], buffers[j]
                    return (f"buffers {j} ({c.name}) and {i} ({b.name}) overlap in time "
                            f"[{max(b.first, c.first)}, {min(b.last, c.last)}] and in bytes")
        keys.insert(p, key)
        heapq.heappush(ending, (buffers[i].last, i))
    return None


def greedy_by_size(buffers: Sequence[Buffer], overlaps=None, deadline: Deadline | None = None) -> list[int] | None:
    overlaps = overlaps or _overlap_lists(buffers)
    order = sorted(range(len(buffers)), key=lambda i: (-buffers[i].size, buffers[i].first, i))
    return _place_in_order(buffers, order, overlaps, True, deadline)


def greedy_by_conflicts(buffers: Sequence[Buffer], overlaps=None,
                        deadline: Deadline | None = None) -> list[int] | None:
    overlaps = overlaps or _overlap_lists(buffers)
    totals = _section_totals(buffers)
    order = sorted(range(len(buffers)), key=lambda i: (-totals[i], -buffers[i].size, buffers[i].first, i))
    return _place_in_order(buffers, order, overlaps, True, deadline)


def _greedy_portfolio(buffers: Sequence[Buffer], overlaps, deadline: Deadline | None = None,
                      progress: Progress = None) -> list[tuple[str, list[int]]]:
    """Cheap variants, each a (name, offsets): the named greedies plus a few more orders; the
    greedies not finished by the deadline are left out (possibly all of them)."""
    totals = _section_totals(buffers)
    n = len(buffers)
    area = [b.size * (b.last - b.first + 1) for b in buffers]
    out = []
    for name, fn in (("greedy-size", greedy_by_size), ("greedy-conflicts", greedy_by_conflicts)):
        offs = fn(buffers, overlaps, deadline)
        if offs is None:
            return out
        out.append((name, offs))
    extra = {
        "greedy-size-first-fit": (sorted(range(n), key=lambda i: (-buffers[i].size, buffers[i].first, i)), False),
        "greedy-conflicts-first-fit": (sorted(range(n), key=lambda i: (-totals[i], -buffers[i].size, i)), False),
        "greedy-area": (sorted(range(n), key=lambda i: (-area[i], -buffers[i].size, i)), True),
        "greedy-long": (sorted(range(n), key=lambda i: (-(buffers[i].last - buffers[i].first), -buffers[i].size, i)), True),
    }
    for name, (order, best_fit) in extra.items():
        offs = _place_in_order(buffers, order, overlaps, best_fit, deadline)
        if offs is None:
            break
        out.append((name, offs))
    if progress is not None:
        progress(f"plan: {len(out)} greedy plans for {n:,} buffers")
    return out


# --------------------------------------------------------------------------------------------
# Exact search over canonical placements (MiniMalloc-style)


class _Abort(Exception):
    """Raised inside the search when the node budget or the deadline is spent."""


class _Search:
    """Decide whether the buffers fit in `capacity` bytes; find such offsets if they do.

    Buffers occupy half-open time ranges [start, end). Time is cut into sections at every start
    and end. A buffer is only ever placed at its minimum offset (the top of the placed buffers it
    overlaps) and buffers are placed in non-decreasing offset order; ties broken by a static
    preorder. That space of "canonical" plans contains a plan at the capacity if any plan fits.
    """

    def __init__(self, starts, ends, sizes, capacity: int, deadline: float):
        self.n = n = len(sizes)
        self.sizes = list(sizes)
        self.cap = capacity
        self.deadline = deadline
        # Sections: the buffers alive just before an end time, one per end time that follows a
        # start (the others are subsets of the previous section). They cover every maximal set of
        # buffers alive together, and each buffer spans a contiguous run of them.
        events = sorted([(e, 0) for e in set(ends)] + [(s, 1) for s in set(starts)])
        times, started = [], False
        for t, kind in events:
            if kind == 1:
                started = True
            elif started:
                times.append(t)
                started = False
        import bisect

        self.lo = [bisect.bisect_right(times, s) for s in starts]  # first section time > start
        self.hi = [bisect.bisect_right(times, e) for e in ends]  # sections with time <= end
        self.width = [e - s for s, e in zip(starts, ends)]
        self.n_sec = len(times)
        self.sections: list[list[int]] = [[] for _ in range(self.n_sec)]
        for b in range(n):
            for s in range(self.lo[b], self.hi[b]):
                self.sections[s].append(b)
        self.overlaps: list[list[int]] = [[] for _ in range(n)]
        order = sorted(range(n), key=lambda b: (self.lo[b], b))
        active: list[int] = []
        for b in order:
            active = [a for a in active if self.hi[a] > self.lo[b]]
            for a in active:
                self.overlaps[a].append(b)
                self.overlaps[b].append(a)
            active.append(b)
        # cuts[s]: unplaced buffers crossing the boundary between sections s and s+1
        self.cuts = [0] * max(self.n_sec - 1, 0)
        for b in range(n):
            for s in range(self.lo[b], self.hi[b] - 1):
                self.cuts[s] += 1
        self.floor = [0] * self.n_sec
        self.total = [0] * self.n_sec
        for s, members in enumerate(self.sections):
            self.total[s] = sum(self.sizes[b] for b in members)
        self.offset = [-1] * n
        self.min_off = [0] * n
        self.solution = [-1] * n
        self.nodes_left = 0
        self.nodes = 0

    # The static preorders MiniMalloc rotates through: W = lifetime width, A = area, T = largest
    # section total the buffer sees.
    def _key(self, heuristic: str):
        def key(b):
            sec_total = max((self.total[s] for s in range(self.lo[b], self.hi[b])), default=0)
            values = {"W": self.width[b], "A": self.width[b] * self.sizes[b], "T": sec_total, "Z": self.sizes[b]}
            return tuple(-values[c] for c in heuristic) + (b,)
        return key

    def solve(self, heuristics=("WAT", "TAW", "TWA")) -> list[int] | None:
        """Offsets if a plan fits, None if proven that none does; raises _Abort on the deadline."""
        if any(s > self.cap for s in self.sizes) or any(t > self.cap for t in self.total):
            return None
        partitions = self._partitions()
        node_limit = max(self.n, 1)
        while True:
            node_limit *= 2
            exhausted_all = True
            for h in heuristics:
                self.nodes_left = node_limit
                try:
                    ok = all(self._sub_solve(bufs, lo, hi, h) for bufs, lo, hi in partitions)
                except _Abort:
                    self._reset()
                    if time.monotonic() > self.deadline:
                        raise
                    exhausted_all = False
                    continue
                if ok:
                    return list(self.solution)
                return None  # a complete search found nothing: proven infeasible
            if exhausted_all:  # pragma: no cover - every heuristic finished above
                return None

    def _reset(self) -> None:
        """Undo a search aborted midway (the exception skipped the restores)."""
        self.offset = [-1] * self.n
        self.min_off = [0] * self.n
        self.floor = [0] * self.n_sec
        for s, members in enumerate(self.sections):
            self.total[s] = sum(self.sizes[b] for b in members)
        self.cuts = [0] * max(self.n_sec - 1, 0)
        for b in range(self.n):
            for s in range(self.lo[b], self.hi[b] - 1):
                self.cuts[s] += 1

    def _partitions(self):
        out, start = [], 0
        for s in range(self.n_sec):
            if s == self.n_sec - 1 or self.cuts[s] == 0:
                bufs = sorted({b for k in range(start, s + 1) for b in self.sections[k]})
                if bufs:
                    out.append((bufs, start, s + 1))
                start = s + 1
        return out

    def _sub_solve(self, bufs, lo, hi, heuristic) -> bool:
        preorder = sorted(bufs, key=self._key(heuristic))
        return self._search(preorder, lo, hi, 0, 0, heuristic)

    def _search(self, preorder, lo, hi, min_offset, min_pre, heuristic) -> bool:
        self.nodes += 1
        self.nodes_left -= 1
        if self.nodes_left < 0 or (self.nodes & 63 == 0 and time.monotonic() > self.deadline):
            raise _Abort
        offset, min_off, sizes = self.offset, self.min_off, self.sizes
        ordering = [(min_off[b], p, b) for p, b in enumerate(preorder) if offset[b] < 0]
        if not ordering:
            for b in preorder:
                self.solution[b] = offset[b]
            return True
        ordering.sort()
        min_height = min(o + sizes[b] for o, _, b in ordering)
        for o, p, b in ordering:
            if o >= min_height:  # dominance: a gap below where another buffer would sit
                break
            if o < min_offset or (o == min_offset and p < min_pre):
                continue  # canonical: offsets never decrease along the placement order
            height = o + sizes[b]
            if height > self.cap:
                continue
            offset[b] = o
            changed = []
            for c in self.overlaps[b]:
                if offset[c] < 0 and min_off[c] < height:
                    changed.append((c, min_off[c]))
                    min_off[c] = height
            floors = []
            floor, total = self.floor, self.total
            for s in range(self.lo[b], self.hi[b]):
                floors.append((s, floor[s]))
                floor[s] = height
                total[s] -= sizes[b]
            # A section's floor is at least the lowest offset any unplaced buffer in it can take.
            affected = set()
            for c, _ in changed:
                affected.update(range(self.lo[c], self.hi[c]))
            sections = self.sections
            for s in affected:
                m = min((min_off[c] for c in sections[s] if offset[c] < 0), default=-1)
                if floor[s] < m:
                    floors.append((s, floor[s]))
                    floor[s] = m
            ok = True
            cap = self.cap
            for s in range(lo, hi):
                f = floor[s]
                if f < o:
                    f = o
                if f + total[s] > cap:
                    ok = False
                    break
            found = False
            if ok:
                found = self._decompose(preorder, lo, hi, o, p, b, heuristic)
            for s, f in reversed(floors):
                floor[s] = f
            for s in range(self.lo[b], self.hi[b]):
                total[s] += sizes[b]
            for c, m in reversed(changed):
                min_off[c] = m
            offset[b] = -1
            if found:
                return True
        return False

    def _decompose(self, preorder, lo, hi, o, p, b, heuristic) -> bool:
        self.solution[b] = o
        cuts = self.cuts
        points = [lo]
        for s in range(self.lo[b], self.hi[b] - 1):
            cuts[s] -= 1
            if cuts[s] == 0:
                points.append(s + 1)
        try:
            if len(points) == 1:
                return self._search(preorder, lo, hi, o, p, heuristic)
            points.append(hi)
            for a, z in zip(points, points[1:]):
                bufs = [c for c in preorder if self.offset[c] < 0 and self.lo[c] < z and a < self.hi[c]]
                if bufs and not self._sub_solve(bufs, a, z, heuristic):
                    return False
            return True
        finally:
            for s in range(self.lo[b], self.hi[b] - 1):
                cuts[s] += 1


def search_plan(buffers: Sequence[Buffer], capacity: int, time_limit: float = 5.0, native: bool = True):
    """Offsets fitting `capacity` (list), None if proven impossible, or "timeout".

    Uses the compiled search (`_native`) when a C compiler is available, else the Python one.
    """
    if not buffers:
        return []
    if overlap_pairs(buffers) > MAX_OVERLAP_PAIRS:
        return "timeout"  # its overlap lists and sections would not fit in memory: nothing proven
    starts = [b.first for b in buffers]
    ends = [b.last + 1 for b in buffers]
    g = 0
    for b in buffers:
        g = math.gcd(g, b.size)
    g = g or 1
    sizes = [b.size // g for b in buffers]
    s = _Search(starts, ends, sizes, capacity // g, time.monotonic() + time_limit)
    if native:
        from toolchain.memory import _native

        if _native.load() is not None:
            if len(sizes) * max(s.n_sec, 1) > NATIVE_MAX_CELLS:  # its per-section slot table is n x sections
                return "timeout"
            status, offsets, _ = _native.canonical_search(s.lo, s.hi, sizes, s.width, s.sections, s.overlaps,
                                                          capacity // g, time_limit)
            if status == -1:
                return "timeout"
            return None if offsets is None else [o * g for o in offsets]
    try:
        result = s.solve()
    except _Abort:
        return "timeout"
    return None if result is None else [o * g for o in result]


# --------------------------------------------------------------------------------------------
# CP-SAT


def cpsat_plan(buffers: Sequence[Buffer], time_limit: float = 5.0, hint: Sequence[int] | None = None,
               lower_bound: int = 0, upper_bound: int | None = None, seed: int = 0, workers: int = 2):
    """Minimise the arena with CP-SAT. Returns (offsets or None, size, proven_lower_bound, optimal)."""
    from ortools.sat.python import cp_model

    from toolchain.cpsat import new_solver

    n = len(buffers)
    if n == 0:
        return [], 0, 0, True
    g = 0
    for b in buffers:
        g = math.gcd(g, b.size)
    g = g or 1
    sizes = [b.size // g for b in buffers]
    ub = (upper_bound // g) if upper_bound else sum(sizes)
    lb = -(-lower_bound // g)
    m = cp_model.CpModel()
    z = m.new_int_var(max(lb, max(sizes)), ub, "arena")
    xs, ys = [], []
    for i, b in enumerate(buffers):
        off = m.new_int_var(0, ub - sizes[i], f"o{i}")
        ys.append(m.new_interval_var(off, sizes[i], off + sizes[i], f"y{i}"))
        xs.append(m.new_fixed_size_interval_var(b.first, b.last - b.first + 1, f"x{i}"))
        m.add(off + sizes[i] <= z)
        if hint is not None:
            m.add_hint(off, hint[i] // g)
    m.add_no_overlap_2d(xs, ys)
    # Symmetry: flipping a plan upside down is a plan; keep the largest buffer in the lower half.
    big = max(range(n), key=lambda i: (sizes[i], -i))
    m.add(2 * ys[big].start_expr() + sizes[big] <= z)
    # Identical buffers (same lifetime and size) are interchangeable: order their offsets.
    seen: dict[tuple[int, int, int], int] = {}
    for i, b in enumerate(buffers):
        key = (b.first, b.last, sizes[i])
        if key in seen:
            m.add(ys[seen[key]].start_expr() + sizes[i] <= ys[i].start_expr())
        seen[key] = i
    if hint is not None:
        m.add_hint(z, max(h // g + s for h, s in zip(hint, sizes)))
    m.minimize(z)
    solver = new_solver(max(0.05, time_limit), min(2, workers), seed)
    solver.parameters.log_search_progress = False
    status = solver.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = int(solver.best_objective_bound) * g if status == cp_model.UNKNOWN else lower_bound
        return None, None, max(lower_bound, bound if status == cp_model.UNKNOWN else 0), False
    offsets = [solver.value(ys[i].start_expr()) * g for i in range(n)]
    size = int(solver.value(z)) * g
    bound = max(lower_bound, int(math.ceil(solver.best_objective_bound)) * g)
    return offsets, size, bound, status == cp_model.OPTIMAL


# --------------------------------------------------------------------------------------------
# The interface


def _as_buffers(lifetimes_or_buffers) -> tuple[Buffer, ...]:
    if isinstance(lifetimes_or_buffers, Lifetimes):
        return lifetimes_or_buffers.buffers
    return tuple(lifetimes_or_buffers)


def _finish(bufs, offsets, lb, name, t0, proven=False, alignment=1) -> ArenaPlan:
    if len(bufs) > FAST_CHECK_ABOVE:
        problem = first_conflict(bufs, offsets, alignment)
    else:
        problems = check_plan(bufs, offsets, alignment)
        problem = problems[0] if problems else None
    if problem:  # a planner bug: never hand out an unsound plan
        raise AssertionError(f"planner {name} produced an unsound plan: {problem}")
    size = arena_size(bufs, offsets)
    return ArenaPlan(tuple(int(o) for o in offsets), size, lb, name, proven or size == lb,
                     time.monotonic() - t0)


def _plan_auto(bufs, lb, dl: Deadline, t0, alignment, progress: Progress = None) -> ArenaPlan:
    # probes overshoot their limits slightly: stay inside ours
    deadline = dl.end - 0.07 * max(0.0, dl.end - t0)
    inner = Deadline.at(deadline)
    candidates = [("sweep-first-fit", sweep_first_fit(bufs, inner))]
    _budget.say(progress, t0, f"plan: sweep first fit of {len(bufs):,} buffers done")
    overlaps = None
    if not inner.expired():
        overlaps = _overlap_lists(bufs, MAX_OVERLAP_PAIRS)
        if overlaps is None:
            _budget.say(progress, t0, f"plan: more than {MAX_OVERLAP_PAIRS:,} overlapping pairs; "
                                      "only the sweep runs")
    if overlaps is not None:
        candidates += _greedy_portfolio(bufs, overlaps, inner, progress)
    name, best = min(candidates, key=lambda c: (arena_size(bufs, c[1]), c[0]))
    best_size = arena_size(bufs, best)
    if best_size == lb:
        return _finish(bufs, best, lb, name, t0, True, alignment)
    if overlaps is None or inner.expired():
        return _finish(bufs, best, lb, name, t0, False, alignment)
    # Exact search at the lower bound: most instances fit exactly there.
    found = search_plan(bufs, lb, max(0.0, 0.4 * (deadline - time.monotonic())))
    if isinstance(found, list):
        return _finish(bufs, found, lb, "search", t0, True, alignment)
    g = 0
    for b in bufs:
        g = math.gcd(g, b.size)
    g = max(g, 1)
    proven_lb = lb + g if found is None else lb
    # Binary search on the capacity between the last failure and the best plan so far; a probe
    # that runs out of time counts as a failure but proves nothing.
    failed = lb
    while best_size - failed > g and time.monotonic() < deadline - 0.05:
        mid = max(failed + g, (failed + best_size) // 2 // g * g)
        if mid >= best_size:
            break
        r = search_plan(bufs, mid, max(0.0, 0.25 * (deadline - time.monotonic())))
        if isinstance(r, list):
            best, best_size, name = r, arena_size(bufs, r), "search"
        else:
            failed = mid
            if r is None:
                proven_lb = max(proven_lb, mid + g)
    if best_size <= proven_lb:
        return _finish(bufs, best, best_size, name, t0, True, alignment)
    remaining = deadline - time.monotonic() - 0.1 - 0.002 * len(bufs)  # building the model takes time too
    if remaining > 0.5:
        offsets, size, bound, optimal = cpsat_plan(bufs, remaining, hint=best, lower_bound=proven_lb,
                                                   upper_bound=best_size)
        proven_lb = max(proven_lb, bound)
        if offsets is not None and size < best_size:
            best, best_size, name = offsets, size, "cpsat"
        if optimal:
            proven_lb = max(proven_lb, best_size)
    return _finish(bufs, best, proven_lb, name, t0, best_size <= proven_lb, alignment)


PLANNERS = ("auto", "search", "cpsat", "greedy-size", "greedy-conflicts", "tflm", "tflite")


def plan_buffers(buffers, planner: str = "auto", time_limit: float | None = 5.0, alignment: int = 1, *,
                 deadline: Deadline | None = None, progress: Progress = None) -> ArenaPlan:
    """Plan offsets for arbitrary buffers (inclusive [first, last] lifetimes).

    Bounded by the earlier of `time_limit` (None: the deadline alone) and `deadline`; returns a
    checked plan within budget.SLACK of it plus the linear work of a sweep and the check (see the
    module docstring). `progress(msg)` hears a line per stage of `auto`."""
    t0 = time.monotonic()
    dl = _budget.resolve(time_limit, deadline)
    time_limit = dl.remaining()
    bufs = _as_buffers(buffers)
    lb = live_lower_bound(bufs)
    if not bufs:
        return ArenaPlan((), 0, 0, planner, True, 0.0)
    if planner == "auto":
        return _plan_auto(bufs, lb, dl, t0, alignment, progress)
    if planner in ("greedy-size", "greedy-conflicts"):
        overlaps = _overlap_lists(bufs, MAX_OVERLAP_PAIRS)
        fn = greedy_by_size if planner == "greedy-size" else greedy_by_conflicts
        offsets = fn(bufs, overlaps, dl) if overlaps is not None else None
        if offsets is None:  # too many overlaps to list, or out of time: the bounded sweep
            return _finish(bufs, sweep_first_fit(bufs, dl), lb, f"{planner}(sweep fallback)", t0,
                           alignment=alignment)
        return _finish(bufs, offsets, lb, planner, t0, alignment=alignment)
    if planner in ("tflm", "tflite"):
        n_steps = max(b.last for b in bufs) + 1
        lt = Lifetimes(bufs, n_steps)
        plan = tflm_greedy(lt) if planner == "tflm" else tflite_arena(lt, alignment=max(alignment, 1))
        return _finish(bufs, plan.offsets, lb, planner, t0, alignment=alignment)
    if planner == "search":
        found = search_plan(bufs, lb, time_limit)
        if isinstance(found, list):
            return _finish(bufs, found, lb, planner, t0, True, alignment)
        # Not at the bound: fall back to the best greedy, honestly labelled.
        overlaps = _overlap_lists(bufs, MAX_OVERLAP_PAIRS)
        offsets = greedy_by_size(bufs, overlaps) if overlaps is not None else sweep_first_fit(bufs)
        return _finish(bufs, offsets, lb + (1 if found is None else 0), "search(greedy fallback)", t0,
                       alignment=alignment)
    if planner == "cpsat":
        overlaps = _overlap_lists(bufs, MAX_OVERLAP_PAIRS)
        hints = [sweep_first_fit(bufs)] + ([c[1] for c in _greedy_portfolio(bufs, overlaps, dl)] if overlaps else [])
        hint = min(hints, key=lambda o: arena_size(bufs, o))
        offsets, size, bound, optimal = cpsat_plan(bufs, max(0.05, dl.remaining()), hint=hint, lower_bound=lb,
                                                   upper_bound=arena_size(bufs, hint))
        if offsets is None or size > arena_size(bufs, hint):
            offsets = hint
        return _finish(bufs, offsets, max(lb, bound), planner, t0, optimal, alignment)
    raise UsageError(f"unknown planner '{planner}' (choose from {', '.join(PLANNERS)})")


def plan_arena(lifetimes: Lifetimes, planner: str = "auto", time_limit: float | None = 5.0, *,
               deadline: Deadline | None = None, progress: Progress = None) -> ArenaPlan:
    """The best plan `planner` finds for these lifetimes within `time_limit` seconds (and before
    `deadline`, whichever ends first), checked.

    `lower_bound` is the most bytes live at once (raised when a solver proves more are needed);
    `proven_optimal` is true when the size equals a proven lower bound.
    """
    return plan_buffers(lifetimes, planner, time_limit, deadline=deadline, progress=progress)


# --------------------------------------------------------------------------------------------
# TFLite Micro's offline plan


@dataclass(frozen=True)
class OfflinePlan:
    """Offsets for TFLite Micro and what it will then allocate.

    `tensor_offsets` has one entry per tensor of all subgraphs (subgraph 0 first, as TFLM counts
    them), -1 for constants, scratch and anything left to the runtime. `head` is the arena head
    TFLite Micro's planner produces with these offsets pinned (scratch buffers it still places
    online, first fit, after the pinned ones), `buffer_offsets` where every buffer then sits.
    """

    tensor_offsets: tuple[int, ...]
    head: int
    buffer_offsets: tuple[int, ...]
    plan: ArenaPlan


def offline_plan(model, lifetimes: Lifetimes, plan: ArenaPlan) -> OfflinePlan:
    """Turn a plan of `lifetimes` (of subgraph 0 of `model`, TFLM semantics) into TFLM's offsets.

    The pinned tensors go where `plan` puts them; scratch buffers cannot be pinned, so the result
    is simulated with TFLM's own planner (`tflm_greedy` with the offline offsets), which places
    them first fit among the pinned buffers: `head` is what the real runtime will report.
    """
    from toolchain.tflite.metadata import total_tensor_count

    bufs = lifetimes.buffers
    n_total = total_tensor_count(model)
    tensor_offsets = [-1] * n_total
    pinned = [-1] * len(bufs)
    for i, b in enumerate(bufs):
        if b.tensor is not None:
            tensor_offsets[b.tensor] = plan.offsets[i]
            pinned[i] = plan.offsets[i]
    sim = tflm_greedy(lifetimes, offline=pinned)
    return OfflinePlan(tuple(tensor_offsets), sim.size, sim.offsets, plan)


def plan_for_tflm(model, graph, lifetimes_: Lifetimes | None = None, planner: str = "auto",
                  time_limit: float | None = 5.0, *, deadline: Deadline | None = None,
                  progress: Progress = None) -> OfflinePlan:
    """Plan subgraph 0 of `model` (`graph` = its IR) for TFLite Micro and pin the result.

    Where the runtime's online placement of scratch buffers would push the head above the plan,
    the plan is repaired by re-planning with the scratch buffers held where TFLM puts them, and
    the smaller of that and TFLM's own plan is kept (never worse than no offline plan).
    """
    from toolchain.memory.lifetimes import lifetimes as _lifetimes

    if len(model.subgraphs) > 1:
        # TFLM plans the tensors of every subgraph (WHILE/IF bodies) in one arena; we model the
        # main subgraph only, so a plan here could not be held to the byte.
        raise ModelError(f"the model has {len(model.subgraphs)} subgraphs (control flow); an offline memory plan "
                         "is only written for single-subgraph models")
    lt = lifetimes_ or _lifetimes(graph, semantics="tflm")
    t0 = time.monotonic()
    plan = plan_arena(lt, planner, time_limit, deadline=deadline, progress=progress)
    result = offline_plan(model, lt, plan)
    if result.head > plan.size:
        # Scratch buffers moved: the sound plan is where TFLM puts everything; keep it if smaller
        # than the runtime's own plan.
        fixed = _finish(lt.buffers, result.buffer_offsets, plan.lower_bound, plan.planner + "+tflm-scratch", t0,
                        alignment=16)
        result = OfflinePlan(result.tensor_offsets, result.head, result.buffer_offsets, fixed)
    own = tflm_greedy(lt)
    if own.size < result.head:  # our planner lost to TFLM's: leave everything online
        fallback = ArenaPlan(own.offsets, own.size, plan.lower_bound, "tflm", own.size <= plan.lower_bound,
                             time.monotonic() - t0)
        result = OfflinePlan(tuple([-1] * len(result.tensor_offsets)), own.size, own.offsets, fallback)
    return result


# --------------------------------------------------------------------------------------------
# Order and offsets together


@dataclass(frozen=True)
class OrderAndOffsets:
    order: tuple[int, ...]  # positions into graph.ops
    peak: int  # most bytes live at once under `order`
    plan: ArenaPlan  # offsets for lifetimes(graph, order, semantics).buffers
    source: str  # which candidate order won ("schedule", "stored", "schedule:<method>")
    tried: tuple[tuple[str, int, int], ...]  # (candidate, peak, planned arena) for each order tried


def plan_order_and_offsets(graph, schedule_result=None, semantics: str = "tflm", planner: str = "auto",
                           time_limit: float = 5.0) -> OrderAndOffsets:
    """Plan offsets for the scheduler's order; when the arena lands above that order's peak, try
    the other orders that are cheap to get (the stored order, the scheduler's other methods) and
    keep the order whose planned arena is smallest (ties: the smaller peak, then the first tried).

    `schedule_result` is a `toolchain.schedule.Schedule` (anything with `.order`); None means
    the stored order. The scheduler is imported lazily.
    """
    from toolchain.memory.lifetimes import lifetimes as _lifetimes

    t0 = time.monotonic()
    deadline = t0 + time_limit
    n = len(graph.ops)
    candidates: list[tuple[str, tuple[int, ...]]] = []
    if schedule_result is not None:
        candidates.append(("schedule", tuple(schedule_result.order)))
    candidates.append(("stored", tuple(range(n))))
    tried: list[tuple[str, int, int]] = []
    best = None
    seen: set[tuple[int, ...]] = set()

    def consider(name, order, share):
        nonlocal best
        if order in seen:
            return
        seen.add(order)
        lt = _lifetimes(graph, order, semantics)
        plan = plan_arena(lt, planner, max(0.05, share))
        tried.append((name, lt.peak, plan.size))
        key = (plan.size, lt.peak)
        if best is None or key < best[0]:
            best = (key, name, order, lt.peak, plan)

    first_share = time_limit * (0.5 if len(candidates) > 1 else 1.0)
    consider(*candidates[0], first_share)
    if best[4].size > best[3]:  # the arena exceeds the peak: look at other orders
        extra = list(candidates[1:])
        try:
            from toolchain.schedule import schedule as _schedule
        except ImportError:  # pragma: no cover - the scheduler is part of the package
            _schedule = None
        if _schedule is not None:
            for method in ("greedy", "dp", "cpsat"):
                left = deadline - time.monotonic()
                if left < 0.5:
                    break
                try:
                    s = _schedule(graph, method=method, time_limit=max(0.2, left / 4), semantics=semantics)
                except (UsageError, ValueError):
                    continue
                extra.append((f"schedule:{method}", tuple(s.order)))
        for name, order in extra:
            left = deadline - time.monotonic()
            if left <= 0.05 or best[4].size <= best[3]:
                break
            consider(name, order, left / 2)
    _, name, order, peak, plan = best
    return OrderAndOffsets(order, peak, plan, name, tuple(tried))

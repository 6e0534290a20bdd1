"""Exact search over canonical placements, in the style of MiniMalloc (Moffitt, ASPLOS 2023).

Buffers are placed bottom-up, each at the lowest offset its placed neighbours allow, in
non-decreasing offset order (ties by a static preorder); that space of "canonical" plans holds a
plan at the capacity if any plan fits. Partial plans are pruned when some section's floor plus the
unplaced bytes there exceed the capacity and when they leave a gap another buffer would fill, and
the problem splits in time wherever no unplaced buffer crosses. Each of those prunings is a switch
of `SearchParams` (all on by default; the compiled search implements exactly the default).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from tpu_pipeline.toolchain.memory.lifetimes import Buffer
from tpu_pipeline.toolchain.memory.preprocess import MAX_OVERLAP_PAIRS, Sections, overlap_pairs, sections as _sections

NATIVE_MAX_CELLS = 32_000_000  # the C search's slot table (4 bytes per buffer and section): 128 MB


@dataclass(frozen=True)
class SearchParams:
    # The static preorders rotated through: W = lifetime width, A = area, T = the largest section
    # total the buffer sees, Z = size.
    heuristics: tuple[str, ...] = ("WAT", "TAW", "TWA")
    native: bool = True  # the compiled search when a C compiler is available (default switches only)
    canonical: bool = True  # offsets never decrease along the placement order
    dominance: bool = True  # never leave a gap below where another buffer would sit
    section_bound: bool = True  # a section's floor plus its unplaced bytes must fit the capacity
    decompose: bool = True  # solve independently on either side of a time with nothing crossing

    @property
    def default_pruning(self) -> bool:
        return self.canonical and self.dominance and self.section_bound and self.decompose


class _Abort(Exception):
    """Raised inside the search when the node budget or the deadline is spent."""


class _Search:
    """Decide whether the buffers of `sec` fit in `capacity` units; find such offsets if they do."""

    def __init__(self, sec: Sections, capacity: int, deadline: float, params: SearchParams):
        self.n = len(sec.sizes)
        self.sizes, self.lo, self.hi, self.width = sec.sizes, sec.lo, sec.hi, sec.width
        self.sections, self.overlaps, self.n_sec = sec.members, sec.overlaps, sec.n_sec
        self.cap = capacity
        self.deadline = deadline
        self.params = params
        self.solution = [-1] * self.n
        self.nodes_left = 0
        self.nodes = 0
        self._reset()

    def _reset(self) -> None:
        """The state before any placement (also: undo a search aborted midway, whose exception
        skipped the restores)."""
        self.offset = [-1] * self.n
        self.min_off = [0] * self.n
        self.floor = [0] * self.n_sec
        self.total = [sum(self.sizes[b] for b in members) for members in self.sections]
        # cuts[s]: unplaced buffers crossing the boundary between sections s and s+1
        self.cuts = [0] * max(self.n_sec - 1, 0)
        for b in range(self.n):
            for s in range(self.lo[b], self.hi[b] - 1):
                self.cuts[s] += 1

    def _key(self, heuristic: str):
        def key(b):
            sec_total = max((self.total[s] for s in range(self.lo[b], self.hi[b])), default=0)
            values = {"W": self.width[b], "A": self.width[b] * self.sizes[b], "T": sec_total, "Z": self.sizes[b]}
            return tuple(-values[c] for c in heuristic) + (b,)
        return key

    def solve(self) -> list[int] | None:
        """Offsets if a plan fits, None if proven that none does; raises _Abort on the deadline."""
        if any(s > self.cap for s in self.sizes) or any(t > self.cap for t in self.total):
            return None
        partitions = self._partitions()
        node_limit = max(self.n, 1)
        while True:
            node_limit *= 2
            for h in self.params.heuristics:
                self.nodes_left = node_limit
                try:
                    ok = all(self._sub_solve(bufs, lo, hi, h) for bufs, lo, hi in partitions)
                except _Abort:
                    self._reset()
                    if time.monotonic() > self.deadline:
                        raise
                    continue
                return list(self.solution) if ok else None  # a complete search: found, or proven none

    def _partitions(self):
        if not self.params.decompose:
            return [(list(range(self.n)), 0, self.n_sec)] if self.n else []
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
        offset, min_off, sizes, params = self.offset, self.min_off, self.sizes, self.params
        ordering = [(min_off[b], p, b) for p, b in enumerate(preorder) if offset[b] < 0]
        if not ordering:
            for b in preorder:
                self.solution[b] = offset[b]
            return True
        ordering.sort()
        min_height = min(o + sizes[b] for o, _, b in ordering)
        for o, p, b in ordering:
            if params.dominance and o >= min_height:  # a gap below where another buffer would sit
                break
            if params.canonical and (o < min_offset or (o == min_offset and p < min_pre)):
                continue  # offsets never decrease along the placement order
            if o + sizes[b] > self.cap:
                continue
            undo = self._place(b, o)
            # place, recurse, undo: the recursion stays in this frame (depth 2 per buffer placed)
            found = (not params.section_bound or self._fits(lo, hi, o)) and \
                self._decompose(preorder, lo, hi, o, p, b, heuristic)
            self._unplace(b, undo)
            if found:
                return True
        return False

    def _place(self, b, o):
        """Put buffer b at offset o; what `_unplace` needs to restore the state."""
        sizes, offset, min_off = self.sizes, self.offset, self.min_off
        height = o + sizes[b]
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
        return changed, floors

    def _unplace(self, b, undo) -> None:
        changed, floors = undo
        floor, total, sizes = self.floor, self.total, self.sizes
        for s, f in reversed(floors):
            floor[s] = f
        for s in range(self.lo[b], self.hi[b]):
            total[s] += sizes[b]
        for c, m in reversed(changed):
            self.min_off[c] = m
        self.offset[b] = -1

    def _fits(self, lo, hi, o) -> bool:
        """Every section in [lo, hi): its floor (at least o) plus its unplaced bytes fit."""
        floor, total, cap = self.floor, self.total, self.cap
        for s in range(lo, hi):
            f = floor[s]
            if f < o:
                f = o
            if f + total[s] > cap:
                return False
        return True

    def _decompose(self, preorder, lo, hi, o, p, b, heuristic) -> bool:
        self.solution[b] = o
        cuts = self.cuts
        points = [lo]
        for s in range(self.lo[b], self.hi[b] - 1):
            cuts[s] -= 1
            if cuts[s] == 0 and self.params.decompose:
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


def search_plan(buffers: Sequence[Buffer], capacity: int, time_limit: float = 5.0, native: bool = True, *,
                params: SearchParams | None = None, prepared: Sections | None = None):
    """Offsets fitting `capacity` (list), None if proven impossible, or "timeout".

    Uses the compiled search (`native_search`) when a C compiler is available and the pruning switches
    are the default, else the Python one. `prepared` = `preprocess.sections(buffers)`, when the
    caller asks about several capacities (it is then trusted to fit in memory).
    """
    if not buffers:
        return []
    params = params or SearchParams(native=native)
    if prepared is None:
        if overlap_pairs(buffers) > MAX_OVERLAP_PAIRS:
            return "timeout"  # its overlap lists and sections would not fit in memory: nothing proven
        prepared = _sections(buffers)
    g = prepared.unit
    s = _Search(prepared, capacity // g, time.monotonic() + time_limit, params)
    if params.native and params.default_pruning and params.heuristics == SearchParams.heuristics:
        from tpu_pipeline.toolchain.memory import native_search

        if native_search.load() is not None:
            if len(prepared.sizes) * max(s.n_sec, 1) > NATIVE_MAX_CELLS:  # its slot table is n x sections
                return "timeout"
            status, offsets, _ = native_search.canonical_search(s.lo, s.hi, s.sizes, s.width, s.sections, s.overlaps,
                                                          capacity // g, time_limit)
            if status == -1:
                return "timeout"
            return None if offsets is None else [o * g for o in offsets]
    try:
        result = s.solve()
    except _Abort:
        return "timeout"
    return None if result is None else [o * g for o in result]

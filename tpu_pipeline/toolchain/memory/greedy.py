"""Greedy arena planners: each places buffers one at a time in some order, first fit (the lowest
gap that fits among the placed buffers it overlaps in time) or best fit (the smallest such gap).

`sweep_first_fit` needs no overlap lists (O(n log n + n k) time, O(n) memory, k buffers live at
once) and always completes; the others take the overlap lists of `preprocess.overlap_lists`, check
the clock every few thousand buffers and return None when the deadline passes first.
"""

from __future__ import annotations

import bisect
import heapq
from typing import Sequence

from tpu_pipeline.toolchain.budget import Deadline, Progress
from tpu_pipeline.toolchain.memory.lifetimes import Buffer
from tpu_pipeline.toolchain.memory.preprocess import overlap_lists, section_totals

_CLOCK_EVERY = 2048  # buffers placed between two looks at the clock


def place_in_order(buffers: Sequence[Buffer], order: Sequence[int], overlaps, best_fit: bool,
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


def _native_sweep(buffers, order, deadline: Deadline | None):
    """The C sweep: (offsets, placed count), or None without a compiler."""
    from tpu_pipeline.toolchain.memory import native_search

    if native_search.load() is None:
        return None
    return native_search.sweep_first_fit(order, [b.first for b in buffers], [b.last for b in buffers],
                                   [b.size for b in buffers], 1e9 if deadline is None else deadline.remaining())


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


def greedy_by_size(buffers: Sequence[Buffer], overlaps=None, deadline: Deadline | None = None) -> list[int] | None:
    overlaps = overlaps or overlap_lists(buffers)
    order = sorted(range(len(buffers)), key=lambda i: (-buffers[i].size, buffers[i].first, i))
    return place_in_order(buffers, order, overlaps, True, deadline)


def greedy_by_conflicts(buffers: Sequence[Buffer], overlaps=None,
                        deadline: Deadline | None = None) -> list[int] | None:
    overlaps = overlaps or overlap_lists(buffers)
    totals = section_totals(buffers)
    order = sorted(range(len(buffers)), key=lambda i: (-totals[i], -buffers[i].size, buffers[i].first, i))
    return place_in_order(buffers, order, overlaps, True, deadline)


def greedy_portfolio(buffers: Sequence[Buffer], overlaps, deadline: Deadline | None = None,
                      progress: Progress = None) -> list[tuple[str, list[int]]]:
    """Cheap variants, each a (name, offsets): the named greedies plus a few more orders; the
    greedies not finished by the deadline are left out (possibly all of them)."""
    totals = section_totals(buffers)
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
        offs = place_in_order(buffers, order, overlaps, best_fit, deadline)
        if offs is None:
            break
        out.append((name, offs))
    if progress is not None:
        progress(f"plan: {len(out)} greedy plans for {n:,} buffers")
    return out


# ---- rigid groups (overlapped ops: lifetimes.Buffer.group) -------------------------------------------
def composites(buffers: Sequence[Buffer]) -> list[list[tuple[int, int]]]:
    """The placement units: each rigid group as its (buffer, offset from the group's base) list,
    every other buffer alone at 0."""
    groups: dict[int, list[tuple[int, int]]] = {}
    units = []
    for i, b in enumerate(buffers):
        if b.group >= 0:
            if b.group not in groups:
                groups[b.group] = []
                units.append(groups[b.group])
            groups[b.group].append((i, b.group_offset))
        else:
            units.append([(i, 0)])
    return units


def place_composites(buffers: Sequence[Buffer], units, order: Sequence[int], overlaps,
                     deadline: Deadline | None = None) -> list[int] | None:
    """First fit of whole units, in `order`: the lowest base at which every member fits among the
    placed buffers it overlaps in time. None if the deadline passes first."""
    offsets = [-1] * len(buffers)
    for k, u in enumerate(order):
        if deadline is not None and k % _CLOCK_EVERY == 0 and deadline.expired():
            return None
        members = units[u]
        placed = [[(offsets[j], offsets[j] + buffers[j].size) for j in overlaps[i] if offsets[j] >= 0]
                  for i, _ in members]
        low = max(-rel for _, rel in members)  # every member at a non-negative offset
        candidates = {low} | {end - rel for (_, rel), spans in zip(members, placed) for _, end in spans}
        for base in sorted(c for c in candidates if c >= low):
            if all(not (start < base + rel + buffers[i].size and base + rel < end)
                   for (i, rel), spans in zip(members, placed) for start, end in spans):
                break
        for i, rel in members:
            offsets[i] = base + rel
    return offsets


def grouped_portfolio(buffers: Sequence[Buffer], overlaps, deadline: Deadline | None = None):
    """First-fit plans of the units in a few orders: [(name, offsets)], unfinished ones left out."""
    units = composites(buffers)
    totals = section_totals(buffers)
    size = [max(buffers[i].size for i, _ in u) for u in units]
    contended = [max(totals[i] for i, _ in u) for u in units]
    first = [min(buffers[i].first for i, _ in u) for u in units]
    orders = {
        "groups-size": sorted(range(len(units)), key=lambda u: (-size[u], first[u], u)),
        "groups-conflicts": sorted(range(len(units)), key=lambda u: (-contended[u], -size[u], u)),
        "groups-first": sorted(range(len(units)), key=lambda u: (first[u], -size[u], u)),
    }
    out = []
    for name, order in orders.items():
        offs = place_composites(buffers, units, order, overlaps, deadline)
        if offs is None:
            break
        out.append((name, offs))
    return out

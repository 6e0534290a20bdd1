"""What every planner needs to know about a set of buffers, computed once: the live-bytes lower
bound, which buffers share time (counted cheaply first, listed only when that fits in memory),
the largest live sum each buffer sees, the common size unit, and the exact search's time sections.

Buffers have inclusive [first, last] lifetimes (see `tpu_pipeline.toolchain.memory.lifetimes.Buffer`).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Sequence

from tpu_pipeline.toolchain.memory.lifetimes import Buffer

MAX_OVERLAP_PAIRS = 3_000_000  # about 60 MB of overlap lists (two list entries per pair)


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


def overlap_lists(buffers: Sequence[Buffer], max_pairs: int | None = None) -> list[list[int]] | None:
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


def section_totals(buffers: Sequence[Buffer]) -> list[int]:
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


def size_unit(buffers: Sequence[Buffer]) -> int:
    """The greatest common divisor of the sizes (1 when there is none): the exact planners work
    in these units, and no arena size between two multiples of it can be the optimum."""
    g = 0
    for b in buffers:
        g = math.gcd(g, b.size)
    return g or 1


@dataclass(frozen=True)
class Sections:
    """The exact search's view of a problem, independent of the capacity it is asked about.

    Buffers occupy half-open time ranges [start, end). Time is cut at the end times that follow a
    start: section s holds the buffers alive just before its end time. The sections cover every
    maximal set of buffers alive together, and buffer b spans the contiguous run lo[b] .. hi[b]-1.
    Sizes are in units of `unit` bytes.
    """

    unit: int
    sizes: tuple[int, ...]
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    width: tuple[int, ...]  # lifetime length
    members: tuple[tuple[int, ...], ...]  # per section, its buffers (ascending)
    overlaps: tuple[tuple[int, ...], ...]  # per buffer, the buffers sharing a section with it

    @property
    def n_sec(self) -> int:
        return len(self.members)


def sections(buffers: Sequence[Buffer]) -> Sections:
    g = size_unit(buffers)
    starts = [b.first for b in buffers]
    ends = [b.last + 1 for b in buffers]
    n = len(buffers)
    events = sorted([(e, 0) for e in set(ends)] + [(s, 1) for s in set(starts)])
    times, started = [], False
    for t, kind in events:
        if kind == 1:
            started = True
        elif started:  # an end after a start closes a section; later ends only shrink it
            times.append(t)
            started = False
    lo = [bisect.bisect_right(times, s) for s in starts]  # first section time > start
    hi = [bisect.bisect_right(times, e) for e in ends]  # sections with time <= end
    members: list[list[int]] = [[] for _ in times]
    for b in range(n):
        for s in range(lo[b], hi[b]):
            members[s].append(b)
    overlaps: list[list[int]] = [[] for _ in range(n)]
    active: list[int] = []
    for b in sorted(range(n), key=lambda b: (lo[b], b)):
        active = [a for a in active if hi[a] > lo[b]]
        for a in active:
            overlaps[a].append(b)
            overlaps[b].append(a)
        active.append(b)
    return Sections(g, tuple(b.size // g for b in buffers), tuple(lo), tuple(hi),
                    tuple(e - s for s, e in zip(starts, ends)), tuple(tuple(m) for m in members),
                    tuple(tuple(o) for o in overlaps))

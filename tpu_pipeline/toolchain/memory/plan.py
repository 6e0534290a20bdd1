"""Arena plans: where each buffer lives, how big the arena is, and what is provably the least."""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass
from typing import Sequence

from tpu_pipeline.toolchain.memory.lifetimes import Buffer, Lifetimes


@dataclass(frozen=True)
class ArenaPlan:
    offsets: tuple[int, ...]  # one per buffer of `lifetimes.buffers`, same order
    size: int  # bytes from the arena's start to the end of the highest buffer
    lower_bound: int  # no placement of these lifetimes needs fewer bytes
    planner: str
    proven_optimal: bool = False
    seconds: float = 0.0

    @property
    def gap(self) -> int:
        return self.size - self.lower_bound


def arena_size(buffers, offsets) -> int:
    return max((o + b.size for b, o in zip(buffers, offsets)), default=0)


def check_plan(buffers: tuple[Buffer, ...] | Lifetimes, offsets, alignment: int = 1) -> list[str]:
    """Independent checker: every problem with a plan, or [] if it is sound.

    Sound means: one non-negative offset per buffer, each aligned, and no two buffers whose
    lifetimes overlap share a byte.
    """
    if isinstance(buffers, Lifetimes):
        buffers = buffers.buffers
    problems = []
    if len(offsets) != len(buffers):
        return [f"{len(offsets)} offsets for {len(buffers)} buffers"]
    for i, (b, o) in enumerate(zip(buffers, offsets)):
        if o < 0:
            problems.append(f"buffer {i} ({b.name}) has negative offset {o}")
        if alignment > 1 and o % alignment:
            problems.append(f"buffer {i} ({b.name}) at offset {o} is not {alignment}-byte aligned")
    # Sweep over steps; compare only buffers live together.
    by_first = sorted(range(len(buffers)), key=lambda i: (buffers[i].first, i))
    active: list[int] = []
    for i in by_first:
        b = buffers[i]
        active = [j for j in active if buffers[j].last >= b.first]
        for j in active:
            c = buffers[j]
            if offsets[i] < offsets[j] + c.size and offsets[j] < offsets[i] + b.size and b.size and c.size:
                problems.append(
                    f"buffers {j} ({c.name}) and {i} ({b.name}) overlap in time "
                    f"[{max(b.first, c.first)}, {min(b.last, c.last)}] and in bytes"
                )
        active.append(i)
    return problems


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

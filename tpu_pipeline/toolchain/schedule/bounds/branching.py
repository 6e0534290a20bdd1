"""The branching bound: at least the min-cut bound (mincut.py), raised by branching on the order
of pairs of ops. Every order runs u before w or w before u, so the least of the constrained
bounds over the open leaves of a best-first branching tree is a bound.
"""

from __future__ import annotations

import heapq
import time

from tpu_pipeline.toolchain.schedule.bounds.mincut import CutNet
from tpu_pipeline.toolchain.schedule.problem import BoundQuery, Piece


def _closure(net: CutNet, v: int, before: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """v's ancestors and descendants in the piece once the pairs (a, b) of `before` say that a
    runs before b (transitively, with the graph's own edges)."""
    anc, desc = net.anc[v], net.desc[v]
    changed = True
    while changed:
        changed = False
        for a, b in before:
            if (anc >> b) & 1 or b == v:
                add = net.anc[a] | (1 << a)
                if add & ~anc:
                    anc |= add
                    changed = True
            if (desc >> a) & 1 or a == v:
                add = net.desc[b] | (1 << b)
                if add & ~desc:
                    desc |= add
                    changed = True
    return anc, desc


def branch_lower_bound(piece, deadline: float, floor: int = 0, ub: int | None = None,
                       top: int = 24, max_leaves: int | None = None) -> int:
    """A lower bound at least the min-cut bound, raised by branching on the order of pairs of
    ops: every order runs u before w or w before u, so min over the two branches of the
    constrained bound is a bound, and so is the least bound over the open leaves of a
    best-first branching tree. A leaf's bound is the max over a few ops (the `top` with the
    highest root cuts, and the branched ones) of the min cut with the branch's precedences.
    Stops at the deadline (or after `max_leaves` leaves) with the least open leaf; never above
    `ub` when given."""
    if not piece.ops:
        return floor
    net = CutNet(piece)
    root = {}
    for v in net.ops:
        if time.monotonic() > deadline:
            return floor  # no full root: only what the caller knew
        value, _ = net.cut(v)
        if value is None:
            return floor
        root[v] = value
    watch = tuple(sorted(net.ops, key=lambda v: -root[v])[:top])
    best = max(floor, max(root.values()))

    def evaluate(before, every=False):
        """(bound, op to branch at, other op) of a leaf, over the watched and branched ops (or
        every op); the ops are None when no pair among them has its order open."""
        ops = net.ops if every else set(watch) | {x for p in before for x in p}
        vals = []
        for v in ops:
            anc, desc = _closure(net, v, before)
            value, S = net.cut(v, anc, desc)
            if value is None:
                return None
            vals.append((value, v, anc, S))
        vals.sort(key=lambda x: (-x[0], x[1]))
        bound = vals[0][0]
        # branch on the two highest ops whose order is still open: whichever runs second
        # holds what the first left behind
        for k, (value, v, anc, S) in enumerate(vals):
            desc = _closure(net, v, before)[1]
            for _, u, _, _ in vals[k + 1:]:
                if not ((anc | desc) >> u) & 1:
                    return bound, v, u
        return bound, None, None

    counter = 0
    heap = [(best, counter, (), None, None)]
    while heap and time.monotonic() < deadline and (max_leaves is None or counter < max_leaves):
        bound, _, before, v, u = heap[0]
        if ub is not None and bound >= ub:
            return ub
        if v is None:  # nothing open among the watched ops: look at every op of the leaf
            r = evaluate(before, every=True)
            if r is None:
                return best
            if r[1] is None:
                break  # the least leaf cannot be split further: its bound is final
            counter += 1
            heapq.heapreplace(heap, (max(r[0], bound), counter, before, r[1], r[2]))
            continue
        heapq.heappop(heap)
        for pair in ((u, v), (v, u)):
            r = evaluate(before + (pair,))
            if r is None:
                return best
            counter += 1
            heapq.heappush(heap, (max(r[0], bound), counter, before + (pair,), r[1], r[2]))
        best = max(best, heap[0][0] if heap else bound)
    if heap:
        best = max(best, heap[0][0])
    return best if ub is None else min(best, ub)


def piece_bound(piece: Piece, query: BoundQuery) -> int:
    """The branching bound as a LowerBound (bounds/__init__.py)."""
    return branch_lower_bound(piece, query.deadline, query.floor, query.ub)

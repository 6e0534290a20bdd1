"""Baseline orders: the converter's stored order, Kahn's algorithm, reverse post-order, and a
memory-greedy list scheduler. Each is a valid topological order; none is claimed optimal."""

from __future__ import annotations

from tpu_pipeline.toolchain.schedule.model import MemModel, bits


def stored(model: MemModel) -> list[int]:
    return list(range(model.n))


def kahn(model: MemModel) -> list[int]:
    """Kahn's algorithm, FIFO queue, ready ops taken in discovery order (ties by position)."""
    indeg = [bin(p).count("1") for p in model.preds]
    queue = [i for i in range(model.n) if indeg[i] == 0]
    order = []
    head = 0
    while head < len(queue):
        v = queue[head]
        head += 1
        order.append(v)
        for s in bits(model.succs[v]):
            indeg[s] -= 1
            if indeg[s] == 0:
                queue.append(s)
    return order


def reverse_post_order(model: MemModel) -> list[int]:
    """Reverse post-order of a depth-first search from the sources, successors by position."""
    seen = [False] * model.n
    post: list[int] = []
    for root in range(model.n):
        if model.preds[root] or seen[root]:
            continue
        seen[root] = True
        stack = [(root, iter(list(bits(model.succs[root]))))]
        while stack:
            v, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                post.append(v)
            elif not seen[nxt]:
                seen[nxt] = True
                stack.append((nxt, iter(list(bits(model.succs[nxt])))))
    return post[::-1]


def greedy(model: MemModel, units=None, S: int = 0, R: int | None = None, key: str = "live") -> list[int]:
    """Memory-greedy list scheduling: repeatedly run the ready unit (op or fused chain) whose
    step peaks lowest (key="live") or that leaves the fewest resident bytes (key="resident");
    ties by the other figure, then by position. Returns the op order of the units given
    (default: every op, after the ops in S)."""
    if units is None:
        units = [(v,) for v in range(model.n) if not (S >> v) & 1]
    if R is None:
        R = model.resident(S) if S else model.r0
    # unit k is ready once the units owning its outside predecessors have run; only ready units
    # are scored (a step costs O(width), not O(units))
    owner = {v: k for k, u in enumerate(units) for v in u}
    waiting = [0] * len(units)
    users: list[list[int]] = [[] for _ in units]
    for k, u in enumerate(units):
        outside = {p for v in u for p in bits(model.preds[v])} - set(u)
        if any(p not in owner and not (S >> p) & 1 for p in outside):
            waiting[k] = -1  # a predecessor neither run nor among the units: never ready
            continue
        before = {owner[p] for p in outside if p in owner and not (S >> p) & 1}
        for j in before:
            users[j].append(k)
        waiting[k] = len(before)
    ready = [k for k in range(len(units)) if waiting[k] == 0]
    order: list[int] = []
    for _ in range(len(units)):
        best = None
        for k in ready:
            peak, r, s = 0, R, S
            for v in units[k]:
                live, r = model.step(v, s, r)
                s |= 1 << v
                peak = max(peak, live)
            score = (peak, r, k) if key == "live" else (r, peak, k)
            if best is None or score < best[0]:
                best = (score, k, r, s)
        if best is None:
            raise ValueError("units are not schedulable after the given set (cycle or missing predecessor)")
        _, k, R, S = best
        ready.remove(k)
        order.extend(units[k])
        for j in users[k]:
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)
    return order


BASELINES = {
    "converter": stored,
    "kahn": kahn,
    "rpo": reverse_post_order,
    "greedy": lambda m: greedy(m),
}

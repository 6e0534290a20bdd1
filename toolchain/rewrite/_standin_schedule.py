"""TEMPORARY stand-in for toolchain.schedule.schedule until the scheduler lands: an exact dynamic
program over the graph's downsets for small graphs, else the stored order (not proven)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from toolchain.ir import Graph
from toolchain.memory import align, get_semantics, lifetimes, order_free_lower_bound
from toolchain.memory.scratch import scratch_requests


@dataclass(frozen=True)
class StandinSchedule:
    order: tuple
    peak: int
    lower_bound: int
    proven_optimal: bool
    method: str
    seconds: float


def schedule(graph: Graph, method: str = "auto", time_limit: float = 10.0, semantics="tflm", max_states=200_000):
    t0 = time.monotonic()
    sem = get_semantics(semantics)
    n = len(graph.ops)
    stored = tuple(range(n))
    stored_peak = lifetimes(graph, stored, sem).peak
    lb = order_free_lower_bound(graph, sem)
    size = {}
    prod_mask, cons_mask = {}, {}
    outputs = set(graph.outputs)
    for i, op in enumerate(graph.ops):
        for t in graph.activation_outputs(i):
            prod_mask[t] = i
        for t in graph.activation_inputs(i):
            cons_mask[t] = cons_mask.get(t, 0) | (1 << i)
    tensors = set(prod_mask) | {t for t in graph.inputs if graph.is_activation(t)}
    for t in tensors:
        size[t] = align(graph.tensors[t].nbytes, sem.alignment)
    pred_mask = [sum(1 << p for p in graph.preds[i]) for i in range(n)]
    extra = [sum(size[t] for t in graph.activation_outputs(i)) +
             sum(align(s, sem.alignment) for s in scratch_requests(graph, i, sem)) for i in range(n)]

    def live(S):
        total = 0
        for t in tensors:
            p = prod_mask.get(t)
            if p is not None and not (S >> p) & 1:
                continue
            if t in outputs or cons_mask.get(t, 0) & ~S:
                total += size[t]
        return total

    best = {0: (0, None, None)}
    frontier = [0]
    for _ in range(n):
        nxt = {}
        for S in frontier:
            base_peak = best[S][0]
            base_live = live(S)
            for v in range(n):
                if (S >> v) & 1 or pred_mask[v] & ~S:
                    continue
                # Tensors consumed by v are counted in base_live (v is not in S yet).
                pk = max(base_peak, base_live + extra[v])
                T = S | (1 << v)
                if T not in nxt or pk < nxt[T][0]:
                    nxt[T] = (pk, S, v)
        best.update(nxt)
        frontier = sorted(nxt)
        if len(best) > max_states or time.monotonic() - t0 > time_limit:
            return StandinSchedule(stored, stored_peak, lb, stored_peak <= lb, "stored", time.monotonic() - t0)
    order, S = [], (1 << n) - 1
    while S:
        _, prev, v = best[S]
        order.append(v)
        S = prev
    order = tuple(reversed(order))
    peak = lifetimes(graph, order, sem).peak
    if peak > stored_peak:
        order, peak = stored, stored_peak
    return StandinSchedule(order, peak, lb, True, "standin-dp", time.monotonic() - t0)

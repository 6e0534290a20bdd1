"""An op order and arena offsets planned together: the scheduler minimises the peak of live bytes,
but the planned arena can land above it; then the other orders that are cheap to get may give a
smaller arena. (Here, not in `tpu_pipeline.toolchain.memory`: the memory room never imports the scheduler.)"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.memory import TFLM, ArenaPlan, Semantics, lifetimes, plan_arena
from tpu_pipeline.toolchain.schedule.api import schedule

__all__ = ["OrderAndOffsets", "plan_order_and_offsets"]


@dataclass(frozen=True)
class OrderAndOffsets:
    order: tuple[int, ...]  # positions into graph.ops
    peak: int  # most bytes live at once under `order`
    plan: ArenaPlan  # offsets for lifetimes(graph, order, semantics).buffers
    source: str  # which candidate order won ("schedule", "stored", "schedule:<method>")
    tried: tuple[tuple[str, int, int], ...]  # (candidate, peak, planned arena) for each order tried


def plan_order_and_offsets(graph, schedule_result=None, semantics: Semantics | str = TFLM, planner: str = "auto",
                           time_limit: float = 5.0) -> OrderAndOffsets:
    """Plan offsets for the scheduler's order; when the arena lands above that order's peak, try
    the other orders that are cheap to get (the stored order, the scheduler's other methods) and
    keep the order whose planned arena is smallest (ties: the smaller peak, then the first tried).

    `schedule_result` is a `tpu_pipeline.toolchain.schedule.Schedule` (anything with `.order`); None means
    the stored order.
    """
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
        lt = lifetimes(graph, order, semantics)
        plan = plan_arena(lt, planner, max(0.05, share))
        tried.append((name, lt.peak, plan.size))
        key = (plan.size, lt.peak)
        if best is None or key < best[0]:
            best = (key, name, order, lt.peak, plan)

    first_share = time_limit * (0.5 if len(candidates) > 1 else 1.0)
    consider(*candidates[0], first_share)
    if best[4].size > best[3]:  # the arena exceeds the peak: look at other orders
        extra = list(candidates[1:])
        for method in ("greedy", "dp", "cpsat"):
            left = deadline - time.monotonic()
            if left < 0.5:
                break
            try:
                s = schedule(graph, method=method, time_limit=max(0.2, left / 4), semantics=semantics)
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

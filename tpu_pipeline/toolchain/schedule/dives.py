"""Dives: better orders for pieces too wide to search to the end, and a proven bound on the way.

Depth-first dives of the exact search under a trial budget B: every state under B looks alike,
so the search goes deep first. B bisects between the proven floor and the best peak; a dive that
stalls (keeps too many states without an order) just raises the next B. The bound a dive reports
is valid: it is above B only once every state below it was expanded (dp.best_first).
"""

from __future__ import annotations

import time

from tpu_pipeline.toolchain.schedule import native_search
from tpu_pipeline.toolchain.schedule.dp import best_first
from tpu_pipeline.toolchain.schedule.params import ScheduleParams
from tpu_pipeline.toolchain.schedule.problem import Known, Piece, StageContext


def dive(piece: Piece, ub: int, floor: int, until: float,
         params: ScheduleParams = ScheduleParams()) -> tuple[tuple[list[int], int] | None, int]:
    """(the best (order, peak) below `ub` found or None, a proven bound)."""
    native = params.native and native_search.available()
    max_states = params.dive_states_c if native else params.dive_states_python
    lo, best, proven = floor, None, floor
    while ub - lo > max(ub // params.dive_gap_divisor, 1) and time.monotonic() < until:
        B = (lo + ub) // 2
        cap = min(until, time.monotonic() + params.dive_seconds) if params.timed else until  # (untimed: its states)
        r = best_first(piece, ub, B, cap, max_states=max_states, free_moves=params.free_moves, native=native)
        proven = max(proven, min(r.lower_bound, ub))
        if r.order is not None and r.peak < ub:
            best, ub = (r.order, r.peak), r.peak
        else:
            lo = B
    return best, proven


def dives(piece: Piece, known: Known, until: float, ctx: StageContext) -> Known:
    """The stage (stages.py)."""
    found, proven = dive(piece, known.peak, known.floor, until, ctx.params)
    known = known.raised(proven)
    return known if found is None else known.better(*found)

"""The last stage: the exact search and/or CP-SAT with the time that is left (stages.py).

Method dp: the exact search alone. Method cpsat: CP-SAT alone. Method auto: the exact search,
then CP-SAT if the exact search did not finish and the piece is small enough that CP-SAT's model
is cheap to build (about `cpsat_cell_seconds` and 3 KB per (unit, step) pair: measured, 136k pairs
took 400 MB); larger pieces are left to the exact search, whose states are capped by
dp.MAX_STATE_BYTES.
"""

from __future__ import annotations

import time

from tpu_pipeline.toolchain.schedule.dp import best_first
from tpu_pipeline.toolchain.schedule.problem import Known, Piece, SearchResult, StageContext


def full_search(piece: Piece, known: Known, until: float, ctx: StageContext) -> Known:
    p, method = ctx.params, ctx.method
    now = time.monotonic()
    left = max(ctx.deadline - now, 0.0)
    res: SearchResult | None = None
    used = set()
    cells = len(piece.units) * bin(piece.ops).count("1")
    build = cells * p.cpsat_cell_seconds
    cpsat_ok = build < p.cpsat_build_share * left and cells <= p.cpsat_max_cells
    if method in ("auto", "dp"):
        share = 1.0 if method == "dp" else (p.exact_share_before_cpsat if cpsat_ok else p.exact_share)
        res = best_first(piece, known.peak, known.floor, now + share * left, free_moves=p.free_moves, native=p.native)
        used.add("dp")
    if method == "cpsat" or (method == "auto" and cpsat_ok and res is not None and not res.complete):
        from tpu_pipeline.toolchain.schedule.cpsat import cpsat_piece

        left = ctx.deadline - time.monotonic()
        if (left > p.cpsat_min_left and build < p.cpsat_build_share_after * left) or method == "cpsat":
            budget = max(left * (p.cpsat_share if method == "auto" else 1.0), p.cpsat_min_seconds)
            res2 = cpsat_piece(piece, known.order, known.peak, known.floor, budget, ctx.seed)
            used.add("cpsat")
            # CP-SAT's result replaces the exact search's when its bound or its order is better
            if res is None or res2.lower_bound > res.lower_bound or (
                    res2.order is not None and res2.peak < (res.peak if res.order else known.peak)):
                res2.lower_bound = max(res2.lower_bound, res.lower_bound if res else 0)
                res = res2
    return known.searched(res, *used)

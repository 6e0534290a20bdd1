"""Beam search over the exact search's states: better orders for pieces too wide to finish.

Level by level (one more unit run), every state of the beam is extended by each ready move
(a unit, or a slice run of forks.py), duplicates of the same set of units keep the smaller peak,
and the `width` states with the smallest (peak so far, bytes resident) survive. Only orders come
out of it, never bounds: a result is an upper bound that the caller checks with `evaluate`.

With a proven `floor` (no order of the piece peaks below it), peaks so far are counted as at
least the floor: a partial order that stays lower gains nothing, as the piece will reach the floor
anyway, so those states are ranked by the bytes they leave resident alone. On RandWire N=64 this
takes the beams from 28 tensors at width 3,072 to 26 at width 768 (docs/bench/scale.md).
"""

from __future__ import annotations

import time

from tpu_pipeline.toolchain.schedule import native_search
from tpu_pipeline.toolchain.schedule.native_search import TooWide
from tpu_pipeline.toolchain.schedule.forks import moves
from tpu_pipeline.toolchain.schedule.params import ScheduleParams
from tpu_pipeline.toolchain.schedule.problem import Known, Piece, StageContext, units_to_ops


# The C beam's memory cap (its levels, candidates and trail): past it the beam gives up.
MAX_BEAM_BYTES = 256 * 2**20


def beam_order(piece, width: int, deadline: float, ub: int | None = None,
               native: bool = True, floor: int = 0) -> tuple[list[int], int] | None:
    """(op order, its peak over the piece) of the best complete state of the beam, or None if
    the beam died (every extension reached `ub`) or the deadline came first. `native`: run the
    C version (_best_first.c) when it can be built; the Python one below is the reference.
    `floor`: a proven lower bound of the piece, the least peak the ranking tells apart.
    Raises TooWide when the C beam cannot hold `width` states within MAX_BEAM_BYTES."""
    m = len(piece.units)
    if m == 0:
        return None
    g0 = max(piece.step0, floor)  # peaks under the floor rank alike (see above)
    if native and native_search.available():
        return native_search.beam(piece, width, deadline, ub, MAX_BEAM_BYTES, g0)
    upred = piece.upred
    # state: U -> (peak so far, S, R, ready units, trail of moves)
    beam = {0: (g0, piece.S0, piece.R0, tuple(k for k in range(m) if upred[k] == 0), ())}
    full = (1 << m) - 1
    while beam:
        if full in beam:
            g, _, _, _, trail = beam[full]
            seq = []
            while trail:  # the moves, linked back to front
                ks, trail = trail
                seq.append(ks)
            order = units_to_ops(piece, [k for ks in reversed(seq) for k in ks])
            return order, piece.evaluate(order)
        if time.monotonic() > deadline:
            return None
        nxt: dict[int, tuple] = {}
        for U, (g, S, R, ready, trail) in beam.items():
            if time.monotonic() > deadline:
                return None
            for ks in (moves(piece, U, ready) if piece.lazy else [(k,) for k in ready]):
                peak, S2, R2, U2 = g, S, R, U
                for k in ks:
                    p, S2, R2 = piece.apply(k, S2, R2)
                    peak = p if p > peak else peak
                    U2 |= 1 << k
                if ub is not None and peak >= ub:
                    continue
                old = nxt.get(U2)
                if old is not None and (old[0], old[2]) <= (peak, R2):
                    continue
                nr = [j for j in ready if not (U2 >> j) & 1]
                for k in ks:
                    for j in piece.usucc[k]:
                        if upred[j] & ~U2 == 0 and not (U2 >> j) & 1 and j not in nr:
                            nr.append(j)
                nxt[U2] = (peak, S2, R2, tuple(nr), (ks, trail))
        beam = dict(sorted(nxt.items(), key=lambda kv: (kv[1][0], kv[1][2], kv[0]))[:width])
    return None


def widening_beams(piece: Piece, ub: int, until: float, floor: int, width: int = ScheduleParams.beam_width,
                   native: bool = True, max_width: int | None = None) -> tuple[list[int], int] | None:
    """Beams of doubling width, from `width`, while time is left (and up to `max_width`): the best
    (order, peak) below `ub` found, or None. `floor` is a proven bound: no order of the piece
    peaks below it."""
    best = None
    while time.monotonic() < until and (max_width is None or width <= max_width):
        try:
            found = beam_order(piece, width, until, ub, native=native, floor=floor)
        except TooWide:  # the memory cap: wider beams fit even less
            break
        if found is not None and found[1] < ub:  # None: the beam died under ub, or the time
            best, ub = found, found[1]
        width *= 2
    return best


def beams(piece: Piece, known: Known, until: float, ctx: StageContext) -> Known:
    """The stage: better orders from widening beams (stages.py)."""
    p = ctx.params
    found = widening_beams(piece, known.peak, until, known.floor if p.beam_floor else 0, p.beam_width, p.native,
                           None if p.timed else p.untimed_beam_width)
    return known if found is None else known.better(*found)

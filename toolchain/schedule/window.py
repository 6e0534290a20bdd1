"""Large-neighbourhood search: re-solve a window of an order exactly, keep what is lower.

Take a piece's order as a sequence of units and a window of consecutive units [a, b) around a
step at the peak. Every order of the window's units that is topological after the units before
it leaves the same set run at b, hence the same bytes resident (MemModel.step): the steps
outside the window do not change. So the exact search (dp.best_first) on the window, as a piece
in the context of the units before it, with the order's peak as the bound to beat, either
returns a window order whose every step is below that peak — the window's steps at the peak
are gone and nothing else moved — or proves the window cannot do better. Windows grow while
they fail.

Then scattered neighbourhoods: the units that wrote or will read a tensor resident at a step at
the peak, plus random others (`FREE` in all), are freed and every other unit keeps its place in
the order (a chain of extra precedences); the exact search over the whole piece under those
constraints is small and may move a freed unit far. Only orders come out of this, never bounds;
the caller re-evaluates the result.
"""

from __future__ import annotations

import random
import time

from toolchain.schedule.dp import Piece, best_first
from toolchain.schedule.model import bits

SIZES = (16, 24, 32, 48, 64)  # units per window, tried in turn while a window fails
MAX_STATES = 40_000  # per window search: a window that needs more is given up
FREE = 24  # units freed in a scattered neighbourhood


def unit_sequence(piece: Piece, order) -> list[int] | None:
    """The order as unit indices of the piece, or None if some unit is not contiguous in it."""
    owner = {v: k for k, u in enumerate(piece.units) for v in u}
    seq, pos = [], 0
    while pos < len(order):
        k = owner[order[pos]]
        u = piece.units[k]
        if tuple(order[pos:pos + len(u)]) != u:
            return None
        seq.append(k)
        pos += len(u)
    return seq


def _steps(piece: Piece, seq) -> list[tuple[int, int, int]]:
    """Per unit of `seq`: (its largest step, S before it, R before it)."""
    out, S, R = [], piece.S0, piece.R0
    first = piece.model.step0 if piece.S0 == 0 else 0
    for i, k in enumerate(seq):
        p, S2, R2 = piece.apply(k, S, R)
        out.append((max(p, first) if i == 0 else p, S, R))
        S, R = S2, R2
    return out


def _resolve(piece: Piece, seq, a: int, b: int, ub: int, floor: int, until: float,
             free_moves: bool, lazy: bool) -> list[int] | None:
    """Units [a, b) of `seq` re-ordered with every step below `ub`, or None."""
    steps = _steps(piece, seq)
    S, R = steps[a][1], steps[a][2]
    sub = Piece(piece.model, [piece.units[k] for k in seq[a:b]], S, R)
    if lazy:
        sub.use_lazy_slices()
    # the window of the first piece also owns step 0, which the window order cannot change
    r = best_first(sub, ub, floor, until, max_states=MAX_STATES, free_moves=free_moves)
    if r.order is None or r.peak >= ub:
        return None
    index = {u: k for k, u in enumerate(piece.units)}
    owner = {v: index[u] for u in sub.units for v in u}
    out, seen = [], set()
    for v in r.order:
        k = owner[v]
        if k not in seen:
            seen.add(k)
            out.append(k)
    return seq[:a] + out + seq[b:]


def _windows(piece: Piece, seq, peak: int, floor: int, until: float, free_moves: bool):
    """Contiguous windows around the steps at the peak, growing while they fail."""
    lazy = bool(piece.lazy)
    size_i, shift = 0, 0
    while peak > floor and time.monotonic() < until and size_i < len(SIZES):
        steps = _steps(piece, seq)
        hot = [i for i, (p, _, _) in enumerate(steps) if p >= peak]
        width = min(SIZES[size_i], len(seq))
        centre = hot[shift % len(hot)]
        a = max(0, min(centre - width // 2, len(seq) - width))
        new = _resolve(piece, seq, a, a + width, peak, floor, until, free_moves, lazy)
        if new is None:
            shift += 1
            if shift >= len(hot):  # every hot step tried at this width: widen
                size_i, shift = size_i + 1, 0
            continue
        seq = new
        lower = max(p for p, _, _ in _steps(piece, seq))
        if lower < peak:
            size_i = 0
        peak, shift = lower, 0
    return seq, peak


def _related(piece: Piece, seq, at: int, S: int) -> list[int]:
    """Positions in `seq` of the units that wrote or will read a tensor resident after S."""
    model = piece.model
    pos = {k: i for i, k in enumerate(seq)}
    owner = {v: k for k, u in enumerate(piece.units) for v in u}
    out = {at}
    for t in range(len(model.size)):
        w = model.born[t]
        if w >= 0 and (piece.ops >> w) & 1 and (S >> w) & 1 and model.mask[t] & ~S:
            out.add(pos[owner[w]])
            out.update(pos[owner[r]] for r in bits(model.mask[t] & ~S & piece.ops))
    return sorted(out)


def constrained(piece: Piece, seq, free) -> Piece:
    """The piece's units in `seq` order, where the units at positions not in `free` must keep
    their order (extra precedences); no lazy slices (their runs ignore the extra chain)."""
    sub = Piece(piece.model, [piece.units[k] for k in seq], piece.S0, piece.R0)
    fixed = [i for i in range(len(seq)) if i not in free]
    for a, b in zip(fixed, fixed[1:]):
        if not (sub.upred[b] >> a) & 1:
            sub.upred[b] |= 1 << a
            sub.usucc[a].append(b)
    return sub


def _scattered(piece: Piece, seq, peak: int, floor: int, until: float, free_moves: bool,
               seed: int):
    rng = random.Random(seed)
    while peak > floor and time.monotonic() < until:
        steps = _steps(piece, seq)
        hot = [i for i, (p, _, _) in enumerate(steps) if p >= peak]
        at = rng.choice(hot)
        rel = _related(piece, seq, at, steps[at][1] | piece.inside[seq[at]])
        rng.shuffle(rel)
        free = set(rel[:FREE // 2])
        rest = [i for i in range(len(seq)) if i not in free]
        free.update(rng.sample(rest, min(FREE - len(free), len(rest))))
        sub = constrained(piece, seq, free)
        cap = min(until, time.monotonic() + 1.0)
        r = best_first(sub, peak, floor, cap, max_states=MAX_STATES, free_moves=free_moves)
        if r.order is None or r.peak >= peak:
            continue
        seq = [seq[i] for i in unit_sequence(sub, r.order)]
        peak = max(p for p, _, _ in _steps(piece, seq))
    return seq, peak


def improve(piece: Piece, order, floor: int, until: float, free_moves: bool = True,
            seed: int = 0) -> tuple[list[int], int] | None:
    """A lower-peaking order of the piece from exactly re-solved neighbourhoods (see the
    module), or None if none was found before `until`. Stops once the peak is at most `floor`."""
    seq = unit_sequence(piece, list(order))
    if seq is None or len(seq) < 3:
        return None
    start_peak = piece.evaluate(order)
    seq, peak = _windows(piece, seq, start_peak, floor, until, free_moves)
    seq, peak = _scattered(piece, seq, peak, floor, until, free_moves, seed)
    if peak >= start_peak:
        return None
    out = [v for k in seq for v in piece.units[k]]
    return out, piece.evaluate(out)

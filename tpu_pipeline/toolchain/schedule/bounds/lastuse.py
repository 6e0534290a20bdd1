"""The last-use bound: a tensor read by several ops stays live until the last of them runs, and by
then every other reader has run. So over ALL orders, at the step of whichever reader r runs last,
at least min-cut(r, with every other reader and its ancestors already run) bytes are live (the
min-cut network of mincut.py, its down-sets constrained further). The least of that over the
readers is a bound. It sees what the min-cut bound, one op at a time, cannot: a graph input cut
into tiles (fit's patch copies) is held until its last tile is cut, while all the other tiles'
results wait to be joined; the min-cut bound lets each tile go first.
"""

from __future__ import annotations

import time

from tpu_pipeline.toolchain.schedule.bounds.mincut import CutNet
from tpu_pipeline.toolchain.schedule.model import bits
from tpu_pipeline.toolchain.schedule.problem import BoundQuery, Piece


def last_use_bound(piece: Piece, deadline: float | None = None, floor: int = 0) -> int:
    """max over tensors read by two or more ops of the piece of min over those readers r of the
    bytes live at r's step when r is the last of them. Stops early (a smaller but valid bound) at
    the deadline."""
    model = piece.model
    shared = []  # (readers bitset) of every tensor two or more ops of the piece read
    for t in range(len(model.size)):
        readers = model.mask[t] & piece.ops
        if model.born and model.born[t] >= 0:
            readers &= ~(1 << model.born[t])
        if readers & (readers - 1):
            shared.append(readers)
    if not shared:
        return floor
    net = CutNet(piece)
    best = floor
    for readers in sorted(set(shared), key=lambda m: -bin(m).count("1")):
        if deadline is not None and time.monotonic() > deadline:
            break
        least = None
        for r in bits(readers):
            before = 0  # the other readers and their ancestors: run before r
            for o in bits(readers & ~(1 << r)):
                before |= net.anc[o] | (1 << o)
            value, _ = net.cut(r, net.anc[r] | before, net.desc[r])
            if value is None:
                least = None
                break  # the solver failed: no bound from this tensor
            least = value if least is None else min(least, value)
            if least <= best:
                break  # cannot raise the bound
        if least is not None:
            best = max(best, least)
    return best


def piece_bound(piece: Piece, query: BoundQuery) -> int:
    """The last-use bound as a LowerBound (bounds/__init__.py)."""
    return last_use_bound(piece, query.deadline, query.floor)

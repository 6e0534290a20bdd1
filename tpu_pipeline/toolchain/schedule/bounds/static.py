"""The static bound: no order peaks below any op's footprint (what it reads and writes, its
scratch, what is live at every step) plus the tensors resident through the whole piece, nor below
the bytes live at step 0 (the graph inputs, in the piece that starts the graph) or at the last
step (`MemModel.end`, in the piece that ends it). On the whole graph it is the order-free bound
of the memory model (`model_lower_bound`). Cheap: it is computed on every piece.
"""

from __future__ import annotations

from tpu_pipeline.toolchain.schedule.model import MemModel, bits
from tpu_pipeline.toolchain.schedule.problem import BoundQuery, Piece


def footprint(model: MemModel, v: int) -> int:
    """Bytes live at op v's step in EVERY order: what it touches, its scratch, and the tensors
    live at every step."""
    return model.const_all + model.extra[v] + sum(model.size[t] for t in model.touch[v])


def footprints(model: MemModel) -> list[int]:
    return [footprint(model, v) for v in range(model.n)]


def _static(model: MemModel, S0: int, ops: int) -> int:
    """The static bound of ordering the ops in `ops` after those in S0."""
    thru = 0
    for t in range(len(model.size)):
        m = model.mask[t]
        if m & ops:
            continue
        # untouched by the piece: alive before its first step iff alive after its last
        if (model.pin_start[t] or m & S0) and (model.pin_end[t] or m & ~S0):
            thru += model.size[t]
    lb = model.step0 if S0 == 0 else 0
    for v in bits(ops):
        lb = max(lb, thru + footprint(model, v))
    if (S0 | ops) == model.full and model.n:
        lb = max(lb, model.end)
    return lb


def static_lower_bound(piece: Piece) -> int:
    """No order of the piece peaks below this."""
    return _static(piece.model, piece.S0, piece.ops)


def model_lower_bound(model: MemModel) -> int:
    """No order of the graph peaks below this (the static bound of the whole graph)."""
    return _static(model, 0, model.full)


def piece_bound(piece: Piece, query: BoundQuery) -> int:
    """The static bound as a LowerBound (bounds/__init__.py)."""
    return static_lower_bound(piece)

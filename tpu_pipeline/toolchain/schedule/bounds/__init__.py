"""Lower bounds on the best peak of a piece (certificates), behind one interface.

A lower bound is a function `(piece, BoundQuery) -> int` that no order of the piece peaks below
(problem.py). `PIECE_BOUNDS` are computed, in this order, on the pieces before any search: the
`every_piece` ones on every piece, the others only on the pieces whose best order is still above
every bound so far. The branching bound runs later, as a stage on the pieces the short exact
search did not settle (stages.py). A new bound is one module here plus one `LowerBound` entry
(docs/schedule.md has the worked example); the brute-force tests check every registered bound
against the exact optimum. `ancestry.py` bounds a whole graph before any piece is made (for the
rewrite search).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tpu_pipeline.toolchain.schedule.bounds import branching, lastuse, mincut, static
from tpu_pipeline.toolchain.schedule.params import SWITCHES
from tpu_pipeline.toolchain.schedule.problem import BoundQuery, Piece


@dataclass(frozen=True)
class LowerBound:
    name: str  # reported in Schedule.bounds
    compute: Callable[[Piece, BoundQuery], int]
    switch: str | None = None  # the ScheduleParams switch that turns it off; None: always on
    every_piece: bool = False  # computed on every piece (must be cheap: it sets the search order)

    def __post_init__(self) -> None:
        if self.switch is not None and self.switch not in SWITCHES:
            raise ValueError(f"lower bound {self.name}: no ScheduleParams switch '{self.switch}'")


STATIC = LowerBound("static", static.piece_bound, every_piece=True)
MINCUT = LowerBound("min-cut", mincut.piece_bound, switch="cut_bound")
LASTUSE = LowerBound("last-use", lastuse.piece_bound, switch="last_use_bound")
BRANCHING = LowerBound("branching", branching.piece_bound, switch="branch_bound")

PIECE_BOUNDS: tuple[LowerBound, ...] = (STATIC, MINCUT, LASTUSE)

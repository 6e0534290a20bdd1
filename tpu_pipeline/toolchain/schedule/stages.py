"""Search stages behind one interface, run from a list per method.

A stage is a function `(piece, known, until, ctx) -> Known` (problem.py): it gets what is known
about a piece (the best order and its peak, a proven floor) and returns what is known after it
ran, by `until` (monotonic seconds). `run_stages` runs a method's stages in order on a piece that
is not settled by the bounds, and stops as soon as it is settled (a search finished, or the best
order reached the floor). A stage's `share` names the ScheduleParams field with its share of the
time left when the piece's stages began; a stage without one runs until the deadline (it decides
itself how much of that it uses). With `timed` off the short exact search and the dives stop at
counts of states and the beams at a width instead of their shares, and with `full_search` off
nothing else searches: an answer that is a function of the question, not of the machine's speed
(fit's realise asks so, fit/realise.py).
A new stage is one module plus one `Stage` entry here
(docs/schedule.md has the worked example).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tpu_pipeline.toolchain.schedule.beam import beams
from tpu_pipeline.toolchain.schedule.bounds import BRANCHING, LowerBound
from tpu_pipeline.toolchain.schedule.dives import dives
from tpu_pipeline.toolchain.schedule.dp import short_search
from tpu_pipeline.toolchain.schedule.full_search import full_search
from tpu_pipeline.toolchain.schedule.params import SHARES, SWITCHES
from tpu_pipeline.toolchain.schedule.problem import BoundQuery, Known, Piece, StageContext

StageRun = Callable[[Piece, Known, float, StageContext], Known]


@dataclass(frozen=True)
class Stage:
    name: str
    run: StageRun
    switch: str | None = None  # the ScheduleParams switch that turns it off; None: always on
    share: str | None = None  # the ScheduleParams share of the piece's time; None: until the deadline

    def __post_init__(self) -> None:
        if self.switch is not None and self.switch not in SWITCHES:
            raise ValueError(f"stage {self.name}: no ScheduleParams switch '{self.switch}'")
        if self.share is not None and self.share not in SHARES:
            raise ValueError(f"stage {self.name}: no ScheduleParams share '{self.share}'")


def raise_floor(bound: LowerBound) -> StageRun:
    """A lower bound as a stage: it raises the piece's floor."""
    def run(piece: Piece, known: Known, until: float, ctx: StageContext) -> Known:
        return known.raised(bound.compute(piece, BoundQuery(known.floor, known.peak, until)), bound.name)
    return run


SHORT_SEARCH = Stage("short exact search", short_search, share="try_share")
BRANCH_BOUND = Stage("branching bound", raise_floor(BRANCHING), switch=BRANCHING.switch, share="branch_bound_share")
BEAMS = Stage("beams", beams, switch="beams", share="beam_share")
DIVES = Stage("dives", dives, switch="dives", share="dive_share")
FULL_SEARCH = Stage("full search", full_search, switch="full_search")
UNTIMED = (SHORT_SEARCH, BEAMS, DIVES)  # the stages that can stop at their work, not their time (`timed` off)

# method -> the stages run on each piece the bounds leave open, in order
STAGES: dict[str, tuple[Stage, ...]] = {
    "auto": (SHORT_SEARCH, BRANCH_BOUND, BEAMS, DIVES, FULL_SEARCH),
    "dp": (FULL_SEARCH,),
    "cpsat": (FULL_SEARCH,),
}


def run_stages(piece: Piece, known: Known, ctx: StageContext) -> Known:
    """Run the method's stages on the piece until it is settled."""
    piece_time = max(ctx.deadline - time.monotonic(), 0.0)
    for stage in STAGES[ctx.method]:
        if known.settled:
            break
        if stage.switch is not None and not getattr(ctx.params, stage.switch):
            continue
        if stage.share is None or (stage in UNTIMED and not ctx.params.timed):
            until = ctx.deadline  # (untimed, they stop at their work: dp.short_search, beam.beams, dives.dive)
        else:
            until = min(time.monotonic() + getattr(ctx.params, stage.share) * piece_time, ctx.deadline)
        known = stage.run(piece, known, until, ctx)
    return known

"""`ScheduleParams`: every switch, time share and cap of the scheduler's control, in one record.

MiniMalloc's SolverParams is the model: each field is named, documented, and checked when the
record is made. The switches turn parts of the search off (benchmarks and tests do; the defaults
are what `schedule` runs): every part is sound on its own, so switching one off never makes an
answer wrong, only slower or weaker. Shares are fractions of a time budget, said for each.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tpu_pipeline.toolchain.errors import UsageError


@dataclass(frozen=True)
class ScheduleParams:
    # ---- switches: parts of the search (True = on) -------------------------------------------
    fusion: bool = True  # fuse ops into units that some optimal order runs back to back (fusion.py)
    branches: bool = True  # branch bodies as units (branches.py); needs `fusion`
    lazy_slices: bool = True  # offer a fork's slices only as pairs or one final run (forks.py)
    twins: bool = True  # the exact search orders isomorphic branches canonically (twins.py)
    cuts: bool = True  # split at forced cut points and solve the pieces one by one (divide.py)
    free_moves: bool = True  # the exact search expands only a move that provably loses nothing (dp.py)
    cut_bound: bool = True  # the min-cut lower bound on pieces still open (bounds/mincut.py)
    last_use_bound: bool = True  # the last-use lower bound on pieces still open (bounds/lastuse.py)
    branch_bound: bool = True  # the branching bound on hard pieces (bounds/branching.py)
    beams: bool = True  # beam searches for better orders on hard pieces (beam.py)
    beam_floor: bool = True  # the beams rank partial orders under the proven floor alike (beam.py)
    dives: bool = True  # depth-first dives under trial budgets on hard pieces (dives.py)
    native: bool = True  # the exact search and the beams in C when a compiler is at hand (_best_first.c)
    full_search: bool = True  # the full search (DP, then CP-SAT) until the deadline, after the other stages
    # the short exact search, the beams and the dives stop at their shares of the time (a dive also
    # after dive_seconds); off: the short search after `try_states` states, the beams at
    # `untimed_beam_width`, each dive at its states: answers that do not depend on the machine's
    # speed or load (the deadline still caps them)
    timed: bool = True

    # ---- time shares -------------------------------------------------------------------------
    # of the whole budget:
    body_share: float = 0.25  # the search for branch bodies, a pre-pass
    # of the time left when a hard piece's stages begin (method auto; stages.py):
    try_share: float = 0.2  # the short exact search (most pieces end there)
    branch_bound_share: float = 0.25  # the branching bound raising the floor
    beam_share: float = 0.25  # beams of doubling width
    dive_share: float = 0.2  # dives
    # of the time left when the full search begins (full_search.py):
    exact_share: float = 0.9  # the exact search, when CP-SAT will not follow (method auto)
    exact_share_before_cpsat: float = 0.6  # the exact search, when CP-SAT may follow it
    cpsat_share: float = 0.7  # CP-SAT after the exact search (method auto)
    cpsat_build_share: float = 0.12  # CP-SAT is considered only if building its model takes less than this share
    cpsat_build_share_after: float = 0.3  # ... and, after the exact search, less than this share of what is left

    # ---- caps and steps ----------------------------------------------------------------------
    cpsat_max_cells: int = 60_000  # (unit, step) pairs of a piece CP-SAT may model in auto mode: about 200 MB
    cpsat_cell_seconds: float = 1e-4  # seconds to build CP-SAT's model per (unit, step) pair (measured)
    cpsat_min_left: float = 0.2  # seconds that must be left for CP-SAT to start after the exact search
    cpsat_min_seconds: float = 0.5  # the least time CP-SAT is given once it starts
    try_states: int = 400_000  # the short exact search's states when not timed: about 1 s of the C search
    untimed_beam_width: int = 1536  # the widest beam when not timed
    beam_width: int = 48  # the first beam's width; each next beam is twice as wide
    dive_seconds: float = 0.5  # the most one dive may take
    # a dive that has kept this many states without an order stalls (about dive_seconds of either
    # search): the next dive gets a higher trial budget
    dive_states_c: int = 500_000
    dive_states_python: int = 20_000
    dive_gap_divisor: int = 200  # dives stop once the best peak is within peak // this of the floor

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "bool":
                ok, want = isinstance(value, bool), "True or False"
            elif f.name.endswith("_share"):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1
                want = "a fraction in (0, 1]"
            elif f.type == "int":
                ok, want = isinstance(value, int) and not isinstance(value, bool) and value > 0, "a positive integer"
            else:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
                want = "a number >= 0"
            if not ok:
                raise UsageError(f"schedule parameter {f.name} must be {want}, got {value!r}")

    def without(self, *parts: str) -> "ScheduleParams":
        """A copy with the named switches off (unknown names are an error)."""
        for p in parts:
            if p not in SWITCHES:
                raise UsageError(f"unknown scheduler part '{p}' (choose from {', '.join(SWITCHES)})")
        return dataclasses.replace(self, **{p: False for p in parts})


SWITCHES = tuple(f.name for f in dataclasses.fields(ScheduleParams) if f.type == "bool")
SHARES = tuple(f.name for f in dataclasses.fields(ScheduleParams) if f.name.endswith("_share"))

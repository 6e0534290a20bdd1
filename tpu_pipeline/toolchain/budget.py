"""One notion of a time budget for every search: a `Deadline` on the monotonic clock, and progress.

Contract of the searches that take `deadline=` (`schedule`, `rewrite_graph`, `plan_buffers` /
`plan_arena`, `plan_for_tflm`): they check the clock inside every loop that can run long, give
each sub-search only what is left, and return the best valid answer found so far when the
deadline passes. They return at most `SLACK` seconds after it (a CP-SAT solve stops within about
0.1 s of its own limit, a scheduler call is not started with less than `MIN_SCHEDULE` seconds
left, and the fallback work after expiry is linear). `deadline=None` keeps each function's own
`time_limit` behaviour; when both are given the earlier end wins.

The total budget of `compile` is set by its driver (tpu_pipeline/toolchain/driver.py: BUDGET_FACTOR x
--time-limit for all passes together, each pass at most its share); a pass hands its slice to
these functions as `deadline=Deadline(seconds allowed)`, so every search of the run ends within
that total plus SLACK per pass. Not counted: reading and writing files and, with `--verify`,
running the models in the runtimes (bounded by the model's size, not by a time limit).

Progress: a search calls `progress(msg)` at coarse points (one line per candidate batch, per
greedy, per piece) with a message that already carries the elapsed seconds; the caller decides
where to print it (compile prints one line per pass to its log, also when stderr is no terminal).
"""

from __future__ import annotations

import time
from typing import Callable, Optional

SLACK = 1.0  # seconds a search may return after its deadline
MIN_SCHEDULE = 0.2  # a scheduler call is not started with less time than this left

Progress = Optional[Callable[[str], None]]


class DeadlineExpired(Exception):
    """Raised by `Deadline.check` when the time is up; the searches catch it and return the best so
    far, so it never reaches the user."""

    def __init__(self, label: str, seconds: float):
        super().__init__(f"time budget of {seconds:.1f} s spent ({label})")
        self.label = label


class Deadline:
    """`seconds` from now on the monotonic clock (`Deadline(10)`); `Deadline.at(t)` for an absolute end."""

    __slots__ = ("start", "end")

    def __init__(self, seconds: float):
        self.start = time.monotonic()
        self.end = self.start + max(0.0, float(seconds))

    @classmethod
    def at(cls, end: float) -> "Deadline":
        d = cls(0.0)
        d.end = float(end)
        return d

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def check(self, label: str = "") -> None:
        if time.monotonic() >= self.end:
            raise DeadlineExpired(label, self.seconds)

    def sub(self, seconds: float | None = None, fraction: float | None = None) -> "Deadline":
        """A deadline inside this one: at most `seconds`, or `fraction` of what is left."""
        left = self.remaining()
        if seconds is not None:
            left = min(left, max(0.0, seconds))
        if fraction is not None:
            left = min(left, fraction * self.remaining())
        d = Deadline(left)
        d.start = self.start  # elapsed time still counts from the outer start
        return d

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Deadline({self.seconds:.2f} s, {self.remaining():.2f} s left)"


def resolve(time_limit: float | None, deadline: Deadline | None) -> Deadline:
    """The deadline a search obeys: the earlier of `time_limit` from now and `deadline`."""
    if deadline is None:
        return Deadline(time_limit if time_limit is not None else 0.0)
    if time_limit is None:
        return deadline
    own = Deadline(time_limit)
    return own if own.end < deadline.end else deadline


def say(progress: Progress, start: float, msg: str) -> None:
    """Send `msg` with the seconds since `start` (monotonic) to `progress`, if any."""
    if progress is not None:
        progress(f"[{time.monotonic() - start:6.1f} s] {msg}")

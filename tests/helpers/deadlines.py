"""Deadlines that expire on a count, not on the clock: a test of "the search stops at its deadline"
must not depend on how fast the machine is (issue 34).

`TripDeadline(n)` answers like a `Deadline` with an hour left for its first `n` questions
(`expired`, `check`, `remaining`, counted over it and every deadline `sub` makes of it) and as an
expired one from then on. The code under test asks at the same points on every machine, so it
stops at the same point on every machine, however loaded. Its `end` (the absolute time the native
searches are handed) stays an hour away, so a search stops only because it asked the deadline,
which is what these tests are about.
"""

from __future__ import annotations

from tpu_pipeline.toolchain.budget import Deadline, DeadlineExpired

FAR = 3600.0  # seconds: the real clock never ends a search of these tests first


class _Questions:
    def __init__(self, before_trip: int):
        self.left = before_trip
        self.asked = 0
        self.tripped_at: int | None = None

    def ask(self) -> bool:
        """One more question; True once the deadline has tripped."""
        self.asked += 1
        if self.left > 0:
            self.left -= 1
            return False
        if self.tripped_at is None:
            self.tripped_at = self.asked
        return True


class TripDeadline(Deadline):
    __slots__ = ("q",)

    def __init__(self, questions: int, seconds: float = FAR, *, shared: _Questions | None = None):
        super().__init__(seconds)
        self.q = shared or _Questions(questions)

    @property
    def asked(self) -> int:
        return self.q.asked

    @property
    def tripped_at(self) -> int | None:
        return self.q.tripped_at

    def expired(self) -> bool:
        return self.q.ask()

    def check(self, label: str = "") -> None:
        if self.q.ask():
            raise DeadlineExpired(label, self.seconds)

    def remaining(self) -> float:
        return 0.0 if self.q.ask() else super().remaining()

    def sub(self, seconds: float | None = None, fraction: float | None = None) -> "TripDeadline":
        left = Deadline.remaining(self)
        if seconds is not None:
            left = min(left, max(0.0, seconds))
        if fraction is not None:
            left = fraction * left
        d = TripDeadline(0, left, shared=self.q)
        d.start = self.start
        return d


def never() -> TripDeadline:
    """A deadline that never trips: the search runs to its own end on any machine."""
    return TripDeadline(10**12)


def cpu_past_deadline(deadline: Deadline, run):
    """`run()`, and the CPU seconds this process spent after `deadline` passed, as
    `(result, seconds)`. The contract "a search returns within SLACK of its deadline" is about the
    work it does once the time is up; CPU time measures that work alike on an idle and on a loaded
    machine, where wall time would count whoever else had the cores."""
    import threading
    import time

    at_deadline: list[float] = []
    timer = threading.Timer(deadline.remaining(), lambda: at_deadline.append(time.process_time()))
    timer.start()
    try:
        result = run()
    finally:
        timer.cancel()
    return result, (time.process_time() - at_deadline[0]) if at_deadline else 0.0

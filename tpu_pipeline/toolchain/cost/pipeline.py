"""Discrete-event simulator of Coral Edge TPU pipelines sharing one host and one USB link.

What a Coral pipeline shares (pycoral's PipelinedModelRunner, every TPU behind one USB 3 hub):
one thread per segment takes a frame from its input queue (one item), invokes its Edge TPU and
puts the outputs into the next queue (one item; it blocks while that queue is full). One invoke
of stage k is, in order:

    host    the per-invoke host cost (driver, runtime)          on the host CPU (shared)
    in      its input tensors host -> device                    on the link (shared)
    exec    on-chip compute, while the parameters that are not  on its own TPU and, for the
            cached on chip stream in from the host              streamed bytes, on the link
    out     its output tensors device -> host                   on the link (shared)

The shared link serves one transfer at a time in the order they were requested (FIFO; or
processor-shared, `link_policy="ps"`: every active transfer gets an equal share); the host is
processor-shared over `host_slots`. `exec` ends when both its compute and its stream are done
(the TPU runs a layer as its weights arrive). The simulation is deterministic (a pure
function of its inputs; no randomness, fixed tie order) and runs until the steady state; the
period is the mean time between completions over the second half of the frames.

Lower bound (`period_bound_s`): each resource serves at most one second of work per second, so
the period is at least max(each stage's uncontended cycle, the link's work per frame, the host's
work per frame). The partitioner minimises this bound; the simulated period is never below it
and `gap` says by how much it is above.

Several pipelines (several models, each on its own TPUs, one host) are simulated together by
passing several stage lists: each gets its own period; they share the link and the host.
"""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass, replace
from pathlib import Path

from tpu_pipeline.toolchain.native import load_library

EPS = 1e-15       # seconds of work below which a demand counts as served
MIN_FRAMES = 24
# How the shared link serves concurrent transfers. Table I cannot tell the two apart (ResNet152 test
# rms 5.7 % FIFO vs 5.6 % processor sharing, docs/bench/pipeline_fidelity.md); FIFO is the default
# because processor sharing pulls stages into lock-step (both wait, then both compute), which the
# measured periods, close to the link bound, do not show.
LINK_POLICY = "fifo"


@dataclass(frozen=True)
class StageLoad:
    """What one segment costs per frame, contention-free."""
    compute_s: float          # on-chip compute on its own Edge TPU
    stream_bytes: int = 0     # parameters not cached on chip, streamed on every invoke
    in_bytes: int = 0         # input tensors host -> device
    out_bytes: int = 0        # output tensors device -> host
    host_s: float = 0.0       # per-invoke host cost
    overlap: bool = True      # streaming overlaps compute (else: stream, then compute)


@dataclass(frozen=True)
class StageStats:
    busy_s: float             # per frame: time in an invoke (host + in + exec + out, contention included)
    starved_s: float          # per frame: waiting for an input frame
    blocked_s: float          # per frame: holding an output the next queue cannot take
    uncontended_s: float      # per frame: the invoke with the link and host to itself

    def to_json(self) -> dict:
        return {"busy_s": self.busy_s, "starved_s": self.starved_s, "blocked_s": self.blocked_s,
                "uncontended_s": self.uncontended_s}


@dataclass(frozen=True)
class PipelineSim:
    period_s: float           # steady-state time between results (1 / throughput)
    latency_s: float          # steady state: stage 0 starts a frame -> the last stage delivers it
    period_bound_s: float     # max(stage cycles, link work, host work) per frame
    stages: tuple[StageStats, ...]
    link_utilisation: float   # fraction of the time the link moves bytes
    host_utilisation: float

    @property
    def throughput_per_s(self) -> float:
        return 1.0 / self.period_s if self.period_s > 0 else float("inf")

    @property
    def gap(self) -> float:
        """Simulated period / its lower bound - 1 (0 when the bound is reached)."""
        return self.period_s / self.period_bound_s - 1 if self.period_bound_s > 0 else 0.0

    def to_json(self) -> dict:
        return {"period_s": self.period_s, "latency_s": self.latency_s, "period_bound_s": self.period_bound_s,
                "link_utilisation": self.link_utilisation, "host_utilisation": self.host_utilisation,
                "stages": [s.to_json() for s in self.stages]}


def _phases(st: StageLoad, bandwidth: float) -> list[dict]:
    """The invoke's phases as {resource: seconds of work}; empty phases dropped."""
    stream = st.stream_bytes / bandwidth
    run = [{"tpu": st.compute_s, "link": stream}] if st.overlap else [{"link": stream}, {"tpu": st.compute_s}]
    ph = [{"host": st.host_s}, {"link": st.in_bytes / bandwidth}, *run, {"link": st.out_bytes / bandwidth}]
    out = []
    for p in ph:
        p = {r: w for r, w in p.items() if w > 0}
        if p:
            out.append(p)
    return out


def uncontended_s(st: StageLoad, bandwidth: float) -> float:
    """One invoke with the link and the host to itself."""
    return sum(max(p.values()) for p in _phases(st, bandwidth))


def link_s(st: StageLoad, bandwidth: float) -> float:
    return (st.stream_bytes + st.in_bytes + st.out_bytes) / bandwidth


def period_bound(stages, bandwidth: float, host_slots: int = 0) -> float:
    """max(slowest uncontended stage, link work per frame, host work per frame / host slots)."""
    host = sum(s.host_s for s in stages) / host_slots if host_slots else 0.0
    return max(max(uncontended_s(s, bandwidth) for s in stages), sum(link_s(s, bandwidth) for s in stages), host)


class _Worker:
    """One stage's thread: its phases, the frame it holds and its time accounts."""

    def __init__(self, pipe: int, k: int, load: StageLoad, bandwidth: float):
        self.pipe, self.k = pipe, k
        self.phases = _phases(load, bandwidth)
        self.n_phases = len(self.phases)
        self.uncontended = uncontended_s(load, bandwidth)
        self.frame: int | None = None   # frame being invoked or held
        self.phase = -1                 # index into phases; len(phases) = done, holding the output
        self.left: dict[str, float] = {}
        self.since = 0.0                # when the current state began
        self.req = (0.0, 0)             # when the current phase asked for its resources (FIFO order)
        self.acc = {"busy": [], "starved": [], "blocked": []}

    def account(self, kind: str, now: float) -> None:
        self.acc[kind].append((self.frame, now - self.since))
        self.since = now


class _Engine:
    """The event loop of `simulate_many`: workers, queues of frames, the clock."""

    def __init__(self, pipes, bandwidth, F, queue_size, feed, host_slots, link_policy):
        self.pipes, self.F, self.queue_size, self.feed = pipes, F, queue_size, feed
        self.host_slots, self.link_policy = host_slots, link_policy
        self.workers = [[_Worker(i, k, s, bandwidth) for k, s in enumerate(p)] for i, p in enumerate(pipes)]
        self.flat = [w for ws in self.workers for w in ws]
        self.rflat = self.flat[::-1]
        self.fed = [0] * len(pipes)                                  # frames stage 0 has taken
        self.started: list[dict[int, float]] = [{} for _ in pipes]
        self.done: list[list[float]] = [[] for _ in pipes]
        # frame numbers waiting in front of stage k (index k), first in first out
        self.fifo: list[list[list[int]]] = [[[] for _ in range(len(p) + 1)] for p in pipes]
        self.now = 0.0
        self.ticket = itertools.count()

    def begin(self, w: _Worker, phase: int) -> None:
        w.phase = phase
        w.left = dict(w.phases[phase]) if phase < len(w.phases) else {}
        w.req = (self.now, next(self.ticket))

    def try_start(self, w: _Worker) -> bool:
        i = w.pipe
        if w.frame is not None:
            return False
        if w.k == 0:
            f = self.fed[i]
            if f >= self.F and all(len(d) >= self.F for d in self.done):
                return False
            if self.feed is not None and f * self.feed[i] > self.now + EPS:
                return False
            self.fed[i] += 1
            self.started[i][f] = self.now
        else:
            if not self.fifo[i][w.k]:
                return False
            f = self.fifo[i][w.k].pop(0)
        w.account("starved", self.now)
        w.frame = f
        self.begin(w, 0)
        return True

    def try_finish(self, w: _Worker) -> bool:
        """Pass the held output on if the next queue has room."""
        i, k = w.pipe, w.k
        if w.frame is None or w.phase < len(w.phases):
            return False
        if k == len(self.pipes[i]) - 1:
            self.done[i].append(self.now)
        else:
            if len(self.fifo[i][k + 1]) >= self.queue_size:
                return False
            self.fifo[i][k + 1].append(w.frame)
        w.account("blocked", self.now)
        w.frame, w.phase = None, -1
        return True

    def settle(self) -> None:
        """Finishes and starts until nothing changes (fixed order: the last stage first). The
        checks inlined here are try_finish's and try_start's own first tests (no side effects):
        the simulator spends most of the partitioner's refinement in this loop."""
        changed = True
        while changed:
            changed = False
            for w in self.rflat:
                if w.frame is not None:
                    if w.phase < w.n_phases:
                        if not w.left:
                            self.begin(w, w.phase + 1)
                            if w.phase == w.n_phases:
                                w.account("busy", self.now)
                            changed = True
                    if w.phase >= w.n_phases and self.try_finish(w):
                        changed = True
                if w.frame is None and self.try_start(w):
                    changed = True

    def step(self) -> bool:
        """Advance the clock to the next event; False when nothing can move."""
        active = [w for w in self.flat if w.frame is not None and w.phase < w.n_phases]
        arrivals = [] if self.feed is None else [
            self.fed[i] * self.feed[i] - self.now for i, ws in enumerate(self.workers)
            if ws[0].frame is None and self.fed[i] * self.feed[i] > self.now + EPS]
        if not active and not arrivals:
            return False
        n_link = n_host = 0
        for w in active:
            n_link += "link" in w.left
            n_host += "host" in w.left
        link = 1.0 / max(1, n_link)
        host = min(1.0, self.host_slots / n_host) if self.host_slots and n_host else 1.0
        head = None
        if self.link_policy == "fifo" and n_link:
            head = min((w for w in active if "link" in w.left), key=lambda w: w.req)
            link = 1.0
        # each (worker, resource)'s rate: the TPU its own, the link its share (FIFO: the head's
        # alone), the host its share
        rates = [(w, {r: (1.0 if r == "tpu" else host if r == "host" else 0.0 if head is not None and w is not head
                          else link) for r in w.left}) for w in active]
        dt = min([left / rt[r] for w, rt in rates for r, left in w.left.items() if rt[r] > 0] + arrivals)
        self.now += dt
        for w, rt in rates:
            for r in list(w.left):
                w.left[r] -= dt * rt[r]
                if w.left[r] <= EPS:
                    del w.left[r]
        return True


def simulate_many(pipelines, bandwidth: float, frames: int | None = None, queue_size: int = 1,
                  feed: tuple[float, ...] | None = None, host_slots: int = 0,
                  link_policy: str = LINK_POLICY) -> tuple[PipelineSim, ...]:
    """Simulate several pipelines (each a sequence of StageLoad) sharing one link and host.

    Saturated (default): a new frame is always waiting, as when the caller pushes as fast as the
    pipeline takes them; that gives the period. With `feed` (seconds between frames per pipeline)
    frame f arrives at f * feed[i]; fed at the period this gives the latency a frame sees
    without queueing behind earlier ones. `host_slots`: invokes the host serves at full speed at
    once (0: as many as there are stages, no host contention). `link_policy`: "ps" (every active
    transfer gets an equal share) or "fifo" (one transfer at a time, in the order requested)."""
    if link_policy not in ("ps", "fifo"):
        raise ValueError(f"link_policy must be 'ps' or 'fifo', got {link_policy!r}")
    pipes = [list(p) for p in pipelines]
    if not pipes or any(not p for p in pipes):
        raise ValueError("every pipeline needs at least one stage")
    if bandwidth <= 0:
        raise ValueError("bandwidth must be > 0")
    F = frames or max(MIN_FRAMES, 4 * max(len(p) for p in pipes))
    e = _Engine(pipes, bandwidth, F, queue_size, feed, host_slots, link_policy)
    for w in e.flat:
        e.try_start(w)
    while any(len(d) < F for d in e.done):
        e.settle()
        if not e.step():
            break  # nothing can move (cannot happen with a source that always feeds)
    sims = [_summarise(e.workers[i], e.started[i], e.done[i], F, bandwidth, pipes[i], host_slots)
            for i in range(len(pipes))]
    # utilisation in the steady state: work per frame x frames per second, summed over pipelines
    link = sum(sum(link_s(s, bandwidth) for s in p) / sim.period_s for p, sim in zip(pipes, sims))
    host = sum(sum(s.host_s for s in p) / sim.period_s for p, sim in zip(pipes, sims)) / (host_slots or sum(map(len, pipes)))
    return tuple(replace(sim, link_utilisation=link, host_utilisation=host) for sim in sims)


def saturated_period(stages, bandwidth: float, frames: int | None = None, queue_size: int = 1,
                     host_slots: int = 0, link_policy: str = LINK_POLICY) -> float:
    """`simulate_many([stages], ...)[0].period_s`, alone: the partitioner's refinement asks for
    nothing else, thousands of times. With the host uncontended (host_slots 0) and the link FIFO
    the same event loop runs on plain lists (`_fifo_period`), the same float operations in the
    same order, so the period is the same number (tests/test_pipeline_sim.py compares them);
    otherwise the full simulator."""
    stages = list(stages)
    if host_slots or link_policy != "fifo" or not stages or bandwidth <= 0:
        return simulate_many([stages], bandwidth, frames, queue_size, host_slots=host_slots,
                             link_policy=link_policy)[0].period_s
    phases = [_phases(s, bandwidth) for s in stages]
    F = frames or max(MIN_FRAMES, 4 * len(stages))
    period = _fifo_period_native(phases, F, queue_size)
    return period if period is not None else _fifo_period(phases, F, queue_size)


_FIFO_SOURCE = Path(__file__).with_name("_fifo_period.c")
_fifo_lib: list = []  # [the typed library, or None], loaded at the first call


def _fifo_period_native(phases, F: int, queue_size: int) -> float | None:
    """`_fifo_period` run by `_fifo_period.c` (the same loop and the same double operations, so
    the same period; ~50x faster, which is what lets the partition's refinement simulate every
    candidate a proof needs), or None without a C compiler (TPU_PIPELINE_NO_NATIVE=1) or where
    the loop would not end normally (the Python loop then raises as it always did)."""
    if not _fifo_lib:
        lib = load_library(_FIFO_SOURCE)
        if lib is not None:
            lib.fifo_period.restype = ctypes.c_double
            lib.fifo_period.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_double),
                                        ctypes.c_int, ctypes.c_int]
        _fifo_lib.append(lib)
    lib = _fifo_lib[0]
    if lib is None:
        return None
    nph = [len(ph) for ph in phases]
    work = [w for ph in phases for p in ph for w in (p.get("tpu", 0.0), p.get("link", 0.0), p.get("host", 0.0))]
    period = lib.fifo_period(len(phases), (ctypes.c_int * len(nph))(*nph), (ctypes.c_double * max(1, len(work)))(*work),
                             F, queue_size)
    return period if period >= 0.0 else None


def _fifo_period(phases, F: int, queue_size: int) -> float:
    """_Engine's loop for one saturated pipeline, host uncontended, link FIFO: per stage the work
    left on (tpu, link, host) as three floats (0.0: not asked for; a demand is dropped at <= EPS
    as there), tickets in the order phases begin (the head of the link is the smallest: requests
    are made in time order). No accounting: only the completion times."""
    n = len(phases)
    work = [[(p.get("tpu", 0.0), p.get("link", 0.0), p.get("host", 0.0)) for p in ph] for ph in phases]
    nph = [len(ph) for ph in phases]
    held = [False] * n              # the stage holds a frame (invoking it, or its output)
    phase = [-1] * n
    lt, ll, lh, tick = [0.0] * n, [0.0] * n, [0.0] * n, [0] * n
    queue = [0] * (n + 1)           # frames waiting in front of stage k
    counter, fed, done, now = 0, 0, [], 0.0
    order = range(n - 1, -1, -1)    # settle's fixed order: the last stage first

    def start(k):
        nonlocal counter, fed
        if k == 0:
            if fed >= F and len(done) >= F:
                return False
            fed += 1
        elif queue[k]:
            queue[k] -= 1
        else:
            return False
        held[k], phase[k] = True, 0
        counter += 1
        tick[k] = counter
        lt[k], ll[k], lh[k] = work[k][0]
        return True

    for k in range(n):
        start(k)
    while len(done) < F:
        changed = True
        while changed:  # _Engine.settle
            changed = False
            for k in order:
                if held[k]:
                    if phase[k] < nph[k] and lt[k] == 0.0 and ll[k] == 0.0 and lh[k] == 0.0:
                        phase[k] += 1
                        counter += 1
                        tick[k] = counter
                        if phase[k] < nph[k]:
                            lt[k], ll[k], lh[k] = work[k][phase[k]]
                        changed = True
                    if phase[k] >= nph[k]:  # try_finish
                        if k == n - 1:
                            done.append(now)
                        elif queue[k + 1] < queue_size:
                            queue[k + 1] += 1
                        else:
                            continue
                        held[k], phase[k] = False, -1
                        changed = True
                if not held[k] and (k == 0 or queue[k]) and start(k):
                    changed = True
        dt = _fifo_step(held, phase, nph, lt, ll, lh, tick)
        if dt is None:
            break
        now += dt
    half = F // 2
    return (done[F - 1] - done[half - 1]) / (F - half)


def _fifo_step(held, phase, nph, lt, ll, lh, tick) -> float | None:
    """_Engine.step for `_fifo_period`: the time to the next event, every demand served for it
    (the link's head is the active request with the smallest ticket); None when nothing is active."""
    n = len(held)
    head, dt, active = -1, float("inf"), False
    for k in range(n):
        if held[k] and phase[k] < nph[k]:
            active = True
            if ll[k] > 0.0 and (head < 0 or tick[k] < tick[head]):
                head = k
            if 0.0 < lt[k] < dt:
                dt = lt[k]
            if 0.0 < lh[k] < dt:
                dt = lh[k]
    if not active:
        return None
    if head >= 0 and ll[head] < dt:
        dt = ll[head]
    for k in range(n):
        if held[k] and phase[k] < nph[k]:
            if lt[k] > 0.0:
                lt[k] -= dt
                if lt[k] <= EPS:
                    lt[k] = 0.0
            if lh[k] > 0.0:
                lh[k] -= dt
                if lh[k] <= EPS:
                    lh[k] = 0.0
            if ll[k] > 0.0:
                if k == head:
                    ll[k] -= dt
                if ll[k] <= EPS:
                    ll[k] = 0.0
    return dt


def _summarise(ws, started, done, F, bandwidth, loads, host_slots) -> PipelineSim:
    half = F // 2
    window = done[F - 1] - done[half - 1]
    period = window / (F - half)
    latency = sum(done[f] - started[f] for f in range(half, F)) / (F - half)
    frames = set(range(half, F))
    stats = []
    for w in ws:
        per = {kind: sum(d for f, d in w.acc[kind] if f in frames) / len(frames) for kind in ("busy", "blocked")}
        starved = max(0.0, period - per["busy"] - per["blocked"])
        stats.append(StageStats(per["busy"], starved, per["blocked"], w.uncontended))
    return PipelineSim(period, latency, period_bound(loads, bandwidth, host_slots), tuple(stats), 0.0, 0.0)


def simulate(stages, bandwidth: float, frames: int | None = None, queue_size: int = 1,
             host_slots: int = 0, link_policy: str = LINK_POLICY) -> PipelineSim:
    """Steady state of one pipeline: `stages` is a sequence of StageLoad, `bandwidth` the shared
    link's bytes per second. The period comes from the saturated run; the latency from a second
    run fed at that period (a frame's own time through the stages and the link it shares)."""
    return simulate_pipelines([stages], bandwidth, frames, queue_size, host_slots, link_policy)[0]


def simulate_pipelines(pipelines, bandwidth: float, frames: int | None = None, queue_size: int = 1,
                       host_slots: int = 0, link_policy: str = LINK_POLICY) -> tuple[PipelineSim, ...]:
    """Several pipelines on one host: periods saturated, latencies fed at those periods."""
    sat = simulate_many(pipelines, bandwidth, frames, queue_size, host_slots=host_slots, link_policy=link_policy)
    paced = simulate_many(pipelines, bandwidth, frames, queue_size, feed=tuple(s.period_s * (1 + 1e-9) for s in sat),
                          host_slots=host_slots, link_policy=link_policy)
    return tuple(replace(s, latency_s=p.latency_s) for s, p in zip(sat, paced))

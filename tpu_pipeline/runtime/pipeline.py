"""A pipelined runner with the semantics of Coral's PipelinedModelRunner, for any stage.

One worker thread per segment; queues of one item between them (as Coral's); tensors passed by
NAME, so a tensor produced by segment 1 and read by segment 3 travels past segment 2 untouched;
`push({})` (or `push(None)`) ends the stream and `pop()` returns None once everything before it
came out. A stage that raises stops the whole pipeline: the stages before it stop at once, the
stages after it finish the items it had already passed on (so no result computed before the
failure is lost), then `push` and `pop` raise `PipelineError` naming that stage and its error.
Nothing waits forever: workers poll a stop flag while blocked on a queue, and `pop(timeout=...)`
gives up naming the stage still busy.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from tpu_pipeline.toolchain.errors import DeviceError, ToolchainError

_END = object()
_FAIL = object()  # travels downstream from a failed stage, after the items it had passed on


@dataclass
class Stage:
    """A pipeline stage: `fn(dict name -> array) -> dict name -> array` over named tensors."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    fn: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]
    times: list[float] = field(default_factory=list)  # seconds per invocation

    @property
    def total_s(self) -> float:
        return sum(self.times)

    @property
    def count(self) -> int:
        return len(self.times)


class PipelineError(DeviceError):
    """A stage failed; `stage` is its index and `cause` the exception it raised."""

    def __init__(self, message: str, stage: int | None = None, cause: BaseException | None = None):
        super().__init__(message)
        self.stage = stage
        self.cause = cause
        if isinstance(cause, ToolchainError):
            self.exit_code = cause.exit_code


class PipelinedRunner:
    def __init__(self, stages: Sequence[Stage], final_outputs: Sequence[str] | None = None,
                 queue_size: int = 1, poll_s: float = 0.02):
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        self.stages = list(stages)
        self.final_outputs = tuple(final_outputs) if final_outputs is not None else tuple(stages[-1].outputs)
        # What must travel past stage i: tensors read by a later stage or returned at the end.
        self._keep_after = []
        for i in range(len(stages)):
            later = {t for s in stages[i + 1:] for t in s.inputs}
            self._keep_after.append(later | set(self.final_outputs))
        self._poll = poll_s
        self._queues = [queue.Queue(maxsize=queue_size) for _ in range(len(stages) + 1)]
        self._stop = threading.Event()  # closed or timed out: every thread leaves
        self._failed_at: int | None = None  # stages upstream of it (and the pusher) leave
        self._error: PipelineError | None = None
        self._lock = threading.Lock()
        self._busy: list[int | None] = [None] * len(stages)  # sequence number each stage is working on
        self._fail_seen = False
        self._pushed = 0
        self._ended = False
        self._threads = [threading.Thread(target=self._work, args=(i,), name=f"stage-{i}", daemon=True)
                         for i in range(len(stages))]
        for t in self._threads:
            t.start()

    # ---- worker side ----------------------------------------------------------------------
    def _aborted(self, k: int) -> bool:
        """Should stage k (-1: the caller pushing) give up? Downstream of a failure, stages keep
        going so that the items already past the failed stage still come out."""
        return self._stop.is_set() or (self._failed_at is not None and k < self._failed_at)

    def _put(self, q: queue.Queue, item, k: int) -> bool:
        while not self._aborted(k):
            try:
                q.put(item, timeout=self._poll)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, q: queue.Queue, k: int):
        while not self._aborted(k):
            try:
                return q.get(timeout=self._poll)
            except queue.Empty:
                continue
        return None

    def _fail(self, i: int, exc: BaseException) -> None:
        stage = self.stages[i]
        detail = str(exc) if isinstance(exc, ToolchainError) else f"{type(exc).__name__}: {exc}"
        err = PipelineError(f"segment {i} ({stage.name}) failed: {detail}", i, exc)
        with self._lock:
            if self._error is None:
                self._error = err
                self._failed_at = i
        self._put(self._queues[i + 1], _FAIL, i + 1)  # behind what this stage already passed on

    def _work(self, i: int) -> None:
        stage = self.stages[i]
        q_in, q_out = self._queues[i], self._queues[i + 1]
        keep = self._keep_after[i]
        while True:
            item = self._get(q_in, i)
            if item is None:  # stopped
                return
            if item is _END or item is _FAIL:
                self._put(q_out, item, i + 1)
                return
            seq, tensors = item
            self._busy[i] = seq
            try:
                missing = [n for n in stage.inputs if n not in tensors]
                if missing:
                    raise KeyError(f"input tensor(s) {missing} reach no earlier segment or the host")
                t0 = time.perf_counter()
                out = stage.fn({n: tensors[n] for n in stage.inputs})
                stage.times.append(time.perf_counter() - t0)
                absent = [n for n in stage.outputs if n not in out]
                if absent:
                    raise KeyError(f"did not produce output tensor(s) {absent}")
            except BaseException as exc:  # noqa: BLE001 - any failure stops the pipeline
                self._fail(i, exc)
                return
            finally:
                self._busy[i] = None
            merged = {k: v for k, v in tensors.items() if k in keep}
            merged.update({k: v for k, v in out.items() if k in keep})
            if not self._put(q_out, (seq, merged), i + 1):
                return

    # ---- caller side ----------------------------------------------------------------------
    def _raise(self):
        if self._error is None:
            raise PipelineError("the pipeline was closed")
        raise self._error

    def push(self, tensors: Mapping[str, np.ndarray] | None) -> None:
        """Feed one input (tensors by name); an empty dict or None ends the stream."""
        if self._error is not None:
            self._raise()
        if self._ended:
            raise ValueError("push after the end of the stream")
        if not tensors:
            self._ended = True
            item = _END
        else:
            item = (self._pushed, dict(tensors))
            self._pushed += 1
        if not self._put(self._queues[0], item, -1):
            self._raise()

    def pop(self, timeout: float | None = None) -> dict[str, np.ndarray] | None:
        """The next result's final outputs in push order, or None after the end of the stream."""
        if self._fail_seen:
            self._raise()
        q = self._queues[-1]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                item = q.get(timeout=self._poll)
            except queue.Empty:
                if self._stop.is_set() and q.empty():
                    self._raise()
                if deadline is not None and time.monotonic() > deadline:
                    busy = [i for i, s in enumerate(self._busy) if s is not None]
                    where = f"segment {busy[0]} ({self.stages[busy[0]].name}) is still running" if busy else "no segment is running"
                    err = PipelineError(f"no result within {timeout:g} s: {where}", busy[0] if busy else None)
                    with self._lock:
                        if self._error is None:
                            self._error = err
                    self._stop.set()
                    self._raise()
                continue
            if item is _END:
                return None
            if item is _FAIL:
                self._fail_seen = True
                self._raise()
            _, tensors = item
            return {k: tensors[k] for k in self.final_outputs}

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def error(self) -> PipelineError | None:
        return self._error


@dataclass
class PipelineRun:
    outputs: list[dict[str, np.ndarray]]  # one per input that came out, in order
    wall_s: float
    error: PipelineError | None = None  # set if the pipeline stopped early

    @property
    def throughput_per_s(self) -> float | None:
        return len(self.outputs) / self.wall_s if self.outputs and self.wall_s > 0 else None


def run_pipeline(stages: Sequence[Stage], inputs: Iterable[Mapping[str, np.ndarray]],
                 final_outputs: Sequence[str] | None = None, timeout: float | None = None,
                 on_result: Callable[[int], None] | None = None) -> PipelineRun:
    """Stream `inputs` through the stages (a feeder thread pushes, this thread pops).

    Never raises for a stage failure: the run stops and `error` says why, with the outputs that
    came out before it. `timeout` bounds the wait for each result.
    """
    runner = PipelinedRunner(stages, final_outputs)
    feed_error: list[BaseException] = []

    def feed():
        try:
            for x in inputs:
                runner.push(x)
        except PipelineError:
            return  # the popping side reports it
        except BaseException as exc:  # noqa: BLE001 - a bad input iterator ends the stream early
            feed_error.append(exc)
        try:
            runner.push({})
        except PipelineError:
            pass

    outputs: list[dict[str, np.ndarray]] = []
    t0 = time.perf_counter()
    feeder = threading.Thread(target=feed, name="feeder", daemon=True)
    feeder.start()
    error = None
    try:
        while True:
            out = runner.pop(timeout=timeout)
            if out is None:
                break
            outputs.append(out)
            if on_result:
                on_result(len(outputs))
    except PipelineError as exc:
        error = exc
    if error is None and feed_error:
        exc = feed_error[0]
        error = PipelineError(f"feeding inputs failed: {type(exc).__name__}: {exc}", None, exc)
    wall = time.perf_counter() - t0
    runner.close()
    feeder.join(1.0)
    return PipelineRun(outputs, wall, error)

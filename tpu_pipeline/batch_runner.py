"""`tpu-pipeline batch` and `tpu_pipeline.batch`: one command over many models x devices x budgets
(a NAS population, a model zoo, a CI matrix), one row per job in one table.

Every job runs in its own process, so a job that fails, hangs or crashes (a segfault in a runtime)
is one row of the table and never stops the batch. Locally, up to `jobs` processes at a time are
forked from a server process that has the toolchain imported already (a job starts in
milliseconds); a job over its time limit is killed. With `cluster=ADDRESS` the jobs go to an
existing Dask cluster (`pip install tpu-pipeline[distributed]`); each Dask task runs its job in
a child process under the same time limit, and the model travels as bytes, so the workers need
no shared file system.

Row status: `ok` (exit code 0), `error` (the command's exit code: 1, 2, 3, 4; 70 for a bug),
`timeout` (4: the job's time limit passed), `crashed` (70: the job's process died, e.g. by a signal).
"""

from __future__ import annotations

import csv
import io
import os
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from tpu_pipeline.toolchain.errors import ToolchainError, UsageError

COMMANDS = ("inspect", "fit", "profile", "compile")
DEFAULT_JOB_TIMEOUT_S = 600.0
INTERNAL_ERROR = 70
TIMEOUT_EXIT = 4
# The figures each command puts in its row (keys of the command's --json, "a.b" inside "a"), in
# column order; a row's column is the last part of the key.
FIGURES = {
    # inspect's `fits`: the TFLite Micro arena head within the row's budget (none without a budget)
    "inspect": ("ops", "parameter_bytes", "peak_bytes", "tflm_arena_bytes", "any_order_lower_bound", "fits"),
    "fit": ("fits", "arena_head_bytes", "baseline_peak_bytes", "latency_s_predicted", "latency_overhead_predicted"),
    "profile": ("backend", "latency_median_s", "throughput_per_s", "arena_bytes_predicted", "latency_s_predicted"),
    "compile": ("num_segments", "predicted.throughput_per_s", "predicted.latency_s", "gain_throughput", "solver.gap"),
}
# what each command's worker process imports before it forks jobs
_PRELOAD = {
    "inspect": ("tpu_pipeline.api", "tpu_pipeline.toolchain.inspect", "tpu_pipeline.toolchain.ir"),
    "fit": ("tpu_pipeline.api", "tpu_pipeline.toolchain.fit"),
    "profile": ("tpu_pipeline.api", "tpu_pipeline.runtime.backends", "tpu_pipeline.toolchain.cost.mcu"),
    "compile": ("tpu_pipeline.api", "tpu_pipeline.toolchain.compile"),
}


@dataclass(frozen=True)
class Job:
    index: int
    command: str
    model: str | bytes          # a path, or the model's bytes (`label` names it)
    label: str
    device: str | None = None
    budget: int | None = None
    options: dict = field(default_factory=dict)
    timeout: float = DEFAULT_JOB_TIMEOUT_S
    out: str | None = None      # compile: the job's output folder


@dataclass(frozen=True)
class Row:
    model: str
    device: str | None
    budget: int | None
    command: str
    status: str                 # ok, error, timeout, crashed
    exit_code: int
    seconds: float
    figures: dict = field(default_factory=dict)
    error: str = ""

    def to_json(self) -> dict:
        return {"model": self.model, "device": self.device, "budget": self.budget, "command": self.command,
                "status": self.status, "exit_code": self.exit_code, "seconds": round(self.seconds, 3),
                **self.figures, "error": self.error}


@dataclass(frozen=True)
class BatchResult:
    rows: tuple[Row, ...]
    command: str
    engine: str                 # "local (N processes)" or "dask (ADDRESS)"

    @property
    def columns(self) -> tuple[str, ...]:
        return ("model", "device", "budget", "command", "status", "exit_code", "seconds",
                *(_column(k) for k in FIGURES[self.command]), "error")

    @property
    def failed(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.status != "ok")

    def to_json(self) -> dict:
        return {"command": self.command, "engine": self.engine, "jobs": len(self.rows),
                "ok": len(self.rows) - len(self.failed), "failed": len(self.failed),
                "rows": [r.to_json() for r in self.rows]}

    def table(self) -> list[list[str]]:
        """The rows as strings, in `columns` order (None as empty)."""
        out = []
        for r in self.rows:
            d = r.to_json()
            out.append(["" if d.get(c) is None else _cell(d.get(c)) for c in self.columns])
        return out

    def to_csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(self.columns)
        w.writerows(self.table())
        return buf.getvalue()


def _column(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _figure(data: dict, key: str):
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


# ---- the jobs ----------------------------------------------------------------------------------
def plan_jobs(models: Sequence, command: str = "inspect", devices: Sequence = (None,), budgets: Sequence = (None,),
              options: dict | None = None, job_timeout: float = DEFAULT_JOB_TIMEOUT_S,
              out: str | os.PathLike | None = None) -> list[Job]:
    """The jobs of a batch: every model x device x budget. `models`: paths, folders (their .tflite
    files, sorted) and bytes."""
    if command not in COMMANDS:
        raise UsageError(f"batch runs one of {', '.join(COMMANDS)}, not '{command}'")
    if not (0 < job_timeout < float("inf")):
        raise UsageError(f"--job-timeout must be a number of seconds > 0, got {job_timeout}")
    devices, budgets = list(devices) or [None], list(budgets) or [None]
    if command == "inspect" and devices != [None]:
        raise UsageError("inspect predicts for TFLite Micro and TFLite; it takes no --device")
    if command == "profile" and None in devices:
        raise UsageError("profile needs --device (one or more)")
    if command == "profile" and budgets != [None]:
        raise UsageError("profile takes no --budget")
    if command == "compile" and "n" not in (options or {}):
        raise UsageError("compile needs -n (the number of segments)")
    sources: list[tuple[str | bytes, str]] = []
    for m in models:
        if isinstance(m, (bytes, bytearray)):
            sources.append((bytes(m), f"<bytes {len(sources)}>"))
        elif Path(m).is_dir():
            found = sorted(Path(m).glob("*.tflite"))
            if not found:
                raise UsageError(f"{m}: no .tflite files in this folder")
            sources += [(str(p), str(p)) for p in found]
        else:
            sources.append((os.fspath(m), os.fspath(m)))
    if not sources:
        raise UsageError("no models given")
    jobs = []
    for model, label in sources:
        for device in devices:
            for budget in budgets:
                i = len(jobs)
                folder = None
                if command == "compile" and out is not None:
                    folder = str(Path(out) / f"{i:04d}-{Path(label).stem.strip('<>').replace(' ', '_')}")
                jobs.append(Job(i, command, model, label, device, budget, dict(options or {}), job_timeout, folder))
    return jobs


def run_job(job: Job) -> Row:
    """One job in this process: the API call, its figures, or its error as a row."""
    from tpu_pipeline import api

    t0 = time.monotonic()
    o = dict(job.options)
    try:
        if job.command == "inspect":
            r = api.inspect(job.model, name=_name(job))
        elif job.command == "fit":
            r = api.fit(job.model, budget=job.budget, device=job.device, name=_name(job), **o)
        elif job.command == "profile":
            r = api.profile(job.model, job.device, **o)
        else:
            n = o.pop("n")
            with _scratch(job.out) as folder:
                r = api.compile(job.model, n, out=folder, device=job.device or "coral-usb", budget=job.budget, **o)
        data = r.to_json()
        figures = {_column(k): _figure(data, k) for k in FIGURES[job.command]}
        if job.command == "inspect":
            figures["fits"] = None if job.budget is None else data["tflm_arena_bytes"] <= job.budget
        return Row(job.label, job.device, job.budget, job.command, "ok", 0, time.monotonic() - t0, figures)
    except ToolchainError as exc:
        return _failed(job, "error", exc.exit_code, str(exc), t0)
    except Exception as exc:  # a bug: the batch goes on, the row says what happened
        return _failed(job, "error", INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}", t0)


def _name(job: Job) -> str:
    return Path(job.label).name if not isinstance(job.model, bytes) else "model.tflite"


class _scratch:
    """The compile job's output folder, or a temporary one removed afterwards."""

    def __init__(self, folder: str | None):
        self.folder, self.tmp = folder, None

    def __enter__(self) -> str:
        if self.folder is not None:
            return self.folder
        import tempfile

        self.tmp = tempfile.mkdtemp(prefix="tpu-pipeline-batch-")
        return str(Path(self.tmp) / "out")

    def __exit__(self, *exc) -> None:
        if self.tmp is not None:
            import shutil

            shutil.rmtree(self.tmp, ignore_errors=True)


def _failed(job: Job, status: str, code: int, message: str, t0: float) -> Row:
    line = message.strip().splitlines()[0] if message.strip() else status
    return Row(job.label, job.device, job.budget, job.command, status, code, time.monotonic() - t0, {}, line)


# ---- local worker processes --------------------------------------------------------------------
def _child(job: Job, conn) -> None:
    try:
        conn.send(run_job(job))
    finally:
        conn.close()


def run_local(jobs: list[Job], workers: int, on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """Up to `workers` jobs at a time, each in a process forked from a preloaded server; a job past
    its time limit is killed (only that job)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(_PRELOAD[jobs[0].command]) if jobs else [])
    pending = list(jobs)
    running: dict[int, tuple[Job, Any, Any, float]] = {}   # sentinel -> (job, process, connection, start)
    rows: dict[int, Row] = {}

    def done(job: Job, row: Row) -> None:
        rows[job.index] = row
        if on_row is not None:
            on_row(row)

    try:
        while pending or running:
            while pending and len(running) < workers:
                job = pending.pop(0)
                recv, send = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_child, args=(job, send), daemon=True)
                p.start()
                send.close()
                running[p.sentinel] = (job, p, recv, time.monotonic())
            next_deadline = min(start + job.timeout for job, _, _, start in running.values())
            ready = wait(list(running), timeout=max(0.0, next_deadline - time.monotonic()))
            for s in ready:
                job, p, recv, start = running.pop(s)
                row = recv.recv() if recv.poll() else None
                p.join()
                recv.close()
                if row is None:
                    why = f"the job's process died (exit status {p.exitcode})"
                    row = _failed(job, "crashed", INTERNAL_ERROR, why, start)
                done(job, row)
            now = time.monotonic()
            for s, (job, p, recv, start) in list(running.items()):
                if now >= start + job.timeout:
                    p.kill()
                    p.join()
                    recv.close()
                    del running[s]
                    done(job, _failed(job, "timeout", TIMEOUT_EXIT,
                                      f"time limit of {job.timeout:g} s exceeded; the job was stopped", start))
    finally:
        for job, p, recv, _ in running.values():  # interrupted: leave no job behind
            p.kill()
            p.join()
    return [rows[j.index] for j in jobs]


# ---- a Dask cluster ----------------------------------------------------------------------------
def run_isolated(job: Job) -> Row:
    """On a Dask worker: the job in a child interpreter under its time limit (a Dask worker is a
    daemon process, which may not fork multiprocessing children, and a crash must not kill it)."""
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "tpu_pipeline.batch_runner"], input=pickle.dumps(job),
                              capture_output=True, timeout=job.timeout)
    except subprocess.TimeoutExpired:
        return _failed(job, "timeout", TIMEOUT_EXIT, f"time limit of {job.timeout:g} s exceeded; the job was stopped",
                       t0)
    if proc.returncode != 0 or not proc.stdout:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return _failed(job, "crashed", INTERNAL_ERROR, f"the job's process died (exit status {proc.returncode}) "
                                                       f"{tail[0]}".strip(), t0)
    return pickle.loads(proc.stdout)


def run_dask(jobs: list[Job], address: str, on_row: Callable[[Row], None] | None = None) -> list[Row]:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise UsageError("--cluster needs Dask: pip install 'tpu-pipeline[distributed]'") from None
    shipped = [replace(j, model=Path(j.model).read_bytes()) if isinstance(j.model, str) and Path(j.model).is_file()
               else j for j in jobs]
    try:
        client = Client(address, timeout="10s")
    except OSError as exc:
        from tpu_pipeline.toolchain.errors import DeviceError

        raise DeviceError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
    rows: dict[int, Row] = {}
    with client:
        futures = {client.submit(run_isolated, j, pure=False, key=f"tpu-pipeline-job-{j.index}-{time.time_ns()}"): j
                   for j in shipped}
        for fut in as_completed(futures):
            job = futures[fut]
            try:
                row = fut.result()
            except Exception as exc:  # the worker died under the task: a row, not the end of the batch
                row = _failed(job, "crashed", INTERNAL_ERROR, f"the Dask task failed: {type(exc).__name__}: {exc}",
                              time.monotonic())
            rows[job.index] = row
            if on_row is not None:
                on_row(row)
    return [rows[j.index] for j in jobs]


def batch(models, *, command: str = "inspect", devices: Iterable = (None,), budgets: Iterable = (None,),
          jobs: int | None = None, cluster: str | None = None, job_timeout: float = DEFAULT_JOB_TIMEOUT_S,
          options: dict | None = None, out: str | os.PathLike | None = None,
          on_row: Callable[[Row], None] | None = None) -> BatchResult:
    """`tpu_pipeline.batch` (`tpu-pipeline batch`): run `command` (inspect, fit, profile or compile)
    over every model x device x budget, a failing job a row, never the end of the batch: `models` are paths, folders or bytes;
    `options` the command's other options (`{"time_limit": 10}`, compile's `{"n": 4}`); `jobs`
    local processes at a time (default: the CPU count); `cluster` a Dask scheduler address
    instead; `job_timeout` seconds per job; `out` a folder for compile's outputs (default: none
    kept). `on_row` is called with each row as it finishes. Returns a `BatchResult` (`.rows`, one
    per job in job order; `.to_csv()`, `.to_json()`)."""
    if isinstance(models, (str, os.PathLike, bytes)):
        models = [models]
    planned = plan_jobs(list(models), command, list(devices), list(budgets), options, job_timeout, out)
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    if cluster:
        rows = run_dask(planned, cluster, on_row)
        engine = f"dask ({cluster})"
    else:
        workers = jobs or os.cpu_count() or 1
        rows = run_local(planned, workers, on_row)
        engine = f"local ({workers} processes)"
    return BatchResult(tuple(rows), command, engine)


def _main() -> None:
    """`python -m tpu_pipeline.batch_runner`: one pickled Job on stdin, its pickled Row on stdout."""
    from tpu_pipeline import batch_runner  # the package's classes, not __main__'s, so the row unpickles

    job = pickle.loads(sys.stdin.buffer.read())
    row = batch_runner.run_job(job)
    sys.stdout.buffer.write(pickle.dumps(row))


if __name__ == "__main__":
    _main()

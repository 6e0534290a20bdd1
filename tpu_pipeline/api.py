"""The Python API: every command as a function (docs/api.md).

    import tpu_pipeline as tp
    r = tp.inspect("model.tflite")            # a path, or the model's bytes
    r.peak_bytes, r.tflm_arena_bytes          # typed figures
    r.to_json()                               # == `tpu-pipeline inspect model.tflite --json`

Each function takes the options of its command under the flag's name (`--time-limit` ->
`time_limit`, `--no-rewrite` -> `no_rewrite`), returns a frozen dataclass whose `to_json()` is
exactly what the command prints with `--json`, and raises the `ToolchainError` subclass the
command turns into its exit code (`UsageError`/`ModelError` 2, `InfeasibleError` 3, `DeviceError`
4, `VerificationError` 1). The command line calls these functions: there is one code path.
Writing is optional where the command's `-o` is: without `output` the result carries the bytes.

The API is where a call starts: it resolves a device name or path to a `Device` and a kernel-set
name to a `KernelSet` once, and everything below takes those objects. Its imports are at the top
(the API is loaded lazily by `tpu_pipeline/__init__.py`, and the command line imports it only
when a command runs), but for the one lazy loader, `_fit`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from tpu_pipeline.runtime import backends, deployment  # the API sits above the runtime
from tpu_pipeline.toolchain import report_html
from tpu_pipeline.toolchain.compile import compile_models
from tpu_pipeline.toolchain.cost.edgetpu import PS_PER_S, EdgeTpuCostModel
from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
from tpu_pipeline.toolchain.cost.op_timing import tflm_op_times
from tpu_pipeline.toolchain.device import Device, KernelSet, available_devices, kernel_set, load_device
from tpu_pipeline.toolchain.errors import (DeviceError, InfeasibleError, ModelError, ToolchainError, UsageError,
                                           VerificationError)
from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena, tflm_refusal
from tpu_pipeline.toolchain.deploy.banks import outside_input_bytes, profile_placement, wait_seconds
from tpu_pipeline.toolchain.inspect import summarize
from tpu_pipeline.toolchain.ir import to_model
from tpu_pipeline.toolchain.loader import load, load_exact
from tpu_pipeline.toolchain.memory import TFLITE, TFLM, Semantics, get_semantics, lifetimes, plan_for_tflm, tflite_arena, tflm_greedy
from tpu_pipeline.toolchain.memory.offchip import offchip_traffic
from tpu_pipeline.toolchain.memory.tflm_target import export_plan_offsets, split_tail, target_arena, target_tail
from tpu_pipeline.toolchain.report import json_default, plot_frontier, plot_live_bytes
from tpu_pipeline.toolchain.schedule import schedule as schedule_graph
from tpu_pipeline.toolchain.tflite import model_to_bytes, with_offline_plan, write_bytes_atomic, write_model
from tpu_pipeline.toolchain.tflite.io import check_output
from tpu_pipeline.toolchain.tflite.metadata import total_tensor_count

Progress = Callable[[str], None]

__all__ = ["inspect", "schedule", "plan", "fit", "compile", "profile", "run",
           "InspectResult", "ScheduleResult", "PlanResult", "FitResult", "CompileResult", "RunResult",
           "ProfileResult", "ToolchainError", "UsageError", "ModelError", "InfeasibleError",
           "DeviceError", "VerificationError"]


def _plain(data: Mapping) -> dict:
    """A JSON-able copy (numpy scalars, dataclasses and tuples made plain), as `--json` prints it."""
    return json.loads(json.dumps(data, default=json_default))


@dataclass(frozen=True)
class _Result:
    data: Mapping[str, Any] = field(repr=False, compare=False)

    def to_json(self) -> dict:
        """The command's `--json` output for the same call (a fresh dict each time)."""
        return json.loads(json.dumps(self.data))


@dataclass(frozen=True)
class InspectResult(_Result):
    model: str = ""
    ops: int = 0
    tensors: int = 0
    parameter_bytes: int = 0
    peak_bytes: int = 0                 # most live bytes at one step, stored order, tflm semantics
    peak_op: str = ""                   # "<position> <OPCODE>" of the op at the peak
    tflm_arena_bytes: int = 0           # TFLite Micro's arena head with its own planner (predicted)
    tflite_arena_bytes: int = 0         # TFLite's arena, tensors only (predicted)
    any_order_lower_bound: int = 0
    live_bytes: tuple[int, ...] = field(default=(), repr=False)
    summary: Any = field(default=None, repr=False, compare=False)   # toolchain.inspect.ModelSummary


@dataclass(frozen=True)
class ScheduleResult(_Result):
    model: str = ""
    output: str | None = None
    peak_bytes: int = 0                 # the new order's peak
    stored_peak_bytes: int = 0          # the file's order
    lower_bound: int = 0
    proven_optimal: bool = False
    method: str = ""
    tflm_head_before: int = 0
    tflm_head_after: int = 0
    order: tuple[int, ...] = field(default=(), repr=False)
    model_bytes: bytes | None = field(default=None, repr=False)   # the reordered model (with output=...)
    schedule: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class PlanResult(_Result):
    model: str = ""
    output: str | None = None
    planned_bytes: int = 0              # TFLite Micro's arena head with our offline plan
    lower_bound: int = 0                # = the order's peak
    tflm_planner_bytes: int = 0         # its own planner's head (predicted)
    proven_optimal: bool = False
    planner: str = ""
    model_bytes: bytes = field(default=b"", repr=False)


@dataclass(frozen=True)
class FitResult(_Result):
    model: str = ""
    output: str | None = None
    fits: bool = False
    budget_bytes: int | None = None
    arena_head_bytes: int = 0
    baseline_peak_bytes: int = 0
    latency_s_predicted: float = 0.0
    baseline_latency_s_predicted: float = 0.0
    frontier: tuple[tuple[int, float], ...] = ()     # (arena peak bytes, predicted latency s), fastest first
    model_bytes: bytes = field(default=b"", repr=False)
    fitted: Any = field(default=None, repr=False, compare=False)   # toolchain.fit.FittedModel


@dataclass(frozen=True)
class CompileResult(_Result):
    models: tuple[str, ...] = ()
    out_dir: str = ""
    num_segments: int = 0
    files: tuple[str, ...] = ()
    throughput_per_s: float = 0.0       # predicted (simulated pipeline)
    latency_s: float = 0.0
    gain_throughput: float | None = None   # over Coral's heuristic, same cost model
    gap: float | None = None            # the period's distance to its proven lower bound
    proven_optimal: bool = False
    compiled: Any = field(default=None, repr=False, compare=False)   # toolchain.compile.CompileResult


@dataclass(frozen=True)
class RunResult(_Result):
    model: str = ""
    device: str = ""
    backend: str = ""
    simulated: bool = False
    latency_median_s: float | None = None
    throughput_per_s: float | None = None
    verified: bool | None = None
    error: str | None = None
    report: Any = field(default=None, repr=False, compare=False)   # runtime.measure.RunReport


@dataclass(frozen=True)
class ProfileResult(RunResult):
    arena_bytes_predicted: int | None = None
    latency_s_predicted: float | None = None


# ---- inputs and outputs ------------------------------------------------------------------------
@contextlib.contextmanager
def _source(model, name: str = "model.tflite") -> Iterator[tuple[Path, str]]:
    """(path, label) of a model given as a path or as bytes (written to a private temporary
    folder under `name`; errors then name `name`, not the temporary path)."""
    if isinstance(model, (bytes, bytearray, memoryview)):
        folder = tempfile.mkdtemp(prefix="tpu-pipeline-")
        path = Path(folder) / Path(name).name
        path.write_bytes(bytes(model))
        try:
            yield path, name
        except ToolchainError as exc:
            exc.args = tuple(str(a).replace(str(path), name) for a in exc.args) or exc.args
            raise
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    if not isinstance(model, (str, os.PathLike)):
        raise UsageError(f"a model is a path or bytes, got {type(model).__name__}")
    yield Path(model), os.fspath(model)


def _fit():
    """The API's one lazy import: `toolchain.fit` selects variants in CP-SAT, and OR-Tools imports
    pandas (~0.5 s of a 2 s compile), so only `fit` loads it; a compile whose searches need no
    CP-SAT never does (tests/test_compile.py). Returns (FitParams, fit_file)."""
    from tpu_pipeline.toolchain.fit import FitParams, fit_file

    return FitParams, fit_file


def _html(path, builder: str, *args, **kwargs) -> None:
    """Write the HTML report (tpu_pipeline/toolchain/report_html.py) made by `builder`."""
    report_html.write(path, getattr(report_html, builder)(*args, **kwargs))


# ---- inspect -----------------------------------------------------------------------------------
def inspect(model, *, plot: str | os.PathLike | None = None, report: str | os.PathLike | None = None,
            name: str = "model.tflite") -> InspectResult:
    """Op histogram, parameter bytes, activation peak and arena predictions (`tpu-pipeline inspect`).
    `plot`: also draw live bytes per step (.png, .svg, ...); `report`: write the HTML report there."""
    with _source(model, name) as (path, label):
        for extra in (plot, report):
            if extra is not None:
                check_output(extra, [path])
        m, graph = load(path)
        # one verdict with the MCU commands: TFLite Micro's own answer, asked once (host wheel, a child)
        s = summarize(graph, path=label, subgraphs=len(m.subgraphs), tflm_cannot_run=tflm_refusal(path, label=label))
        if plot is not None:
            plot_live_bytes({"stored order": list(s.live_bytes)}, os.fspath(plot),
                            f"{label}: live activation bytes (TFLite Micro semantics)")
        data = _plain({**s.to_json(), "semantics": TFLM.name})
        result = InspectResult(data, label, s.ops, s.tensors, s.parameter_bytes, s.peak_bytes, s.peak_op,
                               s.tflm_arena_bytes, s.tflite_arena_bytes, s.any_order_lower_bound, tuple(s.live_bytes),
                               s)
        if report is not None:
            _html(report, "for_graph", "inspect", label, graph, data)
    return result


# ---- schedule ----------------------------------------------------------------------------------
def schedule(model, *, output: str | os.PathLike | None = None, method: str = "auto", time_limit: float = 10.0,
             semantics: str | Semantics = TFLM, report: str | os.PathLike | None = None,
             name: str = "model.tflite") -> ScheduleResult:
    """The memory-optimal op order, with its proof (`tpu-pipeline schedule`). With `output` the
    reordered model is written there; `model_bytes` holds it either way."""
    _positive("time_limit", time_limit)
    with _source(model, name) as (path, label):
        for extra in (output, report):
            if extra is not None:
                check_output(extra, [path])
        # a model that is written is made exact for TFLite Micro first (its outputs then cannot depend on order)
        m, graph, notes = load_exact(path, mcu=True) if output is not None else (*load(path), [])
        sem = get_semantics(semantics)
        result = schedule_graph(graph, method=method, time_limit=time_limit, semantics=sem)
        new_graph = graph.reordered(result.order)
        head_before = tflm_greedy(lifetimes(graph, semantics=TFLM, whole_model=True)).size  # as the file loads
        head_after = tflm_greedy(lifetimes(new_graph, semantics=TFLM)).size
        new_model = to_model(new_graph, m)
        data = write_model(new_model, output, inputs=[path]) if output is not None else model_to_bytes(new_model)
        d = result.to_json()
        d.update(model=label, output=None if output is None else os.fspath(output), tflm_head_before=head_before,
                 tflm_head_after=head_after)
        d["notes"] = [*d.get("notes", []), *notes]
        d = _plain(d)
        res = ScheduleResult(d, label, d["output"], result.peak, result.stored_peak, result.lower_bound,
                             result.proven_optimal, result.method, head_before, head_after, tuple(result.order),
                             data, result)
        if report is not None:
            _html(report, "for_graph", "schedule", label, graph, d, after=new_graph, semantics=sem)
    return res


# ---- plan --------------------------------------------------------------------------------------
def plan(model, *, output: str | os.PathLike | None = None, planner: str = "auto", time_limit: float = 5.0,
         onchip: int | None = None, verify: bool = False, report: str | os.PathLike | None = None,
         name: str = "model.tflite") -> PlanResult:
    """Arena offsets down to the live-bytes bound, as TFLite Micro's offline plan (`tpu-pipeline
    plan`). `verify`: load the planned model in TFLite Micro and check its head (VerificationError)."""
    _positive("time_limit", time_limit)
    if onchip is not None and onchip < 0:
        raise UsageError(f"--onchip must be a number of bytes >= 0, got {onchip}")
    with _source(model, name) as (path, label):
        for extra in (output, report):
            if extra is not None:
                check_output(extra, [path])
        m, graph, notes = load_exact(path, mcu=True)  # exact for TFLite Micro: no plan can change its outputs
        lt = lifetimes(graph, semantics=TFLM)
        result = plan_for_tflm(graph, lt, planner, time_limit, n_tensors=total_tensor_count(m))
        p = result.plan
        out_model = with_offline_plan(m, list(result.tensor_offsets), label=label)
        # a plan is for TFLite Micro: its verdict before anything is written (after the plan's own
        # limits, so an arena past 32-bit offsets stays "infeasible")
        measure_tflm_arena(model_to_bytes(m), label=label)
        data = write_model(out_model, output, inputs=[path]) if output is not None else model_to_bytes(out_model)
        tflm_own = tflm_greedy(lt).size
        d = {
            "model": label, "output": None if output is None else os.fspath(output), "buffers": len(lt.buffers),
            "semantics": TFLM.name, "lower_bound": p.lower_bound, "planned_bytes": result.head,
            "tflm_planner_bytes": tflm_own,
            "tflite_planner_bytes": tflite_arena(lifetimes(graph, semantics=TFLITE)).size,
            "planner": p.planner, "proven_optimal": result.head <= p.lower_bound or p.proven_optimal,
            "seconds": round(p.seconds, 3),
            "pinned_tensors": sum(1 for o in result.tensor_offsets if o >= 0), "notes": notes,
        }
        if verify:
            head = measure_tflm_arena(data).head
            d["tflm_measured_head"] = head
            if head != result.head:
                raise VerificationError(f"{d['output'] or label}: TFLite Micro allocates {head:,} bytes, the plan "
                                        f"says {result.head:,}")
        if onchip is not None:
            d["offchip"] = {"converter_order": offchip_traffic(graph, None, onchip).to_json()}
        d = _plain(d)
        res = PlanResult(d, label, d["output"], result.head, p.lower_bound, tflm_own, d["proven_optimal"], p.planner,
                         data)
        if report is not None:
            _html(report, "for_graph", "plan", label, graph, d, offsets=tuple(result.tensor_offsets))
    return res


# ---- fit ---------------------------------------------------------------------------------------
def fit(model, *, output: str | os.PathLike | None = None, budget: int | None = None,
        device: str | Device | None = None, objective: str = "latency", kernels: str | KernelSet | None = None,
        allow_lossy: bool = False, pareto: bool = False,
        plot: str | os.PathLike | None = None, time_limit: float = 30.0, runs: int = 2,
        progress: Progress | None = None, report: str | os.PathLike | None = None,
        name: str = "model.tflite", int8_io: bool = False, input_outside_arena: bool = False,
        head_only: bool = False, builtin_kernels: bool = False, patches: bool = True) -> FitResult:
    """The fastest exact variant whose whole TFLite Micro arena (head + tail on the 32-bit target;
    the head alone with `head_only`) fits `budget` bytes, or what `device` leaves for it
    (`tpu-pipeline fit`). Raises InfeasibleError when none fits (the message names the smallest
    arena reachable). `pareto` (or `plot`): also the arena/latency frontier. `int8_io`: drop the
    float QUANTIZE/DEQUANTIZE at the interface; `input_outside_arena`: the application keeps the
    inputs (harness firmware); `builtin_kernels`: only TFLite Micro's builtin kernels;
    `patches`: offer patch-based execution (docs/fit.md). `kernels`: the TFLite Micro kernel set
    (None: the default set, CMSIS-NN's)."""
    fit_params, fit_file = _fit()
    params = fit_params(budget=budget, device=load_device(device) if device is not None else None,
                        objective=objective, kernels=kernel_set(kernels), int8_io=int8_io,
                        input_outside_arena=input_outside_arena, head_only=head_only, patches=patches,
                        harness=not builtin_kernels, allow_lossy=allow_lossy, pareto=pareto or plot is not None,
                        time_limit=time_limit, verify_runs=runs)  # every switch checked before any work
    with _source(model, name) as (path, label):
        if output is not None:
            check_output(output, [path])
        for extra in (plot, report):
            if extra is not None:
                check_output(extra, [path, *([output] if output is not None else [])])
        fitted = fit_file(path, params, progress)
        r = fitted.result
        if not r.fits:
            what = "arena head" if head_only else "arena (head + tail)"
            reached = r.head if head_only or fitted.tail_target is None else r.head + fitted.tail_target
            raise InfeasibleError(f"{label}: no variant fits {r.budget:,} B of {what}; the smallest reachable "
                                  f"is {reached:,} B ({len(r.graph.ops)} ops)")
        if output is not None:
            write_bytes_atomic(output, fitted.data, inputs=[path])
        if plot is not None:
            plot_frontier(r, os.fspath(plot), label)
        d = fitted.to_json()
        d.update(model=label, output=None if output is None else os.fspath(output))
        d = _plain(d)
        res = FitResult(d, label, d["output"], r.fits, r.budget, r.head, r.baseline_peak, r.selection.latency_s,
                        r.baseline_latency_s, tuple((p.peak, p.latency_s) for p in r.frontier), fitted.data, fitted)
        if report is not None:
            _html(report, "for_fit", label, fitted, d)
    return res


# ---- compile -----------------------------------------------------------------------------------
def compile(models, n: int | str | None, *, out: str | os.PathLike | None = None, device: str = "coral-usb",  # noqa: A001
            strategy: str = "latency", time_limit: float = 10.0, gap: float = 0.01, colocate: bool = False,
            no_schedule: bool = False, no_rewrite: bool = False, no_plan: bool = False, semantics: str | Semantics = TFLITE,
            budget: int | None = None, verify: bool = False, progress: Progress | None = None,
            report: str | os.PathLike | None = None, int8_io: bool = False,
            input_outside_arena: bool = False, max_n: int = 8, knee: float = 0.05, cuts=None,
            profile: str | os.PathLike | None = None, mix: str | None = None) -> CompileResult:
    """Partition into `n` Edge TPU pipeline segments and write them with report.json and report.html
    into `out` (default out/<stem>) (`tpu-pipeline compile`). `models`: one model (path or bytes)
    or a list of paths to co-deploy. `report`: also copy the HTML report there. `n="auto"`: the
    fewest TPUs within `knee` of the best throughput per TPU among 1..`max_n`; `cuts` (n=None): the
    user's cut points (text as --cuts takes it, or a list of entries); `profile`: a `run --json`
    whose measured stage times replace the predictions. `mix` (several models): "A=3,B=1", the
    invocation mix the co-compilation order is chosen for (report.json's co_compile)."""
    passes = tuple(x for x, off in (("rewrite", no_rewrite), ("schedule", no_schedule), ("plan", no_plan)) if not off)
    options = dict(device=device, strategy=strategy, time_limit=time_limit, verify=verify, colocate=colocate,
                   passes=passes, semantics=semantics, budget=budget, gap=gap, int8_io=int8_io,
                   input_outside_arena=input_outside_arena, max_n=max_n, knee=knee, cuts=cuts, profile=profile,
                   mix=mix)
    if n != "auto" and n is not None and (isinstance(n, bool) or not isinstance(n, int)):
        raise UsageError(f"-n must be a whole number of segments or 'auto', got {n!r}")
    with contextlib.ExitStack() as stack:
        if isinstance(models, (bytes, bytearray, memoryview)):
            paths = [stack.enter_context(_source(models))[0]]
        else:
            paths = [models] if isinstance(models, (str, os.PathLike)) else list(models)
        if report is not None:
            check_output(report, paths)
        res = compile_models(paths, n, out, progress=progress, **options)
    r = _plain(res.report)
    if report is not None:
        write_bytes_atomic(report, (Path(res.out_dir) / "report.html").read_bytes())
    p = res.partition
    return CompileResult(r, tuple(str(x) for x in paths), str(res.out_dir), p.n, tuple(res.files),
                         p.cost.throughput_per_s, p.cost.latency_s, p.gain, p.gap, p.proven_optimal, res)


# ---- run and profile ---------------------------------------------------------------------------
def _compiled_for(dep) -> str | None:
    """The device report.json names, looked up only among devices/*.toml: a report never makes
    the runtime open a path of its choosing."""
    if dep.device is None:
        return None
    known = available_devices()
    if dep.device not in known:
        raise ModelError(f"{dep.source}/report.json: device: '{dep.device}' is not a known device "
                         f"({', '.join(known)}); pass --device")
    return dep.device


def _execute(target: Path, device: str | Device | None, backend: str, iterations: int, warmup: int, seed: int,
             port: str | None, baud: int | None, timeout: float, kernels: KernelSet | None, power_meter: str | None,
             announce: Progress | None = None, progress_bar=None):
    """Shared by run and profile: choose a backend, run, return (report, choice)."""
    if iterations < 1:
        raise UsageError(f"--iterations must be at least 1, got {iterations}")
    if warmup < 0:
        raise UsageError(f"--warmup must be non-negative, got {warmup}")
    dep = deployment.load_deployment(target)
    if device is None:
        device = {"mcu": "sparkfun-edge", "qemu": "qemu-mps2-an386"}.get(backend) or (_compiled_for(dep) or "coral-usb")
    dev = load_device(device)
    choice = backends.select_backend(backend, dev.kind, port, dep)
    if kernels and choice.backend != "qemu":
        raise UsageError(f"--kernels selects the firmware's TFLite Micro kernels: it needs --backend qemu, "
                         f"not {choice.backend}")
    request = backends.RunRequest(dep, dev, dev.kind, iterations, warmup, seed, port, baud, timeout, kernels)
    if announce is not None:
        announce(f"backend: {choice.backend} ({choice.reason})")
    total = backends.get_backend(choice.backend).progress_total(request)
    bar = progress_bar(total) if progress_bar is not None else contextlib.nullcontext()
    with bar as callback:
        rep = backends.run_backend(choice.backend, request, power_meter, callback)
    return rep, choice


def _outcome(rep, result: RunResult) -> RunResult:
    """Raise what went wrong as the error the CLI exits with (the result rides on it as `.result`)."""
    error = None
    if rep.error:
        if rep.arena is not None and rep.arena.get("fits") is False:
            error = InfeasibleError(f"{rep.model}: {rep.error}")
        elif rep.arena is not None and rep.arena.get("fits") is None:
            error = ModelError(f"{rep.model}: {rep.error}")
        else:
            error = DeviceError(rep.error)
    elif rep.verified is False:
        error = VerificationError(f"{rep.model}: pipeline outputs differ from the whole model "
                                  f"(max |diff| {rep.max_abs_diff})")
    if error is not None:
        error.result = result
        raise error
    return result


def _run_fields(rep) -> dict:
    return dict(model=rep.model, device=rep.device, backend=rep.backend, simulated=rep.simulated,
                latency_median_s=rep.latency.median_s if rep.latency else None,
                throughput_per_s=rep.throughput_per_s, verified=rep.verified, error=rep.error, report=rep)


def run(target, *, backend: str = "auto", device: str | Device | None = None, iterations: int = 20,
        warmup: int = 2, seed: int = 0, port: str | None = None, baud: int | None = None,
        power_meter: str | None = None, timeout: float = 10.0, kernels: str | KernelSet | None = None, announce: Progress | None = None,
        progress_bar=None) -> RunResult:
    """Run a compiled folder or a .tflite on Coral, an MCU, QEMU or the host emulator and measure it
    (`tpu-pipeline run`). A failed run raises (DeviceError, VerificationError, ...) with the
    partial result as the exception's `.result`."""
    with _source(target) as (path, _):
        rep, _ = _execute(path, device, backend, iterations, warmup, seed, port, baud, timeout,
                          kernel_set(kernels) if kernels else None, power_meter, announce, progress_bar)
    return _outcome(rep, RunResult(_plain(rep.to_json()), **_run_fields(rep)))


def profile(model, device: str | Device, *, backend: str = "auto", kernels: str | KernelSet | None = None,
            iterations: int = 20,
            warmup: int = 2, seed: int = 0, port: str | None = None, baud: int | None = None,
            power_meter: str | None = None, timeout: float = 10.0, host_ops: bool = False,
            announce: Progress | None = None, progress_bar=None) -> ProfileResult:
    """Latency, throughput, arena bytes, energy and the slowest ops of a model on `device` or its
    emulation, with the predictions beside the measurements (`tpu-pipeline profile`). `kernels`:
    the TFLite Micro kernel set the MCU predictions are for (None: the default set)."""
    with _source(model) as (target, _):
        dev = load_device(device)
        kind, label, ks = dev.kind, dev.label, kernel_set(kernels)
        if kind == "mcu" and target.is_dir():
            raise UsageError(f"{target}: profile an MCU with one .tflite, not a directory")
        if kernels and kind != "mcu":
            raise UsageError(f"--kernels is for MCU devices; '{label}' is not one")
        try:
            rep, choice = _execute(target, dev, backend, iterations, warmup, seed, port, baud, timeout,
                                   ks if kernels and backend == "qemu" else None, power_meter, announce, progress_bar)
        except InfeasibleError as exc:  # e.g. the firmware overflows the board: still give the predictions
            if kind != "mcu" or not target.is_file():
                raise
            raise InfeasibleError(f"{exc}; {_predicted_figures(target, dev, ks)}") from None
        extra: dict = {}
        if kind == "mcu" and target.is_file():
            extra = _mcu_predictions(rep, target, dev, ks)
            arena = rep.arena or {}
            if rep.error and arena.get("fits") is False and (arena.get("total") or 0) > (arena.get("configured") or 0):
                s = extra.get("latency_s_predicted")
                rep.error += (f"; predicted latency {f'{s * 1e3:,.1f} ms on the device' if s is not None else 'not available'}; "
                              f"`tpu-pipeline fit {target} --device {label} -o fitted.tflite` looks for a "
                              f"variant whose arena fits")
        if kind == "mcu" and host_ops and choice.backend == "emulator" and not rep.error:
            times = tflm_op_times(target.read_bytes(), iterations=max(1, min(iterations, 5)))
            for o in rep.ops:
                o["host_s"] = times.get(o["index"])
        if kind == "edgetpu" and target.is_file() and not rep.ops:
            _, graph = load(target)
            costs = EdgeTpuCostModel(dev).op_costs(graph)
            rep.ops = [{"index": i, "opcode": op.opcode, "class": c.op_class, "work": c.macs,
                        "predicted_s": c.compute_ps / PS_PER_S} for i, (op, c) in enumerate(zip(graph.ops, costs))]
    d = rep.to_json()
    for k, v in extra.items():
        if d.get(k) is None:  # the qemu backend's own arena_bytes_predicted (same model) stays
            d[k] = v
    d = _plain(d)
    result = ProfileResult(d, **_run_fields(rep), arena_bytes_predicted=d.get("arena_bytes_predicted"),
                           latency_s_predicted=d.get("latency_s_predicted") or (rep.predicted or {}).get("latency_s"))
    return _outcome(rep, result)


def _mcu_predictions(rep, target: Path, device: Device, kernels: KernelSet) -> dict:
    """Arena (32-bit target, export-mcu's plan), latency and energy for `kernels` on `device`."""
    model, graph = load(target)
    est = estimate_mcu(graph, device, kernels)
    try:
        arena = target_arena(graph, kernels, export_plan_offsets(graph, total_tensor_count(model)))
    except ToolchainError as exc:  # e.g. control flow: no offline plan is written
        arena = None
        rep.notes.append(f"arena not predicted: {exc}")
    if arena is not None and arena.tail is None:
        rep.notes.append(f"arena not predicted: {', '.join(target_tail(graph, kernels).unmodelled)} not modelled")
    if any(graph.tensors[t].dtype == "float32" for op in graph.ops for t in op.inputs[:1] if t >= 0):
        rep.notes.append("the MCU cost model is fitted on int8 kernels in QEMU: float32 ops are predicted "
                         "with the int8 coefficients, not from measurements")
    for o in rep.ops if rep.backend == "emulator" else ():
        c = est.ops[o["index"]]
        o.update(predicted_s=c.seconds, instructions_predicted=c.instructions)
    if rep.backend == "emulator":
        rep.predicted.update(latency_s=est.latency_s, energy_j=est.energy_j, cycles=est.cycles,
                             throughput_per_s=1.0 / est.latency_s if est.latency_s else None,
                             source=f"MCU cost model ({est.device}, {kernels.name} kernels)")
    placement = profile_placement(arena, device, rep.notes, split_tail(target_tail(graph, kernels)),
                                  outside_input_bytes(graph))
    waits = wait_seconds(device, placement, graph) if placement is not None and len(device.memory.banks) > 1 else 0.0
    return {"kernels": kernels.name, "arena_bytes_predicted": arena.total if arena else None,
            "arena_head_predicted": arena.head if arena else None,
            "arena_tail_predicted": arena.tail if arena else None,
            "latency_s_predicted": est.latency_s + waits, "bank_wait_latency_s_predicted": waits,
            "energy_j_predicted": est.energy_j,
            "instructions_predicted": est.instructions, "cycles_per_instruction": est.cycles_per_instruction,
            "clock_hz": est.clock_hz, "banks": placement.to_json() if placement is not None else None}



def _predicted_figures(target: Path, device: Device, kernels: KernelSet) -> str:
    """One line of what is known without running: predicted latency, arena needed vs available,
    and where to go next (`fit --device`)."""
    _, graph = load(target)
    est = estimate_mcu(graph, device, kernels)
    arena = target_arena(graph, kernels)
    sram = device.memory.sram_bytes
    need = f"{arena.total:,} B" if arena.total is not None else f"head {arena.head:,} B + a tail not modelled"
    return (f"predicted: latency {est.latency_s * 1e3:,.1f} ms, arena {need} ({kernels.name} kernels) of {sram:,} B "
            f"SRAM; `tpu-pipeline fit {target} --device {device.label} -o fitted.tflite` looks for a variant that fits")


def _positive(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not (0 < value < float("inf")):
        raise UsageError(f"--{name.replace('_', '-')} must be a number of seconds > 0, got {value!r}")

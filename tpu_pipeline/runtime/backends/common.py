"""What every backend shares: the Backend interface and the run request; for the LiteRT-based
backends, segments as pipeline stages, timing and output checking."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, ClassVar

from tpu_pipeline.runtime.deployment import Deployment
from tpu_pipeline.runtime.measure import LatencyStats, RunReport, StageReport
from tpu_pipeline.runtime.pipeline import Stage, run_pipeline
from tpu_pipeline.toolchain.device import Device, KernelSet
from tpu_pipeline.toolchain.errors import DeviceError, ModelError
from tpu_pipeline.toolchain.execute.compare import compare_named
from tpu_pipeline.toolchain.execute.inputs import input_stream
from tpu_pipeline.toolchain.execute.litert import refuse_overrunning_kernels


@dataclass(frozen=True)
class RunRequest:
    """What to run and how: the same for every backend."""

    deployment: Deployment
    device: Device  # loaded and validated where the command or API call started
    kind: str  # the device's kind: "edgetpu" or "mcu"
    iterations: int = 20
    warmup: int = 2
    seed: int = 0
    port: str | None = None  # serial port of the MCU harness
    baud: int | None = None
    timeout: float = 10.0
    kernels: KernelSet | None = None  # TFLite Micro kernel set of a firmware build (qemu backend; None: the default)


class Backend:
    """Where a deployment runs. Subclasses set the class attributes and implement `run`;
    `tpu_pipeline.runtime.backends.run_backend` checks a request against them before calling it, so an
    option a backend cannot honour is refused in one place instead of being ignored."""

    name: ClassVar[str] = ""
    kinds: ClassVar[tuple[str, ...]] = ()  # device kinds it runs
    power_meter: ClassVar[bool] = False  # can a USB power meter measure what it runs?
    power_meter_why_not: ClassVar[str] = ""

    def readiness(self, port: str | None = None, deployment: Deployment | None = None) -> tuple[bool, str]:
        """(can it run `deployment` now, through `port` if it needs one?, why) for `--backend auto`."""
        return True, "available"

    def check(self, request: RunRequest) -> None:
        """Raise UsageError when this backend cannot run the request at all."""

    def run(self, request: RunRequest, progress: Callable[[int], None] | None = None, power=None):
        """Run and measure; `power` is a PowerRecorder (not started) or None. Returns a RunReport."""
        raise NotImplementedError

    def progress_total(self, request: RunRequest) -> int:
        """How many progress steps `run` reports (sequential + pipelined passes by default)."""
        return 2 * request.iterations


def litert_stage(name: str, interp, inputs: tuple[str, ...] | None = None,
                 outputs: tuple[str, ...] | None = None) -> Stage:
    """A pipeline stage running one LiteRT interpreter; tensors matched by name."""
    refuse_overrunning_kernels(interp)
    in_det = {d["name"]: d for d in interp.get_input_details()}
    out_det = {d["name"]: d for d in interp.get_output_details()}
    inputs = tuple(inputs) if inputs is not None else tuple(in_det)
    outputs = tuple(outputs) if outputs is not None else tuple(out_det)
    missing = [n for n in inputs if n not in in_det] + [n for n in outputs if n not in out_det]
    if missing:
        raise ModelError(f"{name}: tensor(s) {missing} named in the report are not inputs/outputs of the file")

    def fn(tensors):
        for n in inputs:
            interp.set_tensor(in_det[n]["index"], tensors[n])
        interp.invoke()
        return {n: interp.get_tensor(out_det[n]["index"]).copy() for n in outputs}

    return Stage(name, inputs, outputs, fn)


def input_specs(stages: list[Stage], interps, needed: tuple[str, ...]):
    specs = []
    for n in needed:
        for interp in interps:
            d = next((d for d in interp.get_input_details() if d["name"] == n), None)
            if d is not None:
                specs.append((n, tuple(int(x) for x in d["shape"]), d["dtype"]))
                break
        else:
            raise ModelError(f"pipeline input '{n}' is not an input of any segment file")
    return specs


def measure_stages(dep: Deployment, stages: list[Stage], interps, backend: str, device: str,
                   iterations: int, warmup: int, seed: int, reference_interp=None,
                   progress: Callable[[int], None] | None = None, timeout: float = 120.0) -> RunReport:
    """Sequential pass (per-stage and end-to-end latency), then a pipelined pass (throughput);
    outputs checked against the whole model when `reference_interp` is given."""
    final = stages[-1].outputs
    specs = input_specs(stages, interps, dep.graph_inputs)
    data = input_stream(specs, iterations + warmup, seed)
    report = RunReport(backend, device, str(dep.source), iterations)

    def sequential(x):
        tensors = dict(x)
        for s in stages:
            tensors.update(s.fn({n: tensors[n] for n in s.inputs}))
        return tensors

    for x in data[:warmup]:
        try:
            sequential(x)
        except Exception as exc:  # noqa: BLE001
            raise DeviceError(f"{dep.source}: warm-up inference failed ({type(exc).__name__}: {exc})") from None
    per_stage = [[] for _ in stages]
    e2e, seq_outputs = [], []
    done = 0
    for x in data[warmup:]:
        tensors = dict(x)
        t_all = time.perf_counter()
        for k, s in enumerate(stages):
            t0 = time.perf_counter()
            tensors.update(s.fn({n: tensors[n] for n in s.inputs}))
            per_stage[k].append(time.perf_counter() - t0)
        e2e.append(time.perf_counter() - t_all)
        seq_outputs.append({n: tensors[n] for n in final})
        done += 1
        if progress:
            progress(done)
    report.latency = LatencyStats.of(e2e)
    for s in stages:
        s.times.clear()
    run = run_pipeline(stages, data[warmup:], final, timeout=timeout,
                       on_result=(lambda k: progress(iterations + k)) if progress else None)
    report.throughput_per_s = run.throughput_per_s
    if run.error is not None:
        report.error = str(run.error)
    pipe_exact, _ = compare_named(run.outputs, seq_outputs)
    if not pipe_exact:
        report.notes.append("pipelined outputs differ from the sequential run")
    for k, (seg, s) in enumerate(zip(dep.segments, stages)):
        report.stages.append(StageReport(k, seg.path.name, s.inputs, s.outputs, LatencyStats.of(per_stage[k]),
                                         seg.predicted_latency_s, device))
    if reference_interp is not None:
        ref_stage = litert_stage("whole model", reference_interp)
        missing = [n for n in final if n not in ref_stage.outputs]
        if missing:
            report.notes.append(f"cannot check outputs: {missing} are not outputs of the whole model")
        else:
            reference = []
            for x in data[warmup:]:
                out = ref_stage.fn({n: x[n] for n in ref_stage.inputs})
                reference.append({n: out[n] for n in final})
            exact, worst = compare_named(seq_outputs, reference)
            pipe_ok, pipe_worst = compare_named(run.outputs, reference[: len(run.outputs)])
            report.verified = exact and pipe_ok
            report.max_abs_diff = max(worst, pipe_worst)
    else:
        report.notes.append("no whole model to check outputs against")
    return report

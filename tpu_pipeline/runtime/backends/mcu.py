"""An MCU running the harness firmware, over a serial port.

The device's own figures (latency in ticks, arena bytes used, per-op PROF lines) are reported;
outputs are checked bit-exactly against TFLite Micro on the host (same reference kernels). A
fault mid-run (timeout, garbled line, reset, device error) ends the run with the error recorded
in the report and every inference measured before it kept.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tpu_pipeline.runtime.backends.common import Backend, RunRequest
from tpu_pipeline.runtime.measure import LatencyStats, RunReport
from tpu_pipeline.runtime.serial_mcu import McuRunAborted, SerialMcu, stack_high_water
from tpu_pipeline.toolchain.device import Device
from tpu_pipeline.toolchain.errors import UsageError


class McuBackend(Backend):
    name = "mcu"
    kinds = ("mcu",)
    power_meter = True  # the meter sits on the board's USB supply

    def readiness(self, port=None, deployment=None) -> tuple[bool, str]:
        return (True, f"serial port {port} given") if port else (False, "no --port given for the MCU")

    def check(self, request: RunRequest) -> None:
        if not request.port:
            raise UsageError("--backend mcu needs --port (the harness's serial port)")

    def progress_total(self, request: RunRequest) -> int:
        return request.iterations

    def run(self, request: RunRequest, progress=None, power=None) -> RunReport:
        r = request
        return run_mcu(r.deployment.segments[0].path, r.port, r.device, r.iterations, r.seed, r.baud, r.timeout,
                       progress, power)


def run_mcu(model_path: Path, port: str, device: Device, iterations: int = 10, seed: int = 0,
            baud: int | None = None, timeout: float = 5.0, progress=None, power=None) -> RunReport:
    from tpu_pipeline.toolchain.execute.tflm import ARENA_DEPENDENT_OPS, TflmModel, reference_outputs
    from tpu_pipeline.toolchain.execute.tflm_arena import check_tflm_dtypes

    data = Path(model_path).read_bytes()
    check_tflm_dtypes(data, str(model_path))
    baud = baud or device.link.baud
    host = TflmModel(data, 64 * 1024 * 1024, str(model_path))  # the host reference, any arena
    arrays = host.input_sets(data, iterations, seed)
    out_sizes = [np.dtype(dt).itemsize * int(np.prod(shape)) for dt, shape in host.outputs]
    report = RunReport("mcu", f"{device.name} on {port}", str(model_path), iterations)
    results = []
    with SerialMcu(port, baud, timeout) as mcu:
        info = mcu.handshake(data)
        recorder = power.start() if power is not None else None
        try:
            results = mcu.run_many(arrays, out_sizes, progress)
        except McuRunAborted as exc:
            results = exc.results
            report.error = str(exc)
        finally:
            if recorder is not None:
                summary = recorder.stop()
                report.energy = summary.to_json(len(results), device.power.idle_w)
    report.arena = {"configured": info.arena, "used": info.used, "fits": True, "board": info.board}
    if info.simulated:  # the fake MCU: its ticks come from the cost model, not a clock
        report.simulated = True
        report.device += " (simulated)"
    if results:
        report.arena["used"] = max(r.arena_used for r in results)
        report.stack_bytes_measured = stack_high_water(
            results, device.firmware.stack_bytes if device.firmware else None, report.notes)
    report.latency = LatencyStats.of([r.seconds for r in results])
    if report.latency:
        report.throughput_per_s = 1.0 / report.latency.median_s if report.latency.median_s else None
    host_lat = LatencyStats.of([r.host_s for r in results])
    if host_lat:
        report.notes.append(f"host round trip (link included): median {host_lat.median_s * 1e3:.2f} ms")
    # Per-op: median ticks per op index over the inferences.
    per_op: dict[tuple[int, str], list[int]] = {}
    for r in results:
        for idx, tag, ticks in r.ops:
            per_op.setdefault((idx, tag), []).append(ticks)
    tps = max(1, info.ticks_per_s)
    report.ops = [{"index": idx, "opcode": tag, "ticks": int(np.median(t)), "seconds": float(np.median(t)) / tps}
                  for (idx, tag), t in sorted(per_op.items())]
    # Outputs against TFLite Micro on the host.
    exact = True
    report.notes += [f"{ARENA_DEPENDENT_OPS[op]}: compared with host TFLite Micro in a fresh process"
                     for op in host.arena_dependent]
    for want, r in zip(reference_outputs(host, data, arrays[:len(results)]), results):
        for w, got in zip(want, r.outputs):
            if np.ascontiguousarray(w).tobytes() != got:
                exact = False
    report.verified = exact if results else None
    return report

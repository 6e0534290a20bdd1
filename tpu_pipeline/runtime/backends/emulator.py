"""Emulation on the host.

Edge TPU pipelines: one LiteRT interpreter per segment, run sequentially (per-stage and end-to-end
host latency) and pipelined (host throughput), outputs checked bit-exactly against the whole
model; the Edge TPU pipeline simulator's predicted period, latency, throughput and energy are
reported beside the host figures (from report.json when the compiler wrote one, else simulated
from the segment files: tpu_pipeline/toolchain/cost/pipeline.py, every TPU on one link and host).

MCUs: TFLite Micro with the device's SRAM as the arena: whether the model fits, the arena head
and tail TFLM really allocates, host time per inference, and the MCU cost model's prediction.
"""

from __future__ import annotations

import time
from pathlib import Path

from tpu_pipeline.runtime.backends.common import Backend, RunRequest, litert_stage, measure_stages
from tpu_pipeline.runtime.deployment import Deployment
from tpu_pipeline.runtime.measure import LatencyStats, RunReport
from tpu_pipeline.toolchain.device import DEFAULT_KERNEL_SET, Device
from tpu_pipeline.toolchain.errors import InfeasibleError, ModelError
from tpu_pipeline.toolchain.execute.litert import litert_interpreter


class EmulatorBackend(Backend):
    name = "emulator"
    kinds = ("edgetpu", "mcu")
    power_meter = False
    power_meter_why_not = "it runs on this host's CPU, so a USB power meter would measure no device"

    def readiness(self, port=None, deployment=None) -> tuple[bool, str]:
        return True, "host emulation"

    def progress_total(self, request: RunRequest) -> int:
        return request.iterations if request.kind == "mcu" else 2 * request.iterations

    def run(self, request: RunRequest, progress=None, power=None) -> RunReport:
        r = request
        if r.kind == "mcu":
            return run_mcu_emulation(r.deployment.segments[0].path, r.device, r.iterations, r.warmup, r.seed, progress)
        return run_edgetpu_emulation(r.deployment, r.iterations, r.warmup, r.seed, r.device, progress)


def predict_edgetpu(dep: Deployment, device: Device) -> dict:
    """Predicted per-stage latency and pipeline latency/throughput/energy for the Edge TPU."""
    pred = dep.manifest.predicted if dep.manifest is not None else None
    stage_pred = [s.predicted_latency_s for s in dep.segments]
    if pred is not None and pred.latency_s is not None and all(p is not None for p in stage_pred):
        out = {k: getattr(pred, k) for k in ("latency_s", "throughput_per_s", "energy_j")}
        out.update({k: pred.extra[k] for k in ("period_s", "period_bound_s", "limited_by") if k in pred.extra})
        out["stages_s"] = stage_pred
        out["source"] = "report.json"
        return out
    from tpu_pipeline.toolchain.predict import edgetpu_segments

    pc, stages = edgetpu_segments([seg.path for seg in dep.segments], device)  # the simulator: shared link and host
    return {"latency_s": pc.latency_s, "throughput_per_s": pc.throughput_per_s, "energy_j": pc.energy_j,
            "period_s": pc.period_s, "period_bound_s": pc.period_bound_ps / 1e12, "limited_by": pc.limited_by,
            "stages_s": [s.latency_s for s in stages], "source": f"pipeline simulator ({device.label})"}


def run_edgetpu_emulation(dep: Deployment, iterations: int, warmup: int, seed: int, device: Device,
                          progress=None) -> RunReport:
    # LiteRT's default resolver: the host latency a user's interpreter would see
    interps = [litert_interpreter(s.path, label=str(s.path), builtin_only=False) for s in dep.segments]
    stages = [litert_stage(s.path.name, it, s.inputs, s.outputs) for s, it in zip(dep.segments, interps)]
    same = len(dep.segments) == 1 and dep.whole is not None and dep.segments[0].path.resolve() == dep.whole.resolve()
    ref = (litert_interpreter(dep.whole, label=str(dep.whole), builtin_only=False)
           if dep.whole is not None and not same else None)
    report = measure_stages(dep, stages, interps, "emulator", f"host CPU (LiteRT) for {device.label}",
                            iterations, warmup, seed, reference_interp=ref, progress=progress)
    if same:
        report.verified = True  # the segment is the whole model itself
        report.max_abs_diff = 0.0
        report.notes = [n for n in report.notes if not n.startswith("no whole model")]
    pred = predict_edgetpu(dep, device)
    report.predicted = pred
    for st, p in zip(report.stages, pred.get("stages_s") or []):
        if st.predicted_latency_s is None:
            object.__setattr__(st, "predicted_latency_s", p)
    return report


def run_mcu_emulation(model_path: Path, device: Device, iterations: int = 10, warmup: int = 1,
                      seed: int = 0, progress=None) -> RunReport:
    """TFLite Micro with the device's SRAM as the arena, plus the MCU cost model."""
    from tpu_pipeline.toolchain.execute.inputs import input_stream, shape_operand_values
    from tpu_pipeline.toolchain.execute.tflm import TflmModel
    from tpu_pipeline.toolchain.execute.tflm_arena import check_tflm_dtypes, measure_tflm_arena
    from tpu_pipeline.toolchain.ir import total_param_bytes
    from tpu_pipeline.toolchain.loader import resolve_dynamic_shapes
    from tpu_pipeline.toolchain.memory import TFLM, lifetimes, tflm_greedy
    from tpu_pipeline.toolchain.predict import mcu_prediction
    from tpu_pipeline.toolchain.tflite import read_model

    data = Path(model_path).read_bytes()
    check_tflm_dtypes(data, str(model_path))  # else "cannot run with any arena" reads like a size problem
    sram, flash = device.memory.sram_bytes, device.memory.flash_bytes
    graph = resolve_dynamic_shapes(read_model(data, name=str(model_path)), None, str(model_path))[1]
    est = mcu_prediction(graph, device, DEFAULT_KERNEL_SET)  # api.profile re-prices for the kernels asked for
    report = RunReport("emulator", f"{device.name} (TFLite Micro on the host)", str(model_path), iterations)
    predicted_head = tflm_greedy(lifetimes(graph, semantics=TFLM)).size
    arena = {"configured": sram, "fits": False, "head": None, "tail": None, "total": None,
             "predicted_head": predicted_head, "model_bytes": len(data), "flash_bytes": flash,
             "fits_flash": (len(data) <= flash) if flash else None, "parameter_bytes": total_param_bytes(graph)}
    report.arena = arena
    report.predicted = {"latency_s": est.latency_s, "throughput_per_s": 1.0 / est.latency_s if est.latency_s else None,
                        "energy_j": est.energy_j, "cycles": est.cycles, "source": f"MCU cost model ({est.device})"}
    report.ops = [{"index": o.index, "opcode": o.opcode, "class": o.op_class, "work": o.work,
                   "predicted_s": o.seconds} for o in est.ops]
    try:
        a = measure_tflm_arena(data, arena_size=sram, label=str(model_path))
        arena.update(fits=True, head=a.head, tail=a.tail, total=a.total)
    except ModelError:
        try:
            a = measure_tflm_arena(data, arena_size=max(64 * 1024 * 1024, 4 * sram), label=str(model_path))
            arena.update(head=a.head, tail=a.tail, total=a.total)
        except ModelError as exc:
            arena["fits"] = None  # not a size question: TFLite Micro cannot run this model
            report.error = str(exc).removeprefix(f"{model_path}: ")  # "TFLite Micro cannot run this model (...)"
            return report
        report.error = (f"does not fit: TFLite Micro needs {a.total:,} arena bytes (head {a.head:,} + tail {a.tail:,}), "
                        f"the device has {sram:,} bytes of SRAM")
        return report
    if flash and len(data) > flash:
        arena["fits"] = False
        report.error = f"does not fit: the model is {len(data):,} bytes, the device has {flash:,} bytes of flash"
        return report
    try:
        interp = TflmModel(data, sram, str(model_path))
    except InfeasibleError as exc:
        arena["fits"] = False
        report.error = str(exc)
        return report
    specs = [(n, shape, dt) for n, (dt, shape) in zip(interp.input_names, interp.inputs)]
    inputs = input_stream(specs, iterations + warmup, seed, shape_operand_values(data))
    times = []
    for k, x in enumerate(inputs):
        t0 = time.perf_counter()
        interp.run([x[n] for n in interp.input_names])
        if k >= warmup:
            times.append(time.perf_counter() - t0)
            if progress:
                progress(k + 1 - warmup)
    report.latency = LatencyStats.of(times)
    report.throughput_per_s = 1.0 / report.latency.median_s if report.latency and report.latency.median_s else None
    report.notes.append("latency is TFLite Micro's host time; the device figure is the prediction")
    return report

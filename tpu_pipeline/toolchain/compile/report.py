"""report.json's content: what compile found and wrote, for people and for `tpu-pipeline run`."""

from __future__ import annotations

import dataclasses

from tpu_pipeline.toolchain.compile.passes.verify import is_integer_model
from tpu_pipeline.toolchain.compile.state import CompileState, PassRecord
from tpu_pipeline.toolchain.manifest import MANIFEST_VERSION

LABELS = {"user": "your cuts (--cuts)", "ours": "ours (exact)", "coral": "Coral's heuristic (libcoral)",
          "profiled": "the profiled run's partition", "libcoral-profiling": "libcoral's profiling partitioner"}


def partition_summary(label: str, part) -> dict:
    """One partition's figures, for putting several side by side."""
    c = part.cost
    return {"name": label, "label": LABELS.get(label, label), "n": part.n, "period_s": c.period_s,
            "throughput_per_s": c.throughput_per_s, "latency_s": c.latency_s,
            "cached_bytes": sum(s.sram_bytes for s in c.stages), "streamed_bytes": sum(s.offchip_bytes for s in c.stages),
            "bottleneck_stage": c.bottleneck, "stage_ops": [s.ops for s in c.stages],
            "stage_latency_s": [s.latency_s for s in c.stages]}


def build_report(state: CompileState, records: list[PassRecord], files: list[str]) -> dict:
    o, graph, part = state.options, state.graph, state.partition
    name = lambda t: graph.tensors[t].name  # noqa: E731
    notes = list(state.notes)
    if not is_integer_model(graph):
        notes.append("the model is not fully int8/uint8: the Edge TPU runs only quantized models, so these "
                     "predictions describe a hypothetical int8 version")
    base = part.baseline
    report = {
        "version": MANIFEST_VERSION,
        "model": f"{o.stem}.tflite",
        "source": str(o.paths[0]) if len(o.paths) == 1 else [str(p) for p in o.paths],
        "num_segments": part.n,
        "device": o.device.name,
        "strategy": part.strategy,  # "user" for --cuts
        "inputs": [name(t) for t in graph.inputs],
        "outputs": [name(t) for t in graph.outputs],
        "segments": [s.report for s in state.segments],
        "predicted": part.cost.to_json(),
        "solver": {"proven_optimal": part.proven_optimal, "primary_proven": part.primary_proven,
                   "proven_steps": list(part.proven_steps), "seconds": part.seconds, "objectives": part.objectives,
                   "lower_bounds": part.bounds, "time_limit_s": o.time_limit, "colocate_consumers": o.colocate,
                   "stopped_by": list(part.stopped_by), "reproducible": part.reproducible,
                   # the exact step: "downsets" (the DP over the graph's down-sets) or "cpsat"
                   "method": part.method,
                   # the period is the pipeline simulator's; the refinement that closes the gap to it
                   "simulator_optimal": part.sim_proven, "simulated_candidates": part.sim_candidates,
                   "refinement_stopped_by": part.refined_by,
                   "period_lower_bound_s": part.period_lower_bound_ps / 1e12,
                   # the stopping tolerance, and how far the period may be above the best possible
                   "gap_limit": part.gap_limit, "gap": part.gap},
        "baseline": None if base is None else {
            "name": "coral parameter-count heuristic (libcoral)",
            "segments": [{"index": k, "ops": s.ops, "parameter_bytes": s.param_bytes, "offchip_bytes": s.offchip_bytes,
                          "in_bytes": s.in_bytes, "out_bytes": s.out_bytes, "predicted_latency_s": s.latency_s}
                         for k, s in enumerate(base.cost.stages)],
            "predicted": base.cost.to_json(), "note": base.note},
        "gain_throughput": part.gain,
        "passes": [dataclasses.asdict(r) for r in records],
        "verification": state.verification,
        "edgetpu_compiler": state.edgetpu_compiler,
        "notes": notes,
        "files": files,
    }
    if state.sweep is not None:  # -n auto: the n = 1..K table and the choice
        sw = state.sweep.to_json()
        report.update(n_candidates=sw["n_candidates"], n_chosen=sw["n_chosen"], n_chosen_reason=sw["reason"],
                      n_auto={k: sw[k] for k in ("knee", "max_n", "skipped")})
    if state.compared:  # --cuts / --profile: the written partition beside the others, same cost model
        report["compared"] = [partition_summary(part.strategy if part.strategy in LABELS else "ours", part)] + [
            partition_summary(label, p) for label, p in state.compared]
    if state.cocompile is not None:
        report["co_compile"] = state.cocompile
    if state.profile is not None:
        report["profile"] = state.profile.to_json()
    if len(o.paths) > 1:
        # one push runs every model once through the shared TPUs and link: each model's simulated
        # throughput is the pipeline's
        report["models"] = [{"model": str(p), "prefix": pre,
                             "inputs": [name(t) for t in graph.inputs if name(t).startswith(pre)],
                             "outputs": [name(t) for t in graph.outputs if name(t).startswith(pre)],
                             "predicted_throughput_per_s": part.cost.throughput_per_s}
                            for p, pre in zip(o.paths, state.prefixes)]
    return report

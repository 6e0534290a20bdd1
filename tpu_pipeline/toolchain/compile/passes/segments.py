"""Each segment as its own .tflite, named as Coral's tools name them, with its report entry."""

from __future__ import annotations

import dataclasses

from tpu_pipeline.toolchain.budget import Deadline
from tpu_pipeline.toolchain.compile.passes.load import confirm_litert
from tpu_pipeline.toolchain.compile.state import CompileState, PassRecord, SegmentFile
from tpu_pipeline.toolchain.cost.edgetpu import EdgeTpuCostModel
from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.execute.litert import runtime_shapes
from tpu_pipeline.toolchain.memory import TFLITE, lifetimes, plan_arena
from tpu_pipeline.toolchain.partition import PartitionProblem
from tpu_pipeline.toolchain.partition.caching import explain
from tpu_pipeline.toolchain.tflite import read_model
from tpu_pipeline.toolchain.tflite.io import model_to_chunks
from tpu_pipeline.toolchain.tflite.extract import extract_segment


def segment_file_name(stem: str, k: int, n: int) -> str:
    return f"{stem}_segment_{k}_of_{n}.tflite"


def segments(state: CompileState, allowed: float) -> tuple[CompileState, PassRecord]:
    state = confirm_litert(state)  # LiteRT's load check of the input, before anything is cut or run
    o, graph, part = state.options, state.graph, state.partition
    n = part.n
    whole = state.whole_model if state.whole_model is not None else read_model(state.whole)
    problem = PartitionProblem(graph, EdgeTpuCostModel(o.device))
    name = lambda t: graph.tensors[t].name  # noqa: E731
    out, deadline = [], Deadline(allowed)
    caching = explain(problem, part.stages, n)  # what streams and what would bring it on chip
    for k in range(n):
        ops, iface = part.ops_of(k), part.interfaces[k]
        if k < n - 1 and not iface.outputs:
            raise ModelError(f"{o.label}: segment {k} would produce nothing a later segment reads")
        chunks = tuple(model_to_chunks(extract_segment(whole, list(ops), iface.inputs, iface.outputs,
                                                      real=runtime_shapes(whole))))
        sc = part.cost.stages[k]
        lt = lifetimes(problem.segment_graph(part.stages, k, iface), None, TFLITE)
        arena = plan_arena(lt, time_limit=max(0.05, allowed / n), deadline=deadline).size
        fname = segment_file_name(o.stem, k, n)
        out.append(SegmentFile(fname, chunks, {
            "index": k, "file": fname,
            "inputs": [name(t) for t in iface.inputs], "outputs": [name(t) for t in iface.outputs],
            "ops": len(ops), "parameter_bytes": sc.param_bytes, "sram_bytes": sc.sram_bytes,
            "offchip_bytes": sc.offchip_bytes, "in_bytes": sc.in_bytes, "out_bytes": sc.out_bytes,
            "activation_peak_bytes": lt.peak, "activation_arena_bytes": arena,
            "predicted_latency_s": sc.latency_s, "predicted": sc.to_json(), "file_bytes": sum(len(c) for c in chunks),
            "caching": caching[k],
        }))
    state = dataclasses.replace(state, segments=tuple(out))
    return state, PassRecord("segments", "ran", 0.0, {"files": [s.file for s in out]})

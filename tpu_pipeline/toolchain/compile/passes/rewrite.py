"""Identity rewrites that lower the optimal activation peak (tpu_pipeline.toolchain.rewrite)."""

from __future__ import annotations

import dataclasses

from tpu_pipeline.toolchain.budget import Deadline
from tpu_pipeline.toolchain.compile.passes.load import confirm_litert
from tpu_pipeline.toolchain.compile.state import CompileState, PassRecord
from tpu_pipeline.toolchain.rewrite import rewrite_graph


def rewrite(state: CompileState, allowed: float) -> tuple[CompileState, PassRecord]:
    if any(op.opcode == "DEPTHWISE_CONV_2D" for op in state.graph.ops):
        # a depthwise split is checked in LiteRT in this process: the input's load check comes first
        state = confirm_litert(state)
    rr = rewrite_graph(state.graph, time_limit=allowed, semantics=state.options.semantics,
                      deadline=Deadline(allowed))
    if rr.applied:
        state = dataclasses.replace(state, graph=rr.graph)
    elif rr.input_schedule is not None and rr.input_schedule.proven_optimal:
        state = dataclasses.replace(state, proven_schedule=(state.graph, rr.input_schedule))
    return state, PassRecord("rewrite", "ran" if rr.applied else "no gain", 0.0,
                             {"applied": [a.to_json() for a in rr.applied], "peak_before": rr.peak_before,
                              "peak_after": rr.peak_after, "semantics": state.options.semantics.name})

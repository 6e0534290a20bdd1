"""Arena offsets for TFLite Micro, for the final op order: `emit` writes them into the whole
model as its offline memory plan (LiteRT ignores that metadata, so the same file deploys to an MCU
with the planned arena)."""

from __future__ import annotations

import dataclasses

from tpu_pipeline.toolchain.budget import Deadline
from tpu_pipeline.toolchain.compile.state import CompileState, PassRecord
from tpu_pipeline.toolchain.memory import TFLM, lifetimes, plan_for_tflm, tflm_greedy


def plan(state: CompileState, allowed: float) -> tuple[CompileState, PassRecord]:
    graph = state.graph
    if state.other_subgraph_tensors:
        return state, PassRecord("plan", "skipped", 0.0, {"reason": "control flow (more than one subgraph): "
                                 "TFLite Micro plans every subgraph in one arena; only the main one is modelled"})
    tflm_plan = plan_for_tflm(graph, time_limit=allowed, n_tensors=len(graph.tensors), deadline=Deadline(allowed))
    own = tflm_greedy(lifetimes(graph, semantics=TFLM)).size
    detail = {"tflm_head_bytes": tflm_plan.head, "tflm_own_planner_bytes": own,
              "lower_bound": tflm_plan.plan.lower_bound,
              "proven_optimal": tflm_plan.plan.proven_optimal or tflm_plan.head <= tflm_plan.plan.lower_bound,
              "planner": tflm_plan.plan.planner}
    offsets = tuple(tflm_plan.tensor_offsets) if any(o >= 0 for o in tflm_plan.tensor_offsets) else None
    state = dataclasses.replace(state, offline_plan=offsets)
    return state, PassRecord("plan", "ran" if tflm_plan.head < own else "no gain", 0.0, detail)

"""Arena offsets for TFLite Micro, written into the whole model as its offline memory plan
(LiteRT ignores that metadata, so the same file deploys to an MCU with the planned arena)."""

from __future__ import annotations

import dataclasses

from toolchain.budget import Deadline
from toolchain.compile.state import CompileState, PassRecord
from toolchain.ir import to_model
from toolchain.memory import lifetimes, plan_for_tflm, tflm_greedy
from toolchain.tflite import model_to_bytes, with_offline_plan
from toolchain.tflite.metadata import total_tensor_count


def plan(state: CompileState, allowed: float) -> tuple[CompileState, PassRecord]:
    graph = state.graph
    whole = to_model(graph, state.template)
    if len(whole.subgraphs) > 1:
        return state, PassRecord("plan", "skipped", 0.0, {"reason": f"{len(whole.subgraphs)} subgraphs (control "
                                 "flow): TFLite Micro plans them together; only the main one is modelled"})
    tflm_plan = plan_for_tflm(graph, time_limit=allowed, n_tensors=total_tensor_count(whole),
                              deadline=Deadline(allowed))
    if any(o >= 0 for o in tflm_plan.tensor_offsets):
        whole = with_offline_plan(whole, list(tflm_plan.tensor_offsets))
    own = tflm_greedy(lifetimes(graph, semantics="tflm")).size
    detail = {"tflm_head_bytes": tflm_plan.head, "tflm_own_planner_bytes": own,
              "lower_bound": tflm_plan.plan.lower_bound,
              "proven_optimal": tflm_plan.plan.proven_optimal or tflm_plan.head <= tflm_plan.plan.lower_bound,
              "planner": tflm_plan.plan.planner}
    state = dataclasses.replace(state, whole=model_to_bytes(whole))
    return state, PassRecord("plan", "ran" if tflm_plan.head < own else "no gain", 0.0, detail)

"""The arena plan written into the model as TFLite Micro's offline plan: ours, or the one the model
brings (fit's) where that is no larger; the model must fit the board's flash."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.device import KERNEL_SETS, REFERENCE
from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.errors import InfeasibleError
from tpu_pipeline.toolchain.memory import TFLM, lifetimes, plan_for_tflm, tflm_greedy
from tpu_pipeline.toolchain.memory.tflm_target import target_head
from tpu_pipeline.toolchain.tflite import model_to_bytes, with_offline_plan
from tpu_pipeline.toolchain.tflite.metadata import read_offline_plan, total_tensor_count


def plan(state, allowed):
    model, graph, device = state.model, state.graph, state.options.device
    lt = lifetimes(graph, semantics=TFLM)
    ours = plan_for_tflm(graph, lt, "auto", state.options.time_limit, n_tensors=total_tensor_count(model))
    offsets, planned_head, planner = list(ours.tensor_offsets), ours.head, ours.plan.planner
    kept = read_offline_plan(model)  # a plan the model brings (fit's): kept where it is no larger
    if kept is not None and len(kept) == len(offsets) and any(
            target_head(graph, k, kept)[0] <= target_head(graph, k, offsets)[0] for k in KERNEL_SETS):
        # under either kernel set: fit plans for the kernels it was asked for (CMSIS-NN's scratch),
        # ours for the reference kernels', so judging fit's plan by the reference head alone threw
        # away plans that are smaller on the board they were made for
        offsets, planned_head, planner = list(kept), target_head(graph, REFERENCE, kept)[0], "the model's own"
    own_head = tflm_greedy(lifetimes(graph, semantics=TFLM)).size
    planned = with_offline_plan(model, offsets) if any(o >= 0 for o in offsets) else model
    data = model_to_bytes(planned)
    flash = device.memory.flash_bytes
    if flash and len(data) > flash:
        raise InfeasibleError(f"{state.src}: the model is {len(data):,} bytes; {device.name} has {flash:,} bytes "
                              "of flash")
    state = replace(state, offsets=tuple(offsets), planned_head=planned_head, planner=planner, own_head=own_head,
                    planned=planned, data=data)
    return state, PassRecord("plan", "ran", 0.0, {"head": planned_head, "planner": planner})

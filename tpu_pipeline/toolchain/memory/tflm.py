"""Arena offsets for TFLite Micro, from plain values: the graph (subgraph 0 of the model, graph
tensor k being the model's tensor k, as `ir.from_model` and `ir.to_model` keep them) and the number
of tensors of all subgraphs. The offsets are written into a model only by
`tpu_pipeline.toolchain.tflite.metadata.with_offline_plan`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tpu_pipeline.toolchain.budget import Deadline, Progress
from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.memory.lifetimes import Lifetimes, lifetimes as _lifetimes
from tpu_pipeline.toolchain.memory.semantics import TFLM
from tpu_pipeline.toolchain.memory.plan import ArenaPlan
from tpu_pipeline.toolchain.memory.planners import finish, plan_arena
from tpu_pipeline.toolchain.memory.runtime_planners import tflm_greedy

__all__ = ["OfflinePlan", "offline_plan", "plan_for_tflm"]

EXTERNAL = -2  # the offline plan's mark for a tensor outside the arena (= tflite.metadata.EXTERNAL)


@dataclass(frozen=True)
class OfflinePlan:
    """Offsets for TFLite Micro and what it will then allocate.

    `tensor_offsets` has one entry per tensor of all subgraphs (subgraph 0 first, as TFLM counts
    them), -1 for constants, scratch and anything left to the runtime. `head` is the arena head
    TFLite Micro's planner produces with these offsets pinned (scratch buffers it still places
    online, first fit, after the pinned ones), `buffer_offsets` where every buffer then sits.
    """

    tensor_offsets: tuple[int, ...]
    head: int
    buffer_offsets: tuple[int, ...]
    plan: ArenaPlan


def offline_plan(lifetimes: Lifetimes, plan: ArenaPlan, n_tensors: int) -> OfflinePlan:
    """Turn a plan of `lifetimes` (of subgraph 0, TFLM semantics) into TFLM's offsets for a model
    of `n_tensors` tensors in all.

    The pinned tensors go where `plan` puts them; scratch buffers cannot be pinned, so the result
    is simulated with TFLM's own planner (`tflm_greedy` with the offline offsets), which places
    them first fit among the pinned buffers: `head` is what the real runtime will report.
    `buffer_offsets` index `lifetimes.buffers` (a shared buffer's members sit at their offsets in it).
    """
    tensor_offsets = [-1] * n_tensors
    for i, b in enumerate(lifetimes.buffers):
        for t, offset in b.placements():
            tensor_offsets[t] = plan.offsets[i] + offset
    # TFLite Micro sees one buffer per tensor (shared buffers split into their members)
    runtime, pinned, origin = lifetimes.per_tensor([plan.offsets[i] if b.placements() else -1
                                                    for i, b in enumerate(lifetimes.buffers)])
    sim = tflm_greedy(runtime, offline=pinned)
    placed = list(plan.offsets)
    for k, i in enumerate(origin):
        if not lifetimes.buffers[i].placements():  # scratch: where TFLM's planner puts it
            placed[i] = sim.offsets[k]
    return OfflinePlan(tuple(tensor_offsets), sim.size, tuple(placed), plan)


def plan_for_tflm(graph, lifetimes_: Lifetimes | None = None, planner: str = "auto",
                  time_limit: float | None = 5.0, *, n_tensors: int, deadline: Deadline | None = None,
                  progress: Progress = None) -> OfflinePlan:
    """Plan `graph` (subgraph 0 of a model with `n_tensors` tensors in all its subgraphs) for
    TFLite Micro and pin the result.

    Refused (ModelError) when the model has tensors outside `graph`: TFLM plans the tensors of every
    subgraph (WHILE/IF bodies) in one arena, and a plan of the main one could not be held to the
    byte. Where the runtime's online placement of scratch buffers would push the head above the
    plan, the plan is repaired by re-planning with the scratch buffers held where TFLM puts them,
    and the smaller of that and TFLM's own plan is kept (never worse than no offline plan).
    """
    if n_tensors != len(graph.tensors):
        raise ModelError(f"the model has {n_tensors - len(graph.tensors)} tensors in other subgraphs (control flow); "
                         "an offline memory plan is only written for single-subgraph models")
    lt = lifetimes_ or _lifetimes(graph, semantics=TFLM)
    t0 = time.monotonic()
    plan = plan_arena(lt, planner, time_limit, deadline=deadline, progress=progress)
    result = offline_plan(lt, plan, n_tensors)
    if result.head > plan.size:
        # Scratch buffers moved: the sound plan is where TFLM puts everything; keep it if smaller
        # than the runtime's own plan.
        fixed = finish(lt.buffers, result.buffer_offsets, plan.lower_bound, plan.planner + "+tflm-scratch", t0,
                       alignment=16)
        result = OfflinePlan(result.tensor_offsets, result.head, result.buffer_offsets, fixed)
    if graph.external:  # inputs kept in the application's buffer: marked for the harness firmware's planner
        offsets = list(result.tensor_offsets)
        for t in graph.external:
            offsets[t] = EXTERNAL
        result = OfflinePlan(tuple(offsets), result.head, result.buffer_offsets, result.plan)
        return result  # (TFLM's own planner would put them in the arena: no fallback to it)
    own = tflm_greedy(lt.per_tensor()[0])  # TFLM's own plan: one buffer per tensor, nothing shared
    if own.size < result.head:  # our planner lost to TFLM's: leave everything online
        fallback = ArenaPlan(own.offsets, own.size, plan.lower_bound, "tflm", own.size <= plan.lower_bound,
                             time.monotonic() - t0)
        # (its offsets index lifetimes.per_tensor(): with nothing pinned, no buffer is shared)
        result = OfflinePlan(tuple([-1] * len(result.tensor_offsets)), own.size, own.offsets, fallback)
    return result

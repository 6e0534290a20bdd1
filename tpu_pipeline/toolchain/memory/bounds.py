"""Lower bounds on peak activation memory that hold for every op order."""

from __future__ import annotations

from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.memory.lifetimes import overlap_savings, unused_tensors
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import TFLM, Semantics, align, get_semantics


def op_footprints(graph: Graph, semantics: Semantics | str = TFLM) -> list[int]:
    """For each op, the bytes that must be live while it runs, whatever the order:
    its activation inputs and outputs (an overlapped op's two sharing their extent), its scratch,
    and (TFLite) the graph inputs."""
    sem = get_semantics(semantics)
    pinned = 0
    if sem.inputs_live_whole_run:
        pinned_set = {t for t in graph.inputs if graph.is_activation(t)}
        pinned = sum(align(graph.tensors[t].nbytes, sem.alignment) for t in pinned_set)
    else:
        pinned_set = set()
    shared = overlap_savings(graph, sem)
    out = []
    for i in range(len(graph.ops)):
        tensors = set(graph.activation_inputs(i))
        if graph.ops[i].opcode not in sem.in_place_ops:  # in place, the output may share the input
            tensors |= set(graph.activation_outputs(i))
        total = pinned + sum(align(graph.tensors[t].nbytes, sem.alignment) for t in tensors - pinned_set)
        total += sum(align(s, sem.alignment) for s in scratch_requests(graph, i, sem)) - shared.get(i, 0)
        out.append(total)
    return out


def order_free_lower_bound(graph: Graph, semantics: Semantics | str = TFLM, *, whole_model: bool = False) -> int:
    """No order of the ops can peak below this: the largest single-op footprint, the graph
    outputs, which are all live together at the end, and (TFLite Micro) the tensors no operator
    uses, which live together apart from every op (`whole_model`, as in `lifetimes`).

    On the runtime's own tensors, for any semantics: the scheduler's bounds (schedule/bounds/)
    work on its memory model, whose in-place buffers are merged, and hold only where that
    merging does not depend on the order; the scheduler falls back to this one elsewhere."""
    sem = get_semantics(semantics)
    outputs = {t for t in graph.outputs if graph.is_activation(t)}
    at_end = sum(align(graph.tensors[t].nbytes, sem.alignment) for t in outputs)
    unused = sum(align(graph.tensors[t].nbytes, sem.alignment) for t in unused_tensors(graph)) \
        if whole_model and sem.allocates_unused else 0
    return max([at_end, unused, *op_footprints(graph, sem)])

"""Buffer lifetimes of a graph under an op order and a runtime's semantics.

Steps follow TFLite Micro's allocation scopes: step 0 is the start of the invocation (graph inputs
arrive), the op at position k of the order runs at step k+1, and graph outputs stay live to the
last step n. Lifetimes are inclusive [first, last]. Two buffers conflict iff their lifetimes
intersect. Scratch buffers a kernel requests live for their op's step only.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_pipeline.toolchain.ir import DTYPE_SIZES, Graph
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import Semantics, align, get_semantics


@dataclass(frozen=True)
class Buffer:
    size: int  # bytes, rounded to the semantics' alignment
    first: int
    last: int
    tensor: int | None = None  # the activation tensor it holds
    op: int | None = None  # for scratch buffers: the op (position in graph.ops) that requested it
    name: str = ""

    def overlaps(self, other: "Buffer") -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class Lifetimes:
    buffers: tuple[Buffer, ...]
    n_steps: int  # steps 0 .. n_steps-1

    def live_bytes(self) -> list[int]:
        """Bytes live at each step."""
        delta = [0] * (self.n_steps + 1)
        for b in self.buffers:
            delta[b.first] += b.size
            delta[b.last + 1] -= b.size
        out, acc = [], 0
        for d in delta[:-1]:
            acc += d
            out.append(acc)
        return out

    @property
    def peak(self) -> int:
        return max(self.live_bytes(), default=0)

    @property
    def peak_step(self) -> int:
        live = self.live_bytes()
        return live.index(max(live)) if live else 0


def lifetimes(graph: Graph, order=None, semantics: Semantics | str = "tflm", *,
              whole_model: bool = False) -> Lifetimes:
    """Lifetimes of every buffer the runtime allocates in its arena, for ops run in `order`.

    `order` lists positions into `graph.ops` (default: the graph's own order). Tensors come in
    tensor-index order, then scratch buffers in request order, as TFLite Micro adds them.
    `whole_model`: `graph` is a model file as the runtime loads it, so the tensors no operator
    uses count too where the runtime allocates them (TFLite Micro; `unused_tensors`). Off by
    default: the passes' graphs (spans, segments, rewrites) leave tensors of other parts dangling,
    and a model the tool writes has none (`runtime_exact_model` drops them).
    """
    sem = get_semantics(semantics)
    n = len(graph.ops)
    order = list(range(n)) if order is None else list(order)
    step_of = {op: k + 1 for k, op in enumerate(order)}
    first: dict[int, int] = {}
    last: dict[int, int] = {}

    for t in graph.inputs:
        if graph.is_activation(t):
            first.setdefault(t, 0)
            last[t] = max(last.get(t, 0), 0)
    for op_pos in order:
        step = step_of[op_pos]
        op = graph.ops[op_pos]
        for t in op.outputs:
            if graph.is_activation(t):
                first.setdefault(t, step)
                last[t] = max(last.get(t, step), step)
        for t in op.inputs:
            if graph.is_activation(t):
                first.setdefault(t, step)  # read before any write: allocated where first touched
                last[t] = max(last.get(t, step), step)
    for t in graph.outputs:
        if graph.is_activation(t):
            first.setdefault(t, n)
            last[t] = n
    if sem.inputs_live_whole_run:
        for t in graph.inputs:
            if graph.is_activation(t):
                last[t] = n

    n_steps = n + 1
    if whole_model and sem.allocates_unused:
        unused = unused_tensors(graph)
        if unused:
            # TFLite Micro allocates them with an empty lifetime, which overlaps only each other:
            # one step of their own after the last, so they share bytes with nothing else.
            n_steps = n + 2
            for t in unused:
                first[t] = last[t] = n + 1
    sizes = {t: align(graph.tensors[t].nbytes, sem.alignment) for t in first}
    if sem.in_place_ops:
        _share_in_place(graph, order, sem, first, last, sizes)

    buffers = [
        Buffer(sizes[t], first[t], last[t], tensor=t, name=graph.tensors[t].name)
        for t in sorted(first)
        if sizes[t] > 0
    ]
    for op_pos in sorted(order, key=step_of.get):
        for size in scratch_requests(graph, op_pos, sem):
            s = step_of[op_pos]
            buffers.append(Buffer(align(size, sem.alignment), s, s, op=op_pos,
                                  name=f"scratch of op {op_pos} ({graph.ops[op_pos].opcode})"))
    return Lifetimes(tuple(buffers), n_steps)


def unused_tensors(graph: Graph) -> tuple[int, ...]:
    """Non-constant tensors of a fixed non-zero size that no operator reads or writes and that are
    not graph inputs or outputs: TFLite Micro plans them all the same (each lives from step -1 to
    step -1: `micro_allocation_info.cc` marks lifetimes only through ops and graph inputs/outputs).
    Writers drop them (`tpu_pipeline.toolchain.tflite.extract.without_unused_tensors`)."""
    touched = set(graph.inputs) | set(graph.outputs)
    for op in graph.ops:
        touched.update(op.inputs)
        touched.update(op.outputs)
    return tuple(t.index for t in graph.tensors
                 if t.index not in touched and t.kind == "activation" and not t.is_dynamic
                 and DTYPE_SIZES.get(t.dtype) and t.nbytes > 0)


def _share_in_place(graph, order, sem, first, last, sizes) -> None:
    """Reshape-like ops reuse their input's buffer when the input dies at that op (TFLite)."""
    outputs = set(graph.outputs)
    inputs = set(graph.inputs)
    for k, op_pos in enumerate(order):
        op = graph.ops[op_pos]
        if op.opcode not in sem.in_place_ops or not op.inputs or not op.outputs:
            continue
        src, dst = op.inputs[0], op.outputs[0]
        if not (graph.is_activation(src) and graph.is_activation(dst)):
            continue
        if src in outputs or src in inputs or last.get(src) != k + 1 or sizes.get(src, 0) < sizes.get(dst, 0):
            continue
        # The output lives in the input's bytes: extend the input, drop the output's buffer.
        last[src] = max(last[src], last[dst])
        sizes[dst] = 0


def peak_memory(graph: Graph, order=None, semantics: Semantics | str = "tflm") -> int:
    """The most bytes live at any step: no arena planner can do better for this order."""
    return lifetimes(graph, order, semantics).peak

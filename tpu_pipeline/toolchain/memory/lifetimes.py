"""Buffer lifetimes of a graph under an op order and a runtime's semantics.

Steps follow TFLite Micro's allocation scopes: step 0 is the start of the invocation (graph inputs
arrive), the op at position k of the order runs at step k+1, and graph outputs stay live to the
last step n. Lifetimes are inclusive [first, last]. Two buffers conflict iff their lifetimes
intersect. Scratch buffers a kernel requests live for their op's step only.

Under TFLite Micro, a harness kernel that overlaps its output with its input (`ir.kernels`,
flag "overlap") puts both tensors in one buffer at fixed offsets (`kernels.overlap_layout`): the
buffer is the pair's extent over the union of their lifetimes, and lists its members. Chains of
such ops (an in-place depthwise convolution, then an overlapped pointwise one) share one buffer.
The runtime itself still sees one buffer per tensor (`Lifetimes.per_tensor`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_pipeline.toolchain.ir import Graph, kernels
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import Semantics, align, get_semantics


@dataclass(frozen=True)
class Member:
    """A tensor that shares a buffer with others: where in it, and its own lifetime and size."""
    tensor: int
    offset: int
    size: int
    first: int
    last: int


@dataclass(frozen=True)
class Buffer:
    size: int  # bytes, rounded to the semantics' alignment
    first: int
    last: int
    tensor: int | None = None  # the activation tensor it holds (the first member of a shared one)
    op: int | None = None  # for scratch buffers: the op (position in graph.ops) that requested it
    name: str = ""
    members: tuple[Member, ...] = ()  # tensors sharing this buffer (overlapped ops); () = just `tensor` at 0

    def overlaps(self, other: "Buffer") -> bool:
        return self.first <= other.last and other.first <= self.last

    def placements(self) -> tuple[tuple[int, int], ...]:
        """(tensor, offset within the buffer) of every tensor it holds."""
        if self.members:
            return tuple((m.tensor, m.offset) for m in self.members)
        return ((self.tensor, 0),) if self.tensor is not None else ()


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

    def per_tensor(self, offsets=None):
        """The buffers as the runtime allocates them, one per tensor (shared buffers split into their
        members, each with its own lifetime and size), in TFLite Micro's order (tensors by index,
        then scratch), and, given `offsets` per buffer of self (-1 = unplaced), their offsets.
        Returns (Lifetimes, offsets or None, the index in self of each runtime buffer)."""
        items = []  # (tensor index or a key after every tensor for scratch, buffer, offset)
        for i, b in enumerate(self.buffers):
            at = -1 if offsets is None else offsets[i]
            if not b.members:
                items.append((b.tensor if b.tensor is not None else float("inf"), i, b, at))
                continue
            for m in b.members:
                items.append((m.tensor, i, Buffer(m.size, m.first, m.last, tensor=m.tensor, name=b.name),
                              -1 if at < 0 else at + m.offset))
        items.sort(key=lambda it: (it[0], it[1]))  # tensors in index order, then scratch, as TFLM adds them
        out = Lifetimes(tuple(it[2] for it in items), self.n_steps)
        return out, (None if offsets is None else [it[3] for it in items]), [it[1] for it in items]


def lifetimes(graph: Graph, order=None, semantics: Semantics | str = "tflm") -> Lifetimes:
    """Lifetimes of every buffer the runtime allocates in its arena, for ops run in `order`.

    `order` lists positions into `graph.ops` (default: the graph's own order). Tensors come in
    tensor-index order, then scratch buffers in request order, as TFLite Micro adds them.
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

    sizes = {t: align(graph.tensors[t].nbytes, sem.alignment) for t in first}
    if sem.in_place_ops:
        _share_in_place(graph, order, sem, first, last, sizes)
    groups = overlap_groups(graph) if sem.name.startswith("tflm") else {}

    buffers = []
    for t in sorted(first):
        if t in groups and groups[t][0][0] != t:
            continue  # a later member of a shared buffer: listed with its first member
        if t in groups:
            members = tuple(Member(m, off, sizes[m], first[m], last[m]) for m, off in groups[t] if m in first)
            extent = max(m.offset + m.size for m in members)
            buffers.append(Buffer(extent, min(m.first for m in members), max(m.last for m in members), tensor=t,
                                  name=graph.tensors[t].name, members=members))
        elif sizes[t] > 0:
            buffers.append(Buffer(sizes[t], first[t], last[t], tensor=t, name=graph.tensors[t].name))
    for op_pos in sorted(order, key=step_of.get):
        for size in scratch_requests(graph, op_pos, sem):
            s = step_of[op_pos]
            buffers.append(Buffer(align(size, sem.alignment), s, s, op=op_pos,
                                  name=f"scratch of op {op_pos} ({graph.ops[op_pos].opcode})"))
    return Lifetimes(tuple(buffers), n + 1)


def overlap_legal(graph: Graph, i: int) -> bool:
    """Whether op i may overlap its output with its input in every order: a harness kernel whose
    input is an activation written by an op, read by op i alone and not a graph input or output,
    and whose output is no graph input."""
    op = graph.ops[i]
    if not kernels.is_harness(op) or not op.inputs or not op.outputs:
        return False
    src, dst = op.inputs[0], op.outputs[0]
    return (graph.is_activation(src) and graph.is_activation(dst) and src in graph.producer
            and src not in graph.outputs and src not in graph.inputs and dst not in graph.inputs
            and tuple(graph.consumers.get(src, ())) == (i,))


def overlap_groups(graph: Graph) -> dict[int, tuple[tuple[int, int], ...]]:
    """Tensor -> its shared buffer's members (tensor, offset), the first member first, for every
    tensor of a chain of legal overlapped ops (flag "overlap"); offsets 16-aligned, the smallest 0."""
    pairs = {}  # dst -> (src, offset of dst relative to src)
    for i, op in enumerate(graph.ops):
        if kernels.OVERLAP in kernels.flags(op) and overlap_legal(graph, i):
            in_off, out_off, _ = kernels.overlap_layout(graph, op)
            pairs[op.outputs[0]] = (op.inputs[0], out_off - in_off)
    out: dict[int, tuple[tuple[int, int], ...]] = {}
    srcs = {s for s, _ in pairs.values()}
    for end in (d for d in pairs if d not in srcs):  # walk each chain back from its last tensor
        chain, offset, t = [(end, 0)], 0, end
        while t in pairs:
            src, rel = pairs[t]
            offset -= rel
            chain.append((src, offset))
            t = src
        low = min(o for _, o in chain)
        members = tuple(sorted(((m, o - low) for m, o in chain), key=lambda mo: graph.producer[mo[0]]))
        for m, _ in members:
            out[m] = members
    return out


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

"""Buffer lifetimes of a graph under an op order and a runtime's semantics.

Steps follow TFLite Micro's allocation scopes: step 0 is the start of the invocation (graph inputs
arrive), the op at position k of the order runs at step k+1, and graph outputs stay live to the
last step n. Lifetimes are inclusive [first, last]. Two buffers conflict iff their lifetimes
intersect. Scratch buffers a kernel requests live for their op's step only.

Under TFLite Micro, a harness kernel that overlaps its output with its input (`ir.kernels`, flag
"overlap") runs at its step with both tensors in one span of bytes (`overlap.overlap_layout`):
its input's buffer ends the step before, its output's starts the step after, and a *pair* buffer
of the pair's extent holds both at the op's step. The three are a rigid group (`Buffer.group`,
`group_offset`): planners place them at fixed offsets from each other (the pair shares its
first byte), so other buffers may use the bytes past the smaller one while it alone lives. A
chain of such ops (an in-place depthwise convolution, then an overlapped pointwise one) is one
group, all from one start. The runtime still sees one buffer per tensor (`Lifetimes.per_tensor`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_pipeline.toolchain.ir import DTYPE_SIZES, Graph, kernels, overlap
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import TFLM, Semantics, align, get_semantics


@dataclass(frozen=True)
class Member:
    """A tensor a pair buffer holds: where in it, and the tensor's own lifetime and size."""
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
    members: tuple[Member, ...] = ()  # a pair buffer: the tensors it holds; () = just `tensor` at 0
    group: int = -1  # rigid group (overlapped ops): buffers placed at fixed offsets from each other
    group_offset: int = 0  # this buffer's offset from its group's base

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
        """The buffers as the runtime allocates them, one per tensor over its whole lifetime (a pair
        buffer's members and the tensors' own buffers joined), in TFLite Micro's order (tensors by
        index, then scratch), and, given `offsets` per buffer of self (-1 = unplaced), where each
        sits. Returns (Lifetimes, offsets or None, the index in self of each runtime buffer)."""
        tensors: dict[int, list] = {}  # tensor -> [size, first, last, offset, index in self]
        scratch = []
        for i, b in enumerate(self.buffers):
            at = -1 if offsets is None else offsets[i]
            held = b.members or ((Member(b.tensor, 0, b.size, b.first, b.last),) if b.tensor is not None else ())
            if not held:
                scratch.append((b, at, i))
            for m in held:
                e = tensors.setdefault(m.tensor, [m.size, m.first, m.last, -1, i])
                e[1], e[2] = min(e[1], m.first), max(e[2], m.last)
                if at >= 0:
                    e[3] = at + m.offset
        items = [(Buffer(s, f, l, tensor=t, name=self.buffers[i].name), o, i)
                 for t, (s, f, l, o, i) in sorted(tensors.items())] + scratch
        out = Lifetimes(tuple(it[0] for it in items), self.n_steps)
        return out, (None if offsets is None else [it[1] for it in items]), [it[2] for it in items]


def lifetimes(graph: Graph, order=None, semantics: Semantics | str = TFLM, *,
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
    first, last = _touched(graph, order, step_of, sem)
    n_steps = n + 1
    if whole_model and sem.allocates_unused:
        unused = unused_tensors(graph)
        if unused:
            # TFLite Micro allocates them with an empty lifetime, which overlaps only each other:
            # one step of their own after the last, so they share bytes with nothing else.
            n_steps = n + 2
            for t in unused:
                first[t] = last[t] = n + 1
    for t in graph.external:  # kept in the application's buffer: no bytes of the arena
        first.pop(t, None)
    sizes = {t: align(graph.tensors[t].nbytes, sem.alignment) for t in first}
    if sem.in_place_ops:
        _share_in_place(graph, order, sem, first, last, sizes)
    pairs = overlapped_ops(graph) if sem.is_tflm else {}
    own = {t: (first[t], last[t]) for t in first}  # each tensor's own buffer, cut short by pairs
    for i, (src, dst, _, _, _) in pairs.items():
        k = step_of[i]
        own[src] = (own[src][0], k - 1)
        own[dst] = (k + 1, own[dst][1])
    group_of, at = _rigid_groups(pairs)

    buffers = []
    for t in sorted(first):
        lo, hi = own[t]
        if sizes[t] > 0 and lo <= hi:
            g = group_of.get(t, -1)
            buffers.append(Buffer(sizes[t], lo, hi, tensor=t, name=graph.tensors[t].name, group=g,
                                  group_offset=at.get(t, 0)))
    for i in sorted(pairs, key=step_of.get):
        src, dst, in_off, out_off, extent = pairs[i]
        k = step_of[i]
        members = (Member(src, in_off, sizes[src], first[src], last[src]),
                   Member(dst, out_off, sizes[dst], first[dst], last[dst]))
        buffers.append(Buffer(extent, k, k, tensor=None, op=i, name=f"{graph.tensors[dst].name} over its input",
                              members=members, group=group_of[src], group_offset=at[src] - in_off))
    for op_pos in sorted(order, key=step_of.get):
        for size in scratch_requests(graph, op_pos, sem):
            s = step_of[op_pos]
            buffers.append(Buffer(align(size, sem.alignment), s, s, op=op_pos,
                                  name=f"scratch of op {op_pos} ({graph.ops[op_pos].opcode})"))
    return Lifetimes(tuple(buffers), n_steps)


def _touched(graph: Graph, order, step_of: dict[int, int], sem: Semantics) -> tuple[dict[int, int], dict[int, int]]:
    """(first, last) step each activation tensor is live at: from its first touch to its last read
    (graph inputs from step 0, graph outputs to the end)."""
    n = len(graph.ops)
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
    return first, last


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


def overlap_legal(graph: Graph, i: int) -> bool:
    """Whether op i may write its output over its input in every order: a harness convolution whose
    input is an activation op i reads last in every order (a graph input too: TFLite Micro reuses
    an input's bytes after its last reader) not kept outside the arena, not a graph output, and
    whose output is not a graph input."""
    op = graph.ops[i]
    if not kernels.is_harness(op) or op.opcode not in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        return False
    src, dst = op.inputs[0], op.outputs[0]
    return (graph.is_activation(src) and graph.is_activation(dst) and src not in graph.outputs
            and src not in graph.external and dst not in graph.inputs and src != dst and graph.reads_last(i, src))


def overlapped_ops(graph: Graph) -> dict[int, tuple[int, int, int, int, int]]:
    """Op position -> (input, output, input offset, output offset, extent) of every legal overlapped
    op (flag "overlap") and elementwise op run in place: where its two tensors sit in the span of
    bytes it runs in."""
    out = {}
    for i, op in enumerate(graph.ops):
        if kernels.OVERLAP in kernels.flags(op) and overlap_legal(graph, i):
            out[i] = (op.inputs[0], op.outputs[0], *overlap.overlap_layout(graph, op))
        elif kernels.runs_in_place(op):
            src = kernels.in_place_source(graph, i)
            if src is not None:
                out[i] = (src, op.outputs[0], 0, 0, align(graph.tensors[src].nbytes, 16))
    return out


def overlap_savings(graph: Graph, sem: Semantics) -> dict[int, int]:
    """Op position -> bytes an overlapped op saves at its step: its two tensors' sizes minus the
    extent they share (TFLite Micro semantics only)."""
    if not sem.is_tflm:
        return {}
    return {i: align(graph.tensors[src].nbytes, sem.alignment) + align(graph.tensors[dst].nbytes, sem.alignment) - extent
            for i, (src, dst, _, _, extent) in overlapped_ops(graph).items()}


def _rigid_groups(pairs) -> tuple[dict[int, int], dict[int, int]]:
    """(tensor -> group id, tensor -> offset from its group's base) for the tensors of overlapped
    ops: a chain of ops shares one group; the smallest offset in a group is 0."""
    rel = {}  # dst -> (src, dst offset - src offset)
    for src, dst, in_off, out_off, _ in pairs.values():
        rel[dst] = (src, out_off - in_off)
    srcs = {s for s, _ in rel.values()}
    group_of, at = {}, {}
    for g, end in enumerate(sorted(d for d in rel if d not in srcs)):  # walk each chain back from its end
        chain, offset, t = {end: 0}, 0, end
        while t in rel:
            src, d = rel[t]
            offset -= d
            chain[src] = offset
            t = src
        low = min(chain.values())
        for m, o in chain.items():
            group_of[m], at[m] = g, o - low
    return group_of, at


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


def peak_memory(graph: Graph, order=None, semantics: Semantics | str = TFLM) -> int:
    """The most bytes live at any step: no arena planner can do better for this order."""
    return lifetimes(graph, order, semantics).peak

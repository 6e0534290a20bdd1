"""The scheduler's view of the shared memory model: integer arrays and bitsets over ops.

`MemModel` computes, for any set S of already-executed ops and a ready op v, the bytes live at
v's step, with exactly the rules of `tpu_pipeline.toolchain.memory.lifetimes` (tests pin the two together):

- a tensor's buffer is live from its first toucher's step (step 0 for graph inputs) to its last
  toucher's step (the last step n for graph outputs), inclusive, touchers being the ops that
  read or write it;
- op scratch lives for its op's step only; sizes are rounded to the semantics' alignment; an
  overlapped harness op's input and output share bytes at its step (`extra` is less by that);
- under "tflite", graph inputs live the whole run, and reshape-like ops share their input's buffer
  (merged into one tensor here when that sharing does not depend on the order).

Live bytes at the step of v, given S: R(S) + new(v, S) + scratch(v) (+ the constant parts), where
R(S) — the bytes resident between steps — depends on the set S only, never on the order inside it.
That is what makes a DP over sets exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.memory.lifetimes import overlap_savings
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import TFLM, Semantics, align, get_semantics


@dataclass(frozen=True)
class MemModel:
    n: int
    preds: tuple[int, ...]  # per op: bitset of predecessor ops (ordering constraints)
    succs: tuple[int, ...]  # per op: bitset of successor ops
    touch: tuple[tuple[int, ...], ...]  # per op: the model tensors it reads or writes
    size: tuple[int, ...]  # per model tensor
    mask: tuple[int, ...]  # per model tensor: bitset of its touching ops
    pin_start: tuple[bool, ...]  # live from step 0 (graph input)
    pin_end: tuple[bool, ...]  # live to step n (graph output; TFLite: graph inputs too)
    extra: tuple[int, ...]  # per op: scratch bytes
    const_all: int  # tensors live at every step (pinned at both ends)
    step0: int  # bytes live at step 0
    final_only: int  # graph outputs nobody touches: live at the last step only
    r0: int  # resident bytes before the first op (without const_all)
    exact: bool  # False if the runtime's sharing depends on the order (TFLite in-place corner case)
    tensor_ids: tuple[tuple[int, ...], ...] = ()  # per model tensor: the graph tensors it stands for
    born: tuple[int, ...] = ()  # per model tensor: the op that writes it, -1 if none (graph input)

    @property
    def full(self) -> int:
        return (1 << self.n) - 1

    # ---- the two primitives every search uses ----------------------------------------------
    def step(self, v: int, S: int, R: int) -> tuple[int, int]:
        """(live bytes at v's step, resident bytes after it), given executed set S and R = R(S)."""
        bit = 1 << v
        after = S | bit
        new = died = 0
        size, mask, pin_start, pin_end = self.size, self.mask, self.pin_start, self.pin_end
        for t in self.touch[v]:
            m = mask[t]
            if not pin_start[t] and not (m & S):
                new += size[t]
            if not pin_end[t] and not (m & ~after):
                died += size[t]
        live = self.const_all + R + new + self.extra[v]
        if after == self.full:
            live += self.final_only
        return live, R + new - died

    def resident(self, S: int) -> int:
        """R(S): bytes live between steps once exactly the ops in S have run (const_all excluded)."""
        total = 0
        for t in range(len(self.size)):
            m = self.mask[t]
            if self.pin_start[t] and self.pin_end[t]:
                continue
            if (self.pin_start[t] or m & S) and (self.pin_end[t] or m & ~S):
                total += self.size[t]
        return total

    def peak(self, order, S: int = 0, R: int | None = None) -> int:
        """Peak of running `order` after the ops in S (with R = R(S)); step 0 counted iff S == 0."""
        if R is None:
            R = self.resident(S) if S else self.r0
        best = self.step0 if S == 0 else 0
        for v in order:
            live, R = self.step(v, S, R)
            S |= 1 << v
            if live > best:
                best = live
        return best

    def profile(self, order) -> list[int]:
        """Live bytes at every step 0..n for a complete order."""
        out = [self.step0]
        S, R = 0, self.r0
        for v in order:
            live, R = self.step(v, S, R)
            S |= 1 << v
            out.append(live)
        return out

    @cached_property
    def end(self) -> int:
        """Bytes live at the last step in every order: the graph outputs (and what is live at
        every step), whichever op runs last."""
        return self.const_all + self.final_only + sum(s for s, pe in zip(self.size, self.pin_end) if pe)


def bits(mask: int):
    """Indices of the set bits, ascending."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _share_groups(graph: Graph, sem: Semantics, involved: set[int], sizes: dict[int, int],
                  inputs: set[int], outputs: set[int]) -> tuple[dict[int, list[int]], bool]:
    """Tensors that share one buffer, keyed by their root, and whether the sharing is exact
    (independent of the order). TFLite in-place sharing: union a reshape's output into its input
    when that is static."""
    parent = {t: t for t in involved}

    def find(t):
        while parent[t] != t:
            parent[t] = parent[parent[t]]
            t = parent[t]
        return t

    exact = True
    if sem.in_place_ops:
        zeroed: set[int] = set()
        for i, op in enumerate(graph.ops):
            if op.opcode not in sem.in_place_ops or not op.inputs or not op.outputs:
                continue
            src, dst = op.inputs[0], op.outputs[0]
            if not (graph.is_activation(src) and graph.is_activation(dst)):
                continue
            if src in outputs or src in inputs:
                continue
            # an input that already lives in another tensor's bytes lends none: lifetimes() gives
            # its sharing no effect (even into a 0-byte output)
            if src in zeroed or sizes[src] < sizes[dst]:
                continue
            cons = graph.consumers.get(src, ())
            if tuple(cons) != (i,):
                exact = False  # shares only if this op happens to be the last reader: order-dependent
                continue
            parent[find(dst)] = find(src)
            zeroed.add(dst)

    groups: dict[int, list[int]] = {}
    for t in sorted(involved):
        groups.setdefault(find(t), []).append(t)
    return groups, exact


def build_model(graph: Graph, semantics: Semantics | str = TFLM) -> MemModel:
    sem = get_semantics(semantics)
    n = len(graph.ops)
    inputs = {t for t in graph.inputs if graph.is_activation(t)}
    outputs = {t for t in graph.outputs if graph.is_activation(t)}

    # graph tensor -> touching ops
    touchers: dict[int, set[int]] = {}
    for i, op in enumerate(graph.ops):
        for t in (*op.inputs, *op.outputs):
            if graph.is_activation(t):
                touchers.setdefault(t, set()).add(i)
    involved = set(touchers) | inputs | outputs
    sizes = {t: 0 if t in graph.external else align(graph.tensors[t].nbytes, sem.alignment) for t in involved}

    groups, exact = _share_groups(graph, sem, involved, sizes, inputs, outputs)
    ids = sorted(groups)
    size, mask, ps, pe, tensor_ids, born = [], [], [], [], [], []
    producer = graph.producer
    op_touch: list[list[int]] = [[] for _ in range(n)]
    const_all = step0 = final_only = r0 = 0
    for root in ids:
        members = groups[root]
        s = sizes[root]
        m = 0
        for t in members:
            for i in touchers.get(t, ()):
                m |= 1 << i
        p_start = root in inputs
        p_end = any(t in outputs for t in members) or (sem.inputs_live_whole_run and p_start)
        if s == 0:
            continue
        if p_start:
            step0 += s
        if p_start and p_end:
            const_all += s
            continue
        if m == 0:
            if p_end:
                final_only += s
            continue
        k = len(size)
        size.append(s)
        mask.append(m)
        ps.append(p_start)
        pe.append(p_end)
        tensor_ids.append(tuple(members))
        born.append(-1 if p_start else producer.get(root, -1))
        if p_start:
            r0 += s
        for i in bits(m):
            op_touch[i].append(k)
    # scratch, less what an overlapped op's input and output share at its step (lifetimes: the pair buffer)
    saving = overlap_savings(graph, sem)
    extra = tuple(sum(align(x, sem.alignment) for x in scratch_requests(graph, i, sem)) - saving.get(i, 0)
                  for i in range(n))
    preds = tuple(sum(1 << p for p in graph.preds[i]) for i in range(n))
    succs = tuple(sum(1 << s for s in graph.succs[i]) for i in range(n))
    return MemModel(n, preds, succs, tuple(tuple(x) for x in op_touch), tuple(size), tuple(mask),
                    tuple(ps), tuple(pe), extra, const_all, step0, final_only, r0, exact, tuple(tensor_ids),
                    tuple(born))


def is_topological(model: MemModel, order) -> bool:
    S = 0
    for v in order:
        if model.preds[v] & ~S or (S >> v) & 1:
            return False
        S |= 1 << v
    return S == model.full

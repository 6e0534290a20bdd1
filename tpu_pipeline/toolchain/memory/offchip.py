"""Off-chip traffic for a memory hierarchy (SERENITY, Figure 11): an op order and an on-chip size in,
the bytes moved off chip and back under Belady's clairvoyant replacement out.

The model, per step (the op at position k of the order runs at step k + 1):
- the op's activation inputs must be on chip (a missing one is reloaded: its bytes count as
  traffic), its outputs are created on chip, its scratch needs room for the step;
- when the on-chip bytes would exceed the capacity, resident tensors the op does not touch are
  evicted: first those never needed again (dropped for free), then the one whose next use is
  farthest (Belady). Evicting a tensor that has no off-chip copy yet writes it out (a spill, its
  bytes count as traffic); a tensor reloaded earlier still has its copy, so evicting it again is
  free. Graph outputs count as used at the end; graph inputs start on chip with an off-chip copy.
- tensors die after their last use (graph outputs never do).
Whole tensors move; sizes are rounded as the semantics say (16 bytes for TFLite Micro).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import TFLM, Semantics, align, get_semantics


@dataclass(frozen=True)
class Traffic:
    onchip_bytes: int
    spill_bytes: int  # written off chip
    reload_bytes: int  # read back on chip
    feasible: bool  # False when a single op's working set does not fit on chip
    min_onchip_bytes: int  # the largest single-step working set: no capacity below this works

    @property
    def total_bytes(self) -> int:
        return self.spill_bytes + self.reload_bytes

    def to_json(self) -> dict:
        return {"onchip_bytes": self.onchip_bytes, "spill_bytes": self.spill_bytes,
                "reload_bytes": self.reload_bytes, "total_bytes": self.total_bytes,
                "feasible": self.feasible, "min_onchip_bytes": self.min_onchip_bytes}


def _steps(graph: Graph, order, sem: Semantics, outputs: set[int]):
    """(steps, uses): per step (step, activation inputs, activation outputs, scratch bytes), and per
    tensor the ascending steps that read it (graph outputs are read once more, after the last op)."""
    uses: dict[int, list[int]] = {}
    steps = []
    for k, op_pos in enumerate(order):
        step = k + 1
        ins = graph.activation_inputs(op_pos)
        outs = graph.activation_outputs(op_pos)
        scratch = sum(align(s, sem.alignment) for s in scratch_requests(graph, op_pos, sem))
        for t in ins:
            uses.setdefault(t, []).append(step)
        steps.append((step, ins, outs, scratch))
    for t in outputs:
        uses.setdefault(t, []).append(len(graph.ops) + 1)
    return steps, uses


def offchip_traffic(graph: Graph, order=None, onchip_bytes: int = 0,
                    semantics: Semantics | str = TFLM) -> Traffic:
    """Bytes spilled and reloaded when running `order` with `onchip_bytes` of on-chip memory."""
    sem = get_semantics(semantics)
    n = len(graph.ops)
    order = list(range(n)) if order is None else list(order)
    size = {}

    def nbytes(t: int) -> int:
        if t not in size:
            size[t] = align(graph.tensors[t].nbytes, sem.alignment)
        return size[t]

    outputs = {t for t in graph.outputs if graph.is_activation(t)}
    steps, uses = _steps(graph, order, sem, outputs)

    def next_use(t: int, step: int) -> int | None:
        u = uses.get(t, ())
        i = bisect.bisect_right(u, step)
        return u[i] if i < len(u) else None

    need_max = max([sum(nbytes(t) for t in set(ins) | set(outs)) + scratch for _, ins, outs, scratch in steps],
                   default=0)
    if need_max > onchip_bytes:
        return Traffic(onchip_bytes, 0, 0, False, need_max)

    resident: dict[int, bool] = {}  # tensor -> has an off-chip copy (clean)
    used = 0
    spill = reload = 0
    for t in dict.fromkeys(graph.inputs):
        if graph.is_activation(t):
            resident[t] = True
            used += nbytes(t)

    def make_room(need: int, step: int, keep: set[int]) -> None:
        nonlocal used, spill
        if used + need <= onchip_bytes:
            return
        # dead tensors first (free), then the farthest next use (Belady); ties by tensor index
        candidates = []
        for t in resident:
            if t in keep:
                continue
            nu = next_use(t, step - 1) if t not in keep else None
            candidates.append((0 if nu is None else 1, -(nu or 0), t))
        candidates.sort()
        for dead_first, _, t in candidates:
            if used + need <= onchip_bytes:
                break
            if dead_first == 1 and not resident[t]:
                spill += nbytes(t)
            used -= nbytes(t)
            del resident[t]

    for step, ins, outs, scratch in steps:
        keep = set(ins) | set(outs)
        missing = [t for t in dict.fromkeys(ins) if t not in resident]
        need = sum(nbytes(t) for t in missing) + sum(nbytes(t) for t in dict.fromkeys(outs) if t not in resident)
        make_room(need + scratch, step, keep)
        for t in missing:
            reload += nbytes(t)
            resident[t] = True
            used += nbytes(t)
        for t in dict.fromkeys(outs):
            if t not in resident:
                resident[t] = False
                used += nbytes(t)
        # free what dies here
        for t in list(resident):
            if t not in outputs and next_use(t, step) is None:
                used -= nbytes(t)
                del resident[t]
    return Traffic(onchip_bytes, spill, reload, True, need_max)

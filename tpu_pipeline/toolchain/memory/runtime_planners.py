"""The runtimes' own arena planners, to predict what they allocate.

- `tflm_greedy`: TFLite Micro's GreedyMemoryPlanner (offline offsets first; online buffers in
  descending size, ties kept in the reverse of the order they were added, because the planner
  fills its sort array from the tail and then bubble-sorts it stably; each buffer goes to the first
  gap, in offset order, among buffers live at the same time).
- `tflite_arena`: TFLite's ArenaPlanner policy (whole-run tensors first by index, then descending
  size, ties by allocation step; best fit among the gaps) over the model's tensors. LiteRT also
  places kernel temporaries (im2col buffers and the like, chosen per kernel path at run time) in
  the same arena; they are not modelled, so its real arena is larger. Only the TFLM prediction is
  exact to the byte (tests/test_memory_tflm.py).
"""

from __future__ import annotations

from tpu_pipeline.toolchain.memory.lifetimes import Lifetimes
from tpu_pipeline.toolchain.memory.plan import ArenaPlan, arena_size

ONLINE = -1


def tflm_greedy(lt: Lifetimes, offline: list[int] | None = None) -> ArenaPlan:
    """TFLite Micro's GreedyMemoryPlanner on these buffers; `offline[i]` pins buffer i (or -1).
    TFLite Micro plans one buffer per tensor: lifetimes with overlapped ops' groups are taken as
    `lt.per_tensor()` (the returned offsets then index that view; pinned ones must be given in it)."""
    if any(b.members or b.group >= 0 for b in lt.buffers):
        if offline is not None:
            raise ValueError("tflm_greedy: pin the runtime's view (Lifetimes.per_tensor) of overlapped ops")
        lt = lt.per_tensor()[0]
    bufs = lt.buffers
    n = len(bufs)
    if n == 0:
        return ArenaPlan((), 0, 0, "tflm")
    offline = offline or [ONLINE] * n
    fixed = [i for i in range(n) if offline[i] != ONLINE]
    online = [i for i in range(n) if offline[i] == ONLINE][::-1]
    online.sort(key=lambda i: -bufs[i].size)  # Python's sort is stable, as the bubble sort is
    sequence = fixed + online

    offsets = [0] * n
    placed: list[tuple[int, int]] = []  # (offset, buffer) kept in offset order, ties by insertion
    for k, i in enumerate(sequence):
        b = bufs[i]
        if offline[i] != ONLINE:
            candidate = offline[i]
        elif k == 0:
            candidate = 0
        else:
            candidate = 0
            for off, j in placed:
                c = bufs[j]
                if c.first > b.last or b.first > c.last:
                    continue
                if off - candidate >= b.size:
                    break
                candidate = max(candidate, off + c.size)
        offsets[i] = candidate
        pos = len(placed)
        for p, (off, _) in enumerate(placed):
            if off > candidate:
                pos = p
                break
        placed.insert(pos, (candidate, i))
    size = arena_size(bufs, offsets)
    return ArenaPlan(tuple(offsets), size, lt.peak, "tflm")


def tflite_arena(lt: Lifetimes, alignment: int = 64) -> ArenaPlan:
    """TFLite's ArenaPlanner: whole-run buffers first, then largest first, best-fit gaps."""
    bufs = lt.buffers
    n = len(bufs)
    last_step = lt.n_steps - 1
    whole_run = [i for i in range(n) if bufs[i].first == 0 and bufs[i].last == last_step]
    rest = [i for i in range(n) if i not in set(whole_run)]
    rest.sort(key=lambda i: (-bufs[i].size, bufs[i].first, i))
    offsets = [0] * n
    placed: list[int] = []
    for i in whole_run + rest:
        b = bufs[i]
        live = sorted((offsets[j], offsets[j] + bufs[j].size) for j in placed if bufs[j].overlaps(b))
        best, best_gap, cursor = None, None, 0
        for start, end in live:
            gap = start - cursor
            if gap >= b.size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, _align_up(end, alignment))
        offsets[i] = cursor if best is None else best
        placed.append(i)
    return ArenaPlan(tuple(offsets), arena_size(bufs, offsets), lt.peak, "tflite")


def _align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a

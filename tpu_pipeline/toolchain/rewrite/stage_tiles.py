"""A patch stage's tile buffers (tpu_pipeline.toolchain.ir.stage): the buffers of one tile's steps, planned
together by the arena planner, and what an output written over its dying input needs (the frame
and the ring of rows). Shared by the stage's programs (rewrite/patch_stage.py, stage_stream2d.py)."""

from __future__ import annotations

from tpu_pipeline.toolchain.ir import overlap
from tpu_pipeline.toolchain.ir.geometry import Box
from tpu_pipeline.toolchain.memory.lifetimes import Buffer
from tpu_pipeline.toolchain.memory.planners import plan_buffers

ALIGN = 4  # tile buffers are 4-byte aligned (what CMSIS-NN's loads need)


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


_PLANS: dict[tuple, tuple[tuple[int, ...], int]] = {}  # a tile's planning problem -> (offsets, size)


class TileBuffers:
    """A tile's buffers, planned together by the arena planner. A buffer written over another at a
    step (an in-place slice, an overlapped convolution's output over its dying input) is planned
    as lifetimes.py plans an overlapped op: the source ends the step before, the new buffer starts
    the step after, and a pair buffer spanning both holds them at that step; all three are a
    rigid group (fixed offsets from each other, `Buffer.group`), so other buffers may use the
    bytes either one leaves free while it alone lives."""

    def __init__(self):
        self.bufs: list[list[int]] = []  # [size, first step, last step]
        self.group: list[int] = []  # -1: on its own
        self.at: list[int] = []  # offset from its group's base
        self.pairs: list[tuple[int, int, int]] = []  # (source, buffer written over it, step)
        self.groups = 0

    def new(self, size: int, step: int) -> int:
        self.bufs.append([aligned(size), step, step])
        self.group.append(-1)
        self.at.append(0)
        return len(self.bufs) - 1

    def use(self, b: int, step: int) -> int:
        self.bufs[b][2] = max(self.bufs[b][2], step)
        return b

    def over(self, b: int, b_at: int, size: int, size_at: int, step: int) -> int:
        """A new buffer of `size` bytes written over `b` at `step` (`b`'s last), placed so that `b`
        starts `b_at` bytes and the new one `size_at` bytes into a common frame."""
        if self.group[b] < 0:
            self.group[b], self.groups = self.groups, self.groups + 1
        g = self.group[b]
        origin = b_at - self.at[b]  # where the group's base lands in the frame
        low = min(origin, size_at)
        for m, gm in enumerate(self.group):
            if gm == g:
                self.at[m] += origin - low
        self.bufs.append([aligned(size), step, step])
        self.group.append(g)
        self.at.append(size_at - low)
        self.pairs.append((b, len(self.bufs) - 1, step))
        return len(self.bufs) - 1

    def offsets(self) -> tuple[list[int], int]:
        """Byte offsets of every buffer in the tile's scratch, and the scratch's size. Tiles of one
        shape pose the same problem (most of a grid's): it is planned once."""
        key = (tuple(map(tuple, self.bufs)), tuple(self.group), tuple(self.at), tuple(self.pairs))
        if key not in _PLANS:
            if len(_PLANS) > 4096:
                _PLANS.clear()
            _PLANS[key] = self._plan()
        offsets, size = _PLANS[key]
        return list(offsets), size

    def _plan(self) -> tuple[tuple[int, ...], int]:
        spans = [list(b) for b in self.bufs]
        planned = []  # (size, first, last, group, offset in group, buffer or -1 for a pair)
        for src, dst, step in self.pairs:
            spans[src][2] = min(spans[src][2], step - 1)
            spans[dst][1] = max(spans[dst][1], step + 1)
            lo = min(self.at[src], self.at[dst])
            hi = max(self.at[src] + self.bufs[src][0], self.at[dst] + self.bufs[dst][0])
            planned.append((hi - lo, step, step, self.group[src], lo, -1))
        for k, (size, first, last) in enumerate(spans):
            if first <= last:  # (a buffer written over and read over at once lives in its pairs only)
                planned.append((size, first, last, self.group[k], self.at[k], k))
        buffers = tuple(Buffer(size, first, last, tensor=j, group=g, group_offset=a)
                        for j, (size, first, last, g, a, _) in enumerate(planned))
        plan = plan_buffers(buffers, "auto", time_limit=0.2, alignment=ALIGN)
        base = {p[3]: plan.offsets[j] - p[4] for j, p in enumerate(planned) if p[3] >= 0}
        own = {p[5]: plan.offsets[j] for j, p in enumerate(planned) if p[5] >= 0}
        return tuple(base[g] + a if g >= 0 else own[k] for k, (g, a) in enumerate(zip(self.group, self.at))), plan.size


def overlap_extent(real: Box, obox: Box, x_c: int, y_c: int, pad_top: int, rows) -> tuple[int, int]:
    """(extent, ring rows) of a tile's convolution run with its output over its input, both from
    the first byte (overlap.overlap_layout's rule on the tile's boxes)."""
    x = aligned((real[1] - real[0]) * (real[3] - real[2]) * x_c)
    y = aligned((obox[1] - obox[0]) * (obox[3] - obox[2]) * y_c)
    ring = overlap.ring_rows_for(real[1] - real[0], (real[3] - real[2]) * x_c, obox[1] - obox[0],
                                 (obox[3] - obox[2]) * y_c, pad_top, rows.stride,
                                 (rows.kernel - 1) * rows.dilation + 1, 0, 0)
    return max(x, y), ring

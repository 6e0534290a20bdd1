"""Cheap estimates of a patch variant, from the tile geometry alone (no graph is built).

Building and measuring a patched graph costs tens of milliseconds; a model has thousands of
(region, grid) candidates. The selection therefore starts from these estimates and builds only
the variants it picks (fit.py: lazy evaluation), so the estimates steer the search but never
decide it: every variant in a final selection is built and measured.

- work: the MACs of every region op over the boxes each tile needs (halo recompute included),
  and its predicted time: each op's time scaled by the area its tiles compute (the added slices,
  pads and joins are left out: a floor);
- peak: a lower bound on the live bytes of the patch-by-patch order the rewrite emits, tile by
  tile: the region's input (live until the last tile is cut from it), the output tiles done so
  far, and the largest op footprint (input and output boxes, and the scratch the kernel asks
  for, which depends on channels and filter only, so every tile's copy asks what the op asks)
  of the current tile; and the final assembly (all tiles and the output). Explicit pads and row
  joins only add to it. For a patch stage (one op), the input and output are live throughout,
  next to the largest footprint, in which a convolution reading a tensor for the last time
  counts the larger of its input and output boxes (the stage may write one over the other).
"""

from __future__ import annotations

import numpy as np

from tpu_pipeline.toolchain.ir import Graph, macs
from tpu_pipeline.toolchain.ir.geometry import hw, region_needs, splits


def _aligned(graph: Graph, t: int) -> int:
    return -(-graph.tensors[t].nbytes // 16) * 16


def estimate_patches(graph: Graph, tin: int, tout: int, positions: list[int], grid,
                     op_seconds: dict[int, float], scratch: dict[int, int] | None = None,
                     stage: bool = False) -> tuple[int, int, float] | None:
    """(peak bytes, MACs, seconds) of running ops `positions` (tin -> tout) on a `grid` of tiles:
    the peak a lower bound as above; MACs exact; seconds each op's predicted time (`op_seconds`,
    the device model on the whole graph) scaled by the area its tiles compute. `scratch`: bytes of
    scratch each op asks for (tpu_pipeline.toolchain.memory.scratch, aligned). `stage`: the tiles run inside one
    op (tpu_pipeline.toolchain.ir.stage), whose peak is at least the region's input and output and the largest
    op's buffers on a tile. None when a tile would read nothing of some tensor (the grid is too
    fine for the region): that candidate does not exist."""
    region = [graph.ops[i] for i in positions]
    oh, ow = hw(graph, tout)
    rate, ppx = {}, {}
    for i in positions:
        for t in graph.ops[i].inputs + graph.ops[i].outputs:
            if graph.is_activation(t) and t not in ppx:
                x = graph.tensors[t]
                ppx[t] = x.nbytes // max(1, x.shape[1] * x.shape[2])
    steps = [(graph.ops[i].outputs[0], tuple(x for x in dict.fromkeys(graph.ops[i].inputs) if x in ppx), i)
             for i in positions]
    for i in positions:
        y = graph.ops[i].outputs[0]
        area = max(1, graph.tensors[y].shape[1] * graph.tensors[y].shape[2])
        rate[i] = ((macs(graph, i) or 0) / area, op_seconds.get(i, 0.0) / area)
    rows, cols = splits(oh, grid[0]), splits(ow, grid[1])
    # Every op maps rows and columns independently, so the box a tile needs of a tensor is the
    # rows its row of tiles needs by the columns its column needs: p + q walks, not p x q.
    row_need = [region_needs(graph, region, tout, (h0, h1, 0, ow)) for h0, h1 in rows]
    col_need = [region_needs(graph, region, tout, (0, oh, w0, w1)) for w0, w1 in cols]
    if any(n is None for n in row_need + col_need):
        return None
    full_in = 0 if tin in graph.external else _aligned(graph, tin)  # an input outside the arena costs it nothing
    full_out = _aligned(graph, tout)
    # Rows and columns of every needed box, as vectors over the rows / columns of tiles: an op's
    # footprint on tile (r, c) is sum over its tensors of bytes/pixel x rows(r) x cols(c), left
    # unrounded (rounding up to 16 B only adds: the peak stays a lower bound).
    H = {t: np.array([n[t][1] - n[t][0] for n in row_need], dtype=np.float64) for t in ppx}
    W = {t: np.array([n[t][3] - n[t][2] for n in col_need], dtype=np.float64) for t in ppx}
    footprint = np.zeros((len(rows), len(cols)))
    work = seconds = 0.0
    last_read = {x: i for y, xs, i in steps for x in xs}
    for y, xs, i in steps:
        boxes = [ppx[x] * np.outer(H[x], W[x]) for x in (*xs, y)]
        if stage and len(xs) == 1 and graph.ops[i].opcode != "ADD" and last_read[xs[0]] == i and xs[0] != tout:
            boxes = [np.maximum(*boxes)]  # the output may lie over the dying input
        f = sum(boxes) + (scratch or {}).get(i, 0)
        np.maximum(footprint, f, out=footprint)
        area = H[y].sum() * W[y].sum()
        work += rate[i][0] * area
        seconds += rate[i][1] * area
    if stage:
        return full_in + full_out + int(footprint.max()), int(work), seconds
    tiles = np.outer(H[tout], W[tout]).ravel() * ppx[tout]
    done = np.concatenate(([0.0], np.cumsum(tiles)[:-1]))  # output tiles finished before each tile
    live_input = np.full(tiles.size, float(full_in))
    live_input[-1] = 0.0  # dead once the last tile is cut from it
    peak = max(2 * full_out, int((live_input + done + footprint.ravel()).max()))
    return peak, int(work), seconds

"""A patch stage on a grid of several columns (square or wide) where no layer computes an element twice (StreamNet's 2-D halo
caching): the program rewrite/patch_stage.py `build_stage` runs for `stream` on grids of more
than one column (`stream2d_program`).

Tiles run in raster order. Of each layer's output a tile computes only the part of its box right
of the columns the tile to its left computed and below the rows the tile above computed; the
rest comes from the layer's row cache (the shared rows, full width, written by the tiles above)
and column cache (the shared columns, a tile row high, written by the tile to the left), pasted
with the new part into the box the layer's reader reads (PASTE, ir/stage.py). A tensor whose only
reader's box holds its new part is moved apart into that box in place. Exact for the same reasons
as every stage: each element is computed once, from the same inputs with the same integers.
"""

from __future__ import annotations

from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.ir import Graph, Op, kernels
from tpu_pipeline.toolchain.ir.geometry import clip, even_splits, hw, reads, region_needs, splits, window
from tpu_pipeline.toolchain.ir.stage import ADD, CONV, COPY_IN, COPY_OUT, PASTE
from tpu_pipeline.toolchain.rewrite.stage_tiles import ALIGN, TileBuffers, aligned, overlap_extent


def _shares(runs: list[tuple[int, int]]) -> list[int]:
    """Per tile along an axis, how many of its needed rows (columns) of a tensor the tiles before
    it computed: the leading part it takes from a cache."""
    return [0] + [max(0, min(b, p1) - a) for (a, b), (_, p1) in zip(runs[1:], runs[:-1])]


class _Halo:
    """One tensor's geometry on a 2-D streamed grid: the rows each tile row needs and the columns
    each tile column needs (every op maps the axes apart), the leading part of each it shares
    with the tile before (`top`, `left`), and its caches' shapes: the row cache holds the shared
    rows across the whole width (written by the tile above, at their columns), the column cache
    the shared columns across the tile row's rows (written by the tile to the left)."""

    def __init__(self, graph: Graph, t: int, rows: list[tuple[int, int]], cols: list[tuple[int, int]], cached: bool):
        self.rows, self.cols, self.c = rows, cols, graph.tensors[t].shape[3]
        self.width = hw(graph, t)[1]
        self.top = _shares(rows) if cached else [0] * len(rows)
        self.left = _shares(cols) if cached else [0] * len(cols)
        self.col_w = max(self.left)
        self.row_cache = max(self.top) * self.width * self.c
        self.col_cache = max(b - a for a, b in rows) * self.col_w * self.c

    def box(self, i: int, j: int):
        return (*self.rows[i], *self.cols[j])

    def new(self, i: int, j: int):
        """The part of tile (i, j)'s box it computes itself."""
        (r0, r1), (c0, c1) = self.rows[i], self.cols[j]
        return (r0 + self.top[i], r1, c0 + self.left[j], c1)


def stream2d_program(graph: Graph, region: list[Op], tin: int, tout: int, grid,
                      in_place: bool = True, apart: frozenset[int] = frozenset()) -> tuple[list[int], int]:
    """The steps of a `grid` of tiles in raster order where no layer computes an element twice: of
    each layer's output a tile computes only the part below the rows the tile above computed and
    right of the columns the tile to the left computed; the rest of its box comes from the
    layer's row and column caches (PASTE), assembled into the box a reader reads. After a
    tensor's last reader the tile saves into the caches what the next tiles share: its right
    columns (all its rows: the top ones out of the row cache, which is why this comes first) and
    its bottom rows (its new columns). Returns (program words, scratch bytes: the largest tile's
    buffers, then every cache). `in_place`: a layer's output may be written over its dying input
    (a ring of rows: less memory, a kernel call per row where input is still to be read), except layers `apart` (by position)."""
    (oh, ow), name = hw(graph, tout), graph.tensors[tout].name
    rows, cols = splits(oh, grid[0]), even_splits(ow, grid[1])  # (kernels compute pixel pairs)
    by_row = [region_needs(graph, region, tout, (h0, h1, 0, ow)) for h0, h1 in rows]
    by_col = [region_needs(graph, region, tout, (0, oh, w0, w1)) for w0, w1 in cols]
    if any(need is None for need in by_row + by_col):
        raise UsageError(f"patch stage: a tile of '{name}' reads nothing of one of the region's tensors (grid too fine)")
    halos = {t: _Halo(graph, t, [n[t][:2] for n in by_row], [n[t][2:] for n in by_col], t not in (tin, tout))
             for t in by_row[0]}
    tiles = [_tile2d(graph, region, tin, tout, halos, i, j, in_place, apart) for i in range(grid[0]) for j in range(grid[1])]
    cache, at = {}, aligned(max(size for _, size in tiles))
    for t, h in halos.items():
        for kind, size in (("row", h.row_cache), ("col", h.col_cache)):
            if size:
                cache[(kind, t)], at = at, at + aligned(size)
    words = []
    for (steps, offsets), _size in tiles:
        for step in steps:
            words += [cache[w] if isinstance(w, tuple) and isinstance(w[0], str) else
                      offsets[w[0]] + w[1] if isinstance(w, tuple) else w for w in step]
    return words, at


class _Tile2d:
    """One tile's steps being written (symbolic operands: (buffer, byte offset) or (cache kind,
    tensor)) and its buffers (`TileBuffers`, nothing written over)."""

    def __init__(self, graph: Graph, halos: dict, tin: int, i: int, j: int, readers: dict[int, int], in_place: bool,
                 apart: frozenset[int] = frozenset()):
        self.graph, self.halos, self.tin, self.i, self.j, self.readers = graph, halos, tin, i, j, readers
        self.apart = apart  # layers never written over their input
        self.in_place = in_place  # None: every output that may, over its dying input; a number: those larger
        self.footprints: list[int] = []  # per convolution, its input and output bytes (one frame if over)
        self.bufs, self.steps, self.computed = TileBuffers(), [], {}  # tensor -> its new part's buffer
        self.widened: dict[int, tuple] = {}  # tensor -> (buffer, width, row, column) its new part moved to

    def buffer(self, t: int, box) -> int:
        return self.bufs.new((box[1] - box[0]) * (box[3] - box[2]) * self.halos[t].c, len(self.steps))

    def use(self, b: int) -> int:
        return self.bufs.use(b, len(self.steps))

    def add(self, step: list) -> None:
        """Append a step, its buffers live through it."""
        for w in step:
            if isinstance(w, tuple) and not isinstance(w[0], str):
                self.use(w[0])
        self.steps.append(step)

    def paste(self, src, src_w: int, c: int, y0: int, x0: int, h: int, w: int, dst, dst_w: int, dy: int, dx: int):
        if h > 0 and w > 0:
            self.add([PASTE, src, src_w, c, y0, x0, h, w, dst, dst_w, dy, dx])

    def read(self, t: int, box, contiguous: bool):
        """(operand, buffer height, buffer width, row, column of `box` in it): where a layer reads
        `box` of `t`. Inside the tile's new part it reads that buffer (a convolution only whole
        rows of it: its input is contiguous); else the box is assembled from the column cache
        (left), the row cache (top) and the new part."""
        h = self.halos[t]
        ra, rb, ca, cb = box
        if t == self.tin:
            b = self.buffer(t, box)
            self.add([COPY_IN, (b, 0), ra, ca, rb - ra, cb - ca])
            return (b, 0), rb - ra, cb - ca, 0, 0
        n0, n1, m0, m1 = h.new(self.i, self.j)
        if n0 <= ra and rb <= n1 and m0 <= ca and cb <= m1 and (not contiguous or (ca, cb) == (m0, m1)):
            b = self.computed[t]
            if contiguous:
                return (b, (ra - n0) * (m1 - m0) * h.c), rb - ra, cb - ca, 0, 0
            return (b, 0), n1 - n0, m1 - m0, ra - n0, ca - m0
        r0, c0, w = h.rows[self.i][0], h.cols[self.j][0], cb - ca
        at = ((n0 - ra) * w + m0 - ca) * h.c
        if self.readers.get(t) == 1 and n0 < n1 and m0 < m1 and ra <= n0 and n1 <= rb and ca <= m0 and m1 <= cb \
                and at % ALIGN == 0:
            # its only reader's box holds the new part: the box is written over it (the new part
            # stays aligned), its rows moved apart to the box's width in place (last to first),
            # then the strips around them
            src = self.use(self.computed[t])
            b = self.bufs.over(src, at, (rb - ra) * w * h.c, 0, len(self.steps))
            self.paste((src, 0), m1 - m0, h.c, 0, 0, n1 - n0, m1 - m0, (b, 0), w, n0 - ra, m0 - ca)
            self.widened[t] = (b, w, n0 - ra, m0 - ca)
        else:
            b = self.buffer(t, box)
        self.paste(("col", t), h.col_w, h.c, ra - r0, ca - c0, rb - ra, min(cb, m0) - ca, (b, 0), w, 0, 0)
        self.paste(("row", t), h.width, h.c, ra - r0, max(ca, m0), min(rb, n0) - ra, cb - max(ca, m0), (b, 0), w, 0,
                   max(ca, m0) - ca)
        if n0 < n1 and m0 < m1 and t not in self.widened:
            self.paste((self.computed[t], 0), m1 - m0, h.c, max(ra, n0) - n0, max(ca, m0) - m0, rb - max(ra, n0),
                       cb - max(ca, m0), (b, 0), w, max(ra, n0) - ra, max(ca, m0) - ca)
        return (b, 0), rb - ra, w, 0, 0

    def layer(self, op: Op, k: int, saves: list[int]) -> None:
        """Layer k's step on its output's new part (none when the tiles before computed all of it),
        after its inputs are read and the caches of those it reads last (`saves`) are saved: a
        tensor's new part then dies with the layer, and an input assembled for it may be
        written over by its output (as `_tile` does: a ring of rows)."""
        y = op.outputs[0]
        new = self.halos[y].new(self.i, self.j)
        h, w = new[1] - new[0], new[3] - new[2]
        if h <= 0 or w <= 0:
            for t in saves:
                self.save(t)
            return
        if op.opcode == "ADD":
            (a, ah, aw, ay, ax), (b, bh, bw, by, bx) = (self.read(t, new, False) for t in op.inputs)
            for t in saves:
                self.save(t)
            out = self.computed[y] = self.buffer(y, new)
            self.add([ADD, k, a, ah, aw, ay, ax, b, bh, bw, by, bx, (out, 0), h, w])
            return
        x = op.inputs[0]
        virtual = reads(self.graph, op, new)
        real = clip(virtual, hw(self.graph, x))
        src = self.read(x, real, True)[0]
        for t in saves:
            self.save(t)
        step, c_x, c_y = len(self.steps), self.halos[x].c, self.halos[y].c
        extent, rows = overlap_extent(real, new, c_x, c_y, real[0] - virtual[0], window(self.graph, op)[0])
        x_bytes, y_bytes = aligned((real[1] - real[0]) * (real[3] - real[2]) * c_x), aligned(h * w * c_y)
        dies = self.in_place is not False and src[1] == 0 and (src[0] != self.computed.get(x) or x in saves)
        over = dies and k not in self.apart and kernels.is_harness(op) and extent + aligned(rows * w * c_y) < x_bytes + y_bytes \
            and (self.in_place is True or x_bytes + y_bytes > self.in_place)
        self.footprints.append(extent + aligned(rows * w * c_y) if over else x_bytes + y_bytes)
        if over:
            self.use(src[0])
            out, ring = self.bufs.over(src[0], 0, y_bytes, 0, step), (self.bufs.new(rows * w * c_y, step), 0)
        else:
            out, ring, rows = self.buffer(y, new), 0, 0
        self.computed[y] = out
        self.add([CONV, k, src, real[1] - real[0], real[3] - real[2], real[0] - virtual[0], real[2] - virtual[2],
                  (out, 0), h, w, ring, rows])

    def save(self, t: int) -> None:
        """Into t's caches what the next tiles share with this one: the columns the tile to the
        right shares (every row of the box: those left of the new part moved within the column
        cache, the top ones out of the row cache, which is why this comes first, the rest out of
        the new part), then the rows the tile below shares (at the new part's columns: those
        above it moved up within the row cache, the rest out of the new part). A move goes to a
        lower index of its own cache (PASTE moves rows in increasing order)."""
        h, i, j = self.halos[t], self.i, self.j
        (r0, r1), c0 = h.rows[i], h.cols[j][0]
        n0, n1, m0, m1 = h.new(i, j)
        # the new part: its own buffer, or where it was moved to (`read`)
        new, new_w, y, x = self.widened.get(t, (self.computed.get(t, -1), m1 - m0, 0, 0))
        new = (new, 0)
        if j + 1 < len(h.cols) and h.left[j + 1]:
            c, w = h.cols[j + 1][0], h.left[j + 1]
            self.paste(("col", t), h.col_w, h.c, 0, c - c0, r1 - r0, min(c + w, m0) - c, ("col", t), h.col_w, 0, 0)
            cc = max(c, m0)
            self.paste(("row", t), h.width, h.c, 0, cc, n0 - r0, c + w - cc, ("col", t), h.col_w, 0, cc - c)
            self.paste(new, new_w, h.c, y, x + cc - m0, n1 - n0, c + w - cc, ("col", t), h.col_w, n0 - r0, cc - c)
        if i + 1 < len(h.rows) and h.top[i + 1]:
            r, k = h.rows[i + 1][0], h.top[i + 1]
            self.paste(("row", t), h.width, h.c, r - r0, m0, min(r + k, n0) - r, m1 - m0, ("row", t), h.width, 0, m0)
            rr = max(r, n0)
            self.paste(new, new_w, h.c, y + rr - n0, x, r + k - rr, m1 - m0, ("row", t), h.width, rr - r, m0)


def _tile2d(graph: Graph, region: list[Op], tin: int, tout: int, halos: dict, i: int, j: int, in_place: bool,
            apart: frozenset[int] = frozenset()):
    """((steps, buffer offsets), scratch bytes) of tile (i, j) of a 2-D streamed stage: each layer
    on its output's new part, each tensor's caches saved once its last reader has read it. In
    place, only the layers whose input and output together exceed the largest footprint the tile
    has with every output that may lying over its input: a ring costs kernel calls (a call per row
    where input is still to be read), and elsewhere it would not lower the tile's bytes."""
    if in_place:
        floor = max(_tile2d_pass(graph, region, tin, tout, halos, i, j, True, apart).footprints, default=0)
        tile = _tile2d_pass(graph, region, tin, tout, halos, i, j, floor, apart)
    else:
        tile = _tile2d_pass(graph, region, tin, tout, halos, i, j, False)
    offsets, size = tile.bufs.offsets()
    return (tile.steps, offsets), size


def _tile2d_pass(graph: Graph, region: list[Op], tin: int, tout: int, halos: dict, i: int, j: int, in_place,
                 apart: frozenset[int] = frozenset()):
    last, readers = {}, {}
    for k, op in enumerate(region):
        last[op.outputs[0]] = k
        for t in op.inputs:  # (a layer reading a tensor twice counts twice: its box is not moved then)
            if t in halos:
                last[t], readers[t] = k, readers.get(t, 0) + 1
    tile = _Tile2d(graph, halos, tin, i, j, readers, in_place, apart)
    for k, op in enumerate(region):
        tile.layer(op, k, [t for t in halos if last.get(t) == k and t not in (tin, tout, op.outputs[0])])
        y = op.outputs[0]
        if last[y] == k and y != tout:  # (read by no layer of the region)
            tile.save(y)
    box = halos[tout].box(i, j)
    tile.add([COPY_OUT, (tile.computed[tout], 0), box[0], box[2], box[1] - box[0], box[3] - box[2]])
    return tile

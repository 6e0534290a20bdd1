"""Cheap estimates of a patch variant, from the tile geometry alone (no graph is built).

Building and measuring a patched graph costs 10-500 ms; a model has thousands of (region, grid)
candidates. The selection estimates them all (about 0.3 ms each: what a region's grids share is
computed once, `RegionGeometry`) and builds only the variants it picks (pool.py: lazy
evaluation), so the estimates steer the search but never decide it: every variant in a final
selection is built and measured. Every figure is a floor of the built variant's (tested), and the
tighter, the fewer builds.

- work: the MACs of every region op over the boxes each tile needs (halo recompute included),
  and its predicted time: by copies, each op's time scaled by the area its tiles compute (the
  added slices, pads and joins are left out); a stage, by the stage's own cost formula
  (`StagePricing`: cost.mcu.stage_instructions without the slices between layers and the rings);
- peak, by copies: a lower bound on the live bytes of the patch-by-patch order the rewrite emits,
  tile by tile: the region's input (live until the last tile is cut from it), the output tiles
  done so far, and the largest op footprint (input and output boxes, and the scratch the kernel
  asks for, which depends on channels and filter only, so every tile's copy asks what the op
  asks) of the current tile; and the final assembly (all tiles and the output). Explicit pads and
  row joins only add to it.
- peak, a patch stage (one op): its input and output, next to its scratch: the largest of its
  tiles' live buffers at a layer (a convolution reading a tensor for the last time counts the
  larger of its input and output boxes: the stage may write one over the other; tensors held
  across the layer count too) and its layers' largest kernel buffer. Streamed stripes write
  nothing over and keep every layer's stream buffer throughout (rewrite.patch_stage).
"""

from __future__ import annotations

import numpy as np

from tpu_pipeline.toolchain.cost.mcu import coefficients, fitted_table, op_features
from tpu_pipeline.toolchain.ir import Graph, macs
from tpu_pipeline.toolchain.ir.geometry import AxisNeeds, even_splits, hw, splits


def _aligned(graph: Graph, t: int) -> int:
    return -(-graph.tensors[t].nbytes // 16) * 16


class RegionGeometry:
    """What every grid of one region shares, computed once (a region has up to a few hundred
    grids, and most are estimated): its ops' tensors, bytes per pixel, rates, scratch and the
    needed runs of every tensor along each axis (geometry.AxisNeeds)."""

    def __init__(self, graph: Graph, tin: int, tout: int, positions: list[int], op_seconds: dict[int, float],
                 scratch: dict[int, int] | None, pricing: StagePricing | None = None, axes=None):
        region = [graph.ops[i] for i in positions]
        self.shape = hw(graph, tout)
        self.ppx: dict[int, int] = {}
        for i in positions:
            for t in graph.ops[i].inputs + graph.ops[i].outputs:
                if graph.is_activation(t) and t not in self.ppx:
                    x = graph.tensors[t]
                    self.ppx[t] = x.nbytes // max(1, x.shape[1] * x.shape[2])
        self.steps = [(graph.ops[i].outputs[0], tuple(x for x in dict.fromkeys(graph.ops[i].inputs) if x in self.ppx),
                       i) for i in positions]
        self.rate = {}
        for i in positions:
            y = graph.ops[i].outputs[0]
            area = max(1, graph.tensors[y].shape[1] * graph.tensors[y].shape[2])
            self.rate[i] = ((macs(graph, i) or 0) / area, op_seconds.get(i, 0.0) / area)
        # (`axes`: the same region's AxisNeeds pair, which its other form computed: they depend
        # on the ops and the output only)
        self.axes = axes or (AxisNeeds(graph, region, tout, 0), AxisNeeds(graph, region, tout, 1))
        self.full_in = 0 if tin in graph.external else _aligned(graph, tin)  # an input outside the arena: nothing
        self.full_out = _aligned(graph, tout)
        self.tout = tout
        self.scratch = scratch or {}
        # a stage asks for its tiles' buffers and then the largest buffer a layer's kernel asks for
        # (memory.scratch): its layers' footprints leave the kernels' buffers out, added once
        self.kernel_scratch = max(self.scratch.values(), default=0)
        self.last_read = {x: i for y, xs, i in self.steps for x in xs}
        self.not_add = {i for i in positions if graph.ops[i].opcode != "ADD"}
        self.tin, self.channels = tin, {t: graph.tensors[t].shape[3] for t in self.ppx}
        self.width = {t: graph.tensors[t].shape[2] for t in self.ppx}
        # a stage's tile holds every tensor between the layer that writes it and the last that
        # reads it (a residual branch across its block): per layer, the others live across it
        first = {tin: -1, **{y: k for k, (y, _, _) in enumerate(self.steps)}}
        last = {tout: len(self.steps)}
        for k, (_, xs, _) in enumerate(self.steps):
            for x in xs:
                last[x] = max(last.get(x, k), k)
        self.across = [tuple(t for t in first if first[t] < k < last.get(t, -1) and t != y and t not in xs)
                       for k, (y, xs, _) in enumerate(self.steps)]
        self.pricing = pricing
        # (pricing, kernel scratch) of the region as a stage on row stripes runs it, where its
        # kernels differ (rewrite.patch_stage STRIPES_ONLY; fit.variants sets it)
        self.stripes: tuple | None = None
        self.copy_tail: tuple[int, int] | None = None  # patches by copies: (tail per tile, shared), fit.variants
        self.memo: dict = {}  # (grid, stage, streamed) -> estimate_patches' answer (a recomputing stage asks its
        # streamed twin's, which is a candidate of its own)
        self._stack(graph, tout)

    def _stack(self, graph: Graph, tout: int) -> None:
        """The same as arrays, so a grid's estimate is a few array operations: every tensor's
        needed runs by tile start and end per axis, every op's input runs (a grid too fine
        leaves one empty), and per layer which tensors its footprint holds (as copies and as a
        stage) and which pair a stage may write one over the other."""
        self.tensors = list(self.ppx)
        at = {t: j for j, t in enumerate(self.tensors)}
        self.lo = [np.stack([ax.lo[t] for t in self.tensors]) for ax in self.axes]
        self.hi = [np.stack([ax.hi[t] for t in self.tensors]) for ax in self.axes]
        self.read_lo = [np.stack([a for a, _ in ax.reads]) for ax in self.axes]
        self.read_hi = [np.stack([b for _, b in ax.reads]) for ax in self.axes]
        self.bpp = np.array([self.ppx[t] for t in self.tensors], dtype=np.float64)
        n, m = len(self.steps), len(self.tensors)
        self.holds, self.holds_stage = np.zeros((n, m)), np.zeros((n, m))
        over = []  # (layer, its input, its output): the output may lie over the dying input
        for k, (y, xs, i) in enumerate(self.steps):
            for t in (*xs, y):
                self.holds[k, at[t]] = self.holds_stage[k, at[t]] = 1
            for t in self.across[k]:
                self.holds_stage[k, at[t]] = 1
            if len(xs) == 1 and i in self.not_add and self.last_read[xs[0]] == i and xs[0] != tout:
                over.append((k, at[xs[0]], at[y]))
        self.over = tuple(np.array(c, dtype=np.int64) for c in zip(*over)) if over else None
        # a 2-D streamed stage's tile at a layer: the new part of its output and of the tensors
        # held across it (the region's input is copied in for each reader, not held)
        self.holds_new = np.zeros((n, m))
        for k, (y, _, _) in enumerate(self.steps):
            for t in (y, *self.across[k]):
                if t != self.tin:
                    self.holds_new[k, at[t]] = 1
        self.io = np.array([t in (self.tin, self.tout) for t in self.tensors])
        self.j_in, self.j_out = at.get(self.tin), at[tout]
        self.ch = np.array([self.channels[t] for t in self.tensors], dtype=np.int64)
        self.wd = np.array([self.width[t] for t in self.tensors], dtype=np.int64)
        self.scratch_by_step = np.array([self.scratch.get(i, 0) for _, _, i in self.steps], dtype=np.float64)
        self.y_at = np.array([at[y] for y, _, _ in self.steps], dtype=np.int64)
        self.rates = np.array([self.rate[i] for _, _, i in self.steps], dtype=np.float64).reshape(-1, 2)

    def needed(self, axis: int, runs) -> np.ndarray | None:
        """[tensors x runs] lengths of the needed runs of every tensor for tiles `runs` along
        `axis` (as region_needs); None when a tile reads nothing of some tensor."""
        s = np.fromiter((a for a, _ in runs), np.int64, len(runs))
        e = np.fromiter((b for _, b in runs), np.int64, len(runs))
        if (self.read_lo[axis][:, s] >= self.read_hi[axis][:, e]).any():
            return None
        return (self.hi[axis][:, e] - self.lo[axis][:, s]).astype(np.float64)


class StagePricing:
    """What a patch stage's predicted instructions (cost.mcu.stage_instructions) are at least, from
    the tile geometry: its layers at their classes' rates on the rows and columns each tile
    computes (with their kernels' set-up per call: `per_channel`), a cost per call, per output
    row of a call and per element its tiles copy in and out. Left out (a floor): the slices
    between layers and overlapped calls' rings."""

    def __init__(self, layer: dict[int, tuple], table: dict, seconds_per_instruction: float):
        # op -> (kernel overhead, instructions per output pixel, per call) of each kernel the
        # builder may run it on (stage_pricing: rewrite.patch_stage runs a layer apart from its
        # input on the stripes' kernel where that costs no scratch, and a dw3 layer whose tile
        # overflows its buffer on its twin): a layer costs at least the cheapest of them
        self.layer = layer
        c = table["patch_stage"]
        self.per_call, self.per_row, self.per_copied = c["per_call"], c["per_row"], c["per_copied"]
        self.per_pasted = c.get("per_pasted", coefficients(table, "data_movement")["per_output"])
        self.per_paste_row = c.get("per_paste_row", 0.0)
        self.seconds = seconds_per_instruction

    @staticmethod
    def rate(body: Graph, i: int, table: dict) -> tuple[float, float, float]:
        """(kernel overhead, instructions per output pixel, set-up per call) of layer i of `body`."""
        f = op_features(body, i)
        c = coefficients(table, f.fit_class)
        y = body.tensors[body.ops[i].outputs[0]].shape
        per_pixel = (c["per_unit"] * f.work + c.get("per_output", 0.0) * f.outputs) / max(1, y[1] * y[2])
        return c.get("overhead", 0.0), per_pixel, c.get("per_channel", 0.0) * f.channels

    def _layer(self, i: int, pixels: float, calls: float) -> float:
        """Instructions at least of layer i computing `pixels` of its output in `calls` calls."""
        return min(o + r * pixels + c * calls for o, r, c in self.layer[i])

    def seconds_of(self, geo: "RegionGeometry", hsum: list[float], wsum: list[float], cols: int, tiles: int
                   ) -> float:
        """Seconds at least of a stage whose every tile computes its whole box: `hsum`, `wsum`
        per tensor of geo.tensors, the rows (columns) its tiles need summed over the rows
        (columns) of tiles; `cols` columns of tiles, `tiles` tiles."""
        instr = calls = rows = 0.0
        at = {t: j for j, t in enumerate(geo.tensors)}
        for y, _, i in geo.steps:
            h, w = hsum[at[y]], wsum[at[y]]
            n_rows, calls = h * cols, calls + tiles
            instr += self._layer(i, h * w, tiles)
            rows += n_rows
        j = at[geo.tin]
        return self._total(geo, instr, calls, rows, hsum[j] * wsum[j] * geo.channels[geo.tin], 0.0, (0.0, 0.0))

    def streamed_seconds(self, geo: "RegionGeometry", new_rows, rows_on, new_cols, cols_on, streamed: float = 0.0,
                         copied_in: float = 0.0, pasted: tuple[float, float] = (0.0, 0.0)) -> float:
        """Seconds at least of a streamed stage (each element once): per layer of geo.steps the
        output rows it computes summed over the rows of tiles (`new_rows`) and how many rows of
        tiles compute any (`rows_on`), the same for columns; `streamed` elements copied into and
        out of its stream buffers, `copied_in` of the region's input, `pasted` elements and rows a
        2-D streamed stage pastes."""
        instr = calls = rows = 0.0
        for k, (_, _, i) in enumerate(geo.steps):
            n_rows = new_rows[k] * cols_on[k]
            calls += rows_on[k] * cols_on[k]
            instr += self._layer(i, new_rows[k] * new_cols[k], rows_on[k] * cols_on[k])
            rows += n_rows
        return self._total(geo, instr, calls, rows, copied_in, streamed, pasted)

    def _total(self, geo: "RegionGeometry", instr, calls, rows, copied_in, streamed, pasted) -> float:
        copied = copied_in + geo.shape[0] * geo.shape[1] * geo.channels[geo.tout] + streamed
        pastes = self.per_pasted * pasted[0] + self.per_paste_row * pasted[1]
        return (instr + self.per_call * calls + self.per_row * rows + self.per_copied * copied
                + pastes) * self.seconds


def pricing_table(device, kernel_set) -> tuple[dict, float] | None:
    """(the fitted cost table, seconds per instruction) a patch stage is priced with on `device`
    with `kernel_set` (None without a fitted [K.patch_stage] table: the estimate then scales the
    ops' own predicted times)."""
    cpi = getattr(getattr(device, "compute", None), "cycles_per_instruction", None)
    table = fitted_table().get(kernel_set.cost_key) if cpi is not None else None
    if table is None or "patch_stage" not in table:
        return None
    return table, float(cpi) / device.compute.clock_hz


def _streamed(geo: RegionGeometry, rlo, rhi, hm, wm) -> tuple[int, int, float]:
    """(peak, MACs, seconds) at least of a stage on row stripes run streamed (rewrite.patch_stage
    `_stream_program`): each layer's rows computed once; the stripe's buffers are not written over
    one another, so a layer's footprint is its input and output boxes (and the kernel's scratch);
    every layer's stream buffer (the rows two consecutive stripes share) lives throughout. `rlo`,
    `rhi`: [tensors x stripes] the needed row runs, `hm`, `wm` their lengths (rows, columns: one
    column of tiles); the sums over tensors are of integers (exact in any order)."""
    pricing, kernel_scratch = geo.stripes or (geo.pricing, geo.kernel_scratch)
    w0 = wm[:, 0]
    boxes = (geo.bpp * w0)[:, None] * hm  # [tensor, stripe]
    footprint = float((geo.holds_stage @ boxes).max(initial=0.0)) + kernel_scratch
    mid = ~(np.arange(len(geo.tensors)) == geo.j_out)  # (every tensor but the region's output)
    held = geo.y_at[mid[geo.y_at]]  # the layers' outputs but the region's output
    shared_rows = np.maximum((rhi[:, :-1] - rlo[:, 1:]).max(axis=1, initial=0), 0)
    buffers = float((geo.bpp[held] * w0[held] * shared_rows[held]).sum())
    # op -> output rows each stripe computes: those below the rows the stripe above computed
    above = np.concatenate((rlo[:, :1], rhi[:, :-1]), axis=1)
    above[geo.j_out] = rlo[geo.j_out]
    new = np.maximum(rhi - np.maximum(rlo, above), 0)
    new_sum, new_on = new.sum(axis=1).astype(np.float64).tolist(), (new > 0).sum(axis=1).tolist()
    ys, w_list = geo.y_at.tolist(), w0.tolist()
    work = sum(geo.rate[i][0] * new_sum[j] * w_list[j] for j, (_, _, i) in zip(ys, geo.steps))
    # the rows a stripe shares with the one above come out of the stream buffer, and those the
    # one below shares go into it: a copy each
    shared = np.maximum(np.minimum(rhi[:, :-1], rhi[:, 1:]) - rlo[:, 1:], 0).sum(axis=1)
    into = np.maximum(rhi[:, :-1] - rlo[:, 1:], 0).sum(axis=1)
    cached = float(((shared + into)[held] * w0[held] * geo.ch[held]).sum())
    if pricing is not None:
        j = geo.j_in
        seconds = pricing.streamed_seconds(
            geo, [new_sum[k] for k in ys], [new_on[k] for k in ys], [w_list[k] for k in ys],
            [int(w_list[k] > 0) for k in ys], cached, hm[j].sum() * wm[j].sum() * geo.channels[geo.tin])
    else:  # each op's own time on the rows it computes
        seconds = sum(geo.rate[i][1] * new_sum[j] * w_list[j] for j, (_, _, i) in zip(ys, geo.steps))
    return geo.full_in + geo.full_out + int(footprint + buffers), int(work), seconds


def _shared(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per tile along an axis (the last), the leading rows (columns) of a tensor's run the tiles
    before it computed (rewrite.patch_stage `_shares`); `lo`, `hi`: [tensors x tiles] or [tiles]."""
    shared = np.zeros(lo.shape, dtype=np.int64)
    shared[..., 1:] = np.maximum(np.minimum(hi[..., 1:], hi[..., :-1]) - lo[..., 1:], 0)
    return shared


def _streamed2d(geo: RegionGeometry, rlo, rhi, clo, chi) -> tuple[int, int, float]:
    """(peak, MACs, seconds) at least of a stage on a square grid run streamed (rewrite.patch_stage
    `_stream2d_program`): each layer computes the part of its tile's box the tiles above and to
    the left did not (every element once); its tile's footprint at a layer is at least that new
    part of its output and of every tensor held across the layer; every tensor but the region's
    input and output keeps a row cache (its shared rows, full width) and a column cache (its
    shared columns, a tile row's rows) throughout; the caches are filled by copies. `rlo`, `rhi`
    ([tensors x rows of tiles]) and `clo`, `chi` (x columns): every tensor's needed runs (all
    sums below are of integers: exact in any order)."""
    top_in, left_in = _shared(rlo, rhi), _shared(clo, chi)
    top, left = np.where(geo.io[:, None], 0, top_in), np.where(geo.io[:, None], 0, left_in)
    tall = rhi - rlo
    new_r, new_c = np.maximum(tall - top, 0), np.maximum(chi - clo - left, 0)
    mid = ~geo.io  # the tensors that keep caches
    caches = float((geo.ch * (top.max(axis=1) * geo.wd + tall.max(axis=1) * left.max(axis=1)))[mid].sum())
    # saved: the next row of tiles' shared rows at each tile's new columns, the next column's
    # shared columns at every row of the tile's box
    r_sum, c_sum, tall_sum = new_r.sum(axis=1), new_c.sum(axis=1), tall.sum(axis=1)
    saved = float((geo.ch * (top[:, 1:].sum(axis=1) * c_sum + left[:, 1:].sum(axis=1) * tall_sum))[mid].sum())
    saved_rows = float((top[:, 1:].sum(axis=1) * (new_c > 0).sum(axis=1)
                        + (left[:, 1:] > 0).sum(axis=1) * tall_sum)[mid].sum())
    boxes = geo.bpp[:, None, None] * new_r[:, :, None] * new_c[:, None, :]  # [tensor, row, column]
    footprint = float(np.tensordot(geo.holds_new, boxes, axes=1).max())
    rs, cs = r_sum.astype(np.float64).tolist(), c_sum.astype(np.float64).tolist()
    ys = geo.y_at.tolist()
    work = sum(geo.rate[i][0] * rs[j] * cs[j] for j, (_, _, i) in zip(ys, geo.steps))
    if geo.pricing is not None:
        # the input's needed elements, each copied in once at least (its runs' union)
        j = geo.j_in
        copied_in = float((rhi[j] - rlo[j] - top_in[j]).clip(0).sum() * (chi[j] - clo[j] - left_in[j]).clip(0).sum()) \
            * geo.channels[geo.tin]
        r_on, c_on = (new_r > 0).sum(axis=1).tolist(), (new_c > 0).sum(axis=1).tolist()
        seconds = geo.pricing.streamed_seconds(geo, [rs[j] for j in ys], [r_on[j] for j in ys], [cs[j] for j in ys],
                                               [c_on[j] for j in ys], 0.0, copied_in, (saved, saved_rows))
    else:
        seconds = sum(geo.rate[i][1] * rs[j] * cs[j] for j, (_, _, i) in zip(ys, geo.steps))
    peak = geo.full_in + geo.full_out + footprint + geo.kernel_scratch + caches
    return int(peak), int(work), float(seconds)


def estimate_patches(graph: Graph, tin: int, tout: int, positions: list[int], grid,
                     op_seconds: dict[int, float], scratch: dict[int, int] | None = None,
                     stage: bool = False, geometry: RegionGeometry | None = None,
                     streamed: bool = True) -> tuple[int, int, float] | None:
    """(peak bytes, MACs, seconds) of running ops `positions` (tin -> tout) on a `grid` of tiles:
    the peak a lower bound as above; MACs exact; seconds each op's predicted time (`op_seconds`,
    the device model on the whole graph) scaled by the area its tiles compute. `scratch`: bytes of
    scratch each op asks for (tpu_pipeline.toolchain.memory.scratch, aligned). `stage`: the tiles run inside one
    op (tpu_pipeline.toolchain.ir.stage), whose peak is at least the region's input and output and the largest
    op's buffers on a tile; `streamed`: a stage computes every element once (row stripes or, on
    other grids, 2-D halo caches; else it recomputes its halos). `geometry`: the region's
    RegionGeometry, if the caller keeps it. None
    when a tile would read nothing of some tensor (the grid is too fine for the region): that
    candidate does not exist."""
    geo = geometry or RegionGeometry(graph, tin, tout, positions, op_seconds, scratch)
    key = (tuple(grid), stage, streamed)
    if key not in geo.memo:
        geo.memo[key] = _estimate(geo, grid, stage, streamed)
    return geo.memo[key]


def _estimate(geo: RegionGeometry, grid, stage: bool, streamed: bool) -> tuple[int, int, float] | None:
    """estimate_patches on the region's geometry."""
    (oh, ow), tout = geo.shape, geo.tout
    rows, cols = splits(oh, grid[0]), splits(ow, grid[1])
    if stage and streamed and grid[1] > 1:  # (a 2-D streamed stage's columns: stage_stream2d.py)
        cols = even_splits(ow, grid[1])
    # Every op maps rows and columns independently, so the box a tile needs of a tensor is the
    # rows its row of tiles needs by the columns its column needs.
    hm, wm = geo.needed(0, rows), geo.needed(1, cols)
    if hm is None or wm is None:
        return None
    full_in, full_out = geo.full_in, geo.full_out
    if stage and streamed:
        rlo, rhi = geo.lo[0][:, [a for a, _ in rows]], geo.hi[0][:, [b for _, b in rows]]
        if grid[1] == 1:  # streamed stripes (rewrite.patch_stage): stream buffers
            return _streamed(geo, rlo, rhi, hm, wm)
        # streamed tiles: halo caches
        return _streamed2d(geo, rlo, rhi, geo.lo[1][:, [a for a, _ in cols]], geo.hi[1][:, [b for _, b in cols]])
    # An op's footprint on tile (r, c) is the sum over the tensors it holds of bytes/pixel x
    # rows(r) x cols(c), left unrounded (rounding up to 16 B only adds: the peak stays a lower bound).
    boxes = geo.bpp[:, None, None] * hm[:, :, None] * wm[:, None, :]  # [tensor, row, column]
    per_layer = np.tensordot(geo.holds_stage if stage else geo.holds, boxes, axes=1)  # [layer, row, column]
    if stage and geo.over is not None:  # the output over the dying input: the larger of the two
        k, x, y = geo.over
        per_layer[k] -= np.minimum(boxes[x], boxes[y])
    if not stage:
        per_layer += geo.scratch_by_step[:, None, None]
    footprint = per_layer.max(axis=0)
    area = hm[geo.y_at].sum(axis=1) * wm[geo.y_at].sum(axis=1)
    work, seconds = (geo.rates * area[:, None]).sum(axis=0)
    if stage:
        if geo.pricing is not None:
            seconds = geo.pricing.seconds_of(geo, hm.sum(axis=1).tolist(), wm.sum(axis=1).tolist(), len(cols),
                                             len(rows) * len(cols))
        return full_in + full_out + int(footprint.max()) + geo.kernel_scratch, int(work), float(seconds)
    tiles = (hm[geo.tensors.index(tout)][:, None] * wm[geo.tensors.index(tout)][None, :]).ravel() * geo.ppx[tout]
    done = np.concatenate(([0.0], np.cumsum(tiles)[:-1]))  # output tiles finished before each tile
    live_input = np.full(tiles.size, float(full_in))
    live_input[-1] = 0.0  # dead once the last tile is cut from it
    peak = max(2 * full_out, int((live_input + done + footprint.ravel()).max()))
    return peak, int(work), float(seconds)

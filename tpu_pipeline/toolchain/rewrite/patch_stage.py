"""Build a patch stage (tpu_pipeline.toolchain.ir.stage): a patch region run tile by tile inside one harness op.

For each tile of the output (the same grid and tile boxes as patch execution by copies,
rewrite/patch.py), the region is walked backwards for the box of every tensor the tile needs
(`geometry.region_needs`); then, forwards, the tile's program: copy the region input's box into
the scratch buffer, run each layer on its boxes (a convolution whose input buffer holds more than
its window reads gets a copy of just that: SLICE), and copy the finished tile into the output.
A buffer read for the last time is written over, as TinyEngine's in-place kernels do: a slice of
it lands on its own first bytes, and a convolution's output starts on its first byte (a
depthwise in place, an expansion's rows last to first) where that lowers the tile's bytes, the
kernel computing rows into a small ring (overlap.ring_rows_for; the step carries the ring).
Buffers written over each other share their start, so a chain of them stays as wide as its
largest buffer.
Each tile's buffers are planned by the arena planner; the stage's scratch is the largest plan.

Exact for the same reasons as patches by copies: every output element is computed from the same
inputs and weights with the same integer arithmetic, and an image border is the kernels' own
padding (the layer's leading padding on the tile, the trailing padding implicit at the box's
end). The stage runs harness convolutions (their requantization in flash) and int8 ADDs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.ir import Graph, Op, kernel_variants, kernels, overlap, requant
from tpu_pipeline.toolchain.ir.geometry import Box, clip, hw, leading_pads, reads, region_needs, splits, window
from tpu_pipeline.toolchain.ir.options import AddOptions
from tpu_pipeline.toolchain.ir.stage import (ADD, CONV, COPY_IN, COPY_OUT, KINDS, LAYER_WORDS, OPCODE, PASTE, SLICE,
                                             PatchStage, ACTIVATION_CODE, PADDING_CODE)
from tpu_pipeline.toolchain.memory.lifetimes import Buffer
from tpu_pipeline.toolchain.memory.planners import plan_buffers

_ALIGN = 4  # tile buffers are 4-byte aligned (what CMSIS-NN's loads need)


def stage_refusal(graph: Graph, positions) -> str | None:
    """Why the ops at `positions` cannot run as a patch stage (None when they can): every op a
    harness convolution or an int8 ADD of equal shapes, all on [1, H, W, C] int8 tensors."""
    for i in positions:
        op = graph.ops[i]
        if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            if not kernels.is_harness(op) and not kernels.can_run_harness(graph, i):
                return f"op {i} ({op.opcode}) is not an int8 convolution the harness runs"
            continue
        if op.opcode == "ADD" and isinstance(op.options, AddOptions) and len(op.inputs) == 2:
            ts = [graph.tensors[t] for t in (*op.inputs, *op.outputs)]
            if all(t.dtype == "int8" and t.quant is not None and t.shape == ts[2].shape and len(t.shape) == 4
                   for t in ts) and all(graph.is_activation(t) for t in op.inputs) \
                    and op.options.fused_activation in ACTIVATION_CODE:
                continue
            return f"op {i} (ADD) is not an int8 add of two activations of one shape"
        return f"op {i} ({op.opcode}) cannot run inside a patch stage"
    return None


def build_stage(graph: Graph, tin: int, tout: int, positions: list[int], grid: tuple[int, int],
                in_place: bool = True, stream: bool | None = None) -> Graph:
    """`graph` with the region `positions` (tin -> tout, a legal patch region) replaced by one
    TPUP_PATCH_STAGE op on a `grid` of tiles (`in_place`: dying tile buffers may be written over).
    `stream`: no layer computes an element twice: on row stripes (grid n x 1) each layer's rows
    the next stripe needs again are kept in a stream buffer (`_stream_program`), on other grids
    the rows and columns the next tiles need in halo caches (`_stream2d_program`); by default
    stripe grids stream and other grids recompute their halos.
    UsageError if a tile reads nothing of some tensor or an op cannot run in a stage."""
    why = stage_refusal(graph, positions)
    if why:
        raise UsageError(f"patch stage: {why}")
    if stream is None:
        stream = grid[1] == 1
    graph = stage_layers(graph, positions)
    region = [graph.ops[i] for i in positions]
    body, where = _body(graph, region, tin, tout)
    layer_words = _layer_words(graph, region, where)
    if not stream:
        program, scratch = _program(graph, region, tin, tout, grid, in_place)
    elif grid[1] == 1:
        program, scratch = _stream_program(graph, region, tin, tout, grid[0])
    else:
        program, scratch = _stream2d_program(graph, region, tin, tout, grid, in_place)
    stage = PatchStage(body, tuple(grid), tuple(program), scratch, tuple(layer_words))
    consts = [t for t in where if graph.tensors[t].is_constant]
    consts.sort(key=lambda t: where[t])
    op = Op(OPCODE, (tin, *consts), (tout,), None, stage, 0, 1, kernel=kernels.kernel_name())
    from tpu_pipeline.toolchain.rewrite.edit import GraphEditor

    editor = GraphEditor(graph)
    for i in positions[:-1]:
        editor.remove(i)
    editor.replace(positions[-1], [op])
    return editor.finish()


def stage_layers(graph: Graph, positions) -> Graph:
    """`graph` with the region's convolutions on the kernels a stage runs them with (fit's
    estimates price and size them so too): every one on the harness kernel, not overlapped (a
    tile's buffers are planned apart), and on a faster variant only where tpup_stage.cc runs it
    (`in_stages`)."""
    for i in positions:
        op = graph.ops[i]
        if op.opcode != "ADD":
            drop = {kernels.OVERLAP, *(f for f, v in kernel_variants.registered().items() if not v.in_stages)}
            graph = kernels.with_kernel(graph, [i], kernels.kernel_name(*(kernels.flags(op) - drop)))
    return graph


def _body(graph: Graph, region: list[Op], tin: int, tout: int) -> tuple[Graph, dict[int, int]]:
    """The region as its own graph (activations first, then constants, in order of first use),
    and where each of `graph`'s tensors went in it."""
    used = [tin]
    for op in region:
        used += [t for t in (*op.inputs, *op.outputs) if t >= 0]
    used = list(dict.fromkeys(used))
    acts = [t for t in used if not graph.tensors[t].is_constant]
    consts = [t for t in used if graph.tensors[t].is_constant]
    where = {t: k for k, t in enumerate(acts + consts)}
    tensors = tuple(dataclasses.replace(graph.tensors[t], index=where[t], source=None) for t in acts + consts)
    ops = tuple(dataclasses.replace(op, inputs=tuple(where[t] if t >= 0 else -1 for t in op.inputs),
                                    outputs=tuple(where[t] for t in op.outputs), source=None) for op in region)
    return Graph(tensors, ops, (where[tin],), (where[tout],), "stage"), where


def _add_params(graph: Graph, op: Op) -> list[int]:
    """TFLite Micro's CalculateOpDataAdd for int8: offsets, left shift, multipliers and shifts."""
    a, b, y = (graph.tensors[t] for t in (*op.inputs, op.outputs[0]))
    sa, sb, sy = (float(np.float32(t.quant.scale[0])) for t in (a, b, y))
    left_shift = 20
    twice = 2 * max(sa, sb)
    m1, s1 = requant.quantize_multiplier(sa / twice)
    m2, s2 = requant.quantize_multiplier(sb / twice)
    mo, so = requant.quantize_multiplier(twice / ((1 << left_shift) * sy))
    lo, hi = requant.activation_range(graph, op)
    return [left_shift, -int(a.quant.zero_point[0]), int(y.quant.zero_point[0]), lo, -int(b.quant.zero_point[0]),
            m1, s1, m2, s2, mo, so, -1, hi]


def _stage_flag_bits(graph: Graph, op: Op) -> int:
    """A conv layer's flags word (ir/stage.py layer word 4): direct, and a variant patch stages run
    (`in_stages`) with its derived bits, as the op's own options have them (harness/tpup_stage.cc)."""
    bits = kernels.flag_bits()[kernels.DIRECT] if kernels.DIRECT in kernels.flags(op) else 0
    v = kernels.variant_of(op)
    if v is not None and v.in_stages:
        bits |= v.bit | (v.derived_bits(graph, op) & v.derived_mask if v.derived_bits is not None else 0)
    return bits


def _layer_words(graph: Graph, region: list[Op], where: dict[int, int]) -> list[int]:
    words = []
    for op in region:
        w = [0] * LAYER_WORDS
        w[0] = KINDS[op.opcode]
        w[1], w[2], w[3] = where[op.inputs[0]], where[op.inputs[1]] if op.opcode == "ADD" else -1, where[op.outputs[0]]
        if op.opcode == "ADD":
            w[4:17] = _add_params(graph, op)
            w[23:28] = [ACTIVATION_CODE[op.options.fused_activation], 0, 0, 0, op.version]
        else:
            o = op.options
            x, wt, y = (graph.tensors[t] for t in (op.inputs[0], op.inputs[1], op.outputs[0]))
            lo, hi = requant.activation_range(graph, op)
            w[4] = _stage_flag_bits(graph, op)
            w[5], w[6], w[7] = -int(x.quant.zero_point[0]), int(y.quant.zero_point[0]), lo
            w[8:13] = [o.stride_h, o.stride_w, o.dilation_h, o.dilation_w,
                       o.depth_multiplier if op.opcode == "DEPTHWISE_CONV_2D" else 1]
            bias = op.inputs[2] if len(op.inputs) > 2 and op.inputs[2] >= 0 else -1
            w[13:16] = [where[op.inputs[1]], where[bias] if bias >= 0 else -1, where[op.inputs[3]]]
            w[16], w[17], w[18] = hi, wt.shape[1], wt.shape[2]
            w[19], w[20] = leading_pads(graph, op)  # on the whole tensor: sizes the kernel's buffer
            top, left = (o.pad_top, o.pad_left) if o.padding == "EXPLICIT" else (0, 0)
            w[23:28] = [ACTIVATION_CODE[o.fused_activation], PADDING_CODE[o.padding], top, left, op.version]
        words += w
    return words


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _program(graph: Graph, region: list[Op], tin: int, tout: int, grid, in_place: bool) -> tuple[list[int], int]:
    """The steps of every tile (row-major, as the copies' order) and the scratch bytes they need.
    A tile whose buffers written over each other plan larger (rigid groups pack worse) runs
    them apart."""
    oh, ow = hw(graph, tout)
    program, scratch = [], 0
    for h0, h1 in splits(oh, grid[0]):
        for w0, w1 in splits(ow, grid[1]):
            box = (h0, h1, w0, w1)
            steps, size = _tile(graph, region, tin, tout, box, False)
            if in_place:
                steps, size = min((_tile(graph, region, tin, tout, box, True), (steps, size)), key=lambda t: t[1])
            program += steps
            scratch = max(scratch, size)
    return program, scratch


_PLANS: dict[tuple, tuple[tuple[int, ...], int]] = {}  # a tile's planning problem -> (offsets, size)


class _TileBuffers:
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
        self.bufs.append([_aligned(size), step, step])
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
        self.bufs.append([_aligned(size), step, step])
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
        plan = plan_buffers(buffers, "auto", time_limit=0.2, alignment=_ALIGN)
        base = {p[3]: plan.offsets[j] - p[4] for j, p in enumerate(planned) if p[3] >= 0}
        own = {p[5]: plan.offsets[j] for j, p in enumerate(planned) if p[5] >= 0}
        return tuple(base[g] + a if g >= 0 else own[k] for k, (g, a) in enumerate(zip(self.group, self.at))), plan.size


def _overlap(real: Box, obox: Box, x_c: int, y_c: int, pad_top: int, rows) -> tuple[int, int]:
    """(extent, ring rows) of a tile's convolution run with its output over its input, both from
    the first byte (overlap.overlap_layout's rule on the tile's boxes)."""
    x = _aligned((real[1] - real[0]) * (real[3] - real[2]) * x_c)
    y = _aligned((obox[1] - obox[0]) * (obox[3] - obox[2]) * y_c)
    ring = overlap.ring_rows_for(real[1] - real[0], (real[3] - real[2]) * x_c, obox[1] - obox[0],
                                 (obox[3] - obox[2]) * y_c, pad_top, rows.stride,
                                 (rows.kernel - 1) * rows.dilation + 1, 0, 0)
    return max(x, y), ring


def _tile(graph: Graph, region: list[Op], tin: int, tout: int, box: Box, in_place: bool) -> tuple[list[int], int]:
    need = region_needs(graph, region, tout, box)
    if need is None:
        raise UsageError(f"patch stage: a tile of '{graph.tensors[tout].name}' reads nothing of one of the "
                         "region's tensors (grid too fine)")
    channels = {t: graph.tensors[t].shape[3] for t in need}
    last_read = {}
    for k, op in enumerate(region):
        for t in op.inputs:
            last_read[t] = k

    def nbytes(b: Box, t: int) -> int:
        return (b[1] - b[0]) * (b[3] - b[2]) * channels[t]

    def dies(t: int, k: int) -> bool:  # read for the last time by layer k (the region's output is kept)
        return in_place and last_read.get(t) == k and t != tout

    bufs = _TileBuffers()
    have: dict[int, int] = {}
    steps: list[list[int]] = []

    def use(b: int) -> int:
        return bufs.use(b, len(steps))

    have[tin] = bufs.new(nbytes(need[tin], tin), 0)
    steps.append([COPY_IN, have[tin], *need[tin][::2], need[tin][1] - need[tin][0], need[tin][3] - need[tin][2]])
    for k, op in enumerate(region):
        y = op.outputs[0]
        obox = need[y]
        if op.opcode == "ADD":
            a, b = op.inputs
            ab, bb = need[a], need[b]
            out = bufs.new(nbytes(obox, y), len(steps))
            steps.append([ADD, k, use(have[a]), ab[1] - ab[0], ab[3] - ab[2], obox[0] - ab[0], obox[2] - ab[2],
                          use(have[b]), bb[1] - bb[0], bb[3] - bb[2], obox[0] - bb[0], obox[2] - bb[2],
                          out, obox[1] - obox[0], obox[3] - obox[2]])
            have[y] = out
            continue
        x = op.inputs[0]
        virtual = reads(graph, op, obox)
        real = clip(virtual, hw(graph, x))
        src, src_dies = have[x], dies(x, k)
        if real != need[x]:  # the buffer holds more than this window reads: a copy of just that
            hb = need[x]
            # a slice of a dying buffer goes over it: each row moves to a lower address
            sub = bufs.over(src, 0, nbytes(real, x), 0, len(steps)) if src_dies else bufs.new(nbytes(real, x), len(steps))
            steps.append([SLICE, use(src), hb[1] - hb[0], hb[3] - hb[2], channels[x], real[0] - hb[0],
                          real[2] - hb[2], real[1] - real[0], real[3] - real[2], sub])
            src, src_dies = sub, in_place
        pad_top = real[0] - virtual[0]
        extent, rows = _overlap(real, obox, channels[x], channels[y], pad_top, window(graph, op)[0])
        ring_bytes = rows * (obox[3] - obox[2]) * channels[y]
        x_bytes, y_bytes = _aligned(nbytes(real, x)), _aligned(nbytes(obox, y))
        if src_dies and kernels.is_harness(op) and extent + _aligned(ring_bytes) < x_bytes + y_bytes:
            out = bufs.over(src, 0, y_bytes, 0, len(steps))
            ring = bufs.new(ring_bytes, len(steps))
        else:
            out, ring, rows = bufs.new(y_bytes, len(steps)), -1, 0
        steps.append([CONV, k, use(src), real[1] - real[0], real[3] - real[2], pad_top, real[2] - virtual[2],
                      out, obox[1] - obox[0], obox[3] - obox[2], ring, rows])
        have[y] = out
    steps.append([COPY_OUT, use(have[tout]), box[0], box[2], box[1] - box[0], box[3] - box[2]])
    offsets, size = bufs.offsets()
    # buffer indices -> byte offsets in the scratch
    slots = {COPY_IN: (1,), SLICE: (1, 9), CONV: (2, 7, 10), ADD: (2, 7, 12), COPY_OUT: (1,)}
    words = []
    for s in steps:
        for at in slots[s[0]]:
            s[at] = offsets[s[at]] if s[at] >= 0 else 0
        words += s
    return words, size




# ---- stripes without recomputation (StreamNet's stream buffers) ----------------------------------
def _stream_program(graph: Graph, region: list[Op], tin: int, tout: int, n: int) -> tuple[list[int], int]:
    """The steps of `n` full-width row stripes where no layer computes a row twice: of each layer's
    output a stripe computes only the rows below those the stripe above computed; the rows it
    shares with the stripe above come from that layer's stream buffer (SLICE in), and the rows
    the stripe below will share go into it (SLICE out). Stream buffers live across stripes, after
    the largest stripe's buffers (planned per stripe as `_tile` plans them, without overlap).
    Returns (program words, scratch bytes: the stripe buffers, then every stream buffer)."""
    oh, ow = hw(graph, tout)
    boxes = [(h0, h1, 0, ow) for h0, h1 in splits(oh, n)]
    needs = [region_needs(graph, region, tout, b) for b in boxes]
    if any(need is None for need in needs):
        raise UsageError(f"patch stage: a stripe of '{graph.tensors[tout].name}' reads nothing of one of the "
                         "region's tensors (too many stripes)")
    kept = {}  # layer output -> rows its stream buffer holds at most
    for i in range(1, n):
        for op in region:
            y = op.outputs[0]
            if y != tout:
                kept[y] = max(kept.get(y, 0), needs[i - 1][y][1] - needs[i][y][0])
    stripes = [_stripe(graph, region, tin, tout, boxes[i], needs[i], needs[i - 1] if i else None,
                       needs[i + 1] if i + 1 < n else None) for i in range(n)]
    base = max(_aligned(size) for _, size in stripes)
    cache, at = {}, base
    for y, rows in kept.items():
        if rows > 0:
            cache[y], at = at, at + _aligned(rows * hw(graph, y)[1] * graph.tensors[y].shape[3])
    words = []
    for (steps, offsets), _size in stripes:
        for step in steps:
            words += [cache[w[1]] if isinstance(w, tuple) and w[0] == "cache" else
                      offsets[w[0]] + w[1] if isinstance(w, tuple) else w for w in step]
    return words, at


def _stripe(graph: Graph, region: list[Op], tin: int, tout: int, box, need, above, below):
    """((steps with symbolic operands: (buffer, byte offset) or ("cache", tensor)), buffer
    offsets), scratch bytes) of one stripe (see `_stream_program`)."""
    bufs = _TileBuffers()
    steps: list[list] = []
    ch = {t: graph.tensors[t].shape[3] for t in need}

    def width(t: int) -> int:
        return need[t][3] - need[t][2]

    def nbytes(t: int) -> int:
        return (need[t][1] - need[t][0]) * width(t) * ch[t]

    have = {tin: bufs.new(nbytes(tin), 0)}
    steps.append([COPY_IN, (have[tin], 0), need[tin][0], need[tin][2], need[tin][1] - need[tin][0], width(tin)])
    for k, op in enumerate(region):
        y = op.outputs[0]
        top, bottom = need[y][0], need[y][1]
        shared = max(0, min(above[y][1], bottom) - top) if above is not None and y != tout else 0
        row = width(y) * ch[y]
        out = bufs.new(nbytes(y), len(steps))
        if shared:
            steps.append([SLICE, ("cache", y), shared, width(y), ch[y], 0, 0, shared, width(y), (out, 0)])
        new = (top + shared, bottom, need[y][2], need[y][3])
        if new[1] > new[0]:
            steps.append(_stripe_layer(graph, op, k, new, need, have, bufs, len(steps),
                                       (bufs.use(out, len(steps)), shared * row)))
        if below is not None and y != tout and bottom > below[y][0]:
            keep = bottom - below[y][0]
            steps.append([SLICE, (bufs.use(out, len(steps)), 0), bottom - top, width(y), ch[y], below[y][0] - top, 0,
                          keep, width(y), ("cache", y)])
        have[y] = out
    steps.append([COPY_OUT, (bufs.use(have[tout], len(steps)), 0), box[0], box[2], box[1] - box[0], box[3] - box[2]])
    offsets, size = bufs.offsets()
    return (steps, offsets), size


def _stripe_layer(graph: Graph, op: Op, k: int, new, need, have, bufs: _TileBuffers, step: int, out) -> list:
    """A layer's step computing rows `new` of its output into `out`, reading its inputs' stripe
    buffers at the rows it needs (whole rows: a pointer into the buffer, no slice)."""
    def at(t: int, first_row: int):
        return (bufs.use(have[t], step), (first_row - need[t][0]) * (need[t][3] - need[t][2]) * graph.tensors[t].shape[3])

    h, w = new[1] - new[0], new[3] - new[2]
    if op.opcode == "ADD":
        a, b = op.inputs
        return [ADD, k, at(a, need[a][0]), need[a][1] - need[a][0], need[a][3] - need[a][2], new[0] - need[a][0],
                new[2] - need[a][2], at(b, need[b][0]), need[b][1] - need[b][0], need[b][3] - need[b][2],
                new[0] - need[b][0], new[2] - need[b][2], out, h, w]
    x = op.inputs[0]
    virtual = reads(graph, op, new)
    real = clip(virtual, hw(graph, x))
    if (real[2], real[3]) != (need[x][2], need[x][3]):
        raise UsageError("patch stage: a streamed stripe's layer does not read whole rows")  # (cannot happen)
    return [CONV, k, at(x, real[0]), real[1] - real[0], real[3] - real[2], real[0] - virtual[0], real[2] - virtual[2],
            out, h, w, 0, 0]


# ---- square grids without recomputation (StreamNet's 2-D halo caching) ---------------------------
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


def _stream2d_program(graph: Graph, region: list[Op], tin: int, tout: int, grid,
                      in_place: bool = True) -> tuple[list[int], int]:
    """The steps of a `grid` of tiles in raster order where no layer computes an element twice: of
    each layer's output a tile computes only the part below the rows the tile above computed and
    right of the columns the tile to the left computed; the rest of its box comes from the
    layer's row and column caches (PASTE), assembled into the box a reader reads. After a
    tensor's last reader the tile saves into the caches what the next tiles share: its right
    columns (all its rows: the top ones out of the row cache, which is why this comes first) and
    its bottom rows (its new columns). Returns (program words, scratch bytes: the largest tile's
    buffers, then every cache). `in_place`: a layer's output may be written over its dying input
    (a ring of rows: less memory, a kernel call per row)."""
    (oh, ow), name = hw(graph, tout), graph.tensors[tout].name
    rows, cols = splits(oh, grid[0]), splits(ow, grid[1])
    by_row = [region_needs(graph, region, tout, (h0, h1, 0, ow)) for h0, h1 in rows]
    by_col = [region_needs(graph, region, tout, (0, oh, w0, w1)) for w0, w1 in cols]
    if any(need is None for need in by_row + by_col):
        raise UsageError(f"patch stage: a tile of '{name}' reads nothing of one of the region's tensors (grid too fine)")
    halos = {t: _Halo(graph, t, [n[t][:2] for n in by_row], [n[t][2:] for n in by_col], t not in (tin, tout))
             for t in by_row[0]}
    tiles = [_tile2d(graph, region, tin, tout, halos, i, j, in_place) for i in range(grid[0]) for j in range(grid[1])]
    cache, at = {}, _aligned(max(size for _, size in tiles))
    for t, h in halos.items():
        for kind, size in (("row", h.row_cache), ("col", h.col_cache)):
            if size:
                cache[(kind, t)], at = at, at + _aligned(size)
    words = []
    for (steps, offsets), _size in tiles:
        for step in steps:
            words += [cache[w] if isinstance(w, tuple) and isinstance(w[0], str) else
                      offsets[w[0]] + w[1] if isinstance(w, tuple) else w for w in step]
    return words, at


class _Tile2d:
    """One tile's steps being written (symbolic operands: (buffer, byte offset) or (cache kind,
    tensor)) and its buffers (`_TileBuffers`, nothing written over)."""

    def __init__(self, graph: Graph, halos: dict, tin: int, i: int, j: int, readers: dict[int, int], in_place: bool):
        self.graph, self.halos, self.tin, self.i, self.j, self.readers = graph, halos, tin, i, j, readers
        self.in_place = in_place  # None: every output that may, over its dying input; a number: those larger
        self.footprints: list[int] = []  # per convolution, its input and output bytes (one frame if over)
        self.bufs, self.steps, self.computed = _TileBuffers(), [], {}  # tensor -> its new part's buffer
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
                and at % _ALIGN == 0:
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
        extent, rows = _overlap(real, new, c_x, c_y, real[0] - virtual[0], window(self.graph, op)[0])
        x_bytes, y_bytes = _aligned((real[1] - real[0]) * (real[3] - real[2]) * c_x), _aligned(h * w * c_y)
        dies = self.in_place is not False and src[1] == 0 and (src[0] != self.computed.get(x) or x in saves)
        over = dies and kernels.is_harness(op) and extent + _aligned(rows * w * c_y) < x_bytes + y_bytes \
            and (self.in_place is True or x_bytes + y_bytes > self.in_place)
        self.footprints.append(extent + _aligned(rows * w * c_y) if over else x_bytes + y_bytes)
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


def _tile2d(graph: Graph, region: list[Op], tin: int, tout: int, halos: dict, i: int, j: int, in_place: bool):
    """((steps, buffer offsets), scratch bytes) of tile (i, j) of a 2-D streamed stage: each layer
    on its output's new part, each tensor's caches saved once its last reader has read it. In
    place, only the layers whose input and output together exceed the largest footprint the tile
    has with every output that may lying over its input: a ring costs a kernel call per row, and
    elsewhere it would not lower the tile's bytes."""
    if in_place:
        floor = max(_tile2d_pass(graph, region, tin, tout, halos, i, j, True).footprints, default=0)
        tile = _tile2d_pass(graph, region, tin, tout, halos, i, j, floor)
    else:
        tile = _tile2d_pass(graph, region, tin, tout, halos, i, j, False)
    offsets, size = tile.bufs.offsets()
    return (tile.steps, offsets), size


def _tile2d_pass(graph: Graph, region: list[Op], tin: int, tout: int, halos: dict, i: int, j: int, in_place):
    last, readers = {}, {}
    for k, op in enumerate(region):
        last[op.outputs[0]] = k
        for t in dict.fromkeys(op.inputs):
            if t in halos:
                last[t], readers[t] = k, readers.get(t, 0) + 1
    tile = _Tile2d(graph, halos, tin, i, j, readers, in_place)
    for k, op in enumerate(region):
        tile.layer(op, k, [t for t in halos if last.get(t) == k and t not in (tin, tout, op.outputs[0])])
        y = op.outputs[0]
        if last[y] == k and y != tout:  # (read by no layer of the region)
            tile.save(y)
    box = halos[tout].box(i, j)
    tile.add([COPY_OUT, (tile.computed[tout], 0), box[0], box[2], box[1] - box[0], box[3] - box[2]])
    return tile

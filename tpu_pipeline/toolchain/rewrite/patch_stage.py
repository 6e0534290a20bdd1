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
Each tile's buffers are planned by the arena planner (rewrite/stage_tiles.py); the stage's scratch
is the largest plan. Streamed: row stripes here (`_stream_program`), square grids in
rewrite/stage_stream2d.py.

Exact for the same reasons as patches by copies: every output element is computed from the same
inputs and weights with the same integer arithmetic, and an image border is the kernels' own
padding (the layer's leading padding on the tile, the trailing padding implicit at the box's
end). The stage runs harness convolutions (their requantization in flash) and int8 ADDs.
"""

from __future__ import annotations

import dataclasses

from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.ir import Graph, Op, add, kernel_variants, kernels, requant
from tpu_pipeline.toolchain.ir.geometry import Box, clip, hw, leading_pads, reads, region_needs, splits, window
from tpu_pipeline.toolchain.ir.options import AddOptions
from tpu_pipeline.toolchain.ir.kernel_variants import depthwise3x3, packed
from tpu_pipeline.toolchain.ir.stage import (ADD, CONV, COPY_IN, COPY_OUT, KINDS, LAYER_WORDS, OPCODE, SLICE,
                                             SETUP_WORD, STEP_WORDS, PatchStage, ACTIVATION_CODE, PADDING_CODE)
from tpu_pipeline.toolchain.rewrite.stage_stream2d import stream2d_program
from tpu_pipeline.toolchain.rewrite.stage_tiles import TileBuffers, aligned, overlap_extent

DW3 = depthwise3x3.VARIANT.flag


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
    the rows and columns the next tiles need in halo caches (rewrite/stage_stream2d.py); by default
    stripe grids stream and other grids recompute their halos.
    UsageError if a tile reads nothing of some tensor or an op cannot run in a stage."""
    why = stage_refusal(graph, positions)
    if why:
        raise UsageError(f"patch stage: {why}")
    if stream is None:
        stream = grid[1] == 1
    stripes = stream and grid[1] == 1
    staged = stage_layers(graph, positions, stripes=stripes)
    program, scratch = _stage_program(staged, positions, tin, tout, grid, in_place, stream)
    apart = frozenset() if stripes or not in_place else _apart(graph, staged, positions, (tin, tout, grid, stream), scratch)
    if apart:  # (layers that keep their STRIPES_ONLY kernel: no ring, the same scratch)
        staged = stage_layers(graph, positions, stripes, keep=frozenset(positions[k] for k in apart))
        program, scratch = _stage_program(staged, positions, tin, tout, grid, in_place, stream, apart)
    misfits = _dw3_misfits(staged, positions, program)
    if misfits:  # (dw3's stack buffer does not hold some tile's call: those layers on their twins)
        staged = stage_layers(graph, positions, stripes, without={DW3: misfits},
                              keep=frozenset(positions[k] for k in apart))
        program, scratch = _stage_program(staged, positions, tin, tout, grid, in_place, stream, apart)
    graph = staged
    region = [graph.ops[i] for i in positions]
    body, where = _body(graph, region, tin, tout)
    layer_words = _with_setups(_layer_words(graph, region, where), region, program)
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


_PROGRAMS: dict[tuple, tuple[tuple[int, ...], int]] = {}  # _program_key -> (program words, scratch bytes)


def _stage_program(graph: Graph, positions, tin: int, tout: int, grid, in_place: bool, stream: bool,
                   apart: frozenset[int] = frozenset()) -> tuple[tuple[int, ...], int]:
    """(program words, scratch bytes) of the region on `grid`. Generated once per process for the
    same region and form: fit builds a stage, `_apart`'s trials and the chosen one run again when
    the selection is realised on the whole model (TinyEngine's vww: 0.2 s a 2-D streamed program)."""
    region = [graph.ops[i] for i in positions]
    key = _program_key(graph, region, tin, tout, grid, in_place, stream, apart)
    hit = _PROGRAMS.get(key)
    if hit is None:
        if not stream:
            words, scratch = _program(graph, region, tin, tout, grid, in_place, apart)
        elif grid[1] == 1:
            words, scratch = _stream_program(graph, region, tin, tout, grid[0])
        else:
            words, scratch = stream2d_program(graph, region, tin, tout, grid, in_place, apart)
        if len(_PROGRAMS) >= 256:
            _PROGRAMS.clear()
        hit = _PROGRAMS[key] = (tuple(words), scratch)
    return hit


def _program_key(graph: Graph, region: list[Op], tin: int, tout: int, grid, in_place: bool, stream: bool,
                 apart: frozenset[int]) -> tuple:
    """All a stage's program depends on, as plain data: per layer its opcode, options, whether it
    runs on a harness kernel and which of the region's tensors it reads and writes (numbered in
    the region), those tensors' shapes and kinds, and the form. The same region of another graph
    (the span's, the whole model's) has the same key."""
    local = {tin: 0}

    def at(t: int) -> int:
        return -1 if t < 0 else local.setdefault(t, len(local))

    layers = tuple((op.opcode, op.options, kernels.is_harness(op), tuple(map(at, op.inputs)),
                    tuple(map(at, op.outputs))) for op in region)
    tensors = tuple((graph.tensors[t].shape, graph.tensors[t].dtype, graph.is_activation(t)) for t in local)
    return layers, tensors, at(tout), tuple(grid), in_place, stream, apart


def _apart(graph: Graph, staged: Graph, positions, where, scratch: int) -> frozenset[int]:
    """The layers (by position in the region) whose STRIPES_ONLY kernel the stage dropped (it
    runs them in place, through rings) and which, run apart from their input instead, leave the
    stage's scratch as it is (rings are only needed at a tile's largest step): those then keep
    their kernel. `where`: (tin, tout, grid, stream)."""
    tin, tout, grid, stream = where
    apart: frozenset[int] = frozenset()
    for k, i in enumerate(positions):
        if not kernels.flags(graph.ops[i]) & STRIPES_ONLY or kernels.flags(staged.ops[i]) & STRIPES_ONLY:
            continue
        trial = apart | {k}
        if _stage_program(staged, positions, tin, tout, grid, True, stream, trial)[1] <= scratch:
            apart = trial
    return apart



def _dw3_misfits(graph: Graph, positions, program) -> frozenset[int]:
    """The positions of dw3 layers some CONV step of `program` calls on a box whose int16 buffer
    the kernel's stack does not hold (nor, through a ring, a one-row band of it; tpup_stage.cc
    Dw3Fits refuses such a call)."""
    bad, at = set(), 0
    while at < len(program):
        step = program[at:at + STEP_WORDS[program[at]]]
        at += len(step)
        if step[0] != CONV or DW3 not in kernels.flags(graph.ops[positions[step[1]]]):
            continue
        o = graph.ops[positions[step[1]]].options
        in_h, in_w, top, left, out_h, out_w = step[3], step[4], step[5], step[6], step[8], step[9]
        calls = [(in_h, out_h)] + ([(min(in_h, 3), 1)] if step[11] > 0 else [])
        if not all(_dw3_holds(o, h, in_w, top, left, rows, out_w) for h, rows in calls):
            bad.add(positions[step[1]])
    return frozenset(bad)


def _dw3_holds(o, in_h: int, in_w: int, top: int, left: int, out_h: int, out_w: int) -> bool:
    """tpup_depthwise3x3.cc ChoosePlan finds a buffer that fits, in either orientation."""
    plain = depthwise3x3.buffer_shape(o.stride_h, o.stride_w, out_h, out_w, left, in_w)
    turned = depthwise3x3.buffer_shape(o.stride_w, o.stride_h, out_w, out_h, top, in_h)
    return depthwise3x3.buffer_fits(plain) or depthwise3x3.buffer_fits(turned)


# Variants a stage runs on streamed row stripes only, whose calls never go through a ring (the
# stripes' buffers are planned apart); elsewhere a stage's depthwise layer is written over its
# dying input, a call per output row through a ring, and their per-call set-up made those calls
# slower than CMSIS-NN's depthwise (QEMU: TinyEngine's vww, the fast kernel, 11454fd; dw3, which
# widens three input rows per output row there, on tests/test_patch_stage.py's block: +12 % in a
# recomputing 3x2 stage, +33 % in a 2-D streamed 3x3 one, -10 % on 3 stripes).
STRIPES_ONLY = frozenset({"fast", DW3})


def stage_layers(graph: Graph, positions, stripes: bool = False, without: dict | None = None,
                 keep: frozenset[int] = frozenset()) -> Graph:
    """`graph` with the region's convolutions on the kernels a stage runs them with (fit's
    estimates price and size them so too): every one on the harness kernel, not overlapped (a
    tile's buffers are planned apart), and on a faster variant only where tpup_stage.cc runs it
    (`in_stages`; those of STRIPES_ONLY only in a stage on streamed row stripes, `stripes`): a
    layer whose variant stages do not run goes on the first one they do that runs it and wins
    there (pointwise16's layers on pointwise), else on the kernel set's paths. `without`: flag ->
    positions where the stage does not run it either (dw3 where a tile's call overflows its buffer);
    `keep`: positions whose layers keep STRIPES_ONLY's kernels in any stage (never through a ring)."""
    variants = kernel_variants.registered()
    common = {kernels.OVERLAP, *(f for f, v in variants.items() if not v.in_stages)}
    for i in positions:
        op = graph.ops[i]
        drop = common | {f for f, where in (without or {}).items() if i in where} \
            | (set() if stripes or i in keep else set(STRIPES_ONLY))
        if op.opcode != "ADD":
            dropped = kernels.flags(op) & drop - {kernels.OVERLAP}
            graph = kernels.with_kernel(graph, [i], kernels.kernel_name(*(kernels.flags(op) - drop)))
            twin = next((f for f, v in variants.items() if dropped and f not in drop and v.opcode == op.opcode
                         and kernels.can_run_variant(graph, i, f) and v.wins(graph, i)), None)
            if twin is not None:
                graph = kernels.with_flag(graph, [i], twin)
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
    """An ADD layer's words 4-16 (ir/stage.py): TFLite Micro's CalculateOpDataAdd for int8, as
    TPUP_ADD takes it (ir.add.add_params), in the stage's order, with the activation range."""
    left_shift, o1, m1, s1, o2, m2, s2, zy, mo, so = add.add_params(graph, op)
    lo, hi = requant.activation_range(graph, op)
    return [left_shift, o1, zy, lo, o2, m1, s1, m2, s2, mo, so, -1, hi]


def _stage_flag_bits(graph: Graph, op: Op) -> int:
    """A conv layer's flags word (ir/stage.py layer word 4): direct, and a variant patch stages run
    (`in_stages`) with its derived bits, as the op's own options have them (harness/tpup_stage.cc)."""
    bits = kernels.flag_bits()[kernels.DIRECT] if kernels.DIRECT in kernels.flags(op) else 0
    v = kernels.variant_of(op)
    if v is not None and v.in_stages:
        bits |= v.bit | (v.derived_bits(graph, op) & v.derived_mask if v.derived_bits is not None else 0)
    return bits


def _variant_constant(op: Op, where: dict[int, int]) -> int:
    """Layer word 21: the body tensor of the constant a variant the stage runs reads of its own
    (packed's re-laid weights, the op's input 4); 0 (unread: its flag is not set) otherwise."""
    v = kernels.variant_of(op)
    if v is not None and v.in_stages and v.constant_input is not None:
        return where[op.inputs[4]]
    return 0


# A packed layer is set up once an invoke (its requantization kept in the stage's scratch,
# ir/stage.py SETUP_WORD) where it runs on at least this many tiles: each call otherwise sets up
# about 600 instructions a channel (9.5 k for 16), so fewer calls save under about 0.3 M while its
# 16 + 12 x channels bytes may sit at the arena's peak (vww's 8 stripes at 32,000 B: fit then took
# a slower point). fit does not weigh the choice itself (not done).
SETUP_MIN_CALLS = 32


def _with_setups(words: list[int], region: list[Op], program) -> list[int]:
    """`words` with SETUP_WORD set on each packed layer `program` calls at least SETUP_MIN_CALLS times."""
    calls = [0] * len(region)
    at = 0
    while at < len(program):
        if program[at] == CONV:
            calls[program[at + 1]] += 1
        at += STEP_WORDS[program[at]]
    words = list(words)
    for k, op in enumerate(region):
        if op.opcode == "CONV_2D" and kernels.variant_of(op) is packed.VARIANT and calls[k] >= SETUP_MIN_CALLS:
            words[k * LAYER_WORDS + SETUP_WORD] = 1
    return words


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
            w[21] = _variant_constant(op, where)
            top, left = (o.pad_top, o.pad_left) if o.padding == "EXPLICIT" else (0, 0)
            w[23:28] = [ACTIVATION_CODE[o.fused_activation], PADDING_CODE[o.padding], top, left, op.version]
        words += w
    return words


def _program(graph: Graph, region: list[Op], tin: int, tout: int, grid, in_place: bool,
             apart: frozenset[int] = frozenset()) -> tuple[list[int], int]:
    """The steps of every tile (row-major, as the copies' order) and the scratch bytes they need.
    A tile whose buffers written over each other plan larger (rigid groups pack worse) runs
    them apart; layers `apart` (by position) are never written over their input."""
    oh, ow = hw(graph, tout)
    program, scratch = [], 0
    for h0, h1 in splits(oh, grid[0]):
        for w0, w1 in splits(ow, grid[1]):
            box = (h0, h1, w0, w1)
            steps, size = _tile(graph, region, tin, tout, box, False)
            if in_place:
                steps, size = min((_tile(graph, region, tin, tout, box, True, apart), (steps, size)), key=lambda t: t[1])
            program += steps
            scratch = max(scratch, size)
    return program, scratch


def _tile(graph: Graph, region: list[Op], tin: int, tout: int, box: Box, in_place: bool,
          apart: frozenset[int] = frozenset()) -> tuple[list[int], int]:
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

    bufs = TileBuffers()
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
        extent, rows = overlap_extent(real, obox, channels[x], channels[y], pad_top, window(graph, op)[0])
        ring_bytes = rows * (obox[3] - obox[2]) * channels[y]
        x_bytes, y_bytes = aligned(nbytes(real, x)), aligned(nbytes(obox, y))
        if src_dies and k not in apart and kernels.is_harness(op) and extent + aligned(ring_bytes) < x_bytes + y_bytes:
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
    base = max(aligned(size) for _, size in stripes)
    cache, at = {}, base
    for y, rows in kept.items():
        if rows > 0:
            cache[y], at = at, at + aligned(rows * hw(graph, y)[1] * graph.tensors[y].shape[3])
    words = []
    for (steps, offsets), _size in stripes:
        for step in steps:
            words += [cache[w[1]] if isinstance(w, tuple) and w[0] == "cache" else
                      offsets[w[0]] + w[1] if isinstance(w, tuple) else w for w in step]
    return words, at


def _stripe(graph: Graph, region: list[Op], tin: int, tout: int, box, need, above, below):
    """((steps with symbolic operands: (buffer, byte offset) or ("cache", tensor)), buffer
    offsets), scratch bytes) of one stripe (see `_stream_program`)."""
    bufs = TileBuffers()
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


def _stripe_layer(graph: Graph, op: Op, k: int, new, need, have, bufs: TileBuffers, step: int, out) -> list:
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

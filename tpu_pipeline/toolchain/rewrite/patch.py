"""Patch-based (spatially tiled) execution of an initial run of layers, exact in int8.

A *region* is a run of spatially local ops between two articulation tensors (every path from the
model's input to its output passes through both). `apply_patches` rewrites it for a grid of
output tiles: for each tile the needed box of every tensor is found walking the region backwards
(each op maps its output box to the input box its window reads; a tensor read by several ops of
the region is computed over the bounding box of their needs), the region's input box is cut with
STRIDED_SLICE, image borders become an explicit PAD (the tensor's zero point in int8, 0 in float;
the dtype's minimum before a SAME max-pool) and every windowed op runs VALID. The output tiles
are joined with CONCATENATION along W per row of tiles, then along H.

Why it is exact: every output element is computed from the same input elements and weights with
the same integer arithmetic. Both runtimes' int8 conv / depthwise kernels skip padded taps (or
fill im2col with the zero point), i.e. a padded tap contributes (zp + input_offset) * w = 0 —
exactly what an explicit PAD with the zero point contributes; slices, pads and concatenations of
tensors with one quantization copy bytes. Float outputs may differ by rounding only where a
kernel blocks its sums differently for another tile shape (the tests report which).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.ir.options import ConcatenationOptions
from tpu_pipeline.toolchain.ir.geometry import PADS, WINDOWED, hw
from tpu_pipeline.toolchain.rewrite.edit import GraphEditor

MAX_GRID = 8  # TFLite Micro's CONCATENATION takes at most 10 inputs; keep every join <= 8
ELEMENTWISE = ("ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM", "RELU", "RELU6", "RELU_N1_TO_1", "LOGISTIC",
               "TANH", "HARD_SWISH", "LEAKY_RELU", "QUANTIZE", "ABS", "NEG")


@dataclass(frozen=True)
class PatchRegion:
    input: str  # the tensor the patches are cut from (the region's only input activation)
    output: str  # the tensor assembled from the output tiles (the region's only output)
    ops: tuple[str, ...]  # first-output tensor names of the ops inside, in graph order
    max_grid: tuple[int, int]  # largest (rows, cols) grid: min(8, output H), min(8, output W)


# ---- which ops are local ----------------------------------------------------------------------
def _is_nhwc(graph: Graph, t: int) -> bool:
    s = graph.tensors[t].shape
    return len(s) == 4 and s[0] == 1


def _nonlocal_reason(graph: Graph, op) -> str | None:
    """Why `op` cannot run on a tile (None when it can)."""
    acts = [t for t in op.inputs if graph.is_activation(t)]
    outs = [t for t in op.outputs if t >= 0]
    if not acts or len(outs) != 1 or not all(_is_nhwc(graph, t) for t in (*acts, *outs)):
        return "not a single-output op on [1, H, W, C] activations"
    consts = [t for t in op.inputs if t >= 0 and not graph.is_activation(t)]
    if any(not graph.tensors[t].is_constant for t in consts):
        return "reads a non-constant, non-activation tensor"
    name = op.opcode
    if name in WINDOWED:
        if len(acts) != 1 or acts[0] != op.inputs[0]:
            return "window op whose weights are not constant"
        if name == "AVERAGE_POOL_2D" and op.options.padding != "VALID":
            return "SAME average pool (its divisor counts only valid taps)"
        return None
    if name in PADS:
        p = graph.tensors[op.inputs[1]].values().reshape(-1, 2)
        if p.shape[0] != 4 or p[0].any() or p[3].any() or (p < 0).any():
            return "padding outside H and W"
        return None
    if name in ELEMENTWISE:
        shape = graph.tensors[outs[0]].shape
        if any(graph.tensors[t].shape != shape for t in acts):
            return "element-wise op with broadcast activations"
        for t in consts:
            s = graph.tensors[t].shape
            if graph.tensors[t].num_elements not in (1, shape[3]) or (s and any(d != 1 for d in s[:-1])):
                return "element-wise op with a spatial constant"
        return None
    if name == "CONCATENATION" and isinstance(op.options, ConcatenationOptions):
        if op.options.axis in (3, -1) and not consts:
            return None
        return "concatenation not along channels"
    return f"{name} is not spatially local"


# ---- regions ----------------------------------------------------------------------------------
def _ancestors(graph: Graph) -> list[int]:
    """Per op: bitset of the op and its ancestors."""
    anc: list[int] = []
    for i in range(len(graph.ops)):
        a = 1 << i
        for p in graph.preds[i]:
            a |= anc[p]
        anc.append(a)
    return anc


def _articulations(graph: Graph, anc: list[int], only=None) -> dict[int, int]:
    """Activation [1, H, W, C] tensors every path from the inputs to the outputs passes through:
    tensor -> bitset of the ops that run before it (its producer and ancestors). `only`: look at
    these tensors alone (checking one region of a graph of thousands of ops)."""
    out: dict[int, int] = {}
    outputs = set(graph.outputs)
    inputs, producer = set(graph.inputs), graph.producer
    cands = [t for t in graph.inputs if graph.is_activation(t)] + \
        [op.outputs[0] for op in graph.ops if op.outputs and graph.is_activation(op.outputs[0])]
    if only is not None:
        wanted = set(only)
        cands = [t for t in cands if t in wanted]
    act_inputs = [[x for x in op.inputs if graph.is_activation(x)] for op in graph.ops]
    writes_output = [[o for o in op.outputs if o in outputs] for op in graph.ops]
    for t in cands:
        if not _is_nhwc(graph, t):
            continue
        before = anc[graph.producer[t]] if t in graph.producer else 0
        crossing = {t}
        for j in range(len(graph.ops)):
            if (before >> j) & 1:
                if any(o != t for o in writes_output[j]):
                    crossing.add(-1)
                continue
            for x in act_inputs[j]:
                if x in inputs or (x in producer and (before >> producer[x]) & 1):
                    crossing.add(x)
        if crossing == {t}:
            out[t] = before
    return out


def _region_ops(graph: Graph, inside: int) -> list[int]:
    out = []
    while inside:
        low = inside & -inside
        out.append(low.bit_length() - 1)
        inside ^= low
    return out


def _make_region(graph: Graph, tin: int, tout: int, inside: int) -> PatchRegion:
    oh, ow = hw(graph, tout)
    names = tuple(graph.tensors[graph.ops[i].outputs[0]].name for i in _region_ops(graph, inside))
    return PatchRegion(graph.tensors[tin].name, graph.tensors[tout].name, names,
                       (min(MAX_GRID, oh), min(MAX_GRID, ow)))


def patch_regions(graph: Graph) -> list[PatchRegion]:
    """Every legal region, ordered by the position of its input, then of its output."""
    anc = _ancestors(graph)
    arts = _articulations(graph, anc)
    pos = {t: graph.producer.get(t, -1) for t in arts}
    order = sorted(arts, key=lambda t: (pos[t], t))
    blocked = sum(1 << i for i, op in enumerate(graph.ops) if _nonlocal_reason(graph, op))
    regions = []
    for a, tin in enumerate(order):
        for tout in order[a + 1:]:
            inside = arts[tout] & ~arts[tin]
            if not inside or arts[tin] & ~arts[tout]:
                continue
            if inside & blocked:
                break  # every later output's region contains this op too
            if max(hw(graph, tout)) >= 2:
                regions.append(_make_region(graph, tin, tout, inside))
    return regions


def checked_region(graph: Graph, region: PatchRegion) -> tuple[int, int, list[int]]:
    """(input tensor, output tensor, op positions) of `region` in `graph`; UsageError if illegal."""
    by_name = {t.name: t.index for t in graph.tensors}
    tin, tout = by_name.get(region.input), by_name.get(region.output)
    if tin is None or tout is None:
        missing = region.input if tin is None else region.output
        raise UsageError(f"patch region: graph '{graph.name}' has no tensor '{missing}'")
    anc = _ancestors(graph)
    arts = _articulations(graph, anc, only=(tin, tout))
    if tin not in arts or tout not in arts:
        bad = region.input if tin not in arts else region.output
        raise UsageError(f"patch region: '{bad}' is not a tensor every path of the graph passes through")
    inside = arts[tout] & ~arts[tin]
    if not inside or arts[tin] & ~arts[tout]:
        raise UsageError(f"patch region: '{region.output}' does not come after '{region.input}'")
    positions = _region_ops(graph, inside)
    for i in positions:
        why = _nonlocal_reason(graph, graph.ops[i])
        if why:
            raise UsageError(f"patch region: op {i} ({graph.ops[i].opcode}) cannot run on patches: {why}")
    if max(hw(graph, tout)) < 2:
        raise UsageError(f"patch region: output '{region.output}' is 1x1: nothing to tile")
    real = _make_region(graph, tin, tout, inside)
    if tuple(region.ops) != real.ops:
        raise UsageError(f"patch region {region.input} -> {region.output}: its ops are not the graph's ops "
                         "between those tensors")
    return tin, tout, positions


def apply_patches(graph: Graph, region: PatchRegion, grid: tuple[int, int]) -> Graph:
    """The graph with `region` run as a `grid` (rows, cols) of output tiles; ops outside the
    region untouched, tensor names unique. UsageError if the region or grid is not legal."""
    from tpu_pipeline.toolchain.rewrite.patch_build import build_tiles

    tin, tout, positions = checked_region(graph, region)
    gh, gw = (int(g) for g in grid)
    oh, ow = hw(graph, tout)
    if not (1 <= gh <= min(MAX_GRID, oh) and 1 <= gw <= min(MAX_GRID, ow)):
        raise UsageError(f"patch grid {gh}x{gw} for output '{region.output}' ({oh}x{ow}): rows and "
                         f"columns must be 1..{min(MAX_GRID, oh)} and 1..{min(MAX_GRID, ow)}")
    if (gh, gw) == (1, 1):
        return graph
    editor = GraphEditor(graph)
    new_ops = build_tiles(graph, editor, tin, tout, positions, (gh, gw))
    for i in positions[:-1]:
        editor.remove(i)
    editor.replace(positions[-1], new_ops)
    out = editor.finish()
    problems = out.lint()
    if problems:
        raise AssertionError(f"apply_patches built a broken graph: {problems[0]}")
    return out


"""Twin branches (schedule/twins.py): the exact search runs isomorphic branches in a canonical
order and still finds the optimum, checked against the brute-force oracle on random tiled graphs
(fit's patch copies in small: one input cut into tiles, each a chain, joined) whose tiles come in
a few shapes, so some are twins and some only look alike."""

from __future__ import annotations

import random

import pytest

from tpu_pipeline.toolchain.ir import Graph, Tensor, ops as ir_ops
from tpu_pipeline.toolchain.schedule import ScheduleParams, build_model, heuristics, native_search, schedule
from tpu_pipeline.toolchain.schedule.dp import best_first
from tpu_pipeline.toolchain.schedule.fusion import fuse
from tpu_pipeline.toolchain.schedule.problem import Piece
from helpers.oracle import Oracle


def tiled(seed: int, tiles: int = 5) -> Graph:
    """A graph input cut by `tiles` RELUs, each tile a chain of 1-3 RELUs of one of three shapes
    (sizes in channels: the shapes share their first sizes, so they differ only deep down), the
    tiles joined by two concatenations (rows) and one of the rows."""
    rnd = random.Random(seed)
    shapes = [[rnd.choice((1, 2, 6, 12, 24)) for _ in range(rnd.randint(2, 3))] for _ in range(3)]
    shapes[1][:1] = shapes[0][:1]
    shapes[2][:] = shapes[0][::-1]  # (the same sizes the other way round: alike in chain DP's terms)
    tensors = [Tensor(0, "input", "int8", (1, 4, 4, 16))]
    ops, ends = [], []

    def new(c: int) -> int:
        tensors.append(Tensor(len(tensors), f"t{len(tensors)}", "int8", (1, 4, 4, c)))
        return len(tensors) - 1

    for _ in range(tiles):
        prev = 0
        for c in rnd.choice(shapes):
            out = new(c)
            ops.append(ir_ops.op("RELU", (prev,), (out,)))
            prev = out
        ends.append(prev)
    rows = []
    cut = rnd.randint(1, tiles - 1)
    for part in (ends[:cut], ends[cut:]):
        c = sum(tensors[t].shape[3] for t in part)
        out = new(c)
        ops.append(ir_ops.concatenation(part, out, axis=3) if len(part) > 1 else ir_ops.op("RELU", part, (out,)))
        rows.append(out)
    out = new(sum(tensors[t].shape[3] for t in rows))
    ops.append(ir_ops.concatenation(rows, out, axis=3))
    return Graph(tuple(tensors), tuple(ops), (0,), (out,), f"tiled{seed}")


def _piece(graph: Graph, twins: bool = True, fused: bool = True) -> Piece:
    """The graph as one piece: fused units (as `schedule` has them), or one op each."""
    model = build_model(graph)
    piece = Piece(model, fuse(model) if fused else [(v,) for v in range(model.n)]).use_lazy_slices()
    return piece.use_twins() if twins else piece


@pytest.mark.parametrize("seed", range(40))
def test_twins_keep_the_optimum_of_random_tiled_graphs(seed):
    """The exact search with twins (Python and C) proves the brute-force optimum, as does
    `schedule` with twins on and off; and most of these graphs have twins."""
    graph = tiled(seed, tiles=4 + seed % 3)
    opt = Oracle(graph, "tflm").optimum()
    for piece in (_piece(graph), _piece(graph, fused=False)):
        ub = piece.model.peak(heuristics.greedy(piece.model)) + 1
        for native in (False, True) if native_search.available() else (False,):
            r = best_first(piece, ub, 0, native=native)
            assert r.complete and r.order is not None and r.peak == opt, (native, r.peak, opt)
            assert piece.evaluate(r.order) == r.peak
    for params in (ScheduleParams(), ScheduleParams().without("twins")):
        s = schedule(graph, method="dp", time_limit=30, params=params)
        assert s.proven_optimal and s.peak == opt, (params.twins, s.peak, opt)


def test_random_tiled_graphs_have_twins_and_look_alikes():
    """The generator makes what the test above needs: twins in many graphs (fused units: fusion
    joins some tiles' ops unlike their twins'), and in most as one op a unit."""
    with_twins = sum(bool(_piece(tiled(seed, tiles=4 + seed % 3)).twin) for seed in range(40))
    unfused = sum(bool(_piece(tiled(seed, tiles=4 + seed % 3), fused=False).twin) for seed in range(40))
    assert with_twins >= 15 and unfused >= 30


def test_twins_are_the_tiles_of_one_shape_in_one_row():
    """Four tiles of one shape joined by one concatenation: each links to the one before, unit for
    unit; a tile of another size, or one joined elsewhere, links to none."""
    tensors = [Tensor(0, "input", "int8", (1, 4, 4, 16))]
    ops, ends = [], []
    for k, c in enumerate((2, 2, 2, 2, 3)):
        a, b = len(tensors), len(tensors) + 1
        tensors += [Tensor(a, f"a{k}", "int8", (1, 4, 4, 8)), Tensor(b, f"b{k}", "int8", (1, 4, 4, c))]
        ops += [ir_ops.op("RELU", (0,), (a,)), ir_ops.op("RELU", (a,), (b,))]
        ends.append(b)
    out = len(tensors)
    tensors.append(Tensor(out, "out", "int8", (1, 4, 4, 11)))
    ops.append(ir_ops.concatenation(ends, out, axis=3))
    piece = _piece(Graph(tuple(tensors), tuple(ops), (0,), (out,), "row"))
    first_unit = {u[0]: k for k, u in enumerate(piece.units)}
    cuts = [first_unit[2 * k] for k in range(5)]
    links = [piece.twin[k] for k in cuts]
    assert links == [-1, cuts[0], cuts[1], cuts[2], -1]


def _row(shapes) -> Graph:
    """One input cut into a tile per shape (a chain of RELUs to those channel counts), joined."""
    tensors = [Tensor(0, "input", "int8", (1, 4, 4, 16))]
    ops, ends = [], []
    for shape in shapes:
        prev = 0
        for c in shape:
            tensors.append(Tensor(len(tensors), f"t{len(tensors)}", "int8", (1, 4, 4, c)))
            ops.append(ir_ops.op("RELU", (prev,), (len(tensors) - 1,)))
            prev = len(tensors) - 1
        ends.append(prev)
    out = len(tensors)
    tensors.append(Tensor(out, "out", "int8", (1, 4, 4, sum(s[-1] for s in shapes))))
    ops.append(ir_ops.concatenation(ends, out, axis=3))
    return Graph(tuple(tensors), tuple(ops), (0,), (out,), "row")


@pytest.mark.parametrize("shapes", [((1, 12), (24, 1)), ((1, 12), (24, 1), (1, 12), (24, 1)),
                                    ((2, 24, 1), (2, 1, 12), (2, 24, 1))])
def test_tiles_alike_but_for_their_sizes_are_no_twins(shapes):
    """Tiles of one length whose sizes differ: the one with the larger working set must run first
    (fewer results waiting), whatever their numbering; taken for twins, the search would run them
    in their numbering and miss the optimum. (One op a unit: fusion joins these tiles' ops unlike.)"""
    graph = _row(shapes)
    opt = Oracle(graph, "tflm").optimum()
    piece = _piece(graph, fused=False)
    shape_of = {}  # the first unit of each tile: its shape
    for k, u in enumerate(piece.units):
        if piece.model.born[piece.model.touch[u[0]][0]] < 0:  # reads the input: a tile's cut
            shape_of[k] = shapes[len(shape_of)]
    assert all(shape_of[piece.twin[k]] == s for k, s in shape_of.items() if piece.twin and piece.twin[k] >= 0)
    r = best_first(piece, piece.model.peak(heuristics.greedy(piece.model)) + 1, 0, native=False)
    assert r.complete and r.peak == opt
    s = schedule(graph, method="dp", time_limit=30)
    assert s.proven_optimal and s.peak == opt

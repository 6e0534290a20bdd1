"""fit's `refine` (fit/variants.py): a built patch variant whose emitted order misses the budget
but whose bound admits it goes to the exact scheduler; under a budget (search.choose) it asks for
any order within the budget, not the best one."""

from __future__ import annotations

from tpu_pipeline.toolchain.fit.variants import Variant, refine
from tpu_pipeline.toolchain.ir import Graph, Tensor, ops as ir_ops
from tpu_pipeline.toolchain.memory import lifetimes
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.schedule import schedule

SEM = get_semantics("tflm")


def _cut_first(tiles: int = 6) -> Graph:
    """Copies of a region in small, in a poor order: every tile cut from the input first, then
    each tile's chain (the input's cuts held together), the tiles joined."""
    tensors = [Tensor(0, "input", "int8", (1, 8, 8, 16))]
    cuts, ends, ops = [], [], []
    for k in range(tiles):
        tensors.append(Tensor(len(tensors), f"cut{k}", "int8", (1, 8, 8, 4)))
        ops.append(ir_ops.op("RELU", (0,), (len(tensors) - 1,)))
        cuts.append(len(tensors) - 1)
    for k, cut in enumerate(cuts):
        tensors.append(Tensor(len(tensors), f"wide{k}", "int8", (1, 8, 8, 12)))
        ops.append(ir_ops.op("RELU", (cut,), (len(tensors) - 1,)))
        tensors.append(Tensor(len(tensors), f"tile{k}", "int8", (1, 8, 8, 1)))
        ops.append(ir_ops.op("RELU", (len(tensors) - 2,), (len(tensors) - 1,)))
        ends.append(len(tensors) - 1)
    out = len(tensors)
    tensors.append(Tensor(out, "out", "int8", (1, 8, 8, tiles)))
    ops.append(ir_ops.concatenation(ends, out, axis=3))
    return Graph(tuple(tensors), tuple(ops), (0,), (out,), "cut_first")


def _variant(graph: Graph) -> Variant:
    return Variant(0, 0, "patch", "patches", lifetimes(graph, None, SEM).peak, 0, 1.0, 0, len(graph.ops),
                   graph=graph)


def test_refine_under_a_budget_asks_for_an_order_within_it():
    graph = _cut_first()
    v = _variant(graph)
    best = schedule(graph, time_limit=10, semantics=SEM)
    assert best.proven_optimal and best.peak < v.peak
    budget = v.peak - 1  # any order better than the emitted one fits
    (best_asked,) = refine([v], budget, None, SEM)
    (within,) = refine([v], budget, None, SEM, below=budget + 1)
    # asked for the best order: the optimum, and the variant counts as searched
    assert best_asked.peak == best.peak and best_asked.searched and best_asked.ordered
    # asked for one within the budget: within it, achievable in the order it carries, not marked
    # as the best (a later smallest-arena question searches it again)
    assert within.peak <= budget and within.ordered and not within.searched
    assert lifetimes(within.graph, None, SEM).peak == within.peak
    # a budget below the optimum: proven out of reach (the bound at the budget + 1)
    (none,) = refine([v], best.peak - 1, None, SEM, below=best.peak)
    assert none.peak >= best.peak and none.lower_bound == best.peak

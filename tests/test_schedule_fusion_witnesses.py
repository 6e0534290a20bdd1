"""Hand-built witnesses for guards of `tpu_pipeline.toolchain.schedule.fusion` that the random tests of
test_schedule_bruteforce.py do not reach (each found by a random search against the mutated guard,
then shrunk by hand).

Each test compares, by brute force over permutations with `lifetimes()` (independent of
`MemModel` and of the oracle there), the best peak over the orders that keep every unit of
`fuse(build_model(graph, semantics))` contiguous with the best peak over all topological orders.

The other fusion.py guards that survive the mutation check have no witness: they are implied by
other checks (see the notes at the end of this file).
"""

from __future__ import annotations

import itertools

from tpu_pipeline.toolchain.ir import Graph, Op, Tensor
from tpu_pipeline.toolchain.memory import lifetimes
from tpu_pipeline.toolchain.schedule import build_model
from tpu_pipeline.toolchain.schedule.fusion import fuse


def _graph(sizes, ops, inputs, outputs) -> Graph:
    ts = tuple(Tensor(i, f"t{i}", "int8", (sz,)) for i, sz in enumerate(sizes))
    return Graph(ts, tuple(Op("ADD", tuple(a), tuple(b), source=k) for k, (a, b) in enumerate(ops)),
                 tuple(inputs), tuple(outputs), "witness")


def best_peak(graph: Graph, semantics: str, units=None) -> int:
    """Least peak over the topological orders that run each unit back to back (default: all)."""
    if units is None:
        units = [(v,) for v in range(len(graph.ops))]
    peaks = [lifetimes(graph, order, semantics).peak
             for perm in itertools.permutations(units)
             for order in [[v for u in perm for v in u]] if graph.is_topological(order)]
    return min(peaks)


def test_no_fusion_with_a_graph_output_no_op_touches():
    """Pins `if model.final_only: return units` in fuse() (mutation "fuse even with graph outputs
    no op touches").

    t4 (32 B) is a graph output that no op touches: it is live at the last step only. u = op0
    reads the 32 B input t0 (it dies there) and writes t1; v = op1 reads t1 and writes a dead 16 B
    t2; x = op2 writes a dead 48 B t3. Rule B fuses u and v (v frees what it reads, and its 16 B
    fit in the 32 B u frees); the exchange is sound step by step except that it takes v off the
    last step, where the untouched output is live: with (op0, op1) together x runs last, next to
    the untouched output, or first, next to t0 (48 + 32 either way). tflm: optimum 64 (op0, op2,
    op1); keeping (op0, op1) together gives 80."""
    g = _graph([32, 16, 16, 48, 32], [([0], [1]), ([1], [2]), ([], [3])], [0], [4])
    model = build_model(g, "tflm")
    assert model.final_only == 32
    assert best_peak(g, "tflm") == lifetimes(g, [0, 2, 1], "tflm").peak == 64
    assert best_peak(g, "tflm", [(0, 1), (2,)]) == 80  # what the unguarded Rule B gives
    units = fuse(model)
    assert sorted(v for u in units for v in u) == [0, 1, 2]
    assert best_peak(g, "tflm", units) == 64, units


# Notes: fusion.py guards with no witness (equivalent mutants; 100,000 random graphs of <= 7 ops
# biased to unwritten tensors and TFLite in-place chains, each under tflm and tflite, gave none):
# - Rule B's `sv.ok` (now removed): sv.ok is False only if v touches a tensor with born < 0, and
#   then `_reads_only_from` returns False anyway (its `if b < 0: return False`).
# - Rule C's `sv.ok`: Rule C uses only sv.first_born_extra, which leaves out unwritten tensors
#   (born -1 is never v[0]), i.e. it underestimates what v's first step adds: conservative.
# - `if not su.ok: continue`: an unwritten tensor w that u touches is classed as read from
#   outside, so in_free(u) counts it (unless it is a graph output) while peak_rel misses its birth
#   inside u; in Rule C the two cancel (and a graph-output w is resident before v in the old
#   order, absent before u in the new one), and Rule B uses only slack_end, whose deaths are real.
# - `s.ok = False` in _summary: the three above together.
# - `_reads_only_from`'s "written inside u or v": a tensor v reads is written by a predecessor of
#   v, hence by u; only a TFLite in-place group can have its root written outside u, and then its
#   other touchers are u and v (a chain ending in a 0-byte tensor once escaped this, through a
#   MemModel that disagreed with lifetimes(); fixed, test_model_is_lifetimes_on_a_reshape_chain_...).

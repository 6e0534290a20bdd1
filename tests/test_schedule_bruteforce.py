"""The scheduler and each of its parts against an exact brute-force oracle on random DAGs.

The oracle kit (random DAGs, `Oracle`, the checks of every part) is tests/helpers/oracle.py; the
oracle is independent of `tpu_pipeline.toolchain.schedule.model` and pinned to the lifetime rules
of `tpu_pipeline.toolchain.memory.lifetimes` by a test here.

Every guard that restricts fusion (Rules B and C), free moves, forced cuts and the lower bounds
was removed one at a time and this module was checked to fail (see `MUTATIONS` and
`test_every_mutation_is_caught`, which reruns that check on a copy of the package).

Fast run: `pytest tests/test_schedule_bruteforce.py`; more examples: add `-m slow`.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpu_pipeline.toolchain.ir import Graph, Op, Tensor
from tpu_pipeline.toolchain.memory import lifetimes
from tpu_pipeline.toolchain.schedule import ScheduleParams, build_model, heuristics, schedule
from tpu_pipeline.toolchain.schedule.beam import beam_order
from tpu_pipeline.toolchain.schedule import native_search
from tpu_pipeline.toolchain.schedule.dp import best_first
from tpu_pipeline.toolchain.schedule.fusion import fuse
from tpu_pipeline.toolchain.schedule.problem import Piece
from helpers.oracle import check_everything, compact, dags, fast, Oracle, random_topological, SEMS, slow


# ---- the tests -----------------------------------------------------------------------------


def random_wiring(n: int, seed: int) -> Graph:
    """A randomly wired DAG of n equal-size nodes (RELU or a 2-3 input ADD of earlier nodes),
    like a RandWire stage: every tensor the same size, so many partial orders tie."""
    rnd = random.Random(seed)
    tensors = [Tensor(0, "x", "int8", (64,))]
    ops = []
    for i in range(n):
        k = min(len(tensors), rnd.choice((1, 2, 2, 3)))
        reads = tuple(sorted(rnd.sample(range(max(0, len(tensors) - 6), len(tensors)), min(k, len(tensors)))))
        tensors.append(Tensor(len(tensors), f"t{i}", "int8", (64,)))
        ops.append(Op("RELU" if len(reads) == 1 else "ADD", reads, (len(tensors) - 1,)))
    read = {t for op in ops for t in op.inputs}
    outs = tuple(t for t in range(1, len(tensors)) if t not in read)
    return Graph(tuple(tensors), tuple(ops), (0,), outs, f"wired{seed}")


BEAMS_AT_A_TINY_CAP = """
import sys, time
from tpu_pipeline.toolchain.ir import Graph, Op, Tensor
from tpu_pipeline.toolchain.schedule import beam, build_model
from tpu_pipeline.toolchain.schedule.problem import Piece
from tpu_pipeline.toolchain.schedule.fusion import fuse

tensors = [Tensor(i, f"t{i}", "int8", (64,)) for i in range(7)]
ops = [Op("ADD", (0,), (1,)), Op("ADD", (0,), (2,)), Op("ADD", (0,), (3,)),
       Op("ADD", (1, 2), (4,)), Op("ADD", (3, 4), (5,)), Op("ADD", (1, 5), (6,))]
model = build_model(Graph(tuple(tensors), tuple(ops), (0,), (6,), "fork"))
piece = Piece(model, fuse(model)).use_lazy_slices()
assert len(piece.units) > 1
try:
    beam.beam_order(piece, 48 * 2**28, time.monotonic() + 5)  # 0 as a C int
    sys.exit("a width past a C int was run")
except beam.TooWide:
    pass
beam.MAX_BEAM_BYTES = 1024  # not even width 48 fits
t = time.monotonic()
found = beam.widening_beams(piece, 10**9, t + 5, 0)
print(found, time.monotonic() - t)
"""


def test_beams_stop_at_their_memory_cap():
    """When no beam fits MAX_BEAM_BYTES, beam.widening_beams stops at once. It used to keep doubling the
    width until, passed as a C int, it wrapped to 0 (48 * 2**28) and the C beam wrote into
    0-byte buffers: a heap corruption, seen as `fit` aborting on Xception ("munmap_chunk():
    invalid pointer"). In a child process, as a regression aborts it."""
    if not native_search.available():
        pytest.skip("no C compiler: the Python beam has no memory cap")
    proc = subprocess.run([sys.executable, "-c", BEAMS_AT_A_TINY_CAP], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found, seconds = proc.stdout.split()
    assert found == "None" and float(seconds) < 4, proc.stdout  # stopped, not spun to the deadline


def test_c_and_python_searches_agree_on_random_wirings():
    """The C and Python exact searches prove the same optimum, and the beams of each width and
    floor give the same peak (they keep the same sets at every level, ties included), on the example
    RandWire and on randomly wired graphs whose equal tensors make ties everywhere. Skips where
    no C compiler is found."""
    from conftest import EXAMPLE
    from tpu_pipeline.toolchain.loader import load
    from tpu_pipeline.toolchain.schedule.branches import body_units

    if not native_search.available():
        pytest.skip("no C compiler: only the Python search runs here")
    graphs = [load(EXAMPLE)[1]] + [random_wiring(40, seed) for seed in range(4)]
    for graph in graphs:
        model = build_model(graph)
        units = fuse(model, body_units(model))
        pc = Piece(model, units).use_lazy_slices()
        ub = pc.evaluate(heuristics.greedy(model)) + 1
        c, py = (best_first(pc, ub, 0, native=native) for native in (True, False))
        assert c.complete and py.complete and c.peak == py.peak == pc.evaluate(c.order), graph.name
        for width, floor in itertools.product((1, 2, 4, 16), (0, c.peak // 2, c.peak)):
            c_beam, py_beam = (beam_order(pc, width, time.monotonic() + 60, native=native, floor=floor)
                               for native in (True, False))
            assert c_beam[1] == py_beam[1] >= c.peak, (graph.name, width, floor)


@fast(40)
@given(dags(max_ops=9), SEMS, st.randoms(use_true_random=False))
def test_oracle_is_lifetimes(graph, semantics, rnd):
    """The oracle's peak of an order is `lifetimes()`'s, and its optimum is brute force's."""
    oracle = Oracle(graph, semantics)
    orders = []
    for _ in range(6):
        o = random_topological(graph, rnd)
        assert oracle.peak(o) == lifetimes(graph, o, semantics).peak
        orders.append(o)
    opt = oracle.optimum()
    assert opt <= min(oracle.peak(o) for o in orders)
    if len(graph.ops) <= 7:
        brute = min(lifetimes(graph, list(o), semantics).peak for o in itertools.permutations(range(len(graph.ops)))
                    if graph.is_topological(o))
        assert opt == brute


@fast(70)
@given(dags(max_ops=8), SEMS, st.randoms(use_true_random=False))
def test_scheduler_and_parts_small(graph, semantics, rnd):
    check_everything(graph, semantics, rnd)


@fast(25)
@given(dags(max_ops=12, min_ops=9), SEMS, st.randoms(use_true_random=False))
def test_scheduler_and_parts_up_to_12_ops(graph, semantics, rnd):
    check_everything(graph, semantics, rnd)


@fast(12)
@given(dags(max_ops=7, min_ops=2), SEMS)
def test_cpsat_against_oracle(graph, semantics):
    oracle = Oracle(graph, semantics)
    opt = oracle.optimum()
    res = schedule(graph, method="cpsat", time_limit=30, semantics=semantics)
    assert graph.is_topological(res.order) and lifetimes(graph, res.order, semantics).peak == res.peak
    assert res.lower_bound <= opt <= res.peak
    if build_model(graph, semantics).exact:
        assert res.peak == opt and res.proven_optimal


@fast(300)
@given(dags(max_ops=8), st.sampled_from(["tflite", "tflite", "tflm"]), st.randoms(use_true_random=False))
def test_model_is_lifetimes(graph, semantics, rnd):
    """Cheap and many: the scheduler's memory model (incl. which in-place sharing it treats as
    static) against lifetimes() on random orders."""
    model = build_model(graph, semantics)
    if not model.n:
        return
    for _ in range(4):
        order = random_topological(graph, rnd)
        if model.exact:
            assert model.profile(order) == lifetimes(graph, order, semantics).live_bytes(), compact(graph)
        else:
            assert Oracle(graph, semantics).peak(order) == lifetimes(graph, order, semantics).peak


def test_model_is_lifetimes_on_a_reshape_chain_into_an_empty_tensor():
    """TFLite: op1 reshapes t0 into t1 in place; op2 reshapes t1 into the 0-byte t2. t1's bytes
    are t0's, so lifetimes() gives op2's sharing no effect: t0 dies at op2. The model once
    merged t2 into t0's buffer too, keeping t0 alive until op3 reads t2 (128 B at the last step
    for lifetimes' 64). Found by a random search (the random graphs here rarely build it)."""
    sizes = [64, 64, 0, 64]
    graph = Graph(tuple(Tensor(i, f"t{i}", "int8", (s,)) for i, s in enumerate(sizes)),
                  (Op("ADD", (), (0,)), Op("RESHAPE", (0,), (1,)), Op("RESHAPE", (1,), (2,)),
                   Op("ADD", (2,), (3,))), (), (3,), "chain")
    model = build_model(graph, "tflite")
    assert model.exact
    assert model.profile([0, 1, 2, 3]) == lifetimes(graph, [0, 1, 2, 3], "tflite").live_bytes() == [0, 64, 64, 64, 64]


@fast(300)
@given(dags(max_ops=7), SEMS)
def test_fusion_keeps_the_optimum_many(graph, semantics):
    """Cheap and many: the best order keeping every fused unit contiguous is optimal."""
    model = build_model(graph, semantics)
    units = fuse(model)
    assert sorted(v for u in units for v in u) == list(range(model.n))
    if model.exact and model.n:
        oracle = Oracle(graph, semantics)
        assert oracle.optimum(units) == oracle.optimum(), compact(graph)


def _graph(sizes, ops, inputs, outputs) -> Graph:
    ts = tuple(Tensor(i, f"t{i}", "int8", (sz,)) for i, sz in enumerate(sizes))
    return Graph(ts, tuple(Op("ADD", tuple(a), tuple(b), source=k) for k, (a, b) in enumerate(ops)),
                 tuple(inputs), tuple(outputs), "witness")


# Random graphs rarely meet a fusion guard's exact corner (found by removing each guard: the
# random tests above did not notice). Each witness is a smallest graph where that one guard alone
# stops a fusion that would lose the optimum (u = op0, v = its only successor, x = the op caught
# between them in every optimal order); derived from the exchange arguments in fusion.py.
WITNESSES = {
    # Rule B, peak_rel <= slack_end: v's dead 112 B output must not run while t0 (read by x) lives
    "rule B: v's steps vs what u frees": _graph([96, 16, 48, 16, 112], [([0], [1, 2]), ([0], [3]), ([1], [4])], [0], [3]),
    # Rule B, out_surv <= in_free: v's 48 B graph output must not be live during x's 96 B step
    "rule B: v leaves more than it frees": _graph([16, 16, 112, 16, 96, 48],
                                                  [([0], [1, 2]), ([], [3, 4]), ([1], [5])], [0], [3, 5]),
    # Rule C, in_free <= out_surv: u's 96 B input must not stay live through x (x feeds v)
    "rule C: u frees more than it leaves": _graph([96, 16, 16, 96, 112], [([0], [1]), ([], [2, 3]), ([1, 2], [4])], [0], []),
    # Rule C, peak: u's 96 B dead output must not meet x's 48 B output (x feeds v)
    "rule C: u's steps vs v's first step": _graph([16, 96, 48, 16], [([], [0, 1]), ([], [2]), ([0, 2], [3])], [], []),
    # found by a random search against the mutated guard (in_free counts only tensors that can die)
    "in_free: graph outputs never free": _graph(
        [96, 16, 48, 96, 16, 16, 16, 16, 16, 96, 96],
        [([], [2]), ([0, 2], [3, 4]), ([], [5, 6]), ([3], [7, 8]), ([], [9, 10])], [0, 1], [2, 3, 7, 10]),
    # (deaths at u's last step exclude graph outputs)
    "deaths: graph outputs never die": _graph(
        [112, 112, 48, 48, 48, 96, 112, 48],
        [([], [2, 3]), ([0], [4]), ([0, 3], [5]), ([5, 4], [6]), ([], [7])], [0, 1], [2, 4, 5, 7]),
    # (Rule B: v's predecessors are all in u, even through a zero-byte tensor the memory model drops)
    "rule B: no predecessor outside u": _graph(
        [48, 16, 96, 0, 96, 16, 16, 112, 16],
        [([1], [3, 4]), ([4, 2], [5]), ([0], [6, 7]), ([6, 3], [8])], [0, 1], [4]),
    # (Rule B: v reads no graph input; here op4 reads t1, which op0 and op2 read too)
    "rule B: v reads no graph input": _graph(
        [96, 48, 16, 16, 48, 16, 16, 16, 16, 112],
        [([1, 0], [2, 3]), ([2], [4]), ([1, 4], [5]), ([], [6, 7]), ([1, 7], [8, 9])], [0, 1], [3, 4, 6]),
    # (out_surv counts outputs read outside the unit, not only graph outputs)
    "out_surv: outputs read later survive": _graph(
        [96, 0, 16, 16, 16, 16, 112, 16],
        [([0], [1, 2]), ([1], [3]), ([3], [4]), ([], [5]), ([], [6, 7])], [0], [4, 7]),
    # (inside a fused unit a tensor read by a later op of the unit does not die early)
    "deaths: not before the unit's last reader": _graph(
        [16, 16, 96, 96, 112, 16, 16, 96, 112],
        [([0], [2, 3]), ([], [4]), ([3, 2], [5]), ([1, 4], [6, 7]), ([7, 3], [8])], [0, 1], [2, 7, 8]),
}


@pytest.mark.parametrize("name", list(WITNESSES))
def test_fusion_guard_witnesses(name):
    graph = WITNESSES[name]
    oracle = Oracle(graph, "tflm")
    units = fuse(build_model(graph))
    assert oracle.optimum(units) == oracle.optimum(), (name, units)
    check_everything(graph, "tflm", random.Random(0))


def test_model_chained_in_place():
    """TFLite: RESHAPE -> RESHAPE. The first shares its input's buffer, so the second's input
    owns no bytes of its own and cannot host the second output (model.py's `zeroed`)."""
    ts = tuple(Tensor(i, f"t{i}", "int8", (sz,)) for i, sz in enumerate([192, 192, 128, 64]))
    g = Graph(ts, (Op("ADD", (), (0,)), Op("RESHAPE", (0,), (1,)), Op("RESHAPE", (1,), (2,)),
                   Op("ADD", (2,), (3,))), (), (3,))
    model = build_model(g, "tflite")
    assert model.exact
    assert model.profile([0, 1, 2, 3]) == lifetimes(g, [0, 1, 2, 3], "tflite").live_bytes()


def test_free_moves_with_an_untouched_output():
    """op0 -> op2 and op1 independent; op2 writes a dead 16-byte tensor and t4 is a graph output
    that no op touches, so it is live at the last step only: op2 must not run last (16 bytes
    instead of 32). The free moves take the zero-byte op1 first, which forces op2 last."""
    T = lambda i, s: Tensor(i, f"t{i}", "int8", (s,))  # noqa: E731
    g = Graph((T(0, 0), T(1, 0), T(2, 0), T(3, 16), T(4, 16)),
              (Op("ADD", (0,), (1,)), Op("ADD", (), (2,)), Op("ADD", (1,), (3,))), (), (4,))
    assert Oracle(g, "tflm").optimum() == lifetimes(g, [0, 2, 1]).peak == 16
    assert schedule(g, method="dp", params=ScheduleParams().without("free_moves")).peak == 16
    res = schedule(g, method="dp")
    assert res.peak == 16 or not res.proven_optimal


@pytest.mark.slow
@slow(1500)
@given(dags(max_ops=12), SEMS, st.randoms(use_true_random=False))
def test_scheduler_and_parts_many(graph, semantics, rnd):
    check_everything(graph, semantics, rnd, methods=("dp", "auto", "cpsat") if len(graph.ops) <= 8 else ("dp", "auto"))


# ---- the mutation check --------------------------------------------------------------------
# Each guard that restricts when fusion, a free move, a forced cut or a lower bound applies,
# removed (or its condition made always true) on a copy of the package: the fast tests above must
# fail on every one. (file, exact text, replacement, what the mutation does).
# Not listed, as no test can catch them (equivalent mutants; the argument for each is at the end
# of test_schedule_fusion_witnesses.py, and 100,000 random graphs found no witness): fusion's
# refusals of units that touch a tensor nobody writes (`su.ok`, Rule C's `sv.ok`, `s.ok = False`)
# and _reads_only_from's "written inside u or v". They only fuse less, which is always safe.
MUTATIONS = [
    # fusion.py
    ("fusion.py", "if model.final_only:\n        return units", "if False:\n        return units",
     "fuse even with graph outputs no op touches"),
    ("fusion.py", "if not alive[k] or len(usucc[k]) != 1:", "if not alive[k] or not usucc[k]:",
     "u may have several successor units (fuse with the first)"),
    ("fusion.py", "(j,) = usucc[k]", "j = min(usucc[k])", None),  # companion of the previous one
    ("fusion.py", "if upred[j] == {k}:", "if True:", "Rule B: v may have predecessors outside u"),
    ("fusion.py", "_reads_only_from(model, v, su.inside) and sv.out_surv", "sv.out_surv",
     "Rule B: v may read tensors written outside u"),
    ("fusion.py", "sv.out_surv <= sv.in_free \\", "True \\", "Rule B: v may leave more than it frees"),
    ("fusion.py", "and sv.peak_rel <= su.slack_end", "", "Rule B: v's steps may exceed what u's last step frees"),
    ("fusion.py", "if sv.ok and su.in_free <= su.out_surv and", "if sv.ok and",
     "Rule C: u may free more than it leaves"),
    ("fusion.py", "su.peak_rel - su.out_surv + su.in_free <= sv.first_born_extra", "True",
     "Rule C: u's steps may exceed v's first step"),
    ("fusion.py", "if pe[t] or mask[t] & ~inside:", "if mask[t] & ~inside:",
     "out_surv: graph outputs written inside do not count as surviving"),
    ("fusion.py", "if pe[t] or mask[t] & ~inside:", "if pe[t]:",
     "out_surv: outputs read outside do not count as surviving"),
    ("fusion.py", "if not pe[t]:\n                in_free += size[t]", "if True:\n                in_free += size[t]",
     "in_free: graph outputs read count as freed"),
    ("fusion.py", "if not pe[t] and not (m & ~scope)", "if not (m & ~scope)", "deaths: graph outputs die"),
    ("fusion.py", "and not (m & ~scope) and", "and", "deaths: tensors read after the unit die"),
    ("fusion.py", "and not (m & inside & ~seen):", ":", "deaths: tensors read later in the unit die"),
    ("fusion.py", "if b < 0:\n                return False", "if b < 0:\n                continue",
     "Rule B: v may read graph inputs"),
    # divide.py
    ("divide.py", "if (anc[k] | desc[k] | (1 << k)) == full]", "]", "every unit is a cut point"),
    ("divide.py", "if between:\n            out.append", "if True:\n            out.append", "empty pieces"),
    # dp.py: free moves; bounds/static.py: the bound that floors the search
    ("dp.py", "if free_moves and peak <= cap and R2 <= R:", "if free_moves and R2 <= R:",
     "free move may exceed max(g, floor)"),
    ("dp.py", "if free_moves and peak <= cap and R2 <= R:", "if free_moves and peak <= cap:",
     "free move may leave more bytes resident"),
    ("bounds/static.py", "if m & ops:\n            continue", "pass", "static bound: tensors touched inside counted twice"),
    ("bounds/static.py", "lb = model.step0 if S0 == 0 else 0", "lb = model.step0", "static bound: step 0 in every piece"),
    ("bounds/static.py", "if (S0 | ops) == model.full and model.n:", "if True:",
     "static bound: graph outputs at the end of every piece"),
    # forks.py: the moves around a fork of lazy slices
    ("forks.py", "if fork not in runs_offered:", "if False:", "no run of the remaining slices"),
    # branches.py: bodies
    # (the entry guard, "x has a reader outside", is not here: the exit guard below also refuses
    # its witness, and 4,000 random DAGs gave none where it alone matters)
    ("branches.py", "if anc[r] & body != body:", "if False:",
     "bodies: an exit's outside reader may run in the middle of the body"),
    # _best_first.c: the same search in C (checked next to the Python one in check_piece)
    ("_best_first.c", "int free_move = free_moves && peak <= cap && R2 <= R;", "int free_move = free_moves && R2 <= R;",
     "C: free move may exceed max(g, floor)"),
    ("_best_first.c", "int free_move = free_moves && peak <= cap && R2 <= R;", "int free_move = free_moves && peak <= cap;",
     "C: free move may leave more bytes resident"),
    ("_best_first.c", "if (s2 >= 0 && c.g[s2] <= g2) continue;", "if (s2 >= 0) continue;",
     "C: a set reached again at a lower peak keeps its first path"),
    ("_best_first.c", "pending = (mk[w] & ~(S[w] | (w == wv ? bv : 0))) != 0;", "pending = (mk[w] & ~S[w]) != 0;",
     "C: tensors read last by an op live on after its step"),
    ("_best_first.c", "if (!offered[c->lazy_fork[k]]) {", "if (0) {", "C: no run of the remaining slices"),
    ("_best_first.c", "for (int q = len - 1; q >= 0; q--) {", "for (int q = 0; q < len; q++) {",
     "C beam: the moves replayed back to front"),
    ("_best_first.c", "if (ua[w] != ub[w]) return ua[w] < ub[w];", "if (ua[w] != ub[w]) return ua[w] > ub[w];",
     "C beam: ties kept in another order than beam.py's"),
    # bounds/mincut.py: the min-cut bound
    ("bounds/mincut.py", "if after:\n                    forced.append(t)\n                    continue",
     "forced.append(t)\n                continue", "cut bound: live-before tensors forced even if they die"),
    ("bounds/mincut.py", "if after:\n                    size_arcs[t] = [arc(idx[writer], 1, s)]",
     "if True:\n                    size_arcs[t] = [arc(idx[writer], 1, s)]", "cut bound: written tensors always survive"),
    ("bounds/mincut.py", "for t in forced if t not in model.touch[v])",
     "for t in forced)", "cut bound: forced tensors v touches counted twice"),
    ("bounds/mincut.py", "flow.set_arc_capacity(a, 0 if on else model.size[t])",
     "flow.set_arc_capacity(a, model.size[t])",
     "cut bound: v's own tensors counted twice"),
    # bounds/branching.py: the branching bound; dives.py: the dives' bound
    ("bounds/branching.py", "for pair in ((u, v), (v, u)):", "for pair in ((v, u),):",
     "branch bound: only the branch that breaks the cheapest cut"),
    ("bounds/branching.py", "heapq.heappush(heap, (max(r[0], bound)", "heapq.heappush(heap, (max(r[0], bound) + 16",
     "branch bound: a leaf's bound above its cuts"),
    ("dives.py", "proven = max(proven, min(r.lower_bound, ub))", "proven = max(proven, B)",
     "dives: the trial budget taken as a bound"),
    ("beam.py", "if upred[j] & ~U2 == 0 and not", "if not", "beam: a unit ready before its predecessors ran"),
    ("beam.py", "for ks in reversed(seq)", "for ks in seq", "beam: the moves read back to front"),
    # model.py: the lower bound, the last step, and when TFLite's in-place sharing is static
    ("model.py", "if after == self.full:\n            live += self.final_only",
     "if True:\n            live += self.final_only", "untouched graph outputs at every step"),
    ("model.py", "if src in outputs or src in inputs:\n                continue", "pass",
     "in-place: graph inputs and outputs shared"),
    ("model.py", "if src in zeroed or sizes[src] < sizes[dst]:", "if src in zeroed:",
     "in-place: a smaller input shared"),
    ("model.py", "if tuple(cons) != (i,):", "if False:", "in-place: shared even if other ops read the input"),
    ("model.py", "if src in zeroed or sizes[src] < sizes[dst]:", "if sizes[src] < sizes[dst]:",
     "in-place: a shared input shared again"),
]

# Wrong parts added the way a new bound or stage is (one entry in bounds.PIECE_BOUNDS or
# stages.STAGES), with no source edited: a plugin registers them in the child before the tests
# run. The tests check every registered bound and every stage's answers, so these must fail too.
# (Python run in the child, what it registers.)
REGISTERED = [
    ("bounds.PIECE_BOUNDS += (LowerBound('too high', lambda pc, q: static_lower_bound(pc) + 16, every_piece=True),)",
     "a lower bound 16 bytes too high (sanity check of the harness)"),
    ("stages.STAGES['auto'] = (Stage('overclaim', lambda pc, known, until, ctx: known.raised(known.peak)),"
     " *stages.STAGES['auto'])",
     "a stage that claims the best order so far is optimal"),
]
REGISTRATION_PLUGIN = """
from tpu_pipeline.toolchain.schedule import bounds, stages
from tpu_pipeline.toolchain.schedule.bounds import LowerBound
from tpu_pipeline.toolchain.schedule.bounds.static import static_lower_bound
from tpu_pipeline.toolchain.schedule.stages import Stage
"""
# Not here: the switches of ScheduleParams. Each turns off a part that is sound on its own, so no
# setting of them is a wrong scheduler; check_schedule runs the exact search with each of fusion,
# cuts, free moves and the min-cut bound off, and the ablation tables in tools/bench_*.py toggle them.


def _mutations():
    out = [pytest.param([], "", id="control: no mutation")]
    for k, (fname, old, new, what) in enumerate(MUTATIONS):
        if what is None:
            continue
        group = [(fname, old, new)]
        if k + 1 < len(MUTATIONS) and MUTATIONS[k + 1][3] is None:
            group.append(MUTATIONS[k + 1][:3])
        out.append(pytest.param(group, "", id=f"{fname}:{what}"))
    out += [pytest.param([], code, id=f"registered:{what}") for code, what in REGISTERED]
    return out


ROOT = Path(__file__).resolve().parent.parent


def apply_mutation(pkg: Path, group) -> list[str]:
    """Apply one mutation to the copy at `pkg`; returns 'file:line' of each edit."""
    where = []
    for fname, old, new in group:
        path = pkg / "tpu_pipeline" / "toolchain" / "schedule" / fname
        text = path.read_text()
        assert text.count(old) >= 1, f"mutation no longer applies: {fname}: {old!r}"
        line = text[: text.index(old)].count("\n") + 1
        where.append(f"{fname}:{line}")
        path.write_text(text.replace(old, new, 1))
    return where


@pytest.mark.slow
@pytest.mark.parametrize("group, registration", _mutations())
def test_every_mutation_is_caught(group, registration, tmp_path):
    """Run the fast tests of this module and of test_schedule_branches.py (the forks, bodies and
    lazy slices) on a mutated copy of the package (the shared tree is never touched), or with a
    wrong part registered: they must fail."""
    shutil.copytree(ROOT / "tpu_pipeline", tmp_path / "tpu_pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    where = apply_mutation(tmp_path, group)
    plugin = []
    if registration:
        (tmp_path / "schedule_registration.py").write_text(REGISTRATION_PLUGIN + registration + "\n")
        plugin, where = ["-p", "schedule_registration"], [registration]
    # the mutated toolchain first; the checkout after it, for `tests.` imports between the modules
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), SCHEDULE_MUTATION_RUN="1")
    probe = subprocess.run([sys.executable, "-c", "import tpu_pipeline.toolchain as t; print(t.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert probe.stdout.startswith(str(tmp_path)), probe.stdout + probe.stderr
    proc = subprocess.run([sys.executable, "-m", "pytest", str(Path(__file__)),
                           str(Path(__file__).with_name("test_schedule_branches.py")),
                           str(Path(__file__).with_name("test_schedule_fusion_witnesses.py")), "-x", "-q", "-p", "no:cacheprovider",
                           *plugin, "-m", "not slow", "--no-header", "-rf"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1800)
    failed = [ln for ln in proc.stdout.splitlines() if ln.startswith("FAILED")]
    print(where, failed)
    if not group and not registration:
        assert proc.returncode == 0, proc.stdout[-3000:]
        return
    assert proc.returncode == 1 and failed, f"mutation at {where} survived:\n{proc.stdout[-3000:]}"

"""The scheduler against brute force on random small DAGs, and its invariants."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpu_pipeline.toolchain.ir import Graph, Op, Tensor
from tpu_pipeline.toolchain.memory import lifetimes, order_free_lower_bound
from tpu_pipeline.toolchain.schedule import build_model, schedule
from tpu_pipeline.toolchain.schedule import heuristics
from tpu_pipeline.toolchain.schedule.cpsat import cpsat_piece
from tpu_pipeline.toolchain.schedule.bounds.static import model_lower_bound, static_lower_bound
from tpu_pipeline.toolchain.schedule.dp import best_first, bisect_budget
from tpu_pipeline.toolchain.schedule.fusion import fuse
from tpu_pipeline.toolchain.schedule.model import bits
from tpu_pipeline.toolchain.schedule.divide import pieces
from tpu_pipeline.toolchain.schedule.problem import Piece
from helpers.oracle import Oracle, topological_orders


def random_graph(draw, max_ops=8, reshape=False) -> Graph:
    """A random single-subgraph DAG: multi-output ops, dead outputs, scratch, graph inputs read
    late, graph outputs written early."""
    n = draw(st.integers(2, max_ops))
    tensors: list[Tensor] = []

    def new_tensor(size):
        tensors.append(Tensor(len(tensors), f"t{len(tensors)}", "int8", (size,)))
        return len(tensors) - 1

    sizes = st.sampled_from([16, 32, 48, 64, 100, 128, 256, 512])
    inputs = [new_tensor(draw(sizes)) for _ in range(draw(st.integers(1, 2)))]
    available = list(inputs)
    ops = []
    for i in range(n):
        k = draw(st.integers(1, min(3, len(available))))
        ins = draw(st.lists(st.sampled_from(available), min_size=1, max_size=k, unique=True))
        opcode = draw(st.sampled_from(["ADD", "CONV_2D", "TRANSPOSE_CONV"] + (["RESHAPE"] * 2 if reshape else [])))
        n_out = 1 if opcode == "RESHAPE" else draw(st.integers(1, 2))
        outs = tuple(new_tensor(draw(sizes)) for _ in range(n_out))
        ops.append(Op(opcode, tuple(ins), outs, source=i))
        available.extend(outs)
    consumed = {t for op in ops for t in op.inputs}
    produced = [t for op in ops for t in op.outputs]
    outputs = [t for t in produced if t not in consumed and draw(st.booleans())]
    if not outputs:
        outputs = [produced[-1]]
    extra = draw(st.lists(st.sampled_from(produced), max_size=2, unique=True))
    outputs = list(dict.fromkeys(outputs + extra))
    return Graph(tuple(tensors), tuple(ops), tuple(inputs), tuple(outputs), "random")


@st.composite
def graphs(draw, max_ops=7, reshape=False):
    return random_graph(draw, max_ops, reshape)


def brute_force(graph: Graph, semantics="tflm") -> int:
    """The optimum by the independent oracle (tests/helpers/oracle.py), not the scheduler's model."""
    return Oracle(graph, semantics).optimum()


FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(graphs(), st.sampled_from(["tflm", "tflite"]), st.randoms(use_true_random=False))
def test_model_equals_lifetimes(graph, semantics, rnd):
    model = build_model(graph, semantics)
    orders = list(itertools.islice(topological_orders(graph), 50))
    for order in rnd.sample(orders, min(5, len(orders))):
        lt = lifetimes(graph, order, semantics)
        assert model.profile(order) == lt.live_bytes()
        assert model.peak(order) == lt.peak


@FAST
@given(graphs())
def test_dp_equals_brute_force(graph):
    best = brute_force(graph)
    res = schedule(graph, method="dp", time_limit=20)
    assert graph.is_topological(res.order)
    assert res.peak == lifetimes(graph, res.order).peak == best
    assert res.proven_optimal and res.lower_bound == best
    assert res.peak <= lifetimes(graph).peak


@FAST
@given(graphs())
def test_raw_dp_and_budget_bisection_equal_brute_force(graph):
    """Without fusion or cuts: the plain DP over all ops, and the paper's bisection."""
    best = brute_force(graph)
    model = build_model(graph)
    piece = Piece(model, [(v,) for v in range(model.n)])
    ub = model.peak(heuristics.stored(model))
    r = best_first(piece, ub + 1)
    assert r.complete and r.order is not None and r.peak == best
    assert model.peak(r.order) == best
    b = bisect_budget(piece, model_lower_bound(model), heuristics.stored(model), ub)
    assert b.complete and b.peak == best and model.peak(b.order) == best


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(max_ops=7))
def test_cpsat_equals_brute_force(graph):
    best = brute_force(graph)
    model = build_model(graph)
    piece = Piece(model, [(v,) for v in range(model.n)])
    ub_order = heuristics.stored(model)
    r = cpsat_piece(piece, ub_order, model.peak(ub_order) + 1, 0, time_limit=20)
    assert r.complete and r.order is not None
    assert graph.is_topological(r.order)
    assert r.peak == best == lifetimes(graph, r.order).peak
    res = schedule(graph, method="cpsat", time_limit=20)
    assert res.peak == best and res.proven_optimal


@FAST
@given(graphs())
def test_cut_lower_bound_is_valid(graph):
    from tpu_pipeline.toolchain.schedule.bounds.mincut import cut_lower_bound

    best = brute_force(graph)
    model = build_model(graph)
    piece = Piece(model, [(v,) for v in range(model.n)])
    lb = cut_lower_bound(piece)
    assert lb <= best
    # and in context: the ops after a prefix, against brute force over the suffix
    orders = list(topological_orders(graph))
    prefix = orders[0][: len(orders[0]) // 2]
    S = sum(1 << v for v in prefix)
    rest = [(v,) for v in range(model.n) if not (S >> v) & 1]
    sub = Piece(model, rest, S)
    sub_best = min(model.peak(o[len(prefix):], S) for o in orders if set(o[:len(prefix)]) == set(prefix))
    assert cut_lower_bound(sub) <= sub_best
    assert static_lower_bound(sub) <= sub_best


@FAST
@given(graphs(max_ops=8))
def test_fusion_and_cuts_keep_the_optimum(graph):
    model = build_model(graph)
    units = fuse(model)
    assert sorted(v for u in units for v in u) == list(range(model.n))
    plist = pieces(model, units)
    assert sorted(k for p in plist for k in p) == list(range(len(units)))
    best = brute_force(graph)
    # the best order that keeps every unit contiguous is still optimal
    unit_orders = []
    for order in topological_orders(graph):
        pos = {v: i for i, v in enumerate(order)}
        if all(pos[u[r]] == pos[u[0]] + r for u in units for r in range(len(u))):
            unit_orders.append(order)
    assert unit_orders
    assert min(model.peak(o) for o in unit_orders) == best


@FAST
@given(graphs(reshape=True))
def test_tflite_semantics(graph):
    res = schedule(graph, time_limit=20, semantics="tflite")
    assert res.peak == lifetimes(graph, res.order, "tflite").peak
    assert res.peak <= lifetimes(graph, None, "tflite").peak
    assert res.lower_bound <= res.peak
    if res.proven_optimal:
        assert res.peak == brute_force(graph, "tflite")


@FAST
@given(graphs())
def test_deterministic_and_bounds(graph):
    a = schedule(graph, time_limit=20)
    b = schedule(graph, time_limit=20)
    assert a.order == b.order and a.peak == b.peak and a.lower_bound == b.lower_bound
    assert order_free_lower_bound(graph) <= a.lower_bound <= a.peak


def test_baselines_are_topological():
    from conftest import EXAMPLE
    from tpu_pipeline.toolchain.loader import load

    if not EXAMPLE.exists():
        pytest.skip("example model missing")
    _, graph = load(EXAMPLE)
    model = build_model(graph)
    for name, fn in heuristics.BASELINES.items():
        order = fn(model)
        assert graph.is_topological(order), name


def test_errors():
    from tpu_pipeline.toolchain.errors import UsageError

    g = Graph((Tensor(0, "a", "int8", (4,)), Tensor(1, "b", "int8", (4,))),
              (Op("RELU", (0,), (1,)),), (0,), (1,))
    with pytest.raises(UsageError):
        schedule(g, method="nope")
    with pytest.raises(UsageError):
        schedule(g, semantics="nope")
    r = schedule(g)
    assert r.order == (0,) and r.proven_optimal


def test_c_structs_match_their_ctypes_mirrors():
    """The C searches take the problem and their limits and results as structs passed by pointer
    (_best_first.c); the ctypes mirrors in native_search.py must name the same fields, in the
    same order, at the same offsets and sizes, in a struct of the same size."""
    import ctypes

    from tpu_pipeline.toolchain.schedule import native_search

    if not native_search.available():
        pytest.skip("no C compiler: the C searches are not built here")
    for k, mirror in enumerate(native_search.STRUCTS):
        fields, size = native_search.c_layout(k)
        assert fields == [(name, getattr(mirror, name).offset, getattr(mirror, name).size)
                          for name, _ in mirror._fields_], mirror.__name__
        assert size == ctypes.sizeof(mirror), mirror.__name__


def test_schedule_params_are_checked():
    """Every field of ScheduleParams is checked when the record is made; parts are switched off
    by their names only."""
    from tpu_pipeline.toolchain.errors import UsageError
    from tpu_pipeline.toolchain.schedule import ScheduleParams
    from tpu_pipeline.toolchain.schedule.stages import Stage

    for bad in (dict(beam_share=0), dict(beam_share=1.5), dict(beam_width=0), dict(beam_width=2.5),
                dict(fusion="yes"), dict(native=1), dict(cpsat_min_left=-1), dict(dive_gap_divisor=True)):
        with pytest.raises(UsageError):
            ScheduleParams(**bad)
    assert ScheduleParams().without("beams", "dives") == ScheduleParams(beams=False, dives=False)
    with pytest.raises(UsageError, match="unknown scheduler part 'beam'"):
        ScheduleParams().without("beam")  # the old ablate name
    with pytest.raises(ValueError):
        Stage("mine", lambda piece, known, until, ctx: known, switch="no_such_switch")
    with pytest.raises(ValueError):
        Stage("mine", lambda piece, known, until, ctx: known, share="beam_width")
    g = Graph((Tensor(0, "a", "int8", (4,)), Tensor(1, "b", "int8", (4,))), (Op("RELU", (0,), (1,)),), (0,), (1,))
    with pytest.raises(UsageError):
        schedule(g, params={"fusion": False})


def largest_tensor(piece, query) -> int:
    """A trivial lower bound (docs/schedule.md): each tensor an op of the piece touches is live at
    that op's step, together with what is live at every step."""
    model = piece.model
    return model.const_all + max((model.size[t] for v in bits(piece.ops) for t in model.touch[v]), default=0)


def test_a_new_lower_bound_is_one_registration(monkeypatch):
    """The worked example of docs/schedule.md: a new bound is a function plus one entry in
    bounds.PIECE_BOUNDS; the scheduler runs it on the pieces and reports what it proved."""
    from conftest import EXAMPLE
    from tpu_pipeline.toolchain.loader import load
    from tpu_pipeline.toolchain.schedule import bounds
    from tpu_pipeline.toolchain.schedule.bounds import LowerBound

    monkeypatch.setattr(bounds, "PIECE_BOUNDS", (*bounds.PIECE_BOUNDS,
                                                 LowerBound("largest tensor", largest_tensor, every_piece=True)))
    _, graph = load(EXAMPLE)
    s = schedule(graph, time_limit=20)
    model = build_model(graph)
    assert dict(s.bounds)["largest tensor"] == model.const_all + max(model.size) > 0
    assert s.to_json()["bounds"]["largest tensor"] == dict(s.bounds)["largest tensor"]
    assert s.proven_optimal and set(dict(s.bounds)) == {"static", "min-cut", "last-use", "largest tensor"}


def test_a_new_stage_is_one_registration(monkeypatch):
    """The other worked example: a stage is a function of (piece, known, until, ctx) plus one
    entry in a method's stages.STAGES; it sees what is known about each piece left open by the
    bounds, and what it returns is what the next stage starts from."""
    from conftest import EXAMPLE
    from tpu_pipeline.toolchain.loader import load
    from tpu_pipeline.toolchain.schedule import stages

    seen = []

    def greedy_by_resident_bytes(piece, known, until, ctx):
        order = heuristics.greedy(piece.model, piece.units, piece.S0, piece.R0, key="resident")
        seen.append((known.peak, piece.evaluate(known.order), piece.evaluate(order)))
        return known.better(order, piece.evaluate(order))

    monkeypatch.setitem(stages.STAGES, "auto", (stages.Stage("greedy by resident bytes", greedy_by_resident_bytes),
                                                *stages.STAGES["auto"]))
    _, graph = load(EXAMPLE)
    s = schedule(graph, time_limit=20)
    assert seen and all(peak == evaluated for peak, evaluated, _ in seen)
    assert s.proven_optimal and s.peak == schedule(graph, time_limit=20).peak


def test_cpsat_bound_just_under_an_integer_still_proves():
    """CP-SAT reports this graph's optimum (752 B, TRANSPOSE_CONV with 400 B of scratch) with the
    objective and bound 751.9999999999999: truncated to 751, the bound no longer matched the
    peak and the optimum went unproven. Found by test_cpsat_equals_brute_force."""
    sizes = [64, 16, 48, 16, 16, 64, 16, 512, 100, 48]
    g = Graph(tuple(Tensor(i, f"t{i}", "int8", (s,)) for i, s in enumerate(sizes)),
              (Op("ADD", (0,), (2,)), Op("ADD", (0,), (3,)), Op("ADD", (3,), (4, 5)), Op("ADD", (0,), (6, 7)),
               Op("TRANSPOSE_CONV", (2, 4), (8, 9))), (0, 1), (5, 7), "random")
    model = build_model(g)
    piece = Piece(model, [(v,) for v in range(model.n)])
    ub_order = heuristics.stored(model)
    r = cpsat_piece(piece, ub_order, model.peak(ub_order) + 1, 0, time_limit=20)
    assert r.complete and r.peak == r.lower_bound == brute_force(g) == 752


def _forty_adds(seed: int) -> Graph:
    """A random chain-like DAG of 40 ADDs (each reads one or two of the last six tensors) whose
    exact search takes more than a moment: seed 19 needs about 1,500 states."""
    import random

    rnd, tensors, ops = random.Random(seed), [], []

    def new(size):
        tensors.append(Tensor(len(tensors), f"t{len(tensors)}", "int8", (size,)))
        return len(tensors) - 1

    available = [new(64)]
    for i in range(40):
        ins = tuple(rnd.sample(available[-6:], min(len(available[-6:]), rnd.randint(1, 2))))
        outs = (new(rnd.choice([16, 32, 48, 64, 100, 128, 256, 512])),)
        ops.append(Op("ADD", ins, outs, source=i))
        available.extend(outs)
    consumed = {t for op in ops for t in op.inputs}
    outputs = tuple(t for op in ops for t in op.outputs if t not in consumed)
    return Graph(tuple(tensors), tuple(ops), (0,), outputs, "random")


def test_a_short_search_bounded_by_states_does_not_depend_on_the_clock():
    """fit's realise asks the scheduler for a short exact search bounded by its states alone
    (`timed` off), so that the same question gets the same order on a fast or a loaded
    machine. Given no share of the time at all, the untimed search still finishes with the full
    search's proven peak, where the timed one is cut; a cap of one state cuts the untimed one."""
    from tpu_pipeline.toolchain.schedule.params import ScheduleParams

    graph = _forty_adds(19)
    full = schedule(graph, time_limit=20)
    only_short = ("branch_bound", "beams", "dives", "full_search")
    no_share = ScheduleParams(try_share=1e-9)
    untimed = schedule(graph, time_limit=20, params=no_share.without("timed", *only_short))
    assert full.proven_optimal and untimed.proven_optimal and untimed.peak == full.peak
    timed = schedule(graph, time_limit=20, params=no_share.without(*only_short))
    assert not timed.proven_optimal and timed.peak > full.peak
    one_state = ScheduleParams(try_states=1).without("timed", *only_short)
    assert not schedule(graph, time_limit=20, params=one_state).proven_optimal

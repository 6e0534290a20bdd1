"""The partitioner: CP-SAT against brute force, Coral's heuristic as libcoral defines it."""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from tpu_pipeline.toolchain.cost import EdgeTpuCostModel
from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.toolchain.errors import InfeasibleError, UsageError
from tpu_pipeline.toolchain.ir import Graph, Op, Tensor
from tpu_pipeline.toolchain.loader import load
from tpu_pipeline.toolchain.partition import (PartitionProblem, baseline_partition, coral_heuristic, partition,
                                 refine_by_simulation, solve)
from tpu_pipeline.toolchain.partition import lattice
from tpu_pipeline.toolchain.partition.heuristic import coral_parameter_sizes, coral_topological_sort
from tests.conftest import FIXTURES
from helpers.models import EDGETPU


@pytest.fixture(scope="module")
def toy_device(tmp_path_factory):
    p = tmp_path_factory.mktemp("dev") / "toy.toml"
    # small SRAM so that overflow matters; slow link so that traffic matters
    p.write_text(EDGETPU.replace("param_sram_bytes = 1000", "param_sram_bytes = 300")
                 .replace("host_bandwidth_bytes_per_s = 1e9", "host_bandwidth_bytes_per_s = 1e7"))
    return load_device(p)


def make_graph(edges, n_ops, params, sizes) -> Graph:
    """Op i reads the outputs of its predecessors (the graph input if none) and one constant of
    params[i] bytes, and writes an int8 activation of sizes[i] bytes. Sinks are graph outputs."""
    tensors = [Tensor(0, "input", "int8", (1, 8))]
    preds = {i: sorted({u for u, v in edges if v == i}) for i in range(n_ops)}
    out_of = {}
    for i in range(n_ops):
        out_of[i] = len(tensors)
        tensors.append(Tensor(len(tensors), f"act{i}", "int8", (1, sizes[i])))
    ops = []
    for i in range(n_ops):
        ins = [out_of[u] for u in preds[i]] or [0]
        if params[i]:
            w = len(tensors)
            tensors.append(Tensor(w, f"w{i}", "int8", (params[i],), buffer=w,
                                  data=np.ones(params[i], dtype=np.uint8)))
            ins.append(w)
        ops.append(Op("ADD", tuple(ins), (out_of[i],)))
    has_succ = {u for u, _ in edges}
    outputs = tuple(out_of[i] for i in range(n_ops) if i not in has_succ)
    return Graph(tuple(tensors), tuple(ops), (0,), outputs, "toy")


# Exact: no tolerance, and a budget of candidates (CANDIDATES_PER_SECOND x time_limit) larger than
# every assignment of these graphs, so the refinement can finish its proof.
EXACT = {"time_limit": 1000.0, "gap": 0}


@contextlib.contextmanager
def exact_step(method: str):
    """`latency`'s exact step: "downsets" (the DP, wherever the graph has few enough down-sets) or
    "cpsat" (the fallback for graphs with too many), forced by the down-set limit."""
    old = lattice.MAX_DOWNSETS
    lattice.MAX_DOWNSETS = old if method == "downsets" else 0
    try:
        yield
    finally:
        lattice.MAX_DOWNSETS = old


@st.composite
def dags(draw, max_ops=7):
    n = draw(st.integers(3, max_ops))
    edges = set()
    for v in range(1, n):
        for u in range(v):
            if draw(st.booleans()) and draw(st.booleans()):
                edges.add((u, v))
    params = [draw(st.sampled_from([0, 50, 120, 200, 400])) for _ in range(n)]
    sizes = [draw(st.sampled_from([16, 64, 256, 1024])) for _ in range(n)]
    return make_graph(sorted(edges), n, params, sizes)


def brute_force(problem: PartitionProblem, n: int):
    best = {}
    for stages in itertools.product(range(n), repeat=problem.n_ops):
        if not problem.is_valid(stages, n):
            continue
        obj = problem.objectives(stages, n)
        for name, key in (("latency", (obj["period_ps"], obj["sum_stage_ps"])),
                          ("1-2-3", (obj["max_param_bytes"], obj["offchip_bytes"], obj["max_comm_bytes"])),
                          ("2-1-3", (obj["offchip_bytes"], obj["max_param_bytes"], obj["max_comm_bytes"])),
                          ("1-3", (obj["max_param_bytes"], obj["max_comm_bytes"]))):
            if name not in best or key < best[name]:
                best[name] = key
    return best


def sim_brute_force(problem: PartitionProblem, n: int) -> int:
    """The smallest simulated period over every valid assignment (simulating only those whose
    bound is below the best found: the simulated period is never below the bound)."""
    cands = []
    for stages in itertools.product(range(n), repeat=problem.n_ops):
        if problem.is_valid(stages, n):
            cands.append((problem.objectives(stages, n)["period_ps"], stages))
    best = None
    for bound, stages in sorted(cands):
        if best is not None and bound >= best:
            break
        s = problem.evaluate(stages, n).period_ps
        assert s >= bound
        best = s if best is None else min(best, s)
    return best


@settings(max_examples=25, deadline=None)
@given(dags(), st.integers(2, 3))
def test_cpsat_matches_brute_force_and_never_loses_to_the_heuristic(toy_device, graph, n):
    problem = PartitionProblem(graph, EdgeTpuCostModel(toy_device))
    if n > problem.max_stages():
        with pytest.raises(InfeasibleError):
            partition(graph, n, device=toy_device)
        return
    best = brute_force(problem, n)
    for strategy, names in (("latency", ("period_ps", "sum_stage_ps")),
                            ("1-2-3", ("max_param_bytes", "offchip_bytes", "max_comm_bytes")),
                            ("2-1-3", ("offchip_bytes", "max_param_bytes", "max_comm_bytes")),
                            ("1-3", ("max_param_bytes", "max_comm_bytes"))):
        p = partition(graph, n, device=toy_device, strategy=strategy, **EXACT)
        assert problem.is_valid(p.stages, n)
        assert p.proven_optimal
        if strategy == "latency":
            # the solver's bound is the brute-force optimum of the bound; the answer is then the
            # simulator's optimum (refine_by_simulation), which may trade the bound's tie-break
            assert p.bounds["period_ps"] == best["latency"][0]
            assert p.sim_proven and p.cost.period_ps == sim_brute_force(problem, n) == p.period_lower_bound_ps
            if problem.is_valid(p.baseline.stages, n):
                assert p.cost.period_ps <= p.baseline.cost.period_ps
            continue
        assert tuple(p.objectives[k] for k in names) == best[strategy], strategy


@pytest.fixture(scope="module")
def link_device(tmp_path_factory):
    p = tmp_path_factory.mktemp("dev") / "link.toml"
    # tiny invoke cost, slow link, streaming under compute: the shared link sets most periods
    p.write_text(EDGETPU.replace("param_sram_bytes = 1000", "param_sram_bytes = 300")
                 .replace("host_bandwidth_bytes_per_s = 1e9", "host_bandwidth_bytes_per_s = 1e6")
                 .replace("invoke_overhead_s = 1e-3", "invoke_overhead_s = 1e-5\nstream_overlaps_compute = 1"))
    return load_device(p)


@pytest.fixture(scope="module")
def trade_device(tmp_path_factory):
    p = tmp_path_factory.mktemp("dev") / "trade.toml"
    # slow compute and a slow link: the assignment with the smallest slowest stage moves more
    # bytes than the one with the least link work, so the exact step must trade the two
    p.write_text(EDGETPU.replace("param_sram_bytes = 1000", "param_sram_bytes = 300")
                 .replace("host_bandwidth_bytes_per_s = 1e9", "host_bandwidth_bytes_per_s = 1e6")
                 .replace("invoke_overhead_s = 1e-3", "invoke_overhead_s = 1e-5\nstream_overlaps_compute = 1")
                 .replace("peak_ops_per_s = 2e9", "peak_ops_per_s = 2e6"))
    return load_device(p)


@pytest.mark.parametrize("method", ["downsets", "cpsat"])
@pytest.mark.parametrize("device", ["link_device", "trade_device"])
@settings(max_examples=20, deadline=None)
@given(dags(), st.integers(2, 3))
def test_shared_link_bound_and_simulated_period_against_exhaustive_search(request, device, method, graph, n):
    link_device = request.getfixturevalue(device)
    problem = PartitionProblem(graph, EdgeTpuCostModel(link_device))
    if n > problem.max_stages():
        return
    best = brute_force(problem, n)["latency"]
    with exact_step(method):
        p = partition(graph, n, device=link_device, **EXACT)
    opt = sim_brute_force(problem, n)
    assert p.method == method
    assert p.primary_proven and p.bounds["period_ps"] == best[0]
    assert p.proven_optimal and p.bounds["sum_stage_ps"] == best[1]  # the tie-break (the answer may trade it)
    assert p.sim_proven and p.cost.period_ps == opt == p.period_lower_bound_ps
    # from the assignment with the largest bound, stopped after two candidates: its lower bound
    # must still hold
    worst = max((st for st in itertools.product(range(n), repeat=problem.n_ops) if problem.is_valid(st, n)),
                key=lambda st: problem.objectives(st, n)["period_ps"])
    r = refine_by_simulation(problem, n, worst, best[0], 10.0, max_candidates=2)
    assert r.lower_bound_ps <= opt <= r.period_ps
    if problem.is_valid(p.baseline.stages, n):
        assert p.cost.period_ps <= p.baseline.cost.period_ps


@pytest.mark.parametrize("method", ["downsets", "cpsat"])
@settings(max_examples=15, deadline=None)
@given(dags(), st.integers(2, 3), st.sampled_from([0.01, 0.05, 0.3]))
def test_a_gap_tolerance_never_claims_more_than_it_proved(link_device, method, graph, n, tol):
    """With a tolerance the search may stop early, but its lower bound must hold and an answer
    said to be within the tolerance must be within it of the exhaustive optimum."""
    problem = PartitionProblem(graph, EdgeTpuCostModel(link_device))
    if n > problem.max_stages():
        return
    opt = sim_brute_force(problem, n)
    with exact_step(method):
        p = partition(graph, n, device=link_device, time_limit=10.0, gap=tol)
    assert p.period_lower_bound_ps <= opt <= p.cost.period_ps
    assert p.gap is not None and p.gap_limit == tol
    if p.sim_proven:
        assert p.cost.period_ps == opt and p.gap == 0
    if p.gap <= tol:
        assert p.cost.period_ps <= (1 + tol) * opt


def test_a_loose_tolerance_stops_at_the_first_answer_within_it():
    _, g = load(FIXTURES.parent.parent / "examples" / "randwire_small_int8.tflite")
    with exact_step("cpsat"):
        loose = partition(g, 4, time_limit=10.0, gap=0.5)
    assert loose.gap is not None and loose.gap <= 0.5
    assert loose.sim_candidates == 1 and "within gap" in loose.stopped_by  # no proof searched for
    # the lower bound it reports is CP-SAT's proven bound, not the value it stopped at
    assert loose.period_lower_bound_ps == loose.bounds["period_ps"] < loose.objectives["period_ps"]
    exact = partition(g, 4, time_limit=10.0, gap=0)  # the down-set DP: P proven at once
    assert exact.method == "downsets" and exact.primary_proven
    assert exact.bounds["period_ps"] == exact.objectives["period_ps"] >= loose.bounds["period_ps"]
    # the simulated period stays 3.8 % above every assignment's P (stages contending for the
    # link): the refinement stops at its candidate budget, not at a deadline
    assert exact.refined_by == "candidates" and exact.sim_candidates == 40
    assert exact.period_lower_bound_ps >= exact.bounds["period_ps"] and 0.01 < exact.gap < 0.05


def test_boundary_tensor_is_paid_at_every_consuming_segment(toy_device):
    # 0 -> 1 -> 2 -> 3 and 0 -> 3: act0 (1024 B) skips stage 2 and is read in stages 1 and 3
    g = make_graph([(0, 1), (1, 2), (2, 3), (0, 3)], 4, [0, 0, 0, 0], [1024, 16, 16, 16])
    prob = PartitionProblem(g, EdgeTpuCostModel(toy_device))
    inb, outb = prob.traffic((0, 1, 2, 3), 4)
    assert inb == [8, 1024 + 0 + 0, 16, 16 + 1024]  # graph input 8 B into stage 0
    assert outb == [1024, 16, 16, 16]               # act0 leaves stage 0 once; act3 is the graph output
    ifaces = prob.interfaces((0, 1, 2, 3), 4)
    names = [[g.tensors[t].name for t in i.inputs] for i in ifaces]
    assert names == [["input"], ["act0"], ["act1"], ["act0", "act2"]]
    assert [[g.tensors[t].name for t in i.outputs] for i in ifaces] == [["act0"], ["act1"], ["act2"], ["act3"]]


def test_n_out_of_range_and_infeasible(toy_device):
    g = make_graph([(0, 1), (1, 2), (0, 2)], 3, [10, 10, 10], [16, 16, 16])
    for bad in (0, -1, 4):
        with pytest.raises(UsageError, match="between 1 and the number of ops"):
            partition(g, bad, device=toy_device)
    p = partition(g, 3, device=toy_device)
    assert p.stages == (0, 1, 2)
    # two sinks: both must be in the last segment, so 3 ops allow only 2 segments
    g2 = make_graph([(0, 1), (0, 2)], 3, [10, 10, 10], [16, 16, 16])
    with pytest.raises(InfeasibleError, match="at most 2 segments"):
        partition(g2, 3, device=toy_device)
    # co-location of consumers (the paper's data-dependency constraint) can make n infeasible
    g3 = make_graph([(0, 1), (0, 2), (1, 2)], 3, [10] * 3, [16] * 3)
    assert partition(g3, 3, device=toy_device).proven_optimal
    with pytest.raises(InfeasibleError, match="co-located"):
        partition(g3, 3, device=toy_device, colocate=True)


def test_heuristic_is_libcorals_parameter_count_partitioner():
    # chain of 6 ops with parameters 100, 100, 100, 300, 100, 100 (total 800); n=3: target 267
    g = make_graph([(i, i + 1) for i in range(5)], 6, [100, 100, 100, 300, 100, 100], [16] * 6)
    assert coral_parameter_sizes(g) == [100, 100, 100, 300, 100, 100]
    h = coral_heuristic(g, 3)
    # segment 0 takes 100+100 (a third op would reach 300 > 267); segment 1 meets the 300 op,
    # which alone exceeds the target: libcoral aborts there, we give it that op (and say so)
    assert h.stages == (0, 0, 1, 2, 2, 2)
    assert h.segment_param_bytes == (200, 100, 500)
    h2 = coral_heuristic(g, 2)  # target 401: 100+100+100 then the 300 op would overflow
    assert h2.stages == (0, 0, 0, 1, 1, 1) and h2.note == ""
    g3 = make_graph([(0, 1), (1, 2), (2, 3)], 4, [1000, 10, 10, 10], [16] * 4)
    assert "libcoral would abort" in coral_heuristic(g3, 3).note


def test_coral_topological_sort_visits_childless_nodes_last():
    # 0 -> 1 (childless), 0 -> 2 -> 3: libcoral pushes childless 1 to the bottom of the stack
    g = make_graph([(0, 1), (0, 2), (2, 3)], 4, [0] * 4, [16] * 4)
    order = coral_topological_sort(g)
    assert order[0] == 0 and order[-1] in (1, 3) and order.index(2) < order.index(3)
    # stack [0] -> pop 0: childless 1 to the bottom, 2 on top: [1, 2] -> pop 2: childless 3 to
    # the bottom: [3, 1] -> pop 1, pop 3
    assert order == [0, 2, 1, 3]


@pytest.mark.parametrize("name", ["tiny_irregular_int8", "multi_output_int8", "concat_conv_int8"])
def test_real_fixtures_are_proven_and_beat_or_tie_the_baseline(name):
    _, g = load(FIXTURES / f"{name}.tflite")
    for n in (2, 3):
        p = partition(g, n, time_limit=10.0, gap=0)
        assert p.proven_optimal
        assert len(set(p.stages)) == n
        assert p.cost.throughput_per_s >= p.baseline.cost.throughput_per_s
        b = baseline_partition(g, n)
        assert b.stages == p.baseline.stages


def test_solve_is_deterministic(toy_device):
    g = make_graph([(0, 1), (1, 2), (0, 3), (3, 4), (2, 4), (4, 5)], 6, [100, 300, 50, 200, 400, 10],
                   [64, 256, 16, 1024, 64, 16])
    prob = PartitionProblem(g, EdgeTpuCostModel(toy_device))
    a = solve(prob, 3, "1-2-3", 10.0)
    b = solve(prob, 3, "1-2-3", 10.0)
    assert a.stages == b.stages and a.proven_optimal


@settings(max_examples=20, deadline=None)
@given(dags(max_ops=8), st.integers(2, 4))
def test_contiguous_dp_is_the_best_cut_of_its_order(toy_device, graph, n):
    from tpu_pipeline.toolchain.partition.contiguous import best_contiguous
    problem = PartitionProblem(graph, EdgeTpuCostModel(toy_device))
    order = list(range(problem.n_ops))
    got = best_contiguous(problem, order, n)
    best = None
    for cuts in itertools.combinations(range(1, problem.n_ops), n - 1):
        bounds = (0, *cuts, problem.n_ops)
        stages = [0] * problem.n_ops
        for s in range(n):
            for q in range(bounds[s], bounds[s + 1]):
                stages[order[q]] = s
        if problem.is_valid(stages, n):
            o = problem.objectives(stages, n)
            key = (o["max_stage_ps"], o["sum_stage_ps"])  # the DP cuts on stage latency alone
            best = key if best is None or key < best else best
    if best is None:
        assert got is None
    else:
        o = problem.objectives(got, n)
        # the slowest stage is exact; the sum is only a tie-break (a prefix with a larger max but
        # a smaller sum can win overall, which this DP does not track)
        assert o["max_stage_ps"] == best[0] and o["sum_stage_ps"] >= best[1]


def test_profiling_partitioner_bisects_on_simulated_segment_latencies(tmp_path):
    from tpu_pipeline.toolchain.partition import profiled_partition
    p = tmp_path / "fast_link.toml"  # transfers negligible: a segment's latency is 1 ms + its compute
    p.write_text(EDGETPU.replace("host_bandwidth_bytes_per_s = 1e9", "host_bandwidth_bytes_per_s = 1e12"))
    dev = load_device(p)
    # a chain of 8 ops without parameters: even ops compute 2 ms (2e6-element ADDs), odd ones ~0
    g = make_graph([(i, i + 1) for i in range(7)], 8, [0] * 8, [2_000_000, 16] * 4)
    prob = PartitionProblem(g, EdgeTpuCostModel(dev))
    base = baseline_partition(g, 2, dev, prob)
    assert base.stages == (0,) * 7 + (1,)           # no parameters: the heuristic leaves one op behind
    assert base.cost.period_ps == pytest.approx(9.004e9, rel=1e-3)
    # bounds [1.002, 9.002] ms; target 5.002: segment 0 shrinks from 7 ops until 4 ops (2 heavy:
    # 5.0 ms) meet it, the last segment (5.0 ms) is below it -> upper 5.002; targets 3.002 and
    # 4.002 leave the last segment at 7 ms -> lower 4.002; 5.002 - 4.002 <= 1 ms: stop
    q = profiled_partition(g, 2, dev, prob)
    assert q.stages == (0, 0, 0, 0, 1, 1, 1, 1)
    assert q.cost.period_ps == pytest.approx(5.0e9, rel=1e-3)
    assert profiled_partition(g, 2, dev, prob).stages == q.stages   # deterministic
    # the full partitioner takes the profiled answer into account and is never slower than it
    r = partition(g, 3, device=dev, profiled=True)
    assert r.cost.period_ps <= min(r.baseline.cost.period_ps, r.profiled.cost.period_ps)
    assert r.profiled.cost.period_ps < r.baseline.cost.period_ps


# ---- the exact step over down-sets (lattice.py) ------------------------------------------------

def _chain_masks(stages, n):
    """D_0 .. D_{n-2}, V of an assignment, as bit masks."""
    return [sum(1 << v for v, s in enumerate(stages) if s <= k) for k in range(n)]


@settings(max_examples=25, deadline=None)
@given(dags(), st.integers(1, 3))
def test_downset_costs_are_the_cost_models_stage_costs(link_device, graph, n):
    """Every predecessor-closed set is listed once, and the stage costs of every pair of them
    (the matrices the DP runs on) are exactly the cost model's for every valid assignment:
    boundary tensors read by several segments, graph inputs read late, graph outputs."""
    problem = PartitionProblem(graph, EdgeTpuCostModel(link_device))
    if n > problem.max_stages():
        return
    masks = lattice.downsets(problem)
    closed = [d for d in range(1 << problem.n_ops)
              if all(d >> u & 1 for v in range(problem.n_ops) if d >> v & 1 for u in problem.preds[v])]
    assert sorted(masks) == closed and len(set(masks)) == len(masks)
    lat_ = lattice.Lattice(problem, masks)
    index = {d: i for i, d in enumerate(masks)}
    for stages in itertools.product(range(n), repeat=problem.n_ops):
        if not problem.is_valid(stages, n):
            continue
        ids = [0] + [index[d] for d in _chain_masks(stages, n)]
        costs = problem.stage_costs(stages, n)
        for k, sc in enumerate(costs):
            lat, link = lat_.pair_costs(np.array([ids[k]]), np.array([ids[k + 1]]))
            assert (int(lat[0, 0]), int(link[0, 0])) == (sc.latency_ps, sc.link_ps), (stages, k)


@settings(max_examples=40, deadline=None)
@given(dags(), st.integers(2, 3), st.floats(0, 1))
def test_chains_lists_every_assignment_below_a_limit_smallest_period_first(trade_device, graph, n, where):
    """The exact P (the bisection between the smallest slowest stage and the least link work)
    and the listing the refinement simulates, against every assignment."""
    problem = PartitionProblem(graph, EdgeTpuCostModel(trade_device))
    if n > problem.max_stages():
        return
    valid = {st_: problem.objectives(st_, n)["period_ps"]
             for st_ in itertools.product(range(n), repeat=problem.n_ops) if problem.is_valid(st_, n)}
    periods = sorted(set(valid.values()))
    limit = periods[int(where * (len(periods) - 1))]  # exactly some assignment's P: not listed
    lat_ = lattice.Lattice(problem, lattice.downsets(problem))
    chains = lattice.ChainProblem(lat_, n, max(valid.values()))
    assert chains.min_period()[0] == min(valid.values())
    slowest = min(problem.objectives(st_, n)["max_stage_ps"] for st_ in valid)
    assert lattice.ChainProblem(lat_, n, slowest).ok and not lattice.ChainProblem(lat_, n, slowest - 1).ok
    listed = list(chains.chains(limit))
    assert sorted(st_ for _, st_ in listed) == sorted(st_ for st_, p in valid.items() if p < limit)
    assert all(p == valid[st_] for p, st_ in listed)
    assert [p for p, _ in listed] == sorted(p for p, _ in listed)


def test_too_many_downsets_fall_back_to_cpsat():
    _, g = load(FIXTURES.parent.parent / "examples" / "randwire_small_int8.tflite")
    problem = PartitionProblem(g, EdgeTpuCostModel(load_device("coral-usb")))
    assert len(lattice.downsets(problem)) == 10_673
    assert lattice.downsets(problem, limit=10_000) is None
    with exact_step("cpsat"):
        p = partition(g, 2, time_limit=10.0, gap=0)
    q = partition(g, 2, time_limit=10.0, gap=0)
    assert (p.method, q.method) == ("cpsat", "downsets") and p.primary_proven and q.primary_proven
    assert p.bounds["period_ps"] == q.bounds["period_ps"] == q.objectives["period_ps"]
    assert q.cost.period_ps <= p.cost.period_ps


# Found by random search on trade_device: the smallest slowest stage and the least link work come
# from different assignments (the bisection must trade them), and the least sum of stage latencies
# among the chains of period P* breaks the link term (the tie-break must list those chains).
TRADE_CASES = [
    (2, [(0, 1), (1, 2), (3, 4)], [50, 0, 200, 0, 200], [1024, 1024, 64, 16, 16]),
    (2, [(0, 1), (2, 3), (2, 5), (3, 4)], [50, 200, 120, 400, 50, 200], [1024, 16, 1024, 64, 1024, 16]),
    (2, [(0, 1), (0, 2), (3, 4), (3, 5)], [200, 0, 120, 200, 400, 200], [64, 16, 16, 1024, 64, 1024]),
    (3, [(0, 2), (1, 5), (2, 3), (2, 4), (2, 5), (3, 4), (4, 5)], [200, 0, 200, 50, 0, 200], [64, 16, 64, 16, 16, 64]),
    (3, [(0, 1), (0, 3), (1, 3), (1, 4), (1, 6), (2, 3), (3, 4), (4, 5), (4, 6)], [400, 400, 120, 120, 400, 120, 400],
     [1024, 1024, 1024, 16, 1024, 16, 64]),
    (3, [(0, 5), (0, 6), (1, 4), (1, 6), (4, 5), (5, 6)], [120, 400, 400, 50, 400, 400, 200], [256, 64, 256, 64, 256, 64, 16]),
    # the bisection's chains have a slowest stage above their link work
    (2, [(0, 3), (1, 2), (1, 3), (1, 4), (1, 5), (3, 6), (4, 5)], [120, 120, 0, 200, 120, 0, 120],
     [16, 256, 256, 1024, 1024, 16, 16]),
    (3, [(0, 3), (1, 5), (2, 3), (2, 4), (2, 6), (3, 4), (5, 6)], [120, 0, 200, 50, 0, 200, 200],
     [16, 64, 256, 64, 256, 1024, 256]),
]


@pytest.mark.parametrize("n, edges, params, sizes", TRADE_CASES)
def test_exact_step_trades_the_slowest_stage_against_link_work(trade_device, n, edges, params, sizes):
    graph = make_graph(edges, len(params), params, sizes)
    problem = PartitionProblem(graph, EdgeTpuCostModel(trade_device))
    best = brute_force(problem, n)["latency"]
    res, chains = lattice.exact_latency(problem, n, [], [])
    assert chains.min_period()[0] == res.bounds["period_ps"] == best[0]
    assert res.proven_optimal and res.bounds["sum_stage_ps"] == best[1]
    assert (res.objectives["period_ps"], res.objectives["sum_stage_ps"]) == best


@settings(max_examples=20, deadline=None)
@given(dags(), st.integers(2, 3))
# found by random search: the chains of period P* all simulate slower than another one
@example(make_graph([(0, 1), (1, 4), (2, 3)], 5, [0, 0, 400, 400, 0], [1024, 256, 256, 64, 16]), 2)
@example(make_graph([(0, 4), (1, 3), (2, 3), (2, 5), (3, 4), (4, 5)], 6, [0, 120, 50, 200, 0, 0],
                    [16, 16, 256, 256, 16, 256]), 3)
def test_refinement_below_a_tight_cap_claims_no_proof_it_lacks(trade_device, graph, n):
    """Where only the chains up to the best P are costed (a large graph's fallback), the
    refinement cannot see those between that and the incumbent's simulated period: its lower
    bound stops at the cap."""
    problem = PartitionProblem(graph, EdgeTpuCostModel(trade_device))
    if n > problem.max_stages():
        return
    valid = [s for s in itertools.product(range(n), repeat=problem.n_ops) if problem.is_valid(s, n)]
    tight = lattice.ChainProblem(lattice.Lattice(problem, lattice.downsets(problem)), n,
                                 min(problem.objectives(s, n)["period_ps"] for s in valid))
    tight.min_period()
    worst = max(valid, key=lambda s: problem.period_ps(s, n))
    r = lattice.refine_chains(tight, worst, 10_000)
    opt = sim_brute_force(problem, n)
    assert r.lower_bound_ps <= opt <= r.period_ps
    if r.proven:
        assert r.period_ps == opt


@settings(max_examples=40, deadline=None)
@given(dags(), st.integers(2, 3), st.floats(0, 1))
def test_period_exceeds_proves_exactly_the_limits_below_the_optimal_period(trade_device, graph, n, where):
    """`-n auto`'s pruning proof (lattice.period_exceeds): a bound above the limit exactly when every
    assignment's P is above it, and never a bound above the smallest P."""
    problem = PartitionProblem(graph, EdgeTpuCostModel(trade_device))
    if n > problem.max_stages():
        return
    best = brute_force(problem, n)["latency"][0]
    limit = int(best * (0.5 + where))
    low = lattice.period_exceeds(problem, n, limit)
    assert (low is not None) == (limit < best)
    assert low is None or limit < low <= best

"""The pieces of `fit` that need no patching: spans and TASO's selection in CP-SAT, against brute force."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from tpu_pipeline.toolchain.fit.select import chain_select, pareto, select
from tpu_pipeline.toolchain.fit.spans import split_spans, span_graph
from tpu_pipeline.toolchain.fit.variants import Variant
from tpu_pipeline.toolchain.loader import load
from tpu_pipeline.toolchain.memory.lifetimes import lifetimes
from tpu_pipeline.toolchain.schedule.api import schedule

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name", ["chain_int8", "pool_softmax_int8", "tiny_irregular_int8", "darts_s2b_int8"])
def test_spans_partition_the_graph_and_their_peaks_make_the_optimum(name):
    _, g = load(FIXTURES / f"{name}.tflite")
    spans = split_spans(g)
    assert [i for s in spans for i in s.ops] == list(range(len(g.ops)))
    peaks = []
    for s in spans:
        sg = span_graph(g, [s])
        assert not sg.lint()
        assert lifetimes(sg, None, "tflm").peak <= lifetimes(g, None, "tflm").peak
        peaks.append(schedule(sg, time_limit=5).peak)
    whole = schedule(g, time_limit=5)
    assert whole.proven_optimal
    assert max(peaks) == whole.peak  # the peak of the graph is the maximum over its spans


def test_chain_model_has_cuts():
    _, g = load(FIXTURES / "chain_int8.tflite")
    assert len(split_spans(g)) >= 3


def _random_variants(rng: random.Random, n_spans: int) -> list[Variant]:
    out = [Variant(s, s, "as-is", f"s{s}", rng.randrange(100, 1000), 0, rng.uniform(1, 5), 0, 1)
           for s in range(n_spans)]
    for _ in range(rng.randrange(3, 9)):
        a = rng.randrange(n_spans)
        b = rng.randrange(a, n_spans)
        out.append(Variant(a, b, "patch", f"p{a}-{b}", rng.randrange(50, 700), 0, rng.uniform(1, 8) * (b - a + 1),
                           0, 1))
    return out


def _coverings(variants, n_spans):
    """Every set of variants covering each span exactly once (brute force)."""
    def rec(s):
        if s == n_spans:
            yield []
            return
        for v in variants:
            if v.first == s:
                for rest in rec(v.last + 1):
                    yield [v, *rest]
    yield from rec(0)


def _ns(vs):
    return sum(int(round(v.latency_s * 1e9)) for v in vs)


@pytest.mark.parametrize("seed", range(12))
def test_selection_is_the_brute_force_optimum(seed):
    rng = random.Random(seed)
    n = rng.randrange(2, 6)
    variants = _random_variants(rng, n)
    cover = list(_coverings(variants, n))
    for budget in sorted({max(v.peak for v in c) for c in cover})[:4] + [10]:
        fits = [c for c in cover if max(v.peak for v in c) <= budget]
        sel = select(variants, n, budget=budget)
        if not fits:
            assert sel is None
            continue
        best = min(_ns(c) for c in fits)
        assert _ns(sel.variants) == best
        assert sel.peak <= budget
        assert sel.peak == min(max(v.peak for v in c) for c in fits if _ns(c) == best)
        assert sel.proven
        dp = chain_select(variants, n, budget=budget)
        assert (_ns(dp), max(v.peak for v in dp)) == (_ns(sel.variants), sel.peak)


@pytest.mark.parametrize("seed", range(8))
def test_memory_objective_and_frontier_match_brute_force(seed):
    rng = random.Random(100 + seed)
    n = rng.randrange(2, 6)
    variants = _random_variants(rng, n)
    cover = list(_coverings(variants, n))
    smallest = min(max(v.peak for v in c) for c in cover)
    sel = select(variants, n, objective="memory")
    assert sel.peak == smallest
    assert _ns(sel.variants) == min(_ns(c) for c in cover if max(v.peak for v in c) == smallest)
    dp = chain_select(variants, n, objective="memory")
    assert (max(v.peak for v in dp), _ns(dp)) == (sel.peak, _ns(sel.variants))
    bound = _ns(sel.variants) / 1e9 * 1.5  # memory objective under a latency bound
    fits = [c for c in cover if _ns(c) <= bound * 1e9]
    under = select(variants, n, objective="memory", latency_bound=bound)
    dp = chain_select(variants, n, objective="memory", latency_bound=bound)
    assert under.peak == max(v.peak for v in dp) == min(max(v.peak for v in c) for c in fits)
    # the frontier: exactly the non-dominated (peak, latency) pairs
    pairs = {(max(v.peak for v in c), _ns(c)) for c in cover}
    frontier = sorted({(p, t) for p, t in pairs if not any(p2 <= p and t2 <= t and (p2, t2) != (p, t)
                                                          for p2, t2 in pairs)}, key=lambda x: x[1])
    got = [(s.peak, _ns(s.variants)) for s in pareto(lambda b: select(variants, n, budget=b))]
    assert got == frontier


@pytest.mark.parametrize("seed", range(10))
def test_whole_arena_selection_matches_brute_force(seed):
    """With the tail counted (arena = peak + the chosen variants' tails + a fixed part), the chain DP
    (caps on the peak, least tail or (tail, latency) fronts, pruned) and CP-SAT both find the brute
    force optimum, for either objective, under budgets and latency bounds."""
    rng = random.Random(500 + seed)
    n = rng.randrange(2, 6)
    variants = [dataclasses.replace(v, tail=rng.randrange(0, 400)) for v in _random_variants(rng, n)]
    fixed = rng.randrange(0, 300)
    cover = list(_coverings(variants, n))

    def arena(c):
        return max(v.peak for v in c) + sum(v.tail for v in c) + fixed

    smallest = min(arena(c) for c in cover)
    for chosen in (chain_select(variants, n, objective="memory", tail_fixed=fixed),
                   select(variants, n, objective="memory", tail_fixed=fixed).variants):
        assert arena(chosen) == smallest
        assert _ns(chosen) == min(_ns(c) for c in cover if arena(c) == smallest)
    bound = min(_ns(c) for c in cover) / 1e9 * 1.3
    fits = [c for c in cover if _ns(c) <= bound * 1e9]
    dp = chain_select(variants, n, objective="memory", latency_bound=bound, tail_fixed=fixed)
    assert arena(dp) == min(arena(c) for c in fits)
    for budget in sorted({arena(c) for c in cover})[:5]:
        ok = [c for c in cover if arena(c) <= budget]
        fastest = min(_ns(c) for c in ok)
        for chosen in (chain_select(variants, n, budget=budget, tail_fixed=fixed),
                       select(variants, n, budget=budget, tail_fixed=fixed).variants):
            assert arena(chosen) <= budget and _ns(chosen) == fastest
            assert arena(chosen) == min(arena(c) for c in ok if _ns(c) == fastest)
    assert chain_select(variants, n, budget=smallest - 1, tail_fixed=fixed) is None


@pytest.mark.parametrize("seed", range(10))
def test_select_given_the_chain_dps_pick_answers_as_cpsat_alone(seed):
    """fit's pool hands `select` the chain DP's pick (`known`) in place of CP-SAT's first level:
    the selection is then the very one CP-SAT's two levels give (same variants, same figures),
    for both objectives, under budgets and latency bounds, head alone or whole arena."""
    rng = random.Random(900 + seed)
    n = rng.randrange(2, 6)
    variants = [dataclasses.replace(v, tail=rng.randrange(0, 400)) for v in _random_variants(rng, n)]
    cover = list(_coverings(variants, n))
    for fixed in (None, rng.randrange(0, 300)):
        arenas = sorted({max(v.peak for v in c) + (sum(v.tail for v in c) + fixed if fixed is not None else 0)
                         for c in cover})
        bound = min(_ns(c) for c in cover) / 1e9 * 1.3
        asks = [dict(budget=b) for b in arenas[:4]] + [dict(objective="memory"),
                                                       dict(objective="memory", latency_bound=bound)]
        for ask in asks:
            pick = chain_select(variants, n, tail_fixed=fixed, **ask)
            alone = select(variants, n, tail_fixed=fixed, **ask)
            given = select(variants, n, tail_fixed=fixed, known=pick, **ask)
            assert given == alone


def test_a_new_fit_stage_is_one_module_plus_one_registration():
    """docs/architecture.md's worked example: a stage that keeps only coarse patch grids, put in
    the stage list after `patches`, runs on the pass driver, and a stage that breaks the graph is
    named in the error."""
    from tpu_pipeline.toolchain.device import CMSIS_NN, load_device
    from tpu_pipeline.toolchain.driver import Pass, PassError, PassRecord
    from tpu_pipeline.toolchain.fit import FitParams, run_fit
    from tpu_pipeline.toolchain.fit.stages import STAGES

    def coarse_only(state, allowed):
        kept = tuple(v for v in state.candidates if max(v.grid) <= 2)
        return (dataclasses.replace(state, candidates=kept),
                PassRecord("coarse_only", "ran", 0.0, {"dropped": len(state.candidates) - len(kept)}))

    def broken(state, allowed):
        bad = dataclasses.replace(state.graph.ops[0], inputs=(len(state.graph.tensors) + 5,))
        return dataclasses.replace(state, graph=dataclasses.replace(state.graph, ops=(bad, *state.graph.ops[1:]))), \
            PassRecord("broken", "ran")

    at = [p.name for p in STAGES].index("patches") + 1
    graph = load(FIXTURES / "chain_int8.tflite")[1]
    params, device = FitParams(objective="memory", kernels=CMSIS_NN), load_device("qemu-mps2-an386")
    full = run_fit(graph, params, device)
    coarse = run_fit(graph, params, device, stages=[*STAGES[:at], Pass("coarse_only", coarse_only), *STAGES[at:]])
    assert 0 < coarse.candidates < full.candidates
    assert all(max(v.grid) <= 2 for v in coarse.selection.variants if v.grid is not None)
    assert coarse.fits and full.head <= coarse.head  # fewer candidates: never a smaller arena
    with pytest.raises(PassError, match="pass 'broken' left an invalid graph"):
        run_fit(graph, params, device, stages=[*STAGES[:at], Pass("broken", broken), *STAGES[at:]])


def _span_by_span(variants, n_spans, budget, latency_bound, minimise, latency_cap, tail_fixed):
    """The CP-SAT model of select's `_solve` as it was first written: cover lists span by span
    over every variant, the sums term by term."""
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    x = [m.NewBoolVar(f"v{k}") for k in range(len(variants))]
    for s in range(n_spans):
        m.AddExactlyOne([x[k] for k, v in enumerate(variants) if v.first <= s <= v.last])
    peak = m.NewIntVar(0, max(v.peak for v in variants), "peak")
    for k, v in enumerate(variants):
        m.Add(peak >= v.peak).OnlyEnforceIf(x[k])
    memory = peak
    if tail_fixed is not None:
        memory = peak + sum(v.tail * x[k] for k, v in enumerate(variants)) + tail_fixed
    if budget is not None:
        m.Add(memory <= budget)
    latency = sum(int(round(v.latency_s * 1e9)) * x[k] for k, v in enumerate(variants))
    if latency_bound is not None:
        m.Add(latency <= int(latency_bound * 1e9))
    if latency_cap is not None:
        m.Add(latency <= latency_cap)
    m.Minimize(latency if minimise == "latency" else memory)
    return m


@pytest.mark.parametrize("seed", range(6))
def test_the_selection_model_is_the_one_made_span_by_span(seed, monkeypatch):
    """`_solve` makes its CP-SAT model with the cover lists in one pass and weighted sums (the
    pareto sweep makes hundreds): the model, proto field for field, is the one made span by span
    and term by term, so CP-SAT (one worker: deterministic) answers the same, ties included."""
    from tpu_pipeline.toolchain.fit import select as select_mod

    rng = random.Random(1300 + seed)
    n = rng.randrange(2, 7)
    variants = [dataclasses.replace(v, tail=rng.choice([0, 0, 16, rng.randrange(0, 400)]))
                for v in _random_variants(rng, n)]
    asked = []
    real = select_mod.new_solver

    def solver(seconds, workers):
        s = real(seconds, workers)
        solve = s.Solve
        s.Solve = lambda model, *a, **k: asked.append(model) or solve(model, *a, **k)
        return s

    monkeypatch.setattr(select_mod, "new_solver", solver)
    for args in ((None, None, "latency", None, None), (10, None, "latency", None, 100),
                 (None, 0.5, "memory", None, 50), (None, None, "memory", 10 ** 9, None)):
        asked.clear()
        budget, bound, minimise, cap, fixed = args
        select_mod._solve(variants, n, budget, bound, minimise, cap, None, fixed)
        assert len(asked) == 1
        assert str(asked[0].Proto()) == str(_span_by_span(variants, n, budget, bound, minimise, cap, fixed).Proto())


def _tied_variants(rng: random.Random, n_spans: int) -> list[Variant]:
    """Variants with few distinct figures and some repeated outright: many coverings tie."""
    out = []
    for s in range(n_spans):
        for _ in range(rng.randrange(1, 3)):
            out.append(Variant(s, s, "as-is", f"s{s}", rng.choice((100, 200, 300)), 0, rng.choice((1, 2)) * 1e-6, 0, 1,
                               tail=rng.choice((0, 8, 16))))
    for _ in range(rng.randrange(2, 7)):
        a = rng.randrange(n_spans)
        b = rng.randrange(a, n_spans)
        out.append(Variant(a, b, "patch", f"p{a}-{b}", rng.choice((100, 200)), 0, rng.choice((1, 2, 3)) * 1e-6, 0, 1,
                           tail=rng.choice((0, 8))))
    return out + [dataclasses.replace(v) for v in out if rng.random() < 0.2]  # (equal, not the same)


@pytest.mark.parametrize("seed", range(20))
def test_counting_coverings_within_limits_is_the_brute_force_count(seed):
    """fronts.count_within counts every covering within an arena and a latency, equal ones too (its
    count of 1 lets `select` skip CP-SAT's tie-breaking solve): the brute force count, capped."""
    from tpu_pipeline.toolchain.fit.fronts import count_within

    rng = random.Random(1300 + seed)
    n = rng.randrange(2, 6)
    variants = _tied_variants(rng, n)
    cover = list(_coverings(variants, n))
    ns = {id(v): int(round(v.latency_s * 1e9)) for v in variants}
    for fixed in (None, rng.randrange(0, 50)):
        def arena(c):
            return max(v.peak for v in c) + (0 if fixed is None else sum(v.tail for v in c) + fixed)
        limits = {(arena(c), _ns(c)) for c in cover} | {(arena(c) - 1, _ns(c) + 1000) for c in cover}
        for max_arena, max_lat in sorted(limits):
            want = sum(1 for c in cover if arena(c) <= max_arena and _ns(c) <= max_lat)
            assert count_within(variants, n, max_arena, max_lat, ns, fixed, most=10 ** 6) == want
            assert count_within(variants, n, max_arena, max_lat, ns, fixed) == min(2, want)


@pytest.mark.parametrize("seed", range(10))
def test_select_given_the_chain_dps_pick_answers_as_cpsat_alone_among_ties(seed):
    """The same as above where many coverings tie: given the DP's pick, `select` skips CP-SAT's
    second level only where that pick is the one optimal covering, and answers as CP-SAT alone."""
    rng = random.Random(1700 + seed)
    n = rng.randrange(2, 6)
    variants = _tied_variants(rng, n)
    for fixed in (None, rng.randrange(0, 50)):
        for ask in (dict(), dict(objective="memory"), dict(budget=400), dict(budget=300)):
            pick = chain_select(variants, n, tail_fixed=fixed, **ask)
            alone = select(variants, n, tail_fixed=fixed, **ask)
            given = select(variants, n, tail_fixed=fixed, known=pick, **ask)
            assert given == alone


@pytest.mark.parametrize("name", ["chain_int8", "concat_conv_int8", "tiny_irregular_int8"])
def test_a_regions_stage_layers_are_its_ops_staged_one_by_one(name):
    """fit.variants prices a patch stage from its ops each put on the stage's kernels alone, once
    per fit (fit.staged), not from rewrite.patch_stage.stage_layers over the whole region, once per
    region: the same kernels, scratch and rates, on every way, for every run of harness ops."""
    from tpu_pipeline.toolchain.device import CMSIS_NN, load_device
    from tpu_pipeline.toolchain.fit.estimate import StagePricing, pricing_table
    from tpu_pipeline.toolchain.fit.staged import WAYS, staged_op
    from tpu_pipeline.toolchain.fit.variants import on_harness
    from tpu_pipeline.toolchain.ir.kernels import CONVOLUTIONS, flags, is_harness
    from tpu_pipeline.toolchain.memory.scratch import scratch_requests
    from tpu_pipeline.toolchain.memory.semantics import tflm_semantics
    from tpu_pipeline.toolchain.rewrite.patch_stage import stage_layers

    g, _ = on_harness(load(FIXTURES / f"{name}.tflite")[1])
    sem = tflm_semantics(CMSIS_NN)
    priced = pricing_table(load_device("qemu-mps2-an386"), CMSIS_NN)
    harness = [i for i, op in enumerate(g.ops) if is_harness(op) and op.opcode in CONVOLUTIONS]
    runs = [harness[a:b] for a in range(len(harness)) for b in range(a + 1, len(harness) + 1)]
    assert priced is not None and len(runs) >= 3
    memo: dict = {}
    for positions in runs:
        for way, options in WAYS.items():
            whole = stage_layers(g, positions, **options(positions))
            for i in positions:
                one = staged_op(g, i, way, sem, priced, memo)
                op = whole.ops[i]
                assert (one.kernel, one.flags) == (op.kernel, flags(op))
                assert one.scratch == (None if op.opcode == "ADD" else sum(scratch_requests(whole, i, sem)))
                assert one.rate == StagePricing.rate(whole, i, priced[0])


def test_a_count_past_its_work_cap_leaves_the_ties_to_cpsat(monkeypatch):
    """Past MAX_COUNT_WORK steps count_within gives up (None) and `select` solves CP-SAT's second
    level as before: the same answer, just not the shortcut."""
    from tpu_pipeline.toolchain.fit import fronts

    rng = random.Random(2024)
    n = 5
    variants = _random_variants(rng, n)
    ns = {id(v): int(round(v.latency_s * 1e9)) for v in variants}
    pick = chain_select(variants, n, objective="memory")
    arena, lat = max(v.peak for v in pick), _ns(pick)
    assert fronts.count_within(variants, n, arena, lat, ns, None) == 1
    monkeypatch.setattr(fronts, "MAX_COUNT_WORK", 0)
    assert fronts.count_within(variants, n, arena, lat, ns, None) is None
    assert select(variants, n, objective="memory", known=pick) == select(variants, n, objective="memory")


def test_realise_asks_the_whole_graph_a_question_the_clock_does_not_answer(monkeypatch):
    """Where the variants' own orders keep the selection's peak, realise's look at the whole graph
    is the short exact search bounded by its states (REALISE_SCHEDULE), not a share of a few
    seconds: the same model and budget then realise the same order under any load (docs/fit.md)."""
    from tpu_pipeline.toolchain.device import CMSIS_NN, load_device
    from tpu_pipeline.toolchain.fit import FitParams, run_fit
    from tpu_pipeline.toolchain.fit import realise as realise_mod

    asked = []
    real_schedule = realise_mod.schedule

    def recording(graph, method, **kw):
        asked.append((method, kw["params"]))
        return real_schedule(graph, method, **kw)

    monkeypatch.setattr(realise_mod, "schedule", recording)
    graph = load(FIXTURES / "tiny_irregular_int8.tflite")[1]
    result = run_fit(graph, FitParams(objective="memory", kernels=CMSIS_NN), load_device("qemu-mps2-an386"))
    assert result.fits and any(method == "auto" for method, _ in asked), asked
    assert all(params.timed is False and params.full_search is False for method, params in asked
               if method == "auto"), asked
    assert realise_mod.REALISE_SCHEDULE.try_states > 0

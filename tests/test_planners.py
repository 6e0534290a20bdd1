"""Arena planners: sound plans (independent checker), optimal against CP-SAT on small random
instances, MiniMalloc CSV problems, and TFLite Micro's real head equal to the planned size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpu_pipeline.toolchain.errors import ModelError
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT, run_cli, tflm_models
from tpu_pipeline.toolchain.execute.tflm import run_tflm_in_child
from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena
from tpu_pipeline.toolchain.loader import load
from tpu_pipeline.toolchain.loader import load_exact
from tpu_pipeline.toolchain.memory import (
    Buffer, Lifetimes, check_plan, lifetimes, live_lower_bound, plan_arena, plan_buffers, plan_for_tflm,
    tflm_greedy,
)
from tpu_pipeline.toolchain.memory import native_search
from tpu_pipeline.toolchain.memory.minimalloc import read_csv
from tpu_pipeline.toolchain.memory.cpsat import cpsat_plan
from tpu_pipeline.toolchain.memory.plan import arena_size
from tpu_pipeline.toolchain.memory.planners import PLANNERS
from tpu_pipeline.toolchain.memory.search import SearchParams, search_plan
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_offline_plan, with_offline_plan
from tpu_pipeline.toolchain.tflite.metadata import total_tensor_count

MINIMALLOC = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "minimalloc"  # ../shared beside the clone
EXAMPLE_CSV = ROOT / "tests" / "fixtures" / "minimalloc_input.12.csv"


def _buffers(spec):
    return tuple(Buffer(size * 16, first, first + length) for first, length, size in spec)


buffer_sets = st.lists(st.tuples(st.integers(0, 8), st.integers(0, 5), st.integers(1, 12)), min_size=1, max_size=9)


# ---- the checker ----------------------------------------------------------------------------

def test_checker_catches_overlap_alignment_and_count():
    bufs = (Buffer(32, 0, 2), Buffer(32, 1, 3), Buffer(16, 4, 5))
    assert check_plan(bufs, [0, 32, 0]) == []
    assert any("overlap" in p for p in check_plan(bufs, [0, 16, 0]))
    assert any("aligned" in p for p in check_plan(bufs, [0, 40, 0], alignment=16))
    assert check_plan(bufs, [0, 32]) and check_plan(bufs, [0, -32, 0])
    # lifetimes that only touch at a step share that step: they conflict
    assert check_plan((Buffer(16, 0, 1), Buffer(16, 1, 2)), [0, 0])


# ---- planners on random instances -----------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(buffer_sets)
def test_every_planner_is_sound_and_auto_is_optimal(spec):
    bufs = _buffers(spec)
    lb = live_lower_bound(bufs)
    for name in ("greedy-size", "greedy-conflicts", "tflm", "search", "auto"):
        plan = plan_buffers(bufs, name, time_limit=5.0)
        assert check_plan(bufs, plan.offsets, alignment=16) == [], name
        assert plan.size >= lb
        assert plan.lower_bound <= plan.size
    auto = plan_buffers(bufs, "auto", time_limit=5.0)
    _, opt, bound, optimal = cpsat_plan(bufs, time_limit=10.0, lower_bound=lb)
    assert optimal and opt == bound
    assert auto.size == opt
    assert auto.proven_optimal
    assert auto.lower_bound <= opt


@settings(max_examples=30, deadline=None)
@given(buffer_sets)
def test_search_decides_feasibility_like_cpsat(spec):
    bufs = _buffers(spec)
    _, opt, _, optimal = cpsat_plan(bufs, time_limit=10.0, lower_bound=live_lower_bound(bufs))
    assert optimal
    for native in (True, False):
        at = search_plan(bufs, opt, 5.0, native=native)
        assert isinstance(at, list) and check_plan(bufs, at) == [] and max(o + b.size for o, b in zip(at, bufs)) <= opt
        below = search_plan(bufs, opt - 16, 5.0, native=native)
        assert below is None  # proven infeasible, not a timeout


_SWITCHES = ("canonical", "dominance", "section_bound", "decompose")


@settings(max_examples=20, deadline=None)
@given(buffer_sets)
def test_search_with_any_pruning_switch_off_decides_the_same(spec):
    """SearchParams' switches only cut the search: with any one off, the Python search still finds
    a plan at the optimum and proves that nothing fits one unit below."""
    bufs = _buffers(spec)
    _, opt, _, optimal = cpsat_plan(bufs, time_limit=10.0, lower_bound=live_lower_bound(bufs))
    assert optimal
    for switch in _SWITCHES:
        params = SearchParams(native=False, **{switch: False})
        at = search_plan(bufs, opt, 5.0, params=params)
        assert isinstance(at, list) and check_plan(bufs, at) == [] and arena_size(bufs, at) <= opt, switch
        assert search_plan(bufs, opt - 16, 5.0, params=params) is None, switch


def test_each_search_pruning_switch_is_wired():
    """Turning a switch off makes the Python search visit more nodes on some instance (dominance and
    canonical order are seen with the section bound off: it usually prunes the same plans first)."""
    import random
    import time

    from tpu_pipeline.toolchain.memory.preprocess import sections
    from tpu_pipeline.toolchain.memory.search import _Search

    def nodes(bufs, cap, **switches):
        search = _Search(sections(bufs), cap, time.monotonic() + 10.0, SearchParams(native=False, **switches))
        search.solve()
        return search.nodes

    baseline = {"canonical": {"section_bound": False}, "decompose": {}, "section_bound": {},
                "dominance": {"section_bound": False}}
    seen = set()
    rng = random.Random(0)
    for _ in range(400):
        bufs = [Buffer(16 * rng.randint(1, 12), f, f + rng.randint(0, 6))
                for f in (rng.randint(0, 12) for _ in range(rng.randint(6, 12)))]
        for cap in (live_lower_bound(bufs) // 16, live_lower_bound(bufs) // 16 + 1):
            for switch, base in baseline.items():
                if switch not in seen and nodes(bufs, cap, **base, **{switch: False}) > nodes(bufs, cap, **base):
                    seen.add(switch)
        if len(seen) == len(baseline):
            break
    assert seen == set(baseline), seen


def test_search_with_prepared_sections_is_the_search_without():
    problem = read_csv(EXAMPLE_CSV)
    from tpu_pipeline.toolchain.memory.preprocess import sections

    prepared = sections(problem.buffers)
    for cap in (11, 12, 20):
        assert search_plan(problem.buffers, cap, 5.0, prepared=prepared) == search_plan(problem.buffers, cap, 5.0)
    assert search_plan(problem.buffers, 11, 5.0, prepared=prepared) is None


def test_planners_come_from_one_registry():
    from tpu_pipeline.toolchain.errors import UsageError
    from tpu_pipeline.toolchain.memory.planners import REGISTRY, Request, register

    assert PLANNERS == tuple(REGISTRY) == ("auto", "search", "cpsat", "greedy-size", "greedy-conflicts", "tflm",
                                           "tflite")
    with pytest.raises(UsageError, match="unknown planner 'nope'"):
        plan_buffers((), "nope")

    @register("test-stack")
    def stack(req: Request):
        offsets, top = [], 0
        for b in req.buffers:
            offsets.append(top)
            top += b.size
        return req.finish(offsets, "test-stack")

    try:
        bufs = _buffers([(0, 2, 1), (1, 2, 2)])
        plan = plan_buffers(bufs, "test-stack")
        assert plan.planner == "test-stack" and plan.offsets == (0, 16) and plan.size == 48
    finally:
        del REGISTRY["test-stack"]


def _needs_native():
    if native_search.load() is None:
        pytest.skip("no C compiler here: the native search cannot be built, only the Python one runs")


@settings(max_examples=30, deadline=None)
@given(buffer_sets)
def test_native_and_python_searches_give_the_same_plans(spec):
    """The C search is a port of the Python one: the same offsets at the optimum, and both prove
    that nothing fits one unit below it."""
    _needs_native()
    bufs = _buffers(spec)
    _, opt, _, optimal = cpsat_plan(bufs, time_limit=10.0, lower_bound=live_lower_bound(bufs))
    assert optimal
    for capacity in (opt, opt - 16):
        native = search_plan(bufs, capacity, 5.0, native=True)
        python = search_plan(bufs, capacity, 5.0, native=False)
        assert native == python, capacity
    assert isinstance(search_plan(bufs, opt, 5.0, native=True), list)


def test_native_and_python_searches_agree_on_the_minimalloc_example():
    _needs_native()
    bufs = read_csv(EXAMPLE_CSV).buffers
    for capacity in (12, 11):  # the optimum, and one below it (see the plan-buffers CLI test)
        assert search_plan(bufs, capacity, 5.0, native=True) == search_plan(bufs, capacity, 5.0, native=False)
    assert search_plan(bufs, 11, 5.0, native=True) is None


# ---- MiniMalloc CSV problems ----------------------------------------------------------------

def test_plan_buffers_cli_on_the_readme_example(tmp_path):
    out = tmp_path / "out.csv"
    proc = run_cli("plan-buffers", str(EXAMPLE_CSV), "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["size"] == 12 and result["proven_optimal"]
    solved = read_csv(out)
    assert solved.offsets is not None and check_plan(solved.buffers, solved.offsets) == []
    assert max(o + b.size for o, b in zip(solved.offsets, solved.buffers)) == 12
    # feasibility at a capacity: 12 works, 11 is below the live bound (exit 3)
    assert run_cli("plan-buffers", str(EXAMPLE_CSV), "-o", str(out), "--capacity", "12").returncode == 0
    proc = run_cli("plan-buffers", str(EXAMPLE_CSV), "-o", str(tmp_path / "no.csv"), "--capacity", "11")
    assert proc.returncode == 3 and "infeasible" in proc.stderr
    assert not (tmp_path / "no.csv").exists()


def test_plan_buffers_refuses_bad_csv(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,lower,size\n0,1,2\n")
    proc = run_cli("plan-buffers", str(bad), "-o", str(tmp_path / "o.csv"))
    assert proc.returncode == 2 and "missing column" in proc.stderr
    bad.write_text("id,lower,upper,size\n0,5,3,2\n")
    proc = run_cli("plan-buffers", str(bad), "-o", str(tmp_path / "o.csv"))
    assert proc.returncode == 2 and "line 2" in proc.stderr


@pytest.mark.skipif(not (MINIMALLOC / "C.1048576.csv").exists(), reason="shared benchmarks not present")
def test_a_minimalloc_instance_packs_into_its_capacity():
    problem = read_csv(MINIMALLOC / "C.1048576.csv")
    plan = plan_buffers(problem.buffers, "auto", time_limit=60.0)
    assert check_plan(problem.buffers, plan.offsets) == []
    assert plan.size <= problem.capacity == 1048576
    assert plan.proven_optimal and plan.size == live_lower_bound(problem.buffers)


# ---- TFLite Micro: the offline plan is what the runtime allocates --------------------------

MODELS = tflm_models()


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_tflm_head_equals_the_plan_and_outputs_are_unchanged(path, tmp_path):
    # the model `plan` writes from: exact for TFLite Micro (see test_real_models for the raw hazard)
    model, graph, _ = load_exact(path, check_litert=False)
    lt = lifetimes(graph, semantics="tflm")
    result = plan_for_tflm(graph, lt, "auto", time_limit=5.0, n_tensors=total_tensor_count(model))
    assert len(result.tensor_offsets) == total_tensor_count(model)
    assert check_plan(lt, result.buffer_offsets, alignment=16) == []
    assert result.head <= tflm_greedy(lt).size  # never worse than TFLM's own planner
    assert result.head >= lt.peak
    planned = with_offline_plan(model, list(result.tensor_offsets))
    data = model_to_bytes(planned)
    assert read_offline_plan(planned) == list(result.tensor_offsets)
    assert measure_tflm_arena(data).head == result.head
    before = run_tflm_in_child(model_to_bytes(model), seed=3)
    after = run_tflm_in_child(data, seed=3)
    assert len(before) == len(after)
    for a, b in zip(before, after):
        assert a.dtype == b.dtype and (a == b).all()


def test_plan_cli_writes_a_verified_model(tmp_path):
    path = MODELS[0]
    out = tmp_path / "planned.tflite"
    proc = run_cli("plan", str(path), "-o", str(out), "--verify", "--json", "--onchip", "1000000")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["tflm_measured_head"] == data["planned_bytes"] >= data["lower_bound"]
    assert data["planned_bytes"] <= data["tflm_planner_bytes"]
    assert data["offchip"]["converter_order"]["total_bytes"] == 0
    assert out.exists()
    proc = run_cli("plan", str(path), "-o", str(path))
    assert proc.returncode == 2 and "overwrite" in proc.stderr


def test_offline_plan_refuses_models_with_several_subgraphs():
    """TFLM plans the tensors of every subgraph in one arena while we model the main one only, so a
    plan there could not be held to the byte: refused clearly (and `compile` skips the pass)."""
    path = ROOT / "tests" / "fixtures" / "control_flow_float32.tflite"
    model, graph = load(path)
    assert len(model.subgraphs) > 1
    with pytest.raises(ModelError, match="subgraphs"):
        plan_for_tflm(graph, planner="greedy-size", time_limit=1.0, n_tensors=total_tensor_count(model))
    proc = run_cli("plan", str(path), "-o", str(ROOT / "out" / "never-written.tflite"))
    assert proc.returncode == 2 and "subgraphs" in proc.stderr
    assert not (ROOT / "out" / "never-written.tflite").exists()


def test_plan_for_tflm_takes_plain_values():
    """No flatbuffer model: a graph built in the IR and the tensor count of the model the offsets
    will be written into (by with_offline_plan, the only writer of the metadata)."""
    import inspect

    from tpu_pipeline.toolchain.ir import Graph, Op, Tensor

    sizes = {"x": 160, "a": 320, "b": 320, "c": 160}
    tensors = tuple(Tensor(i, name, "int8", (size,)) for i, (name, size) in enumerate(sizes.items()))
    graph = Graph(tensors, (Op("RELU", (0,), (1,)), Op("RELU", (1,), (2,)), Op("RELU", (2,), (3,))), (0,), (3,))
    assert "model" not in inspect.signature(plan_for_tflm).parameters
    result = plan_for_tflm(graph, planner="auto", time_limit=2.0, n_tensors=4)
    lt = lifetimes(graph, semantics="tflm")
    assert len(result.tensor_offsets) == 4 and min(result.tensor_offsets) >= 0
    assert result.head == lt.peak == 640 and check_plan(lt, result.buffer_offsets, alignment=16) == []
    with pytest.raises(ModelError, match="2 tensors in other subgraphs"):
        plan_for_tflm(graph, planner="greedy-size", time_limit=1.0, n_tensors=6)


def test_order_and_offsets_never_worse_than_the_schedule_alone():
    from tpu_pipeline.toolchain.schedule import schedule
    from tpu_pipeline.toolchain.schedule.offsets import plan_order_and_offsets

    path = MODELS[-1]
    _, graph = load(path)
    s = schedule(graph, time_limit=5.0)
    r = plan_order_and_offsets(graph, s, time_limit=5.0)
    alone = plan_arena(lifetimes(graph, s.order, "tflm"), time_limit=5.0)
    assert r.plan.size <= alone.size
    assert graph.is_topological(r.order)
    lt = lifetimes(graph, r.order, "tflm")
    assert check_plan(lt, r.plan.offsets, alignment=16) == [] and r.peak == lt.peak


def test_rigid_groups_are_planned_exactly_from_a_first_fit_hint():
    """Buffers tied at fixed offsets (an overlapped op's pair, lifetimes.Buffer.group) where every
    first-fit order lands above the most bytes live: CP-SAT, started from the first fit's plan,
    reaches the live bound (a hint given once per group member made the model invalid, and the
    first fit was kept)."""
    bufs = (Buffer(8, 0, 1, tensor=0), Buffer(8, 1, 3, tensor=1),  # a long-lived small one
            Buffer(16, 2, 2, tensor=2, group=0, group_offset=0), Buffer(16, 3, 3, tensor=3, group=0, group_offset=0),
            Buffer(24, 4, 4, tensor=4, group=0, group_offset=0), Buffer(12, 0, 0, tensor=5),
            Buffer(16, 4, 5, tensor=6), Buffer(4, 5, 5, tensor=7))
    hint = [0, 8, 16, 16, 16, 8, 40, 0]
    assert check_plan(bufs, hint) == []
    offsets, size, _, optimal = cpsat_plan(bufs, 5.0, hint=hint, lower_bound=live_lower_bound(bufs),
                                           upper_bound=arena_size(bufs, hint))
    assert offsets is not None and optimal and size == live_lower_bound(bufs)
    plan = plan_buffers(bufs, "auto", 5.0)
    assert plan.size == live_lower_bound(bufs) and check_plan(bufs, plan.offsets) == []

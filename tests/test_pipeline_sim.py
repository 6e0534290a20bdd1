"""The pipeline simulator (tpu_pipeline/toolchain/cost/pipeline.py) on cases computed by hand."""

from __future__ import annotations

import pytest

from tpu_pipeline.toolchain.cost.pipeline import StageLoad as S, period_bound, simulate, simulate_pipelines

B = 1e6  # 1 MB/s: one byte = one microsecond, 1e6 bytes = 1 s of link time


def test_one_stage_is_its_invoke_with_streaming_under_compute():
    # host 1 + in 1 + max(compute 2, stream 3) + out 1 = 6 s
    r = simulate([S(2.0, 3e6, 1e6, 1e6, 1.0)], B)
    assert r.period_s == pytest.approx(6.0) and r.latency_s == pytest.approx(6.0)
    assert r.period_bound_s == pytest.approx(6.0) and r.gap == pytest.approx(0.0)
    assert r.stages[0].busy_s == pytest.approx(6.0) and r.link_utilisation == pytest.approx(5 / 6)
    # without overlap the stream comes before the compute: 1 + 1 + 3 + 2 + 1 = 8 s
    assert simulate([S(2.0, 3e6, 1e6, 1e6, 1.0, overlap=False)], B).period_s == pytest.approx(8.0)


def test_compute_bound_pipeline_runs_at_its_slowest_stage():
    r = simulate([S(2.0), S(3.0)], B)
    assert r.period_s == pytest.approx(3.0)
    assert r.latency_s == pytest.approx(5.0)     # fed at the period: no queueing, 2 + 3
    s0, s1 = r.stages
    assert s0.busy_s == pytest.approx(2.0) and s0.blocked_s + s0.starved_s == pytest.approx(1.0)
    assert s1.busy_s == pytest.approx(3.0) and s1.starved_s == pytest.approx(0.0)


def test_the_shared_link_sets_the_period():
    # each stage alone streams for 1 s per frame; the link carries 2 s of work per frame
    r = simulate([S(0.0, 1e6), S(0.0, 1e6)], B)
    assert r.period_s == pytest.approx(2.0) and r.period_bound_s == pytest.approx(2.0)
    assert r.link_utilisation == pytest.approx(1.0)
    # 5 stages each streaming 1 s under 0.5 s of compute: 5 s per frame on the link
    assert simulate([S(0.5, 1e6)] * 5, B).period_s == pytest.approx(5.0)


def test_link_policies_on_two_stages_that_both_read_then_compute():
    # two stages, each: 1 s input on the link, then 1 s compute. Bound max(2, 2, link 2) = 2 s.
    stages = [S(1.0, 0, 1e6), S(1.0, 0, 1e6)]
    # processor sharing: from frame 1 on both inputs start together, share the link (2 s at half
    # rate), then both compute for 1 s in step: 3 s per frame, 50 % above the bound
    r = simulate(stages, B, link_policy="ps")
    assert r.period_bound_s == pytest.approx(2.0)
    assert r.period_s == pytest.approx(3.0) and r.gap == pytest.approx(0.5)
    # FIFO: stage 0 reads frame 1 in [2, 3] while stage 1 waits, then reads frame 0 in [3, 4]
    # while stage 0 computes; from then on they alternate on the link: 2 s, the bound
    r = simulate(stages, B, link_policy="fifo")
    assert r.period_s == pytest.approx(2.0) and r.gap == pytest.approx(0.0)
    with pytest.raises(ValueError):
        simulate(stages, B, link_policy="lottery")


def test_host_slots_limit_concurrent_invokes():
    # host cost 1 s per invoke, compute 1 s: alone each stage needs 2 s per frame
    assert simulate([S(1.0, host_s=1.0)] * 2, B).period_s == pytest.approx(2.0)
    # one host slot: from frame 1 on both host phases start together and share the slot (2 s),
    # then both compute (1 s): 3 s per frame, as the link case above
    r = simulate([S(1.0, host_s=1.0)] * 2, B, host_slots=1)
    assert r.period_bound_s == pytest.approx(2.0) and r.period_s == pytest.approx(3.0)
    assert simulate([S(0.0, host_s=1.0)] * 3, B, host_slots=1).period_s == pytest.approx(3.0)


def test_models_sharing_one_host_link():
    a, b = simulate_pipelines([[S(0.0, 1e6)], [S(0.0, 1e6)]], B)
    assert a.period_s == pytest.approx(2.0) and b.period_s == pytest.approx(2.0)
    # a compute-bound model beside a link-bound one: each keeps its own rate
    a, b = simulate_pipelines([[S(3.0)], [S(0.0, 1e6)]], B)
    assert a.period_s == pytest.approx(3.0) and b.period_s == pytest.approx(1.0)


def test_period_never_below_bound_and_deterministic():
    stages = [S(0.3, 2e5, 1e4, 5e4, 0.01), S(0.1, 4e5, 5e4, 2e4, 0.01), S(0.2, 0, 2e4, 1e3, 0.01)]
    r1, r2 = simulate(stages, B), simulate(stages, B)
    assert r1 == r2
    assert r1.period_s >= period_bound(stages, B) * (1 - 1e-12)
    with pytest.raises(ValueError):
        simulate([], B)


def test_saturated_period_is_the_simulators_period_exactly():
    """The refinement's fast loop (host uncontended, FIFO link) gives the very float the full
    simulator gives: random pipelines, equal stages (ties on the link), streamed stages, queues
    of one and two; a host with slots or processor sharing goes through the simulator itself."""
    import random

    from tpu_pipeline.toolchain.cost.pipeline import saturated_period, simulate_many

    rng = random.Random(7)

    def nbytes():
        return rng.choice([0, rng.randint(1, 200_000)])

    for _ in range(400):
        n, bw, q = rng.randint(1, 7), rng.choice([4.2e8, 3e8, 1e9]), rng.choice([1, 1, 2])
        stages = [S(rng.uniform(1e-4, 3e-3), rng.choice([0, 0, nbytes()]), nbytes(), nbytes(),
                    rng.choice([0.0, 1.35e-3, 5e-4]), rng.random() < 0.8) for _ in range(n)]
        if rng.random() < 0.3:
            stages = [stages[0]] * n
        assert saturated_period(stages, bw, queue_size=q) == simulate_many([stages], bw, queue_size=q)[0].period_s
    stages = [S(1e-3, 0, 5000, 5000, 1e-3), S(2e-3, 0, 5000, 5000, 1e-3)]
    for kw in ({"host_slots": 1}, {"link_policy": "ps"}):
        assert saturated_period(stages, 1e6, **kw) == simulate_many([stages], 1e6, **kw)[0].period_s


def test_the_c_fifo_loop_gives_the_python_loops_period_exactly():
    """`_fifo_period.c` is `_fifo_period` statement for statement: the very same double on random
    pipelines (equal stages tie on the link, streamed stages, queues of one to three, other frame
    counts); where the Python loop would not end normally the C loop hands back to it."""
    import random

    from tpu_pipeline.toolchain.cost.pipeline import _fifo_period, _fifo_period_native, _phases
    from tpu_pipeline.toolchain.native import load_library
    from tpu_pipeline.toolchain.cost import pipeline

    if load_library(pipeline._FIFO_SOURCE) is None:
        pytest.skip("no C compiler here: the Python loop runs alone")
    rng = random.Random(11)

    def nbytes():
        return rng.choice([0, rng.randint(1, 300_000)])

    for _ in range(1500):
        n, bw, q = rng.randint(1, 9), rng.choice([4.2e8, 3e8, 1e9, 1e6]), rng.choice([1, 1, 2, 3])
        stages = [S(rng.uniform(1e-5, 3e-3), rng.choice([0, 0, nbytes()]), nbytes(), nbytes(),
                    rng.choice([0.0, 1.35e-3, 5e-4]), rng.random() < 0.8) for _ in range(n)]
        if rng.random() < 0.3:
            stages = [stages[0]] * n
        phases = [_phases(s, bw) for s in stages]
        F = rng.choice([24, 24, 4 * n, 7, 40])
        native = _fifo_period_native(phases, F, q)
        assert native is not None
        assert native == _fifo_period(phases, F, q)
    assert _fifo_period_native([[{"tpu": 1.0}], []], 24, 1) is None  # a stage without phases

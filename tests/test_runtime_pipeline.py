"""The pipelined runner: Coral PipelinedModelRunner semantics for any stage, no hangs."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_pipeline.runtime.measure import LatencyStats
from tpu_pipeline.runtime.pipeline import PipelinedRunner, PipelineError, Stage, run_pipeline
from tpu_pipeline.toolchain.errors import DeviceError, ToolchainError


def add_stage(name, src, dst, k, fail_at=None, seen=None):
    def fn(t):
        x = t[src]
        if seen is not None:
            seen.append(int(x[0]))
        if fail_at is not None and int(x[0]) == fail_at:
            raise RuntimeError(f"boom at {fail_at}")
        return {dst: x + k}
    return Stage(name, (src,), (dst,), fn)


def skip_pipeline():
    """x -> a (stage 0) ; a -> b (stage 1) ; a + b -> y (stage 2): 'a' skips stage 1 by name."""
    s0 = Stage("s0", ("x",), ("a",), lambda t: {"a": t["x"] * 2})
    s1 = Stage("s1", ("a",), ("b",), lambda t: {"b": t["a"] + 1})
    s2 = Stage("s2", ("a", "b"), ("y",), lambda t: {"y": t["a"] * 100 + t["b"]})
    return [s0, s1, s2]


def test_tensors_matched_by_name_in_order_and_end_of_stream():
    stages = skip_pipeline()
    with PipelinedRunner(stages) as r:
        outs = []

        def consume():
            while True:
                o = r.pop(timeout=10)
                if o is None:
                    return
                outs.append(o)

        c = threading.Thread(target=consume)
        c.start()
        for i in range(25):
            r.push({"x": np.array([i])})
        r.push({})
        c.join(10)
        assert not c.is_alive()
    assert [int(o["y"][0]) for o in outs] == [(2 * i) * 100 + 2 * i + 1 for i in range(25)]
    assert all(set(o) == {"y"} for o in outs)
    assert [s.count for s in stages] == [25, 25, 25]


def test_failing_stage_stops_pipeline_with_its_error_and_keeps_earlier_results():
    stages = [add_stage("first", "x", "a", 1), add_stage("second", "a", "b", 10, fail_at=6),
              add_stage("third", "b", "y", 100)]
    result = {}

    def go():
        result["run"] = run_pipeline(stages, ({"x": np.array([i])} for i in range(1000)), timeout=20)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the pipeline hung after a stage failed"
    run = result["run"]
    assert isinstance(run.error, PipelineError) and isinstance(run.error, DeviceError)
    assert run.error.stage == 1
    assert "segment 1 (second)" in str(run.error) and "boom at 6" in str(run.error)
    # Inputs 0..4 give a = 1..5 < 6: their results came out before the failure and are kept.
    assert [int(o["y"][0]) for o in run.outputs] == [i + 111 for i in range(5)]
    assert stages[2].count == 5


def test_toolchain_error_of_a_stage_keeps_its_exit_code():
    from tpu_pipeline.toolchain.errors import InfeasibleError

    def bad(t):
        raise InfeasibleError("stage says no")

    run = run_pipeline([Stage("s", ("x",), ("y",), bad)], [{"x": np.zeros(1)}], timeout=10)
    assert run.error.exit_code == 3 and "stage says no" in str(run.error)


@pytest.mark.timing
def test_push_after_failure_raises_instead_of_blocking():
    r = PipelinedRunner([add_stage("s0", "x", "y", 0, fail_at=0)])
    r.push({"x": np.array([0])})
    deadline = time.monotonic() + 120  # a hang guard only: the worker records the error at once
    while r.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(PipelineError, match="segment 0"):
        for i in range(5):  # the queue holds one item: without the error this would block
            r.push({"x": np.array([1])})
    with pytest.raises(PipelineError):
        r.pop(timeout=5)
    r.close()


@pytest.mark.timing
def test_stuck_stage_pop_times_out_naming_it():
    release = threading.Event()

    def stuck(t):
        release.wait(30)
        return {"y": t["x"]}

    r = PipelinedRunner([add_stage("fast", "x", "a", 1), Stage("slow", ("a",), ("y",), stuck)])
    r.push({"x": np.array([0])})
    with pytest.raises(PipelineError, match=r"segment 1 \(slow\) is still running"):
        r.pop(timeout=0.5)
    release.set()
    r.close()


def test_queues_are_bounded():
    """With nobody popping, a 3-stage pipeline with 1-item queues holds a bounded number of items."""
    seen = []
    stages = [add_stage(f"s{k}", "x" if k == 0 else f"t{k-1}", f"t{k}", 0, seen=seen if k == 0 else None)
              for k in range(3)]
    r = PipelinedRunner(stages, final_outputs=["t2"])
    pushed = []

    def feed():
        for i in range(50):
            try:
                r.push({"x": np.array([i])})
            except PipelineError:
                return
            pushed.append(i)

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    time.sleep(0.5)
    # 4 queues of one item + one item inside each of 3 stages: at most 7 in flight.
    assert len(pushed) <= 7 and len(seen) <= 6
    r.close()
    t.join(5)


def test_missing_input_tensor_is_an_error_not_a_hang():
    run = run_pipeline([Stage("needs-z", ("z",), ("y",), lambda t: {"y": t["z"]})], [{"x": np.zeros(1)}],
                       timeout=10)
    assert run.outputs == [] and "needs-z" in str(run.error) and "'z'" in str(run.error)


def test_bad_input_iterator_stops_the_run():
    def gen():
        yield {"x": np.array([1])}
        raise ValueError("no more data")

    run = run_pipeline([add_stage("s", "x", "y", 1)], gen(), timeout=10)
    assert [int(o["y"][0]) for o in run.outputs] == [2]
    assert "no more data" in str(run.error)


@settings(max_examples=25, deadline=None)
@given(n_stages=st.integers(1, 5), n_items=st.integers(0, 12), ks=st.lists(st.integers(-5, 5), min_size=5, max_size=5))
def test_pipeline_equals_sequential_composition(n_stages, n_items, ks):
    stages = [add_stage(f"s{i}", "x" if i == 0 else f"t{i-1}", f"t{i}", ks[i]) for i in range(n_stages)]
    run = run_pipeline(stages, [{"x": np.array([i])} for i in range(n_items)], timeout=10)
    assert run.error is None
    assert [int(o[f"t{n_stages-1}"][0]) for o in run.outputs] == [i + sum(ks[:n_stages]) for i in range(n_items)]


def test_latency_stats_nearest_rank():
    s = LatencyStats.of([5, 1, 4, 2, 3, 10, 9, 8, 7, 6])
    assert (s.min_s, s.median_s, s.p90_s, s.max_s, s.n) == (1, 5.5, 9, 10, 10)
    assert LatencyStats.of([]) is None
    assert LatencyStats.of([2.0]).p90_s == 2.0

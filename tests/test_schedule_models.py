"""Reordered real models: identical outputs in LiteRT and TFLite Micro, and the arena head that real
TFLite Micro reports equals the prediction for the new order."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import fixture_models, run_cli, tflm_models
from tpu_pipeline.toolchain.execute.litert import seeded_outputs
from tpu_pipeline.toolchain.execute.tflm import run_tflm_in_child
from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena
from tpu_pipeline.toolchain.ir import from_model, to_model
from tpu_pipeline.toolchain.loader import load
from tpu_pipeline.toolchain.memory import lifetimes, order_free_lower_bound, tflm_greedy
from tpu_pipeline.toolchain.schedule import schedule
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

MODELS = [p for p in tflm_models() if "irregular" in p.name or "randwire" in p.name or "concat" in p.name
          or "multi_output" in p.name]


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_reordered_model_runs_identically_and_matches_prediction(path, tmp_path):
    model, graph = load(path)
    res = schedule(graph, time_limit=20)
    assert graph.is_topological(res.order)
    assert res.peak <= lifetimes(graph).peak
    assert res.peak == lifetimes(graph, res.order).peak
    assert order_free_lower_bound(graph) <= res.lower_bound <= res.peak
    new_graph = graph.reordered(res.order)
    data = model_to_bytes(to_model(new_graph, model))
    again = from_model(read_model(data))
    assert [op.opcode for op in again.ops] == [graph.ops[i].opcode for i in res.order]
    assert lifetimes(again).peak == res.peak
    # the head real TFLite Micro allocates is what the model predicts for the new order
    assert measure_tflm_arena(data).head == tflm_greedy(lifetimes(again)).size
    # outputs bit-identical: LiteRT with LiteRT, TFLM with TFLM
    for a, b in zip(seeded_outputs(path), seeded_outputs(data)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(run_tflm_in_child(path), run_tflm_in_child(data)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("path", fixture_models(), ids=lambda p: p.name)
def test_schedule_every_committed_model(path):
    _, graph = load(path)
    for sem in ("tflm", "tflite"):
        res = schedule(graph, time_limit=10, semantics=sem)
        assert res.peak == lifetimes(graph, res.order, sem).peak <= lifetimes(graph, None, sem).peak
        assert res.lower_bound <= res.peak
        if res.proven_optimal:
            assert res.lower_bound == res.peak


def test_cli_writes_model_and_reports(tmp_path):
    src = next(p for p in MODELS if "randwire" in p.name or "irregular" in p.name)
    out = tmp_path / "out.tflite"
    proc = run_cli("schedule", str(src), "-o", str(out), "--json", "--time-limit", "10")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert out.exists()
    _, g = load(out)
    assert lifetimes(g).peak == rep["peak"] <= rep["stored_peak"]
    assert rep["lower_bound"] <= rep["peak"]
    assert rep["tflm_head_after"] == measure_tflm_arena(out).head
    proc = run_cli("schedule", str(src), "--method", "greedy")
    assert proc.returncode == 0 and "peak" in proc.stdout
    proc = run_cli("schedule", str(src), "--method", "cpsat", "--time-limit", "10")
    assert proc.returncode == 0, proc.stderr


def test_cli_errors(tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"not a model")
    proc = run_cli("schedule", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    src = MODELS[0]
    proc = run_cli("schedule", str(src), "-o", str(src))
    assert proc.returncode == 2 and "overwrite" in proc.stderr
    proc = run_cli("schedule", str(src), "--time-limit", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr

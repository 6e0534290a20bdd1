"""The memory model predicts, to the byte, the arena head that real TFLite Micro allocates."""

from __future__ import annotations

import random

import pytest

from conftest import tflm_models
from toolchain.execute.tflm_arena import measure_tflm_arena
from toolchain.ir import from_model, load, to_model
from toolchain.memory import check_plan, lifetimes, order_free_lower_bound, tflite_arena, tflm_greedy
from toolchain.tflite import model_to_bytes

MODELS = tflm_models()


def _random_topological_order(graph, seed):
    rng = random.Random(seed)
    indeg = [len(p) for p in graph.preds]
    ready = [i for i, d in enumerate(indeg) if d == 0]
    order = []
    while ready:
        op = ready.pop(rng.randrange(len(ready)))
        order.append(op)
        for s in sorted(graph.succs[op]):
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    return order


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_predicted_head_equals_real_tflm(path):
    _, graph = load(path)
    lt = lifetimes(graph, semantics="tflm")
    plan = tflm_greedy(lt)
    assert check_plan(lt, plan.offsets, alignment=16) == []
    assert measure_tflm_arena(path).head == plan.size


@pytest.mark.parametrize("path", [p for p in MODELS if "irregular" in p.name or "randwire" in p.name],
                         ids=lambda p: p.name)
@pytest.mark.parametrize("seed", [1, 2])
def test_prediction_holds_for_reordered_models(path, seed):
    model, graph = load(path)
    order = _random_topological_order(graph, seed)
    reordered = graph.reordered(order)
    data = model_to_bytes(to_model(reordered, model))
    again = from_model(__import__("toolchain.tflite", fromlist=["read_model"]).read_model(data))
    plan = tflm_greedy(lifetimes(again, semantics="tflm"))
    assert measure_tflm_arena(data).head == plan.size
    assert lifetimes(again).peak == lifetimes(graph, order).peak


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_bounds_are_ordered(path):
    _, graph = load(path)
    lt = lifetimes(graph)
    assert order_free_lower_bound(graph) <= lt.peak <= tflm_greedy(lt).size
    lt2 = lifetimes(graph, semantics="tflite")
    plan = tflite_arena(lt2)
    assert check_plan(lt2, plan.offsets) == []
    assert lt2.peak <= plan.size

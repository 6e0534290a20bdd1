"""Partitioning and reordering real converter output: space-to-batch pairs (dilated convolutions
as TF1/DeepLab write them), dynamic-batch models, custom ops, and the determinism of the
partitioner. Fixtures: tests/fixtures/darts_s2b_*.tflite (tools/build_zoo.py --fixtures)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from toolchain.ir import from_model
from toolchain.partition import PartitionProblem, partition
from toolchain.cost.edgetpu import EdgeTpuCostModel
from toolchain.rewrite.numerics import litert_interpreter, random_inputs, run_tflm
from toolchain.tflite import model_to_bytes, read_model
from toolchain.tflite.extract import extract_segment, runtime_shapes, stale_shapes, with_static_shapes

FIX = Path(__file__).parent / "fixtures"
DARTS = ["darts_s2b_int8", "darts_s2b_float32", "darts_s2b_dynbatch_int8", "darts_s2b_dynbatch_float32"]


def _load(name):
    return read_model(FIX / f"{name}.tflite")


def _segments(model, graph, stages, n):
    problem = PartitionProblem(graph, EdgeTpuCostModel("coral-usb"))
    ifaces = problem.interfaces(stages, n)
    return [model_to_bytes(extract_segment(model, [v for v, s in enumerate(stages) if s == k],
                                           ifaces[k].inputs, ifaces[k].outputs)) for k in range(n)]


def _chain_equals_whole(whole: bytes, segments: list[bytes], samples: int = 2):
    """Every segment loads in LiteRT; chained by tensor name they reproduce the whole model
    bit for bit."""
    ref = litert_interpreter(whole)
    segs = [litert_interpreter(s) for s in segments]  # raises ModelError if one cannot be prepared
    rng = np.random.default_rng(0)
    for _ in range(samples):
        env = {}
        for d, x in zip(ref.get_input_details(), random_inputs(ref.get_input_details(), rng)):
            ref.set_tensor(d["index"], x)
            env[d["name"]] = x
        ref.invoke()
        want = {d["name"]: ref.get_tensor(d["index"]).copy() for d in ref.get_output_details()}
        for it in segs:
            for d in it.get_input_details():
                it.set_tensor(d["index"], env[d["name"]])
            it.invoke()
            env.update({d["name"]: it.get_tensor(d["index"]).copy() for d in it.get_output_details()})
        for name, w in want.items():
            assert np.array_equal(env[name], w), name


def _pairs(graph):
    """(space_to_batch op, batch_to_space op) positions, matched by walking forward."""
    s2b = [i for i, op in enumerate(graph.ops) if op.opcode == "SPACE_TO_BATCH_ND"]
    b2s = [i for i, op in enumerate(graph.ops) if op.opcode == "BATCH_TO_SPACE_ND"]
    assert len(s2b) == len(b2s) == 8
    return s2b, b2s


def test_fixtures_hold_space_to_batch_pairs_and_dynamic_batch_stores_placeholders():
    for name in DARTS:
        g = from_model(_load(name))
        _pairs(g)
    dyn = _load("darts_s2b_dynbatch_int8")
    stale = stale_shapes(dyn)
    # the tensors between the pairs: stored [1, ...], allocated [4, ...] by LiteRT
    assert stale and all(old[0] == 1 and new[0] == 4 and old[1:] == new[1:] for old, new in stale.values())
    assert stale_shapes(_load("darts_s2b_int8")) == {}


@pytest.mark.parametrize("name", DARTS)
def test_cut_right_after_each_space_to_batch_loads_and_chains(name):
    """Two segments cut between SPACE_TO_BATCH_ND and its BATCH_TO_SPACE_ND: the boundary tensor
    has batch 4 at run time. (Before the fix, the dynamic-batch segments kept the stored batch 1
    and LiteRT refused them: batch_to_space_nd.cc output_batch_size % block_shape != 0.)"""
    model = _load(name)
    g = from_model(model)
    whole = model_to_bytes(model)
    s2b, _ = _pairs(g)
    for cut in (s2b[0], s2b[3], s2b[-1]):
        # segment 0: every op up to the cut in the stored (topological) order
        stages = tuple(0 if v <= cut else 1 for v in range(len(g.ops)))
        segs = _segments(model, g, stages, 2)
        seg1 = read_model(segs[1])
        batch = [int(seg1.subgraphs[0].tensors[t].shape[0]) for t in seg1.subgraphs[0].inputs]
        assert 4 in batch
        _chain_equals_whole(whole, segs)


@pytest.mark.parametrize("name", ["darts_s2b_dynbatch_int8", "darts_s2b_int8", "darts_s2b_dynbatch_float32"])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_partition_segments_load_and_chain_for_every_n(name, n):
    model = _load(name)
    g = from_model(model)
    p = partition(g, n, time_limit=5.0)
    _chain_equals_whole(model_to_bytes(model), _segments(model, g, p.stages, n), samples=1)


def test_with_static_shapes_writes_litert_shapes_and_leaves_static_models_alone():
    dyn = _load("darts_s2b_dynbatch_int8")
    fixed, changed = with_static_shapes(dyn)
    assert set(changed) == set(stale_shapes(dyn))
    assert stale_shapes(fixed) == {}
    real = runtime_shapes(dyn)
    for i, t in enumerate(fixed.subgraphs[0].tensors):
        if i in real:
            assert tuple(int(d) for d in t.shape) == real[i]
            assert t.shapeSignature is None or all(int(d) >= 0 for d in t.shapeSignature)
    static = _load("darts_s2b_int8")
    assert with_static_shapes(static) == (static, {})
    # LiteRT gives the same outputs before and after (it recomputed these shapes anyway)
    _chain_equals_whole(model_to_bytes(dyn), [model_to_bytes(fixed)])

"""Partitioning and reordering real converter output: space-to-batch pairs (dilated convolutions
as TF1/DeepLab write them), dynamic-batch models, custom ops, and the determinism of the
partitioner. Fixtures: tests/fixtures/darts_s2b_*.tflite (tools/build_zoo.py --fixtures)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from helpers.models import with_custom_op
from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.toolchain.ir import from_model
from tpu_pipeline.toolchain.partition import PartitionProblem, partition
from tpu_pipeline.toolchain.cost.edgetpu import EdgeTpuCostModel
from tpu_pipeline.toolchain.execute.compare import verify_chain, verify_models
from tpu_pipeline.toolchain.execute.inputs import random_inputs
from tpu_pipeline.toolchain.execute.litert import input_details, litert_interpreter, run_litert, runtime_shapes
from tpu_pipeline.toolchain.execute.tflm import run_tflm, run_tflm_in_child
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model
from tpu_pipeline.toolchain.tflite.extract import extract_segment, stale_shapes, with_static_shapes

FIX = Path(__file__).parent / "fixtures"
DARTS = ["darts_s2b_int8", "darts_s2b_float32", "darts_s2b_dynbatch_int8", "darts_s2b_dynbatch_float32"]


def _load(name):
    return read_model(FIX / f"{name}.tflite")


def _stale(model):
    return stale_shapes(model, runtime_shapes(model))


def _segments(model, graph, stages, n):
    problem = PartitionProblem(graph, EdgeTpuCostModel(load_device("coral-usb")))
    ifaces = problem.interfaces(stages, n)
    return [model_to_bytes(extract_segment(model, [v for v, s in enumerate(stages) if s == k],
                                           ifaces[k].inputs, ifaces[k].outputs, real=runtime_shapes(model)))
            for k in range(n)]


def _chain_equals_whole(whole: bytes, segments: list[bytes], samples: int = 2):
    """Every segment loads in LiteRT; chained by tensor name they reproduce the whole model
    bit for bit (VerificationError otherwise)."""
    assert verify_chain([("whole", whole, "")], segments, samples=samples)["bit_identical"]


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
    stale = stale_shapes(dyn, runtime_shapes(dyn))
    # the tensors between the pairs: stored [1, ...], allocated [4, ...] by LiteRT
    assert stale and all(old[0] == 1 and new[0] == 4 and old[1:] == new[1:] for old, new in stale.values())
    assert _stale(_load("darts_s2b_int8")) == {}


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
    p = partition(g, n, time_limit=2.0)
    _chain_equals_whole(model_to_bytes(model), _segments(model, g, p.stages, n), samples=1)


def test_with_static_shapes_writes_litert_shapes_and_leaves_static_models_alone():
    dyn = _load("darts_s2b_dynbatch_int8")
    fixed, changed = with_static_shapes(dyn, runtime_shapes(dyn))
    assert set(changed) == set(stale_shapes(dyn, runtime_shapes(dyn)))
    assert stale_shapes(fixed, runtime_shapes(fixed)) == {}
    real = runtime_shapes(dyn)
    for i, t in enumerate(fixed.subgraphs[0].tensors):
        if i in real:
            assert tuple(int(d) for d in t.shape) == real[i]
            assert t.shapeSignature is None or all(int(d) >= 0 for d in t.shapeSignature)
    static = _load("darts_s2b_int8")
    assert with_static_shapes(static, runtime_shapes(static)) == (static, {})
    # LiteRT gives the same outputs before and after (it recomputed these shapes anyway)
    _chain_equals_whole(model_to_bytes(dyn), [model_to_bytes(fixed)])


# ---- item 2: what TFLite Micro reads without having written it ------------------------------------

def _sub_model(model, op_positions, inputs, outputs):
    """`model` with its main subgraph cut down to these ops (every tensor kept, so tensor indices
    and the offline plan's length stay those of the model)."""
    out = copy.copy(model)
    sg = copy.copy(model.subgraphs[0])
    sg.operators = [model.subgraphs[0].operators[i] for i in op_positions]
    sg.inputs, sg.outputs = list(inputs), list(outputs)
    out.subgraphs = [sg]
    return out


def _first_pair(model):
    g = from_model(model)
    s2b, b2s = _pairs(g)
    ops = list(range(s2b[0], b2s[0] + 1))
    assert [g.ops[i].opcode for i in ops] == ["SPACE_TO_BATCH_ND", "DEPTHWISE_CONV_2D", "CONV_2D", "BATCH_TO_SPACE_ND"]
    return g, ops, g.ops[ops[0]].inputs[0], g.ops[ops[-1]].outputs[0]


def _planned(model, offsets: dict[int, int]):
    from tpu_pipeline.toolchain.tflite import with_offline_plan
    plan = [-1] * len(model.subgraphs[0].tensors)
    for t, off in offsets.items():
        plan[t] = off
    return model_to_bytes(with_offline_plan(model, plan))


def test_tflm_batch_to_space_on_placeholder_shapes_leaves_output_bytes_unwritten():
    """Minimal reproducer: SPACE_TO_BATCH_ND -> DEPTHWISE -> CONV -> BATCH_TO_SPACE_ND of the
    dynamic-batch fixture (float32). TFLite Micro runs it on the stored batch-1 shapes, so
    BATCH_TO_SPACE_ND writes only the (even row, even column) quarter of its output. With an
    offline plan that puts the output on the input's bytes (legal: their lifetimes do not meet),
    the other three quarters ARE the input; on fresh bytes they are zeros. With the real shapes
    written (with_static_shapes) both plans give LiteRT's output."""
    dyn = _load("darts_s2b_dynbatch_float32")
    g, ops, t_in, t_out = _first_pair(dyn)
    mids = [g.ops[i].outputs[0] for i in ops[:-1]]
    x = np.random.default_rng(1).standard_normal((1, 16, 16, 8)).astype(np.float32)

    def run(model, out_offset):
        offsets = {t_in: 0, t_out: out_offset}
        offsets.update({t: 16384 * (k + 1) for k, t in enumerate(mids)})
        # a child process: its arena is fresh memory (in this process a freed heap may be reused)
        return run_tflm_in_child(_planned(model, offsets), [x])[0]

    tiny = _sub_model(dyn, ops, [t_in], [t_out])
    shared, fresh = run(tiny, 0), run(tiny, 65536)
    odd = np.ones((16, 16), dtype=bool)
    odd[0::2, 0::2] = False
    assert not np.array_equal(shared, fresh)
    assert np.array_equal(shared[0][odd], x[0][odd])          # never written: the input's bytes
    assert not np.any(fresh[0][odd])                          # never written: a fresh arena's zeros
    assert np.array_equal(shared[0][~odd], fresh[0][~odd])   # the quarter it did write

    fixed, changed = with_static_shapes(tiny, runtime_shapes(tiny))
    assert set(mids) <= set(changed)
    want = litert_interpreter(model_to_bytes(tiny))
    want.set_tensor(want.get_input_details()[0]["index"], x)
    want.invoke()
    ref = want.get_tensor(want.get_output_details()[0]["index"])
    a, b = run(fixed, 0), run(fixed, 65536)
    assert np.array_equal(a, b)
    np.testing.assert_allclose(a, ref, rtol=1e-5, atol=1e-5)


def _reordered(model, order):
    out = copy.copy(model)
    sg = copy.copy(model.subgraphs[0])
    sg.operators = [model.subgraphs[0].operators[i] for i in order]
    out.subgraphs = [sg] + list(model.subgraphs[1:])
    return model_to_bytes(out)


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_reordering_changes_tflm_outputs_only_on_placeholder_shapes(dtype):
    """The issue's symptom: another topological order gives other TFLite Micro outputs (LiteRT:
    identical) on the dynamic-batch model; with the real shapes written, every order agrees."""
    from tpu_pipeline.toolchain.partition.heuristic import coral_topological_sort

    dyn = _load(f"darts_s2b_dynbatch_{dtype}")
    order = coral_topological_sort(from_model(dyn))
    assert order != list(range(len(order)))
    assert _agree(model_to_bytes(dyn), _reordered(dyn, order)) == {"litert": True, "tflm": False}
    fixed, _ = with_static_shapes(dyn, runtime_shapes(dyn))
    assert _agree(model_to_bytes(fixed), _reordered(fixed, order)) == {"litert": True, "tflm": True}


def _agree(a: bytes, b: bytes) -> dict:
    """Whether two models give identical outputs on one random input, per runtime; TFLite Micro
    runs in fresh child processes, so each arena starts as a board's would (not a reused heap)."""
    x = random_inputs(input_details(a), np.random.default_rng(0))
    same = lambda p, q: all(np.array_equal(u, v) for u, v in zip(p, q))  # noqa: E731
    return {"litert": same(run_litert(a, x)[0], run_litert(b, x)[0]),
            "tflm": same(run_tflm_in_child(a, x), run_tflm_in_child(b, x))}


def test_tflm_space_to_batch_pads_with_whatever_the_arena_held():
    """Minimal reproducer of a TFLite Micro kernel bug: SPACE_TO_BATCH_ND allocates its
    parameters in Init and never fills them, so its pad value is the arena's previous content.
    The single SPACE_TO_BATCH_ND of the int8 fixture runs in child processes whose C heap fills
    every new allocation with a known byte (glibc's malloc perturb, the complement of the given
    byte): the padded border comes out as exactly that byte. LiteRT pads with the zero point
    (-128). tflm_hazards names this."""
    import os
    import subprocess
    import sys
    import textwrap

    from tpu_pipeline.toolchain.rewrite.verify import tflm_hazards

    code = textwrap.dedent(f"""
        import copy, numpy as np
        from tpu_pipeline.toolchain.tflite import read_model, model_to_bytes
        from tpu_pipeline.toolchain.ir import from_model
        from tpu_pipeline.toolchain.execute.litert import run_litert
        from tpu_pipeline.toolchain.execute.tflm import run_tflm, run_tflm_in_child
        m = read_model({str(FIX / 'darts_s2b_int8.tflite')!r})
        g = from_model(m)
        i = [k for k, op in enumerate(g.ops) if op.opcode == "SPACE_TO_BATCH_ND"][0]
        t = copy.copy(m); sg = copy.copy(m.subgraphs[0])
        sg.operators = [m.subgraphs[0].operators[i]]
        sg.inputs, sg.outputs = [g.ops[i].inputs[0]], [g.ops[i].outputs[0]]
        t.subgraphs = [sg]
        d = model_to_bytes(t)
        x = np.random.default_rng(0).integers(-128, 128, (1, 16, 16, 8)).astype(np.int8)
        print(int(run_tflm(d, [x], arena_size=1 << 20)[0][0, 0, 0, 0]), int(run_litert(d, [x])[0][0][0, 0, 0, 0]))
    """)
    for byte in (0x55, 0x11):
        env = dict(os.environ, MALLOC_PERTURB_=str(byte),
                   GLIBC_TUNABLES=f"glibc.malloc.perturb={byte}:glibc.malloc.mmap_threshold=33554432")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             cwd=str(Path(__file__).parent.parent), env=env)
        assert res.returncode == 0, res.stderr[-2000:]
        tflm, litert = (int(v) for v in res.stdout.split()[-2:])
        assert litert == -128
        assert tflm == int(np.array(~byte & 0xFF, dtype=np.uint8).view(np.int8)), (byte, tflm)
    assert any("SPACE_TO_BATCH_ND" in h for h in tflm_hazards(_load("darts_s2b_int8")))
    assert tflm_hazards(_load("tiny_irregular_int8")) == []


# ---- item 4: the same model and options give the same segments -----------------------------------

_PARTITION_CHILD = """
import sys
import tpu_pipeline.toolchain.partition.cpsat as pc
from tpu_pipeline.toolchain.ir import from_model
from tpu_pipeline.toolchain.partition import lattice, partition
from tpu_pipeline.toolchain.tflite import read_model
lattice.MAX_DOWNSETS = 0  # CP-SAT, as for a graph with too many down-sets
pc.DTIME_PER_SECOND = float(sys.argv[3])
p = partition(from_model(read_model(sys.argv[1])), int(sys.argv[2]), time_limit=float(sys.argv[4]))
print(p.reproducible, ",".join(p.stopped_by), ",".join(map(str, p.stages)), sep="|")
"""


@pytest.mark.timing
def test_partition_is_reproducible_when_stopped_by_its_budget_on_a_loaded_machine():
    """Two partitions of the same model started together, next to a process that keeps a core
    busy, with a budget CP-SAT cannot prove optimality within: both stop on the deterministic
    budget, not the wall clock, and give the same stages (before: 2 workers racing a wall-clock
    limit gave different segments from run to run)."""
    import subprocess
    import sys

    root = str(Path(__file__).parent.parent)
    burn = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        args = [sys.executable, "-c", _PARTITION_CHILD, str(FIX / "darts_s2b_int8.tflite"), "5", "0.004", "60"]
        procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root)
                 for _ in range(2)]
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        burn.kill()
        burn.wait()
    results = []
    for (out, err), p in zip(outs, procs):
        assert p.returncode == 0, err[-2000:]
        reproducible, stopped, stages = out.strip().splitlines()[-1].split("|")
        assert reproducible == "True"
        assert "deterministic limit" in stopped  # the time-limited path, not a proof
        results.append(stages)
    assert results[0] == results[1]


# ---- item 10a: custom ops LiteRT has no kernel for -------------------------------------------------

def test_custom_op_and_everything_after_it_stay_in_the_last_segment():
    from tpu_pipeline.toolchain.errors import InfeasibleError
    from tpu_pipeline.toolchain.partition.host import litert_missing_kernels, verification_scope

    model = with_custom_op("chain_int8", after_op=3)       # conv x4, custom, conv x4
    g = from_model(model)
    assert [op.opcode for op in g.ops][4] == "CUSTOM:MyCustomDecoder"
    problem = PartitionProblem(g, EdgeTpuCostModel(load_device("coral-usb")))
    assert problem.host_ops == frozenset(range(4, 9))
    assert set(litert_missing_kernels(model, g)) == {4}
    for n in (2, 3, 4, 5):
        p = partition(g, n, time_limit=5.0)
        assert all(p.stages[v] == n - 1 for v in range(4, 9)), p.stages
        segs = _segments(model, g, p.stages, n)
        for s in segs[:-1]:
            litert_interpreter(s)             # every segment before the last loads here
        with pytest.raises(Exception, match="MyCustomDecoder"):
            litert_interpreter(segs[-1])
        scope = verification_scope(model, g, p.stages, p.interfaces)
        assert not scope.complete and scope.skipped_ops == tuple(range(4, 9))
        assert scope.unverified_outputs == (g.tensors[g.outputs[0]].name,)
        assert scope.compared == (g.tensors[g.ops[3].outputs[0]].name,)   # what the host op reads
        assert any("MyCustomDecoder" in r for r in scope.reasons)
        _chain_equals_whole(scope.reference, list(scope.segments))
    with pytest.raises(InfeasibleError, match="custom ops"):
        partition(g, 6, time_limit=5.0)


def test_custom_decoder_at_the_end_leaves_every_other_output_verifiable():
    from tpu_pipeline.toolchain.partition.host import verification_scope

    model = with_custom_op("multi_output_int8", after_op=None)
    g = from_model(model)
    for n in (2, 3):
        p = partition(g, n, time_limit=5.0)
        assert p.stages[len(g.ops) - 1] == n - 1
        scope = verification_scope(model, g, p.stages, p.interfaces)
        assert scope.unverified_outputs == (g.tensors[g.outputs[0]].name,)
        # the feature-map output and the decoder's input are compared
        assert g.tensors[g.outputs[1]].name in scope.compared and len(scope.compared) == 2
        _chain_equals_whole(scope.reference, list(scope.segments))


def test_a_model_without_custom_ops_is_verified_whole():
    from tpu_pipeline.toolchain.partition.host import verification_scope

    model = _load("darts_s2b_dynbatch_int8")
    g = from_model(model)
    p = partition(g, 3, time_limit=5.0)
    scope = verification_scope(model, g, p.stages, p.interfaces)
    assert scope.complete and scope.unverified_outputs == () and len(scope.segments) == 3
    _chain_equals_whole(scope.reference, list(scope.segments))


def test_explicit_space_to_batch_padding_makes_tflm_independent_of_the_arena():
    """The toolchain's answer to the uninitialised pad value: SPACE_TO_BATCH_ND reads an explicit
    PAD (which TFLite Micro fills with the zero point) and pads nothing itself. LiteRT: the same
    outputs bit for bit; TFLite Micro: no hazard left, and within 1 LSB of LiteRT where it was
    far off before."""
    from tpu_pipeline.toolchain.rewrite.verify import tflm_hazards
    from tpu_pipeline.toolchain.tflite.extract import explicit_space_to_batch_padding, runtime_exact_model

    for name in ("darts_s2b_int8", "darts_s2b_dynbatch_int8", "darts_s2b_float32"):
        src = _load(name)
        fixed, notes = runtime_exact_model(src, runtime_shapes(src))
        assert tflm_hazards(fixed) == [] and tflm_hazards(src) != []
        assert any("SPACE_TO_BATCH_ND" in n for n in notes)
        g = from_model(fixed)
        assert sum(op.opcode == "PAD" for op in g.ops) == 8
        a, b = model_to_bytes(src), model_to_bytes(fixed)
        assert next(v for v in verify_models(a, b, runs=2, runtimes=("litert",))).bit_exact
        x = random_inputs(input_details(b), np.random.default_rng(3))
        ref = run_litert(b, x)[0][0].astype(np.float64)
        after = np.abs(run_tflm(b, x)[0].astype(np.float64) - ref).max()
        before = np.abs(run_tflm(a, x)[0].astype(np.float64) - ref).max()
        if name.endswith("int8"):
            assert after <= 1 < before
        else:
            assert after <= 1e-5
    static = _load("tiny_irregular_int8")
    assert explicit_space_to_batch_padding(static) == (static, 0)
    assert runtime_exact_model(static, runtime_shapes(static)) == (static, [])


def test_runnable_part_of_the_input_and_of_a_reordered_model_compare_by_name():
    from tpu_pipeline.toolchain.partition.heuristic import coral_topological_sort
    from tpu_pipeline.toolchain.partition.host import runnable_part

    model = with_custom_op("tiny_irregular_int8", after_op=None)
    g = from_model(model)
    order = coral_topological_sort(g)
    other = read_model(_reordered(model, order))
    a, names_a = runnable_part(model, g)
    b, names_b = runnable_part(other, from_model(other))
    assert names_a == names_b == (g.tensors[g.ops[-1].inputs[0]].name,)
    with pytest.raises(Exception, match="MyCustomDecoder"):
        litert_interpreter(model_to_bytes(model))
    _chain_equals_whole(a, [b])


def test_dynamic_batch_model_with_a_custom_op_gets_its_real_shapes_and_segments():
    """LiteRT cannot prepare the whole model (no kernel for the custom op), so the real shapes
    come from the part before it; the space-to-batch tensors get batch 4 and every segment
    before the last loads and chains."""
    from tpu_pipeline.toolchain.partition.host import verification_scope

    plain = from_model(_load("darts_s2b_dynbatch_int8"))
    mean = next(i for i, op in enumerate(plain.ops) if op.opcode == "MEAN")
    model = with_custom_op("darts_s2b_dynbatch_int8", after_op=mean)
    with pytest.raises(Exception, match="MyCustomDecoder"):
        litert_interpreter(model_to_bytes(model))
    fixed, changed = with_static_shapes(model, runtime_shapes(model))
    assert len(changed) == len(_stale(_load("darts_s2b_dynbatch_int8"))) == 24
    g = from_model(model)
    for n in (3, 5):
        p = partition(g, n, time_limit=2.0)
        segs = _segments(model, g, p.stages, n)
        for s in segs[:-1]:
            litert_interpreter(s)
        scope = verification_scope(model, g, p.stages, p.interfaces)
        _chain_equals_whole(scope.reference, list(scope.segments))

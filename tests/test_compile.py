"""`tpu-pipeline compile`: segment files, report.json, LiteRT chaining, errors, co-deployment."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.cli import main
from tpu_pipeline.toolchain.execute.inputs import seeded_inputs
from tpu_pipeline.toolchain.execute.litert import litert_interpreter, run_named
from tpu_pipeline.toolchain.loader import load
from tpu_pipeline.toolchain.tflite import read_model
from tests.conftest import EXAMPLE, FIXTURES


@pytest.mark.parametrize("name, n", [("tiny_irregular_int8", 3), ("multi_output_int8", 2), ("concat_conv_int8", 4)])
def test_compile_writes_coral_named_segments_that_chain_bit_exactly(tmp_path, name, n, capsys):
    src = FIXTURES / f"{name}.tflite"
    out = tmp_path / "out"
    assert main(["compile", str(src), "-n", str(n), "-o", str(out), "--verify", "--time-limit", "5"]) == 0
    text = capsys.readouterr().out
    assert "segments (predicted)" in text and "Coral heuristic" in text
    rep = json.loads((out / "report.json").read_text())
    assert rep["model"] == f"{name}.tflite" and rep["num_segments"] == n and rep["device"] == "coral-usb"
    assert rep["source"] == str(src)
    assert rep["verification"]["bit_identical"] is True
    segs = [out / f"{name}_segment_{i}_of_{n}.tflite" for i in range(n)]
    assert [s["file"] for s in rep["segments"]] == [p.name for p in segs]
    assert (out / f"{name}.tflite").exists()
    for key in ("latency_s", "throughput_per_s", "energy_j"):
        assert rep["predicted"][key] > 0
    assert rep["predicted"]["throughput_per_s"] >= rep["baseline"]["predicted"]["throughput_per_s"]
    _, whole_graph = load(out / f"{name}.tflite")
    assert sum(s["ops"] for s in rep["segments"]) == len(whole_graph.ops)
    # every segment is a standalone model whose interface is what report.json says
    for s, p in zip(rep["segments"], segs):
        it = litert_interpreter(p)
        assert [d["name"] for d in it.get_input_details()] == s["inputs"]
        assert [d["name"] for d in it.get_output_details()] == s["outputs"]
        assert s["ops"] >= 1 and s["predicted_latency_s"] > 0
    assert rep["segments"][-1]["outputs"] == rep["outputs"]
    # chain ourselves, by name, against the ORIGINAL model
    ref = litert_interpreter(src)
    feeds = {d["name"]: x for d, x in zip(ref.get_input_details(), seeded_inputs(ref.get_input_details(), 1))}
    want = run_named(ref, feeds)
    env = dict(feeds)
    for p in segs:
        env.update(run_named(litert_interpreter(p), env))
    for name, w in want.items():
        assert np.array_equal(env[name], w), name


def test_segments_keep_only_the_buffers_they_need(tmp_path):
    src = FIXTURES / "tiny_irregular_int8.tflite"
    assert main(["compile", str(src), "-n", "3", "-o", str(tmp_path), "--no-rewrite", "--no-schedule"]) == 0
    whole = read_model(tmp_path / "tiny_irregular_int8.tflite")
    used = lambda m: sum(len(b.data) for b in m.buffers if b.data is not None and len(b.data))  # noqa: E731
    seg = [read_model(tmp_path / f"tiny_irregular_int8_segment_{i}_of_3.tflite") for i in range(3)]
    meta = lambda m: sum(len(m.buffers[e.buffer].data) for e in (m.metadata or []) if m.buffers[e.buffer].data is not None)  # noqa: E731
    # Every segment carries exactly the constants its own ops read (a constant read in two segments
    # is in both), and together they carry every constant of the whole model.
    names = lambda m: {m.subgraphs[0].tensors[t].name for o in m.subgraphs[0].operators for t in o.inputs  # noqa: E731
                       if t >= 0 and m.buffers[m.subgraphs[0].tensors[t].buffer].data is not None
                       and len(m.buffers[m.subgraphs[0].tensors[t].buffer].data)}
    for s in seg:  # no buffer that none of its ops reads
        sg = s.subgraphs[0]
        read = {sg.tensors[t].buffer for o in sg.operators for t in o.inputs if t >= 0}
        assert used(s) - meta(s) == sum(len(s.buffers[b].data) for b in read if s.buffers[b].data is not None)
    assert set().union(*(names(s) for s in seg)) == names(whole)
    for s in seg:
        sg = s.subgraphs[0]
        referenced = {t for o in sg.operators for t in (*o.inputs, *o.outputs) if t >= 0} | set(sg.inputs) | set(sg.outputs)
        assert referenced == set(range(len(sg.tensors)))


@pytest.mark.parametrize("n, code, message", [("0", 2, "between 1 and the number of ops"),
                                               ("1000", 2, "between 1 and the number of ops")])
def test_bad_n_is_a_usage_error_and_writes_nothing(tmp_path, capsys, n, code, message):
    out = tmp_path / "never"
    assert main(["compile", str(FIXTURES / "chain_int8.tflite"), "-n", n, "-o", str(out)]) == code
    err = capsys.readouterr().err
    assert message in err and "chain_int8.tflite" in err and "Traceback" not in err
    assert not out.exists()


def test_infeasible_n_exits_3(tmp_path, capsys):
    _, g = load(FIXTURES / "multi_output_int8.tflite")
    from tpu_pipeline.toolchain.partition import PartitionProblem
    from tpu_pipeline.toolchain.cost import EdgeTpuCostModel
    limit = PartitionProblem(g, EdgeTpuCostModel(load_device("coral-usb"))).max_stages()
    if limit >= len(g.ops):
        pytest.skip("every op can have its own segment in this fixture")
    out = tmp_path / "never"
    assert main(["compile", str(FIXTURES / "multi_output_int8.tflite"), "-n", str(limit + 1), "-o", str(out)]) == 3
    assert "at most" in capsys.readouterr().err
    assert not out.exists()


def test_bad_inputs(tmp_path, capsys):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"not a model at all")
    assert main(["compile", str(bad), "-n", "2", "-o", str(tmp_path / "o")]) == 2
    assert main(["compile", str(tmp_path / "missing.tflite"), "-n", "2", "-o", str(tmp_path / "o")]) == 2
    assert main(["compile", str(FIXTURES / "chain_int8.tflite"), "-n", "2", "--time-limit", "0", "-o", str(tmp_path / "o")]) == 2
    assert main(["compile", str(FIXTURES / "chain_int8.tflite"), "-n", "2", "--device", "sparkfun-edge",
                 "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "not a TFLite model" in err and "no such file" in err
    assert not (tmp_path / "o").exists()


def test_json_and_strategies(tmp_path, capsys):
    src = FIXTURES / "concat_conv_int8.tflite"
    for strategy in ("1-3", "1-2-3", "2-1-3", "coral", "latency"):
        assert main(["compile", str(src), "-n", "3", "-o", str(tmp_path / strategy), "--strategy", strategy, "--json"]) == 0
        rep = json.loads(capsys.readouterr().out)
        assert rep["strategy"] == strategy and len(rep["segments"]) == 3
    # the coral strategy reproduces the baseline exactly
    coral = json.loads((tmp_path / "coral" / "report.json").read_text())
    assert coral["predicted"] == coral["baseline"]["predicted"]


def test_co_deployment_of_two_models(tmp_path, capsys):
    a, b = FIXTURES / "tiny_irregular_int8.tflite", FIXTURES / "concat_conv_int8.tflite"
    out = tmp_path / "co"
    assert main(["compile", str(a), str(b), "-n", "3", "-o", str(out), "--verify", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    stem = "tiny_irregular_int8+concat_conv_int8"
    assert rep["model"] == f"{stem}.tflite" and len(rep["models"]) == 2
    assert rep["verification"]["whole_vs_source"]["bit_identical"] is True
    assert all((out / f"{stem}_segment_{i}_of_3.tflite").exists() for i in range(3))
    assert rep["models"][0]["inputs"] == ["tiny_irregular_int8/" + n for n in
                                          [d["name"] for d in litert_interpreter(a).get_input_details()]]


@pytest.mark.skipif(not EXAMPLE.exists(), reason="example model not built")
def test_example_model_n4_verifies(tmp_path):
    assert main(["compile", str(EXAMPLE), "-n", "4", "-o", str(tmp_path), "--verify", "--time-limit", "10"]) == 0


def test_compile_passes_reorder_and_plan_for_tflite_micro(tmp_path):
    """The whole model compile writes is reordered to the proven optimum and carries an offline
    plan that real TFLite Micro follows to the byte, below TFLM's own planner."""
    from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena
    from tpu_pipeline.toolchain.loader import load
    from tpu_pipeline.toolchain.memory import lifetimes, tflm_greedy
    from tpu_pipeline.toolchain.tflite import read_offline_plan

    assert main(["compile", str(EXAMPLE), "-n", "2", "-o", str(tmp_path), "--semantics", "tflm", "--json"]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    passes = {p["name"]: p["detail"] for p in report["passes"]}
    assert passes["schedule"]["proven_optimal"] and passes["schedule"]["peak"] <= passes["schedule"]["peak_before"]
    whole = tmp_path / report["model"]
    model, graph = load(whole)
    assert lifetimes(graph, semantics="tflm").peak == passes["schedule"]["peak"]
    assert read_offline_plan(model) is not None
    head = measure_tflm_arena(whole).head
    assert head == passes["plan"]["tflm_head_bytes"] < tflm_greedy(lifetimes(graph)).size
    assert head >= passes["plan"]["lower_bound"]


def test_a_compile_whose_searches_need_no_cp_sat_never_loads_or_tools(tmp_path):
    """OR-Tools imports pandas (~0.5 s of a 2 s compile): the demo's compile (its partition by the
    down-set DP, its schedule by the DP) must not load it, in a fresh process as the CLI runs."""
    import subprocess
    import sys

    code = ("import sys; from tpu_pipeline.cli import main; "
            f"rc = main(['compile', {str(EXAMPLE)!r}, '-n', '4', '-o', {str(tmp_path / 'o')!r}]); "
            "print(rc, 'ortools.sat.python.cp_model' in sys.modules, 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=str(Path(__file__).parent.parent))
    assert out.stdout.split()[-3:] == ["0", "False", "False"], out.stderr[-2000:]


def test_verify_checks_the_segment_files_as_written(tmp_path, monkeypatch):
    """--verify runs the segments compile writes, not a fresh cut of them: a written segment
    whose weights were changed after the segments pass fails the check (exit 1)."""
    import dataclasses

    import tpu_pipeline.toolchain.compile as compile_pkg
    from tpu_pipeline.toolchain.tflite import model_to_bytes

    def corrupted(data: bytes) -> bytes:
        model = read_model(data)
        for buf in model.buffers:  # every constant of the segment
            if buf.data is not None and len(buf.data):
                buf.data = (np.asarray(buf.data, dtype=np.uint8) + np.uint8(37)).astype(np.uint8)
        return model_to_bytes(model)

    k = next(i for i, p in enumerate(compile_pkg.PASSES) if p.name == "segments")
    real = compile_pkg.PASSES[k]

    def segments_then_tamper(state, allowed):
        state, record = real.run(state, allowed)
        segs = list(state.segments)
        segs[1] = dataclasses.replace(segs[1], chunks=(corrupted(segs[1].data),))  # the file as its one piece
        return dataclasses.replace(state, segments=tuple(segs)), record

    passes = list(compile_pkg.PASSES)
    passes[k] = dataclasses.replace(real, run=segments_then_tamper)
    monkeypatch.setattr(compile_pkg, "PASSES", passes)
    assert main(["compile", str(EXAMPLE), "-n", "4", "-o", str(tmp_path), "--verify"]) == 1

"""What Coral users ask the compiler (issue 33): `-n auto`, `--cuts`, off-chip streaming explained,
`--profile` from a measured run. Real flatbuffers in, segments chained in LiteRT."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tpu_pipeline.cli import main
from tpu_pipeline.toolchain.cost.edgetpu import EdgeTpuCostModel
from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.loader import load
from tpu_pipeline.toolchain.manifest import load_manifest
from tpu_pipeline.toolchain.partition import PartitionProblem
from tpu_pipeline.toolchain.partition.auto import Candidate, choose
from tpu_pipeline.toolchain.partition.cuts import user_stages
from tests.conftest import FIXTURES

TINY = FIXTURES / "tiny_irregular_int8.tflite"
ADD12 = "tiny_irregular_1/re_lu_1/Relu;tiny_irregular_1/add_1/Add"       # op 12's output
CONV0 = "tiny_irregular_1/conv2d_1/Relu;tiny_irregular_1/conv2d_1/convolution"  # op 0's output


def _report(out):
    return json.loads((out / "report.json").read_text())


# ---- -n auto -----------------------------------------------------------------------------------
def _row(n, per_s):
    return Candidate(n, 1 / per_s, per_s, 0, 0, True, 1 / per_s, 0.0)


def test_choose_takes_the_fewest_tpus_within_the_knee_of_the_best_per_tpu():
    # per TPU: 100, 98, 60 -> n=1 is the best
    assert choose([_row(1, 100), _row(2, 196), _row(3, 180)], 0.05)[0] == 1
    # per TPU: 100, 130, 128 (a model that does not fit on one TPU): n=2 is the best
    n, why = choose([_row(1, 100), _row(2, 260), _row(3, 384)], 0.05)
    assert n == 2 and "best throughput per TPU" in why and "n=3 would be x1.48 faster" in why
    # per TPU: 90, 104, 105: n=2 is within 5 % of n=3's 105 and fewer TPUs
    n, why = choose([_row(1, 90), _row(2, 208), _row(3, 315)], 0.05)
    assert n == 2 and "within 5%" in why
    assert choose([_row(1, 90), _row(2, 208), _row(3, 315)], 0.0)[0] == 3


def test_n_auto_tabulates_every_n_and_writes_the_chosen_one(tmp_path, capsys):
    out = tmp_path / "auto"
    assert main(["compile", str(TINY), "-n", "auto", "--max-n", "4", "-o", str(out), "--verify",
                 "--time-limit", "4"]) == 0
    text = capsys.readouterr().out
    assert "n = 1..4 (predicted)" in text and "chose n=" in text
    rep = _report(out)
    rows = rep["n_candidates"]
    assert [r["n"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert set(r) >= {"n", "period_s", "throughput_per_s", "cached_bytes", "streamed_bytes", "proven"}
        assert r["throughput_per_s"] == pytest.approx(1 / r["period_s"])
        assert r["cached_bytes"] + r["streamed_bytes"] == rows[0]["cached_bytes"] + rows[0]["streamed_bytes"]
    best = max(r["throughput_per_s"] / r["n"] for r in rows)
    want = min(r["n"] for r in rows if r["throughput_per_s"] / r["n"] >= 0.95 * best)
    assert rep["n_chosen"] == want == rep["num_segments"] == len(rep["segments"]) and rep["n_chosen_reason"]
    assert rep["verification"]["bit_identical"] is True
    assert load_manifest(out).num_segments == want      # valid under the manifest (version 2)
    assert rep["version"] == 2
    assert 'id="n-auto"' in (out / "report.html").read_text()
    # the chosen n's segments are those a plain `-n <chosen>` compile writes
    plain = tmp_path / "plain"
    assert main(["compile", str(TINY), "-n", str(want), "-o", str(plain), "--time-limit", "4"]) == 0
    assert [s["ops"] for s in _report(plain)["segments"]] == [s["ops"] for s in rep["segments"]]
    assert _report(plain)["predicted"]["period_s"] == rep["predicted"]["period_s"]


def test_manifest_refuses_a_chosen_n_that_is_not_in_the_table(tmp_path):
    out = tmp_path / "auto"
    assert main(["compile", str(TINY), "-n", "auto", "--max-n", "2", "-o", str(out), "--time-limit", "2"]) == 0
    rep = _report(out)
    rep["n_chosen"] = 7
    (out / "report.json").write_text(json.dumps(rep))
    with pytest.raises(Exception, match="n_chosen: 7 is not one of the n_candidates"):
        load_manifest(out)


# ---- --cuts ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cuts, lines", [
    ("nope", ["cut 1: no tensor is named 'nope'"]),
    ("12,12", ["cut 2: op 12 (ADD) is already named in cut 1"]),
    (f"12,{ADD12}", ["cut 2: op 12 (ADD) is already named in cut 1"]),
    ("99", ["cut 1: op index 99 is out of range"]),
    ("12,0", ["cuts 1 and 2 form a cycle across stages"]),
    (f"{CONV0}+{ADD12}", ["cut 1 forms a cycle across stages"]),
    ("input_0", ["cut 1: 'input_0' is a graph input"]),
    ("Identity", ["segment 1 would be empty: no op follows cut 1", "op 16 (FULLY_CONNECTED) must be in the last segment"]),
    ("nope,12,12", ["cut 1: no tensor is named 'nope'", "cut 3: op 12 (ADD) is already named in cut 2"]),
])
def test_bad_cuts_give_one_line_each_and_exit_2(tmp_path, capsys, cuts, lines):
    assert main(["compile", str(TINY), "--cuts", cuts, "-o", str(tmp_path / "o")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("[")]
    assert len(err) == len(lines), err
    for got, want in zip(err, lines):
        assert want in got, (got, want)
    assert not (tmp_path / "o").exists()


def test_colocate_is_checked_on_user_cuts(tmp_path, capsys):
    # op 0's output is read by ops 1, 2 and 5; a cut after op 5 leaves 1 and 2 in the next segment
    assert main(["compile", str(TINY), "--cuts", "5", "--colocate", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"--colocate: tensor '{CONV0}' is read in segments 0, 1" in err
    assert main(["compile", str(TINY), "--cuts", "5", "-o", str(tmp_path / "o"), "--time-limit", "2"]) == 0


def test_a_state_tensor_split_by_the_cuts_is_refused():
    _, graph = load(TINY)
    t = graph.ops[12].outputs[0]  # make op 12's output a variable that ops 12 and 13 share
    tensors = list(graph.tensors)
    tensors[t] = dataclasses.replace(tensors[t], is_variable=True)
    problem = PartitionProblem(dataclasses.replace(graph, tensors=tuple(tensors)),
                               EdgeTpuCostModel(load_device("coral-usb")))
    assert problem.state_groups == ((12, 13),)
    with pytest.raises(UsageError, match=r"ops 12, 13 share the state tensor .* segments 0, 1"):
        user_stages(problem, graph, ("12",))
    assert user_stages(problem, graph, ("10",))  # a cut that keeps them together is fine


def test_user_cuts_are_written_verified_and_compared(tmp_path, capsys):
    out = tmp_path / "cut"
    cuts = tmp_path / "cuts.txt"
    cuts.write_text(f"# my cut points\n0\n{ADD12}\n")
    assert main(["compile", str(TINY), "--cuts", f"@{cuts}", "-o", str(out), "--verify", "--time-limit", "3"]) == 0
    assert "partitions side by side" in capsys.readouterr().out
    rep = _report(out)
    assert rep["num_segments"] == 3 and rep["strategy"] == "user"
    assert rep["verification"]["bit_identical"] is True
    segs = rep["segments"]
    assert segs[0]["ops"] == 1 and segs[0]["outputs"] == [CONV0]   # the cut tensors are the boundaries
    assert ADD12 in segs[1]["outputs"] and ADD12 in segs[2]["inputs"]
    names = [c["name"] for c in rep["compared"]]
    assert names == ["user", "ours", "coral"]
    user, ours, coral = rep["compared"]
    assert user["period_s"] == rep["predicted"]["period_s"]
    assert ours["period_s"] <= user["period_s"] and ours["period_s"] <= coral["period_s"]
    assert 'id="compared"' in (out / "report.html").read_text()
    # inline, with -n agreeing, the same partition
    again = tmp_path / "again"
    assert main(["compile", str(TINY), "--cuts", f"0,{ADD12}", "-n", "3", "-o", str(again), "--time-limit", "3"]) == 0
    assert [s["ops"] for s in _report(again)["segments"]] == [s["ops"] for s in segs]
    assert main(["compile", str(TINY), "--cuts", "0", "-n", "3", "-o", str(again)]) == 2
    assert main(["compile", str(TINY), "--cuts", "0", "-n", "auto", "-o", str(again)]) == 2


# ---- off-chip explained ------------------------------------------------------------------------
def _small_cache_device(tmp_path, sram: int):
    text = Path(load_device("coral-usb").path).read_text()
    dev = tmp_path / "tiny-cache.toml"
    dev.write_text(text.replace("param_sram_bytes = 8126464", f"param_sram_bytes = {sram}")
                   .replace('name = "coral-usb"', 'name = "tiny-cache"'))
    return dev


def test_offchip_lists_the_streaming_ops_in_caching_order_and_advises(tmp_path, capsys):
    dev = _small_cache_device(tmp_path, 1500)
    out = tmp_path / "off"
    assert main(["compile", str(TINY), "-n", "2", "--device", str(dev), "-o", str(out), "--time-limit", "3"]) == 0
    assert "off-chip: segment" in capsys.readouterr().out
    rep = _report(out)
    _, graph = load(out / "tiny_irregular_int8.tflite")
    problem = PartitionProblem(graph, EdgeTpuCostModel(load_device(dev)))
    streaming = [s for s in rep["segments"] if s["offchip_bytes"]]
    assert streaming
    for s in rep["segments"]:
        c = s["caching"]
        assert c["streamed_bytes"] == s["offchip_bytes"] and c["cached_bytes"] == s["sram_bytes"]
        assert sum(o["streamed_bytes"] for o in c["streamed_ops"]) == s["offchip_bytes"]
        assert c["advice"].startswith(f"segment {s['index']}")
        if not s["offchip_bytes"]:
            assert c["streamed_ops"] == [] and "cached on chip" in c["advice"]
            continue
        ops = [o["op"] for o in c["streamed_ops"]]
        assert ops == sorted(ops) and c["cache_full_at_op"] == ops[0] and c["cache_full_at_byte"] == 1500
    assert 'id="offchip"' in (out / "report.html").read_text()
    assert problem.model.sram_bytes == 1500


def test_caching_order_and_the_advice_to_move_ops_are_right():
    from tpu_pipeline.toolchain.partition.caching import explain

    _, graph = load(TINY)
    problem = PartitionProblem(graph, EdgeTpuCostModel(load_device("coral-usb")))
    problem.model.sram_bytes = 2600   # a small cache: the first segment (4,752 B) overflows, the second has room
    stages = tuple(0 if v <= 13 else 1 for v in range(len(graph.ops)))
    info = explain(problem, stages, 2)
    first = info[0]
    assert first["streamed_bytes"] > 0
    # execution order: the ops before the one where the cache ran out fit, with it they do not
    seg = [v for v in range(len(graph.ops)) if stages[v] == 0]
    full = first["cache_full_at_op"]
    before = sum(problem.op_costs[v].param_bytes for v in seg if v < full)
    assert before <= 2600 < before + problem.op_costs[full].param_bytes
    assert [o["op"] for o in first["streamed_ops"]] == [v for v in seg if v >= full and problem.op_costs[v].param_bytes]
    moved = first["move_to_next"]
    assert moved and f"moving op" in first["advice"], first["advice"]
    trial = [1 if v in moved else s for v, s in enumerate(stages)]
    after = problem.stage_costs(trial, 2)
    assert problem.is_valid(trial, 2) and after[0].offchip_bytes == 0 and after[1].offchip_bytes == 0


# ---- --profile ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """tiny_irregular compiled into 3 segments and run on the emulator (--json)."""
    root = tmp_path_factory.mktemp("prof")
    assert main(["compile", str(TINY), "-n", "3", "-o", str(root / "c"), "--time-limit", "3"]) == 0
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["run", str(root / "c"), "--backend", "emulator", "-N", "5", "--json"]) == 0
    (root / "run.json").write_text(buf.getvalue())
    return root


def test_profile_from_the_emulator_repartitions(profiled, tmp_path):
    out = tmp_path / "p"
    assert main(["compile", str(TINY), "-n", "3", "--profile", str(profiled / "run.json"), "-o", str(out),
                 "--verify", "--time-limit", "3"]) == 0
    rep = _report(out)
    prof = rep["profile"]
    assert prof["backend"] == "emulator" and prof["relative"] and prof["unmatched_ops"] == 0
    assert len(prof["stages"]) == 3 and all(s["measured_s"] > 0 and s["factor"] > 0 for s in prof["stages"])
    names = [c["name"] for c in rep["compared"]]
    assert names[0] == "ours" and "profiled" in names and "libcoral-profiling" in names
    ours = rep["compared"][0]
    assert all(ours["period_s"] <= c["period_s"] for c in rep["compared"])
    assert rep["verification"]["bit_identical"] is True


def test_a_stage_profiled_two_times_slow_shrinks(profiled, tmp_path):
    run = json.loads((profiled / "run.json").read_text())
    before = _report(profiled / "c")
    run["backend"] = "coral"   # as if measured on TPUs: every stage as predicted, stage 1 twice as slow
    for st in run["stages"]:
        st["latency"]["median_s"] = st["predicted_latency_s"] * (2.0 if st["index"] == 1 else 1.0)
    fake = tmp_path / "slow.json"
    fake.write_text(json.dumps(run))
    out = tmp_path / "p"
    assert main(["compile", str(TINY), "-n", "3", "--profile", str(fake), "-o", str(out), "--time-limit", "3"]) == 0
    rep = _report(out)
    target = rep["profile"]["stages"][1]["target_s"]
    assert target == pytest.approx(2 * before["segments"][1]["predicted_latency_s"])
    profiled_row = next(c for c in rep["compared"] if c["name"] == "profiled")
    # under the profile, the profiled partition's stage 1 takes its measured time ...
    assert profiled_row["stage_latency_s"][1] == pytest.approx(target, rel=1e-3)
    # ... and the refined partition gives that stage fewer ops and the pipeline a shorter period
    assert rep["segments"][1]["ops"] < before["segments"][1]["ops"]
    assert rep["predicted"]["period_s"] < profiled_row["period_s"]
    lib = next(c for c in rep["compared"] if c["name"] == "libcoral-profiling")
    assert rep["predicted"]["period_s"] <= lib["period_s"]
    # the refinement of a measured profile proves its answer within --gap (1 %) of the best possible
    assert rep["solver"]["gap"] <= 0.01 and rep["solver"]["refinement_stopped_by"] in ("proven", "within gap")


def test_a_bad_profile_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"backend": "mcu", "stages": []}))
    assert main(["compile", str(TINY), "-n", "2", "--profile", str(bad), "-o", str(tmp_path / "o")]) == 2
    assert "--profile takes a run on coral or emulator" in capsys.readouterr().err


# ---- co-compilation order ----------------------------------------------------------------------
def test_cocompile_order_follows_the_mix(tmp_path, capsys):
    text = Path(load_device("coral-usb").path).read_text()
    dev = tmp_path / "slow-link.toml"   # a small cache behind a slow link: who gets the cache matters
    dev.write_text(text.replace("param_sram_bytes = 8126464", "param_sram_bytes = 12000")
                   .replace("host_bandwidth_bytes_per_s = 4.2e+08", "host_bandwidth_bytes_per_s = 1.0e+07")
                   .replace('name = "coral-usb"', 'name = "slow-link"'))
    models = [str(TINY), str(FIXTURES / "chain_int8.tflite")]
    best = {}
    for mix in ("tiny_irregular_int8=1,chain_int8=5", "tiny_irregular_int8=5,chain_int8=1"):
        out = tmp_path / mix.replace(",", "_")
        assert main(["compile", *models, "-n", "2", "--device", str(dev), "--mix", mix, "-o", str(out),
                     "--time-limit", "2"]) == 0
        assert "co-compile order for the mix" in capsys.readouterr().out
        co = _report(out)["co_compile"]
        assert len(co["orders"]) == 2 and co["order"] == co["orders"][0]["order"]
        for row in co["orders"]:
            mean = sum(co["mix"][m] * row["period_s"][m] for m in row["order"]) / sum(co["mix"].values())
            assert row["mean_period_s"] == pytest.approx(mean)
        assert co["orders"][0]["mean_period_s"] < co["orders"][1]["mean_period_s"]
        first = co["order"][0]   # the first model gets the cache first: it caches at least as much as in the other order
        assert co["orders"][0]["cached_bytes"][first] >= co["orders"][1]["cached_bytes"][first]
        best[mix] = co["order"]
    # the model invoked more often gets the cache
    assert best["tiny_irregular_int8=1,chain_int8=5"][0] == "chain_int8"
    assert best["tiny_irregular_int8=5,chain_int8=1"][0] == "tiny_irregular_int8"
    assert main(["compile", str(TINY), "-n", "2", "--mix", "a=1", "-o", str(tmp_path / "x")]) == 2
    assert main(["compile", *models, "-n", "2", "--mix", "nope=1", "-o", str(tmp_path / "x")]) == 2
    assert "--mix: 'nope' is not one of the models" in capsys.readouterr().err


@pytest.mark.parametrize("name, knee", [("tiny_irregular_int8.tflite", 0.05), ("tiny_irregular_int8.tflite", 0.5)])
def test_n_auto_pruning_keeps_the_choice_and_proves_each_pruned_row(name, knee):
    """A row left unsearched must be one the full search would not choose: the same n and reason
    as searching every row; its bound holds against the full search's period."""
    from tpu_pipeline.toolchain.partition import partition
    from tpu_pipeline.toolchain.partition.auto import sweep

    graph = load(FIXTURES / name)[1]
    problem = PartitionProblem(graph, EdgeTpuCostModel(load_device("coral-usb")))

    def run(prune):
        return lambda n, limit, above: partition(graph, n, time_limit=limit, problem=problem,
                                                 prune_above_ps=above if prune else None)

    pruned, chosen = sweep(graph, problem, 6, knee, 4.0, run(True))
    full, _ = sweep(graph, problem, 6, knee, 4.0, run(False))
    assert pruned.n_chosen == full.n_chosen == chosen.n
    rows = {r.n: r for r in full.candidates}
    assert any(r.pruned for r in pruned.candidates) and not any(r.pruned for r in full.candidates)
    for r in pruned.candidates:
        if r.pruned:
            assert not r.proven and r.period_s >= rows[r.n].period_s
            assert r.period_lower_bound_s <= rows[r.n].period_s
            assert r.throughput_per_tpu < (1 - knee) * max(c.throughput_per_tpu for c in full.candidates)
        else:
            assert r.period_s == rows[r.n].period_s


def test_a_measured_profile_gets_the_larger_refinement_budget(monkeypatch):
    """`compile --profile` refines with PROFILE_CANDIDATES_PER_SECOND x time limit candidates (and
    a longer wall clock), a plain compile with CANDIDATES_PER_SECOND x time limit."""
    from tpu_pipeline.toolchain import partition as part
    from tpu_pipeline.toolchain.partition import lattice

    seen = []
    real = lattice.refine_chains

    def spy(chains, stages, max_candidates, **kw):
        seen.append((max_candidates, kw["wall_s"]))
        return real(chains, stages, max_candidates, **kw)

    monkeypatch.setattr(lattice, "refine_chains", spy)
    graph = load(TINY)[1]
    for measured in (False, True):
        part.partition(graph, 3, time_limit=4.0, measured=measured)
    (plain, plain_wall), (measured_budget, measured_wall) = seen
    assert plain == round(part.CANDIDATES_PER_SECOND * 4.0)
    assert measured_budget == round(part.PROFILE_CANDIDATES_PER_SECOND * 4.0) and measured_wall > plain_wall + 4

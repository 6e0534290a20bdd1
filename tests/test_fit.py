"""`fit` end to end on real .tflite files: the fitted model runs bit-identically in LiteRT and
TFLite Micro, TFLite Micro's real head equals the prediction, budgets it cannot meet exit 3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.deadlines import TripDeadline, never
from helpers.firmware import run_fitted_on_qemu
from helpers.models import stem_heavy_cnn
from tpu_pipeline.toolchain.device import CMSIS_NN, REFERENCE, load_device
from tpu_pipeline.toolchain.execute.compare import verify_models
from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena
from tpu_pipeline.toolchain.fit import fit_model
from tpu_pipeline.toolchain.fit.fit import fit_graph
from tpu_pipeline.toolchain.loader import load
from tpu_pipeline.toolchain.memory.semantics import tflm_semantics
from tpu_pipeline.toolchain.schedule.api import schedule

FIXTURES = Path(__file__).parent / "fixtures"


def _optimal_peak(path: Path) -> int:
    return schedule(load(path)[1], time_limit=10).peak


def test_fit_meets_a_budget_below_the_proven_optimum_bit_identically(tmp_path):
    src = stem_heavy_cnn(tmp_path)
    optimum = _optimal_peak(src)
    budget = optimum * 6 // 10
    fitted = fit_model(src, budget=budget, time_limit=20, head_only=True)
    r = fitted.result
    assert r.fits and r.head <= budget < optimum == r.baseline_peak
    assert any(v.kind == "patch" for v in r.selection.variants)
    assert r.selection.proven
    # independent checks of what fit_model already checked: both runtimes, the host's real head
    # (its builtin view of the harness's kernels) as predicted for it
    checks = verify_models(fitted.source, fitted.data, runs=2)
    assert {v.runtime for v in checks} == {"litert", "tflm"}
    assert all(v.bit_exact for v in checks)
    assert measure_tflm_arena(fitted.data).head == fitted.head_predicted_host == fitted.head_measured
    # patches by copies recompute halos: a predicted cost over the same model on the harness's kernels
    # without patches (the baseline, the model as given on the builtins, may now be slower than both)
    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
    from tpu_pipeline.toolchain.fit.model import DEFAULT_COST_DEVICE
    from tpu_pipeline.toolchain.fit.variants import on_harness

    whole = estimate_mcu(on_harness(load(src)[1])[0], load_device(DEFAULT_COST_DEVICE), fitted.kernels).latency_s
    assert r.selection.latency_s > whole


def test_fit_memory_objective_reaches_below_the_latency_choice(tmp_path):
    src = stem_heavy_cnn(tmp_path, seed=5)
    fast = fit_model(src, budget=_optimal_peak(src), time_limit=20).result
    small = fit_model(src, objective="memory", time_limit=20).result
    assert small.head < fast.head
    assert small.selection.latency_s >= fast.selection.latency_s


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


def test_cli_fit_json_pareto_and_plot(tmp_path):
    src = stem_heavy_cnn(tmp_path, seed=7)
    out, plot = tmp_path / "fitted.tflite", tmp_path / "frontier.png"
    budget = _optimal_peak(src) * 7 // 10
    p = _cli("fit", src, "--budget", budget, "-o", out, "--pareto", "--plot", plot, "--json", "--time-limit", 20,
             "--head-only")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["fits"] and data["arena_head_bytes"] <= budget and data["budget_counts"] == "head"
    assert data["arena_head_bytes_measured"] == data["arena_head_bytes_predicted_host"]
    assert all(v["outputs"] and all(o["max_abs"] == 0 for o in v["outputs"]) for v in data["verification"])
    front = data["frontier"]
    assert len(front) >= 2
    peaks = [p["peak_bytes"] for p in front]
    lats = [p["latency_s_predicted"] for p in front]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == len(peaks)
    assert lats == sorted(lats)
    assert out.read_bytes()[4:8] == b"TFL3" and plot.stat().st_size > 1000


def test_cli_fit_unreachable_budget_exits_3_with_the_smallest_arena(tmp_path):
    src = stem_heavy_cnn(tmp_path, seed=9)
    out = tmp_path / "never.tflite"
    p = _cli("fit", src, "--budget", 64, "-o", out, "--time-limit", 10)
    assert p.returncode == 3, p.stderr
    last = p.stderr.strip().splitlines()[-1]  # progress lines come first; the error is one line
    assert "smallest reachable" in last and "Traceback" not in p.stderr
    assert not out.exists()


def test_cli_fit_needs_a_budget_or_a_device(tmp_path):
    p = _cli("fit", FIXTURES / "chain_int8.tflite", "-o", tmp_path / "x.tflite")
    assert p.returncode == 2 and "--budget" in p.stderr
    p = _cli("fit", FIXTURES / "chain_int8.tflite", "-o", tmp_path / "x.tflite", "--device", "coral-usb")
    assert p.returncode == 2 and "not an MCU" in p.stderr


def test_every_frontier_point_is_a_budget_fit_meets():
    """A frontier point's whole arena is a budget the same fit meets once realised: the tail is
    selected on a bound that holds for any op order (TFLite Micro's tail pads one-byte options
    between 4-byte ones differently in different orders; concat_conv_int8's 135,258 B point
    realised at 135,268 B and its --budget run exited 3)."""
    src = FIXTURES / "concat_conv_int8.tflite"
    front = fit_model(src, objective="memory", want_pareto=True, time_limit=20).result.frontier
    assert len(front) >= 3
    for point in front:
        fitted = fit_model(src, budget=point.arena, time_limit=20)
        r = fitted.result
        assert r.fits and r.head + r.tail <= point.arena, (point.arena, r.head, r.tail)
        assert r.selection.latency_s <= point.latency_s * (1 + 1e-9)


def test_cli_fit_refuses_a_model_with_several_subgraphs_in_one_line(tmp_path):
    out = tmp_path / "never.tflite"
    p = _cli("fit", FIXTURES / "control_flow_float32.tflite", "--objective", "memory", "-o", out)
    assert p.returncode == 2, p.stderr
    assert "subgraphs" in p.stderr.strip().splitlines()[-1] and "Traceback" not in p.stderr
    assert not out.exists()


@pytest.mark.parametrize("dtype", ["float32"])
def test_fit_float_model_is_exact_too(tmp_path, dtype):
    src = stem_heavy_cnn(tmp_path, seed=11, dtype=dtype)
    fitted = fit_model(src, budget=_optimal_peak(src) * 6 // 10, time_limit=20, head_only=True)
    assert fitted.result.fits
    assert all(v.ok for v in fitted.verification)


def test_fit_is_as_fast_as_the_best_single_region_that_fits_a_tight_budget(tmp_path):
    """Brute force over every (region from the input, grid): the tightest budget one region can
    meet; fit must meet it, and be at least as fast as the fastest single region that does."""
    from tpu_pipeline.toolchain.fit.grids import square_grids
    from tpu_pipeline.toolchain.fit.variants import _costed
    from tpu_pipeline.toolchain.rewrite.patch import apply_patches, patch_regions

    src = stem_heavy_cnn(tmp_path, seed=13)
    _, g = load(src)
    g, _ = g.with_unique_tensor_names()
    first = g.tensors[g.inputs[0]].name
    tried = []
    for region in patch_regions(g):
        if region.input != first:
            continue
        for grid in square_grids(region.max_grid):
            pg = apply_patches(g, region, grid)
            tried.append((schedule(pg, time_limit=10).peak, _costed(pg, load_device("qemu-mps2-an386"), tflm_semantics(CMSIS_NN))[0]))
    budget = min(p for p, _ in tried)
    fastest = min(t for p, t in tried if p <= budget)
    # the builtin kernels and the head alone: what the brute force above measures
    r = fit_model(src, budget=budget, time_limit=60, harness=False, head_only=True).result
    assert r.fits and r.head <= budget
    assert r.selection.latency_s <= fastest * (1 + 1e-9)


def test_fit_for_a_device_counts_the_target_tail(tmp_path):
    """--device: what is left of SRAM after the firmware reserve must hold head + the 32-bit tail
    of the FITTED model, which the selection counts (the harness's kernels keep their per-channel
    requantization in flash, and a patch stage is one node, so the tail shrinks)."""
    from tpu_pipeline.toolchain.fit.model import device_reserve
    from tpu_pipeline.toolchain.memory.tflm_target import target_tail

    src = stem_heavy_cnn(tmp_path, seed=15)
    _, g = load(src)
    optimum = _optimal_peak(src)
    base = _one_bank((REPO / "tpu_pipeline/toolchain/data/devices/qemu-mps2-an386.toml").read_text())
    _, reserve = device_reserve(load_device("qemu-mps2-an386"))
    sram = reserve + target_tail(g).bytes + optimum * 9 // 10
    dev = tmp_path / "tiny-board.toml"
    dev.write_text(base.replace('name = "qemu-mps2-an386"', 'name = "tiny-board"')
                   .replace(_sram_line(base), f"sram_bytes = {sram}"))
    fitted = fit_model(src, device=load_device(dev), time_limit=30)
    r = fitted.result
    assert fitted.arena_available == sram - reserve
    assert r.fits and r.head + fitted.tail_target <= fitted.arena_available
    fitted_tail = target_tail(load_bytes(fitted.data))
    if fitted_tail.bytes is not None:  # else the host's (larger, 64-bit) tail stood in: see the notes
        assert fitted.tail_target == fitted_tail.bytes
    else:
        assert any("host's (64-bit) tail" in n for n in fitted.notes)
    assert fitted.tail_target < target_tail(g).bytes
    assert r.tail == fitted.tail_target  # the selection's own figure is the written model's


REPO = Path(__file__).resolve().parents[1]


def _one_bank(toml: str) -> str:
    """The descriptor with its [[memory.banks]] list cut: `sram_bytes` is then its one bank (the
    other banks would hold any arena this test sizes against the first)."""
    start = toml.index("[[memory.banks]]")
    return toml[:start] + toml[toml.index("[compute]"):]


def _sram_line(toml: str) -> str:
    return next(line for line in toml.splitlines() if line.startswith("sram_bytes"))


def load_bytes(data: bytes):
    from tpu_pipeline.toolchain.ir.convert import from_model
    from tpu_pipeline.toolchain.tflite import read_model

    return from_model(read_model(data, name="fitted"))


def test_fitted_model_runs_on_the_emulated_cortex_m_as_predicted(tmp_path):
    """The fitted model in the real firmware on QEMU: outputs bit-identical to host TFLite Micro
    (reference kernels) and the head the firmware allocates is fit's prediction."""
    src = stem_heavy_cnn(tmp_path, seed=17)
    fitted = fit_model(src, budget=_optimal_peak(src) * 7 // 10, kernels=REFERENCE, time_limit=20)
    assert fitted.result.fits
    r = run_fitted_on_qemu(tmp_path, fitted, "reference")
    assert r.head_bytes == r.planned_head == fitted.result.head


@pytest.mark.timing
def test_a_selection_cut_short_by_the_time_limit_says_so(tmp_path):
    """Out of time before its pick is built, the search answers with the best variant it built,
    which can be far slower than the best there is: the result must say so."""
    src = stem_heavy_cnn(tmp_path, seed=17)
    budget = _optimal_peak(src) * 7 // 10
    model, graph = load(src)[:2]
    # deadlines that trip on the count of questions asked, not on the clock (machine speed): the
    # first trips while the selection has built a few of its candidates, the second never
    pricing = dict(device=load_device("qemu-mps2-an386"), kernels=CMSIS_NN)
    cut = fit_graph(graph, budget=budget, model=model, deadline=TripDeadline(50), **pricing)
    assert any("stopped at the time limit" in n for n in cut.notes), cut.notes
    done = fit_graph(graph, budget=budget, model=model, deadline=never(), **pricing)
    assert done.fits and not any("stopped at the time limit" in n for n in done.notes)


def test_compile_and_export_mcu_run_the_same_fit(tmp_path):
    src = stem_heavy_cnn(tmp_path, seed=19)
    budget = _optimal_peak(src) * 7 // 10
    p = _cli("compile", src, "-n", "2", "--budget", budget, "--verify", "--json", "-o", tmp_path / "out",
             "--time-limit", 10)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    fit = next(r for r in rep["passes"] if r["name"] == "fit")
    assert fit["status"] == "ran" and fit["detail"]["arena_head_bytes"] <= budget
    assert not any(r["name"] == "rewrite" and r["status"] == "ran" for r in rep["passes"])
    plan = next(r for r in rep["passes"] if r["name"] == "plan")
    assert plan["detail"]["tflm_head_bytes"] <= budget
    p = _cli("export-mcu", src, "--device", "qemu-mps2-an386", "--budget", budget, "--json", "-o",
             tmp_path / "fw", "--time-limit", 10)
    assert p.returncode == 0, p.stderr
    exp = json.loads(p.stdout)
    assert exp["fit"]["fits"] and exp["fit"]["arena_bytes_predicted"] <= budget
    assert exp["planned_head"] == exp["fit"]["arena_head_bytes"]  # the firmware keeps the fit's plan
    p = _cli("compile", src, "-n", "2", "--budget", 64, "-o", tmp_path / "out2", "--time-limit", 5)
    assert p.returncode == 3 and "smallest reachable" in p.stderr.strip().splitlines()[-1]

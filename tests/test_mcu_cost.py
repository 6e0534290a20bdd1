"""The MCU cost model fitted on QEMU instruction counts (tpu_pipeline/toolchain/data/mcu_cost.toml) and the
per-board conversion to time; `profile --kernels` predictions."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import FIXTURES
from tpu_pipeline.toolchain.cost.mcu import estimate_mcu, fitted_table, op_features, predict_instructions
from tpu_pipeline.toolchain.device import CMSIS_NN, KERNEL_SETS, REFERENCE, kernel_set, load_device
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.loader import load

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "docs" / "bench" / "mcu_ops.json"
BOARDS = ("nucleo-l4r5zi", "sparkfun-edge", "arduino-nano-33-ble", "stm32h743")


def _measured_runs():
    return json.loads(MEASURED.read_text())["runs"]


def test_table_covers_the_op_classes_the_fit_needs():
    table = fitted_table()
    assert set(table) == {k.cost_key for k in KERNEL_SETS}
    _, g = load(FIXTURES / "darts_s2b_int8.tflite")
    for kernels in (k.cost_key for k in KERNEL_SETS):
        for i in range(len(g.ops)):
            assert predict_instructions(op_features(g, i), table[kernels]) > 0
        for cls in ("conv", "conv_1x1", "depthwise", "add", "pad", "strided_slice", "concatenation", "other"):
            f = replace(op_features(g, 0), fit_class=cls)
            small, big = (predict_instructions(replace(f, work=w, outputs=o), table[kernels])
                          for w, o in ((1000, 100), (100_000, 10_000)))
            assert 0 < small < big, (kernels, cls)  # more work never costs less


@pytest.mark.parametrize("kernels", [k.name for k in KERNEL_SETS])
def test_fixture_predictions_are_close_to_qemu(kernels):
    """Per-op rms relative error and whole-model totals on the committed QEMU counts."""
    runs = _measured_runs()
    errors, totals = [], []
    for name in ("chain_int8", "pool_softmax_int8", "multi_output_int8", "tiny_irregular_int8", "concat_conv_int8",
                 "darts_s2b_int8"):
        run = runs[f"{name}/{kernels}"]
        _, g = load(FIXTURES / f"{name}.tflite")
        est = estimate_mcu(g, load_device("qemu-mps2-an386"), kernel_set(kernels))
        for idx, _, instr in run["ops"]:
            errors.append((est.ops[idx].instructions - instr) / instr)
        totals.append(est.instructions / sum(i for _, _, i in run["ops"]))
    rms = math.sqrt(sum(e * e for e in errors) / len(errors))
    assert rms < RMS_BOUND[kernels], rms
    low, high = TOTAL_BOUND[kernels]
    assert all(low < t < high for t in totals), totals


# As fitted (tools/fit_mcu_cost.py): fixtures' per-op rms 0.067 (CMSIS-NN: the tiny ops of the
# fixtures) and 0.041; whole models 0.82-0.99 and 0.97-1.05 of the measured instructions.
RMS_BOUND = {"cmsis-nn": 0.08, "reference": 0.05}
TOTAL_BOUND = {"cmsis-nn": (0.8, 1.05), "reference": (0.94, 1.06)}


@pytest.mark.parametrize("board", BOARDS)
def test_latency_is_instructions_times_cpi_over_clock(board):
    _, g = load(FIXTURES / "tiny_irregular_int8.tflite")
    d = load_device(board)
    cpi, clock, watts = d.compute.cycles_per_instruction, d.compute.clock_hz, d.power.active_w
    ref, cmsis = (estimate_mcu(g, d, k) for k in (REFERENCE, CMSIS_NN))
    for e in (ref, cmsis):
        assert e.source == "fitted" and e.cycles_per_instruction == cpi
        assert e.latency_s == pytest.approx(e.instructions * cpi / clock)
        assert e.energy_j == pytest.approx(e.latency_s * watts)
    assert ref.latency_s > 3 * cmsis.latency_s  # CMSIS-NN's int8 kernels are several times faster
    assert kernel_set(None) is CMSIS_NN and cmsis.kernels == "cmsis-nn"  # the default, as deployed


def test_a_descriptor_without_cpi_keeps_its_cycles_per_mac(tmp_path):
    _, g = load(FIXTURES / "chain_int8.tflite")
    text = (ROOT / "tpu_pipeline" / "toolchain" / "data" / "devices" / "sparkfun-edge.toml").read_text()
    own = tmp_path / "own.toml"
    own.write_text(text.replace("cycles_per_instruction = 1.25", ""))
    d = load_device(own)
    assert d.compute.cycles_per_instruction is None
    e = estimate_mcu(g, d, CMSIS_NN)
    assert e.source == "cycles_per_mac" and e.instructions is None
    assert e.cycles == pytest.approx(sum(d.compute.cycles_per_mac["conv"] * o.work for o in e.ops))


def test_bad_kernels_and_cpi_are_usage_errors(tmp_path):
    _, g = load(FIXTURES / "chain_int8.tflite")
    with pytest.raises(UsageError, match="kernel set"):
        kernel_set("arm-nn")
    text = (ROOT / "tpu_pipeline" / "toolchain" / "data" / "devices" / "sparkfun-edge.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("cycles_per_instruction = 1.25", "cycles_per_instruction = 0.0"))
    with pytest.raises(UsageError, match="cycles_per_instruction"):
        load_device(bad)


@pytest.mark.parametrize("kernels,arena", [("cmsis-nn", 8100), ("reference", 7956)])
def test_profile_json_predicts_arena_latency_and_energy(kernels, arena):
    """chain_int8: the arena the firmware reported on QEMU (test_memory_tflm.TARGET)."""
    p = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", "profile", str(FIXTURES / "chain_int8.tflite"),
                        "--device", "nucleo-l4r5zi", "--kernels", kernels, "-N", "1", "--warmup", "0", "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["kernels"] == kernels and rep["arena_bytes_predicted"] == arena
    _, g = load(FIXTURES / "chain_int8.tflite")
    est = estimate_mcu(g, load_device("nucleo-l4r5zi"), kernel_set(kernels))
    assert rep["latency_s_predicted"] == pytest.approx(est.latency_s)
    assert rep["energy_j_predicted"] == pytest.approx(est.energy_j) and rep["energy_j_predicted"] > 0
    assert rep["predicted"]["latency_s"] == pytest.approx(est.latency_s)


def test_emulated_board_latency_is_qemu_virtual_time():
    """-icount shift=0: 1 ns per instruction, so predicted latency = predicted instructions x 1 ns."""
    _, g = load(FIXTURES / "pool_softmax_int8.tflite")
    for board in ("qemu-mps2-an386", "qemu-mps2-an500"):
        e = estimate_mcu(g, load_device(board), REFERENCE)
        assert e.latency_s == pytest.approx(e.instructions * 1e-9)


def test_profile_kernels_is_for_mcus_only():
    p = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", "profile", str(FIXTURES / "chain_int8.tflite"),
                        "--device", "coral-usb", "--kernels", "reference"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "--kernels" in p.stderr, p.stderr

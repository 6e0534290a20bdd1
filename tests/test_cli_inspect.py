"""`tpu-pipeline inspect`: the report a person reads, and the JSON a script reads."""

from __future__ import annotations

import json

from conftest import run_cli
from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena


def test_inspect_json_figures(example_model):
    proc = run_cli("inspect", str(example_model), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ops"] > 10 and sum(report["opcodes"].values()) == report["ops"]
    assert report["parameter_bytes"] > 0
    assert report["any_order_lower_bound"] <= report["peak_bytes"] <= report["tflm_arena_bytes"]
    assert report["tflm_arena_bytes"] == measure_tflm_arena(example_model).head
    assert max(report["live_bytes_per_step"]) == report["peak_bytes"]
    assert report["hot_steps"][0]["live_bytes"] == report["peak_bytes"]


def test_inspect_table_and_plot(example_model, tmp_path):
    png = tmp_path / "memory.png"
    proc = run_cli("inspect", str(example_model), "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert "activation peak" in proc.stdout and "TFLite Micro arena" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_usage_errors_exit_2():
    for args in (("inspect",), ("no-such-command",)):
        proc = run_cli(*args)
        assert proc.returncode == 2
        assert len(proc.stderr.strip().splitlines()) == 1 and "error:" in proc.stderr

"""`tpu-pipeline rewrite`: the report, the written model, verification, refusals."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli
from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena
from tpu_pipeline.toolchain.loader import load
from tpu_pipeline.toolchain.memory import peak_memory

FIX = Path(__file__).parent / "fixtures"


def test_rewrite_float_cell_json(tmp_path):
    out = tmp_path / "rw.tflite"
    proc = run_cli("rewrite", str(FIX / "concat_conv_float32.tflite"), "-o", str(out), "--verify", "--runs", "1",
                   "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["peak_after"] < rep["peak_before"] and rep["applied"]
    assert rep["applied"][-1]["peak_after"] == rep["peak_after"]
    assert {v["runtime"] for v in rep["verification"]} == {"litert", "tflm"}
    assert all(v["ok"] for v in rep["verification"])
    _, g = load(out)
    assert len(g.ops) == rep["ops_after"]
    assert peak_memory(g) == rep["peak_after"]  # written in the scheduled order
    # Real TFLite Micro plans the rewritten model in less arena than the original.
    assert measure_tflm_arena(out).head < measure_tflm_arena(FIX / "concat_conv_float32.tflite").head


def test_rewrite_int8_lossy_reports_lsb(tmp_path):
    out = tmp_path / "rw.tflite"
    proc = run_cli("rewrite", str(FIX / "concat_conv_int8.tflite"), "-o", str(out), "--allow-lossy", "--runs", "1")
    assert proc.returncode == 0, proc.stderr
    assert "LSB" in proc.stdout and "lossy" in proc.stdout and "peak" in proc.stdout
    exact = tmp_path / "exact.tflite"
    proc = run_cli("rewrite", str(FIX / "concat_conv_int8.tflite"), "-o", str(exact), "--json")
    rep = json.loads(proc.stdout)
    assert proc.returncode == 0 and not rep["applied"] and not rep["lossy"]


def test_rewrite_refusals(tmp_path):
    src = FIX / "concat_conv_float32.tflite"
    proc = run_cli("rewrite", str(src), "-o", str(src))
    assert proc.returncode == 2 and "overwrite" in proc.stderr
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"not a model at all")
    proc = run_cli("rewrite", str(bad), "-o", str(tmp_path / "o.tflite"))
    assert proc.returncode == 2 and "bad.tflite" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o.tflite").exists()
    proc = run_cli("rewrite", str(src), "-o", str(tmp_path / "o.tflite"), "--time-limit", "0")
    assert proc.returncode == 2

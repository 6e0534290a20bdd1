"""`tpu-pipeline batch` / tpu_pipeline.batch: many models x devices x budgets, one row per job, in
local worker processes or on a Dask cluster; a failing or slow job is a row, never the end."""

from __future__ import annotations

import csv
import io
import json
import time

import pytest

from conftest import EXAMPLE, FIXTURES, run_cli
from helpers.models import hard_schedule_model

import tpu_pipeline as tp

GOOD = [FIXTURES / "tiny_irregular_int8.tflite", FIXTURES / "chain_int8.tflite"]


def test_local_batch_rows_in_job_order_with_failures_as_rows(tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\0" * 64)
    r = tp.batch([*GOOD, bad], command="inspect", budgets=[16_000, 64_000], jobs=2)
    assert [(row.model, row.budget) for row in r.rows] == [
        (str(m), b) for m in (*GOOD, bad) for b in (16_000, 64_000)]
    ok = [row for row in r.rows if row.status == "ok"]
    assert len(ok) == 4 and len(r.failed) == 2
    assert all(row.exit_code == 2 and "bad.tflite" in row.error for row in r.failed)
    for row in ok:  # the same figures as one inspect of that model
        one = tp.inspect(row.model)
        assert row.figures["tflm_arena_bytes"] == one.tflm_arena_bytes
        assert row.figures["fits"] == (one.tflm_arena_bytes <= row.budget)
    table = list(csv.DictReader(io.StringIO(r.to_csv())))
    assert len(table) == 6 and table[-1]["status"] == "error" and table[0]["tflm_arena_bytes"].isdigit()


@pytest.mark.timing
def test_a_job_past_its_time_limit_is_stopped_and_the_batch_goes_on(tmp_path):
    # the hard model's fit searches for its whole hour on any machine, so its job always passes
    # the 3 s job limit (the tiny fixture's job may end on its own or be stopped: machine speed)
    hard = hard_schedule_model(tmp_path / "hard.tflite")
    t0 = time.monotonic()
    r = tp.batch([hard, GOOD[0]], command="fit", budgets=[8_000], job_timeout=3,
                 options={"time_limit": 3600}, jobs=2)
    assert time.monotonic() - t0 < 600  # the stopped job was killed, not waited for
    statuses = {row.model: row.status for row in r.rows}
    assert statuses[str(hard)] == "timeout" and r.rows[0].exit_code == 4 and "time limit of 3 s" in r.rows[0].error
    assert len(r.rows) == 2 and statuses[str(GOOD[0])] in ("error", "timeout")


def test_cli_batch_writes_one_table_and_exits_like_its_first_failure(tmp_path):
    out = tmp_path / "table.csv"
    proc = run_cli("batch", *map(str, GOOD), str(tmp_path / "missing.tflite"), "--command", "compile", "-n", "2",
                   "--time-limit", "2", "-o", str(out), "--jobs", "2")
    assert proc.returncode == 2, proc.stderr  # the missing model: bad input
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [r["status"] for r in rows] == ["ok", "ok", "error"]
    assert float(rows[0]["throughput_per_s"]) > 0 and rows[0]["gap"] != ""
    assert "…" not in proc.stdout and "throughput_per_s" in proc.stdout
    assert sum("done:" in ln for ln in proc.stderr.splitlines()) == 3  # a progress line per job


def test_dask_cluster_runs_the_same_jobs():
    distributed = pytest.importorskip("distributed", reason="the [distributed] extra is not installed")
    with distributed.LocalCluster(n_workers=1, processes=True, threads_per_worker=2, dashboard_address=None) as cluster:
        r = tp.batch([*GOOD, b"not a model"], command="inspect", cluster=cluster.scheduler_address, job_timeout=120)
    local = tp.batch(GOOD, command="inspect", jobs=1)
    assert r.engine.startswith("dask") and [row.status for row in r.rows] == ["ok", "ok", "error"]
    assert [row.figures for row in r.rows[:2]] == [row.figures for row in local.rows]
    assert r.rows[2].exit_code == 2 and "not a TFLite model" in r.rows[2].error
    assert json.loads(json.dumps(r.to_json()))["failed"] == 1

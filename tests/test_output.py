"""What the commands print when stdout is not a terminal: every table whole (no "…", full headers,
the segment index filled), in plain columns, CSV or JSON; progress on stderr with elapsed time."""

from __future__ import annotations

import csv
import io
import json

import pytest

from conftest import FIXTURES, run_cli

TINY = FIXTURES / "tiny_irregular_int8.tflite"
SEGMENT_HEADERS = ("#", "ops", "params B", "off-chip B", "in B", "out B", "act. peak B (tflite)", "ms")


def _compile(tmp_path, *extra):
    proc = run_cli("compile", str(TINY), "-n", "2", "-o", str(tmp_path / "o"), "--time-limit", "2", *extra)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_piped_tables_are_plain_and_whole(tmp_path):
    proc = _compile(tmp_path)
    out = proc.stdout
    assert "…" not in out and "┃" not in out and "│" not in out
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("#"))
    assert lines[head].split() == "# ops params B off-chip B in B out B act. peak B (tflite) ms".split()
    rows = lines[head + 1:head + 3]
    assert [r.split()[0] for r in rows] == ["0", "1"]  # the index column is filled
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert [int(r.split()[1]) for r in rows] == [s["ops"] for s in report["segments"]]
    # plain columns line up: every row as wide as the header line allows
    assert all(len(r) <= len(lines[head]) + 12 for r in rows)


def test_inspect_long_names_are_not_cut():
    proc = run_cli("inspect", str(FIXTURES.parent.parent / "examples" / "randwire_small_int8.tflite"))
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout
    # the hottest step's tensors are listed by their full names
    assert "randwire_small_1/re_lu_1_2/Relu;randwire_small_1/batch_normalization_1_2/batchnorm/add_1" in proc.stdout


def test_csv_format_reads_back_as_tables(tmp_path):
    proc = _compile(tmp_path, "--format", "csv")
    blocks = [b for b in proc.stdout.split("\n\n") if "# segments (predicted)" in b]
    assert len(blocks) == 1
    body = "\n".join(ln for ln in blocks[0].splitlines() if not ln.startswith("# "))
    rows = list(csv.reader(io.StringIO(body)))
    assert tuple(rows[0]) == SEGMENT_HEADERS
    assert [r[0] for r in rows[1:]] == ["0", "1"]


def test_table_format_in_a_pipe_is_not_cut(tmp_path):
    proc = _compile(tmp_path, "--format", "table")
    assert "┃" in proc.stdout and "…" not in proc.stdout
    assert "act. peak B (tflite)" in proc.stdout and "off-chip B" in proc.stdout


def test_format_json_is_json_and_conflicts_are_usage_errors(tmp_path):
    a = json.loads(_compile(tmp_path, "--format", "json").stdout)
    assert a["num_segments"] == 2
    proc = run_cli("inspect", str(TINY), "--json", "--format", "csv")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "two formats" in proc.stderr


@pytest.mark.timing
def test_progress_heartbeat_names_the_step_and_the_time():
    from tpu_pipeline.output import Progress

    class Stream(io.StringIO):
        def isatty(self):
            return False

    s = Stream()
    import time

    with Progress(stream=s, heartbeat_s=0.3) as say:
        say("[   0.0 s] partition (up to 10.0 s)")  # a stamped message from the toolchain: stamped once
        time.sleep(1.6)
    lines = s.getvalue().splitlines()
    assert lines[0].startswith("[") and lines[0].endswith("] partition (up to 10.0 s)") and lines[0].count(" s] ") == 1
    assert any(ln.endswith("partition (up to 10.0 s) (still running)") for ln in lines[1:])

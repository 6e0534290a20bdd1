"""The HTML report (tpu_pipeline/toolchain/report_html.py): self-contained, written into every
compile folder and by --report, and rendered by a real browser (headless Chromium, installed by
tools/install_system_deps.sh): the screenshot must show every figure, told apart by its colours."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from conftest import EXAMPLE, FIXTURES, run_cli

import tpu_pipeline as tp
from tpu_pipeline.toolchain import report_html as R

TINY = FIXTURES / "tiny_irregular_int8.tflite"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _self_contained(text: str) -> None:
    assert "<script" not in text and "<link" not in text and "<img" not in text and "@import" not in text
    # the only URL is SVG's namespace name, which no browser fetches
    assert set(re.findall(r"https?://[^\s\"'<>]+", text)) <= {"http://www.w3.org/2000/svg"}


def _screenshot(page, tmp_path) -> np.ndarray:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (tools/install_system_deps.sh installs it when run as root)")
    png = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}", "--window-size=1280,2400",
                    page.resolve().as_uri()], capture_output=True, timeout=120, check=True)
    import matplotlib.image

    return (matplotlib.image.imread(png)[..., :3] * 255).round().astype(int)


def _pixels(img: np.ndarray, colour: str, tolerance: int = 12) -> int:
    rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(img - rgb).max(axis=-1) <= tolerance).sum())


def test_compile_writes_a_report_the_browser_draws(tmp_path):
    c = tp.compile(EXAMPLE, 3, out=tmp_path / "out", time_limit=3)
    page = tmp_path / "out" / "report.html"
    assert "report.html" in c.files and page.is_file()
    text = page.read_text()
    _self_contained(text)
    for fig in ('id="timeline"', 'id="arena"', 'id="pipeline"', 'id="provenance"'):
        assert fig in text
    # the peak op is named, the provenance says predicted and proven/bounded
    assert re.search(r"peak [\d,]+ B at step \d+ \(\d+ [A-Z_0-9]+\)", text)
    assert "predicted (pipeline simulator" in text and ("proven" in text or "within" in text)
    img = _screenshot(page, tmp_path)
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 50  # not a blank page
    # each figure has colours of its own; the thresholds are well above what a legend swatch
    # (140 pixels) or a label could give, so each count needs the figure itself drawn
    counts = {name: _pixels(img, colour) for name, colour in (
        ("timeline before", R.BEFORE), ("timeline after", R.AFTER), ("cached parameters", R.CACHED),
        ("transfers", R.TRANSFER), *((f"stage {k}", R.STAGE_COLOURS[k]) for k in range(3)))}
    counts["peak markers and head line"] = _pixels(img, R.PEAK)
    counts["arena rectangles"] = sum(_pixels(img, c, 6) for c in R.ARENA_COLOURS)
    least = {"timeline before": 600, "timeline after": 600, "cached parameters": 300, "transfers": 1000,
             "peak markers and head line": 200, "arena rectangles": 20_000,
             **{f"stage {k}": 4000 for k in range(3)}}  # the strip along the ops
    assert all(counts[k] >= least[k] for k in least), counts


def test_fit_report_draws_the_frontier(tmp_path):
    page = tmp_path / "fit.html"
    # the head alone: with the whole arena counted, this small model's patch variants bring more
    # tail than they save and its frontier is one point (15,252 B); on the head it has eight
    proc = run_cli("fit", str(TINY), "--budget", "12000", "--head-only", "-o", str(tmp_path / "f.tflite"), "--pareto",
                   "--time-limit", "10", "--report", str(page))
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    _self_contained(text)
    assert 'id="frontier"' in text and "budget 12,000 B" in text and "measured (TFLite Micro on the host)" in text
    img = _screenshot(page, tmp_path)
    assert _pixels(img, R.FRONTIER) >= 400 and _pixels(img, R.PEAK) >= 200


def test_inspect_schedule_and_plan_reports(tmp_path):
    for cmd, extra in (("inspect", ()), ("schedule", ()), ("plan", ("-o", str(tmp_path / "p.tflite")))):
        page = tmp_path / f"{cmd}.html"
        proc = run_cli(cmd, str(TINY), *extra, "--report", str(page))
        assert proc.returncode == 0, proc.stderr
        text = page.read_text()
        _self_contained(text)
        assert 'id="timeline"' in text and 'id="arena"' in text
    assert "memory-optimal order" in (tmp_path / "schedule.html").read_text()
    assert "our offline plan" in (tmp_path / "plan.html").read_text()
    # the arena drawing is TFLite Micro's layout: rectangles inside the head, none overlapping in
    # both lifetime and bytes
    from tpu_pipeline.toolchain.loader import load

    boxes, head, _ = R.arena_boxes(load(TINY)[1])
    assert head == tp.inspect(TINY).tflm_arena_bytes and all(b.offset + b.size <= head for b in boxes)
    for a in boxes:
        for b in boxes:
            if a is not b and a.first <= b.last and b.first <= a.last:
                assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset


def test_a_scatter_of_measured_points_is_drawn(tmp_path):
    pts = (R.Point("tinyengine", "whole layers", 93_992, 34_749_040), R.Point("tinyengine", "patch plan", 34_784, 83_083_760),
           R.Point("tflm-builtin", "as converted", 219_808, 48_671_640),
           R.Point("tpu-pipeline", "fastest", 101_092, 43_256_440), R.Point("tpu-pipeline", "smallest", 19_236, 229_847_400))
    page = tmp_path / "scatter.html"
    R.write(page, R.Report("s", "bench", "vww", scatters=(R.Scatter("vww", pts, id="scatter-vww"),)))
    text = page.read_text()
    _self_contained(text)
    assert 'id="scatter-vww"' in text and "19,236 B, 229,847,400 instructions" in text
    img = _screenshot(page, tmp_path)
    assert all(_pixels(img, c) >= 150 for c in R.ENGINE_COLOURS.values())

"""One meaning per word (issue 10, item 12): outputs label peak / head / arena, units, predicted vs
measured figures and where they were measured, and a simulated device says so everywhere."""

from __future__ import annotations

import json
import re
import threading
import zlib
from pathlib import Path

from tpu_pipeline.runtime import protocol as P
from tpu_pipeline.runtime.fake_mcu import FakeMcu
from tpu_pipeline.runtime.serial_mcu import SerialMcu
from tpu_pipeline.cli import main

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "fixtures" / "tiny_irregular_int8.tflite"
DATA = MODEL.read_bytes()


class BoardLikeHarness(FakeMcu):
    """The fake harness without the `simulated=1` field: what a real board's READY looks like."""

    def _ready(self) -> None:
        self._send(P.encode("READY", arena=self.arena_size, used=self.arena_used,
                            inputs=len(self.interp.inputs), outputs=len(self.interp.outputs),
                            ticks_per_s=self.clock_hz, model_crc=f"{zlib.crc32(self.model_bytes):08X}",
                            board=self.board))


def bounded(fn, seconds=60):
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("v", fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "hung"
    return box.get("v")


def _run_over_serial(device_cls, capsys, *extra):
    with device_cls(DATA, arena_used=20576) as dev:
        code = bounded(lambda: main(["run", str(MODEL), "--backend", "mcu", "--port", dev.port,
                                     "--device", "sparkfun-edge", "-N", "2", *extra]))
    assert code == 0
    return capsys.readouterr().out


def _table_titles(text: str) -> list[str]:
    # (the commands print boxed tables with --format table, the default on a terminal)
    # rich prints a table's title on the line just above its top border
    lines = text.splitlines()
    return [lines[i - 1].strip() for i, ln in enumerate(lines) if ln.startswith("┏") and i > 0]


def test_fake_mcu_says_it_is_simulated_in_json(capsys):
    rep = json.loads(_run_over_serial(FakeMcu, capsys, "--json"))
    assert rep["simulated"] is True
    assert "(simulated)" in rep["device"]


def test_fake_mcu_says_it_is_simulated_in_every_table(capsys):
    out = _run_over_serial(FakeMcu, capsys, "--format", "table")
    first = out.splitlines()[0]
    assert "(simulated)" in first
    titles = _table_titles(out)
    assert len(titles) >= 3, out  # latency, arena, slowest ops
    assert all(t.endswith("(simulated)") for t in titles), titles
    assert "measured (simulated device)" in out and "simulated device µs" in out
    assert "measured (device)" not in out


def test_a_board_that_does_not_say_simulated_is_a_device(capsys):
    with BoardLikeHarness(DATA, arena_used=1) as dev, SerialMcu(dev.port, timeout=5) as mcu:
        assert bounded(lambda: mcu.handshake(DATA)).simulated is False
    rep = json.loads(_run_over_serial(BoardLikeHarness, capsys, "--json"))
    assert rep["simulated"] is False and "simulated" not in rep["device"]
    out = _run_over_serial(BoardLikeHarness, capsys)
    assert "simulated" not in out and "measured (device)" in out and "device µs" in out


def test_fake_mcu_handshake_reports_simulated():
    with FakeMcu(DATA, arena_used=1) as dev, SerialMcu(dev.port, timeout=5) as mcu:
        assert bounded(lambda: mcu.handshake(DATA)).simulated is True


def test_emulator_labels_host_timings_and_predictions(capsys):
    assert main(["profile", str(MODEL), "--device", "sparkfun-edge", "-N", "2", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["simulated"] is True and rep["backend"] == "emulator"
    assert main(["profile", str(MODEL), "--device", "sparkfun-edge", "-N", "2", "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert "measured (host)" in out and "predicted (device)" in out and "predicted µs" in out
    assert "head (TFLite Micro on the host, measured)" in out and "head (predicted" in out
    assert all(t.endswith("(simulated)") for t in _table_titles(out))
    assert re.search(r"┃ figure\s+┃\s+B ┃\s+KiB/MiB ┃", out)  # units in the arena table's headers


def test_inspect_labels_units_and_semantics(capsys):
    assert main(["inspect", str(MODEL), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["semantics"] == "tflm"
    assert main(["inspect", str(MODEL), "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert "predicted" in _table_titles(out)[0] and "tflm semantics" in _table_titles(out)[0]
    assert "activation peak" in out and "TFLite Micro arena head" in out and "lower bound for this order (= peak)" in out
    assert re.search(r"┃ figure\s+┃\s+B ┃\s+KiB/MiB ┃", out)
    assert "ops (count)" in out and "live B" in out


def test_plan_labels_peak_and_head(tmp_path, capsys):
    args = ["plan", str(MODEL), "-o", str(tmp_path / "p.tflite"), "--time-limit", "1"]
    assert main(args + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["semantics"] == "tflm"
    assert main(args + ["--verify"]) == 0
    out = capsys.readouterr().out
    assert "lower bound = peak" in out and "head, TFLite Micro's own planner (predicted)" in out
    assert "measured (TFLite Micro on the host)" in out


def test_export_mcu_labels_predicted_and_measured(tmp_path, capsys):
    assert main(["export-mcu", str(MODEL), "-o", str(tmp_path / "fw")]) == 0
    out = capsys.readouterr().out
    assert "measured" in out and "(TFLite Micro on the host)" in out and "(predicted)" in out


def test_glossary_defines_every_word():
    text = (ROOT / "docs" / "cli.md").read_text()
    assert "## Glossary" in text
    glossary = text.split("## Glossary", 1)[1].split("\n## ", 1)[0]
    for word in ("peak", "head", "arena", "tail", "semantics", "predicted", "measured (host)", "measured (device)",
                 "simulated"):
        assert re.search(rf"^\| (\*\*)?{re.escape(word)}(\*\*)? \|", glossary, re.M), f"no glossary row for {word}"
    assert "`B`" in glossary and "`KiB/MiB`" in glossary

"""The Python API (tpu_pipeline.api): the documented examples run, results serialise to exactly
what the commands print with --json, errors are the commands' errors, and importing is cheap."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import EXAMPLE, FIXTURES, ROOT, run_cli

import tpu_pipeline as tp

TINY = FIXTURES / "tiny_irregular_int8.tflite"
DOC = ROOT / "docs" / "api.md"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_documented_examples_run(tmp_path, monkeypatch):
    blocks = _python_blocks(DOC.read_text())
    assert len(blocks) >= 3  # a notebook, a CI gate, a NAS loop
    monkeypatch.chdir(tmp_path)
    namespace = {"MODEL": str(TINY), "MODELS": [str(FIXTURES / f"{n}_int8.tflite")
                                                for n in ("tiny_irregular", "chain", "concat_conv")]}
    for code in blocks:
        exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - our own documentation


def _without_times(data):
    """The JSON minus what a second run measures differently (wall-clock seconds)."""
    if isinstance(data, dict):
        return {k: _without_times(v) for k, v in data.items() if "seconds" not in k and k != "stopped_by"}
    if isinstance(data, list):
        return [_without_times(v) for v in data]
    return data


@pytest.mark.parametrize("command", ["inspect", "schedule", "plan", "compile"])
def test_to_json_is_the_commands_json(command, tmp_path):
    model = str(TINY)
    if command == "inspect":
        api, cli = tp.inspect(model), ("inspect", model)
    elif command == "schedule":
        api = tp.schedule(model, output=tmp_path / "a.tflite", time_limit=5)
        cli = ("schedule", model, "-o", str(tmp_path / "a.tflite"), "--time-limit", "5")
    elif command == "plan":
        api = tp.plan(model, output=tmp_path / "a.tflite", time_limit=2)
        cli = ("plan", model, "-o", str(tmp_path / "a.tflite"), "--time-limit", "2")
    else:
        api = tp.compile(model, 2, out=tmp_path / "o", time_limit=2)
        cli = ("compile", model, "-n", "2", "-o", str(tmp_path / "o"), "--time-limit", "2")
    proc = run_cli(*cli, "--json")
    assert proc.returncode == 0, proc.stderr
    assert _without_times(api.to_json()) == _without_times(json.loads(proc.stdout))
    assert api.to_json() is not api.to_json()  # a fresh copy: callers may edit it


def test_typed_figures_agree_with_the_json(tmp_path):
    r = tp.inspect(TINY)
    d = r.to_json()
    assert (r.ops, r.peak_bytes, r.tflm_arena_bytes, r.parameter_bytes) == (
        d["ops"], d["peak_bytes"], d["tflm_arena_bytes"], d["parameter_bytes"])
    assert list(r.live_bytes) == d["live_bytes_per_step"] and max(r.live_bytes) == r.peak_bytes
    with pytest.raises(AttributeError):
        r.peak_bytes = 0  # frozen
    c = tp.compile(TINY.read_bytes(), 2, out=tmp_path / "b", time_limit=2)
    assert c.num_segments == 2 and len(c.files) == 5 and c.throughput_per_s > 0  # model, 2 segments, 2 reports
    assert c.gap is not None and c.gap >= 0 and c.to_json()["solver"]["gap"] == c.gap


def test_errors_are_the_commands_errors(tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(tp.ModelError) as exc:
        tp.inspect(bad)
    proc = run_cli("inspect", str(bad))
    assert proc.returncode == exc.value.exit_code == 2
    assert proc.stderr.strip() == f"error: {exc.value}"
    with pytest.raises(tp.ModelError, match="^model.tflite: "):  # bytes: the message names `name`
        tp.inspect(b"garbage bytes")
    with pytest.raises(tp.UsageError, match="time-limit"):
        tp.schedule(TINY, time_limit=0)
    with pytest.raises(tp.InfeasibleError, match="smallest reachable"):
        tp.fit(TINY, budget=256, time_limit=3)
    with pytest.raises(tp.UsageError):
        tp.plan(TINY, output=TINY)  # never overwrite the input


def _loaded_after(statements: str, modules) -> list[str]:
    code = f"import sys; {statements}; print([m for m in {tuple(modules)!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return eval(out)  # noqa: S307 - a list of names we printed


def test_importing_the_package_loads_nothing_heavy():
    heavy = ("tpu_pipeline.api", "ortools", "ai_edge_litert", "matplotlib", "numpy")
    assert _loaded_after("import tpu_pipeline, tpu_pipeline.toolchain.errors", heavy) == []
    # the command line's start-up (every parser built) does not load the API either
    assert _loaded_after("import tpu_pipeline.cli as c; c.build_parser()", ["tpu_pipeline.api"]) == []
    assert "inspect" in dir(tp) and tp.inspect is tp.api.inspect


def test_run_and_profile_return_measurements(tmp_path):
    r = tp.profile(TINY, "sparkfun-edge", iterations=2)
    assert r.backend == "emulator" and r.simulated and r.latency_median_s > 0
    assert r.arena_bytes_predicted == r.to_json()["arena_bytes_predicted"] > 0
    tp.compile(EXAMPLE, 2, out=tmp_path / "c", time_limit=2)
    run = tp.run(tmp_path / "c", iterations=2)
    assert run.verified is True and run.to_json()["verified"] is True

"""Shared test helpers: the committed models, and running them in the real runtimes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
EXAMPLE = ROOT / "examples" / "randwire_small_int8.tflite"


def fixture_models(pattern: str = "*.tflite") -> list[Path]:
    models = sorted(FIXTURES.glob(pattern))
    if EXAMPLE.exists() and EXAMPLE.match(pattern):
        models.append(EXAMPLE)
    return models


def tflm_models() -> list[Path]:
    """Committed models TFLite Micro can run: single-subgraph, builtin ops."""
    return [p for p in fixture_models() if "control_flow" not in p.name]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", *args], capture_output=True,
                          text=True, cwd=cwd or ROOT, timeout=600)


@pytest.fixture
def example_model() -> Path:
    assert EXAMPLE.exists(), "examples/randwire_small_int8.tflite is missing"
    return EXAMPLE


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: many more random examples; run with `-m slow`")
    config.addinivalue_line("markers", "timing: behaviour around time (deadlines, time limits, timeouts, "
                                       "interrupts); `make flakes` runs these idle and under load")


def pytest_collection_modifyitems(config, items):
    # slow tests run only when asked for by a marker expression naming them
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

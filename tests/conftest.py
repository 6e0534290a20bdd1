"""Shared test helpers: the committed models, and running them in the real runtimes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
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


def random_inputs(details, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for d in details:
        dtype = np.dtype(d["dtype"])
        shape = tuple(int(x) for x in d["shape"])
        if np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            out.append(rng.integers(info.min, info.max + 1, size=shape, dtype=dtype))
        elif dtype == np.bool_:
            out.append(rng.integers(0, 2, size=shape).astype(np.bool_))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def run_litert(model: bytes | Path, seed: int = 0) -> list[np.ndarray]:
    """Outputs of LiteRT on seeded random inputs (inputs matched by position)."""
    from ai_edge_litert.interpreter import Interpreter

    data = model.read_bytes() if isinstance(model, Path) else model
    interp = Interpreter(model_content=data)
    interp.allocate_tensors()
    ins = interp.get_input_details()
    for d, x in zip(ins, random_inputs(ins, seed)):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()]


_TFLM_RUN = r"""
import sys, numpy as np
from tflite_micro.python.tflite_micro import runtime
data = open(sys.argv[1], 'rb').read()
interp = runtime.Interpreter.from_bytes(data, arena_size=64 * 1024 * 1024)
def details(get):
    out = []
    while True:
        try:
            out.append(get(len(out)))
        except IndexError:
            return out
rng = np.random.default_rng(int(sys.argv[2]))
for i, d in enumerate(details(interp.get_input_details)):
    dt = np.dtype(d['dtype'])
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        x = rng.integers(info.min, info.max + 1, size=tuple(d['shape']), dtype=dt)
    else:
        x = rng.standard_normal(tuple(d['shape'])).astype(dt)
    interp.set_input(x, i)
interp.invoke()
outs = [interp.get_output(i) for i in range(len(details(interp.get_output_details)))]
np.savez(sys.argv[3], *outs)
"""


def run_tflm(model: bytes | Path, tmp_path: Path, seed: int = 0) -> list[np.ndarray]:
    """Outputs of TFLite Micro (in a child process: its C++ side may abort) on seeded inputs."""
    if isinstance(model, Path):
        path = model
    else:
        path = tmp_path / f"tflm_{abs(hash(model))}.tflite"
        path.write_bytes(model)
    out = tmp_path / f"out_{path.stem}_{seed}.npz"
    proc = subprocess.run([sys.executable, "-c", _TFLM_RUN, str(path), str(seed), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with np.load(out) as z:
        return [z[k] for k in sorted(z.files, key=lambda s: int(s.split("_")[1]))]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolchain.cli", *args], capture_output=True,
                          text=True, cwd=cwd or ROOT, timeout=600)


@pytest.fixture
def example_model() -> Path:
    assert EXAMPLE.exists(), "examples/randwire_small_int8.tflite is missing"
    return EXAMPLE


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: many more random examples; run with `-m slow`")


def pytest_collection_modifyitems(config, items):
    # slow tests run only when asked for by a marker expression naming them
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

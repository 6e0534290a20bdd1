"""The command line's start-up: what it sets before any command module loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _blas_threads(env: dict) -> str:
    """OPENBLAS_NUM_THREADS as a command run through cli.main sees it (a fresh process: numpy
    reads it when it loads)."""
    code = ("import os, sys; from tpu_pipeline import cli; cli.main(['--version']); "
            "sys.stderr.write(os.environ.get('OPENBLAS_NUM_THREADS', 'unset'))")
    full = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    full.update(env, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)
    return proc.stderr.strip().splitlines()[-1]


def test_matrix_products_run_on_one_thread_unless_the_user_says_otherwise():
    assert _blas_threads({}) == "1"
    assert _blas_threads({"OPENBLAS_NUM_THREADS": "3"}) == "3"


def test_numpy_is_not_loaded_before_the_command_line_sets_its_threads():
    """cli.main sets the thread count before it imports a command module; numpy must not be
    loaded by then, or the setting comes too late."""
    code = "import sys; import tpu_pipeline.cli; print('numpy' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.strip() == "False"


def test_help_lists_every_command_without_importing_one():
    code = ("import sys; from tpu_pipeline import cli; rc = cli.main(['--help']); "
            "loaded = sorted(m for m in sys.modules if m.startswith('tpu_pipeline.commands.')); "
            "sys.stderr.write(repr((rc, loaded)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stderr.strip().splitlines()[-1] == "(0, [])"
    from tpu_pipeline.cli import COMMANDS

    for name, _, text in COMMANDS:
        assert name in proc.stdout and text.split()[0] in proc.stdout


def test_a_commands_help_still_has_its_options(capsys):
    from tpu_pipeline import cli

    assert cli.main(["compile", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--num-segments" in out and "--profile" in out and "--format" in out

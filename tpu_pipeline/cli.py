"""Command-line entry: argument parsing, error printing and exit codes. No computation here.

Exit codes: 0 success, 1 verification mismatch, 2 bad input or usage, 3 infeasible,
4 device or I/O failure, 70 internal error (a bug: rerun with --debug for the traceback),
130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

from tpu_pipeline.output import add_format_arguments, resolve_format
from tpu_pipeline.toolchain import __version__, interrupts
from tpu_pipeline.toolchain.errors import EXIT_CODES, ModelError, ToolchainError

# (command, module under tpu_pipeline.commands). Each module has HELP, add_arguments, run.
COMMANDS = (
    ("inspect", "inspect"),
    ("plan", "plan"),
    ("plan-buffers", "plan_buffers"),
    ("schedule", "schedule"),
    ("rewrite", "rewrite"),
    ("fit", "fit"),
    ("compile", "compile"),
    ("run", "run"),
    ("profile", "profile"),
    ("export-mcu", "export_mcu"),
    ("build-firmware", "build_firmware"),
    ("batch", "batch"),
)

INTERNAL_ERROR = 70


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, like every other bad input
        self.exit(2, f"{self.prog}: error: {message}\n")


def named_command(argv) -> str | None:
    """The command `argv` names (its first word that is not an option), if it is one of COMMANDS."""
    word = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    return word if word in dict(COMMANDS) else None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or with `only` of that one alone: each command's module
    imports its passes (~0.15 s for all twelve), which a run of one command need not pay."""
    epilog = "exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + f"; {INTERNAL_ERROR} internal error"
    parser = _Parser(prog="tpu-pipeline", description="Memory-optimal TFLite compilation for Edge TPU pipelines and MCUs.",
                     epilog=epilog)
    parser.add_argument("--version", action="version", version=f"tpu-pipeline {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, module_name in COMMANDS:
        if only is not None and name != only:
            continue
        module = importlib.import_module(f"tpu_pipeline.commands.{module_name}")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
        module.add_arguments(p)
        add_format_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def one_blas_thread() -> None:
    """Matrix products on one thread, unless the user's environment says otherwise. Set before
    numpy loads (no command module is imported yet): the partitioner's products are small, and
    OpenBLAS's thread pool costs more to wake than they take (on a loaded machine 100x: 47 ms
    for a 112x374x150 product against 0.45 ms on one thread), while the second core runs compile's
    checking child. Measured: `compile` of the demo -n 4 --verify 1.27 -> 1.04 CPU s."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main(argv=None) -> int:
    args = None
    one_blas_thread()
    try:
        try:
            args = build_parser(named_command(argv)).parse_args(argv)
        except SystemExit as exc:  # argparse's one-line error (2), --help or --version (0)
            return int(exc.code or 0)
        args._started = time.monotonic()
        resolve_format(args)
        return int(args._run(args) or 0)
    except ToolchainError as exc:
        if getattr(args, "debug", False):
            raise
        print(f"error: {_name_the_model(args, exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        interrupts.finished()
        print("interrupted", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug, not a user error
        if interrupts.received():  # the interrupt, turned into another error by native code
            print("interrupted", file=sys.stderr)
            return 128 + interrupts.received()
        if getattr(args, "debug", False):
            raise
        print(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", file=sys.stderr)
        return INTERNAL_ERROR
    finally:
        interrupts.finished()


def _name_the_model(args, exc: ToolchainError) -> str:
    """A model error raised deep in a pass (a dynamic shape, say) names the file it came from."""
    message = str(exc)
    models = getattr(args, "models", None) or [getattr(args, "model", None)]
    if isinstance(exc, ModelError) and len(models) == 1 and models[0] and str(models[0]) not in message:
        return f"{models[0]}: {message}"
    return message


if __name__ == "__main__":  # python -m tpu_pipeline.cli: the console script's steps (entry.py)
    interrupts.install()
    sys.exit(main())

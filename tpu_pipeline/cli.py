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

# (command, module under tpu_pipeline.commands, one-line help). Each module has add_arguments and run;
# the help lives here so that `tpu-pipeline --help` lists every command without importing any.
COMMANDS = (
    ("inspect", "inspect",
     "op histogram, parameter bytes, activation peak and arena predictions"),
    ("plan", "plan",
     "plan arena offsets (down to the live-bytes bound) and write them as TFLite Micro's offline plan"),
    ("plan-buffers", "plan_buffers",
     "place buffers of a MiniMalloc CSV (id,lower,upper,size) at offsets; writes the CSV with offset"),
    ("schedule", "schedule",
     "reorder ops for the smallest peak activation memory, with a proof of optimality"),
    ("rewrite", "rewrite",
     "identity rewrites (partial-conv and depthwise splitting) kept only where the optimal peak drops"),
    ("fit", "fit",
     "make a model fit an arena budget at the least predicted latency (patch-based execution, TASO's selection)"),
    ("compile", "compile",
     "partition into N Edge TPU pipeline segments (exact CP-SAT), write segments and report.json"),
    ("run", "run",
     "run a compiled pipeline or a model on Coral, an MCU over serial, or the host emulator; measure it"),
    ("profile", "profile",
     "profile a model on a device (or its emulation): latency, throughput, arena bytes, energy, slowest ops"),
    ("export-mcu", "export_mcu",
     "write what the TFLite Micro harness firmware is built from: C array, op resolver, arena size, offline plan"),
    ("build-firmware", "build_firmware",
     "build the harness firmware ELF of an export-mcu project (make, cached TFLite Micro library); flash and RAM"),
    ("batch", "batch",
     "run inspect, fit, profile or compile over many models x devices x budgets; one table, one row per job"),
)

INTERNAL_ERROR = 70


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, like every other bad input
        self.exit(2, f"{self.prog}: error: {message}\n")


def named_command(argv) -> str | None:
    """The command `argv` names (its first word that is not an option), if it is one of COMMANDS."""
    word = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    return word if word in {name for name, _, _ in COMMANDS} else None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """With `only`, the parser of that command alone (its module imports its passes); without,
    the list of every command and its help, no command's module imported (importing all twelve
    cost 0.3 s for `--help` and `--version`)."""
    epilog = "exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + f"; {INTERNAL_ERROR} internal error"
    parser = _Parser(prog="tpu-pipeline", description="Memory-optimal TFLite compilation for Edge TPU pipelines and MCUs.",
                     epilog=epilog)
    parser.add_argument("--version", action="version", version=f"tpu-pipeline {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, module_name, text in COMMANDS:
        if only is None:  # the list of commands (--help, --version, none named): no module loads
            sub.add_parser(name, help=text, description=text)
            continue
        if name != only:
            continue
        module = importlib.import_module(f"tpu_pipeline.commands.{module_name}")
        p = sub.add_parser(name, help=text, description=text)
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
        code = int(args._run(args) or 0)
        if interrupts.received():  # an interrupt Python dropped (it landed in a __del__): not a success
            raise interrupts.Interrupted(interrupts.received())
        return code
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

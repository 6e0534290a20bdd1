"""How the command line prints: tables and lines in the format asked for, progress on stderr.

`--format` (every command): `table` draws boxed tables (rich), `plain` prints aligned columns
with nothing cut, `csv` prints each table as CSV (its title and every other line as `# ` comments),
`json` the command's JSON (what `--json` prints). `auto` (default) is `table` when stdout is a
terminal and `plain` otherwise, so a log, a pipe or CI never gets a table squeezed into 80 columns.

Progress goes to stderr, with the seconds since the command started: one line per message when
stderr is not a terminal (and a "still running" line when a step has been silent for
`HEARTBEAT_S`), a one-line status on a terminal.
"""

from __future__ import annotations

import contextlib
import csv
import json
import re
import sys
import threading
import time
from typing import Any, Callable, Iterator, TextIO

FORMATS = ("auto", "table", "plain", "csv", "json")
HEARTBEAT_S = 10.0
COLUMN_GAP = "  "


def add_format_arguments(p) -> None:
    """--format and its short form --json, on every command."""
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="output: table (boxed), plain (aligned columns, nothing cut), csv, json; default auto: "
                        "table on a terminal, plain otherwise")
    p.add_argument("--json", action="store_true", help="print the result as JSON (= --format json)")


def resolve_format(args) -> str:
    """The format to print in (never `auto`); makes `args.json` agree with it."""
    fmt = getattr(args, "format", None) or "auto"
    if getattr(args, "json", False):
        if fmt not in ("auto", "json"):
            from tpu_pipeline.toolchain.errors import UsageError

            raise UsageError(f"--json and --format {fmt} ask for two formats; give one")
        fmt = "json"
    if fmt == "auto":
        fmt = "table" if sys.stdout.isatty() else "plain"
    args.format, args.json = fmt, fmt == "json"
    return fmt


def _plain_text(cell: Any) -> str:
    """A table cell or a line without rich markup ('[bold]x[/bold]' -> 'x'), on one line."""
    from rich.text import Text

    if isinstance(cell, Text):
        text = cell.plain
    else:
        text = Text.from_markup(str(cell)).plain
    return " ".join(text.split("\n"))


def _cells(table) -> tuple[str | None, list[str], list[str], list[list[str]]]:
    """(title, headers, justifications, rows) of a rich Table, as plain strings."""
    headers = [_plain_text(c.header) for c in table.columns]
    justify = [c.justify or "left" for c in table.columns]
    columns = [[_plain_text(x) for x in c.cells] for c in table.columns]
    rows = [list(r) for r in zip(*columns)] if columns else []
    title = _plain_text(table.title) if table.title else None
    return title, headers, justify, rows


def plain_table(table) -> str:
    """A rich Table as aligned text: the title, the headers, the rows; every cell whole."""
    title, headers, justify, rows = _cells(table)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(values):
        parts = [v.rjust(w) if j == "right" else v.ljust(w) for v, w, j in zip(values, widths, justify)]
        return COLUMN_GAP.join(parts).rstrip()

    out = [title] if title else []
    if any(headers):
        out.append(line(headers))
    out += [line(r) for r in rows]
    return "\n".join(out)


def csv_table(table) -> str:
    title, headers, _, rows = _cells(table)
    buf = _Buffer()
    if title:
        buf.write(f"# {title}\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(headers)
    w.writerows([[_number(c) for c in r] for r in rows])
    return buf.text().rstrip("\n")


_GROUPED = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")


def _number(cell: str) -> str:
    """'32,696' -> '32696' in CSV, so a spreadsheet reads a number (other cells as they are)."""
    return cell.replace(",", "") if _GROUPED.fullmatch(cell) else cell


class _Buffer:
    def __init__(self):
        self.parts: list[str] = []

    def write(self, s: str) -> None:
        self.parts.append(s)

    def text(self) -> str:
        return "".join(self.parts)


class Printer:
    """Where a command prints its human-readable result, in one of the formats (not json: the
    command prints its JSON with `json` instead). `print` takes a line (rich markup allowed) or a
    rich Table, so the same printing code serves every format."""

    def __init__(self, fmt: str = "plain", file: TextIO | None = None):
        if fmt not in ("table", "plain", "csv", "json"):
            raise ValueError(f"unknown format {fmt!r}")
        self.format = fmt
        self.file = file
        self._tables = 0

    @property
    def _out(self) -> TextIO:
        return self.file or sys.stdout

    def print(self, obj: Any = "") -> None:
        from rich.table import Table

        if isinstance(obj, Table):
            self.table(obj)
        elif self.format == "table":
            self._rich().print(obj)
        elif self.format == "csv":
            text = _plain_text(obj)
            self._write(f"# {text}" if text else "")
        else:
            self._write(_plain_text(obj))

    def table(self, table) -> None:
        if self.format == "table":
            con = self._rich()
            for c in table.columns:  # wrap inside a cell on a narrow terminal, never cut with "…"
                c.no_wrap, c.overflow = False, "fold"
            con.print(table)
        elif self.format == "csv":
            if self._tables:
                self._write("")
            self._write(csv_table(table))
        else:
            self._write(plain_table(table))
        self._tables += 1

    def json(self, data: Any) -> None:
        from tpu_pipeline.toolchain.report import json_default

        # one write: json.dump with an indent writes every token apart (200,000 writes for a frontier)
        self._out.write(json.dumps(data, indent=2, default=json_default) + "\n")

    def _write(self, text: str) -> None:
        self._out.write(text + "\n")

    def _rich(self):
        from rich.console import Console

        terminal = self._out.isatty()
        # boxed tables in a pipe (asked for with --format table): as wide as they need, never cut
        return Console(file=self._out, highlight=False, soft_wrap=True, width=None if terminal else 10_000)


def printer(args) -> Printer:
    """The stdout printer for a command's parsed arguments."""
    fmt = args.format if getattr(args, "format", None) in ("table", "plain", "csv", "json") else resolve_format(args)
    return Printer(fmt)


class Progress:
    """Progress messages to stderr with the seconds since `start`; see the module docstring.
    Use as a context manager (it runs the heartbeat / status thread) and call it with messages."""

    def __init__(self, enabled: bool = True, start: float | None = None, stream: TextIO | None = None,
                 heartbeat_s: float = HEARTBEAT_S):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.start = time.monotonic() if start is None else start
        self.heartbeat_s = heartbeat_s
        self.terminal = self.stream.isatty()
        self._last = ""
        self._last_at = self.start
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._status = None
        self._thread: threading.Thread | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        message = _strip_stamp(message)
        with self._lock:
            self._last, self._last_at = message, time.monotonic()
            if self._status is not None:
                self._status.update(self._stamped(message))
            else:
                self.stream.write(self._stamped(message) + "\n")
                self.stream.flush()

    def _stamped(self, message: str) -> str:
        return f"[{self.elapsed():6.1f} s] {message}"

    def __enter__(self) -> "Progress":
        if not self.enabled:
            return self
        if self.terminal:
            from rich.console import Console

            self._status = Console(file=self.stream, highlight=False).status("starting")
            self._status.start()
        self._thread = threading.Thread(target=self._beat, name="progress-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self._status is not None:
            self._status.stop()
            self._status = None

    def _beat(self) -> None:
        tick = 0.5 if self.terminal else 1.0
        while not self._stop.wait(tick):
            with self._lock:
                if not self._last:
                    continue
                if self._status is not None:  # a terminal: the clock in the status line keeps moving
                    self._status.update(self._stamped(self._last))
                elif time.monotonic() - self._last_at >= self.heartbeat_s:
                    self.stream.write(self._stamped(f"{self._last} (still running)") + "\n")
                    self.stream.flush()
                    self._last_at = time.monotonic()


def _strip_stamp(message: str) -> str:
    """Messages from the toolchain carry their own "[  1.2 s] " stamp; the Progress adds its own."""
    if message.startswith("[") and " s] " in message[:14]:
        return message.split(" s] ", 1)[1]
    return message


@contextlib.contextmanager
def progress(args, enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """A Progress for a command: stderr, timed from the command's start."""
    with Progress(enabled=enabled, start=getattr(args, "_started", None)) as p:
        yield p

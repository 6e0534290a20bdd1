"""Allocation problems in MiniMalloc's CSV format: `id,lower,upper,size` (+ `offset` in solutions).

Lifetimes in the CSV are half-open [lower, upper); internally a `Buffer` is inclusive
[first, last] = [lower, upper - 1]. Ids are kept as strings, in file order.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.memory.lifetimes import Buffer
from tpu_pipeline.toolchain.tflite.io import write_bytes_atomic

REQUIRED = ("id", "lower", "upper", "size")


@dataclass(frozen=True)
class AllocationProblem:
    ids: tuple[str, ...]
    buffers: tuple[Buffer, ...]
    capacity: int | None = None  # from the file name "<name>.<capacity>.csv" when present
    offsets: tuple[int, ...] | None = None  # when the file already holds a solution


def _int(value: str, path, line: int, column: str) -> int:
    try:
        return int(value.strip())
    except (ValueError, AttributeError):
        raise ModelError(f"{path}: line {line}: column '{column}' is not an integer: {value!r}") from None


def read_csv(path: str | Path) -> AllocationProblem:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ModelError(f"{path}: cannot read: {exc.strerror or exc}") from None
    # csv.reader with column positions, not DictReader: a dict per row costs seconds at 10^5 rows
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader, [])]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise ModelError(f"{path}: not a MiniMalloc CSV: missing column(s) {', '.join(missing)} "
                         f"(expected header id,lower,upper,size)")
    col = {c: header.index(c) for c in (*REQUIRED, "offset") if c in header}
    ids, bufs, offsets = [], [], []
    has_offsets = "offset" in col
    width = max(col.values()) + 1
    for line, row in enumerate(reader, start=2):
        if not any(v.strip() for v in row):
            continue
        if len(row) < width:
            row = row + [""] * (width - len(row))
        lower = _int(row[col["lower"]], path, line, "lower")
        upper = _int(row[col["upper"]], path, line, "upper")
        size = _int(row[col["size"]], path, line, "size")
        if lower < 0 or upper <= lower:
            raise ModelError(f"{path}: line {line}: lifetime [{lower}, {upper}) is empty or negative")
        if size < 0:
            raise ModelError(f"{path}: line {line}: negative size {size}")
        name = row[col["id"]].strip()
        ids.append(name)
        bufs.append(Buffer(size, lower, upper - 1, name=name))
        if has_offsets:
            offsets.append(_int(row[col["offset"]], path, line, "offset"))
    if len(set(ids)) != len(ids):
        raise ModelError(f"{path}: duplicate buffer ids")
    capacity = None
    parts = path.name.split(".")
    if len(parts) >= 3 and parts[-2].isdigit():
        capacity = int(parts[-2])
    return AllocationProblem(tuple(ids), tuple(bufs), capacity, tuple(offsets) if has_offsets else None)


def to_csv(problem: AllocationProblem, offsets) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow([*REQUIRED, "offset"])
    for i, b, o in zip(problem.ids, problem.buffers, offsets):
        w.writerow([i, b.first, b.last + 1, b.size, o])
    return out.getvalue()


def write_csv(problem: AllocationProblem, offsets, path: str | Path) -> None:
    write_bytes_atomic(path, to_csv(problem, offsets).encode())

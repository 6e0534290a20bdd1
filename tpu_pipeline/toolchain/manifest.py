"""report.json as a typed, versioned manifest: what `compile` writes and `run` reads.

The compiler writes it with `Manifest.from_json(report, folder).dumps()`; the runtime reads it
with `load_manifest(folder)`. Both go through the same validation, so a report the runtime
would misread (a segment file outside the folder, a string where a count belongs, NaN, a
list instead of an object) is refused with one line naming the field:

    out/report.json: segments[0].file: '../../x' is not a plain file name in the folder

Only the fields the runtime uses are typed here; every other field (solver figures, baseline,
passes, notes, ...) is kept as it is in `extra`, so newer compilers can add fields freely.
A report without "version" (written before the manifest existed) is read as version 1 when it
validates; a version newer than MANIFEST_VERSION is refused.

Version 2 (`compile -n auto`) adds `n_candidates` (one entry per n tried: n, period_s,
throughput_per_s, cached_bytes, streamed_bytes, proven) and `n_chosen` (the n written, one of
them); both are optional and checked when present.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tpu_pipeline.toolchain.errors import ModelError

MANIFEST_VERSION = 2
REPORT_NAME = "report.json"

MAX_REPORT_BYTES = 32 * 1024 * 1024  # compile writes kilobytes; anything this big is not ours
MAX_DEPTH = 64  # nesting of JSON values; compile's reports are under 10 deep
MAX_SEGMENTS = 4096
MAX_NAME_CHARS = 4096  # tensor names
MAX_INT_DIGITS = 20  # fits an int64 byte count
_INT64 = 2 ** 63 - 1
# A device is named, never a path: the runtime looks it up in devices/<name>.toml.
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")


@dataclass(frozen=True)
class Prediction:
    """The cost model's whole-pipeline figures (seconds, inferences per second, joules)."""

    latency_s: float | None = None
    throughput_per_s: float | None = None
    energy_j: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {**self.extra, "latency_s": self.latency_s, "throughput_per_s": self.throughput_per_s,
                "energy_j": self.energy_j}


@dataclass(frozen=True)
class SegmentEntry:
    """One pipeline segment: its file in the folder and its interface tensors, in order.

    `inputs`/`outputs` are None when the report does not list them (the runtime then reads
    them from the file)."""

    index: int
    file: str
    inputs: tuple[str, ...] | None = None
    outputs: tuple[str, ...] | None = None
    ops: int | None = None
    parameter_bytes: int | None = None
    predicted_latency_s: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        d = {**self.extra, "index": self.index, "file": self.file}
        for k in ("inputs", "outputs"):
            if getattr(self, k) is not None:
                d[k] = list(getattr(self, k))
        for k in ("ops", "parameter_bytes", "predicted_latency_s"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d


@dataclass(frozen=True)
class Manifest:
    version: int
    segments: tuple[SegmentEntry, ...]
    model: str | None = None  # the whole model, for checking the pipeline's outputs
    device: str | None = None  # a device name (devices/<name>.toml)
    inputs: tuple[str, ...] | None = None
    outputs: tuple[str, ...] | None = None
    predicted: Prediction | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_segments(self) -> int:
        return len(self.segments)

    @classmethod
    def from_json(cls, obj: Any, folder: str | os.PathLike) -> "Manifest":
        """Validate a parsed report against the files in `folder`; ModelError naming the field."""
        return _Reader(Path(folder)).manifest(obj)

    def to_json(self) -> dict:
        d: dict[str, Any] = {"version": self.version}
        if self.model is not None:
            d["model"] = self.model
        if self.device is not None:
            d["device"] = self.device
        d["num_segments"] = self.num_segments
        for k in ("inputs", "outputs"):
            if getattr(self, k) is not None:
                d[k] = list(getattr(self, k))
        d["segments"] = [s.to_json() for s in self.segments]
        if self.predicted is not None:
            d["predicted"] = self.predicted.to_json()
        return {**d, **{k: v for k, v in self.extra.items() if k not in d}}

    def dumps(self) -> str:
        """The report.json text. JSON has no NaN or infinity: such figures in the free-form
        fields are written as null (the typed fields cannot hold them)."""
        return json.dumps(_finite(self.to_json()), indent=2, allow_nan=False) + "\n"


def load_manifest(folder: str | os.PathLike) -> Manifest:
    """Read and validate `folder/report.json`; ModelError "<folder>/report.json: <field>: <problem>"."""
    folder = Path(folder)
    path = folder / REPORT_NAME
    label = str(path)
    inside(folder, REPORT_NAME, label, "the report")
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ModelError(f"{label}: cannot read it ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ModelError(f"{label}: not a regular file")
    if st.st_size > MAX_REPORT_BYTES:
        raise ModelError(f"{label}: {st.st_size:,} bytes, more than a report can be ({MAX_REPORT_BYTES:,})")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ModelError(f"{label}: cannot read it ({exc.strerror})") from None
    return Manifest.from_json(parse_json(raw, label), folder)


class _Refused(Exception):
    pass


def _no_constant(name: str):
    raise _Refused(f"{name} is not a JSON number")


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"a {len(text)}-digit number is out of range")
    return int(text)


def _parse_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise _Refused(f"the number {text[:40]} is out of range")
    return x


def parse_json(raw: bytes, label: str) -> Any:
    """Strict JSON (RFC 8259): UTF-8, no NaN/Infinity, numbers within range, bounded nesting."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelError(f"{label}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    try:
        obj = json.loads(text, parse_constant=_no_constant, parse_int=_parse_int, parse_float=_parse_float)
    except _Refused as exc:
        raise ModelError(f"{label}: not readable JSON: {exc}") from None
    except RecursionError:
        raise ModelError(f"{label}: not readable JSON: nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # JSONDecodeError, and int() of a number too long to convert
        raise ModelError(f"{label}: not readable JSON ({' '.join(str(exc).split())[:160]})") from None
    _check_depth(obj, label)
    return obj


def _check_depth(obj: Any, label: str) -> None:
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise ModelError(f"{label}: not readable JSON: nested more than {MAX_DEPTH} levels deep")
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))


def inside(folder: Path, name: Any, label: str, what: str) -> Path:
    """`folder/name` when `name` is a plain file name whose file (links followed) stays in `folder`."""
    if not isinstance(name, str):
        raise ModelError(f"{label}: {what}: expected a file name (string), got {_kind(name)}")
    if (not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name or len(name) > 255
            or os.path.isabs(name)):
        raise ModelError(f"{label}: {what}: {_show(name)} is not a plain file name in the folder")
    path = folder / name
    if os.path.lexists(path):
        real, root = path.resolve(), folder.resolve()
        if real.parent != root and root not in real.parents:
            raise ModelError(f"{label}: {what}: {_show(name)} is a link leading outside the folder")
    return path


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {_show(value)}"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Reader:
    """One validation pass; every refusal names the report, the field and the problem."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.label = str(folder / REPORT_NAME)

    def fail(self, where: str, problem: str):
        raise ModelError(f"{self.label}: {where}: {problem}")

    def object(self, value: Any, where: str) -> dict:
        if not isinstance(value, dict):
            self.fail(where, f"expected an object, got {_kind(value)}")
        return value

    def integer(self, value: Any, where: str, lo: int = 0, hi: int = _INT64) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(where, f"expected an integer, got {_kind(value)}")
        if not lo <= value <= hi:
            self.fail(where, f"{_show(value)} is out of range ({lo}..{hi})")
        return value

    def seconds(self, value: Any, where: str) -> float | None:
        """A non-negative finite figure, or null."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(where, f"expected a number or null, got {_kind(value)}")
        if not math.isfinite(value) or value < 0 or value > 1e12:
            self.fail(where, f"{_show(value)} is out of range (0..1e12)")
        return float(value)

    def names(self, value: Any, where: str) -> tuple[str, ...]:
        if not isinstance(value, list):
            self.fail(where, f"expected a list of tensor names, got {_kind(value)}")
        for k, n in enumerate(value):
            if not isinstance(n, str):
                self.fail(f"{where}[{k}]", f"expected a tensor name (string), got {_kind(n)}")
            if not n or len(n) > MAX_NAME_CHARS:
                self.fail(f"{where}[{k}]", f"a tensor name of {len(n)} characters")
        if len(set(value)) != len(value):
            dup = next(n for n in value if value.count(n) > 1)
            self.fail(where, f"tensor {_show(dup)} is listed twice")
        return tuple(value)

    def manifest(self, obj: Any) -> Manifest:
        if not isinstance(obj, dict):
            raise ModelError(f"{self.label}: expected a JSON object at the top level, got {_kind(obj)}")
        _check_depth(obj, self.label)
        version = obj.get("version", 1)  # reports from before the manifest carry no version: 1
        self.integer(version, "version", 1, _INT64)
        if version > MANIFEST_VERSION:
            self.fail("version", f"{version} is newer than this tpu-pipeline reads ({MANIFEST_VERSION}); upgrade it")
        if "segments" not in obj:
            self.fail("segments", "missing (no 'segments' list)")
        raw_segments = obj["segments"]
        if not isinstance(raw_segments, list):
            self.fail("segments", f"expected a list, got {_kind(raw_segments)} (no 'segments' list)")
        if not raw_segments:
            self.fail("segments", "empty (no 'segments' list with a segment to run)")
        if len(raw_segments) > MAX_SEGMENTS:
            self.fail("segments", f"{len(raw_segments)} segments, more than {MAX_SEGMENTS}")
        if "num_segments" in obj:
            n = self.integer(obj["num_segments"], "num_segments", 1, MAX_SEGMENTS)
            if n != len(raw_segments):
                raise ModelError(f"{self.label}: num_segments is {n} but {len(raw_segments)} segment(s) are listed")
        segments = [self.segment(s, k) for k, s in enumerate(raw_segments)]
        segments.sort(key=lambda s: s.index)
        if [s.index for s in segments] != list(range(len(segments))):
            self.fail("segments", f"indices {[s.index for s in segments]} are not 0..{len(segments) - 1}")
        files: dict[str, int] = {}
        for s in segments:
            if s.file in files:
                self.fail(f"segments[{s.index}].file", f"{_show(s.file)} is also segment {files[s.file]}'s file")
            files[s.file] = s.index
        model = obj.get("model")
        if model is not None:
            self.tflite_name(model, "model")
        device = obj.get("device")
        if device is not None:
            if not isinstance(device, str):
                self.fail("device", f"expected a device name (string), got {_kind(device)}")
            if not _DEVICE_NAME.match(device) or device.endswith(".toml"):
                self.fail("device", f"{_show(device)} is not a device name (a devices/<name>.toml name, not a path)")
        inputs = self.names(obj["inputs"], "inputs") if obj.get("inputs") is not None else None
        outputs = self.names(obj["outputs"], "outputs") if obj.get("outputs") is not None else None
        predicted = None
        if obj.get("predicted") is not None:
            p = self.object(obj["predicted"], "predicted")
            predicted = Prediction(*(self.seconds(p.get(k), f"predicted.{k}")
                                     for k in ("latency_s", "throughput_per_s", "energy_j")),
                                   extra={k: v for k, v in p.items()
                                          if k not in ("latency_s", "throughput_per_s", "energy_j")})
        if obj.get("n_candidates") is not None or obj.get("n_chosen") is not None:
            self.n_choice(obj, len(segments))
        typed = {"version", "segments", "num_segments", "model", "device", "inputs", "outputs", "predicted"}
        extra = {k: v for k, v in obj.items() if k not in typed}
        return Manifest(version, tuple(segments), model, device, inputs, outputs, predicted, extra)

    def n_choice(self, obj: dict, n_segments: int) -> None:
        """-n auto's table (version 2): every row typed, the chosen n one of its rows and the n written."""
        rows = obj.get("n_candidates")
        if not isinstance(rows, list) or not rows:
            self.fail("n_candidates", f"expected a list of the n tried, got {_kind(rows)}")
        seen = []
        for k, raw in enumerate(rows):
            where = f"n_candidates[{k}]"
            row = self.object(raw, where)
            for key in ("n", "period_s", "throughput_per_s", "cached_bytes", "streamed_bytes", "proven"):
                if key not in row:
                    self.fail(f"{where}.{key}", "missing")
            seen.append(self.integer(row["n"], f"{where}.n", 1, MAX_SEGMENTS))
            for key in ("period_s", "throughput_per_s"):
                self.seconds(row[key], f"{where}.{key}")
            for key in ("cached_bytes", "streamed_bytes"):
                self.integer(row[key], f"{where}.{key}")
            if not isinstance(row["proven"], bool):
                self.fail(f"{where}.proven", f"expected true or false, got {_kind(row['proven'])}")
        if len(set(seen)) != len(seen):
            self.fail("n_candidates", "an n is listed twice")
        chosen = self.integer(obj.get("n_chosen"), "n_chosen", 1, MAX_SEGMENTS)
        if chosen not in seen:
            self.fail("n_chosen", f"{chosen} is not one of the n_candidates ({', '.join(map(str, seen))})")
        if chosen != n_segments:
            self.fail("n_chosen", f"{chosen}, but {n_segments} segment(s) are listed")

    def tflite_name(self, name: Any, where: str) -> Path:
        path = inside(self.folder, name, self.label, where)
        if not name.endswith(".tflite"):
            self.fail(where, f"{_show(name)} is not a .tflite file name")
        return path

    def segment(self, raw: Any, k: int) -> SegmentEntry:
        where = f"segments[{k}]"
        s = self.object(raw, where)
        index = self.integer(s["index"], f"{where}.index", 0, MAX_SEGMENTS - 1) if "index" in s else k
        where = f"segments[{index}]" if index == k else where
        if "file" not in s:
            self.fail(f"{where}.file", "missing")
        path = self.tflite_name(s["file"], f"{where}.file")
        if not path.is_file():
            self.fail(f"{where}.file", f"{s['file']} is missing from the folder")
        has_in, has_out = s.get("inputs") is not None, s.get("outputs") is not None
        if has_in != has_out:
            self.fail(f"{where}.{'outputs' if has_in else 'inputs'}",
                      "missing (give both inputs and outputs, or neither)")
        inputs = self.names(s["inputs"], f"{where}.inputs") if has_in else None
        outputs = self.names(s["outputs"], f"{where}.outputs") if has_out else None
        ops = self.integer(s["ops"], f"{where}.ops", 0, 2 ** 31 - 1) if s.get("ops") is not None else None
        param = (self.integer(s["parameter_bytes"], f"{where}.parameter_bytes")
                 if s.get("parameter_bytes") is not None else None)
        latency = self.seconds(s.get("predicted_latency_s"), f"{where}.predicted_latency_s")
        typed = {"index", "file", "inputs", "outputs", "ops", "parameter_bytes", "predicted_latency_s"}
        extra = {key: v for key, v in s.items() if key not in typed}
        return SegmentEntry(index, s["file"], inputs, outputs, ops, param, latency, extra)

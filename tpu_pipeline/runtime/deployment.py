"""What the runtime runs: a compiled directory (report.json + segment files) or one .tflite.

A compiled directory follows the contract of `tpu-pipeline compile -n N -o DIR`: `DIR/<stem>.tflite`
(the whole model), `DIR/<stem>_segment_<i>_of_<N>.tflite` for i = 0..N-1 and `DIR/report.json`
naming each segment's input and output tensors in order. A directory that only holds Coral-named
segment files (edgetpu_compiler's output) is accepted too: tensor names are read from the files.
One .tflite is a pipeline of one segment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.manifest import REPORT_NAME, Manifest, inside, load_manifest

_SEGMENT = re.compile(r"^(?P<stem>.+)_segment_(?P<i>\d+)_of_(?P<n>\d+)\.tflite$")


@dataclass(frozen=True)
class Segment:
    index: int
    path: Path
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    ops: int | None = None
    parameter_bytes: int | None = None
    predicted_latency_s: float | None = None

    @property
    def edgetpu_path(self) -> Path:
        """Where edgetpu_compiler puts this segment compiled for the Edge TPU."""
        return self.path.with_name(self.path.stem + "_edgetpu.tflite")


@dataclass(frozen=True)
class Deployment:
    source: Path  # what the user named: a directory or a .tflite
    whole: Path | None  # the whole model, for checking outputs; None if absent
    segments: tuple[Segment, ...]
    manifest: Manifest | None = None  # the validated report.json, when there is one
    device: str | None = None  # the device the compiler targeted (a name), if it said

    @property
    def report(self) -> dict[str, Any] | None:
        """report.json as validated (typed fields normalised, other fields as written)."""
        return self.manifest.to_json() if self.manifest is not None else None

    @property
    def name(self) -> str:
        return (self.whole or self.segments[0].path).name

    @property
    def graph_inputs(self) -> tuple[str, ...]:
        """Tensors the pipeline needs from the host: consumed by a segment, produced by none before it."""
        produced, needed = set(), []
        for s in self.segments:
            for t in s.inputs:
                if t not in produced and t not in needed:
                    needed.append(t)
            produced.update(s.outputs)
        return tuple(needed)


def tensor_names(path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(input names, output names) of a .tflite's main subgraph, in the model's order."""
    from tpu_pipeline.toolchain.tflite import read_model

    model = read_model(path)
    sg = model.subgraphs[0]

    def name(i):
        n = sg.tensors[i].name
        return n.decode("utf-8", "replace") if isinstance(n, bytes) else n  # as the compiler reads names

    return tuple(name(i) for i in sg.inputs), tuple(name(i) for i in sg.outputs)


def _count_ops(path: Path) -> int:
    from tpu_pipeline.toolchain.tflite import read_model

    return len(read_model(path).subgraphs[0].operators or [])


def load_deployment(path: str | Path) -> Deployment:
    """Read a compiled directory or a single model; ModelError naming the file on any problem."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"{p}: no such file or directory")
    if p.is_file():
        if p.suffix != ".tflite":
            raise ModelError(f"{p}: expected a .tflite model or a compiled directory")
        ins, outs = tensor_names(p)
        return Deployment(p, p, (Segment(0, p, ins, outs, _count_ops(p)),))
    report_path = p / REPORT_NAME
    if report_path.exists() or report_path.is_symlink():
        return _from_report(p, report_path)
    return _from_segment_files(p)


def _from_report(root: Path, report_path: Path) -> Deployment:
    """Through the typed manifest: every file it names is a plain name inside `root`."""
    m = load_manifest(root)
    segments = []
    for s in m.segments:
        f = root / s.file
        if s.inputs is not None and s.outputs is not None:
            ins, outs = s.inputs, s.outputs
        else:
            ins, outs = tensor_names(f)
        segments.append(Segment(s.index, f, ins, outs, s.ops, s.parameter_bytes, s.predicted_latency_s))
    whole = root / m.model if m.model else None
    if whole is not None and not whole.is_file():
        whole = None
    _check_interfaces(report_path, segments)
    return Deployment(root, whole, tuple(segments), m, m.device)


def _from_segment_files(root: Path) -> Deployment:
    found: dict[tuple[str, int], dict[int, Path]] = {}
    for f in sorted(root.iterdir()):
        m = _SEGMENT.match(f.name)
        if m:
            inside(root, f.name, str(root), "segment file")  # a link out of the folder is refused
            found.setdefault((m["stem"], int(m["n"])), {})[int(m["i"])] = f
    if not found:
        raise ModelError(f"{root}: no report.json and no <stem>_segment_<i>_of_<n>.tflite files")
    if len(found) > 1:
        raise ModelError(f"{root}: segment files of several models ({', '.join(f'{s} n={n}' for s, n in found)}); "
                         "point at one report.json directory")
    (stem, n), files = next(iter(found.items()))
    missing = [i for i in range(n) if i not in files]
    if missing:
        raise ModelError(f"{root}: segment(s) {missing} of {n} for {stem} are missing")
    segments = []
    for i in range(n):
        ins, outs = tensor_names(files[i])
        segments.append(Segment(i, files[i], ins, outs, _count_ops(files[i])))
    whole = root / f"{stem}.tflite"
    _check_interfaces(root, segments)
    whole = inside(root, whole.name, str(root), "whole model")
    return Deployment(root, whole if whole.is_file() else None, tuple(segments), None)


def _check_interfaces(where: Path, segments: list[Segment]) -> None:
    """Every tensor a segment reads that an earlier segment writes must come from exactly one."""
    seen: dict[str, int] = {}
    for s in segments:
        for t in s.outputs:
            if t in seen:
                raise ModelError(f"{where}: tensor '{t}' is produced by segments {seen[t]} and {s.index}")
            seen[t] = s.index

"""`compile --profile RUN.json`: re-partition with measured stage times in place of predictions.

RUN.json is what `tpu-pipeline run DIR --backend coral|emulator --json` printed for an earlier
compile's folder DIR: per stage its measured median latency and the latency the cost model
predicted for it. Each op is found in the segment file that ran it (by its output tensor names,
which every pass keeps), and the compute time of each stage's ops is scaled so that the cost model
gives that stage exactly its measured time: factor = (compute + measured - predicted) / compute,
the stage's difference put on its ops in proportion to their predicted compute (a stage measured
2x slower than predicted whose time is mostly fixed per-invoke cost gets a much larger factor than
2: only its ops can be moved). The same exact search (down-set DP, then the simulated-period refinement) then partitions the
scaled problem: every stage is balanced against the measurements, the slowest one included,
unlike libcoral's `partition_with_profiling`, whose bisection looks at the last segment.

On the emulator the measured times are the host CPU running each segment, not an Edge TPU, so only
their relative speeds are used (the factors are divided by their geometric mean); on Coral
hardware the factors are used as measured.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from tpu_pipeline.toolchain.errors import ModelError, UsageError
from tpu_pipeline.toolchain.ir import Graph

BACKENDS = ("coral", "emulator")
# A stage measured faster than its predicted fixed costs allow keeps this much of its ops' compute.
MIN_FACTOR = 0.01


@dataclass(frozen=True)
class Profile:
    source: str
    backend: str
    relative: bool                       # only the stages' relative speeds are used (emulator)
    measured_s: tuple[float, ...]        # per profiled stage, median
    predicted_s: tuple[float, ...]
    stage_factors: tuple[float, ...]     # the multiplier of the compute time of each stage's ops
    op_factors: tuple[float, ...]        # per op of the graph being compiled
    op_stages: tuple[int, ...]           # the stage each op ran in (-1: not found)
    targets_s: tuple[float, ...] = ()    # the stage times the scaled model reproduces (measured, or relative)

    @property
    def unmatched_ops(self) -> int:
        return sum(1 for s in self.op_stages if s < 0)

    def to_json(self) -> dict:
        return {"source": self.source, "backend": self.backend, "relative": self.relative,
                "stages": [{"index": k, "measured_s": m, "predicted_s": p, "target_s": t, "factor": f}
                           for k, (m, p, t, f) in enumerate(zip(self.measured_s, self.predicted_s, self.targets_s,
                                                                self.stage_factors))],
                "unmatched_ops": self.unmatched_ops}


def _number(value, where: str, label: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise UsageError(f"{label}: {where} must be a positive number of seconds, got {value!r}")
    return float(value)


def _stages(run: dict, label: str) -> list[tuple[str, float, float]]:
    """(segment file, measured median s, predicted s) per stage, in order."""
    stages = run.get("stages")
    if not isinstance(stages, list) or not stages:
        raise UsageError(f"{label}: no 'stages' list: give the --json output of `tpu-pipeline run DIR` for a "
                         "compiled pipeline")
    out = []
    for k, st in enumerate(sorted(stages, key=lambda s: s.get("index", 0) if isinstance(s, dict) else 0)):
        if not isinstance(st, dict) or not isinstance(st.get("file"), str) or not isinstance(st.get("latency"), dict):
            raise UsageError(f"{label}: stages[{k}] has no segment file and latency")
        out.append((st["file"], _number(st["latency"].get("median_s"), f"stages[{k}].latency.median_s", label),
                    _number(st.get("predicted_latency_s"), f"stages[{k}].predicted_latency_s", label)))
    return out


def _folder(run: dict, path: Path, label: str) -> Path:
    where = run.get("model")
    if not isinstance(where, str):
        raise UsageError(f"{label}: no 'model' folder named: give the --json output of `tpu-pipeline run DIR`")
    for cand in (Path(where), path.parent / where):
        if cand.is_dir():
            return cand
    raise UsageError(f"{label}: the compiled folder it ran, {where}, is not there any more")


def _op_stages(graph: Graph, folder: Path, files: list[str], label: str) -> list[int]:
    by_output = {graph.tensors[t].name: v for v, op in enumerate(graph.ops) for t in op.outputs if t >= 0}
    stage = [-1] * len(graph.ops)
    for k, name in enumerate(files):
        seg = folder / Path(name).name
        from tpu_pipeline.toolchain.loader import load  # reads and checks the file, as every pass's input

        try:
            seg_graph = load(seg)[1]
        except ModelError as exc:
            raise UsageError(f"{label}: segment {k}: {exc}") from None
        for op in seg_graph.ops:
            for t in op.outputs:
                v = by_output.get(seg_graph.tensors[t].name) if t >= 0 else None
                if v is not None:
                    stage[v] = k
    return stage


def read_profile(path, graph: Graph, compute_ps) -> Profile:
    """The measured profile of `path` mapped onto `graph`'s ops, whose predicted compute times are
    `compute_ps` (UsageError: one line)."""
    path = Path(path)
    label = str(path)
    try:
        run = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"--profile {label}: cannot read it as JSON ({getattr(exc, 'strerror', None) or exc})") from None
    if not isinstance(run, dict):
        raise UsageError(f"{label}: expected the JSON object `tpu-pipeline run --json` prints")
    backend = run.get("backend")
    if backend not in BACKENDS:
        raise UsageError(f"{label}: backend {backend!r}: --profile takes a run on {' or '.join(BACKENDS)}")
    stages = _stages(run, label)
    op_stages = _op_stages(graph, _folder(run, path, label), [f for f, _, _ in stages], label)
    if all(s < 0 for s in op_stages):
        raise UsageError(f"{label}: none of this model's ops is in the profiled segments (a run of another model?)")
    ratios = [m / p for _, m, p in stages]
    relative = backend == "emulator"
    if relative:
        mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        ratios = [r / mean for r in ratios]
    targets = [p * r for (_, _, p), r in zip(stages, ratios)]
    compute = [0] * len(stages)
    for v, s in enumerate(op_stages):
        if s >= 0:
            compute[s] += compute_ps[v]
    scale = [max(MIN_FACTOR, (c + (t - p) * 1e12) / c) if c else 1.0
             for c, t, (_, _, p) in zip(compute, targets, stages)]
    factors = tuple(scale[s] if s >= 0 else 1.0 for s in op_stages)
    return Profile(label, backend, relative, tuple(m for _, m, _ in stages), tuple(p for _, _, p in stages),
                   tuple(scale), factors, tuple(op_stages), tuple(targets))


__all__ = ["Profile", "read_profile", "BACKENDS"]

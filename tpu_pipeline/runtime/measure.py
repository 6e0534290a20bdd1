"""Latency statistics and the figures every backend reports, as plain values."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence


@dataclass(frozen=True)
class LatencyStats:
    """Summary of per-inference times in seconds (p90 by the nearest-rank rule)."""

    n: int
    min_s: float
    median_s: float
    p90_s: float
    mean_s: float
    max_s: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> "LatencyStats | None":
        xs = sorted(float(x) for x in samples)
        if not xs:
            return None
        n = len(xs)
        mid = n // 2
        median = xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2
        p90 = xs[max(0, math.ceil(0.9 * n) - 1)]
        return cls(n, xs[0], median, p90, sum(xs) / n, xs[-1])

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StageReport:
    """One pipeline segment: what ran, how long it took on the host or device, what was predicted."""

    index: int
    file: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    latency: LatencyStats | None
    predicted_latency_s: float | None = None
    device: str = ""

    def to_json(self) -> dict:
        d = asdict(self)
        d["latency"] = self.latency.to_json() if self.latency else None
        return d


@dataclass
class RunReport:
    """What a backend measured. Fields a backend cannot measure stay None."""

    backend: str
    device: str
    model: str
    iterations: int
    latency: LatencyStats | None = None  # end to end, one inference at a time
    throughput_per_s: float | None = None  # pipelined, all segments busy
    stages: list[StageReport] = field(default_factory=list)
    verified: bool | None = None  # outputs equal the whole model's (bit-exact)
    max_abs_diff: float | None = None
    predicted: dict[str, Any] = field(default_factory=dict)  # latency_s, throughput_per_s, energy_j
    arena: dict[str, Any] | None = None  # MCU: configured, head, tail, used, fits
    stack_bytes_measured: int | None = None  # MCU: the stack's high-water mark since boot (harness firmware)
    energy: dict[str, Any] | None = None  # measured: avg_power_w, energy_per_inference_j, samples
    ops: list[dict[str, Any]] = field(default_factory=list)  # per-op profile lines
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # set when the run stopped early; what is here was measured before
    # No target hardware ran it: the emulator, or a harness that says so (the fake MCU). docs/cli.md, glossary.
    simulated: bool = False

    def __post_init__(self):
        if self.backend == "emulator":
            self.simulated = True

    def to_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items()}
        d["latency"] = self.latency.to_json() if self.latency else None
        d["stages"] = [s.to_json() for s in self.stages]
        return d

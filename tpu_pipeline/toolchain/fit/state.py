"""`FitState`: the plain record fit's stages hand each other (stages/; run by toolchain/driver.py).

A stage never edits a state: it returns a new one (`dataclasses.replace`) and a PassRecord. The
pool is the one mutable member: the selection stage builds and measures variants in it lazily.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpu_pipeline.toolchain.budget import Deadline, Progress
from tpu_pipeline.toolchain.device import Device
from tpu_pipeline.toolchain.fit.params import FitParams
from tpu_pipeline.toolchain.fit.pool import Pool
from tpu_pipeline.toolchain.fit.select import Selection
from tpu_pipeline.toolchain.fit.variants import Variant
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.memory.semantics import Semantics


@dataclass(frozen=True)
class FitState:
    params: FitParams
    device: Device  # whose cost model prices the variants
    sem: Semantics  # the kernel set's memory semantics: every floor takes the object
    original: Graph  # the graph as given (the baseline)
    graph: Graph  # the latest graph: the working one, then the chosen one realised (the driver lints it)
    working: Graph  # the graph the spans index (the harness form, with `harness`)
    deadline: Deadline  # the whole fit's
    t0: float  # monotonic start, for progress lines
    progress: Progress = None
    model: Any = None  # the source model as tflite/ reads it (calibration of lossy splits)
    spans: tuple = ()
    as_is: tuple[Variant, ...] = ()
    op_seconds: dict | None = None  # op index -> predicted seconds on the device
    tail_fixed: int | None = None  # the tail no variant changes (None: the head alone is selected on)
    rewrites: tuple[Variant, ...] = ()
    twins: tuple[Variant, ...] = ()
    candidates: tuple[Variant, ...] = ()
    pool: Pool | None = None
    baseline: Selection | None = None  # the model as it is (its harness form until the baseline stage)
    selection: Selection | None = None
    frontier: tuple[Selection, ...] = ()
    complete: bool = False  # the frontier reached the smallest arena
    cut_short: bool = False  # the selection stopped at its deadline before its pick was all built
    probes: dict | None = None
    realised: tuple | None = None  # (graph, Schedule, TFLM plan) of the chosen selection
    notes: tuple[str, ...] = ()

    @property
    def options(self) -> FitParams:  # what the driver reads (`when`, the optional stages that are on)
        return self.params

"""The plain values the compile passes hand each other.

A pass never edits a state: it returns a new one (`dataclasses.replace`) and a `PassRecord`
saying what it did. The options are fixed for the whole run.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_pipeline.toolchain.device import Device
from tpu_pipeline.toolchain.driver import PassRecord  # what a pass returns beside its state
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.memory.semantics import TFLITE, Semantics


@dataclass(frozen=True)
class CompileOptions:
    paths: tuple[Path, ...]
    n: int | None              # None: -n auto (the partition pass chooses it among 1..max_n)
    out_dir: Path
    device: Device
    strategy: str = "latency"
    time_limit: float = 10.0
    verify: bool = False
    colocate: bool = False
    passes: tuple[str, ...] = ("rewrite", "schedule", "plan")   # the optional passes that run
    workers: int = 2
    semantics: Semantics = TFLITE  # whose memory model rewrite and schedule minimise
    budget: int | None = None  # TFLite Micro arena head to fit (the fit pass; semantics is then tflm)
    gap: float = 0.01          # the partition stops within this fraction of its proven bound
    int8_io: bool = False      # the float QUANTIZE/DEQUANTIZE at the interface dropped (rewrite.interface)
    input_outside_arena: bool = False  # the offline plan keeps the inputs out of the arena (harness firmware)
    max_n: int = 8             # -n auto: the largest n tried
    knee: float = 0.05         # -n auto: the fewest TPUs within this fraction of the best throughput per TPU
    cuts: tuple[tuple[str, ...], ...] | None = None  # --cuts: per boundary, tensor names or op indices (text)
    profile: Path | None = None  # --profile: a `run --json` whose measured stage times replace the predictions
    mix: str | None = None     # several models: the invocation mix (A=3,B=1) the co-compilation order is chosen for
    fit_cost_device: Device | None = None  # the MCU whose cost model the fit pass prices variants with

    @property
    def stem(self) -> str:
        return "+".join(p.stem for p in self.paths)

    @property
    def label(self) -> str:
        """How messages name the input: its path, or the co-deployment's stem."""
        return str(self.paths[0]) if len(self.paths) == 1 else self.stem


@dataclass(frozen=True)
class SegmentFile:
    """One pipeline segment as written: its file name, the pieces whose concatenation is the file
    (`model_to_chunks`: the tables, then the constant buffers as views of the model's own arrays,
    written as they are, not joined first) and its report entry."""
    file: str
    chunks: tuple
    report: dict

    @functools.cached_property
    def data(self) -> bytes:
        """The file's bytes, joined once for the readers that need them whole (--verify's LiteRT)."""
        return b"".join(self.chunks)


@dataclass(frozen=True)
class CompileState:
    options: CompileOptions
    sources: tuple[tuple[str, bytes], ...] = ()    # (label, bytes) of each input model
    prefixes: tuple[str, ...] = ()                 # tensor-name prefix of each input (co-deployment)
    template: Any = None                           # the model as read: `emit` writes the graph back into it
    other_subgraph_tensors: int = 0                # tensors of WHILE/IF bodies, which the IR leaves alone
    graph: Graph | None = None                     # the IR; tensor k and op k are those of `whole`
    loaded: Graph | None = None                    # the IR as read, before any pass changed it (report.html)
    offline_plan: tuple[int, ...] | None = None    # TFLite Micro offsets for every tensor (-1: runtime's)
    whole: bytes | None = None                     # the optimised whole model, serialised by `emit`
    whole_model: Any = None                        # `whole` as read back (read_model), once, for the passes after emit
    partition: Any = None                          # tpu_pipeline.toolchain.partition.Partition (the one written)
    sweep: Any = None                              # -n auto: partition.auto.Sweep (the n = 1..K table)
    compared: tuple = ()                           # (label, Partition) shown beside the written one (--cuts, --profile)
    profile: Any = None                            # --profile: partition.profile.Profile (the measured scale factors)
    cocompile: dict | None = None                  # several models: the co-compilation order for the mix
    segments: tuple[SegmentFile, ...] = ()
    verification: dict | None = None
    edgetpu_compiler: dict | None = None           # what edgetpu_compiler did, when it is on PATH
    extra_files: tuple[tuple[str, bytes], ...] = ()  # (name, bytes) written beside the segments
    notes: tuple[str, ...] = ()
    # the rewrite pass's proven-optimal schedule of `graph` when it left the graph as it was: the
    # schedule pass takes it instead of solving the same problem again
    proven_schedule: Any = None
    # LiteRT's load check of the input, still running (passes/load.confirm_litert collects it)
    litert_check: Any = None
    # --verify: (graph, whole, ChildCall) of the whole-model checks `emit` started (passes/verify.py)
    early_checks: Any = None

    def noted(self, *notes: str) -> tuple[str, ...]:
        return self.notes + tuple(notes)

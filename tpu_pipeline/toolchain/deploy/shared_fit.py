"""Several models fitted for one shared TFLite Micro arena (`fit a.tflite b.tflite --device D`).

    s = fit_shared([path_a, path_b], params)      # FitParams of one fit: budget or device, kernels, ...
    s.fitted[i].data, s.arena.total, s.latency_s, s.to_json()

The models run one at a time on one allocator (shared_arena.py): the arena is the largest head
plus the stacked tails. The budget counts that shared figure, and the objective is the least
total predicted latency: the sum of the models' latencies, each run once (one at a time, so a
round that runs every model once takes the sum).

How: a shared head H. Every model gets fit's fastest variant whose head is at most H (a head
below the largest costs nothing in the shared figure, and a larger H never slows a model), so
the best H is the largest whose shared arena fits: H starts at the whole budget; after each round the models are written and their shared arena
computed exactly as `profile A B` and `export-mcu A B --library` compute it, and H moves by what
the arena missed or left over (fitted tails differ from the tails as is), keeping the fastest
round that fits. For fixed tails this is exact; a faster variant with a larger tail may leave a
slower joint choice with a smaller tail unexplored.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from tpu_pipeline.toolchain.deploy.banks import Placement, capacities, firmware_reserve, place
from tpu_pipeline.toolchain.deploy.shared_arena import SharedArena, plan_shared
from tpu_pipeline.toolchain.device import Device, KernelSet
from tpu_pipeline.toolchain.errors import InfeasibleError, UsageError
from tpu_pipeline.toolchain.fit.model import FittedModel, fit_file
from tpu_pipeline.toolchain.fit.params import FitParams

OBJECTIVE = "least total predicted latency (the sum over the models, each run once), shared arena within the budget"
MAX_ROUNDS = 6  # rounds of fitting every model to a shared head


@dataclass(frozen=True)
class SharedFit:
    paths: tuple[str, ...]
    fitted: tuple[FittedModel, ...]
    arena: SharedArena  # from the written models, as profile and export-mcu --library compute it
    budget: int
    budget_from: str
    placement: Placement | None  # --device: the bank that holds the shared arena
    choices_realised: int  # rounds of fitting every model
    notes: tuple[str, ...]

    @property
    def latency_s(self) -> float:
        return sum(f.result.selection.latency_s for f in self.fitted)

    def to_json(self) -> dict:
        a = self.arena
        return {"objective": OBJECTIVE, "budget_bytes": self.budget, "budget_from": self.budget_from,
                "fits": a.total <= self.budget, **a.to_json(),
                "latency_s_predicted_total": self.latency_s,
                "baseline_latency_s_predicted_total": sum(f.result.baseline_latency_s for f in self.fitted),
                "rounds": self.choices_realised,
                "banks": self.placement.to_json() if self.placement is not None else None,
                "arena_placement": None if self.placement is None else self.placement.head_bank,
                "notes": list(self.notes),
                "models": [_model_json(p, f, h, t) for p, f, h, t in zip(self.paths, self.fitted, a.heads, a.tails)]}


def _model_json(path: str, f: FittedModel, head: int, tail: int) -> dict:
    r = f.result
    return {"model": path, "arena_head_predicted": head, "arena_tail_predicted": tail,
            "arena_bytes_predicted": head + tail, "latency_s_predicted": r.selection.latency_s,
            "baseline_latency_s_predicted": r.baseline_latency_s, "baseline_peak_bytes": r.baseline_peak,
            "ops": len(r.graph.ops), "custom_ops": f.to_json()["custom_ops"],
            "variants": [v.label for v in r.selection.variants if v.kind != "as-is"],
            "verification": [v.to_json() for v in f.verification]}


def shared_budget(params: FitParams) -> tuple[int, str, int | None]:
    """(budget, where it came from, the firmware's reserve or None): --budget, or the largest
    bank's room for a whole arena (a shared arena is one buffer: the library's tpup_shared_init)."""
    if params.budget is not None:
        return params.budget, "--budget", None
    dev = params.device
    if dev is None or dev.kind != "mcu":
        raise UsageError("fit of several models needs --budget BYTES or --device NAME of an MCU")
    reserve = firmware_reserve(dev)
    return max(cap for _, cap in capacities(dev.memory.banks, reserve)), dev.label, reserve


def fit_shared(paths, params: FitParams, progress=None, board: Device | None = None) -> SharedFit:
    """Fit every model for one shared arena within `params`' budget (or its device's) at the least
    total predicted latency (module docstring). `board`: whose export plans the written models
    (default `params.device`). InfeasibleError when no round fits."""
    if params.head_only or params.objective != "latency":
        raise UsageError("fit of several models: the budget counts the whole shared arena at the least "
                         "latency (no --head-only, no --objective memory)")
    paths = [str(p) for p in paths]
    budget, budget_from, reserve = shared_budget(params)
    head = budget  # no tail yet: the first round's written tails say how much head is left
    best, tried, seen = None, 0, set()
    while tried < MAX_ROUNDS and head > 0 and head not in seen:
        seen.add(head)
        tried += 1
        fitted = tuple(fit_file(p, replace(params, budget=head, head_only=True), _labelled(progress, p))
                       for p in paths)
        short = [f.result.head - head for f in fitted if not f.result.fits]
        if short:  # a plan above the selection's peak (the planner's time limit): ask for less head
            head -= max(short)
            continue
        arena = _written_arena(fitted, params.kernels, board or params.device)
        if arena.total <= budget and (best is None or _latency(fitted) < _latency(best[0])):
            best = (fitted, arena)
        if arena.total <= budget and all(_fastest(f) for f in fitted):
            break  # every model as fast as it gets: more head buys nothing
        head += budget - arena.total
    if best is None:
        raise InfeasibleError(f"no joint choice of variants fits {budget:,} B of shared arena ({tried} rounds; "
                              f"the last asked every head to stay within {head:,} B)")
    return _result(paths, *best, budget, budget_from, reserve, params, tried)


def _fastest(f: FittedModel) -> bool:
    return f.result.selection.latency_s <= f.result.baseline_latency_s * (1 + 1e-9)


def _latency(fitted) -> float:
    return sum(f.result.selection.latency_s for f in fitted)


def _written_arena(fitted, kernels: KernelSet, device: Device) -> SharedArena:
    """The shared arena of the fitted models as written, planned as export-mcu plans them."""
    with tempfile.TemporaryDirectory(prefix="tpup-fit-shared-") as tmp:
        files = []
        for i, f in enumerate(fitted):
            files.append(os.path.join(tmp, f"m{i}.tflite"))
            Path(files[-1]).write_bytes(f.data)
        return plan_shared(files, device, kernels)


def _result(paths, fitted, arena: SharedArena, budget, budget_from, reserve, params: FitParams, tried) -> SharedFit:
    notes = [f"objective: {OBJECTIVE}"]
    placement = None
    if reserve is not None:
        placement = place(arena.head, arena.tail, params.device.memory.banks, reserve, split_tail=arena.total + 1)
        if placement is not None and len(params.device.memory.banks) > 1:
            notes.append(f"banks: shared {placement.describe()}")
    return SharedFit(tuple(paths), fitted, arena, budget, budget_from, placement, tried, tuple(notes))


def _labelled(progress, path: str):
    if progress is None:
        return None
    name = Path(path).name
    return lambda msg: progress(f"{name}: {msg}")

"""Make the model's TFLite Micro arena head fit `--budget` at the least predicted latency
(tpu_pipeline.toolchain.fit: patch-based execution chosen by TASO's selection). Runs instead of `rewrite`
when a budget is given; the passes after it schedule and plan the fitted graph under TFLite
Micro's semantics, and `--verify` checks it against the input in LiteRT and TFLite Micro."""

from __future__ import annotations

import dataclasses

from tpu_pipeline.toolchain.budget import Deadline
from tpu_pipeline.toolchain.compile.state import CompileState, PassRecord
from tpu_pipeline.toolchain.device import REFERENCE
from tpu_pipeline.toolchain.errors import InfeasibleError

# The passes after it plan for the reference kernels (the host's TFLite Micro), and a compiled model
# must run anywhere: no harness-only kernel variants (tpu_pipeline.toolchain.ir.kernels). Variants are
# priced with the emulated MCU's model (CompileOptions.fit_cost_device).
KERNELS = REFERENCE


def fit(state: CompileState, allowed: float) -> tuple[CompileState, PassRecord]:
    from tpu_pipeline.toolchain.fit import FitParams, run_fit  # CP-SAT (and pandas, ~0.5 s): only with --budget

    budget = state.options.budget
    cost_device = state.options.fit_cost_device
    params = FitParams(budget=budget, kernels=KERNELS, harness=False, head_only=True)
    r = run_fit(state.graph, params, cost_device, deadline=Deadline(allowed))
    if not r.fits:
        raise InfeasibleError(f"{state.options.label}: no variant fits {budget:,} B of TFLite Micro arena head; "
                              f"the smallest reachable is {r.head:,} B")
    detail = {k: v for k, v in r.to_json().items() if k not in ("frontier",)}
    detail["cost_device"] = cost_device.name
    changed = len(r.graph.ops) != len(state.graph.ops)
    state = dataclasses.replace(state, graph=r.graph)
    return state, PassRecord("fit", "ran" if changed else "no gain", 0.0, detail)

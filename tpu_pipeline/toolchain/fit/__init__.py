"""`fit`: make a model fit a memory budget at the least predicted latency (issue 12; docs/fit.md).

spans.py cuts the graph into spans, variants.py prices each way to run a run of spans, select.py
is TASO's selection as a CP-SAT model (peak as a maximum), fit.py applies, schedules and plans,
model.py works on files (budgets from devices, the written model checked in both runtimes)."""

from tpu_pipeline.toolchain.fit.fit import OBJECTIVES, FitResult, fit_graph
from tpu_pipeline.toolchain.fit.model import FittedModel, fit_model

__all__ = ["OBJECTIVES", "FitResult", "FittedModel", "fit_graph", "fit_model"]

"""`fit`: make a model fit a memory budget at the least predicted latency (issue 12; docs/fit.md).

params.py is every switch (FitParams); spans.py cuts the graph into spans, variants.py prices each
way to run a run of spans, pool.py builds them lazily, select.py is TASO's selection as a CP-SAT
model (peak as a maximum), search.py asks it (smallest, fastest, frontier), realise.py applies,
schedules and plans; stages/ is the stage list fit.py runs on the pass driver; model.py works on
files (budgets from devices, the written model checked in both runtimes)."""

from tpu_pipeline.toolchain.fit.fit import FitResult, fit_graph, run_fit
from tpu_pipeline.toolchain.fit.model import FittedModel, fit_file, fit_model
from tpu_pipeline.toolchain.fit.params import OBJECTIVES, FitParams

__all__ = ["OBJECTIVES", "FitParams", "FitResult", "FittedModel", "fit_file", "fit_graph", "fit_model", "run_fit"]

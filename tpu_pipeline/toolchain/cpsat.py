"""Every CP-SAT solver of the toolchain is made here, so all of them behave alike:

- a fixed seed and a fixed number of workers, so the same input gives the same answer when the
  search finishes (a search stopped by its time limit can still depend on machine load);
- CP-SAT's own SIGINT handler off: it would swallow Ctrl-C and let the run go on. Instead the
  solver is registered with `tpu_pipeline.toolchain.interrupts`, which stops it when an interrupt arrives.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from tpu_pipeline.toolchain import interrupts


def new_solver(time_limit: float, workers: int = 1, seed: int = 0) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, float(time_limit))
    solver.parameters.num_workers = max(1, int(workers))
    solver.parameters.random_seed = int(seed)
    solver.parameters.catch_sigint_signal = False
    interrupts.register_solver(solver)
    return solver

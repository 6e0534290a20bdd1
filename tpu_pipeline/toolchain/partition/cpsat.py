"""The exact partitioner in CP-SAT: the paper's SDC + ILP model, solved lexicographically. Used for the
paper's strategies, for `--colocate`, and for `latency` on graphs with too many down-sets for
lattice.py's DP (which solves `latency` exactly and faster wherever it applies).

Variables (n stages): y[v][k] = (stage(v) <= k) for k < n-1, monotone in k; x[v][k] = (stage(v) == k)
= y[v][k] - y[v][k-1]. Precedence u -> v: y[v][k] <= y[u][k] (the SDC s_u - s_v <= 0 in unary
form). Every stage non-empty. Sinks, graph outputs' producers and all that follows them are in the
last stage (Coral's runner returns the last segment's outputs).

Per stage k: parameter bytes m_k = sum p_v x[v][k]; off-chip bytes o_k >= m_k - SRAM, o_k >= 0;
traffic: a boundary tensor t enters stage k iff a consumer is in k and its producer is not,
z[t][k] >= x[c][k] - x[p][k] (graph inputs: z >= x[c][k]); it leaves its producer's stage k iff a
consumer is not in k, w[t][k] >= x[p][k] - x[c][k]. Only lower bounds are needed: every objective
is minimised and increasing in o, z, w.

Objectives: (1) max_k m_k, (2) sum_k o_k, (3) max_k (in_k + out_k) -- the paper's three --
and `latency`: the period bound P = max(max_k stage latency, shared-link term, host term) with
stage latency = overhead + (max(compute, stream) or compute + stream) + traffic, the link term
= (sum_k o_k + sum_k (in_k + out_k)) x ps/byte (every stage streams and transfers over the host's
one link) and the host term = n x overhead / host slots; then the sum of stage latencies. P is
exactly the simulator's lower bound (tpu_pipeline/toolchain/cost/pipeline.py); `refine_by_simulation` then
closes the gap to the simulated period itself (see there). Lexicographic strategies solve one objective, bound it by the
value found, hint the solution and solve the next.
"""

from __future__ import annotations

import math
import time

from ortools.sat.python import cp_model

from tpu_pipeline.toolchain.cpsat import new_solver
from tpu_pipeline.toolchain.errors import InfeasibleError
from tpu_pipeline.toolchain.partition.problem import PartitionProblem
from tpu_pipeline.toolchain.partition.search import STRATEGIES, Refined, SolveResult

_EXTRA_PARAMS: dict = {}

# Reproducibility. CP-SAT's parallel portfolio returns whichever worker's solution arrives first
# (even among proven optima), and a wall-clock limit stops the search at a point that depends on
# the machine's load, so the same model could give other segments on the next run. A
# deterministic solve therefore runs one worker (the search is then a pure function of the
# model, the hint, the seed and the parameters) and stops on CP-SAT's deterministic time, a count
# of work done that does not depend on load: DTIME_PER_SECOND units per second of the time
# limit. The wall clock stays a hard cap; a step it stops is marked not reproducible.
# One worker does about 0.25-0.35 units per second on this 2-core machine at load 2-3, and
# 0.04-0.07 when it is loaded 3-5x over (measured). At 0.03 the budget stopped 6 of the 55 paper
# cases (DenseNets, n >= 3) after 1-2 s without a proof; at 0.12 they prove in 2-4 s. On a
# heavily loaded machine the wall clock can now stop a step first: the result says so
# (`reproducible` False), it is never silently different.
DTIME_PER_SECOND = 0.12

# `latency`'s second step (the sum of stage latencies among the periods found) gets at most this
# fraction of the deterministic budget: it shortens the pipeline's latency, not its period.
TIE_BREAK_SHARE = 0.1

def _stage_vars(m, problem: PartitionProblem, n: int, colocate: bool):
    """y[v][k] = stage(v) <= k, x[v][k] = stage(v) == k (ints where fixed), with precedence,
    no empty stage and (`colocate`) consumers of one tensor kept together."""
    N = problem.n_ops
    fixed_last = problem.last_stage_ops
    y = [[None] * (n - 1) for _ in range(N)]
    for v in range(N):
        for k in range(n - 1):
            if v in fixed_last:
                y[v][k] = 0
            else:
                y[v][k] = m.NewBoolVar(f"y{v}_{k}")
        for k in range(n - 2):
            if not isinstance(y[v][k], int):
                m.AddImplication(y[v][k], y[v][k + 1])

    def Y(v, k):  # stage(v) <= k
        if k < 0:
            return 0
        if k >= n - 1:
            return 1
        return y[v][k]

    x = [[None] * n for _ in range(N)]
    for v in range(N):
        for k in range(n):
            a, b = Y(v, k), Y(v, k - 1)
            if isinstance(a, int) and isinstance(b, int):
                x[v][k] = a - b
            else:
                xv = m.NewBoolVar(f"x{v}_{k}")
                m.Add(xv == a - b)
                x[v][k] = xv
    for v in range(N):
        for u in problem.preds[v]:
            for k in range(n - 1):
                a, b = Y(v, k), Y(u, k)
                if isinstance(a, int) or isinstance(b, int):
                    m.Add(a <= b)
                else:
                    m.AddImplication(a, b)
    for k in range(n):
        m.Add(sum(x[v][k] for v in range(N)) >= 1)
    for group in problem.state_groups:  # ops sharing a state tensor run in one segment
        for v in group[1:]:
            for k in range(n - 1):
                m.Add(Y(v, k) == Y(group[0], k))
    if colocate:
        for bt in problem.tensors:
            cons = sorted(set(bt.consumers))
            for c in cons[1:]:
                for k in range(n - 1):
                    m.Add(Y(c, k) == Y(cons[0], k))
    return y, x


def _traffic_terms(m, problem: PartitionProblem, n: int, x):
    """Per stage, the bytes it reads in and writes out (terms of a sum), and the auxiliary
    booleans as (var, kind, producer, consumers, stage) to complete hints."""
    in_terms = [[] for _ in range(n)]
    out_terms = [[] for _ in range(n)]
    aux = []
    for bt in problem.tensors:
        p = bt.producer
        cons = sorted(set(bt.consumers))
        for k in range(n):
            if p is None:
                if not cons:
                    continue
                lits = [x[c][k] for c in cons]
                if all(isinstance(l, int) for l in lits):
                    if max(lits):
                        in_terms[k].append(bt.nbytes)
                    continue
                z = m.NewBoolVar(f"zi{bt.tensor}_{k}")
                for l in lits:
                    m.Add(z >= l)
                aux.append((z, "in", None, cons, k))
                in_terms[k].append(bt.nbytes * z)
                continue
            if k > 0 and cons:
                z = m.NewBoolVar(f"z{bt.tensor}_{k}")
                for c in cons:
                    m.Add(z >= x[c][k] - x[p][k])
                aux.append((z, "in", p, cons, k))
                in_terms[k].append(bt.nbytes * z)
            if bt.graph_output and k == n - 1:
                out_terms[k].append(bt.nbytes)
            elif k < n - 1 and cons:
                w = m.NewBoolVar(f"w{bt.tensor}_{k}")
                for c in cons:
                    m.Add(w >= x[p][k] - x[c][k])
                aux.append((w, "out", p, cons, k))
                out_terms[k].append(bt.nbytes * w)
    return in_terms, out_terms, aux


def _build(problem: PartitionProblem, n: int, colocate: bool):
    m = cp_model.CpModel()
    N = problem.n_ops
    y, x = _stage_vars(m, problem, n, colocate)
    cost = problem.model
    ppb = cost.ps_per_byte
    par = [m.NewIntVar(0, sum(oc.param_bytes for oc in problem.op_costs), f"m{k}") for k in range(n)]
    off = [m.NewIntVar(0, sum(oc.param_bytes for oc in problem.op_costs), f"o{k}") for k in range(n)]
    for k in range(n):
        m.Add(par[k] == sum(problem.op_costs[v].param_bytes * x[v][k] for v in range(N)
                            if problem.op_costs[v].param_bytes))
        m.Add(off[k] >= par[k] - cost.sram_bytes)
    in_terms, out_terms, aux = _traffic_terms(m, problem, n, x)
    total_bytes = sum(bt.nbytes for bt in problem.tensors) * max(1, n)
    comm = []
    for k in range(n):
        c = m.NewIntVar(0, total_bytes, f"comm{k}")
        m.Add(c == sum(in_terms[k]) + sum(out_terms[k]))
        comm.append(c)
    max_comp = sum(oc.compute_ps for oc in problem.op_costs)
    ub_stage = cost.overhead_ps + max_comp + ppb * (sum(oc.param_bytes for oc in problem.op_costs) + total_bytes)
    lat, run = [], []
    for k in range(n):
        lk = m.NewIntVar(0, ub_stage, f"lat{k}")
        comp = sum(problem.op_costs[v].compute_ps * x[v][k] for v in range(N) if problem.op_costs[v].compute_ps)
        rk = m.NewIntVar(0, ub_stage, f"run{k}")  # compute and parameter stream of stage k
        if cost.overlap:
            ck = m.NewIntVar(0, max_comp, f"comp{k}")
            m.Add(ck == comp)
            sk = m.NewIntVar(0, ub_stage, f"stream{k}")
            m.Add(sk == ppb * off[k])
            m.AddMaxEquality(rk, [ck, sk])
        else:
            m.Add(rk == comp + ppb * off[k])
        m.Add(lk == cost.overhead_ps + rk + ppb * comm[k])
        lat.append(lk)
        run.append(rk)
    objs = {}
    objs["max_stage_ps"] = m.NewIntVar(0, ub_stage, "T")
    m.AddMaxEquality(objs["max_stage_ps"], lat)
    # the shared link: every stage's streamed parameters and boundary tensors, one after another.
    # Redundant but tightening: sum_k max(0, m_k - SRAM) >= total parameters - n x SRAM.
    m.Add(sum(off) >= sum(oc.param_bytes for oc in problem.op_costs) - n * cost.sram_bytes)
    link = m.NewIntVar(0, ub_stage * n, "link")
    m.Add(link == ppb * (sum(off) + sum(comm)))
    host = -(-n * cost.overhead_ps // cost.host_slots) if cost.host_slots else 0
    objs["period_ps"] = m.NewIntVar(0, ub_stage * n, "P")
    m.AddMaxEquality(objs["period_ps"], [*lat, link, host])
    # redundant, for the LP bound: the slowest stage is at least the average stage
    m.Add(n * objs["period_ps"] >= sum(lat))
    objs["sum_stage_ps"] = m.NewIntVar(0, ub_stage * n, "S")
    m.Add(objs["sum_stage_ps"] == sum(lat))
    objs["max_param_bytes"] = m.NewIntVar(0, sum(oc.param_bytes for oc in problem.op_costs), "M")
    m.AddMaxEquality(objs["max_param_bytes"], par)
    objs["offchip_bytes"] = m.NewIntVar(0, n * sum(oc.param_bytes for oc in problem.op_costs), "D")
    m.Add(objs["offchip_bytes"] == sum(off))
    objs["max_comm_bytes"] = m.NewIntVar(0, total_bytes, "C")
    m.AddMaxEquality(objs["max_comm_bytes"], comm)
    return m, y, x, objs, {"aux": aux, "par": par, "off": off, "comm": comm, "lat": lat, "run": run, "link": link}


def _set_hint(model, problem: PartitionProblem, n: int, y, x, objs, extra, stages) -> None:
    """A complete hint: every variable's value under `stages` (CP-SAT then starts from a
    full feasible solution instead of repairing a partial one)."""
    model.ClearHints()
    for v in range(problem.n_ops):
        for k in range(n - 1):
            if not isinstance(y[v][k], int):
                model.AddHint(y[v][k], 1 if stages[v] <= k else 0)
        for k in range(n):
            if not isinstance(x[v][k], int) and hasattr(x[v][k], "Index"):
                model.AddHint(x[v][k], 1 if stages[v] == k else 0)
    for var, kind, p, cons, k in extra["aux"]:
        if kind == "in":
            val = any(stages[c] == k for c in cons) and (p is None or stages[p] != k)
        else:
            val = stages[p] == k and any(stages[c] != k for c in cons)
        model.AddHint(var, int(val))
    sc = problem.stage_costs(stages, n)
    for k in range(n):
        model.AddHint(extra["par"][k], sc[k].param_bytes)
        model.AddHint(extra["off"][k], sc[k].offchip_bytes)
        model.AddHint(extra["comm"][k], sc[k].in_bytes + sc[k].out_bytes)
        model.AddHint(extra["lat"][k], sc[k].latency_ps)
        model.AddHint(extra["run"][k], sc[k].latency_ps - problem.model.overhead_ps - sc[k].transfer_ps)
    model.AddHint(extra["link"], sum(s.link_ps for s in sc))
    o = problem.objectives(stages, n)
    for name, var in objs.items():
        model.AddHint(var, o[name])


def _step_solver(deterministic: bool, remaining: float, frac: float, dshare: float, workers: int, seed: int,
                 gap: float = 0.0):
    """The solver for one step: `dshare` deterministic time on one worker (the wall clock only a
    cap), or `workers` racing for `frac` of the wall-clock time left. `gap`: stop as soon as the
    objective is within this fraction of CP-SAT's proven bound."""
    if deterministic:
        solver = new_solver(max(0.05, remaining), 1, seed)
        solver.parameters.max_deterministic_time = dshare
    else:
        solver = new_solver(max(0.05, remaining * frac), workers, seed)
    # probing in presolve costs seconds on 300+ op graphs and rarely pays off here
    solver.parameters.cp_model_probing_level = 0
    if gap > 0:
        solver.parameters.relative_gap_limit = gap
    for key, value in _EXTRA_PARAMS.items():
        setattr(solver.parameters, key, value)
    return solver


def _proven_bound(st, solver, value: int) -> int:
    """CP-SAT's lower bound of the objective, as an integer: the value itself when it is proven
    optimal (CP-SAT's float bound can sit a hair below it)."""
    bound = math.ceil(solver.BestObjectiveBound() - 1e-6)
    return value if st == cp_model.OPTIMAL and bound >= value - 1 else min(bound, value)


def _stop_reason(st, solver, deterministic: bool, dshare: float, value: int | None = None) -> str:
    if st == cp_model.OPTIMAL:
        # CP-SAT also says OPTIMAL when it stopped at relative_gap_limit: then the bound is below
        if value is not None and _proven_bound(st, solver, value) < value:
            return "within gap"
        return "optimal"
    if st == cp_model.INFEASIBLE:
        return "infeasible"
    if deterministic and solver.deterministic_time >= dshare * 0.999:
        return "deterministic limit"
    return "wall clock"


def solve(problem: PartitionProblem, n: int, strategy: str = "latency", time_limit: float = 10.0,
          hint=None, upper_bounds: dict | None = None, colocate: bool = False, workers: int = 2,
          seed: int = 0, deterministic: bool = True, gap: float = 0.0) -> SolveResult:
    """Solve the strategy's objectives in turn; `hint` is a stage tuple, `upper_bounds` caps
    objectives (e.g. the heuristic's values). Raises InfeasibleError if no assignment exists.
    `gap`: a step stops when its objective is within this fraction of its proven bound (0: when
    it is proven optimal); `bounds` holds each step's proven bound either way.

    `deterministic` (default): one worker, budgets in deterministic time (see DTIME_PER_SECOND),
    the wall clock only as a cap, so the same inputs give the same stages however loaded the
    machine is, unless the wall clock stops a step (then `reproducible` is False). Otherwise
    `workers` workers race under the wall clock (faster, not reproducible)."""
    t0 = time.perf_counter()
    N = problem.n_ops
    if n == 1:
        stages = tuple([0] * N)
        obj = problem.objectives(stages, 1)
        return SolveResult(stages, obj, dict(obj), True, time.perf_counter() - t0, "OPTIMAL", (True,), ("optimal",))
    model, y, x, objs, extra = _build(problem, n, colocate)
    for name, ub in (upper_bounds or {}).items():
        model.Add(objs[name] <= ub)
    steps = STRATEGIES[strategy]
    best = None
    bounds = {}
    proven = True
    status_name = "OPTIMAL"
    steps_proven: list[bool] = []

    if hint is not None:
        _set_hint(model, problem, n, y, x, objs, extra, hint)
    stopped: list[str] = []
    dtime_left = time_limit * DTIME_PER_SECOND
    for i, name in enumerate(steps):
        remaining = time_limit - (time.perf_counter() - t0)
        # the first objective is what the strategy is about; later ones are tie-breaks
        frac = 1.0 if i == len(steps) - 1 else (0.75 if i == 0 else 0.5)
        dshare = max(1e-3, dtime_left * frac)
        if strategy == "latency" and i > 0:  # the sum of stage latencies only breaks ties of the period
            dshare = min(dshare, TIE_BREAK_SHARE * time_limit * DTIME_PER_SECOND)
        solver = _step_solver(deterministic, remaining, frac, dshare, workers, seed, gap)
        model.Minimize(objs[name])
        st = solver.Solve(model)
        found = int(solver.Value(objs[name])) if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
        stopped.append(_stop_reason(st, solver, deterministic, dshare, found))
        if deterministic:
            dtime_left = max(0.0, dtime_left - solver.deterministic_time)
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if best is None and hint is not None and not colocate and st != cp_model.INFEASIBLE:
                best = tuple(hint)  # the (valid) hint is the best known
            if best is None:
                if st == cp_model.INFEASIBLE:
                    raise InfeasibleError(f"no partition into {n} segments satisfies the constraints"
                                          + (" (consumers co-located)" if colocate else ""))
                raise InfeasibleError(f"no partition into {n} segments found within {time_limit:g} s")
            proven = False
            status_name = "FEASIBLE"
            steps_proven.append(False)
            break
        stages = tuple(sum(1 for k in range(n - 1) if not (int(solver.Value(y[v][k])) if not isinstance(y[v][k], int) else y[v][k]))
                       for v in range(N))
        val = found
        # an integer objective: a proven optimum is its own bound; else round the float bound up
        bounds[name] = _proven_bound(st, solver, val)
        steps_proven.append(bounds[name] >= val)
        if bounds[name] < val:
            proven = False
            status_name = "FEASIBLE"
        best = stages
        model.Add(objs[name] <= val)
        _set_hint(model, problem, n, y, x, objs, extra, stages)
    obj = problem.objectives(best, n)
    steps_proven += [False] * (len(steps) - len(steps_proven))
    reproducible = deterministic and "wall clock" not in stopped
    return SolveResult(best, obj, bounds, proven, time.perf_counter() - t0, status_name, tuple(steps_proven),
                       tuple(stopped), reproducible)


def _no_good(m, y, stages, n: int) -> None:
    """Exclude exactly this assignment: at least one y[v][k] must differ from its value."""
    lits = [y[v][k].Not() if stages[v] <= k else y[v][k]
            for v in range(len(y)) for k in range(n - 1) if not isinstance(y[v][k], int)]
    if lits:
        m.AddBoolOr(lits)


def refine_by_simulation(problem: PartitionProblem, n: int, stages, bound_ps: int, time_limit: float,
                         max_candidates: int = 500, colocate: bool = False, seed: int = 0,
                         wall_s: float | None = None, gap: float = 0.0) -> Refined:
    """Close the gap between the bound P the CP-SAT model minimises and the simulated period S.

    S >= P for every assignment (each resource serves at most one second of work per second), so
    an assignment can only beat the incumbent's S* if its P < S*. Repeatedly ask CP-SAT for an
    assignment of small P below S* that was not simulated yet (a no-good cut excludes each one
    simulated), simulate it, keep it if its S is smaller. When CP-SAT proves that no assignment
    with P < S* is left, the incumbent is optimal for the simulator itself. `bound_ps` is a
    proven lower bound of P (so of every S); CP-SAT's bound on each search raises it (every
    assignment not yet simulated has at least that P, every simulated one has S >= S*), so a stop
    before the proof still gives min(S*, bound) as a lower bound of the simulator's optimum.

    Stops at the proof, as soon as S* is within `gap` (a fraction) of that lower bound, or when
    the deterministic budget is spent. The searches start from `bound_ps` (a valid cut). One
    worker, deterministic time."""
    best = tuple(stages)
    best_s = problem.period_ps(best, n)
    if best_s <= bound_ps * (1 + gap):
        proven = best_s <= bound_ps
        return Refined(best, best_s, proven, 1, bound_ps if best_s > bound_ps else best_s,
                       stopped_by="proven" if proven else "within gap")
    m, y, x, objs, extra = _build(problem, n, colocate)
    period = objs["period_ps"]
    if bound_ps:
        m.Add(period >= bound_ps)  # proven: no assignment is below it
    seen = 1
    _no_good(m, y, best, n)
    t0 = time.perf_counter()
    dtime = max(1e-3, time_limit * DTIME_PER_SECOND)
    proven = wall = False
    why = "candidates"
    wall_s = time_limit if wall_s is None else wall_s
    while seen < max_candidates:
        m.Add(period <= best_s - 1)
        m.Minimize(period)
        left = wall_s - (time.perf_counter() - t0)
        if left <= 0:
            wall, why = True, "wall clock"
            break
        # each candidate the smallest P left (no hint, no tolerance: a hint near the incumbent
        # steers the search to assignments of about its simulated period, measured worse)
        solver = _step_solver(True, left, 1.0, dtime, 1, seed)
        st = solver.Solve(m)
        given, dtime = dtime, max(1e-3, dtime - solver.deterministic_time)
        if st == cp_model.INFEASIBLE:
            proven, why = True, "proven"
            break
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            why = _stop_reason(st, solver, True, given)
            wall = why == "wall clock"
            break
        cand = tuple(sum(1 for k in range(n - 1) if not (y[v][k] if isinstance(y[v][k], int) else solver.Value(y[v][k])))
                     for v in range(problem.n_ops))
        if bound_ps:
            bound_ps = max(bound_ps, _proven_bound(st, solver, int(solver.Value(period))))
        seen += 1
        s = problem.period_ps(cand, n)
        if s < best_s:
            best, best_s = cand, s
        _no_good(m, y, cand, n)
        if bound_ps and best_s <= bound_ps * (1 + gap):
            proven = best_s <= bound_ps  # the bound reached: nothing is below it
            why = "proven" if proven else "within gap"
            break  # within the tolerance of a proven bound
        if solver.deterministic_time >= given * 0.999:
            why = "deterministic limit"
            break  # the deterministic budget is spent: stop here on every machine alike
    low = best_s if proven and bound_ps else (min(best_s, bound_ps) if bound_ps else 0)
    return Refined(best, best_s, proven, seen, low, wall, why)

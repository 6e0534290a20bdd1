"""Edge TPU pipeline segments: the exact stage assignment, with Coral's heuristic as the baseline.

`-n auto` partitions every n from 1 to --max-n on one problem and keeps the chosen n
(partition/auto.py); `--cuts` writes the user's cut points, checked, with ours and Coral's beside
them (partition/cuts.py); `--profile` scales each op's compute by its stage's measured /
predicted time before the search (partition/profile.py).
"""

from __future__ import annotations

import dataclasses

from tpu_pipeline.toolchain.compile.state import CompileState, PassRecord
from tpu_pipeline.toolchain.cost.edgetpu import EdgeTpuCostModel
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.partition import PartitionProblem, evaluated_partition, profiled_partition
from tpu_pipeline.toolchain.partition import partition as partition_graph


def partition(state: CompileState, allowed: float) -> tuple[CompileState, PassRecord]:
    o, graph = state.options, state.graph
    problem = PartitionProblem(graph, EdgeTpuCostModel(o.device))
    profile, notes = None, []
    if o.profile is not None:
        from tpu_pipeline.toolchain.partition.profile import read_profile

        profile = read_profile(o.profile, graph, [oc.compute_ps for oc in problem.op_costs])
        problem = problem.scaled(profile.op_factors)
        notes.append(_profile_note(profile))

    def run(n: int, limit: float, prune_above_ps: int | None = None):
        return partition_graph(graph, n, device=o.device, strategy=o.strategy, time_limit=limit, colocate=o.colocate,
                               workers=o.workers, label=o.label, gap=o.gap, problem=problem,
                               prune_above_ps=prune_above_ps, measured=profile is not None)

    sweep, compared = None, ()
    if o.cuts is not None:
        part, compared = _user_cuts(state, problem, run, allowed)
    elif o.n is None:
        from tpu_pipeline.toolchain.partition.auto import sweep as sweep_n

        sweep, part = sweep_n(graph, problem, o.max_n, o.knee, allowed, run)
    else:
        part = run(o.n, allowed)
    if profile is not None:
        compared = _profile_comparison(graph, problem, profile, part, o.device)
    cocompile = _cocompile(state, part.n, allowed) if len(o.paths) > 1 else None
    state = dataclasses.replace(state, partition=part, sweep=sweep, compared=compared, profile=profile,
                                cocompile=cocompile, notes=state.noted(*notes))
    detail = {"strategy": part.strategy, "proven_optimal": part.proven_optimal, "n": part.n}
    if sweep is not None:
        detail["n_chosen"] = sweep.n_chosen
    return state, PassRecord("partition", "ran", 0.0, detail)


def _user_cuts(state: CompileState, problem: PartitionProblem, run, allowed: float):
    """The user's partition (written), and ours and Coral's at the same n for the report."""
    from tpu_pipeline.toolchain.partition.cuts import user_stages

    o = state.options
    n = len(o.cuts) + 1
    if o.n is not None and o.n != n:
        raise UsageError(f"--cuts gives {n - 1} cut point(s), i.e. {n} segments, but -n is {o.n}")
    problem.check_n(n, o.label)
    stages = user_stages(problem, state.loaded, o.cuts, o.colocate)
    ours = run(n, allowed)
    user = evaluated_partition(problem, stages, n, "user", baseline=ours.baseline)
    return user, (("ours", ours), ("coral", ours.baseline))


def _profile_comparison(graph, problem, profile, part, device) -> tuple:
    """The partition that was profiled and libcoral's profiling partitioner, under the profile."""
    out = []
    if profile.unmatched_ops == 0 and problem.is_valid(profile.op_stages, max(profile.op_stages) + 1):
        n_prof = max(profile.op_stages) + 1
        out.append(("profiled", evaluated_partition(problem, profile.op_stages, n_prof, "profiled")))
    out.append(("libcoral-profiling", profiled_partition(graph, part.n, device, problem)))
    return tuple(out)


def _cocompile(state: CompileState, n: int, allowed: float) -> dict:
    """Each model partitioned into n segments on its own; every order of the models scored for the mix."""
    from tpu_pipeline.toolchain.loader import load
    from tpu_pipeline.toolchain.partition.cocompile import order_costs, parse_mix

    o = state.options
    labels = [p.stem for p in o.paths]
    mix = parse_mix(o.mix, labels)
    parts = {}
    for label, path in zip(labels, o.paths):
        graph = load(path)[1]
        problem = PartitionProblem(graph, EdgeTpuCostModel(o.device))
        k = min(n, problem.max_stages())
        p = partition_graph(graph, k, device=o.device, time_limit=max(0.5, allowed / len(labels)), label=str(path),
                            gap=o.gap, problem=problem)
        parts[label] = (problem, p.stages)
    rows = order_costs(parts, mix)
    return {"mix": mix, "order": rows[0]["order"], "orders": rows,
            "objective": "the mix's mean period: sum of weight x period / sum of weights (each model alone on the "
                         "TPUs, with the caches its place in the order leaves it)"}


def _profile_note(profile) -> str:
    how = ("relative speeds only (emulator: host CPU times, divided by their geometric mean)" if profile.relative
           else "as measured")
    factors = ", ".join(f"x{f:.2f}" for f in profile.stage_factors)
    unmatched = f"; {profile.unmatched_ops} op(s) not found in the profiled segments kept their prediction" \
        if profile.unmatched_ops else ""
    return (f"--profile {profile.source}: each stage's op compute scaled so that the cost model gives the stage "
            f"its measured time ({how}; compute factors {factors}){unmatched}; the predictions below are under "
            f"that profile")

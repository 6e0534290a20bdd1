"""Off-chip streaming explained: which ops' parameters each segment streams, and what would
bring the segment on chip.

The caching order assumed is the segment's execution order (the order of its `operators`
vector): the Edge TPU compiler's documentation describes parameters being cached on chip until the
on-chip memory runs out and the rest streamed from the host on every inference, and co-compiled
models cached in the order they are given. FACTS.md records no finer rule, so this is an
assumption: the byte counts (cached = min(parameters, usable SRAM)) are the cost model's, only the
ops named as streaming depend on it.
"""

from __future__ import annotations

from tpu_pipeline.toolchain.partition.problem import PartitionProblem


def _streaming(problem: PartitionProblem, ops) -> tuple[int | None, list[dict]]:
    """(the op at which the cache ran out, the ops that stream with their streamed bytes)."""
    g, sram = problem.graph, problem.model.sram_bytes
    used, full_at, out = 0, None, []
    for v in ops:
        pb = problem.op_costs[v].param_bytes
        if not pb:
            continue
        kept = max(0, min(pb, sram - used))
        used += kept
        if kept < pb:
            full_at = v if full_at is None else full_at
            out.append({"op": v, "opcode": g.ops[v].opcode, "tensor": _name(g, v), "parameter_bytes": pb,
                        "streamed_bytes": pb - kept})
    return full_at, out


def _name(g, v) -> str:
    outs = [t for t in g.ops[v].outputs if t >= 0]
    return g.tensors[outs[0]].name if outs else ""


def fewest_tpus_on_chip(problem: PartitionProblem) -> int | None:
    """The fewest segments that cache every parameter when the op order is cut into contiguous
    runs (greedy, exact for that order); None when one op alone exceeds the cache."""
    sram, count, used = problem.model.sram_bytes, 1, 0
    for oc in problem.op_costs:
        if oc.param_bytes > sram:
            return None
        if used + oc.param_bytes > sram:
            count, used = count + 1, 0
        used += oc.param_bytes
    return count


def _move_suffix(problem: PartitionProblem, stages, n: int, k: int, need: int):
    """The shortest run of segment k's last ops whose parameters cover `need` bytes and may move to
    segment k+1 (a valid pipeline), as (ops, stages after the move); None when there is none."""
    ops = [v for v in range(problem.n_ops) if stages[v] == k]
    moved, total = [], 0
    for v in reversed(ops[1:]):
        moved.insert(0, v)
        total += problem.op_costs[v].param_bytes
        if total >= need:
            trial = list(stages)
            for u in moved:
                trial[u] = k + 1
            if problem.is_valid(trial, n):
                return moved, trial
    return None


def explain(problem: PartitionProblem, stages, n: int) -> list[dict]:
    """Per segment: cached and streamed bytes, the streaming ops in caching order, the byte at
    which the cache ran out, and one sentence on what would bring it on chip."""
    sram = problem.model.sram_bytes
    costs = problem.stage_costs(stages, n)
    fewest = fewest_tpus_on_chip(problem)
    out = []
    for k, sc in enumerate(costs):
        ops = [v for v in range(problem.n_ops) if stages[v] == k]
        full_at, streaming = _streaming(problem, ops)
        entry = {"index": k, "cache_bytes": sram, "parameter_bytes": sc.param_bytes, "cached_bytes": sc.sram_bytes,
                 "streamed_bytes": sc.offchip_bytes, "cache_full_at_op": full_at,
                 "cache_full_at_byte": sc.sram_bytes if sc.offchip_bytes else None, "streamed_ops": streaming}
        entry["advice"], entry["move_to_next"] = _advice(problem, stages, n, k, sc, full_at, fewest)
        out.append(entry)
    return out


def _advice(problem, stages, n, k, sc, full_at, fewest) -> tuple[str, list[int] | None]:
    """One sentence, and the ops to move to the next segment when that is the advice."""
    g, sram = problem.graph, problem.model.sram_bytes
    if not sc.offchip_bytes:
        return (f"segment {k}: all {sc.param_bytes:,} B of parameters are cached on chip "
                f"({sram - sc.param_bytes:,} B free)"), None
    big = next((v for v in range(problem.n_ops) if stages[v] == k and problem.op_costs[v].param_bytes > sram), None)
    if big is not None:
        return (f"segment {k}: op {big} ({g.ops[big].opcode}) alone has {problem.op_costs[big].param_bytes:,} B of "
                f"parameters, more than the {sram:,} B cache: it streams on any number of TPUs"), None
    head = f"segment {k} streams {sc.offchip_bytes:,} B from op {full_at} ({g.ops[full_at].opcode}) on"
    if k < n - 1:
        move = _move_suffix(problem, stages, n, k, sc.offchip_bytes)
        if move is not None:
            ops, trial = move
            nxt = problem.stage_costs(trial, n)[k + 1]
            what = f"op {ops[0]}" if len(ops) == 1 else f"ops {ops[0]}..{ops[-1]} ({len(ops)} ops)"
            if not nxt.offchip_bytes:
                return (f"{head}; moving {what} to segment {k + 1} brings it on chip (segment {k + 1} then caches "
                        f"{nxt.param_bytes:,} of {sram:,} B)"), ops
    if fewest is not None and fewest > n:
        return (f"{head}; {fewest - n} more TPU(s) ({fewest} along the op order) would cache every parameter of "
                f"the model"), None
    if fewest is not None:
        return (f"{head}; one more TPU, or a split that spreads the parameters ({fewest} TPUs can cache them all "
                f"along the op order), brings it on chip"), None
    return f"{head}; no split brings every parameter on chip", None


__all__ = ["explain", "fewest_tpus_on_chip"]

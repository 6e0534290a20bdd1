"""Optimal contiguous partition of a fixed topological order (dynamic programming).

Cutting one topological order into n consecutive ranges is what Coral's partitioner does; for a
fixed order the best such cut under the cost model (minimise the slowest stage) is found exactly by
DP over a matrix of range costs. The result is a strong warm start and upper bound for the CP-SAT
model, which searches all precedence-respecting assignments (not only contiguous ones).
"""

from __future__ import annotations

import numpy as np

from tpu_pipeline.toolchain.partition.problem import PartitionProblem

MAX_OPS = 3000  # the range-cost matrix is (ops+1)^2 int64


def range_costs(problem: PartitionProblem, order) -> np.ndarray:
    """C[i, j] = latency (ps) of one stage holding order[i:j]; inf-like where j <= i."""
    N = problem.n_ops
    pos = {v: k for k, v in enumerate(order)}
    D = np.zeros((N + 2, N + 2), dtype=np.int64)  # 2D difference array over (i, j)

    def rect(i0, i1, j0, j1, s):  # add s for i in [i0, i1], j in [j0, j1]
        if i0 > i1 or j0 > j1:
            return
        D[i0, j0] += s
        D[i0, j1 + 1] -= s
        D[i1 + 1, j0] -= s
        D[i1 + 1, j1 + 1] += s

    for bt in problem.tensors:
        p = -1 if bt.producer is None else pos[bt.producer]
        cons = sorted(pos[c] for c in bt.consumers)
        if bt.producer is not None:
            last = N if bt.graph_output else (cons[-1] if cons else -1)
            rect(0, p, p + 1, last, bt.nbytes)          # out: i <= p < j <= last consumer
        prev = p
        for c in cons:                                  # in: first consumer in [i, j) is c
            rect(prev + 1, c, c + 1, N, bt.nbytes)
            prev = c
    traffic = D.cumsum(0).cumsum(1)[: N + 1, : N + 1]
    oc = problem.op_costs
    P = np.concatenate([[0], np.cumsum([oc[v].param_bytes for v in order])]).astype(np.int64)
    Q = np.concatenate([[0], np.cumsum([oc[v].compute_ps for v in order])]).astype(np.int64)
    m = problem.model
    par = P[None, :] - P[:, None]
    comp = Q[None, :] - Q[:, None]
    stream = m.ps_per_byte * np.maximum(0, par - m.sram_bytes)
    run = np.maximum(comp, stream) if m.overlap else comp + stream
    C = m.overhead_ps + run + m.ps_per_byte * traffic
    big = np.iinfo(np.int64).max // 4
    C[np.tril_indices(N + 1)] = big
    return C


def best_contiguous(problem: PartitionProblem, order, n: int) -> tuple[int, ...] | None:
    """Stages of the contiguous cut of `order` into n ranges with the smallest slowest stage
    (exact; ties broken towards a smaller sum, heuristically), respecting that the sink region is in the last range; None if none."""
    N = problem.n_ops
    if N > MAX_OPS or n < 1 or n > N:
        return None
    pos = {v: k for k, v in enumerate(order)}
    lmin = min((pos[v] for v in problem.last_stage_ops), default=N - 1)
    C = range_costs(problem, order)
    big = np.iinfo(np.int64).max // 4
    # dp[k][j]: (max, sum) of the best cut of order[:j] into k+1 ranges
    dpm = C[0].copy()
    dps = np.where(dpm < big, dpm, big)
    back = []
    for k in range(1, n):
        nm = np.full(N + 1, big, dtype=np.int64)
        ns = np.full(N + 1, big, dtype=np.int64)
        arg = np.zeros(N + 1, dtype=np.int64)
        for j in range(k + 1, N + 1):
            i = np.arange(k, j)
            cand_m = np.maximum(dpm[k:j], C[k:j, j])
            cand_s = np.minimum(dps[k:j] + C[k:j, j], big)
            if k == n - 1 and j == N:  # the last range must start at or before the sink region
                ok = i <= lmin
                cand_m = np.where(ok, cand_m, big)
            best = np.lexsort((cand_s, cand_m))[0]
            nm[j], ns[j], arg[j] = cand_m[best], cand_s[best], i[best]
        back.append(arg)
        dpm, dps = nm, ns
    if dpm[N] >= big:
        return None
    cuts = [N]
    j = N
    for k in range(n - 1, 0, -1):
        j = int(back[k - 1][j])
        cuts.append(j)
    cuts = cuts[::-1]  # end of each range
    stages = [0] * N
    start = 0
    for s, end in enumerate(cuts):
        for q in range(start, end):
            stages[order[q]] = s
        start = end
    stages = tuple(stages)
    return stages if problem.is_valid(stages, n) else None

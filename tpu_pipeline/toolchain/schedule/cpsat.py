"""CP-SAT scheduler after Zhong et al. (Table I): O[i,j] op i runs at step j, T[t,j] tensor t is
stored at step j, `mem` the peak. Constraints (their numbering):
 (1) one unit per step, (2) each unit once, (3) an op runs only while every tensor it touches is
 stored, (4) a tensor is stored at step j only if stored at j-1 or written at j, (5) tensors not yet
 written are not stored at the start, (6) stored bytes + scratch at every step <= mem.
Minimising mem drives every T to the exact TFLite Micro lifetime, so the optimum equals the shared
memory model's (tests compare with brute force). Adapted to our model: fused units occupy
consecutive steps (U[k,j] = unit k starts at j); tensors alive before the piece start stored;
graph outputs and tensors read after the piece must be stored at the last step; scratch enters (6).

Topology-aware pruning (their (7)-(10)): unit k can only start in [1 + ops of its ancestors,
L + 1 - ops of its descendants - its length]; a tensor cannot be stored before its writer's window
opens nor after its last reader's window closes (unless it must outlive the piece).
Anytime: at the limit it returns the best order and CP-SAT's best bound.
"""

from __future__ import annotations

import math

from ortools.sat.python import cp_model

from tpu_pipeline.toolchain.cpsat import new_solver
from tpu_pipeline.toolchain.schedule.bounds.static import static_lower_bound
from tpu_pipeline.toolchain.schedule.model import bits
from tpu_pipeline.toolchain.schedule.problem import Piece, SearchResult


def cpsat_piece(piece: Piece, ub_order, ub: int, floor: int = 0, time_limit: float = 10.0,
                seed: int = 0, workers: int = 1) -> SearchResult:
    import time

    t_start = time.monotonic()
    model = piece.model
    units = piece.units
    m = len(units)
    lens = [len(u) for u in units]
    L = sum(lens)
    static_lb = static_lower_bound(piece)
    floor = max(floor, static_lb)
    if ub <= floor:
        return SearchResult(None, ub, static_lb, True, 0)
    for t in range(len(model.size)):
        if model.mask[t] & piece.ops and model.born[t] < 0 and not model.pin_start[t]:
            return SearchResult(None, ub, static_lb, False, 0)  # read before written: not modelled

    lo, hi = _windows(piece, lens, L)
    cp = cp_model.CpModel()
    owner, offset = {}, {}  # op -> (its unit, its position in the unit)
    for k, u in enumerate(units):
        for r, v in enumerate(u):
            owner[v], offset[v] = k, r
    U, start, O = _placement_vars(cp, piece, lo, hi, lens, L, owner, offset)
    const, mem_terms = _tensor_vars(cp, piece, lo, hi, O, L, owner, offset)
    mem = cp.new_int_var(floor, max(ub, floor), "mem")
    for j in range(1, L + 1):  # (6)
        expr = [s * x for s, x in mem_terms[j]]
        scratch = [model.extra[v] * O(v, j) for v in bits(piece.ops) if model.extra[v] and O(v, j) is not None]
        final = model.final_only if (j == L and piece.ends_graph) else 0
        cp.add(sum(expr) + sum(scratch) + const + final <= mem)
    cp.minimize(mem)
    _add_hint(cp, U, units, ub_order, lo, hi)

    solver = new_solver(max(0.1, float(time_limit) - (time.monotonic() - t_start)), min(2, workers), seed)
    status = solver.solve(cp)
    # the objective is an integer, but CP-SAT reports its bound as a float that can fall just
    # under it (751.9999999999999 for 752): int() would lose a byte and the proof with it
    bound = math.ceil(solver.best_objective_bound - 1e-6) if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else floor
    if status == cp_model.INFEASIBLE:  # nothing within [floor, ub]: cannot happen with ub feasible
        return SearchResult(None, ub, ub, True, 0)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SearchResult(None, ub, static_lb, False, 0)
    starts = sorted(range(m), key=lambda k: solver.value(start[k]))
    order = [v for k in starts for v in units[k]]
    peak = piece.evaluate(order)
    complete = status == cp_model.OPTIMAL
    lb = max(static_lb, min(bound, peak)) if bound > floor or complete else static_lb
    if complete and peak > max(bound, floor):
        complete = False  # the model's memory may exceed the exact one only if not minimal
    return SearchResult(order, peak, lb, complete, 0)


def _windows(piece: Piece, lens: list[int], L: int) -> tuple[list[int], list[int]]:
    """First and last step each unit may start at, from its ancestors / descendants in the piece."""
    m = len(piece.units)
    anc = [0] * m
    for k in range(m):  # piece units are topologically ordered
        a = piece.upred[k]
        for j in bits(piece.upred[k]):
            a |= anc[j]
        anc[k] = a
    desc = [0] * m
    for k in range(m - 1, -1, -1):
        d = 0
        for j in piece.usucc[k]:
            d |= (1 << j) | desc[j]
        desc[k] = d
    lo = [1 + sum(lens[j] for j in bits(anc[k])) for k in range(m)]
    hi = [L + 1 - sum(lens[j] for j in bits(desc[k])) - lens[k] for k in range(m)]
    return lo, hi


def _placement_vars(cp, piece: Piece, lo, hi, lens, L, owner, offset):
    """U[k, j] (unit k starts at step j), the start variables, precedences, one op per step (1)-(2).
    Also returns O(v, j): the literal "op v runs at step j" (None where it cannot)."""
    m = len(piece.units)
    U = {(k, j): cp.new_bool_var(f"U{k}_{j}") for k in range(m) for j in range(lo[k], hi[k] + 1)}
    start = []
    for k in range(m):
        cp.add_exactly_one(U[k, j] for j in range(lo[k], hi[k] + 1))  # (2)
        s = cp.new_int_var(lo[k], hi[k], f"s{k}")
        cp.add(s == sum(j * U[k, j] for j in range(lo[k], hi[k] + 1)))
        start.append(s)
    for k in range(m):
        for p in bits(piece.upred[k]):
            cp.add(start[k] >= start[p] + lens[p])

    def O(v, j):
        k, r = owner[v], offset[v]
        return U.get((k, j - r))

    for j in range(1, L + 1):  # (1)
        cover = [O(v, j) for v in bits(piece.ops)]
        cp.add_exactly_one([x for x in cover if x is not None])
    return U, start, O


def _tensor_vars(cp, piece: Piece, lo, hi, O, L, owner, offset):
    """T[t, j] (tensor t stored at step j) with constraints (3)-(5). Returns the constant bytes
    (tensors alive across the whole piece) and, per step, the (size, literal) terms of memory."""
    model = piece.model
    S0, S_end = piece.S0, piece.S0 | piece.ops
    const = model.const_all
    T: dict[tuple[int, int], object] = {}
    mem_terms = {j: [] for j in range(1, L + 1)}
    for t in range(len(model.size)):
        msk = model.mask[t]
        alive0 = (model.pin_start[t] or msk & S0) and (model.pin_end[t] or msk & ~S0)
        alive_end = (model.pin_start[t] or msk & S_end) and (model.pin_end[t] or msk & ~S_end)
        inside = msk & piece.ops
        if not inside:
            if alive0 and alive_end:
                const += model.size[t]
            continue
        writer = model.born[t]
        writes_here = writer >= 0 and (piece.ops >> writer) & 1
        # window of steps where the tensor may be stored
        first = lo[owner[writer]] + offset[writer] if writes_here else 1
        if alive_end:
            last = L
        else:
            last = max(hi[owner[v]] + offset[v] for v in bits(inside))
        prev = 1 if alive0 else 0
        for j in range(1, L + 1):
            if j < first or j > last:
                T[t, j] = 0
                prev = 0
                continue
            x = cp.new_bool_var(f"T{t}_{j}")
            T[t, j] = x
            w = O(writer, j) if writes_here else None
            if isinstance(prev, int):
                if prev == 0:
                    if w is None:
                        cp.add(x == 0)
                    else:
                        cp.add_implication(x, w)  # (4)/(5)
            else:
                if w is None:
                    cp.add_implication(x, prev)  # (4)
                else:
                    cp.add_bool_or([prev, w]).only_enforce_if(x)  # (4)
            prev = x
            mem_terms[j].append((model.size[t], x))
        if alive_end:
            cp.add(T[t, L] == 1) if not isinstance(T[t, L], int) else None
        for v in bits(inside):  # (3)
            for j in range(1, L + 1):
                o = O(v, j)
                if o is None:
                    continue
                x = T[t, j]
                if isinstance(x, int):
                    cp.add(o == 0) if x == 0 else None
                else:
                    cp.add_implication(o, x)
    return const, mem_terms


def _add_hint(cp, U, units, ub_order, lo, hi) -> None:
    """Hint: the upper-bound order (as units if it respects them)."""
    pos = {}
    step = 1
    for v in ub_order:
        pos[v] = step
        step += 1
    for k, u in enumerate(units):
        j0 = pos.get(u[0])
        if j0 is not None and all(pos.get(v) == j0 + r for r, v in enumerate(u)) and (k, j0) in U:
            for j in range(lo[k], hi[k] + 1):
                cp.add_hint(U[k, j], j == j0)

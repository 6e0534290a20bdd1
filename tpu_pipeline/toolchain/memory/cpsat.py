"""The arena as a CP-SAT problem: each buffer's offset an interval variable, its lifetime a fixed
interval, a 2-D no-overlap between them, the arena size minimised (hinted with a known plan, held
at or above a proven lower bound)."""

from __future__ import annotations

import math
from typing import Sequence

from tpu_pipeline.toolchain.memory.lifetimes import Buffer
from tpu_pipeline.toolchain.memory.preprocess import size_unit


def cpsat_plan(buffers: Sequence[Buffer], time_limit: float = 5.0, hint: Sequence[int] | None = None,
               lower_bound: int = 0, upper_bound: int | None = None, seed: int = 0, workers: int = 2):
    """Minimise the arena with CP-SAT. Returns (offsets or None, size, proven_lower_bound, optimal)."""
    from ortools.sat.python import cp_model

    from tpu_pipeline.toolchain.cpsat import new_solver

    n = len(buffers)
    if n == 0:
        return [], 0, 0, True
    grouped = any(b.group >= 0 for b in buffers)
    g = size_unit(buffers)
    if grouped and any(b.group_offset % g for b in buffers):
        g = 1  # a group's offsets must be whole units too
    sizes = [b.size // g for b in buffers]
    ub = (upper_bound // g) if upper_bound else sum(sizes)
    lb = -(-lower_bound // g)
    m = cp_model.CpModel()
    z = m.new_int_var(max(lb, max(sizes)), ub, "arena")
    base = {}  # rigid groups (overlapped ops): members at fixed offsets from the group's base
    for b in buffers:
        if b.group >= 0 and b.group not in base:
            base[b.group] = m.new_int_var(0, ub, f"g{b.group}")
    xs, ys = [], []
    hinted = set()
    for i, b in enumerate(buffers):
        if b.group >= 0:
            off = base[b.group] + b.group_offset // g
            m.add(off >= 0)
        else:
            off = m.new_int_var(0, ub - sizes[i], f"o{i}")
        ys.append(m.new_interval_var(off, sizes[i], off + sizes[i], f"y{i}"))
        xs.append(m.new_fixed_size_interval_var(b.first, b.last - b.first + 1, f"x{i}"))
        m.add(off + sizes[i] <= z)
        if hint is not None:
            if b.group < 0:
                m.add_hint(off, hint[i] // g)
            elif b.group not in hinted:  # (a variable hinted twice makes the model invalid)
                m.add_hint(base[b.group], (hint[i] - b.group_offset) // g)
                hinted.add(b.group)
    m.add_no_overlap_2d(xs, ys)
    if not grouped:  # (flipping or swapping would break a group's fixed offsets)
        # Symmetry: flipping a plan upside down is a plan; keep the largest buffer in the lower half.
        big = max(range(n), key=lambda i: (sizes[i], -i))
        m.add(2 * ys[big].start_expr() + sizes[big] <= z)
        # Identical buffers (same lifetime and size) are interchangeable: order their offsets.
        seen: dict[tuple[int, int, int], int] = {}
        for i, b in enumerate(buffers):
            key = (b.first, b.last, sizes[i])
            if key in seen:
                m.add(ys[seen[key]].start_expr() + sizes[i] <= ys[i].start_expr())
            seen[key] = i
    if hint is not None:
        m.add_hint(z, max(h // g + s for h, s in zip(hint, sizes)))
    m.minimize(z)
    solver = new_solver(max(0.05, time_limit), min(2, workers), seed)
    solver.parameters.log_search_progress = False
    status = solver.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = int(solver.best_objective_bound) * g if status == cp_model.UNKNOWN else lower_bound
        return None, None, max(lower_bound, bound if status == cp_model.UNKNOWN else 0), False
    offsets = [solver.value(ys[i].start_expr()) * g for i in range(n)]
    size = int(solver.value(z)) * g
    bound = max(lower_bound, int(math.ceil(solver.best_objective_bound)) * g)
    return offsets, size, bound, status == cp_model.OPTIMAL

"""A selection made real: its variants applied to the whole graph, scheduled and planned; and what
the realised plan tells the selection it missed (overlapped ops' groups above the promised peak)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tpu_pipeline.toolchain.budget import Deadline, say
from tpu_pipeline.toolchain.fit.select import Selection
from tpu_pipeline.toolchain.fit.variants import Variant, splice
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.ir.kernels import HARNESS_IN_PLACE, IN_PLACE, kernel_name, with_in_place, with_kernel
from tpu_pipeline.toolchain.memory.lifetimes import lifetimes
from tpu_pipeline.toolchain.memory.semantics import Semantics
from tpu_pipeline.toolchain.memory.tflm import plan_for_tflm
from tpu_pipeline.toolchain.memory.tflm_target import ops_tail, tail_bound, target_tail
from tpu_pipeline.toolchain.rewrite.patch import apply_patches, checked_region
from tpu_pipeline.toolchain.rewrite.patch_stage import build_stage
from tpu_pipeline.toolchain.schedule.api import schedule
from tpu_pipeline.toolchain.schedule.model import build_model
from tpu_pipeline.toolchain.schedule.params import ScheduleParams

# The whole graph's scheduler, when the variants' own orders keep the promised peak: the short
# exact search and then dives, each bounded by its states, not by the clock, so that the same model
# and budget give the same order on any machine under any load (a 2 s cut gave detection --budget
# 308200 heads of 285,360 to 287,232 B run to run: its one hard piece needs 158,000 states, about
# 0.4 s; mcunetv2_large's first dive finds its 696,640 B in 429 states, where a dive of 500,000
# states that finds nothing takes 1.2 s). The seconds only cap it, above what those states take.
REALISE_SCHEDULE = ScheduleParams(dive_states_c=50_000).without("timed", "branch_bound", "beams", "full_search")
REALISE_SCHEDULE_SECONDS = 4.0


def tail_fixed_of(graph: Graph, sem: Semantics, arena: str) -> tuple[int | None, str]:
    """The part of the target's tail no variant changes (the allocator's structs, the I/O tensors,
    the graph inputs' eval tensors): what the selection adds to the variants' own tails; None
    (and a note) when the head alone is selected on."""
    if arena == "head":
        return None, ""
    # (bounds, additive over the variants: the realised tail, which depends on the op order, stays within them)
    whole, ops = tail_bound(graph, sem), ops_tail(graph, sem)
    if whole is None or ops is None:
        missing = ", ".join(target_tail(graph, sem).unmodelled)
        return None, (f"the target's tail is not modelled for {missing}: the selection counts the head alone "
                      "(the tail is added once the model is fitted)")
    return whole - ops, ""


def realise(graph: Graph, spans, sel: Selection, sem: Semantics, deadline: Deadline, progress, t0, like=None,
            built: dict | None = None, hopeless=None):
    """(graph, schedule, arena plan) of a selection applied to the whole graph, under the memory
    semantics of the kernel set it will run with. `like`: (an earlier realisation (graph, schedule,
    plan), the selection it realised); where this one asks the scheduler the very same question,
    that schedule is its answer and only the arena is planned again (`_same_answer`). `built`:
    apply_selection's. `hopeless(graph, schedule)`: True where the caller cannot use the result
    even at a head of the schedule's peak (no plan of that order goes below it): None is returned
    then, unplanned."""
    whole = applied(graph, spans, sel, built)
    say(progress, t0, f"fit: chosen peak {sel.peak:,} B, {len(whole.ops)} ops; scheduling and planning")
    asked = _asks(whole, sel, sem, deadline)
    sched = None if like is None else _same_answer(whole, asked, *like, sem, deadline, built)
    if sched is None:
        sched = schedule(whole, asked.method, time_limit=None, deadline=Deadline(asked.seconds), semantics=sem,
                         params=REALISE_SCHEDULE if asked.short else ScheduleParams())
    whole = whole.reordered(sched.order)
    if hopeless is not None and hopeless(whole, sched):
        return None
    plan = plan_for_tflm(whole, lifetimes(whole, None, sem), time_limit=None, n_tensors=len(whole.tensors),
                         deadline=Deadline(max(2.0, deadline.remaining())))
    return whole, sched, plan


def applied(graph: Graph, spans, sel: Selection, built: dict | None = None) -> Graph:
    """The selection applied to the whole graph, its ops in the order the scheduler starts from:
    the variants' own orders, which reach the selection's peak (the scheduler may only improve on them)."""
    whole = apply_selection(graph, sel.variants, spans, built)
    return whole.reordered(variant_order(whole, sel.variants))


@dataclass(frozen=True)
class Asked:
    """What realise asks the whole graph's scheduler: its method and seconds, and whether its search
    is the short one bounded by states (REALISE_SCHEDULE), whose answer the seconds only cap."""
    method: str
    seconds: float
    short: bool


def _asks(whole: Graph, sel: Selection, sem: Semantics, deadline: Deadline) -> Asked:
    # (the spans are separated by cuts and each variant's order is its best: the scheduler rarely
    # gains here, while the planner needs its time to reach the peak on thousands of buffers; where
    # that order already holds the selection's promise, the scheduler gets a short look only)
    share, method = 0.35 * deadline.remaining(), "auto"
    if lifetimes(whole, None, sem).peak > sel.peak:
        return Asked(method, max(1.0, share), False)
    if all(_settled(v) for v in sel.variants if v.peak >= sel.peak):
        # the variants at the peak had the exact scheduler's search already, alone:
        # the whole graph's search meets the same pieces again (TinyEngine's mcunetv2_large:
        # 2 s spent, nothing gained); its cheap orders and bound only (never worse than this order)
        method = "greedy"
    return Asked(method, max(1.0, min(share, REALISE_SCHEDULE_SECONDS)), True)


def _same_answer(whole: Graph, asked: Asked, realised, sel: Selection, sem: Semantics, deadline: Deadline,
                 built: dict | None):
    """`like`'s schedule where `whole` poses its scheduler the same question: the same scheduling
    problem op for op in the same starting order (a lean twin swapped for its origin changes a
    kernel and a constant, which the arena's head does not hold) and the same method, where the
    method's search is bounded by work (greedy's cheap orders, the short search's states); else
    None. The search is then a function of that question, so asking
    again spends the seconds for the same order (TinyEngine's mcunetv2_large --budget: five swaps,
    2 s each, each the realised 696,640 B head again)."""
    done, sched, _ = realised
    if not asked.short or len(done.ops) != len(whole.ops):
        return None
    key = ("problem", id(done))  # (`like`'s problem, made once for all the swaps: `built` holds it)
    hit = None if built is None else built.get(key)
    if hit is None or hit[0] is not done:
        start = [0] * len(sched.order)  # `done` is its start order reordered by the schedule: undo that
        for k, i in enumerate(sched.order):
            start[i] = k
        before = done.reordered(start)
        # (asked now, `sel`'s question has the same method and bound)
        hit = (done, _problem(before, sem), _asks(before, sel, sem, deadline))
        if built is not None:
            built[key] = hit
    _, theirs, theirs_asked = hit
    if (theirs_asked.method, theirs_asked.short) != (asked.method, asked.short):
        return None
    mine = _problem(whole, sem)
    return sched if mine is not None and mine == theirs else None


def _problem(whole: Graph, sem: Semantics):
    """The scheduler's problem of `whole` without the graph's tensor numbering (constants come and
    go with kernels); None where the runtime's sharing depends on the order (not the model alone)."""
    m = build_model(whole, sem)
    return replace(m, tensor_ids=()) if m.exact else None


def _settled(v: Variant) -> bool:
    """`v`'s order is proven optimal, or the exact scheduler searched it for its best (best_order
    asked for the best, not for any order under a peak: that one stops at the first it finds, and
    the whole graph's search then still gains, vww_96_int8 at 40,616 B: 35,344 -> 34,560 B)."""
    return v.proven or v.searched


def variant_order(whole: Graph, chosen) -> list[int]:
    """The op order of the applied graph that runs each chosen variant in the order its peak was
    measured in (ops matched by their first output's name, unique in the graph); the stored order
    if any op cannot be matched."""
    pos = {whole.tensors[op.outputs[0]].name: i for i, op in enumerate(whole.ops)}
    order = []
    for v in chosen:
        idx = [pos.get(v.graph.tensors[op.outputs[0]].name) for op in v.graph.ops] if v.graph is not None else [None]
        if None in idx:
            return list(range(len(whole.ops)))
        order += idx
    if sorted(order) != list(range(len(whole.ops))) or not whole.is_topological(order):
        return list(range(len(whole.ops)))
    return order


def apply_selection(graph: Graph, chosen, spans, built: dict | None = None) -> Graph:
    """`graph` with the chosen variants applied: their rewrites and patches (`_shaped`), then their
    kernel choices. `built`: a dict the caller keeps for selections of one graph and spans, the
    shaped graph by what shapes it (unlean's swaps change kernels only: the patch stages, a third
    of a second each on TinyEngine's mcunetv2_large, are built once)."""
    read = {graph.tensors[t].name for op in graph.ops for t in op.inputs if t >= 0 and graph.tensors[t].is_constant}
    key = tuple(_shape_key(v) for v in chosen if v.kind in ("rewrite", "patch"))
    hit = None if built is None else built.get(key)
    if hit is None:
        # (the variants held too: the rewrites' graph ids in the key stay theirs)
        hit = (_shaped(graph, chosen, spans), tuple(chosen))
        if built is not None:
            built[key] = hit
    graph = hit[0]
    moved = dict(kv for v in chosen for kv in v.kernels)
    if moved:  # ops matched by their first output's name, unique in the graph (as _variant_order)
        for i, op in enumerate(graph.ops):
            kernel = moved.get(graph.tensors[op.outputs[0]].name)
            if kernel is not None and op.kernel != kernel:
                graph = _with_kernel(graph, i, kernel)
    return without_orphans(graph, {t.index for t in graph.tensors if t.name in read})  # (names: unique here)


def _with_kernel(graph: Graph, i: int, kernel: str) -> Graph:
    """`graph` with op i on `kernel`; in place on the builtin (IN_PLACE) or on the harness
    (HARNESS_IN_PLACE: a TPUP_ADD) from whichever kernel it had."""
    if kernel not in (IN_PLACE, HARNESS_IN_PLACE):
        return with_kernel(graph, [i], kernel)
    base = kernel_name() if kernel == HARNESS_IN_PLACE else ""
    if graph.ops[i].kernel not in (base, kernel):
        graph = with_kernel(graph, [i], base)
    return with_in_place(graph, [i])


def _shape_key(v: Variant) -> tuple:
    """What `_shaped` reads of a rewrite or patch variant."""
    if v.kind == "rewrite":
        return ("rewrite", v.first, v.last, id(v.graph))
    return ("patch", v.form, v.region, v.grid, v.recompute)


def _shaped(graph: Graph, chosen, spans) -> Graph:
    # rewrites first, spliced by position into the graph their spans index; then the patches,
    # which find their regions by tensor name
    for v in sorted((v for v in chosen if v.kind == "rewrite"), key=lambda v: -v.first):
        graph = splice(graph, v, spans)
    for v in chosen:
        if v.kind == "patch" and v.form == "stage":
            tin, tout, positions = checked_region(graph, v.region)
            graph = build_stage(graph, tin, tout, positions, v.grid, stream=not v.recompute)
        elif v.kind == "patch":
            graph = apply_patches(graph, v.region, v.grid)
    return graph


def without_orphans(graph: Graph, tensors) -> Graph:
    """`graph` without those of `tensors` no op reads any more: a kernel variant's constant input
    its op no longer takes (a lean twin's, or a layer's a patch stage runs without that variant),
    to which TFLite Micro would still give an eval tensor in the tail; the variants' tails, which
    the selection adds up, do not count it."""
    used = {t for op in graph.ops for t in (*op.inputs, *op.outputs, *op.intermediates) if t >= 0}
    dropped = set(tensors) - used - set(graph.inputs) - set(graph.outputs)
    if not dropped:
        return graph
    keep = [t for t in graph.tensors if t.index not in dropped]
    index = {t.index: k for k, t in enumerate(keep)}

    def moved(ts):
        return tuple(index[t] if t >= 0 else t for t in ts)

    ops = tuple(replace(op, inputs=moved(op.inputs), outputs=moved(op.outputs), intermediates=moved(op.intermediates))
                for op in graph.ops)
    return replace(graph, tensors=tuple(replace(t, index=k) for k, t in enumerate(keep)), ops=ops,
                   inputs=moved(graph.inputs), outputs=moved(graph.outputs),
                   external=tuple(index[t] for t in graph.external))


def overshoot(whole: Graph, plan, sel: Selection, sem: Semantics) -> list[tuple[Variant, int]]:
    """Chosen variants whose ops run at a step where the realised plan reaches above the
    selection's peak, with the highest such reach: what the selection should have been told. Only
    where overlapped ops are planned (their groups' fixed offsets are what a span's figure cannot
    see; other plans reach their peak or are left as the planner's note says)."""
    if plan.head <= sel.peak:
        return []
    lt = lifetimes(whole, None, sem)
    if not any(b.group >= 0 for b in lt.buffers) or len(plan.buffer_offsets) != len(lt.buffers):
        return []
    top = [0] * lt.n_steps
    for b, off in zip(lt.buffers, plan.buffer_offsets):
        for s in range(b.first, b.last + 1):
            top[s] = max(top[s], off + b.size)
    owner = {}
    for v in sel.variants:
        if v.graph is not None:
            for op in v.graph.ops:
                owner[v.graph.tensors[op.outputs[0]].name] = v
    between = _between_groups(whole, lt, plan.buffer_offsets, sel, owner)
    if between:
        return between
    reach: dict[int, tuple[Variant, int]] = {}
    for i, op in enumerate(whole.ops):  # op i runs at step i + 1 (the realised graph is in its order)
        v = owner.get(whole.tensors[op.outputs[0]].name)
        if v is not None and top[i + 1] > sel.peak and top[i + 1] > v.peak:
            old = reach.get(id(v), (v, 0))[1]
            reach[id(v)] = (v, max(old, top[i + 1]))
    return list(reach.values())


def _between_groups(whole: Graph, lt, offsets, sel: Selection, owner) -> list[tuple[Variant, int]]:
    """Chosen variants with an op that reads a tensor of one rigid group and writes one of
    another, where either group reaches above the selection's peak, with that reach. Such an op's
    span was measured with its input and output placed freely, but each is tied to its group's
    base, and overlapped groups share their first byte (overlap_layout): the two groups then cannot
    lie as the spans alone would (vww_96_int8: a plain depthwise between an overlapped first
    layer and an overlapped pointwise one, 37,632 B promised, 46,080 B planned). The op between
    is what the selection must be told about: blaming the overlapped neighbours instead drops
    their variants while the same plain op keeps the next selection above its peak."""
    group_of: dict[int, int] = {}
    top: dict[int, int] = {}
    for b, off in zip(lt.buffers, offsets):
        if b.group < 0:
            continue
        top[b.group] = max(top.get(b.group, 0), off + b.size)
        for t, _ in b.placements():
            group_of[t] = b.group
    reach: dict[int, tuple[Variant, int]] = {}
    for op in whole.ops:
        ins = {group_of[t] for t in op.inputs if t in group_of}
        outs = {group_of[t] for t in op.outputs if t in group_of}
        if not ins or not outs or ins == outs:
            continue
        high = max(top[g] for g in ins | outs)
        v = owner.get(whole.tensors[op.outputs[0]].name)
        if v is not None and high > sel.peak and high > v.peak:
            reach[id(v)] = (v, max(reach.get(id(v), (v, 0))[1], high))
    return list(reach.values())

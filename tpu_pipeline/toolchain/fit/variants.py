"""The variants `fit` chooses from, each with a memory and a time cost.

A variant covers a run of spans (`first..last`, see spans.py) and says how they run:
- `as-is`: the span's own ops in their memory-optimal order (one per span, always there);
- `patch`: the run executed patch by patch on a rows x cols grid (tpu_pipeline.toolchain.rewrite.patch),
  bit-exact in int8 and float;
- `rewrite`: one or two spans with the identity rewrites of tpu_pipeline.toolchain.rewrite (partial-convolution
  and depthwise splits, commutes) that lower their optimal peak: the exact ones (bit-exact in int8,
  float splits equal within rounding), and with `allow_lossy` the int8 partial-sum splits too;
- any of them with some ops at its peak on other harness kernels (tpu_pipeline.toolchain.ir.kernels;
  `kernel_twins`): an overlapped op (its output planned over its input: a row of output held in a
  ring, a copy per row), an ADD or MUL in place (no cost at all), or a direct convolution (no
  im2col scratch, slower): a kernel variant.

Memory is the peak of the run under TFLite Micro's semantics for the kernel set (scratch included): for `as-is` the
exact scheduler's optimum; for `patch`, once measured, the peak of the patch-by-patch order the
rewrite emits (achievable, so a selection under a budget really fits); `refine` asks the exact
scheduler about those whose lower bound says they might do better. Before a patch variant is
measured its figures are floors (`upgrade`). Time is the device cost model's prediction (MACs,
halo recompute, per-op overhead): a prediction, labelled so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tpu_pipeline.toolchain.budget import Deadline, Progress
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
from tpu_pipeline.toolchain.device import Device
from tpu_pipeline.toolchain.fit.estimate import RegionGeometry, estimate_patches
from tpu_pipeline.toolchain.fit.staged import stage_geometry
from tpu_pipeline.toolchain.fit.spans import Span, span_graph
from tpu_pipeline.toolchain.ir import Graph, macs
from tpu_pipeline.toolchain.memory.bounds import order_free_lower_bound
from tpu_pipeline.toolchain.memory.lifetimes import lifetimes, overlap_legal
from tpu_pipeline.toolchain.memory.planners import plan_arena
from tpu_pipeline.toolchain.ir import add, kernel_variants
from tpu_pipeline.toolchain.ir.fully_connected import OPCODE as FC_OPCODE
from tpu_pipeline.toolchain.ir.kernels import (DIRECT, HARNESS_IN_PLACE, IN_PLACE, MEAN_MUL, OVERLAP, builtin_view, winning_variant, can_run_direct, can_run_harness,
                                               can_run_variant, flags, in_place_source, is_harness, kernel_name,
                                               relaid_allowed, runs_in_place, with_flag, variant_of, with_in_place,
                                               with_kernel)
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import Semantics, align
from tpu_pipeline.toolchain.memory.tflm_target import copies_tail, ops_tail
from tpu_pipeline.toolchain.rewrite.fold_pad import fold_pads
from tpu_pipeline.toolchain.ir.geometry import hw
from tpu_pipeline.toolchain.rewrite.patch import apply_patches, patch_regions
from tpu_pipeline.toolchain.rewrite.patch_stage import build_stage, stage_refusal
from tpu_pipeline.toolchain.fit.grids import MAX_STAGE_GRID, square_grids, stage_grids
from tpu_pipeline.toolchain.schedule.api import schedule

# Tiles x region ops above this are not offered: every copy of an op costs TFLite Micro a node, its
# parameters and an invoke (tail and latency), and the exact scheduler and the runtimes' checks
# slow down with it (an 11,000-op randwire variant took minutes to check for a few KiB).
MAX_PATCH_OPS = 4096
GROUP_PLAN_SECONDS = 1.0  # to plan a variant with overlapped ops (achievable_peak)
_NODE, _EVAL_TENSOR, _SCRATCH_HANDLE = 32, 12, 4  # NodeAndRegistration, TfLiteEvalTensor, ScratchBufferHandle (32-bit)


@dataclass(frozen=True)
class Variant:
    first: int  # spans covered, inclusive
    last: int
    kind: str  # "as-is" | "patch" | "rewrite"
    label: str
    peak: int  # bytes: achievable peak of the covered spans
    lower_bound: int  # no order of this variant peaks below it
    latency_s: float  # predicted by the device cost model
    macs: int
    ops: int
    region: Any = None  # patch: the PatchRegion
    grid: tuple[int, int] | None = None
    graph: Graph | None = field(default=None, compare=False, repr=False)
    stage: str = "measured"  # patch variants: "bound" -> "estimate" -> "measured" (see upgrade)
    kernels: tuple[tuple[str, str], ...] = ()  # (first-output name, harness kernel) of ops its twins moved
    rewrites: tuple = ()  # rewrite: the AppliedRewrite records (tpu_pipeline.toolchain.rewrite.driver)
    ordered: bool = False  # patch: the exact scheduler has been asked for its best order
    form: str = "copies"  # patch: "copies" (every tile its own ops) or "stage" (one harness op: ir.stage)
    recompute: bool = False  # stage: its tiles recompute their halos (else each element is computed once)
    tail: int = 0  # bytes of TFLite Micro's persistent tail its ops bring (memory.tflm_target.ops_tail; a floor
    # until measured)
    lean_of: Any = field(default=None, compare=False, repr=False)  # a lean twin's origin (lean_twins)
    searched: bool = False  # patch: its order is the exact scheduler's best within a deadline (best_order
    # asked for no order under a given peak only)

    @property
    def proven(self) -> bool:
        return self.stage == "measured" and self.peak <= self.lower_bound

    def to_json(self) -> dict:
        d = {"spans": [self.first, self.last], "kind": self.kind, "stage": self.stage, "label": self.label,
             "peak_bytes": self.peak, "lower_bound_bytes": self.lower_bound, "latency_s_predicted": self.latency_s,
             "macs": self.macs, "ops": self.ops, "tail_bytes": self.tail}
        if self.grid is not None:
            d.update(grid=list(self.grid), input=self.region.input, output=self.region.output, form=self.form)
        if self.kernels:
            d["kernel_choices"] = {name: kernel for name, kernel in self.kernels}
        if self.rewrites:
            d["rewrites"] = [r.to_json() for r in self.rewrites]
        return d


def _costed(graph: Graph, device: Device, sem: Semantics) -> tuple[float, int]:
    est = estimate_mcu(graph, device, sem.kernels)
    return est.latency_s, sum(macs(graph, i) or 0 for i in range(len(graph.ops)))


def as_is_variants(graph: Graph, spans: list[Span], device, sem: Semantics, deadline: Deadline | None = None,
                   progress: Progress = None) -> list[Variant]:
    """One variant per span: its ops in the proven memory-optimal order."""
    out = []
    for s in spans:
        g = span_graph(graph, [s])
        sched = schedule(g, time_limit=None, deadline=(deadline or Deadline(10.0)).sub(fraction=0.2), semantics=sem)
        lat, work = _costed(g, device, sem)
        name = graph.tensors[graph.ops[s.ops[-1]].outputs[0]].name
        out.append(Variant(s.index, s.index, "as-is", f"as is up to {short_name(name)}", sched.peak,
                           sched.lower_bound, lat, work, len(g.ops), graph=g.reordered(sched.order),
                           tail=_tail(g, sem)))
    return out


def on_harness(graph: Graph, relaid: bool | frozenset[str] = True) -> tuple[Graph, list[str]]:
    """The model on the MCU harness's kernels (tpu_pipeline.toolchain.ir.kernels): every PAD folded into the
    convolution it feeds, every int8 convolution on TPUP_CONV_2D / TPUP_DEPTHWISE_CONV_2D (the same
    kernels, their requantization in flash instead of the arena's tail; each on the harness's faster
    variant where one wins, `winning_variant`), every int8 MEAN, MUL and ADD
    it can run on TPUP_MEAN / TPUP_MUL / TPUP_ADD (the same integers in a plain loop, no tail, no
    scratch; an ADD where it wins, `ir.add.wins`: from TABLE_MIN elements, about a third of the
    builtin's instructions).
    Nothing gets slower or larger in RAM. `relaid=False`: no kernel whose weights are re-laid in
    flash larger than the model's (TPUP_FULLY_CONNECTED, the variants with a constant of their
    own), for a board whose flash cannot hold them; a set of names: only those ops
    (`relaid_allowed`)."""
    g, folded = fold_pads(graph, harness=True)
    moved = [i for i in range(len(g.ops)) if not g.ops[i].kernel and can_run_harness(g, i)
             and (g.ops[i].opcode != FC_OPCODE or relaid_allowed(g, i, relaid))
             and (g.ops[i].opcode != add.OPCODE or add.wins(g, g.ops[i]))]
    g = with_kernel(g, moved, kernel_name())
    for i in range(len(g.ops)):
        flag = winning_variant(g, i, relaid)
        if flag:
            g = with_flag(g, [i], flag)
    notes = []
    n_conv = sum(g.ops[i].opcode not in MEAN_MUL for i in moved)
    loops = {}  # the harness's own ops by the builtin they replace
    for i in moved:
        if g.ops[i].opcode in MEAN_MUL:
            loops[g.ops[i].opcode] = loops.get(g.ops[i].opcode, 0) + 1
    if folded or moved:
        notes.append(f"on the harness's kernels: {folded} PAD{'s' if folded != 1 else ''} folded into convolutions, "
                     f"{n_conv} convolution{'s' if n_conv != 1 else ''} with their requantization in flash"
                     + (f", {_listed([f'{n} {name}' for name, n in loops.items()])} on the harness's own kernels"
                        if loops else ""))
    return g, notes


def _listed(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def rewrite_variants(graph: Graph, spans: list[Span], as_is: list[Variant], device,
                     sem: Semantics,
                     allow_lossy: bool = False, model=None, deadline: Deadline | None = None,
                     harness: bool = False, relaid: bool | frozenset[str] = True) -> list[Variant]:
    """A `rewrite` variant for each run of one or two spans (a concat is often a cut, with the op it
    feeds in the next span) where the identity rewrites lower the run's optimal peak. Runs are tried
    from the highest peak down while the deadline lasts; runs no rewrite matches cost nothing. The
    rules work on builtin ops: on a graph on the harness's kernels (`harness`) they rewrite the
    builtin view of a run, which then goes back onto the harness's kernels."""
    from tpu_pipeline.toolchain.rewrite.driver import rewrite_graph
    from tpu_pipeline.toolchain.rewrite.rules import find_candidates

    runs = [(a, b) for a in range(len(spans)) for b in (a, a + 1) if b < len(spans)]
    runs.sort(key=lambda r: -max(v.peak for v in as_is[r[0]:r[1] + 1]))
    calibrate_on = builtin_view(graph)
    out = []
    for a, b in runs:
        if deadline is not None and deadline.expired():
            break
        sub = builtin_view(span_graph(graph, spans[a:b + 1]))
        if not find_candidates(sub, allow_lossy):
            continue
        covered = max(v.peak for v in as_is[a:b + 1])
        r = rewrite_graph(sub, time_limit=2.0, semantics=sem, allow_lossy=allow_lossy, model=model,
                          deadline=(deadline or Deadline(10.0)).sub(fraction=0.3), calibrate_on=calibrate_on)
        if not r.applied:
            continue
        g, peak, bound = r.graph, r.peak_after, r.lower_bound
        if harness:
            g = on_harness(g, relaid)[0]
            peak = lifetimes(g, None, sem).peak  # in the rewrite's best order
            bound = min(peak, order_free_lower_bound(g, sem))
        if peak >= covered:
            continue
        lat, work = _costed(g, device, sem)
        kinds = ", ".join(dict.fromkeys(x.kind for x in r.applied))
        out.append(Variant(a, b, "rewrite", f"{kinds} x{len(r.applied)} in spans {a}-{b}", peak,
                           bound, lat, work, len(g.ops), graph=g, rewrites=r.applied, tail=_tail(g, sem)))
    return out


def splice(graph: Graph, v: Variant, spans: list[Span]) -> Graph:
    """`graph` with the ops of `v`'s spans (positions in `graph`) replaced by `v.graph`'s, a rewrite
    of them. Tensors are matched by name (unique in fit's graphs); the rewrite's new ones are
    appended to `graph`'s table."""
    index = {t.name: t.index for t in graph.tensors}
    tensors = list(graph.tensors)
    remap: dict[int, int] = {}
    for op in v.graph.ops:
        for t in (*op.inputs, *op.outputs, *op.intermediates):
            if t < 0 or t in remap:
                continue
            name = v.graph.tensors[t].name
            if name not in index:
                index[name] = len(tensors)
                tensors.append(replace(v.graph.tensors[t], index=len(tensors)))
            remap[t] = index[name]

    def moved(ts):
        return tuple(remap[t] if t >= 0 else t for t in ts)

    new_ops = [replace(op, inputs=moved(op.inputs), outputs=moved(op.outputs), intermediates=moved(op.intermediates))
               for op in v.graph.ops]
    old = {i for s in spans[v.first:v.last + 1] for i in s.ops}
    at = min(old)
    ops = [*graph.ops[:at], *new_ops, *(op for i, op in enumerate(graph.ops) if i > at and i not in old)]
    out = replace(graph, tensors=tuple(tensors), ops=tuple(ops))
    written = [t for op in out.ops for t in op.outputs if t >= 0]
    if len(written) != len(set(written)) or not out.is_topological(list(range(len(out.ops)))):
        raise ValueError(f"the rewrite of spans {v.first}-{v.last} does not splice into this graph")
    return out


MAX_TWINS = 6  # kernel twins per variant: each changes the ops at its predecessor's peak


def kernel_twins(v: Variant, device: Device, sem: Semantics) -> list[Variant]:
    """Kernel variants of measured variant `v`, in its own op order: at its peak step, the op that
    runs there overlaps its output with its input where that is legal (cheap: a copy per output
    row; an ADD or MUL simply runs in place), else the int8 convolutions whose im2col scratch is part of the peak move to the direct
    kernel (no scratch, slower); again while that lowers the peak. Each step is a twin with a lower
    peak and a higher latency. The order is kept (it stays valid, and its peak is achievable);
    `lower_bound` is the order-free bound."""
    g, out, moved = v.graph, [], dict(v.kernels)
    for _ in range(MAX_TWINS):
        lt = lifetimes(g, None, sem)
        live = lt.live_bytes()
        peak = achievable_peak(g, sem)
        at_peak = {s - 1 for s, x in enumerate(live) if x == peak and s >= 1}  # op i runs at step i + 1
        tried = None
        overlap = {i for i in at_peak if is_harness(g.ops[i]) and OVERLAP not in flags(g.ops[i])
                   and overlap_legal(g, i)}
        # (a TPUP_MUL goes back to the builtin, in place; a TPUP_ADD stays on the harness, in place)
        in_place = {i for i in at_peak if (not g.ops[i].kernel or g.ops[i].opcode in MEAN_MUL)
                    and not runs_in_place(g.ops[i]) and in_place_source(g, i) is not None}
        direct = {b.op for b in lt.buffers if b.tensor is None and not b.members and live[b.first] == peak
                  and DIRECT not in flags(g.ops[b.op]) and can_run_direct(g, b.op)}
        for ops, apply in ((overlap | in_place, lambda: with_in_place(with_flag(g, overlap, OVERLAP), in_place)),
                           (direct, lambda: _on_direct(g, direct))):
            if ops:
                cand = apply()
                if achievable_peak(cand, sem) < peak:
                    tried = cand, ops
                    break
        if tried is None:
            break
        g, ops = tried
        new_peak = achievable_peak(g, sem)
        moved.update({g.tensors[g.ops[i].outputs[0]].name: g.ops[i].kernel for i in ops})
        lat, work = _costed(g, device, sem)
        n_overlap = sum(OVERLAP in k for k in moved.values())
        n_in_place = sum(k in (IN_PLACE, HARNESS_IN_PLACE) for k in moved.values())
        n_direct = sum(DIRECT in k for k in moved.values())
        what = ", ".join(x for x in (f"{n_overlap} overlapped" if n_overlap else "",
                                     f"{n_in_place} in place" if n_in_place else "",
                                     f"{n_direct} direct" if n_direct else "") if x)
        out.append(replace(v, peak=new_peak, lower_bound=min(new_peak, order_free_lower_bound(g, sem)),
                           latency_s=lat, graph=g, kernels=tuple(sorted(moved.items())), label=f"{v.label}, {what}",
                           tail=_tail(g, sem), searched=False))
    return out


def _on_direct(g: Graph, ops) -> Graph:
    """`g` with `ops` on the direct kernel (no buffer); an op on a variant that asks for a buffer of
    its own (dw3's, arena scratch) leaves that variant, which would otherwise keep its buffer."""
    for i in sorted(ops):
        v = variant_of(g.ops[i])
        rest = flags(g.ops[i]) - ({v.flag} if v is not None and v.scratch is not None else set())
        g = with_kernel(g, [i], kernel_name(*rest, DIRECT))
    return g


def lean_twins(v: Variant, device: Device, sem: Semantics) -> list[Variant]:
    """`v` without the kernel variants that read a constant of their own (packed's re-laid
    weights: an eval tensor and an input slot in TFLite Micro's tail, 16 bytes): the same order,
    those ops on `lean_kernel`, a smaller tail, slower (and without packed, a first convolution
    may ask for an im2col buffer: a higher peak, which pays where its span is not at the
    selection's peak). The memory objective never pays tail bytes for speed: the selection takes
    this twin where the bytes count."""
    at = _with_constant_input(v.graph)
    if not at:
        return []
    g = lean_graph(v.graph)
    moved = dict(v.kernels) | {g.tensors[g.ops[i].outputs[0]].name: g.ops[i].kernel for i in at}
    peak, tail = achievable_peak(g, sem), _tail(g, sem)
    if tail >= v.tail:
        return []
    lat, _ = _costed(g, device, sem)
    dropped = "/".join(sorted({variant_of(v.graph.ops[i]).flag for i in at}))
    return [replace(v, peak=peak, lower_bound=min(peak, order_free_lower_bound(g, sem)), latency_s=lat, graph=g,
                    kernels=tuple(sorted(moved.items())), tail=tail, lean_of=v, searched=False,
                    label=f"{v.label}, {len(at)} without {dropped}")]


def _with_constant_input(graph: Graph) -> list[int]:
    """The ops on a kernel variant that reads a constant of its own."""
    return [i for i, op in enumerate(graph.ops) if (k := variant_of(op)) is not None and k.constant_input is not None]


def lean_graph(graph: Graph) -> Graph:
    """`graph` with no op on a kernel variant that reads a constant of its own (`lean_kernel`)."""
    for i in _with_constant_input(graph):
        graph = with_kernel(graph, [i], lean_kernel(graph, i))
    return graph


def lean_kernel(graph: Graph, i: int) -> str:
    """The kernel of harness op i without its variant that reads a constant of its own: the
    first other registered variant that needs none and wins there, else the kernel set's paths."""
    op = graph.ops[i]
    own = variant_of(op)
    rest = flags(op) - {own.flag}
    other = next((f for f, k in kernel_variants.registered().items()
                  if k.constant_input is None and k.opcode == op.opcode and can_run_variant(graph, i, f)
                  and k.wins(graph, i)), None)
    return kernel_name(*rest, *((other,) if other else ()))


def twins_of(v: Variant, device: Device, sem: Semantics) -> list[Variant]:
    """The kernel twins of measured variant `v` (`kernel_twins`), the lean twin of it and of each
    (`lean_twins`), and the kernel twins of its lean twin (without packed's constant, a first
    convolution at the peak needs the direct kernel's no-im2col to keep its bytes)."""
    twins = kernel_twins(v, device, sem)
    lean = lean_twins(v, device, sem)
    return (twins + lean + [t for w in twins for t in lean_twins(w, device, sem)]
            + [t for w in lean for t in kernel_twins(w, device, sem)])


def patch_candidates(graph: Graph, spans: list[Span], as_is: list[Variant], harness: bool = False,
                     twins: list[Variant] = (), tails: bool = False) -> list[Variant]:
    """Every patch variant of every legal region whose peak could drop, at stage "bound": its
    peak and latency are floors no grid can beat (copies: the spans' own latency; for copies the output
    assembled next to its tiles and the input held, for a stage its input and output together).
    With `harness`, regions whose ops a patch stage runs (ir.stage) are offered as stages too, on
    finer grids than copies allow. `upgrade` refines the ones a selection picks. `twins`: the
    spans' kernel twins, whose tails (lean twins: no variant constants) lower the copies' floor.
    `tails`: the selection counts the tail (whole arena), so a region whose peak no grid lowers is
    still offered where its tail floor is below the spans' least tail (a stage is one op node)."""
    out = []
    least_tail = [v.tail for v in as_is]
    for t in twins:
        if t.first == t.last:
            least_tail[t.first] = min(least_tail[t.first], t.tail)
    for region, a, b in _regions_on_spans(graph, spans, patch_regions(graph)):
        covered = max(v.peak for v in as_is[a:b + 1])
        lat = sum(v.latency_s for v in as_is[a:b + 1])
        work = sum(v.macs for v in as_is[a:b + 1])
        positions = [i for s in spans[a:b + 1] for i in s.ops]
        forms = ["copies"]
        if harness and stage_refusal(graph, positions) is None:
            forms.append("stage")
        for form in forms:
            floor = _region_floor(graph, region, form)
            # a tail no grid can beat: the spans' ops once (copies repeat them), or one stage op
            tail = sum(least_tail[a:b + 1]) if form == "copies" else _stage_tail_floor(graph, positions)
            if floor >= covered and not (tails and tail < sum(least_tail[a:b + 1])):
                continue  # no grid can lower the peak (nor the tail) of these spans: dominated by them as is
            # a latency no grid can beat: copies run every op at least once; a stage's layers pay no
            # per-op overhead and a streamed one computes every row once, so it can beat the spans
            # as they are (the reference kernels' stripes do): its floor comes with its estimate
            floor_s = lat if form == "copies" else 0.0
            grids = [(g, False) for g in square_grids(region.max_grid)] if form == "copies" \
                else stage_grids(_stage_max_grid(graph, region), _stage_out_hw(graph, region))
            if floor >= covered:  # for its tail alone (no grid goes below the spans' peak): streamed
                grids = [(g, r) for g, r in grids if not r]  # (recomputing ones are kept only where smaller)
            for grid, recompute in grids:
                if form == "copies" and grid[0] * grid[1] * len(positions) > MAX_PATCH_OPS:
                    break  # finer grids only copy more ops
                out.append(Variant(a, b, "patch", _patch_label(region, grid, form, recompute), floor, floor, floor_s,
                                   work, 0, region, grid, stage="bound", form=form, tail=tail, recompute=recompute))
    return out


def upgrade(graph: Graph, spans: list[Span], v: Variant, op_seconds: dict[int, float], device,
            sem: Semantics, regions: dict | None = None) -> Variant | None:
    """The next stage of a patch variant: "bound" -> "estimate" (tile geometry, estimate.py) ->
    "measured" (built on its spans: the peak of the patch-by-patch order it is emitted in, which is
    achievable, the device model's latency of the built ops, MACs, ops). None when the variant
    does not exist after all (a grid too fine for the region's windows): the caller drops it.
    `regions`: a dict the caller keeps, (first, last, form) -> the RegionGeometry, which every
    grid of the region shares (and "layers" -> fit.staged's memo of ops staged, which every region
    shares)."""
    positions = [i for s in spans[v.first:v.last + 1] for i in s.ops]
    tin, tout = spans[v.first].inputs[0], spans[v.last].outputs[0]
    if v.stage == "bound":
        geo = None if regions is None else regions.get((v.first, v.last, v.form))
        if geo is None:
            geo = _region_geometry(graph, spans, v, positions, op_seconds, device, sem, regions)
            if regions is not None:
                regions[(v.first, v.last, v.form)] = geo
        est = estimate_patches(graph, tin, tout, positions, v.grid, op_seconds, stage=v.form == "stage", geometry=geo,
                               streamed=not v.recompute)
        if est is None or v.recompute and not _smaller_than_streamed(graph, tin, tout, positions, v, op_seconds, geo, est):
            return None
        peak, work, lat = est
        tail = v.tail
        if v.form == "copies":
            if geo.copy_tail is not None:
                tail = max(tail, v.grid[0] * v.grid[1] * geo.copy_tail[0] + geo.copy_tail[1])
        peak = max(v.peak, peak)
        # a stage is one op: its one order's peak is what any order reaches, and the estimate its floor
        bound = max(v.lower_bound, peak) if v.form == "stage" else v.lower_bound
        return replace(v, peak=peak, lower_bound=bound, macs=work, latency_s=max(v.latency_s, lat), stage="estimate",
                       tail=tail)
    sub = span_graph(graph, spans[v.first:v.last + 1])
    try:
        if v.form == "stage":  # (a span graph keeps the graph's tensor table: the same indices)
            g = build_stage(sub, tin, tout, list(range(len(sub.ops))), v.grid, stream=not v.recompute)
        else:
            g = apply_patches(sub, v.region, v.grid)
    except UsageError:
        return None
    lat, work = _costed(g, device, sem)
    # (its order-free lower bound is computed only where it can matter: `refine`)
    peak = lifetimes(g, None, sem).peak
    one_op = len(g.ops) == 1  # (a stage: its only order is the best one)
    return replace(v, peak=peak, latency_s=lat, macs=work, ops=len(g.ops), graph=g, stage="measured",
                   tail=_tail(g, sem), lower_bound=peak if one_op else v.lower_bound, ordered=v.ordered or one_op)


def _smaller_than_streamed(graph: Graph, tin: int, tout: int, positions, v: Variant, op_seconds, geo, est) -> bool:
    """Whether a stage recomputing its halos is estimated smaller than the same grid streamed (the
    streamed one computes less: a recomputing stage is kept only where it may save memory)."""
    twin = estimate_patches(graph, tin, tout, positions, v.grid, op_seconds, stage=True, geometry=geo)
    return twin is None or est[0] < twin[0]


def _region_geometry(graph: Graph, spans: list[Span], v: Variant, positions, op_seconds, device, sem: Semantics,
                     regions: dict | None = None):
    """What every grid of `v`'s region and form shares (estimate.RegionGeometry): for a stage its
    layers' kernel buffers as the stage asks them (unaligned) and its pricing; for copies the tail
    every tile's copy of the ops brings. `regions`: the caller's dict, where the region's other
    form left its axes' needs."""
    tin, tout = spans[v.first].inputs[0], spans[v.last].outputs[0]
    other = None if regions is None else regions.get((v.first, v.last, "copies" if v.form == "stage" else "stage"))
    axes = None if other is None else other.axes
    if v.form == "stage":
        layers = {} if regions is None else regions.setdefault("layers", {})
        return stage_geometry(graph, tin, tout, positions, op_seconds, device, sem, layers, axes)
    # (a variant's own buffer, dw3's, shrinks with the tile's map: counted as none, the estimate stays a floor)
    scratch = {i: 0 if (k := variant_of(graph.ops[i])) is not None and k.scratch is not None
               else sum(align(b, 16) for b in scratch_requests(graph, i, sem)) for i in positions}
    geo = RegionGeometry(graph, tin, tout, positions, op_seconds, scratch, axes=axes)
    # (the ops without kernel variants that bring constants of their own: a floor for lean twins too)
    geo.copy_tail = copies_tail(lean_graph(span_graph(graph, spans[v.first:v.last + 1])), sem)
    return geo


def _patch_label(region, grid, form: str = "copies", recompute: bool = False) -> str:
    how = ("" if recompute else " streamed") + " in one stage op" if form == "stage" else ""
    return f"patches {grid[0]}x{grid[1]}{how} from {short_name(region.input)} to {short_name(region.output)}"


def short_name(name: str, keep: int = 48) -> str:
    """A converter's fused tensor name ('a/b/Relu6;a/b/add;...') cut to its first part, quoted."""
    first = name.split(";")[0]
    return repr(first if len(first) <= keep else "..." + first[-keep:])


def refine(variants: list[Variant], budget: int, deadline: Deadline | None, sem: Semantics,
           below: int | None = None) -> list[Variant]:
    """Variants whose bound admits a peak within `budget` but whose emitted order does not reach it:
    ask the exact scheduler (within the deadline) for their true optimum, or with `below` for any
    order under it (all a selection under a budget needs to know: does the variant fit)."""
    out = []
    for v in variants:
        if v.kind == "patch" and v.graph is not None and budget < v.peak and not v.proven \
                and (deadline is None or not deadline.expired()):
            v = replace(v, lower_bound=max(v.lower_bound, order_free_lower_bound(v.graph, sem)))
        if v.kind == "patch" and v.graph is not None and v.lower_bound <= budget < v.peak \
                and (deadline is None or not deadline.expired()):
            v = best_order(v, sem, (deadline or Deadline(10.0)).sub(fraction=0.5), below)
        out.append(v)
    return out


def best_order(v: Variant, sem: Semantics, deadline: Deadline | None = None, below: int | None = None) -> Variant:
    """Measured patch variant `v` in the best order the exact scheduler finds within the deadline
    (its emitted order is achievable, not optimal), with the scheduler's lower bound. `below`: only
    an order under it is of interest (the scheduler stops at the first, or when none can exist)."""
    sched = schedule(v.graph, time_limit=None, deadline=deadline or Deadline(10.0), semantics=sem, below=below)
    if sched.peak < v.peak:
        v = replace(v, peak=sched.peak, graph=v.graph.reordered(sched.order))
    return replace(v, lower_bound=min(v.peak, max(v.lower_bound, sched.lower_bound)), ordered=True,
                   searched=v.searched or below is None)


def _regions_on_spans(graph: Graph, spans: list[Span], regions):
    """(region, first span, last span) for regions whose boundary tensors are span boundaries and
    whose ops are exactly those spans' ops."""
    by_name = {t.name: t.index for t in graph.tensors}
    starts = {s.inputs[0]: s.index for s in spans if len(s.inputs) == 1}
    ends = {s.outputs[0]: s.index for s in spans if len(s.outputs) == 1}
    first_out = {graph.tensors[op.outputs[0]].name: i for i, op in enumerate(graph.ops) if op.outputs}
    for r in regions:
        a, b = starts.get(by_name.get(r.input, -1)), ends.get(by_name.get(r.output, -1))
        if a is None or b is None or a > b:
            continue
        ops = {first_out.get(name) for name in r.ops}
        if ops == {i for s in spans[a:b + 1] for i in s.ops}:
            yield r, a, b


def _region_floor(graph: Graph, region, form: str = "copies") -> int:
    """A peak no grid can go below. Copies: the final assembly holds the output tiles and the output
    (2x the output), and the region's input is live until its last patch is cut from it. A stage:
    its input (unless the application keeps it outside the arena) and its output, together."""
    by_name = {t.name: t for t in graph.tensors}
    inp, out = by_name[region.input], by_name[region.output]
    held = 0 if inp.index in graph.external else align(inp.nbytes, 16)
    if form == "stage":
        return held + align(out.nbytes, 16)
    return max(held, 2 * align(out.nbytes, 16))


def achievable_peak(graph: Graph, sem) -> int:
    """The arena a variant's ops take in their order: the most bytes live at a step, which the
    planner reaches on nearly every graph; with overlapped ops (rigid groups of buffers at fixed
    offsets from each other) it often cannot, so those graphs are planned and the plan's size is
    the figure (a small graph: CP-SAT settles it in well under a second)."""
    lt = lifetimes(graph, None, sem)
    if not any(b.group >= 0 for b in lt.buffers):
        return lt.peak
    return plan_arena(lt, "auto", GROUP_PLAN_SECONDS).size


def _tail(graph: Graph, sem: Semantics) -> int:
    """The tail a variant's ops bring (0 where an op's allocations are not modelled: fit then
    selects on the head; see fit_graph)."""
    return ops_tail(graph, sem) or 0


def _stage_tail_floor(graph: Graph, positions) -> int:
    """A stage's tail: one node, the eval tensors of its output and of the constants it reads, and
    its one scratch handle (it always asks for its tiles' buffers: memory.scratch). A layer keeps
    its variant's constant input only where the stage runs that variant (stage_layers)."""
    consts = set()
    for i in positions:
        op = graph.ops[i]
        v = variant_of(op)
        keep = op.inputs if v is not None and v.in_stages else op.inputs[:4]
        consts |= {t for t in keep if t >= 0 and graph.tensors[t].is_constant}
    return _NODE + _EVAL_TENSOR * (1 + len(consts)) + _SCRATCH_HANDLE


def _stage_out_hw(graph: Graph, region) -> tuple[int, int]:
    return hw(graph, {t.name: t.index for t in graph.tensors}[region.output])


def _stage_max_grid(graph: Graph, region) -> tuple[int, int]:
    """A stage joins nothing: its grid is limited by the output's size only (up to MAX_STAGE_GRID)."""
    oh, ow = _stage_out_hw(graph, region)
    return min(MAX_STAGE_GRID, oh), min(MAX_STAGE_GRID, ow)

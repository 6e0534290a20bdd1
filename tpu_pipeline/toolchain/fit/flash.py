"""Which ops keep their weights re-laid in flash when the board's flash cannot hold them all.

The harness's fastest kernels for some ops read weights re-laid offline, a constant of the op's
own written into the model beside its int8 weights (the kernel variants with a `constant_input`:
pointwise16, packed, window; TPUP_FULLY_CONNECTED's packed input 3). Where the written model
exceeds the flash a board leaves for it, fit keeps the re-laid weights of the ops that save the
most predicted time for their flash and lets the others run their kernel without them (the next
variant that wins there, or the builtin): a 0/1 knapsack, `choose_relaid`, over `relaid_items`.
The choice is a set of op names (`FitParams.relaid_weights`, read by ir/kernels.relaid_allowed).
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
from tpu_pipeline.toolchain.cpsat import new_solver
from tpu_pipeline.toolchain.device import Device, KernelSet
from tpu_pipeline.toolchain.fit.variants import lean_kernel
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.ir import fully_connected as fc, stage
from tpu_pipeline.toolchain.ir.kernels import is_harness, variant_of, with_kernel

# A constant tensor's bytes in the flatbuffer besides its data (and its name): the Tensor and
# Buffer tables, the shape and data vectors' lengths, the data's alignment to 16 bytes.
ENTRY_BYTES = 96
KNAPSACK_SECONDS = 2.0  # CP-SAT proves the optimum of ~100 items in milliseconds


@dataclass(frozen=True)
class Relaid:
    name: str  # the op's first output (unique in fit's graphs): what `relaid_allowed` matches
    constant: str  # the re-laid weights' tensor name
    extra: int  # flash bytes the re-laid weights add: their tensor, less what the op stops reading
    saved: float  # predicted cycles per inference they save over the op's kernel without them


@dataclass(frozen=True)
class FlashChoice:
    kept: frozenset[str]  # names of the ops that keep their re-laid weights
    items: tuple[Relaid, ...]
    room: int  # flash bytes the kept re-laid weights may take
    exact: bool  # the knapsack's optimum, proven (else the best of CP-SAT's and the greedy's)
    all_relaid_bytes: int | None = None  # the model with every op's re-laid weights (measured or predicted)

    @property
    def kept_bytes(self) -> int:
        return sum(r.extra for r in self.items if r.name in self.kept)

    @property
    def saved(self) -> float:
        return sum(r.saved for r in self.items if r.name in self.kept)


def relaid_items(harness_graph: Graph, device: Device, kernels: KernelSet) -> list[Relaid]:
    """One item per op of `harness_graph` (fit's `on_harness` with every re-laid kernel allowed)
    that runs on re-laid weights: their flash bytes and the cost model's cycles they save (each op
    priced once with them and once on its kernel without them, `_without_relaid`)."""
    ops = [i for i, op in enumerate(harness_graph.ops) if _constant(op) is not None]
    if not ops:
        return []
    lean = _without_relaid(harness_graph, ops)
    with_, without = estimate_mcu(harness_graph, device, kernels), estimate_mcu(lean, device, kernels)
    g, out = harness_graph, []
    for i in ops:
        c = g.tensors[_constant(g.ops[i])]
        gone = {t for t in lean.ops[i].inputs if t >= 0 and g.tensors[t].is_constant} - set(g.ops[i].inputs)
        freed = sum(_entry(g.tensors[t]) for t in gone if not any(t in op.inputs for op in lean.ops))
        out.append(Relaid(g.tensors[g.ops[i].outputs[0]].name, c.name, _entry(c) - freed,
                          without.ops[i].cycles - with_.ops[i].cycles))
    return out


def choose_relaid(items: list[Relaid], room: int, all_relaid_bytes: int | None = None) -> FlashChoice:
    """The ops whose re-laid weights fit in `room` bytes together at the most cycles saved.

    A 0/1 knapsack. The greedy order (most cycles saved per byte first) is the optimum of its
    fractional relaxation, not of the 0/1 problem: it can miss up to one item's value, the first
    that does not fit, and the items span three orders of magnitude (a stem's packed weights,
    1 KB; a classifier's re-laid FC, 780 KB on mcunetv2_large), so that item can be much of the
    answer. On mcunetv2_large the greedy is close (at the an386's flash it keeps the optimum's
    93.3 % of the saving; over rooms of 1-99 % of the re-laid bytes it falls short by at most 0.8 %
    of the total), but CP-SAT proves the exact optimum of these few dozen items in 16 ms, so it
    decides, started from the greedy's answer; only if it stops unproven does the better of the two
    stand (`exact` False). Items that save nothing by the cost model are never kept."""
    useful = [r for r in items if r.saved > 0 and r.extra <= room]
    greedy = _greedy(useful, room)
    if not useful:
        return FlashChoice(frozenset(), tuple(items), room, True, all_relaid_bytes)
    m = cp_model.CpModel()
    x = [m.NewBoolVar(r.name) for r in useful]
    m.Add(sum(r.extra * v for r, v in zip(useful, x)) <= room)
    m.Maximize(sum(round(r.saved) * v for r, v in zip(useful, x)))
    for r, v in zip(useful, x):
        m.AddHint(v, r.name in greedy)
    solver = new_solver(KNAPSACK_SECONDS)
    status = solver.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return FlashChoice(greedy, tuple(items), room, False, all_relaid_bytes)
    found = frozenset(r.name for r, v in zip(useful, x) if solver.Value(v))
    if status != cp_model.OPTIMAL and _value(useful, greedy) > _value(useful, found):
        found = greedy
    return FlashChoice(found, tuple(items), room, status == cp_model.OPTIMAL, all_relaid_bytes)


def relaid_constants(graph: Graph) -> set[str]:
    """The names of the re-laid weights a fitted graph's ops read (a patch stage's layers
    included; patch copies read their op's one tensor, so each counts once)."""
    names = set()
    for op in graph.ops:
        if stage.is_stage(op):
            names |= relaid_constants(op.options.body)
        elif (c := _constant(op)) is not None:
            names.add(graph.tensors[c].name)
    return names


def _greedy(items: list[Relaid], room: int) -> frozenset[str]:
    """Most cycles saved per byte first, each taken while it fits (ties: the smaller first)."""
    kept, left = [], room
    for r in sorted(items, key=lambda r: (-r.saved / max(r.extra, 1), r.extra, r.name)):
        if r.extra <= left:
            kept.append(r.name)
            left -= r.extra
    return frozenset(kept)


def _value(items: list[Relaid], kept: frozenset[str]) -> float:
    return sum(r.saved for r in items if r.name in kept)


def _constant(op) -> int | None:
    """The tensor of an op's re-laid weights (None: it reads none)."""
    if not is_harness(op):
        return None
    if op.opcode == fc.OPCODE:
        return op.inputs[3] if len(op.inputs) > 3 and op.inputs[3] >= 0 else None
    v = variant_of(op)
    if v is None or v.constant_input is None or len(op.inputs) < 5 or op.inputs[4] < 0:
        return None
    return op.inputs[4]


def _without_relaid(graph: Graph, ops: list[int]) -> Graph:
    """`graph` with ops `ops` on their kernel without re-laid weights: a variant's on the next one
    that wins there (fit/variants.lean_kernel, what `winning_variant` then picks), a fully
    connected op on the builtin."""
    for i in ops:
        graph = with_kernel(graph, [i], "" if graph.ops[i].opcode == fc.OPCODE else lean_kernel(graph, i))
    return graph


def _entry(t) -> int:
    return t.nbytes + len(t.name.encode()) + ENTRY_BYTES


@dataclass(frozen=True)
class FlashReport:
    """The written model against the board's flash (fit's JSON `flash`)."""
    model_bytes: int
    available_bytes: int  # flash - the harness firmware's code
    relaid_ops: int  # ops whose fastest kernel reads re-laid weights
    relaid_kept: int  # ... and read them in the written model
    relaid_bytes: int  # the flash those take (their tensors, with their entries)
    all_relaid_bytes: int | None = None  # the model with every op's re-laid weights, where it would not fit
    room: int | None = None  # the flash the knapsack gave the re-laid weights (None: nothing had to go)
    exact: bool | None = None  # the kept set is the knapsack's proven optimum

    def to_json(self) -> dict:
        return {"model_bytes": self.model_bytes, "available_bytes": self.available_bytes,
                "fits": self.model_bytes <= self.available_bytes, "relaid_ops_kept": self.relaid_kept,
                "relaid_ops_dropped": self.relaid_ops - self.relaid_kept, "relaid_bytes_kept": self.relaid_bytes,
                "model_bytes_all_relaid": self.all_relaid_bytes, "relaid_room_bytes": self.room,
                "relaid_choice_exact": self.exact}


def flash_report(graph: Graph, model_bytes: int, available: int, choice: FlashChoice | None = None) -> FlashReport:
    """`FlashReport` of a fitted graph written as `model_bytes`; `choice`: the knapsack's, where
    the model with every op's re-laid weights would not fit."""
    names = relaid_constants(graph)
    kept = sum(_entry(t) for t in graph.tensors if t.name in names and t.is_constant)
    if choice is None:
        return FlashReport(model_bytes, available, len(names), len(names), kept)
    return FlashReport(model_bytes, available, max(len(choice.items), len(names)), len(names), kept,
                       choice.all_relaid_bytes, choice.room, choice.exact)

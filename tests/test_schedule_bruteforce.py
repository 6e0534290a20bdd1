"""The scheduler and each of its parts against an exact brute-force oracle on random DAGs.

The oracle is independent of `tpu_pipeline.toolchain.schedule.model`: it evaluates the live bytes of a step
straight from the lifetime rules of `tpu_pipeline.toolchain.memory.lifetimes` (pinned to it by a test here),
and finds the optimum by a DP over (set of executed ops, which in-place ops shared). Under TFLite
the buffer sharing of reshape-like ops depends on the order when the input has other readers; the
extra state makes the DP exact there too.

Every guard that restricts fusion (Rules B and C), free moves, forced cuts and the lower bounds
was removed one at a time and this module was checked to fail (see `MUTATIONS` and
`test_every_mutation_is_caught`, which reruns that check on a copy of the package).

Fast run: `pytest tests/test_schedule_bruteforce.py`; more examples: add `-m slow`.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, currently_in_test_context, given, note, settings
from hypothesis import strategies as st

from tpu_pipeline.toolchain.ir import Graph, Op, Tensor
from tpu_pipeline.toolchain.memory import lifetimes, order_free_lower_bound
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import align, get_semantics
from tpu_pipeline.toolchain.schedule import ScheduleParams, bounds, build_model, heuristics, schedule
from tpu_pipeline.toolchain.schedule.beam import beam_order
from tpu_pipeline.toolchain.schedule.bounds.branching import branch_lower_bound
from tpu_pipeline.toolchain.schedule.bounds.mincut import cut_lower_bound
from tpu_pipeline.toolchain.schedule.bounds.static import model_lower_bound, static_lower_bound
from tpu_pipeline.toolchain.schedule.divide import pieces, unit_dag
from tpu_pipeline.toolchain.schedule import native_search
from tpu_pipeline.toolchain.schedule.dives import dive
from tpu_pipeline.toolchain.schedule.dp import best_first
from tpu_pipeline.toolchain.schedule.fusion import fuse
from tpu_pipeline.toolchain.schedule.model import bits, is_topological
from tpu_pipeline.toolchain.schedule.problem import BoundQuery, Piece

INF = float("inf")
# The exact search runs in C when a compiler is here (_best_first.c) and in Python otherwise:
# both are checked against the oracle.
NATIVE = (True, False) if native_search.available() else (False,)

# ---- random graphs -------------------------------------------------------------------------

SIZES = [0, 1, 16, 16, 17, 48, 64, 64, 65, 100, 128, 128, 200, 256, 512, 1000]
OPCODES = ["ADD", "CONV_2D", "TRANSPOSE_CONV", "RESHAPE", "SQUEEZE", "CONCATENATION"]


@st.composite
def dags(draw, max_ops: int = 12, min_ops: int = 0) -> Graph:
    """Single-subgraph DAGs with the corners the scheduler must get right: zero-size and
    equal-size tensors, ops with several (or dead) outputs, graph inputs that appear mid-graph,
    graph outputs that are also read, tensors read by many ops, repeated inputs, constants,
    scratch (TRANSPOSE_CONV under tflm), in-place-capable ops (tflite), graph outputs that no op
    touches, graph inputs that are outputs or never read, and tensors read but never written."""
    n = draw(st.integers(min_ops, max_ops))
    tensors: list[Tensor] = []
    size = st.sampled_from(SIZES)

    def new(sz, const=False):
        data = np.zeros(4, np.int8) if const else None
        tensors.append(Tensor(len(tensors), f"t{len(tensors)}", "int8", (sz,), data=data))
        return len(tensors) - 1

    inputs = [new(draw(size)) for _ in range(draw(st.integers(0, 2)))]
    available = list(inputs)
    hub = draw(st.booleans())  # favour one tensor read by many ops
    const = new(4, const=True)
    if draw(st.integers(0, 9)) == 0:
        available.append(new(draw(size)))  # read but never written, not a graph input
    ops = []
    for i in range(n):
        if draw(st.integers(0, 5)) == 0:
            t = new(draw(size))  # a graph input first needed mid-graph
            inputs.append(t)
            available.append(t)
        ins = []
        if available:
            k = draw(st.integers(0 if i else 1, min(3, len(available))))
            pool = st.sampled_from(available)
            if hub:
                pool = st.one_of(st.just(available[0]), pool)
            ins = draw(st.lists(pool, min_size=min(k, 1), max_size=k))
        if draw(st.booleans()):
            ins.append(const)
        opcode = draw(st.sampled_from(OPCODES))
        outs = tuple(new(draw(size)) for _ in range(draw(st.integers(1, 3))))
        ops.append(Op(opcode, tuple(ins), outs, source=i))
        available.extend(outs)
    produced = [t for op in ops for t in op.outputs]
    outputs = draw(st.lists(st.sampled_from(produced), max_size=3, unique=True)) if produced else []
    extra = draw(st.integers(0, 12))
    if extra == 0:
        outputs.append(new(draw(size)))  # a graph output no op touches
    elif extra == 1 and inputs:
        outputs.append(inputs[0])  # a graph input that is also an output
    elif extra == 2:
        inputs.append(new(draw(size)))  # a graph input nobody reads
    return Graph(tuple(tensors), tuple(ops), tuple(inputs), tuple(outputs), "random")


# ---- the oracle ----------------------------------------------------------------------------


class Oracle:
    """Exact live bytes and optimum from the lifetime rules, without `MemModel`."""

    def __init__(self, graph: Graph, semantics: str):
        sem = get_semantics(semantics)
        self.graph, self.sem = graph, sem
        self.n = n = len(graph.ops)
        self.full = (1 << n) - 1
        act = graph.is_activation
        touch: dict[int, int] = {}
        for i, op in enumerate(graph.ops):
            for t in (*op.inputs, *op.outputs):
                if act(t):
                    touch[t] = touch.get(t, 0) | 1 << i
        ins = {t for t in graph.inputs if act(t)}
        outs = {t for t in graph.outputs if act(t)}
        self.tensors = sorted(set(touch) | ins | outs)
        self.touch = touch
        self.ins = ins
        self.size = {t: align(graph.tensors[t].nbytes, sem.alignment) for t in self.tensors}
        self.pinned_end = {t: t in outs or (sem.inputs_live_whole_run and t in ins) for t in self.tensors}
        self.scratch = [sum(align(x, sem.alignment) for x in scratch_requests(graph, i, sem)) for i in range(n)]
        self.preds = [sum(1 << p for p in graph.preds[i]) for i in range(n)]
        # in-place candidates: op -> (src, dst)
        self.inplace = {}
        for i, op in enumerate(graph.ops):
            if op.opcode in sem.in_place_ops and op.inputs and op.outputs:
                src, dst = op.inputs[0], op.outputs[0]
                if act(src) and act(dst) and src not in outs and src not in ins:
                    self.inplace[i] = (src, dst)

    def shares(self, v: int, S: int, shared: int) -> bool:
        """Does in-place op v, run right after the ops in S, reuse its input's buffer?"""
        if v not in self.inplace:
            return False
        src, dst = self.inplace[v]
        if self.touch.get(src, 0) & ~(S | 1 << v):
            return False  # the input is read later: it does not die here
        src_size = self.size[src]
        if any(self.inplace[r][1] == src for r in bits(shared)):
            src_size = 0  # the input already lives in another buffer
        return src_size >= self.size[dst]

    def live(self, v: int, S: int, shared: int) -> int:
        """Bytes live at v's step, run after the ops in S; `shared` includes v if it shares."""
        after = S | 1 << v
        zero = {self.inplace[r][1] for r in bits(shared)}
        extend = {self.inplace[r][0]: self.inplace[r][1] for r in bits(shared)}
        total = self.scratch[v]
        for t in self.tensors:
            if t in zero or not self.size[t]:
                continue
            m = self.touch.get(t, 0)
            started = t in self.ins or m & after or (not m and after == self.full)
            ends_later = self.pinned_end[t] or m & ~S
            if not ends_later and t in extend:
                d = extend[t]
                ends_later = self.pinned_end[d] or self.touch.get(d, 0) & ~S
            if started and ends_later:
                total += self.size[t]
        return total

    def step0(self) -> int:
        live = sum(self.size[t] for t in self.ins)
        if self.n == 0:  # graph outputs nobody writes are live at the last step, here step 0
            live += sum(self.size[t] for t in self.tensors if t not in self.ins and self.pinned_end[t])
        return live

    def run(self, v, S, shared):
        if self.shares(v, S, shared):
            shared |= 1 << v
        return self.live(v, S, shared), S | 1 << v, shared

    def peak(self, order) -> int:
        best, S, sh = self.step0(), 0, 0
        for v in order:
            live, S, sh = self.run(v, S, sh)
            best = max(best, live)
        return best

    def peak_from(self, order, start) -> int:
        """Peak over the steps of `order` run after start = (S0, shared); step 0 iff S0 empty."""
        S, sh = start
        best = self.step0() if S == 0 else 0
        for v in order:
            live, S, sh = self.run(v, S, sh)
            best = max(best, live)
        return best

    def state_after(self, prefix):
        S = sh = 0
        for v in prefix:
            _, S, sh = self.run(v, S, sh)
        return S, sh

    def optimum(self, units=None, start=(0, 0), within: int | None = None, sequence=None) -> float:
        """Least peak over the orders of the ops in `within` (default: all not in start) run after
        `start` = (S0, shared), each unit run back to back; step 0 counts iff S0 is empty.
        `sequence`: optional list of unit-index groups that must run one group after another.
        inf if no such order exists."""
        S0, sh0 = start
        within = (self.full & ~S0) if within is None else within
        if units is None:
            units = [(v,) for v in bits(within)]
        goal = S0 | within
        group_of = {}
        if sequence is not None:
            for gi, grp in enumerate(sequence):
                for k in grp:
                    group_of[k] = gi
        layer = {(S0, sh0): self.step0() if S0 == 0 else 0}
        for _ in range(len(units)):
            nxt: dict = {}
            for (S, sh), g in layer.items():
                if sequence is not None:
                    done = [k for k, u in enumerate(units) if (S >> u[0]) & 1]
                    cur = max((group_of[k] for k in done), default=0)
                    if any(group_of[k] < cur for k, u in enumerate(units) if not (S >> u[0]) & 1):
                        continue  # a group started before the previous one finished
                for k, u in enumerate(units):
                    if (S >> u[0]) & 1:
                        continue
                    S2, sh2, peak, ok = S, sh, g, True
                    for v in u:
                        if self.preds[v] & ~S2:
                            ok = False
                            break
                        live, S2, sh2 = self.run(v, S2, sh2)
                        peak = max(peak, live)
                    if not ok:
                        continue
                    if nxt.get((S2, sh2), INF) > peak:
                        nxt[(S2, sh2)] = peak
            layer = nxt
        return min((g for (S, _), g in layer.items() if S == goal), default=INF)


def model_optimum(model, units, S0: int = 0, within: int | None = None) -> float:
    """The same DP on `MemModel`'s own step function (its optimum, exact for the model)."""
    within = (model.full & ~S0) if within is None else within
    R0 = model.resident(S0) if S0 else model.r0
    layer = {S0: (model.step0 if S0 == 0 else 0, R0)}
    for _ in range(len(units)):
        nxt = {}
        for S, (g, R) in layer.items():
            for u in units:
                if (S >> u[0]) & 1:
                    continue
                S2, R2, peak, ok = S, R, g, True
                for v in u:
                    if model.preds[v] & ~S2:
                        ok = False
                        break
                    live, R2 = model.step(v, S2, R2)
                    S2 |= 1 << v
                    peak = max(peak, live)
                if ok and (S2 not in nxt or nxt[S2][0] > peak):
                    nxt[S2] = (peak, R2)
        layer = nxt
    return min((g for S, (g, _) in layer.items() if S == S0 | within), default=INF)


def random_topological(graph: Graph, rnd: random.Random) -> list[int]:
    preds = [set(p) for p in graph.preds]
    done: set[int] = set()
    order = []
    while len(order) < len(graph.ops):
        ready = [v for v in range(len(graph.ops)) if v not in done and preds[v] <= done]
        v = rnd.choice(ready)
        done.add(v)
        order.append(v)
    return order


def down_set(graph: Graph, rnd: random.Random, base=()) -> list[int]:
    """A random prefix of a random topological order that extends `base`."""
    order = list(base)
    done = set(order)
    preds = [set(p) for p in graph.preds]
    target = rnd.randint(len(order), len(graph.ops))
    while len(order) < target:
        ready = [v for v in range(len(graph.ops)) if v not in done and preds[v] <= done]
        v = rnd.choice(ready)
        done.add(v)
        order.append(v)
    return order


def mask(ops) -> int:
    return sum(1 << v for v in ops)


# ---- settings ------------------------------------------------------------------------------

FAST = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)
if os.environ.get("SCHEDULE_MUTATION_RUN"):  # the mutation check needs pass/fail, not a shrunk example
    FAST["phases"] = [Phase.explicit, Phase.generate]
SEMS = st.sampled_from(["tflm", "tflite"])


def fast(n):
    return settings(max_examples=n, **FAST)


def slow(n):
    return settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck))


def compact(graph: Graph) -> str:
    """The graph in one line per op, to read a failing example."""
    act = [t.index for t in graph.tensors if t.kind == "activation"]
    lines = ["sizes " + " ".join(f"t{t}={graph.tensors[t].nbytes}" for t in act),
             f"inputs {list(graph.inputs)} outputs {list(graph.outputs)}"]
    lines += [f"op{i} {op.opcode} {list(op.inputs)} -> {list(op.outputs)}" for i, op in enumerate(graph.ops)]
    return "\n".join(lines)


def check_everything(graph: Graph, semantics: str, rnd: random.Random, methods=("dp", "auto")):
    """Every property of this module on one graph."""
    if currently_in_test_context():
        note(compact(graph))
    oracle = Oracle(graph, semantics)
    model = build_model(graph, semantics)
    opt = oracle.optimum()
    check_oracle(graph, semantics, oracle, model, rnd)
    check_schedule(graph, semantics, oracle, model, opt, methods)
    check_parts(graph, semantics, oracle, model, opt, rnd)


def check_oracle(graph, semantics, oracle, model, rnd):
    for _ in range(3):
        order = random_topological(graph, rnd)
        assert oracle.peak(order) == lifetimes(graph, order, semantics).peak
        if model.exact and model.n:  # (no ops: `schedule` answers from lifetimes() directly)
            assert model.peak(order) == oracle.peak(order)


def dangling(graph) -> bool:
    """Some activation is read but neither written nor a graph input (CP-SAT does not model it)."""
    return any(t not in graph.producer and t not in graph.inputs
               for op in graph.ops for t in op.inputs if graph.is_activation(t))


def check_schedule(graph, semantics, oracle, model, opt, methods):
    variants = [(m, ()) for m in methods]
    variants += [("dp", (a,)) for a in ("fusion", "cuts", "free_moves", "cut_bound")]
    for method, off in variants:
        res = schedule(graph, method=method, time_limit=30, semantics=semantics,
                       params=ScheduleParams().without(*off))
        what = (method, off)
        assert graph.is_topological(res.order), what
        assert lifetimes(graph, res.order, semantics).peak == res.peak, what
        assert oracle.peak(res.order) == res.peak, what
        assert res.lower_bound <= opt <= res.peak, what
        if res.proven_optimal:
            assert res.peak == opt == res.lower_bound, what
        if model.exact and not (method == "cpsat" and dangling(graph)):
            # tiny graphs, ample time: the exact search must find and prove the optimum
            assert res.peak == opt and res.proven_optimal and res.lower_bound == opt, what
        elif not model.exact:
            assert not res.proven_optimal, what
    greedy = schedule(graph, method="greedy", semantics=semantics)
    assert greedy.lower_bound <= opt <= greedy.peak
    assert not greedy.proven_optimal or greedy.peak == opt
    for name, fn in heuristics.BASELINES.items():
        order = fn(model)
        assert is_topological(model, order) and graph.is_topological(order), name


def check_parts(graph, semantics, oracle, model, opt, rnd):
    # the order-free bounds
    assert order_free_lower_bound(graph, semantics) <= opt
    if not model.exact:
        # the scheduler searches a model of the order-dependent sharing: its parts are exact
        # for that model, checked against a DP on the model's own step function
        mopt = model_optimum(model, [(v,) for v in range(model.n)])
        units = fuse(model)
        assert model_optimum(model, units) == mopt
        return
    if model.n == 0:
        return  # nothing to fuse, cut or search
    assert model_lower_bound(model) <= opt
    singles = [(v,) for v in range(model.n)]
    whole = Piece(model, singles)
    check_registered_bounds(whole, opt)
    assert static_lower_bound(whole) <= opt
    assert cut_lower_bound(whole) <= opt
    assert branch_lower_bound(whole, time.monotonic() + 5, max_leaves=40) <= opt

    # fusion: units partition the ops, and the best order that keeps each unit contiguous is optimal
    units = fuse(model)
    assert sorted(v for u in units for v in u) == list(range(model.n))
    assert oracle.optimum(units) == opt, units

    # divide: cut pieces; each singleton piece really is a cut; keeping the pieces in sequence
    # loses nothing; the optimum is the max of the pieces' optima in context
    for us in (units, singles):
        plist = pieces(model, us)
        assert sorted(k for p in plist for k in p) == list(range(len(us))) and all(plist)
        preds, succs = unit_dag(model, us)
        anc, desc = closure(preds), closure(succs)
        full_u = (1 << len(us)) - 1
        before = 0
        for p in plist:
            for k in p:
                assert not anc[k] & ~before & ~mask(p), "a piece needs a later piece"
            if len(p) == 1:
                assert anc[p[0]] | desc[p[0]] | 1 << p[0] == full_u, "not a cut point"
            before |= mask(p)
        assert oracle.optimum(us, sequence=plist) == opt
        S, sh, worst = 0, 0, 0
        for p in plist:
            within = mask(v for k in p for v in us[k])
            pu = [us[k] for k in p]
            piece_opt = oracle.optimum(pu, (S, sh), within)
            worst = max(worst, piece_opt)
            check_piece(model, oracle, Piece(model, pu, S), (S, sh), within, pu, piece_opt)
            # the shared flags of an exact model do not depend on the order inside S
            S, sh = oracle.state_after(_prefix_of(oracle, S | within))
        assert worst == opt

    # bounds and the search in random contexts: ops after a random down-set, up to a later one
    for _ in range(2):
        prefix = down_set(graph, rnd)
        upto = down_set(graph, rnd, prefix)
        S0, S1 = mask(prefix), mask(upto)
        start = oracle.state_after(prefix)
        within = S1 & ~S0
        if not within:
            continue  # the scheduler never makes an empty piece
        pu = [(v,) for v in bits(within)]
        piece_opt = oracle.optimum(pu, start, within)
        check_piece(model, oracle, Piece(model, pu, S0), start, within, pu, piece_opt)
        # fused units of the context are still units of the whole fusion only if they fit:
        fitted = [u for u in units if mask(u) & within == mask(u)]
        if sum(len(u) for u in fitted) == len(pu):
            check_piece(model, oracle, Piece(model, fitted, S0), start, within, fitted, piece_opt)


def _prefix_of(oracle, S):
    """Some topological order of the ops in the down-set S."""
    order = []
    while mask(order) != S:
        done = mask(order)
        v = next(v for v in bits(S & ~done) if not oracle.preds[v] & ~done)
        order.append(v)
    return order


def closure(rel):
    """Transitive closure of per-unit bitsets."""
    out = list(rel)
    changed = True
    while changed:
        changed = False
        for k in range(len(out)):
            m = out[k]
            for j in bits(out[k]):
                m |= out[j]
            if m != out[k]:
                out[k] = m
                changed = True
    return out


def check_piece(model, oracle, piece, start, within, units, piece_opt):
    """Bounds and the best-first search (with and without free moves, under several floors) on
    one piece in context, against the oracle's optimum of that piece."""
    check_registered_bounds(piece, piece_opt)
    assert static_lower_bound(piece) <= piece_opt
    assert cut_lower_bound(piece) <= piece_opt
    assert cut_lower_bound(piece, floor=0) <= piece_opt
    assert branch_lower_bound(piece, time.monotonic() + 5, max_leaves=40) <= piece_opt
    if not units:
        return
    order = [v for u in units for v in u]
    S0 = start[0]
    ub = piece.evaluate(order) if is_topological_after(model, order, S0) else None
    if ub is None:
        order = heuristics.greedy(model, units, S0, piece.R0)
        ub = piece.evaluate(order)
    assert ub >= piece_opt
    for floor, free, native in itertools.product(sorted({0, piece_opt // 2, max(piece_opt - 1, 0), piece_opt}),
                                                 (True, False), NATIVE):
        r = best_first(piece, ub + 1, floor, free_moves=free, native=native)
        what = (floor, free, native)
        assert r.complete and r.order is not None, what
        assert r.peak == piece.evaluate(r.order) == piece_opt, what
        assert r.lower_bound <= piece_opt, what
        assert is_topological_after(model, r.order, S0), what
        assert oracle.peak_from(r.order, start) == piece_opt, what
    # dives (dives.py): real orders only, and the bound they report is proven
    found, proven = dive(piece, ub + 1, static_lower_bound(piece), time.monotonic() + 5)
    assert proven <= piece_opt
    if found is not None:
        assert is_topological_after(model, found[0], S0) and piece.evaluate(found[0]) == found[1] >= piece_opt
    # beams (beam.py), also ranking under a proven floor: real orders with their real peak
    # (not the floor), never below the optimum
    for width, floor in itertools.product((1, 3), (0, piece_opt)):
        peaks = set()
        for native in NATIVE:
            found = beam_order(piece, width, time.monotonic() + 5, native=native, floor=floor)
            assert found is not None and is_topological_after(model, found[0], S0)
            assert sorted(found[0]) == sorted(v for u in units for v in u)
            assert piece.evaluate(found[0]) == found[1] >= piece_opt
            peaks.add(found[1])
        assert len(peaks) == 1, peaks  # C and Python keep the same sets at every level
    if ub > piece_opt:
        # with ub = the optimum nothing better exists: the search must prove that, not invent one
        for native in NATIVE:
            r = best_first(piece, piece_opt, 0, free_moves=True, native=native)
            assert r.order is None and r.lower_bound <= piece_opt


def check_registered_bounds(piece, piece_opt):
    """Every lower bound registered in bounds.PIECE_BOUNDS (a new one too) is below the optimum."""
    for bound in bounds.PIECE_BOUNDS:
        assert bound.compute(piece, BoundQuery(0, None, None)) <= piece_opt, bound.name


def is_topological_after(model, order, S0):
    S = S0
    for v in order:
        if model.preds[v] & ~S or (S >> v) & 1:
            return False
        S |= 1 << v
    return True


# ---- the tests -----------------------------------------------------------------------------


def random_wiring(n: int, seed: int) -> Graph:
    """A randomly wired DAG of n equal-size nodes (RELU or a 2-3 input ADD of earlier nodes),
    like a RandWire stage: every tensor the same size, so many partial orders tie."""
    rnd = random.Random(seed)
    tensors = [Tensor(0, "x", "int8", (64,))]
    ops = []
    for i in range(n):
        k = min(len(tensors), rnd.choice((1, 2, 2, 3)))
        reads = tuple(sorted(rnd.sample(range(max(0, len(tensors) - 6), len(tensors)), min(k, len(tensors)))))
        tensors.append(Tensor(len(tensors), f"t{i}", "int8", (64,)))
        ops.append(Op("RELU" if len(reads) == 1 else "ADD", reads, (len(tensors) - 1,)))
    read = {t for op in ops for t in op.inputs}
    outs = tuple(t for t in range(1, len(tensors)) if t not in read)
    return Graph(tuple(tensors), tuple(ops), (0,), outs, f"wired{seed}")


BEAMS_AT_A_TINY_CAP = """
import sys, time
from tpu_pipeline.toolchain.ir import Graph, Op, Tensor
from tpu_pipeline.toolchain.schedule import beam, build_model
from tpu_pipeline.toolchain.schedule.problem import Piece
from tpu_pipeline.toolchain.schedule.fusion import fuse

tensors = [Tensor(i, f"t{i}", "int8", (64,)) for i in range(7)]
ops = [Op("ADD", (0,), (1,)), Op("ADD", (0,), (2,)), Op("ADD", (0,), (3,)),
       Op("ADD", (1, 2), (4,)), Op("ADD", (3, 4), (5,)), Op("ADD", (1, 5), (6,))]
model = build_model(Graph(tuple(tensors), tuple(ops), (0,), (6,), "fork"))
piece = Piece(model, fuse(model)).use_lazy_slices()
assert len(piece.units) > 1
try:
    beam.beam_order(piece, 48 * 2**28, time.monotonic() + 5)  # 0 as a C int
    sys.exit("a width past a C int was run")
except beam.TooWide:
    pass
beam.MAX_BEAM_BYTES = 1024  # not even width 48 fits
t = time.monotonic()
found = beam.widening_beams(piece, 10**9, t + 5, 0)
print(found, time.monotonic() - t)
"""


def test_beams_stop_at_their_memory_cap():
    """When no beam fits MAX_BEAM_BYTES, beam.widening_beams stops at once. It used to keep doubling the
    width until, passed as a C int, it wrapped to 0 (48 * 2**28) and the C beam wrote into
    0-byte buffers: a heap corruption, seen as `fit` aborting on Xception ("munmap_chunk():
    invalid pointer"). In a child process, as a regression aborts it."""
    if not native_search.available():
        pytest.skip("no C compiler: the Python beam has no memory cap")
    proc = subprocess.run([sys.executable, "-c", BEAMS_AT_A_TINY_CAP], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found, seconds = proc.stdout.split()
    assert found == "None" and float(seconds) < 4, proc.stdout  # stopped, not spun to the deadline


def test_c_and_python_searches_agree_on_random_wirings():
    """The C and Python exact searches prove the same optimum, and the beams of each width and
    floor give the same peak (they keep the same sets at every level, ties included), on the example
    RandWire and on randomly wired graphs whose equal tensors make ties everywhere. Skips where
    no C compiler is found."""
    from conftest import EXAMPLE
    from tpu_pipeline.toolchain.loader import load
    from tpu_pipeline.toolchain.schedule.branches import body_units

    if not native_search.available():
        pytest.skip("no C compiler: only the Python search runs here")
    graphs = [load(EXAMPLE)[1]] + [random_wiring(40, seed) for seed in range(4)]
    for graph in graphs:
        model = build_model(graph)
        units = fuse(model, body_units(model))
        pc = Piece(model, units).use_lazy_slices()
        ub = pc.evaluate(heuristics.greedy(model)) + 1
        c, py = (best_first(pc, ub, 0, native=native) for native in (True, False))
        assert c.complete and py.complete and c.peak == py.peak == pc.evaluate(c.order), graph.name
        for width, floor in itertools.product((1, 2, 4, 16), (0, c.peak // 2, c.peak)):
            c_beam, py_beam = (beam_order(pc, width, time.monotonic() + 60, native=native, floor=floor)
                               for native in (True, False))
            assert c_beam[1] == py_beam[1] >= c.peak, (graph.name, width, floor)


@fast(40)
@given(dags(max_ops=9), SEMS, st.randoms(use_true_random=False))
def test_oracle_is_lifetimes(graph, semantics, rnd):
    """The oracle's peak of an order is `lifetimes()`'s, and its optimum is brute force's."""
    oracle = Oracle(graph, semantics)
    orders = []
    for _ in range(6):
        o = random_topological(graph, rnd)
        assert oracle.peak(o) == lifetimes(graph, o, semantics).peak
        orders.append(o)
    opt = oracle.optimum()
    assert opt <= min(oracle.peak(o) for o in orders)
    if len(graph.ops) <= 7:
        brute = min(lifetimes(graph, list(o), semantics).peak for o in itertools.permutations(range(len(graph.ops)))
                    if graph.is_topological(o))
        assert opt == brute


@fast(70)
@given(dags(max_ops=8), SEMS, st.randoms(use_true_random=False))
def test_scheduler_and_parts_small(graph, semantics, rnd):
    check_everything(graph, semantics, rnd)


@fast(25)
@given(dags(max_ops=12, min_ops=9), SEMS, st.randoms(use_true_random=False))
def test_scheduler_and_parts_up_to_12_ops(graph, semantics, rnd):
    check_everything(graph, semantics, rnd)


@fast(12)
@given(dags(max_ops=7, min_ops=2), SEMS)
def test_cpsat_against_oracle(graph, semantics):
    oracle = Oracle(graph, semantics)
    opt = oracle.optimum()
    res = schedule(graph, method="cpsat", time_limit=30, semantics=semantics)
    assert graph.is_topological(res.order) and lifetimes(graph, res.order, semantics).peak == res.peak
    assert res.lower_bound <= opt <= res.peak
    if build_model(graph, semantics).exact:
        assert res.peak == opt and res.proven_optimal


@fast(300)
@given(dags(max_ops=8), st.sampled_from(["tflite", "tflite", "tflm"]), st.randoms(use_true_random=False))
def test_model_is_lifetimes(graph, semantics, rnd):
    """Cheap and many: the scheduler's memory model (incl. which in-place sharing it treats as
    static) against lifetimes() on random orders."""
    model = build_model(graph, semantics)
    if not model.n:
        return
    for _ in range(4):
        order = random_topological(graph, rnd)
        if model.exact:
            assert model.profile(order) == lifetimes(graph, order, semantics).live_bytes(), compact(graph)
        else:
            assert Oracle(graph, semantics).peak(order) == lifetimes(graph, order, semantics).peak


def test_model_is_lifetimes_on_a_reshape_chain_into_an_empty_tensor():
    """TFLite: op1 reshapes t0 into t1 in place; op2 reshapes t1 into the 0-byte t2. t1's bytes
    are t0's, so lifetimes() gives op2's sharing no effect: t0 dies at op2. The model once
    merged t2 into t0's buffer too, keeping t0 alive until op3 reads t2 (128 B at the last step
    for lifetimes' 64). Found by a random search (the random graphs here rarely build it)."""
    sizes = [64, 64, 0, 64]
    graph = Graph(tuple(Tensor(i, f"t{i}", "int8", (s,)) for i, s in enumerate(sizes)),
                  (Op("ADD", (), (0,)), Op("RESHAPE", (0,), (1,)), Op("RESHAPE", (1,), (2,)),
                   Op("ADD", (2,), (3,))), (), (3,), "chain")
    model = build_model(graph, "tflite")
    assert model.exact
    assert model.profile([0, 1, 2, 3]) == lifetimes(graph, [0, 1, 2, 3], "tflite").live_bytes() == [0, 64, 64, 64, 64]


@fast(300)
@given(dags(max_ops=7), SEMS)
def test_fusion_keeps_the_optimum_many(graph, semantics):
    """Cheap and many: the best order keeping every fused unit contiguous is optimal."""
    model = build_model(graph, semantics)
    units = fuse(model)
    assert sorted(v for u in units for v in u) == list(range(model.n))
    if model.exact and model.n:
        oracle = Oracle(graph, semantics)
        assert oracle.optimum(units) == oracle.optimum(), compact(graph)


def _graph(sizes, ops, inputs, outputs) -> Graph:
    ts = tuple(Tensor(i, f"t{i}", "int8", (sz,)) for i, sz in enumerate(sizes))
    return Graph(ts, tuple(Op("ADD", tuple(a), tuple(b), source=k) for k, (a, b) in enumerate(ops)),
                 tuple(inputs), tuple(outputs), "witness")


# Random graphs rarely meet a fusion guard's exact corner (found by removing each guard: the
# random tests above did not notice). Each witness is a smallest graph where that one guard alone
# stops a fusion that would lose the optimum (u = op0, v = its only successor, x = the op caught
# between them in every optimal order); derived from the exchange arguments in fusion.py.
WITNESSES = {
    # Rule B, peak_rel <= slack_end: v's dead 112 B output must not run while t0 (read by x) lives
    "rule B: v's steps vs what u frees": _graph([96, 16, 48, 16, 112], [([0], [1, 2]), ([0], [3]), ([1], [4])], [0], [3]),
    # Rule B, out_surv <= in_free: v's 48 B graph output must not be live during x's 96 B step
    "rule B: v leaves more than it frees": _graph([16, 16, 112, 16, 96, 48],
                                                  [([0], [1, 2]), ([], [3, 4]), ([1], [5])], [0], [3, 5]),
    # Rule C, in_free <= out_surv: u's 96 B input must not stay live through x (x feeds v)
    "rule C: u frees more than it leaves": _graph([96, 16, 16, 96, 112], [([0], [1]), ([], [2, 3]), ([1, 2], [4])], [0], []),
    # Rule C, peak: u's 96 B dead output must not meet x's 48 B output (x feeds v)
    "rule C: u's steps vs v's first step": _graph([16, 96, 48, 16], [([], [0, 1]), ([], [2]), ([0, 2], [3])], [], []),
    # found by a random search against the mutated guard (in_free counts only tensors that can die)
    "in_free: graph outputs never free": _graph(
        [96, 16, 48, 96, 16, 16, 16, 16, 16, 96, 96],
        [([], [2]), ([0, 2], [3, 4]), ([], [5, 6]), ([3], [7, 8]), ([], [9, 10])], [0, 1], [2, 3, 7, 10]),
    # (deaths at u's last step exclude graph outputs)
    "deaths: graph outputs never die": _graph(
        [112, 112, 48, 48, 48, 96, 112, 48],
        [([], [2, 3]), ([0], [4]), ([0, 3], [5]), ([5, 4], [6]), ([], [7])], [0, 1], [2, 4, 5, 7]),
    # (Rule B: v's predecessors are all in u, even through a zero-byte tensor the memory model drops)
    "rule B: no predecessor outside u": _graph(
        [48, 16, 96, 0, 96, 16, 16, 112, 16],
        [([1], [3, 4]), ([4, 2], [5]), ([0], [6, 7]), ([6, 3], [8])], [0, 1], [4]),
    # (Rule B: v reads no graph input; here op4 reads t1, which op0 and op2 read too)
    "rule B: v reads no graph input": _graph(
        [96, 48, 16, 16, 48, 16, 16, 16, 16, 112],
        [([1, 0], [2, 3]), ([2], [4]), ([1, 4], [5]), ([], [6, 7]), ([1, 7], [8, 9])], [0, 1], [3, 4, 6]),
    # (out_surv counts outputs read outside the unit, not only graph outputs)
    "out_surv: outputs read later survive": _graph(
        [96, 0, 16, 16, 16, 16, 112, 16],
        [([0], [1, 2]), ([1], [3]), ([3], [4]), ([], [5]), ([], [6, 7])], [0], [4, 7]),
    # (inside a fused unit a tensor read by a later op of the unit does not die early)
    "deaths: not before the unit's last reader": _graph(
        [16, 16, 96, 96, 112, 16, 16, 96, 112],
        [([0], [2, 3]), ([], [4]), ([3, 2], [5]), ([1, 4], [6, 7]), ([7, 3], [8])], [0, 1], [2, 7, 8]),
}


@pytest.mark.parametrize("name", list(WITNESSES))
def test_fusion_guard_witnesses(name):
    graph = WITNESSES[name]
    oracle = Oracle(graph, "tflm")
    units = fuse(build_model(graph))
    assert oracle.optimum(units) == oracle.optimum(), (name, units)
    check_everything(graph, "tflm", random.Random(0))


def test_model_chained_in_place():
    """TFLite: RESHAPE -> RESHAPE. The first shares its input's buffer, so the second's input
    owns no bytes of its own and cannot host the second output (model.py's `zeroed`)."""
    ts = tuple(Tensor(i, f"t{i}", "int8", (sz,)) for i, sz in enumerate([192, 192, 128, 64]))
    g = Graph(ts, (Op("ADD", (), (0,)), Op("RESHAPE", (0,), (1,)), Op("RESHAPE", (1,), (2,)),
                   Op("ADD", (2,), (3,))), (), (3,))
    model = build_model(g, "tflite")
    assert model.exact
    assert model.profile([0, 1, 2, 3]) == lifetimes(g, [0, 1, 2, 3], "tflite").live_bytes()


def test_free_moves_with_an_untouched_output():
    """op0 -> op2 and op1 independent; op2 writes a dead 16-byte tensor and t4 is a graph output
    that no op touches, so it is live at the last step only: op2 must not run last (16 bytes
    instead of 32). The free moves take the zero-byte op1 first, which forces op2 last."""
    T = lambda i, s: Tensor(i, f"t{i}", "int8", (s,))  # noqa: E731
    g = Graph((T(0, 0), T(1, 0), T(2, 0), T(3, 16), T(4, 16)),
              (Op("ADD", (0,), (1,)), Op("ADD", (), (2,)), Op("ADD", (1,), (3,))), (), (4,))
    assert Oracle(g, "tflm").optimum() == lifetimes(g, [0, 2, 1]).peak == 16
    assert schedule(g, method="dp", params=ScheduleParams().without("free_moves")).peak == 16
    res = schedule(g, method="dp")
    assert res.peak == 16 or not res.proven_optimal


@pytest.mark.slow
@slow(1500)
@given(dags(max_ops=12), SEMS, st.randoms(use_true_random=False))
def test_scheduler_and_parts_many(graph, semantics, rnd):
    check_everything(graph, semantics, rnd, methods=("dp", "auto", "cpsat") if len(graph.ops) <= 8 else ("dp", "auto"))


# ---- the mutation check --------------------------------------------------------------------
# Each guard that restricts when fusion, a free move, a forced cut or a lower bound applies,
# removed (or its condition made always true) on a copy of the package: the fast tests above must
# fail on every one. (file, exact text, replacement, what the mutation does).
# Not listed, as no test can catch them (equivalent mutants; the argument for each is at the end
# of test_schedule_fusion_witnesses.py, and 100,000 random graphs found no witness): fusion's
# refusals of units that touch a tensor nobody writes (`su.ok`, Rule C's `sv.ok`, `s.ok = False`)
# and _reads_only_from's "written inside u or v". They only fuse less, which is always safe.
MUTATIONS = [
    # fusion.py
    ("fusion.py", "if model.final_only:\n        return units", "if False:\n        return units",
     "fuse even with graph outputs no op touches"),
    ("fusion.py", "if not alive[k] or len(usucc[k]) != 1:", "if not alive[k] or not usucc[k]:",
     "u may have several successor units (fuse with the first)"),
    ("fusion.py", "(j,) = usucc[k]", "j = min(usucc[k])", None),  # companion of the previous one
    ("fusion.py", "if upred[j] == {k}:", "if True:", "Rule B: v may have predecessors outside u"),
    ("fusion.py", "_reads_only_from(model, v, su.inside) and sv.out_surv", "sv.out_surv",
     "Rule B: v may read tensors written outside u"),
    ("fusion.py", "sv.out_surv <= sv.in_free \\", "True \\", "Rule B: v may leave more than it frees"),
    ("fusion.py", "and sv.peak_rel <= su.slack_end", "", "Rule B: v's steps may exceed what u's last step frees"),
    ("fusion.py", "if sv.ok and su.in_free <= su.out_surv and", "if sv.ok and",
     "Rule C: u may free more than it leaves"),
    ("fusion.py", "su.peak_rel - su.out_surv + su.in_free <= sv.first_born_extra", "True",
     "Rule C: u's steps may exceed v's first step"),
    ("fusion.py", "if pe[t] or mask[t] & ~inside:", "if mask[t] & ~inside:",
     "out_surv: graph outputs written inside do not count as surviving"),
    ("fusion.py", "if pe[t] or mask[t] & ~inside:", "if pe[t]:",
     "out_surv: outputs read outside do not count as surviving"),
    ("fusion.py", "if not pe[t]:\n                in_free += size[t]", "if True:\n                in_free += size[t]",
     "in_free: graph outputs read count as freed"),
    ("fusion.py", "if not pe[t] and not (m & ~scope)", "if not (m & ~scope)", "deaths: graph outputs die"),
    ("fusion.py", "and not (m & ~scope) and", "and", "deaths: tensors read after the unit die"),
    ("fusion.py", "and not (m & inside & ~seen):", ":", "deaths: tensors read later in the unit die"),
    ("fusion.py", "if b < 0:\n                return False", "if b < 0:\n                continue",
     "Rule B: v may read graph inputs"),
    # divide.py
    ("divide.py", "if (anc[k] | desc[k] | (1 << k)) == full]", "]", "every unit is a cut point"),
    ("divide.py", "if between:\n            out.append", "if True:\n            out.append", "empty pieces"),
    # dp.py: free moves; bounds/static.py: the bound that floors the search
    ("dp.py", "if free_moves and peak <= cap and R2 <= R:", "if free_moves and R2 <= R:",
     "free move may exceed max(g, floor)"),
    ("dp.py", "if free_moves and peak <= cap and R2 <= R:", "if free_moves and peak <= cap:",
     "free move may leave more bytes resident"),
    ("bounds/static.py", "if m & ops:\n            continue", "pass", "static bound: tensors touched inside counted twice"),
    ("bounds/static.py", "lb = model.step0 if S0 == 0 else 0", "lb = model.step0", "static bound: step 0 in every piece"),
    ("bounds/static.py", "if (S0 | ops) == model.full and model.n:", "if True:",
     "static bound: graph outputs at the end of every piece"),
    # forks.py: the moves around a fork of lazy slices
    ("forks.py", "if fork not in runs_offered:", "if False:", "no run of the remaining slices"),
    # branches.py: bodies
    # (the entry guard, "x has a reader outside", is not here: the exit guard below also refuses
    # its witness, and 4,000 random DAGs gave none where it alone matters)
    ("branches.py", "if anc[r] & body != body:", "if False:",
     "bodies: an exit's outside reader may run in the middle of the body"),
    # _best_first.c: the same search in C (checked next to the Python one in check_piece)
    ("_best_first.c", "int free_move = free_moves && peak <= cap && R2 <= R;", "int free_move = free_moves && R2 <= R;",
     "C: free move may exceed max(g, floor)"),
    ("_best_first.c", "int free_move = free_moves && peak <= cap && R2 <= R;", "int free_move = free_moves && peak <= cap;",
     "C: free move may leave more bytes resident"),
    ("_best_first.c", "if (s2 >= 0 && c.g[s2] <= g2) continue;", "if (s2 >= 0) continue;",
     "C: a set reached again at a lower peak keeps its first path"),
    ("_best_first.c", "pending = (mk[w] & ~(S[w] | (w == wv ? bv : 0))) != 0;", "pending = (mk[w] & ~S[w]) != 0;",
     "C: tensors read last by an op live on after its step"),
    ("_best_first.c", "if (!offered[c->lazy_fork[k]]) {", "if (0) {", "C: no run of the remaining slices"),
    ("_best_first.c", "for (int q = len - 1; q >= 0; q--) {", "for (int q = 0; q < len; q++) {",
     "C beam: the moves replayed back to front"),
    ("_best_first.c", "if (ua[w] != ub[w]) return ua[w] < ub[w];", "if (ua[w] != ub[w]) return ua[w] > ub[w];",
     "C beam: ties kept in another order than beam.py's"),
    # bounds/mincut.py: the min-cut bound
    ("bounds/mincut.py", "if after:\n                    forced.append(t)\n                    continue",
     "forced.append(t)\n                continue", "cut bound: live-before tensors forced even if they die"),
    ("bounds/mincut.py", "if after:\n                    size_arcs[t] = [arc(idx[writer], 1, s)]",
     "if True:\n                    size_arcs[t] = [arc(idx[writer], 1, s)]", "cut bound: written tensors always survive"),
    ("bounds/mincut.py", "for t in forced if t not in model.touch[v])",
     "for t in forced)", "cut bound: forced tensors v touches counted twice"),
    ("bounds/mincut.py", "flow.set_arc_capacity(a, 0 if on else model.size[t])",
     "flow.set_arc_capacity(a, model.size[t])",
     "cut bound: v's own tensors counted twice"),
    # bounds/branching.py: the branching bound; dives.py: the dives' bound
    ("bounds/branching.py", "for pair in ((u, v), (v, u)):", "for pair in ((v, u),):",
     "branch bound: only the branch that breaks the cheapest cut"),
    ("bounds/branching.py", "heapq.heappush(heap, (max(r[0], bound)", "heapq.heappush(heap, (max(r[0], bound) + 16",
     "branch bound: a leaf's bound above its cuts"),
    ("dives.py", "proven = max(proven, min(r.lower_bound, ub))", "proven = max(proven, B)",
     "dives: the trial budget taken as a bound"),
    ("beam.py", "if upred[j] & ~U2 == 0 and not", "if not", "beam: a unit ready before its predecessors ran"),
    ("beam.py", "for ks in reversed(seq)", "for ks in seq", "beam: the moves read back to front"),
    # model.py: the lower bound, the last step, and when TFLite's in-place sharing is static
    ("model.py", "if after == self.full:\n            live += self.final_only",
     "if True:\n            live += self.final_only", "untouched graph outputs at every step"),
    ("model.py", "if src in outputs or src in inputs:\n                continue", "pass",
     "in-place: graph inputs and outputs shared"),
    ("model.py", "if src in zeroed or sizes[src] < sizes[dst]:", "if src in zeroed:",
     "in-place: a smaller input shared"),
    ("model.py", "if tuple(cons) != (i,):", "if False:", "in-place: shared even if other ops read the input"),
    ("model.py", "if src in zeroed or sizes[src] < sizes[dst]:", "if sizes[src] < sizes[dst]:",
     "in-place: a shared input shared again"),
]

# Wrong parts added the way a new bound or stage is (one entry in bounds.PIECE_BOUNDS or
# stages.STAGES), with no source edited: a plugin registers them in the child before the tests
# run. The tests check every registered bound and every stage's answers, so these must fail too.
# (Python run in the child, what it registers.)
REGISTERED = [
    ("bounds.PIECE_BOUNDS += (LowerBound('too high', lambda pc, q: static_lower_bound(pc) + 16, every_piece=True),)",
     "a lower bound 16 bytes too high (sanity check of the harness)"),
    ("stages.STAGES['auto'] = (Stage('overclaim', lambda pc, known, until, ctx: known.raised(known.peak)),"
     " *stages.STAGES['auto'])",
     "a stage that claims the best order so far is optimal"),
]
REGISTRATION_PLUGIN = """
from tpu_pipeline.toolchain.schedule import bounds, stages
from tpu_pipeline.toolchain.schedule.bounds import LowerBound
from tpu_pipeline.toolchain.schedule.bounds.static import static_lower_bound
from tpu_pipeline.toolchain.schedule.stages import Stage
"""
# Not here: the switches of ScheduleParams. Each turns off a part that is sound on its own, so no
# setting of them is a wrong scheduler; check_schedule runs the exact search with each of fusion,
# cuts, free moves and the min-cut bound off, and the ablation tables in tools/bench_*.py toggle them.


def _mutations():
    out = [pytest.param([], "", id="control: no mutation")]
    for k, (fname, old, new, what) in enumerate(MUTATIONS):
        if what is None:
            continue
        group = [(fname, old, new)]
        if k + 1 < len(MUTATIONS) and MUTATIONS[k + 1][3] is None:
            group.append(MUTATIONS[k + 1][:3])
        out.append(pytest.param(group, "", id=f"{fname}:{what}"))
    out += [pytest.param([], code, id=f"registered:{what}") for code, what in REGISTERED]
    return out


ROOT = Path(__file__).resolve().parent.parent


def apply_mutation(pkg: Path, group) -> list[str]:
    """Apply one mutation to the copy at `pkg`; returns 'file:line' of each edit."""
    where = []
    for fname, old, new in group:
        path = pkg / "tpu_pipeline" / "toolchain" / "schedule" / fname
        text = path.read_text()
        assert text.count(old) >= 1, f"mutation no longer applies: {fname}: {old!r}"
        line = text[: text.index(old)].count("\n") + 1
        where.append(f"{fname}:{line}")
        path.write_text(text.replace(old, new, 1))
    return where


@pytest.mark.slow
@pytest.mark.parametrize("group, registration", _mutations())
def test_every_mutation_is_caught(group, registration, tmp_path):
    """Run the fast tests of this module and of test_schedule_branches.py (the forks, bodies and
    lazy slices) on a mutated copy of the package (the shared tree is never touched), or with a
    wrong part registered: they must fail."""
    shutil.copytree(ROOT / "tpu_pipeline", tmp_path / "tpu_pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    where = apply_mutation(tmp_path, group)
    plugin = []
    if registration:
        (tmp_path / "schedule_registration.py").write_text(REGISTRATION_PLUGIN + registration + "\n")
        plugin, where = ["-p", "schedule_registration"], [registration]
    # the mutated toolchain first; the checkout after it, for `tests.` imports between the modules
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), SCHEDULE_MUTATION_RUN="1")
    probe = subprocess.run([sys.executable, "-c", "import tpu_pipeline.toolchain as t; print(t.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert probe.stdout.startswith(str(tmp_path)), probe.stdout + probe.stderr
    proc = subprocess.run([sys.executable, "-m", "pytest", str(Path(__file__)),
                           str(Path(__file__).with_name("test_schedule_branches.py")),
                           str(Path(__file__).with_name("test_schedule_fusion_witnesses.py")), "-x", "-q", "-p", "no:cacheprovider",
                           *plugin, "-m", "not slow", "--no-header", "-rf"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1800)
    failed = [ln for ln in proc.stdout.splitlines() if ln.startswith("FAILED")]
    print(where, failed)
    if not group and not registration:
        assert proc.returncode == 0, proc.stdout[-3000:]
        return
    assert proc.returncode == 1 and failed, f"mutation at {where} survived:\n{proc.stdout[-3000:]}"

"""The brute-force oracle kit of the scheduler's tests: random DAGs with every corner the scheduler
must get right, an exact optimum computed from the lifetime rules alone (`Oracle`, independent of
`tpu_pipeline.toolchain.schedule.model`), every topological order of a small graph, and the checks
that hold the scheduler and each of its parts to the oracle (`check_everything`).

The oracle evaluates the live bytes of a step straight from the lifetime rules of
`tpu_pipeline.toolchain.memory.lifetimes` (pinned to it by tests/test_schedule_bruteforce.py), and
finds the optimum by a DP over (set of executed ops, which in-place ops shared). Under TFLite the
buffer sharing of reshape-like ops depends on the order when the input has other readers; the
extra state makes the DP exact there too.
"""

from __future__ import annotations

import itertools
import os
import random
import time

import numpy as np
from hypothesis import HealthCheck, Phase, currently_in_test_context, note, settings
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


def topological_orders(graph: Graph):
    """Every topological order of `graph`'s ops (exponential: for the small graphs of the tests)."""
    n = len(graph.ops)
    preds = [set(p) for p in graph.preds]

    def rec(done, order):
        if len(order) == n:
            yield list(order)
            return
        for v in range(n):
            if v not in done and preds[v] <= done:
                done.add(v)
                order.append(v)
                yield from rec(done, order)
                order.pop()
                done.discard(v)

    yield from rec(set(), [])

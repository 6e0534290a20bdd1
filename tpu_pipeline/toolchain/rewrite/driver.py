"""The apply-only-if-better driver: rewrite, reschedule, keep a rewrite only when the optimal peak drops.

Search. For the current graph (stored in its best known order) every matching rewrite is a
candidate, largest concat first. A candidate is applied and the result rescheduled; it is kept
when the peak drops. A commute or depthwise split creates a new concat, so when it does not pay
on its own the rewrites that match the new concat are tried on top of it (up to `depth` steps):
concat -> DEPTHWISE -> CONV only pays once both splits are made. After a kept rewrite the
candidates are listed again, until a full pass keeps nothing or the time budget is spent.

Bounds. Time: one `Deadline` (tpu_pipeline.toolchain.budget) for the whole search, checked in every loop; each
scheduler call gets what is left (at most `time_limit`) and none starts with less than
budget.MIN_SCHEDULE seconds; when the deadline passes the best graph so far is returned.
Memory: the scheduler's DP keeps at most about schedule.dp.MAX_STATE_BYTES of states per call,
calibration values (lossy splits only) at most CALIBRATION_CACHE_BYTES; the search itself holds
one graph per step of the current chain.

Pruning (a candidate that cannot pay is not searched). The question for a candidate is only "is
there an order of the rewritten graph G' peaking below the current peak P?", so G' is first held
against lower bounds: the order-free bound (the largest op footprint, here without scheduling), then
the scheduler's own proven bounds for G' (`schedule(..., below=P)`: per-piece resident bytes and
min-cut certificates, then the DP under P, which stops at the first order below P or exhausts
and proves there is none). Safety: every bound used is a proven lower bound on the peak of EVERY
topological order of G' (the same bounds `proven_optimal` rests on), so a candidate skipped
because a bound is >= P has no order below P: the plain search would reject it too. In
particular a rewrite whose region lies away from the peak cannot pay: the piece holding the peak
is unchanged in G' and keeps its bound >= P. Only a candidate that found an order below P is
rescheduled in full (for its optimum).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from tpu_pipeline.toolchain import budget as _budget
from tpu_pipeline.toolchain.budget import Deadline, DeadlineExpired, Progress
from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.memory import TFLM, Semantics, get_semantics, order_free_lower_bound
from tpu_pipeline.toolchain.schedule import schedule
from tpu_pipeline.toolchain.schedule.bounds.ancestry import ancestry_lower_bound
from tpu_pipeline.toolchain.rewrite.rules import ALL_KINDS, LOSSY, Candidate, apply_candidate, find_candidates


@dataclass(frozen=True)
class AppliedRewrite:
    kind: str  # conv_split, fc_split, depthwise_split, commute (a chain is several entries)
    target: str  # name of the rewritten op's output tensor
    branches: int
    numerics: str  # bit-exact | float-rounding | lossy-int8
    peak_before: int
    peak_after: int
    ops_added: int
    enabling: bool = False  # a step of a chain that pays only with the rewrites after it

    def to_json(self):
        return dict(self.__dict__)


@dataclass(frozen=True)
class RewriteResult:
    graph: Graph  # the rewritten graph, ops in its best schedule's order
    applied: tuple  # AppliedRewrite, in the order applied
    peak_before: int  # best peak of the input graph (the scheduler's)
    peak_after: int  # best peak of the rewritten graph
    proven_optimal: bool  # the scheduler proved peak_after optimal for the rewritten graph
    # Additive fields.
    lower_bound: int = 0
    ops_before: int = 0
    ops_after: int = 0
    seconds: float = 0.0
    schedule_calls: int = 0
    candidates_tried: int = 0
    proven_before: bool = False
    method: str = ""
    notes: tuple = field(default=())
    input_schedule: object = None  # the scheduler's answer for the input graph (Schedule), reused by compile

    @property
    def lossy(self) -> bool:
        return any(a.numerics == LOSSY for a in self.applied)

    def to_json(self):
        return {
            "peak_before": self.peak_before, "peak_after": self.peak_after,
            "proven_optimal": self.proven_optimal, "proven_before": self.proven_before,
            "lower_bound": self.lower_bound, "ops_before": self.ops_before, "ops_after": self.ops_after,
            "seconds": round(self.seconds, 3), "schedule_calls": self.schedule_calls,
            "candidates_tried": self.candidates_tried, "scheduler": self.method, "lossy": self.lossy,
            "applied": [a.to_json() for a in self.applied], "notes": list(self.notes),
        }


# The joint search re-applies its set once per elimination trial (quadratic in the set): it takes
# the JOINT_MAX largest concats' rewrites (a heuristic bound; the search is a heuristic anyway).
JOINT_MAX = 16
JOINT_SHARE = 0.5
CALIBRATION_CACHE_BYTES = 128 * 2**20  # calibration values kept between candidates (lossy splits)


class _Search:
    def __init__(self, time_limit, semantics, allow_lossy, model, deadline: Deadline, depth, kinds,
                 progress: Progress = None, calibrate_on: Graph | None = None):
        self.schedule = schedule
        self.calibrate_on = calibrate_on
        self.time_limit = time_limit
        self.sem = get_semantics(semantics)
        self.allow_lossy = allow_lossy
        self.model = model
        self.deadline = deadline
        self.depth = depth
        self.kinds = None if kinds is None else set(kinds)
        self.calls = 0
        self.tried = 0
        self.notes: list[str] = []
        self._values: dict[str, list] = {}  # calibration values by tensor name
        self._values_bytes = 0
        self.progress = progress

    def out_of_time(self) -> bool:
        return self.deadline.expired()

    def say(self, msg: str) -> None:
        _budget.say(self.progress, self.deadline.start, msg)

    def candidates(self, graph: Graph, concat_outputs=None) -> list[Candidate]:
        cands = [c for c in find_candidates(graph, self.allow_lossy, concat_outputs)
                 if self.kinds is None or set(c.kinds) <= self.kinds]
        return sorted(cands, key=lambda c: (-c.saved_bytes, c.target))

    def run_schedule(self, graph: Graph, below: int | None = None):
        """The scheduler on `graph` within what is left of the budget (at most `time_limit`);
        `below`: only whether an order peaks below it matters (see the module docstring)."""
        remaining = self.deadline.remaining()
        if remaining < _budget.MIN_SCHEDULE:
            raise DeadlineExpired("rewrite search", self.deadline.seconds)
        self.calls += 1
        limit = min(self.time_limit, remaining)
        return self.schedule(graph, method="auto", time_limit=limit, semantics=self.sem, below=below)

    def beats(self, graph: Graph, peak: int):
        """The best schedule of `graph` when some order peaks below `peak`, else None."""
        if order_free_lower_bound(graph, self.sem) >= peak or ancestry_lower_bound(graph, self.sem) >= peak:
            return None
        probe = self.run_schedule(graph, below=peak)
        if probe.peak >= peak:
            return None
        try:
            full = self.run_schedule(graph)
        except DeadlineExpired:
            return probe
        return full if full.peak <= probe.peak else probe

    def values_for(self, graph: Graph, cand: Candidate):
        """Calibration values of the concat inputs (lossy int8 splits only), cached by name."""
        if cand.numerics != LOSSY:
            return None
        from tpu_pipeline.toolchain.rewrite.numerics import calibration_values, calibration_values_within

        xs = graph.ops[cand.concat].inputs
        missing = [t for t in xs if graph.tensors[t].name not in self._values]
        if missing and self.calibrate_on is not None:  # a part of a model: run the whole one
            vals = calibration_values_within(graph, missing, self.calibrate_on, model=self.model)
        elif missing:
            vals = calibration_values(graph, missing, model=self.model)
        if missing:
            new = sum(int(getattr(v, "nbytes", 0)) for t in missing for v in vals[t])
            if self._values_bytes + new > CALIBRATION_CACHE_BYTES:  # bounded: start afresh
                self._values = {n: v for n, v in self._values.items()
                                if n in {graph.tensors[t].name for t in xs}}
                self._values_bytes = sum(int(getattr(a, "nbytes", 0)) for v in self._values.values() for a in v)
            for t in missing:
                self._values[graph.tensors[t].name] = vals[t]
            self._values_bytes += new
        return lambda t: self._values[graph.tensors[t].name]

    def apply(self, graph: Graph, cand: Candidate):
        return apply_candidate(graph, cand, self.values_for(graph, cand))

    def try_candidate(self, graph: Graph, cand: Candidate, peak: int, level: int):
        """(graph, schedule, [(candidate, graph before)]) of the first chain from `cand` whose
        peak is below `peak`, or None."""
        self.deadline.check("rewrite search")
        self.tried += 1
        try:
            g2, new_concats = self.apply(graph, cand)
        except ModelError as exc:  # calibration impossible (e.g. custom ops without the model)
            self.notes.append(f"{cand.kind} at {cand.target}: skipped ({exc})")
            return None
        s2 = self.beats(g2, peak)
        if s2 is not None:
            return g2.reordered(s2.order), s2, [(cand, graph)]
        if new_concats and level < self.depth and not self.out_of_time():
            for follow in self.candidates(g2, new_concats):
                found = self.try_candidate(g2, follow, peak, level + 1)
                if found is not None:
                    g3, s3, chain = found
                    return g3, s3, [(cand, graph), *chain]
        return None

    def apply_set(self, graph: Graph, targets, limit: int | None = None):
        """Apply the rewrites of the concats named in `targets` (those that match), to a fixpoint;
        `targets=None` applies every rewrite the policy allows (at most `limit`, largest concat
        first). Returns (graph, chain)."""
        chain = []
        done: set[str] = set()
        while limit is None or len(chain) < limit:
            self.deadline.check("rewrite search (joint)")
            cands = [c for c in self.candidates(graph) if c.target not in done
                     and (targets is None or c.target in targets)]
            if not cands:
                return graph, chain
            cand = cands[0]
            done.add(cand.target)
            try:
                g2, _ = self.apply(graph, cand)
            except ModelError as exc:
                self.notes.append(f"{cand.kind} at {cand.target}: skipped ({exc})")
                continue
            chain.append((cand, graph))
            graph = g2
        return graph, chain

    def joint(self, graph: Graph, peak: int):
        """Rewrites that pay only together (two concats at the same peak): apply all, then drop
        each rewrite whose removal does not raise the peak (backward elimination). Gets at most
        JOINT_SHARE of the time left."""
        outer = self.deadline
        self.deadline = outer.sub(fraction=JOINT_SHARE)
        try:
            return self._joint(graph, peak)
        except DeadlineExpired:
            self.notes.append("joint search stopped at its share of the time budget")
            return None
        finally:
            self.deadline = outer

    def _joint(self, graph: Graph, peak: int):
        g_all, chain = self.apply_set(graph, None, JOINT_MAX)
        if not chain or self.out_of_time():
            return None
        self.say(f"rewrite: joint search over {len(chain)} rewrites")
        # Only graphs at most as high as the best so far matter (the elimination keeps a trial
        # when its peak does not rise), so each trial asks the scheduler "below best + 1?".
        best_s = self.run_schedule(g_all)
        best_g, keep = g_all, [c.target for c, _ in chain]
        for target in reversed([c.target for c, _ in chain]):
            if self.out_of_time():
                self.notes.append("time budget spent during the joint search")
                break
            trial = [t for t in keep if t != target]
            g_t, chain_t = self.apply_set(graph, set(trial))
            if not chain_t:
                s_t = None
                peak_t = peak
            else:
                s_t = self.beats(g_t, best_s.peak + 1)
                peak_t = s_t.peak if s_t is not None else best_s.peak + 1
            self.tried += 1
            if peak_t <= best_s.peak and s_t is not None:
                keep, best_g, best_s, chain = trial, g_t, s_t, chain_t
        if best_s.peak < peak:
            return best_g.reordered(best_s.order), best_s, chain
        return None


def _applied_chain(chain, g2: Graph, s2, peak: int) -> list[AppliedRewrite]:
    """One record per rewrite of a kept chain; all but the last only enable it (peak unchanged)."""
    out = []
    for k, (c, before) in enumerate(chain):
        last = k == len(chain) - 1
        after = g2 if last else chain[k + 1][1]
        out.append(AppliedRewrite(c.kind, c.target, c.branches, c.numerics, peak,
                                  s2.peak if last else peak, len(after.ops) - len(before.ops),
                                  enabling=not last))
    return out


def rewrite_graph(graph: Graph, time_limit: float = 10.0, semantics: str | Semantics = TFLM,
                  allow_lossy: bool = False,
                  *, model=None, budget: float | None = None, depth: int = 3, kinds=None,
                  joint: bool = True, deadline: Deadline | None = None,
                  progress: Progress = None, calibrate_on: Graph | None = None) -> RewriteResult:
    """Apply the identity rewrites that lower the best peak, each checked by rescheduling.

    First one rewrite at a time (with chains: commute or depthwise split, then the splits they
    enable); when none pays alone, all of them together followed by backward elimination
    (`joint`). `time_limit` bounds each scheduler call; `budget` (default 30 x time_limit, at
    least 60 s) bounds the whole search. int8 partial-sum splits are lossy and only tried with
    `allow_lossy`; they calibrate their partial sums' quantization on random inputs (LiteRT),
    which needs the source `model` when the graph has custom ops. `kinds` restricts the
    rewrites tried (default: all).

    `deadline` (tpu_pipeline.toolchain.budget.Deadline) bounds the whole search: the earlier of it and
    `budget` wins, and the search returns within budget.SLACK of it with the best graph found so
    far (at least the input graph in its best order found). Not counted: when an int8 depthwise
    split was kept under the exact policy, both models are run once in LiteRT and TFLite Micro to
    confirm it is bit-exact (a verification; the re-search without it shares the deadline).
    `progress(msg)` hears one line per pass over the candidates. `calibrate_on`: when `graph` is a
    part of a model (fit's spans), the whole model's graph, which the calibration runs instead (the
    part's inputs are activations: random values there are not what the model feeds it).
    """
    t0 = time.monotonic()
    if deadline is None or budget is not None:
        budget = max(60.0, 30.0 * time_limit) if budget is None else budget
    dl = _budget.resolve(budget, deadline)
    search = _Search(time_limit, semantics, allow_lossy, model, dl, depth, kinds, progress, calibrate_on)
    try:
        s0 = search.run_schedule(graph)
    except DeadlineExpired:  # no time for a search: the cheap heuristics, no rewrite
        s0 = schedule(graph, method="greedy", time_limit=1.0, semantics=search.sem)
        search.notes.append("time budget spent before the search started")
    current = graph.reordered(s0.order)
    peak, sched = s0.peak, s0
    applied: list[AppliedRewrite] = []
    try:
        while not search.out_of_time():
            found = None
            cands = search.candidates(current)
            search.say(f"rewrite: {len(cands)} candidates at peak {peak:,} ({len(applied)} applied, "
                       f"{search.calls} scheduler calls)")
            for cand in cands:
                search.deadline.check("rewrite search")
                found = search.try_candidate(current, cand, peak, 1)
                if found is not None:
                    break
            if found is None and joint and not search.out_of_time():
                found = search.joint(current, peak)
            if found is None:
                break
            g2, s2, chain = found
            applied.extend(_applied_chain(chain, g2, s2, peak))
            current, peak, sched = g2, s2.peak, s2
    except DeadlineExpired:
        search.notes.append("time budget spent; the search stopped early")
    if search.out_of_time() and not any("time budget" in n for n in search.notes):
        search.notes.append("time budget spent; the search stopped early")
    if (not allow_lossy and any(a.kind == "depthwise_split" for a in applied) and _is_quantized(graph)
            and not _bit_exact_in_runtimes(graph, current, model)):
        # The split is exact in the reference kernels (TFLite Micro), but LiteRT's optimized int8
        # depthwise kernels choose their path by channel count and can round 1 LSB apart: under
        # the exact policy such a split is dropped and the search runs again without it.
        retry = rewrite_graph(graph, time_limit, semantics, allow_lossy, model=model, budget=None,
                              depth=depth, joint=joint, deadline=search.deadline, progress=progress,
                              calibrate_on=calibrate_on,
                              kinds=(search.kinds or set(ALL_KINDS)) - {"depthwise_split"})
        note = ("int8 depthwise split dropped: LiteRT's optimized kernels round it 1 LSB away from the "
                "unsplit op on this model (not bit-exact)")
        return dataclasses.replace(retry, notes=(note, *retry.notes), seconds=time.monotonic() - t0)
    return RewriteResult(
        graph=current, applied=tuple(applied), peak_before=s0.peak, peak_after=peak,
        proven_optimal=bool(sched.proven_optimal), lower_bound=int(sched.lower_bound),
        ops_before=len(graph.ops), ops_after=len(current.ops), seconds=time.monotonic() - t0,
        schedule_calls=search.calls, candidates_tried=search.tried,
        proven_before=bool(s0.proven_optimal), method=str(sched.method), notes=tuple(search.notes),
        input_schedule=s0)


def _is_quantized(graph: Graph) -> bool:
    return any(t.kind == "activation" and t.dtype in ("int8", "uint8", "int16") for t in graph.tensors)


def _bit_exact_in_runtimes(original: Graph, rewritten: Graph, model) -> bool:
    """Both graphs give identical outputs in LiteRT and TFLite Micro on random inputs (a check
    of the kernels the runtimes pick, not a proof). False when they cannot be run here."""
    from tpu_pipeline.toolchain.ir.convert import standalone_model
    from tpu_pipeline.toolchain.execute.compare import verify_models
    from tpu_pipeline.toolchain.tflite import model_to_bytes

    try:
        a = model_to_bytes(standalone_model(original, model))
        b = model_to_bytes(standalone_model(rewritten, model))
    except ModelError:
        return False
    results = verify_models(a, b, runs=2)
    litert = [v for v in results if v.runtime == "litert"]
    return bool(litert and litert[0].outputs) and all(o.ok for v in results for o in v.outputs)

"""What the partitioner needs to know about a graph, and how a stage assignment is scored.

A stage assignment gives every op (position in graph.ops) a stage 0..n-1 with
stage[u] <= stage[v] for every edge u -> v. Coral's rules fix the segment interfaces
(libcoral `LocateSubgraphNodes`, `PipelinedModelRunner`): a segment's inputs are the activation
tensors it reads that an earlier segment produced (or that are graph inputs); its outputs are the
tensors it produces that a later segment reads (plus the graph outputs, which the last segment
produces). A boundary tensor goes device -> host once at its producer and host -> device once at
EVERY later segment that reads it (there is no TPU-to-TPU link).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from functools import cached_property

from tpu_pipeline.toolchain.cost.edgetpu import EdgeTpuCostModel, OpCost, PipelineCost, StageCost
from tpu_pipeline.toolchain.errors import InfeasibleError, UsageError
from tpu_pipeline.toolchain.ir import Graph


@dataclass(frozen=True)
class BoundaryTensor:
    tensor: int
    nbytes: int
    producer: int | None           # op position; None for a graph input
    consumers: tuple[int, ...]     # op positions
    graph_output: bool


@dataclass(frozen=True)
class SegmentInterface:
    inputs: tuple[int, ...]        # tensor indices, in the segment's input order
    outputs: tuple[int, ...]       # tensor indices, in the segment's output order


def downstream(succs, seeds) -> frozenset[int]:
    """`seeds` and every op reachable from them along `succs` (a graph's successor sets)."""
    found = set(seeds)
    stack = list(found)
    while stack:
        v = stack.pop()
        for s in succs[v]:
            if s not in found:
                found.add(s)
                stack.append(s)
    return frozenset(found)

class PartitionProblem:
    """Precomputed per-op costs and per-tensor traffic of one graph under one cost model."""

    def __init__(self, graph: Graph, model: EdgeTpuCostModel):
        self.graph = graph
        self.model = model
        self.n_ops = len(graph.ops)
        self.op_costs: tuple[OpCost, ...] = model.op_costs(graph)
        self.preds = graph.preds
        self.succs = graph.succs
        outs = set(graph.outputs)
        ins = set(graph.inputs)
        tensors = []
        seen = set()
        for t in sorted(set(graph.consumers) | set(graph.producer) | ins):
            if t in seen or not graph.is_activation(t):
                continue
            seen.add(t)
            prod = graph.producer.get(t)
            cons = tuple(c for c in graph.consumers.get(t, ()) if c != prod)
            if prod is None and t not in ins:
                continue  # read but never written and not an input: stays inside its segment
            if not cons and t not in outs:
                continue
            tensors.append(BoundaryTensor(t, graph.tensors[t].nbytes, prod, cons, t in outs))
        self.tensors: tuple[BoundaryTensor, ...] = tuple(tensors)
        # work that does not depend on n, shared by every search over this problem (the down-set
        # lattice of lattice.py: `compile -n auto` partitions one problem for n = 1..K)
        self.cache: dict = {}

    def scaled(self, factors) -> "PartitionProblem":
        """The same problem with each op's compute time multiplied by factors[op] (a measured
        profile in place of the prediction, profile.py); parameters and traffic unchanged."""
        other = copy.copy(self)
        other.op_costs = tuple(dataclasses.replace(oc, compute_ps=round(oc.compute_ps * f))
                               for oc, f in zip(self.op_costs, factors))
        other.cache = {}
        return other

    @cached_property
    def host_ops(self) -> frozenset[int]:
        """Ops that run on the host CPU, as Coral's runtime runs them: every custom op (the Edge
        TPU has none; Coral's PoseNet decoder, MediaPipe's ops) and everything downstream of one.
        They belong to the last segment (the Edge TPU compiler maps a segment's ops up to its
        first unsupported op and leaves the rest to the CPU)."""
        fixed = {i for i, op in enumerate(self.graph.ops) if op.is_custom}
        return downstream(self.succs, fixed)

    @cached_property
    def last_stage_ops(self) -> frozenset[int]:
        """Ops that must be in the last segment: sinks (no successor; this covers every graph
        output's producer unless the output is also read later), graph outputs' producers and
        host ops (custom ops), with everything downstream of them."""
        g = self.graph
        fixed = {i for i in range(self.n_ops) if not self.succs[i]}
        fixed |= {g.producer[t] for t in g.outputs if t in g.producer}
        fixed |= self.host_ops
        return downstream(self.succs, fixed)

    @cached_property
    def state_groups(self) -> tuple[tuple[int, ...], ...]:
        """Ops that share a variable (state) tensor, which must run in one segment: a variable
        lives in its interpreter, so ops in two segments would each update a state of their own.
        Only groups of two or more ops (an SVDF reads and writes its own state alone)."""
        g = self.graph
        users: dict[int, set[int]] = {}
        for v, op in enumerate(g.ops):
            for t in (*op.inputs, *op.outputs):
                if t >= 0 and g.tensors[t].kind == "variable":
                    users.setdefault(t, set()).add(v)
        groups = {tuple(sorted(ops)) for ops in users.values() if len(ops) > 1}
        return tuple(sorted(groups))

    def max_stages(self) -> int:
        return self.n_ops - len(self.last_stage_ops) + 1

    def check_n(self, n: int, label: str = "model") -> None:
        if not isinstance(n, int) or n < 1 or n > self.n_ops:
            raise UsageError(f"{label}: -n must be between 1 and the number of ops ({self.n_ops}), got {n}")
        if n > self.max_stages():
            why = "they produce or follow the graph outputs" + (
                f", or are custom ops ({len(self.host_ops)} ops from the first one on run on the host)"
                if self.host_ops else "")
            raise InfeasibleError(
                f"{label}: cannot make {n} non-empty segments: {len(self.last_stage_ops)} of the {self.n_ops} ops "
                f"must share the last segment ({why}), so at most {self.max_stages()} segments are possible")

    # ---- scoring ------------------------------------------------------------------------------
    def is_valid(self, stages, n: int) -> bool:
        if len(stages) != self.n_ops or any(not 0 <= s < n for s in stages):
            return False
        if len(set(stages)) != n:
            return False
        if any(stages[p] > stages[v] for v in range(self.n_ops) for p in self.preds[v]):
            return False
        if any(len({stages[v] for v in group}) > 1 for group in self.state_groups):
            return False
        return all(stages[v] == n - 1 for v in self.last_stage_ops)

    def traffic(self, stages, n: int) -> tuple[list[int], list[int]]:
        """Bytes into and out of each stage through the host."""
        inb, outb = [0] * n, [0] * n
        for bt in self.tensors:
            ps = -1 if bt.producer is None else stages[bt.producer]
            later = {stages[c] for c in bt.consumers if stages[c] > ps}
            for k in later:
                inb[k] += bt.nbytes
            if bt.producer is not None and (later or bt.graph_output):
                outb[ps] += bt.nbytes
        return inb, outb

    def stage_costs(self, stages, n: int) -> list[StageCost]:
        inb, outb = self.traffic(stages, n)
        ops = [0] * n
        comp = [0] * n
        par = [0] * n
        for v, s in enumerate(stages):
            ops[s] += 1
            comp[s] += self.op_costs[v].compute_ps
            par[s] += self.op_costs[v].param_bytes
        return [self.model.stage(ops[k], comp[k], par[k], inb[k], outb[k]) for k in range(n)]

    def evaluate(self, stages, n: int) -> PipelineCost:
        return self.model.pipeline(self.stage_costs(stages, n))

    def period_ps(self, stages, n: int) -> int:
        """The simulated period of `stages` (= `evaluate(stages, n).period_ps`, half the work)."""
        return self.model.period_ps(self.stage_costs(stages, n))

    def objectives(self, stages, n: int) -> dict[str, int]:
        """The integer objective values the CP-SAT model uses."""
        sc = self.stage_costs(stages, n)
        return {
            "period_ps": self.model.period_bound_ps(sc)[0],
            "max_stage_ps": max(s.latency_ps for s in sc),
            "sum_stage_ps": sum(s.latency_ps for s in sc),
            "max_param_bytes": max(s.param_bytes for s in sc),
            "offchip_bytes": sum(s.offchip_bytes for s in sc),
            "max_comm_bytes": max(s.in_bytes + s.out_bytes for s in sc),
        }

    def interfaces(self, stages, n: int) -> tuple[SegmentInterface, ...]:
        g = self.graph
        ins: list[list[int]] = [[] for _ in range(n)]
        outs: list[list[int]] = [[] for _ in range(n)]
        by_tensor = {bt.tensor: bt for bt in self.tensors}
        order_in = {t: k for k, t in enumerate(g.inputs)}
        order_out = {t: k for k, t in enumerate(g.outputs)}
        for bt in self.tensors:
            ps = -1 if bt.producer is None else stages[bt.producer]
            later = sorted({stages[c] for c in bt.consumers if stages[c] > ps})
            for k in later:
                ins[k].append(bt.tensor)
            if bt.producer is not None and (later or bt.graph_output):
                outs[ps].append(bt.tensor)
        del by_tensor

        def key_in(t):  # graph inputs first in the graph's order, then by producer position
            if t in order_in:
                return (0, order_in[t], 0)
            return (1, g.producer.get(t, -1), t)

        def key_out(t):  # graph outputs in the graph's order, then by producer position
            if t in order_out:
                return (1, order_out[t], 0)
            return (0, g.producer.get(t, -1), t)

        return tuple(SegmentInterface(tuple(sorted(ins[k], key=key_in)), tuple(sorted(outs[k], key=key_out)))
                     for k in range(n))

    def segment_graph(self, stages, k: int, iface: SegmentInterface) -> Graph:
        """The IR of segment k alone (shares the tensor table; only its ops)."""
        g = self.graph
        ops = tuple(g.ops[v] for v in range(self.n_ops) if stages[v] == k)
        return Graph(g.tensors, ops, iface.inputs, iface.outputs, g.name)

"""Edge TPU cost model: predicted latency of a pipeline segment, pipeline throughput, energy.

Per segment (one Edge TPU, one invoke per inference), with the link to itself:

    compute = sum over its ops of (per-op overhead + 2 * MACs / (peak ops/s * efficiency[class]))
    stream  = max(0, parameter bytes - usable SRAM) / host bandwidth   (streamed on EVERY inference)
    latency = invoke overhead
            + (max(compute, stream) if the device streams while it computes, else compute + stream)
            + (input bytes + output bytes) / host bandwidth            (boundary tensors via the host)

A pipeline of segments is predicted by the discrete-event simulator (tpu_pipeline/toolchain/cost/pipeline.py):
every TPU shares the host's one link (parameter streams and boundary tensors of all stages) and the
host; period = 1 / throughput and latency come from its steady state. `period_bound_ps` is the
exact lower bound the partitioner minimises: max(slowest segment, link bytes of all segments /
bandwidth, host work / host slots). Energy per inference (steady state) = sum over devices of
active power x own latency + idle power x (period - own latency).

Everything is computed in integer picoseconds so that the CP-SAT partitioner and the reports
use exactly the same numbers (rounding: one coefficient per op and per byte, < 0.1 %).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_pipeline.toolchain.cost.classes import op_class
from tpu_pipeline.toolchain.cost.pipeline import PipelineSim, StageLoad, saturated_period, simulate
from tpu_pipeline.toolchain.device import Device
from tpu_pipeline.toolchain.ir import Graph, macs, param_bytes

PS_PER_S = 10**12

@dataclass(frozen=True)
class OpCost:
    macs: int
    op_class: str
    param_bytes: int
    compute_ps: int


@dataclass(frozen=True)
class StageCost:
    ops: int
    param_bytes: int
    sram_bytes: int          # parameters cached on chip
    offchip_bytes: int       # parameters streamed from the host on every inference
    in_bytes: int
    out_bytes: int
    compute_ps: int
    latency_ps: int
    overhead_ps: int
    stream_ps: int
    transfer_ps: int

    @property
    def latency_s(self) -> float:
        return self.latency_ps / PS_PER_S

    @property
    def link_ps(self) -> int:
        """Time this segment occupies the shared link per inference (streams + boundary tensors)."""
        return self.stream_ps + self.transfer_ps

    def to_json(self) -> dict:
        return {"ops": self.ops, "parameter_bytes": self.param_bytes, "sram_bytes": self.sram_bytes,
                "offchip_bytes": self.offchip_bytes, "in_bytes": self.in_bytes, "out_bytes": self.out_bytes,
                "compute_s": self.compute_ps / PS_PER_S, "stream_s": self.stream_ps / PS_PER_S,
                "transfer_s": self.transfer_ps / PS_PER_S, "overhead_s": self.overhead_ps / PS_PER_S,
                "latency_s": self.latency_s}


@dataclass(frozen=True)
class PipelineCost:
    stages: tuple[StageCost, ...]
    latency_s: float         # simulated: one frame through every stage (fed at the period)
    throughput_per_s: float
    energy_j: float
    bottleneck: int          # index of the slowest stage (alone)
    period_ps: int           # simulated steady-state period (shared link and host)
    period_bound_ps: int = 0  # max(slowest stage, link work, host work): what the partitioner minimises
    limited_by: str = ""     # "link", "host" or "stage k": the term that sets the bound
    sim: PipelineSim | None = None

    @property
    def period_s(self) -> float:
        return self.period_ps / PS_PER_S

    def to_json(self) -> dict:
        out = {"latency_s": self.latency_s, "throughput_per_s": self.throughput_per_s,
               "energy_j": self.energy_j, "bottleneck_stage": self.bottleneck,
               "period_s": self.period_s, "period_bound_s": self.period_bound_ps / PS_PER_S,
               "limited_by": self.limited_by, "model": "simulator (shared link and host)"}
        if self.sim is not None:
            out.update(link_utilisation=self.sim.link_utilisation, host_utilisation=self.sim.host_utilisation,
                       stages=[s.to_json() for s in self.sim.stages])
        return out


class EdgeTpuCostModel:
    """Integer-picosecond cost model built from an `edgetpu` device descriptor."""

    def __init__(self, device: Device):
        if device.kind != "edgetpu":
            from tpu_pipeline.toolchain.errors import UsageError
            raise UsageError(f"device '{device.name}' is a {device.kind}, not an Edge TPU")
        self.device = device
        self.sram_bytes = device.memory.param_sram_bytes
        self.ps_per_byte = max(1, round(PS_PER_S / device.link.host_bandwidth_bytes_per_s))
        self.overhead_ps = round(device.timing.invoke_overhead_s * PS_PER_S)
        self.per_op_ps = round(device.timing.per_op_s * PS_PER_S)
        eff = device.compute.efficiency
        self.overlap = device.timing.stream_overlaps_compute
        self.host_slots = device.timing.host_concurrency
        self.ps_per_mac = {c: 2 * PS_PER_S / (device.compute.peak_ops_per_s * eff[c]) for c in eff}

    def op_cost(self, graph: Graph, i: int) -> OpCost:
        op = graph.ops[i]
        m = macs(graph, i) or 0
        cls = op_class(op.opcode)
        return OpCost(m, cls, param_bytes(graph, i), self.per_op_ps + round(m * self.ps_per_mac[cls]))

    def op_costs(self, graph: Graph) -> tuple[OpCost, ...]:
        return tuple(self.op_cost(graph, i) for i in range(len(graph.ops)))

    def stage(self, n_ops: int, compute_ps: int, param: int, in_bytes: int, out_bytes: int) -> StageCost:
        off = max(0, param - self.sram_bytes)
        stream = off * self.ps_per_byte
        transfer = (in_bytes + out_bytes) * self.ps_per_byte
        total = self.overhead_ps + (max(compute_ps, stream) if self.overlap else compute_ps + stream) + transfer
        return StageCost(n_ops, param, param - off, off, in_bytes, out_bytes, compute_ps, total,
                         self.overhead_ps, stream, transfer)

    def load(self, s: StageCost) -> StageLoad:
        """The simulator's view of a segment."""
        return StageLoad(s.compute_ps / PS_PER_S, s.offchip_bytes, s.in_bytes, s.out_bytes,
                         self.overhead_ps / PS_PER_S, self.overlap)

    @property
    def bandwidth(self) -> float:
        """Bytes per second, exactly as the integer model charges them."""
        return PS_PER_S / self.ps_per_byte

    def period_bound_ps(self, stages) -> tuple[int, str]:
        """The exact lower bound of the simulated period, in the partitioner's integers, and its term."""
        k = max(range(len(stages)), key=lambda j: (stages[j].latency_ps, -j))
        terms = [(stages[k].latency_ps, f"stage {k}"), (sum(s.link_ps for s in stages), "link")]
        if self.host_slots:
            terms.append((-(-len(stages) * self.overhead_ps // self.host_slots), "host"))
        return max(terms, key=lambda t: t[0])

    def period_ps(self, stages) -> int:
        """The simulated period alone: `pipeline(stages).period_ps` without its latency run."""
        period = saturated_period([self.load(s) for s in stages], self.bandwidth, host_slots=self.host_slots)
        return max(self.period_bound_ps(stages)[0], round(period * PS_PER_S))

    def pipeline(self, stages: list[StageCost] | tuple[StageCost, ...]) -> PipelineCost:
        bottleneck = max(range(len(stages)), key=lambda k: (stages[k].latency_ps, -k))
        bound, term = self.period_bound_ps(stages)
        sim = simulate([self.load(s) for s in stages], self.bandwidth, host_slots=self.host_slots)
        # the simulator works in float seconds; never report below the exact bound
        period = max(bound, round(sim.period_s * PS_PER_S))
        power = self.device.power
        energy = sum(power.active_w * s.latency_ps + power.idle_w * (period - s.latency_ps) for s in stages) / PS_PER_S
        return PipelineCost(tuple(stages), sim.latency_s, PS_PER_S / period, energy, bottleneck, period,
                            bound, term, sim)

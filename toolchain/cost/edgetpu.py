"""Edge TPU cost model: predicted latency of a pipeline segment, pipeline throughput, energy.

Per segment (one Edge TPU, one invoke per inference):

    latency = invoke overhead
            + sum over its ops of (per-op overhead + 2 * MACs / (peak ops/s * efficiency[class]))
            + max(0, parameter bytes - usable SRAM) / host bandwidth   (streamed on EVERY inference)
            + (input bytes + output bytes) / host bandwidth            (boundary tensors via the host)

A pipeline of segments: latency = sum of the segment latencies (one inference end to end),
throughput = 1 / slowest segment, energy per inference (steady state) = sum over devices of
active power x own latency + idle power x (period - own latency), period = slowest segment.

Everything is computed in integer picoseconds so that the CP-SAT partitioner and the reports
use exactly the same numbers (rounding: one coefficient per op and per byte, < 0.1 %).
"""

from __future__ import annotations

from dataclasses import dataclass

from toolchain.cost.classes import op_class
from toolchain.cost.devices import Device, load_device
from toolchain.ir import Graph, macs, param_bytes

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

    def to_json(self) -> dict:
        return {"ops": self.ops, "parameter_bytes": self.param_bytes, "sram_bytes": self.sram_bytes,
                "offchip_bytes": self.offchip_bytes, "in_bytes": self.in_bytes, "out_bytes": self.out_bytes,
                "compute_s": self.compute_ps / PS_PER_S, "stream_s": self.stream_ps / PS_PER_S,
                "transfer_s": self.transfer_ps / PS_PER_S, "overhead_s": self.overhead_ps / PS_PER_S,
                "latency_s": self.latency_s}


@dataclass(frozen=True)
class PipelineCost:
    stages: tuple[StageCost, ...]
    latency_s: float
    throughput_per_s: float
    energy_j: float
    bottleneck: int          # index of the slowest stage
    period_ps: int           # the slowest stage's latency

    def to_json(self) -> dict:
        return {"latency_s": self.latency_s, "throughput_per_s": self.throughput_per_s,
                "energy_j": self.energy_j, "bottleneck_stage": self.bottleneck,
                "period_s": self.period_ps / PS_PER_S}


class EdgeTpuCostModel:
    """Integer-picosecond cost model built from an `edgetpu` device descriptor."""

    def __init__(self, device: Device | str = "coral-usb"):
        device = load_device(device)
        if device.kind != "edgetpu":
            from toolchain.errors import UsageError
            raise UsageError(f"device '{device.name}' is a {device.kind}, not an Edge TPU")
        self.device = device
        self.sram_bytes = device.param_sram_bytes
        self.ps_per_byte = max(1, round(PS_PER_S / device.host_bandwidth_bytes_per_s))
        self.overhead_ps = round(device.invoke_overhead_s * PS_PER_S)
        self.per_op_ps = round(float(device.get("timing", "per_op_s", 0.0)) * PS_PER_S)
        eff = device.efficiency
        self.ps_per_mac = {c: 2 * PS_PER_S / (device.peak_ops_per_s * eff[c]) for c in eff}

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
        total = self.overhead_ps + compute_ps + stream + transfer
        return StageCost(n_ops, param, param - off, off, in_bytes, out_bytes, compute_ps, total,
                         self.overhead_ps, stream, transfer)

    def pipeline(self, stages: list[StageCost] | tuple[StageCost, ...]) -> PipelineCost:
        period = max(s.latency_ps for s in stages)
        bottleneck = max(range(len(stages)), key=lambda k: (stages[k].latency_ps, -k))
        latency = sum(s.latency_ps for s in stages) / PS_PER_S
        d = self.device
        energy = sum(d.active_w * s.latency_ps + d.idle_w * (period - s.latency_ps) for s in stages) / PS_PER_S
        return PipelineCost(tuple(stages), latency, PS_PER_S / period, energy, bottleneck, period)

"""MCU latency and energy model from a device descriptor (devices/<name>.toml, kind = "mcu").

Each op costs `cycles_per_mac[class] x work` cycles, where work is its multiply-accumulates
(`toolchain.ir.macs`) or, for ops that only move or touch data, its output elements; classes are
`conv`, `depthwise`, `fully_connected`, `elementwise` and `other`. Latency = cycles / clock_hz;
energy = latency x active_w. The constants are per device in its TOML; they are calibrated against
TFLite Micro reference kernels on a Cortex-M4F and are an estimate, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolchain.cost.classes import OP_CLASSES, op_class
from toolchain.cost.devices import load_device
from toolchain.errors import UsageError
from toolchain.ir import Graph, macs

def device_dict(device: Any) -> dict:
    """The parsed descriptor of a Device (its `.raw`), a dict, or a name/path to load (validated)."""
    if isinstance(device, dict):
        return device
    if hasattr(device, "raw"):
        return dict(device.raw)
    return dict(load_device(str(device)).raw)


@dataclass(frozen=True)
class McuOpCost:
    index: int  # position in graph.ops
    opcode: str
    op_class: str
    work: int  # MACs, or output elements for ops without MACs
    cycles: float
    seconds: float


@dataclass(frozen=True)
class McuEstimate:
    device: str
    clock_hz: float
    ops: tuple[McuOpCost, ...]
    cycles: float
    latency_s: float
    energy_j: float
    active_w: float

    def to_json(self) -> dict:
        return {"device": self.device, "clock_hz": self.clock_hz, "cycles": self.cycles,
                "latency_s": self.latency_s, "energy_j": self.energy_j, "active_w": self.active_w,
                "ops": [o.__dict__ for o in self.ops]}


def mcu_params(device: Any) -> tuple[str, float, dict[str, float], float]:
    d = device_dict(device)
    try:
        clock = float(d["compute"]["clock_hz"])
        cpm = {k: float(v) for k, v in d["compute"]["cycles_per_mac"].items()}
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"device '{d.get('name', '?')}' has no [compute] clock_hz and cycles_per_mac "
                         "(is it an MCU descriptor?)") from None
    for c in OP_CLASSES:
        cpm.setdefault(c, cpm.get("other", 4.0))
    active = float(d.get("power", {}).get("active_w", 0.0))
    return str(d.get("name", "mcu")), clock, cpm, active


def estimate_mcu(graph: Graph, device: Any) -> McuEstimate:
    """Predicted cycles, latency and energy of one inference of `graph` on an MCU."""
    name, clock, cpm, active = mcu_params(device)
    ops = []
    for i, op in enumerate(graph.ops):
        cls = op_class(op.opcode)
        m = macs(graph, i)
        if not m:
            m = sum(graph.tensors[t].num_elements for t in op.outputs if t >= 0)
        cycles = cpm[cls] * m
        ops.append(McuOpCost(i, op.opcode, cls, int(m), cycles, cycles / clock))
    total = sum(o.cycles for o in ops)
    latency = total / clock
    return McuEstimate(name, clock, tuple(ops), total, latency, latency * active, active)

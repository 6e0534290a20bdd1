"""Several models, one arena: TFLite Micro's multi-tenant allocation, predicted.

    a = shared_arena([(graph_a, plan_a), (graph_b, plan_b)], CMSIS_NN)
    a.head, a.tail, a.total, a.separate_total

Interpreters built one after another on one `MicroAllocator` (micro_allocator.h: "multi-tenant
allocations can share the head") run one at a time: the non-persistent head is the largest
model's head (every model's offline plan starts at the head's first byte), the persistent tails
stack below the arena's end in the order the models are initialised. The arena's allocator,
greedy planner and MicroAllocator are made once (the first three allocations of a tail), every
model's own allocations follow. Each model's head is already its smallest (the offline plan), so
no joint choice of offsets lowers the largest one: this sum is the floor.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_pipeline.toolchain.device import KernelSet
from tpu_pipeline.toolchain.errors import ModelError

# SingleArenaBufferAllocator, GreedyMemoryPlanner, MicroAllocator: one per arena, not per model
SHARED_OBJECTS = 3


@dataclass(frozen=True)
class SharedArena:
    kernels: str
    heads: tuple[int, ...]  # each model's head alone
    tails: tuple[int, ...]  # each model's tail alone
    head: int  # the shared head: the largest
    tail: int  # the stacked tails

    @property
    def total(self) -> int:
        return self.head + self.tail

    @property
    def separate_total(self) -> int:
        """What the models take in arenas of their own."""
        return sum(self.heads) + sum(self.tails)

    def to_json(self) -> dict:
        return {"kernels": self.kernels, "heads": list(self.heads), "tails": list(self.tails),
                "head": self.head, "tail": self.tail, "shared_arena_bytes_predicted": self.total,
                "separate_arena_bytes_predicted": self.separate_total}


def shared_arena(models, kernels: KernelSet) -> SharedArena:
    """`models`: (graph, offline plan or None) per model, in initialisation order."""
    from tpu_pipeline.toolchain.memory.tflm_target import target_arena, target_tail

    if not models:
        raise ModelError("no models to share an arena")
    heads, tails, allocations = [], [], []
    for i, (graph, plan) in enumerate(models):
        alone = target_arena(graph, kernels, plan)
        tail = target_tail(graph, kernels)
        if tail.bytes is None:
            raise ModelError(f"model {i + 1}: the {kernels.name} tail is not predicted for "
                             f"{', '.join(tail.unmodelled)}; a shared arena needs every tail")
        heads.append(alone.head)
        tails.append(tail.bytes)
        allocations += tail.allocations if i == 0 else tail.allocations[SHARED_OBJECTS:]
    used = 0
    for _, size, alignment in allocations:  # each aligned down from the arena's end, as target_tail does
        used = -(-(used + size) // alignment) * alignment
    return SharedArena(kernels.name, tuple(heads), tuple(tails), max(heads), used)


def plan_shared(paths, device, kernels: KernelSet) -> SharedArena:
    """Each model planned as export-mcu plans it (offline plan, checked in TFLite Micro), then their
    shared arena on `device`'s 32-bit target with `kernels`."""
    import tempfile
    from pathlib import Path

    from tpu_pipeline.toolchain.export_mcu import export_mcu
    from tpu_pipeline.toolchain.ir import from_model
    from tpu_pipeline.toolchain.tflite import read_model
    from tpu_pipeline.toolchain.tflite.metadata import read_offline_plan

    planned = []
    for p in paths:
        with tempfile.TemporaryDirectory(prefix="tpup-shared-") as tmp:
            export_mcu(p, device, tmp)
            model = read_model((Path(tmp) / "model.tflite").read_bytes())
        planned.append((from_model(model), read_offline_plan(model)))
    return shared_arena(planned, kernels)

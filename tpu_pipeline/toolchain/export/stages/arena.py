"""HARNESS_ARENA_SIZE: what the 32-bit target needs with either kernel set, and the host's head +
tail where the host ran the model itself (64-bit pointers: a larger tail); where it ran the
builtin view of harness kernels, room for TFLite Micro's planning temporaries at start-up
instead. (CMSIS-NN's LSTM keeps eight kernel-sum vectors the reference kernel does not; too small
an arena made its Prepare write through a null pointer.)"""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.device import KERNEL_SETS
from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.errors import InfeasibleError
from tpu_pipeline.toolchain.ir import kernels as harness
from tpu_pipeline.toolchain.memory import TFLM, lifetimes
from tpu_pipeline.toolchain.memory.tflm_target import target_arena

# TFLite Micro plans at start-up in the arena's free space (an AllocationInfo per buffer and the greedy
# planner's lists); a firmware arena sized to arena_used_bytes alone may not leave room for that.
PLANNING_BYTES_PER_BUFFER = 48


def arena(state, allowed):
    graph, measured, device = state.graph, state.measured, state.options.device
    on_harness = bool(harness.kernel_choices(graph) or graph.external)
    needed = [] if on_harness else [measured.head + measured.tail]
    for kernels in KERNEL_SETS:
        target = target_arena(graph, kernels, list(state.offsets)).total
        if target is not None:
            needed.append(target)
    temporaries = PLANNING_BYTES_PER_BUFFER * len(lifetimes(graph, semantics=TFLM).per_tensor()[0].buffers) \
        if on_harness else 0
    size = -(-(max(needed or [measured.head + measured.tail]) + temporaries) // 16) * 16
    sram = device.memory.sram_bytes
    if size > sram and not (state.options.split_ok and _split_holds(graph, state.offsets, device)):
        raise InfeasibleError(f"{state.src}: needs a {size:,}-byte arena; {device.name} has {sram:,} bytes of SRAM")
    return replace(state, arena_size=size), PassRecord("arena", "ran", 0.0, {"arena_size": size})


def _split_holds(graph, offsets, device) -> bool:
    """Some allowed placement of head and tail in the board's banks holds the arena, for every
    kernel set (deploy/banks.py; the reserve is the application's)."""
    from tpu_pipeline.toolchain.deploy.banks import place
    from tpu_pipeline.toolchain.memory.tflm_target import split_tail, target_tail

    for kernels in KERNEL_SETS:
        a = target_arena(graph, kernels, list(offsets))
        if a.tail is None or place(a.head, a.tail, device.memory.banks, 0, split_tail(target_tail(graph, kernels))) \
                is None:
            return False
    return True

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
    banks = _harness_banks(graph, state.offsets, device, size) if device.firmware is not None else None
    if size > sram and banks is None and not (state.options.split_ok and _split_holds(graph, state.offsets, device)):
        raise InfeasibleError(f"{state.src}: needs a {size:,}-byte arena; {device.name} has {sram:,} bytes of SRAM")
    return replace(state, arena_size=size, arena_banks=banks), \
        PassRecord("arena", "ran", 0.0, {"arena_size": size, "arena_banks": banks})


def _harness_banks(graph, offsets, device, whole: int) -> dict | None:
    """The harness firmware's arena in the board's banks (deploy/banks.harness_arena): split, the
    head buffer holds the largest head of either kernel set and TFLite Micro's planning
    temporaries (the library's bound), the tail buffer the largest tail apart."""
    from tpu_pipeline.toolchain.deploy.banks import harness_arena, outside_input_bytes
    from tpu_pipeline.toolchain.memory.tflm_target import planning_bound, split_tail, target_tail

    heads, tails = [planning_bound(graph)], []
    for kernels in KERNEL_SETS:
        heads.append(target_arena(graph, kernels, list(offsets)).head)
        tails.append(split_tail(target_tail(graph, kernels)))
    apart = None if None in tails else -(-max(tails) // 16) * 16
    placed = harness_arena(whole, -(-max(heads) // 16) * 16, apart, device, outside_input_bytes(graph))
    first = device.memory.banks[0].name
    return None if placed is None or placed["head"] == placed["tail"] == first and placed["input"] in (None, first) \
        else placed


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

"""The offline plan honoured: TFLite Micro's real head is not above the planned one. The host runs
the builtin view of harness kernels (no overlapped buffers): its head is checked against what the
same plan gives that view."""

from __future__ import annotations

from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.errors import InfeasibleError
from tpu_pipeline.toolchain.execute.tflm_arena import predicted_host_head
from tpu_pipeline.toolchain.ir import kernels as harness


def check_head(state, allowed):
    host_head = state.planned_head if not harness.kernel_choices(state.graph) else predicted_host_head(state.data)
    if state.measured.head > host_head:
        raise InfeasibleError(f"{state.src}: TFLite Micro allocated a {state.measured.head:,}-byte head, our plan said "
                              f"{host_head:,} (the offline plan was not honoured)")
    return state, PassRecord("check_head", "ran", 0.0, {"host_head": host_head})

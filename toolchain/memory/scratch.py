"""Scratch buffers that kernels request from the arena, for their own op's step only.

Under TFLite Micro these are the reference kernels' `RequestScratchBufferInArena` calls, in the
order each kernel makes them; the sizes were measured against the real interpreter and are pinned
by tests/test_memory_tflm.py. Under TFLite the CPU kernels' temporaries (im2col and the like)
depend on the kernel path chosen at run time and are not modelled.
"""

from __future__ import annotations

from toolchain.ir import Graph
from toolchain.memory.semantics import Semantics

_INT32 = 4


def scratch_requests(graph: Graph, op_pos: int, sem: Semantics) -> list[int]:
    """Byte sizes of the scratch buffers op `op_pos` requests, in request order."""
    if sem.name != "tflm":
        return []
    op = graph.ops[op_pos]
    name = op.opcode
    if name in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN") and len(op.inputs) >= 2:
        x = graph.tensors[op.inputs[0]]
        axis = graph.tensors[op.inputs[1]]
        out = graph.tensors[op.outputs[0]]
        sizes = []
        if name in ("MEAN", "SUM") and x.dtype in ("int8", "int16"):
            sizes.append(out.num_elements * _INT32)  # int32 accumulators
        sizes.append(len(x.shape) * _INT32)  # the iteration index
        sizes.append(axis.num_elements * _INT32)  # the resolved axes
        return sizes
    if name == "TRANSPOSE_CONV" and op.outputs:
        out = graph.tensors[op.outputs[0]]
        acc = {"int8": 4, "int16": 8}.get(out.dtype)  # int32 / int64 accumulators
        return [out.num_elements * acc] if acc else []
    return []

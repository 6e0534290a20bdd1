"""The arena TFLite Micro uses on a 32-bit Cortex-M target, byte for byte: head and tail.

`arena_used_bytes()` = head + tail. The head is the memory plan (our offline offsets pinned, the
kernels' scratch buffers placed by TFLite Micro's greedy planner): `target_head`. The tail is the
sequence of persistent allocations the interpreter makes while `AllocateTensors()` runs, each
taken downwards from the arena's end and aligned down (`SingleArenaBufferAllocator::
AllocatePersistentBuffer`), so the tail is that sequence with every step rounded up:
`target_tail`. The sequence, as micro_allocator.cc and micro_interpreter.cc make it, for the
harness firmware (tpu_pipeline/toolchain/data/firmware/harness/main.cc) built for arm-none-eabi (AAPCS: 4-byte
pointers, enums as small as their values, `-fshort-enums` being that ABI's default):

1. the arena allocator (36 B), the greedy planner (44 B) and the MicroAllocator (36 B);
2. StartModelAllocation: the builtin-data allocator (8 B), one SubgraphAllocations per subgraph
   (8 B), a TfLiteEvalTensor per tensor (12 B), a NodeAndRegistration per op (32 B);
3. per op in order, the parsed builtin options (`Parse*` of flatbuffer_conversions.cc allocates
   the `TfLite*Params` struct whenever it has one, at the struct's own alignment);
4. per op in order, the kernel's Init: `AllocatePersistentBuffer(sizeof(OpData))` (16-aligned);
5. per op in order, the kernel's Prepare: per-channel output multipliers and shifts;
6. one 4-byte ScratchBufferHandle per scratch request (when there is any);
7. the interpreter's input and output TfLiteTensor* arrays (16-aligned), a persistent TfLiteTensor
   (32 B) for each, and for a quantized one its TfLiteAffineQuantization (12 B) and zero-point
   TfLiteIntArray (4 + 4 per channel).

The harness's convolutions (`ir.kernels`, custom ops TPUP_CONV_2D and TPUP_DEPTHWISE_CONV_2D)
allocate nothing persistent in steps 3-5: a custom op's options are not parsed into the arena,
their Init allocates nothing (the options are read from the flatbuffer at each invoke) and their
requantization is a constant input (in flash). They ask for one scratch buffer at most (step 6).

The struct sizes are `sizeof`/`alignof` as arm-none-eabi-g++ 12 lays them out with the harness's
flags (read from the compiled object), and were checked against the allocation trace of the real
firmware on QEMU (docs/runtime.md). An op outside these tables makes the prediction None with the
op named, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_pipeline.toolchain.device import CMSIS_NN, DEFAULT_KERNEL_SET, REFERENCE, KernelSet
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.ir import kernels as harness
from tpu_pipeline.toolchain.memory.lifetimes import lifetimes
from tpu_pipeline.toolchain.memory.runtime_planners import tflm_greedy
from tpu_pipeline.toolchain.memory.scratch import cmsis_nn_unmodelled, scratch_requests
from tpu_pipeline.toolchain.memory.semantics import TFLM, Semantics, tflm_semantics

_ARENA_ALIGN = 16  # MicroArenaBufferAlignment(): kernels' and the interpreter's persistent buffers

# (size, alignment) of the fixed allocations of step 1-2 and 6-7 (32-bit target).
_SINGLE_ARENA_ALLOCATOR = (36, 4)
_GREEDY_PLANNER = (44, 4)


def _planner(n_external: int) -> tuple[int, int]:
    """The harness's planner: TFLM's greedy one, or, with tensors outside the arena, the wrapper
    that leaves them out (main.cc HarnessPlanner: a vtable pointer, the greedy planner, an int per
    external tensor and two counters)."""
    return _GREEDY_PLANNER if not n_external else (4 + _GREEDY_PLANNER[0] + 4 * n_external + 8, 4)
_MICRO_ALLOCATOR = (36, 4)
_BUILTIN_DATA_ALLOCATOR = (8, 4)
_SUBGRAPH_ALLOCATIONS = 8
_EVAL_TENSOR = 12
_NODE_AND_REGISTRATION = 32
_SCRATCH_HANDLE = 4
_TFLITE_TENSOR = 32
_AFFINE_QUANTIZATION = 12
_POINTER = 4
_INT = 4

# Step 3: the TfLite*Params struct each builtin's parser allocates, (sizeof, alignof); ops absent
# here have a parser that allocates nothing (QUANTIZE, RELU, PAD, SPACE_TO_BATCH_ND, ...).
BUILTIN_DATA = {
    "CONV_2D": (28, 4), "DEPTHWISE_CONV_2D": (28, 4),  # TfLiteConvParams / TfLiteDepthwiseConvParams
    "MAX_POOL_2D": (40, 4), "AVERAGE_POOL_2D": (40, 4),  # TfLitePoolParams (with computed padding)
    "FULLY_CONNECTED": (5, 1),  # five one-byte enums and bools
    "SOFTMAX": (4, 4), "RESHAPE": (36, 4),  # float beta; int shape[8] + count
    "ADD": (2, 1), "SUB": (2, 1), "MUL": (1, 1),  # activation (+ pot_scale_int16)
    "MEAN": (1, 1), "SUM": (1, 1), "REDUCE_MAX": (1, 1), "REDUCE_MIN": (1, 1),  # bool keep_dims
    "CONCATENATION": (8, 4), "STRIDED_SLICE": (24, 4), "RESIZE_NEAREST_NEIGHBOR": (2, 1),
    "RESIZE_BILINEAR": (2, 1),  # TfLiteResizeBilinearParams: align_corners, half_pixel_centers
    # measured with arm-none-eabi-g++ 12 (sizeof/alignof on the target): the real models' other ops
    "SVDF": (8, 4), "UNIDIRECTIONAL_SEQUENCE_LSTM": (16, 4), "TRANSPOSE_CONV": (16, 4),
    "SPLIT": (4, 4), "LEAKY_RELU": (4, 4), "CAST": (2, 1), "DIV": (1, 1),
}
NO_BUILTIN_DATA = frozenset({"QUANTIZE", "DEQUANTIZE", "RELU", "RELU6", "PAD", "PADV2", "SPACE_TO_BATCH_ND",
                             "BATCH_TO_SPACE_ND", "LOGISTIC", "TANH", "TRANSPOSE", "MAXIMUM", "MINIMUM",
                             "LOG_SOFTMAX"})

# Step 4: sizeof the struct each kernel's Init allocates, (reference, cmsis-nn); None: no Init
# allocation. cmsis-nn's own kernels wrap the reference OpData with their buffer index etc.
OP_DATA = {
    "CONV_2D": (56, 60),  # OpDataConv; cmsis_nn OpData{OpDataConv, int buffer_idx}
    "DEPTHWISE_CONV_2D": (56, 60),  # same structs
    "FULLY_CONNECTED": (48, 72),  # OpDataFullyConnected; cmsis_nn OpData (+ indices, dims, sums)
    "ADD": (60, 60),  # OpDataAdd; cmsis_nn OpData (same fields)
    "MAX_POOL_2D": (32, 36), "AVERAGE_POOL_2D": (32, 36),  # OpDataPooling; + buffer_idx
    "SOFTMAX": (56, 64),  # SoftmaxParams; CMSISNNSoftmaxParams{SoftmaxParams, rows, row size}
    "MEAN": (44, 44), "SUM": (44, 44), "REDUCE_MAX": (44, 44), "REDUCE_MIN": (44, 44),  # OpDataReduce
    "QUANTIZE": (32, 32),  # OpDataQuantizeReference
    "CONCATENATION": (24, 24),  # concatenation.cc OpData (ConcatenationParams)
    "RELU": (28, 28), "RELU6": (28, 28),  # ReluOpData / Relu6OpData
    "SPACE_TO_BATCH_ND": (4, 4),  # SpaceToBatchParams
    "STRIDED_SLICE": (84, 84),  # StridedSliceParams (+ the op's shapes)
    "MUL": (36, 36),  # OpDataMul
    "PAD": (56, 56), "PADV2": (56, 56),  # OpData{PadParams, output zero point}; cmsis_nn's the same size
    "BATCH_TO_SPACE_ND": (None, None), "RESHAPE": (None, None), "RESIZE_NEAREST_NEIGHBOR": (None, None),
    "RESIZE_BILINEAR": (None, None),  # resize_bilinear.cc: no Init, Prepare allocates nothing
    "DEQUANTIZE": (32, 32),  # DequantizeOpData
    "SVDF": (36, 40),  # OpDataSvdf; cmsis_nn CmsisNnOpDataSvdf (+ kernel sums pointer)
    "UNIDIRECTIONAL_SEQUENCE_LSTM": (688, 912),  # OpDataLSTM; cmsis_nn OpData{OpDataLSTM, CMSIS-NN params}
    "TRANSPOSE_CONV": (72, 76),  # transpose_conv.cc OpData; cmsis_nn's (+ output scratch index)
    "SUB": (52, 52), "DIV": (28, 28),  # OpDataSub, OpDataDiv (no cmsis_nn kernel)
    "LOGISTIC": (16, 16), "LEAKY_RELU": (24, 24),  # OpDataLogistic, LeakyReluOpData
    "TRANSPOSE": (None, None), "MAXIMUM": (None, None), "MINIMUM": (None, None), "SPLIT": (None, None),
    "CAST": (None, None),
    "LOG_SOFTMAX": (None, None),  # its OpData (28 B) comes in Prepare, int8 only (_prepare_allocations)
}
_LOG_SOFTMAX_OP_DATA = 28  # LogSoftmaxOpData, allocated by Prepare for int8


@dataclass(frozen=True)
class TargetTail:
    kernels: str  # the kernel set's name
    bytes: int | None  # None when an op is not modelled
    allocations: tuple[tuple[str, int, int], ...]  # (what, size, alignment) in allocation order
    unmodelled: tuple[str, ...]  # opcodes whose kernel allocations are not in the tables


@dataclass(frozen=True)
class TargetArena:
    kernels: str  # the kernel set's name
    head: int  # the memory plan the target reports (non-persistent bytes)
    tail: int | None
    scratch: tuple[tuple[int, int], ...]  # (op position, bytes) in request order

    @property
    def total(self) -> int | None:
        return None if self.tail is None else self.head + self.tail


def _kernel_set(kernels: KernelSet | Semantics = DEFAULT_KERNEL_SET) -> tuple[Semantics, KernelSet, int]:
    """(semantics, kernel set, column of OP_DATA) of a kernel set or its TFLite Micro semantics."""
    sem = tflm_semantics(kernels)
    return sem, sem.kernels, sem.kernels.tail_column


def _quantized(t) -> bool:
    return t.quant is not None and len(t.quant.scale) > 0 and len(t.quant.zero_point) > 0


def _prepare_allocations(graph: Graph, op, kernels: KernelSet) -> list[int]:
    """Step 5: what a kernel's Prepare allocates persistently."""
    if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        x, w = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
        # conv_common.cc / depthwise_conv_common.cc allocate for every type; cmsis_nn's kernels
        # only for int8 and int16
        if kernels == REFERENCE or x.dtype in ("int8", "int16"):
            channels = w.shape[0 if op.opcode == "CONV_2D" else 3]  # the quantized dimension
            return [channels * _INT, channels * _INT]  # output multipliers, shifts
        return []
    if op.opcode == "FULLY_CONNECTED":
        w = graph.tensors[op.inputs[1]]
        if w.quant is not None and len(w.quant.scale) > 1:  # per-channel weights
            return [len(w.quant.scale) * _INT] * 2
    if op.opcode == "TRANSPOSE_CONV":  # per-channel multipliers and shifts, every type, both kernel sets
        channels = graph.tensors[op.inputs[1]].shape[0]
        return [channels * _INT, channels * _INT]
    if op.opcode == "LOG_SOFTMAX" and graph.tensors[op.inputs[0]].dtype == "int8":
        return [_LOG_SOFTMAX_OP_DATA]
    if op.opcode == "UNIDIRECTIONAL_SEQUENCE_LSTM" and kernels == CMSIS_NN and len(op.inputs) >= 20:
        # CMSIS_NN_PortOpData: eight kernel-sum vectors (hidden size) of the bias type
        x, hidden, cell = (graph.tensors[op.inputs[i]] for i in (0, 18, 19))
        bias_bytes = {"int8": 4, "int16": 8}.get(x.dtype) if cell.dtype == "int16" else None
        return [hidden.shape[1] * bias_bytes] * 8 if bias_bytes else []
    return []


def target_tail(graph: Graph, kernels: KernelSet | Semantics = DEFAULT_KERNEL_SET, n_subgraphs: int = 1) -> TargetTail:
    """The persistent allocations of `graph` on the 32-bit target with `kernels`, in order."""
    sem, kernels, col = _kernel_set(kernels)
    allocs: list[tuple[str, int, int]] = [
        ("SingleArenaBufferAllocator", *_SINGLE_ARENA_ALLOCATOR),
        ("GreedyMemoryPlanner" if not graph.external else "HarnessPlanner", *_planner(len(graph.external))),
        ("MicroAllocator", *_MICRO_ALLOCATOR), ("MicroBuiltinDataAllocator", *_BUILTIN_DATA_ALLOCATOR),
        ("SubgraphAllocations", _SUBGRAPH_ALLOCATIONS * n_subgraphs, 4),
        ("TfLiteEvalTensor[]", _EVAL_TENSOR * len(graph.tensors), 4),
        ("NodeAndRegistration[]", _NODE_AND_REGISTRATION * len(graph.ops), 4)]
    unmodelled = []
    for i, op in enumerate(graph.ops):
        if harness.is_harness(op):
            continue
        if op.opcode in BUILTIN_DATA:
            allocs.append((f"op {i} {op.opcode} builtin data", *BUILTIN_DATA[op.opcode]))
        elif op.opcode not in NO_BUILTIN_DATA:
            unmodelled.append(op.opcode)
    for i, op in enumerate(graph.ops):
        if harness.is_harness(op):
            continue
        size = OP_DATA.get(op.opcode, (None, None))[col]
        if size:
            allocs.append((f"op {i} {op.opcode} OpData", size, _ARENA_ALIGN))
        elif op.opcode not in OP_DATA:
            unmodelled.append(op.opcode)
        missing = cmsis_nn_unmodelled(graph, op) if kernels == CMSIS_NN else None
        if missing:
            unmodelled.append(missing)
    requests = 0
    for i, op in enumerate(graph.ops):
        if harness.is_harness(op):
            requests += len(scratch_requests(graph, i, sem))
            continue
        for size in _prepare_allocations(graph, op, kernels):
            allocs.append((f"op {i} {op.opcode} per-channel", size, _ARENA_ALIGN))
        requests += len(scratch_requests(graph, i, sem))
    if requests:
        allocs.append(("ScratchBufferHandle[]", _SCRATCH_HANDLE * requests, 4))
    for t in graph.tensors:  # AllocateVariables (the offline plan leaves them online: -1)
        if t.is_variable:
            allocs.append((f"variable '{t.name}'", t.nbytes, _ARENA_ALIGN))
    for what, ios in (("input", graph.inputs), ("output", graph.outputs)):
        allocs.append((f"{what} TfLiteTensor*[]", _POINTER * len(ios), _ARENA_ALIGN))
        for t in ios:
            allocs.append((f"{what} TfLiteTensor", _TFLITE_TENSOR, 4))
            tensor = graph.tensors[t]
            if _quantized(tensor):
                allocs.append((f"{what} TfLiteAffineQuantization", _AFFINE_QUANTIZATION, 4))
                allocs.append((f"{what} zero points", _INT + _INT * len(tensor.quant.scale), 4))
    missing = tuple(dict.fromkeys(unmodelled))
    return TargetTail(kernels.name, None if missing else _stacked(allocs), tuple(allocs), missing)


def _stacked(allocs) -> int:
    """The bytes a sequence of (what, size, alignment) takes downwards from a 16-aligned end."""
    used = 0
    for _, size, alignment in allocs:
        used = -(-(used + size) // alignment) * alignment
    return used


# MicroAllocator::Create(persistent, size, non_persistent, size) (head and tail in two buffers,
# e.g. two RAM banks) puts a PersistentArenaBufferAllocator and a NonPersistentArenaBufferAllocator
# in the tail where one arena has a SingleArenaBufferAllocator (sizeof/alignof, arm-none-eabi-g++ 12).
_PERSISTENT_ALLOCATOR = (16, 4)
_NON_PERSISTENT_ALLOCATOR = (32, 4)


def split_tail(tail: TargetTail) -> int | None:
    """The tail when the head is a buffer of its own (the library's `tpup_<name>_init_split`)."""
    if tail.bytes is None:
        return None
    first, *rest = tail.allocations
    assert first[0] == "SingleArenaBufferAllocator", first
    return _stacked([("PersistentArenaBufferAllocator", *_PERSISTENT_ALLOCATOR),
                     ("NonPersistentArenaBufferAllocator", *_NON_PERSISTENT_ALLOCATOR), *rest])


# TFLite Micro plans at init in the head's free space (an AllocationInfo and the greedy planner's
# lists per buffer, the scratch requests): a bound per tensor and op, used only when the head is
# smaller than it (tiny models).
PLANNING_BYTES_PER_ENTRY, PLANNING_BYTES_FIXED = 64, 256


def planning_bound(graph: Graph) -> int:
    """The head a model needs at least while TFLite Micro plans it (the library's and the split
    harness's head buffer)."""
    return PLANNING_BYTES_PER_ENTRY * (len(graph.tensors) + len(graph.ops)) + PLANNING_BYTES_FIXED


def target_head(graph: Graph, kernels: KernelSet | Semantics = DEFAULT_KERNEL_SET, tensor_offsets=None) -> tuple[int, tuple]:
    """(head, scratch requests) with `tensor_offsets` (TFLite Micro's offline plan: an offset
    per tensor, -1 online; None: no plan) pinned and the kernels' scratch placed online."""
    sem = tflm_semantics(kernels)
    # what TFLM allocates for the model file as the firmware loads it: one buffer per tensor
    lt = lifetimes(graph, semantics=sem, whole_model=True).per_tensor()[0]
    pinned = [-1] * len(lt.buffers)
    if tensor_offsets is not None:
        for i, b in enumerate(lt.buffers):
            if b.tensor is not None and b.tensor < len(tensor_offsets):
                pinned[i] = int(tensor_offsets[b.tensor])
    scratch = tuple((b.op, b.size) for b in lt.buffers if b.tensor is None)
    return tflm_greedy(lt, offline=pinned).size, scratch


def target_arena(graph: Graph, kernels: KernelSet | Semantics = DEFAULT_KERNEL_SET, tensor_offsets=None) -> TargetArena:
    """Predicted `arena_used_bytes()` of the harness firmware on a 32-bit Cortex-M."""
    sem = tflm_semantics(kernels)
    head, scratch = target_head(graph, sem, tensor_offsets)
    return TargetArena(sem.kernels.name, head, target_tail(graph, sem).bytes, scratch)


def export_plan_offsets(graph: Graph, n_tensors: int | None = None, time_limit: float = 5.0) -> tuple[int, ...]:
    """The offline plan `export-mcu` writes for `graph` (TFLite Micro semantics, planner "auto")."""
    from tpu_pipeline.toolchain.memory.tflm import plan_for_tflm

    lt = lifetimes(graph, semantics=TFLM)
    return plan_for_tflm(graph, lt, "auto", time_limit, n_tensors=n_tensors or len(graph.tensors)).tensor_offsets


def ops_tail(graph: Graph, kernels: KernelSet | Semantics = DEFAULT_KERNEL_SET) -> int | None:
    """The part of the tail that `graph`'s ops bring with them, additive over a chain of spans (fit
    adds it up per variant): their nodes, the eval tensors of what they write and of the constants
    they read, and their parsed options, kernel data, per-channel arrays and scratch handles, each
    allocation rounded up to 4 bytes or its alignment, whichever is more. Graph inputs, the
    allocator's own structs and the I/O tensors are the rest (`tail_bound` of the whole model less
    this). None when an op is not modelled."""
    t = target_tail(graph, kernels)
    if t.bytes is None:
        return None
    per_op = sum(_up(size, align) for what, size, align in t.allocations
                 if what.startswith("op ") or what == "ScratchBufferHandle[]")
    owned = {x for op in graph.ops for x in op.outputs if x >= 0}
    owned |= {x for op in graph.ops for x in op.inputs if x >= 0 and graph.tensors[x].is_constant}
    return per_op + _NODE_AND_REGISTRATION * len(graph.ops) + _EVAL_TENSOR * len(owned)


# Runs of 16-aligned allocations the sequence can have (kernel data and per-channel arrays;
# variables and the input pointer array; the output pointer array): each may start after up to
# 12 bytes of padding.
_ALIGNED_RUNS = 3


def tail_bound(graph: Graph, kernels: KernelSet | Semantics = DEFAULT_KERNEL_SET) -> int | None:
    """An upper bound of `target_tail` that is additive over ops, so fit can select on it and a
    selection within a budget stays within it once realised: every allocation rounded up to 4
    bytes or its alignment (the sequence then stays 4-aligned, and rounding each step up to 4
    never passes that), and 12 bytes for each run of 16-aligned allocations (_ALIGNED_RUNS) to
    reach a 16-byte boundary from a 4-byte one. The exact tail depends on the op order (one-byte
    options between 4-aligned ones), which fit's selection does not know."""
    t = target_tail(graph, kernels)
    if t.bytes is None:
        return None
    return sum(_up(size, align) for _, size, align in t.allocations) + 12 * _ALIGNED_RUNS


def _up(size: int, align: int) -> int:
    step = max(align, 4)
    return -(-size // step) * step

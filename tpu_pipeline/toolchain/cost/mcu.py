"""MCU latency and energy model: instructions fitted on QEMU, converted to time per board.

Each op's instructions = per_unit x work + per_output x output elements + overhead (+ per_channel x
output channels, for the harness kernels whose rows have it: a set-up per channel per call), with the
coefficients of its fit class and kernel set from tpu_pipeline.toolchain/data/mcu_cost.toml (least squares on
the per-op instruction counts the harness firmware reports in QEMU; `tools/fit_mcu_cost.py`
refits them). Work is the op's multiply-accumulates (`tpu_pipeline.toolchain.ir.macs`: MACs for convolutions
and fully connected layers, window reads for pooling, input elements for reductions), its output
elements for other element-wise ops, and for ops that only move data (concatenation, pad,
slices, space/batch, resize, reshape) the contiguous runs they copy. A board turns instructions into cycles with its
`[compute] cycles_per_instruction` (core timing and flash wait states, cited in its TOML) at
`clock_hz`; energy = latency x `[power] active_w`.

A descriptor without `cycles_per_instruction` (a user's own TOML) keeps the older per-class
`[compute.cycles_per_mac]` rates: cycles = rate x work.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from tpu_pipeline.toolchain.cost.classes import op_class
from tpu_pipeline.toolchain.device import DEFAULT_KERNEL_SET, REFERENCE, Device, KernelSet
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.ir import Graph, macs
from tpu_pipeline.toolchain.ir import add, harness_ops, kernels as harness
from tpu_pipeline.toolchain.ir import stage
from tpu_pipeline.toolchain.ir.geometry import leading_pads

# Fit classes with no measurements of their own fall back along this chain.
_FALLBACK = {"pad": "data_movement", "strided_slice": "data_movement", "space_batch": "data_movement",
             "resize": "data_movement", "reshape": "data_movement", "concatenation": "data_movement",
             "data_movement": "other", "conv_1x1": "conv", "depthwise_3x3": "depthwise", "depthwise_opt": "depthwise", "relu": "elementwise",
             "quantize": "elementwise", "add": "elementwise", "mul": "elementwise", "elementwise": "other",
             "max_pool": "pool", "average_pool": "pool", "pool": "other", "mean": "other", "softmax": "other"}
# (a harness op's or faster variant's class not fitted yet is costed as its cost_fallback: ir/harness_ops.py)
DATA_MOVEMENT = ("pad", "strided_slice", "space_batch", "resize", "reshape", "concatenation")
_FIT_CLASS = {
    "FULLY_CONNECTED": "fully_connected", "ADD": "add", "SUB": "add", "MUL": "mul", "RELU": "relu", "RELU6": "relu",
    "QUANTIZE": "quantize", "DEQUANTIZE": "quantize", "MAX_POOL_2D": "max_pool", "AVERAGE_POOL_2D": "average_pool",
    "MEAN": "mean", "SUM": "mean", "SOFTMAX": "softmax", "CONCATENATION": "concatenation", "PAD": "pad",
    "PADV2": "pad", "STRIDED_SLICE": "strided_slice", "SLICE": "strided_slice", "SPACE_TO_BATCH_ND": "space_batch",
    "BATCH_TO_SPACE_ND": "space_batch", "RESIZE_NEAREST_NEIGHBOR": "resize", "RESIZE_BILINEAR": "resize",
    "RESHAPE": "reshape", "SQUEEZE": "reshape", "EXPAND_DIMS": "reshape"}


@dataclass(frozen=True)
class OpFeatures:
    fit_class: str
    work: int  # MACs (or window reads, input elements); output elements for data movement
    outputs: int  # output elements
    channels: int = 0  # a convolution's output channels (a kernel's set-up per channel: its `per_channel`)


def op_features(graph: Graph, i: int) -> OpFeatures:
    """The fit class and work of op `i` (what the fitted coefficients multiply)."""
    op = graph.ops[i]
    outputs = sum(graph.tensors[t].num_elements for t in op.outputs if t >= 0)
    cls = _FIT_CLASS.get(op.opcode) or {"conv": "conv", "depthwise": "depthwise"}.get(op_class(op.opcode), "other")
    if op.opcode == "CONV_2D" and _is_1x1(graph, op):
        cls = "conv_1x1"
    variant = harness.variant_of(op)
    if variant is not None:  # the harness's faster kernel (tpu_pipeline.toolchain.ir.kernel_variants)
        cls = variant.cost_class_of(graph, op) if variant.cost_class_of is not None else variant.cost_class
    elif op.opcode == "DEPTHWISE_CONV_2D":
        cls = _depthwise_path(graph, op)
    elif harness.is_harness(op) and harness_ops.by_code()[harness.custom_code(op)].cost_class:
        cls = harness_ops.by_code()[harness.custom_code(op)].cost_class  # TPUP_MEAN, ...: their own loops (tools/fit_harness_cost.py)
        if op.opcode == add.OPCODE and outputs < add.TABLE_MIN:
            cls = "add"  # (TPUP_ADD below its table: AddFunc per element, as the builtin)
    if cls in DATA_MOVEMENT:
        return OpFeatures(cls, _chunks(graph, op), int(outputs))
    m = macs(graph, i)
    work = outputs if cls == "other" or not m else m
    channels = graph.tensors[op.outputs[0]].shape[-1] if op.opcode in harness.CONVOLUTIONS else 0
    return OpFeatures(cls, int(work), int(outputs), int(channels))


def _chunks(graph: Graph, op) -> int:
    """Contiguous runs a data-movement kernel copies (each a memcpy or an inner loop): the output's
    rows (all dimensions but the last); for a concatenation, the outer size times the inputs."""
    out = graph.tensors[op.outputs[0]].shape if op.outputs and op.outputs[0] >= 0 else ()
    if op.opcode == "CONCATENATION" and out:
        axis = getattr(op.options, "axis", -1) % len(out)
        outer = 1
        for d in out[:axis]:
            outer *= d
        return outer * sum(1 for t in op.inputs if t >= 0)
    rows = 1
    for d in out[:-1]:
        rows *= d
    return rows


def _is_1x1(graph: Graph, op) -> bool:
    w = graph.tensors[op.inputs[1]].shape
    o = op.options
    return w[1] == 1 and w[2] == 1 and getattr(o, "dilation_w", 1) == 1 and getattr(o, "dilation_h", 1) == 1


def _depthwise_path(graph: Graph, op) -> str:
    """The kernel arm_depthwise_conv_wrapper_s8 picks (Cortex-M4, no MVE): the 3x3 kernel, the
    "opt" im2col kernel (both batch 1, one output channel per input channel, no dilation), else the
    generic one; also a shape class for the reference kernels."""
    x, w = graph.tensors[op.inputs[0]].shape, graph.tensors[op.inputs[1]].shape
    o = op.options
    if x[0] != 1 or getattr(o, "depth_multiplier", 1) != 1 or o.dilation_w != 1 or o.dilation_h != 1:
        return "depthwise"
    if w[1] == 3 and w[2] == 3 and max(leading_pads(graph, op)) <= 1:
        return "depthwise_3x3"
    return "depthwise_opt"


@lru_cache(maxsize=1)
def fitted_table() -> dict:
    """tpu_pipeline/toolchain/data/mcu_cost.toml: {kernels: {fit class: {per_unit, per_output, overhead}}}."""
    from tpu_pipeline.toolchain.data import DATA_DIR

    path = DATA_DIR / "mcu_cost.toml"
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: the fitted MCU cost model cannot be read ({exc}); "
                         "refit it with tools/fit_mcu_cost.py") from None


def coefficients(table: dict, cls: str) -> dict:
    """The coefficients for fit class `cls`, following the fallback chain to a fitted class."""
    c = cls
    fallbacks = {**_FALLBACK, **harness_ops.cost_fallbacks()}
    while c not in table:  # (a harness op or faster variant not fitted yet is costed as its builtin: its cost_fallback)
        c = fallbacks.get(c)
        if c is None:
            raise UsageError(f"the MCU cost model has no coefficients for op class '{cls}' (nor 'other')")
    return table[c]


def predict_instructions(f: OpFeatures, table: dict) -> float:
    c = coefficients(table, f.fit_class)
    return (c["per_unit"] * f.work + c.get("per_output", 0.0) * f.outputs + c.get("per_channel", 0.0) * f.channels
            + c["overhead"])


@dataclass(frozen=True)
class StageFeatures:
    """What a patch stage's instructions are made of (tpu_pipeline.toolchain.ir.stage)."""
    layers: float  # its tiles' layers at their classes' per-unit and per-output rates
    calls: int  # kernel calls: a layer on a tile
    rows: int  # output rows of those calls
    copied: int  # int8 elements copied: tiles' input boxes in, slices, tiles out
    ring_rows: int = 0  # output rows of overlapped calls (each its own kernel call into the ring)
    ring_copied: int = 0  # int8 elements those calls copy out of the ring
    pasted: int = 0  # int8 elements a 2-D streamed stage pastes (its caches and assembled inputs)
    paste_rows: int = 0  # rows of those pastes (a memmove each)


def stage_features(op, table: dict) -> StageFeatures:
    body = op.options.body
    tout = body.outputs[0]
    features = [op_features(body, j) for j in range(len(body.ops))]

    def priced(j: int, h: int, w: int) -> float:  # layer j on h x w of its output (the share of its work)
        whole = body.tensors[body.ops[j].outputs[0]].shape
        share = h * w / (whole[1] * whole[2])
        c = coefficients(table, _in_stage(features[j].fit_class, body.ops[j], h * w * whole[3]))
        return (c["per_unit"] * features[j].work * share + c.get("per_output", 0.0) * features[j].outputs * share
                + c.get("per_channel", 0.0) * features[j].channels)  # (a kernel's set-up, each call)

    # each layer's kernel overhead once, as the layer run whole pays it: a stage is then never
    # priced below its layers run whole (it runs the same kernels on the same elements, or more,
    # plus calls and copies), so fit takes one for memory, never for a speed it does not have
    layers = sum(coefficients(table, _in_stage(f.fit_class, body.ops[j], f.outputs)).get("overhead", 0.0)
                 for j, f in enumerate(features))
    for step in stage.steps(op.options):  # (the rows each call computes: a streamed stage computes each once)
        if step[0] == stage.CONV:
            layers += priced(step[1], step[8], step[9])
        elif step[0] == stage.ADD:
            layers += priced(step[1], step[13], step[14])
    calls = rows = copied = ring_rows = ring_copied = pasted = paste_rows = 0
    channels = {body.inputs[0]: body.tensors[body.inputs[0]].shape[3], -1: body.tensors[tout].shape[3]}
    for step in stage.steps(op.options):
        code = step[0]
        if code == stage.CONV:
            calls, rows = calls + 1, rows + step[8]
            if step[11] > 0:
                ring_rows += step[8]
                ring_copied += step[8] * step[9] * body.tensors[body.ops[step[1]].outputs[0]].shape[3]
        elif code == stage.ADD:
            calls, rows = calls + 1, rows + step[13]
        elif code == stage.SLICE:
            copied += step[4] * step[7] * step[8]
        elif code == stage.PASTE:  # (a 2-D streamed stage's caches and assembled inputs)
            pasted, paste_rows = pasted + step[3] * step[6] * step[7], paste_rows + step[6]
        elif code == stage.COPY_IN:
            copied += step[4] * step[5] * channels[body.inputs[0]]
        elif code == stage.COPY_OUT:
            copied += step[4] * step[5] * channels[-1]
    return StageFeatures(layers, calls, rows, copied, ring_rows, ring_copied, pasted, paste_rows)


def _in_stage(cls: str, op, elements: int) -> str:
    """The class a stage's layer is priced at on a call of `elements` outputs: its own, but an ADD
    step runs TPUP_ADD's arithmetic from add.STAGE_TABLE_MIN elements (harness/tpup_add.h), whatever
    kernel the layer had run whole."""
    return "tpup_add" if op.opcode == add.OPCODE and elements >= add.STAGE_TABLE_MIN else cls


def stage_instructions(op, table: dict) -> float:
    """A patch stage: its tiles' layers priced by their classes' rates, its overlapped calls by
    [K.overlap]'s, plus (fitted on QEMU by tools/fit_harness_cost.py: the [K.patch_stage] table) a
    cost per kernel call, per output row of a call and per element copied, and a 2-D streamed
    stage's pastes per element and per row (`per_pasted`, `per_paste_row`), all five fitted together
    over every stage form. These are effective rates: besides the calls and copies they absorb
    what small tiles cost the CMSIS-NN kernels beyond their whole-op rates (a tile's rows are
    short; 6-17 % of the layers' instructions on the calibration blocks, about 1 % with the
    reference kernels). Every layer's kernel overhead counts once (`stage_features`). Before that
    fit, every call is priced as a whole op's overhead and a copy as data movement."""
    f = stage_features(op, table)
    ring = table.get("overlap")  # overlapped calls: a call per row and its copy out of the ring
    rings = ring["per_unit"] * f.ring_rows + ring["per_output"] * f.ring_copied if ring is not None else 0.0
    c = table.get("patch_stage")
    dm = coefficients(table, "data_movement")
    if c is not None:  # (pastes by their own rates once fitted: per element and per row)
        pastes = c.get("per_pasted", dm["per_output"]) * f.pasted + c.get("per_paste_row", 0.0) * f.paste_rows
        return f.layers + rings + c["per_call"] * f.calls + c["per_row"] * f.rows + c["per_copied"] * f.copied \
            + pastes
    per_call = max(coefficients(table, cls)["overhead"] for cls in ("conv", "conv_1x1", "depthwise_3x3"))
    return f.layers + rings + per_call * f.calls + dm["per_output"] * (f.copied + f.pasted)


def overlap_instructions(graph: Graph, op, table: dict) -> float:
    """What an overlapped harness convolution adds to its kernel's cost: a kernel call per output
    row into a ring and a copy of each row ([K.overlap], fitted by tools/fit_harness_cost.py; 0
    before that fit)."""
    c = table.get("overlap")
    if c is None:
        return 0.0
    y = graph.tensors[op.outputs[0]]
    return c["per_unit"] * y.shape[1] + c["per_output"] * y.num_elements + c["overhead"]


@dataclass(frozen=True)
class McuOpCost:
    index: int  # position in graph.ops
    opcode: str
    op_class: str
    work: int  # MACs, or output elements for ops without MACs
    cycles: float
    seconds: float
    instructions: float | None = None  # fitted model (None with a descriptor's cycles_per_mac)
    fit_class: str | None = None


@dataclass(frozen=True)
class McuEstimate:
    device: str
    clock_hz: float
    ops: tuple[McuOpCost, ...]
    cycles: float
    latency_s: float
    energy_j: float
    active_w: float
    kernels: str = ""  # the kernel set's name
    instructions: float | None = None
    cycles_per_instruction: float | None = None
    source: str = "fitted"  # "fitted" (QEMU instructions x CPI) or "cycles_per_mac" (descriptor rates)

    def to_json(self) -> dict:
        return {"device": self.device, "clock_hz": self.clock_hz, "cycles": self.cycles,
                "latency_s": self.latency_s, "energy_j": self.energy_j, "active_w": self.active_w,
                "kernels": self.kernels, "instructions": self.instructions,
                "cycles_per_instruction": self.cycles_per_instruction, "source": self.source,
                "ops": [o.__dict__ for o in self.ops]}


def estimate_mcu(graph: Graph, device: Device, kernels: KernelSet = DEFAULT_KERNEL_SET) -> McuEstimate:
    """Predicted cycles, latency and energy of one inference of `graph` on an MCU with the
    TFLite Micro `kernels`."""
    if device.kind != "mcu":
        raise UsageError(f"device '{device.name}' has no [compute] clock_hz and cycles_per_mac "
                         "(is it an MCU descriptor?)")
    name, clock, cpm, active = device.name, device.compute.clock_hz, device.compute.cycles_per_mac, device.power.active_w
    cpi = device.compute.cycles_per_instruction
    tables = fitted_table() if cpi is not None else {}
    table = tables.get(kernels.cost_key)
    ops = []
    for i, op in enumerate(graph.ops):
        cls = op_class(op.opcode)
        if table is not None and stage.is_stage(op):
            instr = stage_instructions(op, table)
            cycles = instr * float(cpi)
            ops.append(McuOpCost(i, op.opcode, cls, macs(graph, i) or 0, cycles, cycles / clock, instr, "patch_stage"))
            continue
        if table is not None:
            f = op_features(graph, i)
            # the harness's direct convolution is the reference kernel, its direct depthwise one
            # CMSIS-NN's generic kernel (tpu_pipeline.toolchain.ir.kernels)
            direct = harness.DIRECT in harness.flags(op)
            if direct and op.opcode == "DEPTHWISE_CONV_2D":
                instr = predict_instructions(OpFeatures("depthwise", f.work, f.outputs), table)
            else:
                instr = predict_instructions(f, tables[REFERENCE.cost_key] if direct else table)
            if harness.OVERLAP in harness.flags(op):
                instr += overlap_instructions(graph, op, table)
            cycles = instr * float(cpi)
            ops.append(McuOpCost(i, op.opcode, cls, f.work, cycles, cycles / clock, instr, f.fit_class))
            continue
        m = macs(graph, i)
        if not m:
            m = sum(graph.tensors[t].num_elements for t in op.outputs if t >= 0)
        cycles = cpm[cls] * m
        ops.append(McuOpCost(i, op.opcode, cls, int(m), cycles, cycles / clock))
    total = sum(o.cycles for o in ops)
    latency = total / clock
    instructions = sum(o.instructions for o in ops) if table is not None else None
    return McuEstimate(name, clock, tuple(ops), total, latency, latency * active, active, kernels.name, instructions,
                       float(cpi) if table is not None else None, "fitted" if table is not None else "cycles_per_mac")


def bank_wait_cycles(graph: Graph, head_wait: int | None, input_wait: int | None = None) -> int:
    """The cycles RAM wait states add to one inference, where the board states them (a bank's
    `wait_states`; None: not stated, taken as covered by `cycles_per_instruction`): each op reads
    its activations and writes its outputs once, a 32-bit word per access, each access `wait`
    cycles longer in the bank that holds it: the head's bank, or the input's when it lies outside
    the arena (--input-outside-arena). A lower bound: kernels that re-read their input
    (convolution windows) touch it more often."""
    cycles = 0
    for op in graph.ops:
        for t in (*op.inputs, *op.outputs):
            if t < 0 or graph.tensors[t].is_constant:
                continue
            wait = (input_wait if t in graph.external else head_wait) or 0
            cycles += wait * -(-graph.tensors[t].nbytes // 4)
    return cycles

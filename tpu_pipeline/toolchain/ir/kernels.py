"""The harness's own kernels for int8 convolutions, means and products: per-op choices a model
carries as op codes.

TFLite Micro binds one kernel to each op code, so a model can only choose an implementation per op
if each implementation has its own code. Our MCU harness (tpu_pipeline/toolchain/data/firmware/harness/
tpup_conv.cc) registers two custom ops next to the kernel set's own:

    TPUP_CONV_2D            an int8 CONV_2D
    TPUP_DEPTHWISE_CONV_2D  an int8 DEPTHWISE_CONV_2D

(and TPUP_MEAN / TPUP_MUL, see "means and products" below, TPUP_FULLY_CONNECTED,
tpu_pipeline.toolchain.ir.fully_connected: the harness's own faster int8 fully connected kernel, whose
input 3 is its weights re-laid offline, and TPUP_ADD, tpu_pipeline.toolchain.ir.add: an int8 ADD of
equal shapes, each input's scaled term tabulated once a call).

They compute exactly what the builtins compute (the same CMSIS-NN functions in a CMSIS-NN build,
TFLite's reference kernels in a reference build: bit-identical outputs), and differ in what they
keep in RAM:

- **requantization in flash**: the per-channel output multipliers and shifts are computed here,
  exactly as TFLite Micro's Prepare computes them (`requant`), and stored as an int32 [2, C]
  constant input of the op. The builtins compute them into the arena's persistent tail at
  Prepare (8 bytes per output channel); the harness op keeps no persistent data at all: its
  options (geometry, offsets, activation range) are read from the flatbuffer at every invoke.
- **explicit padding**: the leading padding is an option (`padding == "EXPLICIT"`, `pad_top`,
  `pad_left` in the options record), so a PAD op in front of a convolution folds into it
  whatever its amounts (PyTorch-style symmetric padding differs from TFLite's SAME);
- **direct** (`+direct`): no kernel buffer in the arena: TFLite's reference convolution, one
  output at a time (slower than CMSIS-NN's im2col kernel); for a depthwise convolution CMSIS-NN's
  generic kernel in a CMSIS-NN build (its "opt" kernel copies a window of all channels);
- **overlap** (`+overlap`): the output may be planned over the input's bytes, both from the same
  first byte (in place for a depthwise convolution; a larger output, such as an expansion's, runs
  its rows last to first). The kernel computes output rows into a small ring of rows and writes
  each row out once no row still to compute reads the input bytes under it (`overlap.ring_rows_for`
  sizes the ring); a run of rows whose bytes cover no input still to be read goes straight out in
  one call (`overlap.overlap_schedule`: a stride-2 layer or an expansion makes a few calls, not
  one per row).
- **faster variants** (`+fast`, ...: tpu_pipeline.toolchain.ir.kernel_variants, one module each):
  the harness's own kernels for some shapes of an op, in both firmware builds, bit-identical and
  needing no buffer; the model on the harness (fit's `on_harness`) takes each where it wins
  (`winning_variant`). "fast" is the depthwise one (harness/tpup_depthwise.cc).

**In place** (`kernel` = "in-place", builtin ADD and MUL, any kernel set): the offline plan lays
the output over an input of its shape that dies at the op (`in_place_source`). Both kernel sets
read each element (CMSIS-NN: each group of four) before writing it, so the op runs in place with
its own builtin kernel, and nothing marks it but the plan: a reader infers it where the plan puts
the output at its source's offset (`infer_in_place`), which no plan of two live tensors can do.
So does TPUP_ADD, which in place stays on the harness (`HARNESS_IN_PLACE`; its builtin view: the
builtin in place).

In the IR such an op is still a CONV_2D / DEPTHWISE_CONV_2D, with `kernel` = "tpup" plus its flags
("tpup+direct+overlap"), so every pass sees a convolution; only the memory model, the cost model
and the writer look at the kernel. Runtimes without the harness (LiteRT, the host's TFLite Micro)
run `builtin_view`: builtin codes, the requantization input dropped, a PAD re-inserted where the
padding is not SAME or VALID.

Options on disk (custom options, little-endian int32): [format 1, builtin version, flags
(1 direct, 2 overlap, each variant's own bits (4 fast, 8 packed, 0x100 pointwise and 0x200 its proof,
0x400 window and 0x800 its proof, 0x2000 dw3),
padding mode << 4: 0 explicit, 1 same, 2 valid), pad_top, pad_left,
stride_h, stride_w, dilation_h, dilation_w, depth_multiplier, activation (0 none, 1 relu,
2 relu_n1_to_1, 3 relu6), input_offset, output_offset, activation_min, activation_max, ring_rows].
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.ir.geometry import leading_pads, window
from tpu_pipeline.toolchain.ir.graph import Graph, Op, Tensor
from tpu_pipeline.toolchain.ir.requant import ACTIVATION_CODE, activation_range, quantize_multiplier, requant
from tpu_pipeline.toolchain.ir import add, fully_connected as fc, harness_ops, kernel_variants, stage
from tpu_pipeline.toolchain.ir.mean_mul import per_tensor_int8, mean_axes, mean_requant, mul_broadcast, mul_requant
from tpu_pipeline.toolchain.ir.options import (Conv2DOptions, DepthwiseConv2DOptions, FieldlessOptions, MulOptions,
                                               ReducerOptions)

TPUP = "tpup"
IN_PLACE = "in-place"  # a builtin elementwise op planned over a dying input (see the module docstring)
IN_PLACE_OPS = frozenset({"ADD", "MUL"})
HARNESS_IN_PLACE = "tpup+in-place"  # TPUP_ADD planned over a dying input (no bit on disk: the plan says it)
HARNESS_IN_PLACE_OPS = frozenset({add.OPCODE})  # the harness ops that stay on the harness in place
DIRECT, OVERLAP = "direct", "overlap"  # the memory flags (fit trades them against time)
FAST = kernel_variants.fast_depthwise.VARIANT.flag  # (the depthwise variant, which tests and tools name)
POINTWISE = kernel_variants.pointwise.VARIANT.flag  # (the 1x1 variant)
# The schema's BuiltinOperator values (tests/test_kernel_choice.py checks them against the schema;
# this module must not import the writer, which imports it).
BUILTIN_CODE = {"CONV_2D": 3, "DEPTHWISE_CONV_2D": 4, "PAD": 34, "MEAN": 40, "MUL": 18, "ADD": 0, fc.OPCODE: fc.BUILTIN}
CONVOLUTIONS = ("CONV_2D", "DEPTHWISE_CONV_2D")
FORMAT = 1
_WORDS = 16
_MEMORY_FLAG_BITS = {DIRECT: 1, OVERLAP: 2}
_PADDING_BITS = 0x30  # (the padding mode, << 4)
_PADDING_MODE = {"EXPLICIT": 0, "SAME": 1, "VALID": 2}


# ---- kernel names ---------------------------------------------------------------------------------
def flag_bits() -> dict[str, int]:
    """Every flag in canonical order (the memory flags, then the registered variants) -> its bit."""
    return {**_MEMORY_FLAG_BITS, **{f: v.bit for f, v in kernel_variants.registered().items()}}


def kernel_name(*flags: str) -> str:
    """The `Op.kernel` of a harness kernel with `flags` (canonical order)."""
    known = flag_bits()
    unknown = set(flags) - set(known)
    if unknown:
        raise ValueError(f"unknown harness kernel flags {sorted(unknown)}")
    return "+".join([TPUP, *(f for f in known if f in flags)])


def is_harness(op: Op) -> bool:
    return op.kernel.split("+")[0] == TPUP


def flags(op: Op) -> frozenset[str]:
    """The flags of a harness kernel (empty for a builtin one)."""
    return frozenset(op.kernel.split("+")[1:]) if is_harness(op) else frozenset()


def runs_in_place(op: Op) -> bool:
    return op.kernel in (IN_PLACE, HARNESS_IN_PLACE)


def in_place_source(graph: Graph, i: int) -> int | None:
    """The input an elementwise op's output may take the bytes of: its first int8 activation input
    of the output's shape that op i reads last in every order, not a graph output nor kept
    outside the arena (and the output no graph input); None when there is none."""
    op = graph.ops[i]
    if op.opcode not in IN_PLACE_OPS or len(op.outputs) != 1 or op.outputs[0] in graph.inputs:
        return None
    y = graph.tensors[op.outputs[0]]
    if y.dtype != "int8" or not graph.is_activation(op.outputs[0]):
        return None
    for t in op.inputs:
        if t < 0 or not graph.is_activation(t) or t in graph.outputs or t in graph.external or t == op.outputs[0]:
            continue
        x = graph.tensors[t]
        if x.dtype == y.dtype and x.shape == y.shape and graph.reads_last(i, t):
            return t
    return None


def with_in_place(graph: Graph, op_positions) -> Graph:
    """`graph` with the elementwise ops at `op_positions` run in place (ValueError where an op has
    no input to run over): a TPUP_ADD on the harness (`HARNESS_IN_PLACE`), any other on its builtin."""
    ops = list(graph.ops)
    for i in op_positions:
        if in_place_source(graph, i) is None:
            raise ValueError(f"op {i} ({graph.ops[i].opcode}) has no input its output can be laid over")
        harness = is_harness(ops[i]) and ops[i].opcode in HARNESS_IN_PLACE_OPS
        ops[i] = dataclasses.replace(ops[i], kernel=HARNESS_IN_PLACE if harness else IN_PLACE)
    return dataclasses.replace(graph, ops=tuple(ops))


def infer_in_place(graph: Graph, plan: list[int]) -> Graph:
    """`graph` with the elementwise ops an offline plan runs in place marked so: the output planned
    at its source's offset."""
    chosen = []
    for i, op in enumerate(graph.ops):
        if op.opcode in IN_PLACE_OPS and (not op.kernel or (op.kernel == TPUP and op.opcode in HARNESS_IN_PLACE_OPS)):
            src, dst = in_place_source(graph, i), op.outputs[0]
            if src is not None and max(src, dst) < len(plan) and plan[src] >= 0 and plan[src] == plan[dst]:
                chosen.append(i)
    return with_in_place(graph, chosen) if chosen else graph


def custom_codes() -> dict[str, str]:
    """Op code -> the custom op code it is written under (tpu_pipeline.toolchain.ir.harness_ops, read
    at call time: the convolutions, MEAN and MUL (see "Means and products" below), FULLY_CONNECTED,
    the patch stage)."""
    return {h.opcode: h.custom_code for h in harness_ops.REGISTRY}


def builtin_of() -> dict[str, str]:
    """Custom op code -> the op code it runs (custom_codes reversed)."""
    return {h.custom_code: h.opcode for h in harness_ops.REGISTRY}


def custom_code(op: Op) -> str:
    """The custom op code a harness op is written and registered under."""
    return custom_codes()[op.opcode]


# ---- which ops the harness runs -----------------------------------------------------------------
def can_run_harness(graph: Graph, i: int) -> bool:
    """An int8 CONV_2D or DEPTHWISE_CONV_2D on [1, H, W, C] tensors with int8 filters (per channel
    or per tensor), an int32 bias or none, and an activation the kernels apply as a clamp."""
    op = graph.ops[i]
    if op.opcode in MEAN_MUL:
        return mean_mul_refusal(graph, op) is None
    if op.opcode not in custom_codes() or len(op.inputs) < 2 or op.inputs[1] < 0:
        return False
    o = op.options
    if not isinstance(o, (Conv2DOptions, DepthwiseConv2DOptions)) or o.fused_activation not in ACTIVATION_CODE:
        return False
    x, w, y = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]], graph.tensors[op.outputs[0]]
    if not (x.dtype == w.dtype == y.dtype == "int8") or not w.is_constant:
        return False
    if any(t.quant is None or not t.quant.scale for t in (x, w, y)):
        return False
    if len(x.shape) != 4 or len(w.shape) != 4 or len(y.shape) != 4 or x.shape[0] != 1:
        return False
    channels = w.shape[0] if op.opcode == "CONV_2D" else w.shape[3]
    if len(w.quant.scale) not in (1, channels):
        return False
    bias = op.inputs[2] if len(op.inputs) > 2 else -1
    return bias < 0 or (graph.tensors[bias].dtype == "int32" and graph.tensors[bias].is_constant)


def can_run_variant(graph: Graph, i: int, flag: str) -> bool:
    """Whether the registered variant `flag` (tpu_pipeline.toolchain.ir.kernel_variants) runs op i."""
    v = kernel_variants.registered()[flag]
    return graph.ops[i].opcode == v.opcode and can_run_harness(graph, i) and v.applies(graph, i)


def variant_of(op: Op):
    """The registered variant a harness op runs on (None: the kernel set's paths)."""
    found = kernel_variants.registered()
    return next((found[f] for f in flags(op) if f in found), None)


def winning_variant(graph: Graph, i: int, relaid: bool | frozenset[str] = True) -> str | None:
    """The flag of the first registered variant a harness op on the kernel set's paths goes on
    wherever it may: it can run it, and QEMU measured it faster there (`wins`). A variant needs no
    buffer; one with a constant input of its own (packed, window: weights re-laid in flash, larger
    than the model's) adds that tensor's entry to TFLite Micro's tail (16 bytes). Those only where
    `relaid_allowed` (a board whose flash cannot hold every op's re-laid weights)."""
    op = graph.ops[i]
    if not is_harness(op) or op.opcode in MEAN_MUL or variant_of(op) is not None:
        return None
    ok = relaid_allowed(graph, i, relaid)
    return next((f for f, v in kernel_variants.registered().items()
                 if (ok or v.constant_input is None) and can_run_variant(graph, i, f) and v.wins(graph, i)),
                None)


def relaid_allowed(graph: Graph, i: int, relaid: bool | frozenset[str]) -> bool:
    """Whether op i may run a kernel on weights re-laid in flash: `relaid` True (every op), False
    (none), or the first-output names of the ops that may (fit/flash.py chooses them where the
    board's flash holds only some; names, as they survive the rewrites fit splices in)."""
    if isinstance(relaid, bool):
        return relaid
    outputs = graph.ops[i].outputs
    return bool(outputs) and outputs[0] >= 0 and graph.tensors[outputs[0]].name in relaid


def can_run_direct(graph: Graph, i: int) -> bool:
    """Every harness convolution has a direct kernel: TFLite's reference convolution (no im2col
    buffer), and for a depthwise convolution CMSIS-NN's generic kernel (no int16 copy of a window
    over all channels, which its "opt" kernel asks for: C x kh x kw x 2 bytes)."""
    return graph.ops[i].opcode in CONVOLUTIONS and can_run_harness(graph, i)


# ---- choosing kernels -------------------------------------------------------------------------------
def with_kernel(graph: Graph, op_positions, kernel: str) -> Graph:
    """`graph` with the ops at `op_positions` on `kernel` ("" = the kernel set's own; a harness
    kernel name from `kernel_name`). A harness op gets its requantization constant as input 3;
    an op going back to its builtin loses it (and must not have explicit padding)."""
    chosen = sorted(set(op_positions))
    tensors, ops = list(graph.tensors), list(graph.ops)
    wanted = set(kernel.split("+")[1:]) if kernel else set()
    for i in chosen:
        op = graph.ops[i]
        if kernel:
            kernel_name(*wanted)  # validates the flags
            variants = wanted & set(kernel_variants.registered())
            if not can_run_harness(graph, i) or (op.opcode in MEAN_MUL and wanted) or len(variants) > 1 \
                    or any(not can_run_variant(graph, i, f) for f in variants):
                raise ValueError(f"op {i} ({op.opcode}) cannot run the harness kernel '{kernel}'")
            inputs = (fc.with_constant(graph, op, tensors) if op.opcode == fc.OPCODE  # (its own constant)
                      else op.inputs if op.opcode in MEAN_MUL else _with_requant(graph, op, tensors))
            if op.opcode not in MEAN_MUL:
                inputs = _with_variant_constant(graph, op, tensors, inputs, variants)
        elif op.opcode in MEAN_MUL:
            inputs = op.inputs[:3] if op.opcode == fc.OPCODE else op.inputs
        else:
            if op.options is not None and getattr(op.options, "padding", "") == "EXPLICIT":
                raise ValueError(f"op {i} ({op.opcode}) has explicit padding: only a harness kernel runs it")
            inputs = op.inputs[:3]
        ops[i] = dataclasses.replace(op, inputs=tuple(inputs), kernel=kernel)
    return dataclasses.replace(graph, tensors=tuple(tensors), ops=tuple(ops))


def with_flag(graph: Graph, op_positions, flag: str) -> Graph:
    """`graph` with the ops at `op_positions` on a harness kernel that has `flag` besides the flags
    each already has."""
    for i in sorted(set(op_positions)):
        graph = with_kernel(graph, [i], kernel_name(*flags(graph.ops[i]), flag))
    return graph


def _with_requant(graph: Graph, op: Op, tensors: list[Tensor]) -> tuple[int, ...]:
    if is_harness(op):
        return op.inputs
    bias = op.inputs[2] if len(op.inputs) > 2 else -1
    values = requant(graph, op)
    name = f"{graph.tensors[op.outputs[0]].name}/requant"
    data = np.frombuffer(values.astype("<i4").tobytes(), dtype=np.uint8).copy()
    data.setflags(write=False)
    t = Tensor(len(tensors), name, "int32", values.shape, data=data)
    tensors.append(t)
    return op.inputs[0], op.inputs[1], bias, t.index


def _with_variant_constant(graph: Graph, op: Op, tensors: list[Tensor], inputs, variants) -> tuple[int, ...]:
    """A harness convolution's four inputs, and input 4 when its variant reads a constant of its own."""
    v = kernel_variants.registered()[next(iter(variants))] if variants else None
    if v is None or v.constant_input is None:
        return tuple(inputs[:4])
    if len(inputs) > 4 and inputs[4] >= 0 and variant_of(op) is v:
        return tuple(inputs[:5])
    values = v.constant_input(graph, op)
    data = np.frombuffer(values.astype(f"<{values.dtype.str[1:]}").tobytes(), dtype=np.uint8).copy()
    data.setflags(write=False)
    t = Tensor(len(tensors), f"{graph.tensors[op.outputs[0]].name}/{v.flag}", values.dtype.name, values.shape,
               data=data)
    tensors.append(t)
    return (*inputs[:4], t.index)


def kernel_choices(graph: Graph) -> dict[int, str]:
    """Op position -> chosen kernel, for the ops not on the kernel set's own."""
    return {i: op.kernel for i, op in enumerate(graph.ops) if op.kernel}


# ---- what runtimes without the harness run ------------------------------------------------------
def builtin_view(graph: Graph) -> Graph:
    """`graph` with every op on its builtin kernel: harness ops lose their requantization input,
    and explicit padding becomes SAME or VALID where it equals one, else a PAD (the input's
    zero point: what the kernels pad with) in front of a VALID convolution. Tensors only a
    harness op read (the requantization constants) are dropped."""
    return builtin_view_mapped(graph)[0]


def builtin_view_mapped(graph: Graph) -> tuple[Graph, dict[int, int]]:
    """`builtin_view`, and where each of `graph`'s tensors went (tensor index -> index in the view;
    dropped ones absent)."""
    if not any(is_harness(op) for op in graph.ops):
        return graph, {t.index: t.index for t in graph.tensors}
    graph = _expand_stages(graph)
    tensors, ops = list(graph.tensors), []
    # (the requantization input 3, and a variant's constant input 4)
    requants = {t for op in graph.ops if is_harness(op) and (op.opcode not in MEAN_MUL or op.opcode == fc.OPCODE)
                for t in op.inputs[3:] if t >= 0}
    for op in graph.ops:
        if not is_harness(op) or op.opcode in MEAN_MUL:  # (a mean, product or sum keeps its builtin operands)
            kept = op.inputs[:3] if is_harness(op) and op.opcode == fc.OPCODE else op.inputs  # (FC: its constant goes)
            kernel = IN_PLACE if op.kernel == HARNESS_IN_PLACE else ""  # (in place: so the builtin)
            ops.append(dataclasses.replace(op, inputs=kept, kernel=kernel) if is_harness(op) else op)
            continue
        o, x = op.options, op.inputs[0]
        inputs = op.inputs[:3] if op.inputs[2:3] != (-1,) else op.inputs[:2]
        if o.padding == "EXPLICIT":
            mode = named_padding(graph, op)
            if mode is not None:
                o = dataclasses.replace(o, padding=mode, pad_top=0, pad_left=0)
            else:
                padded = _pad_in_front(graph, op, tensors, ops)
                o = dataclasses.replace(o, padding="VALID", pad_top=0, pad_left=0)
                inputs = (padded, *inputs[1:])
        ops.append(dataclasses.replace(op, inputs=tuple(inputs), options=o, kernel=""))
    used = {t for op in ops for t in (*op.inputs, *op.outputs, *op.intermediates) if t >= 0}
    used |= set(graph.inputs) | set(graph.outputs)
    dropped = requants - used
    if dropped:
        keep = [t for t in tensors if t.index not in dropped]
        remap = {t.index: k for k, t in enumerate(keep)}
        tensors = [dataclasses.replace(t, index=remap[t.index]) for t in keep]

        def moved(ts):
            return tuple(remap[t] if t >= 0 else t for t in ts)

        ops = [dataclasses.replace(op, inputs=moved(op.inputs), outputs=moved(op.outputs),
                                   intermediates=moved(op.intermediates)) for op in ops]
        view = dataclasses.replace(graph, tensors=tuple(tensors), ops=tuple(ops), inputs=moved(graph.inputs),
                                   outputs=moved(graph.outputs))
        return view, {old: new for old, new in remap.items() if old < len(graph.tensors)}
    view = dataclasses.replace(graph, tensors=tuple(tensors), ops=tuple(ops))
    return view, {t.index: t.index for t in graph.tensors}


def _expand_stages(graph: Graph) -> Graph:
    """Every patch stage replaced by its body's layers (new tensors appended after the graph's)."""
    if not any(stage.is_stage(op) for op in graph.ops):
        return graph
    tensors, ops = list(graph.tensors), []
    for i, op in enumerate(graph.ops):
        if stage.is_stage(op):
            new_ops, new_tensors = stage.expand(dataclasses.replace(graph, tensors=tuple(tensors)), i)
            ops += new_ops
            tensors += new_tensors
        else:
            ops.append(op)
    return dataclasses.replace(graph, tensors=tuple(tensors), ops=tuple(ops))


def named_padding(graph: Graph, op: Op) -> str | None:
    """"SAME" or "VALID" when the op's explicit padding is exactly what that mode gives."""
    for mode in ("VALID", "SAME"):
        probe = dataclasses.replace(op, options=dataclasses.replace(op.options, padding=mode))
        if leading_pads(graph, probe) == leading_pads(graph, op) and _out_size(graph, op, mode):
            return mode
    return None


def _out_size(graph: Graph, op: Op, mode: str) -> bool:
    """Whether `mode` gives the op's output its stored height and width."""
    x, y, w = (graph.tensors[op.inputs[0]].shape, graph.tensors[op.outputs[0]].shape,
               graph.tensors[op.inputs[1]].shape)
    o = op.options
    for n, out, k, s, d in ((x[1], y[1], w[1], o.stride_h, o.dilation_h), (x[2], y[2], w[2], o.stride_w, o.dilation_w)):
        eff = (k - 1) * d + 1
        want = -(-n // s) if mode == "SAME" else (n - eff) // s + 1
        if want != out:
            return False
    return True


def _pad_in_front(graph: Graph, op: Op, tensors: list[Tensor], ops: list[Op]) -> int:
    """Append a PAD of op's input to the padded size its window reads; returns the padded tensor."""
    x_t, y, w = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]].shape, graph.tensors[op.inputs[1]].shape
    o = op.options
    pads = []
    for axis, (n, out, k, s, d, before) in enumerate(((x_t.shape[1], y[1], w[1], o.stride_h, o.dilation_h, o.pad_top),
                                                       (x_t.shape[2], y[2], w[2], o.stride_w, o.dilation_w, o.pad_left))):
        need = (out - 1) * s + (k - 1) * d + 1  # rows the VALID window reads
        pads.append((before, max(need - before - n, 0)))
    shape = (1, x_t.shape[1] + sum(pads[0]), x_t.shape[2] + sum(pads[1]), x_t.shape[3])
    values = np.array([[0, 0], list(pads[0]), list(pads[1]), [0, 0]], dtype="<i4")
    data = np.frombuffer(values.tobytes(), dtype=np.uint8).copy()
    data.setflags(write=False)
    paddings = Tensor(len(tensors), f"{x_t.name}/paddings_{y}", "int32", (4, 2), data=data)
    tensors.append(paddings)
    padded = Tensor(len(tensors), f"{graph.tensors[op.outputs[0]].name}/padded_input", x_t.dtype, shape,
                    quant=x_t.quant)
    tensors.append(padded)
    ops.append(Op("PAD", (x_t.index, paddings.index), (padded.index,), None, FieldlessOptions("PadOptions"),
                  BUILTIN_CODE["PAD"], 2))
    return padded.index


# ---- the custom op's options <-> the IR ---------------------------------------------------------
def encode_options(graph: Graph, op: Op, ring_rows: int = 0) -> bytes:
    """The custom options of harness op `op` (see the module docstring)."""
    if op.opcode in MEAN_MUL:
        return _encode_mean_mul(graph, op)
    o = op.options
    top, left = leading_pads(graph, op)
    x, y = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    lo, hi = activation_range(graph, op)
    known = flag_bits()
    bits = sum(known[f] for f in flags(op)) | _PADDING_MODE[o.padding] << 4
    variant = variant_of(op)
    if variant is not None and variant.derived_bits is not None:
        bits |= variant.derived_bits(graph, op) & variant.derived_mask
    multiplier = o.depth_multiplier if op.opcode == "DEPTHWISE_CONV_2D" else 1
    return struct.pack(f"<{_WORDS}i", FORMAT, op.version, bits, top, left, o.stride_h, o.stride_w, o.dilation_h,
                       o.dilation_w, multiplier, ACTIVATION_CODE[o.fused_activation], -int(x.quant.zero_point[0]),
                       int(y.quant.zero_point[0]), lo, hi, ring_rows)


def decode_options(opcode: str, custom_options, where: str) -> tuple[str, object, int, str]:
    """(builtin name, options record, builtin version, kernel) of a harness op read from a model;
    ModelError if its options are malformed."""
    raw = bytes(bytearray(custom_options if custom_options is not None else b""))
    name = builtin_of()[opcode]
    if name in MEAN_MUL:
        return _decode_mean_mul(name, raw, where)
    if len(raw) != 4 * _WORDS:
        raise ModelError(f"{where}: {opcode} has {len(raw)} bytes of options, expected {4 * _WORDS}")
    w = struct.unpack(f"<{_WORDS}i", raw)
    fmt, version, bits, top, left, sh, sw, dh, dw, mult, act = w[:11]
    mode = {v: k for k, v in _PADDING_MODE.items()}.get((bits & _PADDING_BITS) >> 4)
    activation = {v: k for k, v in ACTIVATION_CODE.items()}.get(act)
    known = flag_bits()
    derived = {f: v.derived_mask for f, v in kernel_variants.registered().items()}
    stray_derived = any(bits & m and not bits & known[f] for f, m in derived.items())
    if fmt != FORMAT or mode is None or activation is None or min(sh, sw, dh, dw, mult, version) < 1 \
            or min(top, left) < 0 or bits & ~(sum(known.values()) | sum(derived.values()) | _PADDING_BITS) \
            or stray_derived:
        raise ModelError(f"{where}: {opcode} has invalid options {list(w)}")
    kernel = kernel_name(*(f for f, b in known.items() if bits & b))
    pads = {"pad_top": top, "pad_left": left} if mode == "EXPLICIT" else {}
    if name == "CONV_2D":
        options = Conv2DOptions(padding=mode, stride_w=sw, stride_h=sh, fused_activation=activation, dilation_w=dw,
                                dilation_h=dh, **pads)
    else:
        options = DepthwiseConv2DOptions(padding=mode, stride_w=sw, stride_h=sh, depth_multiplier=mult,
                                         fused_activation=activation, dilation_w=dw, dilation_h=dh, **pads)
    return name, options, version, kernel


def requant_tensor_ok(graph: Graph, op: Op) -> bool:
    """Whether a harness op's requantization input holds what TFLite Micro would compute (a model
    edited elsewhere may have stale ones)."""
    if op.opcode == fc.OPCODE:
        return fc.constant_ok(graph, op)
    if op.opcode in MEAN_MUL:
        return True  # (no requantization input: its options carry it, written from the tensors)
    if len(op.inputs) < 4 or op.inputs[3] < 0:
        return False
    t = graph.tensors[op.inputs[3]]
    if not (t.is_constant and t.dtype == "int32" and np.array_equal(t.values(), requant(graph, op))):
        return False
    v = variant_of(op)
    if v is None or v.constant_input is None:
        return len(op.inputs) == 4
    if len(op.inputs) != 5 or op.inputs[4] < 0:
        return False
    c, want = graph.tensors[op.inputs[4]], v.constant_input(graph, op)
    return c.is_constant and c.dtype == want.dtype.name and np.array_equal(c.values(), want)


# ---- means and products: TPUP_MEAN and TPUP_MUL ------------------------------------------------
# TFLite Micro's int8 MEAN runs its generic reduction (an index vector stepped per element: about
# 170 instructions an element in QEMU) and its broadcast MUL its 4-D "slow" loop (about 50); a
# squeeze-and-excitation block spends a fifth of MCUNetV2's inference there. The harness's two ops
# compute the same integers in a plain loop (harness/tpup_mean_mul.cc): a MEAN over one run of
# adjacent axes ([outer, reduced, inner]: per output an int32 sum, less the input zero point times
# the count, requantized with the multiplier TFLite's QuantizedMeanOrSum derives for that count)
# and a MUL of equal shapes or with one operand broadcast along the last axis or a scalar (TFLite's
# MulElementwise per element). Their requantization is computed here, as TFLite Micro's Prepare
# computes it, and carried in the options: no persistent data, no scratch (TFLite's MEAN asks for
# an int32 per output and two index vectors). Options (little-endian int32):
#   TPUP_MEAN [format 1, builtin version, outer, reduced, inner, input zero point, output zero
#              point, multiplier, shift, keep_dims]
#   TPUP_MUL  [format 1, builtin version, broadcast (0 none, 1 input 2, 2 input 1), input 1 offset,
#              input 2 offset, output offset, multiplier, shift, activation min, max, activation]
# (and FULLY_CONNECTED, ir.fully_connected, and ADD, ir.add: the harness's own loops, no requantization
# input 3, no flags, no scratch, no tail; a FULLY_CONNECTED's input 3 is its packed constant)
MEAN_MUL = ("MEAN", "MUL", fc.OPCODE, add.OPCODE)
_MEAN_WORDS, _MUL_WORDS = 10, 11


def mean_mul_refusal(graph: Graph, op: Op) -> str | None:
    """Why TPUP_MEAN / TPUP_MUL / TPUP_FULLY_CONNECTED / TPUP_ADD cannot run `op` (None when it can)."""
    if op.opcode == fc.OPCODE:
        return fc.refusal(graph, op)
    if op.opcode == add.OPCODE:
        return add.refusal(graph, op)
    if len(op.outputs) != 1 or len(op.inputs) != 2 or min(op.inputs) < 0:
        return "not two inputs and one output"
    x, y = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    if op.opcode == "MEAN":
        if not isinstance(op.options, ReducerOptions) or not (per_tensor_int8(x) and per_tensor_int8(y)):
            return "not an int8 MEAN with per-tensor quantization"
        axes = mean_axes(graph, op)
        if axes is None or axes[1] < 1 or axes[0] * axes[2] != y.num_elements:
            return "its axes are not one run of adjacent axes"
        s = quantize_multiplier(float(np.float32(x.quant.scale[0])) / float(np.float32(y.quant.scale[0])))[1]
        return None if 31 + s >= 0 else "its scale ratio is below 2^-31"
    b = graph.tensors[op.inputs[1]]
    if not isinstance(op.options, MulOptions) or op.options.fused_activation not in ACTIVATION_CODE \
            or not all(per_tensor_int8(t) for t in (x, b, y)):
        return "not an int8 MUL with per-tensor quantization"
    return None if mul_broadcast(graph, op) is not None else "its broadcast is not along the last axis"


def _encode_mean_mul(graph: Graph, op: Op) -> bytes:
    if op.opcode == fc.OPCODE:
        return fc.encode(graph, op)
    if op.opcode == add.OPCODE:
        return add.encode(graph, op)
    x, y = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    zx, zy = int(x.quant.zero_point[0]), int(y.quant.zero_point[0])
    if op.opcode == "MEAN":
        outer, reduced, inner = mean_axes(graph, op)
        m, s = mean_requant(graph, op)
        return struct.pack(f"<{_MEAN_WORDS}i", FORMAT, op.version, outer, reduced, inner, zx, zy, m, s,
                           int(op.options.keep_dims))
    zb = int(graph.tensors[op.inputs[1]].quant.zero_point[0])
    m, s = mul_requant(graph, op)
    lo, hi = activation_range(graph, op)
    return struct.pack(f"<{_MUL_WORDS}i", FORMAT, op.version, mul_broadcast(graph, op), -zx, -zb, zy, m, s, lo, hi,
                       ACTIVATION_CODE[op.options.fused_activation])


def _decode_mean_mul(name: str, raw: bytes, where: str) -> tuple[str, object, int, str]:
    if name in (fc.OPCODE, add.OPCODE):
        options, version = (fc if name == fc.OPCODE else add).decode(raw, where)
        return name, options, version, kernel_name()
    words = _MEAN_WORDS if name == "MEAN" else _MUL_WORDS
    code = custom_codes()[name]
    if len(raw) != 4 * words:
        raise ModelError(f"{where}: {code} has {len(raw)} bytes of options, expected {4 * words}")
    w = struct.unpack(f"<{words}i", raw)
    if name == "MEAN":
        if w[0] != FORMAT or w[1] < 1 or min(w[2:5]) < 1 or w[9] not in (0, 1):
            raise ModelError(f"{where}: {code} has invalid options {list(w)}")
        return name, ReducerOptions(keep_dims=bool(w[9])), w[1], kernel_name()
    activation = {v: k for k, v in ACTIVATION_CODE.items()}.get(w[10])
    if w[0] != FORMAT or w[1] < 1 or w[2] not in (0, 1, 2) or activation is None or w[8] > w[9]:
        raise ModelError(f"{where}: {code} has invalid options {list(w)}")
    return name, MulOptions(fused_activation=activation), w[1], kernel_name()

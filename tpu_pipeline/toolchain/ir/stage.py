"""A patch stage: a region of layers run tile by tile inside one harness op, TPUP_PATCH_STAGE.

Patch-based execution by copies (`rewrite.patch`) gives every tile its own ops: each one a node, an
output tensor and kernel data in TFLite Micro's persistent tail, and the tiles joined by
concatenations that hold the output twice. A patch stage is what TinyEngine's generated code does
instead: one op whose Eval loops over the tiles, running the region's layers on each tile's boxes
in a scratch buffer and writing each tile's result straight into the output tensor. Its arena is
the region's input, its output and the largest tile's working set; its tail is one node.

In the IR the stage is one op, opcode "TPUP_PATCH_STAGE" on the harness kernel, whose inputs are
the region's input and every constant its layers read, whose output is the region's output, and
whose options are a `PatchStage`: the region as a graph of its own (`body`, for the host
runtimes' builtin view and the cost model), the grid, and the `program` the firmware runs (tile
buffers planned inside `scratch` bytes; tpu_pipeline/toolchain/rewrite/patch_stage.py builds it). Runtimes
without the harness run `expand(graph, i)`: the body's layers in place of the stage.

Custom options on disk, little-endian int32 words:

    header   FORMAT, grid rows, grid cols, tensors, layers, program words, scratch bytes,
             body input, body output
    tensors  per body tensor: [constant (0/1), op input index (constants) or -1, H, W, C,
             zero point, scale (float32 bits)]
    layers   per layer, LAYER_WORDS: [kind (1 conv, 2 depthwise, 3 add), in0, in1, out, then
             the firmware's parameters (see `_layer_words`; word 4: the flags, direct and the
             variants a stage runs with their derived bits, any other bit refused; word 21: the
             body tensor of the constant a variant reads of its own, packed's or pointwise16's
             re-laid weights, read only with its flag; word 22: 1 where a packed layer's
             requantization is set up once an invoke in the stage's scratch, `setup_bytes`),
             then the IR's: activation, padding mode, pad top, pad left, version]
    program  steps, each [code, ...] (`STEP_WORDS`; offsets are bytes into the tile buffers):
             COPY_IN  [dst, y0, x0, h, w]: a box of the stage's input
             SLICE    [src, src_h, src_w, c, y0, x0, h, w, dst]: a box of a tile buffer (dst may
                      be src's own first bytes)
             CONV     [layer, in, in_h, in_w, pad_top, pad_left, out, out_h, out_w, ring,
                      ring_rows]: a layer on boxes; ring_rows > 0 when out lies over in
             ADD      [layer, a, a_h, a_w, a_y0, a_x0, b, b_h, b_w, b_y0, b_x0, out, h, w]
             COPY_OUT [src, y0, x0, h, w]: the finished tile into the stage's output
             PASTE    [src, src_w, c, y0, x0, h, w, dst, dst_w, dst_y0, dst_x0]: a box of a buffer
                      (rows of src_w elements) into a box of a buffer (rows of dst_w), moved as
                      memmove moves (rows last to first when the destination starts after the
                      source, or at it with wider rows): the 2-D streamed stage's halo caches and the input boxes it
                      assembles from them (rewrite/patch_stage.py `_stream2d_program`). A reader
                      without it refuses the program (unknown step), so FORMAT is unchanged.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.ir import kernel_variants
from tpu_pipeline.toolchain.ir.graph import Graph, Op, Quantization, Tensor
from tpu_pipeline.toolchain.ir.kernel_variants import packed
from tpu_pipeline.toolchain.ir.kernel_variants.record import HarnessOp
from tpu_pipeline.toolchain.ir.options import AddOptions, Conv2DOptions, DepthwiseConv2DOptions
from tpu_pipeline.toolchain.ir.requant import ACTIVATION_CODE

OPCODE = "TPUP_PATCH_STAGE"
HARNESS_OP = HarnessOp(OPCODE, OPCODE, "tpup::Register_PATCH_STAGE", ("tpup_stage.cc",))  # (its layers: tpup_conv.cc)
FORMAT = 1
KINDS = {"CONV_2D": 1, "DEPTHWISE_CONV_2D": 2, "ADD": 3}
COPY_IN, SLICE, CONV, ADD, COPY_OUT, PASTE = 1, 2, 3, 4, 5, 6
STEP_WORDS = {COPY_IN: 6, SLICE: 10, CONV: 12, ADD: 15, COPY_OUT: 6, PASTE: 12}
LAYER_WORDS = 28
_HEADER = 9
_TENSOR_WORDS = 7
# a layer record's codes for its padding (its fused activation's: requant.ACTIVATION_CODE)
PADDING_CODE = {"EXPLICIT": 0, "SAME": 1, "VALID": 2}
DIRECT_BIT = 1  # the direct kernel's bit (harness/tpup_conv.h kFlagDirect; ir/kernels.py imports this module)
BUILTIN_CODE = {"CONV_2D": 3, "DEPTHWISE_CONV_2D": 4, "ADD": 0}


@dataclass(frozen=True)
class PatchStage:
    body: Any  # Graph: the region; inputs (x,), outputs (y,); its constants carry their bytes
    grid: tuple[int, int]
    program: tuple[int, ...]  # the firmware's steps (see the module docstring)
    scratch: int  # bytes of the tile buffers (the largest tile's plan), without the kernels' own buffer
    layer_words: tuple[int, ...] = ()  # the firmware's layer table (the builder fills it)
    KIND = "PatchStage"

    def constants(self) -> list[int]:
        """The body's constant tensors, in the order they are the stage op's inputs 1, 2, ..."""
        return [t.index for t in self.body.tensors if t.is_constant]


def is_stage(op: Op) -> bool:
    return op.opcode == OPCODE


# ---- the custom options <-> the IR ------------------------------------------------------------------
def encode(stage: PatchStage) -> bytes:
    body = stage.body
    consts = {t: k + 1 for k, t in enumerate(stage.constants())}
    words = [FORMAT, stage.grid[0], stage.grid[1], len(body.tensors), len(body.ops), len(stage.program),
             stage.scratch, body.inputs[0], body.outputs[0]]
    for t in body.tensors:
        if t.is_constant:
            words += [1, consts[t.index], 0, 0, 0, 0, 0]
        else:
            q = t.quant
            words += [0, -1, *t.shape[1:4], int(q.zero_point[0]), _float_bits(q.scale[0])]
    if len(stage.layer_words) != LAYER_WORDS * len(body.ops):
        raise ValueError("a patch stage without its layer table")
    words += list(stage.layer_words)
    words += list(stage.program)
    return struct.pack(f"<{len(words)}i", *words)


def decode(raw, inputs: tuple[int, ...], graph_tensors, where: str) -> PatchStage:
    """The stage of a TPUP_PATCH_STAGE op read from a model (`inputs`: the op's input tensor indices
    into `graph_tensors`); ModelError if its options are malformed."""
    data = bytes(bytearray(raw if raw is not None else b""))
    if len(data) % 4 or len(data) < 4 * _HEADER:
        raise ModelError(f"{where}: {OPCODE} has {len(data)} bytes of options")
    w = struct.unpack(f"<{len(data) // 4}i", data)
    fmt, gh, gw, n_t, n_l, n_p, scratch, x, y = w[:_HEADER]
    need = _HEADER + n_t * _TENSOR_WORDS + n_l * LAYER_WORDS + n_p
    if fmt != FORMAT or len(w) != need or min(gh, gw, n_t, n_l) < 1 or not (0 <= x < n_t and 0 <= y < n_t):
        raise ModelError(f"{where}: {OPCODE} has malformed options (format {fmt}, {len(w)} words)")
    tensors, at = [], _HEADER
    for k in range(n_t):
        const, idx, h, wd, c, zp, bits = w[at:at + _TENSOR_WORDS]
        at += _TENSOR_WORDS
        if const:
            if not 1 <= idx < len(inputs):
                raise ModelError(f"{where}: {OPCODE} constant {k} refers to input {idx}")
            src = graph_tensors[inputs[idx]]
            tensors.append(dataclasses.replace(src, index=k, source=None))
        else:
            tensors.append(Tensor(k, f"stage/t{k}", "int8", (1, h, wd, c),
                                  quant=Quantization((_bits_float(bits),), (zp,))))
    layers = w[at:at + n_l * LAYER_WORDS]
    ops = [_layer_op(layers[k * LAYER_WORDS:(k + 1) * LAYER_WORDS], tensors, where) for k in range(n_l)]
    body = Graph(tuple(tensors), tuple(ops), (x,), (y,), "stage")
    return PatchStage(body, (gh, gw), tuple(w[at + n_l * LAYER_WORDS:]), scratch, tuple(layers))


def _layer_op(words, tensors, where: str) -> Op:
    kind, in0, in1, out = words[:4]
    act, pad_mode, top, left, version = words[-5:]
    name = {v: k for k, v in KINDS.items()}.get(kind)
    activation = {v: k for k, v in ACTIVATION_CODE.items()}.get(act)
    padding = {v: k for k, v in PADDING_CODE.items()}.get(pad_mode)
    if name is None or activation is None or padding is None or not all(0 <= t < len(tensors) for t in (in0, out)):
        raise ModelError(f"{where}: {OPCODE} has a malformed layer {list(words)}")
    if name == "ADD":
        return Op("ADD", (in0, in1), (out,), None, AddOptions(fused_activation=activation), BUILTIN_CODE["ADD"],
                  version)
    sh, sw, dh, dw, mult = words[8:13]
    consts = tuple(c for c in words[13:16])
    pads = {"pad_top": top, "pad_left": left} if padding == "EXPLICIT" else {}
    if name == "CONV_2D":
        options = Conv2DOptions(padding=padding, stride_w=sw, stride_h=sh, fused_activation=activation,
                                dilation_w=dw, dilation_h=dh, **pads)
    else:
        options = DepthwiseConv2DOptions(padding=padding, stride_w=sw, stride_h=sh, depth_multiplier=mult,
                                         fused_activation=activation, dilation_w=dw, dilation_h=dh, **pads)
    # a variant the stage runs, from its bit (rewrite/patch_stage.py _stage_flag_bits; the memory flags are not kept)
    run = [v for v in kernel_variants.REGISTRY if v.in_stages and words[4] & v.bit]
    if words[4] & ~_layer_bits(run):  # (as tpup_stage.cc refuses it: a bit no stage kernel reads, or a proof without its kernel)
        raise ModelError(f"{where}: {OPCODE} layer {list(words)} carries kernel flags a stage does not run")
    kernel = "+".join(["tpup", *(v.flag for v in run)])
    if any(v.constant_input is not None for v in run):  # its own constant: word 21
        if not 0 <= words[21] < len(tensors) or not tensors[words[21]].is_constant:
            raise ModelError(f"{where}: {OPCODE} layer {list(words)} names no constant of its kernel")
        consts += (words[21],)
    return Op(name, (in0, *consts), (out,), None, options, BUILTIN_CODE[name], version, kernel=kernel)


def _layer_bits(run) -> int:
    """The bits a conv layer's flags word may carry with the variants `run` set: direct, their own
    and what they derive (harness/tpup_stage.cc kLayerFlags)."""
    bits = DIRECT_BIT
    for v in run:
        bits |= v.bit | v.derived_mask
    return bits


def _float_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", float(np.float32(x))))[0]


def _bits_float(b: int) -> float:
    return float(struct.unpack("<f", struct.pack("<i", b))[0])


def steps(stage: PatchStage):
    """The program's steps, each a list of words [code, ...]."""
    at, program = 0, stage.program
    while at < len(program):
        n = STEP_WORDS[program[at]]
        yield list(program[at:at + n])
        at += n


# ---- what runtimes without the harness run ---------------------------------------------------------
def expand(graph: Graph, i: int) -> tuple[list[Op], list[Tensor]]:
    """The ops and new tensors that replace stage op `i` of `graph`: its body's layers on `graph`'s
    tensors (the stage's input, output and constants), the body's inner tensors appended."""
    op = graph.ops[i]
    stage: PatchStage = op.options
    body = stage.body
    where = {body.inputs[0]: op.inputs[0], body.outputs[0]: op.outputs[0]}
    for k, t in enumerate(stage.constants()):
        where[t] = op.inputs[1 + k]
    new_tensors = []
    name = graph.tensors[op.outputs[0]].name
    for t in body.tensors:
        if t.index not in where:
            idx = len(graph.tensors) + len(new_tensors)
            new_tensors.append(dataclasses.replace(t, index=idx, name=f"{name}/stage_{t.index}", source=None))
            where[t.index] = idx
    ops = [dataclasses.replace(o, inputs=tuple(where[t] if t >= 0 else t for t in o.inputs),
                               outputs=tuple(where[t] for t in o.outputs), source=None) for o in body.ops]
    return ops, new_tensors


SETUP_WORD = 22  # a layer record's word: 1 where its packed layer is set up once an invoke


def setup_bytes(stage: PatchStage) -> int:
    """The scratch bytes the firmware keeps its packed layers' set-ups in, after the tile buffers
    (harness/tpup_stage.cc SetupsBefore): each packed layer whose record says so (SETUP_WORD) has
    its requantization set up once an invoke (kernel_variants.packed.stage_setup_bytes), where
    each tile's call would set it up again."""
    total = 0
    for k, layer in enumerate(stage.body.ops):
        if stage.layer_words[k * LAYER_WORDS + SETUP_WORD] == 1:
            total += packed.stage_setup_bytes(stage.body.tensors[layer.outputs[0]].shape[3])
    return total


def stage_macs(op: Op) -> int:
    """Multiply-accumulates of a stage: every CONV and ADD step of its program over the output box
    it computes (a recomputing stage's halos included, a streamed stage's elements once)."""
    stage: PatchStage = op.options
    body = stage.body
    per_pixel = []  # layer -> MACs per output pixel
    for layer in body.ops:
        y = body.tensors[layer.outputs[0]]
        if layer.opcode == "CONV_2D":
            w = body.tensors[layer.inputs[1]].shape
            per_pixel.append(y.shape[3] * w[1] * w[2] * w[3])
        elif layer.opcode == "DEPTHWISE_CONV_2D":
            w = body.tensors[layer.inputs[1]].shape
            per_pixel.append(y.shape[3] * w[1] * w[2])
        else:
            per_pixel.append(y.shape[3])
    total = 0
    for step in steps(stage):
        if step[0] == CONV:
            total += per_pixel[step[1]] * step[8] * step[9]
        elif step[0] == ADD:
            total += per_pixel[step[1]] * step[13] * step[14]
    return total

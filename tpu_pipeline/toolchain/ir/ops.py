"""Constructors for new IR ops: what a rewrite rule builds, without knowing the flatbuffer schema.

    from tpu_pipeline.toolchain.ir import ops
    ops.add(a, b, out, activation="RELU")
    ops.concatenation([x, y], out, axis=3)
    ops.like(template_op, inputs, outputs)                      # same opcode, options, version
    ops.like(conv, inputs, outputs, fused_activation="NONE")    # ... with options fields changed

Tensor arguments are indices into the graph being built (see `tpu_pipeline.toolchain.rewrite.edit.GraphEditor`).
New ops have `source=None`; the writer (`tpu_pipeline.toolchain.ir.convert.to_model`) encodes their options.
"""

from __future__ import annotations

import dataclasses

from tpu_pipeline.toolchain.ir.convert import BUILTIN_CODES
from tpu_pipeline.toolchain.ir.graph import Op
from tpu_pipeline.toolchain.ir.options import (AddOptions, ConcatenationOptions, FieldlessOptions, Options, OpaqueOptions,
                                  StridedSliceOptions)


def op(opcode: str, inputs, outputs, options: Options = None, version: int = 1) -> Op:
    """A new builtin op (`opcode` as in `Op.opcode`, e.g. "CONV_2D")."""
    if opcode not in BUILTIN_CODES:
        raise ValueError(f"unknown builtin operator {opcode!r}")
    return Op(opcode=opcode, inputs=tuple(inputs), outputs=tuple(outputs), source=None, options=options,
              builtin_code=BUILTIN_CODES[opcode], version=version)


def add(a: int, b: int, out: int, activation: str = "NONE", version: int = 1) -> Op:
    return op("ADD", (a, b), (out,), AddOptions(fused_activation=activation), version)


def concatenation(inputs, out: int, axis: int, activation: str = "NONE", version: int = 1) -> Op:
    return op("CONCATENATION", inputs, (out,), ConcatenationOptions(axis=axis, fused_activation=activation),
              version)


def strided_slice(x: int, begin: int, end: int, strides: int, out: int, version: int = 2) -> Op:
    """`begin`, `end`, `strides`: int32 constant tensors, one entry per dimension of `x`."""
    return op("STRIDED_SLICE", (x, begin, end, strides), (out,), StridedSliceOptions(), version)


def pad(x: int, paddings: int, out: int, version: int = 2) -> Op:
    """`paddings`: an int32 constant [rank, 2]; quantized tensors are padded with the output's
    zero point, float ones with 0."""
    return op("PAD", (x, paddings), (out,), FieldlessOptions("PadOptions"), version)


def padv2(x: int, paddings: int, value: int, out: int, version: int = 2) -> Op:
    """PAD with an explicit constant `value` (a one-element tensor of x's type and quantization)."""
    return op("PADV2", (x, paddings, value), (out,), FieldlessOptions("PadV2Options"), version)


def like(template: Op, inputs, outputs, **changes) -> Op:
    """A new op with `template`'s opcode, options, version and kernel on other tensors; `changes`
    replace fields of its options record (ValueError for opaque options, which cannot be changed).
    A harness kernel (tpu_pipeline.toolchain.ir.kernels) is kept only when the operands keep their roles
    (as many inputs: the same op on another tile); otherwise the op is a builtin."""
    options = template.options
    if changes:
        if options is None or isinstance(options, OpaqueOptions):
            raise ValueError(f"{template.opcode}: its options have no fields to change")
        options = dataclasses.replace(options, **changes)
    kernel = template.kernel if len(tuple(inputs)) == len(template.inputs) else ""
    if not kernel and getattr(options, "padding", "") == "EXPLICIT":
        raise ValueError(f"{template.opcode}: explicit padding needs its harness kernel")
    return Op(opcode=template.opcode, inputs=tuple(inputs), outputs=tuple(outputs), source=None, options=options,
              builtin_code=template.builtin_code, version=template.version, kernel=kernel)

"""The ops the resolver registers (builtin or the harness kernel each op picks) and their calls."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.export.sources import resolver_method, resolver_opcode


def resolver(state, allowed):
    opcodes = tuple(dict.fromkeys(resolver_opcode(op) for op in state.graph.ops))
    methods = tuple(resolver_method(o) for o in opcodes)
    return replace(state, opcodes=opcodes, methods=methods), PassRecord("resolver", "ran", 0.0, {"ops": len(opcodes)})

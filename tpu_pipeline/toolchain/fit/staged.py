"""A patch stage's layers as rewrite.patch_stage.stage_layers puts them on the stage's kernels,
one op at a time (what fit's estimates ask of them: kernel, scratch, pricing rates), once per op
per fit rather than once per region that holds the op: a model has hundreds of regions, and
stage_layers copies the graph per layer (TinyEngine's vww: 28,000 copies per frontier)."""

from __future__ import annotations

from typing import NamedTuple

from tpu_pipeline.toolchain.fit.estimate import RegionGeometry, StagePricing, pricing_table
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.ir.kernels import flags
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import Semantics
from tpu_pipeline.toolchain.rewrite.patch_stage import DW3, stage_layers


class StagedOp(NamedTuple):
    kernel: str
    flags: frozenset
    scratch: int | None  # the bytes its kernel asks for (None: an ADD, which asks nothing)
    rate: tuple | None  # StagePricing.rate (None: no fitted stage pricing)


# stage_layers' ways of putting a region's layers (`where`) on a stage's kernels (a stage is priced on each)
WAYS = {"body": lambda where: {}, "striped": lambda where: {"stripes": True},
        "lean": lambda where: {"stripes": True, "without": {DW3: frozenset(where)}}}


def staged_op(graph: Graph, i: int, way: str, sem: Semantics, priced, memo: dict) -> StagedOp:
    """Op i as rewrite.patch_stage.stage_layers puts it on a stage's kernels `way` (WAYS), what
    the estimates ask of it. stage_layers chooses each layer's kernel from that op alone, so a
    region's layers are its ops' (tests/test_fit_select.py checks it), each put once per fit
    (`memo`, kept by the caller) rather than once per region that holds it."""
    got = memo.get((i, way))
    if got is None:
        g = stage_layers(graph, [i], **WAYS[way]((i,)))
        op = g.ops[i]
        got = memo[(i, way)] = StagedOp(op.kernel, flags(op), None if op.opcode == "ADD"
                                         else sum(scratch_requests(g, i, sem)),
                                         None if priced is None else StagePricing.rate(g, i, priced[0]))
    return got


def stage_pricing_of(priced, positions, *ways: list[StagedOp]) -> StagePricing | None:
    """The StagePricing of a region from its staged ops: a layer at the rates of each way it may run."""
    if priced is None:
        return None
    return StagePricing({i: tuple(dict.fromkeys(w[k].rate for w in ways)) for k, i in enumerate(positions)}, *priced)


def stage_geometry(graph: Graph, tin: int, tout: int, positions, op_seconds, device, sem: Semantics, memo: dict,
                   axes=None) -> RegionGeometry:
    """The RegionGeometry every grid of a region run as a patch stage shares: its layers' kernel
    buffers as the stage asks them (unaligned) and its pricing on `device`, from its ops staged
    one by one (`memo`: the caller's, kept per fit); `axes`: the region's AxisNeeds if known."""
    priced = pricing_table(device, sem.kernels)
    body, striped = ([staged_op(graph, i, way, sem, priced, memo) for i in positions] for way in ("body", "striped"))
    scratch = {i: op.scratch for i, op in zip(positions, body) if op.scratch is not None}
    # (other forms run a layer apart on the stripes' kernel where that costs no scratch; dw3 overflowing: its twin)
    lean = [staged_op(graph, i, "lean", sem, priced, memo) for i in positions] \
        if any(DW3 in op.flags for op in striped) else striped
    geo = RegionGeometry(graph, tin, tout, positions, op_seconds, scratch,
                         stage_pricing_of(priced, positions, body, striped, lean), axes)
    if any(a.kernel != b.kernel for a, b in zip(striped, body)):  # (row stripes may run more variants)
        own = [op.scratch for op in striped if op.scratch is not None]
        geo.stripes = (stage_pricing_of(priced, positions, striped, lean), max(own, default=0))
    return geo

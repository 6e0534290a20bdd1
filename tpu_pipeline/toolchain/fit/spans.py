"""The graph as a chain of spans between cut tensors: the unit of choice of `fit`.

A tensor `t` written by the op at position k is a *cut* when, in the stored order, it is the only
activation buffer live after op k runs: every later op then depends on the earlier ones through `t`
alone. The ops between two consecutive cuts form a span. Concatenating an order of each span is an
order of the graph, and the live bytes inside a span do not depend on how the other spans run
(only `t` crosses), so the peak of the graph is the maximum of the spans' peaks: a variant
(patches, a rewrite) chosen per run of spans changes only the peaks of the spans it covers.
That is the decomposition TASO's selection needs, with memory as a maximum (an arena is a peak),
not the sum of per-layer figures the paper adds up.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.memory.lifetimes import lifetimes
from tpu_pipeline.toolchain.memory.semantics import TFLM


@dataclass(frozen=True)
class Span:
    index: int
    ops: tuple[int, ...]  # positions in graph.ops (stored order)
    inputs: tuple[int, ...]  # activation tensors it reads that it does not write
    outputs: tuple[int, ...]  # tensors it writes that later ops read, or graph outputs


def cut_positions(graph: Graph) -> list[int]:
    """Positions k such that the output of op k is the only activation live after it runs."""
    lt = lifetimes(graph, None, TFLM)
    n = len(graph.ops)
    crossing = [0] * (n + 2)  # crossing[s]: activation buffers live at both step s and step s+1
    owner: dict[int, int] = {}
    for b in lt.buffers:
        if b.tensor is None:
            continue  # scratch lives one step only
        for s in range(b.first, b.last):
            crossing[s] += 1
        owner[b.tensor] = owner.get(b.tensor, 0) + 1
    cuts = []
    for k in range(n - 1):
        outs = graph.activation_outputs(k)
        if len(outs) != 1 or crossing[k + 1] != 1:
            continue
        t = outs[0]
        buf = next((b for b in lt.buffers if b.tensor == t), None)
        if buf is not None and buf.first == k + 1 and buf.last > k + 1:
            cuts.append(k)
    return cuts


def split_spans(graph: Graph) -> list[Span]:
    """The spans of `graph` in order (one span for a graph without cuts)."""
    bounds = [-1, *cut_positions(graph), len(graph.ops) - 1]
    spans = []
    for a, b in zip(bounds, bounds[1:]):
        ops = tuple(range(a + 1, b + 1))
        if ops:
            spans.append(_span(graph, len(spans), ops))
    return spans


def _span(graph: Graph, index: int, ops: tuple[int, ...]) -> Span:
    inside = set(ops)
    written = {t for i in ops for t in graph.activation_outputs(i)}
    reads = [t for i in ops for t in graph.activation_inputs(i) if t not in written]
    later = {t for i in range(len(graph.ops)) if i not in inside for t in graph.ops[i].inputs}
    outs = [t for i in ops for t in graph.activation_outputs(i) if t in later or t in graph.outputs]
    return Span(index, ops, tuple(dict.fromkeys(reads)), tuple(dict.fromkeys(outs)))


def span_graph(graph: Graph, spans: list[Span]) -> Graph:
    """Consecutive spans as a graph of their own (same tensor table, their ops, their boundary)."""
    ops = tuple(i for s in spans for i in s.ops)
    inside = set(ops)
    written = {t for i in ops for t in graph.activation_outputs(i)}
    inputs = tuple(dict.fromkeys(t for i in ops for t in graph.activation_inputs(i) if t not in written))
    later = {t for i in range(len(graph.ops)) if i not in inside for t in graph.ops[i].inputs}
    outputs = tuple(dict.fromkeys(t for i in ops for t in graph.activation_outputs(i)
                                  if t in later or t in graph.outputs))
    return Graph(graph.tensors, tuple(graph.ops[i] for i in ops), inputs, outputs, graph.name,
                 tuple(t for t in graph.external if t in inputs))

"""Coral's baseline: libcoral's `ParameterCountBasedPartitioner`, reimplemented step by step.

libcoral (coral/tools/partitioner/parameter_count_based_partitioner.cc, utils.cc):
  * parameter size of an op = sum of the data sizes of the buffers of its inputs that have data
    (custom ops count 0); edges = (producer, consumer) for every tensor with both;
  * execution order = `TopologicalSort`: a stack seeded with the in-degree-0 nodes in index
    order; pop, emit, and for each child whose in-degree drops to 0 push it on top, except
    children with no children of their own, which go to the bottom (visited as late as possible);
  * target = total // n + 1; first_output = first node in that order with out-degree 0;
    segments 0..n-2 take nodes greedily, stopping before one would push the segment over the
    target or past first_output - (n - 1 - segment); the last segment takes the rest.

Deviations, both forced: libcoral keeps its edges in an absl hash set, so its child order (and
thus its topological order among independent branches) is unspecified; we visit tensors in index
order, which is what an ordered set would give. libcoral aborts (CHECK) when a segment ends up
empty (an op alone larger than the target); we give such a segment its first op instead and say so
in `note`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_pipeline.toolchain.ir import Graph


@dataclass(frozen=True)
class HeuristicResult:
    stages: tuple[int, ...]
    order: tuple[int, ...]          # libcoral's execution order
    segment_param_bytes: tuple[int, ...]
    note: str = ""


def producer_consumer_edges(graph: Graph) -> list[tuple[int, int]]:
    """(producer, consumer) op pairs, one for every tensor with both (libcoral\'s edge set)."""
    consumers: dict[int, list[int]] = {}
    producers: dict[int, list[int]] = {}
    for i, op in enumerate(graph.ops):
        for t in op.inputs:
            if t >= 0:
                consumers.setdefault(t, []).append(i)
        for t in op.outputs:
            if t >= 0:
                producers.setdefault(t, []).append(i)
    edges = []
    for t in sorted(set(consumers) | set(producers)):
        if t in consumers and t in producers:
            for c in consumers[t]:
                for p in producers[t]:
                    edges.append((p, c))
    return edges


def coral_parameter_sizes(graph: Graph) -> list[int]:
    sizes = []
    for op in graph.ops:
        if op.is_custom:
            sizes.append(0)
            continue
        s = 0
        for t in op.inputs:
            if t >= 0 and graph.tensors[t].is_constant:
                s += len(graph.tensors[t].data)
        sizes.append(s)
    return sizes


def coral_topological_sort(graph: Graph) -> list[int]:
    n = len(graph.ops)
    children: list[list[int]] = [[] for _ in range(n)]
    in_deg = [0] * n
    for p, c in producer_consumer_edges(graph):
        children[p].append(c)
        in_deg[c] += 1
    out_deg = [len(ch) for ch in children]
    stack = [i for i in range(n) if in_deg[i] == 0]
    order = []
    while stack:
        node = stack.pop()
        order.append(node)
        for ch in children[node]:
            in_deg[ch] -= 1
            if in_deg[ch] == 0:
                if out_deg[ch] == 0:
                    stack.insert(0, ch)
                else:
                    stack.append(ch)
    if len(order) != n:
        raise ValueError("graph is not a DAG")
    return order


def coral_heuristic(graph: Graph, n: int) -> HeuristicResult:
    """Stage of each op under libcoral's parameter-count-based partitioner."""
    num = len(graph.ops)
    order = coral_topological_sort(graph)
    if n == 1:
        return HeuristicResult(tuple([0] * num), tuple(order), (sum(coral_parameter_sizes(graph)),))
    sizes = coral_parameter_sizes(graph)
    total = sum(sizes)
    target = total // n + 1
    out_deg = [0] * num
    for p, _ in producer_consumer_edges(graph):
        out_deg[p] += 1
    first_output = 0
    while out_deg[order[first_output]] != 0:
        first_output += 1
    counts = [0] * n
    seg = [0] * n
    node = 0
    notes = []
    for s in range(n - 1):
        max_end = first_output - (n - s - 1)
        while node <= max_end:
            cur = sizes[order[node]]
            if seg[s] + cur > target:
                break
            seg[s] += cur
            counts[s] += 1
            node += 1
        if counts[s] == 0 and node <= max_end:
            notes.append(f"segment {s}: op {order[node]} alone exceeds the target ({sizes[order[node]]:,} > "
                         f"{target:,} bytes); libcoral would abort, it gets that op")
            seg[s] += sizes[order[node]]
            counts[s] += 1
            node += 1
    counts[n - 1] = num - node
    seg[n - 1] = total - sum(seg[: n - 1])
    stages = [0] * num
    pos = 0
    for s in range(n):
        for _ in range(counts[s]):
            stages[order[pos]] = s
            pos += 1
    return HeuristicResult(tuple(stages), tuple(order), tuple(seg), "; ".join(notes))

"""`compile --cuts`: the user's own cut points, checked and turned into a stage assignment.

A cut list has one entry per boundary between two segments, in pipeline order; an entry is a
tensor name, several joined by '+' (a boundary that several branches cross), or an op index of the
model as given (its output tensors). Inline: entries separated by commas; `@FILE`: one entry per
line, '#' starts a comment.

Boundary k (0-based) with tensors C_k means: every op that computes C_k (its producers and their
ancestors) runs in segment k or earlier; every op that reads C_k (and all that follows from it)
runs in segment k+1 or later. Each op runs in the latest segment the first rule allows (the
segments stay as short as the cuts say; ops no boundary needs go to the last segment), so the
pipeline's data flow goes forward by construction once no op is pulled both ways. What is
refused, one line each (exit 2): an unknown name or op index, a constant or graph input named, an
op named twice, cuts that cross (an op needed for one boundary reads a tensor of the same or a
later one: a cycle across stages), an empty segment, a variable (state) tensor split across
segments, the graph outputs' producers outside the last segment, and with --colocate a tensor
whose consumers land in two segments.
"""

from __future__ import annotations

from pathlib import Path

from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.partition.problem import PartitionProblem, downstream


def parse_cuts(spec) -> tuple[str, ...]:
    """The entries of `--cuts` (inline text, '@FILE', or a list of entries), one per boundary.
    UsageError when the file cannot be read or nothing is given."""
    if isinstance(spec, (list, tuple)):
        entries = [str(e).strip() for e in spec]
    elif spec.startswith("@"):
        path = Path(spec[1:])
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--cuts {spec}: cannot read {path} ({getattr(exc, 'strerror', None) or exc})") from None
        entries = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    else:
        entries = [e.strip() for e in spec.split(",")]
    entries = [e for e in entries if e]
    if not entries:
        raise UsageError("--cuts: no cut point given")
    return tuple(entries)


def _resolve(graph: Graph, loaded: Graph, cuts) -> tuple[list[list[int]], list[str]]:
    """Tensor indices of `graph` per boundary, and one line per entry that names nothing usable."""
    by_name = {t.name: i for i, t in enumerate(graph.tensors)}
    loaded_names = {t.name for t in loaded.tensors}
    problems, out = [], []
    for k, entry in enumerate(cuts):
        where = f"cut {k + 1}"
        tensors = []
        items = [entry] if entry in by_name else [part.strip() for part in entry.split("+") if part.strip()]
        for item in items:
            if item.lstrip("-").isdigit() and item not in by_name:
                i = int(item)
                if not 0 <= i < len(loaded.ops):
                    problems.append(f"{where}: op index {i} is out of range (the model has ops 0..{len(loaded.ops) - 1})")
                    continue
                names = [loaded.tensors[t].name for t in loaded.ops[i].outputs if t >= 0]
                found = [by_name[n] for n in names if n in by_name]
                if not found:
                    problems.append(f"{where}: op {i}'s outputs no longer exist after the graph passes (try --no-rewrite)")
                tensors += found
            elif item in by_name:
                t = by_name[item]
                if t not in graph.producer:
                    kind = "a graph input" if t in graph.inputs else "a constant" if graph.tensors[t].is_constant else \
                        "not written by any op"
                    problems.append(f"{where}: '{item}' is {kind}, not a tensor between two ops")
                    continue
                tensors.append(t)
            elif item in loaded_names:
                problems.append(f"{where}: '{item}' no longer exists after the graph passes (try --no-rewrite)")
            else:
                problems.append(f"{where}: no tensor is named '{item}' (nor is it an op index)")
        out.append(tensors)
    return out, problems


def _named_twice(graph: Graph, bounds: list[list[int]]) -> list[str]:
    seen: dict[int, int] = {}
    problems = []
    for k, tensors in enumerate(bounds):
        for op in dict.fromkeys(graph.producer[t] for t in tensors):
            if op in seen:
                again = "again in the same cut" if seen[op] == k else f"already named in cut {seen[op] + 1}"
                problems.append(f"cut {k + 1}: op {op} ({graph.ops[op].opcode}) is {again}")
            else:
                seen[op] = k
    return problems


def user_stages(problem: PartitionProblem, loaded: Graph, cuts, colocate: bool = False) -> tuple[int, ...]:
    """The stage of each op of `problem.graph` under the cuts; UsageError with one line per violation."""
    g = problem.graph
    n = len(cuts) + 1
    bounds, problems = _resolve(g, loaded, cuts)
    problems += _named_twice(g, bounds)
    if problems:
        raise UsageError("\n".join(problems))
    preds = problem.preds
    latest = [n - 1] * problem.n_ops      # the latest segment each op may run in
    earliest = [0] * problem.n_ops       # the earliest
    for k in reversed(range(n - 1)):
        for v in downstream(preds, {g.producer[t] for t in bounds[k]}):
            latest[v] = k
    for k in range(n - 1):
        readers = {c for t in bounds[k] for c in g.consumers.get(t, ())}
        for v in downstream(problem.succs, readers):
            earliest[v] = max(earliest[v], k + 1)
    problems += _crossings(g, bounds, latest, earliest, n)
    if problems:
        raise UsageError("\n".join(problems))
    stages = tuple(latest)
    problems += _segment_rules(problem, stages, n, colocate)
    if problems:
        raise UsageError("\n".join(problems))
    return stages


def _crossings(g: Graph, bounds, latest, earliest, n: int) -> list[str]:
    """One line per pair of boundaries pulled both ways by some op (a cycle across stages)."""
    problems, said = [], set()
    for v in range(len(g.ops)):
        if earliest[v] <= latest[v]:
            continue
        j, k = latest[v], earliest[v] - 1     # needed for boundary j, reads (downstream of) boundary k >= j
        if (j, k) in said:
            continue
        said.add((j, k))
        op = f"op {v} ({g.ops[v].opcode})"
        if j == k:
            problems.append(f"cut {j + 1} forms a cycle across stages: {op} is needed to compute it but comes after "
                            f"its own tensors")
        else:
            problems.append(f"cuts {j + 1} and {k + 1} form a cycle across stages: {op} is needed for cut {j + 1} "
                            f"but comes after cut {k + 1} (list the cuts in data-flow order)")
    return problems


def _segment_rules(problem: PartitionProblem, stages, n: int, colocate: bool) -> list[str]:
    g, problems = problem.graph, []
    for k in range(n):
        if k not in stages and k < n - 1:
            problems.append(f"segment {k} would be empty: cut {k + 1} adds no op to what the cuts before it need")
        elif k not in stages:
            problems.append(f"segment {k} would be empty: no op follows cut {k}")
    for group in problem.state_groups:
        used = sorted({stages[v] for v in group})
        if len(used) > 1:
            op = g.ops[group[0]]
            var = next(t for t in (*op.inputs, *op.outputs) if t >= 0 and g.tensors[t].kind == "variable")
            problems.append(f"ops {', '.join(map(str, group))} share the state tensor '{g.tensors[var].name}' but the "
                            f"cuts put them in segments {', '.join(map(str, used))}")
    late = sorted(v for v in problem.last_stage_ops if stages[v] != n - 1)
    if late:
        v = late[0]
        problems.append(f"op {v} ({g.ops[v].opcode}) must be in the last segment (it produces or follows a graph "
                        f"output, or ends a branch) but the cuts put it in segment {stages[v]}"
                        + (f" ({len(late) - 1} more such op(s))" if len(late) > 1 else ""))
    if colocate:
        for bt in problem.tensors:
            used = sorted({stages[c] for c in bt.consumers})
            if len(used) > 1:
                problems.append(f"--colocate: tensor '{g.tensors[bt.tensor].name}' is read in segments "
                                f"{', '.join(map(str, used))}")
    return problems


__all__ = ["parse_cuts", "user_stages"]

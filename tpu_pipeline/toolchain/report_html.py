"""One self-contained HTML page per run: the figures people look at, drawn as inline SVG.

    memory timeline   live bytes per op step, before and after (the peak and its op named)
    arena layout      one rectangle per tensor: lifetime (steps) x offset (bytes), from the plan
    pipeline          the stages along the op sequence; per stage parameters cached on chip vs
                      streamed, bytes in and out through the host
    fit frontier      arena peak vs predicted latency of the selections, the budget, the choice
    provenance        every headline figure: predicted or measured, proven or bounded

No script, no stylesheet or font from the network: the page renders from the file alone (also
offline, also in a mail attachment). `write(path, Report)` writes it atomically; the builders
(`for_graph`, `for_fit`, `for_compile`) turn what a command computed into a `Report`.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.memory.semantics import TFLM, Semantics

# Figure colours (also what tests/test_report_html.py looks for in a browser's screenshot).
BEFORE, AFTER, PEAK = "#9e9e9e", "#1f77b4", "#d62728"
STAGE_COLOURS = ("#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
CACHED, STREAMED, TRANSFER = "#1b5e20", "#e65100", "#607d8b"
# the arena's rectangles: light shades, none of them a colour of another figure
ARENA_COLOURS = ("#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")
FRONTIER = "#9467bd"
ENGINE_COLOURS = {"tpu-pipeline": FRONTIER, "tinyengine": "#ff7f0e", "tflm-builtin": "#2ca02c"}  # measured points
MAX_BOXES = 4000  # an arena drawing of more rectangles than this is drawn for the largest ones


@dataclass(frozen=True)
class Timeline:
    label: str
    live: tuple[int, ...]      # bytes live at each step (step 0: the inputs)
    peak_op: str               # "<position> <OPCODE>" at the peak


@dataclass(frozen=True)
class Box:
    name: str
    first: int
    last: int
    offset: int
    size: int


@dataclass(frozen=True)
class StageView:
    ops: tuple[int, ...]       # op positions
    cached_bytes: int
    streamed_bytes: int
    in_bytes: int
    out_bytes: int
    latency_s: float


@dataclass(frozen=True)
class Figure:
    name: str
    value: str
    source: str                # "predicted (...)", "measured (...)", "simulated (...)"
    proof: str                 # "proven optimal", "lower bound", "within X % of a proven bound", "-"


@dataclass(frozen=True)
class Table:
    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    intro: str = ""
    id: str = ""


@dataclass(frozen=True)
class Point:
    """A measured point of a scatter: one engine's whole arena and instructions per inference."""
    engine: str  # a key of ENGINE_COLOURS
    label: str
    arena_bytes: int
    instructions: int


@dataclass(frozen=True)
class Scatter:
    title: str
    points: tuple[Point, ...]
    id: str = "scatter"


@dataclass(frozen=True)
class Report:
    title: str
    command: str
    model: str
    semantics: str = TFLM.name  # (the name shown)
    timelines: tuple[Timeline, ...] = ()
    boxes: tuple[Box, ...] = ()
    arena_head: int = 0
    arena_label: str = ""
    stages: tuple[StageView, ...] = ()
    n_ops: int = 0
    frontier: tuple[tuple[int, float], ...] = ()     # (peak bytes, predicted latency s)
    frontier_budget: int | None = None
    frontier_chosen: tuple[int, float] | None = None
    figures: tuple[Figure, ...] = ()
    notes: tuple[str, ...] = field(default=())
    tables: tuple[Table, ...] = ()
    scatters: tuple[Scatter, ...] = ()


# ---- builders ----------------------------------------------------------------------------------
def _op_label(graph: Graph, step: int) -> str:
    if step == 0:
        return "the inputs"
    return f"{step - 1} {graph.ops[step - 1].opcode}" if step <= len(graph.ops) else "the end"


def timeline(label: str, graph: Graph, semantics: Semantics = TFLM) -> Timeline:
    from tpu_pipeline.toolchain.memory import lifetimes

    live = lifetimes(graph, semantics=semantics).live_bytes()
    peak = max(range(len(live)), key=lambda s: (live[s], -s)) if live else 0
    return Timeline(label, tuple(live), _op_label(graph, peak))


def arena_boxes(graph: Graph, tensor_offsets=None) -> tuple[tuple[Box, ...], int, str]:
    """The TFLite Micro arena as TFLite Micro lays it out: with our offline plan (`tensor_offsets`,
    one per tensor, -1 for the runtime's) or with its own greedy planner."""
    from tpu_pipeline.toolchain.memory import TFLM, lifetimes, tflm_greedy

    lt = lifetimes(graph, semantics=TFLM)
    offline = None
    if tensor_offsets is not None:
        offline = [tensor_offsets[b.tensor] if b.tensor is not None and b.tensor < len(tensor_offsets) else -1
                   for b in lt.buffers]
    plan = tflm_greedy(lt, offline)
    boxes = tuple(Box(b.name or (graph.tensors[b.tensor].name if b.tensor is not None else f"scratch of op {b.op}"),
                      b.first, b.last, o, b.size) for b, o in zip(lt.buffers, plan.offsets))
    label = "our offline plan" if tensor_offsets is not None else "TFLite Micro's own greedy planner"
    return boxes, plan.size, label


def for_graph(command: str, label: str, graph: Graph, data: dict, after: Graph | None = None,
              semantics: Semantics = TFLM, offsets=None) -> Report:
    """inspect, schedule, plan: the timeline (before/after a reorder) and the arena layout."""
    lines = [timeline("stored order" if after is not None else "stored order", graph, semantics)]
    if after is not None:
        lines.append(timeline("memory-optimal order", after, semantics))
    boxes, head, arena = arena_boxes(after or graph, offsets)
    figures = [Figure("activation peak" + (" (stored order)" if after is not None else ""),
                      _b(max(lines[0].live)), f"predicted ({semantics.name} semantics)", "exact for this order")]
    if command == "inspect":
        figures += [Figure("TFLite Micro arena head (its planner)", _b(data["tflm_arena_bytes"]), "predicted", "-"),
                    Figure("lower bound for any order", _b(data["any_order_lower_bound"]), "predicted",
                           "lower bound")]
    if command == "schedule":
        figures.append(Figure("activation peak (new order)", _b(data["peak"]), f"predicted ({semantics.name} semantics)",
                              "proven optimal" if data.get("proven_optimal") else
                              f"lower bound {data.get('lower_bound', 0):,} B"))
    if command == "plan":
        figures.append(Figure("TFLite Micro arena head, our plan", _b(data["planned_bytes"]), "predicted",
                              "proven optimal" if data.get("proven_optimal") else
                              f"lower bound {data['lower_bound']:,} B"))
        if "tflm_measured_head" in data:
            figures.append(Figure("TFLite Micro arena head, our plan", _b(data["tflm_measured_head"]),
                                  "measured (TFLite Micro on the host)", "-"))
    return Report(f"{label}: {command}", command, label, semantics.name, tuple(lines), boxes, head, arena,
                  figures=tuple(figures), notes=tuple(data.get("notes", ())))


def for_fit(label: str, fitted, data: dict) -> Report:
    from tpu_pipeline.toolchain.ir.convert import from_model
    from tpu_pipeline.toolchain.tflite import read_model

    r = fitted.result
    before = from_model(read_model(fitted.source, name=label))
    lines = (timeline("model as it is", before), timeline("fitted", r.graph))
    boxes, head, arena = arena_boxes(r.graph, r.offline_plan)
    figures = [Figure("arena head", _b(r.head), "predicted (our TFLite Micro planner model)",
                      "reaches the peak" if r.plan_proven else "-"),
               Figure("predicted latency", f"{r.selection.latency_s * 1e3:,.3f} ms", "predicted (MCU cost model)",
                      "optimal selection" if r.selection.proven else "-")]
    if fitted.head_measured is not None:
        figures.append(Figure("arena head (reference kernels)", _b(fitted.head_measured),
                              "measured (TFLite Micro on the host)", "-"))
    for v in fitted.verification:
        if not v.skipped:
            figures.append(Figure(f"outputs vs the input model ({v.runtime})",
                                  "bit-identical" if v.bit_exact else "within tolerance", "measured", "-"))
    return Report(f"{label}: fit", "fit", label, TFLM.name, lines, boxes, head, arena,
                  frontier=tuple((p.peak, p.latency_s) for p in r.frontier), frontier_budget=r.budget,
                  frontier_chosen=(r.selection.peak, r.selection.latency_s), figures=tuple(figures),
                  notes=tuple(data.get("notes", ())))


def for_compile(state, report: dict) -> Report:
    """compile: before/after timelines, the arena of the whole model, the pipeline's stages."""
    o, part = state.options, state.partition
    lines = []
    if state.loaded is not None:
        lines.append(timeline("as read", state.loaded, o.semantics))
    lines.append(timeline("compiled", state.graph, o.semantics))
    boxes, head, arena = arena_boxes(state.graph, state.offline_plan)
    stages = tuple(StageView(part.ops_of(k), s.sram_bytes, s.offchip_bytes, s.in_bytes, s.out_bytes, s.latency_s)
                   for k, s in enumerate(part.cost.stages))
    sol = report["solver"]
    gap = sol.get("gap")
    period_proof = ("proven optimal (simulator)" if sol.get("simulator_optimal") else
                    f"within {gap:.1%} of a proven lower bound" if gap is not None else "-")
    figures = [Figure("throughput", f"{part.cost.throughput_per_s:,.1f} /s",
                      "predicted (pipeline simulator, " + o.device.name + ")", period_proof),
               Figure("latency", f"{part.cost.latency_s * 1e3:,.3f} ms", "predicted (pipeline simulator)", "-"),
               Figure("period lower bound", f"{sol['period_lower_bound_s'] * 1e3:,.3f} ms", "predicted",
                      "proven bound" if sol.get("primary_proven") else "solver bound")]
    if report.get("gain_throughput"):
        figures.append(Figure("gain over Coral's heuristic", f"x{report['gain_throughput']:.3f}",
                              "predicted (same cost model)", "-"))
    for pr in report["passes"]:
        d = pr.get("detail", {})
        if pr["name"] == "schedule" and "peak" in d:
            figures.append(Figure(f"activation peak ({d.get('semantics', o.semantics.name)})", _b(d["peak"]), "predicted",
                                  "proven optimal" if d.get("proven_optimal") else
                                  f"lower bound {d.get('lower_bound', 0):,} B"))
        if pr["name"] == "plan" and "tflm_head_bytes" in d:
            figures.append(Figure("TFLite Micro arena head, offline plan", _b(d["tflm_head_bytes"]), "predicted",
                                  "proven optimal" if d.get("proven_optimal") else "-"))
    v = report.get("verification")
    if v:
        figures.append(Figure("segment chain vs the input model", "bit-identical",
                              f"measured ({v.get('runtime', 'LiteRT')}, {v.get('samples', '?')} inputs)", "-"))
    title = f"{o.stem}: compile -n {'auto (chose ' + str(part.n) + ')' if o.n is None else part.n}"
    return Report(title, "compile", o.stem, o.semantics.name, tuple(lines), boxes, head, arena,
                  stages, len(state.graph.ops), figures=tuple(figures), notes=tuple(report.get("notes", ())),
                  tables=compile_tables(report))


def compile_tables(report: dict) -> tuple[Table, ...]:
    """-n auto's table, the partitions side by side (--cuts, --profile), the off-chip explanation."""
    out = []
    if report.get("n_candidates"):
        rows = tuple((("> " if c["n"] == report["n_chosen"] else "") + str(c["n"]), f"{c['period_s'] * 1e3:,.3f}",
                      f"{c['throughput_per_s']:,.1f}", f"{c['throughput_per_tpu']:,.1f}", _b(c["cached_bytes"]),
                      _b(c["streamed_bytes"]), "yes" if c["proven"] else
                      f"{'pruned, ' if c.get('pruned') else ''}bound {c['period_lower_bound_s'] * 1e3:,.3f} ms")
                     for c in report["n_candidates"])
        out.append(Table("How many Edge TPUs: n = 1.." + str(report["n_auto"]["max_n"]),
                         ("n", "period ms", "per s", "per s per TPU", "cached", "streamed", "period proven"), rows,
                         f"chose n={report['n_chosen']}: {report['n_chosen_reason']}", "n-auto"))
    if report.get("compared"):
        rows = tuple((c["label"], str(c["n"]), f"{c['period_s'] * 1e3:,.3f}", f"{c['throughput_per_s']:,.1f}",
                      _b(c["cached_bytes"]), _b(c["streamed_bytes"]),
                      " / ".join(f"{x * 1e3:,.2f}" for x in c["stage_latency_s"]))
                     for c in report["compared"])
        out.append(Table("Partitions side by side (same cost model)", ("partition", "n", "period ms", "per s", "cached",
                         "streamed", "stage latencies ms"), rows, "the first row is the one written", "compared"))
    rows = tuple((str(s["index"]), _b(s["caching"]["cached_bytes"]), _b(s["caching"]["streamed_bytes"]),
                  ", ".join(f"{o['op']} {o['opcode']} ({o['streamed_bytes']:,} B)" for o in s["caching"]["streamed_ops"])
                  or "-", s["caching"]["advice"])
                 for s in report.get("segments", ()) if "caching" in s)
    if rows:
        out.append(Table("Off-chip streaming explained", ("segment", "cached", "streamed", "ops that stream, in "
                         "caching order", "what would bring it on chip"), rows,
                         "parameters are cached in each segment's execution order until the on-chip memory runs out",
                         "offchip"))
    return tuple(out)


# ---- rendering ---------------------------------------------------------------------------------
W, H, PAD = 960, 300, 56


def _b(n) -> str:
    return f"{int(n):,} B"


def _esc(s) -> str:
    return html.escape(str(s), quote=True)


def _scale(value: float, lo: float, hi: float, a: float, b: float) -> float:
    return a if hi <= lo else a + (value - lo) * (b - a) / (hi - lo)


def _axes(title_x: str, title_y: str, x_max: float, y_max: float, x_fmt=str, y_fmt=str) -> list[str]:
    out = [f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 10}" y2="{H - PAD}" stroke="#333"/>',
           f'<line x1="{PAD}" y1="10" x2="{PAD}" y2="{H - PAD}" stroke="#333"/>',
           f'<text x="{(W + PAD) / 2}" y="{H - 14}" text-anchor="middle">{_esc(title_x)}</text>',
           f'<text x="14" y="{H / 2}" text-anchor="middle" transform="rotate(-90 14 {H / 2})">{_esc(title_y)}</text>']
    for i in range(5):
        fx, fy = x_max * i / 4, y_max * i / 4
        x = _scale(fx, 0, x_max, PAD, W - 10)
        y = _scale(fy, 0, y_max, H - PAD, 10)
        out += [f'<text x="{x:.1f}" y="{H - PAD + 16}" text-anchor="middle" class="tick">{_esc(x_fmt(fx))}</text>',
                f'<text x="{PAD - 4}" y="{y + 4:.1f}" text-anchor="end" class="tick">{_esc(y_fmt(fy))}</text>',
                f'<line x1="{PAD}" y1="{y:.1f}" x2="{W - 10}" y2="{y:.1f}" stroke="#eee"/>']
    return out


def _kib(v: float) -> str:
    return f"{v / 1024:,.0f} KiB" if v >= 10 * 1024 else f"{v:,.0f} B"


def _svg(body: list[str], fig_id: str, height: int = H) -> str:
    return (f'<svg id="{fig_id}" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
            f'viewBox="0 0 {W} {height}" role="img">' + "".join(body) + "</svg>")


def svg_timeline(lines: tuple[Timeline, ...]) -> str:
    steps = max(len(t.live) for t in lines)
    top = max(max(t.live, default=0) for t in lines) or 1
    body = _axes("op step (step 0: the inputs)", "live bytes", steps - 1, top, lambda v: f"{v:.0f}", _kib)
    colours = [BEFORE, AFTER] if len(lines) > 1 else [AFTER]
    for row, (t, colour) in enumerate(zip(lines, colours)):
        pts = " ".join(f"{_scale(i, 0, steps - 1, PAD, W - 10):.1f},{_scale(v, 0, top, H - PAD, 10):.1f}"
                       for i, v in enumerate(t.live))
        body.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2.5"/>')
        peak = max(range(len(t.live)), key=lambda s: (t.live[s], -s))
        x, y = _scale(peak, 0, steps - 1, PAD, W - 10), _scale(t.live[peak], 0, top, H - PAD, 10)
        body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6" fill="{PEAK}"/>')
        body.append(f'<text x="{min(x + 8, W - 420):.1f}" y="{max(y - 8, 22) + 16 * row:.1f}" class="peak">{_esc(t.label)}: peak '
                    f'{t.live[peak]:,} B at step {peak} ({_esc(t.peak_op)})</text>')
    legend = "".join(f'<rect x="{W - 250}" y="{14 + 18 * i}" width="14" height="10" fill="{c}"/>'
                     f'<text x="{W - 230}" y="{23 + 18 * i}">{_esc(t.label)}</text>'
                     for i, (t, c) in enumerate(zip(lines, colours)))
    return _svg(body + [legend], "timeline")


def svg_arena(boxes: tuple[Box, ...], head: int) -> str:
    if not boxes:
        return ""
    shown = sorted(boxes, key=lambda b: -b.size)[:MAX_BOXES]
    steps = max(b.last for b in boxes) + 1
    top = max(head, max(b.offset + b.size for b in boxes)) or 1
    body = _axes("op step (tensor lifetime)", "arena offset", steps, top, lambda v: f"{v:.0f}", _kib)
    for i, b in enumerate(shown):
        x0, x1 = _scale(b.first, 0, steps, PAD, W - 10), _scale(b.last + 1, 0, steps, PAD, W - 10)
        y1, y0 = _scale(b.offset, 0, top, H - PAD, 10), _scale(b.offset + b.size, 0, top, H - PAD, 10)
        colour = ARENA_COLOURS[i % len(ARENA_COLOURS)]
        body.append(f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{max(1.0, x1 - x0):.1f}" height="{max(1.0, y1 - y0):.1f}" '
                    f'fill="{colour}" stroke="#fff" stroke-width="0.5">'
                    f'<title>{_esc(b.name)}: {b.size:,} B at offset {b.offset:,}, steps {b.first}-{b.last}</title></rect>')
    y = _scale(head, 0, top, H - PAD, 10)
    body.append(f'<line x1="{PAD}" y1="{y:.1f}" x2="{W - 10}" y2="{y:.1f}" stroke="{PEAK}" stroke-dasharray="6 4"/>'
                f'<text x="{W - 14}" y="{y - 4:.1f}" text-anchor="end" class="peak">head {head:,} B</text>')
    return _svg(body, "arena")


def svg_pipeline(stages: tuple[StageView, ...], n_ops: int) -> str:
    if not stages:
        return ""
    h = 120 + 46 * len(stages)
    body = [f'<text x="{PAD}" y="20">stage of each op, along the op sequence (op 0 left)</text>']
    stage_of = {v: k for k, s in enumerate(stages) for v in s.ops}
    cell = (W - PAD - 10) / max(1, n_ops)
    for v in range(n_ops):
        k = stage_of.get(v, 0)
        body.append(f'<rect x="{PAD + v * cell:.2f}" y="30" width="{max(cell, 0.6):.2f}" height="34" '
                    f'fill="{STAGE_COLOURS[k % len(STAGE_COLOURS)]}"><title>op {v}: stage {k}</title></rect>')
    most = max(max(s.cached_bytes + s.streamed_bytes, s.in_bytes + s.out_bytes) for s in stages) or 1
    span = W - PAD - 330
    for k, s in enumerate(stages):
        y = 90 + 46 * k
        colour = STAGE_COLOURS[k % len(STAGE_COLOURS)]
        wc, ws = span * s.cached_bytes / most, span * s.streamed_bytes / most
        body += [f'<rect x="8" y="{y}" width="40" height="30" fill="{colour}"/>',
                 f'<text x="28" y="{y + 20}" text-anchor="middle" fill="#fff">{k}</text>',
                 f'<rect x="{PAD}" y="{y}" width="{wc:.1f}" height="14" fill="{CACHED}"><title>parameters cached '
                 f'on chip: {s.cached_bytes:,} B</title></rect>',
                 f'<rect x="{PAD + wc:.1f}" y="{y}" width="{ws:.1f}" height="14" fill="{STREAMED}"><title>parameters '
                 f'streamed every inference: {s.streamed_bytes:,} B</title></rect>',
                 f'<rect x="{PAD}" y="{y + 16}" width="{span * (s.in_bytes + s.out_bytes) / most:.1f}" height="12" '
                 f'fill="{TRANSFER}"><title>through the host: in {s.in_bytes:,} B, out {s.out_bytes:,} B</title></rect>',
                 f'<text x="{W - 320}" y="{y + 12}">{len(s.ops)} ops; params {s.cached_bytes:,} B cached, '
                 f'{s.streamed_bytes:,} B streamed</text>',
                 f'<text x="{W - 320}" y="{y + 28}">in {s.in_bytes:,} B, out {s.out_bytes:,} B; '
                 f'{s.latency_s * 1e3:,.3f} ms</text>']
    legend_y = h - 16
    body += [f'<rect x="{PAD}" y="{legend_y - 10}" width="14" height="10" fill="{CACHED}"/>'
             f'<text x="{PAD + 20}" y="{legend_y}">parameters cached on chip</text>',
             f'<rect x="{PAD + 220}" y="{legend_y - 10}" width="14" height="10" fill="{STREAMED}"/>'
             f'<text x="{PAD + 240}" y="{legend_y}">streamed from the host</text>',
             f'<rect x="{PAD + 440}" y="{legend_y - 10}" width="14" height="10" fill="{TRANSFER}"/>'
             f'<text x="{PAD + 460}" y="{legend_y}">boundary tensors in + out</text>']
    return _svg(body, "pipeline", h)


def svg_frontier(points, budget, chosen) -> str:
    if not points:
        return ""
    xs = [p for p, _ in points] + ([budget] if budget else []) + ([chosen[0]] if chosen else [])
    ys = [lat for _, lat in points] + ([chosen[1]] if chosen else [])
    x_max, y_max = max(xs) * 1.05 or 1, max(ys) * 1.1 or 1
    body = _axes("arena peak", "predicted latency", x_max, y_max, _kib, lambda v: f"{v * 1e3:,.2f} ms")
    for p, lat in points:
        body.append(f'<circle cx="{_scale(p, 0, x_max, PAD, W - 10):.1f}" cy="{_scale(lat, 0, y_max, H - PAD, 10):.1f}" '
                    f'r="6" fill="{FRONTIER}"><title>{p:,} B, {lat * 1e3:,.3f} ms</title></circle>')
    if budget:
        x = _scale(budget, 0, x_max, PAD, W - 10)
        body.append(f'<line x1="{x:.1f}" y1="10" x2="{x:.1f}" y2="{H - PAD}" stroke="{PEAK}" stroke-dasharray="6 4"/>'
                    f'<text x="{x + 4:.1f}" y="24" class="peak">budget {budget:,} B</text>')
    if chosen:
        body.append(f'<circle cx="{_scale(chosen[0], 0, x_max, PAD, W - 10):.1f}" '
                    f'cy="{_scale(chosen[1], 0, y_max, H - PAD, 10):.1f}" r="10" fill="none" stroke="{PEAK}" '
                    f'stroke-width="3"><title>chosen</title></circle>')
    return _svg(body, "frontier")


def svg_scatter(sc: Scatter) -> str:
    """Measured (whole arena, instructions) points on log axes, one colour per engine; an engine's
    points joined in arena order (ours: fit's frontier as measured)."""
    import math

    LEFT = PAD + 30  # (room for the tick labels beside the axis title)
    pts = [p for p in sc.points if p.arena_bytes > 0 and p.instructions > 0]
    if not pts:
        return ""
    lx = [math.log10(p.arena_bytes) for p in pts]
    ly = [math.log10(p.instructions) for p in pts]
    x0, x1, y0, y1 = min(lx) - 0.1, max(lx) + 0.1, min(ly) - 0.1, max(ly) + 0.1

    def at(p: Point) -> tuple[float, float]:
        return (_scale(math.log10(p.arena_bytes), x0, x1, LEFT, W - 170),
                _scale(math.log10(p.instructions), y0, y1, H - PAD, 10))

    body = [f'<line x1="{LEFT}" y1="{H - PAD}" x2="{W - 170}" y2="{H - PAD}" stroke="#333"/>',
            f'<line x1="{LEFT}" y1="10" x2="{LEFT}" y2="{H - PAD}" stroke="#333"/>',
            f'<text x="{(W - 170 + LEFT) / 2}" y="{H - 14}" text-anchor="middle">whole arena (log)</text>',
            f'<text x="14" y="{H / 2}" text-anchor="middle" transform="rotate(-90 14 {H / 2})">'
            'instructions per inference (log)</text>']
    for k in range(5):
        vx, vy = 10 ** (x0 + (x1 - x0) * k / 4), 10 ** (y0 + (y1 - y0) * k / 4)
        x, y = _scale(x0 + (x1 - x0) * k / 4, x0, x1, LEFT, W - 170), _scale(y0 + (y1 - y0) * k / 4, y0, y1, H - PAD, 10)
        body += [f'<text x="{x:.1f}" y="{H - PAD + 16}" text-anchor="middle" class="tick">{_esc(_kib(vx))}</text>',
                 f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" class="tick">{vy / 1e6:,.1f} M</text>']
    for n, engine in enumerate(dict.fromkeys(p.engine for p in pts)):
        colour = ENGINE_COLOURS.get(engine, "#333")
        mine = sorted((p for p in pts if p.engine == engine), key=lambda p: p.arena_bytes)
        if len(mine) > 1:
            body.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
                        + " ".join(f"{x:.1f},{y:.1f}" for x, y in map(at, mine)) + '"/>')
        for p in mine:
            x, y = at(p)
            body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="7" fill="{colour}"><title>{_esc(engine)}: '
                        f'{_esc(p.label)}: {p.arena_bytes:,} B, {p.instructions:,} instructions</title></circle>')
        body.append(f'<circle cx="{W - 155}" cy="{24 + 20 * n}" r="6" fill="{colour}"/>'
                    f'<text x="{W - 143}" y="{28 + 20 * n}">{_esc(engine)}</text>')
    return _svg(body, sc.id)


CSS = ("body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}"
       "h1{font-size:20px}h2{font-size:16px;margin-top:28px}svg{background:#fff;border:1px solid #ddd}"
       "svg text{font:12px sans-serif;fill:#333}svg .tick{font-size:11px;fill:#666}svg .peak{fill:#d62728}"
       "table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}"
       "td.v{text-align:right;font-variant-numeric:tabular-nums}.note{color:#555}")


def render(r: Report) -> str:
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_esc(r.title)}</title>"
             f"<style>{CSS}</style></head><body><h1>{_esc(r.title)}</h1>",
             f"<p>model <b>{_esc(r.model)}</b>; memory figures under {_esc(r.semantics)} semantics "
             f"(docs/cli.md, glossary); every figure below says whether it is predicted or measured.</p>"]
    if r.timelines:
        parts += ["<h2>Memory over the op sequence</h2>", svg_timeline(r.timelines)]
    if r.boxes:
        parts += [f"<h2>Arena layout ({_esc(r.arena_label)}): tensor x lifetime x offset</h2>",
                  f"<p>TFLite Micro arena head {r.arena_head:,} B; one rectangle per tensor (hover for its name)"
                  + (f", the {MAX_BOXES} largest of {len(r.boxes)}" if len(r.boxes) > MAX_BOXES else "") + ".</p>",
                  svg_arena(r.boxes, r.arena_head)]
    if r.stages:
        parts += [f"<h2>Pipeline partition: {len(r.stages)} stages</h2>", svg_pipeline(r.stages, r.n_ops)]
    for t in r.tables:
        head = "".join(f"<th>{_esc(h)}</th>" for h in t.header)
        body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in t.rows)
        parts += [f"<h2>{_esc(t.title)}</h2>", f"<p>{_esc(t.intro)}</p>" if t.intro else "",
                  f"<table id=\"{_esc(t.id)}\"><tr>{head}</tr>{body}</table>"]
    for sc in r.scatters:
        parts += [f"<h2>{_esc(sc.title)}</h2>", svg_scatter(sc)]
    if r.frontier:
        parts += ["<h2>Fit frontier: arena vs predicted latency</h2>",
                  svg_frontier(r.frontier, r.frontier_budget, r.frontier_chosen)]
    if r.figures:
        rows = "".join(f"<tr><td>{_esc(f.name)}</td><td class=\"v\">{_esc(f.value)}</td><td>{_esc(f.source)}</td>"
                       f"<td>{_esc(f.proof)}</td></tr>" for f in r.figures)
        parts.append("<h2>Figures and their provenance</h2><table id=\"provenance\"><tr><th>figure</th><th>value</th>"
                     f"<th>predicted or measured</th><th>proof</th></tr>{rows}</table>")
    if r.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li class=\"note\">{_esc(n)}</li>" for n in r.notes) + "</ul>")
    parts.append("</body></html>\n")
    return "".join(parts)


def write(path, report: Report) -> None:
    from tpu_pipeline.toolchain.tflite.io import write_bytes_atomic

    write_bytes_atomic(path, render(report).encode())

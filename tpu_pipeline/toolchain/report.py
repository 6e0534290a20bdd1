"""Rendering: rich tables for people (printed by the command line's Printer, tpu_pipeline/output.py,
in the format asked for), JSON for machines, plots for reports. No computation."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from rich.table import Table

if TYPE_CHECKING:  # inspect imports the MCU library's tables: only `inspect` needs them
    from tpu_pipeline.toolchain.inspect import ModelSummary


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=json_default)
    sys.stdout.write("\n")


def json_default(obj):
    """`default=` for json.dump: objects with to_json, dataclasses, numpy values; else TypeError."""
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if hasattr(obj, "__dataclass_fields__"):
        return obj.__dict__
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def print_summary(s: ModelSummary, out) -> None:
    out.print(f"[bold]{s.path}[/bold]: {s.ops} ops, {s.tensors} tensors, {s.subgraphs} subgraph(s)")
    out.print(f"inputs: {', '.join(s.inputs)}    outputs: {', '.join(s.outputs)}")
    # Words as in docs/cli.md's glossary: peak = most live bytes at one step; head = what a planner
    # allocates; every figure here is predicted from the file (nothing runs).
    t = Table(title="memory, predicted (tflm semantics unless noted)", show_header=True)
    t.add_column("figure")
    t.add_column("B", justify="right")
    t.add_column("KiB/MiB", justify="right")
    t.add_row("parameters (constants)", f"{s.parameter_bytes:,}", human_bytes(s.parameter_bytes))
    t.add_row(f"activation peak, at step {s.peak_step} ({s.peak_op})", f"{s.peak_bytes:,}", human_bytes(s.peak_bytes))
    if s.tflm_arena_bytes is None:
        t.add_row("TFLite Micro arena head (its greedy planner)", "cannot run", "see note")
    else:
        t.add_row("TFLite Micro arena head (its greedy planner)", f"{s.tflm_arena_bytes:,}",
                  human_bytes(s.tflm_arena_bytes))
    t.add_row("TFLite arena, tensors only (tflite semantics)", f"{s.tflite_arena_bytes:,}",
              human_bytes(s.tflite_arena_bytes))
    t.add_row("lower bound for this order (= peak)", f"{s.order_lower_bound:,}", human_bytes(s.order_lower_bound))
    t.add_row("lower bound for any order", f"{s.any_order_lower_bound:,}", human_bytes(s.any_order_lower_bound))
    out.print(t)
    if s.tflm_cannot_run:
        out.print(f"note: TFLite Micro cannot run this model ({s.tflm_cannot_run}): no arena head is predicted, "
                  "and the MCU commands (plan, fit, profile, export-mcu) refuse it")
    if s.custom_ops_note:
        out.print(f"note: {s.custom_ops_note}")
    if s.subgraphs > 1:
        out.print(f"note: {s.subgraphs} subgraphs: the memory figures cover the main subgraph only; TFLite Micro "
                  "also places the other subgraphs' tensors in its arena")
    h = Table(title="ops", show_header=True)
    h.add_column("opcode")
    h.add_column("ops (count)", justify="right")
    for name, count in s.opcodes.items():
        h.add_row(name, str(count))
    out.print(h)
    hs = Table(title="steps with the most live bytes (tflm semantics)", show_header=True)
    hs.add_column("step", justify="right")
    hs.add_column("op")
    hs.add_column("live B", justify="right")
    hs.add_column("live tensors (names)")
    for hot in s.hot_steps:
        names = ", ".join(hot.live_tensors[:6]) + (" ..." if len(hot.live_tensors) > 6 else "")
        hs.add_row(str(hot.step), hot.op, f"{hot.live_bytes:,}", names)
    out.print(hs)


def plot_live_bytes(series: dict[str, list[int]], path: str, title: str) -> None:
    """Live bytes per step, one line per order, the peak of each marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tpu_pipeline.toolchain.tflite.io import write_bytes_atomic
    import io

    fig, ax = plt.subplots(figsize=(10, 4))
    for label, live in series.items():
        ax.plot(range(len(live)), [b / 1024 for b in live], label=label, linewidth=1.2)
        peak = max(live)
        step = live.index(peak)
        ax.scatter([step], [peak / 1024], zorder=3)
        ax.annotate(f"peak {peak / 1024:,.1f} KiB @ step {step}", (step, peak / 1024),
                    textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xlabel("step (op position + 1)")
    ax.set_ylabel("live activation bytes (KiB)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=path.rsplit(".", 1)[-1] if "." in path else "png", dpi=110)
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())


def plot_frontier(r, path: str, title: str) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tpu_pipeline.toolchain.tflite import write_bytes_atomic

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [p.peak / 1024 for p in r.frontier]
    ys = [p.latency_s * 1e3 for p in r.frontier]
    ax.step(xs, ys, where="post", color="tab:blue", linewidth=1)
    ax.scatter(xs, ys, color="tab:blue", zorder=3, label="frontier (CP-SAT optimum per budget)")
    ax.scatter([r.baseline_peak / 1024], [r.baseline_latency_s * 1e3], marker="x", color="black", zorder=4,
               label="model as it is (proven optimal order)")
    if r.budget is not None:
        ax.axvline(r.budget / 1024, color="tab:red", linestyle="--", linewidth=1, label="budget")
    ax.set_xlabel("arena peak (KiB)")
    ax.set_ylabel("predicted latency (ms)")
    ax.set_title(f"{title}: arena vs predicted latency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=path.rsplit(".", 1)[-1], dpi=110)
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())

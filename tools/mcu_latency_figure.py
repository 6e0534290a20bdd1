"""The MCU latency benchmark's figure: per model, the measured (whole arena, instructions) points of
each engine on one core (an386), as SVG files beside docs/bench/mcu_latency.md and as one
self-contained HTML page (the package's report renderer, tpu_pipeline/toolchain/report_html.py).

Ours are fit's points as measured (fastest, at TinyEngine's patched memory, smallest): fit's
frontier in (whole arena, instructions), joined in arena order. TinyEngine's are its whole-layer
and patch-plan programs; TFLite Micro's the model as converted. Each engine counts its arena as the
table beside the figure says (TinyEngine: its activation buffer, no interpreter)."""

from __future__ import annotations

from pathlib import Path

from tpu_pipeline.toolchain import report_html as R

CORE = "an386"


def scatters(rows: list[dict], core: str = CORE) -> list[R.Scatter]:
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        pts = tuple(R.Point(r["engine"], r["point"], int(r["arena_bytes"]), int(r["instructions"]))
                    for r in rows if r["model"] == model and r["core"] == core
                    and r.get("instructions") and r.get("arena_bytes"))
        if len({p.engine for p in pts}) > 1:
            out.append(R.Scatter(f"{model} on {core}: whole arena vs instructions per inference (measured in QEMU)",
                                 pts, id=f"scatter-{model}"))
    return out


def write(rows: list[dict], folder: Path, stem: str = "mcu_latency") -> list[str]:
    """Write <stem>_<model>.svg per model and <stem>.html; the markdown lines that show them."""
    figures = scatters(rows)
    lines = ["", f"### Figure: whole arena vs instructions ({CORE}; also `docs/bench/{stem}.html`)", "",
             "Measured points only: ours (fit's frontier as measured, joined), TinyEngine's programs, and TFLite "
             "Micro + CMSIS-NN on the model as converted; each arena counted as the table says. Log axes.", ""]
    for sc in figures:
        name = f"{stem}_{sc.id.removeprefix('scatter-')}.svg"
        (folder / name).write_text(R.svg_scatter(sc) + "\n")
        lines.append(f"![{sc.title}]({name})")
    page = R.Report(title="MCU latency against TinyEngine, measured in QEMU", command="bench",
                    model="TinyEngine's and MLPerf Tiny's models", semantics="tflm", scatters=tuple(figures),
                    notes=("made by python tools/bench_mcu_latency.py (see docs/bench/mcu_latency.md for how each "
                           "engine counts its arena)",))
    R.write(folder / f"{stem}.html", page)
    return lines

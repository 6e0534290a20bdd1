"""Tables for run and profile reports, and a progress bar that only shows on a terminal."""

from __future__ import annotations

import contextlib

from rich.console import Console
from rich.table import Table

from tpu_pipeline.runtime.measure import RunReport
from tpu_pipeline.toolchain.report import human_bytes


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.3f}"


def us(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e6:,.1f}"


def measured_where(r: RunReport) -> str:
    """Where the 'measured' figures come from, as the column headers say it (docs/cli.md, glossary)."""
    if r.backend == "emulator":
        return "host"  # the emulator times LiteRT / TFLite Micro on this machine's CPU
    return "simulated device" if r.simulated else "device"


def print_run_report(r: RunReport, out, top_ops: int = 10) -> None:
    """`out`: anything with print(line or rich Table): the command line's Printer, a rich Console."""
    where = measured_where(r)
    tag = " (simulated)" if r.simulated else ""  # on every table title, so no excerpt loses it
    sim = ", simulated" if r.simulated and "simulated" not in r.device else ""
    out.print(f"[bold]{r.model}[/bold] on [bold]{r.device}[/bold] (backend {r.backend}, {r.iterations} inferences{sim})")
    if r.simulated:
        out.print("(simulated) no target hardware ran these inferences: "
                  + ("measured figures are host timings; device figures are predicted" if where == "host" else
                     "a stand-in harness answered; its ticks come from the MCU cost model"))
    _latency_table(r, out, where, tag)
    p = r.predicted or {}
    if p.get("source"):
        out.print(f"predicted by: {p['source']}")
    if r.stages and len(r.stages) >= 1 and r.backend != "mcu":
        _segments_table(r, out, where, tag)
    if r.arena:
        _arena_table(r, out, tag)
    if r.ops:
        _ops_table(r, out, tag, top_ops)
    if r.energy:
        e = r.energy
        out.print(f"power meter {e.get('meter')}: {e.get('samples')} samples, average "
                  f"{(e.get('avg_power_w') or 0):.3f} W" + (f"; {e['error']}" if e.get("error") else ""))
    if r.verified is not None:
        out.print("outputs: " + ("[green]identical to the whole model (bit-exact)[/green]" if r.verified else
                                 f"[red]DIFFER from the whole model (max |diff| {r.max_abs_diff})[/red]"))
    for n in r.notes:
        if n:
            out.print(f"note: {n}")


def _latency_table(r: RunReport, out: Console, where: str, tag: str) -> None:
    t = Table(title="latency and throughput" + tag)
    for c in ("figure", f"measured ({where})", "predicted (device)"):
        t.add_column(c, justify="right" if c != "figure" else "left")
    lat = r.latency
    p = r.predicted or {}
    t.add_row("latency min (ms)", ms(lat.min_s if lat else None), "")
    t.add_row("latency median (ms)", ms(lat.median_s if lat else None), ms(p.get("latency_s")))
    t.add_row("latency p90 (ms)", ms(lat.p90_s if lat else None), "")
    thr = p.get("throughput_per_s")
    t.add_row("throughput (inferences/s)", f"{r.throughput_per_s:,.1f}" if r.throughput_per_s else "-",
              f"{thr:,.1f}" if thr else "-")
    energy_meas = (r.energy or {}).get("energy_per_inference_j")
    t.add_row("energy per inference (mJ)", f"{energy_meas * 1e3:,.4f}" if energy_meas is not None else "-",
              f"{p['energy_j'] * 1e3:,.4f}" if p.get("energy_j") is not None else "-")
    out.print(t)


def _segments_table(r: RunReport, out: Console, where: str, tag: str) -> None:
    st = Table(title="per segment" + tag)
    for c in ("#", "file", "in tensors", "out tensors", f"{where} median (ms)", f"{where} p90 (ms)",
              "predicted (ms)"):
        st.add_column(c, justify="right" if c not in ("file",) else "left")
    for s in r.stages:
        short = s.file.rsplit("_segment_", 1)[-1].removesuffix(".tflite") if "_segment_" in s.file else s.file
        st.add_row(str(s.index), short if "_segment_" not in s.file else f"segment_{short}", str(len(s.inputs)), str(len(s.outputs)),
                   ms(s.latency.median_s if s.latency else None), ms(s.latency.p90_s if s.latency else None),
                   ms(s.predicted_latency_s))
    out.print(st)


def _arena_table(r: RunReport, out: Console, tag: str) -> None:
    a = r.arena
    at = Table(title="arena" + tag)
    at.add_column("figure")
    at.add_column("B", justify="right")
    at.add_column("KiB/MiB", justify="right")
    device = "simulated device" if r.simulated and r.backend != "emulator" else "device"
    for key, label in (("configured", "configured (device SRAM)"),
                       ("head", "head (TFLite Micro on the host, measured)"),
                       ("predicted_head", "head (predicted: our TFLite Micro planner model)"),
                       ("tail", "tail (TFLite Micro on the host, measured)"),
                       ("total", "total = head + tail (measured)"),
                       ("used", f"used (reported by the {device})"),
                       ("model_bytes", "model (flash)"), ("flash_bytes", "flash available")):
        if a.get(key) is not None:
            at.add_row(label, f"{a[key]:,}", human_bytes(a[key]))
    at.add_row("fits", {True: "yes", False: "NO", None: "TFLite Micro cannot run it"}[a.get("fits")], "")
    out.print(at)


def _ops_table(r: RunReport, out: Console, tag: str, top_ops: int) -> None:
    key = "seconds" if "seconds" in r.ops[0] else "predicted_s"
    ranked = sorted(r.ops, key=lambda o: -o.get(key, 0))[:top_ops]
    source = ("device PROF lines" if key == "seconds"
              else "predicted by " + (r.predicted or {}).get("source", "cost model"))
    ot = Table(title=f"slowest ops ({source}, top {len(ranked)} of {len(r.ops)})" + tag)
    for c in ("op", "opcode", ("simulated device µs" if r.simulated else "device µs") if key == "seconds"
              else "predicted µs"):
        ot.add_column(c, justify="right" if c != "opcode" else "left")
    if any("host_s" in o for o in ranked):
        ot.add_column("host µs", justify="right")
    for o in ranked:
        row = [str(o["index"]), o["opcode"], us(o.get(key))]
        if any("host_s" in x for x in ranked):
            row.append(us(o.get("host_s")))
        ot.add_row(*row)
    out.print(ot)


@contextlib.contextmanager
def progress_bar(total: int, label: str, enabled: bool):
    """Yields a callback(done) that advances a rich progress bar on stderr, if it is a terminal."""
    err = Console(stderr=True)
    if not enabled or not err.is_terminal or total <= 0:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err, transient=True) as prog:
        task = prog.add_task(label, total=total)
        yield lambda done: prog.update(task, completed=done)

"""`tpu-pipeline compile`: the passes in order, run by the driver, then one atomic write.

    load -> fit (--budget) or rewrite -> schedule -> plan -> emit -> partition -> segments -> [verify] -> edgetpu_compiler
    -> report.json -> the output folder, swapped in whole

`semantics` says whose memory model the rewrite and schedule passes minimise: "tflite" (default:
the Coral host runs the segments in LiteRT) or "tflm". The plan pass writes TFLite Micro's offline
memory plan for the final order into the whole model (LiteRT ignores that metadata).

To add a pass: write `passes/<name>.py` with `def <name>(state, allowed) -> (state, PassRecord)`
and put a `Pass` for it in `PASSES` (driver.py says what `share` and `optional` mean).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from tpu_pipeline.toolchain.driver import BUDGET_FACTOR, Pass, PassError, run_passes
from tpu_pipeline.toolchain.compile.report import build_report
from tpu_pipeline.toolchain.compile.output import ResultFolder, check_result_folder
from tpu_pipeline.toolchain.compile.passes.edgetpu import edgetpu
from tpu_pipeline.toolchain.compile.passes.emit import emit
from tpu_pipeline.toolchain.compile.passes.fit import fit
from tpu_pipeline.toolchain.compile.passes.load import load
from tpu_pipeline.toolchain.compile.passes.partition import partition
from tpu_pipeline.toolchain.compile.passes.plan import plan
from tpu_pipeline.toolchain.compile.passes.rewrite import rewrite
from tpu_pipeline.toolchain.compile.passes.schedule import schedule
from tpu_pipeline.toolchain.compile.passes.segments import segments
from tpu_pipeline.toolchain.compile.passes.verify import verify, verify_chain
from tpu_pipeline.toolchain.compile.state import CompileOptions, CompileState, PassRecord
from tpu_pipeline.toolchain.device import Device, load_device
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.memory import TFLITE, TFLM, Semantics, get_semantics
from tpu_pipeline.toolchain.partition import DEFAULT_GAP, STRATEGY_NAMES, Partition
from tpu_pipeline.toolchain.partition.auto import DEFAULT_KNEE, DEFAULT_MAX_N
from tpu_pipeline.toolchain import report_html
from tpu_pipeline.toolchain.report import json_default

FIT_COST_DEVICE = "qemu-mps2-an386"  # whose MCU cost model the fit pass prices variants with

PASSES: list[Pass] = [
    Pass("load", load),
    Pass("fit", fit, share=1.0, when=lambda o: o.budget is not None),
    Pass("rewrite", rewrite, share=1.0, optional=True, when=lambda o: o.budget is None),
    Pass("schedule", schedule, share=1.0, optional=True),
    Pass("plan", plan, share=0.5, optional=True),
    Pass("emit", emit),
    Pass("partition", partition, share=1.0),
    Pass("segments", segments, share=0.3),
    Pass("verify", verify, when=lambda o: o.verify),
    Pass("edgetpu_compiler", edgetpu),
]
# fit and rewrite never run together (`when`): each configuration stays within the budget
assert all(sum(p.share for p in PASSES if p.name != skip) < BUDGET_FACTOR for skip in ("fit", "rewrite"))


@dataclass
class CompileResult:
    out_dir: Path
    stem: str
    report: dict
    files: list[str]
    partition: Partition
    passes: list[PassRecord]
    notes: list[str]


def compile_options(paths, n: int | str | None, out_dir=None, device: str | Device = "coral-usb",
                    strategy: str = "latency", time_limit: float = 10.0, verify: bool = False, colocate: bool = False,
                    passes: tuple[str, ...] = ("rewrite", "schedule", "plan"), workers: int = 2,
                    semantics: str | Semantics = TFLITE, budget: int | None = None, gap: float = DEFAULT_GAP,
                    int8_io: bool = False, input_outside_arena: bool = False, max_n: int = DEFAULT_MAX_N,
                    knee: float = DEFAULT_KNEE, cuts=None, profile=None, mix: str | None = None) -> CompileOptions:
    """Check the options (UsageError) and the output folder before any work. `n`: a number of
    segments, "auto" (choose among 1..max_n), or None with `cuts` (their count fixes it). The device
    and the semantics are resolved here, once, and the passes take the objects."""
    paths = tuple(Path(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths))
    if not paths:
        raise UsageError("no model given")
    if len({p.resolve() for p in paths}) != len(paths):
        raise UsageError("the same model is given twice; co-deployment needs distinct files")
    if strategy not in STRATEGY_NAMES:
        raise UsageError(f"unknown strategy '{strategy}' (choose from {', '.join(STRATEGY_NAMES)})")
    if not (0 < time_limit < float("inf")):
        raise UsageError(f"--time-limit must be a number of seconds > 0, got {time_limit}")
    semantics = get_semantics(semantics)  # UsageError for an unknown name
    if not 0 <= gap < 1:
        raise UsageError(f"--gap must be a fraction in [0, 1), got {gap}")
    if budget is not None:
        if budget <= 0:
            raise UsageError(f"--budget must be a number of bytes > 0, got {budget}")
        semantics = TFLM  # the budget is a TFLite Micro arena: every pass minimises that
    n = _segments(n, cuts, max_n, knee)
    if cuts is not None:
        from tpu_pipeline.toolchain.partition.cuts import parse_cuts

        cuts = parse_cuts(cuts)
    if profile is not None:
        profile = Path(profile)
        if not profile.is_file():
            raise UsageError(f"--profile {profile}: no such file (give the --json output of `tpu-pipeline run DIR`)")
    if mix is not None:
        from tpu_pipeline.toolchain.partition.cocompile import parse_mix

        if len(paths) < 2:
            raise UsageError("--mix orders several models co-compiled on the same TPUs; give two or more models")
        parse_mix(mix, [p.stem for p in paths])  # UsageError now, not after the passes
    dev = load_device(device)
    if dev.kind != "edgetpu":
        raise UsageError(f"compile partitions for Edge TPU pipelines; '{dev.name}' is a {dev.kind} "
                         "(use `tpu-pipeline profile` for MCUs)")
    stem = "+".join(p.stem for p in paths)
    out = Path(out_dir) if out_dir is not None else Path("out") / stem
    check_result_folder(out, list(paths))
    # the fit pass (--budget) prices variants with the emulated MCU's cost model
    fit_cost = load_device(FIT_COST_DEVICE) if budget is not None else None
    return CompileOptions(paths, n, out, dev, strategy, time_limit, verify, colocate, tuple(passes), workers,
                          semantics, budget, gap, int8_io, input_outside_arena, max_n, knee, cuts, profile,
                          mix, fit_cost)


def _segments(n, cuts, max_n: int, knee: float) -> int | None:
    """-n as the options hold it: a number, or None (auto, or fixed by --cuts)."""
    if isinstance(max_n, bool) or not isinstance(max_n, int) or max_n < 1:
        raise UsageError(f"--max-n must be a whole number >= 1, got {max_n!r}")
    if not 0 <= knee < 1:
        raise UsageError(f"--knee must be a fraction in [0, 1), got {knee}")
    if n == "auto":
        if cuts is not None:
            raise UsageError("-n auto chooses the number of segments; --cuts fixes it (give one or the other)")
        return None
    if n is None:
        if cuts is None:
            raise UsageError("give -n N, -n auto or --cuts")
        return None
    if isinstance(n, bool) or not isinstance(n, int):
        raise UsageError(f"-n must be a whole number of segments or 'auto', got {n!r}")
    return n


def compile_models(paths, n: int | str | None, out_dir=None, progress=None, **options) -> CompileResult:
    opts = compile_options(paths, n, out_dir, **options)
    folder = ResultFolder(opts.out_dir, list(opts.paths))
    try:
        # the model files go to disk while the later passes run (the swap comes at the end)
        state, records = run_passes(PASSES, CompileState(opts), progress,
                                    after=lambda _name, st: folder.write_soon(_model_files(st)))
        files = {**_model_files(state), **dict(state.extra_files)}
        names = [*files, "report.html", "report.json"]
        report = build_report(state, records, names)
        # the figures people look at, in one self-contained page beside report.json
        files["report.html"] = report_html.render(report_html.for_compile(state, json.loads(
            json.dumps(report, default=json_default)))).encode()
        manifest = folder.finish(files, json.loads(json.dumps(report, default=json_default)))
    finally:
        folder.discard()
    return CompileResult(opts.out_dir, opts.stem, manifest.to_json(), names, state.partition, records,
                         list(report["notes"]))


def _model_files(state: CompileState) -> dict[str, object]:
    """The .tflite files the state holds so far: the whole model (after emit), the segments (as
    their pieces: written without joining them)."""
    whole = {f"{state.options.stem}.tflite": state.whole} if state.whole is not None else {}
    return {**whole, **{s.file: s.chunks for s in state.segments}}


__all__ = ["PASSES", "Pass", "PassError", "CompileOptions", "CompileState", "CompileResult", "PassRecord",
           "compile_options", "compile_models", "verify_chain"]

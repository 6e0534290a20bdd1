"""The compile driver: passes in order, each optional when its module is missing.

    load (+ merge for co-deployment) -> rewrite -> schedule -> plan -> partition -> segments
    -> [edgetpu_compiler] -> verify -> write

`semantics` says whose memory model the rewrite and schedule passes minimise: "tflite" (default:
the Coral host runs the segments in LiteRT) or "tflm". The plan pass always writes TFLite Micro's
offline memory plan for the final order into the whole model (LiteRT ignores that metadata), so
the same file deploys to an MCU with the planned arena.

Nothing is written until every pass (and --verify) has succeeded; then the whole optimised model,
the segments and report.json are written atomically, so a failed run leaves no partial output.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from toolchain.cost.devices import load_device
from toolchain.errors import ModelError, UsageError, VerificationError
from toolchain.ir import from_model, to_model
from toolchain.memory import get_semantics, lifetimes, peak_memory, tflm_greedy
from toolchain.memory.planners import plan_for_tflm
from toolchain.rewrite import rewrite_graph
from toolchain.rewrite.numerics import litert_interpreter, random_inputs
from toolchain.schedule import schedule
from toolchain.partition import STRATEGY_NAMES, Partition, PartitionProblem, partition
from toolchain.tflite import model_to_bytes, read_model, with_offline_plan
from toolchain.tflite.extract import extract_segment, merge_models
from toolchain.tflite.io import write_bytes_atomic


@dataclass
class PassRecord:
    name: str
    status: str          # "ran", "skipped", "unavailable", "no gain"
    seconds: float = 0.0
    detail: dict = field(default_factory=dict)


@dataclass
class CompileResult:
    out_dir: Path
    stem: str
    report: dict
    files: list[str]
    partition: Partition
    passes: list[PassRecord]
    notes: list[str]


def _text(v) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else (v or "")


def _unique_names(model) -> int:
    """Give empty or duplicate tensor names of the main subgraph a unique suffix (segments chain
    by name). Returns how many were renamed."""
    sg = model.subgraphs[0]
    seen: set[str] = set()
    renamed = 0
    for i, t in enumerate(sg.tensors or []):
        name = _text(t.name)
        if not name or name in seen:
            new = f"{name or 'tensor'}#{i}"
            while new in seen:
                new += "_"
            t.name = new
            name = new
            renamed += 1
        seen.add(name)
    return renamed


def _stem(paths: list[Path]) -> str:
    return "+".join(p.stem for p in paths)


# ---- verification ------------------------------------------------------------------------------
def _interpreter(data: bytes):
    try:
        return litert_interpreter(data)
    except ModelError as exc:
        raise VerificationError(str(exc)) from None


def _run(it, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    for d in it.get_input_details():
        if d["name"] not in feeds:
            raise VerificationError(f"segment input '{d['name']}' is produced by no earlier segment")
        it.set_tensor(d["index"], feeds[d["name"]])
    it.invoke()
    return {d["name"]: it.get_tensor(d["index"]).copy() for d in it.get_output_details()}


def verify_chain(originals: list[tuple[str, bytes, str]], segments: list[bytes], samples: int = 2,
                 seed: int = 0, exact: bool = True) -> dict:
    """Run the original model(s) and the chained segments (tensors matched by name) on the same
    random inputs under LiteRT's builtin kernels; raise VerificationError unless every output is
    bit-identical. `originals` holds (label, model bytes, tensor-name prefix)."""
    rng = np.random.default_rng(seed)
    refs = [(label, _interpreter(data), prefix) for label, data, prefix in originals]
    segs = [_interpreter(s) for s in segments]
    compared = 0
    worst = 0.0
    for _ in range(samples):
        env: dict[str, np.ndarray] = {}
        expected: dict[str, np.ndarray] = {}
        for label, it, prefix in refs:
            details = it.get_input_details()
            feeds = {d["name"]: x for d, x in zip(details, random_inputs(details, rng))}
            for name, arr in feeds.items():
                env[prefix + name] = arr
            try:
                outs = _run(it, feeds)
            except RuntimeError as exc:
                raise VerificationError(f"{label}: LiteRT failed to run it: {exc}") from None
            expected.update({prefix + k: v for k, v in outs.items()})
        for k, it in enumerate(segs):
            try:
                env.update(_run(it, env))
            except RuntimeError as exc:
                raise VerificationError(f"segment {k}: LiteRT failed to run it: {exc}") from None
        for name, want in expected.items():
            if name not in env:
                raise VerificationError(f"output '{name}' is produced by no segment")
            got = env[name]
            if got.shape != want.shape or got.dtype != want.dtype:
                raise VerificationError(f"output '{name}': shape or type differs ({got.shape} {got.dtype} vs "
                                        f"{want.shape} {want.dtype})")
            if not np.array_equal(got, want):
                diff = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())
                if exact:
                    raise VerificationError(f"output '{name}': chained segments differ from the whole model "
                                            f"(max |diff| {diff:g})")
                worst = max(worst, diff)
            compared += 1
    return {"samples": samples, "outputs_compared": compared, "bit_identical": worst == 0.0,
            "max_abs_diff": worst, "runtime": "LiteRT builtin kernels (no default delegates)"}


# TFLite Micro runs the reference kernels: seconds per inference for the largest zoo models.
TFLM_VERIFY_MAX_MACS = 300_000_000


def _verify_in_tflm(source: bytes, whole: bytes, graph) -> dict:
    """The optimised whole model (reordered, rewritten, with its offline plan) against the input
    model in TFLite Micro: integer outputs bit-identical, float within rounding."""
    from toolchain.ir import macs
    from toolchain.rewrite.verify import verify_models

    total = sum(macs(graph, i) or 0 for i in range(len(graph.ops)))
    if total > TFLM_VERIFY_MAX_MACS:
        return {"skipped": f"{total / 1e9:.1f} GMACs: too slow for TFLite Micro's reference kernels here"}
    result = verify_models(source, whole, runs=2, runtimes=("tflm",))[0]
    if result.outputs and not result.ok:
        worst = max(o.max_abs for o in result.outputs)
        raise VerificationError(f"the optimised model differs from the input in TFLite Micro (max |diff| {worst:g})")
    return result.to_json()


# ---- Edge TPU compiler --------------------------------------------------------------------------
def _edgetpu_compile(tmp: Path, files: list[str], timeout: float = 600.0) -> dict:
    exe = shutil.which("edgetpu_compiler")
    if exe is None:
        return {"available": False}
    results = []
    for f in files:
        try:
            proc = subprocess.run([exe, "-s", "-o", str(tmp), str(tmp / f)], capture_output=True, text=True,
                                  timeout=timeout)
            log = proc.stdout + proc.stderr
            ok = proc.returncode == 0
        except (OSError, subprocess.TimeoutExpired) as exc:
            log, ok = str(exc), False
        (tmp / (Path(f).stem + "_edgetpu_compiler.txt")).write_text(log)
        results.append({"segment": f, "ok": ok, "log": Path(f).stem + "_edgetpu_compiler.txt"})
    return {"available": True, "path": exe, "segments": results}


# ---- the driver ----------------------------------------------------------------------------------
def compile_models(paths, n: int, out_dir=None, device: str = "coral-usb", strategy: str = "latency",
                   time_limit: float = 10.0, verify: bool = False, colocate: bool = False,
                   passes: tuple[str, ...] = ("rewrite", "schedule", "plan"), progress=None, workers: int = 2,
                   semantics: str = "tflite") -> CompileResult:
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    if not paths:
        raise UsageError("no model given")
    if len({p.resolve() for p in paths}) != len(paths):
        raise UsageError("the same model is given twice; co-deployment needs distinct files")
    if strategy not in STRATEGY_NAMES:
        raise UsageError(f"unknown strategy '{strategy}' (choose from {', '.join(STRATEGY_NAMES)})")
    if not (time_limit > 0):
        raise UsageError(f"--time-limit must be > 0, got {time_limit}")
    get_semantics(semantics)  # UsageError for an unknown name
    dev = load_device(device)
    if dev.kind != "edgetpu":
        raise UsageError(f"compile partitions for Edge TPU pipelines; '{dev.name}' is a {dev.kind} "
                         "(use `tpu-pipeline profile` for MCUs)")
    say = progress or (lambda msg: None)
    notes: list[str] = []
    records: list[PassRecord] = []
    stem = _stem(paths)
    out = Path(out_dir) if out_dir is not None else Path("out") / stem

    # load (and merge)
    t0 = time.perf_counter()
    sources = [(p, p.read_bytes() if p.is_file() else None) for p in paths]
    originals = []
    models = []
    for p, data in sources:
        if data is None:
            read_model(p)  # raises the right ModelError
        m = read_model(data, name=str(p))
        models.append(m)
        originals.append((str(p), data))
    if len(models) == 1:
        model = models[0]
        prefixes = [""]
    else:
        prefixes = [f"{p.stem}/" for p in paths]
        model = merge_models(models, prefixes, name=stem)
    renamed = _unique_names(model)
    if renamed:
        notes.append(f"{renamed} tensor(s) had an empty or duplicate name and were given a unique one")
    graph = from_model(model)
    if not graph.ops:
        raise ModelError(f"{paths[0]}: the model has no operators")
    for t in (*graph.inputs, *graph.outputs):
        graph.tensors[t].nbytes  # raises ModelError for dynamic shapes
    records.append(PassRecord("load", "ran", time.perf_counter() - t0,
                              {"ops": len(graph.ops), "models": len(paths)}))
    label = str(paths[0]) if len(paths) == 1 else stem
    # -n is checked before any expensive pass
    from toolchain.cost.edgetpu import EdgeTpuCostModel
    PartitionProblem(graph, EdgeTpuCostModel(dev)).check_n(n, label)

    # rewrite
    if "rewrite" in passes:
        say("rewrite")
        t0 = time.perf_counter()
        rr = rewrite_graph(graph, time_limit=min(time_limit, 10.0), semantics=semantics)
        if rr.applied:
            graph = rr.graph
        records.append(PassRecord("rewrite", "ran" if rr.applied else "no gain", time.perf_counter() - t0,
                                  {"applied": [a.to_json() for a in rr.applied], "peak_before": rr.peak_before,
                                   "peak_after": rr.peak_after}))
    # schedule (order within segments; the partition itself does not depend on it)
    if "schedule" in passes:
        say("schedule")
        t0 = time.perf_counter()
        s = schedule(graph, method="auto", time_limit=min(time_limit, 10.0), semantics=semantics)
        before = peak_memory(graph, None, semantics)
        if s.peak <= before:  # schedule() never returns worse; this keeps the stored order on ties
            graph = graph.reordered(s.order)
        records.append(PassRecord("schedule", "ran", time.perf_counter() - t0,
                                  {"method": s.method, "peak": s.peak, "peak_before": before,
                                   "lower_bound": s.lower_bound, "proven_optimal": s.proven_optimal}))
    whole = to_model(graph, model)
    # plan: TFLite Micro's offline memory plan for this order, written into the whole model
    if "plan" in passes and len(whole.subgraphs) > 1:
        records.append(PassRecord("plan", "skipped", 0.0, {"reason": f"{len(whole.subgraphs)} subgraphs (control "
                                  "flow): TFLite Micro plans them together; only the main one is modelled"}))
    elif "plan" in passes:
        say("plan arena offsets")
        t0 = time.perf_counter()
        tflm_plan = plan_for_tflm(whole, graph, time_limit=min(time_limit, 5.0))
        if any(o >= 0 for o in tflm_plan.tensor_offsets):
            whole = with_offline_plan(whole, list(tflm_plan.tensor_offsets))
        own = tflm_greedy(lifetimes(graph, semantics="tflm")).size
        records.append(PassRecord("plan", "ran" if tflm_plan.head < own else "no gain", time.perf_counter() - t0,
                                  {"tflm_head_bytes": tflm_plan.head, "tflm_own_planner_bytes": own,
                                   "lower_bound": tflm_plan.plan.lower_bound,
                                   "proven_optimal": tflm_plan.plan.proven_optimal or tflm_plan.head <= tflm_plan.plan.lower_bound,
                                   "planner": tflm_plan.plan.planner}))
    whole_bytes = model_to_bytes(whole)
    # the IR of exactly what is written: op positions below index `whole`'s operators
    graph = from_model(read_model(whole_bytes))

    # partition
    say(f"partition into {n} segment(s) ({strategy})")
    t0 = time.perf_counter()
    part = partition(graph, n, device=dev, strategy=strategy, time_limit=time_limit, colocate=colocate,
                     workers=workers, label=label)
    records.append(PassRecord("partition", "ran", time.perf_counter() - t0,
                              {"strategy": strategy, "proven_optimal": part.proven_optimal}))
    problem = PartitionProblem(graph, EdgeTpuCostModel(dev))

    # segments
    seg_files, seg_bytes, seg_reports = [], [], []
    tensor_name = lambda t: graph.tensors[t].name  # noqa: E731
    from toolchain.memory import plan_arena
    for k in range(n):
        ops = part.ops_of(k)
        iface = part.interfaces[k]
        if k < n - 1 and not iface.outputs:
            raise ModelError(f"{label}: segment {k} would produce nothing a later segment reads")
        seg_model = extract_segment(whole, list(ops), iface.inputs, iface.outputs)
        data = model_to_bytes(seg_model)
        fname = f"{stem}_segment_{k}_of_{n}.tflite"
        seg_files.append(fname)
        seg_bytes.append(data)
        sc = part.cost.stages[k]
        lt = lifetimes(problem.segment_graph(part.stages, k, iface), None, "tflite")
        arena = plan_arena(lt, time_limit=min(2.0, time_limit)).size
        seg_reports.append({
            "index": k, "file": fname,
            "inputs": [tensor_name(t) for t in iface.inputs],
            "outputs": [tensor_name(t) for t in iface.outputs],
            "ops": len(ops), "parameter_bytes": sc.param_bytes, "sram_bytes": sc.sram_bytes,
            "offchip_bytes": sc.offchip_bytes, "in_bytes": sc.in_bytes, "out_bytes": sc.out_bytes,
            "activation_peak_bytes": lt.peak, "activation_arena_bytes": arena,
            "predicted_latency_s": sc.latency_s,
            "predicted": sc.to_json(), "file_bytes": len(data),
        })

    verification = None
    if verify:
        say("verify (LiteRT)")
        t0 = time.perf_counter()
        verification = verify_chain([(f"{stem}.tflite", whole_bytes, "")], seg_bytes)
        # the optimised whole model against the input model(s): integer models must match exactly;
        # float models may differ by rounding where a rewrite reassociated sums (reported)
        integer = not any(t.dtype.startswith("float") for t in graph.tensors if t.kind == "activation")
        src = verify_chain([(lbl, data, pre) for (lbl, data), pre in zip(originals, prefixes)], [whole_bytes],
                           exact=integer)
        verification["whole_vs_source"] = {k: src[k] for k in ("bit_identical", "max_abs_diff", "outputs_compared")}
        if not src["bit_identical"]:
            notes.append(f"float model: the optimised model differs from the input by at most {src['max_abs_diff']:g} "
                         "(rewrites reassociate float sums); the segments match the optimised model exactly")
        if len(paths) == 1:
            verification["whole_vs_source_tflm"] = _verify_in_tflm(originals[0][1], whole_bytes, graph)
        records.append(PassRecord("verify", "ran", time.perf_counter() - t0, verification))

    base = part.baseline
    int8 = not any(t.dtype.startswith("float") for t in graph.tensors if t.kind == "activation")
    if not int8:
        notes.append("the model is not fully int8/uint8: the Edge TPU runs only quantized models, so these "
                     "predictions describe a hypothetical int8 version")
    report = {
        "model": f"{stem}.tflite",
        "source": str(paths[0]) if len(paths) == 1 else [str(p) for p in paths],
        "num_segments": n,
        "device": dev.name,
        "strategy": strategy,
        "inputs": [tensor_name(t) for t in graph.inputs],
        "outputs": [tensor_name(t) for t in graph.outputs],
        "segments": seg_reports,
        "predicted": part.cost.to_json(),
        "solver": {"proven_optimal": part.proven_optimal, "primary_proven": part.primary_proven,
                   "proven_steps": list(part.proven_steps), "seconds": part.seconds, "objectives": part.objectives,
                   "lower_bounds": part.bounds, "time_limit_s": time_limit, "colocate_consumers": colocate},
        "baseline": None if base is None else {
            "name": "coral parameter-count heuristic (libcoral)",
            "segments": [{"index": k, "ops": s.ops, "parameter_bytes": s.param_bytes, "offchip_bytes": s.offchip_bytes,
                          "in_bytes": s.in_bytes, "out_bytes": s.out_bytes, "predicted_latency_s": s.latency_s}
                         for k, s in enumerate(base.cost.stages)],
            "predicted": base.cost.to_json(), "note": base.note},
        "gain_throughput": part.gain,
        "passes": [dataclasses.asdict(r) for r in records],
        "verification": verification,
        "notes": notes,
    }
    if len(paths) > 1:
        report["models"] = [{"model": str(p), "prefix": pre,
                             "inputs": [tensor_name(t) for t in graph.inputs if tensor_name(t).startswith(pre)],
                             "outputs": [tensor_name(t) for t in graph.outputs if tensor_name(t).startswith(pre)]}
                            for p, pre in zip(paths, prefixes)]

    # write: build everything in a temporary directory, then move files into place
    files = [f"{stem}.tflite", *seg_files, "report.json"]
    tmp = Path(tempfile.mkdtemp(prefix=".compile.", dir=str(out.parent) if out.parent.exists() else None))
    try:
        (tmp / f"{stem}.tflite").write_bytes(whole_bytes)
        for f, data in zip(seg_files, seg_bytes):
            (tmp / f).write_bytes(data)
        etc = _edgetpu_compile(tmp, seg_files)
        report["edgetpu_compiler"] = etc
        if not etc["available"]:
            notes.append("edgetpu_compiler is not on PATH: the segments stay CPU-side and are emulated")
        else:
            files += [p.name for p in sorted(tmp.iterdir()) if p.name not in files]
        (tmp / "report.json").write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
        for f in files:
            write_bytes_atomic(out / f, (tmp / f).read_bytes())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return CompileResult(out, stem, report, files, part, records, notes)


def _json_default(obj):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return str(obj)

"""The Python API of several models on one MCU, run one at a time on one TFLite Micro arena
(docs/deploy.md#several-models-one-arena): `fit`, `plan`, `profile` and `run --backend qemu`
with several models. Each returns the command's `--json` as a plain dict and raises the
`ToolchainError` its exit code comes from; nothing is written unless every model succeeded.

    import tpu_pipeline.api_shared as shared
    d = shared.fit_shared(["kws.tflite", "vww.tflite"], "out/", device="stm32h743")
    d["shared_arena_bytes_predicted"], d["models"][0]["output"]
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tpu_pipeline import api  # the one-model calls (api.py imports nothing of this module)
from tpu_pipeline.runtime.library_app import run_libraries_on_qemu
from tpu_pipeline.toolchain.deploy.banks import capacities, firmware_reserve, place
from tpu_pipeline.toolchain.deploy.shared_arena import plan_shared, shared_arena
from tpu_pipeline.toolchain.deploy.shared_fit import fit_shared as fit_models
from tpu_pipeline.toolchain.device import DEFAULT_KERNEL_SET, Device, KernelSet, kernel_set, load_device
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.fit import FitParams
from tpu_pipeline.toolchain.ir import from_model
from tpu_pipeline.toolchain.tflite import read_model, write_bytes_atomic
from tpu_pipeline.toolchain.tflite.io import check_output_folder
from tpu_pipeline.toolchain.tflite.metadata import read_offline_plan


DEFAULT_BOARD = "qemu-mps2-an386"  # whose export plans the written models when only --budget is given


def _paths(models) -> list[str]:
    paths = [os.fspath(m) for m in models]
    if len(paths) < 2:
        raise UsageError("a shared arena needs two models or more")
    for p in paths:
        if not Path(p).is_file():
            raise UsageError(f"{p}: no such model file")
    return paths


def _outputs(paths, out_dir) -> list[Path]:
    """Where each model goes in `out_dir` (its file name): refused before any work when two
    models share a name or the folder cannot take them."""
    out = check_output_folder(out_dir, paths)
    names = [Path(p).name for p in paths]
    if len(set(names)) != len(names):
        raise UsageError(f"models named alike ({', '.join(names)}): {out} would hold one file for two; rename one")
    return [out / n for n in names]


def _write_all(targets, blobs, inputs) -> None:
    """Every file or none: each goes beside its target first, then all are renamed into place."""
    Path(targets[0]).parent.mkdir(parents=True, exist_ok=True)
    staged = []
    try:
        for t, data in zip(targets, blobs):
            tmp = Path(t).with_name(f".{Path(t).name}.partial")
            write_bytes_atomic(tmp, data, inputs=inputs)
            staged.append(tmp)
        for tmp, t in zip(staged, targets):
            os.replace(tmp, t)
    finally:
        for tmp in staged:
            if tmp.exists():
                tmp.unlink()


def _device(device) -> Device | None:
    return None if device is None else device if isinstance(device, Device) else load_device(device)


def _kernels(kernels) -> KernelSet:
    return kernel_set(kernels) if isinstance(kernels, str) else (kernels or DEFAULT_KERNEL_SET)


def fit_shared(models, out_dir, *, budget: int | None = None, device: str | Device | None = None,
               kernels: str | KernelSet | None = None, time_limit: float = 30.0, runs: int = 2,
               progress=None, int8_io: bool = False, builtin_kernels: bool = False, patches: bool = True,
               allow_lossy: bool = False) -> dict:
    """`fit a.tflite b.tflite (--budget B | --device D) -o DIR`: every model fitted so the shared
    arena (largest head + stacked tails) fits, at the least total predicted latency; each written
    to DIR/<its file name> (all or none). InfeasibleError when no joint choice fits."""
    paths = _paths(models)
    targets = _outputs(paths, out_dir)
    params = FitParams(budget=budget, device=_device(device), kernels=_kernels(kernels), int8_io=int8_io,
                       patches=patches, harness=not builtin_kernels, allow_lossy=allow_lossy,
                       time_limit=time_limit, verify_runs=runs)
    s = fit_models(paths, params, progress, params.device or load_device(DEFAULT_BOARD))
    _write_all(targets, [f.data for f in s.fitted], paths)
    d = s.to_json()
    d["device"] = params.device.name if params.device is not None else None
    for m, t in zip(d["models"], targets):
        m["output"] = str(t)
    return d


def plan_shared_models(models, out_dir, *, kernels: str | KernelSet | None = None, device=None) -> dict:
    """`plan a.tflite b.tflite -o DIR`: each model's offline plan (its head from the arena's first
    byte, as a shared head is used), written to DIR/<its file name>, and the shared arena they make
    on the 32-bit target (`kernels`; with `device` also the bank that holds it)."""
    paths = _paths(models)
    targets = _outputs(paths, out_dir)
    ks, dev = _kernels(kernels), _device(device)
    planned = [api.plan(p) for p in paths]
    graphs = []
    for r in planned:
        m = read_model(r.model_bytes)
        graphs.append((from_model(m), read_offline_plan(m)))
    a = shared_arena(graphs, ks)
    _write_all(targets, [r.model_bytes for r in planned], paths)
    d = {"kernels": ks.name, **a.to_json(),
         "models": [{"model": p, "output": str(t), "planned_bytes": r.planned_bytes, "lower_bound": r.lower_bound,
                     "proven_optimal": r.proven_optimal, "arena_head_predicted": h, "arena_tail_predicted": tl}
                    for p, t, r, h, tl in zip(paths, targets, planned, a.heads, a.tails)]}
    if dev is not None:
        d.update(device=dev.name, **_fits(a, dev))
    return d


def _fits(a, dev: Device) -> dict:
    """Whether the shared arena fits the device: one buffer, so the fastest bank that holds it whole."""
    reserve = firmware_reserve(dev) if dev.firmware is not None else 0
    p = place(a.head, a.tail, dev.memory.banks, reserve, split_tail=a.total + 1)
    room = max(cap for _, cap in capacities(dev.memory.banks, reserve))
    return {"sram_bytes": dev.memory.sram_bytes, "arena_bytes_available": room, "fits": p is not None,
            "banks": p.to_json() if p is not None else None}


def profile_shared(models, device: str | Device, kernels: str | KernelSet | None = None, measure: bool = False,
                   inferences: int = 3, seed: int = 0) -> dict:
    """Several models on one MCU, run one at a time on one TFLite Micro arena (docs/deploy.md):
    the shared arena predicted, per model head and tail; `measure`: built as a library into a plain
    application and run in QEMU (arena measured, each model's outputs against it alone)."""
    dev, ks = _device(device), _kernels(kernels)
    if dev.kind != "mcu":
        raise UsageError(f"several models share an arena on an MCU; '{dev.label}' is not one")
    paths = _paths(models)
    a = plan_shared(paths, dev, ks)
    d = {"device": dev.name, "kernels": ks.name, **a.to_json(), **_fits(a, dev),
         "models": [{"model": m, "arena_head_predicted": h, "arena_tail_predicted": t, "arena_bytes_predicted": h + t}
                    for m, h, t in zip(paths, a.heads, a.tails)]}
    if measure:
        with tempfile.TemporaryDirectory(prefix="tpup-profile-") as tmp:
            r = run_libraries_on_qemu(paths, dev, ks, tmp, inferences=inferences, seed=seed, shared=True)
        shared = r.arenas[0]
        d.update(arena_bytes_measured=shared.used, arena_head_measured=shared.head,
                 arena_tail_measured=shared.tail, simulated=True,
                 arena_matches_prediction=shared.used == a.total)
        if d.get("banks"):
            for b in d["banks"]:
                b["bytes_measured"] = shared.used if b["bytes_predicted"] else 0
        for m, run in zip(d["models"], r.models):
            m["outputs_match"], m["output_differences"] = run.outputs_match, run.output_differences
    return d

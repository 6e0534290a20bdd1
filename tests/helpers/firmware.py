"""What the firmware tests need from the machine: the ARM toolchain, QEMU, a TFLite Micro tree."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tpu_pipeline.toolchain.device import KernelSet, kernel_set, load_device
from tpu_pipeline.toolchain.errors import UsageError

HAVE_ARM = all(shutil.which(t) for t in ("arm-none-eabi-g++", "arm-none-eabi-gcc", "arm-none-eabi-size"))
HAVE_QEMU = shutil.which("qemu-system-arm") is not None
needs_arm = pytest.mark.skipif(not HAVE_ARM, reason="ARM toolchain not installed (apt-get install gcc-arm-none-eabi "
                               "libnewlib-arm-none-eabi libstdc++-arm-none-eabi-newlib; .ci/run does)")
needs_qemu = pytest.mark.skipif(not HAVE_QEMU, reason="qemu-system-arm not installed (apt-get install "
                                "qemu-system-arm; .ci/run does)")
MLPERF = Path(os.environ.get("TPUP_MLPERF_DIR", "/nonexistent"))  # MLPerf Tiny's int8 models (not committed)


def needs_mlperf(name: str):
    """Skip unless TPUP_MLPERF_DIR holds MLPerf Tiny's `name`.tflite."""
    return pytest.mark.skipif(not (MLPERF / f"{name}.tflite").is_file(),
                              reason=f"set TPUP_MLPERF_DIR to a folder of MLPerf Tiny's int8 models ({name}.tflite)")


def written(graph, template: bytes) -> bytes:
    """`graph` as a .tflite file, its buffers and metadata from the model `template`."""
    from tpu_pipeline.toolchain.ir.convert import to_model
    from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

    return model_to_bytes(to_model(graph, read_model(template) if isinstance(template, bytes) else template))


def model_for_qemu(tmp_path_factory, name: str, data: bytes) -> Path:
    """`data` written as NAME.tflite for a module's QEMU tests (a module fixture's body); skips
    without the ARM toolchain or QEMU, before anything is built."""
    if not (HAVE_ARM and HAVE_QEMU):
        pytest.skip("ARM toolchain or QEMU not installed (.ci/run installs them)")
    path = tmp_path_factory.mktemp(name) / f"{name}.tflite"
    path.write_bytes(data)
    return path


def tree_or_skip(kernels: str | KernelSet) -> Path:
    """The TFLite Micro tree for `kernels`, or skip the test when none is here."""
    from tpu_pipeline.toolchain.firmware.library import find_tree

    try:
        return find_tree(kernel_set(kernels))
    except UsageError as exc:
        pytest.skip(f"no TFLite Micro tree: {exc}")


def run_fitted_on_qemu(tmp_path, fitted, kernels: str | KernelSet):
    """The fitted model in the harness firmware for `kernels` on QEMU (skips without the ARM
    toolchain, QEMU or the TFLite Micro tree); its outputs must match the host's TFLite Micro."""
    if not (HAVE_ARM and HAVE_QEMU):
        pytest.skip("ARM toolchain or qemu-system-arm not installed (.ci/run installs them)")
    out = tmp_path / "fitted.tflite"
    out.write_bytes(fitted.data)
    return qemu_run_matching(out, load_device("qemu-mps2-an386"), kernels, iterations=2, seed=3)


def qemu_run_matching(path, board, kernels: str | KernelSet, **options):
    """`path` in the harness firmware for `kernels` on the emulated `board` (skips while another
    process builds the TFLite Micro library, or without its tree); its outputs must match the
    host's TFLite Micro. The run's report."""
    from tpu_pipeline.runtime.backends.qemu import run_on_qemu
    from tpu_pipeline.toolchain.firmware.library import LibraryBusy

    tree_or_skip(kernels)
    try:
        r = run_on_qemu(path, board, kernel_set(kernels), **options)
    except LibraryBusy as exc:
        pytest.skip(str(exc))
    assert r.error is None and r.outputs_match is True, (r.error, r.output_differences, _mismatch_facts(r, options))
    return r


def _mismatch_facts(r, options) -> dict:
    """What tells a wrong device from a wrong reference when a run does not match: the same inputs
    through host TFLite Micro again, in this process and in a fresh child process, beside the
    device's outputs, and how export-mcu planned the arena (its planner runs against a clock)."""
    import json

    import numpy as np

    from tpu_pipeline.toolchain.execute.tflm import TflmModel, run_tflm_sets_in_child

    project = Path(r.elf).parents[2]
    data = (project / "model.tflite").read_bytes()
    host = TflmModel(data, 64 * 1024 * 1024)
    arrays = host.input_sets(data, options.get("iterations", 3), options.get("seed", 0))
    exported = json.loads((project / "export.json").read_text())
    shown = lambda outs: [[np.asarray(o).ravel()[:16].tolist() for o in inf] for inf in outs]  # noqa: E731
    return {"device": shown(r.outputs), "host_in_process": shown(host.run(x) for x in arrays),
            "host_in_child": shown(run_tflm_sets_in_child(data, arrays)),
            "export": {k: exported.get(k) for k in ("planner", "planned_head", "measured_head", "measured_tail",
                                                      "arena_size")}, "project": str(project)}


def exported_model(r):
    """The model file a harness run exported (beside its firmware project)."""
    from tpu_pipeline.toolchain.tflite import read_model

    return read_model(Path(r.elf).parents[2] / "model.tflite")


def exported_arena(r):
    """The target arena (head, tail) predicted for the model a harness run exported, with its offline
    plan and the run's kernel set: what the run's measured head and tail must equal."""
    from tpu_pipeline.toolchain.ir import from_model
    from tpu_pipeline.toolchain.memory.tflm_target import target_arena
    from tpu_pipeline.toolchain.tflite.metadata import read_offline_plan

    exported = exported_model(r)
    return target_arena(from_model(exported), kernel_set(r.kernels), read_offline_plan(exported))


def qemu_run_as_planned(path, board, kernels: str | KernelSet, **options):
    """`qemu_run_matching`, and the arena the firmware measured (head and tail) is the one predicted
    for the exported model. The run's report."""
    r = qemu_run_matching(path, board, kernels, **options)
    predicted = exported_arena(r)
    assert (predicted.head, predicted.tail) == (r.head_bytes, r.tail_bytes)
    return r


def mlperf_on_harness(name: str):
    """(graph on the harness kernels fit picks, source model) of MLPerf Tiny's `name`."""
    from tpu_pipeline.toolchain.fit.variants import on_harness
    from tpu_pipeline.toolchain.ir import from_model
    from tpu_pipeline.toolchain.tflite import read_model

    src = read_model((MLPERF / f"{name}.tflite").read_bytes())
    return on_harness(from_model(src))[0], src


def graph_in_qemu(tmp_path, graph, template, board, kernels: str | KernelSet, **options):
    """`graph` written (see `written`) and run by `qemu_run_matching`. The run's report."""
    path = tmp_path / "model.tflite"
    path.write_bytes(written(graph, template))
    return qemu_run_matching(path, board, kernels, **options)

"""Ask the real TFLite Micro interpreter how much arena a model takes.

`tflite_micro.runtime.Interpreter` has no getter for the arena: `print_allocations()` writes
`[RecordingMicroAllocator] Arena allocation head N bytes` (and tail, total) to C stderr. Reading
file descriptor 2 from inside the same process is fragile, so the measurement runs in a child
process whose descriptors 1 and 2 go to files: a forked one (the modules are loaded already: no
interpreter start-up, which took ~0.4 s of every fit twice), else, and to word a crash in TFLite
Micro's own lines, a new Python process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.execute.tflm import CHECKOUT

_FIGURE = re.compile(r"Arena allocation (head|tail|total) (\d+) bytes")


@dataclass(frozen=True)
class TflmArena:
    head: int
    tail: int
    total: int


def check_tflm_dtypes(model, label: str | None = None) -> None:
    """ModelError when the model has tensors TFLite Micro has no kernels for (float16).

    `model` is the model as tflite/ reads it, its .tflite bytes or a path. Without this check TFLite Micro fails to
    allocate and the caller can only say "cannot run with any arena", which reads like a size
    problem."""
    from tpu_pipeline.toolchain.tflite import tensor_names_of_type

    if isinstance(model, (str, Path)):
        label = label or str(model)
        try:
            model = Path(model).read_bytes()
        except OSError:
            return  # the caller's own read says what is wrong with the file
    found = tensor_names_of_type(model, "float16")
    if found:
        where = f"{label}: " if label else ""
        raise ModelError(f"{where}{CANNOT_RUN} (it has no float16 kernels: {len(found)} float16 tensors, e.g. "
                         f"'{found[0]}'; convert it without float16 quantization, as float32 or int8)")


def _child(path: str, arena_size: int, invoke: bool) -> None:
    """Runs in the child: allocate (and optionally invoke), then print the allocation report."""
    import numpy as np

    from tpu_pipeline.toolchain.execute.tflm import io_details, tflm_interpreter

    data = Path(path).read_bytes()
    interp = tflm_interpreter(data, arena_size)
    if invoke:
        for i, d in enumerate(io_details(interp, "input", data)):
            interp.set_input(np.zeros(d["shape"], dtype=d["dtype"]), i)
        interp.invoke()
    sys.stdout.flush()
    interp.print_allocations()


def measure_tflm_arena(model: bytes | str | Path, arena_size: int = 64 * 1024 * 1024,
                       invoke: bool = False, timeout: float = 300.0, label: str | None = None) -> TflmArena:
    """Head, tail and total arena bytes that real TFLite Micro allocates for `model`.

    ModelError (exit 2) when TFLite Micro cannot allocate the model: float16 tensors, or any other
    refusal in an arena of `arena_size` bytes (64 MiB by default: far more than any model needs,
    so a refusal is the model's, not a device's)."""
    check_tflm_dtypes(model, label)
    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(model, (bytes, bytearray)):
            path = Path(tmp) / "model.tflite"
            path.write_bytes(model)
        else:
            path = Path(model).resolve()
        returncode, stdout, stderr = _forked_run(path, arena_size, invoke, timeout)
    figures = dict((k, int(v)) for k, v in _FIGURE.findall(stderr + stdout))
    if returncode != 0 or "head" not in figures:
        raise ModelError(f"{label or 'model'}: {CANNOT_RUN} ({tflm_reason(stderr, returncode)})")
    return TflmArena(figures["head"], figures.get("tail", 0), figures.get("total", 0))


def _forked_run(path: Path, arena_size: int, invoke: bool, timeout: float) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `_child` on the model at `path`: in a forked child where the
    platform forks and the child ends on its own; else (no fork, or TFLite Micro crashed: its last
    words are then read from a new process, as before) in a new Python process."""
    import os

    from tpu_pipeline.toolchain.execute.child import RuntimeCrash, call_in_child

    if hasattr(os, "fork"):
        try:
            return call_in_child(_captured, str(path), arena_size, invoke, runtime="TFLite Micro",
                                 doing="allocating the model", timeout=timeout)
        except RuntimeCrash:
            pass
    code = ("import sys; from tpu_pipeline.toolchain.execute.tflm_arena import _child; "
            "_child(sys.argv[1], int(sys.argv[2]), sys.argv[3] == '1')")
    proc = subprocess.run([sys.executable, "-c", code, str(path), str(arena_size), "1" if invoke else "0"],
                          capture_output=True, text=True, timeout=timeout, cwd=str(CHECKOUT))
    return proc.returncode, proc.stdout, proc.stderr


def _captured(path: str, arena_size: int, invoke: bool) -> tuple[int, str, str]:
    """Runs in a forked child: `_child` with descriptors 1 and 2 in files; (exit code, stdout,
    stderr) as a new process running it would give them (an exception: exit 1, its traceback)."""
    import ctypes
    import os
    import traceback

    outs = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    for fd, f in zip((1, 2), outs):
        os.dup2(f.fileno(), fd)
    code = 0
    try:
        _child(path, arena_size, invoke)
    except Exception:  # noqa: BLE001 - reported as the interpreter would, on stderr
        code = 1
        sys.stderr.write(traceback.format_exc())
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # C stdio's buffers too
    texts = []
    for f in outs:
        f.seek(0)
        texts.append(f.read().decode(errors="replace"))
    return code, texts[0], texts[1]


# The one wording every command uses when TFLite Micro refuses a model (the survey and users can
# tell it from a bad file): "<model>: TFLite Micro cannot run this model (<its own reason>)".
CANNOT_RUN = "TFLite Micro cannot run this model"


def tflm_reason(stderr: str, returncode: int = 1) -> str:
    """TFLite Micro's own words for a refusal: the lines it printed before Python's traceback
    ("Hybrid models are not supported on TFLite Micro. Node CONV_2D (number 0) failed to
    prepare"), without source paths; the signal when it crashed."""
    said = []
    for line in stderr.splitlines():
        line = line.strip()
        if not line or line.startswith("[RecordingMicroAllocator]"):
            continue
        if line.startswith("Traceback"):
            break
        said.append(re.sub(r"^\S+\.(cc|h|cpp):?\d*:?\s*", "", line))
    if not said and returncode < 0:
        from tpu_pipeline.toolchain.execute.child import signal_name

        return f"it crashed ({signal_name(-returncode)})"
    if not said:
        said = (stderr.strip().splitlines() or ["no reason given"])[-1:]
    text = " ".join(dict.fromkeys(said))
    return text if len(text) <= 240 else text[:237] + "..."


def tflm_refusal(model: bytes | str | Path, label: str | None = None) -> str | None:
    """None when TFLite Micro (host wheel) allocates `model`, else why not, in its own words: the
    verdict `inspect` reports and the MCU commands refuse with."""
    try:
        measure_tflm_arena(model, label=label)
    except ModelError as exc:
        text = str(exc)
        if CANNOT_RUN not in text:
            return text
        reason = text.split(f"{CANNOT_RUN} (", 1)[-1]
        return reason[:-1] if reason.endswith(")") else reason  # the wrapper's closing parenthesis only
    return None


if __name__ == "__main__":  # pragma: no cover - manual use
    print(json.dumps(measure_tflm_arena(sys.argv[1]).__dict__))


def predicted_host_head(data: bytes) -> int:
    """The head our model of TFLite Micro's planner predicts the host's interpreter (reference
    kernels) allocates for `data` with the offline plan it carries: for a model on the harness's
    kernels, its builtin view (what the host runs; overlapped tensors left to the runtime)."""
    from tpu_pipeline.toolchain.device import REFERENCE
    from tpu_pipeline.toolchain.ir import from_model
    from tpu_pipeline.toolchain.ir.convert import builtin_view_bytes
    from tpu_pipeline.toolchain.memory.tflm_target import target_head
    from tpu_pipeline.toolchain.tflite import read_model
    from tpu_pipeline.toolchain.tflite.metadata import read_offline_plan

    view = read_model(builtin_view_bytes(data))
    return target_head(from_model(view), REFERENCE, read_offline_plan(view))[0]

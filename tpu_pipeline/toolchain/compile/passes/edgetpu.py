"""Run Coral's edgetpu_compiler on each segment when it is on PATH (it is not installable here:
then the segments stay CPU-side and the runtime emulates them). Its outputs are kept as files
to write beside the segments."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import tempfile
from pathlib import Path

from tpu_pipeline.toolchain import interrupts
from tpu_pipeline.toolchain.compile.state import CompileState, PassRecord

TIMEOUT_S = 600.0


def edgetpu(state: CompileState, _allowed: float) -> tuple[CompileState, PassRecord]:
    exe = shutil.which("edgetpu_compiler")
    if exe is None:
        note = "edgetpu_compiler is not on PATH: the segments stay CPU-side and are emulated"
        state = dataclasses.replace(state, edgetpu_compiler={"available": False}, notes=state.noted(note))
        return state, PassRecord("edgetpu_compiler", "skipped", 0.0, {"reason": "not on PATH"})
    tmp = Path(tempfile.mkdtemp(prefix=".edgetpu."))
    interrupts.register_temp(tmp)
    try:
        results, extra = [], []
        for seg in state.segments:
            (tmp / seg.file).write_bytes(seg.data)
            log_name = Path(seg.file).stem + "_edgetpu_compiler.txt"
            try:
                proc = subprocess.run([exe, "-s", "-o", str(tmp), str(tmp / seg.file)], capture_output=True,
                                      text=True, timeout=TIMEOUT_S)
                log, ok = proc.stdout + proc.stderr, proc.returncode == 0
            except (OSError, subprocess.TimeoutExpired) as exc:
                log, ok = str(exc), False
            extra.append((log_name, log.encode()))
            results.append({"segment": seg.file, "ok": ok, "log": log_name})
        written = {s.file for s in state.segments}
        extra += [(p.name, p.read_bytes()) for p in sorted(tmp.iterdir()) if p.name not in written and p.is_file()]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        interrupts.unregister_temp(tmp)
    info = {"available": True, "path": exe, "segments": results}
    state = dataclasses.replace(state, edgetpu_compiler=info, extra_files=tuple(extra))
    return state, PassRecord("edgetpu_compiler", "ran", 0.0, info)

"""Does LiteRT load this model? Checked before a model is compiled or rewritten, so a file our
reader accepts but the runtime cannot build an interpreter for is refused up front (exit 2)
instead of being compiled into segments nothing can run.

The check runs in a forked child where the platform allows it: LiteRT's C++ side may abort or
crash on a model it cannot prepare, and that must end as one error line, not kill the caller.
"""

from __future__ import annotations

import os
import re
import select
import signal
import time

from tpu_pipeline.toolchain.errors import ModelError

TIMEOUT_S = 120.0
_UNRESOLVED = re.compile(r"Encountered unresolved custom op: ([^.\n]*)")


def check_loads_in_litert(data: bytes, label: str) -> str | None:
    """Raise ModelError (one line naming `label`) unless LiteRT builds an interpreter for `data`
    and allocates its tensors.

    A model whose only problem is a CUSTOM op LiteRT has no kernel for is not refused: the
    return value is then a note saying so (the runtime check stops at that op, so the rest of
    the model is checked only by our reader). Otherwise returns None.
    """
    ok, message = _run(data)
    if ok:
        return None
    unresolved = _UNRESOLVED.search(message)
    if unresolved:
        return (f"LiteRT has no kernel for custom op '{unresolved.group(1).strip()}', so it cannot load "
                f"{label}; the runtime checks skip what cannot run")
    return _refusal(label, message)


def _refusal(label: str, message: str) -> str:
    first = " ".join(message.split())
    # LiteRT repeats one complaint per tensor ("... Tensor 33 has ...Tensor 36 has ..."): say it once
    sentences = list(dict.fromkeys(re.sub(r"\b(Tensor|tensor|Node number) \d+", r"\1 N", x).strip()
                                   for x in re.split(r"(?<=[.!?])(?=\S)|(?<=[.!?]) ", first) if x.strip()))
    if sentences:
        first = " ".join(sentences)
    if len(first) > 300:
        first = first[:297] + "..."
    raise ModelError(f"{label}: LiteRT cannot load this model ({first or 'no reason given'})")


def _try_load(data: bytes) -> tuple[bool, str]:
    from tpu_pipeline.toolchain.execute.litert import litert_load_error

    # The default resolver, XNNPACK delegate included: what a user's interpreter runs.
    error = litert_load_error(data, builtin_only=False, num_threads=None)
    return error is None, error or ""


def _run(data: bytes) -> tuple[bool, str]:
    if not hasattr(os, "fork"):
        return _try_load(data)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: silence LiteRT's own logging, report through the pipe
        code = 1
        try:
            # Interrupts are the parent's to handle (it kills this child); the child must not
            # write to the parent's signal wakeup socket either.
            try:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_IGN)
                signal.set_wakeup_fd(-1)
            except ValueError:  # not the main thread: nothing of the parent's to undo
                pass
            os.close(read_fd)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            ok, message = _try_load(data)
            os.write(write_fd, (("1" if ok else "0") + message).encode("utf-8", "replace")[:65536])
            code = 0
        except BaseException:  # noqa: BLE001 - the parent reports the missing answer
            pass
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                break
            ready, _, _ = select.select([read_fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    finally:
        os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    answer = b"".join(chunks).decode("utf-8", "replace")
    if answer:
        return answer[0] == "1", answer[1:]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return False, f"LiteRT crashed ({name})"
    return False, "LiteRT gave no answer" if time.monotonic() < deadline else f"no answer in {TIMEOUT_S:.0f} s"


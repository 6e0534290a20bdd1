"""Run an interpreter where its crash cannot take the tool down: a forked child process.

LiteRT and TFLite Micro are C++; on some valid models they crash (LiteRT's SVDF kernel on TFLite
Micro's int8 keyword model: SIGSEGV) or abort (glibc's heap checks). In the caller's process that
ends the command with exit 139 and no word of why. `call_in_child(fn, *args)` runs `fn` in a
forked child (the parent's modules are already loaded: no start-up cost beyond the fork) and
hands back its return value or re-raises its exception; a child killed by a signal becomes one
`RuntimeCrash` (a ModelError, exit 2) naming the runtime, the signal and what it was doing.
Where the platform has no fork, `fn` runs in the caller's process.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import select
import signal
import tempfile
import time

from tpu_pipeline.toolchain.errors import ModelError

TIMEOUT_S = 1800.0


class RuntimeCrash(ModelError):
    """A runtime (LiteRT, TFLite Micro) died on the model: the model cannot be run there."""

    def __init__(self, message: str, runtime: str = ""):
        super().__init__(message)
        self.runtime = runtime

    def __reduce__(self):
        return (RuntimeCrash, (str(self), self.runtime))


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def call_in_child(fn, *args, runtime: str, doing: str, timeout: float = TIMEOUT_S, **kwargs):
    """`fn(*args, **kwargs)` in a forked child; its result, or its exception re-raised here.

    A child that dies by a signal raises RuntimeCrash("<runtime> crashed (<SIGNAL>) <doing>");
    one that runs past `timeout` seconds is killed and raises RuntimeCrash too. Interrupts stay
    the parent's: the child ignores SIGINT/SIGTERM and is killed when the parent is interrupted."""
    if not hasattr(os, "fork"):
        return fn(*args, **kwargs)
    with tempfile.TemporaryDirectory(prefix="tpup-child-") as tmp:
        result_path = os.path.join(tmp, "result.pickle")
        log_path = os.path.join(tmp, "log")
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                try:
                    for sig in (signal.SIGINT, signal.SIGTERM):
                        signal.signal(sig, signal.SIG_IGN)
                    signal.set_wakeup_fd(-1)
                except ValueError:  # not the main thread: nothing of the parent's to undo
                    pass
                os.close(read_fd)
                faulthandler.disable()  # a crash here is reported by the parent, not dumped
                log = os.open(log_path, os.O_WRONLY | os.O_CREAT, 0o600)  # native messages: kept for the error
                os.dup2(log, 1)
                os.dup2(log, 2)
                try:
                    outcome = (True, fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - handed to the parent as it is
                    outcome = (False, exc)
                with open(result_path, "wb") as f:
                    try:
                        pickle.dump(outcome, f)
                    except Exception as exc:  # noqa: BLE001 - an unpicklable result is a bug
                        f.seek(0)
                        f.truncate()
                        pickle.dump((False, RuntimeError(f"{type(exc).__name__}: {exc}")), f)
                code = 0
            finally:
                os._exit(code)
        os.close(write_fd)
        deadline = time.monotonic() + timeout
        timed_out = False
        try:
            while True:  # the pipe closes when the child exits, however it exits
                left = deadline - time.monotonic()
                if left <= 0:
                    os.kill(pid, signal.SIGKILL)
                    timed_out = True
                    break
                ready, _, _ = select.select([read_fd], [], [], min(left, 1.0))
                if ready and not os.read(read_fd, 4096):
                    break
        except BaseException:  # an interrupt: the child goes with us
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
        finally:
            os.close(read_fd)
        _, status = os.waitpid(pid, 0)
        said = _last_line(log_path)
        if timed_out:
            raise RuntimeCrash(f"{runtime} gave no answer within {timeout:.0f} s {doing}", runtime)
        if os.WIFSIGNALED(status):
            raise RuntimeCrash(f"{runtime} crashed ({signal_name(os.WTERMSIG(status))}{': ' + said if said else ''}) "
                               f"{doing}", runtime)
        try:
            with open(result_path, "rb") as f:
                ok, value = pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError):
            raise RuntimeCrash(f"{runtime} ended without an answer (exit {os.WEXITSTATUS(status)}) {doing}",
                               runtime) from None
    if ok:
        return value
    raise value


def _last_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            lines = [ln.strip() for ln in f.read()[-4096:].decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""

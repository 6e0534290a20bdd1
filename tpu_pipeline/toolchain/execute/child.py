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
import shutil
import signal
import tempfile
import time
import weakref

from tpu_pipeline.toolchain import interrupts
from tpu_pipeline.toolchain.errors import ModelError

TIMEOUT_S = 1800.0
# LiteRT's bounds check on a tensor index the interpreter gave out: it fails only when a kernel has
# overwritten the interpreter's own state (then segfaults, aborts in free() or this, run to run)
CORRUPT_INDEX = "exceeds max tensor index"
_IN_CHILD = False  # this process is a child started here (its process group is its own)


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
    return start_in_child(fn, *args, runtime=runtime, doing=doing, timeout=timeout, **kwargs).result()


class ChildCall:
    """A call running in a forked child (`start_in_child`); `result()` waits for it. One that is
    never collected is killed and reaped when dropped (`cancel`)."""

    def __init__(self, runtime: str, doing: str, timeout: float):
        self.runtime, self.doing, self.timeout = runtime, doing, timeout
        self.pid = 0
        self.owner = os.getpid()
        self.outcome = None      # (ok, value) once known without a child (no fork)
        self.tmp = tempfile.mkdtemp(prefix="tpup-child-")
        interrupts.register_temp(self.tmp)  # removed by a hard exit too, which runs no finalizer
        self.result_path = os.path.join(self.tmp, "result.pickle")
        self.log_path = os.path.join(self.tmp, "log")
        self.read_fd = -1
        self.deadline = time.monotonic() + timeout
        self._finalizer = weakref.finalize(self, _cancel, self.__dict__)

    def cancel(self) -> None:
        self._finalizer()

    def result(self):
        try:
            if self.outcome is None:
                self.outcome = self._wait()
        finally:  # also on an interrupt: the child goes with us
            self._finalizer()  # the child is killed if still running, reaped, and its folder removed
        ok, value = self.outcome
        if ok:
            return value
        if isinstance(value, ValueError) and CORRUPT_INDEX in str(value):
            # an index the interpreter handed out itself, out of its own range: its memory is
            # overwritten (LiteRT's int8 SVDF on TFLite Micro's keyword model), wherever it showed
            raise RuntimeCrash(f"{self.runtime} crashed (it corrupted its own memory: {value}) {self.doing}",
                               self.runtime)
        raise value

    def _wait(self):
        timed_out = False
        while True:  # the pipe closes when the child exits, however it exits (an interrupt: see result)
            left = self.deadline - time.monotonic()
            if left <= 0:
                _kill(self.pid)
                timed_out = True
                break
            ready, _, _ = select.select([self.read_fd], [], [], min(left, 1.0))
            if ready and not os.read(self.read_fd, 4096):
                break
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        said = _last_line(self.log_path)
        runtime, doing = self.runtime, self.doing
        if timed_out:
            raise RuntimeCrash(f"{runtime} gave no answer within {self.timeout:.0f} s {doing}", runtime)
        if os.WIFSIGNALED(status):
            raise RuntimeCrash(f"{runtime} crashed ({signal_name(os.WTERMSIG(status))}{': ' + said if said else ''}) "
                               f"{doing}", runtime)
        try:
            with open(self.result_path, "rb") as f:
                return pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError):
            raise RuntimeCrash(f"{runtime} ended without an answer (exit {os.WEXITSTATUS(status)}) {doing}",
                               runtime) from None


def _kill(pid: int) -> None:
    """SIGKILL to the child's process group (it and any child of its own), or to it alone if it
    has not made its group yet."""
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            kill(target, signal.SIGKILL)
            return
        except (ProcessLookupError, PermissionError):
            continue


def _cancel(call: dict) -> None:
    """Kill and reap a child still running, close its pipe, remove its folder (in the process
    that started it: a forked process exiting runs the finalizers it inherited, too)."""
    if call["owner"] != os.getpid():
        return
    if call["pid"]:
        _kill(call["pid"])
        try:
            os.waitpid(call["pid"], 0)
        except ChildProcessError:
            pass
        call["pid"] = 0
    if call["read_fd"] >= 0:
        os.close(call["read_fd"])
        call["read_fd"] = -1
    shutil.rmtree(call["tmp"], ignore_errors=True)
    interrupts.unregister_temp(call["tmp"])


def start_in_child(fn, *args, runtime: str, doing: str, timeout: float = TIMEOUT_S, **kwargs) -> ChildCall:
    """`call_in_child` started, not awaited: the caller works on while the child runs (compile
    checks the whole model while it partitions) and collects it with `.result()`."""
    call = ChildCall(runtime, doing, timeout)
    if not hasattr(os, "fork"):
        try:
            call.outcome = (True, fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - handed over as the child's would be
            call.outcome = (False, exc)
        return call
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        _run_child(fn, args, kwargs, read_fd, call.tmp, call.log_path, call.result_path)
    os.close(write_fd)
    call.pid, call.read_fd = pid, read_fd
    return call


def _run_child(fn, args, kwargs, read_fd: int, tmp: str, log_path: str, result_path: str) -> None:
    code = 1
    try:
        # its own process group, and its temporary files in its folder: a child killed while it
        # waits for one of its own (`_cancel`) takes that one along, and leaves nothing behind
        global _IN_CHILD
        if not _IN_CHILD:  # a child's own children stay in its group
            os.setpgid(0, 0)
            _IN_CHILD = True
        tempfile.tempdir = tmp
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


def _last_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            lines = [ln.strip() for ln in f.read()[-4096:].decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""

"""Ctrl-C and SIGTERM end a command within a second or two: one line, exit 130 (SIGINT) or 143
(SIGTERM), temporary files removed, earlier results left as they were.

Why a watcher thread: Python runs signal handlers only between bytecodes, so an interrupt that
arrives while CP-SAT or the C search runs would wait for them to return (CP-SAT even swallows
SIGINT unless `catch_sigint_signal` is off, which `tpu_pipeline.toolchain.cpsat` does). The C-level handler
still writes the signal number to the wakeup socket at once; the watcher reads it, stops every
registered CP-SAT search, and if the main thread has not unwound within `GRACE_S` (native code
that cannot be stopped), removes the registered temporaries itself and exits. A second interrupt
exits at once, also after cleanup. Outputs are swapped into place inside `critical()`, which the
hard exit waits for, so an interrupt never leaves half of a result folder.

Only the CLI process installs this (`install()`); library callers keep Python's defaults.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sys
import threading
import weakref

GRACE_S = 1.5

_temps: set[str] = set()
_solvers: "weakref.WeakSet" = weakref.WeakSet()
_swap_lock = threading.RLock()
_end_lock = threading.Lock()  # who ends the process: the main thread (`finished`) or the hard exit, never both
_state = {"installed": False, "finished": False, "pending": 0, "critical": 0, "hits": 0, "received": 0}


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread by SIGINT or SIGTERM; `exit_code` is 128 + the signal number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum


def register_temp(path: str | os.PathLike) -> None:
    """A file or folder to remove if the process is interrupted before `unregister_temp`."""
    _temps.add(os.fspath(path))


def unregister_temp(path: str | os.PathLike) -> None:
    _temps.discard(os.fspath(path))


def register_solver(solver) -> None:
    """A CP-SAT solver whose search an interrupt should stop (see tpu_pipeline.toolchain.cpsat)."""
    _solvers.add(solver)


@contextlib.contextmanager
def critical():
    """A region an interrupt must not cut in two (swapping a result into place). An interrupt
    arriving inside is raised when the region ends."""
    with _swap_lock:
        _state["critical"] += 1
        try:
            yield
        finally:
            _state["critical"] -= 1
    if _state["critical"] == 0 and _state["pending"]:
        signum, _state["pending"] = _state["pending"], 0
        raise Interrupted(signum)


def finished() -> None:
    """The main thread has handled the interrupt (or finished): the watcher must not exit for it.
    Where the hard exit has begun, this waits for it (the process ends there, with its one line)."""
    with _end_lock:
        _state["finished"] = True


def _remove_temps() -> None:
    for path in sorted(_temps, key=len, reverse=True):
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
    _temps.clear()


def _hard_exit(signum: int) -> None:
    # Wait for a swap in progress (it takes milliseconds), then leave without unwinding.
    swapping_done = _swap_lock.acquire(timeout=5.0)
    with _end_lock:  # (a main thread ending now as well would print its own `interrupted`)
        if _state["finished"]:
            if swapping_done:
                _swap_lock.release()
            return
        _remove_temps()
        os.write(2, b"interrupted\n")
        os._exit(128 + signum)


def _stop_searches() -> None:
    for solver in list(_solvers):
        with contextlib.suppress(Exception):
            solver.stop_search()


def _watch(sock: socket.socket) -> None:
    while True:
        try:
            data = sock.recv(64)
        except OSError:
            return
        for signum in data:
            if signum not in (signal.SIGINT, signal.SIGTERM):
                continue
            _state["hits"] += 1
            _stop_searches()
            if _state["hits"] >= 2:
                _hard_exit(signum)
            else:
                timer = threading.Timer(GRACE_S, _hard_exit, args=(signum,))
                timer.daemon = True
                timer.start()


def received() -> int:
    """The signal that interrupted this process (0: none). An `Interrupted` raised while a C
    extension imports (numpy's, say) can come out as that extension's ImportError instead, and
    one raised inside a `__del__` or a weakref callback (importlib's module-lock callback, say)
    is dropped by Python: the CLI checks this before it reports success."""
    return _state["received"]


def _unraisable(hook):
    """Python prints what a `__del__` or a weakref callback raises and carries on. An interrupt
    landing there is not a bug to print a traceback for: it stays in `received()`."""

    def quiet(unraisable) -> None:
        if not isinstance(unraisable.exc_value, Interrupted):
            hook(unraisable)

    return quiet


def _handler(signum, frame) -> None:
    _state["received"] = signum
    if _state["critical"]:
        _state["pending"] = signum
        return
    raise Interrupted(signum)


def install() -> None:
    """Route SIGINT and SIGTERM through `Interrupted` and start the watcher (main thread only)."""
    if _state["installed"] or threading.current_thread() is not threading.main_thread():
        return
    reader, writer = socket.socketpair()
    reader.setblocking(True)
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # as Python does: an ignored SIGINT stays ignored
            signal.signal(sig, _handler)
    sys.unraisablehook = _unraisable(sys.unraisablehook)
    threading.Thread(target=_watch, args=(reader,), name="interrupt-watcher", daemon=True).start()
    _state["installed"] = True
    _state["_sockets"] = (reader, writer)  # keep both ends open for the life of the process

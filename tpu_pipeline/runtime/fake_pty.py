"""A device faked on a pseudo-terminal: the host opens `port` as it would a real serial device.

Subclasses implement `_serve()`, which runs on a thread and reads/writes `self._master` until
`self._stop` is set. Used by the fake MCU harness and the fake USB power meter in tests.
"""

from __future__ import annotations

import os
import threading
import tty


class PtyDevice:
    def __init__(self, name: str):
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)
        tty.setraw(self._master)
        self.port = os.ttyname(self._slave)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def _serve(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        for fd in (self._master, self._slave):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

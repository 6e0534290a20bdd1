"""The compile result folder, written all at once.

Everything is written into a fresh hidden folder beside the target, then swapped in with one
rename (Linux's renameat2 RENAME_EXCHANGE when the target exists, so there is no moment without
a complete folder). Readers see either the old result or the new one, never a mix; files of an
earlier run that this run does not write (segments of another -n) go with the old folder. Two
compiles into one folder each swap in a complete result under a lock; the last one wins.

The target must be new, empty, or an earlier compile output (a report.json, and only files a
compile writes); it must not hold an input model. Anything else is refused before work starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tpu_pipeline.toolchain import interrupts
from tpu_pipeline.toolchain.errors import DeviceError, UsageError
from tpu_pipeline.toolchain.manifest import REPORT_NAME, Manifest
from tpu_pipeline.toolchain.tflite.io import check_output_folder

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_OUR_SUFFIXES = (".tflite", ".log", "_edgetpu_compiler.txt")


def check_result_folder(out: Path, inputs: list[Path]) -> None:
    """Refuse, before any work, a target we must not replace (exit 2): what every output folder
    refuses (`check_output_folder`), a link, or a folder holding files a compile did not write."""
    if out.is_symlink():
        raise UsageError(f"{out}: is a link; choose a new or empty folder for -o")
    check_output_folder(out, inputs)
    if out.is_dir():
        foreign = _foreign_entries(out)
        if foreign:
            raise UsageError(f"{out}: holds '{foreign[0]}', which tpu-pipeline did not write; choose a new or empty "
                             "folder for -o")


def _foreign_entries(folder: Path) -> list[str]:
    """Entries of `folder` that an earlier compile did not write (empty for an empty folder)."""
    names = sorted(p.name for p in folder.iterdir())
    if not names:
        return []
    if REPORT_NAME not in names:
        return names
    try:
        listed = set(json.loads((folder / REPORT_NAME).read_text()).get("files") or [])
    except (OSError, ValueError, AttributeError):
        return ["report.json"]
    return [n for n in names if n not in listed and not (n.endswith(_OUR_SUFFIXES) and (folder / n).is_file())]


class ResultFolder:
    """The hidden folder a compile fills before the swap. `write_soon` writes files there in a
    background thread (write and fsync wait on the disk, not the CPU), so the model files are on
    disk while the later passes run; `finish` writes the rest and swaps the folder in; `discard`
    (a failed compile) removes it. Created at the first write: a compile refused before then
    leaves nothing behind."""

    def __init__(self, out: Path, inputs: list[Path]):
        self.out, self.inputs = Path(out), list(inputs)
        self.tmp: Path | None = None
        self.made_parent = False
        self.written: dict[str, object] = {}  # name -> the bytes object written (or being written)
        self.pool = None
        self.pending = []  # the background writes' futures

    def _folder(self) -> Path:
        if self.tmp is None:
            try:
                self.made_parent = not self.out.parent.exists()
                self.out.parent.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.compile.", dir=self.out.parent))
                os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; the result is an ordinary folder
            except OSError as exc:
                raise DeviceError(f"{self.out}: cannot create the output folder ({exc.strerror})") from None
            interrupts.register_temp(tmp)
            self.tmp = tmp
        return self.tmp

    def write_soon(self, files: dict[str, object]) -> None:
        """Start writing the files of `files` not written yet (same name and same object); a
        file is its bytes or a tuple of pieces to write one after the other (`_write_file`)."""
        todo = {n: d for n, d in files.items() if self.written.get(n) is not d}
        if not todo:
            return
        folder = self._folder()
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compile-write")
        for name, data in todo.items():
            self.written[name] = data
            self.pending.append(self.pool.submit(_write_file, folder / name, data))

    def finish(self, files: dict[str, bytes], report: dict) -> Manifest:
        """Write what is left and report.json (through the typed manifest against the written
        files, so what `run` would refuse is never written), then swap the folder in."""
        out = self.out
        try:
            self.write_soon(files)
            for name in set(self.written) - set(files):  # written early, then dropped by a later pass
                (self._folder() / name).unlink(missing_ok=True)
            self._drain()
            tmp = self._folder()
            manifest = Manifest.from_json(report, tmp)
            (tmp / REPORT_NAME).write_text(manifest.dumps())
            with _locked(out.parent), interrupts.critical():
                check_result_folder(out, self.inputs)  # again: another process may have written meanwhile
                if not out.exists():
                    os.rename(tmp, out)
                else:
                    _exchange(tmp, out)  # tmp now holds the earlier result, removed below
            self.made_parent = False
        except OSError as exc:
            raise DeviceError(f"{out}: cannot write ({exc.strerror})") from None
        finally:
            self.discard()
        return manifest

    def _drain(self) -> None:
        pending, self.pending = self.pending, []
        for future in pending:
            future.result()  # a background write's OSError, raised here

    def discard(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            interrupts.unregister_temp(self.tmp)
            self.tmp = None
        if self.made_parent:
            with contextlib.suppress(OSError):
                self.out.parent.rmdir()
            self.made_parent = False


def _write_file(path: Path, data) -> None:
    """`data`: bytes, or a tuple of pieces (bytes-like) whose concatenation is the file, written
    one after the other (a segment's weights go from the model's arrays to the file, no join)."""
    with open(path, "wb") as fh:
        for piece in data if isinstance(data, tuple) else (data,):
            fh.write(piece)
        fh.flush()
        os.fsync(fh.fileno())


def write_result_folder(out: Path, files: dict[str, bytes], report: dict, inputs: list[Path]) -> Manifest:
    """Write `files` (name -> bytes) and `report` as report.json into the folder `out`, replacing
    an earlier result whole (`ResultFolder` in one go)."""
    return ResultFolder(out, inputs).finish(files, report)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _locked(folder: Path):
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> None:
    """Atomically swap two paths; where the kernel or file system cannot, two renames."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is not None and fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return
    code = ctypes.get_errno() if fn is not None else errno.ENOSYS
    if code not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        raise OSError(code, os.strerror(code))
    old = Path(tempfile.mkdtemp(prefix=f".{b.name}.old.", dir=b.parent))
    os.rmdir(old)
    os.rename(b, old)
    os.rename(a, b)
    os.rename(old, a)

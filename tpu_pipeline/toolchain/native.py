"""C sources compiled on first use and cached: the hot loops of the exact searches.

A source (a .c file inside the package) is compiled with the system C compiler (`cc`, or $CC)
into a per-user cache directory ($TPU_PIPELINE_CACHE, else $XDG_CACHE_HOME/tpu-pipeline, else
~/.cache/tpu-pipeline), keyed by a hash of the source. Without a compiler, or with
TPU_PIPELINE_NO_NATIVE=1, `load_library` returns None and callers run their Python version of
the same algorithm.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

_loaded: dict[Path, ctypes.CDLL | None] = {}


def _cache_dir() -> Path:
    base = os.environ.get("TPU_PIPELINE_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "tpu-pipeline" if xdg else Path.home() / ".cache" / "tpu-pipeline"


def _compile(source: Path, target: Path) -> bool:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", tmp, str(source)],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            return False
        os.replace(tmp, target)  # atomic: concurrent first uses never see a partial library
        return True
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_library(source: Path) -> ctypes.CDLL | None:
    """The compiled `source`, or None when it cannot be built here (or TPU_PIPELINE_NO_NATIVE=1).
    The caller sets the argument types once; later calls return the same object."""
    if source in _loaded:
        return _loaded[source]
    lib = None
    if os.environ.get("TPU_PIPELINE_NO_NATIVE") != "1":
        try:
            digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
            target = _cache_dir() / f"{source.stem.lstrip('_')}_{digest}.so"
            if target.exists() or _compile(source, target):
                lib = ctypes.CDLL(str(target))
        except OSError:
            lib = None
    _loaded[source] = lib
    return lib

"""The TFLite Micro static library, built once per (tree content, compiler, flags) and cached.

    tree = find_tree(CMSIS_NN)                   # TFLM_TREE, else shared/tflm/<kernel set> near the checkout
    lib = ensure_library(tree, CMSIS_NN, "cortex-m4+fp")  # built on first use (~13 CPU-minutes), then cached

The cache lives in `${XDG_CACHE_HOME:-~/.cache}/tpu-pipeline/tflm/<key>/`: `libtflm.a`, the
object files (kept, so an interrupted build resumes where it stopped), the generated makefile
and a lock. The archive is written under a temporary name and renamed, and builds of one key
take a file lock, so two builds at once never leave a half-written library.

`python -m tpu_pipeline.toolchain.firmware.library --kernels K --cpu C` prints "TREE LIB" (what a project
Makefile needs) after making sure the library exists; progress goes to stderr.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tpu_pipeline.toolchain.device import CPU_FLAGS, DEFAULT_CPU, KERNEL_SET_NAMES, KernelSet, check_cpu, kernel_set
from tpu_pipeline.toolchain.errors import DeviceError, UsageError

BUILDER_VERSION = "2"  # bump when the way the library is compiled changes

# As checked in shared/tflm/README.md, plus per-function sections so the linker drops unused kernels.
COMMON_FLAGS = ("-O2", "-DTF_LITE_STATIC_MEMORY", "-ffunction-sections", "-fdata-sections", "-fno-common")
CXX_FLAGS = ("-std=c++17", "-fno-rtti", "-fno-exceptions", "-fno-threadsafe-statics", "-fno-use-cxa-atexit")
C_FLAGS = ("-std=gnu11",)
INCLUDE_DIRS = (".", "third_party/flatbuffers/include", "third_party/gemmlowp", "third_party/kissfft",
                "third_party/ruy", "third_party/cmsis_nn", "third_party/cmsis_nn/Include",
                "third_party/cmsis/CMSIS/Core/Include")
# Left out: device-specific sources (the board layer provides startup, clocks and the tick counter)
# and the audio front-end's signal/ custom kernels, which the harness's op resolver never registers.
_EXCLUDE_PREFIXES = ("third_party/cmsis/Cortex_DFP/", "tensorflow/lite/micro/cortex_m_generic/micro_time.cc",
                     "signal/", "third_party/kissfft/")

HOW_TO_GENERATE = ("generate one from a tflite-micro checkout with "
                   "tensorflow/lite/micro/tools/project_generation/create_tflm_tree.py "
                   "--makefile_options=\"TARGET=cortex_m_generic TARGET_ARCH=cortex-m4+fp "
                   "OPTIMIZED_KERNEL_DIR=cmsis_nn\" shared/tflm/cmsis-nn (without OPTIMIZED_KERNEL_DIR "
                   "for shared/tflm/reference), or set TFLM_TREE / --tflm-tree")


@dataclass(frozen=True)
class Library:
    tree: Path
    kernels: KernelSet
    cpu: str
    key: str
    path: Path  # libtflm.a

    @property
    def include_flags(self) -> list[str]:
        return [f"-I{self.tree / d}" for d in INCLUDE_DIRS]

    @property
    def defines(self) -> list[str]:
        return list(self.kernels.defines)


def _looks_like_tree(p: Path) -> bool:
    return (p / "tensorflow" / "lite" / "micro" / "micro_interpreter.h").is_file()


def find_tree(kernels: KernelSet, explicit: str | os.PathLike | None = None, start: Path | None = None) -> Path:
    """The TFLM source tree: `explicit`, else $TFLM_TREE, else shared/tflm/<kernels> found by
    walking up from the current folder and from this package. UsageError (exit 2) if none."""
    given = explicit or os.environ.get("TFLM_TREE")
    if given:
        p = Path(given).expanduser()
        if not _looks_like_tree(p):
            raise UsageError(f"{p}: not a TFLite Micro source tree (no tensorflow/lite/micro/micro_interpreter.h); "
                             + HOW_TO_GENERATE)
        return p.resolve()
    starts = [Path(start or Path.cwd()).resolve(), Path(__file__).resolve().parent]
    for s in starts:
        for d in (s, *s.parents):
            cand = d / "shared" / "tflm" / kernels.name
            if _looks_like_tree(cand):
                return cand
    raise UsageError(f"no TFLite Micro source tree found (looked for shared/tflm/{kernels.name} above "
                     f"{starts[0]} and the installed package); " + HOW_TO_GENERATE)


def sources(tree: Path) -> list[str]:
    out = []
    for root, dirs, files in os.walk(tree):
        dirs.sort()
        rel_root = os.path.relpath(root, tree)
        for f in sorted(files):
            if not f.endswith((".cc", ".c", ".cpp")):
                continue
            rel = f if rel_root == "." else f"{rel_root}/{f}"
            if rel.startswith(_EXCLUDE_PREFIXES) or "/test" in rel or rel.endswith("_test.cc"):
                continue
            out.append(rel)
    return out


def tree_hash(tree: Path) -> str:
    """SHA-256 over every file's relative path and content (what the library is built from)."""
    h = hashlib.sha256()
    for root, dirs, files in os.walk(tree):
        dirs.sort()
        for f in sorted(files):
            p = Path(root) / f
            h.update(os.path.relpath(p, tree).encode() + b"\0")
            h.update(p.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


def tool(name: str) -> str:
    """Path of an ARM toolchain program, or DeviceError saying how to install it."""
    found = shutil.which(name)
    if not found:
        raise DeviceError(f"{name} not found: install the ARM toolchain (Debian/Ubuntu: apt-get install "
                          "gcc-arm-none-eabi libnewlib-arm-none-eabi libstdc++-arm-none-eabi-newlib)")
    return found


def compiler_version(cxx: str = "arm-none-eabi-g++") -> str:
    out = subprocess.run([tool(cxx), "--version"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()[0].strip() if out else "unknown"


def library_flags(kernels: KernelSet, cpu: str) -> list[str]:
    return [*CPU_FLAGS[check_cpu(cpu)], *COMMON_FLAGS, *kernels.defines]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tpu-pipeline" / "tflm"


def library_key(tree: Path, kernels: KernelSet, cpu: str) -> str:
    h = hashlib.sha256()
    for part in (BUILDER_VERSION, tree_hash(tree), compiler_version(), " ".join(library_flags(kernels, cpu)),
                 " ".join(CXX_FLAGS), " ".join(C_FLAGS), " ".join(INCLUDE_DIRS)):
        h.update(part.encode() + b"\n")
    return f"{kernels.name}-{cpu}-{h.hexdigest()[:16]}"


def _makefile(tree: Path, srcs: list[str], flags: list[str]) -> str:
    inc = " ".join(f"-I$(TREE)/{d}" for d in INCLUDE_DIRS)
    objs = " \\\n  ".join(f"obj/{s}.o" for s in srcs)
    return f"""# Generated by tpu_pipeline/toolchain/firmware/library.py: the TFLite Micro library for one key.
TREE := {tree}
CXX := arm-none-eabi-g++
CC := arm-none-eabi-gcc
AR := arm-none-eabi-ar
FLAGS := {' '.join(flags)} {inc}
CXXFLAGS := $(FLAGS) {' '.join(CXX_FLAGS)}
CFLAGS := $(FLAGS) {' '.join(C_FLAGS)}
OBJS := {objs}

libtflm.a: $(OBJS)
\t@rm -f libtflm.a.tmp
\t@$(AR) rcs libtflm.a.tmp $(OBJS)
\t@mv -f libtflm.a.tmp libtflm.a

obj/%.cc.o: $(TREE)/%.cc
\t@mkdir -p $(dir $@)
\t@echo "CXX $*.cc"
\t@$(CXX) $(CXXFLAGS) -c $< -o $@.tmp && mv -f $@.tmp $@

obj/%.cpp.o: $(TREE)/%.cpp
\t@mkdir -p $(dir $@)
\t@echo "CXX $*.cpp"
\t@$(CXX) $(CXXFLAGS) -c $< -o $@.tmp && mv -f $@.tmp $@

obj/%.c.o: $(TREE)/%.c
\t@mkdir -p $(dir $@)
\t@echo "CC $*.c"
\t@$(CC) $(CFLAGS) -c $< -o $@.tmp && mv -f $@.tmp $@
"""


def _stop_group(proc) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class LibraryBusy(DeviceError):
    """Another process is building this library now (raised only when asked not to wait)."""


def _lock(path: Path, wait: bool = True):
    import fcntl

    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        f.close()
        raise LibraryBusy(f"{path.parent}: another process is building this TFLite Micro library now") from None
    return f


def ensure_library(tree: Path, kernels: KernelSet, cpu: str = DEFAULT_CPU, jobs: int | None = None,
                   progress=None, quiet: bool = False, wait: bool = True) -> Library:
    """The cached library for (tree, kernels, cpu), built now if missing. `progress(done, total)`
    is called per compiled file; without it (and unless `quiet`) progress lines go to stderr.
    `wait=False`: LibraryBusy instead of waiting while another process builds it."""
    check_cpu(cpu)
    for t in ("arm-none-eabi-g++", "arm-none-eabi-gcc", "arm-none-eabi-ar"):
        tool(t)
    tree = Path(tree).resolve()
    key = library_key(tree, kernels, cpu)
    d = cache_root() / key
    lib = d / "libtflm.a"
    result = Library(tree, kernels, cpu, key, lib)
    if lib.is_file():
        return result
    d.mkdir(parents=True, exist_ok=True)
    with _lock(d / "lock", wait):
        if lib.is_file():  # another process finished it while we waited
            return result
        srcs = sources(tree)
        (d / "lib.mk.tmp").write_text(_makefile(tree, srcs, library_flags(kernels, cpu)))
        os.replace(d / "lib.mk.tmp", d / "lib.mk")
        done_before = sum(1 for s in srcs if (d / "obj" / f"{s}.o").is_file())
        total = len(srcs)
        jobs = jobs or os.cpu_count() or 1
        if not quiet and progress is None:
            print(f"building TFLite Micro ({kernels}, {cpu}) once into {d} with make -j{jobs}: "
                  f"{total - done_before} of {total} files to compile (cached afterwards)", file=sys.stderr)
        cmd = ["make", "-f", "lib.mk", f"-j{jobs}", "libtflm.a"]
        t0 = time.monotonic()
        # Own process group: an interrupted build stops every compiler it started (objects already
        # written stay, so the next call resumes).
        proc = subprocess.Popen(cmd, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        done, tail, said = done_before, [], t0
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                line = line.rstrip("\n")
                if line.startswith(("CXX ", "CC ")):
                    done += 1
                    if progress:
                        progress(done, total)
                    elif not quiet and (done % 10 == 0 or done == total or time.monotonic() - said >= 5):
                        said = time.monotonic()  # a line at least every 5 s: a log shows the build is alive
                        print(f"  [{done}/{total}] {said - t0:.0f} s  {line.split(' ', 1)[1]}",
                              file=sys.stderr, flush=True)
                else:
                    tail.append(line)
                    tail = tail[-20:]
            rc = proc.wait()
        except BaseException:
            _stop_group(proc)
            raise
        if rc != 0 or not lib.is_file():
            first = next((t for t in tail if "error" in t), tail[-1] if tail else "no output")
            raise DeviceError(f"{tree}: building the TFLite Micro library failed ({first.strip()[:200]}); "
                              f"log: make -C {d} -f lib.mk")
        if not quiet and progress is None:
            print(f"TFLite Micro library ready: {lib} ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    return result


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m tpu_pipeline.toolchain.firmware.library",
                                description="print 'TREE LIB' of the cached TFLite Micro library, building it if needed")
    p.add_argument("--kernels", default=None, choices=KERNEL_SET_NAMES, help="default: the default kernel set")
    p.add_argument("--cpu", default=DEFAULT_CPU, choices=tuple(CPU_FLAGS))
    p.add_argument("--tflm-tree", default=None)
    p.add_argument("--jobs", "-j", type=int, default=None)
    args = p.parse_args(argv)
    try:
        kernels = kernel_set(args.kernels)
        tree = find_tree(kernels, args.tflm_tree)
        lib = ensure_library(tree, kernels, args.cpu, args.jobs)
    except (UsageError, DeviceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"{lib.tree} {lib.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

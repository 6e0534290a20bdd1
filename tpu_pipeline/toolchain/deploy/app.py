"""A plain application built on `export-mcu --library` output: its own `main`, no harness protocol.

    write_app(app_dir, "lib", device, inputs)   # inputs[model][inference][input] = bytes
    elf = build_app(app_dir, device, CMSIS_NN)  # cmake + make, arm-none-eabi

It is what a user's firmware does with a library: each model's `tpup_<name>_init` on an arena
sized by its macro, or `tpup_shared_init` on one arena for all (after one 16 bytes too small and
one misaligned, which must be refused: `INIT what rc used head tail small misaligned`), then per
inference every model in turn: inputs copied in, `invoke`, every output printed over the board's
UART as hex lines (`OUT model inference output offset HEX`); then `END`. The board layer (startup,
UART, linker script) is the harness's (`firmware/project.py`); the library is built through its
own CMakeLists.txt.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from tpu_pipeline.toolchain.data import HARNESS_DIR
from tpu_pipeline.toolchain.device import Device, KernelSet, require_firmware
from tpu_pipeline.toolchain.errors import DeviceError, InfeasibleError, UsageError

MARKER = "tpup_library.json"
_OVERFLOW = re.compile(r"region [`']([A-Za-z0-9_]+)' overflowed by (\d+) bytes")


def read_library(library) -> dict:
    """The library's tpup_library.json (what export-mcu --library wrote)."""
    try:
        meta = json.loads((Path(library) / MARKER).read_text())
        meta["models"][0]["name"], meta["target"]
        return meta
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        raise UsageError(f"{library}: not a library written by export-mcu --library (no readable {MARKER})") from None


def write_app(app_dir: str | Path, library, device: Device, inputs, banks: tuple[str, str] | None = None) -> Path:
    """The application project in `app_dir` on the library folder `library` (one model or several
    on one shared arena): main.cc, app_inputs.h, the board layer, CMake files. `banks`: (head bank,
    tail bank) of a one-model library, whose arena is then two buffers in those banks' linker
    sections, initialised with `tpup_<name>_init_split` (deploy/banks.py chooses them)."""
    from tpu_pipeline.toolchain.firmware.project import project_files

    app = Path(app_dir)
    app.mkdir(parents=True, exist_ok=True)
    meta = read_library(library)
    names = [m["name"] for m in meta["models"]]
    shared = meta.get("shared") is not None
    files = {k: v for k, v in project_files(device).items() if k != "Makefile"}
    files["harness_platform.h"] = (HARNESS_DIR / "harness_platform.h").read_bytes()
    files["app_inputs.h"] = _inputs_header(names, inputs).encode()
    files["main.cc"] = _main(names, device.link.baud, shared, _split_arena(names, device, banks)).encode()
    files["CMakeLists.txt"] = _cmake(meta["target"], Path(library).resolve()).encode()
    files["arm-none-eabi.cmake"] = _toolchain(device).encode()
    for name, content in files.items():
        (app / name).write_bytes(content)
    return app


def _inputs_header(names, inputs) -> str:
    lines = ["#pragma once", "// The inputs the host draws (the same bytes run in TFLite Micro on the host).", ""]
    for name, per_model in zip(names, inputs):
        lines.append(f"constexpr int k_{name}_inferences = {len(per_model)};")
        refs = []
        for k, arrays in enumerate(per_model):
            row = []
            for i, data in enumerate(arrays):
                body = ",".join(str(b) for b in data)
                lines.append(f"alignas(16) static const unsigned char {name}_in_{k}_{i}[] = {{{body}}};")
                row.append(f"{{{name}_in_{k}_{i}, sizeof {name}_in_{k}_{i}}}")
            refs.append("{" + ", ".join(row) + "}")
        lines.append(f"static const AppInput {name}_inputs[][TPUP_{name.upper()}_NUM_INPUTS] = {{{', '.join(refs)}}};")
    return "\n".join(lines) + "\n"


def _split_arena(names, device: Device, banks) -> tuple[str, str] | None:
    """(arena declarations, init call) of one model's head and tail in two banks; None: one arena."""
    if banks is None:
        return None
    known = {b.name: b for b in device.memory.banks}
    if len(names) != 1 or any(b not in known for b in banks):
        raise UsageError(f"head and tail banks {banks}: one model, banks of {device.name} "
                         f"({', '.join(known)})")
    n, u = names[0], names[0].upper()
    first = device.memory.banks[0].name

    def where(bank: str) -> str:  # the first bank is the firmware's RAM: plain .bss
        return "" if bank == first else f' __attribute__((section(".bank_{bank}")))'
    decls = (f"alignas(16) uint8_t g_head_{n}[TPUP_{u}_HEAD_ARENA_BYTES + 16]{where(banks[0])};\n"
             f"alignas(16) uint8_t g_tail_{n}[TPUP_{u}_TAIL_ARENA_BYTES + 16]{where(banks[1])};")
    call = (f'  init_split("{n}", g_head_{n}, TPUP_{u}_HEAD_ARENA_BYTES, g_tail_{n}, TPUP_{u}_TAIL_ARENA_BYTES,\n'
            f"             tpup_{n}_init_split, tpup_{n}_arena_used_bytes, tpup_{n}_head_used_bytes, "
            f"tpup_{n}_tail_used_bytes);")
    return decls, call


def _main(names, baud: int, shared: bool, split=None) -> str:
    """Inference k runs every model in turn (A, B, A, B, ...: a shared head is overwritten each time)."""
    includes = "\n".join(f'#include "tpup_{n}.h"' for n in names) + ('\n#include "tpup_shared.h"' if shared else "")
    if split is not None:
        arenas, inits = split
    elif shared:
        arenas = "alignas(16) uint8_t g_arena[TPUP_SHARED_ARENA_BYTES + 16];"
        inits = ('  init("shared", g_arena, TPUP_SHARED_ARENA_BYTES, tpup_shared_init, tpup_shared_arena_used_bytes,\n'
                 "       tpup_shared_head_used_bytes, tpup_shared_tail_used_bytes);")
    else:
        arenas = "\n".join(f"alignas(16) uint8_t g_arena_{n}[TPUP_{n.upper()}_ARENA_BYTES + 16];" for n in names)
        inits = "\n".join(f'  init("{n}", g_arena_{n}, TPUP_{n.upper()}_ARENA_BYTES, tpup_{n}_init, '
                          f"tpup_{n}_arena_used_bytes,\n       tpup_{n}_head_used_bytes, tpup_{n}_tail_used_bytes);"
                          for n in names)
    runs = "\n".join(f'    if (k < k_{n}_inferences) run("{n}", k, tpup_{n}_input, tpup_{n}_output, tpup_{n}_invoke, '
                     f"&{n}_inputs[k][0],\n        TPUP_{n.upper()}_NUM_INPUTS, TPUP_{n.upper()}_NUM_OUTPUTS);"
                     for n in names)
    most = " > ".join(f"k_{n}_inferences" for n in names[:1])  # every model gets the same count
    return _fill_main(includes, arenas, inits, runs, most, baud)


# The plain app's init of a model's head and tail in two buffers (two banks): `BANKS what head tail`
# says where they are (C++, spliced into main.cc).
_INIT_SPLIT = r"""using Split = int (*)(void*, size_t, void*, size_t);

// head and tail in two buffers (two banks): `BANKS what head_address tail_address` says where they are
void init_split(const char* what, uint8_t* head, size_t head_bytes, uint8_t* tail, size_t tail_bytes, Split fn,
                Size used, Size head_used, Size tail_used) {
  char line[200];
  int small = fn(head, head_bytes - 16, tail, tail_bytes);       // must be refused: TPUP_ERR_ARENA_SIZE
  int misaligned = fn(head, head_bytes, tail + 8, tail_bytes);   // must be refused: TPUP_ERR_ARENA_ALIGN
  int rc = fn(head, head_bytes, tail, tail_bytes);
  snprintf(line, sizeof line, "INIT %s %d %u %u %u %d %d\n", what, rc, static_cast<unsigned>(used()),
           static_cast<unsigned>(head_used()), static_cast<unsigned>(tail_used()), small, misaligned);
  say(line);
  snprintf(line, sizeof line, "BANKS %s %08X %08X\n", what, static_cast<unsigned>(reinterpret_cast<uintptr_t>(head)),
           static_cast<unsigned>(reinterpret_cast<uintptr_t>(tail)));
  say(line);
  g_ok = g_ok && rc == TPUP_OK;
}
"""


def _fill_main(includes: str, arenas: str, inits: str, runs: str, most: str, baud: int) -> str:
    return f"""// A plain application on tpu-pipeline's model libraries (generated by toolchain/deploy/app.py):
// no harness protocol; results go out over the UART as text lines.
#include <cstdio>
#include <cstring>

#include "harness_platform.h"
{includes}

struct AppInput {{ const unsigned char* data; size_t bytes; }};
#include "app_inputs.h"

namespace {{
{arenas}
bool g_ok = true;

void say(const char* s) {{ harness_platform_write(s, strlen(s)); }}

void print_tensor(const char* model, int k, int j, const tpup_tensor& t) {{
  char line[320];
  const unsigned char* p = static_cast<const unsigned char*>(t.data);
  for (size_t off = 0; off < t.bytes; off += 128) {{
    size_t n = t.bytes - off < 128 ? t.bytes - off : 128;
    int w = snprintf(line, sizeof line, "OUT %s %d %d %d ", model, k, j, static_cast<int>(off));
    for (size_t i = 0; i < n; ++i) w += snprintf(line + w, sizeof line - w, "%02X", p[off + i]);
    snprintf(line + w, sizeof line - w, "\\n");
    say(line);
  }}
}}

using Size = size_t (*)(void);
using Tensor = int (*)(int, tpup_tensor*);

void init(const char* what, uint8_t* arena, size_t bytes, int (*fn)(void*, size_t), Size used, Size head, Size tail) {{
  char line[160];
  int small = fn(arena, bytes - 16);      // must be refused: TPUP_ERR_ARENA_SIZE
  int misaligned = fn(arena + 8, bytes);  // must be refused: TPUP_ERR_ARENA_ALIGN
  int rc = fn(arena, bytes);
  snprintf(line, sizeof line, "INIT %s %d %u %u %u %d %d\\n", what, rc, static_cast<unsigned>(used()),
           static_cast<unsigned>(head()), static_cast<unsigned>(tail()), small, misaligned);
  say(line);
  g_ok = g_ok && rc == TPUP_OK;
}}

{_INIT_SPLIT}void run(const char* model, int k, Tensor input, Tensor output, int (*invoke)(void), const AppInput* in, int n_in,
         int n_out) {{
  for (int i = 0; i < n_in; ++i) {{
    tpup_tensor t;
    if (input(i, &t) != TPUP_OK || t.bytes != in[i].bytes) {{ say("ERR input size\\n"); return; }}
    memcpy(t.data, in[i].data, t.bytes);
  }}
  if (invoke() != TPUP_OK) {{ say("ERR invoke\\n"); return; }}
  for (int j = 0; j < n_out; ++j) {{
    tpup_tensor t;
    if (output(j, &t) == TPUP_OK) print_tensor(model, k, j, t);
  }}
}}
}}  // namespace

int main() {{
  harness_platform_init({baud});
  say("APP tpup-library-app\\n");
{inits}
  for (int k = 0; g_ok && k < {most}; ++k) {{
{runs}
  }}
  say("END\\n");
  for (;;) {{
  }}
}}
"""


def _cmake(target: str, library: Path) -> str:
    return f"""# A plain application on tpu-pipeline's model libraries (toolchain/deploy/app.py).
cmake_minimum_required(VERSION 3.13)
project(tpup_app C CXX)
set(TFLM_LIB "" CACHE FILEPATH "libtflm.a built for this board's CPU and the kernels of TPUP_KERNELS")
add_subdirectory("{library}" library)
add_executable(app.elf main.cc platform.cc board_uart.cc startup.c)
target_include_directories(app.elf PRIVATE ${{CMAKE_CURRENT_LIST_DIR}})
target_compile_features(app.elf PRIVATE cxx_std_17)
target_link_libraries(app.elf PRIVATE {target} -Wl,--start-group ${{TFLM_LIB}} m c -Wl,--end-group)
target_link_options(app.elf PRIVATE -T${{CMAKE_CURRENT_LIST_DIR}}/link.ld -Wl,--gc-sections
  -Wl,-Map=${{CMAKE_BINARY_DIR}}/app.map --specs=nano.specs --specs=nosys.specs)
"""


def _toolchain(device: Device) -> str:
    flags = " ".join(require_firmware(device).cpu_flags)
    common = f"{flags} -O2 -ffunction-sections -fdata-sections -fno-common"
    return f"""# arm-none-eabi for {device.name} (the harness firmware's flags)
set(CMAKE_SYSTEM_NAME Generic)
set(CMAKE_SYSTEM_PROCESSOR arm)
set(CMAKE_C_COMPILER arm-none-eabi-gcc)
set(CMAKE_CXX_COMPILER arm-none-eabi-g++)
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
set(CMAKE_C_FLAGS_INIT "{common} -std=gnu11")
set(CMAKE_CXX_FLAGS_INIT "{common} -fno-rtti -fno-exceptions -fno-threadsafe-statics -fno-use-cxa-atexit")
set(CMAKE_EXE_LINKER_FLAGS_INIT "{flags}")
"""


def build_app(app_dir: str | Path, device: Device, kernels: KernelSet, tflm_tree: str | None = None,
              quiet: bool = True) -> Path:
    """Configure and build the application with CMake against the cached TFLite Micro library."""
    from tpu_pipeline.toolchain.firmware.library import ensure_library, find_tree, tool

    app = Path(app_dir)
    tree = find_tree(kernels, tflm_tree)
    lib = ensure_library(tree, kernels, require_firmware(device).library_cpu, quiet=quiet)
    tool("arm-none-eabi-g++")
    if shutil.which("cmake") is None:
        raise DeviceError("cmake not found: the library's CMakeLists.txt needs it (apt-get install cmake)")
    build = app / f"build-{kernels.name}"
    steps = [["cmake", "-S", str(app), "-B", str(build), f"-DCMAKE_TOOLCHAIN_FILE={app / 'arm-none-eabi.cmake'}",
              "-DCMAKE_BUILD_TYPE=", f"-DTFLM_TREE={tree}", f"-DTPUP_KERNELS={kernels.name}", f"-DTFLM_LIB={lib.path}"],
             ["cmake", "--build", str(build), "-j2"]]
    for cmd in steps:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            text = out.stdout + "\n" + out.stderr
            m = _OVERFLOW.search(text)
            if m:
                raise InfeasibleError(f"{app}: the application does not fit {device.name}: region `{m.group(1)}' "
                                      f"overflowed by {int(m.group(2)):,} bytes")
            errors = [ln.strip() for ln in text.splitlines() if "error" in ln.lower()]
            raise DeviceError(f"{app}: the application build failed: {(errors or [text.strip()[-240:]])[0][:240]}")
    return build / "app.elf"

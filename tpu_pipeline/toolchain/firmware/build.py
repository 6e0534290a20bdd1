"""Build an exported firmware project and size it with the real linker's figures.

    b = build_firmware("out/fw", REFERENCE)   # make -C out/fw KERNELS=reference
    b.flash_bytes, b.ram_bytes, b.elf

Whether a model fits is the linker's decision: ld's "region `RAM' overflowed by N bytes" ends in
InfeasibleError (exit 3) naming the region. Flash and RAM come from the ELF's sections (as
`arm-none-eabi-size -A` lists them) placed in the regions of the map file's memory configuration.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from tpu_pipeline.toolchain.device import BoardFirmware, KernelSet
from tpu_pipeline.toolchain.errors import DeviceError, InfeasibleError, UsageError
from tpu_pipeline.toolchain.firmware.library import ensure_library, find_tree, tool

_OVERFLOW = re.compile(r"region [`']([A-Za-z0-9_]+)' overflowed by (\d+) bytes")
_REGION = re.compile(r"^(\S+)\s+0x([0-9a-fA-F]+)\s+0x([0-9a-fA-F]+)")


@dataclass(frozen=True)
class FirmwareBuild:
    project: str
    board: str
    kernels: str  # the kernel set's name
    elf: str
    map_file: str
    flash_bytes: int  # code + constants + .data's initial values
    ram_bytes: int  # .data + .bss (the arena included) + heap and stack reservations
    regions: dict  # name -> {"origin", "length", "used"}
    arena_size: int  # HARNESS_ARENA_SIZE compiled in
    library: str
    tree: str

    def to_json(self) -> dict:
        return {**asdict(self), "banks": self.banks}

    @property
    def banks(self) -> list[dict]:
        """The bytes linked into each RAM bank: "RAM" (the descriptor's first bank: data, bss with
        the arena, heap, stack) and every other bank by its name (its .bank_<name> section)."""
        return [{"name": n.removeprefix("BANK_"), "origin": r["origin"], "length": r["length"], "bytes_used": r["used"]}
                for n, r in self.regions.items() if n == "RAM" or n.startswith("BANK_")]


def read_export(project: Path) -> dict:
    p = project / "export.json"
    try:
        meta = json.loads(p.read_text())
    except FileNotFoundError:
        raise UsageError(f"{project}: no export.json (write the project with `tpu-pipeline export-mcu`)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{p}: unreadable ({exc})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("firmware"), dict):
        raise UsageError(f"{p}: the project has no board layer (export it for a board with a [firmware] section)")
    return meta


def memory_regions(map_text: str) -> dict[str, tuple[int, int]]:
    """name -> (origin, length) from a GNU ld map file's "Memory Configuration" table."""
    out: dict[str, tuple[int, int]] = {}
    started = False
    for line in map_text.splitlines():
        if line.startswith("Memory Configuration"):
            started = True
            continue
        if started:
            if line.startswith("Linker script and memory map"):
                break
            m = _REGION.match(line)
            if m and m.group(1) not in ("Name", "*default*"):
                out[m.group(1)] = (int(m.group(2), 16), int(m.group(3), 16))
    return out


def section_sizes(elf: Path) -> list[tuple[str, int, int]]:
    """(name, size, address) of every section, from `arm-none-eabi-size -A`."""
    out = subprocess.run([tool("arm-none-eabi-size"), "-A", str(elf)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise DeviceError(f"{elf}: arm-none-eabi-size failed ({out.stderr.strip()[:200]})")
    rows = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            rows.append((parts[0], int(parts[1]), int(parts[2])))
    return rows


def usage(elf: Path, map_file: Path) -> tuple[int, int, dict]:
    regions = memory_regions(map_file.read_text(errors="replace"))
    flash = regions.get("FLASH")
    ram = regions.get("RAM")
    if flash is None or ram is None:
        raise DeviceError(f"{map_file}: no FLASH/RAM regions in the memory configuration")
    used = {name: 0 for name in regions}
    flash_b = ram_b = 0
    for name, size, addr in section_sizes(elf):
        if size == 0 or addr == 0 and name.startswith((".comment", ".debug", ".ARM.attributes")):
            continue
        if flash[0] <= addr < flash[0] + flash[1]:
            flash_b += size
            used["FLASH"] += size
        elif ram[0] <= addr < ram[0] + ram[1]:
            ram_b += size
            used["RAM"] += size
            if name == ".data":  # its initial values are stored in flash too
                flash_b += size
                used["FLASH"] += size
        else:  # another RAM bank's region (project.py: BANK_<name>, a buffer put in .bank_<name>)
            for region, (o, ln) in regions.items():
                if region.startswith("BANK_") and o <= addr < o + ln:
                    used[region] += size
    info = {n: {"origin": o, "length": ln, "used": used.get(n, 0)} for n, (o, ln) in regions.items()}
    return flash_b, ram_b, info


def build_firmware(project: str | Path, kernels: KernelSet, tflm_tree: str | None = None,
                   arena_size: int | None = None, jobs: int | None = None, quiet: bool = False,
                   wait: bool = True) -> FirmwareBuild:
    """Build DIR's firmware with `make` against the cached TFLite Micro library (`wait=False`:
    library.LibraryBusy rather than waiting for another process's library build)."""
    project = Path(project)
    meta = read_export(project)
    split = meta.get("arena_banks") or {}
    if arena_size is not None and split.get("head") != split.get("tail"):  # main.cc: two buffers, sized apart
        raise UsageError(f"{project}: the arena's head and tail are in banks '{split['head']}' and "
                         f"'{split['tail']}' (export.json arena_banks); --arena-size sets a one-buffer arena")
    fw = BoardFirmware.from_json(meta["firmware"])  # the board the project was exported for
    tree = find_tree(kernels, tflm_tree)
    lib = ensure_library(tree, kernels, fw.library_cpu, jobs, quiet=quiet, wait=wait)
    tool("arm-none-eabi-g++")
    # PYTHON: this interpreter, not the one the Makefile names; a cached project (runtime's QEMU
    # backend) outlives the checkout and venv that exported it
    cmd = ["make", "-C", str(project), f"KERNELS={kernels.name}", f"LIB_CPU={fw.library_cpu}", f"TFLM_TREE={tree}",
           f"PYTHON={sys.executable}", f"-j{jobs or 2}"]
    if arena_size is not None:
        if arena_size <= 0:
            raise UsageError(f"arena size must be > 0, got {arena_size}")
        cmd.append(f"ARENA_SIZE={int(arena_size)}")
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    text = out.stdout + "\n" + out.stderr
    if out.returncode != 0:
        m = _OVERFLOW.search(text)
        if m:
            region, n = m.group(1), int(m.group(2))
            what = "the model and code" if region == "FLASH" else "the arena, stack and data"
            raise InfeasibleError(f"{project}: the firmware does not fit {fw.board}: region `{region}' "
                                  f"overflowed by {n:,} bytes ({what}; the linker's verdict)")
        errors = [ln.strip() for ln in text.splitlines() if "error" in ln.lower()]
        first = errors[0] if errors else (text.strip().splitlines() or ["no output"])[-1]
        raise DeviceError(f"{project}: the firmware build failed: {first[:240]}")
    elf = project / "build" / kernels.name / "firmware.elf"
    map_file = project / "build" / kernels.name / "firmware.map"
    flash_b, ram_b, regions = usage(elf, map_file)
    return FirmwareBuild(str(project), fw.board, kernels.name, str(elf), str(map_file), flash_b, ram_b, regions,
                         int(arena_size or meta.get("arena_size", 0)), str(lib.path), str(tree))

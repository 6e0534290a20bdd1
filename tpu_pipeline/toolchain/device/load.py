"""Device descriptors: `devices/<name>.toml`, validated on load, units in the key names.

    load_device("coral-usb")            # a name in devices/
    load_device("path/to/board.toml")   # or a path

Edge TPU descriptors (`kind = "edgetpu"`) need `[memory] param_sram_bytes`,
`[link] host_bandwidth_bytes_per_s`, `[timing] invoke_overhead_s`, `[compute] peak_ops_per_s`,
`[compute.efficiency]` (one fraction of peak per op class) and `[power] active_w, idle_w`.
MCU descriptors (`kind = "mcu"`) need `[memory] sram_bytes, flash_bytes`, `[compute] clock_hz`,
`[compute.cycles_per_mac]` per op class, `[link] baud` and `[power] active_w, idle_w`; optionally
`[compute] cycles_per_instruction` (then the fitted instruction model of cost/mcu.py is used).
Op classes: conv, depthwise, fully_connected, elementwise, other.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from tpu_pipeline.toolchain.device.descriptor import (OP_CLASSES, Compute, Device, Link, Memory, Power, RamBank,
                                                      Timing)
from tpu_pipeline.toolchain.device.firmware import BoardFirmware, parse_firmware
from tpu_pipeline.toolchain.errors import UsageError

DEVICES_DIR = Path(__file__).resolve().parents[1] / "data" / "devices"  # package data (tpu_pipeline.toolchain.data)
KINDS = ("edgetpu", "mcu")

# (section path, key) -> (type, lowest, highest). The ranges only keep out values no real device
# has and that would break the arithmetic (1e300 bytes/s, 5e-324 ops/s, a negative power):
# bytes up to 1 TiB; bandwidth 1 B/s to 10 TB/s; overheads up to 10 s; peak 1 op/s to 1e18 op/s;
# clock 1 kHz to 100 GHz; baud 1 to 1e9; power 0 to 10 kW; efficiency (fraction of peak) 1e-6 to
# 1; cycles per MAC 1e-3 to 1e6.
TIB = 2**40
_EDGETPU_KEYS = {
    ("memory", "param_sram_bytes"): (int, 1, TIB),
    ("link", "host_bandwidth_bytes_per_s"): (float, 1.0, 1e13),
    ("timing", "invoke_overhead_s"): (float, 0.0, 10.0),
    ("compute", "peak_ops_per_s"): (float, 1.0, 1e18),
    ("power", "active_w"): (float, 0.0, 1e4),
    ("power", "idle_w"): (float, 0.0, 1e4),
}
_EDGETPU_OPTIONAL = {("timing", "per_op_s"): (float, 0.0, 10.0),
                     # tpu_pipeline/toolchain/cost/pipeline.py: streaming overlaps compute (0/1); invokes the host serves at once (0: any)
                     ("timing", "stream_overlaps_compute"): (int, 0, 1), ("timing", "host_concurrency"): (int, 0, 1024)}
_MCU_KEYS = {
    ("memory", "sram_bytes"): (int, 1, TIB),
    ("memory", "flash_bytes"): (int, 1, TIB),
    ("compute", "clock_hz"): (float, 1e3, 1e11),
    ("link", "baud"): (int, 1, 10**9),
    ("power", "active_w"): (float, 0.0, 1e4),
    ("power", "idle_w"): (float, 0.0, 1e4),
}
# cycles per instruction: 0.01 (an emulator's virtual clock, QEMU -icount) to 100 (a slow flash
# without cache); tpu_pipeline/toolchain/cost/mcu.py turns the fitted instruction counts into cycles with it.
_MCU_OPTIONAL = {("compute", "cycles_per_instruction"): (float, 0.01, 100.0)}
_PER_CLASS_RANGE = {"efficiency": (1e-6, 1.0), "cycles_per_mac": (1e-3, 1e6)}
MAX_FILE_BYTES = 1 << 20   # a descriptor is a few hundred bytes
MAX_NESTING = 16           # tables and arrays inside one another; tomllib recurses on each level


def available_devices() -> list[str]:
    return sorted(p.stem for p in DEVICES_DIR.glob("*.toml"))


def _resolve(name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        if not p.is_file():
            raise UsageError(f"{p}: no such device descriptor")
        return p
    candidate = DEVICES_DIR / f"{name_or_path}.toml"
    if not candidate.is_file():
        known = ", ".join(available_devices()) or "none"
        raise UsageError(f"unknown device '{name_or_path}' (known: {known}; or give a .toml path)")
    return candidate


def _number(label: str, value: Any, typ: type, lowest: float, highest: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{label} must be a number, got {value!r}")
    if typ is int and not (isinstance(value, int) or float(value).is_integer()):
        raise UsageError(f"{label} must be a whole number, got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise UsageError(f"{label} must be finite, got {value!r}")
    if value <= 0 < lowest:
        raise UsageError(f"{label} must be > 0, got {value!r}")
    if value < 0:
        raise UsageError(f"{label} must be >= 0, got {value!r}")
    if not lowest <= value <= highest:
        raise UsageError(f"{label} must be between {lowest:g} and {highest:g}, got {value!r}")


def validate(raw: dict, label: str) -> None:
    """Raise UsageError naming the file and the first problem found."""
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise UsageError(f"{label}: missing 'name'")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise UsageError(f"{label}: 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
    keys = _EDGETPU_KEYS if kind == "edgetpu" else _MCU_KEYS
    banks = kind == "mcu" and isinstance(raw.get("memory"), dict) and "banks" in raw["memory"]
    for (section, key), (typ, lowest, highest) in keys.items():
        if banks and (section, key) == ("memory", "sram_bytes") and key not in raw["memory"]:
            continue  # the banks say it (_banks below)
        sec = raw.get(section)
        if not isinstance(sec, dict) or key not in sec:
            raise UsageError(f"{label}: missing [{section}] {key}")
        _number(f"{label}: [{section}] {key}", sec[key], typ, lowest, highest)
    if kind == "edgetpu":
        for (section, key), (typ, lowest, highest) in _EDGETPU_OPTIONAL.items():
            if key in raw.get(section, {}):
                _number(f"{label}: [{section}] {key}", raw[section][key], typ, lowest, highest)
    if kind == "mcu":
        for (section, key), (typ, lowest, highest) in _MCU_OPTIONAL.items():
            if key in raw.get(section, {}):
                _number(f"{label}: [{section}] {key}", raw[section][key], typ, lowest, highest)
    if kind == "mcu":
        ram = _banks(raw, label)
        if "firmware" in raw:  # the board layer's facts (firmware.py)
            fw = parse_firmware(raw, label, ram[0].size)
            if ram[0].origin is not None and ram[0].origin != fw.ram_origin:
                raise UsageError(f"{label}: [firmware] ram_origin 0x{fw.ram_origin:08X} is not the first "
                                 f"[[memory.banks]] origin 0x{ram[0].origin:08X} (the arena's bank)")
    table = "efficiency" if kind == "edgetpu" else "cycles_per_mac"
    per_class = raw.get("compute", {}).get(table)
    if not isinstance(per_class, dict):
        raise UsageError(f"{label}: missing [compute.{table}]")
    for cls in OP_CLASSES:
        if cls not in per_class:
            raise UsageError(f"{label}: [compute.{table}] has no '{cls}' entry")
    for cls, v in per_class.items():
        if cls not in OP_CLASSES:
            raise UsageError(f"{label}: [compute.{table}] unknown op class '{cls}' "
                             f"(known: {', '.join(OP_CLASSES)})")
        if table == "efficiency" and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 1:
            raise UsageError(f"{label}: [compute.efficiency] {cls} is a fraction of peak, must be <= 1, got {v}")
        _number(f"{label}: [compute.{table}] {cls}", v, float, *_PER_CLASS_RANGE[table])


_BANK_KEYS = {"name", "size_bytes", "origin", "wait_states"}


def _banks(raw: dict, label: str) -> tuple[RamBank, ...]:
    """An MCU's RAM banks: `[[memory.banks]]` if the descriptor lists them (the first holds the
    arena; `sram_bytes`, if given too, must be its size), else one bank "sram" of `sram_bytes`."""
    mem = raw["memory"]
    origin = raw.get("firmware", {}).get("ram_origin") if isinstance(raw.get("firmware"), dict) else None
    if "banks" not in mem:
        return (RamBank("sram", int(mem["sram_bytes"]), origin if isinstance(origin, int) else None),)
    listed = mem["banks"]
    if not isinstance(listed, list) or not listed or not all(isinstance(b, dict) for b in listed):
        raise UsageError(f"{label}: [[memory.banks]] must be a list of tables (name, size_bytes, origin)")
    out = []
    for n, b in enumerate(listed):
        where = f"{label}: [[memory.banks]] {n}"
        unknown = sorted(set(b) - _BANK_KEYS)
        if unknown:
            raise UsageError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(sorted(_BANK_KEYS))})")
        name = b.get("name")
        if not isinstance(name, str) or not name or name in (x.name for x in out):
            raise UsageError(f"{where}: needs a name of its own, got {name!r}")
        if "size_bytes" not in b:
            raise UsageError(f"{where}: missing size_bytes")
        _number(f"{where} size_bytes", b["size_bytes"], int, 1, TIB)
        for key, highest in (("origin", 2**32 - 1), ("wait_states", 64)):
            if key in b:
                _number(f"{where} {key}", b[key], int, 0, highest)
        out.append(RamBank(name, int(b["size_bytes"]), b.get("origin"), b.get("wait_states")))
        _placed(out, where)
    if "sram_bytes" in mem and int(mem["sram_bytes"]) != out[0].size:
        raise UsageError(f"{label}: [memory] sram_bytes {mem['sram_bytes']} is not the size of the first bank "
                         f"'{out[0].name}' ({out[0].size}), which holds the arena")
    return tuple(out)


def _placed(banks: list[RamBank], where: str) -> None:
    """The last bank ends inside the 32-bit address space and overlaps none before it (a
    linker script places buffers by these addresses, banks.py splits the arena over them)."""
    b = banks[-1]
    if b.origin is None:
        return
    end = b.origin + b.size
    if end > 2**32:
        raise UsageError(f"{where} '{b.name}': 0x{b.origin:08X} + {b.size:,} B ends past the 32-bit address space")
    for other in banks[:-1]:
        if other.origin is not None and other.origin < end and b.origin < other.origin + other.size:
            raise UsageError(f"{where} '{b.name}' (0x{b.origin:08X}..0x{end - 1:08X}) overlaps bank '{other.name}' "
                             f"(0x{other.origin:08X}..0x{other.origin + other.size - 1:08X})")


def _device(raw: dict, path: str, given: str) -> Device:
    """The typed record of a validated descriptor."""
    mem, comp, link, power = raw["memory"], raw["compute"], raw["link"], raw["power"]
    mcu = raw["kind"] == "mcu"
    ram = _banks(raw, path) if mcu else ()
    firmware = parse_firmware(raw, path, ram[0].size) if mcu and "firmware" in raw else None
    timing = raw.get("timing", {})
    cpi = comp.get("cycles_per_instruction")
    # a firmware build depends on everything but the cost model's figure (the QEMU backend's cache key)
    built = {**raw, "compute": {k: v for k, v in comp.items() if k != "cycles_per_instruction"}} \
        if cpi is not None else raw
    return Device(
        name=raw["name"], kind=raw["kind"], description=str(raw.get("description", raw["name"])),
        memory=Memory(ram, int(mem["flash_bytes"]) if mcu else None,
                      None if mcu else int(mem["param_sram_bytes"])),
        compute=Compute(float(comp["clock_hz"]) if mcu else None, None if cpi is None else float(cpi),
                        {k: float(v) for k, v in comp.get("cycles_per_mac", {}).items()},
                        None if mcu else float(comp["peak_ops_per_s"]),
                        {k: float(v) for k, v in comp.get("efficiency", {}).items()}),
        link=Link(int(link["baud"]) if mcu else None, None if mcu else float(link["host_bandwidth_bytes_per_s"])),
        power=Power(float(power["active_w"]), float(power["idle_w"])),
        timing=None if mcu else Timing(float(timing["invoke_overhead_s"]), float(timing.get("per_op_s", 0.0)),
                                       bool(int(timing.get("stream_overlaps_compute", 0))),
                                       int(timing.get("host_concurrency", 0))),
        firmware=firmware, path=path, given=given, firmware_key=repr(sorted(built.items())))


def _nesting(text: str) -> int:
    """The deepest nesting of [ and { outside strings and comments (an upper bound is enough:
    it only has to stop tomllib's recursion long before Python's limit)."""
    depth = deepest = 0
    quote = None
    comment = False
    i = 0
    while i < len(text):
        c = text[i]
        if comment:
            comment = c != "\n"
        elif quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c == "#":
            comment = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth = max(depth - 1, 0)
        i += 1
    return deepest


def load_device(name_or_path: str | Path | Device) -> Device:
    """Load and validate a descriptor by name (devices/<name>.toml) or path, once, where a command
    or an API call starts; a Device is returned as it is."""
    if isinstance(name_or_path, Device):
        return name_or_path
    path = _resolve(name_or_path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise UsageError(f"{path}: {size:,} bytes; a device descriptor is at most {MAX_FILE_BYTES:,}")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    if _nesting(text) > MAX_NESTING:
        raise UsageError(f"{path}: tables or arrays nested deeper than {MAX_NESTING}")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({' '.join(str(exc).split())})") from None
    except RecursionError:
        raise UsageError(f"{path}: nested too deeply") from None
    return device_from_descriptor(raw, str(path), str(name_or_path))


def device_from_descriptor(raw: dict, label: str, given: str = "") -> Device:
    """A Device from a parsed descriptor (a TOML document as a dict), validated; `label` names it
    in errors (the file)."""
    validate(raw, label)
    return _device(raw, label, given)


def require_firmware(device: Device) -> BoardFirmware:
    """The board's `[firmware]` section; UsageError for a board the harness cannot be built for."""
    if device.firmware is None:
        raise UsageError(f"device '{device.name}' has no [firmware] section: the harness cannot be built for it "
                         f"(boards with one: {', '.join(firmware_boards())})")
    return device.firmware


def firmware_boards() -> list[str]:
    """The descriptors with a [firmware] section: the boards the harness can be built for."""
    return [n for n in available_devices() if load_device(n).firmware is not None]

#!/usr/bin/env python3
"""Fuzz campaign: seeded mutations of the committed models (and of a device descriptor) run
through the CLI. Every run must end with a known exit code (0-4), one line on error, no
traceback, no crash; a model written with exit 0 must load in LiteRT (or, where the command said
it checked the model in TFLite Micro alone, load and run in TFLite Micro).

    python tools/fuzz.py --count 40 --seed 1          # 40 mutants per model and command
    python tools/fuzz.py --count 5 --commands inspect plan

Each mutant runs in a forked child (the imports are paid once): a crash in native code shows as
a signal instead of killing the campaign, and a hang is killed after --timeout seconds.
`tests/test_fuzz.py` runs a small campaign of the same code in `make test`.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import struct
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KNOWN_EXITS = {0, 1, 2, 3, 4}
COMMANDS = ("inspect", "schedule", "plan", "compile", "fit")


def fixture_models() -> list[Path]:
    return sorted((ROOT / "tests" / "fixtures").glob("*.tflite")) + sorted((ROOT / "examples").glob("*.tflite"))


# ---- mutations ----------------------------------------------------------------------------------

_INTERESTING = (0, 1, 2, 4, 8, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)


def _flip_bytes(rng: random.Random, data: bytearray, others: list[bytes]) -> str:
    n = rng.choice((1, 1, 2, 4, 8))
    for _ in range(n):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return f"flip{n}"


def _truncate(rng: random.Random, data: bytearray, others: list[bytes]) -> str:
    keep = rng.choice((rng.randrange(len(data)), len(data) - rng.randrange(1, 64), rng.randrange(64)))
    del data[max(keep, 0):]
    return "truncate"


def _header(rng: random.Random, data: bytearray, others: list[bytes]) -> str:
    """The root offset, the file identifier, or the root table's vtable offset."""
    if len(data) < 8:
        return "header-short"
    which = rng.randrange(3)
    if which == 0:
        value = rng.choice((*_INTERESTING, len(data), len(data) - 4, rng.randrange(len(data))))
        struct.pack_into("<I", data, 0, value & 0xFFFFFFFF)
        return "header-root"
    if which == 1:
        data[4 + rng.randrange(4)] = rng.randrange(256)
        return "header-ident"
    (root,) = struct.unpack_from("<I", data, 0)
    if root + 4 <= len(data):
        struct.pack_into("<i", data, root, rng.choice((0, 4, -4, 1 << 20, -(1 << 20), rng.randrange(-256, 256))))
    return "header-vtable"


def _offset(rng: random.Random, data: bytearray, others: list[bytes]) -> str:
    """An aligned word that looks like an offset or a length, set to a boundary value or nudged."""
    if len(data) < 4:
        return "offset-short"
    pos, value = 0, 0
    for _ in range(64):
        pos = rng.randrange(0, max(len(data) // 4, 1)) * 4
        if pos + 4 > len(data):
            continue
        (value,) = struct.unpack_from("<I", data, pos)
        if 0 < value < len(data):
            break
    new = rng.choice((*_INTERESTING, value + rng.choice((-8, -4, -1, 1, 4, 8)), value * 2, len(data)))
    struct.pack_into("<I", data, pos, new & 0xFFFFFFFF)
    return "offset"


def _vtable_entry(rng: random.Random, data: bytearray, others: list[bytes]) -> str:
    """A 16-bit word (vtable entries are 16-bit) set to a boundary value."""
    pos = rng.randrange(0, max(len(data) // 2, 1)) * 2
    if pos + 2 <= len(data):
        struct.pack_into("<H", data, pos, rng.choice((0, 2, 4, 0xFF, 0x7FFF, 0xFFFF, rng.randrange(65536))))
    return "vtable"


def _splice(rng: random.Random, data: bytearray, others: list[bytes]) -> str:
    other = rng.choice(others)
    n = rng.randrange(1, min(len(other), 512) + 1)
    src = rng.randrange(len(other) - n + 1)
    dst = rng.randrange(len(data))
    if rng.random() < 0.5:
        data[dst:dst + n] = other[src:src + n]
        return "splice-overwrite"
    data[dst:dst] = other[src:src + n]
    return "splice-insert"


MUTATORS = (_flip_bytes, _truncate, _header, _offset, _vtable_entry, _splice)


def mutate(data: bytes, rng: random.Random, others: list[bytes]) -> tuple[bytes, str]:
    """One mutant of `data`: one to three mutations, named."""
    out = bytearray(data)
    names = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        if not out:
            break
        names.append(rng.choice(MUTATORS)(rng, out, others))
    return bytes(out), "+".join(names)


_TOML_VALUES = ("1e300", "5e-324", "-1", "0", "nan", "inf", "-inf", "1e-300", "9" * 40, '"x"', "true",
                "[1, 2]", "{a = 1}", "1.5", "18446744073709551616")


def mutate_toml(text: str, rng: random.Random) -> tuple[str, str]:
    """A device descriptor with one value replaced, a line dropped or duplicated, or deep nesting."""
    lines = text.splitlines()
    kind = rng.randrange(5)
    values = [i for i, ln in enumerate(lines) if "=" in ln and not ln.lstrip().startswith("#")]
    if kind == 0 and values:
        i = rng.choice(values)
        key = lines[i].split("=", 1)[0]
        lines[i] = f"{key}= {rng.choice(_TOML_VALUES)}"
        return "\n".join(lines) + "\n", "value"
    if kind == 1 and lines:
        del lines[rng.randrange(len(lines))]
        return "\n".join(lines) + "\n", "drop-line"
    if kind == 2 and lines:
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        return "\n".join(lines) + "\n", "dup-line"
    if kind == 3:
        depth = rng.choice((100, 5000, 200_000))
        return text + "deep = " + "[" * depth + "]" * depth + "\n", f"nest{depth}"
    pos = rng.randrange(max(len(text), 1))
    return text[:pos] + chr(rng.choice((0, 0x7F, 0xFFFD, ord("["), ord('"')))) + text[pos + 1:], "char"


# ---- running --------------------------------------------------------------------------------------

@dataclass
class Outcome:
    command: str
    fixture: str
    mutation: str
    code: int | None          # exit code; None when killed by a signal or the timeout
    signal: int | None = None
    seconds: float = 0.0
    output: str = ""
    problems: list[str] = field(default_factory=list)


def argv_for(command: str, model: Path, work: Path, device: Path | None = None) -> list[str]:
    if command == "inspect":
        return ["inspect", str(model), "--json"]
    if command == "schedule":
        return ["schedule", str(model), "-o", str(work / "scheduled.tflite"), "--time-limit", "2"]
    if command == "plan":
        return ["plan", str(model), "-o", str(work / "planned.tflite"), "--time-limit", "1"]
    if command == "compile":
        return ["compile", str(model), "-n", "2", "--no-rewrite", "--time-limit", "2", "-o", str(work / "out"),
                "--json", *(["--device", str(device)] if device else [])]
    if command == "fit":
        return ["fit", str(model), "--objective", "memory", "-o", str(work / "fitted.tflite"), "--time-limit", "2",
                "--runs", "1", "--json"]
    raise ValueError(command)


def written_models(command: str, work: Path) -> list[Path]:
    if command == "schedule":
        return [work / "scheduled.tflite"]
    if command == "plan":
        return [work / "planned.tflite"]
    if command == "compile":
        return sorted((work / "out").glob("*.tflite"))
    if command == "fit":
        return [work / "fitted.tflite"]
    return []


def _child(argv: list[str], log: Path) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = open(1, "w", closefd=False, buffering=1)
    sys.stderr = open(2, "w", closefd=False, buffering=1)
    code = 99
    try:
        from tpu_pipeline.cli import main

        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException:  # noqa: BLE001 - reported by the parent as a traceback
        import traceback

        traceback.print_exc()
        code = 98
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) and 0 <= code < 256 else 97)


def warm_up() -> None:
    """Import what the commands import once, in the parent, so each forked child starts warm."""
    import ai_edge_litert.interpreter  # noqa: F401
    import tpu_pipeline.toolchain.compile  # noqa: F401
    from tpu_pipeline.cli import COMMANDS, build_parser

    for name, _, _ in COMMANDS:  # each command's parser imports its module
        build_parser(name)


def run_one(argv: list[str], work: Path, timeout: float) -> tuple[int | None, int | None, str, float]:
    """(exit code, signal, output, seconds) of `tpu-pipeline argv` in a forked child."""
    log = work / "output.txt"
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(argv, log)
    deadline = t0 + timeout
    status = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None, None, log.read_text(errors="replace") if log.exists() else "", time.monotonic() - t0
        time.sleep(0.01)
    output = log.read_text(errors="replace") if log.exists() else ""
    seconds = time.monotonic() - t0
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status), output, seconds
    return os.WEXITSTATUS(status), None, output, seconds


def loads_in_litert(path: Path) -> str | None:
    """None if LiteRT builds an interpreter for `path`, else why not (in a child: it may crash)."""
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        try:
            from tpu_pipeline.toolchain.execute.litert import new_interpreter

            new_interpreter(path.read_bytes(), builtin_only=False, num_threads=None)
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"LiteRT crashed (signal {os.WTERMSIG(status)}) on the written {path.name}"
    if os.WEXITSTATUS(status) != 0:
        return f"LiteRT cannot load the written {path.name}"
    return None


def check(command: str, fixture: str, mutation: str, argv: list[str], work: Path, timeout: float) -> Outcome:
    code, sig, output, seconds = run_one(argv, work, timeout)
    o = Outcome(command, fixture, mutation, code, sig, seconds, output)
    if sig is not None:
        o.problems.append(f"killed by signal {sig}")
    elif code is None:
        o.problems.append(f"no answer within {timeout:.0f} s")
    elif code not in KNOWN_EXITS:
        o.problems.append(f"exit {code}")
    if "Traceback" in output:
        o.problems.append("traceback in the output")
    if code not in (0, None) and code in KNOWN_EXITS:
        errors = [ln for ln in output.splitlines() if ln.startswith("error:") or ln.startswith("tpu-pipeline")]
        if not errors:
            o.problems.append("failed without an error line")
    if code == 0:
        # An MCU command may accept a model only TFLite Micro loads (issue 24: TFLite Micro's own
        # person_detect.tflite); it says so, and then what it wrote must load and run there.
        tflm_alone = "checked in TFLite Micro alone" in output
        for path in written_models(command, work):
            why = loads_in_tflm(path) if tflm_alone else loads_in_litert(path)
            if why:
                o.problems.append(why)
    return o


def loads_in_tflm(path: Path) -> str | None:
    """None if TFLite Micro (host wheel) allocates and runs `path` (in a child process), else why not."""
    from tpu_pipeline.toolchain.errors import ModelError
    from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena

    try:
        measure_tflm_arena(path, invoke=True)
    except ModelError as exc:
        return f"TFLite Micro cannot run the written {path.name} ({exc})"
    return None


def campaign(count: int, seed: int, commands=COMMANDS, fixtures: list[Path] | None = None, timeout: float = 120.0,
             toml_count: int | None = None, progress=None, keep: Path | None = None) -> list[Outcome]:
    """`count` mutants per fixture and command, plus `toml_count` device-descriptor mutants."""
    warm_up()
    fixtures = fixtures or fixture_models()
    blobs = {p: p.read_bytes() for p in fixtures}
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="tpu-fuzz-") as tmp:
        tmp = Path(tmp)
        for fi, path in enumerate(fixtures):
            others = [b for q, b in blobs.items() if q != path] or [blobs[path]]
            for command in commands:
                rng = random.Random(f"{seed}:{path.name}:{command}")
                for k in range(count):
                    data, name = mutate(blobs[path], rng, others)
                    work = tmp / f"{fi}-{command}-{k}"
                    work.mkdir()
                    model = work / path.name
                    model.write_bytes(data)
                    o = check(command, path.name, name, argv_for(command, model, work), work, timeout)
                    outcomes.append(o)
                    if keep and o.problems:
                        keep.mkdir(parents=True, exist_ok=True)
                        (keep / f"{command}-{fi}-{k}-{path.name}").write_bytes(data)
                    if progress:
                        progress(o)
        toml_count = count if toml_count is None else toml_count
        from tpu_pipeline.toolchain.device import DEVICES_DIR

        base = (DEVICES_DIR / "coral-usb.toml").read_text()
        rng = random.Random(f"{seed}:device")
        model = fixtures[0]
        for k in range(toml_count):
            text, name = mutate_toml(base, rng)
            work = tmp / f"device-{k}"
            work.mkdir()
            dev = work / "device.toml"
            dev.write_text(text)
            o = check("compile", "coral-usb.toml", name, argv_for("compile", model, work, dev), work, timeout)
            outcomes.append(o)
            if keep and o.problems:
                keep.mkdir(parents=True, exist_ok=True)
                (keep / f"device-{k}.toml").write_text(text)
            if progress:
                progress(o)
    return outcomes


def summary_table(outcomes: list[Outcome]) -> str:
    rows = Counter()
    for o in outcomes:
        label = "crash" if o.signal else ("timeout" if o.code is None else str(o.code))
        rows[(o.command if o.fixture != "coral-usb.toml" else "compile --device", label)] += 1
    commands = sorted({c for c, _ in rows})
    labels = sorted({lbl for _, lbl in rows})
    lines = ["| command | " + " | ".join(f"exit {lbl}" for lbl in labels) + " | problems |",
             "|---|" + "---|" * (len(labels) + 1)]
    for c in commands:
        bad = sum(1 for o in outcomes if o.problems and (o.command if o.fixture != "coral-usb.toml"
                                                          else "compile --device") == c)
        lines.append(f"| {c} | " + " | ".join(str(rows.get((c, lbl), 0)) for lbl in labels) + f" | {bad} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=20, help="mutants per model and command (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commands", nargs="+", default=list(COMMANDS), choices=COMMANDS)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per run before it counts as a hang")
    ap.add_argument("--toml-count", type=int, default=None, help="device-descriptor mutants (default --count)")
    ap.add_argument("--keep", type=Path, metavar="DIR", help="save the inputs that showed a problem here")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.monotonic()

    def progress(o: Outcome) -> None:
        if o.problems:
            print(f"PROBLEM {o.command} {o.fixture} [{o.mutation}]: {'; '.join(o.problems)}\n"
                  + "\n".join("    " + ln for ln in o.output.strip().splitlines()[-6:]), flush=True)
        elif args.verbose:
            print(f"ok {o.command} {o.fixture} [{o.mutation}] exit {o.code} {o.seconds:.1f} s", flush=True)

    outcomes = campaign(args.count, args.seed, tuple(args.commands), timeout=args.timeout,
                        toml_count=args.toml_count, progress=progress, keep=args.keep)
    bad = [o for o in outcomes if o.problems]
    print(f"\nfuzz: {len(outcomes)} runs, seed {args.seed}, {time.monotonic() - t0:.0f} s, {len(bad)} with problems")
    print(summary_table(outcomes))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

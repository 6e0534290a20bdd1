"""`export-mcu --library DIR`: a model as a drop-in library for any TFLite Micro application.

    r = export_library("kws.tflite", load_device("stm32h743"), "lib/kws")
    r.head_bytes["cmsis-nn"], r.tail_bytes["cmsis-nn"], r.files

DIR gets the model as a C array with its offline arena plan (`tpup_<name>_model_data.cc/.h`),
the harness kernels it uses and only those (`tpup_conv.cc`, `tpup_stage.cc`), one registration
call for the application's op resolver (`tpup_<name>_ops.h`), a C API (`tpup_<name>.h/.cc`:
init on the user's arena, input/output tensors with their quantisation, invoke, the exact head
and tail per kernel set as macros), a CMakeLists.txt and a README with Arduino, Zephyr and
ESP-IDF notes. The folder is written whole or not at all; a folder that exists and is not one
of ours is refused before any work (`tpup_library.json` marks ours).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tpu_pipeline.toolchain import interrupts
from tpu_pipeline.toolchain.data import FIRMWARE_DIR, HARNESS_DIR
from tpu_pipeline.toolchain.device import KERNEL_SETS, Device
from tpu_pipeline.toolchain.errors import DeviceError, ModelError, UsageError
from tpu_pipeline.toolchain.export_mcu import c_array, harness_custom_ops, resolver_method, resolver_opcode
from tpu_pipeline.toolchain.ir import harness_ops

LIBRARY_DIR = FIRMWARE_DIR / "library"
MARKER = "tpup_library.json"
LIBRARY_VERSION = 1
# The TFLite Micro the library is checked against (the harness's trees); any with TFLMRegistration works.
TFLM_CHECKED = "tflite-micro 90b983c2 (2026-08-20)"


@dataclass(frozen=True)
class LibraryModel:
    """One model of a library and its arena on the 32-bit target, per kernel set."""
    name: str
    source: str
    ops: tuple[str, ...]  # op codes registered, first use first
    custom_ops: tuple[str, ...]  # tpu-pipeline's own kernels among them
    model_bytes: int
    head_bytes: dict  # kernel set name -> predicted head
    tail_bytes: dict  # kernel set name -> predicted tail
    arena_bytes: dict  # kernel set name -> TPUP_<NAME>_ARENA_BYTES
    planning_bytes: int
    model_crc: str
    split_tail_bytes: dict = None  # kernel set name -> the tail with the head in a buffer of its own (init_split)
    # kernel set name -> {"head": bank, "tail": bank, "banks": [{name, bytes_predicted}]} on the device
    # (deploy/banks.py, the harness's reserve in the first bank); None where no placement holds it
    placement: dict = None
    notes: tuple[str, ...] = ()  # what export-mcu changed in the model to make it exact for TFLite Micro


@dataclass(frozen=True)
class LibraryResult:
    out_dir: str
    target: str  # the CMake target: tpup_<name> for one model, tpup_shared for several
    device: str
    files: tuple[str, ...]
    models: tuple[LibraryModel, ...]
    shared: dict | None = None  # several models: kernel set name -> SharedArena.to_json()

    def to_json(self) -> dict:
        return {"kind": "tpu-pipeline library", "version": LIBRARY_VERSION, **asdict(self)}

    def __getattr__(self, key):  # one model: its figures as the library's (r.name, r.head_bytes, ...)
        if key in LibraryModel.__dataclass_fields__ and len(self.__dict__.get("models", ())) == 1:
            return getattr(self.models[0], key)
        raise AttributeError(key)


def library_name(stem: str) -> str:
    """A C identifier from a model's file stem: `kws_ref_model` from 'kws-ref.model'."""
    name = re.sub(r"[^0-9a-zA-Z]+", "_", stem).strip("_").lower()
    return name if name[:1].isalpha() else f"m_{name}"


def check_library_folder(out: Path) -> None:
    """Refuse (exit 2) a target that exists and is not a library we wrote: nothing is written."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UsageError(f"{out}: exists and is not a folder; choose a new or empty folder for --library")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        first = sorted(p.name for p in out.iterdir())[0]
        raise UsageError(f"{out}: holds '{first}' and is not a tpu-pipeline library (no {MARKER}); choose a new "
                         "or empty folder for --library")


def custom_ops(graph) -> tuple[str, ...]:
    """tpu-pipeline's own kernels (custom ops) a model uses, by name."""
    from tpu_pipeline.toolchain.ir import kernels as harness

    return tuple(sorted({harness.custom_code(op) for op in graph.ops if harness.is_harness(op)}))


def custom_ops_note(graph) -> str | None:
    """What a model with tpu-pipeline's own kernels needs, for inspect and fit (None: builtins only)."""
    names = custom_ops(graph)
    if not names:
        return None
    return (f"needs tpu-pipeline's custom ops {', '.join(names)}: stock TFLite Micro stops with \"Failed to get "
            "registration from op code CUSTOM\"; `tpu-pipeline export-mcu MODEL --library DIR` writes their "
            "kernels and one registration call for your op resolver (or fit with --builtin-kernels)")


def export_library(model_paths, device: Device, out_dir: str | Path, names=None,
                   model_data: bytes | None = None) -> LibraryResult:
    """Write the library of one model or several (one shared arena) into `out_dir`. `model_data`:
    the one model's bytes when they are not the file's (e.g. fit's output)."""
    paths = [Path(model_paths)] if isinstance(model_paths, (str, Path)) else [Path(p) for p in model_paths]
    out = Path(out_dir)
    check_library_folder(out)
    names = _names(paths, [names] if isinstance(names, str) else names)
    entries, files, opcodes_all, planned = [], {}, [], []
    for src, name in zip(paths, names):
        entry, model_files, graph, offsets = _one_model(src, name, device, model_data)
        entries.append(entry)
        files.update(model_files)
        opcodes_all += entry.ops
        planned.append((graph, offsets))
    shared = None
    if len(paths) > 1:
        from tpu_pipeline.toolchain.deploy.shared_arena import shared_arena

        arenas = {k.name: shared_arena(planned, k) for k in KERNEL_SETS}
        shared = {k: a.to_json() for k, a in arenas.items()}
        files.update(_shared_files(names, arenas, max(e.planning_bytes for e in entries)))
    target = f"tpup_{names[0]}" if len(paths) == 1 else "tpup_shared"
    files.update(_common_files(target, names, device, entries, tuple(dict.fromkeys(opcodes_all)), files))
    result = LibraryResult(str(out), target, device.name, tuple(sorted([*files, MARKER])), tuple(entries), shared)
    files[MARKER] = (json.dumps(result.to_json(), indent=2) + "\n").encode()
    write_folder(out, files)
    return result


def _names(paths, given) -> list[str]:
    if given is not None:
        if len(given) != len(paths):
            raise UsageError(f"--name: {len(given)} name(s) for {len(paths)} model(s); give one per model, "
                             "comma-separated")
        for n in given:
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", n):
                raise UsageError(f"--name: '{n}' is not a C identifier (a letter, then letters, digits, _)")
    names = [library_name(n) for n in (given or [p.stem for p in paths])]
    if len(set(names)) != len(names) or "shared" in names:
        raise UsageError(f"models named {', '.join(names)}: each needs its own C name (not 'shared'); give --name")
    return names


def _one_model(src: Path, name: str, device: Device, model_data):
    """(LibraryModel, its files, its graph, its offline plan): the model planned and checked by export-mcu."""
    from tpu_pipeline.toolchain.export_mcu import export_mcu

    with tempfile.TemporaryDirectory(prefix="tpup-library-") as tmp:
        exported = export_mcu(src, device, tmp, model_data=model_data, split_ok=True)  # plan, checks, flash and SRAM verdicts
        data = (Path(tmp) / "model.tflite").read_bytes()
    graph, offsets = _planned_graph(data)
    if graph.external:
        raise UsageError(f"{src}: its input lies outside the arena (--input-outside-arena); the library runs "
                         "models whose tensors are all in the arena: export without it")
    opcodes = tuple(dict.fromkeys(resolver_opcode(op) for op in graph.ops))
    for o in opcodes:
        resolver_method(o)  # one line for a custom op no firmware of ours has
    head, tail, arena, planning, split = _arena_figures(graph, offsets)
    entry = LibraryModel(name, src.name, opcodes, tuple(o for o in opcodes if o in harness_ops.by_code()), len(data),
                         head, tail, arena, planning, exported.model_crc, split, _placements(device, head, tail, split),
                         exported.notes)
    return entry, _model_files(entry, device, data, graph), graph, offsets


def _placements(device: Device, head: dict, tail: dict, split: dict) -> dict:
    """Where the arena goes on `device`, per kernel set: one bank or head and tail in two
    (the library's init or init_split)."""
    from tpu_pipeline.toolchain.deploy.banks import firmware_reserve, place

    out = {}
    for k in head:
        p = place(max(head[k], 0), tail[k], device.memory.banks, firmware_reserve(device), split[k])
        out[k] = None if p is None else {"head": p.head_bank, "tail": p.tail_bank, "banks": p.to_json()}
    return out


def _planned_graph(data: bytes):
    from tpu_pipeline.toolchain.ir import from_model
    from tpu_pipeline.toolchain.tflite import read_model
    from tpu_pipeline.toolchain.tflite.metadata import read_offline_plan

    model = read_model(data)
    return from_model(model), read_offline_plan(model)


def _arena_figures(graph, offsets) -> tuple[dict, dict, dict, int, dict]:
    """(head, tail, arena size) per kernel set, the planning bound and the tail of init_split,
    on the 32-bit target."""
    from tpu_pipeline.toolchain.memory.tflm_target import planning_bound, split_tail, target_arena, target_tail

    planning = planning_bound(graph)
    head, tail, arena, split = {}, {}, {}, {}
    for k in KERNEL_SETS:
        a = target_arena(graph, k, offsets)
        if a.tail is None:
            missing = ", ".join(target_tail(graph, k).unmodelled)
            raise ModelError(f"the {k.name} arena's tail is not predicted for {missing} (persistent data not "
                             "modelled); the library's arena macros must be exact")
        head[k.name], tail[k.name] = a.head, a.tail
        arena[k.name] = -(-(max(a.head, planning) + a.tail) // 16) * 16
        split[k.name] = split_tail(target_tail(graph, k))
    return head, tail, arena, planning, split


def _fill(template: str, values: dict) -> str:
    for k, v in values.items():
        template = template.replace(f"@{k}@", str(v))
    return template


def _model_files(m: LibraryModel, device: Device, data: bytes, graph) -> dict[str, bytes]:
    """One model's files: its C API, registration call, model array."""
    values = {"NAME": m.name, "UNAME": m.name.upper(), "SOURCE": m.source, "NUM_INPUTS": len(graph.inputs),
              "NUM_OUTPUTS": len(graph.outputs), "NUM_OPS": len(m.ops), "PLANNING": m.planning_bytes,
              **_per_kernel_values(m)}
    n = m.name
    return {
        f"tpup_{n}.h": _fill((LIBRARY_DIR / "model.h.in").read_text(), values).encode(),
        f"tpup_{n}.cc": _fill((LIBRARY_DIR / "model.cc.in").read_text(), values).encode(),
        f"tpup_{n}_ops.h": _ops_header(n, m.ops).encode(),
        f"tpup_{n}_model_data.h": (f"#pragma once\n// Generated by tpu-pipeline export-mcu --library: {m.source}\n"
                                   f"extern const unsigned char tpup_{n}_model_data[];\n"
                                   f"extern const unsigned int tpup_{n}_model_data_len;\n").encode(),
        f"tpup_{n}_model_data.cc": c_array(data, f"tpup_{n}_model_data").replace(
            '#include "model_data.h"', f'#include "tpup_{n}_model_data.h"').encode(),
        f"tpup_{n}.tflite": data,
    }


def _per_kernel_values(m: LibraryModel) -> dict:
    return {f"{w}_{k.upper().replace('-', '_')}": v[k] for w, v in (
        ("HEAD", m.head_bytes), ("TAIL", m.tail_bytes), ("ARENA", m.arena_bytes), ("SPLIT_TAIL", m.split_tail_bytes))
        for k in m.head_bytes}


def _shared_files(names, arenas, planning: int) -> dict[str, bytes]:
    """tpup_shared.h/.cc: every model on one arena (heads overlap, tails stack)."""
    values = {"PLANNING": planning, "DECLS": "\n".join(
        f"int tpup_{n}_init_on(tflite::SingleArenaBufferAllocator* buffers, tflite::MicroAllocator* allocator);"
        for n in names), "INITS": "\n".join(
        f"  if ((rc = tpup_{n}_init_on(g_buffers, allocator)) != TPUP_OK) return rc;" for n in names),
        "MODELS": ", ".join(names), "INCLUDES": "\n".join(f'#include "tpup_{n}.h"' for n in names)}
    for k, a in arenas.items():
        suffix = k.upper().replace("-", "_")
        values[f"HEAD_{suffix}"], values[f"TAIL_{suffix}"] = a.head, a.tail
        values[f"SEPARATE_{suffix}"] = a.separate_total
    return {"tpup_shared.h": _fill((LIBRARY_DIR / "shared.h.in").read_text(), values).encode(),
            "tpup_shared.cc": _fill((LIBRARY_DIR / "shared.cc.in").read_text(), values).encode()}


def _common_files(target: str, names, device: Device, entries, opcodes, files: dict) -> dict[str, bytes]:
    """What the models share: tpup_api.h, the kernels any of them uses, CMakeLists.txt, README.md."""
    kernel_files = _kernel_files(opcodes)
    sources = sorted(f for f in [*files, *kernel_files] if f.endswith(".cc"))
    if "tpup_shared.h" in files:
        sources.append("tpup_shared.cc")
    first = entries[0]
    customs = sorted({o for e in entries for o in e.custom_ops})
    values = {"NAME": first.name, "UNAME": first.name.upper(), "TARGET": target, "SOURCE": ", ".join(
        e.source for e in entries), "DEVICE": device.name, "DIRNAME": target, "TFLM": TFLM_CHECKED,
        "SOURCES": " ".join(sources), **_per_kernel_values(first),
        "CUSTOM": (f"{', '.join(customs)} (tpu-pipeline's kernels, in this folder; `tpup_<model>_register_ops` "
                   "registers them)") if customs else "none (builtin ops only)",
        "ARENA_ROWS": "\n".join(f"| {e.name} | {k} | {e.head_bytes[k]:,} | {e.tail_bytes[k]:,} | {e.arena_bytes[k]:,} |"
                                for e in entries for k in e.head_bytes)}
    out = {"tpup_api.h": (LIBRARY_DIR / "tpup_api.h").read_bytes(),
           "CMakeLists.txt": _fill((LIBRARY_DIR / "CMakeLists.txt.in").read_text(), values).encode(),
           **{f: (HARNESS_DIR / f).read_bytes() for f in kernel_files}}
    names_all = sorted([*files, *out, "README.md", MARKER])
    listing = "\n".join(f"| `{f}` | {_what(f)} |" for f in names_all)
    out["README.md"] = _fill((LIBRARY_DIR / "README.md.in").read_text(), {**values, "FILES": listing}).encode()
    return out


def kernel_sources() -> tuple[str, ...]:
    """Every harness kernel source a library may carry (tpu_pipeline.toolchain.ir.harness_ops: the
    convolution's, each registered faster variant's, each harness op's own)."""
    return tuple(harness_ops.sources())


def _kernel_files(opcodes) -> list[str]:
    """The harness kernel sources the model's custom ops need, and only those."""
    return harness_ops.sources(set(opcodes))


def _what(f: str) -> str:
    fixed = {"tpup_api.h": "what every model's C API shares: tpup_tensor, return codes",
             "tpup_shared.h": "several models on one arena: init and the shared arena macros",
             "tpup_shared.cc": "their interpreters on one MicroAllocator", "CMakeLists.txt": "the static library target",
             "README.md": "this file", MARKER: "what tpu-pipeline wrote (figures; marks the folder as its own)"}
    if f in fixed:
        return fixed[f]
    for suffix, what in (("_ops.h", "one call registering the model's ops on your MicroMutableOpResolver"),
                         ("_model_data.h", "the model array's declaration"),
                         ("_model_data.cc", "the model, 16-byte aligned, its offline arena plan inside"),
                         (".tflite", "the same model as a file (for host tools)"),
                         (".h", "the model's C API and arena macros"), (".cc", "the model's C API on TFLite Micro")):
        if f.startswith("tpup_") and f.endswith(suffix) and f not in kernel_sources():
            return what
    return "tpu-pipeline's kernel (custom op) source"


def _ops_header(name: str, opcodes) -> str:
    customs = harness_custom_ops()
    lines = ["#pragma once", "// Generated by tpu-pipeline export-mcu --library: every op the model uses.", "",
             '#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"',
             *(['#include "tpup_conv.h"'] if set(opcodes) & set(customs) else []),
             f'#include "tpup_{name}.h"', "",
             f"// Adds the ops of model {name} to `resolver` (size it with TPUP_{name.upper()}_NUM_OPS more than",
             "// your own ops); an op the resolver already has is kept, so several models share one resolver.",
             "template <unsigned int N>",
             f"TfLiteStatus tpup_{name}_register_ops(tflite::MicroMutableOpResolver<N>& resolver) {{"]
    for op in opcodes:
        if op in customs:
            lines.append(f'  if (resolver.FindOp("{op}") == nullptr) TF_LITE_ENSURE_STATUS(resolver.'
                         f'{customs[op]});')
        else:
            lines.append(f"  if (resolver.FindOp(tflite::BuiltinOperator_{op}) == nullptr) "
                         f"TF_LITE_ENSURE_STATUS(resolver.{resolver_method(op)}());")
    return "\n".join([*lines, "  return kTfLiteOk;", "}", ""])


def write_folder(out: Path, files: dict[str, bytes]) -> None:
    """`files` as the folder `out`, all at once: written beside it, then renamed into place (an
    earlier library there is replaced whole)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.library.", dir=out.parent))
    except OSError as exc:
        raise DeviceError(f"{out}: cannot create the library folder ({exc.strerror})") from None
    interrupts.register_temp(tmp)
    old = None
    try:
        for fname, content in files.items():
            (tmp / fname).write_bytes(content)
        os.chmod(tmp, 0o755)
        with interrupts.critical():
            check_library_folder(out)  # again: something may have appeared meanwhile
            if out.exists():
                old = Path(f"{tmp}.old")
                os.rename(out, old)
            os.rename(tmp, out)
    except OSError as exc:
        raise DeviceError(f"{out}: cannot write ({exc.strerror})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        interrupts.unregister_temp(tmp)

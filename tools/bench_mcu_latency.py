#!/usr/bin/env python3
"""MCU latency, measured side by side with TinyEngine in the same emulated core, in one run.

    python tools/bench_mcu_latency.py --tinyengine DIR [--mlperf DIR] [--only vww] [--cores an386 an500]
        [--reuse-tinyengine]   # our rows only; TinyEngine's from the last run, marked as reused

DIR is a checkout of mit-han-lab/tinyengine with its CMSIS submodule (TinyEngine/third_party/CMSIS,
CMSIS_5 at the commit TinyEngine pins); default $TINYENGINE_DIR, else ../peers/tinyengine beside
this checkout. `--mlperf DIR` (default $TPUP_MLPERF_DIR, else ../peers/mlperf-tiny) holds MLPerf
Tiny's four int8 models (kws_ref_model, vww_96_int8, pretrainedResnet_quant, ad01_int8 from
mlcommons/tiny benchmark/training/*/trained_models).

TinyEngine: its code generator (in its own environment, tools/bench_tinyengine.py) writes the C of
each of its three models with whole layers (as `GenerateSourceFilesFromTFlite` does: float
requantization; and with its integer requantization) and with its best patch plan (the smallest
peak of bench_tinyengine's search whose generated loop tiles the image exactly). That C, its kernel
library (TinyEngine/src: int_forward_op, fp_requantize_op, yoloOutput.c) and the CMSIS-NN/DSP of
its CMSIS submodule are compiled with arm-none-eabi-gcc with the CPU flags and -O level of the
TFLite Micro library our firmware links (toolchain/firmware/library.py), linked with the harness
firmware's own board layer (startup, SysTick ticks, CMSDK UART at 0x40004000) around a small
runner (tools/mcu_latency/te_main.cc) and run in qemu-system-arm -icount shift=0 on mps2-an386
(Cortex-M4F) and mps2-an500 (Cortex-M7). Its int8 outputs are compared with host TFLite Micro
(the wheel) on the model with int8 I/O (fit's --int8-io rewrite), on the same input. Per-layer
counts come from TinyEngine's own profile mode (a second build; totals from the plain build).

Ours, in the same run and the same cores: the model as converted on stock TFLite Micro + CMSIS-NN
builtin kernels (`tpu-pipeline run --backend qemu`), and fit's points on the harness kernels
(`fit --int8-io --input-outside-arena` at TinyEngine's best patched peak, with --objective memory,
and fastest within the board's SRAM), each with the harness's per-op counts. MLPerf Tiny: as
converted against fit's fastest point.

Writes docs/bench/mcu_latency.md and docs/bench/mcu_latency.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))
from bench_tinyengine import MODELS, find_tinyengine, peer_python, run_peer  # noqa: E402
import mcu_latency_figure  # noqa: E402

OUT = REPO / "docs" / "bench" / "mcu_latency.md"
RUNNER = REPO / "tools" / "mcu_latency"
CORES = {"an386": "qemu-mps2-an386", "an500": "qemu-mps2-an500"}
MLPERF = ("kws_ref_model", "vww_96_int8", "pretrainedResnet_quant", "ad01_int8")
TE_RUNS = 2
NOTE_INCLUDE = ("TinyEngine's generated integer-requantization depthwise kernels (codegen/Source/"
                "depthwise_kernel*_inplace_CHW.c) call arm_nn_requantize without including CMSIS-NN's "
                "arm_nnsupportfunctions.h, where it is a static inline: as generated they do not link; built "
                "with `-include arm_nnsupportfunctions.h`, their code unchanged")

# Runs inside TinyEngine's environment: writes codegen/ for one variant into argv[3] and prints
# what the runner needs (buffers, the input's place, the tensors nothing consumes, patch geometry).
GEN = r"""
import contextlib, io, json, os, sys
sys.path.insert(0, sys.argv[1])
from code_generator.CodeGenerator import CodeGenerator
from code_generator.GeneralMemoryScheduler import GeneralMemoryScheduler
from code_generator.InputResizer import PatchResizer
from code_generator.PatchBasedUtil import getPatchParams
from code_generator.TfliteConvertor import TfliteConvertor

path, out, n, split = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
fpreq, profile = sys.argv[6] == "1", sys.argv[7] == "1"
os.makedirs(out, exist_ok=True); os.chdir(out)
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    conv = TfliteConvertor(path); conv.parseOperatorInfo(); layer = conv.layer
    image = [layer[0].params[k] for k in ("input_h", "input_w", "input_c")]
    pp = None
    if n:
        pp = getPatchParams(layer, split, n)
        PatchResizer(layer).patchResize(pp["layer_cnt"], pp["grain_rf"], pp["grain_rf_height"])
    ms = GeneralMemoryScheduler(layer, False, False, outputTables=[], inplace=True,
                                mem_visual_path=os.path.join(out, "s.png"), VisaulizeTrainable=False)
    ms.USE_INPLACE = True
    ms.allocateMemory()
    consumed = {t.graph_idx for l in layer for t in l.input_tensors}
    sinks = [{"buffer": l._getBufferstr(l.params["output_buf_add"], l.params["output_buf_add_offset"]),
              "shape": [l.params.get("output_h"), l.params.get("output_w"), l.params.get("output_c")]}
             for l in layer for t in l.output_tensors if t.graph_idx not in consumed]
    first = layer[0].params
    info = {"input_output": ms.buffers["input_output"], "peak_mem": ms.peakmem, "im2col": ms.buffers["im2col"],
            "kernel": ms.buffers["kernel"], "image": image,
            "input_buffer": layer[0]._getBufferstr(first["input_buf_add"], first["input_buf_add_offset"]),
            "outputs": sinks, "layers": [[l.params["op"], l.params.get("kernel_h"), l.params.get("stride_h")]
                                         for l in layer]}
    CodeGenerator(memsche=ms, inplace=True, unsigned_input=False, patch_params=pp, FP_output=False,
                  profile_mode=profile, fp_requantize=fpreq, tflite_op=False, dummy_address=False,
                  outputTables=[]).codeGeneration()
print(json.dumps(info, default=int))
"""


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpu-pipeline" / "peers"


def board(core: str):
    """The emulated board of `core` as a Device, and its firmware section."""
    from tpu_pipeline.toolchain.device import load_device, require_firmware

    d = load_device(CORES[core])
    return d, require_firmware(d)


def kernel_flags(core: str) -> list[str]:
    """The flags of the TFLite Micro library (CMSIS-NN kernels included) our firmware links on
    this board: its library CPU profile, -O2, sections; C as the library compiles C."""
    from tpu_pipeline.toolchain.device import CPU_FLAGS
    from tpu_pipeline.toolchain.firmware.library import C_FLAGS, COMMON_FLAGS

    return [*CPU_FLAGS[board(core)[1].library_cpu], *COMMON_FLAGS, *C_FLAGS]


def te_includes(te: Path) -> list[str]:
    cmsis = te / "TinyEngine" / "third_party" / "CMSIS" / "CMSIS"
    return [f"-I{te / 'TinyEngine' / 'include'}", f"-I{cmsis / 'NN' / 'Include'}", f"-I{cmsis / 'DSP' / 'Include'}",
            f"-I{cmsis / 'Core' / 'Include'}"]


def _compile_all(jobs: list[tuple[Path, Path, list[str]]]) -> list[str]:
    """Compile (source, object, flags) two at a time, niced; the failures as 'file: first error'."""
    def one(job):
        src, obj, flags = job
        if obj.exists():
            return None
        obj.parent.mkdir(parents=True, exist_ok=True)
        cc = "arm-none-eabi-g++" if src.suffix == ".cc" else "arm-none-eabi-gcc"
        p = subprocess.run(["nice", "-n", "10", cc, *flags, "-c", str(src), "-o", f"{obj}.tmp"],
                           capture_output=True, text=True)
        if p.returncode:
            err = next((ln for ln in p.stderr.splitlines() if "error" in ln), p.stderr.strip()[:200])
            return f"{src.name}: {err}"
        os.replace(f"{obj}.tmp", obj)
        return None

    with ThreadPoolExecutor(2) as pool:
        return [f for f in pool.map(one, jobs) if f]


def te_library(te: Path, core: str, gen: Path) -> tuple[Path, list[str]]:
    """TinyEngine's kernel library + its CMSIS-NN, compiled once per (checkout, flags, the code
    generator's genInclude.h, which its kernel header includes) into an archive."""
    include = gen / "codegen" / "Include"
    flags = [*kernel_flags(core), *te_includes(te), f"-I{include}"]
    srcs = sorted((te / "TinyEngine" / "src" / "kernels" / "int_forward_op").glob("*.c"))
    srcs += sorted((te / "TinyEngine" / "src" / "kernels" / "fp_requantize_op").glob("*.c"))
    srcs += sorted((te / "TinyEngine" / "src").glob("*.c"))
    srcs += sorted((te / "TinyEngine" / "third_party" / "CMSIS" / "CMSIS" / "NN" / "Source").rglob("*.c"))
    h = hashlib.sha256(" ".join(flags[:-1]).encode() + (include / "genInclude.h").read_bytes())
    for s in srcs:
        h.update(s.read_bytes())
    d = cache_dir() / f"tinyengine-lib-{h.hexdigest()[:16]}"
    lib = d / "libtinyengine.a"
    failed_file = d / "failed.json"
    if lib.exists():
        return lib, json.loads(failed_file.read_text())
    objs = [(s, d / "obj" / f"{i:03d}_{s.stem}.o", flags) for i, s in enumerate(srcs)]
    failed = _compile_all(objs)
    built = [str(o) for _, o, _ in objs if o.exists()]
    subprocess.run(["arm-none-eabi-ar", "rcs", f"{lib}.tmp", *built], check=True)
    failed_file.write_text(json.dumps(failed))
    os.replace(f"{lib}.tmp", lib)
    return lib, failed


def generate(te: Path, model: Path, out: Path, patches: int, split: int, fpreq: bool, profile: bool) -> dict:
    proc = subprocess.run(["nice", "-n", "10", str(peer_python()), "-c", GEN, str(te), str(model), str(out),
                           str(patches), str(split), "1" if fpreq else "0", "1" if profile else "0"],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"TinyEngine's code generator failed on {model.name}: "
                           f"{proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def layer_class(op: str, kernel, stride) -> str:
    """One name per kernel family, shared by TinyEngine's layers and ours."""
    if op in ("CONV_2D", "DEPTHWISE_CONV_2D") and kernel:
        name = "conv" if op == "CONV_2D" else "depthwise"
        return f"{name} 1x1" if kernel == 1 and op == "CONV_2D" else f"{name} {kernel}x{kernel} s{stride}"
    return op.lower()


def our_classes(model_bytes: bytes) -> dict[int, str]:
    """op index -> layer_class of the model the firmware ran (harness twins named by their builtin)."""
    from tpu_pipeline.toolchain.ir import from_model
    from tpu_pipeline.toolchain.tflite import read_model

    g = from_model(read_model(model_bytes))
    out = {}
    for i, op in enumerate(g.ops):
        base = op.opcode.split(":")[-1]
        kind = "DEPTHWISE_CONV_2D" if "DEPTHWISE" in base.upper() else "CONV_2D" if "CONV" in base.upper() else base
        stride = getattr(op.options, "stride_h", None)
        kernel = None
        if kind in ("CONV_2D", "DEPTHWISE_CONV_2D") and len(op.inputs) > 1 and op.inputs[1] >= 0:
            kernel = g.tensors[op.inputs[1]].shape[1]
        out[i] = layer_class(kind, kernel, stride)
    return out


# ---- the int8 reference: the model with int8 I/O, on host TFLite Micro ---------------------------
def int8_reference(model: Path) -> tuple[bytes, np.ndarray, list[np.ndarray]]:
    """(int8-I/O model bytes, the input TinyEngine and TFLite Micro both get, TFLite Micro's outputs)."""
    from tpu_pipeline.toolchain.execute.inputs import input_stream
    from tpu_pipeline.toolchain.execute.tflm import TflmModel
    from tpu_pipeline.toolchain.ir.convert import rewritten_model
    from tpu_pipeline.toolchain.loader import load_exact
    from tpu_pipeline.toolchain.rewrite.interface import int8_io
    from tpu_pipeline.toolchain.tflite import model_to_bytes

    m, graph, _ = load_exact(model, mcu=True)
    graph, _ = graph.with_unique_tensor_names()
    graph, _ = int8_io(graph, str(model))
    data = model_to_bytes(rewritten_model(graph, m))
    host = TflmModel(data, 64 * 1024 * 1024, model.name)
    specs = [(n, shape, dt) for n, (dt, shape) in zip(host.input_names, host.inputs)]
    x = input_stream(specs, 1, seed=0)[0][host.input_names[0]]
    return data, x, host.run([x])


def _offset(buffer: str) -> int:
    m = re.fullmatch(r"&buffer0\[(\d+)\]", buffer)
    if not m:
        raise RuntimeError(f"TinyEngine placed a tensor in {buffer}, not buffer0: the runner reads buffer0 only")
    return int(m.group(1))


def output_places(info: dict, want: list[np.ndarray]) -> list[tuple[int, int]]:
    """(offset in buffer0, bytes) of TinyEngine's tensor for each TFLite Micro output, matched by shape."""
    out = []
    for w in want:
        hits = [o for o in info["outputs"]
                if int(np.prod(o["shape"])) == w.size and o["shape"][-1] == w.shape[-1]]
        if len(hits) != 1:
            raise RuntimeError(f"no single TinyEngine tensor for output shape {w.shape}: {hits}")
        out.append((_offset(hits[0]["buffer"]), w.size))
    return out


def write_input_header(path: Path, x: np.ndarray, patched: bool, input_offset: int, places) -> None:
    body = ", ".join(str(int(v)) for v in x.astype(np.int8).ravel())
    path.write_text("#pragma once\n// Written by tools/bench_mcu_latency.py: the input (host-drawn) and where outputs are.\n"
                    f"#define TE_PATCHED {int(patched)}\n#define TE_INPUT_OFFSET {input_offset}\n"
                    f"#define TE_RUNS {TE_RUNS}\n"
                    "#define TE_OUTPUTS " + ", ".join(f"{{{o}u, {n}u}}" for o, n in places) + "\n"
                    f"static const signed char te_input[{x.size}] = {{{body}}};\n")


# ---- building and running TinyEngine's program ---------------------------------------------------
def build_runner(te: Path, gen: Path, core: str, lib: Path) -> tuple[Path, list[str]]:
    """The ELF of TinyEngine's generated code in `gen` with our runner and board layer."""
    from tpu_pipeline.toolchain.data import FIRMWARE_DIR
    from tpu_pipeline.toolchain.firmware.library import CXX_FLAGS
    from tpu_pipeline.toolchain.firmware.project import project_files

    d, fw = board(core)
    bdir = gen / f"build-{core}"
    bdir.mkdir(exist_ok=True)
    for name, data in project_files(d).items():
        if name != "Makefile":
            (bdir / name).write_bytes(data)
    cpu = list(fw.cpu_flags)
    opt = ["-O2", "-ffunction-sections", "-fdata-sections", "-fno-common"]
    board_inc = [f"-I{bdir}", f"-I{FIRMWARE_DIR / 'harness'}", f"-I{gen}"]
    # profile.h of this folder must shadow TinyEngine's (it needs the STM32 HAL): first on the path
    # TinyEngine's generated integer depthwise kernels call arm_nn_requantize (a static inline of
    # CMSIS-NN's arm_nnsupportfunctions.h) without including it: an implicit declaration that does
    # not link. The header is given to them with -include (NOTE_INCLUDE), their code unchanged.
    gen_flags = [*kernel_flags(core), f"-I{RUNNER}", *te_includes(te), f"-I{gen / 'codegen' / 'Include'}",
                 "-include", "arm_nnsupportfunctions.h"]
    jobs = [(bdir / "startup.c", bdir / "startup.o", [*cpu, *opt, *board_inc, "-std=gnu11"])]
    jobs += [(src, bdir / f"{src.stem}.o", [*cpu, *opt, *board_inc, *CXX_FLAGS])
             for src in (bdir / "platform.cc", bdir / "board_uart.cc", RUNNER / "te_main.cc")]
    jobs += [(src, bdir / f"gen_{src.stem}.o", gen_flags) for src in sorted((gen / "codegen" / "Source").glob("*.c"))]
    failed = _compile_all(jobs)
    if failed:
        raise RuntimeError("TinyEngine's generated code did not compile: " + "; ".join(failed[:3]))
    elf = bdir / "te.elf"
    link = subprocess.run(["arm-none-eabi-g++", *cpu, "-T", str(bdir / "link.ld"), "-Wl,--gc-sections",
                           "--specs=nano.specs", "--specs=nosys.specs", *[str(o) for _, o, _ in jobs],
                           "-Wl,--start-group", str(lib), "-lm", "-lc", "-Wl,--end-group", "-o", str(elf)],
                          capture_output=True, text=True)
    if link.returncode:
        undefined = sorted(set(re.findall(r"undefined reference to `([^']+)'", link.stderr)))
        raise RuntimeError("TinyEngine's program did not link: " + (
            f"undefined {', '.join(undefined[:8])}" if undefined else link.stderr.strip()[-300:]))
    return elf, []


def run_elf(elf: Path, core: str, timeout: float = 3600) -> dict:
    """Boot the ELF in QEMU (-icount shift=0, serial on stdio) and read the runner's lines."""
    from tpu_pipeline.runtime.backends.qemu import ICOUNT_SHIFT, qemu_binary

    _, fw = board(core)
    cmd = ["nice", "-n", "10", qemu_binary(), "-M", fw.qemu_machine, "-nographic", "-monitor", "none",
           "-serial", "stdio", "-icount", f"shift={ICOUNT_SHIFT}", "-kernel", str(elf)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    text, deadline = b"", time.monotonic() + timeout
    try:
        while b"TE END" not in text and b"ERR fault" not in text:
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                break
            if select.select([proc.stdout], [], [], min(left, 1.0))[0]:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                text += chunk
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    lines = text.decode(errors="replace").splitlines()
    if not any(ln.startswith("TE END") for ln in lines):
        raise RuntimeError(f"TinyEngine's program on {fw.qemu_machine} did not finish: {lines[-2:]}")
    per_instr = 1e9 / (fw.core_clock_hz * (1 << ICOUNT_SHIFT))
    runs, outs, layers = {}, {}, []
    for ln in lines:
        parts = ln.split()
        if ln.startswith("TE RUN"):
            runs[int(parts[2])] = round(int(parts[3].split("=")[1]) * per_instr)
            stack = int(parts[4].split("=")[1])  # (the deepest since boot: the last run's is the most)
        elif ln.startswith("TE OUT"):
            outs.setdefault(int(parts[2]), []).append(bytes.fromhex(parts[4]) if len(parts) > 4 else b"")
        elif ln.startswith("TE LAYER"):
            layers.append({"instructions": round(int(parts[2]) * per_instr), "what": " ".join(parts[3:])})
    last = max(runs)
    return {"instructions": runs[last], "runs": [runs[k] for k in sorted(runs)], "outputs": outs[last], "stack": stack,
            "layers": layers[len(layers) // TE_RUNS * (TE_RUNS - 1):] if layers else []}


def compare(got: list[bytes], want: list[np.ndarray]) -> dict:
    equal = total = 0
    worst = 0
    for g, w in zip(got, want):
        a = np.frombuffer(g, dtype=np.int8).astype(np.int32)
        b = w.astype(np.int32).ravel()
        equal += int(np.count_nonzero(a == b))
        total += b.size
        worst = max(worst, int(np.abs(a - b).max()) if b.size else 0)
    return {"identical": equal == total, "elements_equal": equal, "elements": total, "max_abs_diff": worst}


# ---- the rows ------------------------------------------------------------------------------------
def row(model, engine, core, point, instructions, arena, counts, identical, command, **extra) -> dict:
    return {"model": model, "engine": engine, "core": core, "point": point, "instructions": instructions,
            "arena_bytes": arena, "arena_counts": counts, "outputs_identical": identical, "command": command,
            **extra}


TE_COUNTS = ("TinyEngine's static buffer[PEAK_MEM]: activations (its planned peak) + im2col + kernel "
             "buffers; weights and per-layer data in flash; no interpreter{input}")


def tinyengine_rows(te: Path, name: str, plan: dict, cores, work: Path, log) -> tuple[list[dict], dict]:
    """TinyEngine's variants of one model on every core: rows, and its per-layer profile."""
    model = te / "assets" / f"{name}.tflite"
    _, x, want = int8_reference(model)
    best = plan["best_exact"]
    variants = [("whole layers, float requantize (its GenerateSourceFilesFromTFlite)", 0, 0, True),
                ("whole layers, integer requantize", 0, 0, False)]
    if best:
        variants.append((f"patch plan {best['patches']}x{best['patches']} split {best['split']}, integer requantize",
                         best["patches"], best["split"], False))
    rows, profile = [], {}
    cmd = "python tools/bench_mcu_latency.py --tinyengine DIR"
    for label, n, split, fpreq in variants:
        for prof in (False, True) if n == 0 else (False,):
            gen = work / f"{name}-{n}-{split}-{int(fpreq)}-{int(prof)}"
            info = generate(te, model, gen, n, split, fpreq, prof)
            write_input_header(gen / "te_input.h", x, n > 0, _offset(info["input_buffer"]), output_places(info, want))
            for core in cores:
                lib, failed = te_library(te, core, gen)
                try:
                    elf, _ = build_runner(te, gen, core, lib)
                    r = run_elf(elf, core)
                except RuntimeError as exc:  # a TinyEngine program that fails is a row saying so
                    rows.append(row(name, "tinyengine", core, label + (" (profile)" if prof else ""), None,
                                    info["peak_mem"], "-", None, cmd, error=str(exc), library_not_built=failed))
                    log(rows[-1])
                    continue
                if prof:
                    classes = [layer_class(*lay) for lay in info["layers"]]
                    profile[(core, label)] = [{"class": c, **lay} for c, lay in zip(classes, r["layers"])]
                    continue
                cmp = compare(r["outputs"], want)
                counts = TE_COUNTS.format(input=", the input image in the application's buffer" if n else "")
                rows.append(row(name, "tinyengine", core, label, r["instructions"], info["peak_mem"], counts,
                                cmp["identical"], cmd, activations_bytes=info["input_output"], match=cmp,
                                stack_bytes=r["stack"],
                                library_not_built=failed))
                log(rows[-1])
    return rows, profile


def qemu_row(path: Path, name: str, engine: str, core: str, point: str, counts: str, command: str, log) -> dict:
    from tpu_pipeline.runtime.backends.qemu import run_on_qemu

    from tpu_pipeline.toolchain.device import kernel_set

    q = run_on_qemu(path, board(core)[0], kernel_set("cmsis-nn"), iterations=1, quiet=True, timeout=3600)
    classes = our_classes(Path(q.model).read_bytes())
    layers = [{"class": classes.get(o["index"], o["opcode"].lower()), **o} for o in q.op_instructions]
    r = row(name, engine, core, point, q.instructions, q.arena_used_bytes, counts, q.outputs_match, command,
            head_bytes=q.head_bytes, tail_bytes=q.tail_bytes, stack_bytes=q.stack_used_bytes, layers=layers,
            error=q.error)
    log({k: v for k, v in r.items() if k != "layers"})
    return r


OURS_COUNTS = ("TFLite Micro's whole arena measured on the board: arena_used_bytes = head (activations, "
               "scratch) + persistent tail (interpreter structs){input}")


def fitted(path: Path, work: Path, label: str, time_limit: float, **options) -> Path | None:
    from tpu_pipeline.toolchain.device import CMSIS_NN
    from tpu_pipeline.toolchain.fit import fit_model

    from tpu_pipeline.toolchain.device import load_device

    if isinstance(options.get("device"), str):  # (a board's name: fit_model takes the Device)
        options = {**options, "device": load_device(options["device"])}
    f = fit_model(path, kernels=CMSIS_NN, time_limit=time_limit, **options)
    if not f.result.fits:
        return None
    out = work / f"{path.stem}_{label}.tflite"
    out.write_bytes(f.data)
    return out


def our_rows(path: Path, name: str, budget: int | None, cores, work: Path, time_limit: float, log,
             tinyengine_io: bool) -> list[dict]:
    """The model as converted on stock TFLite Micro + CMSIS-NN, and fit's points, on every core."""
    tl = f" --time-limit {time_limit:g}"
    io = dict(int8_io=True, input_outside_arena=True) if tinyengine_io else {}
    io_flags = " --int8-io --input-outside-arena" if tinyengine_io else ""
    # every point is fitted for the board, so its flash bounds the re-laid weights too (mcunetv2_large's
    # fastest kernels' weights take 6.0 MB against the an386's 4 MB)
    board = dict(device=CORES["an386"], **io)
    points = [("fastest (the board's SRAM)", board, f"--device {CORES['an386']}")]
    if tinyengine_io:
        points += [(f"at TinyEngine's best patched peak ({budget:,} B)", dict(budget=budget, **board),
                    f"--budget {budget} --device {CORES['an386']}"),
                   ("smallest (--objective memory)", dict(objective="memory", **board),
                    f"--objective memory --device {CORES['an386']}")]
    rows = [qemu_row(path, name, "tflm-builtin", core, "as converted", OURS_COUNTS.format(input=", input inside"),
                     f"tpu-pipeline run MODEL --backend qemu --device {CORES[core]} --json", log) for core in cores]
    for label, options, flags in points:
        f = fitted(path, work, re.sub(r"\W+", "_", label)[:20], time_limit, **options)
        fit_cmd = f"tpu-pipeline fit MODEL {flags}{io_flags}{tl} -o FIT.tflite"
        for core in cores:
            if f is None:
                rows.append(row(name, "tpu-pipeline", core, label, None, None, "does not fit", None, fit_cmd))
                continue
            inp = ", the input in the application's buffer" if tinyengine_io else ", input inside"
            rows.append(qemu_row(f, name, "tpu-pipeline", core, label, OURS_COUNTS.format(input=inp),
                                 f"{fit_cmd}; tpu-pipeline run FIT.tflite --backend qemu --device {CORES[core]} --json",
                                 log))
    return rows


def reused_tinyengine_rows(earlier: list[dict], name: str, cores) -> list[dict]:
    """TinyEngine's rows of `name` from an earlier run, each marked `reused_from` (that run's stamp;
    "before run stamps" for rows written before rows carried one)."""
    rows = [{**r, "reused_from": r.get("reused_from") or r.get("run") or "before run stamps"}
            for r in earlier if r["model"] == name and r["engine"] == "tinyengine" and r["core"] in cores]
    if not rows or "plan" not in rows[0]:
        raise SystemExit(f"--reuse-tinyengine: docs/bench/mcu_latency.json has no TinyEngine rows of {name}")
    return rows


def by_class(layers: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for lay in layers:
        out[lay["class"]] = out.get(lay["class"], 0) + lay["instructions"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="models", help="(unused: TinyEngine's and MLPerf Tiny's models are given)")
    ap.add_argument("--tinyengine", help="a checkout of mit-han-lab/tinyengine (with its CMSIS submodule)")
    ap.add_argument("--mlperf", help="a folder with MLPerf Tiny's four int8 .tflite models")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds for each fit's search (default 60)")
    ap.add_argument("--only", nargs="+", help="models to run (default: TinyEngine's three and MLPerf's four)")
    ap.add_argument("--cores", nargs="+", choices=sorted(CORES), default=sorted(CORES))
    ap.add_argument("--render", action="store_true", help="only rewrite the .md from docs/bench/mcu_latency.json")
    ap.add_argument("--reuse-tinyengine", action="store_true",
                    help="measure only our rows; TinyEngine's rows (and its plan's peak) are taken from "
                         "docs/bench/mcu_latency.json and marked as reused from the run that measured them "
                         "(a quick check while changing our kernels: final figures come from a full run)")
    args = ap.parse_args()
    if args.render:
        write_page(json.loads(OUT.with_suffix(".json").read_text()))
        return 0
    te = find_tinyengine(args.tinyengine)
    mlperf = Path(args.mlperf or os.environ.get("TPUP_MLPERF_DIR") or REPO.parent / "peers" / "mlperf-tiny")
    if te is None:
        print("TinyEngine not found: pass --tinyengine DIR or set TINYENGINE_DIR; the section is left as it is",
              file=sys.stderr)
        return 0
    if not (te / "TinyEngine" / "third_party" / "CMSIS" / "CMSIS" / "NN" / "Include").is_dir():
        print(f"{te}: TinyEngine/third_party/CMSIS (its CMSIS_5 submodule) is empty: check it out "
              "(git submodule update --init)", file=sys.stderr)
        return 2
    jpath = OUT.with_suffix(".json")
    earlier = json.loads(jpath.read_text()) if jpath.exists() else []
    rows = [r for r in earlier if args.only and r["model"] not in args.only]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    log = lambda r: print(json.dumps({k: v for k, v in r.items() if k not in ("layers", "command")}), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in MODELS:
            if args.only and name not in args.only:
                continue
            if args.reuse_tinyengine:
                te_rows = reused_tinyengine_rows(earlier, name, args.cores)
                plan = te_rows[0]["plan"]
            else:
                print(f"== {name}: TinyEngine's patch plans", flush=True)
                plan = run_peer(te, te / "assets" / f"{name}.tflite")
                te_rows, profile = tinyengine_rows(te, name, plan, args.cores, work, log)
                for r in te_rows:
                    if (r["core"], r["point"]) in profile:
                        r["layers"] = profile[(r["core"], r["point"])]
                    r["plan"], r["run"] = plan, stamp
            rows += te_rows
            rows += [{**r, "run": stamp} for r in our_rows(te / "assets" / f"{name}.tflite", name, plan["best"]["peak"],
                                                            args.cores, work, args.time_limit, log, tinyengine_io=True)]
            jpath.write_text(json.dumps(rows, indent=1) + "\n")
        for name in MLPERF:
            path = mlperf / f"{name}.tflite"
            if (args.only and name not in args.only) or not path.exists():
                continue
            print(f"== {name}", flush=True)
            rows += [{**r, "run": stamp} for r in our_rows(path, name, None, args.cores, work, args.time_limit, log,
                                                            tinyengine_io=False)]
            jpath.write_text(json.dumps(rows, indent=1) + "\n")
    write_page(rows)
    return 0


def _n(x) -> str:
    return "-" if x is None else f"{x:,}"


def render(rows: list[dict]) -> str:
    cmd = "python tools/bench_mcu_latency.py --tinyengine DIR --mlperf DIR"
    lines = ["## MCU latency, measured side by side with TinyEngine", "",
             f"Command: `{cmd}` (the script's docstring says how each side is built and counted; every figure "
             "of a model is measured in the same run as its peers). Instructions per inference under QEMU "
             "`-icount shift=0` (SysTick x 40, as the harness counts), not a real board's cycles. Ratio: "
             "instructions / TinyEngine's whole-layer code as its GenerateSourceFilesFromTFlite writes it (float "
             "requantization, its fastest variant) on the same core. "
             "Outputs identical: int8 outputs equal, element for element, to host TFLite Micro's (the wheel) "
             "on the same input (TinyEngine: the model with int8 I/O; ours: the model the firmware ran). "
             "Stack: the deepest the stack went in the run, measured the same way for every engine (the board "
             "layer paints the stack at reset; the bytes from the top of RAM down to the deepest word written), "
             "outside the arena on both sides.", "",
             "| model | engine | core | point | instructions | ratio vs TinyEngine | whole arena (B) "
             "| what the arena counts | stack (B) | outputs identical |", "|---|---|---|---|---:|---:|---:|---|---:|---|"]
    base = {(r["model"], r["core"]): r["instructions"] for r in rows if r["engine"] == "tinyengine"
            and r["point"].startswith("whole layers, float") and r["instructions"]}
    conv = {(r["model"], r["core"]): r["instructions"] for r in rows if r["engine"] == "tflm-builtin"}
    for r in rows:
        ref = base.get((r["model"], r["core"]))
        ratio = f"{r['instructions'] / ref:.2f}x" if ref and r["instructions"] else "-"
        if ref is None and r["engine"] == "tpu-pipeline" and conv.get((r["model"], r["core"])) and r["instructions"]:
            ratio = f"{r['instructions'] / conv[(r['model'], r['core'])]:.2f}x of as converted"
        ident = r["outputs_identical"]
        if r.get("error") and r["instructions"] is None:
            ident = f"not measured: {r['error']}"
        if r.get("match") and not ident:
            m = r["match"]
            ident = f"no: {m['elements_equal']:,}/{m['elements']:,} equal, max diff {m['max_abs_diff']}"
        point = r["point"] + (f" (reused from run {r['reused_from']}: not measured beside ours)"
                              if r.get("reused_from") else "")
        lines.append(f"| {r['model']} | {r['engine']} | {r['core']} | {point} | {_n(r['instructions'])} | {ratio} "
                     f"| {_n(r['arena_bytes'])} | {r['arena_counts']} | {_n(r.get('stack_bytes'))} | {ident} |")
    lines += ["", "TinyEngine build notes: " + NOTE_INCLUDE + ". Its patch plan is the smallest peak of "
              "tools/bench_tinyengine.py's search whose generated loop tiles the image exactly; plans whose "
              "tiles overrun the image (e.g. vww's 3x3 at split 14, the figure docs/bench/tinyengine.md quotes) "
              "are a memory figure, not a runnable program."]
    lines += ["", "### Per layer type (instructions summed over the layers of each type)", "",
              "TinyEngine whole layers in its profile mode (per-layer ticks; totals above come from the plain "
              "build), float and integer requantization, against the model as converted on TFLite Micro + "
              "CMSIS-NN and fit's fastest point (harness kernels); ratio = ours / TinyEngine's float-requantize "
              "layers, else its integer ones.", "",
              "| model | core | layer type | TinyEngine float req. | TinyEngine integer req. | as converted (ratio) "
              "| fit fastest (ratio) |", "|---|---|---|---:|---:|---:|---:|"]

    def pick(model, core, engine, prefix):
        return next((r for r in rows if r["model"] == model and r["core"] == core and r["engine"] == engine
                     and r["point"].startswith(prefix)), {})

    for model, core in sorted({(r["model"], r["core"]) for r in rows if r["engine"] == "tinyengine"}):
        tf = by_class(pick(model, core, "tinyengine", "whole layers, float").get("layers", []))
        ti = by_class(pick(model, core, "tinyengine", "whole layers, integer").get("layers", []))
        o = by_class(pick(model, core, "tflm-builtin", "as converted").get("layers", []))
        f = by_class(pick(model, core, "tpu-pipeline", "fastest").get("layers", []))
        t = {**ti, **tf} if tf else ti
        for c in sorted(set(t) | set(o) | set(f), key=lambda c: -max(t.get(c, 0), o.get(c, 0))):
            def cell(d):
                return "-" if c not in d else f"{d[c]:,}" + (f" ({d[c] / t[c]:.2f}x)" if t.get(c) else "")
            lines.append(f"| {model} | {core} | {c} | {_n(tf.get(c))} | {_n(ti.get(c))} | {cell(o)} | {cell(f)} |")
    return "\n".join(lines) + "\n"


def write_page(rows: list[dict]) -> None:
    """docs/bench/mcu_latency.md: the tables, then the figure (its SVG files and HTML page beside it)."""
    OUT.write_text(render(rows) + "\n".join(mcu_latency_figure.write(rows, OUT.parent)) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())

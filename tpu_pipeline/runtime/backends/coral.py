"""Coral Edge TPUs: enumerate them (USB and PCIe), run one LiteRT interpreter per segment with
libedgetpu's delegate, pycoral's PipelinedModelRunner when it happens to be importable.

Without hardware this fails fast with a DeviceError saying what was looked for; it never waits
on a device that is not there (loading the delegate runs under a deadline).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from tpu_pipeline.runtime.backends.common import Backend, RunRequest, litert_stage, measure_stages
from tpu_pipeline.runtime.deployment import Deployment
from tpu_pipeline.runtime.measure import RunReport
from tpu_pipeline.toolchain.device import Device
from tpu_pipeline.toolchain.errors import DeviceError, UsageError
from tpu_pipeline.toolchain.manifest import inside

# (vendor, product): the USB Accelerator before its firmware is loaded, and after.
USB_IDS = {("1a6e", "089a"): "Coral USB Accelerator (bootloader)", ("18d1", "9302"): "Coral USB Accelerator"}
LIBEDGETPU = "libedgetpu.so.1"


@dataclass(frozen=True)
class EdgeTpu:
    kind: str  # usb | pci
    id: str  # what the delegate's "device" option takes: usb:0, pci:0
    path: str  # sysfs directory or /dev node
    name: str


def list_edgetpus(sysfs_usb: str = "/sys/bus/usb/devices", dev: str = "/dev") -> list[EdgeTpu]:
    """Edge TPUs visible to this host, USB first then PCIe, in a stable order."""
    found = []
    root = Path(sysfs_usb)
    usb = 0
    if root.is_dir():
        for d in sorted(root.iterdir()):
            try:
                vid = (d / "idVendor").read_text().strip().lower()
                pid = (d / "idProduct").read_text().strip().lower()
            except OSError:
                continue
            if (vid, pid) in USB_IDS:
                found.append(EdgeTpu("usb", f"usb:{usb}", str(d), USB_IDS[(vid, pid)]))
                usb += 1
    elif shutil.which("lsusb"):  # no sysfs (a container, say): ask lsusb
        try:
            text = subprocess.run(["lsusb"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.TimeoutExpired):
            text = ""
        for line in text.splitlines():
            m = re.search(r"ID ([0-9a-fA-F]{4}):([0-9a-fA-F]{4})", line)
            if m and (m[1].lower(), m[2].lower()) in USB_IDS:
                found.append(EdgeTpu("usb", f"usb:{usb}", line.split(":")[0], USB_IDS[(m[1].lower(), m[2].lower())]))
                usb += 1
    pci = sorted(p for p in Path(dev).glob("apex_*") if p.name[5:].isdigit()) if Path(dev).is_dir() else []
    for k, p in enumerate(sorted(pci, key=lambda p: int(p.name[5:]))):
        found.append(EdgeTpu("pci", f"pci:{k}", str(p), "Coral PCIe/M.2 Edge TPU"))
    return found


def libedgetpu_available() -> bool:
    try:
        ctypes.CDLL(LIBEDGETPU)
        return True
    except OSError:
        return ctypes.util.find_library("edgetpu") is not None


def coral_readiness(dep: Deployment | None = None) -> tuple[bool, str]:
    tpus = list_edgetpus()
    if not tpus:
        return False, "no Edge TPU found (no USB 1a6e:089a / 18d1:9302 device, no /dev/apex_*)"
    if not libedgetpu_available():
        return False, f"{len(tpus)} Edge TPU(s) found but {LIBEDGETPU} is not installed"
    if dep is not None:
        if len(tpus) < len(dep.segments):
            return False, f"{len(dep.segments)} segments need {len(dep.segments)} Edge TPUs, {len(tpus)} found"
        if not all(s.edgetpu_path.is_file() for s in dep.segments):
            return False, "segments are not compiled for the Edge TPU (no *_edgetpu.tflite; edgetpu_compiler not run)"
    return True, f"{len(tpus)} Edge TPU(s): " + ", ".join(t.id for t in tpus)


class CoralBackend(Backend):
    name = "coral"
    kinds = ("edgetpu",)
    power_meter = True  # the meter sits on the accelerator's (or the hub's) USB cable

    def readiness(self, port=None, deployment=None) -> tuple[bool, str]:
        return coral_readiness(deployment)

    def run(self, request: RunRequest, progress=None, power=None) -> RunReport:
        r = request
        return run_coral(r.deployment, r.device, r.iterations, r.warmup, r.seed, progress, r.timeout, power)


def _load_delegate(device_id: str, timeout: float):
    from ai_edge_litert.interpreter import load_delegate

    box: dict = {}

    def load():
        try:
            box["delegate"] = load_delegate(LIBEDGETPU, {"device": device_id})
        except (ValueError, OSError, RuntimeError) as exc:
            box["error"] = exc

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise DeviceError(f"Edge TPU {device_id}: the delegate did not load within {timeout:g} s")
    if "error" in box:
        raise DeviceError(f"Edge TPU {device_id}: {LIBEDGETPU} failed to open it ({box['error']})")
    return box["delegate"]


def run_coral(dep: Deployment, device: Device, iterations: int = 100, warmup: int = 5, seed: int = 0,
              progress=None, timeout: float = 10.0, power=None) -> RunReport:
    """`device`: the Edge TPU's descriptor (its cost model, its idle power); `power`: a
    PowerRecorder (not started) sampling the accelerators' USB power during the run."""
    tpus = list_edgetpus()
    if not tpus:
        raise DeviceError("no Edge TPU found (looked for USB 1a6e:089a / 18d1:9302 in /sys/bus/usb/devices "
                          "and PCIe /dev/apex_*); use --backend emulator")
    if len(tpus) < len(dep.segments):
        raise DeviceError(f"{dep.source}: {len(dep.segments)} segments need {len(dep.segments)} Edge TPUs; "
                          f"found {len(tpus)} ({', '.join(t.id for t in tpus)})")
    if not libedgetpu_available():
        raise DeviceError(f"{LIBEDGETPU} is not installed (Coral's runtime library); use --backend emulator")
    files = []
    for s in dep.segments:
        if dep.source.is_dir():  # a link named like a compiled segment must not lead out of the folder
            inside(dep.source, s.edgetpu_path.name, str(dep.source), "Edge TPU segment")
        if not s.edgetpu_path.is_file():
            raise UsageError(f"{s.edgetpu_path}: missing; compile the segments with edgetpu_compiler "
                             f"(`edgetpu_compiler --num_segments={len(dep.segments)}`) first")
        files.append(s.edgetpu_path)
    from tpu_pipeline.toolchain.execute.litert import new_interpreter

    interps = []
    for f, tpu in zip(files, tpus):
        delegate = _load_delegate(tpu.id, timeout)
        try:
            it = new_interpreter(f, builtin_only=False, delegates=[delegate], num_threads=None)
        except ValueError as exc:
            raise DeviceError(f"{f}: cannot run on {tpu.id} ({exc})") from None
        interps.append(it)
    stages = [litert_stage(f.name, it, s.inputs, s.outputs) for f, it, s in zip(files, interps, dep.segments)]
    recorder = power.start() if power is not None else None
    try:
        report = measure_stages(dep, stages, interps, "coral", ", ".join(t.id for t in tpus[: len(files)]),
                                iterations, warmup, seed, reference_interp=None, progress=progress, timeout=timeout)
    finally:
        summary = recorder.stop() if recorder is not None else None
    if summary is not None:
        idle = device.power.idle_w
        # warm-up, the sequential pass and the pipelined pass all ran while the meter sampled
        report.energy = summary.to_json(warmup + 2 * iterations, idle)
    report.notes.append("outputs come from the Edge TPU; they are compared with nothing (quantized TPU kernels "
                        "may differ from the CPU by rounding)")
    throughput = _pycoral_throughput(interps, dep, iterations, seed, timeout)
    if throughput is not None:
        report.notes.append(f"pycoral PipelinedModelRunner: {throughput:.1f} inferences/s "
                            f"(our runner: {report.throughput_per_s or 0:.1f})")
        report.throughput_per_s = throughput
    from tpu_pipeline.runtime.backends.emulator import predict_edgetpu

    report.predicted = predict_edgetpu(dep, device)
    return report


def _pycoral_throughput(interps, dep: Deployment, iterations: int, seed: int, timeout: float) -> float | None:
    """Throughput through pycoral's own PipelinedModelRunner, or None when pycoral is absent."""
    try:
        from pycoral.pipeline.pipelined_model_runner import PipelinedModelRunner  # type: ignore
    except ImportError:  # pycoral is an optional third-party package (Coral's own runtime)
        return None
    import time

    from tpu_pipeline.runtime.backends.common import input_specs
    from tpu_pipeline.toolchain.execute.inputs import input_stream

    specs = input_specs([], interps, dep.graph_inputs)
    data = input_stream(specs, iterations, seed)
    runner = PipelinedModelRunner(interps)
    errors: list[BaseException] = []

    def feed():
        try:
            for x in data:
                if not runner.push(x):
                    return
            runner.push({})
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t0 = time.perf_counter()
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    n = 0
    while runner.pop() is not None:
        n += 1
        if time.perf_counter() - t0 > timeout * max(1, iterations):
            raise DeviceError("pycoral's pipeline stopped producing results")
    feeder.join(timeout)
    if errors:
        raise DeviceError(f"pycoral's pipeline failed: {errors[0]}")
    wall = time.perf_counter() - t0
    return n / wall if n and wall > 0 else None

"""The harness's direct convolution (custom op TPUP_CONV_2D_DIRECT, harness/direct_conv.cc) on the
emulated board: a model that picks it per op runs bit-identical to the host's TFLite Micro (which
runs the builtin view), the firmware's head and tail equal the 32-bit target model, and it frees
the im2col buffer CMSIS-NN's convolution asks for. Needs the ARM toolchain, QEMU and a TFLite
Micro tree (skips without them, as tests/test_firmware.py does)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import struct
import time
from pathlib import Path

import pytest

from cnn_builder import CnnBuilder
from test_firmware import HAVE_ARM, HAVE_QEMU, needs_arm, needs_qemu, tree_or_skip
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.export_mcu import export_mcu, resolver_method
from tpu_pipeline.toolchain.ir import from_model
from tpu_pipeline.toolchain.ir.convert import to_model
from tpu_pipeline.toolchain.ir.kernels import DIRECT_CONV_CODE, with_kernel
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.memory.tflm_target import target_arena, target_tail
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model
from tpu_pipeline.toolchain.tflite.metadata import read_offline_plan

BOARD = "qemu-mps2-an386"


def _cnn():
    """(graph, model bytes, direct positions): 3x3 convs with SAME/VALID, stride 2, dilation 2,
    relu6/relu/none, one without a bias, a depthwise; the first conv's im2col buffer sits at the peak."""
    b = CnnBuilder(seed=11)
    x = b.input((1, 16, 16, 8))
    c0 = b.conv(x, 16, k=3, padding="SAME", act="RELU6")  # 2 KiB in + 4 KiB out: the peak
    c1 = b.conv(c0, 8, k=3, stride=2, padding="SAME")
    b.ops[-1] = dataclasses.replace(b.ops[-1], inputs=(*b.ops[-1].inputs[:2], -1))  # no bias
    d = b.dw(c1, k=3, act="RELU6")
    c2 = b.conv(d, 8, k=3, padding="SAME", act="RELU")  # stays on the kernel set's own
    c3 = b.conv(c2, 6, k=3, padding="VALID", dilation=2, act="RELU")
    g = b.graph([c3])
    convs = [i for i, op in enumerate(g.ops) if op.opcode == "CONV_2D"]
    return g, b.model_bytes([c3]), [convs[0], convs[1], convs[3]]


def _direct(g, data: bytes, positions) -> bytes:
    return model_to_bytes(to_model(with_kernel(g, positions), read_model(data)))


# ---- no toolchain needed ----------------------------------------------------------------------
def test_export_registers_the_direct_kernel_as_its_own_op(tmp_path):
    g, src, direct = _cnn()
    r = export_mcu("cnn.tflite", BOARD, tmp_path, model_data=_direct(g, src, direct))
    assert r.ops == (DIRECT_CONV_CODE, "DEPTHWISE_CONV_2D", "CONV_2D")
    h = (tmp_path / "op_resolver.h").read_text()
    assert "kHarnessNumOps = 3;" in h and '#include "direct_conv.h"' in h
    assert "(resolver.AddCustom(tpup::kDirectConvName, tpup::Register_CONV_2D_DIRECT()));" in h
    assert "(resolver.AddConv2D());" in h and "(resolver.AddDepthwiseConv2D());" in h
    assert {"direct_conv.cc", "direct_conv.h"} <= set(r.files)
    # every conv direct: CONV_2D itself is not registered
    convs = [i for i, op in enumerate(g.ops) if op.opcode == "CONV_2D"]
    r = export_mcu("cnn.tflite", BOARD, tmp_path / "all", model_data=_direct(g, src, convs))
    assert r.ops == (DIRECT_CONV_CODE, "DEPTHWISE_CONV_2D")
    assert "AddConv2D" not in (tmp_path / "all" / "op_resolver.h").read_text()
    with pytest.raises(UsageError, match="custom op 'CUSTOM:OTHER'"):
        resolver_method("CUSTOM:OTHER")  # any other custom op still has no kernel


def test_the_direct_op_tail_has_no_builtin_data_and_its_own_op_data():
    g, _, direct = _cnn()
    dg = with_kernel(g, direct[:1])
    for kernels in ("reference", "cmsis-nn"):
        allocs = {what: size for what, size, _ in target_tail(dg, kernels).allocations}
        assert "op 0 CONV_2D builtin data" not in allocs and allocs["op 0 CONV_2D OpData"] == 84
        assert allocs["op 0 CONV_2D per-channel"] == 16 * 4
        assert "op 1 CONV_2D builtin data" in allocs  # the builtin conv keeps its own
    asked = [pos for pos, _ in target_arena(g, "cmsis-nn").scratch]
    assert 0 in asked and 0 not in [pos for pos, _ in target_arena(dg, "cmsis-nn").scratch]


# ---- on the emulated board --------------------------------------------------------------------
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    if not (HAVE_ARM and HAVE_QEMU):
        pytest.skip("ARM toolchain or QEMU not installed (.ci/run installs them)")
    root = tmp_path_factory.mktemp("direct")
    g, src, direct = _cnn()
    (root / "builtin.tflite").write_bytes(src)
    (root / "direct.tflite").write_bytes(_direct(g, src, direct))
    return root, g, direct


def _run(path, kernels):
    from tpu_pipeline.runtime.backends.qemu import run_on_qemu
    from tpu_pipeline.toolchain.firmware.library import LibraryBusy

    tree_or_skip(kernels)
    try:
        return run_on_qemu(path, BOARD, kernels, iterations=2, seed=7)
    except LibraryBusy as exc:
        pytest.skip(str(exc))


def _check_target_model(r, direct):
    """Bit-identical to the host, the direct kernel really ran, head and tail as predicted."""
    assert r.error is None and r.outputs_match is True, r.output_differences
    assert [o["index"] for o in r.op_instructions if o["opcode"] == DIRECT_CONV_CODE] == direct
    model = read_model(Path(r.elf).parents[2] / "model.tflite")  # the project's (offline plan inside)
    graph = from_model(model)
    assert sorted(i for i, op in enumerate(graph.ops) if op.kernel) == direct
    predicted = target_arena(graph, r.kernels, read_offline_plan(model))
    assert (predicted.head, predicted.tail) == (r.head_bytes, r.tail_bytes)
    assert r.arena_used_bytes == predicted.total


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels", ["reference", "cmsis-nn"])
def test_direct_convs_run_in_qemu_as_the_host_runs_the_builtin_view(models, kernels):
    root, _, direct = models
    _check_target_model(_run(root / "direct.tflite", kernels), direct)


@needs_arm
@needs_qemu
def test_the_direct_kernel_frees_the_im2col_buffer_at_the_peak(models):
    root, g, direct = models
    im2col = scratch_requests(g, 0, get_semantics("tflm-cmsis-nn"))
    assert len(im2col) == 1 and im2col[0] > 0
    builtin = _run(root / "builtin.tflite", "cmsis-nn")
    assert builtin.outputs_match is True and (builtin.head_bytes, builtin.tail_bytes) == (
        builtin.head_predicted, builtin.tail_predicted)
    d = _run(root / "direct.tflite", "cmsis-nn")
    assert d.outputs_match is True and builtin.head_bytes - d.head_bytes == -(-im2col[0] // 16) * 16


@needs_arm
@needs_qemu
def test_malformed_options_stop_the_firmware_with_its_message(models, tmp_path):
    from tpu_pipeline.runtime import protocol as P
    from tpu_pipeline.runtime.backends.qemu import QemuBoard, project_dir
    from tpu_pipeline.runtime.serial_mcu import SerialMcu
    from tpu_pipeline.toolchain.export_mcu import c_array
    from tpu_pipeline.toolchain.firmware.build import build_firmware
    from tpu_pipeline.toolchain.firmware.library import LibraryBusy

    root, _, direct = models
    tree_or_skip("reference")
    export_mcu(root / "direct.tflite", BOARD, tmp_path)
    model = read_model(tmp_path / "model.tflite")
    ops = model.subgraphs[0].operators
    ops[direct[0]].customOptions = list(bytes(ops[direct[0]].customOptions)[:27])  # one byte short
    bad = bytearray(bytes(ops[direct[1]].customOptions))
    bad[4:8] = struct.pack("<i", 9)  # padding 9: neither SAME nor VALID
    ops[direct[1]].customOptions = list(bad)
    data = model_to_bytes(model)
    # export-mcu refuses such a model: the project is the good one's with the bad model swapped in,
    # kept in the firmware cache under the bad model's key so later sessions only run make
    project = project_dir(data, BOARD)
    if not (project / "export.json").is_file():
        (tmp_path / "model_data.cc").write_text(c_array(data, "g_model_data"))
        (tmp_path / "model.tflite").write_bytes(data)
        project.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(tmp_path, f"{project}.tmp{os.getpid()}", dirs_exist_ok=True)
        os.replace(f"{project}.tmp{os.getpid()}", project)
    try:
        b = build_firmware(project, "reference", quiet=True, wait=False)
    except LibraryBusy as exc:
        pytest.skip(str(exc))
    logs, err = [], None
    with QemuBoard(b.elf, "mps2-an386") as board, SerialMcu(board.port, 115200, timeout=10) as mcu:
        mcu._buf = b""
        mcu._write(P.encode("RESET"))  # boots again while we listen: BOOT, LOG ..., ERR
        deadline = time.monotonic() + 10
        while err is None:
            msg = mcu._readline(deadline, "ERR")
            if msg.kind == "LOG":
                logs.append(" ".join(msg.fields))
            elif msg.kind == "ERR":
                err = " ".join(msg.fields)
    assert "AllocateTensors failed" in err
    assert any("TPUP_CONV_2D_DIRECT: 27 bytes of options, expected 28" in line for line in logs), logs
    assert any("TPUP_CONV_2D_DIRECT: invalid options [" in line for line in logs), logs


@pytest.mark.slow
@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels", ["reference", "cmsis-nn"])
def test_a_zoo_model_with_every_convolution_direct(tmp_path, kernels):
    """MobileNetV1 0.25 96x96 int8 (tools/build_zoo.py) with all 15 convolutions (the 3x3 stem and
    the 1x1 pointwise ones) on the direct kernel: ~40 s per kernel set."""
    from tpu_pipeline.toolchain.ir.kernels import can_run_direct

    src = Path(__file__).resolve().parent.parent / "models" / "mobilenet_v1_025_96_int8.tflite"
    if not src.is_file():
        pytest.skip("the zoo is not built (tools/build_zoo.py --out models)")
    model = read_model(src)
    g = from_model(model)
    direct = [i for i in range(len(g.ops)) if can_run_direct(g, i)]
    assert len(direct) == 15
    (tmp_path / "m.tflite").write_bytes(model_to_bytes(to_model(with_kernel(g, direct), model)))
    _check_target_model(_run(tmp_path / "m.tflite", kernels), direct)


@needs_arm
@needs_qemu
def test_the_direct_kernel_costs_what_the_reference_convolution_costs(models):
    """tpu_pipeline.toolchain.cost.mcu prices a direct op with the reference kernels' coefficients: on the
    board it takes the reference build's CONV_2D instructions, within 1 %."""
    root, _, direct = models
    ref = {o["index"]: o["instructions"] for o in _run(root / "builtin.tflite", "reference").op_instructions}
    got = {o["index"]: o["instructions"] for o in _run(root / "direct.tflite", "cmsis-nn").op_instructions}
    for i in direct:
        assert abs(got[i] - ref[i]) <= 0.01 * ref[i], (i, got[i], ref[i])

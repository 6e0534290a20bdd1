"""The harness's convolutions (tpu_pipeline.toolchain.ir.kernels, harness/tpup_conv.cc) on the
emulated board: a model that picks them per op (CMSIS-NN path, direct, folded padding, overlapped
output over input) runs bit-identical to the host's TFLite Micro (which runs the builtin view),
and the firmware's head and tail equal the 32-bit target model's prediction. Needs the ARM
toolchain, QEMU and a TFLite Micro tree (skips without them, as tests/test_firmware.py does)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import struct
import time
from pathlib import Path

import pytest

from helpers.cnn_builder import CnnBuilder
from helpers.firmware import HAVE_ARM, HAVE_QEMU, exported_arena, exported_model, needs_arm, needs_qemu, tree_or_skip
from tpu_pipeline.toolchain.device import REFERENCE, kernel_set, load_device
from tpu_pipeline.toolchain.export_mcu import export_mcu
from tpu_pipeline.toolchain.ir import from_model, kernels, overlap
from tpu_pipeline.toolchain.ir.convert import to_model
from tpu_pipeline.toolchain.ir.kernels import DIRECT, OVERLAP, kernel_name, with_kernel
from tpu_pipeline.toolchain.memory.lifetimes import lifetimes
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.memory.tflm_target import target_arena
from tpu_pipeline.toolchain.rewrite.fold_pad import fold_pads
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model
from tpu_pipeline.toolchain.tflite.metadata import read_offline_plan

BOARD = load_device("qemu-mps2-an386")


def _cnn():
    """(graph on harness kernels, model bytes, the harness op positions). A stem conv (CMSIS-NN
    path), a PyTorch-style symmetric PAD + stride-2 depthwise (folds into explicit padding; direct), an
    inverted-residual chain overlapped in place (1x1 expand, 3x3 depthwise, 1x1 project, then a 3x3
    expansion, whose rows run last to first and must wait for the rows above them), a direct dilated
    conv without bias, and a builtin conv left as it is."""
    b = CnnBuilder(seed=11, spread=True)
    x = b.input((1, 16, 14, 4))
    s = b.conv(x, 8, k=3, padding="SAME", act="RELU6")
    d = b.dw(b.pad(s, 1, 1, 1, 1), k=3, stride=2, padding="VALID", act="RELU6")
    e = b.conv(d, 64, k=1, act="RELU6")  # the peak: 8x7x64 over its 8x7x8 input
    e2 = b.dw(e, k=3, act="RELU6")
    p = b.conv(e2, 8, k=1)
    x3 = b.conv(p, 12, k=3, padding="SAME", act="RELU6")
    c = b.conv(x3, 8, k=3, padding="SAME", dilation=2, act="RELU")
    b.ops[-1] = dataclasses.replace(b.ops[-1], inputs=(*b.ops[-1].inputs[:2], -1))  # no bias
    out = b.conv(c, 6, k=3, padding="VALID")
    names = {t: b.tensors[t].name for t in (s, d, e, e2, p, x3, c)}
    g, folded = fold_pads(b.graph([out]), harness=True)
    assert folded == 1
    at = {g.tensors[op.outputs[0]].name: i for i, op in enumerate(g.ops)}
    pos = {t: at[name] for t, name in names.items()}
    g = with_kernel(g, [pos[s]], kernel_name())
    g = with_kernel(g, [pos[e], pos[e2], pos[p], pos[x3]], kernel_name(OVERLAP))
    assert overlap.ring_rows(g, g.ops[pos[x3]]) > 1  # (the case this op is here for)
    g = with_kernel(g, [pos[c]], kernel_name(DIRECT))
    g = with_kernel(g, [pos[d]], kernel_name(DIRECT))  # CMSIS-NN's generic depthwise kernel: no buffer
    chosen = sorted(i for i, op in enumerate(g.ops) if op.kernel)
    return g, model_to_bytes(to_model(g, read_model(b.model_bytes([out])))), chosen


def test_export_registers_the_harness_kernels_as_their_own_ops(tmp_path):
    g, data, chosen = _cnn()
    r = export_mcu("cnn.tflite", BOARD, tmp_path, model_data=data)
    assert set(r.ops) == {"TPUP_CONV_2D", "TPUP_DEPTHWISE_CONV_2D", "CONV_2D"}
    h = (tmp_path / "op_resolver.h").read_text()
    assert '#include "tpup_conv.h"' in h and 'AddCustom("TPUP_CONV_2D", tpup::Register_CONV_2D())' in h
    assert {"tpup_conv.cc", "tpup_conv.h"} <= set(r.files)
    # the overlapped chain is planned as one buffer: its tensors sit inside each other
    plan = read_offline_plan(read_model(tmp_path / "model.tflite"))
    chain = [g.ops[i].outputs[0] for i in chosen if kernels.OVERLAP in kernels.flags(g.ops[i])]
    spans = [(plan[t], plan[t] + g.tensors[t].nbytes) for t in chain]
    assert all(a < d and c < b for (a, b) in spans for (c, d) in spans)  # every pair overlaps


# ---- on the emulated board ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(tmp_path_factory):
    if not (HAVE_ARM and HAVE_QEMU):
        pytest.skip("ARM toolchain or QEMU not installed (.ci/run installs them)")
    root = tmp_path_factory.mktemp("harness")
    g, data, chosen = _cnn()
    (root / "harness.tflite").write_bytes(data)
    return root / "harness.tflite", g, chosen


def _run(path, kernels_set):
    from tpu_pipeline.runtime.backends.qemu import run_on_qemu
    from tpu_pipeline.toolchain.firmware.library import LibraryBusy

    tree_or_skip(kernels_set)
    try:
        return run_on_qemu(path, BOARD, kernel_set(kernels_set), iterations=2, seed=7)
    except LibraryBusy as exc:
        pytest.skip(str(exc))


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_harness_kernels_run_in_qemu_as_the_host_runs_the_builtin_view(model, kernels_set):
    path, g, chosen = model
    r = _run(path, kernels_set)
    assert r.error is None and r.outputs_match is True, r.output_differences
    assert 0 < r.stack_used_bytes < r.stack_bytes_reserved  # the firmware's high-water mark (startup.c)
    ran = {o["index"]: o["opcode"] for o in r.op_instructions}
    assert {i for i, code in ran.items() if code.startswith("TPUP_")} == set(chosen)
    exported = read_model(Path(r.elf).parents[2] / "model.tflite")  # the project's (offline plan inside)
    graph = from_model(exported)
    predicted = target_arena(graph, kernel_set(r.kernels), read_offline_plan(exported))
    assert (predicted.head, predicted.tail) == (r.head_bytes, r.tail_bytes)
    assert r.arena_used_bytes == predicted.total
    # the overlap really saved memory: the firmware's head is below any plan of separate buffers
    separate = lifetimes(with_kernel(graph, [i for i in chosen if kernels.OVERLAP in kernels.flags(graph.ops[i])],
                                     kernel_name()), semantics=get_semantics("tflm")).peak
    assert r.head_bytes < separate


def test_the_direct_kernel_frees_the_im2col_buffer():
    g, _, chosen = _cnn()
    direct = next(i for i in chosen if DIRECT in kernels.flags(g.ops[i]) and g.ops[i].opcode == "CONV_2D")
    assert scratch_requests(g, direct, get_semantics("tflm-cmsis-nn")) == []
    cmsis = with_kernel(g, [direct], kernel_name())
    assert scratch_requests(cmsis, direct, get_semantics("tflm-cmsis-nn"))


@needs_arm
@needs_qemu
def test_malformed_options_stop_the_firmware_with_its_message(model, tmp_path):
    from tpu_pipeline.runtime import protocol as P
    from tpu_pipeline.runtime.backends.qemu import QemuBoard, project_dir
    from tpu_pipeline.runtime.serial_mcu import SerialMcu
    from tpu_pipeline.toolchain.export_mcu import c_array
    from tpu_pipeline.toolchain.firmware.build import build_firmware
    from tpu_pipeline.toolchain.firmware.library import LibraryBusy

    path, _, chosen = model
    tree_or_skip("reference")
    export_mcu(path, BOARD, tmp_path)
    m = read_model(tmp_path / "model.tflite")
    ops = m.subgraphs[0].operators
    bad = bytearray(bytes(ops[chosen[0]].customOptions))
    bad[0:4] = struct.pack("<i", 9)  # an options format the firmware does not know
    ops[chosen[0]].customOptions = list(bad)
    data = model_to_bytes(m)
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
        b = build_firmware(project, REFERENCE, quiet=True, wait=False)
    except LibraryBusy as exc:
        pytest.skip(str(exc))
    logs, err = [], None
    with QemuBoard(b.elf, "mps2-an386") as board, SerialMcu(board.port, 115200, timeout=10) as mcu:
        mcu._buf = b""
        mcu._write(P.encode("RESET"))  # boots again while we listen: BOOT, LOG ..., ERR
        deadline = time.monotonic() + 120  # a hang guard only: a loaded machine boots slowly
        while err is None:
            msg = mcu._readline(deadline, "ERR")
            if msg.kind == "LOG":
                logs.append(" ".join(msg.fields))
            elif msg.kind == "ERR":
                err = " ".join(msg.fields)
    assert "AllocateTensors failed" in err
    assert any("TPUP conv: invalid options" in line for line in logs), logs


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_an_input_outside_the_arena(tmp_path, kernels_set):
    """--input-outside-arena: the application's buffer holds the input; the harness's planner leaves
    it out of the head (TFLite Micro's own would not), the serial input lands in that buffer, and
    the outputs stay bit-identical."""
    from tpu_pipeline.toolchain.ir.convert import rewritten_model
    from tpu_pipeline.toolchain.memory import plan_for_tflm
    from tpu_pipeline.toolchain.rewrite.interface import external_inputs
    from tpu_pipeline.toolchain.tflite.metadata import EXTERNAL, with_offline_plan

    g, data, _ = _cnn()
    outside = external_inputs(g)
    plan = plan_for_tflm(outside, n_tensors=len(outside.tensors))
    assert [plan.tensor_offsets[t] for t in outside.inputs] == [EXTERNAL]
    model = with_offline_plan(rewritten_model(outside, read_model(data)), list(plan.tensor_offsets))
    path = tmp_path / "outside.tflite"
    path.write_bytes(model_to_bytes(model))
    back = from_model(read_model(path))
    assert back.external == back.inputs
    r = _run(path, kernels_set)
    assert r.error is None and r.outputs_match is True, r.output_differences
    predicted = exported_arena(r)
    assert (predicted.head, predicted.tail) == (r.head_bytes, r.tail_bytes)
    # the input takes no arena: nothing is live before the first op, and the head is no larger
    assert lifetimes(outside, semantics="tflm").live_bytes()[0] == 0 < lifetimes(g, semantics="tflm").live_bytes()[0]
    assert r.head_bytes <= plan_for_tflm(g, n_tensors=len(g.tensors)).head


def _se_block():
    """(graph, model bytes): an inverted residual block with squeeze-and-excitation, as MCUNetV2's
    and MobileNetV3's: its scaling MUL runs over the depthwise output (which the pooling read
    before it) and the residual ADD over the projection, both in place; the depthwise overlapped."""
    from tpu_pipeline.toolchain.memory import plan_for_tflm
    from tpu_pipeline.toolchain.tflite.metadata import with_offline_plan

    b = CnnBuilder(seed=19, spread=True)
    x = b.input((1, 12, 10, 8))
    e = b.conv(x, 32, k=1, act="RELU6")
    d = b.dw(e, k=3, act="RELU6")
    s = b.conv(b.conv(b.mean(d), 4, k=1, act="RELU"), 32, k=1, act="RELU6")
    m = b.mul(d, s)
    out = b.add(b.conv(m, 8, k=1), x)
    g = b.graph([out])
    convs = [i for i, op in enumerate(g.ops) if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D")]
    g = with_kernel(g, convs, kernel_name())
    g = with_kernel(g, [i for i in convs if g.ops[i].opcode == "DEPTHWISE_CONV_2D"], kernel_name(OVERLAP))
    g = kernels.with_in_place(g, [i for i, op in enumerate(g.ops) if op.opcode in ("MUL", "ADD")])
    plan = plan_for_tflm(g, n_tensors=len(g.tensors))
    model = with_offline_plan(to_model(g, read_model(b.model_bytes([out]))), list(plan.tensor_offsets))
    return g, model_to_bytes(model)


def test_elementwise_ops_in_place_are_read_back_from_the_plan():
    """Nothing but the offline plan marks an ADD or MUL in place (output at its source's offset): a
    reader infers it, and the memory model then counts one buffer where there were two."""
    g, data = _se_block()
    back = from_model(read_model(data))
    assert [op.kernel for op in back.ops] == [op.kernel for op in g.ops]
    plan = read_offline_plan(read_model(data))
    for i, op in enumerate(back.ops):
        if kernels.runs_in_place(op):
            assert plan[kernels.in_place_source(back, i)] == plan[op.outputs[0]]
    mul = next(i for i, op in enumerate(g.ops) if op.opcode == "MUL")
    assert g.consumers[g.ops[mul].inputs[0]] != (mul,)  # (the pooling read it too, before)
    apart = dataclasses.replace(g, ops=tuple(dataclasses.replace(op, kernel="") if kernels.runs_in_place(op) else op
                                             for op in g.ops))
    assert lifetimes(g, semantics="tflm").peak < lifetimes(apart, semantics="tflm").peak
    # an input another op may still read after it (not an ancestor) is never written over
    b = CnnBuilder(seed=3)
    x = b.input((1, 6, 6, 4))
    a, c = b.conv(x, 4, k=1), b.conv(x, 4, k=1)
    y = b.add(a, c)
    z = b.conv(a, 4, k=1)  # reads a, in no fixed order with the ADD
    g2 = b.graph([y, z])
    add = next(i for i, op in enumerate(g2.ops) if op.opcode == "ADD")
    assert kernels.in_place_source(g2, add) == c


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_elementwise_ops_run_in_place_on_the_board(tmp_path, kernels_set):
    """The builtin MUL and ADD of both kernel sets run with their output over their input:
    bit-identical to the host, head and tail as predicted."""
    if not (HAVE_ARM and HAVE_QEMU):
        pytest.skip("ARM toolchain or QEMU not installed (.ci/run installs them)")
    g, data = _se_block()
    path = tmp_path / "se.tflite"
    path.write_bytes(data)
    r = _run(path, kernels_set)
    assert r.error is None and r.outputs_match is True, r.output_differences
    predicted = exported_arena(r)
    assert (predicted.head, predicted.tail) == (r.head_bytes, r.tail_bytes)
    assert sum(kernels.runs_in_place(op) for op in from_model(exported_model(r)).ops) == 2

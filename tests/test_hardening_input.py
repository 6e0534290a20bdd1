"""Bad input fails cleanly: one line, exit 2 (bad input or usage) or 4 (I/O), nothing replaced
that must not be. One regression test per failure reported against the reader, the writers,
the device descriptors and the options (issue 10, items 5, 9 and 10b)."""

from __future__ import annotations

import os
import stat
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema

from conftest import FIXTURES, ROOT
from tpu_pipeline.cli import main
from tpu_pipeline.toolchain.device import DEVICES_DIR, load_device
from tpu_pipeline.toolchain.errors import DeviceError, ModelError, UsageError
from tpu_pipeline.toolchain import tflite
from tpu_pipeline.toolchain.execute.litert_check import check_loads_in_litert
from tpu_pipeline.toolchain.tflite import io as tflite_io
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

CHAIN = FIXTURES / "chain_int8.tflite"      # 8 CONV_2D; tensor 0 input, 24 output
TINY = FIXTURES / "tiny_irregular_int8.tflite"


def cli(capsys, *args) -> tuple[int, str]:
    """Exit code and stderr of the CLI run in-process (argparse's exits included)."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    return code, err


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def put(obj, field: str, i: int, value: int) -> None:
    """obj.field[i] = value (the object API's numpy arrays are read-only)."""
    values = [int(v) for v in getattr(obj, field)]
    values[i] = value
    setattr(obj, field, values)


def patched(tmp_path: Path, edit, name: str = "bad.tflite", source: Path = CHAIN) -> Path:
    model = read_model(source)
    edit(model)
    path = tmp_path / name
    path.write_bytes(model_to_bytes(model))
    return path


# ---- item 9: the reader ---------------------------------------------------------------------------

def _header_mutants() -> dict[str, bytes]:
    """The ten header mutants: the root table's vtable offset and the root offset itself."""
    good = CHAIN.read_bytes()
    (root,) = struct.unpack_from("<I", good, 0)
    out = {}
    for value in (4, -4, 2, 1 << 20, -(1 << 20), 0x7FFFFFFF, -0x80000000):
        data = bytearray(good)
        struct.pack_into("<i", data, root, value)
        out[f"vtable{value}"] = bytes(data)
    for value in (len(good) - 4, len(good) - 8, 8):
        data = bytearray(good)
        struct.pack_into("<I", data, 0, value)
        out[f"root{value}"] = bytes(data)
    return out


HEADER_MUTANTS = _header_mutants()


@pytest.mark.parametrize("name", sorted(HEADER_MUTANTS))
def test_header_mutants_are_model_errors(name):
    with pytest.raises(ModelError, match="bad.tflite"):
        read_model(HEADER_MUTANTS[name], name="bad.tflite")


@pytest.mark.parametrize("command", ["inspect", "schedule", "plan"])
def test_header_mutants_fail_in_one_line_in_every_command(command, tmp_path, capsys):
    for name, data in HEADER_MUTANTS.items():
        path = tmp_path / f"{name}.tflite"
        path.write_bytes(data)
        extra = [] if command == "inspect" else ["-o", tmp_path / "out.tflite"]
        code, err = cli(capsys, command, path, *extra)
        assert code == 2, (name, err)
        assert str(path) in one_error_line(err)
        assert not (tmp_path / "out.tflite").exists()


def test_a_vector_length_past_the_end_is_refused_before_unpacking():
    # The tensors vector of the main subgraph claims 2^31 entries.
    model = read_model(CHAIN)
    data = bytearray(model_to_bytes(model))
    root = schema.Model.GetRootAs(bytes(data), 0)
    sg = root.Subgraphs(0)
    vec = sg._tab.Vector(sg._tab.Offset(4)) - 4
    struct.pack_into("<I", data, vec, 0x7FFFFFFF)
    with pytest.raises(ModelError, match="corrupt flatbuffer"):
        read_model(bytes(data), name="bad.tflite")


def test_a_string_running_past_the_end_is_refused():
    # flatbuffers' Python String() slices, so an oversized length was read silently, truncated
    data = bytearray(CHAIN.read_bytes())
    tensor = schema.Model.GetRootAs(bytes(data), 0).Subgraphs(0).Tensors(0)
    at = tensor._tab.Pos + tensor._tab.Offset(10)
    start = at + struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, start, 2 * len(data))
    with pytest.raises(ModelError, match="string"):
        read_model(bytes(data), name="bad.tflite")


def test_a_vtable_before_the_start_of_the_file_is_refused():
    # a negative position makes Python's struct read from the END of the buffer, silently
    data = bytearray(CHAIN.read_bytes())
    tensor = schema.Model.GetRootAs(bytes(data), 0).Subgraphs(0).Tensors(0)
    struct.pack_into("<i", data, tensor._tab.Pos, tensor._tab.Pos + 64)
    with pytest.raises(ModelError, match="corrupt flatbuffer"):
        read_model(bytes(data), name="bad.tflite")


CONTENT_CASES = {
    "op input out of range": (lambda m: put(m.subgraphs[0].operators[1], 'inputs', 0, -7),
                              "input tensor -7"),
    "op output out of range": (lambda m: put(m.subgraphs[0].operators[1], 'outputs', 0, 500),
                               "output tensor 500"),
    "graph output out of range": (lambda m: setattr(m.subgraphs[0], "outputs", [99]), "output tensor 99"),
    "opcode index out of range": (lambda m: setattr(m.subgraphs[0].operators[2], "opcodeIndex", 40),
                                  "operator code 40"),
    "builtin code unknown": (lambda m: setattr(m.operatorCodes[0], "builtinCode", 9999), "unknown builtin"),
    "dtype unknown": (lambda m: setattr(m.subgraphs[0].tensors[17], "type", 99), "unknown type code 99"),
    "buffer index out of range": (lambda m: setattr(m.subgraphs[0].tensors[1], "buffer", 4000),
                                  "buffer 4000"),
    "constant size wrong": (lambda m: put(m.subgraphs[0].tensors[1], 'shape', 0, 31), "need"),
    "negative dimension": (lambda m: put(m.subgraphs[0].tensors[17], 'shape', 1, -5),
                           "negative dimension"),
    "scales for the wrong channel count": (
        lambda m: setattr(m.subgraphs[0].tensors[1].quantization, "scale",
                          m.subgraphs[0].tensors[1].quantization.scale[:5]), "5 quantization scales"),
    "quantized dimension past the rank": (
        lambda m: setattr(m.subgraphs[0].tensors[1].quantization, "quantizedDimension", 7), "dimension 7"),
    "zero point outside int8": (
        lambda m: setattr(m.subgraphs[0].tensors[17].quantization, "zeroPoint", np.array([300])), "zero point"),
    "op reads a later op's output": (lambda m: put(m.subgraphs[0].operators[1], 'inputs', 0, 20),
                                     "not stored in an order"),
    "op reads a tensor nothing writes": (lambda m: setattr(m.subgraphs[0].tensors[1], "buffer", 0),
                                         "which no operator writes"),
    "op writes a constant": (lambda m: put(m.subgraphs[0].operators[1], 'outputs', 0, 1),
                             "constant tensor"),
}


@pytest.mark.parametrize("case", sorted(CONTENT_CASES))
def test_inconsistent_models_fail_in_one_line(case, tmp_path, capsys):
    edit, words = CONTENT_CASES[case]
    path = patched(tmp_path, edit)
    code, err = cli(capsys, "schedule", path, "-o", tmp_path / "out.tflite")
    assert code == 2, err
    line = one_error_line(err)
    assert str(path) in line and words in line
    assert not (tmp_path / "out.tflite").exists()


def _stride_zero(model):
    model.subgraphs[0].operators[0].builtinOptions.strideW = 0


def test_litert_load_failure_is_a_model_error(tmp_path, capsys):
    path = patched(tmp_path, _stride_zero)
    with pytest.raises(ModelError, match="LiteRT cannot load"):
        check_loads_in_litert(path.read_bytes(), str(path))
    # plan used to write a model nothing can run, and exit 0; TFLite Micro runs it (computing
    # garbage), so the reader is what refuses it now, for every command alike
    code, err = cli(capsys, "plan", path, "-o", tmp_path / "out.tflite")
    assert code == 2 and "has stride_w 0; it must be at least 1" in one_error_line(err)
    assert not (tmp_path / "out.tflite").exists()


def test_an_arena_past_2_gib_is_infeasible_for_the_offline_plan(tmp_path, capsys):
    # LiteRT recomputes activation shapes at load, so a stored 1 TB activation loads there;
    # the plan's int32 words cannot hold its offsets (was an OverflowError, exit 70)
    path = patched(tmp_path, lambda m: put(m.subgraphs[0].tensors[6], "shape", 3, 987955208),
                   source=FIXTURES / "pool_softmax_int8.tflite")  # tensor 6: the MAX_POOL_2D output
    code, err = cli(capsys, "plan", path, "-o", tmp_path / "out.tflite")
    assert code == 3
    line = one_error_line(err)
    assert str(path) in line and "32-bit offsets" in line
    assert not (tmp_path / "out.tflite").exists()


def _custom(code: str):
    def edit(model):
        c = model.operatorCodes[0]
        c.builtinCode = schema.BuiltinOperator.CUSTOM
        c.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
        c.customCode = code
    return edit


def test_an_unresolved_custom_op_is_a_note_not_a_refusal(tmp_path):
    path = patched(tmp_path, _custom("MyAccelOp"))
    note = check_loads_in_litert(path.read_bytes(), str(path))
    assert note and "MyAccelOp" in note
    assert check_loads_in_litert(CHAIN.read_bytes(), str(CHAIN)) is None


# ---- item 10b: an Edge TPU-compiled model ---------------------------------------------------------

def test_an_edgetpu_compiled_model_is_refused_by_name(tmp_path, capsys):
    path = patched(tmp_path, _custom("edgetpu-custom-op"), name="model_edgetpu.tflite")
    for args in (("inspect", path), ("schedule", path, "-o", tmp_path / "o.tflite")):
        code, err = cli(capsys, *args)
        assert code == 2
        line = one_error_line(err)
        assert "already compiled for the Edge TPU (edgetpu-custom-op)" in line
        assert "pass the CPU .tflite" in line and str(path) in line


def test_a_fifo_is_not_read_as_a_model(tmp_path):
    fifo = tmp_path / "model.tflite"
    os.mkfifo(fifo)
    # in a child: the old reader blocked forever waiting for a writer
    proc = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", "inspect", str(fifo)], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and "not a regular file" in one_error_line(proc.stderr)


# ---- item 5: writers --------------------------------------------------------------------------------

def test_schedule_does_not_replace_a_fifo(tmp_path, capsys):
    # the same failure as `-o /dev/full`, which replaced the device node with a file
    fifo = tmp_path / "out.tflite"
    os.mkfifo(fifo)
    code, err = cli(capsys, "schedule", CHAIN, "-o", fifo)
    assert code == 4 and "not a regular file" in one_error_line(err)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tflite"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_dev_full_is_refused_without_touching_it(capsys):
    code, err = cli(capsys, "schedule", CHAIN, "-o", "/dev/full")
    assert code == 4 and "/dev/full" in one_error_line(err)
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_symlink_to_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "out.tflite"
    link.symlink_to(fifo)
    with pytest.raises(DeviceError, match="not a regular file"):
        tflite_io.write_bytes_atomic(link, b"x")
    assert link.is_symlink()


def test_proc_is_refused_before_work(tmp_path, capsys):
    code, err = cli(capsys, "plan", CHAIN, "-o", "/proc/x")
    assert code == 4 and "/proc/x" in one_error_line(err)


def test_a_hard_link_to_the_input_is_not_overwritten(tmp_path, capsys):
    model = tmp_path / "model.tflite"
    model.write_bytes(CHAIN.read_bytes())
    link = tmp_path / "link.tflite"
    os.link(model, link)
    code, err = cli(capsys, "plan", model, "-o", link)
    assert code == 2 and "is the input model" in one_error_line(err)
    assert model.read_bytes() == CHAIN.read_bytes()


def test_writer_refuses_its_input_and_keeps_it():
    data = TINY.read_bytes()
    with pytest.raises(UsageError, match="input model"):
        tflite_io.write_bytes_atomic(TINY, b"not a model", inputs=[TINY])
    assert TINY.read_bytes() == data


def test_export_mcu_refuses_a_folder_holding_the_input(tmp_path, capsys):
    out = tmp_path / "export"
    out.mkdir()
    model = out / "model.tflite"   # the name the export writes
    model.write_bytes(CHAIN.read_bytes())
    code, err = cli(capsys, "export-mcu", model, "-o", out)
    assert code == 2 and "holds the input model" in one_error_line(err)
    assert model.read_bytes() == CHAIN.read_bytes()


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    target = tmp_path / "new" / "deeper" / "out.tflite"

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tflite_io.write_bytes_atomic(target, b"data")
    assert list(tmp_path.iterdir()) == []


def test_written_files_get_ordinary_permissions(tmp_path):
    target = tmp_path / "out.bin"
    tflite_io.write_bytes_atomic(target, b"data")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask


# ---- item 9: options and device descriptors ---------------------------------------------------------

OPTION_CASES = [
    ("schedule", "--time-limit", "nan"),
    ("schedule", "--time-limit", "inf"),
    ("plan", "--time-limit", "nan"),
    ("rewrite", "--time-limit", "-inf"),
    ("rewrite", "--runs", "0"),
    ("plan", "--onchip", "-1"),
]


@pytest.mark.parametrize("command,option,value", OPTION_CASES)
def test_bad_numbers_are_usage_errors(command, option, value, tmp_path, capsys):
    code, err = cli(capsys, command, CHAIN, "-o", tmp_path / "out.tflite", option, value)
    assert code == 2 and option in one_error_line(err)
    assert not (tmp_path / "out.tflite").exists()


def test_negative_seed_is_a_usage_error(capsys):
    code, err = cli(capsys, "profile", CHAIN, "--device", "sparkfun-edge", "--seed", "-1")
    assert code == 2 and "--seed" in one_error_line(err)


def test_plot_format_is_checked_before_work(tmp_path, capsys):
    code, err = cli(capsys, "inspect", CHAIN, "--plot", tmp_path / "x.xyz")
    assert code == 2 and "--plot" in one_error_line(err)
    assert list(tmp_path.iterdir()) == []


def _descriptor(tmp_path: Path, old: str, new: str) -> Path:
    text = (DEVICES_DIR / "coral-usb.toml").read_text()
    assert old in text
    path = tmp_path / "dev.toml"
    path.write_text(text.replace(old, new))
    return path


DEVICE_CASES = {
    "1e300": ("peak_ops_per_s = 4.0e12", "peak_ops_per_s = 1e300"),
    "5e-324": ("host_bandwidth_bytes_per_s = 4.2e+08", "host_bandwidth_bytes_per_s = 5e-324"),
    "huge sram": ("param_sram_bytes = 8126464", "param_sram_bytes = 9223372036854775807"),
    "tiny efficiency": ("conv = 1\n", "conv = 5e-324\n"),
    "per-op 1e300": ("per_op_s = 1.2e-05", "per_op_s = 1e300"),
}


@pytest.mark.parametrize("case", sorted(DEVICE_CASES))
def test_absurd_device_values_are_refused(case, tmp_path):
    path = _descriptor(tmp_path, *DEVICE_CASES[case])
    with pytest.raises(UsageError, match=str(path).replace(".", r"\.")):
        load_device(path)


def test_deeply_nested_device_file_fails_in_one_line(tmp_path, capsys):
    path = tmp_path / "dev.toml"
    path.write_text((DEVICES_DIR / "coral-usb.toml").read_text() + "x = " + "[" * 200_000 + "]" * 200_000 + "\n")
    code, err = cli(capsys, "compile", CHAIN, "-n", "2", "--device", path, "-o", tmp_path / "out")
    assert code == 2 and str(path) in one_error_line(err)


def test_huge_device_file_is_refused(tmp_path):
    path = tmp_path / "dev.toml"
    path.write_text((DEVICES_DIR / "coral-usb.toml").read_text() + "# " + "x" * (2 << 20) + "\n")
    with pytest.raises(UsageError, match="bytes"):
        load_device(path)

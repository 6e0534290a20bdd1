"""Real third-party models (tests/fixtures/thirdparty, see its README) and minimal reproducers of
the kinds of failure the survey of real models found (tools/survey.py, docs/benchmarks.md):
recurrent and stateful models predicted exactly, interpreters that crash isolated, one verdict per
model across commands, models for other engines refused by name, models only TFLite Micro loads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.toolchain.device import CMSIS_NN, REFERENCE, kernel_set
from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena
from tpu_pipeline.toolchain.ir import from_model
from tpu_pipeline.toolchain.loader import load
from tpu_pipeline.toolchain.memory import lifetimes, tflm_greedy
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model, schema

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
THIRD = FIX / "thirdparty"
RECURRENT = ["keyword_scrambled_8bit", "trained_lstm_int8", "trained_lstm"]


def cli(*args, timeout=600):
    p = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith(("error:", "internal error:"))]
    assert len(lines) == 1, stderr
    return lines[0]


# ---- recurrent and stateful models: TFLite Micro's scratch buffers, variables, the 32-bit tail ----
@pytest.mark.parametrize("name", RECURRENT)
def test_recurrent_head_is_predicted_to_the_byte(name):
    """SVDF (two int32 scratch buffers per op) and UNIDIRECTIONAL_SEQUENCE_LSTM (four gate
    buffers of the cell type): the head TFLite Micro allocates, variables outside it."""
    path = THIRD / f"{name}.tflite"
    _, graph = load(path)
    assert tflm_greedy(lifetimes(graph, semantics="tflm")).size == measure_tflm_arena(path).head


def test_svdf_and_lstm_scratch_follow_the_kernels():
    from tpu_pipeline.toolchain.memory.scratch import scratch_requests
    from tpu_pipeline.toolchain.memory.semantics import TFLM, TFLM_CMSIS_NN

    _, svdf = load(THIRD / "keyword_scrambled_8bit.tflite")
    i = next(k for k, op in enumerate(svdf.ops) if op.opcode == "SVDF")
    filters = svdf.tensors[svdf.ops[i].inputs[1]].shape[0]
    units = svdf.tensors[svdf.ops[i].outputs[0]].shape[1]
    assert scratch_requests(svdf, i, TFLM) == [4 * filters, 4 * units]
    assert scratch_requests(svdf, i, TFLM_CMSIS_NN) == [4 * filters, 4 * units]  # DSP: no kernel-sum buffer
    _, lstm = load(THIRD / "trained_lstm_int8.tflite")
    i = next(k for k, op in enumerate(lstm.ops) if op.opcode == "UNIDIRECTIONAL_SEQUENCE_LSTM")
    hidden = lstm.tensors[lstm.ops[i].inputs[18]].shape[1]
    assert scratch_requests(lstm, i, TFLM) == [2 * hidden] * 4  # int16 cell state
    assert scratch_requests(lstm, i, TFLM_CMSIS_NN) == [2 * hidden] * 3  # CMSIS-NN's kernel needs three


def test_target_tail_counts_variables_and_recurrent_kernels():
    from tpu_pipeline.toolchain.memory.tflm_target import target_tail

    _, graph = load(THIRD / "keyword_scrambled_8bit.tflite")
    for kernels in (CMSIS_NN, REFERENCE):
        t = target_tail(graph, kernels)
        assert t.unmodelled == () and t.bytes is not None
        variables = [a for a in t.allocations if a[0].startswith("variable")]
        assert sum(a[1] for a in variables) == sum(x.nbytes for x in graph.tensors if x.is_variable)
    # the QEMU firmware (CMSIS-NN) reported arena_used_bytes 8,212 = head 672 + tail 7,540
    # (tests/test_firmware.py checks it on the emulated board itself)
    assert target_tail(graph, CMSIS_NN).bytes == 7540


# ---- tensors no operator uses: TFLite Micro allocates them; the writers drop them ------------------
def _with_unused_tensor(tmp_path) -> Path:
    """chain_int8 plus a float [1,160,120,1] tensor nothing uses: an int8-I/O copy that kept its
    old float input (FACTS: TFLite Micro gave it 76,816 B of head)."""
    m = read_model((FIX / "chain_int8.tflite").read_bytes())
    t = schema.TensorT()
    t.name, t.type, t.shape, t.buffer = b"unused_float_input", 0, [1, 160, 120, 1], 0
    m.subgraphs[0].tensors.append(t)
    path = tmp_path / "unused.tflite"
    path.write_bytes(model_to_bytes(m))
    return path


def test_unused_tensor_counted_for_the_file_and_dropped_when_written(tmp_path):
    import json

    from tpu_pipeline.toolchain.memory.lifetimes import unused_tensors

    path = _with_unused_tensor(tmp_path)
    code, out, err = cli("inspect", path, "--json")
    assert code == 0, err
    assert json.loads(out)["tflm_arena_bytes"] == measure_tflm_arena(path).head == 76800
    for command in (["plan", path, "-o", tmp_path / "p.tflite", "--verify"],
                    ["schedule", path, "-o", tmp_path / "s.tflite"],
                    ["fit", path, "--objective", "memory", "-o", tmp_path / "f.tflite", "--time-limit", "5"]):
        code, out, err = cli(*command)
        assert code == 0, err
        assert "no operator uses were dropped" in out
        written = Path(command[command.index("-o") + 1])
        assert unused_tensors(load(written)[1]) == ()
        # the plan written is the plan TFLite Micro uses: not the unused tensor's 76,800 B
        assert measure_tflm_arena(written).head <= measure_tflm_arena(FIX / "chain_int8.tflite").head


def test_interface_tensors_stay_even_unused():
    from tpu_pipeline.toolchain.tflite.extract import without_unused_tensors

    m = read_model((FIX / "chain_int8.tflite").read_bytes())
    t = schema.TensorT()
    t.name, t.type, t.shape, t.buffer = b"spare_input", 9, [1, 4], 0
    m.subgraphs[0].tensors.append(t)
    m.subgraphs[0].inputs = list(m.subgraphs[0].inputs) + [len(m.subgraphs[0].tensors) - 1]
    out, dropped = without_unused_tensors(m)
    assert dropped == 0 and out is m


# ---- a runtime that crashes is isolated: one line, exit 2 ------------------------------------------
def _segfault():
    os.kill(os.getpid(), signal.SIGSEGV)


def test_a_crash_in_the_child_is_one_error():
    from tpu_pipeline.toolchain.execute.child import RuntimeCrash, call_in_child

    with pytest.raises(RuntimeCrash, match=r"LiteRT crashed \(SIGSEGV\) running it"):
        call_in_child(_segfault, runtime="LiteRT", doing="running it")
    assert call_in_child(sum, [1, 2, 3], runtime="x", doing="y") == 6
    with pytest.raises(ZeroDivisionError):
        call_in_child(divmod, 1, 0, runtime="x", doing="y")


def _holding(folder: str) -> list[int]:
    """Live processes with a file open under `folder` (Linux /proc), after a moment to die: a
    child's log stays open in it while the child runs."""
    import time
    from pathlib import Path

    for _ in range(50):
        live = []
        for fd in Path("/proc").glob("[0-9]*/fd/*"):
            try:
                if os.readlink(fd).startswith(folder) and "Z" not in (fd.parent.parent / "stat").read_text().rsplit(")", 1)[1].split()[:1]:
                    live.append(int(fd.parent.parent.name))
            except OSError:
                continue
        if not live:
            return []
        time.sleep(0.1)
    return live


def _nested_sleep():
    from tpu_pipeline.toolchain.execute.child import call_in_child

    return call_in_child(__import__("time").sleep, 600, runtime="x", doing="y")


def test_a_child_started_early_is_collected_or_cancelled(tmp_path):
    """compile --verify starts the whole-model checks in a child while it partitions
    (start_in_child): its answer, its exception or its crash arrive at result(); one cancelled
    is killed, reaped and its folder removed."""
    import time

    from tpu_pipeline.toolchain.execute.child import RuntimeCrash, start_in_child

    calls = [start_in_child(sum, [1, 2], runtime="x", doing="y"), start_in_child(divmod, 1, 0, runtime="x", doing="y"),
             start_in_child(_segfault, runtime="LiteRT", doing="running it")]
    assert calls[0].result() == 3
    with pytest.raises(ZeroDivisionError):
        calls[1].result()
    with pytest.raises(RuntimeCrash, match=r"LiteRT crashed \(SIGSEGV\) running it"):
        calls[2].result()
    slow = start_in_child(_nested_sleep, runtime="x", doing="y")
    pid, folder = slow.pid, slow.tmp
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:  # its own child's folder appears inside
        time.sleep(0.05)
    inner = [os.path.join(folder, d) for d in os.listdir(folder) if d.startswith("tpup-child-")]
    assert inner
    slow.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped
    assert not os.path.exists(folder) and all(not os.path.exists(c.tmp) for c in calls)
    assert _holding(folder) == []  # its own child went with it


def test_litert_crash_on_a_valid_model_is_refused_by_compile_and_fit_checks_in_tflm(tmp_path):
    """LiteRT's SVDF kernel crashes on TFLite Micro's int8 keyword model (it did kill compile
    --verify and fit with SIGSEGV); it is refused before it runs, so the answer is the same every
    run (in CI it also showed as a later kernel's failed check: a verification error, exit 1)."""
    model = THIRD / "keyword_scrambled_8bit.tflite"
    code, _, err = cli("compile", model, "-n", "2", "--verify", "-o", tmp_path / "c")
    assert code == 2, err
    assert "LiteRT would crash (its int8 SVDF" in error_line(err) and "MCU commands" in error_line(err)
    code, out, err = cli("fit", model, "--objective", "memory", "-o", tmp_path / "f.tflite")
    assert code == 0, err
    assert "litert not run (LiteRT would crash" in out and "tflm bit-identical" in out


def test_litert_int8_svdf_with_int8_state_is_refused_before_it_runs():
    """LiteRT's integer SVDF reads its time weights and state as int16 unchecked; the keyword
    model has both int8 (TFLite Micro's layout). Refused before invoke, so safe in this process."""
    from tpu_pipeline.toolchain.execute.child import RuntimeCrash
    from tpu_pipeline.toolchain.execute.inputs import seeded_inputs
    from tpu_pipeline.toolchain.execute.litert import new_interpreter, run_positional

    it = new_interpreter((THIRD / "keyword_scrambled_8bit.tflite").read_bytes())
    x = seeded_inputs(it.get_input_details(), 0)
    with pytest.raises(RuntimeCrash, match=r"^LiteRT would crash \(its int8 SVDF kernel reads op 1's int8 time "
                                           r"weights and state as int16"):
        run_positional(it, x)
    with pytest.raises(RuntimeCrash):  # asked again: still refused (only a safe interpreter is remembered)
        run_positional(it, x)
    ok = new_interpreter((FIX / "chain_int8.tflite").read_bytes())  # no SVDF: runs
    assert run_positional(ok, seeded_inputs(ok.get_input_details(), 0))
    asked = []
    ok._get_op_details = lambda index: asked.append(index)  # found safe once: its ops are not read again
    assert run_positional(ok, seeded_inputs(ok.get_input_details(), 1)) and asked == []


def test_compile_matches_unnamed_tensors_of_the_input(tmp_path):
    """keyword_scrambled's tensors have no names: the whole-vs-input check matched none (exit 1)."""
    m = read_model((THIRD / "keyword_scrambled_8bit.tflite").read_bytes())
    assert all(not t.name for t in m.subgraphs[0].tensors)
    code, _, err = cli("compile", FIX / "tiny_irregular_int8.tflite", "-n", "2", "--verify", "-o", tmp_path / "c")
    assert code == 0, err
    nameless = read_model((FIX / "tiny_irregular_int8.tflite").read_bytes())
    for t in nameless.subgraphs[0].tensors:
        t.name = b""
    (tmp_path / "nameless.tflite").write_bytes(model_to_bytes(nameless))
    code, out, err = cli("compile", tmp_path / "nameless.tflite", "-n", "2", "--verify", "-o", tmp_path / "n")
    assert code == 0, err


# ---- internal errors found on real models --------------------------------------------------------
def test_broadcast_args_reading_an_empty_shape_passes_the_load_lint(tmp_path):
    """TF Agents' planestrike: BROADCAST_ARGS reads a 0-element shape no op writes."""
    code, _, err = cli("compile", THIRD / "planestrike_tf_agents.tflite", "-n", "2", "-o", tmp_path / "c")
    assert code == 0, err


def test_int16_transpose_conv_fits_with_its_output_shape_input(tmp_path):
    """TFLite Micro's SEANet test model: the output shape is a graph input; random values made
    LiteRT refuse to run it inside fit's check (exit 70)."""
    from tpu_pipeline.toolchain.execute.inputs import shape_operand_values

    model = THIRD / "transpose_conv4.tflite"
    values = shape_operand_values(model.read_bytes())
    _, graph = load(model)
    assert [list(v) for v in values.values()] == [list(graph.tensors[graph.ops[0].outputs[0]].shape)]
    code, out, err = cli("fit", model, "--objective", "memory", "-o", tmp_path / "f.tflite")
    assert code == 0, err
    assert "litert bit-identical, tflm bit-identical" in out


def test_a_metadata_name_that_is_not_utf8_is_written_back(tmp_path):
    m = read_model((FIX / "chain_int8.tflite").read_bytes())
    b = schema.BufferT()
    b.data = [1, 2, 3, 4]
    m.buffers.append(b)
    e = schema.MetadataT()
    e.name, e.buffer = b"\xff\xfename", len(m.buffers) - 1
    m.metadata = list(m.metadata or []) + [e]
    (tmp_path / "m.tflite").write_bytes(model_to_bytes(m))
    code, _, err = cli("plan", tmp_path / "m.tflite", "-o", tmp_path / "p.tflite")
    assert code == 0, err


# ---- one verdict per model ------------------------------------------------------------------------
def test_one_verdict_for_a_model_tflm_cannot_run(tmp_path):
    """planestrike: shapes [-1, -1] (resolved by LiteRT's shape inference in every command) and a
    Flex op TFLite Micro has no kernel for: inspect says so instead of a head, and every command
    made for TFLite Micro refuses it in the same words; schedule and compile accept it."""
    import json

    model = THIRD / "planestrike_tf_agents.tflite"
    code, out, err = cli("inspect", model, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["tflm_arena_bytes"] is None and "registration" in d["tflm_cannot_run"]
    assert cli("schedule", model)[0] == 0
    lines = set()
    for command in (["plan", model, "-o", tmp_path / "p.tflite"],
                    ["fit", model, "--objective", "memory", "-o", tmp_path / "f.tflite"],
                    ["profile", model, "--device", "qemu-mps2-an386", "-N", "1"],
                    ["export-mcu", model, "--device", "qemu-mps2-an386", "-o", tmp_path / "m"]):
        code, _, err = cli(*command)
        assert code == 2, (command, err)
        lines.add(error_line(err))
    assert lines == {f"error: {model}: TFLite Micro cannot run this model (Failed to get registration from op "
                     "code CUSTOM)"}


def test_vela_models_are_refused_by_name(tmp_path):
    m = read_model((FIX / "chain_int8.tflite").read_bytes())
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode, code.version = b"ethos-u", 1
    m.operatorCodes.append(code)
    m.subgraphs[0].operators[0].opcodeIndex = len(m.operatorCodes) - 1
    path = tmp_path / "m_vela.tflite"
    path.write_bytes(model_to_bytes(m))
    for command in (["inspect", path], ["schedule", path], ["compile", path, "-n", "2", "-o", tmp_path / "c"],
                    ["fit", path, "--objective", "memory", "-o", tmp_path / "f.tflite"]):
        code, _, err = cli(*command)
        assert code == 2, err
        assert "compiled by Vela for an Arm Ethos-U NPU" in error_line(err)
        assert "pass the .tflite it was compiled from" in error_line(err)


def _per_channel_1d_bias(tmp_path) -> Path:
    """TFLite Micro's person_detect.tflite in small: 1-D biases quantized per channel "along
    dimension 3", which LiteRT refuses and TFLite Micro runs."""
    m = read_model((FIX / "chain_int8.tflite").read_bytes())
    sg = m.subgraphs[0]
    for op in sg.operators:
        bias = sg.tensors[op.inputs[2]]
        if bias.quantization is not None and len(bias.quantization.scale) > 1:
            bias.quantization.quantizedDimension = 3
    path = tmp_path / "dim3.tflite"
    path.write_bytes(model_to_bytes(m))
    return path


def test_a_model_only_tflm_loads_is_accepted_by_the_mcu_commands(tmp_path):
    """Every MCU command once, on the smallest model that shows it (about 20 s)."""
    path = _per_channel_1d_bias(tmp_path)
    assert measure_tflm_arena(path).head > 0
    for command in (["inspect", path], ["schedule", path, "-o", tmp_path / "s.tflite"],
                    ["plan", path, "-o", tmp_path / "p.tflite", "--verify"],
                    ["fit", path, "--objective", "memory", "-o", tmp_path / "f.tflite", "--time-limit", "5"],
                    ["profile", path, "--device", "qemu-mps2-an386", "-N", "1"],
                    ["export-mcu", path, "--device", "qemu-mps2-an386", "-o", tmp_path / "m"]):
        code, out, err = cli(*command)
        assert code == 0, (command, err)
        if command[0] == "fit":
            assert "checked in TFLite Micro alone" in out and "litert not run" in out
    code, _, err = cli("compile", path, "-n", "2", "-o", tmp_path / "c")
    assert code == 2
    assert "LiteRT cannot load this model" in error_line(err) and "MCU commands" in error_line(err)


# ---- pipeline segments keep a state with its ops ---------------------------------------------------
def test_ops_sharing_a_state_tensor_stay_in_one_segment():
    from dataclasses import replace

    from tpu_pipeline.toolchain.cost.edgetpu import EdgeTpuCostModel
    from tpu_pipeline.toolchain.partition import PartitionProblem, partition

    _, graph = load(FIX / "chain_int8.tflite")
    state = len(graph.tensors)
    var = replace(graph.tensors[graph.ops[0].outputs[0]], index=state, name="state", is_variable=True, source=None)
    ops = list(graph.ops)
    for k in (1, 6):  # two ops far apart read the same state
        ops[k] = replace(ops[k], inputs=ops[k].inputs + (state,))
    g = replace(graph, tensors=graph.tensors + (var,), ops=tuple(ops))
    problem = PartitionProblem(g, EdgeTpuCostModel(load_device("coral-usb")))
    assert problem.state_groups == ((1, 6),)
    p = partition(g, 3, time_limit=5)
    assert p.stages[1] == p.stages[6]
    assert not problem.is_valid([0, 1, 1, 1, 1, 1, 2, 2], 3)


# ---- profile on a board the model does not fit ----------------------------------------------------
def test_profile_that_does_not_fit_gives_the_figures_and_points_at_fit():
    model = FIX / "concat_conv_float32.tflite"  # a 589,824-byte head: more than the Arduino's SRAM
    code, out, err = cli("profile", model, "--device", "arduino-nano-33-ble", "-N", "1")
    assert code == 3, err
    line = error_line(err)
    assert "does not fit" in line and "predicted latency" in line
    assert f"tpu-pipeline fit {model} --device arduino-nano-33-ble" in line
    assert "latency median" in out  # the report's figures are printed before the error


def test_metadata_never_becomes_a_tensors_data_in_a_model_without_buffers():
    """Coral's model_invoking_error.tflite has no buffer at all: tensors point at buffer 0, which
    the offline plan then became."""
    from tpu_pipeline.toolchain.tflite.metadata import with_offline_plan

    m = read_model((FIX / "chain_int8.tflite").read_bytes())
    m.buffers = []
    for t in m.subgraphs[0].tensors:
        t.buffer = 0
    out = with_offline_plan(m, [-1] * len(m.subgraphs[0].tensors))
    assert out.buffers[0].data is None or len(out.buffers[0].data) == 0
    assert all(e.buffer != 0 for e in out.metadata)

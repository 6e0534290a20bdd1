"""compile's output folder (atomic, no stale files, never over the input), its interrupts (exit
130/143 at once, one line, nothing left behind) and its pass driver (progress lines, budget)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpu_pipeline.cli import main
from tpu_pipeline.toolchain.compile import PASSES, Pass, compile_models, run_passes
from tpu_pipeline.toolchain.driver import BUDGET_FACTOR, Budget, PassError
from tpu_pipeline.toolchain.compile.state import CompileState, PassRecord
from tests.conftest import EXAMPLE, FIXTURES
from helpers.models import hard_schedule_model

TINY = FIXTURES / "tiny_irregular_int8.tflite"
CLI = [sys.executable, "-c", "from tpu_pipeline.entry import main; main()"]


def _as_from_a_terminal() -> None:
    """The child's Ctrl-C as a terminal gives it. A test run started in the background by a shell
    without job control ignores SIGINT, the CLI keeps an ignored signal ignored (as it should), and
    the interrupt tests would then test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_a_new_n_replaces_the_whole_folder_without_stale_segments(tmp_path):
    out = tmp_path / "out"
    assert main(["compile", str(TINY), "-n", "3", "-o", str(out), "--time-limit", "2"]) == 0
    assert (out / "tiny_irregular_int8_segment_2_of_3.tflite").exists()
    assert main(["compile", str(TINY), "-n", "2", "-o", str(out), "--time-limit", "2"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["report.html", "report.json", "tiny_irregular_int8.tflite",
                     "tiny_irregular_int8_segment_0_of_2.tflite", "tiny_irregular_int8_segment_1_of_2.tflite"]
    assert set(json.loads((out / "report.json").read_text())["files"]) == set(names)
    assert _leftovers(tmp_path) == []


def test_the_output_folder_is_a_plain_folder(tmp_path):
    out = tmp_path / "out"
    assert main(["compile", str(TINY), "-n", "2", "-o", str(out), "--time-limit", "2"]) == 0
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~mask


def test_refuses_a_folder_holding_the_input(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    model = out / "m.tflite"
    shutil.copy(TINY, model)
    before = model.read_bytes()
    assert main(["compile", str(model), "-n", "2", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds the input model" in err and err.count("\n") == 1
    assert model.read_bytes() == before and sorted(p.name for p in out.iterdir()) == ["m.tflite"]


@pytest.mark.parametrize("kind", ["foreign", "file"])
def test_refuses_a_folder_it_did_not_write(tmp_path, capsys, kind):
    out = tmp_path / "out"
    if kind == "foreign":
        out.mkdir()
        (out / "thesis.tex").write_text("mine")
    else:
        out.write_text("a file")
    assert main(["compile", str(TINY), "-n", "2", "-o", str(out)]) == 2
    assert "choose a new or empty folder" in capsys.readouterr().err
    assert (out / "thesis.tex").read_text() == "mine" if kind == "foreign" else out.read_text() == "a file"


def test_concurrent_compiles_leave_one_consistent_result(tmp_path):
    out = tmp_path / "out"
    procs = [subprocess.Popen([*CLI, "compile", str(TINY), "-n", str(n), "-o", str(out), "--time-limit", "2",
                               "--no-rewrite"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for n in (2, 3)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    rep = json.loads((out / "report.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == sorted(rep["files"])
    assert len(rep["segments"]) == rep["num_segments"]
    assert _leftovers(tmp_path) == []


def _start_and_signal(args, tmp_path, sig, after_s, wait_for: str | None = None):
    """Start the CLI, wait until its log shows `wait_for` (if given) and `after_s` more, signal it."""
    log = tmp_path / "stderr.log"
    with open(log, "w") as err_fh:
        proc = subprocess.Popen([*CLI, *args], stdout=subprocess.DEVNULL, stderr=err_fh, text=True, cwd=tmp_path,
                                preexec_fn=_as_from_a_terminal)
        deadline = time.monotonic() + 120
        while wait_for and wait_for not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(after_s)
        sent = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=30)
    waited = time.monotonic() - sent
    err = log.read_text()
    log.unlink()
    return proc.returncode, waited, err


@pytest.mark.timing
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_during_the_solve_ends_at_once_and_keeps_the_earlier_result(tmp_path, sig, code):
    out = tmp_path / "out"
    assert main(["compile", str(TINY), "-n", "2", "-o", str(out), "--time-limit", "2"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # the hard model's schedule search runs for its share of the hour on any machine: the signal
    # always lands in the middle of it, however fast the machine is
    hard = hard_schedule_model(tmp_path / "hard.tflite")
    rc, waited, err = _start_and_signal(["compile", str(hard), "-n", "2", "-o", str(out), "--time-limit", "3600",
                                         "--no-rewrite"], tmp_path, sig, after_s=1.0, wait_for="schedule (up to")
    assert rc == code
    assert waited < 5.0  # generous for a loaded machine; the design target is GRACE_S
    lines = [ln for ln in err.splitlines() if not ln.startswith("[")]  # progress lines start with [elapsed]
    assert lines == ["interrupted"], err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _leftovers(tmp_path) == []


@pytest.mark.timing
def test_an_interrupt_at_startup_is_one_line(tmp_path):
    """Ctrl-C while the heavy modules load (numpy is mapped, OR-Tools and LiteRT are still to come)."""
    proc = subprocess.Popen([*CLI, "inspect", str(TINY)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_as_from_a_terminal)
    maps = Path(f"/proc/{proc.pid}/maps")
    deadline = time.monotonic() + 60
    while "numpy" not in maps.read_text() and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert (proc.returncode, err) == (130, "interrupted\n")


def test_an_interrupt_python_drops_still_ends_the_command_as_interrupted():
    """An interrupt landing inside a `__del__` or a weakref callback (in CI: importlib's
    module-lock callback during startup) is dropped by Python, which prints a traceback and goes
    on; the command must still end as interrupted, in one line, not succeed."""
    script = f"""
import signal, sys
import tpu_pipeline.commands.inspect as command
from tpu_pipeline.cli import main
from tpu_pipeline.toolchain import interrupts
interrupts.install()
class Dropped:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)
        sum(range(3))  # the handler runs here, inside __del__
real = command.run
def run(args):
    Dropped()
    return real(args)
command.run = run
sys.exit(main(["inspect", {str(TINY)!r}]))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          preexec_fn=_as_from_a_terminal)
    assert (proc.returncode, proc.stderr) == (130, "interrupted\n")


def test_the_hard_exit_and_the_main_thread_never_both_report_an_interrupt():
    """The watcher's hard exit (GRACE_S after an interrupt the main thread has not answered) and a
    main thread that answers it just then: one `interrupted`, not two. Here the hard exit starts
    at once and lingers removing its temporaries while the command returns after a dropped
    interrupt and the process then lingers too."""
    script = f"""
import signal, sys, time
import tpu_pipeline.commands.inspect as command
from tpu_pipeline.cli import main
from tpu_pipeline.toolchain import interrupts
interrupts.GRACE_S = 0.0
remove = interrupts._remove_temps
interrupts._remove_temps = lambda: (time.sleep(0.6), remove())
interrupts.install()
class Dropped:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)
        sum(range(3))  # the handler runs here, inside __del__
def run(args):
    Dropped()
    time.sleep(0.3)  # the hard exit has begun
    return 0
command.run = run
code = main(["inspect", {str(TINY)!r}])
time.sleep(1.0)
sys.exit(code)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          preexec_fn=_as_from_a_terminal)
    assert (proc.returncode, proc.stderr) == (130, "interrupted\n")


@pytest.mark.timing
def test_progress_is_one_line_per_pass_with_elapsed_time_when_not_a_terminal(tmp_path):
    # a limit no pass reaches on any machine: every pass runs (a short one skips passes when slow)
    proc = subprocess.run([*CLI, "compile", str(TINY), "-n", "2", "-o", str(tmp_path / "o"), "--time-limit", "600",
                           "--json"], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)  # stdout stays machine-readable
    done = [ln for ln in proc.stderr.splitlines() if ln.startswith("[") and " in " in ln]
    names = [ln.split("]", 1)[1].split(":")[0].strip() for ln in done]
    assert names == ["load", "rewrite", "schedule", "plan", "emit", "partition", "segments", "edgetpu_compiler"]


def _state(time_limit=1.0):
    from tpu_pipeline.toolchain.compile import compile_options
    return CompileState(compile_options(TINY, 2, None, time_limit=time_limit))


@pytest.mark.timing
def test_passes_share_one_budget():
    # every configuration of passes that can run together (fit and rewrite exclude each other)
    base = _state(0.2).options
    for budget in (None, 1000):
        opts = base.__class__(**{**base.__dict__, "budget": budget})
        assert sum(p.share for p in PASSES if p.when(opts)) < BUDGET_FACTOR
    seen = {}
    now = [0.0]  # the driver's clock, advanced by the passes alone: the same shares on every machine

    def greedy(name):
        def run(state, allowed):
            seen[name] = allowed
            now[0] += allowed  # a search that uses all it is given
            return state, PassRecord(name, "ran")
        return run

    passes = [Pass("a", greedy("a"), share=1.0, optional=True), Pass("b", greedy("b"), share=2.5, optional=True),
              Pass("c", greedy("c"), share=1.0, optional=True), Pass("d", greedy("d"), share=1.0)]
    state = _state(0.2)
    state = CompileState(state.options.__class__(**{**state.options.__dict__, "passes": ("a", "b", "c")}))
    _, records = run_passes(passes, state, clock=lambda: now[0])
    assert seen["a"] == pytest.approx(0.2) and seen["b"] == pytest.approx(0.5)
    assert seen["c"] == pytest.approx(BUDGET_FACTOR * 0.2 - 0.7)  # only what is left of 4 x 0.2 s
    assert [r.status for r in records] == ["ran"] * 4
    assert seen["d"] == pytest.approx(0.5)  # a required pass still gets its minimum slice
    assert [r.seconds for r in records] == pytest.approx([seen[k] for k in "abcd"])
    assert now[0] == pytest.approx(BUDGET_FACTOR * 0.2 + 0.5)  # the total: the budget + the minimum slice


def test_a_bug_in_a_pass_names_the_pass_and_a_broken_graph_is_caught():
    def boom(state, allowed):
        raise ZeroDivisionError("x")

    with pytest.raises(PassError, match="pass 'boom' failed"):
        run_passes([Pass("boom", boom)], _state())
    from tpu_pipeline.toolchain.compile.passes.load import load

    def drop_first_op(state, allowed):
        g = state.graph
        return state.__class__(**{**state.__dict__, "graph": g.__class__(g.tensors, g.ops[1:], g.inputs, g.outputs)}), \
            PassRecord("drop", "ran")

    state, _ = run_passes([Pass("load", load)], _state())
    with pytest.raises(PassError, match="pass 'drop' left an invalid graph"):
        run_passes([Pass("drop", drop_first_op)], state)


def test_a_compile_failing_after_its_files_started_writing_leaves_nothing(tmp_path, monkeypatch):
    """The model files go to the hidden folder while later passes run (ResultFolder.write_soon);
    a later pass that fails removes that folder, and the output's parent folders it created,
    and an earlier result stays whole."""
    import tpu_pipeline.toolchain.compile as compile_mod

    out = tmp_path / "out"
    assert main(["compile", str(TINY), "-n", "2", "-o", str(out), "--time-limit", "2"]) == 0
    before = sorted(p.name for p in out.iterdir())

    def boom(state, allowed):
        assert any(p.name.startswith(".") for p in state.options.out_dir.parent.iterdir()), "nothing written early"
        raise ZeroDivisionError("x")

    monkeypatch.setattr(compile_mod, "PASSES", [*compile_mod.PASSES, Pass("boom", boom)])
    with pytest.raises(PassError, match="pass 'boom' failed"):
        compile_models(TINY, 2, tmp_path / "new" / "out", time_limit=2)
    assert not (tmp_path / "new").exists()
    with pytest.raises(PassError, match="pass 'boom' failed"):
        compile_models(TINY, 3, out, time_limit=2)
    assert sorted(p.name for p in out.iterdir()) == before
    assert _leftovers(tmp_path) == []


@pytest.mark.timing
def test_segment_files_are_written_from_their_pieces_byte_for_byte(tmp_path, monkeypatch):
    """A segment is written as its pieces (the tables, then each large constant buffer straight from
    the model's array, no join): the file must be exactly the joined serialisation the report and
    --verify see, for a model whose weights do go out as separate pieces."""
    import tpu_pipeline.toolchain.compile as compile_mod

    seen = {}

    def capture(state, allowed):
        seen["segments"] = state.segments
        return state, PassRecord("capture", "ran", 0.0, {})

    monkeypatch.setattr(compile_mod, "PASSES", [*compile_mod.PASSES, Pass("capture", capture)])
    out = tmp_path / "out"
    compile_models(EXAMPLE, 3, out, time_limit=2)
    segments = seen["segments"]
    assert len(segments) == 3
    assert any(isinstance(c, memoryview) for s in segments for c in s.chunks), "no weights written as a view"
    for seg in segments:
        written = (out / seg.file).read_bytes()
        assert written == seg.data
        assert len(written) == seg.report["file_bytes"]


def test_budget_allowance():
    b = Budget(10.0)
    assert b.allowance(1.0, required=False) == pytest.approx(10.0, abs=0.1)
    assert b.allowance(0.0, required=True) == 0.0
    b.start -= 100
    assert b.allowance(1.0, required=False) < 0 and b.allowance(1.0, required=True) > 0


# ---- real-model cases from issue 10, end to end through compile ---------------------------------

def test_compile_verify_on_a_custom_op_model_keeps_it_on_the_host_and_says_what_is_unverified(tmp_path, capsys):
    from tpu_pipeline.toolchain.tflite import write_model
    from helpers.models import with_custom_op

    src = tmp_path / "decoder.tflite"
    write_model(with_custom_op("chain_int8", after_op=3), src)
    out = tmp_path / "out"
    assert main(["compile", str(src), "-n", "3", "-o", str(out), "--verify", "--time-limit", "2", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    scope = rep["verification"]["scope"]
    assert scope["complete"] is False and any("MyCustomDecoder" in r for r in scope["reasons"])
    assert rep["verification"]["whole_vs_source"]["bit_identical"] is True
    assert "skipped" in rep["verification"]["whole_vs_source_tflm"]
    assert any("cannot run here" in n for n in rep["notes"])
    last = rep["segments"][-1]["file"]
    from tpu_pipeline.toolchain.loader import load
    _, g = load(out / last)
    assert any(op.is_custom for op in g.ops)  # the custom op and what follows it: last segment


@pytest.mark.parametrize("n", [2, 4])
def test_compile_verify_on_a_dynamic_batch_space_to_batch_model_is_exact_in_both_runtimes(tmp_path, capsys, n):
    src = FIXTURES / "darts_s2b_dynbatch_int8.tflite"
    out = tmp_path / "out"
    assert main(["compile", str(src), "-n", str(n), "-o", str(out), "--verify", "--time-limit", "2", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    v = rep["verification"]
    assert v["bit_identical"] and v["whole_vs_source"]["bit_identical"]
    assert v["whole_vs_source_tflm"]["bit_exact"] is True and v["whole_vs_source_tflm"]["hazards"] == []
    assert any("placeholder shapes" in n for n in rep["notes"])

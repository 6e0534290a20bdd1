"""Fuzzing: seeded mutants of the committed models (byte flips, truncations, header and offset
corruptions, vtable entries, splices of other models) and of a device descriptor, run through
`inspect`, `schedule`, `plan`, `compile -n 2 --no-rewrite` and `fit --objective memory`. Every run must end with a known
exit code (0-4, never 70), no traceback, no crash or hang; a model written with exit 0 must load
in LiteRT (or, where the command checked it in TFLite Micro alone, load and run there). A few
mutants per model here (about a minute); `python tools/fuzz.py --count N` runs
more (make bench).
"""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import fuzz  # noqa: E402

MUTANTS_PER_MODEL = 5
MUTANTS = {"fit": 2}  # fit also runs the model in LiteRT and TFLite Micro: fewer, to keep the suite lean
SEED = 20261123


def _report(bad) -> str:
    return "\n".join(f"{o.command} {o.fixture} [{o.mutation}]: {'; '.join(o.problems)}\n    "
                     + "\n    ".join(o.output.strip().splitlines()[-4:]) for o in bad)


def test_mutators_are_seeded_and_change_the_model():
    data = fuzz.fixture_models()[0].read_bytes()
    others = [p.read_bytes() for p in fuzz.fixture_models()[1:]]
    a = [fuzz.mutate(data, fuzz.random.Random(f"s{k}"), others) for k in range(20)]
    b = [fuzz.mutate(data, fuzz.random.Random(f"s{k}"), others) for k in range(20)]
    assert a == b
    assert sum(1 for m, _ in a if m != data) >= 18


@pytest.mark.parametrize("command", fuzz.COMMANDS)
def test_mutated_models_fail_cleanly(command):
    count = MUTANTS.get(command, MUTANTS_PER_MODEL)
    outcomes = fuzz.campaign(count, SEED, commands=(command,), timeout=180.0, toml_count=0)
    assert len(outcomes) == count * len(fuzz.fixture_models())
    bad = [o for o in outcomes if o.problems]
    assert not bad, _report(bad)
    # the campaign must reach past the reader, or it tests nothing but the header checks
    assert any(o.code == 0 for o in outcomes) and any(o.code == 2 for o in outcomes)


def test_mutated_device_descriptors_fail_cleanly():
    fixtures = [ROOT / "tests" / "fixtures" / "chain_int8.tflite"]
    outcomes = fuzz.campaign(0, SEED, commands=(), fixtures=fixtures, timeout=180.0, toml_count=12)
    assert len(outcomes) == 12
    bad = [o for o in outcomes if o.problems]
    assert not bad, _report(bad)

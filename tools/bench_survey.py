#!/usr/bin/env python3
"""`make bench`'s entry to the survey of real third-party models (tools/survey.py).

    python tools/bench_survey.py --models models

The real models are not in the repository and the zoo does not build them: they come from public
repositories (TFLite Micro's examples, MLPerf Tiny, TinyEngine, Coral's test data, TensorFlow's
examples, OpenMV; see the section's source table), collected into a folder laid out as
`DIR/<source>/<model>.tflite` with `DIR/MANIFEST.json`. Point `SURVEY_MODELS` at that folder (or
put it at `MODELS/real`); without it the survey section (docs/bench/survey.md) stays as it was
last generated, and this says so. `SURVEY_FIRMWARE=1` adds the QEMU firmware runs (slow).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="models")
    args = ap.parse_args()
    folder = Path(os.environ.get("SURVEY_MODELS") or Path(args.models) / "real")
    if not (folder / "MANIFEST.json").exists():
        print(f"survey: no real models at {folder} (set SURVEY_MODELS); docs/bench/survey.md left as it is")
        return 0
    cmd = [sys.executable, str(ROOT / "tools" / "survey.py"), "--models", str(folder)]
    if os.environ.get("SURVEY_FIRMWARE") == "1":
        cmd.append("--firmware")
    return subprocess.call(cmd, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())

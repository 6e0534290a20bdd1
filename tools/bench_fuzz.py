#!/usr/bin/env python3
"""The longer fuzz campaign for `make bench` (the short one runs in `make test`): writes
docs/bench/fuzz.md with tools/fuzz.py's summary table and the command that made it.

    python tools/bench_fuzz.py [--models DIR] [--count 20] [--seed 1]

`--models` is accepted for tools/bench.py's uniform call; the campaign mutates the committed
fixtures, not the zoo.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="ignored (the campaign uses the committed fixtures)")
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    cmd = ["tools/fuzz.py", "--count", str(args.count), "--seed", str(args.seed)]
    proc = subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True)
    text = ["## Fuzzing", "", f"`python {' '.join(cmd)}` (exit {proc.returncode}: 0 means no internal error, "
            "traceback, crash or hang)", "", "```", proc.stdout.strip(), "```", ""]
    (ROOT / "docs" / "bench" / "fuzz.md").write_text("\n".join(text))
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())

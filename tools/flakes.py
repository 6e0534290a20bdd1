"""Run the tests about time (marker `timing`) several times, idle and with every core kept busy,
so a test that holds only on a fast enough (or slow enough) machine shows up here before CI.

    python tools/flakes.py [--runs 3] [--marker timing] [--hog-only | --idle-only] [-- PYTEST ARGS]

The load is one busy-looping process per core (what a parallel build beside the suite does).
Prints one line per run and, at the end, every test that failed in any run with the condition
it failed under; exits 1 when one did. `make flakes` runs it with the defaults.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _spin() -> None:
    while True:
        pass


class Hog:
    """One busy process per core for as long as the block runs."""

    def __init__(self, cores: int | None = None):
        self.cores = cores or os.cpu_count() or 2
        self.procs: list[mp.Process] = []

    def __enter__(self) -> "Hog":
        self.procs = [mp.Process(target=_spin, daemon=True) for _ in range(self.cores)]
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
            p.join()


def run_once(marker: str, extra: list[str]) -> tuple[int, list[str], float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", marker, "-q", "-rf", "-p", "no:cacheprovider",
                           *extra], cwd=ROOT, capture_output=True, text=True)
    failed = re.findall(r"^FAILED (\S+)", proc.stdout, re.M)
    return proc.returncode, failed, time.monotonic() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per condition (default 3)")
    ap.add_argument("--marker", default="timing", help="pytest marker expression (default: timing)")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--hog-only", action="store_true", help="only the runs under load")
    only.add_argument("--idle-only", action="store_true", help="only the idle runs")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = ap.parse_args(argv)
    conditions = [c for c in ("idle", "loaded") if not (c == "idle" and args.hog_only)
                  and not (c == "loaded" and args.idle_only)]
    failures: dict[str, list[str]] = defaultdict(list)
    broken = False
    for condition in conditions:
        for k in range(1, args.runs + 1):
            if condition == "loaded":
                with Hog():
                    code, failed, secs = run_once(args.marker, args.pytest_args)
            else:
                code, failed, secs = run_once(args.marker, args.pytest_args)
            broken |= code not in (0, 1, 5)  # 1: failures (listed); 5: nothing collected
            print(f"{condition} run {k}/{args.runs}: exit {code}, {len(failed)} failed, {secs:.0f} s", flush=True)
            for name in failed:
                failures[name].append(f"{condition} {k}")
    for name, where in sorted(failures.items()):
        print(f"FLAKY {name}: failed in {', '.join(where)}")
    if not failures and not broken:
        print(f"no failures in {args.runs} run(s) per condition ({', '.join(conditions)})")
    return 1 if failures or broken else 0


if __name__ == "__main__":
    sys.exit(main())

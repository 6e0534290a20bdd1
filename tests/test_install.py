"""A non-editable install works from any folder (issue 10, item 11).

Builds the wheel from a copy of the checkout, installs it into a fresh virtual environment whose
only other packages are this environment's (reached through a .pth line, so nothing is
downloaded), and runs the commands that read package data (device descriptors, the harness
firmware, the C search source) from a folder outside the checkout.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "fixtures" / "tiny_irregular_int8.tflite"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# Files the code opens at run time; each must be in the wheel.
PACKAGE_DATA = [
    "tpu_pipeline/py.typed",
    "tpu_pipeline/toolchain/memory/_canonical_search.c",
    "tpu_pipeline/toolchain/schedule/_best_first.c",
    "tpu_pipeline/toolchain/data/devices/sparkfun-edge.toml",
    "tpu_pipeline/toolchain/data/devices/coral-usb.toml",
    "tpu_pipeline/toolchain/data/firmware/PROTOCOL.md",
    "tpu_pipeline/toolchain/data/firmware/harness/main.cc",
    "tpu_pipeline/toolchain/data/firmware/harness/harness_platform.h",
    "tpu_pipeline/toolchain/data/firmware/sparkfun-edge/platform.cc",
]


def _setuptools_version() -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in md.version("setuptools").split(".")[:2])
    except (md.PackageNotFoundError, ValueError):
        return None


def _build_wheel(dest: Path) -> Path:
    """The wheel of a copy of the checkout (a build in place would write build/ into it)."""
    need = next(r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools"))
    floor = tuple(int(x) for x in need.split(">=")[1].split("."))
    have = _setuptools_version()
    if have is None or have < floor:
        # Without the backend installed here, a build needs the package index (build isolation).
        pytest.skip(f"cannot build offline: needs {need} in this environment, found "
                    f"{'none' if have is None else '.'.join(map(str, have))} (pip install -e '.[test]')")
    src = dest / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for pkg in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]:
        top = pkg.rstrip("*")
        shutil.copytree(ROOT / top, src / top, ignore=ignore)
    dist = dest / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                           "--no-index", "-q", "-w", str(dist)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout}\n{proc.stderr}"
    wheels = list(dist.glob("tpu_pipeline-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel, the fresh environment's bin/, a work folder outside the checkout)."""
    tmp = tmp_path_factory.mktemp("install")
    wheel = _build_wheel(tmp)
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    # This environment's dependencies, as plain path lines: its .pth files (the editable install's
    # finder among them) are not processed, so `tpu_pipeline` can only come from the wheel.
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (purelib / "_tpu_pipeline_test_deps.pth").write_text("\n".join(sorted(ours)) + "\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                           "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"pip install of the wheel failed:\n{proc.stdout}\n{proc.stderr}"
    work = tmp / "elsewhere"
    work.mkdir()
    return wheel, env_dir / "bin", work


def _run(bindir: Path, work: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([str(bindir / args[0]), *args[1:]], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_wheel_installs_one_top_level_package(installed):
    """One import name, the tool's own: a generic top-level name (`runtime`, `toolchain`) would
    overwrite, or be overwritten by, an unrelated distribution of that name."""
    wheel, _, _ = installed
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"tpu_pipeline"}
    info = next(n for n in names if n.endswith(".dist-info/top_level.txt")) if any(
        n.endswith("top_level.txt") for n in names) else None
    if info is not None:
        with zipfile.ZipFile(wheel) as z:
            assert z.read(info).decode().split() == ["tpu_pipeline"]


def test_wheel_holds_the_package_data(installed):
    wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in PACKAGE_DATA if f not in names]
    assert not missing, f"not in the wheel: {missing}"
    # every data file, including ones added after this test was written
    data = [p for p in (ROOT / "tpu_pipeline" / "toolchain" / "data").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    assert len(data) > len(PACKAGE_DATA) // 2
    missing = [str(p.relative_to(ROOT)) for p in data if str(p.relative_to(ROOT)) not in names]
    assert not missing, f"not in the wheel: {missing}"


def test_the_installed_copy_is_the_one_imported(installed):
    _, bindir, work = installed
    proc = _run(bindir, work, "python", "-c",
                "import tpu_pipeline.toolchain, tpu_pipeline.toolchain.device as d, tpu_pipeline.toolchain.memory.native_search as n; "
                "import tpu_pipeline.toolchain.schedule.native_search as s; "
                "print(tpu_pipeline.toolchain.__file__); print(d.available_devices()); print(n._SOURCE.is_file()); "
                "print(s._SOURCE.is_file(), s.available())")
    assert proc.returncode == 0, proc.stderr
    path, devices, c_source, schedule_c = proc.stdout.splitlines()
    assert str(bindir.parent) in path and str(ROOT) not in path
    assert "sparkfun-edge" in devices and "coral-usb" in devices
    assert c_source == "True"
    assert schedule_c == "True True"  # the C search builds from the installed copy


def test_inspect_from_another_folder(installed):
    _, bindir, work = installed
    proc = _run(bindir, work, "tpu-pipeline", "inspect", str(MODEL))
    assert proc.returncode == 0, proc.stderr
    assert "17 ops" in proc.stdout


def test_export_mcu_from_another_folder(installed):
    _, bindir, work = installed
    proc = _run(bindir, work, "tpu-pipeline", "export-mcu", str(MODEL), "--device", "sparkfun-edge", "-o", "fw")
    assert proc.returncode == 0, proc.stderr
    files = {p.name for p in (work / "fw").iterdir()}
    # the harness sources come from the package data
    assert {"main.cc", "harness_platform.h", "model_data.cc", "op_resolver.h", "harness_config.h"} <= files


def test_profile_from_another_folder(installed):
    _, bindir, work = installed
    proc = _run(bindir, work, "tpu-pipeline", "profile", str(MODEL), "--device", "sparkfun-edge", "-N", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    assert '"fits": true' in proc.stdout


# ---- what README's install line installs ------------------------------------------------------

def _guarded(tree) -> set[int]:
    """ids of import nodes inside `try: ... except ImportError` (optional, used when present)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def _third_party_imports() -> set[str]:
    found = set()
    for pkg in ("tpu_pipeline",):
        for f in (ROOT / pkg).rglob("*.py"):
            tree = ast.parse(f.read_text(), str(f))
            optional = _guarded(tree)
            for node in ast.walk(tree):
                if id(node) in optional:
                    continue
                if isinstance(node, ast.Import):
                    found.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != "tpu_pipeline"}


def _dist_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_every_runtime_import_is_a_dependency():
    """`pip install .` (no extras) must bring every module the toolchain and runtime import."""
    declared = {_dist_name(r) for r in PYPROJECT["project"]["dependencies"]}
    owners = md.packages_distributions()
    missing = {}
    for module in sorted(_third_party_imports()):
        dists = {d.lower().replace("_", "-") for d in owners.get(module, [])}
        if not dists:
            missing[module] = "not installed here"
        elif not dists & declared:
            missing[module] = f"from {sorted(dists)}, not in [project] dependencies"
    assert not missing, missing
    assert "tflite-micro" in declared  # compile --verify, profile and export-mcu need it


def test_readme_install_lines_match_the_project():
    text = (ROOT / "README.md").read_text()
    lines = [ln for ln in text.splitlines() if "-m venv" in ln and "pip install" in ln]
    assert lines, "README shows no install line without make"
    for ln in lines:
        args = ln.split("pip install", 1)[1].split("`")[0].split("&&")[0].split()
        # no extras: the dependencies alone make the commands work
        assert args and args[-1] == "." and not any("[" in a for a in args), ln
    low, high = re.search(r"Python (3\.\d+)[–-](3\.\d+)", text).groups()
    requires = PYPROJECT["project"]["requires-python"]
    assert requires == f">={low}", f"README says Python {low}-{high}, pyproject says {requires}"

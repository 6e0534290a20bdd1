"""Architecture rules the layout must keep (issue 11)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _python_files(*folders: str):
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


# LiteRT's `Interpreter(` and TFLite Micro's `Interpreter.from_bytes(`
_CONSTRUCTS_INTERPRETER = re.compile(r"\bInterpreter(\.from_bytes)?\(")


def test_interpreters_are_built_only_in_the_execute_room():
    """One room runs models: every LiteRT and TFLite Micro interpreter is constructed in
    tpu_pipeline/toolchain/execute/ (tools/build_zoo.py runs in TensorFlow's own environment and is left out)."""
    execute = ROOT / "tpu_pipeline" / "toolchain" / "execute"
    offenders = []
    for path in _python_files("tpu_pipeline", "tests", "tools"):
        if execute in path.parents or path == Path(__file__).resolve() or path.name == "build_zoo.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _CONSTRUCTS_INTERPRETER.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []


# ---- H8: only tpu_pipeline/toolchain/tflite and tpu_pipeline/toolchain/ir/convert*.py know the flatbuffer schema ----------
def _schema_imports(source: str, label: str) -> list[str]:
    """Import statements in `source` that reach the flatbuffer schema: the generated module itself
    (however it is spelled) or the `schema` name tpu_pipeline.toolchain.tflite re-exports."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source, label)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [f"{module}.{a.name}" for a in node.names]
            if module.startswith("tpu_pipeline.toolchain.tflite") and any(a.name == "schema" for a in node.names):
                names.append("schema_py_generated (re-exported by tpu_pipeline.toolchain.tflite)")
        else:
            continue
        if any("schema_py_generated" in n for n in names):
            found.append(f"{label}:{node.lineno}")
    return found


def _schema_room(path: Path) -> bool:
    rel = path.relative_to(ROOT / "tpu_pipeline" / "toolchain")
    return rel.parts[0] == "tflite" or (rel.parts[0] == "ir" and rel.name.startswith("convert"))


def test_only_tflite_and_ir_convert_import_the_flatbuffer_schema():
    offenders = [hit for path in _python_files("tpu_pipeline/toolchain") if not _schema_room(path)
                 for hit in _schema_imports(path.read_text(), str(path.relative_to(ROOT)))]
    assert offenders == []


def test_no_schema_type_named_outside_the_schema_rooms():
    """The flatbuffer's object types (ModelT, SubGraphT, TensorT, ...) appear in no signature or
    docstring outside tflite/ and ir/convert.py: a model crosses the other rooms as bytes or as an
    opaque object the schema rooms read."""
    pattern = re.compile(r"\b(Model|SubGraph|Tensor|Operator|OperatorCode|Buffer|Metadata)T\b")
    offenders = [f"{path.relative_to(ROOT)}:{n}" for path in _python_files("tpu_pipeline") if
                 not (ROOT / "tpu_pipeline" / "toolchain" in path.parents and _schema_room(path))
                 for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_schema_import_check_sees_every_spelling():
    """The check above must not pass vacuously: each way of importing the schema is caught."""
    for line in ["from ai_edge_litert import schema_py_generated as schema",
                 "import ai_edge_litert.schema_py_generated",
                 "from ai_edge_litert.schema_py_generated import ModelT",
                 "from tpu_pipeline.toolchain.tflite import read_model, schema",
                 "def f():\n    from tpu_pipeline.toolchain.tflite.io import schema"]:
        assert _schema_imports(line, "probe.py"), line
    assert _schema_imports("from tpu_pipeline.toolchain.tflite import read_model", "probe.py") == []
    assert _schema_room(ROOT / "tpu_pipeline" / "toolchain" / "ir" / "convert.py")
    assert _schema_room(ROOT / "tpu_pipeline" / "toolchain" / "tflite" / "extract.py")
    assert not _schema_room(ROOT / "tpu_pipeline" / "toolchain" / "ir" / "graph.py")


# ---- H10: the memory planners and the scheduler do not import each other -------------------------
def _imported_rooms(source: str, label: str) -> set[str]:
    """The `toolchain.<room>` packages `source` imports, at the top or inside a function."""
    import ast

    rooms = set()
    for node in ast.walk(ast.parse(source, label)):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            modules = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        rooms.update(m.split(".")[2] for m in modules if m.startswith("tpu_pipeline.toolchain."))
    return rooms


def _room_imports(room: str) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): _imported_rooms(p.read_text(), str(p))
            for p in _python_files(f"tpu_pipeline/toolchain/{room}")}


def test_no_import_cycle_between_memory_and_schedule():
    """The scheduler uses the memory model; the memory room never imports the scheduler (not even
    lazily), so the two cannot form a cycle. `plan_order_and_offsets` lives in tpu_pipeline/toolchain/schedule."""
    memory_to_schedule = [f for f, rooms in _room_imports("memory").items() if "schedule" in rooms]
    assert memory_to_schedule == []
    assert any("memory" in rooms for rooms in _room_imports("schedule").values())  # the allowed direction


def test_import_room_check_sees_lazy_imports():
    probe = "def f():\n    from tpu_pipeline.toolchain.schedule import schedule\n    import tpu_pipeline.toolchain.schedule.api\n"
    assert _imported_rooms(probe, "probe.py") == {"schedule"}
    assert _imported_rooms("from tpu_pipeline.toolchain import schedule", "probe.py") == {"schedule"}
    assert _imported_rooms("from . import lifetimes", "probe.py") == set()


# drawing a random tensor: numpy's Generator methods that made the old copies' inputs
_DRAWS_TENSORS = re.compile(r"\.(standard_normal|uniform|integers)\(")


def test_random_inputs_come_from_one_generator():
    """tpu_pipeline/toolchain/execute/inputs.py is the only code in tpu_pipeline/toolchain/ and tpu_pipeline/runtime/ that draws random
    tensors (there were four generators with different distributions)."""
    allowed = ROOT / "tpu_pipeline" / "toolchain" / "execute" / "inputs.py"
    offenders = [f"{path.relative_to(ROOT)}:{n}" for path in _python_files("tpu_pipeline/toolchain", "tpu_pipeline/runtime") if path != allowed
                 for n, line in enumerate(path.read_text().splitlines(), 1) if _DRAWS_TENSORS.search(line)]
    assert offenders == []


def test_memory_room_takes_no_flatbuffer_models():
    """The planners work on plain values: nothing in tpu_pipeline/toolchain/memory imports from tpu_pipeline.toolchain.tflite
    but its atomic file writer (the offline plan reaches a model only through with_offline_plan)."""
    import ast

    offenders = []
    for path in _python_files("tpu_pipeline/toolchain/memory"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level:
                modules = [node.module or ""]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {m}" for m in modules
                          if m.startswith(("tpu_pipeline.toolchain.tflite", "ai_edge_litert")) and m != "tpu_pipeline.toolchain.tflite.io"]
    assert offenders == []


# ---- issue 26: the package's import graph: no private names across modules, no cycles -------------
PACKAGE = ROOT / "tpu_pipeline"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(source: str, module: str, is_package: bool, label: str) -> list[tuple[int, str, str | None]]:
    """Every import in `source`, at the top or inside a function: (line, module imported from, name
    or None for `import x.y`), with relative imports resolved against `module`."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source, label)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([node.module] if node.module else []))
            found += [(node.lineno, base, a.name) for a in node.names]
    return found


def _private_imports(source: str, module: str, is_package: bool, label: str) -> list[str]:
    """Imports in `source` of a private name (`_x`: a function, class, constant or module) that
    another module of the package owns."""
    hits = []
    for line, base, name in _imports(source, module, is_package, label):
        if not base.startswith("tpu_pipeline"):
            continue
        dotted = base.split(".") + ([name] if name else [])
        if base != module and any(part.startswith("_") and not part.startswith("__") for part in dotted):
            hits.append(f"{label}:{line}: {base}{'.' + name if name else ''}")
    return hits


def test_no_module_imports_a_private_name_from_another():
    """A name shared between modules is public (named, documented); a private one stays home."""
    offenders = [hit for module, path in _package_modules().items()
                 for hit in _private_imports(path.read_text(), module, path.name == "__init__.py",
                                             str(path.relative_to(ROOT)))]
    assert offenders == []


def test_private_import_check_sees_every_spelling():
    mod = "tpu_pipeline.toolchain.rewrite.patch_build"
    for line in ["from tpu_pipeline.toolchain.rewrite.patch import _clip",
                 "def f():\n    from tpu_pipeline.toolchain.rewrite.patch import hw, _window",
                 "from .patch import _clip",
                 "from tpu_pipeline.toolchain.schedule import _native_search",
                 "import tpu_pipeline.toolchain.schedule._native_search"]:
        assert _private_imports(line, mod, False, "probe.py"), line
    for line in ["from tpu_pipeline.toolchain.rewrite.patch import clip",
                 "from tpu_pipeline.toolchain import budget as _budget",
                 "from __future__ import annotations",
                 "import numpy._core"]:
        assert _private_imports(line, mod, False, "probe.py") == [], line


def _imported_modules(source: str, module: str, is_package: bool, modules, label: str) -> set[str]:
    """The package modules `source` imports (at the top or inside a function): `from pkg import
    module` is an edge to the module, `from module import name` to the module, `import a.b` to a.b."""
    found = set()
    for _, base, name in _imports(source, module, is_package, label):
        target = f"{base}.{name}" if name and f"{base}.{name}" in modules else base
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != module:
            found.add(target)
    return found


def _import_graph() -> dict[str, set[str]]:
    modules = _package_modules()
    return {m: _imported_modules(p.read_text(), m, p.name == "__init__.py", modules, str(p.relative_to(ROOT)))
            for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_no_import_cycle_in_the_package():
    """Every module of tpu_pipeline can be imported on its own: no strongly connected component of
    the import graph (imports inside functions counted) holds two modules."""
    assert _cycles(_import_graph()) == []


def test_import_graph_sees_lazy_relative_and_submodule_imports():
    modules = {"tpu_pipeline.a", "tpu_pipeline.a.b", "tpu_pipeline.a.c", "tpu_pipeline.d"}
    probe = "import os\nfrom . import c\ndef f():\n    from tpu_pipeline.d import thing\n    import tpu_pipeline.a\n"
    assert _imported_modules(probe, "tpu_pipeline.a.b", False, modules, "probe.py") == {
        "tpu_pipeline.a.c", "tpu_pipeline.d", "tpu_pipeline.a"}
    assert _imported_modules("from .b import x", "tpu_pipeline.a", True, modules, "probe.py") == {"tpu_pipeline.a.b"}
    assert _cycles({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z"]]
    assert _cycles({"x": {"y"}, "y": set()}) == []


_CLI_AND_API = ("tpu_pipeline.cli", "tpu_pipeline.commands", "tpu_pipeline.api", "tpu_pipeline.entry",
                "tpu_pipeline.output", "tpu_pipeline.batch_runner", "tpu_pipeline.runtime")


def _reaches_runtime_or_cli(imported: set[str]) -> set[str]:
    return {m for m in imported if m == "tpu_pipeline" or any(m == p or m.startswith(p + ".") for p in _CLI_AND_API)}


def test_toolchain_never_imports_the_runtime_or_the_cli():
    """The compiler stands alone: nothing in tpu_pipeline/toolchain imports tpu_pipeline.runtime, the
    command line or the Python API above it (not even lazily)."""
    graph = _import_graph()
    offenders = {m: sorted(_reaches_runtime_or_cli(targets)) for m, targets in graph.items()
                 if m.startswith("tpu_pipeline.toolchain") and _reaches_runtime_or_cli(targets)}
    assert offenders == {}
    assert _reaches_runtime_or_cli(graph["tpu_pipeline.commands.compile"])  # the allowed direction is seen


def test_runtime_and_cli_check_sees_each_layer():
    for m in ["tpu_pipeline", "tpu_pipeline.cli", "tpu_pipeline.commands.fit", "tpu_pipeline.api",
              "tpu_pipeline.runtime.backends.qemu", "tpu_pipeline.output", "tpu_pipeline.batch_runner"]:
        assert _reaches_runtime_or_cli({m}) == {m}, m
    assert _reaches_runtime_or_cli({"tpu_pipeline.toolchain.ir", "tpu_pipeline.outputs"}) == set()


# the bottom layers and what each may import from the package (besides its own room)
_BOTTOM_LAYERS = {
    "tpu_pipeline.toolchain.tflite": ("tpu_pipeline.toolchain.errors", "tpu_pipeline.toolchain.interrupts"),
    "tpu_pipeline.toolchain.ir": ("tpu_pipeline.toolchain.errors", "tpu_pipeline.toolchain.tflite"),
}


def _above_the_layer(room: str, imported: set[str]) -> set[str]:
    allowed = (room, *_BOTTOM_LAYERS[room])
    return {m for m in imported if not any(m == a or m.startswith(a + ".") for a in allowed)}


def test_bottom_layers_run_nothing_and_load_nothing():
    """tflite/ reads, validates and writes flatbuffers and runs nothing (the runtimes are execute/'s);
    ir/ converts and loads nothing (loading a file for the passes is toolchain/loader.py's). Neither
    imports anything above it, not even lazily."""
    graph = _import_graph()
    offenders = {m: sorted(_above_the_layer(room, targets)) for room in _BOTTOM_LAYERS
                 for m, targets in graph.items() if (m == room or m.startswith(room + ".")) and _above_the_layer(room, targets)}
    assert offenders == {}


def test_bottom_layer_check_sees_a_runtime():
    assert _above_the_layer("tpu_pipeline.toolchain.tflite", {"tpu_pipeline.toolchain.execute.litert",
                                                             "tpu_pipeline.toolchain.tflite.io"}) == {
        "tpu_pipeline.toolchain.execute.litert"}
    assert _above_the_layer("tpu_pipeline.toolchain.ir", {"tpu_pipeline.toolchain.loader"}) == {"tpu_pipeline.toolchain.loader"}
    assert _above_the_layer("tpu_pipeline.toolchain.ir", {"tpu_pipeline.toolchain.tflite.names"}) == set()


def _map_entries(doc: str) -> dict[str, str]:
    """docs/architecture.md's map: package path -> the text of its entry (a list item
    "- `tpu_pipeline/x/`: ..." and its indented continuation lines)."""
    entries: dict[str, str] = {}
    current = None
    for line in doc.splitlines():
        found = re.match(r"- `(tpu_pipeline/[\w/]*)`:", line)
        if found:
            current = found.group(1)
            entries[current] = line
        elif current and line.startswith("  ") and line.strip():
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


def _missing_from_map(doc: str, modules: list[Path]) -> list[str]:
    entries = _map_entries(doc)
    missing = []
    for path in modules:
        if path.name == "__init__.py":
            continue  # a package is named by its entry
        package = path.parent.relative_to(ROOT).as_posix() + "/"
        if f"`{path.stem}`" not in entries.get(package, ""):
            missing.append(path.relative_to(ROOT).as_posix())
    return missing


def test_every_module_is_on_the_map():
    """docs/architecture.md names every module of the package in its package's entry, so the map
    cannot fall behind the code."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert _missing_from_map(doc, sorted(PACKAGE.rglob("*.py"))) == []


def test_map_check_sees_a_missing_module():
    doc = "- `tpu_pipeline/toolchain/fit/`: spans (`spans`), and\n  `select`.\n- `tpu_pipeline/x/`: `estimate`\n"
    fit = ROOT / "tpu_pipeline" / "toolchain" / "fit"
    assert _missing_from_map(doc, [fit / "spans.py", fit / "select.py", fit / "__init__.py"]) == []
    assert _missing_from_map(doc, [fit / "estimate.py"]) == ["tpu_pipeline/toolchain/fit/estimate.py"]


def _test_module_imports(source: str, label: str) -> list[str]:
    """Imports in `source` of a test module (`test_x`, `tests.test_x`): shared helpers belong in
    tests/helpers/ or conftest.py."""
    import ast

    hits = []
    for node in ast.walk(ast.parse(source, label)):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            modules = [node.module or ""]
        else:
            continue
        hits += [f"{label}:{node.lineno}: {m}" for m in modules if m.split(".")[-1].startswith("test_")]
    return hits


def test_no_test_module_imports_another():
    offenders = [hit for path in _python_files("tests")
                 for hit in _test_module_imports(path.read_text(), str(path.relative_to(ROOT)))]
    assert offenders == []
    assert _test_module_imports("def f():\n    from test_fit import run\nfrom tests.test_cost import X", "probe.py")
    assert _test_module_imports("from helpers.oracle import Oracle\nfrom conftest import ROOT", "probe.py") == []


# ---- issue 31: one typed device, one kernel-set value, a thin API -------------------------------
DEVICE_ROOM = "tpu_pipeline.toolchain.device"
# the descriptor's TOML tables: read as typed sections (Device.memory, .compute, ...) outside the room
_SECTIONS = {"memory", "compute", "link", "power", "timing", "firmware"}


def _in(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


def test_the_device_room_is_on_the_ground_floor():
    """tpu_pipeline/toolchain/device imports nothing of the package but itself and `errors` (not even
    lazily): every room may take a Device, and the device room depends on none of them."""
    graph = _import_graph()
    offenders = {m: sorted(t for t in targets if not (_in(t, DEVICE_ROOM) or t == "tpu_pipeline.toolchain.errors"))
                 for m, targets in graph.items() if _in(m, DEVICE_ROOM)}
    assert {m: t for m, t in offenders.items() if t} == {}
    assert any(_in(m, DEVICE_ROOM) for m in graph)


def _descriptor_reads(source: str, label: str) -> list[str]:
    """Places in `source` that read a device descriptor as a dict: `d["memory"]["sram_bytes"]`,
    `d["compute"].items()`, `d.get("link", {})`, `dev.get("timing", "per_op_s", 0.0)`, or any use
    of the old `device_dict`."""
    import ast

    def section(node) -> bool:
        return isinstance(node, ast.Constant) and node.value in _SECTIONS

    hits = []
    for node in ast.walk(ast.parse(source, label)):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Subscript) and section(node.value.slice):
            hits.append(f"{label}:{node.lineno}")  # d["memory"]["sram_bytes"]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Subscript) and section(node.value.slice):
            hits.append(f"{label}:{node.lineno}")  # d["compute"].items()
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and section(node.args[0])
              and (len(node.args) >= 3 or (len(node.args) == 2 and isinstance(node.args[1], ast.Dict)))):
            hits.append(f"{label}:{node.lineno}")  # d.get("link", {}), dev.get("timing", "per_op_s", 0.0)
        elif isinstance(node, (ast.Name, ast.Attribute)) and getattr(node, "id", getattr(node, "attr", None)) == "device_dict":
            hits.append(f"{label}:{node.lineno}")
        elif isinstance(node, ast.alias) and node.name == "device_dict":
            hits.append(f"{label}:{getattr(node, 'lineno', 0)}")
    return hits


def test_no_module_outside_the_device_room_reads_a_descriptor_as_a_dict():
    """A board's facts are read from the typed Device (tpu_pipeline/toolchain/device), loaded and
    validated once; nothing else digs in the parsed TOML."""
    offenders = [hit for module, path in _package_modules().items() if not _in(module, DEVICE_ROOM)
                 for hit in _descriptor_reads(path.read_text(), str(path.relative_to(ROOT)))]
    assert offenders == []


def test_descriptor_read_check_sees_every_spelling():
    for line in ['sram = int(d["memory"]["sram_bytes"])', 'cpm = d["compute"].items()',
                 'baud = d.get("link", {}).get("baud", 115200)', 'x = device.get("timing", "per_op_s", 0.0)',
                 "from tpu_pipeline.toolchain.cost.mcu import device_dict", "d = mcu.device_dict(name)"]:
        assert _descriptor_reads(line, "probe.py"), line
    for line in ['users["link"] += 1', 'shares = {"link": 1.0}', "fw = device.firmware", 'meta.get("firmware")',
                 'extra["link"]']:
        assert _descriptor_reads(line, "probe.py") == [], line


def test_the_runtime_never_imports_the_cost_models():
    """The runtime reads board facts from the Device it is handed and asks for predictions through
    tpu_pipeline/toolchain/predict.py: nothing in tpu_pipeline/runtime imports toolchain/cost."""
    graph = _import_graph()
    offenders = {m: sorted(t for t in targets if _in(t, "tpu_pipeline.toolchain.cost"))
                 for m, targets in graph.items() if _in(m, "tpu_pipeline.runtime")}
    assert {m: t for m, t in offenders.items() if t} == {}
    modules = set(_package_modules())
    probe = "def f():\n    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu\n"
    assert "tpu_pipeline.toolchain.cost.mcu" in _imported_modules(probe, "tpu_pipeline.runtime.backends.x", False,
                                                                   modules, "probe.py")


def _between(graph: dict[str, set[str]], a: str, b: str) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if _in(m, a) for t in targets if _in(t, b))


def test_no_arrow_between_cost_and_firmware():
    """The cost models and the firmware builder share board facts through the device room, never
    through each other (the old tie: cost/devices.py imported firmware/library's CPU_FLAGS and
    firmware/project.py imported cost/devices)."""
    graph = _import_graph()
    cost, firmware = "tpu_pipeline.toolchain.cost", "tpu_pipeline.toolchain.firmware"
    assert _between(graph, cost, firmware) == [] and _between(graph, firmware, cost) == []
    probe = {"tpu_pipeline.toolchain.cost.devices": {"tpu_pipeline.toolchain.firmware.library"}}
    assert _between(probe, cost, firmware) == ["tpu_pipeline.toolchain.cost.devices -> tpu_pipeline.toolchain.firmware.library"]


_COMMAND_LINE = ("tpu_pipeline.cli", "tpu_pipeline.commands", "tpu_pipeline.entry", "tpu_pipeline.output")


def _lazy_loaders(source: str, label: str) -> dict[str, bool]:
    """The functions of `source` that import something: name -> has a docstring."""
    import ast

    return {f.name: ast.get_docstring(f) is not None for f in ast.walk(ast.parse(source, label))
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(f))}


def test_the_api_is_a_thin_face():
    """api.py imports nothing of the command line (what they share lives in the room that owns it,
    e.g. tflite/io.py's check_output), and imports at module level but in one documented lazy
    loader (OR-Tools only where it is needed)."""
    graph = _import_graph()
    assert sorted(t for t in graph["tpu_pipeline.api"] if any(_in(t, c) for c in _COMMAND_LINE)) == []
    loaders = _lazy_loaders((PACKAGE / "api.py").read_text(), "api.py")
    assert len(loaders) <= 1 and all(loaders.values()), loaders
    two = "import os\ndef f():\n    from a import b\ndef g():\n    \"doc\"\n    import c\n"
    assert _lazy_loaders(two, "probe.py") == {"f": False, "g": True}
    assert _lazy_loaders("import os\nfrom tpu_pipeline import output\n", "probe.py") == {}


def _literal_modules(text: str) -> list[str]:
    """Package modules whose code holds the string constant `text` (docstrings and messages
    counted; a longer string that contains it is another value)."""
    import ast

    return sorted(str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
                  if any(isinstance(n, ast.Constant) and n.value == text for n in ast.walk(ast.parse(p.read_text()))))


def test_the_kernel_set_is_defined_once():
    """"cmsis-nn" is spelled where the KernelSet value is defined (and at most one more module, the
    command line's parser); every other room passes the value."""
    found = _literal_modules("cmsis-nn")
    assert "tpu_pipeline/toolchain/device/kernel_sets.py" in found and len(found) <= 2, found
    assert len(_literal_modules("tflite")) > 2  # the check sees a string spelled in many modules


# Where a device name or path, or a kernel-set name, becomes the object: the command line, the API
# and the library's own entry points (compile_options, partition, fit_model's default cost device,
# the fake MCU's demo entry). Below them every room takes a Device and a KernelSet.
_RESOLVERS = {"tpu_pipeline.api", "tpu_pipeline.api_shared", "tpu_pipeline.commands.export_mcu", "tpu_pipeline.commands.build_firmware",
              "tpu_pipeline.toolchain.compile", "tpu_pipeline.toolchain.partition", "tpu_pipeline.toolchain.fit.model",
              "tpu_pipeline.runtime.fake_mcu", "tpu_pipeline.toolchain.firmware.library"}


def _resolutions(source: str, label: str) -> list[str]:
    import ast

    return [f"{label}:{n.lineno}" for n in ast.walk(ast.parse(source, label))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id in ("load_device", "kernel_set")]


def test_devices_and_kernel_sets_are_resolved_only_at_the_entry_points():
    offenders = [hit for module, path in _package_modules().items()
                 if module not in _RESOLVERS and not _in(module, DEVICE_ROOM)
                 for hit in _resolutions(path.read_text(), str(path.relative_to(ROOT)))]
    assert offenders == []
    assert _resolutions("def f(d):\n    return estimate(load_device(d), kernel_set('reference'))\n", "probe.py")


# Where a memory-semantics name ("tflm", "tflite") may become a Semantics value: the public API and
# the compile entry point, which take names from their callers. Below them a room passes the value
# (memory.TFLM, memory.TFLITE); the command line hands names to these entry points.
_SEMANTICS_RESOLVERS = {"tpu_pipeline.api", "tpu_pipeline.toolchain.compile", "tpu_pipeline.toolchain.memory.semantics"}


def _semantics_by_name(source: str, label: str) -> list[str]:
    """Calls that pass `semantics=` as a string, and parameters named `semantics` whose default is one."""
    import ast

    hits = []
    for node in ast.walk(ast.parse(source, label)):
        if isinstance(node, ast.keyword) and node.arg == "semantics" and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            hits.append(f"{label}:{node.value.lineno}")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.posonlyargs + node.args.args
            named = list(zip(args[len(args) - len(node.args.defaults):], node.args.defaults))
            named += [(a, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None]
            hits += [f"{label}:{d.lineno}" for a, d in named
                     if a.arg == "semantics" and isinstance(d, ast.Constant) and isinstance(d.value, str)]
    return hits


def test_semantics_are_passed_as_values_below_the_entry_points():
    offenders = [hit for module, path in _package_modules().items()
                 if module not in _SEMANTICS_RESOLVERS and not module.startswith("tpu_pipeline.commands")
                 for hit in _semantics_by_name(path.read_text(), str(path.relative_to(ROOT)))]
    assert offenders == []
    assert _semantics_by_name('def f(g):\n    return lifetimes(g, semantics="tflm")\n', "p.py") == ["p.py:2"]
    assert _semantics_by_name('def f(g, semantics="tflm"):\n    pass\n', "p.py") == ["p.py:1"]
    assert _semantics_by_name('def f(g, *, semantics: str = "tflite"):\n    pass\n', "p.py") == ["p.py:1"]
    assert _semantics_by_name("def f(g, semantics=TFLM):\n    return lifetimes(g, semantics=TFLM)\n", "p.py") == []


# "tflm" names the TFLite Micro semantics where the Semantics values are defined and where the command
# line parses it; in these modules it names something else, TFLite Micro itself: the runtime a model
# is verified in, the planner that copies its GreedyMemoryPlanner, or the library's cache folder.
_TFLM_AS_RUNTIME = {"tpu_pipeline/toolchain/execute/compare.py", "tpu_pipeline/toolchain/compile/passes/verify.py",
                    "tpu_pipeline/toolchain/memory/planners.py", "tpu_pipeline/toolchain/memory/runtime_planners.py",
                    "tpu_pipeline/toolchain/memory/tflm.py", "tpu_pipeline/toolchain/firmware/library.py"}
SEMANTICS_ROOM = "tpu_pipeline/toolchain/memory/semantics.py"


def _asks_semantics_name(source: str, label: str) -> list[str]:
    """Places that decide by a Semantics' name instead of its fields: `sem.name == "..."` (or !=,
    in), `sem.name.startswith("...")`, for any receiver whose name holds "sem"."""
    import ast

    def sem_name(n) -> bool:
        if not (isinstance(n, ast.Attribute) and n.attr == "name"):
            return False
        owner = n.value.attr if isinstance(n.value, ast.Attribute) else getattr(n.value, "id", "")
        return "sem" in owner

    hits = []
    for node in ast.walk(ast.parse(source, label)):
        if isinstance(node, ast.Compare) and any(sem_name(x) for x in (node.left, *node.comparators)):
            hits.append(f"{label}:{node.lineno}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith") and sem_name(node.func.value)):
            hits.append(f"{label}:{node.lineno}")
    return hits


def test_the_semantics_name_is_spelled_only_where_it_is_parsed():
    """"tflm" (and "tflm-cmsis-nn") as a semantics is spelled in the semantics room and the command
    line's choices only: below the entry points a room holds the Semantics value (memory.TFLM) and
    asks its fields (`is_tflm`, `kernels`), never its name."""
    found = [m for m in _literal_modules("tflm") if m not in _TFLM_AS_RUNTIME and not m.startswith("tpu_pipeline/commands/")]
    assert found == [SEMANTICS_ROOM], found
    assert _literal_modules("tflm-cmsis-nn") == [SEMANTICS_ROOM]
    asked = [hit for p in sorted(PACKAGE.rglob("*.py")) for hit in _asks_semantics_name(p.read_text(), str(p.relative_to(ROOT)))]
    assert asked == []
    assert "tpu_pipeline/toolchain/memory/semantics.py" in _literal_modules("tflite")  # the literal check sees a definition
    probe = 'def f(g, sem):\n    if sem.name == "tflm":\n        pass\n    return self.semantics.name.startswith("tfl")\n'
    assert _asks_semantics_name(probe, "p.py") == ["p.py:2", "p.py:4"]
    assert _asks_semantics_name("def f(op, sem):\n    return op.name == 'x' or sem.is_tflm\n", "p.py") == []


# A harness kernel's facts live in the module that declares it: its custom op code (TPUP_...) and
# its firmware source names are spelled there and nowhere else in the package, so a new kernel
# variant or harness op is its module plus one registration line, and every other room reads the
# registries (ir/kernel_variants REGISTRY, ir/harness_ops.py REGISTRY).
_HARNESS_DECLARERS = {"tpu_pipeline/toolchain/ir/harness_ops.py", "tpu_pipeline/toolchain/ir/stage.py",
                      "tpu_pipeline/toolchain/ir/mean_mul.py", "tpu_pipeline/toolchain/ir/fully_connected.py",
                      "tpu_pipeline/toolchain/ir/add.py"}
_HARNESS_SOURCES = frozenset(f.name for f in (PACKAGE / "toolchain" / "data" / "firmware" / "harness").iterdir()
                             if f.name.startswith("tpup_"))


def _harness_facts(source: str, label: str) -> list[str]:
    """String constants (docstrings aside) that name a harness firmware source or a custom op code."""
    import ast

    tree = ast.parse(source, label)
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [f"{label}:{n.lineno}: {n.value}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and (n.value in _HARNESS_SOURCES or re.fullmatch(r"TPUP_[A-Z0-9_]+", n.value))]


def test_a_harness_kernel_is_spelled_only_in_its_own_module():
    offenders = [hit for p in sorted(PACKAGE.rglob("*.py"))
                 if str(p.relative_to(ROOT)) not in _HARNESS_DECLARERS and "kernel_variants" not in p.parts
                 for hit in _harness_facts(p.read_text(), str(p.relative_to(ROOT)))]
    assert offenders == []
    assert {"tpup_conv.cc", "tpup_window.cc", "tpup_stage.cc"} <= _HARNESS_SOURCES
    probe = '"""Uses tpup_conv.cc."""\nFILES = ["tpup_conv.cc", "tpup_window.cc"]\nOPS = {"TPUP_MEAN": 1, "TPUP_": 2}\n'
    assert _harness_facts(probe, "p.py") == ["p.py:2: tpup_conv.cc", "p.py:2: tpup_window.cc", "p.py:3: TPUP_MEAN"]


MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600


def _oversized(source: str, label: str) -> list[str]:
    """Functions over MAX_FUNCTION_LINES (def to last line, docstring included) and the module if it
    is over MAX_MODULE_LINES: a long function or module is split along its seams, not left to grow."""
    import ast

    found = [f"{label}: {source.count(chr(10))} lines"] if source.count("\n") > MAX_MODULE_LINES else []
    for node in ast.walk(ast.parse(source, label)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{label}:{node.lineno}: {node.name} is {lines} lines")
    return found


def test_no_function_over_80_lines_and_no_module_over_600():
    found = [hit for p in sorted(PACKAGE.rglob("*.py")) for hit in _oversized(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == []


def test_size_check_sees_a_long_function_and_a_long_module():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert _oversized(f"def f():\n{body}", "probe.py") == [f"probe.py:1: f is {MAX_FUNCTION_LINES + 1} lines"]
    assert _oversized(f"class C:\n    def m(self):\n    {body.replace(chr(10), chr(10) + '    ')}", "p.py") != []
    assert _oversized("def f():\n" + body[: body.rindex("    x")], "probe.py") == []
    long_module = "x = 1\n" * (MAX_MODULE_LINES + 1)
    assert _oversized(long_module, "m.py") == [f"m.py: {MAX_MODULE_LINES + 1} lines"]
    assert _oversized("x = 1\n" * MAX_MODULE_LINES, "m.py") == []

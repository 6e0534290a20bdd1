"""Architecture rules the layout must keep (issue 11)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _python_files(*folders: str):
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


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
        rooms.update(m.split(".")[1] for m in modules if m.startswith("toolchain."))
    return rooms


def _room_imports(room: str) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): _imported_rooms(p.read_text(), str(p))
            for p in _python_files(f"toolchain/{room}")}


def test_no_import_cycle_between_memory_and_schedule():
    """The scheduler uses the memory model; the memory room never imports the scheduler (not even
    lazily), so the two cannot form a cycle. `plan_order_and_offsets` lives in toolchain/schedule."""
    memory_to_schedule = [f for f, rooms in _room_imports("memory").items() if "schedule" in rooms]
    assert memory_to_schedule == []
    assert any("memory" in rooms for rooms in _room_imports("schedule").values())  # the allowed direction


def test_import_room_check_sees_lazy_imports():
    probe = "def f():\n    from toolchain.schedule import schedule\n    import toolchain.schedule.api\n"
    assert _imported_rooms(probe, "probe.py") == {"schedule"}
    assert _imported_rooms("from toolchain import schedule", "probe.py") == {"schedule"}
    assert _imported_rooms("from . import lifetimes", "probe.py") == set()

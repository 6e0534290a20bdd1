"""The fitting tools write the package's TOML data through serializers, never by editing text.

A device descriptor (tpu_pipeline/toolchain/data/devices/*.toml) keeps its explanatory comments:
it is parsed and written back with tomlkit, which keeps comments and layout, and only the fitted
values change. Each value is given as TOML text (`f"{x:.6g}"`), so the file holds the number as
the tool printed it. The tool's stamp (how the numbers were fitted) is the comment block at the top
of the file, from "# FITTED by" to the descriptor's own first comment line; it is replaced whole.

The MCU cost tables (tpu_pipeline/toolchain/data/mcu_cost.toml) have no comments inside: the tools
write a header the tool composes, then the tables with tomli_w.
"""

from __future__ import annotations

import tomli_w
import tomlkit

STAMP_START = "# FITTED by"


def without_stamp(text: str, first_own_line: str) -> str:
    """`text` without a fitting tool's stamp at its top: the comment lines from "# FITTED by" up to
    the first line starting with `first_own_line` (the descriptor's own header)."""
    lines = text.splitlines(keepends=True)
    if not lines or not lines[0].startswith(STAMP_START):
        return text
    for k, line in enumerate(lines):
        if line.startswith(first_own_line):
            return "".join(lines[k:])
        if not line.startswith("#"):
            break
    raise SystemExit(f"the stamp at the top is not followed by a '{first_own_line}' comment line")


def with_fitted_values(text: str, values: dict[str, str], label: str,
                       added: dict[str, tuple[str, str]] | None = None) -> str:
    """`text` (a TOML document) with each dotted key of `values` (`"compute.efficiency.conv"`) set
    to the TOML value written as given; comments, order and every other value kept. A key that
    is not in the document is an error (the tool and the descriptor disagree). `added`: keys the
    fitted model needs that an older descriptor lacks, each (value, the comment line above it),
    added at the end of their table when missing."""
    doc = tomlkit.parse(text)
    for dotted, (raw, why) in (added or {}).items():
        *tables, key = dotted.split(".")
        table = _table(doc, tables, label, dotted)
        if key not in table:
            table.add(tomlkit.comment(why))
            table.add(key, tomlkit.value(raw))
            table.add(tomlkit.nl())
    for dotted, raw in values.items():
        *tables, key = dotted.split(".")
        table = _table(doc, tables, label, dotted)
        if key not in table:
            raise SystemExit(f"{label}: cannot find {dotted}")
        new = tomlkit.value(raw)
        old = table.item(key)
        for part in ("indent", "comment_ws", "comment", "trail"):  # the line around the value: its comment
            setattr(new.trivia, part, getattr(old.trivia, part))
        table[key] = new
    return tomlkit.dumps(doc)


def _table(doc, names: list[str], label: str, dotted: str):
    table = doc
    for name in names:
        table = table.get(name)
        if table is None:
            raise SystemExit(f"{label}: cannot find {dotted}")
    return table


def tables_text(header_lines: list[str], data: dict) -> str:
    """A TOML file of tables: `header_lines` as comment lines, a blank line, then `data`."""
    return "".join(f"# {line}\n" if line else "#\n" for line in header_lines) + "\n" + tomli_w.dumps(data)

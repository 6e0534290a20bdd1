"""The tile grids fit offers a patch region (fit/variants.py `patch_candidates`): square grids
(patches by copies and stages), row stripes and wide grids (stages)."""

from __future__ import annotations

MAX_STAGE_GRID = 16  # a stage's tiles per side: past this the halos cost more than the memory they save
# a wide grid's tiles: this many output rows high, at least WIDE_MIN_ASPECT times as wide (a 2-D
# streamed stage's kernels then run long rows, its column caches are short and it pastes few rows:
# detection's stage from the input at 40,320 B took 20.96 M instructions in QEMU on 16x5 and on
# 32x3 where its best square grid, 10x10, took 21.38 M, in the same arena)
WIDE_TILE_ROWS, WIDE_MIN_ASPECT = (1, 2), 4


def stage_grids(max_grid: tuple[int, int], out_hw: tuple[int, int] | None = None) -> list[tuple[tuple[int, int], bool]]:
    """A stage's grids, each (grid, recompute): row stripes (n x 1), which a stage runs streamed
    (the rows stripes share kept in stream buffers), and the square ones, streamed (the rows and
    columns tiles share kept in halo caches) and recomputing their halos (no caches: smaller
    where the caches cost more than the halos; `upgrade` keeps those only where they are);
    with the output's size `out_hw`, the wide grids too, streamed (`wide_grids`)
    (rewrite/patch_stage.py)."""
    squares = square_grids(max_grid)
    stripes = [(n, 1) for n in range(2, max_grid[0] + 1)]
    wide = wide_grids(out_hw, max_grid[1]) if out_hw else []
    return [(g, False) for g in dict.fromkeys(squares + stripes + wide)] + [(g, True) for g in squares if g[1] > 1]


def wide_grids(out_hw: tuple[int, int], max_cols: int) -> list[tuple[int, int]]:
    """Grids of short, wide tiles (rows x cols, more rows than columns): WIDE_TILE_ROWS output
    rows high, at least WIDE_MIN_ASPECT times as wide, up to 2 x MAX_STAGE_GRID rows (one-row
    tiles of a 32-row output)."""
    oh, ow = out_hw
    out = []
    for h in WIDE_TILE_ROWS:
        rows = -(-oh // h)
        if rows > 2 * MAX_STAGE_GRID:
            continue
        out += [(rows, c) for c in range(2, max_cols + 1) if ow // c >= WIDE_MIN_ASPECT * h and rows > c]
    return out


def square_grids(max_grid: tuple[int, int]) -> list[tuple[int, int]]:
    """Square grids from 2x2 within the limit (a side capped by a small output keeps the other
    side square), coarse first."""
    rows, cols = max_grid
    out = []
    for p in range(2, max(rows, cols) + 1):
        g = (min(p, rows), min(p, cols))
        if g[0] * g[1] >= 2 and g not in out:
            out.append(g)
    return out

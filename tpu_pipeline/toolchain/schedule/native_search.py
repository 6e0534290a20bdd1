"""The C best-first search and beam (`_best_first.c`): the problem as one struct, built once per
piece, and the results turned back into the same values as the Python searches'.

`Problem`, `Search` and `Beam` mirror the C structs of the same names field by field; the C
library reports its layout (`struct_layout`) and tests/test_schedule.py holds the two together.
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

from tpu_pipeline.toolchain.native import load_library
from tpu_pipeline.toolchain.schedule.problem import SearchResult, units_to_ops

_SOURCE = Path(__file__).with_name("_best_first.c")
_typed = False
_MASK64 = (1 << 64) - 1

i64, u64, c_int, u8 = ctypes.c_longlong, ctypes.c_ulonglong, ctypes.c_int, ctypes.c_ubyte
P = ctypes.POINTER


class Problem(ctypes.Structure):
    """The memory model, the piece and where it starts (see PROBLEM_FIELDS in _best_first.c)."""
    _fields_ = [
        ("W", c_int), ("Wu", c_int), ("m", c_int),
        ("unit_start", P(c_int)), ("unit_ops", P(c_int)), ("unit_mask", P(u64)),
        ("touch_start", P(c_int)), ("touch", P(c_int)),
        ("size", P(i64)), ("mask", P(u64)), ("pin_start", P(u8)), ("pin_end", P(u8)), ("extra", P(i64)),
        ("const_all", i64), ("final_only", i64),
        ("full", P(u64)), ("S0", P(u64)), ("R0", i64), ("g0", i64), ("upred", P(u64)),
        ("lazy_fork", P(c_int)), ("lazy_cons", P(c_int)), ("group_start", P(c_int)), ("group_units", P(c_int)),
        ("twin", P(c_int)),
    ]


class Search(ctypes.Structure):
    """best_first_search's limits and results (SEARCH_FIELDS)."""
    _fields_ = [
        ("ub", i64), ("floor", i64), ("seconds", ctypes.c_double), ("max_states", i64), ("max_bytes", i64),
        ("free_moves", c_int),
        ("out_units", P(c_int)), ("out_n", c_int), ("out_peak", i64), ("out_f", i64), ("out_states", i64),
    ]


class Beam(ctypes.Structure):
    """beam_search's limits and results (BEAM_FIELDS)."""
    _fields_ = [
        ("width", c_int), ("ub", i64), ("seconds", ctypes.c_double), ("max_bytes", i64),
        ("out_units", P(c_int)), ("out_n", c_int), ("out_peak", i64),
    ]


STRUCTS = (Problem, Search, Beam)  # in struct_layout's numbering


def _load():
    global _typed
    lib = load_library(_SOURCE)
    if lib is None or _typed:
        return lib
    lib.best_first_search.restype = c_int
    lib.best_first_search.argtypes = [P(Problem), P(Search)]
    lib.beam_search.restype = c_int
    lib.beam_search.argtypes = [P(Problem), P(Beam)]
    lib.struct_layout.restype = c_int
    lib.struct_layout.argtypes = [c_int, P(ctypes.c_char_p), P(P(i64)), P(P(i64)), P(i64)]
    _typed = True
    return lib


def available() -> bool:
    return _load() is not None


def c_layout(which: int) -> tuple[list[tuple[str, int, int]], int]:
    """The C struct number `which` (as STRUCTS): [(field, offset, size)] and its size."""
    lib = _load()
    names, offsets, widths, total = ctypes.c_char_p(), P(i64)(), P(i64)(), i64()
    n = lib.struct_layout(which, ctypes.byref(names), ctypes.byref(offsets), ctypes.byref(widths),
                          ctypes.byref(total))
    if n < 0:
        raise ValueError(f"no C struct number {which}")
    return [(name, offsets[k], widths[k]) for k, name in enumerate(names.value.decode().split())], total.value


def _array(ctype, values):
    values = list(values)
    return (ctype * max(len(values), 1))(*values)


def _words(x: int, W: int) -> list[int]:
    return [(x >> (64 * w)) & _MASK64 for w in range(W)]


def _model_arrays(model) -> dict:
    """The memory model's arrays (shared by every piece of the model)."""
    cached = getattr(model, "_native_arrays", None)
    if cached is not None:
        return cached
    W = max((model.n + 63) // 64, 1)
    touch_start, touch = [0], []
    for v in range(model.n):
        touch.extend(model.touch[v])
        touch_start.append(len(touch))
    arrays = dict(
        W=W, touch_start=_array(c_int, touch_start), touch=_array(c_int, touch),
        size=_array(i64, model.size),
        mask=_array(u64, (w for m in model.mask for w in _words(m, W))),
        pin_start=_array(u8, (int(b) for b in model.pin_start)),
        pin_end=_array(u8, (int(b) for b in model.pin_end)),
        extra=_array(i64, model.extra), full=_array(u64, _words(model.full, W)),
        const_all=model.const_all, final_only=model.final_only)
    object.__setattr__(model, "_native_arrays", arrays)  # MemModel is frozen; this is a cache
    return arrays


def _piece_arrays(piece) -> dict:
    """The piece's arrays; rebuilt if its lazy slices or twins changed since."""
    cached = getattr(piece, "_native_arrays", None)
    if cached is not None and cached[0] is piece.lazy and cached[2] is piece.twin:
        return cached[1]
    W = _model_arrays(piece.model)["W"]
    m = len(piece.units)
    Wu = max((m + 63) // 64, 1)
    unit_start, unit_ops = [0], []
    for u in piece.units:
        unit_ops.extend(u)
        unit_start.append(len(unit_ops))
    forks = sorted(piece.fork_groups)
    fork_index = {t: i for i, t in enumerate(forks)}
    group_start, group_units = [0], []
    for t in forks:
        group_units.extend(piece.fork_groups[t])
        group_start.append(len(group_units))
    lazy_fork = [fork_index[piece.lazy[k][0]] if k in piece.lazy else -1 for k in range(m)]
    lazy_cons = [piece.lazy[k][1] if k in piece.lazy else -1 for k in range(m)]
    arrays = dict(
        Wu=Wu, m=m, unit_start=_array(c_int, unit_start), unit_ops=_array(c_int, unit_ops),
        unit_mask=_array(u64, (w for x in piece.inside for w in _words(x, W))),
        S0=_array(u64, _words(piece.S0, W)), R0=piece.R0,
        upred=_array(u64, (w for x in piece.upred for w in _words(x, Wu))),
        lazy_fork=_array(c_int, lazy_fork), lazy_cons=_array(c_int, lazy_cons),
        group_start=_array(c_int, group_start), group_units=_array(c_int, group_units),
        twin=_array(c_int, piece.twin) if piece.twin else None)
    piece._native_arrays = (piece.lazy, arrays, piece.twin)
    return arrays


def _problem(piece, g0: int) -> Problem:
    """The problem both C searches read: the memory model, the piece and its start. The struct
    keeps the arrays it points to alive (ctypes holds them in its _objects)."""
    problem = Problem(g0=g0)
    for name, value in (*_model_arrays(piece.model).items(), *_piece_arrays(piece).items()):
        setattr(problem, name, value)
    return problem


def best_first(piece, ub: int, floor: int, static_lb: int, g0: int, deadline: float | None,
               max_states: int, max_bytes: int, free_moves: bool) -> SearchResult:
    """dp.best_first's search in C, from the point where the trivial cases are settled."""
    lib = _load()
    m = len(piece.units)
    out_units = (c_int * (m + 1))()
    q = Search(ub=ub, floor=floor, seconds=1e9 if deadline is None else max(deadline - time.monotonic(), 0.0),
               max_states=min(max_states, 2**62), max_bytes=max_bytes, free_moves=int(free_moves),
               out_units=out_units)
    status = lib.best_first_search(ctypes.byref(_problem(piece, g0)), ctypes.byref(q))
    states = int(q.out_states)
    if status == 1:
        order = units_to_ops(piece, [out_units[i] for i in range(q.out_n)])
        f = int(q.out_f)
        lb = f if f > floor else static_lb
        return SearchResult(order, int(q.out_peak), max(lb, static_lb), True, states)
    if status == 0:  # exhausted below ub: ub is optimal
        return SearchResult(None, ub, ub, True, states)
    f = int(q.out_f)
    lb = f if f > floor else static_lb
    return SearchResult(None, ub, max(lb, static_lb), False, states)


class TooWide(Exception):
    """A beam of this width does not fit its memory cap (nor does any wider one)."""


def beam(piece, width: int, deadline: float, ub: int | None, max_bytes: int, g0: int):
    """beam.beam_order's search in C, from a peak of g0 so far: (op order, peak) or None (the
    beam died under ub, or the deadline or the memory cap came first); raises TooWide."""
    if not 1 <= width < 2**31:  # a C int: a wider one would wrap around (to 0 at 48 * 2**28)
        raise TooWide(width)
    lib = _load()
    m = len(piece.units)
    out_units = (c_int * (m + 1))()
    q = Beam(width=width, ub=2**62 if ub is None else ub, seconds=max(deadline - time.monotonic(), 0.0),
             max_bytes=max_bytes, out_units=out_units)
    status = lib.beam_search(ctypes.byref(_problem(piece, g0)), ctypes.byref(q))
    if status == -2:
        raise TooWide(width)
    if status != 1:
        return None
    order = units_to_ops(piece, [out_units[i] for i in range(q.out_n)])
    return order, piece.evaluate(order)

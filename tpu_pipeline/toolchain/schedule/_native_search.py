"""The C best-first search (`_best_first.c`): the arrays it reads, built once per piece, and the
result turned back into dp.SearchResult with the same meaning as the Python search's."""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

from tpu_pipeline.toolchain.native import load_library

_SOURCE = Path(__file__).with_name("_best_first.c")
_typed = False
_MASK64 = (1 << 64) - 1

i64, u64, c_int, u8 = ctypes.c_longlong, ctypes.c_ulonglong, ctypes.c_int, ctypes.c_ubyte


def _load():
    global _typed
    lib = load_library(_SOURCE)
    if lib is None or _typed:
        return lib
    P = ctypes.POINTER
    lib.best_first_search.restype = c_int
    lib.best_first_search.argtypes = [
        c_int, c_int, c_int,  # W, Wu, m
        P(c_int), P(c_int), P(u64),  # unit_start, unit_ops, unit_mask
        P(c_int), P(c_int),  # touch_start, touch
        P(i64), P(u64), P(u8), P(u8), P(i64), i64, i64,  # size, mask, pin_start, pin_end, extra, const_all, final_only
        P(u64), P(u64), i64, i64, P(u64),  # full, S0, R0, g0, upred
        P(c_int), P(c_int), P(c_int), P(c_int),  # lazy_fork, lazy_cons, group_start, group_units
        i64, i64, ctypes.c_double, i64, i64, c_int,  # ub, floor, seconds, max_states, max_bytes, free_moves
        P(c_int), P(c_int), P(i64), P(i64), P(i64)]  # out_units, out_n, out_peak, out_f, out_states
    lib.beam_search.restype = c_int
    lib.beam_search.argtypes = lib.best_first_search.argtypes[:24] + [
        c_int, i64, ctypes.c_double, i64,  # width, ub, seconds, max_bytes
        P(c_int), P(c_int), P(i64)]  # out_units, out_n, out_peak
    _typed = True
    return lib


def available() -> bool:
    return _load() is not None


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
        extra=_array(i64, model.extra), full=_array(u64, _words(model.full, W)))
    object.__setattr__(model, "_native_arrays", arrays)  # MemModel is frozen; this is a cache
    return arrays


def _piece_arrays(piece) -> dict:
    """The piece's arrays; rebuilt if its lazy slices changed since."""
    cached = getattr(piece, "_native_arrays", None)
    if cached is not None and cached[0] is piece.lazy:
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
        S0=_array(u64, _words(piece.S0, W)),
        upred=_array(u64, (w for x in piece.upred for w in _words(x, Wu))),
        lazy_fork=_array(c_int, lazy_fork), lazy_cons=_array(c_int, lazy_cons),
        group_start=_array(c_int, group_start), group_units=_array(c_int, group_units))
    piece._native_arrays = (piece.lazy, arrays)
    return arrays


def _problem(piece, g0: int) -> tuple:
    """The first 24 arguments of both C searches: the memory model, the piece and its start."""
    model = piece.model
    ma, pa = _model_arrays(model), _piece_arrays(piece)
    return (ma["W"], pa["Wu"], pa["m"], pa["unit_start"], pa["unit_ops"], pa["unit_mask"],
            ma["touch_start"], ma["touch"], ma["size"], ma["mask"], ma["pin_start"], ma["pin_end"],
            ma["extra"], model.const_all, model.final_only, ma["full"], pa["S0"], piece.R0, g0,
            pa["upred"], pa["lazy_fork"], pa["lazy_cons"], pa["group_start"], pa["group_units"])


def best_first(piece, ub: int, floor: int, static_lb: int, g0: int, deadline: float | None,
               max_states: int, max_bytes: int, free_moves: bool):
    """dp.best_first's search in C, from the point where the trivial cases are settled."""
    from tpu_pipeline.toolchain.schedule.dp import SearchResult, _units_to_ops

    lib = _load()
    m = len(piece.units)
    seconds = 1e9 if deadline is None else max(deadline - time.monotonic(), 0.0)
    out_units = (c_int * (m + 1))()
    out_n, out_peak, out_f, out_states = c_int(0), i64(0), i64(0), i64(0)
    status = lib.best_first_search(
        *_problem(piece, g0), ub, floor, seconds, min(max_states, 2**62), max_bytes, int(free_moves),
        out_units, ctypes.byref(out_n), ctypes.byref(out_peak), ctypes.byref(out_f),
        ctypes.byref(out_states))
    states = int(out_states.value)
    if status == 1:
        order = _units_to_ops(piece, [out_units[i] for i in range(out_n.value)])
        f = int(out_f.value)
        lb = f if f > floor else static_lb
        return SearchResult(order, int(out_peak.value), max(lb, static_lb), True, states)
    if status == 0:  # exhausted below ub: ub is optimal
        return SearchResult(None, ub, ub, True, states)
    f = int(out_f.value)
    lb = f if f > floor else static_lb
    return SearchResult(None, ub, max(lb, static_lb), False, states)


class TooWide(Exception):
    """A beam of this width does not fit its memory cap (nor does any wider one)."""


def beam(piece, width: int, deadline: float, ub: int | None, max_bytes: int, g0: int):
    """beam.beam_order's search in C, from a peak of g0 so far: (op order, peak) or None (the
    beam died under ub, or the deadline or the memory cap came first); raises TooWide."""
    from tpu_pipeline.toolchain.schedule.dp import _units_to_ops

    if not 1 <= width < 2**31:  # a C int: a wider one would wrap around (to 0 at 48 * 2**28)
        raise TooWide(width)
    lib = _load()
    m = len(piece.units)
    out_units = (c_int * (m + 1))()
    out_n, out_peak = c_int(0), i64(0)
    status = lib.beam_search(
        *_problem(piece, g0), width, 2**62 if ub is None else ub, max(deadline - time.monotonic(), 0.0), max_bytes,
        out_units, ctypes.byref(out_n), ctypes.byref(out_peak))
    if status == -2:
        raise TooWide(width)
    if status != 1:
        return None
    order = _units_to_ops(piece, [out_units[i] for i in range(out_n.value)])
    return order, piece.evaluate(order)

"""The C version of the canonical placement search, compiled on first use and cached.

`tpu_pipeline/toolchain/memory/_canonical_search.c` is compiled and cached by tpu_pipeline/toolchain/native.py. Without a
compiler `load()` returns None and callers fall back to the pure-Python search (same algorithm,
far fewer nodes per second).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from tpu_pipeline.toolchain.native import load_library

_SOURCE = Path(__file__).with_name("_canonical_search.c")
_typed = False


def load():
    """The compiled library, or None when it cannot be built here (or TPU_PIPELINE_NO_NATIVE=1)."""
    global _typed
    lib = load_library(_SOURCE)
    if lib is None or _typed:
        return lib
    i64p = ctypes.POINTER(ctypes.c_longlong)
    ip = ctypes.POINTER(ctypes.c_int)
    lib.canonical_search.restype = ctypes.c_int
    lib.canonical_search.argtypes = [ctypes.c_int, ctypes.c_int, ip, ip, i64p, i64p, ip, ip, ip, ip,
                                     ctypes.c_longlong, ctypes.c_double, i64p, i64p]
    lib.sweep_first_fit.restype = ctypes.c_int
    lib.sweep_first_fit.argtypes = [ctypes.c_int, ip, i64p, i64p, i64p, ctypes.c_double, i64p]
    _typed = True
    return lib


def canonical_search(lo, hi, sizes, widths, sections, overlaps, capacity: int, time_limit: float):
    """(status, offsets, nodes): status 1 found, 0 proven infeasible, -1 out of time."""
    lib = load()
    assert lib is not None
    n, n_sec = len(sizes), len(sections)

    def ints(values):
        return (ctypes.c_int * max(len(values), 1))(*values)

    def longs(values):
        return (ctypes.c_longlong * max(len(values), 1))(*values)

    sec_start, sec_members = [0], []
    for members in sections:
        sec_members.extend(members)
        sec_start.append(len(sec_members))
    ov_start, ov_list = [0], []
    for ov in overlaps:
        ov_list.extend(ov)
        ov_start.append(len(ov_list))
    out = (ctypes.c_longlong * max(n, 1))()
    nodes = ctypes.c_longlong(0)
    status = lib.canonical_search(n, n_sec, ints(lo), ints(hi), longs(sizes), longs(widths), ints(sec_start),
                                  ints(sec_members), ints(ov_start), ints(ov_list), int(capacity),
                                  float(max(time_limit, 0.0)), out, ctypes.byref(nodes))
    return status, [int(out[i]) for i in range(n)] if status == 1 else None, int(nodes.value)


def sweep_first_fit(order, firsts, lasts, sizes, seconds: float):
    """(offsets, placed): the C sweep of `greedy.sweep_first_fit`; `placed` buffers of `order` were
    placed before the time ran out (the caller stacks the rest)."""
    lib = load()
    assert lib is not None
    n = len(sizes)
    m = max(n, 1)
    i64 = ctypes.c_longlong
    out = (i64 * m)()
    placed = lib.sweep_first_fit(n, (ctypes.c_int * m)(*order), (i64 * m)(*firsts), (i64 * m)(*lasts),
                                 (i64 * m)(*sizes), seconds, out)
    return list(out)[:n], placed

"""Where TFLite Micro's arena goes on a board with several RAM banks.

    p = place(head, tail, device.memory.banks, reserve)   # None: no allowed split holds it
    p.head_bank, p.tail_bank, p.split, p.to_json()        # [{"name", "bytes_predicted"}, ...]
    arena_budget(device.memory.banks, reserve, tail)      # the largest whole arena any split holds

TFLite Micro takes the non-persistent head and the persistent tail from two buffers
(`MicroAllocator::Create(persistent, persistent_size, non_persistent, non_persistent_size)`), so
the two may sit in different banks; the head itself is one buffer (the offline plan's offsets are
relative to it) and so is the tail. Allowed placements, fastest first: the whole arena in one
bank; else the head in one bank and the tail in another. The first bank also holds the firmware
(stack, heap, static data: `reserve` bytes), so the arena gets less of it. A bank without an
origin can only be the first (a linker script places a buffer by its address).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_pipeline.toolchain.device.descriptor import Device, RamBank

# The harness firmware's own static RAM besides the arena, stack and heap (serial line buffers,
# the profiler's event table, the interpreter object and op resolver): measured 13.2-13.4 KB on
# the emulated board (linker RAM - arena - stack - heap, docs/benchmarks.md, MCU section);
# reserved with headroom.
HARNESS_STATIC_BYTES = 16 * 1024


def firmware_reserve(device: Device) -> int:
    """What the firmware takes of an MCU's first bank besides the arena: stack, heap, static RAM."""
    fw = device.firmware
    return (fw.stack_bytes + fw.heap_bytes if fw is not None else 0) + HARNESS_STATIC_BYTES


@dataclass(frozen=True)
class Placement:
    head_bank: str
    tail_bank: str
    head: int
    tail: int
    banks: tuple[str, ...]  # every bank of the board, in descriptor order

    @property
    def split(self) -> bool:
        return self.head_bank != self.tail_bank

    def bytes_in(self, bank: str) -> int:
        return (self.head if bank == self.head_bank else 0) + (self.tail if bank == self.tail_bank else 0)

    def to_json(self) -> list[dict]:
        """`banks` of fit's and profile's --json: the arena's bytes per bank (0 where unused)."""
        return [{"name": b, "bytes_predicted": self.bytes_in(b)} for b in self.banks]

    def describe(self) -> str:
        if not self.split:
            return f"arena {self.head + self.tail:,} B in bank '{self.head_bank}'"
        return f"head {self.head:,} B in bank '{self.head_bank}', tail {self.tail:,} B in bank '{self.tail_bank}'"


def capacities(banks: tuple[RamBank, ...], reserve: int) -> list[tuple[RamBank, int]]:
    """(bank, bytes the arena may take there), fastest first: stated wait states ascending, then
    the banks without a figure in descriptor order (descriptors list them fastest first)."""
    usable = [(n, b, b.size - (reserve if n == 0 else 0)) for n, b in enumerate(banks)
              if n == 0 or b.origin is not None]
    usable.sort(key=lambda t: (t[1].wait_states is None, t[1].wait_states or 0, t[0]))
    return [(b, max(cap, 0)) for _, b, cap in usable]


def place(head: int, tail: int, banks: tuple[RamBank, ...], reserve: int,
          split_tail: int | None = None) -> Placement | None:
    """The fastest allowed placement of a head and a tail, or None when no bank or pair holds them:
    the whole arena in the fastest bank it fits; else the head in the fastest bank that holds it
    with the tail in the fastest other bank that holds the tail. `split_tail`: the tail when the
    head is a buffer of its own (TFLite Micro's two allocator objects: tflm_target.split_tail)."""
    caps = capacities(banks, reserve)
    tail_apart = tail if split_tail is None else split_tail
    names = tuple(b.name for b in banks)
    for b, cap in caps:
        if head + tail <= cap:
            return Placement(b.name, b.name, head, tail, names)
    for hb, hcap in caps:
        if head > hcap:
            continue
        for tb, tcap in caps:
            if tb is not hb and tail_apart <= tcap:
                return Placement(hb.name, tb.name, head, tail_apart, names)
    return None


def arena_budget(banks: tuple[RamBank, ...], reserve: int, tail: int, split_tail: int | None = None) -> int:
    """The largest head + `tail` some allowed placement holds: the largest bank whole, or the
    largest bank for the head with the tail (`split_tail` when apart) in another bank (fit's
    budget on a board with banks)."""
    caps = capacities(banks, reserve)
    best = max(cap for _, cap in caps)
    apart = tail if split_tail is None else split_tail
    for hb, hcap in caps:
        if any(tb is not hb and apart <= tcap for tb, tcap in caps):
            best = max(best, hcap + tail)
    return best


def split_head_room(banks: tuple[RamBank, ...], reserve: int, tail: int, split_tail: int | None = None) -> int | None:
    """The head's room when only a split holds the largest arena (`arena_budget`'s split): the
    largest bank a head may fill while another bank holds the tail apart; None when one bank
    whole holds as much. fit then bounds the head by it, not head + tail (the tail goes elsewhere)."""
    caps = capacities(banks, reserve)
    single = max(cap for _, cap in caps)
    apart = tail if split_tail is None else split_tail
    rooms = [hcap for hb, hcap in caps
             if hcap + tail > single and any(tb is not hb and apart <= tcap for tb, tcap in caps)]
    return max(rooms, default=None)


def bank_figures(arena, device: Device, notes: list, split: int | None = None) -> list[dict] | None:
    """profile --json's `banks`: a predicted arena's (`.head`, `.tail`, `.total`) bytes per bank
    after the harness's reserve, or None when it is not predicted or no placement holds it; a
    split is said in `notes`. `split`: the tail when split (tflm_target.split_tail)."""
    if arena is None or arena.total is None:
        return None
    p = place(arena.head, arena.tail, device.memory.banks, firmware_reserve(device), split)
    if p is not None and p.split:
        notes.append(f"banks: {p.describe()}")
    return p.to_json() if p is not None else None

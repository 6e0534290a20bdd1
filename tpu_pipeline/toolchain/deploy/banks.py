"""Where TFLite Micro's arena goes on a board with several RAM banks.

    p = place(head, tail, device.memory.banks, reserve)   # None: no allowed split holds it
    p.head_bank, p.tail_bank, p.split, p.to_json()        # [{"name", "bytes_predicted"}, ...]
    arena_budget(device.memory.banks, reserve, tail)      # the largest whole arena any split holds
    harness_arena(whole, head, tail_apart, device)        # where export-mcu's harness firmware puts it
    place(..., input_bytes=outside_input_bytes(graph))    # an input outside the arena gets a bank too

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
# Flash the harness firmware takes besides the model (code, TFLite Micro's kernels, constants):
# measured 50.5 KB (MLPerf's ad01, fully connected only) to 124.5 KB (TinyEngine's vww, every
# convolution kernel) on the emulated Cortex-M4 (run --backend qemu: flash_bytes - model bytes),
# and since the pointwise, window and stage kernels 158.9 KB (TinyEngine's mcunetv2_large, fit's
# fastest point) to 194.5 KB (its patch stages and copies: STRIDED_SLICE, CONCATENATION) (build-
# firmware's flash_bytes - model bytes, CMSIS-NN); reserved with headroom for kernels to come.
HARNESS_CODE_BYTES = 256 * 1024


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
    input_bank: str | None = None  # the input buffer outside the arena (--input-outside-arena)
    input: int = 0

    @property
    def split(self) -> bool:
        return self.head_bank != self.tail_bank

    def bytes_in(self, bank: str) -> int:
        return (self.head if bank == self.head_bank else 0) + (self.tail if bank == self.tail_bank else 0) \
            + (self.input if bank == self.input_bank else 0)

    def to_json(self) -> list[dict]:
        """`banks` of fit's and profile's --json: the arena's (and an outside input's) bytes per bank."""
        return [{"name": b, "bytes_predicted": self.bytes_in(b)} for b in self.banks]

    def describe(self) -> str:
        where = f"arena {self.head + self.tail:,} B in bank '{self.head_bank}'" if not self.split else \
            f"head {self.head:,} B in bank '{self.head_bank}', tail {self.tail:,} B in bank '{self.tail_bank}'"
        return where + (f", input {self.input:,} B in bank '{self.input_bank}'" if self.input_bank else "")


def capacities(banks: tuple[RamBank, ...], reserve: int) -> list[tuple[RamBank, int]]:
    """(bank, bytes the arena may take there), fastest first: stated wait states ascending, then
    the banks without a figure in descriptor order (descriptors list them fastest first)."""
    usable = [(n, b, b.size - (reserve if n == 0 else 0)) for n, b in enumerate(banks)
              if n == 0 or b.origin is not None]
    usable.sort(key=lambda t: (t[1].wait_states is None, t[1].wait_states or 0, t[0]))
    return [(b, max(cap, 0)) for _, b, cap in usable]


def _input_choices(caps, banks, input_bytes: int):
    """(input bank or None, the capacities left for the arena) for each bank that holds the input:
    the first bank (the firmware's, where the input went before banks) first, then fastest first."""
    if input_bytes <= 0:
        yield None, caps
        return
    order = sorted(caps, key=lambda bc: bc[0] is not banks[0])
    for b, cap in order:
        if input_bytes <= cap:
            yield b, [(c, n - input_bytes if c is b else n) for c, n in caps]


def _arena_on(caps, head: int, tail: int, tail_apart: int):
    """(rank, head bank, tail bank) of the fastest allowed arena placement on `caps`, or None:
    the whole arena in the fastest bank it fits; else the head in the fastest bank that holds it
    with the tail apart in the fastest other bank that holds it."""
    for i, (b, cap) in enumerate(caps):
        if head + tail <= cap:
            return (0, i, i), b, b
    for i, (hb, hcap) in enumerate(caps):
        if head > hcap:
            continue
        for j, (tb, tcap) in enumerate(caps):
            if tb is not hb and tail_apart <= tcap:
                return (1, i, j), hb, tb
    return None


def place(head: int, tail: int, banks: tuple[RamBank, ...], reserve: int,
          split_tail: int | None = None, input_bytes: int = 0) -> Placement | None:
    """The fastest allowed placement of a head and a tail (and an input buffer outside the arena,
    `input_bytes`, in a bank of its own choosing), or None when nothing holds them. `split_tail`:
    the tail when the head is a buffer of its own (TFLite Micro's two allocator objects:
    tflm_target.split_tail). The input takes the bank that leaves the fastest arena placement
    (ties: the first bank, then the fastest)."""
    caps = capacities(banks, reserve)
    tail_apart = tail if split_tail is None else split_tail
    best = None
    for ib, left in _input_choices(caps, banks, input_bytes):
        found = _arena_on(left, head, tail, tail_apart)
        if found is not None and (best is None or found[0] < best[0][0]):
            best = (found, ib)
    if best is None:
        return None
    (_, hb, tb), ib = best
    names = tuple(b.name for b in banks)
    return Placement(hb.name, tb.name, head, tail if hb is tb else tail_apart, names,
                     ib.name if ib is not None else None, input_bytes if ib is not None else 0)


def arena_budget(banks: tuple[RamBank, ...], reserve: int, tail: int, split_tail: int | None = None,
                 input_bytes: int = 0) -> int:
    """The largest head + `tail` some allowed placement holds (with an outside input of
    `input_bytes` in some bank): the largest bank whole, or the largest bank for the head with
    the tail (`split_tail` when apart) in another bank (fit's budget on a board with banks);
    0 when no bank holds the input."""
    apart = tail if split_tail is None else split_tail
    best = 0
    for _, caps in _input_choices(capacities(banks, reserve), banks, input_bytes):
        best = max(best, max(cap for _, cap in caps))
        for hb, hcap in caps:
            if any(tb is not hb and apart <= tcap for tb, tcap in caps):
                best = max(best, hcap + tail)
    return best


def split_head_room(banks: tuple[RamBank, ...], reserve: int, tail: int, split_tail: int | None = None,
                    input_bytes: int = 0) -> int | None:
    """The head's room when only a split holds the largest arena (`arena_budget`'s split): the
    largest bank a head may fill while another bank holds the tail apart; None when one bank
    whole holds as much. fit then bounds the head by it, not head + tail (the tail goes elsewhere)."""
    apart = tail if split_tail is None else split_tail
    choices = list(_input_choices(capacities(banks, reserve), banks, input_bytes))
    single = max((cap for _, caps in choices for _, cap in caps), default=0)
    rooms = [hcap for _, caps in choices for hb, hcap in caps
             if hcap + tail > single and any(tb is not hb and apart <= tcap for tb, tcap in caps)]
    return max(rooms, default=None)


def outside_input_bytes(graph) -> int:
    """The buffer the firmware keeps for inputs outside the arena (--input-outside-arena: main.cc's
    g_external, each tensor 16-byte aligned): fit, profile and export-mcu place it in a bank too."""
    return sum(-(-graph.tensors[t].nbytes // 16) * 16 for t in graph.external)


def harness_arena(whole: int, head: int, tail_apart: int | None, device: Device, input_bytes: int = 0) -> dict | None:
    """Where the harness firmware (export-mcu -o) puts its arena on a board with several banks:
    {"head", "tail", "input": bank names, "head_bytes", "tail_bytes": the buffers} (head == tail:
    the whole `whole`-byte arena in that bank, tail_bytes 0; input None: no outside input), or
    None: one bank, or no placement holds it (all stays in the first bank, where the linker judges
    it). `head`, `tail_apart`: the buffers when split (tail_apart None: the tail is not predicted,
    so no split)."""
    banks = device.memory.banks
    if len(banks) < 2:
        return None
    p = place(head, max(whole - head, 0), banks, firmware_reserve(device),
              whole + 1 if tail_apart is None else tail_apart, input_bytes)  # whole + 1: no bank holds it apart
    if p is None:
        return None
    sizes = {"head_bytes": whole, "tail_bytes": 0} if not p.split else {"head_bytes": head, "tail_bytes": tail_apart}
    return {"head": p.head_bank, "tail": p.tail_bank, "input": p.input_bank, **sizes, "input_bytes": p.input}


def profile_placement(arena, device: Device, notes: list, split: int | None = None,
                      input_bytes: int = 0) -> Placement | None:
    """profile's placement of a predicted arena (`.head`, `.tail`, `.total`) after the harness's
    reserve (and an outside input's), or None when it is not predicted or no placement holds it; a
    split is said in `notes`. `split`: the tail when split (tflm_target.split_tail)."""
    if arena is None or arena.total is None:
        return None
    p = place(arena.head, arena.tail, device.memory.banks, firmware_reserve(device), split, input_bytes)
    if p is not None and (p.split or p.input_bank not in (None, device.memory.banks[0].name)):
        notes.append(f"banks: {p.describe()}")
    return p


def wait_seconds(device: Device, p: Placement, graph) -> float:
    """Seconds the stated wait states of the banks `p` chose add to one inference of `graph`
    (cost/mcu.bank_wait_cycles: the head's bank, and the input's when it lies outside the arena)."""
    from tpu_pipeline.toolchain.cost.mcu import bank_wait_cycles

    wait = {b.name: b.wait_states for b in device.memory.banks}
    outside = wait.get(p.input_bank) if p.input_bank else None
    return bank_wait_cycles(graph, wait[p.head_bank], outside) / device.compute.clock_hz

"""`fit` on a .tflite file: budget from a device, the fit, the model written and checked.

Every model `fit` writes is checked before it is returned: its outputs against the input model's
on random inputs in LiteRT and in TFLite Micro (bit-identical for integer outputs), and the arena
head real TFLite Micro allocates with our offline plan against the predicted head.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tpu_pipeline.toolchain.budget import Deadline, Progress
from tpu_pipeline.toolchain.deploy.banks import (HARNESS_CODE_BYTES, HARNESS_STATIC_BYTES, Placement, arena_budget, capacities,  # noqa: F401
                                                 firmware_reserve, outside_input_bytes, place, split_head_room,
                                                 wait_seconds)
from tpu_pipeline.toolchain.deploy.library import custom_ops, custom_ops_note
from tpu_pipeline.toolchain.device import DEFAULT_KERNEL_SET, REFERENCE, Device, KernelSet, load_device
from tpu_pipeline.toolchain.errors import ModelError, UsageError, VerificationError
from tpu_pipeline.toolchain.fit.fit import FitResult, run_fit
from tpu_pipeline.toolchain.fit.flash import (FlashChoice, FlashReport, choose_relaid, flash_report as flash_report_of,
                                              relaid_constants, relaid_items)
from tpu_pipeline.toolchain.fit.variants import on_harness
from tpu_pipeline.toolchain.fit.params import FitParams
from tpu_pipeline.toolchain.ir.convert import rewritten_model
from tpu_pipeline.toolchain.loader import load_exact
from tpu_pipeline.toolchain.rewrite.interface import external_inputs, int8_io as drop_float_io
from tpu_pipeline.toolchain.tflite import model_to_bytes, with_offline_plan

DEFAULT_COST_DEVICE = "qemu-mps2-an386"  # whose cost model prices variants when only --budget is given


@dataclass(frozen=True)
class FittedModel:
    result: FitResult
    data: bytes  # the model to write (offline plan inside)
    source: bytes  # the input model as made exact for TFLite Micro (the reference of the checks)
    verification: tuple  # tpu_pipeline.toolchain.execute.compare.Verification per runtime
    head_measured: int | None  # the host's TFLite Micro head with our plan (real interpreter, reference kernels,
    # the builtin view of harness kernels)
    head_predicted_host: int | None  # what we predict it to be
    kernels: KernelSet  # the kernel set result.head is for
    tail_measured: int | None  # the host interpreter's tail (64-bit)
    tail_target: int | None  # the tail on the 32-bit target (or the host's where not modelled, see notes)
    arena_available: int | None  # --device: SRAM - firmware reserve
    budget_from: str  # "--budget" or the device it was derived from
    notes: tuple[str, ...]
    placement: Placement | None = None  # --device: the head's and the tail's banks (deploy/banks.py)
    # the RAM wait states of the banks chosen, where the board states them (cost/mcu.bank_wait_cycles):
    # seconds added to the fitted model's and to the baseline's predicted latency
    bank_wait_s: tuple[float, float] = (0.0, 0.0)
    flash: FlashReport | None = None  # --device with flash: the written model against it (fit/flash.py)

    def to_json(self) -> dict:
        d = self.result.to_json()
        if any(self.bank_wait_s):
            lat = d["latency_s_predicted"] + self.bank_wait_s[0]
            base = d["baseline_latency_s_predicted"] + self.bank_wait_s[1]
            d.update(latency_s_predicted=lat, baseline_latency_s_predicted=base,
                     latency_overhead_predicted=lat / base - 1 if base else None)
        d["bank_wait_latency_s_predicted"] = self.bank_wait_s[0]
        d.update(budget_from=self.budget_from, kernels=self.kernels.name, arena_head_bytes_measured=self.head_measured,
                 arena_head_bytes_predicted_host=self.head_predicted_host,
                 arena_tail_bytes_measured_host=self.tail_measured, arena_tail_bytes_target=self.tail_target,
                 arena_bytes_available=self.arena_available,
                 head_matches_prediction=self.head_measured == self.head_predicted_host,
                 verification=[v.to_json() for v in self.verification], notes=[*d["notes"], *self.notes],
                 custom_ops=list(custom_ops(self.result.graph)),
                 flash=self.flash.to_json() if self.flash is not None else None,
                 banks=self.placement.to_json() if self.placement is not None else None,
                 arena_placement=None if self.placement is None else
                 {"head": self.placement.head_bank, "tail": self.placement.tail_bank,
                  **({"input": self.placement.input_bank} if self.placement.input_bank else {})})
        return d


def device_reserve(device: Device) -> tuple[int, int]:
    """(SRAM bytes, bytes the firmware needs besides the arena) of an MCU."""
    if device.kind != "mcu":
        raise UsageError(f"device '{device.name}' is not an MCU; fit budgets come from MCU SRAM")
    return device.memory.sram_bytes, firmware_reserve(device)


def fit_model(path, *, kernels: KernelSet = DEFAULT_KERNEL_SET, budget: int | None = None, device: Device | None = None,
              objective: str = "latency", time_limit: float = 30.0, want_pareto: bool = False,
              probe_budgets: tuple[int, ...] = (), verify_runs: int = 2, progress: Progress = None,
              allow_lossy: bool = False, int8_io: bool = False, input_outside_arena: bool = False,
              harness: bool = True, head_only: bool = False, patches: bool = True) -> FittedModel:
    """`fit_file` with FitParams' switches as keywords (tests and tools call it so)."""
    return fit_file(path, FitParams(budget=budget, device=device, objective=objective, kernels=kernels,
                                    int8_io=int8_io, input_outside_arena=input_outside_arena, head_only=head_only,
                                    patches=patches, harness=harness, allow_lossy=allow_lossy, pareto=want_pareto,
                                    probe_budgets=probe_budgets, time_limit=time_limit, verify_runs=verify_runs),
                    progress)


def fit_file(path, params: FitParams, progress: Progress = None) -> FittedModel:
    """Fit the model at `path` to `params.budget` bytes of arena, or to what `params.device` leaves
    for the arena (SRAM - firmware reserve; without a device, variants are priced for
    DEFAULT_COST_DEVICE). The arena is TFLite Micro's whole arena on the 32-bit target, head +
    persistent tail for the kernel set, unless `head_only`. `int8_io`: the model with that change
    alone is the reference of every check. The written model is checked in LiteRT and TFLite Micro
    (within requantization with `allow_lossy`, its deviation reported)."""
    from tpu_pipeline.toolchain.execute.compare import check_or_raise, verify_models
    from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena

    p, kernels, device = params, params.kernels, params.device
    if p.budget is None and device is None and p.objective == "latency":
        raise UsageError("fit needs --budget BYTES or --device NAME (or --objective memory)")
    model, graph, source, notes = _prepared(path, p)
    fit_budget, budget_from, avail, reserve, head_only, room = p.budget, "--budget", None, None, p.head_only, None
    if device is not None and p.budget is None:
        sram, reserve = device_reserve(device)
        avail, budget_from = sram - reserve, device.label
        # several banks: the largest arena some allowed head/tail placement holds (deploy/banks.py)
        first_tail = _tail(graph, kernels, source, notes)
        banks, apart, ext = device.memory.banks, _split_tail(graph, kernels), outside_input_bytes(graph)
        whole = arena_budget(banks, reserve, first_tail, apart, ext)
        fit_budget = whole if not p.head_only else whole - first_tail
        room = split_head_room(banks, reserve, first_tail, apart, ext)
        # only a split holds that much: the head is bound by its bank, the tail goes apart. The memory
        # objective still counts head + tail, the least RAM (a head tied with another took the larger
        # tail for speed), unless that arena's head fits no bank: then it asks again, head alone
        if room is not None and (p.objective != "memory" or p.head_only):
            fit_budget, head_only = room, True
    pricing = device if device is not None else load_device(DEFAULT_COST_DEVICE)
    deadline = Deadline(p.time_limit)
    fitted = replace(p, budget=fit_budget, head_only=head_only)
    flash = _flash_room(device)
    refit = _refit(graph, model, path, fitted, pricing, deadline, progress)
    result, data, choice = _fit_for_flash(graph, model, fitted, pricing, refit, flash)
    flash_report = None if flash is None else flash_report_of(result.graph, len(data), flash, choice)
    if choice is not None:
        notes.append(_flash_note(flash_report, device.label))
    if flash is not None and len(data) > flash:
        notes.append(f"the model is {len(data):,} B: more than the {flash:,} B of flash {device.label} leaves for it "
                     f"(flash {device.memory.flash_bytes:,} B - firmware code {HARNESS_CODE_BYTES:,} B)")
    tail = result.tail if result.tail is not None else _tail(result.graph, kernels, data, notes)
    placement, waits = None, (0.0, 0.0)
    if reserve is not None:
        ext = outside_input_bytes(result.graph)
        placement = place(result.head, tail, device.memory.banks, reserve, _split_tail(result.graph, kernels), ext)
        if placement is None and room is not None and not head_only:  # (the memory objective, above)
            return fit_file(path, replace(p, head_only=True, time_limit=max(1.0, deadline.remaining())), progress)
        if placement is None:
            result = replace(result, fits=False)
            where = f"the {avail:,} B {device.label} leaves for the arena" if len(device.memory.banks) == 1 else \
                f"any bank or pair of banks of {device.label} ({_bank_room(device, reserve)})"
            notes.append(f"head {result.head:,} B + target tail {tail:,} B" + (f" + input {ext:,} B outside the arena"
                                                                              if ext else "") + f" exceed {where}")
        elif len(device.memory.banks) > 1:
            notes.append(f"banks: {placement.describe()}")
            waits = _bank_waits(device, placement, result.graph, graph)
    host = measure_tflm_arena(data, label=str(path))
    host_head = _host_head(result, kernels, data)
    verification = ()
    if result.fits:  # else nothing is written: the caller reports the smallest arena reached
        verification = tuple(verify_models(source, data, runs=p.verify_runs, lossy_ok=p.allow_lossy))
        check_or_raise(list(verification), str(path))
        if host.head != host_head:
            raise VerificationError(f"{path}: TFLite Micro allocates a {host.head:,}-byte head with the fitted "
                                    f"model's plan; {host_head:,} B were predicted")
        if custom_ops_note(result.graph):  # so no user meets stock TFLite Micro's "CUSTOM" error unwarned
            notes.append(custom_ops_note(result.graph))
    return FittedModel(result, data, source, verification, host.head, host_head, kernels, host.tail, tail, avail,
                       budget_from, tuple(notes), placement, waits, flash_report)


MAX_FLASH_TRIES = 3  # choices of re-laid weights tried before fit goes without any


def _flash_margin(graph, flash: int) -> int:
    """Flash the written model takes beyond its harness form written before the fit
    (`_fit_for_flash`): the offline plan (4 bytes a tensor), and what the fit adds (patch stages'
    programs, copies' ops: 7.5 KB on mcunetv2_large's smallest arena) within 1/256 of the flash."""
    return 4 * len(graph.tensors) + 64 + flash // 256


def _refit(graph, model, path, fitted: FitParams, pricing: Device, deadline: Deadline, progress):
    """relaid -> (result, written model): the fit with `relaid_weights=relaid`."""
    def refit(relaid):
        r = run_fit(graph, replace(fitted, relaid_weights=relaid), pricing, deadline=deadline.sub(fraction=0.8),
                    progress=progress, model=model)
        return r, _written(r, model, path)
    return refit


def _fit_for_flash(graph, model, fitted: FitParams, pricing: Device, refit, flash: int | None):
    """(result, written model, FlashChoice or None): the fit, with the re-laid weights (kernels whose
    weights are re-laid in flash, larger than the model's) of the ops `choose_relaid` keeps where
    the board's flash cannot hold them all. The choice is made before the fit, on the model in its
    harness form written without them (plus `_flash_margin`) and each op's re-laid bytes, so
    one fit usually does; where the written model still exceeds the flash, `_within_flash`."""
    if flash is None or not fitted.harness or fitted.relaid_weights is not True:
        return (*refit(fitted.relaid_weights), None)
    items, choice = relaid_items(on_harness(graph)[0], pricing, fitted.kernels), None
    if items:  # (0.25 s on mcunetv2_large's 2.3 MB)
        bare = len(model_to_bytes(rewritten_model(on_harness(graph, False)[0], model))) + _flash_margin(graph, flash)
        extra = sum(r.extra for r in items)
        if bare + extra > flash:
            choice = choose_relaid(items, flash - bare, bare + extra)
    result, data = refit(choice.kept if choice is not None else True)
    if len(data) > flash and items:
        result, data, choice = _within_flash(result, data, refit, items, flash, choice)
    return result, data, choice


def _within_flash(result: FitResult, data: bytes, refit, items: list, flash: int, choice: FlashChoice | None):
    """(result, data, choice): the fit again with fewer re-laid weights until the written model
    fits `flash` bytes. After a fit with all of them, their room is the flash less that model
    without those it holds (the items, the ops whose re-laid weights it holds: fit may have chosen
    others). Each time the written model overshoots (the fit adds more than `_flash_margin`) the
    room becomes the bytes that choice kept less the overshoot, so the next choice is smaller;
    after MAX_FLASH_TRIES, or when nothing is worth keeping, none (the model without re-laid
    weights, as before)."""
    if choice is None:
        used = relaid_constants(result.graph)
        items = [r for r in items if r.constant in used]
        room, whole = flash - (len(data) - sum(r.extra for r in items)), len(data)
    else:  # (what the choice took, less the overshoot: the next choice is another)
        room, whole = choice.kept_bytes - (len(data) - flash), choice.all_relaid_bytes
    for _ in range(MAX_FLASH_TRIES):
        choice = choose_relaid(items, room, whole)
        if not choice.kept:
            break
        result, data = refit(choice.kept)
        if len(data) <= flash:
            return result, data, choice
        room = choice.kept_bytes - (len(data) - flash)
    result, data = refit(False)
    return result, data, FlashChoice(frozenset(), tuple(items), room, True, whole)


def _flash_note(f: FlashReport, board: str) -> str:
    head = (f"the fastest kernels' weights, re-laid in flash, make the model about {f.all_relaid_bytes:,} B, more "
            f"than the {f.available_bytes:,} B {board} leaves for it: ")
    if not f.relaid_kept:
        return head + f"fitted without them ({f.model_bytes:,} B)"
    return head + (f"{f.relaid_kept} of {f.relaid_ops} ops keep them ({f.relaid_bytes:,} B; those that save the most "
                   f"predicted time per byte{'' if f.exact else ', the best choice found'}), the other "
                   f"{f.relaid_ops - f.relaid_kept} run without them ({f.model_bytes:,} B)")


def _flash_room(device: Device | None) -> int | None:
    """Flash an MCU leaves for the model (flash - the harness's code), None where not stated."""
    if device is None or device.kind != "mcu" or not device.memory.flash_bytes:
        return None
    return device.memory.flash_bytes - HARNESS_CODE_BYTES


def _bank_waits(device: Device, p: Placement, fitted, original) -> tuple[float, float]:
    """(fitted, baseline) seconds the chosen banks' stated wait states add (deploy/banks.wait_seconds)."""
    return wait_seconds(device, p, fitted), wait_seconds(device, p, original)


def _split_tail(graph, kernels: KernelSet) -> int | None:
    """The target tail with the head in a buffer of its own (None where not modelled: the tail then)."""
    from tpu_pipeline.toolchain.memory.tflm_target import split_tail, target_tail

    return split_tail(target_tail(graph, kernels))


def _bank_room(device: Device, reserve: int) -> str:
    return ", ".join(f"{b.name} {cap:,} B" for b, cap in capacities(device.memory.banks, reserve))


def _prepared(path, p: FitParams):
    """(model, graph, reference bytes, notes): the file made exact for TFLite Micro, TFLite Micro's
    verdict on it, and the interface changes the params ask for."""
    from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena

    model, graph, notes = load_exact(path, mcu=True)  # a model LiteRT refuses is checked in TFLite Micro alone
    if len(model.subgraphs) > 1:  # TFLite Micro plans every subgraph's tensors in one arena: fit models the main one
        raise ModelError(f"{path}: {len(model.subgraphs)} subgraphs (control flow); fit plans the arena of "
                         "single-subgraph models only")
    graph, _ = graph.with_unique_tensor_names()
    measure_tflm_arena(model_to_bytes(model), label=str(path))  # TFLite Micro's verdict first, in the words
    # plan and export-mcu use
    notes = list(notes)
    if p.int8_io:  # a new interface: the reference of every check is the model with it, nothing else changed
        graph, changed = drop_float_io(graph, str(path))
        notes += changed
        source = model_to_bytes(rewritten_model(graph, model))
    else:
        source = model_to_bytes(model)
    if p.input_outside_arena:
        graph = external_inputs(graph)
    return model, graph, source, notes


def _host_head(result: FitResult, kernels: KernelSet, data: bytes) -> int:
    """The head the host's TFLite Micro (reference kernels, the builtin view) allocates for the
    written model: `result.head` itself when the fit was for the reference kernels and picks no
    harness kernel; otherwise what the written plan gives the host's view."""
    from tpu_pipeline.toolchain.execute.tflm_arena import predicted_host_head
    from tpu_pipeline.toolchain.ir.kernels import kernel_choices

    if result.offline_plan is None or (kernels == REFERENCE and not kernel_choices(result.graph)):
        return result.head
    return predicted_host_head(data)


def _written(result: FitResult, model, path) -> bytes:
    written = rewritten_model(result.graph, model)
    if result.offline_plan is not None:
        written = with_offline_plan(written, list(result.offline_plan), str(path))
    return model_to_bytes(written)


def _tail(graph, kernels: KernelSet, data: bytes, notes: list) -> int:
    """The persistent tail on the 32-bit target (tpu_pipeline.toolchain.memory.tflm_target); where an op's
    allocations are not modelled there, the host interpreter's tail (64-bit pointers: larger)."""
    from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena
    from tpu_pipeline.toolchain.memory.tflm_target import target_tail

    t = target_tail(graph, kernels)
    if t.bytes is not None:
        return t.bytes
    note = f"target tail not modelled for {', '.join(t.unmodelled)}: the host's (64-bit) tail is used"
    if note not in notes:
        notes.append(note)
    return measure_tflm_arena(data).tail

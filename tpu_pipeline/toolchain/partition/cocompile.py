"""Co-compilation order (`compile A B -n N --mix A=3,B=1`): which model's parameters get the cache.

edgetpu_compiler co-compiles several models for one Edge TPU so that they share its parameter
cache, in the order the models are given: the first model's parameters are cached first, the
next model gets what is left (Coral's compiler documentation). Here every model is partitioned
into the same N segments on its own (the exact search), TPU k holds segment k of every model,
and for each order of the models each model's segments are scored with the cache its place in
the order leaves it. The objective is the invocation mix's mean time per inference,
sum_m w_m x period_m / sum_m w_m (each model's simulated period with its share of the caches, as
if it ran alone: the time the TPUs spend switching between models is not modelled); the order with
the smallest is chosen, and every other order is reported with its cost.
"""

from __future__ import annotations

import copy
import itertools

from tpu_pipeline.toolchain.errors import UsageError

MAX_MODELS = 6   # 720 orders


def parse_mix(text: str | None, labels: list[str]) -> dict[str, float]:
    """`A=3,B=1` (labels: the models' file stems) -> weights; equal weights when not given."""
    if not text:
        return {m: 1.0 for m in labels}
    mix = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in labels:
            raise UsageError(f"--mix: '{name}' is not one of the models ({', '.join(labels)})")
        try:
            mix[name] = float(value)
        except ValueError:
            raise UsageError(f"--mix: '{part}' is not NAME=WEIGHT") from None
        if not mix[name] > 0:
            raise UsageError(f"--mix: the weight of '{name}' must be > 0")
    missing = [m for m in labels if m not in mix]
    if missing:
        raise UsageError(f"--mix: no weight for {', '.join(missing)}")
    return mix


def order_costs(parts: dict, mix: dict[str, float]) -> list[dict]:
    """Every order of the models (labels of `parts`: label -> (problem, stages)), best first."""
    if len(parts) > MAX_MODELS:
        raise UsageError(f"--mix: at most {MAX_MODELS} models are ordered ({len(parts)} given)")
    labels = list(parts)
    n = max(max(stages) for _, stages in parts.values()) + 1
    sram = next(iter(parts.values()))[0].model.sram_bytes
    total_w = sum(mix.values())
    rows = []
    for order in itertools.permutations(labels):
        free = [sram] * n
        periods, cached = {}, {}
        for m in order:
            problem, stages = parts[m]
            scored = []
            for k, s in enumerate(problem.stage_costs(stages, n)):
                model = copy.copy(problem.model)
                model.sram_bytes = free[k]
                scored.append(model.stage(s.ops, s.compute_ps, s.param_bytes, s.in_bytes, s.out_bytes))
                free[k] -= scored[-1].sram_bytes
            periods[m] = problem.model.period_ps(scored) / 1e12
            cached[m] = sum(s.sram_bytes for s in scored)
        mean = sum(mix[m] * periods[m] for m in labels) / total_w
        rows.append({"order": list(order), "mean_period_s": mean, "mix_throughput_per_s": 1 / mean,
                     "period_s": periods, "cached_bytes": cached})
    rows.sort(key=lambda r: (r["mean_period_s"], r["order"]))
    return rows


__all__ = ["parse_mix", "order_costs", "MAX_MODELS"]

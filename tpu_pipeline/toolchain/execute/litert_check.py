"""Does LiteRT load this model? Checked before a model is compiled or rewritten, so a file our
reader accepts but the runtime cannot build an interpreter for is refused up front (exit 2)
instead of being compiled into segments nothing can run.

The check runs in a forked child where the platform allows it: LiteRT's C++ side may abort or
crash on a model it cannot prepare, and that must end as one error line, not kill the caller.
"""

from __future__ import annotations

import re

from tpu_pipeline.toolchain.errors import ModelError

TIMEOUT_S = 120.0
_UNRESOLVED = re.compile(r"Encountered unresolved custom op: ([^.\n]*)")


def start_litert_check(data: bytes, label: str):
    """`check_loads_in_litert` started in its child, not awaited: the caller reads the model
    meanwhile (LiteRT's XNNPACK delegate packs ResNet152's weights for ~0.4 s). Returns a
    function that waits for it and answers as check_loads_in_litert does."""
    from tpu_pipeline.toolchain.execute.child import RuntimeCrash, start_in_child

    call = start_in_child(_try_load, data, runtime="LiteRT", doing="loading the model", timeout=TIMEOUT_S)

    def finish() -> str | None:
        try:
            outcome = call.result()
        except RuntimeCrash as exc:
            outcome = (False, str(exc))
        return _verdict(outcome, label)

    return finish


def check_loads_in_litert(data: bytes, label: str) -> str | None:
    """Raise ModelError (one line naming `label`) unless LiteRT builds an interpreter for `data`
    and allocates its tensors.

    A model whose only problem is a CUSTOM op LiteRT has no kernel for is not refused: the
    return value is then a note saying so (the runtime check stops at that op, so the rest of
    the model is checked only by our reader). Otherwise returns None.
    """
    return _verdict(_run(data), label)


def _verdict(outcome: tuple[bool, str], label: str) -> str | None:
    ok, message = outcome
    if ok:
        return None
    unresolved = _UNRESOLVED.search(message)
    if unresolved:
        return (f"LiteRT has no kernel for custom op '{unresolved.group(1).strip()}', so it cannot load "
                f"{label}; the runtime checks skip what cannot run")
    return _refusal(label, message)


def _refusal(label: str, message: str) -> str:
    first = " ".join(message.split())
    # LiteRT repeats one complaint per tensor ("... Tensor 33 has ...Tensor 36 has ..."): say it once
    sentences = list(dict.fromkeys(re.sub(r"\b(Tensor|tensor|Node number) \d+", r"\1 N", x).strip()
                                   for x in re.split(r"(?<=[.!?])(?=\S)|(?<=[.!?]) ", first) if x.strip()))
    if sentences:
        first = " ".join(sentences)
    if len(first) > 300:
        first = first[:297] + "..."
    raise ModelError(f"{label}: LiteRT cannot load this model ({first or 'no reason given'})")


def _try_load(data: bytes) -> tuple[bool, str]:
    from tpu_pipeline.toolchain.execute.litert import litert_load_error

    # The default resolver, XNNPACK delegate included: what a user's interpreter runs.
    error = litert_load_error(data, builtin_only=False, num_threads=None)
    return error is None, error or ""


def _run(data: bytes) -> tuple[bool, str]:
    from tpu_pipeline.toolchain.execute.child import RuntimeCrash, call_in_child

    try:
        return call_in_child(_try_load, data, runtime="LiteRT", doing="loading the model", timeout=TIMEOUT_S)
    except RuntimeCrash as exc:
        return False, str(exc)

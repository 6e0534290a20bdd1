"""tpu-pipeline: TensorFlow Lite models onto memory-starved edge hardware.

One import package. `toolchain` is the compiler (.tflite in, .tflite out), `runtime` the harness
that runs and measures what it wrote, `cli` / `commands` / `entry` the command line, `api` the
Python API the command line calls (docs/api.md):

    import tpu_pipeline as tp
    tp.inspect("model.tflite").peak_bytes
    tp.fit("model.tflite", budget=64 * 1024, output="fitted.tflite")
    tp.compile("model.tflite", 4, verify=True).gain_throughput

The API's names are loaded on first use (PEP 562), so `import tpu_pipeline.toolchain.x` and the
command line's start-up do not import all of it. The compiler never imports the runtime or the
command line.
"""

_API = ("inspect", "schedule", "plan", "fit", "compile", "profile", "run",
        "InspectResult", "ScheduleResult", "PlanResult", "FitResult", "CompileResult", "RunResult",
        "ProfileResult", "ToolchainError", "UsageError", "ModelError", "InfeasibleError",
        "DeviceError", "VerificationError")
_BATCH = ("batch", "BatchResult")  # batch_runner: its workers call the API, so api.py cannot import it

__all__ = [*_API, *_BATCH]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module 'tpu_pipeline' has no attribute {name!r}")
    if name in _BATCH:
        from tpu_pipeline import batch_runner as home
    else:
        from tpu_pipeline import api as home
    value = getattr(home, name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))

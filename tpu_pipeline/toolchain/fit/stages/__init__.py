"""fit's stages in order, one module each, run by toolchain/driver.py over a `FitState`.

    harness -> spans -> as_is -> rewrites -> kernel_twins -> patches -> select -> realise
    -> replan -> unlean -> keep_smaller -> baseline

A stage is `def stage(state, allowed: Deadline) -> (FitState, PassRecord)`; `share` is its
fraction of the search's deadline (0: it gets the whole fit's, for scheduling and planning the
chosen graph); `optional` stages are switched by FitParams (`passes`). To add one: a module here
and one `Pass` in STAGES (docs/architecture.md has the worked example).
"""

from tpu_pipeline.toolchain.driver import Pass
from tpu_pipeline.toolchain.fit.stages.as_is import as_is
from tpu_pipeline.toolchain.fit.stages.baseline import baseline
from tpu_pipeline.toolchain.fit.stages.harness import harness
from tpu_pipeline.toolchain.fit.stages.keep_smaller import keep_smaller
from tpu_pipeline.toolchain.fit.stages.kernel_twins import kernel_twins
from tpu_pipeline.toolchain.fit.stages.patches import patches
from tpu_pipeline.toolchain.fit.stages.realise import realise
from tpu_pipeline.toolchain.fit.stages.replan import replan
from tpu_pipeline.toolchain.fit.stages.rewrites import rewrites
from tpu_pipeline.toolchain.fit.stages.select import select
from tpu_pipeline.toolchain.fit.stages.spans import spans
from tpu_pipeline.toolchain.fit.stages.unlean import unlean

REALISE_SHARE = 0.25  # of the fit's time, kept for scheduling and planning the chosen graph

STAGES: list[Pass] = [
    Pass("harness", harness, when=lambda p: p.harness),
    Pass("spans", spans),
    Pass("as_is", as_is, share=0.25),
    Pass("rewrites", rewrites, share=0.15),
    Pass("kernel_twins", kernel_twins, optional=True),
    Pass("patches", patches, optional=True),
    Pass("select", select, share=1.0),
    Pass("realise", realise),
    Pass("replan", replan),
    Pass("unlean", unlean),
    Pass("keep_smaller", keep_smaller),
    Pass("baseline", baseline, when=lambda p: p.harness),
]

__all__ = ["REALISE_SHARE", "STAGES"]

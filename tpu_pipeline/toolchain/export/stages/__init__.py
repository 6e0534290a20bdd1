"""export-mcu's stages in order, one module each, run by toolchain/driver.py over an ExportState.

    read -> resolver -> plan -> measure -> check_head (verify) -> arena -> sources -> write

A stage is `def stage(state, allowed) -> (ExportState, PassRecord)`; a new one is a module here
and one `Pass` in STAGES.
"""

from tpu_pipeline.toolchain.driver import Pass
from tpu_pipeline.toolchain.export.stages.arena import arena
from tpu_pipeline.toolchain.export.stages.check_head import check_head
from tpu_pipeline.toolchain.export.stages.measure import measure
from tpu_pipeline.toolchain.export.stages.plan import plan
from tpu_pipeline.toolchain.export.stages.read import read
from tpu_pipeline.toolchain.export.stages.resolver import resolver
from tpu_pipeline.toolchain.export.stages.sources import sources
from tpu_pipeline.toolchain.export.stages.write import write

STAGES: list[Pass] = [
    Pass("read", read),
    Pass("resolver", resolver),
    Pass("plan", plan),
    Pass("measure", measure),
    Pass("check_head", check_head, optional=True),
    Pass("arena", arena),
    Pass("sources", sources),
    Pass("write", write),
]

__all__ = ["STAGES"]

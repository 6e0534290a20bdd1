"""Identity graph rewrites that lower the optimal peak (SERENITY's partial-convolution and
kernel-wise depthwise splitting) and the apply-only-if-better driver."""

from tpu_pipeline.toolchain.rewrite.driver import AppliedRewrite, RewriteResult, rewrite_graph
from tpu_pipeline.toolchain.rewrite.rules import EXACT, FLOAT_ROUNDING, LOSSY, Candidate, apply_candidate, find_candidates

__all__ = ["AppliedRewrite", "RewriteResult", "rewrite_graph", "Candidate", "apply_candidate",
           "find_candidates", "EXACT", "FLOAT_ROUNDING", "LOSSY"]

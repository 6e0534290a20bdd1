"""The errors a user can cause, each with the exit code the CLI returns for it.

A traceback is a bug: anything the user can get wrong (a bad file, an impossible budget, a
missing device) raises one of these with a one-line message that names the file and the problem.
"""

from __future__ import annotations


class ToolchainError(Exception):
    """Base of every expected failure. `exit_code` is what the CLI exits with."""

    exit_code = 2


class UsageError(ToolchainError):
    """Bad command-line arguments or options (exit 2)."""

    exit_code = 2


class ModelError(ToolchainError):
    """The input is not a model we can read, or uses something we cannot handle (exit 2)."""

    exit_code = 2


class InfeasibleError(ToolchainError):
    """A budget or a device limit cannot be met (exit 3)."""

    exit_code = 3


class DeviceError(ToolchainError):
    """A device or file-system operation failed: no device, timeout, I/O error (exit 4)."""

    exit_code = 4


class VerificationError(ToolchainError):
    """A rewritten or partitioned model does not reproduce the original's outputs (exit 1)."""

    exit_code = 1


EXIT_CODES = {
    0: "success",
    1: "verification mismatch (outputs differ from the original model)",
    2: "bad input or usage (unreadable model, bad option)",
    3: "infeasible (a budget or device limit cannot be met)",
    4: "device or I/O failure",
}

"""Error types shared by the compiler, the plan file reader and the runtime.

Every cgc error carries the process exit code the CLI uses for it, so the CLI and the
Python API raise the same exceptions and the CLI only maps them to exit codes.
"""

from __future__ import annotations

__all__ = [
    "EXIT_OK",
    "EXIT_RUNTIME",
    "EXIT_USAGE",
    "EXIT_INVALID_INPUT",
    "EXIT_INVALID_PLAN",
    "EXIT_VERIFY",
    "CgcError",
    "PlanFormatError",
    "UntrustedPlanError",
    "ConfigError",
]

EXIT_OK = 0
EXIT_RUNTIME = 1  # the graph ran and failed (or could not start)
EXIT_USAGE = 2  # wrong command line (click's own code for usage errors)
EXIT_INVALID_INPUT = 3  # the model file or graph is wrong
EXIT_INVALID_PLAN = 4  # the plan file is not a valid plan
EXIT_VERIFY = 5  # the plan is well-formed but its programs can deadlock


class CgcError(Exception):
    """Base of all cgc errors; `exit_code` is what the CLI exits with."""

    exit_code = EXIT_RUNTIME


class PlanFormatError(CgcError):
    """A file is not a plan, is truncated or corrupted, or has an unsupported version."""

    exit_code = EXIT_INVALID_PLAN


class UntrustedPlanError(PlanFormatError):
    """The plan holds pickled values and the caller did not say it trusts the file."""


class ConfigError(CgcError):
    """A run setting is unknown or out of range (``start()`` arguments, ``cgc run`` options)."""

    exit_code = EXIT_USAGE

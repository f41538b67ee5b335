"""Errors the verifier raises: a malformed plan exits 4 (EXIT_INVALID_PLAN), a deadlock 5."""

from __future__ import annotations

from cgc.plan_schema.errors import EXIT_INVALID_PLAN, EXIT_VERIFY, CgcError, PlanFormatError

__all__ = ["VerifyError", "DeadlockError", "PlanStructureError"]


class VerifyError(CgcError):
    """The plan's programs are wrong: they can deadlock or break the plan's contracts."""

    exit_code = EXIT_VERIFY


class PlanStructureError(VerifyError, PlanFormatError):
    """A structural check failed (bad id, dangling reference, missing or doubled op, ...).

    Also a ``PlanFormatError``: a malformed plan is not a valid plan file (exit code 4).
    """

    exit_code = EXIT_INVALID_PLAN


class DeadlockError(VerifyError):
    """The simulator reached a state where no process can move.

    The message is a per-actor table with each stuck op marked ``<-- stuck`` and the
    wait-for cycle spelled out. ``cycle`` holds the process names of that cycle.
    """

    def __init__(self, message: str, cycle: list[str] | None = None) -> None:
        super().__init__(message)
        self.cycle = cycle or []

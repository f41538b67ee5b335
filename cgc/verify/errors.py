"""Errors the verifier raises; both exit the CLI with code 5 (EXIT_VERIFY)."""

from __future__ import annotations

from cgc.plan_schema.errors import EXIT_VERIFY, CgcError

__all__ = ["VerifyError", "DeadlockError", "PlanStructureError"]


class VerifyError(CgcError):
    """The plan's programs are wrong: they can deadlock or break the plan's contracts."""

    exit_code = EXIT_VERIFY


class PlanStructureError(VerifyError):
    """A structural check failed (bad id, dangling reference, missing or doubled op, ...)."""


class DeadlockError(VerifyError):
    """The simulator reached a state where no process can move.

    The message is a per-actor table with each stuck op marked ``<-- stuck`` and the
    wait-for cycle spelled out. ``cycle`` holds the process names of that cycle.
    """

    def __init__(self, message: str, cycle: list[str] | None = None) -> None:
        super().__init__(message)
        self.cycle = cycle or []

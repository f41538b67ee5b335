"""Errors the verifier raises: a malformed plan exits 4 (EXIT_INVALID_PLAN), a deadlock 5."""

from __future__ import annotations

from cgc.plan_schema.errors import EXIT_INVALID_PLAN, EXIT_VERIFY, CgcError, PlanFormatError

__all__ = ["VerifyError", "DeadlockError", "PlanStructureError", "PlanLimitError"]


class VerifyError(CgcError):
    """The plan's programs are wrong: they can deadlock or break the plan's contracts."""

    exit_code = EXIT_VERIFY


class PlanStructureError(VerifyError, PlanFormatError):
    """A structural check failed (bad id, dangling reference, unknown enum value, missing
    or doubled op, ...); the message names the field or the actor, op and channel.

    Also a ``PlanFormatError``: a malformed plan is not a valid plan file (exit code 4).
    """

    exit_code = EXIT_INVALID_PLAN


class PlanLimitError(PlanStructureError):
    """A plan field is beyond its bound in ``cgc.plan_schema.defaults.Limits`` (exit code 4).

    Attributes:
        field: the plan field, e.g. ``"ExecConfig.capacity"`` or ``"Channel c3 slots"``.
        value: what the plan holds.
        limit: the bound it exceeds.
        name: the ``Limits`` attribute that holds the bound (``"capacity"``).
    """

    def __init__(self, field: str, value: int, limit: int, name: str) -> None:
        super().__init__(
            f"invalid plan: {field} is {value:,}, above the limit {limit:,} (Limits.{name}; "
            "verify_plan(plan, limits=...) takes other limits if you have a real reason)"
        )
        self.field, self.value, self.limit, self.name = field, value, limit, name


class DeadlockError(VerifyError):
    """The simulator reached a state where no process can move.

    The message is a per-actor table with each stuck op marked ``<-- stuck`` and the
    wait-for cycle spelled out. ``cycle`` holds the process names of that cycle.
    """

    def __init__(self, message: str, cycle: list[str] | None = None) -> None:
        super().__init__(message)
        self.cycle = cycle or []

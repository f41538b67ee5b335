"""Pass ``verify``: run the independent verifier on the finished plan and record it.

Runs on every compile; a failure here is a compiler bug and is raised as is
(``cgc.verify.DeadlockError`` with its table, or ``PlanStructureError``).
"""

from __future__ import annotations

from cgc.passes.state import LowerState, require
from cgc.verify import verify_plan

__all__ = ["verify", "pre", "post"]

_NAME = "verify"


def verify(state: LowerState) -> None:
    """Verify ``state.plan`` and set ``schedule.verified_executions``.

    Raises:
        cgc.verify.VerifyError: the plan is wrong (a bug in an earlier pass).
    """
    report = verify_plan(state.plan, state.options.verify_executions)
    state.lowered.schedule.verified_executions = report.executions


def pre(state: LowerState) -> None:
    require(state.plan.config.capacity >= 1, _NAME, "capacity must be set before verifying")


def post(state: LowerState) -> None:
    require(
        state.lowered.schedule.verified_executions > state.plan.config.capacity
        or state.options.verify_executions is not None,
        _NAME,
        "stepped too few executions",
    )

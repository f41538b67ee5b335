"""Pass ``verify``: run the independent verifier on the finished plan and record it.

Runs on every compile; a failure here is a compiler bug and is raised as is
(``cgc.plan_schema.verify.DeadlockError`` with its table, or ``PlanStructureError``).
"""

from __future__ import annotations

from cgc.passes.state import LowerState, require
from cgc.plan_schema.verify import verify_plan
from cgc.plan_schema.verify.simulate import has_prefetch

__all__ = ["verify", "pre", "post"]

_NAME = "verify"


def verify(state: LowerState) -> None:
    """Verify ``state.plan`` and set ``schedule.verified_executions``.

    Raises:
        cgc.plan_schema.verify.VerifyError: the plan is wrong (a bug in an earlier pass).
    """
    opts = state.options
    report = verify_plan(state.plan, opts.verify_executions, limits=opts.limits)
    state.lowered.schedule.verified_executions = report.executions


def pre(state: LowerState) -> None:
    require(state.plan.config.capacity >= 1, _NAME, "capacity must be set before verifying")


def post(state: LowerState) -> None:
    # Without prefetch ops two executions decide every number of executions (see
    # cgc.plan_schema.verify.simulate); with them the verifier must step past the capacity.
    need = state.plan.config.capacity + 1 if has_prefetch(state.plan) else 2
    require(
        state.lowered.schedule.verified_executions >= need
        or state.options.verify_executions is not None,
        _NAME,
        "stepped too few executions",
    )

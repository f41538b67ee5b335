"""The independent verifier: structural checks plus a blocking-semantics simulator.

It reads only ``pb.Plan`` and imports nothing but ``cgc.plan_schema`` and the standard
library (no compiler pass, no networkx), so the runtime runs the very same check when a
plan starts: it checks what the runtime will replay, not what the scheduler meant.

Example::

    from cgc.verify import verify_plan, check_plan_file
    report = verify_plan(plan)          # raises DeadlockError with a table on deadlock
    print(report.executions)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import LIMITS, Limits
from cgc.verify.errors import DeadlockError, PlanLimitError, PlanStructureError, VerifyError
from cgc.verify.simulate import has_prefetch, simulate
from cgc.verify.structure import check_structure

__all__ = [
    "verify_plan",
    "check_plan_file",
    "check_structure",
    "default_executions",
    "VerifyReport",
    "VerifyError",
    "DeadlockError",
    "PlanStructureError",
    "PlanLimitError",
]


@dataclass(frozen=True)
class VerifyReport:
    """What the verifier proved: ``executions`` stepped with ``capacity`` in flight.

    ``all_executions`` is True when that number decides every number of executions (a plan
    without prefetch ops; see ``cgc.verify.simulate``).
    """

    executions: int
    capacity: int
    ops_stepped: int
    programs: int
    channels: int
    all_executions: bool = False


def default_executions(plan: pb.Plan) -> int:
    """Executions the verifier steps by default: 2, or ``capacity + 2`` with prefetch ops.

    Example: ``default_executions(lower(plan)) == 2``.
    """
    return max(1, plan.config.capacity) + 2 if has_prefetch(plan) else 2


def verify_plan(
    plan: pb.Plan, executions: int | None = None, *, limits: Limits | None = None
) -> VerifyReport:
    """Check a plan's structure and bounds, then step its programs with blocking semantics.

    ``executions`` defaults to ``default_executions(plan)``: without prefetch ops that
    decides deadlock-freedom for every number of executions and every capacity the driver
    channels hold, at a cost that does not grow with the capacity. ``limits`` defaults to
    ``cgc.plan_schema.defaults.LIMITS``.

    Example: ``verify_plan(plan).all_executions`` for a plan ``cgc compile`` wrote.

    Raises:
        PlanLimitError: a field beyond its limit (``capacity``, ``slots``, counts, ...).
        PlanStructureError: ids, references, enum values, op fields, counts or seq pairing
            are wrong.
        DeadlockError: the programs can deadlock (per-actor table + wait-for cycle).
        VerifyError: an NCCL order mismatch between two ends of one communicator.
    """
    limits = limits or LIMITS
    check_structure(plan, limits)
    capacity = plan.config.capacity
    n = executions if executions is not None else default_executions(plan)
    if not 1 <= n <= limits.executions:
        raise PlanLimitError("the executions to step", n, limits.executions, "executions")
    result = simulate(plan, n, capacity)
    return VerifyReport(
        n,
        capacity,
        result.ops_stepped,
        len(plan.lowered.programs),
        len(plan.lowered.channels),
        all_executions=not has_prefetch(plan),
    )


def check_plan_file(
    path: str | os.PathLike[str], executions: int | None = None, *, limits: Limits | None = None
) -> VerifyReport:
    """Read a .cgplan (magic, version, length, checksum) and verify it.

    Example: ``check_plan_file("plan.cgplan").executions``.

    Raises:
        PlanFormatError: not a plan, truncated, corrupted or too new.
        VerifyError: as ``verify_plan``.
    """
    from cgc.plan_schema.planfile import read_plan

    # Reading never unpickles values, so a plan that needs trust is still checkable.
    return verify_plan(read_plan(path, trust=True), executions, limits=limits)

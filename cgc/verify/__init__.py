"""The independent verifier: structural checks plus a blocking-semantics simulator.

It reads only ``pb.Plan`` (programs, channels, communicators) and never imports the
compiler's passes: it checks what the runtime will replay, not what the scheduler meant.

Example::

    from cgc.verify import verify_plan, check_plan_file
    report = verify_plan(plan)          # raises DeadlockError with a table on deadlock
    print(report.executions)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cgc.plan_schema import plan_pb2 as pb
from cgc.verify.errors import DeadlockError, PlanStructureError, VerifyError
from cgc.verify.simulate import simulate
from cgc.verify.structure import check_structure

__all__ = [
    "verify_plan",
    "check_plan_file",
    "VerifyReport",
    "VerifyError",
    "DeadlockError",
    "PlanStructureError",
]


@dataclass(frozen=True)
class VerifyReport:
    """What the verifier proved: ``executions`` stepped with ``capacity`` in flight."""

    executions: int
    capacity: int
    ops_stepped: int
    programs: int
    channels: int


def verify_plan(plan: pb.Plan, executions: int | None = None) -> VerifyReport:
    """Check a lowered plan's structure and step its programs with blocking semantics.

    ``executions`` defaults to ``capacity + 2`` (always more than the capacity).
    Example: ``verify_plan(plan).executions == plan.config.capacity + 2``.

    Raises:
        PlanStructureError: ids, references, op fields, counts or seq pairing are wrong.
        DeadlockError: the programs can deadlock (per-actor table + wait-for cycle).
        VerifyError: an NCCL order mismatch between two ends of one communicator.
    """
    check_structure(plan)
    capacity = max(1, plan.config.capacity)
    n = executions if executions is not None else capacity + 2
    result = simulate(plan, n, capacity)
    return VerifyReport(
        n, capacity, result.ops_stepped, len(plan.lowered.programs), len(plan.lowered.channels)
    )


def check_plan_file(path: str | os.PathLike[str], executions: int | None = None) -> VerifyReport:
    """Read a .cgplan (magic, version, length, checksum) and verify it.

    Example: ``check_plan_file("plan.cgplan").executions``.

    Raises:
        PlanFormatError: not a plan, truncated, corrupted or too new.
        VerifyError: as ``verify_plan``.
    """
    from cgc.plan_schema.planfile import read_plan

    # Reading never unpickles values, so a plan that needs trust is still checkable.
    return verify_plan(read_plan(path, trust=True), executions)

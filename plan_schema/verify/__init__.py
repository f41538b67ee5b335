"""The independent verifier: structural checks plus a blocking-semantics simulator.

It reads only ``pb.Plan`` and imports nothing but ``cgc.plan_schema`` and the standard
library (no compiler pass, no networkx), so the runtime runs the very same check when a
plan starts: it checks what the runtime will replay, not what the scheduler meant. It is
part of the plan contract, so it lives beside the schema: the runtime depends on
``cgc.plan_schema`` only, and the compiler's ``verify`` pass and ``cgc check`` call the
same code.

Example::

    from cgc.plan_schema.verify import verify_plan, check_plan_file
    report = verify_plan(plan)          # raises DeadlockError with a table on deadlock
    print(report.executions)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import LIMITS, Limits
from cgc.plan_schema.verify.errors import (
    DeadlockError,
    PlanLimitError,
    PlanStructureError,
    VerifyError,
)
from cgc.plan_schema.verify.simulate import (
    BoundedRun,
    bounded_run,
    has_prefetch,
    prefetch_depth,
    simulate,
)
from cgc.plan_schema.verify.structure import check_structure

__all__ = [
    "verify_plan",
    "check_plan_file",
    "check_structure",
    "default_executions",
    "bounded_run",
    "verify_work",
    "VerifyReport",
    "VerifyError",
    "DeadlockError",
    "PlanStructureError",
    "PlanLimitError",
]


@dataclass(frozen=True)
class VerifyReport:
    """What the verifier proved: ``executions`` stepped with ``stepped_capacity`` in flight.

    ``capacity`` is the plan's; ``stepped_capacity`` is lower only for a plan with prefetch
    ops, where ``bounded_run`` shows that the smaller one decides the plan's (see
    ``cgc.plan_schema.verify.simulate``). ``all_executions`` is True when the run decides
    every number of executions (always, unless the caller asked for a number of executions
    that does not).
    """

    executions: int
    capacity: int
    ops_stepped: int
    programs: int
    channels: int
    all_executions: bool = False
    stepped_capacity: int = 0


def default_executions(plan: pb.Plan) -> int:
    """Executions the verifier steps by default (``bounded_run(plan).executions``): 2, or
    at most ``2 * prefetch_depth + 2`` with prefetch ops, whatever the capacity.

    Example: ``default_executions(lower(plan)) == 2``.
    """
    return bounded_run(plan).executions


def verify_work(plan: pb.Plan, executions: int) -> int:
    """Op steps a simulation of ``executions`` executions takes (programs and driver).

    Example: ``verify_work(plan, 2) == verify_plan(plan).ops_stepped`` for a plan without
    deadlocks or prefetch ops.
    """
    low = plan.lowered
    per = sum(len(p.ops) for p in low.programs)
    per += len(low.input_channels) + len(set(low.output_channels))
    late = sum(1 for p in low.programs for op in p.ops if op.exec_offset)
    return executions * per + sum(len(p.prologue) for p in low.programs) - late


def verify_plan(
    plan: pb.Plan, executions: int | None = None, *, limits: Limits | None = None
) -> VerifyReport:
    """Check a plan's structure and bounds, then step its programs with blocking semantics.

    ``executions`` defaults to ``bounded_run(plan)``: that decides deadlock-freedom for
    every number of executions at the plan's capacity, at a cost that does not grow with
    the capacity (``cgc.plan_schema.verify.simulate`` has the argument). A number of
    executions given here is stepped as asked, at the plan's capacity. ``limits`` defaults to
    ``cgc.plan_schema.defaults.LIMITS``; the simulation's work (executions x ops) must stay
    within ``max(Limits.verify_steps, 4 x ops per execution)``, so a plan without prefetch
    ops (2 executions) or with prefetch ops at one place per loop is always stepped.

    Example: ``verify_plan(plan).all_executions`` for a plan ``cgc compile`` wrote.

    Raises:
        PlanLimitError: a field beyond its limit (``capacity``, ``slots``, counts, ...), or
            the simulation would take more steps than ``Limits.verify_steps`` allows.
        PlanStructureError: ids, references, enum values, op fields, counts or seq pairing
            are wrong.
        DeadlockError: the programs can deadlock (per-actor table + wait-for cycle).
        VerifyError: an NCCL order mismatch between two ends of one communicator.
    """
    limits = limits or LIMITS
    check_structure(plan, limits)
    capacity = max(1, plan.config.capacity)
    if executions is None:
        run = bounded_run(plan)
        decides = True
    else:
        run = BoundedRun(executions, capacity)
        # what the simulate module doc shows each of them decides
        need = capacity + prefetch_depth(plan) if has_prefetch(plan) else 2
        decides = executions >= need
    n = run.executions
    if not 1 <= n <= limits.executions:
        raise PlanLimitError("the executions to step", n, limits.executions, "executions")
    work = verify_work(plan, n)
    budget = max(limits.verify_steps, verify_work(plan, 4))
    if work > budget:
        raise PlanLimitError(
            f"the verifier's work ({n} executions of {prefetch_depth(plan)} prefetch places: "
            "op steps)", work, budget, "verify_steps")
    result = simulate(plan, n, run.capacity, slots=run.slots)
    return VerifyReport(
        n,
        capacity,
        result.ops_stepped,
        len(plan.lowered.programs),
        len(plan.lowered.channels),
        all_executions=decides,
        stepped_capacity=run.capacity,
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

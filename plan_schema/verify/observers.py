"""What the compiler learns from the simulator's stepping: happens-before clocks and timing.

Both observe one simulated execution (``simulate(plan, 1, 1, observer)``) of the very
programs the verifier checks, so the compiler never keeps a second model of the program
semantics:

* ``HappensBefore`` (pass ``overlap``): for every op, the last op of every process that
  happens before it or is it (program order, a READ after the WRITE of its value, a
  rendezvous or collective joining its members). The driver is a process like the others.
* ``Timing`` (pass ``schedule``): when every op finishes, given a cost per task and per
  transfer. One execution has no full ring, so every op starts when the ops it depends on
  (as above) have finished, which does not depend on the order the simulator steps in:
  COMPUTE and COLL take their task's cost, a SEND/RECV pair and a READ of a value an actor
  wrote take one transfer, WRITE and the driver's ops take no time.

Example::

    clocks = vector_clocks(plan)                   # {(actor, op index): {process: index}}
    makespan = timed_makespan(plan, {3: 100.0}, transfer_us=10.0)
"""

from __future__ import annotations

from collections.abc import Mapping

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.verify.simulate import Moved, simulate

__all__ = ["HappensBefore", "Timing", "vector_clocks", "timed_makespan"]

Clock = dict[str, int]


class HappensBefore:
    """Vector clocks of every stepped op: ``clocks[(process, index)] = {process: index}``."""

    def __init__(self) -> None:
        self.clocks: dict[tuple[str, int], Clock] = {}
        self._written: dict[tuple[int, int], Clock] = {}  # (channel, execution) -> clock

    def _before(self, m: Moved) -> Clock:
        return self.clocks.get((m.proc, m.index - 1), {})

    def step(self, moved: tuple[Moved, ...]) -> None:
        """Join the clocks the step depends on and stamp every moved process's op."""
        clock: Clock = {}
        parts = [self._before(m) for m in moved]
        for m in moved:
            if m.op.kind == pb.READ:
                parts.append(self._written.get((m.op.channel, m.execution), {}))
            clock[m.proc] = m.index
        for part in parts:
            for k, v in part.items():
                if v > clock.get(k, -1):
                    clock[k] = v
        for m in moved:
            self.clocks[(m.proc, m.index)] = clock
            if m.op.kind == pb.WRITE:
                self._written[(m.op.channel, m.execution)] = clock


class Timing:
    """Finish time of every process's last op, in microseconds (see the module doc)."""

    def __init__(self, plan: pb.Plan, task_us: Mapping[int, float], transfer_us: float) -> None:
        self.writer = {ch.id: ch.writer for ch in plan.lowered.channels}
        self.task_us, self.transfer_us = task_us, transfer_us
        self.time: dict[str, float] = {}
        self._written: dict[tuple[int, int], float] = {}  # (channel, execution) -> time

    def step(self, moved: tuple[Moved, ...]) -> None:
        """Advance the moved processes' clocks past this step."""
        start = max(self.time.get(m.proc, 0.0) for m in moved)
        first = moved[0].op
        if first.kind in (pb.SEND, pb.RECV):
            for m in moved:
                self.time[m.proc] = start + self.transfer_us
            return
        for m in moved:
            op, end = m.op, start
            if op.kind in (pb.COMPUTE, pb.COLL):
                end = start + self.task_us.get(op.task, 0.0)
            elif op.kind == pb.READ:
                at = self._written.get((op.channel, m.execution), 0.0)
                if self.writer.get(op.channel, DRIVER) != DRIVER:
                    at += self.transfer_us
                end = max(start, at)
            elif op.kind == pb.WRITE:
                self._written[(op.channel, m.execution)] = start
            self.time[m.proc] = end

    @property
    def makespan_us(self) -> float:
        """When the last actor finishes (the driver's reads do not count)."""
        return max((t for p, t in self.time.items() if p != DRIVER), default=0.0)


def vector_clocks(plan: pb.Plan) -> dict[tuple[str, int], Clock]:
    """Happens-before clocks of one execution's ops, keyed ``(process, op index)``.

    Example: ``vector_clocks(plan)[("b", 2)]["a"]`` is the last op of ``a`` that op 2 of
    ``b`` waits for (directly or not).

    Raises:
        cgc.plan_schema.verify.VerifyError: the programs deadlock within one execution.
    """
    hb = HappensBefore()
    simulate(plan, 1, 1, hb)
    return hb.clocks


def timed_makespan(plan: pb.Plan, task_us: Mapping[int, float], transfer_us: float) -> float:
    """Microseconds one execution takes with these costs (task node id -> cost).

    Example: ``timed_makespan(plan, {2: 1000, 3: 100, 4: 100}, 1.0)`` is 1202 for
    ``inp -> a.f -> b.g -> a.h``.

    Raises:
        cgc.plan_schema.verify.VerifyError: the programs deadlock within one execution.
    """
    timing = Timing(plan, task_us, transfer_us)
    simulate(plan, 1, 1, timing)
    return timing.makespan_us

"""Step all programs of a plan with blocking semantics; the one model of what the runtime does.

Processes: one per actor (its prologue, then its loop once per execution) and the driver.
Blocking rules (exactly what the runtime does):

* READ waits until the channel's writer has written the value for that execution.
* WRITE waits while the ring is full: the slowest reader is ``slots`` values behind.
* SEND and RECV complete together, when both ends are at the matching pair (same channel,
  seq and execution). Two ends at pairs of one communicator that do not match is an
  order mismatch (NCCL would pair them wrongly) and is reported as an error.
* COLL completes when every member is at that collective's COLL for the same execution.
* The driver writes the input channels of execution ``e`` (each blocks while full), but
  first reads the outputs of the oldest execution whenever ``capacity`` are in flight;
  after the last submission it reads the rest.

An op whose execution index (loop iteration + exec_offset) reaches the number of stepped
executions is skipped, on every process alike. Each process is deterministic and an
enabled op stays enabled until it runs, so the outcome does not depend on the order in
which processes are stepped: one run decides deadlock-freedom for these executions.

The same stepping serves the compiler: an ``Observer`` is told every step (one op, a
SEND/RECV pair, or every member of a COLL, with the processes involved), which is how pass
``overlap`` gets its happens-before clocks and pass ``schedule`` its timed makespan
(``cgc.verify.observers``).

How many executions decide every number of executions
-----------------------------------------------------
Read the stepped system as a marked graph: every op is a transition that fires once per
execution (a SEND with its RECV, and the members of a COLL, are one shared transition);
places are program order inside a process (0 tokens, 1 on the arc from the last op back
to the first), data arcs WRITE -> READ (0), ring space READ -> WRITE (``slots``), and the
driver's order (its reads of execution ``e - capacity`` come before its writes of ``e``).
Such a system runs forever iff every cycle of places holds at least one token, and else it
stops on a cycle whose tokens sum to 0 or less (Commoner's theorem; the token sum of a
cycle never changes). Re-index the driver's reads by ``capacity - 1`` executions, which
leaves every cycle's sum unchanged: the driver's places then hold 1 (last read -> first
write) and 0, an output channel's data arcs hold ``capacity - 1`` and its ring space
``slots - capacity + 1``. The structure check requires ``slots >= capacity`` on every
driver channel, so no place holds a negative count, and a cycle without tokens can only
use arcs with 0 tokens: program order within one execution and data arcs between actors.
Without ``exec_offset`` ops, such a cycle never fires at all, so a plan deadlocks iff its
first execution does, for every capacity and every number of executions (a finite run
that stops early only drops constraints). ``verify_plan`` therefore steps 2 executions
(the second one runs every loop from its end back to its start) whatever the capacity:
its cost does not grow with the capacity. Plans with ``exec_offset = 1`` ops (the
compiler writes none) can hold a negative count on a prefetch arc; for them the verifier
steps ``capacity + 2`` executions as before, which the capacity bound (``Limits``) keeps
finite. ``tests/verify`` checks both against an exhaustive search of all interleavings.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import format_op
from cgc.verify.errors import DeadlockError, VerifyError

__all__ = ["simulate", "SimResult", "Moved", "Observer", "has_prefetch"]


@dataclass
class SimResult:
    executions: int
    ops_stepped: int


@dataclass(frozen=True)
class Moved:
    """One process's part of a step: the op at ``index`` of its sequence, for ``execution``.

    ``index`` counts the process's ops from 0 (prologue first, then one loop per
    execution); the driver's ops are READ/WRITE ops with only ``channel`` set.
    """

    proc: str
    index: int
    op: pb.Op
    execution: int


class Observer(Protocol):
    """Told every step of a simulation, in the order the simulator takes them."""

    def step(self, moved: tuple[Moved, ...]) -> None:
        """One op, a SEND/RECV pair, or every member of a COLL (in rank order) completed."""


def has_prefetch(plan: pb.Plan) -> bool:
    """True when some program has ``exec_offset`` ops (or a prologue)."""
    return any(p.prologue or any(op.exec_offset for op in p.ops) for p in plan.lowered.programs)


def _actor_ops(prog: pb.Program, n: int) -> Iterator[tuple[pb.Op, int]]:
    for op in prog.prologue:
        yield op, op.exec_offset
    for e in range(n):
        for op in prog.ops:
            if e + op.exec_offset < n:
                yield op, e + op.exec_offset


def _actor_len(prog: pb.Program, n: int) -> int:
    late = sum(1 for op in prog.ops if op.exec_offset)
    return len(prog.prologue) + n * len(prog.ops) - late


class _DriverOps:
    """The driver's op sequence, made on demand (its length grows with executions)."""

    def __init__(self, plan: pb.Plan, n: int, capacity: int) -> None:
        self.ins = [pb.Op(kind=pb.WRITE, channel=c) for c in plan.lowered.input_channels]
        outs = dict.fromkeys(plan.lowered.output_channels)
        self.outs = [pb.Op(kind=pb.READ, channel=c) for c in outs]
        self.n, self.capacity = n, capacity

    def __iter__(self) -> Iterator[tuple[pb.Op, int]]:
        read = 0
        for e in range(self.n):
            while e - read >= self.capacity:
                for op in self.outs:
                    yield op, read
                read += 1
            for op in self.ins:
                yield op, e
        for e in range(read, self.n):
            for op in self.outs:
                yield op, e

    def __len__(self) -> int:
        return self.n * (len(self.ins) + len(self.outs))


class _Proc:
    """A process: its op sequence (made lazily), program counter and current op."""

    def __init__(self, name: str, ops: Any, length: int) -> None:
        self.name = name
        self._make = ops  # re-iterable: a fresh iterator for the report's windows
        self._it = iter(ops)
        self.length = length
        self.pc = 0
        self.head: tuple[pb.Op, int] | None = next(self._it, None)

    def advance(self) -> None:
        self.pc += 1
        self.head = next(self._it, None)

    def window(self, lo: int, hi: int) -> list[tuple[pb.Op, int]]:
        """Ops ``lo`` to ``hi`` of the sequence (for the deadlock report)."""
        return list(islice(iter(self._make), lo, hi))


class _ActorSeq:
    def __init__(self, prog: pb.Program, n: int) -> None:
        self.prog, self.n = prog, n

    def __iter__(self) -> Iterator[tuple[pb.Op, int]]:
        return _actor_ops(self.prog, self.n)


class _Sim:
    def __init__(
        self, plan: pb.Plan, n: int, capacity: int, observer: Observer | None = None
    ) -> None:
        self.plan, self.n, self.capacity = plan, n, capacity
        self.observer = observer
        self.channels = {ch.id: ch for ch in plan.lowered.channels}
        self.procs = {
            p.actor: _Proc(p.actor, _ActorSeq(p, n), _actor_len(p, n))
            for p in plan.lowered.programs
        }
        driver = _DriverOps(plan, n, capacity)
        self.procs[DRIVER] = _Proc(DRIVER, driver, len(driver))
        self.order = [p.actor for p in plan.lowered.programs] + [DRIVER]
        self.writes = {c: 0 for c in self.channels}
        self.reads = {c: {r: 0 for r in ch.readers} for c, ch in self.channels.items()}
        members, coll_of = {}, {}
        for coll in plan.graph.collectives:
            for nid in coll.nodes:
                members[nid] = [plan.graph.nodes[m].actor for m in coll.nodes]
                coll_of[nid] = coll.id
        self.coll_members = members
        self.coll_of = coll_of
        self.stepped = 0

    # ---- one step of one process; returns True if it moved
    def step(self, p: _Proc) -> bool:
        head = p.head
        if head is None:
            return False
        op, e = head
        kind = op.kind
        if kind == pb.COMPUTE:
            return self._advance(p)
        if kind == pb.READ:
            return self._read(p, op.channel, e)
        if kind == pb.WRITE:
            return self._write(p, op.channel, e)
        if kind in (pb.SEND, pb.RECV):
            return self._p2p(p, op, e)
        return self._coll(p, op, e)

    def _advance(self, *procs: _Proc) -> bool:
        if self.observer is not None:
            moved = tuple(Moved(q.name, q.pc, *q.head) for q in procs if q.head is not None)
            self.observer.step(moved)
        for q in procs:
            q.advance()
        self.stepped += len(procs)
        return True

    def _read(self, p: _Proc, cid: int, e: int) -> bool:
        if self.reads[cid][p.name] != e:
            raise VerifyError(f"{p.name} reads execution {e} of c{cid} out of turn")
        if self.writes[cid] <= e:
            return False
        self.reads[cid][p.name] += 1
        return self._advance(p)

    def _write(self, p: _Proc, cid: int, e: int) -> bool:
        if self.writes[cid] != e:
            raise VerifyError(f"{p.name} writes execution {e} of c{cid} out of turn")
        if e - min(self.reads[cid].values()) >= self.channels[cid].slots:
            return False
        self.writes[cid] += 1
        return self._advance(p)

    def _p2p(self, p: _Proc, op: pb.Op, e: int) -> bool:
        q = self.procs.get(op.peer)
        if q is None or q.head is None or q.name == DRIVER:
            return False
        qop, qe = q.head
        want = pb.RECV if op.kind == pb.SEND else pb.SEND
        if qop.kind != want or qop.peer != p.name:
            return False
        if (qop.channel, qop.seq, qe) != (op.channel, op.seq, e):
            if qop.communicator == op.communicator:
                raise VerifyError(
                    f"NCCL order mismatch on communicator {op.communicator}: {p.name} is at "
                    f"{format_op(op)} (execution {e}) while {q.name} is at {format_op(qop)} "
                    f"(execution {qe}); NCCL would pair them"
                )
            return False
        return self._advance(p, q)

    def _coll(self, p: _Proc, op: pb.Op, e: int) -> bool:
        procs = []
        for actor in self.coll_members.get(op.task, [p.name]):
            q = self.procs[actor]
            if q.head is None:
                return False
            qop, qe = q.head
            if qop.kind != pb.COLL or qe != e:
                return False
            if self.coll_of.get(qop.task) != self.coll_of.get(op.task) or qop.seq != op.seq:
                return False
            procs.append(q)
        return self._advance(*procs)

    def run(self) -> SimResult:
        moved = True
        while moved:
            moved = False
            for name in self.order:
                p = self.procs[name]
                while self.step(p):
                    moved = True
        if any(p.head is not None for p in self.procs.values()):
            from cgc.verify.report import deadlock_message

            msg, cycle = deadlock_message(self)
            raise DeadlockError(msg, cycle)
        return SimResult(self.n, self.stepped)


def simulate(
    plan: pb.Plan, executions: int, capacity: int, observer: Observer | None = None
) -> SimResult:
    """Step ``executions`` executions of the plan with the driver keeping ``capacity`` in flight.

    ``observer`` (optional) is told every step. Memory does not grow with ``executions``:
    op sequences are made as the processes step.

    Example: ``simulate(plan, 5, plan.config.capacity).ops_stepped``.

    Raises:
        DeadlockError: no process can move; the message has the table and the cycle.
        VerifyError: an NCCL order mismatch, or a channel used out of turn.
    """
    return _Sim(plan, executions, max(1, capacity), observer).run()

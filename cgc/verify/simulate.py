"""Step all programs of a plan with blocking semantics; report a deadlock as a table.

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
"""

from __future__ import annotations

from dataclasses import dataclass

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import format_op
from cgc.verify.errors import DeadlockError, VerifyError

__all__ = ["simulate", "SimResult"]


@dataclass
class SimResult:
    executions: int
    ops_stepped: int


class _Proc:
    def __init__(self, name: str, ops: list[tuple[pb.Op | tuple, int]]) -> None:
        self.name = name
        self.ops = ops  # (op, execution it serves)
        self.pc = 0

    @property
    def head(self):
        return self.ops[self.pc] if self.pc < len(self.ops) else None


def _actor_ops(prog: pb.Program, n: int) -> list[tuple[pb.Op, int]]:
    out = [(op, op.exec_offset) for op in prog.prologue]
    for e in range(n):
        out.extend((op, e + op.exec_offset) for op in prog.ops if e + op.exec_offset < n)
    return out


def _driver_ops(plan: pb.Plan, n: int, capacity: int) -> list[tuple[tuple, int]]:
    ins = list(plan.lowered.input_channels)
    outs = list(dict.fromkeys(plan.lowered.output_channels))
    ops: list[tuple[tuple, int]] = []
    read = 0
    for e in range(n):
        while e - read >= capacity:
            ops.extend((("read", c), read) for c in outs)
            read += 1
        ops.extend((("write", c), e) for c in ins)
    for e in range(read, n):
        ops.extend((("read", c), e) for c in outs)
    return ops


class _Sim:
    def __init__(self, plan: pb.Plan, n: int, capacity: int) -> None:
        self.plan, self.n, self.capacity = plan, n, capacity
        self.channels = {ch.id: ch for ch in plan.lowered.channels}
        self.procs = {p.actor: _Proc(p.actor, _actor_ops(p, n)) for p in plan.lowered.programs}
        self.procs[DRIVER] = _Proc(DRIVER, _driver_ops(plan, n, capacity))
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
        if isinstance(op, tuple):  # driver action
            kind, cid = op
            if kind == "write":
                return self._write(p, cid, e)
            return self._read(p, cid, e)
        if op.kind == pb.COMPUTE:
            return self._advance(p)
        if op.kind == pb.READ:
            return self._read(p, op.channel, e)
        if op.kind == pb.WRITE:
            return self._write(p, op.channel, e)
        if op.kind in (pb.SEND, pb.RECV):
            return self._p2p(p, op, e)
        return self._coll(p, op, e)

    def _advance(self, *procs: _Proc) -> bool:
        for q in procs:
            q.pc += 1
            self.stepped += 1
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
        if q is None or q.head is None or isinstance(q.head[0], tuple):
            return False
        qop, qe = q.head
        want = pb.RECV if op.kind == pb.SEND else pb.SEND
        if qop.kind != want or qop.peer != p.name:
            return False
        if (qop.channel, qop.seq, qe) != (op.channel, op.seq, e):
            comm = self.channels[op.channel].communicator
            if self.channels.get(qop.channel) and self.channels[qop.channel].communicator == comm:
                raise VerifyError(
                    f"NCCL order mismatch on communicator {comm}: {p.name} is at "
                    f"{format_op(op)} (execution {e}) while {q.name} is at {format_op(qop)} "
                    f"(execution {qe}); NCCL would pair them"
                )
            return False
        return self._advance(p, q)

    def _coll(self, p: _Proc, op: pb.Op, e: int) -> bool:
        procs = []
        for actor in self.coll_members.get(op.task, [p.name]):
            q = self.procs[actor]
            if q.head is None or isinstance(q.head[0], tuple):
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


def simulate(plan: pb.Plan, executions: int, capacity: int) -> SimResult:
    """Step ``executions`` executions of the plan with the driver keeping ``capacity`` in flight.

    Example: ``simulate(plan, 5, plan.config.capacity).ops_stepped``.

    Raises:
        DeadlockError: no process can move; the message has the table and the cycle.
        VerifyError: an NCCL order mismatch, or a channel used out of turn.
    """
    return _Sim(plan, executions, max(1, capacity)).run()

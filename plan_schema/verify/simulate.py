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
which processes are stepped: one run decides deadlock-freedom for these executions. The
stepping is event-driven: a blocked process waits on what it needs (a channel's next
write, ring space, the last member of a collective; a SEND/RECV is completed by whichever
end arrives second), so the work is one step per op plus one wake-up per unblocking,
whatever the order of the processes.

The same stepping serves the compiler: an ``Observer`` is told every step (one op, a
SEND/RECV pair, or every member of a COLL, with the processes involved), which is how pass
``overlap`` gets its happens-before clocks and pass ``schedule`` its timed makespan
(``cgc.plan_schema.verify.observers``).

How many executions decide every number of executions
-----------------------------------------------------
Read the stepped system as a marked graph with integer token counts: every op is a
transition that fires once per execution (a SEND with its RECV, and the members of a COLL,
are one shared transition); firing ``j`` of a transition serves execution ``j``, and a
place ``s -> t`` with ``m`` tokens says "firing ``j`` of ``t`` needs firing ``j - m`` of
``s``" (nothing when ``j - m < 0``). The places:

* program order: op ``a`` then op ``b`` of one loop, ``m = off(b) - off(a)`` (``off`` is
  ``exec_offset``); the last op back to the first, ``m = 1 + off(first) - off(last)``;
* data: a WRITE to each READ of its channel, ``m = 0``; ring space: each READ to the
  WRITE, ``m = slots``;
* the driver: it reads the outputs of execution ``r`` after writing execution
  ``r + capacity - 1`` and before writing ``r + capacity``. Counting the driver's reads by
  ``r + capacity - 1`` instead of ``r`` (which changes no cycle's token sum) makes its own
  places hold 0 and 1, an output channel's data arcs ``capacity - 1`` and its ring space
  ``slots - capacity + 1 - off(WRITE)``.

The structure check requires ``slots >= capacity`` on every driver channel, so the only
places with fewer than 0 tokens are the program-order places from an ``exec_offset = 1`` op
to an ``exec_offset = 0`` op that follows it (``m = -1``); call their number ``K``
(``prefetch_depth``). The prologue is the execution-0 copies of the loop's prefetch ops in
loop order (checked), which is exactly the loop's order with the execution ``-1`` ops left
out, so the model is exact from the first execution on.

Claim: the programs run forever iff every cycle of places holds at least 1 token. If every
cycle does, the firings "``t`` at ``j``" ordered by "needs" have no cycle (a cycle of
firings returns to the same execution, so its places sum to 0, and a closed walk of sum 0
contains a simple cycle of sum <= 0) and every firing has finitely many predecessors
(each cycle walked backwards lowers the execution by at least 1); since enabled ops stay
enabled, every firing happens. Leaving executions out (a finite run, or the execution
``-1`` ops of the prologue) only drops needs. If some simple cycle ``C`` holds ``M <= 0``,
walk its needs from a firing ``(t, j)``: the walk returns to ``t`` at ``j - M >= j``, which
``t`` can only fire after ``(t, j)`` itself: it never fires.

How many executions show such a cycle: on a cycle of sum ``M <= 0`` the positive places
sum to at most ``K`` (there are at most ``K`` places of -1), so a place holding more than
``K`` tokens is on no such cycle, and its count can be changed to any other value above
``K`` without changing the verdict. ``bounded_run`` therefore steps a plan with prefetch ops
at ``capacity' = min(capacity, K + 2)`` and each driver channel's slots at
``capacity' + min(slots - capacity, K + 1)`` (other rings at ``min(slots, K + 2)``): every
place either keeps its count or stays above ``K``. Along the walk of ``C`` the executions
spread over at most ``K`` (a part of the walk sums to between ``-K`` and ``K``), and the
driver's reads are counted ``capacity' - 1`` ahead of their execution, so every firing of
one walk of ``C`` lies in the first ``capacity' + K`` executions: stepping
``max(2, capacity' + K)`` executions decides every number of executions and every
capacity up to the plan's, at a cost that does not grow with the capacity. A plan without
prefetch ops has ``K = 0`` and no negative place at any capacity: 2 executions (the
second one runs every loop from its end back to its start) at the plan's own capacity.
``tests/plan_schema/verify`` checks both against an exhaustive search of all interleavings and
against the cycle criterion itself (Bellman-Ford on the places).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from itertools import islice
from typing import Any, Protocol

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import format_op
from cgc.plan_schema.verify.errors import DeadlockError, VerifyError

__all__ = ["simulate", "SimResult", "Moved", "Observer", "has_prefetch", "prefetch_depth",
           "bounded_run", "BoundedRun"]


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


def prefetch_depth(plan: pb.Plan) -> int:
    """``K`` of the module doc: loop positions where an ``exec_offset = 1`` op is followed
    by an ``exec_offset = 0`` op, over all programs (0 for every plan the compiler writes).

    Example: ``prefetch_depth(plan) == 0`` for ``a: 2R:c1 2C 2W:c2``; 1 for
    ``a: [2R:c1] 2C 2W:c2 2R:c1+1 4R:c3 4C 4W:c4``.
    """
    k = 0
    for prog in plan.lowered.programs:
        offs = [op.exec_offset for op in prog.ops]
        k += sum(1 for a, b in zip(offs, offs[1:], strict=False) if a and not b)
    return k


@dataclass(frozen=True)
class BoundedRun:
    """What ``verify_plan`` steps by default: ``executions`` at ``capacity`` with ``slots``
    (channel id -> slots; only channels whose count changed), deciding every number of
    executions at the plan's capacity (module doc). ``depth`` is ``prefetch_depth``."""

    executions: int
    capacity: int
    slots: dict[int, int] = field(default_factory=dict)
    depth: int = 0


def bounded_run(plan: pb.Plan) -> BoundedRun:
    """The executions, capacity and ring sizes that decide deadlock-freedom (module doc).

    Example: ``bounded_run(plan) == BoundedRun(2, plan.config.capacity)`` for a plan the
    compiler wrote; ``bounded_run(p).capacity <= prefetch_depth(p) + 2`` with prefetch ops.
    """
    cap = max(1, plan.config.capacity)
    if not has_prefetch(plan):
        return BoundedRun(2, cap)
    k = prefetch_depth(plan)
    cap2 = min(cap, k + 2)
    low = plan.lowered
    driver = set(low.input_channels) | set(low.output_channels)
    slots: dict[int, int] = {}
    for ch in low.channels:
        if ch.kind != pb.CHAN_HOST:
            continue
        if ch.id in driver:
            new = cap2 + min(max(0, ch.slots - cap), k + 1)
        else:
            new = min(ch.slots, k + 2)
        if new != ch.slots:
            slots[ch.id] = new
    return BoundedRun(max(2, cap2 + k), cap2, slots, k)


# An op as the stepping reads it: (kind, channel, peer, seq, communicator, task, offset, op)
_Info = tuple[int, int, str, int, int, int, int, pb.Op]
_COMPUTE, _READ, _WRITE, _SEND, _RECV, _COLL = (pb.COMPUTE, pb.READ, pb.WRITE, pb.SEND,
                                                pb.RECV, pb.COLL)


def _actor_ops(prologue: list[_Info], loop: list[_Info], n: int) -> Iterator[tuple[_Info, int]]:
    for info in prologue:
        yield info, info[6]
    for e in range(n):
        for info in loop:
            x = e + info[6]
            if x < n:
                yield info, x


def _driver_ops(ins: list[_Info], outs: list[_Info], n: int,
                capacity: int) -> Iterator[tuple[_Info, int]]:
    """The driver's op sequence, made on demand (its length grows with executions)."""
    read = 0
    for e in range(n):
        while e - read >= capacity:
            for info in outs:
                yield info, read
            read += 1
        for info in ins:
            yield info, e
    for e in range(read, n):
        for info in outs:
            yield info, e


class _Proc:
    """A process: its op sequence (made lazily), program counter and current op.

    ``info``/``e`` is the current op (in the tuple form the stepping reads) and the
    execution it serves; ``head`` is ``(op, execution)`` as the deadlock report reads it.
    """

    __slots__ = ("name", "_make", "_it", "length", "pc", "info", "e", "queued", "arrived")

    def __init__(self, name: str, make: Any, length: int) -> None:
        self.name = name
        self._make = make  # () -> a fresh iterator, for the report's windows
        self._it = make()
        self.length = length
        self.pc = 0
        self.queued = False
        self.arrived: Any = None  # the collective firing this process is counted in
        self.info: _Info | None = None
        self.e = 0
        self.advance_to_next()

    @property
    def head(self) -> tuple[pb.Op, int] | None:
        info = self.info
        return None if info is None else (info[7], self.e)

    def advance_to_next(self) -> None:
        nxt = next(self._it, None)
        if nxt is None:
            self.info = None
        else:
            self.info, self.e = nxt

    def window(self, lo: int, hi: int) -> list[tuple[pb.Op, int]]:
        """Ops ``lo`` to ``hi`` of the sequence (for the deadlock report)."""
        return [(info[7], e) for info, e in islice(self._make(), lo, hi)]


class _Sim:
    def __init__(self, plan: pb.Plan, n: int, capacity: int, observer: Observer | None = None,
                 slots: dict[int, int] | None = None) -> None:
        self.plan, self.n, self.capacity = plan, n, capacity
        self.observer = observer
        low = plan.lowered
        self.channels = {ch.id: ch for ch in low.channels}
        over = slots or {}
        n_ch = len(low.channels)
        # per channel id (index 0 unused): ring slots, writes, and the readers' counts in
        # the order of Channel.readers (a READ op's info carries its reader's position)
        self._slots = [0] * (n_ch + 1)
        self._readers: list[list[str]] = [[] for _ in range(n_ch + 1)]
        for c, ch in self.channels.items():
            if 1 <= c <= n_ch:
                self._slots[c] = over.get(c, ch.slots)
                self._readers[c] = list(ch.readers)
        pos = [{r: i for i, r in enumerate(rs)} for rs in self._readers]
        self._counts = [[0] * len(rs) for rs in self._readers]
        self._writes = [0] * (n_ch + 1)
        self._low = [0] * (n_ch + 1)  # the slowest reader's count
        self._at_low = [len(rs) for rs in self._readers]  # readers at that count
        self._wait_write: list[list[_Proc]] = [[] for _ in range(n_ch + 1)]
        self._wait_room: list[_Proc | None] = [None] * (n_ch + 1)

        def infos(actor: str, ops: Any) -> list[_Info]:
            out = []
            for op in ops:
                kind, cid = op.kind, op.channel
                # a READ's "seq" slot holds its reader position in the channel
                where = pos[cid].get(actor, -1) if kind == _READ and 0 < cid <= n_ch else op.seq
                out.append((kind, cid, op.peer, where, op.communicator, op.task,
                            op.exec_offset, op))
            return out

        self.procs: dict[str, _Proc] = {}
        for p in low.programs:
            pro, loop = infos(p.actor, p.prologue), infos(p.actor, p.ops)
            late = sum(1 for info in loop if info[6])
            self.procs[p.actor] = _Proc(
                p.actor, lambda pro=pro, loop=loop: _actor_ops(pro, loop, n),
                len(pro) + n * len(loop) - late)
        ins = infos(DRIVER, [pb.Op(kind=pb.WRITE, channel=c) for c in low.input_channels])
        outs = infos(DRIVER, [pb.Op(kind=pb.READ, channel=c)
                              for c in dict.fromkeys(low.output_channels)])
        self.procs[DRIVER] = _Proc(DRIVER, lambda: _driver_ops(ins, outs, n, capacity),
                                   n * (len(ins) + len(outs)))
        self.order = [p.actor for p in low.programs] + [DRIVER]
        self._arrivals: dict[tuple[int, int, int], list[_Proc]] = {}
        members, coll_of = {}, {}
        for coll in plan.graph.collectives:
            names = [plan.graph.nodes[m].actor for m in coll.nodes]
            for nid in coll.nodes:
                members[nid] = names
                coll_of[nid] = coll.id
        self.coll_members = members
        self.coll_of = coll_of
        self.stepped = 0
        self._runnable: deque[_Proc] = deque()

    # ---- what the deadlock report reads (once the stepping stopped)
    @cached_property
    def slots(self) -> dict[int, int]:
        return {c: self._slots[c] for c in self.channels if 0 < c < len(self._slots)}

    @cached_property
    def writes(self) -> dict[int, int]:
        return {c: self._writes[c] for c in self.channels if 0 < c < len(self._writes)}

    @cached_property
    def reads(self) -> dict[int, dict[str, int]]:
        return {c: dict(zip(self._readers[c], self._counts[c], strict=True))
                for c in self.channels if 0 < c < len(self._readers)}

    def _wake(self, p: _Proc) -> None:
        if not p.queued:
            p.queued = True
            self._runnable.append(p)

    def _advance(self, *procs: _Proc) -> None:
        if self.observer is not None:
            moved = tuple(Moved(q.name, q.pc, q.info[7], q.e) for q in procs
                          if q.info is not None)
            self.observer.step(moved)
        for q in procs:
            q.pc += 1
            q.advance_to_next()
        self.stepped += len(procs)

    def _go(self, p: _Proc) -> None:
        """Step ``p`` until it blocks (registered on what it waits for) or finishes."""
        while True:
            info = p.info
            if info is None:
                return
            kind = info[0]
            if kind == _COMPUTE:
                self._advance(p)
            elif kind == _READ:
                if not self._read(p, info, p.e):
                    return
            elif kind == _WRITE:
                if not self._write(p, info[1], p.e):
                    return
            elif kind == _SEND or kind == _RECV:
                if not self._p2p(p, info, p.e):
                    return
            elif not self._coll(p, info, p.e):
                return

    def _read(self, p: _Proc, info: _Info, e: int) -> bool:
        cid, slot = info[1], info[3]
        counts = self._counts[cid]
        if slot < 0 or counts[slot] != e:
            raise VerifyError(f"{p.name} reads execution {e} of c{cid} out of turn")
        if self._writes[cid] <= e:
            self._wait_write[cid].append(p)
            return False
        counts[slot] = e + 1
        if e == self._low[cid]:
            self._at_low[cid] -= 1
            if not self._at_low[cid]:  # the slowest reader moved: maybe room for the writer
                low = self._low[cid] = min(counts)
                self._at_low[cid] = counts.count(low)
                w = self._wait_room[cid]
                if w is not None:
                    self._wait_room[cid] = None
                    self._wake(w)
        self._advance(p)
        return True

    def _write(self, p: _Proc, cid: int, e: int) -> bool:
        if self._writes[cid] != e:
            raise VerifyError(f"{p.name} writes execution {e} of c{cid} out of turn")
        if e - self._low[cid] >= self._slots[cid]:
            self._wait_room[cid] = p
            return False
        self._writes[cid] = e + 1
        waiting = self._wait_write[cid]
        if waiting:
            self._wait_write[cid] = []
            for q in waiting:
                self._wake(q)
        self._advance(p)
        return True

    def _p2p(self, p: _Proc, info: _Info, e: int) -> bool:
        """Complete the pair if the peer is at the matching op; else wait for the peer,
        which completes it when it gets there (it looks at this process then)."""
        q = self.procs.get(info[2])
        if q is None or q.info is None or q.name == DRIVER:
            return False
        qinfo, qe = q.info, q.e
        want = _RECV if info[0] == _SEND else _SEND
        if qinfo[0] != want or qinfo[2] != p.name:
            return False
        if (qinfo[1], qinfo[3], qe) != (info[1], info[3], e):
            if qinfo[4] == info[4]:
                raise VerifyError(
                    f"NCCL order mismatch on communicator {info[4]}: {p.name} is at "
                    f"{format_op(info[7])} (execution {e}) while {q.name} is at "
                    f"{format_op(qinfo[7])} (execution {qe}); NCCL would pair them"
                )
            return False
        self._advance(p, q)
        self._wake(q)
        return True

    def _coll(self, p: _Proc, info: _Info, e: int) -> bool:
        task = info[5]
        names = self.coll_members.get(task)
        if names is None:  # not a member of any collective: nothing to wait for
            self._advance(p)
            return True
        key = (self.coll_of[task], e, info[3])
        if p.arrived == key:  # already counted (woken for another reason)
            return False
        here = self._arrivals.setdefault(key, [])
        here.append(p)
        p.arrived = key
        if len(here) < len(names):
            return False
        del self._arrivals[key]
        procs = [self.procs[a] for a in names]  # rank order, as the observers are told
        for q in procs:
            q.arrived = None
        self._advance(*procs)
        for q in procs:
            if q is not p:
                self._wake(q)
        return True

    def run(self) -> SimResult:
        for name in self.order:
            self._wake(self.procs[name])
        runnable = self._runnable
        while runnable:
            p = runnable.popleft()
            p.queued = False
            self._go(p)
        if any(p.info is not None for p in self.procs.values()):
            from cgc.plan_schema.verify.report import deadlock_message

            msg, cycle = deadlock_message(self)
            raise DeadlockError(msg, cycle)
        return SimResult(self.n, self.stepped)


def simulate(
    plan: pb.Plan, executions: int, capacity: int, observer: Observer | None = None, *,
    slots: dict[int, int] | None = None,
) -> SimResult:
    """Step ``executions`` executions of the plan with the driver keeping ``capacity`` in flight.

    ``observer`` (optional) is told every step; ``slots`` (channel id -> slots) replaces
    the plan's ring sizes (``bounded_run`` says which). Memory does not grow with
    ``executions``: op sequences are made as the processes step.

    Example: ``simulate(plan, 5, plan.config.capacity).ops_stepped``.

    Raises:
        DeadlockError: no process can move; the message has the table and the cycle.
        VerifyError: an NCCL order mismatch, or a channel used out of turn.
    """
    return _Sim(plan, executions, max(1, capacity), observer, slots).run()

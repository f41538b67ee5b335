"""The time grid of a plan: a step (column) for every op of every program, offline.

One execution is stepped the way the runtime runs it, every op taking one step:

* each actor issues its ops in program order (prologue first, then the loop);
* READ, COMPUTE, WRITE and compute-stream SEND/RECV/COLL occupy the actor's *compute row*
  one after another; a READ waits for the WRITE of its channel (the driver's writes are
  there from the start);
* comm-stream SEND/RECV/COLL go to the actor's *comm row*: issuing one does not hold the
  compute row (that is what a hoisted receive buys), the comm row runs them in order, and
  a COMPUTE waits for the receives and collectives it consumes;
* a SEND and its RECV take the same step, and so do the members of one collective (NCCL
  rendezvous): both sides wait for the later one.

Ops that serve the next execution (``exec_offset = 1``) have their partner in the next
execution, which is not drawn: they wait for nobody. The grid of a plan that can deadlock
still comes out (a stuck rendezvous is let go, marked unmatched), so ``cgc viz`` can show
what is wrong with a plan that ``cgc check`` rejects.

Example::

    grid = step_plan(plan)
    grid.ops[0].step, grid.width
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from cgc.plan_schema import plan_pb2 as pb

__all__ = ["StepOp", "StepGrid", "step_plan", "COMM_KINDS"]

COMM_KINDS = (pb.SEND, pb.RECV, pb.COLL)


@dataclass
class StepOp:
    """One op of one program, placed on the grid.

    Attributes:
        actor: the program's actor.
        prologue: the op is in the prologue (runs once, before the loop).
        index: position in its section (prologue or loop).
        op: the op itself.
        step: its column; every op takes one step.
        comm_row: it runs on the actor's comm stream.
        matched: a SEND/RECV/COLL whose partners were all found in this execution.
        hoisted: a comm-stream RECV issued before another task's COMPUTE, so it can run under
            that computation.
    """

    actor: str
    prologue: bool
    index: int
    op: pb.Op
    step: int = -1
    comm_row: bool = False
    matched: bool = True
    hoisted: bool = False

    @property
    def key(self) -> str:
        """A name unique in the plan: ``"s0.p3"`` (prologue op 3) or ``"s0.7"`` (loop op 7)."""
        return f"{self.actor}.{'p' if self.prologue else ''}{self.index}"

    @property
    def execution(self) -> int:
        """The execution it serves, relative to the one drawn (0, or 1 for a prefetch)."""
        return self.op.exec_offset


@dataclass
class StepGrid:
    """Every op of a plan with its step, in program order per actor (actors in plan order)."""

    actors: list[str]
    ops: list[StepOp]
    links: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def width(self) -> int:
        """The number of steps (columns)."""
        return max((o.step for o in self.ops), default=-1) + 1

    def comm_actors(self) -> set[str]:
        """Actors with a comm-stream row."""
        return {o.actor for o in self.ops if o.comm_row}


def _rendezvous_key(op: pb.Op, graph: pb.Graph) -> tuple:
    if op.kind == pb.COLL:
        node = graph.nodes[op.task] if op.task < len(graph.nodes) else pb.Node()
        return ("coll", node.collective, op.seq, op.exec_offset)
    return ("p2p", op.channel, op.seq, op.exec_offset)


def _inputs(node: pb.Node) -> set[int]:
    refs = {a.ref.node for a in node.args if a.HasField("ref")}
    return refs | {k.arg.ref.node for k in node.kwargs if k.arg.HasField("ref")}


def step_plan(plan: pb.Plan) -> StepGrid:
    """Place every op of ``plan``'s programs on a grid of steps (see the module docstring).

    Links join what meets across actors: ``(from key, to key, kind)`` with kind ``"nccl"``
    (SEND to RECV), ``"host"`` (WRITE to READ) or ``"coll"`` (members of one collective).

    Example: ``[(o.actor, o.step) for o in step_plan(plan).ops]``.
    """
    graph = plan.graph
    seqs: dict[str, list[StepOp]] = {}
    for prog in plan.lowered.programs:
        ops = [StepOp(prog.actor, True, i, op) for i, op in enumerate(prog.prologue)]
        ops += [StepOp(prog.actor, False, i, op) for i, op in enumerate(prog.ops)]
        for o in ops:
            o.comm_row = o.op.kind in COMM_KINDS and o.op.stream == pb.COMM_STREAM
        seqs[prog.actor] = ops
    every = [o for ops in seqs.values() for o in ops]
    present: dict[tuple, int] = {}
    for o in every:
        if o.op.kind in COMM_KINDS:
            k = _rendezvous_key(o.op, graph)
            present[k] = present.get(k, 0) + 1
    writes = {(o.op.channel, o.execution): o for o in every if o.op.kind == pb.WRITE}
    feeds = _comm_feeds(seqs, graph)
    _Stepper(seqs, present, writes, feeds, graph).run()
    _mark_hoisted(seqs)
    return StepGrid(list(seqs), every, _links(every, writes, graph))


def _comm_feeds(seqs: dict[str, list[StepOp]], graph: pb.Graph) -> dict[int, list[StepOp]]:
    """For each COMPUTE (by id): the comm-row ops of its actor whose values it consumes."""
    out: dict[int, list[StepOp]] = {}
    for ops in seqs.values():
        issued: list[StepOp] = []
        for o in ops:
            if o.comm_row and o.op.kind in (pb.RECV, pb.COLL):
                issued.append(o)
            elif o.op.kind == pb.COMPUTE:
                node = graph.nodes[o.op.task] if o.op.task < len(graph.nodes) else pb.Node()
                used = _inputs(node)
                out[id(o)] = [
                    c for c in issued
                    if (c.op.kind == pb.RECV and c.op.task == o.op.task)
                    or (c.op.kind == pb.COLL and c.op.task in used)
                    or (c.op.kind == pb.COLL and c.op.task == o.op.task)
                ]
    return out


class _Stepper:
    """Steps one execution; see the module docstring for the rules."""

    def __init__(
        self,
        seqs: dict[str, list[StepOp]],
        present: dict[tuple, int],
        writes: dict[tuple[int, int], StepOp],
        feeds: dict[int, list[StepOp]],
        graph: pb.Graph,
    ) -> None:
        self.seqs = seqs
        self.present = present
        self.writes = writes
        self.feeds = feeds
        self.graph = graph
        self.pc = dict.fromkeys(seqs, 0)
        self.row_free = dict.fromkeys(seqs, 0)  # next free step of the compute row
        self.comm_free = dict.fromkeys(seqs, 0)  # next free step of the comm row
        self.comm_queue: dict[str, deque[tuple[StepOp, int]]] = {a: deque() for a in seqs}
        self.blocked: dict[str, StepOp | None] = dict.fromkeys(seqs)  # compute-row rendezvous
        self.waiting: dict[tuple, list[tuple[StepOp, int]]] = {}
        self.registered: set[int] = set()
        self.left = sum(len(s) for s in seqs.values())  # ops not placed yet

    def run(self) -> None:
        while self.left:
            if not self._round():
                self._force()

    def _round(self) -> bool:
        moved = False
        for actor in self.seqs:
            moved |= self._advance(actor)
            moved |= self._register_comm_head(actor)
        moved |= self._resolve(force=False)
        return moved

    def _advance(self, actor: str) -> bool:
        ops, moved = self.seqs[actor], False
        while self.pc[actor] < len(ops) and self.blocked[actor] is None:
            o = ops[self.pc[actor]]
            if o.comm_row:  # issue it; the comm row steps it when its partners are there
                self.comm_queue[actor].append((o, self.row_free[actor]))
            elif o.op.kind in COMM_KINDS:  # compute-stream rendezvous: the row waits for it
                self._register(o, self._data_ready(o, self.row_free[actor]))
                self.blocked[actor] = o
            else:
                ready = self._ready(o)
                if ready is None:
                    return moved
                self._place(o, ready)
            self.pc[actor] += 1
            moved = True
        return moved

    def _ready(self, o: StepOp, force: bool = False) -> int | None:
        ready = self.row_free[o.actor]
        if o.op.kind == pb.READ:
            w = self.writes.get((o.op.channel, o.execution))
            if w is not None and w.actor != o.actor:
                if w.step < 0 and not force:
                    return None
                ready = max(ready, w.step + 1)
        elif o.op.kind == pb.COMPUTE:
            for c in self.feeds.get(id(o), []):
                if c.step < 0 and not force:
                    return None
                ready = max(ready, c.step + 1)
        return ready

    def _data_ready(self, o: StepOp, ready: int) -> int:
        if o.op.kind in (pb.SEND, pb.COLL):  # the value it sends must be computed
            for p in self.seqs[o.actor]:
                if p.op.kind == pb.COMPUTE and p.step >= 0 and (
                    p.op.task == o.op.task or p.op.task in self._producers(o)
                ):
                    ready = max(ready, p.step + 1)
        return ready

    def _producers(self, o: StepOp) -> set[int]:
        if o.op.kind != pb.COLL or o.op.task >= len(self.graph.nodes):
            return set()
        return _inputs(self.graph.nodes[o.op.task])

    def _place(self, o: StepOp, step: int) -> None:
        o.step = step
        self.left -= 1
        if o.comm_row:
            self.comm_free[o.actor] = step + 1
        else:
            self.row_free[o.actor] = step + 1

    def _register_comm_head(self, actor: str) -> bool:
        q = self.comm_queue[actor]
        if not q or id(q[0][0]) in self.registered:
            return False
        o, issued = q[0]
        ready = self._data_ready(o, max(issued, self.comm_free[actor]))
        self._register(o, ready)
        return True

    def _register(self, o: StepOp, ready: int) -> None:
        self.registered.add(id(o))
        key = _rendezvous_key(o.op, self.graph)
        self.waiting.setdefault(key, []).append((o, ready))

    def _resolve(self, force: bool) -> bool:
        moved = False
        for key in sorted(self.waiting, key=repr):
            group = self.waiting[key]
            # A partner missing from the plan (the other side of a prefetch is in the next
            # execution) is not waited for: only the ones present are.
            if len(group) < self.present.get(key, 0) and not force:
                continue
            step = max(r for _, r in group)
            # A prefetch's partners are in the next execution by design: not a fault.
            matched = key[-1] > 0 or len(group) >= self._needed(key)
            for o, _ in group:
                o.matched = matched
                self._place(o, step)
                if o.comm_row:
                    self.comm_queue[o.actor].popleft()
                else:
                    self.blocked[o.actor] = None
            del self.waiting[key]
            moved = True
            if force:
                break
        return moved

    def _needed(self, key: tuple) -> int:
        if key[0] == "coll" and key[1] < len(self.graph.collectives):
            return len(self.graph.collectives[key[1]].nodes)
        return 2

    def _force(self) -> None:
        """A stuck plan (it can deadlock): let one waiting op go, or one blocked op."""
        if self._resolve(force=True):
            return
        for actor, ops in self.seqs.items():
            if self.pc[actor] < len(ops) and self.blocked[actor] is None:
                o = ops[self.pc[actor]]
                if not o.comm_row and o.op.kind not in COMM_KINDS:
                    step = self._ready(o, force=True)
                    assert step is not None  # forced: it waits for nothing
                    self._place(o, step)
                    self.pc[actor] += 1
                    return
        raise AssertionError("stepping made no progress")  # pragma: no cover - a bug


def _mark_hoisted(seqs: dict[str, list[StepOp]]) -> None:
    for ops in seqs.values():
        for i, o in enumerate(ops):
            if not (o.comm_row and o.op.kind == pb.RECV):
                continue
            # Hoisted: another task's COMPUTE comes between it and the task it feeds.
            for later in ops[i + 1:]:
                if later.op.task == o.op.task:
                    break
                if later.op.kind == pb.COMPUTE:
                    o.hoisted = True
                    break


def _links(every: list[StepOp], writes: dict, graph: pb.Graph) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    sends = {_rendezvous_key(o.op, graph): o for o in every if o.op.kind == pb.SEND}
    colls: dict[tuple, list[StepOp]] = {}
    for o in every:
        if o.op.kind == pb.RECV:
            s = sends.get(_rendezvous_key(o.op, graph))
            if s is not None:
                out.append((s.key, o.key, "nccl"))
        elif o.op.kind == pb.READ:
            w = writes.get((o.op.channel, o.execution))
            if w is not None and w.actor != o.actor:
                out.append((w.key, o.key, "host"))
        elif o.op.kind == pb.COLL:
            colls.setdefault(_rendezvous_key(o.op, graph), []).append(o)
    for members in colls.values():
        out += [(a.key, b.key, "coll") for a, b in zip(members, members[1:], strict=False)]
    return sorted(out)

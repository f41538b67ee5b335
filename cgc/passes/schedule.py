"""Pass ``schedule``: a cost-aware list scheduler that writes every actor's program.

Each actor runs its tasks in bind order; the scheduler decides where the communication
goes. It simulates time: every actor has a clock, every call an estimated cost
(``LowerOptions.costs``: ``"actor.method"``, ``"method"``, ``"transfer"``, ``"collective"``).
At each step the candidates are

* an actor's next task, once its inputs can be there (host values written, NCCL values
  received), starting at ``max(actor clock, arrival of its host inputs)``;
* an NCCL rendezvous — one SEND with its RECV, for a value already computed — starting at
  ``max(writer clock, reader clock)``;
* a collective whose members are all their actors' next task, at the latest member clock;

and the one that can start first is placed (ties: communication first, then actor order),
atomically: a rendezvous appends its SEND to the writer's program and its RECV to the
reader's program in the same step, a collective appends COLL to every member. Every
actor's program is therefore the projection of one global order, so any two actors issue
their shared NCCL operations in the same relative order, and seq numbers (per
communicator) are assigned in that order. Unlike a fixed priority (Ray puts every NCCL op
first, which serializes 1F1B), the clocks let stage 0 run its next forward while stage 1
is still busy and place the backward's recv when the gradient can actually arrive.

Host READs go right before the first task that needs the channel, WRITEs right after the
task that produced the value. SEND/RECV/COLL ops carry their communicator
(``Op.communicator``, from pass ``communicators``).

The makespan recorded in ``ScheduleInfo`` is not the scheduler's own: the verifier's
simulator steps one execution of the finished programs in its timed mode
(``cgc.plan_schema.verify.observers.Timing``), so the plan's figure comes from the same
semantics the verifier proves. The scheduler's clocks only choose among candidates; the postcondition
checks that both agree.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from cgc.errors import CompileError
from cgc.ir import attrs as A
from cgc.ir.graph import task_order, where
from cgc.passes.state import LowerState, require
from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.verify.observers import timed_makespan

__all__ = ["schedule", "pre", "post", "DEFAULT_COMPUTE_US", "DEFAULT_TRANSFER_US"]

_NAME = "schedule"
DEFAULT_COMPUTE_US = 100.0
DEFAULT_TRANSFER_US = 10.0
DEFAULT_COLLECTIVE_US = 50.0


class _Step(enum.Enum):
    """What one scheduling step places."""

    PAIR = "pair"  # an NCCL SEND with its RECV
    TASK = "task"  # an actor's next task (reads, compute, writes)
    COLL = "coll"  # a collective: COLL on every member


@dataclass
class _Task:
    node: int
    actor: str
    reads: list[int] = field(default_factory=list)  # host channels first read here
    recvs: list[int] = field(default_factory=list)  # nccl channels first received here
    writes: list[tuple[int, int]] = field(default_factory=list)  # (channel, output_index)
    sends: list[tuple[int, int]] = field(default_factory=list)  # (channel, output_index)
    cost: float = DEFAULT_COMPUTE_US


_Pair = tuple[int, int, str, int]  # an NCCL channel's (channel, out, reader, writer task)
# A candidate step: its sort key (start, kind rank, actor index, task, reader index) and what
# it places (a _Task for TASK and COLL, a _Pair for PAIR).
_Pick = tuple[tuple[float, int, int, int, int], tuple[_Step, "_Task | _Pair"]]


class _Sched:
    def __init__(self, state: LowerState) -> None:
        self.state = state
        g = state.g
        self.graph = g.graph[A.GRAPH]
        self.index = g.graph[A.ACTOR_INDEX]
        self.channels = {ch.id: ch for ch in state.lowered.channels}
        costs = state.options.costs
        self.transfer = float(costs.get("transfer", DEFAULT_TRANSFER_US))
        state.costs_used["transfer"] = self.transfer
        self.tasks: dict[int, _Task] = {}
        self.first_reader: dict[tuple[str, int], int] = {}  # (actor, channel) -> task
        for actor, ids in state.tasks.items():
            seen: set[int] = set()
            for t in ids:
                node = self.graph.nodes[t]
                task = _Task(t, actor)
                if node.kind == pb.COLLECTIVE:
                    key = f"{actor}.{node.method}" if node.method else "collective"
                    task.cost = float(
                        costs.get(key, costs.get("collective", DEFAULT_COLLECTIVE_US))
                    )
                else:
                    key = f"{actor}.{node.method}"
                    task.cost = float(costs.get(key, costs.get(node.method, DEFAULT_COMPUTE_US)))
                state.costs_used[key] = task.cost
                for _src, _, _k, d in sorted(g.in_edges(t, keys=True, data=True)):
                    cid = d[A.CHANNEL]
                    if cid and cid not in seen:
                        seen.add(cid)
                        self.first_reader[(actor, cid)] = t
                        kind = self.channels[cid].kind
                        (task.reads if kind == pb.CHAN_HOST else task.recvs).append(cid)
                for out in range((node.num_returns or 1) if node.kind == pb.CALL else 1):
                    if (t, out, pb.CHAN_HOST) in state.channel_of:
                        task.writes.append((state.channel_of[(t, out, pb.CHAN_HOST)], out))
                    if (t, out, pb.CHAN_NCCL) in state.channel_of:
                        task.sends.append((state.channel_of[(t, out, pb.CHAN_NCCL)], out))
                self.tasks[t] = task
        self.clock = {a: 0.0 for a in state.tasks}
        self.next = {a: 0 for a in state.tasks}
        self.written: dict[int, float] = {}  # host channel -> time its value is there
        for ch in state.lowered.channels:
            if ch.writer == DRIVER:
                self.written[ch.id] = 0.0
        self.received: set[tuple[str, int]] = set()
        self.pending: list[_Pair] = []  # NCCL channels written, not yet received
        self.seq: dict[int, int] = {}
        self.programs: dict[str, list[pb.Op]] = {a: [] for a in state.tasks}

    # ---- candidates
    def _head(self, actor: str) -> _Task | None:
        ids = self.state.tasks[actor]
        i = self.next[actor]
        return self.tasks[ids[i]] if i < len(ids) else None

    def _inputs_at(self, task: _Task) -> float | None:
        """When the task's inputs can all be on its actor, or None if not yet placed."""
        if any((task.actor, c) not in self.received for c in task.recvs):
            return None
        at = 0.0
        for c in task.reads:
            if c not in self.written:
                return None
            at = max(
                at, self.written[c] + (self.transfer if self.channels[c].writer != DRIVER else 0)
            )
        return at

    def _best(self) -> _Pick | None:
        best: _Pick | None = None
        for actor in sorted(self.clock, key=self.index.__getitem__):
            task = self._head(actor)
            if task is None:
                continue
            node = self.graph.nodes[task.node]
            if node.kind == pb.COLLECTIVE:
                members = list(self.graph.collectives[node.collective].nodes)
                if members[0] != task.node:
                    continue  # the collective is considered once, from its rank-0 member
                start = 0.0
                for m in members:
                    mt = self.tasks[m]
                    at = self._inputs_at(mt)
                    if self._head(mt.actor) is not mt or at is None:
                        break
                    start = max(start, at, self.clock[mt.actor])
                else:
                    cand = (start, 0, self.index[actor], task.node, 0)
                    best = min(best, (cand, (_Step.COLL, task)), key=_key)
                continue
            at = self._inputs_at(task)
            if at is not None:
                cand = (max(at, self.clock[actor]), 1, self.index[actor], task.node, 0)
                best = min(best, (cand, (_Step.TASK, task)), key=_key)
        for p in self.pending:
            cid, _out, reader, wtask = p
            writer = self.channels[cid].writer
            start = max(self.clock[writer], self.clock[reader])
            cand = (start, 0, self.index[writer], wtask, self.index[reader])
            best = min(best, (cand, (_Step.PAIR, p)), key=_key)
        return best

    # ---- placement
    def _run_task(self, task: _Task, start: float) -> None:
        prog = self.programs[task.actor]
        for c in task.reads:
            prog.append(pb.Op(kind=pb.READ, task=task.node, channel=c))
        node = self.graph.nodes[task.node]
        if node.kind == pb.COLLECTIVE:
            comm = self.state.coll_comm[node.collective]
            prog.append(
                pb.Op(kind=pb.COLL, task=task.node, seq=self.seq.get(comm, 0), communicator=comm)
            )
        else:
            prog.append(pb.Op(kind=pb.COMPUTE, task=task.node))
        end = start + task.cost
        for c, out in task.writes:
            prog.append(pb.Op(kind=pb.WRITE, task=task.node, channel=c, output_index=out))
            self.written[c] = end
        for c, out in task.sends:
            for reader in self.channels[c].readers:
                self.pending.append((c, out, reader, task.node))
        self.clock[task.actor] = end
        self.next[task.actor] += 1

    def _run_pair(self, p: _Pair, start: float) -> None:
        cid, out, reader, wtask = p
        ch = self.channels[cid]
        seq = self.seq.get(ch.communicator, 0)
        self.seq[ch.communicator] = seq + 1
        comm = ch.communicator
        self.programs[ch.writer].append(
            pb.Op(
                kind=pb.SEND,
                task=wtask,
                channel=cid,
                output_index=out,
                peer=reader,
                seq=seq,
                communicator=comm,
            )
        )
        rtask = self.first_reader[(reader, cid)]
        self.programs[reader].append(
            pb.Op(kind=pb.RECV, task=rtask, channel=cid, peer=ch.writer, seq=seq, communicator=comm)
        )
        self.received.add((reader, cid))
        self.clock[ch.writer] = self.clock[reader] = start + self.transfer
        self.pending.remove(p)

    def run(self) -> None:
        while True:
            best = self._best()
            if best is None:
                break
            (start, *_), (what, obj) = best
            if isinstance(obj, tuple):  # what is _Step.PAIR: a SEND with its RECV
                self._run_pair(obj, start)
            elif what is _Step.TASK:
                self._run_task(obj, start)
            else:
                node = self.graph.nodes[obj.node]
                comm = self.state.coll_comm[node.collective]
                for m in self.graph.collectives[node.collective].nodes:
                    self._run_task(self.tasks[m], start)
                self.seq[comm] = self.seq.get(comm, 0) + 1
        heads = {a: self._head(a) for a in self.clock}
        stuck = {a: t for a, t in heads.items() if t is not None}
        if stuck:
            lines = [f"  {a}: next task {where(self.graph, t.node)}" for a, t in stuck.items()]
            raise CompileError(
                "cannot order the tasks: each actor's next task (in bind order) waits for a "
                "value that comes later on another actor:\n" + "\n".join(lines)
            )
        self.makespan_us = max(self.clock.values(), default=0.0)


def _key(item: _Pick | None) -> tuple[float, ...]:
    return (float("inf"),) if item is None else item[0]


def schedule(state: LowerState) -> None:
    """Write ``lowered.programs`` (one per actor, in Graph.actors order) and the makespan.

    Example: for a 1F1B pipeline bound as ``F1 F2 B1 F3 B2 F4 B3 B4`` on stage 0, the
    program keeps that order and puts each RECV of a gradient where it can arrive.

    Raises:
        CompileError: the bind order of two actors contradicts the data flow (no order
            of the tasks exists).
    """
    state.tasks = task_order(state.g.graph[A.GRAPH])
    sched = _Sched(state)
    sched.run()
    for actor in state.g.graph[A.GRAPH].actors:
        state.lowered.programs.add(actor=actor.name).ops.extend(sched.programs.get(actor.name, []))
    task_us = {t: task.cost for t, task in sched.tasks.items()}
    state.makespan_us = timed_makespan(state.plan, task_us, sched.transfer)
    state.scratch["schedule.clock_makespan_us"] = sched.makespan_us
    info = state.lowered.schedule
    info.scheduler = "list/cost-aware"
    info.makespan_us = state.makespan_us
    for key in sorted(state.costs_used):
        info.costs.add(key=key, micros=state.costs_used[key])


def pre(state: LowerState) -> None:
    require(len(state.lowered.programs) == 0, _NAME, "programs already written")


def post(state: LowerState) -> None:
    graph = state.g.graph[A.GRAPH]
    seen: dict[int, int] = {}
    for prog in state.lowered.programs:
        for op in prog.ops:
            if op.kind in (pb.COMPUTE, pb.COLL):
                seen[op.task] = seen.get(op.task, 0) + 1
    tasks = [n.id for n in graph.nodes if n.kind in (pb.CALL, pb.COLLECTIVE)]
    require(all(seen.get(t) == 1 for t in tasks), _NAME, "a task is not computed exactly once")
    clocks = state.scratch["schedule.clock_makespan_us"]
    require(
        abs(clocks - state.makespan_us) <= 1e-6 * max(1.0, clocks),
        _NAME,
        f"the scheduler's clocks ({clocks:g} us) and the simulator's timing "
        f"({state.makespan_us:g} us) disagree on the makespan",
    )

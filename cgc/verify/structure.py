"""Structural checks of a lowered plan: ids, references, op fields, counts, seq pairing.

These are the facts the simulator and the runtime take for granted. Every failure raises
``PlanStructureError`` naming the actor, the op (as its text token) and what is wrong.
"""

from __future__ import annotations

from collections import Counter

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import format_op
from cgc.verify.errors import PlanStructureError

__all__ = ["check_structure", "node_inputs"]

_TASKS = (pb.CALL, pb.COLLECTIVE)


def _fail(msg: str) -> None:
    raise PlanStructureError(f"invalid plan: {msg}")


def node_inputs(node: pb.Node) -> list[pb.NodeRef]:
    """The node refs among a node's args and kwargs, in order."""
    refs = [a.ref for a in node.args if a.WhichOneof("kind") == "ref"]
    return refs + [k.arg.ref for k in node.kwargs if k.arg.WhichOneof("kind") == "ref"]


def _check_channels(plan: pb.Plan) -> None:
    g, low = plan.graph, plan.lowered
    actors = {a.name for a in g.actors}
    for i, ch in enumerate(low.channels):
        name = f"channel c{ch.id}"
        if ch.id != i + 1:
            _fail(f"{name} is at position {i}; channel ids must be 1, 2, ... in order")
        if ch.kind not in (pb.CHAN_HOST, pb.CHAN_NCCL):
            _fail(f"{name} has kind {ch.kind}")
        ends = actors | {DRIVER}
        if ch.writer not in ends or not ch.readers or any(r not in ends for r in ch.readers):
            _fail(f"{name}: unknown writer or reader ({ch.writer} -> {list(ch.readers)})")
        if list(ch.readers) != sorted(set(ch.readers)):
            _fail(f"{name}: readers must be sorted and unique")
        if ch.source.node >= len(g.nodes):
            _fail(f"{name}: source node {ch.source.node} does not exist")
        if ch.kind == pb.CHAN_HOST and ch.slots < 1:
            _fail(f"{name}: a host channel needs at least one slot")
        if ch.kind == pb.CHAN_NCCL:
            if DRIVER in (ch.writer, *ch.readers):
                _fail(f"{name}: the driver cannot take part in an NCCL channel")
            if ch.communicator >= len(low.communicators):
                _fail(f"{name}: communicator {ch.communicator} does not exist")
            members = set(low.communicators[ch.communicator].members)
            if not {ch.writer, *ch.readers} <= members:
                _fail(f"{name}: endpoints are not all members of communicator {ch.communicator}")
    for cid in low.input_channels:
        if not 1 <= cid <= len(low.channels) or low.channels[cid - 1].writer != DRIVER:
            _fail(f"input channel c{cid} is missing or not written by the driver")
    for cid in low.output_channels:
        if not 1 <= cid <= len(low.channels) or DRIVER not in low.channels[cid - 1].readers:
            _fail(f"output channel c{cid} is missing or not read by the driver")
    for i, c in enumerate(low.communicators):
        if c.id != i or len(set(c.members)) != len(c.members) or not set(c.members) <= actors:
            _fail(f"communicator {c.id}: bad id or members {list(c.members)}")


def _check_op(plan: pb.Plan, actor: str, op: pb.Op) -> None:
    g, low = plan.graph, plan.lowered
    tok = f"{actor}:{format_op(op) if op.kind in range(1, 7) else op.kind}"
    if op.kind not in range(1, 7) or op.exec_offset > 1 or op.stream not in (0, 1):
        _fail(f"op {tok} has a bad kind, exec_offset or stream")
    if op.task >= len(g.nodes) or g.nodes[op.task].kind not in _TASKS:
        _fail(f"op {tok} serves node {op.task}, which is not a task")
    node = g.nodes[op.task]
    if node.actor != actor:
        _fail(f"op {tok} serves {node.name}, a task of actor {node.actor}")
    if op.kind == pb.COLL and node.kind != pb.COLLECTIVE:
        _fail(f"op {tok}: COLL on a node that is not a collective member")
    if op.kind == pb.COMPUTE and node.kind != pb.CALL:
        _fail(f"op {tok}: COMPUTE on a collective member (use COLL)")
    if op.kind in (pb.COMPUTE, pb.COLL):
        return
    if not 1 <= op.channel <= len(low.channels):
        _fail(f"op {tok} uses channel c{op.channel}, which does not exist")
    ch = low.channels[op.channel - 1]
    host = ch.kind == pb.CHAN_HOST
    src_ok = (ch.source.node, ch.source.output_index) == (op.task, op.output_index)
    ok = {
        pb.READ: host and actor in ch.readers,
        pb.WRITE: host and actor == ch.writer and src_ok,
        pb.SEND: not host and actor == ch.writer and op.peer in ch.readers and src_ok,
        pb.RECV: not host and actor in ch.readers and op.peer == ch.writer,
    }[op.kind]
    if not ok:
        _fail(
            f"op {tok} does not match channel c{ch.id} ({ch.writer} -> {list(ch.readers)}, "
            f"source %{ch.source.node}.{ch.source.output_index})"
        )


def _check_counts(plan: pb.Plan, prog: pb.Program) -> None:
    g, low = plan.graph, plan.lowered
    actor = prog.actor
    loop = Counter(
        (op.kind, op.task if op.kind in (pb.COMPUTE, pb.COLL) else 0, op.channel, op.peer)
        for op in prog.ops
    )
    want: Counter = Counter()
    for n in g.nodes:
        if n.kind in _TASKS and n.actor == actor:
            want[(pb.COMPUTE if n.kind == pb.CALL else pb.COLL, n.id, 0, "")] += 1
    for ch in low.channels:
        if ch.kind == pb.CHAN_HOST:
            if actor == ch.writer:
                want[(pb.WRITE, 0, ch.id, "")] += 1
            if actor in ch.readers:
                want[(pb.READ, 0, ch.id, "")] += 1
        else:
            if actor == ch.writer:
                for r in ch.readers:
                    want[(pb.SEND, 0, ch.id, r)] += 1
            if actor in ch.readers:
                want[(pb.RECV, 0, ch.id, ch.writer)] += 1
    if loop != want:
        extra, missing = loop - want, want - loop

        def fmt(c: Counter) -> str:
            return ", ".join(
                f"{pb.OpKind.Name(k)} task={t} c{ch} {p}".strip() for (k, t, ch, p) in sorted(c)
            )

        _fail(
            f"actor {actor}: each execution must compute each of its tasks once and use each "
            f"of its channel ends once; missing [{fmt(missing)}], extra [{fmt(extra)}]"
        )
    pre = Counter(format_op(op) for op in prog.prologue)
    shifted = Counter(
        format_op(pb.Op(**{**_fields(op), "exec_offset": 0})) for op in prog.ops if op.exec_offset
    )
    if pre != shifted:
        _fail(
            f"actor {actor}: the prologue must hold exactly the execution-0 copies of the "
            "loop's exec_offset=1 ops"
        )


def _fields(op: pb.Op) -> dict:
    return {f.name: v for f, v in op.ListFields()}


def _check_dataflow(plan: pb.Plan, prog: pb.Program) -> None:
    """Every input of a task is there when it runs; every output is written after."""
    g, low = plan.graph, plan.lowered
    edge_ch = {(e.source.node, e.source.output_index, e.target): e.channel for e in low.edges}
    have = {op.channel for op in prog.ops if op.exec_offset and op.kind in (pb.READ, pb.RECV)}
    done: set[int] = set()
    for op in prog.ops:
        if op.exec_offset:
            continue
        tok = f"{prog.actor}:{format_op(op)}"
        if op.kind in (pb.READ, pb.RECV):
            have.add(op.channel)
        elif op.kind in (pb.WRITE, pb.SEND) and op.task not in done:
            _fail(f"op {tok} comes before its task is computed")
        elif op.kind in (pb.COMPUTE, pb.COLL):
            for ref in node_inputs(g.nodes[op.task]):
                src = g.nodes[ref.node]
                if src.kind in _TASKS and src.actor == prog.actor:
                    if ref.node not in done:
                        _fail(f"op {tok} uses %{ref.node} before this actor computes it")
                    continue
                cid = edge_ch.get((ref.node, ref.output_index, op.task), 0)
                if cid not in have:
                    _fail(
                        f"op {tok} runs before its input %{ref.node}.{ref.output_index} "
                        f"arrives (channel c{cid})"
                    )
            done.add(op.task)


def _check_seqs(plan: pb.Plan) -> None:
    low, g = plan.lowered, plan.graph
    sends, recvs, colls = {}, {}, {}
    for prog in low.programs:
        for op in prog.ops:
            if op.kind == pb.SEND:
                sends[(op.channel, op.peer)] = op.seq
            elif op.kind == pb.RECV:
                recvs[(op.channel, prog.actor)] = op.seq
            elif op.kind == pb.COLL:
                colls[op.task] = op.seq
    used: dict[tuple[int, int], str] = {}
    for (cid, reader), seq in sorted(sends.items()):
        if recvs.get((cid, reader)) != seq:
            _fail(
                f"SEND on c{cid} to {reader} has seq {seq}, its RECV has {recvs.get((cid, reader))}"
            )
        key = (low.channels[cid - 1].communicator, seq)
        if key in used:
            _fail(f"communicator {key[0]} seq {seq} is used twice ({used[key]} and c{cid})")
        used[key] = f"c{cid}->{reader}"
    for coll in g.collectives:
        seqs = {colls.get(n) for n in coll.nodes}
        if len(seqs) != 1:
            _fail(f"members of collective {coll.id} have different seqs {sorted(map(str, seqs))}")
        members = tuple(g.nodes[n].actor for n in coll.nodes)
        comm = next((c.id for c in low.communicators if tuple(c.members) == members), None)
        if comm is None:
            _fail(f"collective {coll.id}: no communicator has members {list(members)}")
        key = (comm, seqs.pop())
        if key in used:
            _fail(
                f"communicator {comm} seq {key[1]} is used twice ({used[key]} and "
                f"collective {coll.id})"
            )
        used[key] = f"collective {coll.id}"


def check_structure(plan: pb.Plan) -> None:
    """Check everything about a lowered plan that does not need simulation.

    Example: ``check_structure(plan)`` returns None for a plan ``lower`` wrote.

    Raises:
        PlanStructureError: the first violation found, naming actor, op and channel.
    """
    g, low = plan.graph, plan.lowered
    if [p.actor for p in low.programs] != [a.name for a in g.actors]:
        _fail("there must be one program per actor, in Graph.actors order")
    for i, n in enumerate(g.nodes):
        if n.id != i:
            _fail(f"node at position {i} has id {n.id}")
    _check_channels(plan)
    for prog in low.programs:
        for op in list(prog.prologue) + list(prog.ops):
            _check_op(plan, prog.actor, op)
        _check_counts(plan, prog)
        _check_dataflow(plan, prog)
    _check_seqs(plan)

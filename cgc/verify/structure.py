"""Structural checks of a plan: bounds, the graph, channels, communicators, config, programs.

These are the facts the simulator and the runtime take for granted: the runtime runs this
very check at start (``verify_plan``), so a plan file from anyone either passes it or gets
a ``PlanStructureError`` that names the field, node, actor, op or channel at fault, never
an ``IndexError`` later. The checks run in layers, each relying on the ones before:

1. bounds (``Limits``): list lengths, capacity, ring sizes, ``num_returns``, ...;
2. the graph: enum values, node ids and kinds, every reference (args, kwargs,
   collectives, input keys) in range and of the right kind;
3. the lowered part: channels (endpoints, sources, driver channels), communicators,
   ``ExecConfig`` (capacity within every driver channel's slots), edges;
4. programs: each op's fields (kind, task, channel, peer, communicator, extract), one op
   per task and channel end per execution, data available before use, seq pairing;
   ``wake_depth`` at most the number of actors.

Example: ``check_structure(plan)`` returns None for a plan ``lower`` wrote.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, NoReturn

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import DEFAULTS, LIMITS, Limits
from cgc.plan_schema.text import format_op
from cgc.verify.errors import PlanLimitError, PlanStructureError

__all__ = ["check_structure", "node_inputs", "BACKENDS"]

_TASKS = (pb.CALL, pb.COLLECTIVE)
_COMM_OPS = (pb.SEND, pb.RECV, pb.COLL)
# Communicator backends a plan may name (the runtime registers a factory per backend).
BACKENDS = ("nccl", "cpu")


def _known(enum: Any) -> frozenset[int]:  # a protobuf enum wrapper
    return frozenset(enum.values())


_NODE_KINDS = _known(pb.NodeKind) - {pb.NODE_KIND_UNSPECIFIED}
_OP_KINDS = _known(pb.OpKind) - {pb.OP_KIND_UNSPECIFIED}
_CHANNEL_KINDS = _known(pb.ChannelKind) - {pb.CHANNEL_KIND_UNSPECIFIED}
_COLLECTIVE_KINDS = _known(pb.CollectiveKind) - {pb.COLLECTIVE_KIND_UNSPECIFIED}
_INPUT_KEYS = _known(pb.InputKeyKind) - {pb.INPUT_KEY_NONE}
_TRANSPORTS = _known(pb.Transport)
_DEVICES = _known(pb.Device)
_REDUCE_OPS = _known(pb.ReduceOp)
_AT_CAPACITY = _known(pb.AtCapacity)
_STREAMS = _known(pb.Stream)


def _fail(msg: str) -> NoReturn:
    raise PlanStructureError(f"invalid plan: {msg}")


def _enum(value: int, known: frozenset[int], what: str) -> None:
    if value not in known:
        _fail(f"{what} has the unknown value {value} (a plan from a newer cgc, or corrupted)")


def node_inputs(node: pb.Node) -> list[pb.NodeRef]:
    """The node refs among a node's args and kwargs, in order."""
    refs = [a.ref for a in node.args if a.WhichOneof("kind") == "ref"]
    return refs + [k.arg.ref for k in node.kwargs if k.arg.WhichOneof("kind") == "ref"]


def _outputs(node: pb.Node) -> int:
    """How many outputs a node has (refs may name 0 .. this - 1)."""
    if node.kind == pb.OUTPUT:
        return 0
    return (node.num_returns or 1) if node.kind == pb.CALL else 1


def _owner(node: pb.Node) -> str:
    return node.actor if node.kind in _TASKS else DRIVER


# ---------------------------------------------------------------- 1. bounds


def _limit(field: str, value: int, limits: Limits, name: str) -> None:
    bound = getattr(limits, name)
    if value > bound:
        raise PlanLimitError(field, value, bound, name)


def _check_bounds(plan: pb.Plan, limits: Limits) -> None:
    g, low, cfg = plan.graph, plan.lowered, plan.config
    _limit("the number of actors", len(g.actors), limits, "actors")
    _limit("the number of nodes", len(g.nodes), limits, "nodes")
    _limit("the number of channels", len(low.channels), limits, "channels")
    _limit("the number of communicators", len(low.communicators), limits, "communicators")
    ops = sum(len(p.prologue) + len(p.ops) for p in low.programs)
    _limit("the number of ops in all programs", ops, limits, "ops")
    _limit("ExecConfig.capacity", cfg.capacity, limits, "capacity")
    _limit("ExecConfig.spin_us", cfg.spin_us, limits, "spin_us")
    _limit("ExecConfig.max_buffered_results", cfg.max_buffered_results, limits, "buffered_results")
    _limit("ExecConfig.default_slot_bytes", cfg.default_slot_bytes, limits, "slot_bytes")
    for n in g.nodes:
        _limit(f"num_returns of node %{n.id} ({n.name})", n.num_returns, limits, "num_returns")
    default = cfg.default_slot_bytes or int(DEFAULTS["default_slot_bytes"])
    ring = 0
    for ch in low.channels:
        _limit(f"Channel c{ch.id} slots", ch.slots, limits, "slots")
        _limit(f"Channel c{ch.id} slot_bytes", ch.slot_bytes, limits, "slot_bytes")
        if ch.kind == pb.CHAN_HOST:
            ring += ch.slots * (ch.slot_bytes or default)
    _limit("the shared memory of all rings (slots x slot_bytes)", ring, limits, "ring_bytes")
    for c in low.communicators:
        _limit(f"communicator {c.id} members", len(c.members), limits, "communicator_size")


# ---------------------------------------------------------------- 2. the graph


def _check_hint(hint: pb.TransportHint, what: str) -> None:
    _enum(hint.transport, _TRANSPORTS, f"{what} transport hint")
    _enum(hint.device, _DEVICES, f"{what} device hint")


def _check_refs(g: pb.Graph, node: pb.Node, name: str) -> None:
    for ref in node_inputs(node):
        if ref.node >= len(g.nodes) or ref.node == node.id:
            _fail(f"{name} takes node {ref.node}, which does not exist (or is itself)")
        if node.kind != pb.OUTPUT and ref.node > node.id:
            _fail(f"{name} takes node {ref.node}, which comes after it (ids are topological)")
        src = g.nodes[ref.node]
        if ref.output_index >= _outputs(src):
            _fail(
                f"{name} takes output {ref.output_index} of node %{src.id} ({src.name}), "
                f"which has {_outputs(src)}"
            )


def _check_node(g: pb.Graph, n: pb.Node, actors: set[str]) -> None:
    name = f"node %{n.id} ({n.name})"
    _enum(n.kind, _NODE_KINDS, f"{name} kind")
    for h in n.hints:
        _check_hint(h.hint, name)
    if n.kind == pb.INPUT_ATTR:
        _enum(n.key_kind, _INPUT_KEYS, f"{name} key_kind")
        if n.key_kind == pb.INDEX and n.index >= g.num_positional:
            _fail(f"{name} takes positional argument {n.index} of {g.num_positional}")
        if n.key_kind == pb.FIELD and n.field not in g.keyword_fields:
            _fail(f"{name} takes keyword {n.field!r}, which is not in Graph.keyword_fields")
    if n.kind in (pb.INPUT, pb.INPUT_ATTR) and (n.args or n.kwargs):
        _fail(f"{name}: an input node takes no arguments")
    if n.kind in _TASKS:
        if n.actor not in actors:
            _fail(f"{name} runs on unknown actor {n.actor!r}")
        if not n.method and n.kind == pb.CALL:
            _fail(f"{name} calls no method")
    if n.kind == pb.COLLECTIVE:
        if n.collective >= len(g.collectives):
            _fail(f"{name} is a member of collective {n.collective}, which does not exist")
        if len(n.args) != 1 or n.args[0].WhichOneof("kind") != "ref" or n.kwargs:
            _fail(f"{name}: a collective member takes exactly one node value")
        if n.num_returns > 1:
            _fail(f"{name}: a collective member has one output")
    if n.kind == pb.OUTPUT and any(a.WhichOneof("kind") != "ref" for a in n.args):
        _fail(f"{name}: every output must be a node value")
    if n.kind == pb.OUTPUT and n.kwargs:
        _fail(f"{name}: the output takes no keywords")
    _check_refs(g, n, name)


def _check_graph(plan: pb.Plan) -> None:
    g = plan.graph
    if not g.actors:
        _fail("the plan has no actors")
    names = [a.name for a in g.actors]
    for a in g.actors:
        if not a.name.isidentifier():
            _fail(f"actor name {a.name!r} is not an identifier")
    if len(set(names)) != len(names):
        _fail(f"two actors have one name: {sorted(n for n, k in Counter(names).items() if k > 1)}")
    actors = set(names)
    for i, n in enumerate(g.nodes):
        if n.id != i:
            _fail(f"node at position {i} has id {n.id}")
    kinds = Counter(n.kind for n in g.nodes)
    if kinds[pb.INPUT] != 1 or kinds[pb.OUTPUT] != 1:
        _fail(
            f"a graph has exactly one INPUT and one OUTPUT node (this one has "
            f"{kinds[pb.INPUT]} and {kinds[pb.OUTPUT]})"
        )
    for n in g.nodes:
        _check_node(g, n, actors)
    members: dict[int, int] = {}
    for i, c in enumerate(g.collectives):
        what = f"collective {c.id}"
        if c.id != i:
            _fail(f"collective at position {i} has id {c.id}")
        _enum(c.kind, _COLLECTIVE_KINDS, f"{what} kind")
        _enum(c.reduce_op, _REDUCE_OPS, f"{what} reduce_op")
        _check_hint(c.hint, what)
        if len(c.nodes) < 2:
            _fail(f"{what} has {len(c.nodes)} members; a collective needs at least two")
        for nid in c.nodes:
            if nid >= len(g.nodes) or g.nodes[nid].kind != pb.COLLECTIVE:
                _fail(f"{what} names node {nid}, which is not a collective member node")
            if g.nodes[nid].collective != c.id or nid in members:
                _fail(f"{what}: member node %{nid} belongs to another collective")
            members[nid] = c.id
        if len({g.nodes[nid].actor for nid in c.nodes}) != len(c.nodes):
            _fail(f"{what}: two members on one actor")
    for n in g.nodes:
        if n.kind == pb.COLLECTIVE and n.id not in members:
            _fail(f"node %{n.id} ({n.name}) is missing from its collective's members")


# ---------------------------------------------------------------- 3. the lowered part


def _check_channels(plan: pb.Plan) -> None:
    g, low = plan.graph, plan.lowered
    ends = {a.name for a in g.actors} | {DRIVER}
    for i, ch in enumerate(low.channels):
        name = f"channel c{ch.id}"
        if ch.id != i + 1:
            _fail(f"{name} is at position {i}; channel ids must be 1, 2, ... in order")
        _enum(ch.kind, _CHANNEL_KINDS, f"{name} kind")
        _enum(ch.device, _DEVICES, f"{name} device")
        if ch.writer not in ends or not ch.readers or any(r not in ends for r in ch.readers):
            _fail(f"{name}: unknown writer or reader ({ch.writer} -> {list(ch.readers)})")
        if list(ch.readers) != sorted(set(ch.readers)):
            _fail(f"{name}: readers must be sorted and unique")
        if ch.writer in ch.readers and ch.writer != DRIVER:
            _fail(f"{name}: {ch.writer} reads its own channel")
        if ch.source.node >= len(g.nodes):
            _fail(f"{name}: source node {ch.source.node} does not exist")
        src = g.nodes[ch.source.node]
        if ch.source.output_index >= _outputs(src):
            _fail(
                f"{name}: carries output {ch.source.output_index} of %{src.id}, which has "
                f"{_outputs(src)}"
            )
        if _owner(src) != ch.writer:
            _fail(
                f"{name}: written by {ch.writer}, but its source %{src.id} belongs to {_owner(src)}"
            )
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
    ins = list(low.input_channels)
    if len(set(ins)) != len(ins):
        _fail(f"input channels {ins} name one channel twice")
    for cid in ins:
        ok = 1 <= cid <= len(low.channels) and low.channels[cid - 1].writer == DRIVER
        if not ok or g.nodes[low.channels[cid - 1].source.node].kind not in (
            pb.INPUT,
            pb.INPUT_ATTR,
        ):
            _fail(f"input channel c{cid} is missing, not written by the driver, or not an input")
    written = {ch.id for ch in low.channels if ch.writer == DRIVER}
    if written != set(ins):
        _fail(f"the driver writes channels {sorted(written)}, but input_channels are {ins}")
    output = next(n for n in g.nodes if n.kind == pb.OUTPUT)
    outs = list(low.output_channels)
    if len(outs) != len(output.args):
        _fail(f"{len(outs)} output channels for {len(output.args)} outputs")
    for cid, arg in zip(outs, output.args, strict=True):
        if not 1 <= cid <= len(low.channels) or DRIVER not in low.channels[cid - 1].readers:
            _fail(f"output channel c{cid} is missing or not read by the driver")
        ref = low.channels[cid - 1].source
        if (ref.node, ref.output_index) != (arg.ref.node, arg.ref.output_index):
            _fail(
                f"output channel c{cid} carries %{ref.node}.{ref.output_index}, not the "
                f"output's %{arg.ref.node}.{arg.ref.output_index}"
            )
    read = {ch.id for ch in low.channels if DRIVER in ch.readers}
    if read != set(outs):
        _fail(f"the driver reads channels {sorted(read)}, but output_channels are {outs}")


def _check_communicators(plan: pb.Plan) -> None:
    actors = {a.name for a in plan.graph.actors}
    for i, c in enumerate(plan.lowered.communicators):
        what = f"communicator {c.id}"
        if c.id != i:
            _fail(f"{what} is at position {i}; communicator ids must be 0, 1, ... in order")
        if c.backend not in BACKENDS:
            _fail(f"{what} has backend {c.backend!r}; known: {', '.join(BACKENDS)}")
        if len(c.members) < 2 or len(set(c.members)) != len(c.members):
            _fail(f"{what} needs two or more distinct members, not {list(c.members)}")
        if not set(c.members) <= actors:
            _fail(f"{what} has members that are not actors: {list(c.members)}")


def _check_config(plan: pb.Plan) -> None:
    low, cfg = plan.lowered, plan.config
    if cfg.capacity < 1:
        _fail("ExecConfig.capacity is 0: the plan was not lowered (compile it with cgc)")
    _enum(cfg.at_capacity, _AT_CAPACITY, "ExecConfig.at_capacity")
    for f in ("submit_timeout_s", "get_timeout_s", "teardown_timeout_s", "setup_timeout_s"):
        if math.isnan(getattr(cfg, f)):
            _fail(f"ExecConfig.{f} is NaN")
    for cid in dict.fromkeys([*low.input_channels, *low.output_channels]):
        ch = low.channels[cid - 1]
        if ch.slots < cfg.capacity:
            _fail(
                f"driver channel c{cid} holds {ch.slots} values but ExecConfig.capacity is "
                f"{cfg.capacity}: every driver channel must hold the capacity"
            )


def _check_edges(plan: pb.Plan) -> None:
    g, low = plan.graph, plan.lowered
    seen: set[tuple[int, int, int]] = set()
    for e in low.edges:
        what = f"edge %{e.source.node}.{e.source.output_index} -> %{e.target}"
        if e.source.node >= len(g.nodes) or e.target >= len(g.nodes):
            _fail(f"{what} names a node that does not exist")
        if e.source.output_index >= _outputs(g.nodes[e.source.node]):
            _fail(f"{what} names an output its source does not have")
        _enum(e.transport, _TRANSPORTS, f"{what} transport")
        key = (e.source.node, e.source.output_index, e.target)
        if key in seen:
            _fail(f"{what} is listed twice")
        seen.add(key)
        if (e.channel == 0) != (e.transport == pb.LOCAL):
            _fail(f"{what}: a LOCAL edge has no channel and every other edge has one")
        if e.channel > len(low.channels):
            _fail(f"{what} uses channel c{e.channel}, which does not exist")
        if e.channel:
            ch = low.channels[e.channel - 1]
            src, dst = g.nodes[e.source.node], g.nodes[e.target]
            carried = (ch.source.node, ch.source.output_index) == key[:2]
            extracted = src.kind == pb.INPUT_ATTR and g.nodes[ch.source.node].kind == pb.INPUT
            if not (carried or extracted) or _owner(dst) not in ch.readers:
                _fail(f"{what} does not match its channel c{ch.id}")


# ---------------------------------------------------------------- 4. programs


class _Tok:
    """``actor:token`` of an op, formatted only when a message needs it (hot path)."""

    __slots__ = ("actor", "op")

    def __init__(self, actor: str, op: pb.Op) -> None:
        self.actor, self.op = actor, op

    def __format__(self, spec: str) -> str:
        return f"{self.actor}:{format_op(self.op)}"


_tok = _Tok


def _check_op(plan: pb.Plan, actor: str, op: pb.Op) -> None:
    g, low = plan.graph, plan.lowered
    _enum(op.kind, _OP_KINDS, f"an op of actor {actor}")
    tok = _tok(actor, op)
    if op.stream not in _STREAMS:
        _fail(
            f"op {tok} stream has the unknown value {op.stream} (a plan from a newer cgc, "
            "or corrupted)"
        )
    if op.exec_offset > 1:
        _fail(f"op {tok} has exec_offset {op.exec_offset}; only 0 and 1 exist")
    if op.task >= len(g.nodes) or g.nodes[op.task].kind not in _TASKS:
        _fail(f"op {tok} serves node {op.task}, which is not a task")
    node = g.nodes[op.task]
    if node.actor != actor:
        _fail(f"op {tok} serves {node.name}, a task of actor {node.actor}")
    if op.kind == pb.COLL and node.kind != pb.COLLECTIVE:
        _fail(f"op {tok}: COLL on a node that is not a collective member")
    if op.kind == pb.COMPUTE and node.kind != pb.CALL:
        _fail(f"op {tok}: COMPUTE on a collective member (use COLL)")
    if op.extract and op.kind != pb.READ:
        _fail(f"op {tok}: only a READ extracts input attributes")
    if op.peer and op.kind not in (pb.SEND, pb.RECV):
        _fail(f"op {tok}: only SEND and RECV have a peer")
    if op.communicator and op.kind not in _COMM_OPS:
        _fail(f"op {tok}: only SEND, RECV and COLL run on a communicator")
    if op.kind == pb.COLL:
        if op.communicator >= len(low.communicators):
            _fail(f"op {tok} runs on communicator {op.communicator}, which does not exist")
        coll = g.collectives[node.collective]
        members = [g.nodes[n].actor for n in coll.nodes]
        if list(low.communicators[op.communicator].members) != members:
            _fail(
                f"op {tok}: communicator {op.communicator}'s members are not collective "
                f"{coll.id}'s members {members} in rank order"
            )
    if op.kind in (pb.COMPUTE, pb.COLL):
        if op.channel:
            _fail(f"op {tok} names a channel it does not use")
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
    if op.kind in (pb.SEND, pb.RECV) and op.communicator != ch.communicator:
        _fail(
            f"op {tok} runs on communicator {op.communicator}, but c{ch.id} is on {ch.communicator}"
        )
    if op.extract:
        if g.nodes[ch.source.node].kind != pb.INPUT:
            _fail(f"op {tok} extracts from c{ch.id}, which does not carry the whole input")
        ids = list(op.extract)
        if ids != sorted(set(ids)):
            _fail(f"op {tok}: extract must be sorted and unique")
        if any(i >= len(g.nodes) or g.nodes[i].kind != pb.INPUT_ATTR for i in ids):
            _fail(f"op {tok} extracts a node that is not an input attribute")


def _op_key(op: pb.Op, offset: int) -> tuple:
    return (
        op.kind,
        op.task,
        op.channel,
        op.output_index,
        op.peer,
        op.stream,
        offset,
        op.seq,
        op.communicator,
        tuple(op.extract),
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
    pre = Counter(_op_key(op, op.exec_offset) for op in prog.prologue)
    shifted = Counter(_op_key(op, 0) for op in prog.ops if op.exec_offset)
    if pre != shifted:
        _fail(
            f"actor {actor}: the prologue must hold exactly the execution-0 copies of the "
            "loop's exec_offset=1 ops"
        )


def _check_dataflow(plan: pb.Plan, prog: pb.Program, edge_ch: dict[tuple, int]) -> None:
    """Every input of a task is there when it runs; every output is written after."""
    g, low = plan.graph, plan.lowered
    early = [op for op in prog.ops if op.exec_offset and op.kind in (pb.READ, pb.RECV)]
    have = {op.channel for op in early}
    extracted = {(op.channel, i) for op in early for i in op.extract}
    done: set[int] = set()
    for op in prog.ops:
        if op.exec_offset:
            continue
        tok = _tok(prog.actor, op)
        if op.kind in (pb.READ, pb.RECV):
            have.add(op.channel)
            extracted.update((op.channel, i) for i in op.extract)
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
                if low.channels[cid - 1].source.node != ref.node and (cid, ref.node) not in (
                    extracted
                ):
                    _fail(
                        f"op {tok}: input %{ref.node} comes in the whole input on c{cid}, "
                        "but no READ before it extracts it"
                    )
            done.add(op.task)


def _check_extracts(plan: pb.Plan, edge_ch: dict[tuple, int]) -> None:
    """Each READ extracts exactly the attributes whose edges ride on its channel."""
    g, low = plan.graph, plan.lowered
    want: dict[tuple[str, int], set[int]] = {}
    for (src, _out, dst), cid in edge_ch.items():
        if cid and low.channels[cid - 1].source.node != src:
            want.setdefault((_owner(g.nodes[dst]), cid), set()).add(src)
    got = {
        (p.actor, op.channel): set(op.extract)
        for p in low.programs
        for op in p.ops
        if op.kind == pb.READ and op.extract
    }
    for actor, cid in sorted(set(got) | set(want)):
        have, need = sorted(got.get((actor, cid), ())), sorted(want.get((actor, cid), ()))
        if have != need:
            _fail(
                f"actor {actor}'s READ of c{cid} extracts nodes {have}, but its tasks take "
                f"{need} out of the whole input"
            )


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
                colls[op.task] = (op.seq, op.communicator)
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
            _fail(
                f"members of collective {coll.id} have different seqs or communicators "
                f"{sorted(map(str, seqs))}"
            )
        pair = seqs.pop()
        if pair is None:
            _fail(f"collective {coll.id} has a member without its COLL op")
        seq, comm = pair
        key = (comm, seq)
        if key in used:
            _fail(
                f"communicator {comm} seq {seq} is used twice ({used[key]} and "
                f"collective {coll.id})"
            )
        used[key] = f"collective {coll.id}"


def check_structure(plan: pb.Plan, limits: Limits | None = None) -> None:
    """Check everything about a plan that does not need simulation.

    ``limits`` defaults to ``cgc.plan_schema.defaults.LIMITS``.
    Example: ``check_structure(plan)`` returns None for a plan ``lower`` wrote.

    Raises:
        PlanLimitError: a field beyond its bound (names the field and the limit).
        PlanStructureError: the first violation found, naming field, actor, op or channel.
    """
    g, low = plan.graph, plan.lowered
    _check_bounds(plan, limits or LIMITS)
    _check_graph(plan)
    if [p.actor for p in low.programs] != [a.name for a in g.actors]:
        _fail(
            f"there must be one program per actor, in Graph.actors order ({len(low.programs)} "
            f"programs for {len(g.actors)} actors; not lowered? compile it with cgc)"
        )
    for prog in low.programs:  # the runtime sizes the doorbells by the deepest one
        if prog.wake_depth > len(g.actors):
            _fail(
                f"actor {prog.actor}'s wake_depth {prog.wake_depth} is beyond the number of "
                f"actors ({len(g.actors)}): a depth counts hops through distinct actors"
            )
    _check_channels(plan)
    _check_communicators(plan)
    _check_config(plan)
    _check_edges(plan)
    edge_ch = {(e.source.node, e.source.output_index, e.target): e.channel for e in low.edges}
    for prog in low.programs:
        for op in list(prog.prologue) + list(prog.ops):
            _check_op(plan, prog.actor, op)
        _check_counts(plan, prog)
        _check_dataflow(plan, prog, edge_ch)
    _check_extracts(plan, edge_ch)
    _check_seqs(plan)

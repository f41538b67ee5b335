"""Structural checks of a plan: bounds, the graph, channels, communicators, config, programs.

These are the facts the simulator and the runtime take for granted: the runtime runs this
very check at start (``verify_plan``), so a plan file from anyone either passes it or gets
a ``PlanStructureError`` that names the field, node, actor, op or channel at fault, never
an ``IndexError`` later. The checks run in layers, each relying on the ones before:

1. bounds (``cgc.plan_schema.verify.bounds``): list lengths, capacity, ring sizes, actor options and
   constructor arguments within ``Limits``;
2. the graph: enum values, node ids and kinds, per-node bounds, every reference (args,
   kwargs, collectives, input keys) in range and of the right kind, every constant a value
   that decodes; the example inputs fit the graph's arguments;
3. the lowered part: channels (endpoints, sources, driver channels), communicators,
   ``ExecConfig`` (capacity within every driver channel's slots), edges;
4. programs (``cgc.plan_schema.verify.programs``): each op's fields, one op per task and channel end
   per execution, the prologue, data available before use, seq pairing; ``wake_depth``
   at most the number of actors.

Cost: each layer reads every field of its lists once (protobuf field access is what costs)
into plain lists and sets of an ``Index``, and looks everything else up there, so the check
is linear in the plan's size; ``tests/plan_schema/verify/test_bounded.py`` counts it.

Example: ``check_structure(plan)`` returns None for a plan ``lower`` wrote.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, NoReturn

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import LIMITS, Limits
from cgc.plan_schema.inputs import input_problems
from cgc.plan_schema.verify.bounds import Rings, Values, check_bounds, check_spec, limit
from cgc.plan_schema.verify.errors import PlanStructureError
from cgc.plan_schema.verify.programs import Index, check_programs, node_inputs
from cgc.plan_schema.verify.weight_sync import check_weight_syncs

__all__ = ["check_structure", "node_inputs"]

_TASKS = (pb.CALL, pb.COLLECTIVE)


def _known(enum: Any) -> frozenset[int]:  # a protobuf enum wrapper
    return frozenset(enum.values())


_NODE_KINDS = _known(pb.NodeKind) - {pb.NODE_KIND_UNSPECIFIED}
_CHANNEL_KINDS = _known(pb.ChannelKind) - {pb.CHANNEL_KIND_UNSPECIFIED}
_COLLECTIVE_KINDS = _known(pb.CollectiveKind) - {pb.COLLECTIVE_KIND_UNSPECIFIED}
_INPUT_KEYS = _known(pb.InputKeyKind) - {pb.INPUT_KEY_NONE}
_TRANSPORTS = _known(pb.Transport)
_DEVICES = _known(pb.Device)
_REDUCE_OPS = _known(pb.ReduceOp)
_AT_CAPACITY = _known(pb.AtCapacity)


def _fail(msg: str) -> NoReturn:
    raise PlanStructureError(f"invalid plan: {msg}")


def _enum(value: int, known: frozenset[int], what: str) -> None:
    if value not in known:
        _fail(f"{what} has the unknown value {value} (a plan from a newer cgc, or corrupted)")


# ---------------------------------------------------------------- 2. the graph


def _check_hint(hint: pb.TransportHint, what: str, limits: Limits) -> None:
    _enum(hint.transport, _TRANSPORTS, f"{what} transport hint")
    _enum(hint.device, _DEVICES, f"{what} device hint")
    check_spec(hint.spec, f"a transport hint of {what}", limits)


def _check_node(plan: pb.Plan, ix: Index, n: pb.Node, i: int, kind: int, limits: Limits,
                values: Values) -> None:
    """One node: bounds, kind and fields; its refs are checked once every node is known."""
    g = plan.graph
    name = f"node %{n.id} ({n.name})"
    if n.id != i:
        _fail(f"node at position {i} has id {n.id}")
    limit(f"num_returns of {name}", n.num_returns, limits, "num_returns")
    args, kwargs, hints = n.args, n.kwargs, n.hints
    limit(f"the arguments of {name}", len(args) + len(kwargs), limits, "arguments")
    if hints:
        limit(f"the transport hints of {name}", len(hints), limits, "num_returns")
        for h in hints:
            _check_hint(h.hint, name, limits)
    _enum(kind, _NODE_KINDS, f"{name} kind")
    if kind == pb.INPUT_ATTR:
        _enum(n.key_kind, _INPUT_KEYS, f"{name} key_kind")
        if n.key_kind == pb.INDEX and n.index >= g.num_positional:
            _fail(f"{name} takes positional argument {n.index} of {g.num_positional}")
        if n.key_kind == pb.FIELD and n.field not in ix.keywords:
            _fail(f"{name} takes keyword {n.field!r}, which is not in Graph.keyword_fields")
    if kind in (pb.INPUT, pb.INPUT_ATTR) and (args or kwargs):
        _fail(f"{name}: an input node takes no arguments")
    actor = ""
    if kind in _TASKS:
        actor = n.actor
        if actor not in ix.actors:
            _fail(f"{name} runs on unknown actor {actor!r}")
        if kind == pb.CALL and not n.method:
            _fail(f"{name} calls no method")
    coll = 0
    if kind == pb.COLLECTIVE:
        coll = n.collective
        if coll >= len(g.collectives):
            _fail(f"{name} is a member of collective {coll}, which does not exist")
        if len(args) != 1 or args[0].WhichOneof("kind") != "ref" or kwargs:
            _fail(f"{name}: a collective member takes exactly one node value")
        if n.num_returns > 1:
            _fail(f"{name}: a collective member has one output")
    refs: list[tuple[int, int]] = []
    for j, a in enumerate(args):
        which = a.WhichOneof("kind")
        if which == "ref":
            refs.append((a.ref.node, a.ref.output_index))
        elif kind == pb.OUTPUT:
            _fail(f"{name}: every output must be a node value")
        elif which is None:
            _fail(f"{name} args[{j}] is neither a node value nor a constant")
        else:
            values.walk(a.constant, f"{name} args[{j}]", 0, False)
    if kwargs:
        if kind == pb.OUTPUT:
            _fail(f"{name}: the output takes no keywords")
        for kw in kwargs:
            a = kw.arg
            which = a.WhichOneof("kind")
            if which == "ref":
                refs.append((a.ref.node, a.ref.output_index))
            elif which is None:
                _fail(f"{name} kwargs[{kw.name!r}] is neither a node value nor a constant")
            else:
                values.walk(a.constant, f"{name} kwargs[{kw.name!r}]", 0, False)
    ix.add_node(kind, actor, (n.num_returns or 1) if kind == pb.CALL else
                (0 if kind == pb.OUTPUT else 1), coll, refs)


def _check_refs(plan: pb.Plan, ix: Index) -> None:
    nodes, n_nodes = plan.graph.nodes, ix.n_nodes
    for i, refs in enumerate(ix.refs):
        if not refs:
            continue
        output = ix.kind[i] == pb.OUTPUT
        for node, out in refs:
            if node >= n_nodes or node == i:
                n = nodes[i]
                _fail(f"node %{i} ({n.name}) takes node {node}, which does not exist "
                      "(or is itself)")
            if not output and node > i:
                _fail(f"node %{i} ({nodes[i].name}) takes node {node}, which comes after it "
                      "(ids are topological)")
            if out >= ix.outs[node]:
                src = nodes[node]
                _fail(
                    f"node %{i} ({nodes[i].name}) takes output {out} of node %{src.id} "
                    f"({src.name}), which has {ix.outs[node]}"
                )


def _check_graph(plan: pb.Plan, ix: Index, limits: Limits) -> None:
    g = plan.graph
    if not g.actors:
        _fail("the plan has no actors")
    names = [a.name for a in g.actors]
    for name in names:
        if not name.isidentifier():
            _fail(f"actor name {name!r} is not an identifier")
    if len(set(names)) != len(names):
        _fail(f"two actors have one name: {sorted(n for n, k in Counter(names).items() if k > 1)}")
    ix.actors = frozenset(names)
    fields = list(g.keyword_fields)
    if any(a >= b for a, b in zip(fields, fields[1:], strict=False)):
        _fail("Graph.keyword_fields must be sorted and unique")
    ix.keywords = frozenset(fields)
    nodes = g.nodes
    kinds = [n.kind for n in nodes]
    if kinds.count(pb.INPUT) != 1 or kinds.count(pb.OUTPUT) != 1:
        _fail(
            f"a graph has exactly one INPUT and one OUTPUT node (this one has "
            f"{kinds.count(pb.INPUT)} and {kinds.count(pb.OUTPUT)})"
        )
    values = Values(limits)
    for i, (n, kind) in enumerate(zip(nodes, kinds, strict=True)):
        _check_node(plan, ix, n, i, kind, limits, values)
    _check_refs(plan, ix)
    _check_collectives(plan, ix, limits)
    _check_examples(plan)


def _check_collectives(plan: pb.Plan, ix: Index, limits: Limits) -> None:
    g = plan.graph
    members: dict[int, int] = {}
    kinds, colls, actors = ix.kind, ix.coll, ix.actor
    for i, c in enumerate(g.collectives):
        what = f"collective {c.id}"
        if c.id != i:
            _fail(f"collective at position {i} has id {c.id}")
        _enum(c.kind, _COLLECTIVE_KINDS, f"{what} kind")
        _enum(c.reduce_op, _REDUCE_OPS, f"{what} reduce_op")
        _check_hint(c.hint, what, limits)
        nodes = list(c.nodes)
        if len(nodes) < 2:
            _fail(f"{what} has {len(nodes)} members; a collective needs at least two")
        for nid in nodes:
            if nid >= ix.n_nodes or kinds[nid] != pb.COLLECTIVE:
                _fail(f"{what} names node {nid}, which is not a collective member node")
            if colls[nid] != i or nid in members:
                _fail(f"{what}: member node %{nid} belongs to another collective")
            members[nid] = i
        on = [actors[nid] for nid in nodes]
        if len(set(on)) != len(on):
            _fail(f"{what}: two members on one actor")
        ix.coll_actors.append(on)
        ix.coll_nodes.append(nodes)
    for i, k in enumerate(kinds):
        if k == pb.COLLECTIVE and i not in members:
            _fail(f"node %{i} ({g.nodes[i].name}) is missing from its collective's members")


def _check_examples(plan: pb.Plan) -> None:
    """The stored example inputs are arguments ``execute()`` takes (``cgc run`` uses them)."""
    if not plan.has_example_inputs:
        return
    names = [nv.name for nv in plan.example_kwargs]
    if len(set(names)) != len(names):
        _fail("example_kwargs name one keyword twice")
    problems = input_problems(plan.graph, len(plan.example_args), names)
    if problems:
        _fail("the example inputs do not fit the graph's arguments: it needs "
              + "; ".join(problems))


# ---------------------------------------------------------------- 3. the lowered part


def _check_channels(plan: pb.Plan, ix: Index, limits: Limits) -> None:
    low = plan.lowered
    ends = ix.actors | {DRIVER}
    n_comms = len(low.communicators)
    comm_members: dict[int, frozenset[str]] = {}
    rings = Rings(plan, limits)
    host_kind, nccl_kind = pb.CHAN_HOST, pb.CHAN_NCCL
    for i, ch in enumerate(low.channels):
        cid, kind, writer, readers, slots = ch.id, ch.kind, ch.writer, list(ch.readers), ch.slots
        rings.add(cid, kind == host_kind, slots, ch.slot_bytes, len(readers))
        if cid != i + 1:
            _fail(f"channel c{cid} is at position {i}; channel ids must be 1, 2, ... in order")
        if kind not in _CHANNEL_KINDS:
            _enum(kind, _CHANNEL_KINDS, f"channel c{cid} kind")
        device = ch.device
        if device not in _DEVICES:
            _enum(device, _DEVICES, f"channel c{cid} device")
        rset = frozenset(readers)
        if writer not in ends or not readers or not rset <= ends:
            _fail(f"channel c{cid}: unknown writer or reader ({writer} -> {readers})")
        if len(readers) > 1 and (len(rset) != len(readers) or any(
                a >= b for a, b in zip(readers, readers[1:], strict=False))):
            _fail(f"channel c{cid}: readers must be sorted and unique")
        if writer in rset and writer != DRIVER:
            _fail(f"channel c{cid}: {writer} reads its own channel")
        source = ch.source
        src, out = source.node, source.output_index
        if src >= ix.n_nodes:
            _fail(f"channel c{cid}: source node {src} does not exist")
        if out >= ix.outs[src]:
            _fail(f"channel c{cid}: carries output {out} of %{src}, which has {ix.outs[src]}")
        if ix.owner(src) != writer:
            _fail(f"channel c{cid}: written by {writer}, but its source %{src} belongs to "
                  f"{ix.owner(src)}")
        comm = 0
        if kind == host_kind and slots < 1:
            _fail(f"channel c{cid}: a host channel needs at least one slot")
        if kind == nccl_kind:
            if writer == DRIVER or DRIVER in rset:
                _fail(f"channel c{cid}: the driver cannot take part in an NCCL channel")
            comm = ch.communicator
            if comm >= n_comms:
                _fail(f"channel c{cid}: communicator {comm} does not exist")
            members = comm_members.get(comm)
            if members is None:  # once per communicator, not once per channel
                members = comm_members[comm] = frozenset(low.communicators[comm].members)
            if writer not in members or not rset <= members:
                _fail(f"channel c{cid}: endpoints are not all members of communicator {comm}")
        if ch.HasField("spec"):
            check_spec(ch.spec, f"Channel c{cid} spec", limits)
        ix.add_channel(kind, writer, rset, src, out, comm)
    rings.done()
    _check_driver_channels(plan, ix)


def _check_driver_channels(plan: pb.Plan, ix: Index) -> None:
    low = plan.lowered
    n_ch = ix.n_channels
    ins = list(low.input_channels)
    if len(set(ins)) != len(ins):
        _fail(f"input channels {ins} name one channel twice")
    for cid in ins:
        ok = 1 <= cid <= n_ch and ix.ch_writer[cid - 1] == DRIVER
        if not ok or ix.kind[ix.ch_src[cid - 1]] not in (pb.INPUT, pb.INPUT_ATTR):
            _fail(f"input channel c{cid} is missing, not written by the driver, or not an input")
    written = {i + 1 for i, w in enumerate(ix.ch_writer) if w == DRIVER}
    if written != set(ins):
        _fail(f"the driver writes channels {sorted(written)}, but input_channels are {ins}")
    output = plan.graph.nodes[ix.kind.index(pb.OUTPUT)]
    outs = list(low.output_channels)
    args = output.args
    if len(outs) != len(args):
        _fail(f"{len(outs)} output channels for {len(args)} outputs")
    for cid, arg in zip(outs, args, strict=True):
        if not 1 <= cid <= n_ch or DRIVER not in ix.ch_readers[cid - 1]:
            _fail(f"output channel c{cid} is missing or not read by the driver")
        src, out = ix.ch_src[cid - 1], ix.ch_out[cid - 1]
        if (src, out) != (arg.ref.node, arg.ref.output_index):
            _fail(
                f"output channel c{cid} carries %{src}.{out}, not the "
                f"output's %{arg.ref.node}.{arg.ref.output_index}"
            )
    read = {i + 1 for i, rs in enumerate(ix.ch_readers) if DRIVER in rs}
    if read != set(outs):
        _fail(f"the driver reads channels {sorted(read)}, but output_channels are {outs}")


def _check_communicators(plan: pb.Plan, ix: Index) -> None:
    for i, c in enumerate(plan.lowered.communicators):
        what = f"communicator {c.id}"
        if c.id != i:
            _fail(f"{what} is at position {i}; communicator ids must be 0, 1, ... in order")
        members = list(c.members)
        if len(members) < 2 or len(set(members)) != len(members):
            _fail(f"{what} needs two or more distinct members, not {members}")
        if not ix.actors.issuperset(members):
            _fail(f"{what} has members that are not actors: {members}")
        ix.comm_members.append(members)


def _check_config(plan: pb.Plan, ix: Index) -> None:
    low, cfg = plan.lowered, plan.config
    cap = cfg.capacity
    if cap < 1:
        _fail("ExecConfig.capacity is 0: the plan was not lowered (compile it with cgc)")
    _enum(cfg.at_capacity, _AT_CAPACITY, "ExecConfig.at_capacity")
    for f in ("submit_timeout_s", "get_timeout_s", "teardown_timeout_s", "setup_timeout_s"):
        if math.isnan(getattr(cfg, f)):
            _fail(f"ExecConfig.{f} is NaN")
    channels = low.channels
    for cid in dict.fromkeys([*low.input_channels, *low.output_channels]):
        slots = channels[cid - 1].slots
        if slots < cap:
            _fail(
                f"driver channel c{cid} holds {slots} values but ExecConfig.capacity is "
                f"{cap}: every driver channel must hold the capacity"
            )


def _check_edges(plan: pb.Plan, ix: Index) -> None:
    """Every edge names real nodes and outputs, and the channel its value arrives on;
    fills ``ix.edge_ch`` (the dataflow check reads it)."""
    seen = ix.edge_ch
    n_nodes, n_ch = ix.n_nodes, ix.n_channels
    kinds, outs = ix.kind, ix.outs
    for e in plan.lowered.edges:
        source = e.source
        src, out, dst, cid, transport = (source.node, source.output_index, e.target,
                                         e.channel, e.transport)
        if src >= n_nodes or dst >= n_nodes:
            _fail(f"edge %{src}.{out} -> %{dst} names a node that does not exist")
        if out >= outs[src]:
            _fail(f"edge %{src}.{out} -> %{dst} names an output its source does not have")
        if transport not in _TRANSPORTS:
            _enum(transport, _TRANSPORTS, f"edge %{src}.{out} -> %{dst} transport")
        key = (src, out, dst)
        if key in seen:
            _fail(f"edge %{src}.{out} -> %{dst} is listed twice")
        seen[key] = cid
        if (cid == 0) != (transport == pb.LOCAL):
            _fail(f"edge %{src}.{out} -> %{dst}: a LOCAL edge has no channel and every other "
                  "edge has one")
        if cid > n_ch:
            _fail(f"edge %{src}.{out} -> %{dst} uses channel c{cid}, which does not exist")
        if cid:
            k = cid - 1
            carried = ix.ch_src[k] == src and ix.ch_out[k] == out
            extracted = kinds[src] == pb.INPUT_ATTR and kinds[ix.ch_src[k]] == pb.INPUT
            if not (carried or extracted) or ix.owner(dst) not in ix.ch_readers[k]:
                _fail(f"edge %{src}.{out} -> %{dst} does not match its channel c{cid}")


def _check_captures(plan: pb.Plan, prog: pb.Program) -> None:
    """``captured_ops``: ascending indices of COMPUTE ops of calls marked for capture (a
    region holds one call: nothing a peer waits on from the host is inside it)."""
    last = -1
    for i in prog.captured_ops:
        if i <= last or i >= len(prog.ops):
            _fail(f"actor {prog.actor}: captured_ops must be ascending indices into its "
                  f"{len(prog.ops)} ops (got {list(prog.captured_ops)[:8]})")
        op = prog.ops[i]
        if op.kind != pb.COMPUTE:
            _fail(f"actor {prog.actor}: captured op {i} is a {pb.OpKind.Name(op.kind)}; only "
                  "a COMPUTE can be replayed as a CUDA graph (reads, writes and transfers "
                  "wait on peers from the host)")
        node = plan.graph.nodes[op.task] if op.task < len(plan.graph.nodes) else None
        if node is None or not node.cuda_graph:
            _fail(f"actor {prog.actor}: captured op {i} computes a call that is not marked "
                  "for capture (Node.cuda_graph)")
        last = i


def check_structure(plan: pb.Plan, limits: Limits | None = None) -> None:
    """Check everything about a plan that does not need simulation.

    ``limits`` defaults to ``cgc.plan_schema.defaults.LIMITS``.
    Example: ``check_structure(plan)`` returns None for a plan ``lower`` wrote.

    Raises:
        PlanLimitError: a field beyond its bound (names the field and the limit).
        PlanStructureError: the first violation found, naming field, actor, op or channel.
    """
    limits = limits or LIMITS
    g, low = plan.graph, plan.lowered
    check_bounds(plan, limits)
    ix = Index()
    _check_graph(plan, ix, limits)
    if [p.actor for p in low.programs] != [a.name for a in g.actors]:
        _fail(
            f"there must be one program per actor, in Graph.actors order ({len(low.programs)} "
            f"programs for {len(g.actors)} actors; not lowered? compile it with cgc)"
        )
    n_actors = len(g.actors)
    for prog in low.programs:  # the runtime sizes the doorbells by the deepest one
        if prog.wake_depth > n_actors:
            _fail(
                f"actor {prog.actor}'s wake_depth {prog.wake_depth} is beyond the number of "
                f"actors ({n_actors}): a depth counts hops through distinct actors"
            )
        _check_captures(plan, prog)
    _check_channels(plan, ix, limits)
    _check_communicators(plan, ix)
    _check_config(plan, ix)
    _check_edges(plan, ix)
    check_weight_syncs(plan)
    check_programs(plan, ix)

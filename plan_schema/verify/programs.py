"""Layer 4 of the structure check: the programs.

Each op's fields (kind, task, channel, peer, communicator, extract) against the plan; one
op per task and channel end per execution; the prologue is the execution-0 copies of the
loop's prefetch ops in loop order (the simulator's argument rests on it); data available
before use; each READ extracts exactly what its actor's tasks take out of the whole input;
SEND/RECV pairs and collective members agree on seq and communicator.

Every op's fields are read once into a tuple, and everything else is looked up in the
``Index`` the earlier layers filled, so the work is linear in the size of the plan (never
programs x channels, or ops x readers).

Example: ``check_programs(plan, ix)`` returns None for a plan ``lower`` wrote, with ``ix``
the ``Index`` that ``cgc.plan_schema.verify.structure`` built for it.
"""

from __future__ import annotations

from collections import Counter
from typing import Final, NoReturn

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import format_op
from cgc.plan_schema.verify.errors import PlanStructureError

__all__ = ["Index", "check_programs", "node_inputs"]

_TASKS = (pb.CALL, pb.COLLECTIVE)
_COMM_OPS = (pb.SEND, pb.RECV, pb.COLL)
_READ, _WRITE, _COMPUTE, _SEND, _RECV, _COLL = (pb.READ, pb.WRITE, pb.COMPUTE, pb.SEND,
                                                pb.RECV, pb.COLL)


def _known(enum: object) -> frozenset[int]:
    return frozenset(enum.values())  # type: ignore[attr-defined]


_OP_KINDS = _known(pb.OpKind) - {pb.OP_KIND_UNSPECIFIED}
_STREAMS = _known(pb.Stream)


def _fail(msg: str) -> NoReturn:
    raise PlanStructureError(f"invalid plan: {msg}")


def node_inputs(node: pb.Node) -> list[pb.NodeRef]:
    """The node refs among a node's args and kwargs, in order."""
    refs = [a.ref for a in node.args if a.WhichOneof("kind") == "ref"]
    return refs + [k.arg.ref for k in node.kwargs if k.arg.WhichOneof("kind") == "ref"]


class Index:
    """What the checks look up, read from the plan's fields once (plain lists and sets:
    a protobuf field access costs far more than a list index). The graph check fills the
    node tables, the channel and communicator checks theirs, the edge check ``edge_ch``."""

    def __init__(self) -> None:
        self.actors: frozenset[str] = frozenset()
        self.keywords: frozenset[str] = frozenset()
        # per node id
        self.kind: list[int] = []
        self.actor: list[str] = []  # "" for inputs and the output
        self.outs: list[int] = []  # outputs a ref may name
        self.coll: list[int] = []
        self.refs: list[list[tuple[int, int]]] = []  # (node, output) of its args and kwargs
        # per channel id - 1
        self.ch_kind: list[int] = []
        self.ch_writer: list[str] = []
        self.ch_readers: list[frozenset[str]] = []
        self.ch_src: list[int] = []
        self.ch_out: list[int] = []
        self.ch_comm: list[int] = []
        self.comm_members: list[list[str]] = []
        self.coll_actors: list[list[str]] = []  # per collective: member actors, rank order
        self.coll_nodes: list[list[int]] = []
        self.coll_comm_ok: set[tuple[int, int]] = set()
        # (source node, output, target node) -> the channel the value arrives on
        self.edge_ch: dict[tuple[int, int, int], int] = {}

    @property
    def n_nodes(self) -> int:
        return len(self.kind)

    @property
    def n_channels(self) -> int:
        return len(self.ch_kind)

    def add_node(self, kind: int, actor: str, outs: int, coll: int,
                 refs: list[tuple[int, int]]) -> None:
        self.kind.append(kind)
        self.actor.append(actor)
        self.outs.append(outs)
        self.coll.append(coll)
        self.refs.append(refs)

    def add_channel(self, kind: int, writer: str, readers: frozenset[str], src: int, out: int,
                    comm: int) -> None:
        self.ch_kind.append(kind)
        self.ch_writer.append(writer)
        self.ch_readers.append(readers)
        self.ch_src.append(src)
        self.ch_out.append(out)
        self.ch_comm.append(comm)

    def owner(self, node: int) -> str:
        """The endpoint a node's value starts at: its actor, or the driver for inputs."""
        return self.actor[node] or DRIVER


class _Tok:
    """``actor:token`` of an op, formatted only when a message needs it."""

    __slots__ = ("actor", "op")

    def __init__(self, actor: str, op: pb.Op) -> None:
        self.actor, self.op = actor, op

    def __format__(self, spec: str) -> str:
        return f"{self.actor}:{format_op(self.op)}"


# An op's fields as the checks read them (each read from the protobuf once).
_Op = tuple[int, int, int, int, str, int, int, int, int, tuple[int, ...]]
_KIND: Final = 0
_TASK: Final = 1
_CH: Final = 2
_OUT: Final = 3
_PEER: Final = 4
_STREAM: Final = 5
_OFF: Final = 6
_SEQ: Final = 7
_COMM: Final = 8
_EXTRACT: Final = 9


def _check_op(ix: Index, actor: str, op: pb.Op) -> _Op:
    """One op's fields against the plan; returns them as a tuple."""
    f: _Op = (op.kind, op.task, op.channel, op.output_index, op.peer, op.stream,
              op.exec_offset, op.seq, op.communicator, tuple(op.extract))
    kind, task, channel, _out, peer, stream, offset, _seq, comm, extract = f
    if kind not in _OP_KINDS:
        _fail(f"an op of actor {actor} has the unknown value {kind} (a plan from a newer "
              "cgc, or corrupted)")
    if stream not in _STREAMS:
        _fail(
            f"op {_Tok(actor, op)} stream has the unknown value {stream} (a plan from a "
            "newer cgc, or corrupted)"
        )
    if offset > 1:
        _fail(f"op {_Tok(actor, op)} has exec_offset {offset}; only 0 and 1 exist")
    if task >= ix.n_nodes or ix.kind[task] not in _TASKS:
        _fail(f"op {_Tok(actor, op)} serves node {task}, which is not a task")
    node_kind = ix.kind[task]
    if ix.actor[task] != actor:
        _fail(f"op {_Tok(actor, op)} serves node %{task}, a task of actor {ix.actor[task]}")
    if kind == _COLL and node_kind != pb.COLLECTIVE:
        _fail(f"op {_Tok(actor, op)}: COLL on a node that is not a collective member")
    if kind == _COMPUTE and node_kind != pb.CALL:
        _fail(f"op {_Tok(actor, op)}: COMPUTE on a collective member (use COLL)")
    if extract and kind != _READ:
        _fail(f"op {_Tok(actor, op)}: only a READ extracts input attributes")
    if peer and kind not in (_SEND, _RECV):
        _fail(f"op {_Tok(actor, op)}: only SEND and RECV have a peer")
    if comm and kind not in _COMM_OPS:
        _fail(f"op {_Tok(actor, op)}: only SEND, RECV and COLL run on a communicator")
    if kind == _COLL:
        if comm >= len(ix.comm_members):
            _fail(f"op {_Tok(actor, op)} runs on communicator {comm}, which does not exist")
        coll = ix.coll[task]
        if (coll, comm) not in ix.coll_comm_ok:  # each pair compared once, not per member
            members = ix.coll_actors[coll]
            if ix.comm_members[comm] != members:
                _fail(
                    f"op {_Tok(actor, op)}: communicator {comm}'s members are not collective "
                    f"{coll}'s members {members} in rank order"
                )
            ix.coll_comm_ok.add((coll, comm))
    if kind == _COMPUTE or kind == _COLL:
        if channel:
            _fail(f"op {_Tok(actor, op)} names a channel it does not use")
        return f
    if not 1 <= channel <= ix.n_channels:
        _fail(f"op {_Tok(actor, op)} uses channel c{channel}, which does not exist")
    k = channel - 1
    readers, writer = ix.ch_readers[k], ix.ch_writer[k]
    host = ix.ch_kind[k] == pb.CHAN_HOST
    src_ok = ix.ch_src[k] == task and ix.ch_out[k] == _out
    if kind == _READ:
        ok = host and actor in readers
    elif kind == _WRITE:
        ok = host and actor == writer and src_ok
    elif kind == _SEND:
        ok = not host and actor == writer and peer in readers and src_ok
    else:
        ok = not host and actor in readers and peer == writer
    if not ok:
        _fail(
            f"op {_Tok(actor, op)} does not match channel c{channel} ({writer} -> "
            f"{sorted(readers)}, source %{ix.ch_src[k]}.{ix.ch_out[k]})"
        )
    if (kind == _SEND or kind == _RECV) and comm != ix.ch_comm[k]:
        _fail(
            f"op {_Tok(actor, op)} runs on communicator {comm}, but c{channel} is on "
            f"{ix.ch_comm[k]}"
        )
    if extract:
        if ix.kind[ix.ch_src[k]] != pb.INPUT:
            _fail(f"op {_Tok(actor, op)} extracts from c{channel}, which does not carry the "
                  "whole input")
        if any(a >= b for a, b in zip(extract, extract[1:], strict=False)):
            _fail(f"op {_Tok(actor, op)}: extract must be sorted and unique")
        n, kinds = ix.n_nodes, ix.kind
        if any(i >= n or kinds[i] != pb.INPUT_ATTR for i in extract):
            _fail(f"op {_Tok(actor, op)} extracts a node that is not an input attribute")
    return f


def _loop_key(f: _Op) -> tuple[int, int, int, str]:
    kind = f[_KIND]
    return (kind, f[_TASK] if kind == _COMPUTE or kind == _COLL else 0, f[_CH], f[_PEER])


def _wanted_counts(ix: Index) -> Counter[str]:
    """Per actor, how many ops one execution of its loop must hold: one per task and one
    per channel end (a SEND per reader of an NCCL channel it writes)."""
    want: Counter[str] = Counter(a for a, k in zip(ix.actor, ix.kind, strict=True)
                                 if k in _TASKS)
    for kind, writer, readers in zip(ix.ch_kind, ix.ch_writer, ix.ch_readers, strict=True):
        want[writer] += 1 if kind == pb.CHAN_HOST else len(readers)
        for r in readers:
            want[r] += 1
    return want


def _wanted_keys(ix: Index, actor: str) -> Counter:
    """The ops ``actor``'s loop must hold (only for the message of a failed check)."""
    want: Counter = Counter()
    for i, (kind, a) in enumerate(zip(ix.kind, ix.actor, strict=True)):
        if kind in _TASKS and a == actor:
            want[(_COMPUTE if kind == pb.CALL else _COLL, i, 0, "")] += 1
    for k, (kind, writer, readers) in enumerate(
            zip(ix.ch_kind, ix.ch_writer, ix.ch_readers, strict=True)):
        cid = k + 1
        if kind == pb.CHAN_HOST:
            if actor == writer:
                want[(_WRITE, 0, cid, "")] += 1
            if actor in readers:
                want[(_READ, 0, cid, "")] += 1
        else:
            if actor == writer:
                for r in readers:
                    want[(_SEND, 0, cid, r)] += 1
            if actor in readers:
                want[(_RECV, 0, cid, writer)] += 1
    return want


def _check_counts(ix: Index, actor: str, pro: list[_Op], loop: list[_Op], wanted: int) -> None:
    """One op per task and channel end per execution, and the prologue as it must be.

    Every loop op already matched a task or channel end of this actor (``_check_op``), and
    each of those is wanted once: distinct keys, as many as wanted, is equality.
    """
    keys = [_loop_key(f) for f in loop]
    if len(keys) != wanted or len(set(keys)) != len(keys):
        have = Counter(keys)
        want = _wanted_keys(ix, actor)
        extra, missing = have - want, want - have

        def fmt(c: Counter) -> str:
            return ", ".join(
                f"{pb.OpKind.Name(k)} task={t} c{ch} {p}".strip() for (k, t, ch, p) in sorted(c)
            )

        _fail(
            f"actor {actor}: each execution must compute each of its tasks once and use each "
            f"of its channel ends once; missing [{fmt(missing)}], extra [{fmt(extra)}]"
        )
    if pro != [f[:_OFF] + (0,) + f[_OFF + 1:] for f in loop if f[_OFF]]:
        _fail(
            f"actor {actor}: the prologue must hold exactly the execution-0 copies of the "
            "loop's exec_offset=1 ops, in loop order"
        )


def _check_dataflow(ix: Index, actor: str, ops: list[pb.Op], loop: list[_Op]) -> None:
    """Every input of a task is there when it runs; every output is written after."""
    edge_ch, kinds, actors, ch_src = ix.edge_ch, ix.kind, ix.actor, ix.ch_src
    have: set[int] = set()
    extracted: set[tuple[int, int]] = set()
    for f in loop:  # the prefetched values are there from the start of each iteration
        if f[_OFF] and (f[_KIND] == _READ or f[_KIND] == _RECV):
            have.add(f[_CH])
            extracted.update((f[_CH], i) for i in f[_EXTRACT])
    done: set[int] = set()
    for op, f in zip(ops, loop, strict=True):
        if f[_OFF]:
            continue
        kind, task = f[_KIND], f[_TASK]
        if kind == _READ or kind == _RECV:
            have.add(f[_CH])
            if f[_EXTRACT]:
                extracted.update((f[_CH], i) for i in f[_EXTRACT])
        elif (kind == _WRITE or kind == _SEND) and task not in done:
            _fail(f"op {_Tok(actor, op)} comes before its task is computed")
        elif kind == _COMPUTE or kind == _COLL:
            for node, out in ix.refs[task]:
                if kinds[node] in _TASKS and actors[node] == actor:
                    if node not in done:
                        _fail(f"op {_Tok(actor, op)} uses %{node} before this actor "
                              "computes it")
                    continue
                cid = edge_ch.get((node, out, task), 0)
                if cid not in have:
                    _fail(
                        f"op {_Tok(actor, op)} runs before its input %{node}.{out} arrives "
                        f"(channel c{cid})"
                    )
                if ch_src[cid - 1] != node and (cid, node) not in extracted:
                    _fail(
                        f"op {_Tok(actor, op)}: input %{node} comes in the whole input on "
                        f"c{cid}, but no READ before it extracts it"
                    )
            done.add(task)


def _check_extracts(ix: Index, got: dict[tuple[str, int], set[int]]) -> None:
    """Each READ extracts exactly the attributes whose edges ride on its channel."""
    want: dict[tuple[str, int], set[int]] = {}
    ch_src = ix.ch_src
    for (src, _out, dst), cid in ix.edge_ch.items():
        if cid and ch_src[cid - 1] != src:
            want.setdefault((ix.owner(dst), cid), set()).add(src)
    if got == want:
        return
    for actor, cid in sorted(set(got) | set(want)):
        have, need = sorted(got.get((actor, cid), ())), sorted(want.get((actor, cid), ()))
        if have != need:
            _fail(
                f"actor {actor}'s READ of c{cid} extracts nodes {have}, but its tasks take "
                f"{need} out of the whole input"
            )


def _check_seqs(ix: Index, sends: dict, recvs: dict, colls: dict) -> None:
    used: dict[tuple[int, int], str] = {}
    for (cid, reader), seq in sorted(sends.items()):
        if recvs.get((cid, reader)) != seq:
            _fail(
                f"SEND on c{cid} to {reader} has seq {seq}, its RECV has {recvs.get((cid, reader))}"
            )
        key = (ix.ch_comm[cid - 1], seq)
        if key in used:
            _fail(f"communicator {key[0]} seq {seq} is used twice ({used[key]} and c{cid})")
        used[key] = f"c{cid}->{reader}"
    for c, nodes in enumerate(ix.coll_nodes):
        seqs = {colls.get(n) for n in nodes}
        if len(seqs) != 1:
            _fail(
                f"members of collective {c} have different seqs or communicators "
                f"{sorted(map(str, seqs))}"
            )
        pair = seqs.pop()
        if pair is None:
            _fail(f"collective {c} has a member without its COLL op")
        seq, comm = pair
        key = (comm, seq)
        if key in used:
            _fail(
                f"communicator {comm} seq {seq} is used twice ({used[key]} and "
                f"collective {c})"
            )
        used[key] = f"collective {c}"


def check_programs(plan: pb.Plan, ix: Index) -> None:
    """Layer 4 (module doc); ``ix`` filled by the graph, channel, communicator and edge
    checks.

    Raises:
        PlanStructureError: the first violation, naming actor, op and channel.
    """
    wanted = _wanted_counts(ix)
    sends: dict[tuple[int, str], int] = {}
    recvs: dict[tuple[int, str], int] = {}
    colls: dict[int, tuple[int, int]] = {}
    got: dict[tuple[str, int], set[int]] = {}
    for prog in plan.lowered.programs:
        actor = prog.actor
        pro = [_check_op(ix, actor, op) for op in prog.prologue]
        ops = list(prog.ops)
        loop = [_check_op(ix, actor, op) for op in ops]
        _check_counts(ix, actor, pro, loop, wanted[actor])
        _check_dataflow(ix, actor, ops, loop)
        for f in loop:
            kind = f[_KIND]
            if kind == _SEND:
                sends[(f[_CH], f[_PEER])] = f[_SEQ]
            elif kind == _RECV:
                recvs[(f[_CH], actor)] = f[_SEQ]
            elif kind == _COLL:
                colls[f[_TASK]] = (f[_SEQ], f[_COMM])
            elif kind == _READ and f[_EXTRACT]:
                got[(actor, f[_CH])] = set(f[_EXTRACT])
    _check_extracts(ix, got)
    _check_seqs(ix, sends, recvs, colls)

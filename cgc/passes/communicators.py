"""Pass ``communicators``: communicator groups with deterministic ranks.

One point-to-point communicator holds every actor at either end of an NCCL channel, ranked
in ``Graph.actors`` order. Each collective uses the communicator whose members are its
member actors in the collective's rank order (``Collective.nodes`` order); groups with the
same members and ranks are shared. The plan names no transport for them: the runtime binds
one at start from where the members landed (``cgc.runtime.comm.binding``).
"""

from __future__ import annotations

from cgc.errors import CompileError
from cgc.ir import attrs as A
from cgc.ir.graph import where
from cgc.passes.state import LowerState, require
from cgc.plan_schema import plan_pb2 as pb

__all__ = ["build_communicators", "pre", "post"]

_NAME = "communicators"


def _comm(state: LowerState, members: tuple[str, ...]) -> int:
    low = state.lowered
    for c in low.communicators:
        if tuple(c.members) == members:
            return c.id
    c = low.communicators.add(id=len(low.communicators), members=members)
    return c.id


def build_communicators(state: LowerState) -> None:
    """Fill ``lowered.communicators`` and ``Channel.communicator`` of NCCL channels.

    Example: NCCL edges w1->w2 and w2->w3 give ``communicators[0].members == [w1, w2, w3]``.

    Raises:
        CompileError: a collective with fewer than two members or two members on one actor.
    """
    g, low = state.g, state.lowered
    graph = g.graph[A.GRAPH]
    index = g.graph[A.ACTOR_INDEX]
    nccl = [ch for ch in low.channels if ch.kind == pb.CHAN_NCCL]
    if nccl:
        members = {ch.writer for ch in nccl} | {r for ch in nccl for r in ch.readers}
        cid = _comm(state, tuple(sorted(members, key=index.__getitem__)))
        for ch in nccl:
            ch.communicator = cid
    for coll in graph.collectives:
        actors = tuple(graph.nodes[n].actor for n in coll.nodes)
        first = where(graph, coll.nodes[0]) if coll.nodes else f"collective {coll.id}"
        if len(actors) < 2:
            raise CompileError(f"{first}: a collective needs at least two members")
        if len(set(actors)) != len(actors):
            raise CompileError(f"{first}: two members of one collective are on the same actor")
        state.coll_comm[coll.id] = _comm(state, actors)


def pre(state: LowerState) -> None:
    require(len(state.lowered.communicators) == 0, _NAME, "communicators already built")


def post(state: LowerState) -> None:
    for ch in state.lowered.channels:
        if ch.kind == pb.CHAN_NCCL:
            comm = state.lowered.communicators[ch.communicator]
            ok = ch.writer in comm.members and all(r in comm.members for r in ch.readers)
            require(ok, _NAME, f"c{ch.id} endpoints not in communicator {comm.id}")

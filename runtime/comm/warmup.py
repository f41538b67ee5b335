"""Warm-up at set-up: a real transfer on every p2p pair before the first execution.

NCCL connects peers lazily, on their first p2p call (and a CUDA-graph capture needs the
connection to exist already); CUDA IPC exchanges and opens its handles on a pair's first
transfer. ``warm_up`` does both ahead of time, from the pairs the plan says each
communicator uses (``p2p_peers``).

Call order: each actor warms its communicators in plan order (communicator id order), after
all of them were created; within a communicator all pairs go in one group (NCCL) or as
"all sends, then all receives" (IPC), so no order of members can deadlock.

Example::

    for comm_index, comm in sorted(my_comms.items()):
        warm_up(comm, p2p_peers(plan, comm_index, actor),
                collective=has_collectives(plan, comm_index), timeout=60)
"""

from __future__ import annotations

from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.comm.interface import Communicator

__all__ = ["p2p_peers", "has_collectives", "warm_up"]


def p2p_peers(plan: pb.Plan, comm_index: int, actor: str) -> list[int]:
    """Ranks (in communicator ``comm_index`` of ``plan.lowered``) that ``actor`` sends to
    or receives from over CHAN_NCCL channels, sorted.

    Example: a channel w0 -> w1 on communicator 0 with members [w0, w1] gives ``[1]`` for
    w0 and ``[0]`` for w1.
    """
    low = plan.lowered
    members = list(low.communicators[comm_index].members)
    peers: set[int] = set()
    for ch in low.channels:
        if ch.kind != pb.CHAN_NCCL or ch.communicator != comm_index:
            continue
        if ch.writer == actor:
            peers.update(members.index(r) for r in ch.readers if r in members)
        elif actor in ch.readers and ch.writer in members:
            peers.add(members.index(ch.writer))
    peers.discard(members.index(actor) if actor in members else -1)
    return sorted(peers)


def has_collectives(plan: pb.Plan, comm_index: int) -> bool:
    """True when some COLL op of ``plan`` runs on communicator ``comm_index``."""
    return any(op.kind == pb.COLL and op.communicator == comm_index
               for prog in plan.lowered.programs
               for op in list(prog.prologue) + list(prog.ops))


def warm_up(comm: Communicator, peers: list[int], timeout: float | None = 60.0,
            collective: bool = False) -> None:
    """Warm ``comm`` (``Communicator.warm_up``; the CPU communicator needs no warm-up beyond
    the executor's own and does nothing)."""
    comm.warm_up(peers, timeout, collective=collective)

"""Will the plan's shared-memory rings fit? Checked at start, before any ring exists.

Every shared-memory ring is committed whole when it is created (``Segment.create``
reserves its tmpfs pages with ``posix_fallocate``): a plan with large slots can ask for
more than the node's /dev/shm holds - ``Limits.ring_bytes`` allows 32 GiB, more than many
hosts have. Creating such rings one by one would fail half-way (ENOSPC in some actor), or,
with the pages not reserved, end in a SIGBUS mid-run. So ``start()`` adds up, per node,
what the rings bound to shared memory there will commit (``ring_segment_bytes``: the
verifier's slots x slot bytes plus the ring's own headers, in whole pages) and compares it
with the free space of that node's segment filesystem (``shm.shm_free_bytes``); a plan that
does not fit is refused with ``ShmSpaceError``, naming the largest rings, the figures and
what to change.

Only rings are counted: channels bound to TCP or to a device transport use no /dev/shm,
and what grows at run time (data blocks for values larger than a slot, the CPU
communicator's small rings, doorbells) is what the margin (``margin_bytes``) is for.
Graphs started at the same moment on one node can still race for the same free space;
then ``posix_fallocate`` fails the loser's start with ENOSPC - never a SIGBUS.

Example:
    >>> from cgc.plan_schema import plan_pb2 as pb
    >>> ch = pb.Channel(id=1, kind=pb.CHAN_HOST, writer="a", readers=["b"], slots=2,
    ...                 slot_bytes=4096)
    >>> ring_segment_bytes(ch, 0)
    12288
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable, Mapping

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import ring_slot_bytes
from cgc.runtime.errors import ShmSpaceError

__all__ = ["ring_segment_bytes", "rings_on_node", "margin_bytes", "fits", "check_shm_space"]

# Why a margin: the rings are not all a graph puts in /dev/shm. Values larger than a slot
# go through data blocks (each ring keeps up to 64 MiB of them for reuse), CPU
# communicators and doorbells have small segments of their own, and other programs share
# the filesystem. A fixed part covers the first blocks of a small graph; a proportional
# part grows with the rings. Small enough that a default plan still starts in a container
# with Docker's default 64 MiB /dev/shm.
MARGIN_FIXED = 16 << 20
MARGIN_FRACTION = 1 / 16
_SHOWN = 3  # largest rings named in the error


def ring_segment_bytes(ch: pb.Channel, default_slot_bytes: int) -> int:
    """Bytes the shared-memory ring of host channel ``ch`` commits: its slots of
    ``ring_slot_bytes(ch.slot_bytes, default_slot_bytes)`` (what the verifier's
    ``Rings`` adds up) plus the segment header, the reader cursors and one header per
    slot, rounded up to whole pages (tmpfs allocates pages).

    Example:
        >>> ch = pb.Channel(slots=4, slot_bytes=1 << 20, readers=["a", "b"])
        >>> ring_segment_bytes(ch, 0) - 4 * (1 << 20)
        4096

    Raises:
        ValueError: a negative slot size (see ``ring_slot_bytes``).
    """
    from cgc.runtime.channels.ring_layout import ring_segment_size
    from cgc.runtime.channels.shm import HEADER

    slot = ring_slot_bytes(ch.slot_bytes, default_slot_bytes)
    size = ring_segment_size(max(ch.slots, 1), max(len(ch.readers), 1), slot)
    page = mmap.PAGESIZE
    return (HEADER + size + page - 1) // page * page


def rings_on_node(low: pb.Lowered, shm_cids: Iterable[int], node: Mapping[str, str],
                  node_id: str, default_slot_bytes: int) -> dict[int, int]:
    """Channel id -> ``ring_segment_bytes`` of the rings that will live on ``node_id``:
    the host channels in ``shm_cids`` (bound to shared memory) whose writer runs there
    (``node``: endpoint -> node id; a ring's readers share its writer's node).

    Example:
        >>> low = pb.Lowered(channels=[pb.Channel(id=1, kind=pb.CHAN_HOST, writer="a",
        ...                                       readers=["b"], slots=1, slot_bytes=4096)])
        >>> rings_on_node(low, {1}, {"a": "n1", "b": "n1"}, "n1", 0)
        {1: 8192}
        >>> rings_on_node(low, {1}, {"a": "n1", "b": "n1"}, "n2", 0)
        {}
    """
    wanted = set(shm_cids)
    return {ch.id: ring_segment_bytes(ch, default_slot_bytes) for ch in low.channels
            if ch.kind == pb.CHAN_HOST and ch.id in wanted and node.get(ch.writer) == node_id}


def margin_bytes(need: int) -> int:
    """Free space left over on top of ``need`` bytes of rings (see ``MARGIN_*``).

    Example:
        >>> margin_bytes(0) == 16 << 20, margin_bytes(16 << 30) == (16 << 20) + (1 << 30)
        (True, True)
    """
    return MARGIN_FIXED + int(need * MARGIN_FRACTION)


def fits(need: int, free: int) -> bool:
    """Whether ``need`` bytes of rings and their margin fit in ``free`` bytes.

    Example:
        >>> fits(0, 16 << 20), fits(1, 16 << 20)
        (True, False)
    """
    return need + margin_bytes(need) <= free


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.2f} {unit}"
    return f"{n} bytes"


def _describe(proto: pb.Plan, ch: pb.Channel, nbytes: int, default_slot_bytes: int) -> str:
    nodes = proto.graph.nodes
    src = nodes[ch.source.node] if ch.source.node < len(nodes) else None
    made_by = (f"{src.actor}.{src.method}" if src is not None and src.actor else
               f"the driver's {src.name}" if src is not None else "the driver")
    slot = ring_slot_bytes(ch.slot_bytes, default_slot_bytes)
    return (f"channel c{ch.id} ({made_by} -> {', '.join(ch.readers)}): {ch.slots} slots x "
            f"{_size(slot)} = {_size(nbytes)}")


def check_shm_space(proto: pb.Plan, rings: Mapping[int, int], free: int, where: str,
                    default_slot_bytes: int) -> None:
    """Refuse to start ``proto`` when its ``rings`` (channel id -> bytes, on one node:
    ``rings_on_node``) and the margin need more than ``free`` bytes of that node's
    segment filesystem; ``where`` names the node and the filesystem in the message.

    Example:
        >>> check_shm_space(pb.Plan(), {}, 1 << 30, "this node", 0)  # nothing to fit

    Raises:
        ShmSpaceError: it does not fit; the message names the largest rings (channel,
            producer, readers, slots x slot size), the total, the margin and the free
            space, and how to make room.
    """
    need = sum(rings.values())
    if fits(need, free):
        return
    margin = margin_bytes(need)
    by_id = {ch.id: ch for ch in proto.lowered.channels}
    largest = sorted(rings, key=lambda c: (-rings[c], c))[:_SHOWN]
    lines = "\n  ".join(_describe(proto, by_id[c], rings[c], default_slot_bytes)
                        for c in largest)
    more = f"\n  ... and {len(rings) - _SHOWN} more" if len(rings) > _SHOWN else ""
    raise ShmSpaceError(
        f"plan {proto.name!r} does not fit in shared memory on {where}: its {len(rings)} "
        f"rings commit {_size(need)} (+ {_size(margin)} margin for data blocks) but only "
        f"{_size(free)} is free there. Largest rings:\n  {lines}{more}\n"
        "Make the rings smaller (cgc.compile(..., capacity=N) for fewer slots, smaller "
        "declared tensors for smaller slots) or give /dev/shm more room (docker run "
        "--shm-size=..., or mount -o remount,size=... /dev/shm).",
        need=need, free=free, channels=largest)

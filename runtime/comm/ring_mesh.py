"""One shared-memory ring per ordered pair of ranks: the mesh under the CPU communicators.

Rank ``r`` of a ``world_size`` group creates the ring it writes to each peer ``p``, named
``<prefix><tag><r>-<p>``, at construction, and attaches (as reader 0) to each peer's ring
to it, ``<prefix><tag><p>-<r>``, on first use - no set-up round trips, and the rings
refuse any name they did not create (see ``channels.shm``). The prefix comes from the
caller (the runtime hands out unique, owner-checked names); ``tag`` tells a group's meshes
apart (``p``: the CPU communicator's data rings, ``h``: side-channels, ``d``: the CPU
stand-in transport's data rings).

Why a rank attaches to its peer's ring before its first write to that peer: the peer
finishes an op with us only after reading what we write, so its ``close()`` never unlinks
a ring of its that we have yet to map (and ``close``'s ``linger`` covers values the peer
wrote that we have yet to read).

Teardown is one place: ``poison()`` wakes every waiter on this rank's rings (here and in
the peers), ``close(linger)`` closes the rings this rank writes (after up to ``linger`` s
for peers to take what is in flight; this unlinks them) and lets go of the peers' rings.

Example (two ranks in two threads):
    >>> import threading, uuid
    >>> from cgc.runtime.comm.ring_mesh import RingMesh
    >>> pre = f"cgc-doc-mesh-{uuid.uuid4().hex[:6]}-"
    >>> meshes = [RingMesh(pre, "x", r, 2, slots=2, slot_bytes=4096) for r in (0, 1)]
    >>> meshes[0].reader(1).name == pre + "x1-0"
    True
    >>> meshes[0].out[1].write("hi"); meshes[1].reader(0).read(timeout=5)
    'hi'
    >>> for m in meshes: m.close(linger=0)
"""

from __future__ import annotations

from cgc.runtime.channels.ends import close_quietly, detach_quietly, poison_quietly
from cgc.runtime.channels.ring_reader import ShmRingReader
from cgc.runtime.channels.ring_writer import ShmRingWriter

__all__ = ["RingMesh", "check_rank"]


def check_rank(rank: int, world_size: int) -> None:
    """Refuse a rank outside the group.

    Example: ``check_rank(0, 2)`` passes; ``check_rank(2, 2)`` raises.

    Raises:
        ValueError: ``rank`` is not in ``0..world_size - 1``.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} not in 0..{world_size - 1}")


class RingMesh:
    """Rank ``rank``'s rings of a per-pair mesh (see module doc).

    Args:
        prefix: unique name prefix of the group's rings (from the caller).
        tag: the mesh's letter after the prefix (``<prefix><tag><src>-<dst>``).
        rank, world_size: this rank and the group size.
        slots, slot_bytes, spin_us: of each ring this rank writes (``ShmRingWriter.create``).
        attach_timeout: how long an attach waits for a peer's ring to appear.

    Attributes:
        out: peer -> this rank's ring to it (created at construction).
        inbound: peer -> its ring to this rank (attached so far).

    Raises:
        ValueError: ``rank`` not in the group (see ``check_rank``).
        ShmSecurityError, SegmentExistsError: a ring could not be created.
    """

    def __init__(self, prefix: str, tag: str, rank: int, world_size: int, *, slots: int,
                 slot_bytes: int, spin_us: float = 0.0, attach_timeout: float = 60.0) -> None:
        check_rank(rank, world_size)
        self.prefix, self.tag, self.rank, self.world_size = prefix, tag, rank, world_size
        self.spin_us, self.attach_timeout = spin_us, attach_timeout
        self.peers = [p for p in range(world_size) if p != rank]
        self.out: dict[int, ShmRingWriter] = {
            p: ShmRingWriter.create(self.name(rank, p), slots, slot_bytes, 1, spin_us)
            for p in self.peers}
        self.inbound: dict[int, ShmRingReader] = {}

    def name(self, src: int, dst: int) -> str:
        """Ring name of the pair ``src -> dst``, e.g. ``<prefix>h0-1``."""
        return f"{self.prefix}{self.tag}{src}-{dst}"

    def check_peer(self, peer: int) -> None:
        """Refuse a peer that is this rank or outside the group.

        Raises:
            ValueError: ``rank R: bad peer P (world size W)``.
        """
        if peer == self.rank or not 0 <= peer < self.world_size:
            raise ValueError(f"rank {self.rank}: bad peer {peer} (world size {self.world_size})")

    def attach(self, peer: int) -> ShmRingReader:
        """Attach to ``peer``'s ring to this rank now (replacing any earlier mapping).

        Example: ``mesh.attach(1).read(timeout=5)`` (rank 1's next value to this rank).

        Raises:
            ChannelTimeoutError: the ring did not appear within ``attach_timeout``.
            ShmSecurityError: something not made by this group holds the name.
        """
        r = self.inbound[peer] = ShmRingReader.attach(self.name(peer, self.rank), 0,
                                                      self.spin_us, self.attach_timeout)
        return r

    def reader(self, peer: int) -> ShmRingReader:
        """``peer``'s ring to this rank, attached on first use.

        Example: ``mesh.reader(1)`` before the first ``mesh.out[1].write(...)``.

        Raises:
            as ``attach``, on first use only (ChannelTimeoutError, ShmSecurityError).
        """
        r = self.inbound.get(peer)
        return r if r is not None else self.attach(peer)

    def poison(self) -> None:
        """Poison every ring of this rank, written or read (waiters here and in the peers
        raise ChannelClosedError). Raises nothing."""
        poison_quietly([*self.out.values(), *self.inbound.values()])

    def close(self, linger: float = 2.0, *, close_inbound: bool = False) -> None:
        """Teardown, swallowing every error: ``close_out(linger)``, then ``let_go``.
        Idempotent; a later write raises ChannelClosedError (the writers stay in ``out``).
        """
        self.close_out(linger)
        self.let_go(close_inbound)

    def close_out(self, linger: float = 2.0, *, quiet: bool = True) -> None:
        """Close the rings this rank writes, after up to ``linger`` s for the peers to
        take what was written (this unlinks them). ``quiet``: swallow every error.

        Raises:
            only with ``quiet=False``: what a writer's ``close`` raised.
        """
        if quiet:
            close_quietly(self.out.values(), linger)
            return
        for w in self.out.values():
            w.close(linger=linger)

    def let_go(self, close: bool = False, *, quiet: bool = True) -> None:
        """Let go of the peers' rings to this rank: detach, or with ``close`` close them
        (that wakes a peer still waiting on one, e.g. in a rendezvous send). Forgets them
        (a later ``reader`` attaches again). ``quiet``: swallow every error.

        Raises:
            only with ``quiet=False``: what a reader's ``close``/``detach`` raised.
        """
        if quiet:
            (close_quietly if close else detach_quietly)(self.inbound.values())
        else:
            for r in self.inbound.values():
                if close:
                    r.close()
                else:
                    r.detach()
        self.inbound.clear()

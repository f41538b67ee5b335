"""Host side-channels of a device communicator: small messages per ordered pair of ranks.

Device transports move tensor bytes; everything else (headers, collective status words,
CUDA IPC handles and acknowledgements) goes through a ``SideChannels`` object: rank ``r``
can ``send(peer, msg)`` and ``recv(peer)``, and messages from one rank to another arrive in
the order sent. All ops of a communicator run in the same order on every member (the
plan's ``Op.seq``), so one FIFO per ordered pair carries p2p headers and collective status
words without mixing them up; every message carries a tag that the receiver checks.

``ShmSideChannels`` is the same-node implementation: one shared-memory ring per ordered
pair, named ``<prefix>h<src>-<dst>``, created by ``src``. The prefix comes from the caller
(the runtime hands out unique, owner-checked names); nothing here invents names. Other
transports (TCP for multi-node) plug in through the ``side_factory`` argument that every
communicator of this package takes: ``side_factory(rank, world_size) -> SideChannels``.

Example (two ranks in two threads):
    >>> import threading, uuid
    >>> from cgc.runtime.comm.sidechannel import ShmSideChannels
    >>> pre = f"cgc-doc-side-{uuid.uuid4().hex[:6]}-"
    >>> sides = [ShmSideChannels(pre, r, 2) for r in (0, 1)]
    >>> sides[0].send(1, ("hello", 0)); sides[1].recv(0, timeout=5)
    ('hello', 0)
    >>> for s in sides: s.close(linger=0)
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any, Protocol

from cgc.runtime.channels.errors import ChannelClosedError, ChannelTimeoutError
from cgc.runtime.channels.ring_reader import ShmRingReader
from cgc.runtime.comm.ring_mesh import RingMesh

__all__ = ["SideChannels", "ShmSideChannels", "shm_side_factory", "SideFactory", "open_side",
           "exchange", "POLL_SLICE", "SharedSide", "SideKind"]

POLL_SLICE = 0.05  # seconds between health polls (NCCL async errors) while a read waits


class SideChannels(Protocol):
    """Ordered, reliable messages between the ranks of one communicator (see module doc)."""

    rank: int
    world_size: int

    def send(self, peer: int, msg: Any, timeout: float | None = None) -> None:
        """Queue ``msg`` to ``peer`` (blocks only while ``peer`` is far behind)."""

    def recv(self, peer: int, timeout: float | None = None,
             poll: Callable[[], None] | None = None) -> Any:
        """The next message from ``peer``; ``poll()`` runs every ``POLL_SLICE`` s of waiting
        (it raises to end the wait, e.g. on an NCCL async error)."""

    def poison(self) -> None:
        """Wake every waiter on this rank's channels (they raise ChannelClosedError)."""

    def close(self, linger: float = 2.0) -> None:
        """Release the channels (after up to ``linger`` s for peers to take what was sent)."""


SideFactory = Callable[[int, int], SideChannels]


class ShmSideChannels:
    """Shared-memory side-channels of rank ``rank`` (same node only; see module doc).

    Args:
        prefix: unique name prefix for this communicator's rings (from the caller).
        rank, world_size: this rank and the group size.
        slots: messages a sender may be ahead of its receiver on one pair (generous: a
            pair's FIFO also carries the acknowledgements of the opposite direction).
        slot_bytes: inline bytes per message (larger ones use the ring's data blocks).
        attach_timeout: how long to wait for a peer's ring to appear.
    """

    def __init__(self, prefix: str, rank: int, world_size: int, *, slots: int = 32,
                 slot_bytes: int = 8 * 1024, attach_timeout: float = 60.0,
                 spin_us: float = 0.0) -> None:
        self._mesh = RingMesh(prefix, "h", rank, world_size, slots=slots,
                              slot_bytes=slot_bytes, spin_us=spin_us,
                              attach_timeout=attach_timeout)
        self.prefix, self.rank, self.world_size = prefix, rank, world_size
        self._out, self._in = self._mesh.out, self._mesh.inbound  # the mesh's own dicts
        self._check = self._mesh.check_peer
        self._closed = False

    def name(self, src: int, dst: int) -> str:
        """Ring name of the pair ``src -> dst``."""
        return self._mesh.name(src, dst)

    def _reader(self, peer: int) -> ShmRingReader:
        r = self._in.get(peer)
        if r is None:
            if self._closed:
                raise ChannelClosedError(f"side-channels of rank {self.rank} were closed")
            r = self._mesh.attach(peer)
        return r

    def send(self, peer: int, msg: Any, timeout: float | None = None) -> None:
        """Queue ``msg`` for ``peer``.

        Raises:
            ChannelTimeoutError: ``peer`` stayed ``slots`` messages behind for ``timeout`` s.
            ChannelClosedError: closed or poisoned.
        """
        self._check(peer)
        # Why attach first: the peer finishes an op with us only after reading what we
        # write, so its close() never unlinks a ring of its that we have yet to map.
        self._reader(peer)
        self._out[peer].write(msg, timeout)

    def recv(self, peer: int, timeout: float | None = None,
             poll: Callable[[], None] | None = None) -> Any:
        """The next message from ``peer``.

        Raises:
            ChannelTimeoutError: nothing within ``timeout`` s. ChannelClosedError: closed.
        """
        self._check(peer)
        r = self._reader(peer)
        if poll is None:
            return r.read(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = POLL_SLICE
            if deadline is not None:
                step = min(step, max(deadline - time.monotonic(), 0.0))
            try:
                return r.read(step)
            except ChannelTimeoutError:
                poll()
                if deadline is not None and time.monotonic() >= deadline:
                    raise ChannelTimeoutError(
                        f"rank {self.rank}: nothing from rank {peer} on {r.name} within "
                        f"{timeout} s") from None

    def poison(self) -> None:
        """Poison every ring of this rank (peers and this rank's waiters wake up)."""
        self._mesh.poison()

    def close(self, linger: float = 2.0) -> None:
        """Close this rank's rings (unlinks them) and detach from the peers'. Idempotent."""
        self._closed = True
        self._mesh.close(linger)


class SideKind(StrEnum):
    """The kinds of a transport's own side-channel messages (``SharedSide``): the first
    item of each such tuple. Sent as the plain string (``SideKind.ACK.value``), so the
    bytes on the wire are those of the string; a received ``"ack"`` equals (and hashes as)
    ``SideKind.ACK``.

    Example: ``SideKind("hello-ack") is SideKind.HELLO_ACK`` and ``SideKind.ACK == "ack"``.

    Raises:
        ValueError: ``SideKind(s)`` of a string that is no kind.
    """

    HELLO = "hello"  # CUDA IPC: a writer's buffer and event handles, once per pair
    HELLO_ACK = "hello-ack"  # CUDA IPC: the reader's event handles back
    ACK = "ack"  # CUDA IPC: the reader took use n of slot k (generation g)
    DESC = "desc"  # CUDA IPC: where a collective contribution lies (``put``'s ext)


class SharedSide:
    """One rank's side-channels shared by a protocol and its transport: one FIFO per ordered
    pair carries both, told apart by kind (a transport's messages are plain tuples whose
    first item is one of ``kinds``). ``recv`` returns the protocol's next message,
    ``recv_kind`` the transport's next message of one kind; what either reads for the
    other waits in a queue.

    Why one FIFO and not a ring each: a transport's acknowledgement then reaches a peer
    that is waiting anyway (for the protocol's next header) and is taken there, off the
    path of the next send (measured: ~10 µs per same-GPU hop).

    Example: ``side = SharedSide(ShmSideChannels(prefix, 0, 2), tuple(SideKind))``.
    """

    def __init__(self, side: SideChannels, kinds: Sequence[str]) -> None:
        self.side = side
        self.rank, self.world_size = side.rank, side.world_size
        self._kinds = frozenset(kinds)
        self._queues: dict[tuple[int, str | None], deque] = {}
        #: ``send(peer, msg, timeout)``: the protocol's messages and the transport's tuples
        #: go out as they are (the inner channels' own method: no layer on the hot path).
        self.send = side.send

    def recv(self, peer: int, timeout: float | None = None,
             poll: Callable[[], None] | None = None) -> Any:
        """The protocol's next message from ``peer``."""
        return self._take(peer, None, timeout, poll)

    def recv_kind(self, peer: int, kind: str, timeout: float | None = None,
                  poll: Callable[[], None] | None = None) -> tuple:
        """The transport's next message of ``kind`` from ``peer``."""
        return self._take(peer, kind, timeout, poll)

    def _take(self, peer: int, kind: str | None, timeout: float | None,
              poll: Callable[[], None] | None) -> Any:
        q = self._queues.get((peer, kind))
        if q:
            return q.popleft()
        while True:
            msg = self.side.recv(peer, timeout, poll)
            got = msg[0] if type(msg) is tuple and msg and msg[0] in self._kinds else None
            if got == kind:
                return msg
            self._queues.setdefault((peer, got), deque()).append(msg)

    def poison(self) -> None:
        self.side.poison()

    def close(self, linger: float = 2.0) -> None:
        self.side.close(linger)


def shm_side_factory(prefix: str, **kw: Any) -> SideFactory:
    """A ``side_factory`` making ``ShmSideChannels(prefix, rank, world, **kw)``."""
    def make(rank: int, world_size: int) -> SideChannels:
        return ShmSideChannels(prefix, rank, world_size, **kw)
    return make


def open_side(side: SideChannels | None, side_factory: SideFactory | None, prefix: str | None,
              rank: int, world_size: int, name: str, **shm_kw: Any) -> SideChannels:
    """The side-channels a communicator's constructor was given: ``side`` itself, else
    ``side_factory(rank, world_size)``, else ``ShmSideChannels(prefix, ..., **shm_kw)``.

    Example: ``open_side(None, None, "cgc-x-", 0, 2, "g1")`` -> rank 0's shared-memory rings.

    Raises:
        ValueError: none of the three was given (the message starts with ``name``).
    """
    if side is not None:
        return side
    if side_factory is not None:
        return side_factory(rank, world_size)
    if prefix is not None:
        return ShmSideChannels(prefix, rank, world_size, **shm_kw)
    raise ValueError(f"{name}: pass prefix, side or side_factory")


def exchange(side: SideChannels, msg: Any, timeout: float | None = None,
             poll: Callable[[], None] | None = None) -> list[Any]:
    """Every rank's ``msg``, in rank order (own entry included): all sends, then all reads.

    Deadlock-free because sends only block while a peer is ``slots`` messages behind on
    this pair, and a peer that reached this exchange has read everything sent before it.
    """
    for p in range(side.world_size):
        if p != side.rank:
            side.send(p, msg, timeout)
    return [msg if p == side.rank else side.recv(p, timeout, poll)
            for p in range(side.world_size)]

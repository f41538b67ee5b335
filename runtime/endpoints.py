"""Opening the data-plane endpoints a plan names: host channels and communicators.

This is the one place that knows how a plan ``Channel`` becomes a concrete channel object
(``cgc.runtime.channels``), for actors and the driver alike, and the one place that builds
shared-memory names:

- ``new_graph_prefix()``: a graph's random prefix (96 random bits, so every name below is
  unguessable); ``new_graph_secret()``: the graph's key for TCP channel set-up. Both are
  made once per ``start()`` and reach the actors only through Ray's set-up calls.
- ``CHAN_HOST`` with every endpoint on one node: a shared-memory ring, segment
  ``channel_name(prefix, id)`` = ``<prefix>-c<id>``, reader ``i`` = position in
  ``Channel.readers`` ("@driver" included).
- ``CHAN_HOST`` with endpoints on several nodes (or ``host_transport="tcp"``): a TCP
  channel; the writer listens on its node's IP (set-up round 2 reports ``(ip, port)``),
  every reader connects and proves the graph secret as its reader index; one write sends
  to all of them with per-message sequence numbers.
- ``CHAN_NCCL`` and collectives: a communicator per plan communicator and member, of the
  transport the driver bound it to (``cgc.runtime.comm.binding``, opened by
  ``cgc.runtime.comm.factory.open_device_communicator``); its shared-memory rings are
  named under ``communicator_prefix(prefix, id)``.

Example::

    prefix, key = new_graph_prefix(), new_graph_secret()
    w = open_host_writer(ch, prefix, tcp=False)
    r = open_host_reader(ch, prefix, "@driver", None)
    t = open_host_writer(ch2, prefix, tcp=True, ip=node_ip, secret=key)   # t.port
"""

from __future__ import annotations

import secrets
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import ring_slot_bytes

__all__ = [
    "new_graph_prefix",
    "new_graph_secret",
    "channel_name",
    "communicator_prefix",
    "open_writer",
    "open_reader",
    "open_tcp_writer",
    "open_tcp_reader",
    "open_host_writer",
    "open_host_reader",
    "poison_channel",
]



def new_graph_prefix() -> str:
    """A fresh, unguessable segment-name prefix for one graph (``cgc-`` + 24 hex digits).

    Example:
        >>> p = new_graph_prefix(); p.startswith("cgc-") and len(p) == 28
        True
    """
    return "cgc-" + secrets.token_hex(12)


def new_graph_secret() -> bytes:
    """A fresh 32-byte key for one graph's TCP channel set-up proofs.

    Example:
        >>> len(new_graph_secret())
        32
    """
    return secrets.token_bytes(32)


def channel_name(prefix: str, cid: int) -> str:
    """Shared-memory name of channel ``cid`` of the graph with unique ``prefix``."""
    return f"{prefix}-c{cid}"


def communicator_prefix(prefix: str, comm_id: int) -> str:
    """Name prefix of the CPU communicator ``comm_id``'s rings in the graph ``prefix``."""
    return f"{prefix}-g{comm_id}-"


def open_writer(ch: pb.Channel, prefix: str, *, spin_us: float = 0.0,
                default_slot_bytes: int = 0) -> Any:
    """Create the writing end of host channel ``ch`` (the segment is created here).

    Raises:
        SegmentExistsError: the segment name is taken (a reused prefix, or a planted file;
            also a FileExistsError).
    """
    from cgc.runtime.channels.ring_writer import ShmRingWriter

    # The plan is verified before anything opens: slots >= 1; a channel without its own
    # slot size takes the run's default (RunConfig.slot_bytes, from the plan's config).
    return ShmRingWriter.create(
        channel_name(prefix, ch.id),
        slots=ch.slots,
        slot_bytes=ring_slot_bytes(ch.slot_bytes, default_slot_bytes),
        num_readers=len(ch.readers),
        spin_us=spin_us,
    )


def open_reader(ch: pb.Channel, prefix: str, reader: str, *, spin_us: float = 0.0,
                timeout: float = 10.0) -> Any:
    """Attach endpoint ``reader`` (an actor name or "@driver") to host channel ``ch``.

    Raises:
        ChannelTimeoutError: the writer did not create the segment within ``timeout``.
        ShmSecurityError: something not created by this graph holds the name.
    """
    from cgc.runtime.channels.ring_reader import ShmRingReader

    return ShmRingReader.attach(
        channel_name(prefix, ch.id), list(ch.readers).index(reader), spin_us=spin_us,
        timeout=timeout,
    )


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def open_tcp_writer(ch: pb.Channel, prefix: str, *, secret: bytes, ip: str | None = None,
                    max_frame_bytes: int | None = None) -> Any:
    """Listen on ``ip`` (this node's address; default: Ray's node IP) for the readers of
    host channel ``ch``; they connect to ``.port`` and prove ``secret``.

    Raises:
        ValueError: a wildcard ``ip``. OSError: the address cannot be bound.
    """
    from cgc.runtime.channels.tcp import DEFAULT_MAX_FRAME_BYTES, TcpWriter

    return TcpWriter.listen(ip or _node_ip(), 0, num_readers=len(ch.readers),
                            secret=secret, channel=channel_name(prefix, ch.id),
                            max_frame_bytes=max_frame_bytes or DEFAULT_MAX_FRAME_BYTES)


def open_tcp_reader(ch: pb.Channel, prefix: str, reader: str, addr: tuple[str, int], *,
                    secret: bytes, timeout: float = 30.0,
                    max_frame_bytes: int | None = None) -> Any:
    """Connect endpoint ``reader`` of ``ch`` to its TCP writer at ``addr`` = (ip, port).

    Raises:
        ChannelTimeoutError: nobody listens there within ``timeout``.
        ChannelAuthError: the peer there is not this channel's writer.
    """
    from cgc.runtime.channels.tcp import DEFAULT_MAX_FRAME_BYTES, TcpReader

    return TcpReader.connect(addr[0], addr[1], reader_index=list(ch.readers).index(reader),
                             secret=secret, channel=channel_name(prefix, ch.id),
                             timeout=timeout,
                             max_frame_bytes=max_frame_bytes or DEFAULT_MAX_FRAME_BYTES)


def open_host_writer(ch: pb.Channel, prefix: str, *, tcp: bool, secret: bytes,
                     ip: str | None = None, spin_us: float = 0.0,
                     default_slot_bytes: int = 0, max_frame_bytes: int | None = None) -> Any:
    """The writing end of host channel ``ch`` as bound at start: a TCP listener on ``ip``
    when ``tcp`` (its readers sit on other nodes), else a shared-memory ring.

    Raises:
        SegmentExistsError: the ring's name is taken. ValueError: a wildcard ``ip``.
    """
    if tcp:
        return open_tcp_writer(ch, prefix, ip=ip, secret=secret,
                               max_frame_bytes=max_frame_bytes)
    return open_writer(ch, prefix, spin_us=spin_us, default_slot_bytes=default_slot_bytes)


def open_host_reader(ch: pb.Channel, prefix: str, reader: str,
                     addr: tuple[str, int] | None, *, secret: bytes,
                     spin_us: float = 0.0, timeout: float = 10.0,
                     max_frame_bytes: int | None = None, reader_has_gpu: bool = True) -> Any:
    """Endpoint ``reader`` of host channel ``ch``: TCP to ``addr`` when given (proving
    ``secret``), else the shared-memory ring; moving tensors to ``ch.device`` when the
    plan names one (``reader_has_gpu``: ``devices.with_device``'s).

    Raises:
        ChannelTimeoutError: the writer did not appear within ``timeout``.
        ChannelAuthError: the TCP peer is not this channel's writer.
        ShmSecurityError: something not created by this graph holds the ring's name.
    """
    from cgc.runtime.devices import with_device

    if addr is not None:
        end = open_tcp_reader(ch, prefix, reader, addr, secret=secret, timeout=timeout,
                              max_frame_bytes=max_frame_bytes)
    else:
        end = open_reader(ch, prefix, reader, spin_us=spin_us, timeout=timeout)
    return with_device(end, ch, reader_has_gpu)


def poison_channel(prefix: str, cid: int) -> bool:
    """Poison host channel ``cid`` by name from any process on its node (wakes all waiters)."""
    from cgc.runtime.channels.ring_writer import ShmRingWriter

    return ShmRingWriter.poison_by_name(channel_name(prefix, cid))

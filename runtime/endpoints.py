"""Opening the data-plane endpoints a plan names: host channels and communicators.

This is the one place that knows how a plan ``Channel`` becomes a concrete channel object
(``cgc.runtime.channels``), for actors and the driver alike:

- ``CHAN_HOST`` with every endpoint on one node: a shared-memory ring, segment
  ``<prefix>-c<id>``, reader ``i`` = position in ``Channel.readers`` ("@driver" included).
- ``CHAN_HOST`` with endpoints on several nodes (or ``host_transport="tcp"``): a TCP
  channel; the writer listens (set-up round 2 reports ``(ip, port)``), every reader
  connects, one write sends to all of them with per-message sequence numbers.
- ``CHAN_NCCL`` and collectives: a ``Communicator`` per plan communicator and member, from
  ``communicator_factory(backend)`` - the CPU communicator when GPUs are absent or
  ``communicator="cpu"``; a NCCL implementation slots in by registering a factory.

Example::

    w = open_writer(plan.lowered.channels[0], "cgc-1234-ab", spin_us=0)
    r = open_reader(plan.lowered.channels[0], "cgc-1234-ab", "@driver", spin_us=0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.errors import SetupError

__all__ = [
    "DEFAULT_SLOTS",
    "DEFAULT_SLOT_BYTES",
    "channel_name",
    "open_writer",
    "open_reader",
    "open_tcp_writer",
    "open_tcp_reader",
    "open_host_writer",
    "open_host_reader",
    "poison_channel",
    "register_communicator",
    "communicator_factory",
    "open_communicator",
]

DEFAULT_SLOTS = 2
DEFAULT_SLOT_BYTES = 64 * 1024


def channel_name(prefix: str, cid: int) -> str:
    """Shared-memory name of channel ``cid`` of the graph with unique ``prefix``."""
    return f"{prefix}-c{cid}"


def _slots(ch: pb.Channel) -> int:
    return ch.slots or DEFAULT_SLOTS


def open_writer(ch: pb.Channel, prefix: str, *, spin_us: float = 0.0,
                default_slot_bytes: int = 0) -> Any:
    """Create the writing end of host channel ``ch`` (the segment is created here).

    Raises:
        FileExistsError: the segment name is taken (a graph prefix was reused).
    """
    from cgc.runtime.channels.ring import ShmRingWriter

    slot_bytes = ch.slot_bytes or default_slot_bytes or DEFAULT_SLOT_BYTES
    return ShmRingWriter.create(
        channel_name(prefix, ch.id),
        slots=_slots(ch),
        slot_bytes=max(int(slot_bytes), 256),
        num_readers=len(ch.readers),
        spin_us=spin_us,
    )


def open_reader(ch: pb.Channel, prefix: str, reader: str, *, spin_us: float = 0.0,
                timeout: float = 10.0) -> Any:
    """Attach endpoint ``reader`` (an actor name or "@driver") to host channel ``ch``.

    Raises:
        ChannelTimeoutError: the writer did not create the segment within ``timeout``.
    """
    from cgc.runtime.channels.ring import ShmRingReader

    return ShmRingReader.attach(
        channel_name(prefix, ch.id), list(ch.readers).index(reader), spin_us=spin_us,
        timeout=timeout,
    )


def open_tcp_writer(ch: pb.Channel) -> Any:
    """Listen for the readers of host channel ``ch`` (they connect to ``.port``)."""
    from cgc.runtime.channels.tcp import TcpWriter

    return TcpWriter.listen("0.0.0.0", 0, num_readers=len(ch.readers))


def open_tcp_reader(addr: tuple[str, int], timeout: float = 30.0) -> Any:
    """Connect to the TCP writer at ``addr`` = (ip, port).

    Raises:
        ChannelTimeoutError: nobody listens there within ``timeout``.
    """
    from cgc.runtime.channels.tcp import TcpReader

    return TcpReader.connect(addr[0], addr[1], timeout=timeout)


def open_host_writer(ch: pb.Channel, prefix: str, *, tcp: bool, spin_us: float = 0.0,
                     default_slot_bytes: int = 0) -> Any:
    """The writing end of host channel ``ch`` as bound at start: a TCP listener when
    ``tcp`` (its readers sit on other nodes), else a shared-memory ring."""
    if tcp:
        return open_tcp_writer(ch)
    return open_writer(ch, prefix, spin_us=spin_us, default_slot_bytes=default_slot_bytes)


def open_host_reader(ch: pb.Channel, prefix: str, reader: str,
                     addr: tuple[str, int] | None, *, spin_us: float = 0.0,
                     timeout: float = 10.0) -> Any:
    """Endpoint ``reader`` of host channel ``ch``: TCP to ``addr`` when given, else the
    shared-memory ring; moving tensors to ``ch.device`` when the plan names one.

    Raises:
        ChannelTimeoutError: the writer did not appear within ``timeout``.
    """
    from cgc.runtime.devices import with_device

    if addr is not None:
        end = open_tcp_reader(addr, timeout)
    else:
        end = open_reader(ch, prefix, reader, spin_us=spin_us, timeout=timeout)
    return with_device(end, ch)


def poison_channel(prefix: str, cid: int) -> bool:
    """Poison host channel ``cid`` by name from any process on its node (wakes all waiters)."""
    from cgc.runtime.channels.ring import ShmRingWriter

    return ShmRingWriter.poison_by_name(channel_name(prefix, cid))


# backend name -> factory(group_name, rank, world_size) -> communicator object
_FACTORIES: dict[str, Callable[[str, int, int], Any]] = {}


def register_communicator(backend: str, factory: Callable[[str, int, int], Any]) -> None:
    """Make ``backend`` (e.g. "nccl") available to plans; ``factory(group, rank, world)``."""
    _FACTORIES[backend] = factory


def _cpu_factory(group: str, rank: int, world: int) -> Any:
    from cgc.runtime.channels.cpu_comm import CpuCommunicator

    return CpuCommunicator(group, rank, world)


def communicator_factory(backend: str) -> Callable[[str, int, int], Any]:
    """The factory for ``backend``; "cpu" is always there.

    Raises:
        SetupError: no implementation of ``backend`` in this build (e.g. real NCCL).
    """
    if backend == "cpu":
        return _FACTORIES.get("cpu", _cpu_factory)
    try:
        return _FACTORIES[backend]
    except KeyError:
        raise SetupError(
            f"no {backend!r} communicator in this cgc build; start the plan with "
            "communicator='cpu' (or on a cluster without GPUs) to run it over the CPU "
            "communicator"
        ) from None


def open_communicator(backend: str, group: str, rank: int, world: int) -> Any:
    """Join communicator ``group`` as ``rank`` of ``world`` (blocks until all members join)."""
    return communicator_factory(backend)(group, rank, world)

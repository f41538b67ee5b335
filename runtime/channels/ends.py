"""The channel-end interfaces every transport implements: the shm ring
(``ShmRingWriter``/``ShmRingReader``), TCP (``TcpWriter``/``TcpReader``) and the readers
that wrap them (``cgc.runtime.devices.DeviceReader``). Callers (the executor, the driver's
endpoints) use only these members, so any end fits any caller. Teardown of many ends at
once - poison, close or detach each, swallowing every error - is ``poison_quietly``,
``close_quietly`` and ``detach_quietly``.

Example::

    from cgc.runtime.channels.ends import ChannelReader
    def drain(r: ChannelReader) -> None:
        r.read(timeout=1.0)
        r.detach()
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

__all__ = ["ChannelReader", "ChannelWriter", "close_quietly", "detach_quietly", "poison_quietly"]


@runtime_checkable
class ChannelWriter(Protocol):
    """The writing end of a channel."""

    @property
    def position(self) -> int:
        """Values written so far."""
        ...

    def write(self, value: Any, timeout: float | None = None) -> None:
        """Write ``value`` (blocks while the slowest reader is a full ring behind).

        Raises:
            ChannelTimeoutError, ChannelClosedError.
        """
        ...

    def poison(self) -> None:
        """Wake a thread blocked in this end (it raises ChannelClosedError)."""
        ...

    def close(self) -> None:
        """Close the channel for every reader. Idempotent."""
        ...


@runtime_checkable
class ChannelReader(Protocol):
    """The reading end of a channel."""

    @property
    def position(self) -> int:
        """Values consumed so far."""
        ...

    @property
    def last_nbytes(self) -> int:
        """Payload bytes of the last value read."""
        ...

    def read(self, timeout: float | None = None) -> Any:
        """The next value.

        Raises:
            ChannelTimeoutError, ChannelClosedError.
        """
        ...

    def read_at(self, position: int, timeout: float | None = None) -> Any:
        """Value ``position`` (or an error value for it), never another position's."""
        ...

    def poison(self) -> None:
        """Wake a thread blocked in this end (it raises ChannelClosedError)."""
        ...

    def close(self) -> None:
        """Close the channel for everyone. Idempotent."""
        ...

    def detach(self) -> None:
        """Let go of this end without closing the channel for the writer's other readers."""
        ...


def poison_quietly(ends: Iterable[Any]) -> None:
    """Poison every end in ``ends`` (teardown: wakes the threads blocked in them); an end
    that fails (already closed, its peer gone) is skipped, so one bad end never keeps the
    others awake. Raises nothing.

    Example: ``poison_quietly([*writers, *readers])``.
    """
    for ep in ends:
        try:
            ep.poison()
        except Exception:  # noqa: BLE001 - already closed
            pass


def close_quietly(ends: Iterable[Any], linger: float | None = None) -> None:
    """Close every end in ``ends``: ``end.close(linger=linger)``, or ``end.close()`` when
    ``linger`` is None (ends that take no linger, such as readers). An end that fails is
    skipped: teardown releases what can be released. Raises nothing.

    Example: ``close_quietly(writers.values(), linger=2.0)``.
    """
    for ep in ends:
        try:
            if linger is None:
                ep.close()
            else:
                ep.close(linger=linger)
        except Exception:  # noqa: BLE001 - teardown: release what can be released
            pass


def detach_quietly(ends: Iterable[Any]) -> None:
    """Detach every reader in ``ends`` (the channel stays open for the writer's other
    readers); a reader that fails is skipped. Raises nothing.

    Example: ``detach_quietly(readers.values())``.
    """
    for ep in ends:
        try:
            ep.detach()
        except Exception:  # noqa: BLE001 - teardown: release what can be released
            pass

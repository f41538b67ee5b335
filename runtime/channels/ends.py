"""The channel-end interfaces every transport implements: the shm ring
(``ShmRingWriter``/``ShmRingReader``), TCP (``TcpWriter``/``TcpReader``) and the readers
that wrap them (``cgc.runtime.devices.DeviceReader``). Callers (the executor, the driver's
endpoints) use only these members, so any end fits any caller.

Example::

    from cgc.runtime.channels.ends import ChannelReader
    def drain(r: ChannelReader) -> None:
        r.read(timeout=1.0)
        r.detach()
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["ChannelReader", "ChannelWriter"]


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

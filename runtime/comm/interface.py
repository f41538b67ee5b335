"""The communicator interface (NCCL-shaped).

A ``Communicator`` is one rank's handle on a group. Semantics follow NCCL: ``send``
completes only when the peer's matching ``recv`` takes the value (rendezvous); every
collective returns on a rank only after all ranks have contributed. Calls on one rank
happen in the plan's ``Op.seq`` order, identical on all members. A GPU implementation
(cupy/torch NCCL) subclasses this and may use ``shape``/``dtype`` hints on ``recv``.

What each collective computes from the members' contributions is defined once, in
``cgc.runtime.comm.collective`` (``combine``); every implementation follows it.

Example::

    comm.send(value, peer=1)          # rank 0
    got = comm.recv(peer=0)           # rank 1
    total = comm.allreduce(x, ReduceOp.SUM)
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any

from cgc.runtime.channels.errors import ErrorValue
from cgc.runtime.comm.collective import ReduceOp, combine

__all__ = ["Communicator", "ExchangingCommunicator", "first_error"]


def first_error(parts: list[Any]) -> ErrorValue | None:
    """The first ``ErrorValue`` among a collective's contributions (rank order), or None."""
    for p in parts:
        if type(p) is ErrorValue:
            return p
    return None


class Communicator(abc.ABC):
    """One rank of a communicator group (NCCL semantics; see the module docstring)."""

    rank: int
    world_size: int
    #: The comm-stream event of the latest op that moved device data, for an executor that
    #: defers the compute stream's wait to the value's first use; None for a communicator
    #: that moves host values only (the CPU one), whose results are ready when returned.
    last_event: Any = None

    @abc.abstractmethod
    def send(self, value: Any, peer: int, timeout: float | None = None, *,
             shape: Any = None, dtype: Any = None) -> None:
        """Send ``value`` to rank ``peer``; returns once the peer's ``recv`` has taken it
        (``shape``/``dtype``: the edge is static, as ``recv``'s; hints a host communicator
        ignores).

        Raises:
            ChannelTimeoutError, ChannelClosedError.
        """

    @abc.abstractmethod
    def recv(self, peer: int, shape: Any = None, dtype: Any = None,
             timeout: float | None = None) -> Any:
        """Receive the next value sent by ``peer`` (shape/dtype: hints for GPU backends).

        Raises:
            ChannelTimeoutError, ChannelClosedError.
        """

    @abc.abstractmethod
    def allreduce(self, value: Any, op: ReduceOp | str = ReduceOp.SUM,
                  timeout: float | None = None) -> Any:
        """Elementwise reduction over all ranks; every rank gets the same result."""

    @abc.abstractmethod
    def allgather(self, value: Any, timeout: float | None = None) -> Any:
        """Every rank's value as a list, in rank order (a GPU backend returns views of one
        buffer); the first ``ErrorValue`` instead when a contribution is one."""

    @abc.abstractmethod
    def reducescatter(self, value: Any, op: ReduceOp | str = ReduceOp.SUM,
                      timeout: float | None = None) -> Any:
        """Reduce over ranks, then rank r keeps chunk r of dim 0.

        Raises:
            CollectiveShapeError: dim 0 does not divide by the world size.
        """

    @abc.abstractmethod
    def warm_up(self, peers: Sequence[int], timeout: float | None = 60.0,
                collective: bool = False) -> None:
        """Make the connections to every rank in ``peers`` now (and the collective's when
        ``collective``), so the first execution pays no set-up. Every member calls it with
        symmetric peers; a communicator with nothing to warm does nothing.

        Raises:
            ChannelTimeoutError: not done within ``timeout``.
        """

    @abc.abstractmethod
    def abort(self) -> None:
        """End every wait of this rank now, from any thread (blocked calls raise
        ChannelClosedError). Idempotent; the owner's ``destroy()`` releases what is left."""

    @abc.abstractmethod
    def destroy(self, linger: float = 2.0) -> None:
        """Release the group; peers blocked on this rank raise ChannelClosedError.

        Waits up to ``linger`` s for peers to take what this rank sent last, so a rank
        that finishes first never breaks a slower one. Idempotent.
        """


class ExchangingCommunicator(Communicator):
    """A communicator whose collectives give every member every contribution and combine
    them there with the one rule (``cgc.runtime.comm.collective.combine``): the CPU
    communicator and host staging (CUDA IPC is a device transport: ``cuda_ipc``).

    Errors are values: when any member contributed an ``ErrorValue``, the first in rank
    order is every member's result. Subclasses only move the values (``_exchanged``).
    """

    @abc.abstractmethod
    def _exchanged(self, tag: str, value: Any, timeout: float | None,
                   finish: Callable[[list[Any]], Any]) -> Any:
        """Every member's value for collective ``tag`` (rank order) through ``finish``, or
        the first ``ErrorValue`` among them."""

    def _combined(self, kind: str, value: Any, op: ReduceOp | str | None,
                  timeout: float | None) -> Any:
        red = None if op is None else ReduceOp.of(op)
        tag = kind if red is None else f"{kind}.{red.word}"
        rank, world = self.rank, self.world_size
        return self._exchanged(tag, value, timeout,
                               lambda parts: combine(kind, parts, red, rank, world))

    def allreduce(self, value: Any, op: ReduceOp | str = ReduceOp.SUM,
                  timeout: float | None = None) -> Any:
        """Elementwise ``op`` over all ranks, in rank order; the same on every rank.

        Raises:
            ValueError: shapes/dtypes differ between ranks.
        """
        return self._combined("allreduce", value, op, timeout)

    def allgather(self, value: Any, timeout: float | None = None) -> Any:
        """Every rank's value, in rank order."""
        return self._combined("allgather", value, None, timeout)

    def reducescatter(self, value: Any, op: ReduceOp | str = ReduceOp.SUM,
                      timeout: float | None = None) -> Any:
        """Reduce over ranks, keep chunk ``rank`` of dim 0.

        Raises:
            CollectiveShapeError: dim 0 not divisible by the world size.
            ValueError: shapes differ.
        """
        return self._combined("reducescatter", value, op, timeout)

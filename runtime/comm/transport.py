"""The device transport interface: what moves tensor bytes under ``DeviceCommunicator``.

A ``DeviceTransport`` owns the *bytes* of one rank of a group; the protocol (headers,
errors as values, static edges, collective agreement: ``device_protocol.DeviceCommunicator``)
is written once above it. Transports come in two kinds, one interface each, and the protocol
picks its p2p order by the kind of its transport:

- a ``PostingTransport`` (NCCL, torch.distributed, the CPU stand-in) needs nothing but
  the two ranks' matching calls (``p2p``): a receive may be posted before its header is
  read (static edges do that), a send is queued after its header is written;
- a ``DescribingTransport`` (CUDA IPC) places a send's bytes where the receiver maps them
  and says where in the header: the protocol ``reserve``s room, ``put``s the tensors and
  writes the header with the description ``put`` returned as ``ext``; the receiver reads
  the header, hands its ``ext`` to ``expect``, allocates, and ``take``s the tensors.

``GatheringTransport`` implements the three collectives for transports that can only move
bytes between pairs: every rank's input to every rank (``_gather``), then the one host
rule of ``cgc.runtime.comm.collective`` on the result.

Example (a posting transport, rank 0 of 2)::

    tr.p2p([(as_bytes(x), 1)], [])          # queue x's bytes to rank 1
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from cgc.runtime.comm.collective import ReduceOp, reduce_values, scatter_part
from cgc.runtime.gpu.tensors import TensorMeta

__all__ = ["DeviceTransport", "PostingTransport", "DescribingTransport",
           "GatheringTransport"]


class DeviceTransport(abc.ABC):
    """Moves tensor bytes between the ranks of one group, in call order, on the comm stream:
    what both kinds share (module doc); an implementation is a ``PostingTransport`` or a
    ``DescribingTransport``.

    Calls return once queued; completion is observed through stream events. Buffers are
    torch tensors (flat ``uint8`` for p2p; typed for reductions).
    """

    rank: int
    world_size: int

    @abc.abstractmethod
    def is_device(self, obj: Any) -> bool:
        """True for the objects this transport moves (CUDA tensors; any tensor on CPU)."""

    @abc.abstractmethod
    def empty(self, meta: TensorMeta) -> Any:
        """A new tensor to receive ``meta`` into (allocated on the current stream)."""

    @abc.abstractmethod
    def allreduce(self, send: Any, recv: Any, op: ReduceOp) -> None:
        """``recv = op(send over ranks)`` (``op`` is never AVG: the protocol divides)."""

    @abc.abstractmethod
    def allgather(self, send: Any, recv: Any) -> None:
        """``recv`` (``world_size`` × ``send``, flat) gets every rank's ``send`` in order."""

    @abc.abstractmethod
    def reducescatter(self, send: Any, recv: Any, op: ReduceOp) -> None:
        """``recv`` gets chunk ``rank`` of ``op(send over ranks)``."""

    def unsupported(self, dtype: str, op: ReduceOp | None) -> str | None:
        """Why this transport cannot reduce ``dtype`` with ``op`` (None: it can)."""
        return None

    def check(self) -> None:  # noqa: B027 - optional hook: most transports never fail late
        """Raise if the transport failed asynchronously (polled while waiting)."""

    @abc.abstractmethod
    def abort(self) -> None:
        """End any hang now (from any thread); later calls raise ChannelClosedError."""

    @abc.abstractmethod
    def destroy(self, linger: float = 2.0) -> None:
        """Release the transport (also after ``abort``, then only what is left); rings it
        wrote wait up to ``linger`` s for peers to take what is in them."""


class PostingTransport(DeviceTransport):
    """A transport that moves p2p bytes by matched posts on the two ranks (module doc);
    it connects by moving a byte (``DeviceCommunicator.warm_up``).

    Example: ``tr.p2p([(as_bytes(x), 1)], [])`` queues ``x``'s bytes to rank 1.
    """

    @abc.abstractmethod
    def p2p(self, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]]) -> None:
        """One group of ``uint8`` sends ``(buf, peer)`` and receives ``(buf, peer)``."""


class DescribingTransport(DeviceTransport):
    """A transport that places a value's bytes first and describes where in its header
    (module doc): ``reserve``, ``put`` -> ext on the sender; ``expect(ext)``, ``take`` on
    the receiver.

    Example (rank 0 sends ``t`` to rank 1)::

        tr.reserve(1, timeout, poll); ext = tr.put(1, [t])      # rank 0; ext -> header
        tr.expect(0, ext, timeout, poll); tr.take(0, [out])      # rank 1
    """

    @abc.abstractmethod
    def connect(self, peers: Sequence[int], timeout: float | None) -> None:
        """Set up the pairs with ``peers`` now (every member calls it with symmetric
        peers), so the first value pays nothing.

        Raises:
            ChannelTimeoutError: not done within ``timeout`` s.
        """

    @abc.abstractmethod
    def reserve(self, peer: int, timeout: float | None, poll: Callable[[], None]) -> None:
        """Wait until one more value may be queued to ``peer`` (bounded buffers).

        Raises:
            ChannelTimeoutError: no room within ``timeout`` s.
        """

    @abc.abstractmethod
    def put(self, peer: int, tensors: Sequence[Any]) -> Any:
        """Queue one value's (contiguous) tensors to ``peer`` after ``reserve``; returns
        where they are (the header's ``ext``)."""

    @abc.abstractmethod
    def expect(self, peer: int, ext: Any, timeout: float | None,
               poll: Callable[[], None]) -> None:
        """Take a header's ``ext`` from ``peer`` before its receives are posted.

        Raises:
            ChannelError: ``ext`` is malformed or out of order.
        """

    @abc.abstractmethod
    def take(self, peer: int, tensors: Sequence[Any]) -> None:
        """Receive one value's tensors from ``peer`` after ``expect``.

        Raises:
            ChannelError: they do not match the description ``expect`` took.
        """


class GatheringTransport(DeviceTransport):
    """Collectives from pairwise moves: ``_gather`` gives every rank every input, then the
    one host rule reduces (CPU stand-in; CUDA IPC, where the N-fold copies on one GPU run
    at device-memory bandwidth). Combined with either kind:
    ``class IpcTransport(GatheringTransport, DescribingTransport)``."""

    @abc.abstractmethod
    def _gather(self, send: Any) -> list[Any]:
        """Every rank's ``send`` (same shape and dtype), in rank order."""

    def _context(self) -> contextlib.AbstractContextManager[Any]:
        """Where the reductions and copies run (the comm stream on a GPU)."""
        return contextlib.nullcontext()

    def allreduce(self, send: Any, recv: Any, op: ReduceOp) -> None:
        parts = self._gather(send)
        with self._context():
            recv.copy_(reduce_values(parts, op))

    def allgather(self, send: Any, recv: Any) -> None:
        parts = self._gather(send)
        n = send.numel()
        with self._context():
            for r, part in enumerate(parts):
                recv.view(-1)[r * n:(r + 1) * n].copy_(part.view(-1))

    def reducescatter(self, send: Any, recv: Any, op: ReduceOp) -> None:
        parts = self._gather(send)
        with self._context():
            recv.copy_(scatter_part(reduce_values(parts, op), self.rank, self.world_size))
